"""The disjointness proof: may the iterations of some loops of a kernel run at once, on separate threads?

Both targets ask it on the kernel graph in the axis-mapping stage (kiln/codegen/pipeline.py `map_axes`): a GPU for
the output ranges it turns into thread indices (kiln/codegen/gpudims.py), a CPU for the outermost output loop its
thread pool splits into chunks (kiln/codegen/threads.py). Iterations may run at once when no two of them touch the
same address of a buffer the kernel writes, unless both only read it. Buffers only read may be indexed in any way;
distinct buffer parameters never alias (kernels declare them `restrict`).

The rule (`first_conflict`): every index into a written buffer is affine in the ranges, `sum(c_k * r_k) + rest`,
with one coefficient per range and buffer, and `rest` independent of the ranges and bounded; the coefficients,
sorted by size, each pass the span of everything finer (mixed radix: distinct iterations, disjoint addresses); every
load of a written buffer stays inside its own iteration's addresses. A data-dependent index (scatter), a store at a
fixed address (an output written by every iteration, a KBLOCK block loop's) or a read of another iteration's output
(an in-place scan) fails it.

A CPU's one loop gets two more forms (`single_loop=True`): a PADTO-clamped index `where(r < n-1, a(r), b)` (its
last iteration's constant among the rests), and blocks that repeat with a period (`_periodic_blocks_are_disjoint`:
a tile's columns of every row).
"""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops

# (bound once: under Python 3.11 each `Ops.X` read costs ~130 ns, and these are read for every index node)
_CONST, _STORE, _LOAD, _ADD, _MUL, _WHERE, _CAST = Ops.CONST, Ops.STORE, Ops.LOAD, Ops.ADD, Ops.MUL, Ops.WHERE, Ops.CAST

Linear = tuple[dict[UOp, int], int, int]   # an index as sum(coefficient * range) + rest, rest in [low, high]
ALL = object()   # `first_conflict`'s answer when no range may be mapped
_DEPENDS = object()   # the key, in a memo of forms, of its table of which nodes depend on the ranges

def _depends(u: UOp, ranges: frozenset[UOp], depends: dict[UOp, bool]) -> bool:
  """Whether node `u` reads one of `ranges` (remembered in `depends`)."""
  if (known := depends.get(u)) is None:
    known = u in ranges
    if not known:
      for s in u.src:
        if _depends(s, ranges, depends):
          known = True
          break
    depends[u] = known
  return known

def linear_form(index: UOp, ranges: frozenset[UOp], memo: dict, single_loop: bool = False) -> Linear | None:
  """`index` as an affine form over `ranges` plus a bounded rest, or None when it is not one. `memo` keeps the
  answers for one set of ranges; `single_loop` (one range) also takes a PADTO-clamped index and a widening CAST."""
  if (form := memo.get(index, memo)) is not memo: return form
  depends = memo.setdefault(_DEPENDS, {})
  if index in ranges: form = ({index: 1}, 0, 0)
  elif not _depends(index, ranges, depends):
    low, high = index.vmin, index.vmax
    form = ({}, low, high) if isinstance(low, int) and isinstance(high, int) else None
  elif (op := index.op) is _ADD:
    coefficients: dict[UOp, int] = {}
    low = high = 0
    for s in index.src:
      if (part := linear_form(s, ranges, memo, single_loop)) is None:
        form = None
        break
      for rng, c in part[0].items(): coefficients[rng] = coefficients.get(rng, 0) + c
      low, high = low + part[1], high + part[2]
    else: form = (coefficients, low, high)
  elif op is _MUL and any(s.op is _CONST and isinstance(s.arg, int) for s in index.src):
    factor = next(s.arg for s in index.src if s.op is _CONST)
    part = linear_form(next((s for s in index.src if s.op is not _CONST), index.src[0]), ranges, memo, single_loop)
    form = None if part is None else ({r: c * factor for r, c in part[0].items()},
                                      *sorted((part[1] * factor, part[2] * factor)))   # type: ignore[assignment]
  elif single_loop and op is _WHERE and len(ranges) == 1 and \
       _is_last_iteration_test(index.src[0], next(iter(ranges))) and not _depends(index.src[2], ranges, depends):
    # a PADTO-clamped index (kiln/codegen/opt/kernel.py): `where(r < n-1, a(r), b)` is a(r) except on the last
    # iteration, which gives b: the same stride, with b's offset from that iteration's start among the rests
    loop = next(iter(ranges))
    part = linear_form(index.src[1], ranges, memo, single_loop)
    other = linear_form(index.src[2], ranges, memo, single_loop)
    if part is None or other is None or other[1] != other[2]: form = None
    else:
      stride = part[0].get(loop, 0)
      offset = other[1] - stride * (loop.src[0].arg - 1)
      form = ({loop: stride}, min(part[1], offset), max(part[2], offset))
  elif single_loop and op is _CAST and dtypes.is_int(index.dtype) and dtypes.is_int(index.src[0].dtype) \
       and index.dtype.itemsize >= index.src[0].dtype.itemsize and \
       dtypes.is_unsigned(index.dtype) == dtypes.is_unsigned(index.src[0].dtype):
    form = linear_form(index.src[0], ranges, memo, single_loop)   # widening, same signedness: the same value
  else: form = None
  memo[index] = form
  return form

