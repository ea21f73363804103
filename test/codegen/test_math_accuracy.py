"""Tensor-level math against its error bounds (docs/transcendental.md), in ulp of a higher-precision reference.

float32 results are compared with float64 NumPy, float64 results with NumPy's long double (80-bit on x86), over
bit-pattern sweeps of the whole range plus the hard cases: near the zeros of sin/cos/tan, exp's overflow and
underflow, subnormals, log near 1, the tails of tanh/sigmoid/erf. CPU runs software math (kiln/codegen/
transcendental.py); PYTHON and LLVM use native exp2/log2/sin under the same Tensor formulas.
"""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
from kiln import Tensor, dtypes

LONG_DOUBLE_IS_WIDER = np.finfo(np.longdouble).nmant >= 63

def bit_sweep(dtype, n: int, seed: int = 0) -> np.ndarray:
  """n finite values spread over the whole range of `dtype` by bit pattern (every exponent, both signs)."""
  if dtype == np.float32: bits = np.linspace(0, 2 ** 32 - 1, n).astype(np.uint64).astype(np.uint32)
  else: bits = np.random.default_rng(seed).integers(0, 2 ** 64, n, dtype=np.uint64)
  values = bits.view(dtype)
  return values[np.isfinite(values)]

def around(points, dtype, neighbours: int = 4) -> np.ndarray:
  """`points` rounded to `dtype` and their nearest `neighbours` representable values on each side."""
  values = [np.asarray(points, dtype)]
  for direction in (np.inf, -np.inf):
    current = values[0]
    for _ in range(neighbours):
      current = np.nextafter(current, np.array(direction, dtype))
      values.append(current)
  return np.concatenate(values)

def hard_cases(name: str, dtype) -> np.ndarray:
  f32 = dtype == np.float32
  tiny = np.array([1, 2, 3, 1000, 0x7FFFFF, 0x800000], np.uint32 if f32 else np.uint64).view(dtype)
  specials = np.concatenate([tiny, -tiny, np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)])
  multiples = np.arange(-6400, 6400) * (math.pi / 2)   # up to 1e4: the zeros of sin and cos, and tan's poles
  huge = np.array([1e22, 6381956970095103 * 2.0 ** 797 if not f32 else 3e38, 16367173 * 2.0 ** 72], np.float64)
  cases = {
    "exp": [np.linspace(80, 89, 4000), np.linspace(-104, -80, 4000), np.linspace(-1, 1, 1000)] if f32 else
           [np.linspace(700, 710, 4000), np.linspace(-746, -700, 4000)],
    "exp2": [np.linspace(120, 128.5, 2000), np.linspace(-151, -120, 2000)] if f32 else [np.linspace(1016, 1024.5, 2000)],
    "log": [np.linspace(0.9, 1.1, 4000), around([1.0], dtype, 64)], "sin": [around(multiples, dtype), huge],
    "sigmoid": [np.linspace(-110, 90, 8000) if f32 else np.linspace(-750, 40, 8000)],
    "tanh": [np.linspace(-20, 20, 8000)], "erf": [np.linspace(-6, 6, 8000)],
  }
  cases["log2"], cases["cos"], cases["tan"] = cases["log"], cases["sin"], cases["sin"]
  return np.concatenate([np.concatenate(cases[name]).astype(dtype), specials])

def erf_reference(x: np.ndarray) -> np.ndarray:
  return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))

REFERENCE = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sin": np.sin, "cos": np.cos,
             "tan": np.tan, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "erf": erf_reference}

def ulp_error(got: np.ndarray, exact: np.ndarray, dtype) -> np.ndarray:
  """|got - exact| in ulps of `dtype` at the exact value (0 where both are the same NaN or infinity)."""
  finfo = np.finfo(dtype)
  with np.errstate(all="ignore"):
    exact_rounded = exact.astype(dtype)
    spacing = np.spacing(np.abs(exact_rounded)).astype(exact.dtype)
    spacing = np.where(np.isinf(exact_rounded), np.spacing(finfo.max).astype(exact.dtype), spacing)
    spacing = np.maximum(spacing, finfo.smallest_subnormal)
    same = (np.isnan(got) & np.isnan(exact)) | (got == exact_rounded)
    return np.where(same, 0.0, np.abs(got.astype(exact.dtype) - exact) / spacing).astype(np.float64)

