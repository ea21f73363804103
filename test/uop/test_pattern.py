"""UPat, PatternMatcher and graph_rewrite: matching, bindings, ctx, traversal order, fixed points, memoization, depth."""
from __future__ import annotations
import pytest
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import UPat, PatternMatcher, graph_rewrite, substitute

I32 = dtypes.int32
a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)

def c(value, dtype=I32) -> UOp: return UOp.const(dtype, value)

def matches(pat: UPat, u: UOp) -> list[dict]: return pat.match(u, {})

# ---------------------------------------------------------------------------------------------------------------------
# matching

def test_list_src_matches_in_any_order():
  pat = UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("k")])
  for u in (a + 3, c(3) + a):
    (bound,) = matches(pat, u)
    assert bound["x"] is a and bound["k"] is c(3)

def test_tuple_src_matches_in_order_only():
  pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k")))
  assert matches(pat, a + 3) and not matches(pat, c(3) + a)

def test_operator_built_patterns_are_commutative():
  pat = UPat.var("x") * 2
  assert matches(pat, a * 2) and matches(pat, c(2) * a) and not matches(pat, a * 3)

def test_named_bindings_must_be_the_same_node():
  pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
  assert matches(pat, a + a)[0]["x"] is a
  assert not matches(pat, a + b)
  nested = UPat(Ops.MUL, src=[UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")]), UPat.var("y")])
  assert matches(nested, (a + b) * b) and matches(nested, b * (b + a)) and not matches(nested, (a + b) * a + 0 * a)

def test_commutative_match_returns_every_binding():
  pat = UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")])
  found = {(m["x"], m["y"]) for m in matches(pat, a + b)}
  assert found == {(a, b), (b, a)}

def test_op_dtype_arg_and_length_filters():
  assert matches(UPat((Ops.ADD, Ops.MUL)), a * b) and not matches(UPat(Ops.ADD), a * b)
  assert matches(UPat(dtype=dtypes.int32), a) and not matches(UPat(dtype=dtypes.float32), a)
  assert matches(UPat.const(None, 0), c(0)) and matches(UPat.const(None, 0), c(0.0, dtypes.float32))
  assert not matches(UPat.const(None, 0), c(False, dtypes.bool))
  assert not matches(UPat.const(None, 1), c(True, dtypes.bool))
  assert matches(UPat.const(dtypes.bool, True), c(True, dtypes.bool))
  three = UOp(Ops.SINK, dtypes.void, (a, b, c(1)))
  assert not matches(UPat(Ops.SINK, src=(UPat.var("first"),)), three)
  assert matches(UPat(Ops.SINK, src=(UPat.var("first"),), allow_any_len=True), three)[0]["first"] is a

# ---------------------------------------------------------------------------------------------------------------------
# PatternMatcher

def test_first_matching_rule_wins_and_none_falls_through():
  calls = []
  def skip(x): calls.append("skip"); return None
  def take(x): calls.append("take"); return x
  def late(x): calls.append("late"); return c(0)
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar())), skip),
                       (UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar())), take),
                       (UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar())), late)])
  assert pm.rewrite(a + 1) is a and calls == ["skip", "take"]
  assert pm.rewrite(a * 2) is None

def test_rules_without_an_op_apply_to_every_op_in_order():
  seen = []
  pm = PatternMatcher([(UPat(Ops.MUL, name="u"), lambda u: seen.append("mul") or None),
                       (UPat(name="u"), lambda u: seen.append(u.op) or None)])
  pm.rewrite(a * b)
  pm.rewrite(a + b)
  assert seen == ["mul", Ops.MUL, Ops.ADD]

def test_matchers_add():
  one = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(None, 0))), lambda x: x)])
  two = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), lambda x: x)])
  both = one + two
  assert both.rewrite(a + 0) is a and both.rewrite(a * 1) is a

def test_ctx_is_passed_to_rules_that_ask_for_it():
  def count(ctx, x):
    ctx.append(x)
    return None
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar())), count)])
  log: list = []
  graph_rewrite((a + 1) * (b + 2), pm, ctx=log)
  assert set(log) == {a, b}
  renamer = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v))])
  assert graph_rewrite(a + b, renamer, ctx={a: b}) is b + b

