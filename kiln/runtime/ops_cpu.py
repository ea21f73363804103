"""The CPU device: kernels rendered to C, compiled to a shared library with clang/gcc, run through ctypes.

A kernel whose outermost loop can be split (kiln/renderer/cstyle.py, "Threads") runs on the thread pool
(kiln/runtime/threadpool.py) when a launch has enough work; every other launch runs on the calling thread.
"""
from __future__ import annotations
import ctypes, functools, hashlib, os, platform, re, shlex, shutil, subprocess, tempfile, threading, time
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
    match = re.search(r"^void\s+(\w+)\s*\(", src, re.MULTILINE) or re.search(r"\bvoid\s+(\w+)\s*\(", src)
    kernel = match.group(1) if match else "<unnamed kernel>"
    command = self.command()
    with tempfile.TemporaryDirectory(prefix="kiln_cc_") as tmp:
      stem = kernel if kernel.isidentifier() else "kernel"   # the compiler's messages name the file
      src_path, obj_path, lib_path = (os.path.join(tmp, f"{stem}.{ext}") for ext in ("c", "o", "so"))
      with open(src_path, "w") as f: f.write(src)
      compile_only = [arg for arg in command if arg not in ("-shared", "-lm")]
      try: result = subprocess.run([*compile_only, "-c", "-o", obj_path, src_path], capture_output=True, text=True)
      except OSError as e: raise CompileError(f"compiling kernel {kernel}: could not run {command[0]!r}: {e}") from None
      if result.returncode == 0 and link_library(tuple(command), obj_path, lib_path):
        with open(lib_path, "rb") as f: return f.read()
      if result.returncode == 0:   # the link failed: the driver alone says why
        result = subprocess.run([*command, "-o", lib_path, src_path], capture_output=True, text=True)
        if result.returncode == 0:
          with open(lib_path, "rb") as f: return f.read()
      raise CompileError(f"compiling kernel {kernel} failed ({' '.join(command)}, exit code {result.returncode}):\n"
                         f"{result.stderr.strip()}")

  def snapshot(self) -> ClangCompiler:
    """This compiler with its command fixed now (for builds on other threads)."""
    return ClangCompiler(self.extra_flags, command=self.command())

  def compile_group(self, sources: list[str]) -> list[bytes | Exception]:
    """Compile several kernels with one compiler run: the kernels are joined into as few C translation units as their
    exported names allow (`translation_units`), all compiled by one driver call (`-c`, one compiler process per unit)
    and each unit linked into one shared library (`link_library`). Every kernel of a unit gets the same library
    bytes: it holds each of their functions under its own name, so a kernel is still cached and loaded on its own.
    If the group does not compile, each source is compiled alone, so that an error names its kernel and the other
    kernels still build."""
    if len(sources) < 2: return super().compile_group(sources)
    command = self.command()
    compile_only = [arg for arg in command if arg not in ("-shared", "-lm")]
    units = translation_units(sources)
    with tempfile.TemporaryDirectory(prefix="kiln_cc_") as tmp:
      for j, unit in enumerate(units):
        with open(os.path.join(tmp, f"unit{j}.c"), "w") as f: f.write(join_sources([sources[i] for i in unit]))
      try: result = subprocess.run([*compile_only, "-c", *[f"unit{j}.c" for j in range(len(units))]], cwd=tmp,
                                   capture_output=True)
      except OSError: return super().compile_group(sources)
      if result.returncode != 0: return super().compile_group(sources)
      out: list[bytes | Exception | None] = [None] * len(sources)
      for j, unit in enumerate(units):
        obj, lib = os.path.join(tmp, f"unit{j}.o"), os.path.join(tmp, f"unit{j}.so")
        if link_library(tuple(command), obj, lib):
          with open(lib, "rb") as f: built: list = [f.read()] * len(unit)   # one bytes object, shared
        else: built = super().compile_group([sources[i] for i in unit])
        for i, one in zip(unit, built): out[i] = one
      return out   # type: ignore[return-value]

# ---- joining kernels into one translation unit ----
# A rendered kernel defines at file scope: its exported functions and constants (the kernel, `<name>_task`,
# `<name>_work`, ...; see kiln/renderer/cstyle.py), static helpers derived from its name (`<name>_part`), vector
# typedefs (the same text for the same name), `static const` vectors `kiln_constN` numbered per kernel, and the
# shared half/bfloat16/fp8 helper blocks (the same text in every kernel that uses them).
_EXPORTED = re.compile(r"^(?:void|const long long)\s+(\w+)\s*[(=]", re.MULTILINE)
_VECTOR_CONST = re.compile(r"\bkiln_const(\d+)\b")

def exported_names(src: str) -> frozenset[str]:
  """The names a kernel's source defines for the loader (functions and constants at file scope, not static)."""
  return frozenset(_EXPORTED.findall(src))

