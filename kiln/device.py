"""Devices: the registry (`Device["CPU"]`), device memory (`Buffer`, allocators), compilers and the `Compiled` device.

A device is one `Compiled` instance that bundles everything needed to run a kernel on it: an allocator for its memory,
a renderer (uop list -> source), a compiler (source -> binary) and a runtime class (binary -> callable program).

>>> from kiln.device import Device, Buffer
>>> from kiln.dtype import dtypes
>>> Device.canonicalize("cpu")
'CPU'
>>> Buffer("CPU", 3, dtypes.int32, initial_value=bytes(12)).numpy().tolist()
[0, 0, 0]
"""
from __future__ import annotations
import collections, concurrent.futures, hashlib, importlib, os, pathlib
from typing import Any, Callable, Iterator
from kiln.dtype import DType, dtypes, to_numpy_dtype, fp8_to_float32
from kiln.helpers import (ALLOW_DEVICE_USAGE, CACHELEVEL, DEBUG, DISABLE_COMPILER_CACHE, LRU, MAX_BUFFER_SIZE,
                          GlobalCounters, kernel_cache_dir)

# ---------------- allocators ----------------

class Allocator:
  """Device memory management. Subclasses implement `_alloc`/`_free` and the two copies; handles are opaque."""
  def alloc(self, nbytes: int) -> Any:
    """A handle to `nbytes` bytes of device memory (contents undefined)."""
    if nbytes < 0: raise ValueError(f"alloc: cannot allocate a negative number of bytes ({nbytes})")
    return self._alloc(nbytes)
  def free(self, handle: Any, nbytes: int) -> None:
    """Give memory from `alloc(nbytes)` back."""
    self._free(handle, nbytes)
  def _alloc(self, nbytes: int) -> Any: raise NotImplementedError(f"{type(self).__name__} does not implement _alloc")
  def _free(self, handle: Any, nbytes: int) -> None: pass
  def copyin(self, handle: Any, src: memoryview) -> None:
    """Copy host bytes `src` into device memory `handle`."""
    raise NotImplementedError(f"{type(self).__name__} does not implement copyin")
  def copyout(self, dest: memoryview, handle: Any) -> None:
    """Copy device memory `handle` into host bytes `dest`."""
    raise NotImplementedError(f"{type(self).__name__} does not implement copyout")
  def as_memoryview(self, handle: Any) -> memoryview | None:
    """A zero-copy byte view of `handle` when the memory is host memory, else None."""
    return None
  # whether handles are plain host memory, so `wrap` can hand the device a caller's pointer (Tensor.from_blob)
  host_memory = False
  def wrap(self, ptr: int, nbytes: int) -> Any:
    """A handle to the `nbytes` bytes of host memory at address `ptr`, used in place (the caller owns the memory and
    keeps it alive); only for allocators with `host_memory`."""
    raise NotImplementedError(f"{type(self).__name__} cannot use host memory in place")
  def offset_view(self, handle: Any, offset: int, nbytes: int) -> Any:
    """A handle to bytes [offset, offset+nbytes) of `handle`, sharing its memory (for `Buffer.view`)."""
    raise NotImplementedError(f"{type(self).__name__} does not support views of its buffers")
  def transfer(self, dest: Any, src: Any, src_allocator: Allocator, nbytes: int) -> bool:
    """Copy `nbytes` from `src` (a handle of `src_allocator`) into this allocator's `dest` without a host round
    trip, where both memories allow it (the same GPU, or two GPUs peer to peer); False when they do not, and the
    caller copies through host memory instead."""
    return False

