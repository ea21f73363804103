"""Elementwise math, activations, reductions and cumulative ops against PyTorch: values, dtypes and gradients.

Many ops are checked at once where possible (row i of a stacked input goes to op i), so one kernel serves a whole table.
Where kiln follows tinygrad instead of PyTorch the test says so: sums of int32 stay int32 (torch: int64), argmax is
int32, cummax returns the values only.
"""
import math, time
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, dtypes
from helpers import check, check_stacked, assert_close, make_input

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom")

# ---------------------------------------------------------------------------------------------------------------------
# elementwise math and activations: (name, kiln, torch, low, high)

MATH = [
  ("asin", lambda x: x.asin(), torch.asin, -0.95, 0.95), ("acos", lambda x: x.acos(), torch.acos, -0.95, 0.95),
  ("atan", lambda x: x.atan(), torch.atan, -6, 6), ("sinh", lambda x: x.sinh(), torch.sinh, -4, 4),
  ("cosh", lambda x: x.cosh(), torch.cosh, -4, 4), ("asinh", lambda x: x.asinh(), torch.asinh, -6, 6),
  ("acosh", lambda x: x.acosh(), torch.acosh, 1.05, 6), ("atanh", lambda x: x.atanh(), torch.atanh, -0.95, 0.95),
  ("erf", lambda x: x.erf(), torch.erf, -3, 3), ("tanh", lambda x: x.tanh(), torch.tanh, -4, 4),
  ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, -6, 6)]
ACTIVATIONS = [
  ("relu", lambda x: x.relu(), F.relu, -2, 2), ("relu6", lambda x: x.relu6(), F.relu6, -3, 9),
  ("leaky_relu", lambda x: x.leaky_relu(0.2), lambda x: F.leaky_relu(x, 0.2), -2, 2),
  ("elu", lambda x: x.elu(0.7), lambda x: F.elu(x, 0.7), -3, 3),
  ("celu", lambda x: x.celu(0.5), lambda x: F.celu(x, 0.5), -3, 3), ("selu", lambda x: x.selu(), F.selu, -3, 3),
  ("gelu", lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh"), -4, 4),
  ("quick_gelu", lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), -4, 4),
  ("silu", lambda x: x.silu(), F.silu, -4, 4), ("swish", lambda x: x.swish(), F.silu, -4, 4),
  ("mish", lambda x: x.mish(), F.mish, -4, 4), ("softplus", lambda x: x.softplus(), F.softplus, -4, 4),
  ("softplus_beta", lambda x: x.softplus(2.0, 3.0), lambda x: F.softplus(x, 2.0, 3.0), -4, 4),
  ("softsign", lambda x: x.softsign(), F.softsign, -4, 4), ("hardswish", lambda x: x.hardswish(), F.hardswish, -5, 5),
  ("hardsigmoid", lambda x: x.hardsigmoid(), F.hardsigmoid, -5, 5),
  ("hardtanh", lambda x: x.hardtanh(-0.5, 0.75), lambda x: F.hardtanh(x, -0.5, 0.75), -2, 2),
  ("logsigmoid", lambda x: x.logsigmoid(), F.logsigmoid, -6, 6)]
UNARY = MATH + ACTIVATIONS
NAMES = [u[0] for u in UNARY]

def unary_rows(shape, dtype="float32", seed=0, table=UNARY):
  rng = np.random.default_rng(seed)
  return np.stack([make_input(shape, dtype, rng, low, high) for _, _, _, low, high in table])

@pytest.mark.parametrize("shape", [(2, 3), (), (0,), (1,), (1, 4, 1)], ids=str)
def test_unary(shape):
  check_stacked(NAMES, [u[1] for u in UNARY], [u[2] for u in UNARY], [unary_rows(shape)])

