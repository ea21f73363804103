"""Packing a large matmul's operands into tile-major layouts before it runs (host CPU devices).

A matmul kernel's register tile reads, at each step of the sum, a row of 16 consecutive values of one operand (`b`,
along the output's contiguous axis) and one value from each of 8 rows of the other (`a`). Where the operands keep
their row-major layout, those reads are 8 KiB apart at N = 2048: every step touches new cache lines, and all of `b`'s
lines of a tile's panel map to one L1 set, which then thrashes. BLAS libraries copy ("pack") blocks of both operands
first; here the scheduler does it for the whole operand, before cutting the graph into kernels:

- `b`, varying along the output's innermost axis c, is copied to (..., c/16, k, 16): a tile's panel is one
  contiguous run of k*16 values;
- `a`, varying along the tile's row axis d, is copied to (..., d/8, k, 8): a tile's 8 values per step are adjacent.

The matmul then reads the packed buffers through views that put every element back where it was (so the result,
and every later rewrite, is unchanged); once the optimizer upcasts c by 16 and d by 8, the index math folds to plain
strides. A pack is an elementwise kernel (a copy, or whatever computed the operand, fused into it).

Only sums of a product qualify (over one axis, or several kept in their order: a 1x1 conv's weight gradient sums
over the batch and the image), with each factor broadcast along the other's output axis (matmul, batched matmul,
and both matmuls of its backward), when c and d are multiples of the lane counts and the work is
large enough to pay for two more kernels and their memory traffic (PACK_MIN_WORK, and at least PACK_MIN_REUSE rows
and columns: a prefill's few tokens times a dequantized output head would copy the whole matrix for a few uses).
Measured on the 2-core EPYC (clang 14, 2 threads, best of 3): 2048x2048x2048 float32 120-138 GFLOP/s unpacked, 195
packed and cache-blocked (the two packs 2.5-3 ms each; NumPy 182-192 in the same runs).

A conv over short output rows (7 or 14 columns: ResNet's last stages) has no good vector axis along them. There
the factor that varies along the channels alone, broadcast along the image (its weight, in the forward conv and in
the input gradient), is copied to (channels/16, reduce axes..., 16), and the register tile's vectors run along the
channels (`_packed_channels`).

A plain matmul (two output axes, one summed) whose `a` is contiguous along the sum copies `b` alone (`A_IN_PLACE`,
`_rows_stay_in_l1`): its kernel is blocked by units of tile columns, and each row tile of `a` is read from L1.

A matmul whose `a` fits in a PACK_A_L2_SHARE share of one L2 (the device's target) and whose `b` is contiguous along
the columns is not packed: its kernel keeps `a` in L2 and runs the tile columns outside the rows (a 1x1 conv's few
output channels over a large image; codegen/opt/heuristic.py `_columns_outside`). The channel-major copy of a conv's
weight pays from PACK_CHANNELS_MIN_WORK multiply-adds (a batch-1 conv).

A smaller matmul (from PACK_STRIDED_MIN_WORK) packs `b` alone where `b` is strided along the output's contiguous
axis (`axis_stride`): `x @ w.T`, which every `x @ w` meets in its backward. Unpacked, each vector of the tile's `b`
row is gathered from 16 rows; the copy is one small kernel (bench/RESULTS.md: the MLP step). It also packs a
contiguous `b` larger than a PACK_B_L2_SHARE share of one L2 (the device's target): unpacked, every row of tiles
sweeps all of `b` from L3, rows of it a page apart (the MLP's first layer, 784x512 weights; bench/RESULTS.md,
fourteenth session).

A register-tiled float matmul whose epilogue (the elementwise ops its kernel would apply to each output) includes
software math (EXP2, LOG2, SIN: a GELU's tanh, a sigmoid) gets a buffer of its own, and the epilogue runs as an
elementwise kernel (`splits_epilogue`): fused, the epilogue is copied once per output of the register tile, so the
kernel-size budget (codegen/opt/heuristic.py MAX_NODES) cut the tile to 4 rows and its code took twice the time to
generate (the anchors' FFN up projection with its GELU; bench/RESULTS.md, fourteenth session).
"""
from __future__ import annotations
from typing import Callable
from kiln.dtype import dtypes
from kiln.helpers import ContextVar, prod
from kiln.uop.ops import UOp, Ops, GroupOp

PACK_MATMUL = ContextVar("PACK_MATMUL", 1, "1: on CPU devices, a large matmul's operands are copied into tile-major "
                         "layouts before it runs (kiln/schedule/pack.py)")
