"""Axis mapping for GPU targets, lowered kernel -> kernel over block and thread indices (SPECIAL `gidx0`, `lidx0`):
output ranges that touch disjoint memory become one flat thread index, whole-row reductions one block per row (or the
whole grid, for one long reduction), and every other range stays a loop in each thread.

Row kernels first (`group_rows`, `grid_reduction`): a kernel of reductions over whole rows, with at most one
elementwise pass over the row that uses them (sums, max, softmax, layernorm), runs a block of GROUP_SIZE threads per
row that reduce strided partials and combine them: by warp shuffles (SHUFFLE) within each warp, then through a shared
array (DEFINE_LOCAL) after one BARRIER across a row's warps (WARP_SHUFFLE=0, or a shape shuffles do not fit: in a
tree of BARRIER-separated rounds through shared memory); a full reduction of a million elements or more spreads
over GRID_BLOCKS blocks whose last one (an ATOMIC ticket) combines their partials. Every other kernel maps its output ranges as below.

Which ranges: output ranges (reduced by no REDUCE) of constant size for which a disjointness proof holds: every
index into a written buffer is affine in them, `sum(c_k * r_k) + rest`, with coefficients that, sorted, each pass the
span of everything finer (so two threads never write, or read what the other writes, at one address; the rule of
kiln/codegen/disjoint.py, for several ranges at once). A KBLOCK block loop (its iterations update the same outputs),
a PADTO-clamped axis or an in-place scan fails the proof and stays a loop in each thread. So does an output range a
reduction does not depend on (softmax's elementwise axis, after the row's max and sum): mapped, every thread would
compute the row's reductions again.

How: the mapped ranges, in loop-id order (the last one fastest), are unflattened from the thread index
`t = gidx0*L + lidx0`: `r_k = t // stride_k % size_k`. When the block size L does not divide the ranges' product T,
the last block has threads past T: their `t` is clamped to T-1 (every load stays in bounds) and every store is gated
by `t < T` (they write nothing).

>>> from kiln.uop.ops import UOp, Ops
>>> from kiln.dtype import dtypes
>>> r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 1024),), 0)
>>> out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
>>> sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, r, UOp.const(dtypes.float32, 1.0))),))
>>> launch_size(toposort_specials(map_axes_to_gpu(sink)))
((4, 1, 1), (256, 1, 1))
"""
from __future__ import annotations
import itertools, math
from dataclasses import dataclass
from kiln.dtype import dtypes
from kiln.helpers import NOLOCALS, WARP_SHUFFLE, prod
from kiln.uop.ops import UOp, Ops, toposort, identity_element
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic
from kiln.renderer.shared_memory import dynamic_shared_bytes
from kiln.codegen.disjoint import ALL as _ALL, Linear, linear_form as _linear, first_conflict as _first_conflict

INT = dtypes.int32
BLOCK_SIZES = (256, 128, 64, 32)   # threads per block, the first that divides the work (else 256 and a guard)
MAX_ONE_BLOCK = 1024   # work below this that no block size divides runs as one block of exactly that many threads
MAX_THREADS = 2 ** 31 - 1   # the flat thread index is an int32

def mappable_ranges(sink: UOp) -> list[UOp]:
  """The output ranges of a lowered kernel that may run on separate threads, in loop-id order (outermost first);
  outer ones are dropped while their product would pass MAX_THREADS."""
  nodes = toposort([sink])
  reduced = {r for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]}
  outputs = [u for u in nodes if u.op is Ops.RANGE and u not in reduced and u.src[0].op is Ops.CONST]
  outputs.sort(key=lambda r: (0, r.arg) if isinstance(r.arg, int) else (1, str(r.arg)))
  # a reduction that does not depend on an output range is computed once for all its iterations (a row's max and sum
  # before the row's elementwise loop): such a range stays a loop, else every thread would compute the reduction again
  reduce_scopes = [frozenset(u.src[0].toposort()) for u in nodes if u.op is Ops.REDUCE]
  mapped = [r for r in outputs if r.src[0].arg > 1 and all(r in scope for scope in reduce_scopes)]
  while mapped and (offender := _first_conflict(nodes, mapped)) is not None:
    mapped = [] if offender is _ALL else [r for r in mapped if r is not offender]
  while mapped and prod(r.src[0].arg for r in mapped) > MAX_THREADS: mapped.pop(0)
  return mapped

def block_size(total: int) -> int:
  """Threads per block for `total` threads of work: a warp multiple that divides it, else all of it when small,
  else 256 (the last block then guarded)."""
  for size in BLOCK_SIZES:
    if total % size == 0: return size
  return total if total <= MAX_ONE_BLOCK else BLOCK_SIZES[0]

# an elementwise kernel with at least this many blocks of work gives each thread COARSEN elements, one block apart
# (`t_c = (gidx0*COARSEN + c)*L + lidx0`: every load of a warp stays coalesced): four loads in flight per thread
COARSEN, MIN_COARSE_BLOCKS = 4, 2048

