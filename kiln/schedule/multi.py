"""Multi-device tensors: one value spread over several devices, and the rewrite into one graph per device.

A MULTI node holds a tensor-level graph per device (`src`, in device order): each a replica of the whole value (`arg`
None) or its slice along axis `arg`, the slices in device order (their sizes add up to the value's; uneven and empty
slices are allowed). Tensor ops on multi-device tensors build ordinary nodes over MULTI leaves, so shapes, autograd
and the schedule cache see one value. `lower` rewrites such a node into a MULTI of per-device graphs, adding the
communication its ops need:
- elementwise ops run per device; a replicated operand is sliced locally to match a sharded one;
- a reduction over the sharded axis reduces each slice, then all-reduces (`all_reduce`: naive, or a ring: RING; on
  CUDA devices one NCCL all-reduce, ALLREDUCE nodes: NCCL);
- movement ops keep the sharding where each device's slice stays whole (reshapes that split or merge the sharded axis
  with the axes after it, permutes, expands and pads of other axes, shrinks: a shrink of the sharded axis keeps each
  device's part of the window, possibly empty); the rest gather the slices onto every device first (the result is
  replicated);
- a copy to one device gathers (concatenates) the slices there; a copy to several replicates.
Lowering runs when a Tensor op builds a node (its errors name the user's line) and again before scheduling, from
realized values; both are memoized by the lowered sources.
"""
from __future__ import annotations
import weakref
from kiln.dtype import dtypes
from kiln.helpers import RING, NCCL
from kiln.uop.ops import UOp, Ops, GroupOp, toposort

RING_MIN_ELEMENTS = 1 << 18   # below this a ring's extra copies and kernels cost more than the naive sum saves
_nccl_found: list[bool] = []   # whether libnccl loads, once asked
COLLECTIVE_KINDS = ("CUDA",)   # device kinds whose all-reduce may be one NCCL collective (tests add "CPU": host memory)

class MultiDeviceError(RuntimeError):
  """An op whose operands' devices or layouts cannot be combined."""

# ---------------- layouts ----------------

