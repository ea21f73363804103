"""Devices end to end: hand-built stage-4 uop lists (docs/ir.md) rendered, compiled and run on CPU and PYTHON,
compared with NumPy; plus Buffer, the compile cache, compile errors and the Device registry."""
import gc, math, os, pathlib, shutil, subprocess, sys
import numpy as np
import pytest
from kiln.device import Buffer, Device, Compiled, CompileError, LRUAllocator, HostAllocator
from kiln.dtype import DType, dtypes, ALL_DTYPES, to_numpy_dtype
from kiln.helpers import Context, GlobalCounters, cache_dir, kernel_cache_dir
from kiln.uop.ops import UOp, Ops, GroupOp, toposort

DEVICES = ["CPU", "PYTHON"]
F32, I32 = dtypes.float32, dtypes.int32

# ---------------- building and running kernels ----------------

def glob(index: int, dtype: DType) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dtype, (), index)
def const(value, dtype: DType = I32) -> UOp: return UOp.const(dtype, value)
def alu(op: Ops, *src: UOp) -> UOp:
  return UOp(op, dtypes.bool if op in GroupOp.Comparison else src[-1].dtype, tuple(src))
def load(buf: UOp, index: UOp, gate: UOp | None = None) -> UOp:
  return UOp(Ops.LOAD, buf.dtype, (buf, index) if gate is None else (buf, index, gate))
def store(buf: UOp, index: UOp, value: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (buf, index, value))
def cast(x: UOp, dtype: DType) -> UOp: return UOp(Ops.CAST, dtype, (x,))

def one_loop_kernel(end: UOp | int, make_stores) -> list[UOp]:
  """[DEFINE_GLOBALs/VARs, RANGE, body..., ENDRANGE] where `make_stores(ridx)` gives the STOREs of the body."""
  rng = UOp(Ops.RANGE, I32, (end if isinstance(end, UOp) else const(end),), 0)
  nodes = [u for u in toposort(make_stores(rng)) if u.op is not Ops.CONST]
  params = [u for u in nodes if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR)]
  body = [u for u in nodes if u not in params and u is not rng]
  return params + [rng] + body + [UOp(Ops.ENDRANGE, dtypes.void, (rng,))]

def run(device: str, uops: list[UOp], buffers: list[tuple[DType, np.ndarray]], vals: tuple[int, ...] = (),
        name: str = "test_kernel") -> list[np.ndarray]:
  """Render, compile and run `uops` on `device`; each buffer starts with the raw contents given. Returns numpy()."""
  dev = Device[device]
  program = dev.runtime(name, dev.compiler.compile_cached(dev.renderer.render(name, uops)))
  bufs = [Buffer(device, arr.size, dtype).copyin(memoryview(np.ascontiguousarray(arr))) for dtype, arr in buffers]
  assert program(*[b._buf for b in bufs], vals=vals) is None
  return [b.numpy() for b in bufs]

def zeros(dtype: DType, n: int) -> tuple[DType, np.ndarray]: return dtype, np.zeros(n, to_numpy_dtype(dtype))

def bf16_round(x) -> np.ndarray:
  """float32 values rounded to bfloat16 (nearest-even), as float32 — an independent NumPy reference."""
  f = np.asarray(x, np.float32).reshape(-1)
  bits = f.view(np.uint32).astype(np.uint64)
  rounded = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).copy()
  rounded[np.isnan(f)] = np.nan
  return rounded

def bf16_bits(x) -> np.ndarray:
  """The bfloat16 bit patterns of (already bfloat16-exact) float32 values."""
  return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)

# ---------------- kernels on both devices ----------------

@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_add_float32(device):
  out, a, b = glob(0, F32), glob(1, F32), glob(2, F32)
  uops = one_loop_kernel(64, lambda r: [store(out, r, alu(Ops.ADD, load(a, r), load(b, r)))])
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
  result = run(device, uops, [zeros(F32, 64), (F32, x), (F32, y)])[0]
  np.testing.assert_array_equal(result, x + y)

def sum_rows_kernel(rows: int, cols: int, dtype: DType) -> list[UOp]:
  """out[i] = sum_j x[i*cols + j], written out as the linearizer does: DEFINE_ACC, inner loop, ASSIGN."""
  out, x = glob(0, dtype), glob(1, dtype)
  r0 = UOp(Ops.RANGE, I32, (const(rows),), 0)
  acc = UOp(Ops.DEFINE_ACC, dtype, (const(0, dtype),), 0)
  r1 = UOp(Ops.RANGE, I32, (const(cols),), 1)
  index = alu(Ops.ADD, alu(Ops.MUL, r0, const(cols)), r1)
  value = load(x, index)
  update = alu(Ops.ADD, acc, value)
  return [out, x, r0, acc, r1, index.src[0], index, value, update, UOp(Ops.ASSIGN, dtype, (acc, update)),
          UOp(Ops.ENDRANGE, dtypes.void, (r1,)), store(out, r0, acc), UOp(Ops.ENDRANGE, dtypes.void, (r0,))]

@pytest.mark.parametrize("device", DEVICES)
def test_sum_reduction(device):
  data = np.random.default_rng(1).integers(-50, 50, (6, 10)).astype(np.float32)   # integer values: exact sums
  result = run(device, sum_rows_kernel(6, 10, F32), [zeros(F32, 6), (F32, data.reshape(-1))])[0]
  np.testing.assert_array_equal(result, data.sum(axis=1))
  ints = np.arange(60, dtype=np.int32) * 1000003
  result = run(device, sum_rows_kernel(6, 10, I32), [zeros(I32, 6), (I32, ints)])[0]
  np.testing.assert_array_equal(result, ints.reshape(6, 10).sum(axis=1, dtype=np.int32))

