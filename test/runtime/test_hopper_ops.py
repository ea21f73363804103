"""Hopper (sm_90a) IR ops (docs/ir.md stage 4, "Hopper": WGMMA, mbarriers, TMA, setmaxnreg) end to end, on a
hand-built warp-specialized GEMM: one CTA of 256 threads, the second warpgroup's first thread the producer (TMA
loads of A and B tiles into a 2-stage ring of shared tiles, full and empty mbarriers with transaction counts), the
first warpgroup the consumer (wgmma over K from the swizzled tiles, C stored from the accumulator fragments).

The kernels run on the PYTHON device (kiln/renderer/python.py, `_scheduled`: threads in different roles run apart,
mbarrier phases and transaction bytes tracked, TMA writes landing at their phase's completion) against NumPy; a
wrong swizzle, a missing wait and a wrong phase fail there. The CUDA C rendering builds for sm_90a with nvcc/ptxas
where installed (wgmma, cp.async.bulk.tensor, mbarrier in the PTX, no spills); with a GPU it runs on the CUDA device.
"""
from __future__ import annotations
import shutil, subprocess
import numpy as np
import pytest
from kiln.dtype import dtypes, fp8_bits
from kiln.runtime.gpu_target import SmemMatrix, TensorMap, WarpgroupMMA, swizzle
from kiln.renderer import kernel_signature
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.renderer.python import PythonRenderer
from kiln.renderer.shared_memory import dynamic_shared_bytes, shared_layout
from kiln.runtime.ops_python import PythonProgram
from kiln.uop.ops import UOp, Ops
from kiln.uop.spec import SpecError, check_linear
from gpu_lockstep import LockstepError, run_lockstep   # noqa: E402  (test/runtime is on sys.path)

INT, BOOL, F32, U64 = dtypes.int32, dtypes.bool, dtypes.float32, dtypes.uint64

class Kernel:
  """A hand-built linear kernel of one block of `threads`, uops appended in order."""
  def __init__(self, threads: int):
    self.uops: list[UOp] = []
    self.lane = self.add(UOp(Ops.SPECIAL, INT, (), ("lidx0", threads)))

  def add(self, u: UOp) -> UOp:
    for s in u.src:
      if s not in self.uops and s.op in (Ops.CONST, Ops.DEFINE_GLOBAL): self.uops.append(s)
    if u not in self.uops: self.uops.append(u)
    return u

  def const(self, value, dtype=INT) -> UOp: return self.add(UOp.const(dtype, value))
  def alu(self, op: Ops, a: UOp, b, dtype=None) -> UOp:
    b = b if isinstance(b, UOp) else self.const(b)
    return self.add(UOp(op, dtype or a.dtype, (a, b)))
  def void(self, op: Ops, *src: UOp, arg=None) -> UOp: return self.add(UOp(op, dtypes.void, tuple(src), arg))

