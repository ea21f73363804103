"""Tensors over several devices: shard, shard_ and the multi-device cases of creation and reading values.

The layout rules and the rewrite into per-device graphs are in kiln/schedule/multi.py; docs/multi.md explains them.
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Sequence
from kiln.uop.ops import UOp
from kiln.schedule import multi as _multi
from kiln.mixin.common import canonical_device, where

if TYPE_CHECKING:
  from kiln.tensor import Tensor

def device_tuple(devices: Sequence[str] | str, op: str) -> tuple[str, ...]:
  """`devices` as a tuple of distinct canonical names (one name is a tuple of one)."""
  if isinstance(devices, str): devices = (devices,)
  if not isinstance(devices, (tuple, list)) or not devices:
    raise TypeError(f"{op}: devices must be a tuple of device names, got {devices!r}{where()}")
  names = canonical_device(tuple(devices))
  return names if isinstance(names, tuple) else (names,)

class MultiMixin:
  """Multi-device methods of Tensor."""

  def shard(self: Tensor, devices: Sequence[str], axis: int | None = None, splits: Sequence[int] | None = None) -> Tensor:
    """This tensor over `devices`: a replica on each (axis None) or sliced along `axis`, the slices in device order.
    Slices are equal, ceil(size / len(devices)) long with the last ones shorter, unless `splits` gives their sizes.

    >>> from kiln import Tensor
    >>> t = Tensor.arange(10).shard(("CPU:1", "CPU:2"), axis=0)
    >>> t.device, [s.shape for s in t.uop.src], t.sum().item()
    (('CPU:1', 'CPU:2'), [(5,), (5,)], 45)
    """
    from kiln.tensor import Tensor
    names = device_tuple(devices, "shard")
    if _multi.is_multi_device(self.device):
      raise RuntimeError(f"shard: the tensor is on several devices already, {self.device}; gather it with "
                         f".to(device) first{where()}")
    x = self.uop
    if axis is None:
      if splits is not None: raise TypeError(f"shard: splits need an axis{where()}")
      node = _multi.multi([x if x.device == d else x.copy_to(d) for d in names], None)
    else:
      axis = self._axis(axis, "shard")
      try: bounds = _multi.shard_bounds(self.shape[axis], len(names), tuple(splits) if splits is not None else None)
      except ValueError as e: raise ValueError(f"{e}{where()}") from None
      windows = [tuple(b if k == axis else (0, n) for k, n in enumerate(self.shape)) for b in bounds]
      node = _multi.multi([_shard_on(x.shrink(w), d) for w, d in zip(windows, names)], axis)
    out = Tensor._wrap(node, "shard")
    if self.requires_grad is not None: out.requires_grad = self.requires_grad   # a leaf of its own, as in tinygrad
    return out

  def shard_(self: Tensor, devices: Sequence[str], axis: int | None = None, splits: Sequence[int] | None = None) -> Tensor:
    """Shard this tensor in place (see `shard`)."""
    self.uop = self.shard(devices, axis, splits).uop
    return self

  def _multi_like(self: Tensor, make, requires_grad: bool | None = None) -> Tensor:
    """A new tensor laid out as this one over its devices, each part made by `make(shape, device)` (a replicated
    value is made once, on the first device, and copied: replicas stand for one value)."""
    from kiln.tensor import Tensor
    layout = _multi.lower(self.uop)
    if layout.arg is None: out = make(self.shape, self.device[0]).to(self.device)
    else: out = Tensor(_multi.multi([make(s.shape, s.device).uop for s in layout.src], layout.arg))
    if requires_grad is not None: out.requires_grad = requires_grad
    return out

  def _gathered(self: Tensor) -> Tensor:
    """This tensor's whole value on its first device (itself if it is on one device)."""
    return self.to(self.device[0]) if _multi.is_multi_device(self.device) else self

def _shard_on(x: UOp, device: str) -> UOp:
  """`x` (a slice) on `device`: copied there unless it is there already."""
  return x if x.device == device else x.copy_to(device)
