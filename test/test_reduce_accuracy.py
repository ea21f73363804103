"""Reductions accumulate accurately (issue 16): half/bfloat16 inputs reduce in float32 and round once, as PyTorch's do,
and long float32 sums stay within a blocked-summation error bound of the float64 sum."""
import os, pathlib, subprocess, sys
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, dtypes, GlobalCounters
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps, KernelOptError, heuristic_opts, block_long_sums
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "codegen"))
from kernel_runs import last_kernel_item, run_lowered  # noqa: E402

HALVES = [(dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)]
# one rounding to the output dtype, plus float32 accumulation noise: a few units in the last place of the output
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

def _half_input(shape, torch_dtype, scale=1.0, seed=0) -> tuple[Tensor, torch.Tensor]:
  """The same reduced-precision values as a kiln Tensor and as a float32 torch tensor (the reference's input)."""
  values = torch.tensor(np.random.default_rng(seed).standard_normal(shape) * scale, dtype=torch.float32)
  rounded = values.to(torch_dtype)
  kiln_dtype = dtypes.float16 if torch_dtype is torch.float16 else dtypes.bfloat16
  return Tensor(rounded.float().numpy()).cast(kiln_dtype), rounded.float()

def _assert_close(got: np.ndarray, want: torch.Tensor, rtol: float, what: str) -> None:
  """|got - want| <= rtol * (|want| + max|want| / 100): relative, but results that cancel to near 0 are judged
  against the row's scale (their rounding error is that of the terms, not of the tiny result)."""
  want_np = want.detach().double().numpy()
  err = np.abs(got.astype(np.float64) - want_np)
  scale = np.abs(want_np) + np.max(np.abs(want_np), initial=0.0) / 100 + 1e-30
  worst = float(np.max(err / scale)) if err.size else 0.0
  assert worst <= rtol, f"{what}: shape {want_np.shape} worst relative difference {worst:.3g} > {rtol}"

# ---------------------------------------------------------------------------------------------------------------------
# the repros

def test_half_softmax_of_a_long_row_is_not_zero():
  out = Tensor(np.zeros((1, 100000), np.float16)).softmax(-1).numpy()
  assert out.dtype == np.float16
  want = torch.zeros((1, 100000), dtype=torch.float16).softmax(-1).numpy()   # 1e-5, rounded to a float16 subnormal
  np.testing.assert_array_equal(out, want)

def test_half_softmax_over_a_vocabulary_sums_to_one():
  logits = Tensor(np.random.default_rng(0).standard_normal((2, 128256)).astype(np.float16))
  np.testing.assert_allclose(logits.softmax(-1).float().sum(-1).numpy(), 1.0, rtol=2e-3)

def test_half_layernorm_statistics_do_not_overflow():
  x = np.array([[-858, 303, -511]], np.float16)
  want = F.layer_norm(torch.tensor(x), (3,))
  got = Tensor(x).layernorm().numpy()
  assert got.dtype == np.float16
  _assert_close(got, want.float(), 2e-3, "layernorm")

def test_int_logsumexp_works_in_float():
  x = np.array([83, -122, 87], np.int8)
  got = Tensor(x).logsumexp()
  want = torch.tensor(x).logsumexp(0)
  assert got.dtype == dtypes.float32
  np.testing.assert_allclose(got.item(), want.item(), rtol=1e-6)

# ---------------------------------------------------------------------------------------------------------------------
# every reduction of half inputs against PyTorch in float32, forward and backward

REDUCTIONS = {
  "sum": (lambda t: t.sum(-1), lambda t: t.sum(-1)),
  "mean": (lambda t: t.mean(0), lambda t: t.mean(0)),
  "var": (lambda t: t.var(-1), lambda t: t.var(-1)),
  "std": (lambda t: t.std(0), lambda t: t.std(0)),
  "softmax": (lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
  "log_softmax": (lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1)),
  "logsumexp": (lambda t: t.logsumexp(-1), lambda t: t.logsumexp(-1)),
  "layernorm": (lambda t: t.layernorm(), lambda t: F.layer_norm(t, t.shape[-1:])),
  "cumsum": (lambda t: t.cumsum(-1), lambda t: t.cumsum(-1)),
}

