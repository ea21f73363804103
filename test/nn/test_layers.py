"""kiln.nn layers against torch.nn: same weights (loaded by state-dict key), same outputs and gradients."""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
from helpers import assert_close
from kiln import Tensor, dtypes, nn
from kiln.nn.state import get_state_dict, load_state_dict

RNG_SEED = 0
# torch notes that its own 'same' padding with an even kernel copies the input; nothing kiln should act on
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")

def random_state(torch_layer: torch.nn.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random values for every entry of the torch layer's state dict (positive variances, int counters kept)."""
  state = {}
  for key, value in torch_layer.state_dict().items():
    if not value.is_floating_point(): state[key] = np.array(rng.integers(0, 5), dtype=np.int64).reshape(value.shape)
    elif key.endswith("running_var"): state[key] = rng.uniform(0.5, 2.0, value.shape).astype(np.float32)
    else: state[key] = rng.uniform(-1.0, 1.0, value.shape).astype(np.float32)
  return state

def share_weights(layer, torch_layer: torch.nn.Module, rng: np.random.Generator) -> list[str]:
  """Load the same random state into both layers (keys must match); the torch parameters' names are returned."""
  state = random_state(torch_layer, rng)
  assert list(get_state_dict(layer)) == list(state), f"state-dict keys {list(get_state_dict(layer))} != {list(state)}"
  torch_layer.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
  load_state_dict(layer, {k: Tensor(v) for k, v in state.items()})
  names = [name for name, _ in torch_layer.named_parameters()]
  kiln_state = get_state_dict(layer)
  for name in names: kiln_state[name].requires_grad = True
  return names

def compare_with_torch(layer, torch_layer: torch.nn.Module, input_shape: tuple[int, ...], what: str,
                       atol: float = 1e-5, rtol: float = 1e-4, train: bool = False) -> None:
  """Forward and backward (input and parameter gradients) of `layer` and `torch_layer` on one random input."""
  rng = np.random.default_rng(RNG_SEED)
  names = share_weights(layer, torch_layer, rng)
  x_np = rng.standard_normal(input_shape).astype(np.float32)
  x = Tensor(x_np, requires_grad=True)
  with Tensor.train(train): out = layer(x)
  upstream = rng.standard_normal(out.shape).astype(np.float32)
  (out * Tensor(upstream)).sum().backward()

  torch_layer.train(train)
  x_t = torch.tensor(x_np, requires_grad=True)
  out_t = torch_layer(x_t)
  (out_t * torch.from_numpy(upstream)).sum().backward()

  assert_close(out.numpy(), out_t.detach().numpy(), f"{what} output", atol, rtol)
  assert_close(x.grad.numpy(), x_t.grad.numpy(), f"{what} grad of input", atol, rtol)
  kiln_state, torch_params = get_state_dict(layer), dict(torch_layer.named_parameters())
  for name in names:
    assert_close(kiln_state[name].grad.numpy(), torch_params[name].grad.numpy(), f"{what} grad of {name}", atol, rtol)

# ---------------- convolutions ----------------
CONV_CASES = [
  ("Conv2d 3x3", lambda: nn.Conv2d(3, 4, 3), lambda: torch.nn.Conv2d(3, 4, 3), (2, 3, 6, 5)),
  ("Conv2d stride 2 pad 1 no bias", lambda: nn.Conv2d(2, 4, 3, stride=2, padding=1, bias=False),
   lambda: torch.nn.Conv2d(2, 4, 3, stride=2, padding=1, bias=False), (1, 2, 7, 6)),
  ("Conv2d groups dilation", lambda: nn.Conv2d(4, 6, (3, 2), dilation=2, groups=2),
   lambda: torch.nn.Conv2d(4, 6, (3, 2), dilation=2, groups=2), (2, 4, 7, 6)),
  ("Conv2d same even kernel", lambda: nn.Conv2d(2, 3, 4, padding="same"),
   lambda: torch.nn.Conv2d(2, 3, 4, padding="same"), (1, 2, 5, 6)),
  ("Conv2d unbatched", lambda: nn.Conv2d(2, 3, 2), lambda: torch.nn.Conv2d(2, 3, 2), (2, 4, 4)),
  ("Conv2d 3-d kernel", lambda: nn.Conv2d(2, 2, (2, 2, 2)), lambda: torch.nn.Conv3d(2, 2, 2), (1, 2, 3, 4, 3)),
  ("Conv1d stride pad", lambda: nn.Conv1d(2, 4, 3, stride=2, padding=1),
   lambda: torch.nn.Conv1d(2, 4, 3, stride=2, padding=1), (2, 2, 9)),
  ("ConvTranspose2d stride pad output_padding", lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1,
   output_padding=1), lambda: torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 4, 3)),
  ("ConvTranspose2d groups dilation", lambda: nn.ConvTranspose2d(4, 6, 2, groups=2, dilation=2),
   lambda: torch.nn.ConvTranspose2d(4, 6, 2, groups=2, dilation=2), (1, 4, 3, 3)),
  ("ConvTranspose1d stride 3", lambda: nn.ConvTranspose1d(2, 3, 4, stride=3, bias=False),
   lambda: torch.nn.ConvTranspose1d(2, 3, 4, stride=3, bias=False), (2, 2, 5)),
]

