"""Autograd as rewrite rules: each rule maps (node, gradient of its output) to the gradients of its sources."""
from __future__ import annotations
import math
from typing import Callable
from kiln.dtype import dtypes
from kiln.helpers import argsort, deep_recursion
from kiln.uop.ops import UOp, Ops, toposort
from kiln.uop.pattern import UPat, PatternMatcher

def _reduce_to(grad: UOp, shape: tuple[int, ...]) -> UOp:
  """Sum the broadcast axes of `grad` back down to `shape`."""
  axes = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
  if axes and grad.dtype in dtypes.narrow_floats:
    # a broadcast's gradient sums in float32 and rounds once, as a forward half sum does (a half bias over a batch)
    return grad.cast(dtypes.float32).r(Ops.ADD, axes).cast(grad.dtype)
  return grad.r(Ops.ADD, axes)

def grad_max(g: UOp, a: UOp, b: UOp):
  """max(a, b): the larger input gets the gradient; ties split it evenly"""
  a_wins, tie = b.alu(Ops.CMPLT, a), a.alu(Ops.CMPEQ, b)
  share_a = a_wins.where(g.full_like(1.0), tie.where(g.full_like(0.5), g.full_like(0.0)))
  return g * share_a, g * (g.full_like(1.0) - share_a)

def grad_reduce_max(g: UOp, x: UOp, ret: UOp):
  """max over axes: the gradient goes to the maxima, shared among ties"""
  axes = ret.arg[1]
  is_max = x.alu(Ops.CMPEQ, ret.expand(x.shape))
  mask = is_max.where(x.full_like(1.0), x.full_like(0.0))
  count = mask.r(Ops.ADD, axes)
  return ((mask * (g / count).expand(x.shape)),)

def grad_reduce_prod(g: UOp, x: UOp, ret: UOp):
  """prod over axes: d/dx_i is the product of the others (ret/x_i, computed without dividing by zero)"""
  axes = ret.arg[1]
  zero = x.alu(Ops.CMPEQ, x.full_like(0.0))
  nonzero_prod = zero.where(x.full_like(1.0), x).r(Ops.MUL, axes).expand(x.shape)
  zero_count = zero.where(x.full_like(1.0), x.full_like(0.0)).r(Ops.ADD, axes).expand(x.shape)
  only_zero = zero_count.alu(Ops.CMPEQ, x.full_like(1.0))
  others = zero.where(only_zero.where(nonzero_prod, x.full_like(0.0)), ret.expand(x.shape) / zero.where(x.full_like(1.0), x))
  return (g.expand(x.shape) * others,)

# the gradient of a reduction by its op: a sum broadcasts the gradient back over the reduced axes
REDUCE_GRADIENTS = {Ops.ADD: lambda g, x, ret: (g.expand(x.shape),), Ops.MAX: grad_reduce_max, Ops.MUL: grad_reduce_prod}

def grad_pow(g: UOp, a: UOp, b: UOp, ret: UOp):
  """a**b: d/da = b*a**(b-1), d/db = a**b*ln(a) (0 where a <= 0)"""
  da = g * b * a.alu(Ops.POW, b - b.full_like(1.0))
  positive = a.full_like(0.0).alu(Ops.CMPLT, a)
  log_a = positive.where(a, a.full_like(1.0)).alu(Ops.LOG2) * a.full_like(math.log(2))
  db = g * ret * log_a
  return da, db

def grad_cast(g: UOp, x: UOp, ret: UOp) -> UOp | None:
  """cast(x): the gradient cast back to x's dtype; none through a bool or int value (x.bool(), x.int(): as in
  PyTorch, such a tensor cannot require a gradient, and a gradient reaching a bool reduction would divide bools)"""
  if not (dtypes.is_float(ret.dtype) and dtypes.is_float(x.dtype)): return None
  return g.cast(x.dtype)

