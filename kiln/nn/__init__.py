"""Neural-network layers. Optimizers live in `kiln.nn.optim`, state-dict helpers in `kiln.nn.state`.

Each layer is a plain object whose Tensor attributes carry PyTorch's names (`weight`, `bias`, `running_mean`, ...), so
`nn.state.get_state_dict(model)` gives the same keys as `torch.nn.Module.state_dict()` and checkpoints load by name.
Parameters start as PyTorch initializes them. Layers leave `requires_grad` unset (None), as tinygrad does: an optimizer
marks the tensors it is given as trainable. Layer-specific errors name the layer and the offending shapes.
"""
from __future__ import annotations
import math
from kiln.tensor import Tensor
from kiln.dtype import dtypes
from kiln.helpers import prod
from kiln.mixin.common import TensorValueError, UnsupportedError, where, fmt
from kiln.nn import optim, state  # noqa: F401  (re-exported as nn.optim, nn.state)

# ---------------- argument checks shared by the layers ----------------
def _positive_int(value, name: str, layer: str, minimum: int = 1) -> int:
  """`value` as an int of at least `minimum`, or a ValueError naming the layer and the argument."""
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise TensorValueError(f"{layer}: {name} must be an int >= {minimum}, got {value!r}{where()}")
  return value

def _int_tuple(value, n: int, name: str, layer: str, minimum: int = 1) -> tuple[int, ...]:
  """An int (repeated n times) or a sequence of n ints, each at least `minimum`."""
  values = (value,) * n if isinstance(value, int) and not isinstance(value, bool) else value
  if not isinstance(values, (tuple, list)) or len(values) != n:
    raise TensorValueError(f"{layer}: {name} must be an int or a sequence of {n} ints, got {value!r}{where()}")
  return tuple(_positive_int(v, name, layer, minimum) for v in values)

def _fan_in_uniform(shape: tuple[int, ...], fan_in: int, bias_size: int | None) -> tuple[Tensor, Tensor | None]:
  """Weight and bias uniform in ±1/sqrt(fan_in): torch's kaiming_uniform_(a=sqrt(5)) and its bias rule."""
  bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
  weight = Tensor.uniform(*shape, low=-bound, high=bound)
  return weight, (Tensor.uniform(bias_size, low=-bound, high=bound) if bias_size is not None else None)

def _check_channels(layer: str, x: Tensor, channels: int, min_ndim: int = 2, axis: int = 1) -> None:
  """`x` needs at least `min_ndim` dims and `channels` entries along `axis`."""
  if not isinstance(x, Tensor): raise TypeError(f"{layer}: input must be a Tensor, got {type(x).__name__}{where()}")
  if x.ndim < min_ndim:
    raise TensorValueError(f"{layer}: input of shape {fmt(x.shape)} has {x.ndim} dims; the layer needs at least {min_ndim} "
                           f"(batch, channels, ...){where()}")
  if x.shape[axis] != channels:
    raise TensorValueError(f"{layer}: input of shape {fmt(x.shape)} has {x.shape[axis]} channels (axis {axis}) but the "
                           f"layer expects {channels}{where()}")

def _in_input_dtype(x: Tensor, out: Tensor) -> Tensor:
  """A normalization layer's output in the dtype of its float input `x`, as PyTorch gives it: float32 weights or
  statistics do not promote a half input."""
  return out.cast(x.dtype) if dtypes.is_float(x.dtype) and out.dtype != x.dtype else out

def _channel_view(t: Tensor, ndim: int) -> Tensor:
  """A per-channel (C,) tensor shaped (1, C, 1, ...) to broadcast against an `ndim`-dim (N, C, ...) input."""
  return t.reshape((1, t.numel()) + (1,) * (ndim - 2))   # sizes given in full: reshape's fast path

