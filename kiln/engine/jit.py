"""TinyJit: capture the kernels a function launches and replay them on later calls, never silently wrong.

Call 1 of a guard signature runs the function eagerly; call 2 runs it eagerly again while recording every launch
(runner, buffers, variable values); calls 3+ replay the recorded launches with the new input buffers swapped in,
without building or scheduling any graph. Every call first checks guards (the structure of the arguments, each input
tensor's shape/dtype/device/view, which inputs share a buffer, Python scalars and the identity of other objects in the
arguments, and the Python state the capture read); a mismatch re-captures, a change a replay cannot repeat raises.
See docs/jit.md.
"""
from __future__ import annotations
import collections, dis, functools, sys, types
from typing import Any, Callable, Generic, TypeVar
import numpy as np
from kiln.device import Buffer, Device
from kiln.dtype import DType, dtypes
from kiln.helpers import JIT, DEBUG, GlobalCounters
from kiln.uop import ops as _ops
from kiln.uop.ops import UOp, Ops, GroupOp, toposort
from kiln.uop.pattern import substitute
from kiln.schedule import multi as _multi
from kiln.engine.realize import ExecItem, capturing
from kiln.engine.graph import batch_launches, plain_launch
from kiln.tensor import Tensor, _forget_results_computed_from, _tensor_around, _computed_from

ReturnType = TypeVar("ReturnType")
_BUFFER, _MULTI = Ops.BUFFER, Ops.MULTI   # bound once: `Ops.X` is a metaclass attribute lookup
# what each output of a capture is (CapturedJit.outputs), compared by identity in `replay`
_INPUT, _FRESH, _FIXED = "input", "fresh", "fixed"

SCALARS = (int, float, bool, str, bytes, complex, type(None))
MAX_CAPTURES = 8        # captures kept per TinyJit (one per guard signature), least recently used dropped first
STATE_DEPTH = 5         # how deep into closures, globals and argument objects the state guard looks
STATE_BUDGET = 20000    # at most this many values visited per state walk
ARRAY_GUARD_BYTES = 1 << 20   # numpy arrays in the state up to this size are guarded by contents, larger by identity

# ---------------- the record of one jitted call ----------------

class _Recorder:
  """What run_schedule reports to while a jitted function runs: launches (when recording) and, per buffer, whether
  it was already allocated the first time a launch used it (it existed before the call: state, inputs, constants)."""
  def __init__(self, name: str, recording: bool):
    self.name, self.recording = name, recording
    self.items: list[ExecItem] = []
    self.launches = 0   # counted on every call, so a function that launches nothing is refused at its first call
    self.existed: dict[int, bool] = {}
  def note_buffers(self, bufs: list[Buffer]) -> None:
    if not self.recording: return
    for b in bufs:
      if id(b) not in self.existed: self.existed[id(b)] = b.is_allocated()
  def add(self, item: ExecItem) -> None:
    self.launches += 1
    if self.recording: self.items.append(item)

# ---------------- guard signatures ----------------

_TENSOR = object()   # marks a tensor's place in the argument structure

def _describe(x: Any, tensors: list[Tensor], objects: list[Any], binds: list[UOp]) -> Any:
  """A hashable description of an argument: its structure, scalar values, and the identity of other objects;
  tensors are collected into `tensors`, bound Variables into `binds` (described by their Variable, not the value)
  and other objects into `objects` (in order)."""
  kind = type(x)
  if kind is Tensor:
    if type(x.uop.device) is tuple: return _describe_multi(x, tensors)
    tensors.append(x)
    return _TENSOR
  if kind in SCALARS:
    return (kind, "nan") if x != x else (kind, x)
  if isinstance(x, np.generic): return (kind, x.tobytes())   # numpy scalars by their exact bits
  if kind is list or kind is tuple: return (kind, tuple([_describe(v, tensors, objects, binds) for v in x]))
  if kind is dict: return (dict, tuple([(k, _describe(v, tensors, objects, binds)) for k, v in x.items()]))
  if kind is UOp and x.op is Ops.BIND:
    binds.append(x)
    return ("var", x.src[0])
  if isinstance(x, Tensor):
    if type(x.uop.device) is tuple: return _describe_multi(x, tensors)
    tensors.append(x)
    return _TENSOR
  if isinstance(x, DType): return x
  if isinstance(x, (list, tuple)): return (kind, tuple([_describe(v, tensors, objects, binds) for v in x]))
  if isinstance(x, dict): return (kind, tuple([(k, _describe(v, tensors, objects, binds)) for k, v in x.items()]))
  objects.append(x)
  return ("object", id(x))

def _describe_multi(t: Tensor, tensors: list[Tensor]) -> Any:
  """A tensor over several devices: its slices join `tensors` (each a tensor of one device), its layout is in the
  description. A lazy one is realized first (a replay needs buffers)."""
  if t.uop.op is not _MULTI or not all(s.base.op is _BUFFER for s in t.uop.src): t.realize()
  tensors.extend(_tensor_around(s) for s in t.uop.src)
  return ("multi", t.uop.arg, len(t.uop.src))

