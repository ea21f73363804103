"""Attention as one flash-style kernel on GPU targets (kiln/schedule/attention.py, kiln/codegen/gpu_attention.py)
without a GPU: scaled_dot_product_attention (no mask, causal, boolean and additive masks, grouped-query heads, half and
float32, ragged lengths) and the same graph written by hand schedule as one kernel for a GPU-style target, render for
CUDA as the flash kernel and run in the lockstep emulator (test/runtime/gpu_lockstep.py) against float64 NumPy; the
PYTHON device as a GPU target runs it end to end (and the backward, unfused, stays right); CPU schedules do not change;
a shape the builder refuses still runs right as ordinary loops; the B8 H16 S4096 D128 kernel compiles for sm_90a with
no spills. With a GPU: the same graphs on the device against PyTorch."""
from __future__ import annotations
import math, os, re, shutil, subprocess, tempfile
import numpy as np
import pytest
from kiln import Tensor, dtypes, Device
from kiln.codegen.gpudims import launch_size
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.helpers import Context
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.uop.ops import Ops
from gpu_lockstep import run_lockstep   # noqa: E402  (test/runtime is on sys.path)

def _kernels(out: Tensor) -> list:
  """The kernels of `out`'s schedule (its copies of inputs to the device run first)."""
  with Context(SCHEDULE_CACHE=0): items = out.schedule()
  for item in items:
    if item.ast.op is Ops.COPY: item.bufs[0].ensure_allocated().copy_from(item.bufs[1])
  return [i for i in items if i.ast.op is not Ops.COPY]

def _is_flash(uops) -> bool: return any(u.op is Ops.DEFINE_LOCAL and u.arg[0] == "attn_k" for u in uops)

def _is_tc(uops) -> bool: return any(u.op is Ops.WMMA for u in uops)

def _emulate(item, renderer=None) -> tuple[np.ndarray, list]:
  """One scheduled kernel rendered for CUDA, run in the lockstep emulator over a NaN-poisoned output."""
  renderer = renderer or CUDARenderer()
  _, uops = render_with(renderer, kernel_name(item.ast), optimize_for(renderer, lower_for_codegen(item.ast)))
  arrays = {k: b.ensure_allocated().numpy().copy() for k, b in enumerate(item.bufs)}
  arrays[0][:] = np.nan
  run_lockstep(uops, launch_size(uops)[:2], arrays, item.var_vals)
  return arrays[0], uops

@pytest.fixture
def gpu_python(monkeypatch):
  """Device PYTHON as a GPU target (its schedules take the attention rule); tensors are made on it."""
  from helpers import use_gpu_style_python
  return use_gpu_style_python(monkeypatch)

def _reference(q, k, v, mask=None, causal=False) -> np.ndarray:
  """softmax(q @ k^T / sqrt(D) + mask) @ v in float64 (heads of k and v repeated to q's)."""
  q, k, v = (a.astype(np.float64) for a in (q, k, v))
  rep = q.shape[-3] // k.shape[-3]
  k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
  s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if causal: mask = np.tril(np.ones(s.shape[-2:], bool))
  if mask is not None: s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
  p = np.exp(s - s.max(-1, keepdims=True))
  return (p / p.sum(-1, keepdims=True)) @ v

# name: (B, H, kv heads, L, S, D, Dv, mask: None/"causal"/"bool"/"add", dtype)
CASES = {
  "plain": (1, 2, 2, 16, 8, 16, 16, None, np.float32),
  "ragged rows and keys": (1, 2, 2, 70, 130, 32, 32, None, np.float32),
  "causal, two batches": (2, 1, 1, 130, 70, 64, 64, "causal", np.float32),
  "causal, one block": (1, 1, 1, 64, 64, 16, 16, "causal", np.float32),
  "grouped-query heads": (1, 4, 2, 33, 65, 16, 16, None, np.float32),
  "boolean mask": (1, 2, 2, 40, 100, 32, 32, "bool", np.float32),
  "additive mask, half": (2, 2, 2, 17, 90, 64, 64, "add", np.float16),
  "causal, half": (1, 1, 1, 65, 129, 64, 64, "causal", np.float16),
  "depth 24, value width 48": (1, 1, 1, 20, 70, 24, 48, None, np.float32),
  "sixteen query rows": (1, 3, 3, 16, 77, 32, 32, None, np.float32),
}

