"""The LLVM device's fast path (kiln/renderer/llvmir.py, kiln/runtime/ops_llvm.py): vector uops rendered as LLVM
vectors, the C path's thread plans (split outer loops, split reductions) run on the shared thread pool, and gated rows
as masked loads. LLVM and the C path (device CPU) compute the same uops in the same order with no fast-math or FMA
contraction, so their results must agree bit for bit, on one thread and on two; both are also checked against NumPy
in float64."""
import numpy as np
import pytest

pytest.importorskip("llvmlite")

from kiln import Tensor, dtypes   # noqa: E402
from kiln.engine import realize   # noqa: E402
from kiln.helpers import Context   # noqa: E402

def _launches(fn) -> list:
  """The CompiledRunners that realizing `fn()` launches."""
  runners, original = [], realize.CompiledRunner.__call__
  def record(self, bufs, var_vals=None, wait=False):
    runners.append(self)
    return original(self, bufs, var_vals, wait)
  realize.CompiledRunner.__call__ = record
  try: fn().realize()
  finally: realize.CompiledRunner.__call__ = original
  return runners

def _softmax(a: np.ndarray) -> np.ndarray:
  e = np.exp(a - a.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

RNG = np.random.default_rng(7)
A = RNG.standard_normal((67, 129), dtype=np.float32)
B = RNG.standard_normal((129, 45), dtype=np.float32)
SQUARE = RNG.standard_normal((256, 256), dtype=np.float32)
LONG = RNG.standard_normal(1 << 20, dtype=np.float32)
ROWS = RNG.standard_normal((4, 1 << 18), dtype=np.float32)
IMAGE = RNG.standard_normal((2, 8, 19, 21), dtype=np.float32)
WEIGHT = RNG.standard_normal((16, 8, 3, 3), dtype=np.float32)
INTS = RNG.integers(-1000, 1000, (64, 300)).astype(np.int32)
NIBBLES = RNG.integers(0, 256, (96, 18, 16), dtype=np.uint8)
Q8 = RNG.integers(-128, 128, (96, 576), dtype=np.int8)
VEC = RNG.standard_normal(576, dtype=np.float32)

def _q4_matvec(packed: Tensor, x: Tensor) -> Tensor:
  """A Q4-style matrix-vector product: the two nibbles of each byte (shifts from an arange) times a vector."""
  shifts = (Tensor.arange(2, device=packed.device, dtype=dtypes.uint8) * 4).reshape(1, 1, 2, 1)
  q = ((packed.unsqueeze(2) >> shifts) & 15).cast(dtypes.float32)
  return (q * x.reshape(1, 18, 2, 16) * 0.25 + 0.5).sum((1, 2, 3))

def _q4_reference(packed: np.ndarray, x: np.ndarray) -> np.ndarray:
  q = np.stack([packed & 15, packed >> 4], 2).astype(np.float64)
  return (q * x.reshape(1, 18, 2, 16) * 0.25 + 0.5).sum((1, 2, 3))

# name -> (kiln function of tensors on one device, the inputs, a float64 NumPy reference)
WORKLOADS = {
  "matmul odd shapes": (lambda a, b: a @ b, (A, B), lambda a, b: a.astype(np.float64) @ b),
  "matmul 256": (lambda a: a @ a, (SQUARE,), lambda a: a.astype(np.float64) @ a),
  "sum of 2**20 (split reduction)": (lambda x: x.sum(), (LONG,), lambda x: x.astype(np.float64).sum()),
  "max of 2**20": (lambda x: x.max(), (LONG,), lambda x: x.max()),
  "row sums, 4 x 2**18 (outer loop)": (lambda x: x.sum(axis=1), (ROWS,), lambda x: x.astype(np.float64).sum(1)),
  "softmax rows": (lambda a: a.softmax(-1), (SQUARE,), lambda a: _softmax(a.astype(np.float64))),
  "padded conv2d (gated rows)": (lambda x, w: x.conv2d(w, padding=1), (IMAGE, WEIGHT), None),
  "elementwise casts and compares": (lambda a: ((a * 3).cast(dtypes.int32) // 2 + (a > 0).cast(dtypes.int32))
                                     .cast(dtypes.float32) * a.exp(), (SQUARE,), None),
  "int32 sum and shifts": (lambda i: ((i << 3) ^ (i >> 2)).sum(axis=0) + i.max(axis=0), (INTS,),
                           lambda i: ((i << 3) ^ (i >> 2)).sum(axis=0) + i.max(axis=0)),
  "Q4 nibble matvec (byte lanes)": (_q4_matvec, (NIBBLES, VEC), _q4_reference),
  "Q8 matvec (signed byte lanes)": (lambda q, x: (q.cast(dtypes.float32) * x).sum(-1), (Q8, VEC),
                                    lambda q, x: q.astype(np.float64) @ x),
}

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_llvm_matches_the_c_path_bit_for_bit(name, threads):
  fn, arrays, reference = WORKLOADS[name]
  with Context(THREADS=threads):
    outs = {dev: fn(*[Tensor(a, device=dev) for a in arrays]).numpy() for dev in ("CPU", "LLVM")}
  got, want = outs["LLVM"], outs["CPU"]
  assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{name}: LLVM {got.dtype} {got.shape}, CPU {want.dtype}"
  differ = np.flatnonzero((got != want) & ~(np.isnan(got) & np.isnan(want)))
  assert differ.size == 0, (f"{name}, THREADS={threads}: {differ.size} of {got.size} elements differ from CPU, first "
                            f"at {differ[0]}: LLVM {got.flat[differ[0]]!r}, CPU {want.flat[differ[0]]!r}")
  if reference is not None:
    expected = np.asarray(reference(*arrays))
    if got.dtype.kind in "iu": np.testing.assert_array_equal(got, expected, err_msg=name)
    else: np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(expected).max())),
                                     err_msg=name)

