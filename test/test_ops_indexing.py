"""Indexing against PyTorch (and NumPy where PyTorch has no equivalent, e.g. negative steps): getitem in every index
form, setitem, gather/scatter/scatter_reduce, masked_fill/masked_select and nonzero, forward and backward."""
import numpy as np
import pytest
import torch
from kiln import Tensor, dtypes
from helpers import check, assert_close

def T(v): return Tensor(np.array(v))
def TT(v): return torch.tensor(np.array(v))

# ---------------------------------------------------------------------------------------------------------------------
# getitem: (name, kiln index, torch index) on a (3, 4, 5) input, forward and backward against torch

MASK34 = np.random.default_rng(7).random((3, 4)) < 0.5
GETITEMS = [
  ("int_slice", lambda x: x[1, 1:3], lambda x: x[1, 1:3]),
  ("slice_tensor", lambda x: x[1:, T([2, 0, 2])], lambda x: x[1:, TT([2, 0, 2])]),
  ("tensor_tensor_broadcast", lambda x: x[T([[0], [2]]), T([1, 3, 0])], lambda x: x[TT([[0], [2]]), TT([1, 3, 0])]),
  ("three_tensors", lambda x: x[T([0, 2]), T([1, 3]), T([[4], [0]])],
   lambda x: x[TT([0, 2]), TT([1, 3]), TT([[4], [0]])]),
  ("adjacent_after_slice", lambda x: x[:, T([0, 3]), T([1, 4])], lambda x: x[:, TT([0, 3]), TT([1, 4])]),
  ("separated_by_slice", lambda x: x[T([0, 2]), :, T([1, 4])], lambda x: x[TT([0, 2]), :, TT([1, 4])]),
  ("separated_by_none", lambda x: x[:, [0, 1, 1], None, [0, 1, 2]], lambda x: x[:, [0, 1, 1], None, [0, 1, 2]]),
  ("int_between_advanced", lambda x: x[[2, 0], 1, [1, 4]], lambda x: x[[2, 0], 1, [1, 4]]),
  ("int_then_slice_then_list", lambda x: x[0, :, [1, 2]], lambda x: x[0, :, [1, 2]]),
  ("none_ellipsis_tensor", lambda x: x[None, ..., T([0, 4])], lambda x: x[None, ..., TT([0, 4])]),
  ("ellipsis_none_list", lambda x: x[..., None, [1, 0]], lambda x: x[..., None, [1, 0]]),
  ("list_ellipsis_list", lambda x: x[[1, 2], ..., [0, 0]], lambda x: x[[1, 2], ..., [0, 0]]),
  ("negative_in_tensor", lambda x: x[T([-1, 0]), T([-4, 3])], lambda x: x[TT([-1, 0]), TT([-4, 3])]),
  ("top_level_nested_list", lambda x: x[[[0, 1], [2, 2]]], lambda x: x[[0, 1], [2, 2]]),   # a tuple, as in tinygrad
  ("nested_list", lambda x: x[:, [[0, 1], [2, 2]]], lambda x: x[:, [[0, 1], [2, 2]]]),
  ("tuple_in_tuple", lambda x: x[:, (3, 1)], lambda x: x[:, [3, 1]]),
  ("zero_d_tensor", lambda x: x[T(1)], lambda x: x[TT(1)]),
  ("zero_d_and_list", lambda x: x[T(2), :, [1, 3]], lambda x: x[TT(2), :, [1, 3]]),
  ("strided_slice_and_list", lambda x: x[::2, [3, 0], 1:4:2], lambda x: x[::2, [3, 0], 1:4:2]),
  ("negative_step_and_list", lambda x: x[::-1, [0, 2]], lambda x: x.flip(0)[:, [0, 2]]),
  ("negative_step2_and_tensor", lambda x: x[T([1]), ::-2, 4:0:-3], lambda x: x[TT([1])][:, [3, 1]][:, :, [4, 1]]),
  ("bool_mask_data", lambda x: x[x > 0], lambda x: x[x > 0]),
  ("bool_mask_2d", lambda x: x[Tensor(MASK34)], lambda x: x[torch.tensor(MASK34)]),
  ("bool_mask_after_slice", lambda x: x[1:, Tensor([True, False, True, True]), 2],
   lambda x: x[1:, torch.tensor([True, False, True, True]), 2]),
  ("bool_list", lambda x: x[[True, False, True]], lambda x: x[torch.tensor([True, False, True])]),
  ("python_true", lambda x: x[True, 1], lambda x: x[True, 1]),
  ("python_false", lambda x: x[False], lambda x: x[False]),
  ("empty_list", lambda x: x[[]], lambda x: x[torch.tensor([], dtype=torch.long)]),
  ("empty_tensor_index", lambda x: x[:, Tensor.zeros(0, 2, dtype=dtypes.int32)],
   lambda x: x[:, torch.zeros(0, 2, dtype=torch.long)]),
]

