"""The DISK device: tensors whose memory is a file, mapped with mmap. `Device["DISK:/path/to/file"]` is one file.

A DISK tensor is a window on the file's bytes. Only byte-range views are allowed on it: `reshape`, `shrink` to a
contiguous range, `bitcast`. Reading it (`.to(dev)`, `.numpy()`) copies those bytes out of the mapping, with no
kernel; writing it (`.assign(x)`) copies bytes in. Nothing is read until a tensor is used, and then only the pages
that are touched, so a file larger than RAM opens at once. (What a Tensor does with a DISK tensor, its bitcasts and
assigns, is kiln/mixin/disk.py: this runtime knows buffers and byte ranges, never tensors.)

>>> import pathlib, tempfile
>>> from kiln import Tensor
>>> path = pathlib.Path(tempfile.mkdtemp()) / "four.bin"
>>> _ = path.write_bytes(bytes([1, 0, 0, 0, 2, 0, 0, 0]))
>>> Tensor(path).bitcast("int32").to("CPU").tolist()
[1, 2]
"""
from __future__ import annotations
import mmap, os, weakref
from typing import Any
from kiln.device import Allocator, Buffer, Compiled, Compiler
from kiln.dtype import DType, dtypes
from kiln.helpers import prod
from kiln.uop.ops import UOp, Ops, GroupOp, toposort
from kiln.uop.pattern import substitute

SUPPORTED = "reshape, shrink to a contiguous byte range, bitcast, .to(device), .numpy() and assign"

def disk_op_error(what: str) -> RuntimeError:
  """The error for an op a DISK tensor cannot run."""
  return RuntimeError(f"DISK tensors support only {SUPPORTED}; {what} needs a kernel, which a file cannot run: "
                      f"call .to('CPU') first")

class DiskAllocator(Allocator):
  """One file's memory: `alloc(n)` maps its first n bytes (growing the file to n bytes when it is shorter).

  A read-only file is mapped read-only; the handles are memoryviews of the mapping.
  """
  def __init__(self, path: str):
    self.path = path
    self._mapping: mmap.mmap | None = None
    self._mapped_bytes = 0
    self._mapped_file: tuple[int, ...] | None = None   # (device, inode, creation time) of the mapped file

  def _current_file(self, fd: int | None = None) -> tuple[int, ...] | None:
    try: info = os.stat(self.path) if fd is None else os.fstat(fd)
    except OSError: return None
    return info.st_dev, info.st_ino, info.st_ctime_ns

  def _map(self, nbytes: int) -> memoryview:
    # a file replaced since it was mapped (deleted and written again) is mapped anew; buffers already made keep theirs
    if self._mapping is None or self._mapped_bytes < nbytes or self._mapped_file != self._current_file():
      writable = not os.path.exists(self.path) or os.access(self.path, os.W_OK)
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY, 0o644)
      except OSError as e: raise RuntimeError(f"DISK: cannot open {self.path!r}: {e.strerror}") from None
      try:
        size = os.fstat(fd).st_size
        if size < nbytes:
          if not writable: raise RuntimeError(f"DISK: {self.path!r} is read-only and holds {size} bytes, not {nbytes}")
          os.ftruncate(fd, nbytes)   # sparse: growing the file writes nothing
          size = nbytes
        if size == 0: return memoryview(bytearray(0))   # mmap cannot map an empty file
        self._mapping = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        self._mapped_bytes, self._mapped_file = size, self._current_file(fd)
      finally: os.close(fd)   # the mapping stays valid after the file is closed
    return memoryview(self._mapping)[:nbytes]

  def _alloc(self, nbytes: int) -> memoryview: return self._map(nbytes)

  def copyin(self, handle: memoryview, src: memoryview) -> None:
    """Write `src` into the file bytes of `handle`."""
    if handle.readonly: raise RuntimeError(f"DISK: cannot write to {self.path!r}: the file is read-only")
    handle[:] = src.cast("B") if src.format != "B" else src

  def copyout(self, dest: memoryview, handle: memoryview) -> None:
    """Read the file bytes of `handle` into `dest`."""
    (dest.cast("B") if dest.format != "B" else dest)[:] = handle

  def as_memoryview(self, handle: memoryview) -> memoryview:
    """The mapped bytes themselves (copies out of the file read them; nothing else does)."""
    return handle

  def offset_view(self, handle: memoryview, offset: int, nbytes: int) -> memoryview:
    """Bytes [offset, offset+nbytes) of the mapping."""
    return handle[offset:offset + nbytes]

class _NoKernels:
  """The renderer and compiler of DISK: a file runs no kernels, so both refuse with the DISK error (codegen asks a
  renderer for its target first)."""
  packs_matmul_operands = False
  @property
  def target(self): raise disk_op_error("a kernel")
  def render(self, name: str, uops: list) -> str: raise disk_op_error(f"kernel {name}")
  def compile(self, src: str) -> bytes: raise disk_op_error("a kernel")

class _DiskCompiler(Compiler):
  def compile(self, src: str) -> bytes: raise disk_op_error("a kernel")

def _no_runtime(name: str, lib: bytes) -> Any: raise disk_op_error(f"kernel {name}")

