"""kiln's Hopper GEMM (kiln/codegen/gpu_wgmma.py, WGMMA=1) on the CUDA device beside PyTorch (cuBLAS) in one process.

  python bench/bench_wgmma.py [--reps R] [--sizes 4096,8192] [--dtypes fp16,bf16] [--ptx] [--json PATH]

Each row: `relu(x @ w.T + bias)` (x m x k, w n x k, fp16 and bf16; one fused kernel) at m = n = k = size. The kernel
is built from the lowered kernel of that expression and launched directly (the CUDA device does not yet pass tensor
maps to kernels it launches from a schedule): NVRTC for the GPU's arch, its two tensor maps encoded by
`cuda_driver.TensorMap.for_description`. Its output is checked against PyTorch's `relu(F.linear(x, w, bias))` (all
of it, on the GPU) before its time counts. Times are medians of CUDA events around `reps` launches after 2 warm-ups;
PyTorch's likewise. TFLOP/s count 2*M*N*K.
"""
from __future__ import annotations
import argparse, ctypes, json, os, statistics, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def build(m: int, n: int, k: int, dtype):
  """The linear kernel of relu(x @ w.T + bias) for the Hopper GEMM pass."""
  from kiln import Tensor
  from kiln.codegen import gpu_wgmma
  from kiln.engine.realize import lower_for_codegen
  from kiln.helpers import Context
  from kiln.uop.ops import Ops
  x, w = Tensor.empty(m, k, dtype=dtype, device="PYTHON"), Tensor.empty(n, k, dtype=dtype, device="PYTHON")
  out = (x @ w.T + Tensor.empty(n, dtype=dtype, device="PYTHON")).relu()
  item = [i for i in out.schedule() if i.ast.op is not Ops.COPY][-1]
  with Context(WGMMA=1): uops = gpu_wgmma.wgmma_kernel(lower_for_codegen(item.ast))
  if uops is None: raise ValueError(f"gpu_wgmma refuses {m}x{n}x{k}")
  return uops

class Launcher:
  """The kernel compiled (CUDA C by NVRTC, or with `ptx` kiln's PTX) and loaded on GPU 0 over torch tensors' memory
  (out, x, w, bias by DEFINE_GLOBAL index)."""
  def __init__(self, uops, tensors: dict, ptx: bool = False):
    from kiln.renderer import kernel_signature
    from kiln.renderer.cuda import CUDARenderer
    from kiln.renderer.ptx import PTXRenderer
    from kiln.renderer.shared_memory import dynamic_shared_bytes
    from kiln.runtime import cuda_driver as cuda
    from kiln.uop.ops import Ops
    self.ctx = cuda.Context(0)
    arch = self.ctx.properties.arch
    image = cuda.PTXCompiler(arch).compile(PTXRenderer(arch).render("wgmma_gemm", uops)) if ptx else \
      cuda.NVRTCCompiler(arch).compile(CUDARenderer(arch).render("wgmma_gemm", uops))
    self.module = self.ctx.load(image)
    self.function = self.module.function("wgmma_gemm")
    params = [b.arg for b in kernel_signature(uops)[0]]
    maps = sorted((u for u in uops if u.op is Ops.DEFINE_TENSORMAP), key=lambda u: u.arg[0])
    self.tensormaps = [cuda.TensorMap.for_description(tensors[u.src[0].arg].data_ptr(), u.arg[1]) for u in maps]
    self.args = [ctypes.c_uint64(tensors[key].data_ptr()) for key in params]
    specials = {u.arg[0]: u.arg[1] for u in uops if u.op is Ops.SPECIAL}
    self.grid, self.block = (specials["gidx0"], specials["gidx1"], 1), (specials["lidx0"], 1, 1)
    self.shared = dynamic_shared_bytes(uops)

  def __call__(self) -> None:
    self.function.launch(*self.args, *self.tensormaps, grid=self.grid, block=self.block, shared=self.shared)

  def ms(self, reps: int) -> float:
    """Median GPU milliseconds of one launch."""
    from kiln.runtime import cuda_driver as cuda
    for _ in range(2): self()
    self.ctx.synchronize()
    times = []
    for _ in range(reps):
      start, end = cuda.Event(self.ctx), cuda.Event(self.ctx)
      start.record(); self(); end.record()
      times.append(start.elapsed_ms(end))
      start.close(); end.close()
    return statistics.median(times)

