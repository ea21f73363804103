"""SWAP renames two loops of a kernel graph that is a fixed point of `symbolic` (kernel.py `substitute_simplified`):
the nodes above the renamed loops are rebuilt simplified, bottom-up. The result must be the graph that substituting
first and rewriting the whole graph with `symbolic` afterwards makes, and the kernel must compute the same values."""
from __future__ import annotations
import itertools
import numpy as np
import pytest
from kiln import Tensor
from kiln.uop.ops import UOp
from kiln.uop.pattern import graph_rewrite, substitute
from kiln.uop.symbolic import symbolic
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps
from kiln.codegen.opt.kernel import substitute_simplified
from kernel_runs import last_kernel_item, run_lowered

def _lowered() -> dict[str, UOp]:
  rng = np.random.default_rng(0)
  def f32(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()
  x, w = f32(1, 2, 6, 6), f32(3, 2, 3, 3)
  builds = {
    "matmul": lambda: (f32(8, 12) @ f32(12, 16)).relu(),
    "conv_window": lambda: x.conv2d(w, padding=1),
    "reshaped_sum": lambda: f32(4, 6, 8).reshape(6, 4, 8).permute(2, 0, 1).sum(axis=2),
    "padded": lambda: f32(6, 8).pad(((1, 2), (0, 3))).flip(1)[1:, 2:] * 3 + 1,
  }
  return {name: lower_kernel(last_kernel_item(build()).ast) for name, build in builds.items()}

LOWERED = _lowered()

@pytest.mark.parametrize("name", list(LOWERED))
@pytest.mark.parametrize("tiled", [False, True])
def test_swapped_graph_is_the_rewritten_substitution(name, tiled):
  kernel = Kernel(graph_rewrite(LOWERED[name], symbolic))
  if tiled:   # an upcast first: the swap renames loops under many copies of the body and their index sums
    out = kernel.output_axes
    kernel.apply(Opt(OptOps.UPCAST, len(out) - 1, 2 if Kernel.size(out[-1]) % 4 else 4))
  checked = 0
  n_out, axes = len(kernel.output_axes), kernel.axes
  for i, j in itertools.combinations(range(len(axes)), 2):
    if (i < n_out) != (j < n_out): continue
    a, b = axes[i], axes[j]
    mapping = {a: a.replace(arg=b.arg), b: b.replace(arg=a.arg)}
    fast = substitute_simplified(kernel.sink, mapping)
    slow = graph_rewrite(substitute(kernel.sink, mapping), symbolic)
    assert fast is slow, f"{name}: swapping axes {i} and {j} differs from the rewritten substitution"
    assert graph_rewrite(fast, symbolic) is fast
    checked += 1
  assert checked > 0 or len(axes) < 2

def test_swap_of_a_tiled_matmul_matches_numpy():
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal((12, 16)).astype(np.float32)
  item = last_kernel_item((Tensor(a).realize() @ Tensor(b).realize()).relu())
  kernel = Kernel(lower_kernel(item.ast)).apply(Opt(OptOps.UPCAST, 1, 4)).apply(Opt(OptOps.SWAP, 0, 1))
  assert [o.op for o in kernel.applied] == [OptOps.UPCAST, OptOps.SWAP]
  np.testing.assert_allclose(run_lowered(item, kernel.sink).reshape(8, 16), np.maximum(a @ b, 0), rtol=1e-5,
                             atol=1e-5)
