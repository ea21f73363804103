"""spec.py catches malformed graphs at the stage that made them."""
import pytest
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.uop.spec import SpecError, check_tensor_graph, check_lowered, check_linear

def test_tensor_graph_with_mismatched_operands_is_rejected():
  a = UOp.new_buffer("CPU", 4, dtypes.float32).reshape((4,))
  b = UOp.new_buffer("CPU", 2, dtypes.float32).reshape((2,))
  with pytest.raises(SpecError, match="operand shapes differ"): check_tensor_graph([a.alu(Ops.ADD, b)])
  with pytest.raises(SpecError, match="cannot expand"): check_tensor_graph([UOp(Ops.EXPAND, dtypes.float32, (a,), (8,))])
  check_tensor_graph([a.alu(Ops.ADD, a)])   # a well-formed graph passes

def test_lowered_kernel_with_tensor_ops_left_is_rejected():
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  leftover = UOp(Ops.RESHAPE, dtypes.float32, (buf,), (4,))
  store = UOp(Ops.STORE, dtypes.void, (buf, UOp.const(dtypes.int32, 0), leftover))
  with pytest.raises(SpecError, match="tensor-level op left"): check_lowered(UOp(Ops.SINK, dtypes.void, (store,)))

def test_linear_kernel_with_open_loop_or_late_source_is_rejected():
  rng = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 4),), 0)
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  store = UOp(Ops.STORE, dtypes.void, (buf, rng, UOp.const(dtypes.float32, 1.0)))
  end = UOp(Ops.ENDRANGE, dtypes.void, (rng,))
  one = UOp.const(dtypes.float32, 1.0)
  with pytest.raises(SpecError, match="never closed"): check_linear([rng.src[0], buf, rng, one, store])
  with pytest.raises(SpecError, match="comes later"): check_linear([rng.src[0], rng, one, store, buf, end])
  check_linear([rng.src[0], buf, rng, UOp.const(dtypes.float32, 1.0), store, end])