def shard_bounds(size: int, count: int, splits: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
  """The [start, end) of each device's slice of an axis of `size`: `splits` if given, else equal slices of
  ceil(size / count) with the last ones shorter (10 over 4 devices: 3, 3, 3, 1)."""
  if splits is None:
    step = -(-size // count) if count else 0
    splits = tuple(max(0, min(step, size - step * i)) for i in range(count))
  if len(splits) != count or sum(splits) != size or any(s < 0 for s in splits):
    raise ValueError(f"shard: splits {tuple(splits)} must be {count} sizes >= 0 adding up to {size}")
  bounds, start = [], 0
  for s in splits:
    bounds.append((start, start + s))
    start += s
  return bounds

def multi(shards: list[UOp] | tuple[UOp, ...], axis: int | None) -> UOp:
  """A MULTI node over per-device `shards` (replicas when `axis` is None)."""
  global multi_made
  multi_made += 1
  return UOp(Ops.MULTI, shards[0].dtype, tuple(shards), axis)

multi_made = 0   # MULTI nodes built and device tuples named: until one is, no graph needs lowering

def note_several_devices() -> None:
  """A tuple of devices was named (a node over them may be built without a MULTI): graphs may need lowering now."""
  global multi_made
  multi_made += 1

def is_multi_device(device) -> bool: return type(device) is tuple

def devices_of(m: UOp) -> tuple[str, ...]:
  """The devices of MULTI `m`, in order (UOp.device: found once, then kept on the node)."""
  return m.device

_bounds_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # MULTI -> its slices' [start, end)

def _bounds(m: UOp) -> list[tuple[int, int]]:
  """The [start, end) of each slice of a sharded MULTI along its axis."""
  if (known := _bounds_of.get(m)) is not None: return known
  start, out = 0, []
  for s in m.src:
    out.append((start, start + s.shape[m.arg]))
    start += s.shape[m.arg]
  _bounds_of[m] = out
  return out

def _sizes(m: UOp) -> tuple[int, ...] | None:
  return None if m.arg is None else tuple(s.shape[m.arg] for s in m.src)

# ---------------- communication ----------------

def _cat(pieces: list[UOp], axis: int) -> UOp:
  """`pieces` (on one device) joined along `axis`: each padded to the whole and summed. Floats pad with -0.0, the
  additive identity that keeps a -0.0 element's sign; bools are or-ed."""
  pieces = [p for p in pieces if p.shape[axis] != 0] or pieces[:1]
  if len(pieces) == 1: return pieces[0]
  total, offset, padded = sum(p.shape[axis] for p in pieces), 0, []
  for p in pieces:
    size, ndim = p.shape[axis], len(p.shape)
    amounts = tuple((offset, total - offset - size) if k == axis else (0, 0) for k in range(ndim))
    grown = p.pad(amounts)
    if dtypes.is_float(p.dtype):
      inside = UOp.const(dtypes.bool, True, p.device).reshape((1,) * ndim).expand(p.shape).pad(amounts)
      grown = inside.where(grown, UOp.const(p.dtype, -0.0, p.device).reshape((1,) * ndim).expand(grown.shape))
    padded.append(grown)
    offset += size
  op = Ops.OR if pieces[0].dtype == dtypes.bool else Ops.ADD
  while len(padded) > 1:   # a balanced tree keeps the graph shallow
    padded = [padded[i].alu(op, padded[i + 1]) for i in range(0, len(padded) - 1, 2)] + \
             ([padded[-1]] if len(padded) % 2 else [])
  return padded[0]

def _to(x: UOp, device: str) -> UOp: return x if x.device == device else x.copy_to(device)

def gather(m: UOp, device: str) -> UOp:
  """The whole value of MULTI `m` on one `device`: a replica (the one on `device` if it has one), or the slices
  copied there and joined."""
  if m.arg is None:
    for s in m.src:
      if s.device == device: return s
    return m.src[0].copy_to(device)
  return _cat([_to(s, device) for s in m.src], m.arg)

def all_gather(m: UOp) -> UOp:
  """MULTI `m` replicated: every device gets the whole value."""
  if m.arg is None: return m
  return multi([gather(m, d) for d in devices_of(m)], None)

def _slice_local(m: UOp, axis: int, bounds: list[tuple[int, int]]) -> UOp:
  """A replicated MULTI as slices along `axis` with `bounds`: each device keeps its own part (no copies)."""
  def window(s: UOp, b: tuple[int, int]) -> UOp:
    return s.shrink(tuple(b if k == axis else (0, n) for k, n in enumerate(s.shape)))
  return multi([window(s, b) for s, b in zip(m.src, bounds)], axis)

def relayout(m: UOp, axis: int | None, bounds: list[tuple[int, int]] | None) -> UOp:
  """MULTI `m` with the layout (`axis`, `bounds`): unchanged, sliced locally, or gathered first."""
  if m.arg == axis and (axis is None or _bounds(m) == bounds): return m
  replicated = all_gather(m)
  return replicated if axis is None else _slice_local(replicated, axis, bounds)

def all_reduce(op: Ops, partials: list[UOp]) -> list[UOp]:
  """Per-device values of one shape combined with `op` (ADD, MUL or MAX): every device gets the same result, bit
  for bit (the same sums in the same order). A ring (reduce-scatter then all-gather of chunks, 2(n-1) steps of one
  chunk a device) for large values over 3+ devices under RING=1, always under RING=2; else each device combines
  copies of every partial."""
  n, shape = len(partials), partials[0].shape
  numel = 1
  for s in shape: numel *= s
  use_ring = RING.value >= 2 or (RING.value >= 1 and n > 2 and numel >= RING_MIN_ELEMENTS)
  if n == 1: return partials
  if _collective(op, partials):   # one NCCL all-reduce: a node per device, scheduled as one item
    srcs = [UOp(Ops.CONTIGUOUS, p.dtype, (p,)) for p in partials]
    return [UOp(Ops.ALLREDUCE, p.dtype, tuple(srcs[i:] + srcs[:i]), (op, i)) for i, p in enumerate(partials)]
  if not use_ring or numel < n:
    combined = []
    for d in (p.device for p in partials):
      total = _to(partials[0], d)
      for p in partials[1:]: total = total.alu(op, _to(p, d))
      combined.append(total)
    return combined
  flat = [UOp(Ops.CONTIGUOUS, p.dtype, (p,)).reshape((numel,)) for p in partials]
  devices = [p.device for p in partials]
  chunks = [[f.shrink((b,)) for b in shard_bounds(numel, n)] for f in flat]   # chunks[device][chunk]
  for step in range(n - 1):   # reduce-scatter: device i sends chunk i - step on; at the end it holds chunk i + 1
    for i in range(n):
      c, j = (i - step) % n, (i + 1) % n
      chunks[j][c] = chunks[j][c].alu(op, chunks[i][c].copy_to(devices[j]))
  for step in range(n - 1):   # all-gather: the finished chunks go round the ring
    for i in range(n):
      c, j = (i + 1 - step) % n, (i + 1) % n
      chunks[j][c] = chunks[i][c].copy_to(devices[j])
  return [_cat(chunks[i], 0).reshape(shape) for i in range(n)]

def _collective(op: Ops, partials: list[UOp]) -> bool:
  """Whether the all-reduce of `partials` runs as one NCCL collective: NCCL=1, every device one of
  COLLECTIVE_KINDS (distinct ordinals), NCCL has the dtype and the op, and libnccl loads."""
  if not NCCL.value: return False
  devices = [p.device for p in partials]
  if not all(type(d) is str and d.split(":")[0] in COLLECTIVE_KINDS for d in devices): return False
  if len({d.partition(":")[2] or "0" for d in devices}) != len(devices): return False
  from kiln.runtime import nccl
  if not _nccl_found: _nccl_found.append(nccl.available())   # looked for once (a miss searches every path)
  return partials[0].dtype in nccl.NCCL_DTYPES and op in nccl.NCCL_OPS and _nccl_found[0]

# ---------------- lowering ----------------

# ops computed per device on operands of one layout
_PER_DEVICE = GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.UNIQUE}
# ops whose value is their source's (the scheduler drops them): lowered to it
_DROPPED = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_BACKWARD})
_lowered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # node -> (its sources' lowerings, its own)