# ---------------- linear ----------------
class Linear:
  """y = x @ weight.T + bias, with weight of shape (out_features, in_features).

  Initialized like PyTorch: weight and bias uniform in [-1/sqrt(in_features), 1/sqrt(in_features)].

  >>> Linear(4, 2)(Tensor.ones(3, 4)).shape
  (3, 2)
  """
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    if in_features <= 0 or out_features <= 0:
      raise TensorValueError(f"Linear: in_features and out_features must be positive, got ({in_features}, "
                             f"{out_features}){where()}")
    bound = 1 / math.sqrt(in_features)
    self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
    self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    """Apply the layer to `x` of shape (..., in_features)."""
    in_features = self.weight.shape[1]
    if x.shape[-1] != in_features:
      raise TensorValueError(f"Linear: input's last dimension is {x.shape[-1]} but the layer expects {in_features} "
                             f"(input shape {fmt(x.shape)}, weight shape {fmt(self.weight.shape)}){where()}")
    out = x @ self.weight.T
    return out + self.bias if self.bias is not None else out

  def __repr__(self) -> str:
    out_features, in_features = self.weight.shape
    return f"Linear(in_features={in_features}, out_features={out_features}, bias={self.bias is not None})"

# ---------------- convolutions ----------------
def _conv_padding(padding, kernel: tuple[int, ...], stride, dilation, layer: str, transposed: bool):
  """`padding` checked; 'valid' becomes 0 and 'same' the (left, right, ...) pairs in PyTorch's flat order."""
  n = len(kernel)
  if isinstance(padding, str):
    mode = padding.lower()
    if mode == "valid": return 0
    if mode != "same" or transposed:
      raise TensorValueError(f"{layer}: padding {padding!r} is not supported; use an int, a sequence of ints"
                             f"{'' if transposed else ', or valid or same'}{where()}")
    if any(s != 1 for s in _int_tuple(stride, n, "stride", layer)):
      raise TensorValueError(f"{layer}: padding='same' needs stride 1, got stride={stride!r}{where()}")
    dilations = _int_tuple(dilation, n, "dilation", layer)
    pairs = []
    # the extra pixel of an odd total goes after (right/bottom), as PyTorch does; the flat order is last dim first
    for k, d in reversed(list(zip(kernel, dilations))):
      total = d * (k - 1)
      pairs += [total // 2, total - total // 2]
    return tuple(pairs)
  if isinstance(padding, (tuple, list)) and len(padding) in (n, 2 * n):
    for p in padding: _positive_int(p, "padding", layer, minimum=0)
    return padding
  _int_tuple(padding, n, "padding", layer, minimum=0)   # raises for anything but an int >= 0
  return padding

class Conv2d:
  """Convolution (cross-correlation) of (N, in_channels, *spatial) inputs with a (out, in/groups, *kernel) weight.

  `kernel_size` is an int (a 2-d kernel) or a tuple whose length sets the number of spatial dims, so a 3-tuple makes
  a 3-d convolution. `padding` is an int, one int per spatial dim, 2 ints per dim (PyTorch's flat order: left,
  right, top, bottom), 'valid' or 'same' (stride 1 only; an odd total pads one more after). An unbatched input
  (in_channels, *spatial) gives an unbatched output. Weight and bias start uniform in ±1/sqrt(fan_in),
  fan_in = in_channels/groups * prod(kernel_size), as in torch.nn.Conv2d.

  >>> Conv2d(3, 8, 3, padding=1)(Tensor.ones(2, 3, 5, 5)).shape
  (2, 8, 5, 5)
  """
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride=1,
               padding: int | tuple[int, ...] | str = 0, dilation=1, groups: int = 1, bias: bool = True):
    layer = type(self).__name__
    self.kernel_size = _conv_kernel(kernel_size, self._default_dims, layer)
    _check_conv_sizes(in_channels, out_channels, groups, layer)
    n = len(self.kernel_size)
    _int_tuple(stride, n, "stride", layer), _int_tuple(dilation, n, "dilation", layer)
    self.in_channels, self.out_channels = in_channels, out_channels
    self.stride, self.dilation, self.groups = stride, dilation, groups
    self.padding = _conv_padding(padding, self.kernel_size, stride, dilation, layer, transposed=False)
    shape = (out_channels, in_channels // groups, *self.kernel_size)
    self.weight, self.bias = _fan_in_uniform(shape, prod(shape[1:]), out_channels if bias else None)

  _default_dims = 2   # how many spatial dims an int kernel_size means

  def __call__(self, x: Tensor) -> Tensor:
    """Apply the convolution to (N, C, *spatial) or unbatched (C, *spatial) input."""
    batched = _conv_input(self, x)
    out = batched.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)
    return out if batched is x else out[0]

  def __repr__(self) -> str:
    return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={self.bias is not None})")