def test_sum_reduction_float32_rounding_matches_between_devices():
  data = np.random.default_rng(2).standard_normal(4 * 333).astype(np.float32) * 1000
  results = [run(d, sum_rows_kernel(4, 333, F32), [zeros(F32, 4), (F32, data)])[0] for d in DEVICES]
  expected = np.zeros(4, np.float32)
  for i in range(4):
    for v in data[i * 333:(i + 1) * 333]: expected[i] = np.float32(expected[i] + v)   # sequential float32 sum
  for result in results: np.testing.assert_array_equal(result, expected)

def truncating_divmod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  a64, b64 = a.astype(np.int64), b.astype(np.int64)
  safe_b = np.where(b64 == 0, 1, b64)
  q = np.sign(a64) * np.sign(safe_b) * (np.abs(a64) // np.abs(safe_b))
  q, r = np.where(b64 == 0, 0, q), np.where(b64 == 0, 0, a64 - safe_b * q)
  return q.astype(a.dtype), r.astype(a.dtype)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32])
def test_integer_division_truncates(device, dtype):
  npdt = to_numpy_dtype(dtype)
  a_vals = [7, -7, 7, -7, 0, 1, -1, 100, -100, 5, 13, -13, 6, 9, 3]
  b_vals = [2, 2, -2, -2, 3, -5, 5, 7, -7, 0, 4, 4, -3, -1, 1]
  if dtypes.is_unsigned(dtype): a_vals, b_vals = [abs(v) for v in a_vals], [abs(v) for v in b_vals]
  a, b = np.array(a_vals).astype(npdt), np.array(b_vals).astype(npdt)
  n = len(a)
  q, r, qc, rc, qn, rn = (glob(i, dtype) for i in range(6))
  x, y = glob(6, dtype), glob(7, dtype)
  def stores(ridx):
    va, vb = load(x, ridx), load(y, ridx)
    three, minus_three = const(3, dtype), const(-3 if not dtypes.is_unsigned(dtype) else 3, dtype)
    return [store(q, ridx, alu(Ops.IDIV, va, vb)), store(r, ridx, alu(Ops.MOD, va, vb)),
            store(qc, ridx, alu(Ops.IDIV, va, three)), store(rc, ridx, alu(Ops.MOD, va, three)),
            store(qn, ridx, alu(Ops.IDIV, va, minus_three)), store(rn, ridx, alu(Ops.MOD, va, minus_three))]
  outs = run(device, one_loop_kernel(n, stores), [zeros(dtype, n)] * 6 + [(dtype, a), (dtype, b)])
  for (got_q, got_r), divisor in zip([outs[0:2], outs[2:4], outs[4:6]], [b, np.full(n, 3, npdt),
                                     np.full(n, -3 if not dtypes.is_unsigned(dtype) else 3).astype(npdt)]):
    want_q, want_r = truncating_divmod(a, divisor)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_r, want_r)

@pytest.mark.parametrize("device", DEVICES)
def test_signed_min_divided_by_minus_one_wraps(device):
  for dtype in (dtypes.int8, dtypes.int32, dtypes.int64):
    x, y, out, rem = glob(0, dtype), glob(1, dtype), glob(2, dtype), glob(3, dtype)
    uops = one_loop_kernel(1, lambda r: [store(out, r, alu(Ops.IDIV, load(x, r), load(y, r))),
                                         store(rem, r, alu(Ops.MOD, load(x, r), load(y, r)))])
    npdt = to_numpy_dtype(dtype)
    minimum = np.array([dtypes.min(dtype)], npdt)
    outs = run(device, uops, [(dtype, minimum), (dtype, np.array([-1], npdt)), zeros(dtype, 1), zeros(dtype, 1)])
    assert outs[2][0] == dtypes.min(dtype) and outs[3][0] == 0

@pytest.mark.parametrize("device", DEVICES)
def test_integer_wraparound_and_bit_ops(device):
  cases = [(dtypes.int32, [2**31 - 1, -2**31, 123456789, -5], [1, -1, 1000, 3]),
           (dtypes.int8, [127, -128, 100, -7], [1, -1, 100, 3]),
           (dtypes.uint32, [0, 2**32 - 1, 3000000000, 5], [1, 1, 3000000000, 3]),
           (dtypes.uint16, [0, 65535, 40000, 5], [1, 1, 40000, 3]),
           (dtypes.int64, [2**63 - 1, -2**63, 2**40, -5], [1, -1, 2**30, 3])]
  ops = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.MAX, Ops.SHL, Ops.SHR]
  for dtype, a_vals, b_vals in cases:
    npdt = to_numpy_dtype(dtype)
    a, b = np.array(a_vals).astype(npdt), np.array(b_vals).astype(npdt)
    shift = np.array([0, 1, 3, 7], npdt)
    x, y, s = glob(0, dtype), glob(1, dtype), glob(2, dtype)
    outs = [glob(3 + i, dtype) for i in range(len(ops) + 1)]
    def stores(r):
      va, vb, vs = load(x, r), load(y, r), load(s, r)
      result = [store(o, r, alu(op, va, vs if op in (Ops.SHL, Ops.SHR) else vb)) for o, op in zip(outs, ops)]
      return result + [store(outs[-1], r, UOp(Ops.NEG, dtype, (va,)))]
    got = run(device, one_loop_kernel(4, stores), [(dtype, a), (dtype, b), (dtype, shift)] + [zeros(dtype, 4)] * 10)[3:]
    with np.errstate(over="ignore"):
      expected = [a + b, a - b, a * b, a & b, a | b, a ^ b, np.maximum(a, b), a << shift, a >> shift,
                  (0 - a).astype(npdt)]
    for op, g, e in zip(ops + [Ops.NEG], got, expected): np.testing.assert_array_equal(g, e, err_msg=f"{dtype} {op}")

