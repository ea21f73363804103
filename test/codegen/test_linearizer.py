"""Linearizing (kiln/codegen/linearizer.py): every uop comes after its sources, and a value computed from a reduce
group is emitted only once the output loops that the whole group depends on are open."""
from __future__ import annotations
import numpy as np
from kiln import Tensor
from kiln.uop.ops import Ops
from kiln.uop.spec import check_linear
from kiln.codegen.linearizer import linearize
from kiln.codegen.opt import optimize_kernel
from kiln.engine.realize import lower_for_codegen

def _padded_row_sums(t):
  # the pad leaves one upcast lane of the row sum reading only zeros: that lane's REDUCE depends on no output loop,
  # the other lanes (and so the group's loop body) on the row loop
  t = t.flip(0)
  t = t.reshape(1, *t.shape).expand(2, *t.shape)
  t = t.pad(((0, 0), (0, 2), (2, 2), (0, 1))).sum(2)
  return t + t.flip(0) * 0.5

def test_value_of_an_uneven_reduce_group_waits_for_the_group_loops():
  x = np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3)
  items = [item for item in _padded_row_sums(Tensor(x)).schedule() if item.ast.op is not Ops.COPY]
  for item in items:
    uops = linearize(optimize_kernel(lower_for_codegen(item.ast)))
    check_linear(uops)   # raises when a uop reads one emitted after it (here: a row test before the row loop)
  want = np.flip(x, 0)[None].repeat(2, 0)
  want = np.pad(want, ((0, 0), (0, 2), (2, 2), (0, 1))).sum(2)
  want = want + np.flip(want, 0) * 0.5
  got = _padded_row_sums(Tensor(x)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"worst difference {np.abs(got - want).max()}")