@pytest.mark.parametrize("what, make, make_torch, shape", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_matches_torch(what, make, make_torch, shape):
  compare_with_torch(make(), make_torch(), shape, what, atol=1e-4)

# ---------------- normalization ----------------
NORM_CASES = [
  ("LayerNorm last axis", lambda: nn.LayerNorm(5), lambda: torch.nn.LayerNorm(5), (3, 5)),
  ("LayerNorm two axes", lambda: nn.LayerNorm((3, 4)), lambda: torch.nn.LayerNorm((3, 4)), (2, 3, 4)),
  ("LayerNorm no affine", lambda: nn.LayerNorm(4, elementwise_affine=False),
   lambda: torch.nn.LayerNorm(4, elementwise_affine=False), (2, 3, 4)),
  ("LayerNorm no bias", lambda: nn.LayerNorm(4, eps=1e-3, bias=False),
   lambda: torch.nn.LayerNorm(4, eps=1e-3, bias=False), (3, 4)),
  ("GroupNorm 4d", lambda: nn.GroupNorm(3, 6), lambda: torch.nn.GroupNorm(3, 6), (2, 6, 3, 2)),
  ("GroupNorm 3d one group no affine", lambda: nn.GroupNorm(1, 4, affine=False),
   lambda: torch.nn.GroupNorm(1, 4, affine=False), (3, 4, 5)),
  ("InstanceNorm 2d", lambda: nn.InstanceNorm(3), lambda: torch.nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 3)),
  ("InstanceNorm 1d no affine", lambda: nn.InstanceNorm(2, affine=False), lambda: torch.nn.InstanceNorm1d(2),
   (3, 2, 5)),
  ("RMSNorm", lambda: nn.RMSNorm(6), lambda: torch.nn.RMSNorm(6, eps=1e-6), (2, 3, 6)),
  ("RMSNorm no affine", lambda: nn.RMSNorm(4, eps=1e-3, elementwise_affine=False),
   lambda: torch.nn.RMSNorm(4, eps=1e-3, elementwise_affine=False), (5, 4)),
]