CAST_SAFE_FLOATS = [0.0, 1.0, 1.5, 2.75, 100.25, 127.5, 3.0, 0.5, 99.0]   # in range for every integer dtype
SPECIAL_FLOATS = [math.inf, -math.inf, math.nan, -0.0, 65504.0, 65520.0, 70000.0, 1e-8, 6e-8, 1 + 2**-11 + 2**-40,
                  3.4e38, 1e39, 0.1, -2.5, 1.00390625, 1.01171875, -1e-40, 2.0**-149, 1e-300]
INT_VALUES = [0, 1, -1, 127, 128, 255, 256, -129, 65535, 70000, 2**31 - 1, -2**31, 2**40 + 3, 2**60 + 2**36 + 1,
              -2**63, 2**63 - 1, 2**63 + 2**39 + 1, 2**64 - 1, 16777217, -16777219]
FLOAT_OR_BOOL = (dtypes.bool, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)

def representable(values: list, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
  """(raw buffer contents, their values as numpy) of `values` converted to `dtype`."""
  if dtype == dtypes.bool: vals = np.array([bool(v) for v in values])
  elif dtypes.is_int(dtype): vals = np.array([v % 2**64 for v in values], np.uint64).astype(to_numpy_dtype(dtype))
  elif dtype == dtypes.bfloat16:
    with np.errstate(over="ignore"): vals = bf16_round(np.array(values, np.float64).astype(np.float32))
    return bf16_bits(vals), vals
  else:
    with np.errstate(over="ignore"): vals = np.array(values, np.float64).astype(to_numpy_dtype(dtype))
  return vals, vals

def expected_cast(values: np.ndarray, dst: DType) -> np.ndarray:
  with np.errstate(all="ignore"):
    if dst == dtypes.bool: return values != 0
    if dst == dtypes.bfloat16: return bf16_round(values.astype(np.float32))   # through float32, like the devices
    return values.astype(to_numpy_dtype(dst))

@pytest.mark.parametrize("src", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_load_store_cast_round_trip(src):
  """One kernel per source dtype loads a value and stores it cast to every dtype (incl. itself: a plain copy)."""
  x = glob(0, src)
  outs = [glob(i + 1, dst) for i, dst in enumerate(ALL_DTYPES)]
  if dtypes.is_float(src): runs = [(CAST_SAFE_FLOATS, ALL_DTYPES), (SPECIAL_FLOATS, FLOAT_OR_BOOL)]
  elif src == dtypes.bool: runs = [([True, False, True, True], ALL_DTYPES)]
  else: runs = [(INT_VALUES, ALL_DTYPES)]
  for values, checked in runs:
    raw, vals = representable(values, src)
    n = len(values)
    uops = one_loop_kernel(n, lambda r: [store(o, r, cast(load(x, r), o.dtype) if o.dtype != src else load(x, r))
                                         for o in outs])
    for device in DEVICES:
      got = run(device, uops, [(src, raw)] + [zeros(dst, n) for dst in ALL_DTYPES])[1:]
      for dst, g in zip(ALL_DTYPES, got):
        if dst in checked: np.testing.assert_array_equal(g, expected_cast(vals, dst), err_msg=f"{device} {src}->{dst}")

def half_conversion_inputs() -> tuple[np.ndarray, np.ndarray]:
  """Every float16 bit pattern, and doubles around every float16 value: the values, the midpoints between
  neighbours (ties), and just above/below each midpoint; plus values past the ends of the range."""
  patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
  halves = np.sort(patterns.view(np.float16)[np.isfinite(patterns.view(np.float16))].astype(np.float64))
  mids = (halves[1:] + halves[:-1]) / 2
  doubles = np.concatenate([halves, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                            [65519.99, 65520.0, 1e5, 1e300, -1e300, 2.0**-25, 2.0**-26, 1e-300, 5e-324, np.inf, np.nan]])
  return patterns, doubles

def test_float16_conversions_are_exact_with_and_without_compiler_support():
  """float16 <-> float32/float64 conversions, through _Float16 where the C compiler has it and through the
  bit-by-bit fallback (forced with -DKILN_SOFT_HALF), for every C compiler on PATH, and on PYTHON."""
  patterns, doubles = half_conversion_inputs()
  half_in, f32_out = glob(0, dtypes.float16), glob(1, F32)
  double_in, half_out = glob(2, dtypes.float64), glob(3, dtypes.float16)
  to_float = one_loop_kernel(len(patterns), lambda r: [store(f32_out, r, cast(load(half_in, r), F32))])
  to_half = one_loop_kernel(len(doubles), lambda r: [store(half_out, r, cast(load(double_in, r), dtypes.float16))])
  with np.errstate(over="ignore"): want_half = doubles.astype(np.float16)
  want_float = patterns.view(np.float16).astype(np.float32)
  found = {os.path.realpath(path): cc for cc in ("cc", "clang", "gcc") if (path := shutil.which(cc))}
  compilers = sorted(found.values())
  assert compilers, "no C compiler on PATH"
  setups = [("PYTHON", None, "")] + [("CPU", cc, flags) for cc in compilers for flags in ("", " -DKILN_SOFT_HALF")]
  for device, cc, flags in setups:
    with Context(CC=cc or "", CFLAGS="-O2" + flags):
      got_float = run(device, to_float, [(dtypes.float16, patterns), zeros(F32, len(patterns))])[1]
      got_half = run(device, to_half, [(dtypes.float64, doubles), zeros(dtypes.float16, len(doubles))])[1]
    where = f"{device} {cc} {flags}"
    np.testing.assert_array_equal(got_float, want_float, err_msg=where)
    np.testing.assert_array_equal(got_half.view(np.uint16)[:-1], want_half.view(np.uint16)[:-1], err_msg=where)
    assert np.isnan(got_half[-1]), where

@pytest.mark.parametrize("device", DEVICES)
def test_half_and_bfloat16_arithmetic_rounds_every_op(device):
  rng = np.random.default_rng(3)
  a32 = (rng.standard_normal(200) * 100).astype(np.float32)
  b32 = (rng.standard_normal(200) * 3).astype(np.float32)
  a32[:4], b32[:4] = [1.0, 2048.0, 65504.0, 1.0], [2.0**-11, 1.0, 65504.0, 2.0**-8]   # ties and overflow
  ops = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV]
  for dtype in (dtypes.float16, dtypes.bfloat16):
    raw_a, a = representable(a32.tolist(), dtype)
    raw_b, b = representable(b32.tolist(), dtype)
    x, y = glob(0, dtype), glob(1, dtype)
    outs = [glob(2 + i, dtype) for i in range(len(ops) + 1)]
    def stores(r):
      va, vb = load(x, r), load(y, r)
      chain = alu(Ops.MUL, alu(Ops.ADD, va, vb), vb)   # (a+b)*b: rounded after the add, too
      return [store(o, r, alu(op, va, vb)) for o, op in zip(outs, ops)] + [store(outs[-1], r, chain)]
    got = run(device, one_loop_kernel(200, stores), [(dtype, raw_a), (dtype, raw_b)] + [zeros(dtype, 200)] * 5)[2:]
    with np.errstate(all="ignore"):
      if dtype == dtypes.float16:   # numpy computes float16 ops in float32 and rounds, which is exact rounding
        expected = [a + b, a - b, a * b, a / b, (a + b) * b]
      else:
        expected = [bf16_round(a + b), bf16_round(a - b), bf16_round(a * b), bf16_round(a / b),
                    bf16_round(bf16_round(a + b) * b)]
    for op, g, e in zip(ops + ["chain"], got, expected): np.testing.assert_array_equal(g, e, err_msg=f"{dtype} {op}")

@pytest.mark.parametrize("device", DEVICES)
def test_max_propagates_nan(device):
  nan = np.nan
  a = np.array([1.0, nan, 3.0, nan, -np.inf, 2.0, -1.0], np.float32)
  b = np.array([nan, 2.0, 1.0, nan, 5.0, np.inf, -3.0], np.float32)
  for dtype in (F32, dtypes.float16, dtypes.float64, dtypes.bfloat16):
    raw_a, va = representable(a.tolist(), dtype)
    raw_b, vb = representable(b.tolist(), dtype)
    x, y, out = glob(0, dtype), glob(1, dtype), glob(2, dtype)
    uops = one_loop_kernel(7, lambda r: [store(out, r, alu(Ops.MAX, load(x, r), load(y, r)))])
    got = run(device, uops, [(dtype, raw_a), (dtype, raw_b), zeros(dtype, 7)])[2]
    np.testing.assert_array_equal(got, np.maximum(va, vb), err_msg=str(dtype))
  # a max-reduction that meets a NaN stays NaN
  x, out = glob(1, F32), glob(0, F32)
  r0 = UOp(Ops.RANGE, I32, (const(2),), 0)
  acc = UOp(Ops.DEFINE_ACC, F32, (const(-math.inf, F32),), 0)
  r1 = UOp(Ops.RANGE, I32, (const(4),), 1)
  index = alu(Ops.ADD, alu(Ops.MUL, r0, const(4)), r1)
  update = alu(Ops.MAX, acc, load(x, index))
  uops = [out, x, r0, acc, r1, index.src[0], index, update.src[1], update, UOp(Ops.ASSIGN, F32, (acc, update)),
          UOp(Ops.ENDRANGE, dtypes.void, (r1,)), store(out, r0, acc), UOp(Ops.ENDRANGE, dtypes.void, (r0,))]
  data = np.array([1, nan, 3, 2, 1, 2, 7, 0], np.float32)
  np.testing.assert_array_equal(run(device, uops, [zeros(F32, 2), (F32, data)])[0], [nan, 7.0])

@pytest.mark.parametrize("device", DEVICES)
def test_gated_load_never_reads_out_of_range(device):
  # lanes 4..7 would read index 2**30 (4 GiB past the buffer): a crash on CPU, an IndexError on PYTHON
  x, out = glob(1, F32), glob(0, F32)
  def stores(r):
    inside = alu(Ops.CMPLT, r, const(4))
    index = alu(Ops.WHERE, inside, r, const(2**30))
    return [store(out, r, load(x, index, inside))]
  data = np.array([1.5, 2.5, 3.5, 4.5], np.float32)
  got = run(device, one_loop_kernel(8, stores), [(F32, np.full(8, 9, np.float32)), (F32, data)])[0]
  np.testing.assert_array_equal(got, [1.5, 2.5, 3.5, 4.5, 0, 0, 0, 0])

@pytest.mark.parametrize("device", DEVICES)
def test_define_var_sizes_and_order(device):
  # out[i] = i*scale + offset for i < n; vars are parameters in the order they first appear: n, scale, offset
  n, scale, offset = UOp.variable("n", 1, 16), UOp.variable("scale", -100, 100), UOp.variable("offset", -100, 100)
  out = glob(0, I32)
  uops = one_loop_kernel(n, lambda r: [store(out, r, alu(Ops.ADD, alu(Ops.MUL, r, scale), offset))])
  assert [u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR] == ["n", "scale", "offset"]
  got = run(device, uops, [(I32, np.full(16, -1, np.int32))], vals=(5, 3, -2))[0]
  np.testing.assert_array_equal(got, [-2, 1, 4, 7, 10] + [-1] * 11)
  got = run(device, uops, [(I32, np.full(16, -1, np.int32))], vals=(16, -1, 0))[0]
  np.testing.assert_array_equal(got, -np.arange(16))

@pytest.mark.parametrize("device", DEVICES)
def test_float_math_functions(device):
  values = [0.0, -0.0, 0.5, 1.0, -1.0, 2.5, -3.75, 10.0, 100.0, 1e-3, 200.0, -200.0, np.inf, -np.inf, np.nan]
  ops = [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC]
  reference = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.RECIP: np.reciprocal,
               Ops.NEG: np.negative, Ops.TRUNC: np.trunc}
  for dtype in (F32, dtypes.float64, dtypes.float16):
    raw, vals = representable(values, dtype)
    n = len(values)
    x, y = glob(0, dtype), glob(1, dtype)
    outs = [glob(2 + i, dtype) for i in range(len(ops) + 2)]
    def stores(r):
      v = load(x, r)
      return ([store(o, r, UOp(op, dtype, (v,))) for o, op in zip(outs, ops)] +
              [store(outs[-2], r, alu(Ops.POW, v, load(y, r))), store(outs[-1], r, alu(Ops.FDIV, v, load(y, r)))])
    exponents = representable([2.0, 3.0, -1.0, 0.5, 2.0, 3.0, -2.0, 0.5, 1.5, 2.0, 1.0, 3.0, -1.0, 2.0, 0.0], dtype)
    got = run(device, one_loop_kernel(n, stores), [(dtype, raw), (dtype, exponents[0])] +
              [zeros(dtype, n)] * (len(ops) + 2))[2:]
    with np.errstate(all="ignore"):
      expected = [reference[op](vals) for op in ops] + [np.power(vals, exponents[1]), vals / exponents[1]]
    tolerance = {F32: 1e-6, dtypes.float64: 1e-15, dtypes.float16: 1e-3}[dtype]
    for name, g, e in zip(ops + ["POW", "FDIV"], got, expected):
      np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tolerance, atol=1e-30,
                                 err_msg=f"{dtype} {name}")
      if name in (Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP, "FDIV"):   # correctly rounded: exact, signed zeros too
        np.testing.assert_array_equal(g, e, err_msg=f"{dtype} {name}")
        not_nan = ~np.isnan(e)   # the sign of a NaN means nothing
        np.testing.assert_array_equal(np.signbit(g)[not_nan], np.signbit(e)[not_nan], err_msg=f"{dtype} {name} sign")

