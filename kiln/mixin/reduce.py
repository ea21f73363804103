"""Reductions beyond the core set: cumulative ops (cumsum, cumprod, cummax, logcumsumexp) and var_mean/std_mean.

A cumulative op ("scan") along an axis of n elements is built from reductions, so autograd needs no rule of its own:
- n <= 2 * _BLOCK: output i reduces the inputs j <= i of a lazily broadcast n x n triangle (one fused kernel, O(n^2)
  work, nothing n x n in memory);
- larger n: the axis is cut into blocks of _BLOCK; each block is scanned as above, the block totals are scanned the
  same way (recursively), and each block's result is combined with the total of all blocks before it. Work is about
  n * _BLOCK, so n = 10,000 costs under a million operations per row.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Callable
from kiln.dtype import dtypes
from kiln.gradient import custom_backward, custom_backward_rules
from kiln.uop.ops import UOp
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

_BLOCK = 64

def _identity(kind: str, dtype):
  """The value that leaves a partial result of `kind` unchanged."""
  if kind == "sum": return 0
  if kind == "prod": return 1
  if kind == "max": return -math.inf if dtypes.is_float(dtype) else dtypes.min(dtype)
  return -math.inf

def _logaddexp(a: Tensor, b: Tensor) -> Tensor:
  """log(exp(a) + exp(b)) without overflow (and -inf when both are -inf)."""
  top = a.maximum(b).detach()
  top = top.isinf().where(0.0, top)
  return ((a - top).exp() + (b - top).exp()).log() + top

def _combine(kind: str, before: Tensor, local: Tensor) -> Tensor:
  """The scan of everything up to an element from the scan of the blocks before it and the scan within its block."""
  if kind == "sum": return before + local
  if kind == "prod": return before * local
  if kind == "max": return before.maximum(local)
  return _logaddexp(before, local)

def _cumsum_backward(grad: UOp, node: UOp) -> tuple[UOp]:
  """The gradient of a running sum: each input adds to every output at or after it, so its gradient is the running
  sum of the output's gradient taken from the end (a CUSTOM_BACKWARD rule). Through the scan's own graph, autograd
  sums each block's triangle again: measured on a 1024x1024 cumsum (2-core EPYC), one 4.6 ms kernel against the
  forward's 0.15 ms."""
  from kiln.tensor import Tensor
  axis = node.arg[1]
  return (Tensor._wrap(grad, "cumsum backward").flip(axis).cumsum(axis).flip(axis).uop,)

custom_backward_rules["cumsum"] = _cumsum_backward