def _describe(op: Ops) -> str: return op.name.lower()

def _with_layout(srcs: list[UOp], node: UOp) -> list[UOp]:
  """The MULTI sources of `node` brought to one layout: the first sharded one's (replicas are sliced to it locally,
  others gathered and sliced)."""
  multis = [s for s in srcs if s.op is Ops.MULTI]
  devices = devices_of(multis[0])
  for s in multis:
    if devices_of(s) != devices:
      raise MultiDeviceError(f"{_describe(node.op)}: operands on different devices, {devices} and {devices_of(s)}")
  for s in srcs:
    if s.op is not Ops.MULTI and s.device is not None:
      raise MultiDeviceError(f"{_describe(node.op)}: operands on different devices, {devices} and {s.device}")
  lead = next((s for s in multis if s.arg is not None), multis[0])
  axis, bounds = lead.arg, (_bounds(lead) if lead.arg is not None else None)
  return [relayout(s, axis, bounds) if s.op is Ops.MULTI else s for s in srcs]

def _per_device(node: UOp, srcs: list[UOp], axis: int | None) -> UOp:
  """`node` built on each device from its sources' slices (sources without a device are shared)."""
  count = len(next(s for s in srcs if s.op is Ops.MULTI).src)
  return multi([node.replace(src=tuple(s.src[i] if s.op is Ops.MULTI else s for s in srcs)) for i in range(count)], axis)

def _replicate_device_node(node: UOp, srcs: list[UOp]) -> UOp:
  """A node over a DEVICE of several devices (a constant, an iota): one copy per device."""
  dev = next(s for s in srcs if s.op is Ops.DEVICE and is_multi_device(s.arg))
  return multi([node.replace(src=tuple(UOp(Ops.DEVICE, arg=d) if s is dev else s for s in srcs)) for d in dev.arg], None)

