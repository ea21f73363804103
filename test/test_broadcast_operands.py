"""Binary ops of two tensors of one dtype and different shapes (kiln/tensor.py `_broadcasted`): the fast path for int
sizes builds exactly the nodes of the general broadcasting path (RESHAPE to the full rank, EXPAND), and the values
match NumPy's broadcasting."""
import numpy as np
import pytest
from kiln import Tensor
from kiln.uop.ops import Ops

PAIRS = [((4, 3, 5, 5), (1, 3, 1, 1)), ((1, 3, 1, 1), (4, 3, 5, 5)), ((2, 1), (1, 3)), ((4, 3), (3,)), ((3,), (2, 4, 3)),
         ((2, 1, 4), (3, 1)), ((5,), (1,)), ((1,), ())]

def general_path_node(op: Ops, a: Tensor, b: Tensor, shape: tuple) -> object:
  """The node the general path builds: each operand reshaped to the full rank and expanded (unchanged when equal)."""
  def operand(t: Tensor):
    u = t.uop
    return u.reshape((1,) * (len(shape) - len(u.shape)) + u.shape).expand(shape)
  return operand(a).alu(op, operand(b))

@pytest.mark.parametrize("a_shape, b_shape", PAIRS)
def test_broadcast_binary_ops_match_numpy_and_the_general_graph(a_shape, b_shape):
  rng = np.random.default_rng(0)
  a_np = rng.standard_normal(a_shape).astype(np.float32)
  b_np = rng.standard_normal(b_shape).astype(np.float32) + 3.0
  a, b = Tensor(a_np), Tensor(b_np)
  shape = np.broadcast_shapes(a_shape, b_shape)
  for got, want, op, x, y in [(a * b, a_np * b_np, Ops.MUL, a, b), (a + b, a_np + b_np, Ops.ADD, a, b),
                              (b - a, b_np - a_np, Ops.SUB, b, a), (a / b, a_np / b_np, Ops.FDIV, a, b)]:
    assert got.shape == shape, f"{a_shape} {op} {b_shape}: shape {got.shape} != {shape}"
    assert got.uop is general_path_node(op, x, y, shape), f"{a_shape} {op} {b_shape}: another graph"
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=f"{a_shape} {op} {b_shape}")
  # an expanded operand carries the label of the op it was expanded for, as the general path's Tensor did
  product = a * b   # (this line's number is in the label)
  for src in product.uop.src:
    if src.op is Ops.EXPAND: assert src.meta == product.uop.meta and src.meta.startswith("mul test_broadcast_operands.py:")

def test_broadcast_errors_and_mixed_dtypes_take_the_general_path():
  with pytest.raises(RuntimeError, match="cannot be broadcast"): Tensor.ones(2, 3) * Tensor.ones(4, 1, 2)
  mixed = Tensor([[1, 2]], dtype="int32") + Tensor([[0.5], [1.5]])
  np.testing.assert_allclose(mixed.numpy(), np.array([[1.5, 2.5], [2.5, 3.5]], np.float32))
