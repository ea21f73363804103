"""The LLVM device: kernels rendered to LLVM IR, compiled in process by llvmlite (no C compiler needed), run through
ctypes. Object code is cached on disk like the CPU device's libraries, keyed by the source and the host CPU."""
from __future__ import annotations
import ctypes, functools, itertools, re, time
from kiln.device import Compiled, Compiler, CompileError, HostAllocator
from kiln.renderer import kernel_function_name
from kiln.renderer.llvmir import LLVMRenderer

def _llvm():
  """The llvmlite binding module, with a clear error when llvmlite is not installed."""
  try: import llvmlite.binding as llvm
  except ImportError:
    raise RuntimeError("the LLVM device needs llvmlite: pip install 'kiln[llvm]' (or pip install llvmlite)") from None
  return llvm

@functools.cache
def host_target_machine():
  """An O2 target machine for this CPU with all its features (the equivalent of -march=native)."""
  llvm = _llvm()
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=2, reloc="pic", codemodel="default")

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
  """LLVM IR text -> object code: parse, verify, optimize at O2 for the host CPU, emit an object file."""
  def cache_key(self) -> str:
    """Class name, optimization level and the target the code is made for (see _target_id)."""
    return f"{type(self).__name__} O2 {_target_id()}"

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
    tuning = llvm.create_pipeline_tuning_options(speed_level=2)
    tuning.loop_vectorization = tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)
    return machine.emit_object(module)

_library_ids = itertools.count()

class LLVMProgram:
  """A kernel linked into the process's JIT from object bytes. Call as `prg(*bufs, vals=(...), wait=False)`."""
  def __init__(self, name: str, lib: bytes):
    llvm = _llvm()
    self.name = kernel_function_name(name)
    builder = llvm.JITLibraryBuilder().add_object_img(lib).add_current_process().export_symbol(self.name)
    try: self.tracker = builder.link(_jit(), f"kiln_{self.name}_{next(_library_ids)}")
    except RuntimeError as e:   # e.g. a symbol no library in the process defines
      raise RuntimeError(f"could not link kernel {self.name} into the JIT: {e}") from None
    self.address = self.tracker[self.name]
    self._fxn = None
    self._arg_counts: tuple[int, int] | None = None

  def __call__(self, *bufs, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    """Run the kernel on host buffers `bufs` with integer arguments `vals`; with wait=True return elapsed seconds."""
    if self._arg_counts != (len(bufs), len(vals)):
      signature = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(bufs), *[ctypes.c_int] * len(vals))
      self._fxn, self._arg_counts = signature(self.address), (len(bufs), len(vals))
    start = time.perf_counter() if wait else 0.0
    self._fxn(*[b.ctypes.data for b in bufs], *vals)
    return time.perf_counter() - start if wait else None

class LLVMDevice(Compiled):
  """Host memory (the same format as CPU, so copies between them are memcpy), kernels JIT-compiled by LLVM."""
  def __init__(self, device: str = "LLVM"):
    _llvm()   # fail when the device is opened, not at the first kernel
    super().__init__(device, HostAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
