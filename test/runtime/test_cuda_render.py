"""The CUDA C renderer (kiln/renderer/cuda.py) without a GPU: kernels of every kind are rendered for CUDA and, where
nvcc is installed, compiled for sm_90a to a CUBIN, with `ptxas -v` showing no register spills."""
from __future__ import annotations
import concurrent.futures, functools, os, re, shutil, subprocess, tempfile
import pytest
from kiln import Tensor, dtypes
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.renderer.cuda import CUDARenderer
from kiln.uop.ops import Ops

def _kernels(t: Tensor) -> list[tuple[str, str]]:
  """(name, CUDA source) of every kernel that realizing `t` runs, optimized as on the CUDA device."""
  out, renderer = [], CUDARenderer()
  for item in t.schedule():
    if item.ast.op is Ops.COPY: continue
    name = kernel_name(item.ast)
    out.append((name, render_with(renderer, name, optimize_for(renderer, lower_for_codegen(item.ast)))[0]))
  return out

def _cases() -> dict[str, Tensor]:
  a, b, c = Tensor.empty(64, 128), Tensor.empty(128), Tensor.empty(128, 96)
  h, i = Tensor.empty(1000, dtype=dtypes.half), Tensor.empty(1000, dtype=dtypes.int32)
  return {
    "elementwise": ((a * a + 1).relu() * 0.5).exp(),
    "broadcast": a * b - b.reshape(1, 128),
    "sum_rows": a.sum(axis=1),
    "sum_columns": a.max(axis=0),
    "full_sum": a.sum(),
    "softmax": a.softmax(axis=1),
    "matmul": a @ c,
    "matmul_tiles_128": Tensor.empty(128, 256) @ Tensor.empty(256, 128),
    "conv_tiles": Tensor.empty(2, 8, 8, 8).conv2d(Tensor.empty(32, 8, 3, 3), padding=1),
    "half": (h * h + 1).sqrt(),
    "bfloat16": (h.cast(dtypes.bfloat16) * 3).cast(dtypes.float32),
    "casts": (a.cast(dtypes.int32) + i[:128].reshape(1, 128)).cast(dtypes.half).cast(dtypes.float32),
    "int_math": (i // 7) % 5 - (i << 2),
    "transcendental": a.sin() + a.log2() + a.sigmoid(),
    "pad_gather": a.pad(((1, 1), (2, 0))) * 2,
    "odd_size": Tensor.empty(1031) + 1,
    "coarsened": Tensor.empty(1 << 21) * 2 + 1,
    "grouped_rows": Tensor.empty(64, 2048).sum(axis=1) * 2,
    "grouped_half_max": Tensor.empty(3000, dtype=dtypes.half).max(),
    "grouped_mean_of_product": (Tensor.empty(16, 1500) * Tensor.empty(1500)).mean(axis=1),
    "grouped_softmax": Tensor.empty(8, 3000).softmax(axis=1),
    "grid_sum": Tensor.empty(1 << 21).sum(),
    "grid_mean_odd": Tensor.empty(3, 1000003).mean(),
    "grouped_layernorm": Tensor.empty(8, 2048).layernorm(),
    "grouped_softmax_one_warp": Tensor.empty(9, 256).softmax(axis=1),
    "grouped_int64_sum": Tensor.empty(9, 700, dtype=dtypes.int64).sum(axis=1),
    "grouped_double_max": Tensor.empty(70, 300, dtype=dtypes.float64).max(axis=1),
    "grouped_bool_any": (Tensor.empty(9, 700) > 0).any(axis=1),
    "fp8": Tensor.empty(300).cast(dtypes.fp8e4m3).cast(dtypes.float32) * 2,
    "bitcast": Tensor.empty(256).bitcast(dtypes.int32) & 0xFF,
  }

@functools.cache
def rendered() -> dict[str, list[tuple[str, str]]]:
  """Every case's kernels, rendered once per test session."""
  return {case: _kernels(t) for case, t in _cases().items()}

@pytest.mark.parametrize("case", list(_cases()))
def test_renders_a_global_kernel_without_cpu_threads(case):
  kernels = rendered()[case]
  assert kernels, f"{case}: nothing to render"
  for name, src in kernels:
    assert 'extern "C" __global__' in src and "kiln_tid" not in src and "_task" not in src, f"{case} {name}:\n{src}"
    assert "static inline float" not in src, f"{case} {name}: a helper without __device__:\n{src}"
    # NVRTC has no statement expressions and no GCC builtins: each builtin left must be one the prelude defines
    assert "({" not in src, f"{case} {name}: a statement expression:\n{src}"
    defined = set(re.findall(r"#define (__builtin_\w+)", src))
    assert set(re.findall(r"__builtin_\w+", src)) <= defined, f"{case} {name}: an undefined builtin:\n{src}"

def test_output_axes_become_thread_indices():
  name, src = rendered()["elementwise"][0]
  assert "blockIdx.x" in src and "threadIdx.x" in src and "__launch_bounds__(256, 1)" in src, src
  name, src = rendered()["odd_size"][0]
  assert re.search(r"if \(.*\) data0\[", src), f"the last block's stores are not guarded:\n{src}"
  name, src = rendered()["coarsened"][0]
  assert src.count("data0[") == 4 and "blockIdx.x" in src, f"not four elements a thread:\n{src}"
  name, src = rendered()["sum_columns"][-1]
  assert "__syncthreads" not in src and "threadIdx.x" in src, f"a short reduction stays in its thread:\n{src}"
  for case in ("grid_sum", "grid_mean_odd"):
    name, src = rendered()[case][-1]
    assert "atomicAdd(&kiln_arrivals[0]" in src and "__device__ float kiln_partials0[1024];" in src, src
    assert "gidx0 = blockIdx.x;   /* < 1024 */" in src, f"{case} is not spread over the grid:\n{src}"
  for case in ("full_sum", "grouped_rows", "grouped_half_max", "grouped_softmax", "grouped_layernorm"):
    name, src = rendered()[case][-1]
    assert "__shared__" in src and "__syncthreads();" in src, f"{case} is not grouped:\n{src}"
    if case in ("full_sum", "grouped_rows", "grouped_half_max"): assert "if (alu" in src, f"{case}: every thread stores"
  # warp shuffles for the rounds inside a warp: a row of one warp needs no shared memory and no barrier
  for case in ("grouped_rows", "grouped_softmax", "grid_sum", "grouped_softmax_one_warp", "grouped_int64_sum",
               "grouped_double_max", "grouped_bool_any"):
    name, src = rendered()[case][-1]
    assert "__shfl_xor_sync(0xffffffffu, " in src, f"{case}: no warp shuffle:\n{src}"
  name, src = rendered()["grouped_softmax_one_warp"][-1]
  assert "__launch_bounds__(32, 1)" in src and "__shared__" not in src and "__syncthreads" not in src, src

def test_register_tiles_keep_the_block_size_alone_other_kernels_ask_for_one_block_an_sm():
  name, src = _kernels(Tensor.empty(4096, 4096) @ Tensor.empty(4096, 4096))[-1]   # 64 accumulators a thread
  assert re.search(r"__launch_bounds__\(\d+\) ", src), f"a register tile asks for one block an SM:\n{src[-3000:]}"
  for case in ("elementwise", "softmax", "grouped_rows"):
    name, src = rendered()[case][-1]
    assert re.search(r"__launch_bounds__\(\d+, 1\) ", src), f"{case} {name}:\n{src[-3000:]}"

NVCC = shutil.which("nvcc")

def _compile(name: str, src: str, folder: str) -> tuple[int, str]:
  """nvcc's exit code and its ptxas -v report for one kernel."""
  path = os.path.join(folder, f"{name}.cu")
  with open(path, "w") as f: f.write(src)
  result = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v", "-o",
                           os.path.join(folder, f"{name}.cubin"), path], capture_output=True, text=True)
  return result.returncode, result.stdout + result.stderr

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_every_kernel_compiles_for_sm_90a_without_spills():
  jobs = [(f"{case}_{k}_{name}", src) for case, kernels in rendered().items() for k, (name, src) in enumerate(kernels)]
  with tempfile.TemporaryDirectory(prefix="kiln_cuda_") as folder, \
       concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda job: _compile(*job, folder), jobs))
  check_ptxas_reports(jobs, results)

def check_ptxas_reports(jobs: list[tuple[str, str]], results: list[tuple[int, str]]) -> None:
  """Each (name, source) job built (exit code 0), and `ptxas -v` reported no spills and no stack frame."""
  for (name, src), (code, report) in zip(jobs, results):
    assert code == 0, f"{name} does not build:\n{report}\n{src}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(s == ("0", "0") for s in spills), f"{name} spills registers:\n{report}"
    assert "0 bytes stack frame" in report, f"{name} uses local memory:\n{report}"
