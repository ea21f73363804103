"""Flash-style attention for GPU targets: a lowered attention kernel -> one kernel over blocks of query rows.

The scheduler keeps `softmax(q @ k^T * scale + mask) @ v` in one kernel on GPU targets (kiln/schedule/attention.py).
Lowered, that kernel is `out[b, i, c] = epilogue(sum_j w(b, i, j) * V(b, j, c))` with the softmax weights
`w = exp2((x_j - max_j' x_j') * c) / sum_j'' exp2((x_j'' - max) * c)` over a score expression
`x_j = f(sum_d Q(b, i, d) * K(b, j, d), mask(b, i, j))` (a scale, an additive or boolean mask, a causal one built from
indices): the same x under three key ranges, each with a sum over d of its own. `attention_plan` recognizes that
shape (the three copies equal up to their ranges), and `flash_attention` builds instead:

- one block of THREADS threads (16 x 16) per BM (64) query rows of one batch index (`gidx0` the query block, `gidx1`
  the batch: heads and batches flattened); thread (r, c) owns rows `4r .. 4r+3` of the block, of the scores the key
  columns `2c, 2c+1` of each key block of BN (32), of the output Dv/16 columns (groups of 4 adjacent ones);
- a loop over key blocks of BN keys (`kb`). In each: the scores of the block, a sum over d stepped by BK, the block
  staging Q's and K's step tiles in shared arrays (`attn_q`, `attn_k`, double-buffered, one barrier a step, as
  kiln/codegen/gpu_tiles.py's matmul tiles); each thread's 4 x 2 scores through the score expression (keys past the
  end are -inf); each row's block maximum over its 16 threads (warp shuffles); the running maximum `m` (a REDUCE MAX
  over `kb`, read inside the loop as its value before the block: a sibling read, docs/ir.md); the weights
  `p = exp2((x - m_new) * c)` written to a shared array (`attn_p`, keys x rows) and their row sums (shuffles);
- the running sum `l` and the output accumulators `o` as carried accumulators (DEFINE_ACC, updated once a block by an
  ASSIGN: `l = l * alpha + rowsum(p)`, `o = o * alpha + p @ V` with `alpha = exp2((m_old - m_new) * c)`, the rescale
  of the partial output when the maximum grows); `p @ V` a sum over the block's keys stepped by 16 (8 for Dv > 64
  with 64-key blocks), V's step tiles staged in `attn_v` (double-buffered);
- the last key block stores `epilogue(o / l)` (a gated STORE); the scores and weights never reach global memory.

A row whose keys are all masked has `m = -inf`: its weights are computed against 0 (exp2(-inf) = 0), so `l = 0` and
the output is 0/0 = NaN, as the ordinary graph gives. The weights are float32 throughout (the graph rounds them to the
inputs' half type before the product: a flash kernel keeps them exact). Refused (None: the kernel then maps as
ordinary nested loops) where the shape does not fit: symbolic sizes, Dv not a multiple of 16 or above 128, more than
65535 query blocks or batch indices, a target whose warps are narrower than 16 lanes, WARP_SHUFFLE=0, NOLOCALS=1.

Half and bfloat16 factors on a target whose tensor cores take them run instead as `flash_attention_tc` (both
products by mma.sync m16n8k16, the softmax on the accumulators, P's accumulators as the A fragments of P V; its
docstring and docs/cuda.md "Attention as one kernel"); float32 keeps the kernel above.
"""
from __future__ import annotations
from dataclasses import dataclass
from kiln.dtype import dtypes
from kiln.helpers import NOLOCALS, prod
from kiln.uop.ops import UOp, Ops, toposort
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic, linear_form
from kiln.codegen.gpudims import (fresh_range_id, _range_key, _first_conflict, _unflatten, _substitute,
                                  _shuffle_rounds, _halvings, shuffle_warp)   # gpudims imports us lazily
from kiln.codegen.gpu_tiles import FACTOR_OPS, SHARED_PAD, _spread, _k_fastest, _clamped, _ceil
from kiln.codegen.opt.kernel import Kernel

INT, F32 = dtypes.int32, dtypes.float32
THREADS_ROWS, THREADS_COLS = 16, 16
THREADS = THREADS_ROWS * THREADS_COLS
# query rows a block, keys a key block (multiples of 16; a thread holds BM/16 rows, BN/16 keys). H200, B8 H16 S4096
# D128 fp16 (bench/gpu_notes.md): 64 x 64 104 ms (149 registers, one block an SM), 32 x 64 95 ms, 64 x 32 74 ms
BM, BN = 64, 32
MAX_DV = 128   # a thread's output columns are Dv/16: at most 8
CAUSAL_SKIP = True   # key blocks a causal mask hides from every row of a query block are not visited
NEG_INF = float("-inf")

