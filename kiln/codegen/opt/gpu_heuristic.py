"""GPU heuristics: the GPU actions (LOCAL, GROUP/GROUPTOP, UPCAST; kiln/codegen/opt/kernel.py) a kernel gets without
BEAM, chosen for a GPU target, and `gpu_optimize`, the optimize stage for targets with threads and blocks.

The choices are the axis mapping's own defaults (kiln/codegen/gpudims.py), made explicit, so a kernel maps as it did
before they were actions:
- a row kernel (`gpudims.row_plan`) gets GROUP of its first reduce axis by the threads a row (`row_lanes` for many
  short rows, else `row_group_size`), and LOCAL of its last row axis by the rows a block where several rows share
  one; a full reduction of MIN_GRID_REDUCED elements or more a second GROUP by GRID_BLOCKS (the grid). A column
  kernel (loads along the rows, none along the reduction: `x.sum(0)`) gets a warp of neighbouring columns a block,
  fastest, each reduced by several lanes (`_column_opts`), where the mapping alone gives a block a column;
- any other kernel with thread-mapped output axes gets LOCALs that make `gpudims.block_size` threads a block, taken
  from the innermost mapped axes outward, and, for a large elementwise kernel (MIN_COARSE_BLOCKS blocks of work or
  more), an UPCAST by COARSEN: first, of the innermost axis (a thread's COARSEN adjacent elements, which the
  pipeline's vectorize stage reads and writes as one 16-byte access: kiln/codegen/wide_memory.py) where every global
  access along that axis can be one (`lanes_widen`), else last, of the axis the block's rest comes from (elements a
  block apart, so each of a warp's scalar accesses stays one run of memory);
- a matmul-shaped kernel whose factors the target's tensor cores take (half, bfloat16; float32 under ALLOW_TF32=1;
  `gpu_mma.mma_plan`, TC=1) gets the TC action on its first reduce axis (tensor-core tiles, kiln/codegen/gpu_mma.py);
  any other matmul-shaped kernel (kiln/codegen/gpu_tiles.py) gets none: the mapping tiles it itself (SIMT), and so
  does a kernel whose block size no LOCALs express exactly (the mapping's guarded last block).

>>> from kiln.uop.ops import UOp, Ops
>>> from kiln.dtype import dtypes
>>> r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 1 << 24),), 0)
>>> out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
>>> sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, r, UOp.const(dtypes.float32, 1.0))),))
>>> gpu_opts(Kernel(sink, GPUTarget()))
[Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 256)]
"""
from __future__ import annotations
from kiln.helpers import NOLOCALS, NOOPT, prod
from kiln.uop.ops import UOp, Ops
from kiln.uop.symbolic import is_multiple_of, linear_form
from kiln.runtime.gpu_target import GPUTarget   # (the description's type: a data class, no runtime code)
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError
from kiln.codegen.opt.heuristic import block_long_sums

def gpu_target(target: object = None) -> GPUTarget:
  """`target` where it describes a GPU (`has_local`: the CUDA device's, kiln/runtime/gpu_target.py), else the
  default GPUTarget (a renderer without a device: the H200's)."""
  return target if getattr(target, "has_local", False) else GPUTarget()   # type: ignore[return-value]

def _row_opts(kernel: Kernel, plan) -> list[Opt]:
  """A row kernel's actions: the grid's two GROUPs, a column kernel's (`_column_opts`), or the row's GROUP and the
  rows a block."""
  from kiln.codegen import gpudims
  axes = kernel.axes
  first_reduce = axes.index(plan.groups[0][0][0])
  grid = gpudims.default_grid(plan)
  if grid is not None: return [Opt(OptOps.GROUP, first_reduce, grid[0]), Opt(OptOps.GROUP, first_reduce, grid[1])]
  if (columns := _column_opts(kernel, plan, first_reduce)) is not None: return columns
  group, per_block = gpudims.default_row_split(plan)
  opts = [Opt(OptOps.GROUP, first_reduce, group)]
  if per_block > 1 and plan.rows: opts.append(Opt(OptOps.LOCAL, axes.index(plan.rows[-1]), per_block))
  return opts

