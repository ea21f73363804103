"""Tensor-core IR ops (docs/ir.md stage 4: WMMA, LDMATRIX, CP_ASYNC) end to end, on hand-built one-warp kernels.

For every TensorCore of kiln/runtime/gpu_target.py: each lane loads its fragments from global buffers at the
elements its layout names (a table of indices per lane), runs WMMA and stores D at its c_layout elements. The
kernels run on the PYTHON device (kiln/renderer/python.py, the block's threads in lockstep) and in the tests' NumPy
lockstep emulator (test/runtime/gpu_lockstep.py), against NumPy: small integers exactly, random values within one
float32 rounding of the exact result. Two WMMAs chained and a K loop accumulate. The CUDA C and PTX renderings
build for sm_90a with nvcc/ptxas where installed (mma.sync in the PTX, no spills), and with a GPU the same kernels
run on the CUDA device against NumPy (the hardware's sums truncate: within `hardware_tolerance`).
"""
from __future__ import annotations
import shutil, subprocess
import numpy as np
import pytest
from kiln.dtype import dtypes, fp8_to_float32, FP8_VALUES
from kiln.runtime.gpu_target import TENSOR_CORES, MMA_F16, MMA_BF16, MMA_TF32, TensorCore
from kiln.renderer import kernel_signature
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.renderer.python import PythonRenderer
from kiln.runtime.ops_python import PythonProgram
from kiln.uop.ops import UOp, Ops
from kiln.uop.spec import SpecError, check_linear, check_lowered
from gpu_lockstep import LockstepError, run_lockstep   # noqa: E402  (test/runtime is on sys.path)

INT, F32 = dtypes.int32, dtypes.float32

# ---------------- NumPy views of each input dtype ----------------

def storage(values: np.ndarray, dtype) -> np.ndarray:
  """float64 `values` (representable in `dtype`) as the storage a kernel buffer of `dtype` holds."""
  if dtype == dtypes.float16: return values.astype(np.float16)
  if dtype == dtypes.bfloat16: return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
  if dtype in dtypes.fp8s:
    table = np.array(FP8_VALUES[dtype])
    codes = np.array([int(np.flatnonzero(table == v)[0]) for v in values.ravel()], np.uint8)
    return codes.reshape(values.shape)
  return values.astype(np.float32)