PACK_MIN_WORK = 1 << 27   # multiply-adds (M*N*K over the batch) above which packing pays: more than 512^3
PACK_MIN_REUSE = 64   # the rows and columns (each packed value's uses) below which a pack costs more than it saves
# a smaller matmul still packs `b` alone where `b` is strided along the output's contiguous axis (`a @ w.T`, the
# backward of `x @ w`): unpacked, its register tile gathers each vector of `b` from 16 rows one value at a time
PACK_STRIDED_MIN_WORK = 1 << 20
# a conv over short rows reads its strided weight lane by lane unpacked (4-5x slower at batch 1): the copy pays from
# a small conv up (1x64x7x7 3x3: 0.16 -> 0.05 ms, the copy included)
PACK_CHANNELS_MIN_WORK = 1 << 16
COLUMN_LANES, ROW_LANES = 16, 8   # the heuristics' register tile: 16 along the output's contiguous axis, 8 rows

def pack_matmuls(roots: list[UOp], nodes: list[UOp], device_packs: Callable[[str], bool]) -> list[UOp]:
  """`roots` with the operands of every large enough matmul read from packed copies (module docstring); `roots`
  itself when there is none. `nodes` is `toposort(roots)`; `device_packs(device)` says whether a device wants it (a
  host CPU renderer)."""
  if not PACK_MATMUL: return roots
  # sources first: a matmul is packed over its sources as rebuilt, so a matmul that reads an earlier packed one (a
  # transformer's next layer) reads that one's packed graph. Packing each over the original graph and substituting
  # afterwards left the original earlier matmuls inside every later packed one: the anchors' 4-layer transformer
  # then scheduled 99 kernels, layers computed again, instead of 58.
  done: dict[UOp, UOp] = {}
  for node in nodes:
    new_src = tuple(done[s] for s in node.src)
    new = node if new_src == node.src else _labelled(node.replace(src=new_src), node)
    if node.op is Ops.REDUCE_AXIS and isinstance(device := node.device, str) and device_packs(device) and \
       ((packed := _packed_matmul(new)) is not None or (packed := _packed_channels(new)) is not None):
      new = packed
    done[node] = new
  out = [done[r] for r in roots]
  return roots if all(a is b for a, b in zip(out, roots)) else out

def _broadcast_source(operand: UOp) -> tuple[list[UOp], UOp] | None:
  """(the CASTs above it, the EXPAND) of a factor that is a broadcast, possibly cast; None for anything else."""
  casts = []
  while operand.op is Ops.CAST:
    casts.append(operand)
    operand = operand.src[0]
  return (casts, operand) if operand.op is Ops.EXPAND else None

