"""The symbolic simplifier: random expressions keep their value and ranges, and common index math gets short."""
from __future__ import annotations
import itertools, math, random
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from kiln.dtype import DType, dtypes, to_numpy_dtype
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic, symbolic_simple, constant_folding, exec_alu, term_order_key

I32 = dtypes.int32

def rng(end: int, axis: int, dtype: DType = I32) -> UOp:
  """A loop variable 0 <= ridx<axis> < end."""
  return UOp(Ops.RANGE, dtype, (UOp.const(dtype, end),), arg=axis)

def c(value, dtype: DType = I32) -> UOp: return UOp.const(dtype, value)

# ---------------------------------------------------------------------------------------------------------------------
# a reference evaluator with C semantics, written independently of the simplifier

def wrap(dtype: DType, value: int) -> int:
  if dtype == dtypes.bool: return bool(value)
  bits = dtype.bitsize
  value &= (1 << bits) - 1
  return value - (1 << bits) if not dtypes.is_unsigned(dtype) and value >= 1 << (bits - 1) else value

def c_div(a: int, b: int) -> int:
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q

def evaluate(root: UOp, env: dict[UOp, int]) -> dict[UOp, int]:
  """The value of every node under `root`, given values for its DEFINE_VARs and RANGEs."""
  vals: dict[UOp, int] = {}
  for u in root.toposort():
    s = [vals[x] for x in u.src]
    op, dt = u.op, u.dtype
    if op is Ops.CONST: v = u.arg
    elif op in (Ops.DEFINE_VAR, Ops.RANGE): v = env[u]
    elif op is Ops.ADD: v = wrap(dt, s[0] + s[1])
    elif op is Ops.SUB: v = wrap(dt, s[0] - s[1])
    elif op is Ops.MUL: v = wrap(dt, s[0] * s[1])
    elif op is Ops.NEG: v = wrap(dt, -s[0])
    elif op is Ops.IDIV: v = wrap(dt, c_div(s[0], s[1]))
    elif op is Ops.MOD: v = wrap(dt, s[0] - s[1] * c_div(s[0], s[1]))
    elif op is Ops.MAX: v = max(s[0], s[1])
    elif op is Ops.CMPLT: v = s[0] < s[1]
    elif op is Ops.CMPNE: v = s[0] != s[1]
    elif op is Ops.CMPEQ: v = s[0] == s[1]
    elif op is Ops.AND: v = wrap(dt, s[0] & s[1])
    elif op is Ops.OR: v = wrap(dt, s[0] | s[1])
    elif op is Ops.WHERE: v = s[1] if s[0] else s[2]
    elif op is Ops.CAST: v = wrap(dt, int(s[0]))
    else: raise NotImplementedError(op)
    vals[u] = v
  return vals

def leaves(root: UOp) -> list[UOp]: return [u for u in root.toposort() if u.op in (Ops.DEFINE_VAR, Ops.RANGE)]

def assignments(root: UOp, rand: random.Random, count: int) -> list[dict[UOp, int]]:
  """All-low, all-high and random values for the leaves, biased toward the ends of their ranges."""
  ls = leaves(root)
  bounds = {u: (u.arg[1], u.arg[2]) if u.op is Ops.DEFINE_VAR else (0, u.src[0].arg - 1) for u in ls}
  out = [{u: lo for u, (lo, _) in bounds.items()}, {u: hi for u, (_, hi) in bounds.items()}]
  for _ in range(count):
    env = {}
    for u, (lo, hi) in bounds.items():
      pick = rand.random()
      if pick < 0.15: env[u] = lo
      elif pick < 0.3: env[u] = hi
      elif pick < 0.4: env[u] = rand.randint(lo, min(hi, lo + 3))
      else: env[u] = rand.randint(lo, hi)
    out.append(env)
  return out

def check_ranges(root: UOp, vals: dict[UOp, int]):
  for u, v in vals.items():
    assert u.vmin <= v <= u.vmax, f"{u.render()} = {v} is outside [{u.vmin}, {u.vmax}]"

