"""A lowered kernel's loop axes, and the actions (Opts) that reshape its loops.

Every action is a rewrite of the lowered graph itself, so every renderer (C, Python, LLVM IR) gets the optimized
kernel without knowing about the optimizer:
- UPCAST an output axis by k: its loop becomes `r_outer` and the graph is copied k times with `r = r_outer*k + c`
  (c = 0..k-1); each copy has its own STORE and its own REDUCEs, so k accumulators live side by side (register
  tiling). The copies share every node that does not depend on `r` (hash-consing), e.g. a matmul's loads of `a`.
- UNROLL a reduce axis by k: the REDUCE sums k substituted copies of its value per iteration of `r_outer`.
- SWAP two axes of one kind: the loops are reordered (the linearizer opens loops in loop-id order).
An action that does not fit the kernel raises KernelOptError and leaves the kernel as it was.
"""
from __future__ import annotations
import enum
from dataclasses import dataclass
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort, identity_element
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic

class KernelOptError(ValueError):
  """An optimization action that does not apply to this kernel (wrong axis kind, size that does not divide, ...)."""

class OptOps(enum.Enum):
  """The kinds of action: UPCAST (output axis), UNROLL (reduce axis), SWAP (two axes of one kind)."""
  UPCAST = "upcast"; UNROLL = "unroll"; SWAP = "swap"
  def __repr__(self) -> str: return f"OptOps.{self.name}"

@dataclass(frozen=True)
class Opt:
  """One action: `op` on axis number `axis` of the kernel's current axes; `arg` is the split factor (UPCAST,
  UNROLL) or the other axis number (SWAP)."""
  op: OptOps
  axis: int
  arg: int
  def __repr__(self) -> str: return f"Opt({self.op!r}, {self.axis}, {self.arg})"

MAX_UNROLLED = 256   # the most copies of a kernel's body that UPCASTs and UNROLLs may make together

