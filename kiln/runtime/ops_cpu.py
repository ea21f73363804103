"""The CPU device: kernels rendered to C, compiled to a shared library with clang/gcc, run through ctypes.

A kernel whose outermost loop can be split (kiln/renderer/cstyle.py, "Threads") runs on the thread pool
(kiln/runtime/threadpool.py) when a launch has enough work; every other launch runs on the calling thread.

Where no C compiler is found (CC unset and none of clang, gcc, cc on PATH: a machine with only pip-installed
packages), or with CPU_LLVM=1, the device compiles its kernels in process with LLVM instead (llvmlite: the LLVM
renderer, compiler and programs of kiln/runtime/ops_llvm.py, the same thread plans and pool); `cpu_compiler_kind`
decides, when the device opens.
"""
from __future__ import annotations
import ctypes, functools, hashlib, importlib.util, os, platform, re, shlex, shutil, subprocess, tempfile, threading, \
  time, weakref
import numpy as np
from kiln.device import Compiled, Compiler, CompileError, HostAllocator
from kiln.helpers import CC, CFLAGS, CPU_LLVM, DEBUG
from kiln.renderer import kernel_function_name
from kiln.renderer.cstyle import CRenderer, chunks_symbol, scratch_symbol, task_symbol, work_symbol
from kiln.runtime.cpu_target import target_for_flags
from kiln.runtime.threadpool import (MIN_WORK_PER_THREAD, THREADS, build_library_in_background, chunks_for, pool_for,
                                     thread_count)

# always on: no FMA contraction (results must match the reference bit for bit), no errno from libm, wrapping signed ints
BASE_FLAGS = ("-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fwrapv", "-fno-strict-aliasing")
# on by default, before CFLAGS so that a CFLAGS=-march=... or -O... (e.g. for a cache shared between machines)
# overrides it: setting CFLAGS=-march=x86-64-v3 alone must not drop the optimization level
DEFAULT_FLAGS = ("-O2", "-march=native")

def find_c_compiler() -> str:
  """The C compiler to use: the CC setting if set, else clang if on PATH, else gcc, else cc."""
  if CC.value: return CC.value
  if (found := _compiler_on_path(os.environ.get("PATH"))) is not None: return found
  raise CompileError("no C compiler found: install clang or gcc, set CC=/path/to/compiler, or pip install llvmlite "
                     "(the CPU device then compiles with LLVM)")

def cpu_compiler_kind() -> str:
  """What the CPU device compiles with, decided when it opens: "llvm" with CPU_LLVM=1, or where no C compiler is
  found (CC unset, none of clang, gcc, cc on PATH) and llvmlite is installed; "c" otherwise (without llvmlite, the
  first kernel then reports the missing compiler)."""
  if CPU_LLVM: return "llvm"
  if c_compiler_found(): return "c"
  return "llvm" if importlib.util.find_spec("llvmlite") is not None else "c"

def c_compiler_found() -> bool:
  """Whether find_c_compiler has a compiler to give (CC set, or clang, gcc or cc on PATH)."""
  return bool(CC.value) or _compiler_on_path(os.environ.get("PATH")) is not None

@functools.lru_cache(maxsize=4)
def _compiler_on_path(path: str | None) -> str | None:
  """The first of clang, gcc and cc on `path`, looked up once per PATH: the compiler's command is built for every
  kernel's cache key, and a missing clang costs a stat of every PATH folder (~0.3 ms a lookup, ~40 ms a cold
  transformer graph)."""
  return next((name for name in ("clang", "gcc", "cc") if shutil.which(name, path=path)), None)

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
    """Compile several kernels with one compiler run: the kernels are joined into as few C translation units as
    possible (`translation_units`: one, unless a kernel's names cannot be renamed apart), all compiled by one driver
    call (`-c`, one compiler process per unit) and each unit linked into one shared library (`link_library`). Every
    kernel of a unit gets that library's bytes, so it is still cached and loaded on its own: a kernel that shares its
    name with an earlier kernel of the unit is renamed inside it, and its bytes carry the new name (`with_symbol`).
    If the group does not compile, each source is compiled alone, so that an error names its kernel and the other
    kernels still build."""
    if len(sources) < 2: return super().compile_group(sources)
    command = self.command()
    compile_only = [arg for arg in command if arg not in ("-shared", "-lm")]
    units = translation_units(sources)
    with tempfile.TemporaryDirectory(prefix="kiln_cc_") as tmp:
      for j, unit in enumerate(units):
        with open(os.path.join(tmp, f"unit{j}.c"), "w") as f: f.write(join_sources([sources[i] for i, _ in unit],
                                                                                   [symbol for _, symbol in unit]))
      try: result = subprocess.run([*compile_only, "-c", *[f"unit{j}.c" for j in range(len(units))]], cwd=tmp,
                                   capture_output=True)
      except OSError: return super().compile_group(sources)
      if result.returncode != 0: return super().compile_group(sources)
      out: list[bytes | Exception | None] = [None] * len(sources)
      for j, unit in enumerate(units):
        obj, lib = os.path.join(tmp, f"unit{j}.o"), os.path.join(tmp, f"unit{j}.so")
        if link_library(tuple(command), obj, lib):
          with open(lib, "rb") as f: shared = f.read()   # one bytes object for the kernels that keep their names
          built: list = [shared if symbol is None else with_symbol(shared, symbol) for _, symbol in unit]
        else: built = super().compile_group([sources[i] for i, _ in unit])
        for (i, _), one in zip(unit, built): out[i] = one
      return out   # type: ignore[return-value]

