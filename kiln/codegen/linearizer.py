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
from kiln.codegen.opt.kernel import graph_nodes
# the Ops members these loops over every uop test, bound once: under Python 3.11 each `Ops.X` read costs ~130 ns
# (EnumType defines __getattr__, which puts every attribute read on the class on a slow path), 10x a global's
_RANGE, _REDUCE, _SINK, _STORE, _LOAD, _MUL = Ops.RANGE, Ops.REDUCE, Ops.SINK, Ops.STORE, Ops.LOAD, Ops.MUL

GroupKey = tuple[UOp, ...]   # the loop ranges of a reduce group, sorted by loop id

class _Group:
  """A whole nested reduce group as one item of the block around it: one object per group, hashed by identity."""
  __slots__ = ("key",)
  def __init__(self, key: GroupKey): self.key = key

Item = UOp | _Group   # what one block of the kernel holds: a node, or a whole nested reduce group

def _range_order(rng: UOp):
  return (0, rng.arg) if isinstance(rng.arg, int) else (1, str(rng.arg))

class _KernelLayout:
  """Where each node of a lowered kernel goes: its loop scope, and the chain of reduce groups it sits in."""
  def __init__(self, sink: UOp):
    # (the optimizer walked the kernel it returns already: its list, read only here)
    self.nodes = graph_nodes(sink)
    self.groups: dict[GroupKey, list[UOp]] = {}
    self.group_of_range: dict[UOp, GroupKey] = {}
    for node in self.nodes:
      if node.op is not _REDUCE: continue
      key = tuple(sorted(node.src[1:], key=_range_order))
      self.groups.setdefault(key, []).append(node)
      for rng in key:
        if self.group_of_range.setdefault(rng, key) != key:
          raise ValueError(f"linearize: loop range {rng.arg} is reduced by REDUCEs over different sets of ranges")
    self.group_item = {key: _Group(key) for key in self.groups}
    # the loop ranges each node depends on (a REDUCE closes its own)
    self.scope: dict[UOp, frozenset[UOp]] = {}
    scope, empty = self.scope, frozenset()
    for node in self.nodes:
      # most nodes share their sources' scope: reuse that set rather than building an equal one per node
      if len(node.src) == 1: deps = scope[node.src[0]]
      else:
        deps = empty
        for s in node.src:
          if (d := scope[s]) is not deps and d and not d <= deps: deps = d if not deps else deps | d
      if node.op is _RANGE: deps = deps | {node}
      elif node.op is _REDUCE: deps = deps - frozenset(node.src[1:])
      self.scope[node] = deps
    self.group_path: dict[GroupKey, tuple[GroupKey, ...]] = {}
    for key in self.groups: self._path_of_group(key)
    self.path: dict[UOp, tuple[GroupKey, ...]] = {}
    self.top_item: dict[UOp, Item | None] = {}   # item_at(node, 0), asked for every source of the top block's nodes
    path_of_scope: dict[frozenset[UOp], tuple[GroupKey, ...]] = {}   # nodes share few distinct scopes
    for node in self.nodes:
      if node.op is _REDUCE or node in self.group_of_range:
        path = self.group_path[self.group_of_range[node] if node.op is _RANGE else
                               tuple(sorted(node.src[1:], key=_range_order))]
      else:
        node_scope = scope[node]
        if (path := path_of_scope.get(node_scope)) is None:
          path = path_of_scope[node_scope] = self._path_of_scope(node_scope)
      self.path[node] = path
      self.top_item[node] = self.group_item[path[0]] if path else \
        None if node.op is _RANGE or node.op is _REDUCE else node

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
    if len(path) > level: return self.group_item[path[level]]
    if node.op is _RANGE or node.op is _REDUCE: return None
    return node

