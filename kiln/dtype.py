"""Data types: DType, the `dtypes` namespace, promotion and safe casts."""
from __future__ import annotations
from dataclasses import dataclass
import enum, math, os, struct
from typing import Callable

class AddrSpace(enum.Enum):
  """Where a pointer points: device memory, a block's shared memory, registers."""
  GLOBAL = enum.auto()
  LOCAL = enum.auto()
  REG = enum.auto()

@dataclass(frozen=True, eq=False)
class DType:
  """An element type. `priority` orders types for promotion; `fmt` is the struct/numpy format char.

  A scalar dtype has `count` 1 and is its own `scalar`. `dt.vec(n)` is the dtype of `n` lanes of `dt` (made by the
  CPU vectorizer, kiln/codegen/vectorize.py, for kernel code only; tensors never have one); it is cached, so vector
  dtypes compare by identity too. The classifiers (`dtypes.is_float`, ...) answer for scalar dtypes only.
  `dt.ptr(size)` describes a pointer to `dt` elements (tinygrad's PtrDType, for introspection).

  `scalar` is a property; tinygrad has a method, so calling a DType returns it and `dt.scalar()` works too.

  >>> dtypes.float32.vec(8), dtypes.float32.vec(8) is dtypes.float32.vec(8), dtypes.float32.vec(8).scalar
  (dtypes.float.vec(8), True, dtypes.float)
  >>> dtypes.half.vec(4).scalar(), dtypes.half.vec(4).vcount, dtypes.int8.ptr(16).nbytes()
  (dtypes.half, 4, 16)
  """
  priority: int
  itemsize: int
  name: str
  fmt: str | None
  count: int = 1
  _scalar: DType | None = None   # the lane dtype of a vector dtype; None for a scalar
  # every DType is a singleton (module level, or cached by `vec`/`ptr`): equality is identity (fast), and unpickling
  # returns the singleton
  def __repr__(self) -> str:
    return f"dtypes.{self.name}" if self._scalar is None else f"{self._scalar!r}.vec({self.count})"
  def __reduce__(self):
    if self._scalar is not None: return _vector_dtype, (self._scalar.name, self.count)
    return _dtype_by_name, (self.name,)
  def __call__(self) -> DType: return self
  @staticmethod
  def new(priority: int, itemsize: int, name: str, fmt: str | None) -> DType:
    """A new scalar DType (not one of `dtypes`'; it equals only itself)."""
    return DType(priority, itemsize, name, fmt, 1, None)
  @property
  def scalar(self) -> DType:
    """The dtype of one lane (the dtype itself for a scalar)."""
    return self if self._scalar is None else self._scalar
  @property
  def base(self) -> DType:
    """What the dtype is made of: itself (a PtrDType's is the element dtype)."""
    return self
  @property
  def vcount(self) -> int:
    """The number of lanes (1 for a scalar)."""
    return self.count
  def nbytes(self) -> int:
    """Only a pointer dtype has a size in bytes: a RuntimeError here."""
    raise RuntimeError(f"{self!r} is not a pointer dtype: only ptr types have nbytes")
  def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
    """The dtype of a pointer to `size` elements of this dtype (-1: unknown size) in `addrspace`."""
    key = (self, size, addrspace)
    if key not in _PTR_DTYPES:
      _PTR_DTYPES[key] = PtrDType(self.priority, self.itemsize, self.name, self.fmt, self.count, None, self, addrspace, 1,
                                  size)
    return _PTR_DTYPES[key]
  def vec(self, sz: int) -> DType:
    """The dtype of `sz` lanes of this scalar dtype (the dtype itself for 1)."""
    if self._scalar is not None: raise TypeError(f"vec: {self!r} is already a vector dtype")
    if not isinstance(sz, int) or sz < 1: raise ValueError(f"vec: lane count must be an int >= 1, got {sz!r}")
    if self.itemsize == 0: raise TypeError(f"vec: {self!r} has no size and cannot have lanes")
    if sz == 1: return self
    key = (self.name, sz)
    if key not in _VECTOR_DTYPES:
      _VECTOR_DTYPES[key] = DType(self.priority, self.itemsize * sz, f"{self.name}x{sz}", None, sz, self)
    return _VECTOR_DTYPES[key]
  def __lt__(self, other: DType) -> bool: return (self.priority, self.itemsize, self.name) < (other.priority, other.itemsize, other.name)
  @property
  def bitsize(self) -> int:
    """The size of one element in bits."""
    return self.itemsize * 8
  @property
  def min(self):
    """The smallest value of this dtype (as `dtypes.min`)."""
    return dtypes.min(self)
  @property
  def max(self):
    """The largest value of this dtype (as `dtypes.max`)."""
    return dtypes.max(self)

