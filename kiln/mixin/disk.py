"""DISK tensors at the Tensor level: bitcasts and assigns that read or write a file's bytes in place (the DISK device,
kiln/runtime/ops_disk.py, knows buffers and byte ranges; this module knows tensors)."""
from __future__ import annotations
from kiln.dtype import DType, dtypes
from kiln.device import Buffer
from kiln.uop.ops import Ops
from kiln.uop.pattern import substitute
from kiln.runtime.ops_disk import byte_range, disk_op_error, is_disk, view_node, views_of

def _byte_range_of_written(t) -> tuple[Buffer, int, int] | None:
  """`byte_range` of the DISK tensor `t`. A view of a file tensor not written yet (`x.to("disk:f")[0:2]`) gets the
  file written first, as tinygrad does: the tensor that owns the copy is realized and `t` reads its buffer."""
  found = byte_range(t.uop)
  base = t.uop.base
  if found is None and base.op is not Ops.BUFFER and is_disk(base.device):
    from kiln.tensor import _live_tensors   # (imported late: kiln.tensor imports this module's users)
    owner = next((o for o in _live_tensors if o.uop is base), None)
    if owner is None: owner = type(t)(base)
    t.uop = substitute(t.uop, {base: owner.realize().uop})
    found = byte_range(t.uop)
  return found

def disk_bitcast(t, dtype: DType):
  """`t` (a DISK tensor) read as `dtype`: the same bytes, no copy; the last axis scales by the item-size ratio."""
  found = _byte_range_of_written(t)
  if found is None: raise disk_op_error(f"bitcast of {t.uop.op.name.lower()}")
  buf, offset, nbytes = found
  old, new = t.dtype.itemsize, dtype.itemsize
  if old != new:
    if t.ndim == 0: raise ValueError(f"bitcast: a 0-d tensor cannot change item size ({t.dtype} -> {dtype})")
    if t.shape[-1] * old % new:
      raise ValueError(f"bitcast: the last axis of {t.shape} {t.dtype} ({t.shape[-1] * old} bytes) does not divide "
                       f"into {dtype} items of {new} bytes")
  shape = (*t.shape[:-1], t.shape[-1] * old // new) if t.ndim else ()
  return type(t)(view_node(buf, offset, dtype, shape))

def write_to_disk(target, value):
  """`target.assign(value)` for a DISK target: the bytes of `value` (broadcast to the target's shape, cast to its
  dtype) are written through to the file at once. Returns `target`."""
  from kiln.mixin.common import broadcasts_to
  cls = type(target)
  if not isinstance(value, cls): value = cls(value, device="CPU", dtype=target.dtype)
  if not broadcasts_to(value.shape, target.shape):
    raise ValueError(f"assign: shape {value.shape} does not match the DISK target's {target.shape} and does not "
                     "broadcast to it")
  if value.shape != target.shape:   # broadcast on the host: a DISK tensor has no kernels
    value = (value.to("CPU") if is_disk(value.device) else value).expand(target.shape)
  found = _byte_range_of_written(target)
  if found is None: raise disk_op_error(f"assign into {target.uop.op.name.lower()}")
  buf, offset, nbytes = found
  if value.dtype != target.dtype:
    if is_disk(value.device): value = value.to("CPU")
    value = value.cast(target.dtype)
  data = value.contiguous().to("CPU") if not is_disk(value.device) else value.to("CPU")
  raw = data._buffer().as_bytes() if target.numel() else b""
  window = buf.view(nbytes, dtypes.uint8, offset).allocate()
  window.copyin(memoryview(raw))
  from kiln.tensor import _forget_results_computed_from   # results read from the old bytes are stale now
  for b in views_of(buf): _forget_results_computed_from(b)
  return target
