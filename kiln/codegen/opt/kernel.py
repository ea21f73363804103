"""A lowered kernel's loop axes, and the actions (Opts) that reshape its loops.

Every action is a rewrite of the lowered graph itself, so every renderer (C, Python, LLVM IR) gets the optimized
kernel without knowing about the optimizer:
- UPCAST an output axis by k: its loop becomes `r_outer` and the graph is copied k times with `r = r_outer*k + c`
  (c = 0..k-1); each copy has its own STORE and its own REDUCEs, so k accumulators live side by side (register
  tiling). The copies share every node that does not depend on `r` (hash-consing), e.g. a matmul's loads of `a`.
  A k that does not divide the axis (but is smaller) shifts the last tile back to end at the axis' last element:
  `r = min(r_outer*k, size-k) + c`, overlapping the tile before it (refused for kernels that read what they write).
- UNROLL a reduce axis by k: the REDUCE sums k substituted copies of its value per iteration of `r_outer`.
- SWAP two axes of one kind: the loops are reordered (the linearizer opens loops in loop-id order).
- LANES a reduce axis by k: each REDUCE over it becomes k REDUCEs, lane c summing the axis' elements `r_outer*k + c`,
  combined after the loop (a balanced tree of the reduce op). The k accumulators of consecutive elements are what
  the C compiler turns into one vector accumulator: a reduction over a contiguous axis (a conv's weight gradient)
  vectorizes without a horizontal sum per iteration.
- SPLIT an output axis by k (loop tiling): its loop becomes an outer loop and an inner loop of k iterations opened
  right inside it (`r = r_outer*k + r_inner`); with KBLOCK it keeps a thread's share of the outputs (the outer
  loop, which threads split) apart from the tiles walked once per block.
- KBLOCK a summing reduce axis by k (cache blocking): the reduction runs over k-long blocks of the axis, and a new
  *block loop* over the blocks becomes an output loop, placed just inside the outermost output loop. Each STORE of
  `sum` becomes `STORE(out, i, block_sum + (out[i] if block > 0 else 0))`, so the output buffer is the accumulator
  across blocks. The working set of the loops inside the block loop shrinks to one
  block of the reduce axis (a matmul's B panel of k rows), which stays in cache while the output tiles are walked.
  Only for kernels whose every STORE writes a plain ADD REDUCE over the axis into a float32/float64/int buffer the
  kernel does not read (the sum is not rounded to a narrower type between blocks). The block loop's iterations
  update the same outputs: UPCAST refuses it, and the thread split (parallel.py) never takes it as its loop.
- BLOCKSUM a reduce axis by k (blocked accumulation): every REDUCE over the axis becomes a REDUCE over `r_outer` of
  a REDUCE over a new inner loop of k iterations (`r = r_outer*k + r_inner`), so each block is summed from zero in
  an accumulator of its own and only the block's total is added to the outer one. A float sum of n terms in one
  accumulator carries a rounding error of up to about n/2 ulps of the result; blocked, the two levels add about
  (k + n/k)/2 (docs/ir.md, "Blocked accumulation"). Exact for max and for ints; the inner REDUCE also takes the
  reduce loops inside the axis (higher loop ids), the outer one the loops outside it.
- PADTO an axis to a multiple of k, so that UPCAST/UNROLL/LANES by k (a register tile, vector lanes) fit any size:
  the loop runs ceil(size/k)*k iterations and the extra ones compute again the axis' last element,
  `r_padded` clamped to `size - 1` everywhere. On an output axis they store that element's value again, to its own
  address (the same bits: refused for kernels that read a buffer they write); on a reduce axis each REDUCE adds the
  reduce op's identity instead (`where(r_padded < size, body, identity)`). Clamped, every load stays in bounds, and
  the extra work is at most k-1 iterations.
GPU actions, for a Kernel made with a GPU target (`target.has_local`; kiln/codegen/opt/gpu_heuristic.py GPUTarget).
They do not rewrite the graph: each is validated against the kernel and recorded, in order, on the SINK's arg (a
GPUChoices), and the axis-mapping stage (kiln/codegen/gpudims.py `map_axes_to_gpu`) builds what they chose; a SINK
without them is mapped by gpudims' own defaults. They come after every graph-rewriting action (which a kernel with
GPU actions refuses), so the loop ids they name stay valid. Each splits the part of its axis that no earlier action
took (the axis' *rest*) as `rest = rest' * k + part`, the new part innermost (GROUPTOP: outermost):
- LOCAL an output axis by k: the part's k iterations are threads of one block (`lidx0`, the parts of later axes,
  and of one axis the finer ones, fastest); the rests left of the thread-mapped axes make the grid (`gidx0`). Only
  for axes the mapping may put on threads (`gpudims.mappable_ranges`: disjoint stores), k dividing the rest (or
  padding the axis by at most a quarter: the extra iterations store nothing), at most `target.local_max` threads a
  block. On a row kernel: k rows a block (a power of two), the rows the block's fastest
  threads where the LOCALs come before the GROUP (a column sum's warp reads neighbouring columns), else the row's
  lanes.
- UPCAST an output axis by k (on a GPU target): the part's k iterations are k copies of the body in each thread, a
  register tile; after a LOCAL of the same axis the copies are a block apart (every warp access stays coalesced),
  before it they are k adjacent elements (one 16-byte access per 4 floats where the renderer merges them).
- GROUP a reduce axis of a row kernel (`gpudims.row_plan`: reductions over whole rows) by k (a power of two): k
  threads share each row, thread `lane` reducing elements `j*k + lane` (GROUPTOP: `lane*n/k + j`, a contiguous
  chunk each) into a shared array combined in a tree of barrier-separated rounds. A second GROUP of a full reduction
  (no row) by b spreads it over b blocks, the last to finish combining the blocks' partials (a grid reduction).
- TC a reduce axis of a matmul-shaped kernel (arg 0: the scored tile; i > 0: kiln/codegen/gpu_mma.py TILES[i-1]):
  tensor-core tiles (gpu_mma.tile_mma) where `gpu_mma.mma_plan` fits the kernel and the target (half or bfloat16
  factors, float32 under ALLOW_TF32=1, TC=1); the kernel's only GPU action.
An action that does not fit the kernel raises KernelOptError and leaves the kernel as it was.
"""
from __future__ import annotations
import enum
from dataclasses import dataclass
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort, identity_element
from kiln.uop.pattern import graph_rewrite, settle
from kiln.uop.symbolic import symbolic, canonical_sum, linear_form, wrap_int, mark_canonical

class KernelOptError(ValueError):
  """An optimization action that does not apply to this kernel (wrong axis kind, size that does not divide, ...)."""