def test_unary_noncontiguous():
  view = lambda x: x.permute(1, 0).flip(0)[::2]  # noqa: E731
  check_stacked(NAMES, [lambda x, fn=u[1]: fn(view(x)) for u in UNARY], [lambda x, fn=u[2]: fn(view(x)) for u in UNARY],
          [unary_rows((3, 5))])

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unary_half(dtype):
  rows = unary_rows((3, 4))
  arrays = [rows.astype(np.float16)] if dtype == "float16" else [rows]
  fns = [lambda x, fn=u[1]: fn(x.cast(dtype)) for u in UNARY] if dtype == "bfloat16" else [u[1] for u in UNARY]
  tfns = [lambda x, fn=u[2]: fn(x.bfloat16()) for u in UNARY] if dtype == "bfloat16" else [u[2] for u in UNARY]
  out = check_stacked(NAMES, fns, tfns, arrays, dtype="float16" if dtype == "float16" else "float32", atol=2e-2, rtol=2e-2)
  assert out.dtype == getattr(dtypes, dtype)

@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_math_of_ints_and_bools(dtype):
  # the math functions accept ints and bools and give float32, as torch does
  x = make_input((len(MATH), 2, 3), dtype, np.random.default_rng(0), -2, 3)
  x = x if dtype == "bool" else np.where(np.arange(len(MATH))[:, None, None] == NAMES.index("acosh"), np.abs(x) + 1, x)
  out = check_stacked(NAMES[:len(MATH)], [u[1] for u in MATH], [u[2] for u in MATH], [x.astype(dtype)])
  assert out.dtype == dtypes.float32

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, np.inf, -np.inf, np.nan, 100.0, -100.0, 1e30, -1e30, 1e-6, -3e-7,
                    20.0, 3.0, -3.0, 6.0], np.float32)

@pytest.mark.parametrize("names", [NAMES[:len(MATH)], NAMES[len(MATH):]], ids=["math", "activations"])
def test_special_values(names):
  table = [u for u in UNARY if u[0] in names]
  check_stacked(names, [u[1] for u in table], [u[2] for u in table], [np.stack([SPECIAL] * len(table))], grad=False)

FINITE_EDGES = np.array([0.0, -0.0, 100.0, -100.0, 30.0, -30.0, 90.0, -90.0, 3.0, -3.0, 6.0, 1.0, -1.0, 1e-6, -20.0,
                         0.75, -0.5], np.float32)

def test_gradients_at_edges():
  # gradients at large |x| must be finite (exp overflow in a branch not taken used to give NaN), and at the kinks
  # (0 for relu/leaky_relu/elu, +-3 for hardswish/hardsigmoid, the bounds of hardtanh/relu6) they follow PyTorch
  table = [u for u in UNARY if u[0] not in ("asin", "acos", "acosh", "atanh", "sinh", "cosh")]
  check_stacked([u[0] for u in table], [u[1] for u in table], [u[2] for u in table], [np.stack([FINITE_EDGES] * len(table))],
          atol=1e-6)

def test_precision_near_zero():
  # odd functions keep full relative precision for tiny arguments (no cancellation in the formulas)
  x = np.array([1e-5, -3e-6, 1e-8, 2e-3], np.float32)
  for name in ("asin", "atan", "sinh", "asinh", "atanh", "erf", "tanh"):
    got, want = getattr(Tensor(x), name)().numpy(), getattr(torch, name)(torch.tensor(x, dtype=torch.float64)).numpy()
    assert_close(got, want, name, atol=0, rtol=1e-6)

def test_tanh_ulp_error():
  # tanh is a polynomial below |x| = 0.55 and 1 - 2e/(1 + e) above it: both sides of the seam, tiny and saturated
  # arguments stay within 2.5 ulp of the exact value (float64), and tanh(-0.0) keeps its sign
  x = np.concatenate([np.linspace(-10, 10, 200_001), np.geomspace(1e-30, 0.6, 2001), [0.55, np.nextafter(0.55, 1)]])
  x = np.concatenate([x, -x]).astype(np.float32)
  want = np.tanh(x.astype(np.float64))
  ulps = np.abs(Tensor(x).tanh().numpy() - want) / np.spacing(np.abs(want).astype(np.float32))
  assert ulps.max() <= 2.5, f"tanh is {ulps.max():.2f} ulp off at x={x[ulps.argmax()]}"
  assert np.signbit(Tensor(np.float32([-0.0])).tanh().numpy()[0])

