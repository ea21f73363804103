"""Turning schedule items into runnable programs and running them."""
from __future__ import annotations
import contextlib, functools, gc, os, sys, time
from dataclasses import dataclass, field
from typing import Callable
from kiln.helpers import (SPEC, NOOPT, DEBUG, VECTORIZE, DISABLE_FAST_IDIV, SPLIT_REDUCEOP, VALIDATE_WITH_CPU, CC,
                          CFLAGS, TC, ALLOW_TF32, GlobalCounters, fmt_time, colored, prod)
from kiln.device import CompilePipeline, Device, Buffer
from kiln.renderer import kernel_signature
from kiln.uop.ops import UOp, Ops, GroupOp
from kiln.uop.sint import sint_str
from kiln.schedule.kernelize import ScheduleItem
from kiln.schedule import cache as schedule_cache
from kiln.codegen import pipeline
from kiln.codegen.gpudims import launch_size
from kiln.codegen.transcendental import TRANSCENDENTAL
from kiln.codegen.opt.kernel import forget_graphs
from kiln.codegen.opt.search import BEAM, choose_opts
from kiln.engine import codegen_cache

@dataclass
class CompiledRunner:
  """A compiled kernel: its program, name and the work it does per launch."""
  name: str
  device: str
  program: object
  source: str
  ops: int
  vars: list[UOp]
  params: tuple[int, ...]   # the schedule item's buffer numbers the kernel takes (a load simplified away drops one)
  launch: tuple | None = None   # (grid, block) sizes on a GPU (kiln/codegen/gpudims.py launch_size); None elsewhere
  # the program's queue-only launcher over this runner's buffer numbers, where it has one (`Program.launcher`): made
  # at the first call without wait, so an eager kernel launched again converts nothing
  _queue: Callable | None = field(default=None, repr=False, compare=False)
  def __call__(self, bufs: list[Buffer], var_vals: dict | None = None, wait: bool = False):
    if not wait and not self.vars:
      if (queue := self._queue) is None and (make := getattr(self.program, "launcher", None)) is not None:
        queue = self._queue = make(self.params, self.launch)
      if queue is not None: return queue(bufs)
    vals = tuple(var_vals[v] for v in self.vars) if self.vars else ()
    if self.launch is None: return self.program(*[bufs[i]._buf for i in self.params], vals=vals, wait=wait)
    return self.program(*[bufs[i]._buf for i in self.params], vals=vals, wait=wait, launch=self.launch)

def kernel_name(ast: UOp) -> str:
  """'E_4_16' for an elementwise kernel over a 4x16 output, 'r_...' when it reduces."""
  store = ast.src[0]
  value = store.src[1]
  reduces = any(u.op is Ops.REDUCE_AXIS for u in value.toposort())
  return ("r_" if reduces else "E_") + "_".join(str(s) if type(s) is int else sint_str(s) for s in value.shape) if value.shape else ("r" if reduces else "E")

