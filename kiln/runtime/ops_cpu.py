"""The CPU device: kernels rendered to C, compiled to a shared library with clang/gcc, run through ctypes.

A kernel whose outermost loop can be split (kiln/renderer/cstyle.py, "Threads") runs on the thread pool
(kiln/runtime/threadpool.py) when a launch has enough work; every other launch runs on the calling thread.
"""
from __future__ import annotations
import ctypes, functools, os, platform, re, shlex, shutil, subprocess, tempfile, time
import numpy as np
from kiln.device import Compiled, Compiler, CompileError, HostAllocator
from kiln.helpers import CC, CFLAGS
from kiln.renderer import kernel_function_name
from kiln.renderer.cstyle import CRenderer, chunks_symbol, scratch_symbol, task_symbol, work_symbol
from kiln.runtime.threadpool import (MIN_WORK_PER_THREAD, build_library_in_background, chunks_for, pool_for,
                                     thread_count)

# always on: no FMA contraction (results must match the reference bit for bit), no errno from libm, wrapping signed ints
BASE_FLAGS = ("-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fwrapv", "-fno-strict-aliasing")
# on by default, before CFLAGS so that a CFLAGS=-march=... (e.g. for a cache shared between machines) overrides it
DEFAULT_FLAGS = ("-march=native",)

def find_c_compiler() -> str:
  """The C compiler to use: the CC setting if set, else clang if on PATH, else gcc, else cc."""
  if CC.value: return CC.value
  for candidate in ("clang", "gcc", "cc"):
    if shutil.which(candidate): return candidate
  raise CompileError("no C compiler found: install clang or gcc, or set CC=/path/to/compiler")

@functools.cache
def _host_cpu_id() -> str:
  """What -march=native depends on, for the cache key (a cache dir may be shared between machines)."""
  try:
    with open("/proc/cpuinfo") as f:
      lines = [line for line in f if line.startswith(("model name", "flags"))]
    return platform.machine() + "".join(sorted(set(lines)))
  except OSError: return platform.machine() + platform.processor()

class ClangCompiler(Compiler):
  """C source -> shared library bytes, with `CC` (see find_c_compiler) and `CFLAGS` + BASE_FLAGS (+ `extra_flags`,
  e.g. `-pthread` for the thread pool). `command` fixes the compiler and flags instead (a build in another thread
  must not read settings that the caller may change meanwhile)."""
  runs_in_subprocess = True   # the compiler is its own process: several may run at once
  def __init__(self, extra_flags: tuple[str, ...] = (), command: list[str] | None = None):
    self.extra_flags = tuple(extra_flags)
    self.fixed_command = list(command) if command is not None else None

  def command(self) -> list[str]:
    """The compiler and flags (without file names), read from the current settings unless fixed."""
    if self.fixed_command is not None: return list(self.fixed_command)
    return [find_c_compiler(), *DEFAULT_FLAGS, *shlex.split(str(CFLAGS.value)), *BASE_FLAGS, *self.extra_flags, "-lm"]

  def cache_key(self) -> str:
    """Class name, compiler command and host CPU (because of -march=native)."""
    return f"{type(self).__name__} {' '.join(self.command())} {_host_cpu_id()}"

  def compile(self, src: str) -> bytes:
    """Compile `src` to the bytes of a shared library; CompileError (naming the kernel) on failure."""
    match = re.search(r"\bvoid\s+(\w+)\s*\(", src)
    kernel = match.group(1) if match else "<unnamed kernel>"
    command = self.command()
    with tempfile.TemporaryDirectory(prefix="kiln_cc_") as tmp:
      src_path, lib_path = os.path.join(tmp, f"{kernel}.c"), os.path.join(tmp, f"{kernel}.so")
      with open(src_path, "w") as f: f.write(src)
      try: result = subprocess.run([*command, "-o", lib_path, src_path], capture_output=True, text=True)
      except OSError as e: raise CompileError(f"compiling kernel {kernel}: could not run {command[0]!r}: {e}") from None
      if result.returncode != 0:
        raise CompileError(f"compiling kernel {kernel} failed ({' '.join(command)}, exit code {result.returncode}):\n"
                           f"{result.stderr.strip()}")
      with open(lib_path, "rb") as f: return f.read()

  def compile_group(self, sources: list[str]) -> list[bytes | Exception]:
    """Compile several kernels with one compiler process: each source to its own object file (`-c`), each object
    linked to its own library, so every kernel is cached and loaded on its own as if compiled alone. This saves the
    compiler driver's start per kernel (~60 ms of ~100-300). If the group does not compile, each source is compiled
    alone, so that an error names its kernel and the other kernels still build."""
    if len(sources) < 2: return super().compile_group(sources)
    command = self.command()
    compile_only = [arg for arg in command if arg not in ("-shared", "-lm")]
    with tempfile.TemporaryDirectory(prefix="kiln_cc_") as tmp:
      names = [f"kernel{i}" for i in range(len(sources))]   # kernels may share a name: numbered files
      for name, src in zip(names, sources):
        with open(os.path.join(tmp, f"{name}.c"), "w") as f: f.write(src)
      try: result = subprocess.run([*compile_only, "-c", *[f"{n}.c" for n in names]], cwd=tmp, capture_output=True)
      except OSError: return super().compile_group(sources)
      if result.returncode != 0: return super().compile_group(sources)
      out: list[bytes | Exception] = []
      for name, src in zip(names, sources):
        obj, lib = os.path.join(tmp, f"{name}.o"), os.path.join(tmp, f"{name}.so")
        linked = subprocess.run(_link_command(tuple(command), obj, lib), capture_output=True)
        if linked.returncode != 0: out.extend(super().compile_group([src])); continue
        with open(lib, "rb") as f: out.append(f.read())
      return out