@dataclass(frozen=True)
class AttentionPlan:
  """A lowered attention kernel's parts: its STORE, the weighted sum over keys (`total`, a REDUCE over `key`), the
  score expression at `key` (`score`) and the sum of products inside it (`dot`, over `depth`), the factors Q (of rows
  and depth), K (of keys and depth) and V (of keys and columns), the constant the softmax multiplies the shifted
  scores by before its exp2 (`log2e`), and the row, column and batch output ranges (each in loop order)."""
  store: UOp
  total: UOp
  key: UOp
  score: UOp
  dot: UOp
  depth: UOp
  q: UOp
  k: UOp
  v: UOp
  log2e: UOp
  rows: tuple[UOp, ...]
  cols: tuple[UOp, ...]
  batch: tuple[UOp, ...]

def _ranges(node: UOp) -> set[UOp]:
  return {u for u in node.toposort() if u.op is Ops.RANGE}

def _same_upto_ranges(a: UOp, b: UOp, pairs: dict[UOp, UOp]) -> bool:
  """Whether `b` is `a` with some of its ranges renamed one to one (`pairs`, a -> b, extended as the walk finds them;
  a range may stand for itself), every other node alike in op, dtype, argument and sources."""
  back = {y: x for x, y in pairs.items()}
  stack, seen = [(a, b)], set()
  while stack:
    x, y = stack.pop()
    if (x, y) in seen: continue
    seen.add((x, y))
    if x.op is Ops.RANGE or y.op is Ops.RANGE:
      if x.op is not y.op or x.src[0] is not y.src[0]: return False
      if pairs.setdefault(x, y) is not y or back.setdefault(y, x) is not x: return False
      continue
    if x.op is not y.op or x.dtype != y.dtype or x.arg != y.arg or len(x.src) != len(y.src): return False
    stack.extend(zip(x.src, y.src))
  return True

def _strip_casts(u: UOp) -> UOp:
  while u.op is Ops.CAST and dtypes.is_float(u.dtype): u = u.src[0]
  return u

def _shifted_exp(num: UOp) -> tuple[UOp, UOp, UOp] | None:
  """(x, its REDUCE MAX, the constant c) when `num` is exp2((x - max(x)) * c)."""
  if num.op is not Ops.EXP2 or num.src[0].op is not Ops.MUL: return None
  diff, c = num.src[0].src
  if c.op is not Ops.CONST: diff, c = c, diff
  if c.op is not Ops.CONST or not c.arg > 0 or diff.op is not Ops.SUB: return None
  x, top = diff.src
  if top.op is not Ops.REDUCE or top.arg is not Ops.MAX or len(top.src) != 2: return None
  return x, top, c

def attention_plan(sink: UOp) -> AttentionPlan | None:
  """The AttentionPlan of a lowered kernel of the attention shape (the module docstring), or None."""
  if len(sink.src) != 1 or sink.src[0].op is not Ops.STORE or len(sink.src[0].src) != 3: return None
  store = sink.src[0]
  if store.src[0].op is not Ops.DEFINE_GLOBAL: return None
  nodes = toposort([sink])
  if not any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in nodes): return None
  total = next((u for u in reversed(nodes) if u.op is Ops.REDUCE), None)   # the outermost: last in graph order
  if total is None or total.arg is not Ops.ADD or total.dtype != F32 or len(total.src) != 2: return None
  key, body = total.src[1], total.src[0]
  if body.op is not Ops.MUL or Kernel.size(key) is None: return None
  w, v = body.src
  if _strip_casts(w).op is not Ops.FDIV: w, v = v, w
  w = _strip_casts(w)
  if w.op is not Ops.FDIV or any(u.op not in FACTOR_OPS for u in v.toposort()): return None
  num, den = w.src
  if (shifted := _shifted_exp(num)) is None: return None
  x, top, log2e = shifted
  if den.op is not Ops.REDUCE or den.arg is not Ops.ADD or len(den.src) != 2: return None
  if not _same_upto_ranges(num, den.src[0], {key: den.src[1]}): return None
  if not _same_upto_ranges(x, top.src[0], {key: top.src[1]}): return None
  dots = [u for u in x.toposort() if u.op is Ops.REDUCE]
  if len(dots) != 1 or dots[0].arg is not Ops.ADD or dots[0].dtype != F32 or len(dots[0].src) != 2: return None
  dot, depth = dots[0], dots[0].src[1]
  if dot.src[0].op is not Ops.MUL or Kernel.size(depth) is None: return None
  q, k = dot.src[0].src
  if key in _ranges(q): q, k = k, q
  for factor in (q, k):
    if any(u.op not in FACTOR_OPS for u in factor.toposort()): return None
  if any(u.op is Ops.LOAD and u.src[0] is store.src[0] for u in nodes): return None
  q_ranges, k_ranges, v_ranges = _ranges(q), _ranges(k), _ranges(v)
  outputs = sorted(_ranges(store.src[1]), key=_range_key)
  if not outputs or any(Kernel.size(r) is None for r in outputs): return None
  if key in q_ranges or depth not in q_ranges or depth not in k_ranges or key not in v_ranges: return None
  rows = tuple(r for r in outputs if r in q_ranges and r not in k_ranges and r not in v_ranges)
  cols = tuple(r for r in outputs if r in v_ranges and r not in q_ranges and r not in k_ranges)
  batch = tuple(r for r in outputs if r not in rows and r not in cols)
  if not rows or not cols: return None
  # what may depend on what: the score on batch, rows and the key (its mask), V on batch, keys and columns
  inner = {key, depth}
  if not q_ranges <= set(rows) | set(batch) | inner or not k_ranges <= set(batch) | inner: return None
  if not v_ranges <= set(cols) | set(batch) | {key}: return None
  score_ranges = {u for u in toposort([x], stop=lambda u: u is dot) if u.op is Ops.RANGE}
  if not score_ranges <= set(rows) | set(batch) | {key}: return None
  epilogue = {u for u in toposort([store], stop=lambda u: u is total) if u.op is Ops.RANGE}
  if not epilogue <= set(outputs): return None
  if _first_conflict(nodes, outputs) is not None: return None
  dv = prod(Kernel.size(r) for r in cols)
  if dv % THREADS_COLS or dv > MAX_DV: return None
  if _ceil(prod(Kernel.size(r) for r in rows), BM) > 65535 or prod(Kernel.size(r) for r in batch) > 65535: return None
  return AttentionPlan(store, total, key, x, dot, depth, q, k, v, log2e, rows, cols, batch)

