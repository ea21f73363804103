"""LLVMRenderer: a linearized kernel (docs/ir.md, stage 4) becomes one LLVM IR function, for the LLVM device.

The generated code has the semantics of the C kernels (kiln/renderer/cstyle.py), value for value:
- integer IDIV/MOD truncate toward zero; a zero divisor gives 0 and `MIN // -1` wraps (no trap, no poison);
- signed integer arithmetic wraps; a shift by the width or more gives 0 (or the sign bits for a signed right shift),
  as in the PYTHON reference and C for types narrower than int, never LLVM's poison;
- float16, bfloat16 and fp8 are stored as their bits and computed in `float`, every op's result rounded to the type
  (nearest-even). float16 uses LLVM's `half` conversions (F16C on x86); a float64/integer value goes to float16 through
  float with round-to-odd, which rounds once. bfloat16 and fp8 conversions are integer code in helper functions
  (no library calls, so nothing depends on compiler-rt);
- float -> integer conversion gives x86's 'integer indefinite' value out of range (as the C code does on x86-64),
  not LLVM poison;
- MAX returns NaN when either float operand is NaN; `!=` on floats is unordered; CAST to bool is `!= 0`;
- a gated LOAD/STORE touches memory only when its gate holds (a branch, never a speculated read).

Loops are `phi`-counted blocks; accumulators live in allocas that LLVM's mem2reg turns into registers. No fast-math
flags are used: results must match the C and PYTHON devices bit for bit.

Speed comes from what the C path has too: the upcast lanes become vector uops (kiln/codegen/vectorize.py, the same
pass and thread-plan check as for the C renderer: kiln/codegen/pipeline.py), rendered as LLVM vectors
(`<16 x float>`, bool lanes `<16 x i1>`); a row of gated loads of consecutive elements (a padded window) is one
`llvm.masked.load`; buffers are `noalias`; a quantized dot product's DP4A is the target's byte dot-product instruction (`byte_dot_method`: VNNI's vpdpbusd, or
pmaddubsw); a thread-split matrix-vector loop prefetches its streamed rows; and kernels run split across the thread
pool as the C kernels do (`_LLVMKernelWriter`'s docstring; kiln/runtime/ops_llvm.py compiles for the host CPU at O3).
The CPU device uses this renderer too, with CPU_LLVM=1 or where no C compiler is found (kiln/runtime/ops_cpu.py).
"""
from __future__ import annotations
import math, struct
from dataclasses import dataclass
from typing import Callable
from kiln.dtype import DType, dtypes, truncate, FP8_VALUES
from kiln.renderer import ONE_THREAD, KernelWriter, Renderer, ThreadPlan, kernel_signature, kernel_function_name
from kiln.uop.mathforms import cos_argument, exp_argument, tan_argument
from kiln.renderer.cstyle import (EXACT_FLOAT_OPS, PREFETCH_BYTES, PREFETCH_MAX_BLOCK, SCRATCH_HEADER_BYTES,
                                  check_alu_dtypes, chunks_symbol, scratch_symbol, task_symbol, work_symbol)
from kiln.uop.ops import UOp, Ops, GroupOp

FULL_UNROLL_MAX_TRIPS = 16   # loops up to this many iterations may be unrolled whole by LLVM (_LLVMKernelWriter)
SMALL_FLOATS = (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s)   # stored as bits, computed in float
# the LLVM type a value of each dtype lives in while computing, and the type it is stored as in a buffer
VALUE_TYPES: dict[DType, str] = {
  dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16",
  dtypes.int32: "i32", dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64", dtypes.float32: "float",
  dtypes.float64: "double", **{dt: "float" for dt in SMALL_FLOATS}}
STORAGE_TYPES: dict[DType, str] = {**VALUE_TYPES, dtypes.bool: "i8", dtypes.float16: "i16", dtypes.bfloat16: "i16",
                                   dtypes.fp8e4m3: "i8", dtypes.fp8e5m2: "i8"}

def _is_signed(dtype: DType) -> bool: return dtypes.is_int(dtype) and not dtypes.is_unsigned(dtype)

def float_literal(value: float) -> str:
  """An LLVM float/double literal: the exact bits of `value` as a hex double (LLVM's form for both types).

  A NaN becomes the quiet NaN of its sign: a payload in the low bits would not fit a float, and the sign must survive
  (fp8 tables hold -NaN at the codes with the sign bit set, and a cast of -NaN to fp8 keeps it).
  """
  if math.isnan(value): return "0xFFF8000000000000" if math.copysign(1.0, value) < 0 else "0x7FF8000000000000"
  return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"

def render_llvm_const(value, dtype: DType) -> str:
  """An LLVM literal for `value` rounded to `dtype` (in its value type: i1, iN, float or double)."""
  value = truncate(dtype, value)
  if dtype == dtypes.bool: return "true" if value else "false"
  if dtypes.is_int(dtype):   # the bits as a signed number, which LLVM's parser accepts for any width
    return str(value - (1 << dtype.bitsize) if value >= 1 << (dtype.bitsize - 1) else value)
  if dtypes.is_float(dtype): return float_literal(value)
  raise TypeError(f"LLVMRenderer: cannot render a constant of dtype {dtype}")

# ---------------- helper functions included in a module when used ----------------

HELPER_ATTRS = "alwaysinline nounwind"
BF16_HELPERS = f"""\
define private float @kiln_bf16_to_f(i16 %bits) {HELPER_ATTRS} {{
  %wide = zext i16 %bits to i32
  %high = shl i32 %wide, 16
  %value = bitcast i32 %high to float
  ret float %value
}}
define private i16 @kiln_bf16_from_f(float %value) {HELPER_ATTRS} {{
  %bits = bitcast float %value to i32
  %magnitude = and i32 %bits, 2147483647
  %is_nan = icmp ugt i32 %magnitude, 2139095040
  %high = lshr i32 %bits, 16
  %quiet = or i32 %high, 64
  %odd = and i32 %high, 1
  %bias = add i32 %odd, 32767
  %biased = add i32 %bits, %bias
  %rounded = lshr i32 %biased, 16
  %result = select i1 %is_nan, i32 %quiet, i32 %rounded
  %narrow = trunc i32 %result to i16
  ret i16 %narrow
}}
define private float @kiln_bf16_round(float %value) {HELPER_ATTRS} {{
  %bits = call i16 @kiln_bf16_from_f(float %value)
  %rounded = call float @kiln_bf16_to_f(i16 %bits)
  ret float %rounded
}}
"""

# a double rounded to float with round-to-odd keeps enough bits that rounding it to half afterwards rounds only once
HALF_HELPERS = f"""\
define private float @kiln_half_round_f(float %value) {HELPER_ATTRS} {{
  %half = fptrunc float %value to half
  %rounded = fpext half %half to float
  ret float %rounded
}}
define private float @kiln_half_round_d(double %value) {HELPER_ATTRS} {{
  %nearest = fptrunc double %value to float
  %back = fpext float %nearest to double
  %exact = fcmp oeq double %back, %value
  %bits = bitcast float %nearest to i32
  %back_magnitude = call double @llvm.fabs.f64(double %back)
  %magnitude = call double @llvm.fabs.f64(double %value)
  %rounded_away = fcmp ogt double %back_magnitude, %magnitude
  %toward_zero_bits = add i32 %bits, -1
  %truncated = select i1 %rounded_away, i32 %toward_zero_bits, i32 %bits
  %odd = or i32 %truncated, 1
  %result_bits = select i1 %exact, i32 %bits, i32 %odd
  %odd_float = bitcast i32 %result_bits to float
  %rounded = call float @kiln_half_round_f(float %odd_float)
  ret float %rounded
}}
"""

