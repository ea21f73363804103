"""CPU kernel speed: float32 matmul 256/512/1024/2048 (2048 is cache-blocked by the heuristics: SPLIT + KBLOCK),
a 1M-element elementwise op and a 4096x4096 row sum, kiln vs NumPy.

Run: `python bench/bench_matmul.py` (heuristics on) and `NOOPT=1 python bench/bench_matmul.py` (unoptimized kernels);
`THREADS=1 python bench/bench_matmul.py` runs every kernel on one core (default: one thread per core). The last rows
are the thread pool's cost per launch: a 64-element kernel run on one thread and split across the pool.
Times are the best of several runs of the kernel alone (scheduling and compiling happen before timing); the "whole
call" row under each matmul times `(a @ b).realize()`, its operand packs and Python included; GFLOP/s counts
2*n^3 for a matmul, GB/s counts the bytes read and written once.
"""
from __future__ import annotations
import time
import numpy as np
from kiln import Tensor
from kiln.helpers import NOOPT
from kiln.runtime import ops_cpu
from kiln.runtime.threadpool import thread_count
from kiln.schedule.kernelize import create_schedule
from kiln.engine.realize import get_runner

def best_time(fn, repeats: int) -> float:
  """The fastest of `repeats` calls of fn(), in seconds (after one warm-up call)."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)

def kiln_call_time(fn, repeats: int) -> float:
  """Best time of `fn().realize()`: the whole call, its operand packs (kiln/schedule/pack.py) and Python included,
  each kernel reading what the previous one wrote as in a real program (kiln_kernel_time repeats one warm kernel)."""
  return best_time(lambda: fn().realize(), repeats)

def kiln_kernel_time(out: Tensor, repeats: int) -> float:
  """Best time of the single kernel that computes `out` (inputs already realized)."""
  items = create_schedule([out.uop]).items
  if len(items) != 1: raise RuntimeError(f"expected one kernel, got {len(items)}")
  item = items[0]
  for b in item.bufs: b.allocate()
  runner = get_runner(item.bufs[0].device, item.ast)
  return best_time(lambda: runner(item.bufs, item.var_vals), repeats)

def row(name: str, kiln_s: float, numpy_s: float, work: float, unit: str) -> None:
  """One line of the table: times in ms and throughput in `unit` (work per second / 1e9)."""
  print(f"{name:26s} kiln {kiln_s * 1e3:9.3f} ms {work / kiln_s / 1e9:8.2f} {unit}   "
        f"numpy {numpy_s * 1e3:9.3f} ms {work / numpy_s / 1e9:8.2f} {unit}")

def pool_overhead(launches: int = 2000) -> None:
  """Per-launch time of a tiny split kernel on one thread and on the pool: the difference is the pool's cost."""
  x = Tensor(np.ones(64, np.float32)).realize()
  out = x * 2
  items = create_schedule([out.uop]).items
  for b in items[0].bufs: b.allocate()
  runner = get_runner(items[0].bufs[0].device, items[0].ast)
  saved = ops_cpu.MIN_WORK_PER_THREAD
  try:
    for label, minimum in (("one thread", 1 << 62), (f"pool of {thread_count()}", 1)):
      ops_cpu.MIN_WORK_PER_THREAD = minimum
      per_launch = best_time(lambda: [runner(items[0].bufs, items[0].var_vals) for _ in range(launches)], 3) / launches
      print(f"{'tiny kernel, ' + label:26s} {per_launch * 1e6:9.2f} us per launch")
  finally: ops_cpu.MIN_WORK_PER_THREAD = saved

def main() -> None:
  rng = np.random.default_rng(0)
  print(f"NOOPT={int(NOOPT.value)} THREADS={thread_count()}")
  for n in (256, 512, 1024, 2048):
    a_np, b_np = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    out = a @ b
    np.testing.assert_allclose(out.numpy(), a_np @ b_np, atol=1e-3 * n ** 0.5, rtol=1e-3)
    repeats = 3 if n >= 2048 else 5 if n >= 1024 else 10
    numpy_s = best_time(lambda: a_np @ b_np, repeats)
    kernel = [it for it in create_schedule([(a @ b).uop]).items if it.ast.op.name == "SINK"][-1]
    for buf in kernel.bufs: buf.allocate()
    runner = get_runner(kernel.bufs[0].device, kernel.ast)
    row(f"matmul {n}x{n}x{n}", best_time(lambda: runner(kernel.bufs, kernel.var_vals), repeats), numpy_s, 2 * n ** 3,
        "GFLOP/s")
    row(f"  whole call (packs too)", kiln_call_time(lambda: a @ b, repeats), numpy_s, 2 * n ** 3, "GFLOP/s")
  x_np, y_np = rng.standard_normal(1 << 20, dtype=np.float32), rng.standard_normal(1 << 20, dtype=np.float32)
  x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
  row("elementwise x*y+x (1M)", kiln_kernel_time(x * y + x, 50), best_time(lambda: x_np * y_np + x_np, 50),
      3 * 4 * (1 << 20), "GB/s")
  m_np = rng.standard_normal((4096, 4096), dtype=np.float32)
  m = Tensor(m_np).realize()
  np.testing.assert_allclose(m.sum(axis=1).numpy(), m_np.sum(axis=1), atol=1e-2, rtol=1e-3)
  row("row sum 4096x4096", kiln_kernel_time(m.sum(axis=1), 10), best_time(lambda: m_np.sum(axis=1), 10),
      4 * 4096 * 4097, "GB/s")
  row("column sum 4096x4096", kiln_kernel_time(m.sum(axis=0), 10), best_time(lambda: m_np.sum(axis=0), 10),
      4 * 4096 * 4097, "GB/s")
  pool_overhead()

if __name__ == "__main__":
  main()