def test_elu_ulp_error():
  # elu's exp(x) - 1 is a polynomial for |x| < 1/2 (exp(x) - 1 beyond): within 2 ulp across the seam and for tiny x
  x = np.concatenate([np.linspace(-20, 0, 100_001), -np.geomspace(1e-30, 0.6, 2001), [-0.5, np.nextafter(-0.5, 0)]])
  x = x.astype(np.float32)
  want = np.expm1(x.astype(np.float64))
  ulps = np.abs(Tensor(x).elu().numpy() - want) / np.spacing(np.abs(want).astype(np.float32))
  assert ulps.max() <= 2.0, f"elu is {ulps.max():.2f} ulp off at x={x[ulps.argmax()]}"
  assert np.signbit(Tensor(np.float32([-0.0])).elu().numpy()[0])

# ---------------------------------------------------------------------------------------------------------------------
# copysign, isfinite, isclose

def test_copysign():
  a = np.array([1.0, -2.0, 3.0, -4.0, 0.0, -0.0, np.inf, 5.0, np.nan, 2.5], np.float32)
  b = np.array([-1.0, 1.0, -0.0, 0.0, -3.0, 2.0, -1.0, -np.inf, -1.0, np.nan], np.float32)
  out = check(lambda a, b: a.copysign(b), lambda a, b: torch.copysign(a, b), [a, b], grad=False)
  assert np.array_equal(np.signbit(out.numpy()), np.signbit(torch.copysign(torch.tensor(a), torch.tensor(b)).numpy()))
  check(lambda a, b: a.copysign(b), lambda a, b: torch.copysign(a, b), [(3, 1), (4,)])   # gradient: sign ratio, 0 at 0
  finite = np.array([1.0, -2.0, 3.0, -4.0, 0.5], np.float32)
  check(lambda a: a.copysign(Tensor(b[:5])), lambda a: torch.copysign(a, torch.tensor(b[:5])), [finite])
  check(lambda a: a.copysign(-1.5), lambda a: torch.copysign(a, -1.5), [(3,)], dtype="float16")
  check(lambda a, b: a.copysign(b), lambda a, b: torch.copysign(a, b), [(2, 3), (2, 3)], dtype=["int32", "int32"])

def test_isfinite_isinf_isnan():
  for name in ("isfinite", "isinf", "isnan"):
    check(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x), [SPECIAL])
    check(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x), [(3,)], dtype="int32")
  check(lambda x: x.isinf(detect_negative=False), lambda x: torch.isposinf(x), [SPECIAL])

def test_isclose():
  a = np.array([1.0, 1.0, np.inf, np.inf, np.nan, 0.0, 1e-9, 100.0], np.float32)
  b = np.array([1.0 + 1e-6, 1.1, np.inf, -np.inf, np.nan, 1e-9, 0.0, 100.001], np.float32)
  check(lambda a, b: a.isclose(b), lambda a, b: torch.isclose(a, b), [a, b])
  check(lambda a, b: a.isclose(b, rtol=0.2, equal_nan=True), lambda a, b: torch.isclose(a, b, rtol=0.2, equal_nan=True),
        [a, b])

# ---------------------------------------------------------------------------------------------------------------------
# arithmetic rounding: // % div(rounding_mode) and pow

DIVIDENDS = np.array([1.0, -1.0, 5.5, -5.5, 0.0, -0.0, 7.0, -7.0, 1e10, -0.5, np.inf, -np.inf, np.nan, 3.0, 0.3, -1.0,
                      1.0], np.float32)
