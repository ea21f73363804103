"""Where splitting a CPU kernel across the thread pool starts to pay: per-launch time of an elementwise op and a row
sum at growing sizes, on one thread and on the pool, next to each kernel's work estimate (uops per launch).

Run: `python bench/bench_threads.py` (the pool has THREADS threads, default one per core). "pool" splits every launch
across all threads; by default kiln gives each thread at least MIN_WORK_PER_THREAD uops (kiln/runtime/threadpool.py),
and this table is how that number was chosen.

`python bench/bench_threads.py reductions` times full and few-output reductions rendered as one sequential loop (as
before split reductions existed) and as a split reduction on the pool, in GB/s of input read.
"""
from __future__ import annotations
import sys, time
import numpy as np
from kiln import Context, Tensor
from kiln.schedule.kernelize import create_schedule
from kiln.engine.realize import get_runner
from kiln.runtime import ops_cpu
from kiln.runtime.threadpool import MIN_WORK_PER_THREAD, thread_count

def per_launch_seconds(out: Tensor, launches: int) -> tuple[float, float, int]:
  """(one thread, pool) best per-launch time of the one kernel computing `out`, and the kernel's work estimate."""
  items = create_schedule([out.uop]).items
  if len(items) != 1: raise RuntimeError(f"expected one kernel, got {len(items)}")
  item = items[0]
  for b in item.bufs: b.allocate()
  runner = get_runner(item.bufs[0].device, item.ast)
  results = []
  saved = ops_cpu.MIN_WORK_PER_THREAD
  try:
    for minimum in (1 << 62, 1):
      ops_cpu.MIN_WORK_PER_THREAD = minimum
      runner(item.bufs, item.var_vals)
      best = float("inf")
      for _ in range(5):
        start = time.perf_counter()
        for _ in range(launches): runner(item.bufs, item.var_vals)
        best = min(best, (time.perf_counter() - start) / launches)
      results.append(best)
  finally: ops_cpu.MIN_WORK_PER_THREAD = saved
  return results[0], results[1], runner.program.work

def main() -> None:
  print(f"THREADS={thread_count()} MIN_WORK_PER_THREAD={MIN_WORK_PER_THREAD}")
  print(f"{'kernel':28s} {'work':>10s} {'1 thread':>12s} {'pool':>12s}  speedup")
  for n in (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20):
    x = Tensor(np.ones(n, np.float32)).realize()
    m = Tensor(np.ones((n // 64, 64), np.float32)).realize()
    for name, out in ((f"x*x+1, {n} elements", x * x + 1), (f"row sum ({n // 64}, 64)", m.sum(axis=1))):
      one, pool, work = per_launch_seconds(out, max(10, (1 << 22) // n))
      print(f"{name:28s} {work:10d} {one * 1e6:9.2f} us {pool * 1e6:9.2f} us  {one / pool:5.2f}x")

def reduction_seconds(out: Tensor, split: bool, launches: int = 10) -> float:
  """Best time of the one kernel computing `out`, rendered with or without the split reduction (a fresh runner)."""
  from kiln.engine import realize
  items = create_schedule([out.uop]).items
  if len(items) != 1: raise RuntimeError(f"expected one kernel, got {len(items)}")
  item = items[0]
  for b in item.bufs: b.allocate()
  realize._runner_cache.clear()
  with Context(SPLIT_REDUCEOP=int(split)): runner = get_runner(item.bufs[0].device, item.ast)
  realize._runner_cache.clear()
  if split and not runner.program.chunks: raise RuntimeError("the kernel did not become a split reduction")
  runner(item.bufs, item.var_vals)
  best = float("inf")
  for _ in range(launches):
    start = time.perf_counter()
    runner(item.bufs, item.var_vals)
    best = min(best, time.perf_counter() - start)
  return best

def reductions() -> None:
  """GB/s of the reductions that used to run on one core, before and after splitting them."""
  print(f"THREADS={thread_count()}")
  print(f"{'reduction':34s} {'one loop':>12s} {'split':>12s}  speedup")
  big = Tensor(np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)).realize()
  square = Tensor(np.random.default_rng(1).standard_normal((4096, 4096)).astype(np.float32)).realize()
  cube = Tensor(np.random.default_rng(2).standard_normal((256, 8, 8192)).astype(np.float32)).realize()
  ints = Tensor(np.random.default_rng(3).integers(-99, 99, 1 << 24).astype(np.int32)).realize()
  for name, out in (("sum 16M float32", big.sum()), ("max 16M float32", big.max()), ("sum 16M int32", ints.sum()),
                    ("mean (256,8,8192) axis=(0,2)", cube.mean(axis=(0, 2))),
                    ("column sum 4096x4096", square.sum(axis=0))):
    try: one, split = reduction_seconds(out, False), reduction_seconds(out, True)
    except RuntimeError as e:
      print(f"{name:34s} not split ({e})")
      continue
    gigabytes = (1 << 24) * 4 / 1e9   # every input holds 16M 4-byte elements
    print(f"{name:34s} {gigabytes / one:8.1f} GB/s {gigabytes / split:8.1f} GB/s  {one / split:5.2f}x")

if __name__ == "__main__":
  if sys.argv[1:] == ["reductions"]: reductions()
  else: main()
