"""Gathers as loads: a sum over a table axis that picks one row by comparing an index with the loop variable becomes
one guarded load of that row.

Index lookups (`Embedding`, `x[idx]`, `gather`, one-hot products) reach the kernel as
`REDUCE(ADD, where(e == r, value(r), 0), r)`: every output element loops over the whole indexed axis. When `e` does
not depend on the loop variable `r`, at most one `r` matches, so the sum is `value(e)` where `0 <= e < size(r)` and 0
elsewhere. The rewrite keeps the old result bit for bit (see `reduce_of_one_hot_to_load`), including out-of-range and
negative indices, which give 0 as before (a wrap of negative indices, when the graph had one, is part of `e`).
"""
from __future__ import annotations
from dataclasses import dataclass
from kiln.dtype import DType, dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import UPat, PatternMatcher, graph_rewrite, substitute
from kiln.uop.symbolic import symbolic

INT = dtypes.int32

@dataclass(frozen=True)
class _Hit:
  """A loop body that is `value` where `compare` holds and `miss` elsewhere (`miss` does not depend on the loop)."""
  compare: UOp   # CMPEQ between the loop variable's side and the index side
  value: UOp
  miss: UOp

def _depends_on(u: UOp, rng: UOp) -> bool:
  return rng in u.sparents()

def _is_zero(u: UOp) -> bool:
  return u.op is Ops.CONST and u.arg == 0

def _exact_in(dtype: DType, lo: int, hi: int) -> bool:
  """Every integer in [lo, hi] has its own value in `dtype` (so a cast of the loop variable to it is one-to-one)."""
  if dtypes.is_int(dtype): return dtypes.min(dtype) <= lo and hi <= dtypes.max(dtype)
  if dtypes.is_float(dtype):
    limit = 2 ** (dtypes.finfo(dtype)[1] + 1)
    return -limit <= lo and hi <= limit
  return False

def _split_hit(body: UOp, rng: UOp) -> _Hit | None:
  """`body` as value-where-compare-holds, looking through casts and products; None if it is not of that form."""
  if body.op is Ops.WHERE:
    cond, yes, no = body.src
    if _is_zero(no) and cond.op is Ops.CMPEQ: return _Hit(cond, yes, no)
    if _is_zero(yes) and cond.op is Ops.CMPNE: return _Hit(cond.replace(op=Ops.CMPEQ), no, yes)
    return None
  if body.op is Ops.CAST:
    # a cast of the miss value must stay a constant zero (a cast of a NaN to an int is undefined)
    if (inner := _split_hit(body.src[0], rng)) is not None and _is_zero(inner.miss):
      return _Hit(inner.compare, inner.value.cast(body.dtype), UOp.const(body.dtype, 0))
    return None
  if body.op in (Ops.MUL, Ops.AND):
    for hit_side, other in (body.src, body.src[::-1]):
      if (inner := _split_hit(hit_side, rng)) is None: continue
      # ints and bools: miss * y is 0 for every y; floats: 0 * y is NaN for an infinite y, so y must not vary with
      # the loop (then the misses are all the same value and can be added once)
      exact_zero = not dtypes.is_float(body.dtype)
      if not exact_zero and _depends_on(other, rng): return None
      miss = UOp.const(body.dtype, 0) if exact_zero else inner.miss.alu(body.op, other)
      return _Hit(inner.compare, inner.value.alu(body.op, other), miss)
  return None

def _loop_side(side: UOp, rng: UOp) -> int | None:
  """The offset c when `side` is `r + c` or a one-to-one cast of it (checked by the caller), else None."""
  if side.op is Ops.CAST: side = side.src[0]
  if side is rng: return 0
  if side.op is Ops.ADD and side.src[0] is rng and side.src[1].op is Ops.CONST: return side.src[1].arg
  return None

def _index_and_guard(compare: UOp, rng: UOp, size: int) -> tuple[UOp, UOp] | None:
  """For `index == f(r)` with f(r) = cast(r + c): the int32 loop position it hits and when it hits one at all."""
  for index, loop_side in (compare.src, compare.src[::-1]):
    if _depends_on(index, rng) or (offset := _loop_side(loop_side, rng)) is None: continue
    lo, hi, dtype = offset, size - 1 + offset, index.dtype
    if not (_exact_in(INT, lo, hi) and _exact_in(dtype, lo, hi)): return None
    if loop_side.op is Ops.CAST and loop_side.src[0].dtype != INT: return None
    in_range = index.lt(lo).logical_not() & UOp.const(dtype, hi).lt(index).logical_not()
    if dtypes.is_float(dtype):
      in_range = in_range & index.eq(index)   # NaN compares false everywhere, so it hits nothing
      # the cast to int is defined only in range; a non-integer value hits nothing either
      position = in_range.where(index, UOp.const(dtype, lo)).cast(INT)
      return position - lo, in_range & position.cast(dtype).eq(index)
    if not dtypes.is_int(dtype): return None
    return index.cast(INT) - lo, in_range
  return None

def _guard_loads(value: UOp, rng: UOp, guard: UOp) -> UOp:
  """`value` with every load whose address moves with the loop gated by `guard` (a miss must not read memory)."""
  gated = {}
  for load in value.toposort():
    if load.op is not Ops.LOAD or not _depends_on(load, rng): continue
    gate = guard if len(load.src) == 2 else load.src[2] & guard
    gated[load] = UOp(Ops.LOAD, load.dtype, (load.src[0], load.src[1], gate))
  return substitute(value, gated) if gated else value

def reduce_of_one_hot_to_load(red: UOp) -> UOp | None:
  """sum over r of where(e == r, v(r), 0) -> where(0 <= e < size(r), v(e), 0), a load instead of a loop"""
  body, ranges = red.src[0], red.src[1:]
  for rng in ranges:
    size = rng.src[0].arg if rng.src[0].op is Ops.CONST else None
    if not isinstance(size, int) or size < 1: continue
    if (hit := _split_hit(body, rng)) is None or _depends_on(hit.miss, rng): continue
    if (found := _index_and_guard(hit.compare, rng, size)) is None: continue
    position, guard = found
    picked = substitute(_guard_loads(hit.value, rng, guard), {rng: position})
    new_body = guard.where(picked, hit.miss)
    # the misses the loop added: zeros change nothing, but a NaN miss (0 * inf) must still make the sum NaN
    if dtypes.is_float(red.dtype) and not _is_zero(hit.miss) and size > 1: new_body = new_body + hit.miss
    rest = tuple(r for r in ranges if r is not rng)
    if rest: return UOp(Ops.REDUCE, red.dtype, (new_body,) + rest, red.arg)
    # the accumulator starts at +0.0, so a picked -0.0 came out as +0.0 (x + 0.0 is kept by the simplifier)
    return new_body + UOp.const(red.dtype, 0.0) if dtypes.is_float(red.dtype) else new_body
  return None

gather_rules = PatternMatcher([
  (UPat(Ops.REDUCE, arg=Ops.ADD, name="red", allow_any_len=True), reduce_of_one_hot_to_load),
])

def rewrite_gathers(lowered: UOp) -> UOp:
  """A lowered kernel with every one-hot sum over a table axis turned into a guarded load (see module docstring)."""
  if not any(u.op is Ops.REDUCE and u.arg is Ops.ADD for u in lowered.toposort()): return lowered
  rewritten = graph_rewrite(lowered, gather_rules, name="gather")
  # simplify the new index arithmetic only where a gather was found (most reductions are not gathers)
  return lowered if rewritten is lowered else graph_rewrite(rewritten, symbolic, name="gather simplify")