def _link_command(command: tuple[str, ...], obj: str, lib: str) -> list[str]:
  """The command that links object file `obj` into the shared library `lib` as `command` would: the linker the
  compiler driver runs (asked once with -###, to save the driver's start per kernel), or the driver itself when its
  linker line can't be reused (gcc's collect2 takes temporary files)."""
  template = _linker_line(command, obj)
  if template is None: return [*command, "-o", lib, obj]
  return [lib if arg == _LIB_PLACEHOLDER else obj if arg == _OBJ_PLACEHOLDER else arg for arg in template]

_LIB_PLACEHOLDER, _OBJ_PLACEHOLDER = "\0kiln-library", "\0kiln-object"
_linker_lines: dict[tuple[str, ...], list[str] | None] = {}

def _linker_line(command: tuple[str, ...], obj: str) -> list[str] | None:
  """The linker's arguments for `command` with placeholders for the object and the library (cached per command);
  None unless the driver runs a plain `ld`-style linker with both files on its line."""
  if command in _linker_lines: return _linker_lines[command]
  lib = obj[:-2] + ".probe.so"
  try: shown = subprocess.run([*command, "-###", "-o", lib, obj], capture_output=True, text=True)
  except OSError: shown = None
  line = None
  if shown is not None and shown.returncode == 0:
    jobs = [ln for ln in shown.stderr.splitlines() if ln.startswith(" ")]
    try: args = shlex.split(jobs[-1]) if len(jobs) == 1 else []
    except ValueError: args = []
    if args and os.path.basename(args[0]) in ("ld", "ld.lld", "ld.gold", "ld.bfd") and \
       args.count(lib) == 1 and args.count(obj) == 1:
      line = [_LIB_PLACEHOLDER if a == lib else _OBJ_PLACEHOLDER if a == obj else a for a in args]
  _linker_lines[command] = line
  return line