class Conv1d(Conv2d):
  """Conv2d over one spatial dim: (N, in_channels, L) -> (N, out_channels, L_out), as torch.nn.Conv1d.

  >>> Conv1d(2, 4, 3)(Tensor.ones(1, 2, 10)).shape
  (1, 4, 8)
  """
  _default_dims = 1

def _conv_kernel(kernel_size, default_dims: int, layer: str) -> tuple[int, ...]:
  """kernel_size as a tuple: an int means `default_dims` dims; a tuple sets the dims (for Conv1d: exactly one)."""
  if isinstance(kernel_size, (tuple, list)) and default_dims == 1 and len(kernel_size) != 1:
    raise TensorValueError(f"{layer}: kernel_size must be an int or a 1-tuple, got {kernel_size!r}{where()}")
  n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else default_dims
  if n == 0: raise TensorValueError(f"{layer}: kernel_size must name at least one spatial dim, got {kernel_size!r}{where()}")
  return _int_tuple(kernel_size, n, "kernel_size", layer)

def _check_conv_sizes(in_channels: int, out_channels: int, groups: int, layer: str) -> None:
  """Positive channel counts, both divisible by groups (as PyTorch requires)."""
  _positive_int(in_channels, "in_channels", layer), _positive_int(out_channels, "out_channels", layer)
  _positive_int(groups, "groups", layer)
  if in_channels % groups or out_channels % groups:
    raise TensorValueError(f"{layer}: in_channels={in_channels} and out_channels={out_channels} must both be divisible by "
                           f"groups={groups}{where()}")

def _conv_input(conv: Conv2d, x: Tensor) -> Tensor:
  """`x` checked against a conv layer, with a batch axis added when the input is unbatched (C, *spatial)."""
  layer, n = type(conv).__name__, len(conv.kernel_size)
  if not isinstance(x, Tensor): raise TypeError(f"{layer}: input must be a Tensor, got {type(x).__name__}{where()}")
  if x.ndim not in (n + 1, n + 2):
    raise TensorValueError(f"{layer}: input of shape {fmt(x.shape)} has {x.ndim} dims; a {n}-d convolution takes "
                           f"(N, C, {n} spatial) = {n + 2} dims or unbatched (C, {n} spatial) = {n + 1}{where()}")
  batched = x if x.ndim == n + 2 else x.unsqueeze(0)
  if batched.shape[1] != conv.in_channels:
    raise TensorValueError(f"{layer}: input of shape {fmt(x.shape)} has {batched.shape[1]} channels but the layer has "
                           f"in_channels={conv.in_channels}{where()}")
  return batched

class ConvTranspose2d(Conv2d):
  """Transposed convolution (the gradient of Conv2d) with a (in_channels, out_channels/groups, *kernel) weight.

  Each output size is (in-1)*stride - 2*padding + dilation*(kernel-1) + output_padding + 1. `kernel_size` as in
  Conv2d; `padding` is an int or one int per spatial dim. Weight and bias start uniform in ±1/sqrt(fan_in) with
  PyTorch's fan_in for this weight layout: out_channels/groups * prod(kernel_size).

  >>> ConvTranspose2d(4, 2, 3, stride=2)(Tensor.ones(1, 4, 5, 5)).shape
  (1, 2, 11, 11)
  """
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride=1, padding=0,
               output_padding=0, dilation=1, groups: int = 1, bias: bool = True):
    layer = type(self).__name__
    self.kernel_size = _conv_kernel(kernel_size, self._default_dims, layer)
    _check_conv_sizes(in_channels, out_channels, groups, layer)
    n = len(self.kernel_size)
    strides, dilations = _int_tuple(stride, n, "stride", layer), _int_tuple(dilation, n, "dilation", layer)
    out_pads = _int_tuple(output_padding, n, "output_padding", layer, minimum=0)
    if any(p >= max(s, d) for p, s, d in zip(out_pads, strides, dilations)):
      raise TensorValueError(f"{layer}: output_padding={output_padding!r} must be smaller than stride={stride!r} or "
                             f"dilation={dilation!r}{where()}")
    self.in_channels, self.out_channels = in_channels, out_channels
    self.stride, self.dilation, self.groups, self.output_padding = stride, dilation, groups, output_padding
    self.padding = _conv_padding(padding, self.kernel_size, stride, dilation, layer, transposed=True)
    shape = (in_channels, out_channels // groups, *self.kernel_size)
    self.weight, self.bias = _fan_in_uniform(shape, prod(shape[1:]), out_channels if bias else None)

  def __call__(self, x: Tensor) -> Tensor:
    """Apply the transposed convolution to (N, C, *spatial) or unbatched (C, *spatial) input."""
    batched = _conv_input(self, x)
    out = batched.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding,
                                   self.output_padding)
    return out if batched is x else out[0]

  def __repr__(self) -> str:
    return super().__repr__()[:-1] + f", output_padding={self.output_padding})"

