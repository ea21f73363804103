"""The LLVM device: the kernel tests of test_devices.py run on LLVM, casts and math compared bit for bit with the
PYTHON reference, a representative subset of the op tests on device="LLVM", and the compiler's cache and errors.
Two op test files also run whole with LLVM as the default device; docs/developer.md says how to run all of them."""
import itertools, math, os, pathlib, subprocess, sys
import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("llvmlite")

import test_devices as kernels   # noqa: E402  (test/runtime is on sys.path: pytest's default import mode)
from test_devices import glob, load, store, cast, alu, const, one_loop_kernel, run, zeros   # noqa: E402
from helpers import check   # noqa: E402
from kiln import Tensor, dtypes   # noqa: E402
from kiln.device import Device, CompileError   # noqa: E402
from kiln.dtype import ALL_DTYPES   # noqa: E402
from kiln.helpers import kernel_cache_dir   # noqa: E402
from kiln.renderer.llvmir import float_literal   # noqa: E402
from kiln.uop.ops import UOp, Ops   # noqa: E402

F32 = dtypes.float32

# ---------------- the device-parametrized kernel tests of test_devices.py, on LLVM ----------------

KERNEL_TESTS = [kernels.test_elementwise_add_float32, kernels.test_sum_reduction,
                kernels.test_signed_min_divided_by_minus_one_wraps, kernels.test_integer_wraparound_and_bit_ops,
                kernels.test_half_and_bfloat16_arithmetic_rounds_every_op, kernels.test_max_propagates_nan,
                kernels.test_gated_load_never_reads_out_of_range, kernels.test_define_var_sizes_and_order,
                kernels.test_float_math_functions, kernels.test_comparisons_where_and_bool_ops,
                kernels.test_bitcast, kernels.test_constants_render_exactly, kernels.test_empty_loop_and_gated_store,
                kernels.test_nested_ranges_with_the_same_loop_id_do_not_shadow,
                kernels.test_program_wait_returns_elapsed_time]

@pytest.mark.parametrize("kernel_test", KERNEL_TESTS, ids=[t.__name__ for t in KERNEL_TESTS])
def test_device_kernels(kernel_test):
  kernel_test("LLVM")

@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32])
def test_integer_division_truncates(dtype):
  kernels.test_integer_division_truncates("LLVM", dtype)

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_buffer_round_trips(dtype):
  kernels.test_buffer_round_trips("LLVM", dtype)

# ---------------- bit-exact agreement with the PYTHON reference ----------------

def same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
  """Equal raw bytes, except that any NaN matches any NaN (payloads are not part of the semantics)."""
  if got.dtype.kind == "f":
    nan = np.isnan(got) & np.isnan(want)
    got, want = np.where(nan, 0, got), np.where(nan, 0, want)
  np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=what)

CAST_INPUTS = {"float": kernels.CAST_SAFE_FLOATS + kernels.SPECIAL_FLOATS + [-1.5, -3e9, 3e9, 5e9, -7e18, 1.2e19, 2e19,
                                                                            448.0, 464.0, 57344.0, 61440.0, 2.0**-9],
               "int": kernels.INT_VALUES, "bool": [True, False, True, True]}

