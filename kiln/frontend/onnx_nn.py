"""The ONNX neural-network operators as kiln Tensor ops: conv, pools, normalizations, resize, recurrent layers."""
from __future__ import annotations
import math
import numpy as np
from kiln.dtype import dtypes
from kiln.tensor import Tensor
from kiln.uop.ops import UOp
from kiln.uop.sint import sint_min, sint_max, ssimplify
from kiln.frontend.onnx_ops import op, ints, scalar, axis_of, is_float, move_axis, _mean
from kiln.frontend.onnx_proto import dtype_of_onnx, host_value

# ---- padding shared by conv and pools

def _pads(auto_pad: str, pads, sizes, kernel, strides, dilations) -> tuple[list[int], list[int]]:
  """ONNX pads/auto_pad -> (begins, ends) per spatial axis."""
  n = len(sizes)
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
      total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
      small, large = total // 2, total - total // 2
      begins.append(small if auto_pad == "SAME_UPPER" else large)
      ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins, ends
  if auto_pad == "VALID" or pads is None: return [0] * n, [0] * n
  if auto_pad != "NOTSET": raise NotImplementedError(f"auto_pad={auto_pad!r}")
  return list(pads[:n]), list(pads[n:])

def _flat_pads(begins, ends) -> tuple[int, ...]:
  """Per-axis (begin, end) -> kiln's flat padding, last axis first."""
  return tuple(v for b, e in reversed(list(zip(begins, ends))) for v in (b, e))

def _spatial_pad(x: Tensor, begins, ends, value: float = 0.0) -> Tensor:
  n = len(begins)
  if not any(begins) and not any(ends): return x
  return x.pad(((0, 0),) * (x.ndim - n) + tuple(zip(begins, ends)), value=value)

@op("Conv")
def conv(x: Tensor, w: Tensor, b: Tensor | None = None, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
         kernel_shape=None, pads=None, strides=None) -> Tensor:
  n = w.ndim - 2
  kernel = list(w.shape[2:])
  strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
  begins, ends = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
  if (group == 1 and any(st > 1 for st in strides) and all(d == 1 for d in dilations)
      and all(k % st == 0 for k, st in zip(kernel, strides))):
    return _space_to_depth_conv(_spatial_pad(x, begins, ends), w, b, strides)
  return x.conv2d(w, b, groups=group, stride=tuple(strides), dilation=tuple(dilations),
                  padding=_flat_pads(begins, ends))

