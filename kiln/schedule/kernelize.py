"""The scheduler: cuts a tensor graph into kernels.

Buffers are materialized at the realized roots, `contiguous()`, `assign`, device copies, at reductions whose
result is broadcast, used by more than one kernel, or fed into another reduction, at costly elementwise values that
are broadcast (instead of recomputing them per copy), and at an assign's value when it reads the target through
another view. Everything else is fused: elementwise chains into one kernel, elementwise producers into the reduction
that consumes them, and a reduction into its elementwise consumer when the path only reshapes, permutes or flips.

Row chains are the exception to "a broadcast reduction gets a buffer" (ROW_FUSION=1, the default): a reduction
over the trailing axes whose result is used only on its own row (broadcast back over those axes, combined
elementwise, reduced again over the same axes) stays in the one kernel of its consumer, which computes each row's
reductions in loops of their own before writing the row (softmax, log_softmax, layernorm, rms_norm: one kernel
each; `_reduce_fuses_by_row`). Anything else downstream of the reduction keeps today's buffer.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from kiln.dtype import dtypes
from kiln.device import Buffer, Device
from kiln.helpers import NO_MEMORY_PLANNER, SPEC, ContextVar, deep_recursion
from kiln.uop.spec import check_tensor_graph
from kiln.schedule.memory import plan_memory
from kiln.uop import ops as _ops
from kiln.uop.ops import UOp, Ops, GroupOp, toposort

# the whole tensor graph's walks: a training step's graph is thousands of nodes deep (see helpers.deep_recursion)
whole_graph_toposort = deep_recursion(toposort)
from kiln.uop.pattern import substitute
from kiln.uop.sint import sprod, sint_max
from kiln.schedule.binds import strip_binds
from kiln.runtime.ops_disk import lower_disk_views, unwritten_files, is_disk
from kiln.schedule.cache import cached_schedule, SCHEDULE_CACHE
from kiln.schedule.pack import pack_matmuls, splits_epilogue
from kiln.schedule import multi as _multi
from kiln.schedule.attention import attention_buffers

# movement ops that visit every element exactly once: a reduction seen through them can stay in registers
BIJECTIVE = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.FLIP})
PASS_THROUGH = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_BACKWARD})
# nodes whose value is src[0] stored in a buffer of their own (a UNIQUE is one only as a root: see _prepare)
_OWN_BUFFER_OPS = frozenset({Ops.CONTIGUOUS, Ops.UNIQUE})
_MATERIALIZED_OPS = _OWN_BUFFER_OPS | {Ops.ASSIGN, Ops.COPY, Ops.ALLREDUCE}

@dataclass
class Schedule:
  """Kernels in run order, the node each root's value now lives in, the realized buffers the kernels read, and the
  buffers that `assign` overwrites (whatever was computed from their old contents is out of date afterwards)."""
  items: list[ScheduleItem]
  results: dict[UOp, UOp]
  inputs: list[Buffer]
  overwritten: list[Buffer]

@dataclass
class ScheduleItem:
  """One unit of work: a kernel (`ast` is a SINK of STOREs), a copy (`ast` is a COPY) or an all-reduce (`ast` is an
  ALLREDUCE, arg (op, devices): one buffer written per device), over `bufs`: its `n_out` outputs first, then what it
  reads."""
  ast: UOp
  bufs: list[Buffer]
  metadata: tuple[str, ...] = ()
  var_vals: dict = field(default_factory=dict)
  n_out: int = 1

  @property
  def outputs(self) -> list[Buffer]:
    """The buffers the item writes."""
    return self.bufs[:self.n_out]

def resolve(u: UOp) -> UOp:
  """Follow a node that was realized earlier to the view of its buffer."""
  while u.forward is not None: u = u.forward
  return u

def buffer_view(buf_uop: UOp, shape: tuple) -> UOp:
  """The tensor-level node reading a contiguous buffer as `shape`. A symbolic shape (sizes over bound Variables) reads
  the first `prod(shape)` elements of a buffer allocated for the Variables' largest values."""
  if _ops.binds_made and any(isinstance(s, UOp) for s in shape):   # (no shape is symbolic before a bind exists)
    src = UOp(Ops.SHRINK, buf_uop.dtype, (buf_uop,), ((0, sprod(shape)),))
    return UOp(Ops.RESHAPE, buf_uop.dtype, (src,), tuple(shape))
  buf_uop.shape   # noqa: B018 -- known now; found later, the view's shape would take a graph walk
  return UOp(Ops.RESHAPE, buf_uop.dtype, (buf_uop,), tuple(shape))

