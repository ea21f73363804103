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
import sys, weakref
from typing import Callable
from kiln.device import Buffer
from kiln.helpers import ContextVar, DEEP_RECURSION_LIMIT
from kiln.uop import ops as _ops
from kiln.uop.ops import UOp, Ops, GroupOp, _cache_key_arg

SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1, "1: reuse schedules of graphs with the same structure over other "
                                                 "input buffers (eager dispatch); 0: schedule every graph anew")
MAX_ENTRIES = 512   # templates kept, least recently used dropped first
# the most bytes of buffers a template keeps for reuse between hits (all templates together: 32 MiB at most); above it
# a hit's buffers come from the allocator, whose own cache of freed memory serves them
RECYCLE_MAX_BYTES = 64 << 10
# non-empty while a TinyJit call runs its function: kiln/engine/realize.py makes this its `capturing` list. A capture
# tells a fresh output from state by whether its buffer was allocated before the call (kiln/engine/jit.py), so every
# buffer a schedule makes must be new then
recycling_paused: list = []

# ops whose schedule depends on more than the graph's structure
_UNCACHED_OPS = frozenset({Ops.BIND, Ops.DEFINE_VAR})

class _Template:
  """A schedule with its buffers as numbers into a call's buffer pool: the graph's distinct input Buffers in slot
  order, then the buffers the schedule created (device, size, dtype in `new`). `results` holds per root (k, shape)
  for a view of pool buffer k, (None, None) for a root that was a realized view already, and ("assign", None) for an
  assign; `inputs` and `overwritten` (the slots that assigns write) are slot numbers; `key` is the graph key the
  template is stored under."""
  __slots__ = ("items", "new", "results", "inputs", "overwritten", "key", "recycles", "spare", "used")
  def __init__(self, items: list, new: list[tuple], results: list[tuple], inputs: list[int], overwritten: list[int]):
    self.items, self.new, self.results, self.inputs, self.overwritten = items, new, results, inputs, overwritten
    self.key: tuple = ()
    self.used = 0   # _clock at the last use
    # a small schedule keeps the buffers of its last hit (`spare`) and hands them to the next hit when nothing else
    # holds them any more: its results were dropped, so no tensor, node or view can read them (see `_unheld`)
    self.recycles = sum(size * dtype.itemsize for _, size, dtype in new) <= RECYCLE_MAX_BYTES
    self.spare: list[Buffer] | None = None

# key -> template; least recently used first out: each template remembers the tick of its last use (`used`), so a hit
# reorders nothing (an OrderedDict's move_to_end hashed the key a second time)
_templates: dict = {}
_EVERY_SLOT: list = []   # a template's `inputs` when they are all its slots in order
_clock = [0]
_settings: tuple = ()
stats = {"hits": 0, "misses": 0, "uncached": 0}

def _holds_uop(arg) -> bool:
  if isinstance(arg, UOp): return True
  return isinstance(arg, tuple) and any(_holds_uop(a) for a in arg)

class _Uncacheable(Exception):
  """Raised inside the walk when the graph must be scheduled anew."""

# hot reads in graph_key bound once: `Ops.X` is a metaclass attribute lookup (~130 ns under Python 3.11)
_BUFFER, _UNIQUE, _ASSIGN = Ops.BUFFER, Ops.UNIQUE, Ops.ASSIGN
_SPECIAL_OPS = frozenset({_BUFFER, _UNIQUE, _ASSIGN}) | _UNCACHED_OPS   # entered by _KeyWalk.entry_of
_FLOAT_OR_BOOL = (float, bool)
# device names entry_of found to be no DISK ones: visit_recursive enters their BUFFER nodes itself
_PLAIN_DEVICES: set[str] = set()

# The key of a graph of one new node over leaves that stay as they are: an eager `a + 1` or `x * w` is built afresh
# each call, but its sources (views of realized buffers, constants) are the same nodes, so its key is the one walked
# last time. Memoized by the root's op, dtype, arg and the identity of its sources (weak references: a memo keeps no
# node or buffer alive), for graphs whose every node below the root is a movement op, BUFFER, CONST or DEVICE that
# was never realized: such a node's `forward` is set only when it is realized itself (a realized view never is; a
# constant view only beside other roots), and kiln/tensor.py then bumps `forward_epoch`, which every memo checks.
_STABLE_OPS = GroupOp.Movement | {Ops.BUFFER, Ops.CONST, Ops.DEVICE}
forward_epoch = [0]
_memo: dict[tuple, tuple] = {}
_MEMO_MAX_NODES, _MEMO_MAX_ENTRIES = 32, 1024

