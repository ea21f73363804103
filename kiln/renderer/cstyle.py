"""CRenderer: a linearized kernel (docs/ir.md, stage 4) becomes one C function for the CPU device.

Semantics (shared with the PythonRenderer, which is the reference):
- integer IDIV/MOD truncate toward zero; a zero divisor gives 0 (and `MIN // -1` wraps) instead of trapping;
- signed integer arithmetic wraps (compiled with -fwrapv); results narrower than int are truncated on assignment;
- float16 and bfloat16 are stored as their 16 bits; their values live in `float` and every op's result is rounded to
  the type (nearest-even). float16 conversions use `_Float16` where the compiler has it (gcc 12; clang >= 15 on
  x86-64) and exact bit manipulation otherwise (clang 14), so any C compiler gives the same bits. Conversion to
  float16 from float64 and integers is direct; every conversion to bfloat16 goes through float32 first. A value is
  rounded in place (kiln_half_round_f/_d) by float adds at its float16 ulp, never by a `_Float16` round trip, which
  gcc 12 folds away in vector code;
- fp8e4m3 and fp8e5m2 are stored as their 8 bits (unsigned char) and computed in `float` like the 16-bit floats;
  conversion to fp8 is straight from double, nearest-even, finite overflow saturating to +-max (kiln/dtype.py);
- float -> integer casts truncate through a 32-bit conversion (64-bit for uint32, int64, uint64) whose out-of-range
  and NaN result is INT_MIN of that width, then wrap to the type (PYTHON's _f2i), in vector and scalar code alike;
- MAX returns NaN when either float operand is NaN; comparisons give bool; CAST to bool is `!= 0`;
- a gated LOAD `(buf, idx, gate)` reads `buf[idx]` only when `gate` holds, else gives 0.

Threads: every kernel takes two trailing parameters `int kiln_tid, int kiln_nthreads`. When the thread plan it is
rendered with (`ThreadPlan`, made by the pipeline's plan_threads stage: kiln/codegen/pipeline.py) splits the
outermost loop, that loop runs only thread `kiln_tid`'s contiguous chunk of its iterations,
and the library also exports `<name>_task(void **bufs, const int *vals, int tid, int nthreads)` (a uniform entry point
for the thread pool, kiln/runtime/threadpool.py) and `const long long <name>_work` (the estimated uops per launch).
Other kernels ignore the two parameters; calling any kernel with `(0, 1)` runs all of it.
A split reduction (kiln/codegen/parallel.py, SplitReduction; docs/developer.md "Threads") is rendered as a chunk
function and a combining function instead: the kernel runs every chunk itself, and `<name>_task` runs one chunk with
a scratch buffer passed after the kernel's buffers (`<name>_chunks`, `<name>_scratch` say how many and how big).
"""
from __future__ import annotations
import math
from typing import Callable
from kiln.dtype import DType, dtypes, truncate
from kiln.renderer import ONE_THREAD, KernelWriter, Renderer, ThreadPlan, kernel_signature, kernel_function_name
from kiln.uop.mathforms import exp_argument, cos_argument, tan_argument
from kiln.uop.ops import UOp, Ops, GroupOp

# the C type a value of each dtype lives in while computing, and the type it is stored as in a buffer
VALUE_TYPES: dict[DType, str] = {
  dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
  dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
  dtypes.uint64: "unsigned long long", dtypes.float16: "float", dtypes.bfloat16: "float", dtypes.float32: "float",
  dtypes.float64: "double", dtypes.fp8e4m3: "float", dtypes.fp8e5m2: "float"}
STORAGE_TYPES: dict[DType, str] = {**VALUE_TYPES, dtypes.bool: "unsigned char", dtypes.float16: "unsigned short",
                                   dtypes.bfloat16: "unsigned short", dtypes.fp8e4m3: "unsigned char",
                                   dtypes.fp8e5m2: "unsigned char"}

HALF_HELPERS = """\
#if defined(__FLT16_MAX__) && !defined(KILN_SOFT_HALF)
static inline float kiln_half_to_f(unsigned short bits) { _Float16 h; __builtin_memcpy(&h, &bits, 2); return (float)h; }
static inline unsigned short kiln_half_bits(double value) {
  _Float16 h = (_Float16)value; unsigned short bits; __builtin_memcpy(&bits, &h, 2); return bits;
}
#else  /* no _Float16 in this compiler: the same conversions, bit by bit */
static inline float kiln_half_to_f(unsigned short bits) {
  unsigned int sign = ((unsigned int)bits & 0x8000u) << 16, exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  unsigned int wide;
  if (exponent == 0x1fu) wide = sign | 0x7f800000u | (mantissa << 13);             /* inf, NaN */
  else if (exponent != 0) wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  else { float tiny = (float)mantissa * 5.9604644775390625e-08f; return sign ? -tiny : tiny; }  /* subnormal, 0 */
  float value; __builtin_memcpy(&value, &wide, 4); return value;
}
static inline unsigned short kiln_half_bits(double value) {  /* round to nearest, ties to even, straight from double */
  unsigned long long bits; __builtin_memcpy(&bits, &value, 8);
  unsigned short sign = (unsigned short)((bits >> 48) & 0x8000u);
  unsigned long long magnitude = bits & 0x7fffffffffffffffull;
  if (magnitude > 0x7ff0000000000000ull) return sign | 0x7e00u | (unsigned short)((magnitude >> 42) & 0x3ffu);
  if (magnitude >= 0x40effe0000000000ull) return sign | 0x7c00u;                      /* >= 65520: inf */
  int exponent = (int)(magnitude >> 52) - 1023;
  if (exponent < -25) return sign;                                                    /* < 2**-25: 0 */
  unsigned long long mantissa = (magnitude & 0xfffffffffffffull) | 0x10000000000000ull;
  int shift = exponent >= -14 ? 42 : 28 - exponent;                                   /* keep 11 bits, or fewer */
  unsigned long long kept = mantissa >> shift, rest = mantissa & ((1ull << shift) - 1), halfway = 1ull << (shift - 1);
  if (rest > halfway || (rest == halfway && (kept & 1u))) kept++;
  if (exponent < -14) return sign | (unsigned short)kept;                             /* subnormal (or min normal) */
  return sign | (unsigned short)(((unsigned long long)(exponent + 15) << 10) + kept - 0x400u);
}
#endif
/* Rounding to float16 in place, without _Float16: gcc 12 folds a vectorized (float)(_Float16)x to x (wrong code).
   Adding 2**13 float16 ulps of |x|'s binade (2**-1 below the normal range) leaves the sum's ulp equal to |x|'s
   float16 ulp, so the add rounds |x| to float16 (nearest even) and the subtract is exact; no compiler may fold the
   pair without -ffast-math. A rounded 65536 or more overflows to inf; NaN stays NaN. No branches: it vectorizes. */
static inline float kiln_half_round_f(float value) {
  unsigned int bits; __builtin_memcpy(&bits, &value, 4);
  unsigned int magnitude = bits & 0x7fffffffu, binade = magnitude & 0x7f800000u;
  binade = binade < (113u << 23) ? (113u << 23) : binade > (142u << 23) ? (142u << 23) : binade;  /* 2**-14..2**15 */
  unsigned int scale_bits = binade + (13u << 23);
  float scale, absolute; __builtin_memcpy(&scale, &scale_bits, 4); __builtin_memcpy(&absolute, &magnitude, 4);
  float rounded = (absolute + scale) - scale;
  rounded = (rounded * 0x1p112f) * 0x1p-112f;   /* 2**16 and more overflow to inf, the rest is exact: no branch */
  unsigned int out; __builtin_memcpy(&out, &rounded, 4);
  out |= bits & 0x80000000u;
  float result; __builtin_memcpy(&result, &out, 4); return result;
}
static inline float kiln_half_round_d(double value) {  /* the same in double: one rounding, straight from double */
  unsigned long long bits; __builtin_memcpy(&bits, &value, 8);
  unsigned long long magnitude = bits & 0x7fffffffffffffffull, binade = magnitude & 0x7ff0000000000000ull;
  binade = binade < (1009ull << 52) ? (1009ull << 52) : binade > (1038ull << 52) ? (1038ull << 52) : binade;
  unsigned long long scale_bits = binade + (42ull << 52);
  double scale, absolute; __builtin_memcpy(&scale, &scale_bits, 8); __builtin_memcpy(&absolute, &magnitude, 8);
  float rounded = (float)((absolute + scale) - scale);   /* a float16 value (or >= 65536): exact in float */
  rounded = (rounded * 0x1p112f) * 0x1p-112f;
  unsigned int out; __builtin_memcpy(&out, &rounded, 4);
  out |= (unsigned int)(bits >> 32) & 0x80000000u;
  float result; __builtin_memcpy(&result, &out, 4); return result;
}
"""

