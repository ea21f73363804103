"""Rules of kiln/uop/symbolic.py for kernels over symbolic sizes: a comparison decided by loop indices staying below
their symbolic ends (`lt_by_symbolic_bounds`), and products of sizes grouped one canonical way
(`pull_product_constants`). Each decided comparison is checked by brute force over every Variable value and index."""
import itertools
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, Variable
from kiln.uop.pattern import graph_rewrite
from kiln.uop.symbolic import symbolic

I32 = dtypes.int32

def loop(end: UOp | int, axis: int) -> UOp:
  return UOp(Ops.RANGE, I32, (end if isinstance(end, UOp) else UOp.const(I32, end),), arg=axis)

def simplify(u: UOp) -> UOp: return graph_rewrite(u, symbolic)

def brute_force(expr: UOp, n: UOp, loops: list[UOp], ends) -> set:
  """Every value `expr` takes for n over its range and each loop index below its end (ends: n -> list of ints)."""
  from kiln.uop.pattern import substitute
  seen = set()
  for value in range(n.vmin, n.vmax + 1):
    for idx in itertools.product(*[range(e) for e in ends(value)]):
      env = {n: UOp.const(I32, value), **{r: UOp.const(I32, i) for r, i in zip(loops, idx)}}
      seen.add(simplify(substitute(expr, env)).arg)
  return seen

def test_a_window_position_below_its_symbolic_end_folds_to_true():
  n = Variable("n", 3, 9)
  o, k = loop(n + -2, 0), loop(3, 1)   # outputs o < n - 2, taps k < 3: o + k < n always
  gate = (o + k).alu(Ops.CMPLT, n)
  assert brute_force(gate, n, [o, k], lambda v: [v - 2, 3]) == {True}
  assert simplify(gate).arg is True

def test_a_strided_window_position_folds_through_the_floor_division():
  n = Variable("n", 3, 17)
  o, k = loop((n + -1) // 2 + 1, 0), loop(3, 1)   # 3-wide windows at stride 2 over n + 2 padded positions
  gate = (o * 2 + k).alu(Ops.CMPLT, n + 2)
  assert brute_force(gate, n, [o, k], lambda v: [(v - 1) // 2 + 1, 3]) == {True}
  assert simplify(gate).arg is True

def test_a_position_never_below_folds_to_false():
  n = Variable("n", 3, 9)
  o = loop(n, 0)
  gate = (n + o).alu(Ops.CMPLT, n)
  assert simplify(gate).arg is False

def test_an_undecided_comparison_stays():
  n = Variable("n", 3, 9)
  o, k = loop(n, 0), loop(3, 1)    # o + k reaches n + 1: a real pad gate
  gate = (o + k).alu(Ops.CMPLT, n + 1)
  assert brute_force(gate, n, [o, k], lambda v: [v, 3]) == {True, False}
  assert simplify(gate).op is Ops.CMPLT

def test_products_of_sizes_are_grouped_one_way():
  h, w = Variable("h", 1, 8), Variable("w", 1, 8)
  a = simplify(((h * 16) * w) * 2)
  b = simplify((h * 16) * (w * 2))
  c = simplify((w * 4) * (h * 8))
  assert a is b is c

def test_a_tile_shifted_back_to_the_end_stays_below_it():
  n = Variable("n", 17, 40)
  o, lane = loop((n + 15) // 16, 0), loop(16, 1)
  start = (o * 16).alu(Ops.CMPLT, n + -16).where(o * 16, n + -16)   # min(16*o, n - 16)
  gate = (start + lane).alu(Ops.CMPLT, n)
  assert brute_force(gate, n, [o, lane], lambda v: [(v + 15) // 16, 16]) == {True}
  assert simplify(gate).arg is True

def test_exec_alu_folds_an_int_select():
  from kiln.uop.symbolic import exec_alu
  assert exec_alu(Ops.WHERE, I32, (True, 3, 7), I32) == 3 and exec_alu(Ops.WHERE, I32, (False, 3, 7), I32) == 7
