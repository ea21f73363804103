"""Regressions found by a differential fuzzer against PyTorch (kiln issue 16): each test names the repro it guards."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, dtypes

def assert_close(got: np.ndarray, want: np.ndarray, atol: float = 1e-4, rtol: float = 1e-4) -> None:
  """Same shape, same nan/inf positions, values close; the message names the shape and the worst difference."""
  assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
  nan_got, nan_want = np.argwhere(np.isnan(got)).tolist(), np.argwhere(np.isnan(want)).tolist()
  assert nan_got == nan_want, f"shape {want.shape}: nan at {nan_got}, want {nan_want}"
  finite = np.isfinite(want)
  assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]), "infs differ"
  worst = np.abs(got[finite] - want[finite]).max(initial=0.0)
  assert np.allclose(got[finite], want[finite], atol=atol, rtol=rtol), f"shape {want.shape}: worst difference {worst}"

# ---------------- strided conv: the phase split's padded taps must not turn an unread inf into nan ----------------
@pytest.mark.parametrize("size,kernel,stride,padding", [(6, 3, 2, 0), (7, 3, 2, 0), (7, 3, 2, 1), (9, 3, 3, 0),
                                                        (8, 2, 3, 0), (10, 5, 2, 2)])
def test_strided_conv_inf_in_unread_or_padded_tap_column(size, kernel, stride, padding):
  rng = np.random.default_rng(size * 100 + kernel * 10 + stride)
  x = rng.standard_normal((2, 2, size, size)).astype(np.float32)
  w = rng.standard_normal((3, 2, kernel, kernel)).astype(np.float32)
  x[0, 0, :, size - 1] = np.inf   # the last column: read by no output for some shapes, by a padded tap for others
  x[1, 1, 3, :] = -np.inf         # a row read by a real tap of one output and a padded tap of the one before
  want = F.conv2d(torch.tensor(x), torch.tensor(w), stride=stride, padding=padding).numpy()
  assert_close(Tensor(x).conv2d(Tensor(w), stride=stride, padding=padding).numpy(), want)

@pytest.mark.parametrize("size,kernel,stride", [(6, 3, 2), (7, 3, 2), (8, 2, 3)])
def test_strided_conv_gradients_with_inf_in_unread_column(size, kernel, stride):
  rng = np.random.default_rng(size + kernel + stride)
  x = rng.standard_normal((1, 2, size, size)).astype(np.float32)
  w = rng.standard_normal((2, 2, kernel, kernel)).astype(np.float32)
  last_read = ((size - kernel) // stride) * stride + kernel - 1
  x[:, :, :, last_read + 1:] = np.inf   # columns no output reads: no gradient may turn nan because of them
  xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  F.conv2d(xt, wt, stride=stride).square().sum().backward()
  xk, wk = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  xk.conv2d(wk, stride=stride).square().sum().backward()
  assert_close(wk.grad.numpy(), wt.grad.numpy(), atol=1e-3)
  assert_close(xk.grad.numpy(), xt.grad.numpy(), atol=1e-3)

# ---------------- conv backward: a transposed conv's crop reaching past a size-1 axis ----------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_backward_groups_stride_dilation_asymmetric_padding(dtype):
  """x (2,6,2,1) * w (3,2,2,1), groups=3, stride 3, dilation (1,2), padding (left 2, right 0, top 0, bottom 2):
  backward raised a shrink error from the input gradient's transposed conv."""
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((2, 6, 2, 1)).astype(dtype), rng.standard_normal((3, 2, 2, 1)).astype(dtype)
  xk, wk = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  out = xk.conv2d(wk, groups=3, stride=(3, 3), dilation=(1, 2), padding=(2, 0, 0, 2))
  (out * out).sum().backward()
  xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  out_t = F.conv2d(F.pad(xt, (2, 0, 0, 2)), wt, groups=3, stride=3, dilation=(1, 2))
  (out_t * out_t).sum().backward()
  assert_close(out.numpy(), out_t.detach().numpy())
  assert_close(xk.grad.numpy(), xt.grad.numpy())
  assert_close(wk.grad.numpy(), wt.grad.numpy())

