"""The ONNX operators of the default domain as kiln Tensor ops: math, casts, shapes, indexing, reductions, sequences.

Each operator is a function of the node's inputs (positional, None where omitted) and its attributes (keywords, named
as in the ONNX spec); an attribute the function does not name is reported as unsupported. A function that needs the
opset, its output count or to run a subgraph takes `ctx` (onnx.NodeContext). OPS maps op type -> function; the
neural-network operators (conv, pools, norms, resize, recurrent layers) are in onnx_nn.py and register here too.
"""
from __future__ import annotations
import math
from typing import Callable
import numpy as np
from kiln.dtype import DType, dtypes
from kiln.tensor import Tensor
from kiln.frontend.onnx_proto import (EMULATED_FLOATS, HELD_TYPES, dtype_of_onnx, held_type, host_value, mark_type,
                                      remember, round_to_emulated)
from kiln.frontend.onnx_symbolic import (arange_to, infer_dim, sint_array, sizes_tensor, symbolic_arange,
                                         symbolic_slice)
from kiln.uop.ops import UOp
from kiln.uop.sint import sprod

OPS: dict[str, Callable] = {}

def op(*names: str):
  """Register a function as the implementation of these ONNX op types."""
  def register(fn: Callable) -> Callable:
    for name in names: OPS[name] = fn
    return fn
  return register

# ---- helpers: static values of small tensors (shapes, axes), axes, dtypes

def host_array(value) -> np.ndarray:
  """A tensor's values on the host: its host copy where there is one (see onnx_proto.remember), else read."""
  if not isinstance(value, Tensor): return np.asarray(value)
  known = host_value(value)
  return known if known is not None else value.numpy()

def ints(value) -> list | None:
  """A shape/axes-like input or attribute as a list of Python ints (None stays None); a symbolic size
  (onnx_symbolic.py) stays its expression."""
  if value is None: return None
  return [v if isinstance(v, UOp) else int(v) for v in host_array(value).reshape(-1)]

def scalar(value):
  """A one-element input as a Python number (a symbolic size stays its expression)."""
  first = host_array(value).reshape(-1)[0]
  return first if isinstance(first, UOp) else first.item()

def axis_of(axis: int, ndim: int) -> int:
  """A possibly negative axis -> 0..ndim-1."""
  if not -ndim <= axis < max(ndim, 1): raise ValueError(f"axis {axis} is out of range for {ndim} dims")
  return axis + ndim if axis < 0 else axis

def full(shape, value, dtype: DType) -> Tensor:
  return Tensor.full(tuple(shape), value, dtype=dtype)

def is_float(t: Tensor) -> bool: return dtypes.is_float(t.dtype)

def move_axis(x: Tensor, source: int, dest: int) -> Tensor:
  order = [i for i in range(x.ndim) if i != source]
  order.insert(dest, source)
  return x.permute(*order)

def normalize_index(index: Tensor, size) -> Tensor:
  """Negative indices count from the end, as ONNX allows."""
  return (index < 0).where(index + size, index)

# ---- elementwise math

def _same_dtype_binary(name: str):
  def binary(a: Tensor, b: Tensor) -> Tensor:
    return getattr(a, name)(b)
  return binary

@op("Equal")
def equal(a, b) -> Tensor:
  if isinstance(a, np.ndarray): return Tensor(np.equal(a, b).astype(bool))  # strings
  return a.eq(b)

for _onnx_name, _method in [("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("BitwiseAnd", "bitwise_and"),
                            ("BitwiseOr", "bitwise_or"), ("BitwiseXor", "bitwise_xor"), ("And", "bitwise_and"),
                            ("Or", "bitwise_or"), ("Xor", "bitwise_xor")]:
  OPS[_onnx_name] = _same_dtype_binary(_method)

@op("Less")
def less(a: Tensor, b: Tensor) -> Tensor: return a < b
@op("LessOrEqual")
def less_or_equal(a: Tensor, b: Tensor) -> Tensor: return a <= b
@op("Greater")
def greater(a: Tensor, b: Tensor) -> Tensor: return a > b
@op("GreaterOrEqual")
def greater_or_equal(a: Tensor, b: Tensor) -> Tensor: return a >= b

@op("Div")
def div(a: Tensor, b: Tensor) -> Tensor:
  """Integer division truncates toward zero, as C and ONNX's reference do."""
  return a.div(b) if is_float(a) else a.idiv(b)

@op("Mod")
def mod(a: Tensor, b: Tensor, fmod: int = 0) -> Tensor:
  """fmod=0: the result takes the divisor's sign (Python's %); fmod=1: the dividend's sign (C's fmod)."""
  if not fmod: return a.mod(b)
  if is_float(a): return a - b * (a / b).trunc()
  return a - b * a.idiv(b)

@op("Pow")
def pow_(base: Tensor, exponent: Tensor) -> Tensor:
  """The result has the base's dtype; integer bases are computed in float64 and rounded back."""
  if is_float(base): return base.pow(exponent.cast(base.dtype))
  result = base.cast(dtypes.float64).pow(exponent.cast(dtypes.float64))
  return (result.round() if not is_float(exponent) else result.trunc()).cast(base.dtype)

@op("BitShift")
def bit_shift(x: Tensor, amount: Tensor, direction: str = "") -> Tensor:
  if direction not in ("LEFT", "RIGHT"): raise ValueError(f"direction must be LEFT or RIGHT, got {direction!r}")
  return x.lshift(amount) if direction == "LEFT" else x.rshift(amount)

@op("BitwiseNot")
def bitwise_not(x: Tensor) -> Tensor: return x.bitwise_not()
@op("Not")
def logical_not(x: Tensor) -> Tensor: return x.logical_not()

_UNARY = {"Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
          "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "Sin": "sin", "Cos": "cos", "Tan": "tan",
          "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh",
          "Acosh": "acosh", "Atanh": "atanh", "Erf": "erf", "Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu",
          "IsNaN": "isnan", "Softsign": "softsign"}

def _unary(method: str):
  def unary(x: Tensor) -> Tensor: return getattr(x, method)()
  return unary

for _onnx_name, _method in _UNARY.items(): OPS[_onnx_name] = _unary(_method)

@op("Softplus")
def softplus(x: Tensor) -> Tensor:
  """log(1 + exp(x)), exact for large x."""
  return (x > 20).where(x, (x.exp() + 1).log())

@op("IsInf")
def is_inf(x: Tensor, detect_negative: int = 1, detect_positive: int = 1) -> Tensor:
  return ((x == math.inf) & bool(detect_positive)) | ((x == -math.inf) & bool(detect_negative))

def _variadic(method: str):
  def variadic(*xs: Tensor) -> Tensor:
    result = xs[0]
    for x in xs[1:]: result = getattr(result, method)(x)
    return result
  return variadic

OPS["Sum"], OPS["Max"], OPS["Min"] = _variadic("add"), _variadic("maximum"), _variadic("minimum")

@op("Mean")
def mean(*xs: Tensor) -> Tensor: return _variadic("add")(*xs) / len(xs)

# ---- activations

@op("LeakyRelu")
def leaky_relu(x: Tensor, alpha: float = 0.01) -> Tensor: return (x >= 0).where(x, x * alpha)
@op("PRelu")
def prelu(x: Tensor, slope: Tensor) -> Tensor: return (x >= 0).where(x, x * slope)
@op("Elu")
def elu(x: Tensor, alpha: float = 1.0) -> Tensor: return (x >= 0).where(x, (x.exp() - 1) * alpha)
@op("Celu")
def celu(x: Tensor, alpha: float = 1.0) -> Tensor: return x.maximum(0) + ((x / alpha).exp() - 1).minimum(0) * alpha
@op("ThresholdedRelu")
def thresholded_relu(x: Tensor, alpha: float = 1.0) -> Tensor: return (x > alpha).where(x, 0)
@op("HardSigmoid")
def hard_sigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5) -> Tensor: return (x * alpha + beta).clip(0, 1)
@op("HardSwish")
def hard_swish(x: Tensor) -> Tensor: return x * (x / 6 + 0.5).clip(0, 1)
@op("Mish")
def mish(x: Tensor) -> Tensor: return x * softplus(x).tanh()

