"""kiln's flash-style attention kernel (kiln/codegen/gpu_attention.py) beside PyTorch's SDPA in one process.

  python bench/bench_attention_cuda.py [--shape B H S D] [--reps R] [--json PATH]

fp16 q, k, v of shape (B, H, S, D), random normal; `scaled_dot_product_attention` plain and causal, by the
tensor-core kernel and the SIMT one (--tiles). Each kiln output is
checked first: against float64 on the first heads, and against PyTorch's output everywhere. Times: the median of R
runs after 2 warm-ups, CUDA events around each kiln launch (DEBUG=2) and around each eager PyTorch call. TFLOP/s
count 4*B*H*S*S*D flops (half of that for causal, as PyTorch's benchmarks do).
"""
from __future__ import annotations
import argparse, json, math, statistics

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", type=int, nargs=4, default=(8, 16, 4096, 128), metavar=("B", "H", "S", "D"))
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--json", default="")
  parser.add_argument("--tiles", default="tc,64x32", help="kernels to time (commas; each compiled anew): tc (the "
                      "tensor-core kernel, kiln/codegen/gpu_attention.py flash_attention_tc), tcN (it with key blocks "
                      "of N: TC_BN), or BMxBN (the SIMT kernel's BM, BN tiles)")
  args = parser.parse_args()
  from kiln.codegen import gpu_attention
  from kiln.engine import realize
  from kiln.engine.codegen_cache import CODEGEN_CACHE
  CODEGEN_CACHE.value = 0   # (nor from the disk cache of rendered kernels)
  import torch
  from kiln import Tensor, GlobalCounters
  from kiln.helpers import Context
  b, h, s, d = args.shape
  gen = torch.Generator(device="cuda").manual_seed(0)
  q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
  kq, kk, kv = (Tensor(t.cpu().numpy(), device="CUDA").realize() for t in (q, k, v))
  rows = []
  for tile, causal in [(t, c) for t in args.tiles.split(",") for c in (False, True)]:
    gpu_attention.TC, gpu_attention.TC_BN = tile.startswith("tc"), int(tile[2:] or 0) if tile.startswith("tc") else 0
    if not gpu_attention.TC: gpu_attention.BM, gpu_attention.BN = (int(x) for x in tile.split("x"))
    realize._runner_cache.clear()   # the kernel's AST is the same: build it anew for this tile
    def make(): return kq.scaled_dot_product_attention(kk, kv, is_causal=causal)
    times, kernels, out = [], 0, None
    for i in range(args.reps + 2):
      GlobalCounters.reset()
      with Context(DEBUG=2): out = make().realize()
      if i >= 2: times.append(GlobalCounters.time_sum_s * 1e3)
      kernels = GlobalCounters.kernel_count
    got = torch.from_numpy(out.numpy()).cuda()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    heads = min(h, 2)
    q64, k64, v64 = (t[0, :heads].double() for t in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(d)
    if causal: scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device="cuda").tril(), -math.inf)
    exact = scores.softmax(-1) @ v64
    err64 = (got[0, :heads].double() - exact).abs().max().item()
    err_torch = (got.float() - want.float()).abs().max().item()
    torch_err64 = (want[0, :heads].double() - exact).abs().max().item()
    assert err64 < 1e-2 and err_torch < 2e-2, \
      f"causal={causal}: worst difference {err64} (float64), {err_torch} (torch)"
    for _ in range(2): torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch_times = []
    for _ in range(args.reps):
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      start.record(); torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal); end.record()
      end.synchronize()
      torch_times.append(start.elapsed_time(end))
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    kiln_ms, torch_ms = statistics.median(times), statistics.median(torch_times)
    row = {"name": f"sdpa fp16 B{b} H{h} S{s} D{d}{' causal' if causal else ''}", "tile": tile, "kiln_ms": kiln_ms,
           "kiln_TFLOPs": flops / kiln_ms / 1e9, "kernels": kernels, "torch_ms": torch_ms,
           "torch_TFLOPs": flops / torch_ms / 1e9, "kiln_vs_torch": torch_ms / kiln_ms, "err_float64": err64,
           "torch_err_float64": torch_err64, "err_vs_torch": err_torch, "kiln_runs_ms": times}
    rows.append(row)
    print(f"{row['name']}, tile {tile}: kiln {kiln_ms:.3f} ms {row['kiln_TFLOPs']:.2f} TFLOP/s ({kernels} kernels), "
          f"torch "
          f"{torch_ms:.3f} ms {row['torch_TFLOPs']:.1f} TFLOP/s, kiln/torch {row['kiln_vs_torch']:.3f}; worst "
          f"difference {err64:.2e} vs float64 (torch {torch_err64:.2e}), {err_torch:.2e} vs torch")
  if args.json:
    with open(args.json, "w") as f: json.dump(rows, f, indent=1)

if __name__ == "__main__":
  main()
