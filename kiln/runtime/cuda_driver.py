"""kiln's own small binding to the CUDA driver API (libcuda) and NVRTC (libnvrtc), through ctypes alone.

Nothing is loaded at import: the libraries are looked for the first time something asks for them, so kiln imports on a
machine without a GPU. There `available()` is False, `device_count()` is 0 and opening a context raises one
`CudaUnavailableError` (a RuntimeError) that says what was searched.

Where the libraries are looked for, in order (`driver_library_candidates`, `nvrtc_library_candidates`):
  1. the dynamic loader by soname (LD_LIBRARY_PATH, the ldconfig cache, the system folders), then
     `ctypes.util.find_library`;
  2. the folders `$CUDA_PATH` and `$CUDA_HOME` name (their lib64/ and lib/);
  3. NVRTC only: the `nvidia-cuda-nvrtc` wheel (`pip install 'kiln[cuda]'`), nvidia/*/lib/ on sys.path;
  4. the CUDA toolkit's usual install folder, /usr/local/cuda/lib64 (then /usr/local/cuda-*/lib64, newest first).

The object API, all of it explicit about lifetimes (call `free`/`close`, or use `with`):
  `Context(device)`          the device's primary context: properties, memory, copies, streams, events, modules
  `DeviceMemory`             a cuMemAlloc allocation (never managed memory); `CudaAllocator` keeps them behind kiln's
                             LRU allocator
  `PinnedMemory`             page-locked host memory (cuMemHostAlloc), for asynchronous copies
  `Stream`, `Event`          work queues and timestamps (`Event.elapsed_ms`)
  `Module`, `Function`       a loaded CUBIN and one of its kernels; `Function.launch(*args, grid, block, shared)`
  `NVRTCCompiler(arch)`      CUDA C -> CUBIN for the device's exact arch (sm_90a on Hopper), cached on disk under
                             kiln's kernel cache, keyed by source, arch, options and NVRTC version

A kernel's arguments are packed by `pack_args`: DeviceMemory -> its 64-bit address, int -> int32, float -> float32,
bool -> C++ bool, a numpy scalar or ctypes value -> its own type (pass `ctypes.c_int64(n)` for a 64-bit int).

>>> launch_dims(256), launch_dims((4, 2))
((256, 1, 1), (4, 2, 1))
>>> arch_for_capability(9, 0), arch_for_capability(8, 6)
('sm_90a', 'sm_86')
>>> format_cuda_error("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
'cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory'
"""
from __future__ import annotations
import ctypes, ctypes.util, functools, glob, importlib.util, math, os, platform, re, sys, threading, time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence
import numpy as np
from kiln.device import CompileError, Compiler, LRUAllocator
from kiln.helpers import ContextVar

# ---------------- finding the libraries ----------------

# sonames the loader is asked for, newest first; a bare "libnvrtc.so" exists only where the toolkit's dev files are
DRIVER_NAMES = {"Linux": ("libcuda.so.1", "libcuda.so"), "Windows": ("nvcuda.dll",)}
NVRTC_NAMES = {"Linux": ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"),
               "Windows": ("nvrtc64_130_0.dll", "nvrtc64_120_0.dll", "nvrtc64_112_0.dll")}
TOOLKIT_FOLDER = "/usr/local/cuda"   # where NVIDIA's installers put the toolkit (a link to /usr/local/cuda-X.Y)

@dataclass(frozen=True)
class LibraryCandidate:
  """One place a library may be loaded from: a soname for the loader or a file path, and which rule proposed it."""
  name: str
  source: str

def _files_matching(folder: str, pattern: str, glob_fn: Callable[[str], list[str]]) -> list[str]:
  """The files in `folder` matching `pattern`, the highest version first (libnvrtc.so.13 before libnvrtc.so.12)."""
  def version_key(path: str) -> tuple[int, ...]:
    return tuple(int(number) for number in re.findall(r"\d+", os.path.basename(path)))
  return sorted(glob_fn(os.path.join(folder, pattern)), key=version_key, reverse=True)

def _env_folders(environ: Mapping[str, str]) -> list[tuple[str, str]]:
  """(folder, rule) for the lib64/ and lib/ folders of $CUDA_PATH and $CUDA_HOME."""
  folders = []
  for variable in ("CUDA_PATH", "CUDA_HOME"):
    if root := environ.get(variable):
      folders += [(os.path.join(root, sub), f"${variable}") for sub in ("lib64", "lib", os.path.join("lib", "x64"))]
  return folders

def _library_candidates(names: Sequence[str], find_name: str, file_pattern: str,
                        extra_folders: Sequence[tuple[str, str]], glob_fn: Callable[[str], list[str]],
                        find_library: Callable[[str], str | None]) -> list[LibraryCandidate]:
  """The search order shared by the driver and NVRTC: loader sonames, find_library, the extra folders in order."""
  candidates = [LibraryCandidate(name, "loader") for name in names]
  if (found := find_library(find_name)) and found not in names: candidates.append(LibraryCandidate(found, "ldconfig"))
  for folder, rule in extra_folders:
    candidates += [LibraryCandidate(path, rule) for path in _files_matching(folder, file_pattern, glob_fn)]
  seen: set[str] = set()
  return [c for c in candidates if not (c.name in seen or seen.add(c.name))]

def _toolkit_folders(glob_fn: Callable[[str], list[str]]) -> list[tuple[str, str]]:
  """/usr/local/cuda/lib64, then /usr/local/cuda-X.Y/lib64, newest first."""
  versioned = _files_matching(os.path.dirname(TOOLKIT_FOLDER), "cuda-*", glob_fn)
  return [(os.path.join(folder, "lib64"), "toolkit folder") for folder in [TOOLKIT_FOLDER, *versioned]]

def driver_library_candidates(environ: Mapping[str, str] = os.environ, system: str | None = None,
                              glob_fn: Callable[[str], list[str]] = glob.glob,
                              find_library: Callable[[str], str | None] = ctypes.util.find_library
                              ) -> list[LibraryCandidate]:
  """Where libcuda is looked for, in order (the module docstring gives the rules; NVRTC's wheel is not one).

  >>> [c.name for c in driver_library_candidates({}, "Linux", glob_fn=lambda p: [], find_library=lambda n: None)]
  ['libcuda.so.1', 'libcuda.so']
  """
  system = system or platform.system()
  pattern = "nvcuda.dll" if system == "Windows" else "libcuda.so*"
  folders = _env_folders(environ) + _toolkit_folders(glob_fn)
  return _library_candidates(DRIVER_NAMES.get(system, ()), "cuda", pattern, folders, glob_fn, find_library)

def nvrtc_wheel_folders(path: Sequence[str] | None = None) -> list[tuple[str, str]]:
  """The lib/ folders of installed nvidia-* wheels (nvidia/cu13/lib for CUDA 13, nvidia/cuda_nvrtc/lib for 12)."""
  if path is None:
    spec = importlib.util.find_spec("nvidia") if "nvidia" not in sys.modules else sys.modules["nvidia"].__spec__
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
  else: roots = [os.path.join(p, "nvidia") for p in path]
  return [(folder, "nvidia-cuda-nvrtc wheel") for root in roots for folder in
          sorted(glob.glob(os.path.join(root, "*", "lib")), reverse=True)]

def nvrtc_library_candidates(environ: Mapping[str, str] = os.environ, system: str | None = None,
                             glob_fn: Callable[[str], list[str]] = glob.glob,
                             find_library: Callable[[str], str | None] = ctypes.util.find_library,
                             wheel_folders: Sequence[tuple[str, str]] | None = None) -> list[LibraryCandidate]:
  """Where libnvrtc is looked for, in order: loader, ldconfig, $CUDA_PATH/$CUDA_HOME, the wheel, the toolkit folder.

  >>> [c.name for c in nvrtc_library_candidates({}, "Linux", glob_fn=lambda p: [], find_library=lambda n: None,
  ...                                           wheel_folders=[])][:2]
  ['libnvrtc.so.13', 'libnvrtc.so.12']
  """
  system = system or platform.system()
  pattern = "nvrtc64_*.dll" if system == "Windows" else "libnvrtc.so*"
  wheels = nvrtc_wheel_folders() if wheel_folders is None else list(wheel_folders)
  folders = _env_folders(environ) + wheels + _toolkit_folders(glob_fn)
  candidates = _library_candidates(NVRTC_NAMES.get(system, ()), "nvrtc", pattern, folders, glob_fn, find_library)
  return [c for c in candidates if "builtins" not in os.path.basename(c.name)]   # libnvrtc-builtins is NVRTC's own

class CudaUnavailableError(RuntimeError):
  """CUDA cannot be used on this machine: a library is missing, or the driver found no usable GPU."""

def load_first(what: str, candidates: Sequence[LibraryCandidate],
               loader: Callable[[str], Any] = ctypes.CDLL) -> tuple[Any, LibraryCandidate]:
  """The first candidate the loader opens, and which one it was; CudaUnavailableError listing every try if none."""
  tried = []
  for candidate in candidates:
    try: return loader(candidate.name), candidate
    except OSError as error: tried.append(f"{candidate.name} ({candidate.source}: {str(error).split(':')[-1].strip()})")
  hint = {"libcuda": "install the NVIDIA driver, or put libcuda.so.1 on LD_LIBRARY_PATH",
          "libnvrtc": "install the CUDA toolkit, pip install 'kiln[cuda]', or set CUDA_PATH"}[what]
  raise CudaUnavailableError(f"CUDA is not available: {what} was not found ({hint}); tried: "
                             f"{'; '.join(tried) or 'nothing (no candidate for this system)'}")

