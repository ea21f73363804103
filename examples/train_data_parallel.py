#!/usr/bin/env python3
"""Data-parallel training: the batch sharded over several devices, the weights replicated on each, under TinyJit.

Each device runs the forward and backward pass on its slice of the batch; the gradients (sums over the batch axis,
which is sharded) are all-reduced, so every device applies the same update and the weights stay identical. Batch
norm's statistics are over the whole batch for the same reason. With `--check` the same steps also run on one device
and the script prints how far the weights ended apart.

  python examples/train_data_parallel.py                         # 2 virtual CPU devices
  python examples/train_data_parallel.py --devices CUDA:0,CUDA:1 --steps 200
"""
import argparse, time
import numpy as np
from kiln import Tensor, TinyJit, nn
from kiln.nn.state import get_parameters

class Model:
  """A small conv net for 1x12x12 images in 4 classes: conv, batch norm, ReLU, 6x6 max pool, linear."""
  def __init__(self):
    self.conv, self.bn, self.head = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm(8), nn.Linear(8 * 2 * 2, 4)

  def __call__(self, x: Tensor) -> Tensor:
    return self.head(self.bn(self.conv(x)).relu().max_pool2d(6).flatten(1))

def make_data(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Images whose class is the quadrant holding a bright blob, plus noise."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 4, count)
  images = rng.normal(0, 0.3, (count, 1, 12, 12)).astype(np.float32)
  for i, label in enumerate(labels):
    r, c = 6 * (label // 2) + rng.integers(1, 4), 6 * (label % 2) + rng.integers(1, 4)
    images[i, 0, r:r + 2, c:c + 2] += 2.0
  return images, labels.astype(np.int32)

def train(devices: tuple[str, ...] | None, steps: int, batch: int, seed: int) -> tuple[Model, list[float]]:
  """Train a fresh model for `steps` SGD steps; the batch is sharded over `devices` (None: one device)."""
  Tensor.manual_seed(seed)
  model = Model()
  params = get_parameters(model)
  if devices:
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
      x, y = Tensor(images[i * batch:(i + 1) * batch]), Tensor(labels[i * batch:(i + 1) * batch])
      if devices: x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)   # each device gets a slice of the batch
      losses.append(step(x.realize(), y.realize()).item())
  return model, losses

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
  parser.add_argument("--check", action="store_true", help="also train on one device and compare the weights")
  args = parser.parse_args()
  devices = tuple(args.devices.split(","))
  start = time.perf_counter()
  model, losses = train(devices, args.steps, args.batch, args.seed)
  print(f"{len(devices)} devices {devices}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps, "
        f"{time.perf_counter() - start:.1f} s, accuracy {accuracy(model, args.seed):.3f}")
  if args.check:
    single, single_losses = train(None, args.steps, args.batch, args.seed)
    diff = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in
               zip(get_parameters(model), get_parameters(single)))
    print(f"one device: loss {single_losses[0]:.4f} -> {single_losses[-1]:.4f}")
    print(f"max weight difference against one device: {diff:.2e}")

if __name__ == "__main__":
  main()
