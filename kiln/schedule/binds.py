"""Bound Variables leave the kernel AST: each BIND becomes its Variable (DEFINE_VAR) and its value goes to `var_vals`.

A tensor graph carries bound Variables (`BIND(DEFINE_VAR, CONST value)`) in two places: as nodes (a Variable used
as a value) and inside the args of movement ops (a symbolic shape, shrink bound or pad amount). A kernel must not
depend on the values, so that one compiled program serves every value: here every BIND, in both places, is replaced
by its DEFINE_VAR, and the values are returned beside the AST. The runner passes them at launch (docs/ir.md).
"""
from __future__ import annotations
from kiln.uop.ops import UOp, Ops, GroupOp, toposort
from kiln.uop.pattern import substitute

def _has_uop(arg) -> bool:
  if isinstance(arg, UOp): return True
  if isinstance(arg, tuple): return any(_has_uop(a) for a in arg)
  return False

def strip_binds(ast: UOp) -> tuple[UOp, dict[UOp, int]]:
  """`ast` with its BINDs replaced by their Variables, and {Variable: bound value}.

  A Variable bound to two different values in one kernel is a ValueError (the kernel can take only one).

  >>> from kiln.uop.ops import Variable
  >>> n = Variable("n", 1, 8)
  >>> ast, vals = strip_binds(n.bind(3) + 1)
  >>> ast is n + 1, vals == {n: 3}
  (True, True)
  """
  nodes = toposort([ast])
  if not any(u.op is Ops.BIND or (u.op in GroupOp.Movement and _has_uop(u.arg)) for u in nodes): return ast, {}
  var_vals: dict[UOp, int] = {}
  def record(bind: UOp) -> UOp:
    var, value = bind.src[0], bind.src[1].arg
    if var_vals.setdefault(var, value) != value:
      raise ValueError(f"Variable {var.arg[0]!r} is bound to both {var_vals[var]} and {value} in one kernel; "
                       "bind it to one value per realize")
    return var
  def unbind_size(x: UOp) -> UOp:
    binds = [u for u in x.toposort() if u.op is Ops.BIND]
    return substitute(x, {b: record(b) for b in binds}) if binds else x
  def unbind_arg(arg):
    if isinstance(arg, UOp): return unbind_size(arg)
    if isinstance(arg, tuple): return tuple(unbind_arg(a) for a in arg)
    return arg
  memo: dict[UOp, UOp] = {}
  for node in nodes:
    if node.op is Ops.BIND:
      memo[node] = record(node)
      continue
    src = tuple(memo[s] for s in node.src)
    arg = unbind_arg(node.arg) if node.op in GroupOp.Movement and _has_uop(node.arg) else node.arg
    memo[node] = node if arg is node.arg and all(a is b for a, b in zip(src, node.src)) else \
      UOp(node.op, node.dtype, src, arg)
  return memo[ast], var_vals
