"""Sorting: sort, argsort and topk as data-independent sorting networks of tensor ops."""
from __future__ import annotations
from typing import TYPE_CHECKING
from kiln.dtype import dtypes
from kiln.mixin.common import TensorValueError, where, fmt
if TYPE_CHECKING: from kiln.tensor import Tensor

class SortMixin:
  __slots__ = ()
  def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """Sort along `dim`, returning (values, int32 indices); ties keep their original order and NaN sorts largest.

    A bitonic sorting network: log2(n)*(log2(n)+1)/2 compare-exchange stages, each one kernel, whatever the data.

    >>> values, indices = Tensor([3, 1, 2, 1]).sort()
    >>> values.tolist(), indices.tolist()
    ([1, 1, 2, 3], [1, 3, 2, 0])
    >>> Tensor([[0.5, -1.0, 2.0]]).sort(dim=1, descending=True)[0].tolist()
    [[2.0, 0.5, -1.0]]
    """
    axis = self._axis(dim, "sort")
    if self.ndim == 0:   # a 0-d tensor is its own sort, as in PyTorch
      return self, self.full((), 0, device=self.device, dtype=dtypes.int32)
    n = self.shape[axis]
    if n <= 1: return self, self.full(self.shape, 0, device=self.device, dtype=dtypes.int32)
    # sort the last axis of a (rows, n) view, then put the axis back where it was
    order = tuple(a for a in range(self.ndim) if a != axis) + (axis,)
    moved = self.permute(order)
    rows = moved.reshape(-1, n)
    values, indices = _bitonic_sort_rows(rows, descending)
    inverse = tuple(order.index(a) for a in range(self.ndim))
    return values.reshape(moved.shape).permute(inverse), indices.reshape(moved.shape).permute(inverse)

  def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
    """Indices (int32) that sort this tensor along `dim`; ties keep their original order.

    >>> Tensor([[2, 3, 1], [1, 4, 3]]).argsort().tolist()
    [[2, 0, 1], [0, 2, 1]]
    """
    return self.sort(self._axis(dim, "argsort"), descending)[1]

  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
    """The `k` largest (or smallest) elements along `dim` and their int32 indices, in sorted order.

    `sorted_=False` is accepted and also returns them sorted (PyTorch leaves that order unspecified).

    >>> values, indices = Tensor([1.0, 5.0, 3.0, 4.0]).topk(2)
    >>> values.tolist(), indices.tolist()
    ([5.0, 4.0], [1, 3])
    """
    axis = self._axis(dim, "topk")
    n = self.shape[axis] if self.ndim else 1
    if not isinstance(k, int) or isinstance(k, bool):
      raise TypeError(f"topk: k must be an int, got {type(k).__name__}{where()}")
    if not 0 <= k <= n:
      raise TensorValueError(f"topk: k={k} is out of range for dim {dim} of size {n} (shape {fmt(self.shape)}){where()}")
    values, indices = self.sort(axis, descending=largest)
    if self.ndim == 0: return values, indices
    keep = tuple((0, k) if a == axis else None for a in range(self.ndim))
    return values.shrink(keep), indices.shrink(keep)

def _bitonic_sort_rows(rows: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
  """Sort each row of a (rows, n) tensor with n >= 2: (values, int32 indices), stable."""
  n = rows.shape[1]
  size = 1 << (n - 1).bit_length()
  # bools compare as 0/1 ints; the result is cast back at the end
  keys = rows.cast(dtypes.uint8) if rows.dtype == dtypes.bool else rows
  is_float = dtypes.is_float(keys.dtype)
  # padding must sort after every real element: it ties with the extreme real values at most (never beats them,
  # since NaN is the largest float) and then loses the tie on its larger index
  if descending: fill = -float("inf") if is_float else dtypes.min(keys.dtype)
  else: fill = float("nan") if is_float else dtypes.max(keys.dtype)
  if size != n: keys = keys.pad(((0, 0), (0, size - n)), value=fill)
  index = rows.arange(size, device=rows.device, dtype=dtypes.int32).reshape(1, size).expand(keys.shape[0], size)
  block = 2
  while block <= size:
    # first a mirror stage (element i of each block meets element block-1-i), then half-cleaners of shrinking stride;
    # together they merge sorted halves without direction flags (a bitonic merge written in one direction)
    keys, index = _compare_exchange(keys, index, block // 2, True, descending, is_float)
    stride = block // 4
    while stride >= 1:
      keys, index = _compare_exchange(keys, index, stride, False, descending, is_float)
      stride //= 2
    block *= 2
  values = keys.shrink(((0, keys.shape[0]), (0, n)))
  if rows.dtype == dtypes.bool: values = values.cast(dtypes.bool)
  return values, index.shrink(((0, keys.shape[0]), (0, n)))

def _compare_exchange(keys: Tensor, index: Tensor, half: int, mirror: bool, descending: bool, is_float: bool):
  """One network stage over groups of 2*half elements: the lower half of each group keeps the element that sorts
  first of itself and its partner (the mirror image in the group, or the element `half` away), the upper half the
  other one. Realized here (both forward and backward) so the graph stays linear in the number of stages."""
  count, size = keys.shape
  shape = (count, size // (2 * half), 2, half)
  k, i = keys.reshape(shape), index.reshape(shape)
  flip_axes = (2, 3) if mirror else (2,)
  partner_k, partner_i = k.flip(flip_axes), i.flip(flip_axes)
  in_lower_half = (keys.arange(2, device=keys.device) == 0).reshape(2, 1)
  keep_own = _sorts_before(k, i, partner_k, partner_i, descending, is_float) == in_lower_half
  new_keys = keep_own.where(k, partner_k).reshape(count, size).contiguous().contiguous_backward()
  new_index = keep_own.where(i, partner_i).reshape(count, size).contiguous()
  return new_keys, new_index

def _sorts_before(a: Tensor, a_index: Tensor, b: Tensor, b_index: Tensor, descending: bool, is_float: bool) -> Tensor:
  """Whether element (a, a_index) comes before (b, b_index): by value (NaN largest), then by index (stable)."""
  a, b = a.detach(), b.detach()
  first, second = (b, a) if descending else (a, b)
  less = first < second
  equal = a == b
  if is_float:
    less = less | (second.isnan() & first.isnan().logical_not())
    equal = equal | (a.isnan() & b.isnan())
  return less | (equal & (a_index < b_index))