GROUP_SIZE = 256   # threads of a block that share a grid-wide reduction, and the most that share a row
MIN_GROUP_SIZE = 32   # the fewest threads a row's block has (one warp)
# a row kernel's block has about (longest row) / ROW_ELEMENTS threads, a power of two from MIN_GROUP_SIZE to
# GROUP_SIZE: a short row (a decode step's 576-float norms and matrix-vector rows) gets a small block, whose threads
# each keep several elements in flight and combine in fewer barrier-separated rounds
ROW_ELEMENTS = 8
MIN_GROUPED = 128   # a kernel whose reductions are all shorter keeps them in one thread each (unless many rows)
# a row kernel of at least MULTI_ROW_MIN rows of at most MULTI_ROW_MAX elements gives each row `row_lanes` threads
# (about ROW_LANE_ELEMENTS elements each, a power of two from MIN_ROW_LANES to GROUP_SIZE) and each block
# ROW_BLOCK_THREADS threads' worth of rows; such rows are grouped from MIN_MULTI_GROUPED elements. A decode step's
# matrix-vector rows and attention scores are latency-bound: a lane's serial elements set the time (H200, call 26:
# a warp a 1536-float row took 7.3 us, a warp a 576-float row 2.3, one thread a 64-float row 11.2; call 29, the step's
# Q4_1 kernels alone at 4/8/16/32 elements a lane: gate*up with its norm 5.88/4.91/3.66/4.44 us, qkv with its norm
# 3.10/2.54/2.41/3.17, down 2.29/2.31/2.38/2.65)
ROW_LANE_ELEMENTS, MIN_ROW_LANES, ROW_BLOCK_THREADS = 16, 8, 256
MULTI_ROW_MIN, MULTI_ROW_MAX, MIN_MULTI_GROUPED = 64, 4096, 32
# rows enough to fill the GPU with this many threads at WARP_LANES a row get no more than a warp each: more lanes
# only add tree rounds (H200, call 28: a 49152-row head at 128 lanes a row 38.4 us, at a warp a row 20.7)
FULL_GPU_THREADS, WARP_LANES = 1 << 18, 32

def row_lanes(size: int, rows: int = 1) -> int:
  """The threads that reduce one of `rows` rows of `size` elements (`ROW_LANE_ELEMENTS` a thread, a power of two in
  [MIN_ROW_LANES, GROUP_SIZE]; at most a warp when a warp a row already fills the GPU).

  >>> row_lanes(64), row_lanes(576), row_lanes(1536), row_lanes(576, rows=49152)
  (8, 64, 128, 32)
  """
  lanes = MIN_ROW_LANES
  widest = WARP_LANES if rows * WARP_LANES >= FULL_GPU_THREADS else GROUP_SIZE
  while lanes < widest and lanes * ROW_LANE_ELEMENTS < size: lanes *= 2
  return lanes

def row_group_size(size: int) -> int:
  """The threads of the block that reduces a row of `size` elements (`ROW_ELEMENTS` a thread, a power of two in
  [MIN_GROUP_SIZE, GROUP_SIZE]).

  >>> row_group_size(576), row_group_size(1536), row_group_size(256), row_group_size(100000)
  (128, 256, 32, 256)
  """
  group = MIN_GROUP_SIZE
  while group < GROUP_SIZE and group * ROW_ELEMENTS < size: group *= 2
  return group
# a kernel with more outputs than this keeps one output per thread (a matmul: its threads already fill the GPU, and
# a block per output would combine 256 partials for every one of them)
MAX_GROUPED_OUTPUTS = 1 << 16

def _range_key(r: UOp): return (0, r.arg) if isinstance(r.arg, int) else (1, str(r.arg))

@dataclass(frozen=True)
class RowPlan:
  """How a row kernel runs as one block per row: its reduce groups (REDUCEs over the same ranges, in the order they
  are computed), the row ranges (block index) and the one elementwise range, if any (split over the threads)."""
  groups: tuple[tuple[tuple[UOp, ...], tuple[UOp, ...]], ...]   # (reduce ranges, their REDUCEs)
  rows: tuple[UOp, ...]
  elementwise: UOp | None

def row_plan(sink: UOp) -> RowPlan | None:
  """The RowPlan of a kernel made of reductions over whole rows and, optionally, an elementwise pass over the row
  that uses them (softmax, layernorm, a row sum, a full sum); None for any other kernel, and with NOLOCALS=1 (no
  shared memory for the partials)."""
  if NOLOCALS: return None
  nodes = toposort([sink])
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  if not reduces: return None
  groups: dict[frozenset[UOp], list[UOp]] = {}
  for red in reduces: groups.setdefault(frozenset(red.src[1:]), []).append(red)
  reduce_ranges = set().union(*groups)
  if any(r.src[0].op is not Ops.CONST for r in reduce_ranges): return None
  longest = max(prod(r.src[0].arg for r in key) for key in groups)
  if longest < min(MIN_GROUPED, MIN_MULTI_GROUPED): return None
  scopes = {red: frozenset(u for u in red.toposort() if u.op is Ops.RANGE) for red in reduces}
  for red in reduces:   # no reduction inside another's loop: a body reads no other group's ranges but through it
    inner = frozenset(toposort([red.src[0]], stop=lambda u: u.op is Ops.REDUCE))
    if any(r in reduce_ranges and r not in red.src[1:] for r in inner): return None
  outputs = sorted((u for u in nodes if u.op is Ops.RANGE and u not in reduce_ranges), key=_range_key)
  # a row range is one some reduction depends on; a reduction that misses one (an RMS norm's sum of squares inside
  # the product it scales) is computed again by each row, so it may be no longer than the rows' own reductions
  rows = [r for r in outputs if any(r in scope for scope in scopes.values())]
  size_of = {red: prod(r.src[0].arg for r in red.src[1:]) for red in reduces}
  full = [size_of[red] for red in reduces if all(r in scopes[red] for r in rows)]
  if not full or any(size_of[red] > max(full) for red in reduces): return None
  rest = [r for r in outputs if r not in rows]
  if len(rest) > 1 or any(r in scope for r in rest for scope in scopes.values()): return None
  if any(r.src[0].op is not Ops.CONST for r in outputs) or prod(r.src[0].arg for r in rows) > MAX_GROUPED_OUTPUTS:
    return None
  if longest < MIN_GROUPED and (prod(r.src[0].arg for r in rows) < MULTI_ROW_MIN or
                                 not _reads_along(nodes, max(reduce_ranges, key=_range_key))):
    return None   # few short rows, or short columns (one thread an output reads them coalesced)
  if rows + rest and _first_conflict(nodes, rows + rest) is not None: return None
  ordered = tuple((tuple(sorted(key, key=_range_key)), tuple(reds)) for key, reds in groups.items())
  return RowPlan(ordered, tuple(rows), rest[0] if rest else None)

