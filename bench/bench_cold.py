"""Compile time of the anchors' cold transformer graph (4 layers, dim 256, seq 64, batch 4): the first call with an
empty kernel cache, the first call with every binary already cached but codegen run again (kiln's own Python work
per kernel plus loading), the first call with the codegen results cached too (kiln/engine/codegen_cache.py), and the
second call in the same process.

Run: PYTHONPATH=. python bench/bench_cold.py [--runs N]

Each measurement runs in a fresh process (a warm process would find its kernels in memory). The cold run gets a new,
empty CACHEDB folder; the warm-cache runs reuse it. "python" is the first call with CODEGEN_CACHE=0 minus the
kernels' own run time (the second call's time): the codegen work per distinct kernel that the binary cache alone
cannot save. The warm-cache
call's CPU time (every thread of the process, no compiler) is printed next to it, and the cold call's CPU time in
this process and in the compilers it ran: a busy machine disturbs those less than the wall-clock times.
"""
from __future__ import annotations
import argparse, json, os, pathlib, subprocess, sys, tempfile

ANCHORS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "bench"

# the child: build the graph once, time its first and second realize, report the distinct kernels it compiled
CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import anchors
from kiln import Tensor, GlobalCounters
from kiln.engine.realize import _runner_cache
x, *params = [Tensor(a) for a in anchors.transformer_inputs(np.random.default_rng(0))]
start, cpu_start = time.perf_counter(), time.process_time()
anchors.transformer_tensor(x, anchors.split_layers(params)).realize()
first, first_cpu = time.perf_counter() - start, time.process_time() - cpu_start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
compiler_cpu = usage.ru_utime + usage.ru_stime
launches = GlobalCounters.kernel_count
start = time.perf_counter()
anchors.transformer_tensor(x, anchors.split_layers(params)).realize()
second = time.perf_counter() - start
print(json.dumps({"first": first, "first_cpu": first_cpu, "compiler_cpu": compiler_cpu, "second": second, "kernels": len(_runner_cache), "launches": launches}))
"""

def run_child(cache: str, codegen_cache: bool = True) -> dict:
  """One fresh process with CACHEDB=`cache` (and the codegen cache on or off); its timings."""
  env = {**os.environ, "CACHEDB": cache, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1]),
         "CODEGEN_CACHE": "1" if codegen_cache else "0"}
  out = subprocess.run([sys.executable, "-c", CHILD, str(ANCHORS)], env=env, capture_output=True, text=True,
                       timeout=600)
  if out.returncode != 0: raise RuntimeError(f"bench_cold: the child process failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=1, help="cold/warm pairs to run (the best of each is printed)")
  args = parser.parse_args()
  if not (ANCHORS / "anchors.py").exists(): raise SystemExit(f"bench_cold: {ANCHORS / 'anchors.py'} not found")
  colds, warms, codegens = [], [], []
  for _ in range(args.runs):
    with tempfile.TemporaryDirectory(prefix="kiln_bench_cold_") as folder:
      cache = os.path.join(folder, "cache")
      colds.append(run_child(cache))
      codegens.append(run_child(cache, codegen_cache=False))
      warms.append(run_child(cache))
  def best(runs: list[dict]) -> dict: return min(runs, key=lambda r: r["first"])
  cold, warm, codegen = best(colds), best(warms), best(codegens)
  python = codegen["first"] - min(r["second"] for r in warms + codegens)
  print(f"load average {os.getloadavg()[0]:.2f}; {cold['kernels']} distinct kernels, {cold['launches']} launches")
  print(f"cold first call (empty cache)   {cold['first']:7.3f} s (CPU time: this process {cold['first_cpu']:.3f} s, "
        f"compilers {cold['compiler_cpu']:.3f} s)")
  print(f"binaries cached, codegen again   {codegen['first']:7.3f} s")
  print(f"  python (codegen, no compiler) {python:7.3f} s = {python / max(1, codegen['kernels']) * 1e3:.1f} ms per "
        f"kernel (process CPU time of the first call: {codegen['first_cpu']:.3f} s)")
  print(f"warm-cache first call           {warm['first']:7.3f} s (codegen cached too; process CPU time "
        f"{warm['first_cpu']:.3f} s)")
  print(f"second call                     {min(r['second'] for r in warms + codegens) * 1e3:7.1f} ms")

if __name__ == "__main__":
  main()