class CPUProgram:
  """A compiled kernel loaded from shared-library bytes. Call as `prg(*buffer_handles, vals=(...), wait=False)`.

  `task` is the address of the kernel's thread-pool entry point and `work` its uops per launch when its outermost
  loop can be split (else None and 0); `threads()` is how many threads a launch uses under the current settings.
  A split reduction also has `chunks` (its pool launch runs exactly that many chunks, whatever the thread count) and
  `scratch_bytes` (a zeroed buffer passed after the kernel's buffers; see `new_scratch`); other kernels have 0."""
  def __init__(self, name: str, lib: bytes):
    self.name = kernel_function_name(name)
    with tempfile.NamedTemporaryFile(prefix=f"kiln_{self.name}_", suffix=".so", delete=False) as f:
      f.write(lib)
    try: self.lib = ctypes.CDLL(f.name)
    finally: os.unlink(f.name)   # the mapping stays valid after the file is gone
    try: self.fxn = getattr(self.lib, self.name)
    except AttributeError: raise RuntimeError(f"the compiled library has no function {self.name!r}") from None
    self.fxn.restype = None
    self._arg_counts: tuple[int, int] | None = None
    try:
      self.task: int | None = ctypes.cast(getattr(self.lib, task_symbol(self.name)), ctypes.c_void_p).value
      self.work = ctypes.c_longlong.in_dll(self.lib, work_symbol(self.name)).value
    except (AttributeError, ValueError): self.task, self.work = None, 0   # not splittable
    try:
      self.chunks = ctypes.c_longlong.in_dll(self.lib, chunks_symbol(self.name)).value
      self.scratch_bytes = ctypes.c_longlong.in_dll(self.lib, scratch_symbol(self.name)).value
    except ValueError: self.chunks = self.scratch_bytes = 0   # not a split reduction

  def new_scratch(self) -> np.ndarray:
    """A zeroed scratch buffer for pool launches of a split reduction (the chunk that combines re-zeroes its counter,
    so one buffer serves launch after launch, one launch at a time)."""
    return np.zeros(max(1, self.scratch_bytes), np.uint8)

  def pool_chunks(self) -> int:
    """How many chunks a pool launch runs now: the fixed chunk count of a split reduction, else a few per thread
    (`chunks_for`: a descheduled thread then delays only a small chunk)."""
    return self.chunks if self.chunks else chunks_for(self.work, self.threads())

  def threads(self) -> int:
    """Threads a launch runs on now: for a splittable kernel, as many as give each MIN_WORK_PER_THREAD uops (at most
    the pool's size, at least 1); 1 for any other kernel."""
    if self.task is None: return 1
    return max(1, min(thread_count(), self.chunks or thread_count(), self.work // max(1, MIN_WORK_PER_THREAD)))

  def __call__(self, *bufs, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    """Run the kernel on host buffers `bufs` with integer arguments `vals`; with wait=True return elapsed seconds."""
    threads = self.threads()
    start = time.perf_counter() if wait else 0.0
    if threads > 1:
      pointers = [b.ctypes.data for b in bufs]
      scratch = self.new_scratch() if self.chunks else None   # one per launch (launches may overlap), alive until done
      if scratch is not None: pointers.append(scratch.ctypes.data)
      addresses = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
      values = (ctypes.c_int * max(1, len(vals)))(*vals)
      pool_for(thread_count()).run(self.task, addresses, values, self.pool_chunks())
    else:
      if self._arg_counts != (len(bufs), len(vals)):
        self.fxn.argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int] * (len(vals) + 2)
        self._arg_counts = (len(bufs), len(vals))
      self.fxn(*[b.ctypes.data for b in bufs], *vals, 0, 1)
    return time.perf_counter() - start if wait else None

class CPUDevice(Compiled):
  """Host memory, C kernels compiled by clang/gcc."""
  def __init__(self, device: str = "CPU"):
    super().__init__(device, HostAllocator(), CRenderer(), ClangCompiler(), CPUProgram)
    # the pool's own C library is built meanwhile (overlapping the first kernels' codegen), if threads will be used
    try: threaded = thread_count() > 1
    except ValueError: threaded = False   # a bad THREADS is reported by the first launch
    if threaded: build_library_in_background()
