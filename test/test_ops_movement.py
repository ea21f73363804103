"""Movement ops against PyTorch: padding modes, repeats, rolls, joins and splits, grids, diagonals and triangles."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, dtypes
from helpers import check, assert_close

def tflip(x): return x.flip(0).T   # a non-contiguous view, the same op in both libraries

# ---------------------------------------------------------------------------------------------------------------------
# pad

@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape, padding", [
  ((2, 3, 4), (1, 2)), ((2, 3, 4), (2, 1, 0, 2)), ((1, 3, 4), (-1, 2)), ((1, 3, 4), (0, 0, 2, -1)),
  ((2, 1, 3), (2, 2)), ((3, 4), (0, 0))])
def test_pad_modes(mode, shape, padding):
  check(lambda x: x.pad(padding, mode=mode), lambda x: F.pad(x, padding, mode=mode), [shape])

@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_modes_noncontiguous_and_half(mode):
  check(lambda x: tflip(x).reshape(1, 4, 3).pad((1, 2), mode=mode),
        lambda x: F.pad(tflip(x).reshape(1, 4, 3), (1, 2), mode=mode), [(3, 4)])
  check(lambda x: x.pad((2, 1), mode=mode), lambda x: F.pad(x, (2, 1), mode=mode), [(1, 2, 3)], dtype="float16")

@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_grouped_pairs_and_ints(mode):
  """tinygrad's per-axis form (None keeps an axis) pads any axes; the result equals torch's flat form."""
  x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
  got = Tensor(x).pad((None, (1, 2), (2, 0)), mode=mode)
  want = F.pad(torch.tensor(x).reshape(1, 2, 3, 4).float(), (2, 0, 1, 2), mode=mode).reshape(2, 6, 6)
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), want.int().numpy())

def test_pad_constant_value_dtypes():
  check(lambda x: x.pad((1, 1, 0, 2), value=-1.5), lambda x: F.pad(x, (1, 1, 0, 2), value=-1.5), [(2, 3)])
  check(lambda x: x.bfloat16().pad((1, 1), value=2.0), lambda x: F.pad(x.bfloat16(), (1, 1), value=2.0), [(2, 3)])
  check(lambda x: x.pad((1, -1), value=7), lambda x: F.pad(x, (1, -1), value=7), [(2, 3)], dtype="int32")
  check(lambda x: x.pad((2, 0), value=True), lambda x: F.pad(x, (2, 0), value=True), [(3,)], dtype="bool")
  check(lambda x: x.pad((1, 2)), lambda x: F.pad(x, (1, 2)), [(0, 2)])
  check(lambda x: x.pad((-2, -2)), lambda x: F.pad(x, (-2, -2)), [(2, 4)])

def test_pad_errors():
  x = Tensor.ones(1, 2, 3)
  with pytest.raises(ValueError, match="pad: reflect padding"): x.pad((3, 0), mode="reflect")
  with pytest.raises(ValueError, match="pad: circular padding"): x.pad((0, 4), mode="circular")
  with pytest.raises(ValueError, match="pad: .*even length"): x.pad((1, 2, 3))
  with pytest.raises(ValueError, match="pad: .*pads 4 axes"): x.pad((1, 1) * 4)
  with pytest.raises(ValueError, match="pad: 2 .* pairs"): x.pad(((1, 1), (1, 1)))
  with pytest.raises(ValueError, match="pad: padding .* crops more"): x.pad((-4, 1))
  with pytest.raises(ValueError, match="pad: .* does not take a fill value"): x.pad((1, 1), mode="reflect", value=1.0)
  with pytest.raises(ValueError, match="pad: replicate"): Tensor.ones(2, 0).pad((1, 1), mode="replicate")
  with pytest.raises(NotImplementedError, match="pad: mode 'wrap'"): x.pad((1, 1), mode="wrap")
  with pytest.raises(TypeError, match="pad: each axis"): x.pad((None, (1,), None))

# ---------------------------------------------------------------------------------------------------------------------
# repeat, repeat_interleave, roll

@pytest.mark.parametrize("shape, repeats", [((2, 3), (2, 1)), ((2, 3), (1, 2, 3)), ((3,), (0,)), ((), (2, 3)),
                                            ((0, 2), (2, 2)), ((1, 2), (3, 1))])
def test_repeat(shape, repeats):
  check(lambda x: x.repeat(repeats), lambda x: x.repeat(repeats), [shape])
  check(lambda x: x.repeat(*repeats), lambda x: x.repeat(*repeats), [shape], dtype="int32")

def test_repeat_noncontiguous_and_errors():
  check(lambda x: tflip(x).repeat(2, 2), lambda x: tflip(x).repeat(2, 2), [(2, 3)], dtype="float16")
  with pytest.raises(ValueError, match="repeat: 1 repeats for a 2-d"): Tensor.ones(2, 3).repeat(2)
  with pytest.raises(ValueError, match="repeat: repeats must be non-negative"): Tensor.ones(2, 3).repeat(2, -1)

@pytest.mark.parametrize("shape, repeats, dim", [((2, 3), 2, None), ((2, 3), 3, 0), ((2, 3), 2, -1), ((0, 2), 2, 1),
                                                 ((2, 3), 0, 1), ((), 3, None), ((1,), 2, 0)])
def test_repeat_interleave(shape, repeats, dim):
  check(lambda x: x.repeat_interleave(repeats, dim), lambda x: x.repeat_interleave(repeats, dim), [shape])

def test_repeat_interleave_types_and_errors():
  check(lambda x: x.repeat_interleave(2, 1), lambda x: x.repeat_interleave(2, 1), [(2, 3)], dtype="bool")
  check(lambda x: tflip(x).repeat_interleave(2, 0), lambda x: tflip(x).repeat_interleave(2, 0), [(2, 3)])
  with pytest.raises(ValueError, match="repeat_interleave: repeats must be non-negative"):
    Tensor.ones(3).repeat_interleave(-1)
  with pytest.raises(IndexError, match="repeat_interleave"): Tensor.ones(3).repeat_interleave(2, 1)

@pytest.mark.parametrize("shape, shifts, dims", [
  ((5,), 2, 0), ((5,), -7, None), ((2, 3), 1, None), ((2, 3), (1, -1), (0, 1)), ((2, 3), (2, 1), (1, 1)),
  ((3, 4), 5, -1), ((0, 2), 1, 0), ((2, 3), 0, 1)])
def test_roll(shape, shifts, dims):
  check(lambda x: x.roll(shifts, dims), lambda x: torch.roll(x, shifts, dims), [shape])

def test_roll_types_and_errors():
  check(lambda x: tflip(x).roll(1, 0), lambda x: tflip(x).roll(1, 0), [(2, 3)], dtype="int32")
  check(lambda x: x.roll((1, 2), (0, 1)), lambda x: x.roll((1, 2), (0, 1)), [(2, 3)], dtype="float16")
  with pytest.raises(ValueError, match="roll: shifts .* and dims .* same length"): Tensor.ones(2, 2).roll((1, 2), (0,))
  with pytest.raises(ValueError, match="roll: 2 shifts"): Tensor.ones(2, 2).roll((1, 2))
  with pytest.raises(IndexError, match="roll"): Tensor.ones(2, 2).roll(1, 2)

# ---------------------------------------------------------------------------------------------------------------------
# cat, stack

@pytest.mark.parametrize("shapes, dim", [([(2, 3), (1, 3)], 0), ([(2, 3), (2, 1), (2, 0), (2, 2)], 1),
                                         ([(2, 3), (2, 3)], -1),
                                         ([(0, 3), (0, 3)], 0), ([(1,), (2,), (1,)], 0), ([(1, 1, 2), (1, 2, 2)], 1)])
def test_cat(shapes, dim):
  check(lambda *xs: Tensor.cat(*xs, dim=dim), lambda *xs: torch.cat(xs, dim=dim), shapes)

@pytest.mark.parametrize("dts", [["float32", "float16"], ["int32", "float16"], ["bool", "int32"], ["bool", "bool"],
                                 ["float16", "bfloat16"], ["int8", "uint8"]])
def test_cat_promotes(dts):
  # bfloat16 inputs are made by a cast (numpy has no bfloat16)
  def as_bf16(x): return x.bfloat16() if dts[1] == "bfloat16" else x
  dts = [dts[0], "float32" if dts[1] == "bfloat16" else dts[1]]
  check(lambda a, b: a.cat(as_bf16(b), dim=1), lambda a, b: torch.cat([a, as_bf16(b)], dim=1), [(2, 2), (2, 3)],
        dtype=dts)

def test_cat_noncontiguous_list_and_legacy_empty():
  check(lambda a, b: tflip(a).cat(b), lambda a, b: torch.cat([tflip(a), b]), [(2, 3), (1, 2)])
  check(lambda a, b, c: Tensor.cat([a, b, c], dim=1), lambda a, b, c: torch.cat([a, b, c], dim=1),
        [(2, 3), (0,), (2, 1)])

def test_cat_keeps_negative_zero_and_specials():
  x = np.array([-0.0, np.inf, -np.inf, np.nan], np.float32)
  got = Tensor(x).cat(Tensor(x[::-1].copy())).numpy()
  want = np.concatenate([x, x[::-1]])
  np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
  np.testing.assert_array_equal(got, want)

def test_cat_many_pieces_is_one_kernel():
  pieces = [Tensor(np.full((1, 2), i, np.float32)) for i in range(100)]
  out = pieces[0].cat(*pieces[1:])
  assert out.shape == (100, 2)
  assert len(out.schedule()) == 1
  np.testing.assert_array_equal(out.numpy(), np.repeat(np.arange(100, dtype=np.float32)[:, None], 2, 1))

def test_cat_errors():
  a = Tensor.ones(2, 3)
  with pytest.raises(ValueError, match=r"cat: shape \(2, 4\) of tensor 1 does not match \(2, 3\)"):
    a.cat(Tensor.ones(2, 4))
  with pytest.raises(ValueError, match=r"cat: shape \(3,\) of tensor 1"): a.cat(Tensor.ones(3))
  with pytest.raises(ValueError, match="cat: tensor 0 is 0-d"): Tensor(1.0).cat(Tensor(2.0))
  with pytest.raises(RuntimeError, match="cat: tensors are on different devices"):
    a.cat(Tensor.ones(2, 3, device="PYTHON"))
  with pytest.raises(IndexError, match="cat"): a.cat(a, dim=2)
  with pytest.raises(TypeError, match="cat: argument 1"): a.cat([1, 2])
  with pytest.raises(ValueError, match="cat: expected a non-empty"): Tensor.cat([])

@pytest.mark.parametrize("shape, n, dim", [((2, 3), 2, 0), ((2, 3), 3, 1), ((2, 3), 2, -1), ((2, 3), 1, 2), ((), 3, 0),
                                           ((0, 2), 2, 1)])
def test_stack(shape, n, dim):
  check(lambda *xs: Tensor.stack(*xs, dim=dim), lambda *xs: torch.stack(xs, dim=dim), [shape] * n)

def test_stack_types_and_errors():
  check(lambda a, b: a.stack(b, dim=1), lambda a, b: torch.stack([a, b], dim=1), [(2, 2), (2, 2)],
        dtype=["int32", "float16"])
  check(lambda a, b: Tensor.stack([tflip(a), b]), lambda a, b: torch.stack([tflip(a), b]), [(2, 3), (3, 2)])
  with pytest.raises(ValueError, match=r"stack: tensors must have equal shapes, got \(2,\)"):
    Tensor.ones(2).stack(Tensor.ones(3))
  with pytest.raises(IndexError, match="stack: dim 3"): Tensor.ones(2).stack(Tensor.ones(2), dim=3)

# ---------------------------------------------------------------------------------------------------------------------
# split, chunk, unflatten, meshgrid

@pytest.mark.parametrize("shape, sizes, dim", [((5, 2), 2, 0), ((5, 2), [1, 4], 0), ((2, 6), 3, -1),
                                               ((2, 6), [0, 6, 0], 1),
                                               ((0, 2), 2, 0), ((3, 2), 7, 0), ((1, 2), 1, 0)])
def test_split(shape, sizes, dim):
  check(lambda x: Tensor.stack(*[p.sum() for p in x.split(sizes, dim)]),
        lambda x: torch.stack([p.sum() for p in x.split(sizes, dim)]), [shape])
  n = int(np.prod(shape))
  ks, ts = Tensor.arange(n).reshape(shape).split(sizes, dim), torch.arange(n).reshape(shape).split(sizes, dim)
  assert isinstance(ks, tuple) and len(ks) == len(ts)
  for k, t in zip(ks, ts): np.testing.assert_array_equal(k.numpy(), t.numpy())

def test_split_errors():
  with pytest.raises(ValueError, match=r"split: sizes \[2, 2\] sum to 4, not to the size 5"):
    Tensor.ones(5).split([2, 2])
  with pytest.raises(ValueError, match="split: split size 0"): Tensor.ones(5).split(0)
  with pytest.raises(IndexError, match="split"): Tensor.ones(5).split(2, 1)

@pytest.mark.parametrize("n, chunks", [(11, 6), (12, 6), (13, 6), (5, 1), (2, 5), (0, 3)])
def test_chunk(n, chunks):
  ks, ts = Tensor.arange(n).reshape(1, n).chunk(chunks, 1), torch.arange(n).reshape(1, n).chunk(chunks, 1)
  assert isinstance(ks, list) and len(ks) == len(ts)
  for k, t in zip(ks, ts): np.testing.assert_array_equal(k.numpy(), t.numpy())

def test_chunk_grad_and_errors():
  check(lambda x: Tensor.cat(*[p * (i + 1) for i, p in enumerate(tflip(x).chunk(2))]),
        lambda x: torch.cat([p * (i + 1) for i, p in enumerate(tflip(x).chunk(2))]), [(2, 3)])
  with pytest.raises(ValueError, match="chunk: chunks must be a positive int"): Tensor.ones(3).chunk(0)

@pytest.mark.parametrize("shape, dim, sizes", [((3, 4, 1), 1, (2, 2)), ((3, 4, 1), 1, (-1, 2)),
                                               ((5, 12, 3), -2, (2, 2, 3, 1, 1)),
                                               ((6,), 0, (6,)), ((0, 4), 0, (0, 5)), ((2, 6), 1, (3, -1))])
def test_unflatten(shape, dim, sizes):
  check(lambda x: x.unflatten(dim, sizes), lambda x: x.unflatten(dim, sizes), [shape])

def test_unflatten_errors():
  with pytest.raises(ValueError, match=r"unflatten: sizes \(2, 2\) do not multiply up to the size 3"):
    Tensor.ones(2, 3).unflatten(1, (2, 2))
  with pytest.raises(ValueError, match="unflatten"): Tensor.ones(2, 3).unflatten(1, (-1, -1))

@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("shapes", [[(3,), (4,)], [(2,), (), (3,)], [(0,), (2,)], [(3,)]])
def test_meshgrid(indexing, shapes):
  def grids(*xs): return xs[0].meshgrid(*xs[1:], indexing=indexing)
  check(lambda *xs: Tensor.stack(*[g.float() * (i + 1) for i, g in enumerate(grids(*xs))]),
        lambda *xs: torch.stack([g * (i + 1) for i, g in enumerate(torch.meshgrid(*xs, indexing=indexing))]), shapes)

def test_meshgrid_types_and_errors():
  a, b = Tensor([1, 2, 3]), Tensor([True, False])
  ga, gb = a.meshgrid(b, indexing="xy")
  # torch wants one dtype for all inputs; kiln (like tinygrad) keeps each input's dtype
  ta, _ = torch.meshgrid(torch.tensor([1, 2, 3]), torch.tensor([1, 0]), indexing="xy")
  _, tb = torch.meshgrid(torch.tensor([True, True, False]), torch.tensor([True, False]), indexing="xy")
  assert ga.dtype == dtypes.int32 and gb.dtype == dtypes.bool
  np.testing.assert_array_equal(ga.numpy(), ta.numpy())
  np.testing.assert_array_equal(gb.numpy(), tb.numpy())
  with pytest.raises(ValueError, match="meshgrid: indexing"): a.meshgrid(a, indexing="ab")
  with pytest.raises(ValueError, match=r"meshgrid: tensor 1 has shape \(2, 2\)"): a.meshgrid(Tensor.ones(2, 2))

# ---------------------------------------------------------------------------------------------------------------------
# diag, diagonal, tril, triu

@pytest.mark.parametrize("shape, dtype", [((3,), "float32"), ((1,), "float32"), ((0,), "float32"), ((4,), "int32"),
                                          ((3,), "float16"), ((2,), "bool")])
def test_diag(shape, dtype):
  check(lambda x: x.diag(), lambda x: torch.diag(x), [shape], dtype=dtype)

def test_diag_errors():
  with pytest.raises(ValueError, match=r"diag: expected a 1-d tensor, got shape \(2, 2\)"): Tensor.ones(2, 2).diag()

@pytest.mark.parametrize("shape, args", [((3, 3), ()), ((3, 4), (1,)), ((4, 3), (-2,)), ((2, 3, 4), (0, 1, 2)),
                                         ((2, 3, 4), (1, -1, 0)), ((3, 3), (5,)), ((0, 3), ()), ((1, 1), ()),
                                         ((2, 3, 4), (-1, 2, 0))])
def test_diagonal(shape, args):
  check(lambda x: x.diagonal(*args), lambda x: x.diagonal(*args), [shape])

def test_diagonal_types_and_errors():
  check(lambda x: tflip(x).diagonal(), lambda x: tflip(x).diagonal(), [(3, 4)], dtype="float16")
  check(lambda x: x.diagonal(1), lambda x: x.diagonal(1), [(3, 4)], dtype="int32")
  with pytest.raises(ValueError, match="diagonal: dim1 and dim2 must differ"): Tensor.ones(2, 2).diagonal(0, 1, 1)
  with pytest.raises(ValueError, match="diagonal: needs at least 2 dims"): Tensor.ones(2).diagonal()

@pytest.mark.parametrize("op", ["tril", "triu"])
@pytest.mark.parametrize("shape, diagonal", [((3, 4), 0), ((4, 3), 1), ((3, 4), -1), ((2, 3, 3), 2), ((3, 3), -5),
                                             ((3, 3), 5), ((0, 3), 0), ((1, 1), 0)])
def test_tril_triu(op, shape, diagonal):
  check(lambda x: getattr(x, op)(diagonal), lambda x: getattr(x, op)(diagonal), [shape])

@pytest.mark.parametrize("op", ["tril", "triu"])
def test_tril_triu_types_and_errors(op):
  check(lambda x: getattr(tflip(x), op)(), lambda x: getattr(tflip(x), op)(), [(3, 4)], dtype="float16")
  check(lambda x: getattr(x, op)(1), lambda x: getattr(x, op)(1), [(3, 4)], dtype="int32")
  check(lambda x: getattr(x, op)(), lambda x: getattr(x, op)(), [(3, 3)], dtype="bool")
  x = np.full((2, 2), np.nan, np.float32)   # masked-out elements are zero even when they were NaN
  np.testing.assert_array_equal(getattr(Tensor(x), op)().numpy(), getattr(torch.tensor(x), op)().numpy())
  with pytest.raises(ValueError, match=f"{op}: needs at least 2 dims"): getattr(Tensor.ones(3), op)()

# ---------------------------------------------------------------------------------------------------------------------
# core views: squeeze, unsqueeze, flatten, transpose

@pytest.mark.parametrize("shape, dim", [((2, 1, 3), None), ((2, 1, 3), 1), ((2, 1, 3), 0), ((2, 1, 3), -2), ((1,), 0),
                                        ((), None), ((), 0), ((1, 0, 1), None)])
def test_squeeze(shape, dim):
  check(lambda x: x.squeeze(dim), lambda x: x.squeeze() if dim is None else x.squeeze(dim), [shape])

@pytest.mark.parametrize("shape, dim", [((2, 3), 0), ((2, 3), 2), ((2, 3), -1), ((2, 3), -3), ((), 0), ((), -1),
                                        ((0,), 1)])
def test_unsqueeze(shape, dim):
  check(lambda x: x.unsqueeze(dim), lambda x: x.unsqueeze(dim), [shape])

@pytest.mark.parametrize("shape, args", [((2, 3, 4), ()), ((2, 3, 4), (1,)), ((2, 3, 4), (0, 1)), ((2, 3, 4), (-2, -1)),
                                         ((), ()), ((2, 0, 3), (1,)), ((1,), ())])
def test_flatten(shape, args):
  check(lambda x: x.flatten(*args), lambda x: x.flatten(*args), [shape])

@pytest.mark.parametrize("shape, args", [((2, 3), ()), ((2, 3, 4), (0, 2)), ((2, 3, 4), (-1, 1)), ((1, 0), (0, 1)),
                                         ((3,), (0, 0))])
def test_transpose(shape, args):
  check(lambda x: x.transpose(*args), lambda x: x.transpose(*(args or (1, 0))), [shape])

def test_core_views_types_and_errors():
  check(lambda x: tflip(x).unsqueeze(1).squeeze(1).flatten().unflatten(0, (2, 3)).transpose(),
        lambda x: tflip(x).unsqueeze(1).squeeze(1).flatten().unflatten(0, (2, 3)).T, [(3, 2)], dtype="float16")
  check(lambda x: x.unsqueeze(0).flatten(0, 1).transpose(0, 1), lambda x: x.unsqueeze(0).flatten(0, 1).transpose(0, 1),
        [(2, 3)], dtype="int32")
  with pytest.raises(IndexError, match="squeeze"): Tensor.ones(2, 1).squeeze(2)
  with pytest.raises(ValueError, match="unsqueeze: dim 3"): Tensor.ones(2, 1).unsqueeze(3)
  with pytest.raises(IndexError, match="flatten"): Tensor.ones(2, 1).flatten(2)
  with pytest.raises(IndexError, match="transpose"): Tensor.ones(2, 1).transpose(0, 2)

# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON device: a few tiny cases

@pytest.mark.parametrize("name", ["pad_reflect", "pad_circular", "cat", "roll", "diagonal", "tril"])
def test_python_device(name):
  cases = {
    "pad_reflect": (lambda x: x.pad((1, 1), mode="reflect"), lambda x: F.pad(x, (1, 1), mode="reflect"), [(1, 3)]),
    "pad_circular": (lambda x: x.pad((1, 1), mode="circular"), lambda x: F.pad(x, (1, 1), mode="circular"), [(1, 3)]),
    "cat": (lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), [(2, 1), (2, 2)]),
    "roll": (lambda x: x.roll(1, 1), lambda x: x.roll(1, 1), [(2, 3)]),
    "diagonal": (lambda x: x.diagonal(1), lambda x: x.diagonal(1), [(2, 3)]),
    "tril": (lambda x: x.tril(), lambda x: x.tril(), [(2, 3)])}
  fn, tfn, shapes = cases[name]
  check(fn, tfn, shapes, device="PYTHON")

def test_views_do_not_copy():
  """The movement ops build only views and selects: realizing one output is a single kernel reading the input."""
  x, t = Tensor.arange(12).reshape(3, 4).float().realize(), torch.arange(12.0).reshape(3, 4)
  pairs = [(x.pad((1, 1), mode="reflect"), F.pad(t[None], (1, 1), mode="reflect")[0]), (x.roll(1, 0), t.roll(1, 0)),
           (x.repeat(2, 1), t.repeat(2, 1)), (x.diagonal(), t.diagonal()), (x.tril(), t.tril()),
           (x.chunk(2)[1], t.chunk(2)[1])]
  for out, want in pairs:
    assert len(out.schedule()) <= 1
    assert_close(out.numpy(), want.numpy(), "view")
