"""sort, argsort, topk, qr and svd against PyTorch: values, stable indices, gradients, edge cases and errors."""
import numpy as np
import pytest
import torch
from kiln import Tensor, dtypes
from helpers import check, assert_close, make_input

def torch_sort(x: torch.Tensor, dim=-1, descending=False):
  return torch.sort(x, dim=dim, descending=descending, stable=True)

# ---------------------------------------------------------------------------------------------------------------------
# sort / argsort

@pytest.mark.parametrize("shape, dim, descending", [
  ((3, 5), -1, False), ((3, 5), 0, True), ((2, 3, 4), 1, False), ((4,), 0, True), ((2, 1, 3), 1, False)])
def test_sort_values_and_grad(shape, dim, descending):
  check(lambda x: x.sort(dim, descending)[0], lambda x: torch_sort(x, dim, descending)[0], [shape])

@pytest.mark.parametrize("shape, dim, descending", [((3, 5), -1, False), ((3, 5), 0, True), ((2, 3, 4), 1, False)])
def test_sort_indices_with_ties(shape, dim, descending):
  # few distinct values: the indices of equal elements must keep their original order (a stable sort)
  x = make_input(shape, "int32", np.random.default_rng(3), 0, 3)
  values, indices = Tensor(x).sort(dim, descending)
  want_values, want_indices = torch_sort(torch.tensor(x), dim, descending)
  assert values.dtype == dtypes.int32 and indices.dtype == dtypes.int32
  assert_close(values.numpy(), want_values.numpy(), "values")
  assert_close(indices.numpy(), want_indices.int().numpy(), "indices")

@pytest.mark.parametrize("dtype", ["float16", "int8", "uint8", "int32", "bool"])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_dtypes(dtype, descending):
  rng = np.random.default_rng(4)
  x = make_input((2, 5), dtype, rng, -128 if dtype == "int8" else 0, 256 if dtype == "uint8" else 128)
  if dtype in ("int8", "uint8", "int32"):   # the extreme values tie with the padding, which must still sort last
    info = np.iinfo(dtype)
    x[0, 1], x[1, 3], x[1, 0] = info.max, info.min, info.max
  check(lambda t: t.sort(1, descending)[0], lambda t: torch_sort(t, 1, descending)[0], [x])
  check(lambda t: t.sort(1, descending)[1], lambda t: torch_sort(t, 1, descending)[1].int(), [x], grad=False)

@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_inf(descending):
  nan, inf = float("nan"), float("inf")
  x = np.array([[1.0, nan, -inf, 0.5, inf, nan, 1.0], [inf, -inf, inf, nan, -inf, 0.0, -0.0]], np.float32)
  check(lambda t: t.sort(1, descending)[0], lambda t: torch_sort(t, 1, descending)[0], [x])
  check(lambda t: t.sort(1, descending)[1], lambda t: torch_sort(t, 1, descending)[1].int(), [x], grad=False)

def test_sort_non_contiguous_input():
  check(lambda x: x.T.sort(1)[0], lambda x: torch_sort(x.T, 1)[0], [(5, 3)])
  check(lambda x: x.flip(1).sort(1, True)[0], lambda x: torch_sort(x.flip(1), 1, True)[0], [(3, 5)])

@pytest.mark.parametrize("shape, dim", [((0,), 0), ((3, 0), 1), ((0, 3), 1), ((3, 1), 1), ((1,), -1), ((), 0),
                                        ((), -1)])
def test_sort_empty_and_trivial_axes(shape, dim):
  check(lambda x: x.sort(dim)[0], lambda x: torch_sort(x, dim)[0], [shape])
  check(lambda x: x.sort(dim)[1], lambda x: torch_sort(x, dim)[1].int(), [shape], grad=False)

def test_sort_kernel_count_grows_with_stages_not_size():
  # a bitonic network over 16 = 2^4 padded elements has 4*5/2 = 10 compare-exchange stages
  from kiln.helpers import GlobalCounters
  x = Tensor(make_input((3, 13), "float32", np.random.default_rng(9))).realize()
  GlobalCounters.reset()
  values, indices = x.sort()
  Tensor.realize_all([values, indices])
  assert GlobalCounters.kernel_count <= 4 * 10, f"sort of 13 elements took {GlobalCounters.kernel_count} kernels"
  assert_close(values.numpy(), np.sort(x.numpy(), -1, kind="stable"), "values")
  assert_close(indices.numpy(), np.argsort(x.numpy(), -1, kind="stable").astype(np.int32), "indices")