@op("Selu")
def selu(x: Tensor, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875) -> Tensor:
  return (x > 0).where(x, (x.exp() - 1) * alpha) * gamma

@op("Gelu")
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
  if approximate == "tanh": return x * 0.5 * (1 + ((x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)).tanh())
  if approximate != "none": raise NotImplementedError(f"approximate={approximate!r}")
  return x * 0.5 * (1 + (x / math.sqrt(2)).erf())

@op("Shrink")
def shrink(x: Tensor, bias: float = 0.0, lambd: float = 0.5) -> Tensor:
  return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)

@op("Clip")
def clip(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002 (ONNX's names; attributes before opset 11)
  low, high = min, max
  if low is not None: x = x.maximum(low if not isinstance(low, Tensor) else low.cast(x.dtype))
  if high is not None: x = x.minimum(high if not isinstance(high, Tensor) else high.cast(x.dtype))
  return x

def _softmax_axis(x: Tensor, axis: int | None, ctx, fn: Callable[[Tensor, int], Tensor]) -> Tensor:
  """Opset 13 reduces one axis (default -1); earlier opsets flatten from `axis` (default 1) into 2-d."""
  if ctx.opset >= 13: return fn(x, axis_of(-1 if axis is None else axis, x.ndim))
  axis = axis_of(1 if axis is None else axis, x.ndim)
  flat = x.reshape(sprod(x.shape[:axis]), sprod(x.shape[axis:]))
  return fn(flat, 1).reshape(x.shape)

@op("Softmax")
def softmax(x: Tensor, axis: int | None = None, ctx=None) -> Tensor:
  return _softmax_axis(x, axis, ctx, lambda t, a: t.softmax(a))

@op("LogSoftmax")
def log_softmax(x: Tensor, axis: int | None = None, ctx=None) -> Tensor:
  return _softmax_axis(x, axis, ctx, lambda t, a: t.log_softmax(a))

def _hardmax(x: Tensor, axis: int) -> Tensor:
  index = x.argmax(axis, keepdim=True)
  positions = Tensor.arange(x.shape[axis]).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
  return (positions == index).cast(x.dtype)

@op("Hardmax")
def hardmax(x: Tensor, axis: int | None = None, ctx=None) -> Tensor: return _softmax_axis(x, axis, ctx, _hardmax)

# ---- casts

# float8: the largest finite value, and the magnitude from which saturate=0 rounds to the overflow value (NaN for
# e4m3fn, which has no infinity; inf for e5m2). 448's last mantissa bit is even, so a tie at 464 rounds down to it.
_FP8_MAX = {dtypes.fp8e4m3: 448.0, dtypes.fp8e5m2: 57344.0}
_FP8_OVERFLOW = {dtypes.fp8e4m3: (464.0, math.nan, False), dtypes.fp8e5m2: (61440.0, math.inf, True)}  # keeps sign
_INT4_RANGE = {21: (0, 15), 22: (-8, 7)}

def _signed_nans(x: Tensor) -> Tensor:
  """The negative NaN in x's shape and dtype, loaded from a buffer: a NaN constant in a kiln graph is rendered
  without its sign (kiln/renderer/cstyle.py writes every NaN literal as __builtin_nan("")), a load keeps it."""
  return Tensor(np.array([-np.nan], np.float32), device=x.device).cast(x.dtype).reshape((1,) * x.ndim).expand(x.shape)

def cast_to(x, dtype: DType, saturate: int = 1):
  """ONNX Cast: float->int truncates; float8 targets saturate to their largest finite value unless saturate=0."""
  if isinstance(x, np.ndarray):  # strings
    return Tensor(x.astype(np.float64 if dtypes.is_float(dtype) else np.int64)).cast(dtype)
  if x.dtype == dtype: return x
  if dtype in _FP8_MAX and is_float(x):
    limit = _FP8_MAX[dtype]
    if saturate: x = x.isnan().where(x, x.clip(-limit, limit))
    else:
      threshold, overflow, signed = _FP8_OVERFLOW[dtype]
      big = x.abs() > threshold if not signed else x.abs() >= threshold
      over = (x < 0).where(_signed_nans(x) if math.isnan(overflow) else -overflow, overflow)
      return big.where(over, x.clip(-limit, limit)).cast(dtype)
  if is_float(x) and not dtypes.is_float(dtype) and dtype != dtypes.bool: x = x.trunc()
  return x.cast(dtype)

@op("Cast")
def cast(x, to: int = 1, saturate: int = 1, round_mode: str = "up"):
  if to == 8:  # STRING
    values = x.numpy() if isinstance(x, Tensor) else x
    return values.astype(str).astype(object)  # numpy writes a float32 in its shortest round-trip form
  if to in EMULATED_FLOATS:
    values = host_array(x.cast(dtypes.float32))
    return mark_type(Tensor(round_to_emulated(values, to, bool(saturate)), dtype=dtypes.float32), to)
  if to in _INT4_RANGE:  # int4/uint4 are held in 8-bit integers; a cast saturates to their range
    low, high = _INT4_RANGE[to]
    if is_float(x): x = x.round()
    return mark_type(x.clip(low, high).cast(dtype_of_onnx(to)), to)
  return cast_to(x, dtype_of_onnx(to), saturate)

@op("CastLike")
def cast_like(x, target, saturate: int = 1, round_mode: str = "up"):
  if isinstance(target, np.ndarray): return cast(x, to=8)
  if held_type(target) is not None: return cast(x, to=held_type(target), saturate=saturate)
  return cast_to(x, target.dtype, saturate)

# ---- constants and shapes

@op("Identity")
def identity(x): return x

@op("Constant")
def constant(value=None, value_float=None, value_floats=None, value_int=None, value_ints=None, value_string=None,
             value_strings=None, sparse_value=None):
  if value is not None: return value
  if sparse_value is not None: return sparse_value
  if value_float is not None: return Tensor(value_float, dtype=dtypes.float32)
  if value_floats is not None: return Tensor(list(value_floats), dtype=dtypes.float32)
  if value_int is not None: return Tensor(value_int, dtype=dtypes.int64)
  if value_ints is not None: return Tensor(list(value_ints), dtype=dtypes.int64)
  if value_string is not None: return np.array(value_string, dtype=object)
  if value_strings is not None: return np.array(list(value_strings), dtype=object)
  raise ValueError("Constant has no value attribute")

@op("Shape")
def shape(x, start: int = 0, end: int | None = None) -> Tensor:
  dims = sint_array(list(x.shape)[slice(start, end)])
  if dims.dtype == object: return remember(sizes_tensor(dims), dims)
  return remember(Tensor(dims, dtype=dtypes.int64), dims)

@op("Size")
def size(x) -> Tensor:
  count = sint_array([sprod(x.shape)]).reshape(())
  if count.dtype == object: return remember(sizes_tensor(count), count)
  return remember(Tensor(count, dtype=dtypes.int64), count)

@op("ConstantOfShape")
def constant_of_shape(shape_: Tensor, value: Tensor | None = None) -> Tensor:
  if value is None: return full(ints(shape_), 0.0, dtypes.float32)
  return full(ints(shape_), scalar(value), value.dtype)

@op("Reshape")
def reshape(data: Tensor, shape_: Tensor | None = None, allowzero: int = 0, shape=None) -> Tensor:
  target = ints(shape_ if shape_ is not None else shape)
  if not allowzero: target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
  plain = [d for d in target if not isinstance(d, UOp)]
  if -1 in plain and len(plain) == len(target) and all(not isinstance(d, UOp) for d in data.shape):
    # infer here: kiln cannot infer a dim next to a zero (with symbolic sizes kiln infers it: no zeros there)
    known = int(np.prod([d for d in target if d != -1]))
    target[target.index(-1)] = int(np.prod(data.shape)) // known if known else 0
  elif -1 in plain:   # symbolic sizes: kiln's simplifier does not cancel (n*m*32)//(n*m*4), so cancel factors here
    rest = infer_dim(data.shape, [d for d in target if isinstance(d, UOp) or d != -1])
    if rest is not None: target[next(i for i, d in enumerate(target) if not isinstance(d, UOp) and d == -1)] = rest
  return data.reshape(target)

@op("Flatten")
def flatten(x: Tensor, axis: int = 1) -> Tensor:
  axis = axis + x.ndim if axis < 0 else axis
  return x.reshape(sprod(x.shape[:axis]), sprod(x.shape[axis:]))

@op("Transpose")
def transpose(x, perm=None):
  if isinstance(x, np.ndarray): return np.transpose(x, perm)
  return x.permute(*(perm if perm is not None else reversed(range(x.ndim))))

@op("Squeeze")
def squeeze(x: Tensor, axes=None) -> Tensor:
  axes = ints(axes)
  if axes is None: axes = [i for i, d in enumerate(x.shape) if d == 1]
  axes = {axis_of(a, x.ndim) for a in axes}
  return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])

