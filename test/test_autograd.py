"""Autograd across realize(): gradients still reach parameters behind realized values, as in PyTorch."""
import sys
import numpy as np
import pytest
import torch
from kiln import Tensor, helpers

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

@pytest.mark.parametrize("depth, raise_limit", [(10, True), (sys.getrecursionlimit() + 100, True),
                                               (sys.getrecursionlimit() + 100, False)])
def test_a_realized_graph_keeps_its_history_for_backward_however_deep(depth, raise_limit, monkeypatch):
  # realize finds the graphs that need gradients by recursion (to helpers.DEEP_RECURSION_LIMIT levels), and past the
  # recursion limit by one iterative pass (forced here by leaving the limit as it is)
  if not raise_limit: monkeypatch.setattr(helpers, "DEEP_RECURSION_LIMIT", 0)
  w = Tensor([1.0, 2.0], requires_grad=True)
  t = w
  for _ in range(depth): t = t + 0.5
  t.realize()
  np.testing.assert_allclose(t.numpy(), [1.0 + depth * 0.5, 2.0 + depth * 0.5], rtol=1e-5)
  (t * t).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), 2 * t.numpy(), rtol=1e-5)

def test_deep_recursion_raises_the_limit_inside_and_restores_it():
  limit = sys.getrecursionlimit()
  @helpers.deep_recursion
  def depth(n: int) -> int: return 0 if n == 0 else 1 + depth(n - 1)
  assert depth(limit + 500) == limit + 500   # a plain recursion that deep would raise RecursionError
  assert sys.getrecursionlimit() == limit
  @helpers.deep_recursion
  def fails(): raise KeyError("x")
  with pytest.raises(KeyError): fails()
  assert sys.getrecursionlimit() == limit

def test_backward_gives_zeros_to_a_target_only_behind_detach_and_sums_the_rest():
  # backward walks the gradient graph once; a target found only under a detach (outside that graph) gets zeros
  x, w = Tensor(X, requires_grad=True), Tensor(W, requires_grad=True)
  unrelated = Tensor(W, requires_grad=True)
  loss = ((x.detach() * 2) @ w).sum() + (w * w).sum()
  loss.backward()
  tw = torch.tensor(W, requires_grad=True)
  ((torch.tensor(X) * 2) @ tw).sum().add((tw * tw).sum()).backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())
  assert x.grad is not None and not x.grad.numpy().any()
  assert unrelated.grad is None

def test_only_updates_of_tensors_requiring_gradients_remember_an_identity():
  # an assign's gradient flows to its target alone: a momentum buffer's update reads the gradients (its graph reaches
  # the parameter) but neither needs nor keeps a history; the parameter's update keeps its identity for autograd
  from kiln.nn.optim import SGD
  w = Tensor(W, requires_grad=True)
  opt = SGD([w], lr=0.1, momentum=0.9)
  tw = torch.tensor(W, requires_grad=True)
  topt = torch.optim.SGD([tw], lr=0.1, momentum=0.9)
  with Tensor.train():
    for _ in range(3):
      opt.zero_grad(); topt.zero_grad()
      (Tensor(X) @ w).relu().sum().backward()
      (torch.tensor(X) @ tw).relu().sum().backward()
      opt.step(); topt.step()
      assert opt.b[0].uop.origin is None and w.uop.origin is not None
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6)

def test_backward_and_realize_pause_the_garbage_collector_and_restore_it(monkeypatch):
  import gc
  import kiln.tensor
  seen = []
  schedule = kiln.tensor.create_schedule
  def recording_schedule(roots):
    seen.append(gc.isenabled())
    return schedule(roots)
  monkeypatch.setattr(kiln.tensor, "create_schedule", recording_schedule)
  w = Tensor(W, requires_grad=True)
  was = gc.isenabled()
  try:
    for enabled in (True, False):
      gc.enable() if enabled else gc.disable()
      (Tensor(X) @ w).relu().sum().backward()
      w.grad.realize()
      assert gc.isenabled() is enabled
    assert seen and not any(seen)   # paused while scheduling
  finally:
    gc.enable() if was else gc.disable()
  np.testing.assert_allclose(w.grad.numpy(), 2 * torch_grad(lambda x, w: (x @ w).relu().sum()))
