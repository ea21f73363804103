"""Tensor-core matmul tiles (kiln/codegen/gpu_mma.py) and the TC action (kiln/codegen/opt/kernel.py) without a GPU:
which kernels the plan takes (half, bfloat16; float32 only under ALLOW_TF32=1; TC=0 none), the tile rule, the
fragment layouts as lane forms, the action's refusals, the kernel's structure (WMMAs a step, shared memory, launch
sizes), float32 kernels keeping the SIMT tiles' exact source; small GEMMs (ragged, batched, transposed, epilogues,
bf16, tf32, a convolution) on the PYTHON device as a GPU target against NumPy; the 4096^3 kernel built for sm_90a
by nvcc/ptxas without spills. With a GPU (DEV=CUDA): the same against float64 on the device."""
from __future__ import annotations
import os, re, shutil, subprocess, tempfile
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.codegen import gpu_mma, gpu_tiles
from kiln.codegen.gpudims import launch_size, map_axes_to_gpu, toposort_specials
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError
from kiln.codegen.opt.gpu_heuristic import GPUTarget, gpu_opts
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.helpers import Context
from kiln.renderer.cuda import CUDARenderer
from kiln.runtime.gpu_target import MMA_BF16, MMA_F16, MMA_TF32, TENSOR_CORES
from kiln.uop.ops import Ops
from kiln.uop.spec import SpecError

GPU = GPUTarget()

def _lowered(out: Tensor):
  """The lowered kernel of `out`'s (last) kernel."""
  item = [i for i in out.schedule() if i.ast.op is not Ops.COPY][-1]
  return lower_for_codegen(item.ast)

def _matmul(m: int, k: int, n: int, dtype=dtypes.half, batch: tuple = ()):
  a = Tensor.empty(*batch, m, k, dtype=dtype, device="PYTHON")
  b = Tensor.empty(*batch, k, n, dtype=dtype, device="PYTHON")
  return a @ b

# ---------------- the plan, the tile rule, the layouts ----------------

@pytest.mark.parametrize("dtype,core", [(dtypes.half, MMA_F16), (dtypes.bfloat16, MMA_BF16)])
def test_half_and_bfloat16_matmuls_take_tensor_cores(dtype, core):
  plan, tc = gpu_mma.mma_plan(_lowered(_matmul(512, 256, 384, dtype)))
  assert tc is core and plan.tile == (64, 64, 32), plan.tile   # 48 blocks of 132 SMs

def test_float32_takes_tf32_only_when_allowed():
  lowered = _lowered(_matmul(512, 256, 384, dtypes.float32))
  assert gpu_mma.mma_plan(lowered) is None
  with Context(ALLOW_TF32=1):
    plan, tc = gpu_mma.mma_plan(lowered)
  assert tc is MMA_TF32 and plan.tile[2] == 16

def test_tc_0_and_targets_without_tensor_cores_refuse():
  lowered = _lowered(_matmul(256, 256, 256))
  with Context(TC=0): assert gpu_mma.mma_plan(lowered) is None
  assert gpu_mma.mma_plan(lowered, GPUTarget(tensor_cores=())) is None
  assert gpu_mma.mma_plan(lowered, GPUTarget(tensor_cores=(MMA_BF16,))) is None   # a half matmul, bf16 cores only

def test_other_kernels_are_refused():
  x = Tensor.empty(256, 256, dtype=dtypes.half, device="PYTHON")
  for out in (x.float().sum(axis=1), (x * x).sum(axis=0), x.max(axis=1), _matmul(1, 256, 256), _matmul(256, 3, 256)):
    assert gpu_mma.mma_plan(_lowered(out)) is None, out