def check(name: str, device: str, dtype, count: int, bound: float, zero_tolerance: float = 0.0) -> None:
  xs = np.concatenate([bit_sweep(dtype, count), hard_cases(name, dtype)])
  got = getattr(Tensor(xs, device=device), name)().numpy()
  assert got.dtype == dtype
  with np.errstate(all="ignore"):
    exact = REFERENCE[name](xs.astype(np.float64 if dtype == np.float32 or name == "erf" else np.longdouble))
  error = ulp_error(got, exact, dtype)
  if zero_tolerance:   # sin/cos near their zeros: an absolute bound will do
    with np.errstate(all="ignore"):
      near_zero = (np.abs(exact) < 1e-3) & (np.abs(got.astype(exact.dtype) - exact) <= zero_tolerance)
    error = np.where(near_zero, 0.0, error)
  worst = int(np.argmax(error))
  assert error[worst] <= bound, (f"{name} {np.dtype(dtype).name} on {device}: {error[worst]:.3g} ulp at x={xs[worst]!r}"
                                 f" (got {got[worst]!r}, exact {float(exact[worst])!r}), {xs.size} points")

FLOAT32_BOUNDS = {"exp": 2, "exp2": 2, "log": 2, "log2": 2, "sin": 2, "cos": 2, "tan": 2, "sigmoid": 2, "tanh": 2,
                  "erf": 2}

@pytest.mark.parametrize("name", list(FLOAT32_BOUNDS))
def test_float32_cpu(name):
  check(name, "CPU", np.float32, 1 << 16, FLOAT32_BOUNDS[name], 1e-7 if name in ("sin", "cos") else 0.0)

@pytest.mark.parametrize("device", ["PYTHON", "LLVM"])
@pytest.mark.parametrize("name", ["exp", "log", "sin", "cos", "tan", "sigmoid", "tanh", "erf"])
def test_float32_native_math(device, name):
  if device == "LLVM": pytest.importorskip("llvmlite")
  check(name, device, np.float32, 1 << 10 if device == "PYTHON" else 1 << 13, 2,
        1e-7 if name in ("sin", "cos") else 0.0)

FLOAT64_BOUNDS = {"exp": 2, "exp2": 2, "log": 2, "log2": 2, "sin": 2, "cos": 2, "tan": 2, "sigmoid": 2, "tanh": 2}

@pytest.mark.skipif(not LONG_DOUBLE_IS_WIDER, reason="needs an 80-bit long double for the float64 reference")
@pytest.mark.parametrize("name", list(FLOAT64_BOUNDS))
def test_float64_cpu(name):
  check(name, "CPU", np.float64, 1 << 14, FLOAT64_BOUNDS[name], 1e-16 if name in ("sin", "cos") else 0.0)

def test_float64_erf():
  # the reference must be wider than float64: math.erf is itself float64
  mpmath = pytest.importorskip("mpmath")
  xs = np.concatenate([bit_sweep(np.float64, 1 << 10), hard_cases("erf", np.float64),
                       np.random.default_rng(3).uniform(0.9, 1.2, 2000), [1.0000750018750475, 5.9, 5.93, 6.0, 6.1]])
  got = Tensor(xs).erf().numpy()
  exact = np.array([np.longdouble(mpmath.nstr(mpmath.erf(mpmath.mpf(float(x))), 25)) if not np.isnan(x) else np.nan
                    for x in xs], np.longdouble)
  error = ulp_error(got, exact, np.float64)
  worst = int(np.argmax(error))
  assert error[worst] <= 2, f"erf float64: {error[worst]:.3g} ulp at x={xs[worst]!r} (got {got[worst]!r})"

def test_float64_erf_gradient():
  xs = np.array([0.0, 0.3, -0.99, 1.0, 1.7, -3.2, 5.5, 8.0])
  t = Tensor(xs, requires_grad=True)
  t.erf().sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), 2 / np.sqrt(np.pi) * np.exp(-xs * xs), rtol=1e-13, atol=1e-300)

def test_half_exp_rounds_once():
  xs = np.linspace(-17, 11, 4001).astype(np.float16)
  got = Tensor(xs).exp().numpy()
  expected = np.exp(xs.astype(np.float64)).astype(np.float16)
  assert (got == expected).mean() > 0.999, f"exp float16: {(got != expected).sum()} of {xs.size} not rounded right"

DERIVATIVE = {"exp": np.exp, "cos": lambda x: -np.sin(x), "tan": lambda x: 1 / np.cos(x) ** 2,
              "sigmoid": lambda x: np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))) ** 2}

@pytest.mark.parametrize("name", list(DERIVATIVE))
def test_gradients(name):
  xs = np.array([0.0, 0.3, -2.0, 3.14159, 1e-30, 40.0, -90.0, 1.5707964, -20.0], np.float32)
  t = Tensor(xs, requires_grad=True)
  getattr(t, name)().sum().backward()
  with np.errstate(over="ignore"): expected = DERIVATIVE[name](xs.astype(np.float64))
  np.testing.assert_allclose(t.grad.numpy(), expected, rtol=2e-6, atol=1e-37, err_msg=f"{name} gradient at {xs}")

