"""Elementwise math and activations beyond the core set (inverse trig, hyperbolic, erf, copysign, ...).

Each function is a composition of core ops, so autograd differentiates it without a rule of its own. Three habits
keep the results (and their gradients) right at the edges, where PyTorch is the reference:
- half-precision inputs are computed in float32 and rounded once at the end, as PyTorch's CPU kernels do;
- odd functions evaluate their positive half on |x| taken with `where`, so the gradient at 0 is the function's
  slope there (abs() has gradient 0 at 0);
- every branch of a `where` gets inputs for which it is finite: the branch not taken still receives a zero gradient,
  and 0 * inf (from a branch evaluated out of its range) would turn that zero into NaN.
"""
from __future__ import annotations
import decimal, functools, math
from fractions import Fraction
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence
from kiln.dtype import DType, dtypes
from kiln.gradient import custom_backward, custom_backward_rules
from kiln.uop.ops import UOp, Ops
from kiln.codegen.transcendental import PI as _PI
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

LN2 = math.log(2)
# sinh(x)/x in powers of x*x: 1/(2n+1)!; 6 terms are exact to 2e-10 on |x|<1
_SINH_TAYLOR = [1 / math.factorial(2 * n + 1) for n in range(6)]
# asin(x) = x + x^3 * P(x^2) on |x| <= 0.5 and atan(x) = x + x^3 * Q(x^2) on |x| <= tan(pi/8): minimax fits
# (Moshier's Cephes asinf/atanf), accurate to float32 rounding; highest power first
_ASIN_P = [4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1]
_ATAN_Q = [8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1]
# erf: the Taylor series below 1 and erfc(x) = exp(-x*x) * erfcx(x) above, erfcx as a Chebyshev series in
# t = (x - 4) / (x + 4), which maps [0, inf) to [-1, 1): 24 terms, by interpolation at the Chebyshev nodes in 40-digit
# mpmath (the last coefficient is 4e-17 of the value); the interpolation error is below 2**-60, the float64
# evaluation's about 2 ulp of erfcx (see _erf_positive)
_TWO_OVER_SQRT_PI = 2 / (decimal.Context(prec=50).divide(_PI.numerator, _PI.denominator)).sqrt(decimal.Context(prec=50))
_ERFCX_K = 4.0
_ERFCX_CHEBYSHEV = (0.2981017936936576, -0.42908644125580536, 0.18027256568771055, -0.06523752449734899,
                    0.020367256576744864, -0.005449087066459008, 0.0012278515372606755, -0.0002246979421877305,
                    3.068543113098951e-05, -2.3178234999468535e-06, -1.4628356484727578e-07, 6.927830518748949e-08,
                    -6.8831107633628464e-09, -6.85848914944545e-10, 2.459373498949661e-10, -7.814909174030975e-12,
                    -5.8893947338050134e-12, 6.869230439359363e-13, 1.2550492559719304e-13, -2.8232511550081553e-14,
                    -2.6031612351094214e-15, 1.0250484558877961e-15, 5.722112987811408e-17, -3.829755756713674e-17)

def _poly(x: Tensor, coefficients: Sequence[float]) -> Tensor:
  """The polynomial with `coefficients` (highest power first) at x, by Horner's rule."""
  acc = x * coefficients[0] + coefficients[1]
  for c in coefficients[2:]: acc = acc * x + c
  return acc

def _odd(x: Tensor, positive_half: Callable[[Tensor], Tensor]) -> Tensor:
  """An odd function from its values on x >= 0 (sign of zero and the slope at 0 kept, NaN passed through)."""
  negative = x < 0
  result = positive_half(negative.where(-x, x))
  return negative.where(-result, result)

# expm1(x) = x + x**2 * Q(x) for |x| < 1/2: Q's coefficients, highest first (a least-squares fit; 0.9 ulp)
_EXPM1_POLY = (2.4737331841606647e-05, 0.00019973977759946138, 0.0013889556284993887, 0.00833314098417759,
               0.041666656732559204, 0.1666666716337204, 0.5)

def _bernoulli_numbers(count: int) -> list[Fraction]:
  """B_0 .. B_{count-1} (B_1 = -1/2), by the recurrence sum_{j<=m} C(m+1, j) B_j = 0."""
  numbers: list[Fraction] = []
  for m in range(count):
    numbers.append(Fraction(1) if m == 0 else -sum(math.comb(m + 1, j) * numbers[j] for j in range(m)) / (m + 1))
  return numbers