def test_tile_rule():
  choose = gpu_mma.choose_mma_tile
  assert choose(4096, 4096, 4096, 1) == (128, 128, 32) and choose(8192, 8192, 8192, 1) == (128, 128, 32)
  assert choose(256, 256, 256, 1) == (64, 64, 32)
  assert choose(4096, 4096, 4096, 1, itemsize=4) == (128, 128, 16)   # tf32: 16 floats a step
  assert choose(4096, 4096, 4096, 1, shared_max=227 << 10) == (128, 256, 32)   # dynamic shared memory: the widest
  assert choose(4096, 4096, 4096, 1, choice=4) == (64, 64, 32)
  for bm, bn, _ in gpu_mma.TILES:   # every tile within the shared memory it is allowed
    assert gpu_mma.shared_bytes(bm, bn) <= (48 << 10) or (bm, bn) == (128, 256)

@pytest.mark.parametrize("core", TENSOR_CORES, ids=lambda tc: tc.instruction)
def test_fragment_layouts_are_lane_forms(core):
  for layout in (core.a_layout, core.b_layout, core.c_layout):
    for e in range(len(layout[0])):
      for axis in (0, 1):
        g, t, c = gpu_mma.lane_form([layout[lane][e][axis] for lane in range(32)])
        assert all(layout[lane][e][axis] == g * (lane // 4) + t * (lane % 4) + c for lane in range(32))

# ---------------- the TC action ----------------

def test_heuristics_give_tc_to_fitting_kernels_only():
  kernel = Kernel(_lowered(_matmul(512, 256, 384)), GPU)
  assert gpu_opts(kernel) == [Opt(OptOps.TC, 2, 0)]
  assert Kernel(_lowered(_matmul(512, 256, 384, dtypes.float32)), GPU).sink.arg is None
  fp32 = Kernel(_lowered(_matmul(512, 256, 384, dtypes.float32)), GPU)
  assert gpu_opts(fp32) == []   # SIMT tiles, mapped by gpu_tiles itself
  with Context(TC=0): assert gpu_opts(Kernel(_lowered(_matmul(512, 256, 384)), GPU)) == []

def test_tc_action_refusals_leave_the_kernel():
  lowered = _lowered(_matmul(512, 256, 384))
  for opt in (Opt(OptOps.TC, 0, 0), Opt(OptOps.TC, 2, 9), Opt(OptOps.TC, 2, -1)):
    kernel = Kernel(lowered, GPU)
    with pytest.raises(KernelOptError): kernel.apply(opt)
    assert kernel.sink is lowered
  with pytest.raises(KernelOptError, match="needs a GPU target"): Kernel(lowered).apply(Opt(OptOps.TC, 2, 0))
  kernel = Kernel(lowered, GPU).apply(Opt(OptOps.TC, 2, 0))
  for opt in (Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.TC, 2, 0), Opt(OptOps.UPCAST, 1, 4)):
    with pytest.raises(KernelOptError): kernel.apply(opt)
  with pytest.raises(KernelOptError, match="only GPU action"):
    Kernel(lowered, GPU).apply(Opt(OptOps.LOCAL, 1, 128)).apply(Opt(OptOps.TC, 2, 0))
  with pytest.raises(KernelOptError, match="no tensor-core tiling"):
    Kernel(_lowered(_matmul(512, 256, 384, dtypes.float32)), GPU).apply(Opt(OptOps.TC, 2, 0))

def test_beam_is_offered_the_tiles():
  offered = Kernel(_lowered(_matmul(512, 256, 384)), GPU).possible_opts()
  assert [o for o in offered if o.op is OptOps.TC] == [Opt(OptOps.TC, 2, c) for c in (0, 2, 3, 4, 5)]   # (1: 128x256
  # needs more than 48 KB of shared memory)

# ---------------- the kernel ----------------

def _tiled(out: Tensor, target=None):
  lowered = _lowered(out)
  kernel = Kernel(lowered, target or GPU).apply(Opt(OptOps.TC, len(Kernel(lowered).output_axes), 0))
  return map_axes_to_gpu(kernel.sink, target)

@pytest.mark.parametrize("path", ["async", "plain staging"])
def test_4096_kernel_structure(monkeypatch, path):
  monkeypatch.setattr(gpu_mma, "ASYNC", path == "async")
  tiled = _tiled(_matmul(4096, 4096, 4096))
  nodes = tiled.toposort()
  count = lambda op: sum(u.op is op for u in nodes)   # noqa: E731
  assert launch_size(toposort_specials(tiled)) == ((32, 32, 1), (256, 1, 1))
  # a 128 x 128 tile of 8 warps of 64 x 32: 4 x 4 tensor-core tiles, 2 WMMAs each a step of 32
  assert count(Ops.WMMA) == 32 and count(Ops.REDUCE) == 64 and count(Ops.BARRIER) == 1
  # fragments: an ldmatrix.x4 per A tile and an x2 per B tile, each k16
  assert count(Ops.LDMATRIX) == (4 + 4) * 2
  shared = {u.arg[0]: u.arg[1] * u.dtype.itemsize for u in nodes if u.op is Ops.DEFINE_LOCAL}
  assert all(u.dtype == dtypes.half for u in nodes if u.op is Ops.DEFINE_LOCAL)
  if path == "async":   # a ring of 3 stages, 2 chunks of 16 bytes a thread a factor a step (and the prologue's)
    assert shared == {"tile_a": 3 * 128 * 32 * 2, "tile_b": 3 * 128 * 32 * 2}, shared
    assert count(Ops.CP_ASYNC) == 2 * 2 * 2 and count(Ops.CP_ASYNC_WAIT) == 1 and count(Ops.CP_ASYNC_COMMIT) == 2
  else:   # two halves, rows padded by 16 bytes
    assert shared == {"tile_a": 2 * 128 * 40 * 2, "tile_b": 2 * 128 * 40 * 2}, shared
    assert count(Ops.CP_ASYNC) == 0

def test_linearized_accumulators_are_the_instructions_registers():
  from kiln.codegen.linearizer import linearize
  uops = linearize(_tiled(_matmul(128, 64, 128)))
  wmmas = [u for u in uops if u.op is Ops.WMMA]
  starts = [u for u in wmmas if u.src[2].op is not Ops.WMMA]
  assert starts and all(u.src[2].op is Ops.VECTORIZE and all(s.op is Ops.DEFINE_ACC for s in u.src[2].src)
                        for u in starts)
  assert not any(u.op is Ops.ADD and u.dtype == dtypes.float32 and u.src[0].op is Ops.DEFINE_ACC for u in uops)

def test_float32_sources_are_the_simt_tiles():
  renderer = CUDARenderer()
  lowered = _lowered(_matmul(512, 256, 384, dtypes.float32))
  with Context(TC=0): before = render_with(renderer, "m", optimize_for(renderer, lowered))[0]
  assert render_with(renderer, "m", optimize_for(renderer, lowered))[0] == before
  assert "mma" not in before and "tile_a" in before

# ---------------- on the PYTHON device as a GPU target (the emulator's WMMA) ----------------

def _python_has_wmma() -> bool:
  from kiln.renderer import python
  return hasattr(python, "_WarpMMA")

needs_wmma = pytest.mark.skipif(not _python_has_wmma(), reason="the PYTHON emulator has no WMMA yet")

def _data(rng, *shape, dtype=np.float16): return rng.uniform(-1, 1, shape).astype(dtype)

def _run(monkeypatch, fn, *arrays, dtype=dtypes.half):
  """fn over `arrays` on the PYTHON device as a GPU target; (result as float64, whether a WMMA kernel ran)."""
  from helpers import kernel_sources, use_gpu_style_python
  device = use_gpu_style_python(monkeypatch)
  tensors = [Tensor(a, device=device).cast(dtype) if a.dtype == np.float32 and dtype != dtypes.float32 else
             Tensor(a, device=device) for a in arrays]
  sources = kernel_sources(lambda: fn(*tensors))
  got = fn(*tensors).float().numpy().astype(np.float64)
  if gpu_mma.LDMATRIX and dtype in (dtypes.half, dtypes.bfloat16):
    assert not any("_WarpMMA((" in src and "_WarpLoadMatrix(" not in src for src in sources), "no ldmatrix"
  return got, any("_WarpMMA((" in src for src in sources)

def _close(got, want, what, tol=2e-2):
  worst = np.abs(got - want).max()
  assert got.shape == want.shape and worst <= tol * max(1.0, np.abs(want).max()), \
    f"{what}: shapes {got.shape} vs {want.shape}, worst difference {worst}"

def _f64(x): return x.astype(np.float64)

PATHS = {"cp.async ring": (True, True), "ldmatrix": (False, True), "plain loads": (False, False)}

@needs_wmma
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (100, 72, 40), (33, 50, 70), (130, 96, 136)])
def test_gemm_on_the_emulator(monkeypatch, m, k, n, path):
  monkeypatch.setattr(gpu_mma, "ASYNC", PATHS[path][0])
  monkeypatch.setattr(gpu_mma, "LDMATRIX", PATHS[path][1])
  rng = np.random.default_rng(m * k + n)
  a, b = _data(rng, m, k), _data(rng, k, n)
  got, used = _run(monkeypatch, lambda x, y: x @ y, a, b)
  assert used, "no tensor-core kernel ran"
  _close(got, _f64(a) @ _f64(b), f"{m}x{k}x{n}")