# ---------------- errors ----------------

def format_cuda_error(call: str, code: int, name: str, description: str) -> str:
  """The message of a failed driver call: which call, the error's name and number, and the driver's description."""
  return f"{call} failed: {name} ({code}): {description}"

class CudaError(RuntimeError):
  """A driver call returned an error: `call`, `code` (the CUresult) and `name` (e.g. CUDA_ERROR_INVALID_VALUE)."""
  def __init__(self, call: str, code: int, name: str, description: str):
    super().__init__(format_cuda_error(call, code, name, description))
    self.call, self.code, self.name = call, code, name

class CudaOutOfMemoryError(CudaError, MemoryError):
  """cuMemAlloc/cuMemHostAlloc ran out of memory (a MemoryError too, so LRUAllocator frees its cache and retries)."""

CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 2, 100, 712
CUDA_ERROR_NOT_READY = 600   # cuStreamQuery/cuEventQuery: the work is still running
NVRTC_ERROR_COMPILATION = 6

class CudaTimeoutError(RuntimeError):
  """Work queued on a GPU did not finish within CUDA_TIMEOUT seconds (a hung kernel, most likely): `kernel` is the
  kernel last launched in the context, `waited` the seconds waited. The kernel still runs; nothing was freed."""
  def __init__(self, message: str, kernel: str, waited: float):
    super().__init__(message)
    self.kernel, self.waited = kernel, waited

class NVRTCCompileError(CompileError):
  """NVRTC rejected a source; `log` holds NVRTC's program log (the compiler's messages)."""
  def __init__(self, message: str, log: str):
    super().__init__(message)
    self.log = log

# ---------------- the driver's functions ----------------

P, c_int, c_uint, c_size_t, c_u64, c_void_p = ctypes.POINTER, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, \
  ctypes.c_uint64, ctypes.c_void_p
# the names libcuda exports (a _v2 suffix where the header maps the plain name to it), and each one's arguments
DRIVER_PROTOTYPES: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
  "cuInit": (("cuInit",), (c_uint,)),
  "cuDriverGetVersion": (("cuDriverGetVersion",), (P(c_int),)),
  "cuGetErrorName": (("cuGetErrorName",), (c_int, P(ctypes.c_char_p))),
  "cuGetErrorString": (("cuGetErrorString",), (c_int, P(ctypes.c_char_p))),
  "cuDeviceGetCount": (("cuDeviceGetCount",), (P(c_int),)),
  "cuDeviceGet": (("cuDeviceGet",), (P(c_int), c_int)),
  "cuDeviceGetName": (("cuDeviceGetName",), (ctypes.c_char_p, c_int, c_int)),
  "cuDeviceGetAttribute": (("cuDeviceGetAttribute",), (P(c_int), c_int, c_int)),
  "cuDeviceTotalMem": (("cuDeviceTotalMem_v2",), (P(c_size_t), c_int)),
  "cuDeviceCanAccessPeer": (("cuDeviceCanAccessPeer",), (P(c_int), c_int, c_int)),
  "cuDevicePrimaryCtxRetain": (("cuDevicePrimaryCtxRetain",), (P(c_void_p), c_int)),
  "cuDevicePrimaryCtxRelease": (("cuDevicePrimaryCtxRelease_v2",), (c_int,)),
  "cuCtxSetCurrent": (("cuCtxSetCurrent",), (c_void_p,)),
  "cuCtxSynchronize": (("cuCtxSynchronize",), ()),
  "cuCtxEnablePeerAccess": (("cuCtxEnablePeerAccess",), (c_void_p, c_uint)),
  "cuMemGetInfo": (("cuMemGetInfo_v2",), (P(c_size_t), P(c_size_t))),
  "cuMemAlloc": (("cuMemAlloc_v2",), (P(c_u64), c_size_t)),
  "cuMemFree": (("cuMemFree_v2",), (c_u64,)),
  "cuMemsetD8": (("cuMemsetD8_v2",), (c_u64, ctypes.c_ubyte, c_size_t)),
  "cuMemHostAlloc": (("cuMemHostAlloc",), (P(c_void_p), c_size_t, c_uint)),
  "cuMemFreeHost": (("cuMemFreeHost",), (c_void_p,)),
  "cuMemHostRegister": (("cuMemHostRegister_v2", "cuMemHostRegister"), (c_void_p, c_size_t, c_uint)),
  "cuMemHostUnregister": (("cuMemHostUnregister",), (c_void_p,)),
  "cuMemHostGetDevicePointer": (("cuMemHostGetDevicePointer_v2",), (P(c_u64), c_void_p, c_uint)),
  "cuMemcpyHtoD": (("cuMemcpyHtoD_v2",), (c_u64, c_void_p, c_size_t)),
  "cuMemcpyDtoH": (("cuMemcpyDtoH_v2",), (c_void_p, c_u64, c_size_t)),
  "cuMemcpyDtoD": (("cuMemcpyDtoD_v2",), (c_u64, c_u64, c_size_t)),
  "cuMemcpyHtoDAsync": (("cuMemcpyHtoDAsync_v2",), (c_u64, c_void_p, c_size_t, c_void_p)),
  "cuMemcpyDtoHAsync": (("cuMemcpyDtoHAsync_v2",), (c_void_p, c_u64, c_size_t, c_void_p)),
  "cuMemcpyDtoDAsync": (("cuMemcpyDtoDAsync_v2",), (c_u64, c_u64, c_size_t, c_void_p)),
  "cuMemcpyPeerAsync": (("cuMemcpyPeerAsync",), (c_u64, c_void_p, c_u64, c_void_p, c_size_t, c_void_p)),
  "cuStreamCreate": (("cuStreamCreate",), (P(c_void_p), c_uint)),
  "cuStreamDestroy": (("cuStreamDestroy_v2",), (c_void_p,)),
  "cuStreamSynchronize": (("cuStreamSynchronize",), (c_void_p,)),
  "cuStreamQuery": (("cuStreamQuery",), (c_void_p,)),
  "cuStreamWaitEvent": (("cuStreamWaitEvent",), (c_void_p, c_void_p, c_uint)),
  "cuEventCreate": (("cuEventCreate",), (P(c_void_p), c_uint)),
  "cuEventDestroy": (("cuEventDestroy_v2",), (c_void_p,)),
  "cuEventRecord": (("cuEventRecord",), (c_void_p, c_void_p)),
  "cuEventSynchronize": (("cuEventSynchronize",), (c_void_p,)),
  "cuEventQuery": (("cuEventQuery",), (c_void_p,)),
  "cuEventElapsedTime": (("cuEventElapsedTime_v2", "cuEventElapsedTime"), (P(ctypes.c_float), c_void_p, c_void_p)),
  "cuModuleLoadData": (("cuModuleLoadData",), (P(c_void_p), c_void_p)),
  "cuModuleUnload": (("cuModuleUnload",), (c_void_p,)),
  "cuModuleGetFunction": (("cuModuleGetFunction",), (P(c_void_p), c_void_p, ctypes.c_char_p)),
  "cuFuncSetAttribute": (("cuFuncSetAttribute",), (c_void_p, c_int, c_int)),
  "cuFuncGetAttribute": (("cuFuncGetAttribute",), (P(c_int), c_int, c_void_p)),
  "cuLaunchKernel": (("cuLaunchKernel",), (c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p,
                                            P(c_void_p), P(c_void_p))),
  "cuTensorMapEncodeTiled": (("cuTensorMapEncodeTiled",), (c_void_p, c_int, c_uint, c_void_p, P(c_u64), P(c_u64),
                                                              P(c_uint), P(c_uint), c_int, c_int, c_int, c_int)),
  "cuGraphCreate": (("cuGraphCreate",), (P(c_void_p), c_uint)),
  "cuGraphAddKernelNode": (("cuGraphAddKernelNode_v2",), (P(c_void_p), c_void_p, P(c_void_p), c_size_t, c_void_p)),
  "cuGraphAddDependencies": (("cuGraphAddDependencies_v2",), (c_void_p, P(c_void_p), P(c_void_p), c_void_p,
                                                                c_size_t)),
  "cuGraphInstantiate": (("cuGraphInstantiateWithFlags",), (P(c_void_p), c_void_p, ctypes.c_ulonglong)),
  "cuGraphExecKernelNodeSetParams": (("cuGraphExecKernelNodeSetParams_v2",), (c_void_p, c_void_p, c_void_p)),
  "cuGraphLaunch": (("cuGraphLaunch",), (c_void_p, c_void_p)),
  "cuGraphExecDestroy": (("cuGraphExecDestroy",), (c_void_p,)),
  "cuGraphDestroy": (("cuGraphDestroy",), (c_void_p,)),
}
NVRTC_PROTOTYPES: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
  "nvrtcVersion": (("nvrtcVersion",), (P(c_int), P(c_int))),
  "nvrtcCreateProgram": (("nvrtcCreateProgram",), (P(c_void_p), ctypes.c_char_p, ctypes.c_char_p, c_int, c_void_p,
                                                   c_void_p)),
  "nvrtcCompileProgram": (("nvrtcCompileProgram",), (c_void_p, c_int, P(ctypes.c_char_p))),
  "nvrtcGetProgramLogSize": (("nvrtcGetProgramLogSize",), (c_void_p, P(c_size_t))),
  "nvrtcGetProgramLog": (("nvrtcGetProgramLog",), (c_void_p, ctypes.c_char_p)),
  "nvrtcGetCUBINSize": (("nvrtcGetCUBINSize",), (c_void_p, P(c_size_t))),
  "nvrtcGetCUBIN": (("nvrtcGetCUBIN",), (c_void_p, ctypes.c_char_p)),
  "nvrtcDestroyProgram": (("nvrtcDestroyProgram",), (P(c_void_p),)),
}

