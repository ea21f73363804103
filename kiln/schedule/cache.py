"""The schedule cache: `create_schedule` results reused for graphs of the same structure over other buffers.

Eager code builds the same graph shapes again and again (`(a + 1).realize()` in a loop, a model's forward pass
without TinyJit). Scheduling depends only on the graph's structure and on which nodes read the same Buffer, never
on the values in the buffers, so a schedule is stored as a template keyed by the graph with its realized buffers
replaced by numbered slots (device, size and dtype kept). A later graph of that key gets the same kernels (the same
AST objects, so the compiled programs are found at once) over its own input buffers and fresh output and
intermediate buffers, shared exactly as the template shares them (memory planning included).

An `assign` is structure too: its target is a slot, so the key says which input buffers are overwritten, and the
run order the scheduler gives it (every kernel reading a buffer's old contents before the kernel that overwrites it,
readers of the new contents after) follows from the graph and from which nodes share a buffer, which the key holds.
A hit overwrites the same slots in place, reports them as overwritten, and gives each assign root the scheduler's
result: its target view over a fresh BUFFER node of the same storage (a new identity, so nodes built on the old
contents never look realized). Not cached: bound Variables (values), DISK buffers and sub-buffer views (byte ranges
of a file or of another buffer), and an assign whose target was realized through another node (`forward`).
`SCHEDULE_CACHE=0` turns the cache off.
"""
from __future__ import annotations
import collections
from typing import Callable
from kiln.device import Buffer
from kiln.helpers import ContextVar
from kiln.uop import ops as _ops
from kiln.uop.ops import UOp, Ops, GroupOp, _cache_key_arg

SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1, "1: reuse schedules of graphs with the same structure over other "
                                                 "input buffers (eager dispatch); 0: schedule every graph anew")
MAX_ENTRIES = 512   # templates kept, least recently used dropped first

# ops whose schedule depends on more than the graph's structure
_UNCACHED_OPS = frozenset({Ops.BIND, Ops.DEFINE_VAR})

class _Template:
  """A schedule with its buffers as references: ("in", slot) for the graph's k-th distinct input Buffer, ("new", j)
  for the j-th buffer the schedule created (device, size, dtype in `new`). `results` holds per root (j, shape) for
  a view of new buffer j, (None, None) for a root that was a realized view already, and ("assign", None) for an
  assign; `overwritten` the slots that assigns write."""
  __slots__ = ("items", "new", "results", "inputs", "overwritten")
  def __init__(self, items: list, new: list[tuple], results: list[tuple], inputs: list[int], overwritten: list[int]):
    self.items, self.new, self.results, self.inputs, self.overwritten = items, new, results, inputs, overwritten

_templates: collections.OrderedDict = collections.OrderedDict()
_settings: tuple = ()
stats = {"hits": 0, "misses": 0, "uncached": 0}

def _holds_uop(arg) -> bool:
  if isinstance(arg, UOp): return True
  return isinstance(arg, tuple) and any(_holds_uop(a) for a in arg)

class _Uncacheable(Exception):
  """Raised inside the walk when the graph must be scheduled anew."""

# hot reads in graph_key bound once: `Ops.X` is a metaclass attribute lookup (~130 ns under Python 3.11)
_BUFFER, _UNIQUE, _ASSIGN = Ops.BUFFER, Ops.UNIQUE, Ops.ASSIGN
_FLOAT_OR_BOOL = (float, bool)

def graph_key(roots: list[UOp]) -> tuple[tuple, list[Buffer]] | None:
  """The structure of the graph under `roots` (realized nodes followed to their buffers) with each distinct Buffer
  as a slot number, and the Buffers in slot order; None when the graph must not be cached."""
  index: dict[UOp, int] = {}
  entries: list[tuple] = []
  slot_of: dict[int, int] = {}
  buffers: list[Buffer] = []
  symbolic_possible = _ops.binds_made > 0   # no arg can hold a Variable before one was bound
  # a post-order walk with an explicit stack (a sort's network of small steps is deeper than Python's recursion
  # limit): a node's entry comes after its sources', in source order; a realized node shares its buffer's entry
  stack = list(reversed(roots))
  pop, push, get = stack.pop, stack.append, index.get
  root_set = set(roots)
  try:
    while stack:
      node = stack[-1]
      if node in index:
        pop()
        continue
      if node.forward is not None:   # realized earlier: read its buffer
        target = node.forward
        while target.forward is not None: target = target.forward
        if (i := get(target)) is None: push(target)
        else:
          index[node] = i
          pop()
        continue
      op, arg = node.op, node.arg
      if op is _BUFFER:
        buf = node.buffer
        if buf is None or buf._base is not None or arg[1][:4].upper() == "DISK": raise _Uncacheable
        if (slot := slot_of.get(id(buf))) is None:
          slot = slot_of[id(buf)] = len(buffers)
          buffers.append(buf)
        entry: tuple = (op, node.dtype, arg[1:], slot)
      else:
        srcs = [get(src) for src in node.src]
        if None in srcs:   # sources first, leftmost on top (the node stays below them)
          if op in _UNCACHED_OPS or (symbolic_possible and _holds_uop(arg)): raise _Uncacheable
          stack.extend([src for src, i in zip(reversed(node.src), reversed(srcs)) if i is None])
          continue
        if op in _UNCACHED_OPS or (symbolic_possible and _holds_uop(arg)): raise _Uncacheable
        if op is _ASSIGN and not _target_is_plain_view(node.src[0]): raise _Uncacheable
        if op is _UNIQUE:   # its id is identity, not structure: inside a graph it is its source (as scheduled)
          if node not in root_set:
            index[node] = srcs[0]
            pop()
            continue
          arg = None
        entry = (op, node.dtype, _cache_key_arg(arg) if type(arg) in _FLOAT_OR_BOOL else arg, tuple(srcs))
      pop()
      index[node] = len(entries)
      entries.append(entry)
  except _Uncacheable: return None
  root_ids = tuple([index[r] for r in roots])
  return (tuple(entries), root_ids), buffers

