"""The optimizer's copies of a kernel body are simplified as they are built (kernel.py `substitute_copies` with
`simplified`, pattern.py `settle`, and index sums shifted by a constant from the first copy): the result must be the
graph that copying first and rewriting the whole graph with `symbolic` afterwards makes, a fixed point of `symbolic`,
and equal in value to the unsimplified copies."""
from __future__ import annotations
import itertools
import numpy as np
import pytest
from kiln import Tensor
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.pattern import graph_rewrite, settle
from kiln.uop.symbolic import symbolic
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps
from kiln.codegen.opt.kernel import substitute_copies, graph_nodes
from kiln.codegen.opt.heuristic import evaluate_index
from kernel_runs import last_kernel_item
from uop_numpy_eval import evaluate

def _lowered() -> dict[str, UOp]:
  rng = np.random.default_rng(0)
  def f32(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()
  x, w = f32(1, 2, 6, 6), f32(3, 2, 3, 3)
  a = f32(6, 8)
  builds = {
    "matmul": lambda: (f32(8, 12) @ f32(12, 16)).relu(),
    "conv_window": lambda: x.conv2d(w, padding=1),
    "padded_masked": lambda: a.pad(((1, 2), (0, 3))).flip(1)[1:, 2:] * 3 + 1,
    "softmax_rows": lambda: a.softmax(axis=1),
    "reshaped_sum": lambda: f32(4, 6, 8).reshape(6, 4, 8).permute(2, 0, 1).sum(axis=2),
  }
  return {name: lower_kernel(last_kernel_item(build()).ast) for name, build in builds.items()}

LOWERED = _lowered()

def _lane_values(rng: UOp, amount: int) -> list[UOp]:
  outer = rng.replace(src=(UOp.const(dtypes.int32, rng.src[0].arg // amount),))
  return [graph_rewrite(outer * amount + lane, symbolic) for lane in range(amount)]

@pytest.mark.parametrize("name", list(LOWERED))
def test_simplified_copies_are_the_rewritten_copies(name):
  sink = graph_rewrite(LOWERED[name], symbolic)
  kernel = Kernel(sink)
  checked = 0
  for rng, amount in itertools.product(kernel.axes, (2, 3, 4)):
    if Kernel.size(rng) is None or Kernel.size(rng) % amount: continue
    lanes = _lane_values(rng, amount)
    for store in sink.src:
      fast = substitute_copies(store, rng, lanes, simplified=True)
      slow = [graph_rewrite(copy, symbolic) for copy in substitute_copies(store, rng, lanes)]
      assert all(f is s for f, s in zip(fast, slow)), f"{name}: axis {rng.arg} by {amount} differs"
      assert all(graph_rewrite(f, symbolic) is f for f in fast), f"{name}: a copy is not a fixed point"
      checked += 1
  assert checked > 0

def test_settle_is_graph_rewrite_over_rewritten_sources():
  r0 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 8),), 0)
  r1 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 6),), 1)
  exprs = [(r0 * 6 + r1) // 6, (r0 * 6 + r1) % 6, (r0 + 3) * 4 - r0, (r0 * 2 + 1).lt(17), r1.lt(6)]
  for expr in exprs:
    sources = tuple(graph_rewrite(s, symbolic) for s in expr.src)
    settled = settle(expr.replace(src=sources), symbolic)
    assert settled is graph_rewrite(expr, symbolic), f"settle({expr.render()}) = {settled.render()}"
    for a, b in itertools.product(range(8), range(6)):
      assert evaluate_index(settled, {r0: a, r1: b}) == evaluate_index(expr, {r0: a, r1: b})

def test_shifted_index_sums_equal_each_copy_rewritten():
  # a sum linear in the copied range, another term over a second range, a division that also reads the range
  r0 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 64),), 0)
  r1 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 5),), 1)
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  index = graph_rewrite(r0 * 40 + r1 * 3 + 7, symbolic)
  divided = graph_rewrite((r0 * 3 + r1) // 4, symbolic)
  store = UOp(Ops.STORE, dtypes.void, (buf, index, UOp(Ops.LOAD, dtypes.float32, (buf, divided))))
  lanes = _lane_values(r0, 16)
  fast = substitute_copies(store, r0, lanes, simplified=True)
  slow = [graph_rewrite(copy, symbolic) for copy in substitute_copies(store, r0, lanes)]
  assert all(f is s for f, s in zip(fast, slow))
  outer = lanes[0].src[0]   # lane 0 is outer*16
  assert outer.op is Ops.RANGE and outer.src[0].arg == 4
  for lane, copy in enumerate(fast):
    for a, b in itertools.product(range(4), range(5)):
      assert evaluate_index(copy.src[1], {outer: a, r1: b}) == (a * 16 + lane) * 40 + b * 3 + 7
      assert evaluate_index(copy.src[2].src[1], {outer: a, r1: b}) == ((a * 16 + lane) * 3 + b) // 4

@pytest.mark.parametrize("constant_lanes", [True, False])
def test_sums_with_terms_that_fold_per_lane_equal_each_copy_rewritten(constant_lanes):
  # a padded axis (16 for 14 elements: the clamp where(r < 14, r, 13)) inside a sum, next to the range itself and a
  # quotient of it: with constant lanes (a whole upcast) both fold to a constant in every lane and the copies after
  # the first are shifted from it; with lanes outer*4 + c they do not fold and each copy is rewritten on its own
  r0 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 16),), 0)
  r1 = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 5),), 1)
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  clamped = r0.lt(14).where(r0, UOp.const(dtypes.int32, 13))
  sums = {clamped * 32 + r1 * 3 + 5: lambda r, b: np.minimum(r, 13) * 32 + b * 3 + 5,
          clamped * 32 + r0 + r1 * 7 + 2: lambda r, b: np.minimum(r, 13) * 32 + r + b * 7 + 2,
          (r0 // 3) * 9 + r1 * 4 - r0 * 2 + 1: lambda r, b: (r // 3) * 9 + b * 4 - r * 2 + 1}
  stores = [UOp(Ops.STORE, dtypes.void, (buf, graph_rewrite(index, symbolic), UOp.const(dtypes.float32, 1.0)))
            for index in sums]
  lanes = [UOp.const(dtypes.int32, c) for c in range(16)] if constant_lanes else _lane_values(r0, 4)
  outer = None if constant_lanes else lanes[0].src[0]
  for store, (index, value) in zip(stores, sums.items()):
    fast = substitute_copies(store, r0, lanes, simplified=True)
    slow = [graph_rewrite(copy, symbolic) for copy in substitute_copies(store, r0, lanes)]
    assert all(f is s for f, s in zip(fast, slow)), f"{index.render()}: a shifted copy differs"
    assert all(graph_rewrite(f, symbolic) is f for f in fast)
    for lane, copy in enumerate(fast):
      a, b = np.meshgrid(np.arange(1 if constant_lanes else 4, dtype=np.int32), np.arange(5, dtype=np.int32))
      want = value(lane + 0 * a if constant_lanes else a * 4 + lane, b)
      got = evaluate(copy.src[1], {r1: b} if constant_lanes else {outer: a, r1: b})
      np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want, err_msg=f"{index.render()} lane {lane}")

def test_graph_nodes_is_the_toposort_of_each_graph():
  sink = LOWERED["matmul"]
  assert graph_nodes(sink) is graph_nodes(sink)   # remembered
  upcast = Kernel(sink).apply(Opt(OptOps.UPCAST, 0, 2)).sink
  assert graph_nodes(upcast) == upcast.toposort() and graph_nodes(sink) == sink.toposort()
