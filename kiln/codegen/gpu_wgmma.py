"""The Hopper (sm_90a) GEMM from a matmul plan (issue 21, stage 2, first pass): a warp-specialized block of TMA loads
into an mbarrier ring and wgmma over it (the ops of docs/ir.md stage 4), built as a linear kernel.

Taken (`wgmma_plan`) only under WGMMA=1, on an sm_90a target, for a lowered matmul-shaped kernel (gpu_tiles'
`matmul_plan`) with no batch, one row, one column and one reduce range, whose factors are plain half or bfloat16 global
loads both K-major in memory (A m x k row-major, B given n x k: `x @ w.T`, nn.Linear's layout), k a multiple of 8
(a TMA row stride is a multiple of 16 bytes). Everything else is refused (None). Edge tiles (m or n not a multiple of
BM = BN = 128, k not of BK = 64) read zeros past the matrix (the TMA's out-of-bounds fill: a zero product adds
nothing) and gate their stores. The kernel (`wgmma_kernel`):

- one block of THREADS = 384 threads (three warpgroups) per 128 x 128 output tile, `gidx0` the tile column, `gidx1` the
  row; warpgroups 0 and 1 the consumers (rows 0-63 and 64-127 of the tile), thread 256 the producer;
- a ring of RING stages in dynamic shared memory, each a 128 x 64 tile of A and of B (16 KiB each, 128-byte rows
  with the TMA's 128-byte swizzle, 1024-byte aligned), with a "full" mbarrier (one arrival with the stage's bytes
  expected) and an "empty" one (one arrival by lane 0 of each of the 8 consumer warps) a stage;
- K step s (stage s % RING, phase (s // RING) & 1): the producer waits until the stage is empty (parity phase ^ 1:
  the first round returns at once), expects its 32 KiB and issues both TMA loads; each consumer waits until the
  stage is full (parity phase), runs 4 wgmma m64n128k16 (K = 16 each, 32 bytes apart in the swizzled rows) from its
  64 rows of A and the 128 rows of B, commits, waits for them, and its warps release the stage;
- the accumulators (64 float32 a thread, the instruction's `c_layout`) run through the kernel's own STORE (the
  plan's epilogue: bias, activation, cast), the sum replaced by each accumulator, gated to the consumers.
The producer can run RING steps ahead of the consumers; the consumers do not yet overlap one step's wgmmas with the
next (wait_group 0 a step; OVERLAP), and the registers are not redistributed (no setmaxnreg: in straight-line gated
code ptxas ignores the producer's dec, so the consumers' inc could never be granted).
"""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.helpers import WGMMA
from kiln.uop.ops import UOp, Ops
from kiln.uop.symbolic import linear_form
from kiln.runtime.gpu_target import GPUTarget, SmemMatrix, TensorMap, WarpgroupMMA
from kiln.codegen.gpu_tiles import MatmulPlan, matmul_plan
from kiln.codegen.opt.kernel import Kernel

INT, BOOL, F32, U64 = dtypes.int32, dtypes.bool, dtypes.float32, dtypes.uint64
BM, BN, BK = 128, 128, 64   # the output tile and the K step (64 16-bit elements: one 128-byte swizzled row)
RING = 4   # stages of the shared-memory ring (4 x 32 KiB)
THREADS = 384   # two consumer warpgroups and one producer warpgroup (its first thread issues the TMA loads)
SPAN = 128   # the swizzle span in bytes (a tile row)
# True: a consumer waits only for the step before's wgmmas (wait_group 1) and releases that step's stage. Off: ptxas
# then serializes the wgmmas ("WG.DP in divergent path": in-flight accumulators cross the producer's gated branches
# of the next step); it needs the roles in separate branches (an IF region, not yet in the IR)
OVERLAP = False
DTYPES = (dtypes.float16, dtypes.bfloat16)

def _load(factor: UOp) -> UOp:
  """A factor without its cast to float32."""
  return factor.src[0] if factor.op is Ops.CAST and factor.dtype == dtypes.float32 else factor

def _k_major_load(factor: UOp, outer: UOp, k_range: UOp, k: int) -> UOp | None:
  """The factor's plain global LOAD where its index is exactly `outer * k + k_range` (a row-major, K-major matrix),
  else None."""
  load = _load(factor)
  if load.op is not Ops.LOAD or len(load.src) != 2 or load.src[0].op is not Ops.DEFINE_GLOBAL: return None
  if load.dtype not in DTYPES: return None
  form = linear_form(load.src[1])
  return load if form is not None and form == ({outer: k, k_range: 1}, 0) else None

