"""Device graphs: a TinyJit replay's launches batched into one submission per run of kernels on one device.

`GraphRunner` is the interface: built once from a capture's launches (and the buffer positions a replay swaps), then
called with no arguments on every replay, reading the swapped buffers from the launches' buffer lists. A device that
can batch kernels registers a subclass in GRAPHS; `batch_launches` cuts a capture into graphs where a device has one
and plain launches elsewhere (copies, devices without a graph).

The CPU graph is a generated C function that calls every kernel of the batch in order through a table of function
pointers, with the buffer addresses in a pointer table (only the swapped entries are rewritten per replay) and the
variable values in an int table: one ctypes call per replay. A kernel that runs split across threads
(kiln/runtime/ops_cpu.py) is called through the thread pool's `kiln_pool_run` instead (its address is an argument):
every thread runs its chunk and the pool waits for all of them before the next kernel starts, one barrier per kernel.
A split reduction runs its fixed number of chunks, with a scratch buffer (owned by the graph) after its buffers.
"""
from __future__ import annotations
import ctypes, functools
from typing import Callable
from kiln.helpers import DEBUG, JIT_BATCH_SIZE
from kiln.device import Device, CompileError
from kiln.engine.realize import ExecItem, CompiledRunner
from kiln.runtime.threadpool import pool_for, thread_count

class GraphRunner:
  """Runs `items` (kernels of one device, in order) as one submission. `swapped` lists the (item index, buffer
  position) pairs whose Buffer a replay replaces in `items[i].bufs` before calling; every other buffer stays."""
  def __init__(self, items: list[ExecItem], swapped: set[tuple[int, int]]):
    self.items, self.swapped = items, swapped
  @staticmethod
  def supports(item: ExecItem) -> bool:
    """Whether this graph can batch `item`."""
    return False
  def __call__(self) -> None:
    """Run every item once, with the buffers now in the items' buffer lists at the swapped positions."""
    raise NotImplementedError(f"{type(self).__name__} does not implement __call__")

class CPUGraph(GraphRunner):
  """A generated C function that calls each kernel through a function-pointer table, with the buffer addresses from
  a pointer table. Compiled (and disk-cached) once per layout: the source names no address or kernel."""
  @staticmethod
  def supports(item: ExecItem) -> bool:
    """Compiled CPU kernels (not copies)."""
    return isinstance(item.runner, CompiledRunner) and hasattr(item.runner.program, "threads")

  def __init__(self, items: list[ExecItem], swapped: set[tuple[int, int]]):
    super().__init__(items, swapped)
    from kiln.runtime.ops_cpu import host_address   # (the CPU runtime is imported once a CPU graph is built)
    self.host_address = host_address   # an array's address, remembered: `array.ctypes.data` costs ~1 us
    pointers, values, functions = [], [], []
    self.dynamic: list[tuple[int, list, int]] = []   # (pointer table index, the item's buffer list, position)
    self.threads = max(it.runner.program.threads() for it in items)
    self.var_slots: list[tuple[int, dict, object]] = []
    self.scratch: list = []   # split reductions' scratch buffers, kept alive with the graph
    plan: list[tuple] = []   # per kernel: ("pool", i, first pointer, first value, chunks) or ("direct", i, first
                             # pointer, pointer count, first value, value count), rendered by graph_source
    for i, item in enumerate(items):
      runner, program = item.runner, item.runner.program
      first_pointer, first_value = len(pointers), len(values)
      for pos in runner.params:
        if (i, pos) in swapped: self.dynamic.append((len(pointers), item.bufs, pos))
        pointers.append(item.bufs[pos]._buf.ctypes.data)
      # (value table index, the item's var_vals, Variable): a TinyJit replay rewrites var_vals, re-read per call
      self.var_slots.extend((len(values) + k, item.var_vals, var) for k, var in enumerate(runner.vars))
      values.extend(int(item.var_vals[var]) for var in runner.vars)
      threads = program.threads()
      if threads > 1:   # the pool runs the kernel's uniform entry point on every thread, then waits for all
        functions.append(program.task)
        if program.chunks:   # a split reduction: its scratch follows its buffers
          self.scratch.append(program.new_scratch())
          pointers.append(self.scratch[-1].ctypes.data)
        plan.append(("pool", i, first_pointer, first_value, program.pool_chunks()))
        continue
      functions.append(ctypes.cast(program.fxn, ctypes.c_void_p).value)
      plan.append(("direct", i, first_pointer, len(runner.params), first_value, len(runner.vars)))
    device = Device[items[0].runner.device]
    lib = device.compiler.compile_cached(self.graph_source(plan))
    self.program = device.runtime("kiln_graph", lib)   # keeps the library loaded
    self.program.fxn.argtypes = [ctypes.c_void_p] * 5
    self.functions = (ctypes.c_void_p * len(items))(*functions)
    self.pointers = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
    self.values = (ctypes.c_int * max(1, len(values)))(*values)
    self._bind_pool()

  @staticmethod
  def graph_source(plan: list[tuple]) -> str:
    """The C function `kiln_graph(f, p, v, pool, run)` that makes the calls of `plan` in order (see __init__)."""
    run_type = "void (*)(void*, void*, void**, const int*, int)"
    calls = []
    for kind, i, first_pointer, *rest in plan:
      if kind == "pool":
        first_value, chunks = rest
        calls.append(f"  (({run_type})run)(pool, f[{i}], p + {first_pointer}, v + {first_value}, {chunks});")
        continue
      pointers, first_value, values = rest
      args = [f"p[{first_pointer + k}]" for k in range(pointers)] + [f"v[{first_value + k}]" for k in range(values)]
      arg_types = ", ".join(["void*"] * pointers + ["int"] * (values + 2))
      calls.append(f"  ((void (*)({arg_types}))f[{i}])({', '.join(args + ['0', '1'])});")
    return "void kiln_graph(void **f, void **p, const int *v, void *pool, void *run) {\n" + "\n".join(calls) + "\n}\n"

  def _bind_pool(self) -> None:
    """The call with this process's thread pool (again after a fork: the child gets a new pool)."""
    self.pool = pool_for(thread_count()) if self.threads > 1 else None
    handle, run = (self.pool.handle, self.pool.run_function) if self.pool is not None else (None, None)
    # the tables by address: ctypes converts a plain int for a void* parameter faster than an array object
    tables = [ctypes.addressof(table) for table in (self.functions, self.pointers, self.values)]
    self._call = functools.partial(self.program.fxn, *tables, handle, run)

  def __call__(self) -> None:
    """Rewrite the swapped pointers, then one call into the generated function."""
    pointers, address = self.pointers, self.host_address
    for index, bufs, pos in self.dynamic: pointers[index] = address(bufs[pos]._buf)
    if self.var_slots:
      values = self.values
      for index, var_vals, var in self.var_slots: values[index] = var_vals[var]
    if self.pool is not None and not self.pool.alive: self._bind_pool()
    self._call()

