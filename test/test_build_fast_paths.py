"""The graph-building fast paths of kiln/tensor.py build what the general paths build and raise the same errors:
Python-scalar operands (x * 0.5, 1 - x: constants of different bits kept apart, PyTorch's dtype promotion), reshape
to a shape of known ints, and the table of live tensors an assign consults."""
import gc, math, os, sys
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.uop.ops import Ops
from kiln.tensor import _live_tensors

def general_path(x: Tensor, value, reverse: bool = False):
  """What the general path of _broadcasted builds: a 0-d constant, broadcast to x's shape by reshape and expand."""
  const = x._const_like(value).uop
  view = const.reshape((1,) * x.ndim).expand(x.shape)
  return (view, x.uop) if reverse else (x.uop, view)

@pytest.mark.parametrize("value", [0.5, 2, -0.0, 0.0, float("nan"), float("inf")])
@pytest.mark.parametrize("reverse", [False, True])
def test_same_nodes_as_general_path(value, reverse):
  x = Tensor.ones(3, 4)
  a, b = x._broadcasted(value, "mul", reverse)
  ga, gb = general_path(x, value, reverse)
  assert a.uop is ga and b.uop is gb

def test_signed_zero_and_nan_stay_distinct():
  x = Tensor([1.0, -2.0])
  plus, minus = (x * 0.0).uop, (x * -0.0).uop
  assert plus is not minus
  np.testing.assert_array_equal(np.signbit((x * -0.0).numpy()), [True, False])
  assert np.isnan((x + float("nan")).numpy()).all()

@pytest.mark.parametrize("dtype,value,expected", [(dtypes.int32, 0.5, dtypes.float32), (dtypes.bool, 1, dtypes.int32),
                                                 (dtypes.int32, 2, dtypes.int32), (dtypes.float16, 2.0, dtypes.float16),
                                                 (dtypes.uint8, -1, dtypes.uint8)])
def test_promotion(dtype, value, expected):
  x = Tensor([[1, 0, 1]], dtype=dtype)
  assert (x * value).dtype == expected and (value * x).dtype == expected

def test_values_against_numpy():
  rng = np.random.default_rng(0)
  a = rng.standard_normal((2, 3, 5)).astype(np.float32)
  x = Tensor(a)
  np.testing.assert_allclose((1 - x * 0.5 + 2).numpy(), 1 - a * 0.5 + 2, rtol=1e-6)
  np.testing.assert_allclose((3.0 / (x * x + 1)).numpy(), 3.0 / (a * a + 1), rtol=1e-6)
  np.testing.assert_allclose((x - np.float32(1.5)).numpy(), a - np.float32(1.5), rtol=1e-6)
  assert (Tensor(2.0) * 3).item() == 6.0   # a 0-d tensor takes the general path

def test_uint8_wraps_like_c():
  assert (Tensor([0, 255], dtype=dtypes.uint8) + 1).tolist() == [1, 0]

def test_cache_keeps_no_metadata():
  x = Tensor.ones(2, 2)
  y = x * 0.25
  view = y.uop.src[1]
  assert view.op is Ops.EXPAND and view.src[0].meta is None and view.src[0].src[0].meta is None
  assert math.isclose(y.numpy()[0, 0], 0.25)

def test_scalar_operand_is_labelled_and_is_no_live_tensor():
  x = Tensor.ones(2, 3)
  before = len(_live_tensors)
  y = x * 0.75
  view = y.uop.src[1]
  assert view.op is Ops.EXPAND and view.meta is not None and view.meta.startswith("mul ")
  assert view.meta.endswith(f"{os.path.basename(__file__)}:{sys._getframe().f_lineno - 3}")   # the user's line
  assert view.shape == (2, 3) and len(_live_tensors) == before + 1   # y only: the operand dies at once

@pytest.mark.parametrize("args", [((4, 6),), (4, 6), ((2, 2, 6),), ((24,),), (24,)])
def test_reshape_fast_path_same_node_and_values(args):
  a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  x = Tensor(a) + 0
  y = x.reshape(*args)
  want = a.reshape(*args)
  assert y.shape == want.shape and y.uop.op is Ops.RESHAPE and y.uop.src[0] is x.uop
  np.testing.assert_array_equal(y.numpy(), want)
  assert x.reshape(2, 3, 4) is x

def test_reshape_errors_still_name_the_user_line():
  x = Tensor.ones(2, 3)
  with pytest.raises(ValueError, match=r"reshape: cannot reshape \(2, 3\).*test_build_fast_paths.py:\d+"):
    x.reshape(4, 2)
  with pytest.raises(ValueError, match="only one axis can be -1"):
    x.reshape(-1, -1)
  with pytest.raises(TypeError, match="shape entries must be ints"):
    x.reshape(2, 3.0)
  with pytest.raises(TypeError, match="shape entries must be ints"):
    x.reshape(True, 6)   # a bool is no size, though it is an int to Python
  assert x.reshape(-1, 2).shape == (3, 2) and x.reshape(np.int64(3), 2).shape == (3, 2)

def test_live_tensors_sweeps_dead_entries():
  keep = [Tensor.ones(2) + i for i in range(50)]
  for i in range(5000): Tensor.ones(2) * i   # dies at once
  gc.collect()
  live = list(_live_tensors)
  assert all(any(t is k for t in live) for k in keep)
  assert len(_live_tensors.refs) < 5000 and _live_tensors.sweep_at >= 1024

def test_assign_still_computes_pending_readers_first():
  x = Tensor([1.0, 2.0]).realize()
  before = x * 10   # built before the assign: keeps the old values
  x.assign(Tensor([5.0, 6.0])).realize()
  assert before.tolist() == [10.0, 20.0] and x.tolist() == [5.0, 6.0]