def test_float_math_functions_agree_between_devices():
  values = np.random.default_rng(4).uniform(-30, 30, 500).astype(np.float32)
  ops = [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT]
  x = glob(0, F32)
  outs = [glob(1 + i, F32) for i in range(len(ops))]
  uops = one_loop_kernel(500, lambda r: [store(o, r, UOp(op, F32, (load(x, r),))) for o, op in zip(outs, ops)])
  cpu, python = (run(d, uops, [(F32, values)] + [zeros(F32, 500)] * len(ops))[1:] for d in DEVICES)
  for op, c, p in zip(ops, cpu, python):
    np.testing.assert_array_max_ulp(c, p, maxulp=1)   # libm's float functions vs double-then-round
    same = (c == p) | (np.isnan(c) & np.isnan(p))
    assert np.mean(same) > 0.95, f"{op}: only {np.mean(same):.1%} bit-identical"


@pytest.mark.parametrize("device", DEVICES)
def test_comparisons_where_and_bool_ops(device):
  a = np.array([1.0, np.nan, 3.0, -0.0, 2.0], np.float32)
  b = np.array([2.0, 1.0, 3.0, 0.0, np.nan], np.float32)
  x, y = glob(0, F32), glob(1, F32)
  lt, ne, eq, both, either, one = (glob(2 + i, dtypes.bool) for i in range(6))
  pick = glob(8, F32)
  def stores(r):
    va, vb = load(x, r), load(y, r)
    c_lt, c_ne, c_eq = alu(Ops.CMPLT, va, vb), alu(Ops.CMPNE, va, vb), alu(Ops.CMPEQ, va, vb)
    return [store(lt, r, c_lt), store(ne, r, c_ne), store(eq, r, c_eq), store(both, r, alu(Ops.AND, c_lt, c_ne)),
            store(either, r, alu(Ops.OR, c_lt, c_eq)), store(one, r, alu(Ops.XOR, c_ne, c_eq)),
            store(pick, r, alu(Ops.WHERE, c_lt, va, vb))]
  buffers = [(F32, a), (F32, b)] + [zeros(dtypes.bool, 5)] * 6 + [zeros(F32, 5)]
  got = run(device, one_loop_kernel(5, stores), buffers)[2:]
  expected = [a < b, a != b, a == b, (a < b) & (a != b), (a < b) | (a == b), (a != b) ^ (a == b), np.where(a < b, a, b)]
  for g, e in zip(got, expected): np.testing.assert_array_equal(g, e)