def translation_units(sources: list[str]) -> list[list[int]]:
  """Indices into `sources` grouped into translation units in which no two kernels export the same name (kernels may
  share a name: BEAM candidates, or different kernels over the same shape): the first unit with room, in order."""
  units: list[list[int]] = []
  taken: list[set[str]] = []
  for i, src in enumerate(sources):
    names = exported_names(src)
    j = next((j for j, used in enumerate(taken) if not names & used), None)
    if j is None: units.append([]); taken.append(set()); j = len(units) - 1
    units[j].append(i)
    taken[j] |= names
  return units

@functools.cache
def _shared_blocks() -> tuple[str, ...]:
  """The helper blocks the renderer emits verbatim in every kernel that needs them (kept once per unit)."""
  from kiln.dtype import dtypes
  from kiln.renderer.cstyle import BF16_HELPERS, FP8_HELPERS, HALF_HELPERS, fp8_helpers
  return (HALF_HELPERS, BF16_HELPERS, FP8_HELPERS, *[fp8_helpers(dt) for dt in dtypes.fp8s])

def join_sources(sources: list[str]) -> str:
  """Kernel sources whose exported names differ joined into one C translation unit: each kernel's vector constants
  renamed apart (`kiln_const3` of the second kernel -> `kiln_k1_const3`), a shared helper block or typedef kept once."""
  seen_blocks: set[str] = set()
  seen_typedefs: set[str] = set()
  parts: list[str] = []
  for k, src in enumerate(sources):
    for block in _shared_blocks():
      if block in src:
        if block in seen_blocks: src = src.replace(block, "", 1)
        seen_blocks.add(block)
    if k: src = _VECTOR_CONST.sub(lambda m: f"kiln_k{k}_const{m.group(1)}", src)
    lines = []
    for line in src.split("\n"):
      if line.startswith("typedef "):
        if line in seen_typedefs: continue
        seen_typedefs.add(line)
      lines.append(line)
    parts.append("\n".join(lines))
  return "\n".join(parts) + "\n"

# ---- linking ----
def link_library(command: tuple[str, ...], obj: str, lib: str) -> bool:
  """Link object file `obj` into the shared library `lib`; False if that fails. On Linux, a minimal `ld -shared`
  against the C and math libraries this process has loaded, with every symbol required to resolve (`-z defs`):
  ~10 ms against the compiler driver's ~20-40 ms (its start, startup files, library search). A kernel that needs
  more (e.g. libgcc's 128-bit division) fails that check and is linked by the compiler driver instead."""
  minimal = _minimal_link_line()
  if minimal is not None:
    try:
      if subprocess.run([minimal[0], "-shared", "-z", "defs", "--as-needed", "-o", lib, obj, *minimal[1:]],
                        capture_output=True).returncode == 0: return True
    except OSError: pass
  try: return subprocess.run([*command, "-o", lib, obj], capture_output=True).returncode == 0
  except OSError: return False

@functools.cache
def _minimal_link_line() -> tuple[str, ...] | None:
  """`ld` and the paths of the libc and libm loaded in this process (where undefined symbols of a kernel resolve
  when it is loaded), or None where the minimal link is not used (not Linux, no `ld`, libraries not found)."""
  ld = shutil.which("ld")
  if platform.system() != "Linux" or ld is None: return None
  try:
    with open("/proc/self/maps") as f: mapped = {line.split()[-1] for line in f if ".so" in line}
  except OSError: return None
  libc = sorted(p for p in mapped if os.path.basename(p).startswith("libc.so"))
  libm = sorted(p for p in mapped if os.path.basename(p).startswith("libm.so"))
  return (ld, libm[0], libc[0]) if libc and libm else None

_loaded_libraries: dict[bytes, ctypes.CDLL] = {}
_loading = threading.Lock()

def load_library(lib: bytes) -> ctypes.CDLL:
  """The shared library with the bytes `lib`, loaded once per process: the kernels compiled in one group share one
  library (ClangCompiler.compile_group), which is then loaded once for all of them."""
  digest = hashlib.sha256(lib).digest()
  with _loading:
    if (loaded := _loaded_libraries.get(digest)) is not None: return loaded
    with tempfile.NamedTemporaryFile(prefix="kiln_", suffix=".so", delete=False) as f: f.write(lib)
    try: loaded = _loaded_libraries[digest] = ctypes.CDLL(f.name)
    finally: os.unlink(f.name)   # the mapping stays valid after the file is gone
    return loaded

class CPUProgram:
  """A compiled kernel loaded from shared-library bytes. Call as `prg(*buffer_handles, vals=(...), wait=False)`.

  `task` is the address of the kernel's thread-pool entry point and `work` its uops per launch when its outermost
  loop can be split (else None and 0); `threads()` is how many threads a launch uses under the current settings.
  A split reduction also has `chunks` (its pool launch runs exactly that many chunks, whatever the thread count) and
  `scratch_bytes` (a zeroed buffer passed after the kernel's buffers; see `new_scratch`); other kernels have 0."""
  def __init__(self, name: str, lib: bytes):
    self.name = kernel_function_name(name)
    self.lib = load_library(lib)
    try: self.fxn = self.lib[self.name]   # a function object of its own (getattr would share one per library)
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
