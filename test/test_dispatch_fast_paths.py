"""The eager dispatch path's shortcuts keep their rules: the schedule cache drops its least recently used template
(a hit counts as a use), the key walk leaves the recursion limit as it found it, DISK buffers are never cached, and
the results registered under a buffer are forgotten when it is overwritten, and tanh's node-level build is the graph
of its Tensor ops."""
from __future__ import annotations
import sys
import numpy as np
import pytest
from kiln import Tensor
from kiln.schedule import cache

def _stats_after(fn):
  before = dict(cache.stats)
  out = fn()
  return out, {k: cache.stats[k] - before[k] for k in before}

def test_the_least_recently_used_template_is_dropped_first(monkeypatch):
  monkeypatch.setattr(cache, "MAX_ENTRIES", 3)
  cache._templates.clear()
  a = Tensor(np.float32([1, 2, 3])).realize()
  graphs = {"add": lambda: a + 1, "mul": lambda: a * 3, "sub": lambda: a - 5, "max": lambda: a.maximum(2)}
  for name in ("add", "mul", "sub"): graphs[name]().realize()
  _, hit = _stats_after(lambda: graphs["add"]().realize())   # a hit: "add" is the newest use now
  assert hit["hits"] == 1
  graphs["max"]().realize()   # a fourth template: "mul", the least recently used, goes
  assert len(cache._templates) == 3
  out, stats = _stats_after(lambda: graphs["add"]().realize())
  assert stats["hits"] == 1 and out.tolist() == [2, 3, 4]
  out, stats = _stats_after(lambda: graphs["mul"]().realize())
  assert stats["misses"] == 1 and out.tolist() == [3, 6, 9]

def test_the_key_walk_restores_the_recursion_limit():
  limit = sys.getrecursionlimit()
  a = Tensor(np.float32([1, 2])).realize()
  x = a
  for _ in range(3000): x = x + 1   # deeper than the default limit: the walk raises it while it runs
  assert cache.graph_key([x.uop]) is not None
  assert sys.getrecursionlimit() == limit
  np.testing.assert_allclose(x.numpy(), [3001, 3002])

def test_disk_buffers_are_never_cached(tmp_path):
  path = tmp_path / "x.bin"
  path.write_bytes(np.float32([1, 2, 3, 4]).tobytes())
  disk = Tensor(path)
  for _ in range(2): assert cache.graph_key([disk.uop]) is None   # the second walk takes the shortcut's branch
  plain = Tensor(np.float32([1, 2])).realize()
  assert cache.graph_key([plain.uop]) is not None
  np.testing.assert_array_equal(Tensor(path).numpy().view(np.float32), [1, 2, 3, 4])

def test_results_are_forgotten_when_their_input_is_overwritten():
  a = Tensor(np.float32([1, 2])).realize()
  for _ in range(3):   # hits of the schedule cache register their results under `a` too
    b = a + 1
    node = b.uop   # the graph's node, kept: it now reads the result
    b.realize()
    assert node.forward is not None
  a.assign(Tensor(np.float32([10, 20]))).realize()
  assert node.forward is None and a.uop.base.buffer._computed is None
  np.testing.assert_allclose((a + 1).numpy(), [11, 21])
  np.testing.assert_allclose(b.numpy(), [2, 3])

def _walked_key(roots):
  """graph_key's result by a walk of its own (no memo)."""
  walk = cache._KeyWalk(roots)
  ids = tuple([walk.visit_iterative(r) for r in roots])
  return (tuple(walk.entries), ids), walk.buffers

def test_a_memoized_key_is_the_walked_one():
  a, b = Tensor(np.float32([1, 2])).realize(), Tensor(np.float32([3, 4])).realize()
  for make in (lambda: a + 1, lambda: a * b, lambda: a.reshape(2, 1).expand(2, 3) * 2, lambda: a + a):
    for _ in range(3):   # the first call walks and memoizes, the next ones find the memo
      root = make().uop
      assert cache.graph_key([root]) == _walked_key([root])
  assert (a * b).tolist() == [3, 8]

def test_a_constant_realized_beside_others_renews_the_memo():
  a = Tensor(np.float32([1, 2, 3, 4])).realize()
  c = Tensor((a + 1).uop.src[1])   # the scalar operand's view (EXPAND of a CONST): no buffer, never realized alone
  same = Tensor(c.uop)   # another tensor over the same node: it keeps the node once c is realized
  for _ in range(2): (a + same).realize()
  before = cache.graph_key([(a + same).uop])
  Tensor.realize_all([a * 2, c])   # beside a graph that reads a buffer, the constant's node is realized
  assert same.uop.forward is not None
  root = (a + same).uop
  after = cache.graph_key([root])
  assert after == _walked_key([root]) and after[0] != before[0] and len(after[1]) == 2
  np.testing.assert_allclose((a + same).numpy(), [2, 3, 4, 5])

def test_memoized_keys_keep_no_buffer_alive():
  import gc, weakref
  x = Tensor(np.float32([1, 2, 3])).realize()
  for _ in range(3): (x + 5).realize()
  ref = weakref.ref(x.uop.base.buffer)
  del x
  gc.collect()
  assert ref() is None
  y = Tensor(np.float32([7, 8, 9])).realize()   # a new tensor, perhaps at a dead one's address: its own key
  root = (y + 5).uop
  assert cache.graph_key([root]) == _walked_key([root])
  assert (y + 5).tolist() == [12, 13, 14]

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
@pytest.mark.parametrize("shape", [(4, 3), (5,), (), (1, 1)])
def test_tanh_builds_the_nodes_of_its_tensor_ops(dtype, shape):
  from kiln import tensor as tensor_module
  x = Tensor(np.linspace(-3, 3, int(np.prod(shape))).reshape(shape).astype(dtype))
  built = x.tanh()
  assert built.uop is x._in_float(tensor_module._tanh_odd_tensors).uop   # hash-consing: the very same graph
  want = np.tanh(np.linspace(-3, 3, int(np.prod(shape))).reshape(shape).astype(dtype).astype(np.float64))
  np.testing.assert_allclose(built.numpy(), want, rtol=1e-3 if dtype == "float16" else 1e-6, atol=1e-3 if dtype == "float16" else 1e-7)
