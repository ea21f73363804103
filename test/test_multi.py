"""Tensors over several devices (virtual CPU devices CPU:1..CPU:4) against NumPy: shard layouts, elementwise ops,
reductions on and off the sharded axis, matmuls of every sharding, movement ops, gradients, assign, all-reduce."""
import os
import numpy as np
import pytest
from kiln import Tensor, Context, Device
from kiln.schedule.multi import MultiDeviceError, shard_bounds, lower

# the devices under test: virtual CPU devices, or KILN_MULTI_DEVICES (e.g. "CUDA,CPU:1,CPU:2,CPU:3" on one GPU)
_DEVICES = tuple(os.environ.get("KILN_MULTI_DEVICES", "CPU:1,CPU:2,CPU:3,CPU:4").split(","))
D2, D3, D4 = _DEVICES[:2], _DEVICES[:3], _DEVICES[:4]
RNG = np.random.default_rng(0)

def close(a, b, tol=1e-5): np.testing.assert_allclose(a, b, rtol=tol, atol=tol)

@pytest.mark.parametrize("devices", [D2, D3, D4])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_shard_layout_and_values(devices, axis):
  n = RNG.random((8, 6), dtype=np.float32)
  t = Tensor(n).shard(devices, axis)
  assert t.device == devices and t.shape == (8, 6) and t.uop.axis == axis
  shards = t.uop.src
  assert [s.device for s in shards] == list(devices)
  if axis is None: assert all(s.shape == (8, 6) for s in shards)
  else: assert sum(s.shape[axis] for s in shards) == n.shape[axis]
  close(t.numpy(), n)

def test_uneven_and_given_splits():
  assert shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
  assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
  t = Tensor(np.arange(10)).shard(D4, 0)
  assert [s.shape for s in t.uop.src] == [(3,), (3,), (3,), (1,)]
  assert (t + 1).sum().item() == 55
  u = Tensor(np.arange(12).reshape(3, 4)).shard(D3, 1, splits=(2, 0, 2))
  assert [s.shape for s in u.uop.src] == [(3, 2), (3, 0), (3, 2)]
  np.testing.assert_equal((u * 2).numpy(), np.arange(12).reshape(3, 4) * 2)
  with pytest.raises(ValueError, match="adding up to 4"): Tensor.ones(3, 4).shard(D2, 1, splits=(1, 2))

@pytest.mark.parametrize("devices", [D2, D3])
@pytest.mark.parametrize("axis_x,axis_w", [(None, None), (0, None), (None, 0), (0, 0), (1, 0), (0, 1), (1, 1)])
def test_elementwise_between_layouts(devices, axis_x, axis_w):
  a, b = RNG.random((6, 9), dtype=np.float32), RNG.random((6, 9), dtype=np.float32)
  x, w = Tensor(a).shard(devices, axis_x), Tensor(b).shard(devices, axis_w)
  close((x * w + 1).numpy(), a * b + 1)
  close(((x < w).where(x, -w)).numpy(), np.where(a < b, a, -b))

@pytest.mark.parametrize("devices", [D2, D3, D4])
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "prod", "mean"])
@pytest.mark.parametrize("reduce_axis", [None, 0, 1])
def test_reductions_on_and_off_the_sharded_axis(devices, axis, op, reduce_axis):
  n = (RNG.random((8, 5), dtype=np.float32) + 0.5) * RNG.choice([-1, 1], (8, 5))
  t = Tensor(n).shard(devices, axis)
  close(getattr(t, op)(reduce_axis).numpy(), getattr(np, op)(n, axis=reduce_axis), 1e-4)

@pytest.mark.parametrize("axis_x", [None, 0, 1])
@pytest.mark.parametrize("axis_w", [None, 0, 1])
def test_matmul_with_sharded_batch_and_weights(axis_x, axis_w):
  a, b = RNG.random((16, 12), dtype=np.float32), RNG.random((12, 10), dtype=np.float32)
  out = Tensor(a).shard(D2, axis_x) @ Tensor(b).shard(D2, axis_w)
  close(out.numpy(), a @ b, 1e-4)
  close((out.to(Device.DEFAULT) @ Tensor(b.T.copy())).numpy(), a @ b @ b.T, 1e-4)