@pytest.mark.parametrize("src", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_every_cast_matches_python_bit_for_bit(src):
  """One kernel per source dtype casts edge values (NaN, inf, out of range, ties) to every dtype, incl. fp8."""
  values = CAST_INPUTS["float" if dtypes.is_float(src) else "int" if dtypes.is_int(src) else "bool"]
  raw, _ = kernels.representable(values, src) if src not in dtypes.fp8s else (np.arange(256, dtype=np.uint8), None)
  n = len(raw)
  x, outs = glob(0, src), [glob(i + 1, dst) for i, dst in enumerate(ALL_DTYPES)]
  uops = one_loop_kernel(n, lambda r: [store(o, r, cast(load(x, r), o.dtype) if o.dtype != src else load(x, r))
                                       for o in outs])
  buffers = [(src, raw)] + [zeros(dst, n) for dst in ALL_DTYPES]
  with np.errstate(all="ignore"):
    llvm, python = run("LLVM", uops, buffers)[1:], run("PYTHON", uops, buffers)[1:]
  for dst, got, want in zip(ALL_DTYPES, llvm, python): same_bits(got, want, f"{src} -> {dst}")

def test_float16_conversions_are_exact():
  """Every float16 pattern to float32, and doubles at, between and around every float16 value to float16
  (the double -> float16 path rounds once, through round-to-odd float32)."""
  patterns, doubles = kernels.half_conversion_inputs()
  half_in, f32_out = glob(0, dtypes.float16), glob(1, F32)
  double_in, half_out = glob(2, dtypes.float64), glob(3, dtypes.float16)
  to_float = one_loop_kernel(len(patterns), lambda r: [store(f32_out, r, cast(load(half_in, r), F32))])
  to_half = one_loop_kernel(len(doubles), lambda r: [store(half_out, r, cast(load(double_in, r), dtypes.float16))])
  got_float = run("LLVM", to_float, [(dtypes.float16, patterns), zeros(F32, len(patterns))])[1]
  got_half = run("LLVM", to_half, [(dtypes.float64, doubles), zeros(dtypes.float16, len(doubles))])[1]
  with np.errstate(over="ignore"): want_half = doubles.astype(np.float16)
  np.testing.assert_array_equal(got_float, patterns.view(np.float16).astype(np.float32))
  np.testing.assert_array_equal(got_half.view(np.uint16)[:-1], want_half.view(np.uint16)[:-1])
  assert np.isnan(got_half[-1])

ALU_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.FDIV, Ops.MOD, Ops.POW, Ops.IDIV,
           Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR]
FLOAT_OPERANDS = [0.0, -0.0, 1.0, -1.5, 0.1, 3.0, 1e30, -1e30, math.inf, -math.inf, math.nan, 2.0**-140, 65504.0]
INT_OPERANDS = [0, 1, -1, 7, -7, 3, 100, -128, 127, 255, 2**31 - 1, -2**31, 40000, 2**63 - 1]

@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != dtypes.bool], ids=lambda d: d.name)
def test_binary_ops_match_python_bit_for_bit(dtype):
  """Every binary ALU op defined on `dtype`, on all pairs of edge values, equals the PYTHON device's result."""
  is_float = dtypes.is_float(dtype)
  float_only, int_only = (Ops.FDIV, Ops.POW), (Ops.IDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR)
  ops = [op for op in ALU_OPS if op not in (int_only if is_float else float_only)]
  if dtype in dtypes.fp8s:   # every fp8 value against every other one (a shuffled copy)
    raw_a, raw_b = np.arange(256, dtype=np.uint8), np.random.default_rng(0).permutation(256).astype(np.uint8)
  else:
    values = FLOAT_OPERANDS if is_float else INT_OPERANDS
    raw_a, raw_b = (kernels.representable([pair[i] for pair in itertools.product(values, values)], dtype)[0]
                    for i in (0, 1))
  compare_with_python(dtype, [op for op in ops if op not in (Ops.SHL, Ops.SHR)], raw_a, raw_b)
  if not is_float:   # shift counts up to and past the width (never negative: Python raises on those)
    pairs = list(itertools.product(INT_OPERANDS, [0, 1, 3, 7, 8, 15, 16, 31, 32, 33, 63, 64]))
    raw_a, raw_b = (kernels.representable([pair[i] for pair in pairs], dtype)[0] for i in (0, 1))
    compare_with_python(dtype, [Ops.SHL, Ops.SHR], raw_a, raw_b)

