"""The anchors' transformer graph (4 layers, dim 256, seq 64, batch 4) called again in a warm process: how long
graph building (every Tensor op up to `.realize()`) and realize (schedule, launches, kernels) take per call.

Run: PYTHONPATH=. python bench/bench_second_call.py [--calls N] [--profile build|realize] [--stub-kernels]

The graph is realized twice first (compile, then warm), then timed `--calls` more times; the minimum and the
median of each part are printed (the machine is shared: minimums are the steady figure), and the build's CPU time
on the main thread (less disturbed by other processes than its wall-clock time). DEBUG=2 prints each
kernel's time as usual; `--profile` runs cProfile over the build or the realize part of the timed calls.
`--stub-kernels` skips the compiled kernels' launches in the timed calls (their outputs are garbage then), so
realize shows only Python's part: scheduling, buffers and the launch path down to the program call. The cyclic
garbage collector's passes during the timed calls are counted per generation, with their total pause.
"""
from __future__ import annotations
import argparse, cProfile, gc, pathlib, pstats, statistics, sys, time

ANCHORS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "bench"

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=20, help="timed calls after the two warm-up calls")
  parser.add_argument("--profile", choices=["build", "realize"], help="cProfile this part of the timed calls")
  parser.add_argument("--stub-kernels", action="store_true", help="launch no kernels in the timed calls")
  args = parser.parse_args()
  sys.path.insert(0, str(ANCHORS))
  import numpy as np
  import anchors
  from kiln import Tensor
  from kiln.helpers import DEBUG
  x, *params = [Tensor(a) for a in anchors.transformer_inputs(np.random.default_rng(0))]
  x.realize()
  for p in params: p.realize()
  for _ in range(2): anchors.transformer_tensor(x, anchors.split_layers(params)).realize()
  if args.stub_kernels:
    from kiln.runtime.ops_cpu import CPUProgram
    CPUProgram.__call__ = lambda self, *bufs, vals=(), wait=False: 0.0 if wait else None
  collections, pause, started = [0, 0, 0], [0.0, 0.0, 0.0], [0.0]
  def note_collection(phase: str, info: dict) -> None:
    if phase == "start": started[0] = time.perf_counter()
    else:
      collections[info["generation"]] += 1
      pause[info["generation"]] += time.perf_counter() - started[0]
  gc.callbacks.append(note_collection)
  profiler = cProfile.Profile() if args.profile else None
  builds, build_cpu, realizes, realize_cpu = [], [], [], []
  collections[:], pause[:] = [0, 0, 0], [0.0, 0.0, 0.0]
  for call in range(args.calls):
    if DEBUG >= 2: print(f"--- timed call {call}")
    if profiler and args.profile == "build": profiler.enable()
    start, thread_start = time.perf_counter(), time.thread_time()
    out = anchors.transformer_tensor(x, anchors.split_layers(params))
    built, thread_built = time.perf_counter(), time.thread_time()
    if profiler and args.profile == "build": profiler.disable()
    if profiler and args.profile == "realize": profiler.enable()
    out.realize()
    done, thread_done = time.perf_counter(), time.thread_time()
    if profiler and args.profile == "realize": profiler.disable()
    builds.append(built - start)
    build_cpu.append(thread_built - thread_start)
    realizes.append(done - built)
    realize_cpu.append(thread_done - thread_built)
  totals = [b + r for b, r in zip(builds, realizes)]
  # the build's CPU time on this thread: what a busy machine disturbs least
  for name, values in (("build", builds), ("build CPU", build_cpu), ("realize", realizes),
                       ("realize CPU", realize_cpu), ("whole call", totals)):
    print(f"{name:11s} min {min(values) * 1e3:7.2f} ms   median {statistics.median(values) * 1e3:7.2f} ms")
  gc.callbacks.remove(note_collection)
  print(f"GC passes in {args.calls} calls (pause in all): " +
        ", ".join(f"gen{g} {collections[g]} ({pause[g] * 1e3:.1f} ms)" for g in range(3)))
  if profiler: pstats.Stats(profiler).sort_stats("tottime").print_stats(30)

if __name__ == "__main__":
  main()
