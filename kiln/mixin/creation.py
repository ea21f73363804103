"""Creation beyond the core constructors: random integers and permutations, sampling, tensors over existing memory."""
from __future__ import annotations
import ctypes, pathlib
from typing import TYPE_CHECKING
from kiln.dtype import DType, dtypes
from kiln.helpers import prod, fetch
from kiln.device import Device
from kiln.mixin.common import UnsupportedError, TensorValueError, where, fmt, dtype_arg, canonical_device
if TYPE_CHECKING: from kiln.tensor import Tensor

# above this size randperm sorts its random keys instead of ranking them in n*n compares
_RANK_LIMIT = 2048

def _is_int(x) -> bool: return isinstance(x, int) and not isinstance(x, bool)

def _rank(keys: Tensor) -> Tensor:
  """The rank of each key along the last axis (ties broken by position), so the ranks form a permutation."""
  n = keys.shape[-1]
  mine, others = keys.unsqueeze(-1), keys.unsqueeze(-2)   # [..., i, j] compares key i with key j
  before = keys.arange(n, device=keys.device).reshape(1, n) < keys.arange(n, device=keys.device).reshape(n, 1)
  smaller = (others < mine) | ((others == mine) & before)
  return smaller.cast(dtypes.int32).sum(-1, dtype=dtypes.int32)