def compare_with_python(dtype, ops: list[Ops], raw_a: np.ndarray, raw_b: np.ndarray) -> None:
  """One kernel storing `op(a, b)` for each op, run on LLVM and PYTHON: the results must be the same."""
  n = len(raw_a)
  x, y = glob(0, dtype), glob(1, dtype)
  outs = [glob(2 + i, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dtype) for i, op in enumerate(ops)]
  uops = one_loop_kernel(n, lambda r: [store(o, r, alu(op, load(x, r), load(y, r))) for o, op in zip(outs, ops)])
  buffers = [(dtype, raw_a), (dtype, raw_b)] + [zeros(o.dtype, n) for o in outs]
  with np.errstate(all="ignore"):
    llvm, python = run("LLVM", uops, buffers)[2:], run("PYTHON", uops, buffers)[2:]
  for op, got, want in zip(ops, llvm, python):
    if op is Ops.POW:   # libm's powf/pow against Python's double pow rounded to the type
      rtol = {F32: 1e-6, dtypes.float64: 1e-15}.get(dtype, 1e-2)
      np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, err_msg=f"{dtype} {op}")
    else: same_bits(got, want, f"{dtype} {op}")

def test_float_to_int_out_of_range_is_x86_integer_indefinite():
  """Out-of-range and NaN float -> int casts give what the C code gives on x86-64, never LLVM's poison."""
  values = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 1e19, 2.0**63, -2.0**63, 255.9, -1.0], np.float32)
  x = glob(0, F32)
  targets = [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]
  outs = [glob(1 + i, dt) for i, dt in enumerate(targets)]
  uops = one_loop_kernel(len(values), lambda r: [store(o, r, cast(load(x, r), o.dtype)) for o in outs])
  buffers = [(F32, values)] + [zeros(dt, len(values)) for dt in targets]
  for dt, got, want in zip(targets, run("LLVM", uops, buffers)[1:], run("PYTHON", uops, buffers)[1:]):
    np.testing.assert_array_equal(got, want, err_msg=str(dt))

# ---------------- Tensor ops on device="LLVM" (a representative subset of the op tests) ----------------

TENSOR_CASES = {
  "add_mul_broadcast": (lambda a, b: a * b + 1, lambda a, b: a * b + 1, [(3, 4), (4,)]),
  "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [(5, 7), (7, 3)]),
  "sum_max_axis": (lambda a: a.sum(axis=1) + a.max(axis=0)[:2], lambda a: a.sum(1) + a.max(0).values[:2], [(2, 5)]),
  "softmax": (lambda a: a.softmax(-1), lambda a: a.softmax(-1), [(3, 6)]),
  "exp_log_sin_sqrt": (lambda a: a.exp() + (a.abs() + 1).log() + a.sin() + a.abs().sqrt(),
                       lambda a: a.exp() + (a.abs() + 1).log() + a.sin() + a.abs().sqrt(), [(4, 4)]),
  "pad_shrink_flip": (lambda a: a.pad(((1, 2), (0, 1))).flip(0)[1:4], lambda a: F.pad(a, (0, 1, 1, 2)).flip(0)[1:4],
                      [(3, 3)]),
  "conv2d": (lambda x, w: x.conv2d(w, padding=1), lambda x, w: F.conv2d(x, w, padding=1), [(1, 2, 5, 5), (3, 2, 3, 3)]),
  "where_relu_clip": (lambda a: (a > 0).where(a, a * 0.1).relu().clip(0.1, 1.5),
                      lambda a: torch.where(a > 0, a, a * 0.1).relu().clip(0.1, 1.5), [(10,)]),
  "cumsum_argmax": (lambda a: a.cumsum(1) + a.argmax(1, keepdim=True).float(),
                    lambda a: a.cumsum(1) + a.argmax(1, keepdim=True).float(), [(3, 5)]),
}

@pytest.mark.parametrize("name", TENSOR_CASES)
def test_tensor_ops_against_torch(name):
  kiln_fn, torch_fn, shapes = TENSOR_CASES[name]
  check(kiln_fn, torch_fn, shapes, device="LLVM")