@pytest.mark.parametrize("name, fn, tfn", GETITEMS, ids=[g[0] for g in GETITEMS])
def test_getitem(name, fn, tfn):
  check(fn, tfn, [(3, 4, 5)])

def test_getitem_shapes_and_dtypes():
  # size-0 dims, size-1 dims, 0-d tensors
  check(lambda x: x[:, [0, 2]], lambda x: x[:, [0, 2]], [(0, 3)])
  check(lambda x: x[[0, 0, 0]], lambda x: x[[0, 0, 0]], [(1, 2)])
  check(lambda x: x[T(True)], lambda x: x[TT(True)], [()])
  # a non-contiguous input
  check(lambda x: x.T[[0, 2], 1:], lambda x: x.T[[0, 2], 1:], [(3, 4)])
  check(lambda x: x.flip(1)[T([[1, 0]]), T([2])], lambda x: x.flip(1)[TT([[1, 0]]), TT([2])], [(3, 4)])
  # dtypes
  check(lambda x: x[T([2, 0]), 1:], lambda x: x[TT([2, 0]), 1:], [(3, 4)], dtype="int32", low=-50, high=50)
  check(lambda x: x[:, [3, 3, 1]], lambda x: x[:, [3, 3, 1]], [(3, 4)], dtype="float16")
  check(lambda x: x[x], lambda x: x[x], [(3, 4)], dtype="bool")
  check(lambda x: x[[1, 0], [0, 3]], lambda x: x[[1, 0], [0, 3]], [(3, 4)], dtype="bool")
  # int64 and uint8 index tensors
  idx = np.array([2, 0], np.int64)
  assert Tensor.arange(6)[Tensor(idx)].tolist() == [2, 0]
  assert Tensor.arange(6)[Tensor(idx.astype(np.uint8))].tolist() == [2, 0]

def test_getitem_out_of_range_tensor_gives_zero():
  # tensor entries are not checked (that would need the data); out-of-range ones select nothing, as in tinygrad
  t = Tensor([[1, 2], [3, 4]])
  assert t[Tensor([0, 5])].tolist() == [[1, 2], [0, 0]]
  assert t[Tensor([1, 0]), Tensor([2, 1])].tolist() == [0, 2]   # (1, 2) must not alias the flat position 4

def test_getitem_python_device():
  check(lambda x: x[T([1, 0]), ::2], lambda x: x[TT([1, 0]), ::2], [(2, 3)], device="PYTHON")
  check(lambda x: x[x > 0], lambda x: x[x > 0], [(2, 3)], device="PYTHON")

def test_getitem_is_lazy_and_fuses():
  x, idx = Tensor.rand(4, 5).realize(), Tensor([[0, 3, 3]]).realize()
  assert len((x[[0, 3, 3], 1:] * 2).schedule()) == 1   # a list index: one fused kernel
  # a tensor index may keep its one-hot mask (index size x axis size) in memory, never anything larger
  items = (x[idx, 1:] * 2).schedule()
  assert len(items) <= 2 and all(item.bufs[0].size <= max(3 * 4, 12) for item in items)

# ---------------------------------------------------------------------------------------------------------------------
# getitem errors

