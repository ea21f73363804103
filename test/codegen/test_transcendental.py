"""Software exp2/log2/sin (kiln/codegen/transcendental.py): error bounds on dense sweeps, special values, end to end.

The rewritten graphs are evaluated on NumPy arrays (uop_numpy_eval.py), so millions of points take seconds. The float32
reference is the C library (kiln's CPU device with native math, i.e. glibc's exp2f/log2f/sinf) and the exact value
(float64 NumPy); float64 is compared with NumPy. `python test/codegen/test_transcendental.py --exhaustive` sweeps
every float32 bit pattern (minutes; prints the table of docs/transcendental.md).
"""
from __future__ import annotations
import os, sys
import numpy as np
import pytest
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from uop_numpy_eval import evaluate  # noqa: E402
from kiln import Tensor  # noqa: E402
from kiln.dtype import dtypes, DType  # noqa: E402
from kiln.helpers import Context  # noqa: E402
from kiln.uop.ops import UOp, Ops, toposort  # noqa: E402
from kiln.uop.pattern import graph_rewrite  # noqa: E402
from kiln.codegen.transcendental import software_math  # noqa: E402

NP_REFERENCE = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}
TENSOR_METHOD = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}

def software(op: Ops, dtype: DType, xs: np.ndarray) -> np.ndarray:
  """op(xs) computed by the software rewrite of `op`, evaluated on NumPy."""
  leaf = UOp.variable("x", 0, 0, dtype)
  graph = graph_rewrite(UOp(op, dtype, (leaf,)), software_math)
  assert not any(u.op in NP_REFERENCE for u in toposort([graph])), f"{op} left in the rewritten graph"
  return evaluate(graph, {leaf: xs})

def c_library(op: Ops, xs: np.ndarray) -> np.ndarray:
  """op(xs) in float32 on the CPU device with native math (the C library)."""
  with Context(TRANSCENDENTAL=0):
    return getattr(Tensor(xs, device="CPU"), TENSOR_METHOD[op])().numpy()

def ulp_vs_exact32(y: np.ndarray, exact: np.ndarray) -> np.ndarray:
  """|y - exact| in float32 ulps at the exact value (0 where both are the same NaN/inf)."""
  with np.errstate(all="ignore"):
    y = y.astype(np.float64)
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    ulp = np.maximum(np.where(np.abs(exact) >= 2.0 ** 128, 2.0 ** 104, spacing), 2.0 ** -149)
    same = (np.isnan(y) & np.isnan(exact)) | (y == exact) | (y == exact.astype(np.float32))
    return np.where(same, 0.0, np.abs(y - exact) / ulp)

def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """How many representable values lie between a and b (same float dtype); 0 for two NaNs."""
  itype = {4: np.int32, 8: np.int64}[a.dtype.itemsize]
  def ordered(v):
    bits = v.view(itype).astype(np.int64)
    return np.where(bits < 0, np.int64(np.iinfo(itype).min) - bits, bits)
  both_nan = np.isnan(a) & np.isnan(b)
  return np.where(both_nan, 0, np.abs(ordered(a) - ordered(b)))

def random_float32(n: int, seed: int) -> np.ndarray:
  """n random float32 bit patterns (every exponent equally likely), NaNs included."""
  return np.random.default_rng(seed).integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)

def specials32() -> np.ndarray:
  tiny = np.array([1, 2, 3, 0x7FFFFF, 0x800000, 0x800001], dtype=np.uint32).view(np.float32)
  values = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5, 127.0, 127.99999, 128.0, 128.00002, -126.0,
            -149.0, -149.5, -150.0, -150.00002, -151.0, -1000.0, 3.4028235e38, -3.4028235e38, 1.5707964, 3.1415927,
            6.2831855, 1e-30, 16367173 * 2.0 ** 72, 1e20, -1e37]
  return np.concatenate([np.array(values, np.float32), tiny, -tiny])

def sweep32(op: Ops) -> np.ndarray:
  dense = {Ops.EXP2: np.linspace(-152, 130, 1 << 18, dtype=np.float32),
           Ops.LOG2: np.abs(random_float32(1 << 18, 1)),
           Ops.SIN: np.linspace(-100, 100, 1 << 16, dtype=np.float32)}[op]
  return np.concatenate([dense, random_float32(1 << 16, 2), specials32()])