def _accumulator_seeds(layout: _KernelLayout) -> dict[UOp, tuple[UOp, UOp]]:
  """REDUCE -> (the ADD of it and x, x) for every sum whose only use is `+ x` with x read from a stored buffer, known
  where the reduce group opens (x depends on no reduction and on no loop the REDUCE's own scope lacks)."""
  reduce_nodes = {red for group in layout.groups.values() for red in group}
  users: dict[UOp, set[UOp]] = {}   # of the REDUCEs only: nothing else is asked
  readers: list[UOp] = []   # the nodes that read a REDUCE, in graph order: the only candidates
  for node in layout.nodes:
    if reduce_nodes.isdisjoint(node.src): continue
    readers.append(node)
    for src in node.src:
      if src.op is _REDUCE: users.setdefault(src, set()).add(node)
  written: set[UOp] = set()   # the stored buffers, found when the first candidate is asked about
  # node -> (whether its graph holds a REDUCE, whether it loads from a written buffer), for the candidates' graphs
  facts: dict[UOp, tuple[bool, bool]] = {}
  def facts_of(x: UOp) -> tuple[bool, bool]:
    if not facts: written.update(u.src[0] for u in layout.nodes if u.op is _STORE)
    if x not in facts:
      for u in toposort([x], stop=facts.__contains__):   # sources first; the known ones are not walked again
        if u in facts: continue
        has_reduce, reads_written = u.op is _REDUCE, u.op is _LOAD and u.src[0] in written
        for s in u.src:
          s_reduce, s_reads = facts[s]
          has_reduce, reads_written = has_reduce or s_reduce, reads_written or s_reads
        facts[u] = (has_reduce, reads_written)
    return facts[x]
  seeds: dict[UOp, tuple[UOp, UOp]] = {}
  for node in readers:
    if node.op is not Ops.ADD or len(node.src) != 2: continue
    for red, x in (node.src, node.src[::-1]):
      if red.op is not _REDUCE or red.arg is not Ops.ADD or users.get(red) != {node} or red in seeds: continue
      has_reduce, reads_written = facts_of(x)
      if has_reduce or not layout.scope[x] <= layout.scope[red] or not reads_written: continue
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
  top_items, top_item = block_items[()], layout.top_item
  for node in layout.nodes:
    if node.op is _SINK: continue
    path = layout.path[node]
    if not path:   # the common case, a node of the kernel's top block: it needs its sources' top items
      if node.op is _RANGE or node.op is _REDUCE: continue   # opened by the kernel: needs nothing
      # (its needs, its sources' top items, are found when something asks for it out of order: `needs_of`)
      top_items[node] = None
      continue
    # the node's group in every block around it, and the node itself in its own (a loop range is opened by its group)
    for level, key in enumerate(path): block_items.setdefault(path[:level], {})[layout.group_item[key]] = None
    if node.op is not _RANGE and node.op is not _REDUCE: block_items.setdefault(path, {})[node] = None
    for src in node.src:
      src_path = layout.path[src]
      if src_path is path and src.op is not _REDUCE:   # the common cases first: a source of the same block,
        user, used = layout.item_at(node, len(path)), layout.item_at(src, len(path))
      elif not src_path: user, used = layout.group_item[path[0]], top_item[src]   # or of the top block
      else:
        # a REDUCE's result exists once its group's loops close: in the block around the group (where a sibling
        # group, such as a row's sum after the row's max, may read it)
        if src.op is _REDUCE: src_path = src_path[:-1]
        level = min(len(path), len(src_path))
        if path[:level] != src_path[:level]:
          raise ValueError(f"linearize: {node.op.name} uses a value from a reduction loop it is not inside")
        user, used = layout.item_at(node, level), layout.item_at(src, level)
      if user is not None and used is not None and user is not used: needs.setdefault(user, {})[used] = None

  out: list[UOp] = []
  mapped: dict[UOp, UOp] = {}
  acc_ids = itertools.count()
  sums_of_products: list[UOp] = []   # accumulator updates `acc + a*b` (fuse_multiply_accumulate)
  matrix_updates: list[UOp] = []   # accumulator updates `acc + GEP(WMMA(...), e)` (fuse_matrix_accumulate)
  group_spans: list[tuple[int, int]] = []   # where each reduce group's uops lie in `out`
  bodies_inside = [True]   # whether every product summed lies inside its group's loops (so do its readers)
  identities: dict[tuple, UOp] = {}   # (reduce op, dtype) -> the constant an accumulator starts at

  def emit(node: UOp) -> UOp:
    if (found := mapped.get(node)) is not None: return found
    if seeded_adds and node in seeded_adds:   # the accumulator already holds x + the sum
      mapped[node] = mapped[seeded_adds[node]]
      return mapped[node]
    new_src = tuple(map(mapped.get, node.src, node.src))   # each source's emitted form, or itself
    # UOps compare by identity (hash-consed): tuple equality is the C-level `is` on each pair
    new = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg)
    mapped[node] = new
    out.append(new)
    return new

  def emit_group(key: GroupKey) -> None:
    begin = len(out)
    reduces = layout.groups[key]
    for red in reduces:
      if red in seeds:
        emit_items([seeds[red][1]])
        start = mapped[seeds[red][1]]
      else:
        if (identity := identities.get((red.arg, red.dtype))) is None:   # made once: it costs a NumPy conversion
          identity = identities[(red.arg, red.dtype)] = UOp.const(red.dtype, identity_element(red.arg, red.dtype))
        start = emit(identity)
      mapped[red] = emit(UOp(Ops.DEFINE_ACC, red.dtype, (start,), next(acc_ids)))
    for rng in key: emit(rng)
    emit_block(layout.group_path[key])
    for red in reduces:
      acc = mapped[red]
      update = UOp(red.arg, red.dtype, (acc, body := mapped.get(red.src[0], red.src[0])))
      if red.arg is Ops.ADD and body.op in (_MUL, Ops.MULACC) and red.dtype in FUSED_DTYPES:
        sums_of_products.append(update)
        # a body that depends on the group's loops sits inside them, and so does everything that reads it
        if layout.scope[red.src[0]].isdisjoint(key): bodies_inside[0] = False
      elif red.arg is Ops.ADD and body.op is Ops.GEP and body.src[0].op is Ops.WMMA: matrix_updates.append(update)
      out.append(update)
      out.append(UOp(Ops.ASSIGN, red.dtype, (acc, update)))
    for rng in reversed(key): out.append(UOp(Ops.ENDRANGE, dtypes.void, (mapped.get(rng, rng),)))
    group_spans.append((begin, len(out)))

  def needs_of(item: Item) -> dict[Item, None] | None:
    """The items of its block that `item` needs emitted first (None: none); a node of the top block's are its
    sources' top items, found here when first asked (most top nodes are emitted in order and never asked)."""
    if (deps := needs.get(item)) is None and type(item) is not _Group and not layout.path[item]:
      # (an item is never falsy: filter(None, ...) drops the Nones, in C)
      if deps := dict.fromkeys(filter(None, map(top_item.__getitem__, item.src))): needs[item] = deps
      else: deps = None
    return deps

  done: set = set()
  def emit_item(item: Item) -> None:
    done.add(item)
    if isinstance(item, _Group): emit_group(item.key)
    else: emit(item)

  def emit_items(items) -> None:
    """Emit `items` (and, first, the items of the same block they need), each once, without recursion on depth."""
    for first in items:
      if first in done: continue
      if (deps := needs_of(first)) is None or done.issuperset(deps):   # most items find their needs emitted
        done.add(first)   # (emit_item, inline)
        if type(first) is _Group: emit_group(first.key)
        else: emit(first)
        continue
      stack: list[tuple[Item, bool]] = [(first, False)]
      while stack:
        item, ready = stack.pop()
        if item in done: continue
        if not ready and (deps := needs_of(item)) is not None:
          pending = [(dep, False) for dep in reversed(deps) if dep not in done]
          if pending:   # its needs first
            stack.append((item, True))
            stack += pending
            continue
        emit_item(item)

  def emit_block(path: tuple[GroupKey, ...]) -> None:
    emit_groups_first(list(block_items.get(path, {})))

  def emit_groups_first(items: list[Item]) -> None:
    # a value only the code after a reduce group needs (a matmul's residual add) is computed after the group's loops:
    # computed before, it would stay live, and spill, through every iteration
    emit_items([item for item in items if type(item) is _Group])
    # then the block's nodes in graph order: each one's needs are emitted by then (its sources of the block come
    # before it, those of an outer block came before the block's group, and the groups are done), so none is asked
    # (a node emitted twice is emitted once: emit looks it up first; only the groups need the `done` set)
    for item in items:
      if type(item) is not _Group: emit(item)
      elif item not in done:
        done.add(item)
        emit_group(item.key)

  # loop-invariant nodes (buffers, constants, loop bounds) first, then the output loops, then the body
  top = list(block_items[()])
  uses_reduce: set[UOp] = set()
  for node in layout.nodes:
    if node.op is _REDUCE or not uses_reduce.isdisjoint(node.src): uses_reduce.add(node)
  invariant = [i for i in top if not isinstance(i, _Group) and not layout.scope[i] and i not in uses_reduce]
  output_ranges = sorted((n for n in layout.nodes if n.op is _RANGE and n not in layout.group_of_range),
                         key=_range_order)
  emit_items(invariant)
  # a reduce group, and a value computed from reductions, opens as soon as the output loops it depends on are open:
  # a fused row reduction (softmax's max and sum) runs once per row, before that row's elementwise loop
  hoisted = _hoist_depths(layout, [i for i in top if type(i) is _Group or i in uses_reduce], output_ranges)
  for depth, rng in enumerate(output_ranges):
    emit_items(hoisted[depth])
    emit(rng)
  emit_groups_first(top)
  for rng in reversed(output_ranges): out.append(UOp(Ops.ENDRANGE, dtypes.void, (mapped.get(rng, rng),)))
  # the nested functions refer to each other (a reference cycle holding the layout and every dict above): unbound
  # here, all of it is freed now rather than by the cyclic collector (paused during codegen, ~60 ms per graph later)
  del emit, emit_group, emit_item, emit_items, emit_block, emit_groups_first, needs_of
  if matrix_updates: out = fuse_matrix_accumulate(out, matrix_updates)
  if not sums_of_products: return out
  return fuse_multiply_accumulate(out, sums_of_products, _merged(group_spans) if bodies_inside[0] else None)

