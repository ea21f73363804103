"""Indexing: __getitem__ in all its forms, __setitem__, gather/scatter and masked selection.

Every index is split in two parts. The basic part (ints, slices, None) is a chain of movement ops (shrink, flip,
pad+reshape for steps), so it costs nothing. The advanced part (int tensors, lists, bool masks) picks elements with a
one-hot comparison against `arange` followed by a sum: lazy, fusable and differentiable, with no data-dependent shape.
Only bool masks, masked_select and nonzero need the data to know their output size, so they realize (synchronize).
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, NamedTuple
import numpy as np
from kiln.dtype import dtypes
from kiln.helpers import prod
from kiln.uop.ops import Ops, UOp
from kiln.uop.sint import ssimplify, ssub, sint_min, sint_str
from kiln.mixin.common import UnsupportedError, TensorValueError, TensorIndexError, where, fmt, broadcast_shape
if TYPE_CHECKING: from kiln.tensor import Tensor

_INT32_MAX = 2 ** 31 - 1

class _Axis(NamedTuple):
  """What the basic part of an index does to one axis: keep [lo, hi) every `step`-th (reversed if `flip`)."""
  lo: int
  hi: int
  step: int
  flip: bool
  count: int

class _IndexPlan(NamedTuple):
  """A parsed index: per-axis basic bounds, the shape of the basic view, and the advanced indices on that view."""
  axes: tuple[_Axis, ...]
  view_shape: tuple[int, ...]
  adv_dims: tuple[int, ...]          # axes of the basic view that advanced indices select along
  adv_index: tuple[Any, ...]         # one int Tensor per entry of adv_dims
  adv_checked: tuple[bool, ...]      # whether that index came from the host, checked and already non-negative

class IndexingMixin:
  __slots__ = ()

  # ---------------- parsing ----------------
  def _index_plan(self, index, op: str) -> _IndexPlan:
    """Parse `index` (anything __getitem__ accepts) against this tensor's shape."""
    if isinstance(index, list) and any(isinstance(i, (list, tuple, slice, np.ndarray, type(self))) or i is None
                                       or i is Ellipsis for i in index):
      index = tuple(index)   # a top-level list of sequences is a tuple of indices (tinygrad and PyTorch's legacy rule)
    items = index if isinstance(index, tuple) else (index,)
    parsed: list[tuple[str, Any]] = []
    for item in items:
      if item is None: parsed.append(("none", None))
      elif item is Ellipsis: parsed.append(("ellipsis", None))
      elif isinstance(item, (bool, np.bool_)): parsed.append(("mask", np.array(bool(item))))
      elif isinstance(item, (int, np.integer)): parsed.append(("int", int(item)))
      elif isinstance(item, UOp): parsed.append(("int", item))   # a bound Variable (expression) picks one position
      elif isinstance(item, slice): parsed.append(("slice", item))
      elif isinstance(item, type(self)):
        if item.dtype == dtypes.bool: parsed.append(("mask", item))
        elif dtypes.is_int(item.dtype): parsed.append(("adv", item))
        else: raise TensorIndexError(f"{op}: tensors used as indices must be int or bool, got {item.dtype}{where()}")
      elif isinstance(item, (list, tuple, np.ndarray)):
        arr = _host_index_array(item, op)
        parsed.append(("mask" if arr.dtype == np.bool_ else "adv", arr))
      # PyTorch: an IndexError for a float, a TypeError for other objects
      elif isinstance(item, float): raise TensorIndexError(f"{op}: unsupported index {item!r} of type float{where()}")
      else: raise TypeError(f"{op}: unsupported index {item!r} of type {type(item).__name__}{where()}")
    if sum(1 for kind, _ in parsed if kind == "ellipsis") > 1:
      raise TensorIndexError(f"{op}: an index can only have a single Ellipsis (...){where()}")
    used = sum(value.ndim if kind == "mask" else 1 for kind, value in parsed if kind not in ("none", "ellipsis"))
    if used > self.ndim:
      raise TensorIndexError(f"{op}: too many indices ({used}) for a tensor of shape {fmt(self.shape)}{where()}")
    fill = [("slice", slice(None))] * (self.ndim - used)
    at = next((k for k, (kind, _) in enumerate(parsed) if kind == "ellipsis"), len(parsed))
    parsed[at:at + 1] = fill

    axes: list[_Axis] = []
    view_shape: list[int] = []
    adv_dims: list[int] = []
    adv_index: list = []
    adv_checked: list[bool] = []
    for kind, value in parsed:
      axis = len(axes)
      if kind == "none":
        view_shape.append(1)
      elif kind == "int" and (isinstance(value, UOp) or isinstance(self.shape[axis], UOp)):
        axes.append(_symbolic_axis(slice(value, value + 1), self.shape[axis], axis, op))
      elif kind == "int":
        size = self.shape[axis]
        if not -size <= value < size:
          raise TensorIndexError(f"{op}: index {value} is out of range for axis {axis} of size {size} "
                                 f"(shape {fmt(self.shape)}){where()}")
        value = value + size if value < 0 else value
        axes.append(_Axis(value, value + 1, 1, False, 1))
      elif kind == "slice":
        symbolic = isinstance(self.shape[axis], UOp) or isinstance(value.start, UOp) or isinstance(value.stop, UOp)
        size = self.shape[axis]
        axes.append(_symbolic_axis(value, size, axis, op) if symbolic else _slice_axis(value, size))
        view_shape.append(axes[-1].count)
      elif kind == "adv":
        size = self.shape[axis]
        adv_checked.append(isinstance(value, np.ndarray))
        if isinstance(value, np.ndarray): value = self._host_index_tensor(value, axis, op)
        adv_dims.append(len(view_shape)); adv_index.append(value.to(self.device))
        axes.append(_Axis(0, size, 1, False, size)); view_shape.append(size)
      else:   # a bool mask: the positions of its true elements, one int index per axis it covers
        host = value if isinstance(value, np.ndarray) else value.numpy()
        if host.ndim == 0:   # a scalar mask adds a new axis of size 1 (kept if true, emptied if false)
          view_shape.append(1)
          adv_dims.append(len(view_shape) - 1)
          adv_index.append(type(self)(np.zeros(int(host), np.int32), device=self.device)); adv_checked.append(True)
          continue
        covered = self.shape[axis:axis + host.ndim]
        if host.shape != covered:
          raise TensorIndexError(f"{op}: mask of shape {fmt(host.shape)} does not match the shape {fmt(covered)} "
                                 f"of the axes {axis}..{axis + host.ndim - 1} of shape {fmt(self.shape)}{where()}")
        for k, positions in enumerate(np.nonzero(host)):
          adv_dims.append(len(view_shape))
          adv_index.append(type(self)(positions.astype(np.int32), device=self.device)); adv_checked.append(True)
          axes.append(_Axis(0, covered[k], 1, False, covered[k])); view_shape.append(covered[k])
    return _IndexPlan(tuple(axes), tuple(view_shape), tuple(adv_dims), tuple(adv_index), tuple(adv_checked))

  def _host_index_tensor(self, arr: np.ndarray, axis: int, op: str) -> Tensor:
    """A list/array index as an int tensor, checked against the axis size (negative values wrapped)."""
    size = self.shape[axis]
    bad = arr[(arr < -size) | (arr >= size)]
    if bad.size:
      raise TensorIndexError(f"{op}: index {int(bad.reshape(-1)[0])} is out of range for axis {axis} of size {size} "
                             f"(shape {fmt(self.shape)}){where()}")
    arr = np.where(arr < 0, arr + size, arr)
    return type(self)(arr.astype(np.int32 if size <= _INT32_MAX else np.int64), device=self.device)

  # ---------------- the basic part: movement ops ----------------
  def _basic_view(self, plan: _IndexPlan) -> Tensor:
    """This tensor through the int/slice/None part of `plan` (advanced axes kept whole)."""
    x = self
    if any((a.lo, a.hi) != (0, s) for a, s in zip(plan.axes, self.shape)):
      x = x.shrink(tuple((a.lo, a.hi) for a in plan.axes))
    if any(a.flip for a in plan.axes): x = x.flip(tuple(k for k, a in enumerate(plan.axes) if a.flip))
    if any(a.step > 1 for a in plan.axes):
      # every step-th element: pad each axis to count*step, split it into (count, step) and keep the first of each step
      x = x.pad(tuple((0, a.count * a.step - (a.hi - a.lo)) for a in plan.axes))
      x = x.reshape(tuple(n for a in plan.axes for n in (a.count, a.step)))
      x = x.shrink(tuple(b for a in plan.axes for b in ((0, a.count), (0, 1))))
    x = x.reshape(plan.view_shape)
    # an index that keeps every element in order (`t[::-1]` of a size-1 axis) is this tensor itself: writing through
    # it (`t[::-1].assign(v)`) must update this tensor
    return self if x.uop is self.uop else x

  def _unbasic(self, plan: _IndexPlan, full_shape: tuple[int, ...]) -> Tensor:
    """The inverse of _basic_view: this view-shaped tensor put where it came from in `full_shape`, zeros elsewhere."""
    x = self.reshape(tuple(a.count for a in plan.axes))
    if any(a.step > 1 for a in plan.axes):
      x = x.reshape(tuple(n for a in plan.axes for n in (a.count, 1)))
      x = x.pad(tuple(p for a in plan.axes for p in ((0, 0), (0, a.step - 1))))
      x = x.reshape(tuple(a.count * a.step for a in plan.axes))
      x = x.shrink(tuple((0, a.hi - a.lo) for a in plan.axes))
    if any(a.flip for a in plan.axes): x = x.flip(tuple(k for k, a in enumerate(plan.axes) if a.flip))
    if any((a.lo, a.hi) != (0, s) for a, s in zip(plan.axes, full_shape)):
      x = x.pad(tuple((a.lo, s - a.hi) for a, s in zip(plan.axes, full_shape)))
    return x

  # ---------------- the advanced part: one-hot selection ----------------
  def _linear_index(self, plan: _IndexPlan, op: str) -> tuple[Tensor, tuple[int, ...], int]:
    """The advanced indices broadcast together and flattened into one index over the advanced axes of the basic
    view (row-major), with -1 where any of them is out of range. Returns (index, broadcast shape, positions)."""
    sizes = [plan.view_shape[d] for d in plan.adv_dims]
    try: bshape = broadcast_shape(op, *(t.shape for t in plan.adv_index))
    except ValueError:
      raise TensorIndexError(f"{op}: index shapes {', '.join(fmt(t.shape) for t in plan.adv_index)} cannot be "
                             f"broadcast together{where()}") from None
    count = prod(sizes)
    idx_dtype = dtypes.int32 if count <= _INT32_MAX else dtypes.int64
    flat, valid = None, None
    for t, size, checked in zip(plan.adv_index, sizes, plan.adv_checked):
      t = t.cast(idx_dtype)
      if not checked:   # (host indices are wrapped and in range already; fewer ops lets the one-hot fuse)
        t = (t < 0).where(t + size, t)
        if len(sizes) > 1:   # one index out of range must not land on another valid position after flattening
          ok = (t >= 0) & (t < size)
          valid = ok if valid is None else valid & ok
      flat = t if flat is None else flat * size + t
    if valid is not None: flat = valid.where(flat, -1)
    return flat.expand(bshape), bshape, count

  def _adv_layout(self, plan: _IndexPlan) -> tuple[list[int], int]:
    """The view axes not indexed by advanced indices, and where the broadcast index axes go among them: in place
    when the advanced indices are adjacent, else first. Ints and 0-d index tensors are applied before, as in PyTorch,
    so they neither separate nor join the others."""
    dims = list(plan.adv_dims)
    rest = [d for d in range(len(plan.view_shape)) if d not in dims]
    shaped = [d for d, t in zip(dims, plan.adv_index) if t.ndim > 0]
    if not shaped: return rest, 0
    kept = [d for d in range(len(plan.view_shape)) if d not in dims or d in shaped]
    at = [kept.index(d) for d in shaped]
    return rest, at[0] if at == list(range(at[0], at[0] + len(at))) else 0

  def _take(self, plan: _IndexPlan, op: str) -> Tensor:
    """Advanced indexing of this basic view: out[b, rest] = x[index[b], rest], by a one-hot sum."""
    flat, bshape, count = self._linear_index(plan, op)
    rest, place = self._adv_layout(plan)
    rest_shape = tuple(self.shape[d] for d in rest)
    nb = len(bshape)
    source = self.permute(list(plan.adv_dims) + rest).reshape((1,) * nb + (count,) + rest_shape)
    # the comparison is made at the full (index, count, rest) shape: broadcasting a computed hit (the negative-index
    # wrap makes it costly) would make the scheduler store it as a (tokens, count) bool buffer
    full = bshape + (count,) + rest_shape
    ones = (1,) * len(rest)
    positions = self.arange(count, device=self.device).reshape((count,) + ones)
    hit = flat.reshape(bshape + (1,) + ones).expand(full) == positions
    picked = hit.where(source, 0).sum(nb).cast(self.dtype)
    order = [nb + k for k in range(place)] + list(range(nb)) + [nb + k for k in range(place, len(rest))]
    return picked.permute(order)

  # ---------------- getitem ----------------
  def __getitem__(self, index) -> Tensor:
    """Index like PyTorch: ints, slices (any step), None, Ellipsis, int tensors/lists and bool masks, mixed freely.

    Int tensors and lists broadcast together; their axes replace the indexed axes in place when the advanced indices
    are adjacent, else they go first (ints count as applied beforehand, as in PyTorch). Negative entries wrap. List
    entries out of range raise; out-of-range tensor entries give 0 (checking them would need the data). Advanced
    indexing is a one-hot comparison with `arange` and a sum: lazy, fusable and differentiable, costing
    O(result size x indexed positions). A bool mask (tensor or list) realizes the mask to find its true positions,
    so it synchronizes with the device; the selected values stay lazy and differentiable.

    >>> t = Tensor.arange(12).reshape(3, 4)
    >>> t[1].tolist()
    [4, 5, 6, 7]
    >>> t[-1, 1:3].tolist()
    [9, 10]
    >>> t[:, ::-2].tolist()
    [[3, 1], [7, 5], [11, 9]]
    >>> t[[2, 0], [1, 3]].tolist()
    [9, 3]
    >>> t[t % 5 == 0].tolist()
    [0, 5, 10]
    """
    plan = self._index_plan(index, "getitem")
    view = self._basic_view(plan)
    return view._take(plan, "getitem") if plan.adv_dims else view

  # ---------------- setitem ----------------
  def __setitem__(self, index, value) -> None:
    """Write `value` (a Tensor, scalar or list; broadcast, cast to this dtype) into the indexed elements.

    Every index form of __getitem__ works. The whole new tensor is computed (`mask.where(value, self)`) and this
    tensor takes it: a realized tensor is overwritten in its buffer right away (one kernel, like tinygrad), so lazy
    views taken from it earlier read the new values as in PyTorch; an unrealized tensor just gets the new graph, so
    views taken from it earlier keep the old values. A view of a realized buffer (`t.T[0] = v`, `t[1:][::2] = v`)
    is written through to that buffer, as `assign` writes through views (reshape, slices, permute, flip).
    With repeated advanced indices the last write wins (NumPy's rule; PyTorch leaves it unspecified). Setting into a
    tensor that requires grad raises NotImplementedError, as in tinygrad, except for an unrealized computed tensor,
    whose new graph differentiates like PyTorch's in-place write into a non-leaf.

    >>> t = Tensor.zeros(2, 3, dtype="int32")
    >>> t[0, 1:] = 7
    >>> t[[1, 1], [0, 2]] = Tensor([5, 6])
    >>> t.tolist()
    [[0, 7, 7], [5, 0, 6]]
    """
    # a file: write the indexed bytes through (a byte range, as tinygrad)
    if type(self.device) is str and self.device.startswith("DISK"):
      self[index].assign(value)
      return
    target = self.uop.src[0] if self.uop.op is Ops.ASSIGN else self.uop
    realized = target.base.op is Ops.BUFFER
    # a lazy computed tensor just takes a new graph, which differentiates (as a non-leaf in PyTorch); a leaf or a
    # buffer would lose its place in the graph
    if self._requires_grad or (realized and self.requires_grad):
      raise NotImplementedError(f"setitem: writing into a tensor that requires grad is not supported{where()}")
    value = self._setitem_value(value)
    plan = self._index_plan(index, "setitem")
    if plan.adv_dims:
      view = self._basic_view(plan)
      new_view, written = view._put(plan, value)
      if new_view is None: return   # the index selects no element
    else:
      new_view, written = _broadcast_value(value, plan.view_shape), None
    if written is None: written = self.full(plan.view_shape, True, device=self.device, dtype=dtypes.bool)
    new = written._unbasic(plan, self.shape).where(new_view._unbasic(plan, self.shape), self)
    self.assign(new)
    if realized: self.realize()

  def _setitem_value(self, value) -> Tensor:
    """`value` as a tensor of this dtype on this device."""
    if isinstance(value, type(self)):
      if value.device != self.device:
        raise RuntimeError(f"setitem: value on {value.device} but the target is on {self.device}{where()}")
    elif isinstance(value, (bool, int, float, np.generic)):
      value = self.full((), value.item() if isinstance(value, np.generic) else value, device=self.device)
    elif isinstance(value, (list, tuple, np.ndarray)): value = type(self)(value, device=self.device)
    else: raise TypeError(f"setitem: cannot set a value of type {type(value).__name__}{where()}")
    return value.cast(self.dtype)

  def _put(self, plan: _IndexPlan, value: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Advanced setitem on this basic view: the new view values and the mask of written elements (last write wins)."""
    flat, bshape, count = self._linear_index(plan, "setitem")
    rest, place = self._adv_layout(plan)
    rest_shape = tuple(self.shape[d] for d in rest)
    nb = len(bshape)
    result_shape = rest_shape[:place] + bshape + rest_shape[place:]
    value = _broadcast_value(value, result_shape)
    total = prod(bshape)
    if total == 0 or count == 0 or prod(rest_shape) == 0: return None, None
    # value axes as (broadcast index axes, rest axes), the index axes flattened
    order = list(range(place, place + nb)) + list(range(place)) + list(range(place + nb, len(result_shape)))
    value = value.permute(order).reshape((total, 1) + rest_shape)
    hit = flat.reshape(total, 1) == self.arange(count, device=self.device).reshape(1, count)      # (total, count)
    writer = self.arange(1, total + 1, device=self.device).reshape(total, 1)
    last = hit.where(writer, 0).max(0)                    # per position: 1 + the last index entry hitting it, or 0
    chosen = hit & (writer == last.reshape(1, count))
    values = chosen.reshape((total, count) + (1,) * len(rest)).where(value, 0).sum(0).cast(self.dtype)
    written = (last > 0).reshape((count,) + (1,) * len(rest)).expand((count,) + rest_shape)
    # (advanced positions, rest) back to the view's axis order
    adv_sizes = tuple(plan.view_shape[d] for d in plan.adv_dims)
    back = list(np.argsort(list(plan.adv_dims) + rest))
    return (values.reshape(adv_sizes + rest_shape).permute(back), written.reshape(adv_sizes + rest_shape).permute(back))

  # ---------------- gather / scatter ----------------
  def _check_index_tensor(self, index, op: str) -> None:
    if not isinstance(index, type(self)):
      raise TypeError(f"{op}: index must be a Tensor, got {type(index).__name__}{where()}")
    if not dtypes.is_int(index.dtype):
      raise UnsupportedError(f"{op}: index must have an int dtype, got {index.dtype}{where()}")
    if index.ndim != self.ndim:
      raise TensorValueError(f"{op}: index of shape {fmt(index.shape)} needs as many dimensions as the tensor of shape "
                             f"{fmt(self.shape)}{where()}")

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """Values along `dim` picked by `index`: out[i][j] = self[index[i][j]][j] for dim=0 (like torch.gather).

    `index` has this tensor's number of dimensions and is no larger than it on the other axes. Out-of-range
    entries give 0 (not checked, to stay lazy).

    >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[0, 0], [1, 0]])).tolist()
    [[1, 1], [4, 3]]
    """
    dim = self._axis(dim, "gather")
    self._check_index_tensor(index, "gather")
    if self.ndim == 0: return self.reshape(1).gather(0, index.reshape(1)).reshape(())
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
      raise TensorValueError(f"gather: index of shape {fmt(index.shape)} is larger than the tensor of shape "
                             f"{fmt(self.shape)} outside dim {dim}{where()}")
    index, size = index.to(self.device), self.shape[dim]
    x = self.shrink(tuple((0, s) if d == dim else (0, i) for d, (i, s) in enumerate(zip(index.shape, self.shape))))
    source = x.unsqueeze(-1).transpose(dim, -1)             # the gathered axis moved last, a 1 in its place
    hit = index.unsqueeze(-1) == self.arange(size, device=self.device)
    return hit.where(source, 0).sum(-1).cast(self.dtype)

  def _scatter_hits(self, dim: int, index: Tensor, src, op: str) -> tuple[int, Tensor, Tensor]:
    """Checked arguments as (dim, one-hot hits of shape index.shape + (size,), src cut to index.shape + (1,))."""
    dim = self._axis(dim, op)
    self._check_index_tensor(index, op)
    if not isinstance(src, type(self)): src = self.full(index.shape, src, device=self.device).cast(self.dtype)
    elif src.dtype != self.dtype:
      raise RuntimeError(f"{op}: src dtype {src.dtype} differs from the tensor's {self.dtype}{where()}")
    if src.ndim != self.ndim:
      raise TensorValueError(f"{op}: src of shape {fmt(src.shape)} needs {self.ndim} dimensions{where()}")
    if any(i > s or (d != dim and i > t) for d, (i, s, t) in enumerate(zip(index.shape, src.shape, self.shape))):
      raise TensorValueError(f"{op}: index of shape {fmt(index.shape)} must fit in src {fmt(src.shape)} and, outside dim "
                             f"{dim}, in the tensor {fmt(self.shape)}{where()}")
    index, src = index.to(self.device), src.to(self.device)
    src = src.shrink(tuple((0, i) for i in index.shape)).unsqueeze(-1)
    hit = index.unsqueeze(-1) == self.arange(self.shape[dim], device=self.device)
    return dim, hit, src

  def _to_scatter_target(self, dim: int, target_shape: tuple[int, ...]) -> Tensor:
    """A reduced (..., 1 at dim, ..., size) tensor laid out as the scatter target: size moved to dim, others padded."""
    x = self.transpose(dim, -1).squeeze(-1)
    return x.pad(tuple((0, 0) if d == dim else (0, t - s) for d, (s, t) in enumerate(zip(x.shape, target_shape))))

  def scatter(self, dim: int, index: Tensor, src, reduce: str | None = None) -> Tensor:
    """A copy with `src` written at `index` along `dim`: out[index[i][j]][j] = src[i][j] for dim=0 (torch.scatter).

    `src` is a tensor of this dtype or a scalar. `reduce` 'add' or 'multiply' combines instead of overwriting
    (as scatter_reduce 'sum'/'prod' with include_self). With repeated indices and no reduce the last write wins.

    >>> Tensor.zeros(3, dtype="int32").scatter(0, Tensor([2, 0]), Tensor([7, 8], dtype="int32")).tolist()
    [8, 0, 7]
    >>> Tensor.ones(3).scatter(0, Tensor([1, 1]), 2.0, reduce="add").tolist()
    [1.0, 5.0, 1.0]
    """
    if reduce not in (None, "add", "multiply"):
      raise TensorValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}{where()}")
    if reduce is not None: return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
    if self.ndim == 0: return self.reshape(1).scatter(0, index.reshape(1), src if not isinstance(src, type(self)) else
                                                      src.reshape(1)).reshape(())
    dim, hit, src = self._scatter_hits(dim, index, src, "scatter")
    if index.numel() == 0: return self
    # among entries hitting one position, keep the one furthest along dim
    writer = self.arange(1, index.shape[dim] + 1, device=self.device).reshape((-1,) + (1,) * (self.ndim - dim))
    last = hit.where(writer, 0).max(dim, keepdim=True)
    chosen = hit & (writer == last)
    values = chosen.where(src, 0).sum(dim, keepdim=True).cast(self.dtype)._to_scatter_target(dim, self.shape)
    written = (last > 0)._to_scatter_target(dim, self.shape)
    return written.where(values, self)

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
    """Combine `src` into a copy at `index` along `dim` with `reduce`: 'sum', 'prod', 'mean', 'amax' or 'amin'.

    As torch.scatter_reduce: positions no index hits keep their value; with `include_self` the tensor's own value
    takes part in the reduction. 'mean' of ints rounds down, as in PyTorch.

    >>> Tensor([1, 2, 3]).scatter_reduce(0, Tensor([0, 0, 2]), Tensor([4, 5, 6]), "sum").tolist()
    [10, 2, 9]
    >>> Tensor([1.0, 2.0]).scatter_reduce(0, Tensor([1, 1]), Tensor([4.0, 6.0]), "mean", include_self=False).tolist()
    [1.0, 5.0]
    """
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise TensorValueError(f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', "
                             f"got {reduce!r}{where()}")
    if self.ndim == 0:
      src = src.reshape(1) if isinstance(src, type(self)) else src
      return self.reshape(1).scatter_reduce(0, index.reshape(1), src, reduce, include_self).reshape(())
    dim, hit, src = self._scatter_hits(dim, index, src, "scatter_reduce")
    if index.numel() == 0: return self
    def reduced(fill, fn) -> Tensor: return fn(hit.where(src, fill), dim)._to_scatter_target(dim, self.shape)
    written = hit.any(dim, keepdim=True)._to_scatter_target(dim, self.shape)
    if reduce in ("sum", "mean"):
      total = reduced(0, lambda x, d: x.sum(d, keepdim=True)).cast(self.dtype)
      if reduce == "sum": out = self + total if include_self else total
      else:
        count = hit.sum(dim, keepdim=True)._to_scatter_target(dim, self.shape)
        if include_self: total, count = total + self, count + 1
        out = total / count.cast(self.dtype) if dtypes.is_float(self.dtype) else total // count.cast(self.dtype)
    elif reduce == "prod":
      total = reduced(1, lambda x, d: x.prod(d, keepdim=True)).cast(self.dtype)
      out = self * total if include_self else total
    else:
      fill = dtypes.min(self.dtype) if reduce == "amax" else dtypes.max(self.dtype)
      best = reduced(fill, lambda x, d: x.max(d, keepdim=True) if reduce == "amax" else x.min(d, keepdim=True))
      out = (self.maximum(best) if reduce == "amax" else self.minimum(best)) if include_self else best
    return written.where(out.cast(self.dtype), self)

  # ---------------- masks ----------------
  def masked_fill(self, mask: Tensor, value) -> Tensor:
    """This tensor with `value` (a scalar or a tensor, cast to this dtype) where `mask` is true.

    >>> Tensor([1, 2, 3]).masked_fill(Tensor([True, False, True]), 0).tolist()
    [0, 2, 0]
    """
    if not isinstance(mask, type(self)) or mask.dtype != dtypes.bool:
      raise UnsupportedError(f"masked_fill: mask must be a bool Tensor, got {_describe(mask)}{where()}")
    if broadcast_shape("masked_fill", self.shape, mask.shape) != self.shape:
      raise TensorValueError(f"masked_fill: mask of shape {fmt(mask.shape)} does not broadcast to {fmt(self.shape)}{where()}")
    if isinstance(value, type(self)):
      value = value.cast(self.dtype)
      if broadcast_shape("masked_fill", self.shape, value.shape) != self.shape:
        raise TensorValueError(f"masked_fill: value of shape {fmt(value.shape)} does not broadcast to "
                               f"{fmt(self.shape)}{where()}")
    else: value = self.full((), value, device=self.device).cast(self.dtype)
    return mask.where(value, self)

  def masked_select(self, mask: Tensor) -> Tensor:
    """The elements where `mask` (broadcast with this tensor) is true, as a 1-d tensor in row-major order.

    The output size depends on the mask's values, so the mask is realized: this synchronizes with the device. The
    selected values stay lazy and differentiable.

    >>> Tensor([[1, 2], [3, 4]]).masked_select(Tensor([[True, False], [False, True]])).tolist()
    [1, 4]
    """
    if not isinstance(mask, type(self)) or mask.dtype != dtypes.bool:
      raise UnsupportedError(f"masked_select: mask must be a bool Tensor, got {_describe(mask)}{where()}")
    shape = broadcast_shape("masked_select", self.shape, mask.shape)
    x = self.expand(shape) if shape != self.shape else self
    return x.flatten()[mask.expand(shape).flatten()]

  def nonzero(self, as_tuple: bool = False) -> Tensor | tuple[Tensor, ...]:
    """The indices of the nonzero elements as an int64 tensor of shape (count, ndim), like torch.nonzero.

    With `as_tuple`, one 1-d int64 tensor per axis instead (as torch.nonzero(as_tuple=True)). The output size
    depends on the values, so this realizes the tensor: it synchronizes with the device.

    >>> Tensor([[0, 3], [5, 0]]).nonzero().tolist()
    [[0, 1], [1, 0]]
    """
    host = self.numpy()
    if as_tuple:
      return tuple(type(self)(p.astype(np.int64), device=self.device) for p in np.nonzero(np.atleast_1d(host)))
    positions = np.argwhere(host).astype(np.int64)
    return type(self)(positions.reshape(positions.shape[0], host.ndim), device=self.device)

def _describe(value) -> str:
  """A tensor's dtype, or a non-tensor's type name, for error messages."""
  return str(getattr(value, "dtype", type(value).__name__))

def _slice_axis(index: slice, size: int) -> _Axis:
  """The elements a slice keeps of an axis of `size`, as [lo, hi) taken every step (from the end if reversed)."""
  start, stop, step = index.indices(size)
  if step > 0:
    count = max(0, -(-(stop - start) // step))
    lo = start
  else:
    count = max(0, -(-(start - stop) // -step))
    lo = start + (count - 1) * step if count else 0
  span = (count - 1) * abs(step) + 1 if count else 0
  return _Axis(lo, lo + span, abs(step), step < 0, count)

def _symbolic_axis(index: slice, size, axis: int, op: str) -> _Axis:
  """A slice over bound Variables (or of an axis of symbolic size): step 1, no clamping; negative int ends count
  from the end. The shrink it becomes checks that it fits for every value of the Variables."""
  if index.step not in (None, 1):
    raise TensorIndexError(f"{op}: a slice with bound Variables on axis {axis} must have step 1, got {index.step}"
                           f"{where()}")
  def end(x, default):
    if x is None: return default
    if isinstance(x, UOp): return ssimplify(x)
    x = int(x)
    return ssimplify(size + x) if x < 0 else x
  lo, hi = end(index.start, 0), end(index.stop, size)
  if sint_min(lo) < 0 or sint_min(ssub(hi, lo)) < 0 or sint_min(ssub(size, hi)) < 0:
    raise TensorIndexError(f"{op}: slice [{sint_str(lo)}:{sint_str(hi)}] does not fit axis {axis} of size "
                           f"{sint_str(size)} for every value of its Variables (0 <= start <= stop <= size must "
                           f"hold over each Variable's [min, max]){where()}")
  return _Axis(lo, hi, 1, False, ssub(hi, lo))

def _host_index_array(item, op: str) -> np.ndarray:
  """A list/tuple/array index as an int or bool numpy array (an empty list is an empty int index)."""
  try: arr = np.array(item)
  except ValueError: raise TensorIndexError(f"{op}: ragged nested lists cannot be an index{where()}") from None
  if arr.dtype == object or arr.dtype.kind not in "biuf":
    raise TypeError(f"{op}: index {item!r} must hold only ints or bools{where()}")
  if arr.size == 0: return arr.astype(np.int64)
  if arr.dtype.kind == "f": raise TensorIndexError(f"{op}: index {item!r} holds non-integer values{where()}")
  return arr

def _broadcast_value(value: Tensor, shape: tuple[int, ...]) -> Tensor:
  """`value` broadcast to the indexed `shape` for setitem (extra leading size-1 axes dropped, as in PyTorch)."""
  while value.ndim > len(shape) and value.shape[0] == 1: value = value.reshape(value.shape[1:])
  padded = (1,) * (len(shape) - value.ndim) + value.shape
  if value.ndim > len(shape) or any(v != s and v != 1 for v, s in zip(padded, shape)):
    raise TensorValueError(f"setitem: value of shape {fmt(value.shape)} cannot be broadcast to the indexed shape "
                           f"{fmt(shape)}{where()}")
  return value.reshape(padded).expand(shape)