def _inputs(case, rng):
  b, h, hkv, length, keys, d, dv, mask, dtype = case
  q = rng.standard_normal((b, h, length, d)).astype(dtype)
  k = rng.standard_normal((b, hkv, keys, d)).astype(dtype)
  v = rng.standard_normal((b, hkv, keys, dv)).astype(dtype)
  m = None
  if mask == "bool": m = rng.uniform(size=(length, keys)) < 0.7
  if mask == "add": m = rng.uniform(-2, 0, size=(b, 1, length, keys)).astype(dtype)
  return q, k, v, m

def _attention(q, k, v, m, mask, gqa):
  return q.scaled_dot_product_attention(k, v, attn_mask=m, is_causal=mask == "causal", enable_gqa=gqa)

def _check(got, want, dtype, what):
  tol = 2e-3 if dtype == np.float16 else 1e-4
  worst = np.nanmax(np.abs(got.astype(np.float64) - want)) if got.size else 0.0
  assert got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol), \
    f"{what}: shapes {got.shape} vs {want.shape}, worst difference {worst}"

@pytest.mark.parametrize("name", list(CASES))
def test_attention_is_one_flash_kernel_matching_numpy(name, gpu_python):
  case = CASES[name]
  q, k, v, m = _inputs(case, np.random.default_rng(len(name)))
  mask, dtype = case[7], case[8]
  tq, tk, tv = (Tensor(a, device=gpu_python) for a in (q, k, v))
  tm = Tensor(m, device=gpu_python) if m is not None else None
  items = _kernels(_attention(tq, tk, tv, tm, mask, case[1] != case[2]))
  assert len(items) == 1, f"{name}: {len(items)} kernels"
  got, uops = _emulate(items[0])
  assert _is_flash(uops), f"{name}: not the flash kernel"
  want = _reference(q, k, v, m, mask == "causal")
  _check(got.reshape(want.shape), want, dtype, name)