def _tensor_signature(t: Tensor) -> tuple:
  """(dtype, device, buffer size, the movement ops from the buffer to the tensor): what a kernel bakes in."""
  u = t.uop
  chain = []
  while u.op in GroupOp.Movement:
    chain.append((u.op, u.arg))
    u = u.src[0]
  return (u.dtype, u.arg[1], u.arg[2], tuple(chain))

def _call_variables(binds: list[UOp], signatures: tuple) -> tuple[tuple, dict[UOp, int]]:
  """The values of this call's bound Variables (from arguments and from symbolic views of input tensors), and the
  tensor signatures with each BIND replaced by its Variable, so a new value keys the same capture."""
  var_vals: dict[UOp, int] = {}
  def take(bind: UOp, where: str) -> UOp:
    var, value = bind.src[0], bind.src[1].arg
    name, lo, hi = var.arg
    if not lo <= value <= hi:
      raise ValueError(f"TinyJit: {where} binds Variable {name!r} to {value}, outside its range [{lo}, {hi}]")
    if var_vals.setdefault(var, value) != value:
      raise ValueError(f"TinyJit: Variable {name!r} is bound to both {var_vals[var]} and {value} in one call ({where})")
    return var
  for b in binds: take(b, "an argument")
  if not any(_has_uop(sig[3]) for sig in signatures): return signatures, var_vals
  out = []
  for k, sig in enumerate(signatures):
    if _has_uop(sig[3]):
      chain, mapping = sig[3], {}
      for b in (u for u in toposort(list(_uops_in(chain))) if u.op is Ops.BIND): mapping[b] = take(b, f"input {k}")
      sig = sig[:3] + (_map_uops(chain, lambda u: substitute(u, mapping)),)
    out.append(sig)
  return tuple(out), var_vals

def _has_uop(arg) -> bool:
  if isinstance(arg, UOp): return True
  return isinstance(arg, tuple) and any(_has_uop(a) for a in arg)

def _uops_in(arg):
  if isinstance(arg, UOp): yield arg
  elif isinstance(arg, tuple):
    for a in arg: yield from _uops_in(a)

def _map_uops(arg, fn):
  if isinstance(arg, UOp): return fn(arg)
  if isinstance(arg, tuple): return tuple(_map_uops(a, fn) for a in arg)
  return arg

def _rebind(arg, var_vals: dict[UOp, int]):
  """`arg` (a node or a view chain) with each BIND of a Variable in `var_vals` bound to its new value."""
  def rebind_node(u: UOp) -> UOp:
    mapping = {b: b.src[0].bind(var_vals[b.src[0]]) for b in u.toposort() if b.op is Ops.BIND and b.src[0] in var_vals}
    return substitute(u, mapping) if mapping else u
  if isinstance(arg, UOp): return rebind_node(arg)
  return [(op, _map_uops(a, rebind_node)) for op, a in arg]

def _view_chain(u: UOp) -> tuple[UOp, list[tuple[Ops, Any]]]:
  """The base node of `u` and the movement ops that lead from it to `u`, base first."""
  chain = []
  while u.op in GroupOp.Movement:
    chain.append((u.op, u.arg))
    u = u.src[0]
  return u, chain[::-1]

def _apply_chain(node: UOp, chain: list[tuple[Ops, Any]]) -> UOp:
  for op, arg in chain: node = UOp(op, node.dtype, (node,), arg)
  return node

# ---------------- output structure ----------------

class _Out:
  """Where the j-th output tensor sits in the returned structure."""
  __slots__ = ("index",)
  def __init__(self, index: int): self.index = index

class _MultiOut:
  """A returned tensor over several devices: its slices are the outputs `slots`, laid out along `axis`."""
  __slots__ = ("slots", "axis")
  def __init__(self, slots: list[_Out], axis: int | None): self.slots, self.axis = slots, axis

def _template(x: Any, outs: list[Tensor]) -> Any:
  """The returned value with each tensor replaced by an _Out slot (tensors collected into `outs`, once each; a tensor
  over several devices by a _MultiOut of its slices'). `outs` are realized by the caller."""
  if isinstance(x, Tensor) and _multi.is_multi_device(x.device):
    x.realize()
    return _MultiOut([_template(_tensor_around(s), outs) for s in x.uop.src], x.uop.arg)
  if isinstance(x, Tensor):
    for j, t in enumerate(outs):
      if t is x: return _Out(j)
    outs.append(x)
    return _Out(len(outs) - 1)
  if type(x) is list or type(x) is tuple: return type(x)(_template(v, outs) for v in x)
  if type(x) is dict: return {k: _template(v, outs) for k, v in x.items()}
  return x

def _fill(template: Any, outs: list[Tensor]) -> Any:
  if type(template) is _Out: return outs[template.index]
  if type(template) is _MultiOut:
    return _tensor_around(_multi.multi([outs[slot.index].uop for slot in template.slots], template.axis))
  if type(template) is list or type(template) is tuple: return type(template)(_fill(v, outs) for v in template)
  if type(template) is dict: return {k: _fill(v, outs) for k, v in template.items()}
  return template