@dataclass(frozen=True, eq=False)
class PtrDType(DType):
  """A pointer to elements of `_base` (made by `DType.ptr`), in memory `addrspace`, `size` elements long (-1: unknown).

  >>> dtypes.float32.ptr(8), dtypes.float32.ptr(8).base, dtypes.float32.ptr(8).nbytes()
  (dtypes.float.ptr(8), dtypes.float, 32)
  """
  _base: DType = None  # type: ignore[assignment]
  addrspace: AddrSpace = AddrSpace.GLOBAL
  v: int = 1
  size: int = -1
  def __repr__(self) -> str:
    space = "" if self.addrspace is AddrSpace.GLOBAL else f", {self.addrspace}"
    return f"{self._base!r}.ptr({self.size}{space})"
  def __reduce__(self): return _pointer_dtype, (self._base, self.size, self.addrspace)
  @property
  def base(self) -> DType:
    """The element dtype."""
    return self._base
  @property
  def vcount(self) -> int:
    """The number of pointer lanes (1)."""
    return self.v
  def nbytes(self) -> int:
    """The size of the memory pointed to in bytes (0 when the size is unknown)."""
    return 0 if self.size == -1 else self.size * self.itemsize
  def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
    """A RuntimeError: there are no pointers to pointers."""
    raise RuntimeError(f"ptr: {self!r} is a pointer already; there are no pointers to pointers")
  def vec(self, sz: int) -> DType:
    """A TypeError: kiln has no vectors of pointers."""
    raise TypeError(f"vec: kiln has no vectors of pointers ({self!r})")

_PTR_DTYPES: dict[tuple, PtrDType] = {}

def _pointer_dtype(base: DType, size: int, addrspace: AddrSpace) -> PtrDType: return base.ptr(size, addrspace)

