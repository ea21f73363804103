"""Hand-written choices of actions for common kernel shapes (no search): what `optimize_kernel` applies by default.

The choices follow from how each axis walks memory (its stride in every load and store):
- an output axis with stride 0 in some load reuses that load's data across the axis (matmul's rows reuse `b`,
  columns reuse `a`): upcast it so a tile of accumulators shares every load (register tiling). The tile is 16x8:
  16 on the axis that reuses a gated (padded) load (conv's output channels), else on the axis contiguous in the
  output and in a moving load (matmul's columns), applied first (its lanes vary fastest); 8 on the innermost axis
  that reuses the other load. Measured on a 2-core EPYC (clang 14, 2 threads; anchors.py --quick), 8x8 -> 16x8:
  matmul 512 96 -> 150 GFLOP/s, 1024 72-80 -> 100-165, 2048 44 -> 73-77; conv2d 16x64x56x56 * 64x3x3 pad 1
  (8x8 on its two spatial axes before) 7 -> 27-44 GFLOP/s, the MLP SGD step 46-61 -> 61-120 steps/s; BEAM=4's
  winner for matmul 512 (an 8x16 tile rows x columns, K unrolled by 2) measured 47-85 GFLOP/s against 16x8's
  87-150, and unrolling K by 2 on top of 16x8 was within noise, so it is left out (compile time). Without such a
  pair (e.g. `a @ b.T`: no axis is contiguous in both), the innermost two reused axes get 8 (or 4) each. On a
  target, a matmul tile's vector axis is two registers wide and it has as many rows (8, else 4) as the register
  file holds with one row of `b` and a broadcast value (`plan_for`): 8x32 on AVX-512's 32 registers, 4x16 on AVX2's
  16, where 8 rows spilled accumulators every step (bench/RESULTS.md, seventh session, the -march=x86-64-v3 rows);
- 16 rows instead of 8 (a 16x16 tile) where that halves L1 misses and the 16 rows' loads do not thrash one L1 set
  (rows 4 KiB apart map to one set of 8 ways): a matmul whose `b` rows lie 4 KiB apart (N = 1024: every step of its
  panel misses L1) gets 16 rows of `a` (`_tall_tile_pays`: 256x256 @ 256x1024 88-93 -> 108-110 GFLOP/s), and
  `a @ b.T` with both axes multiples of 16 gets 16x16 (`_transposed_tile_pays`: the anchors' attention scores 161 ->
  124 us, 512^3 52 -> 69 GFLOP/s);
- a large matmul (its `b` panel, the reduce axis times the inner output axes, over KBLOCK_MIN_BYTES) is cache
  blocked after tiling: SPLIT the outermost output axis so 16 tiles form a thread's unit of work, and KBLOCK the
  reduce axis by 256, so each row block walks its tiles over a 256-row panel of `b` (2 MiB at 2048) that stays in
  L2 and L3 instead of the whole of `b` (16 MiB) per row of tiles. Measured on the 2-core EPYC (clang 14, one
  thread, CPU time, busy machine): matmul 2048 37-45 -> 82-86 GFLOP/s (NumPy 100); 1024 85 -> 81-83 (within noise,
  so not applied), 512 98 -> 105. Re-measured later (one thread, CPU time, best of 8 interleaved, load 1.5-2.8):
  this choice 74-84 GFLOP/s, NumPy 96-103, and no variant was faster beyond the noise (an A/A pair differs by ~9%):
  KBLOCK 64/128/512 66-77, 8 or 32 tiles per unit 63-77, columns outside rows in a unit 68-73, SPLIT of the
  columns instead (units of 8 or 16 column tiles, all rows) 67-72, K unrolled by 2 74; clearly slower: a 16x16 tile
  33-44 (16 rows of `a` 8 KiB apart share one L1 set), 8x32 48-55, 4x16 46, 4x32 36, no blocking 38. BEAM=2 (2
  threads) keeps this choice after a 252 s search. Where the scheduler packed the operands (kiln/schedule/pack.py:
  each step of the sum reads one cache line of `b`), the panel counts all of `b` and the reduce axis is blocked by 512
  (`_panel`); matmul 2048, 2 threads, best of 5 interleaved: KBLOCK 512 with 16 or 32 tiles per unit 188-197
  GFLOP/s, 256 183, 1024 183, unblocked 121-125; NumPy 187-193. On a target, a packed panel is blocked once it
  outgrows one L2 (an unpacked one above KBLOCK_L2_MULTIPLE L2s). A packed matmul of two axes is blocked by units of
  tile columns instead (`_column_units`): each unit's block of `b` stays in L2 while every row tile of `a`, in L1,
  sweeps the unit's columns (bench/RESULTS.md, thirteenth session: the Xeon's 1024 and 2048 matmuls 7-17% faster
  than units of rows); with more axes (a batch), the units are of rows and the unit's tile columns run outside its
  tile rows (SWAP), each column panel of `b` serving all of the unit's rows while it is in cache;
- few rows against a large `b` (`b` over one L2 and `a` within half of one, or `b` over half an L2 and `a` within an
  eighth: a 1x1 conv's weights over a large image, a conv's output gradient over small images in its weight
  gradient) put the tile's columns outside its rows (SWAP), so each column panel of `b` serves every row from L1
  (`_columns_outside`); inside an outer loop, a tiled sum whose `a` and `b` outgrow L2 together is blocked
  (`_block_for_l2`), its overlapping tiles padded first (`_kblock_tile`: KBLOCK refuses an overlapping tile);
- a sum over several axes whose innermost axis is contiguous in every load (a conv's weight gradient) gets 8
  accumulator lanes on that axis (LANES: one vector accumulator) and a small output tile (`_lane_reduction`; of two
  adjacent tap axes, the rows);
- a matrix-vector product (a load that moves along every output axis, another reused along one, each sum's innermost
  axis contiguous: an LLM decode step's `x @ W.T`, W possibly dequantized in the kernel) gets 16 accumulator lanes
  on that axis and no register tile (`_matrix_vector`);
- reduce axes of at most 4 iterations left innermost (pooling windows, the overlap sum of a conv's input gradient)
  are unrolled whole, so their index math folds to constants (`_unroll_tiny_reduce_axes`);
- a reduction with few accumulators (row reduction, a full sum) gets 8 (or 4; 32 when it sums at least LONG_SUM
  terms) accumulator lanes when its innermost axis is contiguous in every load (LANES: vector accumulators fed by
  vector loads; measured on a 16M float32 sum, one core: 2.6-3.2 -> 2.0-2.8 ms), else is unrolled, so each loop
  iteration does several independent operations;
- a reduction over a strided axis (column reduction) upcasts the output axis that is contiguous, so each iteration
  reads a contiguous run of elements into separate accumulators;
- an elementwise kernel upcasts its contiguous inner axis by 8 or 4, or whole when short and neither divides it, or
  by its largest divisor up to 64 when long (`_elementwise_upcast`: scalar code branches on every select), by one
  register of the target's lanes where its body is software math (16 on AVX-512: compute bound); a copy
  that reads its source in column strips of rows a page apart (a packed matmul operand) reads blocks of 32 rows strip
  by strip (`_block_row_reads`);
- a fused row kernel (softmax, layernorm: several reductions per row, then the row's elementwise loop) upcasts the
  row's elementwise loop (its loads do not move in the reduce loops, so it counts as reused) and gives each
  reduction over a contiguous row accumulator lanes (`_unroll_row_reductions`);
- last, for accuracy rather than speed (and also under NOOPT=1), a float sum whose accumulators each add more than
  2*SUM_BLOCK terms is blocked (BLOCKSUM, repeatedly) until no accumulator adds more than about 2*SUM_BLOCK terms
  (`block_long_sums`; docs/ir.md, "Blocked accumulation").
"""
from __future__ import annotations
import functools, math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from kiln.dtype import dtypes
from kiln.helpers import prod
from kiln.uop.ops import UOp, Ops, GroupOp, toposort
from kiln.uop.symbolic import exec_alu
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError, graph_nodes
if TYPE_CHECKING: from kiln.runtime.cpu_target import CPUTarget   # the type only: codegen never imports runtimes

SOFTWARE_MATH_OPS = (Ops.EXP2, Ops.LOG2, Ops.SIN)   # rewritten to long polynomial code on the CPU

KBLOCK_MIN_BYTES = 8 << 20   # the baseline's: cache-block a matmul whose `b` panel is larger (L2 + a share of L3)
KBLOCK_L2_MULTIPLE = 4   # a target's threshold: this many of its L2s (a panel that large streams from L3 well enough)
KBLOCK_LENGTH, KBLOCK_TILES = 256, 16   # the block of the reduce axis; output tiles per thread unit of work
PACKED_KBLOCK_LENGTHS = (512, 256)   # the block of the reduce axis for packed operands (kiln/schedule/pack.py)
MAX_NODES = 9000   # a heuristic action that grows the kernel graph past this many nodes is taken back (compile time)
MAX_TILE_ELEMENTS = 256   # outputs of one register tile (kernel.py's MAX_UNROLLED copies of the body)
TILE_ROWS = 8   # a matmul tile's rows (broadcast values per step); 16 where `_tall_tile_pays`