@pytest.mark.parametrize("device", DEVICES)
def test_bitcast(device):
  cases = [(F32, I32, np.array([1.0, -2.5, np.inf, 0.1], np.float32)),
           (dtypes.float16, dtypes.int16, np.array([1.0, -2.5, np.inf, 0.1], np.float16)),
           (dtypes.uint32, F32, np.array([0x3F800000, 0x7F800000, 0x80000000, 1], np.uint32)),
           (dtypes.float64, dtypes.uint64, np.array([1.0, -0.0, 1e300, 2.0**-1074], np.float64))]
  for src, dst, values in cases:
    x, out = glob(0, src), glob(1, dst)
    uops = one_loop_kernel(4, lambda r: [store(out, r, UOp(Ops.BITCAST, dst, (load(x, r),)))])
    got = run(device, uops, [(src, values), zeros(dst, 4)])[1]
    np.testing.assert_array_equal(got, values.view(to_numpy_dtype(dst)))
  bits = np.array([0x3F80, 0xC020, 0x7F80, 0x0001], np.uint16)   # bfloat16 <-> uint16
  x, mid, out = glob(0, dtypes.uint16), glob(1, dtypes.bfloat16), glob(2, dtypes.uint16)
  def stores(r):
    as_bf16 = UOp(Ops.BITCAST, dtypes.bfloat16, (load(x, r),))
    return [store(mid, r, as_bf16), store(out, r, UOp(Ops.BITCAST, dtypes.uint16, (as_bf16,)))]
  buffers = [(dtypes.uint16, bits), zeros(dtypes.bfloat16, 4), zeros(dtypes.uint16, 4)]
  got = run(device, one_loop_kernel(4, stores), buffers)
  np.testing.assert_array_equal(got[1], (bits.astype(np.uint32) << 16).view(np.float32))
  np.testing.assert_array_equal(got[2], bits)