@pytest.mark.parametrize("tile", [(32, 32), (32, 64), (64, 64)])
@pytest.mark.parametrize("name", ["ragged rows and keys", "causal, half"])
def test_other_block_tiles(tile, name, gpu_python, monkeypatch):
  from kiln.codegen import gpu_attention
  monkeypatch.setattr(gpu_attention, "BM", tile[0])
  monkeypatch.setattr(gpu_attention, "BN", tile[1])
  monkeypatch.setattr(gpu_attention, "TC", False)   # the SIMT kernel's tiles (half takes tensor cores)
  case = CASES[name]
  q, k, v, m = _inputs(case, np.random.default_rng(3))
  (item,) = _kernels(_attention(*(Tensor(a, device=gpu_python) for a in (q, k, v)), None, case[7], False))
  got, uops = _emulate(item)
  assert _is_flash(uops) and launch_size(uops)[0][0] == -(-case[3] // tile[0])
  want = _reference(q, k, v, None, case[7] == "causal")
  _check(got.reshape(want.shape), want, case[8], f"{name}, tile {tile}")

@pytest.mark.parametrize("shape", [(130, 200), (200, 130), (64, 64), (100, 300)])
def test_causal_key_blocks_past_the_diagonal_are_skipped(shape, gpu_python):
  length, keys = shape
  rng = np.random.default_rng(length + keys)
  q = rng.standard_normal((1, 2, length, 32)).astype(np.float32)
  k, v = (rng.standard_normal((1, 2, keys, 32)).astype(np.float32) for _ in range(2))
  (item,) = _kernels(_attention(*(Tensor(a, device=gpu_python) for a in (q, k, v)), None, "causal", False))
  got, uops = _emulate(item)
  key_loop = next(u for u in uops if u.op is Ops.RANGE)
  if length > 64 and keys > 64:   # several query and key blocks: the loop's end depends on the query block
    assert any(u.op is Ops.SPECIAL and u.arg[0] == "gidx0" for u in key_loop.src[0].toposort()), key_loop.src[0]
  _check(got.reshape(1, 2, length, 32), _reference(q, k, v, causal=True), np.float32, f"causal {shape}")

def test_bfloat16_inputs_on_the_python_device(gpu_python):
  from helpers import kernel_sources
  rng = np.random.default_rng(15)
  arrays = [rng.standard_normal((1, 2, 20, 16)).astype(np.float32) for _ in range(3)]
  rounded = [Tensor(a).cast(dtypes.bfloat16).float().numpy() for a in arrays]   # the inputs as bfloat16 holds them
  tq, tk, tv = (Tensor(a, device=gpu_python).cast(dtypes.bfloat16).realize() for a in arrays)
  sources = kernel_sources(lambda: tq.scaled_dot_product_attention(tk, tv, is_causal=True))
  assert len(sources) == 1 and "attn_p" in sources[0]
  got = tq.scaled_dot_product_attention(tk, tv, is_causal=True).float().numpy()
  want = _reference(*rounded, causal=True)
  assert np.allclose(got, want, rtol=1e-2, atol=1e-2), np.abs(got - want).max()

def test_hand_written_attention_is_the_same_kernel(gpu_python):
  rng = np.random.default_rng(7)
  q, k, v = (rng.standard_normal((2, 3, 50, 32)).astype(np.float32) for _ in range(3))
  bias = rng.uniform(-1, 0, (50, 50)).astype(np.float32)
  tq, tk, tv, tb = (Tensor(a, device=gpu_python) for a in (q, k, v, bias))
  out = (tq @ tk.transpose(-2, -1) * (1 / math.sqrt(32)) + tb).softmax(-1) @ tv
  items = _kernels(out)
  assert len(items) == 1
  got, uops = _emulate(items[0])
  assert _is_flash(uops)
  _check(got.reshape(2, 3, 50, 32), _reference(q, k, v, bias), np.float32, "hand-written")

def test_refused_kernel_still_right(gpu_python):
  # without warp shuffles the builder refuses: the fused kernel maps as ordinary loops, one thread an output
  rng = np.random.default_rng(8)
  q, k, v = (rng.standard_normal((1, 2, 20, 16)).astype(np.float32) for _ in range(3))
  items = _kernels(Tensor(q, device=gpu_python).scaled_dot_product_attention(Tensor(k, device=gpu_python),
                                                                              Tensor(v, device=gpu_python)))
  assert len(items) == 1
  with Context(WARP_SHUFFLE=0): got, uops = _emulate(items[0])
  assert not _is_flash(uops)
  _check(got.reshape(1, 2, 20, 16), _reference(q, k, v), np.float32, "refused")

def test_value_widths_the_kernel_does_not_take_keep_three_kernels(gpu_python):
  rng = np.random.default_rng(14)
  q, k = (Tensor(rng.standard_normal((1, 2, 20, 16)).astype(np.float32), device=gpu_python) for _ in range(2))
  v = Tensor(rng.standard_normal((1, 2, 20, 8)).astype(np.float32), device=gpu_python)
  assert len(_kernels(q.scaled_dot_product_attention(k, v))) == 3

def test_a_decode_step_keeps_its_three_kernels(gpu_python):
  rng = np.random.default_rng(13)
  q = Tensor(rng.standard_normal((1, 4, 1, 32)).astype(np.float32), device=gpu_python)
  k, v = (Tensor(rng.standard_normal((1, 4, 50, 32)).astype(np.float32), device=gpu_python) for _ in range(2))
  assert len(_kernels(q.scaled_dot_product_attention(k, v))) == 3

def test_attention_weights_read_twice_keep_their_buffers(gpu_python):
  # the softmax also returned: the chain is not fused (its weights are read by two kernels)
  rng = np.random.default_rng(9)
  q, k, v = (Tensor(rng.standard_normal((1, 1, 16, 16)).astype(np.float32), device=gpu_python) for _ in range(3))
  weights = (q @ k.transpose(-2, -1)).softmax(-1)
  with Context(SCHEDULE_CACHE=0): items = (weights @ v).schedule(weights)
  assert len([i for i in items if i.ast.op is not Ops.COPY]) >= 3

def test_python_device_runs_flash_attention_and_its_backward(gpu_python):
  from helpers import kernel_sources
  rng = np.random.default_rng(10)
  q, k, v = (rng.standard_normal((1, 2, 17, 16)).astype(np.float32) for _ in range(3))
  def forward():
    return Tensor(q, device=gpu_python).scaled_dot_product_attention(Tensor(k, device=gpu_python),
                                                                      Tensor(v, device=gpu_python), is_causal=True)
  sources = kernel_sources(forward)
  assert len(sources) == 1 and "yield None" in sources[0], f"{len(sources)} kernels"
  _check(forward().numpy(), _reference(q, k, v, causal=True), np.float32, "PYTHON device")
  import torch
  tq, tk, tv = (Tensor(a, device=gpu_python, requires_grad=True) for a in (q, k, v))
  (tq.scaled_dot_product_attention(tk, tv, is_causal=True) * 1.5).sum().backward()
  rq, rk, rv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
  (torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True) * 1.5).sum().backward()
  for mine, ref, what in ((tq, rq, "dq"), (tk, rk, "dk"), (tv, rv, "dv")):
    _check(mine.grad.numpy(), ref.grad.numpy(), np.float32, what)

