"""When a CPU kernel uses the thread pool (kiln/runtime/threadpool.py MIN_WORK_PER_THREAD, kiln/codegen/parallel.py
REDUCE_CHUNK_WORK): small kernels run on the calling thread, and a small reduction is not split into chunks (which
would keep its accumulators scalar), while large ones still are. Results match NumPy either way."""
from __future__ import annotations
import numpy as np
from kiln import Tensor
from kiln.helpers import Context
from kiln.schedule.kernelize import create_schedule
from kiln.engine.realize import get_runner
from kiln.codegen.parallel import REDUCE_CHUNK_WORK
from kiln.runtime.threadpool import MIN_WORK_PER_THREAD, chunks_for

def _program(t: Tensor):
  """The compiled CPU program of t's last kernel (the kernels before it are realized)."""
  items = create_schedule([t.uop]).items
  return get_runner(items[-1].bufs[0].device, items[-1].ast).program

def test_small_row_reduction_is_not_split_and_runs_on_one_thread():
  x = np.random.default_rng(0).standard_normal((4, 64, 256)).astype(np.float32)
  t = Tensor(x).mean(-1, keepdim=True)
  program = _program(t)
  assert program.chunks == 0 and program.work < 2 * MIN_WORK_PER_THREAD
  with Context(THREADS=2):
    assert program.threads() == 1
    np.testing.assert_allclose(t.numpy(), x.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_large_full_sum_is_still_split_into_chunks():
  x = np.random.default_rng(1).random(1 << 20, dtype=np.float32)
  t = Tensor(x).sum()
  program = _program(t)
  assert program.chunks >= 2 and program.work >= 2 * REDUCE_CHUNK_WORK
  with Context(THREADS=2):
    assert program.threads() == 2
    np.testing.assert_allclose(t.numpy(), x.astype(np.float64).sum(), rtol=1e-5)

def test_large_elementwise_kernel_uses_every_thread():
  x = np.random.default_rng(2).standard_normal(1 << 20).astype(np.float32)
  t = Tensor(x) * 2 + 1
  program = _program(t)
  with Context(THREADS=2):
    assert program.threads() == 2 and program.pool_chunks() == chunks_for(program.work, 2) >= 2
    np.testing.assert_array_equal(t.numpy(), x * 2 + 1)
