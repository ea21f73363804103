"""The loop nest's checks of a CPU kernel's thread split, and how much work a launch does.

A kernel's outermost loop is split into contiguous chunks, one per thread (docs/developer.md, "Threads"). The
axis-mapping stage chooses that loop on the graph (kiln/codegen/threads.py), where the disjointness proof holds
(kiln/codegen/disjoint.py: no two iterations touch the same memory unless both only read it). `find_parallel_loop`
checks the linearized loop nest against that choice and refuses (returns None) when it does not hold it: the loop
must hold the whole kernel, before it only loads and arithmetic, after it nothing (an accumulator declared outside it,
or a store outside it, is a loop-carried dependency). Given only a uop list (no choice), it runs the proof there.

`find_split_reduction` covers what that refuses most often: a reduction whose accumulators live outside the loop
that would be split (a full `sum`, a `max`, a mean over all but one small axis). Its reduce loop is cut into a fixed
number of chunks reduced independently, whose partials are then combined in chunk order (see SplitReduction).
"""
from __future__ import annotations
import bisect, operator
from dataclasses import dataclass
from kiln.dtype import dtypes
from kiln.helpers import SPLIT_REDUCEOP
from kiln.uop.ops import UOp, Ops, GroupOp
from kiln.codegen.disjoint import affine_in, loop_is_disjoint
# the Ops members these loops over every uop test, bound once: under Python 3.11 each `Ops.X` read costs ~130 ns
# (EnumType defines __getattr__, which puts every attribute read on the class on a slow path), 10x a global's
_RANGE, _ENDRANGE, _SINK, _STORE, _LOAD = Ops.RANGE, Ops.ENDRANGE, Ops.SINK, Ops.STORE, Ops.LOAD
_DEFINE_ACC, _ASSIGN, _CONST, _GEP, _VECTORIZE = Ops.DEFINE_ACC, Ops.ASSIGN, Ops.CONST, Ops.GEP, Ops.VECTORIZE

@dataclass(frozen=True)
class ParallelLoop:
  """The outermost loop `loop` (a RANGE uop) may run its iterations on several threads; `work` estimates the uops one
  launch executes (symbolic trip counts at their maximum), for deciding whether splitting pays."""
  loop: UOp
  work: int

_SIDE_EFFECTS = (_STORE, _DEFINE_ACC, _ASSIGN, _RANGE)
_lane_count = operator.attrgetter("dtype.count")