class LRUAllocator(Allocator):
  """An allocator that keeps freed handles, per size, and hands them out again before allocating new memory.

  At most `max_cached_bytes` are kept; `free_cache()` releases them all. With LRU=0 nothing is kept.
  """
  def __init__(self, max_cached_bytes: int = 1 << 30):
    self.cache: dict[int, list[Any]] = collections.defaultdict(list)
    self.cached_bytes, self.max_cached_bytes = 0, max_cached_bytes
  def alloc(self, nbytes: int) -> Any:
    """A cached handle of exactly `nbytes` if there is one, else fresh memory (dropping the cache if memory ran out)."""
    if nbytes < 0: raise ValueError(f"alloc: cannot allocate a negative number of bytes ({nbytes})")
    if self.cache.get(nbytes):
      self.cached_bytes -= nbytes
      return self.cache[nbytes].pop()
    try: return self._alloc(nbytes)
    except MemoryError:
      self.free_cache()
      return self._alloc(nbytes)
  def free(self, handle: Any, nbytes: int) -> None:
    """Keep `handle` for reuse (or really free it when the cache is full)."""
    if LRU and self.cached_bytes + nbytes <= self.max_cached_bytes:
      self.cache[nbytes].append(handle)
      self.cached_bytes += nbytes
    else: self._free(handle, nbytes)
  def free_cache(self) -> None:
    """Really free every cached handle."""
    for nbytes, handles in self.cache.items():
      for handle in handles: self._free(handle, nbytes)
    self.cache.clear()
    self.cached_bytes = 0

class HostAllocator(LRUAllocator):
  """Host memory as numpy uint8 arrays (64-byte aligned). The address of a handle is `handle.ctypes.data`."""
  ALIGNMENT = 64
  def _alloc(self, nbytes: int) -> Any:
    import numpy as np
    raw = np.empty(nbytes + self.ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % self.ALIGNMENT
    return raw[offset:offset + nbytes]
  def copyin(self, handle: Any, src: memoryview) -> None:
    """Copy `src` bytes into the host array `handle`."""
    memoryview(handle)[:] = _as_bytes_view(src)
  def copyout(self, dest: memoryview, handle: Any) -> None:
    """Copy the host array `handle` into `dest`."""
    _as_bytes_view(dest)[:] = memoryview(handle)
  def as_memoryview(self, handle: Any) -> memoryview:
    """A writable byte view of the host array `handle`."""
    return memoryview(handle)
  host_memory = True
  def wrap(self, ptr: int, nbytes: int) -> Any:
    """The host memory at `ptr` as a uint8 array handle (no copy)."""
    import ctypes, numpy as np
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)) if nbytes else np.empty(0, np.uint8)
  def offset_view(self, handle: Any, offset: int, nbytes: int) -> Any:
    """A slice of the host array `handle` (shares its memory)."""
    return handle[offset:offset + nbytes]

def _as_bytes_view(mv: memoryview | bytes | bytearray) -> memoryview:
  """A flat unsigned-byte view of any contiguous buffer."""
  view = mv if isinstance(mv, memoryview) else memoryview(mv)
  if not view.c_contiguous: raise ValueError("expected a C-contiguous buffer for a device copy")
  return view if view.format == "B" and view.ndim == 1 else view.cast("B")

# ---------------- Buffer ----------------