def _reads_along(nodes: list[UOp], rng: UOp) -> bool:
  """Whether some load of a global buffer reads consecutive addresses along `rng` (a coefficient of 1 in its
  index), so the lanes that split `rng` read one run of memory."""
  memo: dict = {}
  for load in nodes:
    if load.op is Ops.LOAD and load.src[0].op is Ops.DEFINE_GLOBAL:
      form = _linear(load.src[1], frozenset([rng]), memo)
      if form is not None and form[0].get(rng) == 1: return True
  return False

TERMS_PER_LEVEL = 32   # a float sum's partial adds at most about this many terms per accumulator level

def sum_levels(n: int, blocked: bool) -> list[int]:
  """Loop sizes, outermost first, whose product covers n terms: one loop, or for a float sum as many levels as keep
  each near TERMS_PER_LEVEL (its rounding error then grows with levels * TERMS_PER_LEVEL ulps, not n/2).

  >>> sum_levels(4096, True), sum_levels(4096, False), sum_levels(20, True)
  ([16, 16, 16], [4096], [20])
  """
  if not blocked or n <= 2 * TERMS_PER_LEVEL: return [n]
  levels = math.ceil(math.log(n) / math.log(TERMS_PER_LEVEL))
  inner = math.ceil(n ** (1 / levels))
  while inner ** (levels - 1) * math.ceil(n / inner ** (levels - 1)) < n: inner += 1
  return [math.ceil(n / inner ** (levels - 1))] + [inner] * (levels - 1)

MAX_UNROLLED_ROW = 32   # a row of at most this many elements a thread is unrolled, not looped (8192 at 256 threads)

def _thread_elements(size: int, lidx: UOp, count: int, group: int = GROUP_SIZE,
                     top: bool = False) -> list[tuple[UOp, UOp | None]]:
  """Elements `k*group + lidx` (k < count) of a range of `size` (`top`, GROUPTOP: `lidx*count + k`, a contiguous
  chunk a thread), each clamped to the last element where some thread's would pass it, with that validity (None
  where every thread's is real). Built alike for every pass, so the passes of a row kernel share their loads and the
  arithmetic on them (one read of the row, kept in registers)."""
  out = []
  for k in range(count):
    if top:
      element = lidx * count + k if k else lidx * count
      if count * group == size: out.append((element, None))
      else:
        valid = element.lt(size)
        out.append((valid.where(element, UOp.const(INT, size - 1)), valid))
      continue
    element = lidx + k * group if k else lidx
    if (k + 1) * group <= size: out.append((element, None))
    else:
      valid = element.lt(size)
      out.append((valid.where(element, UOp.const(INT, size - 1)), valid))
  return out

def _chain(red: UOp, bodies: list[UOp]) -> UOp:
  """`red`'s op applied along `bodies` in order (an unrolled loop's accumulation)."""
  acc = bodies[0]
  for body in bodies[1:]: acc = UOp(red.arg, red.dtype, (acc, body))
  return acc

def _flat_index(loops: list[UOp]) -> UOp:
  """The row-major index of nested loops (the last fastest)."""
  index, stride = UOp.const(INT, 0), 1
  for loop in reversed(loops):
    index = index + loop * stride if stride != 1 else loop
    stride *= loop.src[0].arg
  return index

def _nested(red: UOp, body: UOp, loops: list[UOp]) -> UOp:
  """`red`'s reduction of `body` over `loops`, one REDUCE per loop (the innermost first)."""
  for loop in reversed(loops): body = UOp(Ops.REDUCE, red.dtype, (body, loop), red.arg)
  return body

def _tree_combine(lidx: UOp, arrays: list[tuple[UOp, UOp]], barrier: UOp, group: int = GROUP_SIZE,
                  lane: UOp | None = None, first: UOp | None = None, stride: int = 1) -> dict[UOp, UOp]:
  """Each REDUCE's total from the `group` partials in its shared array (written before `barrier`): log2 rounds in
  which thread i < s combines elements i and i + s into element i (s = half the block, then half of that...), a
  barrier after each round; then every thread reads element 0. A fixed tree: the same bits on every run. With
  several rows a block, each row's `group` partials sit at `first` (its row's first slot) + `lane` (times `stride`:
  the rows a block, where the rows are the block's fastest threads)."""
  lane = lidx if lane is None else lane
  step = group // 2
  while step:
    low = lane.lt(step)
    partner = low.where(lidx + step * stride, lidx)   # (the upper threads read in bounds and store nothing)
    stores = []
    for red, shared in arrays:
      mine, theirs = (UOp(Ops.LOAD, red.dtype, (shared, index, barrier)) for index in (lidx, partner))
      stores.append(UOp(Ops.STORE, dtypes.void, (shared, lidx, UOp(red.arg, red.dtype, (mine, theirs)), low)))
    barrier = UOp(Ops.BARRIER, dtypes.void, tuple(stores))
    step //= 2
  first = UOp.const(INT, 0) if first is None else first
  return {red: UOp(Ops.LOAD, red.dtype, (shared, first, barrier)) for red, shared in arrays}

WARP_SIZE = 32   # lanes of a warp when the target gives none (every NVIDIA GPU's)