@pytest.mark.parametrize("device", DEVICES)
def test_constants_render_exactly(device):
  consts = [(F32, math.inf), (F32, -math.inf), (F32, math.nan), (F32, -0.0), (F32, 0.1), (F32, 3.4e38), (F32, 1e-45),
            (dtypes.float64, 0.1), (dtypes.float64, -math.inf), (dtypes.float64, 5e-324), (dtypes.float16, 0.1),
            (dtypes.float16, 1e5), (dtypes.bfloat16, 0.1), (dtypes.bfloat16, math.nan), (I32, -2**31),
            (dtypes.int64, -2**63), (dtypes.uint64, 2**64 - 1), (dtypes.uint32, 2**32 - 1), (dtypes.int8, -128),
            (dtypes.bool, True)]
  outs = [glob(i, dt) for i, (dt, _) in enumerate(consts)]
  uops = one_loop_kernel(1, lambda r: [store(o, r, const(v, dt)) for o, (dt, v) in zip(outs, consts)])
  got = run(device, uops, [zeros(dt, 1) for dt, _ in consts])
  for (dt, v), g in zip(consts, got):
    want = expected_cast(np.array([v]), dt) if dtypes.is_float(dt) else np.array([v]).astype(to_numpy_dtype(dt))
    np.testing.assert_array_equal(g, want, err_msg=f"{dt} {v}")
    if dtypes.is_float(dt): assert np.signbit(g[0]) == np.signbit(want[0]), f"{dt} {v} sign"

@pytest.mark.parametrize("device", DEVICES)
def test_empty_loop_and_gated_store(device):
  out, x = glob(0, I32), glob(1, I32)
  r0 = UOp(Ops.RANGE, I32, (const(3),), 0)
  empty = UOp(Ops.RANGE, I32, (const(2),), 1)
  value = load(x, r0)
  gate = alu(Ops.CMPNE, r0, const(1))
  gated = UOp(Ops.STORE, dtypes.void, (out, r0, value, gate))
  uops = [out, x, r0, empty, UOp(Ops.ENDRANGE, dtypes.void, (empty,)), value, gate, gated,
          UOp(Ops.ENDRANGE, dtypes.void, (r0,))]
  got = run(device, uops, [(I32, np.full(3, -1, np.int32)), (I32, np.array([4, 5, 6], np.int32))])[0]
  np.testing.assert_array_equal(got, [4, -1, 6])

@pytest.mark.parametrize("device", DEVICES)
def test_nested_ranges_with_the_same_loop_id_do_not_shadow(device):
  out = glob(0, I32)
  outer, inner = UOp(Ops.RANGE, I32, (const(3),), 0), UOp(Ops.RANGE, I32, (const(2),), 0)
  index = alu(Ops.ADD, alu(Ops.MUL, outer, const(2)), inner)
  value = alu(Ops.ADD, alu(Ops.MUL, outer, const(10)), inner)
  uops = [out, outer, inner, index.src[0], index, value.src[0], value, store(out, index, value),
          UOp(Ops.ENDRANGE, dtypes.void, (inner,)), UOp(Ops.ENDRANGE, dtypes.void, (outer,))]
  np.testing.assert_array_equal(run(device, uops, [zeros(I32, 6)])[0], [0, 1, 10, 11, 20, 21])

