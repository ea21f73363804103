"""Convolutions and pools over symbolic spatial sizes (what ONNX vision models with a dynamic height and width need to
compile once for every size, kiln/frontend/onnx_symbolic.py). `_pool` extends an input of symbolic size to its
largest size and cuts the windows to the actual outputs (kiln/mixin/conv.py `_pool_symbolic`), so each kernel loops
over the actual outputs and serves every size of the Variables' ranges; a conv whose output rows are short runs at
their largest size and is cut after (`_small_symbolic_rows`). Each test runs two or more sizes, checks
every result against torch and that the later sizes compile nothing."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, Variable
from kiln.engine import realize

def compiles() -> int: return len(realize._runner_cache)

def sizes_of(x: Tensor, height: int, width: int, lo: int = 3) -> Tensor:
  """x's first `height` rows and `width` columns, both symbolic (bound Variables over [lo, x's size])."""
  h, w = Variable("h", lo, x.shape[2]).bind(height), Variable("w", lo, x.shape[3]).bind(width)
  return x[:, :, 0:h, 0:w]

def check_sizes(op_kiln, op_torch, shape=(2, 4, 14, 11), sizes=((7, 9), (10, 6), (14, 11)), lo: int = 3, seed=0):
  """op_kiln over symbolic (height, width) against op_torch per size; returns the kernels compiled per size."""
  x_np = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  x = Tensor(x_np).realize()
  counts = []
  for height, width in sizes:
    before = compiles()
    got = op_kiln(sizes_of(x, height, width, lo)).numpy()
    counts.append(compiles() - before)
    want = op_torch(torch.tensor(x_np[:, :, :height, :width])).numpy()
    assert got.shape == want.shape, (height, width, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"size {(height, width)}")
  assert counts[0] > 0 and not any(counts[1:]), counts
  return counts

@pytest.mark.parametrize("stride,padding,dilation,groups,cout,cin,k", [
  (1, 1, 1, 1, 3, 4, 3), (1, 0, 1, 1, 3, 4, 3), (2, 1, 1, 1, 3, 4, 3), (1, 2, 2, 1, 3, 4, 3), (1, 0, 1, 1, 5, 4, 1),
  (2, 0, 1, 1, 5, 4, 1), (1, 1, 1, 2, 6, 2, 3), (2, 2, 1, 1, 4, 4, 5)])
def test_conv2d_over_symbolic_height_and_width_compiles_once(stride, padding, dilation, groups, cout, cin, k):
  rng = np.random.default_rng(cout * 100 + cin * 10 + k)
  w_np, bias_np = rng.standard_normal((cout, cin, k, k)).astype(np.float32), rng.standard_normal(cout).astype(np.float32)
  w, bias = Tensor(w_np).realize(), Tensor(bias_np).realize()
  args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
  check_sizes(lambda x: x.conv2d(w, bias, **args).relu(),
              lambda x: F.conv2d(x, torch.tensor(w_np), torch.tensor(bias_np), **args).relu())

@pytest.mark.parametrize("stride,padding,k", [(1, 1, 3), (2, 1, 3), (1, 0, 1)])
def test_conv2d_over_long_symbolic_rows(stride, padding, k):
  # rows longer than SMALL_SYMBOLIC_ROW: the kernel loops over the symbolic outputs themselves (`_pool_symbolic`),
  # where shorter ones run at their largest size (`_small_symbolic_rows`)
  rng = np.random.default_rng(k + stride)
  w_np = rng.standard_normal((5, 3, k, k)).astype(np.float32)
  w = Tensor(w_np).realize()
  args = dict(stride=stride, padding=padding)
  check_sizes(lambda x: x.conv2d(w, **args), lambda x: F.conv2d(x, torch.tensor(w_np), **args),
              shape=(1, 3, 70, 72), sizes=((40, 48), (66, 72), (35, 70)))

def test_conv2d_output_shape_is_symbolic():
  x = sizes_of(Tensor.zeros(1, 4, 14, 11).contiguous().realize(), 9, 7)
  out = x.conv2d(Tensor.zeros(3, 4, 3, 3), stride=2, padding=1)
  assert out.shape[2].vmin >= 1 and out.shape[2].vmax == 7 and out.shape[3].vmax == 6
  assert out.numpy().shape == (1, 3, 5, 4)

def test_conv2d_refuses_a_kernel_larger_than_the_smallest_size():
  x = sizes_of(Tensor.zeros(1, 4, 14, 11).contiguous().realize(), 9, 7, lo=2)
  with pytest.raises(RuntimeError, match="kernel"): x.conv2d(Tensor.zeros(3, 4, 5, 5))

@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_max_pool2d_over_symbolic_sizes(kernel, stride, padding):
  check_sizes(lambda x: x.max_pool2d(kernel, stride, padding=padding),
              lambda x: F.max_pool2d(x, kernel, stride, padding=padding))

def test_avg_pool2d_over_symbolic_sizes():
  check_sizes(lambda x: x.avg_pool2d(2, 2), lambda x: F.avg_pool2d(x, 2, 2))

def test_conv_transpose2d_over_symbolic_sizes():
  w_np = np.random.default_rng(5).standard_normal((4, 3, 2, 2)).astype(np.float32)
  w = Tensor(w_np).realize()
  check_sizes(lambda x: x.conv_transpose2d(w, stride=2), lambda x: F.conv_transpose2d(x, torch.tensor(w_np), stride=2))

def test_conv2d_over_a_symbolic_batch_copies_its_padded_input_and_compiles_once():
  # the padded input (8x26x26 an image) is copied in its own kernel whatever the batch, so the conv reads it
  # without the pad's gates (kiln/mixin/conv.py _conv_windows)
  rng = np.random.default_rng(1)
  x_np, w_np = rng.standard_normal((4, 8, 24, 24)).astype(np.float32), rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
  x, w = Tensor(x_np).realize(), Tensor(w_np).realize()
  counts = []
  for batch in (2, 3):
    out = x[0:Variable("b", 1, 4).bind(batch)].conv2d(w, padding=1)
    assert len([item for item in out.schedule() if item.ast.op.name == "SINK"]) == 2   # the copy, then the conv
    before = compiles()
    got = out.numpy()
    counts.append(compiles() - before)
    want = F.conv2d(torch.tensor(x_np[:batch]), torch.tensor(w_np), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert counts[1] == 0, counts
