"""Lowering kernels over symbolic sizes (kiln/codegen/lowerer.py): an output axis of size c*v loops as v around c
(a constant axis the optimizer can vectorize), and a reshape over symbolic sizes maps each group of axes on its own
(an upsampling's (2h) -> (h, 2) divides by 2, not by a size). Each result is checked against numpy."""
import numpy as np
from kiln import Tensor, Variable
from kiln.codegen.lowerer import lower_kernel, constant_factor
from kiln.schedule.kernelize import create_schedule
from kiln.uop.ops import Ops, UOp

def lowered(t: Tensor) -> UOp:
  items = [item for item in create_schedule([t.uop]).items if item.ast.op is Ops.SINK]
  return lower_kernel(items[-1].ast)

def constant_ranges(sink: UOp) -> list[int]:
  return sorted(u.src[0].arg for u in sink.toposort() if u.op is Ops.RANGE and u.src[0].op is Ops.CONST)

def divisions_by_sizes(sink: UOp) -> list[UOp]:
  return [u for u in sink.toposort() if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is not Ops.CONST]

def test_constant_factor():
  v = Variable("v", 1, 8)
  assert constant_factor(v * 16) == 16 and constant_factor(v * 64 + 32) == 16 and constant_factor(v * 6) == 2
  assert constant_factor(v) == 1 and constant_factor(v * 4 + 2) == 2

def test_an_axis_in_whole_steps_loops_over_its_steps():
  x_np = np.arange(3 * 128, dtype=np.float32).reshape(3, 128)
  x = Tensor(x_np).realize()
  for v in (2, 5):
    y = (x[:, 0:Variable("v", 1, 8).bind(v) * 16] * 2 + 1)
    assert 16 in constant_ranges(lowered(y))   # the inner loop of each step: 16 wide
    np.testing.assert_allclose(y.numpy(), x_np[:, :16 * v] * 2 + 1)

def test_an_upsampling_over_symbolic_sizes_divides_by_constants():
  x_np = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
  x = Tensor(x_np).realize()
  for h, w in ((3, 5), (8, 2)):
    part = x[:, :, 0:Variable("h", 1, 8).bind(h), 0:Variable("w", 1, 8).bind(w)]
    up = part.reshape(2, 3, part.shape[2], 1, part.shape[3], 1).expand(2, 3, part.shape[2], 2, part.shape[3], 2)
    up = up.reshape(2, 3, part.shape[2] * 2, part.shape[3] * 2) + 1
    assert not divisions_by_sizes(lowered(up))
    np.testing.assert_allclose(up.numpy(), x_np[:, :, :h, :w].repeat(2, 2).repeat(2, 3) + 1)

def test_a_long_axis_in_no_steps_runs_in_overlapping_tiles():
  # sizes 17-40: ceil(n/16) tiles of 16, the last shifted back to end at n (its overlap computed twice, alike)
  rng = np.random.default_rng(2)
  x_np, w_np = rng.standard_normal((1, 8, 5, 40)).astype(np.float32), rng.standard_normal((6, 8, 1, 3)).astype(np.float32)
  x, w = Tensor(x_np).realize(), Tensor(w_np).realize()
  for n in (17, 23, 40):
    part = x[:, :, :, 0:Variable("n", 17, 40).bind(n)]
    y = part.conv2d(w, padding=(0, 1)) * 2
    assert 16 in constant_ranges(lowered(y))
    want = np.stack([sum(np.einsum("chw,oc->ohw", np.pad(x_np[0, :, :, :n], ((0, 0), (0, 0), (1, 1)))[:, :, j:j + n],
                                   w_np[:, :, 0, j]) for j in range(3))]) * 2
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)

def test_a_kernels_only_axis_gets_no_overlapping_tiles():
  # the thread split takes the outermost loop and needs its iterations' stores disjoint
  x_np = np.arange(40, dtype=np.float32)
  x = Tensor(x_np).realize()
  y = x[0:Variable("n", 17, 40).bind(23)] * 3
  assert 16 not in constant_ranges(lowered(y))
  np.testing.assert_allclose(y.numpy(), x_np[:23] * 3)