def _target_is_plain_view(target: UOp) -> bool:
  """An assign's target is movement ops over a BUFFER node, none of them realized through another node: a hit can
  then build the assign's result from the new graph's target alone, as the scheduler does."""
  while target.forward is None and target.op in GroupOp.Movement: target = target.src[0]
  return target.forward is None and target.op is _BUFFER

def cached_schedule(roots: list[UOp], schedule_fn: Callable, item_cls: type, schedule_cls: type, view_fn: Callable,
                    assign_result_fn: Callable):
  """`schedule_fn(roots)`, served from a template when a graph of the same structure was scheduled before.

  `item_cls`/`schedule_cls` build the ScheduleItems and the Schedule, `view_fn(buffer_node, shape)` the node a
  root's value lives in, `assign_result_fn(assign_root)` the node an assign root's updated buffer is read through
  (the scheduler's own functions, so a hit gives exactly what scheduling would)."""
  global _settings
  if not SCHEDULE_CACHE.value: return schedule_fn(roots)
  found = graph_key(roots)
  if found is None:
    stats["uncached"] += 1
    return schedule_fn(roots)
  structure, buffers = found
  settings = tuple(v.value for v in ContextVar.registry.values())   # a setting may change how graphs are cut
  if settings != _settings: _templates.clear(); _settings = settings   # noqa: E702
  template = _templates.get(structure)
  if template is None:
    stats["misses"] += 1
    schedule = schedule_fn(roots)
    if (made := _make_template(roots, buffers, schedule)) is not None:
      _templates[structure] = made
      while len(_templates) > MAX_ENTRIES: _templates.popitem(last=False)
    return schedule
  stats["hits"] += 1
  _templates.move_to_end(structure)
  new = [Buffer(device, size, dtype) for device, size, dtype in template.new]
  def buffer(ref: tuple) -> Buffer: return buffers[ref[1]] if ref[0] == "in" else new[ref[1]]
  items = [item_cls(ast, [buffer(r) for r in refs], metadata) for ast, refs, metadata in template.items]
  results = {}
  for root, (j, shape) in zip(roots, template.results):
    if j is None: results[root] = root   # a realized view: nothing to compute
    elif j == "assign": results[root] = assign_result_fn(root)
    else:
      node = UOp.new_buffer(new[j].device, new[j].size, new[j].dtype)
      node.buffer = new[j]
      results[root] = view_fn(node, shape)
  return schedule_cls(items, results, [buffers[k] for k in template.inputs], [buffers[k] for k in template.overwritten])

def _make_template(roots: list[UOp], buffers: list[Buffer], schedule) -> _Template | None:
  """The template of `schedule`, or None when it holds something a template cannot express."""
  if len(schedule.results) != len(roots): return None
  slot_of = {id(b): k for k, b in enumerate(buffers)}
  new_of: dict[int, int] = {}
  new: list[tuple] = []
  def ref(buf: Buffer) -> tuple:
    if (k := slot_of.get(id(buf))) is not None: return ("in", k)
    if id(buf) not in new_of:
      new_of[id(buf)] = len(new)
      new.append((buf.device, buf.size, buf.dtype))
    return ("new", new_of[id(buf)])
  items = []
  for item in schedule.items:
    if item.var_vals: return None
    items.append((item.ast, [ref(b) for b in item.bufs], item.metadata))
  results = []
  for root in roots:
    result = schedule.results[root]
    if result is root:
      results.append((None, None))
      continue
    if root.op is Ops.ASSIGN:
      results.append(("assign", None))
      continue
    if result.op is not Ops.RESHAPE or result.src[0].op is not Ops.BUFFER or result.src[0].buffer is None: return None
    kind, j = ref(result.src[0].buffer)
    if kind != "new": return None
    results.append((j, result.arg))
  inputs, overwritten = [], []
  for buffers_of_schedule, slots in ((schedule.inputs, inputs), (schedule.overwritten, overwritten)):
    for buf in buffers_of_schedule:
      if (k := slot_of.get(id(buf))) is None: return None
      slots.append(k)
  return _Template(items, new, results, inputs, overwritten)