@pytest.mark.parametrize("devices", [D2, D3])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_movement_ops(devices, axis):
  n = RNG.random((6, 4), dtype=np.float32)
  t = Tensor(n).shard(devices, axis)
  close(t.reshape(2, 3, 4).numpy(), n.reshape(2, 3, 4))
  close(t.reshape(24).numpy(), n.reshape(24))
  close(t.T.numpy(), n.T)
  close(t[1:5, 1:3].numpy(), n[1:5, 1:3])
  close(t[4:].numpy(), n[4:])
  close(t.pad(((1, 2), (0, 1))).numpy(), np.pad(n, ((1, 2), (0, 1))))
  close(t.flip(0).flip(1).numpy(), n[::-1, ::-1])
  close(t.reshape(6, 4, 1).expand(6, 4, 3).numpy(), np.broadcast_to(n[:, :, None], (6, 4, 3)))
  close(Tensor.cat(t, t, dim=1).numpy(), np.concatenate([n, n], 1))

def test_layouts_after_movement():
  t = Tensor.rand(26, 15, 7).shard(D3, axis=1)
  assert t.reshape(26, 3, 5, 7).uop.axis == 1
  assert t.reshape(26, 3, 35).uop.axis == 1
  assert t.reshape(26, 105).uop.axis == 1
  assert t.reshape(26, 1, 105).uop.axis == 2
  assert t.reshape(2, 13, 3, 5, 7).uop.axis == 2
  assert t.permute(2, 0, 1).uop.axis == 2
  assert t.reshape(26 * 15, 7).uop.axis is None   # the slices' rows are split: gathered, then reshaped
  close(t.reshape(26 * 15, 7).numpy(), t.numpy().reshape(26 * 15, 7))
  assert t[:, 0:5].uop.axis == 1 and [s.shape[1] for s in lower(t[:, 0:5].uop).src] == [5, 0, 0]

def test_softmax_and_layernorm_over_the_sharded_axis():
  n = RNG.random((4, 10), dtype=np.float32)
  t = Tensor(n).shard(D2, 1)
  e = np.exp(n - n.max(1, keepdims=True))
  close(t.softmax(1).numpy(), e / e.sum(1, keepdims=True))
  close(t.layernorm().numpy(), (n - n.mean(1, keepdims=True)) / np.sqrt(n.var(1, keepdims=True) + 1e-5), 1e-4)

@pytest.mark.parametrize("ring", [0, 2])
@pytest.mark.parametrize("devices", [D2, D3, D4])
def test_all_reduce_naive_and_ring(ring, devices):
  n = RNG.random((len(devices) * 7, 33), dtype=np.float32)
  with Context(RING=ring):
    out = Tensor(n).shard(devices, 0).sum(0).realize()
  close(out.numpy(), n.sum(0), 1e-4)
  shards = [Tensor(s).numpy() for s in out.uop.src]
  for s in shards[1:]: np.testing.assert_array_equal(s, shards[0])   # every device holds the same bits

def _copies(t: Tensor) -> int: return sum(item.ast.op.name == "COPY" for item in t.schedule())

def test_ring_for_large_values_over_three_or_more_devices():
  n = RNG.random((4, 1 << 18), dtype=np.float32)
  ins = sum(d != Device.DEFAULT for d in D4)   # the shards' copies from the default device
  with Context(RING=0):
    naive = Tensor(n).shard(D4, 0).sum(0)
    assert _copies(naive) == ins + 4 * 3   # the shards in, then every partial to every other device
    naive = naive.numpy()
  with Context(RING=1):
    ring = Tensor(n).shard(D4, 0).sum(0)
    assert _copies(ring) == ins + 2 * 3 * 4   # the shards in, then 2(n-1) steps of a chunk a device
    ring = ring.numpy()
  close(naive, n.sum(0), 1e-5)
  close(ring, naive, 1e-6)
  with Context(RING=1): assert _copies(Tensor(n).shard(D2, 0).sum(0)) == sum(d != Device.DEFAULT for d in D2) + 2

def test_gradients():
  x = Tensor([[1., 2, 3, 4], [5, 6, 7, 8]]).shard(D2, axis=0)
  w = Tensor([1., 2, 3, 4], requires_grad=True).shard(D2)
  (x * w).mean().backward()
  close(w.grad.numpy(), [0.75, 1., 1.25, 1.5])
  w0 = Tensor([1., 2, 3, 4], requires_grad=True)   # through the shard, to the tensor on one device
  (x * w0.shard(D2)).mean().backward()
  close(w0.grad.numpy(), [0.75, 1., 1.25, 1.5])
  assert w0.grad.device == Device.DEFAULT

