"""CPU time of each Python codegen stage (kiln/codegen/pipeline.py STAGES: lower, optimize, map_axes, software_math,
linearize, vectorize with its thread plans, plan_threads, render) over the distinct kernels of a graph: the anchors'
cold transformer graph (issue 4's cold first call), or with `--graph resnet` the first eager SGD step of ResNet-50 at
batch 4, 224x224 (issue 17's cold first step: bench/bench_resnet.py's model, ~450 kernels).

Each run is a fresh process (the rewrite memories and node caches start empty, as in a cold first call); the minimum
of the runs is printed per stage, in milliseconds of process CPU time (less sensitive to other load than wall time).

  PYTHONPATH=. python bench/bench_codegen_stages.py --runs 5 [--graph resnet]
"""
from __future__ import annotations
import argparse, gc, os, subprocess, sys, time

def transformer_items() -> list:
  """The schedule of the anchors' transformer forward."""
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench"))
  import numpy as np
  import anchors
  from kiln import Tensor
  x, *params = [Tensor(a) for a in anchors.transformer_inputs(np.random.default_rng(0))]
  return anchors.transformer_tensor(x, anchors.split_layers(params)).schedule()

def resnet_items() -> list:
  """The schedule of one eager ResNet-50 SGD-with-momentum step, batch 4, 224x224 (bench/bench_resnet.py)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import numpy as np
  import bench_resnet
  from kiln import Tensor
  from kiln.nn.optim import SGD
  from kiln.nn.state import get_parameters
  rng = np.random.default_rng(0)
  model = bench_resnet.ResNet50()
  opt = SGD(get_parameters(model), lr=bench_resnet.LR, momentum=bench_resnet.MOMENTUM)
  x = Tensor(rng.standard_normal((4, 3, 224, 224), dtype=np.float32))
  y = Tensor(rng.integers(0, 1000, 4).astype(np.int32))
  with Tensor.train():
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    return Tensor.schedule(loss, *opt.schedule_step())

GRAPHS = {"transformer": transformer_items, "resnet": resnet_items}

def measure_once(graph: str = "transformer") -> dict[str, float]:
  """One run in this process: CPU seconds per stage of the pipeline (kiln/codegen/pipeline.py STAGES), summed over
  the graph's distinct kernels."""
  from kiln.device import Device
  from kiln.uop.ops import Ops
  from kiln.codegen import pipeline
  items = GRAPHS[graph]()
  asts = list(dict.fromkeys(item.ast for item in items if item.ast.op is Ops.SINK))
  renderer = Device[items[0].bufs[0].device].renderer
  gc.disable()   # as in precompile (kiln/engine/realize.py: the collector is paused during codegen)
  totals = {"kernels": float(len(asts)), **{stage.name: 0.0 for stage in pipeline.STAGES}}
  for i, ast in enumerate(asts):
    job, value = pipeline.Job(renderer, f"k{i}"), ast
    for stage in pipeline.STAGES:   # each stage takes the one before's result
      start = time.process_time()
      value = stage.run(value, job)
      totals[stage.name] += time.process_time() - start
  return totals

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=5, help="fresh processes to run (the minimum is reported)")
  parser.add_argument("--graph", choices=sorted(GRAPHS), default="transformer", help="whose kernels to make")
  parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)   # a child run: print one line
  args = parser.parse_args()
  if args.once:
    print(" ".join(f"{k}={v}" for k, v in measure_once(args.graph).items()))
    return
  best: dict[str, float] = {}
  for _ in range(args.runs):
    out = subprocess.run([sys.executable, __file__, "--once", "--graph", args.graph], capture_output=True, text=True,
                         check=True).stdout
    for field in out.split():
      key, value = field.split("=")
      best[key] = min(best.get(key, float("inf")), float(value))
  kernels = int(best.pop("kernels"))
  print(f"{kernels} kernels, min of {args.runs} runs (process CPU ms): " +
        "  ".join(f"{k} {v * 1000:.1f}" for k, v in best.items()) + f"  (sum {sum(best.values()) * 1000:.0f})")

if __name__ == "__main__":
  main()
