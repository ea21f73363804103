"""Axes of any size get register tiles: PADTO (an axis run to a multiple of k, its extra iterations repeating the last
element or adding the identity) and UPCAST by an amount that does not divide the axis (the last tile shifted back
over the one before it). Results must equal the unoptimized kernel's, and tiled kernels still split across threads."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor
from kiln.codegen.opt import Kernel, Opt, OptOps, KernelOptError, heuristic_opts
from kiln.codegen.linearizer import linearize
from kiln.codegen.parallel import find_parallel_loop
from kiln.engine.realize import lower_for_codegen
from kernel_runs import last_kernel_item, run_lowered

def _f32(*shape: int, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()

@pytest.mark.parametrize("m, k, n", [(37, 45, 53), (19, 5, 33), (1, 17, 19), (61, 64, 67)])
def test_heuristic_tiles_odd_matmuls(m, k, n):
  a, b = _f32(m, k), _f32(k, n, seed=1)
  item = last_kernel_item(a @ b)
  lowered = lower_for_codegen(item.ast)
  kernel = Kernel(lowered)
  applied = heuristic_opts(kernel)
  got = run_lowered(item, kernel.sink).reshape(m, n)
  np.testing.assert_allclose(got, a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4, err_msg=str(applied))
  if min(m, n) >= 32: assert sum(o.op is OptOps.UPCAST for o in applied) == 2, f"no 2-d tile: {applied}"

@pytest.mark.parametrize("opts", [
  [Opt(OptOps.UPCAST, 0, 8)],                                   # rows 13 -> tiles 0-7 and 5-12
  [Opt(OptOps.UPCAST, 1, 16)],                                  # columns 21 -> tiles 0-15 and 5-20
  [Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 4)],          # rows 13 -> 16, the last 3 repeat row 12
  [Opt(OptOps.PADTO, 2, 4), Opt(OptOps.UNROLL, 2, 4)],          # reduce 11 -> 12, adding 0 once
  [Opt(OptOps.PADTO, 2, 4), Opt(OptOps.LANES, 2, 4)],
  [Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 8)],   # both kinds
])
def test_actions_keep_results(opts):
  item = last_kernel_item(_f32(13, 11) @ _f32(11, 21, seed=1))
  lowered = lower_for_codegen(item.ast)
  want = run_lowered(item, lowered)
  kernel = Kernel(lowered)
  for opt in opts: kernel.apply(opt)
  np.testing.assert_allclose(run_lowered(item, kernel.sink), want, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("reduce", ["max", "min", "prod"])
def test_padded_reduce_adds_the_identity(reduce):
  x = Tensor(-np.abs(np.random.default_rng(2).standard_normal((6, 13)).astype(np.float32)) - 1).realize()
  item = last_kernel_item(getattr(x, reduce)(axis=1))
  lowered = lower_for_codegen(item.ast)
  kernel = Kernel(lowered).apply(Opt(OptOps.PADTO, 1, 4))   # 13 -> 16: three iterations of the identity
  assert Kernel.size(kernel.reduce_axes[0]) == 16
  assert np.array_equal(run_lowered(item, kernel.sink), getattr(x.numpy(), reduce)(axis=1))

def test_tiled_odd_matmul_still_splits_across_threads():
  item = last_kernel_item(_f32(100, 30) @ _f32(30, 99, seed=1))
  kernel = Kernel(lower_for_codegen(item.ast))
  applied = heuristic_opts(kernel)
  assert any(o.op is OptOps.PADTO for o in applied), applied
  parallel = find_parallel_loop(linearize(kernel.sink))
  assert parallel is not None and parallel.loop.src[0].arg == 13   # 100 rows padded to 104, in tiles of 8

def test_in_place_kernels_refuse_repeated_stores():
  x = _f32(13)
  x.assign(x * 2 + 1)
  item = last_kernel_item(x)
  kernel = Kernel(lower_for_codegen(item.ast))
  if not kernel._reads_own_output(): pytest.skip("this assign was not scheduled as an in-place kernel")
  for opt in (Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 8)):
    with pytest.raises(KernelOptError, match="reads a buffer it writes"): kernel.apply(opt)
  assert kernel.applied == []

@pytest.mark.parametrize("opt, why", [
  (Opt(OptOps.PADTO, 0, 4), "does not divide"),      # 12 rows: already a multiple of 4
  (Opt(OptOps.PADTO, 0, 16), "quarter"),             # 12 -> 16 is a third more work
  (Opt(OptOps.PADTO, 0, 1), "does not divide"),
  (Opt(OptOps.UPCAST, 0, 13), "divides"),            # wider than the axis
])
def test_invalid_padding_is_refused(opt, why):
  item = last_kernel_item(_f32(12, 7) @ _f32(7, 9, seed=1))
  kernel = Kernel(lower_for_codegen(item.ast))
  with pytest.raises(KernelOptError, match=why): kernel.apply(opt)
  assert kernel.applied == []