@pytest.mark.parametrize("what, make, make_torch, shape", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_norm_matches_torch(what, make, make_torch, shape):
  compare_with_torch(make(), make_torch(), shape, what, atol=1e-4)

class ChannelsLastLayerNorm(torch.nn.LayerNorm):
  """What kiln's LayerNorm2d computes, in torch: LayerNorm over the channel axis of (N, C, H, W)."""
  def forward(self, x): return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

def test_layernorm2d_matches_torch():
  compare_with_torch(nn.LayerNorm2d(3), ChannelsLastLayerNorm(3), (2, 3, 4, 2), "LayerNorm2d", atol=1e-4)

BATCHNORM_CASES = [
  ("2d input", lambda: nn.BatchNorm(4), lambda: torch.nn.BatchNorm1d(4), (6, 4)),
  ("3d input", lambda: nn.BatchNorm(3), lambda: torch.nn.BatchNorm1d(3), (2, 3, 5)),
  ("4d input", lambda: nn.BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3), (2, 3, 4, 3)),
  ("no affine", lambda: nn.BatchNorm(3, affine=False), lambda: torch.nn.BatchNorm2d(3, affine=False), (2, 3, 2, 2)),
  ("no running stats", lambda: nn.BatchNorm(3, track_running_stats=False),
   lambda: torch.nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 2, 2)),
]

@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("what, make, make_torch, shape", BATCHNORM_CASES, ids=[c[0] for c in BATCHNORM_CASES])
def test_batchnorm_matches_torch(what, make, make_torch, shape, train):
  compare_with_torch(make(), make_torch(), shape, f"BatchNorm {what} {'train' if train else 'eval'}", atol=1e-4,
                     train=train)

@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
def test_batchnorm_running_stats_follow_torch(momentum):
  rng = np.random.default_rng(1)
  layer, torch_layer = nn.BatchNorm2d(3, momentum=momentum), torch.nn.BatchNorm2d(3, momentum=momentum)
  for step in range(3):
    x_np = (rng.standard_normal((4, 3, 2, 2)) * (step + 1) + step).astype(np.float32)
    with Tensor.train(): out = layer(Tensor(x_np))
    out.realize()
    torch_layer.train()
    out_t = torch_layer(torch.from_numpy(x_np))
    assert_close(out.numpy(), out_t.detach().numpy(), f"BatchNorm training output at step {step}", atol=1e-4)
  for key in ("running_mean", "running_var", "num_batches_tracked"):
    assert_close(getattr(layer, key).numpy(), getattr(torch_layer, key).numpy(), f"BatchNorm {key} after 3 steps",
                 atol=1e-5)
  assert layer.num_batches_tracked.shape == () and layer.num_batches_tracked.dtype == dtypes.int64
  # evaluation (Tensor.training is False outside train()) normalizes with the running statistics
  x_np = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
  torch_layer.eval()
  assert_close(layer(Tensor(x_np)).numpy(), torch_layer(torch.from_numpy(x_np)).detach().numpy(),
               "BatchNorm eval output", atol=1e-4)

def test_batchnorm_stats_are_realized_by_the_optimizer_step():
  layer = nn.BatchNorm(2)
  params = nn.state.get_parameters(layer)
  opt = nn.optim.SGD(params, lr=0.1)
  assert layer.running_mean.requires_grad is False and layer.weight.requires_grad
  with Tensor.train():
    opt.zero_grad()
    layer(Tensor([[1.0, 2.0], [3.0, 6.0]])).sum().backward()
    opt.step()
  assert_close(layer.running_mean.numpy(), np.array([0.2, 0.4], np.float32), "running_mean after one step")
  assert layer.num_batches_tracked.item() == 1

# ---------------- embedding, LSTM ----------------
@pytest.mark.parametrize("index_shape", [(), (5,), (2, 3)])
def test_embedding_matches_torch(index_shape):
  rng = np.random.default_rng(2)
  layer, torch_layer = nn.Embedding(7, 3), torch.nn.Embedding(7, 3)
  share_weights(layer, torch_layer, rng)
  idx_np = rng.integers(-2, 7, index_shape) if index_shape else np.array(4)
  idx_np[idx_np < 0] = 1   # repeated indices: their gradients add up
  out = layer(Tensor(idx_np.astype(np.int32)))
  upstream = rng.standard_normal(out.shape).astype(np.float32)
  (out * Tensor(upstream)).sum().backward()
  out_t = torch_layer(torch.from_numpy(idx_np.astype(np.int64)))
  (out_t * torch.from_numpy(upstream)).sum().backward()
  assert_close(out.numpy(), out_t.detach().numpy(), f"Embedding output for indices {index_shape}")
  assert_close(layer.weight.grad.numpy(), torch_layer.weight.grad.numpy(), f"Embedding grad of weight {index_shape}")

