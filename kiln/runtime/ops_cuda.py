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
import collections, functools
from typing import Any, Callable
from kiln.device import Compiled
from kiln.helpers import PTX
from kiln.renderer import kernel_function_name
from kiln.renderer.cuda import CUDARenderer, DEPENDENT_WAIT
from kiln.renderer.ptx import PTXRenderer
from kiln.runtime import cuda_driver as cuda, gpu_target

# (grid, block), or (grid, block, bytes) for a kernel over 48 KiB of shared memory (kiln/renderer/shared_memory.py)
Launch = tuple
ONE_THREAD: Launch = ((1, 1, 1), (1, 1, 1))   # a kernel without thread indices (a full reduction, for now)

class CUDAProgram:
  """A kernel loaded from its CUBIN. Call as `prg(*device_memory, vals=(ints...), wait=False, launch=(grid, block))`;
  with wait=True it returns the kernel's time in seconds, measured with CUDA events. The argument block of each
  launch shape (buffer and value counts, grid and block) is packed once and rewritten in place by later calls
  (cuda.PackedLaunch)."""
  def __init__(self, device: CUDADevice, name: str, lib: bytes):
    self.device, self.name = device, kernel_function_name(name)
    self.module = device.context.load(lib)
    self.function = self.module.function(self.name)
    self._events: tuple[cuda.Event, cuda.Event] | None = None
    self._packed: dict[tuple, cuda.PackedLaunch] = {}

  def packed(self, bufs: tuple, vals: tuple[int, ...] = (), launch: Launch | None = None) -> cuda.PackedLaunch:
    """The launch of this kernel over `bufs` (DeviceMemory) and `vals` with `launch`'s sizes, its arguments packed:
    a new PackedLaunch (not the one `__call__` reuses), for a caller that keeps it."""
    grid, block, *shared = launch if launch is not None else ONE_THREAD   # (grid, block[, dynamic shared bytes])
    return cuda.PackedLaunch(self.function, (*bufs, *vals), grid, block, shared[0] if shared else 0)

  def launcher(self, params: tuple[int, ...], launch: Launch | None = None) -> Callable[[list], None]:
    """A function that queues this kernel over `bufs[i]._buf` for each buffer number i in `params` (a schedule
    item's kiln Buffers, allocated) with `launch`'s sizes and no variables: its own argument block, packed at the
    first call and rewritten in place by later ones (the eager hot path: nothing converted, no key built)."""
    packed: list[cuda.PackedLaunch] = []
    def queue(bufs: list) -> None:
      if not packed: packed.append(self.packed(tuple(bufs[i]._buf for i in params), (), launch))
      else:
        values = packed[0].values
        for k, i in enumerate(params): values[k].value = bufs[i]._buf.ptr
      packed[0].launch()
    return queue

  def __call__(self, *bufs, vals: tuple[int, ...] = (), wait: bool = False, launch: Launch | None = None):
    """Queue the kernel on the default stream (and, with wait=True, wait for it and return its seconds)."""
    key = (len(bufs), len(vals), launch)
    if (packed := self._packed.get(key)) is None: packed = self._packed[key] = self.packed(bufs, vals, launch)
    else:
      values = packed.values
      for k, buf in enumerate(bufs): values[k].value = buf.ptr
      for k, val in enumerate(vals, len(bufs)): values[k].value = val
    if not wait:
      packed.launch()
      return None
    if self._events is None: self._events = (self.device.context.event(), self.device.context.event())
    start, end = self._events
    start.record()
    packed.launch()
    end.record()
    end.synchronize()
    return start.elapsed_ms(end) / 1e3