class CreationMixin:
  __slots__ = ()

  @staticmethod
  def randint(*shape, low: int = 0, high: int = 10, dtype: DType | str = dtypes.int32, **kwargs) -> Tensor:
    """Random integers drawn uniformly from [low, high).

    >>> t = Tensor.randint(2, 3, low=5, high=8)
    >>> t.shape, t.dtype, bool(((t >= 5) & (t < 8)).all().item())
    ((2, 3), dtypes.int, True)
    """
    from kiln.tensor import Tensor, _shape_arg
    if not _is_int(low) or not _is_int(high):
      raise TypeError(f"randint: low and high must be ints, got low={low!r}, high={high!r}{where()}")
    dtype = dtype_arg(dtype, "randint")
    if not dtypes.is_int(dtype) or dtype == dtypes.bool:
      raise UnsupportedError(f"randint: dtype must be an integer type, got {dtype}{where()}")
    if low >= high: raise TensorValueError(f"randint: low must be less than high, got low={low}, high={high}{where()}")
    if low < dtypes.min(dtype) or high - 1 > dtypes.max(dtype):
      raise TensorValueError(f"randint: [{low}, {high}) does not fit {dtype}{where()}")
    shape, device = _shape_arg(shape), canonical_device(kwargs.pop("device", None))
    span, n = high - low, prod(shape)
    # draws reduced modulo the span: the bias is at most span / 2**32 (or 2**64), negligible for ordinary ranges
    if dtype.itemsize <= 4:
      bits = Tensor._random_bits(n, device)
      value = (bits if span == 1 << 32 else bits % span) + (low & 0xFFFFFFFF)   # wraps in uint32 like two's complement
    else:
      words = Tensor._random_bits(2 * n, device).cast(dtypes.uint64)
      bits = (words[:n] << 32) | words[n:]
      value = (bits if span == 1 << 64 else bits % span) + (low & 0xFFFFFFFFFFFFFFFF)
    return Tensor(value.cast(dtype).reshape(shape).uop, **kwargs)

  @staticmethod
  def randperm(n: int, device: str | None = None, dtype: DType | str = dtypes.int32, **kwargs) -> Tensor:
    """A random permutation of 0 .. n-1.

    >>> sorted(Tensor.randperm(5).tolist())
    [0, 1, 2, 3, 4]
    """
    from kiln.tensor import Tensor
    if not _is_int(n) or n < 0: raise TensorValueError(f"randperm: n must be a non-negative int, got {n!r}{where()}")
    dtype, device = dtype_arg(dtype, "randperm"), canonical_device(device)
    if n == 0: return Tensor.zeros(0, device=device, dtype=dtype, **kwargs)
    keys = Tensor._random_bits(n, device)
    # the ranks of independent random keys are a uniformly random permutation
    if n > _RANK_LIMIT: perm = keys.argsort()
    else: perm = _rank(keys)
    return Tensor(perm.cast(dtype).uop, **kwargs)

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Indices sampled from the categories of each row, weighted by the (non-negative) values of this 1-d or 2-d tensor.

    Returns int32 indices of shape (num_samples,) or (rows, num_samples). Without replacement each row's samples
    are distinct (an exponential race over the weights).

    >>> Tensor([0.0, 1.0, 0.0]).multinomial(4, replacement=True).tolist()
    [1, 1, 1, 1]
    """
    if not 1 <= self.ndim <= 2:
      raise TensorValueError(f"multinomial: weights must be 1-d or 2-d, got shape {fmt(self.shape)}{where()}")
    if not _is_int(num_samples) or num_samples <= 0:
      raise TensorValueError(f"multinomial: num_samples must be a positive int, got {num_samples!r}{where()}")
    n = self.shape[-1]
    if n == 0: raise TensorValueError(f"multinomial: weights of shape {fmt(self.shape)} have no categories{where()}")
    if not replacement and num_samples > n:
      raise TensorValueError(f"multinomial: cannot draw {num_samples} samples without replacement from {n} "
                             f"categories{where()}")
    weights = (self.unsqueeze(0) if self.ndim == 1 else self).detach().cast(dtypes.float32)
    rows = weights.shape[0]
    if replacement or num_samples == 1:
      cdf = weights.cumsum(1)
      cdf = cdf / cdf[:, n - 1:n]
      u = self.rand(rows, num_samples, 1, device=self.device)
      # the sample is the number of cumulative weights at or below u: the first category whose cdf exceeds u
      picks = (cdf.unsqueeze(1) <= u).cast(dtypes.int32).sum(2, dtype=dtypes.int32).minimum(n - 1)
    else:
      # each category draws an exponential arrival time with rate = its weight; the first arrivals are the samples
      u = self.rand(rows, n, device=self.device)
      arrival = -(1.0 - u).log() / weights
      rank = _rank(arrival)
      slots = self.arange(num_samples, device=self.device).reshape(1, num_samples, 1)
      index = self.arange(n, device=self.device).reshape(1, 1, n)
      picks = ((rank.unsqueeze(1) == slots).cast(dtypes.int32) * index).sum(2, dtype=dtypes.int32)
    picks = picks.cast(dtypes.int32)
    return picks.reshape(num_samples) if self.ndim == 1 else picks

  @staticmethod
  def from_blob(ptr: int, shape: tuple[int, ...], **kwargs) -> Tensor:
    """A tensor over the `prod(shape)` elements at host address `ptr` (`dtype`, `device` and Tensor options as kwargs).

    As in tinygrad, the memory is used in place, not copied: the tensor sees later writes to it, `assign` writes
    into it, and the caller keeps it valid while the tensor lives. A device that cannot compute on host memory gets
    a copy, made here.

    >>> import ctypes
    >>> raw = (ctypes.c_float * 3)(1.0, 2.0, 3.0)
    >>> t = Tensor.from_blob(ctypes.addressof(raw), (3,), dtype=dtypes.float32)
    >>> raw[0] = 5.0
    >>> t.tolist()
    [5.0, 2.0, 3.0]
    """
    from kiln.tensor import Tensor, _shape_arg
    shape = _shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
    dtype = dtype_arg(kwargs.pop("dtype", dtypes.default_float), "from_blob")
    device = canonical_device(kwargs.pop("device", None))
    nbytes = prod(shape) * dtype.itemsize
    if not _is_int(ptr) or (ptr <= 0 and nbytes):
      raise TensorValueError(f"from_blob: ptr must be a valid (non-null) address, got {ptr!r}{where()}")
    out = Tensor.empty(*shape, dtype=dtype, device=device)
    buffer = out.uop.base.buffer
    if Device[device].allocator.host_memory: buffer.allocate(external_ptr=ptr)
    elif nbytes: buffer.copyin(memoryview(ctypes.string_at(ptr, nbytes)))
    return Tensor(out.uop, **kwargs)

  @staticmethod
  def from_url(url: str, gunzip: bool = False, **kwargs) -> Tensor:
    """The bytes at `url` as a uint8 tensor (or viewed as `dtype`), downloaded once into kiln's cache directory.

    Local paths (starting with "/" or ".") are read directly; `gunzip=True` decompresses the download.
    DISABLE_HTTP_CACHE=1 downloads again every time.
    """
    from kiln.tensor import Tensor
    import numpy as np
    dtype = dtype_arg(kwargs.pop("dtype", dtypes.uint8), "from_url")
    path = _fetch(url, gunzip)
    data = path.read_bytes()
    if len(data) % dtype.itemsize:
      raise TensorValueError(f"from_url: {len(data)} bytes are not a whole number of {dtype} elements{where()}")
    if dtype == dtypes.uint8: return Tensor(data, **kwargs)
    device = canonical_device(kwargs.pop("device", None))
    out = Tensor.empty(len(data) // dtype.itemsize, dtype=dtype, device=device)
    if data: out.uop.base.buffer.copyin(memoryview(np.frombuffer(data, np.uint8)))
    return Tensor(out.uop, **kwargs)

def _fetch(url: str, gunzip: bool) -> pathlib.Path:
  """The local file holding `url`'s contents (kiln.helpers.fetch), its errors naming from_url and the user's line."""
  try: return fetch(url, gunzip=gunzip)
  except (RuntimeError, OSError, ValueError) as e: raise RuntimeError(f"from_url: {e}{where()}") from None