def affine_in(index: UOp, loop: UOp, memo: dict) -> tuple[int, int, int] | None:
  """`index` as `stride*loop + rest`: (stride, min(rest), max(rest)), or None when it is not of that form (the
  one-loop forms of `linear_form`; `memo` keeps the answers for `loop`)."""
  form = linear_form(index, frozenset((loop,)), memo, single_loop=True)
  return None if form is None else (form[0].get(loop, 0), form[1], form[2])

def first_conflict(nodes: list[UOp], mapped: list[UOp], single_loop: bool = False):
  """A range of `mapped` whose iterations may touch one address of a written buffer (or `ALL`), else None (the
  module docstring's rule). `nodes`: the kernel's nodes (a graph's toposort, or a linear uop list); `single_loop`
  (with one range): the one-loop forms too, periodic blocks among them."""
  ranges, memo = frozenset(mapped), {}
  stores: list[UOp] = []
  loads: list[UOp] = []
  for u in nodes:
    if (op := u.op) is _STORE: stores.append(u)
    elif op is _LOAD: loads.append(u)
  spans: dict[UOp, Linear] = {}   # written buffer -> its stores' coefficients and the union of their rests
  for store in stores:
    form = linear_form(store.src[1], ranges, memo, single_loop)
    if form is None: return next((r for r in reversed(mapped) if r in store.src[1].toposort()), mapped[-1])
    if (zero := next((r for r in mapped if form[0].get(r, 0) == 0), None)) is not None: return zero
    if (known := spans.get(store.src[0])) is not None:
      if known[0] != form[0]: return next(r for r in mapped if known[0][r] != form[0][r])
      form = (form[0], min(form[1], known[1]), max(form[2], known[2]))
    spans[store.src[0]] = form
  for coefficients, low, high in spans.values():
    span = high - low
    for rng in sorted(mapped, key=lambda r: abs(coefficients[r])):
      if abs(coefficients[rng]) <= span:
        if single_loop and len(mapped) == 1:   # blocks wider than the stride may still repeat with a period
          written = [u for u in loads if u.src[0] in spans]
          return None if _periodic_blocks_are_disjoint(stores + written, rng, memo.setdefault(_DEPENDS, {})) \
            else rng
        return rng
      span += abs(coefficients[rng]) * (int(rng.src[0].vmax) - 1)   # (a CPU's one loop may have a symbolic size)
  for load in loads:
    if load.src[0] not in spans: continue
    form, (coefficients, low, high) = linear_form(load.src[1], ranges, memo, single_loop), spans[load.src[0]]
    if form is None or form[0] != coefficients or form[1] < low or form[2] > high: return ALL
  return None

