"""Renderers: a linearized kernel (docs/ir.md, stage 4) becomes source code for one device."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Callable, NamedTuple
from kiln.dtype import DType
from kiln.uop.ops import UOp, Ops
if TYPE_CHECKING: from kiln.runtime.cpu_target import CPUTarget   # the type only: renderers never import runtimes

class ThreadPlan(NamedTuple):
  """How a CPU kernel's work is split over the thread pool. kiln/codegen/pipeline.py's `plan_threads` stage makes it
  from the loops the `map_axes` stage named on the graph (kiln/codegen/threads.py); renderers only read it.
  `parallel`: a ParallelLoop (the loop whose iterations run as one contiguous chunk a thread, and the work a launch
  does); `reduction`: a SplitReduction (a reduce loop cut into a fixed number of chunks reduced apart, their
  partials combined in chunk order); `streams`: the split loop's streamed loads (parallel.py `Stream`), prefetched
  ahead. Nothing set: the kernel runs whole on one thread."""
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
  into vector uops for it (kiln/codegen/vectorize.py; GNU C vectors, LLVM vectors); `wide_memory`: it renders a
  thread's adjacent aligned global loads and stores as one 8- or 16-byte access (kiln/codegen/wide_memory.py: vector
  LOAD/STORE, GEP and VECTORIZE over global buffers only), up to its target's `vector_bytes`.
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
  wide_memory: bool = False
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

class KernelWriter:
  """What writing one kernel's source shares across renderers (C, CUDA C, LLVM IR, PTX, Python): the kernel's name
  and uop list, the lines emitted so far, fresh names, and the dispatch of each uop to its handler.

  A subclass sets `renderer_name` (for messages) and `expressions` (the ops it renders as computed values, by
  `_value(u)`), fills `statements` (op -> handler) in its `__init__`, and implements `write()`; the renderer calls
  `render()`, which also breaks the writer's cycle through its bound-method handlers, so refcounting frees it."""
  renderer_name = "Renderer"
  expressions: frozenset | dict = frozenset()

  def __init__(self, name: str, uops: list[UOp]):
    self.name, self.uops = name, uops
    self.lines: list[str] = []
    self.counter = 0
    self.statements: dict[Ops, Callable[[UOp], None]] = {}

  def fresh_name(self, prefix: str) -> str:
    """A new name, unique in this kernel."""
    self.counter += 1
    return f"{prefix}{self.counter - 1}"

  def emit(self, line: str) -> None:
    """Add one line (subclasses indent it)."""
    self.lines.append(line)

  def fail(self, what: str) -> NotImplementedError:
    """The error for something this renderer cannot render, naming the kernel."""
    return NotImplementedError(f"{self.renderer_name}: {what} (kernel {self.name}); see docs/ir.md stage 4")

  def walk(self, uops: list[UOp] | None = None) -> None:
    """Emit the statements and values of `uops` (default: the whole kernel) in order."""
    statements, expressions = self.statements, self.expressions
    for u in self.uops if uops is None else uops:
      handler = statements.get(u.op)
      if handler is not None: handler(u)
      elif u.op in expressions: self._value(u)
      else: raise self.fail(f"cannot render {u.op}")

  def _value(self, u: UOp) -> None:
    raise self.fail(f"cannot render {u.op}")

  def check_closed(self, open_loops: int) -> None:
    """A ValueError when the kernel's uops leave loops open."""
    if open_loops: raise ValueError(f"{self.renderer_name}: kernel {self.name} leaves {open_loops} RANGE(s) unclosed")

  def write(self) -> str:
    """The kernel's whole source."""
    raise NotImplementedError(f"{type(self).__name__} does not implement write")

  def render(self) -> str:
    """`write()`, then the handlers dropped (they are bound methods: a reference cycle through the writer)."""
    try: return self.write()
    finally: self.statements.clear()

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
