"""The gather rewrite (kiln/codegen/gather.py): one-hot sums over a table axis become one guarded load, with the same
results as before (NumPy/torch) for out-of-range and negative indices, every table dtype, 0-d and empty indices and
under TinyJit; lookalikes that are not gathers keep their loop."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from kiln import Tensor, TinyJit, dtypes, nn
from kiln.dtype import to_numpy_dtype
from kiln.uop.ops import UOp, Ops
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.gather import rewrite_gathers, reduce_of_one_hot_to_load

TABLE = 37   # the indexed axis; no other axis in these tests has this size, so a loop of 37 is the table loop

def _loop_sizes(t: Tensor) -> list[list[int]]:
  """Per kernel realizing `t`: the constant trip counts of its loops after the gather rewrite (nothing runs)."""
  sizes = []
  for item in t.schedule():
    uops = linearize(rewrite_gathers(lower_kernel(item.ast)))
    sizes.append([u.src[0].arg for u in uops if u.op is Ops.RANGE and u.src[0].op is Ops.CONST])
  return sizes

def _assert_no_table_loop(t: Tensor) -> None:
  sizes = _loop_sizes(t)
  assert len(sizes) == 1, f"expected one kernel, got {len(sizes)} with loops {sizes}"
  assert TABLE not in sizes[0], f"the kernel still loops over the table axis: loops {sizes[0]}"

def _table(dtype, shape=(TABLE, 5), seed=0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  if dtype == dtypes.bool: return rng.integers(0, 2, shape).astype(np.bool_)
  if dtypes.is_int(dtype): return rng.integers(-1000, 1000, shape).astype(to_numpy_dtype(dtype))
  return rng.standard_normal(shape).astype(to_numpy_dtype(dtype))

INDICES = np.array([[0, 5, TABLE - 1], [TABLE, -1, -TABLE], [-TABLE - 1, 1000, 7]], dtype=np.int32)

def _rows_or_zero(table: np.ndarray, idx: np.ndarray, wrap: bool) -> np.ndarray:
  """table[idx] with out-of-range indices giving zero rows (negatives wrapped first when `wrap`)."""
  n = table.shape[0]
  fixed = np.where((idx < 0) & (idx >= -n), idx + n, idx) if wrap else idx
  ok = (fixed >= 0) & (fixed < n)
  picked = table[np.where(ok, fixed, 0)]
  return np.where(ok.reshape(ok.shape + (1,) * (table.ndim - 1)), picked, np.zeros_like(picked))

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.bool])
def test_embedding_is_one_load_and_matches(dtype):
  emb = nn.Embedding(TABLE, 5)
  emb.weight = Tensor(_table(dtype)).realize()
  out = emb(Tensor(INDICES))
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), _rows_or_zero(emb.weight.numpy(), INDICES, wrap=False))

@pytest.mark.parametrize("idx_dtype", [np.int64, np.uint8, np.int16])
def test_embedding_index_dtypes(idx_dtype):
  emb = nn.Embedding(TABLE, 5)
  emb.weight.realize()
  idx = INDICES.astype(idx_dtype)
  out = emb(Tensor(idx))
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), _rows_or_zero(emb.weight.numpy(), idx.astype(np.int64), wrap=False))

def test_embedding_matches_torch_in_range():
  emb, ref = nn.Embedding(TABLE, 6), torch.nn.Embedding(TABLE, 6)
  ref.weight.data = torch.tensor(emb.weight.numpy())
  idx = np.random.default_rng(1).integers(0, TABLE, (4, 9))
  np.testing.assert_array_equal(emb(Tensor(idx.astype(np.int32))).numpy(), ref(torch.tensor(idx)).detach().numpy())

def test_embedding_zero_d_and_empty_index():
  emb = nn.Embedding(TABLE, 5)
  w = emb.weight.numpy()
  np.testing.assert_array_equal(emb(Tensor(3)).numpy(), w[3])
  assert emb(Tensor(np.zeros((0,), np.int32))).shape == (0, 5)
  assert emb(Tensor(np.zeros((2, 0), np.int32))).numpy().shape == (2, 0, 5)

def test_embedding_under_tinyjit():
  emb = nn.Embedding(TABLE, 5)
  w = emb.weight.numpy()
  step = TinyJit(lambda idx: emb(idx).realize())
  for seed in range(4):
    idx = np.random.default_rng(seed).integers(-TABLE - 2, TABLE + 2, (3,)).astype(np.int32)
    np.testing.assert_array_equal(step(Tensor(idx)).numpy(), _rows_or_zero(w, idx, wrap=False))

def test_embedding_weight_gradient():
  emb, ref = nn.Embedding(TABLE, 4), torch.nn.Embedding(TABLE, 4)
  ref.weight.data = torch.tensor(emb.weight.numpy())
  idx = np.array([[1, 2, 1], [TABLE - 1, 0, 2]])
  emb.weight.requires_grad = True
  (emb(Tensor(idx.astype(np.int32))) * 3).sum().backward()
  (ref(torch.tensor(idx)) * 3).sum().backward()
  np.testing.assert_allclose(emb.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=0, atol=1e-6)

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.int32])
def test_getitem_by_tensor_wraps_negatives(dtype):
  table = _table(dtype, (TABLE, 3, 2))
  out = Tensor(table)[Tensor(INDICES)]
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), _rows_or_zero(table, INDICES, wrap=True))

def test_getitem_inner_axis_and_two_indices():
  table = _table(dtypes.float32, (4, TABLE))
  cols = np.array([0, -1, 36, 2], np.int32)
  out = Tensor(table)[:, Tensor(cols)]
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), table[:, cols])
  rows = np.array([3, -4, 0, 1], np.int32)
  both = Tensor(table)[Tensor(rows), Tensor(cols)]
  np.testing.assert_array_equal(both.numpy(), table[rows, cols])

def test_gather_is_one_load():
  table = _table(dtypes.float32, (TABLE, 4))
  index = np.random.default_rng(2).integers(0, TABLE, (6, 3))
  out = Tensor(table).gather(0, Tensor(index.astype(np.int32)))
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), torch.gather(torch.tensor(table), 0, torch.tensor(index)).numpy())

def test_gather_out_of_range_gives_zero():
  table = _table(dtypes.int32, (3, TABLE))
  index = np.array([[0, TABLE, -1], [5, -TABLE, 36], [1, 2, 3]], np.int32)
  out = Tensor(table).gather(1, Tensor(index))
  _assert_no_table_loop(out)
  ok = (index >= 0) & (index < TABLE)
  np.testing.assert_array_equal(out.numpy(), np.where(ok, np.take_along_axis(table, np.where(ok, index, 0), 1), 0))

def test_int_one_hot_matmul_is_one_load():
  table = _table(dtypes.int32)
  idx = np.array([4, -1, 36, TABLE], np.int32)
  out = Tensor(idx).one_hot(TABLE) @ Tensor(table)
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), _rows_or_zero(table, idx, wrap=False))

def test_offset_arange_and_float_index():
  table = _table(dtypes.float32, (TABLE, 2))
  idx = Tensor(np.array([5, 4, 41, 42, -3], np.int32))
  hit = idx.reshape(5, 1, 1) == Tensor.arange(5, 5 + TABLE).reshape(1, TABLE, 1)
  out = hit.where(Tensor(table), 0).sum(1)
  _assert_no_table_loop(out)
  np.testing.assert_array_equal(out.numpy(), _rows_or_zero(table, np.array([0, -1, 36, 37, -8]), wrap=False))
  # a float index hits only integral in-range values; NaN and 2.5 hit nothing
  fidx = np.array([2.0, 2.5, np.nan, -1.0, 36.0, 37.0, np.inf], np.float32)
  fhit = Tensor(fidx).reshape(7, 1, 1) == Tensor.arange(TABLE).float().reshape(1, TABLE, 1)
  fout = fhit.where(Tensor(table), 0).sum(1)
  _assert_no_table_loop(fout)
  want = np.zeros((7, 2), np.float32)
  want[0], want[4] = table[2], table[36]
  np.testing.assert_array_equal(fout.numpy(), want)

def test_multiplier_keeps_nan_semantics():
  # where(hit, w, 0) * s with s infinite: the misses are 0*inf = NaN, so the old sum is NaN; the rewrite keeps that
  table = _table(dtypes.float32, (TABLE, 3))
  scale = np.array([2.0, np.inf, -0.5], np.float32)
  idx = np.array([3, TABLE], np.int32)
  hit = Tensor(idx).reshape(2, 1, 1) == Tensor.arange(TABLE).reshape(1, TABLE, 1)
  out = (hit.where(Tensor(table), 0) * Tensor(scale)).sum(1)
  _assert_no_table_loop(out)
  with np.errstate(invalid="ignore"):
    want = (np.where(idx.reshape(2, 1, 1) == np.arange(TABLE).reshape(1, TABLE, 1), table, 0) * scale).sum(1)
  np.testing.assert_array_equal(out.numpy(), want.astype(np.float32))

def test_lookalike_with_index_depending_on_loop_keeps_loop():
  a = np.random.default_rng(3).integers(0, TABLE, (4, TABLE)).astype(np.int32)
  x = _table(dtypes.float32, (TABLE,))
  hit = Tensor(a) == Tensor.arange(TABLE).reshape(1, TABLE)   # the index a[i, r] moves with r: not a gather
  out = hit.where(Tensor(x).reshape(1, TABLE), 0).sum(1)
  assert any(TABLE in loops for loops in _loop_sizes(out))
  np.testing.assert_allclose(out.numpy(), np.where(a == np.arange(TABLE), x, 0).sum(1), rtol=1e-6)

def test_max_reduce_keeps_loop():
  table = _table(dtypes.float32, (TABLE, 2))
  idx = np.array([1, 40], np.int32)
  hit = Tensor(idx).reshape(2, 1, 1) == Tensor.arange(TABLE).reshape(1, TABLE, 1)
  out = hit.where(Tensor(table), 0).max(1)
  assert any(TABLE in loops for loops in _loop_sizes(out))
  np.testing.assert_array_equal(out.numpy(), np.where(idx.reshape(2, 1, 1) == np.arange(TABLE).reshape(1, TABLE, 1),
                                                      table, 0).max(1))

def test_float_one_hot_matmul_keeps_loop():
  # cast(hit) * w[r] over floats: a miss is 0 * w[r], NaN where w[r] is infinite, so only the full loop is exact
  table = _table(dtypes.float32)
  table[9, 1] = np.inf
  idx = np.array([4, 9], np.int32)
  out = Tensor(idx).one_hot(TABLE).float() @ Tensor(table)
  assert any(TABLE in loops for loops in _loop_sizes(out))
  with np.errstate(invalid="ignore"):
    want = np.eye(TABLE, dtype=np.float32)[idx] @ table
  np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(want))

# ---------------- the rule on hand-built lowered nodes ----------------
def _range(n: int, rid: int) -> UOp: return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), rid)
def _load(buf: UOp, idx: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype, (buf, idx))

def test_rule_refuses_index_depending_on_loop_and_other_compares():
  r, out = _range(TABLE, 1), _range(4, 0)
  idx_buf, tab = UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), 1), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 2)
  zero = UOp.const(dtypes.float32, 0.0)
  def reduce_of(cond: UOp) -> UOp: return UOp(Ops.REDUCE, dtypes.float32, (cond.where(_load(tab, r), zero), r), Ops.ADD)
  assert reduce_of_one_hot_to_load(reduce_of(_load(idx_buf, out).eq(r))) is not None
  assert reduce_of_one_hot_to_load(reduce_of(_load(idx_buf, out + r).eq(r))) is None          # e moves with r
  assert reduce_of_one_hot_to_load(reduce_of(_load(idx_buf, out).lt(r))) is None              # not an equality
  assert reduce_of_one_hot_to_load(reduce_of(_load(idx_buf, out).eq(r * 2))) is None           # r*2 hits twice as sparse
  wide = _range(300, 1)   # int8(r) wraps at 128, so two loop positions would hit the same index
  narrow = _load(idx_buf, out).cast(dtypes.int8).eq(wide.cast(dtypes.int8))
  assert reduce_of_one_hot_to_load(UOp(Ops.REDUCE, dtypes.float32, (narrow.where(_load(tab, wide), zero), wide),
                                       Ops.ADD)) is None
