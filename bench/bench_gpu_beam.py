"""BEAM over the GPU optimizer actions on CUDA: each row's kernel timed with the heuristics' actions, then searched
(BEAM=2, a fresh search database) and timed with the winner; the winner's actions are printed.

  python bench/bench_gpu_beam.py [--reps R] [--timeout S]

Times are CUDA events around each launch (bench_cuda.py `kiln_ms`: median of R runs after 2 warm-ups). The winner's
result is checked against the heuristics' kernel's.
"""
from __future__ import annotations
import argparse, contextlib, io, os, re, sys, tempfile, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import kiln_ms   # noqa: E402

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=10)
  parser.add_argument("--timeout", type=float, default=20.0, help="BEAM_TIMEOUT: seconds a search may take")
  parser.add_argument("--only", default="", help="row names containing this text only")
  parser.add_argument("--no-beam", action="store_true", help="time the heuristics' kernels only")
  args = parser.parse_args()
  os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="kiln_beam_"))   # a fresh search database
  from kiln import Tensor, Device
  from kiln.helpers import Context
  from kiln.engine import realize
  Device.DEFAULT = "CUDA"
  n = 1 << 24
  x = ((Tensor.arange(n, device="CUDA") * 7 % 1000).float() * 0.004 - 2.0).realize()
  cases = {   # name: (function of x, bytes read and written once)
    "row sums 4096x4096": (lambda: x.reshape(4096, 4096).sum(1), 4 * n + 4 * 4096),
    "column sums 4096x4096": (lambda: x.reshape(4096, 4096).sum(0), 4 * n + 4 * 4096),
    "full sum 16M": (lambda: x.sum(), 4 * n),
    "softmax 4096x4096": (lambda: x.reshape(4096, 4096).softmax(1), 8 * n),
    "elementwise 16M": (lambda: ((x * 2 + 1).relu() * 0.5).exp(), 8 * n),
    "rows of 512, 32768 rows": (lambda: x.reshape(32768, 512).max(1), 4 * n + 4 * 32768),
  }
  for name, (make, moved) in cases.items():
    if args.only and args.only not in name: continue
    realize._runner_cache.clear()
    base_ms, kernels, base_out = kiln_ms(make, args.reps)
    want = base_out.numpy()
    if args.no_beam:
      print(f"{name:26s} heuristics {base_ms:8.3f} ms {moved / base_ms / 1e6:7.1f} GB/s ({kernels} kernels)",
            flush=True)
      continue
    realize._runner_cache.clear()
    log = io.StringIO()
    start = time.perf_counter()
    with Context(BEAM=2, DEBUG=1, BEAM_TIMEOUT=args.timeout), contextlib.redirect_stdout(log): got = make().numpy()
    search_s = time.perf_counter() - start
    winners = re.findall(r"BEAM=2: (\[.*?\]) in", log.getvalue())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    def searched():
      with Context(BEAM=2): return make().realize()
    beam_ms, _, _ = kiln_ms(searched, args.reps)
    print(f"{name:26s} heuristics {base_ms:8.3f} ms {moved / base_ms / 1e6:7.1f} GB/s | BEAM=2 {beam_ms:8.3f} ms "
          f"{moved / beam_ms / 1e6:7.1f} GB/s ({kernels} kernels, search {search_s:5.1f} s) winner {winners}",
          flush=True)

if __name__ == "__main__": main()
