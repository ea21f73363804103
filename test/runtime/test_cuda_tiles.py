"""SIMT matmul tiling for the CUDA target (kiln/codegen/gpu_tiles.py) without a GPU: matmul-shaped kernels rendered
for CUDA run in the lockstep emulator (test/runtime/gpu_lockstep.py: every block's threads at once, real shared
memory and barriers) and match NumPy; shapes no tile divides are refused and map one output per thread as before;
the 4096^3 kernel compiles for sm_90a with no spills, 16-byte shared loads and fused multiply-adds only."""
from __future__ import annotations
import os, re, shutil, subprocess, tempfile
import numpy as np
import pytest
from kiln import Tensor
from kiln.codegen import gpu_tiles
from kiln.codegen.gpudims import launch_size
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.uop.ops import Ops
from gpu_lockstep import run_lockstep   # noqa: E402  (test/runtime is on sys.path: pytest's default import mode)

def _emulate(out: Tensor, renderer=None) -> tuple[np.ndarray, list, object]:
  """`out` computed by its kernels as rendered for the CUDA target, run in the lockstep emulator (inputs realized on
  the default device first); returns the result, the last kernel's uops and its launch sizes."""
  renderer = renderer or CUDARenderer()
  uops = launch = arrays = None
  for item in out.schedule():
    if item.ast.op is Ops.COPY:
      item.bufs[0].ensure_allocated().copy_from(item.bufs[1]); continue
    _, uops = render_with(renderer, kernel_name(item.ast), optimize_for(renderer, lower_for_codegen(item.ast)))
    arrays = {k: b.ensure_allocated().numpy() for k, b in enumerate(item.bufs)}
    if arrays[0].dtype.kind == "f": arrays[0][:] = np.nan   # poisoned: an element no thread writes fails the check
    launch = launch_size(uops)
    run_lockstep(uops, launch, arrays, item.var_vals)
    item.bufs[0].copyin(memoryview(arrays[0].view(np.uint8)))
  # the last kernel's output as the emulator wrote it (out.numpy() would compute `out` again on the default device)
  return arrays[0][:out.numel()].reshape(out.shape), uops, launch

def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
  worst = np.abs(got - want).max() if got.size else 0.0
  assert got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-4), \
    f"{what}: shapes {got.shape} vs {want.shape}, worst difference {worst}"

def _tiled(uops) -> bool:
  return any(u.op is Ops.DEFINE_LOCAL and u.arg[0] == "tile_a" for u in uops)

def _data(rng, *shape): return rng.uniform(-1, 1, shape).astype(np.float32)

