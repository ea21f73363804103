"""Heuristic choices for reductions over contiguous rows (accumulator lanes), short axes (whole upcasts) and
software-math epilogues (kiln/codegen/opt/heuristic.py), each checked against the unoptimized kernel and NumPy."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, Context
from kiln.schedule import pack
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps, heuristic_opts
from kiln.engine.realize import render_lowered
from kiln.runtime.cpu_target import CPUTarget
from kernel_runs import last_kernel_item, run_lowered

U, R, L = OptOps.UPCAST, OptOps.UNROLL, OptOps.LANES

AVX512_XEON = CPUTarget("x86_64", "avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20, 2)

def _optimized_and_plain(t: Tensor, target: CPUTarget | None = None) -> tuple[list[Opt], np.ndarray, np.ndarray]:
  """(the heuristics' actions, the optimized kernel's output, the unoptimized kernel's output) for t's last kernel."""
  item = last_kernel_item(t)
  lowered = lower_kernel(item.ast)
  kernel = Kernel(lowered)
  applied = list(heuristic_opts(kernel, target))
  return applied, run_lowered(item, kernel.sink), run_lowered(item, lowered)

def _close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
  np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())))

def _rand(rng: np.random.Generator, *shape: int) -> Tensor:
  return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()

@pytest.mark.parametrize("target", [None, AVX512_XEON])
@pytest.mark.parametrize("n", [1 << 16, 4096 + 8])
def test_full_sum_gets_lanes(n, target):
  """The same lanes on every target (they fix the order of the sum, so its bits are the same on every machine): 32
  for a long sum that 32 divides (independent vector accumulators), else 8."""
  a = np.random.default_rng(n).random(n, dtype=np.float32)
  applied, got, want = _optimized_and_plain(Tensor(a).sum(), target)
  assert [(o.op, o.arg) for o in applied][:1] == [(L, 32 if n % 32 == 0 else 8)], applied
  _close(got, want)
  _close(got, np.atleast_1d(a.astype(np.float64).sum()))

def test_row_reductions_get_lanes_and_max_is_exact():
  x = _rand(np.random.default_rng(1), 64, 256)
  applied, got, want = _optimized_and_plain(x.max(axis=1))
  assert [(o.op, o.arg) for o in applied] == [(L, 8)], applied
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, x.numpy().max(axis=1))
  applied, got, want = _optimized_and_plain(x.sum(axis=1))
  assert [(o.op, o.arg) for o in applied] == [(L, 8)], applied
  _close(got, want)

def test_column_sum_keeps_its_output_upcast():
  x = _rand(np.random.default_rng(2), 256, 64)
  applied, got, want = _optimized_and_plain(x.sum(axis=0))
  assert all(o.op is not L for o in applied) and applied[0].op is U, applied
  _close(got, want)
  _close(got, x.numpy().sum(axis=0), rtol=1e-4)

def test_softmax_rows_get_lanes_on_both_reductions():
  x = _rand(np.random.default_rng(3), 32, 512)
  applied, got, want = _optimized_and_plain(x.softmax(-1))
  assert [o.op for o in applied] == [U, L, L], applied
  _close(got, want)
  ref = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
  _close(got.reshape(32, 512), ref / ref.sum(-1, keepdims=True))

def test_layernorm_sums_get_lanes():
  x = _rand(np.random.default_rng(4), 16, 256)
  centered = x - x.mean(-1, keepdim=True)
  applied, got, want = _optimized_and_plain(centered * ((centered * centered).mean(-1, keepdim=True) + 1e-5).rsqrt())
  assert any(o.op is L for o in applied), applied
  _close(got, want)
  c = x.numpy() - x.numpy().mean(-1, keepdims=True)
  _close(got.reshape(16, 256), c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5), rtol=1e-4)

def test_short_padded_rows_are_upcast_whole():
  x = _rand(np.random.default_rng(5), 3, 8, 13)
  applied, got, want = _optimized_and_plain(x.pad(((0, 0), (1, 1), (1, 1))).contiguous())
  assert [(o.op, o.arg) for o in applied] == [(U, 15)], applied
  np.testing.assert_array_equal(got, want)
  applied, got, want = _optimized_and_plain(x.pad(((0, 0), (0, 0), (1, 1))).contiguous() * 2)
  assert [(o.op, o.arg) for o in applied] == [(U, 15)], applied
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got.reshape(3, 8, 15), np.pad(x.numpy(), ((0, 0), (0, 0), (1, 1))) * 2)

def test_short_rows_with_software_math_are_left_rolled():
  x = _rand(np.random.default_rng(6), 64, 58)
  applied, got, want = _optimized_and_plain(x.exp())
  assert applied == [], applied
  _close(got, want)

@pytest.mark.parametrize("m,k,n", [(64, 96, 10), (40, 32, 6)])
def test_matmul_with_a_short_column_axis_upcasts_it_whole(m, k, n):
  rng = np.random.default_rng(m + n)
  a, b = _rand(rng, m, k), _rand(rng, k, n)
  applied, got, want = _optimized_and_plain(a @ b)
  assert [(o.op, o.arg) for o in applied][:2] == [(U, n), (U, 8)], applied
  _close(got, want)
  _close(got.reshape(m, n), a.numpy() @ b.numpy(), rtol=1e-4)

def test_gelu_matmul_gets_the_wide_tile():
  rng = np.random.default_rng(7)
  h, w = _rand(rng, 32, 64), _rand(rng, 64, 64)
  v = h @ w
  applied, got, want = _optimized_and_plain(0.5 * v * (1 + (0.79788 * (v + 0.044715 * v * v * v)).tanh()))
  assert [(o.op, o.arg) for o in applied][:2] == [(U, 16), (U, 8)], applied
  _close(got, want, rtol=1e-4)

def test_pad_copy_indexes_without_a_division():
  x = _rand(np.random.default_rng(8), 4, 6, 6)
  padded = x.pad(((0, 0), (1, 1), (1, 1))).contiguous()
  item = last_kernel_item(padded)
  source, _ = render_lowered("CPU", "pad_probe", lower_kernel(item.ast))   # C source: its index math is greppable
  index_math = [line for line in source.splitlines() if "alu" in line]   # the thread split's bounds divide
  assert index_math and not any("%" in line or "/" in line for line in index_math), source
  np.testing.assert_array_equal(padded.numpy(), np.pad(x.numpy(), ((0, 0), (1, 1), (1, 1))))

def test_tiled_contiguous_reduction_is_unrolled_not_laned():
  # 8 output rows share each load of b: with 8 lanes per row the LLM's prefill attention scores ran at half speed
  rng = np.random.default_rng(9)
  a, b = _rand(rng, 64, 64), _rand(rng, 3, 64)
  applied, got, want = _optimized_and_plain(a @ b.T)
  assert [(o.op, o.arg) for o in applied] == [(U, 8), (R, 8)], applied
  _close(got, want)
  _close(got.reshape(64, 3), a.numpy() @ b.numpy().T, rtol=1e-4)

def test_row_sum_under_an_elementwise_upcast_gets_lanes():
  # exp(x) / sum(exp(x)): the row's elementwise loop is upcast, but the sum does not depend on it, so the kernel has
  # one accumulator and the sum gets lanes (as without the upcast), not an unroll (measured 2x slower)
  x = _rand(np.random.default_rng(4), 4, 16, 64)
  e = x.exp()
  applied, got, want = _optimized_and_plain(e / e.sum(-1, keepdim=True))
  assert [o.op for o in applied] == [U, L], applied
  _close(got, want)
  ref = np.exp(x.numpy())
  _close(got.reshape(4, 16, 64), ref / ref.sum(-1, keepdims=True))

def test_a_tile_refused_by_the_node_budget_takes_fewer_rows(monkeypatch):
  # the transformer's GELU up-projection fused with its matmul (the scheduler splits it off on host CPUs:
  # kiln/schedule/pack.py `splits_epilogue`, turned off here): 8 rows of a 32-wide tile copy the epilogue past
  # MAX_NODES, so 4 rows (once: a tile of 32 x 1, a quarter of the speed)
  monkeypatch.setattr(pack, "EPILOGUE_SPLIT_MIN_WORK", 1 << 62)
  def gelu(v): return 0.5 * v * (1 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())
  x, w, b = _rand(np.random.default_rng(2), 256, 256), _rand(np.random.default_rng(3), 256, 1024), \
    _rand(np.random.default_rng(4), 1024)
  with Context(SCHEDULE_CACHE=0): applied, got, want = _optimized_and_plain(gelu(x @ w + b), AVX512_XEON)
  upcasts = [o.arg for o in applied if o.op is OptOps.UPCAST]
  assert upcasts == [32, 4], applied
  _close(got, want)