# ---------------- programs, renderers, compilers ----------------

@pytest.mark.parametrize("device", DEVICES)
def test_program_wait_returns_elapsed_time(device):
  out, a = glob(0, F32), glob(1, F32)
  uops = one_loop_kernel(4, lambda r: [store(out, r, load(a, r))])
  dev = Device[device]
  program = dev.runtime("copy_kernel", dev.compiler.compile_cached(dev.renderer.render("copy_kernel", uops)))
  initial = np.arange(4, dtype=np.float32).tobytes()
  bufs = [Buffer(device, 4, F32).allocate(), Buffer(device, 4, F32, initial_value=initial)]
  elapsed = program(*[b._buf for b in bufs], wait=True)
  assert isinstance(elapsed, float) and elapsed >= 0
  np.testing.assert_array_equal(bufs[0].numpy(), np.arange(4))

def test_c_signature_orders_buffers_by_parameter_number_then_vars_by_first_use():
  n, m = UOp.variable("n", 1, 8), UOp.variable("m", 1, 8)
  out, a = glob(0, F32), glob(1, dtypes.bfloat16)
  r = UOp(Ops.RANGE, I32, (n,), 0)
  value = load(a, alu(Ops.ADD, r, m))
  as_float = cast(value, F32)
  uops = [a, out, n, r, value.src[1], value, as_float, store(out, r, as_float), UOp(Ops.ENDRANGE, dtypes.void, (r,))]
  src = Device["CPU"].renderer.render("sig", uops)
  assert ("void sig(float* restrict data0, unsigned short* restrict data1, int var0, int var1, int kiln_tid, "
            "int kiln_nthreads)") in src

def test_renderers_reject_what_they_cannot_render():
  out, a = glob(0, I32), glob(1, I32)
  bad_sqrt = one_loop_kernel(2, lambda r: [store(out, r, UOp(Ops.SQRT, I32, (load(a, r),)))])
  for device in DEVICES:
    with pytest.raises(TypeError, match="SQRT"): Device[device].renderer.render("bad", bad_sqrt)
    with pytest.raises(NotImplementedError, match="REDUCE"):
      Device[device].renderer.render("bad", [out, UOp(Ops.REDUCE, I32, (const(1),), Ops.ADD)])

def test_invalid_c_raises_compile_error_with_kernel_name_and_compiler_output():
  src = "void broken_kernel_name(float* restrict data0) { data0[0] = undeclared_thing; }\n"
  with pytest.raises(RuntimeError) as info: Device["CPU"].compiler.compile(src)
  assert isinstance(info.value, CompileError)
  assert "broken_kernel_name" in str(info.value) and "undeclared_thing" in str(info.value)
  assert "error" in str(info.value)