@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN], ids=lambda op: op.name)
def test_float32_within_2_ulp_of_the_c_library(op):
  xs = sweep32(op)
  ours, libm = software(op, dtypes.float32, xs), c_library(op, xs)
  with np.errstate(all="ignore"): exact = NP_REFERENCE[op](xs.astype(np.float64))
  vs_libm, vs_exact = ulp_distance(ours, libm), ulp_vs_exact32(ours, exact)
  worst = int(np.argmax(vs_libm))
  assert vs_libm.max() <= 2, f"{op.name}({xs[worst]!r}) = {ours[worst]!r}, C library {libm[worst]!r}: {vs_libm.max()} ulp"
  worst = int(np.argmax(vs_exact))
  assert vs_exact.max() < 1.5, f"{op.name}({xs[worst]!r}) = {ours[worst]!r}, exact {exact[worst]!r}: {vs_exact.max()} ulp"

def test_float32_special_values():
  xs = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 128.0, -151.0, 1e-45, -1e-45], np.float32)
  exp2, log2, sin = (software(op, dtypes.float32, xs) for op in (Ops.EXP2, Ops.LOG2, Ops.SIN))
  np.testing.assert_array_equal(exp2[:4], [1.0, 1.0, np.inf, 0.0])
  assert np.isnan(exp2[4]) and exp2[6] == np.inf and exp2[7] == 0.0 and exp2[8] == 1.0
  np.testing.assert_array_equal(log2[[0, 1, 2]], [-np.inf, -np.inf, np.inf])
  assert np.isnan(log2[[3, 4, 5, 9]]).all() and log2[8] == -149.0
  assert sin[0] == 0 and not np.signbit(sin[0]) and sin[1] == 0 and np.signbit(sin[1])
  assert np.isnan(sin[[2, 3, 4]]).all() and sin[8] == xs[8] and sin[9] == xs[9]

def test_float16_exhaustive():
  xs = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
  for op in (Ops.EXP2, Ops.LOG2, Ops.SIN):
    ours = software(op, dtypes.float16, xs)
    with np.errstate(all="ignore"): expected = NP_REFERENCE[op](xs.astype(np.float64)).astype(np.float16)
    distance = ulp_distance16(ours, expected)
    assert distance.max() <= 1, f"{op.name} float16: {distance.max()} ulp at {xs[np.argmax(distance)]!r}"

def ulp_distance16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  bits_a, bits_b = a.view(np.int16).astype(np.int32), b.view(np.int16).astype(np.int32)
  oa, ob = np.where(bits_a < 0, -32768 - bits_a, bits_a), np.where(bits_b < 0, -32768 - bits_b, bits_b)
  return np.where(np.isnan(a) & np.isnan(b), 0, np.abs(oa - ob))

def sweep64(op: Ops) -> np.ndarray:
  rng = np.random.default_rng(3)
  random_bits = rng.integers(0, 2 ** 63, 1 << 15, dtype=np.int64).view(np.float64)
  dense = {Ops.EXP2: np.concatenate([np.linspace(-1080, 1030, 1 << 16), rng.uniform(-1, 1, 1 << 15)]),
           Ops.LOG2: np.concatenate([np.abs(random_bits), rng.uniform(0.5, 2.0, 1 << 16)]),
           Ops.SIN: np.concatenate([rng.uniform(-10, 10, 1 << 15), rng.uniform(-1e6, 1e6, 1 << 14),
                                    rng.uniform(-1e9, 1e9, 1 << 14)])}[op]
  specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.2250738585072014e-308, 1e308, -1e308, 1024.0,
              -1074.0, -1075.0, -1076.0, 1023.9999999, 6381956970095103 * 2.0 ** 797, 1.5707963267948966, 823549.6588]
  return np.concatenate([dense, random_bits, -random_bits, np.array(specials)])

@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN], ids=lambda op: op.name)
def test_float64_within_2_ulp_of_numpy(op):
  xs = sweep64(op)
  ours = software(op, dtypes.float64, xs)
  with np.errstate(all="ignore"): expected = NP_REFERENCE[op](xs)
  distance = ulp_distance(ours, expected)
  worst = int(np.argmax(distance))
  assert distance.max() <= 2, f"{op.name}({xs[worst]!r}) = {ours[worst]!r}, NumPy {expected[worst]!r}"

