"""Shared by the optimizer tests: a tensor's last kernel as a schedule item, and running a lowered kernel on it."""
from __future__ import annotations
import numpy as np
from kiln import Tensor
from kiln.uop.ops import UOp
from kiln.schedule.kernelize import ScheduleItem, create_schedule
from kiln.engine.realize import compile_lowered, run_schedule

def last_kernel_item(t: Tensor) -> ScheduleItem:
  """`t`'s last schedule item, with the kernels before it run and its buffers allocated."""
  items = create_schedule([t.uop]).items
  run_schedule(items[:-1])
  for buf in items[-1].bufs: buf.allocate()
  return items[-1]

def run_lowered(item: ScheduleItem, sink: UOp, name: str = "opt_test") -> np.ndarray:
  """Compile the lowered (optimized or not) kernel `sink` of `item` as kiln does and run it on the item's buffers;
  a copy of the output. The output is filled with NaN (ints: -12345) first, so a kernel that skips an output fails."""
  out = item.bufs[0]
  kind = out.numpy().dtype
  out.copyin(memoryview(np.full(out.size, np.nan if kind.kind == "f" else -12345, kind).tobytes()))
  compile_lowered(out.device, name, sink)(item.bufs, item.var_vals)
  return out.numpy().copy()