class OptOps(enum.Enum):
  """The kinds of action: UPCAST (output axis), UNROLL (reduce axis), SWAP (two axes of one kind), KBLOCK (a summing
  reduce axis: cache blocking), SPLIT (an output axis into two loops), LANES (a reduce axis into separate
  accumulators), PADTO (an axis to a multiple of `arg`), BLOCKSUM (a reduce axis into blocks summed separately)."""
  UPCAST = "upcast"; UNROLL = "unroll"; SWAP = "swap"; KBLOCK = "kblock"; SPLIT = "split"; LANES = "lanes"
  PADTO = "padto"; BLOCKSUM = "blocksum"
  # GPU actions (module docstring): block threads over an output axis, a row's reduction over a block's threads
  LOCAL = "local"; GROUP = "group"; GROUPTOP = "grouptop"
  # the tensor-core tiles of a matmul-shaped kernel (kiln/codegen/gpu_mma.py); arg 0: the scored tile, i > 0: TILES[i-1]
  TC = "tc"
  def __repr__(self) -> str: return f"OptOps.{self.name}"

GPU_ONLY_OPS = frozenset({OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.TC})

@dataclass(frozen=True)
class GPUChoices:
  """The GPU actions chosen for a kernel, recorded on its SINK's arg for the axis-mapping stage: (op, the loop id of
  the range it splits, amount), in the order they were applied."""
  actions: tuple[tuple[OptOps, int, int], ...]

  def of(self, *ops: OptOps) -> list[tuple[OptOps, int, int]]:
    """The actions of kinds `ops`, in order."""
    return [a for a in self.actions if a[0] in ops]

def gpu_choices(sink: UOp) -> GPUChoices | None:
  """The GPU actions recorded on a kernel's SINK, or None."""
  return sink.arg if isinstance(sink.arg, GPUChoices) else None

@dataclass(frozen=True)
class Opt:
  """One action: `op` on axis number `axis` of the kernel's current axes; `arg` is the split factor (UPCAST,
  UNROLL, LANES), the block or inner length (KBLOCK, SPLIT), the multiple (PADTO) or the other axis number (SWAP)."""
  op: OptOps
  axis: int
  arg: int
  def __repr__(self) -> str: return f"Opt({self.op!r}, {self.axis}, {self.arg})"

MAX_UNROLLED = 256   # the most copies of a kernel's body that UPCASTs and UNROLLs may make together
MAX_GPU_UPCAST = 32   # a GPU thread's register tile: at most this many copies of the body (255 registers a thread)
MAX_GRID_BLOCKS = 65535   # the blocks a grid reduction may spread over
DEFAULT_LOCAL_MAX = 1024   # threads a block where the target does not say (every CUDA GPU since Fermi)
# what `possible_opts` offers a GPU kernel (BEAM): threads a block over an output axis, threads a row, grid blocks
GPU_LOCAL_SIZES = (16, 32, 64, 128, 256, 512)
GPU_ROWS_A_BLOCK = (2, 4, 8, 16, 32)   # LOCAL after a GROUP: rows a block
GPU_GROUP_SIZES = (8, 16, 32, 64, 128, 256, 512)
GPU_GRID_BLOCKS = (512, 1024, 2048)

def prod_of(values) -> int:
  out = 1
  for v in values: out *= v
  return out
KBLOCK_SIZES = (64, 128, 256, 512)   # the block lengths `possible_opts` offers (BEAM) for KBLOCK
_KBLOCK_DTYPES = (dtypes.float32, dtypes.float64)   # float sums kept at full width in memory between blocks

def _sum_and_addend(value: UOp, rng: UOp) -> tuple[UOp | None, UOp | None]:
  """(the sum, None) for a plain sum over loop `rng`; (the sum, the addend) for a sum over it plus a value that does
  not depend on it; (None, None) otherwise."""
  def plain(u: UOp) -> bool: return u.op is Ops.REDUCE and u.arg is Ops.ADD and rng in u.src[1:]
  if plain(value): return value, None
  if value.op is Ops.ADD:
    for red, addend in (value.src, value.src[::-1]):
      if plain(red) and rng not in toposort([addend]): return red, addend
  return None, None

_recent_graphs: dict[UOp, list[UOp]] = {}   # the last few kernel graphs walked, and their nodes
_RECENT_GRAPHS = 4

def graph_nodes(sink: UOp) -> list[UOp]:
  """`toposort([sink])` of a kernel graph, remembered for the last few graphs: the optimizer and its heuristics ask
  about the same graph many times between two actions (callers must not change the list)."""
  if (nodes := _recent_graphs.get(sink)) is not None: return nodes
  if len(_recent_graphs) >= _RECENT_GRAPHS: del _recent_graphs[next(iter(_recent_graphs))]
  nodes = _recent_graphs[sink] = toposort([sink])
  return nodes

def with_sink_arg(sink: UOp, arg) -> UOp:
  """`sink` with its arg replaced, its remembered nodes (`graph_nodes`) moved over to the new SINK: the graph below
  it is the same (and the stages after the caller's ask about the new SINK only)."""
  new = sink.replace(arg=arg)
  if (nodes := _recent_graphs.pop(sink, None)) is not None and nodes and nodes[-1] is sink:
    _recent_graphs[new] = nodes[:-1] + [new]
  return new

def forget_graphs() -> None:
  """Drop the remembered kernel graphs (`graph_nodes`): called when codegen is done, so that the last kernels'
  graphs (thousands of nodes) are freed rather than kept for the garbage collector to scan again and again."""
  _recent_graphs.clear()
  _gpu_facts.clear()

_gpu_facts: dict[UOp, tuple] = {}   # a kernel graph (without GPU choices) -> (mappable ranges, row plan)

def _mapping_facts(sink: UOp) -> tuple:
  """(gpudims.mappable_ranges, gpudims.row_plan) of a kernel graph, remembered for the last few graphs (the GPU
  actions' checks and `possible_opts` ask for them many times)."""
  from kiln.codegen import gpudims
  if (facts := _gpu_facts.get(sink)) is not None: return facts
  if len(_gpu_facts) >= _RECENT_GRAPHS: del _gpu_facts[next(iter(_gpu_facts))]
  facts = _gpu_facts[sink] = (gpudims.mappable_ranges(sink), gpudims.row_plan(sink))
  return facts