def is_realized_view(u: UOp) -> bool:
  """Movement ops over a realized BUFFER: reading it needs no kernel."""
  return u.base.op is Ops.BUFFER

def is_contiguous_buffer(u: UOp) -> bool:
  """A whole realized buffer in row-major order: its bytes can be copied as they are."""
  return u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)

def contiguous_range(u: UOp) -> tuple[UOp, int] | None:
  """(base, element offset) when `u` reads one contiguous run of its base node's elements in order: reshapes around
  one shrink that keeps a single index on the axes before some axis k and whole axes after it (a slice of rows, a
  shard along axis 0, a chunk of a flattened buffer); None otherwise."""
  while u.op is Ops.RESHAPE: u = u.src[0]
  if u.op is not Ops.SHRINK: return None
  shape, window = u.src[0].shape, u.arg
  if not all(type(s) is int for s in shape) or not all(type(b) is int and type(e) is int for b, e in window): return None
  k = next((i for i, ((b, e), s) in enumerate(zip(window, shape)) if (b, e) != (0, s)), len(shape))
  if any(e - b != 1 for b, e in window[:k]) or any((b, e) != (0, s) for (b, e), s in zip(window[k + 1:], shape[k + 1:])):
    return None
  offset, stride = 0, 1
  for (b, _), s in zip(reversed(window), reversed(shape)):
    offset += b * stride
    stride *= s
  base = u.src[0]
  while base.op is Ops.RESHAPE: base = base.src[0]
  return base, offset

def _consumers(nodes: list[UOp]) -> dict[UOp, list[UOp]]:
  users: dict[UOp, list[UOp]] = {n: [] for n in nodes}
  for n in nodes:
    for s in n.src:
      if n not in users[s]: users[s].append(n)
  return users

def _reduce_fuses_upward(reduce: UOp, users: dict[UOp, list[UOp]], outputs: set[UOp]) -> bool:
  """A reduction stays inside its consumer's kernel when every path from it runs through elementwise ops and
  bijective movement ops into one and the same kernel output (a plain elementwise or reshaped store)."""
  reached: set[UOp] = set()
  stack, seen = [reduce], {reduce}
  while stack:
    node = stack.pop()
    if node in outputs and node is not reduce:
      reached.add(node)
      continue
    if node is not reduce and not (node.op in GroupOp.Elementwise or node.op in BIJECTIVE): return False
    if not users[node] and node not in outputs: return False
    for user in users[node]:
      if user not in seen:
        seen.add(user)
        stack.append(user)
  if len(reached) != 1: return False
  target = next(iter(reached))
  return target.op in GroupOp.Elementwise or target.op in BIJECTIVE or target.op in (Ops.CONTIGUOUS, Ops.ASSIGN)

# ---- row fusion: a reduction over the last axes, broadcast back over those same axes, stays in its consumer ----
# A *row chain* (softmax, log_softmax, layernorm, rms_norm) reduces each row (the trailing `inner` axes) and uses the
# result only on that same row. Its kernel loops over the rows; for each row it runs every reduction in its own loop
# over the row (the linearizer places them before the row's elementwise loop) and then writes the row, so the input
# is read from memory once and each row again from cache. Longer rows would fall out of cache: they are not fused.
MAX_FUSED_ROW = 65536
ROW_FUSION = ContextVar("ROW_FUSION", 1, "1: a row chain (softmax, layernorm: reductions over the last axes broadcast "
                        "back over them) runs as one kernel; 0: each broadcast reduction gets its own kernel")

def _row_axes(reduce: UOp) -> tuple[tuple, tuple] | None:
  """(outer, inner) when `reduce` reduces exactly the trailing axes `inner` of a constant shape `outer + inner`."""
  shape, axes = reduce.src[0].shape, tuple(reduce.arg[1])
  if not axes or not all(type(d) is int for d in shape): return None
  first = len(shape) - len(axes)
  if axes != tuple(range(first, len(shape))): return None
  outer, inner = tuple(shape[:first]), tuple(shape[first:])
  return (outer, inner) if sprod(inner) <= MAX_FUSED_ROW else None

def _is_row_value_shape(shape: tuple, outer: tuple) -> bool:
  """One value per row: `outer` followed by size-1 axes only."""
  return tuple(shape[:len(outer)]) == outer and all(d == 1 for d in shape[len(outer):])