@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("kiln_dtype, torch_dtype", HALVES)
@pytest.mark.parametrize("shape, scale", [((3, 300), 40.0), ((5, 4096), 3.0)])
def test_half_reduction_matches_float32_reference(name, kiln_dtype, torch_dtype, shape, scale):
  kiln_fn, torch_fn = REDUCTIONS[name]
  x, ref = _half_input(shape, torch_dtype, scale)
  ref.requires_grad_(True)
  want = torch_fn(ref)
  x.requires_grad = True
  got = kiln_fn(x)
  assert got.dtype == kiln_dtype, f"{name}: result dtype {got.dtype}, want {kiln_dtype}"
  # the reference rounded once to the output dtype, as the kiln result is
  _assert_close(got.float().numpy(), want.to(torch_dtype).float(), TOLERANCE[torch_dtype], name)
  upstream = np.random.default_rng(1).standard_normal(want.shape).astype(np.float32)
  want.backward(torch.tensor(upstream).to(torch_dtype).float())
  (got * Tensor(upstream).cast(kiln_dtype)).sum().backward()
  # the gradient passes through the output dtype once more, so allow a few more ulps
  _assert_close(x.grad.float().numpy(), ref.grad, 4 * TOLERANCE[torch_dtype], f"{name} backward")

@pytest.mark.parametrize("kiln_dtype, torch_dtype", HALVES)
@pytest.mark.parametrize("shapes", [((64, 2048), (2048, 16)), ((2, 3, 700), (700, 5)), ((4096,), (4096, 3))])
def test_half_matmul_rounds_once(kiln_dtype, torch_dtype, shapes):
  (a, a_ref), (b, b_ref) = _half_input(shapes[0], torch_dtype, 4.0, 0), _half_input(shapes[1], torch_dtype, 4.0, 1)
  a.requires_grad, b.requires_grad = True, True
  a_ref.requires_grad_(True), b_ref.requires_grad_(True)
  got, want = a @ b, a_ref @ b_ref
  assert got.dtype == kiln_dtype
  # float32 products of half values are exact: the only error left is the output's one rounding (and the float32 sum)
  _assert_close(got.float().numpy(), want.to(torch_dtype).float(), TOLERANCE[torch_dtype], "matmul")
  got.sum().backward()
  want.sum().backward()
  _assert_close(a.grad.float().numpy(), a_ref.grad, 2 * TOLERANCE[torch_dtype], "matmul backward a")
  _assert_close(b.grad.float().numpy(), b_ref.grad, 2 * TOLERANCE[torch_dtype], "matmul backward b")

def test_half_linear_with_bias():
  (x, x_ref), (w, w_ref) = _half_input((8, 1000), torch.float16, 2.0, 0), _half_input((1000, 6), torch.float16, 2.0, 1)
  (b, b_ref) = _half_input((6,), torch.float16, 1.0, 2)
  want = (x_ref @ w_ref + b_ref).half().float()
  _assert_close(x.linear(w, b).float().numpy(), want, 2e-3, "linear")

def test_half_conv2d_accumulates_in_float32():
  (x, x_ref), (w, w_ref) = _half_input((2, 64, 9, 9), torch.float16, 3.0, 0), _half_input((4, 64, 3, 3), torch.float16,
                                                                                           3.0, 1)
  got = x.conv2d(w)
  assert got.dtype == dtypes.float16
  _assert_close(got.float().numpy(), F.conv2d(x_ref, w_ref).half().float(), 2e-3, "conv2d")

# ---------------------------------------------------------------------------------------------------------------------
# the float32 work does not cost kernels: a half softmax/layernorm stays one row-fused kernel, a half matmul one kernel

def _kernels(fn) -> int:
  fn().realize()   # compile once, so a cache hit is not counted differently
  before = GlobalCounters.kernel_count
  fn().realize()
  return GlobalCounters.kernel_count - before

@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "logsumexp"])
def test_half_row_chains_stay_one_kernel(name):
  x = Tensor(np.random.default_rng(0).standard_normal((16, 1000)).astype(np.float16)).realize()
  assert _kernels(lambda: getattr(x, name)(-1) if name != "layernorm" else x.layernorm()) == 1