class ConvTranspose1d(ConvTranspose2d):
  """ConvTranspose2d over one spatial dim, as torch.nn.ConvTranspose1d.

  >>> ConvTranspose1d(2, 3, 4, stride=2)(Tensor.ones(1, 2, 5)).shape
  (1, 3, 12)
  """
  _default_dims = 1

# ---------------- normalization ----------------
class BatchNorm:
  """Batch normalization over axis 1 of (N, C, ...) inputs of any rank >= 2 (BatchNorm1d/2d/3d of PyTorch).

  While `Tensor.training` (see `Tensor.train()`), each channel is normalized by the batch's mean and biased variance
  and, if `track_running_stats`, the running statistics move towards the batch's: running = (1-momentum)*running +
  momentum*batch, with the unbiased variance (momentum=None: a cumulative average, as PyTorch). Otherwise the running
  statistics are used (or the batch's, without `track_running_stats`). `affine` adds `weight` (ones) and `bias`
  (zeros). Without `track_running_stats`, `running_mean`, `running_var` and `num_batches_tracked` are None, as in
  PyTorch, so the state-dict keys match. The running statistics have requires_grad=False, so an optimizer given
  `get_parameters(model)` realizes them with each step.

  >>> norm = BatchNorm(3)
  >>> with Tensor.train(): y = norm(Tensor.randn(4, 3, 2, 2))
  >>> [round(v, 2) for v in norm.running_var.tolist()] != [1.0, 1.0, 1.0]
  True
  """
  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
               momentum: float | None = 0.1):
    _positive_int(sz, "sz (num_features)", "BatchNorm")
    self.num_features, self.eps, self.affine = sz, eps, affine
    self.track_running_stats, self.momentum = track_running_stats, momentum
    self.weight: Tensor | None = Tensor.ones(sz) if affine else None
    self.bias: Tensor | None = Tensor.zeros(sz) if affine else None
    self.running_mean: Tensor | None = None
    self.running_var: Tensor | None = None
    self.num_batches_tracked: Tensor | None = None
    if track_running_stats:
      self.running_mean = Tensor.zeros(sz, requires_grad=False)
      self.running_var = Tensor.ones(sz, requires_grad=False)
      self.num_batches_tracked = Tensor.zeros((), dtype=dtypes.int64, requires_grad=False)

  def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
    """The per-channel (mean, variance) that normalize `x`: the running ones in evaluation mode (when tracked), else
    the batch's mean and biased variance over every axis but 1."""
    if self.track_running_stats and not Tensor.training: return self.running_mean, self.running_var
    axes = tuple(a for a in range(x.ndim) if a != 1)
    # half statistics in float32, as PyTorch keeps them (a half square overflows past 256); __call__ casts them back
    if x.dtype in dtypes.narrow_floats: x = x.float()
    mean = x.mean(axes)
    # d(var)/d(mean) is zero at the true mean (the centered values sum to 0), so the mean's graph can be cut here
    centered = x - _channel_view(mean.detach(), x.ndim)
    return mean, centered.square().mean(axes)

  def __call__(self, x: Tensor) -> Tensor:
    """Normalize `x` of shape (N, C, ...) per channel."""
    _check_channels("BatchNorm", x, self.num_features)
    count = x.numel() // self.num_features
    if count <= 1 and Tensor.training:
      raise TensorValueError(f"BatchNorm: training needs more than 1 value per channel, got input of shape "
                             f"{fmt(x.shape)}{where()}")
    mean, var = self.calc_stats(x)
    if Tensor.training and self.track_running_stats: self._update_running_stats(mean, var, count)
    invstd = (var + self.eps).rsqrt()
    # a half input is normalized in float32, its statistics' dtype, and rounded once to its own dtype
    return _in_input_dtype(x, x.batchnorm(self.weight, self.bias, mean, invstd))

  def _update_running_stats(self, mean: Tensor, var: Tensor, count: int) -> None:
    """Move the running statistics towards the batch's (PyTorch stores the unbiased variance)."""
    self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    # momentum=None: the cumulative average 1/n, kept a tensor so a TinyJit replay sees the current count
    factor = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked.cast(dtypes.float32)
    unbiased = var.detach() * (count / (count - 1))
    self.running_mean.assign(self.running_mean * (1 - factor) + mean.detach() * factor)
    self.running_var.assign(self.running_var * (1 - factor) + unbiased * factor)

  def __repr__(self) -> str:
    return (f"BatchNorm({self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats})")

BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm

class LayerNorm:
  """Normalize over the trailing `normalized_shape` axes, then scale by `weight` (ones) and shift by `bias` (zeros).

  `elementwise_affine=False` leaves out both; `bias=False` only the bias (as torch.nn.LayerNorm).

  >>> [round(v, 3) for v in LayerNorm(3)(Tensor([[1.0, 2.0, 3.0]])).tolist()[0]]
  [-1.225, 0.0, 1.225]
  """
  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True,
               bias: bool = True):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape: raise TensorValueError(f"{type(self).__name__}: normalized_shape must not be empty{where()}")
    self.normalized_shape = tuple(_positive_int(s, "normalized_shape", type(self).__name__) for s in shape)
    self.axis = tuple(range(-len(shape), 0))
    self.eps, self.elementwise_affine = eps, elementwise_affine
    self.weight: Tensor | None = Tensor.ones(*shape) if elementwise_affine else None
    self.bias: Tensor | None = Tensor.zeros(*shape) if elementwise_affine and bias else None

  def __call__(self, x: Tensor) -> Tensor:
    """Normalize `x` of shape (..., *normalized_shape)."""
    n = len(self.normalized_shape)
    if not isinstance(x, Tensor): raise TypeError(f"LayerNorm: input must be a Tensor, got {type(x).__name__}{where()}")
    if x.shape[x.ndim - n:] != self.normalized_shape or x.ndim < n:
      raise TensorValueError(f"LayerNorm: input of shape {fmt(x.shape)} must end with normalized_shape "
                             f"{fmt(self.normalized_shape)}{where()}")
    out = x.layernorm(self.axis, self.eps)
    if self.weight is not None: out = out * self.weight
    return _in_input_dtype(x, out + self.bias if self.bias is not None else out)

  def __repr__(self) -> str:
    return (f"{type(self).__name__}({self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine})")

class LayerNorm2d(LayerNorm):
  """LayerNorm over the channel axis 1 of (N, C, ...) inputs (as used by ConvNeXt-style models), per position.

  >>> LayerNorm2d(3)(Tensor.ones(2, 3, 4, 4)).shape
  (2, 3, 4, 4)
  """
  def __call__(self, x: Tensor) -> Tensor:
    """Normalize each position of `x` (N, C, ...) over its C channels."""
    _check_channels("LayerNorm2d", x, self.normalized_shape[0])
    channels_last = x.permute(0, *range(2, x.ndim), 1)
    return super().__call__(channels_last).permute(0, x.ndim - 1, *range(1, x.ndim - 1))

class GroupNorm:
  """Split the channels of (N, C, ...) into `num_groups` groups and normalize each group of each sample.

  `affine` adds a per-channel `weight` (ones) and `bias` (zeros), as torch.nn.GroupNorm.

  >>> GroupNorm(2, 4)(Tensor.randn(3, 4, 5)).shape
  (3, 4, 5)
  """
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    _positive_int(num_groups, "num_groups", "GroupNorm"), _positive_int(num_channels, "num_channels", "GroupNorm")
    if num_channels % num_groups:
      raise TensorValueError(f"GroupNorm: num_channels={num_channels} is not divisible by num_groups={num_groups}{where()}")
    self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
    self.weight: Tensor | None = Tensor.ones(num_channels) if affine else None
    self.bias: Tensor | None = Tensor.zeros(num_channels) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    """Normalize `x` of shape (N, C, ...)."""
    _check_channels("GroupNorm", x, self.num_channels)
    out = x.reshape(x.shape[0], self.num_groups, -1).layernorm(-1, self.eps).reshape(x.shape)
    if self.weight is not None: out = out * _channel_view(self.weight, x.ndim)
    return _in_input_dtype(x, out + _channel_view(self.bias, x.ndim) if self.bias is not None else out)

  def __repr__(self) -> str:
    return f"GroupNorm({self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine})"

