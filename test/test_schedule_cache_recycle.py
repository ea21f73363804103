"""The schedule cache hands a hit the buffers of the template's last hit when nothing holds them any more
(kiln/schedule/cache.py `spare`): results stay right against numpy, held results are never overwritten, a TinyJit
capture never gets a reused buffer (it tells fresh outputs from state by allocation), large schedules keep none."""
import numpy as np
from kiln import Tensor, TinyJit
from kiln.schedule import cache

def test_dropped_results_are_reused_and_right():
  rng, ids = np.random.default_rng(0), []
  for _ in range(6):
    x = rng.standard_normal(16).astype(np.float32)
    out = (Tensor(x).realize() * 3 + 1).realize()
    np.testing.assert_allclose(out.numpy(), x * 3 + 1, rtol=1e-6)
    ids.append(id(out.uop.base.buffer))
    del out
  assert len(set(ids[2:])) == 1

def test_held_results_are_never_overwritten():
  rng = np.random.default_rng(1)
  xs = [rng.standard_normal(16).astype(np.float32) for _ in range(9)]
  held = []
  for k, x in enumerate(xs):
    out = (Tensor(x).realize() * 5 - 2).realize()
    if k % 3 == 0: held.append((out, lambda x: x * 5 - 2))
    elif k % 3 == 1: held.append((out[3:11].reshape(2, 4), lambda x: (x * 5 - 2)[3:11].reshape(2, 4)))
    else: held.append(((out + 1).realize(), lambda x: x * 5 - 1))
    del out
  for (t, want), x in zip(held, xs): np.testing.assert_allclose(t.numpy(), want(x), rtol=1e-6)

def test_a_capture_after_eager_calls_of_the_same_graph_gets_fresh_outputs():
  def step(x): return (x * 2 + 1).sum()
  rng = np.random.default_rng(2)
  xs = [rng.standard_normal(8).astype(np.float32) for _ in range(5)]
  for x in xs: step(Tensor(x).realize()).realize()   # results dropped: the template keeps unheld spare buffers
  jitted = TinyJit(step)
  jitted(Tensor(xs[0]).realize())                     # the eager first call, its result dropped too
  outs = [jitted(Tensor(x).realize()) for x in xs]   # the capture, then replays, results kept
  np.testing.assert_allclose([o.item() for o in outs], [float((x * 2 + 1).sum()) for x in xs], rtol=1e-5)
  assert len({id(o.uop.base.buffer) for o in outs}) == len(outs)

def test_large_schedules_keep_no_buffers():
  n = cache.RECYCLE_MAX_BYTES // 4 + 1
  x = Tensor.ones(n).realize()
  for _ in range(3): (x + 7).realize()
  (x + 7).realize()
  template = next(reversed(cache._templates.values()))
  assert not template.recycles and template.spare is None
