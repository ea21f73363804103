"""CUSTOM_BACKWARD nodes (kiln/gradient.py `custom_backward`): a value whose gradient a registered rule gives, and the
convolution's rule (kiln/mixin/conv.py `_conv_backward`), whose input gradient is a transposed convolution."""
import numpy as np
import pytest
from kiln import Tensor
from kiln.gradient import custom_backward, custom_backward_rules
from kiln.uop.ops import Ops, toposort
from kiln.schedule.kernelize import create_schedule

@pytest.fixture
def straight_through():
  """A rule that passes the gradient straight through (a rounding's usual training trick)."""
  custom_backward_rules["test_straight_through"] = lambda grad, node: (grad,)
  yield
  del custom_backward_rules["test_straight_through"]

def test_a_rule_replaces_the_backward_of_its_value(straight_through):
  xn = np.array([0.2, 1.7, -2.6, 3.5], np.float32)
  x = Tensor(xn, requires_grad=True)
  rounded = x.round()
  y = Tensor._wrap(custom_backward(rounded.uop, (x.uop,), "test_straight_through", ()))
  (y * Tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
  np.testing.assert_array_equal(y.numpy(), rounded.numpy())    # the value is untouched
  np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0, 4.0])   # round's own gradient would be 0

def test_an_unknown_rule_is_refused():
  with pytest.raises(KeyError, match="no rule registered as 'nope'"):
    custom_backward(Tensor.ones(2).uop, (), "nope", ())

def test_conv_input_gradient_is_one_transposed_convolution():
  x, w = Tensor.empty(2, 8, 16, 16, requires_grad=True), Tensor.empty(8, 8, 3, 3, requires_grad=True)
  out = x.conv2d(w, padding=1)
  assert any(u.op is Ops.CUSTOM_BACKWARD for u in toposort([out.uop]))
  (out * Tensor.empty(2, 8, 16, 16)).sum().backward()
  items = create_schedule([x.grad.uop]).items
  # through the windows' view, autograd would write a (2, 8, 16, 16, 3, 3) tensor before adding the windows back up
  assert max(b.size for item in items for b in item.bufs[:1]) <= 2 * 8 * 18 * 18, [i.bufs[0].size for i in items]

@pytest.mark.parametrize("kw", [dict(padding=-1), dict(dtype="float64")])
def test_convs_outside_the_rule_keep_plain_autograd(kw):
  x, w = Tensor.empty(1, 2, 6, 6), Tensor.empty(2, 2, 3, 3)
  op = (lambda: x._conv(w, None, 1, 1, 1, [(-1, -1)] * 2, None, "conv2d")) if "padding" in kw else \
    (lambda: x.conv2d(w, dtype=kw["dtype"]))
  assert not any(u.op is Ops.CUSTOM_BACKWARD for u in toposort([op().uop]))