@pytest.mark.parametrize("m,k,n", [(64, 128, 96), (32, 24, 32), (32, 1024, 32)])
def test_tiled_matmul_matches_numpy(m, k, n):
  rng = np.random.default_rng(m + k + n)
  a, b = _data(rng, m, k), _data(rng, k, n)
  got, uops, launch = _emulate(Tensor(a) @ Tensor(b))
  assert _tiled(uops), f"{m}x{k}x{n} was not tiled"
  bm, bn, _ = gpu_tiles.choose_tile(m, n, k, 1)
  assert launch == ((n // bn, m // bm, 1), (256, 1, 1)), launch
  _check(got, a @ b, f"{m}x{k}x{n}")

def test_largest_tile_and_epilogue(monkeypatch):
  monkeypatch.setattr(gpu_tiles, "MULTIPROCESSORS", 1)   # one block of the 128 x 128 tile, each thread 8 x 8 outputs
  rng = np.random.default_rng(1)
  a, b, bias = _data(rng, 128, 32), _data(rng, 32, 128), _data(rng, 128)
  got, uops, launch = _emulate((Tensor(a) @ Tensor(b) + Tensor(bias)).relu())
  assert _tiled(uops) and launch == ((1, 1, 1), (256, 1, 1)), launch
  _check(got, np.maximum(a @ b + bias, 0), "relu(a @ b + bias)")

def test_transposed_and_batched_operands():
  rng = np.random.default_rng(2)
  a, b = _data(rng, 48, 64), _data(rng, 32, 48)   # a.T @ b.T: A is fastest along m, B along k
  got, uops, _ = _emulate(Tensor(a).T @ Tensor(b).T)
  assert _tiled(uops)
  _check(got, a.T @ b.T, "a.T @ b.T")
  x, y = _data(rng, 3, 32, 16), _data(rng, 3, 16, 64)
  got, uops, launch = _emulate(Tensor(x) @ Tensor(y))
  assert _tiled(uops) and launch[0][2] == 3, launch
  _check(got, x @ y, "batched")

def test_half_inputs():
  rng = np.random.default_rng(3)
  a, b = _data(rng, 32, 64).astype(np.float16), _data(rng, 64, 32).astype(np.float16)
  got, uops, _ = _emulate((Tensor(a).float() @ Tensor(b).float()))
  assert _tiled(uops)
  _check(got, a.astype(np.float32) @ b.astype(np.float32), "half inputs")

@pytest.mark.parametrize("m,k,n", [(100, 64, 64), (64, 20, 64), (64, 64, 30), (200, 100, 150), (97, 13, 131)])
def test_edge_tiles_are_guarded(m, k, n):
  rng = np.random.default_rng(4)
  a, b, bias = _data(rng, m, k), _data(rng, k, n), _data(rng, n)
  got, uops, _ = _emulate((Tensor(a) @ Tensor(b) + Tensor(bias)).relu())   # the epilogue's reads stay in bounds too
  assert _tiled(uops), f"{m}x{k}x{n} was not tiled"
  _check(got, np.maximum(a @ b + bias, 0), f"{m}x{k}x{n}")

def test_guarded_conv_with_odd_pixels():
  import torch
  rng = np.random.default_rng(8)
  x, w = _data(rng, 1, 8, 7, 7), _data(rng, 32, 8, 3, 3)   # m = 49 output pixels
  got, uops, _ = _emulate(Tensor(x).conv2d(Tensor(w), padding=1))
  assert _tiled(uops)
  _check(got, torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy(), "conv 7x7")

@pytest.mark.parametrize("m,k,n", [(1, 64, 64), (7, 64, 64), (64, 3, 64)])
def test_mostly_padding_shapes_are_refused_and_still_right(m, k, n):
  rng = np.random.default_rng(4)
  a, b = _data(rng, m, k), _data(rng, k, n)
  got, uops, _ = _emulate(Tensor(a) @ Tensor(b))
  assert not _tiled(uops), f"{m}x{k}x{n} should not be tiled"
  _check(got, a @ b, f"{m}x{k}x{n}")

def test_other_reductions_are_not_tiled():
  x = Tensor.empty(256, 256)
  for out in (x.sum(axis=1), (x * x).sum(axis=0), x.max(axis=1)):
    item = [i for i in out.schedule() if i.ast.op is not Ops.COPY][-1]
    assert gpu_tiles.matmul_plan(optimize_for(CUDARenderer(), lower_for_codegen(item.ast))) is None

def _render_4096(renderer) -> str:
  a, b = Tensor.empty(4096, 4096, device="PYTHON"), Tensor.empty(4096, 4096, device="PYTHON")
  item = [i for i in (a @ b).schedule() if i.ast.op is not Ops.COPY][-1]
  src, uops = render_with(renderer, "matmul", optimize_for(renderer, lower_for_codegen(item.ast)))
  assert launch_size(uops) == ((32, 32, 1), (256, 1, 1))
  return src

NVCC = shutil.which("nvcc")

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_4096_kernel_is_fma_bound_without_spills():
  src = _render_4096(CUDARenderer())
  with tempfile.TemporaryDirectory(prefix="kiln_tiles_") as folder:
    path = os.path.join(folder, "matmul.cu")
    with open(path, "w") as f: f.write(src)
    built = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v", "-o",
                            os.path.join(folder, "matmul.cubin"), path], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    report = built.stdout + built.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report, report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= 128, f"{registers} registers: fewer than 2 blocks of 256 threads fit a multiprocessor"
    ptx = subprocess.run([NVCC, "-arch=sm_90a", "-ptx", "--fmad=false", "-o", "-", path], capture_output=True,
                         text=True).stdout
  counts = {op: len(re.findall(rf"\b{re.escape(op)}\b", ptx)) for op in
            ("fma.rn.f32", "mul.rn.f32", "add.rn.f32", "ld.shared.v4.f32", "ld.shared.f32", "bar.sync")}
  # a step of 16: 8 x 8 x 16 multiply-adds, (8 + 8) x 16 shared floats read as 16-byte loads, one barrier
  assert counts == {"fma.rn.f32": 1024, "mul.rn.f32": 0, "add.rn.f32": 0, "ld.shared.v4.f32": 64,
                    "ld.shared.f32": 0, "bar.sync": 1}, counts

PTXAS = shutil.which("ptxas")

@pytest.mark.skipif(PTXAS is None, reason="ptxas (CUDA toolkit) not installed")
def test_4096_kernel_as_ptx_assembles_without_spills():
  src = _render_4096(PTXRenderer())
  assert src.count("fma.rn.f32") == 1024 and "bar.sync" in src
  assert src.count("ld.shared.v4.f32") == 64 and "ld.shared.f32" not in src, "shared reads are not 16-byte loads"
  with tempfile.TemporaryDirectory(prefix="kiln_tiles_") as folder:
    path = os.path.join(folder, "matmul.ptx")
    with open(path, "w") as f: f.write(src)
    built = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "-o", os.path.join(folder, "matmul.cubin"), path],
                           capture_output=True, text=True)
  report = built.stdout + built.stderr
  assert built.returncode == 0, report
  assert "0 bytes spill stores, 0 bytes spill loads" in report, report