def test_getitem_errors():
  t = Tensor.zeros(2, 3)
  for idx, words in [([0, 5], ("5", "axis 0", "size 2", "(2, 3)")), ((0, [-4]), ("-4", "axis 1", "size 3", "(2, 3)")),
                     ((slice(None), [[0], [3]]), ("3", "axis 1", "size 3"))]:
    with pytest.raises(IndexError) as info: t[idx]
    assert all(w in str(info.value) for w in words), str(info.value)
    assert "test_ops_indexing.py" in str(info.value)
  with pytest.raises(IndexError, match="getitem.*float"): t[Tensor([0.0, 1.0])]
  with pytest.raises(IndexError, match="getitem.*non-integer"): t[[0.5]]
  with pytest.raises(IndexError, match="getitem.*too many indices"): t[0, 0, 0]
  with pytest.raises(IndexError, match="getitem.*too many indices"): t[[True, False], 0, 0]
  with pytest.raises(IndexError, match="getitem.*broadcast"): t[Tensor([0, 1]), Tensor([0, 1, 2])]
  with pytest.raises(IndexError, match=r"getitem: mask of shape \(3,\)"): t[Tensor([True, False, True])]
  with pytest.raises(IndexError, match="Ellipsis"): t[..., 0, ...]
  with pytest.raises(TypeError, match="getitem"): t["a"]
  with pytest.raises(ValueError, match="getitem"): t[::0]

# ---------------------------------------------------------------------------------------------------------------------
# setitem: kiln on a realized and on an unrealized tensor against torch (or numpy for negative steps)

SETITEMS = [
  ("int", lambda: 1, 7.5), ("slice", lambda: (slice(None), slice(1, 3)), "vec2"),
  ("step", lambda: (slice(None, None, 2), slice(None, None, 3)), 2.0),
  ("neg_step", lambda: (slice(None), slice(None, None, -2)), "col"),
  ("ellipsis_none", lambda: (..., None, 0), "rowT"), ("list", lambda: [2, 0], "row"),
  ("list_list", lambda: ([0, 2], [3, 1]), "vec2"), ("tensor_broadcast", lambda: (T([[0], [2]]), T([1, 3])), -1.0),
  ("separated", lambda: (T([0, 2]), None, T([1, 0])), "col2"), ("mask", lambda: np.array(MASK34), "maskvec"),
  ("negative_list", lambda: (slice(None), [-1, -4]), 3.0), ("empty", lambda: [], 9.0),
  ("none_all", lambda: None, "row"),
]

def _value(kind, rng, dtype):
  shapes = {"row": (4,), "col": (3, 1), "rowT": (3, 1), "vec2": (2,), "col2": (2, 1), "maskvec": (int(MASK34.sum()),)}
  if isinstance(kind, str): return rng.uniform(-5, 5, shapes[kind]).astype(dtype)
  return kind

@pytest.mark.parametrize("realized", [True, False], ids=["realized", "lazy"])
@pytest.mark.parametrize("name, index, kind", SETITEMS, ids=[s[0] for s in SETITEMS])
def test_setitem(name, index, kind, realized):
  rng = np.random.default_rng(1)
  base = rng.uniform(-5, 5, (3, 4)).astype(np.float32)
  value = _value(kind, rng, np.float32)
  want = base.copy()
  idx = index()
  items = idx if isinstance(idx, tuple) else (idx,)
  np_idx = tuple(np.array(i.numpy()) if isinstance(i, Tensor) else i for i in items)
  want[np_idx] = value
  t = Tensor(base) if realized else Tensor(base) + 0
  t[idx] = Tensor(value) if isinstance(value, np.ndarray) else value
  assert (t.uop.base.op.name == "BUFFER") == realized
  assert_close(t.numpy(), want, f"setitem {name}")

def test_setitem_dtypes_and_values():
  t = Tensor([[1, 2, 3], [4, 5, 6]], dtype="int32")
  t[0] = 2.7                      # cast to the target dtype (truncates, as in torch)
  t[1, [0, 2]] = Tensor([-1.9, 8.2])
  want = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
  want[0] = 2.7
  want[1, [0, 2]] = torch.tensor([-1.9, 8.2]).to(torch.int32)
  assert t.dtype == dtypes.int32 and t.tolist() == want.tolist()
  h = Tensor.zeros(2, 2, dtype="float16").contiguous().realize()
  h[:, 1] = Tensor([1.5, 2.5])
  h[[0]] = [[7, 8]]               # a list value with an extra leading axis of size 1
  assert h.dtype == dtypes.float16 and h.tolist() == [[7.0, 8.0], [0.0, 2.5]]
  b = Tensor([True, True, False])
  b[b] = False
  b[2] = 1
  assert b.dtype == dtypes.bool and b.tolist() == [False, False, True]
  z = Tensor(3.0)
  z[...] = 5
  z[None] = Tensor([6.0])
  assert z.shape == () and z.item() == 6.0