def loop_is_disjoint(nodes: list[UOp], loop: UOp) -> bool:
  """Whether the iterations of the one loop `loop` touch disjoint addresses of the buffers the kernel writes
  (`first_conflict` with the one-loop forms)."""
  return first_conflict(nodes, [loop], single_loop=True) is None

def _is_last_iteration_test(cond: UOp, loop: UOp) -> bool:
  """Whether `cond` is `loop < n - 1` for a loop of n iterations (true on every iteration but the last)."""
  return cond.op is Ops.CMPLT and cond.src[0] is loop and loop.src[0].op is _CONST and \
    cond.src[1].op is _CONST and cond.src[1].arg == loop.src[0].arg - 1

def _periodic_blocks_are_disjoint(accesses: list[UOp], loop: UOp, depends: dict[UOp, bool]) -> bool:
  """Whether the stores of a kernel (and its loads of the buffers it writes, passed with them) touch disjoint
  addresses in different iterations of `loop` when each iteration's block repeats with a period: an index
  `s*loop + small + big`, where the terms of `small` (and a vector's further lanes) span less than |s| and every term
  of `big` is a multiple of P = |s| * (the loop's trip count). Within one period, iteration i owns
  [s*i + min(small), s*i + min(small) + |s|), and periods never overlap (a tile's columns outside its rows:
  iteration i stores columns 32i..32i+31 of every row; a packed matmul's units of tile columns, whose blocked sum
  reads back its own columns' partial results)."""
  if loop.src[0].op is not _CONST: return False
  ranges = frozenset((loop,))
  spans: dict[UOp, tuple[int, int, int, int]] = {}   # buffer -> (stride, period, lowest small, highest small)
  for st in accesses:
    terms = _linear_terms(st.src[1], loop, ranges, depends)
    if terms is None or (stride := terms.pop(loop, 0)) == 0: return False
    period = abs(stride) * loop.src[0].arg
    low = high = terms.pop(None, 0) % period   # (whole periods of the constant belong to `big`)
    for node, coeff in terms.items():
      # whole periods of each coefficient belong to `big`; the rest, the nearest to 0, to `small`
      if (coeff := coeff % period) > period // 2: coeff -= period
      if coeff == 0: continue
      lo, hi = node.vmin, node.vmax
      if not isinstance(lo, int) or not isinstance(hi, int): return False
      low, high = low + min(coeff * lo, coeff * hi), high + max(coeff * lo, coeff * hi)
    high += (st.dtype if st.op is _LOAD else st.src[2].dtype).count - 1   # a vector access's further lanes
    if st.src[0] in spans:
      known = spans[st.src[0]]
      if known[:2] != (stride, period): return False
      low, high = min(low, known[2]), max(high, known[3])
    spans[st.src[0]] = (stride, period, low, high)
  return all(high - low < abs(stride) for stride, _, low, high in spans.values())

def _linear_terms(index: UOp, loop: UOp, ranges: frozenset[UOp], depends: dict[UOp, bool]) \
    -> dict[UOp | None, int] | None:
  """`index` as a sum of integer multiples of nodes (sums and multiplications by constants taken apart; `None` keys
  the constant), or None where `loop` appears otherwise than as a term."""
  if index.op is _CONST and isinstance(index.arg, int): return {None: index.arg}
  if index.op is Ops.ADD:
    out: dict[UOp | None, int] = {}
    for src in index.src:
      if (part := _linear_terms(src, loop, ranges, depends)) is None: return None
      for node, coeff in part.items(): out[node] = out.get(node, 0) + coeff
    return out
  if index.op is Ops.MUL and (factor := next((s for s in index.src if s.op is _CONST), None)) is not None \
     and isinstance(factor.arg, int):
    other = index.src[1] if index.src[0] is factor else index.src[0]
    if (part := _linear_terms(other, loop, ranges, depends)) is None: return None
    return {node: coeff * factor.arg for node, coeff in part.items()}
  if index is loop or not _depends(index, ranges, depends): return {index: 1}
  return None