def count_ops(uops: list[UOp]) -> int:
  """ALU operations the kernel executes, weighting each by the trip counts of the loops around it (a vector op
  counts its lanes, a fused multiply-add two, a DP4A 4 multiplies and 4 adds per lane and byte-vector pair)."""
  total, trips = 0, 1
  stack = []
  for u in uops:
    if u.op is Ops.SPECIAL: trips *= u.arg[1]   # a GPU launch's threads (before any loop)
    elif u.op is Ops.RANGE:
      n = u.src[0].arg if u.src[0].op is Ops.CONST else 1
      stack.append(n)
      trips *= n
    elif u.op is Ops.ENDRANGE:
      n = stack.pop()
      trips = trips // n if n else prod(stack)
    elif u.op in GroupOp.ALU: total += trips * u.dtype.count * (2 if u.op is Ops.MULACC else 1)   # a multiply and an add
    elif u.op is Ops.DP4A: total += trips * u.dtype.count * 8 * ((len(u.src) - 1) // 2)
  return total

_runner_cache: dict[tuple, CompiledRunner] = {}

def runner_key(device: str, ast: UOp, beam: int = 0) -> tuple:
  """The key of `ast`'s runner in `_runner_cache`: the kernel and the settings that change its code (the C
  compiler and its flags too: a CFLAGS=-march=... changes the target the heuristics plan for)."""
  return (device, ast, TRANSCENDENTAL.value, VECTORIZE.value, NOOPT.value, beam, DISABLE_FAST_IDIV.value,
          SPLIT_REDUCEOP.value, CC.value, CFLAGS.value, TC.value, ALLOW_TF32.value)

def render_lowered(device: str, name: str, lowered: UOp) -> tuple[str, list[UOp]]:
  """The source code and linear uops of a lowered (and optimized) kernel: software math, linearize, render."""
  return render_with(Device[device].renderer, name, lowered)

def render_with(renderer, name: str, lowered: UOp) -> tuple[str, list[UOp]]:
  """`render_lowered` for a renderer rather than a device (a GPU's kernels render on a machine without one): the
  pipeline's stages from map_axes on (kiln/codegen/pipeline.py)."""
  job = pipeline.Job(renderer, name)
  uops = pipeline.run(lowered, renderer, start="map_axes", stop="plan_threads", job=job)
  return pipeline.render(uops, job), uops

def _load(device: str, name: str, source: str, uops: list[UOp], lib: bytes) -> CompiledRunner:
  buffer_params, variables = kernel_signature(uops)   # the order the renderer gives the kernel its arguments
  program = Device[device].runtime(name, lib)
  return CompiledRunner(name, device, program, source, count_ops(uops), variables, tuple(g.arg for g in buffer_params),
                        launch_size(uops))

def compile_lowered(device: str, name: str, lowered: UOp) -> CompiledRunner:
  """Compile a lowered (and optimized) kernel for `device`: render, compile (disk-cached), load."""
  source, uops = render_lowered(device, name, lowered)
  return _load(device, name, source, uops, Device[device].compiler.compile_cached(source))

def compile_many(device: str, jobs: list[tuple[str, UOp]],
                 prepare: Callable[[UOp], UOp] | None = None) -> list[CompiledRunner | Exception]:
  """`compile_lowered` for each (name, lowered kernel), or for each (name, kernel AST) with `prepare` turning the
  AST into the lowered and optimized kernel. Each kernel's source goes to a `CompilePipeline` as soon as it is
  rendered: the kernels missing from the disk cache compile in groups on background threads, one compiler run per
  group where the device's compiler is a separate process, while this thread renders the next kernels. Graph work
  (preparing, rendering, loading) stays on this thread: UOps are hash-consed, and building them from several threads
  at once could make two nodes for one value. A kernel that fails gives its exception in its place."""
  pipeline = CompilePipeline(Device[device].compiler, len(jobs), workers=os.cpu_count() or 1)
  rendered: list = []
  for name, kernel in jobs:
    try:
      source, uops = render_lowered(device, name, prepare(kernel) if prepare is not None else kernel)
      rendered.append((source, uops, pipeline.add(source, name)))
    except Exception as e: rendered.append(e)   # noqa: BLE001  (reported in its place)
  libs = pipeline.results()
  out: list = []
  for (name, _), item in zip(jobs, rendered):
    if isinstance(item, Exception): out.append(item); continue
    source, uops, index = item
    if isinstance(lib := libs[index], Exception): out.append(lib); continue
    try: out.append(_load(device, name, source, uops, lib))
    except Exception as e: out.append(e)   # noqa: BLE001
  return out

def lower_for_codegen(ast: UOp) -> UOp:
  """The pipeline's `lower` stage: what the optimizer and BEAM start from."""
  return pipeline.lower(ast, None)

def _cached_runner(device: str, ast: UOp) -> CompiledRunner | None:
  """The runner of `ast` from its stored codegen result (kiln/engine/codegen_cache.py) and its binary (the compile
  cache, or compiled again), or None when no result is stored."""
  if (entry := codegen_cache.lookup(device, ast)) is None: return None
  try: program = Device[device].runtime(entry.name, Device[device].compiler.compile_cached(entry.source))
  except Exception: return None   # noqa: BLE001  (the kernel is made again, and reports its own error)
  return CompiledRunner(entry.name, device, program, entry.source, entry.ops, [], entry.params, entry.launch)

def _remember(device: str, ast: UOp, runner: CompiledRunner) -> None:
  """Store the codegen result of `ast` for later processes (not for kernels over Variables)."""
  if not runner.vars: codegen_cache.store(device, ast, codegen_cache.CodegenEntry(runner.name, runner.source,
                                                                                  runner.ops, runner.params,
                                                                                  runner.launch))

@contextlib.contextmanager
def _collector_paused():
  """Codegen makes a great many small objects that form no reference cycles (UOps point at their sources only), so
  the cyclic garbage collector's passes over them find nothing: paused while kernels are made (measured: ~10% of
  the anchors' transformer codegen time). Cycles made meanwhile are collected once it runs again. On the way out the
  optimizer's remembered graphs are dropped: kept, the last kernels' graphs (7k nodes after the anchors' transformer)
  would be scanned by every later collection (a 6 ms gen1 pass in the second call, 33 ms full passes after)."""
  try:
    if not gc.isenabled():
      yield
      return
    gc.disable()
    try: yield
    finally: gc.enable()
  finally: forget_graphs()

def get_runner(device: str, ast: UOp, bufs: list[Buffer] | None = None, var_vals: dict | None = None) -> CompiledRunner:
  """The compiled program for `ast` on `device` (compiled once per distinct kernel). With BEAM>=1 and the kernel's
  buffers given, its optimizations are chosen by search (kiln/codegen/opt/search.py) instead of the heuristics."""
  beam = BEAM.value if bufs is not None else 0
  key = runner_key(device, ast, beam)
  if (runner := _runner_cache.get(key)) is not None: return runner
  if beam == 0 and (runner := _cached_runner(device, ast)) is not None:
    _runner_cache[key] = runner
    return runner
  with _collector_paused():
    name, lowered = kernel_name(ast), lower_for_codegen(ast)
    opts = _beam_opts(device, name, lowered, bufs, var_vals or {}, beam) if beam >= 1 and not NOOPT else None
    runner = compile_lowered(device, name, optimize_for(Device[device].renderer, lowered, opts))
  if beam == 0: _remember(device, ast, runner)
  _runner_cache[key] = runner
  return runner

def precompile(items: list[ScheduleItem]) -> None:
  """Compile the not yet compiled kernels of a schedule together, so a C compiler runs on every core (a cold
  transformer graph compiles ~35 kernels). A kernel that fails here is left for the run, which reports it in order."""
  if BEAM.value >= 1: return   # a search times kernels on their real buffers, one kernel at a time
  wanted: dict[str, dict[tuple, UOp]] = {}
  for item in items:
    if item.ast.op in (Ops.COPY, Ops.ALLREDUCE): continue
    device = item.bufs[0].device
    key = runner_key(device, item.ast)
    if key in _runner_cache or key in wanted.get(device, ()): continue   # launched again: looked up once
    if (runner := _cached_runner(device, item.ast)) is not None: _runner_cache[key] = runner
    else: wanted.setdefault(device, {})[key] = item.ast
  for device, asts in wanted.items():
    if len(asts) < 2 or not Device[device].compiler.runs_in_subprocess: continue
    with _collector_paused():   # optimized and rendered one by one, compiled meanwhile (compile_many)
      prepare = functools.partial(_prepare_kernel, renderer=Device[device].renderer)
      runners = compile_many(device, [(kernel_name(ast), ast) for ast in asts.values()], prepare=prepare)
    for (key, ast), runner in zip(asts.items(), runners):
      if isinstance(runner, Exception): continue
      _runner_cache[key] = runner
      _remember(device, ast, runner)

def optimize_for(renderer, lowered: UOp, opts: list | None = None) -> UOp:
  """The pipeline's `optimize` stage for `renderer`: `opts`, or its target's heuristics."""
  return pipeline.optimize(lowered, pipeline.Job(renderer, opts=opts))

def _prepare_kernel(ast: UOp, renderer=None) -> UOp:
  """A kernel AST through the pipeline's `lower` and `optimize` stages for `renderer` (default: the CPU's): what
  `render_lowered` takes."""
  return pipeline.run(ast, renderer if renderer is not None else Device["CPU"].renderer, stop="optimize")

def _beam_opts(device: str, name: str, lowered: UOp, bufs: list[Buffer], var_vals: dict, width: int) -> list:
  """The actions BEAM search picks for `lowered`, timing candidates on scratch copies of `bufs`."""
  compiled: dict[UOp, CompiledRunner | Exception] = {}
  def prepare(sinks: list[UOp]) -> None:
    todo = [s for s in dict.fromkeys(sinks) if s not in compiled]
    for sink, runner in zip(todo, compile_many(device, [(name, s) for s in todo])): compiled[sink] = runner
  def run_sink(sink: UOp, run_bufs: list[Buffer] | None) -> float:
    if sink not in compiled: prepare([sink])
    if isinstance(runner := compiled[sink], Exception): raise runner
    return runner(run_bufs, var_vals, wait=True) if run_bufs is not None else 0.0
  return choose_opts(Device[device], lowered, bufs, run_sink, width, extra_key=str(TRANSCENDENTAL.value),
                     prepare=prepare)

class BufferCopy:
  """A device copy as a runner: `bufs[0]` gets the contents of `bufs[1]` (from byte `offset` on: a contiguous run of
  a larger buffer, read in place); returns the elapsed seconds."""
  name, ops, vars = "copy", 0, []
  def __init__(self, offset: int = 0): self.offset = offset
  def __call__(self, bufs: list[Buffer], var_vals: dict | None = None, wait: bool = False):
    start = time.perf_counter()
    src = bufs[1]
    if self.offset or src.nbytes != bufs[0].nbytes: src = src.view(bufs[0].size, bufs[0].dtype, self.offset)
    bufs[0].copy_from(src)
    return time.perf_counter() - start
BUFFER_COPY = BufferCopy()
_range_copies: dict[int, BufferCopy] = {}

def copy_runner(ast: UOp) -> BufferCopy:
  """The runner of a COPY item: arg is the target device, or (device, the source's byte offset)."""
  if type(ast.arg) is not tuple: return BUFFER_COPY
  offset = ast.arg[1]
  if (runner := _range_copies.get(offset)) is None: runner = _range_copies[offset] = BufferCopy(offset)
  return runner

@dataclass
class ExecItem:
  """One launch as a TinyJit capture records it: the runner, the buffers it got (its `n_out` outputs first) and its
  variables."""
  runner: CompiledRunner | BufferCopy
  bufs: list[Buffer]
  var_vals: dict
  n_out: int = 1

# bound once: `Ops.X` is a metaclass attribute lookup (~130 ns under Python 3.11)
_COPY, _ALLREDUCE = Ops.COPY, Ops.ALLREDUCE

# the TinyJit call in progress (at most one). run_schedule reports each launch to it; Tensor.numpy() raises while set;
# the schedule cache hands out no reused buffers while set (kiln/schedule/cache.py)
capturing: list = []
schedule_cache.recycling_paused = capturing

def _check_against_cpu(item: ScheduleItem, name: str, bufs: list[Buffer], cpu_bufs: list[Buffer], vals: dict) -> None:
  """VALIDATE_WITH_CPU: run the kernel again on the CPU device over `cpu_bufs` (copies of its buffers from before it
  ran) and raise an AssertionError, as tinygrad does, if its output differs from what `bufs[0]` holds."""
  import numpy as np
  get_runner("CPU", item.ast, cpu_bufs, vals)(cpu_bufs, vals, wait=True)
  got, want, where = bufs[0].numpy(), cpu_bufs[0].numpy(), f"{name} on {bufs[0].device} and CPU"
  if got.dtype.kind in "biu": np.testing.assert_array_equal(got, want, err_msg=where)
  else: np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=where)