def test_embedding_large_vocabulary_is_one_kernel_each_way():
  # a (tokens, vocab) one-hot is never stored: lookup and weight gradient are single fused kernels whose buffers are
  # the weight, the indices and the result
  from kiln.schedule.kernelize import create_schedule
  layer = nn.Embedding(5000, 8)
  layer.weight.requires_grad = True
  layer.weight.realize()
  idx, upstream = Tensor([[4999, 0, 17], [17, 3, 3]]).realize(), Tensor.randn(2, 3, 8).realize()
  out = layer(idx)
  (out * upstream).sum().backward()
  for what, result in [("lookup", out), ("weight gradient", layer.weight.grad)]:
    items = create_schedule([result.uop]).items
    assert len(items) == 1, f"the embedding {what} should run as one kernel, got {len(items)}"
    sizes = sorted(b.size for b in items[0].bufs)
    assert sizes[-1] == 5000 * 8 and sizes[-2] <= 2 * 3 * 8, f"embedding {what}: unexpected buffers {sizes}"
  assert_close(out.numpy(), layer.weight.numpy()[[[4999, 0, 17], [17, 3, 3]]], "Embedding rows")

LSTM_CASES = [("batched with state", (3, 4), True, True), ("batched zero state", (2, 4), False, True),
              ("unbatched", (4,), True, True), ("no bias", (2, 4), True, False)]

@pytest.mark.parametrize("what, input_shape, with_state, bias", LSTM_CASES, ids=[c[0] for c in LSTM_CASES])
def test_lstmcell_matches_torch(what, input_shape, with_state, bias):
  rng = np.random.default_rng(3)
  layer, torch_layer = nn.LSTMCell(4, 5, bias=bias), torch.nn.LSTMCell(4, 5, bias=bias)
  names = share_weights(layer, torch_layer, rng)
  x_np = rng.standard_normal(input_shape).astype(np.float32)
  state_np = [rng.standard_normal(input_shape[:-1] + (5,)).astype(np.float32) for _ in range(2)]
  x = Tensor(x_np, requires_grad=True)
  h, c = layer(x, tuple(Tensor(s) for s in state_np) if with_state else None)
  up_h, up_c = (rng.standard_normal(h.shape).astype(np.float32) for _ in range(2))
  ((h * Tensor(up_h)).sum() + (c * Tensor(up_c)).sum()).backward()
  x_t = torch.tensor(x_np, requires_grad=True)
  h_t, c_t = torch_layer(x_t, tuple(torch.from_numpy(s) for s in state_np) if with_state else None)
  ((h_t * torch.from_numpy(up_h)).sum() + (c_t * torch.from_numpy(up_c)).sum()).backward()
  assert_close(h.numpy(), h_t.detach().numpy(), f"LSTMCell {what} hidden")
  assert_close(c.numpy(), c_t.detach().numpy(), f"LSTMCell {what} cell")
  assert_close(x.grad.numpy(), x_t.grad.numpy(), f"LSTMCell {what} grad of input")
  torch_params = dict(torch_layer.named_parameters())
  for name in names:
    assert_close(getattr(layer, name).grad.numpy(), torch_params[name].grad.numpy(), f"LSTMCell {what} grad of {name}")