def _row_step_ok(node: UOp, rows: tuple[tuple, tuple]) -> bool:
  """`node`, downstream of a row reduction, keeps every value tied to its own row: an elementwise op on whole rows
  or on per-row values, the broadcast of a per-row value over its row, a reshape that only moves size-1 axes of a
  per-row value, or another reduction of the same rows."""
  outer, inner = rows
  if node.op in GroupOp.Elementwise or node.op is Ops.CONTIGUOUS:
    return node.shape == outer + inner or _is_row_value_shape(node.shape, outer)
  if node.op is Ops.EXPAND: return node.src[0].shape == outer + (1,) * len(inner) and node.arg == outer + inner
  if node.op is Ops.RESHAPE:
    return _is_row_value_shape(node.src[0].shape, outer) and _is_row_value_shape(node.arg, outer)
  if node.op is Ops.REDUCE_AXIS: return _row_axes(node) == rows
  return False

def _reduce_fuses_by_row(reduce: UOp, users: dict[UOp, list[UOp]], outputs: set[UOp]) -> bool:
  """A row reduction stays in its consumer's kernel when everything downstream of it, up to the kernel's one
  output, passes `_row_step_ok` (each value depends on the row only through that row; anything else: a buffer)."""
  rows = _row_axes(reduce)
  if rows is None: return False
  reached: set[UOp] = set()
  stack, seen = [reduce], {reduce}
  while stack:
    node = stack.pop()
    if node is not reduce:
      if not _row_step_ok(node, rows): return False
      if node in outputs:
        reached.add(node)
        continue
    if not users[node]: return False
    for user in users[node]:
      if user not in seen:
        seen.add(user)
        stack.append(user)
  return len(reached) == 1

def _row_broadcast_of_reductions(expand: UOp, value: UOp, outputs: set[UOp]) -> bool:
  """`expand` broadcasts a per-row `value` computed from row reductions of the same rows over those rows: if the
  reductions fuse, the value is computed once per row (the linearizer hoists it), never once per copy."""
  found = False
  for node in toposort([value], stop=lambda u: u in outputs and u is not value):
    if node.op is not Ops.REDUCE_AXIS or node in outputs: continue
    rows = _row_axes(node)
    if rows is None or expand.arg != rows[0] + rows[1] or expand.src[0].shape != rows[0] + (1,) * len(rows[1]):
      return False
    found = True
  return found

def _has_fused_reduce(value: UOp, outputs: set[UOp]) -> bool:
  return any(n.op is Ops.REDUCE_AXIS and n not in outputs
             for n in toposort([value], stop=lambda u: u in outputs and u is not value))

# an elementwise value with more ALU ops than this is materialized rather than recomputed under a broadcast
RECOMPUTE_LIMIT = 4

def _strip_movement(u: UOp) -> UOp:
  while u.op in GroupOp.Movement: u = u.src[0]
  return u

def _costly(value: UOp, outputs: set[UOp]) -> bool:
  """More than RECOMPUTE_LIMIT ALU ops (or any reduction) go into `value` within its kernel."""
  count, stack, seen = 0, [value], {value}
  while stack:
    node = stack.pop()
    if node.op is Ops.REDUCE_AXIS: return True
    if node.op in GroupOp.ALU:
      count += 1
      if count > RECOMPUTE_LIMIT: return True
    for s in node.src:
      if s not in seen and s not in outputs and s.op is not Ops.BUFFER:
        seen.add(s)
        stack.append(s)
  return False

SHARED_MATERIALIZE = ContextVar("SHARED_MATERIALIZE", 1, "1: an elementwise value that several kernels would each "
                                "recompute from many buffers gets a buffer of its own (e.g. a residual stream)")
# a buffer costs a kernel launch (microseconds): it must save at least this much memory traffic (a small value, like
# a fused optimizer's concatenated gradients, is recomputed)
MATERIALIZE_MIN_SAVED_BYTES = 64 << 10
_SET_CAP = 16   # sets of consumer kernels and of loaded buffers are only counted: beyond this size, the count is enough