def run_schedule(items: list[ScheduleItem], var_vals: dict | None = None) -> None:
  """Run each item in order, allocating its buffers first."""
  if len(items) > 1: precompile(items)
  debug = DEBUG.value
  # an item's runner by its kernel: the kernels repeat (the anchors' transformer: 58 launches of 11 kernels), and
  # the lookup in get_runner builds a key of the settings each time
  runners: dict[UOp, CompiledRunner] = {}
  validating = VALIDATE_WITH_CPU.value
  for item in items:
    bufs = item.bufs
    if capturing: capturing[0].note_buffers(bufs)   # before allocating: which buffers existed already
    for b in bufs:
      if b._allocator is None: b.allocate()   # (allocated ones mostly: the call itself costs ~0.25 us)
    if item.ast.op is _COPY:
      copy = BUFFER_COPY if type(item.ast.arg) is not tuple else copy_runner(item.ast)
      elapsed = copy(bufs)
      if capturing: capturing[0].add(ExecItem(copy, list(bufs), {}))
      GlobalCounters.global_mem += bufs[0].nbytes
      if debug >= 2: print(f"*** {bufs[0].device:7s} copy {bufs[0].nbytes:10d} bytes from {bufs[1].device}"
                           f"  {fmt_time(elapsed)}")
      continue
    if item.ast.op is _ALLREDUCE:   # one collective over the devices (kiln/runtime/nccl.py): an output per device
      from kiln.runtime.nccl import all_reduce_runner
      runner = all_reduce_runner(item.ast)
      elapsed = runner(bufs, wait=debug >= 2)
      if capturing: capturing[0].add(ExecItem(runner, list(bufs), {}, item.n_out))
      GlobalCounters.global_mem += sum(b.nbytes for b in bufs)
      if debug >= 2: print(f"*** {'/'.join(runner.devices)} all-reduce {bufs[0].nbytes:10d} bytes  {fmt_time(elapsed)}")
      continue
    device = bufs[0].device
    vals = var_vals or item.var_vals
    if (runner := runners.get(item.ast)) is None or runner.device != device:
      runner = runners[item.ast] = get_runner(device, item.ast, bufs, vals)
    validate = validating and not device.startswith("CPU")
    if validate: cpu_bufs = [Buffer("CPU", b.size, b.dtype, initial_value=b.as_bytes()) for b in bufs]
    elapsed = runner(bufs, vals, wait=debug >= 2)
    if validate: _check_against_cpu(item, runner.name, bufs, cpu_bufs, vals)
    if capturing: capturing[0].add(ExecItem(runner, list(bufs), dict(vals) if vals else {}))
    mem = 0
    for b in bufs: mem += b.nbytes
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += runner.ops
    GlobalCounters.global_mem += mem
    if elapsed is not None: GlobalCounters.time_sum_s += elapsed
    if debug >= 2:
      t = elapsed or 1e-9
      where = f"  {', '.join(item.metadata[:3])}" if item.metadata else ""
      name = colored(runner.name, "cyan" if sys.stdout.isatty() else None)   # no color codes in logs and pipes
      print(f"*** {device:7s} {GlobalCounters.kernel_count:4d} {name:30s} {fmt_time(t)} "
            f"{runner.ops / t / 1e9:9.2f} GFLOP/s {mem / t / 1e9:8.2f} GB/s{where}")