# device attributes (CUdevice_attribute) and function attributes (CUfunction_attribute) this module reads or sets
ATTRIBUTE_SM_COUNT, ATTRIBUTE_CC_MAJOR, ATTRIBUTE_CC_MINOR, ATTRIBUTE_SHARED_OPTIN = 16, 75, 76, 97
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED = 8
STATIC_SHARED_LIMIT = 48 * 1024   # a launch may use more dynamic shared memory only after cuFuncSetAttribute
CU_STREAM_NON_BLOCKING, CU_EVENT_DISABLE_TIMING, CU_MEMHOSTALLOC_PORTABLE = 1, 2, 1
# cuMemHostRegister flags: pinned for every context (PORTABLE), mapped into the GPUs' address space (DEVICEMAP)
CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP = 1, 2

class _Library:
  """A loaded library whose functions are called through `call(name, *args)`, each return code checked."""
  def __init__(self, handle: Any, where: LibraryCandidate, prototypes: dict, describe: Callable[[str, int], Exception]):
    self.handle, self.where, self.describe = handle, where, describe
    self.functions: dict[str, Any] = {}
    for name, (symbols, argtypes) in prototypes.items():
      function = next((getattr(handle, s) for s in symbols if hasattr(handle, s)), None)
      if function is None: continue   # an old driver without it: the call that needs it says so
      function.argtypes, function.restype = argtypes, ctypes.c_int
      self.functions[name] = function

  def call(self, name: str, *args: Any) -> None:
    """Call `name` with `args`; its error code, if any, becomes the exception `describe` makes."""
    function = self.functions.get(name)
    if function is None: raise CudaError(name, -1, "MISSING_SYMBOL", f"{self.where.name} does not export it")
    if (code := function(*args)) != 0: raise self.describe(name, code)

  def raw(self, name: str) -> Any:
    """`name` as a function without argument types, for the hot paths: ctypes converts nothing, so every argument
    must already be a ctypes value or a small int (an int becomes a C int). It returns the error code: check it."""
    if name not in self.functions: raise CudaError(name, -1, "MISSING_SYMBOL", f"{self.where.name} does not export it")
    function = self.handle[self.functions[name].__name__]   # a second function object: its own (empty) argtypes
    function.restype = ctypes.c_int
    return function

def _driver_error(call: str, code: int) -> CudaError:
  """The CudaError for `code`, named and described by the driver itself (cuGetErrorName/String)."""
  name, description = ctypes.c_char_p(), ctypes.c_char_p()
  lib = _driver_library()
  lib.functions["cuGetErrorName"](code, ctypes.byref(name))
  lib.functions["cuGetErrorString"](code, ctypes.byref(description))
  text = (name.value or b"CUDA_ERROR_UNKNOWN").decode(), (description.value or b"no description").decode()
  return (CudaOutOfMemoryError if code == CUDA_ERROR_OUT_OF_MEMORY else CudaError)(call, code, *text)

@functools.cache
def _driver_library() -> _Library:
  """libcuda, loaded and bound once (cuInit not yet called)."""
  handle, where = load_first("libcuda", driver_library_candidates())
  return _Library(handle, where, DRIVER_PROTOTYPES, _driver_error)

@functools.cache
def driver() -> _Library:
  """The initialized driver; CudaUnavailableError where libcuda is missing or cuInit fails (no GPU, driver too old)."""
  lib = _driver_library()
  try: lib.call("cuInit", 0)
  except CudaError as error:
    raise CudaUnavailableError(f"CUDA is not available: {error} (libcuda from {lib.where.name})") from None
  return lib

def _nvrtc_error(call: str, code: int) -> RuntimeError:
  """A RuntimeError naming the NVRTC call and NVRTC's own description of `code`."""
  get_string = nvrtc().handle.nvrtcGetErrorString
  get_string.argtypes, get_string.restype = (c_int,), ctypes.c_char_p
  return RuntimeError(f"{call} failed: {get_string(code).decode()} ({code})")

@functools.cache
def nvrtc() -> _Library:
  """libnvrtc, loaded and bound once; CudaUnavailableError where it is not found."""
  handle, where = load_first("libnvrtc", nvrtc_library_candidates())
  return _Library(handle, where, NVRTC_PROTOTYPES, _nvrtc_error)

def unavailable_reason() -> str | None:
  """Why CUDA cannot be used here (missing library, no GPU), or None where a GPU is usable."""
  try: driver()
  except CudaUnavailableError as error: return str(error)
  return None

def available() -> bool:
  """Whether a CUDA GPU is usable here (libcuda loads and cuInit succeeds)."""
  return unavailable_reason() is None

def device_count() -> int:
  """The number of CUDA GPUs; 0 where CUDA is not available."""
  if not available(): return 0
  count = c_int()
  driver().call("cuDeviceGetCount", ctypes.byref(count))
  return count.value

def driver_version() -> tuple[int, int]:
  """The CUDA version the driver supports, as (major, minor): (13, 0) for driver 580."""
  version = c_int()
  driver().call("cuDriverGetVersion", ctypes.byref(version))
  return version.value // 1000, version.value % 1000 // 10

def nvrtc_version() -> tuple[int, int]:
  """NVRTC's version, as (major, minor)."""
  major, minor = c_int(), c_int()
  nvrtc().call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value

def arch_for_capability(major: int, minor: int) -> str:
  """The NVRTC arch for a compute capability: the arch-specific `a` target from Hopper (9.0) on, for wgmma/TMA."""
  return f"sm_{major}{minor}{'a' if major >= 9 else ''}"

# ---------------- the watchdog ----------------

CUDA_TIMEOUT = ContextVar("CUDA_TIMEOUT", 60.0, "seconds kiln waits for work queued on a CUDA GPU (a synchronize, a "
                          "copy to or from the host, an event) before it raises a RuntimeError naming the kernel last "
                          "launched (a hung kernel: a wrong mbarrier phase, a spin on memory nothing writes); 0: wait "
                          "forever")
# a wait polls without pausing for its first SPIN_SECONDS (a short kernel's end is seen at once), then sleeps between
# polls, each pause twice the one before up to MAX_PAUSE_SECONDS
SPIN_SECONDS, FIRST_PAUSE_SECONDS, MAX_PAUSE_SECONDS = 2e-3, 20e-6, 2e-4

def watchdog_message(kernel: str, waited: float, what: str) -> str:
  """The CudaTimeoutError's text: what was waited for, for how long, the kernel in flight, and what to do.

  >>> watchdog_message("r_64_4096", 2.0, "a synchronize")[:77]
  'CUDA: the work queued on the GPU did not finish within 2 s (waiting for a syn'
  """
  return (f"CUDA: the work queued on the GPU did not finish within {waited:g} s (waiting for {what}); the kernel last "
          f"launched is {kernel}. A kernel that never ends (a wrong mbarrier phase, a spin on memory nothing writes, "
          "an endless loop) keeps the GPU until it ends or this process exits: fix the kernel, or, if it is only "
          "slow, raise CUDA_TIMEOUT (seconds; 0 waits forever). Nothing was freed: data already copied to the host "
          "is intact, and the context works again once the kernel ends")

def wait_for_gpu(query: Callable[[], int], call: str, context: Context | None, what: str,
                 timeout: float | None = None) -> None:
  """Wait until `query` (a cuStreamQuery or cuEventQuery of the work waited for, returning its CUresult) reports the
  work done, polling against a deadline of `timeout` seconds (None: CUDA_TIMEOUT; 0 or less: none). A CudaError
  for a failed query (a kernel that faulted), a CudaTimeoutError naming `context`'s last launched kernel when the
  deadline passes. The work itself is left alone: a hung kernel cannot be stopped without resetting the GPU."""
  if (code := query()) == 0: return
  limit = float(CUDA_TIMEOUT.value) if timeout is None else timeout
  start = time.perf_counter()
  deadline, pause = start + limit if limit > 0 else math.inf, FIRST_PAUSE_SECONDS
  while code != 0:
    if code != CUDA_ERROR_NOT_READY: raise _driver_error(call, code)
    now = time.perf_counter()
    if now >= deadline:
      kernel = getattr(context, "last_launch", None) or "unknown (none launched through kiln)"
      raise CudaTimeoutError(watchdog_message(kernel, limit, what), kernel, now - start)
    if now - start > SPIN_SECONDS:
      time.sleep(pause)
      pause = min(2 * pause, MAX_PAUSE_SECONDS)
    code = query()

def _stream_query(stream: int) -> Callable[[], int]:
  """cuStreamQuery of `stream` (0: the default stream) as a function returning its CUresult."""
  function = driver().functions["cuStreamQuery"]
  return lambda: function(stream)

# ---------------- launches ----------------

def launch_dims(value: int | Sequence[int], what: str = "grid") -> tuple[int, int, int]:
  """A grid or block size as (x, y, z), missing dimensions 1; ValueError for anything but 1 to 3 positive ints."""
  dims = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else (value,)
  if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
    raise ValueError(f"launch: {what} must be 1 to 3 positive ints, got {value!r}")
  return (*dims, *(1,) * (3 - len(dims)))   # type: ignore[return-value]

