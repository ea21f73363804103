"""The matrix-vector heuristic (kiln/codegen/opt/heuristic.py, `_matrix_vector`): which kernels get accumulator lanes
on their contiguous reduce axis, and that the optimized kernels agree with the unoptimized ones on random shapes
(plain float32 rows, rows dequantized from packed nibbles as the LLM's Q4_1 matrices are, two products fused)."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.schedule.kernelize import create_schedule
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.parallel import find_parallel_loop
from kiln.codegen.opt import Kernel, Opt, OptOps, heuristic_opts
from kiln.codegen.opt.heuristic import _matrix_vector, axis_stride, memory_accesses
from kernel_runs import last_kernel_item, run_lowered

L = OptOps.LANES

def _optimized_and_plain(t: Tensor) -> tuple[list[Opt], np.ndarray, np.ndarray, Kernel]:
  """(the heuristics' actions, the optimized kernel's result, the unoptimized kernel's result, the kernel)."""
  item = last_kernel_item(t)
  lowered = lower_kernel(item.ast)
  kernel = Kernel(lowered)
  applied = heuristic_opts(kernel)
  return applied, run_lowered(item, kernel.sink), run_lowered(item, lowered), kernel

def _nibble_rows(rng: np.random.Generator, rows: int, blocks: int) -> tuple[Tensor, Tensor, Tensor]:
  """Packed 4-bit rows as the LLM's Q4_1 matrices are stored: bytes (rows, blocks, 16), scales and mins (rows, blocks)."""
  packed = Tensor(rng.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)).realize()
  scale = Tensor(rng.uniform(0.01, 0.1, (rows, blocks)).astype(np.float32)).realize()
  low = Tensor(rng.uniform(-0.5, 0.0, (rows, blocks)).astype(np.float32)).realize()
  return packed, scale, low

def _dequantized_product(x: Tensor, packed: Tensor, scale: Tensor, low: Tensor) -> Tensor:
  """x (1, blocks*32) times the rows' values, summed over (block, nibble, byte): one kernel, as QuantizedMatrix does."""
  shifts = (Tensor.arange(2, dtype=dtypes.uint8) * 4).reshape(2, 1)
  q = ((packed.unsqueeze(-2) >> shifts) & 15).cast(dtypes.float32)               # (rows, blocks, 2, 16)
  values = q * scale.unsqueeze(-1).unsqueeze(-1) + low.unsqueeze(-1).unsqueeze(-1)
  blocks = packed.shape[1]
  return (x.reshape(1, 1, blocks, 2, 16) * values.unsqueeze(0)).sum((2, 3, 4))

def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=what)

@pytest.mark.parametrize("seed", range(4))
def test_float_matvec_gets_lanes_and_matches(seed):
  rng = np.random.default_rng(seed)
  n, k = int(rng.integers(3, 70)), int(rng.choice([16, 48, 96, 200, 576]))
  x = Tensor(rng.standard_normal((1, k)).astype(np.float32)).realize()
  w = Tensor(rng.standard_normal((n, k)).astype(np.float32)).realize()
  applied, got, want, _ = _optimized_and_plain(x @ w.T)
  lanes = 16 if k % 16 == 0 else 8
  assert [(o.op, o.arg) for o in applied] == [(L, lanes)], applied
  _close(got, want, f"({n}, {k})")
  _close(got, (x.numpy() @ w.numpy().T).reshape(-1), f"({n}, {k}) against NumPy")

@pytest.mark.parametrize("seed", range(3))
def test_nibble_matvec_gets_lanes_and_matches(seed):
  rng = np.random.default_rng(10 + seed)
  rows, blocks = int(rng.integers(5, 40)), int(rng.integers(1, 6))
  packed, scale, low = _nibble_rows(rng, rows, blocks)
  x = Tensor(rng.standard_normal((1, blocks * 32)).astype(np.float32)).realize()
  applied, got, want, kernel = _optimized_and_plain(_dequantized_product(x, packed, scale, low))
  assert [o.op for o in applied] == [L] and applied[0].arg == 16, applied
  assert find_parallel_loop(linearize(kernel.sink)) is not None, "threads must be able to split the output rows"
  _close(got, want, f"rows {rows}, blocks {blocks}")

def test_two_fused_products_each_get_lanes():
  """The LLM's feed-forward: silu(x @ gate.T) * (x @ up.T) in one kernel, two reductions with their own loops."""
  rng = np.random.default_rng(20)
  x = Tensor(rng.standard_normal((1, 64)).astype(np.float32)).realize()
  gate, up = _nibble_rows(rng, 24, 2), _nibble_rows(rng, 24, 2)
  t = _dequantized_product(x, *gate).silu() * _dequantized_product(x, *up)
  applied, got, want, _ = _optimized_and_plain(t)
  assert [o.op for o in applied] == [L, L], applied
  _close(got, want, "gate/up")

@pytest.mark.parametrize("build", [
  lambda: Tensor.empty(64, 64) @ Tensor.empty(64, 64),          # matmul: each load reused along an output axis
  lambda: Tensor.empty(64, 64).sum(axis=1),                    # a row sum: nothing reused
  lambda: Tensor.empty(1, 64) @ Tensor.empty(64, 96),           # x @ W: the reduce axis is strided in W
  lambda: Tensor.empty(1, 36) @ Tensor.empty(20, 36).T,         # 8 does not divide the reduce axis
  lambda: (Tensor.empty(1, 64) * Tensor.empty(16, 64)).max(1),  # not a sum
])
def test_other_kernels_are_not_matrix_vector(build):
  kernel = Kernel(lower_kernel(create_schedule([build().uop]).items[-1].ast))
  loads, _ = memory_accesses(kernel.sink)
  strides = {rng: [axis_stride(ld.src[1], rng) for ld in loads] for rng in kernel.axes}
  assert _matrix_vector(kernel, loads, kernel.output_axes, strides) is None
  assert kernel.applied == []
