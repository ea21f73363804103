"""Symbolic simplification: rewrite rules that fold constants and keep integer index arithmetic small and canonical.

Three matchers, each a superset of the one before:
- `constant_folding`: an ALU op or CAST whose operands are all constants becomes one constant, computed as the device
  would (C semantics: ints wrap, integer division and modulo truncate toward zero, floats round to their dtype).
- `symbolic_simple`: plus identities that hold for every value of every operand (`x*1`, `x+0` on ints, `-(-x)`, ...).
- `symbolic`: plus rules that use value ranges (`vmin`/`vmax`) and canonical sums. This is what `UOp.simplify()` and
  the codegen lowerer use. It is meant for kernel-level graphs (index math over RANGE/DEFINE_VAR, loads, ALU).

Integer sums are kept in one canonical form, so equal expressions built in different orders become the same node:
a left-nested chain of terms `t` or `t*c` (each term at most once, sorted by `term_order_key`), then one constant.
`ADD`, `SUB`, `NEG` and multiplication by constants are exact in wrapping int arithmetic (a ring), so collecting
terms is always valid. Division, modulo and comparisons are not: those rules first check, from the operands' value
ranges, that the sum cannot wrap, and then only apply where C's truncation toward zero agrees with the math.

>>> from kiln.uop.ops import UOp, Ops
>>> from kiln.dtype import dtypes
>>> r0 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 8),), arg=0)
>>> r1 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 4),), arg=1)
>>> ((r0*4 + r1) // 4).simplify().render()
'ridx0'
"""
from __future__ import annotations
import math, zlib
from typing import Any
import numpy as np
from kiln.dtype import DType, dtypes, truncate, to_numpy_dtype, INTS, FLOATS
from kiln.uop.ops import UOp, Ops, GroupOp, toposort
from kiln.uop.pattern import UPat, PatternMatcher

INT_DTYPES = frozenset(INTS)
FLOAT_DTYPES = frozenset(FLOATS)

# ---------------------------------------------------------------------------------------------------------------------
# evaluating one op on constants, as the device does

# the Ops members the functions below test, bound once: under Python 3.11 each `Ops.X` read costs ~130 ns (EnumType's
# __getattr__ puts every attribute read on the class on a slow path), ~20x a global's
_ADD, _AND, _CMPEQ, _CMPLT, _CMPNE, _CONST = Ops.ADD, Ops.AND, Ops.CMPEQ, Ops.CMPLT, Ops.CMPNE, Ops.CONST
_DEFINE_VAR, _FDIV, _IDIV, _MAX = Ops.DEFINE_VAR, Ops.FDIV, Ops.IDIV, Ops.MAX
_MOD, _MUL, _NEG, _OR, _POW, _RANGE = Ops.MOD, Ops.MUL, Ops.NEG, Ops.OR, Ops.POW, Ops.RANGE
_RECIP, _SHL, _SHR, _SQRT, _SUB = Ops.RECIP, Ops.SHL, Ops.SHR, Ops.SQRT, Ops.SUB
_TRUNC, _WHERE, _XOR = Ops.TRUNC, Ops.WHERE, Ops.XOR

def _c_div(a: int, b: int) -> int:
  """Integer division truncating toward zero, exactly (no float rounding for big ints)."""
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b > 0) else -q

def _c_mod(a: int, b: int) -> int:
  """C's `a % b`: the remainder takes the sign of `a`."""
  return a - b * _c_div(a, b)

def _int_alu(op: Ops, dtype: DType, xs: list) -> Any:
  """`op` on Python ints (or bools) in int/bool `dtype`; None where C leaves the result undefined."""
  bits = dtype.bitsize
  if op is _NEG: return -xs[0]
  if op is _TRUNC: return xs[0]
  if op is _ADD: return xs[0] + xs[1]
  if op is _SUB: return xs[0] - xs[1]
  if op is _MUL: return xs[0] * xs[1]
  if op in (_IDIV, _MOD):
    if xs[1] == 0: return None
    out = _c_div(xs[0], xs[1]) if op is _IDIV else _c_mod(xs[0], xs[1])
    return out if dtypes.min(dtype) <= out <= dtypes.max(dtype) else None   # INT_MIN // -1 traps
  if op is _MAX: return max(xs[0], xs[1])
  if op is Ops.WHERE: return xs[1] if xs[0] else xs[2]
  if op is _AND: return xs[0] & xs[1]
  if op is _OR: return xs[0] | xs[1]
  if op is _XOR: return xs[0] ^ xs[1]
  if op in (_SHL, _SHR):
    if not 0 <= xs[1] < max(bits, 1): return None
    return xs[0] << xs[1] if op is _SHL else xs[0] >> xs[1]
  if op is _POW:
    if xs[1] < 0: return None
    return pow(int(xs[0]), int(xs[1]), 1 << max(bits, 1)) if dtype != dtypes.bool else bool(xs[0] or xs[1] == 0)
  return None   # EXP2, LOG2, SIN, SQRT, RECIP, FDIV have no integer version

def _float_alu(op: Ops, dtype: DType, xs: list) -> Any:
  """`op` on Python floats, computed in `dtype`'s precision (bfloat16 in float32, then rounded)."""
  np_type = np.float32 if dtype in (dtypes.bfloat16, *dtypes.fp8s) else to_numpy_dtype(dtype).type
  a = [np_type(x) for x in xs]
  with np.errstate(all="ignore"):
    # (EXP2, LOG2, SIN and POW are not folded: NumPy's float32 versions are not the kernels' (np.sin(float32(1)) is an
    # ulp above the correctly rounded value the CPU's software sin gives), and a folded copy of a value that a kernel
    # also computes made a max's gradient mask (x == max) false everywhere)
    if op is _NEG: out = -a[0]
    elif op is _TRUNC: out = np.trunc(a[0])
    elif op is _SQRT: out = np.sqrt(a[0])
    elif op is _RECIP: out = np_type(1) / a[0]
    elif op is _ADD: out = a[0] + a[1]
    elif op is _SUB: out = a[0] - a[1]
    elif op is _MUL: out = a[0] * a[1]
    elif op is _FDIV: out = a[0] / a[1]
    elif op is _MAX:
      if math.isnan(xs[0]) or math.isnan(xs[1]): return None   # fmax and `a>b?a:b` disagree on NaN
      out = np.maximum(a[0], a[1])
    else: return None
  return float(out)

