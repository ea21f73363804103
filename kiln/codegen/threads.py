"""Axis mapping for CPU targets: the loops of a lowered kernel that the host's thread pool may split, recorded on its
SINK (a ThreadAxes in `SINK.arg`; docs/ir.md, "Axis mapping").

A CPU kernel runs on the pool one of two ways (docs/developer.md, "Threads"):
- `split`: its outermost output loop cut into contiguous chunks, one per thread. The loop is the first of the
  output ranges in loop order (the linearizer opens them so), and it is chosen only when the disjointness proof
  (kiln/codegen/disjoint.py, one loop) holds for it on the graph: a KBLOCK block loop, a scatter, an in-place scan
  or a store at a fixed address fails it and the loop stays serial.
- `chunked`: its reduce loop cut into a fixed number of chunks reduced independently and combined in chunk order
  (a full sum, a max, a mean over all but a small axis). The loop is the first range, in loop order, of the kernel's
  one outermost group of REDUCEs (reductions nested in it run inside each chunk); it is chosen only when every
  output range has a constant size and, if there are output ranges, no written buffer is read (an outer iteration
  could read what an earlier one stored, but every chunk runs before any store).

Both may be chosen: which one runs, and into how many chunks a reduction is cut, depends on the work of the
vectorized loop nest, and is decided once that is known (kiln/codegen/pipeline.py `thread_plan`, with the checks of
kiln/codegen/parallel.py that the loop nest holds the choice). Loops not named here are never split.

>>> from kiln.uop.ops import UOp, Ops
>>> from kiln.dtype import dtypes
>>> r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 1024),), 0)
>>> out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
>>> store = UOp(Ops.STORE, dtypes.void, (out, r, r.cast(dtypes.float32)))
>>> thread_axes(map_axes_to_threads(UOp(Ops.SINK, dtypes.void, (store,))))
ThreadAxes(split=0, chunked=None)
"""
from __future__ import annotations
from dataclasses import dataclass
from kiln.helpers import SPLIT_REDUCEOP
from kiln.uop.ops import UOp, Ops
from kiln.codegen.disjoint import loop_is_disjoint

_RANGE, _REDUCE, _STORE, _LOAD, _CONST = Ops.RANGE, Ops.REDUCE, Ops.STORE, Ops.LOAD, Ops.CONST

@dataclass(frozen=True)
class ThreadAxes:
  """The loop ids (RANGE args) a CPU kernel's thread pool may split: `split`, its outermost output loop (a
  contiguous chunk of its iterations a thread), and `chunked`, its reduce loop (cut into chunks whose partial results
  are combined in order); None where that loop must stay serial."""
  split: int | None = None
  chunked: int | None = None

NO_THREAD_AXES = ThreadAxes()

def _loop_order(rng: UOp):
  """The order the linearizer opens loops in (kiln/codegen/linearizer.py): by loop id."""
  return (0, rng.arg) if isinstance(rng.arg, int) else (1, str(rng.arg))

def thread_axes(sink: UOp) -> ThreadAxes:
  """The thread axes recorded on a kernel's SINK by `map_axes_to_threads` (NO_THREAD_AXES when none is)."""
  return sink.arg if isinstance(sink.arg, ThreadAxes) else NO_THREAD_AXES

def map_axes_to_threads(sink: UOp) -> UOp:
  """A lowered (and optimized) CPU kernel with the loops its thread pool may split recorded on its SINK (see the
  module docstring); a kernel with none is returned as it is."""
  from kiln.codegen.opt.kernel import graph_nodes, with_sink_arg
  nodes = graph_nodes(sink)
  reduced: dict[UOp, None] = {}
  for u in nodes:
    if u.op is _REDUCE: reduced.update(dict.fromkeys(u.src[1:]))
  outputs = [u for u in nodes if u.op is _RANGE and u not in reduced]
  axes = ThreadAxes(_split_loop(nodes, outputs), _chunked_loop(nodes, outputs, reduced) if reduced else None)
  return sink if axes == NO_THREAD_AXES else with_sink_arg(sink, axes)

def _split_loop(nodes: list[UOp], outputs: list[UOp]) -> int | None:
  """The id of the kernel's outermost output loop when its iterations touch disjoint memory, else None."""
  if not outputs: return None
  loop = min(outputs, key=_loop_order)
  return loop.arg if loop_is_disjoint(nodes, loop) else None

def _chunked_loop(nodes: list[UOp], outputs: list[UOp], reduced: dict[UOp, None]) -> int | None:
  """The id of the loop of the kernel's reduction that may be cut into chunks, else None."""
  if not SPLIT_REDUCEOP or any(r.src[0].op is not _CONST for r in outputs): return None
  if outputs:
    written = {u.src[0] for u in nodes if u.op is _STORE}
    if any(u.op is _LOAD and u.src[0] in written for u in nodes): return None
  reduces = [u for u in nodes if u.op is _REDUCE]
  groups = {frozenset(u.src[1:]) for u in reduces}
  if len(groups) > 1:   # the outermost groups: REDUCEs that run inside no other group's loops
    groups = {frozenset(u.src[1:]) for u in _outermost(nodes, reduces, reduced)}
    if len(groups) != 1: return None
  return min(next(iter(groups)), key=_loop_order).arg

def _outermost(nodes: list[UOp], reduces: list[UOp], reduced: dict[UOp, None]) -> list[UOp]:
  """The REDUCEs whose bodies read no range of another REDUCE (a REDUCE's value does not depend on its own ranges;
  one that reads a reduction's result, a variance after its mean, is not inside the mean's loop)."""
  empty: frozenset[UOp] = frozenset()
  live: dict[UOp, frozenset[UOp]] = {}   # node -> the reduce ranges its value depends on
  for u in nodes:
    if u in reduced: live[u] = frozenset((u,))
    elif u.op is _REDUCE: live[u] = live[u.src[0]].difference(u.src[1:])
    else:
      found = empty
      for s in u.src:
        if (part := live[s]) is not empty and part: found = found | part
      live[u] = found
  return [u for u in reduces if not live[u.src[0]].difference(u.src[1:])]