@pytest.mark.parametrize("axis_x,axis_w", [(0, None), (None, 1), (1, 0), (0, 0)])
def test_matmul_gradients_match_one_device(axis_x, axis_w):
  import torch
  a, b = RNG.random((8, 6), dtype=np.float32), RNG.random((6, 4), dtype=np.float32)
  x = Tensor(a, requires_grad=True).shard(D2, axis_x)
  w = Tensor(b, requires_grad=True).shard(D2, axis_w)
  (x @ w).relu().sum().backward()
  ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  (ta @ tb).relu().sum().backward()
  close(x.grad.numpy(), ta.grad.numpy(), 1e-4)
  close(w.grad.numpy(), tb.grad.numpy(), 1e-4)
  assert x.grad.device == D2 and x.grad.uop.axis == axis_x

@pytest.mark.parametrize("axis", [None, 0])
def test_assign_keeps_the_layout(axis):
  t = Tensor.zeros(4, 4).contiguous().shard(D2, axis).realize()
  bufs = [s.base.buffer for s in t.uop.src]
  t.assign(t + 1).realize()
  t.assign(t * 3).realize()
  t += Tensor.ones(4, 4).shard(D2, 1)   # another layout: brought to the target's
  t.realize()
  close(t.numpy(), np.full((4, 4), 4.))
  assert [s.base.buffer for s in t.uop.src] == bufs and t.uop.axis == axis

def test_realized_multi_values_are_reused():
  t = (Tensor(np.arange(8.0, dtype=np.float32)).shard(D2, 0) * 2).realize()
  assert all(s.base.op.name == "BUFFER" for s in t.uop.src)
  y = (t + 1)
  assert len(y.schedule()) == 2   # one kernel a device, reading the realized slices
  close(y.numpy(), np.arange(8.0) * 2 + 1)

def test_copies_and_replicas():
  n = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(n).to(D3)
  assert t.device == D3 and t.uop.axis is None
  close(t.to(D3[1]).numpy(), n)
  assert Tensor(n, device=D2).device == D2
  close(Tensor(n).shard(D2, 1).to(D3).numpy(), n)
  close(Tensor.full((2, 3), 7.0, device=D2).numpy(), np.full((2, 3), 7.0))
  close(Tensor.arange(5, device=D2).numpy(), np.arange(5))

def test_errors_name_the_op_and_the_line():
  t = Tensor.ones(4).shard(D2, 0)
  with pytest.raises(RuntimeError, match=r"add: .*different devices.*test_multi.py"): t + Tensor.ones(4)
  with pytest.raises(RuntimeError, match="different devices"): t + Tensor.ones(4).shard(D3, 0)
  with pytest.raises(RuntimeError, match="several devices already"): t.shard(D3)
  with pytest.raises(RuntimeError, match="assign: value on"): t.assign(Tensor.ones(4))
  with pytest.raises(ValueError, match="distinct"): Tensor.ones(4).shard((D2[0], D2[0]))

def test_results_computed_from_an_overwritten_buffer_are_forgotten():
  a = Tensor(np.arange(4, dtype=np.float32)).shard(D2, 0).realize()
  b = (a * 2).realize()
  b.assign(b + 1).realize()
  close((a * 2).numpy(), np.arange(4) * 2)   # computed again, not read from b's overwritten buffers
  pending = a * 3
  a.assign(a + 10).realize()
  close(pending.numpy(), np.arange(4) * 3)   # PyTorch order: built before the assign, it holds the old values
  close(a.numpy(), np.arange(4) + 10)

def test_detach_is_a_new_tensor_over_the_same_storage():
  x = Tensor.ones(4).contiguous().shard(D2, 0).realize()
  y = x.detach().realize()
  assert y.uop is not x.uop
  y.assign(y * 0 + 5).realize()
  close(x.numpy(), np.full(4, 5.0))   # as in PyTorch: detach shares the storage