def wgmma_plan(sink: UOp, target: object = None) -> tuple[MatmulPlan, UOp, UOp] | None:
  """(the MatmulPlan, A's load, B's load) of a lowered kernel this pass builds (the module docstring), or None: with
  WGMMA=0, on a target other than sm_90a, or for any kernel outside the pass's shapes."""
  if not WGMMA: return None
  gpu = target if getattr(target, "has_local", False) else GPUTarget()
  if getattr(gpu, "arch", "") != "sm_90a": return None
  def chooser(m: int, n: int, k: int, batch: int, multiprocessors: int) -> tuple[int, int, int] | None:
    # a TMA row stride is a multiple of 16 bytes: k of 8 16-bit elements
    return (BM, BN, BK) if k % 8 == 0 and batch == 1 else None
  plan = matmul_plan(sink, getattr(gpu, "multiprocessors", 132), DTYPES, chooser)
  if plan is None or plan.batch or len(plan.rows) != 1 or len(plan.cols) != 1 or len(plan.k_ranges) != 1: return None
  k = Kernel.size(plan.k_ranges[0])
  a = _k_major_load(plan.a, plan.rows[0], plan.k_ranges[0], k)
  b = _k_major_load(plan.b, plan.cols[0], plan.k_ranges[0], k)
  if a is None or b is None or a.dtype != b.dtype: return None
  return plan, a, b

class _Linear:
  """A linear kernel built in order: each node after its sources (constants and buffers added where first used)."""
  def __init__(self) -> None:
    self.uops: list[UOp] = []
    self.seen: set[UOp] = set()

  def add(self, u: UOp) -> UOp:
    for node in u.toposort():
      if node not in self.seen: self.seen.add(node); self.uops.append(node)
    return u

  def alu(self, op: Ops, a: UOp, b: UOp | int, dtype=None) -> UOp:
    b = b if isinstance(b, UOp) else UOp.const(INT, b)
    return self.add(UOp(op, dtype or a.dtype, (a, b)))

  def void(self, op: Ops, *src: UOp, arg=None) -> UOp: return self.add(UOp(op, dtypes.void, tuple(src), arg))