# ---------------- float16 ----------------
HALF_CASES = [
  ("Conv2d", lambda: nn.Conv2d(3, 4, 3, padding=1), lambda: torch.nn.Conv2d(3, 4, 3, padding=1), (1, 3, 4, 4)),
  ("LayerNorm", lambda: nn.LayerNorm(8), lambda: torch.nn.LayerNorm(8), (2, 8)),
  ("RMSNorm", lambda: nn.RMSNorm(8), lambda: torch.nn.RMSNorm(8, eps=1e-6), (2, 8)),
  ("BatchNorm eval", lambda: nn.BatchNorm(3), lambda: torch.nn.BatchNorm2d(3).eval(), (2, 3, 2, 2)),
]

@pytest.mark.parametrize("what, make, make_torch, shape", HALF_CASES, ids=[c[0] for c in HALF_CASES])
def test_float16_forward_close_to_torch_float32(what, make, make_torch, shape):
  rng = np.random.default_rng(4)
  layer, torch_layer = make(), make_torch()
  share_weights(layer, torch_layer, rng)
  for key, t in get_state_dict(layer).items():
    if dtypes.is_float(t.dtype) and "running" not in key: t.replace(t.half())
  x_np = rng.standard_normal(shape).astype(np.float16)
  out = layer(Tensor(x_np))
  assert out.dtype == dtypes.float16, f"{what}: float16 input gave {out.dtype}"
  torch_layer.float()
  want = torch_layer(torch.from_numpy(x_np.astype(np.float32))).detach().numpy()
  assert_close(out.numpy().astype(np.float32), want, f"{what} float16 output", atol=2e-2, rtol=1e-2)

FLOAT32_WEIGHT_CASES = [
  ("BatchNorm train", lambda: nn.BatchNorm(3), lambda: torch.nn.BatchNorm2d(3), (4, 3, 2, 2), True),
  ("BatchNorm eval", lambda: nn.BatchNorm(3), lambda: torch.nn.BatchNorm2d(3), (2, 3, 2, 2), False),
  ("BatchNorm untracked", lambda: nn.BatchNorm(3, track_running_stats=False),
   lambda: torch.nn.BatchNorm2d(3, track_running_stats=False), (4, 3, 2, 2), False),
  ("LayerNorm", lambda: nn.LayerNorm(8), lambda: torch.nn.LayerNorm(8), (2, 8), False),
  ("LayerNorm2d", lambda: nn.LayerNorm2d(3), None, (2, 3, 2, 2), False),
  ("GroupNorm", lambda: nn.GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4), (2, 4, 3), False),
  ("InstanceNorm", lambda: nn.InstanceNorm(3), lambda: torch.nn.InstanceNorm2d(3, affine=True), (2, 3, 2, 2), False),
  ("RMSNorm", lambda: nn.RMSNorm(8), lambda: torch.nn.RMSNorm(8, eps=1e-6), (2, 8), False),
]

@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
@pytest.mark.parametrize("what, make, make_torch, shape, training", FLOAT32_WEIGHT_CASES,
                         ids=[c[0] for c in FLOAT32_WEIGHT_CASES])
def test_norm_of_half_input_with_float32_weights_keeps_half(what, make, make_torch, shape, training):
  """BatchNorm of a half input with float32 weights returned float32; PyTorch's norms return the input's dtype."""
  rng = np.random.default_rng(5)
  layer = make()
  x_np = (rng.standard_normal(shape) * 3 + 1).astype(np.float16)
  if make_torch is not None:
    torch_layer = make_torch().train(training)
    share_weights(layer, torch_layer, rng)
  with Tensor.train(training): out = layer(Tensor(x_np))
  assert out.dtype == dtypes.float16, f"{what}: float16 input with float32 weights gave {out.dtype}"
  if make_torch is None: return
  want = torch_layer(torch.from_numpy(x_np))
  assert want.dtype == torch.float16, f"torch {what} gave {want.dtype}"
  assert_close(out.numpy().astype(np.float32), want.detach().float().numpy(), f"{what} half output", atol=1e-2,
               rtol=1e-2)
  if training and layer.running_mean is not None:
    assert layer.running_mean.dtype == dtypes.float32, f"{what}: running_mean became {layer.running_mean.dtype}"
    assert_close(layer.running_var.numpy(), torch_layer.running_var.numpy(), f"{what} running_var", atol=1e-3,
                 rtol=1e-3)