def as_values(data: np.ndarray, dtype) -> np.ndarray:
  """What the tensor cores compute with for `data` of `dtype` (float64): tf32 keeps float32's top 19 bits."""
  if dtype == dtypes.bfloat16: return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
  if dtype in dtypes.fp8s: return fp8_to_float32(data, dtype).astype(np.float64)
  if dtype == dtypes.float32: return (data.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
  return data.astype(np.float64)

def small_integers(rng, shape, dtype) -> np.ndarray:
  return rng.integers(-4, 5, shape).astype(np.float64)

def random_values(rng, shape, dtype) -> np.ndarray:
  """Random values of `dtype` (float32 ones with all their mantissa bits, so tf32's truncation shows)."""
  x = rng.uniform(-2, 2, shape)
  if dtype == dtypes.float16: return x.astype(np.float16).astype(np.float64)
  if dtype == dtypes.bfloat16: return as_values(storage(x, dtype), dtype)
  if dtype in dtypes.fp8s:
    table = np.array(FP8_VALUES[dtype])
    finite = table[np.isfinite(table) & (np.abs(table) <= 4)]
    return rng.choice(finite, shape)
  return x.astype(np.float32).astype(np.float64)

# ---------------- the kernels ----------------

class Kernel:
  """A hand-built linear kernel of one block of `threads` lanes, uops appended in order."""
  def __init__(self, threads: int = 32):
    self.uops: list[UOp] = []
    self.lane = self.add(UOp(Ops.SPECIAL, INT, (), ("lidx0", threads)))

  def add(self, u: UOp) -> UOp:
    for s in u.src:
      if s not in self.uops and s.op in (Ops.CONST, Ops.DEFINE_GLOBAL): self.uops.append(s)
    if u not in self.uops: self.uops.append(u)
    return u

  def const(self, value, dtype=INT) -> UOp: return self.add(UOp.const(dtype, value))

  def alu(self, op: Ops, a: UOp, b: UOp) -> UOp: return self.add(UOp(op, a.dtype, (a, b)))

  def load(self, buf: UOp, index: UOp) -> UOp: return self.add(UOp(Ops.LOAD, buf.dtype, (buf, index)))

  def lane_index(self, table: UOp, count: int, i: int, offset: UOp | None = None) -> UOp:
    """Element `i` of this lane's row of an index table (count a lane), plus `offset`."""
    at = self.alu(Ops.ADD, self.alu(Ops.MUL, self.lane, self.const(count)), self.const(i))
    index = self.load(table, at)
    return index if offset is None else self.alu(Ops.ADD, index, offset)

  def fragment(self, buf: UOp, table: UOp, count: int, offset: UOp | None = None, limit: UOp | None = None) -> UOp:
    """VECTORIZE of this lane's `count` elements of `buf` at its table row (with `limit`, each load gated by its
    index being below it: zero past it)."""
    lanes = []
    for i in range(count):
      at = self.lane_index(table, count, i, offset)
      if limit is None: lanes.append(self.load(buf, at))
      else:
        below = self.add(UOp(Ops.CMPLT, dtypes.bool, (at, limit)))
        lanes.append(self.add(UOp(Ops.LOAD, buf.dtype, (buf, at, below))))
    return self.add(UOp(Ops.VECTORIZE, buf.dtype.vec(count), tuple(lanes)))

  def store_lanes(self, out: UOp, table: UOp, value: UOp) -> None:
    for i in range(value.dtype.count):
      self.add(UOp(Ops.STORE, dtypes.void, (out, self.lane_index(table, value.dtype.count, i),
                                           self.add(UOp(Ops.GEP, value.dtype.scalar, (value,), i)))))

def index_tables(tc: TensorCore, k_total: int, chains: int = 1) -> dict[str, np.ndarray]:
  """Per-lane element indices: A is m x k_total, B k_total x n (row-major; chain j's k block at j*k), C and D m x n."""
  m, n, _ = tc.dims
  return {"a": np.array([r * k_total + c for lane in tc.a_layout for r, c in lane], np.int32),
          "b": np.array([r * n + c for lane in tc.b_layout for r, c in lane], np.int32),
          "c": np.array([r * n + c for lane in tc.c_layout for r, c in lane], np.int32)}

def wmma_kernel(tc: TensorCore, chains: int = 1, loop: int = 0, rows: int | None = None,
                zero_c: bool = False) -> tuple[list[UOp], int]:
  """D = sum_j A_j @ B_j + C for one warp: `chains` WMMAs in a row (each the next's C), or a K loop of `loop`
  steps over one accumulator. Buffers: 0 D (m x n float32), 1 A, 2 B, 3 C, 4-6 the index tables of A, B, C/D.
  With `rows`, A's loads are gated to its first `rows` rows (the rest read as zero: a ragged edge). Returns (uops,
  K). With `zero_c`, C is a vector constant 0 (the accumulator starts at zero) and buffer 3 is not read."""
  m, n, k = tc.dims
  steps = loop or chains
  K = k * steps
  kern = Kernel()
  d, a_buf, b_buf, c_buf = (UOp(Ops.DEFINE_GLOBAL, dt, (), i) for i, dt in
                            enumerate((F32, tc.dtype_in, tc.dtype_in, F32)))
  ta, tb, tcd = (UOp(Ops.DEFINE_GLOBAL, INT, (), i) for i in (4, 5, 6))
  na, nb, nc = len(tc.a_layout[0]), len(tc.b_layout[0]), len(tc.c_layout[0])
  c = kern.add(UOp.const(F32.vec(nc), 0.0)) if zero_c else kern.fragment(c_buf, tcd, nc)
  if zero_c:   # D's indices before any loop (a value the loop body makes is out of scope after it in C)
    for i in range(nc): kern.lane_index(tcd, nc, i)
  limit = None if rows is None else kern.const(rows * K)   # A's element i is in row i // K
  if loop:
    acc = kern.add(UOp(Ops.DEFINE_ACC, c.dtype, (c,), (0,)))
    step = kern.add(UOp(Ops.RANGE, INT, (kern.const(loop),), 0))
    a = kern.fragment(a_buf, ta, na, kern.alu(Ops.MUL, step, kern.const(k)), limit)
    b = kern.fragment(b_buf, tb, nb, kern.alu(Ops.MUL, step, kern.const(k * n)))
    kern.add(UOp(Ops.ASSIGN, acc.dtype, (acc, kern.add(UOp(Ops.WMMA, acc.dtype, (a, b, acc), tc)))))
    kern.add(UOp(Ops.ENDRANGE, dtypes.void, (step,)))
    kern.store_lanes(d, tcd, acc)
  else:
    for j in range(chains):
      a = kern.fragment(a_buf, ta, na, kern.const(j * k) if j else None, limit)
      b = kern.fragment(b_buf, tb, nb, kern.const(j * k * n) if j else None)
      c = kern.add(UOp(Ops.WMMA, tc.dtype_out.vec(nc), (a, b, c), tc))
    kern.store_lanes(d, tcd, c)
  return kern.uops, K

def wmma_buffers(tc: TensorCore, K: int, make) -> tuple[dict[int, np.ndarray], np.ndarray]:
  """(buffers, float64 reference D = A @ B + C) for `wmma_kernel` with inputs from `make(rng, shape, dtype)`."""
  m, n, _ = tc.dims
  rng = np.random.default_rng(K + tc.dims[2])
  a, b = storage(make(rng, (m, K), tc.dtype_in), tc.dtype_in), storage(make(rng, (K, n), tc.dtype_in), tc.dtype_in)
  c = make(rng, (m, n), F32).astype(np.float32)
  tables = index_tables(tc, K)
  bufs = {0: np.full(m * n, np.nan, np.float32), 1: a.ravel(), 2: b.ravel(), 3: c.ravel(),
          4: tables["a"], 5: tables["b"], 6: tables["c"]}
  reference = as_values(a, tc.dtype_in) @ as_values(b, tc.dtype_in) + c.astype(np.float64)
  return bufs, reference

def run_python(uops: list[UOp], bufs: dict[int, np.ndarray]) -> np.ndarray:
  """The kernel on the PYTHON device's emulator (rendered by PythonRenderer, run as PythonProgram): output 0."""
  src = PythonRenderer().render("tc_kernel", uops)
  arrays = {k: v.copy() for k, v in bufs.items()}
  params = [b.arg for b in kernel_signature(uops)[0]]   # (a buffer the kernel never reads is no parameter)
  PythonProgram("tc_kernel", src.encode())(*[arrays[k].view(np.uint8) for k in params])
  return arrays[0]

def run_numpy_lockstep(uops: list[UOp], bufs: dict[int, np.ndarray], threads: int = 32) -> np.ndarray:
  arrays = {k: v.copy() for k, v in bufs.items()}
  run_lockstep(uops, ((1, 1, 1), (threads, 1, 1)), arrays)
  return arrays[0]

def rounding_bound(reference: np.ndarray) -> np.ndarray:
  """One float32 rounding of the exact result (the emulators round each element's exact sum once)."""
  return np.abs(reference) * 2.0 ** -24 + 1e-30

NAMES = {tc.instruction.split(".")[3] + "." + tc.instruction.split(".")[7]: tc for tc in TENSOR_CORES}

@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("shape", ["one", "chained", "loop"])
def test_wmma_emulators_match_numpy(name, shape):
  tc = NAMES[name]
  uops, K = wmma_kernel(tc, chains=2 if shape == "chained" else 1, loop=3 if shape == "loop" else 0)
  check_linear(uops)
  for make, exact in ((small_integers, True), (random_values, False)):
    bufs, reference = wmma_buffers(tc, K, make)
    want = reference.ravel()
    for run in (run_python, run_numpy_lockstep):
      got = run(uops, bufs).astype(np.float64)
      if exact: np.testing.assert_array_equal(got, want, err_msg=f"{name} {shape} {run.__name__}")
      else:
        # one WMMA rounds once; a chain or loop rounds once a WMMA (its D is the next one's C)
        steps = K // tc.dims[2]
        bound = steps * rounding_bound(np.abs(as_values(bufs[1].reshape(tc.dims[0], K), tc.dtype_in)) @
                                       np.abs(as_values(bufs[2].reshape(K, tc.dims[1]), tc.dtype_in)) +
                                       np.abs(bufs[3].reshape(tc.dims[0], tc.dims[1]))).ravel()
        assert (np.abs(got - want) <= bound).all(), f"{name} {shape} {run.__name__}: {np.abs(got - want).max()}"

@pytest.mark.parametrize("name", list(NAMES))
def test_gated_fragment_loads_read_zero(name, tmp_path):
  # a ragged edge: A's rows from 5 on are gated off (their loads give 0), in a K loop whose accumulator starts at 0
  tc = NAMES[name]
  uops, K = wmma_kernel(tc, loop=2, rows=5, zero_c=True)
  check_linear(uops)
  bufs, _ = wmma_buffers(tc, K, small_integers)
  bufs[3][:] = 0   # (not read: C is the constant 0)
  m, n, _ = tc.dims
  a = as_values(bufs[1].reshape(m, K), tc.dtype_in)
  a[5:] = 0
  want = (a @ as_values(bufs[2].reshape(K, n), tc.dtype_in) + bufs[3].reshape(m, n)).ravel()
  for run in (run_python, run_numpy_lockstep):
    np.testing.assert_array_equal(run(uops, bufs), want, err_msg=run.__name__)
  if NVCC and PTXAS:
    build(CUDARenderer().render("tc_kernel", uops), "cu", tmp_path)
    build(PTXRenderer().render("tc_kernel", uops), "ptx", tmp_path)

def test_tf32_operands_drop_their_low_13_bits():
  # A = 1 + 0.75 of tf32's last place (bits below its 10), B = 1: D is 1 (truncated), not 1 + 2^-10 (rounded)
  tc = MMA_TF32
  uops, K = wmma_kernel(tc)
  bufs, _ = wmma_buffers(tc, K, small_integers)
  bufs[1][:] = 0; bufs[2][:] = 0; bufs[3][:] = 0
  bufs[1][0], bufs[2][0] = np.float32(1 + 2.0 ** -11 + 2.0 ** -12), np.float32(1)
  bufs[1][1], bufs[2][tc.dims[1]] = np.float32(1 + 2.0 ** -9), np.float32(1)   # kept: tf32's last bit
  for run in (run_python, run_numpy_lockstep):
    assert run(uops, bufs)[0] == np.float32(2 + 2.0 ** -9), run.__name__

def test_wmma_rounds_the_exact_sum_once():
  # 2^24 + 1 + 1 in float32: adding one at a time gives 2^24 twice; the exact sum 2^24 + 2 is a float32
  tc = MMA_F16
  uops, K = wmma_kernel(tc)
  bufs, _ = wmma_buffers(tc, K, small_integers)
  bufs[1][:] = 0; bufs[2][:] = 0; bufs[3][:] = 0
  bufs[3][0] = np.float32(2.0 ** 24)
  bufs[1][0] = bufs[1][1] = np.float16(1); bufs[2][0] = bufs[2][tc.dims[1]] = np.float16(1)
  assert run_python(uops, bufs)[0] == np.float32(2.0 ** 24 + 2)

# ---------------- rendered for CUDA C and PTX, built for sm_90a ----------------

NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")

def build(src: str, kind: str, folder) -> str:
  """nvcc (CUDA C) or ptxas (PTX) for sm_90a on `src`; the -v report (asserting a build without spills)."""
  path = folder / f"kernel.{kind}"
  path.write_text(src)
  tool = [NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v"] if kind == "cu" else \
    [PTXAS, "-arch=sm_90a", "-v"]
  result = subprocess.run([*tool, "-o", str(path) + ".cubin", str(path)], capture_output=True, text=True)
  report = result.stdout + result.stderr
  assert result.returncode == 0, f"{kind} does not build:\n{report}\n{src}"
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report, report
  return report

def nvcc_ptx(src: str, folder) -> str:
  """The PTX NVVM makes of a CUDA C kernel (to find the inline instructions in it)."""
  path = folder / "kernel.cu"
  path.write_text(src)
  subprocess.run([NVCC, "-arch=sm_90a", "-ptx", "--fmad=false", "-o", str(folder / "kernel.ptx"), str(path)],
                 check=True, capture_output=True)
  return (folder / "kernel.ptx").read_text()

@pytest.mark.skipif(NVCC is None or PTXAS is None, reason="nvcc/ptxas (CUDA toolkit) not installed")
@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("shape", ["one", "loop"])
def test_wmma_kernels_build_for_sm_90a(name, shape, tmp_path):
  tc = NAMES[name]
  uops, _ = wmma_kernel(tc, loop=3 if shape == "loop" else 0)
  cuda_src, ptx_src = CUDARenderer().render("tc_kernel", uops), PTXRenderer().render("tc_kernel", uops)
  build(cuda_src, "cu", tmp_path)
  assert tc.instruction in nvcc_ptx(cuda_src, tmp_path)
  build(ptx_src, "ptx", tmp_path)
  assert ptx_src.count(tc.instruction) == 1
  if tc.dtype_in.itemsize < 4:   # the fragment's loaded bits packed by prmt, never converted to float and back
    assert "prmt.b32" in ptx_src

# ---------------- on the GPU ----------------

def _gpu():
  from kiln.runtime import cuda_driver as cuda
  if not cuda.available() or cuda.device_count() == 0: pytest.skip("no CUDA GPU")
  return cuda

def run_cuda(uops: list[UOp], bufs: dict[int, np.ndarray], threads: int = 32) -> dict[str, np.ndarray]:
  """The kernel compiled from CUDA C (NVRTC) and from PTX on GPU 0: output 0 of each, by renderer name."""
  cuda = _gpu()
  ctx = cuda.Context(0)
  arch = ctx.properties.arch
  images = {"cuda": cuda.NVRTCCompiler(arch).compile(CUDARenderer(arch).render("tc_kernel", uops)),
            "ptx": cuda.PTXCompiler(arch).compile(PTXRenderer(arch).render("tc_kernel", uops))}
  out = {}
  for kind, image in images.items():
    module = ctx.load(image)
    params = [b.arg for b in kernel_signature(uops)[0]]
    memory = [ctx.alloc(max(1, bufs[k].nbytes)) for k in params]
    for mem, k in zip(memory, params): ctx.copy_in(mem, bufs[k])
    module.function("tc_kernel").launch(*memory, grid=(1, 1, 1), block=(threads, 1, 1))
    ctx.synchronize()
    out[kind] = np.empty_like(bufs[0])
    ctx.copy_out(out[kind], memory[0])
    for mem in memory: mem.free()
    module.close()
  return out

def hardware_tolerance(tc: TensorCore, bufs: dict[int, np.ndarray], K: int, steps: int) -> np.ndarray:
  """How far the tensor cores' D may be from the exact A @ B + C: their sums align the terms to the largest one
  and truncate, so each WMMA may be off by about (k + 1) units of float32's last place of the largest magnitude
  it adds; bounded here by 2^-21 of the sum of magnitudes a WMMA (k + 1 <= 33 terms), per chained WMMA."""
  m, n, _ = tc.dims
  a, b = as_values(bufs[1].reshape(m, K), tc.dtype_in), as_values(bufs[2].reshape(K, n), tc.dtype_in)
  magnitude = np.abs(a) @ np.abs(b) + np.abs(bufs[3].reshape(m, n))
  return (steps * 2.0 ** -21 * magnitude).ravel() + 1e-30

@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("shape", ["one", "chained", "loop"])
def test_wmma_on_the_gpu_matches_numpy(name, shape):
  _gpu()
  tc = NAMES[name]
  uops, K = wmma_kernel(tc, chains=2 if shape == "chained" else 1, loop=3 if shape == "loop" else 0)
  for make, exact in ((small_integers, True), (random_values, False)):
    bufs, reference = wmma_buffers(tc, K, make)
    emulated = run_python(uops, bufs)
    for kind, got in run_cuda(uops, bufs).items():
      if exact: np.testing.assert_array_equal(got, reference.ravel(), err_msg=f"{name} {shape} {kind}")
      else:
        bound = hardware_tolerance(tc, bufs, K, K // tc.dims[2])
        assert (np.abs(got - reference.ravel()) <= bound).all(), f"{name} {shape} {kind}"
        assert (np.abs(got - emulated) <= 2 * bound).all(), f"{name} {shape} {kind} against the PYTHON emulator"

def test_tf32_truncation_on_the_gpu():
  # the emulators drop a tf32 operand's low 13 bits (test_tf32_operands_drop_their_low_13_bits): so does the GPU
  _gpu()
  tc = MMA_TF32
  uops, K = wmma_kernel(tc)
  bufs, _ = wmma_buffers(tc, K, small_integers)
  bufs[1][:] = 0; bufs[2][:] = 0; bufs[3][:] = 0
  bufs[1][0], bufs[2][0] = np.float32(1 + 2.0 ** -11 + 2.0 ** -12), np.float32(1)   # 0.75 of tf32's last place
  bufs[1][1], bufs[2][tc.dims[1]] = np.float32(1 + 2.0 ** -9), np.float32(1)
  for kind, got in run_cuda(uops, bufs).items():
    assert got[0] == run_python(uops, bufs)[0] == np.float32(2 + 2.0 ** -9), (kind, got[0])

# ---------------- LDMATRIX and CP_ASYNC ----------------

def _int(kern: Kernel, expr) -> UOp:
  """An int32 expression of the lane: `expr(lane, const)` with the kernel's ALU helpers."""
  return expr(kern.lane, kern.const)

def _ops(kern: Kernel):
  add = lambda a, b: kern.alu(Ops.ADD, a, b)
  mul = lambda a, b: kern.alu(Ops.MUL, a, b)
  div = lambda a, b: kern.alu(Ops.IDIV, a, b)
  mod = lambda a, b: kern.alu(Ops.MOD, a, b)
  return add, mul, div, mod, kern.const

def ldmatrix_kernel(dtype, matrices: int, trans: bool) -> list[UOp]:
  """A warp copies a 32 x 8 matrix of `dtype` (data1) into a shared tile (8 stores a lane), then LDMATRIX x
  `matrices` with lane l naming row l, and stores lane l's elements at data0[l*2x + e]."""
  kern = Kernel()
  add, mul, div, mod, c = _ops(kern)
  out, src = UOp(Ops.DEFINE_GLOBAL, dtype, (), 0), UOp(Ops.DEFINE_GLOBAL, dtype, (), 1)
  tile = kern.add(UOp(Ops.DEFINE_LOCAL, dtype, (), ("tile", 256)))
  stores = []
  for e in range(8):
    at = add(mul(kern.lane, c(8)), c(e))
    stores.append(kern.add(UOp(Ops.STORE, dtypes.void, (tile, at, kern.load(src, at)))))
  barrier = kern.add(UOp(Ops.BARRIER, dtypes.void, tuple(stores)))
  ldm = kern.add(UOp(Ops.LDMATRIX, dtype.vec(2 * matrices), (tile, mul(kern.lane, c(8)), barrier), (matrices, trans)))
  for e in range(2 * matrices):
    kern.add(UOp(Ops.STORE, dtypes.void, (out, add(mul(kern.lane, c(2 * matrices)), c(e)),
                                          kern.add(UOp(Ops.GEP, dtype, (ldm,), e)))))
  return kern.uops

def ldmatrix_reference(data: np.ndarray, matrices: int, trans: bool) -> np.ndarray:
  """The PTX ISA's ldmatrix: lane l gets (l // 4, 2(l % 4) + e) of each 8x8 matrix j (rows 8j.. of `data`), or
  (2(l % 4) + e, l // 4) transposed."""
  grid = data.reshape(32, 8)
  out = np.zeros((32, 2 * matrices), data.dtype)
  for lane in range(32):
    for j in range(matrices):
      m = grid[8 * j:8 * j + 8]
      r, col = lane // 4, 2 * (lane % 4)
      out[lane, 2 * j:2 * j + 2] = (m[col, r], m[col + 1, r]) if trans else (m[r, col], m[r, col + 1])
  return out.ravel()

LDMATRIX_CASES = [(dt, x, t) for dt in (dtypes.float16, dtypes.bfloat16) for x in (1, 2, 4) for t in (False, True)]

@pytest.mark.parametrize("dtype,matrices,trans", LDMATRIX_CASES)
def test_ldmatrix_emulators_match_the_ptx_isa(dtype, matrices, trans):
  uops = ldmatrix_kernel(dtype, matrices, trans)
  check_linear(uops)
  data = storage(np.arange(256, dtype=np.float64) - 100, dtype)
  bufs = {0: np.zeros(64 * matrices, data.dtype), 1: data}
  want = ldmatrix_reference(data, matrices, trans)
  for run in (run_python, run_numpy_lockstep):
    np.testing.assert_array_equal(run(uops, bufs), want, err_msg=run.__name__)

def pipeline_kernel(tc: TensorCore, rows_valid: int = 16) -> list[UOp]:
  """The Ampere path for one warp and one m16n8k16 tile: A (16 x 16, row-major, data1) and B (16 x 8, k-major:
  B's own rows, data2) copied to shared arrays by 16-byte CP_ASYNCs (A's rows from `rows_valid` on zero-filled by
  the gate), one commit, wait 0 and a barrier; A's fragment one LDMATRIX x4, B's one x2 .trans; one WMMA from C = 0;
  D stored at data0 by its layout (index table data3)."""
  kern = Kernel()
  add, mul, div, mod, c = _ops(kern)
  dt = tc.dtype_in
  d, a_buf, b_buf, table = (UOp(Ops.DEFINE_GLOBAL, t, (), i) for i, t in enumerate((F32, dt, dt, INT)))
  tile_a = kern.add(UOp(Ops.DEFINE_LOCAL, dt, (), ("tile_a", 256)))
  tile_b = kern.add(UOp(Ops.DEFINE_LOCAL, dt, (), ("tile_b", 128)))
  a_at = mul(kern.lane, c(8))   # chunk l of A: row l // 2, columns 8*(l % 2)..
  valid = kern.add(UOp(Ops.CMPLT, dtypes.bool, (div(kern.lane, c(2)), c(rows_valid))))
  copy_a = kern.add(UOp(Ops.CP_ASYNC, dtypes.void, (tile_a, a_at, a_buf, a_at, valid), (16, "cg")))
  b_at = mul(mod(kern.lane, c(16)), c(8))   # row l % 16 of B (lanes 16.. copy the same rows again)
  copy_b = kern.add(UOp(Ops.CP_ASYNC, dtypes.void, (tile_b, b_at, b_buf, b_at), (16, "ca")))
  commit = kern.add(UOp(Ops.CP_ASYNC_COMMIT, dtypes.void, (copy_a, copy_b)))
  wait = kern.add(UOp(Ops.CP_ASYNC_WAIT, dtypes.void, (commit,), 0))
  barrier = kern.add(UOp(Ops.BARRIER, dtypes.void, (wait,)))
  # A: matrix j = l // 8 is rows 8*(j % 2).., columns 8*(j // 2)..; lane l names its row l % 8
  row = add(mod(kern.lane, c(8)), mul(mod(div(kern.lane, c(8)), c(2)), c(8)))
  a_row = add(mul(row, c(16)), mul(div(kern.lane, c(16)), c(8)))
  a = kern.add(UOp(Ops.LDMATRIX, dt.vec(8), (tile_a, a_row, barrier), (4, False)))
  b = kern.add(UOp(Ops.LDMATRIX, dt.vec(4), (tile_b, b_at, barrier), (2, True)))   # k rows 8j.. for matrix j
  zero = kern.add(UOp.const(F32.vec(4), 0.0))
  out = kern.add(UOp(Ops.WMMA, F32.vec(4), (a, b, zero), tc))
  kern.store_lanes(d, table, out)
  return kern.uops

def pipeline_buffers(tc: TensorCore, rows_valid: int, make) -> tuple[dict[int, np.ndarray], np.ndarray]:
  m, n, k = tc.dims
  rng = np.random.default_rng(rows_valid)
  a, b = storage(make(rng, (m, k), tc.dtype_in), tc.dtype_in), storage(make(rng, (k, n), tc.dtype_in), tc.dtype_in)
  bufs = {0: np.full(m * n, np.nan, np.float32), 1: a.ravel(), 2: b.ravel(), 3: index_tables(tc, k)["c"]}
  av = as_values(a, tc.dtype_in)
  av[rows_valid:] = 0
  return bufs, (av @ as_values(b, tc.dtype_in)).ravel()

@pytest.mark.parametrize("tc", [MMA_F16, MMA_BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("rows_valid", [16, 11])
def test_cp_async_ldmatrix_wmma_in_the_emulators(tc, rows_valid):
  uops = pipeline_kernel(tc, rows_valid)
  check_linear(uops)
  bufs, want = pipeline_buffers(tc, rows_valid, small_integers)
  for run in (run_python, run_numpy_lockstep):
    np.testing.assert_array_equal(run(uops, bufs), want, err_msg=run.__name__)

def staged_copy_kernel(nbytes: int, cache: str, read_early: bool = False) -> list[UOp]:
  """Two stages of asynchronous copies of float32 (x: data1 into tile0, y: data2 into tile1), a group each; wait 1
  and a barrier, then each lane reads its elements of tile0 into data0 (and, with `read_early`, of tile1 too, which
  has not landed yet); wait 0 and a barrier, then tile1 into data0's second half."""
  per = nbytes // 4
  kern = Kernel()
  add, mul, div, mod, c = _ops(kern)
  out, x, y = (UOp(Ops.DEFINE_GLOBAL, F32, (), i) for i in range(3))
  size = 32 * per
  tiles = [kern.add(UOp(Ops.DEFINE_LOCAL, F32, (), (f"tile{i}", size))) for i in range(2)]
  at = mul(kern.lane, c(per))
  commits = []
  for tile, src in zip(tiles, (x, y)):
    copy = kern.add(UOp(Ops.CP_ASYNC, dtypes.void, (tile, at, src, at), (nbytes, cache)))
    commits.append(kern.add(UOp(Ops.CP_ASYNC_COMMIT, dtypes.void, (copy,))))
  for stage, pending in enumerate((1, 0)):
    wait = kern.add(UOp(Ops.CP_ASYNC_WAIT, dtypes.void, tuple(commits), pending))
    barrier = kern.add(UOp(Ops.BARRIER, dtypes.void, (wait,)))
    for which in ((0, 1) if read_early and stage == 0 else (stage,)):
      for e in range(per):
        value = kern.add(UOp(Ops.LOAD, F32, (tiles[which], add(at, c(e)), barrier)))
        kern.add(UOp(Ops.STORE, dtypes.void, (out, add(add(at, c(e)), c(size * (which + 2 * (stage != which)))),
                                             value)))
  return kern.uops

@pytest.mark.parametrize("nbytes,cache", [(4, "ca"), (8, "ca"), (16, "ca"), (16, "cg")])
def test_staged_copies_land_at_their_wait(nbytes, cache):
  per = nbytes // 4
  size = 32 * per
  x, y = np.arange(size, dtype=np.float32) + 1, -np.arange(size, dtype=np.float32) - 1
  uops = staged_copy_kernel(nbytes, cache)
  check_linear(uops)
  for run in (run_python, run_numpy_lockstep):
    got = run(uops, {0: np.zeros(4 * size, np.float32), 1: x, 2: y})
    np.testing.assert_array_equal(got[:2 * size], np.concatenate([x, y]), err_msg=run.__name__)
  # the emulators land a group only at the wait that covers it: tile1, read after `wait 1`, is still zero there
  early = staged_copy_kernel(nbytes, cache, read_early=True)
  for run in (run_python, run_numpy_lockstep):
    got = run(early, {0: np.full(4 * size, 7, np.float32), 1: x, 2: y})
    np.testing.assert_array_equal(got[3 * size:], np.zeros(size), err_msg=run.__name__)

@pytest.mark.skipif(NVCC is None or PTXAS is None, reason="nvcc/ptxas (CUDA toolkit) not installed")
def test_ldmatrix_and_cp_async_kernels_build_for_sm_90a(tmp_path):
  kernels = {"ldmatrix x4": ldmatrix_kernel(dtypes.float16, 4, False),
             "ldmatrix x2 trans": ldmatrix_kernel(dtypes.bfloat16, 2, True),
             "cp.async, ldmatrix, mma": pipeline_kernel(MMA_F16, 11), "staged cp.async": staged_copy_kernel(8, "ca")}
  for name, uops in kernels.items():
    cuda_src, ptx_src = CUDARenderer().render("tc_kernel", uops), PTXRenderer().render("tc_kernel", uops)
    build(cuda_src, "cu", tmp_path)
    nvvm = nvcc_ptx(cuda_src, tmp_path)
    build(ptx_src, "ptx", tmp_path)
    for text in (nvvm, ptx_src):
      if "ldmatrix" in name: assert "ldmatrix.sync.aligned.m8n8.x" in text, name
      if "cp.async" in name: assert "cp.async.wait_group" in text and "cp.async.commit_group" in text, name
    if "mma" in name:
      for text in (nvvm, ptx_src):
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text and "ldmatrix.sync.aligned.m8n8.x2.trans" in text
        assert "cp.async.cg.shared.global" in text and "cp.async.ca.shared.global" in text
        assert MMA_F16.instruction in text

@pytest.mark.parametrize("dtype,matrices,trans", LDMATRIX_CASES)
def test_ldmatrix_on_the_gpu(dtype, matrices, trans):
  _gpu()
  uops = ldmatrix_kernel(dtype, matrices, trans)
  data = storage(np.arange(256, dtype=np.float64) - 100, dtype)
  bufs = {0: np.zeros(64 * matrices, data.dtype), 1: data}
  for kind, got in run_cuda(uops, bufs).items():
    np.testing.assert_array_equal(got, ldmatrix_reference(data, matrices, trans), err_msg=kind)

@pytest.mark.parametrize("tc", [MMA_F16, MMA_BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("rows_valid", [16, 11])
def test_cp_async_ldmatrix_wmma_on_the_gpu(tc, rows_valid):
  _gpu()
  uops = pipeline_kernel(tc, rows_valid)
  for make in (small_integers, random_values):
    bufs, want = pipeline_buffers(tc, rows_valid, make)
    emulated = run_python(uops, bufs)
    for kind, got in run_cuda(uops, bufs).items():
      if make is small_integers: np.testing.assert_array_equal(got, want, err_msg=kind)
      else: np.testing.assert_allclose(got, emulated, rtol=2.0 ** -19, atol=1e-6, err_msg=kind)

@pytest.mark.parametrize("nbytes,cache", [(4, "ca"), (8, "ca"), (16, "ca"), (16, "cg")])
def test_staged_copies_on_the_gpu(nbytes, cache):
  _gpu()
  size = 32 * nbytes // 4
  x, y = np.arange(size, dtype=np.float32) + 1, -np.arange(size, dtype=np.float32) - 1
  for kind, got in run_cuda(staged_copy_kernel(nbytes, cache), {0: np.zeros(4 * size, np.float32), 1: x, 2: y}).items():
    np.testing.assert_array_equal(got[:2 * size], np.concatenate([x, y]), err_msg=kind)

# ---------------- the spec ----------------

def _before(uops: list[UOp], op: Ops) -> tuple[list[UOp], UOp]:
  """The uops before the first `op`, and that uop."""
  at = next(i for i, u in enumerate(uops) if u.op is op)
  return uops[:at], uops[at]

def test_spec_checks_the_tensor_core_ops():
  uops, _ = wmma_kernel(MMA_F16)
  check_lowered(UOp(Ops.SINK, dtypes.void, tuple(u for u in uops if u.op is Ops.STORE)))
  prefix, wmma = _before(uops, Ops.WMMA)
  a, b, c = wmma.src
  refused = {"operands must be": UOp(Ops.WMMA, wmma.dtype, (b, a, c), MMA_F16),
             "its dtype must be": UOp(Ops.WMMA, dtypes.float32.vec(8), (a, b, c), MMA_F16),
             "TensorCore": UOp(Ops.WMMA, wmma.dtype, (a, b, c), "mma.sync")}
  for why, bad in refused.items():
    with pytest.raises(SpecError, match=why): check_linear(prefix + [bad])
  with pytest.raises(SpecError, match="whole warps"):   # a block of 48 threads
    check_linear(prefix + [UOp(Ops.SPECIAL, INT, (), ("lidx0", 48)), wmma])
  one = UOp.const(dtypes.float16, 1.0)
  fragments = [one, UOp(Ops.VECTORIZE, a.dtype, (one,) * 8), UOp(Ops.VECTORIZE, b.dtype, (one,) * 4),
               UOp.const(c.dtype, 0.0)]
  with pytest.raises(SpecError, match="no lidx0"):   # a CPU-shaped kernel
    check_linear(fragments + [UOp(Ops.WMMA, wmma.dtype, tuple(fragments[1:]), MMA_F16)])
  # a loop whose trip count is the lane's: some lanes would run the WMMA without the others
  loop = UOp(Ops.RANGE, INT, (prefix[0],), 5)
  with pytest.raises(SpecError, match="trip count"):
    check_linear(prefix + [loop, wmma, UOp(Ops.ENDRANGE, dtypes.void, (loop,))])
  steady = UOp(Ops.RANGE, INT, (UOp.const(INT, 2),), 5)
  check_linear(prefix + [steady.src[0], steady, wmma, UOp(Ops.ENDRANGE, dtypes.void, (steady,))])
  # LDMATRIX: of a global buffer, of a 4-byte dtype, x3; CP_ASYNC: 12 bytes, 8 bytes through L2 only
  ldm_prefix, ldm = _before(ldmatrix_kernel(dtypes.float16, 4, False), Ops.LDMATRIX)
  glob = UOp(Ops.DEFINE_GLOBAL, dtypes.float16, (), 1)
  for bad in (UOp(Ops.LDMATRIX, ldm.dtype, (glob, *ldm.src[1:]), ldm.arg),
              UOp(Ops.LDMATRIX, ldm.dtype, ldm.src, (3, False)), UOp(Ops.LDMATRIX, ldm.dtype, ldm.src, (4, 1))):
    with pytest.raises(SpecError, match="LDMATRIX"): check_linear(ldm_prefix + [bad])
  copy_prefix, copy = _before(staged_copy_kernel(16, "cg"), Ops.CP_ASYNC)
  for arg in ((12, "ca"), (8, "cg"), (16, "cs")):
    with pytest.raises(SpecError, match="CP_ASYNC"):
      check_linear(copy_prefix + [UOp(Ops.CP_ASYNC, dtypes.void, copy.src, arg)])
  with pytest.raises(SpecError, match="CP_ASYNC"):   # into global memory
    check_linear(copy_prefix + [UOp(Ops.CP_ASYNC, dtypes.void, (copy.src[2], *copy.src[1:]), copy.arg)])

def test_kernels_built_as_graphs_linearize_in_order():
  # a SINK of the stores: the linearizer places the copies, their commit and wait, the barrier, the ldmatrix loads
  # and the WMMA in their order, and the kernel still computes A @ B
  from kiln.codegen.linearizer import linearize
  uops = linearize(UOp(Ops.SINK, dtypes.void, tuple(u for u in pipeline_kernel(MMA_F16, 11) if u.op is Ops.STORE)))
  check_linear(uops)
  order = [u.op for u in uops if u.op in (Ops.CP_ASYNC, Ops.CP_ASYNC_COMMIT, Ops.CP_ASYNC_WAIT, Ops.BARRIER,
                                          Ops.LDMATRIX, Ops.WMMA)]
  assert order == [Ops.CP_ASYNC] * 2 + [Ops.CP_ASYNC_COMMIT, Ops.CP_ASYNC_WAIT, Ops.BARRIER] + [Ops.LDMATRIX] * 2 + \
    [Ops.WMMA], order
  bufs, want = pipeline_buffers(MMA_F16, 11, small_integers)
  for run in (run_python, run_numpy_lockstep): np.testing.assert_array_equal(run(uops, bufs), want)

def test_python_emulator_refuses_vector_arithmetic():
  # vectors are fragments (tuples in the emulator): an ALU op on one is refused, never a tuple concatenation
  uops, _ = wmma_kernel(MMA_F16)
  prefix, wmma = _before(uops, Ops.WMMA)
  with pytest.raises(NotImplementedError, match="vector ADD"):
    PythonRenderer().render("k", prefix + [wmma, UOp(Ops.ADD, wmma.dtype, (wmma, wmma))])
  out = UOp(Ops.DEFINE_GLOBAL, F32, (), 0)
  with pytest.raises(NotImplementedError, match="vector STORE"):
    PythonRenderer().render("k", prefix + [wmma, UOp(Ops.STORE, dtypes.void, (out, prefix[0], wmma))])
  with pytest.raises(NotImplementedError, match="vector LOAD"):
    PythonRenderer().render("k", prefix + [UOp(Ops.LOAD, F32.vec(4), (out, prefix[0]))])

def test_cpu_renderers_refuse_the_tensor_core_ops():
  from kiln.renderer.cstyle import CRenderer
  uops, _ = wmma_kernel(MMA_F16)
  with pytest.raises((NotImplementedError, TypeError)): CRenderer().render("k", uops)