def gemm_kernel(n: int, k: int, bk: int = 64, dtype=dtypes.float16, wrong_parity: bool = False,
                map_swizzle: int | None = None, no_wait: bool = False) -> list[UOp]:
  """C (64 x n float32, buffer 0) = A (64 x k, buffer 1) @ B^T (B n x k, buffer 2), both K-major, by the
  warp-specialized pipeline above: K in steps of `bk` (bk * itemsize bytes: the swizzle span), stage s = step % 2.
  `wrong_parity`, `map_swizzle` (a TMA swizzle other than the wgmma layout's) and `no_wait` (the consumer skips its
  full-barrier wait) break it on purpose."""
  size = dtype.itemsize
  span, steps = bk * size, k // bk
  kern = Kernel(256)
  out, a_buf, b_buf = (UOp(Ops.DEFINE_GLOBAL, dt, (), i) for i, dt in enumerate((F32, dtype, dtype)))
  maps = [kern.add(UOp(Ops.DEFINE_TENSORMAP, dtypes.void, (buf,), (i, TensorMap(dtype, rows, k, (rows, bk),
                                                                               map_swizzle or span))))
          for i, (buf, rows) in enumerate(((a_buf, 64), (b_buf, n)))]
  tiles = [kern.add(UOp(Ops.DEFINE_LOCAL, dtype, (), (name, 2 * rows * bk))) for name, rows in (("sA", 64), ("sB", n))]
  bars = kern.add(UOp(Ops.DEFINE_LOCAL, U64, (), ("bars", 4)))   # full 0, 1; empty 0, 1
  stage_bytes = [64 * span, n * span]
  lane = kern.lane
  first = kern.alu(Ops.CMPEQ, lane, 0, BOOL)
  consumer = kern.alu(Ops.CMPLT, lane, 128, BOOL)
  producer = kern.alu(Ops.CMPEQ, lane, 128, BOOL)
  for i in range(4): kern.void(Ops.MBARRIER_INIT, bars, kern.const(i), first, arg=1)
  kern.void(Ops.BARRIER)
  # the consumer takes more registers (the producer's setmaxnreg.dec is left out: in straight-line gated code every
  # op is reachable from the producer's threads too, so ptxas ignores a count below the kernel's register use)
  kern.void(Ops.SETMAXNREG, consumer, arg=(232, "inc"))
  wg = WarpgroupMMA(n, dtype, SmemMatrix(span, 8 * span), SmemMatrix(span, 8 * span))
  acc_dtype = F32.vec(n // 2)
  acc = kern.add(UOp(Ops.DEFINE_ACC, acc_dtype, (kern.add(UOp.const(acc_dtype, 0.0)),), (0,)))
  step = kern.add(UOp(Ops.RANGE, INT, (kern.const(steps),), 0))
  stage = kern.alu(Ops.MOD, step, 2)
  phase = kern.alu(Ops.AND, kern.alu(Ops.IDIV, step, 2), 1)
  # the producer: wait for the stage to be free (the first round's parity-1 wait returns at once), expect its bytes,
  # load both tiles
  kern.void(Ops.MBARRIER_WAIT, bars, kern.alu(Ops.ADD, stage, 2), kern.alu(Ops.XOR, phase, 1), producer)
  kern.void(Ops.MBARRIER_ARRIVE, bars, stage, producer, arg=sum(stage_bytes))
  offsets = [kern.alu(Ops.MUL, stage, b) for b in stage_bytes]
  column = kern.alu(Ops.MUL, step, bk)
  for tile, tmap, offset in zip(tiles, maps, offsets):
    kern.void(Ops.TMA_LOAD, tile, offset, tmap, bars, stage, kern.const(0), column, producer)
  # the consumer: wait for the stage's bytes, wgmma over its K, release it
  if not no_wait: kern.void(Ops.MBARRIER_WAIT, bars, stage, kern.alu(Ops.XOR, phase, 1) if wrong_parity else phase,
                            consumer)
  starts = [[kern.alu(Ops.ADD, offset, 32 * kk) for offset in offsets] for kk in range(bk * size // 32)]
  kern.void(Ops.WGMMA_FENCE, consumer)   # (the consumer's ops in a row: one branch in CUDA C)
  d = acc
  for a_start, b_start in starts:
    d = kern.add(UOp(Ops.WGMMA, acc_dtype, (tiles[0], a_start, tiles[1], b_start, d, consumer), wg))
  kern.void(Ops.WGMMA_COMMIT, consumer)
  kern.void(Ops.WGMMA_WAIT, consumer, arg=0)
  kern.void(Ops.MBARRIER_ARRIVE, bars, kern.alu(Ops.ADD, stage, 2), first, arg=0)
  kern.add(UOp(Ops.ASSIGN, acc_dtype, (acc, d)))
  kern.void(Ops.ENDRANGE, step)
  # C from the accumulator fragments: thread t's element i at wg.c_layout[t][i]
  warp, quad = kern.alu(Ops.IDIV, lane, 32), kern.alu(Ops.MOD, lane, 32)
  row0 = kern.alu(Ops.ADD, kern.alu(Ops.MUL, warp, 16), kern.alu(Ops.IDIV, quad, 4))
  col0 = kern.alu(Ops.MUL, kern.alu(Ops.MOD, lane, 4), 2)
  for i in range(n // 2):
    j, h, e = i // 4, (i // 2) % 2, i % 2
    row, col = kern.alu(Ops.ADD, row0, 8 * h), kern.alu(Ops.ADD, col0, 8 * j + e)
    index = kern.alu(Ops.ADD, kern.alu(Ops.MUL, row, n), col)
    kern.void(Ops.STORE, out, index, kern.add(UOp(Ops.GEP, F32, (acc,), i)), consumer)
  return kern.uops

def gemm_buffers(n: int, k: int, dtype=dtypes.float16, seed: int = 0):
  """(buffers, float64 reference C = A @ B^T) with small integers (exact in every order) or random values."""
  rng = np.random.default_rng(seed)
  a, b = rng.integers(-4, 5, (64, k)).astype(np.float64), rng.integers(-4, 5, (n, k)).astype(np.float64)
  def stored(x: np.ndarray) -> np.ndarray:
    if dtype == dtypes.bfloat16: return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).ravel()
    if dtype == dtypes.float32: return x.astype(np.float32).ravel()
    if dtype in dtypes.fp8s: return np.array([fp8_bits(float(v), dtype) for v in x.ravel()], np.uint8)
    return x.astype(np.float16).ravel()
  bufs = {0: np.full(64 * n, np.nan, np.float32), 1: stored(a), 2: stored(b)}
  return bufs, a @ b.T

def run_python(uops: list[UOp], bufs: dict) -> np.ndarray:
  src = PythonRenderer().render("hopper_kernel", uops)
  arrays = {key: v.copy() for key, v in bufs.items()}
  params = [b.arg for b in kernel_signature(uops)[0]]
  PythonProgram("hopper_kernel", src.encode())(*[arrays[key].view(np.uint8) for key in params])
  return arrays[0]

@pytest.mark.parametrize("n,k,bk", [(64, 128, 64), (64, 256, 64), (16, 64, 32), (8, 32, 16)])
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_warp_specialized_gemm_in_the_emulator(n, k, bk, dtype):
  _emulated_gemm(n, k, bk, dtype)

# tf32 (k8: 32 floats a 128-byte row) and fp8 (k32: 128 bytes a row), 128B swizzle
WIDE = [(dtypes.float32, 32), (dtypes.fp8e4m3, 128), (dtypes.fp8e5m2, 128)]

@pytest.mark.parametrize("dtype,bk", WIDE, ids=["tf32", "e4m3", "e5m2"])
def test_tf32_and_fp8_gemm_in_the_emulator(dtype, bk):
  _emulated_gemm(32, 2 * bk, bk, dtype)

def _emulated_gemm(n, k, bk, dtype):
  uops = gemm_kernel(n, k, bk, dtype)
  check_linear(uops)
  bufs, want = gemm_buffers(n, k, dtype)
  np.testing.assert_array_equal(run_python(uops, bufs).reshape(64, n), want)
  np.testing.assert_array_equal(run_numpy_lockstep(uops, bufs).reshape(64, n), want)

def run_numpy_lockstep(uops: list[UOp], bufs: dict) -> np.ndarray:
  """The kernel in the tests' NumPy lockstep emulator (program order, every thread at once): output 0."""
  arrays = {key: v.copy() for key, v in bufs.items()}
  run_lockstep(uops, ((1, 1, 1), (256, 1, 1)), arrays)
  return arrays[0]

def test_a_wrong_phase_is_a_clear_deadlock_error():
  uops = gemm_kernel(16, 64, 32, wrong_parity=True)
  bufs, _ = gemm_buffers(16, 64)
  with pytest.raises(RuntimeError, match="deadlock"): run_python(uops, bufs)
  with pytest.raises(LockstepError, match="never would"): run_numpy_lockstep(uops, bufs)

@pytest.mark.parametrize("map_swizzle", [32, 64])
def test_a_tma_swizzle_other_than_the_wgmma_layout_gives_wrong_values(map_swizzle):
  # the map's box rows are then narrower than the tile's rows: refused by the spec, and wrong in the emulator
  uops = gemm_kernel(16, 128, 64, map_swizzle=map_swizzle)
  with pytest.raises(SpecError, match="swizzle"): check_linear(uops)
  bufs, want = gemm_buffers(16, 128)
  with pytest.raises(Exception): np.testing.assert_array_equal(run_python(uops, bufs).reshape(64, 16), want)

def test_a_consumer_that_does_not_wait_is_caught():
  # its wgmma runs before the producer's copies land and its early release of the empty barrier moves that
  # barrier's phase before the producer's first wait (parity 1): the producer can never go on
  uops = gemm_kernel(16, 32, 32, no_wait=True)
  with pytest.raises(RuntimeError, match=r"deadlock.*1 threads \(128\) waiting for parity 1"):
    run_python(uops, gemm_buffers(16, 32)[0])

def test_layouts_follow_the_ptx_isa_swizzles():
  # 128B: 16-byte chunk c of row r at chunk c ^ (r % 8); 64B: c ^ ((r % 8) // 2); 32B: c ^ ((r % 8) // 4) (CUTLASS's
  # Swizzle<3,4,3>, <2,4,3>, <1,4,3>); none: 8x16-byte core matrices
  for span, shift in ((128, 0), (64, 1), (32, 2)):
    layout = SmemMatrix(span, 8 * span)
    for r in range(16):
      for kb in range(0, 32, 2):
        want = (r // 8) * 8 * span + (r % 8) * span + (((kb // 16) ^ ((r % 8) >> shift)) % (span // 16)) * 16 + kb % 16
        assert layout.address(0, r, kb) == want, (span, r, kb)
        assert layout.address(2048, r, kb) == 2048 + want
  plain = SmemMatrix(0, sbo=256, lbo=128)
  assert [plain.address(0, r, kb) for r, kb in ((0, 0), (1, 0), (7, 14), (8, 0), (0, 16), (9, 18))] == \
    [0, 16, 126, 256, 128, 256 + 128 + 16 + 2]
  assert swizzle(0x390, 128) == 0x3E0 and swizzle(0x390, 64) == 0x3A0 and swizzle(0x390, 32) == 0x380

def test_descriptor_bits():
  d = SmemMatrix(128, 1024, 16).descriptor(0x4400)
  assert d & 0x3FFF == 0x440 and (d >> 16) & 0x3FFF == 1 and (d >> 32) & 0x3FFF == 64 and d >> 62 == 1
  assert SmemMatrix(64, 512).descriptor(0) >> 62 == 2 and SmemMatrix(32, 256).descriptor(0) >> 62 == 3
  assert SmemMatrix(0, 256, 128).descriptor(0) >> 62 == 0

def test_accumulator_layout_covers_d_once():
  for n in (8, 64, 256):
    wg = WarpgroupMMA(n, dtypes.float16)
    cells = [cell for thread in wg.c_layout for cell in thread]
    assert sorted(cells) == [(r, c) for r in range(64) for c in range(n)] and len(wg.c_layout[0]) == n // 2
  assert WarpgroupMMA(256, dtypes.fp8e4m3).instruction == "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"
  assert WarpgroupMMA(64, dtypes.float32).dims == (64, 64, 8)

# ---------------- rendered for CUDA C, built for sm_90a ----------------

NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")

def assemble(src: str, folder) -> str:
  """ptxas for sm_90a on PTX `src`: the -v report (asserting no spills and no performance warnings)."""
  path = folder / "kernel.ptx"
  path.write_text(src)
  result = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "-o", str(folder / "ptx.cubin"), str(path)],
                          capture_output=True, text=True)
  report = result.stdout + result.stderr
  assert result.returncode == 0, f"does not assemble:\n{report}"
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "Performance Loss" not in report, report
  return report

def build(src: str, folder) -> tuple[str, str]:
  """nvcc for sm_90a on CUDA C `src`: (the ptxas -v report, asserting no spills and no performance warnings; the
  PTX NVVM made)."""
  path = folder / "kernel.cu"
  path.write_text(src)
  result = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v", "-o",
                           str(folder / "kernel.cubin"), str(path)], capture_output=True, text=True)
  report = result.stdout + result.stderr
  assert result.returncode == 0, f"does not build:\n{report}"
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "Performance Loss" not in report, report
  subprocess.run([NVCC, "-arch=sm_90a", "-ptx", "--fmad=false", "-o", str(folder / "kernel.ptx"), str(path)],
                 check=True, capture_output=True)
  return report, (folder / "kernel.ptx").read_text()

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("n,k,bk", [(64, 128, 64), (256, 128, 64), (16, 64, 32), (8, 32, 16)])
def test_gemm_builds_for_sm_90a(n, k, bk, tmp_path):
  _check_gemm_builds(n, k, bk, dtypes.float16, tmp_path)