@dataclass(frozen=True)
class TilePlan:
  """The numbers the heuristics take from a target description (kiln/runtime/cpu_target.py): `lanes`, the float32
  lanes of one vector register; `wide`, a matmul tile's lanes along its vector axis; `kblock_min_bytes`, the `b`
  panel above which a matmul is cache blocked (`packed_kblock_min_bytes` where its operands are packed: one L2).
  Nothing here changes the order of a sum (results are the same bits
  on every target)."""
  lanes: int
  wide: int
  kblock_min_bytes: int
  packed_kblock_min_bytes: int = KBLOCK_MIN_BYTES
  rows: int = TILE_ROWS   # a matmul tile's rows: as many as the register file holds (16 only where `_tall_tile_pays`)
  conv_channels: int = 4   # a conv tile's output channels (`_conv_tile`): with its 2 image rows, half the registers
  cores: int = 2   # the threads a kernel's outermost loop is split across (`_column_units` keeps enough units)
  registers: int = 16   # vector registers (`_tall_gradient_tile`: whether 16 rows of accumulators fit)

# no target description (the PYTHON emulator, tests that pin choices): the 2-core AVX2 EPYC the constants here were
# measured on; its 16x8 tile is 8 rows of two 8-lane vectors, 16 accumulators: all of AVX2's 16 ymm registers
BASELINE_PLAN = TilePlan(lanes=8, wide=16, kblock_min_bytes=KBLOCK_MIN_BYTES)

