"""BEAM search vs the heuristics on an N x N float32 matmul: GFLOP/s of `(a @ b).realize()` (best of 5) with the
default heuristics, then under `Context(BEAM=4)` (the search runs on the first call and is cached in beam.db).

  python bench/bench_beam.py 512
  XDG_CACHE_HOME=/tmp/beamcache python bench/bench_beam.py 1024   # a fresh cache: the search really runs
"""
import sys, time
from kiln import Tensor, Context

def gflops(a: Tensor, b: Tensor, n: int) -> float:
  """Best-of-5 GFLOP/s of a @ b after one warm-up call (which compiles, and searches under BEAM)."""
  (a @ b).realize()
  best = float("inf")
  for _ in range(5):
    start = time.perf_counter()
    (a @ b).realize()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best / 1e9

if __name__ == "__main__":
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 512
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  print(f"matmul {n}: heuristics {gflops(a, b, n):.1f} GFLOP/s")
  start = time.perf_counter()
  with Context(BEAM=4, DEBUG=1): beam = gflops(a, b, n)
  print(f"matmul {n}: BEAM=4 {beam:.1f} GFLOP/s (first call incl. search: {time.perf_counter() - start:.1f} s)")
