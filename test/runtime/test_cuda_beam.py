"""BEAM search on the CUDA device (kiln/codegen/opt/search.py through kiln/engine/realize.py): candidates compiled
for the GPU, timed with CUDA events on scratch copies of the real buffers, the winner checked against the
unoptimized kernel and cached; results match numpy. Skipped without a GPU."""
import numpy as np
import pytest
from kiln import Tensor, Device
from kiln.helpers import Context
from kiln.runtime import cuda_driver as cuda
from kiln.engine import realize

needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@needs_gpu
@pytest.mark.parametrize("name", ["matmul", "rows", "softmax", "elementwise"])
def test_beam_on_cuda_matches_numpy_and_caches_its_winner(name, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # an empty BEAM database: the search runs
  rng = np.random.default_rng(0)
  a = rng.standard_normal((64, 48)).astype(np.float32)
  b = rng.standard_normal((48, 40)).astype(np.float32)
  cases = {"matmul": (lambda x, y: x @ y, lambda: (a, b)),
           "rows": (lambda x, y: (x * y[:, :1].T[:, :48]).sum(1), lambda: (a, b)),
           "softmax": (lambda x, y: x.softmax(-1), lambda: (a, b)),
           "elementwise": (lambda x, y: (x * 2 + 1).exp(), lambda: (a, b))}
  fn, data = cases[name]
  x, y = data()
  want = fn(Tensor(x, device="CPU"), Tensor(y, device="CPU")).numpy()
  realize._runner_cache.clear()
  with Context(BEAM=2, DEBUG=1):
    got = fn(Tensor(x, device="CUDA"), Tensor(y, device="CUDA")).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert "BEAM=2:" in capsys.readouterr().out   # a search ran (and its winner passed the check)
  realize._runner_cache.clear()
  with Context(BEAM=2, DEBUG=1):   # the winner again, from the database: no search
    again = fn(Tensor(x, device="CUDA"), Tensor(y, device="CUDA")).numpy()
  np.testing.assert_allclose(again, want, rtol=1e-4, atol=1e-4)
  assert "BEAM=2:" not in capsys.readouterr().out