BF16_HELPERS = """\
static inline float kiln_bf16_to_f(unsigned short bits) {
  unsigned int wide = ((unsigned int)bits) << 16; float value; __builtin_memcpy(&value, &wide, 4); return value;
}
static inline unsigned short kiln_f_to_bf16(float value) {
  unsigned int bits; __builtin_memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);  /* NaN: stays a quiet NaN */
  bits += 0x7fffu + ((bits >> 16) & 1u);  /* round to nearest, ties to even */
  return (unsigned short)(bits >> 16);
}
static inline float kiln_bf16_round(float value) { return kiln_bf16_to_f(kiln_f_to_bf16(value)); }
"""

FP8_HELPERS = """\
static inline float kiln_fp8_to_f(unsigned char bits, int man_bits, int min_exp, int has_inf) {
  unsigned int magnitude = bits & 0x7fu, field = magnitude >> man_bits, mantissa = magnitude & ((1u << man_bits) - 1u);
  float value;
  if (has_inf ? field == (0x7fu >> man_bits) : magnitude == 0x7fu) {
    value = (has_inf && mantissa == 0) ? __builtin_inff() : __builtin_nanf("");
  } else {  /* significand * 2**(exponent - man_bits); the scale is a normal float for both formats */
    unsigned int significand = field ? (mantissa | (1u << man_bits)) : mantissa;
    int exponent = field ? (int)field - 1 + min_exp : min_exp;
    unsigned int scale_bits = (unsigned int)(exponent - man_bits + 127) << 23;
    float scale; __builtin_memcpy(&scale, &scale_bits, 4);
    value = (float)significand * scale;
  }
  return (bits & 0x80u) ? -value : value;
}
/* nearest even, finite overflow saturating to max_code */
static inline unsigned char kiln_fp8_bits(double value, int man_bits, int min_exp, unsigned int max_code,
                                          unsigned int nan_code, unsigned int inf_code) {
  unsigned long long bits; __builtin_memcpy(&bits, &value, 8);
  unsigned int sign = (unsigned int)(bits >> 56) & 0x80u;
  unsigned long long magnitude = bits & 0x7fffffffffffffffull;
  if (magnitude > 0x7ff0000000000000ull) return (unsigned char)(sign | nan_code);
  if (magnitude == 0x7ff0000000000000ull) return (unsigned char)(sign | inf_code);
  int exponent = (int)(magnitude >> 52) - 1023;
  if (exponent < min_exp - man_bits - 1) return (unsigned char)sign;     /* below half the smallest subnormal: 0 */
  if (exponent > 16) return (unsigned char)(sign | max_code);            /* far past the largest: max */
  unsigned long long mantissa = (magnitude & 0xfffffffffffffull) | 0x10000000000000ull;
  int shift = 52 - man_bits + (exponent < min_exp ? min_exp - exponent : 0);
  unsigned long long kept = mantissa >> shift, rest = mantissa & ((1ull << shift) - 1), halfway = 1ull << (shift - 1);
  if (rest > halfway || (rest == halfway && (kept & 1u))) kept++;
  unsigned long long code = exponent < min_exp ? kept   /* a subnormal; a carry gives the smallest normal's code */
    : ((unsigned long long)(exponent - min_exp + 1) << man_bits) + kept - (1ull << man_bits);
  return (unsigned char)(sign | (code > max_code ? max_code : code));
}
"""
# per fp8 dtype: kiln_<name>_to_f (bits -> float), kiln_<name>_bits (double -> bits), kiln_<name>_round
FP8_C_ARGS = {dtypes.fp8e4m3: ("3, -6, 0", "3, -6, 0x7eu, 0x7fu, 0x7eu"),
              dtypes.fp8e5m2: ("2, -14, 1", "2, -14, 0x7bu, 0x7eu, 0x7cu")}

def fp8_helpers(dtype: DType) -> str:
  """The three inline conversion functions of one fp8 dtype (they call FP8_HELPERS)."""
  to_float, to_bits = FP8_C_ARGS[dtype]
  n = dtype.name
  return (f"static inline float kiln_{n}_to_f(unsigned char bits) {{ return kiln_fp8_to_f(bits, {to_float}); }}\n"
          f"static inline unsigned char kiln_{n}_bits(double value) {{ return kiln_fp8_bits(value, {to_bits}); }}\n"
          f"static inline float kiln_{n}_round(double value) {{ return kiln_{n}_to_f(kiln_{n}_bits(value)); }}\n")

# ops whose float result is exactly representable in the operands' type (no rounding needed)
EXACT_FLOAT_OPS = frozenset({Ops.NEG, Ops.MAX, Ops.WHERE, Ops.TRUNC})

_INT_LIMITS = {dtypes.int32: ("(-2147483647-1)", ""), dtypes.int64: ("(-9223372036854775807ll-1)", "ll"),
               dtypes.uint32: (None, "u"), dtypes.uint64: (None, "ull")}

def render_c_const(value, dtype: DType) -> str:
  """A C literal (or constant expression) for `value` rounded to `dtype`, e.g. `1.5f`, `(-3)`, `__builtin_inff()`."""
  value = truncate(dtype, value)
  if dtype == dtypes.bool: return "1" if value else "0"
  if dtypes.is_int(dtype):
    min_literal, suffix = _INT_LIMITS.get(dtype, (None, ""))
    if min_literal is not None and value == dtypes.min(dtype): return min_literal
    return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"
  if not dtypes.is_float(dtype):
    raise TypeError(f"CRenderer: cannot render a constant of dtype {dtype}")
  suffix = "" if dtype == dtypes.float64 else "f"
  if math.isnan(value): text = f'{"-" if math.copysign(1.0, value) < 0 else ""}__builtin_nan{suffix}("")'   # signed
  elif math.isinf(value): text = f"{'-' if value < 0 else ''}__builtin_inf{suffix}()"
  else: text = f"{value!r}{suffix}"
  return f"({text})" if text.startswith("-") else text

def _libm(name: str) -> Callable[[UOp, list[str]], str]:
  """A libm call in the precision of the operands (double for float64, float otherwise)."""
  def render(u: UOp, a: list[str]) -> str:
    suffix = "" if u.src[0].dtype == dtypes.float64 else "f"
    return f"__builtin_{name}{suffix}({', '.join(a)})"
  return render

def _infix(symbol: str) -> Callable[[UOp, list[str]], str]:
  return lambda u, a: f"({a[0]}{symbol}{a[1]})"

def _traps_on_minus_one(dtype: DType) -> bool:
  """Whether `MIN / -1` traps for this type in C (types narrower than int are promoted and do not)."""
  return dtype in (dtypes.int32, dtypes.int64)

def _is_safe_divisor(u: UOp) -> bool:
  """A constant divisor that can neither be 0 nor -1, so the division needs no guard."""
  return u.op is Ops.CONST and u.arg not in (0, -1)

def _c_idiv(u: UOp, a: list[str]) -> str:
  if _is_safe_divisor(u.src[1]): return f"({a[0]}/{a[1]})"
  if _traps_on_minus_one(u.dtype): return f"(({a[1]})==0?0:({a[1]})==-1?-({a[0]}):({a[0]})/({a[1]}))"
  return f"(({a[1]})==0?0:({a[0]})/({a[1]}))"

def _c_mod(u: UOp, a: list[str]) -> str:
  if dtypes.is_float(u.dtype): return _libm("fmod")(u, a)
  if _is_safe_divisor(u.src[1]): return f"({a[0]}%{a[1]})"
  if _traps_on_minus_one(u.dtype): return f"((({a[1]})==0||({a[1]})==-1)?0:({a[0]})%({a[1]}))"
  return f"(({a[1]})==0?0:({a[0]})%({a[1]}))"

def _c_max(u: UOp, a: list[str]) -> str:
  if dtypes.is_float(u.dtype): return f"((({a[0]})!=({a[0]})||({a[0]})>({a[1]}))?({a[0]}):({a[1]}))"
  return f"((({a[0]})>({a[1]}))?({a[0]}):({a[1]}))"

def _c_recip(u: UOp, a: list[str]) -> str:
  return f"(1.0/{a[0]})" if u.dtype == dtypes.float64 else f"(1.0f/{a[0]})"