def _materialize_shared(nodes: list[UOp], users: dict[UOp, list[UOp]], outputs: set[UOp]) -> bool:
  """Add to `outputs` (and say whether it added any) the elementwise values that several kernels would recompute at
  a higher memory cost than reading them from a buffer of their own.

  A value that loads B buffers, recomputed inside each of its C consumer kernels, reads B*C elements per element; a
  buffer costs B reads and one write once, then one read per consumer: B + 1 + C. A residual stream (`x = x + f(x)`
  per layer) is the case that matters: recomputed, layer L's norm and epilogue kernels each load every earlier
  layer's outputs, so no two layers share a kernel (the anchors' 4-layer transformer: 33 distinct kernels to
  compile instead of 14). Decided in graph order, so a value downstream of a new buffer loads that buffer only. Only
  where the traffic saved is worth a kernel launch (MATERIALIZE_MIN_SAVED_BYTES)."""
  # the kernels that compute each node: the outputs it is reached from through non-output nodes (capped sets)
  kernels: dict[UOp, set[UOp]] = {}
  for n in reversed(nodes):
    found: set[UOp] = set()
    for u in users[n]:
      if len(found) >= _SET_CAP: break
      if u in outputs: found.add(u)
      else: found |= kernels[u]
    kernels[n] = found
  # the buffers each node loads within its kernel, with the decisions made so far (graph order: sources first)
  loads: dict[UOp, frozenset] = {}
  # values computed from a reduction inside their kernel (a row chain, a matmul's epilogue) stay where they are
  after_reduce: set[UOp] = set()
  added = False
  for n in nodes:
    if n.op is Ops.BUFFER: loads[n] = frozenset((n,)); continue
    found_loads: set[UOp] = set()
    for s in n.src:
      if s in outputs: found_loads.add(s)
      else:
        if len(found_loads) < _SET_CAP: found_loads |= loads[s]
        if s.op is Ops.REDUCE_AXIS or s in after_reduce: after_reduce.add(n)
    # a value whose one user extends it elementwise leaves the choice to that user (it loads at least as much)
    extended = len(users[n]) == 1 and users[n][0].op in GroupOp.Elementwise
    if n.op in GroupOp.Elementwise and n not in outputs and n.shape and not extended and n not in after_reduce:
      b, c = len(found_loads), len(kernels[n])
      saved = (b * c - (b + 1 + c)) * _largest(n.size) * n.dtype.itemsize
      if c >= 2 and saved > MATERIALIZE_MIN_SAVED_BYTES:
        outputs.add(n)
        added = True
    loads[n] = frozenset(found_loads)
  return added

def _passes_through(node: UOp, roots: set[UOp]) -> bool:
  """A node the scheduler drops for its source: DETACH and friends, and UNIQUE except as a root (two distinct
  tensors of one value realized together still get a buffer each)."""
  return node.op in PASS_THROUGH or (node.op is Ops.UNIQUE and node not in roots)

def _prepare(roots: list[UOp]) -> tuple[list[UOp], bool]:
  """Replace realized nodes by their buffers and drop DETACH/CONTIGUOUS_BACKWARD/CUSTOM_BACKWARD/UNIQUE. Also says
  whether the graph reads or writes a file (a DISK buffer or a copy into one: only then do the DISK hooks walk it)."""
  mapping: dict[UOp, UOp] = {}
  reads_disk, passes = False, False
  root_set = set(roots)
  nodes = whole_graph_toposort(roots, stop=lambda u: u.forward is not None)
  for node in nodes:
    if node.forward is not None:
      mapping[node] = target = resolve(node)
      base = target.base
      reads_disk = reads_disk or base.op is not Ops.BUFFER or is_disk(base.arg[1])
    elif node.op is Ops.BUFFER: reads_disk = reads_disk or is_disk(node.arg[1])
    elif node.op is Ops.COPY: reads_disk = reads_disk or is_disk(node.arg)
    elif _passes_through(node, root_set): passes = True
  if not mapping and not passes: return roots, reads_disk
  # a pass-through node becomes its source as rewritten here, not the original source: that would bring back an
  # unrewritten copy of the graph below it, which the scheduler then computes a second time (each softmax's detached
  # max did so in a transformer: 105 kernels instead of 58 for 4 blocks)
  done: dict[UOp, UOp] = {}
  for node in nodes:
    if node in mapping: done[node] = mapping[node]
    elif _passes_through(node, root_set): done[node] = done[node.src[0]]
    else:
      src = tuple(done[s] for s in node.src)
      done[node] = node if src == node.src else node.replace(src=src)
  # distinct roots that became one node (they differed only below a UNIQUE or DETACH: two optimizers' zero states
  # updated by one gradient, two same-shaped parameters' first updates) are distinct tensors: each keeps a buffer of
  # its own, or assigning one of them later would overwrite the other (the later ones copy the first's value)
  prepared: list[UOp] = []
  seen: set[UOp] = set()
  for r in roots:
    node = done[r]
    if node in seen and not is_realized_view(node): node = node.unique()
    seen.add(node)
    prepared.append(node)
  return prepared, reads_disk

def _packs_matmul_operands(device: str) -> bool: return Device[device].renderer.packs_matmul_operands

ATTENTION_FUSION = ContextVar("ATTENTION_FUSION", 1, "1: on GPU targets, softmax(q @ k^T + mask) @ v runs as one "
                              "flash-style kernel (kiln/schedule/attention.py); 0: three kernels, as on a CPU")

