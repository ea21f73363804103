"""DEBUG output, GlobalCounters and Context: what a user sees about the kernels that run."""
import re
from kiln import Tensor, GlobalCounters, Context
from kiln.helpers import DEBUG

def test_debug2_prints_one_line_per_kernel_with_time_and_throughput(capsys):
  a = Tensor.rand(64, 64).realize()
  with Context(DEBUG=2):
    ((a @ a).relu() + 1).sum(1).realize()    # matmul+relu+add fuse; the row sum is a second kernel
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("***")]
  assert len(lines) == 2, lines
  for line in lines:
    assert re.search(r"\b[Er]_\w+", line) and "GFLOP/s" in line and "GB/s" in line and re.search(r"\d+\.\d+ (us|ms)", line)
    assert "test_observability.py" in line   # the user's line that built the kernel
  assert "relu" in lines[0] or "matmul" in lines[0] or "dot" in lines[0]

def test_debug4_prints_kernel_source(capsys):
  with Context(DEBUG=4): (Tensor([1.0, 2.0, 3.0]) * 7).realize()
  out = capsys.readouterr().out
  assert "void E_3(" in out and "data0[" in out

def test_global_counters_count_kernels_ops_and_memory():
  a, b = Tensor.rand(32, 32).realize(), Tensor.rand(32, 32).realize()
  GlobalCounters.reset()
  (a @ b).realize()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_ops >= 2 * 32 ** 3             # one multiply and one add per inner step
  assert GlobalCounters.global_mem >= 3 * 32 * 32 * 4          # two inputs read, one output written
  assert GlobalCounters.mem_used > 0

def test_context_as_decorator_restores_the_setting():
  before = DEBUG.value
  @Context(DEBUG=3)
  def inside(): return DEBUG.value
  assert inside() == 3 and DEBUG.value == before
