"""The scheduler drops DETACH without computing the graph below it twice (each softmax's max is detached)."""
import numpy as np
from kiln import Tensor, GlobalCounters
from helpers import assert_close

RNG = np.random.default_rng(0)

def kernels_to_realize(t: Tensor) -> int:
  """How many kernels realizing `t` runs."""
  GlobalCounters.reset()
  t.realize()
  return GlobalCounters.kernel_count

def softmax_np(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def test_chained_softmaxes_schedule_each_stage_once():
  an, bn, cn = (RNG.standard_normal((32, 32)).astype(np.float32) for _ in range(3))
  a, b, c = (Tensor(v).realize() for v in (an, bn, cn))
  first = kernels_to_realize((a @ b).softmax(-1))
  second = kernels_to_realize((Tensor(softmax_np(an @ bn)).realize() @ c).softmax(-1))
  # the second softmax's detached max reaches the first stage through the DETACH: it must not bring back a copy of it
  chained = ((a @ b).softmax(-1) @ c).softmax(-1)
  assert len(chained.schedule()) == first + second
  three = (((a @ b).softmax(-1) @ c).softmax(-1) @ b).softmax(-1)
  assert len(three.schedule()) == first + 2 * second
  want = softmax_np(softmax_np(softmax_np(an.astype(np.float64) @ bn) @ cn) @ bn)
  assert_close(three.numpy(), want, "three chained softmaxes", 1e-5, 1e-4)
