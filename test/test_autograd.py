"""Autograd across realize(): gradients still reach parameters behind realized values, as in PyTorch."""
import sys
import numpy as np
import pytest
import torch
from kiln import Tensor

W = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
X = np.array([[1.0, 0.5], [-1.0, 2.0]], np.float32)

def torch_grad(fn):
  w = torch.tensor(W, requires_grad=True)
  fn(torch.tensor(X), w).backward()
  return w.grad.numpy()

def test_backward_after_loss_is_realized():
  w = Tensor(W, requires_grad=True)
  loss = (Tensor(X) @ w).relu().sum()
  assert loss.item() == float((X @ W).clip(0).sum())   # realizes the loss before backward
  loss.backward()
  np.testing.assert_allclose(w.grad.numpy(), torch_grad(lambda x, w: (x @ w).relu().sum()))

def test_backward_through_realized_intermediate():
  w = Tensor(W, requires_grad=True)
  hidden = (Tensor(X) @ w).realize()          # built into later graphs as a buffer
  loss = (hidden * hidden).sum()
  loss.backward()
  np.testing.assert_allclose(w.grad.numpy(), torch_grad(lambda x, w: ((x @ w) * (x @ w)).sum()))

def test_gradients_of_two_dependent_targets():
  x = Tensor(X, requires_grad=True)
  y = (x * 2).requires_grad_()
  (y * y).sum().backward()
  np.testing.assert_allclose(y.grad.numpy(), 2 * (2 * X))
  np.testing.assert_allclose(x.grad.numpy(), 8 * X)

def test_no_graph_kept_without_gradients():
  x = Tensor(X)
  for _ in range(3): x = (x + 1).realize()
  assert x.uop.origin is None   # nothing needs a gradient: realized values do not hold on to their graphs
  np.testing.assert_allclose(x.numpy(), X + 3)

def test_requires_grad_propagates_like_torch():
  x, y = Tensor(X, requires_grad=True), Tensor(W)
  tx, ty = torch.tensor(X, requires_grad=True), torch.tensor(W)
  cases = [(lambda a, b: a * b, True), (lambda a, b: (a @ b).sum(), True), (lambda a, b: b + 1, False),
           (lambda a, b: a.detach() * b, False), (lambda a, b: a > b, False)]
  for fn, want in cases:
    assert bool(fn(x, y).requires_grad) == fn(tx, ty).requires_grad == want
  assert y.requires_grad is None and x.requires_grad is True

def test_train_and_test_as_context_and_decorator():
  assert Tensor.training is False
  with Tensor.train():
    assert Tensor.training is True
    with Tensor.test(): assert Tensor.training is False
    assert Tensor.training is True
  @Tensor.train()
  def step(): return Tensor.training
  assert step() is True and Tensor.training is False
  x = Tensor.ones(1000)
  assert x.dropout(0.5).numpy().tolist() == [1.0] * 1000   # no dropout outside training
  with Tensor.train():
    kept = x.dropout(0.5).numpy()
  assert set(np.unique(kept).tolist()) == {0.0, 2.0} and 350 < (kept > 0).sum() < 650

def test_contiguous_backward_keeps_values_and_gradients():
  w = Tensor(W, requires_grad=True)
  loss = ((Tensor(X) @ w).contiguous_backward() * 3).relu().sum()
  loss.backward()
  np.testing.assert_allclose(loss.numpy(), float(np.maximum((X @ W) * 3, 0).sum()))
  np.testing.assert_allclose(w.grad.numpy(), torch_grad(lambda x, w: ((x @ w) * 3).relu().sum()))

@pytest.mark.parametrize("depth", [10, sys.getrecursionlimit() + 100])
def test_a_realized_graph_keeps_its_history_for_backward_however_deep(depth):
  # realize finds the graphs that need gradients by recursion, and past the recursion limit by one iterative pass
  w = Tensor([1.0, 2.0], requires_grad=True)
  t = w
  for _ in range(depth): t = t + 0.5
  t.realize()
  np.testing.assert_allclose(t.numpy(), [1.0 + depth * 0.5, 2.0 + depth * 0.5], rtol=1e-5)
  (t * t).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), 2 * t.numpy(), rtol=1e-5)