class Buffer:
  """`size` elements of `dtype` in the memory of `device`. Memory is allocated lazily by `allocate()`/`copyin()`
  (or at once when `initial_value` bytes are given) and returned to the allocator when the Buffer is collected."""
  _computed = None   # the graph nodes realized from this buffer's contents (kiln/tensor.py _results_of), once any
  def __init__(self, device: str, size: int, dtype: DType, initial_value: bytes | None = None):
    if not isinstance(size, int) or size < 0: raise ValueError(f"Buffer: size must be a non-negative int, got {size!r}")
    if dtype == dtypes.void: raise ValueError("Buffer: dtype void has no storage")
    self.device, self.size, self.dtype = Device.canonicalize(device), size, dtype
    self.nbytes = size * dtype.itemsize
    self._allocator: Allocator | None = None
    self._base: Buffer | None = None   # set for a view (see `view`): it shares the base's memory at byte `_offset`
    self._offset = 0
    self._external = False   # memory the caller owns (`allocate(external_ptr=...)`): never freed or cached here
    if initial_value is not None: self.copyin(memoryview(initial_value))

  def view(self, size: int, dtype: DType, offset: int) -> Buffer:
    """`size` elements of `dtype` starting `offset` bytes into this buffer, sharing its memory (nothing is copied);
    tinygrad's parameter order.

    >>> base = Buffer("CPU", 4, dtypes.uint8, initial_value=bytes([1, 0, 2, 0]))
    >>> base.view(1, dtypes.uint16, 2).numpy().tolist()
    [2]
    """
    if offset < 0 or size < 0 or offset + size * dtype.itemsize > self.nbytes:
      raise ValueError(f"Buffer.view: {size} x {dtype.name} at byte {offset} does not fit in {self!r} "
                       f"({self.nbytes} bytes)")
    out = Buffer(self.device, size, dtype)
    out._base, out._offset = self._base if self._base is not None else self, self._offset + offset
    return out

  def allocate(self, external_ptr: int | None = None) -> Buffer:
    """Allocate the device memory (once; later calls do nothing). A view maps its part of the base's memory.

    With `external_ptr`, the buffer uses the host memory at that address in place (tinygrad's `from_blob`): the
    caller owns it and keeps it valid while the buffer lives. A RuntimeError if the device cannot use host memory."""
    if external_ptr is not None:
      if self.is_allocated(): raise RuntimeError(f"Buffer.allocate: {self!r} is allocated already")
      allocator = Device[self.device].allocator
      if not allocator.host_memory: raise RuntimeError(f"Buffer.allocate: {self.device} cannot use host memory in place")
      self._buf, self._allocator, self._external = allocator.wrap(external_ptr, self.nbytes), allocator, True
    elif self._allocator is None and self._base is not None:
      allocator = Device[self.device].allocator
      self._buf = allocator.offset_view(self._base.allocate()._buf, self._offset, self.nbytes)
      self._allocator = allocator
    elif self._allocator is None:
      if MAX_BUFFER_SIZE.value > 0 and self.size > MAX_BUFFER_SIZE.value:
        raise RuntimeError(f"Buffer: {self.size} elements is more than MAX_BUFFER_SIZE={MAX_BUFFER_SIZE.value}")
      allocator = Device[self.device].allocator
      self._buf = allocator.alloc(self.nbytes)
      self._allocator = allocator
      GlobalCounters.mem_used += self.nbytes
    return self

  def is_allocated(self) -> bool:
    """Whether device memory has been allocated (for a view: whether its base's has)."""
    return self._allocator is not None or (self._base is not None and self._base.is_allocated())

  def is_initialized(self) -> bool:
    """Whether this buffer's own memory (or, for a view, its mapping of the base's) exists."""
    return self._allocator is not None

  def ensure_allocated(self) -> Buffer:
    """`allocate()`: the memory exists afterwards (tinygrad's name)."""
    return self.allocate()

  @property
  def base(self) -> Buffer:
    """The buffer that owns the memory: the base of a view, else this buffer."""
    return self._base if self._base is not None else self

  def deallocate(self) -> None:
    """Give the memory back to the allocator now (a view only forgets its mapping); `allocate()` makes new memory."""
    if self._allocator is None: raise RuntimeError(f"Buffer.deallocate: {self!r} is not allocated")
    self.__del__()
    self._allocator = None

  def as_buffer(self, allow_zero_copy: bool = False, force_zero_copy: bool = False) -> memoryview:
    """The contents as a byte memoryview: a view of the memory itself where allowed and the device has host memory
    (it changes with the buffer and must not outlive it), else a copy. `force_zero_copy` raises if a copy is needed."""
    if (allow_zero_copy or force_zero_copy) and self.is_allocated():
      self.allocate()
      if (view := self._allocator.as_memoryview(self._buf)) is not None: return view
    if force_zero_copy: raise RuntimeError(f"Buffer.as_buffer: {self.device} memory cannot be viewed without a copy")
    return self.copyout(memoryview(bytearray(self.nbytes)))

  def as_typed_buffer(self, shape: tuple[int, ...] | None = None, allow_zero_copy: bool = False,
                      force_zero_copy: bool = False) -> memoryview:
    """`as_buffer` cast to the buffer's element format (shape `shape`, default (size,)); a TypeError for dtypes
    without a struct format (bfloat16, fp8)."""
    if self.dtype.fmt is None: raise TypeError(f"Buffer.as_typed_buffer: {self.dtype!r} has no struct format")
    raw = self.as_buffer(allow_zero_copy, force_zero_copy)
    return raw.cast(self.dtype.fmt, shape if shape is not None else (self.size,))

  def _check_size(self, mv: memoryview, what: str) -> memoryview:
    view = _as_bytes_view(mv)
    if view.nbytes != self.nbytes:
      raise ValueError(f"Buffer.{what}: got {view.nbytes} bytes but the buffer holds {self.nbytes} "
                       f"({self.size} x {self.dtype.name})")
    return view

  def copyin(self, mv: memoryview) -> Buffer:
    """Copy host bytes (exactly `nbytes` of them) into the buffer, allocating it if needed."""
    view = self._check_size(mv, "copyin")
    self.allocate()
    self._allocator.copyin(self._buf, view)
    return self

  def copyout(self, mv: memoryview) -> memoryview:
    """Copy the buffer's contents into the host bytes `mv` (exactly `nbytes` of them) and return `mv`."""
    view = self._check_size(mv, "copyout")
    if not self.is_allocated(): raise RuntimeError(f"Buffer.copyout: {self!r} has not been allocated")
    self.allocate()   # a view of an allocated base maps its part now
    self._allocator.copyout(view, self._buf)
    return mv

  def copy_from(self, src: Buffer) -> Buffer:
    """Copy the contents of `src` (same byte size, any device) into this buffer: device to device where the two
    allocators can (`Allocator.transfer`), else through host memory."""
    if src.nbytes != self.nbytes: raise ValueError(f"Buffer.copy_from: {src!r} and {self!r} differ in byte size")
    if not src.is_allocated(): raise RuntimeError(f"Buffer.copy_from: source {src!r} has not been allocated")
    src.allocate()   # a view of an allocated base maps its part now
    self.allocate()
    if self._allocator.transfer(self._buf, src._buf, src._allocator, self.nbytes): return self
    host_view = src._allocator.as_memoryview(src._buf)
    return self.copyin(host_view if host_view is not None else src.copyout(memoryview(bytearray(src.nbytes))))

  def as_bytes(self) -> bytes:
    """The buffer's contents as bytes."""
    return bytes(self.copyout(memoryview(bytearray(self.nbytes))))

  def numpy(self):
    """A numpy copy of shape (size,) in the matching numpy dtype (bfloat16 comes back as float32 values)."""
    import numpy as np
    out = np.empty(self.size, dtype=to_numpy_dtype(self.dtype))
    if self.nbytes: self.copyout(memoryview(out.view(np.uint8)))
    if self.dtype == dtypes.bfloat16: return (out.astype(np.uint32) << 16).view(np.float32)
    if self.dtype in dtypes.fp8s: return fp8_to_float32(out, self.dtype)
    return out

  def __del__(self):
    allocator = getattr(self, "_allocator", None)
    # a view frees nothing (the base owns the memory), nor does a buffer over the caller's memory
    if allocator is None or getattr(self, "_base", None) is not None or getattr(self, "_external", False): return
    try:
      GlobalCounters.mem_used -= self.nbytes
      allocator.free(self._buf, self.nbytes)
    except Exception: pass   # interpreter shutdown: modules may already be gone
    self._allocator = None

  def __repr__(self) -> str:
    return f"<Buffer {self.device} {self.size} x {self.dtype.name}{'' if self.is_allocated() else ' (unallocated)'}>"