class ReduceMixin:
  __slots__ = ()

  def _in_float32_if_reduced(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn of this tensor, computed in float32 and rounded back to this dtype once when it is a half, bfloat16 or fp8
    float (a sum of 100,000 float16 exponentials is past float16's 65504); fn of this tensor itself otherwise."""
    if self.dtype not in dtypes.narrow_floats: return fn(self)
    return fn(self.cast(dtypes.float32)).cast(self.dtype)

  def var_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    """The variance (with Bessel's `correction`) and the mean over `axis`, like torch.var_mean.

    >>> var, mean = Tensor([1.0, 2.0, 3.0, 4.0]).var_mean()
    >>> round(var.item(), 4), mean.item()
    (1.6667, 2.5)
    """
    self._reduce_axes(axis, "var_mean")
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  def std_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    """The standard deviation (with Bessel's `correction`) and the mean over `axis`, like torch.std_mean.

    >>> std, mean = Tensor([2.0, 4.0]).std_mean(correction=0)
    >>> std.item(), mean.item()
    (1.0, 3.0)
    """
    self._reduce_axes(axis, "std_mean")
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  # ---------------- cumulative ops ----------------
  def cumsum(self, axis: int = 0) -> Tensor:
    """Running sum along `axis`. Accumulates like sum(): bools and small ints give int32; half floats sum in float32
    and keep their dtype.

    >>> Tensor([1, 2, 3, 4]).cumsum().tolist()
    [1, 3, 6, 10]
    >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).cumsum(1).tolist()
    [[1.0, 3.0], [3.0, 7.0]]
    """
    out_dtype = self.sum().dtype
    acc = dtypes.float32 if out_dtype in dtypes.narrow_floats else out_dtype
    out = self.cast(acc)._scan(axis, "sum", "cumsum").cast(out_dtype)
    if not dtypes.is_float(out_dtype) or self.ndim == 0: return out
    # its gradient is the reversed running sum of the output's gradient (_cumsum_backward)
    return type(self)._wrap(custom_backward(out.uop, (self.uop,), "cumsum", self._axis(axis, "cumsum")), "cumsum")

  def cumprod(self, axis: int) -> Tensor:
    """Running product along `axis` (gradients are exact with zeros in the input).

    >>> Tensor([1, 2, 3, 4]).cumprod(0).tolist()
    [1, 2, 6, 24]
    """
    out_dtype = self.prod().dtype
    acc = dtypes.float32 if out_dtype in dtypes.narrow_floats else out_dtype
    return self.cast(acc)._scan(axis, "prod", "cumprod").cast(out_dtype)

  def cummax(self, axis: int = 0) -> Tensor:
    """Running maximum along `axis` (NaN propagates). Returns the values only, as tinygrad does (PyTorch also returns
    indices); the gradient of tied maxima is shared among them.

    >>> Tensor([0, 1, -1, 2, -2]).cummax().tolist()
    [0, 1, 1, 2, 2]
    """
    return self._scan(axis, "max", "cummax")

  def logcumsumexp(self, axis: int = 0) -> Tensor:
    """Running log(sum(exp(x))) along `axis`, stable for large and -inf values (ints become floats).

    >>> [round(v, 4) for v in Tensor([0.0, 0.0, 1000.0]).logcumsumexp().tolist()]
    [0.0, 0.6931, 1000.0]
    """
    return self._in_float(lambda x: x._scan(axis, "logsumexp", "logcumsumexp"))

  def _scan(self, axis: int, kind: str, op: str) -> Tensor:
    """The inclusive scan of `kind` along `axis` (dtype unchanged)."""
    axis = self._axis(axis, op)
    if self.ndim == 0 or self.shape[axis] <= 1: return self
    last = self.ndim - 1
    x = self if axis == last else self.transpose(axis, last)
    out = x._scan_last(kind)
    return out if axis == last else out.transpose(axis, last)

  def _scan_last(self, kind: str) -> Tensor:
    """The inclusive scan along the last axis: directly when short, else in blocks (see the module docstring)."""
    n = self.shape[-1]
    if n <= 2 * _BLOCK: return self._scan_triangle(kind)
    outer, blocks = self.shape[:-1], -(-n // _BLOCK)
    keep = tuple((0, s) for s in outer)
    padded = self._pad_last(blocks * _BLOCK - n, _identity(kind, self.dtype))
    local = padded.reshape(*outer, blocks, _BLOCK)._scan_triangle(kind)
    totals = local.shrink(keep + ((0, blocks), (_BLOCK - 1, _BLOCK))).reshape(*outer, blocks)
    # the scan of all blocks before each block: the scan of the totals, shifted right by one
    before = totals._scan_last(kind)._pad_last(1, _identity(kind, self.dtype), front=True)
    before = before.shrink(keep + ((0, blocks),)).reshape(*outer, blocks, 1)
    out = _combine(kind, before, local).reshape(*outer, blocks * _BLOCK)
    return out.shrink(keep + ((0, n),))

  def _scan_triangle(self, kind: str) -> Tensor:
    """The inclusive scan along the last axis as reductions over the triangle j <= i of a broadcast n x n view."""
    n = self.shape[-1]
    rows = self.reshape(*self.shape[:-1], 1, n).expand(*self.shape[:-1], n, n)   # rows[..., i, j] = x[..., j]
    upto = self.arange(n, device=self.device).reshape(n, 1) >= self.arange(n, device=self.device).reshape(1, n)
    fill = _identity(kind, self.dtype)
    if kind == "sum": return upto.where(rows, fill).sum(-1, dtype=self.dtype)
    if kind == "prod": return upto.where(rows, fill).prod(-1, dtype=self.dtype)
    if kind == "max": return upto.where(rows, fill).max(-1)
    # logsumexp of each prefix, shifted by the running max so no exp overflows
    top = upto.where(rows, fill).max(-1, keepdim=True).detach()
    top = top.isinf().where(0.0, top)
    return upto.where(rows - top, -math.inf).exp().sum(-1).log() + top.reshape(self.shape)

  def _pad_last(self, count: int, value, front: bool = False) -> Tensor:
    """This tensor with `count` copies of `value` added at the end (or the front) of the last axis."""
    if count == 0: return self
    widths = ((0, 0),) * (self.ndim - 1) + (((count, 0) if front else (0, count)),)
    padded = self._wrap(self.uop.pad(widths), "pad")
    if value == 0: return padded
    inside = self._wrap(self.full(self.shape, True, device=self.device).uop.pad(widths), "pad")
    return inside.where(padded, value)