_FAST_INT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR,
                           Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})

def exec_alu(op: Ops, dtype: DType, operands: tuple, operand_dtype: DType | None = None) -> Any:
  """The value of ALU `op` on constant `operands` with result `dtype`, or None when it must not be folded.

  `operand_dtype` (default: `dtype`) is the operands' dtype; it differs for comparisons, whose result is bool.

  >>> exec_alu(Ops.IDIV, dtypes.int32, (-7, 2)), exec_alu(Ops.MOD, dtypes.int32, (-7, 2))
  (-3, -1)
  >>> exec_alu(Ops.ADD, dtypes.int8, (127, 1))
  -128
  """
  operand_dtype = operand_dtype or dtype
  if (limits := _INT_LIMITS.get(operand_dtype)) is not None and op in _FAST_INT_OPS:
    # the common case (index math: int operands that fit, +, *, <, ...): no conversion on the way in
    lo, hi = limits
    if all(type(x) is int and lo <= x <= hi for x in operands):
      if op in GroupOp.Comparison:
        if op is _CMPLT: return operands[0] < operands[1]
        return (operands[0] != operands[1]) if op is _CMPNE else (operands[0] == operands[1])
      out = _int_alu(op, dtype, list(operands))
      if out is None: return None
      out_limits = _INT_LIMITS.get(dtype)
      return out if out_limits is not None and out_limits[0] <= out <= out_limits[1] else truncate(dtype, out)
  xs = [truncate(operand_dtype, x) for x in operands]
  if op in GroupOp.Comparison:
    if op is _CMPLT: return xs[0] < xs[1]
    return (xs[0] != xs[1]) if op is _CMPNE else (xs[0] == xs[1])
  if dtypes.is_float(operand_dtype): out = _float_alu(op, operand_dtype, xs)
  else: out = _int_alu(op, dtype, [int(x) for x in xs])
  return None if out is None else truncate(dtype, out)

def cast_value(value, from_dtype: DType, to_dtype: DType) -> Any:
  """A constant converted as a C cast does, or None where C leaves it undefined (float out of an int's range)."""
  if to_dtype == dtypes.bool: return bool(value)
  if dtypes.is_int(to_dtype):
    if dtypes.is_float(from_dtype):
      if math.isnan(value) or math.isinf(value): return None
      value = int(value)   # truncates toward zero
      return value if dtypes.min(to_dtype) <= value <= dtypes.max(to_dtype) else None
    return truncate(to_dtype, int(value))
  if dtypes.is_float(to_dtype): return truncate(to_dtype, float(value))
  return None

# ---------------------------------------------------------------------------------------------------------------------
# a deterministic order on terms, so that sums built in any order come out the same

# each node's key is kept on the node (`UOp._order`): a weak-keyed dictionary made a weak reference per lookup, and
# sorting a sum's terms asks for every term's key (~20k sums in the ResNet-50 step's lowering)
_NO_LEAF = (3, 0, "")

def _has_order_key(u: UOp) -> bool: return u._order is not None

def _compute_order_key(u: UOp) -> tuple:
  child_keys = [s._order for s in u.src]
  if u.op is _RANGE and isinstance(u.arg, int): leaf = (0, u.arg, "")
  elif u.op is _DEFINE_VAR: leaf = (1, 0, str(u.arg[0]))
  else: leaf = min((k[0] for k in child_keys), default=_NO_LEAF)
  depth = 1 + max((k[1] for k in child_keys), default=0)
  # a structural digest that is the same in every run (str hashes are salted per process, ints and tuples are not)
  digest = hash((u.op.value, zlib.crc32(f"{u.dtype.name}|{u.arg!r}".encode())) + tuple(k[2] for k in child_keys))
  return (leaf, depth, digest)

def term_order_key(u: UOp) -> tuple:
  """Sort key of a term in a canonical sum: by the first loop variable / Variable it uses, then size, then structure.

  Equal nodes get equal keys, and keys do not depend on construction order or the process, so canonical sums are
  reproducible (e.g. `ridx0*4 + ridx1`, never `ridx1 + ridx0*4`).
  """
  key = u._order
  if key is None:
    for node in toposort([u], stop=_has_order_key):
      if node._order is None: node._order = _compute_order_key(node)
    key = u._order
  return key

# ---------------------------------------------------------------------------------------------------------------------
# linear forms of integer expressions

_INT_LIMITS = {dt: (dtypes.min(dt), dtypes.max(dt)) for dt in INTS}

def wrap_int(dtype: DType, value: int) -> int:
  """`value` wrapped into int `dtype`, as the device's int arithmetic wraps it."""
  return _wrap(dtype, value)

def _wrap(dtype: DType, value: int) -> int:
  """`value` wrapped into int `dtype` (fast when it already fits)."""
  lo, hi = _INT_LIMITS[dtype]
  return value if lo <= value <= hi else truncate(dtype, value)

MAX_LINEAR_NODES = 64   # sums bigger than this are left alone (keeps rewriting linear time on huge unrolled sums)

def linear_form(u: UOp) -> tuple[dict[UOp, int], int] | None:
  """`u` as ({term: coefficient}, constant), looking through ADD, SUB, NEG and multiplication by constants.

  Coefficients and the constant are wrapped to `u.dtype` like the device wraps them; a term whose coefficient wraps
  to 0 is dropped. None when `u` is not an int, is too big, or holds tensor-level constants.
  """
  dtype = u.dtype
  if dtype not in INT_DTYPES: return None
  terms: dict[UOp, int] = {}
  const = 0
  stack: list[tuple[UOp, int]] = [(u, 1)]
  visited = 0
  while stack:
    node, coef = stack.pop()
    visited += 1
    if visited > MAX_LINEAR_NODES or node.dtype != dtype: return None
    op = node.op
    if op is _CONST:
      if node.src: return None   # a tensor-level constant: not index math
      const += coef * node.arg
    elif op is _ADD or op is _SUB:
      stack.append((node.src[1], coef if op is _ADD else -coef))
      stack.append((node.src[0], coef))
    elif op is _NEG: stack.append((node.src[0], -coef))
    elif op is _MUL and node.src[1].op is _CONST and not node.src[1].src:
      stack.append((node.src[0], coef * node.src[1].arg))
    elif op is _MUL and node.src[0].op is _CONST and not node.src[0].src:
      stack.append((node.src[1], coef * node.src[0].arg))
    else: terms[node] = terms.get(node, 0) + coef
  wrapped = {t: _wrap(dtype, a) for t, a in terms.items()}
  return {t: a for t, a in wrapped.items() if a != 0}, _wrap(dtype, const)

