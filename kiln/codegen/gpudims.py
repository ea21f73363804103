"""Axis mapping for GPU targets: a lowered kernel's output ranges whose iterations touch disjoint memory become one
flat thread index (block `gidx0` x thread `lidx0`, SPECIAL ops); every other range stays a loop in each thread.

Which ranges: output ranges (reduced by no REDUCE) of constant size for which a disjointness proof holds: every
index into a written buffer is affine in them, `sum(c_k * r_k) + rest`, with coefficients that, sorted, each pass the
span of everything finer (so two threads never write, or read what the other writes, at one address; the rule of
kiln/codegen/parallel.py, for several ranges at once). A KBLOCK block loop (its iterations update the same outputs),
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
from kiln.dtype import dtypes
from kiln.helpers import prod
from kiln.uop.ops import UOp, Ops, toposort
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic

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

_ALL = object()   # `_first_conflict`'s answer when no range may be mapped
Linear = tuple[dict[UOp, int], int, int]   # an index as sum(coefficient * range) + rest, rest in [low, high]

def _linear(index: UOp, ranges: frozenset[UOp], memo: dict[UOp, Linear | None]) -> Linear | None:
  """`index` as an affine form over `ranges` plus a bounded rest, or None when it is not one."""
  if index in memo: return memo[index]
  if index in ranges: form: Linear | None = ({index: 1}, 0, 0)
  elif not any(u in ranges for u in index.toposort()):
    low, high = index.vmin, index.vmax
    form = ({}, low, high) if isinstance(low, int) and isinstance(high, int) else None
  elif index.op is Ops.ADD:
    parts = [_linear(s, ranges, memo) for s in index.src]
    if any(p is None for p in parts): form = None
    else:
      coefficients: dict[UOp, int] = {}
      for part in parts:
        for rng, c in part[0].items(): coefficients[rng] = coefficients.get(rng, 0) + c   # type: ignore[index]
      form = (coefficients, sum(p[1] for p in parts), sum(p[2] for p in parts))   # type: ignore[index]
  elif index.op is Ops.MUL and any(s.op is Ops.CONST and isinstance(s.arg, int) for s in index.src):
    factor = next(s.arg for s in index.src if s.op is Ops.CONST)
    part = _linear(next((s for s in index.src if s.op is not Ops.CONST), index.src[0]), ranges, memo)
    form = None if part is None else ({r: c * factor for r, c in part[0].items()},
                                      *sorted((part[1] * factor, part[2] * factor)))   # type: ignore[assignment]
  else: form = None
  memo[index] = form
  return form

def _first_conflict(nodes: list[UOp], mapped: list[UOp]):
  """A range of `mapped` whose iterations may touch one address of a written buffer (or `_ALL`), else None: every
  store's index must be `sum(c_k * r_k) + rest` with one coefficient per range and buffer, the coefficients sorted by
  size each larger than the span of everything finer (mixed radix: distinct threads, disjoint addresses), and every
  load of a written buffer must stay inside its own thread's addresses."""
  ranges, memo = frozenset(mapped), {}
  stores = [u for u in nodes if u.op is Ops.STORE]
  spans: dict[UOp, Linear] = {}   # written buffer -> its stores' coefficients and the union of their rests
  for store in stores:
    form = _linear(store.src[1], ranges, memo)
    if form is None: return next(r for r in reversed(mapped) if r in store.src[1].toposort())
    if (zero := next((r for r in mapped if form[0].get(r, 0) == 0), None)) is not None: return zero
    if (known := spans.get(store.src[0])) is not None:
      if known[0] != form[0]: return next(r for r in mapped if known[0][r] != form[0][r])
      form = (form[0], min(form[1], known[1]), max(form[2], known[2]))
    spans[store.src[0]] = form
  for coefficients, low, high in spans.values():
    span = high - low
    for rng in sorted(mapped, key=lambda r: abs(coefficients[r])):
      if abs(coefficients[rng]) <= span: return rng
      span += abs(coefficients[rng]) * (rng.src[0].arg - 1)
  for load in nodes:
    if load.op is not Ops.LOAD or load.src[0] not in spans: continue
    form, (coefficients, low, high) = _linear(load.src[1], ranges, memo), spans[load.src[0]]
    if form is None or form[0] != coefficients or form[1] < low or form[2] > high: return _ALL
  return None

def block_size(total: int) -> int:
  """Threads per block for `total` threads of work: a warp multiple that divides it, else all of it when small,
  else 256 (the last block then guarded)."""
  for size in BLOCK_SIZES:
    if total % size == 0: return size
  return total if total <= MAX_ONE_BLOCK else BLOCK_SIZES[0]

def map_axes_to_gpu(sink: UOp) -> UOp:
  """A lowered (and optimized) kernel with its mappable output ranges replaced by the thread index (see the module
  docstring); a kernel with none is returned as it is (it runs as one thread)."""
  mapped = mappable_ranges(sink)
  if not mapped: return sink
  total = prod(r.src[0].arg for r in mapped)
  local = block_size(total)
  groups = -(-total // local)
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", local))
  thread = lidx if groups == 1 else UOp(Ops.SPECIAL, INT, (), ("gidx0", groups)) * local + lidx
  guarded = groups * local != total
  in_range = thread.lt(total) if guarded else None
  if in_range is not None: thread = in_range.where(thread, UOp.const(INT, total - 1))
  values: dict[UOp, UOp] = {}
  stride = 1
  for k, rng in enumerate(reversed(mapped)):
    size = rng.src[0].arg
    index = thread if stride == 1 else thread // stride
    values[rng] = index if k == len(mapped) - 1 else index % size
    stride *= size
  stores = []
  for store in sink.src:
    if in_range is not None and store.op is Ops.STORE:
      gate = in_range if len(store.src) == 3 else store.src[3] & in_range
      store = store.replace(src=(*store.src[:3], gate))
    stores.append(store)
  from kiln.codegen.opt.kernel import substitute
  return graph_rewrite(substitute(sink.replace(src=tuple(stores)), values), symbolic, name="gpudims")

def toposort_specials(sink: UOp) -> list[UOp]:
  """The SPECIAL nodes of a kernel graph (or the SPECIALs among linear uops, `launch_size` takes either)."""
  return [u for u in toposort([sink]) if u.op is Ops.SPECIAL]

def launch_size(uops: list[UOp]) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
  """(grid, block) sizes of a kernel whose uops hold SPECIAL ops, or None when it has none."""
  specials = {u.arg[0]: u.arg[1] for u in uops if u.op is Ops.SPECIAL}
  if not specials: return None
  grid = tuple(specials.get(f"gidx{i}", 1) for i in range(3))
  block = tuple(specials.get(f"lidx{i}", 1) for i in range(3))
  return grid, block   # type: ignore[return-value]