class InstanceNorm:
  """Normalize each channel of each sample of (N, C, *spatial) over its spatial positions (InstanceNorm1d/2d/3d).

  `affine` (on by default, as tinygrad; PyTorch's default is off) adds a per-channel `weight` (ones) and `bias`
  (zeros). No running statistics are kept (PyTorch's default track_running_stats=False).

  >>> InstanceNorm(3)(Tensor.randn(2, 3, 4, 4)).shape
  (2, 3, 4, 4)
  """
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
    self.num_features, self.eps = _positive_int(num_features, "num_features", "InstanceNorm"), eps
    self.weight: Tensor | None = Tensor.ones(num_features) if affine else None
    self.bias: Tensor | None = Tensor.zeros(num_features) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    """Normalize `x` of shape (N, C, *spatial), at least one spatial axis."""
    _check_channels("InstanceNorm", x, self.num_features, min_ndim=3)
    out = x.layernorm(tuple(range(2, x.ndim)), self.eps)
    if self.weight is not None: out = out * _channel_view(self.weight, x.ndim)
    return _in_input_dtype(x, out + _channel_view(self.bias, x.ndim) if self.bias is not None else out)

  def __repr__(self) -> str:
    return f"InstanceNorm({self.num_features}, eps={self.eps}, affine={self.weight is not None})"

class RMSNorm:
  """x / sqrt(mean(x**2 over the last axis) + eps) * weight (ones), as torch.nn.RMSNorm(dim, eps).

  Half-precision inputs are normalized in float32 and cast back before the weight is applied, as PyTorch does; the
  output has the input's dtype whatever the weight's.

  >>> [round(v, 3) for v in RMSNorm(2)(Tensor([[3.0, 4.0]])).tolist()[0]]
  [0.849, 1.131]
  """
  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    self.dim, self.eps = _positive_int(dim, "dim", "RMSNorm"), eps
    self.weight: Tensor | None = Tensor.ones(dim) if elementwise_affine else None

  def _norm(self, x: Tensor) -> Tensor:
    return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()

  def __call__(self, x: Tensor) -> Tensor:
    """Normalize `x` of shape (..., dim)."""
    if not isinstance(x, Tensor): raise TypeError(f"RMSNorm: input must be a Tensor, got {type(x).__name__}{where()}")
    if x.ndim == 0 or x.shape[-1] != self.dim:
      raise TensorValueError(f"RMSNorm: input of shape {fmt(x.shape)} must end with dim={self.dim}{where()}")
    low_precision = dtypes.is_float(x.dtype) and x.dtype.itemsize < 4
    out = self._norm(x.float()).cast(x.dtype) if low_precision else self._norm(x)
    return _in_input_dtype(x, out * self.weight if self.weight is not None else out)

  def __repr__(self) -> str:
    return f"RMSNorm({self.dim}, eps={self.eps}, elementwise_affine={self.weight is not None})"