def _diagonal(term: UOp, row: UOp, key: UOp) -> int | None:
  """t where `term` holds exactly when key <= row + t (`key - row < t + 1`, `key - row == t` counts as its bound:
  a CMPLT or CMPEQ of two sums affine in the row and key ranges with opposite unit coefficients), else None."""
  if term.op not in (Ops.CMPLT, Ops.CMPEQ): return None
  left, right = (linear_form(u) for u in term.src)
  if left is None or right is None: return None
  terms = {u: left[0].get(u, 0) - right[0].get(u, 0) for u in {*left[0], *right[0]}}
  constant = left[1] - right[1]   # term: sum(terms) + constant < 0 (or == 0)
  if {u: c for u, c in terms.items() if c} not in ({key: 1, row: -1}, {key: -1, row: 1}): return None
  if term.op is Ops.CMPEQ: return -constant if terms[key] == 1 else constant
  return -constant - 1 if terms[key] == 1 else None   # row - key < c bounds the key from below: no skipping

def causal_bound(score: UOp, row: UOp, key: UOp) -> int | None:
  """t when the score expression is -inf wherever key > row + t (a causal mask, `where(key <= row + t, x, -inf)` or
  `x + where(..., 0, -inf)`, its condition an OR of CMPLT/CMPEQ terms each bounding the key by the row), else None:
  key blocks past `row + t` for every row of a query block are then skipped."""
  node, found = score, None
  while node.op in (Ops.ADD, Ops.MUL, Ops.CAST) and found is None:
    for src in node.src:
      if src.op is Ops.WHERE and src.src[2].op is Ops.CONST and src.src[2].arg == NEG_INF: found = src
    if found is None: node = node.src[0]
  if found is None: return None
  terms, stack = [], [found.src[0]]
  while stack:
    u = stack.pop()
    if u.op is Ops.OR: stack.extend(u.src)
    else: terms.append(u)
  bounds = [_diagonal(t, row, key) for t in terms]
  return None if any(b is None for b in bounds) else max(bounds)