# ---- joining kernels into one translation unit ----
# A rendered kernel defines at file scope: its exported functions and constants (the kernel, `<name>_task`,
# `<name>_work`, ...; see kiln/renderer/cstyle.py), static helpers derived from its name (`<name>_part`), vector
# typedefs (the same text for the same name), `static const` vectors `kiln_constN` numbered per kernel, and the
# shared half/bfloat16/fp8 helper blocks (the same text in every kernel that uses them).
_EXPORTED = re.compile(r"^(?:void|const long long)\s+(\w+)\s*[(=]", re.MULTILINE)
_KERNEL_FUNCTION = re.compile(r"^void\s+(\w+)\s*\(", re.MULTILINE)
_VECTOR_CONST = re.compile(r"\bkiln_const(\d+)\b")
# the suffixes of the file-scope names the C renderer derives from a kernel's name (task_symbol... in cstyle.py, and
# a split reduction's static `_part`/`_finish`); a name it derives that is missing here makes a joined unit fail to
# compile when two kernels share a name, and the group is then compiled kernel by kernel (slower, still correct)
_DERIVED_SUFFIXES = ("_task", "_work", "_chunks", "_scratch", "_part", "_finish")

def exported_names(src: str) -> frozenset[str]:
  """The names a kernel's source defines for the loader (functions and constants at file scope, not static)."""
  return frozenset(_EXPORTED.findall(src))

def _renamed(names: frozenset[str], old: str, new: str) -> frozenset[str]:
  return frozenset(new + name[len(old):] if name == old or name.startswith(old + "_") else name for name in names)

def translation_units(sources: list[str]) -> list[list[tuple[int, str | None]]]:
  """The kernels of `sources` grouped into C translation units, as (index into `sources`, the kernel's new function
  name in the unit, or None where it keeps its own). Kernels may share a name (different kernels over one shape, BEAM
  candidates): a kernel whose names are taken in the unit is renamed (`<name>_k<n>`, with the names derived from
  it); one that cannot be (no kernel function found) goes to the first unit where its names are free."""
  units: list[list[tuple[int, str | None]]] = []
  taken: list[set[str]] = []
  for i, src in enumerate(sources):
    names = exported_names(src)
    if units and names & taken[0] and (match := _KERNEL_FUNCTION.search(src)) is not None:
      function = match.group(1)
      symbol = next(f"{function}_k{n}" for n in range(1, len(sources) + 2)
                    if not _renamed(names, function, f"{function}_k{n}") & taken[0])
      units[0].append((i, symbol))
      taken[0] |= _renamed(names, function, symbol)
      continue
    j = next((j for j, used in enumerate(taken) if not names & used), None)
    if j is None: units.append([]); taken.append(set()); j = len(units) - 1
    units[j].append((i, None))
    taken[j] |= names
  return units

@functools.cache
def _shared_blocks() -> tuple[str, ...]:
  """The helper blocks the renderer emits verbatim in every kernel that needs them (kept once per unit)."""
  from kiln.dtype import dtypes
  from kiln.renderer.cstyle import BF16_HELPERS, FP8_HELPERS, HALF_HELPERS, fp8_helpers, vector_fma_helper, \
    vector_widen_helper
  return (HALF_HELPERS, BF16_HELPERS, FP8_HELPERS, *[fp8_helpers(dt) for dt in dtypes.fp8s],
          *[vector_fma_helper(dtypes.float32.vec(n)) for n in (4, 8, 16)],
          *[vector_widen_helper(dt.vec(n)) for dt in (dtypes.uint8, dtypes.int8) for n in (4, 8, 16)])

