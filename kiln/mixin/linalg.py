"""Linear algebra built from tensor ops: the qr and svd decompositions, and Newton-Schulz orthogonalization."""
from __future__ import annotations
from typing import TYPE_CHECKING
from kiln.dtype import dtypes
from kiln.mixin.common import TensorValueError, where, fmt
if TYPE_CHECKING: from kiln.tensor import Tensor

JACOBI_SWEEPS = 8   # one-sided Jacobi converges quadratically: 8 sweeps reach float32 rounding for small matrices

class LinalgMixin:
  __slots__ = ()
  def qr(self) -> tuple[Tensor, Tensor]:
    """Reduced QR decomposition of (..., m, n) matrices: Q (..., m, k) with orthonormal columns and upper-triangular
    R (..., k, n), k = min(m, n), by Householder reflections (the signs follow LAPACK, as torch.linalg.qr).

    Differentiable through the reflections (the gradient is that of the computation, defined for full-rank input).

    >>> q, r = Tensor([[3.0, 1.0], [4.0, 2.0]]).qr()
    >>> [[round(v, 4) for v in row] for row in r.tolist()]
    [[-5.0, -2.2], [0.0, 0.4]]
    """
    a = _matrices(self, "qr")
    q, r = _householder_qr(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    return _shrink_last2(q, m, k), _shrink_last2(r, k, n)

  def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Singular value decomposition of (..., m, n) matrices: U, S (descending), Vh with A = U diag(S) Vh.

    U is (..., m, m) and Vh (..., n, n) with `full_matrices`, else (..., m, k) and (..., k, n), k = min(m, n).
    A QR step reduces the matrix to a k x k triangle, which a fixed number of one-sided Jacobi sweeps diagonalizes.
    Singular vectors are unique only up to sign (and for repeated singular values, up to rotation). Unlike torch, the
    columns of U that belong to zero singular values (of the first min(m, n)) are zero rather than orthonormal.

    >>> u, s, vh = Tensor([[3.0, 0.0], [0.0, -4.0]]).svd()
    >>> [round(v, 4) for v in s.tolist()]
    [4.0, 3.0]
    """
    a = _matrices(self, "svd")
    m, n = a.shape[-2:]
    if m < n:   # A^T = V S U^T
      u, s, vh = a.transpose(-1, -2).svd(full_matrices)
      return vh.transpose(-1, -2), s, u.transpose(-1, -2)
    batch = a.shape[:-2]
    if n == 0:
      eye_m = a.eye(m, device=a.device, dtype=a.dtype).reshape((1,) * len(batch) + (m, m)).expand(batch + (m, m))
      u = eye_m if full_matrices else a.zeros(*batch, m, 0, device=a.device, dtype=a.dtype)
      empty_s, empty_vh = (a.zeros(*batch, *shape, device=a.device, dtype=a.dtype) for shape in ((0,), (0, 0)))
      return u, empty_s, empty_vh
    q, r = _householder_qr(a)
    u_small, s, v = _jacobi_svd(_shrink_last2(r, n, n))   # R's top n x n block = u_small diag(s) v^T
    if full_matrices and m > n:
      # U = Q @ blockdiag(u_small, I): the columns of Q beyond n complete the basis
      lower = (a.arange(m, device=a.device) >= n).reshape(m, 1)
      eye_tail = (lower & a.eye(m, device=a.device, dtype=dtypes.bool)).cast(a.dtype)
      u = q @ (u_small.pad(((0, 0),) * len(batch) + ((0, m - n), (0, m - n))) + eye_tail)
    else:
      u = _shrink_last2(q, m, n) @ u_small
    return u, s, v.transpose(-1, -2)

  def newton_schulz(self, steps: int, params: tuple[float, ...], eps: float = 1.0e-7) -> Tensor:
    """Approximately orthogonalize (..., m, n) matrices (push every singular value towards 1, keep the singular
    vectors): scale each matrix to Frobenius norm 1, then apply `steps` times the odd polynomial
    X <- params[0] X + params[1] (X X^T) X + params[2] (X X^T)^2 X + ... (Muon's update; tinygrad's signature).

    Tall matrices are worked on transposed, so X X^T is the smaller Gram matrix.

    >>> x = Tensor([[3.0, 0.0], [0.0, 1.0]]).newton_schulz(10, (1.5, -0.5))   # the cubic iteration converges to 1
    >>> [[round(v, 3) for v in row] for row in x.tolist()]
    [[1.0, 0.0], [0.0, 1.0]]
    """
    x = _matrices(self, "newton_schulz")
    if not params: raise TensorValueError(f"newton_schulz: params must name at least one coefficient{where()}")
    tall = x.shape[-2] > x.shape[-1]
    x = x / (x.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
    if tall: x = x.transpose(-2, -1)
    for _ in range(steps):
      gram = x @ x.transpose(-2, -1)
      term, total = x, params[0] * x
      for coefficient in params[1:]:
        term = gram @ term
        total = total + coefficient * term
      x = total
    return x.transpose(-2, -1) if tall else x

def _matrices(x: Tensor, op: str) -> Tensor:
  """`x` checked to be a stack of matrices, as floats."""
  if x.ndim < 2:
    raise TensorValueError(f"{op}: expects a matrix or a batch of matrices (..., m, n), got shape {fmt(x.shape)}{where()}")
  return x if dtypes.is_float(x.dtype) else x.cast(dtypes.default_float)

def _shrink_last2(x: Tensor, rows: int, cols: int) -> Tensor:
  """The top-left rows x cols block of each matrix in `x`."""
  return x.shrink(tuple(None for _ in x.shape[:-2]) + ((0, rows), (0, cols)))

def _householder_qr(a: Tensor) -> tuple[Tensor, Tensor]:
  """Full Householder QR: Q (..., m, m) orthogonal, R (..., m, n) upper triangular with Q @ R = a."""
  m, n = a.shape[-2:]
  batch = a.shape[:-2]
  ones = (1,) * len(batch)
  rows = a.arange(m, device=a.device).reshape(m, 1)
  q = a.eye(m, device=a.device, dtype=a.dtype).reshape(ones + (m, m)).expand(batch + (m, m))
  r = a
  for col in range(min(m, n)):
    x = r.shrink(tuple(None for _ in batch) + (None, (col, col + 1)))                 # (..., m, 1)
    x = (rows >= col).where(x, 0)                                                     # the column from the diagonal on
    head = (rows == col).where(x, 0).sum(-2, keepdim=True)                            # x[col]
    tail_sq = (rows > col).where(x.square(), 0).sum(-2, keepdim=True)
    norm = (head.square() + tail_sq).sqrt()
    # v = x - alpha e_col with alpha = -sign(head) |x| avoids cancellation; when nothing sits below the diagonal LAPACK
    # leaves the column alone (tau = 0), and so do we, which keeps R's signs equal to torch's
    alpha = (head < 0).where(norm, -norm)
    v = x - (rows == col).where(alpha, 0)
    v_sq = (v.square()).sum(-2, keepdim=True)
    reflect = tail_sq > 0
    scale = reflect.where(2 / reflect.where(v_sq, 1), 0)                             # H = I - scale v v^T
    vt = v.transpose(-1, -2)
    r = (r - (scale * v) @ (vt @ r)).contiguous().contiguous_backward()
    q = (q - (q @ v) @ (scale * vt)).contiguous().contiguous_backward()
  return q, r

def _jacobi_svd(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """SVD of square (..., n, n) matrices by one-sided Jacobi: (U, S descending, V) with a = U diag(S) V^T."""
  n = a.shape[-1]
  batch = a.shape[:-2]
  nb = len(batch)
  size = n + n % 2   # the tournament pairs columns, so an odd count gets a zero column that never rotates
  work = a.pad(((0, 0),) * nb + ((0, 0), (0, size - n))) if size != n else a
  v = a.eye(size, device=a.device, dtype=a.dtype).reshape((1,) * nb + (size, size)).expand(batch + (size, size))
  if size > 1:
    for _ in range(JACOBI_SWEEPS * (size - 1)):
      work, v = _jacobi_round(work, v)
  norms_sq = work.square().sum(-2)                                                   # (..., size)
  nonzero = norms_sq > 0   # the padding column: sqrt's gradient at 0 is infinite
  norms = nonzero.where(nonzero.where(norms_sq, 1).sqrt(), 0)
  s, order = norms.sort(-1, descending=True)
  # permute columns by `order` with a 0/1 matrix: perm[i, j] = (order[j] == i)
  perm = (order.unsqueeze(-2) == a.arange(size, device=a.device).reshape(size, 1)).cast(a.dtype)
  work, v = work @ perm, v @ perm
  s = s.shrink(tuple(None for _ in batch) + ((0, n),))
  # a zero singular value leaves a zero column, which stays zero rather than becoming NaN
  sigma = s.unsqueeze(-2)
  u = (sigma > 0).where(_shrink_last2(work, n, n) / (sigma > 0).where(sigma, 1), 0)
  return u, s, _shrink_last2(v, n, n)

def _jacobi_round(work: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
  """Rotate column pairs (k, k + size/2) so each pair becomes orthogonal, then move columns along a round-robin
  tournament so that size-1 rounds meet every pair once. Every round is the same graph, so its kernels compile once."""
  half = work.shape[-1] // 2
  nb = work.ndim - 2
  def halves(x: Tensor) -> tuple[Tensor, Tensor]:
    keep = tuple(None for _ in range(nb + 1))
    return x.shrink(keep + ((0, half),)), x.shrink(keep + ((half, 2 * half),))
  left, right = halves(work)
  alpha, beta = left.square().sum(-2, keepdim=True), right.square().sum(-2, keepdim=True)
  gamma = (left * right).sum(-2, keepdim=True)
  rotate = gamma != 0
  zeta = (beta - alpha) / (2 * rotate.where(gamma, 1))
  # the smaller root of t^2 + 2 zeta t - 1 = 0: the rotation angle is at most 45 degrees, which makes it converge
  t = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1 + zeta.square()).sqrt())
  t = rotate.where(t, 0)
  c = (1 + t.square()).rsqrt()
  s = c * t
  def rotated(x: Tensor) -> Tensor:
    x_left, x_right = halves(x)
    return _tournament_step(c * x_left - s * x_right, s * x_left + c * x_right).contiguous().contiguous_backward()
  return rotated(work), rotated(v)

def _tournament_step(left: Tensor, right: Tensor) -> Tensor:
  """Columns [left | right] reordered for the next round of the circle method: left[0] stays, the others move one
  place around the circle left[1:] -> ..., right -> left."""
  half = left.shape[-1]
  nb = left.ndim - 1
  def piece(x: Tensor, start: int, stop: int, at: int) -> Tensor:
    keep = tuple(None for _ in range(nb))
    return x.shrink(keep + ((start, stop),)).pad(((0, 0),) * nb + ((at, 2 * half - at - (stop - start)),))
  # new left: [left[0], right[0], left[1:half-1]]; new right: [right[1:], left[half-1]]
  if half == 1: parts = [piece(left, 0, 1, 0), piece(right, 0, 1, 1)]
  else: parts = [piece(left, 0, 1, 0), piece(right, 0, 1, 1), piece(left, 1, half - 1, 2),
                 piece(right, 1, half, half), piece(left, half - 1, half, 2 * half - 1)]
  out = parts[0]
  for p in parts[1:]: out = out + p
  return out
