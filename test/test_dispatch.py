"""Eager dispatch: the schedule cache (kiln/schedule/cache.py) gives exactly what scheduling anew gives, and graphs
whose schedule depends on more than their structure are never served from it. Also: assigning a Python scalar to a
realized tensor compiles no kernel per value."""
import numpy as np
import pytest
import kiln.engine.realize as realize
from kiln import Tensor, Context, Variable
from kiln.schedule import cache

def _stats_delta(fn):
  before = dict(cache.stats)
  out = fn()
  return out, {k: cache.stats[k] - before[k] for k in before}

# ---------------- random graphs: cached == uncached ----------------

UNARY = [lambda x: x.relu(), lambda x: x.exp2() * 0.1, lambda x: -x, lambda x: x.permute(1, 0).contiguous().permute(1, 0),
         lambda x: x.sum(1, keepdim=True).expand(3, 4), lambda x: x.max(0, keepdim=True) + x, lambda x: x.flip(1),
         lambda x: x.pad(((0, 0), (1, 0)))[:, :4], lambda x: x.reshape(4, 3).reshape(3, 4).contiguous(),
         lambda x: (x > 0).where(x, x * 0.5), lambda x: x.cast("float16").cast("float32")]
BINARY = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y.sum(), lambda x, y: x.maximum(y),
          lambda x, y: (x @ y.T)[:, :1].expand(3, 4) * y]

def _random_program(rng: np.random.Generator, n_inputs: int, n_ops: int) -> list[tuple]:
  return [(int(rng.integers(2)), int(rng.integers(len(UNARY))), int(rng.integers(len(BINARY))),
           int(rng.integers(n_inputs + k)), int(rng.integers(n_inputs + k))) for k in range(n_ops)]

def _run_program(program: list[tuple], inputs: list[Tensor]) -> list[Tensor]:
  values = list(inputs)
  for binary, u, b, i, j in program:
    values.append(BINARY[b](values[i], values[j]) if binary else UNARY[u](values[i]))
  return values[len(inputs):][-2:]   # two outputs: multi-output realizes

@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_realized_with_new_inputs_match_the_uncached_schedule(seed):
  rng = np.random.default_rng(seed)
  program = _random_program(rng, 3, int(rng.integers(2, 7)))
  def realized(arrays, cached: bool) -> list[np.ndarray]:
    with Context(SCHEDULE_CACHE=int(cached)):
      inputs = [Tensor(a).realize() for a in arrays]
      if seed % 3 == 0: inputs[1] = inputs[0]   # the same buffer twice: aliasing is part of the key
      outs = _run_program(program, inputs)
      Tensor.realize(*outs)
      return [o.numpy() for o in outs]
  hits = 0
  for _ in range(3):
    arrays = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
    got, delta = _stats_delta(lambda: realized(arrays, True))
    hits += delta["hits"]
    want = realized(arrays, False)
    for g, w in zip(got, want): np.testing.assert_array_equal(g, w)
  assert hits >= 2, "the second and third runs of the same program must be served from the cache"

def test_aliasing_is_part_of_the_key():
  a, b = Tensor(np.float32([1, 2])).realize(), Tensor(np.float32([10, 20])).realize()
  np.testing.assert_array_equal((a + b).numpy(), [11, 22])
  np.testing.assert_array_equal((a + a).numpy(), [2, 4])      # same structure over one buffer: another entry
  c = Tensor(np.float32([3, 4])).realize()
  np.testing.assert_array_equal((c + b).numpy(), [13, 24])
  np.testing.assert_array_equal((c + c).numpy(), [6, 8])

def test_constants_are_part_of_the_key():
  a = Tensor(np.float32([1, 2])).realize()
  for k in (1.0, 2.0, -0.0, 0.0):
    np.testing.assert_array_equal((a * k).numpy(), np.float32([1, 2]) * np.float32(k))
  assert np.signbit((a * -0.0).numpy()).all() and not np.signbit((a * 0.0).numpy()).any()

def test_intermediates_and_outputs_are_fresh_buffers_each_time():
  def build(x): return ((x + 1).contiguous() * 2).sum(0)
  x1, x2 = Tensor(np.ones((3, 4), np.float32)).realize(), Tensor(np.full((3, 4), 2, np.float32)).realize()
  y1 = build(x1).realize()
  y2, delta = _stats_delta(lambda: build(x2).realize())
  assert delta["hits"] == 1
  assert y1.uop.base.buffer is not y2.uop.base.buffer
  np.testing.assert_array_equal(y1.numpy(), [12] * 4)
  np.testing.assert_array_equal(y2.numpy(), [18] * 4)

def test_assign_is_cached_and_readers_of_old_values_still_see_them():
  w = Tensor(np.float32([1, 2])).realize()
  for step in range(3):
    old = w * 1
    _, delta = _stats_delta(lambda: w.assign(w + 1).realize())
    assert delta["uncached"] == 0 and (step == 0 or delta["hits"] >= 1), delta
    np.testing.assert_array_equal(old.numpy(), np.float32([1, 2]) + step)
  np.testing.assert_array_equal(w.numpy(), [4, 5])

