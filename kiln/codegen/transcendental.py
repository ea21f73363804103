"""Software exp2, log2 and sin as uop rewrite rules, for targets without fast native versions.

`software_math` rewrites `EXP2`, `LOG2` and `SIN` into graphs of plain ALU uops: adds, multiplies and fused
multiply-adds (MULACC: every polynomial step and exp's argument reduction, rounded once on every device and exactly so
by the PYTHON reference), comparisons, WHERE, integer ops and BITCAST for reading and building exponents.
Everything kiln derives from these ops (exp, log, cos, tan, sigmoid, tanh, softplus, ...) follows. float16, bfloat16
and fp8 are computed in float32.

How each function works:
- exp2(x): n = round(x) by the 1.5*2**mantissa_bits trick, r = x - n (exact, |r| <= 1/2), 2**r by its Taylor
  polynomial, then scaled by 2**n as two exponent-built factors 2**(n//2) * 2**(n - n//2), so results that overflow,
  are subnormal or underflow come out rounded once and right (no bit tricks at the edges).
- log2(x): subnormals are scaled by 2**mantissa_bits first; the bits give x = 2**k * m with m in [sqrt(1/2), sqrt(2));
  log(m) = f - f*f/2 + s*(f*f/2 + R(s*s)) with f = m-1, s = f/(2+f) (the atanh series), split into a high part with
  trailing bits cleared (so its product with the high part of 1/ln2 is exact) and a low part; k is added last with
  an exact two-sum, so the result is rounded about once.
- sin(x): reduced to r = x - q*pi/2 with |r| <= pi/4, then sin or cos polynomials by the quadrant q, with the
  reduction's lost low part r_lo carried as sin(r+r_lo) ~ sin(r) + r_lo*cos(r). float64 uses Cody-Waite with pi/2
  in three pieces for |x| < 2**19*pi/2, Payne-Hanek above; float32 reduces by Payne-Hanek in integers (a 96-bit
  window of 2/pi picked by the exponent, multiplied by the 24-bit mantissa) and evaluates the polynomials in float64.
  The sign is reapplied by XOR on the sign bit, so sin(-0.0) is -0.0. SIN of a float32 value cast to float64 is
  reduced as float32 and returns the float64 polynomial value unrounded.
- cos and tan, as kiln's Tensor writes them for software math: SIN(pi/2 - y) in float64 is cos(y) from y's own
  reduction, the quadrant moved by one (pi/2 - y is never rounded); SIN(y) / SIN(pi/2 - y) is one tan (tan_float).

Measured maximum errors in ulp of the result, float32 bit patterns (`python test/codegen/test_transcendental.py
--exhaustive`: every pattern, 16 cores, about 6 minutes; `--stride=16` every 16th); float64 on dense and random-bit
sweeps (test_transcendental.py). The fused polynomials (2026-12-02) were measured on every 16th pattern:

| function | float32 vs exact | float32 vs C library (glibc) | float64 vs NumPy |
| --- | --- | --- | --- |
| exp2 | 0.86 | 1 | 1 |
| log2 | 0.76 | 1 | 1 |
| sin  | 0.5 (correctly rounded float64 result) | 1 | 1 |

float16 (every value, computed in float32) is within 1 ulp of the correctly rounded result.
"""
from __future__ import annotations
import math
from fractions import Fraction
from kiln.dtype import DType, dtypes
from kiln.helpers import TRANSCENDENTAL
from kiln.uop.ops import UOp, Ops, toposort
from kiln.uop.pattern import UPat, PatternMatcher, graph_rewrite
from kiln.uop.mathforms import COS_SHIFT, INV_LN2, cos_argument, exp_argument, tan_argument  # noqa: F401 (re-exported)

# ---------------- small builders ----------------

class FloatFormat:
  """The bit layout of one IEEE binary format and the integer types that hold its bits."""
  def __init__(self, dtype: DType, mantissa_bits: int, bias: int, sint: DType, uint: DType):
    self.dtype, self.mantissa_bits, self.bias, self.sint, self.uint = dtype, mantissa_bits, bias, sint, uint
    self.sign_bit = 1 << (dtype.itemsize * 8 - 1)

F32 = FloatFormat(dtypes.float32, 23, 127, dtypes.int32, dtypes.uint32)
F64 = FloatFormat(dtypes.float64, 52, 1023, dtypes.int64, dtypes.uint64)
FORMATS = {dtypes.float32: F32, dtypes.float64: F64}

def const(dtype: DType, value) -> UOp:
  """A constant of `dtype`."""
  return UOp.const(dtype, value)

def bitcast(x: UOp, dtype: DType) -> UOp:
  """The bits of `x` read as `dtype` (same size)."""
  return UOp(Ops.BITCAST, dtype, (x,))

def shl(x: UOp, n: int) -> UOp:
  """x << n for an integer node and a constant shift."""
  return x.alu(Ops.SHL, const(x.dtype, n))

def shr(x: UOp, n) -> UOp:
  """x >> n (arithmetic for signed dtypes) for a constant or node shift."""
  return x.alu(Ops.SHR, n if isinstance(n, UOp) else const(x.dtype, n))