def test_swizzled_tiles_over_48_kib_are_1024_byte_aligned_in_dynamic_shared_memory(tmp_path):
  uops = gemm_kernel(256, 128, 64)   # 16 + 64 KiB of tiles: one dynamic array
  layout = shared_layout(uops)
  assert layout.dynamic and all(layout.offsets[u] % 1024 == 0 for u in layout.offsets if u.dtype == dtypes.float16)
  assert "extern __shared__ __align__(1024)" in CUDARenderer().render("hopper_kernel", uops)
  assert ".extern .shared .align 1024" in PTXRenderer().render("hopper_kernel", uops)

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("dtype,bk", WIDE, ids=["tf32", "e4m3", "e5m2"])
def test_tf32_and_fp8_gemm_build_for_sm_90a(dtype, bk, tmp_path):
  _check_gemm_builds(32, 2 * bk, bk, dtype, tmp_path)

def _check_gemm_builds(n, k, bk, dtype, tmp_path):
  uops = gemm_kernel(n, k, bk, dtype)
  instruction = next(u.arg.instruction for u in uops if u.op is Ops.WGMMA)
  report, ptx = build(CUDARenderer().render("hopper_kernel", uops), tmp_path)
  for text in (instruction, "wgmma.fence.sync.aligned",
               "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
               "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
               "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
               "mbarrier.init.shared::cta.b64", "setmaxnreg.inc.sync.aligned.u32 232"):
    assert text in ptx, text
  assert ".param .align 64 .b8 hopper_kernel_param_3[128]" in ptx   # the tensor maps: __grid_constant__ params
  ptx_src = PTXRenderer().render("hopper_kernel", uops)
  assemble(ptx_src, tmp_path)
  assert ptx_src.count(instruction) == bk * dtype.itemsize // 32
  assert ptx_src.count("cp.async.bulk.tensor.2d") == 2 and ".param .align 64 .b8 tmap1[128]" in ptx_src

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_setmaxnreg_and_proxy_fence_build(tmp_path):
  # the second warpgroup gives registers back, the first takes them; an ordinary shared store made visible to the
  # async proxy
  kern = Kernel(256)
  out = UOp(Ops.DEFINE_GLOBAL, F32, (), 0)
  tile = kern.add(UOp(Ops.DEFINE_LOCAL, F32, (), ("tile", 256)))
  kern.void(Ops.SETMAXNREG, kern.alu(Ops.CMPLT, kern.const(127), kern.lane, BOOL), arg=(40, "dec"))
  kern.void(Ops.SETMAXNREG, kern.alu(Ops.CMPLT, kern.lane, 128, BOOL), arg=(232, "inc"))
  kern.void(Ops.STORE, tile, kern.lane, kern.add(UOp(Ops.CAST, F32, (kern.lane,))))
  kern.void(Ops.FENCE_PROXY_ASYNC)
  barrier = kern.void(Ops.BARRIER)
  kern.void(Ops.STORE, out, kern.lane, kern.add(UOp(Ops.LOAD, F32, (tile, kern.alu(Ops.XOR, kern.lane, 1), barrier))))
  check_linear(kern.uops)
  got = run_python(kern.uops, {0: np.zeros(256, np.float32)})
  np.testing.assert_array_equal(got, np.arange(256) ^ 1)
  if NVCC:
    _, ptx = build(CUDARenderer().render("hopper_kernel", kern.uops), tmp_path)
    ptx_src = PTXRenderer().render("hopper_kernel", kern.uops)
    assemble(ptx_src, tmp_path)
    for text in ("setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232",
                 "fence.proxy.async.shared::cta"):
      assert text in ptx and text in ptx_src, text