def _cpu_sources(build) -> list[str]:
  from kiln.engine.realize import get_runner
  return [get_runner("CPU", item.ast).source for item in _kernels(build()) if item.ast.op is Ops.SINK]

def test_cpu_schedules_are_unchanged():
  # the rule never fires off a GPU target: the same kernels with it on and off (three of them: scores, softmax, p @ V)
  rng = np.random.default_rng(11)
  q, k, v = (Tensor(rng.standard_normal((1, 2, 16, 16)).astype(np.float32), device="CPU") for _ in range(3))
  for build in (lambda: q.scaled_dot_product_attention(k, v),
                lambda: q.scaled_dot_product_attention(k, v, is_causal=True),
                lambda: (q @ k.transpose(-2, -1)).softmax(-1) @ v):
    on = _cpu_sources(build)
    with Context(ATTENTION_FUSION=0): off = _cpu_sources(build)
    assert on == off and len(on) >= 3

# half and bfloat16 on tensor cores (gpu_attention.flash_attention_tc): the same shapes at depths it takes (opt-in:
# gpu_attention.TC, off by default)
@pytest.fixture
def tc_attention(monkeypatch):
  from kiln.codegen import gpu_attention
  monkeypatch.setattr(gpu_attention, "TC", True)

TC_CASES = {
  "half, plain": (1, 2, 2, 16, 8, 32, 32, None, np.float16),
  "half, ragged rows and keys": (1, 2, 2, 70, 130, 32, 32, None, np.float16),
  "half, causal, two batches": (2, 1, 1, 130, 70, 64, 64, "causal", np.float16),
  "half, causal, one block": (1, 1, 1, 128, 128, 32, 32, "causal", np.float16),
  "half, grouped-query heads": (1, 4, 2, 33, 65, 32, 32, None, np.float16),
  "half, boolean mask": (1, 2, 2, 40, 100, 32, 32, "bool", np.float16),
  "half, additive mask": (2, 2, 2, 17, 90, 64, 64, "add", np.float16),
  "half, causal": (1, 1, 1, 65, 129, 64, 64, "causal", np.float16),
  "half, depth 128, causal": (1, 1, 1, 40, 100, 128, 128, "causal", np.float16),
  "half, depth 64, value width 128": (1, 1, 1, 20, 70, 64, 128, None, np.float16),
  "bf16, causal": (1, 2, 2, 65, 129, 64, 64, "causal", "bf16"),
  "bf16, boolean mask, grouped-query heads": (1, 4, 2, 40, 100, 32, 32, "bool", "bf16"),
  "bf16, depth 128": (1, 1, 1, 33, 80, 128, 128, None, "bf16"),
}

def _tc_inputs(case, rng, device):
  """The case's tensors on `device` and the float64 NumPy arrays they hold (bfloat16: the rounded values)."""
  if case[8] != "bf16":
    arrays = _inputs(case, rng)
    return [Tensor(a, device=device) if a is not None else None for a in arrays], arrays
  arrays = list(_inputs(case[:8] + (np.float32,), rng))
  tensors = [Tensor(a, device=device).cast(dtypes.bfloat16).realize() for a in arrays[:3]]
  rounded = [Tensor(a).cast(dtypes.bfloat16).float().numpy() for a in arrays[:3]]
  mask = Tensor(arrays[3], device=device) if arrays[3] is not None else None
  return tensors + [mask], rounded + [arrays[3]]

def _check_tc(got, want, dtype, what):
  tol = 1e-2 if dtype == "bf16" else 2e-3   # P rounded to the inputs' dtype for its product with V
  worst = np.nanmax(np.abs(got.astype(np.float64) - want)) if got.size else 0.0
  assert got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol), \
    f"{what}: shapes {got.shape} vs {want.shape}, worst difference {worst}"