COLUMN_ROWS = 32   # a column kernel's block: a warp of neighbouring columns (128 bytes of float32)...
COLUMN_LANE_ELEMENTS = 16   # ...and lanes down each column of about this many elements each

def _column_opts(kernel: Kernel, plan, first_reduce: int) -> list[Opt] | None:
  """A row kernel whose loads run along its last row axis and along none of its reduce axes (a column sum: `x.sum(0)`
  of a row-major x) reduces each of a warp's COLUMN_ROWS neighbouring columns with G lanes (a power of two, about
  COLUMN_LANE_ELEMENTS elements a lane, at most `local_max` threads a block): LOCAL of the columns before the GROUP,
  so a warp's loads are one run of memory. None for any other row kernel (its lanes read along the row)."""
  from kiln.codegen import gpudims
  nodes = kernel.sink.toposort()
  reduce_ranges = [r for ranges, _ in plan.groups for r in ranges]
  if not plan.rows or plan.elementwise is not None or any(gpudims._reads_along(nodes, r) for r in reduce_ranges):
    return None
  last = plan.rows[-1]
  if not gpudims._reads_along(nodes, last) or last.src[0].arg % COLUMN_ROWS: return None
  length = max(gpudims.prod(r.src[0].arg for r in ranges) for ranges, _ in plan.groups)
  local_max = getattr(kernel.target, "local_max", 1024)
  lanes = 1
  while lanes * 2 * COLUMN_ROWS <= local_max and lanes * 2 * COLUMN_LANE_ELEMENTS <= length: lanes *= 2
  if lanes < 2: return None
  return [Opt(OptOps.LOCAL, kernel.axes.index(last), COLUMN_ROWS), Opt(OptOps.GROUP, first_reduce, lanes)]

def lanes_widen(kernel: Kernel, inner: UOp, lanes: int) -> bool:
  """Whether splitting output range `inner` into `lanes` adjacent elements a thread lets every global access that
  moves along it become one wide access (kiln/codegen/wide_memory.py's rule, read on the lowered kernel): each index
  has coefficient 0 or 1 on `inner`; with 1 the access is of 32-bit elements, ungated, and the rest of its index is
  a proven multiple of `lanes`; every store has coefficient 1."""
  from kiln.codegen.wide_memory import WIDE_DTYPES
  for u in kernel.sink.toposort():
    if u.op not in (Ops.LOAD, Ops.STORE) or u.src[0].op is not Ops.DEFINE_GLOBAL: continue
    index = u.src[1]
    form = linear_form(index)
    if form is None: return False
    terms, _ = form
    coefficient = terms.get(inner, 0)
    if any(inner in t.toposort() for t in terms if t is not inner): return False
    if u.op is Ops.STORE and coefficient != 1: return False
    if coefficient == 0: continue
    dtype, gated = (u.dtype, len(u.src) > 2) if u.op is Ops.LOAD else (u.src[2].dtype, len(u.src) > 3)
    if coefficient != 1 or dtype not in WIDE_DTYPES or gated or not is_multiple_of(index - inner, lanes): return False
  return True

