"""Small shared helpers: settings (getenv, ContextVar, Context), GlobalCounters, caches, and source locations.

It also has the small helpers tinygrad scripts import from `tinygrad.helpers` (`prod`, `dedup`, `Timing`, `temp`,
`colored`, `round_up`, `mv_address`, ...), with tinygrad's names, signatures and results.
"""
from __future__ import annotations
import contextlib, ctypes, functools, gc, getpass, math, os, platform, re, sys, pathlib, tempfile, time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

T = TypeVar("T")
U = TypeVar("U")

OSX = platform.system() == "Darwin"
CI = os.getenv("CI", "") != ""

def prod(xs: Iterable, start=1):
  """The product of `xs` (works on ints and UOps)."""
  for x in xs: start = start * x
  return start

def all_same(xs) -> bool:
  """True if every item of `xs` equals the first (True for an empty list)."""
  return all(x == xs[0] for x in xs)
def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
  """The items of the iterables in `xss`, concatenated into one list (one level deep)."""
  return [x for xs in xss for x in xs]
def argsort(xs):
  """The indices that put `xs` in ascending order, in a sequence of `xs`'s type: argsort([30, 10, 20]) -> [1, 2, 0]."""
  return type(xs)(sorted(range(len(xs)), key=xs.__getitem__))
def dedup(xs: Iterable[T]) -> list[T]:
  """The items of `xs` without repeats, in first-seen order."""
  return list(dict.fromkeys(xs))
def round_up(x: int, multiple: int) -> int:
  """`x` rounded up to a multiple of `multiple`."""
  return (x + multiple - 1) // multiple * multiple