# tanh(x) = x + x**3 * P(x**2) for |x| < 0.55 in float64: P from the Taylor series
# tanh x = sum 2**(2n) (2**(2n) - 1) B_2n x**(2n-1) / (2n)!, which converges as (2x/pi)**2 per term: 19 terms reach
# 2**-56 of the result at 0.55; highest power first, from x**3 on
_BERNOULLI = _bernoulli_numbers(42)
_TANH_TAYLOR_F64 = tuple(float(Fraction(2 ** (2 * n) * (2 ** (2 * n) - 1)) * _BERNOULLI[2 * n] / math.factorial(2 * n))
                         for n in range(20, 1, -1))

def _cos_backward(gradient: UOp, node: UOp) -> tuple[UOp]:
  """d cos(x) = -sin(x) dx"""
  return ((gradient * node.src[1].alu(Ops.SIN)).alu(Ops.NEG),)

def _tan_backward(gradient: UOp, node: UOp) -> tuple[UOp]:
  """d tan(x) = (1 + tan(x)**2) dx"""
  return (gradient * (node * node + node.full_like(1.0)),)

custom_backward_rules.update({"cos": _cos_backward, "tan": _tan_backward})

class _ErfFormat(NamedTuple):
  """What the erf evaluation needs to know about a float format."""
  taylor: list[float]    # erf(x)/x - 1 in powers of x*x, highest first: the first dropped term is below 2**-26 / 2**-56
  chebyshev: tuple[float, ...]   # erfcx's series, truncated where its terms fall below 1e-9 / 4e-17 of the value
  bits: DType            # the integer type of the same size (to clear low mantissa bits)
  low_bits: int          # cleared: hi keeps 12 / 26 significant bits, so hi*hi is exact
  limit: float           # beyond, exp(-x*x) is 0 (float32: 3.7e-44 at 10), and so is the slope

def _erf_taylor(terms: int) -> list[float]:
  """The Taylor coefficients of erf(x)/x - 1 (2/sqrt(pi) * (-1)**n / (n! (2n+1)), less 1 for n = 0), highest first."""
  return [float(_TWO_OVER_SQRT_PI * (-1) ** n / (math.factorial(n) * (2 * n + 1)) - (n == 0))
          for n in range(terms - 1, -1, -1)]

_ERF_FORMATS = {dtypes.float32: _ErfFormat(_erf_taylor(11), _ERFCX_CHEBYSHEV[:13], dtypes.int32, 12, 10.0),
                dtypes.float64: _ErfFormat(_erf_taylor(19), _ERFCX_CHEBYSHEV, dtypes.int64, 27, 30.0)}

def _erf_positive(a: Tensor) -> Tensor:
  """erf(a) for float32/float64 a >= 0 (or NaN), within about 1 ulp: x + x*(Taylor tail) below 1 (adding x last
  shrinks the sum's rounding errors), else 1 - erfc(a) with erfc(a) = exp(-a*a) * erfcx(a). a*a is split as
  hi*hi + d (hi*hi exact, d = (a - hi) * (a + hi) small), exp(-a*a) = exp(-hi*hi) * (1 - d + d*d/2): rounding a*a
  would cost up to a*a ulp of erfc."""
  fmt = _ERF_FORMATS[a.dtype]
  tail = a >= 1
  near = tail.where(0.0, a)   # each branch on inputs where it is finite, so the gradient of the other stays finite
  square = near * near
  series = near + near * functools.reduce(lambda acc, c: acc * square + c, fmt.taylor[1:], fmt.taylor[0])
  far = tail.where((a < fmt.limit).where(a, fmt.limit), 1.0)
  t = (far - _ERFCX_K) / (far + _ERFCX_K)
  # Clenshaw's recurrence for sum c_j T_j(t)
  later, latest = t * 0, t * 0
  for c in fmt.chebyshev[:0:-1]: later, latest = 2 * t * later - latest + c, later
  erfcx = t * later - latest + fmt.chebyshev[0]
  # (the split is constant for autograd: the gradient of hi*hi + d is 2*a all the same)
  hi = (far.detach().bitcast(fmt.bits) & ~((1 << fmt.low_bits) - 1)).bitcast(a.dtype)
  d = (far - hi) * (far + hi)
  erfc = (-(hi * hi)).exp() * (1 - d + d * d * 0.5) * erfcx
  return tail.where(1 - erfc, series)

