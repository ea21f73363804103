"""MULACC: a float accumulation `acc + a*b` is one fused multiply-add (rounded once) on every device, bit for bit."""
import math, struct
from fractions import Fraction
import numpy as np
import pytest
from kiln import Tensor
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.codegen.linearizer import fuse_multiply_accumulate
from kiln.codegen.opt import optimize_kernel
from kiln.codegen.lowerer import lower_kernel
from kiln.engine.realize import render_lowered
from kernel_runs import last_kernel_item
from kiln.renderer.python import _fma, _fma32, _r32

DEVICES = ["CPU", "PYTHON", "LLVM"]

def _exact32(a: float, b: float, c: float) -> float:
  """a*b + c of float32 values, exactly, rounded once to float32 (numpy rounds a float64 that is exact here)."""
  exact = Fraction(a) * Fraction(b) + Fraction(c)
  lo = float(exact)   # the nearest double; rounding that to float32 can double-round, so decide with the exact value
  r = float(np.float32(lo))
  if Fraction(r) == exact: return r
  below, above = (r, float(np.nextafter(np.float32(r), np.float32(np.inf)))) if Fraction(r) < exact else \
    (float(np.nextafter(np.float32(r), np.float32(-np.inf))), r)
  mid = (Fraction(below) + Fraction(above)) / 2
  if exact != mid: return below if exact < mid else above
  return below if struct.unpack("<I", struct.pack("<f", below))[0] % 2 == 0 else above

def test_fma32_is_one_rounding():
  rng = np.random.default_rng(0)
  a, b, c = (rng.standard_normal(3000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, 3000)
             for _ in range(3))
  for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
    assert _fma32(x, y, z) == _exact32(x, y, z), (x, y, z)

def test_fma32_halfway_cases_follow_the_exact_value():
  one_ulp = 2.0 ** -23
  # a*b + c lands exactly halfway between two float32 values in float64, and the part float64 lost decides
  for c_sign in (1, -1):
    x, y = 1 + 2.0 ** -12, 1 + 2.0 ** -12   # x*y = 1 + 2^-11 + 2^-24: halfway between float32 neighbours
    for c in (c_sign * 2.0 ** -60, c_sign * 2.0 ** -80, 0.0):
      assert _fma32(x, y, c) == _exact32(x, y, c)
  assert _fma32(1 + one_ulp, 1 - one_ulp, -1.0) == -(2.0 ** -46)   # unfused: 0

def test_fma32_special_values():
  inf = math.inf
  assert _fma32(inf, 0.0, 1.0) != _fma32(inf, 0.0, 1.0)   # NaN
  assert _fma32(inf, 2.0, 1.0) == inf and _fma32(3e38, 10.0, 0.0) == inf
  assert _fma32(1e-30, 1e-30, 0.0) == _r32(1e-60) == 0.0
  assert _fma32(2.0 ** -100, 2.0 ** -49, 0.0) == 2.0 ** -149   # the smallest subnormal, exactly

def test_fma64_is_exact_then_rounded():
  rng = np.random.default_rng(1)
  for x, y, z in rng.standard_normal((500, 3)).tolist():
    assert _fma(x, y, z) == float(Fraction(x) * Fraction(y) + Fraction(z))
  assert _fma(1 + 2.0 ** -52, 1 - 2.0 ** -52, -1.0) == -(2.0 ** -104)
  assert math.isnan(_fma(math.inf, 0.0, 1.0)) and _fma(1e308, 10.0, -1e308) == math.inf

@pytest.mark.parametrize("device", DEVICES)
def test_a_dot_product_is_fused(device):
  # 1 + 2^-12 squared is 1 + 2^-11 + 2^-24: fused, the 2^-24 survives the cancellation; unfused it is rounded away
  a = Tensor([[-(1 + 2 ** -11), 1 + 2 ** -12]], device=device)
  b = Tensor([[1.0], [1 + 2 ** -12]], device=device)
  assert (a @ b).numpy().item() == 2 ** -24

@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("shape", [(5, 7, 3), (33, 47, 65), (64, 64, 64)])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
def test_matmul_bits_match_the_python_reference(device, shape, dtype):
  m, k, n = shape
  rng = np.random.default_rng(m * k * n)
  x, y = rng.standard_normal((m, k)), rng.standard_normal((k, n))
  ref = (Tensor(x, device="PYTHON", dtype=dtype) @ Tensor(y, device="PYTHON", dtype=dtype)).numpy()
  out = (Tensor(x, device=device, dtype=dtype) @ Tensor(y, device=device, dtype=dtype)).numpy()
  np.testing.assert_array_equal(out, ref)
  np.testing.assert_allclose(out, x @ y, rtol=1e-4 if dtype == dtypes.float32 else 1e-12, atol=1e-4)

def _linear_uops(t: Tensor) -> list[UOp]:
  item = last_kernel_item(t)
  return render_lowered("CPU", "mulacc_test", optimize_kernel(lower_kernel(item.ast)))[1]

def test_a_matmul_inner_loop_is_fused_multiply_adds():
  uops = _linear_uops(Tensor.rand(64, 64) @ Tensor.rand(64, 64))
  fused = [u for u in uops if u.op is Ops.MULACC]
  assert fused and all(u.src[2].op is Ops.DEFINE_ACC for u in fused)
  assert not any(u.op is Ops.ADD and u.src[0].op is Ops.DEFINE_ACC and u.src[1].op is Ops.MUL for u in uops)

@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.float16, dtypes.bfloat16])
def test_integer_and_small_float_products_are_not_fused(dtype):
  # ints are exact either way; a half product is rounded to half before the float32 accumulator adds it
  a = Tensor.ones(8, 32, dtype=dtype)
  assert not any(u.op is Ops.MULACC for u in _linear_uops(a @ a.T))

def test_fusing_keeps_a_product_that_other_code_reads():
  f32 = dtypes.float32
  x, y = UOp.const(f32, 2.0), UOp.const(f32, 3.0)
  acc = UOp(Ops.DEFINE_ACC, f32, (UOp.const(f32, 0.0),), 0)
  product = UOp(Ops.MUL, f32, (x, y))
  update = UOp(Ops.ADD, f32, (acc, product))
  assign = UOp(Ops.ASSIGN, f32, (acc, update))
  other = UOp(Ops.SQRT, f32, (product,))
  uops = [acc, product, update, assign, other]
  assert fuse_multiply_accumulate(uops, [update]) == uops   # the product is read twice: left as it is
  fused = fuse_multiply_accumulate(uops[:4], [update])
  assert [u.op for u in fused] == [Ops.DEFINE_ACC, Ops.MULACC, Ops.ASSIGN]
  assert fused[1].src == (x, y, acc) and fused[2].src == (acc, fused[1])