def tensors(m: int, n: int, k: int, dtype: str, seed: int = 0) -> dict:
  """Random torch inputs on the GPU (uniform in [-1, 1)) and an output, by the kernel's buffer index."""
  import torch
  tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
  gen = torch.Generator(device="cuda").manual_seed(seed)
  rand = lambda *shape: (torch.rand(*shape, device="cuda", generator=gen) * 2 - 1).to(tdtype)
  return {0: torch.full((m, n), float("nan"), device="cuda", dtype=tdtype), 1: rand(m, k), 2: rand(n, k),
          3: rand(n)}

def check(out, x, w, bias, dtype: str) -> tuple[float, float]:
  """(worst absolute error of `out` against relu(F.linear) in float32, the reference's largest magnitude);
  AssertionError past 4e-3 (fp16) or 2e-2 (bf16) of that magnitude."""
  import torch
  want = torch.relu(torch.nn.functional.linear(x.float(), w.float(), bias.float()))
  worst, scale = float((out.float() - want).abs().max()), float(want.abs().max())
  tolerance = {"fp16": 4e-3, "bf16": 2e-2}[dtype] * scale
  if not worst <= tolerance: raise AssertionError(f"gpu_wgmma {dtype}: worst error {worst} of {scale}")
  return worst, scale

def row(size: int, dtype: str, reps: int, ptx: bool = False) -> dict:
  """One row: kiln's Hopper GEMM (from CUDA C, or kiln's PTX) and PyTorch's at size^3."""
  import torch
  from kiln import dtypes
  m = n = k = size
  bufs = tensors(m, n, k, dtype, seed=size)
  launch = Launcher(build(m, n, k, {"fp16": dtypes.half, "bf16": dtypes.bfloat16}[dtype]), bufs, ptx)
  launch()
  launch.ctx.synchronize()
  torch.cuda.synchronize()
  worst, scale = check(bufs[0], bufs[1], bufs[2], bufs[3], dtype)
  ms = launch.ms(reps)
  run = lambda: torch.relu(torch.nn.functional.linear(bufs[1], bufs[2], bufs[3]))
  for _ in range(2): run()
  torch.cuda.synchronize()
  times = []
  for _ in range(reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); run(); end.record(); end.synchronize()
    times.append(start.elapsed_time(end))
  torch_time = statistics.median(times)
  flops = 2 * m * n * k
  out = {"size": size, "dtype": dtype, "ptx": ptx, "kiln_ms": ms, "kiln_TFLOPs": flops / ms / 1e9,
         "torch_ms": torch_time, "torch_TFLOPs": flops / torch_time / 1e9, "of_torch": torch_time / ms,
         "worst_abs_error": worst, "scale": scale}
  print(f"wgmma{' ptx' if ptx else ''} {dtype} {size}^3 relu(x@w.T+b)  kiln {ms:8.3f} ms "
        f"{out['kiln_TFLOPs']:7.1f} TFLOP/s   torch {torch_time:8.3f} ms {out['torch_TFLOPs']:7.1f} TFLOP/s   "
        f"{out['of_torch']:6.1%} of torch   (worst error {worst:.3g} of {scale:.3g})", flush=True)
  return out

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--sizes", default="4096,8192")
  parser.add_argument("--dtypes", default="fp16,bf16")
  parser.add_argument("--ptx", action="store_true", help="kiln's PTX renderer instead of CUDA C")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  rows = [row(int(size), dtype, args.reps, args.ptx) for size in args.sizes.split(",")
          for dtype in args.dtypes.split(",")]
  if args.json:
    with open(args.json, "w") as f: json.dump(rows, f, indent=1)

if __name__ == "__main__":
  main()