class ElementwiseMixin:
  __slots__ = ()

  # ---------------- numerics shared by the functions below ----------------
  def _in_float(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn of this tensor as a float, computed in float32 for half, bfloat16 and fp8 (and float32 for ints), rounded to
    the result dtype once."""
    out = self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float
    compute = dtypes.float32 if out in dtypes.narrow_floats else out
    return fn(self.cast(compute)).cast(out)

  def _sin_cos(self) -> tuple[Tensor, Tensor]:
    """(sin(x), cos(x)) for a float32/float64 tensor, in float64: cos(x) = sin(2x) / (2 sin(x)).

    Doubling is exact, and sin is accurate relative to its value everywhere, so cos keeps its relative accuracy near
    its zeros (where 1 - 2 sin(x/2)**2 or sin(x + pi/2) lose every bit). Where 2x would overflow (|x| >= 2**127 in
    float32) cos(x) = (cos(x/2) - sin(x/2)) * (cos(x/2) + sin(x/2)) from the same two sines. float32 takes the sines
    of its values widened to float64 (software math reduces those as float32, evaluates in float64 and does not
    round), so the quotient is rounded once."""
    huge_limit = 2.0 ** (127 if self.dtype == dtypes.float32 else 1023)
    huge = (self >= huge_limit) | (self <= -huge_limit)
    once = huge.where(self * 0.5, self).cast(dtypes.float64).sin()
    twice = huge.where(self, self * 2).cast(dtypes.float64).sin()
    zero = once == 0   # only at x == 0, where cos is 1
    cos_once = zero.where(1.0, twice / (2 * zero.where(1.0, once)))
    cos_from_half = (cos_once - once) * (cos_once + once)
    return huge.where(twice, once), huge.where(cos_from_half, cos_once)

  def _software_sin_cos(self) -> tuple[Tensor, Tensor] | None:
    """(sin(x), cos(x)) in float64 for a float32/float64 tensor on a device with kiln's software sin, else None.

    cos(y) is written as SIN(pi/2 - y) in float64, which software math evaluates as cos(y) itself: y's reduction
    with the quadrant moved by one, nothing rounded (kiln/uop/mathforms.py `cos_argument`); a sin and a cos
    of one input share their reduction. float32 is widened: those sines are reduced as float32 and returned in
    float64 unrounded. (Elsewhere that graph means sin of the rounded pi/2 - y, tinygrad's cos: good to about
    1e-16 * |y| absolute, so the native formula of _sin_cos is used there.)"""
    from kiln.device import Device
    from kiln.codegen.transcendental import COS_SHIFT, wants_software_math
    if not isinstance(self.device, str): return None
    renderer = Device[self.device].renderer
    if not (wants_software_math(renderer) or renderer.renders_math_forms): return None
    wide = self.detach().cast(dtypes.float64)   # (the custom backward rules give the gradients)
    return wide.sin(), (COS_SHIFT - wide).sin()

  def _cos_accurate(self) -> Tensor:
    """cos(x) for a float32/float64 tensor (see _software_sin_cos and _sin_cos), gradient -sin(x)."""
    pair = self._software_sin_cos()
    value = (pair or self._sin_cos())[1].cast(self.dtype)
    return self._wrap(custom_backward(value.uop, (self.uop,), "cos", ()), "cos")

  def _tan_accurate(self) -> Tensor:
    """tan(x) = sin(x) / cos(x) for a float32/float64 tensor, from _software_sin_cos (software math evaluates that
    quotient as one tan from one reduction, rounded about once) or _sin_cos, gradient 1 + tan(x)**2."""
    sine, cosine = self._software_sin_cos() or self._sin_cos()
    value = (sine / cosine).cast(self.dtype)
    return self._wrap(custom_backward(value.uop, (self.uop,), "tan", ()), "tan")

  def _log1p(self) -> Tensor:
    """log(1 + x), accurate for tiny x: log(u) * x / (u - 1) with u = 1 + x cancels u's rounding error (Goldberg)."""
    u = 1 + self
    finite = u != math.inf
    x = finite.where(self, 1.0)
    u = 1 + x
    rounded_away = u - 1
    exact = rounded_away == 0
    ratio = x / exact.where(1.0, rounded_away)
    return finite.where(exact.where(x, u.log() * ratio), self)

  def _expm1(self) -> Tensor:
    """exp(x) - 1, accurate for tiny x: x + x**2 * Q(x) for |x| < 1/2 (a polynomial within 0.9 ulp in float32),
    exp(x) - 1 outside, where the subtraction loses nothing."""
    small = (self > -0.5) & (self < 0.5)
    near = small.where(self, 0.0)   # the polynomial only where it is used: its gradient stays finite elsewhere
    q = functools.reduce(lambda acc, c: acc * near + c, _EXPM1_POLY[1:], _EXPM1_POLY[0])
    poly = (near == 0).where(near, near + near * near * q)   # expm1(-0.0) is -0.0
    return small.where(poly, self.exp() - 1)

  def _fmod(self, other: Tensor) -> Tensor:
    """C's fmod (exact, the sign of the dividend), for float tensors of one dtype and shape; no gradient."""
    return self._wrap(self.detach().uop.alu(Ops.MOD, other.detach().uop), "fmod")

  def _float_floordiv(self, other: Tensor) -> Tensor:
    """floor(x / y) for floats as PyTorch computes it: from the exact fmod, so 1.0 // 0.1 is 9.0, not 10.0."""
    def fn(x: Tensor) -> Tensor:
      y = other.cast(x.dtype)
      remainder = x._fmod(y)
      quotient = (x - remainder) / y   # an integer up to rounding
      wrong_sign = (remainder != 0) & ((y < 0) != (remainder < 0))
      quotient = wrong_sign.where(quotient - 1, quotient)
      floored = quotient.floor()
      floored = (quotient - floored > 0.5).where(floored + 1, floored)
      true_quotient = x / y
      # a zero quotient keeps the sign of x / y (-0.0 for -0.5 // 1); y == 0 gives x / y (inf or NaN)
      signed_zero = true_quotient * 0
      return (y == 0).where(true_quotient, (quotient != 0).where(floored, signed_zero))
    return self._in_float(fn).detach()

  def _float_mod(self, other: Tensor) -> Tensor:
    """x - floor(x / y) * y for floats from the exact fmod (PyTorch's remainder), gradients 1 and -floor(x / y)."""
    def fn(x: Tensor) -> Tensor:
      y = other.cast(x.dtype)
      remainder = x._fmod(y)
      remainder = ((remainder != 0) & ((y < 0) != (remainder < 0))).where(remainder + y.detach(), remainder)
      # the value is exact; these terms are zero and carry the gradient (guarded: inf - inf would be NaN)
      def zero_carrying_gradient(t: Tensor) -> Tensor:
        finite = t.isfinite().detach()
        guarded = finite.where(t, 0.0)
        return guarded - guarded.detach()
      return remainder + zero_carrying_gradient(x) - x._float_floordiv(y) * zero_carrying_gradient(y)
    return self._in_float(fn)

  def _asin_small(self) -> Tensor:
    """asin on |x| <= 0.5."""
    z = self * self
    return self + self * z * _poly(z, _ASIN_P)

  def _atan_small(self) -> Tensor:
    """atan on |x| <= tan(pi/8)."""
    z = self * self
    return self + self * z * _poly(z, _ATAN_Q)

  # ---------------- inverse trigonometric ----------------
  def asin(self) -> Tensor:
    """Elementwise inverse sine, in [-pi/2, pi/2] (NaN outside [-1, 1]; ints become floats).

    >>> round(Tensor([1.0]).asin().item(), 5)
    1.5708
    """
    def positive(a: Tensor) -> Tensor:
      big = a > 0.5   # asin(a) = pi/2 - 2*asin(sqrt((1-a)/2)) keeps full precision near 1
      near_one = (0.5 * (1 - big.where(a, 0.0))).sqrt()._asin_small()
      return big.where(math.pi / 2 - 2 * near_one, big.where(0.0, a)._asin_small())
    return self._in_float(lambda x: _odd(x, positive))

  def acos(self) -> Tensor:
    """Elementwise inverse cosine, in [0, pi] (NaN outside [-1, 1]; ints become floats).

    >>> round(Tensor([0.0]).acos().item(), 5)
    1.5708
    """
    def fn(x: Tensor) -> Tensor:
      high, low = x > 0.5, x < -0.5
      near_one = (0.5 * (1 - high.where(x, 0.0))).sqrt()._asin_small()
      near_minus_one = (0.5 * (1 + low.where(x, 0.0))).sqrt()._asin_small()
      middle = math.pi / 2 - (high | low).where(0.0, x)._asin_small()
      return high.where(2 * near_one, low.where(math.pi - 2 * near_minus_one, middle))
    return self._in_float(fn)

  def atan(self) -> Tensor:
    """Elementwise inverse tangent, in (-pi/2, pi/2) (ints become floats).

    >>> round(Tensor([1.0]).atan().item(), 5)
    0.7854
    """
    def positive(a: Tensor) -> Tensor:
      # reduce the argument to |z| <= tan(pi/8): atan(a) = pi/2 + atan(-1/a) = pi/4 + atan((a-1)/(a+1))
      high = a > 2.414213562373095
      mid = (a > 0.41421356237309503) & ~high
      from_high = math.pi / 2 + (-high.where(a, 1.0).reciprocal())._atan_small()
      a_mid = mid.where(a, 1.0)
      from_mid = math.pi / 4 + ((a_mid - 1) / (a_mid + 1))._atan_small()
      return high.where(from_high, mid.where(from_mid, (high | mid).where(0.0, a)._atan_small()))
    return self._in_float(lambda x: _odd(x, positive))

  # ---------------- hyperbolic ----------------
  def sinh(self) -> Tensor:
    """Elementwise hyperbolic sine (ints become floats).

    >>> round(Tensor([1.0]).sinh().item(), 5)
    1.1752
    """
    def positive(a: Tensor) -> Tensor:
      small = a < 1   # a series near 0, where exp(a) - exp(-a) cancels
      half_exp = (small.where(1.0, a) - LN2).exp()   # exp(a)/2 without overflowing before sinh does
      series = small.where(a, 0.0)
      return small.where(series * _poly(series * series, _SINH_TAYLOR[::-1]), half_exp - 0.25 / half_exp)
    return self._in_float(lambda x: _odd(x, positive))

  def cosh(self) -> Tensor:
    """Elementwise hyperbolic cosine (ints become floats).

    >>> Tensor([0.0]).cosh().item()
    1.0
    """
    def fn(x: Tensor) -> Tensor:
      half_exp = ((x < 0).where(-x, x) - LN2).exp()   # exp(|x|)/2 without overflowing before cosh does
      return half_exp + 0.25 / half_exp
    return self._in_float(fn)

  def asinh(self) -> Tensor:
    """Elementwise inverse hyperbolic sine (ints become floats).

    >>> round(Tensor([1.0]).asinh().item(), 5)
    0.88137
    """
    def positive(a: Tensor) -> Tensor:
      big = a > 4096   # asinh(a) = log(2a) + O(1/a^2), and a*a would overflow for huge a
      small = big.where(0.0, a)
      near = (small + small * small / (1 + (small * small + 1).sqrt()))._log1p()
      return big.where(big.where(a, 2.0).log() + LN2, near)
    return self._in_float(lambda x: _odd(x, positive))

  def acosh(self) -> Tensor:
    """Elementwise inverse hyperbolic cosine (NaN below 1; ints become floats).

    >>> Tensor([1.0]).acosh().item()
    0.0
    """
    def fn(x: Tensor) -> Tensor:
      big = x > 4096
      t = big.where(2.0, x) - 1   # acosh(1+t) = log1p(t + sqrt(t*(t+2))) stays precise near 1
      near = (t + (t * (t + 2)).sqrt())._log1p()
      return (x < 1).where(math.nan, big.where(big.where(x, 2.0).log() + LN2, near))
    return self._in_float(fn)

  def atanh(self) -> Tensor:
    """Elementwise inverse hyperbolic tangent (+-inf at +-1, NaN beyond; ints become floats).

    >>> round(Tensor([0.5]).atanh().item(), 5)
    0.54931
    """
    return self._in_float(lambda x: _odd(x, lambda a: 0.5 * (2 * a / (1 - a))._log1p()))

  # ---------------- special functions ----------------
  def erf(self) -> Tensor:
    """Elementwise Gauss error function (ints become floats).

    >>> Tensor([0.0]).erf().item()
    0.0
    """
    # (see _erf_positive; half types in float32, rounded once)
    return self._in_float(lambda x: _odd(x, _erf_positive))

  def copysign(self, other) -> Tensor:
    """The magnitude of this tensor with the sign (bit) of `other`, elementwise; the result is float, as in PyTorch.

    The sign bit counts, so -0.0 and negative NaNs give a negative result.

    >>> Tensor([1.0, -2.0, 3.0]).copysign(Tensor([-1.0, 1.0, -0.0])).tolist()
    [-1.0, 2.0, -3.0]
    """
    x, y = self._broadcasted(other, "copysign")
    if not dtypes.is_float(x.dtype): x, y = x.cast(dtypes.default_float), y.cast(dtypes.default_float)
    bits_dtype = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[y.dtype.itemsize]
    negative = self._wrap(UOp(Ops.BITCAST, bits_dtype, (y.detach().uop,)), "copysign") < 0
    magnitude = x.abs()
    return negative.where(-magnitude, magnitude)

  def idiv(self, x, reverse: bool = False) -> Tensor:
    """Division rounded toward zero (C's integer division; x / self if `reverse`), like div(rounding_mode="trunc").

    >>> Tensor([-7, 7]).idiv(2).tolist()
    [-3, 3]
    """
    return self.div(x, reverse, rounding_mode="trunc")

  def isfinite(self) -> Tensor:
    """True where x is neither infinite nor NaN (always True for ints and bools).

    >>> Tensor([1.0, float("inf"), float("nan")]).isfinite().tolist()
    [True, False, False]
    """
    if not dtypes.is_float(self.dtype): return self.full_like(True, dtype=dtypes.bool)
    return (self == self) & (self != math.inf) & (self != -math.inf)

  def isclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """True where |self - other| <= atol + rtol * |other| (equal infinities count; NaNs only with `equal_nan`).

    >>> Tensor([1.0, 2.0]).isclose(Tensor([1.0 + 1e-7, 2.1])).tolist()
    [True, False]
    """
    x, y = self._broadcasted(other, "isclose")
    close = (x == y) | ((x - y).abs() <= atol + rtol * y.abs()) & x.isfinite() & y.isfinite()
    return close | (x.isnan() & y.isnan()) if equal_nan else close

  # ---------------- activations ----------------
  def celu(self, alpha: float = 1.0) -> Tensor:
    """CELU: x where x > 0, else alpha * (exp(x / alpha) - 1).

    >>> round(Tensor([-1.0]).celu().item(), 5)
    -0.63212
    """
    positive = self > 0
    return positive.where(self, alpha * (positive.where(0.0, self._as_float()) / alpha)._expm1())

  def selu(self, alpha: float = 1.6732632423543772, gamma: float = 1.0507009873554805) -> Tensor:
    """SELU: gamma * x where x > 0, else gamma * alpha * (exp(x) - 1) (defaults: the self-normalizing constants).

    >>> round(Tensor([1.0]).selu().item(), 5)
    1.0507
    """
    positive = self > 0
    return gamma * positive.where(self, alpha * positive.where(0.0, self._as_float())._expm1())

  def logsigmoid(self) -> Tensor:
    """log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|)), finite for any finite x.

    >>> round(Tensor([0.0]).logsigmoid().item(), 5)
    -0.69315
    """
    x = self._as_float()
    negative = x < 0
    return negative.where(x, 0.0) - negative.where(x, -x).exp()._log1p()

  def mish(self) -> Tensor:
    """Mish: x * tanh(softplus(x)).

    >>> round(Tensor([1.0]).mish().item(), 5)
    0.8651
    """
    return self * self.softplus().tanh()

  def softsign(self) -> Tensor:
    """x / (1 + |x|).

    >>> Tensor([-3.0, 1.0]).softsign().tolist()
    [-0.75, 0.5]
    """
    return self / (1 + self.abs())

  def hardswish(self) -> Tensor:
    """x * relu6(x + 3) / 6, with PyTorch's gradient (x/3 + 1/2 inside (-3, 3), 0 from -3 down, 1 from 3 up).

    >>> Tensor([-4.0, 0.0, 1.0, 4.0]).hardswish().tolist()
    [-0.0, 0.0, 0.6666666865348816, 4.0]
    """
    return self * (self + 3).relu6() * (1 / 6)

  def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
    """max(0, min(1, alpha * x + beta)), with a zero gradient at and beyond the corners (as in PyTorch).

    >>> Tensor([-4.0, 0.0, 4.0]).hardsigmoid().tolist()
    [0.0, 0.5, 1.0]
    """
    y = alpha * self + beta
    if alpha == 0: return y
    # compare x with the corners rather than y with 0 and 1: y rounds (x = -3 gives y = 1e-8, not 0)
    lo, hi = sorted(((0 - beta) / alpha, (1 - beta) / alpha))
    low_value, high_value = (0.0, 1.0) if alpha > 0 else (1.0, 0.0)
    return (self <= lo).where(low_value, (self >= hi).where(high_value, y))
