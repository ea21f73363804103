"""Per-kernel CPU time of the eager ResNet-50 step (bench/bench_resnet.py): every kernel of the second step's schedule
timed alone on one thread, grouped by what it computes, and the same step's ops in PyTorch (torch.profiler, one thread).

Run: PYTHONPATH=. python bench/bench_resnet_kernels.py [--repeats N] [--top K] [--no-torch] [--batch B] [--size S]

The first step runs as the benchmark runs it (cold: graphs, schedules, compiles); the second step's schedule is run in
order, and after each kernel runs it is launched again `--repeats` times with THREADS=1 and its best CPU time counts
(the optimizer's in-place kernels run again over their results: the time is the same, the values do not matter).
On a shared machine the one-thread CPU time of a kernel moves far less than a two-thread step's wall clock, so the
summed kernels are the figure to compare heuristic changes by. Kernels are grouped by the ops they fused (the
schedule item's metadata) and their shape (`--groups`); `--top` lists the slowest kernels with their GFLOP/s; `--two-threads` adds each kernel's wall time at
THREADS=2 (wall clock: meaningful on a quiet machine only); `--json FILE` writes every kernel's name, metadata, source
digest and time, so two trees compare kernel by kernel (the unchanged sources show how much the machine's load moved).
PyTorch's side: the same network and data, `torch.set_num_threads(1)`, one warm step under torch.profiler, its
self CPU time per op.
"""
from __future__ import annotations
import argparse, collections, hashlib, json, math, os, pathlib, sys, time
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_resnet   # noqa: E402 (the model and its torch twin)
from kiln import Tensor   # noqa: E402
from kiln.helpers import Context   # noqa: E402
from kiln.nn.optim import SGD   # noqa: E402
from kiln.nn.state import get_parameters   # noqa: E402
import kiln.tensor as kiln_tensor   # noqa: E402
from kiln.engine.realize import get_runner, run_schedule   # noqa: E402

sources: list[str] = []   # each timed kernel's source digest, in the order of the rows (`--json`)

def _cpu_time(fn) -> float:
  start = time.process_time()
  fn()
  return time.process_time() - start

def kernel_kind(name: str, ops: int, batch: int) -> str:
  """A coarse label of what a kernel computes, from its name (its output shape, 'r_' if it reduces) and its ALU ops
  per output: a conv's forward or input gradient (per-image output, a long multiply-add sum per element), a conv's
  weight gradient (no image axis first), other reductions (BatchNorm's statistics and their gradients, the loss),
  elementwise kernels."""
  sizes = [int(s) for s in name.split("_")[1:] if s.isdigit()]
  outputs = max(1, math.prod(sizes))
  if not name.startswith("r"): return "elementwise"
  if ops / outputs < 64: return "other reduction (batchnorm, loss, mean)"
  return "conv forward / input gradient" if sizes and sizes[0] == batch else "conv weight gradient"

def _wall_time(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start

def time_second_step(args: argparse.Namespace) -> list[tuple[str, str, str, float, int, int, float]]:
  """(kind, kernel name, metadata, best one-thread CPU seconds, ALU ops, threads at THREADS=2, best wall seconds
  at THREADS=2) of every kernel of the second step."""
  rng = np.random.default_rng(0)
  Tensor.manual_seed(0)
  model = bench_resnet.ResNet50()
  images = rng.standard_normal((args.batch, 3, args.size, args.size), dtype=np.float32)
  labels = rng.integers(0, 1000, args.batch).astype(np.int32)
  opt = SGD(get_parameters(model), lr=bench_resnet.LR, momentum=bench_resnet.MOMENTUM)
  x, y = Tensor(images).realize(), Tensor(labels).realize()
  rows: list[tuple[str, str, str, float, int, int, float]] = []
  sources.clear()
  def timed_run(items, var_vals=None) -> None:
    for item in items:
      run_schedule([item], var_vals)
      if item.ast.op.name != "SINK": continue
      runner = get_runner(item.bufs[0].device, item.ast)
      if args.names and runner.name not in args.names: continue
      with Context(THREADS=1):
        best = min(_cpu_time(lambda: runner(item.bufs, item.var_vals, wait=True)) for _ in range(args.repeats))
      threads, wall = 1, 0.0
      if args.two_threads:
        with Context(THREADS=2):
          threads = runner.program.threads() if hasattr(runner.program, "threads") else 1
          wall = min(_wall_time(lambda: runner(item.bufs, item.var_vals, wait=True)) for _ in range(args.repeats))
      rows.append((kernel_kind(runner.name, runner.ops, args.batch), runner.name, " ".join(item.metadata[:3]), best, runner.ops,
                   threads, wall))
      sources.append(hashlib.sha256(runner.source.encode()).hexdigest()[:16])
  with Tensor.train():
    for step in range(2):
      if step == 1: kiln_tensor.run_schedule = timed_run
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y)
      loss.backward()
      Tensor.realize(loss, *opt.schedule_step())
  kiln_tensor.run_schedule = run_schedule
  return rows