@pytest.mark.parametrize("name", list(TC_CASES))
def test_tensor_core_flash_kernel_matches_numpy(name, gpu_python, tc_attention):
  # half in the lockstep emulator; bfloat16 (which it computes only as fragments) end to end on the PYTHON device
  case = TC_CASES[name]
  (tq, tk, tv, tm), (q, k, v, m) = _tc_inputs(case, np.random.default_rng(len(name)), gpu_python)
  out = _attention(tq, tk, tv, tm, case[7], case[1] != case[2])
  items = _kernels(out)
  assert len(items) == 1, f"{name}: {len(items)} kernels"
  _, uops = render_with(CUDARenderer(), "k", optimize_for(CUDARenderer(), lower_for_codegen(items[0].ast)))
  assert _is_flash(uops) and _is_tc(uops), f"{name}: not the tensor-core flash kernel"
  assert any(u.op is Ops.LDMATRIX and u.arg[1] for u in uops) and any(u.op is Ops.CP_ASYNC for u in uops)
  got = out.float().numpy() if case[8] == "bf16" else _emulate(items[0])[0]
  want = _reference(q, k, v, m, case[7] == "causal")
  _check_tc(got.astype(np.float64).reshape(want.shape), want, case[8], name)

def test_tensor_core_kernel_on_the_python_device(gpu_python, tc_attention):
  # the PYTHON emulator (its warps' WMMAs and ldmatrix) runs the same kernel end to end
  from helpers import kernel_sources
  case = TC_CASES["half, causal"]
  (tq, tk, tv, _), (q, k, v, _) = _tc_inputs(case, np.random.default_rng(4), gpu_python)
  sources = kernel_sources(lambda: tq.scaled_dot_product_attention(tk, tv, is_causal=True))
  assert len(sources) == 1 and "attn_k" in sources[0] and "attn_p" not in sources[0]
  got = tq.scaled_dot_product_attention(tk, tv, is_causal=True).numpy()
  _check_tc(got.astype(np.float64), _reference(q, k, v, causal=True), np.float16, "PYTHON device")

@pytest.mark.parametrize("setting", ["TC=0", "depth 16", "float32"])
def test_the_simt_kernel_where_tensor_cores_do_not_apply(setting, gpu_python, tc_attention):
  case = TC_CASES["half, causal"]
  if setting == "depth 16": case = case[:5] + (16, 16) + case[7:]
  if setting == "float32": case = case[:8] + (np.float32,)
  (tq, tk, tv, _), (q, k, v, _) = _tc_inputs(case, np.random.default_rng(5), gpu_python)
  (item,) = _kernels(_attention(tq, tk, tv, None, "causal", False))
  with Context(TC=0 if setting == "TC=0" else 1): got, uops = _emulate(item)
  assert _is_flash(uops) and not _is_tc(uops)
  want = _reference(q, k, v, causal=True)
  _check(got.astype(np.float64).reshape(want.shape), want, case[8], setting)