DIVISORS = np.array([0.1, 0.1, 2.0, 2.0, 3.0, 3.0, -2.0, -2.0, 3.0, 1.0, 2.0, 2.0, 1.0, 0.0, np.inf, np.inf, -np.inf],
                    np.float32)

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_floordiv_mod_float(dtype):
  # 1.0 // 0.1 is 9 (0.1 is slightly above 1/10): the quotient must come from the exact remainder, not floor(1.0 / 0.1)
  with np.errstate(over="ignore"): a, b = DIVIDENDS.astype(dtype), DIVISORS.astype(dtype)   # 1e10 -> inf in float16
  check(lambda a, b: a // b, lambda a, b: a // b, [a, b], grad=False)
  check(lambda a, b: a.div(b, rounding_mode="floor"), lambda a, b: a.div(b, rounding_mode="floor"), [a, b], grad=False)
  check(lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: a.div(b, rounding_mode="trunc"), [a, b], grad=False)
  check(lambda a, b: a % b, lambda a, b: a % b, [a, b], grad=False)

def test_mod_gradient_and_scalars():
  a = np.random.default_rng(0).uniform(-5, 5, (3, 4)).astype(np.float32)
  rng = np.random.default_rng(1)
  b = (rng.uniform(0.5, 2, (3, 4)) * rng.choice([-1, 1], (3, 4))).astype(np.float32)
  check(lambda a: a % Tensor(b), lambda a: a % torch.tensor(b), [a])   # torch has no gradient for the divisor
  check(lambda a, b: a % b, lambda a, b: a % b, [a, b], grad=False)
  check(lambda a: a % 0.7, lambda a: a % 0.7, [a])
  check(lambda a: 2.5 % a, lambda a: 2.5 % a, [b], grad=False)
  check(lambda a: 7 // a, lambda a: 7 // a, [b], grad=False)

def test_floordiv_mod_int():
  a = np.array([7, -7, 7, -7, 0, 5, -1, 6, -6, 2**31 - 1], np.int32)
  b = np.array([2, 2, -2, -2, 3, -1, 5, 3, -3, 7], np.int32)
  check(lambda a, b: a // b, lambda a, b: a // b, [a, b])
  check(lambda a, b: a % b, lambda a, b: a % b, [a, b])
  check(lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: a.div(b, rounding_mode="trunc"), [a, b])
  check(lambda a, b: a.div(b, rounding_mode="floor"), lambda a, b: a.div(b, rounding_mode="floor"), [a, b])
  check(lambda a: a // -3, lambda a: a // -3, [a])
  check(lambda a: -9 % a, lambda a: -9 % a, [b])

def test_pow():
  # negative float bases with integral exponents are real numbers, not NaN
  base = np.array([-2.0, -3.0, -0.5, 2.0, 0.0, -1.0], np.float32)
  check(lambda x: x ** 2, lambda x: x ** 2, [base])
  check(lambda x: x ** 3, lambda x: x ** 3, [base])
  check(lambda x: x ** -1, lambda x: x ** -1, [base[[0, 1, 2, 3, 5]]])
  check(lambda x: x ** 0.5, lambda x: x ** 0.5, [base], grad=False)   # NaN for negatives
  check(lambda x: 2 ** x, lambda x: 2 ** x, [(2, 3)])
  check(lambda x: x ** 2, lambda x: x ** 2, [(2, 3)], dtype="float16")

def test_pow_int():
  a = np.array([2, -3, 0, 1, -1, 5, 3, -2, 2, -1, 0], np.int32)
  e = np.array([3, 3, 0, 7, 5, 0, 4, 2, -1, -3, -1], np.int32)
  check(lambda a, e: a ** e, lambda a, e: a ** e, [a, e])   # negative exponents: 0, except for bases 1 and -1
  check(lambda a: a ** 2, lambda a: a ** 2, [a])
  check(lambda a: 3 ** a, lambda a: 3 ** a, [np.abs(a)])
  check(lambda a: a ** 0.5, lambda a: a ** 0.5, [np.abs(a)])
  with pytest.raises(ValueError, match="pow"): Tensor([2, 3]) ** -1

def test_arithmetic_errors():
  with pytest.raises(ValueError, match="div.*rounding_mode"): Tensor([1.0]).div(2, rounding_mode="round")

# ---------------------------------------------------------------------------------------------------------------------
# reductions

@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("axis, keepdim", [(None, False), (1, True), ((0, -1), False), (-2, False)], ids=str)
def test_var_std(axis, keepdim, correction):
  dims = None if axis is None else axis
  check(lambda x: x.var(axis, keepdim, correction), lambda x: x.var(dims, correction=correction, keepdim=keepdim),
        [(3, 4, 2)])
  check(lambda x: x.std(axis, keepdim, correction), lambda x: x.std(dims, correction=correction, keepdim=keepdim),
        [(3, 4, 2)])

def test_var_mean_std_mean():
  for kfn, tfn in ((lambda x: x.var_mean(1, True, 0), lambda x: torch.var_mean(x, 1, correction=0, keepdim=True)),
                   (lambda x: x.std_mean((0, 1)), lambda x: torch.std_mean(x, (0, 1))),
                   (lambda x: x.var_mean(), lambda x: torch.var_mean(x))):
    for i in range(2): check(lambda x: kfn(x)[i], lambda x: tfn(x)[i], [(3, 4)])

def test_var_std_edges():
  check(lambda x: x.var(0), lambda x: x.var(0), [(1, 3)])               # n - correction = 0: NaN
  check(lambda x: x.std(0, correction=3), lambda x: x.std(0, correction=3), [(2, 3)], grad=False)   # correction > n
  check(lambda x: x.var(0), lambda x: x.var(0), [(0, 2)], grad=False)   # empty: NaN
  check(lambda x: x.std(1), lambda x: x.std(1), [np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 3.0]], np.float32)])   # grad 0
  check(lambda x: x.var(1), lambda x: x.float().var(1), [(2, 3)], dtype="int32")
  check(lambda x: x.std(1), lambda x: x.std(1), [(2, 8)], dtype="float16")

def test_mean_dtypes():
  check(lambda x: x.mean(1), lambda x: x.float().mean(1), [(2, 3)], dtype="int32", low=-9, high=9)
  check(lambda x: x.mean(), lambda x: x.float().mean(), [(2, 3)], dtype="bool")   # torch refuses bool; kiln: float32
  # half: the sum (1e5) overflows float16, the mean (100) does not
  check(lambda x: x.mean(), lambda x: x.mean(), [np.full((1000,), 100.0, np.float16)])
  check(lambda x: x.cast("bfloat16").mean((0, 2)), lambda x: x.bfloat16().mean((0, 2)), [(2, 3, 4)], atol=2e-2,
        rtol=2e-2)

def test_reduction_dtypes():
  # sums of ints follow tinygrad: int32 and narrower (and bool) accumulate to int32 (torch gives int64)
  for dtype, want in (("int32", dtypes.int32), ("int8", dtypes.int32), ("bool", dtypes.int32), ("uint8", dtypes.uint32),
                      ("int64", dtypes.int64), ("float16", dtypes.float16)):
    x = make_input((3, 4), dtype, np.random.default_rng(0), -5, 5)
    for name in ("sum", "prod", "cumsum"):
      got = getattr(Tensor(x), name)(0)
      assert got.dtype == want, (name, dtype, got.dtype)
      assert_close(got.numpy(), getattr(torch.tensor(x), name)(0).numpy(), f"{name} of {dtype}", 1e-2, 1e-2)
  assert Tensor([1, 2]).mean().dtype == dtypes.float32 and Tensor([1, 2]).max().dtype == dtypes.int32
  assert Tensor([[1, 2]]).prod(dtype="float32").dtype == dtypes.float32
  check(lambda x: x.sum(dtype="float32"), lambda x: x.sum(dtype=torch.float32), [(3, 4)], dtype="float16")

@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin", "sum", "mean", "logsumexp", "softmax",
                                  "log_softmax", "prod"])
