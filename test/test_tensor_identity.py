"""Tensors made alike stay distinct: every creation call gives a node of its own (UNIQUE), for autograd, assign,
realize, optimizers, TinyJit and state loading, while equal computations still share nodes, fold and hit the
schedule cache. Checked against PyTorch."""
import numpy as np
import pytest
import torch
from kiln import Tensor, TinyJit, nn, dtypes
from kiln.nn.state import get_state_dict, load_state_dict
from kiln.schedule import cache as schedule_cache
from kiln.uop.ops import Ops

def test_same_creation_calls_get_separate_gradients():
  x_np = np.arange(8, dtype=np.float32)
  w1, w2 = Tensor.zeros(8, requires_grad=True), Tensor.zeros(8, requires_grad=True)
  ((Tensor(x_np) + w1) * 2 + w2 * 3).sum().backward()
  t1, t2 = torch.zeros(8, requires_grad=True), torch.zeros(8, requires_grad=True)
  ((torch.tensor(x_np) + t1) * 2 + t2 * 3).sum().backward()
  np.testing.assert_allclose(w1.grad.numpy(), t1.grad.numpy())
  np.testing.assert_allclose(w2.grad.numpy(), t2.grad.numpy())

def test_two_layernorms_each_get_their_own_gradient():
  x_np = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
  ln1, ln2, lin = nn.LayerNorm(8), nn.LayerNorm(8), nn.Linear(8, 8)
  tln1, tln2, tlin = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)
  with torch.no_grad():
    tlin.weight.copy_(torch.tensor(lin.weight.numpy()))
    tlin.bias.copy_(torch.tensor(lin.bias.numpy()))
  opt = nn.optim.SGD(nn.state.get_parameters([ln1, ln2, lin]), lr=0.1)
  with Tensor.train():
    loss = (ln2(lin(ln1(Tensor(x_np)))) * Tensor.arange(8)).sum()
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in [("ln1.w", ln1.weight), ("ln2.w", ln2.weight), ("ln1.b", ln1.bias),
                                                  ("ln2.b", ln2.bias)]}
    opt.step()
  tloss = (tln2(tlin(tln1(torch.tensor(x_np)))) * torch.arange(8)).sum()
  tloss.backward()
  want = {"ln1.w": tln1.weight.grad, "ln2.w": tln2.weight.grad, "ln1.b": tln1.bias.grad, "ln2.b": tln2.bias.grad}
  for name, g in grads.items(): np.testing.assert_allclose(g, want[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
  assert not np.allclose(ln1.weight.numpy(), ln2.weight.numpy())   # the step moved them apart

CREATORS = {
  "zeros": lambda: Tensor.zeros(4), "ones": lambda: Tensor.ones(4), "full": lambda: Tensor.full((4,), 2.5),
  "empty": lambda: Tensor.empty(4), "arange": lambda: Tensor.arange(4), "eye": lambda: Tensor.eye(2),
  "linspace": lambda: Tensor.linspace(0, 1, 4), "scalar": lambda: Tensor(3.0), "list": lambda: Tensor([1.0, 2.0]),
  "numpy": lambda: Tensor(np.ones(4, np.float32)), "zeros_like": lambda: Tensor.ones(4).zeros_like(),
  "ones_like": lambda: Tensor.ones(4).ones_like(), "full_like": lambda: Tensor.ones(4).full_like(7),
  "rand": lambda: (Tensor.manual_seed(0), Tensor.rand(4))[1], "randn": lambda: (Tensor.manual_seed(0), Tensor.randn(4))[1],
  "kaiming": lambda: (Tensor.manual_seed(0), Tensor.kaiming_uniform(2, 2))[1],
}

@pytest.mark.parametrize("name", CREATORS)
def test_every_creation_call_is_a_distinct_node_lazy_and_realized(name):
  a, b = CREATORS[name](), CREATORS[name]()
  assert a.uop is not b.uop
  Tensor.realize(a, b)   # realized together: still two tensors, each with its own storage
  assert a.uop is not b.uop
  assert a.uop.base.buffer is not b.uop.base.buffer
  np.testing.assert_array_equal(a.numpy(), b.numpy())

def test_realized_together_then_assigned_one_leaves_the_other():
  a, b = Tensor.zeros(3), Tensor.zeros(3)
  Tensor.realize(a, b)
  a.assign(a + 1).realize()
  assert a.tolist() == [1.0, 1.0, 1.0] and b.tolist() == [0.0, 0.0, 0.0]

def test_equal_computations_still_share_nodes():
  x = Tensor([1.0, 2.0]).realize()
  assert (x + 1).uop is (x + 1).uop
  assert (x * 2).exp().uop is (x * 2).exp().uop

def test_a_constant_used_once_folds_into_its_kernel():
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  schedule = (x * Tensor.ones(8) + Tensor.full((8,), 2.0)).schedule()
  assert len(schedule) == 1
  assert len(schedule[0].bufs) == 2   # the output and x: the constants are not buffers
  loads = [u for u in schedule[0].ast.toposort() if u.op is Ops.DEFINE_GLOBAL]
  assert len(loads) == 2

def test_fresh_constants_in_a_loop_hit_the_schedule_cache():
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  (x + Tensor.zeros(8)).realize()
  before = dict(schedule_cache.stats)
  for _ in range(5): (x + Tensor.zeros(8) * Tensor.arange(8)).realize()
  assert schedule_cache.stats["hits"] - before["hits"] >= 4
  assert schedule_cache.stats["misses"] - before["misses"] <= 1

def test_gradient_reaches_a_leaf_realized_after_the_graph_was_built():
  a, b = Tensor.ones(3, requires_grad=True), Tensor.ones(3, requires_grad=True)
  loss = (a * 2 + b * 3).sum()
  a.realize()
  loss.backward()
  assert a.grad.tolist() == [2.0] * 3 and b.grad.tolist() == [3.0] * 3

def test_gradient_flows_through_a_realized_intermediate_of_a_constant_leaf():
  a = Tensor.ones(3, requires_grad=True)
  h = (a * 2).realize()
  (h * h).sum().backward()
  assert a.grad.tolist() == [8.0] * 3

def test_a_realized_detach_stops_the_gradient():
  x = Tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
  y = x.detach().realize()
  (y * 5 + x).sum().backward()
  tx = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
  (tx.detach() * 5 + tx).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())

def test_reading_a_detached_view_keeps_the_gradient_through_the_view():
  x = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
  v = x.reshape(4)
  loss = (v * Tensor([1.0, 2.0, 3.0, 4.0])).sum()
  v.detach().numpy()
  loss.backward()
  assert x.grad.tolist() == [[1.0, 2.0], [3.0, 4.0]]

def test_a_detach_shares_storage_like_pytorch():
  x = Tensor([1.0, 2.0]).realize()
  y = x.detach().realize()
  assert y.uop is not x.uop
  x.assign(Tensor([5.0, 6.0])).realize()
  tx = torch.tensor([1.0, 2.0])
  ty = tx.detach()
  tx.copy_(torch.tensor([5.0, 6.0]))
  assert y.tolist() == ty.tolist()

@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_optimizer_state_of_same_shaped_parameters_stays_separate(opt_name):
  rng = np.random.default_rng(1)
  x_np = rng.standard_normal((4, 3)).astype(np.float32)
  w1, w2 = Tensor.zeros(3, requires_grad=True), Tensor.zeros(3, requires_grad=True)
  t1, t2 = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
  kw = {"lr": 0.1, "momentum": 0.9} if opt_name == "SGD" else {"lr": 0.1}
  opt = getattr(nn.optim, opt_name)([w1, w2], **kw)
  topt = getattr(torch.optim, opt_name)([t1, t2], **kw)
  with Tensor.train():
    for _ in range(3):
      opt.zero_grad()
      ((Tensor(x_np) * w1).sum() * 2 + ((Tensor(x_np) - w2) ** 2).sum()).backward()
      opt.step()
      topt.zero_grad()
      ((torch.tensor(x_np) * t1).sum() * 2 + ((torch.tensor(x_np) - t2) ** 2).sum()).backward()
      topt.step()
  np.testing.assert_allclose(w1.numpy(), t1.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w2.numpy(), t2.detach().numpy(), rtol=1e-5, atol=1e-6)

def test_tinyjit_takes_two_fresh_constant_inputs_as_two_inputs():
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor: return (a * 2 + b).realize()
  for i in range(4):
    a, b = Tensor.full((3,), float(i)), Tensor.full((3,), float(i))
    a, b = a.contiguous().realize(), b.contiguous().realize()
    assert f(a, b).tolist() == [3.0 * i] * 3

def test_loading_a_state_dict_fills_each_same_shaped_parameter():
  model = [nn.LayerNorm(4), nn.LayerNorm(4)]
  state = {"0.weight": Tensor([1.0, 2, 3, 4]), "0.bias": Tensor([0.0, 0, 0, 1]),
           "1.weight": Tensor([5.0, 6, 7, 8]), "1.bias": Tensor([0.0, 0, 0, 2])}
  load_state_dict(model, state, verbose=False)
  got = {k: v.tolist() for k, v in get_state_dict(model).items()}
  assert got == {k: v.tolist() for k, v in state.items()}

def test_missing_gradient_error_names_the_parameter_and_says_unused():
  model = [nn.Linear(2, 2), nn.Linear(2, 2)]
  opt = nn.optim.SGD(nn.state.get_parameters(model), lr=0.1)
  with Tensor.train():
    model[0](Tensor.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match=r"SGD: parameter 2 '1.weight' \(shape \(2, 2\)\) has no gradient: it is unused"):
      opt.step()

def test_missing_gradient_error_says_shared():
  a = Tensor.ones(3, requires_grad=True)
  b = Tensor(a)   # a second tensor over the same node
  opt = nn.optim.SGD([a, b], lr=0.1)
  with Tensor.train():
    (b * 2).sum().backward()
    with pytest.raises(RuntimeError, match="same graph node as parameter"):
      opt.step()

def test_a_unique_node_is_transparent_to_values_and_dtypes():
  for dtype in (dtypes.float32, dtypes.int32, dtypes.float16, dtypes.bool):
    a = Tensor.full((2, 3), 1, dtype=dtype)
    assert a.uop.op is Ops.UNIQUE and a.dtype == dtype and a.shape == (2, 3)
    np.testing.assert_array_equal(a.numpy(), np.ones((2, 3)).astype(a.numpy().dtype))

def test_a_realized_leaf_forgets_its_initializer_but_keeps_its_gradients():
  from kiln.gradient import gradient_graph
  p = Tensor.kaiming_uniform(8, 8, requires_grad=True)
  q = (p * 2).sum()   # built on p before it is realized
  p.realize()
  loss = (p * 3).sum()
  assert len(gradient_graph(loss.uop)) < 12   # the initializer's graph (random bits, scaling) is not walked
  loss.backward()
  np.testing.assert_allclose(p.grad.numpy(), np.full((8, 8), 3.0))
  p.grad = None
  q.backward()
  np.testing.assert_allclose(p.grad.numpy(), np.full((8, 8), 2.0))

def test_a_realized_tensor_computed_from_a_leaf_still_passes_gradients_to_it():
  w0 = Tensor([1.0, 2.0], requires_grad=True)
  w = (w0 * 2).realize()   # not a leaf: its graph reaches w0
  w.requires_grad = True
  (w * w).sum().backward()
  np.testing.assert_allclose(w0.grad.numpy(), [8.0, 16.0])   # d/dw0 of (2 w0)^2 = 8 w0
