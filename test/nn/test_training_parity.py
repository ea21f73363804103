"""Training parity: small models built by kiln's own `nn`, copied into identical torch.nn modules, trained side by side.

Each model is created fresh by kiln (its own initialization), its weights are copied into a torch module of the same
structure (the state-dict keys match: kiln's layers carry PyTorch's names), and both are trained STEPS steps with the
same optimizer and hyperparameters. After every backward each gradient is compared, after every step each parameter
and each buffer (BatchNorm's running statistics). Conventions kiln shares with tinygrad and PyTorch: Linear's weight is
(out_features, in_features); BatchNorm's momentum is 0.1 on the new batch's statistics; `Tensor.gelu` is the tanh
approximation (torch's approximate="tanh"); an optimizer only steps inside `with Tensor.train():`.

The models exercise parameters that must stay distinct although created by the same call (several same-shaped
BatchNorm2d and LayerNorm layers, whose ones/zeros weights are identical values) and parameters that are used twice
(a tied embedding/output head, one layer applied twice), whose gradients must add.
"""
from __future__ import annotations
import inspect
import math
from typing import Callable
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, nn
from kiln.nn.state import get_state_dict, get_parameters
from kiln.nn.optim import SGD, Adam, AdamW
from helpers import assert_close

STEPS = 3
RTOL, ATOL = 1e-4, 1e-5

# ---------------- the models: a kiln one and a torch one with the same state-dict keys ----------------
class KilnResidualCNN:
  """conv-bn-relu, two residual conv-bn blocks (four same-shaped BatchNorm2d in all), mean pool, linear head."""
  def __init__(self):
    self.stem, self.stem_bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
    self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
    self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
    self.conv3, self.bn3 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
    self.head = nn.Linear(8, 5)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.stem_bn(self.stem(x)).relu()
    x = (x + self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))).relu()
    x = self.bn3(self.conv3(x)).relu()
    return self.head(x.mean((2, 3)))

class TorchResidualCNN(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.stem, self.stem_bn = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
    self.conv1, self.bn1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
    self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
    self.conv3, self.bn3 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8)
    self.head = torch.nn.Linear(8, 5)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.stem_bn(self.stem(x)).relu()
    x = (x + self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))).relu()
    x = self.bn3(self.conv3(x)).relu()
    return self.head(x.mean((2, 3)))

WIDTH, HEADS = 16, 2

class KilnTransformerBlock:
  """Pre-LayerNorm block: x + attn(ln1(x)) with causal attention, then x + mlp(ln2(x)) with a GELU MLP."""
  def __init__(self):
    self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
    # the key has no bias: softmax ignores a shift shared by all keys, so its exact gradient is 0 and Adam would turn
    # the rounding noise left in it into full-size steps that differ between frameworks
    self.query, self.key, self.value = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH, bias=False), \
      nn.Linear(WIDTH, WIDTH)
    self.proj = nn.Linear(WIDTH, WIDTH)
    self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

  def __call__(self, x: Tensor) -> Tensor:
    batch, length, _ = x.shape
    normed = self.ln1(x)
    q, k, v = [layer(normed).reshape(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2)
               for layer in (self.query, self.key, self.value)]
    attn = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(batch, length, WIDTH)
    x = x + self.proj(attn)
    return x + self.fc2(self.fc1(self.ln2(x)).gelu())

class TorchTransformerBlock(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.ln1, self.ln2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
    # the key has no bias: softmax ignores a shift shared by all keys, so its exact gradient is 0 and Adam would turn
    # the rounding noise left in it into full-size steps that differ between frameworks
    self.query, self.key, self.value = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH, bias=False), \
      torch.nn.Linear(WIDTH, WIDTH)
    self.proj = torch.nn.Linear(WIDTH, WIDTH)
    self.fc1, self.fc2 = torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.Linear(2 * WIDTH, WIDTH)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    batch, length, _ = x.shape
    normed = self.ln1(x)
    q, k, v = [layer(normed).reshape(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2)
               for layer in (self.query, self.key, self.value)]
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, length, WIDTH)
    x = x + self.proj(attn)
    return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

class KilnLSTMRegressor:
  """An LSTMCell unrolled over the time axis of (time, batch, input); a linear head on the last hidden state."""
  def __init__(self):
    self.cell, self.head = nn.LSTMCell(4, 8), nn.Linear(8, 3)

  def __call__(self, x: Tensor) -> Tensor:
    state = None
    for step in range(x.shape[0]): state = self.cell(x[step], state)
    return self.head(state[0])