def test_creation_and_random_over_several_devices():
  assert Tensor.empty(4, 2, device=D2).device == D2
  close(Tensor.zeros(2, 2, device=D2).numpy(), np.zeros((2, 2)))
  with pytest.raises(ValueError, match="rand: random values are drawn on one device"): Tensor.rand(4, device=D2)
  t = Tensor.ones(16, 16).shard(D2, 0)
  r = Tensor.rand_like(t)
  assert r.device == D2 and r.uop.axis == 0 and r.shape == (16, 16)
  halves = r.numpy()
  assert not np.allclose(halves[:8], halves[8:])   # each device draws its own slice
  rep = Tensor.randn_like(Tensor.ones(8).to(D2)).realize()
  np.testing.assert_array_equal(Tensor(rep.uop.src[0]).numpy(), Tensor(rep.uop.src[1]).numpy())   # one value
  with Tensor.train():
    values, counts = np.unique(Tensor.ones(512).shard(D2, 0).dropout(0.5).numpy(), return_counts=True)
  assert set(values) == {0, 2} and 180 < counts[0] < 332

@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_empty_slices(count):
  devices = D4[:count]
  for data in ([1, 2, 3, 4], [1, 2, 3], [1, 2], [1]):
    x = ((Tensor(data).shard(devices, axis=0) + 1).realize() - 1).realize()
    np.testing.assert_equal(x.numpy(), data)
    assert x.sum().item() == sum(data)

class _Net:
  def __init__(self):
    from kiln import nn
    self.conv, self.bn, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm(8), nn.Linear(8, 5)
  def __call__(self, x: Tensor) -> Tensor:
    return self.head(self.bn(self.conv(x)).relu().mean((2, 3)))

def _train(devices, steps: int = 3) -> tuple[list[float], list[np.ndarray]]:
  from kiln import nn
  from kiln.nn.state import get_parameters
  Tensor.manual_seed(0)
  model = _Net()
  params = get_parameters(model)
  if devices:
    for p in params: p.shard_(devices).realize()
  opt = nn.optim.SGD(params, lr=0.1, momentum=0.9)
  x_np, y_np = np.random.default_rng(1).random((8, 3, 6, 6), dtype=np.float32), np.arange(8) % 5
  losses = []
  with Tensor.train():
    for _ in range(steps):
      x, y = Tensor(x_np), Tensor(y_np)
      if devices: x, y = x.shard(devices, 0), y.shard(devices, 0)
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      losses.append(loss.item())
  return losses, [p.numpy() for p in params] + [model.bn.running_mean.numpy(), model.bn.running_var.numpy()]

@pytest.mark.parametrize("devices", [D2, D4])
def test_data_parallel_training_matches_one_device(devices):
  """The batch sharded, the weights replicated: the gradients all-reduce, batch norm's statistics are over the whole
  batch, and every weight ends as on one device."""
  losses, weights = _train(None)
  dp_losses, dp_weights = _train(devices)
  close(dp_losses, losses, 1e-5)
  for a, b in zip(dp_weights, weights): close(a, b, 1e-5)

def test_tinyjit_with_sharded_inputs_outputs_and_state():
  from kiln import TinyJit
  @TinyJit
  def total(x: Tensor) -> Tensor: return (x + 1).contiguous().sum()
  @TinyJit
  def shard_inside(x: Tensor) -> Tensor: return (x.shard(D2, 0) + 1).contiguous().sum()
  @TinyJit
  def add(a: Tensor, b: Tensor) -> Tensor: return (a + b).realize()
  for i in range(5):
    assert total(Tensor.arange(4).contiguous().realize().shard(D2, 0).realize()).item() == 10
    assert shard_inside(Tensor.arange(4).contiguous().realize()).item() == 10
    c = add(Tensor.ones(64).contiguous().shard(D2, 0), (Tensor.ones(64) * i).contiguous().shard(D2, 0))
    assert c.device == D2 and c.uop.axis == 0
    close(c.numpy(), np.full(64, 1.0 + i))
  assert add.captured is not None and len(add.captured.items) == 2   # a kernel a device