def is_multiple_of(u: UOp, n: int) -> bool:
  """Whether int `u` is a multiple of `n` (a power of two) for every value of its ranges, thread indices and variables:
  a sufficient test (False where unproven), through sums, products, shifts, selects and remainders.

  >>> from kiln.uop.ops import UOp, Ops
  >>> from kiln.dtype import dtypes
  >>> r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 8),), arg=0)
  >>> is_multiple_of(r * 8 + 12, 4), is_multiple_of(r * 8 + 2, 4), is_multiple_of(r, 2)
  (True, False, False)
  """
  form = linear_form(u) if u.dtype in INT_DTYPES else None
  if form is None: return _term_is_multiple_of(u, n)
  terms, const = form
  return const % n == 0 and all(c % n == 0 or _term_is_multiple_of(t, n) for t, c in terms.items())

def _term_is_multiple_of(u: UOp, n: int) -> bool:
  """`is_multiple_of` of one term of a sum: a constant, a product, a shift, a select or a remainder."""
  op = u.op
  if op is _CONST: return not u.src and isinstance(u.arg, int) and u.arg % n == 0
  if op is _ADD or op is Ops.SUB: return all(is_multiple_of(s, n) for s in u.src)
  if op is _MUL: return any(is_multiple_of(s, n) for s in u.src)
  if op is Ops.SHL and u.src[1].op is _CONST and isinstance(u.src[1].arg, int) and 0 <= u.src[1].arg < 31:
    return (1 << u.src[1].arg) % n == 0 or is_multiple_of(u.src[0], n)
  if op is Ops.WHERE: return is_multiple_of(u.src[1], n) and is_multiple_of(u.src[2], n)
  if op is Ops.MOD: return is_multiple_of(u.src[0], n) and is_multiple_of(u.src[1], n)   # x - (x/c)*c
  return False

# canonical sums made by build_sum (fixed points of canonical_sum) are marked on the node (`UOp._canonical`, which a
# weak set's Python-level add and membership test cost ~10x) instead of being rebuilt

def mark_canonical(u: UOp) -> UOp:
  """Note that `u` is a canonical sum (made as build_sum would make it), so canonical_sum leaves it; returns `u`."""
  u._canonical = True
  return u

def build_sum(dtype: DType, terms: dict[UOp, int], const: int = 0) -> UOp:
  """The canonical node for `sum(t*a for t, a in terms) + const`: sorted terms, `t*a` for a != 1, constant last."""
  out: UOp | None = None
  for term in sorted(terms, key=term_order_key):
    coef = _wrap(dtype, terms[term])
    if coef == 0: continue
    part = term if coef == 1 else term.alu(_MUL, UOp.const(dtype, coef))
    out = part if out is None else out.alu(_ADD, part)
    # every partial sum (and `t*a`) is canonical too: canonical_sum need not flatten and rebuild it again (rewriting
    # a sum of n terms would otherwise build each of its n partial sums again)
    if out.op is not _CONST and out is not term: out._canonical = True
  const = _wrap(dtype, const)
  if out is None: return UOp.const(dtype, const)
  out = out if const == 0 else out.alu(_ADD, UOp.const(dtype, const))
  out._canonical = True
  return out

def linear_bounds(terms: dict[UOp, int], const: int) -> tuple[int, int]:
  """The mathematical (unwrapped) range of `sum(t*a) + const` from the terms' vmin/vmax."""
  lo = hi = const
  for term, coef in terms.items():
    ends = (coef * term.vmin, coef * term.vmax)
    lo, hi = lo + min(ends), hi + max(ends)
  return lo, hi

def fits(dtype: DType, lo: int, hi: int) -> bool:
  """Whether every value in [lo, hi] is representable in `dtype` (so no wraparound happened computing it)."""
  return dtypes.min(dtype) <= lo and hi <= dtypes.max(dtype)

def _exact_linear(x: UOp) -> tuple[dict[UOp, int], int, int, int] | None:
  """The linear form of `x` and its range, when `x`'s value is certainly its unwrapped mathematical value."""
  form = linear_form(x)
  if form is None: return None
  terms, const = form
  lo, hi = linear_bounds(terms, const)
  return (terms, const, lo, hi) if fits(x.dtype, lo, hi) else None

# ---------------------------------------------------------------------------------------------------------------------
# constant folding rules

def _kernel_const(u: UOp) -> bool: return u.op is Ops.CONST and not u.src

def fold_unary(u: UOp, a: UOp) -> UOp | None:
  """op(c) -> c'"""
  value = exec_alu(u.op, u.dtype, (a.arg,), a.dtype)
  return None if value is None else UOp.const(u.dtype, value)

def fold_binary(u: UOp, a: UOp, b: UOp) -> UOp | None:
  """c1 op c2 -> c"""
  if a.dtype != b.dtype: return None
  value = exec_alu(u.op, u.dtype, (a.arg, b.arg), a.dtype)
  return None if value is None else UOp.const(u.dtype, value)

def fold_where_const(c: UOp, a: UOp, b: UOp) -> UOp:
  """where(True, a, b) -> a; where(False, a, b) -> b"""
  return a if c.arg else b

def fold_cast(u: UOp, c: UOp) -> UOp | None:
  """cast(c) -> c'"""
  value = cast_value(c.arg, c.dtype, u.dtype)
  return None if value is None else UOp.const(u.dtype, value)

constant_folding = PatternMatcher([
  (UPat(GroupOp.Unary, src=(UPat.cvar("a"),), name="u"), fold_unary),
  (UPat(GroupOp.Binary, src=(UPat.cvar("a"), UPat.cvar("b")), name="u"), fold_binary),
  (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), fold_where_const),
  (UPat(Ops.CAST, src=(UPat.cvar("c"),), name="u"), fold_cast),
], pure=True)

