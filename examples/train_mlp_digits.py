#!/usr/bin/env python3
"""Train a 64-128-10 MLP on scikit-learn's bundled 8x8 digits (1797 images) with kiln; prints the test accuracy.

  pip install -e . scikit-learn && python examples/train_mlp_digits.py

Settings (environment): EPOCHS (default 10), BS (batch size, 32), LR (Adam learning rate, 0.003), SEED (0).
"""
import time
import numpy as np
from sklearn.datasets import load_digits
from kiln import Tensor, getenv
from kiln.nn import Linear
from kiln.nn.optim import Adam
from kiln.nn.state import get_parameters
from kiln.helpers import trange

class MLP:
  """Two linear layers with a ReLU between them: 64 pixels -> 128 hidden -> 10 class logits."""
  def __init__(self, in_features: int = 64, hidden: int = 128, classes: int = 10):
    self.l1 = Linear(in_features, hidden)
    self.l2 = Linear(hidden, classes)

  def __call__(self, x: Tensor) -> Tensor:
    return self.l2(self.l1(x).relu())

def load_split(seed: int, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """The digits as float32 pixels in [0, 1] and int labels, shuffled with `seed` and split into train and test."""
  digits = load_digits()
  images = (digits.data / 16.0).astype(np.float32)
  labels = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(labels))
  n_test = int(len(labels) * test_fraction)
  test, train = order[:n_test], order[n_test:]
  return images[train], labels[train], images[test], labels[test]

def cross_entropy(logits: Tensor, one_hot: Tensor) -> Tensor:
  """Mean negative log-likelihood of the true classes, given as one-hot rows."""
  return -(logits.log_softmax(-1) * one_hot).sum() / logits.shape[0]

def main() -> None:
  epochs, batch_size, lr, seed = getenv("EPOCHS", 10), getenv("BS", 32), getenv("LR", 0.003), getenv("SEED", 0)
  if hasattr(Tensor, "manual_seed"): Tensor.manual_seed(seed)
  x_train, y_train, x_test, y_test = load_split(seed)
  one_hot_train = np.eye(10, dtype=np.float32)[y_train]

  model = MLP()
  optimizer = Adam(get_parameters(model), lr=lr)
  rng = np.random.default_rng(seed)
  steps_per_epoch = len(x_train) // batch_size  # the last partial batch is dropped, so every step has one shape
  start = time.perf_counter()
  with Tensor.train():
    for epoch in range(epochs):
      order = rng.permutation(len(x_train))
      losses = []
      bar = trange(steps_per_epoch, desc=f"epoch {epoch + 1}/{epochs}")
      for step in bar:
        batch = order[step * batch_size:(step + 1) * batch_size]
        optimizer.zero_grad()
        loss = cross_entropy(model(Tensor(x_train[batch])), Tensor(one_hot_train[batch]))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_description(f"epoch {epoch + 1}/{epochs} loss {np.mean(losses[-10:]):.3f}")

  predictions = model(Tensor(x_test)).numpy().argmax(axis=-1)
  accuracy = float((predictions == y_test).mean())
  print(f"trained in {time.perf_counter() - start:.1f} s")
  print(f"test accuracy: {accuracy * 100:.1f}%")

if __name__ == "__main__":
  main()
