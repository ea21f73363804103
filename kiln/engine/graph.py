"""Device graphs: a TinyJit replay's launches batched into one submission per run of kernels on one device.

`GraphRunner` is the interface: built once from a capture's launches (and the buffer positions a replay swaps), then
called with no arguments on every replay, reading the swapped buffers from the launches' buffer lists. A device that
can batch kernels registers a subclass in GRAPHS; `batch_launches` cuts a capture into graphs where a device has one
and plain launches elsewhere (copies, devices without a graph).

The CPU graph is a generated C function that calls every kernel of the batch in order through a table of function
pointers, with the buffer addresses in a pointer table (only the swapped entries are rewritten per replay) and the
variable values in an int table: one ctypes call per replay.
"""
from __future__ import annotations
import ctypes, functools
from typing import Callable
from kiln.helpers import DEBUG
from kiln.device import Device, CompileError
from kiln.engine.realize import ExecItem, CompiledRunner

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
    return isinstance(item.runner, CompiledRunner) and hasattr(item.runner.program, "fxn")

  def __init__(self, items: list[ExecItem], swapped: set[tuple[int, int]]):
    super().__init__(items, swapped)
    calls, pointers, values = [], [], []
    self.dynamic: list[tuple[int, list, int]] = []   # (pointer table index, the item's buffer list, position)
    for i, item in enumerate(items):
      runner = item.runner
      args = []
      for pos in runner.params:
        if (i, pos) in swapped: self.dynamic.append((len(pointers), item.bufs, pos))
        args.append(f"p[{len(pointers)}]")
        pointers.append(item.bufs[pos]._buf.ctypes.data)
      for var in runner.vars:
        args.append(f"v[{len(values)}]")
        values.append(int(item.var_vals[var]))
      arg_types = ", ".join(["void*"] * len(runner.params) + ["int"] * len(runner.vars)) or "void"
      calls.append(f"  ((void (*)({arg_types}))f[{i}])({', '.join(args)});")
    source = "void kiln_graph(void **f, void **p, const int *v) {\n" + "\n".join(calls) + "\n}\n"
    device = Device[items[0].runner.device]
    lib = device.compiler.compile_cached(source)
    self.program = device.runtime("kiln_graph", lib)   # keeps the library loaded
    self.program.fxn.argtypes = [ctypes.c_void_p] * 3
    self.functions = (ctypes.c_void_p * len(items))(*[ctypes.cast(it.runner.program.fxn, ctypes.c_void_p).value
                                                      for it in items])
    self.pointers = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
    self.values = (ctypes.c_int * max(1, len(values)))(*values)
    self._call = functools.partial(self.program.fxn, self.functions, self.pointers, self.values)

  def __call__(self) -> None:
    """Rewrite the swapped pointers, then one call into the generated function."""
    pointers = self.pointers
    for index, bufs, pos in self.dynamic: pointers[index] = bufs[pos]._buf.ctypes.data
    self._call()

# device name -> its graph class; a device without an entry replays launch by launch
GRAPHS: dict[str, type[GraphRunner]] = {"CPU": CPUGraph}

def _device_of(item: ExecItem) -> str | None:
  return getattr(item.runner, "device", None)

def plain_launch(item: ExecItem) -> Callable[[], None]:
  """One launch as a callable; it reads `item.bufs` when called, so swapped buffers are seen."""
  return functools.partial(item.runner, item.bufs, item.var_vals)

def batch_launches(items: list[ExecItem], swapped: set[tuple[int, int]]) -> list[Callable[[], None]]:
  """The launches of a replay as callables run in order: each run of two or more consecutive kernels that one
  device's graph supports becomes one GraphRunner; anything else stays a plain launch. A graph that fails to build
  falls back to plain launches."""
  launches: list[Callable[[], None]] = []
  start = 0
  while start < len(items):
    graph = GRAPHS.get((_device_of(items[start]) or "").split(":")[0])
    end = start
    if graph is not None:
      while end < len(items) and _device_of(items[end]) == _device_of(items[start]) and graph.supports(items[end]):
        end += 1
    if end - start >= 2:
      batch = items[start:end]
      local = {(i - start, pos) for i, pos in swapped if start <= i < end}
      try:
        launches.append(graph(batch, local))
        start = end
        continue
      except (CompileError, OSError, AttributeError) as e:
        if DEBUG >= 1: print(f"TinyJit: no {graph.__name__} for {len(batch)} kernels ({e}); replaying them one by one")
    end = max(end, start + 1)
    launches.extend(plain_launch(item) for item in items[start:end])
    start = end
  return launches
