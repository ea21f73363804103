"""Time kiln's own Python work: scheduling and code generation for a deep MLP, and eager dispatch of a tiny op.

Run: PYTHONPATH=. python bench/bench_schedule.py
"""
import time
from kiln import Tensor, nn
from kiln.schedule import create_schedule
from kiln.engine.realize import get_runner, _runner_cache

def mlp_graph(layers: int, width: int = 32, batch: int = 8):
  Tensor.manual_seed(0)
  x = Tensor.randn(batch, width).realize()
  weights = [Tensor.randn(width, width, requires_grad=True).realize() for _ in range(layers)]
  h = x
  for w in weights: h = (h @ w).relu()
  loss = h.sum()
  loss.backward()
  return [loss] + [w.grad for w in weights]

def training_step_schedule(layers: int = 100):
  """Schedule one SGD step (forward, backward, update) of a deep MLP; returns (seconds, kernels)."""
  Tensor.manual_seed(0)
  x = Tensor.randn(8, 32).realize()
  weights = [Tensor.randn(32, 32, requires_grad=True).realize() for _ in range(layers)]
  optimizer = nn.optim.SGD(weights, lr=0.01)
  h = x
  for w in weights: h = (h @ w).relu()
  loss = h.sum()
  loss.backward()
  with Tensor.train(): updates = optimizer.schedule_step()
  start = time.perf_counter()
  items = create_schedule([loss.uop] + [t.uop for t in updates]).items
  return time.perf_counter() - start, len(items)

def main():
  build_start = time.perf_counter()
  outs = mlp_graph(100)
  build = time.perf_counter() - build_start
  sched_start = time.perf_counter()
  items = create_schedule([t.uop for t in outs]).items
  sched = time.perf_counter() - sched_start
  _runner_cache.clear()
  codegen_start = time.perf_counter()
  for item in items:
    if item.ast.op.name == "SINK": get_runner(item.bufs[0].device, item.ast)
  codegen = time.perf_counter() - codegen_start
  # kiln's own code generation, without the C compiler: lower, linearize and render every kernel of the schedule
  from kiln.codegen.lowerer import lower_kernel
  from kiln.codegen.linearizer import linearize
  from kiln.device import Device
  renderer = Device[items[0].bufs[0].device].renderer
  render_start = time.perf_counter()
  kernels = [item for item in items if item.ast.op.name == "SINK"]
  for i, item in enumerate(kernels): renderer.render(f"k{i}", linearize(lower_kernel(item.ast)))
  render = time.perf_counter() - render_start
  print(f"lower+linearize+render all {len(kernels)} kernels (no compiler): {render*1e3:.1f} ms "
        f"({render / len(kernels) * 1e6:.0f} us per kernel)")
  print(f"100-layer MLP fwd+bwd: build graph {build*1e3:.1f} ms, schedule {sched*1e3:.1f} ms ({len(items)} kernels), "
        f"codegen+compile (disk-cached) {codegen*1e3:.1f} ms")
  seconds, kernels = training_step_schedule()
  print(f"100-layer MLP SGD step (fwd+bwd+update): schedule {seconds*1e3:.1f} ms ({kernels} kernels, "
        f"{seconds / kernels * 1e6:.0f} us per kernel)")
  a = Tensor.rand(16).realize()
  for _ in range(10): (a + 1).realize()
  n = 500
  start = time.perf_counter()
  for _ in range(n): (a + 1).realize()
  print(f"eager (a+1).realize() on 16 floats: {(time.perf_counter() - start) / n * 1e6:.1f} us")

if __name__ == "__main__": main()