def torch_ops(args: argparse.Namespace) -> list[tuple[str, float, int]]:
  """(op name, self CPU seconds, calls) of one warm PyTorch step on one thread."""
  import torch
  from torch.profiler import profile, ProfilerActivity
  torch.set_num_threads(1)
  rng = np.random.default_rng(0)
  Tensor.manual_seed(0)
  model = bench_resnet.torch_resnet50(bench_resnet.ResNet50())
  images = rng.standard_normal((args.batch, 3, args.size, args.size), dtype=np.float32)
  labels = rng.integers(0, 1000, args.batch).astype(np.int32)
  x, y = torch.from_numpy(images), torch.from_numpy(labels).long()
  opt = torch.optim.SGD(model.parameters(), lr=bench_resnet.LR, momentum=bench_resnet.MOMENTUM)
  model.train()
  def step() -> None:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
  for _ in range(2): step()
  start = time.process_time()
  step()
  plain = time.process_time() - start
  with profile(activities=[ProfilerActivity.CPU]) as prof: step()
  print(f"torch one thread: a warm step {plain * 1e3:.1f} ms CPU (without the profiler)")
  return [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3, help="launches per kernel (the best counts)")
  parser.add_argument("--top", type=int, default=25, help="slowest kernels listed")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--size", type=int, default=224)
  parser.add_argument("--no-torch", action="store_true")
  parser.add_argument("--two-threads", action="store_true",
                      help="also each kernel's threads and best wall time at THREADS=2 (wall clock: a quiet machine only)")
  parser.add_argument("--names", type=lambda text: set(text.split(",")), default=set(),
                      help="time only the kernels of these names (comma list)")
  parser.add_argument("--json", help="write every kernel's name, metadata, source digest and time to this file")
  parser.add_argument("--groups", action="store_true", help="also sum kernels by name (same shape) and metadata")
  args = parser.parse_args()
  print(f"load average {os.getloadavg()[0]:.2f}; one thread, CPU time, best of {args.repeats}")
  rows = time_second_step(args)
  total = sum(r[3] for r in rows)
  print(f"kiln: {total * 1e3:.1f} ms in {len(rows)} kernels")
  if args.json:   # every kernel: name, metadata, source digest, one-thread seconds (to compare two trees kernel by kernel)
    with open(args.json, "w") as f: json.dump([[r[1], r[2], src, r[3]] for r, src in zip(rows, sources)], f)
  single = [r for r in rows if r[5] == 1] if args.two_threads else []
  if args.two_threads: print(f"  at THREADS=2: {sum(r[6] for r in rows) * 1e3:.1f} ms wall summed (best of each); "
        f"{len(single)} kernels on one thread, {sum(r[3] for r in single) * 1e3:.1f} ms of the one-thread sum")
  kinds: dict[str, list[float]] = collections.defaultdict(list)
  for kind, _, _, seconds, *_ in rows: kinds[kind].append(seconds)
  for kind, times in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))[:20]:
    print(f"  {kind:40s} {sum(times) * 1e3:8.1f} ms in {len(times)} kernels")
  print(f"slowest {args.top}:")
  for kind, name, meta, seconds, ops, threads, wall in sorted(rows, key=lambda r: -r[3])[:args.top]:
    two = f"2 threads: {threads} {wall * 1e3:7.2f} ms  " if args.two_threads else ""
    print(f"  {seconds * 1e3:8.2f} ms {ops / max(seconds, 1e-9) / 1e9:6.1f} GFLOP/s  {two}{name:30s} {meta[:50]}")
  if single: print("slowest on one thread at THREADS=2:")
  for kind, name, meta, seconds, ops, threads, wall in sorted(single, key=lambda r: -r[3])[:args.top]:
    print(f"  {seconds * 1e3:8.2f} ms {ops / max(seconds, 1e-9) / 1e9:6.1f} GFLOP/s  {name:30s} {meta[:50]}")
  if args.groups:
    groups: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for _, name, meta, seconds, *_ in rows: groups[(name, meta[:50])].append(seconds)
    print("by kernel shape and ops:")
    for (name, meta), times in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:40]:
      print(f"  {sum(times) * 1e3:8.2f} ms x{len(times):3d}  {name:34s} {meta}")
  if not args.no_torch:
    ops = torch_ops(args)
    print(f"torch (profiler, one thread): {sum(s for _, s, _ in ops) * 1e3:.1f} ms self CPU")
    for name, seconds, calls in sorted(ops, key=lambda r: -r[1])[:20]:
      print(f"  {seconds * 1e3:8.1f} ms x{calls:4d}  {name}")

if __name__ == "__main__": main()
