"""Which loop of a linearized kernel may be split across threads, and how much work a launch does.

A kernel's outermost loop is split into contiguous chunks, one per thread (docs/developer.md, "Threads"). That is
only correct when no two iterations of that loop touch the same memory unless both only read it. `find_parallel_loop`
proves this from the uop list and refuses (returns None) whenever it cannot:

- the loop must hold the whole kernel: before it only loads and arithmetic, after it nothing (an accumulator declared
  outside it, or a store outside it, is a loop-carried dependency);
- every index into a buffer the kernel writes must be `stride*r + rest`, with one constant stride per buffer and
  `rest` independent of the loop `r` and bounded so that `max(rest) - min(rest) < |stride|`. Then iteration `i`
  touches only addresses in `[stride*i + min, stride*i + max]`, and these blocks of different iterations are
  disjoint. A data-dependent index (scatter), a store at a fixed address (an output written by every iteration) or a
  read of another iteration's output (an in-place scan) fails the test.

Buffers only read may be indexed in any way. Distinct buffer parameters never alias (kernels declare them `restrict`).
"""
from __future__ import annotations
from dataclasses import dataclass
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops

@dataclass(frozen=True)
class ParallelLoop:
  """The outermost loop `loop` (a RANGE uop) may run its iterations on several threads; `work` estimates the uops one
  launch executes (symbolic trip counts at their maximum), for deciding whether splitting pays."""
  loop: UOp
  work: int

_SIDE_EFFECTS = (Ops.STORE, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.RANGE)

def find_parallel_loop(uops: list[UOp]) -> ParallelLoop | None:
  """The kernel's outermost loop if splitting its iterations across threads is provably safe, else None.

  >>> from kiln.dtype import dtypes
  >>> r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 64),), arg=0)
  >>> out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  >>> store = UOp(Ops.STORE, dtypes.void, (out, r, UOp.const(dtypes.float32, 1.0)))
  >>> find_parallel_loop([out, r, store, UOp(Ops.ENDRANGE, dtypes.void, (r,))]).work
  64
  >>> at_zero = UOp(Ops.STORE, dtypes.void, (out, UOp.const(dtypes.int32, 0), UOp.const(dtypes.float32, 1.0)))
  >>> find_parallel_loop([out, r, at_zero, UOp(Ops.ENDRANGE, dtypes.void, (r,))]) is None
  True
  """
  start = next((i for i, u in enumerate(uops) if u.op in _SIDE_EFFECTS), None)
  if start is None or uops[start].op is not Ops.RANGE: return None
  loop = uops[start]
  end = _matching_end(uops, start)
  if end is None or any(u.op is not Ops.SINK for u in uops[end + 1:]): return None
  if not _accesses_are_disjoint(uops, loop): return None
  return ParallelLoop(loop, _work(uops[start:end + 1]))

def _matching_end(uops: list[UOp], start: int) -> int | None:
  depth = 0
  for i in range(start, len(uops)):
    if uops[i].op is Ops.RANGE: depth += 1
    elif uops[i].op is Ops.ENDRANGE:
      depth -= 1
      if depth == 0: return i if uops[i].src[0] is uops[start] else None
  return None

def _work(body: list[UOp]) -> int:
  """Uops executed by the loop nest `body` (RANGE ... ENDRANGE), each weighted by the trip counts around it."""
  total, trips, stack = 0, 1, []
  for u in body:
    if u.op is Ops.RANGE:
      count = max(1, int(u.src[0].vmax))
      stack.append(trips)
      trips *= count
    elif u.op is Ops.ENDRANGE: trips = stack.pop()
    else: total += trips
  return total

def _accesses_are_disjoint(uops: list[UOp], loop: UOp) -> bool:
  """Every access to a written buffer stays inside its own iteration's block (see the module docstring)."""
  written = {u.src[0] for u in uops if u.op is Ops.STORE}
  contains: dict[UOp, bool] = {}
  blocks: dict[UOp, tuple[int, int, int]] = {}   # buffer -> (stride, lowest rest, highest rest) over its stores
  for u in uops:
    if u.op is not Ops.STORE: continue
    split = _affine_in(u.src[1], loop, contains)
    if split is None or split[0] == 0: return False
    stride, low, high = split
    if u.src[0] in blocks:
      known_stride, known_low, known_high = blocks[u.src[0]]
      if known_stride != stride: return False
      low, high = min(low, known_low), max(high, known_high)
    blocks[u.src[0]] = (stride, low, high)
  if any(high - low >= abs(stride) for stride, low, high in blocks.values()): return False
  for u in uops:
    if u.op is not Ops.LOAD or u.src[0] not in written: continue
    split = _affine_in(u.src[1], loop, contains)
    stride, low, high = blocks[u.src[0]]
    if split is None or split[0] != stride or split[1] < low or split[2] > high: return False
  return True

def _depends_on(u: UOp, loop: UOp, memo: dict[UOp, bool]) -> bool:
  if u not in memo: memo[u] = u is loop or any(_depends_on(s, loop, memo) for s in u.src)
  return memo[u]

def _affine_in(index: UOp, loop: UOp, memo: dict[UOp, bool]) -> tuple[int, int, int] | None:
  """`index` as `stride*loop + rest`: (stride, min(rest), max(rest)), or None when it is not of that form."""
  if not _depends_on(index, loop, memo):
    low, high = index.vmin, index.vmax
    return (0, int(low), int(high)) if isinstance(low, int) and isinstance(high, int) else None
  if index is loop: return (1, 0, 0)
  if index.op is Ops.ADD:
    parts = [_affine_in(s, loop, memo) for s in index.src]
    if any(p is None for p in parts): return None
    return tuple(sum(values) for values in zip(*parts))   # type: ignore[return-value]
  if index.op is Ops.MUL:
    factor = next((s for s in index.src if s.op is Ops.CONST), None)
    other = next((s for s in index.src if s is not factor), None)
    if factor is None or other is None or not isinstance(factor.arg, int): return None
    part = _affine_in(other, loop, memo)
    if part is None: return None
    c = factor.arg
    return (part[0] * c, *sorted((part[1] * c, part[2] * c)))
  if index.op is Ops.CAST and dtypes.is_int(index.dtype) and dtypes.is_int(index.src[0].dtype) \
     and index.dtype.itemsize >= index.src[0].dtype.itemsize and dtypes.is_unsigned(index.dtype) == \
     dtypes.is_unsigned(index.src[0].dtype):   # widening to a type of the same signedness keeps the value
    return _affine_in(index.src[0], loop, memo)
  return None
