"""Renderers: a linearized kernel (docs/ir.md, stage 4) becomes source code for one device."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Callable, NamedTuple
from kiln.dtype import DType
from kiln.uop.ops import UOp, Ops
if TYPE_CHECKING: from kiln.runtime.cpu_target import CPUTarget   # the type only: renderers never import runtimes

class ThreadPlan(NamedTuple):
  """How a CPU kernel's work is split over the thread pool. kiln/codegen/pipeline.py's `plan_threads` stage makes it
  from kiln/codegen/parallel.py's analyses; renderers only read it. `parallel`: a ParallelLoop (the loop whose
  iterations run as one contiguous chunk a thread, and the work a launch does); `reduction`: a SplitReduction (a
  reduce loop cut into a fixed number of chunks reduced apart, their partials combined in chunk order); `streams`:
  the split loop's streamed loads (parallel.py `Stream`), prefetched ahead. Nothing set: the kernel runs whole on
  one thread."""
  parallel: Any = None
  reduction: Any = None
  streams: tuple = ()

ONE_THREAD = ThreadPlan()

class Renderer:
  """Base class of renderers. `render(name, uops, threads)` returns the source of one kernel function called `name`.

  Attributes describe the target so lowering can adapt: `device` (the device name it renders for), `has_local`
  (whether it has workgroup-local memory and local ids; host targets do not), `supported_dtypes` (None: all),
  `has_native_transcendentals` and `has_fast_const_division` (see kiln/codegen/transcendental.py),
  `packs_matmul_operands` (whether the scheduler copies a large matmul's operands into tile-major layouts first: host
  CPUs, whose caches it suits; kiln/schedule/pack.py), and `target`: the target description the optimizer and the
  heuristics read (vector width and registers, caches, cores; kiln/runtime/cpu_target.py), None where the device
  gives none (the heuristics then plan for their baseline, an AVX2 machine). `has_threads`: its kernels run on a
  host thread pool, so the pipeline plans their threads (a ThreadPlan); `vectorizes`: the pipeline turns upcast lanes
  into vector uops for it (kiln/codegen/vectorize.py; GNU C vectors, LLVM vectors).
  """
  device: str = ""
  has_local: bool = False
  has_native_transcendentals: bool = True   # False: exp2/log2/sin become software (kiln/codegen/transcendental.py)
  # True: renders kiln's float64 cos and tan forms, SIN(pi/2 - y) and SIN(y) / SIN(pi/2 - y), as cos(y) and tan(y)
  # themselves, as software math evaluates them (kiln/mixin/elementwise.py `_software_sin_cos`)
  renders_math_forms: bool = False
  has_fast_const_division: bool = True      # False: integer division by constants becomes multiply-shift
  packs_matmul_operands: bool = False
  renders_byte_dots: bool = False   # True: its vector code has DP4A (kiln/codegen/vectorize.py), e.g. x86 vpdpbusd
  has_threads: bool = False
  vectorizes: bool = False
  supported_dtypes: frozenset[DType] | None = None
  # set by the device (a function, since the description may follow settings: the C compiler's CFLAGS=-march=...)
  describe_target: Callable[[], CPUTarget] | None = None

  @property
  def target(self) -> CPUTarget | None:
    """The target description the optimizer and heuristics read now; None where the device gives none."""
    return None if self.describe_target is None else self.describe_target()

  def render(self, name: str, uops: list[UOp], threads: ThreadPlan = ONE_THREAD) -> str:
    """The source of a function `name` that runs the kernel described by `uops`, split over threads as `threads`
    says (renderers without `has_threads` ignore it)."""
    raise NotImplementedError(f"{type(self).__name__} does not implement render")

# bound once: `Ops.X` is a metaclass attribute lookup (~140 ns under Python 3.11), and kernel_signature reads the op
# of every uop and of each of its sources
_DEFINE_GLOBAL, _DEFINE_VAR = Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR

def kernel_signature(uops: list[UOp]) -> tuple[list[UOp], list[UOp]]:
  """The kernel's parameters: its DEFINE_GLOBALs sorted by parameter number, then its DEFINE_VARs in first-use order."""
  globals_by_arg: dict[int, UOp] = {}
  variables: dict[UOp, None] = {}
  for entry in uops:
    for u in (*entry.src, entry):   # a parameter used only as a source may have no entry of its own in the list
      op = u.op
      if op is _DEFINE_GLOBAL:
        if globals_by_arg.setdefault(u.arg, u) is not u:
          raise ValueError(f"kernel has two different DEFINE_GLOBALs with parameter number {u.arg}")
      elif op is _DEFINE_VAR: variables.setdefault(u)
  return [globals_by_arg[k] for k in sorted(globals_by_arg)], list(variables)

def kernel_function_name(name: str) -> str:
  """`name` made into a valid C/Python identifier (renderers and runtimes both use it, so they agree)."""
  if not isinstance(name, str) or not name: raise ValueError(f"a kernel name must be a non-empty string, got {name!r}")
  ident = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
  return ident if not ident[0].isdigit() else f"k_{ident}"
