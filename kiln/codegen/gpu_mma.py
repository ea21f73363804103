"""Tensor-core matmul tiles for GPU targets (issue 21, stage 1), lowered kernel -> kernel over block and thread indices
whose products are warp-wide `Ops.WMMA`s (`mma.sync.aligned.m16n8k16`, kiln/runtime/gpu_target.py TensorCore).

The kernels are gpu_tiles' (the matmul shape of `gpu_tiles.matmul_plan`: any batch, row, column and reduce ranges,
factors that are elementwise expressions of loads, an epilogue in the STORE), where both factors are computed in a
dtype the target's tensor cores take (`factor_dtype`: half or bfloat16 loads cast to float32; float32 itself for
tf32, only under ALLOW_TF32=1). They run as:

- one block of THREADS threads (8 warps, WARPS_M x WARPS_N) per BM x BN output tile (`choose_mma_tile`: 128x128,
  64x128, 64x64 or 32x64; 128x256 where the target's shared memory holds it); `gidx0` the tile column, `gidx1` the row,
  `gidx2` the batch, as gpu_tiles';
- each warp a (BM/WARPS_M) x (BN/WARPS_N) warp tile: a grid of 16 x 8 tensor-core tiles, each lane holding four
  float32 accumulators of each (REDUCEs over the K loop, in the instruction's `c_layout`);
- the K loop stepped by BK (64 bytes of the input dtype: 32 halves, 16 floats), BK/k WMMAs per tensor-core tile a
  step, the step's chain starting at zero (the linearizer starts it at the accumulators: fuse_matrix_accumulate);
- where both factors are plain 16-bit global loads running in aligned 16-byte chunks along k or along their output
  axis (`_async_source`), the block copies them with cp.async (Ops.CP_ASYNC, zero-filled past an edge) into a ring
  of RING shared stages laid out as the factor's memory is ([m][k] or [k][m]), their chunks XOR-swizzled by the row
  (`_swizzled`), and reads fragments with ldmatrix (`.trans` from a [k][m] stage). Step s issues step s+1's copies
  into stage (s+1) % RING, which was last read in step s-2 (every thread finished that before it reached step s-1's
  barrier, which this thread passed), waits until only that newest group is in flight, and one BARRIER makes every
  thread's copies of step s visible: one barrier a step;
- other factors (a fused cast, a convolution's padded window, tf32) are copied by the threads' own loads into two
  shared halves (`_stage`, rows k fastest and padded by 16 bytes: a warp's fragment reads hit 32 different banks),
  then one BARRIER; step s+2 writes a half only after every thread passed step s+1's barrier (gpu_tiles' argument).
  Fragments come by ldmatrix (16-bit) or each lane's loads of the elements `a_layout[lane]`/`b_layout[lane]` name.

Where a tile does not divide m, n or k the edge tiles are guarded: loads past an edge read a clamped element and stage
a zero (a zero product adds nothing), stores past it are gated off; WMMAs are never gated (every lane of a warp runs
them). The epilogue (bias, activation, residual, the cast to half) is the kernel's own STORE with the sum replaced by
each accumulator, as gpu_tiles does. Chosen by the optimizer's TC action (kiln/codegen/opt/kernel.py), which the GPU
heuristics give every kernel `mma_plan` accepts (TC=1, the default; TC=0 keeps the SIMT tiles).
"""
from __future__ import annotations
from kiln.dtype import DType, dtypes
from kiln.helpers import ALLOW_TF32, NOLOCALS, TC, prod
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic, is_multiple_of, linear_form
from kiln.runtime.gpu_target import GPUTarget, TensorCore
from kiln.codegen.gpu_tiles import MatmulPlan, _ceil, _clamped, matmul_plan, staged_elements, tile_frame
from kiln.codegen.gpudims import _unflatten, _substitute   # (gpudims imports us lazily)
from kiln.codegen.opt.kernel import Kernel