def conversion_width(dst: DType) -> int:
  """The width of the x86-64 conversion instruction C code uses for float -> `dst` (kiln/renderer/python.py _f2i)."""
  return 64 if dst.bitsize == 64 or dst == dtypes.uint32 else 32

def _c_float_to_int(x: str, src: DType, dst: DType) -> str:
  """Float -> integer as PYTHON's _f2i defines it: truncation through a 32- or 64-bit conversion whose out-of-range
  and NaN result is the 'integer indefinite' value (INT_MIN), then wrapped to `dst`. In C an out-of-range conversion
  is undefined, and clang's vector and scalar code gave different answers for one tensor; here it never happens."""
  wide = conversion_width(dst)
  suffix = "" if src == dtypes.float64 else "f"
  # |x| < 2**(wide-1) is the range but for -2**(wide-1), which converts to INT_MIN: the indefinite value anyway
  in_range = f"__builtin_fabs{suffix}({x})<{2 ** (wide - 1)}.0{suffix}"
  wide_type, indefinite = ("int", "(-2147483647-1)") if wide == 32 else ("long long", "(-9223372036854775807ll-1)")
  if dst == dtypes.uint64:   # [2**63, 2**64) converts as unsigned, the int64 range as signed, the rest is indefinite
    unsigned = f"(({x})>=0.0{suffix}&&({x})<{2 ** 64}.0{suffix}?(unsigned long long)({x}):0x8000000000000000ull)"
    return f"({in_range}?(unsigned long long)(long long)({x}):{unsigned})"
  converted = f"({in_range}?({wide_type})({x}):{indefinite})"
  return converted if dst.bitsize == wide else f"(({VALUE_TYPES[dst]}){converted})"

def _c_cast(u: UOp, a: list[str]) -> str:
  src, dst, x = u.src[0].dtype, u.dtype, a[0]
  if dst == dtypes.bool: return f"(({x})!=0)"
  if dtypes.is_int(dst) and dtypes.is_float(src): return _c_float_to_int(x, src, dst)
  if dst in (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s) and src == dtypes.bool: return f"((float){x})"
  if dst in dtypes.fp8s: return f"kiln_{dst.name}_round((double)({x}))"
  if dst == dtypes.bfloat16:
    if src in (dtypes.float32, dtypes.float16): return f"kiln_bf16_round({x})"
    return f"kiln_bf16_round((float)({x}))"   # every conversion to bfloat16 goes through float32
  if dst == dtypes.float16:
    if src in (dtypes.float32, dtypes.bfloat16): return f"kiln_half_round_f({x})"
    return f"kiln_half_round_d((double)({x}))"
  return f"(({VALUE_TYPES[dst]})({x}))"

def _c_bitcast(u: UOp, a: list[str]) -> str:
  src, dst = u.src[0].dtype, u.dtype
  if dtypes.bool in (src, dst) or src.itemsize != dst.itemsize:
    raise TypeError(f"CRenderer: cannot BITCAST {src} to {dst} (sizes must match and bool is not allowed)")
  bits = {dtypes.bfloat16: f"kiln_f_to_bf16({a[0]})", dtypes.float16: f"kiln_half_bits({a[0]})",
          **{fp8: f"kiln_{fp8.name}_bits({a[0]})" for fp8 in dtypes.fp8s}}.get(src, a[0])
  result = {dtypes.bfloat16: "kiln_bf16_to_f(bitcast_out)", dtypes.float16: "kiln_half_to_f(bitcast_out)",
            **{fp8: f"kiln_{fp8.name}_to_f(bitcast_out)" for fp8 in dtypes.fp8s}}.get(dst, "bitcast_out")
  return (f"({{ {STORAGE_TYPES[src]} bitcast_in = {bits}; {STORAGE_TYPES[dst]} bitcast_out; "
          f"__builtin_memcpy(&bitcast_out, &bitcast_in, sizeof(bitcast_out)); {result}; }})")

def _c_trunc(u: UOp, a: list[str]) -> str:
  return _libm("trunc")(u, a) if dtypes.is_float(u.dtype) else a[0]

# Op -> C expression for a value computed from operand expressions (float16/bfloat16 operands are floats)
C_EXPRESSIONS: dict[Ops, Callable[[UOp, list[str]], str]] = {
  Ops.ADD: _infix("+"), Ops.SUB: _infix("-"), Ops.MUL: _infix("*"), Ops.FDIV: _infix("/"), Ops.IDIV: _c_idiv,
  Ops.MOD: _c_mod, Ops.MAX: _c_max, Ops.CMPLT: _infix("<"), Ops.CMPNE: _infix("!="), Ops.CMPEQ: _infix("=="),
  Ops.AND: _infix("&"), Ops.OR: _infix("|"), Ops.XOR: _infix("^"), Ops.SHL: _infix("<<"), Ops.SHR: _infix(">>"),
  Ops.POW: _libm("pow"), Ops.EXP2: _libm("exp2"), Ops.LOG2: _libm("log2"), Ops.SIN: _libm("sin"),
  Ops.SQRT: _libm("sqrt"), Ops.RECIP: _c_recip, Ops.NEG: lambda u, a: f"(-{a[0]})", Ops.TRUNC: _c_trunc,
  Ops.WHERE: lambda u, a: f"({a[0]}?{a[1]}:{a[2]})", Ops.CAST: _c_cast, Ops.BITCAST: _c_bitcast,
  Ops.MULACC: _libm("fma"),   # an fma instruction under -march=native where the CPU has one, libm's fma otherwise
}
FLOAT_ONLY_OPS = frozenset({Ops.MULACC, Ops.FDIV, Ops.POW, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP})
INT_ONLY_OPS = frozenset({Ops.IDIV, Ops.SHL, Ops.SHR})
_VALUE_PREFIX = {Ops.LOAD: "val", Ops.CAST: "cast", Ops.BITCAST: "cast", Ops.DEFINE_ACC: "acc"}

def check_alu_dtypes(renderer: str, u: UOp) -> None:
  """Raise TypeError for an ALU op applied to a dtype it is not defined on (e.g. SQRT on ints)."""
  operand = u.src[-1].dtype
  if u.op in FLOAT_ONLY_OPS and not dtypes.is_float(operand):
    raise TypeError(f"{renderer}: {u.op.name} needs float operands, got {operand}")
  if u.op in INT_ONLY_OPS and not dtypes.is_int(operand):
    raise TypeError(f"{renderer}: {u.op.name} needs integer operands, got {operand}")
  if u.op in (Ops.AND, Ops.OR, Ops.XOR) and dtypes.is_float(operand):
    raise TypeError(f"{renderer}: {u.op.name} needs integer or bool operands, got {operand}")

# software prefetch (_prefetch_streams): how far ahead of the loads, and the largest block an iteration streams
# (larger blocks, a matmul's rows, are a few long streams the hardware prefetcher follows). Measured on the 2-core
# Xeon, a Q4_1 matvec streaming 100 matrices: 1.2 KB ahead 60 us, 2.3 KB 48-72 us, 4.6 KB 81 us, none 100 us
PREFETCH_BYTES = 2048
PREFETCH_MAX_BLOCK = 1024
# a split loop up to this many iterations keeps its constant bounds and skips the other threads' chunks (a compare
# per skipped iteration, about a microsecond at most); a longer one loops over its chunk only
SKIP_TO_CHUNK_MAX_EXTENT = 4096
MAX_PRAGMA_UNROLL = 4   # reduce loops of at most this many (constant) iterations get `#pragma GCC unroll`
MAX_PRAGMA_UNROLL_BODY = 300   # ... when their bodies (inner loops included) are at most this many uops

def task_symbol(function_name: str) -> str:
  """The name of a split kernel's thread-pool entry point (see the module docstring)."""
  return f"{function_name}_task"

def work_symbol(function_name: str) -> str:
  """The name of a split kernel's exported work estimate (see the module docstring)."""
  return f"{function_name}_work"

def chunks_symbol(function_name: str) -> str:
  """The name of a split reduction's exported chunk count (its pool launch runs exactly that many chunks)."""
  return f"{function_name}_chunks"

def scratch_symbol(function_name: str) -> str:
  """The name of a split reduction's exported scratch size in bytes (a zeroed buffer passed after its buffers)."""
  return f"{function_name}_scratch"