def test_nothing_changes_when_native():
  node = UOp(Ops.SQRT, dtypes.float32, (UOp.variable("x", 0, 0, dtypes.float32),))
  assert graph_rewrite(node, software_math) is node

# ---- end to end on the CPU device with TRANSCENDENTAL=2 ----

END_TO_END = {
  "exp": (lambda t: t.exp(), -80, 80), "log": (lambda t: t.log(), 1e-30, 1e30), "sin": (lambda t: t.sin(), -1e4, 1e4),
  "cos": (lambda t: t.cos(), -1e4, 1e4), "tan": (lambda t: t.tan(), -1.0, 1.0),
  "sigmoid": (lambda t: t.sigmoid(), -50, 50), "pow": (lambda t: t.pow(1.7), 0, 1e3),
}

@pytest.mark.parametrize("name", list(END_TO_END))
def test_end_to_end_cpu_software_math(name):
  import torch
  fn, lo, hi = END_TO_END[name]
  xs = np.random.default_rng(4).uniform(lo, hi, 1000).astype(np.float32)
  from kiln.engine.realize import _runner_cache
  with Context(TRANSCENDENTAL=2):
    got = fn(Tensor(xs, device="CPU")).numpy()
    sources = [r.source for key, r in _runner_cache.items() if key[2] == 2]   # runner_key: (.., TRANSCENDENTAL, ..)
  assert sources, "no kernel was compiled with TRANSCENDENTAL=2"
  with Context(TRANSCENDENTAL=0): native = fn(Tensor(xs, device="CPU")).numpy()
  assert not any(f"__builtin_{f}f(" in s for s in sources for f in ("exp2", "log2", "sin")), "native math left"
  # kiln's own formulas (exp = exp2(x*log2(e)), ...) round their inputs: compare closely with native kiln, loosely
  # with PyTorch
  np.testing.assert_allclose(got, native, rtol=5e-7, atol=3e-7, err_msg=f"{name} vs native math: shape {xs.shape}")
  np.testing.assert_allclose(got, fn(torch.tensor(xs)).numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{name} vs torch")

# ---- exhaustive float32 sweep (not a pytest test: minutes on many cores) ----

def _exhaustive_chunk(args) -> dict:
  op_name, start, count, stride = args
  op = Ops[op_name]
  xs = (np.arange(start, start + count * stride, stride, dtype=np.uint64)).astype(np.uint32).view(np.float32)
  ours = software(op, dtypes.float32, xs)
  with np.errstate(all="ignore"): exact = NP_REFERENCE[op](xs.astype(np.float64))
  vs_exact = ulp_vs_exact32(ours, exact)
  i = int(np.argmax(vs_exact))
  result = {"exact": float(vs_exact[i]), "exact_at": float(xs[i])}
  if os.environ.get("LIBM", "1") == "1":
    vs_libm = ulp_distance(ours, c_library(op, xs))
    result.update(libm=int(vs_libm.max()), libm_at=float(xs[int(np.argmax(vs_libm))]))
  return result

def exhaustive(ops=("EXP2", "LOG2", "SIN"), chunk: int = 1 << 21, workers: int | None = None, stride: int = 1) -> None:
  """Every `stride`-th float32 bit pattern through each op; prints the worst error vs the exact value and vs the C
  library."""
  from multiprocessing import Pool
  with Pool(workers or os.cpu_count()) as pool:
    for op_name in ops:
      results = pool.map(_exhaustive_chunk, [(op_name, s, chunk, stride) for s in range(0, 1 << 32, chunk * stride)])
      worst = max(results, key=lambda r: r["exact"])
      line = f"| {op_name.lower()} | {worst['exact']:.3f} (at {worst['exact_at']!r})"
      if "libm" in results[0]:
        worst_libm = max(results, key=lambda r: r["libm"])
        line += f" | {worst_libm['libm']} (at {worst_libm['libm_at']!r})"
      print(line + " |", flush=True)

if __name__ == "__main__":
  if "--exhaustive" in sys.argv:
    ops = [a for a in sys.argv[1:] if a.upper() in ("EXP2", "LOG2", "SIN")] or ["EXP2", "LOG2", "SIN"]
    stride = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--stride=")), "1"))
    exhaustive([op.upper() for op in ops], stride=stride)
  else: print(__doc__)

def test_template_rewrite_equals_graph_rewrite():
  # apply_software_math builds each transcendental from a template made once per (op, dtype), bottom-up; the graph
  # must be the very one the rule-by-rule rewrite gives, nested calls and float16 (computed in float32) included
  from kiln.codegen.transcendental import _software_rewrite
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  rng = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 16),), 0)
  x = UOp(Ops.LOAD, dtypes.float32, (buf, rng))
  half = x.cast(dtypes.float16)
  values = [UOp(Ops.EXP2, dtypes.float32, (UOp(Ops.LOG2, dtypes.float32, (x,)),)),
            UOp(Ops.SIN, dtypes.float32, (x * 2.0,)) + UOp(Ops.EXP2, dtypes.float32, (x,)),
            UOp(Ops.EXP2, dtypes.float16, (half,)).cast(dtypes.float32),
            UOp(Ops.SIN, dtypes.float64, (x.cast(dtypes.float64),)).cast(dtypes.float32)]
  stores = [UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), i + 1), rng, v))
            for i, v in enumerate(values)]
  sink = UOp(Ops.SINK, dtypes.void, tuple(stores))
  got = _software_rewrite(sink, toposort([sink]))
  assert got is not None
  want = graph_rewrite(sink, software_math)
  assert got[0] is want
  assert not any(u.op in NP_REFERENCE for u in toposort([got[0]]))
  assert {u.op for u in toposort([want])} <= {u.op for u in toposort([sink])} | got[1]