def grad_multi(g: UOp, ret: UOp) -> tuple[UOp, ...]:
  """a value over several devices: each slice gets its device's part of the gradient, laid out as the value is
  (MSELECT, lowered in kiln/schedule/multi.py); of replicas, which all stand for one value, the first gets it"""
  bounds, start = [], 0
  for s in ret.src:
    size = s.shape[ret.arg] if ret.arg is not None else 0
    bounds.append((start, start + size))
    start += size
  if ret.arg is None: return (UOp(Ops.MSELECT, g.dtype, (g,), (0, ret.src[0].device, None, None)),) + (None,) * (len(ret.src) - 1)
  return tuple(UOp(Ops.MSELECT, g.dtype, (g,), (i, s.device, ret.arg, tuple(bounds))) for i, s in enumerate(ret.src))

# CUSTOM_BACKWARD rules by name: rule(gradient, node) -> the gradients of node.src[1:] (None where there is none)
custom_backward_rules: dict[str, Callable[[UOp, UOp], tuple[UOp | None, ...]]] = {}

def custom_backward(value: UOp, inputs: tuple[UOp, ...], name: str, params: tuple) -> UOp:
  """`value` with its backward replaced by the rule registered as `name` in `custom_backward_rules`: the rule gets
  the gradient of `value` and this node (`inputs` are `node.src[1:]`, `params` is `node.arg[1]`) and returns the
  gradients of `inputs`; nothing flows back through the graph of `value` itself. The scheduler and the lowerer see
  `value` alone."""
  if name not in custom_backward_rules: raise KeyError(f"custom_backward: no rule registered as {name!r}")
  return UOp(Ops.CUSTOM_BACKWARD, value.dtype, (value, *inputs), (name, params))

gradient_rules = PatternMatcher([
  (UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), lambda ctx, a, b: (ctx, ctx)),
  (UPat(Ops.SUB, src=(UPat.var("a"), UPat.var("b"))), lambda ctx, a, b: (ctx, ctx.alu(Ops.NEG))),
  (UPat(Ops.MUL, src=(UPat.var("a"), UPat.var("b"))), lambda ctx, a, b: (ctx * b, ctx * a)),
  (UPat(Ops.FDIV, src=(UPat.var("a"), UPat.var("b"))), lambda ctx, a, b: (ctx / b, (ctx * a).alu(Ops.NEG) / (b * b))),
  (UPat(Ops.NEG, src=(UPat.var("x"),)), lambda ctx, x: (ctx.alu(Ops.NEG),)),
  (UPat(Ops.RECIP, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: ((ctx * ret * ret).alu(Ops.NEG),)),
  (UPat(Ops.SQRT, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: (ctx / (ret * ret.full_like(2.0)),)),
  (UPat(Ops.EXP2, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: (ctx * ret * ret.full_like(math.log(2)),)),
  (UPat(Ops.LOG2, src=(UPat.var("x"),)), lambda ctx, x: (ctx / (x * x.full_like(math.log(2))),)),
  (UPat(Ops.SIN, src=(UPat.var("x"),)), lambda ctx, x: (ctx * (x.full_like(math.pi / 2) - x).alu(Ops.SIN),)),
  (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b"))), lambda ctx, a, b: grad_max(ctx, a, b)),
  (UPat(Ops.POW, src=(UPat.var("a"), UPat.var("b")), name="ret"), lambda ctx, a, b, ret: grad_pow(ctx, a, b, ret)),
  (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("b"))),
   lambda ctx, c, a, b: (None, c.where(ctx, ctx.full_like(0.0)), c.where(ctx.full_like(0.0), ctx))),
  (UPat(Ops.CAST, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: (grad_cast(ctx, x, ret),)),
  (UPat(Ops.RESHAPE, src=(UPat.var("x"),)), lambda ctx, x: (ctx.reshape(x.shape),)),
  (UPat(Ops.PERMUTE, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: (ctx.permute(tuple(argsort(ret.arg))),)),
  (UPat(Ops.EXPAND, src=(UPat.var("x"),)), lambda ctx, x: (_reduce_to(ctx, x.shape),)),
  (UPat(Ops.PAD, src=(UPat.var("x"),), name="ret"),
   lambda ctx, x, ret: (ctx.shrink(tuple((b, b + s) for (b, _), s in zip(ret.arg, x.shape))),)),
  (UPat(Ops.SHRINK, src=(UPat.var("x"),), name="ret"),
   lambda ctx, x, ret: (ctx.pad(tuple((b, s - e) for (b, e), s in zip(ret.arg, x.shape))),)),
  (UPat(Ops.FLIP, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: (ctx.flip(ret.arg),)),
  (UPat(Ops.REDUCE_AXIS, src=(UPat.var("x"),), name="ret"), lambda ctx, x, ret: REDUCE_GRADIENTS[ret.arg[0]](ctx, x, ret)),
  (UPat((Ops.CONTIGUOUS, Ops.ASSIGN), name="ret"), lambda ctx, ret: (ctx,) + (None,) * (len(ret.src) - 1)),
  (UPat(Ops.CONTIGUOUS_BACKWARD), lambda ctx: (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)),)),
  (UPat(Ops.UNIQUE), lambda ctx: (ctx,)),
  (UPat(Ops.CUSTOM_BACKWARD, name="ret"), lambda ctx, ret: (None, *custom_backward_rules[ret.arg[0]](ctx, ret))),
  (UPat(Ops.COPY, src=(UPat.var("x"),)), lambda ctx, x: (ctx.copy_to(x.device),)),
  (UPat(Ops.MULTI, name="ret"), lambda ctx, ret: grad_multi(ctx, ret)),
])

# ops whose output does not depend differentiably on their inputs
NO_GRADIENT = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
                         Ops.TRUNC, Ops.DETACH, Ops.BITCAST, Ops.IOTA, Ops.CONST, Ops.BUFFER, Ops.BIND})