# ---------------------------------------------------------------------------------------------------------------------
# identities that hold for every value

def _is_neg_zero(c: UOp) -> bool: return isinstance(c.arg, float) and c.arg == 0 and math.copysign(1.0, c.arg) < 0
def _all_ones(dtype: DType):
  if dtype == dtypes.bool: return True
  return dtypes.max(dtype) if dtypes.is_unsigned(dtype) else -1

def add_zero(x: UOp) -> UOp:
  """x+0 -> x (ints)"""
  return x

def float_add_neg_zero(x: UOp, c: UOp) -> UOp | None:
  """x+(-0.0) -> x (floats; x+0.0 is not x when x is -0.0)"""
  return x if _is_neg_zero(c) else None

def float_sub_zero(x: UOp, c: UOp) -> UOp | None:
  """x-0.0 -> x (floats)"""
  return x if c.arg == 0 and not _is_neg_zero(c) else None

def mul_one(x: UOp) -> UOp:
  """x*1 -> x"""
  return x

def mul_zero(u: UOp) -> UOp:
  """x*0 -> 0 (ints only: NaN*0 and inf*0 are NaN)"""
  return UOp.const(u.dtype, 0)

def div_one(x: UOp) -> UOp:
  """x//1 -> x, x/1.0 -> x"""
  return x

def idiv_neg(x: UOp, c: UOp) -> UOp | None:
  """x//(-c) -> (x//c)*-1 (C division truncates, so it is odd in the divisor)"""
  if c.arg >= 0 or c.arg == dtypes.min(c.dtype): return None
  return x.alu(_IDIV, c.const_like(-c.arg)).alu(_MUL, c.const_like(-1))

def mod_neg(x: UOp, c: UOp) -> UOp | None:
  """x%(-c) -> x%c (C's remainder takes the sign of x only)"""
  if c.arg >= 0 or c.arg == dtypes.min(c.dtype): return None
  return x.alu(_MOD, c.const_like(-c.arg))

def mod_one(u: UOp) -> UOp:
  """x%1 -> 0"""
  return UOp.const(u.dtype, 0)

def sub_self(u: UOp, x: UOp) -> UOp:
  """x-x -> 0 (ints only: inf-inf is NaN)"""
  return UOp.const(u.dtype, 0)

def double_neg(x: UOp) -> UOp:
  """-(-x) -> x"""
  return x

def int_sub_to_add(x: UOp, y: UOp) -> UOp:
  """x-y -> x+y*-1 (ints, exact with wraparound; the form UOp.__sub__ builds)"""
  return x.alu(_ADD, y.alu(_MUL, y.const_like(-1)))

def int_neg_to_mul(x: UOp) -> UOp:
  """-x -> x*-1 (ints)"""
  return x.alu(_MUL, x.const_like(-1))

def const_to_right(u: UOp, c: UOp, x: UOp) -> UOp | None:
  """c op x -> x op c (commutative ops)"""
  return None if _kernel_const(x) else u.replace(src=(x, c))

def where_same(x: UOp) -> UOp:
  """where(c, x, x) -> x"""
  return x

def where_bool(c: UOp, a: UOp, b: UOp) -> UOp | None:
  """where(c, True, False) -> c; where(c, False, True) -> !c"""
  if c.dtype != dtypes.bool or a.dtype != dtypes.bool or a.arg == b.arg: return None
  return c if a.arg else c.logical_not()

def where_not(c: UOp, a: UOp, b: UOp) -> UOp | None:
  """where(!c, a, b) -> where(c, b, a)"""
  return c.alu(_WHERE, b, a) if c.dtype == dtypes.bool else None

def idempotent(x: UOp) -> UOp:
  """x&x -> x, x|x -> x, max(x, x) -> x"""
  return x

def and_const(u: UOp, x: UOp, c: UOp) -> UOp | None:
  """x&0 -> 0, x&~0 -> x (bool: x&False -> False, x&True -> x)"""
  if not c.arg: return UOp.const(u.dtype, 0)
  return x if c.arg == _all_ones(u.dtype) else None

def or_const(u: UOp, x: UOp, c: UOp) -> UOp | None:
  """x|0 -> x, x|~0 -> ~0 (bool: x|False -> x, x|True -> True)"""
  if not c.arg: return x
  return UOp.const(u.dtype, c.arg) if c.arg == _all_ones(u.dtype) else None

def xor_zero(x: UOp, c: UOp) -> UOp | None:
  """x^0 -> x"""
  return x if not c.arg else None

def bool_ne_false(x: UOp) -> UOp | None:
  """x!=False -> x, x==True -> x (x bool)"""
  return x if x.dtype == dtypes.bool else None

def bool_eq_false(x: UOp) -> UOp | None:
  """x==False -> !x (x bool)"""
  return x.logical_not() if x.dtype == dtypes.bool else None

def not_not(x: UOp) -> UOp | None:
  """!!x -> x (x bool)"""
  return x if x.dtype == dtypes.bool else None

def lt_self(u: UOp, x: UOp) -> UOp:
  """x<x -> False"""
  return UOp.const(dtypes.bool, False)

def int_cmp_self(u: UOp, x: UOp) -> UOp | None:
  """x!=x -> False, x==x -> True (not floats: NaN!=NaN)"""
  if x.dtype not in INT_DTYPES and x.dtype != dtypes.bool: return None
  return UOp.const(dtypes.bool, u.op is _CMPEQ)

def cast_noop(u: UOp, x: UOp) -> UOp | None:
  """cast(x: T, T) -> x"""
  return x if x.dtype == u.dtype else None

_TRUE, _FALSE = UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False)
_INT = tuple(INT_DTYPES)