def test_sin_of_widened_float32_is_float64_accurate():
  # SIN(float64(x)) for a float32 x: reduced as float32, evaluated and returned in float64 (cos/tan divide two)
  from kiln.codegen.transcendental import _software_rewrite
  xs = np.concatenate([random_float32(1 << 14, 6), specials32(), np.linspace(-100, 100, 4001, dtype=np.float32)])
  leaf = UOp.variable("x", 0, 0, dtypes.float32)
  node = UOp(Ops.SIN, dtypes.float64, (leaf.cast(dtypes.float64),))
  graph = graph_rewrite(node, software_math)
  assert not any(u.op is Ops.SIN for u in toposort([graph]))
  assert _software_rewrite(node, toposort([node]))[0] is graph   # the template path builds the same graph
  got = evaluate(graph, {leaf: xs})
  with np.errstate(all="ignore"): expected = np.sin(xs.astype(np.float64))
  # near multiples of pi/2 the reduction keeps about 2**-50 relative, far more than one rounding to float32 needs
  with np.errstate(all="ignore"):
    relative = np.where(np.isnan(got) & np.isnan(expected), 0, np.abs(got - expected) / np.abs(expected))
  relative = np.where(expected == got, 0, relative)
  worst = int(np.argmax(relative))
  assert relative.max() <= 2.0 ** -45, f"sin(float64({xs[worst]!r})) = {got[worst]!r}, NumPy {expected[worst]!r}"