def _flat_opts(kernel: Kernel, mapped: list[UOp]) -> list[Opt]:
  """LOCALs giving `gpudims.block_size` threads a block from the innermost mapped axes outward, and the coarsening
  UPCAST of a large elementwise kernel (first, of adjacent elements, where they widen; else last, a block apart);
  none where they cannot make the mapping's default exactly (a guarded last block)."""
  from kiln.codegen import gpudims
  axes = kernel.axes
  total = prod(r.src[0].arg for r in mapped)
  local = gpudims.block_size(total)
  if total % local: return []
  elementwise = not any(u.op is Ops.REDUCE for u in kernel.sink.toposort())
  coarsen = gpudims.COARSEN
  coarse = elementwise and total % (local * coarsen) == 0 and total // (local * coarsen) >= gpudims.MIN_COARSE_BLOCKS
  inner = mapped[-1]
  adjacent = coarse and inner.src[0].arg % coarsen == 0 and lanes_widen(kernel, inner, coarsen)
  opts = [Opt(OptOps.UPCAST, axes.index(inner), coarsen)] if adjacent else []
  sizes = {r: r.src[0].arg // (coarsen if adjacent and r is inner else 1) for r in mapped}
  left, touched = local, set()
  for rng in reversed(mapped):
    if left == 1: break
    size = sizes[rng]
    take = size if left % size == 0 else left if size % left == 0 else 0
    if take == 0: return []
    opts.append(Opt(OptOps.LOCAL, axes.index(rng), take))
    left //= take
    if take == size: touched.add(rng)
  if coarse and not adjacent:
    # the copies are a block apart: the lowest digit of the grid's flat index, the rest of the innermost axis that
    # is not all threads
    rest = next((r for r in reversed(mapped) if r not in touched), None)
    taken = next((o.arg for o in opts if rest is not None and o.axis == axes.index(rest)), 1)
    if rest is None or (rest.src[0].arg // taken) % coarsen: return []
    opts.append(Opt(OptOps.UPCAST, axes.index(rest), coarsen))
  return opts

def gpu_opts(kernel: Kernel) -> list[Opt]:
  """Apply (in place) and return the GPU actions of the module docstring for `kernel` (a Kernel with a GPU target);
  where the kernel refuses one, none (the mapping's defaults, which they spell out, hold for all of them)."""
  from kiln.codegen.gpu_tiles import matmul_plan
  from kiln.codegen.gpu_mma import mma_plan
  from kiln.codegen.opt.kernel import _mapping_facts
  graph = kernel.sink
  mapped, plan = _mapping_facts(graph)
  if mma_plan(graph, kernel.target) is not None:   # tensor-core tiles (kiln/codegen/gpu_mma.py)
    wanted = [Opt(OptOps.TC, len(kernel.output_axes), 0)]
  elif not NOLOCALS and matmul_plan(graph) is not None: wanted = []   # shared-memory tiles (gpu_tiles.py)
  elif plan is not None: wanted = _row_opts(kernel, plan)
  elif mapped: wanted = _flat_opts(kernel, mapped)
  else: wanted = []
  saved = kernel.sink, list(kernel.applied), kernel.unrolled
  try:
    for opt in wanted: kernel.apply(opt)
  except KernelOptError:   # a part of the defaults' choice would map otherwise than all of it
    kernel.sink, kernel.applied, kernel.unrolled = saved
    return []
  return wanted

def gpu_heuristic_opts(kernel: Kernel) -> list[Opt]:
  """Everything a GPU kernel gets without BEAM, applied in place: long float sums blocked where no block's threads
  share them (a row kernel's are split over its threads instead) and no tensor-core tile sums them (its WMMAs sum
  each K step apart, so its sums are blocked already; a blocked k would break its 16-byte copies into ragged runs),
  then the GPU actions (`gpu_opts`)."""
  from kiln.codegen import gpudims
  from kiln.codegen.gpu_attention import attention_plan
  from kiln.codegen.gpu_mma import mma_plan
  if not NOLOCALS and attention_plan(kernel.sink) is not None: return []   # a flash kernel: its own loops
  blocked = gpudims.groupable(kernel.sink) or mma_plan(kernel.sink, kernel.target) is not None
  opts = [] if blocked else block_long_sums(kernel)
  return opts + gpu_opts(kernel)

def gpu_optimize(lowered: UOp, target: object = None, opts: list[Opt] | None = None) -> UOp:
  """The optimize stage for a GPU target (`target.has_local`, or None: the default GPUTarget): `opts` applied in
  order (BEAM's winner), else `gpu_heuristic_opts`; with NOOPT=1 only long float sums are blocked (no GPU action:
  the mapping's defaults). The kernel's GPU actions ride on its SINK to the axis-mapping stage
  (kiln/codegen/gpudims.py `map_axes_to_gpu`)."""
  kernel = Kernel(lowered, gpu_target(target))
  if opts is not None:
    for opt in opts: kernel.apply(opt)
  elif NOOPT: block_long_sums(kernel)   # accuracy is no optimization (as kiln/codegen/opt optimize_kernel)
  else: gpu_heuristic_opts(kernel)
  return kernel.sink