# ---------------- initialization ----------------
def check_uniform(t: Tensor, bound: float, what: str) -> None:
  """All values in [-bound, bound], spread over the range like a uniform distribution."""
  values = t.numpy().ravel()
  assert np.all(np.abs(values) <= bound * (1 + 1e-6)), f"{what}: |value| {np.abs(values).max()} > bound {bound}"
  if values.size < 50: return   # too few draws to say more
  assert np.abs(values).max() > 0.8 * bound, f"{what}: max |value| {np.abs(values).max()} far below bound {bound}"
  assert abs(values.std() - bound / math.sqrt(3)) < 0.15 * bound, f"{what}: std {values.std()} for bound {bound}"

INIT_CASES = [
  ("Conv2d", lambda: nn.Conv2d(6, 8, 3, groups=2), lambda: torch.nn.Conv2d(6, 8, 3, groups=2)),
  ("Conv1d", lambda: nn.Conv1d(4, 16, 5), lambda: torch.nn.Conv1d(4, 16, 5)),
  ("ConvTranspose2d", lambda: nn.ConvTranspose2d(16, 4, 3, groups=2),
   lambda: torch.nn.ConvTranspose2d(16, 4, 3, groups=2)),
  ("ConvTranspose1d", lambda: nn.ConvTranspose1d(16, 4, 5), lambda: torch.nn.ConvTranspose1d(16, 4, 5)),
  ("LSTMCell", lambda: nn.LSTMCell(6, 10), lambda: torch.nn.LSTMCell(6, 10)),
]

@pytest.mark.parametrize("what, make, make_torch", INIT_CASES, ids=[c[0] for c in INIT_CASES])
def test_uniform_init_bounds_match_torch(what, make, make_torch):
  layer, torch_layer = make(), make_torch()
  state = get_state_dict(layer)
  for key, torch_value in torch_layer.state_dict().items():
    # torch's own draw is uniform on its bound: its largest |value| estimates the bound kiln must use
    bound = {"Conv2d": 1 / math.sqrt(3 * 9), "Conv1d": 1 / math.sqrt(4 * 5), "ConvTranspose2d": 1 / math.sqrt(2 * 9),
             "ConvTranspose1d": 1 / math.sqrt(4 * 5), "LSTMCell": 1 / math.sqrt(10)}[what]
    torch_max = torch_value.abs().max().item()
    assert torch_max <= bound * (1 + 1e-6) and (torch_value.numel() < 50 or torch_max > 0.8 * bound), (what, key)
    assert state[key].shape == tuple(torch_value.shape), f"{what} {key}: {state[key].shape} != {torch_value.shape}"
    check_uniform(state[key], bound, f"{what} {key}")

def test_norm_and_embedding_init_match_torch():
  for layer, torch_layer in [(nn.BatchNorm(3), torch.nn.BatchNorm2d(3)),
                             (nn.LayerNorm((2, 3)), torch.nn.LayerNorm((2, 3))),
                             (nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)), (nn.RMSNorm(5), torch.nn.RMSNorm(5)),
                             (nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True))]:
    state = get_state_dict(layer)
    for key, value in torch_layer.state_dict().items():
      assert_close(state[key].numpy(), value.numpy(), f"{type(layer).__name__} initial {key}")
  weight = nn.Embedding(1000, 16).weight.numpy()
  assert weight.shape == (1000, 16)
  assert abs(weight.mean()) < 0.05 and abs(weight.std() - 1) < 0.05, \
    f"Embedding init: mean {weight.mean()} std {weight.std()}, expected standard normal"