def _space_to_depth_conv(x: Tensor, w: Tensor, b: Tensor | None, strides: list[int]) -> Tensor:
  """A conv whose kernel is a whole number of strides on every axis (a filter bank with stride = kernel / m, a
  patch embedding with stride = kernel): the input cut into stride-sized blocks moved into channels, then a
  stride-1 conv over the blocks with m taps an axis, the weight cut the same way. (An already padded input.)"""
  n, kernel = w.ndim - 2, list(w.shape[2:])
  batch, channels = x.shape[0], x.shape[1]
  taps = [k // s for k, s in zip(kernel, strides)]
  blocks = [(size - k) // s + m for size, k, s, m in zip(x.shape[2:], kernel, strides, taps)]
  x = x.shrink((None, None) + tuple((0, p * s) for p, s in zip(blocks, strides)))
  # (batch, c, p0, s0, p1, s1, ...) -> (batch, c, s0, s1, ..., p0, p1, ...)
  x = x.reshape(batch, channels, *[v for p, s in zip(blocks, strides) for v in (p, s)])
  x = x.permute(0, 1, *[3 + 2 * i for i in range(n)], *[2 + 2 * i for i in range(n)])
  x = x.reshape(batch, channels * math.prod(strides), *blocks)
  # (out, c, m0*s0, m1*s1, ...) -> (out, c, s0, s1, ..., m0, m1, ...), the input's channel order
  w = w.reshape(w.shape[0], channels, *[v for m, s in zip(taps, strides) for v in (m, s)])
  w = w.permute(0, 1, *[3 + 2 * i for i in range(n)], *[2 + 2 * i for i in range(n)])
  return x.conv2d(w.reshape(w.shape[0], channels * math.prod(strides), *taps), b)

@op("ConvInteger")
def conv_integer(x: Tensor, w: Tensor, x_zero_point=None, w_zero_point=None, auto_pad: str = "NOTSET",
                 dilations=None, group: int = 1, kernel_shape=None, pads=None, strides=None) -> Tensor:
  x32, w32 = x.cast(dtypes.int32), w.cast(dtypes.int32)
  if x_zero_point is not None: x32 = x32 - x_zero_point.cast(dtypes.int32)
  if w_zero_point is not None:
    zero = w_zero_point.cast(dtypes.int32)
    w32 = w32 - (zero.reshape(-1, *[1] * (w.ndim - 1)) if zero.ndim == 1 else zero)
  n = w.ndim - 2
  strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
  begins, ends = _pads(auto_pad, pads, x.shape[2:], list(w.shape[2:]), strides, dilations)
  # padding must add the zero point's value (zero after the shift), so shift before padding
  return x32.conv2d(w32, groups=group, stride=tuple(strides), dilation=tuple(dilations),
                    padding=_flat_pads(begins, ends)).cast(dtypes.int32)

def _unpatchify(x: Tensor, w: Tensor) -> Tensor:
  """A transposed conv whose stride equals its kernel (windows that neither overlap nor leave gaps, as a 2x2
  stride-2 upsampling head has): a 1x1 conv to every output channel and kernel offset, each input pixel's results
  then laid out as its output patch. Unlike the general path it multiplies no inserted zeros."""
  n, kernel = w.ndim - 2, list(w.shape[2:])
  batch, sizes, outputs = x.shape[0], list(x.shape[2:]), w.shape[1]
  # (in, out, *k) -> (out * prod(k), in, 1...): one 1x1 filter per output channel and kernel offset
  filters = w.permute(1, *range(2, w.ndim), 0).reshape(outputs * math.prod(kernel), w.shape[0], *[1] * n)
  y = x.conv2d(filters).contiguous().reshape(batch, outputs, *kernel, *sizes)   # the conv alone, then a copy
  # (batch, out, *k, *sizes) -> (batch, out, size0, k0, size1, k1, ...)
  order = [0, 1] + [axis for i in range(n) for axis in (2 + n + i, 2 + i)]
  return y.permute(*order).reshape(batch, outputs, *[s * k for s, k in zip(sizes, kernel)])

@op("ConvTranspose")
def conv_transpose(x: Tensor, w: Tensor, b: Tensor | None = None, auto_pad: str = "NOTSET", dilations=None,
                   group: int = 1, kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None) -> Tensor:
  n = w.ndim - 2
  kernel = list(w.shape[2:])
  strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
  extra = list(output_padding or [0] * n)
  sizes = x.shape[2:]
  natural = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(sizes, kernel, strides, dilations)]
  if output_shape is not None:
    wanted = list(output_shape)[-n:]
    totals = [nat + e - o for nat, e, o in zip(natural, extra, wanted)]
    # half the padding before (the larger half after, unless SAME_LOWER); growing (a negative total) adds zeros after
    upper = auto_pad != "SAME_LOWER"
    begins = [int(t / 2) if upper else t - int(t / 2) for t in totals]
    ends = [t - bgn for t, bgn in zip(totals, begins)]
  elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    totals = [nat + e - i * s for nat, e, i, s in zip(natural, extra, sizes, strides)]
    begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
    ends = [t - bgn for t, bgn in zip(totals, begins)]
  else:
    begins, ends = _pads(auto_pad, pads, sizes, kernel, strides, dilations)
  if group == 1 and strides == kernel and all(d == 1 for d in dilations): full_out = _unpatchify(x, w)
  else: full_out = x.conv_transpose2d(w, groups=group, stride=tuple(strides), dilation=tuple(dilations))
  # crop the pads, then grow by output_padding (rows no input reaches: zeros before the bias)
  ends = [e - p for e, p in zip(ends, extra)]
  crop = [(max(bg, 0), nat - max(e, 0)) for bg, e, nat in zip(begins, ends, natural)]
  out = full_out.shrink((None, None) + tuple(crop))
  out = _spatial_pad(out, [max(-bg, 0) for bg in begins], [max(-e, 0) for e in ends])
  if b is not None: out = out + b.reshape(1, -1, *[1] * n)
  return out

# ---- pools

def _pool_windows(x: Tensor, kernel, strides, dilations, auto_pad, pads, ceil_mode, fill) -> tuple[Tensor, list, list]:
  """Padded sliding windows (..., *out, *kernel), with the explicit pads and the extra end pads ceil_mode adds."""
  n = len(kernel)
  sizes = x.shape[x.ndim - n:]
  begins, ends = _pads(auto_pad, pads, sizes, kernel, strides, dilations)
  extra = [0] * n   # without ceil_mode the last window ends inside the padded input (so symbolic sizes need none)
  for axis, (size, k, s, d, bg, e) in enumerate(zip(sizes, kernel, strides, dilations, begins, ends)):
    if not ceil_mode: continue
    span, padded = (k - 1) * d + 1, size + bg + e
    out = -(-(padded - span) // s) + 1
    if (out - 1) * s >= size + bg: out -= 1
    extra[axis] = max(0, (out - 1) * s + span - padded)
  padded = _spatial_pad(x, begins, [e + x_ for e, x_ in zip(ends, extra)], fill)
  return padded._pool(tuple(kernel), tuple(strides), tuple(dilations)), begins, ends, extra

def _pool_args(x: Tensor, kernel_shape, strides, dilations):
  n = len(kernel_shape)
  return list(kernel_shape), list(strides or [1] * n), list(dilations or [1] * n)

@op("MaxPool")
def max_pool(x: Tensor, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None, kernel_shape=None, pads=None,
             storage_order: int = 0, strides=None, ctx=None):
  kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  n = len(kernel)
  fill = -math.inf if is_float(x) else dtypes.min(x.dtype)
  windows, begins, ends, extra = _pool_windows(x, kernel, strides, dilations, auto_pad, pads, ceil_mode, fill)
  reduce_axes = tuple(range(windows.ndim - n, windows.ndim))
  values = windows.max(reduce_axes)
  if ctx is None or ctx.n_outputs < 2: return values
  # indices: the flat position (over N, C, spatial) of each window's first maximum
  spatial = x.shape[2:]
  positions = np.arange(int(np.prod(spatial)), dtype=np.int64).reshape(spatial)
  if storage_order: positions = np.arange(int(np.prod(spatial)), dtype=np.int64).reshape(spatial[::-1]).T
  index_windows, *_ = _pool_windows(Tensor(positions).reshape(1, 1, *spatial), kernel, strides, dilations, auto_pad,
                                    pads, ceil_mode, -1)
  flat = windows.reshape(*windows.shape[:windows.ndim - n], -1)
  first = flat.argmax(-1, keepdim=True)
  index = index_windows.reshape(*index_windows.shape[:index_windows.ndim - n], -1)
  index = index.expand(*flat.shape).gather(-1, first).squeeze(-1)
  batch, channels = x.shape[0], x.shape[1]
  offsets = (Tensor.arange(batch * channels, dtype=dtypes.int64) * int(np.prod(spatial))).reshape(batch, channels,
                                                                                                *[1] * n)
  return values, index + offsets

@op("AveragePool")
def average_pool(x: Tensor, auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0, dilations=None,
                 kernel_shape=None, pads=None, strides=None) -> Tensor:
  kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  n = len(kernel)
  windows, begins, ends, extra = _pool_windows(x, kernel, strides, dilations, auto_pad, pads, ceil_mode, 0.0)
  reduce_axes = tuple(range(windows.ndim - n, windows.ndim))
  total = windows.sum(reduce_axes)
  # the divisor counts the input cells (and with count_include_pad the explicit pads, never ceil_mode's extra)
  ones = Tensor.ones(*x.shape[2:], dtype=x.dtype)
  if count_include_pad: ones = _spatial_pad(ones, begins, ends, 1.0)
  else: ones = _spatial_pad(ones, begins, ends, 0.0)
  counts = _spatial_pad(ones, [0] * n, extra, 0.0)._pool(tuple(kernel), tuple(strides), tuple(dilations))
  counts = counts.sum(tuple(range(counts.ndim - n, counts.ndim)))
  return (total / counts).cast(x.dtype)

@op("LpPool")
def lp_pool(x: Tensor, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None, kernel_shape=None, p: int = 2,
            pads=None, strides=None) -> Tensor:
  kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  n = len(kernel)
  windows, *_ = _pool_windows(x.abs().pow(p), kernel, strides, dilations, auto_pad, pads, ceil_mode, 0.0)
  return windows.sum(tuple(range(windows.ndim - n, windows.ndim))).pow(1.0 / p)

@op("GlobalAveragePool")
def global_average_pool(x: Tensor) -> Tensor: return _mean(x, tuple(range(2, x.ndim)), True)
@op("GlobalMaxPool")
def global_max_pool(x: Tensor) -> Tensor: return x.max(tuple(range(2, x.ndim)), keepdim=True)
@op("GlobalLpPool")
def global_lp_pool(x: Tensor, p: int = 2) -> Tensor:
  return x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p)

@op("MaxUnpool")
def max_unpool(x: Tensor, indices: Tensor, output_shape=None, kernel_shape=None, pads=None, strides=None) -> Tensor:
  n = len(kernel_shape)
  strides = list(strides or [1] * n)
  pads = list(pads or [0] * (2 * n))
  spatial = [(i - 1) * s + k - pads[j] - pads[j + n]
             for j, (i, s, k) in enumerate(zip(x.shape[2:], strides, kernel_shape))]
  shape = [x.shape[0], x.shape[1], *spatial]
  out = Tensor.zeros(int(np.prod(shape)), dtype=x.dtype)
  out = out.scatter(0, indices.cast(dtypes.int64).reshape(-1), x.reshape(-1)).reshape(shape)
  # indices address the default output shape; a larger output_shape pads after
  if output_shape is not None:
    out = _spatial_pad(out, [0] * n, [o - s for o, s in zip(ints(output_shape)[2:], spatial)])
  return out

# ---- normalizations

def _channel(param: Tensor, ndim: int) -> Tensor: return param.reshape(1, -1, *[1] * (ndim - 2))

@op("BatchNormalization")
def batch_norm(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, epsilon: float = 1e-5,
               momentum: float = 0.9, training_mode: int = 0, spatial: int = 1, ctx=None):
  if training_mode:
    axes = tuple(i for i in range(x.ndim) if i != 1)
    batch_mean, batch_var = x.mean(axes), x.var(axes, correction=0)
    y = (x - _channel(batch_mean, x.ndim)) / (_channel(batch_var, x.ndim) + epsilon).sqrt()
    y = y * _channel(scale, x.ndim) + _channel(bias, x.ndim)
    return y, mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)
  known = [host_value(t) for t in (scale, var)]
  if all(k is not None and k.dtype.kind == "f" for k in known):
    # statistics known on the host (initializers): the per-channel factor computed once here, not in every
    # element of every call's kernel (a sqrt and a division each: PP-OCR cls's conv input copies spent most of
    # their time there)
    factor = (known[0].astype(np.float64) / np.sqrt(known[1].astype(np.float64) + epsilon)).astype(known[0].dtype)
    return (x - _channel(mean, x.ndim)) * _channel(Tensor(factor, dtype=scale.dtype), x.ndim) + _channel(bias, x.ndim)
  invstd = (var + epsilon).rsqrt()
  return (x - _channel(mean, x.ndim)) * _channel(invstd * scale, x.ndim) + _channel(bias, x.ndim)

