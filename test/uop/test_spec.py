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

def test_thread_axes_must_name_the_kernels_loops():
  from kiln.codegen.threads import ThreadAxes
  out, a = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)
  rows = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 4),), 0)
  r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 8),), 1)
  total = UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.LOAD, dtypes.float32, (a, rows * 8 + r)), r), Ops.ADD)
  stores = (UOp(Ops.STORE, dtypes.void, (out, rows, total)),)
  check_lowered(UOp(Ops.SINK, dtypes.void, stores, ThreadAxes(split=0, chunked=1)))
  with pytest.raises(SpecError, match="not an output range"):
    check_lowered(UOp(Ops.SINK, dtypes.void, stores, ThreadAxes(split=1)))
  with pytest.raises(SpecError, match="not a reduced range"):
    check_lowered(UOp(Ops.SINK, dtypes.void, stores, ThreadAxes(chunked=0)))
