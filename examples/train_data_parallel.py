#!/usr/bin/env python3
"""Data-parallel training: the batch sharded over several devices, the weights replicated on each, under TinyJit.

Each device runs the forward and backward pass on its slice of the batch; the gradients (sums over the batch axis,
which is sharded) are all-reduced, so every device applies the same update and the weights stay identical. Batch
norm's statistics are over the whole batch for the same reason. With `--check` the same steps also run on the first
device alone and the script prints how far the weights ended apart, and both runs' step times (the median of the
steps after the first three: TinyJit captures on the second) and the speedup. `--channels` widens the conv, so that
the model is compute-bound enough for a speedup to show on GPUs.

  python examples/train_data_parallel.py                         # 2 virtual CPU devices
  python examples/train_data_parallel.py --devices CUDA:0,CUDA:1 --steps 200
  python examples/train_data_parallel.py --devices CUDA:0,CUDA:1 --channels 256 --batch 512 --steps 30 --check
"""
import argparse, time
import numpy as np
from kiln import Tensor, TinyJit, nn
from kiln.nn.state import get_parameters

class Model:
  """A small conv net for 1x12x12 images in 4 classes: conv, batch norm, ReLU, a second conv (`channels` wide, the
  compute), 6x6 max pool, linear."""
  def __init__(self, channels: int = 8):
    self.conv, self.bn = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm(8)
    self.wide = nn.Conv2d(8, channels, 3, padding=1) if channels != 8 else None
    self.head = nn.Linear(channels * 2 * 2, 4)

  def __call__(self, x: Tensor) -> Tensor:
    h = self.bn(self.conv(x)).relu()
    if self.wide is not None: h = self.wide(h).relu()
    return self.head(h.max_pool2d(6).flatten(1))

def make_data(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Images whose class is the quadrant holding a bright blob, plus noise."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 4, count)
  images = rng.normal(0, 0.3, (count, 1, 12, 12)).astype(np.float32)
  for i, label in enumerate(labels):
    r, c = 6 * (label // 2) + rng.integers(1, 4), 6 * (label % 2) + rng.integers(1, 4)
    images[i, 0, r:r + 2, c:c + 2] += 2.0
  return images, labels.astype(np.int32)

def train(devices: tuple[str, ...] | None, steps: int, batch: int, seed: int, channels: int = 8,
          step_times: list[float] | None = None) -> tuple[Model, list[float]]:
  """Train a fresh model for `steps` SGD steps; the batch is sharded over `devices` (None: the default device; one
  device: that device). Each step's seconds are appended to `step_times` when given."""
  Tensor.manual_seed(seed)
  model = Model(channels)
  params = get_parameters(model)
  if devices and len(devices) == 1:
    for p in params: p.replace(p.to(devices[0])).realize()
  elif devices:
    for p in params: p.shard_(devices).realize()   # replicated: a copy of every weight on every device
  opt = nn.optim.SGD(params, lr=0.05, momentum=0.9)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    opt.step()
    return loss

  images, labels = make_data(steps * batch, seed)
  losses = []
  with Tensor.train():
    for i in range(steps):
      start = time.perf_counter()
      x, y = Tensor(images[i * batch:(i + 1) * batch]), Tensor(labels[i * batch:(i + 1) * batch])
      if devices and len(devices) == 1: x, y = x.to(devices[0]), y.to(devices[0])
      elif devices: x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)   # each device gets a slice of the batch
      losses.append(step(x.realize(), y.realize()).item())
      if step_times is not None: step_times.append(time.perf_counter() - start)
  return model, losses

def steady(step_times: list[float]) -> float:
  """The median step time after the first three steps (TinyJit's capture is the second), or of all of them."""
  times = sorted(step_times[3:] or step_times)
  return times[len(times) // 2]

def accuracy(model: Model, seed: int) -> float:
  """The share of 512 fresh images the model classifies right (on its first device)."""
  images, labels = make_data(512, seed + 1)
  x = Tensor(images)
  device = model.head.weight.device
  if isinstance(device, tuple): x = x.shard(device, axis=0)
  return float((model(x).argmax(-1).numpy() == labels).mean())

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", default="CPU:1,CPU:2", help="comma-separated devices (default: CPU:1,CPU:2)")
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--batch", type=int, default=32, help="the global batch, split over the devices")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--channels", type=int, default=8, help="the second conv's width (8: no second conv)")
  parser.add_argument("--check", action="store_true",
                      help="also train on the first device alone: the weights' difference and the step-time speedup")
  args = parser.parse_args()
  devices = tuple(args.devices.split(","))
  start, times = time.perf_counter(), []
  model, losses = train(devices, args.steps, args.batch, args.seed, args.channels, times)
  print(f"{len(devices)} devices {devices}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps, "
        f"{time.perf_counter() - start:.1f} s, step {steady(times) * 1e3:.2f} ms, accuracy "
        f"{accuracy(model, args.seed):.3f}")
  if args.check:
    single_times: list[float] = []
    single, single_losses = train(devices[:1], args.steps, args.batch, args.seed, args.channels, single_times)
    diff = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in
               zip(get_parameters(model), get_parameters(single)))
    print(f"one device ({devices[0]}): loss {single_losses[0]:.4f} -> {single_losses[-1]:.4f}, step "
          f"{steady(single_times) * 1e3:.2f} ms; speedup on {len(devices)} devices "
          f"{steady(single_times) / steady(times):.2f}x")
    print(f"max weight difference against one device: {diff:.2e}")

if __name__ == "__main__":
  main()