def graph_key(roots: list[UOp]) -> tuple[tuple, list[Buffer]] | None:
  """The structure of the graph under `roots` (realized nodes followed to their buffers) with each distinct Buffer
  as a slot number, and the Buffers in slot order; None when the graph must not be cached.

  The structure lists one entry per node, after its sources' entries and in source order: (op, dtype, arg, source
  entry numbers), a BUFFER as (op, dtype, (device, size), slot). A realized node shares its buffer's entry; a UNIQUE
  node inside the graph is its source (as scheduled). The walk recurses (cheapest in Python, to DEEP_RECURSION_LIMIT
  levels: an eager training step's graph is thousands deep); a deeper graph is walked again with an explicit stack.
  (The limit is raised here, not by a `deep_recursion` wrapper: one Python call less on every eager dispatch.) The
  key is a plain tuple: the template lookup is the one place that hashes it."""
  if len(roots) == 1 and (root := roots[0]).forward is None and root.op not in _SPECIAL_OPS:
    arg = root.arg
    memo_key = (root.op, root.dtype, _cache_key_arg(arg) if type(arg) in _FLOAT_OR_BOOL else arg, *map(id, root.src))
    if (memo := _memo.get(memo_key)) is not None and memo[0] == forward_epoch[0] and memo[1] == (_ops.binds_made > 0):
      for ref, src in zip(memo[2], root.src):
        if ref() is not src: break
      else: return memo[3], [ref() for ref in memo[4]]
  else: memo_key = None
  limit = sys.getrecursionlimit()
  if limit < DEEP_RECURSION_LIMIT: sys.setrecursionlimit(DEEP_RECURSION_LIMIT)
  walk = _KeyWalk(roots)
  try:
    try: root_ids = walk.visit_recursive(roots)
    except RecursionError:
      walk = _KeyWalk(roots)
      root_ids = tuple([walk.visit_iterative(r) for r in roots])
  except _Uncacheable: return None
  finally:
    if limit < DEEP_RECURSION_LIMIT: sys.setrecursionlimit(limit)
  key = (tuple(walk.entries), root_ids)
  if memo_key is not None and len(walk.index) <= _MEMO_MAX_NODES and \
     all(node.op in _STABLE_OPS and node.forward is None for node in walk.index if node is not root):
    if len(_memo) >= _MEMO_MAX_ENTRIES: _memo.clear()
    _memo[memo_key] = (forward_epoch[0], walk.symbolic_possible, [weakref.ref(src) for src in root.src], key,
                       [weakref.ref(buf) for buf in walk.buffers])
  return key, walk.buffers

