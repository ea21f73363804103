"""Embedding lookups with and without the gather rewrite (kiln/codegen/gather.py).

  python bench/bench_gather.py            # both: the one-hot loop over the table ("before") and the load ("after")
  python bench/bench_gather.py --after    # only the rewritten kernels (the "before" runs take seconds each)

Each row times `emb(idx).realize()` on a realized table and index after one warm-up call (which compiles), best of
a few runs; "before" turns the rewrite off for the whole process by swapping the hook in kiln/engine/realize.py.
"""
from __future__ import annotations
import argparse, time
import numpy as np
from kiln import Tensor, nn
from kiln.engine import realize
from kiln.codegen.gather import rewrite_gathers

CASES = [(32000, 256, 512), (49152, 576, 1), (49152, 576, 64)]

def time_lookup(vocab: int, embed: int, tokens: int, runs: int) -> float:
  """Best wall time in seconds of one lazy lookup realized, after a warm-up call that compiles the kernel."""
  emb = nn.Embedding(vocab, embed)
  emb.weight.realize()
  idx = Tensor(np.random.default_rng(0).integers(0, vocab, tokens).astype(np.int32)).realize()
  expected = emb.weight.numpy()[idx.numpy()]
  got = emb(idx).numpy()   # warm-up (compiles) and check
  if not np.array_equal(got, expected): raise RuntimeError(f"bench_gather: wrong rows for Embedding({vocab}, {embed})")
  best = float("inf")
  for _ in range(runs):
    start = time.perf_counter()
    emb(idx).realize()
    best = min(best, time.perf_counter() - start)
  return best

def set_rewrite(enabled: bool) -> None:
  """Turn the gather rewrite on or off for the kernels compiled from now on."""
  realize.rewrite_gathers = rewrite_gathers if enabled else (lambda lowered: lowered)
  realize._runner_cache.clear()

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--after", action="store_true", help="skip the slow runs without the rewrite")
  args = parser.parse_args()
  print(f"{'lookup':32s} {'before':>10s} {'after':>10s} {'speedup':>8s}")
  for vocab, embed, tokens in CASES:
    before = None
    if not args.after:
      set_rewrite(False)
      before = time_lookup(vocab, embed, tokens, runs=1)
    set_rewrite(True)
    after = time_lookup(vocab, embed, tokens, runs=20)
    label = f"Embedding({vocab}, {embed}) x {tokens}"
    if before is None: print(f"{label:32s} {'-':>10s} {after * 1e3:8.3f}ms")
    else: print(f"{label:32s} {before * 1e3:8.1f}ms {after * 1e3:8.3f}ms {before / after:7.0f}x")

if __name__ == "__main__":
  main()