def test_reductions_nan(name):
  # NaN propagates through max/min, and argmax/argmin point at the (first) NaN, as in PyTorch
  x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, -1.0, 0.0], [-np.inf, np.inf, 1.0, 2.0]], np.float32)
  t = {"max": lambda t: t.amax(1), "min": lambda t: t.amin(1)}.get(name, lambda t: getattr(t, name)(1))
  check(lambda k: getattr(k, name)(1), t, [x], grad=False, check_dtype=name not in ("argmax", "argmin"))
  if name in ("max", "min", "argmax", "argmin"):
    check(lambda k: getattr(k, name)(), lambda x: getattr(x, name)(), [x], grad=False,
          check_dtype=name not in ("argmax", "argmin"))

def test_argmax_argmin():
  x = np.array([[3, 1, 3, 0], [0, 0, -2, -2]], np.float32)   # ties: the first index wins
  for name in ("argmax", "argmin"):
    for axis, keepdim in ((None, False), (None, True), (0, True), (-1, False)):
      check(lambda t: getattr(t, name)(axis, keepdim), lambda t: getattr(t, name)(axis, keepdim), [x],
            check_dtype=False)
      assert getattr(Tensor(x), name)(axis).dtype == dtypes.int32   # tinygrad's index dtype (torch: int64)
    check(lambda t: getattr(t, name)(1), lambda t: getattr(t, name)(1), [x.astype(np.int32)], check_dtype=False)
    check(lambda t: getattr(t, name)(0), lambda t: getattr(t, name)(0), [(2, 0)], check_dtype=False)
    assert getattr(Tensor(5.0), name)().item() == 0
  assert Tensor([False, True, True]).argmax().item() == 1 and Tensor([True, False]).argmin().item() == 1