def test_upcast_lanes_render_as_llvm_vectors():
  a = Tensor(SQUARE, device="LLVM")
  sources = [r.source for r in _launches(lambda: a @ a + 1)]
  assert any("x float>" in src for src in sources), "no LLVM vector type in the matmul's kernels"

def test_split_reduction_and_split_loop_run_on_the_pool():
  with Context(THREADS=2):
    x = Tensor(LONG, device="LLVM")
    reduction = [r for r in _launches(lambda: x.sum()) if r.program.chunks]
    assert reduction, "the sum of 2**20 floats has no split reduction on LLVM"
    program = reduction[0].program
    assert program.task is not None and program.scratch_bytes > 16 and program.threads() == 2
    a = Tensor(SQUARE, device="LLVM")
    split = [r.program for r in _launches(lambda: a * 2 + 1)]
    assert any(p.task is not None and p.work > 0 and not p.chunks for p in split), "no split outer loop on LLVM"

def test_padded_window_rows_are_masked_loads(monkeypatch):
  from kiln.mixin import conv
  monkeypatch.setattr(conv, "PAD_COPY_MIN_ELEMENTS", 1 << 30)   # the conv reads through the pad view, not a copy
  x, w = Tensor(IMAGE, device="LLVM"), Tensor(WEIGHT, device="LLVM")
  sources = [r.source for r in _launches(lambda: x.conv2d(w, padding=1))]
  assert any("@llvm.masked.load.v" in src for src in sources), "the padded conv's gated rows are not masked loads"

def test_masked_row_never_reads_outside_the_buffer():
  """A padded row whose gated-off lanes point before the buffer's start: a masked load must not touch them."""
  small = RNG.standard_normal((1, 1, 1, 16), dtype=np.float32)
  got = Tensor(small, device="LLVM").pad((8, 8, 0, 0)).numpy()
  np.testing.assert_array_equal(got, np.pad(small, ((0, 0), (0, 0), (0, 0), (8, 8))))

# ---- the thread pool built by LLVM (kiln/runtime/ops_llvm.py POOL_IR), for machines without a C compiler ----

def test_llvm_built_pool_runs_every_chunk_once():
  import ctypes
  from kiln.runtime import threadpool
  from kiln.runtime.ops_llvm import llvm_pool_library
  library = llvm_pool_library()
  handle = library.kiln_pool_create(3, threadpool.SPIN_NS)
  assert handle and library.kiln_pool_size(handle) == 3
  counts = np.zeros(64, np.int64)
  seen_chunks = []
  @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
  def task(bufs, vals, chunk, nchunks):   # a Python task: the pool calls it from its worker threads too
    counts[chunk] += 1
    seen_chunks.append(nchunks)
  try:
    for nchunks in (1, 2, 7, 64):
      counts[:] = 0
      library.kiln_pool_run(handle, ctypes.cast(task, ctypes.c_void_p), None, None, nchunks)
      assert counts[:nchunks].tolist() == [1] * nchunks and not counts[nchunks:].any(), f"{nchunks} chunks: {counts}"
  finally: library.kiln_pool_destroy(handle)
  assert set(seen_chunks) == {1, 2, 7, 64}