def ceildiv(a, b):
  """a / b rounded up (ceiling division); an int also when `a` or `b` is a float."""
  quotient = -(a // -b)
  return int(quotient) if isinstance(quotient, float) else quotient
def round_down(x: int, multiple: int) -> int:
  """`x` rounded down to a multiple of `multiple`."""
  return -round_up(-x, multiple)
def cdiv(x: int, y: int) -> int:
  """x / y rounded toward zero, as C divides ints (0 when y is 0)."""
  return abs(x) // abs(y) * (-1 if x * y < 0 else 1) if y != 0 else 0
def cmod(x: int, y: int) -> int:
  """The remainder of C's division: it has the sign of `x`."""
  return x - cdiv(x, y) * y
def all_int(xs: Sequence[Any]) -> bool:
  """True if every item of `xs` is an int (a shape without symbolic sizes)."""
  return all(isinstance(x, int) for x in xs)
def argfix(*x):
  """The arguments as a tuple, whether given spread out (`f(1, 2)`) or as one list/tuple (`f((1, 2))`)."""
  if x and x[0].__class__ in (tuple, list):
    if len(x) != 1: raise ValueError(f"argfix: a sequence must be the only argument, got {x}")
    return tuple(x[0])
  return x
def make_tuple(x: int | Sequence[int], count: int) -> tuple[int, ...]:
  """`x` repeated `count` times if it is an int, else `x` as a tuple."""
  return (x,) * count if isinstance(x, int) else tuple(x)
def fully_flatten(xs) -> list:
  """Every scalar in a nested list/tuple/array, in order (a 0-d array gives its one value)."""
  if hasattr(xs, "__len__") and hasattr(xs, "__getitem__") and not isinstance(xs, str):
    if getattr(xs, "shape", None) == (): return [xs[()]]
    return [item for x in xs for item in fully_flatten(x)]
  return [xs]
def merge_dicts(ds: Iterable[dict[T, U]]) -> dict[T, U]:
  """The dicts merged into one; a ValueError if two of them give one key different values."""
  ds = list(ds)
  merged: dict[T, U] = {}
  for d in ds:
    for k, v in d.items():
      if k in merged and merged[k] != v:
        raise ValueError(f"merge_dicts: key {k!r} has two values, {merged[k]!r} and {v!r}")
      merged[k] = v
  return merged
def partition(xs: Iterable[T], predicate: Callable[[T], bool]) -> tuple[list[T], list[T]]:
  """(the items for which `predicate` is true, the others), each in order."""
  yes: list[T] = []
  no: list[T] = []
  for x in xs: (yes if predicate(x) else no).append(x)
  return yes, no
def get_single_element(xs: Sequence[T]) -> T:
  """The one item of `xs`; a ValueError if it has another number of items."""
  if len(xs) != 1: raise ValueError(f"get_single_element: {xs} must have exactly one element")
  return xs[0]
def get_child(obj, key: str):
  """The object a dotted path names under `obj`: 'layers.0.weight' indexes with numbers and dict keys, else getattr."""
  for part in key.split("."):
    if part.isnumeric(): obj = obj[int(part)]
    elif isinstance(obj, dict): obj = obj[part]
    else: obj = getattr(obj, part)
  return obj
def fromimport(module: str, name: str):
  """`from module import name`, as an expression."""
  return getattr(__import__(module, fromlist=[name]), name)
def strip_parens(text: str) -> str:
  """`text` without one pair of enclosing parentheses, when they enclose all of it."""
  inner = text[1:-1]
  return inner if text[0] == "(" and text[-1] == ")" and inner.find("(") <= inner.find(")") else text
def lo32(x): return x & 0xFFFFFFFF
def hi32(x): return x >> 32
def data64(x) -> tuple:
  """(high 32 bits, low 32 bits) of `x`."""
  return (x >> 32, x & 0xFFFFFFFF)
def data64_le(x) -> tuple:
  """(low 32 bits, high 32 bits) of `x`."""
  return (x & 0xFFFFFFFF, x >> 32)
def getbits(value: int, start: int, end: int) -> int:
  """Bits `start`..`end` (both included) of `value`, shifted down."""
  return (value >> start) & ((1 << (end - start + 1)) - 1)
def i2u(bits: int, value: int) -> int:
  """The unsigned `bits`-bit integer with the same bits as the signed `value`."""
  return value if value >= 0 else (1 << bits) + value
def is_numpy_ndarray(x) -> bool:
  """True for a numpy array (checked without importing numpy)."""
  return str(type(x)) == "<class 'numpy.ndarray'>"
def pluralize(word: str, count: int) -> str:
  """'1 kernel', '2 kernels'."""
  return f"{count} {word}" + ("" if count == 1 else "s")
def polyN(x: T, coefficients: list[float]) -> T:
  """The polynomial c[0]*x**(n-1) + ... + c[-2]*x + c[-1], by Horner's rule (works on numbers and Tensors)."""
  return functools.reduce(lambda acc, c: acc * x + c, coefficients, 0.0)  # type: ignore[return-value]
def word_wrap(text: str, wrap: int = 80) -> str:
  """`text` with each line broken into pieces of at most `wrap` visible characters (ANSI colors do not count)."""
  if ansilen(text) <= wrap: return text
  if len(lines := text.splitlines()) > 1: return "\n".join(word_wrap(line, wrap) for line in lines)
  i = 0
  while ansilen(text[:i]) < wrap and i < len(text): i += 1
  return text[:i] + "\n" + word_wrap(text[i:], wrap)
def suppress_finalizing(fn: Callable) -> Callable:
  """`fn` that swallows AttributeError/TypeError/ImportError while the interpreter shuts down (for __del__)."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    try: return fn(*args, **kwargs)
    except (AttributeError, TypeError, ImportError):
      if not sys.is_finalizing(): raise
  return wrapper

# Graph walks recurse (the cheapest traversal in Python) and fall back to an explicit stack on RecursionError. Eager
# training graphs are thousands of nodes deep (a ResNet-50 step's ~6k), past Python's default limit of 1000, so their
# walks failed and started over; since Python 3.11 a call from one Python function to another takes no C stack, so a
# walk that recurses only through Python calls can go this deep safely
DEEP_RECURSION_LIMIT = 1 << 15

def deep_recursion(fn: Callable[..., T]) -> Callable[..., T]:
  """`fn` run with the recursion limit raised to DEEP_RECURSION_LIMIT (for a graph walk that recurses only through
  Python-to-Python calls; one that recurses through a C call, such as a property or a `key=` function, must not)."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    limit = sys.getrecursionlimit()
    if limit >= DEEP_RECURSION_LIMIT: return fn(*args, **kwargs)
    sys.setrecursionlimit(DEEP_RECURSION_LIMIT)
    try: return fn(*args, **kwargs)
    finally: sys.setrecursionlimit(limit)
  return wrapper

def gc_paused(fn: Callable[..., T]) -> Callable[..., T]:
  """`fn` run with Python's cyclic garbage collector paused (left as it was if it is off already).

  Building a backward graph or realizing a step allocates tens of thousands of acyclic objects (nodes, their source
  tuples, schedule keys) that reference counting frees, mostly at the end of the call. A collection in between finds
  nothing to free, but it moves them all to older generations, and every full collection then traverses the whole
  heap: an eager ResNet-50 training step spent ~40 ms of its ~150 ms of Python in the collector, ~17 ms with its
  backward and realize paused. Cycles made meanwhile are collected after the call."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if not gc.isenabled(): return fn(*args, **kwargs)
    gc.disable()
    try: return fn(*args, **kwargs)
    finally: gc.enable()
  return wrapper

class LazySeq(Generic[T]):
  """A sequence whose item i is `gen(i)`, computed when indexed."""
  def __init__(self, gen: Callable[[int], T]): self.gen = gen
  def __getitem__(self, index: int) -> T: return self.gen(index)

def temp(name: str, append_user: bool = False) -> str:
  """The path of `name` in the system's temporary folder (with '.<user>' appended when `append_user`)."""
  return (pathlib.Path(tempfile.gettempdir()) / (f"{name}.{getpass.getuser()}" if append_user else name)).as_posix()

@dataclass(frozen=True)
class Metadata:
  """What a node of the graph came from: the Tensor op's `name`, the user's `caller` line, whether in `backward`."""
  name: str
  caller: str
  backward: bool = False
  def __hash__(self) -> int: return hash(self.name)
  def __repr__(self) -> str: return str(self) + (f" - {self.caller}" if self.caller else "")
  def __str__(self) -> str: return self.name + (" bw" if self.backward else "")

@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable, converted to the type of `default`. `getenv("DEBUG")` -> 0 when unset."""
  return type(default)(os.environ.get(key, default))

# ---- settings: declared once, readable as ContextVar values, overridable with Context ----

class ContextVar:
  """A named integer/string setting. Its initial value comes from the environment; `Context` overrides it.

  `doc` is the line docs/env_vars.md shows; `effect=False` marks one of tinygrad's settings that kiln accepts (so a
  tinygrad script runs unchanged) but that changes nothing here; `alias` is a second name for the same setting (the
  environment's value of `key` wins over the alias's). A name is declared once: declaring it again is a
  RuntimeError, as in tinygrad.
  """
  registry: dict[str, ContextVar] = {}
  changes = 0   # how many times any setting's value was set: a snapshot of all values is still current while it stays
  def __setattr__(self, name: str, value: Any) -> None:
    if name == "value": ContextVar.changes += 1
    object.__setattr__(self, name, value)
  def __init__(self, key: str, default_value: Any, doc: str = "", effect: bool = True, alias: str | None = None):
    for name in (key, alias):
      if name in ContextVar.registry:
        raise RuntimeError(f"ContextVar {name} is declared already; import it from kiln.helpers")
    self.key, self.default, self.doc, self.effect, self.alias = key, default_value, doc, effect, alias
    from_env = os.environ.get(key, os.environ.get(alias, default_value) if alias else default_value)
    self.value = type(default_value)(from_env)
    ContextVar.registry[key] = self
    if alias: ContextVar.registry[alias] = self
  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x) -> bool: return self.value >= x
  def __gt__(self, x) -> bool: return self.value > x
  def __lt__(self, x) -> bool: return self.value < x
  def __le__(self, x) -> bool: return self.value <= x
  def __eq__(self, x) -> bool: return self.value == x
  def __hash__(self) -> int: return hash(self.key)
  def __int__(self) -> int: return int(self.value)
  def __repr__(self) -> str: return f"{self.key}={self.value!r}"

class Context(contextlib.ContextDecorator):
  """Temporarily set settings: `with Context(DEBUG=2): ...` or `@Context(DEBUG=2)` on a function.

  A name no setting has (a typo) is a ValueError.

  >>> from kiln.helpers import Context, DEBUG
  >>> with Context(DEBUG=3): int(DEBUG)
  3
  """
  def __init__(self, **kwargs):
    unknown = [k for k in kwargs if k not in ContextVar.registry]
    if unknown: raise ValueError(f"Context: unknown setting(s) {unknown}; known: {sorted(ContextVar.registry)}")
    self.kwargs = kwargs
  def __enter__(self):
    self.saved = {k: ContextVar.registry[k].value for k in self.kwargs}
    for k, v in self.kwargs.items(): ContextVar.registry[k].value = v
    return self
  def __exit__(self, *exc):
    for k, v in self.saved.items(): ContextVar.registry[k].value = v

DEBUG = ContextVar("DEBUG", 0, "1: devices; 2: one line per kernel run (time, GFLOP/s, GB/s); 3: buffers; 4: kernel source; "
                   "5: kernel IR; 6: linearized uops")
SPEC = ContextVar("SPEC", 0, "1: check every graph against kiln/uop/spec.py after each stage (on in tests)")
NOOPT = ContextVar("NOOPT", 0, "1: turn off the kernel optimizer (kiln/codegen/opt: upcasts, unrolls, loop order)")
BEAM = ContextVar("BEAM", 0, "n>=1: choose each kernel's optimizations by an n-wide search, timed on the device and "
                  "cached on disk (docs/beam.md)")
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0, "1: BEAM searches again instead of reading its cached winners "
                               "(it still records the new ones)")
CACHELEVEL = ContextVar("CACHELEVEL", 2, "0: no on-disk caches (compiled kernels, BEAM's winners, diskcache_put); 2: "
                        "cache them on disk")
DISABLE_COMPILER_CACHE = ContextVar("DISABLE_COMPILER_CACHE", 0, "1: compiled kernels are neither read from nor written "
                                    "to the on-disk compile cache (BEAM's cache is kept)")
CACHEDB = ContextVar("CACHEDB", "", "where compiled kernels and BEAM results are cached (a folder; default: "
                     "XDG_CACHE_HOME/kiln). tinygrad's name; tinygrad keeps one sqlite file there")
TRACEBACK_SOURCE = ContextVar("TRACEBACK_SOURCE", 1, "1: record the user's file:line on each Tensor op (for errors)",
                              alias="TRACEMETA")
TRACEMETA = TRACEBACK_SOURCE
CC = ContextVar("CC", "", "C compiler for the CPU device (default: clang if on PATH, else gcc, else cc)")
CFLAGS = ContextVar("CFLAGS", "", "extra flags for the CPU device's C compiler, after its defaults (-O2 -march=native), "
                   "so a later -O or -march here wins")
CPU_LLVM = ContextVar("CPU_LLVM", 0, "1: the CPU device compiles kernels in process with LLVM (llvmlite) instead of a C "
                     "compiler; 0: with the C compiler (CC, else clang, gcc or cc on PATH), and with LLVM where none is "
                     "found. Read when the CPU device opens (tinygrad's name)")
VECTORIZE = ContextVar("VECTORIZE", 1, "1: the C renderer turns a kernel's upcast lanes into explicit vector code "
                       "(kiln/codegen/vectorize.py), and the CUDA and PTX renderers a thread's adjacent aligned global "
                       "accesses into 16-byte ones (kiln/codegen/wide_memory.py); 0: scalar C, left to the C "
                       "compiler's vectorizer, and scalar GPU accesses")
TRANSCENDENTAL = ContextVar("TRANSCENDENTAL", 1, "software exp2/log2/sin and fast division by constants: 0: never; "
                            "1: where the device lacks native versions; 2: everywhere (for testing)")
DISABLE_FAST_IDIV = ContextVar("DISABLE_FAST_IDIV", 0, "1: integer division by a constant stays a division (no "
                               "multiply-shift rewrite, whatever TRANSCENDENTAL says)")
JIT = ContextVar("JIT", 1, "0: TinyJit runs the function eagerly every call; 2: replays without device graphs")
JIT_BATCH_SIZE = ContextVar("JIT_BATCH_SIZE", 0, "n>0: a TinyJit replay's first device graph holds at most n "
                            "kernels, each later one twice as many as the one before; 0: one graph per run of kernels "
                            "(tinygrad's default is 32: its GPUs start on a graph while the next is built; kiln's CPU "
                            "graph compiles once per graph)")
NO_MEMORY_PLANNER = ContextVar("NO_MEMORY_PLANNER", 0, "1: every intermediate buffer of a schedule gets its own memory "
                               "(no sharing between buffers whose lifetimes do not overlap)")
LRU = ContextVar("LRU", 1, "1: freed device memory is kept per size and handed out again; 0: it is freed at once")
MAX_BUFFER_SIZE = ContextVar("MAX_BUFFER_SIZE", 0, "n>0: allocating a buffer of more than n elements raises a "
                             "RuntimeError")
ALLOW_DEVICE_USAGE = ContextVar("ALLOW_DEVICE_USAGE", 1, "0: opening a device other than DISK, NPY or PYTHON raises a "
                                "RuntimeError")
SPLIT_REDUCEOP = ContextVar("SPLIT_REDUCEOP", 1, "1: a large reduction whose output is too small to split over threads "
                            "(a full sum, a max) is cut into chunks reduced in parallel, then combined (tinygrad makes "
                            "two kernels of it; kiln's CPU runs the chunks in one); 0: it runs on one thread")
VALIDATE_WITH_CPU = ContextVar("VALIDATE_WITH_CPU", 0, "1: every kernel that runs on a device other than CPU (outside "
                               "TinyJit replays) runs again on CPU over copies of its inputs, and an output that "
                               "differs (beyond 1e-3) raises an AssertionError naming the kernel")
PTX = ContextVar("PTX", 0, "1: the CUDA device renders kernels as PTX (kiln/renderer/ptx.py) that the driver compiles "
                          "when it loads them, instead of CUDA C compiled by NVRTC")
WARP_SHUFFLE = ContextVar("WARP_SHUFFLE", 1, "1: a GPU row or grid reduction combines each warp's partials with warp "
                          "shuffles (kiln/codegen/gpudims.py), shared memory and barriers only across warps; 0: "
                          "through shared memory in every round")
TC = ContextVar("TC", 1, "1: half and bfloat16 matmul-shaped kernels on GPU targets with tensor cores run on them (the "
               "TC action, kiln/codegen/gpu_mma.py); 0: never (SIMT tiles)")
USE_TC = TC   # (tinygrad's module-level name)
WGMMA = ContextVar("WGMMA", 0, "1: fp16/bf16 matmuls of K-major factors on sm_90a may be built as the Hopper GEMM "
                  "(TMA + mbarrier ring + wgmma, kiln/codegen/gpu_wgmma.py); 0 (default): never")
ALLOW_TF32 = ContextVar("ALLOW_TF32", 0, "1: float32 matmul-shaped kernels on GPU targets may run on tf32 tensor "
                        "cores (inputs rounded to 10 mantissa bits, float32 sums); 0: exact float32 (SIMT tiles)")
FUSE_OPTIM = ContextVar("FUSE_OPTIM", 0, "1: optimizers default to fused=True (all parameters updated as one flat "
                                         "vector: fewer kernels per step)")

RING = ContextVar("RING", 1, "all-reduce across devices: 0 naive (every device sums copies of every partial), 1 a ring "
                  "for large values over 3+ devices, 2 always a ring")
NCCL = ContextVar("NCCL", 1, "all-reduce across CUDA devices: 1 one NCCL all-reduce (ncclAllReduce per device in one "
                  "group) when libnccl is found and every device is CUDA, 0 kiln's own (RING); NCCL_NVLS_ENABLE=0 is "
                  "set before NCCL loads unless it is set (docs/multi.md)")

# tinygrad's other settings: accepted, so a tinygrad script that sets them runs unchanged, but kiln has no such
# behaviour (yet); each doc says what the setting does in tinygrad
_NO_EFFECT = {
  "IMAGE": (0, "1/2: Qualcomm image textures for convolutions (kiln has no image dtypes)"),
  "WINO": (0, "1: Winograd convolutions (kiln's conv2d is always direct)"),
  "CAPTURING": (1, "tinygrad-internal flag of TinyJit's capture"),
  "TC_SELECT": (-1, "which tensor core to use"),
  "TC_OPT": (0, "how much padding/reshaping a tensor-core kernel may use"),
  "TC_SEARCH_OVER_SHAPE": (1, "BEAM also searches tensor-core shapes"),
  "AMX": (0, "1: Apple AMX matrix units on the CPU"),
  "NOLOCALS": (0, "1: GPU kernels without local (shared) memory"),
  "FUSE_ARANGE": (1, "fuse arange into the kernels that index with it"),
  "FUSE_CONV_BW": (0, "1: fuse the convolution backward pass"),
  "PICKLE_BUFFERS": (1, "0: pickle a realized Tensor without its data (kiln's pickles always carry it)"),
  "PROFILE": (0, "1: record a timeline of kernels and copies (VIZ's profiler)"),
  "VIZ": (0, "1: a web view of every graph rewrite"),
  "TRACK_MATCH_STATS": (0, "count pattern-matcher hits (for VIZ)"),
  "DEVECTORIZE": (1, "0: keep vector uops for the renderer (kiln's CPU renderer: see VECTORIZE)"),
  "DONT_REALIZE_EXPAND": (0, "1: a scheduler heuristic, do not materialize expanded buffers"),
  "DONT_GROUP_REDUCES": (0, "1: a scheduler heuristic, one kernel per reduction"),
  "QUANTIZE": (0, "1: quantization rewrites for the Qualcomm DSP"),
  "CORRECT_DIVMOD_FOLDING": (0, "1: a stricter symbolic rule for folding // and % of negative values"),
  "AMD_LLVM": (1, "AMD device: compile with LLVM instead of comgr"),
  "IGNORE_OOB": (1, "0: prove every load and store in bounds with z3 (kiln has no bounds prover)"),
}
for _key, (_default, _what) in _NO_EFFECT.items(): ContextVar(_key, _default, f"tinygrad: {_what}", effect=False)
IMAGE, WINO, CAPTURING, TC_SELECT, TC_OPT, TC_SEARCH_OVER_SHAPE, AMX, NOLOCALS, FUSE_ARANGE, FUSE_CONV_BW, \
  PICKLE_BUFFERS, PROFILE, VIZ, TRACK_MATCH_STATS, DEVECTORIZE, DONT_REALIZE_EXPAND, \
  DONT_GROUP_REDUCES, QUANTIZE, CORRECT_DIVMOD_FOLDING, AMD_LLVM, IGNORE_OOB = \
  (ContextVar.registry[k] for k in _NO_EFFECT)

def settings_markdown() -> str:
  """The tables of every declared setting, as written to docs/env_vars.md."""
  lines = ["# Settings (environment variables)", "",
           "Each setting is read from the environment at import and can be changed with `Context(NAME=value)`.", "",
           "| name | default | meaning |", "| --- | --- | --- |"]
  ordered = sorted(ContextVar.registry.items())
  for name, var in ordered:
    if var.effect and name == var.key: lines.append(f"| `{name}` | `{var.default!r}` | {var.doc} |")
    elif var.effect:
      lines.append(f"| `{name}` | `{var.default!r}` | tinygrad's name for `{var.key}` (the same setting) |")
  lines += ["", "## tinygrad's settings that do nothing in kiln", "",
            "Accepted, no effect in kiln: `Context(NAME=...)`, `getenv` and the environment take these names so a "
            "tinygrad script runs unchanged, but kiln has no such behaviour (yet). What each does in tinygrad:", "",
            "| name | default | in tinygrad |", "| --- | --- | --- |"]
  lines += [f"| `{name}` | `{var.default!r}` | {var.doc.removeprefix('tinygrad: ')} |" for name, var in ordered
            if not var.effect]
  lines += ["", "Device selection (read once): `DEV=CPU|LLVM|PYTHON`, or `CPU=1` / `LLVM=1` / `PYTHON=1`.",
            "`DEFAULT_FLOAT=HALF` (any float dtype's name) sets `dtypes.default_float` at import, as in tinygrad.", ""]
  return "\n".join(lines)

class GlobalCounters:
  """Counts work done by realized kernels: kernels launched, ops, bytes moved, memory in use, time."""
  global_ops: int = 0
  global_mem: int = 0
  time_sum_s: float = 0.0
  kernel_count: int = 0
  mem_used: int = 0
  @staticmethod
  def reset() -> None:
    """Zero the op, memory-traffic, time and kernel counters (mem_used is left as is)."""
    GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0, 0, 0.0, 0

def cache_dir() -> pathlib.Path:
  """Where compiled kernels are cached (XDG_CACHE_HOME/kiln or ~/.cache/kiln)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  path = pathlib.Path(base) / "kiln"
  path.mkdir(parents=True, exist_ok=True)
  return path

