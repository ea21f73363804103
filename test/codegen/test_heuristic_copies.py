"""The heuristics' loop order for copies that read their source in column strips (kiln/codegen/opt/heuristic.py
`_block_row_reads`): a packed matmul operand's copy (K, N) -> (N/16, K, 16) reads COPY_BLOCK_ROWS rows strip by strip,
on AVX-512 and AVX2 targets alike; copies whose rows are short or that read rows in order keep their loops; the values
are NumPy's."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, OptOps, heuristic_opts
from kiln.codegen.opt.heuristic import COPY_BLOCK_ROWS
from kiln.runtime.cpu_target import CPUTarget
from kernel_runs import last_kernel_item, run_lowered

AVX2_EPYC = CPUTarget("x86_64", "avx2", 32, 16, 32 << 10, 2 << 20, 32 << 20, 2)
AVX512_XEON = CPUTarget("x86_64", "avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20, 2)

def _strips(rows: int, cols: int, run: int = 16) -> tuple[np.ndarray, Tensor]:
  """A (rows, cols) matrix and its copy laid out as (cols/run, rows, run): the pack of a matmul's `b`."""
  b = np.random.default_rng(rows + cols).standard_normal((rows, cols), dtype=np.float32)
  return b, Tensor(b).reshape(rows, cols // run, run).permute(1, 0, 2).contiguous()

@pytest.mark.parametrize("target", [AVX512_XEON, AVX2_EPYC, None], ids=["avx512", "avx2", "baseline"])
@pytest.mark.parametrize("rows,cols", [(1024, 1024), (256, 2048)])
def test_strip_copy_reads_blocks_of_rows(target, rows, cols):
  """Rows 4 KiB or more apart: the rows are split into blocks of COPY_BLOCK_ROWS outside the strips; same values."""
  b, packed = _strips(rows, cols)
  item = last_kernel_item(packed)
  kernel = Kernel(lower_kernel(item.ast))
  applied = heuristic_opts(kernel, target)
  kinds = [opt.op for opt in applied]
  assert OptOps.SPLIT in kinds and OptOps.SWAP in kinds, f"{rows}x{cols}: {applied}"
  assert any(opt.op is OptOps.SPLIT and opt.arg == COPY_BLOCK_ROWS for opt in applied), applied
  # the blocks of rows are the outermost loop (split across threads), the strips inside them
  assert Kernel.size(kernel.output_axes[0]) == rows // COPY_BLOCK_ROWS, [Kernel.size(r) for r in kernel.output_axes]
  got = run_lowered(item, kernel.sink, "strip_copy_test")
  np.testing.assert_array_equal(got.reshape(cols // 16, rows, 16), b.reshape(rows, cols // 16, 16).transpose(1, 0, 2))

@pytest.mark.parametrize("rows,cols", [(1024, 256), (48, 1024), (1000, 1024)])
def test_short_or_few_rows_keep_their_order(rows, cols):
  """Rows under 4 KiB apart, fewer than two blocks of rows, or a count the block does not divide: no blocking."""
  b, packed = _strips(rows, cols)
  item = last_kernel_item(packed)
  kernel = Kernel(lower_kernel(item.ast))
  applied = heuristic_opts(kernel, AVX512_XEON)
  assert not any(opt.op in (OptOps.SPLIT, OptOps.SWAP) for opt in applied), f"{rows}x{cols}: {applied}"
  np.testing.assert_array_equal(packed.numpy(), b.reshape(rows, cols // 16, 16).transpose(1, 0, 2))

def test_row_order_copy_and_packed_matmul_unchanged():
  """A copy that reads its rows in order (a transpose's other side: the loads move by one along the inner loop)
  gets no blocking, and a packed 1024 matmul, whose `b` pack is blocked, still matches NumPy."""
  rng = np.random.default_rng(3)
  a_np, b_np = rng.standard_normal((1024, 1024), dtype=np.float32), rng.standard_normal((1024, 1024), dtype=np.float32)
  item = last_kernel_item(Tensor(a_np).reshape(128, 8, 1024).permute(0, 2, 1).contiguous())   # `a`'s pack
  applied = heuristic_opts(Kernel(lower_kernel(item.ast)), AVX512_XEON)
  assert not any(opt.op in (OptOps.SPLIT, OptOps.SWAP) for opt in applied), applied
  got = (Tensor(a_np) @ Tensor(b_np)).numpy()
  want = a_np @ b_np
  assert np.abs(got - want).max() <= 1e-3 * 32, f"1024^3 matmul: worst difference {np.abs(got - want).max()}"

@pytest.mark.parametrize("target, lanes", [(AVX512_XEON, 16), (AVX2_EPYC, 8), (None, 8)], ids=["avx512", "avx2", "baseline"])
def test_software_math_elementwise_gets_one_register_of_lanes(target, lanes):
  """An elementwise kernel of software math (a GELU's tanh over a matmul's output) is upcast by the target's float
  lanes (one AVX-512 register: 16), 8 elsewhere; a plain elementwise kernel keeps 8; the values are NumPy's."""
  x_np = np.random.default_rng(4).standard_normal((64, 256), dtype=np.float32)
  gelu = lambda v: 0.5 * v * (1 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())
  item = last_kernel_item(gelu(Tensor(x_np)))
  kernel = Kernel(lower_kernel(item.ast))
  applied = heuristic_opts(kernel, target)
  assert [(o.op, o.arg) for o in applied] == [(OptOps.UPCAST, lanes)], applied
  want = 0.5 * x_np * (1 + np.tanh(0.7978845608 * (x_np + 0.044715 * x_np ** 3)))
  np.testing.assert_allclose(run_lowered(item, kernel.sink, "gelu_lanes_test").reshape(64, 256), want, atol=1e-5)
  plain = Kernel(lower_kernel(last_kernel_item(Tensor(x_np) * 2 + 1).ast))
  assert [(o.op, o.arg) for o in heuristic_opts(plain, target)] == [(OptOps.UPCAST, 8)]