def test_max_min_bool_and_int():
  check(lambda x: x.max(1), lambda x: x.amax(1), [(3, 4)], dtype="bool")
  check(lambda x: x.min(0), lambda x: x.amin(0), [(3, 4)], dtype="bool")
  check(lambda x: x.min(0), lambda x: x.amin(0), [np.array([[-2**31, 2**31 - 1], [0, -1]], np.int32)])

def test_empty_reductions():
  check(lambda x: x.sum(), lambda x: x.sum(), [(0, 3)])
  check(lambda x: x.prod(), lambda x: x.prod(), [(0,)])
  check(lambda x: x.mean(), lambda x: x.mean(), [(0, 3)], grad=False)
  check(lambda x: x.logsumexp(0), lambda x: x.logsumexp(0), [(0, 3)], grad=False)
  check(lambda x: x.max(1), lambda x: x.amax(1), [(0, 3)])   # nothing reduced over an empty axis: fine
  check(lambda x: x.any(), lambda x: x.any(), [(0,)], dtype="bool")
  check(lambda x: x.all(), lambda x: x.all(), [(0,)], dtype="bool")
  check(lambda x: x.softmax(0), lambda x: x.softmax(0), [(0, 3)])
  for name in ("max", "min"):
    with pytest.raises(RuntimeError, match=f"{name}.*empty"): getattr(Tensor.zeros(0, 3), name)()
    with pytest.raises(RuntimeError, match=f"{name}.*empty"): getattr(Tensor.zeros(2, 0), name)(1)
  for name in ("argmax", "argmin"):
    with pytest.raises(RuntimeError, match=f"{name}.*empty"): getattr(Tensor.zeros(0), name)()

def test_reduction_axes_errors():
  for name in ("sum", "prod", "max", "min", "mean", "var", "std", "argmax", "argmin", "any", "all", "logsumexp",
               "cumsum", "cummax", "logcumsumexp", "softmax", "log_softmax", "var_mean", "std_mean", "cumprod"):
    with pytest.raises(IndexError, match=rf"{name}.*axis 3.*\(2, 3\)"): getattr(Tensor.ones(2, 3), name)(3)
  with pytest.raises(IndexError, match="sum"): Tensor.ones(2, 3).sum((0, -3))

def test_reduce_tuple_and_negative_axes():
  for name in ("sum", "mean", "max", "min", "prod", "logsumexp", "any", "all"):
    tfn = {"max": lambda x, d, k: x.amax(d, k), "min": lambda x, d, k: x.amin(d, k),
           "prod": lambda x, d, k: x.prod(d[1], k).prod(d[0], k)}.get(name,
                                                                     lambda x, d, k: getattr(x, name)(d, keepdim=k))
    for dims, keepdim in (((0, -1), True), ((-3, 1), False)):
      dims_sorted = tuple(sorted(d % 3 for d in dims))
      kw = {"dtype": "bool"} if name in ("any", "all") else {"low": 0.5, "high": 1.5}
      check(lambda x: getattr(x, name)(dims, keepdim), lambda x: tfn(x, dims_sorted, keepdim), [(2, 3, 2)], **kw)

def test_softmax_dtype_and_stability():
  check(lambda x: x.softmax(1, dtype="float32"), lambda x: x.softmax(1, dtype=torch.float32), [(2, 3)], dtype="float16")
  check(lambda x: x.log_softmax(0, dtype=dtypes.float32), lambda x: x.log_softmax(0, dtype=torch.float32), [(2, 3)],
        dtype="float16")
  big = np.array([[1e4, -1e4, 0.0], [88.0, 89.0, 90.0], [-np.inf, 0.0, 1.0]], np.float32)
  for name in ("softmax", "log_softmax"):
    check(lambda x: getattr(x, name)(1), lambda x: getattr(x, name)(1), [big], grad=name == "softmax")
  check(lambda x: x.logsumexp((0, 1), keepdim=True), lambda x: x.logsumexp((0, 1), keepdim=True), [big[:2]])