def _stage(factor: UOp, outer: tuple[UOp, ...], inner: UOp, inner_fastest: bool, shared: UOp, lidx: UOp,
           origin: UOp, inner_base: UOp, half: UOp, tile: int, step: int, lead: int, guard_outer: bool,
           guard_inner: bool) -> list[UOp]:
  """The STOREs with which the block copies the factor's `tile` x `step` tile at (origin, inner_base) into its half
  of `shared` (laid out [half][inner][tile + pad], row length `lead`): element e = lidx + THREADS*j of each thread,
  the fast axis of the factor's memory taking neighbouring e. Elements past an edge the guards name are zeros, read
  at a clamped index (every load in bounds)."""
  extent, depth = prod(Kernel.size(r) for r in outer), Kernel.size(inner)
  stores = []
  for j in range(tile * step // THREADS):
    element = lidx + THREADS * j if j else lidx
    if inner_fastest: offset, kk = element // step, element % step
    else: offset, kk = element % tile, element // tile
    at, inside = _clamped(origin + offset, extent, guard_outer)
    at_inner, inside_inner = _clamped(inner_base + kk, depth, guard_inner)
    value = _substitute(factor, {**_unflatten(at, list(outer)), inner: at_inner})
    valid = inside & inside_inner if inside is not None and inside_inner is not None else inside or inside_inner
    if valid is not None: value = valid.where(value, UOp.const(value.dtype, 0))
    stores.append(UOp(Ops.STORE, dtypes.void, (shared, half * (step * lead) + kk * lead + offset,
                                               value.cast(F32) if value.dtype != F32 else value)))
  return stores

def _row_totals(op: Ops, values: list[UOp], lidx: UOp, warp: int) -> list[UOp]:
  """Each thread row's total (by `op`) over its 16 threads, from each thread's partial: warp shuffles."""
  return _shuffle_rounds([(op, v) for v in values], lidx, _halvings(THREADS_COLS), warp)

def _fold(op: Ops, values: list[UOp]) -> UOp:
  """values[0] op values[1] op ... (left to right)."""
  out = values[0]
  for u in values[1:]: out = UOp(op, F32, (out, u))
  return out

def _step_sum(a_reads: list[UOp], b_reads: list[UOp], step: UOp) -> UOp:
  """sum over `step` of the chain a[0]*b[0] + a[1]*b[1] + ... (one fused multiply-add a term after the first)."""
  chain = a_reads[0] * b_reads[0]
  for a, b in zip(a_reads[1:], b_reads[1:]): chain = UOp(Ops.MULACC, F32, (a, b, chain))
  return UOp(Ops.REDUCE, F32, (chain, step), Ops.ADD)

def _key_blocks(plan: AttentionPlan, row_block: UOp, length: int, keys: int, bm: int = 0, bn: int = 0) -> UOp:
  """How many key blocks of `bn` keys (0: BN) query block `row_block` of `bm` rows (0: BM) visits: all of them, or,
  under a causal mask (`causal_bound`), those up to its last row's last visible key (at least one: a row that sees no
  key stores NaN, as the graph does)."""
  bm, bn = bm or BM, bn or BN
  key_blocks = _ceil(keys, bn)
  diagonal = causal_bound(plan.score, plan.rows[-1], plan.key) if len(plan.rows) == 1 and CAUSAL_SKIP else None
  if diagonal is None: return UOp.const(INT, key_blocks)
  blocks = ((row_block * bm + (bm - 1 + diagonal)) // bn + 1).maximum(1)
  return graph_rewrite(blocks.lt(key_blocks).where(blocks, UOp.const(INT, key_blocks)), symbolic)

def flash_attention(sink: UOp, target: object = None) -> UOp | None:
  """An attention-shaped kernel (`attention_plan`) as one flash-style kernel (the module docstring), or None."""
  warp = shuffle_warp(target)
  plan = attention_plan(sink) if not NOLOCALS and warp >= THREADS_COLS and warp % THREADS_COLS == 0 else None
  if plan is None: return None
  if (tc_kernel := flash_attention_tc(sink, plan, target, warp)) is not None: return tc_kernel
  length = prod(Kernel.size(r) for r in plan.rows)
  keys, depth = Kernel.size(plan.key), Kernel.size(plan.depth)
  dv = prod(Kernel.size(r) for r in plan.cols)
  bk = 16 if depth >= 16 else 8   # the depth step of the scores
  bkv = 16 if dv <= 64 or BN < 64 else 8   # the key step of p @ V (its V tile: bkv x dv floats, double-buffered)
  tv, tm, tn = dv // THREADS_COLS, BM // THREADS_ROWS, BN // THREADS_COLS
  row_block = UOp(Ops.SPECIAL, INT, (), ("gidx0", _ceil(length, BM)))
  blocks = _key_blocks(plan, row_block, length, keys)
  next_id = fresh_range_id(sink)
  kb = UOp(Ops.RANGE, INT, (blocks,), next_id)
  dstep = UOp(Ops.RANGE, INT, (UOp.const(INT, _ceil(depth, bk)),), next_id + 1)
  vstep = UOp(Ops.RANGE, INT, (UOp.const(INT, BN // bkv),), next_id + 2)
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", THREADS))
  batch = prod(Kernel.size(r) for r in plan.batch)
  values = _unflatten(UOp(Ops.SPECIAL, INT, (), ("gidx1", batch)), list(plan.batch)) if batch > 1 else \
    {r: UOp.const(INT, 0) for r in plan.batch}
  q, k, v, score = (_substitute(f, values) for f in (plan.q, plan.k, plan.v, plan.score))
  dot = _substitute(plan.dot, values)
  q_fast, k_fast = _k_fastest(plan.q, plan.rows[-1], (plan.depth,)), _k_fastest(plan.k, plan.key, (plan.depth,))
  v_fast = _k_fastest(plan.v, plan.cols[-1], (plan.key,))
  lead_q, lead_k = BM + (SHARED_PAD if q_fast else 0), BN + (SHARED_PAD if k_fast else 0)
  lead_v, lead_p = dv + (SHARED_PAD if v_fast else 0), BM + SHARED_PAD
  tile_q = UOp(Ops.DEFINE_LOCAL, F32, (), ("attn_q", 2 * bk * lead_q))
  tile_k = UOp(Ops.DEFINE_LOCAL, F32, (), ("attn_k", 2 * bk * lead_k))
  tile_p = UOp(Ops.DEFINE_LOCAL, F32, (), ("attn_p", BN * lead_p))
  tile_v = UOp(Ops.DEFINE_LOCAL, F32, (), ("attn_v", 2 * bkv * lead_v))
  row_origin, key_origin = row_block * BM, kb * BN
  ragged_rows, ragged_keys, ragged_depth = length % BM != 0, keys % BN != 0, depth % bk != 0
  rows = _spread(lidx // THREADS_COLS, tm, BM)
  key_cols = _spread(lidx % THREADS_COLS, tn, BN)
  out_cols = _spread(lidx % THREADS_COLS, tv, dv)

  # the key block's scores: a sum over depth steps of bk, both tiles staged in shared memory
  half = dstep % 2
  staged = UOp(Ops.BARRIER, dtypes.void, tuple(
    _stage(q, plan.rows, plan.depth, q_fast, tile_q, lidx, row_origin, dstep * bk, half, BM, bk, lead_q,
           ragged_rows, ragged_depth) +
    _stage(k, (plan.key,), plan.depth, k_fast, tile_k, lidx, key_origin, dstep * bk, half, BN, bk, lead_k,
           ragged_keys, ragged_depth)))
  def read(shared: UOp, lead: int, kk: int, offset: UOp, half: UOp, step: int, after: UOp) -> UOp:
    return UOp(Ops.LOAD, F32, (shared, half * (step * lead) + kk * lead + offset, after))
  q_reads = [[read(tile_q, lead_q, kk, r, half, bk, staged) for r in rows] for kk in range(bk)]
  k_reads = [[read(tile_k, lead_k, kk, c, half, bk, staged) for c in key_cols] for kk in range(bk)]
  scores: list[list[UOp]] = []
  for i, r in enumerate(rows):
    row, _ = _clamped(row_origin + r, length, ragged_rows)
    line = []
    for j, c in enumerate(key_cols):
      at, inside = _clamped(key_origin + c, keys, ragged_keys)
      total = _step_sum([q_reads[kk][i] for kk in range(bk)], [k_reads[kk][j] for kk in range(bk)], dstep)
      s = _substitute(score, {**_unflatten(row, list(plan.rows)), plan.key: at, dot: total})
      line.append(inside.where(s, UOp.const(F32, NEG_INF)) if inside is not None else s)
    scores.append(line)

  # online softmax: the running maximum (a REDUCE MAX over key blocks, read inside as its value before the block)
  block_max = _row_totals(Ops.MAX, [_fold(Ops.MAX, line) for line in scores], lidx, warp)
  log2e, zero = plan.log2e, UOp.const(F32, 0.0)
  alphas, weights = [], []
  for i in range(tm):
    old = UOp(Ops.REDUCE, F32, (block_max[i], kb), Ops.MAX)
    new = old.lt(block_max[i]).where(block_max[i], old)
    base = new.ne(UOp.const(F32, NEG_INF)).where(new, zero)   # a row masked so far: exp2(-inf) = 0 against 0
    alphas.append(UOp(Ops.EXP2, F32, ((old - base) * log2e,)))
    weights.append([UOp(Ops.EXP2, F32, ((s - base) * log2e,)) for s in scores[i]])
  row_sums = _row_totals(Ops.ADD, [_fold(Ops.ADD, line) for line in weights], lidx, warp)
  acc_ids = iter(range(1 << 20, 1 << 21))
  def carried(value_of) -> UOp:
    acc = UOp(Ops.DEFINE_ACC, F32, (zero,), next(acc_ids))
    return UOp(Ops.ASSIGN, F32, (acc, value_of(acc)))
  sums = [carried(lambda acc, i=i: UOp(Ops.MULACC, F32, (acc, alphas[i], row_sums[i]))) for i in range(tm)]
  weights_stored = UOp(Ops.BARRIER, dtypes.void, tuple(
    UOp(Ops.STORE, dtypes.void, (tile_p, c * lead_p + r, weights[i][j]))
    for i, r in enumerate(rows) for j, c in enumerate(key_cols)))

  # p @ V over the block's keys in steps of bkv, V's tiles staged in shared memory
  vhalf = vstep % 2
  v_staged = UOp(Ops.BARRIER, dtypes.void, tuple(
    _stage(v, plan.cols, plan.key, v_fast, tile_v, lidx, UOp.const(INT, 0), key_origin + vstep * bkv, vhalf, dv, bkv,
           lead_v, False, ragged_keys)))
  p_reads = [[UOp(Ops.LOAD, F32, (tile_p, (vstep * bkv + jj) * lead_p + r, weights_stored)) for r in rows]
             for jj in range(bkv)]
  v_reads = [[read(tile_v, lead_v, jj, c, vhalf, bkv, v_staged) for c in out_cols] for jj in range(bkv)]
  last = UOp(Ops.CMPEQ, dtypes.bool, (kb, graph_rewrite(blocks - 1, symbolic))) if keys > BN else None
  stores = []
  for i, r in enumerate(rows):
    row, row_inside = _clamped(row_origin + r, length, ragged_rows)
    for j, c in enumerate(out_cols):
      block = _step_sum([p_reads[jj][i] for jj in range(bkv)], [v_reads[jj][j] for jj in range(bkv)], vstep)
      out = carried(lambda acc: UOp(Ops.MULACC, F32, (acc, alphas[i], block)))
      at = {**values, **_unflatten(row, list(plan.rows)), **_unflatten(c, list(plan.cols)), plan.total: out / sums[i]}
      store = _substitute(plan.store, at)
      gate = row_inside & last if row_inside is not None and last is not None else row_inside or last
      stores.append(store if gate is None else store.replace(src=(*store.src, gate)))
  return graph_rewrite(sink.replace(src=tuple(stores)), symbolic, name="flash attention")

# the tensor-core kernel (half and bfloat16 factors, `flash_attention_tc`): WARPS warps of 16 query rows each
TC_WARPS = 8
TC_BM = 16 * TC_WARPS
TC_RING = 3   # K's and V's cp.async rings: block kb computes from stage kb % 3 while block kb+1 lands in the next
TC_DIMS = (32, 64, 128)   # the depths and value widths whose rows the GEMM tiles' swizzle covers
TC_SHARED = 48 << 10   # the rings' bytes at most (static shared memory)
# half and bfloat16 attention on tensor cores where the target has them (and TC=1), else the SIMT kernel; off by
# default: on the H200 the tensor-core kernel is right but slower than the SIMT one (bench/gpu_notes.md, call main15-1)
TC = False
TC_BN = 0   # the tensor-core kernel's key block: 0 chooses (`_tc_key_block`), else this one where its copies fit

def _tc_key_block(depth: int, dv: int, itemsize: int) -> int | None:
  """The key block of the tensor-core kernel: the largest of 64 and 32 whose K and V stages are whole chunks for
  every thread (the GEMM tiles' copies) and whose rings fit TC_SHARED (or TC_BN where set and whole), or None."""
  from kiln.codegen.gpu_mma import CHUNK, THREADS as MMA_THREADS
  for bn in ((TC_BN,) if TC_BN else (64, 32)):
    whole = all(bn * size * itemsize % (CHUNK * MMA_THREADS) == 0 for size in (depth, dv))
    if whole and (TC_BN or TC_RING * bn * (depth + dv) * itemsize <= TC_SHARED): return bn
  return None

def _forms(layout, axis: int) -> list[tuple[int, int, int]]:
  from kiln.codegen.gpu_mma import lane_form, WARP
  return [lane_form([layout[lane][e][axis] for lane in range(WARP)]) for e in range(len(layout[0]))]

def _a_from_c(tc) -> list[tuple[int, int]]:
  """For each element of an m16k16 A fragment, the (n-tile 0 or 1, element) of the two adjacent m16n8 accumulators
  of the same rows that hold it (FlashAttention-2's register reuse: a lane's accumulators of P are its A fragment)."""
  c_rows, c_cols = _forms(tc.c_layout, 0), _forms(tc.c_layout, 1)
  out = []
  for row, k in zip(_forms(tc.a_layout, 0), _forms(tc.a_layout, 1)):
    found = [(t, e) for t in (0, 1) for e in range(4)
             if c_rows[e] == row and (c_cols[e][0], c_cols[e][1], c_cols[e][2] + tc.dims[1] * t) == k]
    if len(found) != 1: raise ValueError("gpu_attention: an A layout not made of two accumulator tiles")
    out.append(found[0])
  return out

def _b_fragments(tc, shared: UOp, tile: int, bk: int, stage: UOp, k_fastest: bool, lane: UOp,
                 staged: UOp) -> list[list[UOp]]:
  """gpu_mma._async_fragments' B fragments (per 8-column tile, per k16 step: one ldmatrix.x2, `.trans` from a k-major
  stage) of a whole stage, at the same swizzled places (gpu_mma._swizzled), each index written as the chunk's constant
  part above the swizzle's bits plus the XOR of the rest: the XORs a lane keeps across the loop are then at most 8."""
  cols = bk if k_fastest else tile
  width = 4 if cols == 32 else 8   # the swizzle's values: (row // 2) % 4 or row % 8
  out = []
  for t in range(tile // 8):
    steps = []
    for kk in range(bk // 16):
      if k_fastest: row, high, low = t * 8 + lane % 8, kk * 2 // width * width, kk * 2 % width + (lane // 8) % 2
      else: row, high, low = kk * 16 + lane % 8 + (lane // 8) % 2 * 8, t // width * width, UOp.const(INT, t % width)
      swizzle = (row // 2) % 4 if cols == 32 else row % 8
      index = stage * (tile * bk) + row * cols + (UOp(Ops.XOR, INT, (low, swizzle)) + high) * 8
      steps.append(UOp(Ops.LDMATRIX, tc.dtype_in.vec(4), (shared, index, staged), (2, not k_fastest)))
    out.append(steps)
  return out

def flash_attention_tc(sink: UOp, plan: AttentionPlan, target: object, warp: int) -> UOp | None:
  """The flash kernel with both products on tensor cores (mma.sync m16n8k16), or None where it does not fit: factors
  not all of one 16-bit dtype the target's tensor cores take, K or V not plain loads cp.async can stage, depth or value
  width outside TC_DIMS, a warp other than 32 lanes, TC=0. One block of TC_WARPS warps per TC_BM query rows, each
  warp 16 rows; per key block of bn keys: K and V copied by cp.async into rings of TC_RING stages (the GEMM tiles'
  swizzled layout, kiln/codegen/gpu_mma.py), S = Q K^T from Q's fragments (loaded once) and K's by ldmatrix, the
  online softmax on the accumulators (each lane holds two rows of each: their maxima and sums over the lane's quad
  by shuffles), P rounded to the inputs' dtype as the A fragments of O += P V (V's fragments by ldmatrix.trans)."""
  from kiln.helpers import TC as TC_SETTING
  from kiln.codegen.gpu_mma import (tensor_core, _narrowed, _async_source, _async_copies, _async_fragments,
                                    _lane_offsets, WARP, THREADS as MMA_THREADS)
  if not (TC and TC_SETTING) or warp != WARP or MMA_THREADS != TC_WARPS * WARP: return None
  factors = [_narrowed(f) for f in (plan.q, plan.k, plan.v)]
  dtype = factors[0].dtype
  if any(f.dtype != dtype for f in factors) or (tc := tensor_core(dtype, target)) is None or tc.dims != (16, 8, 16):
    return None
  length = prod(Kernel.size(r) for r in plan.rows)
  keys, depth = Kernel.size(plan.key), Kernel.size(plan.depth)
  dv = prod(Kernel.size(r) for r in plan.cols)
  if depth not in TC_DIMS or dv not in TC_DIMS or (bn := _tc_key_block(depth, dv, dtype.itemsize)) is None: return None
  batch = prod(Kernel.size(r) for r in plan.batch)
  values = _unflatten(UOp(Ops.SPECIAL, INT, (), ("gidx1", batch)), list(plan.batch)) if batch > 1 else \
    {r: UOp.const(INT, 0) for r in plan.batch}
  q, k, v = (_substitute(f, values) for f in factors)
  score, dot = _substitute(plan.score, values), _substitute(plan.dot, values)
  k_fast, v_fast = _k_fastest(plan.k, plan.key, (plan.depth,)), _k_fastest(plan.v, plan.cols[-1], (plan.key,))
  k_load = _async_source(k, (plan.key,), (plan.depth,), k_fast, tc)
  v_load = _async_source(v, plan.cols, (plan.key,), v_fast, tc)
  if k_load is None or v_load is None: return None

  row_block = UOp(Ops.SPECIAL, INT, (), ("gidx0", _ceil(length, TC_BM)))
  blocks = _key_blocks(plan, row_block, length, keys, TC_BM, bn)
  next_id = fresh_range_id(sink)
  kb = UOp(Ops.RANGE, INT, (blocks,), next_id)
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", MMA_THREADS))
  lane = lidx % WARP
  group, tig = lane // 4, lane % 4
  warp_row = row_block * TC_BM + (lidx // WARP) * 16
  ragged_rows, ragged_keys = length % TC_BM != 0, keys % bn != 0

  # Q's fragments of the warp's 16 rows, loaded once: from a shared tile Q's cp.async copies fill (one ldmatrix.x4 a
  # k16 step), or, where Q is no plain load, each lane's own elements of it (a_layout)
  q_fast = _k_fastest(plan.q, plan.rows[-1], (plan.depth,))
  q_load = _async_source(q, plan.rows, (plan.depth,), q_fast, tc)
  q_copies: list[UOp] = []
  if q_load is not None:
    tile_q = UOp(Ops.DEFINE_LOCAL, dtype, (), ("attn_q", TC_BM * depth))
    q_copies = _async_copies(q_load, plan.rows, (plan.depth,), q_fast, tile_q, lidx, row_block * TC_BM,
                             UOp.const(INT, 0), UOp.const(INT, 0), TC_BM, depth, None)
    q_landed = UOp(Ops.CP_ASYNC_COMMIT, dtypes.void, tuple(q_copies))
    q_staged = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.CP_ASYNC_WAIT, dtypes.void, (q_landed,), 0),))
    q_frags = _async_fragments(tc, tile_q, TC_BM, depth, UOp.const(INT, 0), q_fast, (lidx // WARP) * 16, 1, lane,
                               q_staged, True)[0]
  else:
    a_rows, a_ks = _lane_offsets(tc.a_layout, 0, group, tig), _lane_offsets(tc.a_layout, 1, group, tig)
    q_frags = []
    for kk in range(depth // 16):
      elements = []
      for r, c in zip(a_rows, a_ks):
        row, _ = _clamped(warp_row + r, length, ragged_rows)
        elements.append(_substitute(q, {**_unflatten(row, list(plan.rows)), plan.depth: c + kk * 16}))
      q_frags.append(UOp(Ops.VECTORIZE, dtype.vec(8), tuple(elements)))

  # K and V by cp.async into rings: block kb issues block kb+1's copies into the stage last read in block kb-2
  tile_k = UOp(Ops.DEFINE_LOCAL, dtype, (), ("attn_k", TC_RING * bn * depth))
  tile_v = UOp(Ops.DEFINE_LOCAL, dtype, (), ("attn_v", TC_RING * bn * dv))
  def issue(at: UOp, gate: UOp | None) -> UOp:
    stage = at % TC_RING if at.op is not Ops.CONST else UOp.const(INT, at.arg % TC_RING)
    copies = _async_copies(k_load, (plan.key,), (plan.depth,), k_fast, tile_k, lidx, at * bn, UOp.const(INT, 0),
                           stage, bn, depth, gate) + \
             _async_copies(v_load, plan.cols, (plan.key,), v_fast, tile_v, lidx, UOp.const(INT, 0), at * bn, stage,
                           dv, bn, gate)
    return UOp(Ops.CP_ASYNC_COMMIT, dtypes.void, tuple(copies))
  first = issue(UOp.const(INT, 0), None)
  static_blocks = _ceil(keys, bn)
  nxt = issue(kb + 1, (kb + 1).lt(blocks) if static_blocks > 1 else UOp.const(dtypes.bool, False))
  staged = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.CP_ASYNC_WAIT, dtypes.void, (first, nxt), 1),))
  stage = kb % TC_RING
  k_frags = _b_fragments(tc, tile_k, bn, depth, stage, k_fast, lane, staged)
  v_frags = _b_fragments(tc, tile_v, dv, bn, stage, v_fast, lane, staged)

  # S = Q K^T: a chain of WMMAs over the depth for each 8-key tile
  zero4 = UOp(Ops.VECTORIZE, F32.vec(4), tuple(UOp.const(F32, 0.0) for _ in range(4)))
  c_rows, c_cols = _lane_offsets(tc.c_layout, 0, group, tig), _lane_offsets(tc.c_layout, 1, group, tig)
  row_forms = _forms(tc.c_layout, 0)
  row_of = [sorted(set(row_forms)).index(f) for f in row_forms]   # each accumulator element's row of the lane (0, 1)
  scores: list[list[UOp]] = []   # [n-tile][element]
  for t in range(bn // 8):
    chain = zero4
    for kk in range(depth // 16): chain = UOp(Ops.WMMA, F32.vec(4), (q_frags[kk], k_frags[t][kk], chain), tc)
    line = []
    for e in range(4):
      row, _ = _clamped(warp_row + c_rows[e], length, ragged_rows)
      at, inside = _clamped(kb * bn + t * 8 + c_cols[e], keys, ragged_keys)
      s = _substitute(score, {**_unflatten(row, list(plan.rows)), plan.key: at, dot: UOp(Ops.GEP, F32, (chain,), e)})
      line.append(inside.where(s, UOp.const(F32, NEG_INF)) if inside is not None else s)
    scores.append(line)

  # the online softmax on the accumulators: each lane's two rows, their totals over the lane's quad
  quad = _halvings(4)
  def per_row(op: Ops, values: list[list[UOp]]) -> list[UOp]:
    partial = [_fold(op, [values[t][e] for t in range(len(values)) for e in range(4) if row_of[e] == i])
               for i in range(2)]
    return _shuffle_rounds([(op, u) for u in partial], lidx, quad, warp)
  block_max = per_row(Ops.MAX, scores)
  log2e, zero = plan.log2e, UOp.const(F32, 0.0)
  alphas, bases = [], []
  for i in range(2):
    old = UOp(Ops.REDUCE, F32, (block_max[i], kb), Ops.MAX)
    new = old.lt(block_max[i]).where(block_max[i], old)
    bases.append(new.ne(UOp.const(F32, NEG_INF)).where(new, zero))
    alphas.append(UOp(Ops.EXP2, F32, ((old - bases[i]) * log2e,)))
  weights = [[UOp(Ops.EXP2, F32, ((scores[t][e] - bases[row_of[e]]) * log2e,)) for e in range(4)]
             for t in range(bn // 8)]
  row_sums = per_row(Ops.ADD, weights)
  acc_ids = iter(range(1 << 20, 1 << 21))
  def accumulator() -> UOp: return UOp(Ops.DEFINE_ACC, F32, (zero,), next(acc_ids))
  sums = []
  for i in range(2):
    acc = accumulator()
    sums.append(UOp(Ops.ASSIGN, F32, (acc, UOp(Ops.MULACC, F32, (acc, alphas[i], row_sums[i])))))

  # O = O * alpha + P V: P's accumulators of n-tiles 2j, 2j+1 (rounded) are the A fragment of key step j
  pairs = _a_from_c(tc)
  p_frags = [UOp(Ops.VECTORIZE, dtype.vec(8), tuple(weights[2 * j + t][e].cast(dtype) for t, e in pairs))
             for j in range(bn // 16)]
  last = UOp(Ops.CMPEQ, dtypes.bool, (kb, graph_rewrite(blocks - 1, symbolic))) if keys > bn else None
  stores = []
  for t in range(dv // 8):
    accs = [accumulator() for _ in range(4)]
    chain = UOp(Ops.VECTORIZE, F32.vec(4), tuple(accs[e] * alphas[row_of[e]] for e in range(4)))
    for j in range(bn // 16): chain = UOp(Ops.WMMA, F32.vec(4), (p_frags[j], v_frags[t][j], chain), tc)
    for e in range(4):
      out = UOp(Ops.ASSIGN, F32, (accs[e], UOp(Ops.GEP, F32, (chain,), e)))
      row, row_inside = _clamped(warp_row + c_rows[e], length, ragged_rows)
      col = t * 8 + c_cols[e]
      at = {**values, **_unflatten(row, list(plan.rows)), **_unflatten(col, list(plan.cols)),
            plan.total: out / sums[row_of[e]]}
      store = _substitute(plan.store, at)
      gate = row_inside & last if row_inside is not None and last is not None else row_inside or last
      stores.append(store if gate is None else store.replace(src=(*store.src, gate)))
  return graph_rewrite(sink.replace(src=tuple(stores)), symbolic, name="flash attention tc")
