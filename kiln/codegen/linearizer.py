"""Linearizing: a lowered kernel graph becomes a list of uops with explicit loops and accumulators.

Every node is placed in the innermost loop it depends on. Output loops wrap the whole kernel; each REDUCE opens
its own loops, and the nodes that depend on those loops are emitted inside them, between the accumulator's
declaration and its update.
"""
from __future__ import annotations
import itertools
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort, identity_element

def linearize(sink: UOp) -> list[UOp]:
  """Lowered `SINK(STORE...)` -> a flat uop list (see docs/ir.md, stage 4)."""
  nodes = toposort([sink])
  reduce_of_range: dict[UOp, UOp] = {}
  for node in nodes:
    if node.op is Ops.REDUCE:
      for rng in node.src[1:]: reduce_of_range[rng] = node

  # which loop ranges each node depends on (a REDUCE closes its own)
  scope: dict[UOp, frozenset[UOp]] = {}
  for node in nodes:
    deps = frozenset().union(*(scope[s] for s in node.src)) if node.src else frozenset()
    if node.op is Ops.RANGE: deps = deps | {node}
    elif node.op is Ops.REDUCE: deps = deps - frozenset(node.src[1:])
    scope[node] = deps

  # the innermost REDUCE each node belongs to (None: the kernel body)
  body: dict[UOp | None, list[UOp]] = {None: []}
  for node in nodes:
    if node.op is Ops.SINK: continue
    if node.op is Ops.RANGE and node in reduce_of_range: continue   # opened by its REDUCE
    owners = [reduce_of_range[r] for r in scope[node] if r in reduce_of_range]
    owner = max(owners, key=lambda red: (len(scope[red]), red.src[1].arg)) if owners else None
    body.setdefault(owner, []).append(node)

  out: list[UOp] = []
  mapped: dict[UOp, UOp] = {}
  acc_ids = itertools.count()

  def emit(node: UOp) -> UOp:
    if node in mapped: return mapped[node]
    new_src = tuple(mapped.get(s, s) for s in node.src)
    new = node if all(a is b for a, b in zip(new_src, node.src)) else node.replace(src=new_src)
    mapped[node] = new
    out.append(new)
    return new

  # a work stack instead of recursion: ("node", n) emits n; ("close", reduce) finishes an open reduction
  # loop-invariant nodes (buffers, constants, loop bounds) first, then the output loops, then the body
  top = body[None]
  uses_reduce: set[UOp] = set()
  for node in nodes:
    if node.op is Ops.REDUCE or any(s in uses_reduce for s in node.src): uses_reduce.add(node)
  invariant = [n for n in top if not scope[n] and n not in uses_reduce]
  output_ranges = [n for n in top if n.op is Ops.RANGE]
  inner = [n for n in top if n.op is not Ops.RANGE and (scope[n] or n in uses_reduce)]
  stack: list[tuple[str, UOp]] = [("end", r) for r in output_ranges]
  stack += [("node", n) for n in reversed(invariant + output_ranges + inner)]
  while stack:
    kind, node = stack.pop()
    if kind == "node" and node.op is Ops.REDUCE:
      identity = emit(UOp.const(node.dtype, identity_element(node.arg, node.dtype)))
      acc = emit(UOp(Ops.DEFINE_ACC, node.dtype, (identity,), next(acc_ids)))
      mapped[node] = acc
      ranges = node.src[1:]
      for rng in ranges: emit(rng)
      stack.append(("close", node))
      stack += [("node", n) for n in reversed(body.get(node, []))]
    elif kind == "node": emit(node)
    elif kind == "close":
      acc = mapped[node]
      value = mapped.get(node.src[0], node.src[0])
      update = UOp(node.arg, node.dtype, (acc, value))
      out.append(update)
      out.append(UOp(Ops.ASSIGN, node.dtype, (acc, update)))
      for rng in reversed(node.src[1:]): out.append(UOp(Ops.ENDRANGE, dtypes.void, (mapped.get(rng, rng),)))
    else:  # "end": close an output loop
      out.append(UOp(Ops.ENDRANGE, dtypes.void, (mapped.get(node, node),)))
  return out