# ---------------- state-dict keys ----------------
KEY_CASES = [
  (lambda: nn.Linear(3, 2), lambda: torch.nn.Linear(3, 2)),
  (lambda: nn.Linear(3, 2, bias=False), lambda: torch.nn.Linear(3, 2, bias=False)),
  (lambda: nn.Conv2d(3, 2, 3, bias=False), lambda: torch.nn.Conv2d(3, 2, 3, bias=False)),
  (lambda: nn.Conv1d(3, 2, 3), lambda: torch.nn.Conv1d(3, 2, 3)),
  (lambda: nn.ConvTranspose2d(3, 2, 3), lambda: torch.nn.ConvTranspose2d(3, 2, 3)),
  (lambda: nn.ConvTranspose1d(3, 2, 3, bias=False), lambda: torch.nn.ConvTranspose1d(3, 2, 3, bias=False)),
  (lambda: nn.BatchNorm(3), lambda: torch.nn.BatchNorm2d(3)),
  (lambda: nn.BatchNorm(3, affine=False), lambda: torch.nn.BatchNorm2d(3, affine=False)),
  (lambda: nn.BatchNorm(3, track_running_stats=False), lambda: torch.nn.BatchNorm2d(3, track_running_stats=False)),
  (lambda: nn.LayerNorm(3), lambda: torch.nn.LayerNorm(3)),
  (lambda: nn.LayerNorm(3, bias=False), lambda: torch.nn.LayerNorm(3, bias=False)),
  (lambda: nn.LayerNorm2d(3, elementwise_affine=False), lambda: torch.nn.LayerNorm(3, elementwise_affine=False)),
  (lambda: nn.GroupNorm(1, 3), lambda: torch.nn.GroupNorm(1, 3)),
  (lambda: nn.InstanceNorm(3), lambda: torch.nn.InstanceNorm2d(3, affine=True)),
  (lambda: nn.InstanceNorm(3, affine=False), lambda: torch.nn.InstanceNorm2d(3)),
  (lambda: nn.RMSNorm(3), lambda: torch.nn.RMSNorm(3)),
  (lambda: nn.Embedding(5, 3), lambda: torch.nn.Embedding(5, 3)),
  (lambda: nn.LSTMCell(3, 4), lambda: torch.nn.LSTMCell(3, 4)),
  (lambda: nn.LSTMCell(3, 4, bias=False), lambda: torch.nn.LSTMCell(3, 4, bias=False)),
]

@pytest.mark.parametrize("make, make_torch", KEY_CASES)
def test_state_dict_keys_and_shapes_match_torch(make, make_torch):
  state, torch_state = get_state_dict(make()), make_torch().state_dict()
  assert list(state) == list(torch_state), f"keys {list(state)} != torch's {list(torch_state)}"
  for key, value in torch_state.items():
    assert state[key].shape == tuple(value.shape), f"{key}: shape {state[key].shape} != torch's {tuple(value.shape)}"

def test_torch_state_dict_loads_into_a_model():
  class Model:
    def __init__(self):
      self.conv, self.norm, self.head = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Linear(2, 3)
  torch_model = torch.nn.Module()
  torch_model.conv, torch_model.norm = torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)
  torch_model.head = torch.nn.Linear(2, 3)
  model = Model()
  load_state_dict(model, {k: Tensor(v.numpy()) for k, v in torch_model.state_dict().items()})
  assert_close(model.conv.weight.numpy(), torch_model.conv.weight.detach().numpy(), "loaded conv.weight")