class TorchLSTMRegressor(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.cell, self.head = torch.nn.LSTMCell(4, 8), torch.nn.Linear(8, 3)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    state = None
    for step in range(x.shape[0]): state = self.cell(x[step], state)
    return self.head(state[0])

VOCAB = 11

class KilnTiedLanguageModel:
  """Embedding -> LayerNorm -> logits through the embedding's own weight (a tied head: one weight used twice)."""
  def __init__(self):
    self.embed, self.norm = nn.Embedding(VOCAB, 8), nn.LayerNorm(8)

  def __call__(self, tokens: Tensor) -> Tensor:
    return self.norm(self.embed(tokens)) @ self.embed.weight.T

class TorchTiedLanguageModel(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.embed, self.norm = torch.nn.Embedding(VOCAB, 8), torch.nn.LayerNorm(8)

  def forward(self, tokens: torch.Tensor) -> torch.Tensor:
    return self.norm(self.embed(tokens)) @ self.embed.weight.T

class KilnSharedLayerNet:
  """One Linear applied twice (its gradients add) between two LayerNorms created by the same call."""
  def __init__(self):
    self.inp, self.shared, self.out = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 2)
    self.norm_a, self.norm_b = nn.LayerNorm(8), nn.LayerNorm(8)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.norm_a(self.shared(self.inp(x).tanh())).tanh()
    return self.out(self.norm_b(self.shared(x)).tanh())

class TorchSharedLayerNet(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.inp, self.shared, self.out = torch.nn.Linear(6, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
    self.norm_a, self.norm_b = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.norm_a(self.shared(self.inp(x).tanh())).tanh()
    return self.out(self.norm_b(self.shared(x)).tanh())

# ---------------- batches and losses ----------------
def cnn_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  return rng.standard_normal((4, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, (4,))

def transformer_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  return rng.standard_normal((2, 5, WIDTH)).astype(np.float32), rng.standard_normal((2, 5, WIDTH)).astype(np.float32)

def lstm_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  return rng.standard_normal((3, 2, 4)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)

def language_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  tokens = rng.integers(0, VOCAB, (3, 6))
  return tokens[:, :-1].copy(), tokens[:, 1:].copy()

def shared_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  return rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)

def kiln_mse(out: Tensor, target: Tensor) -> Tensor: return (out - target).square().mean()
def torch_mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor: return (out - target).square().mean()
def kiln_xent(out: Tensor, target: Tensor) -> Tensor:
  return out.reshape(-1, out.shape[-1]).sparse_categorical_crossentropy(target.flatten())
def torch_xent(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
  return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.flatten())

# name -> (kiln model, torch model, batch maker, kiln loss, torch loss)
MODELS: dict[str, tuple[Callable, Callable, Callable, Callable, Callable]] = {
  "residual_cnn": (KilnResidualCNN, TorchResidualCNN, cnn_batch, kiln_xent, torch_xent),
  "transformer_block": (KilnTransformerBlock, TorchTransformerBlock, transformer_batch, kiln_mse, torch_mse),
  "lstm_cell": (KilnLSTMRegressor, TorchLSTMRegressor, lstm_batch, kiln_mse, torch_mse),
  "tied_embedding": (KilnTiedLanguageModel, TorchTiedLanguageModel, language_batch, kiln_xent, torch_xent),
  "shared_layer": (KilnSharedLayerNet, TorchSharedLayerNet, shared_batch, kiln_mse, torch_mse),
}

# ---------------- optimizers: every hyperparameter given, the same for both sides ----------------
# name -> (kiln optimizer, torch optimizer)
OPTIMIZERS: dict[str, tuple[Callable, Callable]] = {
  "sgd": (lambda ps, fused: SGD(ps, lr=0.1, momentum=0.0, weight_decay=0.0, nesterov=False, fused=fused),
          lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)),
  "sgd_momentum": (lambda ps, fused: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=False,
                                       fused=fused),
                   lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01,
                                              nesterov=False)),
  "sgd_nesterov": (lambda ps, fused: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.0, nesterov=True,
                                       fused=fused),
                   lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.0,
                                              nesterov=True)),
  "adam": (lambda ps, fused: Adam(ps, lr=0.01, b1=0.9, b2=0.99, eps=1e-8, fused=fused),
           lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)),
  "adamw": (lambda ps, fused: AdamW(ps, lr=0.01, b1=0.8, b2=0.999, eps=1e-7, weight_decay=0.1, fused=fused),
            lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.999), eps=1e-7, weight_decay=0.1)),
}

def copy_weights(kiln_model, torch_model: torch.nn.Module) -> dict[str, Tensor]:
  """Copy every kiln tensor into the torch tensor of the same state-dict key; returns kiln's state dict."""
  kiln_state, torch_state = get_state_dict(kiln_model), torch_model.state_dict()
  # realized together, as a first training step does: tensors made by one creation call must still get two buffers
  # (realizing them one by one would hide the sharing)
  Tensor.realize_all(list(kiln_state.values()))
  assert sorted(kiln_state) == sorted(torch_state), f"keys differ: {sorted(kiln_state)} != {sorted(torch_state)}"
  with torch.no_grad():
    for key, value in kiln_state.items():
      want_shape = tuple(torch_state[key].shape)
      assert tuple(value.shape) == want_shape, f"{key}: kiln shape {value.shape} != torch {want_shape}"
      torch_state[key].copy_(torch.from_numpy(value.numpy().copy()))
  return kiln_state

