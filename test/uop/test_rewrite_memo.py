"""graph_rewrite's memory of pure matchers across calls, and the rule dispatch by op and dtype: both only save work,
so every result must equal what a fresh, non-remembering matcher gives."""
from __future__ import annotations
import random
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import PatternMatcher, UPat, graph_rewrite
from kiln.uop.symbolic import symbolic

def _forgetful(pm: PatternMatcher) -> PatternMatcher:
  """The same rules without the memory across calls."""
  return PatternMatcher(pm.rules, pure=False)

def _random_index(rng: random.Random, ranges: list[UOp], depth: int) -> UOp:
  if depth == 0: return rng.choice(ranges + [UOp.const(dtypes.int32, rng.randint(-3, 9))])
  a, b = _random_index(rng, ranges, depth - 1), _random_index(rng, ranges, depth - 1)
  op = rng.choice(["add", "mul", "div", "mod", "lt"])
  if op == "add": return a + b
  if op == "mul": return a * rng.randint(-2, 5)
  if op == "div": return a // rng.randint(1, 6)
  if op == "mod": return a % rng.randint(1, 6)
  return a.lt(b).where(a, b + 1)

def test_remembered_results_equal_fresh_rewrites():
  assert symbolic.pure
  fresh = _forgetful(symbolic)
  rng = random.Random(0)
  ranges = [UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), i) for i, n in enumerate((4, 7, 16))]
  exprs = [_random_index(rng, ranges, 4) for _ in range(120)]
  # rewrite shared subexpressions in several calls (the memory is used from the second call on), then compare
  remembered = [graph_rewrite(e, symbolic) for e in exprs] + [graph_rewrite(e, symbolic) for e in exprs]
  for expr, got in zip(exprs + exprs, remembered):
    want = graph_rewrite(expr, fresh)
    assert got is want, f"{expr.render()}: remembered {got.render()} != fresh {want.render()}"

def test_memory_is_not_used_with_a_context_or_an_impure_matcher():
  calls = []
  def count(ctx, x):
    """x*1 -> x (counting calls)"""
    calls.append(ctx)
    return x
  rule = (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), count)
  expr = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 5),), 0) * 1
  pure = PatternMatcher([rule], pure=True)
  graph_rewrite(expr, pure, ctx="a"); graph_rewrite(expr, pure, ctx="b")
  assert calls == ["a", "b"]   # a context may change the result: not remembered
  impure = PatternMatcher([rule])
  graph_rewrite(expr, impure); graph_rewrite(expr, impure)
  assert len(calls) == 4
  graph_rewrite(expr, pure); graph_rewrite(expr, pure)
  assert len(calls) == 5   # pure, no context: the second call finds the result
  assert not (pure + impure).pure and (pure + pure).pure

def test_rules_are_dispatched_by_dtype():
  int_only = PatternMatcher([(UPat(Ops.ADD, dtype=dtypes.int32, src=(UPat.var("x"), UPat.const(None, 0))),
                              lambda x: x)])
  r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 5),), 0)
  f = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r))
  assert int_only.rules_for(Ops.ADD, dtypes.float32) == []
  assert len(int_only.rules_for(Ops.ADD, dtypes.int32)) == 1
  assert graph_rewrite(r + 0, int_only) is r
  assert graph_rewrite(f + 0.0, int_only) is (f + 0.0)

def _first_match_by_trying_every_rule(pm: PatternMatcher, u: UOp) -> UOp | None:
  """What `pm.rewrite(u)` must give: every rule in order, without the dispatch tables."""
  for pat, fn in pm.rules:
    for bindings in pat.match(u, {}):
      if (ret := fn(**bindings)) is not None and ret is not u: return ret
  return None

def test_dispatch_by_source_ops_and_dtypes_finds_every_match():
  # rewrite looks rules up by (op, dtype, the sources' ops and dtypes): each node must get the rule a full scan finds,
  # for nodes whose sources are constants, sums, loads, of int and float dtypes, in either order
  r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 8),), 0)
  f = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r))
  leaves = [r, r + 3, r * 2, r // 2, UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, -4)]
  floats = [f, f * 2.0, UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.float32, -0.0)]
  nodes = []
  for group in (leaves, floats):
    for a in group:
      for b in group:
        nodes += [UOp(op, a.dtype, (a, b)) for op in (Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX)]
        nodes += [a.alu(Ops.CMPLT, b), a.alu(Ops.CMPNE, b)]
        if dtypes.is_int(a.dtype): nodes += [UOp(Ops.IDIV, a.dtype, (a, b)), UOp(Ops.MOD, a.dtype, (a, b))]
      nodes += [UOp(Ops.NEG, a.dtype, (a,)), a.cast(dtypes.float32 if dtypes.is_int(a.dtype) else dtypes.int32)]
  nodes += [UOp(Ops.NEG, dtypes.float32, (UOp(Ops.NEG, dtypes.float32, (f,)),)), f.lt(1.0).where(f, f)]
  matched = 0
  for u in nodes:
    want = _first_match_by_trying_every_rule(symbolic, u)
    assert symbolic.rewrite(u) is want, f"{u.op} of {[s.op for s in u.src]}: dispatch disagrees with a full scan"
    matched += want is not None
  assert matched > len(nodes) // 4   # the nodes do exercise rules, not only misses
