"""Wide global accesses for GPU targets: a thread's loads (or stores) of 2 or 4 adjacent 32-bit elements of one global
buffer become one 8- or 16-byte vector LOAD (or STORE), which the CUDA C and PTX renderers write as one `float4`-style
access (`ld.global.v4.f32`). It works on the linear uops, after the optimizer's UPCAST gave each thread a register
tile of adjacent elements (kiln/codegen/opt/gpu_heuristic.py) and the axis mapping made it lanes of index math.

**The alignment rule** (a misaligned vector access is a launch failure or wrong data, so it is never emitted unproven):
an access of `w` lanes of `s`-byte elements at element index `i` of buffer `p` touches bytes `p + s*i ...`; it is one
vector access only when `p + s*i` is a multiple of `w*s`. That has two halves, proven in two places:
- the index, here, at codegen: `i` must be a multiple of `w` for every thread, iteration and variable
  (`kiln.uop.symbolic.is_multiple_of`: every coefficient and the constant of its sum multiples of `w`). A view's
  offset folded into the index (a shrink, a slice, a pad) is part of that sum, so an offset view is widened only when
  its offset and every stride along the lanes are multiples of `w`; a symbolic (Variable) offset only when a constant
  factor proves it; anything else stays scalar;
- the buffer's base pointer, in the kernel at run time: kiln's own CUDA allocations are 256-byte aligned (cuMemAlloc)
  and so are the LRU cache's reused ones, but a Buffer view (`Buffer.view`, a copy's offset, a file's window) starts
  at its base plus any byte offset, and `Tensor.from_blob`'s host memory anywhere. So each kernel tests each widened
  buffer's pointer once (`(ptr & (w*s - 1)) == 0`, uniform over the launch) and every vector access has a scalar
  twin taken where the test fails: the same kernel, the same results, for every pointer (a CUDA graph's swapped
  input included).

Only ungated loads are widened (a gate differs per lane), and stores of one gate (or none); loads of a buffer never
move past a store to it, nor stores past a load or store of theirs, and nothing moves across a loop boundary, a
barrier or an atomic. 16- and 8-bit elements stay scalar (their loads convert bits to float in the renderers).

Vector uops made here (kiln/codegen/vectorize.py's table, global buffers only):
| op | src | meaning |
| --- | --- | --- |
| `LOAD` of `dtype.vec(w)` | `(DEFINE_GLOBAL, index)` | lanes `buf[index + k]`, `index` a proven multiple of `w` |
| `GEP` | `(vector load,)` | lane `arg` of it |
| `STORE` | `(DEFINE_GLOBAL, index, VECTORIZE of w lanes[, gate])` | `buf[index + k] = lane k` |
"""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.symbolic import is_multiple_of
from kiln.codegen.vectorize import split_offset, without_dead_values

WIDE_DTYPES = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})   # 32-bit lanes: loaded as they are stored
# what a group of lanes may not span: the loop nest, the block's order, other blocks' memory
_BOUNDARIES = frozenset({Ops.RANGE, Ops.ENDRANGE, Ops.BARRIER, Ops.ATOMIC})