# ---------------------------------------------------------------------------------------------------------------------
# cumulative ops

CUMULATIVE = [
  ("cumsum", lambda x, a: x.cumsum(a), lambda x, a: x.cumsum(a)),
  ("cumprod", lambda x, a: x.cumprod(a), lambda x, a: x.cumprod(a)),
  ("cummax", lambda x, a: x.cummax(a), lambda x, a: x.cummax(a).values),
  ("logcumsumexp", lambda x, a: x.logcumsumexp(a), lambda x, a: x.logcumsumexp(a))]
CUM_IDS = [c[0] for c in CUMULATIVE]

@pytest.mark.parametrize("shape, axis", [((3, 4), 1), ((3, 4), 0), ((2, 3, 2), -2), ((5,), 0), ((1,), 0), ((), 0),
                                         ((0, 3), 0), ((2, 0), 1)], ids=str)
def test_cumulative(shape, axis):
  check_stacked(CUM_IDS, [lambda x, fn=c[1]: fn(x, axis) for c in CUMULATIVE],
          [lambda x, fn=c[2]: fn(x, axis) for c in CUMULATIVE], [make_input((4, *shape), "float32",
                                                                              np.random.default_rng(0), 0.5, 1.5)])

def test_cumulative_default_axes_and_noncontiguous():
  check(lambda x: x.cumsum(), lambda x: x.cumsum(0), [(3, 2)])
  check(lambda x: x.cummax(), lambda x: x.cummax(0).values, [(3, 2)])
  check(lambda x: x.logcumsumexp(), lambda x: x.logcumsumexp(0), [(3, 2)])
  check_stacked(CUM_IDS, [lambda x, fn=c[1]: fn(x.T.flip(1), 1) for c in CUMULATIVE],
          [lambda x, fn=c[2]: fn(x.T.flip(1), 1) for c in CUMULATIVE], [make_input((4, 5, 3), "float32",
                                                                                   np.random.default_rng(1), 0.5, 1.5)])

@pytest.mark.parametrize("n", [129, 300])
def test_cumulative_blocked(n):
  # past 2 * 64 elements the scan runs in blocks; 300 has a partial last block
  x = np.random.default_rng(n).uniform(0.97, 1.03, (4, 2, n)).astype(np.float32)
  x[1, :, 70] = 0.0       # cumprod gradients with zeros
  x[1, 1, 200 % n] = 0.0
  x[2] *= np.linspace(1, 5, n, dtype=np.float32)   # an increasing cummax that crosses blocks
  check_stacked(CUM_IDS, [lambda x, fn=c[1]: fn(x, -1) for c in CUMULATIVE],
          [lambda x, fn=c[2]: fn(x, -1) for c in CUMULATIVE], [x], atol=1e-4, rtol=1e-4)

