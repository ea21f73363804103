"""The eager dispatch path's shortcuts keep their rules: the schedule cache drops its least recently used template
(a hit counts as a use), the key walk leaves the recursion limit as it found it, DISK buffers are never cached, and
the results registered under a buffer are forgotten when it is overwritten."""
from __future__ import annotations
import sys
import numpy as np
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
