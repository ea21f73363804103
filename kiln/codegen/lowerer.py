"""Lowering: a kernel AST over tensor-style ops becomes loops, index arithmetic and loads.

An `INDEX(x, valid, *idx)` node means "the value of tensor node x at indices idx, where the access is only real if
`valid`". The rules below push INDEX down through every op until only loads, constants and loop variables remain.
"""
from __future__ import annotations
import math
from kiln.dtype import dtypes
from kiln.helpers import prod
from kiln.uop.ops import UOp, Ops, GroupOp, identity_element, toposort
from kiln.uop.pattern import UPat, PatternMatcher, graph_rewrite
from kiln.uop.symbolic import symbolic, linear_form, build_sum

INT = dtypes.int32
TRUE = UOp.const(dtypes.bool, True)

def iconst(v) -> UOp:
  """An int32 constant node with value `v` (a symbolic size, an expression over Variables, is returned as it is)."""
  return v if isinstance(v, UOp) else UOp.const(INT, v)

def linearize_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  """Row-major flat index of `idx` in `shape`."""
  flat, stride = iconst(0), 1
  for i, s in reversed(list(zip(idx, shape))):
    if s != 1: flat = flat + i * stride
    stride *= s
  return flat

def unflatten_index(flat: UOp, shape: tuple[int, ...]) -> tuple[UOp, ...]:
  """Per-axis indices of the row-major flat index `flat` in `shape`."""
  out, stride = [], 1
  for k, s in enumerate(reversed(shape)):
    # the outermost axis needs no wrap: an in-bounds flat index is below prod(shape) (the simplifier cannot prove
    # that for a size over Variables, nor for a padded view's index, which is -1 at a gated-off border: a `% size`
    # would stay in the kernel, one division per element of a pad copy)
    outermost = k == len(shape) - 1
    out.append(iconst(0) if s == 1 else (flat // stride) if outermost else (flat // stride) % s)
    stride *= s
  return tuple(reversed(out))

def index_of(x: UOp, valid: UOp, idx) -> UOp:
  """An INDEX node: the value of `x` at indices `idx`, a real access only where `valid` is true."""
  return UOp(Ops.INDEX, x.dtype, (x, valid) + tuple(idx))

def _strip_ones(shape): return [s for s in shape if s != 1]

def index_reshape(x: UOp, valid: UOp, idx: tuple[UOp, ...], new_shape) -> UOp:
  """INDEX(RESHAPE(x)) -> INDEX(x) at the unflattened index"""
  if x.op is Ops.DEFINE_GLOBAL: return index_of(x, valid, (linearize_index(idx, new_shape),))
  old_shape = x.shape
  if _strip_ones(old_shape) == _strip_ones(new_shape):   # only size-1 axes added or removed
    real = iter([i for i, s in zip(idx, new_shape) if s != 1])
    return index_of(x, valid, [iconst(0) if s == 1 else next(real) for s in old_shape])
  if any(isinstance(s, UOp) for s in (*old_shape, *new_shape)) and (groups := _reshape_groups(old_shape, new_shape)):
    # symbolic sizes: each group of axes on its own, so a split (2h) -> (h, 2) divides by 2, not by a size
    old_idx: list[UOp] = []
    for (i0, i1), (j0, j1) in groups:
      old_idx += unflatten_index(linearize_index(tuple(idx[j0:j1]), new_shape[j0:j1]), old_shape[i0:i1])
    return index_of(x, valid, old_idx)
  return index_of(x, valid, unflatten_index(linearize_index(idx, new_shape), old_shape))

def _prefix_products(shape) -> list:
  """The products of each prefix of `shape` (ints, or simplified expressions: equal sizes are the same node)."""
  out, total = [1], 1
  for s in shape:
    total = total * s
    if isinstance(total, UOp): total = graph_rewrite(total, symbolic)
    if isinstance(total, UOp) and total.op is Ops.CONST: total = total.arg
    out.append(total)
  return out

def _reshape_groups(old_shape, new_shape) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
  """The axes of a reshape in groups whose sizes multiply to the same product on both sides, ((old axes), (new
  axes)) each as a range; None where only the whole shapes match."""
  old_prefix, new_prefix = _prefix_products(old_shape), _prefix_products(new_shape)
  groups, start_i, start_j, j = [], 0, 0, 0
  for i in range(1, len(old_shape) + 1):
    found = next((k for k in range(max(j, start_j + 1), len(new_shape) + 1) if _same_size(new_prefix[k], old_prefix[i])),
                 None)
    if found is None: continue
    groups.append(((start_i, i), (start_j, found)))
    start_i, start_j, j = i, found, found
  if start_i != len(old_shape) or start_j != len(new_shape) or len(groups) < 2: return None
  return groups

def _same_size(a, b) -> bool: return a is b if isinstance(a, UOp) or isinstance(b, UOp) else a == b

def push_through_elementwise(x: UOp, valid: UOp, idx) -> UOp:
  """INDEX(alu(a, b)) -> alu(INDEX(a), INDEX(b))"""
  return x.replace(src=tuple(index_of(s, valid, idx) for s in x.src))

def index_permute(x: UOp, valid: UOp, idx, order) -> UOp:
  """INDEX(PERMUTE(x)) -> INDEX(x) with the indices put back in x's order"""
  src_idx = [None] * len(order)
  for out_axis, src_axis in enumerate(order): src_idx[src_axis] = idx[out_axis]
  return index_of(x, valid, src_idx)

def index_expand(x: UOp, valid: UOp, idx, new_shape) -> UOp:
  """INDEX(EXPAND(x)) -> INDEX(x) with broadcast axes at 0"""
  return index_of(x, valid, [iconst(0) if s == 1 else i for i, s in zip(idx, x.shape)])

def index_pad(x: UOp, valid: UOp, idx, pads) -> UOp:
  """INDEX(PAD(x)) -> where(in_bounds, INDEX(x) at the shifted index, 0)"""
  in_bounds = TRUE
  new_idx = []
  for i, s, (before, after) in zip(idx, x.shape, pads):
    if before or after:
      in_bounds = in_bounds & i.ge(before) & i.lt(before + s)
      i = i - before
    new_idx.append(i)
  return in_bounds.where(index_of(x, valid & in_bounds, new_idx), UOp.const(x.dtype, 0))

def index_shrink(x: UOp, valid: UOp, idx, bounds) -> UOp:
  """INDEX(SHRINK(x)) -> INDEX(x) at the offset index"""
  return index_of(x, valid, [i + start if start else i for i, (start, _) in zip(idx, bounds)])

def index_flip(x: UOp, valid: UOp, idx, axes) -> UOp:
  """INDEX(FLIP(x)) -> INDEX(x) at the mirrored index"""
  return index_of(x, valid, [(s - 1) - i if axis in axes else i for axis, (i, s) in enumerate(zip(idx, x.shape))])

def index_reduce(ctx: LowerContext, x: UOp, valid: UOp, idx, op: Ops, axes) -> UOp:
  """INDEX(REDUCE_AXIS(x)) -> REDUCE over fresh loop ranges of INDEX(x)

  One reduction read at one index is one REDUCE, however many paths reach it: a fused row chain reads each row's
  max both in the loop of the row's sum and in the row's elementwise loop, and computes it once."""
  key = (x, valid, tuple(idx), op, axes)
  if key not in ctx.reduces: ctx.reduces[key] = _lower_reduce(ctx, x, valid, idx, op, axes)
  return ctx.reduces[key]

def _lower_reduce(ctx: LowerContext, x: UOp, valid: UOp, idx, op: Ops, axes) -> UOp:
  """REDUCE_AXIS(x) at idx -> a REDUCE of x's value over loop ranges for the reduced axes (the identity if empty)"""
  if prod(x.shape[a] for a in axes) == 0:
    # nothing to reduce: no loop and no loads (a load of the empty input, hoisted out of the empty loop, read out of
    # its bounds)
    return UOp.const(x.dtype, identity_element(op, x.dtype))
  new_ranges, src_idx = [], []
  for axis, (i, s) in enumerate(zip(idx, x.shape)):
    if axis in axes:
      if s == 1: src_idx.append(iconst(0))
      else:
        rng = ctx.new_range(s)
        new_ranges.append(rng)
        src_idx.append(rng)
    else: src_idx.append(i)
  body = index_of(x, valid, src_idx)
  if not new_ranges: return body
  return UOp(Ops.REDUCE, x.dtype, (body,) + tuple(new_ranges), op)

def index_buffer(buf: UOp, valid: UOp, idx) -> UOp:
  """INDEX(DEFINE_GLOBAL, i) -> LOAD(buf, i) (gated when the access may be outside the tensor)"""
  if valid.op is Ops.CONST and valid.arg is True: return UOp(Ops.LOAD, buf.dtype, (buf, idx[0]))
  if valid.op is Ops.CONST and valid.arg is False: return UOp.const(buf.dtype, 0)
  return UOp(Ops.LOAD, buf.dtype, (buf, idx[0], valid))

class LowerContext:
  """Hands out loop ranges with unique ids, and remembers the REDUCE each indexed reduction became."""
  def __init__(self):
    self.next_id = 0
    self.reduces: dict[tuple, UOp] = {}
  def new_range(self, size: int) -> UOp:
    """A new loop variable (RANGE) over [0, size), with the next unique id."""
    rng = UOp(Ops.RANGE, INT, (iconst(size),), self.next_id)
    self.next_id += 1
    return rng

def _lower_rule(op, fn):
  def rule(ctx, node):
    x, valid, idx = node.src[0], node.src[1], node.src[2:]
    return fn(ctx, x, valid, idx)
  return (UPat(Ops.INDEX, src=(UPat(op),), allow_any_len=True, name="node"), rule)

lower_index = PatternMatcher([
  _lower_rule(GroupOp.Elementwise, lambda ctx, x, v, idx: push_through_elementwise(x, v, idx)),
  _lower_rule(Ops.CONST, lambda ctx, x, v, idx: x.replace(src=())),
  _lower_rule(Ops.IOTA, lambda ctx, x, v, idx: idx[0]),
  _lower_rule(Ops.BIND, lambda ctx, x, v, idx: x.src[0]),
  _lower_rule(Ops.RESHAPE, lambda ctx, x, v, idx: index_reshape(x.src[0], v, idx, x.arg)),
  _lower_rule(Ops.PERMUTE, lambda ctx, x, v, idx: index_permute(x.src[0], v, idx, x.arg)),
  _lower_rule(Ops.EXPAND, lambda ctx, x, v, idx: index_expand(x.src[0], v, idx, x.arg)),
  _lower_rule(Ops.PAD, lambda ctx, x, v, idx: index_pad(x.src[0], v, idx, x.arg)),
  _lower_rule(Ops.SHRINK, lambda ctx, x, v, idx: index_shrink(x.src[0], v, idx, x.arg)),
  _lower_rule(Ops.FLIP, lambda ctx, x, v, idx: index_flip(x.src[0], v, idx, x.arg)),
  _lower_rule(Ops.REDUCE_AXIS, lambda ctx, x, v, idx: index_reduce(ctx, x.src[0], v, idx, *x.arg)),
  _lower_rule(Ops.DEFINE_GLOBAL, lambda ctx, x, v, idx: index_buffer(x, v, idx)),
  _lower_rule((Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_BACKWARD, Ops.UNIQUE),
              lambda ctx, x, v, idx: index_of(x.src[0], v, idx)),
])

def drop_true_gate(load: UOp) -> UOp | None:
  """LOAD(buf, i, True) -> LOAD(buf, i) (a gate the simplifier decided after the load was made)"""
  gate = load.src[2]
  return load.replace(src=load.src[:2]) if gate.op is Ops.CONST and gate.arg is True else None

lowerer = lower_index + symbolic + PatternMatcher([(UPat(Ops.LOAD, src=(UPat(), UPat(), UPat()), name="load"),
                                                    drop_true_gate)])

def _view_store_index(view: UOp, out_ranges: list[UOp], ctx: LowerContext) -> tuple[UOp, UOp]:
  """The buffer and flat index a store through a view (reshape/shrink/permute/flip of a DEFINE_GLOBAL) writes to:
  the index a load through that view would read."""
  load = graph_rewrite(index_of(view, TRUE, out_ranges), lowerer, ctx, name="store view")
  # a step slice's padding is never reached: its gate folds to True
  if load.op is Ops.LOAD and len(load.src) == 3 and load.src[2].op is Ops.CONST and load.src[2].arg is True:
    load = load.replace(src=load.src[:2])
  if load.op is not Ops.LOAD or len(load.src) != 2:
    raise RuntimeError(f"lower: a store through the view {view.op.name} did not map to one buffer index")
  return load.src[0], load.src[1]

VECTOR_ROW = 16   # an output row that 16 divides makes whole vectors; other rows are merged with the axis above

def constant_factor(size: UOp) -> int:
  """The largest power of two up to VECTOR_ROW that divides a symbolic size for every value (16*v+32: 16)."""
  form = linear_form(size)
  if form is None: return 1
  g = math.gcd(*form[0].values(), form[1])
  return min(g & -g, VECTOR_ROW) if g else 1

WHOLE_STEP = 8   # a symbolic axis in steps of at least this many loops over its steps, not overlapping tiles

def _output_range(ctx: LowerContext, size, overlap: bool) -> UOp:
  """The index of an output axis: one loop, or for a symbolic size a loop of constant size inside another, as the
  optimizer's upcasts and vectors need an axis of plain size:
  - a size c*v (c a power of two, constant_factor): v loops of c, `outer*c + inner` (a feature map's symbolic size
    comes in whole steps, kiln/frontend/onnx_cache.py);
  - with `overlap` (one of several axes, and no load of the kernel reads what it stores), a size of at least
    VECTOR_ROW in smaller steps: ceil(size/16) tiles of 16, the last one shifted back to end at the axis'
    end, `min(outer*16, size-16) + inner` (its overlap computes a few outputs twice, the same values)."""
  if not isinstance(size, UOp): return ctx.new_range(size)
  factor = constant_factor(size)
  if overlap and factor < WHOLE_STEP and size.vmin >= VECTOR_ROW:
    outer = ctx.new_range(graph_rewrite((size + (VECTOR_ROW - 1)) // VECTOR_ROW, symbolic))
    start, last = outer * VECTOR_ROW, graph_rewrite(size - VECTOR_ROW, symbolic)
    return start.lt(last).where(start, last) + ctx.new_range(VECTOR_ROW)
  if factor == 1: return ctx.new_range(size)
  terms, const = linear_form(size)
  outer = ctx.new_range(build_sum(size.dtype, {t: a // factor for t, a in terms.items()}, const // factor))
  return outer * factor + ctx.new_range(factor)

def lower_kernel(ast: UOp) -> UOp:
  """Kernel AST `SINK(STORE(DEFINE_GLOBAL, value))` -> `SINK(STORE(buf, index, loaded value))` over loop ranges.

  A reduction whose output rows are short or odd (7, 56) gets one loop over its last two output axes where every
  index reads them as one position (a 1x1 conv over a flattened image, its bias and residual fused in): the
  optimizer then tiles whole images, not rows no vector divides."""
  if _rows_merge_candidate(ast) and (merged := _lower(ast, merge_rows=True)) is not None: return merged
  return _lower(ast, merge_rows=False)

def _rows_merge_candidate(ast: UOp) -> bool:
  """Whether `ast` is one store of a reduction whose last output axis is a short or odd row under another axis."""
  if len(ast.src) != 1: return False
  shape = ast.src[0].src[1].shape
  if shape is None or len(shape) < 2 or not all(isinstance(s, int) for s in shape[-2:]): return False
  if shape[-1] <= 1 or shape[-2] <= 1 or shape[-1] % VECTOR_ROW == 0: return False
  return any(u.op is Ops.REDUCE_AXIS for u in toposort([ast.src[0].src[1]]))

def _lower(ast: UOp, merge_rows: bool) -> UOp | None:
  """The lowered kernel; with `merge_rows`, its last two output axes as one loop, or None where an index still
  divides that loop apart (a padded or windowed view reads rows and columns on their own)."""
  ctx = LowerContext()
  stores, merged = [], None
  written = {u for store in ast.src for u in toposort([store.src[0]]) if u.op is Ops.DEFINE_GLOBAL}
  overlap = not any(u in written for u in toposort([store.src[1] for store in ast.src]))
  for store in ast.src:
    out_buf, value = store.src
    shape = value.shape
    if merge_rows:
      outer = [iconst(0) if s == 1 else ctx.new_range(s) for s in shape[:-2]]
      merged = ctx.new_range(shape[-2] * shape[-1])
      out_ranges = outer + [merged // shape[-1], merged % shape[-1]]
    else:
      # no overlapping tiles on a kernel's only axis: the thread split takes the outermost loop, whose iterations
      # must store disjoint blocks (an overlapped outermost axis, a matmul's rows, runs on one thread)
      several = sum(1 for s in shape if s != 1) > 1
      out_ranges = [iconst(0) if s == 1 else _output_range(ctx, s, overlap and several) for s in shape]
    if out_buf.op is Ops.DEFINE_GLOBAL: flat = linearize_index(tuple(out_ranges), shape)
    else: out_buf, flat = _view_store_index(out_buf, out_ranges, ctx)
    stores.append(UOp(Ops.STORE, dtypes.void, (out_buf, flat, index_of(value, TRUE, out_ranges))))
  sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(stores)), lowerer, ctx, name="lower")
  if merged is None: return sink
  # every use inside a sum must read the merged loop whole: a division or remainder of it left there means the
  # rows mattered (a window's row and column); one in an epilogue's load is paid once per output (a strided
  # shortcut's gradient added to a 1x1 conv's input gradient, read by phase)
  nodes = toposort([sink])
  summed = set(toposort([u.src[0] for u in nodes if u.op is Ops.REDUCE]))
  depends: set[UOp] = set()
  for u in nodes:
    if u is merged or any(s in depends for s in u.src):
      if u.op in (Ops.IDIV, Ops.MOD) and u.src[0] in depends and u in summed: return None
      depends.add(u)
  return sink