# ---------------- Python state the function reads ----------------

# opcodes that read a global by name; co_names also holds attribute and method names (LOAD_ATTR, LOAD_METHOD,
# STORE_ATTR, IMPORT_FROM...), which must not be guarded as globals (`opt.step()` is not a read of a global `step`)
_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})

def _code_names(code: types.CodeType) -> set[str]:
  """The global names `code` reads or writes, found in its bytecode, including nested code objects (comprehensions,
  lambdas, inner functions and classes), which share the enclosing function's globals."""
  names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_READS}
  for const in code.co_consts:
    if isinstance(const, types.CodeType): names |= _code_names(const)
  return names

_OPAQUE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, functools.partial)

def _is_kiln_machinery(value: Any) -> bool:
  """kiln's own objects other than nn layers and optimizers (devices, buffers, allocators, runners): their fields
  change as kernels run and are not state the user's function reads."""
  module = type(value).__module__
  return module.startswith("kiln.") and not module.startswith("kiln.nn")

def _walk_state(roots: list[tuple[tuple, Any]]) -> dict[tuple, Any]:
  """Every tensor and Python scalar reachable from `roots` (closure cells, referenced globals, argument objects)
  through attributes, list/tuple items and dict values, as {path: value}; the first path to a tensor wins."""
  found: dict[tuple, Any] = {}
  seen: set[int] = set()
  stack = [((root,), value, 0) for root, value in reversed(roots)]
  budget = STATE_BUDGET
  while stack and budget > 0:
    path, value, depth = stack.pop()
    budget -= 1
    kind = type(value)
    if kind in SCALARS or isinstance(value, np.generic):
      found[path] = value
      continue
    if id(value) in seen or isinstance(value, _OPAQUE) or isinstance(value, (DType, TinyJit)): continue
    seen.add(id(value))
    if isinstance(value, Tensor):
      found[path] = value
      continue
    if isinstance(value, np.ndarray):
      found[path] = _ArraySnapshot(value)
      continue
    if depth >= STATE_DEPTH or _is_kiln_machinery(value): continue
    if isinstance(value, (list, tuple)):
      children = [(path + (("item", i),), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
      children = [(path + (("item", k),), v) for k, v in value.items() if type(k) in SCALARS]
    else:
      attrs = getattr(value, "__dict__", None)
      if not isinstance(attrs, dict): continue   # numpy arrays, C objects: not looked into (see docs/jit.md)
      children = [(path + (("attr", k),), v) for k, v in attrs.items()]
    stack.extend((p, v, depth + 1) for p, v in reversed(children))
  return found

class _ArraySnapshot:
  """A numpy array reachable from the state, by identity and (up to ARRAY_GUARD_BYTES) by contents: `Tensor(array)`
  inside the function copies the contents into a buffer that every replay reuses, so changing the array in place
  must re-capture."""
  __slots__ = ("array", "shape", "dtype", "contents")
  def __init__(self, array: np.ndarray):
    self.array, self.shape, self.dtype = array, array.shape, array.dtype
    self.contents = array.tobytes() if array.nbytes <= ARRAY_GUARD_BYTES else None
  def matches(self, value: Any) -> bool:
    """Whether `value` is still this array, with the same shape, dtype and (when guarded) contents."""
    if value is not self.array or value.shape != self.shape or value.dtype != self.dtype: return False
    return self.contents is None or value.tobytes() == self.contents
  def __eq__(self, other: Any) -> bool:
    return isinstance(other, _ArraySnapshot) and other.contents == self.contents and self.matches(other.array)
  def __repr__(self) -> str: return f"<numpy array {self.shape} {self.dtype}>"

def _follow(root: Any, steps: tuple) -> Any:
  value = root
  for kind, key in steps: value = getattr(value, key) if kind == "attr" else value[key]
  return value

def _marker(t: Tensor) -> Any:
  """What identifies a tensor's contents: its Buffer when realized (the first slice's over several devices), else its
  (lazy) graph node."""
  base = t.uop.base
  if base.op is _MULTI and all(s.base.op is _BUFFER for s in base.src): base = base.src[0].base
  return base.buffer if base.op is Ops.BUFFER else t.uop

def _path_str(path: tuple) -> str:
  root, *steps = path
  text = {"cell": f"closure variable {root[1]!r}", "global": f"global {root[1]!r}",
          "arg": f"argument object #{root[1]}"}[root[0]]
  for kind, key in steps: text += f".{key}" if kind == "attr" else f"[{key!r}]"
  return text

def _same_value(a: Any, b: Any) -> bool:
  if type(a) is not type(b): return False
  if isinstance(a, Tensor): return a is b
  return a == b or (a != a and b != b)

# ---------------- a capture ----------------

class CapturedJit:
  """The launches of one captured call and everything precomputed to replay them with new inputs."""
  def __init__(self, name: str, items: list[ExecItem], input_bufs: list[Buffer], existed: dict[int, bool],
               outs: list[Tensor], template: Any, guards: list, keep: list, prune: bool, key: Any = None,
               optimize: bool = False):
    self.name, self.items, self.template, self.guards, self.keep, self.key = name, items, template, guards, keep, key
    # each guard as (path, its root, the steps from the root, the expected value), and the roots the guards start
    # from: a replay looks up only those
    self.guard_plan = [(path, path[0], path[1:], expected) for path, expected in guards]
    self.guard_roots = list(dict.fromkeys(path[0] for path, _ in guards))
    state_ids = {id(g[1][1]) for g in guards if isinstance(g[1], tuple)}
    input_index = {}
    for k, b in enumerate(input_bufs): input_index.setdefault(id(b), k)
    written = {id(b) for item in items for b in item.bufs[:item.n_out]}
    # produced here: written by a launch and not allocated before the call (intermediates and fresh outputs)
    produced = {bid for bid in written if bid not in input_index and not existed.get(bid, True)}
    if prune:
      output_ids = {id(t.uop.base.buffer) for t in outs if t.uop.base.op is Ops.BUFFER}
      items = self.items = _prune(items, set(input_index), output_ids, written - produced - set(input_index))
    if optimize:
      output_ids = {id(t.uop.base.buffer) for t in outs if t.uop.base.op is Ops.BUFFER}
      _plan_intermediates(items, produced - output_ids)
    # output tensors: a view of a fresh buffer per replay, of an input, or of a buffer that stays (state)
    self.outputs: list[tuple[str, Any, list]] = []
    fresh_ids: dict[int, int] = {}
    self.fresh: list[tuple[str, int, DType, list]] = []
    for t in outs:
      base, chain = _view_chain(t.uop)
      buf = base.buffer if base.op is Ops.BUFFER else None
      if buf is not None and id(buf) in input_index: self.outputs.append((_INPUT, input_index[id(buf)], chain))
      elif buf is not None and id(buf) in produced:
        if id(buf) not in fresh_ids:
          fresh_ids[id(buf)] = len(self.fresh)
          self.fresh.append((buf.device, buf.size, buf.dtype, []))
        self.outputs.append((_FRESH, fresh_ids[id(buf)], chain))
      else: self.outputs.append((_FIXED, t.uop, chain))
    # where each input and each fresh output sits in the launches
    self.input_slots: list[tuple[list, int, int]] = []
    for item in items:
      for pos, b in enumerate(item.bufs):
        if (k := input_index.get(id(b))) is not None: self.input_slots.append((item.bufs, pos, k))
        elif (f := fresh_ids.get(id(b))) is not None: self.fresh[f][3].append((item.bufs, pos))
    self.n_inputs = len(input_bufs)
    # the (launch index, buffer position) pairs a replay swaps: what a device graph must re-read on every replay
    item_index = {id(item.bufs): i for i, item in enumerate(items)}
    self.swapped = {(item_index[id(bufs)], pos) for bufs, pos, _ in self.input_slots}
    self.swapped |= {(item_index[id(bufs)], pos) for *_, slots in self.fresh for bufs, pos in slots}
    self._launches: list[Callable[[], None]] | None = None   # built at the first replay
    self.reused_results: list[tuple[UOp, UOp]] = []   # set by TinyJit: results of earlier graphs the capture read
    # buffers a replay must never be handed as an input (they would alias a buffer the kernels use another way)
    self.internal_ids = {id(b) for item in items for b in item.bufs
                         if id(b) not in input_index and id(b) not in fresh_ids}
    # inputs that are also state the kernels may reach another way: a replay needs that very buffer again
    self.pinned_inputs = {k: b for k, b in enumerate(input_bufs) if id(b) in state_ids}
    self.written_inputs = sorted({k for bid, k in input_index.items() if bid in written})
    self.written_state = [b for item in items for b in item.bufs[:item.n_out] if id(b) not in produced
                          and id(b) not in input_index]
    # the per-launch variable values a replay rewrites with the call's values (a symbolic kernel serves every value)
    self.var_dicts = [item.var_vals for item in items if item.var_vals]
    self.kernel_count = sum(1 for item in items if item.runner.name != "copy")
    self.ops = sum(item.runner.ops for item in items)
    self.mem = sum(b.nbytes for item in items for b in item.bufs)

  def check_state(self, roots: dict) -> str | None:
    """None if the Python state the capture read is unchanged, else a description of what changed."""
    for path, root, steps, expected in self.guard_plan:
      try: value = _follow(roots[root], steps)
      except (AttributeError, KeyError, IndexError, TypeError): return f"{_path_str(path)} is gone"
      if isinstance(expected, tuple):   # (tensor, marker)
        if not isinstance(value, Tensor) or _marker(value) is not expected[1]:
          return f"{_path_str(path)} is another tensor"
      elif type(expected) is _ArraySnapshot:
        if not expected.matches(value): return f"{_path_str(path)} (a numpy array) was replaced or changed"
      elif not (type(value) is type(expected) and value == expected) and not _same_value(value, expected):
        return f"{_path_str(path)} changed from {expected!r} to {value!r}"
    return None

  def replay(self, tensors: list[Tensor], var_vals: dict[UOp, int] | None = None,
             input_bufs: list[Buffer] | None = None) -> Any:
    """Run the captured launches with the buffers of `tensors` as inputs (`input_bufs`, when the caller has them)
    and the values `var_vals` of bound Variables; returns the output structure."""
    if var_vals:
      for vals in self.var_dicts:
        for var in vals:
          if var in var_vals: vals[var] = var_vals[var]
    if input_bufs is None: input_bufs = [t.uop.base.buffer for t in tensors]
    for buf in input_bufs:
      if buf._allocator is None: buf.allocate()   # (is_initialized, inline: every replay runs this)
    for bufs, pos, k in self.input_slots: bufs[pos] = input_bufs[k]
    fresh = []
    for device, size, dtype, slots in self.fresh:
      # the last replay's output again when nothing outside the capture holds it: no tensor, node or view can read it
      # any more (each holds its Buffer), so reusing it is unobservable and saves an allocation and a free
      bufs, pos = slots[0]
      if sys.getrefcount(buf := bufs[pos]) != len(slots) + 2 or buf._allocator is None:
        buf = Buffer(device, size, dtype).allocate()
        for bufs, pos in slots: bufs[pos] = buf
      fresh.append(buf)
    if (launches := self._launches) is None:
      launches = self._launches = batch_launches(self.items, self.swapped) if JIT.value < 2 else \
        [plain_launch(item) for item in self.items]
    for launch in launches: launch()
    GlobalCounters.kernel_count += self.kernel_count
    GlobalCounters.global_ops += self.ops
    GlobalCounters.global_mem += self.mem
    if DEBUG.value >= 2: print(f"*** TinyJit {self.name}: replayed {len(self.items)} launches")
    # results computed earlier from buffers the replay overwrote are out of date, as after an eager assign
    for k in self.written_inputs: _forget_results_computed_from(input_bufs[k])
    # (most written state has no results to forget: the attribute read skips the call)
    for buf in self.written_state:
      if buf._computed is not None: _forget_results_computed_from(buf)
    outs = []
    for kind, where, chain in self.outputs:
      if kind is _FRESH:
        buf = fresh[where]
        node = UOp.new_buffer(buf.device, buf.size, buf.dtype)
        node.buffer = buf
      elif kind is _FIXED:
        outs.append(_tensor_around(_rebind(where, var_vals) if var_vals else where))
        continue
      else: node = tensors[where].uop.base
      outs.append(_tensor_around(_apply_chain(node, _rebind(chain, var_vals) if var_vals else chain)))
    template = self.template
    return outs[template.index] if type(template) is _Out else _fill(template, outs)

def _plan_intermediates(items: list[ExecItem], intermediate_ids: set[int]) -> int:
  """Let intermediates whose lifetimes (first to last launch that uses them) do not overlap share one buffer of the
  same device, dtype and size, by rewriting the launches' buffer lists in place; returns how many there were."""
  first: dict[int, int] = {}
  last: dict[int, int] = {}
  buffers: dict[int, Buffer] = {}
  views = {id(b._base) for item in items for b in item.bufs if b._base is not None}
  for i, item in enumerate(items):
    for b in item.bufs:
      if id(b) not in intermediate_ids or b._base is not None or id(b) in views: continue
      first.setdefault(id(b), i)
      last[id(b)], buffers[id(b)] = i, b
  # (device, dtype, size) -> [(index of the last launch that uses the buffer, buffer)]
  free: dict[tuple, list[tuple[int, Buffer]]] = collections.defaultdict(list)
  replace: dict[int, Buffer] = {}
  for bid in sorted(first, key=first.get):
    buf = buffers[bid]
    slots = free[(buf.device, buf.dtype, buf.size)]
    reuse = next((k for k, (free_after, _) in enumerate(slots) if free_after < first[bid]), None)
    if reuse is None: slots.append((last[bid], buf))
    else:
      replace[bid] = slots[reuse][1]
      slots[reuse] = (last[bid], slots[reuse][1])
  for item in items:
    for pos, b in enumerate(item.bufs):
      if id(b) in replace: item.bufs[pos] = replace[id(b)]
  return len(first)

def _prune(items: list[ExecItem], input_ids: set[int], output_ids: set[int], state_ids: set[int]) -> list[ExecItem]:
  """Keep only launches that update state (write a buffer that existed before the call, such as weights or the random
  generator's counter), depend on an input, on such state or on a Variable (a symbolic size), or write an output.

  A dropped launch's output must survive the replays. Where the memory planner gave its buffer to other
  intermediates too (weight copies of one size share one), the replays would read their values instead: such a
  launch gets a buffer of its own, its readers read that one, and it runs there once now."""
  depends = set(input_ids) | state_ids
  dropped: set[int] = set()
  writers: dict[int, int] = {}
  for item in items:
    outs, reads = [id(b) for b in item.bufs[:item.n_out]], [id(b) for b in item.bufs[item.n_out:]]
    for out in outs: writers[out] = writers.get(out, 0) + 1
    if getattr(item.runner, "vars", None) or any(r in depends for r in reads): depends.update(outs)
    if not any(out in depends or out in output_ids for out in outs): dropped.add(id(item))
  def shared(item: ExecItem) -> bool: return any(writers[id(b)] > 1 for b in item.bufs[:item.n_out])
  if not any(id(item) in dropped and shared(item) for item in items):
    return [item for item in items if id(item) not in dropped]
  own: dict[int, Buffer] = {}   # a shared buffer's id -> the buffer its current (dropped) writer got instead
  kept, once = [], []
  for item in items:
    reads = [own.get(id(b), b) for b in item.bufs[item.n_out:]]
    outs = item.bufs[:item.n_out]
    if id(item) in dropped and shared(item):
      for out in outs: own[id(out)] = Buffer(out.device, out.size, out.dtype).allocate()
      once.append(ExecItem(item.runner, [*(own[id(out)] for out in outs), *reads], item.var_vals, item.n_out))
      continue
    for out in outs: own.pop(id(out), None)   # later readers read this launch's value
    if id(item) in dropped: continue
    changed = any(r is not b for r, b in zip(reads, item.bufs[item.n_out:]))
    kept.append(ExecItem(item.runner, [*outs, *reads], item.var_vals, item.n_out) if changed else item)
  for item in once: item.runner(item.bufs, item.var_vals, wait=True)
  return kept

# ---------------- TinyJit ----------------

def _same_tensors(args: tuple, uops: tuple) -> bool:
  """Each of `args` is a Tensor holding the node at its place in `uops` (the last replayed call's)."""
  for a, u in zip(args, uops):
    if type(a) is not Tensor or a.uop is not u: return False
  return True

class TinyJit(Generic[ReturnType]):
  """Capture the kernels a function launches and replay them on later calls: `@TinyJit def step(x): ...`.

  Call 1 runs eagerly, call 2 runs eagerly and captures, calls 3+ replay the captured kernels with the new input
  tensors (found anywhere in the arguments, also inside lists, tuples and dicts). Returned tensors are realized.
  Guards on every call re-capture on a changed shape, dtype, device, view, aliasing, Python scalar or argument
  object (up to 8 captures are kept), and raise on what a replay cannot repeat; see docs/jit.md. `JIT=0` runs every
  call eagerly. `prune=True` drops captured kernels that depend on no input (they ran once, at capture);
  `optimize=True` lets intermediates whose lifetimes in the capture do not overlap share memory.

  >>> from kiln import TinyJit
  >>> @TinyJit
  ... def double(x): return (x * 2).realize()
  >>> [double(Tensor([float(i), 1.0])).tolist() for i in range(4)]
  [[0.0, 2.0], [2.0, 2.0], [4.0, 2.0], [6.0, 2.0]]
  """
  def __init__(self, fxn: Callable[..., ReturnType] | None, captured: CapturedJit | None = None, prune: bool = False,
               optimize: bool = False):
    if fxn is None and captured is None: raise ValueError("TinyJit: give a function or a captured jit")
    self.fxn, self.prune, self.optimize = fxn, prune, optimize
    self.name = getattr(fxn, "__qualname__", None) or getattr(captured, "name", "jit")
    self.captured: CapturedJit | None = captured
    self.cnt = 0
    self._global_names: list[str] | None = None
    self._captures: collections.OrderedDict = collections.OrderedDict()   # guard key -> CapturedJit
    self._seen: collections.OrderedDict = collections.OrderedDict()       # guard key -> objects, after one eager call
    # the last replayed call when it had only realized tensors and no Variables: (their uops, the global modes, its
    # capture, their buffers). A call with the very same uops has the same guard key, so it skips making the key
    self._last: tuple | None = None
    if fxn is not None: functools.update_wrapper(self, fxn)

  def __get__(self, obj, objtype=None):
    # a jitted method: the instance becomes the first argument, so it is part of the guard (keyed by identity)
    return functools.partial(self.__call__, obj) if obj is not None else self

  def reset(self) -> None:
    """Forget every capture; the next call runs eagerly again."""
    self._captures.clear()
    self._seen.clear()
    self.captured, self.cnt, self._last = None, 0, None

  @property
  def jit_cache(self) -> list[ExecItem]:
    """The launches of the most recent capture (empty before one)."""
    return self.captured.items if self.captured is not None else []

  def _state_roots(self, objects: list[Any], wanted: list[tuple] | None = None) -> dict[tuple, Any]:
    """Where the function can reach Python state: its closure cells, the globals it names, argument objects (only
    the roots in `wanted`, when given: a replay's guards start from a few)."""
    fxn = self.fxn
    code = getattr(fxn, "__code__", None)
    if code is not None and self._global_names is None: self._global_names = sorted(_code_names(code))
    if wanted is None:
      wanted = [("cell", name) for name in code.co_freevars] + [("global", name) for name in self._global_names] \
        if code is not None else []
      wanted += [("arg", j) for j in range(len(objects))]
    roots: dict[tuple, Any] = {}
    for root in wanted:
      kind, key = root
      if kind == "arg":
        if key < len(objects): roots[root] = objects[key]
      elif code is None: continue
      elif kind == "cell":
        if key in code.co_freevars and fxn.__closure__:
          try: roots[root] = fxn.__closure__[code.co_freevars.index(key)].cell_contents
          except ValueError: pass   # a cell not filled yet
      elif key in fxn.__globals__: roots[root] = fxn.__globals__[key]
    if roots.get(_TENSOR_GLOBAL) is Tensor: del roots[_TENSOR_GLOBAL]
    return roots

  def __call__(self, *args, **kwargs) -> ReturnType:
    if capturing and JIT.value:
      raise RuntimeError(f"TinyJit: {self.name} was called inside the TinyJit function {capturing[0].name}; "
                         "nested TinyJit is not supported (call the inner function undecorated)")
    self.cnt += 1
    if (last := self._last) is not None and not kwargs and len(args) == len(last[0]) and last[2] is self.captured \
       and _same_tensors(args, last[0]) and last[1] == \
       (Tensor.training, Device._default, dtypes.default_float, dtypes.default_int) and JIT.value:
      # the very buffers of the last replay passed the input checks then: only what can change since is checked
      entry = last[2]
      if (not entry.reused_results and not entry.guards) or self._state_blocker(entry, []) is None:
        return entry.replay(list(args), None, last[3])
      self._last = None   # the slow path below says why
    tensors: list[Tensor] = []
    objects: list[Any] = []
    binds: list[UOp] = []
    structure: Any = None
    if not kwargs:   # the common case, only tensors, without the general walk
      for a in args:
        if type(a) is not Tensor or type(a.uop.device) is tuple: break
      else:
        tensors.extend(args)
        structure = len(args)
    if structure is None: structure = _describe((args, kwargs), tensors, objects, binds)
    if not JIT.value:
      return self.fxn(*args, **kwargs) if self.fxn is not None else \
        self.captured.replay(tensors, _call_variables(binds, tuple(_tensor_signature(t) for t in tensors))[1])
    # inputs are realized buffers: a lazy input is computed first (outside the capture)
    bases = [t.uop.base for t in tensors]
    if [base for base in bases if base.op is not _BUFFER]:
      Tensor.realize_all([t for t, base in zip(tensors, bases) if base.op is not _BUFFER])
      bases = [t.uop.base for t in tensors]
    input_bufs = [base.buffer for base in bases]
    ids = [id(buf) for buf in input_bufs]
    aliasing = tuple(ids.index(i) for i in ids) if len(set(ids)) != len(ids) else None
    signatures = tuple([_tensor_signature(t) for t in tensors])
    # bound Variables guard by Variable (name, range), and their values are replayed: one capture serves every value
    var_vals = None
    if binds or _ops.binds_made: signatures, var_vals = _call_variables(binds, signatures)
    # global modes that change what the function builds: training, the default device and default dtypes
    key = (structure, signatures, aliasing, Tensor.training, Device._default, dtypes.default_float, dtypes.default_int)
    entry = self._captures.get(key)
    if self.fxn is None:   # only a capture handed in: replay it when the guards match, there is nothing to re-capture
      if key != self.captured.key or (changed := self._replay_blocker(self.captured, input_bufs, objects)) is not None:
        raise RuntimeError(f"TinyJit: the arguments do not match the capture of {self.name}"
                           f"{': ' + changed if key == self.captured.key else ''}")
      return self.captured.replay(tensors, var_vals, input_bufs)
    if entry is not None:
      changed = self._replay_blocker(entry, input_bufs, objects)
      if changed is None:
        if entry is not self.captured:   # the most recent capture is the last one already
          self._captures.move_to_end(key)
          self.captured = entry
        self._last = (tuple([t.uop for t in tensors]), key[3:], entry, input_bufs) \
          if structure == len(tensors) and not var_vals else None
        return entry.replay(tensors, var_vals, input_bufs)
      if DEBUG >= 1: print(f"TinyJit {self.name}: re-capturing because {changed}")
      del self._captures[key]
      self._last = None
    elif key not in self._seen:
      # first call with this signature: eager, so state the function initializes lazily exists before the capture
      self._seen[key] = objects
      while len(self._seen) > 4 * MAX_CAPTURES: self._seen.popitem(last=False)
      return self._run(args, kwargs, tensors, record=False)
    return self._capture(key, args, kwargs, tensors, objects)

  def _replay_blocker(self, entry: CapturedJit, input_bufs: list[Buffer], objects: list[Any]) -> str | None:
    """Why `entry` cannot be replayed with these input buffers (None when it can)."""
    pinned_inputs, internal_ids = entry.pinned_inputs, entry.internal_ids
    for k, buf in enumerate(input_bufs):
      pinned = pinned_inputs.get(k) if pinned_inputs else None
      if pinned is not None and buf is not pinned: return f"input {k} was a buffer the kernels also use as state"
      if pinned is None and id(buf) in internal_ids: return f"input {k} is a buffer the captured kernels use"
    return self._state_blocker(entry, objects)

  def _state_blocker(self, entry: CapturedJit, objects: list[Any]) -> str | None:
    """Why `entry` cannot be replayed now whatever its inputs (None when it can): a result it reused was overwritten,
    or the Python state it read changed."""
    for node, result in entry.reused_results:
      if node.forward is not result:
        return "a result computed before the capture (and reused by it) was overwritten or recomputed"
    return entry.check_state(self._state_roots(objects, entry.guard_roots)) if entry.guards else None

  def _run(self, args, kwargs, tensors, record: bool) -> Any:
    recorder = _Recorder(self.name, recording=record)
    capturing.append(recorder)
    try:
      ret = self.fxn(*args, **kwargs)
      outs: list[Tensor] = []
      template = _template(ret, outs)
      if outs: Tensor.realize_all(outs)
    finally: capturing.pop()
    if not recorder.launches:
      raise RuntimeError(f"TinyJit: {self.name} launched no kernels, so there is nothing to capture (return tensors "
                         "the function computes, or don't jit it)")
    return (ret, recorder, outs, template) if record else ret

  def _capture(self, key, args, kwargs, tensors, objects) -> Any:
    roots = self._state_roots(objects)
    before = {p: ((v, _marker(v)) if isinstance(v, Tensor) else v) for p, v in _walk_state(list(roots.items())).items()}
    input_bufs = [t.uop.base.buffer for t in tensors]
    arguments = _describe((args, kwargs), [], [], [])
    ret, recorder, outs, template = self._run(args, kwargs, tensors, record=True)
    # lists and dicts in the arguments are Python state too: a replay cannot repeat appending to them or storing in them
    tensors_after: list[Tensor] = []
    if _describe((args, kwargs), tensors_after, [], []) != arguments or any(
        a is not b and a.uop is not b.uop for a, b in zip(tensors, tensors_after)):   # (slices: new Tensors, same nodes)
      raise RuntimeError(f"TinyJit: {self.name} changed a list, tuple or dict in its arguments during the call; a "
                         "replay runs only the captured kernels and cannot repeat that (return the new values instead)")
    after = _walk_state(list(self._state_roots(objects).items()))
    for path in dict.fromkeys([*before, *after]):
      old, new = before.get(path, _MISSING), after.get(path, _MISSING)
      if isinstance(old, tuple) and isinstance(new, Tensor) and new is old[0] and _marker(new) is old[1]: continue
      if not isinstance(old, tuple) and old is not _MISSING and _same_value(old, new): continue
      raise RuntimeError(f"TinyJit: {self.name} changed {_path_str(path)} during the call; a replay runs only the "
                         "captured kernels and cannot repeat Python-side changes (update tensors in place with "
                         "assign(), keep Python values fixed during the call, or run with JIT=0)")
    used = {id(b) for item in recorder.items for b in item.bufs}
    reused = _reused_results(recorder, input_bufs, before)
    guards = [(p, v) for p, v in before.items()
              if not isinstance(v, tuple) or not isinstance(v[1], Buffer) or id(v[1]) in used]
    entry = CapturedJit(self.name, recorder.items, input_bufs, recorder.existed, outs, template, guards,
                        [objects, [v[0] for v in before.values() if isinstance(v, tuple)]], self.prune, key,
                        self.optimize)
    entry.reused_results = reused
    self._captures[key] = self.captured = entry
    while len(self._captures) > MAX_CAPTURES: self._captures.popitem(last=False)
    if DEBUG >= 1: print(f"TinyJit {self.name}: captured {len(entry.items)} launches")
    return ret

_MISSING = object()
_TENSOR_GLOBAL = ("global", "Tensor")   # kiln's own Tensor class, when a function names it, is no state

def _reused_results(recorder: _Recorder, input_bufs: list[Buffer], before: dict) -> list[tuple[UOp, UOp]]:
  """The graph nodes whose earlier results (`node.forward`) the capture read instead of computing them, as
  (node, result): a realized constant such as `Tensor(2.0).realize()` is the same node as the 2 in `x * 2`. Such a
  buffer is not the function's state, so once it is overwritten (the node forgets its result) the capture is stale.
  Buffers of inputs and of tensors reachable from the guarded state are left out: updating those in place is what a
  replay must see."""
  skip = {id(b) for b in input_bufs} | {id(v[1]) for v in before.values() if isinstance(v, tuple)}
  reused = []
  for item in recorder.items:
    for buf in item.bufs:
      if id(buf) in skip or not recorder.existed.get(id(buf), False): continue
      skip.add(id(buf))
      for node in list(_computed_from(buf)):
        result = node.forward
        if result is not None and result.base.op is Ops.BUFFER and result.base.buffer is buf:
          reused.append((node, result))
  return reused
