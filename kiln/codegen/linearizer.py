"""Linearizing: a lowered kernel graph becomes a list of uops with explicit loops and accumulators.

Every node is placed in the innermost loop it depends on. Output loops wrap the whole kernel, outermost first in the
order of their loop ids (the optimizer reorders loops by renumbering them). REDUCEs over the same loop ranges form a
*reduce group* (the optimizer's upcasts make several, one per accumulator): the group declares one accumulator per
REDUCE, opens its loops once (in loop-id order), emits the nodes that depend on those loops, updates every
accumulator and closes the loops. Groups nest when a reduction is computed inside another one's loops.

A reduce group (and every value computed from reductions) that does not depend on all output loops is emitted as
soon as the output loops it does depend on are open: in a fused row kernel (softmax, layernorm) each row's
reductions run in their own loops over the row, one after the other, before the row's elementwise loop.
"""
from __future__ import annotations
import itertools
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort, identity_element

GroupKey = tuple[UOp, ...]   # the loop ranges of a reduce group, sorted by loop id
Item = UOp | tuple[str, GroupKey]   # what one block of the kernel holds: a node, or a whole nested reduce group

def _range_order(rng: UOp):
  return (0, rng.arg) if isinstance(rng.arg, int) else (1, str(rng.arg))

class _KernelLayout:
  """Where each node of a lowered kernel goes: its loop scope, and the chain of reduce groups it sits in."""
  def __init__(self, sink: UOp):
    self.nodes = toposort([sink])
    self.groups: dict[GroupKey, list[UOp]] = {}
    self.group_of_range: dict[UOp, GroupKey] = {}
    for node in self.nodes:
      if node.op is not Ops.REDUCE: continue
      key = tuple(sorted(node.src[1:], key=_range_order))
      self.groups.setdefault(key, []).append(node)
      for rng in key:
        if self.group_of_range.setdefault(rng, key) != key:
          raise ValueError(f"linearize: loop range {rng.arg} is reduced by REDUCEs over different sets of ranges")
    # the loop ranges each node depends on (a REDUCE closes its own)
    self.scope: dict[UOp, frozenset[UOp]] = {}
    scope, empty = self.scope, frozenset()
    for node in self.nodes:
      # most nodes share their sources' scope: reuse that set rather than building an equal one per node
      deps = empty
      for s in node.src:
        if (d := scope[s]) is not deps and d and not d <= deps: deps = d if not deps else deps | d
      if node.op is Ops.RANGE: deps = deps | {node}
      elif node.op is Ops.REDUCE: deps = deps - frozenset(node.src[1:])
      self.scope[node] = deps
    self.group_path: dict[GroupKey, tuple[GroupKey, ...]] = {}
    for key in self.groups: self._path_of_group(key)
    self.path: dict[UOp, tuple[GroupKey, ...]] = {}
    path_of_scope: dict[frozenset[UOp], tuple[GroupKey, ...]] = {}   # nodes share few distinct scopes
    for node in self.nodes:
      if node.op is Ops.REDUCE or node in self.group_of_range:
        self.path[node] = self.group_path[self.group_of_range[node] if node.op is Ops.RANGE else
                                           tuple(sorted(node.src[1:], key=_range_order))]
      else:
        node_scope = scope[node]
        if (found := path_of_scope.get(node_scope)) is None:
          found = path_of_scope[node_scope] = self._path_of_scope(node_scope)
        self.path[node] = found

  def _innermost_group(self, scope: frozenset[UOp]) -> GroupKey | None:
    keys = {self.group_of_range[r] for r in scope if r in self.group_of_range}
    if not keys: return None
    # an inner group's REDUCEs depend on the loops of every group around them, so their scope is the largest
    return max(keys, key=lambda k: (len(self.scope[self.groups[k][0]]), _range_order(k[0])))

  def _path_of_scope(self, scope: frozenset[UOp]) -> tuple[GroupKey, ...]:
    inner = self._innermost_group(scope)
    return () if inner is None else self._path_of_group(inner)

  def _path_of_group(self, key: GroupKey) -> tuple[GroupKey, ...]:
    """The chain of groups from the outermost down to `key` itself (groups nest only a few levels deep)."""
    if key not in self.group_path:
      self.group_path[key] = self._path_of_scope(self.scope[self.groups[key][0]]) + (key,)
    return self.group_path[key]

  def item_at(self, node: UOp, level: int) -> Item | None:
    """What holds `node` in a block `level` groups deep: the node itself, the group it is in, or None (a loop
    range, opened by its group or by the kernel)."""
    path = self.path[node]
    if len(path) > level: return ("group", path[level])
    if node.op is Ops.RANGE or node.op is Ops.REDUCE: return None
    return node