# ---------------- compilers ----------------

class CompileError(RuntimeError):
  """A kernel's source did not compile; the message names the kernel and holds the compiler's output."""

# the cost of compiling a kernel, in source bytes: clang -O2 on this project's kernels takes about 0.1 s per run plus
# 2.8 us per byte of source (2-core EPYC: 5 KB 0.11 s, 1.26 MB 3.6 s)
_COMPILE_START_BYTES = 40_000

class Compiler:
  """Turns kernel source into a binary. Subclasses implement `compile`; `compile_cached` adds the on-disk cache."""
  disk_cache: bool = True   # False for compilers whose output is as cheap to remake as to read back
  runs_in_subprocess: bool = False   # True: several compiles may run at once from threads (kiln/engine/realize.py)

  def compile(self, src: str) -> bytes:
    """Compile `src` to bytes the device's runtime can load; raise CompileError on failure."""
    raise NotImplementedError(f"{type(self).__name__} does not implement compile")

  def cache_key(self) -> str:
    """Everything besides the source that changes the output (class name and flags)."""
    return type(self).__name__

  def snapshot(self) -> Compiler:
    """This compiler as the current settings configure it, safe to use from another thread while they change."""
    return self

  def cache_path(self, src: str) -> pathlib.Path:
    """Where the output of compiling `src` is cached on disk."""
    digest = hashlib.sha256(f"{self.cache_key()}\0{src}".encode()).hexdigest()
    return kernel_cache_dir() / "compile" / digest[:2] / digest

  def compile_group(self, sources: list[str]) -> list[bytes | Exception]:
    """`compile` for each source, an exception in the place of each that fails. A compiler that can build several
    kernels in one run overrides this (ClangCompiler: one compiler process for the group)."""
    out: list[bytes | Exception] = []
    for src in sources:
      try: out.append(self.compile(src))
      except Exception as e: out.append(e)   # noqa: BLE001  (reported in its place)
    return out

  def compile_cached_many(self, sources: list[str], workers: int = 1) -> list[bytes | Exception]:
    """`compile_cached` for each source, an exception in the place of each that fails: the sources missing from the
    disk cache compile in groups on up to `workers` threads (`CompilePipeline`)."""
    pipeline = CompilePipeline(self, len(sources), workers)
    for src in sources: pipeline.add(src)
    return pipeline.results()

  def _cached(self, src: str) -> bytes | None:
    try: return self.cache_path(src).read_bytes()
    except FileNotFoundError: return None

  def compile_cached(self, src: str) -> bytes:
    """`compile(src)`, read from / written to the on-disk cache when CACHELEVEL>=1 and not DISABLE_COMPILER_CACHE
    (safe with several processes)."""
    if not self.disk_cache or CACHELEVEL < 1 or DISABLE_COMPILER_CACHE: return self.compile(src)
    if (lib := self._cached(src)) is not None: return lib
    lib = self.compile(src)
    self._store(src, lib)
    return lib

  def _store(self, src: str, lib: bytes, same_as: pathlib.Path | None = None) -> pathlib.Path | None:
    """Write `lib` to the disk cache as the output of compiling `src`, as a hard link to the entry `same_as` (which
    holds the same bytes) where possible; the entry's path, or None if it could not be written (only reported)."""
    path = self.cache_path(src)
    try:
      path.parent.mkdir(parents=True, exist_ok=True)
      temporary = path.parent / f".{path.name}.{os.urandom(6).hex()}"
      try:
        if same_as is None: raise OSError("nothing to link to")
        os.link(same_as, temporary)
      except OSError:
        with open(temporary, "wb") as f: f.write(lib)
      os.replace(temporary, path)   # atomic: readers see either no file or the whole file
      return path
    except OSError as e:
      if DEBUG >= 1: print(f"compile cache: could not write {path}: {e}")
      return None

  def _store_all(self, built: list[tuple[str, bytes]]) -> None:
    """`_store` each (source, library); the kernels of one group library (the same bytes object) share one file."""
    written: dict[int, pathlib.Path | None] = {}
    for src, lib in built: written[id(lib)] = self._store(src, lib, same_as=written.get(id(lib)))

