"""The CPU vectorizer (kiln/codegen/vectorize.py): every kernel gives the same bits with VECTORIZE=1 as the scalar
C (VECTORIZE=0), and a matmul tile really becomes vector code."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor
from kiln.dtype import dtypes
from kiln.helpers import Context
from kiln.engine import realize
from kiln.engine.realize import render_lowered
from kiln.uop.ops import UOp, Ops
from kiln.codegen.vectorize import vectorize
from kiln.codegen.opt import Kernel, Opt, OptOps, optimize_kernel
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen import parallel
from kiln.engine import codegen_cache
from kiln.codegen.pipeline import thread_plan
from kiln.runtime import ops_cpu
from kernel_runs import last_kernel_item, run_lowered

RNG = np.random.default_rng(42)

def _data(*shape, dtype=np.float32) -> Tensor:
  if np.issubdtype(dtype, np.integer): return Tensor(RNG.integers(-50, 50, shape, dtype=dtype)).realize()
  return Tensor(RNG.standard_normal(shape, dtype=dtype)).realize()

def _bits(build, vectorized: int) -> np.ndarray:
  with Context(VECTORIZE=vectorized): return build().numpy()

def _assert_same_bits(build) -> None:
  scalar, vector = _bits(build, 0), _bits(build, 1)
  assert scalar.dtype == vector.dtype and scalar.shape == vector.shape
  if scalar.tobytes() != vector.tobytes():
    diff = np.abs(scalar.astype(np.float64) - vector.astype(np.float64))
    raise AssertionError(f"vectorized result differs: shape {scalar.shape}, worst {np.nanmax(diff)} at "
                         f"{np.unravel_index(np.nanargmax(diff), diff.shape)}")

h, w, b = _data(2, 16, 64), _data(64, 48), _data(48)
xs = [_data(2, 16, 48) for _ in range(3)]
x, y = _data(6, 40), _data(6, 40)
ints, ints2 = _data(13, 37, dtype=np.int32), _data(13, 37, dtype=np.int32)
odd_a, odd_b = _data(7, 19), _data(19, 13)

CASES = {
  "matmul_residuals": lambda: xs[0] + xs[1] + xs[2] + h @ w,
  "matmul_bias_gelu": lambda: (h @ w + b).gelu(),
  "matmul_tanh_exp": lambda: (h @ w).tanh() + (h @ w * 0.1).exp(),
  "odd_matmul_scalar_tail": lambda: odd_a @ odd_b + 1.0,
  "softmax_rows": lambda: x.softmax(-1),
  "layernorm_rows": lambda: x.layernorm() * 2.0 + 0.5,
  "software_exp_log_sin": lambda: x.exp() + y.abs().log() + x.sin(),
  "broadcast_row_and_column": lambda: x * y[0:1, :] + y[:, 0:1],
  "int32_lanes": lambda: (ints * 3 + ints2 // 4 - ints % 7).maximum(ints2) ^ (ints & 12),
  "int32_float_casts": lambda: (ints.float() * 0.75).cast(dtypes.int32) + (x * 100).cast(dtypes.int32).sum(),
  "bool_lanes": lambda: (((ints > 3) & (ints2 < 20)) | (ints == ints2)).where(ints, ints2),
  "where_nan_max": lambda: (x > 0).where(x / (y - y), y).maximum(x) + (x - x).maximum(y.sqrt()),
  "reductions": lambda: x.sum(-1) + x.max(-1) + (ints * ints2).sum(0).float().mean(),
  "conv_weight_gradient": lambda: _conv_weight_gradient(),
  "uint8_nibbles_matvec": lambda: _nibble_matvec(),
  "int8_matvec": lambda: (q8.cast(dtypes.float32) * q8_scale * vec).sum(-1),
  "uint8_wrapping_lanes": lambda: ((nibbles * 7 + 200) ^ (nibbles << 3)).cast(dtypes.int32).reshape(24, 32) + \
    (q8[:, :32] - 100).float(),
}

# quantized weights as the LLM keeps them: bytes of two 4-bit fields (Q4_1) and signed bytes with a scale (Q8_0)
nibbles = Tensor(RNG.integers(0, 256, (24, 2, 16), dtype=np.uint8)).realize()
q8 = Tensor(RNG.integers(-128, 128, (24, 64), dtype=np.int8)).realize()
q8_scale, vec = _data(24, 1), _data(64)
vec2 = _data(2, 16)

def _nibble_matvec() -> Tensor:
  """Q4_1's dot: each byte's two nibbles (a shift by an arange: not a constant in the kernel) times a vector."""
  shifts = (Tensor.arange(2, dtype=dtypes.uint8) * 4).reshape(2, 1)
  q = ((nibbles.unsqueeze(1) >> shifts.reshape(1, 2, 1, 1)) & 15).cast(dtypes.float32)   # (24, 2, 2, 16)
  return (q[:, :, 0] * vec2 * 0.5 + 0.25).sum((1, 2))

conv_x, conv_w, conv_g = (RNG.standard_normal(s, dtype=np.float32) for s in ((2, 8, 18, 18), (8, 8, 3, 3), (2, 8, 16, 16)))

def _conv_weight_gradient() -> Tensor:
  """An unpadded conv's weight gradient: 8 lanes along a row, under 8 output channels times the 3 shifted columns of
  a window (loads of overlapping runs of one row)."""
  xg, wg = Tensor(conv_x, requires_grad=True), Tensor(conv_w, requires_grad=True)
  (xg.conv2d(wg) * Tensor(conv_g)).sum().backward()
  return wg.grad

@pytest.mark.parametrize("name", list(CASES))
def test_vector_code_gives_the_scalar_bits(name):
  _assert_same_bits(CASES[name])

def test_kernel_reading_its_own_output_assign():
  def build():
    target = Tensor(np.arange(48, dtype=np.float32).reshape(6, 8)).realize()
    target.assign(target * 2.0 + target[:, ::-1])
    return target.realize()
  _assert_same_bits(build)

def test_kblock_accumulates_through_the_output():
  a_np, b_np = RNG.standard_normal((8, 32), dtype=np.float32), RNG.standard_normal((32, 16), dtype=np.float32)
  item = last_kernel_item(Tensor(a_np) @ Tensor(b_np))
  kernel = Kernel(lower_kernel(item.ast))
  for opt in (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.KBLOCK, 2, 8)): kernel.apply(opt)
  got = {}
  for vectorized in (0, 1):
    with Context(VECTORIZE=vectorized): got[vectorized] = run_lowered(item, kernel.sink, f"kblock_vec{vectorized}")
  assert got[0].tobytes() == got[1].tobytes()
  np.testing.assert_allclose(got[1].reshape(8, 16), a_np @ b_np, rtol=1e-4, atol=1e-4)
  source, uops = render_lowered("CPU", "kblock_vec", kernel.sink)
  assert any(u.op is Ops.DEFINE_ACC and u.dtype.count == 8 for u in uops), "the tile's accumulators are not vectors"

def test_matmul_tile_renders_vector_code():
  item = last_kernel_item(_data(256, 32) @ _data(32, 64) + _data(64))   # enough row tiles for a thread split
  with Context(VECTORIZE=1): source, uops = render_lowered("CPU", "tile", optimize_kernel(lower_kernel(item.ast)))
  assert "__attribute__((vector_size(" in source and "kiln_floatx" in source
  vector_accs = [u for u in uops if u.op is Ops.DEFINE_ACC and u.dtype.count > 1]
  vector_stores = [u for u in uops if u.op is Ops.STORE and u.src[2].dtype.count > 1]
  assert vector_accs and vector_stores, "the register tile was not vectorized"
  assert any(u.op is Ops.LOAD and u.dtype.count > 1 for u in uops)
  flops = 2 * 256 * 64 * 32 + 256 * 64   # multiply-adds and the bias; the rest is index math
  assert flops <= realize.count_ops(uops) <= realize.count_ops(_scalar_uops(item)), "count_ops must count every lane"
  with Context(VECTORIZE=0): scalar_source, _ = render_lowered("CPU", "tile", optimize_kernel(lower_kernel(item.ast)))
  assert "vector_size" not in scalar_source

def test_tile_of_shifted_rows_gets_vector_accumulators():
  # 8 channels x 3 window columns x 8 lanes: every accumulator bundle is 8 wide (the first 16 span two runs), and
  # the 3 shifted runs of the input row overlap, each one vector load
  item = last_kernel_item(_conv_weight_gradient())
  with Context(VECTORIZE=1): _, uops = render_lowered("CPU", "wgrad", optimize_kernel(lower_kernel(item.ast)))
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert accs and all(u.dtype.count == 8 for u in accs), sorted({u.dtype.count for u in accs})
  assert sum(u.op is Ops.LOAD and u.dtype.count == 8 for u in uops) >= 3 + 8

def _scalar_uops(item) -> list[UOp]:
  with Context(VECTORIZE=0): return render_lowered("CPU", "tile", optimize_kernel(lower_kernel(item.ast)))[1]

def test_loads_stay_behind_stores_to_their_buffer():
  out, a = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)
  idx = [UOp.const(dtypes.int32, k) for k in range(4)]
  uops = [out, a, *idx]
  for k in range(4):   # out[k] = out[k] * a[k], lane by lane: a store to `out` between the loads of `out`
    load_out, load_a = UOp(Ops.LOAD, dtypes.float32, (out, idx[k])), UOp(Ops.LOAD, dtypes.float32, (a, idx[k]))
    product = load_out * load_a
    uops += [load_out, load_a, product, UOp(Ops.STORE, dtypes.void, (out, idx[k], product))]
  result = vectorize(uops)
  assert not any(u.op is Ops.LOAD and u.src[0] is out and u.dtype.count > 1 for u in result)
  assert not any(u.op is Ops.STORE and u.src[2].dtype.count > 1 for u in result)

def test_unsupported_lanes_stay_scalar():
  halves = Tensor(RNG.standard_normal((4, 32)).astype(np.float16)).realize()
  doubles = Tensor(RNG.standard_normal((4, 32))).realize()
  _assert_same_bits(lambda: halves * 2 + 1)
  _assert_same_bits(lambda: (doubles * 3).exp())
  item = last_kernel_item(doubles * 3 + 1)
  _, uops = render_lowered("CPU", "f64", optimize_kernel(lower_kernel(item.ast)))
  assert all(u.dtype.count == 1 for u in uops)

def test_byte_lanes_load_and_widen_as_vectors():
  item = last_kernel_item((q8.cast(dtypes.float32) * q8_scale * vec).sum(-1))
  source, uops = render_lowered("CPU", "bytes", optimize_kernel(lower_kernel(item.ast)))
  assert any(u.op is Ops.LOAD and u.dtype.scalar == dtypes.int8 and u.dtype.count > 1 for u in uops)
  # widened to int32 lanes by one helper (gcc 12 converts bytes one lane at a time, or with a dozen shuffles)
  assert "kiln_widen_kiln_charx" in source and "kiln_intx" in source

@pytest.mark.parametrize("cflags", ["", "-march=x86-64-v3", "-march=x86-64-v2", "-march=x86-64"])
def test_byte_widening_gives_the_same_bits_on_every_target(cflags):
  with Context(CFLAGS=cflags, CACHELEVEL=0):
    for name in ("uint8_nibbles_matvec", "int8_matvec", "uint8_wrapping_lanes"): _assert_same_bits(CASES[name])

@pytest.mark.parametrize("max_lanes", [4, 8, 16])
def test_vectors_are_at_most_one_register_wide(max_lanes):
  item = last_kernel_item(h @ w)
  uops = optimize_kernel(lower_kernel(item.ast))
  from kiln.codegen.linearizer import linearize
  vector_uops = vectorize(linearize(uops), max_lanes=max_lanes)
  widths = {u.dtype.count for u in vector_uops if u.dtype.count > 1}
  assert widths and max(widths) == max_lanes, widths

def test_vector_dtype_identity_and_pickle():
  import pickle
  v = dtypes.float32.vec(8)
  assert v is dtypes.float32.vec(8) and v.scalar is dtypes.float32 and v.count == 8 and v.itemsize == 32
  assert pickle.loads(pickle.dumps(v)) is v and pickle.loads(pickle.dumps(dtypes.int32)) is dtypes.int32
  assert dtypes.int32.vec(1) is dtypes.int32 and dtypes.int32.count == 1 and dtypes.int32.scalar is dtypes.int32
  with pytest.raises(TypeError): v.vec(2)
  with pytest.raises(ValueError): dtypes.float32.vec(0)

@pytest.mark.skipif(__import__("shutil").which("gcc") is None, reason="gcc is not installed")
def test_gcc_accepts_the_vector_code():
  """gcc is the fallback C compiler: the same vector source must compile there and give the same bits."""
  build = lambda: (h @ w + b).exp() + ((ints > 3) & (ints2 < 20)).where(ints, ints2 // 3).float().sum()   # noqa: E731
  with Context(CC="gcc", CACHELEVEL=0): _assert_same_bits(build)

# ---- split reductions (kiln/codegen/parallel.py): vector accumulators, one partial per lane and chunk ----
# shapes used only here: these kernels are split from a few hundred uops of work on, and a kernel with the default
# chunk work must not be served their source from the codegen cache
SPLIT_FLOATS = RNG.standard_normal(24008).astype(np.float32)
SPLIT_ROWS = RNG.standard_normal((3, 8016)).astype(np.float32)
SPLIT_INTS = RNG.integers(-1000, 1000, 24016).astype(np.int32)
SPLIT_CASES = {
  "sum": (lambda: Tensor(SPLIT_FLOATS).sum(), lambda: SPLIT_FLOATS.astype(np.float64).sum()),
  "max_with_nan": (lambda: Tensor(np.where(np.arange(24008) == 777, np.nan, SPLIT_FLOATS).astype(np.float32)).max(),
                   lambda: np.float32(np.nan)),
  "sum_of_exp": (lambda: (Tensor(SPLIT_FLOATS) * 0.5).exp().sum(), lambda: np.exp(SPLIT_FLOATS * 0.5).sum()),
  "few_row_sums": (lambda: Tensor(SPLIT_ROWS).sum(axis=1), lambda: SPLIT_ROWS.astype(np.float64).sum(axis=1)),
  "int_sum": (lambda: Tensor(SPLIT_INTS).sum(), lambda: SPLIT_INTS.sum(dtype=np.int32)),
}

@pytest.fixture
def small_split_chunks(monkeypatch):
  """Split reductions from a few hundred uops on, every launch on the pool (however small)."""
  monkeypatch.setattr(parallel, "REDUCE_CHUNK_WORK", 256)
  monkeypatch.setattr(ops_cpu, "MIN_WORK_PER_THREAD", 1)

@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_reduction_vector_accumulators_give_the_same_bits(name, small_split_chunks):
  """The same bits for 1, 2 and 3 threads and for scalar and vector accumulators: the chunk count is fixed, and a
  vector accumulator's lanes are the scalar accumulators, combined lane by lane in chunk order."""
  build, reference = SPLIT_CASES[name]
  item = last_kernel_item(build())
  with Context(VECTORIZE=1): _, uops = render_lowered("CPU", "split", optimize_kernel(lower_kernel(item.ast)))
  reduction = thread_plan(uops).reduction
  assert reduction is not None and reduction.chunks > 1, "not a split reduction"
  assert any(acc.dtype.count > 1 for acc, _ in reduction.accumulators), "the split reduction's accumulators are scalar"
  results = {}
  for vectorized in (0, 1):
    for threads in (1, 2, 3):
      with Context(VECTORIZE=vectorized, THREADS=threads): results[(vectorized, threads)] = build().numpy()
  expected = results[(0, 1)]
  for key, got in results.items(): assert got.tobytes() == expected.tobytes(), f"{name} (VECTORIZE, THREADS)={key}"
  np.testing.assert_allclose(expected, reference(), rtol=2e-5, atol=1e-4)

