"""The scheduler materializes an elementwise value that several kernels would each recompute from many buffers (a
residual stream): every layer of a stack then runs the same kernels, and the values stay exact."""
import numpy as np
import pytest
from kiln import Tensor, Context, GlobalCounters
import kiln.schedule.kernelize as kernelize
from helpers import assert_close

RNG = np.random.default_rng(7)
DIM, ROWS, LAYERS = 64, 32, 3   # 32x64 floats: a value of 8 KiB; the residual reads up to 2*LAYERS+1 buffers

def _layers() -> list[tuple[np.ndarray, np.ndarray]]:
  def weight() -> np.ndarray: return RNG.standard_normal((DIM, DIM)).astype(np.float32) * 0.1
  return [(weight(), weight()) for _ in range(LAYERS)]

def _stack(x, layers, norm):
  """Pre-norm residual blocks: x = x + norm(x) @ w1, then x = x + norm(x) @ w2 (the transformer's shape, small)."""
  for w1, w2 in layers:
    x = x + norm(x) @ w1
    x = x + norm(x) @ w2
  return x

def _norm_np(v):
  centered = v - v.mean(-1, keepdims=True)
  return centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5)

def _norm_t(v):
  centered = v - v.mean(-1, keepdim=True)
  return centered * ((centered * centered).mean(-1, keepdim=True) + 1e-5).rsqrt()

def _distinct_kernels(out: Tensor) -> tuple[int, int]:
  items = [item for item in out.schedule() if item.ast.op.name != "COPY"]
  return len(items), len({item.ast for item in items})

@pytest.fixture(autouse=True)
def fresh_schedules():
  """Every schedule is made anew: the schedule cache would serve a graph of the same structure scheduled under
  other settings."""
  with Context(SCHEDULE_CACHE=0): yield

def test_residual_stream_gets_a_buffer_and_layers_share_kernels(monkeypatch):
  monkeypatch.setattr(kernelize, "MATERIALIZE_MIN_SAVED_BYTES", 0)   # the test's values are small
  xn, layers = RNG.standard_normal((ROWS, DIM)).astype(np.float32), _layers()
  x, tl = Tensor(xn).realize(), [(Tensor(a).realize(), Tensor(b).realize()) for a, b in layers]
  launches, distinct = _distinct_kernels(_stack(x, tl, _norm_t))
  with Context(SHARED_MATERIALIZE=0): launches_off, distinct_off = _distinct_kernels(_stack(x, tl, _norm_t))
  # recomputed, each layer's kernels load every earlier layer's outputs: no two layers share a kernel
  assert 2 * distinct < distinct_off, f"the layers should share their kernels: {distinct} vs {distinct_off} distinct"
  assert launches <= launches_off, f"a matmul and the residual add after it stay one kernel: {launches} launches"
  want = _stack(xn.astype(np.float64), layers, _norm_np)
  assert_close(_stack(x, tl, _norm_t).numpy(), want, "residual stack", 1e-4, 1e-4)
  with Context(SHARED_MATERIALIZE=0): assert_close(_stack(x, tl, _norm_t).numpy(), want, "recomputed", 1e-4, 1e-4)

def test_small_shared_values_are_recomputed():
  """Below MATERIALIZE_MIN_SAVED_BYTES a buffer costs more (a launch) than the loads it saves."""
  a, b, c = (Tensor(RNG.standard_normal(16).astype(np.float32)).realize() for _ in range(3))
  shared = a + b + c
  outs = [(shared * 2).sum(), (shared * 3).max()]
  GlobalCounters.reset()
  Tensor.realize_all(outs)
  assert GlobalCounters.kernel_count == 2
  want = a.numpy() + b.numpy() + c.numpy()
  assert_close(outs[0].numpy(), np.float32((want * 2).sum()), "sum", 1e-5, 1e-5)

def test_shared_value_inside_a_row_chain_stays_fused(monkeypatch):
  """A value computed from a reduction inside its kernel (softmax's exp) is never split out: it would recompute the
  reduction in a kernel of its own."""
  monkeypatch.setattr(kernelize, "MATERIALIZE_MIN_SAVED_BYTES", 0)
  xn = RNG.standard_normal((8, 64)).astype(np.float32)
  x = Tensor(xn).realize()
  out = x.softmax(-1)
  assert len(out.schedule()) == 1
  e = np.exp(xn - xn.max(-1, keepdims=True))
  assert_close(out.numpy(), e / e.sum(-1, keepdims=True), "softmax", 1e-5, 1e-5)

def test_shared_value_read_by_a_matmul_and_an_elementwise_kernel(monkeypatch):
  """The shared value's consumers read it through a broadcast (a matmul) and directly: both see the same values."""
  monkeypatch.setattr(kernelize, "MATERIALIZE_MIN_SAVED_BYTES", 0)
  an, bn, cn, wn = (RNG.standard_normal((16, 16)).astype(np.float32) for _ in range(4))
  a, b, c, w = (Tensor(v).realize() for v in (an, bn, cn, wn))
  shared = a + b * c
  outs = [shared @ w, shared.exp() + 1, (shared * shared).sum(1)]
  Tensor.realize_all(outs)
  s = an + bn * cn
  assert_close(outs[0].numpy(), s @ wn, "matmul", 1e-4, 1e-4)
  assert_close(outs[1].numpy(), np.exp(s) + 1, "exp", 1e-5, 1e-5)
  assert_close(outs[2].numpy(), (s * s).sum(1), "sum", 1e-4, 1e-4)
