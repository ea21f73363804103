"""Weight matrices that stay quantized in memory and are dequantized inside the kernel that multiplies by them.

At load each GGUF tensor's blocks are repacked on the host into a few contiguous per-row arrays (the packed 4/6/8-bit
integers as they are, the per-block scales as float32). `QuantizedMatrix.values()` builds the dequantization as a
lazy expression over those arrays, shaped `(rows, *k_shape)` where `k_shape` splits a row into its blocks and bit
fields (Q4_1: `(blocks, 2, 16)`: block, low/high nibble, byte). `linear` multiplies by it and sums over those axes,
so the unpacking, scaling and the dot product are one reduce kernel and no float32 copy of a weight is ever made.

Why repack rather than read the GGUF blocks directly: kiln's C renderer converts float16 to float32 in software, and
a kernel that did that for every weight it read ran ~10x slower (7.5 ms vs 0.7 ms for a 1536x576 Q4_1 matrix).
Float32 scales cost 4 extra bytes per 32 weights for Q4_0/Q8_0 (one scale) and 8 for Q4_1 (scale and min).
Splitting a row into separate axes, rather than one axis of K values, keeps the kernel's index arithmetic free of
`//` and `%` (another 2x).
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Callable
import numpy as np
from kiln.dtype import dtypes
from kiln.tensor import Tensor

def _f16(raw: np.ndarray, start: int) -> np.ndarray:
  """The float16 at byte `start` of each block (..., block_bytes) as float32 (...)."""
  return np.ascontiguousarray(raw[..., start:start + 2]).view(np.float16)[..., 0].astype(np.float32)

def _bit_fields(packed: Tensor, bits: int, axis: int) -> Tensor:
  """uint8 `packed` -> the same with a new axis of `8 // bits` fields inserted at `axis` (field i = bits
  [i*bits, (i+1)*bits) of each byte). The shifts come from an arange, so they are index arithmetic in the kernel."""
  fields = 8 // bits
  packed = packed.unsqueeze(axis)
  trailing = packed.ndim - 1 - (axis % packed.ndim)
  shifts = (Tensor.arange(fields, device=packed.device, dtype=dtypes.uint8) * bits).reshape(fields, *[1] * trailing)
  return (packed >> shifts) & ((1 << bits) - 1)

# ---------------- per-type repacking (host, at load) and expansion (lazy, in the kernel) ----------------
# repack: (rows, blocks, block_bytes) uint8 -> named per-row arrays; expand: those arrays as Tensors (any number of
# rows) -> (rows, *k_shape) float32 values; k_shape(blocks): how a row of values is split into axes.

def _repack_q4_0(raw: np.ndarray) -> dict[str, np.ndarray]:
  return {"scale": _f16(raw, 0), "nibbles": raw[..., 2:]}

def _expand_q4_0(p: dict[str, Tensor]) -> Tensor:
  """x = d * (q - 8); byte j of a block holds value j (low nibble) and value j + 16 (high nibble)."""
  q = _bit_fields(p["nibbles"], 4, -2).cast(dtypes.float32)
  return (q - 8) * p["scale"].unsqueeze(-1).unsqueeze(-1)

def _repack_q4_1(raw: np.ndarray) -> dict[str, np.ndarray]:
  return {"scale": _f16(raw, 0), "min": _f16(raw, 2), "nibbles": raw[..., 4:]}

def _expand_q4_1(p: dict[str, Tensor]) -> Tensor:
  """x = d * q + m, nibbles as Q4_0."""
  q = _bit_fields(p["nibbles"], 4, -2).cast(dtypes.float32)
  return q * p["scale"].unsqueeze(-1).unsqueeze(-1) + p["min"].unsqueeze(-1).unsqueeze(-1)

def _repack_q8_0(raw: np.ndarray) -> dict[str, np.ndarray]:
  return {"scale": _f16(raw, 0), "q": raw[..., 2:].view(np.int8)}

def _expand_q8_0(p: dict[str, Tensor]) -> Tensor:
  """x = d * q."""
  return p["q"].cast(dtypes.float32) * p["scale"].unsqueeze(-1)

def _repack_q4_k(raw: np.ndarray) -> dict[str, np.ndarray]:
  """The eight 6-bit (scale, min) pairs are multiplied out with d and dmin into float32 per group of 32."""
  low, mid, high = (raw[..., i:i + 4].astype(np.uint32) for i in (4, 8, 12))
  scales = np.concatenate([low & 0x3F, (high & 0x0F) | ((low >> 6) << 4)], -1).astype(np.float32)
  mins = np.concatenate([mid & 0x3F, (high >> 4) | ((mid >> 6) << 4)], -1).astype(np.float32)
  return {"scale": _f16(raw, 0)[..., None] * scales, "offset": _f16(raw, 2)[..., None] * mins,
          "nibbles": raw[..., 16:].reshape(*raw.shape[:-1], 4, 32)}

def _expand_q4_k(p: dict[str, Tensor]) -> Tensor:
  """x = scale[g] * q - offset[g]; 32-byte run i holds group 2i (low nibbles) and group 2i+1 (high nibbles)."""
  q = _bit_fields(p["nibbles"], 4, -2).cast(dtypes.float32)            # (rows, blocks, 4, 2, 32)
  shape = (*p["scale"].shape[:-1], 4, 2, 1)
  return q * p["scale"].reshape(shape) - p["offset"].reshape(shape)

def _repack_q6_k(raw: np.ndarray) -> dict[str, np.ndarray]:
  lead = raw.shape[:-1]
  return {"scale": _f16(raw, 208)[..., None] * raw[..., 192:208].view(np.int8).astype(np.float32),
          "low": raw[..., :128].reshape(*lead, 2, 2, 32), "high": raw[..., 128:192].reshape(*lead, 2, 32)}

def _expand_q6_k(p: dict[str, Tensor]) -> Tensor:
  """x = scale[i // 16] * (q - 32). In each half block (128 values) group g = 2f + j of 32 values takes nibble f of
  low-bit run j and 2-bit field g of the high-bit bytes."""
  low = _bit_fields(p["low"], 4, -3)                                    # (rows, blocks, half, f, j, 32)
  high = _bit_fields(p["high"], 2, -2)                                  # (rows, blocks, half, g, 32)
  lead = p["scale"].shape[:-1]
  q = (low | (high.reshape(*lead, 2, 2, 2, 32) << 4)).cast(dtypes.float32) - 32
  return q.reshape(*lead, 2, 2, 2, 2, 16) * p["scale"].reshape(*lead, 2, 2, 2, 2, 1)

@dataclass(frozen=True)
class QuantFormat:
  """How one ggml type is repacked at load and expanded in the kernel."""
  repack: Callable[[np.ndarray], dict[str, np.ndarray]]
  expand: Callable[[dict[str, Tensor]], Tensor]
  k_shape: Callable[[int], tuple[int, ...]]   # blocks per row -> the axes a row of values is split into

QUANT_FORMATS: dict[str, QuantFormat] = {
  "Q4_0": QuantFormat(_repack_q4_0, _expand_q4_0, lambda nb: (nb, 2, 16)),
  "Q4_1": QuantFormat(_repack_q4_1, _expand_q4_1, lambda nb: (nb, 2, 16)),
  "Q8_0": QuantFormat(_repack_q8_0, _expand_q8_0, lambda nb: (nb, 32)),
  "Q4_K": QuantFormat(_repack_q4_k, _expand_q4_k, lambda nb: (nb, 4, 2, 32)),
  "Q6_K": QuantFormat(_repack_q6_k, _expand_q6_k, lambda nb: (nb, 2, 2, 2, 2, 16)),
}
# a product with at least this many rows of x dequantizes the weight once into a scratch buffer (kernel-local: it is
# not kept between calls outside a TinyJit's own buffers) and runs a float32 matmul
DEQUANTIZE_MIN_ROWS = 8
PLAIN_FORMATS = {"F32": np.float32, "F16": np.float16}
SUPPORTED_TYPES = (*QUANT_FORMATS, *PLAIN_FORMATS)

class QuantizedMatrix:
  """A (rows, cols) weight matrix stored as its GGUF type's packed arrays (F32/F16: the plain values).

  `linear(x)` is `x @ W.T` and `rows(ids)` the dequantized rows `W[ids]` (an embedding lookup), both lazy; the
  dequantization happens inside the kernel that consumes it.

  >>> import numpy as np
  >>> block = np.concatenate([np.array([0.5], np.float16).view(np.uint8), np.arange(32, dtype=np.int8).view(np.uint8)])
  >>> w = QuantizedMatrix.from_blocks("Q8_0", block.reshape(1, 1, 34), (1, 32))
  >>> w.linear(Tensor.ones(1, 32)).tolist()   # 0.5 * (0 + 1 + ... + 31)
  [[248.0]]
  """
  def __init__(self, type_name: str, shape: tuple[int, int], parts: dict[str, Tensor], k_shape: tuple[int, ...]):
    self.type_name, self.shape, self.parts, self.k_shape = type_name, shape, parts, k_shape

  @classmethod
  def from_blocks(cls, type_name: str, blocks: np.ndarray, shape: tuple[int, int], device: str | None = None,
                  name: str = "weight") -> QuantizedMatrix:
    """Repack `blocks` (rows, blocks per row, block bytes) of a GGUF tensor of `type_name` and `shape`."""
    if len(shape) != 2: raise ValueError(f"QuantizedMatrix: {name} must be 2-d, got shape {shape}")
    if type_name in PLAIN_FORMATS:
      values = np.ascontiguousarray(blocks).view(PLAIN_FORMATS[type_name]).reshape(shape)
      return cls(type_name, shape, {"w": Tensor(values, device=device).realize()}, (shape[1],))
    if type_name not in QUANT_FORMATS:
      raise ValueError(f"QuantizedMatrix: {name} has type {type_name}; supported: {', '.join(SUPPORTED_TYPES)}")
    fmt = QUANT_FORMATS[type_name]
    parts = {key: Tensor(np.ascontiguousarray(arr), device=device).realize() for key, arr in fmt.repack(blocks).items()}
    return cls(type_name, shape, parts, fmt.k_shape(blocks.shape[1]))

  def _expand(self, parts: dict[str, Tensor]) -> Tensor:
    if self.type_name in PLAIN_FORMATS: return parts["w"].cast(dtypes.float32)
    return QUANT_FORMATS[self.type_name].expand(parts)

  @property
  def nbytes(self) -> int:
    """Bytes of memory the packed arrays take (what a matrix-vector product reads)."""
    return sum(p.nbytes() for p in self.parts.values())

  def dequantize(self) -> Tensor:
    """The whole matrix as float32 (rows, cols), lazy (for tests and debugging; the model never realizes it)."""
    return self._expand(self.parts).reshape(self.shape)

  def linear(self, x: Tensor) -> Tensor:
    """`x @ W.T` for x of shape (..., cols): a product with the expanded rows, summed over the row's axes."""
    if x.shape[-1] != self.shape[1]:
      raise ValueError(f"QuantizedMatrix.linear: input of shape {tuple(x.shape)} does not match a weight of shape "
                       f"{self.shape}")
    lead = tuple(x.shape[:-1])
    if math.prod(lead) >= DEQUANTIZE_MIN_ROWS and all(isinstance(n, int) for n in lead):
      # many rows (a prefill): expand the weight once into a float32 scratch buffer (transposed, so the matmul
      # heuristics see `a @ b` with b contiguous along the output) rather than once per row of x
      return x @ self.dequantize().T.contiguous()
    # broadcast the packed arrays over x's leading axes *before* expanding them: the scheduler gives a buffer to a
    # costly value that is broadcast, which here would be a float32 copy of the whole weight
    parts = {key: part.reshape(*[1] * len(lead), *part.shape).expand(*lead, *part.shape)
             for key, part in self.parts.items()}
    product = x.reshape(*lead, 1, *self.k_shape) * self._expand(parts)
    return product.sum(tuple(range(len(lead) + 1, product.ndim)))

  def rows(self, ids: Tensor) -> Tensor:
    """The dequantized rows `W[ids]` for an int Tensor `ids` of shape (n,): a gather of the packed rows, then the
    expansion (so only the needed rows are ever dequantized)."""
    picked = {key: part[ids] for key, part in self.parts.items()}
    return self._expand(picked).reshape(ids.shape[0], self.shape[1])