def test_runner_and_codegen_caches_key_on_vectorize():
  """`Context(VECTORIZE=0)` in a process that already ran the vector kernel gets the scalar one."""
  t = _data(64, 40)
  item = last_kernel_item(t * 3.0 + 1.0)
  sources = {}
  for vectorized in (1, 0, 1):
    with Context(VECTORIZE=vectorized):
      runner = realize.get_runner("CPU", item.ast)
      sources.setdefault(vectorized, runner.source)
      assert runner.source == sources[vectorized]
      key = codegen_cache._key("CPU", item.ast)
      sources.setdefault(("codegen", vectorized), key)
  assert "vector_size" in sources[1] and "vector_size" not in sources[0]
  assert sources[("codegen", 0)] != sources[("codegen", 1)]

def test_short_output_rows_vectorize_along_the_contiguous_operand():
  # a 1x1 conv's input gradient over 7 columns: 8 and 4 do not divide the output's contiguous axis, so the tile's
  # vectors run along the input channels, where the weight is contiguous (16 lanes a multiply-add, not 4 + 3
  # scalars), and each accumulator's lanes are stored apart after the loop
  rng = np.random.default_rng(3)
  g_np, w_np = rng.standard_normal((2, 256, 7, 7)).astype(np.float32), rng.standard_normal((256, 64)).astype(np.float32)
  g, w = Tensor(g_np).realize(), Tensor(w_np.reshape(256, 64, 1, 1)).realize()
  x = Tensor.zeros(2, 64, 7, 7).contiguous().realize().requires_grad_()
  (x.conv2d(w) * g).sum().backward()
  item = last_kernel_item(x.grad)
  kernel = optimize_kernel(lower_kernel(item.ast))
  with Context(VECTORIZE=1): _, uops = render_lowered("CPU", "xgrad", kernel)
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert accs and min(u.dtype.count for u in accs) >= 8, sorted({u.dtype.count for u in accs})
  got = {}
  for vectorized in (0, 1):
    with Context(VECTORIZE=vectorized): got[vectorized] = run_lowered(item, kernel, f"xgrad{vectorized}")
  assert got[0].tobytes() == got[1].tobytes()
  want = np.einsum("nohw,oc->nchw", g_np, w_np)
  np.testing.assert_allclose(got[1].reshape(want.shape), want, rtol=1e-4, atol=1e-3)