def find_parallel_loop(uops: list[UOp], chosen: int | None = None) -> ParallelLoop | None:
  """The kernel's outermost loop if splitting its iterations across threads is provably safe, else None. `chosen`:
  the loop id the axis-mapping stage chose on the graph (kiln/codegen/threads.py, whose disjointness proof then
  stands: the loop nest is only checked to hold that loop around the whole kernel); None proves it on `uops`.

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
  if start is None or uops[start].op is not _RANGE: return None
  loop = uops[start]
  if chosen is not None and loop.arg != chosen: return None
  marks = _loop_marks(uops)
  end = _matching_end(uops, start, marks)
  if end is None or any(u.op is not _SINK for u in uops[end + 1:]): return None
  if chosen is None and not loop_is_disjoint(uops, loop): return None
  return ParallelLoop(loop, _work(uops[start:end + 1], marks=[m - start for m in marks if start <= m <= end]))

def _loop_marks(uops: list[UOp]) -> list[int]:
  """The positions of the RANGEs and ENDRANGEs in `uops` (the scans below then skip the uops between them)."""
  return [i for i, u in enumerate(uops) if u.op is _RANGE or u.op is _ENDRANGE]

def _matching_end(uops: list[UOp], start: int, marks: list[int]) -> int | None:
  """The position of the ENDRANGE that closes the RANGE at `start` (None when the loops are not nested so);
  `marks` are `_loop_marks(uops)`."""
  depth = 0
  for i in marks[bisect.bisect_left(marks, start):]:
    if uops[i].op is _RANGE: depth += 1
    else:
      depth -= 1
      if depth == 0: return i if uops[i].src[0] is uops[start] else None
  return None

def _work(body: list[UOp], skip: frozenset[UOp] | set[UOp] = frozenset(), marks: list[int] | None = None) -> int:
  """Uops executed by the loop nest `body` (RANGE ... ENDRANGE), each weighted by the trip counts around it; the uops
  in `skip` are not counted. `marks`: `_loop_marks(body)`, when the caller has them."""
  total, trips, stack, start = 0, 1, [], 0
  def lanes(segment: list[UOp]) -> int:   # a vector uop does its lanes' work
    return sum(u.dtype.count for u in segment if u not in skip) if skip else sum(map(_lane_count, segment))
  for i in _loop_marks(body) if marks is None else marks:
    total += trips * lanes(body[start:i])
    u, start = body[i], i + 1
    if u.op is _RANGE:
      stack.append(trips)
      trips *= max(1, int(u.src[0].vmax))
    else: trips = stack.pop()
  return total + trips * lanes(body[start:])

def _index_math(uops: list[UOp]) -> set[UOp]:
  """The uops whose work differs between a kernel's scalar and vector forms (kiln/codegen/vectorize.py): constants,
  lane reads and builds (GEP, VECTORIZE), and arithmetic read only as a load or store address (a vector load needs
  its first lane's address only). A split reduction's chunk count leaves them out, so that it, and the bits of a
  float sum, are the same with VECTORIZE=0 and 1."""
  # one pass from the end (a user comes after what it reads): by the time a uop is reached, all its users were seen,
  # so whether every read of it is address math is known without a table of users
  only_addressed: dict[UOp, bool] = {}   # uop -> no read of it so far was anything but address math
  addresses: set[UOp] = set()
  for u in reversed(uops):
    op = u.op
    if op in GroupOp.ALU and only_addressed.get(u, False): addresses.add(u)
    is_address = u in addresses
    for i, s in enumerate(u.src):
      if is_address or (i == 1 and (op is _LOAD or op is _STORE)): only_addressed.setdefault(s, True)
      else: only_addressed[s] = False
  return addresses | {u for u in uops if u.op in (_CONST, _GEP, _VECTORIZE)}

@dataclass(frozen=True)
class Stream:
  """A read-only buffer that loop `r` walks through: iteration r reads elements [stride*r + low, stride*r + high]
  of it (and no other iteration reads them: high - low < stride)."""
  buffer: UOp
  stride: int
  low: int
  high: int

def streamed_loads(uops: list[UOp], loop: UOp) -> list[Stream]:
  """The buffers only read by the kernel that loop `loop` (a RANGE of `uops`) streams through from loads inside an
  inner loop of its body (a matrix-vector product's weight rows): each iteration reads its own block, and no
  iteration reads another's. Loads at indices not affine in `loop` leave their buffer out."""
  start = uops.index(loop)
  end = next((i for i in range(start + 1, len(uops)) if uops[i].op is _ENDRANGE and uops[i].src[0] is loop),
             len(uops))
  written = {u.src[0] for u in uops if u.op is _STORE}
  memo: dict = {}
  spans: dict[UOp, tuple[int, int, int] | None] = {}
  depth = 0
  for u in uops[start + 1:end]:
    if u.op is _RANGE: depth += 1
    elif u.op is _ENDRANGE: depth -= 1
    elif u.op is _LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and u.src[0] not in written:
      split = affine_in(u.src[1], loop, memo) if depth > 0 else None
      seen = spans.get(u.src[0], (0, 0, 0))
      if split is None or seen is None or (seen[0] and split[0] != seen[0]):
        spans[u.src[0]] = None
        continue
      stride, low, high = split
      high += u.dtype.count - 1   # a vector load's last lane
      spans[u.src[0]] = (stride, min(low, seen[1]) if seen[0] else low, max(high, seen[2]) if seen[0] else high)
  return [Stream(buf, *span) for buf, span in spans.items()
          if span is not None and span[0] > 0 and span[2] - span[1] < span[0]]

# ---- split reductions: a reduce loop whose accumulators live outside every loop that could be split ----

# a split reduction is cut into chunks of at least this many uops of work (a fixed number per kernel, so the result
# never depends on the thread count), and into at most MAX_REDUCE_CHUNKS chunks. A kernel too small for two chunks
# is not split as a reduction: its accumulators stay vectors and its outer loop (if any) is split instead; split, the
# anchors' transformer's layernorm variance rows (4x64 rows of 256, 400,000 uops) took 22 us on one thread against
# 14.5 us unsplit
REDUCE_CHUNK_WORK = 1 << 18
MAX_REDUCE_CHUNKS = 64
# partial results a launch may hold (outer iterations * chunks * accumulators): the one-thread path keeps them on its
# stack, 8 bytes each
MAX_PARTIAL_SLOTS = 8192
# an outermost loop this short is split as a reduction when that is possible (its own split would idle most cores)
FEW_OUTER_ITERATIONS = 32

# combining op -> a predicate saying whether a constant is its identity (the value every chunk's accumulator starts at)
_IDENTITIES = {
  Ops.ADD: lambda value, dtype: value == 0,
  Ops.MUL: lambda value, dtype: value == 1,
  Ops.MAX: lambda value, dtype: value == dtypes.min(dtype) if not dtypes.is_float(dtype) else value == float("-inf"),
}

def _is_identity(op: Ops, init: UOp) -> bool:
  """Whether the constant `init` (a scalar, or a vector constant: every lane) is the identity of `op`."""
  if init.op is not _CONST: return False
  values = init.arg if init.dtype.count > 1 else (init.arg,)
  return all(_IDENTITIES[op](v, init.dtype.scalar) for v in values)

@dataclass(frozen=True)
class SplitReduction:
  """A kernel `[outer loops] accumulators; for r: acc = op(acc, ...); [epilogue and stores]` whose reduce loop `loop`
  runs as `chunks` contiguous chunks (a number fixed at render time, independent of the thread count): chunk `c`
  reduces its part of `loop` into one partial result per accumulator and outer iteration, and the partials are then
  combined in chunk order. `outer` are the enclosing loops (constant extents, `outer_iterations` in all),
  `accumulators` the DEFINE_ACCs with their combining ops, `work` the uops per launch."""
  loop: UOp
  outer: tuple[UOp, ...]
  accumulators: tuple[tuple[UOp, UOp], ...]   # (DEFINE_ACC, one of its combining uops: ADD/MUL/MAX)
  outer_iterations: int
  chunks: int
  work: int

def find_split_reduction(uops: list[UOp], chosen: int | None = None) -> SplitReduction | None:
  """The kernel's reduce loop if its work can be split into independently reduced chunks, else None (always None
  with SPLIT_REDUCEOP=0). `chosen`: the loop id the axis-mapping stage chose on the graph (kiln/codegen/threads.py,
  which checked what the graph shows: constant output loops, no written buffer read); the loop nest must then split
  that loop. None checks all of it on `uops`.

  The kernel must be: loops that enclose everything (constant extents), then accumulators initialized to their op's
  identity, one reduce loop holding every update of them (`acc = acc + x`, `max`, `*`) and no store, then stores and
  arithmetic only. Integer results are exact (wrapping add and multiply are associative); float sums and products are
  reassociated (partials added in a fixed order, so every thread count gives the same bits).

  >>> r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 1 << 20),), arg=0)
  >>> out, a = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)
  >>> acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0.0),), 0)
  >>> value = UOp(Ops.LOAD, dtypes.float32, (a, r))
  >>> update = UOp(Ops.ADD, dtypes.float32, (acc, value))
  >>> assign = UOp(Ops.ASSIGN, dtypes.float32, (acc, update))
  >>> store = UOp(Ops.STORE, dtypes.void, (out, UOp.const(dtypes.int32, 0), assign))
  >>> find_split_reduction([out, a, acc, r, value, update, assign, UOp(Ops.ENDRANGE, dtypes.void, (r,)), store]).chunks
  12
  """
  if not SPLIT_REDUCEOP: return None
  outer: list[UOp] = []
  accs: list[UOp] = []
  position = 0
  for position, u in enumerate(uops):   # the outer loops and the accumulators, up to the reduce loop
    if u.op is _RANGE:
      if accs: break
      if u.src[0].op is not _CONST: return None
      outer.append(u)
    elif u.op is _DEFINE_ACC: accs.append(u)
    elif u.op in (_STORE, _ASSIGN, _ENDRANGE): return None
  else: return None
  if not accs: return None
  loop = uops[position]
  if chosen is not None and loop.arg != chosen: return None
  outer_iterations = 1
  for o in outer: outer_iterations *= max(1, int(o.src[0].arg))
  lanes = sum(acc.dtype.count for acc in accs)   # a vector accumulator holds one partial result per lane
  limit = min(MAX_REDUCE_CHUNKS, max(1, int(loop.src[0].vmin)), MAX_PARTIAL_SLOTS // (outer_iterations * lanes))
  if limit < 2: return None   # the cheap bound first: too short a loop, or too many partial results to hold
  marks = _loop_marks(uops)
  end = _matching_end(uops, position, marks)
  if end is None: return None
  combining = _combining_ops(uops[position + 1:end], accs)
  if combining is None: return None
  closers = [u for u in uops[end + 1:] if u.op is _ENDRANGE]   # after the reduce loop: epilogue, then closers
  if [u.src[0] for u in closers] != outer[::-1]: return None
  if any(u.op in (_RANGE, _DEFINE_ACC, _ASSIGN) for u in uops[end + 1:]): return None
  first_closer = next((i for i in range(end + 1, len(uops)) if uops[i].op is _ENDRANGE), len(uops))
  if any(u.op not in (_ENDRANGE, _SINK) for u in uops[first_closer:]): return None
  if chosen is None and outer:
    written = {u.src[0] for u in uops if u.op is _STORE}
    if any(u.op is _LOAD and u.src[0] in written for u in uops):
      return None   # an outer iteration might read what an earlier one stored, but every chunk runs before any store
  whole = [UOp(_RANGE, dtypes.int32, (UOp.const(dtypes.int32, 1),)), *uops, UOp(_ENDRANGE, dtypes.void)]
  work = _work(whole, marks=[0, *(m + 1 for m in marks), len(whole) - 1])
  # the work without index math is at most `work`: when even that makes fewer than two chunks, skip counting it
  if min(limit, work // max(1, REDUCE_CHUNK_WORK)) < 2: return None
  chunks = min(limit, _work(whole, _index_math(uops)) // max(1, REDUCE_CHUNK_WORK))
  if chunks < 2: return None
  return SplitReduction(loop, tuple(outer), tuple((acc, combining[acc]) for acc in accs), outer_iterations, chunks,
                        work)

def _combining_ops(body: list[UOp], accs: list[UOp]) -> dict[UOp, UOp] | None:
  """For each accumulator, one of the uops that combine it with a new value (all with the same op), when the reduce
  loop `body` uses it only as `acc = op(acc, x)` and stores nothing; else None."""
  owner: dict[UOp, UOp] = {acc: acc for acc in accs}   # the accumulator's DEFINE_ACC and its ASSIGNs -> the acc
  combining: dict[UOp, UOp] = {}
  for u in body:
    if u.op is _STORE: return None
    if u.op is _ASSIGN and u.src[0] in owner:
      acc, value = owner[u.src[0]], u.src[1]
      chained = [s for s in value.src if owner.get(s) is acc]
      if value.op not in _IDENTITIES or len(chained) != 1 or value.dtype != acc.dtype: return None
      if combining.setdefault(acc, value).op is not value.op: return None
      owner[u] = acc
  for acc in accs:
    value = combining.get(acc)
    if value is None or not _is_identity(value.op, acc.src[0]): return None
  updates = set(combining.values()) | {u.src[1] for u in body if u.op is _ASSIGN and u.src[0] in owner}
  for u in body:   # an accumulator and its updates are read only by its own update and assignment (no running value)
    if u.op is _ASSIGN and u.src[0] in owner: continue
    if any(s in updates for s in u.src) or (u not in updates and any(s in owner for s in u.src)): return None
  return combining