def test_data_parallel_training_under_tinyjit():
  from kiln import TinyJit, nn
  from kiln.nn.state import get_parameters
  x_np = np.random.default_rng(2).random((8, 4), dtype=np.float32)
  y_np = np.arange(8) % 3
  def run(devices):
    Tensor.manual_seed(0)
    model = nn.Linear(4, 3)
    params = get_parameters(model)
    if devices:
      for p in params: p.shard_(devices).realize()
    opt = nn.optim.Adam(params, lr=0.05)
    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss
    losses = []
    with Tensor.train():
      for _ in range(5):
        x, y = Tensor(x_np), Tensor(y_np)
        if devices: x, y = x.shard(devices, 0), y.shard(devices, 0)
        losses.append(step(x.realize(), y.realize()).item())
    assert step.captured is not None
    return losses, [p.numpy() for p in params]
  losses, weights = run(None)
  dp_losses, dp_weights = run(D2)
  close(dp_losses, losses, 1e-5)
  for a, b in zip(dp_weights, weights): close(a, b, 1e-5)

def test_state_dicts_setitem_and_bitcast_over_several_devices(tmp_path):
  from kiln import nn
  from kiln.nn.state import get_state_dict, load_state_dict, safe_save, safe_load
  model = nn.Linear(4, 6)
  expected = {k: v.numpy() for k, v in get_state_dict(model).items()}
  model.weight.shard_(D2, 0).realize()
  safe_save(get_state_dict(model), str(tmp_path / "m.safetensors"))   # gathered to be written
  other = nn.Linear(4, 6)
  other.weight.shard_(D2, 0).realize()
  other.bias.shard_(D2).realize()
  load_state_dict(other, safe_load(str(tmp_path / "m.safetensors")), verbose=False)
  assert other.weight.device == D2 and other.weight.uop.axis == 0 and other.bias.uop.axis is None   # layouts kept
  close(other.weight.numpy(), expected["weight"])
  close(other.bias.numpy(), expected["bias"])
  t = Tensor.zeros(4, 4).contiguous().shard(D2, 0).realize()
  t[1:3, 1] = 5
  t[0] = Tensor([1.0, 2, 3, 4]).shard(D2)
  want = np.zeros((4, 4)); want[1:3, 1] = 5; want[0] = [1, 2, 3, 4]
  close(t.numpy(), want)
  np.testing.assert_equal(Tensor([1, 2], dtype="uint16").shard(D2).bitcast("uint8").numpy(), [1, 0, 2, 0])

def test_a_replicated_kv_cache_at_a_symbolic_position_under_tinyjit():
  from kiln import TinyJit, Variable
  batch, context = 2, 8
  class Attention:
    @TinyJit
    def __call__(self, xk: Tensor, start_pos, first: bool) -> None:
      if not hasattr(self, "cache"): self.cache = Tensor.zeros(batch, context, 1, 1).shard(D2).contiguous().realize()
      keys = xk if first else self.cache.shrink((None, (0, start_pos), None, None)).cat(xk, dim=1).contiguous()
      self.cache.assign(keys.pad((None, (0, context - start_pos - xk.shape[1]), None, None)).contiguous()).realize()
  attention = Attention()
  attention(Tensor.ones(batch, 3, 1, 1).shard(D2).contiguous(), 0, True)   # lazy inputs over several devices
  for i in range(3, 6):
    attention(Tensor.ones(batch, 1, 1, 1).shard(D2).contiguous(), Variable("start_pos", 1, context - 1).bind(i), False)
  assert attention.cache.device == D2
  close(attention.cache.flatten().numpy(), [1, 1, 1, 1, 1, 1, 0, 0] * 2)

def test_a_contiguous_run_is_copied_from_its_place():
  from kiln import TinyJit
  n = RNG.random((8, 6), dtype=np.float32)
  x = Tensor(n).realize()
  items = x.shard(D2, 0).schedule()
  assert [i.ast.op.name for i in items] == ["COPY"] * sum(d != Device.DEFAULT for d in D2)   # rows: no kernel first
  close(x.shard(D2, 0).numpy(), n)
  close(x[2:5].to(D2[1]).numpy(), n[2:5])
  close(x.reshape(48)[7:30].to(D2[1]).numpy(), n.reshape(48)[7:30])
  close(x[:, 1:3].to(D2[1]).numpy(), n[:, 1:3])   # not a run: a kernel gathers it first
  @TinyJit
  def split_sum(t: Tensor) -> Tensor: return (t.shard(D2, 0) * 2).sum(0)
  for i in range(4):   # new contents every call: a replay copies each call's input from its offsets
    m = RNG.random((8, 6), dtype=np.float32)
    close(split_sum(Tensor(m).realize()).numpy(), (m * 2).sum(0), 1e-5)