def _packed_matmul(reduce: UOp) -> UOp | None:
  """`reduce` reading its factors from packed copies, or None when it is not a large matmul."""
  op, axes = reduce.arg
  product, above = reduce.src[0], []   # a half product is cast to float before it is summed
  while product.op is Ops.CAST:
    above.append(product)
    product = product.src[0]
  if op is not Ops.ADD or product.op is not Ops.MUL: return None
  shape = product.shape
  if shape is None or not all(type(s) is int for s in shape) or \
     prod(shape) < min(PACK_MIN_WORK, PACK_STRIDED_MIN_WORK): return None
  factors = [_broadcast_source(f) for f in product.src]
  if None in factors: return None
  broadcast = [{i for i, (s, full) in enumerate(zip(ex.src[0].shape, shape)) if s == 1 and full > 1}
               for _, ex in factors]
  # several reduce axes (a 1x1 conv's weight gradient sums over the batch and the image) pack in their order
  if any(r in b for r in axes for b in broadcast) or prod(shape[r] for r in axes) < ROW_LANES: return None
  # c: the output's innermost axis; the factor that varies along it is `b` (16 lanes), the other `a` (8 lanes)
  c = max((i for i in range(len(shape)) if i not in axes and shape[i] > 1), default=None)
  if len(axes) > 1 and (c is None or shape[c] % COLUMN_LANES) and \
     (shape[axes[-1]] < COLUMN_LANES or shape[axes[-1]] % ROW_LANES):   # image rows too short for the sum's vectors
    # a conv's weight gradient, whose innermost output axis is the kernel's width (3): the channels are the columns
    # (the input's windows copied per tap, 9x the input for 3x3, then one packed matmul)
    c = max((i for i in range(len(shape)) if i not in axes and shape[i] % COLUMN_LANES == 0 and
             (i in broadcast[0]) != (i in broadcast[1])), default=None)
  if c is None or (c in broadcast[0]) == (c in broadcast[1]): return None
  ib = 0 if c in broadcast[1] else 1   # factor ib varies along c; factor 1 - ib is broadcast along it
  ia = 1 - ib
  # d: the innermost axis along which `a` varies and `b` is broadcast (the tile's rows)
  d = max((i for i in range(len(shape)) if i not in axes and i != c and i in broadcast[ib] and i not in broadcast[ia]),
          default=None)
  if d is None or shape[c] % COLUMN_LANES or shape[d] % ROW_LANES or min(shape[c], shape[d]) < PACK_MIN_REUSE:
    return None
  if axis_stride(factors[ib][1].src[0], c) == 1 and \
     prod(factors[ia][1].src[0].shape) * factors[ia][1].dtype.itemsize * PACK_A_L2_SHARE <= _l2_bytes(reduce.device):
    # few rows (a 1x1 conv's 64x256 weights over 256x3136 positions): all of `a` stays in L2 while the kernel's tile
    # columns run outside its rows (codegen/opt/heuristic.py `_cache_block`), each panel of a contiguous `b` in L1;
    # a copy of `b` would cost more than its rows save (4x256x56x56 -> 64, one thread: 4.9 ms packed, 2.9 not)
    return None
  packs = ((ib, c, COLUMN_LANES), (ia, d, ROW_LANES))
  if prod(shape) <= PACK_MIN_WORK:   # small: only a `b` that its tile would gather, or that outgrows a share of L2
    stride = axis_stride(factors[ib][1].src[0], c)
    if stride is None: return None
    if stride == 1:
      # `b` as the row tiles sweep it: one batch element's (the reduce axes and the axes `a` is broadcast along)
      panel = prod(s for i, s in enumerate(shape) if i in axes or (i in broadcast[ia] and i not in broadcast[ib]))
      if panel * factors[ib][1].dtype.itemsize * PACK_B_L2_SHARE <= _l2_bytes(reduce.device): return None
    packs = packs[:1]
  elif _rows_stay_in_l1(shape, axes, factors[ia][1].src[0]): packs = packs[:1]
  new = list(product.src)
  for index, axis, lanes in packs:
    casts, expand = factors[index]
    if _is_constant(expand.src[0]): continue   # a broadcast constant reads no memory: nothing to pack
    value = _labelled(UOp(Ops.EXPAND, expand.dtype, (_packed_view(expand, axis, lanes, axes),), expand.arg), expand)
    for cast in reversed(casts): value = _labelled(cast.replace(src=(value,)), cast)
    new[index] = value
  summed = _labelled(product.replace(src=tuple(new)), product)
  for cast in reversed(above): summed = _labelled(cast.replace(src=(summed,)), cast)
  return _labelled(reduce.replace(src=(summed,)), reduce)

def _packed_channels(reduce: UOp) -> UOp | None:
  """`reduce` reading one factor from a copy contiguous along the channels, or None where that does not apply: a
  large sum of a product over any reduce axes whose output rows (its contiguous axis) are short, 7 or 14 wide, and
  one of whose factors varies along another output axis c that 16 divides, strided, while the other factor is
  broadcast along c. A conv's input gradient over ResNet's 7x7 and 14x14 maps reads its flipped weight 9 apart
  along c: copied to (c/16, reduce axes..., 16), each step of the sum reads 16 channels as one vector, and the
  register tile's vectors run along c (kiln/codegen/opt/heuristic.py `_wide_tile`)."""
  op, axes = reduce.arg
  product, above = reduce.src[0], []
  while product.op is Ops.CAST:
    above.append(product)
    product = product.src[0]
  shape = product.shape
  if op is not Ops.ADD or product.op is not Ops.MUL or shape is None or not all(type(s) is int for s in shape) or \
     prod(shape) < PACK_CHANNELS_MIN_WORK: return None
  factors = [_broadcast_source(f) for f in product.src]
  if None in factors: return None
  broadcast = [{i for i, (s, full) in enumerate(zip(ex.src[0].shape, shape)) if s == 1 and full > 1}
               for _, ex in factors]
  outputs = [i for i in range(len(shape)) if i not in axes and shape[i] > 1]
  if not outputs or any(r in b for r in axes for b in broadcast): return None
  inner = outputs[-1]
  # rows that make vectors already, or a kernel's few columns (a weight gradient's 3)
  if shape[inner] >= COLUMN_LANES or shape[inner] % ROW_LANES == 0 or shape[inner] <= 4: return None
  for ib in (0, 1):
    # the factor varies along one output axis alone, the channels, and is broadcast along the rest (a weight)
    channels = [i for i in outputs if i not in broadcast[ib]]
    if len(channels) != 1 or (c := channels[0]) not in broadcast[1 - ib] or shape[c] % COLUMN_LANES: continue
    casts, expand = factors[ib]
    if _is_constant(expand.src[0]) or axis_stride(expand.src[0], c) == 1: continue
    value = _labelled(UOp(Ops.EXPAND, expand.dtype, (_packed_view(expand, c, COLUMN_LANES, axes),), expand.arg),
                      expand)
    for cast in reversed(casts): value = _labelled(cast.replace(src=(value,)), cast)
    new = list(product.src)
    new[ib] = value
    summed = _labelled(product.replace(src=tuple(new)), product)
    for cast in reversed(above): summed = _labelled(cast.replace(src=(summed,)), cast)
    return _labelled(reduce.replace(src=(summed,)), reduce)
  return None