# ---------------- on the GPU ----------------

def run_cuda(uops: list[UOp], bufs: dict, renderer: str = "cuda") -> np.ndarray:
  """The kernel from CUDA C (NVRTC) or PTX on GPU 0, its tensor maps encoded over their buffers
  (cuda_driver.TensorMap.for_description, passed after the buffers): output 0."""
  from kiln.runtime import cuda_driver as cuda
  if not cuda.available() or cuda.device_count() == 0: pytest.skip("no CUDA GPU")
  ctx = cuda.Context(0)
  arch = ctx.properties.arch
  if not arch.startswith("sm_9"): pytest.skip(f"{arch} has no wgmma/TMA")
  image = cuda.NVRTCCompiler(arch).compile(CUDARenderer(arch).render("hopper_kernel", uops)) if renderer == "cuda" \
    else cuda.PTXCompiler(arch).compile(PTXRenderer(arch).render("hopper_kernel", uops))
  module = ctx.load(image)
  params = [b.arg for b in kernel_signature(uops)[0]]
  memory = {key: ctx.alloc(max(1, bufs[key].nbytes)) for key in params}
  for key in params: ctx.copy_in(memory[key], bufs[key])
  maps = sorted((u for u in uops if u.op is Ops.DEFINE_TENSORMAP), key=lambda u: u.arg[0])
  tensormaps = [cuda.TensorMap.for_description(memory[m.src[0].arg], m.arg[1]) for m in maps]
  module.function("hopper_kernel").launch(*[memory[key] for key in params], *tensormaps, grid=(1, 1, 1),
                                          block=(256, 1, 1), shared=dynamic_shared_bytes(uops))
  ctx.synchronize()
  out = np.empty_like(bufs[0])
  ctx.copy_out(out, memory[0])
  for mem in memory.values(): mem.free()
  module.close()
  return out