def _substitute(node: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`node` with the nodes of `mapping` replaced (users rebuilt)."""
  done: dict[UOp, UOp] = dict(mapping)
  for u in node.toposort():
    if u in done: continue
    src = tuple(done.get(s, s) for s in u.src)
    done[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
  return done[node]

def wgmma_kernel(sink: UOp, target: object = None) -> list[UOp] | None:
  """The linear Hopper GEMM kernel (the module docstring) of a lowered kernel `wgmma_plan` accepts, else None.
  Its DEFINE_TENSORMAPs (A's map 0, B's map 1) are kernel parameters after the buffers; the ring is dynamic shared
  memory (kiln/renderer/shared_memory.py)."""
  found = wgmma_plan(sink, target)
  if found is None: return None
  plan, a_load, b_load = found
  dtype = a_load.dtype
  m, n, k = (Kernel.size(r) for r in (plan.rows[0], plan.cols[0], plan.k_ranges[0]))
  kern = _Linear()
  lane = kern.add(UOp(Ops.SPECIAL, INT, (), ("lidx0", THREADS)))
  col_block = kern.add(UOp(Ops.SPECIAL, INT, (), ("gidx0", -(-n // BN))))
  row_block = kern.add(UOp(Ops.SPECIAL, INT, (), ("gidx1", -(-m // BM))))
  maps = [kern.add(UOp(Ops.DEFINE_TENSORMAP, dtypes.void, (load.src[0],),
                       (i, TensorMap(dtype, rows, k, (tile, BK), SPAN))))
          for i, (load, rows, tile) in enumerate(((a_load, m, BM), (b_load, n, BN)))]
  tile_bytes = [BM * BK * dtype.itemsize, BN * BK * dtype.itemsize]
  tiles = [kern.add(UOp(Ops.DEFINE_LOCAL, dtype, (), (name, RING * rows * BK))) for name, rows in (("sA", BM),
                                                                                                  ("sB", BN))]
  bars = kern.add(UOp(Ops.DEFINE_LOCAL, U64, (), ("bars", 2 * RING)))   # full 0..RING-1, empty RING..2*RING-1
  first = kern.alu(Ops.CMPEQ, lane, 0, BOOL)
  consumer = kern.alu(Ops.CMPLT, lane, 256, BOOL)
  producer = kern.alu(Ops.CMPEQ, lane, 256, BOOL)
  warp_leader = kern.add(kern.alu(Ops.CMPEQ, kern.alu(Ops.MOD, lane, 32), 0, BOOL) & consumer)
  for i in range(RING): kern.void(Ops.MBARRIER_INIT, bars, UOp.const(INT, i), first, arg=1)
  for i in range(RING): kern.void(Ops.MBARRIER_INIT, bars, UOp.const(INT, RING + i), first, arg=8)
  kern.void(Ops.BARRIER)
  wg = WarpgroupMMA(BN, dtype, SmemMatrix(SPAN, 8 * SPAN), SmemMatrix(SPAN, 8 * SPAN))
  acc_dtype = F32.vec(BN // 2)
  acc = kern.add(UOp(Ops.DEFINE_ACC, acc_dtype, (UOp.const(acc_dtype, 0.0),), (0,)))
  # the consumer's 64-row half of the A tile: bytes into each stage
  half = kern.alu(Ops.MUL, kern.alu(Ops.IDIV, lane, 128), 64 * SPAN)
  origins = [kern.alu(Ops.MUL, row_block, BM), kern.alu(Ops.MUL, col_block, BN)]   # (before the loop: used after)
  step = kern.add(UOp(Ops.RANGE, INT, (UOp.const(INT, -(-k // BK)),), 0))
  stage = kern.alu(Ops.MOD, step, RING)
  phase = kern.alu(Ops.AND, kern.alu(Ops.IDIV, step, RING), 1)
  empty = kern.alu(Ops.ADD, stage, RING)
  kern.void(Ops.MBARRIER_WAIT, bars, empty, kern.alu(Ops.XOR, phase, 1), producer)
  kern.void(Ops.MBARRIER_ARRIVE, bars, stage, producer, arg=sum(tile_bytes))
  offsets = [kern.alu(Ops.MUL, stage, b) for b in tile_bytes]
  column = kern.alu(Ops.MUL, step, BK)
  for tile, tmap, offset, origin in zip(tiles, maps, offsets, origins):
    kern.void(Ops.TMA_LOAD, tile, offset, tmap, bars, stage, origin, column, producer)
  kern.void(Ops.MBARRIER_WAIT, bars, stage, phase, consumer)
  a_base = kern.alu(Ops.ADD, offsets[0], half)
  starts = [(kern.alu(Ops.ADD, a_base, 32 * kk), kern.alu(Ops.ADD, offsets[1], 32 * kk))
            for kk in range(BK * dtype.itemsize // 32)]
  kern.void(Ops.WGMMA_FENCE, consumer)   # the consumer's ops in a row: one branch
  d = acc
  for a_start, b_start in starts:
    d = kern.add(UOp(Ops.WGMMA, acc_dtype, (tiles[0], a_start, tiles[1], b_start, d, consumer), wg))
  kern.void(Ops.WGMMA_COMMIT, consumer)
  if OVERLAP:   # step s-1's wgmmas are done (step s's may still run): release stage (s-1) % RING
    kern.void(Ops.WGMMA_WAIT, consumer, arg=1)
    previous = kern.alu(Ops.ADD, kern.alu(Ops.MOD, kern.alu(Ops.ADD, step, RING - 1), RING), RING)
    kern.void(Ops.MBARRIER_ARRIVE, bars, previous, kern.add(warp_leader & kern.alu(Ops.CMPLT, UOp.const(INT, 0), step,
                                                                                      BOOL)), arg=0)
  else:
    kern.void(Ops.WGMMA_WAIT, consumer, arg=0)
    kern.void(Ops.MBARRIER_ARRIVE, bars, empty, warp_leader, arg=0)
  kern.add(UOp(Ops.ASSIGN, acc_dtype, (acc, d)))
  kern.void(Ops.ENDRANGE, step)
  if OVERLAP: kern.void(Ops.WGMMA_WAIT, consumer, arg=0)   # the last step's wgmmas, before the epilogue reads them
  # the epilogue: thread t (of its warpgroup) holds element i at row 16*warp + t%32//4 + 8*((i//2)%2), column
  # 2*(t%4) + 8*(i//4) + i%2 of its 64 x 128 accumulator (WarpgroupMMA.c_layout)
  t = kern.alu(Ops.MOD, lane, 128)
  row0 = kern.alu(Ops.ADD, kern.alu(Ops.ADD, origins[0], kern.alu(Ops.MUL, kern.alu(Ops.IDIV, lane, 128), 64)),
                  kern.alu(Ops.ADD, kern.alu(Ops.MUL, kern.alu(Ops.IDIV, t, 32), 16),
                           kern.alu(Ops.IDIV, kern.alu(Ops.MOD, t, 32), 4)))
  col0 = kern.alu(Ops.ADD, origins[1], kern.alu(Ops.MUL, kern.alu(Ops.MOD, t, 4), 2))
  for i in range(BN // 2):
    j, h, e = i // 4, (i // 2) % 2, i % 2
    row, col = kern.alu(Ops.ADD, row0, 8 * h), kern.alu(Ops.ADD, col0, 8 * j + e)
    value = kern.add(UOp(Ops.GEP, F32, (acc,), i))
    gate = consumer
    if m % BM:   # an edge tile: its rows past m compute at row m-1 (every load in bounds) and store nothing
      inside = kern.alu(Ops.CMPLT, row, m, BOOL)
      row, gate = kern.add(inside.where(row, UOp.const(INT, m - 1))), kern.add(gate & inside)
    if n % BN:
      inside = kern.alu(Ops.CMPLT, col, n, BOOL)
      col, gate = kern.add(inside.where(col, UOp.const(INT, n - 1))), kern.add(gate & inside)
    store = _substitute(plan.store, {plan.rows[0]: row, plan.cols[0]: col, plan.total: value})
    kern.add(UOp(store.op, store.dtype, (*store.src, gate), store.arg))
  return kern.uops

def shared_bytes() -> int:
  """The ring's shared memory (the barriers' 64 bytes not counted)."""
  return RING * (BM + BN) * BK * 2
