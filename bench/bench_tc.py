"""kiln's tensor-core matmuls (kiln/codegen/gpu_mma.py) on the CUDA device beside PyTorch (cuBLAS) in one process.

  python bench/bench_tc.py [--reps R] [--rows NAME,...] [--json PATH]

Rows: fp16 and bf16 matmuls of 8192^3, 4096^3, M=512 K=4096 N=14336 (a prefill's projection), 3000^3 (ragged edges)
and 4096^3 with a fused bias+GELU epilogue (`(a @ b + bias).gelu()`, one kernel); tf32 4096^3 under ALLOW_TF32=1
(PyTorch with allow_tf32). Times are medians of CUDA events around each kiln launch (DEBUG=2, bench_cuda.kiln_ms) and
around each PyTorch call, after 2 warm-ups. Each kiln output is checked against a float64 product of the same
inputs (64 rows, on the GPU) before its time counts. TFLOP/s count 2*M*N*K.
"""
from __future__ import annotations
import argparse, json, os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import kiln_ms, torch_ms   # noqa: E402

SHAPES = {"8192^3": (8192, 8192, 8192), "4096^3": (4096, 4096, 4096), "512x4096x14336": (512, 4096, 14336),
          "3000^3": (3000, 3000, 3000)}
CHECKED_ROWS = 64

def gemm_row(name: str, dtype: str, m: int, k: int, n: int, reps: int, epilogue: bool = False) -> dict:
  """One row: kiln's `a @ b` (or `(a @ b + bias).gelu()`) of `dtype` vs PyTorch's, both checked against float64."""
  import torch
  from kiln import Tensor, dtypes
  from kiln.helpers import Context
  kdtype = {"fp16": dtypes.half, "bf16": dtypes.bfloat16, "tf32": dtypes.float32}[dtype]
  tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[dtype]
  gen = torch.Generator(device="cuda").manual_seed(m + k + n)
  ta = (torch.rand(m, k, device="cuda", generator=gen) * 2 - 1).to(tdtype)
  tb = (torch.rand(k, n, device="cuda", generator=gen) * 2 - 1).to(tdtype)
  tz = (torch.rand(n, device="cuda", generator=gen) * 2 - 1).to(tdtype)
  # the same values in kiln (a float32 copy of half or bfloat16 is exact, and so is the cast back)
  a, b, bias = (Tensor(x.float().cpu().numpy(), device="CUDA").cast(kdtype).realize() for x in (ta, tb, tz))
  make = (lambda: (a @ b + bias).gelu()) if epilogue else (lambda: a @ b)
  with Context(ALLOW_TF32=int(dtype == "tf32")):
    ms, kernels, out = kiln_ms(make, reps)
  want = ta[:CHECKED_ROWS].double() @ tb.double()
  if epilogue: want = torch.nn.functional.gelu(want + tz.double(), approximate="tanh")
  got = out[:CHECKED_ROWS].float().numpy().astype(np.float64)
  worst = float(np.abs(got - want.cpu().numpy()).max())
  scale = float(want.abs().max())
  tolerance = {"fp16": 4e-3, "bf16": 2e-2, "tf32": 4e-3}[dtype] * scale
  if not worst <= tolerance:
    raise AssertionError(f"{name} {dtype}: kiln's output differs from float64 by {worst} (scale {scale})")
  saved = torch.backends.cuda.matmul.allow_tf32
  torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
  try:
    run = (lambda: torch.nn.functional.gelu(ta @ tb + tz, approximate="tanh")) if epilogue else (lambda: ta @ tb)
    torch_time = torch_ms(run, reps)
  finally: torch.backends.cuda.matmul.allow_tf32 = saved
  flops = 2 * m * n * k
  row = {"name": name, "dtype": dtype, "kiln_ms": ms, "kiln_TFLOPs": flops / ms / 1e9, "kernels": kernels,
         "torch_ms": torch_time, "torch_TFLOPs": flops / torch_time / 1e9, "of_torch": torch_time / ms,
         "worst_abs_error": worst, "scale": scale}
  print(f"{dtype} {name:22s} kiln {ms:8.3f} ms {row['kiln_TFLOPs']:7.1f} TFLOP/s ({kernels} kernel"
        f"{'s' if kernels != 1 else ''})   torch {torch_time:8.3f} ms {row['torch_TFLOPs']:7.1f} TFLOP/s   "
        f"{row['of_torch']:6.1%} of torch   (worst error {worst:.3g} of {scale:.3g})", flush=True)
  return row

def all_rows() -> list[tuple[str, str, tuple[int, int, int], bool]]:
  """(name, dtype, (m, k, n), epilogue) of every row, in order."""
  rows = []
  for dtype in ("fp16", "bf16"):
    rows += [(name, dtype, shape, False) for name, shape in SHAPES.items()]
    rows.append(("4096^3 +bias+gelu", dtype, SHAPES["4096^3"], True))
  rows.append(("4096^3", "tf32", SHAPES["4096^3"], False))
  return rows

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=10)
  parser.add_argument("--rows", default="", help="comma-separated 'dtype name' prefixes to run (default: all)")
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  wanted = [w.strip() for w in args.rows.split(",") if w.strip()]
  results = []
  for name, dtype, (m, k, n), epilogue in all_rows():
    if wanted and not any(f"{dtype} {name}".startswith(w) for w in wanted): continue
    try: results.append(gemm_row(name, dtype, m, k, n, args.reps, epilogue))
    except Exception as error:   # a failing row is reported and the others still run
      print(f"{dtype} {name}: FAILED: {type(error).__name__}: {str(error)[:400]}", flush=True)
      results.append({"name": name, "dtype": dtype, "error": f"{type(error).__name__}: {str(error)[:400]}"})
  if args.json:
    with open(args.json, "w") as f: json.dump(results, f, indent=1)

if __name__ == "__main__":
  main()