PACK_A_L2_SHARE = 4   # a matmul whose `a` fits in this share of one L2 is not packed (its rows stay in cache)
PACK_B_L2_SHARE = 2   # a smaller matmul packs a contiguous `b` larger than this share of one L2 (module docstring)

A_IN_PLACE = True   # a plain matmul's row-major `a` is read in place, only `b` packed (`_rows_stay_in_l1`)

def _rows_stay_in_l1(shape: tuple, axes: tuple[int, ...], a: UOp) -> bool:
  """Whether a large matmul's `a` is read in place, only `b` packed: a plain matmul (two output axes, one summed)
  whose `a` is contiguous along the sum. Its kernel is blocked by units of tile columns (kiln/codegen/opt/heuristic.py
  `_column_units`): each row tile of `a` (8 rows of a block of the sum) is read from L1 by every tile of the unit,
  so a tile-major copy of `a` costs a pass over it and saves nothing (the figures: bench/RESULTS.md, thirteenth
  session)."""
  outputs = [i for i in range(len(shape)) if i not in axes and shape[i] > 1]
  return A_IN_PLACE and len(outputs) == 2 and len(axes) == 1 and axis_stride(a, axes[0]) == 1

def _l2_bytes(device: str | tuple | None) -> int:
  """One core's L2 on `device`'s target (the renderer's CPU description), 1 MiB where it has none."""
  from kiln.device import Device
  target = getattr(Device[device].renderer, "target", None) if isinstance(device, str) else None
  return target.l2_bytes if target is not None else 1 << 20

def axis_stride(value: UOp, axis: int) -> int | None:
  """The distance in elements between neighbours along `axis` of `value`, a view (PERMUTE, EXPAND, RESHAPE of a
  row-major view or adding and dropping size-1 axes) of something laid out row-major; None for other views.

  >>> from kiln import Tensor
  >>> w = Tensor.empty(512, 10)
  >>> axis_stride(w.uop, 0), axis_stride(w.T.uop, 0), axis_stride(w.T.uop, 1)
  (10, 1, 10)
  """
  chain = []
  while value.op in (Ops.PERMUTE, Ops.EXPAND, Ops.RESHAPE):
    chain.append(value)
    value = value.src[0]
  shape = value.shape
  if shape is None or value.op in GroupOp.Movement: return None   # a SHRINK, PAD or FLIP: not followed here
  strides = _row_major(shape)
  for view in reversed(chain):
    if view.op is Ops.PERMUTE: strides = [strides[i] for i in view.arg]
    elif view.op is Ops.EXPAND:
      strides = [0 if s == 1 and n != 1 else st for s, n, st in zip(view.src[0].shape, view.shape, strides)]
    elif strides == _row_major(view.src[0].shape): strides = _row_major(view.shape)   # RESHAPE of a row-major view
    else:   # any other RESHAPE: only size-1 axes may come or go
      kept = [st for n, st in zip(view.src[0].shape, strides) if n != 1]
      if [n for n in view.src[0].shape if n != 1] != [n for n in view.shape if n != 1]: return None
      it = iter(kept)
      strides = [0 if n == 1 else next(it) for n in view.shape]
  return strides[axis]

def _row_major(shape: tuple) -> list[int]: return [prod(shape[i + 1:]) for i in range(len(shape))]

def _is_constant(value: UOp) -> bool:
  while value.op in GroupOp.Movement or value.op is Ops.UNIQUE: value = value.src[0]
  return value.op is Ops.CONST

