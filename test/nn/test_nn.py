"""nn.Linear and nn.state against PyTorch (same weights, same inputs)."""
import numpy as np
import pytest
import torch
from kiln import Tensor
from kiln.nn import Linear
from kiln.nn.state import get_state_dict, get_parameters, load_state_dict

def assert_close(actual: np.ndarray, expected: np.ndarray, what: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
  """np.testing-style check whose message names the tensor, the shapes and the worst element difference."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
  diff = np.abs(actual - expected)
  worst = np.unravel_index(np.argmax(diff), diff.shape) if diff.size else ()
  ok = np.all(diff <= atol + rtol * np.abs(expected))
  assert ok, (f"{what} (shape {actual.shape}): worst difference {diff[worst] if diff.size else 0:.3g} at {worst}, "
              f"got {actual[worst] if diff.size else None}, expected {expected[worst] if diff.size else None}")

# ---- Linear ----

@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_backward_matches_torch(bias: bool):
  rng = np.random.default_rng(0)
  layer = Linear(5, 3, bias=bias)
  assert layer.weight.shape == (3, 5)
  # like tinygrad, layers leave requires_grad unset (None) and backward() only fills .grad of tensors that set it
  for t in (layer.weight, layer.bias):
    if t is not None: t.requires_grad = True
  x_np = rng.standard_normal((4, 5)).astype(np.float32)
  upstream_np = rng.standard_normal((4, 3)).astype(np.float32)

  x = Tensor(x_np, requires_grad=True)
  out = layer(x)
  (out * Tensor(upstream_np)).sum().backward()

  weight_t = torch.tensor(layer.weight.numpy(), requires_grad=True)
  bias_t = torch.tensor(layer.bias.numpy(), requires_grad=True) if bias else None
  x_t = torch.tensor(x_np, requires_grad=True)
  out_t = torch.nn.functional.linear(x_t, weight_t, bias_t)
  (out_t * torch.tensor(upstream_np)).sum().backward()

  assert_close(out.numpy(), out_t.detach().numpy(), "Linear output")
  assert_close(x.grad.numpy(), x_t.grad.numpy(), "grad of input")
  assert_close(layer.weight.grad.numpy(), weight_t.grad.numpy(), "grad of weight")
  if bias: assert_close(layer.bias.grad.numpy(), bias_t.grad.numpy(), "grad of bias")

def test_linear_init_bounds():
  layer = Linear(16, 8)
  bound = 1 / np.sqrt(16)
  for name, t, shape in [("weight", layer.weight, (8, 16)), ("bias", layer.bias, (8,))]:
    values = t.numpy()
    assert values.shape == shape, f"{name}: shape {values.shape} != {shape}"
    assert np.all(np.abs(values) <= bound), f"{name}: values outside ±{bound}: max |v| {np.abs(values).max()}"
    assert np.std(values) > 0, f"{name}: all values equal"

def test_linear_rejects_wrong_input_size():
  with pytest.raises(ValueError, match="expects 4"):
    Linear(4, 2)(Tensor.ones(3, 5))

# ---- state dicts ----

class Block:
  def __init__(self):
    self.proj = Linear(3, 4)
    self.norm_scale = Tensor.ones(4)

class Model:
  def __init__(self):
    self.embed = Linear(2, 3, bias=False)
    self.blocks = [Block(), Block()]
    self.heads = {"out": Linear(4, 2)}
    self.name, self.depth = "model", 2  # non-tensor attributes are ignored
    self.parent = self  # cycles must not hang

def test_get_state_dict_keys():
  keys = sorted(get_state_dict(Model()))
  expected = sorted(["embed.weight", "blocks.0.proj.weight", "blocks.0.proj.bias", "blocks.0.norm_scale",
                     "blocks.1.proj.weight", "blocks.1.proj.bias", "blocks.1.norm_scale", "heads.out.weight",
                     "heads.out.bias"])
  assert keys == expected

def test_get_parameters_order_and_dedup():
  model = Model()
  model.tied = model.embed.weight
  params = get_parameters(model)
  assert len(params) == 9, f"expected 9 distinct tensors, got {len(params)}"
  assert params[0] is model.embed.weight

def test_state_dict_round_trip():
  source, target = Model(), Model()
  load_state_dict(target, get_state_dict(source))
  source_state, target_state = get_state_dict(source), get_state_dict(target)
  for key, value in source_state.items():
    assert_close(target_state[key].numpy(), value.numpy(), f"loaded {key}", atol=0, rtol=0)
  # the model's own Tensor objects were updated in place, so existing references see the loaded values
  assert target_state["embed.weight"] is target.embed.weight

def test_load_state_dict_missing_key_names_it():
  model = Model()
  state = get_state_dict(Model())
  del state["blocks.1.proj.bias"]
  with pytest.raises(KeyError, match="blocks.1.proj.bias"):
    load_state_dict(model, state)
  before = model.blocks[1].proj.bias.numpy()
  load_state_dict(model, state, strict=False)
  assert_close(model.blocks[1].proj.bias.numpy(), before, "bias skipped under strict=False", atol=0, rtol=0)

def test_load_state_dict_shape_mismatch_names_key_and_shapes():
  model = Model()
  state = get_state_dict(Model())
  state["heads.out.weight"] = Tensor.zeros(3, 3)
  with pytest.raises(ValueError, match=r"heads\.out\.weight.*\(2, 4\).*\(3, 3\)"):
    load_state_dict(model, state)