class _KeyWalk:
  """The state of one graph_key walk: entry numbers by node, the entries, and the buffers by slot."""
  __slots__ = ("index", "entries", "slot_of", "buffers", "roots", "symbolic_possible")
  def __init__(self, roots: list[UOp]):
    self.index: dict[UOp, int] = {}
    self.entries: list[tuple] = []
    self.slot_of: dict[int, int] = {}
    self.buffers: list[Buffer] = []
    self.roots = roots   # made a set when a UNIQUE node asks (rare)
    self.symbolic_possible = _ops.binds_made > 0   # no arg can hold a Variable before one was bound

  def visit_recursive(self, roots: list[UOp]) -> tuple[int, ...]:
    """The entry numbers of `roots`, each node's sources visited first by recursion (a closure: its locals are the
    fastest reads in Python). A BUFFER over a plain buffer of a device entry_of has seen, the most common leaf, is entered here
    (entry_of's rule)."""
    index, entries, symbolic_possible, entry_of = self.index, self.entries, self.symbolic_possible, self.entry_of
    slot_of, buffers = self.slot_of, self.buffers
    get, append = index.get, entries.append
    def visit(node: UOp) -> int:   # a node not entered yet (callers look it up first)
      if node.forward is not None:   # realized earlier: read its buffer
        target = _realized(node)
        i = index[node] = visit(target) if (i := get(target)) is None else i
        return i
      op = node.op
      if op is _BUFFER and (buf := node.buffer) is not None and buf._base is None and \
         node.arg[1] in _PLAIN_DEVICES and (not symbolic_possible or not _holds_uop(node.arg)):
        if (slot := slot_of.get(id(buf))) is None:
          slot = slot_of[id(buf)] = len(buffers)
          buffers.append(buf)
        i = index[node] = len(entries)
        append((op, node.dtype, node.arg[1:], slot))
        return i
      if op in _SPECIAL_OPS or (symbolic_possible and _holds_uop(node.arg)):
        if op in _UNCACHED_OPS or (symbolic_possible and _holds_uop(node.arg)): raise _Uncacheable
        entry_of(node, tuple([visit(src) if (i := get(src)) is None else i for src in node.src]))
        return index[node]
      src = node.src
      if len(src) == 1:   # most nodes have one or two sources: no list to build
        if (i := get(src[0])) is None: i = visit(src[0])
        srcs: tuple = (i,)
      elif len(src) == 2:
        if (i := get(src[0])) is None: i = visit(src[0])
        if (j := get(src[1])) is None: j = visit(src[1])
        srcs = (i, j)
      else: srcs = tuple([visit(s) if (i := get(s)) is None else i for s in src])
      arg = node.arg
      if type(arg) is float: arg = (float, arg.hex()) if arg == arg else _cache_key_arg(arg)   # (_cache_key_arg)
      elif type(arg) is bool: arg = (bool, arg)
      i = index[node] = len(entries)
      append((op, node.dtype, arg, srcs))
      return i
    try: return tuple([visit(r) if (i := get(r)) is None else i for r in roots])
    finally: visit = None   # noqa: F841  (the closure refers to itself: a cycle that kept the graph alive until GC)

  def entry_of(self, node: UOp, srcs: tuple) -> None:
    """Enter a node of the rare ops (BUFFER, UNIQUE, ASSIGN) whose sources have the entries `srcs`; raises
    _Uncacheable for a node whose graph must be scheduled anew."""
    op, arg = node.op, node.arg
    if op in _UNCACHED_OPS or (self.symbolic_possible and _holds_uop(arg)): raise _Uncacheable
    if op is _BUFFER:
      buf = node.buffer
      if buf is None or buf._base is not None or arg[1][:4].upper() == "DISK": raise _Uncacheable
      _PLAIN_DEVICES.add(arg[1])
      if (slot := self.slot_of.get(id(buf))) is None:
        slot = self.slot_of[id(buf)] = len(self.buffers)
        self.buffers.append(buf)
      entry: tuple = (op, node.dtype, arg[1:], slot)
    else:
      if op is _ASSIGN and not _target_is_plain_view(node.src[0]): raise _Uncacheable
      if op is _UNIQUE:   # its id is identity, not structure: inside a graph it is its source (as scheduled)
        if type(self.roots) is not set: self.roots = set(self.roots)
        if node not in self.roots:
          self.index[node] = srcs[0]
          return
        arg = None
      entry = (op, node.dtype, _cache_key_arg(arg) if type(arg) in _FLOAT_OR_BOOL else arg, srcs)
    self.index[node] = len(self.entries)
    self.entries.append(entry)

  def visit_iterative(self, root: UOp) -> int:
    """visit(root) with an explicit stack instead of recursion: the same entries in the same order."""
    index, get = self.index, self.index.get
    stack = [root]
    while stack:
      node = stack[-1]
      if node in index:
        stack.pop()
        continue
      if node.forward is not None:
        target = _realized(node)
        if (i := get(target)) is None: stack.append(target)
        else:
          index[node] = i
          stack.pop()
        continue
      srcs = [get(src) for src in node.src]
      if None in srcs:   # sources first, leftmost on top (the node stays below them)
        if node.op in _UNCACHED_OPS or (self.symbolic_possible and _holds_uop(node.arg)): raise _Uncacheable
        stack.extend([src for src, i in zip(reversed(node.src), reversed(srcs)) if i is None])
        continue
      stack.pop()
      if node.op is _BUFFER or node.op is _UNIQUE or node.op is _ASSIGN: self.entry_of(node, tuple(srcs))
      else: self.entry_of_plain(node, tuple(srcs))
    return index[root]

  def entry_of_plain(self, node: UOp, srcs: tuple) -> None:
    """Enter a node of any other op (checked for what makes a graph uncacheable)."""
    op, arg = node.op, node.arg
    if op in _UNCACHED_OPS or (self.symbolic_possible and _holds_uop(arg)): raise _Uncacheable
    self.index[node] = len(self.entries)
    self.entries.append((op, node.dtype, _cache_key_arg(arg) if type(arg) in _FLOAT_OR_BOOL else arg, srcs))