def rename_kernel(src: str, symbol: str) -> str:
  """`src` with its kernel function, and the file-scope names derived from the function's name, renamed to `symbol`
  (and the names derived from it)."""
  match = _KERNEL_FUNCTION.search(src)
  if match is None: raise ValueError(f"rename_kernel: no kernel function found to rename to {symbol!r}")
  function = match.group(1)
  pattern = re.compile(rf"\b{re.escape(function)}({'|'.join(_DERIVED_SUFFIXES)})?\b")
  return pattern.sub(lambda m: symbol + (m.group(1) or ""), src)

def join_sources(sources: list[str], symbols: list[str | None] | None = None) -> str:
  """Kernel sources joined into one C translation unit: kernel k renamed to `symbols[k]` where that is not None
  (`rename_kernel`), each kernel's vector constants renamed apart (`kiln_const3` of the second kernel ->
  `kiln_k1_const3`), a shared helper block or typedef kept once."""
  seen_blocks: set[str] = set()
  seen_typedefs: set[str] = set()
  parts: list[str] = []
  for k, src in enumerate(sources):
    if symbols is not None and symbols[k] is not None: src = rename_kernel(src, symbols[k])
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

# ---- a kernel renamed inside a shared library ----
# The bytes of a CPU kernel are a shared library, followed, when the kernel was renamed inside it, by a note naming
# its function: `<symbol><its length, 4 digits>` and _SYMBOL_MARK. The loader strips the note (the library loaded is
# the same for every kernel of the group) and looks the kernel up under that name.
_SYMBOL_MARK = b"#kiln-kernel-symbol\n"

def with_symbol(lib: bytes, symbol: str) -> bytes:
  """The library `lib` with a note that the kernel's function in it is called `symbol`."""
  name = symbol.encode()
  if not symbol.isidentifier() or len(name) > 9999: raise ValueError(f"with_symbol: bad kernel symbol {symbol!r}")
  return lib + name + b"%04d" % len(name) + _SYMBOL_MARK

def split_symbol(lib: bytes) -> tuple[bytes, str | None]:
  """(the library, the kernel's function name noted after it by `with_symbol`, or None when there is no note)."""
  if not lib.endswith(_SYMBOL_MARK): return lib, None
  end = len(lib) - len(_SYMBOL_MARK)
  length = int(lib[end - 4:end])
  return lib[:end - 4 - length], lib[end - 4 - length:end - 4].decode()

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

@functools.cache
def _c_array_type(item: type, length: int) -> type:
  """The ctypes type of an array of `length` `item`s, made once: a type made per launch became garbage (a reference
  cycle) for the collector after each launch."""
  return item * length

# id of a host array -> (a weak reference to it, its address): `array.ctypes.data` costs ~1 us, and a graph's launches
# pass the same arrays call after call (the allocator hands freed ones out again)
_host_addresses: dict[int, tuple] = {}

def host_address(array: np.ndarray) -> int:
  """The address of the host array `array`'s first byte (remembered while the array lives)."""
  entry = _host_addresses.get(id(array))
  if entry is not None and entry[0]() is array: return entry[1]
  if len(_host_addresses) >= 4096: _host_addresses.clear()
  address = array.ctypes.data
  _host_addresses[id(array)] = (weakref.ref(array), address)
  return address