def _accumulator_seeds(layout: _KernelLayout) -> dict[UOp, tuple[UOp, UOp]]:
  """REDUCE -> (the ADD of it and x, x) for every sum whose only use is `+ x` with x read from a stored buffer, known
  where the reduce group opens (x depends on no reduction and on no loop the REDUCE's own scope lacks)."""
  users: dict[UOp, set[UOp]] = {}   # of the REDUCEs only: nothing else is asked
  for node in layout.nodes:
    for src in node.src:
      if src.op is Ops.REDUCE: users.setdefault(src, set()).add(node)
  written = {u.src[0] for u in layout.nodes if u.op is Ops.STORE}
  seeds: dict[UOp, tuple[UOp, UOp]] = {}
  for node in layout.nodes:
    if node.op is not Ops.ADD or len(node.src) != 2: continue
    for red, x in (node.src, node.src[::-1]):
      if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or users.get(red) != {node} or red in seeds: continue
      inside = toposort([x])
      if any(u.op is Ops.REDUCE for u in inside) or not layout.scope[x] <= layout.scope[red]: continue
      if not any(u.op is Ops.LOAD and u.src[0] in written for u in inside): continue
      seeds[red] = (node, x)
      break
  return seeds

def linearize(sink: UOp) -> list[UOp]:
  """Lowered `SINK(STORE...)` -> a flat uop list (see docs/ir.md, stage 4)."""
  layout = _KernelLayout(sink)
  seeds = _accumulator_seeds(layout)
  seeded_adds = {add: red for red, (add, _) in seeds.items()}
  # the items of each block (keyed by its group path) in first-use order, and what each item needs first
  block_items: dict[tuple[GroupKey, ...], dict[Item, None]] = {(): {}}
  needs: dict[Item, dict[Item, None]] = {}
  top_items = block_items[()]
  for node in layout.nodes:
    if node.op is Ops.SINK: continue
    path = layout.path[node]
    if not path:   # the common case, a node of the kernel's top block: item_at at level 0, inlined
      if node.op is Ops.RANGE or node.op is Ops.REDUCE: continue   # opened by the kernel: needs nothing
      top_items[node] = None
      for src in node.src:
        src_path = layout.path[src]
        used = ("group", src_path[0]) if src_path else None if src.op is Ops.RANGE or src.op is Ops.REDUCE else src
        if used is not None and used is not node: needs.setdefault(node, {})[used] = None
      continue
    for level in range(len(path) + 1):
      item = layout.item_at(node, level)
      if item is not None: block_items.setdefault(path[:level], {})[item] = None
    for src in node.src:
      # a REDUCE's result exists once its group's loops close: in the block around the group (where a sibling group,
      # such as a row's sum after the row's max, may read it)
      src_path = layout.path[src][:-1] if src.op is Ops.REDUCE else layout.path[src]
      level = min(len(path), len(src_path))
      if path[:level] != src_path[:level]:
        raise ValueError(f"linearize: {node.op.name} uses a value from a reduction loop it is not inside")
      user, used = layout.item_at(node, level), layout.item_at(src, level)
      if user is not None and used is not None and user != used: needs.setdefault(user, {})[used] = None

  out: list[UOp] = []
  mapped: dict[UOp, UOp] = {}
  acc_ids = itertools.count()

  def emit(node: UOp) -> UOp:
    if (found := mapped.get(node)) is not None: return found
    if node in seeded_adds:   # the accumulator already holds x + the sum
      mapped[node] = mapped[seeded_adds[node]]
      return mapped[node]
    new_src = tuple(mapped.get(s, s) for s in node.src)
    # UOps compare by identity (hash-consed): tuple equality is the C-level `is` on each pair
    new = node if new_src == node.src else node.replace(src=new_src)
    mapped[node] = new
    out.append(new)
    return new

  def emit_group(key: GroupKey) -> None:
    reduces = layout.groups[key]
    for red in reduces:
      if red in seeds:
        emit_items([seeds[red][1]])
        start = mapped[seeds[red][1]]
      else: start = emit(UOp.const(red.dtype, identity_element(red.arg, red.dtype)))
      mapped[red] = emit(UOp(Ops.DEFINE_ACC, red.dtype, (start,), next(acc_ids)))
    for rng in key: emit(rng)
    emit_block(layout.group_path[key])
    for red in reduces:
      acc = mapped[red]
      update = UOp(red.arg, red.dtype, (acc, mapped.get(red.src[0], red.src[0])))
      out.append(update)
      out.append(UOp(Ops.ASSIGN, red.dtype, (acc, update)))
    for rng in reversed(key): out.append(UOp(Ops.ENDRANGE, dtypes.void, (mapped.get(rng, rng),)))

  done: set = set()
  def emit_items(items) -> None:
    """Emit `items` (and, first, the items of the same block they need), each once, without recursion on depth."""
    for first in items:
      if first in done: continue
      stack: list[tuple[Item, bool]] = [(first, False)]
      while stack:
        item, ready = stack.pop()
        if item in done: continue
        if not ready and (deps := needs.get(item)) is not None:
          pending = [(dep, False) for dep in reversed(deps) if dep not in done]
          if pending:   # its needs first (most items find theirs emitted already: no round trip on the stack)
            stack.append((item, True))
            stack += pending
            continue
        done.add(item)
        if isinstance(item, tuple): emit_group(item[1])
        else: emit(item)

  def emit_block(path: tuple[GroupKey, ...]) -> None:
    emit_groups_first(list(block_items.get(path, {})))

  def emit_groups_first(items: list[Item]) -> None:
    # a value only the code after a reduce group needs (a matmul's residual add) is computed after the group's loops:
    # computed before, it would stay live, and spill, through every iteration
    emit_items([item for item in items if isinstance(item, tuple)] + items)

  # loop-invariant nodes (buffers, constants, loop bounds) first, then the output loops, then the body
  top = list(block_items[()])
  uses_reduce: set[UOp] = set()
  for node in layout.nodes:
    if node.op is Ops.REDUCE or not uses_reduce.isdisjoint(node.src): uses_reduce.add(node)
  invariant = [i for i in top if not isinstance(i, tuple) and not layout.scope[i] and i not in uses_reduce]
  output_ranges = sorted((n for n in layout.nodes if n.op is Ops.RANGE and n not in layout.group_of_range),
                         key=_range_order)
  emit_items(invariant)
  # a reduce group, and a value computed from reductions, opens as soon as the output loops it depends on are open:
  # a fused row reduction (softmax's max and sum) runs once per row, before that row's elementwise loop
  hoisted = _hoist_depths(layout, [i for i in top if isinstance(i, tuple) or i in uses_reduce], output_ranges)
  for depth, rng in enumerate(output_ranges):
    emit_items([item for item, d in hoisted.items() if d == depth])
    emit(rng)
  emit_groups_first(top)
  for rng in reversed(output_ranges): out.append(UOp(Ops.ENDRANGE, dtypes.void, (mapped.get(rng, rng),)))
  return out

def _hoist_depths(layout: _KernelLayout, items: list[Item], output_ranges: list[UOp]) -> dict[Item, int]:
  """How many output loops must be open around each item: one past the innermost output loop it depends on."""
  position = {rng: i for i, rng in enumerate(output_ranges)}
  depths: dict[Item, int] = {}
  for item in items:
    scope = frozenset().union(*(layout.scope[r] for r in layout.groups[item[1]])) if isinstance(item, tuple) \
      else layout.scope[item]
    depths[item] = max((position[r] + 1 for r in scope if r in position), default=0)
  return depths