def kernel_cache_dir() -> pathlib.Path:
  """Where compiled kernels and BEAM's winners are cached: the folder CACHEDB names, else `cache_dir()`."""
  if not CACHEDB.value: return cache_dir()
  path = pathlib.Path(CACHEDB.value)
  if path.exists() and not path.is_dir():
    raise RuntimeError(f"CACHEDB={CACHEDB.value!r} is a file; kiln keeps its kernel cache in a folder there")
  path.mkdir(parents=True, exist_ok=True)
  return path

# ---- tinygrad's general on-disk cache: pickled values by table and key, in one sqlite file ----

VERSION = 1   # of the diskcache tables' layout: a new layout starts new tables
_db_connection = None
_db_tables: set[str] = set()

def db_connection():
  """The sqlite connection of `diskcache_*` (the file diskcache.db in `kernel_cache_dir()`), opened once."""
  global _db_connection
  if _db_connection is None:
    import sqlite3
    _db_connection = sqlite3.connect(kernel_cache_dir() / "diskcache.db", timeout=60, isolation_level="IMMEDIATE")
    with contextlib.suppress(sqlite3.OperationalError): _db_connection.execute("PRAGMA journal_mode=WAL").fetchone()
  return _db_connection

def _db_key(key: dict | str | int) -> dict:
  return {"key": key} if isinstance(key, (str, int)) else key

