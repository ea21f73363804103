"""The schedule cache with `assign` (kiln/schedule/cache.py): a graph that overwrites buffers is served from a
template once its structure was scheduled, and a hit gives exactly what scheduling anew gives: the same values in
the same buffers (optimizer steps, BatchNorm running statistics, slice assigns, assign chains), readers of a buffer's
old contents run before its overwrite, and the updated tensor gets a new identity over its old storage."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, Context, nn
from kiln.nn.optim import SGD, Adam, AdamW
from kiln.nn.state import get_parameters
from kiln.schedule import cache

def _stats_delta(fn):
  before = dict(cache.stats)
  out = fn()
  return out, {k: cache.stats[k] - before[k] for k in before}

class SmallNet:
  """conv-bn-relu, mean pool, linear: parameters, momentum state and BatchNorm running statistics are all assigned."""
  def __init__(self):
    self.conv, self.bn = nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
    self.head = nn.Linear(4, 3)
  def __call__(self, x: Tensor) -> Tensor:
    return self.head(self.bn(self.conv(x)).relu().mean((2, 3)))

OPTIMIZERS = {
  "sgd_momentum": lambda params: SGD(params, lr=0.05, momentum=0.9),
  "sgd_nesterov": lambda params: SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
  "adam": lambda params: Adam(params, lr=0.01),
  "adamw": lambda params: AdamW(params, lr=0.01, weight_decay=0.1),
  "sgd_fused": lambda params: SGD(params, lr=0.05, momentum=0.9, fused=True),
}

def _train(make_optimizer, cached: bool, steps: int = 4) -> tuple[list[np.ndarray], list[dict]]:
  """Every parameter and BatchNorm statistic after `steps` steps of the same seeded model, and each step's cache
  stats."""
  Tensor.manual_seed(3)
  rng = np.random.default_rng(0)
  with Context(SCHEDULE_CACHE=int(cached)):
    model = SmallNet()
    params = get_parameters(model)
    opt = make_optimizer(params)
    x = Tensor(rng.standard_normal((2, 2, 5, 5)).astype(np.float32)).realize()
    y = Tensor(rng.integers(0, 3, 2).astype(np.int32)).realize()
    deltas = []
    with Tensor.train():
      for _ in range(steps):
        def step():
          opt.zero_grad()
          loss = model(x).sparse_categorical_crossentropy(y)
          loss.backward()
          Tensor.realize(loss, *opt.schedule_step())
        deltas.append(_stats_delta(step)[1])
    return [p.numpy() for p in params], deltas

@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_are_served_from_the_cache_and_match_the_uncached_run(name):
  got, deltas = _train(OPTIMIZERS[name], cached=True)
  want, uncached = _train(OPTIMIZERS[name], cached=False)
  assert all(d == {"hits": 0, "misses": 0, "uncached": 0} for d in uncached)
  # the first step builds the optimizer state and the second reads it realized: from the third on, every step hits
  for step, delta in enumerate(deltas[2:], start=2):
    assert delta["misses"] == 0 and delta["uncached"] == 0 and delta["hits"] >= 1, (step, delta)
  assert len(got) == len(want)
  for i, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_array_equal(g, w, err_msg=f"{name}: parameter {i} of shape {w.shape}")

def test_batchnorm_running_statistics_match_the_uncached_run():
  def run(cached: bool):
    Tensor.manual_seed(1)
    rng = np.random.default_rng(1)
    with Context(SCHEDULE_CACHE=int(cached)):
      norm = nn.BatchNorm2d(3)
      hits = 0
      with Tensor.train():
        for _ in range(4):
          x = Tensor(rng.standard_normal((4, 3, 2, 2)).astype(np.float32))
          _, delta = _stats_delta(lambda: Tensor.realize(norm(x), norm.running_mean, norm.running_var,
                                                         norm.num_batches_tracked))
          hits += delta["hits"]
      return [norm.running_mean.numpy(), norm.running_var.numpy(), norm.num_batches_tracked.numpy()], hits
  (got, hits), (want, _) = run(True), run(False)
  assert hits >= 2
  for g, w in zip(got, want): np.testing.assert_array_equal(g, w)
  assert int(got[2]) == 4

def test_a_hit_gives_the_assigned_tensor_a_new_identity_over_the_same_storage():
  w = Tensor(np.float32([1, 2, 3])).realize()
  buf = w.uop.base.buffer
  seen_nodes = []
  for step in range(4):
    before = w.uop
    old_view = w * 1   # built on the old contents: computed before the overwrite
    _, delta = _stats_delta(lambda: w.assign(w * 2 + 1).realize())
    if step >= 1: assert delta["hits"] >= 1, delta
    assert w.uop.base.buffer is buf, "the assign must write into the tensor's own buffer"
    assert w.uop is not before and w.uop.base is not before.base
    assert before.forward is None, "the old identity must not look realized to the new contents"
    seen_nodes.append(w.uop.base)
    np.testing.assert_array_equal(old_view.numpy(), (np.float32([1, 2, 3]) + 1) * 2 ** step - 1)
  assert len(set(seen_nodes)) == 4
  np.testing.assert_array_equal(w.numpy(), (np.float32([1, 2, 3]) + 1) * 16 - 1)

def test_readers_of_old_contents_realized_with_the_assign_run_first_on_a_hit():
  a, b = Tensor(np.float32([1, 2])).realize(), Tensor(np.float32([10, 20])).realize()
  for step in range(3):
    old_sum = (a + b).contiguous()
    a.assign(a * 3)
    _, delta = _stats_delta(lambda: Tensor.realize(old_sum, a))
    if step >= 1: assert delta["hits"] == 1 and delta["misses"] == 0, delta
    np.testing.assert_array_equal(old_sum.numpy(), np.float32([1, 2]) * 3 ** step + [10, 20])
  np.testing.assert_array_equal(a.numpy(), np.float32([1, 2]) * 27)

def test_which_buffer_is_assigned_is_part_of_the_key():
  a, b = Tensor(np.float32([1, 2])).realize(), Tensor(np.float32([10, 20])).realize()
  for _ in range(2):
    a.assign(a + b).realize()
    b.assign(a + b).realize()   # the same value graph, the other target: must not reuse a's template
  # a: 1 -> 11 -> 52; b: 10 -> 21 -> 73 ... checked against the same loop in NumPy
  na, nb = np.float32([1, 2]), np.float32([10, 20])
  for _ in range(2):
    na = na + nb
    nb = na + nb
  np.testing.assert_array_equal(a.numpy(), na)
  np.testing.assert_array_equal(b.numpy(), nb)

def test_aliasing_between_the_target_and_the_value_is_part_of_the_key():
  w, v = Tensor(np.float32([1, 2])).realize(), Tensor(np.float32([5, 5])).realize()
  for _ in range(2): w.assign(w.flip(0) + v).realize()     # reads the target at other indices: via a temporary
  for _ in range(2): w.assign(v.flip(0) + v).realize()     # same structure, another buffer: in place
  np.testing.assert_array_equal(w.numpy(), [10, 10])
  w2 = Tensor(np.float32([1, 2])).realize()
  for _ in range(3): w2.assign(w2.flip(0) + v).realize()
  np.testing.assert_array_equal(w2.numpy(), np.float32([2, 1]) + 15)

@pytest.mark.parametrize("cached", [True, False])
def test_assign_chains_match(cached):
  with Context(SCHEDULE_CACHE=int(cached)):
    b = Tensor(np.float32([1, 2, 3, 4])).realize()
    expected = np.float32([1, 2, 3, 4])
    hits = 0
    for _ in range(4):
      before = b * 1
      b.assign(b + 1)
      b.assign(b * 2)    # a second pending update of the same buffer
      middle = b - 1      # reads the chain's result
      b.assign(b.flip(0))  # self-reading through a flip: a temporary
      _, delta = _stats_delta(lambda: Tensor.realize(b, middle))
      hits += delta["hits"]
      np.testing.assert_array_equal(before.numpy(), expected)
      np.testing.assert_array_equal(middle.numpy(), (expected + 1) * 2 - 1)
      expected = ((expected + 1) * 2)[::-1]
      np.testing.assert_array_equal(b.numpy(), expected)
    assert (hits >= 2) == cached

@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_slice_assigns_match_numpy_and_repeat_from_the_cache(dtype):
  cache_t = Tensor.zeros(3, 8, dtype=dtype).contiguous().realize()
  want = np.zeros((3, 8), dtype=dtype)
  hits = 0
  for step in range(6):
    pos = step % 2   # two positions: two structures, each served from the cache after its first use
    value = np.full((3, 1), step + 1, dtype=dtype)
    _, delta = _stats_delta(lambda: cache_t[:, pos:pos + 1].assign(Tensor(value)).realize())
    hits += delta["hits"]
    want[:, pos:pos + 1] = value
    np.testing.assert_array_equal(cache_t.numpy(), want)
  assert hits >= 3

def test_cached_and_uncached_slice_assign_with_readers_agree():
  def run(cached: bool) -> list[np.ndarray]:
    with Context(SCHEDULE_CACHE=int(cached)):
      x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
      outs = []
      for step in range(3):
        flipped = x.flip(1)         # PyTorch copies a flip: it keeps the old values
        row = x[1]                  # a slice aliases: it sees the new values
        x[:, 1:3].assign(x[:, 1:3] * 2 + step)
        outs += [flipped.numpy(), row.numpy(), x.numpy()]
      return outs
  for g, w in zip(run(True), run(False)): np.testing.assert_array_equal(g, w)

def test_results_of_an_overwritten_buffer_are_recomputed_after_a_hit():
  w = Tensor(np.float32([1, 2])).realize()
  for step in range(3):
    doubled = (w * 2).realize()   # registered as computed from w's buffer
    w.assign(w + 1).realize()
    again = (w * 2).realize()     # the same graph over the new identity: computed from the new contents
    np.testing.assert_array_equal(doubled.numpy(), (np.float32([1, 2]) + step) * 2)
    np.testing.assert_array_equal(again.numpy(), (np.float32([1, 2]) + step + 1) * 2)

@pytest.mark.parametrize("cached", [True, False])
def test_a_result_read_before_an_assign_in_its_run_is_not_reused_for_the_new_contents(cached):
  # the copy is computed in the run that overwrites x (read first), and its graph node stays alive (held here;
  # a cache or autograd's origin can hold it too): the same graph built after the assign reads the new contents,
  # as x moved to a new node over its storage (a graph built before the run keeps the old node and its result:
  # test_fuzz_graphs seed 100001)
  with Context(SCHEDULE_CACHE=int(cached)):
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    held, want = [], np.arange(4, dtype=np.float32)
    for _ in range(3):
      copy = x.flip(0).contiguous()
      held.append(copy.uop)
      x[1:3].assign(x[1:3] * 2)
      np.testing.assert_array_equal(copy.numpy(), want[::-1])
      want[1:3] *= 2
      np.testing.assert_array_equal(x.numpy(), want)

def test_a_result_whose_own_buffer_is_overwritten_is_computed_again():
  # realized together, the results are registered under their own buffers; one overwritten, an equal graph built
  # later (the old nodes held alive) is computed again, never read from the overwritten buffer
  w = Tensor(np.float32([1, 2])).realize()
  for step in range(3):
    doubled, tripled = w * 2, w * 3
    held = [doubled.uop, tripled.uop]
    Tensor.realize_all([doubled, tripled])
    tripled.assign(Tensor(np.float32([7, 7]))).realize()
    np.testing.assert_array_equal((w * 3).numpy(), [3, 6])
    np.testing.assert_array_equal((w * 2).numpy(), [2, 4])
    doubled.assign(Tensor(np.float32([5, 5]))).realize()
    np.testing.assert_array_equal((w * 2).numpy(), [2, 4])
    assert held

# ---------------- distinct tensors of one value keep distinct buffers ----------------

class TwinNorms:
  """Two same-shaped BatchNorms over one input, summed: their weights and biases get identical gradient graphs."""
  def __init__(self):
    self.conv, self.out = nn.Conv2d(2, 4, 1, bias=False), nn.Conv2d(4, 3, 1, bias=False)
    self.norm_a, self.norm_b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)
  def __call__(self, x: Tensor) -> Tensor:
    h = self.conv(x)
    return self.out((self.norm_a(h) + self.norm_b(h)).relu()).mean((2, 3))

@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_parameters_with_identical_gradients_train_apart_like_torch(momentum):
  # their first updates (and zero momentum states) differ only below a UNIQUE, which the scheduler drops: they used to
  # share one buffer, so one parameter's update overwrote the other's and the next gradients were doubled
  import torch
  Tensor.manual_seed(0)
  net = TwinNorms()
  conv, out = torch.nn.Conv2d(2, 4, 1, bias=False), torch.nn.Conv2d(4, 3, 1, bias=False)
  conv.weight.data, out.weight.data = torch.tensor(net.conv.weight.numpy()), torch.tensor(net.out.weight.numpy())
  norm_a, norm_b = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)
  opt = SGD(get_parameters(net), lr=0.1, momentum=momentum)
  torch_opt = torch.optim.SGD([*conv.parameters(), *out.parameters(), *norm_a.parameters(), *norm_b.parameters()],
                              lr=0.1, momentum=momentum)
  images = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)
  labels = np.int32([0, 2])
  x, y = Tensor(images).realize(), Tensor(labels).realize()
  with Tensor.train():
    for step in range(4):
      opt.zero_grad()
      loss = net(x).sparse_categorical_crossentropy(y)
      loss.backward()
      Tensor.realize(loss, *opt.schedule_step())
      torch_opt.zero_grad()
      h = conv(torch.tensor(images))
      torch_loss = torch.nn.functional.cross_entropy(out(torch.relu(norm_a(h) + norm_b(h))).mean((2, 3)),
                                                     torch.tensor(labels).long())
      torch_loss.backward()
      torch_opt.step()
      np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5, err_msg=f"step {step}")
      for name, mine, theirs in (("norm_a.bias", net.norm_a.bias, norm_a.bias), ("norm_b.weight", net.norm_b.weight,
                                 norm_b.weight), ("out.weight", net.out.weight, out.weight)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=f"step {step}: {name}.grad")
        np.testing.assert_allclose(mine.numpy(), theirs.detach().numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=f"step {step}: {name}")
  assert net.norm_a.bias.uop.base.buffer is not net.norm_b.bias.uop.base.buffer

def test_two_tensors_whose_graphs_differ_below_a_detach_get_their_own_buffers():
  a, b = Tensor.zeros(3).contiguous(), Tensor.zeros(3).contiguous()   # distinct zeros, equal once UNIQUE is dropped
  g = Tensor([1.0, 2.0, 3.0]).realize()
  a.assign(a.detach() + g)
  b.assign(b.detach() + g)
  Tensor.realize(a, b)
  assert a.uop.base.buffer is not b.uop.base.buffer
  a.assign(a * 10).realize()
  np.testing.assert_array_equal(a.numpy(), [10, 20, 30])
  np.testing.assert_array_equal(b.numpy(), [1, 2, 3])

def test_training_steps_do_not_chain_their_graphs_together():
  # an assigned parameter's result used to remember the whole assign (its update, gradients and forward pass), whose
  # target remembered the previous step's: every backward() walked all earlier steps and none of them was freed
  from kiln.gradient import gradient_graph
  Tensor.manual_seed(2)
  net = SmallNet()
  opt = SGD(get_parameters(net), lr=0.01, momentum=0.9)
  x = Tensor(np.random.default_rng(2).standard_normal((2, 2, 5, 5)).astype(np.float32)).realize()
  y = Tensor(np.int32([0, 2])).realize()
  sizes = []
  with Tensor.train():
    for _ in range(6):
      opt.zero_grad()
      loss = net(x).sparse_categorical_crossentropy(y)
      sizes.append(len(gradient_graph(loss.uop, whole=True)))
      loss.backward()
      Tensor.realize(loss, *opt.schedule_step())
  assert len(set(sizes[2:])) == 1, f"the graph behind the loss grows step by step: {sizes}"

def test_gradients_still_reach_the_history_of_an_assigned_tensor():
  x = Tensor([1.0, 2.0], requires_grad=True)
  b = (x * 3).contiguous().realize()
  for _ in range(3): b.assign(b + 1).realize()   # in place, as PyTorch's b.add_(1) on a non-leaf
  (b * b).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), 2 * (np.float32([3, 6]) + 3) * 3)
