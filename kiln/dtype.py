"""Data types: DType, the `dtypes` namespace, promotion and safe casts."""
from __future__ import annotations
from dataclasses import dataclass
import math

@dataclass(frozen=True, eq=False)
class DType:
  """A scalar element type. `priority` orders types for promotion; `fmt` is the struct/numpy format char."""
  priority: int
  itemsize: int
  name: str
  fmt: str | None
  # every DType is a module-level singleton: equality is identity (fast), and unpickling returns the singleton
  def __repr__(self) -> str: return f"dtypes.{self.name}"
  def __reduce__(self): return _dtype_by_name, (self.name,)
  def __lt__(self, other: DType) -> bool: return (self.priority, self.itemsize, self.name) < (other.priority, other.itemsize, other.name)
  @property
  def bitsize(self) -> int:
    """The size of one element in bits."""
    return self.itemsize * 8

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
  float16 = DType(9, 2, "half", "e")
  bfloat16 = DType(10, 2, "bfloat16", None)
  float32 = DType(11, 4, "float", "f")
  float64 = DType(12, 8, "double", "d")
  # aliases
  half, float, double = float16, float32, float64
  uchar, char, short, ushort, int, uint, long, ulong = uint8, int8, int16, uint16, int32, uint32, int64, uint64
  default_float: DType = float32
  default_int: DType = int32
  index: DType = int32

  @staticmethod
  def is_float(x: DType) -> bool:
    """True for the floating-point dtypes (float16, bfloat16, float32, float64)."""
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
  def min(dt: DType):
    """The smallest value of `dt`."""
    if dt == dtypes.bool: return False
    if dtypes.is_unsigned(dt): return 0
    if dtypes.is_int(dt): return -(2 ** (dt.bitsize - 1))
    return -math.inf
  @staticmethod
  def max(dt: DType):
    """The largest value of `dt`."""
    if dt == dtypes.bool: return True
    if dtypes.is_unsigned(dt): return 2 ** dt.bitsize - 1
    if dtypes.is_int(dt): return 2 ** (dt.bitsize - 1) - 1
    return math.inf
  @staticmethod
  def fields() -> dict[str, DType]:
    """Every dtype by name, aliases included ('float32', 'float', 'half', ...; not void or index)."""
    return dict(DTYPES_BY_NAME)

UINTS = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
SINTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
INTS = UINTS + SINTS
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
ALL_DTYPES = (dtypes.bool,) + INTS + FLOATS
DTYPES_BY_NAME: dict[str, DType] = {k: v for k, v in vars(dtypes).items() if isinstance(v, DType) and not k.startswith("default")
                                    and k not in ("void", "index")}

# Promotion lattice as in PyTorch/NumPy: bool < every int; signed and unsigned of the same width promote to the next signed;
# any float beats every int; float16 and bfloat16 promote to float32.
_PARENTS: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
  dtypes.int32: (dtypes.int64,), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
  dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
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

def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype that every dtype in `ds` promotes to, e.g. int32 and float16 -> float16."""
  common = set.intersection(*(_ANCESTORS[d] for d in ds))
  return min(common)

def sum_acc_dtype(dt: DType) -> DType:
  """The dtype `sum` accumulates and returns in (PyTorch: bool/ints -> int64, floats keep their type)."""
  if dt == dtypes.bool or dtypes.is_int(dt): return dtypes.uint64 if dtypes.is_unsigned(dt) and dt.itemsize == 8 else dtypes.int64
  return dt

def to_dtype(x) -> DType:
  """Accept a DType or a dtype name ('float32', 'half', ...); raise TypeError for anything else."""
  if isinstance(x, DType): return x
  if isinstance(x, str):
    if x in DTYPES_BY_NAME: return DTYPES_BY_NAME[x]
    raise TypeError(f"unknown dtype name {x!r}; known names: {', '.join(sorted(DTYPES_BY_NAME))}")
  if x is None: raise TypeError("a dtype is required, got None")
  import numpy as np
  try: return from_numpy_dtype(np.dtype(x))
  except TypeError: raise TypeError(f"cannot interpret {x!r} as a dtype") from None

_NP_NAMES = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16", dtypes.uint16: "uint16",
             dtypes.int32: "int32", dtypes.uint32: "uint32", dtypes.int64: "int64", dtypes.uint64: "uint64",
             dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}

def to_numpy_dtype(dt: DType):
  """The numpy dtype with the same bits (bfloat16 has none: its bits travel as uint16)."""
  import numpy as np
  return np.dtype("uint16") if dt == dtypes.bfloat16 else np.dtype(_NP_NAMES[dt])

def from_numpy_dtype(npdt) -> DType:
  """The kiln dtype of a numpy dtype."""
  for dt, name in _NP_NAMES.items():
    if npdt.name == name: return dt
  raise TypeError(f"numpy dtype {npdt} has no kiln equivalent")

def truncate(dt: DType, x):
  """Round a Python scalar to what `dt` can hold (wrap ints, round floats), as the device would."""
  import numpy as np
  if dt == dtypes.bool: return bool(x)
  if dtypes.is_int(dt):
    bits = dt.bitsize
    x = int(x) & ((1 << bits) - 1)
    return x - (1 << bits) if not dtypes.is_unsigned(dt) and x >= 1 << (bits - 1) else x
  if dt == dtypes.bfloat16:
    bits = int(np.array(x, np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000 if not math.isnan(x) else 0x7FC00000
    return float(np.array(bits, np.uint32).view(np.float32))
  with np.errstate(all="ignore"): return float(to_numpy_dtype(dt).type(x))