INT = dtypes.int32
WARP = 32
WARPS_M, WARPS_N = 2, 4   # a block's warps, as a grid over its output tile
THREADS = WARPS_M * WARPS_N * WARP
# (BM, BN) output tiles, each with its expected rate relative to the first when the GPU is full of its blocks
# (estimates for stage 1: larger warp tiles read fewer fragment bytes per product)
TILES = ((128, 256, 1.0), (128, 128, 0.9), (64, 128, 0.7), (64, 64, 0.45), (32, 64, 0.2))
# a tile whose edge tiles leave more of its work padding than this is not taken (tensor cores do ~8x the SIMT tiles'
# work a cycle, so a padded tensor-core tile still beats them where gpu_tiles' MIN_USEFUL would refuse it)
MIN_USEFUL = 0.2
STEP_BYTES = 64   # the K step: 64 bytes of each staged row (32 halves, 16 floats)
PAD_BYTES = 16   # after each staged row: a warp's fragment reads then hit 32 different banks
MMA_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32)   # stage 1: fp16, bf16 and tf32 (fp8: stage 2)
LDMATRIX = True   # 16-bit fragments read by ldmatrix (Ops.LDMATRIX), else by a lane's plain loads of its elements

def tensor_core(dtype: DType, target: object = None) -> TensorCore | None:
  """The target's tensor-core instruction for factors of `dtype` with float32 sums (tf32 for float32 only under
  ALLOW_TF32=1), or None."""
  if dtype not in MMA_DTYPES or (dtype == dtypes.float32 and not ALLOW_TF32): return None
  cores = getattr(target if getattr(target, "has_local", False) else GPUTarget(), "tensor_cores", ())
  return next((tc for tc in cores if tc.dtype_in == dtype and tc.dtype_out == dtypes.float32), None)

def shared_bytes(bm: int, bn: int) -> int:
  """The shared memory of a BM x BN tile's double-buffered, padded A and B arrays."""
  return 2 * (bm + bn) * (STEP_BYTES + PAD_BYTES)

def choose_mma_tile(m: int, n: int, k: int, batch: int, multiprocessors: int = 132, itemsize: int = 2,
                    shared_max: int = 48 << 10, choice: int = 0) -> tuple[int, int, int] | None:
  """(BM, BN, BK) for an m x n x k tensor-core matmul (times `batch`) of `itemsize`-byte factors: the tile of TILES
  (or only TILES[choice - 1] for a choice > 0) whose arrays fit `shared_max` bytes and whose rate, times the share of
  the `multiprocessors` its waves of blocks keep busy, times the share of its work that is not padding, is highest;
  None when every tile would be mostly padding.

  >>> choose_mma_tile(4096, 4096, 4096, 1), choose_mma_tile(256, 256, 256, 1), choose_mma_tile(1, 4096, 4096, 1)
  ((128, 128, 32), (64, 64, 32), None)
  """
  bk = STEP_BYTES // itemsize
  best, best_score = None, 0.0
  for bm, bn, rate in (TILES if choice == 0 else TILES[choice - 1:choice]):
    if shared_bytes(bm, bn) > shared_max or bm * bk % THREADS or bn * bk % THREADS: continue
    useful = m / (_ceil(m, bm) * bm) * n / (_ceil(n, bn) * bn) * k / (_ceil(k, bk) * bk)
    if useful < MIN_USEFUL: continue
    blocks = _ceil(m, bm) * _ceil(n, bn) * batch
    busy = blocks / (_ceil(blocks, multiprocessors) * multiprocessors)
    if rate * busy * useful > best_score: best, best_score = (bm, bn, bk), rate * busy * useful
  return best

def mma_plan(sink: UOp, target: object = None, choice: int = 0) -> tuple[MatmulPlan, TensorCore] | None:
  """The MatmulPlan of a lowered matmul-shaped kernel whose factors the target's tensor cores take, and the
  instruction; None where there is none, with TC=0 or NOLOCALS=1, or where no tile fits (`choose_mma_tile`)."""
  if not TC or NOLOCALS: return None
  gpu = target if getattr(target, "has_local", False) else GPUTarget()
  for dtype in MMA_DTYPES:
    if (tc := tensor_core(dtype, gpu)) is None: continue
    def chooser(m: int, n: int, k: int, batch: int, multiprocessors: int) -> tuple[int, int, int] | None:
      return choose_mma_tile(m, n, k, batch, multiprocessors, dtype.itemsize, gpu.shared_max, choice)
    plan = matmul_plan(sink, gpu.multiprocessors, (dtype,), chooser)
    if plan is not None: return plan, tc
  return None

