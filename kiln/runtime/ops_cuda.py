"""The CUDA device (`DEV=CUDA`, `CUDA=1`, `Device["CUDA:1"]`): NVIDIA GPUs through kiln's own driver binding.

Memory is cuMemAlloc'd behind the LRU allocator, kernels are CUDA C (kiln/renderer/cuda.py) compiled by NVRTC to a
CUBIN for the GPU's exact arch (sm_90a on Hopper; disk-cached by source, arch, options and NVRTC version), and a
program launches with the grid and block sizes its runner carries (kiln/codegen/gpudims.py `launch_size`). All
launches and copies go to the default stream, in order; reading a buffer back waits for the kernels before it.

Importing this module needs no GPU; opening the device where there is none (or no driver, or no NVRTC) raises one
RuntimeError that says what is missing.
"""
from __future__ import annotations
import functools
from kiln.device import Compiled
from kiln.renderer import kernel_function_name
from kiln.renderer.cuda import CUDARenderer
from kiln.runtime import cuda_driver as cuda

Launch = tuple[tuple[int, int, int], tuple[int, int, int]]
ONE_THREAD: Launch = ((1, 1, 1), (1, 1, 1))   # a kernel without thread indices (a full reduction, for now)

class CUDAProgram:
  """A kernel loaded from its CUBIN. Call as `prg(*device_memory, vals=(ints...), wait=False, launch=(grid, block))`;
  with wait=True it returns the kernel's time in seconds, measured with CUDA events."""
  def __init__(self, device: CUDADevice, name: str, lib: bytes):
    self.device, self.name = device, kernel_function_name(name)
    self.module = device.context.load(lib)
    self.function = self.module.function(self.name)
    self._events: tuple[cuda.Event, cuda.Event] | None = None

  def __call__(self, *bufs, vals: tuple[int, ...] = (), wait: bool = False, launch: Launch | None = None):
    """Queue the kernel on the default stream (and, with wait=True, wait for it and return its seconds)."""
    grid, block = launch if launch is not None else ONE_THREAD
    if not wait:
      self.function.launch(*bufs, *vals, grid=grid, block=block)
      return None
    if self._events is None: self._events = (self.device.context.event(), self.device.context.event())
    start, end = self._events
    start.record()
    self.function.launch(*bufs, *vals, grid=grid, block=block)
    end.record()
    end.synchronize()
    return start.elapsed_ms(end) / 1e3

class CUDADevice(Compiled):
  """GPU `CUDA:<n>`: its primary context, cuMemAlloc memory, CUDA C compiled by NVRTC for its arch."""
  def __init__(self, device: str = "CUDA"):
    index = device.partition(":")[2] or "0"
    if not index.isdigit(): raise ValueError(f"CUDA: bad device name {device!r} (CUDA, CUDA:0, CUDA:1, ...)")
    try:
      self.context = cuda.Context(int(index))
      cuda.nvrtc()   # found now, so that a missing NVRTC is reported when the device opens, not at the first kernel
    except cuda.CudaUnavailableError as e: raise RuntimeError(f"cannot open {device}: {e}") from None
    arch = self.context.properties.arch
    super().__init__(device, cuda.CudaAllocator(self.context), CUDARenderer(arch), cuda.NVRTCCompiler(arch),
                     functools.partial(CUDAProgram, self))

  def synchronize(self) -> None:
    """Wait until every kernel and copy queued on this GPU has finished."""
    self.context.synchronize()