@pytest.mark.parametrize("n,k,bk", [(64, 128, 64), (64, 256, 64), (256, 192, 64), (16, 64, 32), (8, 32, 16)])
@pytest.mark.parametrize("renderer", ["cuda", "ptx"])
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_warp_specialized_gemm_on_the_gpu(n, k, bk, renderer, dtype):
  uops = gemm_kernel(n, k, bk, dtype)
  bufs, want = gemm_buffers(n, k, dtype, seed=n + k)
  np.testing.assert_array_equal(run_cuda(uops, bufs, renderer).reshape(64, n), want)

@pytest.mark.parametrize("dtype,bk", WIDE, ids=["tf32", "e4m3", "e5m2"])
def test_tf32_and_fp8_gemm_on_the_gpu(dtype, bk):
  uops = gemm_kernel(32, 2 * bk, bk, dtype)
  bufs, want = gemm_buffers(32, 2 * bk, dtype)
  np.testing.assert_array_equal(run_cuda(uops, bufs).reshape(64, 32), want)

# ---------------- the spec ----------------

def _replaced(uops: list[UOp], old: UOp, new: UOp) -> list[UOp]:
  """`uops` with `old` replaced by `new` (nodes using it rebuilt)."""
  mapping = {old: new}
  out = []
  for u in uops:
    if u in mapping: out.append(mapping[u]); continue
    if any(s in mapping for s in u.src):
      mapping[u] = u.replace(src=tuple(mapping.get(s, s) for s in u.src)) if hasattr(u, "replace") else \
        UOp(u.op, u.dtype, tuple(mapping.get(s, s) for s in u.src), u.arg)
      out.append(mapping[u])
    else: out.append(u)
  return out

