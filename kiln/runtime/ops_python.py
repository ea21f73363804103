"""The PYTHON device: kernels rendered to Python source and run by the interpreter (the reference backend)."""
from __future__ import annotations
import linecache, time
from kiln.device import Compiled, Compiler, CompileError, HostAllocator
from kiln.renderer import kernel_function_name
from kiln.renderer.python import PythonRenderer

class PythonCompiler(Compiler):
  """'Compiling' is encoding the source: the program exec()s it."""
  disk_cache = False

  def compile(self, src: str) -> bytes:
    """The source as UTF-8 bytes, after checking that it parses (a SyntaxError becomes a CompileError)."""
    try: compile(src, "<kiln kernel>", "exec")
    except SyntaxError as e: raise CompileError(f"generated Python kernel does not parse: {e}\n{src}") from None
    return src.encode()

class PythonProgram:
  """A Python kernel. Call as `prg(*buffer_handles, vals=(...), wait=False)`; buffers are host uint8 arrays."""
  _count = 0

  def __init__(self, name: str, lib: bytes):
    self.name = kernel_function_name(name)
    src = lib.decode()
    PythonProgram._count += 1
    filename = f"<kiln kernel {self.name} #{PythonProgram._count}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)   # readable tracebacks
    namespace: dict = {}
    exec(compile(src, filename, "exec"), namespace)
    try: self.fxn = namespace[self.name]
    except KeyError: raise RuntimeError(f"the kernel source defines no function {self.name!r}") from None

  def __call__(self, *bufs, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    """Run the kernel; with wait=True return elapsed seconds."""
    start = time.perf_counter() if wait else 0.0
    self.fxn(*[memoryview(b) for b in bufs], *vals)
    return time.perf_counter() - start if wait else None

class PythonDevice(Compiled):
  """Host memory (the same format as CPU, so copies between them are memcpy), kernels run as Python."""
  def __init__(self, device: str = "PYTHON"):
    super().__init__(device, HostAllocator(), PythonRenderer(), PythonCompiler(), PythonProgram)