class LLVMGraph(CPUGraph):
  """The CPU graph for the LLVM device (the same kernels' entry points and thread pool): its function in LLVM IR."""
  @staticmethod
  def graph_source(plan: list[tuple]) -> str:
    """`kiln_graph(f, p, v, pool, run)` as CPUGraph.graph_source, in LLVM IR."""
    lines = ["define void @kiln_graph(ptr %f, ptr %p, ptr %v, ptr %pool, ptr %run) {", "entry:"]
    for kind, i, first_pointer, *rest in plan:
      lines += [f"  %fp{i} = getelementptr inbounds ptr, ptr %f, i64 {i}", f"  %fn{i} = load ptr, ptr %fp{i}"]
      if kind == "pool":
        first_value, chunks = rest
        lines += [f"  %pp{i} = getelementptr inbounds ptr, ptr %p, i64 {first_pointer}",
                  f"  %vp{i} = getelementptr inbounds i32, ptr %v, i64 {first_value}",
                  f"  call void %run(ptr %pool, ptr %fn{i}, ptr %pp{i}, ptr %vp{i}, i32 {chunks})"]
        continue
      pointers, first_value, values = rest
      args = []
      for k in range(pointers):
        lines += [f"  %p{i}_{k}p = getelementptr inbounds ptr, ptr %p, i64 {first_pointer + k}",
                  f"  %p{i}_{k} = load ptr, ptr %p{i}_{k}p"]
        args.append(f"ptr %p{i}_{k}")
      for k in range(values):
        lines += [f"  %v{i}_{k}p = getelementptr inbounds i32, ptr %v, i64 {first_value + k}",
                  f"  %v{i}_{k} = load i32, ptr %v{i}_{k}p"]
        args.append(f"i32 %v{i}_{k}")
      lines.append(f"  call void %fn{i}({', '.join(args + ['i32 0', 'i32 1'])})")
    return "\n".join(lines + ["  ret void", "}", ""])

# device name -> its graph class; a device without an entry replays launch by launch
GRAPHS: dict[str, type[GraphRunner]] = {"CPU": CPUGraph, "LLVM": LLVMGraph}

def _cuda_graph() -> type:
  from kiln.runtime.ops_cuda import CUDAGraph   # the CUDA graph (one cuGraphLaunch a replay), imported when first used
  return CUDAGraph
# graph classes of devices whose modules are imported only when one of their launches is batched
GRAPH_LOADERS: dict[str, Callable[[], type]] = {"CUDA": _cuda_graph}

def graph_for(device: str) -> type | None:
  """The graph class that batches `device`'s kernels (GRAPHS, else GRAPH_LOADERS), None for launch by launch."""
  base = device.split(":")[0]
  if base not in GRAPHS and base in GRAPH_LOADERS: GRAPHS[base] = GRAPH_LOADERS[base]()
  return GRAPHS.get(base)

def _device_of(item: ExecItem) -> str | None:
  return getattr(item.runner, "device", None)

def plain_launch(item: ExecItem) -> Callable[[], None]:
  """One launch as a callable; it reads `item.bufs` when called, so swapped buffers are seen."""
  return functools.partial(item.runner, item.bufs, item.var_vals)

def batch_launches(items: list[ExecItem], swapped: set[tuple[int, int]]) -> list[Callable[[], None]]:
  """The launches of a replay as callables run in order: each run of two or more consecutive kernels that one
  device's graph supports becomes one GraphRunner (with JIT_BATCH_SIZE=n, the first holds at most n kernels, each
  later one at most twice as many as the one before); anything else stays a plain launch. A graph that fails to build
  falls back to plain launches."""
  launches: list[Callable[[], None]] = []
  start, max_batch = 0, int(JIT_BATCH_SIZE.value)
  while start < len(items):
    graph = graph_for(_device_of(items[start]) or "")
    end = start
    if graph is not None:
      while end < len(items) and _device_of(items[end]) == _device_of(items[start]) and graph.supports(items[end]) \
          and (max_batch <= 0 or end - start < max_batch):
        end += 1
    if end - start >= 2:
      batch = items[start:end]
      local = {(i - start, pos) for i, pos in swapped if start <= i < end}
      try:
        launches.append(graph(batch, local))
        start, max_batch = end, max_batch * 2
        continue
      except (CompileError, OSError, AttributeError) as e:
        if DEBUG >= 1: print(f"TinyJit: no {graph.__name__} for {len(batch)} kernels ({e}); replaying them one by one")
    end = max(end, start + 1)
    launches.extend(plain_launch(item) for item in items[start:end])
    start = end
  return launches