class dtypes:
  """The namespace of all dtypes, with classification helpers."""
  void = DType(-1, 0, "void", None)
  bool = DType(0, 1, "bool", "?")
  int8 = DType(1, 1, "char", "b")
  uint8 = DType(2, 1, "uchar", "B")
  int16 = DType(3, 2, "short", "h")
  uint16 = DType(4, 2, "ushort", "H")
  int32 = DType(5, 4, "int", "i")
  uint32 = DType(6, 4, "uint", "I")
  int64 = DType(7, 8, "long", "q")
  uint64 = DType(8, 8, "ulong", "Q")
  # OCP 8-bit floats: e4m3 ("fn": no inf, NaN = S.1111.111, max 448) and e5m2 (IEEE-like, with inf, max 57344)
  fp8e4m3 = DType(9, 1, "fp8e4m3", None)
  fp8e5m2 = DType(10, 1, "fp8e5m2", None)
  float16 = DType(11, 2, "half", "e")
  bfloat16 = DType(12, 2, "bfloat16", None)
  float32 = DType(13, 4, "float", "f")
  float64 = DType(14, 8, "double", "d")
  # aliases
  half, float, double = float16, float32, float64
  uchar, char, short, ushort, int, uint, long, ulong = uint8, int8, int16, uint16, int32, uint32, int64, uint64
  default_float: DType = float32
  default_int: DType = int32
  index: DType = int32
  fp8s = (fp8e4m3, fp8e5m2)
  # floats narrower than float32: reductions and products of them accumulate in float32 and round once
  narrow_floats = (float16, bfloat16) + fp8s
  floats = fp8s + (float16, bfloat16, float32, float64)
  uints = (uint8, uint16, uint32, uint64)
  sints = (int8, int16, int32, int64)
  ints = uints + sints
  all = floats + ints + (bool,)

  @staticmethod
  def is_float(x: DType) -> bool:
    """True for the floating-point dtypes (fp8e4m3, fp8e5m2, float16, bfloat16, float32, float64)."""
    return x in FLOATS
  @staticmethod
  def is_int(x: DType) -> bool:
    """True for the signed and unsigned integer dtypes (not bool)."""
    return x in INTS
  @staticmethod
  def is_unsigned(x: DType) -> bool:
    """True for the unsigned integer dtypes."""
    return x in UINTS
  @staticmethod
  def is_bool(x: DType) -> bool:
    """True for dtypes.bool."""
    return x == dtypes.bool
  @staticmethod
  def from_py(x) -> DType:
    """The dtype a Python value (or nested list of values) becomes."""
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, float): return dtypes.default_float
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, (list, tuple)): return max((dtypes.from_py(v) for v in x), default=dtypes.default_float)
    raise TypeError(f"cannot infer a dtype from {type(x).__name__} {x!r}")
  @staticmethod
  def as_const(val, dtype: DType):
    """`value` as the Python type of `dt` (int, float or bool); a tuple converts elementwise.

    >>> dtypes.as_const(2.7, dtypes.int32), dtypes.as_const(3, dtypes.float32), dtypes.as_const(2, dtypes.bool)
    (2, 3.0, True)
    """
    if isinstance(val, tuple): return tuple(dtypes.as_const(v, dtype) for v in val)
    if dtypes.is_int(dtype): return int(val)
    return float(val) if dtypes.is_float(dtype) else bool(val)
  @staticmethod
  def min(dtype: DType):
    """The smallest value of `dtype` (-inf for floats, as in tinygrad).

    >>> dtypes.min(dtypes.int8), dtypes.min(dtypes.uint16), dtypes.min(dtypes.float32)
    (-128, 0, -inf)
    """
    if dtype == dtypes.bool: return False
    if dtypes.is_unsigned(dtype): return 0
    if dtypes.is_int(dtype): return -(2 ** (dtype.bitsize - 1))
    return -math.inf
  @staticmethod
  def max(dtype: DType):
    """The largest value of `dtype` (inf for floats, as in tinygrad).

    >>> dtypes.max(dtypes.int8), dtypes.max(dtypes.uint32), dtypes.max(dtypes.bool)
    (127, 4294967295, True)
    """
    if dtype == dtypes.bool: return True
    if dtypes.is_unsigned(dtype): return 2 ** dtype.bitsize - 1
    if dtypes.is_int(dtype): return 2 ** (dtype.bitsize - 1) - 1
    return math.inf
  @staticmethod
  def finfo(dtype: DType) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float dtype; a ValueError for any other dtype.

    >>> dtypes.finfo(dtypes.float16), dtypes.finfo(dtypes.fp8e4m3)
    ((5, 10), (4, 3))
    """
    if not dtypes.is_float(dtype): raise ValueError(f"finfo: {dtype} is not a floating-point dtype")
    return _FLOAT_BITS[dtype]
  @staticmethod
  def fields() -> dict[str, DType]:
    """Every dtype by name, aliases included ('float32', 'float', 'half', ...; not void or index)."""
    return dict(DTYPES_BY_NAME)

UINTS = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
SINTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
INTS = UINTS + SINTS
FLOATS = dtypes.floats
# the dtypes with a numpy counterpart (fp8 has none; its values travel as float32)
ALL_DTYPES = (dtypes.bool,) + INTS + (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
_FLOAT_BITS = {dtypes.fp8e4m3: (4, 3), dtypes.fp8e5m2: (5, 2), dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7),
               dtypes.float32: (8, 23), dtypes.float64: (11, 52)}
DTYPES_BY_NAME: dict[str, DType] = {k: v for k, v in vars(dtypes).items() if isinstance(v, DType) and not k.startswith("default")
                                    and k not in ("void", "index")}

# Promotion lattice as in PyTorch/NumPy: bool < every int; signed and unsigned of the same width promote to the next signed;
# any float beats every int; float16 and bfloat16 promote to float32; fp8e4m3 and fp8e5m2 to float16 and bfloat16
# (as tinygrad; PyTorch does not promote fp8 at all).
_PARENTS: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
  dtypes.int32: (dtypes.int64,), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
  dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
  dtypes.fp8e4m3: (dtypes.float16, dtypes.bfloat16), dtypes.fp8e5m2: (dtypes.float16, dtypes.bfloat16),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,), dtypes.float64: ()}

def _ancestors(dt: DType) -> set[DType]:
  seen, stack = {dt}, [dt]
  while stack:
    for parent in _PARENTS[stack.pop()]:
      if parent not in seen: seen.add(parent); stack.append(parent)
  return seen

_ANCESTORS = {dt: _ancestors(dt) for dt in _PARENTS}

def _dtype_by_name(name: str) -> DType:
  return next(v for v in vars(dtypes).values() if isinstance(v, DType) and v.name == name)

_VECTOR_DTYPES: dict[tuple[str, int], DType] = {}

def _vector_dtype(name: str, count: int) -> DType: return _dtype_by_name(name).vec(count)

def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype that every dtype in `ds` promotes to, e.g. int32 and float16 -> float16."""
  common = set.intersection(*(_ANCESTORS[d] for d in ds))
  return min(common)