def mulacc(a: UOp, b: UOp, c: UOp) -> UOp:
  """a*b + c rounded once (MULACC: a fused multiply-add on every device, computed exactly by the PYTHON reference)."""
  return UOp(Ops.MULACC, a.dtype, (a, b, c))

def polynomial(x: UOp, coefficients: list[float]) -> UOp:
  """c0 + c1*x + c2*x**2 + ... by Horner's rule with fused multiply-adds (coefficients lowest first)."""
  acc = const(x.dtype, coefficients[-1])
  for c in reversed(coefficients[:-1]): acc = mulacc(acc, x, const(x.dtype, c))
  return acc

def two_sum_fast(big: UOp, small: UOp) -> tuple[UOp, UOp]:
  """(s, e) with s = fl(big+small) and s+e = big+small exactly, when |big| >= |small| or big == 0."""
  s = big + small
  return s, small - (s - big)

def clear_low_bits(x: UOp, fmt: FloatFormat, n: int) -> UOp:
  """`x` with its `n` lowest mantissa bits zeroed (exact; fewer significant bits make later products exact)."""
  mask = ((1 << (fmt.dtype.itemsize * 8)) - 1) ^ ((1 << n) - 1)
  return bitcast(bitcast(x, fmt.uint) & const(fmt.uint, mask), fmt.dtype)

def pow2(n: UOp, fmt: FloatFormat) -> UOp:
  """2**n as a float built from its exponent bits, for an integer node n in the normal exponent range."""
  return bitcast((n + fmt.bias) * (1 << fmt.mantissa_bits), fmt.dtype)

def round_to_int(x: UOp, fmt: FloatFormat) -> UOp:
  """x rounded to the nearest integer (ties to even), as a float, for |x| < 2**(mantissa_bits-1)."""
  magic = 1.5 * 2.0 ** fmt.mantissa_bits
  return (x + magic) - magic

def split_const(value: Fraction | float, bits: int) -> float:
  """`value` rounded to a float with at most `bits` significant bits."""
  value = Fraction(value)
  if value == 0: return 0.0
  exponent = math.floor(math.log2(abs(value)))
  scale = Fraction(2) ** (bits - 1 - exponent)
  return float(round(value * scale) / scale)

def copy_sign_bit(y: UOp, x: UOp, fmt: FloatFormat) -> UOp:
  """y with the sign of x flipped in (y XOR sign(x)): for y >= 0 this is copysign(y, x), -0.0 included."""
  sign = bitcast(x, fmt.uint) & const(fmt.uint, fmt.sign_bit)
  return bitcast(bitcast(y, fmt.uint).alu(Ops.XOR, sign), fmt.dtype)

def is_nan(x: UOp) -> UOp:
  """x != x."""
  return x.ne(x)

# ---------------- exact constants ----------------