def _has_local(device) -> bool:
  """`device` is one GPU target (blocks of threads, shared memory)."""
  return isinstance(device, str) and Device[device].renderer.has_local

def create_schedule(roots: list[UOp], use_cache: bool = True) -> Schedule:
  """The kernels that realize `roots`, in run order, and what realizing them reads and overwrites. A graph of a
  structure scheduled before is served from the schedule cache (kiln/schedule/cache.py) unless `use_cache` is False.
  A graph over several devices is first rewritten into one graph per device (kiln/schedule/multi.py)."""
  if _multi.multi_made and any(_multi.needs_lowering(r) for r in roots): return _schedule_multi(roots, use_cache)
  return _schedule_per_device(roots, use_cache)

def _schedule_multi(roots: list[UOp], use_cache: bool) -> Schedule:
  """Schedule the per-device graphs of `roots`; a root over several devices gets a MULTI of its shards' results."""
  lowered = _multi.lower_all(roots, resolve)
  flat = list(dict.fromkeys(s for node in lowered for s in (node.src if node.op is Ops.MULTI else (node,))))
  inner = _schedule_per_device(flat, use_cache)
  results = {}
  for root, node in zip(roots, lowered):
    if node.op is Ops.MULTI: results[root] = _multi.multi([inner.results[s] for s in node.src], node.arg)
    else: results[root] = inner.results[node]
  return Schedule(inner.items, results, inner.inputs, inner.overwritten)