class CompilePipeline:
  """Compiles kernel sources while the caller is still producing them: `add` each source as soon as it is rendered;
  the sources missing from the disk cache are compiled in groups (`Compiler.compile_group`) on background threads,
  a group as soon as it is full (with two cores, the first kernels compile while Python renders the next ones);
  `results` compiles the rest, split over the threads, waits and stores the new binaries in the disk cache. A source
  added twice (two kernels that render alike) is compiled once.

  Only a compiler that `runs_in_subprocess` compiles in the background (the thread waits on the compiler process,
  leaving the interpreter to the caller); any other compiles everything in `results`, on the calling thread."""
  def __init__(self, compiler: Compiler, expected: int, workers: int):
    self.compiler, self.caching = compiler, compiler.disk_cache and CACHELEVEL >= 1 and not DISABLE_COMPILER_CACHE
    self.background = compiler.runs_in_subprocess and workers > 1
    self.workers = max(1, workers)
    # about two groups per thread: each compiler run costs a start (~40 ms), a smaller last group a shorter wait
    self.expected, self.group_size = expected, max(2, -(-expected // (2 * self.workers)))
    self.sources: list[str] = []
    self.first_added: dict[str, int] = {}   # source -> the index it was first added under
    self.out: list[bytes | Exception | None] = []
    self.pending: list[int] = []
    self.running: list[tuple[list[int], concurrent.futures.Future]] = []
    self.pool: concurrent.futures.ThreadPoolExecutor | None = None

  def add(self, src: str, name: str = "") -> int:
    """Queue `src` for compiling (`name`, the kernel's, is only informative); its index into `results()`."""
    index = len(self.sources)
    self.sources.append(src)
    if src in self.first_added:   # filled in from the first copy by `results`
      self.out.append(None)
      return index
    self.first_added[src] = index
    self.out.append(self.compiler._cached(src) if self.caching else None)
    if self.out[index] is None:
      if self.background and len(src) >= _COMPILE_START_BYTES:   # costs more than a compiler run's start: compiled
        self._start([index])                                     # at once, alone (else it makes the final wait)
        return index
      self.pending.append(index)
      # a full group starts now, unless the last kernels are near: they are split over all threads in `results`
      coming = self.expected - len(self.sources)
      if self.background and len(self.pending) >= self.group_size and coming >= self.group_size:
        self._start(self.pending)
        self.pending = []
    return index

  def _final_groups(self) -> list[list[int]]:
    """The pending kernels split into one group per thread not still busy with an earlier group (at least one),
    balanced by source length (the longest first into the cheapest group)."""
    free = max(1, self.workers - sum(not future.done() for _, future in self.running))
    groups: list[list[int]] = [[] for _ in range(min(free, len(self.pending)))]
    costs = [0] * len(groups)
    for i in sorted(self.pending, key=lambda i: -len(self.sources[i])):
      g = min(range(len(groups)), key=lambda g: costs[g])
      groups[g].append(i)
      costs[g] += _COMPILE_START_BYTES + len(self.sources[i])
    return groups

  def _start(self, group: list[int]) -> None:
    if not group: return
    if self.pool is None:
      self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="kiln_compile")
      self.builder = self.compiler.snapshot()   # the settings as they are now, whatever the caller changes meanwhile
    self.running.append((group, self.pool.submit(self.builder.compile_group, [self.sources[i] for i in group])))

  def results(self) -> list[bytes | Exception]:
    """The binary (or the compile error) of every source added, in order; stores the new ones in the disk cache."""
    if self.background:   # the last kernels, split over the threads (the caller has nothing else to do now)
      for group in self._final_groups(): self._start(group)
    elif self.pending: self.running.append((self.pending, _done(self.compiler.compile_group,
                                                                  [self.sources[i] for i in self.pending])))
    self.pending = []
    try:
      for group, future in self.running:
        try: libs = future.result()
        except Exception as e: libs = [e] * len(group)   # noqa: BLE001  (reported in each kernel's place)
        for i, lib in zip(group, libs): self.out[i] = lib
        if self.caching:
          self.compiler._store_all([(self.sources[i], lib) for i, lib in zip(group, libs) if isinstance(lib, bytes)])
    finally:
      self.running = []
      if self.pool is not None: self.pool.shutdown(wait=True)
      self.pool = None
    for index, src in enumerate(self.sources):
      if self.out[index] is None: self.out[index] = self.out[self.first_added[src]]
    return self.out   # type: ignore[return-value]

def _done(fn: Callable, *args) -> concurrent.futures.Future:
  """A future holding the result (or the exception) of `fn(*args)`, run now on this thread."""
  future: concurrent.futures.Future = concurrent.futures.Future()
  try: future.set_result(fn(*args))
  except Exception as e: future.set_exception(e)   # noqa: BLE001
  return future

# ---------------- the device ----------------

class Compiled:
  """One device: its name, memory allocator, renderer, compiler and runtime (`runtime(name, lib) -> program`).

  A program is called as `prg(*buffer_handles, vals=(ints...), wait=False)`; with `wait=True` it returns the
  elapsed seconds once the kernel has finished, else None.
  """
  def __init__(self, device: str, allocator: Allocator, renderer, compiler: Compiler,
               runtime: Callable[[str, bytes], Any]):
    self.device, self.allocator, self.renderer = device, allocator, renderer
    self.compiler, self.runtime = compiler, runtime

  def synchronize(self) -> None:
    """Wait until all work sent to the device has finished (host devices run synchronously)."""

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device}>"