def diskcache_get(table: str, key: dict | str | int) -> Any:
  """The value stored under `key` (a str, an int or a dict of them) in `table`, or None (always None at CACHELEVEL=0)."""
  if CACHELEVEL < 1: return None
  import pickle, sqlite3
  key = _db_key(key)
  where = " AND ".join(f"{k}=?" for k in key)
  query = f"SELECT val FROM '{table}_{VERSION}' WHERE {where}"
  try: row = db_connection().execute(query, tuple(key.values())).fetchone()
  except sqlite3.OperationalError: return None   # no such table yet
  return pickle.loads(row[0]) if row is not None else None

def diskcache_put(table: str, key: dict | str | int, val: Any, prepickled: bool = False) -> Any:
  """Store `val` (pickled, unless `prepickled` bytes) under `key` in `table` and return it (nothing at CACHELEVEL=0)."""
  if CACHELEVEL < 1: return val
  import pickle
  key = _db_key(key)
  conn = db_connection()
  if table not in _db_tables:
    sql_types = {str: "text", bool: "integer", int: "integer", float: "numeric", bytes: "blob"}
    columns = ", ".join(f"{k} {sql_types[type(v)]}" for k, v in key.items())
    conn.execute(f"CREATE TABLE IF NOT EXISTS '{table}_{VERSION}' ({columns}, val blob, PRIMARY KEY ({', '.join(key)}))")
    _db_tables.add(table)
  conn.execute(f"REPLACE INTO '{table}_{VERSION}' ({', '.join(key)}, val) VALUES ({', '.join('?' * len(key))}, ?)",
               (*key.values(), val if prepickled else pickle.dumps(val)))
  conn.commit()
  return val