# ---- vector code (kiln/codegen/vectorize.py): GNU C vector extensions, accepted by gcc and clang alike ----
# A vector of n lanes is `kiln_<lane type>x<n>` (vector_size), bool vectors are int masks (all ones or zero per
# lane, what a comparison gives). Loads and stores go through __builtin_memcpy (unaligned; compiles to one move),
# selects are bitwise (`?:` on vectors is C++ only in gcc), conversions use __builtin_convertvector (gcc >= 9).
_VECTOR_LANE_TYPES = {dtypes.float32: "float", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.bool: "int",
                      dtypes.uint8: "unsigned char", dtypes.int8: "signed char"}

_BYTE_LANES = (dtypes.uint8, dtypes.int8)
# per lane count: the x86 feature macro and the GCC builtin (its name without the s/z of sign or zero extension)
# that widens a 16-byte vector's first `count` bytes to 32-bit lanes in one instruction
_X86_BYTE_WIDENING = {16: ("__AVX512F__", "pmov{}xbd512_mask(w, (kiln_intx16){{0}}, (unsigned short)-1)"),
                      8: ("__AVX2__", "pmov{}xbd256(w)"), 4: ("__SSE4_1__", "pmov{}xbd128(w)")}

def vector_widen_name(dtype: DType) -> str: return f"kiln_widen_{vector_type(dtype)}"

def vector_widen_helper(dtype: DType) -> str:
  """The inline function that widens a vector of bytes (uint8 or int8 lanes) to int32 lanes, as C converts each
  lane. GCC 12 compiles `__builtin_convertvector` from bytes one lane at a time, or through 16-bit halves with a
  dozen shuffles, so on x86 it calls the one-instruction builtin its own intrinsics use; clang and other targets
  convert."""
  t, n, out = vector_type(dtype), dtype.count, vector_type(dtypes.int32.vec(dtype.count))
  convert = f"  return __builtin_convertvector(x, {out});"
  head = f"static inline {out} {vector_widen_name(dtype)}({t} x) {{"
  if (found := _X86_BYTE_WIDENING.get(n)) is None: return "\n".join([head, convert, "}"])
  feature, builtin = found[0], found[1].format("z" if dtype.scalar == dtypes.uint8 else "s")
  as_16 = f"__builtin_shufflevector(x, x, {', '.join(str(k % n) for k in range(16))})" if n != 16 else "x"
  return "\n".join([
    head, f"#if defined({feature}) && defined(__GNUC__) && !defined(__clang__)",
    "  typedef char kiln_v16qi __attribute__((vector_size(16)));", f"  kiln_v16qi w = (kiln_v16qi){as_16};",
    f"  return ({out})__builtin_ia32_{builtin};", "#else", convert, "#endif", "}"])

def vector_type(dtype: DType) -> str:
  """The C type name of a vector dtype, e.g. `kiln_floatx8`; bool lanes are `kiln_maskx8` (int masks)."""
  if dtype.scalar not in _VECTOR_LANE_TYPES:
    raise TypeError(f"CRenderer: no vector type for lanes of {dtype.scalar} ({dtype!r})")
  lane = "mask" if dtype.scalar == dtypes.bool else dtype.scalar.name
  return f"kiln_{lane}x{dtype.count}"

# gcc 12's loop vectorizer miscompiles some if-converted selects under AVX-512 masks: a log over a padded, permuted
# view stored 0 where the pad value belonged (-O2 -march=native; right with -fno-tree-loop-if-convert, -O1, clang or an
# AVX2 target; test_fuzz_regressions.py). Under gcc with AVX-512 the kernels are compiled without loop if-conversion.
GCC_AVX512_WORKAROUND = ('#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)\n'
                         '#pragma GCC optimize("no-tree-loop-if-convert")\n#endif')

def vector_typedef(dtype: DType) -> str:
  """The typedef that declares `vector_type(dtype)`."""
  lane_bytes = 4 if dtype.scalar == dtypes.bool else dtype.scalar.itemsize   # bool lanes are int masks
  return (f"typedef {_VECTOR_LANE_TYPES[dtype.scalar]} {vector_type(dtype)} "
          f"__attribute__((vector_size({lane_bytes * dtype.count})));")

def c_type(dtype: DType) -> str:
  """The C type a value of `dtype` (scalar or vector) is computed in."""
  return vector_type(dtype) if dtype.count > 1 else VALUE_TYPES[dtype]

def _mask_of(dtype: DType) -> str: return vector_type(dtypes.bool.vec(dtype.count))

def _vector_select(dtype: DType, mask: str, a: str, b: str) -> str:
  """Lane k of `a` where lane k of `mask` is all ones, else of `b` (bitwise, so NaNs keep their bits)."""
  m = _mask_of(dtype)
  return f"(({c_type(dtype)})((({m})({mask})&({m})({a}))|(~({m})({mask})&({m})({b}))))"

def _vector_splat(dtype: DType, value) -> str:
  lanes = render_c_const(value, dtype.scalar) if dtype.scalar != dtypes.bool else ("-1" if value else "0")
  return f"(({vector_type(dtype)}){{{', '.join([lanes] * dtype.count)}}})"

def _vector_cast(u: UOp, a: list[str]) -> str:
  src, dst, x = u.src[0].dtype.scalar, u.dtype, a[0]
  if dst.scalar == dtypes.bool: return f"(({x})!={_vector_splat(u.src[0].dtype, 0)})"
  if src == dtypes.bool: x = f"(-({x}))"   # masks -1/0 -> 1/0
  if dtypes.is_float(src) and dtypes.is_int(dst.scalar):
    # as the scalar cast (_c_float_to_int): out-of-range and NaN lanes give INT_MIN; they are zeroed before the
    # conversion, since converting them is undefined (clang's vector code gave other values than its scalar code)
    if conversion_width(dst.scalar) != 32: raise TypeError(f"CRenderer: no vector cast from {src} to {dst.scalar}")
    limit, lanes = 2 ** 31, u.src[0].dtype
    no_sign = _vector_splat(dtypes.int32.vec(lanes.count), 2 ** 31 - 1)
    magnitude = f"(({vector_type(lanes)})(({_mask_of(lanes)})({x})&{no_sign}))"
    in_range = f"({magnitude}<{_vector_splat(lanes, limit)})"   # as the scalar cast: -2**31 gives INT_MIN either way
    safe = _vector_select(lanes, in_range, x, _vector_splat(lanes, 0.0))
    converted = f"__builtin_convertvector({safe}, {vector_type(dst)})"
    return _vector_select(dst, in_range, converted, _vector_splat(dst, -limit))
  if src in (dtypes.int32, dtypes.uint32) and dst.scalar in _BYTE_LANES:   # the low byte of each lane, as C does
    return f"__builtin_convertvector({x}, {vector_type(dst)})"
  if src in _BYTE_LANES and dst.scalar != dtypes.bool:
    x = f"{vector_widen_name(u.src[0].dtype)}({x})"   # to int32 lanes first (vector_widen_helper)
    if dst.scalar == dtypes.int32: return x
  if dtypes.is_float(src) != dtypes.is_float(dst.scalar) or src == dtypes.bool and dtypes.is_float(dst.scalar):
    return f"__builtin_convertvector({x}, {vector_type(dst)})"
  return f"(({vector_type(dst)})({x}))"   # int32 <-> uint32: the same bits, as C converts them

def _vector_max(u: UOp, a: list[str]) -> str:
  mask = f"(({a[0]})!=({a[0]}))|(({a[0]})>({a[1]}))" if dtypes.is_float(u.dtype.scalar) else f"({a[0]})>({a[1]})"
  return _vector_select(u.dtype, f"({mask})", a[0], a[1])

VECTOR_EXPRESSIONS: dict[Ops, Callable[[UOp, list[str]], str]] = {
  **{op: _infix(sym) for op, sym in ((Ops.ADD, "+"), (Ops.SUB, "-"), (Ops.MUL, "*"), (Ops.FDIV, "/"),
     (Ops.IDIV, "/"), (Ops.MOD, "%"), (Ops.CMPLT, "<"), (Ops.CMPNE, "!="), (Ops.CMPEQ, "=="), (Ops.AND, "&"),
     (Ops.OR, "|"), (Ops.XOR, "^"), (Ops.SHL, "<<"), (Ops.SHR, ">>"))},
  Ops.NEG: lambda u, a: f"(-{a[0]})", Ops.RECIP: lambda u, a: f"({_vector_splat(u.dtype, 1.0)}/{a[0]})",
  Ops.MAX: _vector_max, Ops.WHERE: lambda u, a: _vector_select(u.dtype, a[0], a[1], a[2]),
  Ops.CAST: _vector_cast, Ops.BITCAST: lambda u, a: f"(({vector_type(u.dtype)})({a[0]}))",
  Ops.MULACC: lambda u, a: f"{vector_fma_name(u.dtype)}({', '.join(a)})",
}