def test_kernels_run_on_the_llvm_built_pool_without_a_c_compiler(monkeypatch):
  """With no C pool library (no C compiler), threads come from the LLVM-built pool, with the same results."""
  from kiln.runtime import threadpool
  from kiln.runtime.ops_llvm import LLVMPoolLibrary
  def no_compiler(): raise RuntimeError("thread pool: could not build its C library (test: no C compiler)")
  monkeypatch.setattr(threadpool._library_build, "get", no_compiler)
  monkeypatch.setattr(threadpool, "_pools", {})
  try:
    for name in ("sum of 2**20 (split reduction)", "matmul 256", "softmax rows"):
      fn, arrays, _ = WORKLOADS[name]
      with Context(THREADS=1): want = fn(*[Tensor(a, device="LLVM") for a in arrays]).numpy()
      with Context(THREADS=2): got = fn(*[Tensor(a, device="LLVM") for a in arrays]).numpy()
      np.testing.assert_array_equal(got, want, err_msg=f"{name} on the LLVM-built pool")
    assert 2 in threadpool._pools, "no launch ran on a pool of 2 threads"
    assert isinstance(threadpool._pools[2].lib, LLVMPoolLibrary)
  finally:
    for pool in threadpool._pools.values(): pool.close()

def test_long_loops_are_kept_from_llvm_unrolling_short_ones_are_not():
  from kiln.renderer.llvmir import FULL_UNROLL_MAX_TRIPS
  x = Tensor(LONG, device="LLVM")
  long_loops = [r.source for r in _launches(lambda: x.sum())]
  assert any("llvm.loop.unroll.disable" in src for src in long_loops), "a 2**20 sum's loops may be unrolled by LLVM"
  rows = Tensor(RNG.standard_normal((4, FULL_UNROLL_MAX_TRIPS), dtype=np.float32), device="LLVM")
  with Context(NOOPT=1): (source,) = [r.source for r in _launches(lambda: rows.sum(axis=1))]
  lines = source.splitlines()
  back_edges = [line for before, line in zip(lines, lines[1:]) if "_i_next = add" in before]   # a loop's latch
  assert len(back_edges) == 2 and sum("!llvm.loop" not in line for line in back_edges) == 1, back_edges

@pytest.mark.parametrize("rows, cols, kept", [(4, 64, 2), (2, 8, 0), (4, 8, 1)])
def test_a_nest_of_short_loops_is_unrolled_whole_only_up_to_the_copies_allowed(rows, cols, kept):
  # 2 x rows x cols summed along the columns, no optimizer: the outermost loop is the threads' (a loop of its own),
  # around a row loop around a column loop. A column loop of 64 stays a loop, so the row loop around it does too;
  # 2 rows of 8 columns make 16 copies of the body (allowed), 4 rows of 8 make 32 (the row loop stays one)
  from kiln.renderer.llvmir import FULL_UNROLL_MAX_TRIPS
  assert FULL_UNROLL_MAX_TRIPS == 16
  data = RNG.standard_normal((rows, 2, cols), dtype=np.float32)
  x = Tensor(data, device="LLVM").permute(1, 0, 2)   # (rows and the 2 do not merge into one loop)
  with Context(NOOPT=1): (launch,) = _launches(lambda: x.sum(axis=2))
  lines = launch.source.splitlines()
  back_edges = [line for before, line in zip(lines, lines[1:]) if "_i_next = add" in before]   # a loop's latch
  assert len(back_edges) == 3 and sum("llvm.loop" in line for line in back_edges[:2]) == kept, back_edges
  with Context(NOOPT=1): got = x.sum(axis=2).numpy()
  np.testing.assert_allclose(got, data.transpose(1, 0, 2).sum(axis=2), rtol=1e-5, atol=1e-5)

def test_math_forms_without_software_math_match_the_c_path():
  """TRANSCENDENTAL=0: kiln's exp, cos and tan forms are libm's exp, cos and tan of the argument on both paths (not
  exp2 of a rounded product, nor sin of a rounded pi/2 - y), so the bits agree."""
  x = np.linspace(-30, 30, 513)
  with Context(TRANSCENDENTAL=0):
    for fn in (Tensor.exp, Tensor.cos, Tensor.tan):
      got, want = (fn(Tensor(x, device=dev)).numpy() for dev in ("LLVM", "CPU"))
      np.testing.assert_array_equal(got, want, err_msg=fn.__name__)
      sources = [r.source for r in _launches(lambda: fn(Tensor(x, device="LLVM")))]
      assert any(f"@llvm.{fn.__name__}.f64(" in src for src in sources), f"{fn.__name__}: no libm {fn.__name__}"