@pytest.mark.parametrize("kiln_dtype,torch_dtype", [(dtypes.int32, torch.int32), (dtypes.int64, torch.int64),
                                                     (dtypes.int8, torch.int8), (dtypes.uint8, torch.uint8)])
def test_integer_pow_wraps_like_torch(kiln_dtype, torch_dtype):
  bases = [3, 2, -5, 7, 0, 1, -1, 11] if torch_dtype != torch.uint8 else [3, 2, 5, 7, 0, 1, 255, 11]
  for exponent in (0, 1, 2, 5, 21, 41):
    got = (Tensor(bases, dtype=kiln_dtype) ** exponent).tolist()
    assert got == (torch.tensor(bases, dtype=torch_dtype) ** exponent).tolist(), f"{kiln_dtype} ** {exponent}"
  exponents = [21, 13, 3, 63, 1, 0, 7, 2] if torch_dtype == torch.uint8 else [21, -1, -3, 63, -2, 0, -7, 2]
  got = (Tensor(bases, dtype=kiln_dtype) ** Tensor(exponents, dtype=kiln_dtype)).tolist()
  expected = (torch.tensor(bases, dtype=torch_dtype) ** torch.tensor(exponents, dtype=torch_dtype)).tolist()
  assert got == expected, f"{kiln_dtype} tensor ** tensor: {got} != {expected}"

def test_round_keeps_the_sign_of_zero():
  xs = [-0.5, -0.3, -0.0, 0.0, 0.5, -1.5, -2.5, 2.5, -1e-30, 0.49999997]
  for kiln_dtype, torch_dtype in ((dtypes.float32, torch.float32), (dtypes.float64, torch.float64)):
    got = np.array(Tensor(xs, dtype=kiln_dtype).round().tolist())
    expected = torch.tensor(xs, dtype=torch_dtype).round().numpy()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected), err_msg=f"round {kiln_dtype}: sign of zero")

def test_float32_pow_native():
  rng = np.random.default_rng(5)
  base = np.abs(bit_sweep(np.float32, 1 << 12))
  exponent = rng.uniform(-3, 3, base.size).astype(np.float32)
  got = (Tensor(base) ** Tensor(exponent)).numpy()
  with np.errstate(all="ignore"): exact = np.power(base.astype(np.float64), exponent.astype(np.float64))
  error = ulp_error(got, exact, np.float32)
  assert error.max() <= 2, f"pow: {error.max():.3g} ulp at {base[np.argmax(error)]!r} ** {exponent[np.argmax(error)]!r}"

@pytest.mark.parametrize("fn", ["exp", "log", "sin", "cos", "sigmoid", "tanh", "erf", "sqrt", "rsqrt"])
@pytest.mark.parametrize("dtype, torch_dtype", [(dtypes.fp8e4m3, "float8_e4m3fn"), (dtypes.fp8e5m2, "float8_e5m2"),
                                                (dtypes.float16, "float16"), (dtypes.bfloat16, "bfloat16")])
def test_narrow_float_math_is_computed_in_float32_and_rounded_once(fn, dtype, torch_dtype):
  """fp8/half/bfloat16 math runs in float32 and rounds once, as PyTorch does (fp8 exp raised a KeyError)."""
  import torch
  values = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0], np.float32)
  got = getattr(Tensor(values).cast(dtype), fn)().float().numpy()
  rounded = torch.tensor(values).to(getattr(torch, torch_dtype)).float()
  want = getattr(torch, fn)(rounded).to(getattr(torch, torch_dtype)).float().numpy()
  np.testing.assert_array_equal(got, want)

HARD_COS_TAN_F64 = np.array([7.332904820674937e283, 1.5707963267948966, -64.4026, 3.0, 1e5, 1e-300, 0.0, 710.0,
                             4.71238898038469, 3.141592653589793 * 1e6], np.float64)

@pytest.mark.parametrize("device, transcendental", [("PYTHON", 1), ("CPU", 0)])
@pytest.mark.parametrize("fn", ["cos", "tan"])
def test_float64_cos_and_tan_off_software_math_are_within_one_ulp(device, transcendental, fn):
  """The PYTHON emulator and the C path with TRANSCENDENTAL=0 render kiln's float64 cos/tan forms as cos/tan
  themselves (renders_math_forms): dividing two rounded sines cost 2.2/3.1 ulp."""
  mpmath = pytest.importorskip("mpmath")
  from kiln import Context
  mpmath.mp.prec = 200
  with Context(TRANSCENDENTAL=transcendental):
    got = getattr(Tensor(HARD_COS_TAN_F64, device=device), fn)().numpy()
  for value, x in zip(got, HARD_COS_TAN_F64):
    want = float(getattr(mpmath, fn)(mpmath.mpf(float(x))))
    assert abs(value - want) <= np.spacing(abs(want)), (fn, device, x, value, want)