def _realized(node: UOp) -> UOp:
  """The end of a realized node's `forward` chain (a view of its buffer)."""
  target = node.forward
  while target.forward is not None: target = target.forward
  return target

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
  settings = _settings_now()   # a setting may change how graphs are cut
  if settings is not _settings and settings != _settings: _templates.clear(); _settings = settings   # noqa: E702
  template = _templates.get(structure)
  _clock[0] += 1
  if template is None:
    stats["misses"] += 1
    schedule = schedule_fn(roots)
    if (made := _make_template(roots, buffers, schedule)) is not None:
      made.key, made.used = structure, _clock[0]
      _templates[structure] = made
      if len(_templates) > MAX_ENTRIES: _evict()
    return schedule
  stats["hits"] += 1
  template.used = _clock[0]
  if (spare := template.spare) is None or recycling_paused or not _unheld(spare):
    spare = [Buffer(device, size, dtype) for device, size, dtype in template.new]
    if template.recycles and not recycling_paused: template.spare = spare
  pool = buffers + spare
  items = [item_cls(ast, [pool[k] for k in refs], metadata, n_out=n_out)
           for ast, refs, metadata, n_out in template.items]
  results = {}
  for root, (k, shape) in zip(roots, template.results):
    if type(k) is int:
      buf = pool[k]
      node = UOp.new_buffer(buf.device, buf.size, buf.dtype)
      node.buffer = buf
      results[root] = view_fn(node, shape)
    elif k is None: results[root] = root   # a realized view: nothing to compute
    else: results[root] = assign_result_fn(root)   # "assign"
  inputs = buffers if template.inputs is _EVERY_SLOT else [buffers[k] for k in template.inputs]
  return schedule_cls(items, results, inputs, [buffers[k] for k in template.overwritten] if template.overwritten else [])

def _evict() -> None:
  """Drop the least recently used templates down to MAX_ENTRIES."""
  for template in sorted(_templates.values(), key=lambda t: t.used)[:len(_templates) - MAX_ENTRIES]:
    del _templates[template.key]

def _unheld(spare: list[Buffer]) -> bool:
  """Whether nothing but the template's list holds each buffer of `spare` (references: the list, the loop's name and
  getrefcount's argument). A tensor, graph node or view that reads a buffer holds it, so these can be overwritten."""
  for buf in spare:
    if sys.getrefcount(buf) != 3: return False
  return True

# every setting once (an alias names a setting twice in the registry), remade when settings are declared
_setting_vars: list[ContextVar] = []
_registry_size = [-1]

_snapshot: list = [-1, ()]   # (ContextVar.changes when taken, the values then)

def _settings_now() -> tuple:
  """The value of every setting (taken again only after a setting was set or declared)."""
  if _snapshot[0] == ContextVar.changes: return _snapshot[1]
  if _registry_size[0] != len(ContextVar.registry):
    _setting_vars[:] = list({id(v): v for v in ContextVar.registry.values()}.values())
    _registry_size[0] = len(ContextVar.registry)
  _snapshot[:] = [ContextVar.changes, tuple([v.value for v in _setting_vars])]
  return _snapshot[1]

def _make_template(roots: list[UOp], buffers: list[Buffer], schedule) -> _Template | None:
  """The template of `schedule`, or None when it holds something a template cannot express."""
  if len(schedule.results) != len(roots): return None
  slot_of = {id(b): k for k, b in enumerate(buffers)}
  new_of: dict[int, int] = {}
  new: list[tuple] = []
  def ref(buf: Buffer) -> int:
    if (k := slot_of.get(id(buf))) is not None: return k
    if id(buf) not in new_of:
      new_of[id(buf)] = len(buffers) + len(new)
      new.append((buf.device, buf.size, buf.dtype))
    return new_of[id(buf)]
  items = []
  for item in schedule.items:
    if item.var_vals: return None
    items.append((item.ast, [ref(b) for b in item.bufs], item.metadata, item.n_out))
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
    k = ref(result.src[0].buffer)
    if k < len(buffers): return None   # a root's value must live in a buffer of its own
    results.append((k, result.arg))
  inputs, overwritten = [], []
  for buffers_of_schedule, slots in ((schedule.inputs, inputs), (schedule.overwritten, overwritten)):
    for buf in buffers_of_schedule:
      if (k := slot_of.get(id(buf))) is None: return None
      slots.append(k)
  if inputs == list(range(len(buffers))): inputs = _EVERY_SLOT   # (the common case: a hit passes its buffers on)
  return _Template(items, new, results, inputs, overwritten)