def test_half_matmul_stays_one_kernel():
  rng = np.random.default_rng(0)
  a = Tensor(rng.standard_normal((128, 256)).astype(np.float16)).realize()
  b = Tensor(rng.standard_normal((256, 64)).astype(np.float16)).realize()
  assert _kernels(lambda: a @ b) == 1

# ---------------------------------------------------------------------------------------------------------------------
# long float32 sums: blocked accumulation (OptOps.BLOCKSUM, docs/ir.md "Blocked accumulation") against float64.
# A sum of n equal terms in one accumulator drifts by up to ~n/4 ulps (0.1 * 10^7: 1.2e-3 before blocking); blocked,
# each accumulator adds at most ~2*SUM_BLOCK terms per level, so a few 1e-6 is the bound checked here.
BLOCKED_SUM_RTOL = 1e-5

def _relative_error(got: float, want: float) -> float: return abs(got - want) / abs(want)

@pytest.mark.parametrize("n", [10**6, 10**7, 10**8])
def test_long_sum_of_a_constant(n):
  # a broadcast constant reads no memory: 10^8 terms cost ~0.1 s
  got, want = Tensor.full((n,), 0.1).sum().item(), float(np.float32(0.1)) * n
  assert _relative_error(got, want) < BLOCKED_SUM_RTOL, f"sum of {n} x 0.1: {got} vs {want}"

@pytest.mark.parametrize("n", [10**6, 1000003, 3 * 999983])   # even, prime (padded), 3 * a prime
def test_long_sum_of_an_array(n):
  x = np.full(n, 0.1, np.float32) + np.random.default_rng(n).random(n, dtype=np.float32) * 1e-3
  got = Tensor(x).sum().item()
  assert _relative_error(got, x.sum(dtype=np.float64)) < BLOCKED_SUM_RTOL

@pytest.mark.parametrize("shape, axis", [((4, 2**18), 1), ((3, 250000), 1), ((2**17, 8), 0), ((256, 64, 64), (1, 2)),
                                         ((1000, 1000), None)])
def test_long_row_column_and_multi_axis_sums(shape, axis):
  x = (np.full(shape, 0.1) + np.random.default_rng(0).random(shape) * 1e-3).astype(np.float32)
  got = Tensor(x).sum(axis).numpy()
  want = x.astype(np.float64).sum(axis)
  err = float(np.max(np.abs(got - want) / np.abs(want)))
  assert err < BLOCKED_SUM_RTOL, f"sum{shape} over {axis}: worst relative error {err:.3g}"
  np.testing.assert_allclose(Tensor(x).mean(axis).numpy(), x.astype(np.float64).mean(axis), rtol=BLOCKED_SUM_RTOL)

def test_long_softmax_and_logsumexp_rows():
  x = np.random.default_rng(0).standard_normal((2, 300000)).astype(np.float32) * 0.01
  probs = Tensor(x).softmax(-1).numpy().astype(np.float64)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=BLOCKED_SUM_RTOL)
  want = torch.tensor(x, dtype=torch.float64).logsumexp(-1).numpy()
  np.testing.assert_allclose(Tensor(x).logsumexp(-1).numpy(), want, rtol=1e-6)

def test_long_sum_gradient_of_a_broadcast():
  # the gradient of a scalar broadcast over 10^6 terms is their sum: it is blocked too
  x = np.full(10**6, 0.1, np.float32)
  w = Tensor([1.0], requires_grad=True)
  (Tensor(x) * w).sum().backward()
  assert _relative_error(w.grad.item(), x.sum(dtype=np.float64)) < BLOCKED_SUM_RTOL

@pytest.mark.parametrize("device, n", [("PYTHON", 2**15), ("LLVM", 10**6)])
def test_long_sum_on_other_devices(device, n):
  if device == "LLVM": pytest.importorskip("llvmlite")
  x = np.full(n, 0.1, np.float32)
  got = Tensor(x, device=device).sum().item()
  assert _relative_error(got, x.sum(dtype=np.float64)) < BLOCKED_SUM_RTOL