def test_symbolic_shapes_are_not_cached():
  cache_t = Tensor.arange(8).float().contiguous().realize()
  for n in (2, 5):
    v = Variable("n", 1, 8).bind(n)
    out, delta = _stats_delta(lambda: (cache_t[0:v] + 1).sum().realize())
    assert delta["hits"] == 0
    assert out.item() == sum(range(n)) + n

def test_disk_graphs_are_not_cached(tmp_path):
  path = tmp_path / "four.bin"
  for k in range(2):
    path.write_bytes(np.float32([k, 1, 2, 3]).tobytes())
    t = Tensor(path).bitcast("float32")
    out, delta = _stats_delta(lambda: t.to("CPU").realize())
    assert delta["hits"] == 0
    np.testing.assert_array_equal(out.numpy(), [k, 1, 2, 3])

def test_schedule_cache_off_schedules_every_graph():
  a = Tensor(np.float32([1, 2])).realize()
  with Context(SCHEDULE_CACHE=0):
    for _ in range(2):
      _, delta = _stats_delta(lambda: (a + 7).realize())
      assert delta == {"hits": 0, "misses": 0, "uncached": 0}

# ---------------- a Python scalar assigned to a realized tensor ----------------

@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_assigning_python_scalars_compiles_at_most_one_kernel(dtype):
  lr = Tensor([1], dtype=dtype).realize()
  buf = lr.uop.base.buffer
  reader = lr * 2   # built before the assigns: holds the old value (PyTorch order)
  compiled = len(realize._runner_cache)
  for k in range(20):
    value = k + 1 if dtype == "int32" else 0.001 * (k + 1)
    lr.assign(value)
    assert lr.uop.base.buffer is buf, "the assign must write the tensor's own buffer"
    np.testing.assert_allclose(lr.numpy(), [value], rtol=1e-3)
  assert len(realize._runner_cache) - compiled <= 1, "a kernel was compiled per assigned value"
  np.testing.assert_allclose(reader.numpy(), [2], rtol=1e-3)

def test_scalar_assign_inside_tinyjit_is_replayed():
  from kiln import TinyJit
  w = Tensor([1.0]).realize()
  @TinyJit
  def f(x):
    w.assign(3.0)   # captured as a kernel: every replay writes it again
    return (x * w).realize()
  for _ in range(5):
    w.assign(1.0)   # outside the function: a host copy
    np.testing.assert_array_equal(f(Tensor([2.0])).numpy(), [6.0])
    np.testing.assert_array_equal(w.numpy(), [3.0])

def test_scalar_assign_after_a_pending_assign_keeps_program_order():
  w = Tensor([1.0, 2.0]).realize()
  w.assign(w + 10)    # pending kernel assign
  before = w * 1
  w.assign(5.0)
  np.testing.assert_array_equal(w.numpy(), [5, 5])
  np.testing.assert_array_equal(before.numpy(), [11, 12])
  h = Tensor([0.5, 0.5], dtype="float16").realize()
  h.assign(0.1)       # float16 takes the kernel path
  np.testing.assert_array_equal(h.numpy(), np.float16([0.1, 0.1]))

def test_the_cache_keeps_no_graph_alive():
  # a node kept alive keeps its `forward` to the realized result: an equal graph built later would share that buffer
  import weakref
  a = Tensor(np.float32([1, 2])).realize()
  for _ in range(2):
    t = (a * 3).contiguous()
    node = weakref.ref(t.uop)
    t.realize()
    del t
    assert node() is None, "a realized graph's root node is still referenced"

# ---------------- the graph key ----------------

@pytest.mark.parametrize("seed", range(6))
def test_recursive_and_iterative_key_walks_give_the_same_key(seed):
  rng = np.random.default_rng(seed)
  inputs = [Tensor(rng.standard_normal((3, 4)).astype(np.float32)).realize() for _ in range(3)]
  roots = [t.uop for t in _run_program(_random_program(rng, 3, int(rng.integers(2, 9))), inputs)]
  structure, buffers = cache.graph_key(roots)
  walk = cache._KeyWalk(roots)
  root_ids = tuple([walk.visit_iterative(r) for r in roots])
  assert structure == (tuple(walk.entries), root_ids) and buffers == walk.buffers

def test_the_key_changes_with_the_graph_and_not_with_the_buffers():
  a, b = Tensor(np.float32([1, 2])).realize(), Tensor(np.float32([3, 4])).realize()
  def key(t: Tensor): return cache.graph_key([t.uop])
  (k1, bufs1), (k2, bufs2) = key(a + 1), key(b + 1)
  assert k1 == k2 and hash(k1) == hash(k2) and bufs1 != bufs2
  assert {k1: "template"}.get(k2) == "template"   # a new key finds the stored one (its hash is remembered)
  others = [key(a + 2)[0], key(a * 1)[0], key(a - 1)[0], key((a + 1).sum())[0], key(a + a)[0], key(a.cast("half") + 1)[0]]
  for other in others: assert other != k1 and hash(other) != hash(k1)