def test_setitem_duplicates_last_write_wins():
  # NumPy defines the last write to win; PyTorch leaves it unspecified
  base, idx = np.zeros((4, 2), np.float32), np.array([[1, 3], [1, 0]])
  val = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
  want = base.copy()
  want[idx] = val
  t = Tensor(base)
  t[Tensor(idx)] = Tensor(val)
  assert_close(t.numpy(), want, "duplicate setitem")

def test_setitem_gradient_of_lazy_tensor():
  def fn(x, v):
    y = x * 2
    y[[0, 2], 1:] = v
    return y
  check(fn, fn, [(3, 4), (2, 3)])
  def fn_mask(x):
    y = x + 1
    y[x < 0] = 0.0
    return y
  check(fn_mask, fn_mask, [(3, 4)])

def test_setitem_views_and_caching():
  # a realized tensor is written in place: a lazy view taken before reads the new values, as in PyTorch
  a = Tensor.arange(6).reshape(2, 3).contiguous().realize()
  row = a[1]
  a[1, 1] = 100
  assert row.tolist() == [3, 100, 5]
  # an unrealized tensor gets a new graph: a view taken before keeps the old values (documented difference)
  b = Tensor.arange(6).reshape(2, 3)
  old_row = b[1]
  b[1, 1] = 100
  assert old_row.tolist() == [3, 4, 5] and b[1].tolist() == [3, 100, 5]
  # overwriting a realized buffer must not change what an equal graph built later computes
  c = Tensor.arange(5).realize()
  c[0] = 42
  assert Tensor.arange(5).tolist() == [0, 1, 2, 3, 4] and c.tolist() == [42, 1, 2, 3, 4]
  # the value may read the target itself at other positions
  d = Tensor([1, 2, 3, 4]).realize()
  d[[0, 1, 2, 3]] = d[[3, 2, 1, 0]]
  assert d.tolist() == [4, 3, 2, 1]

def test_setitem_python_device():
  t = Tensor.zeros(2, 3, device="PYTHON").contiguous().realize()
  t[1, [0, 2]] = Tensor([1.0, 2.0], device="PYTHON")
  t[0, ::2] = 5
  assert t.tolist() == [[5.0, 0.0, 5.0], [1.0, 0.0, 2.0]]

def test_setitem_errors():
  t = Tensor.zeros(2, 3).contiguous().realize()
  with pytest.raises(ValueError, match=r"setitem.*\(2,\).*\(3,\)"): t[0] = Tensor([1.0, 2.0])
  with pytest.raises(ValueError, match="setitem"): t[[0, 1]] = Tensor.ones(3, 3)
  with pytest.raises(IndexError, match="setitem.*out of range"): t[[0, 2]] = 1.0
  with pytest.raises(IndexError, match="setitem.*too many"): t[0, 0, 0] = 1.0
  with pytest.raises(TypeError, match="setitem"): t[0] = "a"
  with pytest.raises(NotImplementedError, match="setitem.*requires grad"): Tensor.ones(3, requires_grad=True)[0] = 2.0
  with pytest.raises(NotImplementedError, match="setitem.*expand"): t.reshape(1, 6).expand(2, 6)[0] = 1.0
  with pytest.raises(RuntimeError, match="setitem.*PYTHON"): t[0] = Tensor.ones(3, device="PYTHON")
  assert t.tolist() == [[0.0] * 3] * 2   # nothing was written by the failed calls

# ---------------------------------------------------------------------------------------------------------------------
# gather / scatter / scatter_reduce

def _index(shape, high, seed=0, unique_dim=None):
  """Random int64 indices in [0, high); along `unique_dim` each line is a permutation prefix (no duplicates)."""
  rng = np.random.default_rng(seed)
  if unique_dim is None: return rng.integers(0, high, shape).astype(np.int64)
  moved = list(shape)
  moved.append(moved.pop(unique_dim))
  lines = [rng.permutation(high)[:moved[-1]] for _ in range(int(np.prod(moved[:-1])))]
  return np.moveaxis(np.array(lines, np.int64).reshape(moved), -1, unique_dim)

@pytest.mark.parametrize("dim, xshape, ishape", [(0, (3, 4), (2, 4)), (1, (3, 4), (3, 6)), (-1, (2, 3, 4), (1, 2, 2)),
                                                 (1, (3, 0), (2, 0)), (0, (1,), (3,)), (0, (), ())])