# ---------------------------------------------------------------------------------------------------------------------
# graph_rewrite

def test_top_down_sees_nodes_before_their_sources_bottom_up_after():
  # CONST 1 -> CONST 2, and ADD(x, 1) -> 99: top-down the ADD still sees the 1, bottom-up it already sees a 2
  pm = PatternMatcher([(UPat.const(None, 1), lambda: c(2)),
                       (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(None, 1))), lambda x: c(99))])
  assert graph_rewrite(a + 1, pm) is c(99)
  assert graph_rewrite(a + 1, pm, bottom_up=True) is a + 2

def test_visit_order():
  def record(ctx, u):
    ctx.append(u.op)
    return None
  pm = PatternMatcher([(UPat((Ops.ADD, Ops.MUL), name="u"), record)])
  order: list = []
  graph_rewrite((a + b) * b, pm, ctx=order)
  assert order == [Ops.MUL, Ops.ADD]
  order.clear()
  graph_rewrite((a + b) * b, pm, ctx=order, bottom_up=True)
  assert order == [Ops.ADD, Ops.MUL]

def test_results_are_rewritten_to_a_fixed_point():
  # each step only takes one off; the result of every rule is rewritten again, including its new sources
  pm = PatternMatcher([(UPat(Ops.CONST, dtype=I32, name="k"), lambda k: c(k.arg - 1) if k.arg > 0 else None),
                       (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 0))), lambda x: c(5))])
  assert graph_rewrite(a * 3, pm) is c(0)   # a*3 -> a*0 (after its source) -> 5 -> 0
  assert graph_rewrite(a * 3, pm, bottom_up=True) is c(0)

def test_parent_is_rewritten_again_after_its_sources_change():
  pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), lambda x: x),
                       (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(None, 0))), lambda x: x)])
  # ADD(b*1, 0*1) matches no rule until both its sources have become b and 0
  assert graph_rewrite(b * 1 + c(0) * 1, pm) is b

def test_rules_that_never_settle_raise():
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: y + x)])
  with pytest.raises(RuntimeError, match="fixed point"):
    graph_rewrite(a + b, pm)

def test_shared_nodes_are_rewritten_once():
  calls = []
  def bump(k):
    calls.append(k)
    return c(k.arg + 100) if k.arg < 100 else None
  pm = PatternMatcher([(UPat(Ops.CONST, dtype=I32, name="k"), bump)])
  # 60 levels of x = x + x: 2**60 paths, 61 distinct nodes
  node = a + 1
  for _ in range(60): node = node + node
  out = graph_rewrite(node, pm)
  assert len(out.toposort()) == len(node.toposort())
  assert [k.arg for k in calls if k.arg < 100] == [1]

def test_unchanged_graph_returns_the_same_node():
  pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), lambda x: x)])
  expr = (a + b) * 2
  assert graph_rewrite(expr, pm) is expr and graph_rewrite(expr, pm, bottom_up=True) is expr

@pytest.mark.parametrize("bottom_up", [False, True])
def test_deep_chain_has_no_recursion_limit(bottom_up: bool):
  node = a
  for i in range(10_000): node = node + (1 if i % 2 else 2)
  pm = PatternMatcher([(UPat.const(I32, 1), lambda: c(3))])
  out = graph_rewrite(node, pm, bottom_up=bottom_up)
  consts = [u.arg for u in out.toposort() if u.op is Ops.CONST]
  assert sorted(consts) == [2, 3]
  depth, cur = 0, out
  while cur.op is Ops.ADD: cur, depth = cur.src[0], depth + 1
  assert depth == 10_000 and cur is a

def test_substitute_replaces_without_visiting_inside():
  expr = (a + b) * (a + 1)
  assert substitute(expr, {a: b}) is (b + b) * (b + 1)
  assert substitute(expr, {a + b: c(7)}) is c(7) * (a + 1)