def plan_for(target: CPUTarget | None) -> TilePlan:
  """The heuristics' numbers for `target`: the tile's vector axis two registers wide (16 floats on AVX2; 32 on
  AVX-512, whose 32 zmm registers hold its 8x2 accumulators with room for the loads), as long as its accumulators
  fit the register file and MAX_TILE_ELEMENTS; the cache-blocking threshold KBLOCK_L2_MULTIPLE L2s."""
  if target is None: return BASELINE_PLAN
  lanes = max(4, target.float_lanes)
  wide = 2 * lanes
  while wide > lanes and (wide * TILE_ROWS > MAX_TILE_ELEMENTS or wide // lanes * TILE_ROWS > target.vector_registers):
    wide //= 2
  # as many rows as leave registers for the step's `b` vectors and a broadcast value: AVX2's 16 ymm hold 4 rows of a
  # 16-wide tile (8 rows spill 5 accumulators every step), AVX-512's 32 zmm 8 rows of a 32-wide one
  rows = TILE_ROWS
  while rows > 4 and _registers_used(rows, wide, lanes) > target.vector_registers: rows //= 2
  # a conv tile's accumulators (channels x 2 rows, one vector each) and its 2 input vectors and broadcast weight fit
  # the register file: 4 channels on AVX2's 16 registers, 8 on AVX-512's 32
  channels = 16
  while channels > 4 and 2 * channels + 3 > target.vector_registers: channels //= 2
  return TilePlan(lanes=lanes, wide=wide, kblock_min_bytes=KBLOCK_L2_MULTIPLE * target.l2_bytes,
                  packed_kblock_min_bytes=target.l2_bytes, rows=rows, conv_channels=channels, cores=target.cores,
                  registers=target.vector_registers)

def _registers_used(rows: int, wide: int, lanes: int) -> int:
  """Vector registers a rows x wide tile's inner step holds: its accumulators, one row of `b`, a broadcast value."""
  return rows * (wide // lanes) + wide // lanes + 1

def _halvings(first: int, last: int = 4) -> tuple[int, ...]:
  """first, first/2, ... down to `last`: the amounts tried in order (32 -> (32, 16, 8, 4))."""
  amounts = [first]
  while amounts[-1] // 2 >= last: amounts.append(amounts[-1] // 2)
  return tuple(amounts)

def evaluate_index(expr: UOp, env: dict[UOp, int], nodes: list[UOp] | None = None) -> int | None:
  """The integer value of an index expression with loop ranges set by `env` (others 0); None if it reads memory.
  `nodes` is `toposort([expr])` when the caller has it (one walk for several evaluations)."""
  values: dict[UOp, object] = {}
  for u in nodes if nodes is not None else toposort([expr]):
    if u.op is Ops.CONST: values[u] = u.arg
    elif u.op is Ops.RANGE: values[u] = env.get(u, 0)
    elif u.op is Ops.DEFINE_VAR: values[u] = max(u.arg[1], 1)
    elif u.op in GroupOp.ALU or u.op is Ops.CAST:
      operands = [values[s] for s in u.src]
      if any(v is None for v in operands): return None
      values[u] = operands[0] if u.op is Ops.CAST else exec_alu(u.op, u.dtype, tuple(operands), u.src[-1].dtype)
    else: return None
  return values[expr]

def axis_stride(index: UOp, rng: UOp) -> int | None:
  """How far `index` moves per step of loop `rng` (probed at the start of the loops), None if not evenly."""
  # a constant offset does not move: the copies of an upcast tile (`base + c`) share one probe
  while index.op is Ops.ADD and index.src[1].op is Ops.CONST and not index.src[1].src: index = index.src[0]
  return _probed_stride(index, rng)

@functools.lru_cache(maxsize=4096)
def _probed_stride(index: UOp, rng: UOp) -> int | None:
  nodes = toposort([index])
  points = [evaluate_index(index, {rng: step}, nodes) for step in (0, 1, 2)]
  if any(p is None for p in points) or points[2] - points[1] != points[1] - points[0]: return None
  return points[1] - points[0]

def memory_accesses(sink: UOp) -> tuple[list[UOp], list[UOp]]:
  """The kernel's LOAD and STORE nodes."""
  nodes = graph_nodes(sink)
  return [u for u in nodes if u.op is Ops.LOAD], [u for u in nodes if u.op is Ops.STORE]

def _first_dividing(size: int | None, amounts: tuple[int, ...]) -> int | None:
  return next((k for k in amounts if size is not None and size % k == 0 and size >= k), None)

def _try(kernel: Kernel, opt: Opt) -> bool:
  """Apply `opt` unless it is refused or makes the graph too large (an UPCAST gives up while it copies the body, once
  the copies pass MAX_NODES); report whether it was applied."""
  # an upcast of a graph whose copies would pass the budget by far is refused before it builds them (the anchors'
  # GELU matmul built 7 copies, 31 ms of Python, before the budget stopped it)
  if opt.op is OptOps.UPCAST and isinstance(opt.arg, int) and len(graph_nodes(kernel.sink)) * opt.arg > 1.25 * MAX_NODES:
    return False
  try: kernel.apply(opt, max_nodes=MAX_NODES)
  except KernelOptError: return False
  return True

def heuristic_opts(kernel: Kernel, target: CPUTarget | None = None) -> list[Opt]:
  """Choose and apply actions for `kernel` (in place) on `target` (the device's renderer.target; None: the
  baseline plan); returns the actions applied."""
  plan = plan_for(target)
  loads, stores = memory_accesses(kernel.sink)
  out_axes, red_axes = kernel.output_axes, kernel.reduce_axes
  if not out_axes and not red_axes: return []
  load_strides = {rng: [axis_stride(ld.src[1], rng) for ld in loads] for rng in out_axes + red_axes}
  store_strides = {rng: [axis_stride(st.src[1], rng) for st in stores] for rng in out_axes}

  if not red_axes:   # elementwise: the contiguous inner output axis
    inner = out_axes[-1]
    if 1 in store_strides[inner] and (k := _index_period(kernel, inner) or
                                      _elementwise_upcast(kernel, Kernel.size(inner), plan)):
      # (a body too large for one register of lanes, copied: the node budget refuses it, 8 lanes then)
      if not _try(kernel, Opt(OptOps.UPCAST, len(out_axes) - 1, k)) and k > 8 and Kernel.size(inner) % 8 == 0:
        _try(kernel, Opt(OptOps.UPCAST, len(out_axes) - 1, 8))
      if all(s == 1 for s in load_strides[inner]): _block_row_reads(kernel, inner)
    else: _upcast_tiny_inner_axes(kernel)
    return kernel.applied

  if (dots := _byte_dot_tile(kernel, plan, loads, out_axes, load_strides, store_strides)) is not None: return dots
  if (matvec := _matrix_vector(kernel, loads, out_axes, load_strides)) is not None: return matvec
  if (lanes := _lane_reduction(kernel, loads, out_axes, red_axes, load_strides)) is not None: return lanes
  # register tiling: upcast output axes whose data some load reuses (stride 0 there, not everywhere); a 16x8 tile
  # where a wide axis is found (module docstring), else 8x8 (measured on matmul 512/1024: 3-4x faster than 4x4)
  reused = [i for i, rng in enumerate(out_axes)
            if 0 in load_strides[rng] and any(s not in (0, None) for s in load_strides[rng])]
  # the epilogue is copied once per tile element, software exp2/log2/sin included: once that made a 16x8 tile too
  # costly to compile, but the anchors' GELU matmul 256x256x1024 (one core) now measures 16x8 against 8x8: 0.55 MB of
  # C, 0.7 s of clang, 2.5 ms a run against 0.27 MB, 0.35 s, 3.2 ms (with explicit vector types 0.05 MB, 0.14 s,
  # 1.8 ms against 0.2 s, 3.5 ms), so every matmul gets the 16x8 tile
  tile = _wide_tile(loads, out_axes, red_axes, reused, load_strides, store_strides)
  if tile is not None and _conv_tile(kernel, plan, *tile, loads, load_strides, store_strides): pass
  elif tile is not None:
    wide, partner = tile
    # a padded partner goes first: its clamped lanes may store to one address twice, and the vectorizer only bundles
    # stores that it need not move past such a store (kiln/codegen/vectorize.py)
    pad_partner_first = partner is out_axes[0] and Kernel.size(partner) % 8 != 0
    if pad_partner_first: _upcast_padded(kernel, partner, (8, 4))
    # a matmul's wide axis is its vector axis (contiguous in the output): as wide as the target's plan; a conv's
    # (its output channels, reusing the input window) stays 16, its columns being the vectors
    vector_axis = 1 in store_strides[wide]
    transposed = not vector_axis and 1 in load_strides[wide]
    plain_product = transposed and len(red_axes) == 1 and (Kernel.size(partner) or 0) >= 16 \
      and not pad_partner_first and not any(len(ld.src) > 2 for ld in loads) \
      and not _windowed(loads, out_axes, load_strides)
    wide_amounts = _halvings(plan.wide) if vector_axis or plain_product else (16, 8, 4)
    if not _first_dividing(Kernel.size(wide), wide_amounts) and (k := _short_axis(Kernel.size(wide))):
      _try(kernel, Opt(OptOps.UPCAST, kernel.output_axes.index(wide), k))
    elif not (vector_axis and (k := _overlapping_vector(Kernel.size(wide), _vector_widths(plan)))
              and wide is not kernel.output_axes[0]
              and _try(kernel, Opt(OptOps.UPCAST, kernel.output_axes.index(wide), k))):
      _upcast_padded(kernel, wide, wide_amounts)
    # (a fully upcast axis is gone from the list)
    if not pad_partner_first and partner in kernel.output_axes:
      # 16 rows can exceed MAX_NODES where 8 do not (a GELU epilogue copied 256 times): 8 rows then. A software-math
      # epilogue stays 8 rows even where its graph fits: exp is one EXP2 node until software math expands it
      software_epilogue = any(u.op in SOFTWARE_MATH_OPS for u in graph_nodes(kernel.sink))
      tall = (Kernel.size(partner) or 1) % 16 == 0 and not software_epilogue \
        and _tall_tile_pays(loads, wide, partner, red_axes, load_strides) \
        and (plan.rows == TILE_ROWS or not vector_axis)   # 16 rows only where 8 fit the registers
      tall = tall or _vector_partner(partner, load_strides, store_strides) or \
        (transposed and _tall_gradient_tile(kernel, plan, partner))
      if not (tall and _try(kernel, Opt(OptOps.UPCAST, kernel.axes.index(partner), 16))):
        lanes = _padded_vector(partner, load_strides, store_strides)
        if lanes is None or not _pad_and_upcast(kernel, partner, lanes):
          _upcast_padded(kernel, partner, _halvings(plan.rows) if vector_axis else (8, 4))
    # a tile whose vectors follow a load's contiguous axis, stored apart (a 1x1 conv's input gradient: its weight's
    # input channels) walks two strided operands a step: blocked from one L2 (4x512x7x7 from 2048 channels, one
    # thread: 4.6 -> 2.2 ms)
    if _columns_outside(kernel, plan, wide, partner): pass
    elif sum(o.op is OptOps.UPCAST for o in kernel.applied) == 2:
      _cache_block(kernel, plan, plan.packed_kblock_min_bytes if transposed else None)
    if not any(o.op is OptOps.KBLOCK or o.op is OptOps.SWAP for o in kernel.applied):
      _block_for_l2(kernel, plan, wide, partner)
  else:
    tall = _transposed_tile_pays(loads, [out_axes[i] for i in reused[-2:]], red_axes, load_strides)
    for axis in reversed(reused[-2:]):   # the innermost two, at most
      size = Kernel.size(out_axes[axis])
      if tall and size % 16 == 0 and _try(kernel, Opt(OptOps.UPCAST, axis, 16)): continue
      if (k := _first_dividing(size, (8, 4))): _try(kernel, Opt(OptOps.UPCAST, axis, k))
  contiguous_reduce = any(1 in load_strides[rng] for rng in red_axes)
  if not reused and not contiguous_reduce:
    # column reduction: each step reads a contiguous run of outputs (32 floats: two cache lines) into accumulators
    for axis in reversed(range(len(out_axes))):
      if 1 in load_strides[out_axes[axis]] and (k := _first_dividing(Kernel.size(out_axes[axis]), (32, 16, 8, 4))):
        _try(kernel, Opt(OptOps.UPCAST, axis, k))
        break
  # unroll the innermost reduce axis of a kernel that has few accumulators (the axes list keeps its length unless
  # an axis was fully upcast, so the innermost reduce axis is the last one)
  red_axes = kernel.reduce_axes
  groups = _reduce_groups(kernel.sink)
  if len(groups) > 1: _unroll_row_reductions(kernel, groups)
  elif red_axes and kernel.unrolled <= 16 and (k := _first_dividing(Kernel.size(red_axes[-1]), (8, 4))):
    # a contiguous innermost axis of a kernel without an output tile gets separate accumulators (one vector), else
    # one accumulator per output sums k per step: under a tile of 8 outputs (the LLM's attention scores in prefill,
    # 8 query rows x head_dim 64) 8 lanes each ran at half the speed of unrolling. An upcast the sum does not depend
    # on (the elementwise loop of softmax's last kernel, exp(x - max) / sum) leaves it one accumulator: lanes there
    # (the anchors' transformer, 4x4x64 rows of 64, 2-core EPYC: 146-178 -> 70-72 us a launch)
    one_accumulator = kernel.unrolled == 1 or sum(u.op is Ops.REDUCE for u in graph_nodes(kernel.sink)) == 1
    lanes = one_accumulator and _contiguous_reduce(kernel, red_axes[-1])
    op = OptOps.LANES if lanes else OptOps.UNROLL
    # the same lanes on every target, not one register's worth: the lanes fix the order of the sum, and a sum must
    # give the same bits on every machine and on the PYTHON reference. 8 lanes, or LONG_SUM_LANES for a long sum:
    # one 8-lane accumulator adds 8 floats per add latency (4 cycles), below what memory delivers; 32 lanes are four
    # (AVX2) or two (AVX-512) independent vector accumulators (a 16M float sum, one thread: 3.8-4.2 -> 3.2 ms)
    if lanes and (Kernel.size(red_axes[-1]) or 0) >= LONG_SUM and Kernel.size(red_axes[-1]) % LONG_SUM_LANES == 0:
      k = LONG_SUM_LANES
    _try(kernel, Opt(op, len(kernel.axes) - 1, k))
  if len(groups) == 1: _unroll_tiny_reduce_axes(kernel)
  return kernel.applied

LONG_SUM, LONG_SUM_LANES = 4096, 32   # a one-accumulator sum over at least LONG_SUM terms gets 32 lanes

MAX_WHOLE_ROW_UPCAST = 64   # an elementwise row that 8 and 4 do not divide is upcast whole up to this length

COPY_BLOCK_ROWS = 32   # source rows a column-strip copy reads together (`_block_row_reads`)
COPY_MIN_ROW_BYTES = 4096   # source rows at least a page apart: each row a stream of its own

def _block_row_reads(kernel: Kernel, inner: UOp) -> None:
  """Block the rows of a copy that reads its source in column strips: every load contiguous along the (upcast)
  inner axis, an outer `cols` loop that moves the loads by exactly that run (the next strip of the same rows) and the
  innermost other loop `rows` moving them a page or more (a packed matmul operand, kiln/schedule/pack.py: `b` copied
  to (N/16, K, 16) reads 64 bytes of every row, row after row). Strip after strip, each read starts a new page that no
  prefetcher follows; SPLIT `rows` by COPY_BLOCK_ROWS and SWAP its blocks outside `cols` instead, so each block of
  rows is read strip by strip while its lines stream in (the figures: bench/RESULTS.md, thirteenth session)."""
  loads, _ = memory_accesses(kernel.sink)
  loops = [rng for rng in kernel.output_axes if rng.arg != inner.arg]   # (the inner axis is upcast: its lanes or rest)
  if len(loops) < 2 or (run := Kernel.size(inner)) is None or not loads: return
  def stride(rng: UOp) -> int | None:
    found = {axis_stride(ld.src[1], rng) for ld in loads}
    return found.pop() if len(found) == 1 else None
  rows, itemsize = loops[-1], loads[0].dtype.itemsize
  size, step = Kernel.size(rows), stride(rows)
  if size is None or step is None or size % COPY_BLOCK_ROWS or size < 2 * COPY_BLOCK_ROWS or \
     abs(step) * itemsize < COPY_MIN_ROW_BYTES: return
  cols = [rng for rng in loops[:-1] if stride(rng) == run and (Kernel.size(rng) or 1) > 1]
  if len(cols) != 1: return
  before = (kernel.sink, list(kernel.applied), kernel.unrolled)
  axes = kernel.output_axes
  if not (_try(kernel, Opt(OptOps.SPLIT, axes.index(rows), COPY_BLOCK_ROWS)) and
          _try(kernel, Opt(OptOps.SWAP, axes.index(cols[0]), axes.index(rows)))):
    kernel.sink, kernel.applied, kernel.unrolled = before

def _elementwise_upcast(kernel: Kernel, size: int | None, plan: TilePlan = BASELINE_PLAN) -> int | None:
  """How far to upcast an elementwise kernel's contiguous inner axis: 8 or 4, else the whole axis when it is short
  (or its largest divisor from 8 to MAX_WHOLE_ROW_UPCAST when long) and the body has no software math (a padded
  image row of 58: the pad copy in front of the anchors' conv2d ran 1.5 -> 0.75 ms on one core, with or without
  explicit vector types); None to leave it. A body of software math (a GELU's tanh: tens of vector operations per
  element, compute bound) gets one vector register of the plan's lanes where that is more than 8 (16 on AVX-512:
  bench/RESULTS.md, fourteenth session)."""
  software = any(u.op in SOFTWARE_MATH_OPS for u in graph_nodes(kernel.sink))
  if software and plan.lanes > 8 and (k := _first_dividing(size, (plan.lanes,))) is not None: return k
  if (k := _first_dividing(size, (8, 4))) is not None: return k
  if size is None or size <= 4 or software: return None
  if size <= MAX_WHOLE_ROW_UPCAST: return size
  # a long row that 8 and 4 do not divide (a max pool's padded input, 114 wide): its largest divisor that fits,
  # since scalar code branches on every select (a ReLU of mixed signs: 4.2 -> 0.34 ms for 64x114x114, one thread)
  return next((d for d in range(MAX_WHOLE_ROW_UPCAST, 7, -1) if size % d == 0), None)

MAX_INDEX_PERIOD = 64

def _index_period(kernel: Kernel, inner: UOp) -> int | None:
  """The largest constant from 16 to MAX_INDEX_PERIOD that divides the inner axis and that a load's index divides it
  by or takes it modulo (a Q4_1 dequantize: 32 weights a block, two nibbles a byte): upcast by it, the lanes'
  divisions and remainders fold to constants and their loads become vectors (an LLM prefill's 1536x576 dequantize
  1.10 -> 0.15 ms, one thread); None without one."""
  size = Kernel.size(inner)
  if size is None: return None
  nodes = graph_nodes(kernel.sink)
  if any(u.op in SOFTWARE_MATH_OPS for u in nodes): return None
  depends = _depending_on(nodes, inner)
  periods = [u.src[1].arg for u in nodes if u.op in (Ops.IDIV, Ops.MOD) and u.src[0] in depends and
             u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int)]
  return max((c for c in periods if 16 <= c <= MAX_INDEX_PERIOD and size % c == 0), default=None)

def _depending_on(nodes: list[UOp], rng: UOp) -> set[UOp]:
  """The nodes (of `nodes`, in graph order) whose value depends on `rng`."""
  found = {rng}
  for u in nodes:
    if any(s in found for s in u.src): found.add(u)
  return found

MAX_TINY_OUTPUT, MAX_TINY_OUTPUT_COPIES = 4, 16

def _upcast_tiny_inner_axes(kernel: Kernel) -> None:
  """Upcast an elementwise kernel's innermost output axes whole while each has at most MAX_TINY_OUTPUT elements and
  their copies stay within MAX_TINY_OUTPUT_COPIES: a weight rearranged by phase (512x512x2x2x2x2, a padded view)
  otherwise ran 4M iterations of loops of 2, each load gated; whole, the copies' indices and gates fold to constants
  (5.5 -> 2.2 ms, one thread)."""
  copies = 1
  while (axes := kernel.output_axes) and (size := Kernel.size(axes[-1])) is not None and 1 < size <= MAX_TINY_OUTPUT \
      and len(axes) > 1 and copies * size <= MAX_TINY_OUTPUT_COPIES:
    if not _try(kernel, Opt(OptOps.UPCAST, len(axes) - 1, size)): return
    copies *= size

MAX_TINY_REDUCE, MAX_TINY_COPIES = 4, 64

def _upcast_padded(kernel: Kernel, rng: UOp, amounts: tuple[int, ...]) -> None:
  """UPCAST `rng` by the first of `amounts` where that costs at most 1/8 more iterations (the axis padded, or its
  last tile overlapping: a 999x999 matmul ran at 4 GFLOP/s untiled, a 1000x1000 one at 52 with an 8x8 tile instead
  of 16x8), else by the first that divides it, else by the first at any padding PADTO accepts."""
  size = Kernel.size(rng)
  if size is None or size < 2: return
  k = amounts[0]
  if size % k and (-size) % k * 8 > size and (divides := _first_dividing(size, amounts[1:])): k = divides
  if size % k == 0 or rng is not kernel.output_axes[0]:
    # inner axes: an overlapping last tile keeps the lanes' loads contiguous. Where the node budget refuses k (a
    # GELU epilogue copied per tile element), the next smaller amount: 4 rows rather than none
    for amount in amounts[amounts.index(k):]:
      if (size % amount == 0 or amount == k) and _try(kernel, Opt(OptOps.UPCAST, kernel.axes.index(rng), amount)):
        return
    return
  # the outermost axis is split across threads, whose tiles must not overlap: pad it instead
  _pad_and_upcast(kernel, rng, k)

def _pad_and_upcast(kernel: Kernel, rng: UOp, k: int) -> bool:
  """PADTO `rng` to a multiple of k, then UPCAST it by k; neither is kept unless both apply."""
  before = (kernel.sink, list(kernel.applied), kernel.unrolled)
  if not _try(kernel, Opt(OptOps.PADTO, kernel.axes.index(rng), k)): return False
  padded = next(r for r in kernel.output_axes if r.arg == rng.arg)
  if _try(kernel, Opt(OptOps.UPCAST, kernel.axes.index(padded), k)): return True
  kernel.sink, kernel.applied, kernel.unrolled = before
  return False

def _unroll_tiny_reduce_axes(kernel: Kernel) -> None:
  """Unroll whole the innermost reduce axes of at most MAX_TINY_REDUCE iterations (a pooling window, the 4x4 overlap
  sum of a conv's input gradient), while the body is copied at most MAX_TINY_COPIES times: with constant lanes the
  index math (divisions and remainders of the window view) folds. Measured on the anchors conv's input-gradient
  sum (one core, CPU time): 398 -> 111 ms."""
  while (red_axes := kernel.reduce_axes) and (size := Kernel.size(red_axes[-1])) is not None \
        and size <= MAX_TINY_REDUCE and kernel.unrolled * size <= MAX_TINY_COPIES:
    if not _try(kernel, Opt(OptOps.UNROLL, len(kernel.axes) - 1, size)): return

def _lane_reduction(kernel: Kernel, loads: list[UOp], out_axes: list[UOp], red_axes: list[UOp],
                    load_strides: dict[UOp, list[int | None]]) -> list[Opt] | None:
  """A sum over several axes whose innermost one is contiguous in every load (a conv's weight gradient: the output
  gradient times the input, both walked along a row): 8 accumulator lanes along that axis (LANES), which the C
  compiler keeps in one vector register, times a small tile of outputs: the innermost reused axis of at most 4 (the
  kernel's width: its loads overlap) fully, and 8 (or 4, 2) of the outermost axis that reuses another load (output
  channels). None, and nothing applied, when the kernel is not of that shape (a matmul has one reduce axis and keeps
  its tile). Measured on the anchors' conv weight gradient (one core, CPU time): 2.7 -> 16 GFLOP/s with 4 channels;
  8 channels (24 vector accumulators, 11 loads per 24 products instead of 7 per 12) then took it 242-336 -> 131-173
  ms (2 threads, interleaved, a noisy machine); blocking the sum over images or rows (KBLOCK) on top changed nothing
  beyond the noise."""
  if len(red_axes) < 2 or len(loads) < 2 or len(_reduce_groups(kernel.sink)) != 1: return None
  inner = red_axes[-1]
  # (a load that moves along no reduce axis is not part of the sum: an epilogue's, like the momentum buffer an
  # optimizer step fused in reads; counted, it refused ResNet's 64x64x3x3 weight gradient, which ran 18x slower)
  summed = [i for i in range(len(loads)) if any(load_strides[r][i] != 0 for r in red_axes)]
  # (an inner axis of a few taps is a forward conv's kernel row, whose conv tile is 3x faster: ResNet's 7x7 stem)
  if len(summed) < 2 or any(load_strides[inner][i] != 1 for i in summed) or (Kernel.size(inner) or 0) < 8 or \
     (k := _first_dividing(Kernel.size(inner), (8, 4))) is None:
    return None
  def zero_loads(rng: UOp) -> set[int]: return {i for i, s in enumerate(load_strides[rng]) if s == 0}
  reused = [rng for rng in out_axes if zero_loads(rng) and Kernel.size(rng) is not None]
  smalls = [rng for rng in reused if Kernel.size(rng) <= 4]
  # of a kernel's two tap axes (rows and columns, adjacent), the rows: their loads are whole rows apart, not lanes
  # shifted by one (the stem's weight gradient by phase, 4x4 taps: 42 -> 15 ms; 3x3 taps the same either way)
  adjacent = len(smalls) >= 2 and kernel.axes.index(smalls[-1]) == kernel.axes.index(smalls[-2]) + 1
  small = smalls[-2] if adjacent else smalls[-1] if smalls else None
  wide = next((rng for rng in reused if small is None or zero_loads(rng) - zero_loads(small)), None)
  # the wide axis first: the order of the copies decides how clang groups the accumulators into vectors (measured:
  # the other order ran at a third of the speed)
  if wide is not None and (w := _first_dividing(Kernel.size(wide), (8, 4, 2))):
    _try(kernel, Opt(OptOps.UPCAST, kernel.axes.index(wide), w))
  if small is not None: _try(kernel, Opt(OptOps.UPCAST, kernel.axes.index(small), Kernel.size(small)))
  _try(kernel, Opt(OptOps.LANES, kernel.axes.index(inner), k))
  return kernel.applied

BYTE_DOT_TERMS = 32   # int32 products of bytes per output and step that make a kernel a byte-dot tile
BYTE_DOT_MAX_NODES = 40000   # a byte-dot tile's node budget: its 16 x rows outputs each sum 32 products a step

def _byte_dot_tile(kernel: Kernel, plan: TilePlan, loads: list[UOp], out_axes: list[UOp],
                   load_strides: dict[UOp, list[int | None]], store_strides: dict[UOp, list[int | None]]
                   ) -> list[Opt] | None:
  """A product of many rows by a matrix of bytes in integer dot products (kiln/apps/llm/quantized.py, the tiled
  layout: each output sums BYTE_DOT_TERMS explicit int32 products of an unsigned and a signed byte a step): the
  output axis along which the unsigned bytes lie 4 apart and the signed ones do not move (the weight's rows, stored
  contiguously) gets 16 lanes, vectors of DP4A (kiln/codegen/vectorize.py: 4 bytes of x broadcast against 16 rows'
  4 bytes), and the axis along which only the signed bytes move (x's rows) `plan.rows` of them, a register tile
  that loads each weight vector once for all its rows. One thread, SmolLM2's 160x576 @ 576x1536 (Sapphire Rapids,
  AVX-512 VNNI): bench/RESULTS.md. None, and nothing applied, for other kernels."""
  def widened(u: UOp, dtype) -> bool: return u.op is Ops.CAST and u.src[0].dtype is dtype
  products = sum(1 for u in graph_nodes(kernel.sink) if u.op is Ops.MUL and u.dtype is dtypes.int32 and
                 any(widened(a, dtypes.uint8) for a in u.src) and any(widened(a, dtypes.int8) for a in u.src))
  if products < BYTE_DOT_TERMS: return None
  unsigned = [i for i, ld in enumerate(loads) if ld.dtype is dtypes.uint8]
  signed = [i for i, ld in enumerate(loads) if ld.dtype is dtypes.int8]
  def strides(rng: UOp, which: list[int]) -> set[int | None]: return {load_strides[rng][i] for i in which}
  rows = next((rng for rng in out_axes if 1 in store_strides[rng] and strides(rng, unsigned) == {4}
               and strides(rng, signed) == {0}), None)
  xs = next((rng for rng in out_axes if strides(rng, unsigned) == {0} and 0 not in strides(rng, signed)), None)
  if rows is None or xs is None or (Kernel.size(rows) or 1) % 16: return None
  def apply(opt: Opt) -> bool:
    try: kernel.apply(opt, max_nodes=BYTE_DOT_MAX_NODES)
    except KernelOptError: return False
    return True
  if not apply(Opt(OptOps.UPCAST, kernel.axes.index(rows), 16)): return None
  for amount in _halvings(plan.rows, 2):
    if (Kernel.size(xs) or 1) % amount == 0 and apply(Opt(OptOps.UPCAST, kernel.axes.index(xs), amount)): break
  # the longer of the two loops outermost, split across threads (a 16-token prefill has 2 tiles of x's rows)
  loops = kernel.output_axes   # the two tile loops (the upcast lanes are copies now)
  if len(loops) == 2 and (Kernel.size(loops[1]) or 0) > (Kernel.size(loops[0]) or 0): apply(Opt(OptOps.SWAP, 0, 1))
  return kernel.applied

MATVEC_LANES = (16, 8)   # accumulator lanes on a matrix-vector product's contiguous reduce axis (one AVX-512 vector)

def _matrix_vector(kernel: Kernel, loads: list[UOp], out_axes: list[UOp],
                   load_strides: dict[UOp, list[int | None]]) -> list[Opt] | None:
  """A matrix-vector product (a decode step's `x @ W.T`, also with W dequantized in the kernel, e.g. Q4_1 rows split
  into (block, nibble, byte) axes): some load streams through memory, moving along every output axis (the matrix:
  each element is read once), another is reused along an output axis (the vector), and each summing reduction's
  innermost axis is contiguous in a streamed load. Register tiling the output rows would only share the vector's
  loads, which hit L1; instead each reduction's innermost axis gets 16 accumulator lanes (LANES: clang keeps them in
  one vector register and vectorizes the row's loads and the nibble unpacking), and threads split the output rows.
  None, and nothing applied, for other kernels.

  Measured on the 2-core EPYC (Zen 4, clang 14, one thread, SmolLM2's repacked Q4_1 matrices): 1536x576 0.5 -> 7.3
  GB/s (a hand-written C loop of the same shape: 6.8), 576x1536 7.8 GB/s; the Q8_0 49152x576 output head 12 GB/s.
  8 lanes ran 30% slower, 32 15% slower; unrolling the nibble axis as well (one byte load for both nibbles) changed
  nothing."""
  sized = [rng for rng in out_axes if (Kernel.size(rng) or 2) > 1]
  if not sized: return None
  def moves(i: int, rng: UOp) -> bool: return load_strides[rng][i] not in (0, None)
  streamed = {i for i in range(len(loads)) if all(moves(i, rng) for rng in sized)}
  reused = any(0 in load_strides[rng] for rng in sized)
  groups = _reduce_groups(kernel.sink)
  if not streamed or not reused or any(ops != {Ops.ADD} for ops in groups.values()): return None
  # bytes read 4 apart along the lanes are a byte dot product's operands (4 explicit products per lane: one DP4A)
  def lane_stride(i: int, stride: int | None) -> bool: return stride in (0, 1) or (stride == 4 and
                                                                                 loads[i].dtype.itemsize == 1)
  for key in groups:
    strides = load_strides.get(key[-1])
    if strides is None or not all(lane_stride(i, s) for i, s in enumerate(strides)) \
       or not any(strides[i] in (1, 4) for i in streamed) or _first_dividing(Kernel.size(key[-1]), MATVEC_LANES) is None:
      return None
  for key in groups:
    _try(kernel, Opt(OptOps.LANES, kernel.axes.index(key[-1]), _first_dividing(Kernel.size(key[-1]), MATVEC_LANES)))
  return kernel.applied

MAX_WHOLE_TILE_AXIS = 16

def _vector_widths(plan: TilePlan) -> tuple[int, ...]:
  """The widths of an overlapping vector tile on the plan's target: its matmul width down to 16."""
  return tuple(k for k in _halvings(plan.wide) if k >= 16) or (16,)

def _overlapping_vector(size: int | None, widths: tuple[int, ...] = (16,)) -> int | None:
  """The first of `widths` (16 lanes by default), the last tile overlapping the one before it, for a vector axis
  that 8 does not divide when that computes at most a quarter more (ResNet's 28 image columns: 16 + 16 rather than
  vectors of 4; the 196 positions of a 14x14 image: 7 x 32 on AVX-512, 13 x 16 on AVX2); else None."""
  if size is None or size % 8 == 0: return None
  return next((k for k in widths if size > k and (-size) % k * 4 <= size), None)

def _short_axis(size: int | None) -> int | None:
  """The size of a tile's wide axis that 16, 8 and 4 do not divide, when it is short enough to upcast whole (an MLP's
  10 classes: the logits 256x512 @ 512x10 ran 0.27 -> 0.09 ms on one core and its weight gradient 0.36 -> 0.09 ms,
  against a tile of rows alone with the reduce axis unrolled); else None."""
  return size if size is not None and 4 < size <= MAX_WHOLE_TILE_AXIS else None

def _cache_block(kernel: Kernel, plan: TilePlan, min_bytes: int | None = None) -> None:
  """SPLIT + KBLOCK for a register-tiled matmul whose `b` panel does not fit in cache (module docstring): larger than
  `min_bytes`, by default the plan's kblock_min_bytes."""
  out_axes, red_axes = kernel.output_axes, kernel.reduce_axes
  if len(red_axes) != 1 or not out_axes or any(Kernel.size(r) is None for r in out_axes + red_axes): return
  loads, _ = memory_accesses(kernel.sink)
  panel = _panel(kernel, loads, out_axes[0], red_axes[0])
  if panel is None: return
  if min_bytes is None: min_bytes = plan.packed_kblock_min_bytes if panel[1] else plan.kblock_min_bytes
  if panel[0] <= min_bytes: return
  # a packed panel (kiln/schedule/pack.py: one cache line per step of the sum) takes longer blocks
  lengths, size = PACKED_KBLOCK_LENGTHS if panel[1] else (KBLOCK_LENGTH,), Kernel.size(red_axes[0])
  if (length := next((n for n in lengths if size % n == 0 and size > n), None)) is None: return
  if panel[1] and _column_units(kernel, plan, panel[0], length): return
  before = (kernel.sink, list(kernel.applied), kernel.unrolled)
  outer = Kernel.size(out_axes[0])
  if outer > 2 * KBLOCK_TILES and outer % KBLOCK_TILES == 0: _try(kernel, Opt(OptOps.SPLIT, 0, KBLOCK_TILES))
  if not _kblock_tile(kernel, Opt(OptOps.KBLOCK, len(kernel.axes) - 1, length)):
    kernel.sink, kernel.applied, kernel.unrolled = before   # the split alone does not pay
  elif panel[1]:
    # packed: the tile columns outside the unit's tile rows, so one column panel of `b` (length x wide floats)
    # serves every row of tiles while it is in cache, and the unit's rows of `a` stay in L2 (rather than the whole
    # block of `b` streaming from L3 once per row of tiles)
    n = len(kernel.output_axes)
    _try(kernel, Opt(OptOps.SWAP, n - 2, n - 1))

COLUMN_BLOCK_L2_SHARE = 2   # a column unit's block of packed `b` fits in this share of one L2 (`_column_units`)
MIN_COLUMN_UNITS_PER_CORE = 2   # and there are at least this many units a thread (a short outer loop idles a thread)

def _column_units(kernel: Kernel, plan: TilePlan, panel_bytes: int, length: int) -> bool:
  """Cache blocking of a packed matmul (rows, columns; kiln/schedule/pack.py) by units of tile columns: SWAP the
  columns outside the rows, SPLIT them into units, KBLOCK the sum by `length` and run the unit's rows outside its
  columns. For each unit and block of the sum, the unit's block of `b` (its tiles x length x wide floats, at most
  1/COLUMN_BLOCK_L2_SHARE of one L2) stays in L2 while every row tile of `a` (8 rows x length, in L1) sweeps the
  unit's columns: `b` streams from L2 one cache line a step, `a` from L1, and only `a` comes from L3, once per unit.
  Units are as wide as that allows while there are MIN_COLUMN_UNITS_PER_CORE of them for each of the plan's cores
  (narrower units stream `a` more often; the figures: bench/RESULTS.md, thirteenth session). Whether it applied."""
  out_axes = kernel.output_axes
  if len(out_axes) != 2 or (size := Kernel.size(kernel.reduce_axes[0])) is None: return False
  tiles = Kernel.size(out_axes[1])
  if tiles is None or tiles < 2: return False
  block = panel_bytes // tiles * length // size   # bytes of `b` one column tile reads per block of the sum
  unit = 1
  while tiles % (2 * unit) == 0 and 2 * unit * block * COLUMN_BLOCK_L2_SHARE <= plan.packed_kblock_min_bytes and \
        tiles // (2 * unit) >= MIN_COLUMN_UNITS_PER_CORE * plan.cores:
    unit *= 2
  if unit < 2: return False
  before = (kernel.sink, list(kernel.applied), kernel.unrolled)
  if _try(kernel, Opt(OptOps.SWAP, 0, 1)) and _try(kernel, Opt(OptOps.SPLIT, 0, unit)) and \
     _kblock_tile(kernel, Opt(OptOps.KBLOCK, len(kernel.axes) - 1, length)) and _try(kernel, Opt(OptOps.SWAP, 2, 3)):
    return True
  kernel.sink, kernel.applied, kernel.unrolled = before
  return False

ROWS_IN_L2_SHARE = 2   # the rows of `a` that run inside the column panels must fit in this share of one L2

def _columns_outside(kernel: Kernel, plan: TilePlan, wide: UOp, partner: UOp) -> bool:
  """SWAP a register tile's columns (`wide`) outside its rows (`partner`) where few rows meet a `b` of more than half
  an L2: each column panel of `b` then serves every row from L1 while all of `a` stays in L2, instead of all of `b`
  streaming from L2 or memory once per row of tiles. One thread: a 1x1 conv over a large image (64x256 weights times
  256x3136) 1.34 -> 0.74 ms, its input gradient at batch 4 (128x256 weights, 1.6 MiB of `b` an image) 7.0 -> 5.0, a
  conv's weight gradient over small images (256x256x3x3 at 14x14 from 4 images) 8.5 -> 5.9 ms. Whether it applied."""
  outs, red = kernel.output_axes, kernel.reduce_axes
  cols = next((r for r in outs if r.arg == wide.arg), None)
  rows = next((r for r in outs if r.arg == partner.arg), None)
  if cols is None or rows is None or outs.index(rows) > outs.index(cols) or not red or \
     any(Kernel.size(r) is None for r in outs + red): return False
  loads, _ = memory_accesses(kernel.sink)
  b = _footprint(kernel, loads, (rows, cols), red, moving=cols)
  a = _footprint(kernel, loads, (rows, cols), red, fixed=cols)
  l2 = plan.packed_kblock_min_bytes
  # (a `b` between half an L2 and one: only where `a` is small, a few rows' worth: the MLP's 256x784 @ 784x512,
  # 800 KiB of `a`, ran 3.6 -> 4.4 ms a step on two threads with its columns outside)
  if not (a and b and (b > l2 and a * ROWS_IN_L2_SHARE <= l2 or 2 * b > l2 and a * 8 <= l2)):
    return False
  return _try(kernel, Opt(OptOps.SWAP, outs.index(rows), outs.index(cols)))

L2_BLOCK_LENGTHS = (128, 256, 64)   # reduce-axis blocks that keep a batched matmul's `a` and `b` blocks in L2

def _block_for_l2(kernel: Kernel, plan: TilePlan, wide: UOp, partner: UOp) -> bool:
  """KBLOCK the one reduce axis of a tiled matmul inside an outer (batch) loop when its `a` and `b` together outgrow
  one L2 but a block of the sum of each fits in half of one: a 1x1 conv's input gradient over small images
  (4x512x14x14 from 1024 channels: the 2 MiB weight read down its columns against 784 KiB of output gradient an
  image, one thread 12.1 -> 9.1 ms with its positions padded). Whether it applied."""
  outs, red = kernel.output_axes, kernel.reduce_axes
  if len(red) != 1 or (size := Kernel.size(red[0])) is None: return False
  cols = next((r for r in outs if r.arg == wide.arg), None)
  rows = next((r for r in outs if r.arg == partner.arg), None)
  if cols is None or rows is None or outs.index(rows) == 0 or outs.index(cols) == 0: return False   # no outer loop
  loads, _ = memory_accesses(kernel.sink)
  a = _footprint(kernel, loads, (rows, cols), red, fixed=cols)
  b = _footprint(kernel, loads, (rows, cols), red, moving=cols)
  if not a or not b or a + b <= plan.packed_kblock_min_bytes: return False
  length = next((n for n in L2_BLOCK_LENGTHS if size % n == 0 and size > n and
                 2 * (a + b) * n <= size * plan.packed_kblock_min_bytes), None)
  return length is not None and _kblock_tile(kernel, Opt(OptOps.KBLOCK, len(kernel.axes) - 1, length))

def _kblock_tile(kernel: Kernel, opt: Opt) -> bool:
  """Apply KBLOCK `opt`; where an overlapping last tile refuses it (its outputs would add a block's sum twice), the
  same actions again from the lowered kernel with each overlapping UPCAST's axis padded first (a 1x1 conv's input
  gradient over 49 positions: 10.1 ms unblocked, 4.2 ms padded and blocked, one thread). Whether it applied."""
  if _try(kernel, opt): return True
  if not kernel.overlapped: return False
  redo = Kernel(kernel.lowered)
  try:
    for done in kernel.applied + [opt]:
      if done.op is OptOps.UPCAST and (size := Kernel.size(redo.axes[done.axis])) is not None and size % done.arg:
        # (not the tile's vector axis, the first upcast: padded, its vectors' loads are gated, 2x slower unblocked)
        if not any(o.op is OptOps.UPCAST for o in redo.applied): return False
        redo.apply(Opt(OptOps.PADTO, done.axis, done.arg), max_nodes=MAX_NODES)
      redo.apply(done, max_nodes=MAX_NODES)
  except KernelOptError: return False
  kernel.sink, kernel.applied, kernel.unrolled, kernel.overlapped = redo.sink, redo.applied, redo.unrolled, redo.overlapped
  return True

def _footprint(kernel: Kernel, loads: list[UOp], tile: tuple[UOp, UOp], red: list[UOp], moving: UOp | None = None,
               fixed: UOp | None = None) -> int | None:
  """Bytes of the largest load of the sum (moving along a reduce axis) that moves along `moving`, or not along
  `fixed`, over the tile's two loops and the reduce axes, the others at 0 (matmul's `b` and `a`); None for none."""
  found = None
  for index, itemsize in _distinct_spans(loads):
    if all(axis_stride(index, r) in (0, None) for r in red): continue
    if moving is not None and axis_stride(index, moving) in (0, None): continue
    if fixed is not None and axis_stride(index, fixed) != 0: continue
    nodes = toposort([index])
    if any(Kernel.size(rng) is None for rng in (*tile, *red)): return None   # a symbolic loop: no plain footprint
    high = evaluate_index(index, {rng: Kernel.size(rng) - 1 for rng in (*tile, *red)}, nodes)
    low = evaluate_index(index, {}, nodes)
    if high is None or low is None: return None
    found = max(found or 0, (abs(high - low) + 1) * itemsize)
  return found

def _distinct_spans(loads: list[UOp]) -> list[tuple[UOp, int]]:
  """(index, itemsize) of `loads` with a constant added last taken off each index (an upcast tile's copies, `base +
  c`, span what `base` spans: the difference of two values of an index is the same without it), each pair once, in
  the loads' order: a register tile's 8 + 32 loads are two spans to evaluate."""
  seen: dict[tuple[UOp, int], None] = {}
  for ld in loads:
    index = ld.src[1]
    while index.op is Ops.ADD and index.src[1].op is Ops.CONST and not index.src[1].src: index = index.src[0]
    seen[(index, ld.dtype.itemsize)] = None
  return list(seen)

def _panel(kernel: Kernel, loads: list[UOp], outer: UOp, reduce_axis: UOp) -> tuple[int, bool] | None:
  """(bytes, packed) of the largest memory a row of tiles walks: a load that moves along the reduce axis and not
  along the outermost output axis (matmul's `b`), over every other axis; `packed` when each step of the sum reads one
  cache line of it (a tile-major copy). None without such a load."""
  found = None
  for index, itemsize in _distinct_spans(loads):
    if axis_stride(index, outer) != 0 or (step := axis_stride(index, reduce_axis)) in (0, None): continue
    nodes = toposort([index])
    high = evaluate_index(index, {rng: Kernel.size(rng) - 1 for rng in kernel.axes if rng is not outer}, nodes)
    low = evaluate_index(index, {}, nodes)
    if high is None or low is None: continue
    size = (abs(high - low) + 1) * itemsize
    if found is None or size > found[0]: found = (size, abs(step) * itemsize <= 64)
  return found

def _wide_tile(loads: list[UOp], out_axes: list[UOp], red_axes: list[UOp], reused: list[int],
               load_strides: dict[UOp, list[int | None]], store_strides: dict[UOp, list[int | None]]) -> tuple[UOp, UOp] | None:
  """The (wide, partner) axes of a 16x8 register tile, or None to keep the 8x8 tile of the innermost reused axes.

  The wide axis reuses a gated (padded) load, which is the costliest to repeat (conv's output channels reuse the
  input window); else it is the axis contiguous in the output and in a moving load (matmul's columns: a 16-wide
  vector row of `b` against 8 broadcast values of `a`). The partner is the innermost other reused axis that reuses a
  different load (a real 2D tile: each load is shared along one of the two axes)."""
  def zero_loads(rng: UOp) -> set[int]: return {i for i, s in enumerate(load_strides[rng]) if s == 0}
  # a sliding-window load (moves along an output axis and a reduce axis together: a conv's input, padded or not)
  # is as costly to repeat as a gated one: measured on an unpadded 16x64x58x58 conv, 16 on the channels and 8 on
  # the columns 86 GFLOP/s against 67 with 16 on the columns (one core)
  gated = {i for i, ld in enumerate(loads) if len(ld.src) > 2} | _windowed(loads, out_axes, load_strides)
  candidates = [out_axes[i] for i in reused]
  wide = next((rng for rng in reversed(candidates) if zero_loads(rng) & gated), None)
  if wide is None:
    wide = next((rng for rng in reversed(candidates) if 1 in store_strides[rng] and 1 in load_strides[rng]), None)
    if wide is None or (Kernel.size(wide) or 0) % 8:
      # the output's contiguous axis is short (a 1x1 conv's input gradient over 7 columns): the wide axis is one a
      # load is contiguous along instead (its weight's input channels), its lanes stored apart once per tile
      # (an operand of the sum: a bias added after it is contiguous along the output channels too)
      wide = next((rng for rng in reversed(candidates) if (Kernel.size(rng) or 0) % 16 == 0 and
                   any(s == 1 and any(load_strides[r][i] not in (0, None) for r in red_axes)
                       for i, s in enumerate(load_strides[rng]))), wide)
  if wide is None: return None
  # a partner that 8 or 4 divides (a conv weight gradient's 3-wide kernel axis reuses the same load as its channels)
  # (or one contiguous in the output and a load that is padded to one vector: a conv's 14 or 7 output columns)
  partner = next((rng for rng in reversed(candidates) if rng is not wide and zero_loads(rng) != zero_loads(wide)
                  and (_first_dividing(Kernel.size(rng), (8, 4)) or (Kernel.size(rng) or 0) >= 16
                       or _padded_vector(rng, load_strides, store_strides) is not None)), None)
  return None if partner is None else (wide, partner)

def _conv_tile(kernel: Kernel, plan: TilePlan, wide: UOp, partner: UOp, loads: list[UOp],
               load_strides: dict[UOp, list[int | None]], store_strides: dict[UOp, list[int | None]]) -> bool:
  """A convolution's 3-D register tile, applied if it fits: `plan.conv_channels` output channels (the wide axis,
  reusing the input window) x 2 output rows (an axis the window slides along, so the two rows' windows share input
  rows) x one vector of output columns (the partner, contiguous in the output and the input; its last tile may
  overlap). Each step then broadcasts `conv_channels` weights against 2 input vectors, rather than 16 weights against
  one: half the weight loads per product, and the tile's weights take half the L1. Measured on the anchors' conv
  (4x64x56x56 * 64x64x3x3 pad 1, Sapphire Rapids, one thread, CPU time): AVX-512 16 channels x 16 columns 73-78 ->
  107-112 GFLOP/s as 8 x 2 x 16; AVX2 code (-march=x86-64-v3) 42 -> 69 as 4 x 2 x 8 (8 x 2 x 8 spilled: 53)."""
  lanes, channels = plan.lanes, plan.conv_channels
  size, wide_size = Kernel.size(partner), Kernel.size(wide)
  if size is None or wide_size is None or wide_size % channels or 1 in store_strides[wide]: return False
  if 1 not in store_strides[partner] or 1 not in load_strides[partner] or size < 16: return False
  if (-size) % lanes * 4 > size: return False   # an overlapping last tile computes at most a quarter more
  windowed = _windowed(loads, [partner], load_strides) | _windowed(loads, [wide], load_strides)
  reduce_axes = [rng for rng in load_strides if rng not in kernel.output_axes]
  def slides(rng: UOp) -> bool:
    return any(load_strides[rng][i] not in (0, None) and any(load_strides[rng][i] == load_strides[r][i]
                                                             for r in reduce_axes) for i in range(len(loads)))
  rows = next((rng for rng in reversed(kernel.output_axes) if rng is not wide and rng is not partner
               and (Kernel.size(rng) or 1) % 2 == 0 and slides(rng)), None)
  if rows is None or not windowed: return False
  before = (kernel.sink, list(kernel.applied), kernel.unrolled)
  for rng, amount in ((wide, channels), (rows, 2), (partner, lanes)):
    if not _try(kernel, Opt(OptOps.UPCAST, kernel.axes.index(rng), amount)):
      kernel.sink, kernel.applied, kernel.unrolled = before
      return False
  return True

def _padded_vector(rng: UOp, load_strides: dict[UOp, list[int | None]],
                   store_strides: dict[UOp, list[int | None]]) -> int | None:
  """The vector width (8 or 16) an axis shorter than 16 is padded to, when it is contiguous in the output and in a
  load and 8 and 4 do not divide it (a ResNet conv's 14 and 7 output columns: as the partner of a 16-channel tile,
  one padded vector each, instead of a tile of scalars over the batch; 4x256x14x14 pad 1 8 -> 60 GFLOP/s); None
  otherwise."""
  size = Kernel.size(rng)
  if size is None or not 4 < size < 16 or _first_dividing(size, (8, 4)): return None
  if 1 not in store_strides[rng] or 1 not in load_strides[rng]: return None
  return 8 if size <= 8 else 16

L1_SET_PERIOD = 4096   # bytes after which addresses map to the same L1 set again (32 KiB, 8 ways: Zen 4, most x86)
MAX_ROWS_PER_SET = 8   # rows of a 16-row tile's load that may share one L1 set (its ways): 16 thrash it

def _rows_spread(load: UOp, stride: int | None) -> bool:
  """Whether 16 rows of `load`, `stride` elements apart, spread over enough L1 sets to stay in L1 together."""
  if stride is None: return False
  step = abs(stride) * load.dtype.itemsize
  sets = [row * step % L1_SET_PERIOD // 64 for row in range(16)]
  return max(sets.count(s) for s in sets) <= MAX_ROWS_PER_SET

def _tall_tile_pays(loads: list[UOp], wide: UOp, partner: UOp, red_axes: list[UOp],
                    load_strides: dict[UOp, list[int | None]]) -> bool:
  """Whether a matmul's tile gets 16 rows instead of 8 (16x16): when the `b` panel it walks misses L1 at every step
  of the reduce axis, because b's rows lie a multiple of L1_SET_PERIOD apart (all of the panel maps to one L1 set:
  N = 1024 float32 columns), and the 16 rows of `a` that the tile reads per step spread over several sets. Twice the
  rows share each missed line of b. Measured on the 2-core EPYC (one thread, CPU time, interleaved runs): 256x256 @
  256x1024 88-93 -> 108-110 GFLOP/s, 512x256 @ 256x1024 91 -> 107, 256x512 @ 512x1024 97-99 -> 104; where `a`'s rows
  alias instead (256x1024 @ 1024x256, 1024^3: a row stride of 4 KiB) 16 rows ran at half the speed (109 -> 48,
  92 -> 46), and where b's rows do not alias (256^3, 512^3) they were within noise. The anchors' FFN up with its GELU
  (50 -> 59 GFLOP/s as 16x16) stays 16x8: 16 rows exceed MAX_NODES (its Python codegen took 0.27 -> 0.53 s)."""
  if len(red_axes) != 1: return False
  reduce_axis = red_axes[0]
  panel = [i for i in range(len(loads)) if load_strides[partner][i] == 0 and load_strides[wide][i] == 1]
  rows = [i for i in range(len(loads)) if load_strides[wide][i] == 0 and load_strides[partner][i] not in (0, None)]
  if not panel or not rows: return False
  panel_steps = [load_strides[reduce_axis][i] for i in panel]
  if any(not step or abs(step) * loads[i].dtype.itemsize % L1_SET_PERIOD for i, step in zip(panel, panel_steps)):
    return False
  return all(_rows_spread(loads[i], load_strides[partner][i]) for i in rows)

def _tall_gradient_tile(kernel: Kernel, plan: TilePlan, partner: UOp) -> bool:
  """Whether the partner of a tile whose vectors follow a load's contiguous axis, stored apart, gets 16 rows instead
  of 8, in a sum over several axes (a conv's weight gradient: its input channels the vectors, its output channels
  the rows): each step then reads twice the rows against one vector of the large operand (the packed input window,
  several MiB, walked once per row tile), halving its traffic, where the 16 rows of one-vector accumulators, a vector
  and a broadcast value fit the registers; with the columns outside the rows (`_columns_outside`: small images)
  each step still feeds twice the products."""
  if len(kernel.reduce_axes) < 2 or (Kernel.size(partner) or 1) % 16: return False
  # the wide axis' upcast is the one applied last (its lanes: the tile's vectors)
  lanes = next((o.arg for o in reversed(kernel.applied) if o.op is OptOps.UPCAST), None)
  if not isinstance(lanes, int): return False
  return _registers_used(16, -(-lanes // plan.lanes) * plan.lanes, plan.lanes) <= plan.registers

def _vector_partner(partner: UOp, load_strides: dict[UOp, list[int | None]],
                    store_strides: dict[UOp, list[int | None]]) -> bool:
  """Whether a tile's partner axis gets 16 lanes instead of 8: when it is contiguous in the output and in a load (a
  conv's output columns under its 16 output channels), so its lanes are one 16-wide vector load and store, and
  each step's 16 broadcast weights feed twice the products. Also when 16 does not divide it, with an overlapping
  last tile (at most a quarter more columns computed). Measured on the 2-core EPYC (2 threads, best of 3), 3x3
  convs against the 16x8 (or, at 28 columns, 16x4) tile: 16x64x56x56 pad 1 28.3-30.6 -> 22.5-23.5 ms, 16x64x28x28
  13.3 -> 5.8, 4x32x112x112 8.7 -> 7.2-7.6, 8x64x40x40 10.5 -> 7.6-8.1, unpadded 16x64x58x58 31.4 -> 22.2-23.9."""
  size = Kernel.size(partner)
  return size is not None and size >= 16 and (-size) % 16 * 4 <= size and 1 in store_strides[partner] and \
    1 in load_strides[partner]

def _transposed_tile_pays(loads: list[UOp], axes: list[UOp], red_axes: list[UOp],
                          load_strides: dict[UOp, list[int | None]]) -> bool:
  """Whether the tile of `a @ b.T` (no axis is contiguous in both the output and a load: each load is read along
  its rows, one scalar per row and step) is 16x16 instead of 8x8: when every load that moves along the reduce axis
  moves by one element, both axes are multiples of 16 (a short one, an LLM prefill's few keys, keeps its 8-row tile
  and unrolled reduce axis) and the 16 rows each load gives the tile spread over L1 sets. Each step's 32 scalars then
  feed 256 products instead of 16 feeding 64. Measured on the 2-core EPYC (one thread, CPU time, interleaved runs):
  the anchors' attention scores q @ k.T (4x4 heads of 64x64, head_dim 64) 161 -> 124 us, 256x64 @ (256x64).T 31 ->
  49 GFLOP/s, 512^3 52 -> 69, 256^3 55 -> 64; 1024^3, whose rows lie 4 KiB apart (one L1 set), would run 52 -> 23."""
  if len(axes) != 2 or len(red_axes) != 1 or any((Kernel.size(rng) or 1) % 16 for rng in axes): return False
  along = load_strides[red_axes[0]]
  if any(s not in (0, 1) for s in along) or 1 not in along: return False
  for rng in axes:
    moving = [i for i, s in enumerate(load_strides[rng]) if s not in (0, None)]
    if not moving or not all(along[i] == 1 and _rows_spread(loads[i], load_strides[rng][i]) for i in moving):
      return False
  return True

def _windowed(loads: list[UOp], out_axes: list[UOp], load_strides: dict[UOp, list[int | None]]) -> set[int]:
  """The loads that move by the same step along an output axis and along a reduce axis (a convolution's window)."""
  reduce_axes = [rng for rng in load_strides if rng not in out_axes]
  return {i for i in range(len(loads)) if any(load_strides[o][i] not in (0, None) and load_strides[o][i] ==
                                              load_strides[r][i] for o in out_axes for r in reduce_axes)}

def _reduce_groups(sink: UOp) -> dict[tuple[UOp, ...], set[Ops]]:
  """The kernel's reduce groups (REDUCEs over one set of loop ranges, sorted by loop id) and their reduce ops."""
  groups: dict[tuple[UOp, ...], set[Ops]] = {}
  for u in graph_nodes(sink):
    if u.op is Ops.REDUCE: groups.setdefault(tuple(sorted(u.src[1:], key=lambda r: r.arg)), set()).add(u.arg)
  return groups

def _contiguous_reduce(kernel: Kernel, rng: UOp) -> bool:
  """Whether reduce axis `rng` walks every load that moves along it one element at a time (a row's elements), so
  that k accumulators of consecutive elements (LANES) are one vector register fed by vector loads."""
  loads, _ = memory_accesses(kernel.sink)
  strides = [axis_stride(ld.src[1], rng) for ld in loads]
  return 1 in strides and all(s in (0, 1) for s in strides)

def _unroll_row_reductions(kernel: Kernel, groups: dict[tuple[UOp, ...], set[Ops]]) -> None:
  """A fused row kernel (softmax, layernorm) runs several reductions over each row one after another. Each summing
  one whose innermost axis is contiguous gets 8 accumulator lanes (LANES: a vector accumulator, so clang vectorizes
  the row's loads and the exp of softmax's sum), then each max gets 8 lanes, or 4 while the copy budget lasts; a
  reduction over a strided axis is unrolled by 8 or 4 instead. Measured on 4096x4096 softmax (2-core EPYC, one
  thread): sum unrolled by 8 and the max rolled (before) 80 ms, sum with 8 lanes 47 ms, and the max with 4 lanes
  (or unrolled by 4) as well 29 ms."""
  summing = [key for key in groups if Ops.MAX not in groups[key]]
  maxing = [key for key in groups if Ops.MAX in groups[key]]
  for key in sorted(summing, key=lambda k: k[-1].arg, reverse=True) + maxing:
    innermost = key[-1]
    if innermost not in kernel.axes or (size := Kernel.size(innermost)) is None: continue
    contiguous = _contiguous_reduce(kernel, innermost)
    if Ops.MAX in groups[key] and not contiguous: continue   # a strided max stays rolled (measured slower unrolled)
    op = OptOps.LANES if contiguous else OptOps.UNROLL
    for k in (8, 4):
      if size % k == 0 and _try(kernel, Opt(op, kernel.axes.index(innermost), k)): break

# blocked accumulation (BLOCKSUM): no float accumulator adds more than about 2*SUM_BLOCK terms before its total moves
# to the next level out; kernels with more accumulators than MAX_BLOCKED_ACCUMULATORS (a matmul's register tile:
# blocked, its accumulators would double and spill) are left as they are
SUM_BLOCK = 256
MAX_BLOCKED_ACCUMULATORS = 32
MAX_SUM_LEVELS = 6   # BLOCKSUMs (and PADTOs before them) per kernel

def block_long_sums(kernel: Kernel) -> list[Opt]:
  """BLOCKSUM (in place) each float sum whose accumulators add more than 2*SUM_BLOCK terms, level after level: its
  error then grows like (levels * SUM_BLOCK) ulps instead of n/2 (a 10^7-term float32 sum: 1.2e-3 -> ~1e-6).
  Returns the actions applied."""
  applied = []
  for _ in range(MAX_SUM_LEVELS):
    found = _long_float_sum(kernel)
    if found is None: break
    opt = _block_opt(kernel, *found)
    if opt is None or not _try(kernel, opt): break
    applied.append(opt)
  return applied

def _long_float_sum(kernel: Kernel) -> tuple[tuple[UOp, ...], int] | None:
  """(the reduce group's loop ranges, innermost last; the terms each of its accumulators adds) of a float sum that
  adds more than 2*SUM_BLOCK terms per accumulator, or None."""
  groups: dict[tuple[UOp, ...], list[UOp]] = {}
  for u in graph_nodes(kernel.sink):
    if u.op is Ops.REDUCE: groups.setdefault(tuple(sorted(u.src[1:], key=lambda r: r.arg)), []).append(u)
  for key, reduces in groups.items():
    if not any(red.arg is Ops.ADD and dtypes.is_float(red.dtype) for red in reduces): continue
    if len(reduces) > MAX_BLOCKED_ACCUMULATORS: continue
    sizes = [Kernel.size(r) for r in key]
    if None in sizes: continue
    terms = prod(sizes)
    if terms > 2 * SUM_BLOCK: return key, terms
  return None

def _block_opt(kernel: Kernel, key: tuple[UOp, ...], terms: int) -> Opt | None:
  """The BLOCKSUM that splits group `key` where the loops inside the split add about SUM_BLOCK terms: on the
  outermost loop whose own trip count, times the loops inside it, passes 2*SUM_BLOCK (a PADTO of that loop first when
  no block length near the wanted one divides it)."""
  inside = 1
  for rng in reversed(key):
    size = Kernel.size(rng)
    if inside * size > 2 * SUM_BLOCK:
      want = max(2, SUM_BLOCK // inside)
      divisors = [d for d in range(max(2, want // 4), min(size - 1, 4 * want) + 1) if size % d == 0]
      # an axis of awkward length (a prime) is padded to a multiple of the block first: its extra iterations add 0
      if not divisors: return Opt(OptOps.PADTO, kernel.axes.index(rng), want)
      block = min(divisors, key=lambda d: abs(math.log(d / want)))
      return Opt(OptOps.BLOCKSUM, kernel.axes.index(rng), block)
    inside *= size
  return None
