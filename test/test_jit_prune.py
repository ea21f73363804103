"""TinyJit(prune=True) drops the captured launches that depend on no input (they ran once, at capture): weight-only
kernels such as a copy of a weight into another layout. Each test replays several calls and checks every result
against numpy."""
import numpy as np
from kiln import Tensor, TinyJit, Variable

def test_a_pruned_output_whose_memory_is_shared_stays_right():
  # the weight-only copy `wc` dies after its matmul, and `b` (same size and dtype) takes its memory: dropped
  # there, every replay would read b's values from the last call as the weight (jit.py `_prune`)
  rng = np.random.default_rng(0)
  w_np = rng.standard_normal((16, 16)).astype(np.float32)
  w = Tensor(w_np).realize()
  def step(x):
    wc = (w * 2).contiguous()
    a = (x @ wc).contiguous()
    b = (a * 3 + 1).contiguous()
    return (b @ b.T).realize()
  jit = TinyJit(step, prune=True)
  for _ in range(5):
    x_np = rng.standard_normal((16, 16)).astype(np.float32)
    b = x_np @ (w_np * 2) * 3 + 1
    np.testing.assert_allclose(jit(Tensor(x_np)).numpy(), b @ b.T, rtol=1e-4, atol=1e-3)
  assert len(jit.jit_cache) == 3   # the copy ran once, into a buffer of its own

def test_a_weight_only_kernel_is_dropped():
  rng = np.random.default_rng(1)
  w_np = rng.standard_normal((8, 8)).astype(np.float32)
  w = Tensor(w_np).realize()
  jit = TinyJit(lambda x: (x @ (w.T * 2).contiguous()).realize(), prune=True)
  for _ in range(4):
    x_np = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(jit(Tensor(x_np)).numpy(), x_np @ (w_np.T * 2), rtol=1e-5, atol=1e-5)
  assert len(jit.jit_cache) == 1   # the matmul; the weight's copy ran at capture

def test_a_kernel_over_a_symbolic_size_is_kept():
  # reads no input but loops over a Variable: a replay with another size must run it again
  def step(x, n):
    ramp = (Tensor.arange(16)[0:n].float() * 2).contiguous()   # a kernel of its own, reading no buffer
    return (x[0:n] + ramp).contiguous().realize()
  jit = TinyJit(step, prune=True)
  x_np = np.arange(16, dtype=np.float32)
  for size in (3, 5, 7, 9):
    got = jit(Tensor(x_np), Variable("n", 1, 16).bind(size)).numpy()
    np.testing.assert_allclose(got, x_np[:size] + 2 * np.arange(size))
  assert len(jit.jit_cache) == 2