def _schedule_per_device(roots: list[UOp], use_cache: bool = True) -> Schedule:
  """create_schedule for graphs whose every node is on one device."""
  if use_cache and SCHEDULE_CACHE.value:
    return cached_schedule(roots, _schedule_uncached, ScheduleItem, Schedule, buffer_view, _assign_result)
  original_roots = roots
  roots, reads_disk = _prepare(roots)
  if reads_disk:
    if files := unwritten_files(roots): return _schedule_files_first(original_roots, roots, files)
    roots = lower_disk_views(roots)   # file tensors: byte-range views become buffers, never kernels
  nodes = whole_graph_toposort(roots)
  if (packed := pack_matmuls(roots, nodes, _packs_matmul_operands)) is not roots:
    roots, nodes = packed, whole_graph_toposort(packed)
  if SPEC: check_tensor_graph(roots)
  users = _consumers(nodes)

  # 1. where buffers are materialized
  outputs: set[UOp] = set()
  for r in roots:
    if not is_realized_view(r): outputs.add(r)
  for n in nodes:
    if n.op in _MATERIALIZED_OPS: outputs.add(n)
    if n.op is Ops.COPY and not is_contiguous_buffer(n.src[0]) and not _copies_a_range(n.src[0]): outputs.add(n.src[0])
    if n.op is Ops.ALLREDUCE: outputs.update(s for s in n.src if not is_contiguous_buffer(s))
    if n.op is Ops.BUFFER and n.buffer is None: raise RuntimeError(f"schedule: buffer {n.arg} has no storage")
  # an expensive elementwise value that is broadcast would be recomputed for every copy: compute it once (unless it
  # is a per-row value of a row chain, decided once the reductions are)
  per_row: list[UOp] = []
  for n in nodes:
    if n.op is Ops.EXPAND:
      src = _strip_movement(n.src[0])
      if src.op in GroupOp.Elementwise and src not in outputs and _costly(src, outputs):
        if ROW_FUSION and _row_broadcast_of_reductions(n, src, outputs): per_row.append(src)
        else: outputs.add(src)
  # a reduction that cannot stay in its consumer's registers, nor in its row chain's kernel, gets its own buffer
  reduce_outputs: list[UOp] = []
  for n in nodes:
    if n.op is Ops.REDUCE_AXIS and n not in outputs and not _reduce_fuses_upward(n, users, outputs) \
       and not (ROW_FUSION and _reduce_fuses_by_row(n, users, outputs)):
      outputs.add(n)
      reduce_outputs.append(n)
    # a tiled matmul on a host CPU is stored before an epilogue of software math (kiln/schedule/pack.py)
    elif n.op is Ops.REDUCE_AXIS and n not in outputs and isinstance(device := n.device, str) and \
         _packs_matmul_operands(device) and splits_epilogue(n, users, outputs):
      outputs.add(n)
  # a per-row value whose reductions all got buffers after all is an ordinary broadcast value again
  for src in per_row:
    if src not in outputs and not _has_fused_reduce(src, outputs) and _costly(src, outputs): outputs.add(src)
  if SHARED_MATERIALIZE and _materialize_shared(nodes, users, outputs):
    # a reduction whose consumers now meet in one new buffer (a matmul plus the residual it is added to) joins it
    for n in reduce_outputs:
      if _reduce_fuses_upward(n, users, outputs): outputs.discard(n)
  # on a GPU target an attention chain (scores, softmax, weighted values) is one kernel (kiln/schedule/attention.py)
  if ATTENTION_FUSION: outputs -= attention_buffers(nodes, users, outputs, set(roots), _has_local)
  # an assign whose value reads its target at other indices is computed into a temporary, then copied over
  for n in nodes:
    if n.op is Ops.ASSIGN and n.src[1] not in outputs and not _safe_in_place(n.src[1], n.src[0], outputs):
      outputs.add(n.src[1])

  # 2. a buffer for every output; assign writes into its target's buffer
  buffer_of: dict[UOp, UOp] = {}
  for n in nodes:
    if n not in outputs: continue
    if n.op is Ops.ASSIGN: buffer_of[n] = n.src[0].base
    else:
      device = n.device
      size = n.size if type(n.size) is int else sint_max(n.size)   # symbolic: room for the largest value
      buffer_of[n] = UOp.new_buffer(device, size, n.dtype)
      buffer_of[n].buffer = Buffer(device, size, n.dtype)

  # 3. one kernel (or copy) per output, reading other outputs through views of their buffers
  # an assign through a view (a slice of a cache) is read back through that same view of its buffer
  views = {n: n.src[0] if _writes_through_view(n) else buffer_view(buffer_of[n], n.shape) for n in outputs}
  items: list[tuple[UOp, ScheduleItem]] = []
  all_reduces: set[tuple] = set()
  for n in nodes:
    if n not in outputs: continue
    out_buf = buffer_of[n]
    if n.op is Ops.ALLREDUCE:
      if (item := _all_reduce_item(n, buffer_of, views, all_reduces)) is not None: items.append((n, item))
      continue
    if n.op is Ops.COPY:
      if (src := views.get(n.src[0])) is not None or is_contiguous_buffer(n.src[0]):
        src = src if src is not None else n.src[0]
        items.append((n, ScheduleItem(UOp(Ops.COPY, n.dtype, (), n.arg), [out_buf.buffer, src.base.buffer])))
        continue
      # a contiguous run of a buffer (or of another output's): copied from its place, no kernel first
      base, offset = contiguous_range(n.src[0])
      src_buf = (views[base].base if base in views else base).buffer
      items.append((n, ScheduleItem(UOp(Ops.COPY, n.dtype, (), (n.arg, offset * n.dtype.itemsize)),
                                    [out_buf.buffer, src_buf])))
      continue
    value = n.src[1] if n.op is Ops.ASSIGN else (n.src[0] if n.op in _OWN_BUFFER_OPS else n)
    # every other output is read through its view; this one's own view is left out for the moment (popping it is
    # O(1), a copy of the dict without it was O(outputs) per kernel: ~0.4 s for a ResNet-50 step's 1300 kernels)
    own_view = views.pop(n)
    value = substitute(value, views) if views else value
    views[n] = own_view
    if n.op is Ops.ASSIGN and value.op is Ops.RESHAPE and value.src[0] is out_buf: continue   # x.assign(x)
    if n.size == 0: continue
    items.append((n, _make_kernel(out_buf, value, n.src[0] if _writes_through_view(n) else None)))

  ordered = _order(items)
  root_set = set(roots)
  intermediates = {id(buffer_of[n].buffer) for n in outputs if n not in root_set and n.op is not Ops.ASSIGN}
  if not NO_MEMORY_PLANNER: plan_memory(ordered, intermediates)
  result_map = {orig: _result_node(r, buffer_of) for orig, r in zip(original_roots, roots)}
  inputs = list({id(n.buffer): n.buffer for n in nodes if n.op is Ops.BUFFER}.values())
  overwritten = [buffer_of[n].buffer for n in outputs if n.op is Ops.ASSIGN]
  return Schedule(ordered, result_map, inputs, overwritten)