NUMPY_TO_CTYPES = {np.dtype(np.int8): ctypes.c_int8, np.dtype(np.uint8): ctypes.c_uint8,
                   np.dtype(np.int16): ctypes.c_int16, np.dtype(np.uint16): ctypes.c_uint16,
                   np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
                   np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
                   np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
                   np.dtype(np.bool_): ctypes.c_bool}

def _kernel_argument(index: int, value: Any) -> Any:
  """One kernel argument as the ctypes value whose bytes the kernel reads."""
  if isinstance(value, DeviceMemory): return ctypes.c_uint64(value.ptr)
  if isinstance(value, ctypes._SimpleCData): return value
  if isinstance(value, TensorMap): return value.struct   # 128 bytes by value (`const __grid_constant__ CUtensorMap`)
  if isinstance(value, ctypes.Structure): return value
  if isinstance(value, np.generic):
    if value.dtype not in NUMPY_TO_CTYPES: raise TypeError(f"launch: argument {index} has dtype {value.dtype}, which "
                                                          "has no C type here; pass a ctypes value")
    return NUMPY_TO_CTYPES[value.dtype](value.item())
  if isinstance(value, bool): return ctypes.c_bool(value)
  if isinstance(value, int):
    if not -2**31 <= value < 2**31:
      raise OverflowError(f"launch: argument {index} ({value}) does not fit an int32; pass ctypes.c_int64({value})")
    return ctypes.c_int32(value)
  if isinstance(value, float): return ctypes.c_float(value)
  raise TypeError(f"launch: argument {index} is a {type(value).__name__}; kernels take DeviceMemory, int, float, bool, "
                  "numpy scalars, ctypes values or TensorMaps")

def pack_args(args: Sequence[Any]) -> tuple[Any, tuple[Any, ...]]:
  """cuLaunchKernel's kernelParams for `args`: an array of pointers to each argument's value, and the values (keep
  them alive until the launch returns).

  >>> params, values = pack_args([7, 2.5])
  >>> ctypes.cast(params[0], ctypes.POINTER(ctypes.c_int32)).contents.value, values[1].value
  (7, 2.5)
  """
  values = tuple(_kernel_argument(i, value) for i, value in enumerate(args))
  params = (c_void_p * max(1, len(values)))(*[ctypes.addressof(value) for value in values])
  return params, values

# ---------------- tensor maps (TMA descriptors) ----------------

# CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill
TENSOR_MAP_DTYPES = {"uint8": 0, "uint16": 1, "uint32": 2, "int32": 3, "uint64": 4, "int64": 5, "float16": 6,
                     "float32": 7, "float64": 8, "bfloat16": 9, "float32_ftz": 10, "tfloat32": 11, "tfloat32_ftz": 12}
# kiln's dtype names -> the tensor map's data type (the copy engine moves bits: fp8 and ints as unsigned of their size)
TENSOR_MAP_OF_DTYPE = {"half": "float16", "bfloat16": "bfloat16", "float": "float32", "double": "float64",
                       "int": "int32", "long": "int64"}
TENSOR_MAP_ITEMSIZE = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4, 12: 4}
INTERLEAVE_NONE, INTERLEAVE_16B, INTERLEAVE_32B = 0, 1, 2
SWIZZLE_NONE, SWIZZLE_32B, SWIZZLE_64B, SWIZZLE_128B = 0, 1, 2, 3
SWIZZLE_BYTES = {SWIZZLE_NONE: 0, SWIZZLE_32B: 32, SWIZZLE_64B: 64, SWIZZLE_128B: 128}
L2_PROMOTION_NONE, L2_PROMOTION_64B, L2_PROMOTION_128B, L2_PROMOTION_256B = 0, 1, 2, 3
OOB_FILL_NONE, OOB_FILL_NAN_REQUEST_ZERO_FMA = 0, 1

class TensorMapBytes(ctypes.Structure):
  """CUtensorMap: 128 opaque bytes the driver fills (cuTensorMapEncodeTiled) and a kernel takes by value."""
  _fields_ = [("opaque", c_u64 * 16)]

def check_tensor_map(dtype: int, address: int, dims: Sequence[int], strides: Sequence[int], box: Sequence[int],
                     element_strides: Sequence[int], interleave: int, swizzle: int) -> None:
  """ValueError naming the rule a tiled tensor map's arguments break (the driver only says CUDA_ERROR_INVALID_VALUE):
  rank 1 to 5 (3 or more with interleave), a 16-byte aligned address (32 with 32-byte interleave), dims of 1 to
  2^32, byte strides multiples of 16 (32 with 32-byte interleave) below 2^40, box sizes of 1 to 256, element strides
  of 1 to 8, without interleave a box row a multiple of 16 bytes, and with a swizzle a box row of at most the span.

  >>> check_tensor_map(6, 0, (64, 64), (128,), (64, 64), (1, 1), INTERLEAVE_NONE, SWIZZLE_128B)
  >>> check_tensor_map(6, 0, (128, 64), (256,), (128, 64), (1, 1), INTERLEAVE_NONE, SWIZZLE_128B)
  Traceback (most recent call last):
  ...
  ValueError: TensorMap: a box row is 256 bytes; with a 128-byte swizzle it must be at most 128
  """
  rank, itemsize = len(dims), TENSOR_MAP_ITEMSIZE.get(dtype)
  if itemsize is None: raise ValueError(f"TensorMap: unknown data type {dtype} (TENSOR_MAP_DTYPES)")
  if not 1 <= rank <= 5 or (interleave != INTERLEAVE_NONE and rank < 3):
    raise ValueError(f"TensorMap: rank {rank}; 1 to 5 dimensions (3 or more with interleave)")
  if len(strides) != rank - 1 or len(box) != rank or len(element_strides) != rank:
    raise ValueError(f"TensorMap: {rank} dims need {rank - 1} strides, {rank} box sizes and {rank} element strides")
  align = 32 if interleave == INTERLEAVE_32B else 16
  if address % align: raise ValueError(f"TensorMap: the global address 0x{address:x} is not {align}-byte aligned")
  if any(not 1 <= d <= 1 << 32 for d in dims): raise ValueError(f"TensorMap: dims {tuple(dims)} must be 1 to 2^32")
  if any(st % align or not 0 < st < 1 << 40 for st in strides):
    raise ValueError(f"TensorMap: byte strides {tuple(strides)} must be multiples of {align} below 2^40")
  if any(not 1 <= b <= 256 for b in box): raise ValueError(f"TensorMap: box {tuple(box)} sizes must be 1 to 256")
  if any(not 1 <= e <= 8 for e in element_strides):
    raise ValueError(f"TensorMap: element strides {tuple(element_strides)} must be 1 to 8")
  row = box[0] * itemsize
  if interleave == INTERLEAVE_NONE and row % 16:
    raise ValueError(f"TensorMap: a box row is {row} bytes; without interleave it must be a multiple of 16")
  span = SWIZZLE_BYTES.get(swizzle)
  if span is None: raise ValueError(f"TensorMap: unknown swizzle {swizzle}")
  if span and interleave == INTERLEAVE_NONE and row > span:
    raise ValueError(f"TensorMap: a box row is {row} bytes; with a {span}-byte swizzle it must be at most {span}")

class TensorMap:
  """A tiled TMA descriptor (cuTensorMapEncodeTiled) of a tensor in GPU memory: a kernel takes it by value as
  `const __grid_constant__ CUtensorMap` (pass the TensorMap as the launch argument: its 128 bytes are the
  parameter) and copies boxes of it to shared memory with `cp.async.bulk.tensor`. Sizes are innermost first, as
  the driver takes them: `dims[0]` the contiguous dimension, `strides[i]` the bytes between consecutive indices of
  dimension i+1, `box` the tile one copy moves (in elements). The 128 bytes are 64-byte aligned, as the driver
  requires. `dtype` is a CUtensorMapDataType (TENSOR_MAP_DTYPES names them)."""
  NBYTES, ALIGN = 128, 64

  def __init__(self, memory: DeviceMemory | int, dtype: int | str, dims: Sequence[int], strides: Sequence[int],
               box: Sequence[int], element_strides: Sequence[int] | None = None, interleave: int = INTERLEAVE_NONE,
               swizzle: int = SWIZZLE_128B, l2_promotion: int = L2_PROMOTION_128B, oob_fill: int = OOB_FILL_NONE):
    code = TENSOR_MAP_DTYPES[dtype] if isinstance(dtype, str) else dtype
    address = memory.ptr if isinstance(memory, DeviceMemory) else int(memory)
    element_strides = tuple(element_strides) if element_strides is not None else (1,) * len(dims)
    check_tensor_map(code, address, dims, strides, box, element_strides, interleave, swizzle)
    self.dtype, self.dims, self.strides, self.box = code, tuple(dims), tuple(strides), tuple(box)
    self.swizzle, self.memory = swizzle, memory   # (the memory is kept alive with the map)
    self._storage = (ctypes.c_ubyte * (self.NBYTES + self.ALIGN))()
    offset = -ctypes.addressof(self._storage) % self.ALIGN
    self.struct = TensorMapBytes.from_buffer(self._storage, offset)
    rank = len(dims)
    driver().call("cuTensorMapEncodeTiled", ctypes.addressof(self.struct), code, rank, address,
                  (c_u64 * rank)(*dims), (c_u64 * max(1, rank - 1))(*strides), (c_uint * rank)(*box),
                  (c_uint * rank)(*element_strides), interleave, swizzle, l2_promotion, oob_fill)

  @classmethod
  def for_description(cls, memory: DeviceMemory | int, description: Any) -> TensorMap:
    """The descriptor of a `gpu_target.TensorMap` (the IR's description of a DEFINE_TENSORMAP parameter: a
    row-major `rows` x `cols` matrix of `dtype`, rows `stride` elements apart, copied in `box` = (box_rows,
    box_cols) boxes with a `swizzle` of 0, 32, 64 or 128 bytes, out-of-bounds elements as zeros) over `memory`."""
    dtype = description.dtype
    code = TENSOR_MAP_OF_DTYPE.get(dtype.name) or {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}[dtype.itemsize]
    swizzle = {0: SWIZZLE_NONE, 32: SWIZZLE_32B, 64: SWIZZLE_64B, 128: SWIZZLE_128B}[description.swizzle]
    box_rows, box_cols = description.box
    return cls(memory, code, (description.cols, description.rows), (description.stride * dtype.itemsize,),
               (box_cols, box_rows), swizzle=swizzle)

  @property
  def address(self) -> int:
    """Where the 128 bytes are (64-byte aligned)."""
    return ctypes.addressof(self.struct)

  def __bytes__(self) -> bytes: return ctypes.string_at(self.address, self.NBYTES)
  def __repr__(self) -> str: return f"<TensorMap dims {self.dims} box {self.box} swizzle {self.swizzle}>"

