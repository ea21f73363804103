"""NCCL through ctypes: a communicator over this process's CUDA devices and the all-reduce kiln's multi-device
tensors need (docs/multi.md).

libnccl comes from the system (`libnccl.so.2`, the loader's search path and ldconfig) or from NVIDIA's
`nvidia-nccl-cu13` wheel (the `cuda` extra), never bundled. NVLink multicast (NVLS) stays off: `NCCL_NVLS_ENABLE=0` is
set before the library loads unless the environment says otherwise, since on a shared host it can take GPUs out of
service.
"""
from __future__ import annotations
import ctypes, ctypes.util, glob, os, sys, time
from kiln.dtype import DType, dtypes
from kiln.uop.ops import Ops

class NCCLError(RuntimeError):
  """libnccl is missing, or an NCCL call failed (the message has NCCL's own reason)."""

# ncclDataType_t and ncclRedOp_t (nccl.h)
NCCL_DTYPES: dict[DType, int] = {dtypes.int8: 0, dtypes.uint8: 1, dtypes.int32: 2, dtypes.uint32: 3, dtypes.int64: 4,
                                 dtypes.uint64: 5, dtypes.float16: 6, dtypes.float32: 7, dtypes.float64: 8,
                                 dtypes.bfloat16: 9}
NCCL_OPS: dict[Ops, int] = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: 2}

def library_candidates() -> list[str]:
  """Where libnccl may be, in the order tried: the soname, what ldconfig knows, the nvidia-nccl wheels' folders."""
  names = ["libnccl.so.2", "libnccl.so"]
  if (found := ctypes.util.find_library("nccl")) and found not in names: names.append(found)
  for folder in sys.path:
    names += sorted(glob.glob(os.path.join(folder, "nvidia", "nccl", "lib", "libnccl.so*")))
  return names

_library: ctypes.CDLL | None = None

def nccl() -> ctypes.CDLL:
  """libnccl, loaded once (NCCLError when there is none)."""
  global _library
  if _library is not None: return _library
  os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
  errors = []
  for name in library_candidates():
    try: lib = ctypes.CDLL(name)
    except OSError as e:
      errors.append(f"{name}: {e}")
      continue
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclCommInitAll.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    _library = lib
    return lib
  raise NCCLError("libnccl not found (install the system's libnccl2, or pip install nvidia-nccl-cu13): " +
                  "; ".join(errors[:3]))

def available() -> bool:
  """Whether libnccl loads here."""
  try: nccl()
  except NCCLError: return False
  return True

def _check(result: int, call: str) -> None:
  if result != 0:
    raise NCCLError(f"{call} failed: {nccl().ncclGetErrorString(result).decode(errors='replace')} (ncclResult {result})")

def version() -> tuple[int, int, int]:
  """NCCL's version as (major, minor, patch)."""
  code = ctypes.c_int()
  _check(nccl().ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
  major, rest = divmod(code.value, 10000)
  return major, rest // 100, rest % 100

class Communicator:
  """One NCCL communicator over CUDA devices `ordinals` of this process (a rank each, in that order)."""
  def __init__(self, ordinals: list[int]):
    self.ordinals = list(ordinals)
    self.comms = (ctypes.c_void_p * len(ordinals))()
    devices = (ctypes.c_int * len(ordinals))(*ordinals)
    _check(nccl().ncclCommInitAll(self.comms, len(ordinals), devices), "ncclCommInitAll")

  def all_reduce(self, sends: list[int], receives: list[int], count: int, dtype: DType, op: Ops,
                 streams: list[int] | None = None) -> None:
    """Combine `count` elements of `dtype` at each rank's device address `sends[i]` with `op`; every rank's result lands
    at `receives[i]` (it may be `sends[i]`: in place). Queued on `streams` (default: each device's default stream)."""
    if dtype not in NCCL_DTYPES: raise NCCLError(f"all_reduce: NCCL has no {dtype}")
    if op not in NCCL_OPS: raise NCCLError(f"all_reduce: NCCL has no reduction {op}")
    lib = nccl()
    streams = streams or [0] * len(self.ordinals)
    _check(lib.ncclGroupStart(), "ncclGroupStart")
    try:
      for rank in range(len(self.ordinals)):
        _check(lib.ncclAllReduce(sends[rank], receives[rank], count, NCCL_DTYPES[dtype], NCCL_OPS[op],
                                 self.comms[rank], streams[rank]), "ncclAllReduce")
    finally: _check(lib.ncclGroupEnd(), "ncclGroupEnd")

  def close(self) -> None:
    """Free the communicator (once)."""
    for i, comm in enumerate(self.comms):
      if comm: nccl().ncclCommDestroy(comm)
      self.comms[i] = None

_communicators: dict[tuple[int, ...], Communicator] = {}

def communicator(ordinals: tuple[int, ...]) -> Communicator:
  """The communicator over CUDA devices `ordinals` (in that rank order), made once per tuple and kept."""
  if (comm := _communicators.get(ordinals)) is None: comm = _communicators[ordinals] = Communicator(list(ordinals))
  return comm

def _address(buf) -> int:
  """A Buffer's memory address: a CUDA allocation's device pointer, a host array's address (CPU devices, tests)."""
  memory = buf._buf
  return memory.ptr if hasattr(memory, "ptr") else memory.ctypes.data

class AllReduceRunner:
  """The runner of an ALLREDUCE schedule item (kiln/schedule/kernelize.py): `bufs` are one output per device, in device
  order, then each device's partial; one ncclAllReduce per device in one group, queued on each device's default
  stream (where kiln's kernels and copies run), so it runs after the kernels before it and before those after it."""
  name, ops, vars = "allreduce", 0, []
  def __init__(self, op: Ops, devices: tuple[str, ...]):
    self.op, self.devices, self.n_out = op, devices, len(devices)
    self.ordinals = tuple(int(d.partition(":")[2] or 0) for d in devices)

  def __call__(self, bufs: list, var_vals: dict | None = None, wait: bool = False) -> float:
    """Run the all-reduce over `bufs`; returns the seconds spent (the whole run only with wait=True)."""
    start = time.perf_counter()
    outs, ins = bufs[:self.n_out], bufs[self.n_out:]
    communicator(self.ordinals).all_reduce([_address(b) for b in ins], [_address(b) for b in outs], outs[0].size,
                                           outs[0].dtype, self.op)
    if wait:
      from kiln.device import Device
      for d in self.devices: Device[d].synchronize()
    return time.perf_counter() - start

_runners: dict[tuple, AllReduceRunner] = {}

def all_reduce_runner(ast) -> AllReduceRunner:
  """The runner of an ALLREDUCE item's `ast` (arg (op, devices)), made once per op and device tuple."""
  if (runner := _runners.get(ast.arg)) is None: runner = _runners[ast.arg] = AllReduceRunner(*ast.arg)
  return runner
