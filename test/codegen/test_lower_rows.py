"""Short output rows merged in lowering (kiln/codegen/lowerer.py `lower_kernel`) and the tile choices that follow from
it (kiln/codegen/opt/heuristic.py): a reduction whose last output axis no vector divides gets one loop over its last
two axes where every index reads them as one position; results unchanged against PyTorch."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from kiln import Tensor, Context
from kiln.schedule.kernelize import create_schedule
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps, KernelOptError, heuristic_opts
from kiln.runtime.cpu_target import CPUTarget

AVX512_XEON = CPUTarget("x86_64", "avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20, 2)
RNG = np.random.default_rng(11)

def _output_loops(t: Tensor) -> list[int]:
  """The sizes of the output loops of `t`'s last kernel as lowered."""
  kernel = Kernel(lower_kernel(create_schedule([t.uop]).items[-1].ast))
  return [Kernel.size(r) for r in kernel.output_axes]

def _array(*shape: int) -> np.ndarray: return RNG.standard_normal(shape, dtype=np.float32)

def test_a_1x1_conv_with_its_bias_runs_over_the_flattened_image():
  x, w, b = _array(2, 24, 7, 7), _array(32, 24, 1, 1), _array(32)
  out = (Tensor(x).conv2d(Tensor(w), Tensor(b))).relu()
  assert _output_loops(out)[-1] == 49   # one loop of 49 positions, not 7 rows of 7
  want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b)).relu().numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)

def test_a_padded_3x3_conv_keeps_its_rows():
  x, w = _array(1, 8, 7, 7), _array(16, 8, 3, 3)
  out = Tensor(x).conv2d(Tensor(w), padding=1)
  assert _output_loops(out)[-2:] == [7, 7]   # its windows read rows and columns apart
  want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("shape, axis", [((5, 7, 6), 2), ((3, 5, 7, 4), 1), ((4, 14, 9), 2)])
def test_merged_reductions_match_numpy(shape, axis):
  a = _array(*shape)
  out = Tensor(a).sum(axis=axis) * 2 + Tensor(a).max(axis=axis)
  np.testing.assert_allclose(out.numpy(), a.sum(axis=axis) * 2 + a.max(axis=axis), rtol=1e-5, atol=1e-5)

def test_few_rows_over_a_wide_image_put_the_columns_outside():
  # 64x256 weights over 256x3136 positions: all of `a` (64 KiB) stays in L2 while each column panel serves every row
  out = Tensor.empty(1, 256, 56, 56, device="CPU").conv2d(Tensor.empty(64, 256, 1, 1, device="CPU"))
  kernel = Kernel(lower_kernel(create_schedule([out.uop]).items[-1].ast))
  assert Opt(OptOps.SWAP, 0, 1) in heuristic_opts(kernel, AVX512_XEON)

def test_a_weight_gradient_over_small_images_puts_the_columns_outside():
  # 256x256x3x3 over 4 images of 14x14: the output gradient (800 KiB) stays in L2 under each panel of the windows
  # (on the CPU, whose scheduler packs the windows: the tile choices below are the CPU's)
  x, w = Tensor.empty(4, 256, 14, 14, device="CPU"), Tensor.empty(256, 256, 3, 3, requires_grad=True, device="CPU")
  (x.conv2d(w, padding=1) * Tensor.empty(4, 256, 14, 14, device="CPU")).sum().backward()
  kernel = Kernel(lower_kernel(create_schedule([w.grad.uop]).items[-1].ast))
  assert heuristic_opts(kernel, AVX512_XEON)[-1] == Opt(OptOps.SWAP, 0, 1)

def test_a_bias_does_not_make_the_channels_the_vector_axis():
  # 49 positions (8 does not divide them); the bias is contiguous along the channels but is no operand of the sum
  out = Tensor.empty(1, 512, 7, 7, device="CPU").conv2d(Tensor.empty(2048, 512, 1, 1, device="CPU"),
                                                         Tensor.empty(2048, device="CPU"))
  kernel = Kernel(lower_kernel(create_schedule([out.uop]).items[-1].ast))
  assert heuristic_opts(kernel, AVX512_XEON)[0] == Opt(OptOps.UPCAST, 1, 32)

