#!/usr/bin/env python3
"""Train a CNN on the full Fashion-MNIST (60k train / 10k test images) with kiln; prints time per epoch and the test
accuracy, and the same model's time per epoch in PyTorch (when torch is installed) on the same machine.

  apt-get install dataset-fashion-mnist    # the data set offline (or let kiln download it, or set KILN_DATASETS)
  python examples/train_fashion_mnist.py [--epochs 3] [--bs 128] [--no-torch]

Every option also reads an environment variable of the same name in capitals (EPOCHS=1, BS=64, ...).
"""
import argparse, time
import numpy as np
from kiln import Tensor, TinyJit, getenv, nn
from kiln.nn.datasets import fashion_mnist
from kiln.nn.optim import Adam
from kiln.nn.state import get_parameters
from kiln.helpers import trange

# pixel statistics of the Fashion-MNIST training set, to feed the network zero-mean unit-variance inputs
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530

class FashionCNN:
  """Two conv 3x3 -> batchnorm -> relu -> maxpool 2 blocks (16 and 32 channels), then a linear layer to 10 classes."""
  def __init__(self):
    self.layers = [nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm(16), Tensor.relu, Tensor.max_pool2d,
                   nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm(32), Tensor.relu, Tensor.max_pool2d,
                   lambda x: x.flatten(1), nn.Linear(32 * 7 * 7, 10)]

  def __call__(self, images: Tensor) -> Tensor:
    """Class logits for uint8 images of shape (N, 1, 28, 28)."""
    x = (images.float() / 255 - PIXEL_MEAN) / PIXEL_STD
    return x.sequential(self.layers)

def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=getenv("EPOCHS", 3), help="passes over the training set (3)")
  parser.add_argument("--bs", type=int, default=getenv("BS", 128), help="batch size (128)")
  parser.add_argument("--lr", type=float, default=getenv("LR", 0.002), help="Adam learning rate (0.002)")
  parser.add_argument("--seed", type=int, default=getenv("SEED", 0), help="random seed for weights and batch order")
  parser.add_argument("--limit", type=int, default=getenv("LIMIT", 0),
                      help="use only the first LIMIT training images (0: all)")
  parser.add_argument("--no-torch", action="store_true", default=bool(getenv("NO_TORCH", 0)),
                      help="skip the PyTorch comparison")
  return parser.parse_args()

def train_kiln(args: argparse.Namespace, x_train: np.ndarray, y_train: np.ndarray, x_test: Tensor, y_test: Tensor
               ) -> tuple[list[float], float]:
  """Train with kiln; returns the seconds each epoch took and the final test accuracy."""
  Tensor.manual_seed(args.seed)
  model = FashionCNN()
  optimizer = Adam(get_parameters(model), lr=args.lr)

  @TinyJit
  @Tensor.train()
  def train_step(images: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(images).sparse_categorical_crossentropy(labels).backward()
    optimizer.step()
    return loss

  @TinyJit
  def count_correct(images: Tensor, labels: Tensor) -> Tensor:
    return (model(images).argmax(axis=1) == labels).sum()

  rng = np.random.default_rng(args.seed)
  steps = len(x_train) // args.bs  # the last partial batch is dropped, so every step has one shape (one JIT capture)
  epoch_times, accuracy = [], 0.0
  for epoch in range(args.epochs):
    order = rng.permutation(len(x_train))
    start = time.perf_counter()
    bar = trange(steps, desc=f"kiln epoch {epoch + 1}/{args.epochs}")
    for step in bar:
      batch = order[step * args.bs:(step + 1) * args.bs]
      loss = train_step(Tensor(x_train[batch]), Tensor(y_train[batch]))
      if step % 50 == 49: bar.set_description(f"kiln epoch {epoch + 1}/{args.epochs} loss {loss.item():.3f}")
    Tensor.realize(*get_parameters(model))
    epoch_times.append(time.perf_counter() - start)
    with Tensor.train(False):
      correct = sum(count_correct(x_test[i:i + 1000], y_test[i:i + 1000]).item()
                    for i in range(0, x_test.shape[0], 1000))
    accuracy = correct / x_test.shape[0]
    print(f"kiln epoch {epoch + 1}: {epoch_times[-1]:.1f} s, test accuracy {accuracy * 100:.2f}%")
  return epoch_times, accuracy

def train_torch(args: argparse.Namespace, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                y_test: np.ndarray) -> tuple[list[float], float]:
  """The same model, optimizer, batches and epochs in PyTorch (CPU); returns seconds per epoch and test accuracy."""
  import torch
  torch.manual_seed(args.seed)
  block = lambda c_in, c_out: [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.BatchNorm2d(c_out),  # noqa: E731
                               torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
  model = torch.nn.Sequential(*block(1, 16), *block(16, 32), torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))
  optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
  def normalize(images: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(images).float() / 255 - PIXEL_MEAN) / PIXEL_STD
  rng = np.random.default_rng(args.seed)
  steps = len(x_train) // args.bs
  epoch_times, accuracy = [], 0.0
  for epoch in range(args.epochs):
    order = rng.permutation(len(x_train))
    model.train()
    start = time.perf_counter()
    for step in trange(steps, desc=f"torch epoch {epoch + 1}/{args.epochs}"):
      batch = order[step * args.bs:(step + 1) * args.bs]
      optimizer.zero_grad()
      logits = model(normalize(x_train[batch]))
      loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y_train[batch]).long())
      loss.backward()
      optimizer.step()
    epoch_times.append(time.perf_counter() - start)
    model.eval()
    with torch.no_grad():
      predictions = torch.cat([model(normalize(x_test[i:i + 1000])).argmax(1) for i in range(0, len(x_test), 1000)])
    accuracy = float((predictions.numpy() == y_test).mean())
    print(f"torch epoch {epoch + 1}: {epoch_times[-1]:.1f} s, test accuracy {accuracy * 100:.2f}%")
  return epoch_times, accuracy

def main() -> None:
  args = parse_args()
  x_train_t, y_train_t, x_test_t, y_test_t = fashion_mnist()
  # batches are cut on the host: a gather from all 60k images on the device would read every image per step
  x_train, y_train = x_train_t.numpy(), y_train_t.numpy().astype(np.int32)
  x_test, y_test = x_test_t.numpy(), y_test_t.numpy().astype(np.int32)
  if args.limit: x_train, y_train = x_train[:args.limit], y_train[:args.limit]
  kiln_times, kiln_accuracy = train_kiln(args, x_train, y_train, Tensor(x_test), Tensor(y_test))
  # the first epoch includes compiling the kernels; later epochs show the steady state
  print(f"kiln: {' / '.join(f'{t:.1f}' for t in kiln_times)} s per epoch")
  if not args.no_torch:
    try:
      import torch  # noqa: F401
    except ImportError:
      print("torch: not installed, comparison skipped")
    else:
      torch_times, torch_accuracy = train_torch(args, x_train, y_train, x_test, y_test)
      print(f"torch: {' / '.join(f'{t:.1f}' for t in torch_times)} s per epoch, "
            f"test accuracy {torch_accuracy * 100:.2f}%")
  print(f"test accuracy: {kiln_accuracy * 100:.1f}%")

if __name__ == "__main__":
  main()