# ---------------- embedding ----------------
class Embedding:
  """A lookup table: int indices of any shape (...) -> rows of `weight` (vocab_size, embed_size), shape (..., embed).

  `weight` starts standard normal, as torch.nn.Embedding. The lookup is lazy: it is written as a compare with the
  vocabulary positions and a sum of the matching rows, which the code generator turns into one kernel that loads
  each token's row (kiln/codegen/gather.py), so it reads tokens*embed values, not the table. The weight's gradient
  is one kernel too (a sum over tokens). Indices outside [0, vocab_size), negative ones included, are not checked
  (that would need the data): they give rows of zeros.

  >>> emb = Embedding(10, 4)
  >>> emb(Tensor([[1, 2, 3]])).shape
  (1, 3, 4)
  """
  def __init__(self, vocab_size: int, embed_size: int):
    self.vocab_sz = _positive_int(vocab_size, "vocab_size", "Embedding")
    self.embed_sz = _positive_int(embed_size, "embed_size", "Embedding")
    self.weight = Tensor.randn(vocab_size, embed_size)

  def __call__(self, idx: Tensor) -> Tensor:
    """The rows of `weight` at the int indices `idx`."""
    if not isinstance(idx, Tensor):
      raise TypeError(f"Embedding: indices must be an int Tensor, got {type(idx).__name__}{where()}")
    if not dtypes.is_int(idx.dtype):
      raise UnsupportedError(f"Embedding: indices must have an int dtype, got {idx.dtype} (shape {fmt(idx.shape)}){where()}")
    if idx.device != self.weight.device: idx = idx.to(self.weight.device)
    # not `weight[idx]`: that wraps negative indices (torch raises for them; here they give zeros). Both become the
    # same single load kernel
    hit = idx.unsqueeze(-1) == Tensor.arange(self.vocab_sz, device=self.weight.device)
    return hit.unsqueeze(-1).where(self.weight, 0).sum(-2)

  def __repr__(self) -> str:
    return f"Embedding({self.vocab_sz}, {self.embed_sz})"

# ---------------- recurrent ----------------
class LSTMCell:
  """One step of an LSTM: (x, (h, c)) -> (h', c'), with PyTorch's gate order (input, forget, cell, output).

  `weight_ih` is (4*hidden, input), `weight_hh` (4*hidden, hidden); all parameters start uniform in
  ±1/sqrt(hidden_size), as torch.nn.LSTMCell. `x` is (batch, input_size) or unbatched (input_size,); a missing
  state starts at zeros. The outputs are made contiguous so a loop over time steps does not grow one huge graph.

  >>> cell = LSTMCell(3, 5)
  >>> h, c = cell(Tensor.ones(2, 3))
  >>> h.shape, c.shape
  ((2, 5), (2, 5))
  """
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    self.input_size = _positive_int(input_size, "input_size", "LSTMCell")
    self.hidden_size = _positive_int(hidden_size, "hidden_size", "LSTMCell")
    bound = 1 / math.sqrt(hidden_size)
    self.weight_ih = Tensor.uniform(4 * hidden_size, input_size, low=-bound, high=bound)
    self.weight_hh = Tensor.uniform(4 * hidden_size, hidden_size, low=-bound, high=bound)
    self.bias_ih = Tensor.uniform(4 * hidden_size, low=-bound, high=bound) if bias else None
    self.bias_hh = Tensor.uniform(4 * hidden_size, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """The next (hidden, cell) state for input `x` and state `hc` = (hidden, cell)."""
    if not isinstance(x, Tensor): raise TypeError(f"LSTMCell: input must be a Tensor, got {type(x).__name__}{where()}")
    if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
      raise TensorValueError(f"LSTMCell: input of shape {fmt(x.shape)} must be (batch, {self.input_size}) or "
                             f"({self.input_size},){where()}")
    state_shape = x.shape[:-1] + (self.hidden_size,)
    if hc is None:
      h = c = Tensor.zeros(*state_shape, dtype=x.dtype, device=x.device)
    else:
      if not isinstance(hc, (tuple, list)) or len(hc) != 2:
        raise TypeError(f"LSTMCell: hc must be a (hidden, cell) pair of tensors, got {type(hc).__name__}{where()}")
      h, c = hc
      if h.shape != state_shape or c.shape != state_shape:
        raise TensorValueError(f"LSTMCell: hidden {fmt(h.shape)} and cell {fmt(c.shape)} must both be "
                               f"{fmt(state_shape)} for input {fmt(x.shape)}{where()}")
    gates = x.linear(self.weight_ih.T, self.bias_ih) + h.linear(self.weight_hh.T, self.bias_hh)
    input_gate, forget_gate, cell_gate, output_gate = gates.chunk(4, dim=-1)
    new_c = forget_gate.sigmoid() * c + input_gate.sigmoid() * cell_gate.tanh()
    new_h = output_gate.sigmoid() * new_c.tanh()
    return new_h.contiguous(), new_c.contiguous()

  def __repr__(self) -> str:
    return f"LSTMCell({self.input_size}, {self.hidden_size}, bias={self.bias_ih is not None})"
