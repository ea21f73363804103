"""Symbolic ints (`sint`): shape entries that are either Python ints or int expressions over bound Variables.

A tensor built with a bound Variable (`Variable("n", 1, 10).bind(4)`, a BIND node) has shape entries that are UOps
such as `n+1`. These helpers simplify them to one canonical node (so equal sizes are the same node and `is`/`==`
compare them), read their bound value, their largest possible value, and print them.

>>> from kiln.uop.ops import Variable
>>> n = Variable("n", 1, 10).bind(4)
>>> ssimplify((n + 1) - n), sint_value(n * 2), sint_max(n + 1), sint_str(n + 1)
(1, 8, 11, '(n+1)')
"""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort
from kiln.uop.pattern import substitute

sint = int | UOp
_INT = dtypes.int32

def is_symbolic(x) -> bool:
  """True for a UOp shape entry (an expression over Variables), False for a plain int."""
  return isinstance(x, UOp)

def is_symbolic_shape(shape) -> bool:
  """True when any entry of `shape` is symbolic."""
  return any(isinstance(s, UOp) for s in shape)

def binds_of(x: UOp) -> list[UOp]:
  """The BIND nodes under `x`, in graph order."""
  return [u for u in x.toposort() if u.op is Ops.BIND]

def _unbound(x: UOp) -> tuple[UOp, dict[UOp, UOp]]:
  """`x` with each BIND replaced by its Variable, and the map back (Variable -> BIND)."""
  binds = binds_of(x)
  if not binds: return x, {}
  back: dict[UOp, UOp] = {}
  for b in binds:
    var = b.src[0]
    if var in back and back[var] is not b:
      raise ValueError(f"Variable {var.arg[0]!r} is bound to both {back[var].src[1].arg} and {b.src[1].arg} "
                       "in one expression")
    back[var] = b
  return substitute(x, {b: b.src[0] for b in binds}), back

def ssimplify(x: sint) -> sint:
  """`x` simplified: a plain int when it is constant, else one canonical expression (its BINDs kept)."""
  if not isinstance(x, UOp): return x
  if x.op is Ops.BIND or x.op is Ops.DEFINE_VAR: return x
  if x.op is Ops.CONST: return x.arg
  free, back = _unbound(x)
  simple = free.simplify()
  if simple.op is Ops.CONST: return simple.arg
  return substitute(simple, back) if back else simple

def sint_value(x: sint) -> int:
  """The int value of `x` with every Variable at its bound value (a ValueError for an unbound Variable)."""
  if not isinstance(x, UOp): return x
  nodes = x.toposort()
  values = {u: u.src[1] for u in nodes if u.op is Ops.BIND}
  bound = {b.src[0] for b in values}
  for u in nodes:
    if u.op is Ops.DEFINE_VAR and u not in bound:
      raise ValueError(f"the size {sint_str(x)} uses the unbound Variable {u.arg[0]!r}; bind it to a value first")
  out = substitute(x, values).simplify()
  if out.op is not Ops.CONST: raise ValueError(f"the size {sint_str(x)} has no constant value")
  return out.arg

def sint_max(x: sint) -> int:
  """The largest value `x` can take over its Variables' ranges."""
  return x if not isinstance(x, UOp) else int(ssimplify_node(x).vmax)

def sint_min(x: sint) -> int:
  """The smallest value `x` can take over its Variables' ranges."""
  return x if not isinstance(x, UOp) else int(ssimplify_node(x).vmin)

def ssimplify_node(x: UOp) -> UOp:
  """`x` simplified over its Variables (BINDs replaced by their Variables), as a node."""
  return _unbound(x)[0].simplify()

def sint_str(x: sint) -> str:
  """`x` as short text: '4', 'n', '(n+1)'."""
  if not isinstance(x, UOp): return str(x)
  return _unbound(x)[0].render() if x.op is not Ops.DEFINE_VAR else x.arg[0]

def sint_eq(a: sint, b: sint) -> bool:
  """True when `a` and `b` are the same size for every value of their Variables (the same canonical expression)."""
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a == b
  return ssimplify(a) is ssimplify(b) if isinstance(ssimplify(a), UOp) else ssimplify(a) == ssimplify(b)

def sprod(xs) -> sint:
  """The product of sizes, simplified (an int when all are ints)."""
  out: sint = 1
  symbolic = False
  for x in xs:
    if isinstance(x, UOp): symbolic = True
    out = out * x
  return ssimplify(out) if symbolic else out

def sadd(a: sint, b: sint) -> sint:
  """a + b, simplified."""
  return a + b if not isinstance(a, UOp) and not isinstance(b, UOp) else ssimplify(_as_node(a) + b)

def ssub(a: sint, b: sint) -> sint:
  """a - b, simplified."""
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a - b
  if isinstance(b, int) and b == 0: return a
  return ssimplify(_as_node(a) - b)

def _as_node(x: sint) -> UOp:
  return x if isinstance(x, UOp) else UOp.const(_INT, x)

def variables_of(nodes) -> list[UOp]:
  """The BIND nodes inside sizes `nodes` (ints skipped), each once."""
  roots = [n for n in nodes if isinstance(n, UOp)]
  return [u for u in toposort(roots) if u.op is Ops.BIND] if roots else []
