"""Movement ops beyond the core views: padding modes, repeats, joins and splits, diagonals.

Every op here is a composition of views (reshape, expand, permute, pad, shrink, flip) and at most a select, so nothing
is copied until a consumer is realized, and gradients come from the views' own rules.
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Sequence
import numpy as np
from kiln.dtype import dtypes, least_upper_dtype
from kiln.helpers import prod
from kiln.mixin.common import AxisError, TensorIndexError, TensorValueError, where, fmt
from kiln.uop.ops import UOp
from kiln.uop.sint import ssimplify, sint_min, sint_str, is_symbolic_shape
if TYPE_CHECKING: from kiln.tensor import Tensor

_PAD_MODES = ("constant", "reflect", "replicate", "circular")

def _is_int(x) -> bool: return isinstance(x, (int, np.integer)) and not isinstance(x, bool) or isinstance(x, UOp)
def _as_size(x): return x if isinstance(x, UOp) else int(x)

def _as_tuple(x) -> tuple:
  return tuple(x) if isinstance(x, (tuple, list)) else (x,)

def _tensor_list(first, rest: tuple, op: str, tensor_type) -> list:
  """`(first, *rest)` as a list of tensors; a single list/tuple argument is unpacked (torch.cat([a, b]) style)."""
  if isinstance(first, (list, tuple)) and rest:
    raise TensorValueError(f"{op}: give the tensors as one list or as separate arguments, not both{where()}")
  items = list(first) if isinstance(first, (list, tuple)) else [first, *rest]
  if not items: raise TensorValueError(f"{op}: expected a non-empty list of tensors{where()}")
  for i, t in enumerate(items):
    if not isinstance(t, tensor_type):
      raise TypeError(f"{op}: argument {i} is a {type(t).__name__}, not a Tensor{where()}")
  return items

def _parse_einops_side(side: str, formula: str) -> list:
  """One side of a rearrange formula as its axes: a name (str) for a bare axis, a list of names for a parenthesized
  group (merged into one axis), [] for a unit axis (`1` or `()`). `...` is kept as a name, expanded later."""
  axes: list = []
  group: list[str] | None = None
  for token in side.replace("\u2026", "...").replace("(", " ( ").replace(")", " ) ").split():
    if token == "(":
      if group is not None: raise TensorValueError(f"rearrange: nested parentheses in {formula!r}{where()}")
      group = []
    elif token == ")":
      if group is None: raise TensorValueError(f"rearrange: unbalanced parentheses in {formula!r}{where()}")
      axes.append(group)
      group = None
    elif token == "1":   # a unit axis; inside a group it merges nothing
      if group is None: axes.append([])
    elif token == "..." or (token.isidentifier() and not token.startswith("_") and not token.endswith("_")):
      if group is None: axes.append(token)
      else: group.append(token)
    else:
      raise TensorValueError(f"rearrange: {token!r} in {formula!r} is not an axis name (an identifier not starting or "
                             f"ending with _), 1 or ...{where()}")
  if group is not None: raise TensorValueError(f"rearrange: unbalanced parentheses in {formula!r}{where()}")
  return axes

def _expand_ellipsis(axes: list, names: list[str]) -> list[list[str]]:
  """`axes` with `...` replaced by `names` (separate axes when bare, merged inside a group), every axis a list."""
  out: list[list[str]] = []
  for axis in axes:
    if axis == "...": out.extend([name] for name in names)
    elif isinstance(axis, str): out.append([axis])
    else: out.append([n for name in axis for n in (names if name == "..." else [name])])
  return out

class MovementMixin:
  __slots__ = ()

  # ---------------- padding ----------------
  def _pad_pairs(self, padding) -> tuple[tuple[int, int], ...]:
    """`padding` as one (before, after) pair per axis, from flat PyTorch-style or per-axis form."""
    padding = tuple(padding)
    if all(_is_int(p) for p in padding):   # flat: (last_before, last_after, second_last_before, ...)
      if len(padding) % 2: raise TensorValueError(f"pad: flat padding {padding} must have an even length{where()}")
      if len(padding) // 2 > self.ndim:
        raise TensorValueError(f"pad: flat padding {padding} pads {len(padding) // 2} axes but the tensor "
                               f"{fmt(self.shape)} has {self.ndim}{where()}")
      pairs = [(_as_size(padding[i]), _as_size(padding[i + 1])) for i in range(0, len(padding), 2)]
      return tuple([(0, 0)] * (self.ndim - len(pairs)) + pairs[::-1])
    if len(padding) != self.ndim:
      raise TensorValueError(f"pad: {len(padding)} (before, after) pairs for a {self.ndim}-d tensor "
                             f"{fmt(self.shape)}{where()}")
    pairs = []
    for p in padding:
      if p is None: pairs.append((0, 0)); continue
      if not isinstance(p, (tuple, list)) or len(p) != 2 or not all(_is_int(v) for v in p):
        raise TypeError(f"pad: each axis needs None or a (before, after) pair of ints, got {p!r}{where()}")
      pairs.append((_as_size(p[0]), _as_size(p[1])))
    return tuple(pairs)

  def pad(self, padding, mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad each axis with `value` (or by reflecting, replicating or wrapping the edges, per `mode`).

    `padding` is flat PyTorch-style `(last_before, last_after, ...)`, or one `(before, after)` pair (or None) per axis.
    Negative amounts crop that side.

    >>> Tensor([1, 2, 3]).pad((1, 2)).tolist()
    [0, 1, 2, 3, 0, 0]
    >>> Tensor([1, 2, 3]).pad((2, 1), mode="reflect").tolist()
    [3, 2, 1, 2, 3, 2]
    >>> Tensor([1, 2, 3]).pad(((1, 2),), mode="circular").tolist()
    [3, 1, 2, 3, 1, 2]
    """
    if mode not in _PAD_MODES:
      raise NotImplementedError(f"pad: mode {mode!r} is not one of {', '.join(_PAD_MODES)}{where()}")
    if mode != "constant" and value != 0:
      raise TensorValueError(f"pad: mode {mode!r} does not take a fill value (got value={value}){where()}")
    pairs = self._pad_pairs(padding)
    if any(isinstance(x, UOp) for pair in pairs for x in pair) or is_symbolic_shape(self.shape):
      return self._pad_symbolic(pairs, mode, value)
    for axis, ((before, after), size) in enumerate(zip(pairs, self.shape)):
      if size + before + after < 0 or -before > size or -after > size:
        raise TensorValueError(f"pad: padding {(before, after)} crops more than the {size} elements of axis {axis} "
                               f"of {fmt(self.shape)}{where()}")
    if mode == "circular": return self._pad_circular(pairs)
    grow = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
    crop = tuple((max(-b, 0), max(-a, 0)) for b, a in pairs)
    if mode == "constant":
      # crop first so the fill never lands where a crop removes it
      x = self.shrink(tuple((b, s - a) for (b, a), s in zip(crop, self.shape)))
      return x._pad_constant(grow, value)
    x = self
    for axis, (before, after) in enumerate(grow):
      if before == 0 and after == 0: continue
      size = x.shape[axis]
      if mode == "reflect" and (before >= size or after >= size):
        raise TensorValueError(f"pad: reflect padding {(before, after)} must be smaller than the size {size} of axis {axis} "
                               f"of {fmt(self.shape)}{where()}")
      if mode == "replicate" and size == 0:
        raise TensorValueError(f"pad: replicate padding {(before, after)} needs a non-empty axis {axis} "
                               f"of {fmt(self.shape)}{where()}")
      pieces = [x]
      if before:   # reflect: x[before], ..., x[1]; replicate: x[0] repeated
        if mode == "reflect": pieces.insert(0, x._narrow(axis, 1, before + 1).flip(axis))
        else: pieces.insert(0, x._narrow(axis, 0, 1)._expand_axis(axis, before))
      if after:    # reflect: x[size-2], ..., x[size-1-after]; replicate: x[size-1] repeated
        if mode == "reflect": pieces.append(x._narrow(axis, size - 1 - after, size - 1).flip(axis))
        else: pieces.append(x._narrow(axis, size - 1, size)._expand_axis(axis, after))
      x = pieces[0].cat(*pieces[1:], dim=axis)
    # like PyTorch, reflect and replicate pad the whole tensor and then crop
    return x.shrink(tuple((b, s - a) for (b, a), s in zip(crop, x.shape)))

  def _pad_symbolic(self, pairs: tuple, mode: str, value) -> Tensor:
    """Constant padding by amounts that are expressions over bound Variables (non-negative over their ranges)."""
    if mode != "constant":
      raise NotImplementedError(f"pad: mode {mode!r} with symbolic sizes {fmt(self.shape)} / padding {pairs}; "
                                f"only constant padding takes bound Variables{where()}")
    for axis, (before, after) in enumerate(pairs):
      if sint_min(before) < 0 or sint_min(after) < 0:
        raise TensorValueError(f"pad: symbolic padding ({sint_str(before)}, {sint_str(after)}) on axis {axis} can be "
                               f"negative; padding with bound Variables must be >= 0 over their ranges{where()}")
    pairs = tuple((ssimplify(b), ssimplify(a)) for b, a in pairs)
    return self._pad_constant(pairs, value)

  def _pad_constant(self, padding: tuple[tuple[int, int], ...], value) -> Tensor:
    """Pad by non-negative amounts with the constant `value`, keeping the dtype."""
    out = self._wrap(self.uop.pad(padding), "pad")
    if value == 0 and not (isinstance(value, float) and np.signbit(value)): return out
    inside = self._wrap(self.full(self.shape, True, device=self.device).uop.pad(padding), "pad")
    fill = self.full((), value, device=self.device, dtype=self.dtype if dtypes.is_float(self.dtype) else None)
    result = inside.where(out, fill)
    return result if result.dtype == self.dtype else result.cast(self.dtype)

  def _pad_circular(self, pairs: tuple[tuple[int, int], ...]) -> Tensor:
    """Wrap-around padding; a negative amount crops that side first (as PyTorch does)."""
    crop = tuple((max(-b, 0), max(-a, 0)) for b, a in pairs)
    x = self.shrink(tuple((b, s - a) for (b, a), s in zip(crop, self.shape)))
    grow = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
    for axis, ((before, after), size) in enumerate(zip(grow, x.shape)):
      if before > size or after > size:
        raise TensorValueError(f"pad: circular padding {(before, after)} wraps around more than once on axis {axis} "
                               f"of size {size}{where()}")
    # three copies side by side hold every wrapped window of at most one extra period on each side
    tiled = x.repeat(tuple(3 if b or a else 1 for b, a in grow))
    return tiled.shrink(tuple((s - b, 2 * s + a) if b or a else (0, s) for (b, a), s in zip(grow, x.shape)))

  def _narrow(self, axis: int, start: int, end: int) -> Tensor:
    """Elements [start, end) of `axis`."""
    return self.shrink(tuple((start, end) if i == axis else (0, s) for i, s in enumerate(self.shape)))

  def _expand_axis(self, axis: int, size: int) -> Tensor:
    """This tensor (size 1 on `axis`) broadcast to `size` along `axis`."""
    return self.expand(tuple(size if i == axis else s for i, s in enumerate(self.shape)))

  # ---------------- repeats and shifts ----------------
  def repeat(self, repeats, *args) -> Tensor:
    """Tile the tensor `repeats[i]` times along axis i (extra leading repeats add axes), like torch.Tensor.repeat.

    >>> Tensor([1, 2]).repeat(2, 2).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    repeats = _as_tuple(repeats) + args
    if not all(_is_int(r) for r in repeats): raise TypeError(f"repeat: repeats must be ints, got {repeats}{where()}")
    if len(repeats) < self.ndim:
      raise TensorValueError(f"repeat: {len(repeats)} repeats for a {self.ndim}-d tensor {fmt(self.shape)}; "
                             f"give at least one per axis{where()}")
    if any(r < 0 for r in repeats): raise TensorValueError(f"repeat: repeats must be non-negative, got {repeats}{where()}")
    shape = (1,) * (len(repeats) - self.ndim) + self.shape
    # a new size-r axis in front of each axis, broadcast, then merged: copy i of the whole axis comes before copy i+1
    spread = self.reshape(tuple(v for s in shape for v in (1, s)))
    spread = spread.expand(tuple(v for r, s in zip(repeats, shape) for v in (int(r), s)))
    return spread.reshape(tuple(int(r) * s for r, s in zip(repeats, shape)))

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
    """Repeat each element `repeats` times along `dim` (of the flattened tensor when `dim` is None).

    >>> Tensor([1, 2, 3]).repeat_interleave(2).tolist()
    [1, 1, 2, 2, 3, 3]
    """
    if not _is_int(repeats): raise TypeError(f"repeat_interleave: repeats must be an int, got {repeats!r}{where()}")
    if repeats < 0: raise TensorValueError(f"repeat_interleave: repeats must be non-negative, got {repeats}{where()}")
    x = self.flatten() if dim is None else self
    axis = 0 if dim is None else x._axis(dim, "repeat_interleave")
    if x.ndim == 0: x = x.reshape(1)
    shape = x.shape
    spread = x.reshape(shape[:axis + 1] + (1,) + shape[axis + 1:])
    spread = spread.expand(shape[:axis + 1] + (int(repeats),) + shape[axis + 1:])
    return spread.reshape(shape[:axis] + (shape[axis] * int(repeats),) + shape[axis + 1:])

  def roll(self, shifts, dims=None) -> Tensor:
    """Shift elements circularly by `shifts` along `dims` (of the flattened tensor when `dims` is None).

    >>> Tensor([1, 2, 3, 4]).roll(1).tolist()
    [4, 1, 2, 3]
    """
    shifts = _as_tuple(shifts)
    if not all(_is_int(s) for s in shifts): raise TypeError(f"roll: shifts must be ints, got {shifts}{where()}")
    if dims is None:
      if len(shifts) != 1:
        raise TensorValueError(f"roll: {len(shifts)} shifts need as many dims, got dims=None{where()}")
      return self.flatten().roll(shifts, 0).reshape(self.shape)
    dims = _as_tuple(dims)
    if len(dims) != len(shifts):
      raise TensorValueError(f"roll: shifts {shifts} and dims {dims} must have the same length{where()}")
    total = [0] * max(self.ndim, 1)
    for d, s in zip(dims, shifts): total[self._axis(d, "roll")] += int(s)
    if self.ndim == 0: return self
    # shifting by k is the window starting at n - k%n of the axis written out twice
    starts = [(n - k % n) % n if n else 0 for k, n in zip(total, self.shape)]
    doubled = self.repeat(tuple(2 if st else 1 for st in starts))
    return doubled.shrink(tuple((st, st + n) for st, n in zip(starts, self.shape)))

  # ---------------- joining and splitting ----------------
  def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Join tensors along an existing axis `dim`; dtypes promote as in torch.cat.

    >>> Tensor([[1, 2]]).cat(Tensor([[3, 4]]), dim=0).tolist()
    [[1, 2], [3, 4]]
    >>> Tensor.cat(Tensor([1]), Tensor([2.5, 3.0])).tolist()
    [1.0, 2.5, 3.0]
    """
    tensors = _tensor_list(self, args, "cat", MovementMixin)
    dtype = least_upper_dtype(*(t.dtype for t in tensors))
    # like torch.cat, a 1-d empty tensor is skipped when it is joined to tensors of other ranks
    if any(t.ndim != 1 for t in tensors): tensors = [t for t in tensors if t.shape != (0,)] or tensors[:1]
    first = tensors[0]
    for i, t in enumerate(tensors):
      if t.ndim == 0: raise AxisError(f"cat: tensor {i} is 0-d and cannot be joined (unsqueeze it first){where()}")
      if t.device != first.device:
        raise RuntimeError(f"cat: tensors are on different devices, {first.device} (tensor 0) and {t.device} "
                           f"(tensor {i}){where()}")
    axis = first._axis(dim, "cat")
    for i, t in enumerate(tensors):
      if t.ndim != first.ndim or any(a != b for k, (a, b) in enumerate(zip(t.shape, first.shape)) if k != axis):
        raise TensorValueError(f"cat: shape {fmt(t.shape)} of tensor {i} does not match {fmt(first.shape)} of tensor 0 "
                               f"outside dim {axis}{where()}")
    tensors = [t if t.dtype == dtype else t.cast(dtype) for t in tensors]
    pieces = [t for t in tensors if not (type(t.shape[axis]) is int and t.shape[axis] == 0)] or tensors[:1]
    if len(pieces) == 1: return pieces[0]
    total = sum(t.shape[axis] for t in pieces)
    padded, offset = [], 0
    for t in pieces:
      size = t.shape[axis]
      amounts = tuple((offset, total - offset - size) if k == axis else (0, 0) for k in range(t.ndim))
      # floats are padded with -0.0, the additive identity that also keeps the sign of a -0.0 element
      padded.append(t._pad_constant(amounts, -0.0 if dtypes.is_float(dtype) else 0))
      offset += size
    # a balanced sum keeps the graph shallow; it all fuses into the consumer's kernel
    while len(padded) > 1:
      pairs = [(padded[i], padded[i + 1]) for i in range(0, len(padded) - 1, 2)]
      joined = [a | b if dtype == dtypes.bool else a + b for a, b in pairs]
      padded = joined + ([padded[-1]] if len(padded) % 2 else [])
    return padded[0]

  def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Join equally shaped tensors along a new axis `dim`.

    >>> Tensor([1, 2]).stack(Tensor([3, 4]), dim=1).tolist()
    [[1, 3], [2, 4]]
    """
    tensors = _tensor_list(self, args, "stack", MovementMixin)
    for i, t in enumerate(tensors):
      if t.shape != tensors[0].shape:
        raise TensorValueError(f"stack: tensors must have equal shapes, got {fmt(tensors[0].shape)} (tensor 0) and "
                               f"{fmt(t.shape)} (tensor {i}){where()}")
    ndim = tensors[0].ndim + 1
    if not _is_int(dim) or not -ndim <= dim < ndim:
      raise IndexError(f"stack: dim {dim!r} is out of range for stacking {ndim - 1}-d tensors{where()}")
    axis = dim + ndim if dim < 0 else int(dim)
    expanded = [t.unsqueeze(axis) for t in tensors]
    return expanded[0].cat(*expanded[1:], dim=axis)

  def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces along `dim`: pieces of `sizes` elements (the last may be shorter), or one per size.

    >>> [t.tolist() for t in Tensor.arange(5).split(2)]
    [[0, 1], [2, 3], [4]]
    >>> [t.tolist() for t in Tensor.arange(5).split([1, 4])]
    [[0], [1, 2, 3, 4]]
    """
    axis = self._axis(dim, "split")
    if self.ndim == 0: raise TensorValueError(f"split: a 0-d tensor cannot be split{where()}")
    n = self.shape[axis]
    if _is_int(sizes):
      if sizes < 0 or (sizes == 0 and n > 0):
        raise TensorValueError(f"split: split size {sizes} must be positive for axis {axis} of size {n}{where()}")
      sizes = [min(sizes, n - start) for start in range(0, n, sizes)] if n else [0]
    else:
      sizes = list(sizes)
      if not all(_is_int(s) and s >= 0 for s in sizes):
        raise TensorValueError(f"split: sizes must be non-negative ints, got {sizes}{where()}")
      if sum(sizes) != n:
        raise TensorValueError(f"split: sizes {sizes} sum to {sum(sizes)}, not to the size {n} of axis {axis} "
                               f"of {fmt(self.shape)}{where()}")
    starts = np.cumsum([0] + sizes).tolist()
    return tuple(self._narrow(axis, starts[i], starts[i + 1]) for i in range(len(sizes)))

  def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
    """Split into at most `chunks` pieces of ceil(size / chunks) elements along `dim` (as torch.chunk).

    >>> [t.tolist() for t in Tensor.arange(5).chunk(3)]
    [[0, 1], [2, 3], [4]]
    """
    if not _is_int(chunks) or chunks <= 0:
      raise TensorValueError(f"chunk: chunks must be a positive int, got {chunks!r}{where()}")
    axis = self._axis(dim, "chunk")
    n = self.shape[axis] if self.ndim else 1
    return list(self.split(-(-n // chunks) if n else [0] * chunks, axis))   # an empty axis gives `chunks` empty pieces

  def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids from 1-d (or 0-d) tensors: "ij" indexes like a matrix, "xy" swaps the first two axes.

    >>> [g.tolist() for g in Tensor([1, 2]).meshgrid(Tensor([3, 4, 5]))]
    [[[1, 1, 1], [2, 2, 2]], [[3, 4, 5], [3, 4, 5]]]
    """
    if indexing not in ("ij", "xy"):
      raise TensorValueError(f'meshgrid: indexing must be "ij" or "xy", got {indexing!r}{where()}')
    tensors = _tensor_list(self, args, "meshgrid", MovementMixin)
    for i, t in enumerate(tensors):
      if t.ndim > 1:
        raise TensorValueError(f"meshgrid: tensor {i} has shape {fmt(t.shape)}; only 0-d or 1-d tensors{where()}")
      if t.device != tensors[0].device:
        raise RuntimeError(f"meshgrid: tensors on different devices, {tensors[0].device} and {t.device}{where()}")
    sizes = [t.numel() for t in tensors]
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1: order[0], order[1] = 1, 0
    shape = tuple(sizes[k] for k in order)
    grids = []
    for i, t in enumerate(tensors):
      position = order.index(i)
      view = t.reshape(tuple(sizes[i] if k == position else 1 for k in range(len(shape))))
      grids.append(view.expand(shape))
    return tuple(grids)

  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split axis `dim` into axes of `sizes` (one may be -1), the inverse of flatten.

    >>> Tensor.arange(6).unflatten(0, (2, 3)).shape
    (2, 3)
    """
    axis = self._axis(dim, "unflatten")
    if self.ndim == 0: raise TensorValueError(f"unflatten: a 0-d tensor has no axis to unflatten{where()}")
    sizes = tuple(sizes)
    if not sizes: raise TensorValueError(f"unflatten: sizes must not be empty{where()}")
    n, known = self.shape[axis], prod(s for s in sizes if s != -1)
    if sizes.count(-1) > 1 or (-1 not in sizes and known != n) or (-1 in sizes and (known == 0 or n % known)):
      raise TensorValueError(f"unflatten: sizes {sizes} do not multiply up to the size {n} of axis {axis} "
                             f"of {fmt(self.shape)}{where()}")
    sizes = tuple(n // known if s == -1 else s for s in sizes)
    return self.reshape(self.shape[:axis] + sizes + self.shape[axis + 1:])

  def unfold(self, dim: int, size: int, step: int) -> Tensor:
    """Sliding windows of `size` elements, one every `step`, along `dim`, like torch.Tensor.unfold.

    Axis `dim` becomes the window count (shape[dim] - size) // step + 1 and a new last axis of length `size` holds
    each window. A view: nothing is copied.

    >>> Tensor.arange(5).unfold(0, 2, 2).tolist()
    [[0, 1], [2, 3]]
    >>> Tensor.arange(8).reshape(2, 4).unfold(1, 3, 1).shape
    (2, 2, 3)
    """
    if not _is_int(size) or not _is_int(step):
      raise TypeError(f"unfold: size and step must be ints, got size={size!r}, step={step!r}{where()}")
    axis = self._axis(dim, "unfold")
    length = self.shape[axis] if self.ndim else 1   # a 0-d tensor unfolds as one element, as in PyTorch
    if size < 0: raise TensorValueError(f"unfold: size must be >= 0, got {size}{where()}")
    if step <= 0: raise TensorValueError(f"unfold: step must be > 0, got {step}{where()}")
    if size > length:
      raise TensorValueError(f"unfold: window size {size} is larger than axis {axis} (size {length}) of "
                             f"{fmt(self.shape)}{where()}")
    if self.ndim == 0: return self.reshape(1)._narrow(0, 0, size)
    to_last = [a for a in range(self.ndim) if a != axis] + [axis]
    windows = self.permute(to_last)._pool((size,), step)   # (...others, count, size)
    last = self.ndim - 1
    return windows.permute(*range(axis), last, *range(axis, last), self.ndim)

  def rearrange(self, formula: str, **sizes: int) -> Tensor:
    """Reshape and permute by an einops formula such as "b (h w) c -> b c h w".

    Names on the left are this tensor's axes; a parenthesized group splits one axis (give all but one of its sizes
    as keyword arguments), `...` stands for the axes not named, and `1` or `()` is an axis of size 1. The right side
    lists the same names in the new order; a group there merges axes. Only views: nothing is copied.

    >>> Tensor.arange(6).rearrange("(h w) -> w h", h=2).tolist()
    [[0, 3], [1, 4], [2, 5]]
    >>> Tensor.zeros(2, 3, 4).rearrange("b ... -> (...) b 1").shape
    (12, 2, 1)
    """
    if not isinstance(formula, str) or formula.count("->") != 1:
      raise TensorValueError(f"rearrange: the formula needs exactly one '->', got {formula!r}{where()}")
    left_text, right_text = formula.split("->")
    left, right = _parse_einops_side(left_text, formula), _parse_einops_side(right_text, formula)
    flat = {side: [n for axis in axes for n in ([axis] if isinstance(axis, str) else axis)]
            for side, axes in (("left", left), ("right", right))}
    for side, names in flat.items():
      repeated = sorted({n for n in names if names.count(n) > 1})
      if repeated: raise TensorValueError(f"rearrange: {', '.join(repeated)} repeated on the {side} of {formula!r}{where()}")
    if set(flat["left"]) != set(flat["right"]):
      one_side = sorted(set(flat["left"]) ^ set(flat["right"]))
      raise TensorValueError(f"rearrange: {', '.join(one_side)} must appear on both sides of {formula!r}{where()}")
    if any(not isinstance(axis, str) and "..." in axis for axis in left):
      raise TensorValueError(f"rearrange: ... cannot be inside parentheses on the left of {formula!r}{where()}")
    for name, value in sizes.items():
      if name not in flat["left"]:
        raise TensorValueError(f"rearrange: size given for {name!r}, not an axis of {formula!r}{where()}")
      if not _is_int(value) or value < 0:
        raise TensorValueError(f"rearrange: size of {name!r} must be a non-negative int, got {value!r}{where()}")
    n_named = len(left) - ("..." in left)
    if self.ndim < n_named or ("..." not in left and self.ndim != n_named):
      raise TensorValueError(f"rearrange: the left of {formula!r} names {n_named} axes but the tensor {fmt(self.shape)} "
                             f"has {self.ndim}{where()}")
    rest = [f"...{i}" for i in range(self.ndim - n_named)]
    left_axes, right_axes = _expand_ellipsis(left, rest), _expand_ellipsis(right, rest)
    size_of: dict[str, int] = {}
    for position, (group, length) in enumerate(zip(left_axes, self.shape)):
      if not group and length != 1:
        raise TensorValueError(f"rearrange: axis {position} is 1 in {formula!r} but has size {length} in "
                               f"{fmt(self.shape)}{where()}")
      unknown = [n for n in group if n not in sizes]
      known = prod(sizes[n] for n in group if n in sizes)
      if len(unknown) > 1:
        raise TensorValueError(f"rearrange: cannot infer the sizes of {', '.join(unknown)} in {formula!r}; pass all but one "
                               f"as keyword arguments{where()}")
      if unknown and known and length % known == 0: size_of[unknown[0]] = length // known
      elif unknown or known != length:
        raise TensorValueError(f"rearrange: axis ({' '.join(group)}) of {formula!r} has size {length}, which does "
                               f"not match the sizes {sizes}{where()}")
      size_of.update((n, sizes[n]) for n in group if n in sizes)
    elementary = [n for group in left_axes for n in group]
    out = self.reshape(tuple(size_of[n] for n in elementary))
    out = out.permute(tuple(elementary.index(n) for group in right_axes for n in group))
    return out.reshape(tuple(prod(size_of[n] for n in group) for group in right_axes))

  # ---------------- diagonals and triangles ----------------
  def diag(self) -> Tensor:
    """A square matrix with this 1-d tensor on its diagonal and zeros elsewhere.

    >>> Tensor([1, 2]).diag().tolist()
    [[1, 0], [0, 2]]
    """
    if self.ndim != 1: raise TensorValueError(f"diag: expected a 1-d tensor, got shape {fmt(self.shape)}{where()}")
    n = self.shape[0]
    # each element followed by n zeros, written out row by row of width n, lands at (i, i)
    return self.reshape(n, 1).pad(((0, 0), (0, n))).flatten()._narrow(0, 0, n * n).reshape(n, n)

  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the (dim1, dim2) planes as the last axis (as torch.diagonal); `offset` > 0 is above it.

    >>> Tensor.arange(9).reshape(3, 3).diagonal().tolist()
    [0, 4, 8]
    >>> Tensor.arange(9).reshape(3, 3).diagonal(1).tolist()
    [1, 5]
    """
    if self.ndim < 2: raise TensorIndexError(f"diagonal: needs at least 2 dims, got shape {fmt(self.shape)}{where()}")
    a, b = self._axis(dim1, "diagonal"), self._axis(dim2, "diagonal")
    if a == b: raise TensorValueError(f"diagonal: dim1 and dim2 must differ, both are {a}{where()}")
    if not _is_int(offset): raise TypeError(f"diagonal: offset must be an int, got {offset!r}{where()}")
    rest = [k for k in range(self.ndim) if k not in (a, b)]
    x = self.permute(rest + [a, b])
    rows, cols = x.shape[-2:]
    row0, col0 = min(max(-offset, 0), rows), min(max(offset, 0), cols)   # where the diagonal starts
    m = min(rows - row0, cols - col0)
    lead = x.shape[:-2]
    x = x.shrink(tuple((0, s) for s in lead) + ((row0, row0 + m), (col0, col0 + m)))
    # row i of an m x m block starts at i*m; padding each flat block to m*(m+1) and viewing it as m rows of m+1
    # puts element (i, i) at column 0
    flat = x.reshape(lead + (m * m,)).pad(tuple((0, 0) for _ in lead) + ((0, m),))
    return flat.reshape(lead + (m, m + 1))._narrow(len(lead) + 1, 0, 1).reshape(lead + (m,))

  def _triangle_mask(self, diagonal: int, upper: bool, op: str) -> Tensor:
    if self.ndim < 2: raise TensorValueError(f"{op}: needs at least 2 dims, got shape {fmt(self.shape)}{where()}")
    if not _is_int(diagonal): raise TypeError(f"{op}: diagonal must be an int, got {diagonal!r}{where()}")
    rows, cols = self.shape[-2:]
    r = self.arange(rows, device=self.device).reshape(rows, 1)
    c = self.arange(cols, device=self.device).reshape(1, cols)
    return (c - r >= int(diagonal)) if upper else (c - r <= int(diagonal))

  def triu(self, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two axes (on and above `diagonal`); the rest is zero.

    >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
    [[1, 2], [0, 4]]
    """
    return self._triangle_mask(diagonal, True, "triu").where(self, self.zeros_like())

  def tril(self, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two axes (on and below `diagonal`); the rest is zero.

    >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
    [[1, 0], [3, 4]]
    """
    return self._triangle_mask(diagonal, False, "tril").where(self, self.zeros_like())
