"""The GPU render sweep's own parts (test/gpu_render_sweep.py): renaming kernels into one nvcc batch, reading
`ptxas -v`, and a small sweep end to end where the CUDA toolkit is installed."""
from __future__ import annotations
import tempfile
import pytest
import gpu_render_sweep as sweep
from kiln import Tensor

REPORT = """ptxas info    : Compiling entry function 'E_4_k0' for 'sm_90a'
ptxas info    : Function properties for E_4_k0
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Function properties for r_8_k1
    8 bytes stack frame, 8 bytes spill stores, 24 bytes spill loads
"""

def test_ptxas_report_gives_each_entry_its_verdict():
  verdicts = sweep.ptxas_verdicts(REPORT, ["E_4_k0", "r_8_k1", "missing"])
  assert verdicts["E_4_k0"] == sweep.FINE
  assert verdicts["r_8_k1"] == ("spill", "8 bytes stack frame, 8/24 bytes spill stores/loads", 8)
  assert verdicts["missing"][0] == "error"

@pytest.mark.parametrize("bounds", ["", "__launch_bounds__(256) ", "__launch_bounds__(75, 1) "])
def test_a_kernel_is_renamed_into_its_own_namespace(bounds):
  source = f'#define X 1\nextern "C" __global__ void {bounds}E_4(float* data0) {{ data0[0] = X; }}\n'
  wrapped, name = sweep._unique_entry(source, 7)
  assert name == "E_4_k7" and f"void {bounds}E_4_k7(float* data0)" in wrapped
  assert wrapped.startswith("namespace kiln_kernel7 {\n") and wrapped.rstrip().endswith("}")

def _asts(*tensors: Tensor) -> dict:
  return {item.ast: f"case{i}" for i, t in enumerate(tensors) for item in t.schedule() if item.ast.op.name != "COPY"}

@pytest.mark.skipif(sweep.NVCC is None and sweep.PTXAS is None, reason="no CUDA toolkit (nvcc/ptxas)")
def test_a_small_sweep_builds_without_spills():
  a = Tensor.empty(64, 96)
  count, failures = sweep.sweep(_asts((a * 2 + 1).exp(), a.sum(axis=1), a.softmax(axis=1), a @ Tensor.empty(96, 32),
                                      Tensor.empty(3, 5, 7, 7).avg_pool2d()))
  assert count >= 5 and failures == [], "\n".join(failures)

@pytest.mark.skipif(sweep.NVCC is None, reason="nvcc not installed")
def test_a_batch_that_does_not_build_names_the_broken_kernel():
  good = 'extern "C" __global__ void __launch_bounds__(32, 1) ok(float* d) { d[threadIdx.x] = 1.0f; }\n'
  bad = 'extern "C" __global__ void __launch_bounds__(32, 1) broken(float* d) { d[threadIdx.x] = undefined; }\n'
  with tempfile.TemporaryDirectory() as folder: verdicts = sweep.compile_cuda([good, bad, good], folder)
  assert verdicts[0] == verdicts[2] == sweep.FINE and verdicts[1][0] == "error" and "undefined" in verdicts[1][1]