symbolic_simple = constant_folding + PatternMatcher([
  (UPat(GroupOp.Commutative, src=(UPat.cvar("c"), UPat.var("x")), name="u"), const_to_right),
  (UPat(Ops.ADD, dtype=_INT, src=(UPat.var("x"), UPat.const(None, 0))), add_zero),
  (UPat(Ops.ADD, dtype=tuple(FLOAT_DTYPES), src=(UPat.var("x"), UPat.cvar("c"))), float_add_neg_zero),
  (UPat(Ops.SUB, dtype=tuple(FLOAT_DTYPES), src=(UPat.var("x"), UPat.cvar("c"))), float_sub_zero),
  (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), mul_one),
  (UPat(Ops.MUL, dtype=_INT, src=(UPat.var(), UPat.const(None, 0)), name="u"), mul_zero),
  (UPat((Ops.IDIV, Ops.FDIV), src=(UPat.var("x"), UPat.const(None, 1))), div_one),
  (UPat(Ops.MOD, dtype=_INT, src=(UPat.var(), UPat.const(None, 1)), name="u"), mod_one),
  (UPat(Ops.IDIV, dtype=_INT, src=(UPat.var("x"), UPat.cvar("c"))), idiv_neg),
  (UPat(Ops.MOD, dtype=_INT, src=(UPat.var("x"), UPat.cvar("c"))), mod_neg),
  (UPat(Ops.SUB, dtype=_INT, src=(UPat.var("x"), UPat.var("x")), name="u"), sub_self),
  (UPat(Ops.SUB, dtype=_INT, src=(UPat.var("x"), UPat.var("y"))), int_sub_to_add),
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), double_neg),
  (UPat(Ops.NEG, dtype=_INT, src=(UPat.var("x"),)), int_neg_to_mul),
  (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("x"), UPat.var("x"))), where_same),
  (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.cvar("a"), UPat.cvar("b"))), where_bool),
  (UPat(Ops.WHERE, src=(UPat(Ops.CMPNE, src=(UPat.var("c"), _TRUE)), UPat.var("a"), UPat.var("b"))), where_not),
  (UPat((Ops.AND, Ops.OR, Ops.MAX), src=(UPat.var("x"), UPat.var("x"))), idempotent),
  (UPat(Ops.AND, src=(UPat.var("x"), UPat.cvar("c")), name="u"), and_const),
  (UPat(Ops.OR, src=(UPat.var("x"), UPat.cvar("c")), name="u"), or_const),
  (UPat(Ops.XOR, src=(UPat.var("x"), UPat.cvar("c"))), xor_zero),
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(UPat.var("x"), _TRUE)), _TRUE)), not_not),
  (UPat(Ops.CMPNE, src=(UPat.var("x"), _FALSE)), bool_ne_false),
  (UPat(Ops.CMPEQ, src=(UPat.var("x"), _TRUE)), bool_ne_false),
  (UPat(Ops.CMPEQ, src=(UPat.var("x"), _FALSE)), bool_eq_false),
  (UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.var("x")), name="u"), lt_self),
  (UPat((Ops.CMPNE, Ops.CMPEQ), src=(UPat.var("x"), UPat.var("x")), name="u"), int_cmp_self),
  (UPat(Ops.CAST, src=(UPat.var("x"),), name="u"), cast_noop),
], pure=True)

# ---------------------------------------------------------------------------------------------------------------------
# rules that use value ranges and canonical sums (integers)

_RANGE_FOLDABLE = GroupOp.ALU | {Ops.CAST}

def fold_by_range(u: UOp) -> UOp | None:
  """x -> c when vmin == vmax (int and bool results, e.g. comparisons decided by the operands' ranges)"""
  if u.dtype not in INT_DTYPES and u.dtype != dtypes.bool: return None
  if any(s.op is _CONST and s.src for s in u.src): return None   # tensor-level graph: leave to the scheduler
  lo, hi = u.vmin, u.vmax
  return UOp.const(u.dtype, lo) if lo == hi else None

def max_by_range(x: UOp, y: UOp) -> UOp | None:
  """max(x, y) -> x when x >= y for every value in their ranges"""
  if x.dtype in FLOAT_DTYPES: return None
  return x if x.vmin >= y.vmax else None

def recombine_div_mod(dtype: DType, terms: dict[UOp, int]) -> None:
  """(x//c)*c*k + (x%c)*k -> x*k in a sum's terms (any sign: C guarantees x == (x//c)*c + x%c); also for x=y//d"""
  changed = True
  while changed:
    changed = False
    for mod, coef in terms.items():
      if mod.op is not _MOD or not _kernel_const(mod.src[1]) or mod.src[1].arg <= 0: continue
      x, c = mod.src[0], mod.src[1].arg
      quotients = [x.alu(_IDIV, mod.src[1])]
      if x.op is _IDIV and _kernel_const(x.src[1]) and 0 < x.src[1].arg * c <= dtypes.max(dtype):
        quotients.append(x.src[0].alu(_IDIV, x.const_like(x.src[1].arg * c)))   # (y//d)%c pairs with y//(d*c)
      quotient = next((q for q in quotients if terms.get(q) == _wrap(dtype, coef * c)), None)
      if quotient is None: continue
      del terms[mod], terms[quotient]
      terms[x] = _wrap(dtype, terms.get(x, 0) + coef)
      if terms[x] == 0: del terms[x]
      changed = True
      break

_ATOM_EXCLUDED = frozenset({Ops.ADD, Ops.SUB, Ops.NEG, Ops.CONST, Ops.MOD})

def _canonical_plus_const(u: UOp) -> UOp | None:
  """canonical_sum's result for `u = a + c`, a canonical sum (build_sum's node) and c a nonzero constant, found
  without flattening and rebuilding the sum: `a + c`, or `p + (k + c)` when a is `p + k` (an index sum's lanes and
  shifted offsets, most of the sums the optimizer's copies and the lowerer build). None where that shortcut does not
  apply (the general path then runs): a term that linear_form would look into, a remainder (recombined with its
  quotient there), another dtype, or a sum too big for linear_form."""
  a, c = u.src
  if c.op is not _CONST or c.src or type(c.arg) is not int or not c.arg or a._canonical is None: return None
  dtype = u.dtype
  if dtype not in INT_DTYPES or a.dtype is not dtype or c.dtype is not dtype: return None
  visited = 2   # the nodes linear_form would visit: u and c, then a's
  partial, k = a, 0
  if a.op is _ADD and (tail := a.src[1]).op is _CONST:
    if tail.src or type(tail.arg) is not int or tail.dtype is not dtype: return None
    partial, k, visited = a.src[0], tail.arg, visited + 2
  node = partial
  while True:   # a canonical sum is a chain ((t1 + t2) + t3) + ..., each term an atom or `atom * coefficient`
    term = node.src[1] if node.op is _ADD else node
    if node.op is _ADD: visited += 1
    if term.op is _MUL and (coef := term.src[1]).op is _CONST and not coef.src:
      if term.dtype is not dtype or coef.dtype is not dtype: return None
      term, visited = term.src[0], visited + 1
    if term.op in _ATOM_EXCLUDED or term.dtype is not dtype or \
       (term.op is _MUL and any(s.op is _CONST and not s.src for s in term.src)): return None
    visited += 1
    if node.op is not _ADD: break
    node = node.src[0]
  if visited > MAX_LINEAR_NODES: return None
  const = _wrap(dtype, k + c.arg)
  out = partial if const == 0 else partial.alu(_ADD, UOp.const(dtype, const))
  out._canonical = True
  return out