def _all_reduce_item(n: UOp, buffer_of: dict[UOp, UOp], views: dict[UOp, UOp], done: set) -> ScheduleItem | None:
  """The one item of the all-reduce that ALLREDUCE node `n` is a device's result of (None if made already): an
  output per device, in device order (a scratch buffer for a device whose result nothing reads), then the partials."""
  op, i = n.arg
  partials = n.src[len(n.src) - i:] + n.src[:len(n.src) - i] if i else n.src
  if (key := (op, partials)) in done: return None
  done.add(key)
  outs = []
  for j, p in enumerate(partials):
    node = UOp(Ops.ALLREDUCE, n.dtype, partials[j:] + partials[:j], (op, j))
    outs.append(buffer_of[node].buffer if node in buffer_of else Buffer(p.device, p.size, p.dtype))
  reads = [(views[p] if p in views else p).base.buffer for p in partials]
  ast = UOp(Ops.ALLREDUCE, n.dtype, (), (op, tuple(p.device for p in partials)))
  return ScheduleItem(ast, outs + reads, n_out=len(outs))

def _schedule_uncached(roots: list[UOp]) -> Schedule: return _schedule_per_device(roots, use_cache=False)

def _schedule_files_first(original_roots: list[UOp], roots: list[UOp], files: list[UOp]) -> Schedule:
  """`roots` read views of files that the copies `files` write: those copies run first, then the rest of the graph
  reads the files' bytes through views of their buffers (`x.to("disk:f")[0:2].numpy()`)."""
  first = create_schedule(files, use_cache=False)
  written = list(substitute(UOp(Ops.SINK, dtypes.void, tuple(roots)), first.results).src)
  rest = create_schedule(written, use_cache=False)
  made = {id(node.base.buffer) for node in first.results.values()}   # the files' buffers: results, not inputs
  inputs = list({id(b): b for b in first.inputs + rest.inputs if id(b) not in made}.values())
  results = {orig: rest.results[w] for orig, w in zip(original_roots, written)}
  return Schedule(first.items + rest.items, results, inputs, first.overwritten + rest.overwritten)

def _writes_through_view(n: UOp) -> bool:
  """An ASSIGN whose target is a view of its buffer other than the whole buffer in row-major order."""
  return n.op is Ops.ASSIGN and not is_contiguous_buffer(n.src[0])

def _copies_a_range(src: UOp) -> bool:
  """A copy's source is a contiguous run of a realized buffer or of a node the schedule gives a buffer of its own
  (kiln/engine/realize.py copies it from its offset)."""
  found = contiguous_range(src)
  if found is None: return False
  base = found[0]
  return (base.op is Ops.BUFFER and base.buffer is not None) or base.op in _OWN_BUFFER_OPS or base.op is Ops.COPY

def _safe_in_place(value: UOp, target_view: UOp, outputs: set[UOp]) -> bool:
  """`value` can be stored straight into the target's buffer: within its kernel (down to other materialized
  outputs, which run first) it reads that buffer only through `target_view` itself, reached by elementwise ops
  alone, so each element is read at the index it is written to. A pending assign to the same buffer counts as a
  read of it: its result is read back from that buffer (`b *= 2; b.assign(b.flip(0))`)."""
  target_buf = target_view.base.buffer
  def reads_target(m: UOp) -> bool:
    return m.op is Ops.BUFFER and m.buffer is target_buf or m.op is Ops.ASSIGN and m.src[0].base.buffer is target_buf
  aligned, stack = set(), [value]
  while stack:
    node = stack.pop()
    if node in aligned: continue
    aligned.add(node)
    if node.op in GroupOp.Elementwise: stack.extend(node.src)
  for node in aligned:
    if node is target_view or node.op in GroupOp.Elementwise: continue
    inside_kernel = toposort([node], stop=lambda u: u in outputs and u is not node)
    if any(reads_target(m) for m in inside_kernel): return False
  return True

def _result_node(root: UOp, buffer_of: dict[UOp, UOp]) -> UOp:
  if root in buffer_of:
    if root.op is Ops.ASSIGN: return _assign_result(root)
    return buffer_view(buffer_of[root], root.shape)
  return root

def _assign_result(root: UOp) -> UOp:
  """The node an assign root's value is read through once it ran: its target view over a new BUFFER node of the same
  storage (a new identity, so nodes built on the old contents never look realized)."""
  target = root.src[0]
  buf = target.base
  fresh = UOp.new_buffer(buf.arg[1], buf.arg[2], buf.dtype)
  fresh.buffer = buf.buffer
  views = []   # the movement ops from target down to its base: rebuilt over the new node, as substitute would
  node = target
  while node is not buf:
    views.append(node)
    node = node.src[0]
  result = fresh
  for view in reversed(views):
    rebuilt = view.replace(src=(result,))
    if rebuilt.meta is None: rebuilt.meta = view.meta
    result = rebuilt
  return result

