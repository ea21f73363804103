"""canonical_sum's shortcut for a canonical sum plus a constant (symbolic.py `_canonical_plus_const`): the node it
gives must be the one the general path (flatten with linear_form, recombine remainders, rebuild with build_sum)
gives, for sums of every shape the shortcut takes and those it must leave to the general path, and the value must
be the sum's."""
from __future__ import annotations
import random
import pytest
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop import symbolic as S

I32 = dtypes.int32

def _ranges():
  return [UOp(Ops.RANGE, I32, (UOp.const(I32, n),), i) for i, n in enumerate((4, 8, 16, 3, 5))]

def _general(u: UOp) -> UOp | None:
  """canonical_sum without the shortcut."""
  form = S.linear_form(u)
  if form is None: return None
  terms, const = form
  if any(t.op is Ops.MOD for t in terms): S.recombine_div_mod(u.dtype, terms)
  return S.build_sum(u.dtype, terms, const)

def _atoms(rs):
  r0, r1, r2, r3, r4 = rs
  return [r0, r1, r2, r3, r4, r2 // 4, (r1 * 3 + r4) // 2, r0.alu(Ops.MAX, r3), r1 * r2]   # (r1*r2: a product atom)

@pytest.mark.parametrize("seed", range(40))
def test_shortcut_gives_the_general_result(seed):
  rand = random.Random(seed)
  rs = _ranges()
  atoms = _atoms(rs)
  taken = 0
  for _ in range(30):
    chosen = rand.sample(atoms, rand.randint(1, 5))
    terms = {t: rand.choice((1, 2, -1, 3, 16, -7)) for t in chosen}
    base = S.build_sum(I32, terms, rand.choice((0, 0, 5, -3)))
    if base.op is Ops.CONST: continue
    u = base.alu(Ops.ADD, UOp.const(I32, rand.choice((1, -5, 7, 1 << 20))))
    want = _general(u)
    got = S._canonical_plus_const(u)
    if got is not None:
      taken += 1
      assert got is want, f"{u}: shortcut {got}, general {want}"
      assert got._canonical   # marked canonical (kiln/uop/symbolic.py mark_canonical)
  assert taken > 0

def test_shortcut_declines_what_it_cannot_see():
  r0, r1, r2, r3, r4 = _ranges()
  mod_sum = S.build_sum(I32, {r1 % 4: 1, r2: 8}, 0)   # a remainder: recombined with its quotient in general
  assert S._canonical_plus_const(mod_sum.alu(Ops.ADD, UOp.const(I32, 3))) is None
  not_marked = r0.alu(Ops.ADD, r1)   # not made by build_sum
  assert S._canonical_plus_const(not_marked.alu(Ops.ADD, UOp.const(I32, 3))) is None
  zero = S.build_sum(I32, {r0: 1, r1: 4}, 0).alu(Ops.ADD, UOp.const(I32, 0))
  assert S._canonical_plus_const(zero) is None
  big = S.build_sum(I32, {UOp(Ops.RANGE, I32, (UOp.const(I32, 2),), 100 + i): 3 for i in range(30)}, 0)
  assert S._canonical_plus_const(big.alu(Ops.ADD, UOp.const(I32, 1))) is None   # linear_form's size limit
  assert S.canonical_sum(big.alu(Ops.ADD, UOp.const(I32, 1))) is None

def test_shifted_sum_has_the_sums_value():
  r0, r1, r2, r3, r4 = _ranges()
  base = S.build_sum(I32, {r0: 2, r2 // 4: 3, r1: 1}, 7)
  u = base.alu(Ops.ADD, UOp.const(I32, -9))
  got = S.canonical_sum(u)
  assert got is not None and got.op is Ops.ADD and got.src[1].op is Ops.CONST and got.src[1].arg == -2
  assert got.src[0] is base.src[0]
  cancel = base.alu(Ops.ADD, UOp.const(I32, -7))
  assert S.canonical_sum(cancel) is base.src[0]

@pytest.mark.parametrize("seed", range(10))
def test_scaled_atom_is_its_own_canonical_form(seed):
  rand = random.Random(seed)
  rs = _ranges()
  atoms = _atoms(rs) + [rs[1] % 4, (rs[0] * 3 + rs[2]) % 5]   # one remainder alone recombines with nothing
  for atom in atoms:
    for k in (2, -1, 3, 16, 1, 0):
      u = atom.alu(Ops.MUL, UOp.const(I32, k))
      want = _general(u)
      assert S._canonical_scaled_atom(u) == (want is u), f"{u}: general path gives {want}"
  # a product of a sum distributes: not its own form
  s = S.build_sum(I32, {rs[0]: 2, rs[1]: 1}, 3)
  u = s.alu(Ops.MUL, UOp.const(I32, rand.choice((2, 3, -4))))
  assert not S._canonical_scaled_atom(u) and _general(u) is not u