def test_argsort():
  check(lambda x: x.argsort(), lambda x: torch.argsort(x, stable=True).int(), [(3, 5)], dtype="int32", low=0, high=3)
  check(lambda x: x.argsort(0, True), lambda x: torch.argsort(x, dim=0, descending=True, stable=True).int(), [(3, 5)],
        dtype="int32", low=0, high=3)

# ---------------------------------------------------------------------------------------------------------------------
# topk

def torch_topk_stable(x: torch.Tensor, k: int, dim: int, largest: bool):
  """torch.topk leaves the order of ties open: take the first k of a stable sort as the reference."""
  values, indices = torch_sort(x, dim, descending=largest)
  return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)

@pytest.mark.parametrize("k, dim, largest", [(2, -1, True), (3, 0, False), (0, 1, True), (5, 1, True), (5, 1, False)])
def test_topk(k, dim, largest):
  check(lambda x: x.topk(k, dim, largest)[0], lambda x: torch.topk(x, k, dim, largest)[0], [(3, 5)])
  check(lambda x: x.topk(k, dim, largest)[1], lambda x: torch_topk_stable(x, k, dim, largest)[1].int(), [(3, 5)],
        grad=False)

def test_topk_ties_and_unsorted():
  check(lambda x: x.topk(3)[1], lambda x: torch_topk_stable(x, 3, -1, True)[1].int(), [(3, 5)], dtype="int32",
        low=0, high=2)
  x = make_input((3, 5), "float32", np.random.default_rng(5))
  values = Tensor(x).topk(2, sorted_=False)[0].numpy()
  assert_close(np.sort(values, -1), np.sort(torch.topk(torch.tensor(x), 2, sorted=False)[0].numpy(), -1), "values")

def test_sort_errors():
  x = Tensor.ones(2, 3)
  with pytest.raises(IndexError, match="sort"): x.sort(2)
  with pytest.raises(IndexError, match="argsort"): x.argsort(-3)
  with pytest.raises(IndexError, match="topk"): x.topk(1, dim=5)
  with pytest.raises(ValueError, match="topk"): x.topk(4)
  with pytest.raises(ValueError, match="topk"): x.topk(-1)
  with pytest.raises(TypeError, match="topk"): x.topk(1.5)
  with torch.no_grad(), pytest.raises(RuntimeError): torch.ones(2, 3).topk(4)   # torch refuses k > n as well

def test_sort_python_device():
  check(lambda x: x.sort()[0], lambda x: torch_sort(x)[0], [(2, 3)], device="PYTHON")
  check(lambda x: x.topk(2, largest=False)[1], lambda x: torch_topk_stable(x, 2, -1, False)[1].int(), [(2, 3)],
        dtype="int32", low=0, high=2, device="PYTHON", grad=False)

# ---------------------------------------------------------------------------------------------------------------------
# qr / svd: compared with torch through properties that do not depend on sign conventions

def _eye_like(shape) -> np.ndarray:
  return np.broadcast_to(np.eye(shape[-1], dtype=np.float32), shape)

def _t(x: np.ndarray) -> np.ndarray: return np.swapaxes(x, -1, -2)

MATRIX_SHAPES = [(4, 4), (5, 3), (3, 5), (2, 3, 3), (2, 1, 4, 2), (1, 1)]

