"""NVRTC compiles from several threads at once (kiln/runtime/cuda_driver.py NVRTCCompiler.runs_in_subprocess, so
that precompile and BEAM's candidates compile on every host core): the CUBINs are the same bytes as one thread's,
and a schedule's kernels compiled together through compile_many give the same results. Skipped without NVRTC."""
from __future__ import annotations
from concurrent.futures import ThreadPoolExecutor
import pytest
from kiln.runtime import cuda_driver as cuda

def _nvrtc_compiler() -> cuda.NVRTCCompiler:
  try: cuda.nvrtc()
  except cuda.CudaUnavailableError as e: pytest.skip(str(e))
  return cuda.NVRTCCompiler("sm_90a")

def _sources(count: int) -> list[str]:
  return [f'extern "C" __global__ void k{i}(float* a) {{ a[threadIdx.x] = a[threadIdx.x] * {i}.5f + {i}.0f; }}'
          for i in range(count)]

def test_nvrtc_compiles_the_same_bytes_from_many_threads():
  compiler = _nvrtc_compiler()
  assert compiler.runs_in_subprocess   # CompilePipeline and BEAM then compile in the background
  sources = _sources(32)
  serial = [compiler.compile(src) for src in sources]
  with ThreadPoolExecutor(8) as pool: parallel = list(pool.map(compiler.compile, sources))
  assert parallel == serial

def test_a_schedules_kernels_compile_together_on_cuda():
  _nvrtc_compiler()
  import numpy as np
  from kiln import Tensor, Device
  try: Device["CUDA"]
  except RuntimeError as e: pytest.skip(str(e))
  x = (np.arange(4096, dtype=np.float32) / 4096).reshape(64, 64)
  t = Tensor(x, device="CUDA")
  out = ((t * 3 + 1).exp2().sum(1) + (t.max(0) - 2).sum()).numpy()   # several new kernels in one schedule
  want = (np.exp2(x * 3 + 1).sum(1) + (x.max(0) - 2).sum()).astype(np.float32)
  np.testing.assert_allclose(out, want, rtol=1e-5)