def _labelled(node: UOp, like: UOp) -> UOp:
  """`node` with the user-facing label of the node it stands for (DEBUG=2's kernel lines name the user's op)."""
  if node.meta is None: node.meta = like.meta
  return node

def _fuses_a_reduction(value: UOp) -> bool:
  """Whether the kernel computing `value` would contain a reduction: one is reached through elementwise and
  movement ops alone (what the scheduler fuses into a copy of `value`)."""
  stack, seen = [value], {value}
  while stack:
    node = stack.pop()
    if node.op is Ops.REDUCE_AXIS: return True
    if node.op in GroupOp.Elementwise or node.op in GroupOp.Movement or node.op is Ops.UNIQUE:
      for src in node.src:
        if src not in seen:
          seen.add(src)
          stack.append(src)
  return False

def _packed_view(expand: UOp, axis: int, lanes: int, reduce_axes: tuple[int, ...]) -> UOp:
  """The source of `expand` (same shape) read from a contiguous copy laid out as (other axes..., axis/lanes,
  reduce_axes..., lanes)."""
  value = expand.src[0]
  # a value computed by a reduction (the previous matmul) is stored in its own layout first: fused into the pack,
  # that matmul would write the tile-major layout, its vector axis made the rows, and gather every `b` vector
  if _fuses_a_reduction(value): value = _labelled(UOp(Ops.CONTIGUOUS, value.dtype, (value,)), expand)
  shape = value.shape
  split = shape[:axis] + (shape[axis] // lanes, lanes) + shape[axis + 1:]
  lane, reds = axis + 1, tuple(r + (r > axis) for r in reduce_axes)
  order = tuple(i for i in range(len(split)) if i != lane and i not in reds) + reds + (lane,)
  packed = UOp(Ops.CONTIGUOUS, value.dtype, (_labelled(value.reshape(split), expand).permute(order),))
  for node in (packed.src[0], packed): _labelled(node, expand)
  inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
  view = _labelled(packed.permute(inverse), expand)
  return _labelled(view.reshape(shape), expand)

SOFTWARE_MATH = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})   # long polynomial code on host CPUs (codegen/transcendental.py)
EPILOGUE_SPLIT_MIN_WORK = PACK_STRIDED_MIN_WORK   # multiply-adds from which a matmul's costly epilogue is split off

def splits_epilogue(reduce: UOp, users: dict[UOp, list[UOp]], outputs: set[UOp]) -> bool:
  """Whether `reduce`, a float matmul tiled along two output axes (a sum of a product of two broadcasts, each
  varying along an output axis of at least PACK_MIN_REUSE where the other is broadcast) of at least
  EPILOGUE_SPLIT_MIN_WORK multiply-adds, should be stored before its epilogue: the elementwise and movement ops
  between it and the kernel output (one of `outputs`) it reaches, or the values they combine it with in that kernel,
  include SOFTWARE_MATH (module docstring). `users` maps each node to the nodes that read it."""
  op, axes = reduce.arg
  product = reduce.src[0]
  while product.op is Ops.CAST: product = product.src[0]
  shape = product.shape
  if op is not Ops.ADD or product.op is not Ops.MUL or not dtypes.is_float(product.dtype) or shape is None or \
     not all(type(s) is int for s in shape) or prod(shape) < EPILOGUE_SPLIT_MIN_WORK: return False
  factors = [_broadcast_source(f) for f in product.src]
  if None in factors: return False
  broadcast = [{i for i, (s, full) in enumerate(zip(ex.src[0].shape, shape)) if s == 1 and full > 1}
               for _, ex in factors]
  tiled = [i for i in range(len(shape)) if i not in axes and shape[i] >= PACK_MIN_REUSE]
  if not all(any(i in broadcast[f] and i not in broadcast[1 - f] for i in tiled) for f in (0, 1)): return False
  # the kernel's nodes after the sum, and the values they combine it with inside the kernel (a gate's silu beside
  # the up projection it multiplies)
  def in_kernel(node: UOp) -> bool:
    return node not in outputs and (node.op in GroupOp.Elementwise or node.op in GroupOp.Movement)
  after, beside, seen = [reduce], [], {reduce}
  while after or beside:
    node, downstream = (after.pop(), True) if after else (beside.pop(), False)
    if node.op in SOFTWARE_MATH: return True
    for src in node.src if node is not reduce else ():
      if src not in seen and in_kernel(src):
        seen.add(src)
        beside.append(src)
    for user in users[node] if downstream and (node is reduce or node not in outputs) else ():
      if user not in seen and (user in outputs or in_kernel(user)):
        seen.add(user)
        after.append(user)
  return False