def pi_fraction(bits: int) -> Fraction:
  """pi to about `bits` bits, by Machin's formula pi = 16*atan(1/5) - 4*atan(1/239) in fixed point."""
  one = 1 << (bits + 16)
  def arctan_inverse(n: int) -> int:
    total, term, k, sign = 0, one // n, 1, 1
    while term:
      total += sign * (term // k)
      term //= n * n
      k += 2
      sign = -sign
    return total
  return Fraction(16 * arctan_inverse(5) - 4 * arctan_inverse(239), one)

def ln2_fraction(bits: int) -> Fraction:
  """ln 2 to about `bits` bits, as 2*atanh(1/3) = 2*sum 1/((2k+1)*3**(2k+1)) in fixed point."""
  one, total, power, k = 1 << (bits + 16), 0, 3, 1
  while one // power:
    total += one // (k * power)
    power *= 9
    k += 2
  return Fraction(2 * total, one)

PI = pi_fraction(1400)
LN2 = ln2_fraction(200)

# ---------------- exp2 ----------------

def exp2_coefficients(degree: int) -> list[float]:
  """Taylor coefficients of 2**r = sum (r ln2)**k / k!."""
  return [float(LN2 ** k / math.factorial(k)) for k in range(degree + 1)]

# degree: the first dropped term (ln2/2)**(d+1)/(d+1)! is below 2**-27 (float32) / 2**-57 (float64) of the result
EXP2_COEFFICIENTS = {dtypes.float32: exp2_coefficients(7), dtypes.float64: exp2_coefficients(13)}
EXP2_LIMITS = {dtypes.float32: (-151.0, 128.0), dtypes.float64: (-1076.0, 1024.0)}   # beyond: 0 or inf

def exp2_float(x: UOp, fmt: FloatFormat) -> UOp:
  """2**x for a float32/float64 node."""
  lo, hi = EXP2_LIMITS[fmt.dtype]
  safe = is_nan(x).where(const(fmt.dtype, 0.0), x)
  clamped = safe.lt(lo).where(const(fmt.dtype, lo), (const(fmt.dtype, hi).lt(safe)).where(const(fmt.dtype, hi), safe))
  magic = 1.5 * 2.0 ** fmt.mantissa_bits
  shifted = clamped + magic   # rounded to an integer, which the low mantissa bits now hold
  n_float = shifted - magic
  r = clamped - n_float
  p = polynomial(r, EXP2_COEFFICIENTS[fmt.dtype])
  # n from those bits, not by a float -> int conversion (the C renderer range-checks each: 10 more ops a lane)
  n = bitcast(shifted, fmt.sint) - bitcast(const(fmt.dtype, magic), fmt.sint)
  half = shr(n, 1)
  result = (p * pow2(half, fmt)) * pow2(n - half, fmt)
  return is_nan(x).where(x, result)

# exp(x) as kiln's Tensor writes it: EXP2(x * (1/ln2)). Rounding that product would cost up to half an ulp of 128
# in 2**'s argument near overflow (60 ulp of the result), so software math recognizes the form (`exp_argument`) and
# reduces x itself: x = k*ln2 + r with ln2 in two parts (k*ln2_hi exact for every k in range), |r| <= ln2/2, then
# e**r by its Taylor polynomial (degree 7 / 13: the first dropped term is below 2**-27 / 2**-57).
EXP_LN2_PARTS = {dtypes.float32: (split_const(LN2, 16), float(LN2 - Fraction(split_const(LN2, 16)))),
                 dtypes.float64: (split_const(LN2, 40), float(LN2 - Fraction(split_const(LN2, 40))))}
EXP_TAYLOR = {dtypes.float32: [1 / math.factorial(n) for n in range(8)],
              dtypes.float64: [1 / math.factorial(n) for n in range(14)]}
# k beyond these: the result is 0 (below) or inf (above) for every r, so x is clamped there and k always fits
EXP_K_LIMITS = {dtypes.float32: (-151, 129), dtypes.float64: (-1076, 1025)}

def exp_of_reduced(r: UOp, fmt: FloatFormat) -> UOp:
  """e**r for |r| <= ln2/2 (exp's reduced argument; NaN stays NaN)."""
  return polynomial(r, EXP_TAYLOR[fmt.dtype])

def exp_float(x: UOp, fmt: FloatFormat) -> UOp:
  """e**x for a float32/float64 node, within about 1 ulp: x = k*ln2 + r, e**r * 2**k (NaN stays NaN)."""
  dt, (k_min, k_max) = fmt.dtype, EXP_K_LIMITS[fmt.dtype]
  lowest, highest = const(dt, k_min * math.log(2)), const(dt, k_max * math.log(2))
  # x at or below `lowest` (a masked softmax's -inf) gives 0 by a select, computed as e**0: through the formula its
  # last product underflowed, a microcode assist per element (an LLM prefill's attention sums ran 5x slower). NaN
  # takes that path too, so no NaN bits reach the integer ops; it is put back at the end
  inside = lowest.lt(x)
  clamped = inside.where(x, const(dt, 0.0))
  clamped = clamped.lt(highest).where(clamped, highest)
  magic = 1.5 * 2.0 ** fmt.mantissa_bits   # adding it rounds to an integer (ties to even), kept in the low bits
  shifted = mulacc(clamped, const(dt, INV_LN2), const(dt, magic))
  k_float = shifted - magic
  # k from those bits, not by a float -> int conversion (the C renderer range-checks each lane)
  k = bitcast(shifted, fmt.sint) - bitcast(const(dt, magic), fmt.sint)
  ln2_hi, ln2_lo = EXP_LN2_PARTS[dt]
  r = mulacc(k_float, const(dt, -ln2_lo), mulacc(k_float, const(dt, -ln2_hi), clamped))   # k*ln2_hi is exact
  half = shr(k, 1)
  # 2**k as two factors, so that results near overflow and subnormal results are rounded once
  result = inside.where((exp_of_reduced(r, fmt) * pow2(half, fmt)) * pow2(k - half, fmt), const(dt, 0.0))
  return is_nan(x).where(x, result)

# ---------------- log2 ----------------

def log_series_coefficients(terms: int) -> list[float]:
  """R(z) = sum_{k>=1} 2 z**k/(2k+1), the tail of ln((1+s)/(1-s)) = 2s + s*R(s*s); lowest first, from z**1."""
  return [0.0] + [float(Fraction(2, 2 * k + 1)) for k in range(1, terms + 1)]

LOG_R_COEFFICIENTS = {dtypes.float32: log_series_coefficients(5), dtypes.float64: log_series_coefficients(10)}
# 1/ln2 split so that hi * (a value with few bits) is exact: hi has 12 (float32) / 32 (float64) significant bits
INV_LN2_HI = {dtypes.float32: split_const(1 / LN2, 12), dtypes.float64: split_const(1 / LN2, 32)}
INV_LN2_LO = {dt: float(1 / LN2 - Fraction(INV_LN2_HI[dt])) for dt in INV_LN2_HI}
LOG_HI_CLEARED_BITS = {dtypes.float32: 12, dtypes.float64: 32}   # leaves 12 / 21 significant bits in `hi`
SQRT_HALF_BITS = {dtypes.float32: 0x3F3504F3, dtypes.float64: 0x3FE6A09E667F3BCD}

def log2_float(x: UOp, fmt: FloatFormat) -> UOp:
  """log2(x) for a float32/float64 node."""
  dt = fmt.dtype
  smallest_normal = 2.0 ** (1 - fmt.bias)
  subnormal = x.lt(smallest_normal)
  scaled = subnormal.where(x * (2.0 ** fmt.mantissa_bits), x)
  bits = bitcast(scaled, fmt.sint)
  # k = exponent of x / sqrt(1/2), so that m = x / 2**k lies in [sqrt(1/2), sqrt(2))
  k = shr(bits - SQRT_HALF_BITS[dt], fmt.mantissa_bits)
  m = bitcast(bits - k * (1 << fmt.mantissa_bits), dt)
  k_float = (k - subnormal.where(const(fmt.sint, fmt.mantissa_bits), const(fmt.sint, 0))).cast(dt)
  f = m - 1.0
  s = f / (f + 2.0)
  z = s * s
  half_f_squared = f * f * 0.5
  tail = polynomial(z, LOG_R_COEFFICIENTS[dt])
  hi = clear_low_bits(f - half_f_squared, fmt, LOG_HI_CLEARED_BITS[dt])
  lo = ((f - hi) - half_f_squared) + s * (half_f_squared + tail)
  value_hi = hi * INV_LN2_HI[dt]
  value_lo = lo * INV_LN2_HI[dt] + (lo + hi) * INV_LN2_LO[dt]
  total, error = two_sum_fast(k_float, value_hi)
  result = total + (value_lo + error)
  # special values: log2(<0) = NaN, log2(+-0) = -inf, log2(inf) = inf, NaN stays NaN
  result = x.eq(math.inf).where(const(dt, math.inf), result)
  result = x.eq(0.0).where(const(dt, -math.inf), result)
  result = x.lt(0.0).where(const(dt, math.nan), result)
  return is_nan(x).where(x, result)

# ---------------- sin ----------------

def sin_coefficients(terms: int) -> list[float]:
  """S(z) with sin(r) = r + r*z*S(z), z = r*r: S = -1/3! + z/5! - ..."""
  return [float(Fraction((-1) ** (k + 1), math.factorial(2 * k + 3))) for k in range(terms)]

def cos_coefficients(terms: int) -> list[float]:
  """C(z) with cos(r) = 1 - z/2 + z*z*C(z): C = 1/4! - z/6! + ..."""
  return [float(Fraction((-1) ** k, math.factorial(2 * k + 4))) for k in range(terms)]

# |r| <= pi/4: the first dropped terms r**19/19! and r**20/20! are below 2**-57 of the result
SIN_S, COS_C = sin_coefficients(8), cos_coefficients(8)

def sin_kernel(r: UOp, r_lo: UOp) -> UOp:
  """sin(r + r_lo) for |r| <= pi/4 and tiny r_lo, in float64."""
  z = r * r
  return r + (r * (z * polynomial(z, SIN_S)) + r_lo * (1.0 - z * 0.5))

def cos_kernel(r: UOp, r_lo: UOp) -> UOp:
  """cos(r + r_lo) for |r| <= pi/4 and tiny r_lo, in float64."""
  z = r * r
  half_z = z * 0.5
  w = 1.0 - half_z
  # (1 - w) - half_z recovers what rounding w lost
  return w + (((1.0 - w) - half_z) + (z * z * polynomial(z, COS_C) - r * r_lo))

def sin_by_quadrant(quadrant: UOp, r: UOp, r_lo: UOp) -> UOp:
  """sin(q*pi/2 + r) from the quadrant q (any integer dtype; only q mod 4 matters)."""
  q = quadrant.cast(dtypes.int32) & const(dtypes.int32, 3)
  s, c = sin_kernel(r, r_lo), cos_kernel(r, r_lo)
  value = (q & const(dtypes.int32, 1)).eq(0).where(s, c)
  return (q & const(dtypes.int32, 2)).eq(0).where(value, -value)

# pi/2 in four pieces: the first three have 33 significant bits, so n*piece is exact for n < 2**20; their sum is
# within 2**-150 of pi/2, enough for the closest float64 to a multiple of pi/2 below the limit
PIO2 = PI / 2
PIO2_1 = split_const(PIO2, 33)
PIO2_2 = split_const(PIO2 - Fraction(PIO2_1), 33)
PIO2_3 = split_const(PIO2 - Fraction(PIO2_1) - Fraction(PIO2_2), 33)
PIO2_4 = float(PIO2 - Fraction(PIO2_1) - Fraction(PIO2_2) - Fraction(PIO2_3))
CODY_WAITE_LIMIT = 2.0 ** 19 * math.pi / 2

def reduce_cody_waite(ax: UOp) -> tuple[UOp, UOp, UOp]:
  """(q, r, r_lo) with ax = q*pi/2 + r + r_lo, |r| <~ pi/4, for 0 <= ax < CODY_WAITE_LIMIT (float64)."""
  n = round_to_int(ax * float(2 / PI), F64)
  t = ax - n * PIO2_1                      # exact: n*PIO2_1 is exact and close to ax
  r1, err1 = two_sum_fast(t, -(n * PIO2_2))
  r2, err2 = two_sum_fast(r1, -(n * PIO2_3))
  r, err3 = two_sum_fast(r2, -(n * PIO2_4))
  return n.cast(dtypes.int64), r, err3 + (err1 + err2)

# Payne-Hanek: 2/pi as 32-bit limbs of a bit string that starts with 64 zero bits (room for small exponents)
TWO_OVER_PI_BITS = 1248
_TWO_OVER_PI_INT = math.floor(Fraction(2) / PI * (1 << TWO_OVER_PI_BITS))
TWO_OVER_PI_LIMBS = [0, 0] + [(_TWO_OVER_PI_INT >> (TWO_OVER_PI_BITS - 32 * (i + 1))) & 0xFFFFFFFF
                              for i in range(TWO_OVER_PI_BITS // 32)]

def select_limb(index: UOp, first: int, last: int) -> UOp:
  """TWO_OVER_PI_LIMBS[index] as uint64, for index in [first, last] (a chain of WHEREs: uops have no tables)."""
  value = const(dtypes.uint64, TWO_OVER_PI_LIMBS[last])
  for i in range(last - 1, first - 1, -1):
    value = index.eq(i).where(const(dtypes.uint64, TWO_OVER_PI_LIMBS[i]), value)
  return value

def two_over_pi_window(bit_offset: UOp, limbs: int, lo_limb: int, hi_limb: int) -> list[UOp]:
  """`limbs` 32-bit limbs (uint64 nodes, most significant first) of the 2/pi bit string from `bit_offset` on;
  bit_offset // 32 lies in [lo_limb, hi_limb]."""
  index = shr(bit_offset, 5)
  shift = (bit_offset & const(dtypes.uint64, 31))
  raw = [select_limb(index + k, lo_limb + k, hi_limb + k) for k in range(limbs + 1)]
  mask = const(dtypes.uint64, 0xFFFFFFFF)
  # a shift by 32 is defined for 64-bit values (it gives 0), so shift == 0 needs no special case
  return [(raw[k].alu(Ops.SHL, shift) | raw[k + 1].alu(Ops.SHR, const(dtypes.uint64, 32) - shift)) & mask
          for k in range(limbs)]

def multiply_limbs(a: list[UOp], b: list[UOp]) -> list[UOp]:
  """The product of two numbers given as 32-bit limbs in uint64 nodes (most significant first), as limbs."""
  mask = const(dtypes.uint64, 0xFFFFFFFF)
  columns: list[list[UOp]] = [[] for _ in range(len(a) + len(b))]
  for i, ai in enumerate(a):
    for j, bj in enumerate(b):
      product = ai * bj
      columns[i + j + 1].append(product & mask)   # low half lands in column i+j+1, high half one column up
      columns[i + j].append(shr(product, 32))
  out: list[UOp] = [const(dtypes.uint64, 0)] * len(columns)
  carry = const(dtypes.uint64, 0)
  for col in range(len(columns) - 1, -1, -1):
    total = carry
    for piece in columns[col]: total = total + piece   # at most 2*len(a) pieces below 2**32: no overflow
    out[col] = total & mask
    carry = shr(total, 32)
  return out

def reduce_payne_hanek(ax: UOp, fmt: FloatFormat) -> tuple[UOp, UOp, UOp]:
  """(q, r, r_lo) with |x| = q*pi/2 + r + r_lo (float64 r, r_lo) for finite |x| >= 1/2, any size."""
  bits = bitcast(ax, fmt.uint).cast(dtypes.uint64)
  exponent = shr(bits, fmt.mantissa_bits)
  mantissa = (bits & const(dtypes.uint64, (1 << fmt.mantissa_bits) - 1)) | const(dtypes.uint64, 1 << fmt.mantissa_bits)
  mantissa_limbs = [mantissa] if fmt is F32 else [shr(mantissa, 32), mantissa & const(dtypes.uint64, 0xFFFFFFFF)]
  # |x| = mantissa * 2**(exponent - bias - mantissa_bits). Bits of 2/pi worth >= 4/(mantissa*2**...) only add
  # multiples of 4 (whole turns); the window starts 2 bits (the quadrant) above the units of x*2/pi.
  window_limbs = 3 if fmt is F32 else 6
  first_bit = fmt.bias + fmt.mantissa_bits + 2          # bit offset in the 2/pi string is exponent - this + 64
  lowest_exponent, highest_exponent = fmt.bias - 1, 2 * fmt.bias
  offset = exponent + const(dtypes.uint64, 64 - first_bit)
  window = two_over_pi_window(offset, window_limbs, (lowest_exponent + 64 - first_bit) // 32,
                              (highest_exponent + 64 - first_bit) // 32)
  product = multiply_limbs(mantissa_limbs, window)
  # product * 2**-(32*window_limbs - 2 + ...) = x*2/pi mod 4: the binary point sits 2 bits below the top of the limb
  # that lines up with the window's first limb, which is limb len(mantissa_limbs) of the product
  top = len(mantissa_limbs)
  head = product[top]                                   # 2 quadrant bits, then 30 fraction bits
  quadrant = shr(head, 30)
  upper = (head & const(dtypes.uint64, 0x3FFFFFFF)).alu(Ops.SHL, const(dtypes.uint64, 32)) | product[top + 1]
  # round to the nearest quadrant: a fraction >= 1/2 becomes fraction - 1 with the next quadrant
  round_up = const(dtypes.uint64, 1 << 61).lt(upper + 1)
  quadrant = quadrant + round_up.cast(dtypes.uint64)
  signed_upper = upper.cast(dtypes.int64) - round_up.where(const(dtypes.int64, 1 << 62), const(dtypes.int64, 0))
  # fraction = signed_upper*2**-62 + lower*2**-94 + ... ; the float64 sum of the two parts keeps ~106 bits
  lower = product[top + 2].cast(dtypes.float64) * 2.0 ** -94
  if len(product) > top + 3: lower = lower + product[top + 3].cast(dtypes.float64) * 2.0 ** -126
  upper_float = signed_upper.cast(dtypes.float64)
  upper_rest = (signed_upper - upper_float.cast(dtypes.int64)).cast(dtypes.float64)   # exact: what rounding lost
  fraction_hi = upper_float * 2.0 ** -62
  fraction_lo = upper_rest * 2.0 ** -62 + lower
  fraction, fraction_err = two_sum_fast(fraction_hi, fraction_lo)
  # r = fraction * pi/2 in double-float: the product of the high halves is exact after clearing 27 bits
  pio2_hi = split_const(PIO2, 26)
  pio2_lo = float(PIO2 - Fraction(pio2_hi))
  f_hi = clear_low_bits(fraction, F64, 27)
  f_lo = (fraction - f_hi) + fraction_err
  r_hi = f_hi * pio2_hi
  r_lo = f_lo * pio2_hi + fraction * pio2_lo
  r, r_err = two_sum_fast(r_hi, r_lo)
  return quadrant, r, r_err

def reduce_quadrant(x: UOp, fmt: FloatFormat) -> tuple[UOp, UOp, UOp, UOp]:
  """(finite, q, r, r_lo) with |x| = q*pi/2 + r + r_lo (float64 r, r_lo, |r| <~ pi/4) for a float32/float64 node;
  q, r and r_lo are those of 0 where x is not finite."""
  ax = bitcast(bitcast(x, fmt.uint) & const(fmt.uint, fmt.sign_bit - 1), fmt.dtype)
  finite = ax.lt(math.inf)
  safe = finite.where(ax, const(fmt.dtype, 0.0))            # NaN/inf must not reach the integer conversions
  wide = safe.cast(dtypes.float64)
  zero64 = const(dtypes.float64, 0.0)
  small = wide.lt(math.pi / 4)
  large_q, large_r, large_r_lo = reduce_payne_hanek(small.where(const(fmt.dtype, 1.0), safe), fmt)
  if fmt is F64:
    medium = wide.lt(CODY_WAITE_LIMIT)
    cw_q, cw_r, cw_r_lo = reduce_cody_waite(medium.where(wide, zero64))
    large_q = medium.where(cw_q.cast(dtypes.uint64), large_q)
    large_r, large_r_lo = medium.where(cw_r, large_r), medium.where(cw_r_lo, large_r_lo)
  q = small.where(const(dtypes.uint64, 0), large_q)
  return finite, q, small.where(wide, large_r), small.where(zero64, large_r_lo)

def sin_float(x: UOp, fmt: FloatFormat, widened: bool = False, quarter_turns: int = 0) -> UOp:
  """sin(x + quarter_turns*pi/2) for a float32/float64 node (quarter_turns 0: sin, 1: cos); float32 is reduced
  exactly and evaluated in float64. `widened` (float32 x only): the float64 value itself, unrounded (for
  sin(float64(x)), where x is a float32 value)."""
  finite, q, r, r_lo = reduce_quadrant(x, fmt)
  value = sin_by_quadrant(q + quarter_turns if quarter_turns else q, r, r_lo)   # of |x|: sin is odd, cos even
  if not widened: value = value.cast(fmt.dtype)
  out = dtypes.float64 if widened else fmt.dtype
  result = value if quarter_turns else copy_sign_bit(value, x.cast(out) if widened else x, FORMATS[out])
  return finite.where(result, const(out, math.nan))

def two_product(a: UOp, b: UOp) -> tuple[UOp, UOp]:
  """(p, e) with p = fl(a*b) and p + e = a*b exactly (Dekker's product of 26+26-bit halves; float64, no FMA)."""
  a_hi, b_hi = clear_low_bits(a, F64, 27), clear_low_bits(b, F64, 27)
  a_lo, b_lo = a - a_hi, b - b_hi
  p = a * b
  return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo

def tan_float(x: UOp, fmt: FloatFormat, widened: bool = False) -> UOp:
  """tan(x) for a float32/float64 node (`widened`: a float32 x, the float64 result unrounded, already ~2**-45
  relative as sin/cos; float32 is not meant to come here unwidened): sin(r) and cos(r) as unrounded pairs hi + lo
  from the kernels' own sums, divided by quadrant (s/c, or -c/s); float64 corrects the quotient by its residual
  (n - q*d, with q*d exact by two_product), so it is rounded about once, not after three roundings."""
  finite, q, r, r_lo = reduce_quadrant(x, fmt)
  exact_z = fmt is F64 and not widened
  # (z's rounding would be 0.3 ulp of cos(r) near pi/4)
  z, z_err = two_product(r, r) if exact_z else (r * r, const(dtypes.float64, 0.0))
  sin_hi, sin_lo = r, r * (z * polynomial(z, SIN_S)) + r_lo * (1.0 - z * 0.5)
  half_z = z * 0.5
  cos_hi = 1.0 - half_z
  cos_tail = z * z * polynomial(z, COS_C) - r * r_lo
  cos_lo = ((1.0 - cos_hi) - half_z) + ((cos_tail - z_err * 0.5) if exact_z else cos_tail)
  # by quadrant: tan(r + pi/2) = -cos(r)/sin(r), blended by multiplying with the parity 0.0/1.0 (exact): four WHEREs
  # on one random condition ran 1.8x slower (gcc 13, one thread, 512x2048 float32: 47 -> 25-39 ms; sin: 16 ms)
  odd = (q & const(dtypes.uint64, 1)).cast(dtypes.float64)
  even = 1.0 - odd
  num_hi, num_lo = sin_hi * even - cos_hi * odd, sin_lo * even - cos_lo * odd
  den_hi, den_lo = cos_hi * even + sin_hi * odd, cos_lo * even + sin_lo * odd
  den = den_hi + den_lo
  value = (num_hi + num_lo) / den
  if exact_z:
    product, product_err = two_product(value, den_hi)
    # num_hi - product is exact (within a factor 2 of each other); the rest is small against the quotient
    residual = ((num_hi - product) - product_err) + (num_lo - value * den_lo)
    value = value + residual / den
  out = dtypes.float64 if widened else fmt.dtype
  if not widened: value = value.cast(out)
  result = copy_sign_bit(value, x.cast(out) if widened else x, FORMATS[out])   # tan is odd
  return finite.where(result, const(out, math.nan))

def sin_of_widened_float32(x: UOp, quarter_turns: int = 0) -> UOp:
  """sin(float64(x) + quarter_turns*pi/2) for a float32 node x: the float32 reduction (3 limbs of 2/pi, not 6) with
  float64 polynomials, as accurate as the float64 version (kiln/mixin/elementwise.py `_cos_accurate` and
  `_tan_accurate` use it)."""
  return sin_float(x, F32, widened=True, quarter_turns=quarter_turns)

# ---------------- rules ----------------

SOFTWARE = {Ops.EXP2: exp2_float, Ops.LOG2: log2_float, Ops.SIN: sin_float}

def is_widened_float32(node: UOp) -> bool:
  """Whether `node` is a float32 value cast to float64."""
  return node.op is Ops.CAST and node.dtype == dtypes.float64 and node.src[0].dtype == dtypes.float32

def software_transcendental(node: UOp, x: UOp) -> UOp | None:
  """EXP2/LOG2/SIN(x) -> the same function built from plain ALU uops (16- and 8-bit floats in float32); SIN(pi/2 - y)
  in float64 -> cos(y), without rounding pi/2 - y; EXP2(a * (1/ln2)) -> e**a, without rounding a * (1/ln2)"""
  if node.op is Ops.SIN:
    quarter_turns, y = (1, cos_y) if (cos_y := cos_argument(x)) is not None else (0, x)
    if is_widened_float32(y): return sin_of_widened_float32(y.src[0], quarter_turns)
    if quarter_turns: return sin_float(y, F64, quarter_turns=1)
  if node.op is Ops.EXP2 and (a := exp_argument(x)) is not None: return exp_float(a, FORMATS[a.dtype])
  if node.dtype in FORMATS: return SOFTWARE[node.op](x, FORMATS[node.dtype])
  if not dtypes.is_float(node.dtype): return None
  return SOFTWARE[node.op](x.cast(dtypes.float32), F32).cast(node.dtype)

def software_tan(node: UOp) -> UOp | None:
  """FDIV(SIN(y), SIN(pi/2 - y)) in float64 -> tan(y) from one reduction, rounded about once"""
  if (y := tan_argument(node)) is None: return None
  return tan_float(y.src[0], F32, widened=True) if is_widened_float32(y) else tan_float(y, F64)

def software_replacement(node: UOp) -> UOp | None:
  """What software_math rewrites `node` to (None: nothing)."""
  return software_tan(node) if node.op is Ops.FDIV else software_transcendental(node, node.src[0])

# (rewrites run top-down: a tan's FDIV is seen before its SINs)
software_math = PatternMatcher([
  (UPat((Ops.EXP2, Ops.LOG2, Ops.SIN), src=(UPat.var("x"),), name="node"), software_transcendental),
  (UPat(Ops.FDIV, name="node"), software_tan),
])

def wants_software_math(renderer) -> bool:
  """Whether kernels for `renderer` get software transcendentals (TRANSCENDENTAL: 0 never, 1 if not native, 2 always)."""
  level = int(TRANSCENDENTAL.value)
  return level >= 2 or (level == 1 and not getattr(renderer, "has_native_transcendentals", True))

# (op, dtype, input dtype, widened, special) -> the software version of `op` (FDIV: tan; SIN, special: cos; EXP2,
# special: exp) built once on a placeholder input:
# (placeholder, result, the result's nodes that depend on the placeholder in build order, the ops of the result), or
# None where the rule does not apply. A kernel's copies (the 128 GELUs of a 16x8 matmul tile) are made from it by
# substitution. The placeholder is one node for every template, so a sin and a cos of one input share their reduction.
_templates: dict[tuple[Ops, DType, DType, bool, bool], tuple[UOp, UOp, list[UOp], frozenset[Ops]] | None] = {}

def _software_template(op: Ops, dtype: DType, x_dtype: DType, widened: bool = False,
                       special: bool = False) -> tuple[UOp, UOp, list[UOp], frozenset[Ops]] | None:
  """The template for `op` (see _templates); `widened`: the input is a float32 value cast to float64 (the
  placeholder then stands for the float32 value); `special`: the input is pi/2 - y for SIN (the placeholder stands
  for y: cos(y)), a * (1/ln2) for EXP2 (the placeholder stands for a: e**a)."""
  key = (op, dtype, x_dtype, widened, special)
  if key in _templates: return _templates[key]
  placeholder = UOp(Ops.DEFINE_VAR, dtypes.float32 if widened else x_dtype, (), ("software math input", 0, 0))
  x = placeholder.cast(dtypes.float64) if widened else placeholder
  argument = x
  if op is Ops.EXP2 and special: argument = x * INV_LN2
  elif special or op is Ops.FDIV: argument = UOp(Ops.SUB, dtypes.float64, (const(dtypes.float64, COS_SHIFT), x))
  if op is Ops.FDIV: node = UOp(Ops.FDIV, dtype, (UOp(Ops.SIN, dtype, (x,)), UOp(Ops.SIN, dtype, (argument,))))
  else: node = UOp(op, dtype, (argument,))
  result = software_replacement(node)
  template = None
  if result is not None:
    nodes = toposort([result])
    depends, dependents = {placeholder}, []
    for u in nodes:
      if not depends.isdisjoint(u.src): depends.add(u); dependents.append(u)
    ops = frozenset(u.op for u in nodes if u is not placeholder)
    # the builders look at nothing but dtypes, so the result for any input is the template with it substituted; a
    # result that held a transcendental itself would need rewriting again (none does: checked here)
    if ops.isdisjoint(SOFTWARE): template = (placeholder, result, dependents, ops)
  _templates[key] = template
  return template

def _software_rewrite(sink: UOp, nodes: list[UOp]) -> tuple[UOp, set[Ops]] | None:
  """`graph_rewrite(sink, software_math)` built bottom-up over `nodes` (`toposort([sink])`): each transcendental gets
  its template with its rewritten input substituted; only the nodes above one are rebuilt. Also the ops the rewrite
  added. None when some op has no template (then graph_rewrite does it)."""
  done: dict[UOp, UOp] = {}
  get = done.get
  added: set[Ops] = set()
  for u in nodes:
    src = tuple(map(get, u.src, u.src))
    new = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
    tan_y = tan_argument(u) if u.op is Ops.FDIV else None
    if tan_y is not None or (u.op in SOFTWARE and (u.dtype in FORMATS or dtypes.is_float(u.dtype))):
      # (other nodes: the rules leave them; a tan's SINs are rewritten too, and left unused)
      if tan_y is not None: x, special = get(tan_y, tan_y), False
      else:
        argument = cos_argument(src[0]) if u.op is Ops.SIN else exp_argument(src[0]) if u.op is Ops.EXP2 else None
        x, special = (src[0], False) if argument is None else (argument, True)
      widened = u.op in (Ops.SIN, Ops.FDIV) and is_widened_float32(x)
      if (template := _software_template(u.op, u.dtype, x.dtype, widened, special)) is None: return None
      placeholder, result, dependents, ops = template
      copy = {placeholder: x.src[0] if widened else x}
      copy_get = copy.get
      for t in dependents: copy[t] = UOp(t.op, t.dtype, tuple(map(copy_get, t.src, t.src)), t.arg)
      new = copy[result]
      added |= ops
    if new is not u: done[u] = new
  return get(sink, sink), added

def apply_software_math(sink: UOp, renderer) -> UOp:
  """A lowered kernel with EXP2/LOG2/SIN (and division by constants) in software where the renderer wants it."""
  from kiln.codegen.divmod import fast_division, wants_fast_division
  from kiln.codegen.opt.kernel import graph_nodes
  # a rewrite walks (and rebuilds) the whole graph: skipped when no node has an op its rules match (one walk to
  # find out costs a fraction of a rewrite's; most kernels have no transcendental, many no division). The walk is
  # usually the optimizer's, remembered.
  nodes = graph_nodes(sink)
  present = {u.op for u in nodes}
  if wants_software_math(renderer) and not present.isdisjoint(SOFTWARE):
    if (rewritten := _software_rewrite(sink, nodes)) is not None: sink, added = rewritten
    else: sink, added = graph_rewrite(sink, software_math, name="transcendental"), {u.op for u in toposort([sink])}
    present |= added   # (a superset of the ops left: enough to skip the division pass)
  if wants_fast_division(renderer) and not present.isdisjoint(fast_division.by_op):
    sink = graph_rewrite(sink, fast_division, name="divmod")
  return sink
