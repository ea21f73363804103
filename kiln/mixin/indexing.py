"""Indexing: __getitem__ in all its forms, __setitem__, gather/scatter and masked selection."""
from __future__ import annotations
from typing import TYPE_CHECKING
import numpy as np
from kiln.dtype import dtypes
from kiln.mixin.common import TensorIndexError, where, fmt
if TYPE_CHECKING: from kiln.tensor import Tensor

class IndexingMixin:
  __slots__ = ()
  def __getitem__(self, index) -> Tensor:
    """Indexing with ints, slices (any step), None and Ellipsis, or one int list/tensor index beside slices.

    >>> t = Tensor.arange(12).reshape(3, 4)
    >>> t[1].tolist()
    [4, 5, 6, 7]
    >>> t[-1, 1:3].tolist()
    [9, 10]
    >>> t[:, ::2].tolist()
    [[0, 2], [4, 6], [8, 10]]
    >>> t[[2, 0], 0].tolist()
    [8, 0]
    """
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (type(self), list)) for i in index):
      return self._fancy_getitem(index)
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if sum(1 for i in index if i is Ellipsis) > 1: raise TensorIndexError(f"getitem: more than one Ellipsis{where()}")
    if n_real > self.ndim:
      raise TensorIndexError(f"getitem: too many indices ({n_real}) for a tensor of shape {fmt(self.shape)}{where()}")
    if Ellipsis in index:
      at = index.index(Ellipsis)
      index = index[:at] + (slice(None),) * (self.ndim - n_real) + index[at + 1:]
    else: index = index + (slice(None),) * (self.ndim - n_real)
    x, axis, out_shape = self, 0, []
    bounds, flips, strides, keep = [], [], [], []
    for i in index:
      if i is None:
        out_shape.append(1)
        continue
      size = self.shape[axis]
      if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
        i = int(i)
        if not -size <= i < size:
          raise TensorIndexError(f"getitem: index {i} is out of range for axis {axis} of size {size} "
                                 f"(shape {fmt(self.shape)}){where()}")
        i = i + size if i < 0 else i
        bounds.append((i, i + 1)); flips.append(False); strides.append(1); keep.append(False)
      elif isinstance(i, slice):
        start, stop, step = i.indices(size)
        if step > 0: count = max(0, -(-(stop - start) // step)); lo = start
        else: count = max(0, -(-(start - stop) // -step)); lo = start + (count - 1) * step if count else 0
        span = (count - 1) * abs(step) + 1 if count else 0
        bounds.append((lo, lo + span)); flips.append(step < 0); strides.append(abs(step)); keep.append(True)
        out_shape.append(count)
      else:
        raise TypeError(f"getitem: unsupported index {i!r} of type {type(i).__name__}{where()}")
      axis += 1
    x = x.shrink(bounds)
    if any(flips): x = x.flip(tuple(a for a, f in enumerate(flips) if f))
    if any(s > 1 for s in strides):
      # take every s-th element: pad each strided axis to a multiple of s, split it, keep the first of each group
      padded = x.pad(tuple((0, (-n) % s if n else 0) for n, s in zip(x.shape, strides)))
      split_shape = []
      for n, s in zip(padded.shape, strides): split_shape += [n // s, s]
      x = padded.reshape(split_shape).shrink(tuple(b for n, s in zip(padded.shape, strides) for b in ((0, n // s), (0, 1))))
    return x.reshape(tuple(out_shape))
  def _fancy_getitem(self, index) -> Tensor:
    """Integer-tensor indexing on one axis: `t[idx]`, `t[:, idx]` (via one-hot sums)."""
    positions = [k for k, i in enumerate(index) if isinstance(i, (type(self), list))]
    if len(positions) != 1 or any(i is None or i is Ellipsis for i in index):
      raise NotImplementedError("getitem: only one tensor/list index together with slices is supported so far")
    axis = positions[0]
    if isinstance(index[axis], list):
      size = self.shape[axis] if axis < self.ndim else 0
      bad = [i for i in np.array(index[axis]).reshape(-1).tolist() if not -size <= i < size]
      if bad: raise TensorIndexError(f"getitem: index {bad[0]} is out of range for axis {axis} of size {size} "
                                     f"(shape {fmt(self.shape)}){where()}")
    idx = index[axis] if isinstance(index[axis], type(self)) else type(self)(index[axis], device=self.device, dtype=dtypes.int32)
    rest = self[tuple(slice(None) if k == axis else i for k, i in enumerate(index))]
    size = rest.shape[axis]
    idx = (idx < 0).where(idx + size, idx)
    one_hot = idx.unsqueeze(-1) == self.arange(size, device=self.device)                 # idx.shape + (size,)
    moved = rest.permute((axis,) + tuple(a for a in range(rest.ndim) if a != axis))        # (size, *others)
    expanded = moved.reshape((1,) * idx.ndim + moved.shape)
    weights = one_hot.reshape(one_hot.shape + (1,) * (moved.ndim - 1))
    picked = (weights.where(expanded, 0)).sum(idx.ndim)
    order = list(range(idx.ndim, picked.ndim))
    out = picked.permute(order[:axis] + list(range(idx.ndim)) + order[axis:])
    return out.cast(self.dtype)
  def masked_fill(self, mask: Tensor, value) -> Tensor:
    """`value` where `mask` is true, else this tensor's values."""
    return mask.where(value, self)

  # unary math
