"""CPU conv2d speed: the anchors' conv (x 16x64x56x56, weight 64x64x3x3, padding 1) forward, and its backward (the
input and weight gradients of `(conv(x, w) * g).sum()`), kiln kernel by kernel next to PyTorch (when installed).

Run: `python bench/bench_conv.py` (heuristics on; `NOOPT=1` for unoptimized kernels, `THREADS=n` for the pool).
Each kiln kernel is timed alone (best of several runs, scheduling and compiling done before); a pass's time is the
sum of its kernels. GFLOP/s counts 2*N*F*H*W*C*3*3 for each of the forward, the input gradient and the weight gradient.
"""
from __future__ import annotations
import numpy as np
from kiln import Tensor
from kiln.helpers import NOOPT
from kiln.runtime.threadpool import thread_count
from kiln.schedule.kernelize import create_schedule
from kiln.engine.realize import get_runner, run_schedule
from bench_matmul import best_time   # this folder is on sys.path when a bench script runs

BATCH, CHANNELS, FILTERS, SIZE, KSIZE = 16, 64, 64, 56, 3
FLOP = 2 * BATCH * FILTERS * SIZE * SIZE * CHANNELS * KSIZE * KSIZE

def kernel_times(outs: list[Tensor], repeats: int) -> list[tuple[str, float]]:
  """(name, best seconds) of each kernel that computes `outs`, run in schedule order (inputs realized)."""
  items = create_schedule([t.uop for t in outs]).items
  run_schedule(items)   # allocates and fills every intermediate buffer once
  out = []
  for item in items:
    if item.ast.op.name != "SINK": continue   # copies, views
    runner = get_runner(item.bufs[0].device, item.ast)
    out.append((runner.name if hasattr(runner, "name") else "kernel",
                best_time(lambda: runner(item.bufs, item.var_vals), repeats)))
  return out

def torch_times(x_np: np.ndarray, w_np: np.ndarray, g_np: np.ndarray, repeats: int) -> tuple[float, float] | None:
  """(forward, backward) best seconds in PyTorch, or None without it."""
  try: import torch
  except ImportError: return None
  x, w, g = (torch.from_numpy(a) for a in (x_np, w_np, g_np))
  x.requires_grad_(True); w.requires_grad_(True)
  forward = best_time(lambda: torch.nn.functional.conv2d(x, w, padding=1), repeats)
  def backward():
    y = torch.nn.functional.conv2d(x, w, padding=1)
    torch.autograd.grad(y, (x, w), g)
  return forward, best_time(backward, repeats) - forward

def main() -> None:
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal((BATCH, CHANNELS, SIZE, SIZE), dtype=np.float32)
  w_np = (rng.standard_normal((FILTERS, CHANNELS, KSIZE, KSIZE)) / (CHANNELS * KSIZE * KSIZE) ** 0.5).astype(np.float32)
  g_np = rng.standard_normal((BATCH, FILTERS, SIZE, SIZE), dtype=np.float32)
  print(f"NOOPT={int(NOOPT.value)} THREADS={thread_count()}  conv2d {BATCH}x{CHANNELS}x{SIZE}x{SIZE} * "
        f"{FILTERS}x{CHANNELS}x{KSIZE}x{KSIZE} pad 1: {FLOP / 1e9:.2f} GFLOP per pass")
  x, w, g = (Tensor(a).realize() for a in (x_np, w_np, g_np))
  forward = kernel_times([x.conv2d(w, padding=1)], 3)
  xg, wg = Tensor(x_np, requires_grad=True), Tensor(w_np, requires_grad=True)
  (xg.conv2d(wg, padding=1) * g).sum().backward()
  backward = kernel_times([xg.grad, wg.grad], 3)
  for label, kernels, passes in (("forward", forward, 1), ("backward", backward, 2)):
    total = sum(t for _, t in kernels)
    print(f"kiln {label:9s} {total * 1e3:9.2f} ms {passes * FLOP / total / 1e9:8.2f} GFLOP/s")
    for name, t in sorted(kernels, key=lambda k: -k[1]):
      if t > 0.02 * total: print(f"    {name:40s} {t * 1e3:9.2f} ms")
  if (torch_result := torch_times(x_np, w_np, g_np, 3)) is not None:
    for label, t, passes in (("forward", torch_result[0], 1), ("backward", torch_result[1], 2)):
      print(f"torch {label:8s} {t * 1e3:9.2f} ms {passes * FLOP / t / 1e9:8.2f} GFLOP/s")

if __name__ == "__main__":
  main()
