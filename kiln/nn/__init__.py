"""Neural-network layers. Optimizers live in `kiln.nn.optim`, state-dict helpers in `kiln.nn.state`."""
from __future__ import annotations
import math
from kiln.tensor import Tensor
from kiln.nn import optim, state  # noqa: F401  (re-exported as nn.optim, nn.state)

class Linear:
  """y = x @ weight.T + bias, with weight of shape (out_features, in_features).

  Initialized like PyTorch: weight and bias uniform in [-1/sqrt(in_features), 1/sqrt(in_features)].
  """
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    if in_features <= 0 or out_features <= 0:
      raise ValueError(f"Linear: in_features and out_features must be positive, got ({in_features}, {out_features})")
    bound = 1 / math.sqrt(in_features)
    self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
    self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    """Apply the layer to `x` of shape (..., in_features)."""
    in_features = self.weight.shape[1]
    if x.shape[-1] != in_features:
      raise ValueError(f"Linear: input's last dimension is {x.shape[-1]} but the layer expects {in_features} "
                       f"(input shape {x.shape}, weight shape {self.weight.shape})")
    out = x @ self.weight.T
    return out + self.bias if self.bias is not None else out

  def __repr__(self) -> str:
    out_features, in_features = self.weight.shape
    return f"Linear(in_features={in_features}, out_features={out_features}, bias={self.bias is not None})"
