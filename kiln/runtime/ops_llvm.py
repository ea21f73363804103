"""The LLVM device: kernels rendered to LLVM IR, compiled in process by llvmlite (no C compiler needed), run through
ctypes. Object code is cached on disk like the CPU device's libraries, keyed by the source and the host CPU.

Kernels are compiled for the host CPU (its name and features, as -march=native) by LLVM's O3 pipeline with the loop
and SLP vectorizers, and launched as the CPU device's are (kiln/runtime/ops_cpu.py, CPUProgram): a kernel with a thread
plan (kiln/renderer/llvmir.py) runs its `<name>_task` entry point on the shared thread pool.
"""
from __future__ import annotations
import ctypes, functools, itertools, re
from kiln.device import Compiled, Compiler, CompileError, HostAllocator
from kiln.renderer import kernel_function_name
from kiln.renderer.cstyle import chunks_symbol, scratch_symbol, task_symbol, work_symbol
from kiln.renderer.llvmir import LLVMRenderer
from kiln.runtime.cpu_target import host_target
from kiln.runtime.ops_cpu import CPUProgram

OPT_LEVEL = 3   # LLVM's full O3 pipeline for the target machine and the pass builder

def _llvm():
  """The llvmlite binding module, with a clear error when llvmlite is not installed."""
  try: import llvmlite.binding as llvm
  except ImportError:
    raise RuntimeError("the LLVM device needs llvmlite: pip install 'kiln[llvm]' (or pip install llvmlite)") from None
  return llvm

@functools.cache
def host_target_machine():
  """An O3 target machine for this CPU with all its features (the equivalent of -march=native)."""
  llvm = _llvm()
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=OPT_LEVEL, reloc="pic", codemodel="default")

@functools.cache
def _jit():
  """The process's one ORC JIT; each kernel is linked into it as its own library."""
  return _llvm().create_lljit_compiler(host_target_machine())

@functools.cache
def _target_id() -> str:
  """What the object code depends on besides the source: LLVM version, triple, CPU name and features."""
  llvm = _llvm()
  return (f"llvm{'.'.join(map(str, llvm.llvm_version_info))} {host_target_machine().triple} "
          f"{llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}")

class LLVMCompiler(Compiler):
  """LLVM IR text -> object code: parse, verify, optimize at O3 (loop and SLP vectorizers on) for the host CPU, emit
  an object file."""
  def cache_key(self) -> str:
    """Class name, optimization level and the target the code is made for (see _target_id)."""
    return f"{type(self).__name__} O{OPT_LEVEL} {_target_id()}"

  def compile(self, src: str) -> bytes:
    """Compile `src` to the bytes of an object file; CompileError (naming the kernel) on failure."""
    llvm = _llvm()
    match = re.search(r"define void @(\w+)\(", src)
    kernel = match.group(1) if match else "<unnamed kernel>"
    machine = host_target_machine()
    try:
      module = llvm.parse_assembly(src)
      module.verify()
    except RuntimeError as e: raise CompileError(f"compiling kernel {kernel}: invalid LLVM IR: {e}") from None
    module.triple, module.data_layout = machine.triple, str(machine.target_data)
    tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    tuning.loop_vectorization = tuning.slp_vectorization = tuning.loop_interleaving = tuning.loop_unrolling = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)
    return machine.emit_object(module)

_library_ids = itertools.count()

def _defines(lib: bytes, symbol: str) -> bool:
  """Whether the object file `lib` names `symbol` (its string table holds each name between NUL bytes)."""
  return b"\0" + symbol.encode() + b"\0" in lib

class LLVMProgram(CPUProgram):
  """A kernel linked into the process's JIT from object bytes. Call as `prg(*bufs, vals=(...), wait=False)`: launched
  as a CPU kernel (CPUProgram: on the thread pool when it has a thread plan and enough work, else on this thread)."""
  def __init__(self, name: str, lib: bytes):   # noqa: the library is linked here, CPUProgram.__init__ loads a .so
    llvm = _llvm()
    self.name = kernel_function_name(name)
    threaded = [s for s in (task_symbol(self.name), work_symbol(self.name), chunks_symbol(self.name),
                            scratch_symbol(self.name)) if _defines(lib, s)]
    builder = llvm.JITLibraryBuilder().add_object_img(lib).add_current_process().export_symbol(self.name)
    for symbol in threaded: builder.export_symbol(symbol)
    try: self.tracker = builder.link(_jit(), f"kiln_{self.name}_{next(_library_ids)}")
    except RuntimeError as e:   # e.g. a symbol no library in the process defines
      raise RuntimeError(f"could not link kernel {self.name} into the JIT: {e}") from None
    self.address = self.tracker[self.name]
    self.fxn = ctypes.CFUNCTYPE(None)(self.address)
    self._arg_counts: tuple[int, int] | None = None
    def constant(symbol: str) -> int: return ctypes.c_longlong.from_address(self.tracker[symbol]).value
    if task_symbol(self.name) in threaded:
      self.task: int | None = self.tracker[task_symbol(self.name)]
      self.work = constant(work_symbol(self.name))
    else: self.task, self.work = None, 0
    if chunks_symbol(self.name) in threaded:
      self.chunks, self.scratch_bytes = constant(chunks_symbol(self.name)), constant(scratch_symbol(self.name))
    else: self.chunks = self.scratch_bytes = 0

class LLVMDevice(Compiled):
  """Host memory (the same format as CPU, so copies between them are memcpy), kernels JIT-compiled by LLVM."""
  def __init__(self, device: str = "LLVM"):
    _llvm()   # fail when the device is opened, not at the first kernel
    super().__init__(device, HostAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
    self.renderer.describe_target = host_target   # compiled for the host CPU, all its features (-march=native)
