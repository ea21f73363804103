"""UOp: hash-consing, graph walks on deep graphs, value ranges, and the shapes of tensor-level movement ops."""
from __future__ import annotations
import math, pickle
import pytest
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort

I32 = dtypes.int32

def c(value, dtype=I32) -> UOp: return UOp.const(dtype, value)

# ---------------------------------------------------------------------------------------------------------------------
# hash-consing

def test_equal_nodes_are_the_same_object():
  a = UOp.variable("a", 0, 10)
  assert UOp.variable("a", 0, 10) is a
  assert (a + 1) * 2 is (a + 1) * 2
  assert UOp(Ops.ADD, I32, (a, c(1))) is a + 1
  assert (a + 1).replace(op=Ops.MUL) is a * 1
  assert UOp.variable("a", 0, 11) is not a and a + 1 is not c(1) + a

def test_constants_of_different_bits_are_different_nodes():
  assert c(0.0, dtypes.float32) is not c(-0.0, dtypes.float32)
  assert math.copysign(1, c(-0.0, dtypes.float32).arg) == -1
  assert c(1) is not c(True, dtypes.bool)
  assert UOp(Ops.CONST, I32, (), 1) is not UOp(Ops.CONST, I32, (), True)   # 1 == True in Python
  one_f32 = c(1, dtypes.float32)
  assert one_f32 is not c(1) and one_f32.arg == 1.0 and isinstance(one_f32.arg, float)
  assert c(1.0, dtypes.float32) is c(1, dtypes.float32)
  nan = c(math.nan, dtypes.float32)
  assert c(math.nan, dtypes.float32) is nan and nan is not c(math.inf, dtypes.float32)

def test_const_values_are_normalized_to_the_dtype():
  assert c(2 ** 31) is c(-2 ** 31)                      # wraps
  assert c(300, dtypes.uint8).arg == 44
  assert c(3.9).arg == 3 and c(-3.9).arg == -3          # truncates toward zero
  assert c(5, dtypes.bool).arg is True
  assert c(math.inf).arg == 2 ** 31 - 1 and c(-math.inf).arg == -2 ** 31

def test_tensor_and_kernel_constants_differ():
  kernel, tensor = c(1), UOp.const(I32, 1, device="CPU")
  assert kernel is not tensor and tensor.src[0].op is Ops.DEVICE
  assert kernel.shape is None and tensor.shape == () and tensor.device == "CPU"

def test_buffers_are_unique_and_args_must_be_hashable():
  assert UOp.new_buffer("CPU", 4, dtypes.float32) is not UOp.new_buffer("CPU", 4, dtypes.float32)
  with pytest.raises(TypeError, match="hashable"): UOp(Ops.RESHAPE, I32, (), [2, 2])

def test_a_dead_nodes_late_callback_keeps_the_newer_node_of_its_key():
  import gc
  from kiln.uop import ops
  node = c(987654)
  key = (Ops.CONST, I32, (), 987654)
  newer_ref = ops._uop_refs[key]
  class Dead: pass
  dead = Dead()
  stale = ops._NodeRef(dead)   # stands for the reference of an earlier node of this key, its callback run late
  stale.key = key
  ops._drop_node(stale)
  assert ops._uop_refs[key] is newer_ref and c(987654) is node
  del node
  gc.collect()
  assert key not in ops._uop_refs   # the node itself dying forgets its key
  del dead

def test_pickle_round_trip_keeps_identity():
  expr = (UOp.variable("a", 0, 10) + 1) * 3
  assert pickle.loads(pickle.dumps(expr)) is expr

# ---------------------------------------------------------------------------------------------------------------------
# graph walks

def test_toposort_puts_sources_first_and_dedups():
  a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
  shared = a + b
  expr = shared * shared + a
  order = expr.toposort()
  assert len(order) == len(set(order)) and order[-1] is expr
  position = {u: i for i, u in enumerate(order)}
  assert all(position[s] < position[u] for u in order for s in u.src)
  assert set(order) == {a, b, shared, shared * shared, expr}

def test_toposort_stop_leaves_sources_out():
  a = UOp.variable("a", 0, 10)
  expr = (a + 1) * 2
  assert toposort([expr], stop=lambda u: u.op is Ops.ADD) == [a + 1, c(2), expr]

def test_toposort_of_a_10000_deep_chain():
  node = UOp.variable("a", 0, 10)
  for _ in range(10_000): node = node + 1
  order = node.toposort()
  assert len(order) == 10_002 and order[-1] is node and order[0].op is Ops.DEFINE_VAR