def sum_acc_dtype(dt: DType) -> DType:
  """The dtype `sum` accumulates and returns in (PyTorch: bool/ints -> int64, floats keep their type)."""
  if dt == dtypes.bool or dtypes.is_int(dt): return dtypes.uint64 if dtypes.is_unsigned(dt) and dt.itemsize == 8 else dtypes.int64
  return dt

def to_dtype(dtype) -> DType:
  """Accept a DType or a dtype name ('float32', 'half', ...); raise TypeError for anything else."""
  if isinstance(dtype, DType): return dtype
  if isinstance(dtype, str):
    if dtype in DTYPES_BY_NAME: return DTYPES_BY_NAME[dtype]
    raise TypeError(f"unknown dtype name {dtype!r}; known names: {', '.join(sorted(DTYPES_BY_NAME))}")
  if dtype is None: raise TypeError("a dtype is required, got None")
  import numpy as np
  try: return from_numpy_dtype(np.dtype(dtype))
  except TypeError: raise TypeError(f"cannot interpret {dtype!r} as a dtype") from None

_NP_NAMES = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16", dtypes.uint16: "uint16",
             dtypes.int32: "int32", dtypes.uint32: "uint32", dtypes.int64: "int64", dtypes.uint64: "uint64",
             dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}

def to_numpy_dtype(dt: DType):
  """The numpy dtype with the same bits (bfloat16 and fp8 have none: their bits travel as uint16 / uint8)."""
  import numpy as np
  if dt in dtypes.fp8s: return np.dtype("uint8")
  return np.dtype("uint16") if dt == dtypes.bfloat16 else np.dtype(_NP_NAMES[dt])

def from_numpy_dtype(npdt) -> DType:
  """The kiln dtype of a numpy dtype."""
  for dt, name in _NP_NAMES.items():
    if npdt.name == name: return dt
  raise TypeError(f"numpy dtype {npdt} has no kiln equivalent")