def _canonical_scaled_atom(u: UOp) -> bool:
  """Whether `u` is `atom * c` (c a constant other than 0 and 1, the atom a node linear_form does not look into),
  which the general path rebuilds as itself."""
  atom, c = u.src
  dtype = u.dtype
  return c.op is _CONST and not c.src and type(c.arg) is int and c.arg not in (0, 1) and dtype in INT_DTYPES and \
    c.dtype is dtype and atom.dtype is dtype and atom.op not in _ATOM_EXCLUDED_SCALED and \
    not (atom.op is _MUL and any(s.op is _CONST and not s.src for s in atom.src)) and _wrap(dtype, c.arg) == c.arg

_ATOM_EXCLUDED_SCALED = frozenset({Ops.ADD, Ops.SUB, Ops.NEG, Ops.CONST})   # (one term: a remainder recombines with nothing)

def canonical_sum(u: UOp) -> UOp | None:
  """x*c1 + x*c2 -> x*(c1+c2), (x+c1)+c2 -> x+(c1+c2), (x*c1)*c2 -> x*(c1*c2), (a+b)*c -> a*c+b*c; sorted terms"""
  if u._canonical: return None
  if u.op is _ADD and (shifted := _canonical_plus_const(u)) is not None: return shifted
  if u.op is _MUL and _canonical_scaled_atom(u):   # `atom * c`: its own canonical form
    u._canonical = True
    return None
  form = linear_form(u)
  if form is None: return None
  terms, const = form
  if any(t.op is _MOD for t in terms): recombine_div_mod(u.dtype, terms)
  return build_sum(u.dtype, terms, const)   # remembered as canonical (a fixed point) there

def order_mul_operands(u: UOp, x: UOp, y: UOp) -> UOp | None:
  """y*x -> x*y in term order (ints, neither a constant)"""
  if _kernel_const(x) or _kernel_const(y) or term_order_key(x) <= term_order_key(y): return None
  return u.replace(src=(y, x))

def mod_in_range(x: UOp, c: UOp) -> UOp | None:
  """x%c -> x when -c < x < c"""
  return x if c.arg > 0 and -c.arg < x.vmin and x.vmax < c.arg else None