def _reshape_axis(old: tuple, new: tuple, axis: int, bounds: list[tuple[int, int]]) -> tuple[int, list[tuple]] | None:
  """Where the sharded `axis` of `old` lands in the reshape to `new`, and each device's new local shape: the axis
  must start where an axis of `new` starts, and each slice must cover whole rows of it."""
  before = 1
  for s in old[:axis]: before *= s
  inner_old = 1
  for s in old[axis + 1:]: inner_old *= s
  prefix = 1
  for b, size in enumerate(new):
    if prefix == before and size != 1:
      inner_new = 1
      for s in new[b + 1:]: inner_new *= s
      if inner_new == 0 or any((start * inner_old) % inner_new or ((end - start) * inner_old) % inner_new
                               for start, end in bounds): return None
      shapes = [new[:b] + ((end - start) * inner_old // inner_new,) + new[b + 1:] for start, end in bounds]
      return b, shapes
    prefix *= size
    if prefix > before: return None
  return None

def _lower_movement(node: UOp, x: UOp) -> UOp:
  """A movement op on MULTI `x`: per device where each slice stays whole on its device, else on the gathered
  value."""
  op, axis, arg = node.op, x.arg, node.arg
  if axis is None: return multi([node.replace(src=(s,)) for s in x.src], None)
  bounds = _bounds(x)
  if op is Ops.RESHAPE:
    if (found := _reshape_axis(x.shape, tuple(arg), axis, bounds)) is not None:
      new_axis, shapes = found
      return multi([s.reshape(shape) for s, shape in zip(x.src, shapes)], new_axis)
  if op is Ops.PERMUTE: return multi([s.permute(arg) for s in x.src], tuple(arg).index(axis))
  if op is Ops.EXPAND and x.shape[axis] == arg[axis]:
    return multi([s.expand(tuple(s.shape[k] if k == axis else n for k, n in enumerate(arg))) for s in x.src], axis)
  if op is Ops.PAD and arg[axis] == (0, 0): return multi([s.pad(arg) for s in x.src], axis)
  if op is Ops.FLIP and axis not in arg: return multi([s.flip(arg) for s in x.src], axis)
  if op is Ops.SHRINK:   # each device keeps its part of the window (maybe none of it)
    lo, hi = arg[axis]
    def window(start: int, end: int) -> tuple[int, int]:
      first = min(max(lo, start), end)
      return first - start, max(first, min(hi, end)) - start
    return multi([s.shrink(tuple(window(*b) if k == axis else w for k, w in enumerate(arg)))
                  for s, b in zip(x.src, bounds)], axis)
  # the op moves elements between devices (a reshape that splits the slices' rows, a pad, flip or expand of the
  # sharded axis): on the whole value, gathered onto every device
  return multi([node.replace(src=(s,)) for s in all_gather(x).src], None)

def _lower_reduce(node: UOp, x: UOp) -> UOp:
  """A reduction: per device; over the sharded axis, then all-reduced (the result is replicated)."""
  op, axes = node.arg
  partials = [s.r(op, axes) for s in x.src]
  if x.arg is None or x.arg not in axes: return multi(partials, x.arg)
  return multi(all_reduce(op, partials), None)

def _lower_copy(node: UOp, x: UOp) -> UOp:
  """A copy: of a MULTI to one device (gathered there), of one device's value to several (replicated)."""
  target = node.arg
  if x.op is Ops.MULTI:
    if is_multi_device(target):
      if devices_of(x) == target: return x
      whole = all_gather(x)
      return multi([_to(whole.src[0], d) for d in target], None)
    return gather(x, target)
  if is_multi_device(target): return multi([_to(x, d) for d in target], None)
  return node.replace(src=(x,))

def _lower_assign(node: UOp, target: UOp, value: UOp) -> UOp:
  """An assign into a MULTI: per device, the value brought to the target's layout."""
  if target.op is not Ops.MULTI:
    raise MultiDeviceError(f"assign: the target is on {target.device} but the value is on several devices")
  if value.op is not Ops.MULTI:
    raise MultiDeviceError(f"assign: the target is on {devices_of(target)} but the value is on {value.device}")
  if devices_of(value) != devices_of(target):
    raise MultiDeviceError(f"assign: the target is on {devices_of(target)} but the value is on {devices_of(value)}")
  value = relayout(value, target.arg, _bounds(target) if target.arg is not None else None)
  return multi([node.replace(src=(t, v)) for t, v in zip(target.src, value.src)], target.arg)

def _lower_node(node: UOp, srcs: list[UOp]) -> UOp:
  """`node` with its sources lowered to `srcs`: a MULTI of per-device graphs if it involves several devices."""
  op = node.op
  if op is Ops.MULTI: return multi(srcs, node.arg)
  if op is Ops.MSELECT:
    index, _, axis, bounds = node.arg
    if srcs[0].op is not Ops.MULTI: raise MultiDeviceError("mselect: the value is on one device")
    return relayout(srcs[0], axis, list(bounds) if bounds is not None else None).src[index]
  has_multi = any(s.op is Ops.MULTI for s in srcs)
  if not has_multi:
    if op is Ops.COPY and is_multi_device(node.arg): return _lower_copy(node, srcs[0])
    if any(s.op is Ops.DEVICE and is_multi_device(s.arg) for s in srcs): return _replicate_device_node(node, srcs)
    return node if all(a is b for a, b in zip(srcs, node.src)) else node.replace(src=tuple(srcs))
  if op in _DROPPED: return srcs[0]
  if op is Ops.COPY: return _lower_copy(node, srcs[0])
  if op is Ops.ASSIGN: return _lower_assign(node, srcs[0], srcs[1])
  if op in _PER_DEVICE:
    srcs = _with_layout(srcs, node)
    lead = next(s for s in srcs if s.op is Ops.MULTI)
    return _per_device(node, srcs, lead.arg)
  if op is Ops.REDUCE_AXIS: return _lower_reduce(node, srcs[0])
  if op in GroupOp.Movement: return _lower_movement(node, srcs[0])
  raise MultiDeviceError(f"{_describe(op)}: not supported on tensors over several devices")

_unchanged: weakref.WeakSet = weakref.WeakSet()   # nodes that lower to themselves (their graphs are on one device)

def lower(root: UOp) -> UOp:
  """`root` as a MULTI of per-device graphs (or a single-device graph with its copies from several devices made
  explicit), as a Tensor op builds it: what it runs as, and whether it can (MultiDeviceError). Nodes lowered before
  are not walked again, so building a graph op by op costs one lowering per op."""
  if (known := _lowered.get(root)) is not None: return known[1]
  return _lower_walk([root], None, lambda u: u in _lowered or u in _unchanged)[0]

def lower_all(roots: list[UOp], resolve) -> list[UOp]:
  """`roots` lowered for scheduling: realized nodes become their values (`resolve`, kernelize.resolve), and every
  node's lowering is checked against its sources' (one walk of the whole graph)."""
  return _lower_walk(roots, resolve, lambda u: u.forward is not None)

def _lower_walk(roots: list[UOp], resolve, stop) -> list[UOp]:
  """Lower `roots` bottom-up, memoized by the sources' lowerings; at a `stop` node the walk ends: a realized node
  (with `resolve`) is its value, another is its remembered lowering."""
  done: dict[UOp, UOp] = {}
  for node in toposort(roots, stop=stop):
    if resolve is not None and node.forward is not None:
      done[node] = resolve(node)
      continue
    known = _lowered.get(node)
    if resolve is None and stop(node):
      done[node] = known[1] if known is not None else node
      continue
    srcs = [done[s] for s in node.src]
    if known is not None and len(known[0]) == len(srcs) and all(a is b for a, b in zip(known[0], srcs)):
      done[node] = known[1]
      continue
    done[node] = lowered = _lower_node(node, srcs)
    if lowered is not node: _lowered[node] = (tuple(srcs), lowered)
    elif all(a is b for a, b in zip(srcs, node.src)): _unchanged.add(node)
  return [done[r] for r in roots]

def involves_several_devices(node: UOp) -> bool:
  """Whether `node` (just built over lowered or realized sources) is on several devices or reads such a value: its
  own device, or a source that lowering rewrote."""
  return is_multi_device(node.device) or any(s in _lowered or s.op is Ops.MULTI for s in node.src)

_one_device: weakref.WeakSet = weakref.WeakSet()   # nodes whose whole graph is known to be on one device

def needs_lowering(root: UOp) -> bool:
  """Whether `root`'s graph involves several devices (once any MULTI was ever built: a walk of the graph, stopping at
  nodes known to be on one device)."""
  if not multi_made: return False
  if is_multi_device(root.device) or root in _lowered: return True
  if root in _one_device: return False
  nodes = toposort([root], stop=lambda n: n in _one_device)
  if any(n.op is Ops.MULTI or n.op is Ops.MSELECT or (n.op is Ops.DEVICE and is_multi_device(n.arg)) for n in nodes):
    return True
  for n in nodes: _one_device.add(n)
  return False

def layout_axis(node: UOp) -> int | None:
  """The sharded axis of a node over several devices (None when it is replicated or on one device)."""
  if not multi_made or not is_multi_device(node.device): return None
  return (node if node.op is Ops.MULTI else lower(node)).arg