def test_ranges_of_a_deep_chain():
  node = UOp.variable("a", 0, 10)
  for _ in range(10_000): node = node + 1
  assert (node.vmin, node.vmax) == (10_000, 10_010)

def test_render():
  r0 = UOp(Ops.RANGE, I32, (c(4),), arg=0)
  a = UOp.variable("a", 0, 10)
  assert ((r0 * 4 + a) // 3 % 2).render() == "((((ridx0*4)+a)//3)%2)"
  assert r0.lt(2).where(a, c(0)).render() == "((ridx0<2)?a:0)"
  assert r0.maximum(a).render() == "max(ridx0, a)"

# ---------------------------------------------------------------------------------------------------------------------
# value ranges

def test_value_ranges():
  a, n = UOp.variable("a", -3, 10), UOp.variable("n", 1, 8)
  r = UOp(Ops.RANGE, I32, (n,), arg=0)
  assert (r.vmin, r.vmax) == (0, 7)
  assert ((a * -2).vmin, (a * -2).vmax) == (-20, 6)
  assert ((a // 2).vmin, (a // 2).vmax) == (-1, 5)          # C truncation: -3//2 == -1
  assert ((a % 4).vmin, (a % 4).vmax) == (-3, 3)
  assert ((n % 16).vmin, (n % 16).vmax) == (1, 8)
  assert (a.lt(11).vmin, a.lt(11).vmax) == (True, True)
  full = UOp.variable("full", -2 ** 31, 2 ** 31 - 1)
  assert ((full + 1).vmin, (full + 1).vmax) == (-2 ** 31, 2 ** 31 - 1)   # may wrap: no knowledge
  assert ((full // -1).vmin, (full // -1).vmax) == (-2 ** 31, 2 ** 31 - 1)
  big = UOp.variable("big", 2 ** 62 + 1, 2 ** 62 + 1, dtypes.int64)
  assert (big // 3).vmin == (2 ** 62 + 1) // 3                         # exact, not via floats

# ---------------------------------------------------------------------------------------------------------------------
# tensor-level shapes

def test_movement_op_shapes():
  buf = UOp.new_buffer("CPU", 24, dtypes.float32)
  assert buf.shape == (24,) and buf.device == "CPU" and buf.size == 24
  x = UOp(Ops.RESHAPE, buf.dtype, (buf,), (2, 3, 4))
  assert x.shape == (2, 3, 4)
  p = UOp(Ops.PERMUTE, x.dtype, (x,), (2, 0, 1))
  assert p.shape == (4, 2, 3)
  e = UOp(Ops.EXPAND, x.dtype, (UOp(Ops.RESHAPE, x.dtype, (p,), (4, 1, 2, 3)),), (4, 5, 2, 3))
  assert e.shape == (4, 5, 2, 3) and e.size == 120
  padded = UOp(Ops.PAD, x.dtype, (x,), ((1, 0), (0, 2), (3, 3)))
  assert padded.shape == (3, 5, 10)
  shrunk = UOp(Ops.SHRINK, x.dtype, (padded,), ((0, 2), (1, 4), (2, 9)))
  assert shrunk.shape == (2, 3, 7)
  flipped = UOp(Ops.FLIP, x.dtype, (shrunk,), (0, 2))
  assert flipped.shape == (2, 3, 7)
  assert flipped.base is padded.src[0].src[0] is buf and flipped.device == "CPU"
  reduced = UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (Ops.ADD, (1,)))
  assert reduced.shape == (2, 1, 4)

def test_elementwise_shapes_follow_their_operands():
  buf = UOp.new_buffer("CPU", 6, dtypes.float32)
  x = UOp(Ops.RESHAPE, buf.dtype, (buf,), (2, 3))
  one = UOp(Ops.EXPAND, x.dtype, (UOp(Ops.RESHAPE, x.dtype, (UOp.const(x.dtype, 1.0, device="CPU"),), (1, 1)),), (2, 3))
  assert (x + one).shape == (2, 3) and x.lt(one).shape == (2, 3) and x.lt(one).dtype == dtypes.bool
  assert x.cast(dtypes.int32).shape == (2, 3)
  iota = UOp(Ops.IOTA, I32, (UOp(Ops.DEVICE, arg="CPU"),), 5)
  assert iota.shape == (5,)
  assert (UOp.variable("a", 0, 3) + 1).shape is None   # kernel-level nodes have no shape