def shuffle_warp(target: object = None) -> int:
  """The warp size whose shuffles row and grid reductions use on `target` (its `warp_size`; WARP_SIZE when it gives
  none), or 0 with WARP_SHUFFLE=0 (every round through shared memory)."""
  return int(getattr(target, "warp_size", WARP_SIZE) or 0) if WARP_SHUFFLE else 0

def _shuffle_rounds(values: list[tuple[Ops, UOp]], lidx: UOp, offsets: list[int], warp: int) -> list[UOp]:
  """Each (op, value) of `values` combined by op with the value of lane `lidx ^ k` for each k of `offsets` in turn (a
  butterfly of warp shuffles, SHUFFLE): every lane of each aligned run of 2*max(offsets) lanes ends with one total,
  the tree in which lane i < k combines lanes i and i + k (the shared-memory tree's order). The values go round by
  round together: each round's shuffles come after every value of the round before (their `after` sources), so all
  partials are computed, their loads issued, before the first shuffle, and a round's shuffles overlap. The upper
  lane of each pair takes the operands in the lower lane's order where the op's bits could depend on it (MAX of
  floats: a NaN's payload or a zero's sign), so every lane holds the same bits."""
  current = [value for _, value in values]
  for k in offsets:
    shuffled = [UOp(Ops.SHUFFLE, value.dtype, (value, *(other for other in dict.fromkeys(current) if other is not value)),
                    (k, warp)) for value in current]
    upper = (lidx & k).ne(0)
    current = [UOp(op, value.dtype, (upper.where(theirs, value), upper.where(value, theirs)))
               if op is Ops.MAX and dtypes.is_float(value.dtype) else UOp(op, value.dtype, (value, theirs))
               for (op, _), value, theirs in zip(values, current, shuffled)]
  return current