def kernel_dependencies(items: list, swapped: set[tuple[int, int]]) -> list[list[int]]:
  """For each captured launch, the earlier launches it must wait for, from the memory they use: every earlier writer
  of memory it reads or writes, and every earlier reader of memory it writes (a kernel writes its first buffer and
  reads the others). Memory is a byte range of an allocation (a view is its range of its base), and the buffers a
  replay swaps in (inputs, fresh outputs) all count as one allocation, since a replay may bring views of one memory
  there. Two launches of one grid-wide reduction wait for each other (it keeps its arrival counter and partial
  sums in module memory, `kiln_arrivals`). Launches that wait for none of each other may run at the same time.
  An access inside the range of a later write is forgotten once that write is recorded: waiting for the write
  waits for it.

  >>> from types import SimpleNamespace as N
  >>> buf = lambda n: N(_base=None, _offset=0, nbytes=n)
  >>> a, b, c, d = buf(4), buf(4), buf(4), buf(4)
  >>> item = lambda *bufs: N(bufs=list(bufs), runner=N(program=object(), source=''))
  >>> kernel_dependencies([item(b, a), item(c, a), item(d, b, c), item(a, d)], set())
  [[], [], [0, 1], [0, 1, 2]]
  """
  writes: dict[object, list[tuple[int, int, int]]] = {}   # allocation -> (start, end, launch) of each write
  reads: dict[object, list[tuple[int, int, int]]] = {}
  last_of_program: dict[int, int] = {}
  deps: list[list[int]] = []
  for i, item in enumerate(items):
    regions = []
    for pos, buf in enumerate(item.bufs):
      if (i, pos) in swapped: regions.append(("swapped", 0, 1 << 62))
      else:
        base = buf._base if buf._base is not None else buf
        regions.append((id(base), buf._offset, buf._offset + max(1, buf.nbytes)))
    waits: set[int] = set()
    for key, lo, hi in regions:   # earlier writes of anything this launch touches
      waits.update(j for a, b, j in writes.get(key, ()) if a < hi and lo < b)
    key, lo, hi = regions[0]      # earlier reads of what it writes
    waits.update(j for a, b, j in reads.get(key, ()) if a < hi and lo < b)
    if "kiln_arrivals" in getattr(item.runner, "source", ""):   # module memory (kiln/codegen/gpudims.py)
      program = id(item.runner.program)
      if program in last_of_program: waits.add(last_of_program[program])
      last_of_program[program] = i
    for key, lo, hi in regions[1:]: reads.setdefault(key, []).append((lo, hi, i))
    # a write stands for the accesses inside its range from now on (whoever waits for it waits for them): dropped
    key, lo, hi = regions[0]
    reads[key] = [r for r in reads.get(key, ()) if not (lo <= r[0] and r[1] <= hi) or r[2] == i]
    writes[key] = [w for w in writes.get(key, ()) if not (lo <= w[0] and w[1] <= hi)] + [(lo, hi, i)]
    waits.discard(i)
    deps.append(sorted(waits))
  return deps