def test_a_long_odd_row_is_upcast_by_its_largest_divisor():
  # a max pool's padded input (114 wide): 57 lanes, so a ReLU's selects are vector blends, not branches
  x = _array(1, 4, 112, 112)
  out = Tensor(x).relu().pad((1, 1, 1, 1), value=float("-inf"))
  kernel = Kernel(lower_kernel(create_schedule([out.uop]).items[-1].ast))
  assert heuristic_opts(kernel, AVX512_XEON) == [Opt(OptOps.UPCAST, 2, 57)]
  np.testing.assert_array_equal(out.numpy(), np.pad(np.maximum(x, 0), ((0, 0), (0, 0), (1, 1), (1, 1)),
                                                     constant_values=-np.inf))

@pytest.mark.parametrize("n, cin, cout, size, stride", [(2, 2048, 512, 7, 1), (4, 512, 2048, 7, 1), (4, 1024, 2048, 14, 2),
                                                        (1, 2048, 512, 7, 1), (2, 256, 1024, 14, 1)])
def test_1x1_convs_whose_sums_are_blocked_match_torch(n, cin, cout, size, stride):
  # 49 positions in overlapping vector tiles, the sum over input channels blocked through the output (KBLOCK): the
  # overlapped positions once added every block's sum twice (ResNet-50's layer 4: a 0.6-0.8 relative error)
  x, w = _array(n, cin, size, size), _array(cout, cin, 1, 1) / np.float32(np.sqrt(cin))
  got = Tensor(x).conv2d(Tensor(w), stride=stride).numpy()
  want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), stride=stride).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

def test_an_overlapping_tile_refuses_to_accumulate_through_the_output():
  kernel = Kernel(lower_kernel(create_schedule([(Tensor.empty(64, 512, device="CPU") @
                                                 Tensor.empty(512, 49, device="CPU")).uop]).items[-1].ast))
  kernel.apply(Opt(OptOps.UPCAST, 1, 16))   # 49 columns: the last tile of 16 overlaps the one before it
  with pytest.raises(KernelOptError, match="overlaps"): kernel.apply(Opt(OptOps.KBLOCK, 2, 128))

def test_a_dequantize_is_upcast_by_its_index_period():
  # 4-bit weights, 16 bytes a block of 32 (low nibbles then high): upcast by the block (or two), each lane's byte
  # and shift fold to constants and its loads are vectors (an LLM prefill's dequantize 1.10 -> 0.15 ms)
  q = RNG.integers(0, 256, (24, 36, 16), dtype=np.uint8)
  scale = RNG.standard_normal((24, 36, 1), dtype=np.float32)
  t = Tensor(q, device="CPU")
  out = ((t & 15).cat(t >> 4, dim=-1).float() * Tensor(scale, device="CPU")).reshape(24, 36 * 32)
  kernel = Kernel(lower_kernel(create_schedule([out.uop]).items[-1].ast))
  opts = heuristic_opts(kernel, AVX512_XEON)
  assert opts and opts[0].op is OptOps.UPCAST and opts[0].arg >= 32, opts
  want = (np.concatenate([q & 15, q >> 4], axis=-1).astype(np.float32) * scale).reshape(24, 36 * 32)
  np.testing.assert_array_equal(out.numpy(), want)

def _loops_and_store(index_of_loops, sizes=(48, 20)):
  from kiln.dtype import dtypes
  from kiln.uop.ops import UOp, Ops
  ranges = [UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), arg=i) for i, n in enumerate(sizes)]
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  store = UOp(Ops.STORE, dtypes.void, (out, index_of_loops(*ranges), UOp.const(dtypes.float32, 1.0)))
  return [out, *ranges, store] + [UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(ranges)]

def test_columns_outside_rows_still_split_across_threads():
  from kiln.codegen.parallel import find_parallel_loop
  # iteration i stores columns 32i..32i+31 of each of 20 rows of 1536: disjoint blocks repeating every row
  assert find_parallel_loop(_loops_and_store(lambda c, r: c * 32 + r * 1536)) is not None
  assert find_parallel_loop(_loops_and_store(lambda c, r: c * 32 + r * 12288 + 5)) is not None
  # rows 1000 apart (not a whole number of 48 x 32 periods): iterations could meet, so it stays on one thread
  assert find_parallel_loop(_loops_and_store(lambda c, r: c * 32 + r * 1000)) is None
  # a row offset wider than the stride (2 per row: up to 38) reaches into the next iteration's columns
  assert find_parallel_loop(_loops_and_store(lambda c, r: c * 32 + r * 1536 + r * 2)) is None
  assert find_parallel_loop(_loops_and_store(lambda c, r: c * 32 + r * 1536 + r)) is not None   # (up to 19: fits)

def test_a_matmul_with_its_columns_outside_matches_numpy_on_threads():
  a, b = _array(160, 576), _array(576, 1536)
  with Context(THREADS=2): got = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)