@needs_wmma
def test_transposed_and_batched_on_the_emulator(monkeypatch):
  rng = np.random.default_rng(11)
  a, b = _data(rng, 40, 64), _data(rng, 48, 40)   # A fastest along m and B along k: the async path's other layouts
  got, used = _run(monkeypatch, lambda x, y: x.T @ y.T, a, b)
  assert used
  _close(got, _f64(a).T @ _f64(b).T, "a.T @ b.T")
  x, y = _data(rng, 2, 32, 48), _data(rng, 2, 48, 24)
  got, used = _run(monkeypatch, lambda p, q: p @ q, x, y)
  assert used
  _close(got, _f64(x) @ _f64(y), "batched")

@needs_wmma
def test_epilogues_on_the_emulator(monkeypatch):
  rng = np.random.default_rng(12)
  a, b, bias = _data(rng, 64, 40), _data(rng, 40, 72), _data(rng, 72)
  got, used = _run(monkeypatch, lambda x, y, z: (x @ y + z).relu(), a, b, bias)
  assert used
  _close(got, np.maximum(_f64(a) @ _f64(b) + _f64(bias), 0), "relu(a @ b + bias)")
  got, used = _run(monkeypatch, lambda x, y, z: (x @ y + z).gelu(), a, b, bias)
  import torch
  want = torch.nn.functional.gelu(torch.from_numpy(_f64(a) @ _f64(b) + _f64(bias)), approximate="tanh").numpy()
  assert used
  _close(got, want, "gelu(a @ b + bias)")