@pytest.mark.parametrize("dtype", ["float16", "int8", "int64", "uint8"])
def test_tensor_dtypes_against_torch(dtype):
  floating = "float" in dtype
  fn = (lambda a, b: (a * b + a).maximum(b)) if floating else (lambda a, b: a * b + a - b)
  check(fn, fn, [(4, 5), (4, 5)], dtype=dtype, grad=False, device="LLVM", low=-3 if dtype != "uint8" else 0, high=8)

def test_integer_division_and_shifts_on_tensors():
  a = np.array([7, -7, 9, -9, 0, 100], np.int32)
  b = np.array([2, 2, -4, -4, 3, 7], np.int32)
  ta, tb = Tensor(a, device="LLVM"), Tensor(b, device="LLVM")
  np.testing.assert_array_equal((ta // tb).numpy(), a // b)   # Tensor // and % floor, like Python and NumPy
  np.testing.assert_array_equal((ta % tb).numpy(), a % b)
  np.testing.assert_array_equal((ta << 3).numpy(), a << 3)
  np.testing.assert_array_equal((ta >> 1).numpy(), a >> 1)

@pytest.mark.parametrize("dt", [dtypes.fp8e4m3, dtypes.fp8e5m2], ids=lambda d: d.name)
def test_fp8_round_trip_matches_cpu(dt):
  xs = np.array([0.1, -1.0, 1.0625, 1.125, 448.0, 464.0, 465.0, 57344.0, 61440.0, 1e9, -np.inf, np.nan, 2.0 ** -9,
                 2.0 ** -17, -0.0], np.float32)
  got = Tensor(xs, device="LLVM").cast(dt).bitcast(dtypes.uint8).numpy()
  want = Tensor(xs, device="PYTHON").cast(dt).bitcast(dtypes.uint8).numpy()
  np.testing.assert_array_equal(got, want)
  values = Tensor(np.arange(256, dtype=np.uint8), device="LLVM").bitcast(dt)
  sums = (values.float() * 2 + 1).numpy()
  np.testing.assert_array_equal(sums, (Tensor(np.arange(256, dtype=np.uint8), device="PYTHON").bitcast(dt).float()
                                       * 2 + 1).numpy())

def test_negative_nan_keeps_its_sign():
  """-NaN renders as a negative quiet NaN: the fp8 value tables hold -NaN at the codes with the sign bit set, so a
  cast of -NaN to fp8 used to lose its sign (found by test_ops_dtype.py's fp8 NaN test on DEV=LLVM)."""
  negative_nan = math.copysign(math.nan, -1.0)
  assert float_literal(negative_nan) == "0xFFF8000000000000" and float_literal(math.nan) == "0x7FF8000000000000"
  for dt in (dtypes.fp8e4m3, dtypes.fp8e5m2):
    bits = Tensor([math.nan, negative_nan], device="LLVM").cast(dt).bitcast(dtypes.uint8).numpy()
    assert bits[0] < 0x80 and bits[1] >= 0x80, f"{dt}: NaN and -NaN became {bits}"

def test_copies_between_llvm_and_cpu():
  a = Tensor(np.arange(6, dtype=np.float32), device="LLVM")
  b = (a.to("CPU") + 1).to("LLVM") * 2
  assert b.device == "LLVM"
  np.testing.assert_array_equal(b.numpy(), (np.arange(6) + 1) * 2)

# ---------------- whole op test files under DEV=LLVM ----------------

# The op test files run here on LLVM as the default device, in one subprocess (about 40 s warm on 2 cores): the core
# op table, the losses that mix index tensors with float inputs, and every dtype's casts and arithmetic (where the
# LLVM path's vector and conversion code differs most from the C path's). The other op files pass too
# (`DEV=LLVM python -m pytest test/test_ops*.py`; docs/developer.md).
OP_TEST_FILES_ON_LLVM = ["test/test_ops.py", "test/test_ops_nn.py", "test/test_ops_dtype.py"]
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

@pytest.mark.skipif(Device.DEFAULT == "LLVM", reason="this run already has LLVM as the default device")
def test_op_test_files_pass_with_llvm_as_the_default_device():
  env = {**os.environ, "DEV": "LLVM"}
  for name in ("CPU", "PYTHON"): env.pop(name, None)   # these would pick another default device
  result = subprocess.run([sys.executable, "-m", "pytest", *OP_TEST_FILES_ON_LLVM, "-q", "-x", "-p", "no:cacheprovider"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, f"DEV=LLVM pytest {' '.join(OP_TEST_FILES_ON_LLVM)} failed:\n{result.stdout[-4000:]}"
  assert " passed" in result.stdout.splitlines()[-1]

# ---------------- the compiler ----------------

def add_kernel() -> list[UOp]:
  out, a = glob(0, F32), glob(1, F32)
  return one_loop_kernel(8, lambda r: [store(out, r, alu(Ops.ADD, load(a, r), const(1.0, F32)))])

def test_compile_cache_is_keyed_by_source_and_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  dev = Device["LLVM"]
  src = dev.renderer.render("cached_kernel", add_kernel())
  lib = dev.compiler.compile_cached(src)
  path = dev.compiler.cache_path(src)
  assert path.is_relative_to(kernel_cache_dir()) and path.read_bytes() == lib
  from kiln.runtime.ops_llvm import host_target_machine
  import llvmlite.binding as llvm
  key = dev.compiler.cache_key()
  assert llvm.get_host_cpu_name() in key and host_target_machine().triple in key
  monkeypatch.setattr(type(dev.compiler), "compile", lambda self, s: pytest.fail("cache hit expected"))
  assert dev.compiler.compile_cached(src) == lib
  program = dev.runtime("cached_kernel", lib)
  out = np.zeros(8, np.float32)
  program(out, np.arange(8, dtype=np.float32).view(np.uint8))
  np.testing.assert_array_equal(out, np.arange(8) + 1)

def test_invalid_ir_raises_compile_error_with_kernel_name():
  src = "define void @broken_kernel(ptr %data0) {\nentry:\n  store float %nothing, ptr %data0\n  ret void\n}\n"
  with pytest.raises(CompileError, match="broken_kernel"): Device["LLVM"].compiler.compile(src)

def test_renderer_rejects_what_it_cannot_render():
  out, a = glob(0, dtypes.int32), glob(1, dtypes.int32)
  bad_sqrt = one_loop_kernel(2, lambda r: [store(out, r, UOp(Ops.SQRT, dtypes.int32, (load(a, r),)))])
  with pytest.raises(TypeError, match="SQRT"): Device["LLVM"].renderer.render("bad", bad_sqrt)
  with pytest.raises(NotImplementedError, match="REDUCE"):
    Device["LLVM"].renderer.render("bad", [out, UOp(Ops.REDUCE, dtypes.int32, (const(1),), Ops.ADD)])

def test_missing_llvmlite_gives_a_clear_error(monkeypatch):
  from kiln.runtime import ops_llvm
  monkeypatch.setitem(sys.modules, "llvmlite.binding", None)   # makes `import llvmlite.binding` fail
  with pytest.raises(RuntimeError, match="pip install"): ops_llvm.LLVMDevice("LLVM:9")

def test_kernels_use_the_large_code_model():
  # the JIT's linker may place a kernel's code and its constant pools more than 2 GiB apart in a process that has
  # mapped a lot (DISK tensors, many libraries): 32-bit PC-relative references then overflowed and aborted the
  # process (seen under CC=clang-19 in test/runtime); the large code model addresses them with 64 bits
  import mmap
  from kiln.runtime import ops_llvm
  assert ops_llvm.CODE_MODEL == "large" and "large" in Device["LLVM"].compiler.cache_key()
  reserve = mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0),
                      prot=0)   # PROT_NONE: address space only, so later mappings land farther apart
  try:
    x = Tensor(np.arange(64, dtype=np.float32), device="LLVM")
    np.testing.assert_allclose(((x * 1.5 + 0.25).exp2()).numpy(), np.exp2(np.arange(64) * 1.5 + 0.25), rtol=1e-6)
  finally: reserve.close()