def check_same_value(expr: UOp, rand: random.Random, count: int = 30):
  simplified = expr.simplify()
  assert simplified.simplify() is simplified, f"not a fixed point: {simplified.render()}"
  for env in assignments(expr, rand, count):
    before, after = evaluate(expr, env), evaluate(simplified, env)
    assert before[expr] == after[simplified], \
      f"{expr.render()} = {before[expr]} but simplified {simplified.render()} = {after[simplified]} at " \
      f"{ {k.render(): v for k, v in env.items()} }"
    check_ranges(expr, before)
    check_ranges(simplified, after)
  return simplified

# ---------------------------------------------------------------------------------------------------------------------
# random expression trees

def leaf_pool(dtype: DType) -> list[UOp]:
  lo, hi = dtypes.min(dtype), dtypes.max(dtype)
  pool = [rng(4, 0, dtype), rng(3, 1, dtype), rng(16, 2, dtype), rng(1, 3, dtype), rng(6, 4, dtype),
          UOp.variable("a", 0, 10, dtype), UOp.variable("n", 1, 100, dtype), UOp.variable("full", lo, hi, dtype),
          UOp.variable("top", max(lo, hi - 40), hi, dtype)]
  if not dtypes.is_unsigned(dtype):
    pool += [UOp.variable("b", -8, 8, dtype), UOp.variable("s", -4, 3, dtype), UOp.variable("m", -16, 15, dtype),
             UOp.variable("neg", -30, -1, dtype), UOp.variable("bottom", lo, lo + 40, dtype)]
  return pool

SMALL_DIVISORS = [2, 3, 4, 6, 8, 12, 16]