from kiln.runtime import cuda_driver as cuda   # noqa: E402
needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@needs_gpu
@pytest.mark.parametrize("m,k,n", [(64, 128, 96), (256, 64, 128), (512, 512, 512), (1024, 1024, 1024),
                                   (128, 4096, 128), (100, 64, 64), (2048, 2048, 2048), (1000, 1000, 1000),
                                   (333, 77, 517), (7, 64, 64)])
def test_tiled_matmul_on_the_gpu(m, k, n):
  rng = np.random.default_rng(5)
  a, b = _data(rng, m, k), _data(rng, k, n)
  got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy()
  want = a.astype(np.float64) @ b.astype(np.float64)
  worst = np.abs(got - want).max()
  assert worst <= 2e-6 * k ** 0.5 * 4 + 1e-5, f"{m}x{k}x{n}: worst difference {worst}"

@needs_gpu
def test_tiled_epilogue_transposed_batched_on_the_gpu():
  rng = np.random.default_rng(6)
  a, b, bias = _data(rng, 256, 128), _data(rng, 256, 128), _data(rng, 256)
  got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA").T + Tensor(bias, device="CUDA")).relu().numpy()
  _check(got, np.maximum(a @ b.T + bias, 0), "relu(a @ b.T + bias)")
  x, y = _data(rng, 4, 128, 64), _data(rng, 4, 64, 256)
  _check((Tensor(x, device="CUDA") @ Tensor(y, device="CUDA")).numpy(), x @ y, "batched")

def test_nolocals_turns_tiles_off():
  from kiln.helpers import Context
  a, b = Tensor.empty(64, 64), Tensor.empty(64, 64)
  item = [i for i in (a @ b).schedule() if i.ast.op is not Ops.COPY][-1]
  lowered = optimize_for(CUDARenderer(), lower_for_codegen(item.ast))
  assert gpu_tiles.tile_matmul(lowered) is not None
  with Context(NOLOCALS=1): assert gpu_tiles.tile_matmul(lowered) is None

@pytest.mark.parametrize("channels_out,padding,size", [(32, 1, 8), (64, 0, 10)])
def test_convolution_as_tiles(channels_out, padding, size):
  import torch
  rng = np.random.default_rng(7)
  # m = 2 images x 8 x 8 output pixels (flattened), k = 8 channels x 3 x 3 = 72 (steps of 8)
  x, w = _data(rng, 2, 8, size, size), _data(rng, channels_out, 8, 3, 3)
  got, uops, _ = _emulate(Tensor(x).conv2d(Tensor(w), padding=padding))
  assert _tiled(uops), "the convolution was not tiled"
  want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=padding).numpy()
  _check(got, want, f"conv2d padding {padding}")

def test_the_tile_fills_the_targets_multiprocessors():
  """The tile is chosen for the GPU's multiprocessor count (kiln/runtime/gpu_target.py): a 1024^3 matmul takes
  128x64 tiles on the H200's 132 SMs (128 blocks: one wave) and 128x128 on 16 (64 blocks: four full waves)."""
  from kiln.codegen.gpu_tiles import choose_tile
  assert choose_tile(1024, 1024, 1024, 1) == choose_tile(1024, 1024, 1024, 1, multiprocessors=132) == (128, 64, 16)
  assert choose_tile(1024, 1024, 1024, 1, multiprocessors=16) == (128, 128, 16)
