"""SIMT matmul tiling for GPU targets, lowered kernel -> kernel over block and thread indices with shared memory.

A kernel of the matmul shape, `out[b, m, n] = epilogue(sum_k A(b, m, k) * B(b, k, n))` (one STORE of one float32 sum
of a product whose factors each depend on output ranges of their own, any batch ranges and the reduce ranges; the
factors may be any expressions of loads: casts, fused elementwise ops, a convolution's padded windows, its several
pixel ranges flattened into one m), runs as:

- one block of THREADS threads (16 x 16) per BM x BN output tile (`choose_tile`; `gidx0` the tile column, `gidx1`
  the tile row, `gidx2` the batch), each thread holding a TM x TN register tile of accumulators (one REDUCE each);
- the K loop stepped by BK: each step the block copies the A tile (BM x BK) and the B tile (BK x BN) into shared
  arrays (DEFINE_LOCAL `tile_a`, `tile_b`), neighbouring threads loading neighbouring elements of each factor's
  memory (coalesced), then a BARRIER, then each thread reads a column of A and a row of B from shared memory per k
  and updates its TM x TN accumulators with fused multiply-adds (MULACC, a chain of BK per step);
- the shared arrays are double-buffered (step s uses half s % 2): step s+2 writes a half only after every thread has
  passed step s+1's barrier, i.e. finished reading it in step s, so one barrier a step suffices;
- a thread's TN columns are TN/4 groups of 4 adjacent ones, BN/(TN/4) apart (rows likewise): its shared reads are
  aligned groups of 4 (16-byte loads) that a warp makes without bank conflicts, and its stores are 16-byte runs.

Where a tile does not divide m, n or k, the edge tiles are guarded: loads past an edge read a clamped element and
stage a zero, stores past it are gated off. Off with NOLOCALS=1. Refused (None, the kernel then maps as before)
where every tile would be mostly padding (a matrix-vector product), the sum is not float32, or anything else does not
fit: a plan is checked before the kernel is built, never guessed.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from kiln.dtype import DType, dtypes
from kiln.helpers import NOLOCALS, prod
from kiln.uop.ops import UOp, Ops, GroupOp, toposort
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic
from kiln.codegen.gpudims import _range_key, _linear, _first_conflict, _unflatten, _substitute, fresh_range_id   # imports us lazily
from kiln.codegen.opt.kernel import Kernel

INT = dtypes.int32
THREADS_ROWS, THREADS_COLS = 16, 16   # a block's threads, as a grid over its output tile
THREADS = THREADS_ROWS * THREADS_COLS
# (BM, BN) output tiles, largest first, each with its rate relative to the first when the GPU is full of its blocks
# (a thread holds (BM/16) x (BN/16) outputs; H200, 4096^3: 45.7, 40.1 and 31.7 TFLOP/s, bench/gpu_notes.md call 13)
TILES = ((128, 128, 1.0), (128, 64, 0.88), (64, 128, 0.88), (64, 64, 0.69), (32, 32, 0.3))   # 64x128: as 128x64
BLOCK_KS = (16, 8)   # the K step: the first that divides K
MULTIPROCESSORS = 132   # the H200's, the default: blocks run in waves of the target's multiprocessors
SHARED_PAD = 4   # floats after each shared row written k-fastest (its writes would otherwise hit one bank)
# what a factor may be made of: loads and elementwise math over them (no reduction, no shared memory)
FACTOR_OPS = GroupOp.ALU | {Ops.LOAD, Ops.CONST, Ops.RANGE, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CAST, Ops.BITCAST}

@dataclass(frozen=True)
class MatmulPlan:
  """A matmul-shaped kernel's parts: its STORE, the float32 sum (outermost REDUCE of a chain of nested ones), the
  reduce ranges (outermost first), the row, column and batch output ranges (each in loop order: a convolution's rows
  are its batch and pixel ranges, flattened), the factors A (of rows, k) and B (of k, columns), whether each factor's
  memory is fastest along k, and the chosen tile (BM, BN, BK)."""
  store: UOp
  total: UOp
  k_ranges: tuple[UOp, ...]
  rows: tuple[UOp, ...]
  cols: tuple[UOp, ...]
  batch: tuple[UOp, ...]
  a: UOp
  b: UOp
  a_k_fastest: bool
  b_k_fastest: bool
  tile: tuple[int, int, int]

def _ranges(node: UOp) -> set[UOp]:
  return {u for u in node.toposort() if u.op is Ops.RANGE}

def _k_fastest(factor: UOp, outer: UOp, k_ranges: tuple[UOp, ...]) -> bool:
  """Whether the factor's first load moves less in memory along the innermost k range than along `outer` (its
  output range): then neighbouring threads should take neighbouring k (coalesced)."""
  load = next((u for u in factor.toposort() if u.op is Ops.LOAD), None)
  if load is None: return True
  form = _linear(load.src[1], frozenset((outer, k_ranges[-1])), {})
  if form is None: return True
  k_step, outer_step = abs(form[0].get(k_ranges[-1], 0)), abs(form[0].get(outer, 0))
  return k_step != 0 and (outer_step == 0 or k_step < outer_step)

def _ceil(a: int, b: int) -> int: return -(-a // b)

MIN_USEFUL = 0.5   # a tile whose edge tiles would leave more of its work padding than this is not taken

def choose_tile(m: int, n: int, k: int, batch: int,
                multiprocessors: int = MULTIPROCESSORS) -> tuple[int, int, int] | None:
  """(BM, BN, BK) for an m x n x k matmul (times `batch`): the tile of TILES whose rate, times the share of the
  `multiprocessors` its waves of blocks keep busy (a last partial wave leaves some idle), times the share of its work
  that is not padding (edge tiles where it does not divide m, n or k: guarded), is highest; None when every tile
  would be mostly padding.

  >>> choose_tile(4096, 4096, 4096, 1), choose_tile(1024, 1024, 1024, 1), choose_tile(100, 64, 64, 1)
  ((128, 128, 16), (128, 64, 16), (32, 32, 16))
  >>> choose_tile(1, 4096, 4096, 1), choose_tile(4096, 4096, 3, 1)   # a matrix-vector product; a sum of 3 terms
  (None, None)
  """
  bk = next((bk for bk in BLOCK_KS if k % bk == 0), BLOCK_KS[-1])
  best, best_score = None, 0.0
  for bm, bn, rate in TILES:
    if bm * bk % THREADS or bn * bk % THREADS: continue
    useful = m / (_ceil(m, bm) * bm) * n / (_ceil(n, bn) * bn) * k / (_ceil(k, bk) * bk)
    if useful < MIN_USEFUL: continue
    blocks = _ceil(m, bm) * _ceil(n, bn) * batch
    busy = blocks / (_ceil(blocks, multiprocessors) * multiprocessors)
    if rate * busy * useful > best_score: best, best_score = (bm, bn, bk), rate * busy * useful
  return best

def factor_dtype(factor: UOp) -> DType:
  """The dtype a factor of the float32 product is computed in before its last cast: a half for `float(half load)`,
  float32 for a float32 expression."""
  return factor.src[0].dtype if factor.op is Ops.CAST and factor.dtype == dtypes.float32 else factor.dtype

def matmul_plan(sink: UOp, multiprocessors: int = MULTIPROCESSORS, factor_dtypes: tuple[DType, ...] | None = None,
                chooser: Callable[..., tuple[int, int, int] | None] = choose_tile) -> MatmulPlan | None:
  """The MatmulPlan of a lowered kernel of the matmul shape (see the module docstring) for a GPU of
  `multiprocessors` SMs, or None. With `factor_dtypes` (the tensor-core tiles, kiln/codegen/gpu_mma.py) both
  factors must be computed in one of those dtypes (`factor_dtype`: float32 casts of half loads, say); `chooser`
  picks the tile, `chooser(m, n, k, batch, multiprocessors)`."""
  if len(sink.src) != 1 or sink.src[0].op is not Ops.STORE or len(sink.src[0].src) != 3: return None
  store = sink.src[0]
  if store.src[0].op is not Ops.DEFINE_GLOBAL: return None
  nodes = toposort([sink])
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  if not reduces: return None
  total = reduces[-1]   # sources come first: the outermost REDUCE is the last one
  chain, body = [total], total.src[0]
  while body.op is Ops.REDUCE: chain.append(body); body = body.src[0]
  if len(chain) != len(reduces) or any(r.arg is not Ops.ADD or r.dtype != dtypes.float32 for r in chain): return None
  if body.op is not Ops.MUL or len(body.src) != 2: return None
  k_ranges = tuple(sorted((r for red in chain for r in red.src[1:]), key=lambda r: r.arg if isinstance(r.arg, int)
                          else 1 << 30))
  if len(set(k_ranges)) != len(k_ranges) or any(Kernel.size(r) is None for r in k_ranges): return None
  a, b = body.src
  if factor_dtypes is not None and (factor_dtype(a) != factor_dtype(b) or factor_dtype(a) not in factor_dtypes):
    return None
  for factor in (a, b):
    if any(u.op not in FACTOR_OPS for u in factor.toposort()): return None
    if any(u.op is Ops.LOAD and u.src[0] is store.src[0] for u in factor.toposort()): return None
  outputs = [u for u in nodes if u.op is Ops.RANGE and u not in k_ranges]
  if any(Kernel.size(r) is None for r in outputs): return None
  a_ranges, b_ranges = _ranges(a), _ranges(b)
  outputs.sort(key=_range_key)
  rows = tuple(r for r in outputs if r in a_ranges and r not in b_ranges)
  cols = tuple(r for r in outputs if r in b_ranges and r not in a_ranges)
  batch = tuple(r for r in outputs if r in a_ranges and r in b_ranges)
  if not rows or not cols or len(rows) + len(cols) + len(batch) != len(outputs): return None
  if not set(k_ranges) <= a_ranges | b_ranges: return None
  # the epilogue reads the sum and output ranges only, and each output is written by one thread
  epilogue_ranges = {u for u in toposort([store], stop=lambda u: u is total) if u.op is Ops.RANGE}
  if epilogue_ranges - set(outputs): return None
  if _first_conflict(nodes, outputs) is not None: return None
  form = _linear(store.src[1], frozenset(outputs), {})
  # the columns should hold the output's fastest axis (a thread's 4 adjacent columns: 16-byte runs of stores)
  if form is not None and abs(form[0].get(cols[-1], 0)) > abs(form[0].get(rows[-1], 0)):
    a, b, rows, cols = b, a, cols, rows
  m, n = prod(Kernel.size(r) for r in rows), prod(Kernel.size(r) for r in cols)
  tile = chooser(m, n, prod(Kernel.size(r) for r in k_ranges), prod(Kernel.size(r) for r in batch), multiprocessors)
  if tile is None or prod(Kernel.size(r) for r in batch) > 65535 or _ceil(m, tile[0]) > 65535: return None
  return MatmulPlan(store, total, k_ranges, rows, cols, batch, a, b, _k_fastest(a, rows[-1], k_ranges),
                    _k_fastest(b, cols[-1], k_ranges), tile)

def _spread(thread: UOp, count: int, tile: int) -> list[UOp]:
  """The `count` offsets in a tile of `tile` of the thread at `thread` (of 16 along this axis): groups of up to 4
  adjacent ones, the groups tile/(count/4) apart.

  >>> [u.arg for u in _spread(UOp.const(INT, 1), 8, 128)]
  [4, 5, 6, 7, 68, 69, 70, 71]
  """
  width = min(4, count)
  groups = count // width
  stride = tile // groups
  return [graph_rewrite(thread * width + (j // width) * stride + j % width, symbolic) for j in range(count)]

def _clamped(index: UOp, size: int, guarded: bool) -> tuple[UOp, UOp | None]:
  """`index` clamped to `size - 1` and whether it was below `size`, where an edge tile may pass it (`guarded`)."""
  if not guarded: return index, None
  valid = index.lt(size)
  return valid.where(index, UOp.const(INT, size - 1)), valid

def staged_elements(factor: UOp, outer: tuple[UOp, ...], k_ranges: tuple[UOp, ...], k_fastest: bool, lidx: UOp,
                    origin: UOp, k_base: UOp, tile: int, bk: int, threads: int) -> list[tuple[UOp, UOp, UOp]]:
  """The elements a block of `threads` threads copies of the factor's `tile` x `bk` tile at (origin, k_base), as
  (offset along the tile, k in the step, value): element e = lidx + threads*j of each thread, the fast axis of the
  factor's memory taking neighbouring e. Elements past the factor's edge (an edge tile) are zeros, read at a clamped
  index (every load in bounds)."""
  extent, k = prod(Kernel.size(r) for r in outer), prod(Kernel.size(r) for r in k_ranges)
  out = []
  for j in range(tile * bk // threads):
    element = lidx + threads * j if j else lidx
    if k_fastest: offset, kk = element // bk, element % bk
    else: offset, kk = element % tile, element // tile
    at, inside = _clamped(origin + offset, extent, extent % tile != 0)
    at_k, inside_k = _clamped(k_base + kk, k, k % bk != 0)
    value = _substitute(factor, {**_unflatten(at, list(outer)), **_unflatten(at_k, list(k_ranges))})
    valid = inside & inside_k if inside is not None and inside_k is not None else inside or inside_k
    if valid is not None: value = valid.where(value, UOp.const(value.dtype, 0))
    out.append((offset, kk, value))
  return out

def _stage(factor: UOp, outer: tuple[UOp, ...], k_ranges: tuple[UOp, ...], k_fastest: bool, shared: UOp, lidx: UOp,
           origin: UOp, k_base: UOp, half: UOp, tile: int, bk: int, lead: int) -> list[UOp]:
  """The STOREs with which the block copies the factor's `tile` x `bk` tile at (origin, k_base) into its half of
  `shared` (laid out [half][k][tile + pad], row length `lead`), as float32 (`staged_elements`)."""
  return [UOp(Ops.STORE, dtypes.void, (shared, half * (bk * lead) + kk * lead + offset,
                                       value.cast(dtypes.float32) if value.dtype != dtypes.float32 else value))
          for offset, kk, value in staged_elements(factor, outer, k_ranges, k_fastest, lidx, origin, k_base, tile, bk,
                                                   THREADS)]

def tile_frame(sink: UOp, plan: MatmulPlan, threads: int) -> tuple[UOp, UOp, UOp, UOp, dict[UOp, UOp]]:
  """What a block-tiled matmul kernel is built on: the K-step loop (a RANGE of ceil(k / BK) steps with a fresh id),
  the thread index `lidx0` of `threads`, the block's tile column (`gidx0`) and row (`gidx1`), and the values of the
  batch ranges (`gidx2` unflattened over them, or 0 where there is no batch)."""
  bm, bn, bk = plan.tile
  m, n = prod(Kernel.size(r) for r in plan.rows), prod(Kernel.size(r) for r in plan.cols)
  k = prod(Kernel.size(r) for r in plan.k_ranges)
  step = UOp(Ops.RANGE, INT, (UOp.const(INT, _ceil(k, bk)),), fresh_range_id(sink))
  lidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", threads))
  col_block = UOp(Ops.SPECIAL, INT, (), ("gidx0", _ceil(n, bn)))
  row_block = UOp(Ops.SPECIAL, INT, (), ("gidx1", _ceil(m, bm)))
  batch = prod(Kernel.size(r) for r in plan.batch)
  values = _unflatten(UOp(Ops.SPECIAL, INT, (), ("gidx2", batch)), list(plan.batch)) if batch > 1 else \
    {r: UOp.const(INT, 0) for r in plan.batch}
  return step, lidx, col_block, row_block, values

def tile_matmul(sink: UOp, multiprocessors: int = MULTIPROCESSORS) -> UOp | None:
  """A matmul-shaped kernel (`matmul_plan`) as shared-memory tiles per block and register tiles per thread (the
  module docstring) for a GPU of `multiprocessors` SMs, or None where no plan fits."""
  plan = matmul_plan(sink, multiprocessors) if not NOLOCALS else None
  if plan is None: return None
  bm, bn, bk = plan.tile
  tm, tn = bm // THREADS_ROWS, bn // THREADS_COLS
  m, n = prod(Kernel.size(r) for r in plan.rows), prod(Kernel.size(r) for r in plan.cols)
  step, lidx, col_block, row_block, values = tile_frame(sink, plan, THREADS)
  factors = [_substitute(f, values) for f in (plan.a, plan.b)]
  lead_a = bm + (SHARED_PAD if plan.a_k_fastest else 0)
  lead_b = bn + (SHARED_PAD if plan.b_k_fastest else 0)
  tile_a = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), ("tile_a", 2 * bk * lead_a))
  tile_b = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), ("tile_b", 2 * bk * lead_b))
  half, k_base = step % 2, step * bk
  row_origin, col_origin = row_block * bm, col_block * bn
  stores = _stage(factors[0], plan.rows, plan.k_ranges, plan.a_k_fastest, tile_a, lidx, row_origin, k_base, half,
                  bm, bk, lead_a) + \
           _stage(factors[1], plan.cols, plan.k_ranges, plan.b_k_fastest, tile_b, lidx, col_origin, k_base, half,
                  bn, bk, lead_b)
  staged = UOp(Ops.BARRIER, dtypes.void, tuple(stores))   # the step's tiles are in shared memory
  rows = _spread(lidx // THREADS_COLS, tm, bm)
  cols = _spread(lidx % THREADS_COLS, tn, bn)
  def read(shared: UOp, lead: int, kk: int, offset: UOp) -> UOp:
    return UOp(Ops.LOAD, dtypes.float32, (shared, half * (bk * lead) + kk * lead + offset, staged))
  a_reads = [[read(tile_a, lead_a, kk, r) for r in rows] for kk in range(bk)]
  b_reads = [[read(tile_b, lead_b, kk, c) for c in cols] for kk in range(bk)]
  out = []
  for i, r in enumerate(rows):
    for j, c in enumerate(cols):
      chain = a_reads[0][i] * b_reads[0][j]
      for kk in range(1, bk): chain = UOp(Ops.MULACC, dtypes.float32, (a_reads[kk][i], b_reads[kk][j], chain))
      acc = UOp(Ops.REDUCE, dtypes.float32, (chain, step), Ops.ADD)
      row, row_inside = _clamped(row_origin + r, m, m % bm != 0)   # an edge tile's outputs past the edge: not
      col, col_inside = _clamped(col_origin + c, n, n % bn != 0)   # stored (their epilogue reads stay in bounds)
      at = {**values, **_unflatten(row, list(plan.rows)), **_unflatten(col, list(plan.cols)), plan.total: acc}
      store = _substitute(plan.store, at)
      gate = row_inside & col_inside if row_inside is not None and col_inside is not None else row_inside or col_inside
      out.append(store if gate is None else store.replace(src=(*store.src, gate)))
  return graph_rewrite(sink.replace(src=tuple(out)), symbolic, name="gpu tiles")