# ---------------- gradients stop at bool and int values ----------------
_BOOL_PATHS = {
  "any_float_times_x": lambda x: x.any().float() * x,   # raised: FDIV needs float operands, got dtypes.bool
  "bool_max_float_times_x": lambda x: x.bool().max().float() * x,
  "bool_plus_x": lambda x: x.bool() + x,                 # gave 2 (a gradient through the bool cast)
  "int_float_times_x": lambda x: x.int().float() * x,    # gave 2*x
  "any_where_x": lambda x: x.any().where(x, 0.0) if isinstance(x, Tensor) else torch.where(x.any(), x, 0.0),
}

@pytest.mark.parametrize("name", sorted(_BOOL_PATHS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_gradient_through_bool_or_int_values(name, dtype):
  values = np.array([1.5, 0.0, -2.0], dtype=dtype)
  xk, xt = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
  (_BOOL_PATHS[name](xk) * 3).sum().backward()
  (_BOOL_PATHS[name](xt) * 3).sum().backward()
  assert_close(xk.grad.numpy(), xt.grad.numpy())

# ---------------- reductions over an empty axis: no loop, no load (the PYTHON device caught the load out of bounds) --
@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
@pytest.mark.parametrize("shape,axis", [((0, 1, 4), (0, 1, 2)), ((0, 1, 4), (0,)), ((3, 0, 2), (1,)),
                                        ((2, 0, 3), None)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reduce_over_empty_axis(device, shape, axis, dtype):
  values = np.zeros(shape, dtype=dtype)
  for name, reference in (("sum", np.sum), ("prod", np.prod)):
    got = getattr(Tensor(values, device=device), name)(axis=axis, keepdim=True).numpy()
    want = reference(values, axis=axis, keepdims=True)
    np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=f"{name} of {shape} over {axis}")
  got = Tensor(values.astype(np.float32), device=device).mean(axis=axis, keepdim=True).numpy()
  want = torch.tensor(values.astype(np.float32)).mean(dim=axis if axis is not None else tuple(range(len(shape))),
                                                      keepdim=True).numpy()
  assert_close(got, want)

# ---------------- gcc 12 with AVX-512: if-converted selects of a padded log (fuzz seed 200370) ----------------
def test_log_of_a_padded_permuted_cat_keeps_the_pad_value():
  # -O2 -march=native gcc 12.2 stored 0 where the pad value belonged (kiln/renderer/cstyle.py GCC_AVX512_WORKAROUND)
  t = Tensor.zeros(3, 4).cat(Tensor.zeros(3, 4), dim=0)
  got = (t * t + 1).log().pad(((2, 0), (1, 0)), value=1.5).permute(1, 0).numpy()
  want = np.pad(np.zeros((6, 4), np.float32), ((2, 0), (1, 0)), constant_values=1.5).T
  np.testing.assert_array_equal(got, want)

# ---------------- a folded transcendental must equal the kernels' (fuzz seed 350174) ----------------
def test_max_gradient_of_a_value_also_computed_from_constants():
  # sin(1) of a constant tensor was folded by NumPy's float32 sin (an ulp above the kernels' correctly rounded value),
  # so the max kernel and the gradient's mask (x == max) computed x differently and no element was the maximum
  t2 = Tensor.ones(4, requires_grad=True)
  (-t2.cat(t2.sin(), dim=0).sin().max()).backward()
  np.testing.assert_allclose(t2.grad.numpy(), np.full(4, -np.cos(1.0) / 4, np.float32), rtol=1e-6)
  assert Tensor.ones(1).sin().numpy()[0] == Tensor([1.0]).sin().numpy()[0]