def test_spec_checks_the_hopper_ops():
  uops = gemm_kernel(16, 64, 32)
  check_linear(uops)
  first = lambda op: next(u for u in uops if u.op is op)
  wgmma, wait, init = first(Ops.WGMMA), first(Ops.MBARRIER_WAIT), first(Ops.MBARRIER_INIT)
  bad = {
    "not bool": UOp(Ops.MBARRIER_WAIT, dtypes.void, wait.src[:3] + (wait.src[1],), None),
    "arrival count": UOp(Ops.MBARRIER_INIT, dtypes.void, init.src, 0),
    "accumulator": UOp(Ops.WGMMA, F32.vec(4), wgmma.src, wgmma.arg),
    "8..256": UOp(Ops.WGMMA, wgmma.dtype, wgmma.src, WarpgroupMMA(12, dtypes.float16)),
  }
  for why, node in bad.items():
    with pytest.raises(SpecError, match=why): check_linear(_replaced(uops, next(u for u in uops if u.op is node.op
                                                                                 and u.src[:2] == node.src[:2]), node))
  small = Kernel(64)   # a warpgroup op in a block of 64 threads
  small.void(Ops.WGMMA_FENCE, small.add(UOp.const(BOOL, True)))
  with pytest.raises(SpecError, match="warpgroups of 128"): check_linear(small.uops)

def test_cpu_renderers_refuse_the_hopper_ops():
  from kiln.renderer.cstyle import CRenderer
  with pytest.raises(Exception): CRenderer().render("hopper_kernel", gemm_kernel(8, 32, 16))