def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with every node in `mapping` replaced by its value (values are not searched again)."""
  done: dict[UOp, UOp] = {}
  for node in toposort([root]):
    if node in mapping: done[node] = mapping[node]; continue
    new_src = tuple(done[s] for s in node.src)
    done[node] = node if all(a is b for a, b in zip(new_src, node.src)) else node.replace(src=new_src)
  return done[root]

def _balanced(op: Ops, values: list[UOp]) -> UOp:
  """op(v0, v1, ...) as a balanced tree, so the partial results do not wait on each other."""
  while len(values) > 1:
    pairs = [UOp(op, values[i].dtype, (values[i], values[i + 1])) for i in range(0, len(values) - 1, 2)]
    values = pairs + ([values[-1]] if len(values) % 2 else [])
  return values[0]

class Kernel:
  """A lowered kernel (`SINK(STORE...)` over RANGEs and REDUCEs) and the actions applied to it so far.

  `axes` lists its loops: output axes in loop order, then reduce axes in loop order. An Opt names an axis by its
  position in this list, as it is when the Opt is applied (splits keep positions; a split that leaves a loop of one
  iteration removes the axis).
  """
  def __init__(self, sink: UOp):
    if sink.op is not Ops.SINK: raise KernelOptError(f"Kernel: expected a lowered SINK, got {sink.op.name}")
    self.sink = sink
    self.applied: list[Opt] = []
    self.unrolled = 1   # copies of the body made so far

  # ---- axes ----
  @property
  def reduce_axes(self) -> list[UOp]:
    """The loop ranges that REDUCEs reduce over, in loop order."""
    found = {r: None for u in toposort([self.sink]) if u.op is Ops.REDUCE for r in u.src[1:]}
    return sorted(found, key=lambda r: r.arg)

  @property
  def output_axes(self) -> list[UOp]:
    """The loop ranges of the output, in loop order."""
    reduced = set(self.reduce_axes)
    return sorted((u for u in toposort([self.sink]) if u.op is Ops.RANGE and u not in reduced), key=lambda r: r.arg)

  @property
  def axes(self) -> list[UOp]:
    """Output axes, then reduce axes."""
    return self.output_axes + self.reduce_axes

  def is_reduce(self, axis: int) -> bool:
    """Whether axis number `axis` is a reduce axis."""
    return axis >= len(self.output_axes)

  @staticmethod
  def size(rng: UOp) -> int | None:
    """The trip count of a loop range, or None when it is symbolic."""
    return rng.src[0].arg if rng.src[0].op is Ops.CONST else None

  # ---- actions ----
  def apply(self, opt: Opt) -> Kernel:
    """Apply `opt` in place (returns self), or raise KernelOptError and change nothing."""
    axes = self.axes
    if not isinstance(opt, Opt): raise KernelOptError(f"Kernel.apply: expected an Opt, got {opt!r}")
    if not 0 <= opt.axis < len(axes):
      raise KernelOptError(f"{opt}: the kernel has {len(axes)} axes (sizes {[self.size(r) for r in axes]})")
    rng = axes[opt.axis]
    if opt.op is OptOps.SWAP: new_sink = self._swap(opt, axes)
    elif opt.op in (OptOps.UPCAST, OptOps.UNROLL):
      if opt.op is OptOps.UPCAST and self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is a reduce axis; UPCAST splits output axes (use UNROLL)")
      if opt.op is OptOps.UNROLL and not self.is_reduce(opt.axis):
        raise KernelOptError(f"{opt}: axis {opt.axis} is an output axis; UNROLL splits reduce axes (use UPCAST)")
      size, amount = self.size(rng), opt.arg
      if size is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
      if not isinstance(amount, int) or amount < 2 or size % amount != 0:
        raise KernelOptError(f"{opt}: the amount must be an integer >= 2 that divides the axis size {size}")
      if self.unrolled * amount > MAX_UNROLLED:
        raise KernelOptError(f"{opt}: the kernel body would be copied {self.unrolled * amount} times "
                             f"(at most {MAX_UNROLLED})")
      new_sink = self._upcast(rng, amount) if opt.op is OptOps.UPCAST else self._unroll(rng, amount)
      self.unrolled *= amount
    else: raise KernelOptError(f"Kernel.apply: unknown action {opt.op!r}")
    self.sink = graph_rewrite(new_sink, symbolic, name="opt")
    self.applied.append(opt)
    return self

  def _swap(self, opt: Opt, axes: list[UOp]) -> UOp:
    """Two axes of one kind trade loop positions (their loop ids)."""
    if not isinstance(opt.arg, int) or not 0 <= opt.arg < len(axes) or opt.arg == opt.axis:
      raise KernelOptError(f"{opt}: the other axis must be a different axis number below {len(axes)}")
    if self.is_reduce(opt.axis) != self.is_reduce(opt.arg):
      raise KernelOptError(f"{opt}: cannot swap an output axis with a reduce axis (reductions stay inside)")
    a, b = axes[opt.axis], axes[opt.arg]
    return substitute(self.sink, {a: a.replace(arg=b.arg), b: b.replace(arg=a.arg)})

  @staticmethod
  def _split(rng: UOp, amount: int) -> tuple[UOp | None, list[UOp]]:
    """The outer range of `rng` split by `amount` (None when it would run once) and `rng` in terms of it, per lane."""
    outer_size = rng.src[0].arg // amount
    outer = rng.replace(src=(UOp.const(dtypes.int32, outer_size),)) if outer_size > 1 else None
    base = outer * amount if outer is not None else UOp.const(dtypes.int32, 0)
    return outer, [base + lane for lane in range(amount)]

  def _upcast(self, rng: UOp, amount: int) -> UOp:
    _, lanes = self._split(rng, amount)
    stores: dict[UOp, None] = {}
    for store in self.sink.src:
      for lane in lanes: stores[substitute(store, {rng: lane})] = None
    return self.sink.replace(src=tuple(stores))

  def _unroll(self, rng: UOp, amount: int) -> UOp:
    outer, lanes = self._split(rng, amount)
    replaced: dict[UOp, UOp] = {}
    for red in toposort([self.sink]):
      if red.op is not Ops.REDUCE or rng not in red.src[1:]: continue
      value = _balanced(red.arg, [substitute(red.src[0], {rng: lane}) for lane in lanes])
      ranges = tuple(outer if r is rng else r for r in red.src[1:] if r is not rng or outer is not None)
      if ranges: replaced[red] = red.replace(src=(value,) + ranges)
      else:   # the whole reduction is unrolled: combine with the identity as the loop would have
        identity = UOp.const(red.dtype, identity_element(red.arg, red.dtype))
        replaced[red] = UOp(red.arg, red.dtype, (identity, value))
    return substitute(self.sink, replaced)

  # ---- for search ----
  def possible_opts(self, amounts: tuple[int, ...] = (2, 3, 4, 8, 16)) -> list[Opt]:
    """Every action that would apply to the kernel as it is now (what BEAM search and the tests enumerate)."""
    axes, n_out = self.axes, len(self.output_axes)
    opts = []
    for axis, rng in enumerate(axes):
      size = self.size(rng)
      op = OptOps.UNROLL if axis >= n_out else OptOps.UPCAST
      if size is not None:
        opts += [Opt(op, axis, k) for k in amounts if size % k == 0 and self.unrolled * k <= MAX_UNROLLED]
      other_kind = range(n_out, len(axes)) if axis >= n_out else range(n_out)
      opts += [Opt(OptOps.SWAP, axis, other) for other in other_kind if other > axis]
    return opts