def test_compile_cache_hit_runs_no_subprocess(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  compiler = Device["CPU"].compiler
  src = "void cache_probe(int* restrict data0) { data0[0] = 42; }\n"
  with Context(CACHELEVEL=2):
    lib = compiler.compile_cached(src)
    assert list((cache_dir() / "compile").rglob("*")), "nothing was written to the cache"
    def no_subprocess(*args, **kwargs): raise AssertionError("the compiler ran although the kernel is cached")
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert compiler.compile_cached(src) == lib
    buf = Buffer("CPU", 1, I32).allocate()
    Device["CPU"].runtime("cache_probe", compiler.compile_cached(src))(buf._buf)
    assert buf.numpy()[0] == 42
  with Context(CACHELEVEL=0), pytest.raises(AssertionError, match="compiler ran"): compiler.compile_cached(src)

def test_cachedb_names_the_kernel_cache_folder(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  compiler = Device["CPU"].compiler
  src = "void cachedb_probe(int* restrict data0) { data0[0] = 7; }\n"
  with Context(CACHELEVEL=2, CACHEDB=str(tmp_path / "kernels.db")):
    assert kernel_cache_dir() == tmp_path / "kernels.db"
    compiler.compile_cached(src)
    assert compiler.cache_path(src).is_relative_to(tmp_path / "kernels.db") and compiler.cache_path(src).exists()
  assert not (cache_dir() / "compile").exists(), "CACHEDB was set, yet the kernel went to the default cache"
  (tmp_path / "a_file").write_text("")
  with Context(CACHEDB=str(tmp_path / "a_file")), pytest.raises(RuntimeError, match="CACHEDB.*is a file"):
    kernel_cache_dir()

def test_compile_cache_key_depends_on_flags(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  compiler = Device["CPU"].compiler
  src = "void flag_probe(int* restrict data0) { data0[0] = 1; }\n"
  with Context(CFLAGS="-O2"): path_o2 = compiler.cache_path(src)
  with Context(CFLAGS="-O0"): path_o0 = compiler.cache_path(src)
  assert path_o2 != path_o0

# ---------------- buffers and allocators ----------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_buffer_round_trips(device, dtype):
  raw, vals = representable([0, 1, 2, 3, 5, 100, 7], dtype)
  buf = Buffer(device, 7, dtype)
  assert not buf.is_allocated() and buf.nbytes == 7 * dtype.itemsize
  assert buf.copyin(memoryview(raw)) is buf and buf.is_allocated()
  out = buf.numpy()
  assert out.shape == (7,) and out.dtype == (np.float32 if dtype == dtypes.bfloat16 else to_numpy_dtype(dtype))
  np.testing.assert_array_equal(out, vals)
  assert buf.as_bytes() == raw.tobytes()
  dest = bytearray(buf.nbytes)
  assert buf.copyout(memoryview(dest)) is not None and bytes(dest) == raw.tobytes()
  other = Buffer("PYTHON" if device == "CPU" else "CPU", 7, dtype).copy_from(buf)
  assert other.as_bytes() == raw.tobytes()
  assert Buffer(device, 7, dtype, initial_value=raw.tobytes()).as_bytes() == raw.tobytes()

def test_buffer_errors_and_lazy_allocation():
  buf = Buffer("CPU", 4, F32)
  with pytest.raises(ValueError, match="12 bytes"): buf.copyin(memoryview(bytearray(12)))
  with pytest.raises(RuntimeError, match="not been allocated"): buf.copyout(memoryview(bytearray(16)))
  with pytest.raises(ValueError): Buffer("CPU", -1, F32)
  assert buf.allocate() is buf and buf.allocate()._buf is buf._buf   # idempotent
  assert Buffer("CPU", 0, F32).allocate().numpy().shape == (0,)
  assert buf._buf.ctypes.data % 64 == 0

def test_buffer_memory_is_counted_and_returned():
  gc.collect()
  before = GlobalCounters.mem_used
  buf = Buffer("CPU", 1000, F32)
  assert GlobalCounters.mem_used == before
  buf.allocate()
  assert GlobalCounters.mem_used == before + 4000
  handle = buf._buf
  del buf
  gc.collect()
  assert GlobalCounters.mem_used == before
  again = Buffer("CPU", 1000, F32).allocate()   # the freed memory is reused
  assert again._buf is handle

def test_lru_allocator_reuses_per_size_and_frees_beyond_its_limit():
  class CountingAllocator(LRUAllocator):
    def __init__(self):
      super().__init__(max_cached_bytes=100)
      self.made, self.freed = 0, 0
    def _alloc(self, nbytes): self.made += 1; return bytearray(nbytes)
    def _free(self, handle, nbytes): self.freed += 1
  allocator = CountingAllocator()
  a = allocator.alloc(64)
  allocator.free(a, 64)
  assert allocator.alloc(64) is a and allocator.made == 1
  assert allocator.alloc(32) is not a and allocator.made == 2
  allocator.free(a, 64)
  allocator.free(bytearray(64), 64)   # over the 100-byte cache limit: really freed
  assert allocator.freed == 1
  allocator.free_cache()
  assert allocator.freed == 2 and allocator.cached_bytes == 0

def test_host_allocator_copies():
  allocator = HostAllocator()
  handle = allocator.alloc(8)
  allocator.copyin(handle, memoryview(np.array([1.5, -2.0], np.float32)))
  dest = np.zeros(2, np.float32)
  allocator.copyout(memoryview(dest), handle)
  np.testing.assert_array_equal(dest, [1.5, -2.0])

# ---------------- the device registry ----------------

def test_device_registry():
  cpu = Device["CPU"]
  assert isinstance(cpu, Compiled) and cpu.device == "CPU"
  assert Device["cpu"] is cpu and Device["CPU:0"] is cpu and Device["cpu:0"] is cpu
  assert Device["PYTHON"].device == "PYTHON" and Device["python"] is Device["PYTHON"]
  second = Device["CPU:1"]
  assert second is not cpu and second.device == "CPU:1" and Device["cpu:1"] is second
  assert Device.canonicalize("cpu") == "CPU" and Device.canonicalize("cpu:0") == "CPU"
  assert Device.canonicalize("CPU:1") == "CPU:1" and Device.canonicalize("Python") == "PYTHON"
  for _ in range(2):   # remembered names (asked again) give the same answers, and bad names still raise
    assert Device.canonicalize("cpu:0") == "CPU" and Device.canonicalize("cpu:1") == "CPU:1"
    for bad in ("", None, 3, ["CPU"]):
      with pytest.raises(ValueError): Device.canonicalize(bad)
  with pytest.raises(ValueError): Device[None]
  assert {"CPU", "PYTHON"} <= set(Device.known())
  for part in (cpu.allocator, cpu.renderer, cpu.compiler, cpu.runtime): assert part is not None
  cpu.synchronize()

def test_unknown_device_lists_known_ones():
  with pytest.raises(ValueError, match="unknown device 'NOPE'.*CPU.*PYTHON"): Device["NOPE"]
  with pytest.raises(ValueError): Device[""]

def test_default_device_is_assignable():
  saved = Device.DEFAULT
  assert saved in ("CPU", "PYTHON")
  try:
    Device.DEFAULT = "python"
    assert Device.DEFAULT == "PYTHON"
  finally:
    Device.DEFAULT = saved

@pytest.mark.parametrize("env, expected", [({}, "CPU"), ({"DEV": "python"}, "PYTHON"), ({"PYTHON": "1"}, "PYTHON"),
                                           ({"CPU": "1"}, "CPU"), ({"DEV": "CPU"}, "CPU")])
def test_default_device_from_environment(env, expected):
  clean = {k: v for k, v in os.environ.items() if k not in ("DEV", "CPU", "PYTHON")}
  code = "from kiln.device import Device; print(Device.DEFAULT)"
  result = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          cwd=str(pathlib.Path(__file__).resolve().parents[2]))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == expected