class CPUProgram:
  """A compiled kernel loaded from shared-library bytes. Call as `prg(*buffer_handles, vals=(...), wait=False)`.

  `task` is the address of the kernel's thread-pool entry point and `work` its uops per launch when its outermost
  loop can be split (else None and 0); `threads()` is how many threads a launch uses under the current settings.
  A split reduction also has `chunks` (its pool launch runs exactly that many chunks, whatever the thread count) and
  `scratch_bytes` (a zeroed buffer passed after the kernel's buffers; see `new_scratch`); other kernels have 0."""
  def __init__(self, name: str, lib: bytes):
    lib, symbol = split_symbol(lib)   # a kernel renamed in its group's library (ClangCompiler.compile_group)
    self.name = symbol or kernel_function_name(name)
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

  _threads_memo: tuple | None = None   # (THREADS, MIN_WORK_PER_THREAD, threads) of the last `threads()`

  def threads(self) -> int:
    """Threads a launch runs on now: for a splittable kernel, as many as give each MIN_WORK_PER_THREAD uops (at most
    the pool's size, at least 1); 1 for any other kernel."""
    if self.task is None: return 1
    # remembered for the settings it was found under: every launch asks (~1.5 us of an eager launch)
    memo = self._threads_memo
    if memo is not None and memo[0] == THREADS.value and memo[1] == MIN_WORK_PER_THREAD: return memo[2]
    threads = max(1, min(thread_count(), self.chunks or thread_count(), self.work // max(1, MIN_WORK_PER_THREAD)))
    self._threads_memo = (THREADS.value, MIN_WORK_PER_THREAD, threads)
    return threads

  def __call__(self, *bufs, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    """Run the kernel on host buffers `bufs` with integer arguments `vals`; with wait=True return elapsed seconds."""
    threads = self.threads()
    start = time.perf_counter() if wait else 0.0
    if threads > 1:
      pointers = [host_address(b) for b in bufs]
      scratch = self.new_scratch() if self.chunks else None   # one per launch (launches may overlap), alive until done
      if scratch is not None: pointers.append(scratch.ctypes.data)
      addresses = _c_array_type(ctypes.c_void_p, max(1, len(pointers)))(*pointers)
      values = _c_array_type(ctypes.c_int, max(1, len(vals)))(*vals)
      pool_for(thread_count()).run(self.task, addresses, values, self.pool_chunks())
    else:
      if self._arg_counts != (len(bufs), len(vals)):
        self.fxn.argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int] * (len(vals) + 2)
        self._arg_counts = (len(bufs), len(vals))
      self.fxn(*[host_address(b) for b in bufs], *vals, 0, 1)
    return time.perf_counter() - start if wait else None

class CPUDevice(Compiled):
  """Host memory, C kernels compiled by clang/gcc, or LLVM kernels compiled in process (`cpu_compiler_kind`)."""
  def __init__(self, device: str = "CPU"):
    if cpu_compiler_kind() == "llvm":
      self._open_with_llvm(device)
      return
    super().__init__(device, HostAllocator(), CRenderer(), ClangCompiler(), CPUProgram)
    # the heuristics plan for the instructions the compiler may use (-march=native, or the -march CFLAGS gives)
    self.renderer.describe_target = lambda: target_for_flags(self.compiler.command())
    _build_pool_library()

  def _open_with_llvm(self, device: str) -> None:
    """The device with the LLVM device's renderer, compiler and programs (kiln/runtime/ops_llvm.py)."""
    from kiln.runtime.ops_llvm import LLVMCompiler, LLVMProgram, host_target
    from kiln.renderer.llvmir import LLVMRenderer
    if DEBUG >= 1 and not CPU_LLVM:
      print(f"{device}: no C compiler found (CC unset, no clang, gcc or cc on PATH): compiling kernels with LLVM "
            "(llvmlite); CC=/path/to/compiler for C")
    super().__init__(device, HostAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
    self.renderer.describe_target = host_target   # compiled for the host CPU, all its features (-march=native)
    _register_graph_by_compiler()
    # the pool's C library where a compiler is found (CPU_LLVM=1 beside gcc), else its LLVM build at the first launch
    if c_compiler_found(): _build_pool_library()

def _build_pool_library() -> None:
  """Start building the thread pool's C library (overlapping the first kernels' codegen), if threads will be used."""
  try: threaded = thread_count() > 1
  except ValueError: threaded = False   # a bad THREADS is reported by the first launch
  if threaded: build_library_in_background()

@functools.cache
def _register_graph_by_compiler() -> None:
  """TinyJit's CPU graph in the language of the device's compiler: C for the C path, LLVM IR where the CPU device
  compiles with LLVM (kiln/engine/graph.py's CPUGraph and LLVMGraph run the same kernels' entry points)."""
  from kiln.device import Device
  from kiln.engine.graph import GRAPHS, CPUGraph, LLVMGraph
  from kiln.runtime.ops_llvm import LLVMCompiler
  class CPUDeviceGraph(CPUGraph):
    """CPUGraph or LLVMGraph, whichever the batch's device compiles (CPU devices opened before and after a change
    of CPU_LLVM may differ)."""
    def __new__(cls, items, swapped):
      llvm = isinstance(Device[items[0].runner.device].compiler, LLVMCompiler)
      return (LLVMGraph if llvm else CPUGraph)(items, swapped)
  GRAPHS["CPU"] = CPUDeviceGraph