@needs_wmma
def test_bfloat16_and_tf32_on_the_emulator(monkeypatch):
  rng = np.random.default_rng(13)
  a, b = rng.uniform(-1, 1, (48, 40)).astype(np.float32), rng.uniform(-1, 1, (40, 64)).astype(np.float32)
  got, used = _run(monkeypatch, lambda x, y: x @ y, a, b, dtype=dtypes.bfloat16)
  assert used
  _close(got, _f64(a) @ _f64(b), "bf16", tol=4e-2)
  with Context(ALLOW_TF32=1):
    got, used = _run(monkeypatch, lambda x, y: x @ y, a, b, dtype=dtypes.float32)
  assert used
  _close(got, _f64(a) @ _f64(b), "tf32", tol=1e-2)
  got, used = _run(monkeypatch, lambda x, y: x @ y, a, b, dtype=dtypes.float32)
  assert not used, "float32 without ALLOW_TF32 ran on tensor cores"
  _close(got, _f64(a) @ _f64(b), "fp32 SIMT", tol=1e-5)

@needs_wmma
def test_convolution_on_the_emulator(monkeypatch):
  import torch
  rng = np.random.default_rng(14)
  x, w = _data(rng, 1, 8, 6, 6), _data(rng, 32, 8, 3, 3)
  got, used = _run(monkeypatch, lambda p, q: p.conv2d(q, padding=1), x, w)
  assert used
  want = torch.nn.functional.conv2d(torch.from_numpy(_f64(x)), torch.from_numpy(_f64(w)), padding=1).numpy()
  _close(got, want, "conv2d")