def _combine_partials(lidx: UOp, partials: list[tuple[UOp, UOp, str]], group: int, threads: int, warp: int,
                      lane: UOp | None = None, first: UOp | None = None, stride: int = 1) -> dict[UOp, UOp]:
  """Each REDUCE's total over the `group` lanes of its row from each lane's partial (`partials`: REDUCE, its partial
  value, a name for its shared array), read by every lane of the row. With warps of `warp` lanes (0: none) whose
  lanes hold consecutive lanes of one row (`stride` 1), `group` a power of two and the block's `threads` whole warps:
  the lanes of each warp combine by shuffles (`_shuffle_rounds`, no shared memory for a row of at most a warp);
  a longer row's warps then leave their totals in a shared array (one a warp), and after one barrier each lane reads
  them and combines them by shuffles again. Otherwise `_tree_combine`: partials through a shared array of `threads`
  elements in log2(group) barrier-separated rounds. Both are fixed trees: the same bits on every run."""
  if not warp or stride != 1 or group < 2 or group & (group - 1) or threads % warp or \
     any(red.dtype.count != 1 for red, _, _ in partials):
    arrays = [(red, UOp(Ops.DEFINE_LOCAL, red.dtype, (), (name, threads))) for red, _, name in partials]
    stores = tuple(UOp(Ops.STORE, dtypes.void, (shared, lidx, value)) for (_, shared), (_, value, _) in
                   zip(arrays, partials))
    return _tree_combine(lidx, arrays, UOp(Ops.BARRIER, dtypes.void, stores), group, lane, first, stride)
  reds = [red for red, _, _ in partials]
  inside = min(group, warp)
  totals = dict(zip(reds, _shuffle_rounds([(red.arg, value) for red, value, _ in partials], lidx, _halvings(inside),
                                          warp)))
  if group <= warp: return totals
  warps = group // warp   # a row's warps (at most a warp of them: group <= 1024)
  arrays = {red: UOp(Ops.DEFINE_LOCAL, red.dtype, (), (name, threads // warp)) for red, _, name in partials}
  leader = (lidx % warp).eq(0)
  stores = tuple(UOp(Ops.STORE, dtypes.void, (arrays[red], lidx // warp, totals[red], leader)) for red, _, _ in partials)
  barrier = UOp(Ops.BARRIER, dtypes.void, stores)
  row_first = (lidx // group) * warps if threads > group else None
  index = lidx % warps if row_first is None else row_first + lidx % warps
  reads = [(red.arg, UOp(Ops.LOAD, red.dtype, (arrays[red], index, barrier))) for red in reds]
  return dict(zip(reds, _shuffle_rounds(reads, lidx, _halvings(warps), warp)))

def _halvings(n: int) -> list[int]:
  """n/2, n/4, ..., 1 (none for n = 1)."""
  out, k = [], n // 2
  while k:
    out.append(k)
    k //= 2
  return out

def groupable(sink: UOp) -> bool:
  """Whether `map_axes_to_gpu` runs the kernel as one block per row (`group_rows`)."""
  return row_plan(sink) is not None

def _split_over_threads(size: int, lidx: UOp, outer: UOp, group: int = GROUP_SIZE,
                        top: bool = False) -> tuple[UOp, UOp | None]:
  """The element `outer*group + lidx` of a range of `size` (`top`: `lidx*count + outer`, `count` the loop's length;
  clamped to the last one) and whether it is real (None when `group` divides `size`)."""
  element = lidx * outer.src[0].arg + outer if top else outer * group + lidx
  if size % group == 0: return element, None
  valid = element.lt(size)
  return valid.where(element, UOp.const(INT, size - 1)), valid

GRID_BLOCKS = 1024   # blocks of a grid-wide reduction: about 8 a multiprocessor on an H200, one wave
MIN_GRID_REDUCED = 1 << 20   # a full reduction of at least this many elements uses every block (else one block)

def grid_reduction(sink: UOp, plan: RowPlan, new_range, group: int = GROUP_SIZE,
                   blocks: int | None = None, warp: int = WARP_SIZE) -> UOp | None:
  """A full reduction (one reduce group, no row, no elementwise pass) of at least MIN_GRID_REDUCED elements over
  GRID_BLOCKS blocks: each block reduces its share (coalesced, as a row's) to one partial in a device array; thread 0
  then fences and takes a ticket (ATOMIC add on an arrival counter). The block that takes the last ticket sees
  every partial: its threads read them (through L2), combine them in a tree, store the result, and reset the
  counter for the next launch. Fixed orders throughout: the same bits on every run. None where it does not apply.
  `group` threads a block and `blocks` blocks (GPU actions GROUP, GROUP: kiln/codegen/opt/kernel.py); by default
  GROUP_SIZE and GRID_BLOCKS, from MIN_GRID_REDUCED elements. Both combines go through `_combine_partials` (warp
  shuffles within each warp of `warp` lanes; 0: shared memory in every round)."""
  if plan.rows or plan.elementwise is not None or len(plan.groups) != 1: return None
  ranges, reds = plan.groups[0]
  size = prod(r.src[0].arg for r in ranges)
  if blocks is None:
    if size < MIN_GRID_REDUCED: return None
    blocks = GRID_BLOCKS
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", group))
  gidx = UOp(Ops.SPECIAL, INT, (), ("gidx0", blocks))
  blocked = any(red.arg is Ops.ADD and dtypes.is_float(red.dtype) for red in reds)
  loops = [new_range(k) for k in sum_levels(-(-size // (group * blocks)), blocked)]
  element = (_flat_index(loops) * blocks + gidx) * group + lidx
  valid = element.lt(size) if prod(r.src[0].arg for r in loops) * blocks * group != size else None
  if valid is not None: element = valid.where(element, UOp.const(INT, size - 1))
  first = lidx.eq(0)
  scratch, partials = [], []
  for k, red in enumerate(reds):
    body = _substitute(red.src[0], _unflatten(element, list(ranges)))
    if valid is not None: body = valid.where(body, UOp.const(red.dtype, identity_element(red.arg, red.dtype)))
    partials.append((red, _nested(red, body, loops), f"temp0_{k}"))
  block_totals = _combine_partials(lidx, partials, group, group, warp)
  for k, red in enumerate(reds):
    scratch.append(UOp(Ops.DEFINE_LOCAL, red.dtype, (), (f"kiln_partials{k}", blocks, "device")))
  to_device = tuple(UOp(Ops.STORE, dtypes.void, (scratch[k], gidx, block_totals[red], first))
                    for k, red in enumerate(reds))
  counter = UOp(Ops.DEFINE_LOCAL, dtypes.uint32, (), ("kiln_arrivals", 1, "device"))
  zero, one = UOp.const(dtypes.uint32, 0), UOp.const(dtypes.uint32, 1)
  ticket = UOp(Ops.ATOMIC, dtypes.uint32, (counter, UOp.const(INT, 0), one, first, *to_device), Ops.ADD)
  flag = UOp(Ops.DEFINE_LOCAL, INT, (), ("kiln_last_block", 1))
  said = UOp(Ops.STORE, dtypes.void, (flag, UOp.const(INT, 0), ticket.eq(blocks - 1).cast(INT), first))
  last = UOp(Ops.LOAD, INT, (flag, UOp.const(INT, 0), UOp(Ops.BARRIER, dtypes.void, (said,)))).ne(0)
  per_thread = [new_range(blocks // group)] if blocks > group else []
  gathered = []
  for k, red in enumerate(reds):
    read = UOp(Ops.LOAD, red.dtype, (scratch[k], per_thread[0] * group + lidx if per_thread else lidx, last))
    gathered.append((red, _nested(red, read, per_thread), f"temp1_{k}"))
  totals = _combine_partials(lidx, gathered, group, group, warp)
  done = first & last
  stores = [_substitute(st.replace(src=(*st.src[:3], done if len(st.src) == 3 else st.src[3] & done)), totals)
            if st.op is Ops.STORE else st for st in sink.src]
  stores.append(UOp(Ops.STORE, dtypes.void, (counter, UOp.const(INT, 0), zero, done)))   # ready for the next launch
  return graph_rewrite(sink.replace(src=tuple(stores)), symbolic, name="gpudims grid reduction")

def group_rows(sink: UOp, group: int | None = None, per_block: int = 1, top: bool = False,
               grid_blocks: int | None = None, rows_fastest: bool = False, warp: int | None = None) -> UOp | None:
  """A row kernel (`row_plan`) as one block per row (gidx0, the row ranges unflattened) of `row_group_size` threads,
  or, for MULTI_ROW_MIN rows or more of at most MULTI_ROW_MAX elements, G = `row_lanes` threads a row and
  ROW_BLOCK_THREADS / G rows a block (thread `lidx0` is lane `lidx0 % G` of the block's row `lidx0 // G`; rows past
  the end store nothing). For each
  reduce group in turn, a row's G threads reduce every G-th element (coalesced loads) into partials, combined by
  warp shuffles within each warp of `warp` lanes (None: `shuffle_warp()`; 0: none) and through a shared array
  across warps, or in a tree of barrier-separated rounds through shared memory (`_combine_partials`; groups that use
  none of each other's totals are combined together); the elementwise pass then runs element
  `j*G + lane` in a thread's loop j. Up to MAX_UNROLLED_ROW elements a thread, the loops are unrolled instead, and
  every pass reads the same registers. A store that depends on no thread's element is made by the row's lane 0.

  With `group` given (GPU actions GROUP/GROUPTOP, LOCAL: kiln/codegen/opt/kernel.py) the kernel runs `group`
  threads a row (`top`: each a contiguous chunk of the row), `per_block` rows a block (`rows_fastest`: thread
  `lidx0` is lane `lidx0 // per_block` of row `lidx0 % per_block`, so a warp's threads take neighbouring rows: a
  column sum's loads are coalesced), and spreads a full reduction over `grid_blocks` blocks only where given."""
  plan = row_plan(sink)
  if plan is None: return None
  next_id = fresh_range_id(sink)
  def new_range(size: int) -> UOp:
    nonlocal next_id
    next_id += 1
    return UOp(Ops.RANGE, INT, (UOp.const(INT, size),), next_id - 1)
  chosen = group is not None
  if warp is None: warp = shuffle_warp()
  if not chosen or grid_blocks is not None:
    whole = grid_reduction(sink, plan, new_range, warp=warp) if not chosen else \
      grid_reduction(sink, plan, new_range, group, grid_blocks, warp)
    if whole is not None: return whole
  n_rows = prod(r.src[0].arg for r in plan.rows) if plan.rows else 1
  if group is None: group, per_block = default_row_split(plan)
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", group * per_block))
  # several rows a block: thread `lidx` is lane `lidx % group` of the block's row `lidx // group`
  rows_fastest = rows_fastest and per_block > 1
  lane = (lidx // per_block if rows_fastest else lidx % group) if per_block > 1 else lidx
  slot = (lidx % per_block if rows_fastest else lidx // group) if per_block > 1 else None
  finals: dict[UOp, UOp] = {}
  # groups that use none of each other's totals (a normed product's sum and sum of squares) share one tree of rounds
  pending: list[tuple[UOp, UOp, str]] = []   # (REDUCE, its partial, its shared array's name) not combined yet
  def combine() -> None:
    finals.update(_combine_partials(lidx, pending, group, group * per_block, warp, lane,
                                    None if slot is None else slot if rows_fastest else slot * group,
                                    per_block if rows_fastest else 1))
    pending.clear()
  for g, (ranges, reds) in enumerate(plan.groups):
    waiting = {red for red, _, _ in pending}
    if waiting and any(u in waiting for red in reds for u in red.src[0].toposort()): combine()
    size = prod(r.src[0].arg for r in ranges)
    count = -(-size // group)
    if count <= MAX_UNROLLED_ROW:   # a thread's elements, unrolled (shared with the other passes: read once)
      elements, loops = _thread_elements(size, lane, count, group, top), None
    else:
      blocked = any(red.arg is Ops.ADD and dtypes.is_float(red.dtype) for red in reds)
      loops = [new_range(k) for k in sum_levels(count, blocked)]
      if top:   # a contiguous chunk of `count` elements a thread
        step = _flat_index(loops)
        element = lane * count + step
        valid = element.lt(size) if count * group != size else None
        if prod(r.src[0].arg for r in loops) != count:
          valid = step.lt(count) if valid is None else step.lt(count) & valid
      else:
        element = _flat_index(loops) * group + lane
        valid = element.lt(size) if prod(r.src[0].arg for r in loops) * group != size else None
      elements = [(element if valid is None else valid.where(element, UOp.const(INT, size - 1)), valid)]
    for k, red in enumerate(reds):
      bodies = []
      for element, valid in elements:
        body = _substitute(red.src[0], {**finals, **_unflatten(element, list(ranges))})
        bodies.append(body if valid is None else
                      valid.where(body, UOp.const(red.dtype, identity_element(red.arg, red.dtype))))
      partial = _nested(red, bodies[0], loops) if loops is not None else _chain(red, bodies)
      pending.append((red, partial, f"temp{g}_{k}"))
  combine()
  elements = [(None, None)]
  if plan.elementwise is not None:
    size = plan.elementwise.src[0].arg
    count = -(-size // group)
    elements = _thread_elements(size, lane, count, group, top) if count <= MAX_UNROLLED_ROW else \
      [_split_over_threads(size, lane, new_range(count), group, top)]
  # the block's row (its rows, with several a block: the last block's rows past the end read the last row and
  # store nothing)
  blocks = -(-n_rows // per_block)
  block = UOp(Ops.SPECIAL, INT, (), ("gidx0", blocks)) if plan.rows else None
  row, row_valid = block, None
  if block is not None and per_block > 1:
    row = block * per_block + slot
    if blocks * per_block != n_rows:
      row_valid = row.lt(n_rows)
      row = row_valid.where(row, UOp.const(INT, n_rows - 1))
  first = lane.eq(0)
  stores = []
  for store in sink.src:
    per_thread = store.op is Ops.STORE and plan.elementwise is not None and plan.elementwise in store.toposort()
    for element, valid in (elements if per_thread else [(None, None)]):
      gate = valid if per_thread else first if store.op is Ops.STORE else None
      if row_valid is not None and store.op is Ops.STORE: gate = row_valid if gate is None else gate & row_valid
      copy = store if gate is None else \
        store.replace(src=(*store.src[:3], gate if len(store.src) == 3 else store.src[3] & gate))
      stores.append(_substitute(copy, {**finals, plan.elementwise: element} if per_thread else finals))
  grouped = sink.replace(src=tuple(stores))
  if plan.rows:   # the row ranges, in the partials' bodies too: the row index (the block index, one row a block)
    grouped = _substitute(grouped, _unflatten(row, list(plan.rows)))
  return graph_rewrite(grouped, symbolic, name="gpudims group")

def default_row_split(plan: RowPlan) -> tuple[int, int]:
  """(threads a row, rows a block) that a row kernel gets without GPU actions: `row_lanes` threads a row and
  ROW_BLOCK_THREADS of threads a block for MULTI_ROW_MIN rows or more of at most MULTI_ROW_MAX elements, else a
  block of `row_group_size` threads a row."""
  longest = max([prod(r.src[0].arg for r in ranges) for ranges, _ in plan.groups] +
                ([plan.elementwise.src[0].arg] if plan.elementwise is not None else []))
  n_rows = prod(r.src[0].arg for r in plan.rows) if plan.rows else 1
  if n_rows >= MULTI_ROW_MIN and longest <= MULTI_ROW_MAX:
    group = row_lanes(longest, n_rows)
    return group, max(1, ROW_BLOCK_THREADS // group)
  return row_group_size(longest), 1

def default_grid(plan: RowPlan) -> tuple[int, int] | None:
  """(threads a block, blocks) of the grid reduction a row kernel gets without GPU actions, or None (one block)."""
  if plan.rows or plan.elementwise is not None or len(plan.groups) != 1: return None
  return (GROUP_SIZE, GRID_BLOCKS) if prod(r.src[0].arg for r in plan.groups[0][0]) >= MIN_GRID_REDUCED else None

def map_axes_to_gpu(sink: UOp, target: object = None) -> UOp:
  """A lowered (and optimized) kernel with its mappable output ranges replaced by the thread index (see the module
  docstring); a kernel with none is returned as it is (it runs as one thread). A kernel of one long reduction
  becomes one block per row instead (`group_rows`), a matmul-shaped one shared-memory tiles
  (kiln/codegen/gpu_tiles.py), an attention-shaped one a flash-style kernel (kiln/codegen/gpu_attention.py). A
  kernel with GPU actions recorded on its SINK (kiln/codegen/opt/kernel.py GPUChoices) is mapped as they chose
  (`map_chosen`; the TC action: tensor-core tiles, kiln/codegen/gpu_mma.py). `target` (the renderer's GPUTarget,
  None: the H200's) gives the multiprocessors the matmul tiles' waves fill and the warp size of the reductions'
  shuffles."""
  from kiln.codegen.gpu_tiles import MULTIPROCESSORS, tile_matmul
  from kiln.codegen.gpu_attention import flash_attention
  from kiln.codegen.opt.kernel import OptOps, gpu_choices
  warp = shuffle_warp(target)
  if (choices := gpu_choices(sink)) is not None:
    if (tc := choices.of(OptOps.TC)):   # tensor-core tiles (kiln/codegen/gpu_mma.py), checked by the action
      from kiln.codegen.gpu_mma import tile_mma
      if (tiled := tile_mma(sink.replace(arg=None), target, tc[0][2])) is None:
        raise RuntimeError(f"gpudims: the kernel's TC action {tc[0]} does not fit it")
      return tiled
    return map_chosen(sink.replace(arg=None), choices, warp)
  if (flash := flash_attention(sink, target)) is not None: return flash
  if (tiled := tile_matmul(sink, getattr(target, "multiprocessors", MULTIPROCESSORS))) is not None: return tiled
  if (grouped := group_rows(sink, warp=warp)) is not None: return grouped
  mapped = mappable_ranges(sink)
  if not mapped: return sink
  total = prod(r.src[0].arg for r in mapped)
  local = block_size(total)
  elementwise = not any(u.op is Ops.REDUCE for u in sink.toposort())
  coarsen = COARSEN if elementwise and total % (local * COARSEN) == 0 and \
    total // (local * COARSEN) >= MIN_COARSE_BLOCKS else 1
  groups = -(-total // (local * coarsen))
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", local))
  gidx = UOp(Ops.SPECIAL, INT, (), ("gidx0", groups)) if groups > 1 else None
  guarded = groups * local * coarsen != total
  copies: list[UOp] = []
  for c in range(coarsen):
    thread = lidx if gidx is None else (gidx * coarsen + c) * local + lidx if coarsen > 1 else gidx * local + lidx
    in_range = thread.lt(total) if guarded else None
    if in_range is not None: thread = in_range.where(thread, UOp.const(INT, total - 1))
    values = _unflatten(thread, mapped)
    for store in sink.src:
      if in_range is not None and store.op is Ops.STORE:
        gate = in_range if len(store.src) == 3 else store.src[3] & in_range
        store = store.replace(src=(*store.src[:3], gate))
      copies.append(_substitute(store, values))
  return graph_rewrite(sink.replace(src=tuple(copies)), symbolic, name="gpudims")

def map_chosen(sink: UOp, choices, warp: int | None = None) -> UOp:
  """A kernel mapped as its GPU actions chose (kiln/codegen/opt/kernel.py, which checked them): a GROUP makes it a
  row kernel (`group_rows` with the chosen threads a row, rows a block and grid blocks; LOCALs before the GROUP put
  the rows fastest among a block's threads, after it the row's lanes); otherwise each mapped range
  is split by its LOCALs and UPCASTs in order (`rest = rest' * k + part`), the LOCAL parts become `lidx0` (the
  parts of later ranges, and of one range the finer ones, fastest), the rests `gidx0` (the last range fastest), and
  the UPCAST parts copies of every store in each thread. A split that does not divide pads its range (the rest
  rounded up): the extra iterations compute the range's last element and store nothing. Without a LOCAL the rests
  are flattened into threads as a kernel without actions is (`block_size` threads a block, the last block
  guarded)."""
  from kiln.codegen.opt.kernel import OptOps
  ranges = {u.arg: u for u in toposort([sink]) if u.op is Ops.RANGE}
  grouped = choices.of(OptOps.GROUP, OptOps.GROUPTOP)
  if grouped:
    rows_a_block = prod(k for _, _, k in choices.of(OptOps.LOCAL))
    rows_fastest = choices.actions[0][0] is OptOps.LOCAL   # a LOCAL before the GROUP: the rows fastest
    out = group_rows(sink, grouped[0][2], rows_a_block, grouped[0][0] is OptOps.GROUPTOP,
                     grouped[1][2] if len(grouped) > 1 else None, rows_fastest, warp)
    if out is None: raise RuntimeError(f"gpudims: the kernel's GPU actions {choices.actions} do not fit it")
    return out
  mapped = mappable_ranges(sink)
  next_id = 1 + max((i for i in ranges if isinstance(i, int)), default=0)
  def part(size: int) -> UOp:   # a placeholder for one part of a range, substituted below
    nonlocal next_id
    next_id += 1
    return UOp(Ops.RANGE, INT, (UOp.const(INT, size),), next_id - 1)
  splits: dict[UOp, list[tuple[OptOps, int]]] = {r: [] for r in mapped}
  for op, rid, k in choices.of(OptOps.LOCAL, OptOps.UPCAST):
    if ranges.get(rid) not in splits: raise RuntimeError(f"gpudims: GPU action {op.name} on loop {rid}, not mapped")
    splits[ranges[rid]].append((op, k))
  locals_, rests, upcasts, forms, padded = [], [], [], {}, set()
  for position, rng in enumerate(mapped):
    multiplier, rest, terms = 1, rng.src[0].arg, []
    for op, k in splits[rng]:
      piece = part(k)
      (locals_ if op is OptOps.LOCAL else upcasts).append(((position, -multiplier), piece))
      terms.append(piece * multiplier if multiplier != 1 else piece)
      multiplier, rest = multiplier * k, -(-rest // k)   # (a k that does not divide pads the range: guarded)
    if rest > 1:
      piece = part(rest)
      rests.append(piece)
      terms.append(piece * multiplier if multiplier != 1 else piece)
    forms[rng] = sum(terms[1:], terms[0]) if terms else UOp.const(INT, 0)
    if multiplier * rest > rng.src[0].arg: padded.add(rng)
  threads: dict[UOp, UOp] = {}
  guard = None
  total = prod(p.src[0].arg for p in rests)
  if locals_:
    pieces = [p for _, p in sorted(locals_, key=lambda t: t[0])]
    threads.update(_unflatten(UOp(Ops.SPECIAL, INT, (), ("lidx0", prod(p.src[0].arg for p in pieces))), pieces))
    if rests: threads.update(_unflatten(UOp(Ops.SPECIAL, INT, (), ("gidx0", total)), rests) if total > 1 else
                             {p: UOp.const(INT, 0) for p in rests})
  elif rests:
    local = block_size(total)
    groups = -(-total // local)
    lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", local))
    thread = lidx if groups == 1 else UOp(Ops.SPECIAL, INT, (), ("gidx0", groups)) * local + lidx
    if groups * local != total:
      guard = thread.lt(total)
      thread = guard.where(thread, UOp.const(INT, total - 1))
    threads.update(_unflatten(thread, rests))
  copies: list[UOp] = []
  pieces = [p for _, p in upcasts]
  for lanes in itertools.product(*(range(p.src[0].arg) for p in pieces)):
    at = {**threads, **{p: UOp.const(INT, c) for p, c in zip(pieces, lanes)}}
    values = {rng: _substitute(form, at) for rng, form in forms.items()}
    gate = guard
    for rng in padded:   # a padded range's extra iterations compute its last element again and store nothing
      inside = values[rng].lt(rng.src[0].arg)
      values[rng] = inside.where(values[rng], UOp.const(INT, rng.src[0].arg - 1))
      gate = inside if gate is None else gate & inside
    for store in sink.src:
      if gate is not None and store.op is Ops.STORE:
        store = store.replace(src=(*store.src[:3], gate if len(store.src) == 3 else store.src[3] & gate))
      copies.append(_substitute(store, values))
  return graph_rewrite(sink.replace(src=tuple(dict.fromkeys(copies))), symbolic, name="gpudims chosen")

def fresh_range_id(sink: UOp) -> int:
  """A RANGE id no range of `sink` has: one past the largest integer id."""
  return 1 + max((u.arg for u in sink.toposort() if u.op is Ops.RANGE and isinstance(u.arg, int)), default=0)

def _unflatten(thread: UOp, mapped: list[UOp]) -> dict[UOp, UOp]:
  """Each mapped range's value at flat thread index `thread` (the last range fastest)."""
  values: dict[UOp, UOp] = {}
  stride = 1
  for k, rng in enumerate(reversed(mapped)):
    index = thread if stride == 1 else thread // stride
    values[rng] = index if k == len(mapped) - 1 else index % rng.src[0].arg
    stride *= rng.src[0].arg
  return values

def _substitute(node: UOp, values: dict[UOp, UOp]) -> UOp:
  from kiln.codegen.opt.kernel import substitute
  return substitute(node, values)

def toposort_specials(sink: UOp) -> list[UOp]:
  """The SPECIAL nodes of a kernel graph (or the SPECIALs among linear uops, `launch_size` takes either)."""
  return [u for u in toposort([sink]) if u.op is Ops.SPECIAL]

def launch_size(uops: list[UOp]) -> tuple | None:
  """(grid, block) sizes of a kernel whose uops hold SPECIAL ops, or None when it has none; (grid, block, bytes)
  where its shared arrays need `bytes` of dynamic shared memory (over 48 KiB: kiln/renderer/shared_memory.py)."""
  specials = {u.arg[0]: u.arg[1] for u in uops if u.op is Ops.SPECIAL}
  shared = dynamic_shared_bytes(uops)
  if not specials and not shared: return None
  grid = tuple(specials.get(f"gidx{i}", 1) for i in range(3))
  block = tuple(specials.get(f"lidx{i}", 1) for i in range(3))
  return (grid, block, shared) if shared else (grid, block)