@pytest.mark.parametrize("shape", MATRIX_SHAPES)
def test_qr(shape):
  a = make_input(shape, "float32", np.random.default_rng(6))
  q, r = (t.numpy() for t in Tensor(a).qr())
  want_q, want_r = (t.numpy() for t in torch.linalg.qr(torch.tensor(a)))
  assert q.shape == want_q.shape and r.shape == want_r.shape
  assert_close(q @ r, a, "Q @ R", atol=1e-5)
  assert_close(_t(q) @ q, _eye_like(_t(q).shape[:-1] + (q.shape[-1],)), "Q^T Q", atol=1e-5)
  assert_close(np.tril(r, -1), np.zeros_like(r), "R below the diagonal")
  assert_close(np.abs(np.diagonal(r, 0, -2, -1)), np.abs(np.diagonal(want_r, 0, -2, -1)), "|diag R|", atol=1e-5)
  signs = np.sign(np.diagonal(r, 0, -2, -1)) * np.sign(np.diagonal(want_r, 0, -2, -1))   # columns agree up to sign
  assert_close(q * signs[..., None, :], want_q, "Q up to column signs", atol=1e-5)

def test_qr_grad():
  check(lambda x: x.qr()[1], lambda x: torch.linalg.qr(x)[1], [(4, 3)], atol=1e-4)
  check(lambda x: x.qr()[0], lambda x: torch.linalg.qr(x)[0], [(3, 3)], atol=1e-4)

def test_qr_non_contiguous_and_int():
  a = make_input((3, 4), "float32", np.random.default_rng(7))
  q, r = (t.numpy() for t in Tensor(a).T.qr())
  assert_close(q @ r, a.T, "Q @ R of a transposed input", atol=1e-5)
  q, r = Tensor([[2, 1], [1, 3]]).qr()
  assert q.dtype == dtypes.float32
  assert_close(q.numpy() @ r.numpy(), np.array([[2, 1], [1, 3]], np.float32), "Q @ R of an int input", atol=1e-5)

@pytest.mark.parametrize("shape", MATRIX_SHAPES)
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd(shape, full_matrices):
  a = make_input(shape, "float32", np.random.default_rng(8))
  u, s, vh = (t.numpy() for t in Tensor(a).svd(full_matrices))
  want_u, want_s, want_vh = torch.linalg.svd(torch.tensor(a), full_matrices=full_matrices)
  assert (u.shape, s.shape, vh.shape) == (tuple(want_u.shape), tuple(want_s.shape), tuple(want_vh.shape))
  assert_close(s, want_s.numpy(), "singular values", atol=1e-5)
  k = s.shape[-1]
  assert_close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, "U diag(S) Vh", atol=1e-5)
  assert_close(_t(u) @ u, _eye_like(_t(u).shape[:-1] + (u.shape[-1],)), "U^T U", atol=1e-5)
  assert_close(vh @ _t(vh), _eye_like(vh.shape[:-1] + (vh.shape[-2],)), "Vh Vh^T", atol=1e-5)

def test_svd_repeated_and_zero_singular_values():
  a = np.diag(np.array([2.0, -2.0, 0.0], np.float32))
  u, s, vh = (t.numpy() for t in Tensor(a).svd())
  assert_close(s, torch.linalg.svdvals(torch.tensor(a)).numpy(), "singular values", atol=1e-6)
  assert_close((u * s[None, :]) @ vh, a, "U diag(S) Vh", atol=1e-6)
  assert_close(u[:, :2].T @ u[:, :2], np.eye(2, dtype=np.float32), "U^T U for the nonzero singular values", atol=1e-6)
  assert_close(vh @ vh.T, np.eye(3, dtype=np.float32), "Vh Vh^T", atol=1e-6)

@pytest.mark.parametrize("shape", [(3, 0), (0, 3), (2, 0, 0)])
def test_linalg_empty(shape):
  for full in (True, False):
    got = Tensor.zeros(*shape).svd(full)
    want = torch.linalg.svd(torch.zeros(shape), full_matrices=full)
    for g, w in zip(got, want): assert_close(g.numpy(), w.numpy(), f"svd of {shape}")
  for g, w in zip(Tensor.zeros(*shape).qr(), torch.linalg.qr(torch.zeros(shape))): assert g.shape == tuple(w.shape)

def test_svd_singular_value_grad():
  check(lambda x: x.svd()[1], lambda x: torch.linalg.svdvals(x), [(3, 3)], atol=1e-4)

def test_linalg_errors():
  with pytest.raises(ValueError, match="qr"): Tensor.ones(3).qr()
  with pytest.raises(ValueError, match="svd"): Tensor.ones(()).svd()