def fuse_matrix_accumulate(uops: list[UOp], updates: list[UOp]) -> list[UOp]:
  """`uops` with each tensor-core chain that starts from zero and whose every lane only updates an accumulator
  (`acc_e + GEP(WMMA(a, b, ... WMMA(a0, b0, 0)), e)`, e = 0..3: the tiles of kiln/codegen/gpu_mma.py) started
  from the accumulators instead, `WMMA(a0, b0, VECTORIZE(acc_0..acc_3))`, each accumulator then assigned its lane
  of the chain: the accumulators are the instruction's own registers, with no add a step."""
  uses: dict[UOp, int] = {}
  for u in uops:
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  lanes: dict[UOp, dict[int, UOp]] = {}   # a chain's last WMMA -> lane -> its update
  for u in updates:
    gep = u.src[1]
    if uses.get(gep) == 1: lanes.setdefault(gep.src[0], {})[gep.arg] = u
  starts: dict[UOp, UOp] = {}   # a chain's first WMMA -> it, started from the accumulators
  dropped: set[UOp] = set()   # the updates' adds, replaced by their lanes
  for last, by_lane in lanes.items():
    first = last
    while first.src[2].op is Ops.WMMA and uses.get(first.src[2]) == 1: first = first.src[2]
    zero = first.src[2]
    if sorted(by_lane) != [0, 1, 2, 3] or zero.op is not Ops.VECTORIZE or \
       any(s.op is not Ops.CONST or s.arg != 0 for s in zero.src):
      continue
    accs = tuple(by_lane[e].src[0] for e in range(4))
    starts[first] = first.replace(src=(*first.src[:2], UOp(Ops.VECTORIZE, zero.dtype, accs)))
    dropped.update(by_lane.values())
  if not starts: return uops
  out: list[UOp] = []
  mapped: dict[UOp, UOp] = {}
  for u in uops:
    if u in dropped:   # the ASSIGN after it takes the lane itself
      mapped[u] = mapped.get(u.src[1], u.src[1])
      continue
    if u in starts:
      out.append(starts[u].src[2])
      new = starts[u]
    else: new = u
    src = tuple(mapped.get(s, s) for s in new.src)
    if src != new.src: new = new.replace(src=src)
    if new is not u: mapped[u] = new
    out.append(new)
  return out

