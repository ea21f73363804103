"""The paths a model's second call takes (graph building, the schedule cache's key, launches) build and run what the
general paths do: matmul's node-level fast path gives the same nodes and labels as the Tensor-level path, node labels
are formatted once per public call, launches reuse host addresses and ctypes array types without making garbage."""
import gc
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.uop.ops import Ops, toposort
from kiln.runtime import ops_cpu

def general_matmul(x: Tensor, w: Tensor) -> Tensor:
  """x @ w as Tensor.dot's general path builds it (x as (..., n, 1, k), w transposed as (..., 1, m, k), summed)."""
  wt = w.transpose(-1, -2)
  wt = wt.reshape(*wt.shape[:-2], 1, *wt.shape[-2:])
  xr = x.reshape(*x.shape[:-1], 1, x.shape[-1])
  if x.dtype in (dtypes.float16, dtypes.bfloat16):   # half products and their sum in float32, rounded once
    xr, wt = xr._broadcasted(wt, "matmul")
    return (xr.float() * wt.float()).sum(-1).cast(x.dtype)
  return (xr * wt).sum(-1)

@pytest.mark.parametrize("x_shape,w_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                             ((3, 4), (2, 4, 5))])
def test_matmul_fast_path_builds_the_general_graph(x_shape, w_shape):
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
  x, w = Tensor(a), Tensor(b)
  fast = x @ w
  assert fast.uop is general_matmul(x, w).uop   # hash-consing: the same graph is the same node
  np.testing.assert_allclose(fast.numpy(), a @ b, rtol=1e-5, atol=1e-5)

def nodes_reading(out: Tensor, *inputs: Tensor) -> set:
  """The nodes between `inputs` and `out` (nodes that read no input, constants, may be shared with graphs built
  elsewhere, and keep the label they got there)."""
  reading = {t.uop for t in inputs}
  for node in toposort([out.uop], stop=lambda n: n in reading):
    if any(s in reading for s in node.src): reading.add(node)
  return reading - {t.uop for t in inputs}

def test_matmul_fast_path_labels_its_nodes_like_the_general_path():
  x, w = Tensor(np.ones((2, 3, 4), np.float32)), Tensor(np.ones((4, 5), np.float32))   # new buffers: all nodes new
  out = x @ w; line = "test_second_call_paths.py:"   # noqa: E702
  made = nodes_reading(out, x, w)
  labelled = {n.meta for n in made if n.meta is not None}
  assert len(labelled) == 1 and next(iter(labelled)).startswith("matmul " + line), labelled
  # as in the general path, only the reshape in front of a broadcast (never wrapped in a Tensor) has no label
  assert all(n.op is Ops.RESHAPE for n in made if n.meta is None) and len(made) == 9

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.int8])
def test_matmul_general_path_still_serves_dtypes_that_sum_wider(dtype):
  a, b = np.arange(12).reshape(3, 4) % 5, np.arange(8).reshape(4, 2) % 3
  x, w = Tensor(a, dtype=dtype), Tensor(b, dtype=dtype)
  out = x @ w
  assert out.uop is general_matmul(x, w).uop
  np.testing.assert_allclose(out.numpy().astype(np.float64), a @ b)

def test_matmul_errors_unchanged():
  with pytest.raises(ValueError, match=r"matmul: inner dimensions differ, \(2, 3\) @ \(4, 5\).*test_second_call_paths"):
    Tensor.ones(2, 3) @ Tensor.ones(4, 5)
  with pytest.raises(ValueError, match=r"matmul: shapes .* cannot be broadcast together"):
    Tensor.ones(2, 3, 4) @ Tensor.ones(3, 4, 5)

def test_nodes_of_one_public_call_share_its_label_and_a_callback_gets_its_own_line():
  x = Tensor(np.ones((4, 4), np.float32))   # a new buffer: every node below is new
  y = x.softmax(-1)   # several nodes, one public call
  labels = {n.meta for n in nodes_reading(y, x)}
  assert len(labels) == 1 and next(iter(labels)).startswith("softmax test_second_call_paths.py:"), labels
  seen = []
  def user_layer(t: Tensor) -> Tensor:
    out = t * 3; seen.append(out.uop.meta)   # noqa: E702 -- user code called back from a public method: this line
    return out
  line = user_layer.__code__.co_firstlineno + 1
  x.sequential([lambda t: t + 1, user_layer])
  assert seen == [f"sequential test_second_call_paths.py:{line}"], seen

def test_repeated_realizes_make_no_reference_cycles(monkeypatch):
  monkeypatch.setattr(ops_cpu, "MIN_WORK_PER_THREAD", 1)   # every launch through the pool (ctypes arrays)
  rng = np.random.default_rng(1)
  x, w = Tensor(rng.standard_normal((64, 64)).astype(np.float32)), Tensor(rng.standard_normal((64, 64)).astype(np.float32))
  def forward(): return ((x @ w).relu() @ w).softmax(-1).realize()
  for _ in range(2): forward()
  gc.collect()
  was = gc.get_debug()
  gc.set_debug(gc.DEBUG_SAVEALL)
  try:
    for _ in range(3): forward()
    gc.collect()
    garbage = [type(o).__name__ for o in gc.garbage]
  finally:
    gc.set_debug(was)
    gc.garbage.clear()
  assert garbage == [], f"reference cycles made per call: {garbage[:20]}"

def test_host_address_follows_the_array_it_was_asked_for():
  a = np.zeros(16, np.uint8)
  assert ops_cpu.host_address(a) == a.ctypes.data and ops_cpu.host_address(a) == a.ctypes.data
  view = a[4:]
  assert ops_cpu.host_address(view) == a.ctypes.data + 4
  for _ in range(50):   # a dead array's id may be reused by a new one: its own address, never the old one
    b = np.zeros(16, np.uint8)
    assert ops_cpu.host_address(b) == b.ctypes.data
    del b
