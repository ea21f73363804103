"""The CUDA device (`DEV=CUDA`, `CUDA=1`, `Device["CUDA:1"]`): NVIDIA GPUs through kiln's own driver binding.

Memory is cuMemAlloc'd behind the LRU allocator, kernels are CUDA C (kiln/renderer/cuda.py) compiled by NVRTC to a
CUBIN for the GPU's exact arch (sm_90a on Hopper; disk-cached by source, arch, options and NVRTC version), or with
PTX=1 PTX (kiln/renderer/ptx.py) that the driver compiles when it loads it, and a
program launches with the grid and block sizes its runner carries (kiln/codegen/gpudims.py `launch_size`). All
launches and copies go to the default stream, in order; reading a buffer back waits for the kernels before it.

Importing this module needs no GPU; opening the device where there is none (or no driver, or no NVRTC) raises one
RuntimeError that says what is missing.
"""
from __future__ import annotations
import functools
from kiln.device import Compiled
from kiln.helpers import PTX
from kiln.renderer import kernel_function_name
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
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

class CUDAGraph:
  """TinyJit's graph runner for CUDA (the GraphRunner interface of kiln/engine/graph.py, built from a capture's
  launches and the (item, buffer position) pairs a replay swaps): the batch's kernels as one CUDA graph. A replay
  gives new arguments to the nodes whose buffers or variables changed, then launches the graph: one driver call for
  the whole batch instead of one per kernel."""
  def __init__(self, items: list, swapped: set[tuple[int, int]]):
    self.items, self.swapped = items, swapped
    self.launches = [self._launch(item) for item in items]
    self.graph = cuda.Graph(items[0].runner.program.device.context, self.launches)
    # the nodes a replay may change: swapped buffers, or variables
    self.watched = sorted({i for i, _ in swapped} | {i for i, item in enumerate(items) if item.runner.vars})

  @staticmethod
  def supports(item) -> bool:
    """Compiled CUDA kernels (not copies)."""
    return isinstance(getattr(item.runner, "program", None), CUDAProgram)

  @staticmethod
  def _launch(item) -> tuple:
    """(function, arguments, grid, block) of one captured launch, as its buffers and variables are now."""
    runner = item.runner
    args = (*[item.bufs[i]._buf for i in runner.params], *[int(item.var_vals[v]) for v in runner.vars])
    grid, block = runner.launch if runner.launch is not None else ONE_THREAD
    return runner.program.function, args, grid, block

  def __call__(self) -> None:
    """Update the nodes whose arguments changed since the last replay, then launch the graph."""
    for i in self.watched:
      launch = self._launch(self.items[i])
      if launch[1] != self.launches[i][1]:
        self.graph.set_args(i, *launch)
        self.launches[i] = launch
    self.graph.launch()

class CUDADevice(Compiled):
  """GPU `CUDA:<n>`: its primary context, cuMemAlloc memory, CUDA C compiled by NVRTC for its arch."""
  def __init__(self, device: str = "CUDA"):
    index = device.partition(":")[2] or "0"
    if not index.isdigit(): raise ValueError(f"CUDA: bad device name {device!r} (CUDA, CUDA:0, CUDA:1, ...)")
    try:
      self.context = cuda.Context(int(index))
      if not PTX: cuda.nvrtc()   # found now, so that a missing NVRTC is reported when the device opens
    except cuda.CudaUnavailableError as e: raise RuntimeError(f"cannot open {device}: {e}") from None
    arch = self.context.properties.arch
    # PTX=1: kiln's PTX, compiled by the driver when the module loads; otherwise CUDA C through NVRTC
    renderer, compiler = (PTXRenderer(arch), cuda.PTXCompiler(arch)) if PTX else \
      (CUDARenderer(arch), cuda.NVRTCCompiler(arch))
    super().__init__(device, cuda.CudaAllocator(self.context), renderer, compiler, functools.partial(CUDAProgram, self))

  def synchronize(self) -> None:
    """Wait until every kernel and copy queued on this GPU has finished."""
    self.context.synchronize()