def train_and_compare(model_name: str, optimizer_name: str, fused: bool = False) -> None:
  """Build, copy, and train both models STEPS steps, asserting gradients, parameters and buffers agree each step.
  `fused` steps kiln's optimizer over all parameters as one flat vector (the result must not change)."""
  make_kiln, make_torch, make_batch, kiln_loss_fn, torch_loss_fn = MODELS[model_name]
  make_kiln_opt, make_torch_opt = OPTIMIZERS[optimizer_name]
  Tensor.manual_seed(0)
  torch.manual_seed(0)
  kiln_model, torch_model = make_kiln(), make_torch()
  kiln_state = copy_weights(kiln_model, torch_model)
  torch_state = torch_model.state_dict(keep_vars=True)
  kiln_opt = make_kiln_opt(get_parameters(kiln_model), fused=fused)
  torch_opt = make_torch_opt(list(torch_model.parameters()))
  torch_model.train()
  rng = np.random.default_rng(1)
  with Tensor.train():
    for step in range(STEPS):
      inputs, target = make_batch(rng)
      where = f"{model_name}/{optimizer_name} step {step}"
      kiln_opt.zero_grad()
      torch_opt.zero_grad()
      kiln_loss = kiln_loss_fn(kiln_model(Tensor(inputs)), Tensor(target))
      torch_loss = torch_loss_fn(torch_model(torch.from_numpy(inputs)), torch.from_numpy(target))
      kiln_loss.backward()
      torch_loss.backward()
      assert_close(kiln_loss.numpy(), torch_loss.detach().numpy(), f"{where}: loss", ATOL, RTOL)
      for key, value in kiln_state.items():
        if not value.requires_grad: continue
        want = torch_state[key].grad
        assert value.grad is not None and want is not None, f"{where}: {key} has no gradient"
        assert_close(value.grad.numpy(), want.numpy(), f"{where}: grad of {key}", ATOL, RTOL)
      kiln_opt.step()
      torch_opt.step()
      for key, value in kiln_state.items():
        assert_close(value.numpy(), torch_state[key].detach().numpy(), f"{where}: {key} after the step", ATOL, RTOL)

@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_training_parity(model_name: str, optimizer_name: str):
  train_and_compare(model_name, optimizer_name)

@pytest.mark.parametrize("optimizer_name", ["sgd_nesterov", "adamw"])
@pytest.mark.parametrize("model_name", ["residual_cnn", "tied_embedding"])
def test_training_parity_fused(model_name: str, optimizer_name: str):
  """fused=True (one flat vector for all parameters) trains exactly as torch too."""
  train_and_compare(model_name, optimizer_name, fused=True)

@pytest.mark.parametrize("model_name, first, second", [("shared_layer", "norm_a.weight", "norm_b.weight"),
                                                        ("residual_cnn", "bn1.weight", "bn2.weight"),
                                                        ("residual_cnn", "bn2.bias", "bn3.bias")])
def test_same_call_parameters_stay_distinct(model_name: str, first: str, second: str):
  """Two layers built by identical calls (LayerNorm(8), BatchNorm2d(8)) start equal; one step must move them apart."""
  make_kiln, _, make_batch, kiln_loss_fn, _ = MODELS[model_name]
  Tensor.manual_seed(0)
  model = make_kiln()
  state = get_state_dict(model)
  Tensor.realize_all(list(state.values()))   # together: one by one would give separate buffers anyway
  np.testing.assert_array_equal(state[first].numpy(), state[second].numpy())
  opt = SGD(get_parameters(model), lr=0.5)
  inputs, target = make_batch(np.random.default_rng(2))
  with Tensor.train():
    kiln_loss_fn(model(Tensor(inputs)), Tensor(target)).backward()
    opt.step()
  assert not np.allclose(state[first].numpy(), state[second].numpy()), \
    f"{model_name}: {first} and {second} got the same update: they are one tensor"

@pytest.mark.parametrize("kiln_cls, torch_cls", [(SGD, torch.optim.SGD), (Adam, torch.optim.Adam),
                                                 (AdamW, torch.optim.AdamW)])
def test_optimizer_defaults_match_torch(kiln_cls, torch_cls):
  """Defaults with a counterpart in torch (lr, momentum, betas, eps, weight_decay, nesterov) are torch's."""
  kiln_defaults = {name: p.default for name, p in inspect.signature(kiln_cls.__init__).parameters.items()
                   if p.default is not inspect.Parameter.empty}
  torch_defaults = {name: p.default for name, p in inspect.signature(torch_cls.__init__).parameters.items()
                    if p.default is not inspect.Parameter.empty}
  if "b1" in kiln_defaults:
    kiln_defaults["betas"] = (kiln_defaults.pop("b1"), kiln_defaults.pop("b2"))
  for name in ("lr", "momentum", "betas", "eps", "weight_decay", "nesterov"):
    if name not in torch_defaults: continue
    kiln_value = kiln_defaults.get(name, 0.0)   # Adam has no weight_decay argument: it is 0, as torch's default
    torch_value = torch_defaults[name]
    if isinstance(torch_value, tuple):
      assert all(math.isclose(a, b) for a, b in zip(kiln_value, torch_value)), f"{kiln_cls.__name__}.{name}"
    else:
      assert kiln_value == torch_value, f"{kiln_cls.__name__}.{name}: kiln {kiln_value!r}, torch {torch_value!r}"
