"""The GPU axis-mapping stage (kiln/codegen/gpudims.py), run by the PYTHON emulator: a renderer that says it has
blocks and threads gets SPECIAL thread indices for its output axes, the emulator runs every thread, and the results
match NumPy. Needs no GPU."""
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.codegen import gpudims
from helpers import DropLaunch as _DropLaunch, use_gpu_style_python
from kiln.uop.ops import UOp, Ops

@pytest.fixture
def gpu_python(monkeypatch):
  """Device PYTHON with a GPU-style renderer, fresh runner caches and no codegen cache."""
  return use_gpu_style_python(monkeypatch)

def _numpy(rng, *shape): return rng.uniform(-2, 2, shape).astype(np.float32)

def test_elementwise_broadcast_reduce_matmul_match_numpy(gpu_python):
  rng = np.random.default_rng(0)
  a, b, c = _numpy(rng, 33, 17), _numpy(rng, 17), _numpy(rng, 17, 5)
  ta, tb, tc = (Tensor(x, device=gpu_python) for x in (a, b, c))
  np.testing.assert_allclose(((ta * tb + 1).relu()).numpy(), np.maximum(a * b + 1, 0), rtol=1e-6)
  np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ta.max(axis=0).numpy(), a.max(axis=0))
  np.testing.assert_allclose((ta @ tc).numpy(), a @ c, rtol=1e-5, atol=1e-5)
  assert _DropLaunch.launches, "no kernel was launched with grid/block sizes"

def test_guarded_last_block_and_in_place_update(gpu_python):
  rng = np.random.default_rng(1)
  n = 1031   # prime, above one block: 256-thread blocks with a guarded last block
  a = _numpy(rng, n)
  t = Tensor(a, device=gpu_python).realize()
  t.assign(t * 2 + 1).realize()   # in place: a clamped thread must not store twice
  np.testing.assert_array_equal(t.numpy(), a * 2 + 1)
  assert ((5, 1, 1), (256, 1, 1)) in _DropLaunch.launches

def test_full_reduction_runs_as_one_thread(gpu_python):
  a = np.arange(100, dtype=np.float32)
  assert Tensor(a, device=gpu_python).sum().item() == a.sum()
  assert not _DropLaunch.launches   # no output axis: no launch sizes, the program's default of one thread

def _range(n, i): return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), i)

def test_ranges_that_write_one_address_stay_loops():
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  r0, r1 = _range(64, 0), _range(8, 1)
  # every iteration of r1 writes the same element (a KBLOCK-style block loop): only r0 becomes thread indices
  old = UOp(Ops.LOAD, dtypes.float32, (out, r0))
  store = UOp(Ops.STORE, dtypes.void, (out, r0, old + r1.cast(dtypes.float32)))
  sink = UOp(Ops.SINK, dtypes.void, (store,))
  assert gpudims.mappable_ranges(sink) == [r0]
  mapped = gpudims.map_axes_to_gpu(sink)
  nodes = mapped.toposort()
  assert r1 in nodes and r0 not in nodes
  assert {u.arg for u in nodes if u.op is Ops.SPECIAL} == {("lidx0", 64)}

def test_block_sizes():
  assert [gpudims.block_size(n) for n in (1 << 20, 96, 100, 1031, 4099)] == [256, 32, 100, 256, 256]

def test_coarsened_elementwise_threads_cover_every_element_once(gpu_python, monkeypatch):
  monkeypatch.setattr(gpudims, "MIN_COARSE_BLOCKS", 2)
  rng = np.random.default_rng(2)
  a, b = _numpy(rng, 3, 1024), _numpy(rng, 1024)   # 3072 = 3 blocks x 4 elements x 256 threads
  t = Tensor(a, device=gpu_python).realize()
  t.assign(t * Tensor(b, device=gpu_python) + 1).realize()   # in place: each element exactly once
  np.testing.assert_array_equal(t.numpy(), a * b + 1)
  assert ((3, 1, 1), (256, 1, 1)) in _DropLaunch.launches