def _render_big(renderer, causal=False, tc=False) -> str:
  from helpers import GPUStylePython
  from kiln.codegen import gpu_attention
  device = Device["PYTHON"]
  saved, device.renderer = device.renderer, GPUStylePython()
  saved_tc, gpu_attention.TC = gpu_attention.TC, tc
  try:
    q, k, v = (Tensor.empty(8, 16, 4096, 128, dtype=dtypes.half, device="PYTHON") for _ in range(3))
    (item,) = _kernels(q.scaled_dot_product_attention(k, v, is_causal=causal))
    src, uops = render_with(renderer, kernel_name(item.ast), optimize_for(renderer, lower_for_codegen(item.ast)))
  finally: device.renderer, gpu_attention.TC = saved, saved_tc
  assert _is_flash(uops) and _is_tc(uops) == tc, "not the tensor-core flash kernel" if tc else "not the SIMT kernel"
  if tc: assert launch_size(uops)[:2] == ((4096 // gpu_attention.TC_BM, 128, 1), (256, 1, 1)), launch_size(uops)
  return src

NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")

def _ptxas_report(command: list[str]) -> str:
  built = subprocess.run(command, capture_output=True, text=True)
  report = built.stdout + built.stderr
  assert built.returncode == 0, report
  assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report, report
  static = re.search(r"(\d+) bytes smem", report)   # none where the arrays are one dynamic array (over 48 KiB)
  assert static is None or int(static.group(1)) <= 48 * 1024, f"{static.group(1)} bytes of static shared memory"
  print(re.findall(r"Used \d+ registers.*", report))
  return report

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("tc", [False, True], ids=["simt", "tensor cores"])
@pytest.mark.parametrize("causal", [False, True])
def test_big_kernel_compiles_for_sm90a_without_spills(causal, tc):
  src = _render_big(CUDARenderer(), causal, tc)
  with tempfile.TemporaryDirectory(prefix="kiln_attn_") as folder:
    path = os.path.join(folder, "attention.cu")
    with open(path, "w") as f: f.write(src)
    _ptxas_report([NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v", "-o",
                   os.path.join(folder, "attention.cubin"), path])

@pytest.mark.skipif(PTXAS is None, reason="ptxas (CUDA toolkit) not installed")
@pytest.mark.parametrize("tc", [False, True], ids=["simt", "tensor cores"])
def test_big_kernel_as_ptx_assembles_without_spills(tc):
  src = _render_big(PTXRenderer(), tc=tc)
  assert "bar.sync" in src and "shfl.sync.bfly.b32" in src
  for op in ("mma.sync.aligned.m16n8k16", "ldmatrix.sync.aligned.m8n8.x4", ".trans", "cp.async.cg") if tc else ():
    assert op in src, f"no {op} in the PTX"
  with tempfile.TemporaryDirectory(prefix="kiln_attn_") as folder:
    path = os.path.join(folder, "attention.ptx")
    with open(path, "w") as f: f.write(src)
    _ptxas_report([PTXAS, "-arch=sm_90a", "-v", "-o", os.path.join(folder, "attention.cubin"), path])

from kiln.runtime import cuda_driver as cuda   # noqa: E402
needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@needs_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_flash_attention_on_the_gpu(name):
  case = CASES[name]
  q, k, v, m = _inputs(case, np.random.default_rng(len(name)))
  mask, dtype = case[7], case[8]
  tq, tk, tv = (Tensor(a, device="CUDA") for a in (q, k, v))
  tm = Tensor(m, device="CUDA") if m is not None else None
  out = _attention(tq, tk, tv, tm, mask, case[1] != case[2])
  assert len(_kernels(out)) == 1
  want = _reference(q, k, v, m, mask == "causal")
  _check(out.numpy().reshape(want.shape), want, dtype, name)

@needs_gpu
@pytest.mark.parametrize("name", list(TC_CASES))
def test_tensor_core_flash_attention_on_the_gpu(name, tc_attention):
  case = TC_CASES[name]
  (tq, tk, tv, tm), (q, k, v, m) = _tc_inputs(case, np.random.default_rng(len(name)), "CUDA")
  out = _attention(tq, tk, tv, tm, case[7], case[1] != case[2])
  (item,) = _kernels(out)
  _, uops = render_with(CUDARenderer(), "k", optimize_for(CUDARenderer(), lower_for_codegen(item.ast)))
  assert _is_tc(uops), f"{name}: not the tensor-core kernel"
  want = _reference(q, k, v, m, case[7] == "causal")
  _check_tc(out.float().numpy().astype(np.float64).reshape(want.shape), want, case[8], name)

@needs_gpu
def test_flash_attention_backward_on_the_gpu():
  import torch
  rng = np.random.default_rng(12)
  q, k, v = (rng.standard_normal((2, 2, 70, 32)).astype(np.float32) for _ in range(3))
  tq, tk, tv = (Tensor(a, device="CUDA", requires_grad=True) for a in (q, k, v))
  tq.scaled_dot_product_attention(tk, tv, is_causal=True).square().sum().backward()
  rq, rk, rv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
  torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True).square().sum().backward()
  for mine, ref, what in ((tq, rq, "dq"), (tk, rk, "dk"), (tv, rv, "dv")):
    _check(mine.grad.numpy(), ref.grad.numpy(), np.float32, what)

@needs_gpu
def test_bfloat16_flash_attention_on_the_gpu():
  rng = np.random.default_rng(16)
  arrays = [rng.standard_normal((2, 4, 200, 64)).astype(np.float32) for _ in range(3)]
  rounded = [Tensor(a).cast(dtypes.bfloat16).float().numpy() for a in arrays]
  tq, tk, tv = (Tensor(a, device="CUDA").cast(dtypes.bfloat16).realize() for a in arrays)
  out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  assert len(_kernels(out)) == 1
  got, want = out.float().numpy(), _reference(*rounded, causal=True)
  assert np.allclose(got, want, rtol=1e-2, atol=1e-2), np.abs(got - want).max()