def _cos_graph(dtype: DType) -> tuple[UOp, UOp]:
  """(leaf, SIN(pi/2 - y)) with y the leaf in float64 (a float32 leaf widened): cos(y) as kiln writes it."""
  from kiln.codegen.transcendental import COS_SHIFT
  leaf = UOp.variable("x", 0, 0, dtype)
  y = leaf.cast(dtypes.float64) if dtype == dtypes.float32 else leaf
  return leaf, UOp(Ops.SIN, dtypes.float64, (UOp(Ops.SUB, dtypes.float64, (UOp.const(dtypes.float64, COS_SHIFT), y)),))

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=str)
def test_cos_is_sin_with_the_quadrant_moved(dtype):
  # SIN(pi/2 - y) is evaluated as cos(y) from y's own reduction: relative accuracy near the zeros of cos, where
  # rounding pi/2 - y would lose every bit, and at huge |y|
  import mpmath
  from kiln.codegen.transcendental import _software_rewrite
  np_dtype = np.float32 if dtype == dtypes.float32 else np.float64
  huge = [1e22, 3e38, 16367173 * 2.0 ** 72]
  if dtype == dtypes.float64: huge += [6381956970095103 * 2.0 ** 797, 1e300]
  xs = np.concatenate([np.random.default_rng(7).uniform(-100, 100, 3000), np.arange(-300, 300) * (np.pi / 2), huge,
                       [0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(np_dtype)
  leaf, node = _cos_graph(dtype)
  graph = graph_rewrite(node, software_math)
  assert not any(u.op is Ops.SIN for u in toposort([graph]))
  assert _software_rewrite(node, toposort([node]))[0] is graph   # the template path builds the same graph
  got = evaluate(graph, {leaf: xs})
  exact = np.array([float(mpmath.cos(mpmath.mpf(float(v)))) if np.isfinite(v) else np.nan for v in xs])
  with np.errstate(all="ignore"):
    relative = np.where(np.isnan(got) & np.isnan(exact), 0, np.abs(got - exact) / np.abs(exact))
  worst = int(np.argmax(relative))
  # float32 inputs: the float64 result feeds one rounding to float32; float64: within 1 ulp
  bound = 2.0 ** -40 if dtype == dtypes.float32 else 2.0 ** -52
  assert relative.max() <= bound, f"cos({xs[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}"

def test_sin_and_cos_of_one_input_share_the_reduction():
  # tan = sin/cos: both come from one reduction (the templates share their placeholder, so the copies hash-cons)
  from kiln.codegen.transcendental import _software_rewrite
  for dtype in (dtypes.float32, dtypes.float64):
    leaf, cos_node = _cos_graph(dtype)
    sin_node = UOp(Ops.SIN, dtypes.float64, (cos_node.src[0].src[1],))
    def uint64_products(node: UOp) -> int:
      rewritten = _software_rewrite(node, toposort([node]))[0]
      return sum(u.op is Ops.MUL and u.dtype == dtypes.uint64 for u in toposort([rewritten]))
    alone, both = uint64_products(sin_node), uint64_products(sin_node / cos_node)
    assert alone > 0 and both == alone, f"{dtype}: {alone} uint64 products for sin, {both} for sin/cos"

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=str)
def test_tan_from_one_reduction(dtype):
  # FDIV(SIN(y), SIN(pi/2 - y)) is evaluated as tan(y): sin and cos of the reduced argument as unrounded pairs, the
  # quotient corrected by its residual, so float64 is within about 1 ulp (two rounded sines divided: 1.96 ulp)
  import mpmath
  from kiln.codegen.transcendental import _software_rewrite
  np_dtype = np.float32 if dtype == dtypes.float32 else np.float64
  xs = np.concatenate([np.random.default_rng(8).uniform(-100, 100, 3000), np.arange(-300, 300) * (np.pi / 2),
                       [-42603.91009619343, 16.437746820048602, 1e22, 3e38 if np_dtype == np.float32 else
                        7.332904820674937e+283, 0.0, -0.0, np.inf, np.nan]]).astype(np_dtype)
  leaf, cos_node = _cos_graph(dtype)
  node = UOp(Ops.FDIV, dtypes.float64, (UOp(Ops.SIN, dtypes.float64, (cos_node.src[0].src[1],)), cos_node))
  graph = graph_rewrite(node, software_math)
  assert not any(u.op is Ops.SIN for u in toposort([graph]))
  assert _software_rewrite(node, toposort([node]))[0] is graph   # the template path builds the same graph
  got = evaluate(graph, {leaf: xs})
  mpmath.mp.dps = 40
  exact = np.array([float(mpmath.tan(mpmath.mpf(float(v)))) if np.isfinite(v) else np.nan for v in xs])
  with np.errstate(all="ignore"):
    ulps = np.where(np.isnan(got) & np.isnan(exact), 0, np.abs(got - exact) / np.spacing(np.abs(exact)))
  assert np.signbit(got[-3]) and not np.signbit(got[-4]), "tan(-0.0) must be -0.0"
  # float32 inputs: the float64 result feeds one rounding to float32 (near a pole the float32 reduction keeps ~2**-41)
  bound = 2.0 ** 13 if dtype == dtypes.float32 else 1.2
  worst = int(np.argmax(ulps))
  assert ulps.max() <= bound, f"tan({xs[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}: {ulps[worst]:.3g} ulp"

EXP_SWEEPS = {dtypes.float32: [np.linspace(-110, 90, 20001), [-103.97, -87.34, 88.72, 88.73, 0.0, -0.0]],
              dtypes.float64: [np.linspace(-750, 710, 20001), [-745.13, -708.4, 709.78, 709.79, 0.0, -0.0]]}

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
def test_exp_form_is_exp_of_its_argument(dtype):
  # EXP2(x * (1/ln2)), exp as the Tensor writes it, is evaluated as e**x (reduced from x itself), through both rewrite
  # paths, within 1.2 ulp near overflow and for subnormal results (exp2 of the rounded product: up to 60 ulp at 88)
  import math
  from kiln.codegen.transcendental import _software_rewrite
  x = UOp.variable("x", 0, 0, dtype)
  node = UOp(Ops.EXP2, dtype, (x * (1 / math.log(2)),))
  graph = graph_rewrite(node, software_math)
  assert _software_rewrite(node, toposort([node]))[0] is graph
  assert not any(u.op is Ops.EXP2 for u in toposort([graph]))
  npdt = np.float32 if dtype == dtypes.float32 else np.float64
  xs = np.concatenate([np.asarray(part, dtype=np.float64) for part in EXP_SWEEPS[dtype]]).astype(npdt)
  specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30], dtype=npdt)
  with np.errstate(all="ignore"):
    got = evaluate(graph, {x: np.concatenate([xs, specials])})
    if dtype == dtypes.float32: exact = np.exp(xs.astype(np.float64))
    else:
      import mpmath
      mpmath.mp.dps = 40
      exact = np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in xs])
    rounded = exact.astype(npdt)   # (inf beyond the largest float)
    ulps = np.where(got[:len(xs)] == rounded, 0, np.abs(got[:len(xs)] - exact) / np.spacing(np.abs(rounded)))
  worst = int(np.argmax(ulps))
  assert ulps.max() <= 1.2, f"exp({xs[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}: {ulps[worst]:.3g} ulp"
  np.testing.assert_array_equal(got[len(xs):], np.array([np.nan, np.inf, 0.0, np.inf, 0.0], dtype=npdt))
  # any other scale is plain exp2 of the product
  other = UOp(Ops.EXP2, dtype, (x * 1.5,))
  assert graph_rewrite(other, software_math) is graph_rewrite(UOp(Ops.EXP2, dtype, (x * 1.5,)), software_math)
  np.testing.assert_array_equal(evaluate(graph_rewrite(other, software_math), {x: np.array([2.0], dtype=npdt)}), [8.0])

