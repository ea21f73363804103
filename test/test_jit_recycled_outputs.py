"""TinyJit replays reuse the last replay's fresh output buffer when nothing outside the capture holds it any more
(kiln/engine/jit.py CapturedJit.replay), and allocate a new one whenever a tensor, a node or a view still reads it:
results stay right against numpy either way."""
import numpy as np
from kiln import Tensor, TinyJit

def _step():
  return TinyJit(lambda x: ((x + 1).contiguous() * 2).contiguous())

def test_a_dropped_output_is_reused_and_every_result_is_right():
  step, rng, buffers = _step(), np.random.default_rng(0), []
  for _ in range(8):
    x = rng.standard_normal(16).astype(np.float32)
    out = step(Tensor(x).realize())
    np.testing.assert_allclose(out.numpy(), (x + 1) * 2, rtol=1e-6)
    buffers.append(id(out.uop.base.buffer))
    del out
  assert len(set(buffers[3:])) == 1   # replays (calls 3+) after the first reuse one buffer

def test_outputs_still_read_are_never_overwritten():
  step, rng = _step(), np.random.default_rng(1)
  xs = [rng.standard_normal(16).astype(np.float32) for _ in range(8)]
  kept, views, derived = [], [], []
  for k, x in enumerate(xs):
    out = step(Tensor(x).realize())
    if k % 3 == 0: kept.append((out, x))                          # the tensor itself
    elif k % 3 == 1: views.append((out[2:10].reshape(2, 4), x))   # a lazy view of it
    else: derived.append(((out * 3).realize(), x))               # a result computed from it, realized
    del out
  for out, x in kept: np.testing.assert_allclose(out.numpy(), (x + 1) * 2, rtol=1e-6)
  for view, x in views: np.testing.assert_allclose(view.numpy(), ((x + 1) * 2)[2:10].reshape(2, 4), rtol=1e-6)
  for result, x in derived: np.testing.assert_allclose(result.numpy(), (x + 1) * 6, rtol=1e-6)
  ids = [id(t.uop.base.buffer) for t, _ in kept]
  assert len(set(ids)) == len(ids)