def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Ranges of positions (start, end) merged where they overlap or nest, in order."""
  out: list[tuple[int, int]] = []
  for start, end in sorted(spans):
    if out and start <= out[-1][1]: out[-1] = (out[-1][0], max(out[-1][1], end))
    else: out.append((start, end))
  return out

FUSED_DTYPES = frozenset({dtypes.float32, dtypes.float64})   # accumulations whose `acc + a*b` becomes MULACC

def fuse_multiply_accumulate(uops: list[UOp], updates: list[UOp],
                             spans: list[tuple[int, int]] | None = None) -> list[UOp]:
  """`uops` with each accumulator update `acc + a*b` of `updates` (float, the product read by nothing else) as one
  `MULACC(a, b, acc)`: a fused multiply-add, rounded once, as every renderer computes it (C's fma, LLVM's llvm.fma,
  the PYTHON emulator's exact _fma). It is what a matmul's inner loop is made of: one instruction for two.
  `spans` (ordered, disjoint (start, end) ranges of positions) promises that the updates, their products and every
  reader of those lie inside them: only they are searched (a kernel's reduce loops, not its epilogue)."""
  if spans is None or any(u.src[1].op is Ops.MULACC for u in updates): spans = [(0, len(uops))]
  uses = dict.fromkeys((u.src[1] for u in updates), 0)
  products_read = uses.keys()   # a live view: made once, not per uop
  for start, end in spans:
    for u in uops[start:end]:
      if not products_read.isdisjoint(u.src):
        for s in u.src:
          if s in uses: uses[s] += 1
  if any(u.src[1].op is Ops.MULACC for u in updates): uses = _use_counts(uops)
  fused = {u: UOp(Ops.MULACC, u.dtype, (*u.src[1].src, u.src[0])) for u in updates
           if u.src[1].op is _MUL and uses[u.src[1]] == 1}
  # a body that is itself a chain of fused multiply-adds ending in a product (an unrolled step of a GPU matmul tile,
  # kiln/codegen/gpu_tiles.py) accumulates into the accumulator link by link: acc + fma(a, b, rest) -> fma(a, b,
  # acc + rest), so the tile's accumulators are its only registers that live through the loop
  # each new link takes its original's place (loads and multiply-adds interleaved, as the block ordered them: few
  # registers), or, where the accumulator is declared after the chain begins, all of them the update's place
  chains: dict[UOp, list[UOp]] = {}   # an update -> the new links emitted in its place
  moved: dict[UOp, UOp] = {}   # an original link -> the new link emitted in its place
  replaced: set[UOp] = set()   # the original links
  position = {u: i for i, u in enumerate(uops)} if any(u.src[1].op is Ops.MULACC for u in updates) else {}
  for u in updates:
    if u.src[1].op is not Ops.MULACC or uses[u.src[1]] != 1: continue
    links, node = [], u.src[1]
    while node.op is Ops.MULACC and (not links or uses[node] == 1): links.append(node); node = node.src[2]
    if node.op is not _MUL or uses[node] != 1 or node in replaced or node in moved: continue
    chain = [UOp(Ops.MULACC, u.dtype, (*node.src, u.src[0]))]
    for link in reversed(links): chain.append(UOp(Ops.MULACC, u.dtype, (link.src[0], link.src[1], chain[-1])))
    fused[u] = chain[-1]
    if position[u.src[0]] < position[node]: moved.update(zip([node, *reversed(links)], chain))
    else:
      replaced.update(links + [node])
      chains[u] = chain
  if not fused: return uops
  products = {u.src[1] for u in fused if u.src[1].op is _MUL}
  updated = fused.keys()
  out: list[UOp] = []
  done = 0
  for start, end in spans:
    out += uops[done:start]   # (outside the spans: nothing to change)
    done = end
    for u in uops[start:end]:
      if u in products or u in replaced: continue
      if u in moved: out.append(moved[u])
      elif u in chains: out.extend(chains[u])
      elif u in fused:
        if u.src[1].op is _MUL: out.append(fused[u])   # (a moved chain's update: its last link is in place already)
      elif updated.isdisjoint(u.src): out.append(u)
      else: out.append(u.replace(src=tuple(fused.get(s, s) for s in u.src)))
  out += uops[done:]
  return _advance_chains_together(out, _moved_chains(moved)) if moved else out

def _moved_chains(moved: dict[UOp, UOp]) -> list[list[UOp]]:
  """The threaded chains of `moved` (new links, the accumulator's first), in the order their first links appear."""
  new_links = set(moved.values())
  bottoms = [link for link in moved.values() if link.src[2] not in new_links]
  above = {link.src[2]: link for link in moved.values() if link.src[2] in new_links}
  chains = []
  for link in bottoms:
    chain = [link]
    while chain[-1] in above: chain.append(above[chain[-1]])
    chains.append(chain)
  return chains

_ORDERED = frozenset({Ops.RANGE, Ops.ENDRANGE, Ops.BARRIER, Ops.STORE, Ops.ASSIGN, Ops.DEFINE_ACC, Ops.DEFINE_LOCAL,
                      Ops.SPECIAL, Ops.ATOMIC})

def _advance_chains_together(uops: list[UOp], chains: list[list[UOp]]) -> list[UOp]:
  """`uops` with the stretch of straight-line code holding the chains reordered so that they advance one link at a
  time, each link right after the operands it needs: an unrolled step of a GPU matmul tile then loads one k's values
  (merged into 16-byte loads), does its multiply-adds and moves on, instead of loading every k's values first (every
  loaded value live at once: spills). Unchanged where the stretch holds anything whose order matters."""
  position = {u: i for i, u in enumerate(uops)}
  first = min(position[chain[0]] for chain in chains)
  last = max(position[chain[-1]] for chain in chains)
  start = first
  while start > 0 and uops[start - 1].op not in _ORDERED: start -= 1
  stretch = uops[start:last + 1]
  if any(u.op in _ORDERED for u in stretch) or len({len(c) for c in chains}) != 1: return uops
  inside, placed, out = set(stretch), set(), []
  def place(root: UOp) -> None:
    stack = [(root, False)]
    while stack:
      node, ready = stack.pop()
      if node in placed: continue
      if not ready:
        stack.append((node, True))
        stack += [(s, False) for s in reversed(node.src) if s in inside and s not in placed]
        continue
      placed.add(node)
      out.append(node)
  for level in range(len(chains[0])):
    for chain in chains: place(chain[level])
  out += [u for u in stretch if u not in placed]
  return uops[:start] + out + uops[last + 1:]

def _use_counts(uops: list[UOp]) -> dict[UOp, int]:
  """How many sources among `uops` name each uop."""
  uses: dict[UOp, int] = {}
  for u in uops:
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  return uses

def _hoist_depths(layout: _KernelLayout, items: list[Item], output_ranges: list[UOp]) -> list[list[Item]]:
  """`items` by how many output loops must be open around each: one past the innermost output loop it depends on,
  or that a reduce group it reads depends on (the group runs whole: all its REDUCEs' loops at once). Entry d lists
  the items of depth d in `items`' order, for d below len(output_ranges) (the items inside every output loop, most
  of a kernel's, are left out: they are emitted with the body)."""
  position = {rng: i for i, rng in enumerate(output_ranges)}
  depth_of_scope: dict[frozenset[UOp], int] = {}   # items share few distinct scopes
  def scope_depth(scope: frozenset[UOp]) -> int:
    if (depth := depth_of_scope.get(scope)) is None:
      depth = depth_of_scope[scope] = max((position[r] + 1 for r in scope if r in position), default=0)
    return depth
  group_depth = {key: scope_depth(frozenset().union(*(layout.scope[r] for r in reds)))
                 for key, reds in layout.groups.items()}
  # a value's own scope covers the groups it reads, unless some REDUCE of a group depends on fewer output loops than
  # the group (an upcast lane that reads only padding, say): then what reads it must wait for the whole group
  uneven = any(scope_depth(layout.scope[red]) < group_depth[key] for key, reds in layout.groups.items() for red in reds)
  read_depth = _group_read_depths(layout, group_depth) if uneven else {}
  n = len(output_ranges)
  by_depth: list[list[Item]] = [[] for _ in range(n)]
  scope_of, get_depth = layout.scope, depth_of_scope.get
  for item in items:
    if type(item) is _Group: depth = group_depth[item.key]
    else:
      if (depth := get_depth(scope := scope_of[item])) is None: depth = scope_depth(scope)
      if read_depth and (read := read_depth.get(item, 0)) > depth: depth = read
    if depth < n: by_depth[depth].append(item)
  return by_depth

def _group_read_depths(layout: _KernelLayout, group_depth: dict[GroupKey, int]) -> dict[UOp, int]:
  """For each node that reads a REDUCE (itself or through other nodes), the deepest `group_depth` among the groups
  it reads; `group_depth` is raised in place for groups that read deeper groups (repeated until nothing changes)."""
  while True:
    read: dict[UOp, int] = {}
    for node in layout.nodes:   # sources first
      if node.op is _REDUCE: read[node] = group_depth[layout.path[node][-1]]
      elif (depths := [read[s] for s in node.src if s in read]): read[node] = max(depths)
    changed = False
    for key, reds in layout.groups.items():
      deepest = max((read[red.src[0]] for red in reds if red.src[0] in read), default=0)
      if deepest > group_depth[key]: group_depth[key], changed = deepest, True
    if not changed: return read