def test_gather(dim, xshape, ishape):
  idx = _index(ishape, max(xshape[dim], 1) if xshape else 1)
  check(lambda x, i: x.gather(dim, i), lambda x, i: x.gather(dim, i), [xshape, idx])

def test_gather_dtypes_and_noncontiguous():
  idx = _index((4, 2), 3, 1)
  check(lambda x, i: x.T.gather(1, i), lambda x, i: x.T.gather(1, i), [(3, 4), idx])
  check(lambda x, i: x.gather(0, i), lambda x, i: x.gather(0, i), [(4, 3), _index((2, 3), 4)], dtype=["int32", "int64"])
  check(lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i), [(4, 3), _index((4, 2), 3)],
        dtype=["float16", "int64"])
  check(lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i), [(4, 3), _index((4, 2), 3)], dtype=["bool", "int64"])
  check(lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i), [(2, 3), _index((2, 2), 3)], device="PYTHON")

@pytest.mark.parametrize("dim, xshape, sshape, ishape", [(0, (4, 3), (3, 2), (3, 2)), (1, (2, 5), (2, 3), (2, 3)),
                                                         (2, (2, 2, 4), (1, 2, 3), (1, 2, 3)), (0, (3,), (0,), (0,)),
                                                         (0, (4, 3), (3, 3), (3, 2)), (1, (2, 5), (2, 4), (2, 3))])
def test_scatter(dim, xshape, sshape, ishape):
  idx = _index(ishape, xshape[dim], 2, unique_dim=dim)
  # torch's backward fails when src is larger than index: then compare the forward only
  check(lambda x, i, s: x.scatter(dim, i, s), lambda x, i, s: x.scatter(dim, i, s), [xshape, idx, sshape],
        grad=sshape == ishape)

def test_scatter_scalar_reduce_and_dtypes():
  idx = _index((2, 3), 4, 3)   # duplicates allowed: add and multiply are order-free
  check(lambda x, i: x.scatter(0, i, 1.5), lambda x, i: x.scatter(0, i, 1.5), [(4, 3), _index((2, 3), 4, 3, 0)],
        grad=False)   # torch has no derivative for a scalar src
  check(lambda x, i: x.scatter(0, i, 1.5, reduce="add"), lambda x, i: x.scatter(0, i, 1.5, reduce="add"), [(4, 3), idx],
        grad=False)
  check(lambda x, i: x.scatter(0, i, 1.5, reduce="multiply"), lambda x, i: x.scatter(0, i, 1.5, reduce="multiply"),
        [(4, 3), idx], grad=False)
  check(lambda x, i, s: x.scatter(0, i, s), lambda x, i, s: x.scatter(0, i, s),
        [(4, 3), _index((2, 3), 4, 4, 0), (2, 3)], dtype=["int32", "int64", "int32"], low=-50, high=50)
  check(lambda x, i, s: x.scatter(1, i, s), lambda x, i, s: x.scatter(1, i, s),
        [(2, 4), _index((2, 2), 4, 4, 1), (2, 2)], dtype=["float16", "int64", "float16"])
  check(lambda x, i, s: x.scatter(1, i, s), lambda x, i, s: x.scatter(1, i, s),
        [(2, 4), _index((2, 2), 4, 5, 1), (2, 2)], dtype=["bool", "int64", "bool"])
  out = Tensor.zeros(3, dtype="int32").scatter(0, Tensor([1, 1, 1]), Tensor([4, 5, 6], dtype="int32"))
  assert out.tolist() == [0, 6, 0]   # repeated indices: the last write wins (torch leaves it unspecified)

@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce, include_self):
  idx = _index((3, 3), 4, 6)   # with repeated indices
  grad = reduce in ("sum", "mean", "prod")
  def fn(x, i, s): return x.scatter_reduce(0, i, s, reduce, include_self=include_self)
  check(fn, fn, [(4, 3), idx, (3, 3)], grad=grad, low=0.5, high=2.0)

@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_int(reduce):
  def fn(x, i, s): return x.scatter_reduce(1, i, s, reduce, include_self=reduce != "mean")
  check(fn, fn, [(2, 4), _index((2, 5), 4, 8), (2, 5)], dtype=["int32", "int64", "int32"], low=-9, high=9)