def test_tensor_exp_is_a_small_graph_with_exps_gradient():
  # Tensor.exp builds EXP2(x * (1/ln2)): a few nodes for the optimizer (its accuracy is software math's), and the
  # gradient of EXP2 and MUL gives g * exp(x)
  import torch
  assert len(Tensor.empty(64).exp().uop.toposort()) <= 10
  xs = np.linspace(-20, 20, 41)
  for dtype in (dtypes.float32, dtypes.float64):
    t = Tensor(xs, dtype=dtype, requires_grad=True)
    (t.exp() * 3).sum().backward()
    expected = 3 * torch.tensor(xs).exp().numpy()
    np.testing.assert_allclose(t.grad.numpy(), expected, rtol=1e-6 if dtype == dtypes.float32 else 1e-14)

@pytest.mark.parametrize("device,transcendental,call", [("PYTHON", 1, "_exp("), ("CPU", 0, "__builtin_expf(")])
def test_native_math_renders_exp_form_as_exp(device, transcendental, call):
  # devices with native transcendentals evaluate EXP2(x * (1/ln2)) as their exp of x, not exp2 of the product
  import torch
  from kiln.engine.realize import _runner_cache
  xs = np.concatenate([np.linspace(80, 88.7, 300), np.linspace(-103.9, -87, 300)]).astype(np.float32)
  with Context(TRANSCENDENTAL=transcendental):
    got = Tensor(xs, device=device).exp().numpy()
    sources = [r.source for key, r in _runner_cache.items() if call in r.source]
  assert sources, f"no {device} kernel calls {call}"
  exact = torch.tensor(xs.astype(np.float64)).exp().numpy()
  ulps = np.abs(got - exact) / np.spacing(np.abs(exact).astype(np.float32))
  assert ulps.max() <= 1.0, f"{device}: exp({xs[int(np.argmax(ulps))]!r}) off by {ulps.max():.3g} ulp"