def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with every node in `mapping` replaced by its value (values are not searched again)."""
  done: dict[UOp, UOp] = {}
  for node in toposort([root]):
    if node in mapping: done[node] = mapping[node]; continue
    new_src = tuple(done[s] for s in node.src)
    done[node] = node if new_src == node.src else node.replace(src=new_src)   # UOps compare by identity
  return done[root]

_LINEAR_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.NEG, Ops.MUL})

def _inside_sums(dependents: list[UOp]) -> set[UOp]:
  """The int ADD/SUB/NEG/MUL nodes among `dependents` used only by such nodes of their dtype: the inside of an index
  sum, which the symbolic rules rewrite as a whole from its top node (a canonical sum), not level by level."""
  linear = {u for u in dependents if u.op in _LINEAR_OPS and dtypes.is_int(u.dtype)}
  users_ok = {u: True for u in linear}
  used = set()
  for u in dependents:
    for s in u.src:
      if s in users_ok:
        used.add(s)
        if u not in linear or u.dtype != s.dtype: users_ok[s] = False
  return {u for u, ok in users_ok.items() if ok and u in used}

def substitute_copies(root: UOp, rng: UOp, values: list[UOp], simplified: bool = False,
                      max_nodes: int | None = None) -> list[UOp]:
  """`substitute(root, {rng: v})` for each v in `values`, walking the graph once: only the nodes that depend on
  `rng` are rebuilt per value (an upcast's copies share everything else). With `max_nodes`, copies that may come
  near it are counted as they are made, and KernelOptError raised as soon as the sources of those made so far hold
  more than `max_nodes - 1` nodes together: a SINK over all the copies' sources would exceed `max_nodes`, so the
  copies not yet made need not be built (a refused 8-row GELU tile).

  With `simplified` (`root` and `values` are fixed points of `symbolic`), each copy comes out simplified, as
  `graph_rewrite(copy, symbolic)` would make it, but built bottom-up: a node by its own rules once its sources are
  simplified (`settle`: one match for most nodes), an index sum flattened once from its top node, and in the copies
  after the first, a sum linear in `rng` only gets its constant changed (`_SumShifts`). Rewriting a 16x8 tile of
  copies afterwards matched every copy's nodes twice and rebuilt every sum level by level."""
  dependents: list[UOp] = []
  depends = {rng}
  for node in toposort([root]):
    if node is not rng and not depends.isdisjoint(node.src):
      depends.add(node)
      dependents.append(node)
  inside = _inside_sums(dependents) if simplified else set()
  # how each dependent is rebuilt: 0 as is (unsimplified, or inside a sum), 1 simplified by its own rules, 2 the top
  # of an index sum (made canonical in one step), 3 noted as simplified: of an op and dtype no symbolic rule takes (a
  # STORE, LOAD, REDUCE: half of a matmul tile's copies), what `settle` finds without matching
  rules_for = symbolic.rules_for
  plan = [(node, node.op, node.dtype, node.src, node.arg,
           0 if not simplified or node in inside else
           2 if node.op in _LINEAR_OPS and dtypes.is_int(node.dtype) else
           1 if rules_for(node.op, node.dtype) else 3) for node in dependents]
  known = symbolic.memo_keys[False]
  shifts = _SumShifts(rng, values, depends) if simplified else None
  copies = []
  counted: set[UOp] = set()   # the nodes under the copies' sources so far (with max_nodes)
  # counting walks the copies: skipped where they are far from the budget (the caller checks the graph it gets)
  count = max_nodes is not None and 2 * len(values) * len(dependents) >= max_nodes
  for lane, value in enumerate(values):
    done = {rng: value}
    get = done.get
    shifted = shifts.first if shifts is not None and lane else {}
    for node, op, dtype, src, arg, how in plan:
      if shifted and node in shifted and (moved := shifts.shifted(node, lane, done)) is not None:
        done[node] = moved
        continue
      rebuilt = UOp(op, dtype, tuple(map(get, src, src)), arg)   # done.get(s, s) for each source, in C
      if how == 0: done[node] = rebuilt
      elif how == 1: done[node] = settle(rebuilt, symbolic)
      elif how == 3:   # (settle's memory, inline)
        if (memory := rebuilt._rewrites) is None: rebuilt._rewrites = {known: None}
        else: memory.setdefault(known, None)
        done[node] = rebuilt
      else:
        flat = canonical_sum(rebuilt)
        done[node] = graph_rewrite(rebuilt, symbolic) if flat is None else settle(flat, symbolic)
        if lane == 0 and shifts is not None and done[node] is flat: shifts.remember(node, flat, done)
    copies.append(done.get(root, root))
    if count and _count_nodes(copies[-1].src, counted) >= max_nodes:
      raise KernelOptError(f"the copies would make a graph of more than {max_nodes} nodes")
  return copies

def substitute_simplified(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`graph_rewrite(substitute(root, mapping), symbolic)` for a `root` and values that are fixed points of
  `symbolic`, built bottom-up as `substitute_copies` builds a copy: each node that depends on a replaced one is
  simplified by its own rules once its sources are, an index sum flattened once from its top node. A SWAP renames
  two loops of a whole tiled kernel: rewriting the renamed graph afterwards matched every node of it again."""
  dependents: list[UOp] = []
  depends = set(mapping)
  for node in toposort([root]):
    if node not in mapping and not depends.isdisjoint(node.src):
      depends.add(node)
      dependents.append(node)
  inside = _inside_sums(dependents)
  done = dict(mapping)
  get = done.get
  for node in dependents:
    rebuilt = UOp(node.op, node.dtype, tuple(map(get, node.src, node.src)), node.arg)
    if node in inside: done[node] = rebuilt
    elif node.op in _LINEAR_OPS and dtypes.is_int(node.dtype):
      flat = canonical_sum(rebuilt)
      done[node] = graph_rewrite(rebuilt, symbolic) if flat is None else settle(flat, symbolic)
    else: done[node] = settle(rebuilt, symbolic)
  return done.get(root, root)

def _count_nodes(roots: tuple[UOp, ...], counted: set[UOp]) -> int:
  """Add the nodes under `roots` (themselves included) to `counted`; its new size."""
  stack = list(roots)
  while stack:
    node = stack.pop()
    if node not in counted:
      counted.add(node)
      stack.extend(node.src)
  return len(counted)

class _SumShifts:
  """The copies of an index sum whose other lanes differ from the first by a constant: the sum is `rng*a + rest`, the
  lane values are `base + c`, and each term of `rest` that depends on `rng` (a clamp of a padded axis, a quotient)
  is a constant in both lanes (`t_c`, folded by its own rules before the sum is copied). The first copy's canonical
  sum `P + k` then gives the other ones as `P + (k + a*(c - c0) + sum of b*(t_c - t_0))`, the node the symbolic
  rules would make, without flattening and rebuilding the sum."""
  def __init__(self, rng: UOp, values: list[UOp], depends: set[UOp]):
    self.rng, self.depends = rng, depends
    forms = [linear_form(v) for v in values]
    # the lanes' constants, when the lanes share their other terms (else no sum is shifted)
    self.offsets = [f[1] for f in forms] if all(f is not None and f[0] == forms[0][0] for f in forms) else None
    # sum -> (coefficient of rng, P, k of the first copy, (term, coefficient, its constant in the first copy) for
    # each term that depends on rng)
    self.first: dict[UOp, tuple[int, UOp, int, tuple[tuple[UOp, int, int], ...]]] = {}

  def remember(self, node: UOp, flat: UOp, done: dict[UOp, UOp]) -> None:
    """Note the first copy `flat` (a fixed point) of sum `node`, if the others can be shifted from it (`done`: the
    first copy's nodes)."""
    if self.offsets is None or flat.op is not Ops.ADD: return
    form = linear_form(node)
    if form is None: return
    inner = []
    for term, coef in form[0].items():
      if term is self.rng or term not in self.depends: continue
      if (value := done[term]).op is not Ops.CONST or value.src: return   # not a constant: each copy its own sum
      inner.append((term, coef, value.arg))
    tail = flat.src[1]
    if tail.op is Ops.CONST and not tail.src: partial, const = flat.src[0], tail.arg
    else: partial, const = flat, 0
    self.first[node] = (form[0].get(self.rng, 0), partial, const, tuple(inner))

  def shifted(self, node: UOp, lane: int, done: dict[UOp, UOp]) -> UOp | None:
    """Copy number `lane` of sum `node` (`done`: that lane's copies of its terms), or None when it is not shifted
    from the first copy (a term that depends on rng is no constant in this lane)."""
    if (first := self.first.get(node)) is None: return None
    coef, partial, const, inner = first
    const += coef * (self.offsets[lane] - self.offsets[0])
    for term, term_coef, first_value in inner:
      if (value := done[term]).op is not Ops.CONST or value.src: return None
      const += term_coef * (value.arg - first_value)
    const = wrap_int(node.dtype, const)
    return partial if const == 0 else mark_canonical(partial.alu(Ops.ADD, UOp.const(node.dtype, const)))

def _balanced(op: Ops, values: list[UOp]) -> UOp:
  """op(v0, v1, ...) as a balanced tree, so the partial results do not wait on each other."""
  while len(values) > 1:
    pairs = [UOp(op, values[i].dtype, (values[i], values[i + 1])) for i in range(0, len(values) - 1, 2)]
    values = pairs + ([values[-1]] if len(values) % 2 else [])
  return values[0]

def _renumbered(order: list[UOp | None]) -> dict[UOp, UOp]:
  """Each loop range in `order` -> itself with its position as loop id (the linearizer opens loops in id order); a
  None holds a position for a new loop."""
  return {r: r.replace(arg=i) for i, r in enumerate(order) if r is not None}

class Kernel:
  """A lowered kernel (`SINK(STORE...)` over RANGEs and REDUCEs) and the actions applied to it so far.

  `axes` lists its loops: output axes in loop order, then reduce axes in loop order. An Opt names an axis by its
  position in this list, as it is when the Opt is applied (splits keep positions; a split that leaves a loop of one
  iteration removes the axis).
  """
  def __init__(self, sink: UOp, target: object = None):
    if sink.op is not Ops.SINK: raise KernelOptError(f"Kernel: expected a lowered SINK, got {sink.op.name}")
    self.sink = self.lowered = sink   # (`lowered`: the graph before any action)
    # the target the actions are for: a GPU one (`has_local`) takes the GPU actions (module docstring)
    self.target = target
    self.gpu = bool(getattr(target, "has_local", False))
    self.applied: list[Opt] = []
    self.unrolled = 1   # copies of the body made so far
    self.overlapped = False   # an UPCAST's last tile overlaps the one before it (its lanes store twice)
    self._loops_of: tuple[UOp, tuple[list[UOp], list[UOp]]] | None = None   # (graph, its axes), see _loops

  # ---- axes ----
  def _loops(self) -> tuple[list[UOp], list[UOp]]:
    """(output axes, reduce axes) of the current graph, found once per graph (the heuristics ask many times)."""
    if self._loops_of is not None and self._loops_of[0] is self.sink: return self._loops_of[1]
    nodes = graph_nodes(self.sink)
    reduced = {r: None for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]}
    outputs = sorted((u for u in nodes if u.op is Ops.RANGE and u not in reduced), key=lambda r: r.arg)
    self._loops_of = (self.sink, (outputs, sorted(reduced, key=lambda r: r.arg)))
    return self._loops_of[1]

  @property
  def reduce_axes(self) -> list[UOp]:
    """The loop ranges that REDUCEs reduce over, in loop order."""
    return list(self._loops()[1])

  @property
  def output_axes(self) -> list[UOp]:
    """The loop ranges of the output, in loop order."""
    return list(self._loops()[0])

  @property
  def axes(self) -> list[UOp]:
    """Output axes, then reduce axes."""
    return self.output_axes + self.reduce_axes

  def is_reduce(self, axis: int) -> bool:
    """Whether axis number `axis` is a reduce axis."""
    return axis >= len(self.output_axes)

  def is_block_loop(self, rng: UOp) -> bool:
    """Whether output loop `rng` is a KBLOCK block loop: no store's index depends on it, so its iterations update
    the same outputs one after another."""
    return not self.is_reduce(self.axes.index(rng)) and rng not in toposort([st.src[1] for st in self.sink.src])

  @staticmethod
  def size(rng: UOp) -> int | None:
    """The trip count of a loop range, or None when it is symbolic."""
    return rng.src[0].arg if rng.src[0].op is Ops.CONST else None

  # ---- actions ----
  def apply(self, opt: Opt, max_nodes: int | None = None) -> Kernel:
    """Apply `opt` in place (returns self), or raise KernelOptError and change nothing; also when the kernel graph
    would then have more than `max_nodes` nodes (an UPCAST gives up while it copies the kernel, once its copies are
    that large)."""
    axes = self.axes
    if not isinstance(opt, Opt): raise KernelOptError(f"Kernel.apply: expected an Opt, got {opt!r}")
    if not 0 <= opt.axis < len(axes):
      raise KernelOptError(f"{opt}: the kernel has {len(axes)} axes (sizes {[self.size(r) for r in axes]})")
    rng = axes[opt.axis]
    if opt.op in GPU_ONLY_OPS or (self.gpu and opt.op is OptOps.UPCAST):
      self.sink = self._gpu_action(opt, axes)
      self.applied.append(opt)
      if opt.op is OptOps.UPCAST: self.unrolled *= opt.arg
      return self
    if self.gpu_actions:
      raise KernelOptError(f"{opt}: the kernel has GPU actions already ({self.gpu_actions}); actions that rewrite "
                           f"its loops come before them")
    if opt.op is OptOps.SWAP: new_sink = self._swap(opt, axes)
    elif opt.op is OptOps.KBLOCK: new_sink = self._kblock(opt, axes)
    elif opt.op is OptOps.SPLIT: new_sink = self._split_loop(opt, axes)
    elif opt.op is OptOps.PADTO: new_sink = self._padto(opt, axes)
    elif opt.op is OptOps.BLOCKSUM: new_sink = self._blocksum(opt, axes)
    elif opt.op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LANES):
      if opt.op is OptOps.UPCAST and self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is a reduce axis; UPCAST splits output axes (use UNROLL)")
      if opt.op in (OptOps.UNROLL, OptOps.LANES) and not self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is an output axis; {opt.op.name} splits reduce axes "
                             f"(use UPCAST)")
      size, amount = self.size(rng), opt.arg
      if size is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
      if opt.op is OptOps.UPCAST and self.is_block_loop(rng):
        raise KernelOptError(f"{opt}: axis {opt.axis} is a block loop (its iterations update the same outputs)")
      overlapping = opt.op is OptOps.UPCAST and isinstance(amount, int) and size > amount >= 2 and size % amount != 0
      if overlapping and self._reads_own_output():
        raise KernelOptError(f"{opt}: {amount} does not divide the axis size {size}, and the kernel reads a buffer "
                             f"it writes (an overlapping last tile would see its own results)")
      if not overlapping and (not isinstance(amount, int) or amount < 2 or size % amount != 0):
        raise KernelOptError(f"{opt}: the amount must be an integer >= 2 that divides the axis size {size}"
                             + (" (or, for UPCAST, is smaller than it)" if opt.op is OptOps.UPCAST else ""))
      if self.unrolled * amount > MAX_UNROLLED:
        raise KernelOptError(f"{opt}: the kernel body would be copied {self.unrolled * amount} times "
                             f"(at most {MAX_UNROLLED})")
      new_sink = self._upcast(rng, amount, max_nodes) if opt.op is OptOps.UPCAST else \
        self._unroll(rng, amount, separate=opt.op is OptOps.LANES)
    else: raise KernelOptError(f"Kernel.apply: unknown action {opt.op!r}")
    new_sink = graph_rewrite(new_sink, symbolic, name="opt")
    if max_nodes is not None and len(graph_nodes(new_sink)) > max_nodes:
      raise KernelOptError(f"{opt}: the kernel graph would have {len(graph_nodes(new_sink))} nodes (at most "
                           f"{max_nodes})")
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LANES): self.unrolled *= opt.arg
    if opt.op is OptOps.UPCAST and self.size(rng) % opt.arg: self.overlapped = True
    self.sink = new_sink
    self.applied.append(opt)
    return self

  # ---- GPU actions ----
  @property
  def gpu_actions(self) -> tuple[tuple[OptOps, int, int], ...]:
    """The GPU actions recorded so far, as (op, loop id, amount)."""
    choices = gpu_choices(self.sink)
    return choices.actions if choices is not None else ()

  def _gpu_action(self, opt: Opt, axes: list[UOp]) -> UOp:
    """The kernel with GPU action `opt` recorded on its SINK (module docstring), after checking that the mapping
    stage can build it; KernelOptError otherwise."""
    if not self.gpu:
      raise KernelOptError(f"{opt}: {opt.op.name} needs a GPU target (threads, blocks and shared memory)")
    rng, size, k = axes[opt.axis], self.size(axes[opt.axis]), opt.arg
    if opt.op is OptOps.TC or any(a[0] is OptOps.TC for a in self.gpu_actions): return self._tensor_cores(opt, rng)
    if size is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
      raise KernelOptError(f"{opt}: the amount must be an integer >= 2")
    actions = self.gpu_actions
    graph = self.sink.replace(arg=None)
    mapped, plan = _mapping_facts(graph)
    local_max = getattr(self.target, "local_max", DEFAULT_LOCAL_MAX)
    by_id = {r.arg: r for r in axes}
    grouped = [a for a in actions if a[0] in (OptOps.GROUP, OptOps.GROUPTOP)]
    splits = [a for a in actions if a[0] in (OptOps.LOCAL, OptOps.UPCAST)]
    locals_k = prod_of(a[2] for a in actions if a[0] is OptOps.LOCAL)
    power_of_two = k & (k - 1) == 0
    if opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      if not self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is an output axis; {opt.op.name} splits a reduce axis")
      if plan is None:
        raise KernelOptError(f"{opt}: not a row kernel (reductions over whole rows, at most one elementwise pass "
                             f"over the row: kiln/codegen/gpudims.py row_plan); its reductions stay in each thread")
      group = next((ranges for ranges, _ in plan.groups if rng in ranges), None)
      if group is None: raise KernelOptError(f"{opt}: no reduction of the row kernel is over axis {opt.axis}")
      if any(a[0] is OptOps.UPCAST for a in splits) or any(by_id.get(a[1]) not in plan.rows for a in splits):
        raise KernelOptError(f"{opt}: before a GROUP only LOCALs of row axes may come (rows a block), not {splits}")
      if splits and (locals_k & (locals_k - 1) or k * locals_k > local_max):
        raise KernelOptError(f"{opt}: rows a block must be a power of two, with at most {local_max} threads")
      if not power_of_two: raise KernelOptError(f"{opt}: the threads that share a row must be a power of two")
      length = max([prod_of(self.size(r) for r in ranges) for ranges, _ in plan.groups] +
                   ([self.size(plan.elementwise)] if plan.elementwise is not None else []))
      if not grouped:
        if k > local_max: raise KernelOptError(f"{opt}: more than {local_max} threads a block")
        if k > length: raise KernelOptError(f"{opt}: {k} threads for a reduction of {length} elements")
      elif len(grouped) == 1:   # the grid: b blocks share a full reduction
        threads = grouped[0][2]
        if opt.op is OptOps.GROUPTOP or grouped[0][0] is OptOps.GROUPTOP:
          raise KernelOptError(f"{opt}: a grid reduction's blocks and threads split its axis with GROUP")
        if plan.rows or plan.elementwise is not None or len(plan.groups) != 1:
          raise KernelOptError(f"{opt}: only a full reduction (one reduction, no row, no elementwise pass) spreads "
                               f"over several blocks")
        if k % threads or k > MAX_GRID_BLOCKS or k * threads > length:
          raise KernelOptError(f"{opt}: the blocks must be a multiple of the block's {threads} threads, at most "
                               f"{MAX_GRID_BLOCKS}, with at least one element a thread ({length} elements)")
      else: raise KernelOptError(f"{opt}: the kernel's reduction is split over threads and blocks already")
    elif opt.op is OptOps.LOCAL:
      if self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is a reduce axis; LOCAL splits output axes (use GROUP)")
      if grouped:   # a row kernel: k rows a block
        if len(grouped) > 1 or rng not in plan.rows:
          raise KernelOptError(f"{opt}: after a GROUP, LOCAL gives a block several rows: axis {opt.axis} is no row")
        rows = prod_of(self.size(r) for r in plan.rows)
        if not power_of_two or grouped[0][2] * locals_k * k > local_max or locals_k * k > rows:
          raise KernelOptError(f"{opt}: rows a block must be a power of two, at most {rows} rows and {local_max} "
                               f"threads")
      else:
        self._check_mapped(opt, rng, mapped, size, by_id)
        if locals_k * k > local_max: raise KernelOptError(f"{opt}: more than {local_max} threads a block")
    else:   # UPCAST on a GPU: a register tile in each thread
      if self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is a reduce axis; UPCAST splits output axes (use UNROLL)")
      if grouped: raise KernelOptError(f"{opt}: a row kernel's threads keep their elements already (GROUP)")
      self._check_mapped(opt, rng, mapped, size, by_id)
      upcasts = prod_of(a[2] for a in actions if a[0] is OptOps.UPCAST)
      if upcasts * k > MAX_GPU_UPCAST or self.unrolled * k > MAX_UNROLLED:
        raise KernelOptError(f"{opt}: a thread would hold {upcasts * k} copies of the body (at most "
                             f"{MAX_GPU_UPCAST})")
    return graph.replace(arg=GPUChoices(actions + ((opt.op, rng.arg, k),)))

  def _tensor_cores(self, opt: Opt, rng: UOp) -> UOp:
    """The kernel with the TC action recorded (its tiles are built by kiln/codegen/gpu_mma.py): the kernel's first
    and only GPU action, on one of its reduce axes, where `gpu_mma.mma_plan` fits the kernel and the target."""
    from kiln.codegen import gpu_mma
    if opt.op is not OptOps.TC or self.gpu_actions:
      raise KernelOptError(f"{opt}: the TC action is a kernel's only GPU action (it has {self.gpu_actions})")
    if not self.is_reduce(opt.axis):
      raise KernelOptError(f"{opt}: axis {opt.axis} is an output axis; TC names a reduce axis of the matmul")
    if not isinstance(opt.arg, int) or isinstance(opt.arg, bool) or not 0 <= opt.arg <= len(gpu_mma.TILES):
      raise KernelOptError(f"{opt}: the amount is 0 (the scored tile) or a tile number 1..{len(gpu_mma.TILES)}")
    graph = self.sink.replace(arg=None)
    if gpu_mma.mma_plan(graph, self.target, opt.arg) is None:
      raise KernelOptError(f"{opt}: no tensor-core tiling fits (a matmul of half/bfloat16 factors, float32 with "
                           f"ALLOW_TF32=1, on a target whose tensor cores take them, TC=1, a tile within its shared "
                           f"memory: kiln/codegen/gpu_mma.py)")
    return graph.replace(arg=GPUChoices(((opt.op, rng.arg, opt.arg),)))

  def _check_mapped(self, opt: Opt, rng: UOp, mapped: list[UOp], size: int, by_id: dict) -> None:
    """KernelOptError unless output range `rng` goes on threads and the amount fits what earlier splits left: it
    divides it, or pads the range (the rest rounded up, the extra iterations guarded) by at most a quarter."""
    if rng not in mapped:
      raise KernelOptError(f"{opt}: axis {opt.axis} stays a loop in each thread (its iterations may touch one "
                           f"address, or a reduction does not depend on it: kiln/codegen/gpudims.py)")
    parts = [a[2] for a in self.gpu_actions if a[1] == rng.arg and a[0] in (OptOps.LOCAL, OptOps.UPCAST)]
    rest = size
    for part in parts: rest = -(-rest // part)
    if opt.arg > rest:
      raise KernelOptError(f"{opt}: more than the {rest} iterations of axis {opt.axis} left by earlier actions")
    padded = prod_of(parts) * opt.arg * -(-rest // opt.arg)
    if padded - size > size // 4:
      raise KernelOptError(f"{opt}: {opt.arg} does not divide the {rest} iterations of axis {opt.axis} left by "
                           f"earlier actions, and padding them would add more than a quarter ({size} -> {padded})")

  def _gpu_possible_opts(self, amounts: tuple[int, ...]) -> list[Opt]:
    """`possible_opts` on a GPU target: UNROLL and SWAP (before any GPU action), then LOCAL, UPCAST, GROUP and
    GROUPTOP where they would be accepted."""
    axes, n_out = self.axes, len(self.output_axes)
    candidates: list[Opt] = []
    if not self.gpu_actions:
      for axis, rng in enumerate(axes):
        size = self.size(rng)
        if axis >= n_out and size is not None:
          candidates += [Opt(OptOps.UNROLL, axis, k) for k in (2, 4) if size % k == 0 and size > k]
        other_kind = range(n_out, len(axes)) if axis >= n_out else range(n_out)
        candidates += [Opt(OptOps.SWAP, axis, other) for other in other_kind if other > axis]
    grouped = any(a[0] in (OptOps.GROUP, OptOps.GROUPTOP) for a in self.gpu_actions)
    if not self.gpu_actions and n_out < len(axes):
      from kiln.codegen.gpu_mma import TILES
      candidates += [Opt(OptOps.TC, n_out, choice) for choice in range(len(TILES) + 1)]
    for axis in range(len(axes)):
      if axis < n_out:
        candidates += [Opt(OptOps.LOCAL, axis, k) for k in (GPU_ROWS_A_BLOCK if grouped else GPU_LOCAL_SIZES)]
        candidates += [Opt(OptOps.UPCAST, axis, k) for k in amounts if k <= 8]
      else:
        candidates += [Opt(op, axis, k) for op in (OptOps.GROUP, OptOps.GROUPTOP) for k in GPU_GROUP_SIZES]
        candidates += [Opt(OptOps.GROUP, axis, k) for k in GPU_GRID_BLOCKS]
    opts = []
    for opt in dict.fromkeys(candidates):
      try:
        if opt.op in GPU_ONLY_OPS or opt.op is OptOps.UPCAST: self._gpu_action(opt, axes)
        elif opt.op is OptOps.SWAP: self._swap(opt, axes)
      except KernelOptError: continue
      opts.append(opt)
    return opts

  def _swap(self, opt: Opt, axes: list[UOp]) -> UOp:
    """Two axes of one kind trade loop positions (their loop ids)."""
    if not isinstance(opt.arg, int) or not 0 <= opt.arg < len(axes) or opt.arg == opt.axis:
      raise KernelOptError(f"{opt}: the other axis must be a different axis number below {len(axes)}")
    if self.is_reduce(opt.axis) != self.is_reduce(opt.arg):
      raise KernelOptError(f"{opt}: cannot swap an output axis with a reduce axis (reductions stay inside)")
    a, b = axes[opt.axis], axes[opt.arg]
    mapping = {a: a.replace(arg=b.arg), b: b.replace(arg=a.arg)}
    # a kernel graph is a fixed point of symbolic (each action's result is rewritten, and remembered: one lookup),
    # unless it was built by hand
    if graph_rewrite(self.sink, symbolic) is self.sink: return substitute_simplified(self.sink, mapping)
    return substitute(self.sink, mapping)

  def _dividing_split(self, opt: Opt, axes: list[UOp], what: str) -> tuple[UOp, int, int]:
    """The axis `opt` splits, its size and the length `opt.arg`, which must divide it (KernelOptError otherwise)."""
    rng, size, length = axes[opt.axis], self.size(axes[opt.axis]), opt.arg
    if size is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
    if not isinstance(length, int) or length < 2 or length >= size or size % length != 0:
      raise KernelOptError(f"{opt}: the {what} must be an integer >= 2 below the axis size {size} that divides it")
    return rng, size, length

  def _kblock(self, opt: Opt, axes: list[UOp]) -> UOp:
    """Split reduce axis `opt.axis` into blocks of `opt.arg`; the block loop becomes an output loop accumulating in
    the output buffer (module docstring). Refused unless every STORE writes a plain sum over the axis."""
    if not self.is_reduce(opt.axis): raise KernelOptError(f"{opt}: axis {opt.axis} is an output axis; KBLOCK "
                                                          f"blocks a reduce axis")
    rng, size, block = self._dividing_split(opt, axes, "block length")
    out_axes = self.output_axes
    if not out_axes: raise KernelOptError(f"{opt}: the kernel has no output loop to place the block loop inside")
    if self.overlapped:   # (the other order is refused too: an overlapping UPCAST of a kernel reading its output)
      raise KernelOptError(f"{opt}: an upcast's last tile overlaps the one before it; accumulating in the output, "
                           f"the overlapped outputs would add each block's sum twice")
    # each stored value: a plain sum over the axis, or such a sum plus an addend that does not depend on the axis (a
    # gradient fused with another's: dx + the residual's); the addend then starts the accumulator in place of 0
    split = {st: _sum_and_addend(st.src[2], rng) for st in self.sink.src}
    stored = {red for red, _ in split.values() if red is not None}
    for st in self.sink.src:
      buf, value = st.src[0], split[st][0]
      if value is None:
        raise KernelOptError(f"{opt}: a stored value is not a plain sum over axis {opt.axis} "
                             f"({st.src[2].op.name} {st.src[2].arg}); the output cannot be the accumulator")
      if not (value.dtype in _KBLOCK_DTYPES or dtypes.is_int(value.dtype)) or buf.dtype != value.dtype:
        raise KernelOptError(f"{opt}: the sum is {value.dtype} stored as {buf.dtype}; partial sums would be rounded")
    nodes = graph_nodes(self.sink)
    if any(u.op is Ops.REDUCE and rng in u.src[1:] and u not in stored for u in nodes):
      raise KernelOptError(f"{opt}: axis {opt.axis} is also reduced inside the computation of a value")
    written = {st.src[0] for st in self.sink.src}
    if any(u.op is Ops.LOAD and u.src[0] in written for u in nodes):
      raise KernelOptError(f"{opt}: the kernel reads the buffer it writes (in place); it cannot accumulate there")
    # new loop ids: the block loop right after the outermost output loop, every other loop keeps its order
    renamed = _renumbered([out_axes[0], None] + out_axes[1:] + self.reduce_axes)
    blocks = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.int32, size // block),), 1)
    inner = renamed[rng].replace(src=(UOp.const(dtypes.int32, block),))
    position = blocks * block + inner
    new_stores = []
    for st in self.sink.src:
      (buf, idx, _), (red, addend) = st.src, split[st]
      body = substitute(red.src[0], {**renamed, rng: position})
      ranges = tuple(inner if r is rng else renamed[r] for r in red.src[1:])
      new_idx = substitute(idx, renamed)
      first = UOp.const(buf.dtype, 0) if addend is None else substitute(addend, renamed)
      # an ungated load and a select, not a gated load: clang vectorizes a tile's loads and stores together only
      # when the loads cannot fault (measured: a gated load made matmul 1024 2.3x slower); the address is inside
      # the output buffer, whose first-block contents are discarded
      previous = UOp.const(dtypes.int32, 0).lt(blocks).where(UOp(Ops.LOAD, buf.dtype, (buf, new_idx)), first)
      # the block's sum first: the linearizer emits operands in order, so the load comes after the reduce loop
      # (loaded before it, 128 tile outputs would be live across the loop next to 128 accumulators and spill)
      new_stores.append(st.replace(src=(buf, new_idx, red.replace(src=(body,) + ranges) + previous)))
    return self.sink.replace(src=tuple(new_stores))

  def _split_loop(self, opt: Opt, axes: list[UOp]) -> UOp:
    """Output axis `opt.axis` as an outer loop and an inner loop of `opt.arg` iterations right inside it."""
    if self.is_reduce(opt.axis): raise KernelOptError(f"{opt}: axis {opt.axis} is a reduce axis; SPLIT splits "
                                                      f"output axes")
    if self.is_block_loop(axes[opt.axis]):
      raise KernelOptError(f"{opt}: axis {opt.axis} is a block loop (its iterations update the same outputs)")
    rng, size, inner_size = self._dividing_split(opt, axes, "inner length")
    renamed = _renumbered(axes[:opt.axis + 1] + [None] + axes[opt.axis + 1:])
    outer = renamed[rng].replace(src=(UOp.const(dtypes.int32, size // inner_size),))
    inner = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.int32, inner_size),), opt.axis + 1)
    return substitute(self.sink, {**renamed, rng: outer * inner_size + inner})

  def _blocksum(self, opt: Opt, axes: list[UOp]) -> UOp:
    """Every REDUCE over reduce axis `opt.axis` -> a REDUCE over the blocks of one over each block of `opt.arg`
    (module docstring): the loops inside the axis go with the block, those outside it with the blocks."""
    if not self.is_reduce(opt.axis): raise KernelOptError(f"{opt}: axis {opt.axis} is an output axis; BLOCKSUM "
                                                          f"blocks a reduce axis")
    rng, size, block = self._dividing_split(opt, axes, "block length")
    renamed = _renumbered(axes[:opt.axis + 1] + [None] + axes[opt.axis + 1:])
    outer = renamed[rng].replace(src=(UOp.const(dtypes.int32, size // block),))
    inner = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.int32, block),), opt.axis + 1)
    position = outer * block + inner
    replaced: dict[UOp, UOp] = {}
    for red in graph_nodes(self.sink):
      if red.op is not Ops.REDUCE or rng not in red.src[1:]: continue
      body = substitute(red.src[0], {**renamed, rng: position})
      inside = tuple(renamed[r] for r in red.src[1:] if r.arg > rng.arg)
      around = tuple(renamed[r] for r in red.src[1:] if r.arg < rng.arg)
      block_sum = UOp(Ops.REDUCE, red.dtype, (body, inner) + inside, red.arg)
      replaced[red] = UOp(Ops.REDUCE, red.dtype, (block_sum,) + around + (outer,), red.arg)
    if not replaced: raise KernelOptError(f"{opt}: nothing is reduced over axis {opt.axis}")
    # one substitution: the other loops keep their order (one id further along after the new inner loop); renamed
    # in a second pass, a loop's new form could equal another loop's old one (hash-consing) and be renamed twice
    return substitute(self.sink, {**{r: n for r, n in renamed.items() if r is not rng}, **replaced})

  def _padto(self, opt: Opt, axes: list[UOp]) -> UOp:
    """Axis `opt.axis` runs to the next multiple of `opt.arg`; the extra iterations repeat its last element (output
    axis) or add the identity (reduce axis). See the module docstring."""
    rng, size, multiple = axes[opt.axis], self.size(axes[opt.axis]), opt.arg
    if size is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
    if not isinstance(multiple, int) or multiple < 2 or size % multiple == 0 or size < 2:
      raise KernelOptError(f"{opt}: the multiple must be an integer >= 2 that does not divide the axis size {size}")
    if self.is_block_loop(rng):
      raise KernelOptError(f"{opt}: axis {opt.axis} is a block loop (its iterations update the same outputs)")
    padded_size = -(-size // multiple) * multiple
    if padded_size - size > max(size // 4, 1):
      raise KernelOptError(f"{opt}: padding {size} to {padded_size} would add more than a quarter of extra work")
    padded = rng.replace(src=(UOp.const(dtypes.int32, padded_size),))
    inside = padded.lt(size)
    clamped = inside.where(padded, UOp.const(dtypes.int32, size - 1))
    if not self.is_reduce(opt.axis):
      if self._reads_own_output():
        raise KernelOptError(f"{opt}: the kernel reads a buffer it writes; repeated stores could see their own "
                             f"results")
      return substitute(self.sink, {rng: clamped})
    replaced: dict[UOp, UOp] = {}
    for red in graph_nodes(self.sink):
      if red.op is not Ops.REDUCE or rng not in red.src[1:]: continue
      body = substitute(red.src[0], {rng: clamped})
      identity = UOp.const(red.dtype, identity_element(red.arg, red.dtype))
      ranges = tuple(padded if r is rng else r for r in red.src[1:])
      replaced[red] = red.replace(src=(inside.where(body, identity),) + ranges)
    return substitute(self.sink, replaced)

  @staticmethod
  def _split(rng: UOp, amount: int) -> tuple[UOp | None, list[UOp]]:
    """The outer range of `rng` split by `amount` (None when it would run once) and `rng` in terms of it, per lane."""
    outer_size = rng.src[0].arg // amount
    outer = rng.replace(src=(UOp.const(dtypes.int32, outer_size),)) if outer_size > 1 else None
    base = outer * amount if outer is not None else UOp.const(dtypes.int32, 0)
    return outer, [base + lane for lane in range(amount)]

  def _reads_own_output(self) -> bool:
    written = {st.src[0] for st in self.sink.src}
    return any(u.op is Ops.LOAD and u.src[0] in written for u in graph_nodes(self.sink))

  def _upcast(self, rng: UOp, amount: int, max_nodes: int | None = None) -> UOp:
    size = rng.src[0].arg
    if size % amount == 0:
      outer, _ = self._split(rng, amount)
      base = outer * amount if outer is not None else UOp.const(dtypes.int32, 0)
    else:   # the last tile shifts back to end at the axis' last element, overlapping the tile before it
      whole = size // amount
      outer = rng.replace(src=(UOp.const(dtypes.int32, whole + 1),))
      # min(outer*amount, size - amount) as -max(-a, -b): its bounds (vmin/vmax) stay exact, which the thread split's
      # proof that tiles of different rows do not overlap needs (kiln/codegen/parallel.py)
      base = -((-(outer * amount)).maximum(amount - size))
    # the lanes `base + c`, simplified: the base once, then each lane from it (settle: its sources are fixed points)
    base = graph_rewrite(base, symbolic)
    lanes = [settle(base + lane, symbolic) for lane in range(amount)]
    # the body is simplified already: each copy is simplified as it is built (lanes differ by a constant, so few
    # rules fire), instead of a rewrite of the whole tile of copies afterwards
    # the copies of the whole sink at once: nodes several stores share (a matmul tile's loads of `a`) are copied once
    sinks = substitute_copies(self.sink, rng, lanes, simplified=True, max_nodes=max_nodes)
    stores = dict.fromkeys(copy.src[i] for i in range(len(self.sink.src)) for copy in sinks)
    return self.sink.replace(src=tuple(stores))

  def _unroll(self, rng: UOp, amount: int, separate: bool = False) -> UOp:
    """UNROLL (one accumulator sums the lanes each iteration) or, with `separate`, LANES (one accumulator per lane,
    combined after the loop)."""
    outer, lanes = self._split(rng, amount)
    replaced: dict[UOp, UOp] = {}
    for red in graph_nodes(self.sink):
      if red.op is not Ops.REDUCE or rng not in red.src[1:]: continue
      ranges = tuple(outer if r is rng else r for r in red.src[1:] if r is not rng or outer is not None)
      bodies = substitute_copies(red.src[0], rng, [graph_rewrite(lane, symbolic) for lane in lanes], simplified=True)
      if separate and ranges:   # LANES: a REDUCE per lane (without a loop left, the same as UNROLL)
        replaced[red] = _balanced(red.arg, [red.replace(src=(b,) + ranges) for b in bodies])
        continue
      value = _balanced(red.arg, bodies)
      if ranges: replaced[red] = red.replace(src=(value,) + ranges)
      else:   # the whole reduction is unrolled: combine with the identity as the loop would have
        identity = UOp.const(red.dtype, identity_element(red.arg, red.dtype))
        replaced[red] = UOp(red.arg, red.dtype, (identity, value))
    return substitute(self.sink, replaced)

  # ---- for search ----
  def possible_opts(self, amounts: tuple[int, ...] = (2, 3, 4, 8, 16),
                    block_sizes: tuple[int, ...] = KBLOCK_SIZES) -> list[Opt]:
    """Every action that would apply to the kernel as it is now (what BEAM search and the tests enumerate); KBLOCK
    is offered with `block_sizes` where it would be accepted. A GPU kernel gets the GPU actions instead
    (`_gpu_possible_opts`)."""
    if self.gpu: return self._gpu_possible_opts(amounts)
    axes, n_out = self.axes, len(self.output_axes)
    opts = []
    for axis, rng in enumerate(axes):
      size = self.size(rng)
      ops = (OptOps.UNROLL, OptOps.LANES) if axis >= n_out else (OptOps.UPCAST,)
      if size is not None and not self.is_block_loop(rng):
        opts += [Opt(op, axis, k) for op in ops for k in amounts if self.unrolled * k <= MAX_UNROLLED and
                 (size % k == 0 or (op is OptOps.UPCAST and size > k and not self._reads_own_output()))]
      other_kind = range(n_out, len(axes)) if axis >= n_out else range(n_out)
      opts += [Opt(OptOps.SWAP, axis, other) for other in other_kind if other > axis]
      if size is None: continue
      candidates = [Opt(OptOps.SPLIT, axis, k) for k in amounts] if axis < n_out else \
        [Opt(OptOps.KBLOCK, axis, k) for k in block_sizes]
      candidates += [Opt(OptOps.PADTO, axis, k) for k in amounts if size % k != 0]
      opts += [opt for opt in candidates if self._accepts(opt)]
    return opts

  def _accepts(self, opt: Opt) -> bool:
    """Whether a SPLIT, KBLOCK or PADTO would be applied (checked by building it, without changing the kernel)."""
    build = {OptOps.KBLOCK: self._kblock, OptOps.SPLIT: self._split_loop, OptOps.PADTO: self._padto}[opt.op]
    try: build(opt, self.axes)
    except KernelOptError: return False
    return True
