"""Shape arithmetic on the host: a node whose inputs all have host copies (onnx_proto.remember) and that is one of
the small integer ops exported models build shapes with (Shape -> Gather -> Concat -> Reshape) is computed with
numpy, and its outputs are constants with host copies too. The ops keep ONNX's semantics and output dtypes; anything
else (a large input, an attribute not handled here, an error) falls back to the kiln op."""
from __future__ import annotations
from typing import Callable
import numpy as np
from kiln.tensor import Tensor
from kiln.frontend.onnx_proto import HOST_LIMIT, constant_tensor, host_value, remember
from kiln.frontend import onnx_symbolic as symbolic
from kiln.uop.ops import UOp

def _axes(axes, attr_axes) -> list[int] | None:
  chosen = axes if axes is not None else attr_axes
  return None if chosen is None else [int(a) for a in np.asarray(chosen).reshape(-1)]

def _unsqueeze(x, axes=None, *, attr_axes=None):
  axes = _axes(axes, attr_axes)
  rank = x.ndim + len(axes)
  for a in sorted(a + rank if a < 0 else a for a in axes): x = np.expand_dims(x, a)
  return x

def _squeeze(x, axes=None, *, attr_axes=None):
  axes = _axes(axes, attr_axes)
  return np.squeeze(x) if axes is None else np.squeeze(x, tuple(a + x.ndim if a < 0 else a for a in axes))

def _slice(x, starts, ends, axes=None, steps=None):
  index = [slice(None)] * x.ndim
  axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
  steps = [1] * len(starts) if steps is None else steps
  for a, start, end, step in zip(axes, starts, ends, steps): index[a] = slice(int(start), int(end), int(step))
  return x[tuple(index)]

def _div(a, b):
  if np.issubdtype(a.dtype, np.integer): return (np.trunc(a / b)).astype(a.dtype)
  return (a / b).astype(a.dtype)

def _reduce(fn):
  def reduce(x, axes=None, *, keepdims=1, noop_with_empty_axes=0, attr_axes=None):
    chosen = _axes(axes, attr_axes)
    if not chosen:
      if noop_with_empty_axes: return x
      chosen = list(range(x.ndim))
    return fn(x, axis=tuple(chosen), keepdims=bool(keepdims)).astype(x.dtype)
  return reduce

def _cast(x, *, to, saturate=1):
  if to not in (1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13): raise NotImplementedError
  from onnx import helper
  return x.astype(helper.tensor_dtype_to_np_dtype(to))

def _range(start, limit, delta):
  first, last, step = start.item(), limit.item(), delta.item()
  count = max(int(np.ceil((last - first) / step)), 0)
  return (np.arange(count) * step + first).astype(start.dtype)

def _constant_of_shape(shape, *, value=None):
  fill = host_value(value) if value is not None else np.zeros(1, np.float32)
  if fill is None: raise NotImplementedError
  return np.full([int(d) for d in shape], fill.reshape(-1)[0], dtype=fill.dtype)

def _gather(data, indices, *, axis=0):
  return np.take(data, np.where(indices < 0, indices + data.shape[axis], indices), axis=axis)

def _reshape(data, shape, *, allowzero=0):
  target = [data.shape[i] if d == 0 and not allowzero else d if isinstance(d, UOp) else int(d)
            for i, d in enumerate(shape)]
  return data.reshape(target)

def _expand(x, shape):
  return x * np.ones([int(d) for d in shape], dtype=x.dtype)

FOLDERS: dict[str, Callable] = {
  "Identity": lambda x: x, "Cast": _cast, "CastLike": lambda x, like, *, saturate=1: x.astype(like.dtype),
  "Concat": lambda *xs, axis: np.concatenate(xs, axis), "Gather": _gather, "Unsqueeze": _unsqueeze,
  "Squeeze": _squeeze, "Slice": _slice, "Reshape": _reshape, "Expand": _expand, "Range": _range,
  "ConstantOfShape": _constant_of_shape, "Transpose": lambda x, *, perm=None: np.transpose(x, perm),
  "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div, "Neg": np.negative, "Abs": np.abs,
  "Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
  "GreaterOrEqual": np.greater_equal, "Not": np.logical_not, "And": np.logical_and, "Or": np.logical_or,
  "Where": np.where, "Max": lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs)),
  "Min": lambda *xs: np.minimum.reduce(np.broadcast_arrays(*xs)),
  "ReduceProd": _reduce(np.prod), "ReduceSum": _reduce(np.sum), "ReduceMax": _reduce(np.max),
  "ReduceMin": _reduce(np.min),
}
def _cast_sizes(x, *, to, saturate=1):
  if to not in (6, 7): raise NotImplementedError   # sizes stay sizes as int32/int64, nothing else is sure
  return x

# where an input holds symbolic sizes (onnx_symbolic.py): comparisons and divisions decided for every size or not at
# all, and casts between the integer types that sizes are
SIZE_FOLDERS: dict[str, Callable] = {
  "Equal": symbolic.equal, "Less": symbolic.less, "LessOrEqual": symbolic.less_equal, "Greater": symbolic.greater,
  "GreaterOrEqual": symbolic.greater_equal, "Div": symbolic.divide, "Cast": _cast_sizes,
  "CastLike": lambda x, like, *, saturate=1: _cast_sizes(x, to=7 if like.dtype in (np.int64, object) else 0),
}
_AXES_ATTRIBUTE = {"Unsqueeze", "Squeeze", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"}

def fold(op_type: str, inputs: list, attrs: dict) -> list[Tensor] | None:
  """The node's outputs computed on the host, or None where it is not foldable."""
  if op_type not in FOLDERS: return None
  arrays = []
  for value in inputs:
    if value is None: arrays.append(None)
    elif isinstance(value, Tensor):
      known = host_value(value)
      if known is None: return None
      arrays.append(known)
    else: return None
  if any(a is not None and a.size > HOST_LIMIT for a in arrays): return None
  keywords = dict(attrs)
  if op_type in _AXES_ATTRIBUTE and "axes" in keywords: keywords["attr_axes"] = keywords.pop("axes")
  if op_type != "ConstantOfShape" and any(isinstance(v, Tensor) for v in keywords.values()): return None
  while arrays and arrays[-1] is None: arrays.pop()
  sizes = any(a is not None and a.dtype == object for a in arrays)
  folder = SIZE_FOLDERS.get(op_type, FOLDERS[op_type]) if sizes else FOLDERS[op_type]
  try:
    result = np.asarray(folder(*arrays, **keywords))
  except Exception:  # an unusual attribute or input: the kiln op decides (and reports)
    return None
  if result.size > HOST_LIMIT: return None
  if result.dtype == object:
    if not symbolic.is_sint_array(result): return None   # (all ints, a slice of the plain sizes: int64 below)
    result = symbolic.sint_array(result.reshape(-1)).reshape(result.shape)
    if result.dtype == object: return [remember(symbolic.sizes_tensor(result), result)]
  if result.dtype == np.float16: return None
  return [remember(constant_tensor(np.array(result, order="C")), result)]
