"""kiln/runtime/nccl.py: the library search and its errors (everywhere), and a one-rank communicator's all-reduce on
a CUDA device (skipped without a GPU and libnccl)."""
import numpy as np
import pytest
from kiln import Tensor, Device, dtypes
from kiln.uop.ops import Ops
from kiln.runtime import nccl

def test_a_missing_library_is_a_clear_error(monkeypatch):
  monkeypatch.setattr(nccl, "_library", None)
  monkeypatch.setattr(nccl, "library_candidates", lambda: ["/nonexistent/libnccl.so.2"])
  with pytest.raises(nccl.NCCLError, match="libnccl not found"): nccl.nccl()
  assert not nccl.available()

def test_candidates_start_with_the_soname():
  assert nccl.library_candidates()[0] == "libnccl.so.2"
  assert nccl.NCCL_DTYPES[dtypes.float32] == 7 and nccl.NCCL_OPS[Ops.ADD] == 0

def _cuda_or_skip() -> str:
  try: Device["CUDA"]
  except Exception as e: pytest.skip(f"no CUDA device: {e}")   # noqa: BLE001
  if not nccl.available(): pytest.skip("no libnccl")
  return "CUDA"

def test_one_rank_all_reduce_on_cuda():
  device = _cuda_or_skip()
  major, minor, _ = nccl.version()
  assert major >= 2
  comm = nccl.Communicator([0])
  try:
    x = Tensor(np.arange(1000, dtype=np.float32), device=device).contiguous().realize()
    out = Tensor.empty(1000, device=device).realize()
    src, dst = x.uop.base.buffer.allocate(), out.uop.base.buffer.allocate()
    for op in (Ops.ADD, Ops.MAX):
      comm.all_reduce([src._buf.ptr], [dst._buf.ptr], 1000, dtypes.float32, op)
      Device[device].synchronize()
      np.testing.assert_array_equal(out.numpy(), np.arange(1000, dtype=np.float32))   # one rank: its own values
    with pytest.raises(nccl.NCCLError, match="no dtypes.bool"):
      comm.all_reduce([src._buf.ptr], [dst._buf.ptr], 1, dtypes.bool, Ops.ADD)
  finally: comm.close()

def test_one_rank_all_reduce_item_on_cuda():
  """The NCCL path end to end with one rank: an ALLREDUCE node over a kernel's result scheduled as an all-reduce item,
  run by its runner (ordered after the kernel and before the next on the default stream), eagerly and under TinyJit
  (captured, then replayed)."""
  device = _cuda_or_skip()
  from kiln.engine.jit import TinyJit
  from kiln.uop.ops import UOp
  def doubled_sum(t: Tensor) -> Tensor:
    partial = UOp(Ops.CONTIGUOUS, t.dtype, ((t * 2).sum(0).uop,))
    return Tensor(UOp(Ops.ALLREDUCE, t.dtype, (partial,), (Ops.ADD, 0))) + 1
  a = np.random.default_rng(0).random((64, 300), dtype=np.float32)
  np.testing.assert_allclose(doubled_sum(Tensor(a, device=device)).numpy(), a.sum(0) * 2 + 1, rtol=1e-5)
  jitted = TinyJit(lambda t: doubled_sum(t).realize())
  for seed in range(4):
    a = np.random.default_rng(seed).random((64, 300), dtype=np.float32)
    np.testing.assert_allclose(jitted(Tensor(a, device=device)).numpy(), a.sum(0) * 2 + 1, rtol=1e-5)
  assert jitted.captured is not None and any(item.runner.name == "allreduce" for item in jitted.captured.items)