# ---------------- errors ----------------
ERROR_CASES = [
  ("Conv2d wrong channels", lambda: nn.Conv2d(3, 4, 3)(Tensor.ones(1, 2, 5, 5)), ValueError,
   r"Conv2d: input of shape \(1, 2, 5, 5\) has 2 channels .* in_channels=3"),
  ("Conv2d wrong rank", lambda: nn.Conv2d(3, 4, 3)(Tensor.ones(3, 5)), ValueError, r"Conv2d: input of shape \(3, 5\)"),
  ("Conv1d 2-d kernel", lambda: nn.Conv1d(3, 4, (3, 3)), ValueError, "Conv1d: kernel_size"),
  ("Conv2d groups", lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError, "Conv2d: .*divisible by groups=2"),
  ("Conv2d same with stride", lambda: nn.Conv2d(3, 4, 3, stride=2, padding="same"), ValueError,
   "Conv2d: padding='same'"),
  ("Conv2d bad padding", lambda: nn.Conv2d(3, 4, 3, padding="full"), ValueError, "Conv2d: padding 'full'"),
  ("Conv2d negative padding", lambda: nn.Conv2d(3, 4, 3, padding=-1), ValueError, "Conv2d: padding"),
  ("ConvTranspose2d wrong channels", lambda: nn.ConvTranspose2d(3, 4, 3)(Tensor.ones(1, 4, 5, 5)), ValueError,
   "ConvTranspose2d: .* has 4 channels"),
  ("ConvTranspose1d output_padding", lambda: nn.ConvTranspose1d(3, 4, 3, output_padding=1), ValueError,
   "ConvTranspose1d: output_padding"),
  ("BatchNorm wrong channels", lambda: nn.BatchNorm(3)(Tensor.ones(2, 4)), ValueError,
   r"BatchNorm: input of shape \(2, 4\) has 4 channels .* expects 3"),
  ("BatchNorm 1-d input", lambda: nn.BatchNorm(3)(Tensor.ones(3)), ValueError, "BatchNorm: .* at least 2"),
  ("LayerNorm wrong shape", lambda: nn.LayerNorm((2, 3))(Tensor.ones(3, 2)), ValueError,
   r"LayerNorm: input of shape \(3, 2\) must end with normalized_shape \(2, 3\)"),
  ("LayerNorm2d wrong channels", lambda: nn.LayerNorm2d(3)(Tensor.ones(1, 4, 2, 2)), ValueError, "LayerNorm2d: .*4 ch"),
  ("GroupNorm indivisible", lambda: nn.GroupNorm(3, 4), ValueError, "GroupNorm: num_channels=4 .* num_groups=3"),
  ("GroupNorm wrong channels", lambda: nn.GroupNorm(2, 4)(Tensor.ones(2, 6, 3)), ValueError, "GroupNorm: .*6 ch"),
  ("InstanceNorm no spatial", lambda: nn.InstanceNorm(3)(Tensor.ones(2, 3)), ValueError, "InstanceNorm: .* at least 3"),
  ("RMSNorm wrong dim", lambda: nn.RMSNorm(4)(Tensor.ones(2, 3)), ValueError, r"RMSNorm: input of shape \(2, 3\)"),
  ("Embedding float indices", lambda: nn.Embedding(5, 2)(Tensor([1.0])), TypeError, "Embedding: indices .* int"),
  ("Embedding bad size", lambda: nn.Embedding(0, 2), ValueError, "Embedding: vocab_size"),
  ("LSTMCell wrong input", lambda: nn.LSTMCell(3, 4)(Tensor.ones(2, 5)), ValueError,
   r"LSTMCell: input of shape \(2, 5\)"),
  ("LSTMCell wrong state", lambda: nn.LSTMCell(3, 4)(Tensor.ones(2, 3), (Tensor.ones(2, 4), Tensor.ones(1, 4))),
   ValueError, r"LSTMCell: hidden \(2, 4\) and cell \(1, 4\)"),
]

@pytest.mark.parametrize("what, build, error, message", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_layer_errors(what, build, error, message):
  with pytest.raises(error, match=message):
    build()

def test_batchnorm_training_needs_more_than_one_value_per_channel():
  with Tensor.train(), pytest.raises(ValueError, match=r"BatchNorm: training needs more than 1 value .*\(1, 3\)"):
    nn.BatchNorm(3)(Tensor.ones(1, 3))