def int_consts(dtype: DType) -> st.SearchStrategy:
  lo, hi = dtypes.min(dtype), dtypes.max(dtype)
  return st.one_of(st.integers(-20, 20), st.sampled_from([lo, hi, lo + 1, hi - 1, 2 ** (dtype.bitsize // 2), 64, 1000]))

def coefficients(dtype: DType) -> st.SearchStrategy:
  """Mostly coefficients that share factors with the divisors, so division rules get exercised."""
  return st.one_of(st.sampled_from([1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 48, -1, -2, -4, -12]), int_consts(dtype))

def divisors(dtype: DType) -> st.SearchStrategy:
  return st.one_of(st.sampled_from(SMALL_DIVISORS), st.integers(1, 13), st.integers(-13, -1),
                   st.sampled_from([64, 3 * 2 ** (dtype.bitsize // 2 - 2)]))

def linear_sums(children: st.SearchStrategy, dtype: DType) -> st.SearchStrategy:
  """sum(child * coefficient) + constant, in random order: the shape of index arithmetic."""
  def build(parts):
    terms, const = parts
    out = c(const, dtype)
    for child, coef in terms: out = out + (child if coef == 1 else child * coef)
    return out
  terms = st.lists(st.tuples(children, coefficients(dtype)), min_size=1, max_size=4)
  return st.tuples(terms, st.integers(-30, 30)).map(build)

def divided_sums(children: st.SearchStrategy, dtype: DType) -> st.SearchStrategy:
  """(sum of terms with coefficients near multiples of d, plus a constant) // d or % d: the division rules' territory."""
  @st.composite
  def build(draw):
    d = draw(st.sampled_from(SMALL_DIVISORS))
    out = c(draw(st.integers(-3 * d, 3 * d)), dtype)
    for _ in range(draw(st.integers(1, 3))):
      coef = d * draw(st.integers(-3, 3)) + draw(st.sampled_from([0, 0, 0, 1, -1, 2]))
      out = out + draw(children) * coef
    return out // d if draw(st.booleans()) else out % d
  return build()

def nested_div_mod(children: st.SearchStrategy) -> st.SearchStrategy:
  """(x op c1) op c2 for op in // and %."""
  def build(t):
    x, first, c1, second, c2 = t
    inner = x // c1 if first else x % c1
    return inner // c2 if second else inner % c2
  return st.tuples(children, st.booleans(), st.sampled_from(SMALL_DIVISORS), st.booleans(),
                   st.sampled_from(SMALL_DIVISORS)).map(build)

def recombined(children: st.SearchStrategy) -> st.SearchStrategy:
  """(x//d)*(k*d) + (x%d)*k, sometimes with a coefficient that does not match."""
  def build(t):
    x, d, k, mismatch = t
    return (x // d) * (k * d + mismatch) + (x % d) * k
  return st.tuples(children, st.sampled_from(SMALL_DIVISORS), st.sampled_from([1, 1, 2, -1]),
                   st.sampled_from([0, 0, 0, 1, -1])).map(build)

def comparisons(ints: st.SearchStrategy, dtype: DType) -> st.SearchStrategy:
  near = st.one_of(st.integers(-6, 10), st.integers(-40, 60)).map(lambda v: c(v, dtype))
  ops = st.sampled_from([Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ])
  quotient = st.tuples(ints, st.sampled_from(SMALL_DIVISORS)).map(lambda t: t[0] // t[1])
  shared = st.tuples(ints, ints, ints, st.sampled_from([1, 2, -1])).map(lambda t: (t[0] * t[3] + t[1], t[0] * t[3] + t[2]))
  return st.one_of(st.tuples(ops, ints, st.one_of(ints, near)), st.tuples(ops, near, ints),
                   st.tuples(ops, quotient, near), st.tuples(ops, near, quotient),
                   st.tuples(ops, shared).map(lambda t: (t[0],) + t[1])).map(lambda t: UOp(t[0], dtypes.bool, (t[1], t[2])))

def int_exprs(dtype: DType, max_leaves: int = 10) -> st.SearchStrategy:
  leaf = st.one_of(st.sampled_from(leaf_pool(dtype)), int_consts(dtype).map(lambda v: c(v, dtype)))
  def extend(children: st.SearchStrategy) -> st.SearchStrategy:
    pair = st.tuples(children, children)
    summed = st.one_of(children, linear_sums(children, dtype))
    return st.one_of(
      linear_sums(children, dtype), divided_sums(children, dtype), divided_sums(children, dtype),
      nested_div_mod(summed), recombined(summed),
      st.tuples(summed, divisors(dtype)).map(lambda t: t[0] // t[1]),
      st.tuples(summed, divisors(dtype)).map(lambda t: t[0] % t[1]),
      pair.map(lambda t: t[0] - t[1]), pair.map(lambda t: t[0] * t[1]), pair.map(lambda t: UOp(Ops.SUB, dtype, t)),
      children.map(lambda x: UOp(Ops.NEG, dtype, (x,))), pair.map(lambda t: t[0].maximum(t[1])),
      st.tuples(comparisons(children, dtype), children, children).map(lambda t: t[0].where(t[1], t[2])),
      comparisons(children, dtype).map(lambda b: b.cast(dtype)))
  return st.recursive(leaf, extend, max_leaves=max_leaves)

def bool_exprs(dtype: DType) -> st.SearchStrategy:
  atom = comparisons(int_exprs(dtype, 8), dtype)
  return st.one_of(atom, st.tuples(atom, atom).map(lambda t: t[0] & t[1]), st.tuples(atom, atom).map(lambda t: t[0] | t[1]),
                   atom.map(lambda b: b.logical_not()), st.tuples(atom, atom, atom).map(lambda t: t[0].where(t[1], t[2])))

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

@FUZZ
@given(int_exprs(I32), st.randoms(use_true_random=False))
def test_fuzz_int32_value_and_ranges(expr: UOp, rand: random.Random):
  check_same_value(expr, rand)

@FUZZ
@given(bool_exprs(I32), st.randoms(use_true_random=False))
def test_fuzz_int32_comparisons(expr: UOp, rand: random.Random):
  check_same_value(expr, rand)

@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.uint32, dtypes.int64])
def test_fuzz_wrapping_dtypes(dtype: DType):
  @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(st.one_of(int_exprs(dtype), bool_exprs(dtype)), st.randoms(use_true_random=False))
  def check(expr: UOp, rand: random.Random): check_same_value(expr, rand)
  check()

def exhaustive_check(expr: UOp):
  """The simplified `expr` equals `expr` for every assignment of its (small-ranged) leaves."""
  simplified = expr.simplify()
  ls = leaves(expr)
  spans = [range(u.arg[1], u.arg[2] + 1) if u.op is Ops.DEFINE_VAR else range(u.src[0].arg) for u in ls]
  for values in itertools.product(*spans):
    env = dict(zip(ls, values))
    before, after = evaluate(expr, env), evaluate(simplified, env)
    assert before[expr] == after[simplified], f"{expr.render()} != {simplified.render()} at {values}"
    check_ranges(expr, before)
    check_ranges(simplified, after)

_s, _m, _b = UOp.variable("s", -4, 3), UOp.variable("m", -16, 15), UOp.variable("b", -8, 8)
_neg, _n, _r0, _r2 = UOp.variable("neg", -30, -1), UOp.variable("n", 1, 40), rng(4, 0), rng(16, 2)
_v8, _u8 = UOp.variable("v8", -128, 127, dtypes.int8), UOp.variable("u8", 0, 255, dtypes.uint8)
_r8 = rng(4, 0, dtypes.int8)

def c8(v): return c(v, dtypes.int8)
def cu8(v): return c(v, dtypes.uint8)

@pytest.mark.parametrize("expr", [
  _s % 4, _s % 5, _m % 16, _m % 17, _b // 8, _b // 9, _s // -4, _s % -4,
  (_s % 4) % 2, (_m % 6) % 4, (_m % 12) // 4, (_m % 6) // 4, (_m // 4) // 2,
  c(-1).lt(_s // 4), c(0).lt(_s // 4), c(-2).lt(_m // 4), (_s // 4).lt(0), (_s // 4).lt(1), (_m // 4).lt(-1),
  c(-1).lt(_s * 2 + 1), (_s * 2 + 1).lt(0), (_s * 3 - 2).lt(-4), (_m * 2).eq(-6), (_m * 2 + 1).ne(-6),
  (_neg * 4 - _n + 1) // 4, (_neg * 4 - _r0 - 5) // 4, (_neg * 4 - _r0 - 5) % 4,
  (_neg * 4 + _r0) // 4, (_neg * 4 + _r0) % 4,
  (_s * 4 + _r0) // 4, (_s * 4 + _r0) % 4, (_s * 6 + _r0 * 2) // 4, (_s * 6 + _r0 * 2) % 4, (_m * 8 + _s * 2) % 4,
  (_m // 4) * 4 + _m % 4, (_m // 4) * 8 + _m % 4, (_m // 4) * 4 + (_m % 4) * 2,
  (_m // 12) * 12 + (_m // 4) % 3 * 4 + _m % 4,
  (_m + _s).lt(_m + 2), (_m * 2 + _s).lt(_m + _r0), (_m + 3).eq(_m + _s), _m.maximum(_s), _s.maximum(_m - 20),
  (_n * 4 - _r0) // 4, (_n * 4 - _r0) % 4, (_n * 4 - _r0 + 3) // 4,
  # int8/uint8 over their whole range: every wraparound is seen
  (_v8 * 4 + _r8) // 4, (_v8 * 4 + _r8) % 4, (_v8 * 3) // 3, (_v8 + 100) % 7,
  (_v8 // 2) // 64, (_v8 // 16) // 16, (_v8 % 64) % 8, (_v8 % 6) % 4,
  (_v8 + 1).lt(c8(5)), c8(5).lt(_v8 + 1), (_v8 * 2).eq(c8(4)), (_v8 * 2).ne(c8(3)), (_v8 + 1).eq(c8(-128)),
  (_v8 * 2).lt(c8(9)), (_v8 // 4).lt(c8(3)), c8(3).lt(_v8 // 4), (_v8 + _r8).lt(_v8 + 2), (_v8 // 64) * 64 + _v8 % 64,
  (_v8 * 64) // 64, (_v8 * -1) // 1, _v8 // -1, -(-_v8), (_v8 - _v8 * 2) + _v8,
  (_u8 * 4 + cu8(3)) // 4, (_u8 + cu8(3)) % 4, (_u8 - cu8(1)).lt(cu8(10)), (_u8 * 2).eq(cu8(4)), (_u8 // 4) * 4 + _u8 % 4,
])
def test_exhaustive_edge_cases(expr: UOp):
  exhaustive_check(expr)

@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-6, 6), st.sampled_from([0, 1, 2])), min_size=1, max_size=6), st.integers(-20, 20),
       st.randoms(use_true_random=False))
def test_sums_in_any_order_are_one_node(parts, const, rand: random.Random):
  ranges = [rng(4, 0), rng(3, 1), rng(16, 2)]
  terms = [ranges[axis] * coef for coef, axis in parts] + [c(const)]
  shuffled = list(terms)
  rand.shuffle(shuffled)
  def total(ts):
    out = ts[0]
    for t in ts[1:]: out = out + t
    return out
  assert total(terms).simplify() is total(shuffled).simplify()

# ---------------------------------------------------------------------------------------------------------------------
# common index patterns simplify to short forms

r0, r1, r2 = rng(8, 0), rng(3, 1), rng(4, 2)
x = UOp.variable("x", -10, 10)
n = UOp.variable("n", 1, 1000)

@pytest.mark.parametrize("expr, expected", [
  ((r0 * 4 + r2) // 4, "ridx0"),
  ((r0 * 4 + r2) % 4, "ridx2"),
  ((r0 * 12 + r1 * 4 + r2) // 4 % 3, "ridx1"),
  ((r0 * 12 + r1 * 4 + r2) // 12, "ridx0"),
  ((r0 * 12 + r1 * 4 + r2) % 12, "((ridx1*4)+ridx2)"),
  ((r0 * 12 + r1 * 4 + r2) // 4, "((ridx0*3)+ridx1)"),
  ((r2 + r0 * 4) // 4, "ridx0"),
  ((r0 * 4 + r2 + 8) // 4, "(ridx0+2)"),
  ((r0 * 4 + r2 + 9) % 4, "((ridx2+1)%4)"),
  ((r0 * 4 + r2 * 2 + 1) // 2, "((ridx0*2)+ridx2)"),
  ((r0 * 6) // 4, "((ridx0*3)//2)"),
  ((r0 * 8) // 4, "(ridx0*2)"),
  ((r0 * 4) // 8, "(ridx0//2)"),
  ((r0 * 4) % 2, "0"),
  (n // 2 // 4, "(n//8)"),
  ((n % 12) % 4, "(n%4)"),
  ((n % 12) // 4, "((n//4)%3)"),
  (r2 % 7, "ridx2"),
  (r2 // 7, "0"),
  ((n // 4) * 4 + n % 4, "n"),
  ((n // 12) * 12 + (n // 4) % 3 * 4 + n % 4, "n"),
  ((x + 3) - 3, "x"),
  (x - x, "0"),
  (UOp(Ops.SUB, I32, (x, x)), "0"),
  (x * 0 + 5, "5"),
  (x * 1 + 0, "x"),
  (-(-x), "x"),
  (UOp(Ops.NEG, I32, (UOp(Ops.NEG, I32, (x,)),)), "x"),
  (3 + x * 2 + 4 + x, "((x*3)+7)"),
  (r1 * 2 + r0 + r1 * 3 + 4 + r0, "(((ridx0*2)+(ridx1*5))+4)"),
  ((x * 2) * 3, "(x*6)"),
  ((x + 1) * 3, "((x*3)+3)"),
  (x // 1, "x"),
  (x % 1, "0"),
  (x // -2, "((x//2)*-1)"),
  (x % -3, "(x%3)"),
  (x.maximum(20), "20"),
  (r0.maximum(0), "ridx0"),
  # a coefficient one more than the modulus (a sliding-window view): the multiples of 14 drop out, the rest is < 14
  ((r1 * 15 + r2) % c(14), "(ridx1+ridx2)"),
  ((r0 * 15 + r2) % c(14), "(ridx0+ridx2)"),
  ((rng(12, 3) * 15 + rng(6, 4)) % c(14), "((ridx3+ridx4)%14)"),
  ((r1 * 15 + r2) // c(14), "ridx1"),
  (r0.maximum(r0), "ridx0"),
])
def test_index_patterns(expr: UOp, expected: str):
  assert expr.simplify().render() == expected

@pytest.mark.parametrize("expr, expected", [
  ((r0 * 4 + r2).lt(32), "True"),
  ((r0 * 4 + r2).lt(0), "False"),
  (r0.lt(-1), "False"),
  ((r0 * 4 + r2).ne(-1), "True"),
  (r2.eq(7), "False"),
  ((x + 5).lt(3), "(x<-2)"),
  ((r0 * 4).lt(9), "(ridx0<3)"),
  (c(3).lt(r0 * 4), "(0<ridx0)"),
  ((r0 // 4).lt(1), "(ridx0<4)"),
  ((x + 1).eq(4), "(x==3)"),
  ((x * 2).eq(3), "False"),
  ((x * 2).ne(6), "(x!=3)"),
  (x.lt(x + 1), "True"),
  ((x + r0).lt(x + 2), "(ridx0<2)"),
  (x.ne(x), "False"),
  ((x + r0).eq(r0 + x), "True"),
  (x.lt(x), "False"),
])
def test_comparisons(expr: UOp, expected: str):
  assert expr.simplify().render() == expected

def test_where_and_bool_identities():
  cond = x.lt(3)
  t, f = c(True, dtypes.bool), c(False, dtypes.bool)
  assert c(True, dtypes.bool).where(x, r0).simplify() is x
  assert c(False, dtypes.bool).where(x, r0).simplify() is r0
  assert cond.where(r0, r0).simplify() is r0
  assert cond.where(t, f).simplify() is cond
  assert cond.where(f, t).simplify() is cond.logical_not()
  assert cond.logical_not().where(r0, r1).simplify() is cond.where(r1, r0)
  assert cond.logical_not().logical_not().simplify() is cond
  assert (cond & t).simplify() is cond and (cond & f).simplify() is f
  assert (cond | f).simplify() is cond and (cond | t).simplify() is t
  assert (cond & cond).simplify() is cond
  assert (cond & r0.lt(100)).simplify() is cond   # the second comparison is decided by r0's range
  assert r0.lt(4).where(r0, r1).simplify().render() == "((ridx0<4)?ridx0:ridx1)"
  assert r0.lt(9).where(r0, r1).simplify() is r0

def test_canonical_order_is_stable():
  a, b = UOp.variable("alpha", 0, 9), UOp.variable("beta", 0, 9)
  assert (b * 3 + r1 + a + r0 * 2).simplify().render() == "((((ridx0*2)+ridx1)+alpha)+(beta*3))"
  assert term_order_key(r0) < term_order_key(r1) < term_order_key(a) < term_order_key(b)
  assert (b * a).simplify() is (a * b).simplify()

# ---------------------------------------------------------------------------------------------------------------------
# wraparound and negative values: where a rule would be wrong, it must not fire

def test_no_division_rule_when_the_sum_may_wrap():
  big = UOp.variable("big", 0, 2 ** 31 - 1)
  expr = (big * 4 + r2) // 4           # big*4 wraps: the quotient is not big
  assert expr.simplify().render() == "((ridx2+(big*4))//4)"
  assert ((big * 4 + r2) % 4).simplify().render() == "((ridx2+(big*4))%4)"
  small = UOp.variable("small", 0, 2 ** 28)
  assert ((small * 4 + r2) // 4).simplify() is small

def test_division_by_a_factor_ignores_a_small_rest():
  # (4*i + j)//8 with 0 <= j < 4 is i//2: the upcast lanes of a 2x2 pooling window's gradient (kiln/uop/symbolic.py
  # _factor_split); checked against the reference evaluator at every point
  i, j, k = rng(32, 0), rng(4, 1), rng(16, 2)
  cases = [((i * 4 + j) // 8, "(ridx0//2)"), ((i * 4 + j) % 8, "(((ridx0%2)*4)+ridx1)"),
           ((i * 32 + j * 8 + 1) // 64, "(ridx0//2)"), ((k * 24 + j * 2 + 5) // 48, None)]
  for expr, want in cases:
    got = expr.simplify()
    if want is not None: assert got.render() == want, (expr.render(), got.render())
    for env in ({i: a, j: b, k: d} for a in range(32) for b in range(4) for d in range(16)):
      assert evaluate(got, env)[got] == evaluate(expr, env)[expr], (expr.render(), got.render(), env)

def test_negative_dividends_truncate():
  # x in [-10, 10]: (x*4 + r2)//4 is not x when x < 0 and r2 > 0 (C truncates toward zero)
  assert ((x * 4 + r2) // 4).simplify().render() == "((ridx2+(x*4))//4)"
  neg = UOp.variable("neg", -100, -1)
  assert ((neg * 4 - r2) // 4).simplify() is neg        # both parts <= 0: truncation is ceiling, still exact
  assert ((neg * 4 - r2) % 4).simplify().render() == "(ridx2*-1)"
  assert ((x * 4) // 4).simplify() is x                  # exact multiples divide for any sign
  assert (x % 11).simplify() is x and (x // 11).simplify().render() == "0"

def test_comparison_rules_respect_wraparound():
  full = UOp.variable("full", -2 ** 31, 2 ** 31 - 1)
  assert (full + 1).lt(5).simplify().render() == "((full+1)<5)"    # full+1 wraps at INT_MAX
  assert (full + 1).eq(5).simplify().render() == "(full==4)"      # but == is exact with wraparound
  # full*2 == 4 also holds for full = -2**31 + 2 (the product wraps), so it must not become full == 2
  assert (full * 2).eq(4).simplify().render() == "((full*2)==4)"
  assert (x * 2).eq(4).simplify().render() == "(x==2)"

def test_constant_folding_semantics():
  def fold(op, dtype, *vals): return graph_rewrite(UOp(op, dtype, tuple(c(v, dtype) for v in vals)), constant_folding)
  assert fold(Ops.IDIV, I32, -7, 2).arg == -3 and fold(Ops.MOD, I32, -7, 2).arg == -1
  assert fold(Ops.MOD, I32, 7, -2).arg == 1
  assert fold(Ops.ADD, I32, 2 ** 31 - 1, 1).arg == -2 ** 31
  assert fold(Ops.MUL, dtypes.uint8, 16, 17).arg == (16 * 17) % 256
  assert fold(Ops.ADD, dtypes.int64, 2 ** 62, 2 ** 62).arg == -2 ** 63
  assert fold(Ops.IDIV, I32, 1, 0).op is Ops.IDIV and fold(Ops.MOD, I32, 1, 0).op is Ops.MOD   # not folded
  assert fold(Ops.IDIV, dtypes.int64, 2 ** 62 + 1, 3).arg == (2 ** 62 + 1) // 3                # exact, no floats
  f32 = fold(Ops.ADD, dtypes.float32, 0.1, 0.2).arg
  assert f32 == float(np.float32(0.1) + np.float32(0.2)) and f32 != 0.1 + 0.2
  assert fold(Ops.ADD, dtypes.float16, 2048.0, 1.0).arg == 2048.0   # rounds to half precision
  assert fold(Ops.FDIV, dtypes.float32, 1.0, 0.0).arg == math.inf
  assert math.isnan(fold(Ops.MUL, dtypes.float32, math.inf, 0.0).arg)
  cmp = graph_rewrite(c(1.0, dtypes.float32).lt(c(2.0, dtypes.float32)), constant_folding)
  assert cmp.op is Ops.CONST and cmp.arg is True
  assert graph_rewrite(UOp(Ops.CAST, I32, (c(-2.7, dtypes.float32),)), constant_folding).arg == -2
  assert graph_rewrite(UOp(Ops.CAST, dtypes.uint8, (c(300),)), constant_folding).arg == 44
  assert graph_rewrite(UOp(Ops.CAST, I32, (c(1e20, dtypes.float32),)), constant_folding).op is Ops.CAST
  assert exec_alu(Ops.SHL, I32, (1, 31)) == -2 ** 31 and exec_alu(Ops.SHL, I32, (1, 32)) is None

def test_float_identities_are_ieee_safe():
  f = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  v = UOp(Ops.LOAD, dtypes.float32, (f, r0))
  assert (v * 1.0).simplify() is v
  assert (v * 0.0).simplify().op is Ops.MUL                # NaN*0 is NaN
  assert (v + 0.0).simplify().op is Ops.ADD                # -0.0+0.0 is +0.0
  assert (v + -0.0).simplify() is v
  assert UOp(Ops.SUB, dtypes.float32, (v, v)).simplify().op is Ops.SUB   # inf-inf is NaN
  assert v.ne(v).simplify().op is Ops.CMPNE                # NaN != NaN
  assert (v + 1.0 + 2.0).simplify().render().count("+") == 2   # float addition does not reassociate
  assert (-(-v)).simplify() is v

def test_simple_matcher_leaves_ranges_alone():
  expr = (r0 * 4 + r2) // 4
  assert graph_rewrite(expr, symbolic_simple) is expr
  assert graph_rewrite(expr, symbolic) is r0

def test_deep_sum_does_not_recurse():
  expr = r0
  for i in range(5000): expr = expr + (i % 3)
  out = expr.simplify()
  assert out.render() == f"(ridx0+{sum(i % 3 for i in range(5000))})"

def test_many_index_expressions_simplify_to_their_parts():
  # speed is measured in benchmarks, not here; this checks the results of a lowerer-like workload
  for i in range(60):
    a, b, d = rng(4 + i % 5, 3 * i), rng(3, 3 * i + 1), rng(16, 3 * i + 2)
    flat = a * 48 + b * 16 + d
    assert (flat // 16 % 3).simplify() is b and (flat % 16).simplify() is d and (flat // 48).simplify() is a
    assert ((flat // 4) * 4 + flat % 4).simplify() is flat.simplify()

@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.int64])
def test_exec_alu_on_ints_wraps_as_numpy(dtype: DType):
  """exec_alu's fast path for in-range ints and its general path (operands outside the dtype's range are wrapped
  first) agree with NumPy's wrapping arithmetic and C's truncating division."""
  np_type = to_numpy_dtype(dtype).type
  info = np.iinfo(np_type)
  rng = random.Random(dtype.bitsize)
  values = [int(info.min), int(info.max), 0, 1, -1 if info.min < 0 else 2, 7]
  values += [rng.randint(int(info.min), int(info.max)) for _ in range(12)]
  wide = values + [int(info.max) + 5, int(info.min) - 3]   # not representable: wrapped as the device would
  ops = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.AND: np.bitwise_and,
         Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal}
  with np.errstate(over="ignore"):
    for a, b in itertools.product(wide, values):
      wa = np_type((a % (1 << dtype.bitsize)) - ((1 << dtype.bitsize) if info.min < 0 and
                                                  a % (1 << dtype.bitsize) > info.max else 0))
      for op, fn in ops.items():
        got = exec_alu(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype, (a, b), dtype)
        assert got == fn(wa, np_type(b)).item() and type(got) is (bool if op in (Ops.CMPLT, Ops.CMPNE) else int), \
          (op, a, b, got)
      if b != 0 and not (int(wa) == info.min and b == -1):
        q = abs(int(wa)) // abs(b) * (1 if (int(wa) >= 0) == (b > 0) else -1)
        assert exec_alu(Ops.IDIV, dtype, (a, b)) == q and exec_alu(Ops.MOD, dtype, (a, b)) == int(wa) - b * q, (a, b)