def lane_widths(itemsize: int, max_bytes: int) -> tuple[int, ...]:
  """The lane counts of one access of `itemsize`-byte elements, widest first: 16 and 8 bytes up to `max_bytes`.

  >>> lane_widths(4, 16), lane_widths(4, 8), lane_widths(4, 4)
  ((4, 2), (2,), ())
  """
  return tuple(nbytes // itemsize for nbytes in (16, 8) if nbytes <= max_bytes and nbytes // itemsize >= 2)

def _groups(uops: list[UOp], kind: Ops) -> dict[tuple, dict[int, int]]:
  """The widenable accesses of `kind` (LOAD or STORE) by (buffer, dtype, base index, gate): offset -> position."""
  groups: dict[tuple, dict[int, int]] = {}
  for pos, u in enumerate(uops):
    if u.op is not kind or u.src[0].op is not Ops.DEFINE_GLOBAL: continue
    if kind is Ops.LOAD:
      if len(u.src) != 2 or u.dtype not in WIDE_DTYPES: continue
      dtype, gate = u.dtype, None
    else:
      dtype, gate = u.src[2].dtype, (u.src[3] if len(u.src) == 4 else None)
      if dtype not in WIDE_DTYPES: continue
    base, offset = split_offset(u.src[1])
    groups.setdefault((u.src[0], dtype, base, gate), {}).setdefault(offset, pos)
  return groups

def _runs(by_offset: dict[int, int], widths: tuple[int, ...], base: UOp | None) -> list[tuple[int, int]]:
  """(first offset, lanes) of each aligned run: `lanes` consecutive offsets from a multiple of `lanes`, over a base
  proven a multiple of it (None: a constant index), the widest first."""
  runs, taken = [], set()
  for offset in sorted(by_offset):
    if offset in taken: continue
    for w in widths:
      if offset % w or any(offset + k not in by_offset for k in range(w)): continue
      if base is not None and not is_multiple_of(base, w): continue
      runs.append((offset, w))
      taken.update(range(offset, offset + w))
      break
  return runs

def _clear(uops: list[UOp], members: list[int], to: int, buf: UOp, conflicts: frozenset[Ops]) -> bool:
  """Whether the accesses at positions `members` may all move to position `to` (the first or the last of them):
  nothing between crosses a boundary, and no access of `buf` of an op in `conflicts` that a member moves past may
  touch the member's address (proven apart: one base index, another offset)."""
  lo, hi = min(members), max(members)
  addresses = {pos: split_offset(uops[pos].src[1]) for pos in members}
  for pos in range(lo + 1, hi):
    u = uops[pos]
    if u.op in _BOUNDARIES: return False
    if u.op not in conflicts or u.src[0] is not buf or pos in addresses: continue
    base, offset = split_offset(u.src[1])
    for member, (member_base, member_offset) in addresses.items():
      passed = member > pos if to == lo else member < pos
      if passed and (member_base is not base or member_offset == offset): return False
  return True

def widen_accesses(uops: list[UOp], max_bytes: int = 16) -> list[UOp]:
  """`uops` (a GPU kernel's linear uops) with each aligned run of a thread's adjacent 32-bit global loads as one
  vector LOAD and its lanes' GEPs (where the run's first member stood), and each run of adjacent stores as one vector
  STORE (where its last member stood); see the module docstring for the rule. Unchanged when nothing is widened.

  >>> from kiln.dtype import dtypes
  >>> a, out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  >>> lidx = UOp(Ops.SPECIAL, dtypes.int32, (), ("lidx0", 64))
  >>> base = lidx * 4
  >>> idx = [base] + [base + k for k in range(1, 4)]
  >>> loads = [UOp(Ops.LOAD, dtypes.float32, (a, i)) for i in idx]
  >>> stores = [UOp(Ops.STORE, dtypes.void, (out, i, x + 1.0)) for i, x in zip(idx, loads)]
  >>> uops = [out, a, lidx, UOp.const(dtypes.int32, 4), base, UOp.const(dtypes.float32, 1.0)]
  >>> for i, x, s in zip(idx, loads, stores): uops += ([i] if i is not base else []) + [x, s.src[2], s]
  >>> [(u.op.name, u.dtype.count if u.op is Ops.LOAD else u.src[2].dtype.count) for u in widen_accesses(uops)
  ...  if u.op in (Ops.LOAD, Ops.STORE)]
  [('LOAD', 4), ('STORE', 4)]
  """
  positions = {u: pos for pos, u in enumerate(uops)}
  before: dict[int, list[UOp]] = {}    # position -> the vector uops written before the uop there
  replace: dict[UOp, UOp] = {}         # a widened load -> its lane (GEP)
  dropped: set[int] = set()            # positions of widened stores (written as one, at the last)
  stores_at: dict[int, tuple] = {}     # position of a run's last store -> (the run's positions, its gate)
  for (buf, dtype, base, _), by_offset in _groups(uops, Ops.LOAD).items():
    for first, lanes in _runs(by_offset, lane_widths(dtype.itemsize, max_bytes), base):
      members = [by_offset[first + k] for k in range(lanes)]
      lo = min(members)
      index = uops[by_offset[first]].src[1]
      if index.op is not Ops.CONST and positions.get(index, lo) >= lo: continue   # its index comes later
      if not _clear(uops, members, lo, buf, frozenset({Ops.STORE})): continue
      vector = UOp(Ops.LOAD, dtype.vec(lanes), (buf, index))
      before.setdefault(lo, []).append(vector)
      for k, pos in enumerate(members):
        lane = UOp(Ops.GEP, dtype, (vector,), k)
        before[lo].append(lane)
        replace[uops[pos]] = lane
  for (buf, dtype, base, gate), by_offset in _groups(uops, Ops.STORE).items():
    for first, lanes in _runs(by_offset, lane_widths(dtype.itemsize, max_bytes), base):
      members = [by_offset[first + k] for k in range(lanes)]
      hi = max(members)
      if not _clear(uops, members, hi, buf, frozenset({Ops.STORE, Ops.LOAD})): continue
      dropped.update(members)
      stores_at[hi] = (members, gate)
  if not before and not stores_at: return uops
  out: list[UOp] = []
  for pos, u in enumerate(uops):
    for v in before.get(pos, ()):
      out.append(_rebuilt(v, replace))
    if u in replace: continue   # read through its lane from now on
    if pos in stores_at:
      members, gate = stores_at[pos]
      first = uops[members[0]]
      lanes = tuple(_current(uops[p].src[2], replace) for p in members)
      vector = UOp(Ops.VECTORIZE, lanes[0].dtype.vec(len(lanes)), lanes)
      out += [vector, UOp(Ops.STORE, dtypes.void, (first.src[0], _current(first.src[1], replace), vector,
                                                  *((_current(gate, replace),) if gate is not None else ())))]
      continue
    if pos in dropped: continue
    out.append(_rebuilt(u, replace))
  return without_dead_values(out)

def _current(u: UOp, replace: dict[UOp, UOp]) -> UOp:
  """What stands for `u` now: its replacement's replacement ... (a lane whose vector load was itself rebuilt)."""
  for _ in range(len(replace) + 1):
    if (new := replace.get(u)) is None or new is u: return u
    u = new
  raise RuntimeError("widen_accesses: a cycle of replacements")

def _rebuilt(u: UOp, replace: dict[UOp, UOp]) -> UOp:
  """`u` with its sources' replacements (rebuilt ones remembered in `replace`, so users of `u` follow)."""
  if u in replace: return _current(u, replace)
  src = tuple(_current(s, replace) for s in u.src)
  if src == u.src: return u
  new = replace[u] = u.replace(src=src)
  return new
