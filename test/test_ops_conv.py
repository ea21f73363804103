"""Convolutions, pooling and interpolation against PyTorch: forward values and dtypes, input and weight gradients."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, Device, dtypes
from kiln.helpers import prod
from kiln.uop.ops import Ops, toposort
from helpers import check, assert_close

# ---------------------------------------------------------------------------------------------------------------------
# conv2d (and 1d/3d through the same code)

def _torch_conv(x, w, b=None, groups=1, stride=1, dilation=1, padding=0):
  """F.convNd with kiln's padding forms: a flat 2*dims tuple (PyTorch pad order) is applied by F.pad first."""
  dims = w.ndim - 2
  if isinstance(padding, tuple) and len(padding) == 2 * dims: x, padding = F.pad(x, padding), 0
  conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
  return conv(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

CONV_CASES = [
  # input shape, weight shape, keyword arguments
  ((1, 1, 5, 5), (1, 1, 3, 3), {}),                                         # batch 1, one channel
  ((2, 3, 7, 5), (4, 3, 3, 2), {"stride": 2}),                              # odd sizes, rectangular kernel
  ((2, 3, 4, 3), (2, 3, 1, 1), {}),                                         # 1x1 kernel
  ((1, 2, 7, 8), (3, 2, 2, 2), {"stride": 3}),                              # stride > kernel
  ((1, 2, 6, 7), (2, 2, 3, 2), {"dilation": 2, "padding": 1}),              # dilation 2
  ((1, 2, 6, 5), (2, 2, 3, 3), {"dilation": (2, 1), "stride": (1, 2)}),     # per-dim dilation and stride
  ((2, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "padding": 1}),                # groups 2
  ((2, 3, 5, 4), (3, 1, 3, 3), {"groups": 3, "padding": (1, 0)}),           # depthwise, per-dim padding
  ((1, 2, 4, 5), (2, 2, 3, 3), {"padding": (1, 0, 2, 1)}),                  # asymmetric flat padding (l, r, t, b)
  ((1, 1, 3, 3), (1, 1, 3, 3), {"padding": 2, "stride": 2}),                # padding bigger than half the kernel
  ((2, 4, 9, 8), (6, 2, 3, 3), {"groups": 2, "stride": 2, "padding": 1}),   # strided groups (phases per group)
  ((1, 3, 11, 10), (2, 3, 5, 4), {"stride": (3, 2), "padding": (2, 1)}),    # kernel longer than the strides
  ((2, 4, 7, 6), (6, 4, 1, 1), {"stride": 2}),                              # 1x1 strided: input subsampled first
  ((1, 4, 9, 8), (4, 2, 1, 1), {"stride": (3, 2), "padding": 1, "groups": 2}),
  ((1, 2, 1, 100), (3, 2, 1, 20), {"stride": (1, 16)}),                    # 16 phases: one masked conv of them all
]

@pytest.mark.parametrize("xs, ws, kw", CONV_CASES)
def test_conv2d(xs, ws, kw):
  check(lambda x, w: x.conv2d(w, **kw), lambda x, w: _torch_conv(x, w, **kw), [xs, ws])

@pytest.mark.parametrize("xs, ws, kw", [
  ((4, 128, 28, 28), (128, 128, 3, 3), {"padding": 1}),   # weight gradient: 16 output channels a tile on AVX-512
  ((2, 64, 7, 7), (32, 64, 1, 1), {}),                    # 1x1 input gradient: 32 input channels a tile on AVX-512
])
def test_conv2d_gradients_with_wide_register_tiles(xs, ws, kw):
  # shapes whose gradients take the tiles of kiln/codegen/opt/heuristic.py that follow the target's registers
  # a weight gradient sums 3136 products: float32 rounding in another order (a GPU's tiles) moves small sums by ~1e-4
  check(lambda x, w: x.conv2d(w, **kw), lambda x, w: _torch_conv(x, w, **kw), [xs, ws], atol=1e-3, rtol=1e-4)

def test_strided_1x1_conv_sums_only_the_real_taps():
  # subsampled, a 1x1 stride-2 conv sums C_in products per output (phases would pad its kernel to 2x2: 4x as many)
  x, w = Tensor.empty(2, 8, 14, 14), Tensor.empty(16, 8, 1, 1)
  sums = [u for u in toposort([x.conv2d(w, stride=2).uop]) if u.op is Ops.REDUCE_AXIS]
  assert sums and all(prod(u.src[0].shape) == 2 * 16 * 7 * 7 * 8 for u in sums)

def test_strided_3x3_conv_sums_each_real_tap_once():
  # a 3x3 stride-2 conv is the sum of its input phases' stride-1 convs with 2x2, 2x1, 1x2 and 1x1 taps: 9 products
  # per channel and output, none padded or masked (one conv of all phases would make 16)
  x, w = Tensor.empty(2, 8, 14, 14), Tensor.empty(16, 8, 3, 3)
  sums = [u for u in toposort([x.conv2d(w, stride=2, padding=1).uop]) if u.op is Ops.REDUCE_AXIS]
  assert sorted(prod(u.src[0].shape) // prod(u.shape) for u in sums) == [8, 16, 16, 32]

def test_strided_3x3_conv_weight_gradient_sums_each_real_tap_once():
  # its weight gradient is, per input phase, the stride-1 weight gradient of that phase's real taps (2x2, 2x1, 1x2
  # and 1x1): 9 products per weight and output position in all, none padded (one of all phases would make 16)
  x, w = Tensor.empty(2, 8, 14, 14), Tensor.empty(16, 8, 3, 3).requires_grad_()
  x.conv2d(w, stride=2, padding=1).sum().backward()
  sums = [u for u in toposort([w.grad.uop]) if u.op is Ops.REDUCE_AXIS]
  assert sorted(prod(u.shape) for u in sums) == [16 * 8, 16 * 8 * 2, 16 * 8 * 2, 16 * 8 * 4]
  assert all(prod(u.src[0].shape) // prod(u.shape) == 2 * 7 * 7 for u in sums)   # the real output positions only

def test_strided_conv_of_inf_is_inf_only_where_a_real_tap_reads_it():
  x = np.random.default_rng(5).uniform(0.5, 1, (1, 2, 9, 9)).astype(np.float32)
  x[0, 1, 4, 3] = np.inf
  w = np.random.default_rng(6).uniform(0.5, 1, (3, 2, 3, 3)).astype(np.float32)
  got = Tensor(x).conv2d(Tensor(w), stride=2, padding=1).numpy()
  want = F.conv2d(torch.tensor(x), torch.tensor(w), stride=2, padding=1).numpy()
  assert not np.isnan(got).any() and np.array_equal(np.isinf(got), np.isinf(want)) and np.isinf(got).any()
  assert_close(np.where(np.isinf(got), 0, got), np.where(np.isinf(want), 0, want), "strided conv of inf", atol=1e-5)

def test_conv2d_bias_and_noncontiguous_input():
  # the input is a transposed view; bias gradients checked too
  check(lambda x, w, b: x.transpose(2, 3).conv2d(w, b, padding=1),
        lambda x, w, b: F.conv2d(x.transpose(2, 3), w, b, padding=1), [(2, 2, 5, 4), (3, 2, 2, 3), (3,)])
  check(lambda x, w: x.flip(3).conv2d(w), lambda x, w: F.conv2d(x.flip(3), w), [(1, 1, 4, 4), (2, 1, 2, 2)])

@pytest.mark.parametrize("xs, ws, kw", [
  ((2, 3, 9), (4, 3, 3), {"stride": 2, "padding": 1}),
  ((1, 4, 7), (4, 2, 2), {"groups": 2, "dilation": 3}),
  ((1, 2, 6), (1, 2, 3), {"padding": (2, 0)}),                                # flat (left, right) for 1d
  ((1, 2, 4, 5, 3), (3, 2, 2, 3, 2), {"padding": (1, 0, 1), "stride": (1, 2, 1)}),
  ((1, 2, 4, 4, 4), (2, 1, 2, 2, 2), {"groups": 2, "dilation": 2})])
def test_conv_1d_3d(xs, ws, kw):
  check(lambda x, w: x.conv2d(w, **kw), lambda x, w: _torch_conv(x, w, **kw), [xs, ws])

def test_conv2d_float16_forward():
  check(lambda x, w: x.conv2d(w, padding=1), lambda x, w: F.conv2d(x.float(), w.float(), padding=1).half(),
        [(1, 2, 5, 5), (3, 2, 3, 3)], dtype="float16", grad=False, atol=2e-2, rtol=1e-2)

def test_conv2d_bfloat16_and_int32():
  rng = np.random.default_rng(4)
  x, w = rng.uniform(-2, 2, (1, 2, 5, 5)).astype(np.float32), rng.uniform(-2, 2, (2, 2, 3, 3)).astype(np.float32)
  out = Tensor(x).bfloat16().conv2d(Tensor(w).bfloat16(), stride=2)
  want = F.conv2d(torch.tensor(x).bfloat16().float(), torch.tensor(w).bfloat16().float(), stride=2)
  assert out.dtype == dtypes.bfloat16
  assert_close(out.float().numpy(), want.numpy(), "bfloat16 conv2d", atol=5e-2, rtol=2e-2)
  x, w = rng.integers(-5, 5, (2, 2, 4, 5)).astype(np.int32), rng.integers(-5, 5, (3, 2, 2, 3)).astype(np.int32)
  out = Tensor(x).conv2d(Tensor(w), padding=1)
  assert out.dtype == dtypes.int32
  want = F.conv2d(torch.tensor(x).double(), torch.tensor(w).double(), padding=1).int()
  assert_close(out.numpy(), want.numpy(), "int32 conv2d")

def test_conv2d_accumulation_dtype():
  x, w = Tensor.ones(1, 1, 3, 3, dtype=dtypes.float16), Tensor.ones(1, 1, 2, 2, dtype=dtypes.float16)
  out = x.conv2d(w, dtype=dtypes.float32)
  assert out.dtype == dtypes.float32 and out.tolist() == [[[[4.0, 4.0], [4.0, 4.0]]]]

def test_conv2d_empty_batch():
  out = Tensor.ones(0, 2, 4, 4).conv2d(Tensor.ones(3, 2, 3, 3))
  assert out.shape == (0, 3, 2, 2) and out.numpy().shape == (0, 3, 2, 2)

def test_conv2d_python_device():
  check(lambda x, w, b: x.conv2d(w, b, stride=2, padding=1), lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        [(1, 2, 3, 3), (2, 2, 2, 2), (2,)], device="PYTHON")

def test_conv2d_is_lazy_and_one_kernel():
  x, w = Tensor.ones(1, 2, 5, 5), Tensor.ones(3, 2, 3, 3)
  assert len(x.conv2d(w, padding=1).schedule()) == 1

def test_conv2d_errors():
  x, w = Tensor.ones(1, 4, 5, 5), Tensor.ones(2, 3, 3, 3)
  with pytest.raises(ValueError, match=r"conv2d: input \(1, 4, 5, 5\) has 4 channels but weight \(2, 3, 3, 3\)"):
    x.conv2d(w)
  with pytest.raises(ValueError, match="conv2d: .*not divisible by groups=2"):
    Tensor.ones(1, 4, 5, 5).conv2d(Tensor.ones(3, 2, 3, 3), groups=2)
  with pytest.raises(ValueError, match="conv2d: .*same number of dims"):
    Tensor.ones(4, 5, 5).conv2d(Tensor.ones(2, 4, 3, 3))
  with pytest.raises(ValueError, match="conv2d: kernel .* larger than the padded input"):
    Tensor.ones(1, 1, 2, 2).conv2d(Tensor.ones(1, 1, 3, 3))
  x1, w1 = Tensor.ones(1, 1, 4, 4), Tensor.ones(1, 1, 2, 2)
  with pytest.raises(ValueError, match="conv2d: padding must be"): x1.conv2d(w1, padding=(1, 2, 3))
  with pytest.raises(ValueError, match="conv2d: stride must be at least 1"): x1.conv2d(w1, stride=0)
  with pytest.raises(ValueError, match="conv2d: dilation must be an int or a sequence of 2"):
    x1.conv2d(w1, dilation=(1,))
  with pytest.raises(ValueError, match="conv2d: negative padding"): x1.conv2d(w1, padding=-1)
  with pytest.raises(ValueError, match=r"conv2d: bias must have shape \(2,\)"):
    Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(2, 1, 2, 2), Tensor.ones(3))
  with pytest.raises(ValueError, match="groups must be a positive int"): x1.conv2d(w1, groups=0)
  with pytest.raises(ValueError, match=r"test_ops_conv.py:\d+"): x.conv2d(w)   # the error points at the user's line
  with pytest.raises(RuntimeError, match=f"conv2d: input on {Device.DEFAULT} but weight on PYTHON"):
    Tensor.ones(1, 1, 3, 3).conv2d(Tensor.ones(1, 1, 2, 2, device="PYTHON"))
  with pytest.raises(TypeError, match="conv2d: weight must be a Tensor"): Tensor.ones(1, 1, 3, 3).conv2d([[1.0]])

# ---------------------------------------------------------------------------------------------------------------------
# conv_transpose2d

def _torch_conv_transpose(x, w, b=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0):
  conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[w.ndim - 2]
  return conv(x, w, b, stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)

@pytest.mark.parametrize("xs, ws, kw", [
  ((1, 1, 3, 3), (1, 2, 3, 3), {}),
  ((2, 2, 3, 4), (2, 3, 3, 2), {"stride": 2, "padding": 1}),
  ((1, 2, 3, 3), (2, 1, 3, 3), {"stride": 2, "output_padding": 1, "padding": (1, 2)}),
  ((1, 2, 4, 3), (2, 2, 2, 3), {"dilation": 2, "padding": 1, "stride": (1, 3)}),
  ((1, 4, 3, 3), (4, 1, 3, 2), {"groups": 2, "stride": 2}),
  ((1, 2, 5, 4), (2, 2, 1, 1), {"stride": 3}),                                 # stride > kernel
  ((2, 3, 5), (3, 2, 3), {"stride": 2, "padding": 2, "output_padding": 1}),    # 1d
  ((1, 2, 2, 3, 2), (2, 1, 2, 2, 3), {"stride": (2, 1, 2), "padding": 1})])    # 3d
def test_conv_transpose(xs, ws, kw):
  check(lambda x, w: x.conv_transpose2d(w, **kw), lambda x, w: _torch_conv_transpose(x, w, **kw), [xs, ws])

def test_strided_conv_transpose_multiplies_no_stuffed_zeros():
  # by output phase: a stride-1 conv of the input with that phase's taps of the 3x3 kernel (4, 2, 2 and 1), not one
  # conv of 9 taps over the input with zeros stuffed between its elements
  x, w = Tensor.empty(1, 2, 8, 8), Tensor.empty(2, 3, 3, 3)
  sums = [u for u in toposort([x.conv_transpose2d(w, stride=2, padding=1).uop]) if u.op is Ops.REDUCE_AXIS]
  assert sorted(prod(u.src[0].shape) // prod(u.shape) for u in sums) == [2, 4, 4, 8]

def test_conv_transpose2d_bias():
  check(lambda x, w, b: x.conv_transpose2d(w, b, stride=2), lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2),
        [(1, 2, 2, 3), (2, 3, 2, 2), (3,)])

def test_conv_transpose2d_errors():
  x = Tensor.ones(1, 2, 3, 3)
  with pytest.raises(ValueError, match=r"conv_transpose2d: input \(1, 2, 3, 3\) has 2 channels but weight \(3, 1, 3"):
    x.conv_transpose2d(Tensor.ones(3, 1, 3, 3))
  with pytest.raises(ValueError, match="conv_transpose2d: output_padding"):
    x.conv_transpose2d(Tensor.ones(2, 1, 3, 3), stride=2, output_padding=2)
  with pytest.raises(ValueError, match="conv_transpose2d: .*output size"):
    Tensor.ones(1, 1, 1, 1).conv_transpose2d(Tensor.ones(1, 1, 1, 1), padding=1)

# ---------------------------------------------------------------------------------------------------------------------
# pooling

POOL_CASES = [
  # input shape, keyword arguments (torch's names)
  ((1, 1, 4, 4), {"kernel_size": (2, 2)}),
  ((2, 3, 5, 7), {"kernel_size": (3, 2), "stride": (2, 3)}),                   # odd sizes, windows that don't tile
  ((1, 2, 5, 5), {"kernel_size": 3, "stride": 1, "padding": 1}),               # overlapping windows, padding
  ((1, 1, 7, 6), {"kernel_size": 2, "stride": 3}),                             # stride > kernel
  ((1, 1, 5, 5), {"kernel_size": (1, 1), "stride": 2}),                        # kernel 1
  ((1, 2, 5, 6), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
  ((1, 1, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
  ((1, 1, 5, 5), {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True}),   # last window would start in pad
]

@pytest.mark.parametrize("shape, kw", POOL_CASES)
@pytest.mark.parametrize("include_pad", [True, False])
def test_avg_pool2d(shape, kw, include_pad):
  check(lambda x: x.avg_pool2d(**kw, count_include_pad=include_pad),
        lambda x: F.avg_pool2d(x, **kw, count_include_pad=include_pad), [shape])

@pytest.mark.parametrize("shape, kw", POOL_CASES + [
  ((1, 2, 7, 7), {"kernel_size": 3, "dilation": 2, "padding": 1}),
  ((1, 1, 6, 7), {"kernel_size": 2, "dilation": (2, 1), "ceil_mode": True})])
def test_max_pool2d(shape, kw):
  check(lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), [shape])

def test_pool_1d_3d_and_noncontiguous():
  check(lambda x: x.avg_pool2d((3,), stride=2, padding=1), lambda x: F.avg_pool1d(x, 3, 2, 1), [(2, 2, 7)])
  check(lambda x: x.max_pool2d((2,), stride=1), lambda x: F.max_pool1d(x, 2, 1), [(1, 2, 5)])
  check(lambda x: x.max_pool2d((2, 2, 2)), lambda x: F.max_pool3d(x, 2), [(1, 2, 4, 5, 4)])
  check(lambda x: x.avg_pool2d((2, 1, 2), padding=(1, 0, 1), count_include_pad=False),
        lambda x: F.avg_pool3d(x, (2, 1, 2), padding=(1, 0, 1), count_include_pad=False), [(1, 1, 3, 3, 4)])
  check(lambda x: x.transpose(2, 3).max_pool2d(), lambda x: F.max_pool2d(x.transpose(2, 3), 2), [(1, 2, 4, 6)])

def test_pool_asymmetric_padding():
  # kiln (like tinygrad) accepts 2*dims paddings in PyTorch's flat order; torch needs an explicit F.pad
  check(lambda x: x.avg_pool2d(3, stride=2, padding=(1, 0, 0, 2)),
        lambda x: F.avg_pool2d(F.pad(x, (1, 0, 0, 2)), 3, stride=2), [(1, 2, 5, 6)])
  check(lambda x: x.max_pool2d(2, padding=(0, 1, 1, 0)),
        lambda x: F.max_pool2d(F.pad(x, (0, 1, 1, 0), value=-np.inf), 2), [(1, 1, 5, 5)])

def test_pool_dtypes_and_python_device():
  check(lambda x: x.max_pool2d(), lambda x: F.max_pool2d(x.float(), 2).half(), [(1, 2, 4, 4)], "float16", grad=False)
  check(lambda x: x.avg_pool2d(), lambda x: F.avg_pool2d(x.float(), 2).half(), [(1, 2, 4, 4)], "float16", grad=False)
  x = np.random.default_rng(0).integers(-50, 50, (1, 2, 5, 5)).astype(np.int32)
  assert_close(Tensor(x).max_pool2d(3, stride=2, padding=1).numpy(),
               F.max_pool2d(torch.tensor(x).float(), 3, stride=2, padding=1).int().numpy(), "int32 max_pool2d")
  check(lambda x: x.avg_pool2d(2, padding=1, count_include_pad=False),
        lambda x: F.avg_pool2d(x, 2, padding=1, count_include_pad=False), [(1, 1, 3, 3)], device="PYTHON")

@pytest.mark.parametrize("shape, kw", [
  ((2, 3, 4, 6), {"kernel_size": 2}), ((1, 2, 5, 5), {"kernel_size": 3, "stride": 2}),   # overlapping windows
  ((1, 1, 5, 4), {"kernel_size": 2, "stride": 1, "padding": 1}),
  ((1, 2, 5, 7), {"kernel_size": (2, 3), "stride": 2, "ceil_mode": True})])
def test_max_pool2d_indices_and_unpool(shape, kw):
  x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
  values, indices = Tensor(x).max_pool2d(**kw, return_indices=True)
  t_values, t_indices = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
  assert indices.dtype == dtypes.int32
  assert_close(values.numpy(), t_values.numpy(), "max_pool2d values")
  assert_close(indices.numpy(), t_indices.numpy().astype(np.int32), "max_pool2d indices")
  unpool_kw = {k: v for k, v in kw.items() if k != "ceil_mode"}
  out_size = shape[2:] if kw.get("ceil_mode") else None
  check(lambda v: v.max_unpool2d(indices, **unpool_kw, output_size=out_size),
        lambda v: F.max_unpool2d(v, t_indices, **unpool_kw, output_size=out_size), [values.numpy()])

def test_max_pool2d_indices_ties_pick_first():
  x = Tensor([[[[1.0, 1.0, 2.0], [0.0, 2.0, 2.0], [3.0, 3.0, 3.0]]]])
  _, indices = x.max_pool2d(2, stride=1, return_indices=True)
  _, t_indices = F.max_pool2d(torch.tensor(x.numpy()), 2, stride=1, return_indices=True)
  assert indices.tolist() == t_indices.tolist()

def test_max_unpool2d_1d_and_output_size():
  x = np.random.default_rng(2).standard_normal((2, 2, 7)).astype(np.float32)
  values, indices = Tensor(x).max_pool2d((2,), return_indices=True)
  t_values, t_indices = F.max_pool1d(torch.tensor(x), 2, return_indices=True)
  check(lambda v: v.max_unpool2d(indices, (2,), output_size=(2, 2, 7)),
        lambda v: F.max_unpool1d(v, t_indices, 2, output_size=(2, 2, 7)), [values.numpy()])

def test_pool_errors():
  x = Tensor.ones(1, 1, 4, 4)
  with pytest.raises(ValueError, match=r"max_pool2d: kernel \(5, 5\) .* larger than the padded input \(4, 4\)"):
    x.max_pool2d(5)
  with pytest.raises(ValueError, match="avg_pool2d: kernel_size must be"): x.avg_pool2d((2, "a"))
  with pytest.raises(ValueError, match="avg_pool2d: padding must be"): x.avg_pool2d(2, padding=(1, 1, 1))
  with pytest.raises(ValueError, match="max_pool2d: stride must be at least 1"): x.max_pool2d(2, stride=0)
  with pytest.raises(ValueError, match="max_pool2d: .*needs an input with at least 3 dims"):
    Tensor.ones(4, 4).max_pool2d((2, 2, 2))
  values, indices = x.max_pool2d(return_indices=True)
  with pytest.raises(ValueError, match=r"max_unpool2d: indices \(1, 1, 1, 2\) must have the input's shape"):
    values.max_unpool2d(indices[:, :, :1, :])
  with pytest.raises(ValueError, match="max_unpool2d: output_size"): values.max_unpool2d(indices, output_size=(4, 4, 4))

# ---------------------------------------------------------------------------------------------------------------------
# interpolate

@pytest.mark.parametrize("shape, size, mode, align", [
  ((1, 2, 5), (8,), "linear", False), ((1, 2, 5), (3,), "linear", True), ((1, 1, 4), (1,), "linear", True),
  ((1, 2, 3, 5), (7, 2), "bilinear", False), ((2, 1, 4, 3), (3, 7), "bilinear", True),
  ((1, 1, 2, 3, 4), (3, 5, 2), "trilinear", False),
  ((1, 2, 5), (8,), "nearest", None), ((1, 2, 7, 4), (3, 9), "nearest", None), ((1, 1, 3, 4), (6, 8), "nearest", None),
  ((1, 2, 5), (8,), "nearest-exact", None), ((1, 2, 7, 4), (3, 9), "nearest-exact", None),
  ((1, 1, 2, 3, 4), (3, 5, 2), "nearest", None), ((1, 1, 2, 3, 4), (3, 5, 2), "nearest-exact", None)])
def test_interpolate(shape, size, mode, align):
  kw = {} if align is None else {"align_corners": align}
  check(lambda x: x.interpolate(size, mode=mode, **kw), lambda x: F.interpolate(x, size=size, mode=mode, **kw), [shape])

@pytest.mark.parametrize("n_in", [3, 5, 7, 10, 13])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_interpolate_nearest_indices(n_in, mode):
  # the source index rules (floor(i*in/out) vs half-pixel centres), over many ratios, on one int tensor each
  x = torch.arange(n_in, dtype=torch.int32).reshape(1, 1, n_in)
  for n_out in range(1, 3 * n_in):
    want = F.interpolate(x.float(), size=(n_out,), mode=mode).int().numpy()
    assert_close(Tensor(x.numpy()).interpolate((n_out,), mode=mode).numpy(), want, f"{mode} {n_in}->{n_out}")

def test_interpolate_dtypes_and_leading_dims():
  check(lambda x: x.interpolate((4, 6), mode="linear"),
        lambda x: F.interpolate(x.float(), (4, 6), mode="bilinear").half(), [(1, 1, 3, 3)], "float16", grad=False)
  # tinygrad's form: any number of leading dims, size covers the trailing ones
  x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
  want = F.interpolate(torch.tensor(x)[None, None], (5, 2), mode="bilinear", align_corners=False)[0, 0].numpy()
  assert_close(Tensor(x).interpolate((5, 2)).numpy(), want, "2-d interpolate")
  assert Tensor([[1, 2], [3, 4]]).interpolate((2, 4), mode="nearest").tolist() == [[1, 1, 2, 2], [3, 3, 4, 4]]
  assert Tensor([[1, 2], [3, 4]]).interpolate((2, 4), mode="nearest").dtype == dtypes.int32
  check(lambda x: x.interpolate((3,)), lambda x: F.interpolate(x, (3,), mode="linear"), [(1, 1, 2)], device="PYTHON")

def test_interpolate_errors():
  x = Tensor.ones(1, 1, 4, 4)
  with pytest.raises(ValueError, match="interpolate: mode must be one of"): x.interpolate((2, 2), mode="bicubic")
  with pytest.raises(ValueError, match="interpolate: mode 'bilinear' resizes 2 axes"):
    x.interpolate((2,), mode="bilinear")
  with pytest.raises(ValueError, match="interpolate: align_corners only applies"):
    x.interpolate((2, 2), mode="nearest", align_corners=True)
  with pytest.raises(ValueError, match="interpolate: size must be"): x.interpolate((0, 2))
  with pytest.raises(ValueError, match="interpolate: size .* has more axes"): Tensor.ones(3).interpolate((2, 2))

def test_max_pool_gradient_by_phase_matches_torch_and_shares_ties():
  # the pool's gradient by input phase (mixin/conv.py _max_pool_backward): ResNet's 3x3 stride-2 pool, a pool whose
  # windows do not overlap, a rectangular one with ceil_mode; ties share the window's gradient (REDUCE MAX's rule)
  rng = np.random.default_rng(12)
  for shape, k, s, pad, ceil in (((2, 3, 9, 9), 3, 2, 1, False), ((1, 2, 8, 7), 2, 2, 0, False),
                                 ((1, 2, 7, 6), (3, 2), (2, 1), (1, 0), True)):
    x, = [rng.standard_normal(shape).astype(np.float32)]
    want_t = torch.tensor(x, requires_grad=True)
    out_t = F.max_pool2d(want_t, k, s, pad, ceil_mode=ceil)
    g = rng.standard_normal(out_t.shape).astype(np.float32)
    (out_t * torch.tensor(g)).sum().backward()
    got = Tensor(x, requires_grad=True)
    (got.max_pool2d(k, s, padding=pad, ceil_mode=ceil) * Tensor(g)).sum().backward()
    assert_close(got.grad.numpy(), want_t.grad.numpy(), f"max_pool2d grad {shape} k={k} s={s}", atol=1e-5)
  x = Tensor(np.ones((1, 1, 4, 4), np.float32), requires_grad=True)
  x.max_pool2d(2).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.full((1, 1, 4, 4), 0.25, np.float32))   # four tied maxima a window