@op("InstanceNormalization")
def instance_norm(x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5) -> Tensor:
  axes = tuple(range(2, x.ndim))
  mean, var = x.mean(axes, keepdim=True), x.var(axes, keepdim=True, correction=0)
  return (x - mean) / (var + epsilon).sqrt() * _channel(scale, x.ndim) + _channel(bias, x.ndim)

@op("LayerNormalization")
def layer_norm(x: Tensor, scale: Tensor, bias: Tensor | None = None, axis: int = -1, epsilon: float = 1e-5,
               stash_type: int = 1):
  axis = axis_of(axis, x.ndim)
  axes = tuple(range(axis, x.ndim))
  source = x.cast(dtypes.float32) if stash_type == 1 else x
  mean = source.mean(axes, keepdim=True)
  invstd = ((source - mean) ** 2).mean(axes, keepdim=True).add(epsilon).rsqrt()
  y = ((source - mean) * invstd).cast(x.dtype) * scale
  if bias is not None: y = y + bias
  return y, mean, invstd

@op("RMSNormalization")
def rms_norm(x: Tensor, scale: Tensor, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Tensor:
  axes = tuple(range(axis_of(axis, x.ndim), x.ndim))
  source = x.cast(dtypes.float32) if stash_type == 1 else x
  y = source * (source * source).mean(axes, keepdim=True).add(epsilon).rsqrt()
  return y.cast(x.dtype) * scale

@op("GroupNormalization")
def group_norm(x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5, num_groups: int = 1,
               stash_type: int = 1) -> Tensor:
  n, c = x.shape[0], x.shape[1]
  grouped = x.reshape(n, num_groups, -1)
  source = grouped.cast(dtypes.float32) if stash_type == 1 else grouped
  mean, var = source.mean(2, keepdim=True), source.var(2, keepdim=True, correction=0)
  y = ((source - mean) / (var + epsilon).sqrt()).cast(x.dtype).reshape(x.shape)
  if scale.shape[0] != c:  # opset 18: one scale and bias per group
    scale, bias = scale.repeat_interleave(c // num_groups), bias.repeat_interleave(c // num_groups)
  return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)

@op("MeanVarianceNormalization")
def mean_variance_norm(x: Tensor, axes=(0, 2, 3)) -> Tensor:
  axes = tuple(axis_of(a, x.ndim) for a in axes)
  mean = x.mean(axes, keepdim=True)
  return (x - mean) / ((x - mean) ** 2).mean(axes, keepdim=True).sqrt().add(1e-9)

@op("LRN")
def lrn(x: Tensor, size: int = 1, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Tensor:
  squares = move_axis(x * x, 1, x.ndim - 1)
  before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
  padded = squares.pad(((0, 0),) * (x.ndim - 1) + ((before, after),))
  window_sum = move_axis(padded._pool((size,)).sum(-1), x.ndim - 1, 1)
  return x / (window_sum * (alpha / size) + bias).pow(beta)

# ---- resize: each axis is a weight matrix (out x in) built in numpy, applied with a matmul; nearest gathers

def _source_coordinates(mode: str, out_size: int, in_size: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
  i = np.arange(out_size, dtype=np.float64)
  if mode == "half_pixel": return (i + 0.5) / scale - 0.5
  if mode == "half_pixel_symmetric":
    adjustment = out_size / (scale * in_size)
    return in_size / 2 * (1 - adjustment) + (i + 0.5) / scale - 0.5
  if mode == "pytorch_half_pixel": return (i + 0.5) / scale - 0.5 if out_size > 1 else np.zeros(out_size)
  # the resized length is in_size * scale, not rounded (they differ when scales, not sizes, are given)
  if mode == "align_corners":
    return i * (in_size - 1) / (in_size * scale - 1) if out_size > 1 else np.zeros(out_size)
  if mode == "asymmetric": return i / scale
  if mode == "tf_crop_and_resize":
    start, end = roi
    if out_size > 1: return start * (in_size - 1) + i * (end - start) * (in_size - 1) / (out_size - 1)
    return np.full(out_size, 0.5 * (start + end) * (in_size - 1))
  raise NotImplementedError(f"coordinate_transformation_mode={mode!r}")

def _nearest(coords: np.ndarray, nearest_mode: str) -> np.ndarray:
  if nearest_mode == "round_prefer_floor": return np.where(coords % 1 == 0.5, np.floor(coords), np.round(coords))
  if nearest_mode == "round_prefer_ceil": return np.where(coords % 1 == 0.5, np.ceil(coords), np.round(coords))
  if nearest_mode == "floor": return np.floor(coords)
  if nearest_mode == "ceil": return np.ceil(coords)
  raise NotImplementedError(f"nearest_mode={nearest_mode!r}")

def _cubic(t: np.ndarray, a: float) -> np.ndarray:
  t = np.abs(t)
  near = ((a + 2) * t - (a + 3)) * t * t + 1
  far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
  return np.where(t <= 1, near, np.where(t < 2, far, 0.0))

def _interpolation_matrix(coords: np.ndarray, in_size: int, mode: str, scale: float, antialias: int, cubic_a: float,
                          exclude_outside: int) -> np.ndarray:
  """(out, in) weights of linear or cubic interpolation at these source coordinates, edges clamped."""
  matrix = np.zeros((len(coords), in_size))
  kernel_scale = min(scale, 1.0) if antialias else 1.0
  radius = 1 if mode == "linear" else 2
  for row, x in enumerate(coords):
    base = math.floor(x)
    start = math.floor(-radius / kernel_scale) + 1  # taps where the (scaled) kernel can be nonzero
    taps = np.arange(start, 2 - start)
    offsets = (taps - (x - base)) * kernel_scale
    weights = np.clip(1 - np.abs(offsets), 0, None) if mode == "linear" else _cubic(offsets, cubic_a)
    positions = base + taps
    if exclude_outside: weights = np.where((positions >= 0) & (positions < in_size), weights, 0.0)
    if antialias or exclude_outside: weights = weights / weights.sum()
    np.add.at(matrix[row], np.clip(positions, 0, in_size - 1).astype(np.int64), weights)
  return matrix

def take_known(x: Tensor, axis: int, index: np.ndarray) -> Tensor:
  """x's entries at a host-known `index` along `axis`: a strided slice where the index steps evenly, a repeat where
  each source entry is taken k times in order (a nearest upsample by an integer factor), else a gather."""
  size, count = x.shape[axis], len(index)
  lead = (slice(None),) * axis
  if count and (count == 1 or (np.diff(index) == index[1] - index[0]).all()) and (count == 1 or index[1] > index[0]):
    step = int(index[1] - index[0]) if count > 1 else 1
    return x[lead + (slice(int(index[0]), int(index[0]) + step * (count - 1) + 1, step),)]
  if count % size == 0 and (index == np.repeat(np.arange(size), count // size)).all():
    shape = list(x.shape)
    repeated = x.unsqueeze(axis + 1).expand(*shape[:axis + 1], count // size, *shape[axis + 1:])
    return repeated.reshape(*shape[:axis], count, *shape[axis + 1:])
  # a gather, not x[Tensor(index)]: the index is known to be in range, so no wrap of negative entries is needed
  shape = [1] * x.ndim
  shape[axis] = count
  picks = Tensor(index.astype(np.int32), device=x.device).reshape(*shape)
  return x.gather(axis, picks.expand(*x.shape[:axis], count, *x.shape[axis + 1:]))

@op("Resize")
def resize(x: Tensor, roi=None, scales=None, sizes=None, antialias: int = 0, axes=None,
           coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75, exclude_outside: int = 0,
           extrapolation_value: float = 0.0, keep_aspect_ratio_policy: str = "stretch", mode: str = "nearest",
           nearest_mode: str = "round_prefer_floor", ctx=None) -> Tensor:
  if ctx is not None and ctx.opset < 11:  # Resize-10: (X, scales), sampled as Upsample does
    return upsample(x, roi, mode=mode)
  axes = [axis_of(a, x.ndim) for a in axes] if axes is not None else list(range(x.ndim))
  in_sizes = [x.shape[a] for a in axes]
  scale_values = [float(v) for v in x_values(scales)] if scales is not None and scales.numel() else None
  size_values = ints(sizes) if sizes is not None and sizes.numel() else None
  if size_values is not None:
    if keep_aspect_ratio_policy == "stretch": scale_values = [o / i for o, i in zip(size_values, in_sizes)]
    else:
      pick = min if keep_aspect_ratio_policy == "not_larger" else max
      common = pick(o / i for o, i in zip(size_values, in_sizes))
      scale_values = [common] * len(axes)
      size_values = [int(math.floor(common * i + 0.5)) for i in in_sizes]
  else: size_values = [_scaled_size(i, s) for i, s in zip(in_sizes, scale_values)]
  roi_values = [float(v) for v in x_values(roi)] if roi is not None and roi.numel() else None
  inside = None
  if mode == "nearest" and coordinate_transformation_mode != "tf_crop_and_resize":
    repeated = _nearest_repeats(x, axes, in_sizes, size_values, scale_values, coordinate_transformation_mode,
                                nearest_mode, roi_values)
    if repeated is not None: return repeated
  for k, (axis, in_size, out_size, scale) in enumerate(zip(axes, in_sizes, size_values, scale_values)):
    if in_size == out_size and coordinate_transformation_mode != "tf_crop_and_resize" and scale == 1: continue
    if roi_values is not None:
      half = len(roi_values) // 2
      region = (roi_values[k], roi_values[half + k])
    else: region = (0.0, 1.0)
    coords = _source_coordinates(coordinate_transformation_mode, out_size, in_size, scale, region)
    if coordinate_transformation_mode == "tf_crop_and_resize":
      valid = (coords >= 0) & (coords <= in_size - 1)
      mask = valid.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
      inside = mask if inside is None else inside & mask
    if mode == "nearest":
      index = np.clip(_nearest(coords, nearest_mode), 0, in_size - 1).astype(np.int64)
      x = take_known(x, axis, index)
      continue
    if mode not in ("linear", "cubic"): raise NotImplementedError(f"mode={mode!r}")
    weights = _interpolation_matrix(coords, in_size, mode, scale, antialias, cubic_coeff_a, exclude_outside)
    moved = move_axis(x, axis, x.ndim - 1)
    compute = dtypes.float32 if not is_float(x) or x.dtype in dtypes.narrow_floats else x.dtype
    result = moved.cast(compute).matmul(Tensor(weights.T.astype(np.float64)).cast(compute))
    if not is_float(x): result = result.round().clip(dtypes.min(x.dtype), dtypes.max(x.dtype))
    x = move_axis(result.cast(x.dtype), x.ndim - 1, axis)
  if inside is not None: x = Tensor(np.broadcast_to(inside, x.shape).copy()).where(x, extrapolation_value)
  return x

def _scaled_size(size, scale: float):
  """floor(size * scale); a symbolic size only by a whole factor (size * k), others need a plain size."""
  if not isinstance(size, UOp): return int(math.floor(size * scale))
  if scale != int(scale) or scale < 1: raise NotImplementedError(f"Resize of a symbolic size by {scale}")
  return ssimplify(size * int(scale))

def _repeats_every_entry(mode: str, nearest_mode: str, in_size: int, out_size: int, scale: float, region) -> bool:
  """Whether a nearest resize of in_size to out_size maps output i to input i // (out_size // in_size)."""
  index = np.clip(_nearest(_source_coordinates(mode, out_size, in_size, scale, region), nearest_mode), 0, in_size - 1)
  return out_size % in_size == 0 and (index == np.repeat(np.arange(in_size), out_size // in_size)).all()

def _nearest_repeats(x: Tensor, axes, in_sizes, out_sizes, scales, mode: str, nearest_mode: str, roi) -> Tensor | None:
  """A nearest resize that repeats every entry a whole number of times on each axis (an FPN's 2x, 4x, 8x) as one
  expand and one reshape: each output index is `i // k` on its own axis (per axis, the second reshape's index math
  went through the first's: PP-OCR det's upsampled-and-padded concat ran 25% slower); None for any other resize."""
  factors = {}
  for k, (axis, in_size, out_size, scale) in enumerate(zip(axes, in_sizes, out_sizes, scales)):
    if in_size == out_size and scale == 1: continue
    region = (roi[k], roi[len(roi) // 2 + k]) if roi is not None else (0.0, 1.0)
    if isinstance(in_size, UOp):
      # a symbolic size (scaled by a whole factor): the map, affine in i for a given scale, checked at the range's ends
      factor = int(scale)
      if not all(_repeats_every_entry(mode, nearest_mode, n, n * factor, scale, region)
                 for n in (sint_min(in_size), sint_max(in_size))): return None
      factors[axis] = factor
      continue
    if not _repeats_every_entry(mode, nearest_mode, in_size, out_size, scale, region): return None
    factors[axis] = out_size // in_size
  if not factors: return None
  spread = [d for axis, size in enumerate(x.shape) for d in ((size, 1) if axis in factors else (size,))]
  wide = [d for axis, size in enumerate(x.shape) for d in ((size, factors[axis]) if axis in factors else (size,))]
  return x.reshape(*spread).expand(*wide).reshape(*(ssimplify(s * factors.get(a, 1)) for a, s in enumerate(x.shape)))

def x_values(t: Tensor) -> list:
  return t.numpy().reshape(-1).tolist()

@op("Upsample")
def upsample(x: Tensor, scales=None, mode: str = "nearest") -> Tensor:
  mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
  scales_tensor = scales if isinstance(scales, Tensor) else Tensor(list(scales), dtype=dtypes.float32)
  return resize(x, None, scales_tensor, coordinate_transformation_mode="asymmetric", mode=mode, nearest_mode="floor")

# ---- grid sampling

def _reflect(x: Tensor, low: float, high: float) -> Tensor:
  """Coordinates folded back into [low, high] as by a mirror at each end (repeatedly, for far-out values)."""
  span = high - low
  if span == 0: return x * 0 + low
  below, above = x < low, x > high
  distance = below.where(low - x, x - high)
  flips = (distance / span).floor()
  rest = distance - flips * span
  even = (flips - (flips / 2).floor() * 2) == 0
  return below.where(even.where(low + rest, high - rest), above.where(even.where(high - rest, low + rest), x))

def _cubic_weight(t: Tensor, a: float = -0.75) -> Tensor:
  t = t.abs()
  near = ((t * (a + 2) - (a + 3)) * t * t) + 1
  far = ((t * a - 5 * a) * t + 8 * a) * t - 4 * a
  return (t <= 1).where(near, (t < 2).where(far, 0.0))

@op("GridSample")
def grid_sample(x: Tensor, grid: Tensor, align_corners: int = 0, mode: str = "linear",
                padding_mode: str = "zeros") -> Tensor:
  """Sample x (N, C, *spatial) at grid (N, *out, r) in [-1, 1] (last axis x, y, ...: the spatial axes reversed)."""
  import itertools
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
  if mode not in ("linear", "nearest", "cubic"): raise NotImplementedError(f"mode={mode!r}")
  if padding_mode not in ("zeros", "border", "reflection"): raise NotImplementedError(f"padding_mode={padding_mode!r}")
  n, c, sizes = x.shape[0], x.shape[1], list(x.shape[2:])
  rank, out_spatial = len(sizes), list(grid.shape[1:-1])
  points = int(np.prod(out_spatial))
  flat_grid = grid.reshape(n, points, rank).cast(dtypes.float32)
  low_high = lambda size: (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
  taps_per_axis = []
  for axis, size in enumerate(sizes):
    g = flat_grid[:, :, rank - 1 - axis]
    u = (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2
    if padding_mode == "border": u = u.clip(0, size - 1)
    elif padding_mode == "reflection": u = _reflect(u, *low_high(size))
    if mode == "nearest":
      taps_per_axis.append([(u.round(), None)])
      continue
    base = u.floor()
    frac = u - base
    if mode == "linear": taps_per_axis.append([(base, 1 - frac), (base + 1, frac)])
    else: taps_per_axis.append([(base + k, _cubic_weight(frac - k)) for k in (-1, 0, 1, 2)])
  source = x.reshape(n, c, int(np.prod(sizes)))
  total = None
  for combo in itertools.product(*taps_per_axis):
    flat, weight, valid, stride = None, None, None, 1
    for axis in reversed(range(rank)):
      index, w = combo[axis]
      size = sizes[axis]
      inside = (index >= 0) & (index <= size - 1)
      if padding_mode == "reflection": index = _reflect(index, *low_high(size)).round()
      index = index.clip(0, size - 1).cast(dtypes.int64)
      flat = index * stride if flat is None else flat + index * stride
      stride *= size
      valid = inside if valid is None else valid & inside
      if w is not None: weight = w if weight is None else weight * w
    if padding_mode == "zeros": weight = valid.where(weight if weight is not None else 1.0, 0.0)
    picked = source.gather(2, flat.reshape(n, 1, points).expand(n, c, points))
    term = picked * weight.reshape(n, 1, points).cast(x.dtype) if weight is not None else picked
    total = term if total is None else total + term
  return total.reshape(n, c, *out_spatial).cast(x.dtype)

# ---- quantized matmul and conv: integer accumulation, one rescale, round half to even, saturate

def _requantize(accumulated: Tensor, scale: Tensor, y_scale: Tensor, y_zero_point: Tensor | None) -> Tensor:
  out_dtype = y_zero_point.dtype if y_zero_point is not None else dtypes.uint8
  value = (accumulated.cast(dtypes.float32) * (scale.cast(dtypes.float32) / y_scale.cast(dtypes.float32))).round()
  if y_zero_point is not None: value = value + y_zero_point.cast(dtypes.float32)
  return value.clip(dtypes.min(out_dtype), dtypes.max(out_dtype)).cast(out_dtype)

def _broadcastable(param: Tensor, shape, dtype) -> Tensor:
  """A scale or zero point: a scalar, or (one value per row/column/channel) reshaped to `shape`."""
  return param.cast(dtype).reshape(shape if param.numel() > 1 else ())

def _shifted(x: Tensor, zero_point: Tensor | None, shape=()) -> Tensor:
  x32 = x.cast(dtypes.int32)
  return x32 if zero_point is None else x32 - _broadcastable(zero_point, shape, dtypes.int32)

@op("QLinearMatMul")
def qlinear_matmul(a: Tensor, a_scale: Tensor, a_zero_point: Tensor, b: Tensor, b_scale: Tensor,
                   b_zero_point: Tensor, y_scale: Tensor, y_zero_point: Tensor | None = None) -> Tensor:
  accumulated = _shifted(a, a_zero_point, (-1, 1)).matmul(_shifted(b, b_zero_point, (1, -1)))
  scale = _broadcastable(a_scale, (-1, 1), dtypes.float32) * _broadcastable(b_scale, (1, -1), dtypes.float32)
  return _requantize(accumulated, scale, y_scale.reshape(()), y_zero_point)

@op("QLinearConv")
def qlinear_conv(x: Tensor, x_scale: Tensor, x_zero_point: Tensor, w: Tensor, w_scale: Tensor, w_zero_point: Tensor,
                 y_scale: Tensor, y_zero_point: Tensor | None = None, b: Tensor | None = None,
                 auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None, pads=None,
                 strides=None) -> Tensor:
  n = w.ndim - 2
  strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
  begins, ends = _pads(auto_pad, pads, x.shape[2:], list(w.shape[2:]), strides, dilations)
  accumulated = _shifted(x, x_zero_point).conv2d(_shifted(w, w_zero_point, (-1, *[1] * (w.ndim - 1))), groups=group,
                                                 stride=tuple(strides), dilation=tuple(dilations),
                                                 padding=_flat_pads(begins, ends))
  if b is not None: accumulated = accumulated + b.cast(dtypes.int32).reshape(1, -1, *[1] * n)
  scale = x_scale.cast(dtypes.float32).reshape(()) * _broadcastable(w_scale, (1, -1, *[1] * n), dtypes.float32)
  return _requantize(accumulated, scale, y_scale.reshape(()), y_zero_point)

# ---- detection: data-dependent output sizes, computed on the host

@op("NonMaxSuppression")
def non_max_suppression(boxes: Tensor, scores: Tensor, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, center_point_box: int = 0) -> Tensor:
  """(selected, 3) int64 rows of (batch, class, box): per batch and class, boxes by falling score, each kept unless
  it overlaps a kept one by more than iou_threshold."""
  all_boxes, all_scores = boxes.numpy().astype(np.float64), scores.numpy().astype(np.float64)
  limit = int(scalar(max_output_boxes_per_class)) if max_output_boxes_per_class is not None else 0
  overlap = float(scalar(iou_threshold)) if iou_threshold is not None else 0.0
  floor = float(scalar(score_threshold)) if score_threshold is not None else None
  if center_point_box:
    cx, cy, w, h = np.moveaxis(all_boxes, -1, 0)
    corners = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], -1)
  else:
    y1, x1, y2, x2 = np.moveaxis(all_boxes, -1, 0)
    corners = np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], -1)
  selected = []
  for batch in range(all_scores.shape[0]):
    area = (corners[batch, :, 2] - corners[batch, :, 0]) * (corners[batch, :, 3] - corners[batch, :, 1])
    for cls in range(all_scores.shape[1]):
      class_scores = all_scores[batch, cls]
      kept: list[int] = []
      for box in np.argsort(-class_scores, kind="stable"):
        if len(kept) >= limit or (floor is not None and class_scores[box] <= floor): break
        top = np.maximum(corners[batch, kept, :2], corners[batch, box, :2])
        bottom = np.minimum(corners[batch, kept, 2:], corners[batch, box, 2:])
        inter = np.prod(np.clip(bottom - top, 0, None), axis=-1)
        iou = inter / np.maximum(area[kept] + area[box] - inter, 1e-30)
        if not np.any(iou > overlap): kept.append(int(box))
      selected.extend((batch, cls, box) for box in kept)
  return Tensor(np.array(selected, dtype=np.int64).reshape(-1, 3), dtype=dtypes.int64)

@op("Col2Im")
def col2im(x: Tensor, image_shape: Tensor, block_shape: Tensor, dilations=None, pads=None, strides=None) -> Tensor:
  """(N, C*prod(block), L) columns -> (N, C, *image): each column's block is added at its place in the image."""
  image, block = ints(image_shape), ints(block_shape)
  n_dims = len(image)
  dilations, strides = list(dilations or [1] * n_dims), list(strides or [1] * n_dims)
  pads = list(pads or [0] * (2 * n_dims))
  padded = [size + pads[i] + pads[i + n_dims] for i, size in enumerate(image)]
  counts = [(p - d * (k - 1) - 1) // s + 1 for p, k, d, s in zip(padded, block, dilations, strides)]
  # the padded-image position of block element k in patch l, per axis, combined row-major
  per_axis = [(np.arange(c)[None, :] * s + np.arange(k)[:, None] * d)
              for c, k, s, d in zip(counts, block, strides, dilations)]
  position = np.zeros((1, 1), dtype=np.int64)
  for axis, grid in enumerate(per_axis):
    position = (position[:, None, :, None] * padded[axis] + grid[None, :, None, :]).reshape(
      position.shape[0] * grid.shape[0], position.shape[1] * grid.shape[1])
  batch, channels = x.shape[0], x.shape[1] // int(np.prod(block))
  source = x.reshape(batch, channels, -1)
  index = Tensor(position.reshape(-1)).reshape(1, 1, -1).expand(batch, channels, position.size)
  total = Tensor.zeros(batch, channels, int(np.prod(padded)), dtype=x.dtype).scatter_reduce(2, index, source, "sum")
  out = total.reshape(batch, channels, *padded)
  return out.shrink((None, None) + tuple((pads[i], pads[i] + size) for i, size in enumerate(image)))

@op("DeformConv")
def deform_conv(x: Tensor, w: Tensor, offset: Tensor, b: Tensor | None = None, mask: Tensor | None = None,
                dilations=None, group: int = 1, kernel_shape=None, offset_group: int = 1, pads=None,
                strides=None) -> Tensor:
  """A 2-d conv whose kernel taps are moved by per-position offsets (sampled bilinearly, zero outside) and scaled
  by an optional mask."""
  if w.ndim != 4: raise NotImplementedError(f"DeformConv with a {w.ndim - 2}-d kernel")
  batch, channels, height, width = x.shape
  out_channels, per_group, kh, kw = w.shape
  dilations, strides, pads = list(dilations or [1, 1]), list(strides or [1, 1]), list(pads or [0, 0, 0, 0])
  out_h, out_w = offset.shape[2], offset.shape[3]
  taps, points = kh * kw, out_h * out_w
  base_y = (np.arange(out_h)[:, None] * strides[0] - pads[0]).reshape(1, out_h, 1) + \
           (np.arange(kh) * dilations[0]).reshape(kh, 1, 1).repeat(kw, 0)
  base_x = (np.arange(out_w)[None, :] * strides[1] - pads[1]).reshape(1, 1, out_w) + \
           np.tile(np.arange(kw) * dilations[1], kh).reshape(taps, 1, 1)
  base_y = np.broadcast_to(base_y, (taps, out_h, out_w)).reshape(taps, points).astype(np.float32)
  base_x = np.broadcast_to(base_x, (taps, out_h, out_w)).reshape(taps, points).astype(np.float32)
  moves = offset.reshape(batch, offset_group, taps, 2, points)
  y, xs = moves[:, :, :, 0] + Tensor(base_y), moves[:, :, :, 1] + Tensor(base_x)  # (batch, groups, taps, points)
  y0, x0 = y.floor(), xs.floor()
  fy, fx = y - y0, xs - x0
  source = x.reshape(batch, offset_group, channels // offset_group, height * width)
  sampled = None
  for dy, wy in ((0, 1 - fy), (1, fy)):
    for dx, wx in ((0, 1 - fx), (1, fx)):
      row, col = y0 + dy, x0 + dx
      inside = (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
      flat = (row.clip(0, height - 1) * width + col.clip(0, width - 1)).cast(dtypes.int64)
      flat = flat.reshape(batch, offset_group, 1, taps * points).expand(batch, offset_group, channels // offset_group,
                                                                         taps * points)
      weight = inside.where(wy * wx, 0.0).reshape(batch, offset_group, 1, taps * points)
      term = source.gather(3, flat) * weight
      sampled = term if sampled is None else sampled + term
  sampled = sampled.reshape(batch, offset_group, channels // offset_group, taps, points)
  if mask is not None: sampled = sampled * mask.reshape(batch, offset_group, 1, taps, points)
  sampled = sampled.reshape(batch, group, channels // group, taps, points)
  kernel = w.reshape(group, out_channels // group, per_group, taps)
  out = Tensor.einsum("ngckp,gock->ngop", sampled, kernel).reshape(batch, out_channels, out_h, out_w)
  return out + b.reshape(1, -1, 1, 1) if b is not None else out

def _roi_samples(roi, scale, offset, legacy, out_h, out_w, ratio, height, width):
  """One roi's bilinear taps: flat indices and weights (out_h, out_w, samples, 4) and the sample count."""
  x1, y1, x2, y2 = (v * scale - offset for v in roi)
  roi_h, roi_w = y2 - y1, x2 - x1
  if legacy: roi_h, roi_w = max(roi_h, 1.0), max(roi_w, 1.0)
  bin_h, bin_w = roi_h / out_h, roi_w / out_w
  grid_h = ratio if ratio > 0 else int(math.ceil(roi_h / out_h))
  grid_w = ratio if ratio > 0 else int(math.ceil(roi_w / out_w))
  index = np.zeros((out_h, out_w, max(grid_h * grid_w, 1), 4), np.int64)
  weight = np.zeros(index.shape, np.float64)
  for ph in range(out_h):
    for pw in range(out_w):
      for iy in range(grid_h):
        for ix in range(grid_w):
          y = y1 + ph * bin_h + (iy + 0.5) * bin_h / grid_h
          x = x1 + pw * bin_w + (ix + 0.5) * bin_w / grid_w
          if y < -1.0 or y > height or x < -1.0 or x > width: continue
          y, x = max(y, 0.0), max(x, 0.0)
          y_low, x_low = int(y), int(x)
          if y_low >= height - 1: y_low, y_high, y = height - 1, height - 1, float(height - 1)
          else: y_high = y_low + 1
          if x_low >= width - 1: x_low, x_high, x = width - 1, width - 1, float(width - 1)
          else: x_high = x_low + 1
          ly, lx = y - y_low, x - x_low
          s = iy * grid_w + ix
          index[ph, pw, s] = [y_low * width + x_low, y_low * width + x_high, y_high * width + x_low,
                              y_high * width + x_high]
          weight[ph, pw, s] = [(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx]
  return index, weight, max(grid_h * grid_w, 1)

@op("RoiAlign")
def roi_align(x: Tensor, rois: Tensor, batch_indices: Tensor, coordinate_transformation_mode: str = "half_pixel",
              mode: str = "avg", output_height: int = 1, output_width: int = 1, sampling_ratio: int = 0,
              spatial_scale: float = 1.0, ctx=None) -> Tensor:
  """Average (or max) of bilinear samples in each bin of each roi; the sample grid depends on the roi's size, so the
  taps are laid out on the host and gathered on the device. Max mode takes the largest weighted corner, as
  onnxruntime does."""
  if ctx is not None and ctx.opset < 16: coordinate_transformation_mode = "output_half_pixel"
  legacy = coordinate_transformation_mode == "output_half_pixel"
  offset = 0.0 if legacy else 0.5
  batch, channels, height, width = x.shape
  boxes = rois.numpy().astype(np.float64)
  laid_out = [_roi_samples(r, spatial_scale, offset, legacy, output_height, output_width, sampling_ratio, height, width)
              for r in boxes]
  samples = max(s for _, _, s in laid_out)
  count = len(laid_out)
  index = np.zeros((count, output_height, output_width, samples, 4), np.int64)
  weight = np.zeros(index.shape, np.float64)
  present = np.zeros(index.shape, bool)
  for k, (i, w, s) in enumerate(laid_out):
    index[k, :, :, :s], weight[k, :, :, :s], present[k, :, :, :s] = i, w, True
  divisor = np.array([s for _, _, s in laid_out], np.float64).reshape(count, 1, 1, 1)
  source = x.reshape(batch, channels, height * width)[batch_indices.cast(dtypes.int64)]  # (rois, C, H*W)
  flat = Tensor(index.reshape(count, 1, -1)).expand(count, channels, index[0].size)
  values = source.gather(2, flat).reshape(count, channels, output_height, output_width, samples, 4)
  weighted = values * Tensor(weight.astype(np.float32)).reshape(count, 1, output_height, output_width, samples, 4)
  if mode == "avg":
    return (weighted.sum((4, 5)) / Tensor(divisor.astype(np.float32)).reshape(count, 1, 1, 1)).cast(x.dtype)
  if mode != "max": raise NotImplementedError(f"mode={mode!r}")
  weighted = Tensor(present).reshape(count, 1, output_height, output_width, samples, 4).where(weighted, -math.inf)
  return weighted.max((4, 5)).cast(x.dtype)

# ---- attention (opset 23), with the semantics of the spec's function body

def _heads(x: Tensor, count: int | None) -> Tensor:
  """A 3-d input (batch, seq, heads*size) -> (batch, heads, seq, size); 4-d inputs are already split."""
  if x.ndim == 4: return x
  if not count: raise ValueError("a 3-d Attention input needs q_num_heads and kv_num_heads")
  return x.reshape(x.shape[0], x.shape[1], count, -1).permute(0, 2, 1, 3)

@op("Attention")
def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, past_key: Tensor | None = None,
              past_value: Tensor | None = None, is_causal: int = 0, kv_num_heads: int | None = None,
              q_num_heads: int | None = None, qk_matmul_output_mode: int = 0, scale: float | None = None,
              softcap: float = 0.0, softmax_precision: int | None = None):
  """softmax(Q K^T * scale + bias) V over heads; past keys/values are prepended; a causal mask keeps key j <= query i
  (aligned at the first key, as the spec's function body does it).

  Where onnx 1.18's reference (and so its function body and its node tests' expected values) departs from the spec's
  text, kiln follows the text and onnxruntime: a 3-d input's hidden axis splits into (heads, size) before the heads
  move forward (onnx/onnx#7118), and in grouped-query attention each K/V head serves a contiguous group of Q heads."""
  queries, keys, values = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
  if past_key is not None: keys = past_key.cat(keys, dim=2)
  if past_value is not None: values = past_value.cat(values, dim=2)
  present_key, present_value = keys, values
  groups = queries.shape[1] // keys.shape[1]
  if groups > 1: keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
  factor = scale if scale is not None else 1 / math.sqrt(queries.shape[-1])
  scores = queries.matmul(keys.transpose(-1, -2)) * factor
  q_len, kv_len = scores.shape[-2], scores.shape[-1]
  recorded = [scores]
  if attn_mask is not None:
    bias = attn_mask.where(0.0, -math.inf).cast(scores.dtype) if attn_mask.dtype == dtypes.bool else attn_mask
    scores = scores + bias
  elif is_causal:
    keep = Tensor.arange(q_len).reshape(q_len, 1) >= Tensor.arange(kv_len).reshape(1, kv_len)
    scores = keep.where(scores, -math.inf)
  recorded.append(scores)
  if softcap: scores = (scores / softcap).tanh() * softcap
  recorded.append(scores)
  compute = dtype_of_onnx(softmax_precision) if softmax_precision else scores.dtype
  weights = scores.cast(compute).softmax(-1).cast(scores.dtype)
  recorded.append(weights)
  y = weights.matmul(values)
  if q.ndim == 3: y = y.permute(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)
  return y, present_key, present_value, recorded[qk_matmul_output_mode]

@op("LpNormalization")
def lp_normalization(x: Tensor, axis: int = -1, p: int = 2) -> Tensor:
  if p not in (1, 2): raise NotImplementedError(f"p={p}")
  norm = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
  return x / norm

@op("MaxRoiPool")
def max_roi_pool(x: Tensor, rois: Tensor, pooled_shape=None, spatial_scale: float = 1.0) -> Tensor:
  """Max over each bin of each roi (batch, x1, y1, x2, y2), corners scaled and rounded; an empty bin is 0. The bins'
  cells are laid out on the host, the maxima taken on the device."""
  out_h, out_w = pooled_shape
  batch, channels, height, width = x.shape
  boxes = rois.numpy().astype(np.float64)
  bins: list[list[int]] = []
  for box in boxes:
    x1, y1, x2, y2 = (int(np.round(v * spatial_scale)) for v in box[1:])
    roi_h, roi_w = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
    for ph in range(out_h):
      for pw in range(out_w):
        top = min(max(int(math.floor(ph * roi_h / out_h)) + y1, 0), height)
        bottom = min(max(int(math.ceil((ph + 1) * roi_h / out_h)) + y1, 0), height)
        left = min(max(int(math.floor(pw * roi_w / out_w)) + x1, 0), width)
        right = min(max(int(math.ceil((pw + 1) * roi_w / out_w)) + x1, 0), width)
        bins.append([r * width + c for r in range(top, bottom) for c in range(left, right)])
  cells = max(1, max(len(b) for b in bins))
  index = np.zeros((len(bins), cells), np.int64)
  valid = np.zeros((len(bins), cells), bool)
  for i, b in enumerate(bins): index[i, :len(b)], valid[i, :len(b)] = b, True
  count = len(boxes)
  source = x.reshape(batch, channels, height * width)[Tensor(boxes[:, 0].astype(np.int64))]
  flat = Tensor(index.reshape(count, 1, -1)).expand(count, channels, out_h * out_w * cells)
  values = source.gather(2, flat).reshape(count, channels, out_h, out_w, cells)
  mask = Tensor(valid.reshape(count, 1, out_h, out_w, cells))
  pooled = mask.where(values, -math.inf).max(-1)
  return Tensor(valid.any(-1).reshape(count, 1, out_h, out_w)).where(pooled, 0.0).cast(x.dtype)