def _truncate(dt: DType, x):
  """Round a Python scalar to what `dt` can hold (wrap ints, round floats), as the device would."""
  import numpy as np
  if dt == dtypes.bool: return bool(x)
  if dtypes.is_int(dt):
    bits = dt.bitsize
    x = int(x) & ((1 << bits) - 1)
    return x - (1 << bits) if not dtypes.is_unsigned(dt) and x >= 1 << (bits - 1) else x
  if dt in FP8_FORMATS: return FP8_VALUES[dt][fp8_bits(float(x), dt)]
  if dt == dtypes.bfloat16:
    bits = int(np.array(x, np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000 if not math.isnan(x) else 0x7FC00000
    return float(np.array(bits, np.uint32).view(np.float32))
  with np.errstate(all="ignore"): return float(to_numpy_dtype(dt).type(x))

class _Truncate:
  """`truncate(dt, x)`: `x` rounded to what `dt` holds, as kiln's devices round a cast (ints wrap, floats round to
  nearest even). `truncate[dt]` is the same as a one-argument function, as tinygrad's dict of them is indexed.

  >>> truncate(dtypes.int8, 130), truncate[dtypes.uint8](-1), truncate[dtypes.float16](1/3)
  (-126, 255, 0.333251953125)
  """
  def __call__(self, dt: DType, x): return _truncate(dt, x)
  def __getitem__(self, dt: DType) -> Callable:
    if dt not in DTYPES_BY_NAME.values(): raise KeyError(dt)
    return lambda x: _truncate(dt, x)
  def __contains__(self, dt: DType) -> bool: return dt in DTYPES_BY_NAME.values()

truncate = _Truncate()

# ---------------- fp8 ----------------
# Conversions to fp8 round to nearest, ties to even, and saturate: a finite value beyond the largest becomes +-max, as
# in tinygrad (and CUDA's __NV_SATFINITE). +-inf becomes +-inf in e5m2, which has it (so every e5m2 value survives a
# store and load; tinygrad's float_to_fp8 gives +-max here), and +-max in e4m3fn, which has none (as torch). NaN stays
# NaN with its sign. The C renderer implements the same rounding (kiln/renderer/cstyle.py); this is the Python
# version, used for constants and the PYTHON device.
@dataclass(frozen=True)
class FP8Format:
  """The layout of an 8-bit float: mantissa bits, exponent of the smallest normal, codes of the largest finite value,
  of NaN and of what inf becomes."""
  mantissa_bits: int
  min_exponent: int
  max_code: int
  nan_code: int
  inf_code: int

  @property
  def has_inf(self) -> bool: return self.inf_code != self.max_code

FP8_FORMATS = {dtypes.fp8e4m3: FP8Format(3, -6, 0x7E, 0x7F, 0x7E), dtypes.fp8e5m2: FP8Format(2, -14, 0x7B, 0x7E, 0x7C)}

def fp8_bits(x: float, dt: DType) -> int:
  """The fp8 bit pattern of `x` (round to nearest even, finite overflow saturating to +-max; see above)."""
  f = FP8_FORMATS[dt]
  sign = 0x80 if math.copysign(1.0, x) < 0 else 0
  if math.isnan(x): return sign | f.nan_code
  magnitude = abs(x)
  if math.isinf(magnitude): return sign | f.inf_code
  if magnitude == 0: return sign
  # count in units of the spacing at x's binade (never finer than the subnormal spacing); round() ties to even
  quantum = max(math.frexp(magnitude)[1] - 1, f.min_exponent) - f.mantissa_bits
  count = round(math.ldexp(magnitude, -quantum))
  if count < 1 << f.mantissa_bits: return sign | count   # subnormal (a carry into the normals gives the same code)
  if count == 2 << f.mantissa_bits: count, quantum = count >> 1, quantum + 1   # rounding carried into the next binade
  code = ((quantum + f.mantissa_bits - f.min_exponent + 1) << f.mantissa_bits) + count - (1 << f.mantissa_bits)
  return sign | min(code, f.max_code)

def fp8_value(bits: int, dt: DType) -> float:
  """The value of an fp8 bit pattern."""
  f = FP8_FORMATS[dt]
  sign = -1.0 if bits & 0x80 else 1.0
  magnitude = bits & 0x7F
  field, mantissa = magnitude >> f.mantissa_bits, magnitude & ((1 << f.mantissa_bits) - 1)
  if f.has_inf and field == 0x7F >> f.mantissa_bits: return math.copysign(math.inf if mantissa == 0 else math.nan, sign)
  if not f.has_inf and magnitude == 0x7F: return math.copysign(math.nan, sign)
  if field == 0: return sign * math.ldexp(mantissa, f.min_exponent - f.mantissa_bits)
  return sign * math.ldexp(mantissa | (1 << f.mantissa_bits), field - 1 + f.min_exponent - f.mantissa_bits)

FP8_VALUES: dict[DType, list[float]] = {dt: [fp8_value(b, dt) for b in range(256)] for dt in FP8_FORMATS}

def fp8_to_float32(bits, dt: DType):
  """A numpy array of fp8 bit patterns (uint8) as the float32 values they stand for."""
  import numpy as np
  return np.array(FP8_VALUES[dt], np.float32)[np.asarray(bits, np.uint8)]

# ---------------- tinygrad's names ----------------

DTYPES_DICT: dict[str, DType] = DTYPES_BY_NAME   # every dtype by name, aliases included
INVERSE_DTYPES_DICT: dict[str, str] = {**{dt.name: key for key, dt in DTYPES_DICT.items()}, "void": "void"}
promo_lattice: dict[DType, tuple[DType, ...]] = _PARENTS   # each dtype -> the dtypes it promotes to directly
# DEFAULT_FLOAT=HALF (or any float dtype's name) in the environment sets dtypes.default_float at import, as in tinygrad
env_default_float: str = os.environ.get("DEFAULT_FLOAT", "")
if env_default_float:
  if not dtypes.is_float(DTYPES_DICT.get(env_default_float.lower(), dtypes.void)):
    raise ValueError(f"DEFAULT_FLOAT={env_default_float} is not a float dtype; one of: "
                     f"{', '.join(name for name, dt in DTYPES_DICT.items() if dtypes.is_float(dt))}")
  dtypes.default_float = DTYPES_DICT[env_default_float.lower()]

def least_upper_float(dt: DType) -> DType:
  """`dt` if it is a float dtype, else the float it promotes to together with dtypes.default_float."""
  return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.default_float)

_SAFE_CASTS: dict[DType, tuple[DType, ...]] = {
  dtypes.float64: (dtypes.float32, dtypes.float16, dtypes.bfloat16), dtypes.float32: (dtypes.float16, dtypes.bfloat16),
  dtypes.uint64: (dtypes.uint32, dtypes.uint16, dtypes.uint8), dtypes.uint32: (dtypes.uint16, dtypes.uint8),
  dtypes.int64: (dtypes.uint32, dtypes.uint16, dtypes.uint8, dtypes.int32, dtypes.int16, dtypes.int8),
  dtypes.int32: (dtypes.uint16, dtypes.uint8, dtypes.int16, dtypes.int8), dtypes.int16: (dtypes.uint8, dtypes.int8)}

def can_safe_cast(dt0: DType, dt1: DType) -> bool:
  """Whether every value of `dt0` survives a cast to `dt1` (as tinygrad's table; bool casts safely to anything).

  >>> can_safe_cast(dtypes.uint8, dtypes.int16), can_safe_cast(dtypes.int32, dtypes.float32)
  (True, False)
  """
  return dt0 == dt1 or dt0 == dtypes.bool or dt0 in _SAFE_CASTS.get(dt1, ())

def truncate_fp16(x) -> float:
  """`x` rounded to float16 (to nearest even); beyond float16's range it becomes +-inf."""
  try: return struct.unpack("e", struct.pack("e", float(x)))[0]
  except OverflowError: return math.copysign(math.inf, x)

def truncate_bf16(x) -> float:
  """`x` as bfloat16 the way tinygrad's helper does it: float32 bits with the low 16 cut off (toward zero, no
  rounding); beyond bfloat16's largest value it becomes +-inf. (kiln's devices round: see `truncate`.)"""
  if abs(x) > _BF16_MAX: return math.copysign(math.inf, x)
  bits = struct.unpack("I", struct.pack("f", x))[0]
  return struct.unpack("f", struct.pack("I", bits & 0xFFFF0000))[0]

_BF16_MAX = struct.unpack("f", struct.pack("I", 0x7F7F0000))[0]

def float_to_fp8(x: float, dtype: DType) -> int:
  """The fp8 bit pattern (an int 0..255) of `x`: round to nearest even, saturating to +-max (inf too, as tinygrad)."""
  if dtype not in FP8_FORMATS: raise ValueError(f"float_to_fp8: {dtype!r} is not an fp8 dtype ({dtypes.fp8s})")
  if math.isinf(x): return (0x80 if x < 0 else 0) | FP8_FORMATS[dtype].max_code
  return fp8_bits(float(x), dtype)

def fp8_to_float(x: int, dtype: DType) -> float:
  """The value of the fp8 bit pattern `x` (an int 0..255)."""
  if dtype not in FP8_FORMATS: raise ValueError(f"fp8_to_float: {dtype!r} is not an fp8 dtype ({dtypes.fp8s})")
  return FP8_VALUES[dtype][x & 0xFF]

def _to_np_dtype(dtype: DType) -> type | None:
  """The numpy scalar type of `dtype` (np.float32, ...), None for dtypes numpy lacks (bfloat16, fp8)."""
  import numpy as np
  return np.dtype(dtype.fmt).type if dtype.fmt is not None else None

def _from_np_dtype(npdtype) -> DType:
  """The dtype of a numpy dtype (or scalar type)."""
  import numpy as np
  return DTYPES_DICT[np.dtype(npdtype).name]

def _to_torch_dtype(dtype: DType):
  """The torch dtype of `dtype` (None where torch has none)."""
  import torch
  names = {dtypes.fp8e4m3: "float8_e4m3fn", dtypes.fp8e5m2: "float8_e5m2", dtypes.bfloat16: "bfloat16",
           **{dt: name for dt, name in _NP_NAMES.items()}}
  return getattr(torch, names[dtype], None) if dtype in names else None

def _from_torch_dtype(torchdtype) -> DType:
  """The dtype of a torch dtype; a KeyError if kiln has none."""
  for dt in dtypes.all:
    if _to_torch_dtype(dt) == torchdtype: return dt
  raise KeyError(torchdtype)
