"""The Hopper GEMM pass (kiln/codegen/gpu_wgmma.py, WGMMA=1): which lowered kernels it takes, its kernels in the
PYTHON and NumPy lockstep emulators against NumPy (with a fused bias + relu epilogue), their sm_90a builds by nvcc and
ptxas, and on a Hopper GPU a 4096^2 x 4096 product against torch."""
from __future__ import annotations
import shutil, subprocess
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.codegen import gpu_wgmma
from kiln.engine.realize import lower_for_codegen
from kiln.helpers import Context
from kiln.renderer import kernel_signature
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.renderer.python import PythonRenderer
from kiln.renderer.shared_memory import dynamic_shared_bytes
from kiln.runtime.gpu_target import WarpgroupMMA
from kiln.runtime.ops_python import PythonProgram
from kiln.uop.ops import Ops
from kiln.uop.spec import check_linear
from gpu_lockstep import run_lockstep   # noqa: E402  (test/runtime is on sys.path)

def _lowered(out: Tensor):
  item = [i for i in out.schedule() if i.ast.op is not Ops.COPY][-1]
  return lower_for_codegen(item.ast)

def _linear(m: int, n: int, k: int, dtype=dtypes.half, epilogue: bool = True, transposed: bool = True,
            batch: tuple = ()):
  """The lowered kernel of `(x @ w.T + bias).relu()` (x m x k, w n x k), or of `x @ w` (w k x n)."""
  x = Tensor.empty(*batch, m, k, dtype=dtype, device="PYTHON")
  w = Tensor.empty(*batch, *((n, k) if transposed else (k, n)), dtype=dtype, device="PYTHON")
  out = x @ (w.transpose(-1, -2) if transposed else w)
  if epilogue: out = (out + Tensor.empty(n, dtype=dtype, device="PYTHON")).relu()
  return _lowered(out)

def _kernel(m: int, n: int, k: int, dtype=dtypes.half, epilogue: bool = True):
  with Context(WGMMA=1): uops = gpu_wgmma.wgmma_kernel(_linear(m, n, k, dtype, epilogue))
  assert uops is not None
  check_linear(uops)
  return uops

def test_off_by_default_and_refusals():
  sink = _linear(128, 128, 128)
  assert gpu_wgmma.wgmma_plan(sink) is None   # WGMMA=0
  with Context(WGMMA=1):
    assert gpu_wgmma.wgmma_plan(sink) is not None
    assert gpu_wgmma.wgmma_plan(_linear(128, 128, 128, transposed=False)) is None   # B not K-major
    assert gpu_wgmma.wgmma_plan(_linear(128, 128, 100)) is None   # k not a multiple of 8 (the TMA's row stride)
    assert gpu_wgmma.wgmma_plan(_linear(128, 128, 128, batch=(2,))) is None
    assert gpu_wgmma.wgmma_plan(_linear(128, 128, 128, dtypes.float32)) is None
    from kiln.runtime.gpu_target import GPUTarget
    assert gpu_wgmma.wgmma_plan(sink, GPUTarget(arch="sm_86")) is None

def test_epilogue_layout_is_the_instructions():
  # the pass's row/column formula against WarpgroupMMA.c_layout
  wg = WarpgroupMMA(128, dtypes.float16)
  for t in range(128):
    for i in range(64):
      row = 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2)
      col = 2 * (t % 4) + 8 * (i // 4) + i % 2
      assert wg.c_layout[t][i] == (row, col)

def _stored(x: np.ndarray, dtype) -> np.ndarray:
  if dtype == dtypes.bfloat16: return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).ravel()
  return x.astype(np.float16).ravel()

def _buffers(m: int, n: int, k: int, dtype, epilogue: bool, seed: int = 0):
  """(buffers by DEFINE_GLOBAL index, the float64 reference) with small integers (exact in every order)."""
  rng = np.random.default_rng(seed)
  x, w, bias = (rng.integers(-2, 3, shape).astype(np.float64) for shape in ((m, k), (n, k), (n,)))
  bufs = {0: np.zeros(m * n, np.uint16), 1: _stored(x, dtype), 2: _stored(w, dtype)}
  want = x @ w.T
  if epilogue: bufs[3], want = _stored(bias, dtype), np.maximum(want + bias, 0)
  return bufs, want