def vector_fma_name(dtype: DType) -> str: return f"kiln_fma_{vector_type(dtype)}"

# the x86 builtins GCC's own fmaintrin.h/avx512fintrin.h call, by lane count (float32 lanes), with the macro of the
# CPU feature each needs; clang has __builtin_elementwise_fma, and anything else gets one libm fmaf per lane
_X86_VECTOR_FMA = {16: ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),
                   8: ("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"),
                   4: ("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)")}

def vector_fma_helper(dtype: DType) -> str:
  """The inline function that computes a vector MULACC lane by lane, each lane rounded once (a fused multiply-add
  instruction where the compiler and CPU have one): C's a*b+c is two roundings under -ffp-contract=off."""
  t, n = vector_type(dtype), dtype.count
  found = _X86_VECTOR_FMA.get(n)
  x86 = [f"#elif defined({found[0]}) && !defined(__clang__)", f"  return {found[1]};"] if found else []
  lanes = ", ".join(f"__builtin_fmaf(a[{k}], b[{k}], c[{k}])" for k in range(n))
  return "\n".join([
    "#ifndef __has_builtin", "#define __has_builtin(x) 0", "#endif",
    f"static inline {t} {vector_fma_name(dtype)}({t} a, {t} b, {t} c) {{",
    "#if __has_builtin(__builtin_elementwise_fma)", "  return __builtin_elementwise_fma(a, b, c);", *x86,
    "#else", f"  return ({t}){{{lanes}}};", "#endif", "}"])

def _broadcast_operands(u: UOp) -> list[int]:
  """The positions in DP4A `u`'s sources of its 4-byte operands: the same 4 bytes for every lane."""
  return [i for i, s in enumerate(u.src[1:], 1) if u.dtype.count > 1 and s.dtype.count == 4]

def vector_dot_name(u: UOp) -> str:
  """The name of the helper that computes DP4A `u` (per accumulator width, byte-vector pairs, byte range and which
  operands are 4 bytes broadcast to every lane)."""
  broadcast = "".join(f"_b{i}" for i in _broadcast_operands(u))
  return f"kiln_dp4a_{vector_type(u.dtype)}_{(len(u.src) - 1) // 2}{'_small' if u.arg else ''}{broadcast}"

def vector_dot_dtypes(u: UOp) -> list[DType]:
  """The vector dtypes DP4A `u`'s helper declares: its own, its operands' and a broadcast operand's full width."""
  wide = [u.src[i].dtype.scalar.vec(4 * u.dtype.count) for i in _broadcast_operands(u)]
  return [u.dtype, *(s.dtype for s in u.src), *wide]

# GCC's builtins (what its own intrinsics headers call), by int32 lanes, with the CPU feature macros that enable
# them: VNNI's vpdpbusd, else (unsigned bytes below 128 only) pmaddubsw's int16 sums of two products, then pmaddwd
# by ones; elsewhere (clang, or none of these) the helper widens and sums lane by lane, which is exact too
_X86_VNNI = {16: ("defined(__AVX512VNNI__)", "v16si"),
             8: ("(defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)", "v8si"),
             4: ("(defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)", "v4si")}
_X86_MADDUBS = {16: ("defined(__AVX512BW__)", "__builtin_ia32_pmaddubsw512_mask(a, b, (kiln_h){{0}}, -1)",
                     "__builtin_ia32_pmaddwd512_mask(x, ones, (kiln_intx16){{0}}, (unsigned short)-1)"),
                8: ("defined(__AVX2__)", "__builtin_ia32_pmaddubsw256(a, b)", "__builtin_ia32_pmaddwd256(x, ones)"),
                4: ("defined(__SSSE3__)", "__builtin_ia32_pmaddubsw128(a, b)", "__builtin_ia32_pmaddwd128(x, ones)")}

def vector_dot_helper(u: UOp) -> str:
  """The inline function for DP4A `u`: int32 lane l of `acc` plus, for each pair (a, b) of byte vectors, the sum of
  a[4l+k] * b[4l+k] over k < 4."""
  t, n, pairs = vector_type(u.dtype), u.dtype.count, (len(u.src) - 1) // 2
  broadcast = _broadcast_operands(u)
  def param(p: int, side: int) -> str:
    name = f"{'ab'[side]}{p}"
    return f"{vector_type(u.src[1 + 2 * p + side].dtype)} {name}{'_word' if 1 + 2 * p + side in broadcast else ''}"
  params = ", ".join([f"{t} acc"] + [param(p, s) for p in range(pairs) for s in (0, 1)])
  lanes = []
  for lane in range(n):
    terms = [f"(int)a{p}[{4 * lane + k}]*(int)b{p}[{4 * lane + k}]" for p in range(pairs) for k in range(4)]
    lanes.append(" + ".join([f"acc[{lane}]", *terms]))
  lines = [f"static inline {t} {vector_dot_name(u)}({params}) {{"]
  for i in broadcast:   # 4 bytes as one int, broadcast to every lane: vpbroadcastd (or the memory broadcast)
    name, wide = f"{'ab'[(i - 1) % 2]}{(i - 1) // 2}", vector_type(u.src[i].dtype.scalar.vec(4 * n))
    lines += [f"  int {name}_int; __builtin_memcpy(&{name}_int, &{name}_word, 4);",
              f"  const {wide} {name} = ({wide})(({t}){{0}} + {name}_int);"]
  unsigned_signed = all(u.src[1 + 2 * p].dtype.scalar == dtypes.uint8 and u.src[2 + 2 * p].dtype.scalar == dtypes.int8
                        for p in range(pairs))
  gcc = "defined(__GNUC__) && !defined(__clang__)"
  branch = "#if"
  if (vnni := _X86_VNNI.get(n)) is not None and unsigned_signed:
    chain = "acc"
    for p in range(pairs): chain = f"__builtin_ia32_vpdpbusd_{vnni[1]}({chain}, ({t})a{p}, ({t})b{p})"
    lines += [f"{branch} {gcc} && ({vnni[0]})", f"  return {chain};"]
    branch = "#elif"
  if (maddubs := _X86_MADDUBS.get(n)) is not None and unsigned_signed and u.arg:
    feature, pair_sums, quad_sums = maddubs
    lines += [f"{branch} {gcc} && {feature}",
              f"  typedef char kiln_q __attribute__((vector_size({4 * n})));",
              f"  typedef short kiln_h __attribute__((vector_size({4 * n})));",
              f"  const kiln_h ones = {{{', '.join(['1'] * (2 * n))}}};", f"  {t} r = acc;"]
    for p in range(pairs):
      lines += [f"  {{ kiln_q a = (kiln_q)a{p}, b = (kiln_q)b{p}; kiln_h x = (kiln_h){pair_sums.format()};",
                f"    r += ({t}){quad_sums.format()}; }}"]
    lines += ["  return r;"]
    branch = "#elif"
  generic = f"  return ({t}){{{', '.join(lanes)}}};"
  lines += [generic] if branch == "#if" else ["#else", generic, "#endif"]
  return "\n".join(lines + ["}"])

# a split reduction's scratch buffer: a counter of finished chunks (reset by the chunk that combines), then partials
SCRATCH_HEADER_BYTES = 16

class CRenderer(Renderer):
  """Renders a linearized kernel as `void name(T* restrict data0, ..., int var0, ..., int kiln_tid,
  int kiln_nthreads)` in GNU C (the last two split the outermost loop across threads where that is safe)."""
  device = "CPU"
  has_local = False
  # libm's expf/log2f/sinf are calls the compiler cannot vectorize; kiln's software versions (<= 1 ulp, see
  # docs/transcendental.md) vectorize with the rest of the loop: softmax 4096x4096 208 -> 109 ms on 2 cores
  has_native_transcendentals = False
  renders_math_forms = True   # for TRANSCENDENTAL=0 (software math rewrites the forms first otherwise)
  renders_byte_dots = True
  packs_matmul_operands = True   # kiln/schedule/pack.py: matmul 2048 120-138 -> 195 GFLOP/s on a 2-core EPYC

  has_threads = True
  vectorizes = True   # GNU C vector extensions

  def render(self, name: str, uops: list[UOp], threads: ThreadPlan = ONE_THREAD) -> str:
    """The C source of function `name` (see the module docstring for the semantics), split over threads as `threads`
    says."""
    return _CKernelWriter(kernel_function_name(name), uops, threads).render()