def div_div(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """(x//c1)//c2 -> x//(c1*c2)"""
  if c1.arg <= 0 or c2.arg <= 0 or c1.arg * c2.arg > dtypes.max(x.dtype): return None
  return x.alu(_IDIV, x.const_like(c1.arg * c2.arg))

def mod_mod(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """(x%c1)%c2 -> x%c2 when c2 divides c1"""
  if c1.arg <= 0 or c2.arg <= 0 or c1.arg % c2.arg != 0: return None
  return x.alu(_MOD, c2)

def mod_div(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """(x%c1)//c2 -> (x//c2)%(c1//c2) when c2 divides c1"""
  if c1.arg <= 0 or c2.arg <= 0 or c1.arg % c2.arg != 0: return None
  return x.alu(_IDIV, c2).alu(_MOD, x.const_like(c1.arg // c2.arg))

def _div_mod_linear(x: UOp, c: int, is_div: bool) -> UOp | None:
  exact = _exact_linear(x)
  if exact is None or c <= 0: return None
  terms, const, lo, hi = exact
  dtype = x.dtype
  # a common factor of the divisor and every part of the sum cancels exactly, for any sign
  g = math.gcd(c, const, *terms.values())
  if g > 1:
    reduced = build_sum(dtype, {t: a // g for t, a in terms.items()}, const // g)
    if is_div: return reduced.alu(_IDIV, x.const_like(c // g))
    return reduced.alu(_MOD, x.const_like(c // g)).alu(_MUL, x.const_like(g))
  if lo >= 0 and (split := _factor_split(terms, const, c)) is not None:
    # x = g*big + rest with g dividing c and rest in [0, g): x//c = big//(c/g), x%c = (big%(c/g))*g + rest
    g, big, rest = split
    if is_div: return big.alu(_IDIV, x.const_like(c // g))
    return big.alu(_MOD, x.const_like(c // g)).alu(_MUL, x.const_like(g)).alu(_ADD, rest)
  # x = c*quotient + rest; truncation is floor for x >= 0 (rest must be >= 0) and ceil for x <= 0 (rest <= 0)
  if lo >= 0: const_quotient = const // c
  elif hi <= 0: const_quotient = -((-const) // c)
  else: return None
  rest_const = const - const_quotient * c
  # take out of every coefficient the multiples of c it holds ((15*i + j) % 14 -> (i + j) % 14; a division only when
  # that removes it); when that leaves a rest of the wrong sign, only the coefficients that c divides exactly
  for split_all in (True, False):
    quotient = {t: a // c for t, a in terms.items() if a // c and (split_all or a % c == 0)}
    rest = {t: (a % c if split_all else a) for t, a in terms.items() if a % c}
    rest_lo, rest_hi = linear_bounds(rest, rest_const)
    wrong_sign = (lo >= 0 and rest_lo < 0) or (lo < 0 and rest_hi > 0) or not fits(dtype, rest_lo, rest_hi)
    if not wrong_sign and not (split_all and is_div and not -c < rest_lo <= rest_hi < c): break
  else: return None
  rest_expr = build_sum(dtype, rest, rest_const)
  rest_small = -c < rest_lo and rest_hi < c
  if not is_div: return rest_expr if rest_small else rest_expr.alu(_MOD, x.const_like(c))
  if not quotient and const_quotient == 0 and not rest_small: return None   # nothing to take out of the division
  quotient_expr = build_sum(dtype, quotient, const_quotient)
  return quotient_expr if rest_small else quotient_expr.alu(_ADD, rest_expr.alu(_IDIV, x.const_like(c)))

def _factor_split(terms: dict[UOp, int], const: int, c: int) -> tuple[int, UOp, UOp] | None:
  """(g, big, rest) with a sum of `terms` and `const` = g*big + rest, g > 1 dividing c, rest in [0, g) and made of
  the terms whose coefficients g does not divide (the lanes of an upcast pooling window, (4*i + j)//8 with j < 4 ->
  i//2), None when no such g leaves the division with less to do. The largest g is taken."""
  for g in sorted({math.gcd(c, a) for a in terms.values()}, reverse=True):
    if g <= 1: break
    rest_terms = {t: a for t, a in terms.items() if a % g}
    if not rest_terms: continue   # every term divisible: the common-factor rule's case
    rest_const = const % g
    rest_lo, rest_hi = linear_bounds(rest_terms, rest_const)
    if rest_lo < 0 or rest_hi >= g: continue
    dtype = next(iter(terms)).dtype
    big = build_sum(dtype, {t: a // g for t, a in terms.items() if not a % g}, (const - rest_const) // g)
    return g, big, build_sum(dtype, rest_terms, rest_const)
  return None

def div_linear(x: UOp, c: UOp) -> UOp | None:
  """(a*c + b)//c -> a + b//c when the sum cannot wrap and b has x's sign; (x*g)//(c*g) -> x//c"""
  return _div_mod_linear(x, c.arg, True)

def mod_linear(x: UOp, c: UOp) -> UOp | None:
  """(a*c + b)%c -> b%c when the sum cannot wrap and b has x's sign; (x*g)%(c*g) -> (x%c)*g"""
  return _div_mod_linear(x, c.arg, False)

def lt_linear(x: UOp, c: UOp) -> UOp | None:
  """(x+c1) < c2 -> x < c2-c1, (x*g) < c -> x < ceil(c/g) when the sum cannot wrap"""
  exact = _exact_linear(x)
  if exact is None or not exact[0]: return None
  terms, const, _, _ = exact
  g = math.gcd(*terms.values())
  bound = -((const - c.arg) // g)   # ceil((c - const) / g)
  reduced = {t: a // g for t, a in terms.items()}
  if not fits(x.dtype, *linear_bounds(reduced, 0)) or not fits(x.dtype, bound, bound): return None
  return build_sum(x.dtype, reduced).alu(_CMPLT, x.const_like(bound))

def const_lt_linear(c: UOp, x: UOp) -> UOp | None:
  """c2 < (x+c1) -> c2-c1 < x, c < (x*g) -> floor(c/g) < x when the sum cannot wrap"""
  exact = _exact_linear(x)
  if exact is None or not exact[0]: return None
  terms, const, _, _ = exact
  g = math.gcd(*terms.values())
  bound = (c.arg - const) // g
  reduced = {t: a // g for t, a in terms.items()}
  if not fits(x.dtype, *linear_bounds(reduced, 0)) or not fits(x.dtype, bound, bound): return None
  return x.const_like(bound).alu(_CMPLT, build_sum(x.dtype, reduced))

def div_lt(x: UOp, d: UOp, c: UOp) -> UOp | None:
  """x//d < c -> x < c*d (d > 0; c > 0 or x >= 0)"""
  if d.arg <= 0 or not (c.arg > 0 or x.vmin >= 0) or not fits(x.dtype, c.arg * d.arg, c.arg * d.arg): return None
  return x.alu(_CMPLT, x.const_like(c.arg * d.arg))

def const_lt_div(c: UOp, x: UOp, d: UOp) -> UOp | None:
  """c < x//d -> (c+1)*d-1 < x (d > 0; c >= 0 or x >= 0)"""
  bound = (c.arg + 1) * d.arg - 1
  if d.arg <= 0 or not (c.arg >= 0 or x.vmin >= 0) or not fits(x.dtype, bound, bound): return None
  return x.const_like(bound).alu(_CMPLT, x)

def eq_linear(u: UOp, x: UOp, c: UOp) -> UOp | None:
  """(x+c1) != c2 -> x != c2-c1 (exact with wraparound); (x*g) == c -> x == c/g, or decided when g doesn't divide c"""
  form = linear_form(x)
  if form is None or not form[0]: return None
  terms, const = form
  target = truncate(x.dtype, c.arg - const)
  g = math.gcd(*terms.values())
  if g > 1 and fits(x.dtype, *linear_bounds(terms, 0)):   # no wraparound: divisibility decides
    if target % g != 0: return UOp.const(dtypes.bool, u.op is _CMPNE)
    terms, target = {t: a // g for t, a in terms.items()}, target // g
  return build_sum(x.dtype, terms).alu(u.op, x.const_like(target))

def cmp_difference(u: UOp, x: UOp, y: UOp) -> UOp | None:
  """x+a < x+b -> a < b, x+a == x+b -> a == b: cancel terms both sides share (== and != are exact with wraparound)"""
  if _kernel_const(x) or _kernel_const(y): return None
  left, right = linear_form(x), linear_form(y)
  if left is None or right is None or not (left[0].keys() & right[0].keys()): return None
  if u.op is _CMPLT and not (fits(x.dtype, *linear_bounds(*left)) and fits(y.dtype, *linear_bounds(*right))): return None
  diff = {t: left[0].get(t, 0) - right[0].get(t, 0) for t in left[0].keys() | right[0].keys()}
  diff = {t: a for t, a in diff.items() if a != 0}
  const = right[1] - left[1]
  # left - right < 0 becomes sum(positive terms) < sum(negated negative terms) + const, keeping coefficients positive
  pos, neg = {t: a for t, a in diff.items() if a > 0}, {t: -a for t, a in diff.items() if a < 0}
  if u.op is _CMPLT:
    if not fits(x.dtype, *linear_bounds(pos, 0)) or not fits(x.dtype, *linear_bounds(neg, const)): return None
    return build_sum(x.dtype, pos).alu(_CMPLT, build_sum(x.dtype, neg, const))
  return build_sum(x.dtype, pos).alu(u.op, build_sum(x.dtype, neg, const))

def pull_product_constants(u: UOp, x: UOp, y: UOp) -> UOp | None:
  """(a*c1)*(b*c2) -> (a*b)*(c1*c2) (ints, neither a constant): products of sizes compare equal however grouped"""
  if _kernel_const(x) or _kernel_const(y): return None
  left, right = linear_form(x), linear_form(y)
  if left is None or right is None or left[1] or right[1] or len(left[0]) != 1 or len(right[0]) != 1: return None
  (a, ca), (b, cb) = next(iter(left[0].items())), next(iter(right[0].items()))
  if ca == 1 and cb == 1: return None
  return a.alu(_MUL, b).alu(_MUL, u.const_like(ca * cb))

MAX_BOUND_PASSES = 4   # substitutions of range ends and quotients in a symbolic bound (each may expose another)

def _symbolic_end(t: UOp) -> bool: return t.op is _RANGE and not _kernel_const(t.src[0])
def _is_min(t: UOp) -> bool: return t.op is Ops.WHERE and t.src[0].op is _CMPLT and t.src[0].src == t.src[1:]

def symbolic_upper_bound(terms: dict[UOp, int], const: int) -> tuple[dict[UOp, int], int] | None:
  """An upper bound of `sum(t*a) + const` as a linear form over the Variables: a loop index of symbolic end n with a
  positive coefficient is at most n - 1, min(x, y) at most y, and c*(x//c) (x >= 0) at most x (at least x - c + 1),
  so that n - 1 - i for i < n cancels to an expression whose range decides it (the ranges alone cannot: n's vmax
  against i's)."""
  terms, changed = dict(terms), True
  for _ in range(MAX_BOUND_PASSES):
    if not changed: break
    changed = False
    for t, a in list(terms.items()):
      if _symbolic_end(t) and a > 0: replacement, offset = t.src[0], -a
      elif _is_min(t) and a > 0: replacement, offset = t.src[2], 0   # (a tile shifted back to end at an axis' end)
      elif t.op is _IDIV and _kernel_const(t.src[1]) and t.src[1].arg > 0 and a % t.src[1].arg == 0 \
           and t.src[0].vmin >= 0:
        c = t.src[1].arg
        replacement, offset = t.src[0], 0 if a > 0 else -(a // c) * (c - 1)
        a = a // c
      else: continue
      form = linear_form(replacement)
      if form is None: continue
      del terms[t]
      for r, b in form[0].items(): terms[r] = terms.get(r, 0) + a * b
      const += a * form[1] + offset
      terms = {r: b for r, b in terms.items() if b != 0}
      changed = True
  return terms, const

def lt_by_symbolic_bounds(x: UOp, y: UOp) -> UOp | None:
  """x < y -> True (False) when x - y is below 0 (at least 0) for every loop index below its symbolic end (a
  window's position o + j < n for o < n - j: the gate of a pad to a size's largest value)"""
  left, right = linear_form(x), linear_form(y)
  if left is None or right is None: return None
  diff = {t: left[0].get(t, 0) - right[0].get(t, 0) for t in left[0].keys() | right[0].keys()}
  diff = {t: a for t, a in diff.items() if a != 0}
  if not any(_symbolic_end(t) or _is_min(t) for t in diff): return None
  if not (fits(x.dtype, *linear_bounds(*left)) and fits(y.dtype, *linear_bounds(*right))): return None
  const = left[1] - right[1]
  upper = symbolic_upper_bound(diff, const)
  if upper is not None and linear_bounds(*upper)[1] < 0: return UOp.const(dtypes.bool, True)
  lower = symbolic_upper_bound({t: -a for t, a in diff.items()}, -const)
  if lower is not None and linear_bounds(*lower)[1] <= 0: return UOp.const(dtypes.bool, False)
  return None

_CINT = UPat.cvar("c", dtype=_INT)
_XINT = UPat.var("x", dtype=_INT)

symbolic = symbolic_simple + PatternMatcher([
  (UPat(_RANGE_FOLDABLE, dtype=_INT + (dtypes.bool,), name="u"), fold_by_range),
  (UPat(Ops.MAX, src=[UPat.var("x"), UPat.var("y")]), max_by_range),
  # division and modulo by positive constants
  (UPat(Ops.MOD, src=(_XINT, _CINT)), mod_in_range),
  (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(_XINT, UPat.cvar("c1"))), UPat.cvar("c2"))), div_div),
  (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(_XINT, UPat.cvar("c1"))), UPat.cvar("c2"))), mod_mod),
  (UPat(Ops.IDIV, src=(UPat(Ops.MOD, src=(_XINT, UPat.cvar("c1"))), UPat.cvar("c2"))), mod_div),
  (UPat(Ops.IDIV, src=(_XINT, _CINT)), div_linear),
  (UPat(Ops.MOD, src=(_XINT, _CINT)), mod_linear),
  # comparisons of sums with constants
  (UPat(Ops.CMPLT, src=(UPat(Ops.IDIV, src=(_XINT, UPat.cvar("d"))), _CINT)), div_lt),
  (UPat(Ops.CMPLT, src=(_CINT, UPat(Ops.IDIV, src=(_XINT, UPat.cvar("d"))))), const_lt_div),
  (UPat(Ops.CMPLT, src=(_XINT, _CINT)), lt_linear),
  (UPat(Ops.CMPLT, src=(_CINT, _XINT)), const_lt_linear),
  (UPat((Ops.CMPNE, Ops.CMPEQ), src=(_XINT, _CINT), name="u"), eq_linear),
  (UPat(Ops.CMPLT, src=(_XINT, UPat.var("y"))), lt_by_symbolic_bounds),
  (UPat((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ), src=(_XINT, UPat.var("y")), name="u"), cmp_difference),
  # canonical sums last: the rules above see (and return) sums in canonical form
  (UPat((Ops.ADD, Ops.SUB, Ops.NEG), dtype=_INT, name="u"), canonical_sum),
  (UPat(Ops.MUL, dtype=_INT, src=(UPat.var(), UPat.cvar()), name="u"), canonical_sum),
  (UPat(Ops.MUL, dtype=_INT, src=(UPat.var("x"), UPat.var("y")), name="u"), pull_product_constants),
  (UPat(Ops.MUL, dtype=_INT, src=(UPat.var("x"), UPat.var("y")), name="u"), order_mul_operands),
], pure=True)