def test_long_sum_without_the_optimizer():
  # NOOPT=1 turns off every optimization but this one; kernels are cached by AST in-process, so a fresh process
  code = "import numpy as np; from kiln import Tensor; print(Tensor(np.full(10**6 + 8, 0.1, np.float32)).sum().item())"
  out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NOOPT": "1"}, capture_output=True, text=True,
                       check=True, cwd=pathlib.Path(__file__).resolve().parents[1])
  assert _relative_error(float(out.stdout), float(np.float32(0.1)) * (10**6 + 8)) < BLOCKED_SUM_RTOL

# ---- the action itself ----

BLOCKSUM_KERNELS = {
  "full sum": lambda: Tensor.rand(4096).sum(),
  "row sums": lambda: Tensor.rand(6, 512).sum(1),
  "column sums": lambda: Tensor.rand(512, 6).sum(0),
  "softmax rows": lambda: Tensor.rand(4, 256).softmax(-1),
  "multi-axis sum": lambda: Tensor.rand(8, 16, 32).sum((0, 2)),
  "conv (three reduce loops)": lambda: Tensor.rand(1, 4, 10, 10).conv2d(Tensor.rand(3, 4, 3, 3)),
  "max": lambda: Tensor.rand(64, 64).max(),
}

@pytest.mark.parametrize("name", list(BLOCKSUM_KERNELS))
def test_every_blocksum_keeps_results(name):
  item = last_kernel_item(BLOCKSUM_KERNELS[name]())
  lowered = lower_kernel(item.ast)
  want = run_lowered(item, lowered)
  tried = 0
  for axis, rng in enumerate(Kernel(lowered).axes):
    if not Kernel(lowered).is_reduce(axis): continue
    size = Kernel.size(rng)
    for block in [d for d in range(2, size) if size % d == 0][:6]:
      kernel = Kernel(lowered).apply(Opt(OptOps.BLOCKSUM, axis, block))
      assert len(kernel.reduce_axes) == len(Kernel(lowered).reduce_axes) + 1
      np.testing.assert_allclose(run_lowered(item, kernel.sink), want, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{name} with BLOCKSUM on axis {axis} by {block}")
      tried += 1
  assert tried

def test_blocksum_refusals():
  lowered = lower_kernel(last_kernel_item(Tensor.rand(4096).sum()).ast)
  for opt in (Opt(OptOps.BLOCKSUM, 0, 100), Opt(OptOps.BLOCKSUM, 0, 4096), Opt(OptOps.BLOCKSUM, 0, 1)):
    with pytest.raises(KernelOptError): Kernel(lowered).apply(opt)
  rows = lower_kernel(last_kernel_item(Tensor.rand(64, 64).sum(1)).ast)
  with pytest.raises(KernelOptError): Kernel(rows).apply(Opt(OptOps.BLOCKSUM, 0, 8))   # an output axis

def test_heuristics_block_long_sums_only():
  def applied(t: Tensor) -> list:
    kernel = Kernel(lower_kernel(last_kernel_item(t).ast))
    heuristic_opts(kernel)
    return [o for o in block_long_sums(kernel) if o.op is OptOps.BLOCKSUM]
  assert applied(Tensor.rand(2**20).sum())   # 2^17 terms per lane: blocked (twice)
  assert not applied(Tensor.rand(64, 4096).sum(1))   # 512 terms per lane: left alone
  assert not applied(Tensor.rand(2**20).max())   # exact anyway
  assert not applied(Tensor.rand(2**20).cast(dtypes.int32).sum())
  assert not applied(Tensor.rand(256, 4096) @ Tensor.rand(4096, 256))   # a register tile: 128 accumulators

@pytest.mark.parametrize("kiln_dtype, torch_dtype", HALVES)
def test_half_batchnorm_statistics_in_float32(kiln_dtype, torch_dtype):
  from kiln.nn import BatchNorm
  x, ref = _half_input((4, 3, 5, 5), torch_dtype, 400.0)   # squares of 400 are past float16's 65504
  norm, torch_norm = BatchNorm(3), torch.nn.BatchNorm2d(3)
  with Tensor.train(): got = norm(x)
  want = torch_norm(ref)
  # (float32 weights promote the result to float32; the input is centered in its own dtype, one rounding)
  _assert_close(got.float().numpy(), want, 2 * TOLERANCE[torch_dtype], "batchnorm")
  _assert_close(norm.running_var.numpy(), torch_norm.running_var, 1e-3, "batchnorm running_var")