# ---------------- nvcc / ptxas for sm_90a ----------------

NVCC = shutil.which("nvcc")

def _cuda_renders_wmma() -> bool:
  try: render_with(CUDARenderer(), "m", optimize_for(CUDARenderer(), _lowered(_matmul(64, 64, 64))))
  except (NotImplementedError, SpecError): return False
  return True

def ptxas_report(src: str, folder: str) -> str:
  """nvcc's `ptxas -v` report of a CUDA C kernel built for sm_90a (asserting that it builds)."""
  path = os.path.join(folder, "matmul.cu")
  with open(path, "w") as f: f.write(src)
  built = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v", "-o",
                          os.path.join(folder, "matmul.cubin"), path], capture_output=True, text=True)
  assert built.returncode == 0, built.stderr
  return built.stdout + built.stderr

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("dtype", [dtypes.half, dtypes.bfloat16])
def test_4096_kernel_builds_without_spills(dtype):
  if not _cuda_renders_wmma(): pytest.skip("the CUDA renderer has no WMMA yet")
  renderer = CUDARenderer()
  src = render_with(renderer, "matmul", optimize_for(renderer, _lowered(_matmul(4096, 4096, 4096, dtype))))[0]
  assert src.count("mma.sync.aligned.m16n8k16") >= 32, "fewer than 32 mma.sync a step"
  with tempfile.TemporaryDirectory(prefix="kiln_tc_") as folder:
    report = ptxas_report(src, folder)
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report, report
  registers = int(re.search(r"Used (\d+) registers", report).group(1))
  assert registers <= 128, f"{registers} registers: fewer than 2 blocks of 256 threads fit a multiprocessor"
  shared = int(re.search(r"(\d+) bytes smem", report).group(1))
  assert shared <= 48 << 10, report

# ---------------- on the GPU ----------------

from kiln.runtime import cuda_driver as cuda   # noqa: E402
needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@needs_gpu
@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (256, 512, 128), (1024, 1024, 1024), (100, 72, 40),
                                   (333, 77, 517), (3000, 300, 1000), (2048, 2048, 2048)])
def test_tc_matmul_on_the_gpu(m, k, n, dtype):
  rng = np.random.default_rng(5)
  a, b = rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(np.float32)
  ta, tb = Tensor(a, device="CUDA").cast(dtype), Tensor(b, device="CUDA").cast(dtype)
  want = ta.float().numpy().astype(np.float64) @ tb.float().numpy().astype(np.float64)
  got = (ta @ tb).float().numpy()
  # a float32 sum rounded once to half (bf16): half an ulp of the output plus the sum's rounding
  tol = (2 ** -11 if dtype == "half" else 2 ** -8) * np.abs(want) + 1e-5 * k ** 0.5 + 1e-3
  assert np.all(np.abs(got - want) <= tol), f"{m}x{k}x{n} {dtype}: worst {np.abs(got - want).max()}"

@needs_gpu
def test_tc_epilogue_transposed_batched_tf32_on_the_gpu():
  rng = np.random.default_rng(6)
  f = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)   # noqa: E731
  a, b, bias = f(256, 128), f(256, 128), f(256)
  ta, tb, tz = (Tensor(x, device="CUDA").half() for x in (a, b, bias))
  want = np.maximum(ta.float().numpy().astype(np.float64) @ tb.float().numpy().astype(np.float64).T +
                    tz.float().numpy(), 0)
  got = (ta @ tb.T + tz).relu().float().numpy()
  assert np.abs(got - want).max() <= 2e-2, np.abs(got - want).max()
  x, y = f(4, 128, 64), f(4, 64, 256)
  tx, ty = Tensor(x, device="CUDA").half(), Tensor(y, device="CUDA").half()
  want = tx.float().numpy().astype(np.float64) @ ty.float().numpy().astype(np.float64)
  assert np.abs((tx @ ty).float().numpy() - want).max() <= 2e-2
  with Context(ALLOW_TF32=1):
    got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA").T).numpy()
  assert np.abs(got - a.astype(np.float64) @ b.T.astype(np.float64)).max() <= 2e-2
