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
