"""Attention chains: on a GPU target, `softmax(q @ k^T * scale + mask) @ v` stays in one kernel.

The ordinary rules give attention three kernels: the scores (a reduction feeding another reduction gets a buffer),
the softmax (a row chain) and the weighted values (the softmax is costly and broadcast over the values' columns).
On a target with blocks of threads and shared memory (`has_local`) all of it runs as one flash-style kernel
(kiln/codegen/gpu_attention.py): each block owns some query rows, loops over key blocks and keeps a running max and
sum per row, so the scores never reach memory. The rule here only takes those buffers away; a kernel the codegen
builder does not recognize still lowers as ordinary nested loops (slow, but right).

An *attention chain* is a sum over the last axis `REDUCE_AXIS(ADD)` of a product one of whose factors is, through
movement ops and casts, a materialized row chain `w` over that same axis (the softmax) whose own kernel holds a
materialized sum of products `scores` (the first matmul). Both lose their buffers when nothing else reads them, and
so do the elementwise values inside the chain that read no buffer at all (a causal mask made from `arange`s: index
arithmetic, cheaper to recompute than to load). CPU targets never take this rule, nor chains of fewer than
MIN_QUERY_ROWS query rows (a decode step's single row), of symbolic sizes, or of value widths the flash kernel does
not take.
"""
from __future__ import annotations
from typing import Callable
from kiln.uop.ops import UOp, Ops, GroupOp, toposort

_THROUGH = GroupOp.Movement | {Ops.CAST}
# fewer query rows than this (a decode step's one) keep the three kernels: a flash block would leave most of its
# threads idle, and the row kernels spread each row's keys over a block instead
MIN_QUERY_ROWS = 16

def _flash_width(width: int) -> bool:
  """The flash kernel takes value widths that are multiples of 16 up to 128 (kiln/codegen/gpu_attention.py MAX_DV):
  other chains keep their buffers rather than run fused as plain nested loops."""
  return width % 16 == 0 and 0 < width <= 128

def _strip(u: UOp, outputs: set[UOp] | None = None) -> UOp:
  """`u` below its movement ops and casts (stopping at the first of them that is materialized, given `outputs`)."""
  while u.op in _THROUGH and (outputs is None or u not in outputs): u = u.src[0]
  return u

def _kernel_nodes(value: UOp, outputs: set[UOp]) -> list[UOp]:
  """The nodes computed inside `value`'s kernel (down to other materialized outputs, which it loads)."""
  return toposort([value], stop=lambda u: u in outputs and u is not value)

def _only_read_by(node: UOp, reader: UOp, users: dict[UOp, list[UOp]], outputs: set[UOp]) -> bool:
  """Every path up from `node` reaches `reader` without passing another output, and none ends elsewhere."""
  stack, seen = [node], {node}
  while stack:
    u = stack.pop()
    if u is reader: continue
    if u is not node and u in outputs: return False
    if not users[u]: return False
    for user in users[u]:
      if user not in seen:
        seen.add(user)
        stack.append(user)
  return True

def _reads_no_buffer(u: UOp, outputs: set[UOp]) -> bool:
  return not any(n.op is Ops.BUFFER or (n in outputs and n is not u) for n in _kernel_nodes(u, outputs))

def attention_buffers(nodes: list[UOp], users: dict[UOp, list[UOp]], outputs: set[UOp], roots: set[UOp],
                      has_local: Callable[[object], bool]) -> set[UOp]:
  """The outputs of the attention chains among `nodes` (module docstring) on devices where `has_local(device)` that
  should lose their buffers (a chain with a node among `roots`, a value the caller asked for, keeps them all)."""
  dropped: set[UOp] = set()
  for pv in nodes:
    if pv.op is not Ops.REDUCE_AXIS or pv.arg[0] is not Ops.ADD or pv in dropped: continue
    if not has_local(pv.device): continue
    body, last = pv.src[0], len(pv.src[0].shape) - 1
    if tuple(pv.arg[1]) != (last,) or body.op is not Ops.MUL or last < 2: continue
    if not all(isinstance(d, int) for d in body.shape) or not _flash_width(body.shape[-2]): continue
    for factor in body.src:
      weights = _strip(factor, outputs)
      if weights not in outputs or weights.op not in GroupOp.Elementwise: continue
      if len(weights.shape) < 2 or not isinstance(weights.shape[-2], int) or weights.shape[-2] < MIN_QUERY_ROWS:
        continue
      inside = _kernel_nodes(weights, outputs)
      row_reduces = [n for n in inside if n.op is Ops.REDUCE_AXIS and n is not weights]
      if not row_reduces or any(tuple(r.arg[1]) != (len(r.src[0].shape) - 1,) for r in row_reduces): continue
      scores = [n for n in inside if n.op is Ops.REDUCE_AXIS and n in outputs and n is not weights and
                n.arg[0] is Ops.ADD and _strip(n.src[0]).op is Ops.MUL]
      if len(scores) != 1 or not _only_read_by(weights, pv, users, outputs): continue
      if not _only_read_by(scores[0], weights, users, outputs): continue
      masks = [n for n in _kernel_nodes(weights, outputs - {scores[0]})
               if n in outputs and n is not weights and n is not scores[0] and n.op in GroupOp.Elementwise
               and _reads_no_buffer(n, outputs) and _only_read_by(n, weights, users, outputs)]
      if weights in roots or scores[0] in roots: continue
      dropped |= {weights, scores[0], *(m for m in masks if m not in roots)}
      break
  return dropped