class _CKernelWriter(KernelWriter):
  """Walks one uop list, naming values and emitting lines of C."""
  renderer_name = "CRenderer"   # in error messages
  expressions = C_EXPRESSIONS

  def __init__(self, name: str, uops: list[UOp], threads: ThreadPlan = ONE_THREAD):
    super().__init__(name, uops)
    self.names: dict[UOp, str] = {}
    self.depth = 1
    self.open_ranges: list[str] = []
    self.parallel, self.reduction, self.streams = threads
    self.reduce_lines = (0, 0)   # where the split reduction's loop starts and ends in self.lines
    self.uses_bf16 = self.uses_half = False
    self.uses_fp8: set[DType] = set()
    self.noted: set[DType] = set()   # the dtypes note_dtype has checked and noted
    self.vector_types: dict[DType, None] = {}   # the vector dtypes used, for their typedefs
    self.vector_consts: dict[UOp, str] = {}     # vector constants, declared once at file scope
    self.vector_fmas: dict[DType, None] = {}    # the vector dtypes of MULACCs, for their helpers
    self.vector_widens: dict[DType, None] = {}  # the byte vector dtypes widened, for their helpers
    self.vector_dots: dict[str, str] = {}       # DP4A helper name -> its source
    self.positions: dict[UOp, int] | None = None   # uop -> its index, made when a short loop asks (_short_reduce_loop)
    self.statements.update({
      Ops.RANGE: self._range, Ops.ENDRANGE: self._endrange, Ops.LOAD: self._load, Ops.STORE: self._store,
      Ops.DEFINE_ACC: self._define_acc, Ops.ASSIGN: self._assign, Ops.DP4A: self._dp4a,
      **{op: self._nothing for op in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SINK, Ops.GEP,
                                      Ops.VECTORIZE)}})

  # ---- names of values ----
  def expr(self, u: UOp) -> str:
    """The C expression that reads the value of `u` at this point of the kernel."""
    # most reads are of a computed value's name (constants, lanes, vectors and parameters never get one)
    if (name := self.names.get(u)) is not None: return name
    if u.op is Ops.CONST: return render_c_const(u.arg, u.dtype) if u.dtype.count == 1 else self.vector_const(u)
    if u.op is Ops.GEP:   # read where it is used: an accumulator's lane has its current value
      lane = f"{self.expr(u.src[0])}[{u.arg}]"
      return f"({lane}!=0)" if u.dtype == dtypes.bool else lane
    if u.op is Ops.VECTORIZE:
      self.note_dtype(u.dtype)
      lanes = [f"-(int)({self.expr(s)})" if u.dtype.scalar == dtypes.bool else self.expr(s) for s in u.src]
      return f"(({vector_type(u.dtype)}){{{', '.join(lanes)}}})"
    if u.op is Ops.DEFINE_GLOBAL: return f"data{u.arg}"
    if u.op is Ops.DEFINE_VAR:
      name = self.var_names[u]
      return name if u.dtype == dtypes.int32 else f"(({VALUE_TYPES[u.dtype]}){name})"
    if u not in self.names:
      raise ValueError(f"CRenderer: {u.op.name} is used before it is computed in kernel {self.name}")
    return self.names[u]

  def emit(self, line: str) -> None:
    """Add one line at the current loop depth."""
    self.lines.append("  " * self.depth + line)

  def vector_const(self, u: UOp) -> str:
    """The name of a vector constant (declared at file scope, once per kernel source)."""
    self.note_dtype(u.dtype)
    if u not in self.vector_consts: self.vector_consts[u] = f"kiln_const{len(self.vector_consts)}"
    return self.vector_consts[u]

  def note_dtype(self, dtype: DType) -> None:
    """Check that `dtype` is supported and remember whether the 16-bit float helpers are needed."""
    if dtype in self.noted: return   # (asked for every operand of every uop: a kernel has a few dtypes)
    self._note_new_dtype(dtype)
    self.noted.add(dtype)

  def _note_new_dtype(self, dtype: DType) -> None:
    """note_dtype for a dtype seen the first time in this kernel."""
    if dtype.count > 1:
      vector_type(dtype)   # raises for lanes without a vector type
      self.vector_types.setdefault(dtype)
      self.vector_types.setdefault(dtypes.bool.vec(dtype.count))   # selects and MAX go through a mask
      dtype = dtype.scalar
    if dtype not in VALUE_TYPES: raise TypeError(f"CRenderer: dtype {dtype} is not supported in kernel {self.name}")
    if dtype == dtypes.bfloat16: self.uses_bf16 = True
    if dtype == dtypes.float16: self.uses_half = True
    if dtype in dtypes.fp8s: self.uses_fp8.add(dtype)

  # ---- statements ----
  def _nothing(self, u: UOp) -> None: pass

  def _range(self, u: UOp) -> None:
    name = f"ridx{u.arg}" if isinstance(u.arg, int) and u.arg >= 0 else self.fresh_name("ridx_")
    if name in self.open_ranges: name = self.fresh_name(f"{name}_")   # never shadow an enclosing loop variable
    self.open_ranges.append(name)
    ctype, extent = VALUE_TYPES[u.dtype], self.expr(u.src[0])
    if self.reduction is not None and u is self.reduction.loop:   # chunk `kiln_chunk` of a fixed number of chunks
      chunks = self.reduction.chunks
      self.reduce_lines = (len(self.lines), 0)
      self.emit(f"const {ctype} {name}_begin = ({ctype})((long long)({extent})*kiln_chunk/{chunks});")
      self.emit(f"const {ctype} {name}_end = ({ctype})((long long)({extent})*(kiln_chunk+1)/{chunks});")
      # the chunk lies inside the loop's range: without saying so, -fwrapv keeps the compiler from proving that the
      # index arithmetic cannot wrap, and it stops vectorizing (an int32 sum ran 5x slower)
      self.emit(f"if ({name}_begin < 0 || {name}_end > {extent}) __builtin_unreachable();")
      self.emit(f"for ({ctype} {name} = {name}_begin; {name} < {name}_end; {name}++) {{")
    elif self.parallel is not None and u is self.parallel.loop:   # this thread's contiguous, balanced chunk
      self.emit(f"const {ctype} {name}_begin = ({ctype})((long long)({extent})*kiln_tid/kiln_nthreads);")
      self.emit(f"const {ctype} {name}_end = ({ctype})((long long)({extent})*(kiln_tid+1)/kiln_nthreads);")
      if u.src[0].op is Ops.CONST and u.src[0].arg <= SKIP_TO_CHUNK_MAX_EXTENT:
        # the loop keeps its constant bounds so the compiler knows the range of every index (with -fwrapv it cannot
        # otherwise prove that adjacent elements are adjacent, and stops vectorizing); other chunks are skipped
        self.emit(f"for ({ctype} {name} = 0; {name} < {extent}; {name}++) {{")
        self.emit(f"  if ({name} < {name}_begin) continue;")
        self.emit(f"  if ({name} >= {name}_end) break;")
      else: self.emit(f"for ({ctype} {name} = {name}_begin; {name} < {name}_end; {name}++) {{")
      self.names[u] = name
      self._prefetch_streams(u, name)
    else:
      # a reduction's loop of a few iterations (a 3x3 window) is unrolled by the compiler: gcc keeps it rolled, paying
      # its branch and counter every few vector FMAs of a conv tile (clang unrolls it unasked). Only a short body:
      # unrolling every short loop cost the cold transformer graph ~50% more compile time
      if u.src[0].op is Ops.CONST and 2 <= u.src[0].arg <= MAX_PRAGMA_UNROLL and self._short_reduce_loop(u):
        self.lines.append(f"#pragma GCC unroll {u.src[0].arg}")
      self.emit(f"for ({ctype} {name} = 0; {name} < {extent}; {name}++) {{")
    self.names[u] = name
    self.depth += 1

  def _prefetch_streams(self, loop: UOp, name: str) -> None:
    """At the top of each iteration of the thread-split loop, prefetch the blocks that an iteration PREFETCH_BYTES
    ahead reads from each buffer the loop streams through in small blocks (a matrix-vector product's weight rows:
    the plan's `streams`, from kiln/codegen/parallel.py `streamed_loads`). The hardware prefetcher follows such a
    stream only a little ahead of the loads of a kernel that computes between them: a decode step's Q4_1 matvec 1536x576 streaming from memory
    took 100 us, prefetched 48-72 us (one thread; the same data in cache: 33 us)."""
    streams = [(st, st.stride * st.buffer.dtype.itemsize, (st.high - st.low + 1) * st.buffer.dtype.itemsize)
               for st in self.streams]
    streams = [(st, stride, size) for st, stride, size in streams if stride >= 64 and size <= PREFETCH_MAX_BLOCK]
    if not streams: return
    ahead = max(1, -(-PREFETCH_BYTES // max(stride for _, stride, _ in streams)))
    for st, _, size in streams:
      start = f"(const char*)(data{st.buffer.arg} + (long long){st.stride}*({name} + {ahead}) + {st.low})"
      for offset in range(0, size, 64): self.emit(f"  __builtin_prefetch({start} + {offset}, 0, 3);")

  def _short_reduce_loop(self, rng: UOp) -> bool:
    """Whether loop `rng` is a reduction's (its body updates accumulators and stores nothing) and its body, inner
    loops included, is at most MAX_PRAGMA_UNROLL_BODY uops."""
    if self.positions is None: self.positions = {u: i for i, u in enumerate(self.uops)}
    start, updates = self.positions[rng], False
    for u in self.uops[start + 1:start + 2 + MAX_PRAGMA_UNROLL_BODY]:
      if u.op is Ops.ENDRANGE and u.src[0] is rng: return updates
      if u.op is Ops.STORE: return False
      updates = updates or u.op is Ops.ASSIGN
    return False

  def _endrange(self, u: UOp) -> None:
    if self.depth <= 1: raise ValueError(f"CRenderer: ENDRANGE without an open RANGE in kernel {self.name}")
    self.depth -= 1
    self.open_ranges.pop()
    self.emit("}")
    if self.reduction is not None and u.src[0] is self.reduction.loop: self.reduce_lines = (self.reduce_lines[0],
                                                                                             len(self.lines))

  def vector_address(self, buf: UOp, index: UOp) -> str:
    """The address of a vector load or store at `index` of `buf`. An index `x + c` (c > 0, x >= 0) is `buf+(x)+c`:
    the int sum with -fwrapv is not the pointer sum to gcc, which then keeps one pointer per constant (a byte dot
    product's tile, 64 broadcast loads a step, spilled them all); as pointer arithmetic they share one base."""
    if index.op is Ops.ADD and index.src[1].op is Ops.CONST and index.src[1].arg > 0:
      try: base_min = int(index.src[0].vmin)
      except Exception: base_min = -1
      if base_min >= 0: return f"{self.expr(buf)}+({self.expr(index.src[0])})+{index.src[1].arg}"
    return f"{self.expr(buf)}+({self.expr(index)})"

  def _load(self, u: UOp) -> None:
    buf, index = u.src[0], u.src[1]
    self.note_dtype(u.dtype)
    if u.dtype.count > 1:   # consecutive lanes from `index` on, unaligned
      name = self.fresh_name("val")
      self.emit(f"{vector_type(u.dtype)} {name}; __builtin_memcpy(&{name}, {self.vector_address(buf, index)}, "
                f"sizeof({name}));")
      self.names[u] = name
      return
    # `x + c` as pointer arithmetic (vector_address), so the constant offsets share one base pointer: a 3x3 conv's
    # 72 weight loads a step (8 channels x 9 taps) kept a pointer each, spilled, as `data[x+c]` under -fwrapv
    address = self.vector_address(buf, index)
    read = f"*({address})" if not address.endswith(")") else f"{self.expr(buf)}[{self.expr(index)}]"
    if u.dtype == dtypes.bfloat16: read = f"kiln_bf16_to_f({read})"
    elif u.dtype == dtypes.float16: read = f"kiln_half_to_f({read})"
    elif u.dtype in dtypes.fp8s: read = f"kiln_{u.dtype.name}_to_f({read})"
    elif u.dtype == dtypes.bool: read = f"(_Bool){read}"
    if len(u.src) == 3: read = f"({self.expr(u.src[2])}?{read}:{render_c_const(0, u.dtype)})"
    name = self.fresh_name("val")
    self.emit(f"const {VALUE_TYPES[u.dtype]} {name} = {read};")
    self.names[u] = name

  def _store(self, u: UOp) -> None:
    buf, index, value = u.src[:3]
    self.note_dtype(value.dtype)
    if value.dtype.count > 1:
      if len(u.src) == 4: raise ValueError(f"CRenderer: a vector STORE cannot be gated (kernel {self.name})")
      self.emit(f"{{ const {vector_type(value.dtype)} kiln_lanes = {self.expr(value)}; "
                f"__builtin_memcpy({self.vector_address(buf, index)}, &kiln_lanes, sizeof(kiln_lanes)); }}")
      return
    written = self.expr(value)
    if value.dtype == dtypes.bfloat16: written = f"kiln_f_to_bf16({written})"
    elif value.dtype == dtypes.float16: written = f"kiln_half_bits({written})"
    elif value.dtype in dtypes.fp8s: written = f"kiln_{value.dtype.name}_bits({written})"
    elif value.dtype == dtypes.bool: written = f"(unsigned char){written}"
    line = f"{self.expr(buf)}[{self.expr(index)}] = {written};"
    self.emit(f"if ({self.expr(u.src[3])}) {line}" if len(u.src) == 4 else line)

  def _define_acc(self, u: UOp) -> None:
    self.note_dtype(u.dtype)
    name = self.fresh_name("acc")
    self.emit(f"{c_type(u.dtype)} {name} = {self.expr(u.src[0])};")
    self.names[u] = name

  def _assign(self, u: UOp) -> None:
    target, value = u.src
    if target.op is not Ops.DEFINE_ACC: raise ValueError(f"CRenderer: ASSIGN must target a DEFINE_ACC, got {target.op}")
    self.emit(f"{self.expr(target)} = {self.expr(value)};")
    self.names[u] = self.expr(target)

  def _dp4a(self, u: UOp) -> None:
    for dtype in vector_dot_dtypes(u): self.note_dtype(dtype)
    self.vector_dots.setdefault(vector_dot_name(u), vector_dot_helper(u))
    name = self.fresh_name("dot")
    self.emit(f"const {c_type(u.dtype)} {name} = {vector_dot_name(u)}({', '.join(self.expr(s) for s in u.src)});")
    self.names[u] = name

  def _value(self, u: UOp) -> None:
    """An ALU/CAST/BITCAST value: one `const T name = expr;` line."""
    for dtype in (u.dtype, *(s.dtype for s in u.src)): self.note_dtype(dtype)
    if u.dtype.count > 1:
      if u.op not in VECTOR_EXPRESSIONS: raise NotImplementedError(f"CRenderer: no vector form of {u.op} ({self.name})")
      if u.op is Ops.MULACC: self.vector_fmas.setdefault(u.dtype)
      if u.op is Ops.CAST and u.src[0].dtype.scalar in _BYTE_LANES and u.dtype.scalar != dtypes.bool:
        self.note_dtype(dtypes.int32.vec(u.dtype.count))
        self.vector_widens.setdefault(u.src[0].dtype)
      text = VECTOR_EXPRESSIONS[u.op](u, [self.expr(s) for s in u.src])
    else:
      if u.op in GroupOp.ALU: check_alu_dtypes("CRenderer", u)
      # EXP2(a * (1/ln2)) (float32/float64) is kiln's exp(a): libm's exp of a, not exp2 of the rounded product (60
      # ulp near overflow)
      # (likewise the float64 cos and tan forms, SIN(pi/2 - y) and SIN(y) / SIN(pi/2 - y), when software math is off)
      exp_of = exp_argument(u.src[0]) if u.op is Ops.EXP2 else None
      cos_of = cos_argument(u.src[0]) if u.op is Ops.SIN else None
      if exp_of is not None: text = _libm("exp")(u, [self.expr(exp_of)])
      elif cos_of is not None: text = _libm("cos")(u, [self.expr(cos_of)])
      elif (tan_of := tan_argument(u)) is not None: text = f"__builtin_tan({self.expr(tan_of)})"
      else: text = self.value_text(u, [self.expr(s) for s in u.src])
    name = self.fresh_name(_VALUE_PREFIX.get(u.op, "alu"))
    self.emit(f"const {c_type(u.dtype)} {name} = {text};")
    self.names[u] = name

  def value_text(self, u: UOp, args: list[str]) -> str:
    """The C expression of ALU/CAST/BITCAST `u` applied to the expressions `args` (16-bit floats rounded per op)."""
    text = C_EXPRESSIONS[u.op](u, args)
    if u.op in GroupOp.ALU and u.op not in EXACT_FLOAT_OPS:   # 16-bit floats: computed in float, rounded per op
      if u.dtype == dtypes.float16: text = f"kiln_half_round_f({text})"
      elif u.dtype == dtypes.bfloat16: text = f"kiln_bf16_round({text})"
      elif u.dtype in dtypes.fp8s: text = f"kiln_{u.dtype.name}_round({text})"
    return text

  def walk_kernel(self) -> tuple[list[UOp], list[UOp]]:
    """Emit the body, a statement per uop in order; the kernel's buffer and variable parameters."""
    buffers, variables = kernel_signature(self.uops)
    self.var_names = {v: f"var{i}" for i, v in enumerate(variables)}
    self.walk()
    self.check_closed(self.depth - 1)
    for b in buffers: self.note_dtype(b.dtype)
    return buffers, variables

  def write(self) -> str:
    """The whole C source: helpers, signature and body."""
    buffers, variables = self.walk_kernel()
    params = [f"{STORAGE_TYPES[b.dtype]}* restrict data{b.arg}" for b in buffers]
    params += [f"int {self.var_names[v]}" for v in variables] + ["int kiln_tid", "int kiln_nthreads"]
    head = [GCC_AVX512_WORKAROUND] + ([HALF_HELPERS] if self.uses_half else [])
    head += [BF16_HELPERS] if self.uses_bf16 else []
    if self.uses_fp8: head += [FP8_HELPERS] + [fp8_helpers(dt) for dt in dtypes.fp8s if dt in self.uses_fp8]
    head += [vector_typedef(dt) for dt in self.vector_types] + [vector_fma_helper(dt) for dt in self.vector_fmas]
    head += [vector_widen_helper(dt) for dt in self.vector_widens] + list(self.vector_dots.values())
    for const, name in self.vector_consts.items():
      lanes = [("-1" if v else "0") if const.dtype.scalar == dtypes.bool else render_c_const(v, const.dtype.scalar)
               for v in const.arg]
      head.append(f"static const {vector_type(const.dtype)} {name} = {{{', '.join(lanes)}}};")
    if self.reduction is not None: return "\n".join(head + self.split_reduction(buffers, variables, params))
    kernel = [f"void {self.name}({', '.join(params)}) {{", *self.lines, "}"]
    return "\n".join(head + kernel + self.task(buffers, variables))

  def task(self, buffers: list[UOp], variables: list[UOp]) -> list[str]:
    """For a split kernel, the thread pool's entry point and the work estimate; nothing otherwise."""
    if self.parallel is None: return [""]
    args = [f"({STORAGE_TYPES[b.dtype]}*)bufs[{i}]" for i, b in enumerate(buffers)]
    args += [f"vals[{i}]" for i in range(len(variables))] + ["tid", "nthreads"]
    return [f"void {task_symbol(self.name)}(void **bufs, const int *vals, int tid, int nthreads) {{",
            f"  {self.name}({', '.join(args)});", "}",
            f"const long long {work_symbol(self.name)} = {self.parallel.work}ll;", ""]

  def split_reduction(self, buffers: list[UOp], variables: list[UOp], params: list[str]) -> list[str]:
    """A split reduction (kiln/codegen/parallel.py, SplitReduction) as `<name>_part` (one chunk's partials into the
    scratch), `<name>_finish` (partials combined in chunk order, then the epilogue and stores), the kernel (every
    chunk, then finish, on the calling thread) and `<name>_task` (one chunk; the last chunk to end finishes)."""
    red = self.reduction
    if red is None: raise ValueError(f"CRenderer: kernel {self.name} is not a split reduction")
    start, end = self.reduce_lines
    prologue, loop, after = self.lines[:start], self.lines[start:end], self.lines[end:]
    epilogue, closers = after[:len(after) - len(red.outer)], after[len(after) - len(red.outer):]
    indent = "  " * (len(red.outer) + 1)
    slots = red.chunks * red.outer_iterations
    # each accumulator's partials: one slot per chunk and outer iteration, 8 bytes for a scalar, the vector's size
    # for a vector (copied with memcpy: the scratch is only 16-byte aligned)
    sizes = [8 if acc.dtype.count == 1 else acc.dtype.itemsize for acc, _ in red.accumulators]
    offsets = [slots * sum(sizes[:j]) for j in range(len(sizes))]
    def slot(j: int, chunk: str) -> str:
      return f"(kiln_scratch + {offsets[j]} + ({chunk}*{red.outer_iterations}+kiln_outer)*{sizes[j]})"
    def partial(j: int, acc: UOp, chunk: str) -> str:
      if acc.dtype.count == 1:
        return f"(({VALUE_TYPES[acc.dtype]}*)(kiln_scratch + {offsets[j]}))[{chunk}*{red.outer_iterations}+kiln_outer]"
      return (f"({{ {vector_type(acc.dtype)} kiln_part; __builtin_memcpy(&kiln_part, {slot(j, chunk)}, "
              f"sizeof(kiln_part)); kiln_part; }})")
    stores = [f"{indent}{partial(j, acc, 'kiln_chunk')} = {self.names[acc]};" if acc.dtype.count == 1 else
              f"{indent}__builtin_memcpy({slot(j, 'kiln_chunk')}, &{self.names[acc]}, sizeof({self.names[acc]}));"
              for j, (acc, _) in enumerate(red.accumulators)]
    combines = [f"{indent}for (int kiln_chunk = 0; kiln_chunk < {red.chunks}; kiln_chunk++) {{"]
    for j, (acc, update) in enumerate(red.accumulators):
      args = [self.names[acc], partial(j, acc, "kiln_chunk")]
      combined = self.value_text(update, args) if acc.dtype.count == 1 else VECTOR_EXPRESSIONS[update.op](update, args)
      combines.append(f"{indent}  {self.names[acc]} = {combined};")
    combines.append(f"{indent}}}")
    own = params[:-2]   # without kiln_tid, kiln_nthreads
    args = [f"data{b.arg}" for b in buffers] + [self.var_names[v] for v in variables]
    task_args = [f"({STORAGE_TYPES[b.dtype]}*)bufs[{i}]" for i, b in enumerate(buffers)]
    task_args += [f"vals[{i}]" for i in range(len(variables))]
    part, finish, scratch = f"{self.name}_part", f"{self.name}_finish", slots * sum(sizes)
    return [
      f"static inline void {part}({', '.join(own + ['int kiln_chunk', 'unsigned char* restrict kiln_scratch'])}) {{",
      "  long long kiln_outer = 0;", *prologue, *loop, *stores, f"{indent}kiln_outer++;", *closers, "}",
      f"static inline void {finish}({', '.join(own + ['unsigned char* restrict kiln_scratch'])}) {{",
      "  long long kiln_outer = 0;", *prologue, *combines, *epilogue, f"{indent}kiln_outer++;", *closers, "}",
      f"void {self.name}({', '.join(params)}) {{",
      f"  unsigned char kiln_scratch[{scratch}] __attribute__((aligned(16)));",
      f"  for (int kiln_chunk = 0; kiln_chunk < {red.chunks}; kiln_chunk++) "
      f"{part}({', '.join(args + ['kiln_chunk', 'kiln_scratch'])});",
      f"  {finish}({', '.join(args + ['kiln_scratch'])});", "}",
      f"void {task_symbol(self.name)}(void **bufs, const int *vals, int chunk, int nchunks) {{",
      f"  unsigned char *kiln_scratch = (unsigned char *)bufs[{len(buffers)}];",
      f"  {part}({', '.join(task_args + ['chunk', f'kiln_scratch + {SCRATCH_HEADER_BYTES}'])});",
      "  /* the last chunk to end combines the partials, in chunk order whichever thread runs it */",
      f"  if (__atomic_add_fetch((unsigned int *)kiln_scratch, 1u, __ATOMIC_ACQ_REL) == {red.chunks}u) {{",
      "    __atomic_store_n((unsigned int *)kiln_scratch, 0u, __ATOMIC_RELAXED);",
      f"    {finish}({', '.join(task_args + [f'kiln_scratch + {SCRATCH_HEADER_BYTES}'])});", "  }", "}",
      f"const long long {work_symbol(self.name)} = {red.work}ll;",
      f"const long long {chunks_symbol(self.name)} = {red.chunks}ll;",
      f"const long long {scratch_symbol(self.name)} = {SCRATCH_HEADER_BYTES + scratch}ll;", ""]