# double -> fp8 bits, nearest-even, finite overflow saturating (kiln/dtype.py); {name} {man} {min_exp} and the codes
FP8_BITS_TEMPLATE = """\
define private i8 @kiln_{name}_bits(double %value) {attrs} {{
  %bits = bitcast double %value to i64
  %sign_wide = lshr i64 %bits, 56
  %sign_byte = trunc i64 %sign_wide to i8
  %sign = and i8 %sign_byte, -128
  %magnitude = and i64 %bits, 9223372036854775807
  %is_nan = icmp ugt i64 %magnitude, 9218868437227405312
  %is_inf = icmp eq i64 %magnitude, 9218868437227405312
  %biased_exp = lshr i64 %magnitude, 52
  %exp = add i64 %biased_exp, -1023
  %too_small = icmp slt i64 %exp, {underflow_exp}
  %too_big = icmp sgt i64 %exp, 16
  %fraction = and i64 %magnitude, 4503599627370495
  %mantissa = or i64 %fraction, 4503599627370496
  %subnormal = icmp slt i64 %exp, {min_exp}
  %extra = sub i64 {min_exp}, %exp
  %extra_shift = select i1 %subnormal, i64 %extra, i64 0
  %wide_shift = add i64 %extra_shift, {drop_bits}
  %shift = call i64 @llvm.umin.i64(i64 %wide_shift, i64 63)
  %kept = lshr i64 %mantissa, %shift
  %one_shifted = shl i64 1, %shift
  %rest_mask = add i64 %one_shifted, -1
  %rest = and i64 %mantissa, %rest_mask
  %halfway = lshr i64 %one_shifted, 1
  %above = icmp ugt i64 %rest, %halfway
  %tie = icmp eq i64 %rest, %halfway
  %kept_odd_bit = trunc i64 %kept to i1
  %tie_up = and i1 %tie, %kept_odd_bit
  %round_up = or i1 %above, %tie_up
  %increment = zext i1 %round_up to i64
  %rounded = add i64 %kept, %increment
  %exp_field = sub i64 %exp, {min_exp_minus_one}
  %exp_code = shl i64 %exp_field, {man}
  %normal_sum = add i64 %exp_code, %rounded
  %normal = sub i64 %normal_sum, {implicit_one}
  %code = select i1 %subnormal, i64 %rounded, i64 %normal
  %saturated = call i64 @llvm.umin.i64(i64 %code, i64 {max_code})
  %c1 = select i1 %too_big, i64 {max_code}, i64 %saturated
  %c2 = select i1 %too_small, i64 0, i64 %c1
  %c3 = select i1 %is_inf, i64 {inf_code}, i64 %c2
  %c4 = select i1 %is_nan, i64 {nan_code}, i64 %c3
  %code_byte = trunc i64 %c4 to i8
  %result = or i8 %code_byte, %sign
  ret i8 %result
}}
define private float @kiln_{name}_to_f(i8 %bits) {attrs} {{
  %index = zext i8 %bits to i64
  %pointer = getelementptr inbounds [256 x float], ptr @kiln_{name}_values, i64 0, i64 %index
  %value = load float, ptr %pointer
  ret float %value
}}
define private float @kiln_{name}_round(double %value) {attrs} {{
  %bits = call i8 @kiln_{name}_bits(double %value)
  %rounded = call float @kiln_{name}_to_f(i8 %bits)
  ret float %rounded
}}
"""
# per fp8 dtype: (mantissa bits, smallest normal exponent, largest finite code, NaN code, inf code (max if none))
FP8_FORMATS = {dtypes.fp8e4m3: (3, -6, 0x7E, 0x7F, 0x7E), dtypes.fp8e5m2: (2, -14, 0x7B, 0x7E, 0x7C)}

def fp8_helpers(dtype: DType) -> str:
  """The value table and the three conversion functions (bits, to float, round) of one fp8 dtype."""
  man, min_exp, max_code, nan_code, inf_code = FP8_FORMATS[dtype]
  table = ", ".join(f"float {float_literal(v)}" for v in FP8_VALUES[dtype])
  functions = FP8_BITS_TEMPLATE.format(
    name=dtype.name, attrs=HELPER_ATTRS, man=man, min_exp=min_exp, underflow_exp=min_exp - man - 1,
    drop_bits=52 - man, min_exp_minus_one=min_exp - 1, implicit_one=1 << man, max_code=max_code,
    nan_code=nan_code, inf_code=inf_code)
  return f"@kiln_{dtype.name}_values = private unnamed_addr constant [256 x float] [{table}]\n{functions}"

# the helper group (`kiln_<group>_...` functions) each small float needs
HELPER_GROUPS = {dtypes.bfloat16: "bf16", dtypes.float16: "half", **{dt: dt.name for dt in dtypes.fp8s}}

# ---------------- ALU and conversions ----------------
# Vector uops (kiln/codegen/vectorize.py) are rendered as LLVM vector types, `<8 x float>`, with bool lanes as i1
# (what a vector compare gives and a vector select takes), so every handler below types its operands with ll_type.

def ll_type(dtype: DType) -> str:
  """The LLVM type a value of `dtype` is computed in: a scalar type, or `<n x T>` for a vector dtype."""
  if dtype.count > 1: return f"<{dtype.count} x {VALUE_TYPES[dtype.scalar]}>"
  return VALUE_TYPES[dtype]

def ll_const(value, dtype: DType) -> str:
  """A literal of `dtype` (rounded to it): for a vector dtype, `value` in every lane, or one value per lane (tuple)."""
  if dtype.count == 1: return render_llvm_const(value, dtype)
  lanes = value if isinstance(value, tuple) else (value,) * dtype.count
  lane_type = VALUE_TYPES[dtype.scalar]
  return "<" + ", ".join(f"{lane_type} {render_llvm_const(v, dtype.scalar)}" for v in lanes) + ">"

def _like(dtype: DType, scalar: DType) -> DType:
  """`scalar` with as many lanes as `dtype` (a conversion's or a comparison's result type)."""
  return scalar.vec(dtype.count) if dtype.count > 1 else scalar

def _const_lanes(u: UOp) -> tuple | None:
  """The lane values of a scalar or vector CONST, else None."""
  if u.op is not Ops.CONST: return None
  return tuple(u.arg) if u.dtype.count > 1 else (u.arg,)

def _element_offset(index: UOp) -> tuple[UOp | None, int]:
  """`base + c` -> (base, c); a constant index -> (None, c); anything else -> (index, 0)."""
  if index.op is Ops.CONST and isinstance(index.arg, int): return None, index.arg
  if index.op is Ops.ADD:
    for base, offset in (index.src, index.src[::-1]):
      if offset.op is Ops.CONST and isinstance(offset.arg, int): return base, offset.arg
  return index, 0

def _gated_row(u: UOp) -> bool:
  """Whether VECTORIZE `u` gathers gated 32-bit loads of consecutive elements of one buffer (one masked load)."""
  first = u.src[0]
  if first.op is not Ops.LOAD or len(first.src) != 3 or first.dtype not in (dtypes.float32, dtypes.int32,
                                                                            dtypes.uint32): return False
  if any(s.op is not Ops.LOAD or len(s.src) != 3 or s.src[0] is not first.src[0] for s in u.src): return False
  parts = [_element_offset(s.src[1]) for s in u.src]
  return all(base is parts[0][0] and offset == parts[0][1] + k for k, (base, offset) in enumerate(parts))

def _float_suffix(dtype: DType) -> str: return "f64" if dtype == dtypes.float64 else "f32"