def test_cumprod_zeros_gradient():
  x = np.array([[2.0, 0.0, 3.0, 0.0, 4.0], [0.5, 1.5, 0.0, 2.0, -1.0], [1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
  check(lambda x: x.cumprod(1), lambda x: x.cumprod(1), [x])

def test_cumulative_dtypes():
  for dtype in ("int32", "bool", "int8"):
    x = make_input((3, 4), dtype, np.random.default_rng(0), -3, 4)
    want = dtypes.bool if dtype == "bool" else dtypes.int8 if dtype == "int8" else dtypes.int32
    assert Tensor(x).cumsum(1).dtype == dtypes.int32 and Tensor(x).cummax(1).dtype == want   # torch cumsum: int64
    assert_close(Tensor(x).cumsum(1).numpy(), torch.tensor(x).cumsum(1).numpy(), f"cumsum {dtype}")
    assert_close(Tensor(x).cumprod(1).numpy(), torch.tensor(x).cumprod(1).numpy(), f"cumprod {dtype}")
    assert_close(Tensor(x).cummax(1).numpy(), torch.tensor(x).cummax(1).values.numpy(), f"cummax {dtype}")
  check(lambda x: x.logcumsumexp(1), lambda x: x.float().logcumsumexp(1), [(2, 3)], dtype="int32")
  check_stacked(CUM_IDS, [lambda x, fn=c[1]: fn(x, 1) for c in CUMULATIVE], [lambda x, fn=c[2]: fn(x, 1) for c in CUMULATIVE],
          [make_input((4, 2, 5), "float16", np.random.default_rng(0), 0.5, 1.5)], dtype="float16")

def test_cumulative_special_values():
  x = np.array([[1.0, np.nan, 3.0, 0.0], [-np.inf, -np.inf, 2.0, -np.inf], [1000.0, -1000.0, 1000.0, np.inf],
                [-5.0, -1e30, 5.0, 4.0]], np.float32)
  check_stacked(CUM_IDS, [lambda x, fn=c[1]: fn(x, 0) for c in CUMULATIVE], [lambda x, fn=c[2]: fn(x, 0) for c in CUMULATIVE],
          [np.stack([x.T] * 4)], grad=False)
  check(lambda x: x.logcumsumexp(0), lambda x: x.logcumsumexp(0), [np.array([1000.0, 1001.0, -50.0], np.float32)])

@pytest.mark.parametrize("shape, axis", [((3, 300), 1), ((260, 2), 0), ((2, 5, 150), -2)])
def test_cumsum_gradient_is_the_reversed_running_sum(shape, axis):
  # blocked scans (more than 128 elements); the backward is a CUSTOM_BACKWARD rule, not autograd through the blocks
  check(lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), [shape], atol=1e-4)
  check(lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), [shape], dtype="float16", atol=0.5, rtol=2e-2)

def test_cumsum_large_is_fast_and_right():
  x = np.random.default_rng(0).standard_normal((2, 10000)).astype(np.float32)
  start = time.perf_counter()
  got = Tensor(x).cumsum(1).numpy()
  assert time.perf_counter() - start < 30
  assert_close(got, np.cumsum(x.astype(np.float64), 1), "cumsum of 10000", atol=2e-3, rtol=1e-4)
  got = Tensor(x[:1]).logcumsumexp(1).numpy()
  assert_close(got, torch.logcumsumexp(torch.tensor(x[:1], dtype=torch.float64), 1).numpy(), "logcumsumexp", 1e-4, 1e-5)

def test_cumulative_errors():
  for name in ("cumsum", "cumprod", "cummax", "logcumsumexp"):
    with pytest.raises(IndexError, match=rf"{name}.*axis -3.*\(2, 3\)"): getattr(Tensor.ones(2, 3), name)(-3)
  with pytest.raises(IndexError, match="cumsum"): Tensor(2.0).cumsum(1)

# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON device (an emulator): a few tiny cases

def test_python_device():
  table = [u for u in UNARY if u[0] in ("asin", "atan", "erf", "sinh", "asinh", "sigmoid", "softplus", "tanh", "elu")]
  rows = np.stack([np.array([-0.5, 0.0, 0.7, -100.0 if u[0] not in ("asin",) else -0.9], np.float32) for u in table])
  check_stacked([u[0] for u in table], [u[1] for u in table], [u[2] for u in table], [rows], device="PYTHON")
  a, b = DIVIDENDS[:10], DIVISORS[:10]
  both = lambda a, b: (a // b) + (a % b) * 1000  # noqa: E731
  check(both, both, [a, b], grad=False, device="PYTHON")
  check(lambda x: x.cumprod(0) + x.cumsum(0), lambda x: x.cumprod(0) + x.cumsum(0),
        [np.array([2.0, 0.0, 3.0], np.float32)], device="PYTHON")
  check(lambda x: x.argmax(0), lambda x: x.argmax(0), [np.array([1.0, np.nan, 3.0], np.float32)], device="PYTHON",
        check_dtype=False)
  check(lambda a, b: a.copysign(b), lambda a, b: torch.copysign(a, b),
        [np.array([1.0, 2.0, -3.0], np.float32), np.array([-0.0, 1.0, np.nan], np.float32)], device="PYTHON")

def test_nan_constants_keep_their_sign():
  # a NaN constant is a node of its own bits (float.hex() gives "nan" for either sign) and the C renderer writes its
  # sign: -nan and nan built in either order come out as themselves
  for order in ((-1, 1), (1, -1)):
    for sign in order:
      value = math.copysign(math.nan, sign)
      got = Tensor.full((3,), value).contiguous().numpy()
      assert np.isnan(got).all() and np.signbit(got).all() == (sign < 0), (order, sign, got.view(np.uint32))