# kernels index with 32-bit ints: every shape they see may have at most this many elements (indices 0 .. 2**31 - 1;
# attention's fused scores at B=8, H=16, S=4096 have exactly 2**31)
MAX_INDEXED_ELEMENTS = 2 ** 31
# EXPAND is not among them: an expanded axis has stride 0 and adds nothing to an index (a RESHAPE that flattens
# an expanded view is, and is checked)
INDEXED_OPS = frozenset({Ops.BUFFER, Ops.RESHAPE, Ops.PAD, Ops.REDUCE_AXIS})

def _largest(size) -> int:
  """A size, or the largest value of a symbolic size."""
  return size if type(size) is int else sint_max(size)

def _make_kernel(out_buf: UOp, value: UOp, target_view: UOp | None = None) -> ScheduleItem:
  """A kernel AST whose buffers are numbered parameters, so equal computations share one compiled program.

  Parameters are given per Buffer object, not per BUFFER node: two nodes over one Buffer (an assigned tensor and
  an older reference to it) share one parameter, so no kernel receives the same memory twice.
  """
  out_param = UOp(Ops.DEFINE_GLOBAL, out_buf.dtype, (), 0)
  param_of_buffer: dict[int, UOp] = {id(out_buf.buffer): out_param}
  bufs = [out_buf.buffer]
  params: dict[UOp, UOp] = {}
  metadata: list[str] = []
  for m in toposort([value]):
    if m.op is Ops.BUFFER and m not in params:
      if id(m.buffer) not in param_of_buffer:
        param_of_buffer[id(m.buffer)] = UOp(Ops.DEFINE_GLOBAL, m.dtype, (), len(bufs))
        bufs.append(m.buffer)
      # the RESHAPE keeps the (size,) shape a BUFFER has and a DEFINE_GLOBAL lacks
      params[m] = UOp(Ops.RESHAPE, m.dtype, (param_of_buffer[id(m.buffer)],), (m.arg[2],))
    if m.meta and m.meta not in metadata: metadata.append(m.meta)
    if m.op in INDEXED_OPS and _largest(m.size) > MAX_INDEXED_ELEMENTS:
      raise RuntimeError(f"kernel for {', '.join(metadata[:2]) or 'this tensor'}: a view of shape {m.shape} has more than "
                         f"{MAX_INDEXED_ELEMENTS} elements, which 32-bit kernel indices cannot address yet")
  value = substitute(value, params)
  if value.dtype != out_buf.dtype: value = value.cast(out_buf.dtype)
  # written through a view: the STORE's target is that view over the output parameter (the lowerer maps indices)
  target = out_param if target_view is None else \
    substitute(target_view, {out_buf: UOp(Ops.RESHAPE, out_buf.dtype, (out_param,), (out_buf.arg[2],))})
  ast = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (target, value)),))
  if not _ops.binds_made: return ScheduleItem(ast, bufs, tuple(metadata))   # eager dispatch: skip the scan
  ast, var_vals = strip_binds(ast)
  return ScheduleItem(ast, bufs, tuple(metadata), var_vals)

def _order(items: list[tuple[UOp, ScheduleItem]]) -> list[ScheduleItem]:
  """Run order: producers before consumers, and every read of a buffer before an assign overwrites it."""
  assign_bit = {node: 1 << i for i, (node, _) in enumerate(items) if node.op is Ops.ASSIGN}
  # which assigns each node depends on, as a bitmask (one pass over the graph)
  after_assigns: dict[UOp, int] = {}
  if assign_bit:
    for n in toposort([node for node, _ in items]):
      mask = assign_bit.get(n, 0)
      for src in n.src: mask |= after_assigns[src]
      after_assigns[n] = mask
  writer_of: dict[int, list[int]] = {}
  for i, (node, item) in enumerate(items):
    for b in item.bufs[:item.n_out]: writer_of.setdefault(id(b), []).append(i)
  deps: list[set[int]] = [set() for _ in items]
  for i, (node, item) in enumerate(items):
    for b in item.bufs[item.n_out:]:
      for w in writer_of.get(id(b), []):
        if w == i: continue
        writer = items[w][0]
        if writer.op is Ops.ASSIGN and not after_assigns[node] & assign_bit[writer]: deps[w].add(i)   # read old first
        else: deps[i].add(w)
  order, state = [], [0] * len(items)
  for start in range(len(items)):
    stack = [(start, False)]
    while stack:
      i, done = stack.pop()
      if done:
        if state[i] != 2:
          state[i] = 2
          order.append(items[i][1])
        continue
      if state[i]: continue
      state[i] = 1
      stack.append((i, True))
      stack.extend((d, False) for d in deps[i] if not state[d])
  return order