def test_gather_scatter_errors():
  x, i = Tensor.zeros(3, 4), Tensor([[0, 1]])
  with pytest.raises(IndexError, match="gather"): x.gather(2, i)
  with pytest.raises(TypeError, match="gather.*int dtype"): x.gather(0, Tensor([[0.0]]))
  with pytest.raises(ValueError, match="gather.*dimensions"): x.gather(0, Tensor([0, 1]))
  with pytest.raises(ValueError, match="gather.*larger"): x.gather(0, Tensor.zeros(1, 5, dtype="int32"))
  with pytest.raises(RuntimeError, match="scatter.*dtype"): x.scatter(0, i, Tensor([[1, 2]]))
  with pytest.raises(ValueError, match="scatter.*must fit"): x.scatter(0, i, Tensor([[1.0]]))
  with pytest.raises(ValueError, match="scatter.*reduce"): x.scatter(0, i, 1.0, reduce="max")
  with pytest.raises(ValueError, match="scatter_reduce.*reduce"): x.scatter_reduce(0, i, x, "median")
  with pytest.raises(TypeError, match="scatter_reduce.*Tensor"): x.scatter_reduce(0, [[0]], x, "sum")

# ---------------------------------------------------------------------------------------------------------------------
# masked_fill, masked_select, nonzero

def test_masked_fill():
  m = np.random.default_rng(3).random((3, 4)) < 0.5
  check(lambda x: x.masked_fill(Tensor(m), -1.5), lambda x: x.masked_fill(torch.tensor(m), -1.5), [(3, 4)])
  check(lambda x: x.masked_fill(Tensor(m[0]), 2.5), lambda x: x.masked_fill(torch.tensor(m[0]), 2.5), [(3, 4)],
        dtype="int32")   # the value is cast to the tensor's dtype
  check(lambda x, v: x.masked_fill(x > 0, v), lambda x, v: x.masked_fill(x > 0, v), [(3, 4), ()])
  check(lambda x: x.T.masked_fill(x.T < 0, 0.0), lambda x: x.T.masked_fill(x.T < 0, 0.0), [(3, 4)], dtype="float16")
  with pytest.raises(TypeError, match="masked_fill.*bool"): Tensor.zeros(2).masked_fill(Tensor([1, 0]), 1.0)
  with pytest.raises(ValueError, match="masked_fill"): Tensor.zeros(2).masked_fill(Tensor([[True], [False]]), 1.0)

def test_masked_select():
  m = np.random.default_rng(4).random((3, 4)) < 0.5
  check(lambda x: x.masked_select(Tensor(m)), lambda x: x.masked_select(torch.tensor(m)), [(3, 4)])
  check(lambda x: x.masked_select(Tensor(m[:, :1])), lambda x: x.masked_select(torch.tensor(m[:, :1])), [(3, 4)])
  check(lambda x: x.masked_select(x > 0), lambda x: x.masked_select(x > 0), [(2, 3)], dtype="int32")
  check(lambda x: x.masked_select(x < 5), lambda x: x.masked_select(x < 5), [(0, 3)])
  check(lambda x: x.masked_select(Tensor(True)), lambda x: x.masked_select(torch.tensor(True)), [()])
  with pytest.raises(TypeError, match="masked_select.*bool"): Tensor.zeros(2).masked_select(Tensor([1, 0]))

@pytest.mark.parametrize("shape, dtype", [((3, 4), "float32"), ((5,), "int32"), ((2, 2, 3), "bool"),
                                          ((0, 3), "float32"), ((), "float32"), ((3, 2), "float16")])
def test_nonzero(shape, dtype):
  arr = np.random.default_rng(5).integers(-1, 2, shape).astype(dtype)
  want = torch.tensor(arr).nonzero()
  got = Tensor(arr).nonzero()
  assert got.dtype == dtypes.int64 and got.shape == tuple(want.shape)
  np.testing.assert_array_equal(got.numpy(), want.numpy())
  if arr.ndim:
    for g, w in zip(Tensor(arr).nonzero(as_tuple=True), torch.tensor(arr).nonzero(as_tuple=True)):
      np.testing.assert_array_equal(g.numpy(), w.numpy())

def test_nonzero_python_device():
  assert Tensor([[0.0, 1.0], [2.0, 0.0]], device="PYTHON").nonzero().tolist() == [[0, 1], [1, 0]]