def _as_float(out: np.ndarray, dtype) -> np.ndarray:
  if dtype == dtypes.bfloat16: return (out.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
  return out.view(np.float16).astype(np.float64)

SHAPES = [(128, 128, 128), (256, 128, 192), (128, 128, 576), (200, 136, 120)]   # 576: the ring wraps twice; the
# last: edge tiles in m, n and k

@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_gemm_in_the_emulators(m, n, k, dtype):
  uops = _kernel(m, n, k, dtype)
  bufs, want = _buffers(m, n, k, dtype, True)
  params = [b.arg for b in kernel_signature(uops)[0]]
  python = {key: v.copy() for key, v in bufs.items()}
  PythonProgram("wgmma_kernel", PythonRenderer().render("wgmma_kernel", uops).encode())(
    *[python[key].view(np.uint8) for key in params])
  np.testing.assert_array_equal(_as_float(python[0], dtype).reshape(m, n), want)
  if dtype != dtypes.float16: return   # (the lockstep emulator's plain loads and stores take NumPy's dtypes)
  lockstep = {key: v.view(np.float16).copy() for key, v in bufs.items()}
  run_lockstep(uops, ((-(-n // 128), -(-m // 128), 1), (gpu_wgmma.THREADS, 1, 1)), lockstep)
  np.testing.assert_array_equal(lockstep[0].astype(np.float64).reshape(m, n), want)

def test_overlapped_steps_in_the_emulators(monkeypatch):
  # OVERLAP: wait_group 1 and the previous step's stage released (off by default: ptxas serializes it)
  monkeypatch.setattr(gpu_wgmma, "OVERLAP", True)
  test_gemm_in_the_emulators(256, 128, 320, dtypes.float16)

NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")

@pytest.mark.skipif(NVCC is None or PTXAS is None, reason="nvcc/ptxas (CUDA toolkit) not installed")
@pytest.mark.parametrize("size", [4096, 3000])   # 3000: edge tiles
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_kernel_builds_for_sm_90a(size, dtype, tmp_path):
  uops = _kernel(size, size, size, dtype)
  assert dynamic_shared_bytes(uops) >= gpu_wgmma.shared_bytes()
  src = CUDARenderer().render("wgmma_kernel", uops)
  (tmp_path / "k.cu").write_text(src)
  result = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v", "-o",
                           str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")], capture_output=True, text=True)
  report = result.stdout + result.stderr
  assert result.returncode == 0, report
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "Performance Loss" not in report, report
  ptx = PTXRenderer().render("wgmma_kernel", uops)
  (tmp_path / "k.ptx").write_text(ptx)
  result = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "-o", str(tmp_path / "p.cubin"), str(tmp_path / "k.ptx")],
                          capture_output=True, text=True)
  report = result.stdout + result.stderr
  assert result.returncode == 0, report
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "Performance Loss" not in report, report
  assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16") == 4 and ptx.count("cp.async.bulk.tensor.2d") == 2

# ---------------- on the GPU ----------------

@pytest.mark.parametrize("size,dtype,ptx", [(4096, "fp16", False), (4096, "bf16", False), (3000, "fp16", False),
                                            (3000, "bf16", False), (4096, "fp16", True)], ids=str)   # 3000: edges
def test_gemm_on_the_gpu_matches_torch(size, dtype, ptx):
  # relu(x @ w.T + bias) at size^3, all of it against relu(F.linear) in float32 (bench/bench_wgmma.py's check)
  from kiln.runtime import cuda_driver as cuda
  if not cuda.available() or cuda.device_count() == 0: pytest.skip("no CUDA GPU")
  if cuda.device_properties(0).arch != "sm_90a": pytest.skip("not a Hopper GPU (sm_90a)")
  torch = pytest.importorskip("torch")
  import os, sys
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
  import bench_wgmma
  bufs = bench_wgmma.tensors(size, size, size, dtype, seed=1)
  launch = bench_wgmma.Launcher(_kernel(size, size, size, {"fp16": dtypes.half, "bf16": dtypes.bfloat16}[dtype]),
                                bufs, ptx)
  launch()
  launch.ctx.synchronize()
  torch.cuda.synchronize()
  bench_wgmma.check(bufs[0], bufs[1], bufs[2], bufs[3], dtype)