@op("Unsqueeze")
def unsqueeze(x: Tensor, axes=None) -> Tensor:
  rank = x.ndim + len(ints(axes))
  axes = sorted(axis_of(a, rank) for a in ints(axes))
  dims = list(x.shape)
  for a in axes: dims.insert(a, 1)
  return x.reshape(dims)

@op("Concat")
def concat(*xs, axis: int = 0):
  if isinstance(xs[0], np.ndarray): return np.concatenate(xs, axis)
  axis = axis_of(axis, xs[0].ndim)
  kept = [x for x in xs if x.shape[axis] != 0] or [xs[0]]
  return kept[0].cat(*kept[1:], dim=axis)

@op("Split")
def split(x: Tensor, split=None, axis: int = 0, num_outputs: int | None = None, ctx=None):  # noqa: A002
  axis = axis_of(axis, x.ndim)
  sizes = ints(split)
  if sizes is None:
    parts = num_outputs or ctx.n_outputs
    chunk = -(-x.shape[axis] // parts)
    sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
  return tuple(x.split(sizes, axis)) if len(sizes) > 1 else (x,)

@op("Slice")
def slice_(data: Tensor, starts=None, ends=None, axes=None, steps=None) -> Tensor:
  starts, ends = ints(starts), ints(ends)
  axes = [axis_of(a, data.ndim) for a in ints(axes)] if axes is not None else list(range(len(starts)))
  steps = ints(steps) or [1] * len(starts)
  index = [slice(None)] * data.ndim
  for axis, start, end, step in zip(axes, starts, ends, steps): index[axis] = slice(start, end, step)
  if any(isinstance(v, UOp) for v in (*starts, *ends, *(data.shape[a] for a in axes))):
    for axis in axes: index[axis] = symbolic_slice(index[axis], data.shape[axis])
    return data[tuple(index)]
  if any(data.shape[axis] == 0 or len(range(*index[axis].indices(data.shape[axis]))) == 0 for axis in axes):
    dims = [len(range(*index[i].indices(d))) for i, d in enumerate(data.shape)]
    return Tensor.zeros(*dims, dtype=data.dtype) if all(dims) else full(dims, 0, data.dtype)
  return data[tuple(index)]

@op("Gather")
def gather(data: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
  axis = axis_of(axis, data.ndim)
  if isinstance(data, np.ndarray): return np.take(data, indices.numpy(), axis)
  if 0 in indices.shape or 0 in data.shape:
    dims = list(data.shape[:axis]) + list(indices.shape) + list(data.shape[axis + 1:])
    return full(dims, 0, data.dtype)
  known = host_value(indices)
  if isinstance(data.shape[axis], UOp) and known is not None and known.ndim == 0:
    # one known position on a symbolic axis (`y[:, -1]`): an index expression that holds for every size
    return data[(slice(None),) * axis + (symbolic_slice(slice(int(known), int(known) + 1 or None),
                                                                   data.shape[axis]).start,)]
  index = normalize_index(indices.cast(dtypes.int64), data.shape[axis])
  return data[(slice(None),) * axis + (index,)]

@op("GatherElements")
def gather_elements(data: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
  axis = axis_of(axis, data.ndim)
  return data.gather(axis, normalize_index(indices.cast(dtypes.int64), data.shape[axis]))

def _linear_index(indices: Tensor, dims) -> Tensor:
  """The last axis of `indices` (positions into `dims`) -> one flat row-major index."""
  flat, stride = None, 1
  for j in reversed(range(len(dims))):
    term = normalize_index(indices[..., j], dims[j]) * stride
    flat = term if flat is None else flat + term
    stride *= dims[j]
  return flat

@op("GatherND")
def gather_nd(data: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
  indices = indices.cast(dtypes.int64)
  depth = indices.shape[-1]
  batch, indexed = data.shape[:batch_dims], data.shape[batch_dims:batch_dims + depth]
  tail = data.shape[batch_dims + depth:]
  middle = indices.shape[batch_dims:-1]
  n_batch, n_middle, n_tail = sprod(batch), sprod(middle), sprod(tail)
  source = data.reshape(n_batch, sprod(indexed), n_tail)
  flat = _linear_index(indices, indexed).reshape(n_batch, n_middle, 1).expand(n_batch, n_middle, n_tail)
  return source.gather(1, flat).reshape(*batch, *middle, *tail)

_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}

@op("ScatterElements", "Scatter")
def scatter_elements(data: Tensor, indices: Tensor, updates: Tensor, axis: int = 0, reduction: str = "none") -> Tensor:
  axis = axis_of(axis, data.ndim)
  indices = normalize_index(indices.cast(dtypes.int64), data.shape[axis])
  if reduction == "none": return data.scatter(axis, indices, updates)
  return data.scatter_reduce(axis, indices, updates, _SCATTER_REDUCE[reduction])

@op("ScatterND")
def scatter_nd(data: Tensor, indices: Tensor, updates: Tensor, reduction: str = "none") -> Tensor:
  indices = indices.cast(dtypes.int64)
  depth = indices.shape[-1]
  indexed, tail = data.shape[:depth], data.shape[depth:]
  n_tail, n_updates = sprod(tail), sprod(indices.shape[:-1])
  target = data.reshape(sprod(indexed), n_tail)
  flat = _linear_index(indices, indexed).reshape(n_updates, 1).expand(n_updates, n_tail)
  source = updates.reshape(n_updates, n_tail)
  if reduction == "none": out = target.scatter(0, flat, source)
  else: out = target.scatter_reduce(0, flat, source, _SCATTER_REDUCE[reduction])
  return out.reshape(data.shape)

@op("Expand")
def expand(x: Tensor, shape_: Tensor) -> Tensor:
  target = ints(shape_)
  rank = max(len(target), x.ndim)
  dims = [1] * (rank - x.ndim) + list(x.shape)
  target = [1] * (rank - len(target)) + target
  return x.reshape(dims).expand([t if d == 1 else d for d, t in zip(dims, target)])

@op("Tile")
def tile(x: Tensor, repeats: Tensor) -> Tensor: return x.repeat(ints(repeats))

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}

@op("Pad")
def pad(data: Tensor, pads=None, constant_value=None, axes=None, mode: str = "constant", value: float = 0.0) -> Tensor:
  pads = ints(pads)
  axes = [axis_of(a, data.ndim) for a in ints(axes)] if axes is not None else list(range(data.ndim))
  fill = scalar(constant_value) if constant_value is not None else value
  pairs = [(0, 0)] * data.ndim
  for i, axis in enumerate(axes): pairs[axis] = (pads[i], pads[i + len(axes)])
  # negative pads crop
  data = data.shrink(tuple((-min(b, 0), d + min(e, 0)) for (b, e), d in zip(pairs, data.shape)))
  pairs = [(max(b, 0), max(e, 0)) for b, e in pairs]
  if mode not in _PAD_MODES: raise NotImplementedError(f"mode={mode!r}")
  if not any(b or e for b, e in pairs): return data
  if mode == "constant": return data.pad(tuple(pairs), value=fill)
  return data.pad(tuple(pairs), mode=_PAD_MODES[mode])

@op("Range")
def range_(start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
  first, last, step = scalar(start), scalar(limit), scalar(delta)
  if any(isinstance(v, UOp) for v in (first, last, step)): return symbolic_arange(first, last, step, start.dtype)
  count = max(math.ceil((last - first) / step), 0)
  if count == 0: return full((0,), 0, start.dtype)
  return (Tensor.arange(count, dtype=start.dtype) * step + first).cast(start.dtype)

@op("Where")
def where(condition: Tensor, x: Tensor, y: Tensor) -> Tensor: return condition.where(x, y)

@op("Dropout")
def dropout(data: Tensor, ratio=None, training_mode=None, seed: int | None = None, is_test: int = 0):
  """Inference (the default): the data unchanged and an all-true mask. Training mode keeps each element with
  probability 1 - ratio (kiln's generator), scaled by 1 / (1 - ratio)."""
  rate = (scalar(ratio) if isinstance(ratio, Tensor) else ratio) if ratio is not None else 0.5
  if training_mode is None or not scalar(training_mode) or rate == 0: return data, full(data.shape, True, dtypes.bool)
  if seed is not None: Tensor.manual_seed(int(seed))
  keep = Tensor.rand(*data.shape) >= rate
  return keep.where(data / (1 - rate), 0).cast(data.dtype), keep

@op("DepthToSpace")
def depth_to_space(x: Tensor, blocksize: int = 1, mode: str = "DCR") -> Tensor:
  n, c, h, w = x.shape
  b = blocksize
  if mode == "DCR": y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
  else: y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
  return y.reshape(n, c // (b * b), h * b, w * b)

@op("SpaceToDepth")
def space_to_depth(x: Tensor, blocksize: int = 1) -> Tensor:
  n, c, h, w = x.shape
  b = blocksize
  y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
  return y.reshape(n, c * b * b, h // b, w // b)

@op("Trilu")
def trilu(x: Tensor, k=None, upper: int = 1) -> Tensor:
  diagonal = scalar(k) if k is not None else 0
  if 0 in x.shape: return x
  if any(isinstance(d, UOp) for d in x.shape[-2:]):   # (a causal mask over a symbolic length)
    rows, cols = arange_to(x.shape[-2]).reshape(-1, 1), arange_to(x.shape[-1]).reshape(1, -1)
    keep = (cols - rows >= diagonal) if upper else (cols - rows <= diagonal)
    return keep.where(x, 0).cast(x.dtype)
  return x.triu(diagonal) if upper else x.tril(diagonal)

@op("OneHot")
def one_hot(indices: Tensor, depth: Tensor, values: Tensor, axis: int = -1) -> Tensor:
  count = int(scalar(depth))
  rank = indices.ndim + 1
  axis = axis_of(axis, rank)
  index = normalize_index(indices.cast(dtypes.int64), count).unsqueeze(axis)
  positions = Tensor.arange(count, dtype=dtypes.int64).reshape([-1 if i == axis else 1 for i in range(rank)])
  return (index == positions).where(values[1], values[0])

@op("EyeLike")
def eye_like(x: Tensor, dtype: int | None = None, k: int = 0) -> Tensor:
  rows, cols = x.shape
  mask = Tensor.arange(rows).reshape(rows, 1) + k == Tensor.arange(cols).reshape(1, cols)
  return mask.cast(dtype_of_onnx(dtype) if dtype is not None else x.dtype)

@op("Compress")
def compress(x: Tensor, condition: Tensor, axis: int | None = None) -> Tensor:
  keep = np.nonzero(condition.numpy())[0]
  if axis is None: x, axis = x.reshape(-1), 0
  axis = axis_of(axis, x.ndim)
  keep = keep[keep < x.shape[axis]]
  if len(keep) == 0: return full([0 if i == axis else d for i, d in enumerate(x.shape)], 0, x.dtype)
  return x[(slice(None),) * axis + (Tensor(keep.astype(np.int64)),)]

@op("NonZero")
def non_zero(x: Tensor) -> Tensor:
  return Tensor(np.array(np.nonzero(x.numpy()), dtype=np.int64).reshape(x.ndim, -1))

@op("ReverseSequence")
def reverse_sequence(x: Tensor, sequence_lens: Tensor, batch_axis: int = 1, time_axis: int = 0) -> Tensor:
  lengths = ints(sequence_lens)
  steps, batch = x.shape[time_axis], x.shape[batch_axis]
  index = np.tile(np.arange(steps)[:, None], (1, batch))
  for b, length in enumerate(lengths): index[:length, b] = index[:length, b][::-1]
  if time_axis != 0: index = index.T
  shape = [1] * x.ndim
  shape[time_axis], shape[batch_axis] = steps, batch
  return x.gather(time_axis, Tensor(index.reshape(shape).astype(np.int64)).expand(x.shape))

@op("Unique")
def unique(x: Tensor, axis: int | None = None, sorted: int = 1):  # noqa: A002
  values = x.numpy()
  uniques, first, inverse, counts = np.unique(values, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis)
  if not sorted:
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    uniques, first, counts = np.take(uniques, order, axis=axis or 0), first[order], counts[order]
    inverse = rank[inverse]
  to_int = lambda a: Tensor(np.asarray(a, dtype=np.int64).reshape(-1))
  return Tensor(uniques, dtype=x.dtype), to_int(first), to_int(inverse), to_int(counts)

@op("CenterCropPad")
def center_crop_pad(x: Tensor, shape_: Tensor, axes=None) -> Tensor:
  target = ints(shape_)
  axes = [axis_of(a, x.ndim) for a in axes] if axes is not None else list(range(x.ndim))
  for axis, size in zip(axes, target):
    current = x.shape[axis]
    if size < current:
      start = (current - size) // 2
      x = x.shrink(tuple((start, start + size) if i == axis else None for i in range(x.ndim)))
    elif size > current:
      before = (size - current) // 2
      x = x.pad(tuple((before, size - current - before) if i == axis else (0, 0) for i in range(x.ndim)))
  return x

# ---- reductions

def _empty_reduction_value(kind: str, dtype: DType):
  if kind in ("max",): return -math.inf if dtypes.is_float(dtype) else dtypes.min(dtype)
  if kind in ("min",): return math.inf if dtypes.is_float(dtype) else dtypes.max(dtype)
  if kind in ("prod",): return 1
  if kind in ("logsum", "logsumexp"): return -math.inf
  return 0

def _mean(x: Tensor, axes: tuple, keep: bool) -> Tensor:
  """A mean; over a symbolic size, the sum divided by that size read at each call (onnx_symbolic.py)."""
  count = sprod([x.shape[a] for a in axes])
  if not isinstance(count, UOp): return x.mean(axes, keepdim=keep)
  total = x.sum(axes, keepdim=keep)
  return total / sizes_tensor(sint_array([count]).reshape(())).cast(total.dtype)

_REDUCERS: dict[str, Callable[[Tensor, tuple, bool], Tensor]] = {
  "sum": lambda x, axes, keep: x.sum(axes, keepdim=keep),
  "mean": _mean,
  "max": lambda x, axes, keep: x.max(axes, keepdim=keep),
  "min": lambda x, axes, keep: x.min(axes, keepdim=keep),
  "prod": lambda x, axes, keep: x.prod(axes, keepdim=keep),
  "l1": lambda x, axes, keep: x.abs().sum(axes, keepdim=keep),
  "l2": lambda x, axes, keep: (x * x).sum(axes, keepdim=keep).sqrt(),
  "logsum": lambda x, axes, keep: x.sum(axes, keepdim=keep).log(),
  "logsumexp": lambda x, axes, keep: x.logsumexp(axes, keepdim=keep),
  "sumsquare": lambda x, axes, keep: (x * x).sum(axes, keepdim=keep),
}
_NOOP = {"l1": lambda x: x.abs(), "l2": lambda x: x.abs(), "sumsquare": lambda x: x * x, "logsum": lambda x: x.log(),
         "logsumexp": lambda x: x}

def _reduction(kind: str):
  def reduce(data: Tensor, axes=None, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Tensor:
    axes = ints(axes)
    if not axes:
      if noop_with_empty_axes: return _NOOP.get(kind, lambda x: x)(data)
      axes = list(range(data.ndim))
    axes = tuple(sorted({axis_of(a, data.ndim) for a in axes}))
    if any(data.shape[a] == 0 for a in axes):
      dims = [1 if i in axes else d for i, d in enumerate(data.shape) if keepdims or i not in axes]
      return full(dims, _empty_reduction_value(kind, data.dtype), data.dtype)
    source = data.cast(dtypes.float32) if kind in ("l2", "logsum", "logsumexp", "mean") and not is_float(data) else data
    return _REDUCERS[kind](source, axes, bool(keepdims)).cast(data.dtype)
  return reduce

for _kind in _REDUCERS:
  OPS["Reduce" + {"l1": "L1", "l2": "L2", "logsum": "LogSum", "logsumexp": "LogSumExp",
                  "sumsquare": "SumSquare"}.get(_kind, _kind.capitalize())] = _reduction(_kind)

def _arg_extreme(largest: bool):
  def arg(data: Tensor, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Tensor:
    axis = axis_of(axis, data.ndim)
    source = data.flip(axis) if select_last_index else data
    index = source.argmax(axis, keepdim=bool(keepdims)) if largest else source.argmin(axis, keepdim=bool(keepdims))
    if select_last_index: index = data.shape[axis] - 1 - index
    return index.cast(dtypes.int64)
  return arg

OPS["ArgMax"], OPS["ArgMin"] = _arg_extreme(True), _arg_extreme(False)

@op("TopK")
def top_k(x: Tensor, k=None, axis: int = -1, largest: int = 1, sorted: int = 1):  # noqa: A002
  count = int(scalar(k))
  values, indices = x.topk(count, axis_of(axis, x.ndim), largest=bool(largest), sorted_=True)
  return values, indices.cast(dtypes.int64)

@op("CumSum")
def cum_sum(x: Tensor, axis: Tensor, exclusive: int = 0, reverse: int = 0) -> Tensor:
  dim = axis_of(int(scalar(axis)), x.ndim)
  source = x.flip(dim) if reverse else x
  total = source.cumsum(dim).cast(x.dtype)
  if exclusive: total = total - source
  return total.flip(dim) if reverse else total

# ---- matrix products

@op("MatMul")
def matmul(a: Tensor, b: Tensor) -> Tensor: return a.matmul(b)

@op("Gemm")
def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,
         transB: int = 0, broadcast: int = 0) -> Tensor:
  result = (a.T if transA else a).matmul(b.T if transB else b)
  if alpha != 1.0: result = result * alpha
  if c is not None: result = result + (c * beta if beta != 1.0 else c)
  return result

@op("MatMulInteger")
def matmul_integer(a: Tensor, b: Tensor, a_zero_point=None, b_zero_point=None) -> Tensor:
  a32, b32 = a.cast(dtypes.int32), b.cast(dtypes.int32)
  if a_zero_point is not None:
    zero = a_zero_point.cast(dtypes.int32)
    a32 = a32 - (zero.reshape(-1, 1) if zero.ndim == 1 and zero.shape[0] > 1 else zero)
  if b_zero_point is not None: b32 = b32 - b_zero_point.cast(dtypes.int32)
  return a32.matmul(b32)

@op("Einsum")
def einsum(*xs: Tensor, equation: str = "") -> Tensor: return Tensor.einsum(equation.replace(" ", ""), *xs)

@op("Det")
def det(x: Tensor) -> Tensor:
  return Tensor(np.linalg.det(x.numpy()).astype(x.numpy().dtype))

# ---- losses

@op("NegativeLogLikelihoodLoss")
def nll_loss(x: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
             reduction: str = "mean") -> Tensor:
  target = target.cast(dtypes.int64)
  ignored = (target == ignore_index) if ignore_index is not None else None
  safe = ignored.where(0, target) if ignored is not None else target
  picked = -x.gather(1, safe.unsqueeze(1)).squeeze(1)
  weights = weight[safe] if weight is not None else full(safe.shape, 1, x.dtype)
  if ignored is not None: weights = ignored.where(0, weights)
  loss = picked * weights
  if reduction == "none": return loss
  if reduction == "sum": return loss.sum()
  if reduction != "mean": raise NotImplementedError(f"reduction={reduction!r}")
  return loss.sum() / weights.sum()

@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(scores: Tensor, labels: Tensor, weights: Tensor | None = None,
                          ignore_index: int | None = None, reduction: str = "mean"):
  log_prob = scores.log_softmax(1)
  return nll_loss(log_prob, labels, weights, ignore_index, reduction), log_prob

# ---- quantization

def _per_axis(param: Tensor, x: Tensor, axis: int, block_size: int) -> Tensor:
  """A scale or zero point broadcast against x: a scalar, one value per `axis` slice, or one per block of it."""
  if param.ndim == 0 or param.numel() == 1: return param.reshape(())
  axis = axis_of(axis, x.ndim)
  if block_size: return param.repeat_interleave(block_size, axis).shrink(
    tuple((0, d) for d in x.shape))
  return param.reshape([-1 if i == axis else 1 for i in range(x.ndim)])

@op("QuantizeLinear")
def quantize_linear(x: Tensor, y_scale: Tensor, y_zero_point: Tensor | None = None, axis: int = 1,
                    block_size: int = 0, output_dtype: int = 0, saturate: int = 1, precision: int = 0) -> Tensor:
  held = held_type(y_zero_point) if y_zero_point is not None else output_dtype if output_dtype in HELD_TYPES else None
  dtype = (y_zero_point.dtype if y_zero_point is not None else
           dtype_of_onnx(output_dtype) if output_dtype else dtypes.uint8)
  scale = _per_axis(y_scale, x, axis, block_size)
  value = x.cast(dtypes.float32) / scale.cast(dtypes.float32)
  if held in EMULATED_FLOATS:  # the zero point (0 for float types) still turns -0 into +0
    if y_zero_point is not None: value = value + _per_axis(y_zero_point, x, axis, block_size).cast(dtypes.float32)
    return cast(value, to=held, saturate=saturate)
  if dtypes.is_float(dtype): return cast_to(value, dtype, saturate)
  value = value.round()
  if y_zero_point is not None: value = value + _per_axis(y_zero_point, x, axis, block_size).cast(dtypes.float32)
  low, high = _INT4_RANGE[held] if held in _INT4_RANGE else (dtypes.min(dtype), dtypes.max(dtype))
  return mark_type(value.clip(low, high).cast(dtype), held) if held else value.clip(low, high).cast(dtype)

@op("DequantizeLinear")
def dequantize_linear(x: Tensor, x_scale: Tensor, x_zero_point: Tensor | None = None, axis: int = 1,
                      block_size: int = 0, output_dtype: int = 0) -> Tensor:
  scale = _per_axis(x_scale, x, axis, block_size)
  value = x.cast(dtypes.float32)
  if x_zero_point is not None: value = value - _per_axis(x_zero_point, x, axis, block_size).cast(dtypes.float32)
  return (value * scale.cast(dtypes.float32)).cast(dtype_of_onnx(output_dtype) if output_dtype else x_scale.dtype)

@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(x: Tensor):
  low, high = x.min().minimum(0), x.max().maximum(0)
  scale = (high - low) / 255
  zero_point = (-low / scale).round().clip(0, 255)
  quantized = ((x / scale).round() + zero_point).clip(0, 255).cast(dtypes.uint8)
  return quantized, scale, zero_point.cast(dtypes.uint8)

# ---- random generators (kiln's generator: values differ from numpy's, distributions match)

def _random_dtype(dtype: int | None, like: Tensor | None) -> DType:
  if dtype is not None: return dtype_of_onnx(dtype)
  return like.dtype if like is not None else dtypes.float32

@op("RandomUniform", "RandomUniformLike")
def random_uniform(like=None, dtype: int | None = None, high: float = 1.0, low: float = 0.0, seed: float | None = None,
                   shape=None) -> Tensor:
  if seed is not None: Tensor.manual_seed(int(seed))
  dims = tuple(shape) if shape is not None else like.shape
  return (Tensor.rand(*dims) * (high - low) + low).cast(_random_dtype(dtype, like))

@op("RandomNormal", "RandomNormalLike")
def random_normal(like=None, dtype: int | None = None, mean: float = 0.0, scale: float = 1.0,
                  seed: float | None = None, shape=None) -> Tensor:
  if seed is not None: Tensor.manual_seed(int(seed))
  dims = tuple(shape) if shape is not None else like.shape
  return (Tensor.randn(*dims) * scale + mean).cast(_random_dtype(dtype, like))

@op("Multinomial")
def multinomial(x: Tensor, dtype: int = 6, sample_size: int = 1, seed: float | None = None) -> Tensor:
  """sample_size class indices per row of unnormalized log-probabilities."""
  if seed is not None: Tensor.manual_seed(int(seed))
  return x.softmax(-1).multinomial(sample_size, replacement=True).cast(dtype_of_onnx(dtype))

# ---- sequences and optionals (Python lists; an empty optional is None)

@op("SequenceEmpty")
def sequence_empty(dtype: int = 1) -> list: return []
@op("SequenceConstruct")
def sequence_construct(*xs) -> list: return list(xs)
@op("SequenceLength")
def sequence_length(seq: list) -> Tensor: return Tensor(len(seq), dtype=dtypes.int64)
@op("SequenceAt")
def sequence_at(seq: list, position: Tensor): return seq[int(scalar(position))]

@op("SequenceInsert")
def sequence_insert(seq: list, value, position=None) -> list:
  out = list(seq)
  out.insert(len(out) if position is None else int(scalar(position)) % (len(out) + 1), value)
  return out

@op("SequenceErase")
def sequence_erase(seq: list, position=None) -> list:
  out = list(seq)
  del out[-1 if position is None else int(scalar(position))]
  return out

@op("SplitToSequence")
def split_to_sequence(x: Tensor, split=None, axis: int = 0, keepdims: int = 1) -> list:
  axis = axis_of(axis, x.ndim)
  if split is None:
    parts = [x[(slice(None),) * axis + (i,)] for i in range(x.shape[axis])]
    return parts if not keepdims else [p.unsqueeze(axis) for p in parts]
  sizes = ints(split)
  if len(sizes) == 1 and (not isinstance(split, Tensor) or split.ndim == 0):
    step = sizes[0]
    sizes = [min(step, x.shape[axis] - i) for i in range(0, x.shape[axis], step)]
  return list(x.split(sizes, axis))

@op("ConcatFromSequence")
def concat_from_sequence(seq: list, axis: int = 0, new_axis: int = 0) -> Tensor:
  if new_axis: return seq[0].stack(*seq[1:], dim=axis_of(axis, seq[0].ndim + 1))
  return concat(*seq, axis=axis)

@op("Optional")
def optional(value=None, type=None):  # noqa: A002
  return value

@op("OptionalHasElement")
def optional_has_element(value=None) -> Tensor: return Tensor(value is not None, dtype=dtypes.bool)

@op("OptionalGetElement")
def optional_get_element(value):
  if value is None: raise ValueError("OptionalGetElement of an empty optional")
  return value

# ---- control flow

@op("If")
def if_(condition: Tensor, then_branch=None, else_branch=None, ctx=None):
  outputs = ctx.run_graph(then_branch if scalar(condition) else else_branch, [])
  return tuple(outputs)

@op("Loop")
def loop(max_trip_count=None, condition=None, *carried, body=None, ctx=None):
  """for i in range(M) while cond: (cond, carried..., scan_outputs...) = body(i, cond, carried...)."""
  trips = int(scalar(max_trip_count)) if max_trip_count is not None else None
  keep_going = bool(scalar(condition)) if condition is not None else True
  state, scans, i = list(carried), None, 0
  while keep_going and (trips is None or i < trips):
    outputs = ctx.run_graph(body, [Tensor(i, dtype=dtypes.int64), Tensor(keep_going, dtype=dtypes.bool), *state])
    keep_going = bool(scalar(outputs[0]))
    state = outputs[1:1 + len(state)]
    step_scans = outputs[1 + len(state):]
    if scans is None: scans = [[] for _ in step_scans]
    for collected, value in zip(scans, step_scans): collected.append(value)
    i += 1
  n_scans = len(body.output) - 1 - len(state)
  if scans is None: scans = [[] for _ in range(n_scans)]
  stacked = [s[0].stack(*s[1:]) if s else Tensor.zeros(0) for s in scans]
  return tuple(state + stacked)

@op("Scan")
def scan(*inputs, body=None, num_scan_inputs: int = 0, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None, directions=None, ctx=None):
  if ctx.opset < 9:  # opset 8: inputs are (sequence_lens, state..., scans...) with a leading batch axis on every one
    sequence_lens, batched = inputs[0], inputs[1:]
    if sequence_lens is not None: raise NotImplementedError("Scan-8 with sequence_lens")
    per_batch = [_scan(list(x[b] for x in batched), body, num_scan_inputs, None, directions, None, None, ctx)
                 for b in range(batched[0].shape[0])]
    return tuple(outs[0].stack(*outs[1:]) for outs in zip(*per_batch))
  return _scan(list(inputs), body, num_scan_inputs, scan_input_axes, scan_input_directions, scan_output_axes,
               scan_output_directions, ctx)

def _scan(inputs: list, body, num_scan_inputs, scan_input_axes, scan_input_directions, scan_output_axes,
          scan_output_directions, ctx) -> tuple:
  n_state = len(inputs) - num_scan_inputs
  state, sequences = list(inputs[:n_state]), list(inputs[n_state:])
  in_axes = [axis_of(a, s.ndim) for a, s in zip(scan_input_axes or [0] * num_scan_inputs, sequences)]
  in_dirs = scan_input_directions or [0] * num_scan_inputs
  steps = sequences[0].shape[in_axes[0]]
  collected: list[list[Tensor]] = []
  for t in range(steps):
    slices = [s[(slice(None),) * a + ((steps - 1 - t) if d else t,)] for s, a, d in zip(sequences, in_axes, in_dirs)]
    outputs = ctx.run_graph(body, state + slices)
    state = outputs[:n_state]
    if not collected: collected = [[] for _ in outputs[n_state:]]
    for c, value in zip(collected, outputs[n_state:]): c.append(value)
  out_dirs = scan_output_directions or [0] * len(collected)
  out_axes = scan_output_axes or [0] * len(collected)
  results = []
  for c, d, a in zip(collected, out_dirs, out_axes):
    if d: c = c[::-1]
    results.append(c[0].stack(*c[1:], dim=axis_of(a, c[0].ndim + 1)))
  return tuple(state + results)

@op("SequenceMap")
def sequence_map(seq: list, *others, body=None, ctx=None):
  outputs: list[list] | None = None
  for i, item in enumerate(seq):
    extra = [o[i] if isinstance(o, list) else o for o in others]
    results = ctx.run_graph(body, [item, *extra])
    if outputs is None: outputs = [[] for _ in results]
    for collected, value in zip(outputs, results): collected.append(value)
  return tuple(outputs or [[] for _ in body.output])

# noqa: E402,F401 below: these modules register their operators in OPS
from kiln.frontend import onnx_domains, onnx_host, onnx_nn, onnx_rnn, onnx_signal  # noqa: E402,F401