# ---------------- the object API ----------------

def _host_address(buffer: Any, writable: bool = False) -> tuple[int, int, Any]:
  """(address, byte count, object to keep alive) of a contiguous host buffer (bytes, bytearray, numpy, memoryview,
  PinnedMemory); ValueError for a non-contiguous one, or a read-only one where the copy writes into it."""
  if isinstance(buffer, PinnedMemory): return buffer.ptr, buffer.nbytes, buffer
  view = memoryview(buffer)
  if not view.c_contiguous: raise ValueError("copy: the host buffer must be contiguous")
  if writable and view.readonly: raise ValueError("copy_out: the host buffer is read-only")
  array = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view, dtype=np.uint8)
  return array.ctypes.data, array.nbytes, array

def _stream_handle(stream: Stream | None) -> int:
  """A stream's handle for the driver; 0, the default stream, for None."""
  return 0 if stream is None else stream.handle

@dataclass(frozen=True)
class DeviceProperties:
  """What kiln reads about a GPU: its name, compute capability, multiprocessors, memory and shared-memory limit."""
  index: int
  name: str
  compute_capability: tuple[int, int]
  sm_count: int
  total_memory: int
  max_shared_per_block: int   # with opt-in (cuFuncSetAttribute), in bytes

  @property
  def arch(self) -> str:
    """The NVRTC target for exactly this GPU (sm_90a on Hopper)."""
    return arch_for_capability(*self.compute_capability)

def device_properties(index: int = 0) -> DeviceProperties:
  """The properties of GPU `index` (no context needed)."""
  lib, device = driver(), c_int()
  lib.call("cuDeviceGet", ctypes.byref(device), index)
  def attribute(which: int) -> int:
    value = c_int()
    lib.call("cuDeviceGetAttribute", ctypes.byref(value), which, device.value)
    return value.value
  name, memory = ctypes.create_string_buffer(256), c_size_t()
  lib.call("cuDeviceGetName", name, len(name), device.value)
  lib.call("cuDeviceTotalMem", ctypes.byref(memory), device.value)
  return DeviceProperties(index, name.value.decode(), (attribute(ATTRIBUTE_CC_MAJOR), attribute(ATTRIBUTE_CC_MINOR)),
                          attribute(ATTRIBUTE_SM_COUNT), memory.value, attribute(ATTRIBUTE_SHARED_OPTIN))

class DeviceMemory:
  """`nbytes` of device memory at address `ptr`, from cuMemAlloc (`owner` None) or a view into another allocation."""
  def __init__(self, context: Context, ptr: int, nbytes: int, owner: DeviceMemory | None = None):
    self.context, self.ptr, self.nbytes, self.owner = context, ptr, nbytes, owner
    self.freed = False

  def view(self, offset: int, nbytes: int) -> DeviceMemory:
    """Bytes [offset, offset+nbytes) of this allocation, sharing its memory (freeing a view frees nothing)."""
    if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
      raise ValueError(f"DeviceMemory.view: bytes [{offset}, {offset + nbytes}) are outside the {self.nbytes} bytes")
    return DeviceMemory(self.context, self.ptr + offset, nbytes, owner=self.owner or self)

  def free(self) -> None:
    """Give the memory back to the driver (once; views free nothing)."""
    if self.owner is None and not self.freed and self.ptr:
      self.context.activate()
      driver().call("cuMemFree", self.ptr)
    self.freed = True

  def __enter__(self) -> DeviceMemory: return self
  def __exit__(self, *exc: Any) -> None: self.free()
  def __repr__(self) -> str: return f"<DeviceMemory 0x{self.ptr:x} {self.nbytes} bytes on GPU {self.context.index}>"

class HostMappedMemory(DeviceMemory):
  """A caller's host memory that kernels use in place (Tensor.from_blob on a GPU): its pages are locked and mapped
  into the GPU's address space (cuMemHostRegister), `ptr` is its device address, and every access crosses PCIe. The
  caller owns the memory; its pages are unregistered when the last mapping using them is freed (or collected)."""
  def __init__(self, context: Context, host_ptr: int, nbytes: int):
    if nbytes == 0:   # nothing to map (the address may be anything, even 0): no kernel reads it
      self.registrations: list[int] = []
      super().__init__(context, host_ptr, 0)
      self.host_ptr = host_ptr
      return
    self.registrations = _host_registrations.acquire(context, host_ptr, nbytes)
    device_ptr = c_u64()
    try:
      driver().call("cuMemHostGetDevicePointer", ctypes.byref(device_ptr), host_ptr, 0)
      if len(self.registrations) > 1 and device_ptr.value != host_ptr:   # pieces mapped apart need not be adjacent
        raise RuntimeError(f"CUDA: host memory at 0x{host_ptr:x} spans {len(self.registrations)} registrations "
                           "and this GPU does not address host memory by its host address")
    except Exception:
      _host_registrations.release(self.registrations)
      raise
    super().__init__(context, device_ptr.value, nbytes)
    self.host_ptr = host_ptr

  def free(self) -> None:
    """Release this mapping (its pages stay registered while another mapping uses them); never frees the memory."""
    if not self.freed: _host_registrations.release(self.registrations)
    self.freed = True

  def __del__(self) -> None:
    try: self.free()
    except Exception: pass   # at interpreter exit the driver may be gone already

  def __repr__(self) -> str:
    return f"<HostMappedMemory 0x{self.host_ptr:x} {self.nbytes} bytes, mapped for GPU {self.context.index}>"