def lane_form(values: list[int]) -> tuple[int, int, int]:
  """(per group, per thread in group, constant) with `values[lane] == g * (lane // 4) + t * (lane % 4) + c` for
  every lane (the fragment layouts of mma.sync are such forms); ValueError where a layout is not.

  >>> from kiln.runtime.gpu_target import MMA_F16
  >>> lane_form([MMA_F16.a_layout[lane][3][1] for lane in range(32)]), lane_form(list(range(32)))
  ((0, 2, 1), (4, 1, 0))
  """
  c = values[0]
  g, t = values[4] - c, values[1] - c
  if any(values[lane] != g * (lane // 4) + t * (lane % 4) + c for lane in range(WARP)):
    raise ValueError(f"gpu_mma: a fragment layout that is no affine form of the lane's group and thread: {values}")
  return g, t, c

def _lane_offsets(layout, axis: int, group: UOp, tig: UOp) -> list[UOp]:
  """Each element's coordinate `axis` (0 or 1) in a fragment layout, as an expression of the lane's group and thread
  in group."""
  out = []
  for e in range(len(layout[0])):
    g, t, c = lane_form([layout[lane][e][axis] for lane in range(WARP)])
    out.append(group * g + tig * t + c)
  return out

def _narrowed(factor: UOp) -> UOp:
  """A factor in the dtype it is computed in (without its last cast to float32)."""
  return factor.src[0] if factor.op is Ops.CAST and factor.dtype == dtypes.float32 else factor

def _stage(factor: UOp, outer: tuple[UOp, ...], k_ranges: tuple[UOp, ...], k_fastest: bool, shared: UOp, lidx: UOp,
           origin: UOp, k_base: UOp, half: UOp, tile: int, bk: int, lead: int) -> list[UOp]:
  """The STOREs with which the block copies the factor's `tile` x `bk` tile at (origin, k_base), in its own dtype,
  into its half of `shared` (laid out [half][tile][lead], k fastest; `gpu_tiles.staged_elements`)."""
  return [UOp(Ops.STORE, dtypes.void, (shared, half * (tile * lead) + offset * lead + kk, value))
          for offset, kk, value in staged_elements(factor, outer, k_ranges, k_fastest, lidx, origin, k_base, tile, bk,
                                                   THREADS)]

RING = 3   # the async path's shared-memory ring: step s computes from stage s % RING while step s+1 lands in the next
CHUNK = 16   # bytes of one asynchronous copy (8 halves), the unit of the async path's staging and swizzle
ASYNC = True   # stage plain 16-bit loads with cp.async (Ops.CP_ASYNC) where `_async_source` allows it

def _async_source(factor: UOp, outer: tuple[UOp, ...], k_ranges: tuple[UOp, ...], k_fastest: bool,
                  tc: TensorCore) -> UOp | None:
  """The factor's global LOAD where cp.async can stage it: a plain 16-bit load of a global buffer whose index moves
  by 1 along the factor's fast axis (k, or its innermost output range) in runs of CHUNK bytes: that range's size a
  multiple of a chunk's elements, every other term and the constant multiples of it (each chunk one aligned copy;
  the buffer's base pointer is a whole allocation's, cuMemAlloc'd: 256-byte aligned). None otherwise."""
  load = _narrowed(factor)
  if load.op is not Ops.LOAD or len(load.src) != 2 or load.src[0].op is not Ops.DEFINE_GLOBAL: return None
  if load.dtype != tc.dtype_in or load.dtype.itemsize != 2: return None
  elements = CHUNK // load.dtype.itemsize
  fast = k_ranges[-1] if k_fastest else outer[-1]
  form = linear_form(load.src[1])
  if form is None or form[0].get(fast) != 1 or Kernel.size(fast) % elements: return None
  if any(fast in term.toposort() for term in form[0] if term is not fast): return None
  return load if is_multiple_of(load.src[1] - fast, elements) else None

def _swizzled(row: UOp, chunk: UOp, cols: int) -> UOp:
  """The element index of chunk `chunk` (CHUNK bytes) of row `row` of a [rows][cols] 16-bit shared array, its chunks
  XOR-swizzled by the row so that 8 rows read at one logical chunk (an ldmatrix phase) hit 32 different banks: rows of
  64 bytes pair up (row // 2), wider rows take row % 8."""
  swizzle = (row // 2) % 4 if cols == 32 else row % 8
  return row * cols + UOp(Ops.XOR, INT, (chunk, swizzle)) * 8

def _async_copies(load: UOp, outer: tuple[UOp, ...], k_ranges: tuple[UOp, ...], k_fastest: bool, shared: UOp,
                  lidx: UOp, origin: UOp, k_base: UOp, stage: UOp, tile: int, bk: int,
                  gate: UOp | None) -> list[UOp]:
  """The CP_ASYNCs with which the block copies the factor's `tile` x `bk` tile at (origin, k_base) into `stage` of
  `shared` (a ring of [tile][bk] stages k fastest, or [bk][tile] where the factor's memory is fastest along its
  output axis), one aligned chunk per copy, neighbouring threads taking neighbouring chunks of memory. A chunk past
  an edge (or any, where `gate` fails: the ring's last step) is zeros: its copy reads nothing."""
  extent, k = prod(Kernel.size(r) for r in outer), prod(Kernel.size(r) for r in k_ranges)
  per_row = (bk if k_fastest else tile) // 8
  copies = []
  for j in range(tile * bk // 8 // THREADS):
    chunk_id = lidx + THREADS * j if j else lidx
    row, chunk = chunk_id // per_row, chunk_id % per_row
    offset, kk = (row, chunk * 8) if k_fastest else (chunk * 8, row)
    at, at_k = origin + offset, k_base + kk
    valid = [v for v in (at.lt(extent) if extent % tile else None, at_k.lt(k) if k % bk else None, gate)
             if v is not None]
    inside = None
    for v in valid: inside = v if inside is None else inside & v
    if inside is not None:   # a chunk that copies nothing still names an address in bounds: the first
      at, at_k = inside.where(at, UOp.const(INT, 0)), inside.where(at_k, UOp.const(INT, 0))
    index = _substitute(load.src[1], {**_unflatten(at, list(outer)), **_unflatten(at_k, list(k_ranges))})
    dst = stage * (tile * bk) + _swizzled(row, chunk, bk if k_fastest else tile)
    copies.append(UOp(Ops.CP_ASYNC, dtypes.void, (shared, dst, load.src[0], index) +
                      ((inside,) if inside is not None else ()), (CHUNK, "cg")))
  return copies

def _async_fragments(tc: TensorCore, shared: UOp, tile: int, bk: int, stage: UOp, k_fastest: bool, first: int,
                     count: int, lane: UOp, staged: UOp, is_a: bool) -> list[list[UOp]]:
  """Per tensor-core tile of A (`is_a`: `count` tiles of 16 rows from row `first`) or B (of 8 columns), its
  fragments of each k16 sub-step, read from the swizzled ring stage by one ldmatrix (x4 for A, x2 for B; `.trans`
  where the stage is k-major, the factor's memory fastest along its output axis). Matrix j of A is rows +8*(j%2)
  and k +8*(j//2), of B k +8*j: the fragments' register order."""
  out = []
  for t in range(count):
    base = first + t * (16 if is_a else 8)
    steps = []
    for kk in range(bk // 16):
      if k_fastest:   # rows are the output axis, chunks k
        row = base + lane % 8 + ((lane // 8) % 2 * 8 if is_a else 0)
        chunk = kk * 2 + (lane // 16 if is_a else (lane // 8) % 2)
      else:   # rows are k, chunks the output axis (transposed reads)
        row = kk * 16 + lane % 8 + (lane // 16 if is_a else (lane // 8) % 2) * 8
        chunk = base // 8 + ((lane // 8) % 2 if is_a else 0)
      index = stage * (tile * bk) + _swizzled(row, chunk, bk if k_fastest else tile)
      steps.append(UOp(Ops.LDMATRIX, tc.dtype_in.vec(8 if is_a else 4), (shared, index, staged),
                       (4 if is_a else 2, not k_fastest)))
    out.append(steps)
  return out

def tile_mma(sink: UOp, target: object = None, choice: int = 0) -> UOp | None:
  """A matmul-shaped kernel (`mma_plan`) as shared-memory tiles per block and tensor-core tiles per warp (the
  module docstring) for `target` (None: the H200's), or None where no plan fits."""
  found = mma_plan(sink, target, choice)
  if found is None: return None
  plan, tc = found
  bm, bn, bk = plan.tile
  tile_m, tile_n, tile_k = tc.dims
  dtype = tc.dtype_in
  lead = bk + PAD_BYTES // dtype.itemsize
  warp_m, warp_n = bm // WARPS_M, bn // WARPS_N   # a warp's output tile
  m, n = prod(Kernel.size(r) for r in plan.rows), prod(Kernel.size(r) for r in plan.cols)
  k = prod(Kernel.size(r) for r in plan.k_ranges)
  step, lidx, col_block, row_block, values = tile_frame(sink, plan, THREADS)
  factors = [_substitute(_narrowed(f), values) for f in (plan.a, plan.b)]
  row_origin, col_origin = row_block * bm, col_block * bn
  warp, lane = lidx // WARP, lidx % WARP
  group, tig = lane // 4, lane % 4
  warp_row, warp_col = (warp // WARPS_N) * warp_m, (warp % WARPS_N) * warp_n
  sub_steps, tiles_m, tiles_n = bk // tile_k, warp_m // tile_m, warp_n // tile_n
  sources = [_async_source(f, outer, plan.k_ranges, fastest, tc) for f, outer, fastest in
             ((factors[0], plan.rows, plan.a_k_fastest), (factors[1], plan.cols, plan.b_k_fastest))]
  whole = all(size * bk * dtype.itemsize % (CHUNK * THREADS) == 0 for size in (bm, bn))   # a chunk a thread, or more
  if ASYNC and LDMATRIX and all(s is not None for s in sources) and tc.dims == (16, 8, 16) and tiles_n % 2 == 0 and \
     whole:
    # a ring of RING stages filled by cp.async: step s's copies were issued (and committed) in step s-1; step s
    # issues step s+1's into stage (s+1) % RING, last read in step s-2, which every thread has finished: it passed
    # step s-1's barrier. It then waits for all but that newest group (step s's copies have landed), and one
    # barrier makes every thread's copies visible
    tile_a = UOp(Ops.DEFINE_LOCAL, dtype, (), ("tile_a", RING * bm * bk))
    tile_b = UOp(Ops.DEFINE_LOCAL, dtype, (), ("tile_b", RING * bn * bk))
    def issue(at_step: UOp, gate: UOp | None) -> UOp:
      stage = at_step % RING if at_step.op is not Ops.CONST else UOp.const(INT, at_step.arg % RING)
      copies = _async_copies(sources[0], plan.rows, plan.k_ranges, plan.a_k_fastest, tile_a, lidx, row_origin,
                             at_step * bk, stage, bm, bk, gate) + \
               _async_copies(sources[1], plan.cols, plan.k_ranges, plan.b_k_fastest, tile_b, lidx, col_origin,
                             at_step * bk, stage, bn, bk, gate)
      return UOp(Ops.CP_ASYNC_COMMIT, dtypes.void, tuple(copies))
    first = issue(UOp.const(INT, 0), None)   # the prologue: step 0's copies, before the loop
    steps = _ceil(k, bk)
    nxt = issue(step + 1, (step + 1).lt(steps) if steps > 1 else UOp.const(dtypes.bool, False))
    landed = UOp(Ops.CP_ASYNC_WAIT, dtypes.void, (first, nxt), 1)
    staged = UOp(Ops.BARRIER, dtypes.void, (landed,))   # every thread's copies of step s are visible
    stage = step % RING
    a_frags = _async_fragments(tc, tile_a, bm, bk, stage, plan.a_k_fastest, warp_row, tiles_m, lane, staged, True)
    b_frags = _async_fragments(tc, tile_b, bn, bk, stage, plan.b_k_fastest, warp_col, tiles_n, lane, staged, False)
    return _accumulate(sink, plan, tc, a_frags, b_frags, step, values, row_origin + warp_row, col_origin + warp_col,
                       group, tig, m, n, bm, bn)
  tile_a = UOp(Ops.DEFINE_LOCAL, dtype, (), ("tile_a", 2 * bm * lead))
  tile_b = UOp(Ops.DEFINE_LOCAL, dtype, (), ("tile_b", 2 * bn * lead))
  half, k_base = step % 2, step * bk
  stores = _stage(factors[0], plan.rows, plan.k_ranges, plan.a_k_fastest, tile_a, lidx, row_origin, k_base, half,
                  bm, bk, lead) + \
           _stage(factors[1], plan.cols, plan.k_ranges, plan.b_k_fastest, tile_b, lidx, col_origin, k_base, half,
                  bn, bk, lead)
  staged = UOp(Ops.BARRIER, dtypes.void, tuple(stores))   # the step's tiles are in shared memory
  a_rows, a_ks = _lane_offsets(tc.a_layout, 0, group, tig), _lane_offsets(tc.a_layout, 1, group, tig)
  b_ks, b_cols = _lane_offsets(tc.b_layout, 0, group, tig), _lane_offsets(tc.b_layout, 1, group, tig)
  def fragment(shared: UOp, tile: int, first: UOp, outer: list[UOp], inner: list[UOp], kk: int) -> UOp:
    """A lane's fragment of the step's sub-step `kk` at tile row/column `first` of `shared`, in layout order."""
    reads = [UOp(Ops.LOAD, dtype, (shared, half * (tile * lead) + (first + o) * lead + kk * tile_k + i, staged))
             for o, i in zip(outer, inner)]
    return UOp(Ops.VECTORIZE, dtype.vec(len(reads)), tuple(reads))
  if LDMATRIX and dtype.itemsize == 2 and tc.dims == (16, 8, 16):
    # one ldmatrix.x4 a fragment of A (matrix j: rows +8*(j%2), k +8*(j//2), the a_layout's register order), one x2
    # a fragment of B (an n-major tile: matrix j holds k +8*j)
    def matrices(shared: UOp, tile: int, first: UOp, kk: int, row_of_lane: UOp, k_of_lane: UOp, x: int) -> UOp:
      index = half * (tile * lead) + (first + row_of_lane) * lead + kk * tile_k + k_of_lane
      return UOp(Ops.LDMATRIX, dtype.vec(2 * x), (shared, index, staged), (x, False))
    a_frags = [[matrices(tile_a, bm, warp_row + i * tile_m, kk, lane % 8 + (lane // 8) % 2 * 8, lane // 16 * 8, 4)
                for kk in range(sub_steps)] for i in range(tiles_m)]
    b_frags = [[matrices(tile_b, bn, warp_col + j * tile_n, kk, lane % 8, (lane // 8) % 2 * 8, 2)
                for kk in range(sub_steps)] for j in range(tiles_n)]
  else:
    a_frags = [[fragment(tile_a, bm, warp_row + i * tile_m, a_rows, a_ks, kk) for kk in range(sub_steps)]
               for i in range(tiles_m)]
    b_frags = [[fragment(tile_b, bn, warp_col + j * tile_n, b_cols, b_ks, kk) for kk in range(sub_steps)]
               for j in range(tiles_n)]
  return _accumulate(sink, plan, tc, a_frags, b_frags, step, values, row_origin + warp_row, col_origin + warp_col,
                     group, tig, m, n, bm, bn)

def _accumulate(sink: UOp, plan: MatmulPlan, tc: TensorCore, a_frags: list[list[UOp]], b_frags: list[list[UOp]],
                step: UOp, values: dict[UOp, UOp], warp_row: UOp, warp_col: UOp, group: UOp, tig: UOp, m: int, n: int,
                bm: int, bn: int) -> UOp:
  """The kernel's stores: each tensor-core tile's chain of WMMAs over the step's fragments (from zero), its four
  lanes summed over the K loop (REDUCEs: the accumulators), substituted for the sum in the kernel's STORE at the
  lane's `c_layout` elements (gated where an edge tile passes m or n)."""
  tile_m, tile_n, _ = tc.dims
  c_rows, c_cols = _lane_offsets(tc.c_layout, 0, group, tig), _lane_offsets(tc.c_layout, 1, group, tig)
  zero = UOp(Ops.VECTORIZE, tc.dtype_out.vec(4), tuple(UOp.const(tc.dtype_out, 0.0) for _ in range(4)))
  out = []
  for i, a_steps in enumerate(a_frags):
    for j, b_steps in enumerate(b_frags):
      chain = zero
      for a, b in zip(a_steps, b_steps): chain = UOp(Ops.WMMA, tc.dtype_out.vec(4), (a, b, chain), tc)
      for e in range(4):
        acc = UOp(Ops.REDUCE, tc.dtype_out, (UOp(Ops.GEP, tc.dtype_out, (chain,), e), step), Ops.ADD)
        row, row_inside = _clamped(warp_row + i * tile_m + c_rows[e], m, m % bm != 0)
        col, col_inside = _clamped(warp_col + j * tile_n + c_cols[e], n, n % bn != 0)
        at = {**values, **_unflatten(row, list(plan.rows)), **_unflatten(col, list(plan.cols)), plan.total: acc}
        store = _substitute(plan.store, at)
        gate = row_inside & col_inside if row_inside is not None and col_inside is not None else \
          row_inside or col_inside
        out.append(store if gate is None else store.replace(src=(*store.src, gate)))
  return graph_rewrite(sink.replace(src=tuple(out)), symbolic, name="gpu mma")
