"""Per-kernel CPU time of the anchors' op rows (../shared/bench/anchors.py): every kernel each row schedules, timed
alone on one thread, with the heuristics' actions, best of several runs.

Run: PYTHONPATH=. python bench/bench_kernels.py [--rows sum,softmax,...] [--repeats N]

On a machine shared with other work the anchors' wall-clock rows (two threads) swing by 30-100% from run to run; the
CPU time of a kernel on one thread swings far less, so this is the table to compare heuristic changes by (run it in
both trees, interleaved, and quote the load average it prints). Rows: matmul_512, sum, softmax, conv2d, elementwise,
transformer (one anchors transformer layer's kernels, dim 256, seq 64, batch 4) and mlp (the anchors' MLP SGD step).
"""
from __future__ import annotations
import argparse, os, pathlib, sys, time
import numpy as np
from kiln import Tensor
from kiln.helpers import Context
from kiln.schedule.kernelize import create_schedule
from kiln.engine.realize import get_runner, run_schedule

ANCHORS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "bench"

def _rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> Tensor:
  return Tensor((rng.standard_normal(shape) * scale).astype(np.float32)).realize()

def _gelu(v: Tensor) -> Tensor: return 0.5 * v * (1 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())

def _transformer_layer(rng: np.random.Generator) -> list[Tensor]:
  """The kernels of one pre-norm transformer layer as the anchors build it (attention without mask, GELU MLP)."""
  sys.path.insert(0, str(ANCHORS))
  import anchors
  x, *params = [Tensor(a).realize() for a in anchors.transformer_inputs(np.random.default_rng(0))]
  return [anchors.transformer_tensor(x, [params[:anchors.TF_PARAMS_PER_LAYER]])]

def _mlp_step(rng: np.random.Generator) -> list[Tensor]:
  """The loss and every parameter's SGD update of one step of the anchors' MLP (784-512-512-10, batch 256)."""
  sys.path.insert(0, str(ANCHORS))
  import anchors
  x, y, *params = [Tensor(a).realize() for a in anchors.mlp_inputs(np.random.default_rng(0))]
  for p in params: p.requires_grad = True
  loss = anchors.mlp_loss_tensor(params, x, y)
  loss.backward()
  return [loss] + [p.detach() - anchors.MLP_LR * p.grad for p in params]

ROWS = {
  "matmul_512": lambda rng: [_rand(rng, 512, 512) @ _rand(rng, 512, 512)],
  "sum": lambda rng: [Tensor(rng.random(1 << 24, dtype=np.float32)).realize().sum()],
  "softmax": lambda rng: [_rand(rng, 4096, 4096).softmax(-1)],
  "conv2d": lambda rng: [_rand(rng, 16, 64, 56, 56).conv2d(_rand(rng, 64, 64, 3, 3, scale=1 / 24), padding=1)],
  "elementwise": lambda rng: [((_rand(rng, 1 << 24) * _rand(rng, 1 << 24) + _rand(rng, 1 << 24)).relu() * 0.5).exp()],
  "transformer": _transformer_layer,
  "mlp": _mlp_step,
}

def kernel_times(outs: list[Tensor], repeats: int) -> list[tuple[str, float, int]]:
  """(kernel name, best CPU seconds of one launch on one thread, ALU ops per launch) for every kernel computing
  `outs`."""
  items = create_schedule([t.uop for t in outs]).items
  rows = []
  with Context(THREADS=1):
    for item in items:
      run_schedule([item])   # allocates and fills the buffers later kernels read
      if item.ast.op.name != "SINK": continue
      runner = get_runner(item.bufs[0].device, item.ast)
      best = min(_cpu_time(lambda: runner(item.bufs, item.var_vals)) for _ in range(repeats))
      rows.append((runner.name, best, runner.ops))
  return rows

def _cpu_time(fn) -> float:
  start = time.process_time()
  fn()
  return time.process_time() - start

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default=",".join(ROWS), help="comma list of: " + ",".join(ROWS))
  parser.add_argument("--repeats", type=int, default=5, help="runs per kernel (the best counts)")
  args = parser.parse_args()
  unknown = [r for r in args.rows.split(",") if r not in ROWS]
  if unknown: parser.error(f"unknown rows {unknown}; rows: {', '.join(ROWS)}")
  print(f"load average {os.getloadavg()[0]:.2f}; one thread, CPU time, best of {args.repeats}")
  for row in args.rows.split(","):
    rows = kernel_times(ROWS[row](np.random.default_rng(0)), args.repeats)
    print(f"{row}: {sum(t for _, t, _ in rows) * 1e3:.3f} ms in {len(rows)} kernels")
    for name, seconds, ops in sorted(rows, key=lambda r: -r[1])[:8]:
      print(f"  {name:28s} {seconds * 1e3:9.3f} ms  {ops / max(seconds, 1e-9) / 1e9:7.1f} GFLOP/s")

if __name__ == "__main__": main()