# device name as written -> its canonical name (Device.canonicalize)
_canonical_names: dict[str, str] = {}

class _DeviceRegistry:
  """The devices by name: `Device["CPU"]` is the one `Compiled` for CPU. `Device.DEFAULT` is where tensors go."""
  def __init__(self):
    self._opened: dict[str, Compiled] = {}
    self._default = self.canonicalize(self._default_from_env())

  @staticmethod
  def _default_from_env() -> str:
    if os.environ.get("DEV"): return os.environ["DEV"]
    for name in ("CUDA", "PYTHON", "LLVM", "CPU"):
      if os.environ.get(name, "0") not in ("", "0"): return name
    return "CPU"

  @property
  def DEFAULT(self) -> str:
    """The default device name (from DEV=..., CUDA=1, CPU=1, LLVM=1 or PYTHON=1; else CPU). Assignable."""
    return self._default

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None:
    self._default = self.canonicalize(name)

  @staticmethod
  def known() -> list[str]:
    """Names of every device kiln has a runtime for."""
    runtime_dir = pathlib.Path(__file__).parent / "runtime"
    return sorted(p.stem[len("ops_"):].upper() for p in runtime_dir.glob("ops_*.py"))

  @staticmethod
  def canonicalize(device: str) -> str:
    """'cpu' -> 'CPU', 'cpu:0' -> 'CPU', 'cpu:1' -> 'CPU:1'."""
    if type(device) is str and (known := _canonical_names.get(device)) is not None: return known   # every Buffer asks
    if not isinstance(device, str) or not device:
      raise ValueError(f"a device name must be a non-empty string, got {device!r}")
    base, _, index = device.partition(":")
    base = base.upper()
    canonical = base if index in ("", "0") else f"{base}:{index}"
    if len(_canonical_names) < 1024: _canonical_names[device] = canonical
    return canonical

  def __getitem__(self, name: str) -> Compiled:
    # an opened device by the name it was opened as (canonical already): the common case, without canonicalizing
    if type(name) is str and (dev := self._opened.get(name)) is not None: return dev
    canonical = self.canonicalize(name)
    if (dev := self._opened.get(canonical)) is not None: return dev
    base = canonical.partition(":")[0]
    known = self.known()
    if base not in known: raise ValueError(f"unknown device {name!r}; known devices: {', '.join(known)}")
    if not ALLOW_DEVICE_USAGE and base not in ("DISK", "NPY", "PYTHON"):
      raise RuntimeError(f"opening device {canonical} is not allowed with ALLOW_DEVICE_USAGE=0")
    module = importlib.import_module(f"kiln.runtime.ops_{base.lower()}")
    classes = [v for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, Compiled)
               and k.lower() == f"{base.lower()}device"]
    if not classes: raise ValueError(f"kiln.runtime.ops_{base.lower()} defines no {base}Device class")
    dev = self._opened[canonical] = classes[0](canonical)
    if DEBUG >= 1: print(f"opened device {canonical}")
    return dev

  @property
  def default(self) -> Compiled:
    """The default device itself: `Device[Device.DEFAULT]`."""
    return self[self.DEFAULT]

  def get_available_devices(self) -> Iterator[str]:
    """The names of the devices that open on this machine (of those kiln has a runtime for), in `known()` order."""
    for name in self.known():
      try: yield self[name].device
      except Exception: continue   # noqa: BLE001  (a device without its driver or compiler here is not available)

  def __repr__(self) -> str: return f"<Device default={self.DEFAULT} opened={sorted(self._opened)}>"

Device = _DeviceRegistry()

# tinygrad's list of accelerator and CPU device names (kiln has runtimes for those in `Device.known()`)
ALL_DEVICES = ["METAL", "AMD", "NV", "CUDA", "QCOM", "GPU", "CPU", "LLVM", "DSP", "WEBGPU"]

def is_dtype_supported(dtype: DType, device: str | None = None) -> bool:
  """Whether tensors of `dtype` work on `device` (default: `Device.DEFAULT`). Every kiln device computes every dtype
  kiln has (bfloat16 and fp8 through float32 where the hardware lacks them), so this is False only for void and
  pointer dtypes; an unknown device name is a ValueError.

  >>> is_dtype_supported(dtypes.bfloat16), is_dtype_supported(dtypes.fp8e4m3, "PYTHON"), is_dtype_supported(dtypes.void)
  (True, True, False)
  """
  base = Device.canonicalize(device if device is not None else Device.DEFAULT).partition(":")[0]
  if base not in Device.known():
    raise ValueError(f"is_dtype_supported: unknown device {device!r}; known: {Device.known()}")
  return dtype in dtypes.all