class DiskDevice(Compiled):
  """A file as device memory. The name is 'DISK:<path>'."""
  def __init__(self, device: str):
    path = device.partition(":")[2]
    if not path: raise ValueError(f"DISK device needs a file: use 'DISK:/path/to/file', got {device!r}")
    super().__init__(device, DiskAllocator(path), _NoKernels(), _DiskCompiler(), _no_runtime)

def is_disk(device: str | None) -> bool:
  """Whether `device` names a file."""
  return isinstance(device, str) and device.upper().startswith("DISK")

# ---------------- byte-range views ----------------

def _shrink_range(shape: tuple[int, ...], bounds: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
  """(first element, element count) of a row-major shrink, or None when the kept elements are not contiguous."""
  kept = [e - b for b, e in bounds]
  # contiguous: the axes before the last partial one keep a single index (those after it are whole); `t[2, 1:3]` of
  # a (4, 4) tensor is one run of 2 elements
  partial = max((i for i, (k, s) in enumerate(zip(kept, shape)) if k != s), default=0)
  if prod(kept) and any(k != 1 for k in kept[:partial]): return None
  strides = [prod(shape[i + 1:]) for i in range(len(shape))]
  return sum(b * st for (b, _), st in zip(bounds, strides)), prod(kept)

def byte_range(uop: UOp) -> tuple[Buffer, int, int] | None:
  """(file buffer, byte offset, byte count) that a chain of RESHAPE/contiguous SHRINK over a DISK buffer reads;
  None when `uop` is something else. A non-contiguous shrink raises."""
  chain = []
  node = uop
  while node.op in (Ops.RESHAPE, Ops.SHRINK, Ops.CONTIGUOUS):
    chain.append(node)
    node = node.src[0]
  if node.op is not Ops.BUFFER or not is_disk(node.arg[1]) or node.buffer is None: return None
  offset, count = 0, node.arg[2]   # in elements of the buffer's dtype; movement ops never change the dtype
  for step in reversed(chain):
    if step.op is Ops.SHRINK:
      found = _shrink_range(step.src[0].shape, step.arg)
      if found is None:
        raise RuntimeError(f"DISK: shrink {step.arg} of shape {step.src[0].shape} is not one contiguous byte range "
                           f"({step.meta or 'shrink'}); DISK tensors support only {SUPPORTED}")
      offset, count = offset + found[0], found[1]
  item = node.dtype.itemsize
  return node.buffer, offset * item, count * item

# every view made of a file buffer, so that writing the file can forget results read through any of them
_views_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

def view_node(buf: Buffer, offset: int, dtype: DType, shape: tuple[int, ...]) -> UOp:
  """A BUFFER node (reshaped to `shape`) over bytes from `offset` of the file buffer `buf`, as `dtype`."""
  base = buf._base if buf._base is not None else buf
  view = base.view(prod(shape), dtype, buf._offset + offset)
  _views_of.setdefault(base, weakref.WeakSet()).add(view)
  node = UOp.new_buffer(view.device, view.size, dtype)
  node.buffer = view
  return node.reshape(shape) if shape != (view.size,) else node

def views_of(buf: Buffer) -> list[Buffer]:
  """`buf`'s base and every view made of it."""
  base = buf._base if buf._base is not None else buf
  return [base, *_views_of.get(base, ())]

# ops a DISK graph may hold: views (turned into buffers here), and copies in or out
_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.SHRINK, Ops.CONTIGUOUS})

def _is_file_node(n: UOp) -> bool:
  """A file buffer, or a copy into a file."""
  return n.op is Ops.BUFFER and is_disk(n.arg[1]) or n.op is Ops.COPY and is_disk(n.arg)

def unwritten_files(roots: list[UOp]) -> list[UOp]:
  """The copies into files that views in the graph under `roots` read: `x.to("disk:f")[0:2]` reads bytes of a file
  that the copy has not written yet, so the scheduler writes it first (as tinygrad does) and the view reads them."""
  found: dict[UOp, None] = {}
  for n in toposort(roots):
    if n.op not in _VIEW_OPS or not is_disk(n.device): continue
    base = n
    while base.op in _VIEW_OPS: base = base.src[0]
    if base.op is Ops.COPY: found[base] = None
  return list(found)

def lower_disk_views(roots: list[UOp]) -> list[UOp]:
  """Scheduler hook: each byte-range view of a file becomes a buffer of its own (a window on the mapping), so copies
  out of it need no kernel; any op on a DISK tensor that would need a kernel raises, naming the op. Views of files
  not written yet are not lowered here (see `unwritten_files`)."""
  nodes = toposort(roots)
  if not any(_is_file_node(n) for n in nodes): return roots
  mapping: dict[UOp, UOp] = {}
  for n in nodes:
    if n.op in (Ops.BUFFER, Ops.COPY, Ops.DEVICE, Ops.CONST) or not is_disk(n.device): continue
    if n.op in GroupOp.Movement and n.base.op is Ops.CONST: continue   # a constant's view: its user is reported
    found = byte_range(n) if n.op in _VIEW_OPS else None
    if found is None: raise disk_op_error(f"{n.op.name.lower()} ({n.meta or 'an op on a DISK tensor'})")
    buf, offset, nbytes = found
    mapping[n] = view_node(buf, offset, n.dtype, n.shape)
  if not mapping: return roots
  return list(substitute(UOp(Ops.SINK, dtypes.void, tuple(roots)), mapping).src)