class _HostRegistrations:
  """The page ranges kiln registered with the driver, none overlapping, each with a count of the mappings using it.
  The driver registers whole pages and refuses a page twice, so a mapping reuses the registered ranges it touches and
  registers only the pages none covers; a range is unregistered when its last mapping goes."""
  PAGE = 4096

  def __init__(self):
    self.ranges: dict[int, list[int]] = {}   # first byte -> [end, mappings using it]
    self.lock = threading.RLock()   # (re-entrant: a mapping collected while acquiring releases on this thread)

  def acquire(self, context: Context, start: int, nbytes: int) -> list[int]:
    """Make the pages of [start, start+nbytes) registered; the starts of the ranges the mapping uses (counted)."""
    first = start - start % self.PAGE
    end = -(-(start + max(1, nbytes)) // self.PAGE) * self.PAGE
    with self.lock:
      touched = sorted(begin for begin, (stop, _) in self.ranges.items() if begin < end and first < stop)
      gaps, at = [], first
      for begin in touched:
        if at < begin: gaps.append((at, begin))
        at = max(at, self.ranges[begin][0])
      if at < end: gaps.append((at, end))
      made = []
      try:
        for lo, hi in gaps:
          context.activate()
          try: driver().call("cuMemHostRegister", lo, hi - lo, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)
          except CudaError as error:   # pages another library registered (pinned by PyTorch, say): mapped already
            if error.code != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: raise
            continue
          self.ranges[lo] = [hi, 0]
          made.append(lo)
      except Exception:
        for lo in made:
          del self.ranges[lo]
          driver().call("cuMemHostUnregister", lo)
        raise
      used = sorted(touched + made)
      for begin in used: self.ranges[begin][1] += 1
      return used

  def release(self, starts: list[int]) -> None:
    """One mapping fewer for each range in `starts`; a range is unregistered with its last."""
    with self.lock:
      for begin in starts:
        entry = self.ranges.get(begin)
        if entry is None: continue
        entry[1] -= 1
        if entry[1] == 0:
          del self.ranges[begin]
          driver().call("cuMemHostUnregister", begin)

_host_registrations = _HostRegistrations()

class PinnedMemory:
  """Page-locked host memory from cuMemHostAlloc: asynchronous copies from and to it overlap with other work."""
  def __init__(self, context: Context, nbytes: int):
    self.context, self.nbytes, pointer = context, nbytes, c_void_p()
    context.activate()
    driver().call("cuMemHostAlloc", ctypes.byref(pointer), max(1, nbytes), CU_MEMHOSTALLOC_PORTABLE)
    self.ptr: int = pointer.value or 0

  def numpy(self, dtype: Any = np.uint8) -> np.ndarray:
    """A numpy array over the memory, no copy (valid until `free`)."""
    raw = (ctypes.c_char * self.nbytes).from_address(self.ptr)
    return np.frombuffer(raw, dtype=np.uint8).view(dtype)

  def free(self) -> None:
    """Give the memory back (cuMemFreeHost), once."""
    if self.ptr: driver().call("cuMemFreeHost", self.ptr)
    self.ptr = 0

  def __enter__(self) -> PinnedMemory: return self
  def __exit__(self, *exc: Any) -> None: self.free()

class Stream:
  """A non-blocking stream: work on it runs in order, concurrently with other streams (and the default stream)."""
  def __init__(self, context: Context):
    self.context, handle = context, c_void_p()
    context.activate()
    driver().call("cuStreamCreate", ctypes.byref(handle), CU_STREAM_NON_BLOCKING)
    self.handle: int = handle.value or 0

  def synchronize(self, timeout: float | None = None) -> None:
    """Wait until everything queued on the stream has finished (polled against the watchdog's deadline)."""
    wait_for_gpu(_stream_query(self.handle), "cuStreamQuery", self.context, "a stream's work", timeout)

  def wait(self, event: Event) -> None:
    """Make later work on this stream wait for `event` (recorded on another stream), without blocking the host."""
    driver().call("cuStreamWaitEvent", self.handle, event.handle, 0)

  def close(self) -> None:
    """Destroy the stream (its queued work still runs)."""
    if self.handle: driver().call("cuStreamDestroy", self.handle)
    self.handle = 0

  def __enter__(self) -> Stream: return self
  def __exit__(self, *exc: Any) -> None: self.close()

class Event:
  """A point in a stream's work; two timing events give the GPU time between them (`elapsed_ms`)."""
  def __init__(self, context: Context, timing: bool = True):
    self.context, handle = context, c_void_p()
    context.activate()
    driver().call("cuEventCreate", ctypes.byref(handle), 0 if timing else CU_EVENT_DISABLE_TIMING)
    self.handle: int = handle.value or 0

  def record(self, stream: Stream | None = None) -> Event:
    """Mark the point after the work queued so far on `stream` (None: the default stream)."""
    driver().call("cuEventRecord", self.handle, _stream_handle(stream))
    return self

  def synchronize(self, timeout: float | None = None) -> None:
    """Wait until the work before the recorded point has finished (polled against the watchdog's deadline)."""
    function, handle = driver().functions["cuEventQuery"], self.handle
    wait_for_gpu(lambda: function(handle), "cuEventQuery", self.context, "an event", timeout)

  def elapsed_ms(self, end: Event) -> float:
    """Milliseconds of GPU time from this event to `end` (both recorded; waits for `end`)."""
    end.synchronize()
    milliseconds = ctypes.c_float()
    driver().call("cuEventElapsedTime", ctypes.byref(milliseconds), self.handle, end.handle)
    return milliseconds.value

  def close(self) -> None:
    """Destroy the event."""
    if self.handle: driver().call("cuEventDestroy", self.handle)
    self.handle = 0

  def __enter__(self) -> Event: return self
  def __exit__(self, *exc: Any) -> None: self.close()

class Function:
  """One kernel of a loaded module, launched with `launch`."""
  def __init__(self, module: Module, name: str, handle: int):
    self.module, self.name, self.handle = module, name, handle
    self.shared_limit = STATIC_SHARED_LIMIT

  def launch(self, *args: Any, grid: int | Sequence[int] = 1, block: int | Sequence[int] = 1, shared: int = 0,
             stream: Stream | None = None) -> None:
    """Queue the kernel on `stream` (None: the default stream) with `grid` blocks of `block` threads and `shared`
    bytes of dynamic shared memory (over 48 KiB, the kernel is first allowed that much); `args` as `pack_args` packs
    them. Returns at once: synchronize the stream or an event to wait for it."""
    grid_xyz, block_xyz = launch_dims(grid, "grid"), launch_dims(block, "block")
    if shared < 0: raise ValueError(f"launch: shared memory must be >= 0 bytes, got {shared}")
    context = self.module.context
    context.activate()
    if shared > self.shared_limit: self.allow_shared(shared)
    params, _values = pack_args(args)
    context.last_launch = self.name
    driver().call("cuLaunchKernel", self.handle, *grid_xyz, *block_xyz, shared, _stream_handle(stream), params, None)

  def allow_shared(self, shared: int) -> None:
    """Let launches of the kernel use `shared` bytes of dynamic shared memory (over 48 KiB needs asking); a
    ValueError past the GPU's opt-in limit (227 KiB on the H200)."""
    limit = self.module.context.properties.max_shared_per_block
    if shared > max(limit, STATIC_SHARED_LIMIT):
      raise ValueError(f"launch: {self.name} asks for {shared} bytes of shared memory a block; this GPU allows "
                       f"{limit} (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
    driver().call("cuFuncSetAttribute", self.handle, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED, shared)
    self.shared_limit = shared

  def attribute(self, which: int) -> int:
    """A CUfunction_attribute of the kernel (e.g. 4: registers per thread)."""
    value = c_int()
    driver().call("cuFuncGetAttribute", ctypes.byref(value), which, self.handle)
    return value.value

  def __repr__(self) -> str: return f"<Function {self.name}>"

class PackedLaunch:
  """One kernel launch with its argument block packed once: `values[k].value = x` gives argument k a new value of
  the same kind (a DeviceMemory argument takes its new address, an int its new value), and `launch()` queues the
  kernel with the block as it is now. The hot path of repeated launches (TinyJit replays, eager calls of a kernel
  already run): no argument is converted again. cuLaunchKernel copies the arguments when it is called, so the block
  may be rewritten for the next launch as soon as `launch` returns (one thread at a time per PackedLaunch)."""
  def __init__(self, function: Function, args: Sequence[Any], grid: Any = 1, block: Any = 1, shared: int = 0):
    self.function, self.shared = function, shared
    self.grid, self.block = launch_dims(grid, "grid"), launch_dims(block, "block")
    if shared < 0: raise ValueError(f"launch: shared memory must be >= 0 bytes, got {shared}")
    self.params, self.values = pack_args(args)
    self.node = KernelNodeParams(function.handle, *self.grid, *self.block, shared,
                                 ctypes.cast(self.params, c_void_p), None, None, None)
    self._launch_args = (c_void_p(function.handle), *self.grid, *self.block, shared, None,
                         c_void_p(ctypes.addressof(self.params)), None)
    self._raw = _raw("cuLaunchKernel")

  def launch(self) -> None:
    """Queue the kernel on the default stream with the arguments now in `values`; returns at once."""
    function = self.function
    context = function.module.context
    context.activate()
    if self.shared > function.shared_limit: function.allow_shared(self.shared)
    context.last_launch = function.name
    if (code := self._raw(*self._launch_args)) != 0: raise _driver_error("cuLaunchKernel", code)

@functools.cache
def _raw(name: str) -> Any:
  """The driver's `name` without argument conversion (`_Library.raw`), made once."""
  return driver().raw(name)

class KernelNodeParams(ctypes.Structure):
  """CUDA_KERNEL_NODE_PARAMS_v2: one kernel launch as a graph node (kern and ctx unused: NULL)."""
  _fields_ = [("func", c_void_p), ("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
              ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint), ("sharedMemBytes", c_uint),
              ("kernelParams", c_void_p), ("extra", c_void_p), ("kern", c_void_p), ("ctx", c_void_p)]

class GraphEdgeData(ctypes.Structure):
  """CUgraphEdgeData: how a graph edge's downstream node depends on its upstream one (zero: full completion)."""
  _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
              ("reserved", ctypes.c_ubyte * 5)]

# a programmatic edge (CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC): the downstream
# kernel may start once every block of the upstream one has run `griddepcontrol.launch_dependents` (or exited); its
# own `griddepcontrol.wait` then waits for the upstream grid to complete and its memory to be visible
PORT_PROGRAMMATIC, DEPENDENCY_PROGRAMMATIC = 1, 1

class Graph:
  """Kernel launches as one CUDA graph, each node after the one before, instantiated once: `launch` queues all of
  them with one driver call; `set_args(i, *args)` gives node i new arguments (the same kinds) in the instantiated
  graph. `launches` are (function, args, grid, block) as `Function.launch` takes them, or PackedLaunches.

  `dependencies[i]`, when given, lists the earlier nodes node i waits for (instead of the one before it): nodes
  that wait for none of each other may run at the same time. `programmatic[i]`: node i's edges are programmatic
  (programmatic dependent launch: it starts early and its kernel's `griddepcontrol.wait` waits; only for kernels that
  run that instruction before touching memory); where the driver lacks cuGraphAddDependencies_v2, plain edges.

  The graph can be instantiated more than once (`instantiate`): executables of one graph differ only in their nodes'
  arguments (`update`), so a caller that alternates between a few argument sets keeps one executable for each and
  launches it (`launch_exec`) without updating any node."""
  def __init__(self, context: Context, launches: Sequence[tuple[Function, Sequence[Any], Any, Any] | PackedLaunch],
               dependencies: Sequence[Sequence[int]] | None = None, programmatic: Sequence[bool] | None = None):
    self.context, lib = context, driver()
    context.activate()
    graph, self.nodes, self.execs = c_void_p(), [], []
    lib.call("cuGraphCreate", ctypes.byref(graph), 0)
    self.graph, self.exec = graph.value, 0
    self.packed = [launch if isinstance(launch, PackedLaunch) else PackedLaunch(*launch) for launch in launches]
    # with programmatic edges the nodes are added unconnected and every edge afterwards, each with its edge data
    self.programmatic = bool(programmatic) and any(programmatic) and "cuGraphAddDependencies" in lib.functions
    edges: list[tuple[int, int, bool]] = []
    for i, packed in enumerate(self.packed):
      if packed.shared > packed.function.shared_limit: packed.function.allow_shared(packed.shared)
      node = c_void_p()
      waits = ([i - 1] if i else []) if dependencies is None else sorted(set(dependencies[i]))
      if any(not 0 <= j < i for j in waits):
        raise ValueError(f"Graph: node {i} may wait only for earlier nodes, not {waits}")
      if self.programmatic: edges += [(j, i, bool(programmatic[i])) for j in waits]   # type: ignore[index]
      deps = (c_void_p * len(waits))(*[self.nodes[j] for j in waits]) if waits and not self.programmatic else None
      lib.call("cuGraphAddKernelNode", ctypes.byref(node), self.graph, deps, 0 if deps is None else len(waits),
               ctypes.byref(packed.node))
      self.nodes.append(node.value)
    if edges:
      data = (GraphEdgeData * len(edges))()
      for k, (_, _, programmatic_edge) in enumerate(edges):
        if programmatic_edge: data[k].from_port, data[k].type = PORT_PROGRAMMATIC, DEPENDENCY_PROGRAMMATIC
      upstream = (c_void_p * len(edges))(*[self.nodes[j] for j, _, _ in edges])
      downstream = (c_void_p * len(edges))(*[self.nodes[i] for _, i, _ in edges])
      lib.call("cuGraphAddDependencies", self.graph, upstream, downstream, data, len(edges))
    self.exec = self.instantiate()
    self._set_params, self._graph_launch = _raw("cuGraphExecKernelNodeSetParams"), _raw("cuGraphLaunch")
    self._node_handles = [c_void_p(node) for node in self.nodes]
    self._node_params = [c_void_p(ctypes.addressof(packed.node)) for packed in self.packed]
    names = [packed.function.name for packed in self.packed]
    shown = names if len(names) <= 4 else [*names[:3], "...", names[-1]]
    self.description = f"a CUDA graph of {len(names)} kernels ({', '.join(shown)})"

  def instantiate(self) -> int:
    """A new executable of the graph, its nodes with the arguments they were added with."""
    handle = c_void_p()
    self.context.activate()
    driver().call("cuGraphInstantiate", ctypes.byref(handle), self.graph, 0)
    self.execs.append(handle.value)
    return handle.value

  def update(self, exec_handle: int, index: int) -> None:
    """Node `index` of the executable `exec_handle` runs with the arguments now in `packed[index].values`."""
    code = self._set_params(c_void_p(exec_handle), self._node_handles[index], self._node_params[index])
    if code != 0: raise _driver_error("cuGraphExecKernelNodeSetParams", code)

  def launch_exec(self, exec_handle: int) -> None:
    """Queue the executable `exec_handle` on the default stream; returns at once (its context must be current)."""
    self.context.last_launch = self.description
    if (code := self._graph_launch(c_void_p(exec_handle), None)) != 0: raise _driver_error("cuGraphLaunch", code)

  def set_args(self, index: int, function: Function, args: Sequence[Any], grid: Any, block: Any) -> None:
    """Node `index` runs `function` with `args` from the next launch on (of the first executable)."""
    self.packed[index] = PackedLaunch(function, args, grid, block)
    self._node_params[index] = c_void_p(ctypes.addressof(self.packed[index].node))
    self.context.activate()
    self.update(self.exec, index)

  def launch(self, stream: Stream | None = None) -> None:
    """Queue every node of the first executable on `stream` (None: the default stream); returns at once."""
    self.context.activate()
    self.context.last_launch = self.description
    driver().call("cuGraphLaunch", self.exec, _stream_handle(stream))

  def close(self) -> None:
    """Free the executables and the graph."""
    for handle in self.execs: driver().call("cuGraphExecDestroy", handle)
    if self.graph: driver().call("cuGraphDestroy", self.graph)
    self.execs, self.exec, self.graph = [], 0, 0

class Module:
  """A CUBIN (or PTX) image loaded into a context (cuModuleLoadData); `function(name)` finds a kernel in it."""
  def __init__(self, context: Context, image: bytes):
    self.context, handle = context, c_void_p()
    context.activate()
    driver().call("cuModuleLoadData", ctypes.byref(handle), ctypes.c_char_p(image))
    self.handle: int = handle.value or 0

  def function(self, name: str) -> Function:
    """The kernel `name` (declared `extern "C"` so that its name is not mangled)."""
    handle = c_void_p()
    driver().call("cuModuleGetFunction", ctypes.byref(handle), self.handle, name.encode())
    return Function(self, name, handle.value or 0)

  def close(self) -> None:
    """Unload the module."""
    if self.handle:
      self.context.activate()
      driver().call("cuModuleUnload", self.handle)
    self.handle = 0

  def __enter__(self) -> Module: return self
  def __exit__(self, *exc: Any) -> None: self.close()

# the context kiln last made current on each thread: making it current again is skipped (a library that switches the
# thread's context behind kiln's back, to another GPU's, must switch it back; PyTorch on GPU 0 uses the same primary
# context)
_current = threading.local()

class Context:
  """The primary context of GPU `index`, retained until `close`: memory, copies, streams, events and modules.

  Every method makes the context current on the calling thread first, so one thread may use several GPUs.
  """
  def __init__(self, index: int = 0):
    lib = driver()
    if not 0 <= index < device_count():
      raise RuntimeError(f"CUDA: there is no GPU {index}; this machine has {device_count()}")
    self.index, self.properties, handle = index, device_properties(index), c_void_p()
    lib.call("cuDevicePrimaryCtxRetain", ctypes.byref(handle), index)
    self.handle: int = handle.value or 0
    self.last_launch = ""   # the name of the kernel (or graph) last launched here, for the watchdog's message
    self.activate()

  def activate(self) -> None:
    """Make this context current on the calling thread (no driver call where kiln made it current there last)."""
    if getattr(_current, "handle", None) == self.handle: return
    driver().call("cuCtxSetCurrent", self.handle)
    _current.handle = self.handle

  def synchronize(self, timeout: float | None = None) -> None:
    """Wait until all work queued in this context has finished: the default stream's by polling it against the
    watchdog's deadline (`wait_for_gpu`: CUDA_TIMEOUT seconds, or `timeout`), then the other streams'."""
    self.activate()
    self.wait_default_stream("a synchronize", timeout)
    driver().call("cuCtxSynchronize")

  def wait_default_stream(self, what: str, timeout: float | None = None) -> None:
    """Wait until the default stream's queued work has finished, against the watchdog's deadline (`wait_for_gpu`);
    the context must be current."""
    wait_for_gpu(_stream_query(0), "cuStreamQuery", self, what, timeout)

  def memory_info(self) -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    free, total = c_size_t(), c_size_t()
    self.activate()
    driver().call("cuMemGetInfo", ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value

  def alloc(self, nbytes: int) -> DeviceMemory:
    """`nbytes` of device memory (cuMemAlloc; contents undefined); CudaOutOfMemoryError when there is not enough."""
    if nbytes < 0: raise ValueError(f"alloc: cannot allocate a negative number of bytes ({nbytes})")
    pointer = c_u64()
    self.activate()
    driver().call("cuMemAlloc", ctypes.byref(pointer), max(1, nbytes))
    return DeviceMemory(self, pointer.value, nbytes)

  def alloc_host(self, nbytes: int) -> PinnedMemory:
    """`nbytes` of page-locked host memory (cuMemHostAlloc)."""
    return PinnedMemory(self, nbytes)

  def memset(self, dest: DeviceMemory, byte: int) -> None:
    """Set every byte of `dest` to `byte` (e.g. to poison an output before a test)."""
    self.activate()
    driver().call("cuMemsetD8", dest.ptr, byte, dest.nbytes)

  def copy_in(self, dest: DeviceMemory, src: Any, stream: Stream | None = None) -> None:
    """Copy the host buffer `src` into `dest` (sizes must match). With a stream the copy is queued and returns at
    once: keep `src` alive and unchanged until the stream is synchronized (pinned memory makes it truly async)."""
    address, nbytes, _keep = _host_address(src)
    _check_sizes("copy_in", nbytes, dest.nbytes)
    self.activate()
    if stream is None:   # the copy waits for the kernels before it: they are waited for first, by the watchdog
      self.wait_default_stream(f"the kernels before a copy of {nbytes} bytes to the GPU")
      driver().call("cuMemcpyHtoD", dest.ptr, address, nbytes)
    else: driver().call("cuMemcpyHtoDAsync", dest.ptr, address, nbytes, stream.handle)

  def copy_out(self, dest: Any, src: DeviceMemory, stream: Stream | None = None) -> None:
    """Copy `src` into the writable host buffer `dest` (sizes must match); with a stream, queued as in `copy_in`."""
    address, nbytes, _keep = _host_address(dest, writable=True)
    _check_sizes("copy_out", src.nbytes, nbytes)
    self.activate()
    if stream is None:   # the copy waits for the kernels before it: they are waited for first, by the watchdog
      self.wait_default_stream(f"the kernels before a copy of {nbytes} bytes to the host")
      driver().call("cuMemcpyDtoH", address, src.ptr, nbytes)
    else: driver().call("cuMemcpyDtoHAsync", address, src.ptr, nbytes, stream.handle)

  def copy(self, dest: DeviceMemory, src: DeviceMemory, stream: Stream | None = None) -> None:
    """Copy device memory to device memory; across GPUs, a peer copy (cuMemcpyPeerAsync), never through the host."""
    _check_sizes("copy", src.nbytes, dest.nbytes)
    self.activate()
    if dest.context.handle != src.context.handle:
      src.context.synchronize()   # the source GPU's queued kernels that write `src` are not ordered with this copy
      driver().call("cuMemcpyPeerAsync", dest.ptr, dest.context.handle, src.ptr, src.context.handle, src.nbytes,
                    _stream_handle(stream))
      if stream is None: self.synchronize()
    elif stream is None: driver().call("cuMemcpyDtoD", dest.ptr, src.ptr, src.nbytes)
    else: driver().call("cuMemcpyDtoDAsync", dest.ptr, src.ptr, src.nbytes, stream.handle)

  def can_access_peer(self, other: Context) -> bool:
    """Whether kernels in this context can read and write `other`'s memory directly (NVLink or PCIe P2P)."""
    answer = c_int()
    driver().call("cuDeviceCanAccessPeer", ctypes.byref(answer), self.index, other.index)
    return bool(answer.value)

  def enable_peer_access(self, other: Context) -> None:
    """Let kernels in this context access `other`'s memory (copies between them work without it too)."""
    self.activate()
    driver().call("cuCtxEnablePeerAccess", other.handle, 0)

  def stream(self) -> Stream:
    """A new non-blocking stream."""
    return Stream(self)

  def event(self, timing: bool = True) -> Event:
    """A new event (timing=False: cheaper, for ordering only)."""
    return Event(self, timing)

  def load(self, image: bytes) -> Module:
    """Load a CUBIN or PTX image."""
    return Module(self, image)

  def compile(self, src: str, options: Sequence[str] = ()) -> Module:
    """Compile CUDA C `src` with NVRTC for this GPU's exact arch (disk-cached) and load it."""
    return self.load(NVRTCCompiler(self.properties.arch, tuple(options)).compile_cached(src))

  def close(self) -> None:
    """Release the primary context (the driver destroys it when no one else holds it)."""
    if self.handle: driver().call("cuDevicePrimaryCtxRelease", self.index)
    if getattr(_current, "handle", None) == self.handle: _current.handle = None
    self.handle = 0

  def __enter__(self) -> Context: return self
  def __exit__(self, *exc: Any) -> None: self.close()
  def __repr__(self) -> str: return f"<Context GPU {self.index} {self.properties.name} {self.properties.arch}>"

def _check_sizes(what: str, src_bytes: int, dest_bytes: int) -> None:
  """ValueError when a copy's source and destination differ in size."""
  if src_bytes != dest_bytes:
    raise ValueError(f"{what}: the source has {src_bytes} bytes and the destination {dest_bytes}")

# ---------------- kiln's allocator over cuMemAlloc ----------------

class CudaAllocator(LRUAllocator):
  """Device memory for kiln's Buffers: cuMemAlloc allocations (handles are DeviceMemory), freed ones kept per size
  by the LRU cache and handed out again; out of memory, the cache is freed and the allocation tried once more.
  (Small copies in queued from pinned staging memory were measured slower than the synchronous copy: the H200,
  bench/gpu_notes.md call 30, an LLM step's 8-byte input 15-16 against 11 us.)"""
  def __init__(self, context: Context, max_cached_bytes: int = 1 << 32):
    super().__init__(max_cached_bytes)
    self.context = context
  def _alloc(self, nbytes: int) -> DeviceMemory: return self.context.alloc(nbytes)
  def _free(self, handle: DeviceMemory, nbytes: int) -> None: handle.free()
  def copyin(self, handle: DeviceMemory, src: memoryview) -> None:
    """Copy host bytes `src` into `handle`."""
    self.context.copy_in(handle, src)
  def copyout(self, dest: memoryview, handle: DeviceMemory) -> None:
    """Copy `handle` into the host bytes `dest`."""
    self.context.copy_out(dest, handle)
  def offset_view(self, handle: DeviceMemory, offset: int, nbytes: int) -> DeviceMemory:
    """Bytes [offset, offset+nbytes) of `handle`, sharing its memory."""
    return handle.view(offset, nbytes)
  def transfer(self, dest: DeviceMemory, src, src_allocator, nbytes: int) -> bool:
    """Device memory to device memory: on one GPU a device copy, across GPUs a peer copy (never through the host);
    False for a source that is not GPU memory."""
    if not isinstance(src_allocator, CudaAllocator): return False
    self.context.copy(dest, src)
    return True
  # a caller's host memory can be used in place: it is registered with the driver and mapped for the GPU
  host_memory = True
  def wrap(self, ptr: int, nbytes: int) -> HostMappedMemory:
    """The `nbytes` of host memory at `ptr` as memory kernels read and write in place (see HostMappedMemory)."""
    return HostMappedMemory(self.context, ptr, nbytes)

# ---------------- NVRTC ----------------

DEFAULT_NVRTC_OPTIONS = ("--fmad=false",)   # no contraction into FMA: results match the CPU reference bit for bit

class PTXCompiler(Compiler):
  """PTX text (kiln/renderer/ptx.py) -> the image `cuModuleLoadData` takes: the PTX itself, NUL-terminated; the driver
  compiles it for the GPU when the module loads (and keeps the result in its own cache). No disk cache here: the
  output is the source."""
  disk_cache = False

  def __init__(self, arch: str):
    if not re.fullmatch(r"sm_\d+[af]?", arch): raise ValueError(f"PTXCompiler: arch must look like sm_90a, got {arch!r}")
    self.arch = arch

  def cache_key(self) -> str:
    """The arch: the PTX's `.target`."""
    return f"PTX {self.arch}"

  def compile(self, src: str) -> bytes:
    """`src` as a NUL-terminated PTX image; a CompileError when it does not target this compiler's arch."""
    if f".target {self.arch}" not in src: raise CompileError(f"PTXCompiler: the PTX does not target {self.arch}")
    return src.encode() + b"\0"

class NVRTCCompiler(Compiler):
  """CUDA C -> CUBIN for `arch` (e.g. "sm_90a") with NVRTC; `compile_cached` keeps CUBINs in kiln's compile cache,
  keyed by the source, the arch, the options and NVRTC's version (`version` is asked of NVRTC when not given)."""
  # NVRTC compiles different programs from several threads at once (its calls release the GIL: ctypes), so a
  # schedule's new kernels and BEAM's candidates compile on every host core (kiln/device.py CompilePipeline)
  runs_in_subprocess = True

  def __init__(self, arch: str, options: Sequence[str] = DEFAULT_NVRTC_OPTIONS, version: tuple[int, int] | None = None):
    if not re.fullmatch(r"sm_\d+[af]?", arch):
      raise ValueError(f"NVRTCCompiler: arch must look like sm_90a, got {arch!r}")
    self.arch, self.options, self._version = arch, tuple(options), version

  @property
  def version(self) -> tuple[int, int]:
    """NVRTC's (major, minor), part of the cache key: a new NVRTC compiles anew."""
    if self._version is None: self._version = nvrtc_version()
    return self._version

  def cache_key(self) -> str:
    """The arch, the options and NVRTC's version: everything besides the source that changes the CUBIN."""
    return f"NVRTC {self.version[0]}.{self.version[1]} {self.arch} {' '.join(self.options)}"

  def compile(self, src: str, name: str = "kernel.cu") -> bytes:
    """The CUBIN of `src`; NVRTCCompileError holding NVRTC's log when the source does not compile."""
    lib, program = nvrtc(), c_void_p()
    lib.call("nvrtcCreateProgram", ctypes.byref(program), src.encode(), name.encode(), 0, None, None)
    try:
      options = [f"--gpu-architecture={self.arch}", *self.options]
      encoded = (ctypes.c_char_p * len(options))(*[option.encode() for option in options])
      try: lib.call("nvrtcCompileProgram", program, len(options), encoded)
      except RuntimeError:
        log = self._log(program)
        raise NVRTCCompileError(f"NVRTC: {name} did not compile for {self.arch} ({' '.join(options)}):\n{log}",
                                log) from None
      size = c_size_t()
      lib.call("nvrtcGetCUBINSize", program, ctypes.byref(size))
      cubin = ctypes.create_string_buffer(size.value)
      lib.call("nvrtcGetCUBIN", program, cubin)
      return cubin.raw
    finally: lib.call("nvrtcDestroyProgram", ctypes.byref(program))

  @staticmethod
  def _log(program: c_void_p) -> str:
    """NVRTC's program log (errors and warnings) of `program`."""
    size = c_size_t()
    nvrtc().call("nvrtcGetProgramLogSize", program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc().call("nvrtcGetProgramLog", program, log)
    return log.value.decode(errors="replace").strip()

def compile_cuda(src: str, arch: str, options: Sequence[str] = DEFAULT_NVRTC_OPTIONS) -> bytes:
  """The CUBIN of CUDA C `src` for `arch`, from kiln's compile cache or NVRTC (needs libnvrtc, no GPU)."""
  return NVRTCCompiler(arch, options).compile_cached(src)

def candidates_text(candidates: Iterable[LibraryCandidate]) -> str:
  """The candidates one a line, as `name  (rule)`, for diagnostics (python -m kiln.runtime.cuda_driver)."""
  return "\n".join(f"  {c.name}  ({c.source})" for c in candidates)

if __name__ == "__main__":
  print("libcuda search order:\n" + candidates_text(driver_library_candidates()))
  print("libnvrtc search order:\n" + candidates_text(nvrtc_library_candidates()))
  print(unavailable_reason() or f"{device_count()} GPU(s): " +
        ", ".join(f"{p.name} {p.arch} {p.sm_count} SMs" for p in map(device_properties, range(device_count()))))