class CUDAGraph:
  """TinyJit's graph runner for CUDA (the GraphRunner interface of kiln/engine/graph.py, built from a capture's
  launches and the (item, buffer position) pairs a replay swaps): the batch's kernels as one CUDA graph, each
  kernel's argument block packed once. A replay reads the arguments that can change (swapped buffers' addresses,
  variables' values) into one tuple and launches the graph's executable for that tuple: up to MAX_EXECS
  executables are kept, so a replay whose fresh outputs alternate between two buffers (the last replay's outputs
  are alive while the next allocates) updates no node. A new tuple updates the changed nodes of the least recently
  used executable (or of a new one), then launches it: one driver call for the whole batch in the common case. The
  nodes form a chain, each after the one before (or, with PARALLEL, the DAG of `kernel_dependencies`).
  New executables are made only for graphs of at most MAX_INSTANTIATED_NODES kernels: instantiating a large one
  costs milliseconds (an LLM decode step's 338 kernels, inferred from call 21 of bench/gpu_notes.md), updating the
  one node its fresh output changes costs microseconds."""
  MAX_EXECS = 4
  MAX_INSTANTIATED_NODES = 32
  # True: nodes wait only for the nodes whose memory they use (`kernel_dependencies`). Off: on the H200 the LLM decode
  # step ran slower as that DAG than as a chain (bench/gpu_notes.md call 24: 573-595 against 636-661 tok/s, graph
  # launch 37-49 against 6-13 us, prefill 1356-1407 against 1926-2197 tok/s)
  PARALLEL = False
  # True: a kernel's edges are programmatic (programmatic dependent launch) where it starts with the renderer's
  # `griddepcontrol.wait` (kiln/renderer/cuda.py), so its launch overlaps the previous kernel's end. H200
  # (bench/gpu_notes.md call 29, each kernel letting the next start at its own end): the LLM decode step's graph
  # 712 -> 655 us, every kernel of it cheaper (with the trigger at the kernels' start, call 28: larger ones dearer)
  PROGRAMMATIC = True

  def __init__(self, items: list, swapped: set[tuple[int, int]]):
    self.items, self.swapped = items, swapped
    self.context = items[0].runner.program.device.context
    launches = [self._packed(item) for item in items]
    self.dependencies = kernel_dependencies(items, swapped) if self.PARALLEL else [[i - 1] if i else [] for i in
                                                                                     range(len(items))]
    programmatic = [self.PROGRAMMATIC and i > 0 and DEPENDENT_WAIT in getattr(item.runner, "source", "")
                    for i, item in enumerate(items)]
    self.graph = cuda.Graph(self.context, launches, self.dependencies, programmatic)
    # what a replay re-reads: the swapped buffers' addresses (bufs[pos]._buf.ptr), then the variables' values
    # (var_vals[var]); `slots` says which node and argument each one is, in the same order
    self.slots: list[tuple[int, int]] = []
    self._buffer_reads: list[tuple[list, int]] = []
    self._var_reads: list[tuple[dict, Any]] = []
    for i, item in enumerate(items):
      for k, pos in enumerate(item.runner.params):
        if (i, pos) in swapped: self.slots.append((i, k)); self._buffer_reads.append((item.bufs, pos))
    for i, item in enumerate(items):
      runner = item.runner
      for k, var in enumerate(runner.vars, len(runner.params)):
        self.slots.append((i, k)); self._var_reads.append((item.var_vals, var))
    self.state = self._read()   # the arguments the nodes were added with: every executable starts so
    self.execs: collections.OrderedDict[tuple, int] = collections.OrderedDict({self.state: self.graph.exec})

  @staticmethod
  def supports(item) -> bool:
    """Compiled CUDA kernels (not copies)."""
    return isinstance(getattr(item.runner, "program", None), CUDAProgram)

  @staticmethod
  def _packed(item) -> cuda.PackedLaunch:
    """One captured launch, its arguments as its buffers and variables are now."""
    runner = item.runner
    bufs = tuple(item.bufs[i]._buf for i in runner.params)
    return runner.program.packed(bufs, tuple(int(item.var_vals[v]) for v in runner.vars), runner.launch)

  def _read(self) -> tuple:
    """The changing arguments as they are now (buffer addresses and variable values, in slot order)."""
    addresses = [bufs[pos]._buf.ptr for bufs, pos in self._buffer_reads]
    if not self._var_reads: return tuple(addresses)
    return tuple(addresses + [int(var_vals[var]) for var_vals, var in self._var_reads])

  def _exec_for(self, state: tuple) -> int:
    """An executable whose nodes hold the arguments `state`: the least recently used one (or a new one while fewer
    than MAX_EXECS exist, for a small graph) with the nodes whose arguments differ updated."""
    if len(self.execs) < self.MAX_EXECS and len(self.items) <= self.MAX_INSTANTIATED_NODES:
      old, handle = self.state, self.graph.instantiate()
    else: old, handle = self.execs.popitem(last=False)
    changed = sorted({i for (i, _), was, now in zip(self.slots, old, state) if was != now})
    packed = self.graph.packed
    for (i, k), now in zip(self.slots, state): packed[i].values[k].value = now
    self.context.activate()
    for i in changed: self.graph.update(handle, i)
    self.execs[state] = handle
    return handle

  def __call__(self) -> None:
    """Launch the executable for the arguments as they are now (made or updated first when there is none)."""
    if not self.slots: state: tuple = ()
    elif not self._var_reads: state = tuple([bufs[pos]._buf.ptr for bufs, pos in self._buffer_reads])   # (_read)
    else: state = self._read()
    execs = self.execs
    if (handle := execs.get(state)) is None: handle = self._exec_for(state)
    elif len(execs) > 1: execs.move_to_end(state)
    self.context.activate()
    self.graph.launch_exec(handle)

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
    # what the GPU heuristics read (kiln/runtime/gpu_target.py): this GPU's arch and multiprocessors
    target = gpu_target.for_device(arch, self.context.properties.sm_count,
                                   shared_optin=self.context.properties.max_shared_per_block)
    renderer.describe_target = lambda: target

  def synchronize(self) -> None:
    """Wait until every kernel and copy queued on this GPU has finished."""
    self.context.synchronize()