@deep_recursion
def gradient_graph(root: UOp, whole: bool = False) -> list[UOp]:
  """Nodes under `root`, sources first, following a realized node to the graph it came from (`origin`).
  Unless `whole`, the sources of ops without gradients are left out."""
  def inputs(node: UOp) -> tuple[UOp, ...]:
    if node.origin is not None: return (node.origin,)
    return () if node.op in NO_GRADIENT and not whole else node.src
  return toposort([root], sources=inputs)

def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp], order: list[UOp] | None = None) -> dict[UOp, UOp]:
  """Gradients of `root` with respect to every node in `targets`, as new graph nodes (reverse mode, iterative).
  `order` is `gradient_graph(root)` or `gradient_graph(root, whole=True)` when the caller has walked it already."""
  if order is None: order = gradient_graph(root)
  # only nodes on a path from root to a target matter (a path through an op without gradients is none)
  on_path: set[UOp] = set()
  mark = on_path.add
  for node in order:
    if node in targets: mark(node)
    elif node.origin is not None:
      if node.origin in on_path: mark(node)
    elif node.op not in NO_GRADIENT:
      for s in node.src:
        if s in on_path:
          mark(node)
          break
  grads: dict[UOp, UOp] = {root: root_grad}
  for node in reversed(order):
    if node not in grads: continue
    if node.origin is not None:   # a realized value: its gradient flows on into the graph it was computed by
      if node.origin in on_path: _accumulate(grads, node.origin, grads[node])
      continue
    if node.op in NO_GRADIENT or not node.src or not any(s in on_path for s in node.src): continue
    src_grads = gradient_rules.rewrite(node, grads[node])
    if src_grads is None: raise RuntimeError(f"backward: no gradient rule for {node.op}")
    for src, g in zip(node.src, src_grads):
      if g is None or src not in on_path: continue
      if g.dtype != src.dtype and dtypes.is_float(src.dtype): g = g.cast(src.dtype)
      _accumulate(grads, src, g)
  return {t: grads[t] for t in targets if t in grads}

def _accumulate(grads: dict[UOp, UOp], node: UOp, g: UOp) -> None:
  grads[node] = grads[node] + g if node in grads else g