def diskcache_clear() -> None:
  """Drop every table of the diskcache."""
  conn = db_connection()
  tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
  for name in tables: conn.execute(f"DROP TABLE IF EXISTS '{name}'")
  conn.commit()
  _db_tables.clear()

def diskcache(fn: Callable[..., T]) -> Callable[..., T]:
  """`fn` with its results cached on disk, keyed by a hash of its pickled arguments (None results are not kept)."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs) -> T:
    import hashlib, pickle
    table, key = f"cache_{fn.__name__}", hashlib.sha256(pickle.dumps((args, kwargs))).hexdigest()
    if (cached := diskcache_get(table, key)) is not None: return cached
    return diskcache_put(table, key, fn(*args, **kwargs))
  return wrapper

# ---- where the user called us from ----

_KILN_DIR = os.path.dirname(os.path.abspath(__file__))

# a code file's path -> its base name when it is the user's, None for kiln's own files and Python's frozen modules
# (a graph's every public Tensor call looks its caller up: the path tests and basename() were ~5% of building it)
_user_file_names: dict[str, str | None] = {}

def user_frame_location() -> str:
  """'file.py:LINE' of the innermost caller outside the kiln package ('' if none)."""
  frame = sys._getframe(1)
  names = _user_file_names
  while frame is not None:
    filename = frame.f_code.co_filename
    if (name := names.get(filename, "")) == "":
      if len(names) >= 4096: names.clear()   # bounded: exec'd code may name itself anything
      user = not filename.startswith(_KILN_DIR) and not filename.startswith("<frozen")
      name = names[filename] = os.path.basename(filename) if user else None
    if name is not None: return f"{name}:{frame.f_lineno}"
    frame = frame.f_back
  return ""

def fmt_time(seconds: float) -> str:
  """`seconds` as a fixed-width string in us, ms or s."""
  return f"{seconds*1e6:8.2f} us" if seconds < 1e-3 else f"{seconds*1e3:8.2f} ms" if seconds < 1 else f"{seconds:8.2f} s "

_COLORS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]

def colored(text, color: str | None, background: bool = False) -> str:
  """`text` wrapped in the ANSI code of `color` ('red', 'green', ...; upper case: the bright variant; None: no color),
  as the background color when `background`.

  >>> colored("hi", "red"), colored("hi", "RED", background=True), colored("hi", None)
  ('\\x1b[31mhi\\x1b[0m', '\\x1b[101mhi\\x1b[0m', 'hi')
  """
  if color is None: return text
  code = 30 + _COLORS.index(color.lower()) + 60 * (color.upper() == color) + 10 * background
  return f"\033[{code}m{text}\033[0m"

def colorize_float(x: float) -> str:
  """A speed ratio as '  0.50x', green below 0.75, red above 1.15, else yellow."""
  return colored(f"{x:7.2f}x", "green" if x < 0.75 else "red" if x > 1.15 else "yellow")

def ansistrip(text: str) -> str:
  """`text` without its ANSI color and erase-line codes."""
  return re.sub("\x1b\\[(K|.*?m)", "", text)

def ansilen(text: str) -> int:
  """The visible length of `text` (ANSI codes do not count)."""
  return len(ansistrip(text))

def time_to_str(seconds: float, width: int = 8) -> str:
  """`seconds` right-aligned in `width` characters, in s above 10 s, in ms above 10 ms, else in us."""
  for scale, unit in ((1, "s "), (1e3, "ms")):
    if seconds > 10 / scale: return f"{seconds * scale:{width}.2f}{unit}"
  return f"{seconds * 1e6:{width}.2f}us"

@functools.cache
def to_function_name(name: str) -> str:
  """`name` as a C identifier: ANSI codes dropped, every character other than letters, digits and '_' written as its
  two hex digits."""
  return "".join(c if c.isascii() and (c.isalnum() or c == "_") else f"{ord(c):02X}" for c in ansistrip(name))

def is_int_like(x) -> bool:
  """True for a Python int that is not a bool."""
  return isinstance(x, int) and not isinstance(x, bool)

def unwrap(x: T | None) -> T:
  """`x` itself, or a RuntimeError if it is None."""
  if x is None: raise RuntimeError("unexpected None")
  return x

def nan_safe(x: float) -> float:
  """`x`, or 0.0 if it is NaN."""
  return x if not math.isnan(x) else 0.0

def wait_cond(cb: Callable[[], Any], value: Any = True, timeout_ms: int = 10000, msg: str = "") -> Any:
  """Call `cb` until it returns `value` (returned); a TimeoutError after `timeout_ms` milliseconds."""
  deadline = time.perf_counter() + timeout_ms / 1000
  while time.perf_counter() < deadline:
    if (result := cb()) == value: return result
  raise TimeoutError(f"{msg}. Timed out after {timeout_ms} ms, condition not met: {result} != {value}")

# ---- timing and profiling ----

class Timing(contextlib.ContextDecorator):
  """Print how long the block took: `with Timing("step "): ...` prints 'step   1.23 ms' (plus `on_exit(ns)`'s text).

  >>> with Timing("x: ", on_exit=lambda ns: " done", enabled=False) as t: pass
  >>> t.et >= 0
  True
  """
  def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True):
    self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
  def __enter__(self) -> Timing:
    self.st = time.perf_counter_ns()
    return self
  def __exit__(self, *exc) -> None:
    self.et = time.perf_counter_ns() - self.st
    if self.enabled: print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))

class Profiling(contextlib.ContextDecorator):
  """Profile the block with cProfile and print its top `frac` of functions by `sort` ('cumtime', 'tottime', ...):
  calls, own and total time in ms (divided by `ts`), and the caller that spent the most in each. `fn` also saves the
  raw stats there (for snakeviz / pstats)."""
  def __init__(self, enabled: bool = True, sort: str = "cumtime", frac: float = 0.2, fn: str | None = None,
               ts: float = 1):
    self.enabled, self.sort, self.frac, self.fn, self.time_scale = enabled, sort, frac, fn, 1e3 / ts
  def __enter__(self) -> Profiling:
    import cProfile
    self.profile = cProfile.Profile()
    if self.enabled: self.profile.enable()
    return self
  def __exit__(self, *exc) -> None:
    if not self.enabled: return
    self.profile.disable()
    if self.fn: self.profile.dump_stats(self.fn)
    import pstats
    stats = pstats.Stats(self.profile).strip_dirs().sort_stats(self.sort)
    def where(f) -> str: return f"{f[0]}:{f[1]}:{f[2]}"
    for function in stats.fcn_list[:int(len(stats.fcn_list) * self.frac)]:  # type: ignore[attr-defined]
      _, calls, own, total, callers = stats.stats[function]  # type: ignore[attr-defined]
      top = max(callers.items(), key=lambda kv: kv[1][2], default=None)
      caller = f"<- {top[1][2] / own * 100 if own else 0:3.0f}% {where(top[0])}" if top else ""
      print(f"n:{calls:8d}  tm:{own * self.time_scale:7.2f}ms  tot:{total * self.time_scale:7.2f}ms",
            colored(where(function).ljust(50), "yellow"), colored(caller, "BLACK"))

# ---- ctypes and memoryviews ----

def from_mv(mv: memoryview, to_type: type = ctypes.c_char) -> ctypes.Array:
  """A ctypes array of `to_type` over the (writable) memory of `mv`, sharing it."""
  return ctypes.cast(ctypes.addressof(to_type.from_buffer(mv)), ctypes.POINTER(to_type * len(mv))).contents

def to_mv(ptr: int, size: int) -> memoryview:
  """A byte memoryview of `size` bytes at address `ptr` (no copy; the memory must outlive it)."""
  return memoryview((ctypes.c_uint8 * size).from_address(ptr)).cast("B")

def mv_address(mv) -> int:
  """The address of the first byte of a writable buffer (memoryview, bytearray, numpy array)."""
  return ctypes.addressof(ctypes.c_char.from_buffer(mv))

def flat_mv(mv: memoryview) -> memoryview:
  """`mv` as a flat view of bytes (empty views stay as they are)."""
  return mv if len(mv) == 0 else mv.cast("B", shape=(mv.nbytes,))

def to_char_p_p(options: list[bytes], to_type: type = ctypes.c_char):
  """A C array of pointers to NUL-terminated copies of `options` (for `char**` arguments)."""
  pointer = ctypes.POINTER(to_type)
  return (pointer * len(options))(*[ctypes.cast(ctypes.create_string_buffer(o), pointer) for o in options])

@functools.cache
def init_c_struct_t(fields: tuple[tuple[str, type], ...]) -> type:
  """A packed ctypes Structure class with `fields` ((name, ctype) pairs), one class per field list."""
  class CStruct(ctypes.Structure):
    _pack_, _fields_ = 1, fields
  return CStruct

def init_c_var(ctypes_var: T, create: Callable[[T], Any]) -> T:
  """`ctypes_var` after `create(ctypes_var)` filled it in (for C calls with out-parameters)."""
  create(ctypes_var)
  return ctypes_var

# ---- a dependency-free progress bar ----

class tqdm:
  """A minimal progress bar on stderr: `for x in tqdm(items, desc="train"): ...` or `bar.update(n)` by hand.

  Shows count, percent, rate and ETA, redrawn in place with '\\r' at most every `min_interval` seconds.
  `bar.set_description(f"loss {loss:.3f}")` changes the text in front of the bar. `unit_scale=True` writes counts
  and rates with SI prefixes (`1.5 MB`, `2.3 MB/s`), for byte counts. The bar goes to `file` (stderr by default) and
  is off when that is not a terminal, unless `disable=False` forces it on (tinygrad's bar is always on).
  The parameters come in tinygrad's order; its `rate` (redraws per second) is accepted, `min_interval` decides.

  >>> import io
  >>> out = io.StringIO()
  >>> for _ in tqdm(range(3), desc="demo", file=out, disable=False): pass
  >>> out.getvalue().splitlines()[-1].split("\\r")[-1].split(" [")[0]
  'demo: 100%|########################| 3/3'
  """
  def __init__(self, iterable: Iterable | None = None, desc: str = "", disable: bool | None = None, unit: str = "it",
               unit_scale: bool = False, total: int | None = None, rate: int = 100, width: int = 24,
               min_interval: float = 0.1, file: Any = None):
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
      total = len(iterable)  # type: ignore[arg-type]
    self.file = file if file is not None else sys.stderr
    if disable is None:  # by default only a terminal gets a bar; logs and pipes would fill with '\r' redraws
      disable = not (hasattr(self.file, "isatty") and self.file.isatty())
    self.iterable, self.total, self.desc, self.disable, self.unit = iterable, total, desc, disable, unit
    self.width, self.min_interval, self.unit_scale = width, min_interval, unit_scale
    self.count, self.start_time, self.last_draw, self.closed = 0, time.perf_counter(), -math.inf, False
    self.drawn_count, self.drawn_width = -1, 0

  def __iter__(self):
    if self.iterable is None: raise TypeError("tqdm: no iterable given; use update() instead")
    try:
      for item in self.iterable:
        yield item
        self.update(1)
    finally:
      self.close()

  def __len__(self) -> int: return self.total if self.total is not None else 0
  def __enter__(self) -> tqdm: return self
  def __exit__(self, *exc) -> None: self.close()

  def set_description(self, desc: str) -> None:
    """Change the text shown before the bar (redrawn at the next update)."""
    self.desc = desc

  def update(self, n: int = 0, close: bool = False) -> None:
    """Advance by `n` items and redraw if enough time passed (or when finished); `close=True` also ends the bar."""
    self.count += n
    if close: return self.close()
    now = time.perf_counter()
    if now - self.last_draw >= self.min_interval or (self.total is not None and self.count >= self.total):
      self.last_draw = now
      self._draw(now)

  @classmethod
  def write(cls, text: str) -> None:
    """Print a line of text above a running bar (on stderr)."""
    print(f"\r\033[K{text}", flush=True, file=sys.stderr)

  def close(self) -> None:
    """Draw the final state and end the line."""
    if self.closed: return
    self.closed = True
    if not self.disable:
      if self.drawn_count != self.count: self._draw(time.perf_counter())
      self.file.write("\n")
      self.file.flush()

  def format(self, now: float) -> str:
    """The bar's text at time `now` (perf_counter seconds)."""
    elapsed = now - self.start_time
    rate = self.count / elapsed if elapsed > 0 else 0.0
    prefix = f"{self.desc}: " if self.desc else ""
    if self.unit_scale: speed = f"{_fmt_si(rate)}{self.unit}/s"
    else: speed = f"{rate:.2f} {self.unit}/s" if rate < 100 else f"{rate:.0f} {self.unit}/s"
    count = f"{_fmt_si(self.count)}{self.unit}" if self.unit_scale else f"{self.count} {self.unit}"
    if not self.total: return f"{prefix}{count} [{_fmt_clock(elapsed)}, {speed}]"
    fraction = min(self.count / self.total, 1.0)
    filled = int(fraction * self.width)
    bar = "#" * filled + "." * (self.width - filled)
    eta = (self.total - self.count) / rate if rate > 0 else math.inf
    counts = (f"{_fmt_si(self.count)}/{_fmt_si(self.total)}{self.unit}" if self.unit_scale
              else f"{self.count}/{self.total}")
    return (f"{prefix}{fraction*100:3.0f}%|{bar}| {counts} "
            f"[{_fmt_clock(elapsed)}<{_fmt_clock(eta)}, {speed}]")

  def _draw(self, now: float) -> None:
    if self.disable: return
    text = self.format(now)
    # pad with spaces so a shorter line fully covers the previous one
    self.file.write("\r" + text.ljust(self.drawn_width))
    self.file.flush()
    self.drawn_count, self.drawn_width = self.count, len(text)

class trange(tqdm):
  """`tqdm(range(n))`: a progress bar over 0..n-1."""
  def __init__(self, n: int, **kwargs): super().__init__(range(n), total=n, **kwargs)

def _fmt_si(value: float) -> str:
  """`value` with an SI prefix and a trailing space, e.g. 1500000 -> '1.50 M', 12 -> '12 '."""
  for prefix in ("", "k", "M", "G", "T"):
    if abs(value) < 1000 or prefix == "T": break
    value /= 1000
  return f"{value:.0f} " if prefix == "" and value == int(value) else f"{value:.2f} {prefix}"

def _fmt_clock(seconds: float) -> str:
  """Seconds as 'MM:SS' (or 'H:MM:SS'); '?' when unknown."""
  if math.isinf(seconds) or math.isnan(seconds): return "?"
  minutes, secs = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"

# ---- downloads with an on-disk cache ----

import gzip, hashlib, urllib.error, urllib.request, zlib  # noqa: E402  (only fetch needs them)

FETCH_PROGRESS_BYTES = 1 << 20  # downloads at least this large (or of unknown size) get a progress bar

def fetch(url: str, name: str | pathlib.Path | None = None, subdir: str | None = None, gunzip: bool = False,
          allow_caching: bool | None = None, timeout: float = 30.0) -> pathlib.Path:
  """The local file holding `url`'s contents: downloaded once into `cache_dir()/downloads`, then read from there.

  `name` names the cached file (a path when it contains '/'; default: the URL's md5), `subdir` is a folder under
  the downloads folder, `gunzip=True` stores the decompressed contents. `allow_caching=False` (or the environment
  variable DISABLE_HTTP_CACHE=1) downloads again even when a copy exists. The file is written to a temporary name
  and renamed, so a reader never sees a partial download. A cached file needs no network; without one and without
  a network, a RuntimeError names the URL and where the file was expected. Local paths (starting with '/' or '.')
  are returned as they are (decompressed into the cache with `gunzip=True`); `file://` URLs are copied like downloads.

  >>> import pathlib, tempfile
  >>> source = pathlib.Path(tempfile.mkdtemp()) / "hello.txt"
  >>> _ = source.write_text("hi")
  >>> fetch(source.as_uri(), name="hello-doctest.txt", allow_caching=False).read_text()
  'hi'
  """
  if allow_caching is None: allow_caching = not int(os.environ.get("DISABLE_HTTP_CACHE", "0") or 0)
  if url.startswith(("/", ".")):
    local = pathlib.Path(url)
    if not local.is_file(): raise RuntimeError(f"fetch: no file at local path {url}")
    if not gunzip: return local
    url = local.resolve().as_uri()
  if name is not None and (isinstance(name, pathlib.Path) or "/" in name): target = pathlib.Path(name)
  else:
    file_name = (name or hashlib.md5(url.encode()).hexdigest()) + (".gunzip" if gunzip else "")
    target = cache_dir() / "downloads" / (subdir or "") / file_name
  if allow_caching and target.is_file(): return target
  target.parent.mkdir(parents=True, exist_ok=True)
  _download(url, target, gunzip, timeout)
  return target

def _download(url: str, target: pathlib.Path, gunzip: bool, timeout: float) -> None:
  """Write `url`'s contents (decompressed if `gunzip`) to `target` through a temporary file in the same folder."""
  tmp_name = None
  try:
    request = urllib.request.Request(url, headers={"User-Agent": "kiln"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
      length_header = response.headers.get("Content-Length") if hasattr(response, "headers") else None
      length = int(length_header) if length_header else None
      show_bar = None if length is None or length >= FETCH_PROGRESS_BYTES else True  # None: on if stderr is a TTY
      # the bar counts bytes received, so with gunzip it runs over the compressed size
      bar = tqdm(total=length, desc=url.rsplit("/", 1)[-1] or url, unit="B", unit_scale=True, disable=show_bar)
      counted = _CountingReader(response, bar)
      stream = gzip.GzipFile(fileobj=counted) if gunzip else counted
      with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as tmp:
        tmp_name = tmp.name
        while chunk := stream.read(1 << 16): tmp.write(chunk)
      bar.close()
      if length is not None and counted.received < length:
        raise RuntimeError(f"fetch: download of {url} is incomplete: {counted.received} of {length} bytes")
    os.replace(tmp_name, target)  # atomic: a concurrent reader sees the old file or the whole new one
    tmp_name = None
  except urllib.error.HTTPError as error:
    raise RuntimeError(f"fetch: {url} answered HTTP {error.code} {error.reason}; nothing cached at {target}") from None
  except (gzip.BadGzipFile, EOFError, zlib.error) as error:
    raise RuntimeError(f"fetch: {url} is not valid gzip data ({error}) but gunzip=True was asked for") from None
  except OSError as error:
    reason = getattr(error, "reason", error)
    raise RuntimeError(f"fetch: could not download {url} ({type(error).__name__}: {reason}) and there is no cached "
                       f"copy at {target}; without a network, put the file there (or pass a local path)") from None
  finally:
    if tmp_name is not None and os.path.exists(tmp_name): os.unlink(tmp_name)

class _CountingReader:
  """A read-only file object over `raw` that reports the bytes read to a progress bar."""
  def __init__(self, raw: Any, bar: tqdm):
    self.raw, self.bar, self.received = raw, bar, 0
  def read(self, size: int = -1) -> bytes:
    data = self.raw.read(size)
    self.received += len(data)
    self.bar.update(len(data))
    return data
