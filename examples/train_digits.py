#!/usr/bin/env python3
"""Train a small CNN on scikit-learn's bundled 8x8 digits under TinyJit; prints the test accuracy.

  pip install -e . scikit-learn && python examples/train_digits.py [--steps 200] [--seed 0]

Every option also reads an environment variable of the same name in capitals (STEPS=100, SEED=1, BS, LR).
The data set ships with scikit-learn, so this runs offline. The last line reads `test accuracy: 98.3%`.
"""
import argparse, time
from kiln import Tensor, TinyJit, getenv, nn
from kiln.nn.datasets import digits
from kiln.nn.optim import Adam
from kiln.nn.state import get_parameters
from kiln.helpers import trange

class DigitsCNN:
  """conv 3x3 (16) -> batchnorm -> relu -> maxpool 2 -> conv 3x3 (32) -> batchnorm -> relu -> linear to 10 classes.

  Pooling right after the first conv makes the second (the costly one) run on 4x4 instead of 8x8 maps.
  """
  def __init__(self):
    self.layers = [nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm(16), Tensor.relu, Tensor.max_pool2d,
                   nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm(32), Tensor.relu,
                   lambda x: x.flatten(1), nn.Linear(32 * 4 * 4, 10)]

  def __call__(self, x: Tensor) -> Tensor:
    return x.sequential(self.layers)

def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=getenv("STEPS", 200), help="training steps (default 200)")
  parser.add_argument("--seed", type=int, default=getenv("SEED", 0), help="random seed for weights and batches")
  parser.add_argument("--bs", type=int, default=getenv("BS", 128), help="batch size (default 128)")
  parser.add_argument("--lr", type=float, default=getenv("LR", 0.003), help="Adam learning rate (default 0.003)")
  return parser.parse_args()

def main() -> None:
  args = parse_args()
  Tensor.manual_seed(args.seed)
  x_train, y_train, x_test, y_test = digits()
  model = DigitsCNN()
  optimizer = Adam(get_parameters(model), lr=args.lr)

  @TinyJit
  @Tensor.train()
  def train_step() -> Tensor:
    # the batch is drawn on the device, so a replayed step reads new samples without a host round trip
    samples = Tensor.randint(args.bs, high=x_train.shape[0])
    optimizer.zero_grad()
    loss = model(x_train[samples]).sparse_categorical_crossentropy(y_train[samples]).backward()
    optimizer.step()
    return loss

  start = time.perf_counter()
  bar = trange(args.steps, desc="train")
  for step in bar:
    loss = train_step()
    if step % 10 == 9 or step == args.steps - 1: bar.set_description(f"train loss {loss.item():.3f}")
  train_time = time.perf_counter() - start

  with Tensor.train(False):
    accuracy = (model(x_test).argmax(axis=1) == y_test).mean().item()
  print(f"trained {args.steps} steps in {train_time:.1f} s")
  print(f"test accuracy: {accuracy * 100:.1f}%")

if __name__ == "__main__":
  main()