def _intrinsic(name: str) -> Callable[[_LLVMKernelWriter, UOp, list[str]], str]:
  """An LLVM math intrinsic in the precision of the operands (double for float64, float otherwise)."""
  def render(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
    ty = VALUE_TYPES[u.src[0].dtype]
    return w.call(f"llvm.{name}.{_float_suffix(u.src[0].dtype)}", ty, [(ty, x) for x in a])
  return render

def _fma(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  """MULACC: llvm.fma, lane by lane for a vector (one rounding per lane)."""
  ty, suffix = ll_type(u.dtype), _float_suffix(u.dtype.scalar)
  return w.call(f"llvm.fma.{f'v{u.dtype.count}' if u.dtype.count > 1 else ''}{suffix}", ty, [(ty, x) for x in a])

def _no_signed_wrap(u: UOp) -> bool:
  """Whether value ranges prove a signed integer op cannot overflow (then `nsw` helps LLVM vectorize indexing)."""
  if u.dtype.count > 1 or not _is_signed(u.dtype): return False   # vector uops carry no value ranges of their lanes
  try: lo, hi = u.vmin, u.vmax
  except Exception: return False
  return (lo, hi) != (dtypes.min(u.dtype), dtypes.max(u.dtype))   # value ranges give the full range on overflow

def _arith(int_op: str, float_op: str, bool_op: str) -> Callable[[_LLVMKernelWriter, UOp, list[str]], str]:
  def render(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
    ty, lane = ll_type(u.dtype), u.dtype.scalar
    if dtypes.is_float(lane): return w.inst(f"{float_op} {ty} {a[0]}, {a[1]}")
    if lane == dtypes.bool: return w.inst(f"{bool_op} {ty} {a[0]}, {a[1]}")
    flags = " nsw" if _no_signed_wrap(u) else ""
    return w.inst(f"{int_op}{flags} {ty} {a[0]}, {a[1]}")
  return render

def _bitwise(op: str) -> Callable[[_LLVMKernelWriter, UOp, list[str]], str]:
  return lambda w, u, a: w.inst(f"{op} {ll_type(u.dtype)} {a[0]}, {a[1]}")

def _compare(signed: str, unsigned: str, ordered_float: str) -> Callable[[_LLVMKernelWriter, UOp, list[str]], str]:
  def render(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
    operand = u.src[0].dtype
    ty, lane = ll_type(operand), operand.scalar
    if dtypes.is_float(lane): return w.inst(f"fcmp {ordered_float} {ty} {a[0]}, {a[1]}")
    return w.inst(f"icmp {signed if _is_signed(lane) else unsigned} {ty} {a[0]}, {a[1]}")
  return render

def _is_safe_divisor(u: UOp) -> bool:
  """A constant divisor (every lane of a vector one) that can neither be 0 nor -1, so the division needs no guard."""
  lanes = _const_lanes(u)
  return lanes is not None and all(v not in (0, -1) for v in lanes)

def _int_division(w: _LLVMKernelWriter, u: UOp, a: list[str], remainder: bool) -> str:
  """Truncating division or remainder; a zero divisor gives 0, `x // -1` is `-x` (wrapping), `x % -1` is 0."""
  ty, signed, mask = ll_type(u.dtype), _is_signed(u.dtype.scalar), ll_type(_like(u.dtype, dtypes.bool))
  op = ("srem" if signed else "urem") if remainder else ("sdiv" if signed else "udiv")
  if _is_safe_divisor(u.src[1]) and (signed or all(v > 0 for v in _const_lanes(u.src[1]) or ())):
    return w.inst(f"{op} {ty} {a[0]}, {a[1]}")
  zero, one = ll_const(0, u.dtype), ll_const(1, u.dtype)
  is_zero = w.inst(f"icmp eq {ty} {a[1]}, {zero}")
  if not signed:
    divisor = w.inst(f"select {mask} {is_zero}, {ty} {one}, {ty} {a[1]}")
    result = w.inst(f"{op} {ty} {a[0]}, {divisor}")
    return w.inst(f"select {mask} {is_zero}, {ty} {zero}, {ty} {result}")
  is_minus_one = w.inst(f"icmp eq {ty} {a[1]}, {ll_const(-1, u.dtype)}")
  unsafe = w.inst(f"or {mask} {is_zero}, {is_minus_one}")
  divisor = w.inst(f"select {mask} {unsafe}, {ty} {one}, {ty} {a[1]}")
  result = w.inst(f"{op} {ty} {a[0]}, {divisor}")   # dividing by 1 gives x, and x % 1 gives 0: right for -1 too
  if remainder: return w.inst(f"select {mask} {is_zero}, {ty} {zero}, {ty} {result}")
  negated = w.inst(f"sub {ty} {zero}, {a[0]}")
  by_minus_one = w.inst(f"select {mask} {is_minus_one}, {ty} {negated}, {ty} {result}")
  return w.inst(f"select {mask} {is_zero}, {ty} {zero}, {ty} {by_minus_one}")

def _idiv(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str: return _int_division(w, u, a, remainder=False)

def _mod(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  if dtypes.is_float(u.dtype.scalar): return w.inst(f"frem {ll_type(u.dtype)} {a[0]}, {a[1]}")   # frem is C's fmod
  return _int_division(w, u, a, remainder=True)

def _max(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  ty, lane, mask = ll_type(u.dtype), u.dtype.scalar, ll_type(_like(u.dtype, dtypes.bool))
  if lane == dtypes.bool: return w.inst(f"or {ty} {a[0]}, {a[1]}")
  if dtypes.is_float(lane):   # (a != a || a > b) ? a : b, as the C code
    is_nan = w.inst(f"fcmp uno {ty} {a[0]}, {a[0]}")
    greater = w.inst(f"fcmp ogt {ty} {a[0]}, {a[1]}")
    take_first = w.inst(f"or {mask} {is_nan}, {greater}")
  else: take_first = w.inst(f"icmp {'sgt' if _is_signed(lane) else 'ugt'} {ty} {a[0]}, {a[1]}")
  return w.inst(f"select {mask} {take_first}, {ty} {a[0]}, {ty} {a[1]}")

def _shift(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  """A shift by any count, as the PYTHON reference does it: bits shifted past the width are gone (a count >= the width
  gives 0, or the sign for an arithmetic right shift) instead of LLVM's poison."""
  ty, width, mask = ll_type(u.dtype), u.dtype.scalar.bitsize, ll_type(_like(u.dtype, dtypes.bool))
  op = "shl" if u.op is Ops.SHL else ("ashr" if _is_signed(u.dtype.scalar) else "lshr")
  counts = _const_lanes(u.src[1])
  if counts is not None and all(0 <= c < width for c in counts): return w.inst(f"{op} {ty} {a[0]}, {a[1]}")
  too_far = w.inst(f"icmp uge {ty} {a[1]}, {ll_const(width, u.dtype)}")
  count = w.inst(f"select {mask} {too_far}, {ty} {ll_const(width - 1, u.dtype)}, {ty} {a[1]}")
  shifted = w.inst(f"{op} {ty} {a[0]}, {count}")
  return shifted if op == "ashr" else w.inst(f"select {mask} {too_far}, {ty} {ll_const(0, u.dtype)}, {ty} {shifted}")

def _recip(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  return w.inst(f"fdiv {ll_type(u.dtype)} {ll_const(1.0, u.dtype)}, {a[0]}")

def _neg(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  if dtypes.is_float(u.dtype.scalar): return w.inst(f"fneg {ll_type(u.dtype)} {a[0]}")
  if u.dtype.scalar == dtypes.bool: return a[0]
  return w.inst(f"sub {ll_type(u.dtype)} {ll_const(0, u.dtype)}, {a[0]}")

def _trunc(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  return _intrinsic("trunc")(w, u, a) if dtypes.is_float(u.dtype) else a[0]

def _where(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  ty = ll_type(u.dtype)
  return w.inst(f"select {ll_type(u.src[0].dtype)} {a[0]}, {ty} {a[1]}, {ty} {a[2]}")

def _int_to_float(w: _LLVMKernelWriter, x: str, src: DType, to_type: str) -> str:
  op = "sitofp" if _is_signed(src.scalar) else "uitofp"
  return w.inst(f"{op} {ll_type(src)} {x} to {to_type}")

def _to_double(w: _LLVMKernelWriter, x: str, src: DType) -> str:
  """Any non-bool value as a double (exact for floats; integers rounded as C's (double) cast)."""
  if src == dtypes.float64: return x
  if dtypes.is_float(src): return w.inst(f"fpext float {x} to double")
  return _int_to_float(w, x, src, "double")

def _to_float(w: _LLVMKernelWriter, x: str, src: DType) -> str:
  """Any non-bool value (or vector of them) as float lanes (C's (float) cast)."""
  if src.scalar == dtypes.float64: return w.inst(f"fptrunc {ll_type(src)} {x} to {ll_type(_like(src, dtypes.float32))}")
  if dtypes.is_float(src.scalar): return x
  return _int_to_float(w, x, src, ll_type(_like(src, dtypes.float32)))

def _float_to_int(w: _LLVMKernelWriter, x: str, src: DType, dst: DType) -> str:
  """C's float -> integer conversion as compiled for x86-64: truncation through a 32- or 64-bit conversion whose
  out-of-range (and NaN) result is the 'integer indefinite' value, then wrapped to `dst` (see _f2i in python.py).
  Vector lanes convert the same way, lane by lane."""
  fty, mask = ll_type(src), ll_type(_like(src, dtypes.bool))
  # the limits in the type the value is computed in: rounded to a small float's own dtype, 2**31 would saturate
  computed = _like(src, dtypes.float64 if src.scalar == dtypes.float64 else dtypes.float32)
  wide = 64 if dst.scalar.bitsize == 64 or dst.scalar == dtypes.uint32 else 32
  wide_dtype = _like(src, dtypes.int64 if wide == 64 else dtypes.int32)
  wty = ll_type(wide_dtype)
  low, high, indefinite = -(2.0 ** (wide - 1)), 2.0 ** (wide - 1), -(1 << (wide - 1))
  in_range = w.inst(f"and {mask} {w.inst(f'fcmp oge {fty} {x}, {ll_const(low, computed)}')}, "
                    f"{w.inst(f'fcmp olt {fty} {x}, {ll_const(high, computed)}')}")
  converted = w.inst(f"fptosi {fty} {x} to {wty}")   # poison when out of range, but then not selected
  fallback = ll_const(indefinite, wide_dtype)
  if dst == dtypes.uint64:   # [2**63, 2**64) converts through the unsigned instruction sequence
    unsigned_range = w.inst(f"and i1 {w.inst(f'fcmp oge {fty} {x}, {float_literal(0.0)}')}, "
                            f"{w.inst(f'fcmp olt {fty} {x}, {float_literal(2.0 ** 64)}')}")
    unsigned = w.inst(f"fptoui {fty} {x} to i64")
    fallback = w.inst(f"select i1 {unsigned_range}, i64 {unsigned}, i64 {indefinite}")
  result = w.inst(f"select {mask} {in_range}, {wty} {converted}, {wty} {fallback}")
  return result if dst.scalar.bitsize == wide else w.inst(f"trunc {wty} {result} to {ll_type(dst)}")

def _cast(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  src, dst, x = u.src[0].dtype, u.dtype, a[0]
  if src == dst: return x
  sty, dty, source, target = ll_type(src), ll_type(dst), src.scalar, dst.scalar
  if target == dtypes.bool:
    if dtypes.is_float(source): return w.inst(f"fcmp une {sty} {x}, {ll_const(0.0, src)}")
    return w.inst(f"icmp ne {sty} {x}, {ll_const(0, src)}")
  if source == dtypes.bool:
    return w.inst(f"zext {sty} {x} to {dty}") if dtypes.is_int(target) else w.inst(f"uitofp {sty} {x} to {dty}")
  if dst in dtypes.fp8s: return w.call(f"kiln_{dst.name}_round", "float", [("double", _to_double(w, x, src))])
  if dst == dtypes.bfloat16: return w.call("kiln_bf16_round", "float", [("float", _to_float(w, x, src))])
  if dst == dtypes.float16:
    if dtypes.is_float(src) and src != dtypes.float64: return w.call("kiln_half_round_f", "float", [("float", x)])
    return w.call("kiln_half_round_d", "float", [("double", _to_double(w, x, src))])
  if dtypes.is_int(target):
    if dtypes.is_float(source): return _float_to_int(w, x, src, dst)
    if source.bitsize == target.bitsize: return x
    if source.bitsize > target.bitsize: return w.inst(f"trunc {sty} {x} to {dty}")
    return w.inst(f"{'sext' if _is_signed(source) else 'zext'} {sty} {x} to {dty}")
  if dst == dtypes.float64: return _to_double(w, x, src)
  return _to_float(w, x, src)   # float32 (lanes)

def _to_storage(w: _LLVMKernelWriter, x: str, dtype: DType) -> str:
  """A value of `dtype` as the bits it is stored as (bool as a byte, small floats as their bit patterns)."""
  if dtype == dtypes.bool: return w.inst(f"zext i1 {x} to i8")
  if dtype == dtypes.float16: return w.inst(f"bitcast half {w.inst(f'fptrunc float {x} to half')} to i16")
  if dtype == dtypes.bfloat16: return w.call("kiln_bf16_from_f", "i16", [("float", x)])
  if dtype in dtypes.fp8s: return w.call(f"kiln_{dtype.name}_bits", "i8", [("double", _to_double(w, x, dtype))])
  return x

def _from_storage(w: _LLVMKernelWriter, bits: str, dtype: DType) -> str:
  """The value of `dtype` that stored `bits` stand for (the inverse of _to_storage)."""
  if dtype == dtypes.bool: return w.inst(f"icmp ne i8 {bits}, 0")
  if dtype == dtypes.float16: return w.inst(f"fpext half {w.inst(f'bitcast i16 {bits} to half')} to float")
  if dtype == dtypes.bfloat16: return w.call("kiln_bf16_to_f", "float", [("i16", bits)])
  if dtype in dtypes.fp8s: return w.call(f"kiln_{dtype.name}_to_f", "float", [("i8", bits)])
  return bits

def _bitcast(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  src, dst = u.src[0].dtype, u.dtype
  if dtypes.bool in (src.scalar, dst.scalar) or src.itemsize != dst.itemsize:
    raise TypeError(f"LLVMRenderer: cannot BITCAST {src} to {dst} (sizes must match and bool is not allowed)")
  if src.count > 1: return w.inst(f"bitcast {ll_type(src)} {a[0]} to {ll_type(dst)}")   # 32-bit lanes: stored as is
  bits, sty, dty = _to_storage(w, a[0], src), STORAGE_TYPES[src], STORAGE_TYPES[dst]
  if sty != dty: bits = w.inst(f"bitcast {sty} {bits} to {dty}")
  return _from_storage(w, bits, dst)

# ---------------- integer dot products of bytes (DP4A, kiln/codegen/vectorize.py) ----------------
# x86 instructions by int32 lanes, chosen from the target's features (cpuinfo spellings; kiln/runtime/cpu_target.py):
# VNNI's vpdpbusd (any unsigned byte by a signed one), else, when every unsigned byte is below 128 (DP4A's arg),
# pmaddubsw's int16 sums of two products then pmaddwd by ones; anything else widens, multiplies and sums lane groups,
# which is exact too. The intrinsics take their byte vectors as i32 lanes (LLVM >= 22 upgrades them to i8 vectors).
_VNNI_FEATURES = {16: (("avx512_vnni",),), 8: (("avx512_vnni", "avx512vl"), ("avx_vnni",)),
                  4: (("avx512_vnni", "avx512vl"), ("avx_vnni",))}
_VNNI_INTRINSIC = {16: "llvm.x86.avx512.vpdpbusd.512", 8: "llvm.x86.avx512.vpdpbusd.256",
                   4: "llvm.x86.avx512.vpdpbusd.128"}
_MADDUBS = {16: ("avx512bw", "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
            8: ("avx2", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
            4: ("ssse3", "llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd")}

def byte_dot_method(u: UOp, features: frozenset[str]) -> str:
  """How DP4A `u` is computed on a CPU with `features`: "vnni", "maddubs" or "generic" (see above)."""
  n, pairs = u.dtype.count, (len(u.src) - 1) // 2
  unsigned_by_signed = all(u.src[1 + 2 * p].dtype.scalar == dtypes.uint8 and
                           u.src[2 + 2 * p].dtype.scalar == dtypes.int8 for p in range(pairs))
  if not unsigned_by_signed: return "generic"
  if any(all(f in features for f in need) for need in _VNNI_FEATURES.get(n, ())): return "vnni"
  if u.arg and n in _MADDUBS and _MADDUBS[n][0] in features: return "maddubs"
  return "generic"

def _dp4a(w: _LLVMKernelWriter, u: UOp, a: list[str]) -> str:
  """DP4A: int32 lane l of the accumulator a[0] plus, for each byte-vector pair, the sum of the products of bytes
  4l..4l+3 (each widened by its own signedness); a 4-byte operand is those 4 bytes in every lane."""
  n, ty = u.dtype.count, ll_type(u.dtype)
  def operand(src: UOp, value: str) -> tuple[DType, str]:
    """(the byte vector's dtype, its value): a 4-byte operand splat to the pair's width as one i32."""
    if n == 1 or src.dtype.count != 4: return src.dtype, value
    word = w.inst(f"bitcast {ll_type(src.dtype)} {value} to i32")
    lane = w.inst(f"insertelement {ty} poison, i32 {word}, i32 0")
    splat = w.inst(f"shufflevector {ty} {lane}, {ty} poison, <{n} x i32> zeroinitializer")
    wide = src.dtype.scalar.vec(4 * n)
    return wide, w.inst(f"bitcast {ty} {splat} to {ll_type(wide)}")
  pairs = [(*operand(u.src[1 + 2 * p], a[1 + 2 * p]), *operand(u.src[2 + 2 * p], a[2 + 2 * p]))
           for p in range((len(u.src) - 1) // 2)]
  method, acc = byte_dot_method(u, w.features), a[0]
  for left, x, right, y in pairs:
    bytes_type = ll_type(left)
    if method == "vnni":
      x, y = (w.inst(f"bitcast {bytes_type} {v} to {ty}") for v in (x, y))
      acc = w.call(_VNNI_INTRINSIC[n], ty, [(ty, acc), (ty, x), (ty, y)])
    elif method == "maddubs":
      _, pair_sums, quad_sums = _MADDUBS[n]
      shorts = f"<{2 * n} x i16>"
      summed = w.call(pair_sums, shorts, [(bytes_type, x), (bytes_type, y)])
      quads = w.call(quad_sums, ty, [(shorts, summed), (shorts, ll_const(1, dtypes.int16.vec(2 * n)))])
      acc = w.inst(f"add {ty} {acc}, {quads}")
    else:
      wide = f"<{4 * n} x i32>"
      x, y = (w.inst(f"{'zext' if dtype.scalar == dtypes.uint8 else 'sext'} {bytes_type} {v} to {wide}")
              for dtype, v in ((left, x), (right, y)))
      products = w.inst(f"mul {wide} {x}, {y}")
      for k in range(4):
        lanes = ", ".join(f"i32 {4 * lane + k}" for lane in range(n))
        group = w.inst(f"shufflevector {wide} {products}, {wide} poison, <{n} x i32> <{lanes}>")
        acc = w.inst(f"add {ty} {acc}, {group}")
  return acc

# Op -> function(writer, uop, operand values) -> the result value (float16/bfloat16/fp8 operands are floats)
LLVM_EXPRESSIONS: dict[Ops, Callable[[_LLVMKernelWriter, UOp, list[str]], str]] = {
  Ops.ADD: _arith("add", "fadd", "or"), Ops.SUB: _arith("sub", "fsub", "xor"), Ops.MUL: _arith("mul", "fmul", "and"),
  Ops.FDIV: lambda w, u, a: w.inst(f"fdiv {ll_type(u.dtype)} {a[0]}, {a[1]}"), Ops.IDIV: _idiv, Ops.MOD: _mod,
  Ops.MAX: _max, Ops.CMPLT: _compare("slt", "ult", "olt"), Ops.CMPNE: _compare("ne", "ne", "une"),
  Ops.CMPEQ: _compare("eq", "eq", "oeq"), Ops.AND: _bitwise("and"), Ops.OR: _bitwise("or"),
  Ops.XOR: _bitwise("xor"), Ops.SHL: _shift, Ops.SHR: _shift, Ops.POW: _intrinsic("pow"),
  Ops.EXP2: _intrinsic("exp2"), Ops.LOG2: _intrinsic("log2"), Ops.SIN: _intrinsic("sin"),
  Ops.SQRT: _intrinsic("sqrt"), Ops.RECIP: _recip, Ops.NEG: _neg, Ops.TRUNC: _trunc, Ops.WHERE: _where,
  Ops.CAST: _cast, Ops.BITCAST: _bitcast, Ops.MULACC: _fma, Ops.DP4A: _dp4a,
}

class LLVMRenderer(Renderer):
  """Renders a linearized kernel as `define void @name(ptr noalias %data0, ..., i32 %var0, ..., i32 %kiln_tid,
  i32 %kiln_nthreads)` in LLVM IR text, with the C renderer's thread entry points (see `thread plans` below)."""
  device = "LLVM"
  has_local = False
  # as in the C renderer: llvm.exp2/log2/sin become scalar libm calls the loop vectorizer cannot widen, kiln's
  # software versions (<= 1 ulp, docs/transcendental.md) vectorize with the rest of the loop
  has_native_transcendentals = False
  renders_math_forms = True   # for TRANSCENDENTAL=0 (math_form; software math rewrites the forms first otherwise)
  packs_matmul_operands = True   # kiln/schedule/pack.py: matmul 1024 76 -> 91, 2048 60 -> 71 GFLOP/s (2-core EPYC)
  renders_byte_dots = True   # DP4A as vpdpbusd/pmaddubsw where the target has them (byte_dot_method)
  # the same vector uops and thread plans as the C renderer (kiln/codegen/pipeline.py)
  has_threads = vectorizes = True

  def render(self, name: str, uops: list[UOp], threads: ThreadPlan = ONE_THREAD) -> str:
    """The LLVM IR module of function `name` (see the module docstring for the semantics), split over threads as
    `threads` says."""
    target = self.target
    features = target.features if target is not None and target.arch in ("x86_64", "AMD64") else frozenset()
    return _LLVMKernelWriter(kernel_function_name(name), uops, features, threads).render()

@dataclass
class _Loop:
  """An open RANGE: its counter, its block labels, and where its `phi` line is (finished at ENDRANGE)."""
  counter: str
  ty: str
  label: str
  entry_block: str
  phi_line: int
  start: str
  trips: int | None   # the iteration count when it is a constant
  # the copies of its body the loops closed inside it make when LLVM unrolls them whole (None: one of them stays a
  # loop), see unroll_hint
  inner_copies: int | None = 1

class _LLVMKernelWriter(KernelWriter):
  """Walks one uop list, naming SSA values, opening blocks for loops and gates, and emitting instructions.

  Thread plans (kiln/codegen/parallel.py, as the C renderer has them, kiln/renderer/cstyle.py "Threads"): a split
  outermost loop runs only the iterations of chunk `%kiln_tid` of `%kiln_nthreads`, and the module also defines
  `<name>_task(ptr bufs, ptr vals, i32 chunk, i32 nchunks)` and `@<name>_work` for the thread pool. A split reduction
  is rendered as `<name>_part` (one chunk's partials into a scratch buffer) and `<name>_finish` (the partials
  combined in chunk order, then the epilogue); the kernel runs every chunk and then finishes, and `<name>_task` runs
  one chunk with the scratch after the buffers (`@<name>_chunks`, `@<name>_scratch`), the last chunk to end finishing.
  """
  renderer_name = "LLVMRenderer"
  expressions = LLVM_EXPRESSIONS

  def __init__(self, name: str, uops: list[UOp], features: frozenset[str] = frozenset(),
               threads: ThreadPlan = ONE_THREAD):
    super().__init__(name, uops)
    self.features = features   # the x86 instruction-set flags the code may use (DP4A's instructions), else empty
    self.declarations: dict[str, str] = {}
    self.helpers: dict[str, None] = {}
    self.metadata: list[str] = []   # the module's metadata nodes (loop unroll hints)
    self.parallel, self.reduction, self.streams = threads
    self.mode = "kernel"   # which function of a split reduction is being written: "part", "finish" (else "kernel")
    self.begin_function()
    self.statements.update({
      Ops.RANGE: self._range, Ops.ENDRANGE: self._endrange, Ops.LOAD: self._load, Ops.STORE: self._store,
      Ops.DEFINE_ACC: self._define_acc, Ops.ASSIGN: self._assign,
      **{op: self._nothing for op in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SINK, Ops.GEP,
                                      Ops.VECTORIZE)}})

  def begin_function(self) -> None:
    """Forget the values of the previous function of the module (each function computes its own)."""
    self.values: dict[UOp, str] = {}
    self.accumulators: dict[UOp, str] = {}   # DEFINE_ACC (and ASSIGN to it) -> its alloca
    self.lines: list[str] = []
    self.allocas: list[str] = []
    self.loops: list[_Loop] = []
    self.block = "entry"

  # ---- values and instructions ----
  def emit(self, line: str) -> None:
    """Add one instruction to the current block."""
    self.lines.append(f"  {line}")

  def inst(self, text: str, prefix: str = "%t") -> str:
    """Emit `%name = text` and return `%name`."""
    name = self.fresh_name(prefix)
    self.emit(f"{name} = {text}")
    return name

  def call(self, function: str, ret_type: str, args: list[tuple[str, str]]) -> str:
    """Call an LLVM intrinsic (declared on first use) or one of the kiln helpers; returns the result."""
    if function.startswith("llvm."):
      self.declarations[function] = f"declare {ret_type} @{function}({', '.join(t for t, _ in args)})"
    else: self.note_helper(function)
    return self.inst(f"call {ret_type} @{function}({', '.join(f'{t} {v}' for t, v in args)})")

  def note_helper(self, function: str) -> None:
    """Include the helper group of a `kiln_<group>_...` function (bf16, half, fp8e4m3 or fp8e5m2) in the module."""
    self.helpers[function.split("_")[1]] = None

  def value(self, u: UOp) -> str:
    """The LLVM operand that reads `u` at this point of the kernel (an accumulator is loaded here, and a lane of a
    vector or a vector of scalars is formed here, as the C renderer reads them where they are used)."""
    if u.op is Ops.CONST: return ll_const(u.arg, u.dtype)
    if u.op is Ops.DEFINE_GLOBAL: return f"%data{u.arg}"
    if u.op is Ops.GEP:
      return self.inst(f"extractelement {ll_type(u.src[0].dtype)} {self.value(u.src[0])}, i32 {u.arg}")
    if u.op is Ops.VECTORIZE: return self.vector_of(u)
    if u in self.accumulators: return self.inst(f"load {ll_type(u.dtype)}, ptr {self.accumulators[u]}", "%acc")
    if u not in self.values:
      raise ValueError(f"LLVMRenderer: {u.op.name} is used before it is computed in kernel {self.name}")
    return self.values[u]

  def vector_of(self, u: UOp) -> str:
    """A VECTORIZE: its scalars inserted lane by lane, or one scalar broadcast by a shuffle."""
    self.note_dtype(u.dtype)
    ty, lane_type = ll_type(u.dtype), VALUE_TYPES[u.dtype.scalar]
    if _gated_row(u): return self.masked_row(u)
    if all(s is u.src[0] for s in u.src):
      first = self.inst(f"insertelement {ty} poison, {lane_type} {self.value(u.src[0])}, i32 0")
      return self.inst(f"shufflevector {ty} {first}, {ty} poison, <{u.dtype.count} x i32> zeroinitializer")
    vector = "poison"
    for lane, s in enumerate(u.src): vector = self.inst(f"insertelement {ty} {vector}, {lane_type} {self.value(s)}, "
                                                        f"i32 {lane}")
    return vector

  def masked_row(self, u: UOp) -> str:
    """A VECTORIZE of gated loads of consecutive elements (a padded window's row, which kiln/codegen/vectorize.py
    leaves scalar) as one `llvm.masked.load`: lane k reads memory only where its gate holds, else is 0, as the scalar
    loads do, in one masked move instead of a branch per lane (the scalar loads are left unused, and removed)."""
    first = u.src[0]
    ty, storage = ll_type(u.dtype), STORAGE_TYPES[first.dtype]
    offset = self.value(first.src[1])
    if first.src[1].dtype.bitsize < 64: offset = self.inst(f"sext {VALUE_TYPES[first.src[1].dtype]} {offset} to i64")
    # no `inbounds`: a gated-off lane's address may lie outside the buffer, and the row's address must not be poison
    pointer = self.inst(f"getelementptr {storage}, ptr {self.value(first.src[0])}, i64 {offset}")
    mask_type, mask = f"<{u.dtype.count} x i1>", "poison"
    for lane, load in enumerate(u.src):
      mask = self.inst(f"insertelement {mask_type} {mask}, i1 {self.value(load.src[2])}, i32 {lane}")
    lane_name = "f32" if u.dtype.scalar == dtypes.float32 else "i32"
    function = f"llvm.masked.load.v{u.dtype.count}{lane_name}.p0"
    self.declarations[function] = f"declare {ty} @{function}(ptr, i32, {mask_type}, {ty})"
    return self.inst(f"call {ty} @{function}(ptr {pointer}, i32 4, {mask_type} {mask}, {ty} zeroinitializer)")

  def note_dtype(self, dtype: DType) -> None:
    """Check that `dtype` is supported and remember the conversion helpers it needs."""
    if dtype.count > 1: dtype = dtype.scalar
    if dtype not in VALUE_TYPES: raise TypeError(f"LLVMRenderer: dtype {dtype} is not supported in kernel {self.name}")
    if dtype in HELPER_GROUPS: self.helpers[HELPER_GROUPS[dtype]] = None

  def start_block(self, label: str) -> None:
    """Begin the basic block `label` (the previous one must have ended with a branch)."""
    self.lines.append(f"{label}:")
    self.block = label

  def element_pointer(self, buf: UOp, index: UOp) -> str:
    """The address of `buf[index]` (the index sign-extended to 64 bits, as C does with an int subscript)."""
    offset = self.value(index)
    if index.dtype.bitsize < 64: offset = self.inst(f"sext {VALUE_TYPES[index.dtype]} {offset} to i64")
    return self.inst(f"getelementptr inbounds {STORAGE_TYPES[buf.dtype]}, ptr {self.value(buf)}, i64 {offset}")

  def gated(self, gate: UOp, body: Callable[[], str | None], dtype: DType | None = None) -> str | None:
    """Run `body` (which emits instructions) only when `gate` holds; its result, or 0 of `dtype` when it does not."""
    condition = self.value(gate)
    label = self.fresh_name("gate")
    before = self.block
    self.emit(f"br i1 {condition}, label %{label}_then, label %{label}_join")
    self.start_block(f"{label}_then")
    result = body()
    then_end = self.block
    self.emit(f"br label %{label}_join")
    self.start_block(f"{label}_join")
    if dtype is None: return None
    ty = VALUE_TYPES[dtype]
    return self.inst(f"phi {ty} [ {result}, %{then_end} ], [ {render_llvm_const(0, dtype)}, %{before} ]", "%val")

  def chunk_bounds(self, ty: str, extent: str, chunk: str, chunks: str) -> tuple[str, str]:
    """[begin, end) of chunk `chunk` (an i32) of `chunks` contiguous, balanced chunks of `extent` iterations."""
    def wide(x: str, from_type: str) -> str:
      return x if from_type == "i64" else self.inst(f"sext {from_type} {x} to i64")
    extent64, chunk64, chunks64 = wide(extent, ty), wide(chunk, "i32"), wide(chunks, "i32")
    bounds = []
    for index in (chunk64, self.inst(f"add nsw i64 {chunk64}, 1")):
      scaled = self.inst(f"mul nsw i64 {extent64}, {index}")
      bound = self.inst(f"sdiv i64 {scaled}, {chunks64}")
      bounds.append(bound if ty == "i64" else self.inst(f"trunc i64 {bound} to {ty}"))
    return bounds[0], bounds[1]

  # ---- statements ----
  def _nothing(self, u: UOp) -> None: pass

  def _range(self, u: UOp) -> None:
    ty = VALUE_TYPES[u.dtype]
    start, end = "0", self.value(u.src[0])
    if self.parallel is not None and u is self.parallel.loop:   # this thread's contiguous chunk
      start, end = self.chunk_bounds(ty, end, "%kiln_tid", "%kiln_nthreads")
    elif self.reduction is not None and u is self.reduction.loop and self.mode == "part":
      start, end = self.chunk_bounds(ty, end, "%kiln_chunk", str(self.reduction.chunks))
    label = self.fresh_name(f"loop{u.arg}_" if isinstance(u.arg, int) and u.arg >= 0 else "loop_")
    counter = f"%{label}_i"
    entry_block = self.block
    self.emit(f"br label %{label}_head")
    self.start_block(f"{label}_head")
    self.lines.append("")   # the phi, written at ENDRANGE once the block that loops back is known
    trips = u.src[0].arg if u.src[0].op is Ops.CONST and start == "0" else None
    loop = _Loop(counter, ty, label, entry_block, len(self.lines) - 1, start, trips)
    self.loops.append(loop)
    more = self.inst(f"icmp slt {ty} {counter}, {end}")
    self.emit(f"br i1 {more}, label %{label}_body, label %{label}_exit")
    self.start_block(f"{label}_body")
    self.values[u] = counter
    if self.parallel is not None and u is self.parallel.loop: self.prefetch_streams(u, counter, ty)

  def prefetch_streams(self, loop: UOp, counter: str, ty: str) -> None:
    """At the top of each iteration of the thread-split loop, prefetch the blocks that an iteration PREFETCH_BYTES
    ahead reads from each buffer the loop streams through in small blocks (a matrix-vector product's weight rows),
    as the C renderer does (CRenderer's _prefetch_streams: why, and the figures)."""
    streams = [(st, st.stride * st.buffer.dtype.itemsize, (st.high - st.low + 1) * st.buffer.dtype.itemsize)
               for st in self.streams]
    streams = [(st, stride, size) for st, stride, size in streams if stride >= 64 and size <= PREFETCH_MAX_BLOCK]
    if not streams: return
    ahead = max(1, -(-PREFETCH_BYTES // max(stride for _, stride, _ in streams)))
    self.declarations["llvm.prefetch.p0"] = "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"
    iteration = counter if ty == "i64" else self.inst(f"sext {ty} {counter} to i64")
    later = self.inst(f"add i64 {iteration}, {ahead}")
    for st, _, size in streams:
      element = self.inst(f"add i64 {self.inst(f'mul i64 {later}, {st.stride}')}, {st.low}")
      # no `inbounds`: the last iterations prefetch past the buffer's end, which is harmless but must not be poison
      start = self.inst(f"getelementptr {STORAGE_TYPES[st.buffer.dtype]}, ptr %data{st.buffer.arg}, i64 {element}")
      for offset in range(0, size, 64):
        line = self.inst(f"getelementptr i8, ptr {start}, i64 {offset}") if offset else start
        self.emit(f"call void @llvm.prefetch.p0(ptr {line}, i32 0, i32 3, i32 1)")

  def _endrange(self, u: UOp) -> None:
    if not self.loops: raise ValueError(f"LLVMRenderer: ENDRANGE without an open RANGE in kernel {self.name}")
    loop = self.loops.pop()
    following = f"{loop.counter}_next"
    self.emit(f"{following} = add nuw nsw {loop.ty} {loop.counter}, 1")   # counter < end, so never overflows
    self.lines[loop.phi_line] = (f"  {loop.counter} = phi {loop.ty} [ {loop.start}, %{loop.entry_block} ], "
                                 f"[ {following}, %{self.block} ]")
    self.emit(f"br label %{loop.label}_head{self.unroll_hint(loop)}")
    self.start_block(f"{loop.label}_exit")

  def unroll_hint(self, loop: _Loop) -> str:
    """`!llvm.loop` metadata that forbids LLVM to unroll a loop it may only unroll partly (more than
    FULL_UNROLL_MAX_TRIPS iterations, or a count known at run time): kiln's optimizer unrolled what pays, and LLVM
    unrolling a memory-bound loop again slowed it (16M float sum, one core: 1.1x the C path's time -> 0.9x). Short
    loops stay LLVM's to unroll whole (a 3x3 window's: 8x16x32x32 conv 1.2x -> 1.0x the C path), while the nest they
    make copies the body at most FULL_UNROLL_MAX_TRIPS times: a short loop around a loop that stays one, or around
    short loops of more copies together, stays a loop too (a transposing copy's 4x4x2 nest around a loop of 64 was
    unrolled into 32 copies of that loop: 130 ms of O3 for one small kernel)."""
    copies = loop.trips * loop.inner_copies if loop.trips is not None and loop.inner_copies is not None else None
    whole = copies is not None and copies <= FULL_UNROLL_MAX_TRIPS
    if self.loops:   # the loop around this one
      outer = self.loops[-1]
      if not whole: outer.inner_copies = None
      elif outer.inner_copies is not None: outer.inner_copies = max(outer.inner_copies, copies)
    if whole: return ""
    node = f"!{len(self.metadata)}"
    self.metadata.append(f"{node} = distinct !{{{node}, !{{!\"llvm.loop.unroll.disable\"}}}}")
    return f", !llvm.loop {node}"

  def _load(self, u: UOp) -> None:
    buf, index = u.src[0], u.src[1]
    self.note_dtype(u.dtype)
    if u.dtype.count > 1:   # consecutive 32-bit lanes from `index` on, unaligned (never gated: codegen/vectorize.py)
      pointer = self.element_pointer(buf, index)
      self.values[u] = self.inst(f"load {ll_type(u.dtype)}, ptr {pointer}, align {u.dtype.scalar.itemsize}")
      return
    def read() -> str:
      bits = self.inst(f"load {STORAGE_TYPES[u.dtype]}, ptr {self.element_pointer(buf, index)}")
      return _from_storage(self, bits, u.dtype)
    self.values[u] = read() if len(u.src) == 2 else self.gated(u.src[2], read, u.dtype)

  def _store(self, u: UOp) -> None:
    buf, index, value = u.src[:3]
    self.note_dtype(value.dtype)
    if value.dtype.count > 1:
      if len(u.src) == 4: raise ValueError(f"LLVMRenderer: a vector STORE cannot be gated (kernel {self.name})")
      lanes = self.value(value)
      self.emit(f"store {ll_type(value.dtype)} {lanes}, ptr {self.element_pointer(buf, index)}, "
                f"align {value.dtype.scalar.itemsize}")
      return
    def write() -> None:
      bits = _to_storage(self, self.value(value), value.dtype)
      self.emit(f"store {STORAGE_TYPES[value.dtype]} {bits}, ptr {self.element_pointer(buf, index)}")
    if len(u.src) == 4: self.gated(u.src[3], write)
    else: write()

  def _define_acc(self, u: UOp) -> None:
    self.note_dtype(u.dtype)
    pointer = self.fresh_name("%accp")
    self.allocas.append(f"  {pointer} = alloca {ll_type(u.dtype)}")
    self.emit(f"store {ll_type(u.dtype)} {self.value(u.src[0])}, ptr {pointer}")
    self.accumulators[u] = pointer

  def _assign(self, u: UOp) -> None:
    target, value = u.src
    if target not in self.accumulators:
      raise ValueError(f"LLVMRenderer: ASSIGN must target a DEFINE_ACC, got {target.op}")
    self.emit(f"store {ll_type(u.dtype)} {self.value(value)}, ptr {self.accumulators[target]}")
    self.accumulators[u] = self.accumulators[target]

  def _value(self, u: UOp) -> None:
    """An ALU/CAST/BITCAST value; small-float ALU results are rounded to their type, as in C."""
    for dtype in (u.dtype, *(s.dtype for s in u.src)): self.note_dtype(dtype)
    if u.op in GroupOp.ALU and u.dtype.count == 1: check_alu_dtypes("LLVMRenderer", u)
    if (form := self.math_form(u)) is not None:
      self.values[u] = form
      return
    self.values[u] = self.rounded(u, LLVM_EXPRESSIONS[u.op](self, u, [self.value(s) for s in u.src]))

  def math_form(self, u: UOp) -> str | None:
    """kiln's exp(a), cos(y) and tan(y) forms (EXP2(a * 1/ln2), float64 SIN(pi/2 - y), SIN(y) / SIN(pi/2 - y), made
    when software math is off: renders_math_forms) as libm's exp, cos and tan of the argument itself, as the C
    renderer writes them; None for any other uop."""
    if u.dtype.count > 1: return None
    found = None
    if u.op is Ops.EXP2 and (argument := exp_argument(u.src[0])) is not None: found = ("exp", argument)
    elif u.op is Ops.SIN and (argument := cos_argument(u.src[0])) is not None: found = ("cos", argument)
    elif (argument := tan_argument(u)) is not None: found = ("tan", argument)
    if found is None: return None
    name, argument = found
    ty = VALUE_TYPES[argument.dtype]
    return self.call(f"llvm.{name}.{_float_suffix(argument.dtype)}", ty, [(ty, self.value(argument))])

  def rounded(self, u: UOp, result: str) -> str:
    """`result` of ALU uop `u` rounded to u's dtype where that is a small float (computed in float)."""
    if u.op not in GroupOp.ALU or u.op in EXACT_FLOAT_OPS or u.dtype not in SMALL_FLOATS: return result
    if u.dtype == dtypes.float16: return self.call("kiln_half_round_f", "float", [("float", result)])
    if u.dtype == dtypes.bfloat16: return self.call("kiln_bf16_round", "float", [("float", result)])
    return self.call(f"kiln_{u.dtype.name}_round", "float", [("double", _to_double(self, result, u.dtype))])

  # ---- functions ----
  def bind_variables(self, variables: list[UOp]) -> None:
    """The kernel's variables from its i32 parameters (the runtime passes C ints; other dtypes are converted)."""
    for i, var in enumerate(variables):
      self.note_dtype(var.dtype)
      if var.dtype == dtypes.int32: self.values[var] = f"%arg{i}"
      elif var.dtype.bitsize < 32: self.values[var] = self.inst(f"trunc i32 %arg{i} to {VALUE_TYPES[var.dtype]}")
      else: self.values[var] = self.inst(f"{'sext' if _is_signed(var.dtype) else 'zext'} i32 %arg{i} to i64")

  def function(self, header: str, variables: list[UOp], uops: list[UOp]) -> list[str]:
    """One function of the module: `header` (`define ... {`) and the body that runs `uops`."""
    self.begin_function()
    self.bind_variables(variables)
    self.walk(uops)
    self.check_closed(len(self.loops))
    return [header, "entry:", *self.allocas, *self.lines, "  ret void", "}"]

  def write(self) -> str:
    """The whole module: helpers, declarations, the kernel function and its thread entry points."""
    buffers, variables = kernel_signature(self.uops)
    params = [f"ptr noalias %data{b.arg}" for b in buffers] + [f"i32 %arg{i}" for i in range(len(variables))]
    own_args = [f"ptr %data{b.arg}" for b in buffers] + [f"i32 %arg{i}" for i in range(len(variables))]
    threads = ["i32 %kiln_tid", "i32 %kiln_nthreads"]
    if self.reduction is not None: functions = self.split_reduction(buffers, variables, params, own_args)
    else:
      functions = self.function(f"define void @{self.name}({', '.join(params + threads)}) nounwind {{", variables,
                                self.uops)
      if self.parallel is not None:
        functions += self.task(buffers, variables, lambda args: [f"  call void @{self.name}({', '.join(args)}, "
                                                                 f"i32 %kiln_chunk, i32 %kiln_nchunks)"])
        functions.append(f"@{work_symbol(self.name)} = constant i64 {self.parallel.work}")
    for b in buffers: self.note_dtype(b.dtype)
    if "half" in self.helpers: self.declarations["llvm.fabs.f64"] = "declare double @llvm.fabs.f64(double)"
    if any(dt.name in self.helpers for dt in dtypes.fp8s):
      self.declarations["llvm.umin.i64"] = "declare i64 @llvm.umin.i64(i64, i64)"
    head = ([BF16_HELPERS] if "bf16" in self.helpers else []) + ([HALF_HELPERS] if "half" in self.helpers else [])
    head += [fp8_helpers(dt) for dt in dtypes.fp8s if dt.name in self.helpers]
    return "\n".join([*head, *self.declarations.values(), *functions, *self.metadata, ""])

  def task(self, buffers: list[UOp], variables: list[UOp], body: Callable[[list[str]], list[str]]) -> list[str]:
    """`<name>_task(ptr bufs, ptr vals, i32 chunk, i32 nchunks)`: the kernel's arguments read from the pool's tables,
    then `body(arguments)`'s lines."""
    lines = [f"define void @{task_symbol(self.name)}(ptr %bufs, ptr %vals, i32 %kiln_chunk, i32 %kiln_nchunks) "
             "nounwind {", "entry:"]
    args = []
    for i, b in enumerate(buffers):
      lines += [f"  %bufp{i} = getelementptr inbounds ptr, ptr %bufs, i64 {i}", f"  %buf{i} = load ptr, ptr %bufp{i}"]
      args.append(f"ptr %buf{i}")
    for i in range(len(variables)):
      lines += [f"  %valp{i} = getelementptr inbounds i32, ptr %vals, i64 {i}", f"  %val{i} = load i32, ptr %valp{i}"]
      args.append(f"i32 %val{i}")
    return lines + body(args) + ["  ret void", "}"]

  # ---- a split reduction ----
  def split_reduction(self, buffers: list[UOp], variables: list[UOp], params: list[str],
                      own_args: list[str]) -> list[str]:
    """The functions of a split reduction (see the class docstring); partials are laid out as in the C renderer."""
    red = self.reduction
    start = self.uops.index(red.loop)
    end = next(i for i in range(start + 1, len(self.uops))
               if self.uops[i].op is Ops.ENDRANGE and self.uops[i].src[0] is red.loop)
    first_closer = next((i for i in range(end + 1, len(self.uops)) if self.uops[i].op is Ops.ENDRANGE), len(self.uops))
    slots = red.chunks * red.outer_iterations
    # one slot per chunk and outer iteration: 8 bytes for a scalar partial, the vector's size for a vector
    self.partial_sizes = [8 if acc.dtype.count == 1 else acc.dtype.itemsize for acc, _ in red.accumulators]
    self.partial_offsets = [slots * sum(self.partial_sizes[:j]) for j in range(len(self.partial_sizes))]
    scratch = slots * sum(self.partial_sizes)
    part, finish = f"{self.name}_part", f"{self.name}_finish"
    # the part function: the reduce loop's chunk, its partials stored, and the outer loops closed (no epilogue)
    self.mode = "part"
    self.begin_function()
    self.bind_variables(variables)
    self.walk(self.uops[:end + 1])
    self.store_partials("%kiln_chunk")
    self.walk(self.uops[first_closer:])
    part_params = ", ".join(params + ["i32 %kiln_chunk", "ptr noalias %kiln_scratch"])
    part_lines = [f"define internal void @{part}({part_params}) nounwind {{", "entry:", *self.allocas, *self.lines,
                  "  ret void", "}"]
    # the finish function: the accumulators start from their identity, take every chunk's partial, then the epilogue
    self.mode = "finish"
    self.begin_function()
    self.bind_variables(variables)
    self.walk(self.uops[:start])
    for u in self.uops[start:end + 1]:   # skipped: the reduce loop's ASSIGNs stand for their accumulators after it
      if u.op is Ops.ASSIGN and u.src[0] in self.accumulators: self.accumulators[u] = self.accumulators[u.src[0]]
    self.combine_partials()
    self.walk(self.uops[end + 1:])
    finish_lines = [f"define internal void @{finish}({', '.join(params + ['ptr noalias %kiln_scratch'])}) nounwind {{",
                    "entry:", *self.allocas, *self.lines, "  ret void", "}"]
    self.mode = "kernel"
    chunk_calls = [f"  call void @{part}({', '.join(own_args + [f'i32 {c}', 'ptr %scratch'])})"
                   for c in range(red.chunks)]
    kernel = [f"define void @{self.name}({', '.join(params + ['i32 %kiln_tid', 'i32 %kiln_nthreads'])}) nounwind {{",
              "entry:", f"  %scratch = alloca [{max(1, scratch)} x i8], align 16", *chunk_calls,
              f"  call void @{finish}({', '.join(own_args + ['ptr %scratch'])})", "  ret void", "}"]
    def task_body(args: list[str]) -> list[str]:
      # the last chunk to end combines the partials, in chunk order whichever thread runs it
      return [f"  %countp = getelementptr inbounds ptr, ptr %bufs, i64 {len(buffers)}",
              "  %counter = load ptr, ptr %countp",
              f"  %partials = getelementptr inbounds i8, ptr %counter, i64 {SCRATCH_HEADER_BYTES}",
              f"  call void @{part}({', '.join(args + ['i32 %kiln_chunk', 'ptr %partials'])})",
              "  %before = atomicrmw add ptr %counter, i32 1 acq_rel, align 4",
              f"  %last = icmp eq i32 %before, {red.chunks - 1}",
              "  br i1 %last, label %finish, label %done", "finish:",
              "  store atomic i32 0, ptr %counter monotonic, align 4",
              f"  call void @{finish}({', '.join(args + ['ptr %partials'])})", "  br label %done", "done:"]
    return [*kernel, *part_lines, *finish_lines, *self.task(buffers, variables, task_body),
            f"@{work_symbol(self.name)} = constant i64 {red.work}",
            f"@{chunks_symbol(self.name)} = constant i64 {red.chunks}",
            f"@{scratch_symbol(self.name)} = constant i64 {SCRATCH_HEADER_BYTES + scratch}"]

  def outer_index(self) -> str:
    """The linear index (i64) of the current iteration of the split reduction's outer loops."""
    index = "0"
    for loop in self.reduction.outer:
      extent = int(loop.src[0].arg)
      counter = self.values[loop]
      if loop.dtype.bitsize < 64: counter = self.inst(f"sext {VALUE_TYPES[loop.dtype]} {counter} to i64")
      index = self.inst(f"add nsw i64 {self.inst(f'mul nsw i64 {index}, {extent}')}, {counter}")
    return index

  def partial_slot(self, j: int, chunk: str) -> str:
    """The address of accumulator j's partial for chunk `chunk` (an i32 value or literal) and this outer iteration."""
    red = self.reduction
    chunk64 = chunk if not chunk.startswith("%") else self.inst(f"sext i32 {chunk} to i64")
    slot = self.inst(f"add nsw i64 {self.inst(f'mul nsw i64 {chunk64}, {red.outer_iterations}')}, "
                     f"{self.outer_index()}")
    offset = self.inst(f"add nsw i64 {self.inst(f'mul nsw i64 {slot}, {self.partial_sizes[j]}')}, "
                       f"{self.partial_offsets[j]}")
    return self.inst(f"getelementptr inbounds i8, ptr %kiln_scratch, i64 {offset}")

  def store_partials(self, chunk: str) -> None:
    """Store every accumulator's value (after the chunk's reduce loop) into its partial slot."""
    for j, (acc, _) in enumerate(self.reduction.accumulators):
      self.emit(f"store {ll_type(acc.dtype)} {self.value(acc)}, ptr {self.partial_slot(j, chunk)}, align 4")

  def combine_partials(self) -> None:
    """Each accumulator combined with every chunk's partial, in chunk order, by its own update op (rounded as it is)."""
    red = self.reduction
    for c in range(red.chunks):
      for j, (acc, update) in enumerate(red.accumulators):
        partial = self.inst(f"load {ll_type(acc.dtype)}, ptr {self.partial_slot(j, str(c))}, align 4")
        combined = self.rounded(update, LLVM_EXPRESSIONS[update.op](self, update, [self.value(acc), partial]))
        self.emit(f"store {ll_type(acc.dtype)} {combined}, ptr {self.accumulators[acc]}")
