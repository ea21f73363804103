"""The kernels of the anchors' transformer forward (4 pre-norm blocks, dim 256, seq 64, batch 4), each timed alone.

Run: `PYTHONPATH=. python bench/bench_transformer_kernels.py` (THREADS=1 for one core). Every distinct kernel of the
forward's schedule is compiled with the heuristics' options, then run `--repeats` times in batches; a kernel's time
is its best batch's mean, in process CPU time with one thread (others share the machine: CPU time is what they
disturb least) and in wall time otherwise. The total weighs each kernel by its launches in one forward.
`kernel_items()` and `time_item()` let a scratch script time forced options (`optimize_kernel(lowered, opts)`).
"""
from __future__ import annotations
import argparse, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench"))
import anchors   # noqa: E402  (the shared anchors define the graph)
from kiln import Tensor   # noqa: E402
from kiln.codegen.opt import optimize_kernel, Opt, Kernel, heuristic_opts   # noqa: E402
from kiln.engine.realize import get_runner, run_schedule, compile_lowered, lower_for_codegen, kernel_name   # noqa: E402
from kiln.runtime.threadpool import thread_count   # noqa: E402
from kiln.schedule.kernelize import create_schedule, ScheduleItem   # noqa: E402

def kernel_items() -> list[tuple[ScheduleItem, int]]:
  """(first schedule item, launches per forward) of each distinct kernel of the forward, buffers filled."""
  x, *params = [Tensor(a) for a in anchors.transformer_inputs(np.random.default_rng(0))]
  out = anchors.transformer_tensor(x, anchors.split_layers(params))
  items = create_schedule([out.uop]).items
  run_schedule(items)
  distinct: dict = {}
  for item in items:
    if item.ast.op.name != "SINK": continue
    first, count = distinct.get(item.ast, (item, 0))
    distinct[item.ast] = (first, count + 1)
  return list(distinct.values())

def item_runner(item: ScheduleItem, opts: list[Opt] | None = None):
  """The compiled kernel of `item`: the heuristics' choice, or `opts` forced."""
  if opts is None: return get_runner(item.bufs[0].device, item.ast)
  return compile_lowered(item.bufs[0].device, kernel_name(item.ast), optimize_kernel(lower_for_codegen(item.ast), opts))

def time_item(item: ScheduleItem, runner, repeats: int = 15, batch: int = 5) -> float:
  """Seconds per launch: the best of `repeats` batches of `batch` launches (CPU time with one thread, else wall)."""
  clock = time.process_time if thread_count() == 1 else time.perf_counter
  runner(item.bufs, item.var_vals)
  best = float("inf")
  for _ in range(repeats):
    start = clock()
    for _ in range(batch): runner(item.bufs, item.var_vals)
    best = min(best, (clock() - start) / batch)
  return best

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15)
  args = parser.parse_args()
  total = 0.0
  print(f"THREADS={thread_count()}  {'kernel':22s} {'launches':>8s} {'us/launch':>10s} {'ms/forward':>10s}  options")
  for item, launches in kernel_items():
    runner = item_runner(item)
    t = time_item(item, runner, args.repeats)
    total += t * launches
    opts = heuristic_opts(Kernel(lower_for_codegen(item.ast)))
    print(f"           {runner.name:22s} {launches:8d} {t * 1e6:10.1f} {t * launches * 1e3:10.2f}  {opts}")
  print(f"sum of kernel times per forward: {total * 1e3:.2f} ms")

if __name__ == "__main__": main()
