"""Integer division and modulo by a constant as multiply and shift (for targets whose division is slow).

For a divisor d > 0 and numerators 0 <= n <= U, take the smallest shift s with e*U < 2**s, where m = ceil(2**s/d) and
e = m*d - 2**s; then n // d == (n*m) >> s for every such n (the product's error n*e/2**s stays below 1/d). The
product is computed in uint64 (a 33-bit m for full-range uint32 is split so nothing overflows), so the rule applies to
every int8..int32 and uint8..uint32 numerator, and to 64-bit numerators whose value range (kiln.uop vmin/vmax) keeps
U*m below 2**64; full-range int64/uint64 division is left to the target.
Signed numerators divide their magnitude and put the sign back (C truncates toward zero); a negative divisor flips
the quotient's sign. MOD by d becomes n - (n // d)*d, which has the sign of n as in C.
"""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import UPat, PatternMatcher

U64 = dtypes.uint64

def magic_for(divisor: int, max_numerator: int) -> tuple[int, int]:
  """(m, s) with n // divisor == (n*m) >> s for every 0 <= n <= max_numerator.

  >>> m, s = magic_for(7, 2**31)
  >>> all((n * m) >> s == n // 7 for n in (0, 6, 7, 2**31 - 1, 2**31))
  True
  """
  if divisor <= 0: raise ValueError(f"magic_for: the divisor must be positive, got {divisor}")
  shift = max(divisor - 1, 1).bit_length() - 1
  while True:
    multiplier = -(-(1 << shift) // divisor)
    error = multiplier * divisor - (1 << shift)
    if error * max_numerator < (1 << shift): return multiplier, shift
    shift += 1

def unsigned_quotient(magnitude: UOp, divisor: int, max_numerator: int) -> UOp | None:
  """magnitude // divisor for a uint64 node in [0, max_numerator], as multiply and shift (None if it won't fit)."""
  multiplier, shift = magic_for(divisor, max_numerator)
  def const(v: int) -> UOp: return UOp.const(U64, v)
  if multiplier * max_numerator < 1 << 64:
    product = magnitude if multiplier == 1 else magnitude * const(multiplier)
    return product if shift == 0 else product.alu(Ops.SHR, const(shift))
  # a 33-bit multiplier for 32-bit numerators: n*m = n*(m - 2**32) + n*2**32, so
  # (n*m) >> s == (((n*(m - 2**32)) >> 32) + n) >> (s - 32), and no step overflows 64 bits
  low = multiplier - (1 << 32)
  if not (0 <= low and low * max_numerator < 1 << 64 and shift >= 32 and max_numerator < 1 << 32): return None
  high_part = (magnitude * const(low)).alu(Ops.SHR, const(32)) + magnitude
  return high_part.alu(Ops.SHR, const(shift - 32)) if shift > 32 else high_part

def quotient_by_constant(x: UOp, divisor: int) -> UOp | None:
  """x // divisor truncating toward zero (C semantics), for an integer node and a constant divisor other than 0."""
  lo, hi = x.vmin, x.vmax
  signed = not dtypes.is_unsigned(x.dtype) and lo < 0
  max_numerator = max(abs(lo), abs(hi))
  if signed:
    wide = x.cast(dtypes.int64)
    magnitude = wide.lt(0).where(-wide, wide).cast(U64)
  else: magnitude = x.cast(U64)
  quotient = unsigned_quotient(magnitude, abs(divisor), max_numerator)
  if quotient is None: return None
  if signed:
    signed_quotient = quotient.cast(dtypes.int64)
    negative = x.lt(0) if divisor > 0 else x.lt(0).logical_not()
    return negative.where(-signed_quotient, signed_quotient).cast(x.dtype)
  if divisor < 0:   # unsigned x, negative constant: only possible for a signed dtype with a proven nonnegative range
    return (-quotient.cast(dtypes.int64)).cast(x.dtype)
  return quotient.cast(x.dtype)

def _usable_divisor(d: UOp) -> int | None:
  value = d.arg
  if isinstance(value, bool) or not isinstance(value, int) or value in (0, 1, -1): return None
  if dtypes.is_int(d.dtype) and d.dtype.itemsize > 8: return None
  return value

def divide_by_constant(x: UOp, d: UOp) -> UOp | None:
  """x // c -> (|x| * m) >> s with the sign put back"""
  divisor = _usable_divisor(d)
  return None if divisor is None else quotient_by_constant(x, divisor)

def modulo_by_constant(x: UOp, d: UOp) -> UOp | None:
  """x % c -> x - (x // c) * c"""
  divisor = _usable_divisor(d)
  if divisor is None: return None
  quotient = quotient_by_constant(x, divisor)
  return None if quotient is None else x - quotient * d   # wraps like C, so the result is exact

INT_DTYPES = tuple(dtypes.ints)

fast_division = PatternMatcher([
  (UPat(Ops.IDIV, dtype=INT_DTYPES, src=(UPat.var("x"), UPat.cvar("d"))), divide_by_constant),
  (UPat(Ops.MOD, dtype=INT_DTYPES, src=(UPat.var("x"), UPat.cvar("d"))), modulo_by_constant),
])

def wants_fast_division(renderer) -> bool:
  """Whether division by constants is rewritten for `renderer` (TRANSCENDENTAL=2, or a target without fast division;
  never with DISABLE_FAST_IDIV=1)."""
  from kiln.helpers import DISABLE_FAST_IDIV, TRANSCENDENTAL
  if DISABLE_FAST_IDIV: return False
  level = int(TRANSCENDENTAL.value)
  return level >= 2 or (level == 1 and not getattr(renderer, "has_fast_const_division", True))
