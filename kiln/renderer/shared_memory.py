"""A GPU block's shared arrays (DEFINE_LOCAL without the "device" scope): static, or one dynamic array over 48 KiB.

A CUDA kernel may declare at most 48 KiB of static shared memory (`__shared__` arrays, PTX `.shared`). A kernel
whose arrays need more declares one dynamic array instead (`extern __shared__`, PTX `.extern .shared`), each array
at its offset in it, and is launched with that many bytes of dynamic shared memory after the driver lets the kernel
use them (cuFuncSetAttribute, up to the GPU's opt-in limit: 227 KiB on the H200). The renderers (kiln/renderer/
cuda.py, ptx.py) declare the arrays from `shared_layout`, and `kiln/codegen/gpudims.py` `launch_size` carries the
byte count with the grid and block sizes (a third element of the launch, only for a dynamic layout), so a kernel
under 48 KiB renders and launches exactly as before.

>>> from kiln.dtype import dtypes
>>> a = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), ("big", 25000))
>>> b = UOp(Ops.DEFINE_LOCAL, dtypes.float16, (), ("small", 3))
>>> layout = shared_layout([a, b])
>>> layout.dynamic, layout.nbytes, layout.offsets[b]
(True, 100006, 100000)
>>> shared_layout([b]).dynamic
False
"""
from __future__ import annotations
from dataclasses import dataclass
from kiln.uop.ops import UOp, Ops

STATIC_SHARED_BYTES = 48 << 10   # the most static shared memory a block may declare (every NVIDIA GPU since sm_20)
SHARED_ALIGN = 16                # each array starts at a multiple of 16 bytes (16-byte vector reads of shared memory)
DYNAMIC_SHARED_NAME = "kiln_shared"   # the one dynamic array a kernel over the static limit declares

@dataclass(frozen=True)
class SharedLayout:
  """A kernel's block-shared arrays: each one's byte offset (in order of appearance, each 16-byte aligned), the
  total bytes, and whether they live in one dynamic array (total over STATIC_SHARED_BYTES)."""
  offsets: dict[UOp, int]
  nbytes: int
  dynamic: bool

def is_block_shared(u: UOp) -> bool:
  """Whether `u` is a shared array of a block (a DEFINE_LOCAL not in module memory)."""
  return u.op is Ops.DEFINE_LOCAL and not (len(u.arg) > 2 and u.arg[2] == "device")

def array_bytes(u: UOp) -> int:
  """The bytes of shared array `u` (its element count times its element size)."""
  return int(u.arg[1]) * u.dtype.itemsize

SWIZZLE_ALIGN = 1024   # an array a TMA copy writes or a WGMMA reads: the 128-byte swizzle's repeat (docs/ir.md)

def swizzled_arrays(uops: list[UOp]) -> set[UOp]:
  """The shared arrays whose address bits a swizzle reads: TMA_LOAD destinations and WGMMA operands."""
  return {s for u in uops if u.op in (Ops.TMA_LOAD, Ops.WGMMA)
          for s in ((u.src[0],) if u.op is Ops.TMA_LOAD else (u.src[0], u.src[2]))}

def shared_layout(uops: list[UOp]) -> SharedLayout:
  """The layout of the block-shared arrays among `uops` (a linearized kernel); swizzled arrays (`swizzled_arrays`)
  at multiples of 1024 bytes."""
  offsets: dict[UOp, int] = {}
  swizzled = swizzled_arrays(uops)
  at = 0
  for u in uops:
    if not is_block_shared(u) or u in offsets: continue
    align = SWIZZLE_ALIGN if u in swizzled else SHARED_ALIGN
    at = -(-at // align) * align
    offsets[u] = at
    at += array_bytes(u)
  return SharedLayout(offsets, at, at > STATIC_SHARED_BYTES)

def dynamic_shared_bytes(uops: list[UOp]) -> int:
  """The dynamic shared memory a launch of the kernel needs: its arrays' bytes where they are over the static
  limit, else 0 (static arrays need none)."""
  layout = shared_layout(uops)
  return layout.nbytes if layout.dynamic else 0
