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

**Integer dot products.** Where the CPU multiplies bytes into int32 dot products in a few instructions (x86 VNNI's
vpdpbusd, AVX2's pmaddubsw: `CPUTarget.byte_dot_max`), a Q4_0/Q4_1/Q8_0 matrix-vector product runs as llama.cpp's
does: the activations are quantized to int8 per block of 32 (`quantize_activations`: d = max|x| / 127, q = round(x /
d)), and each block's 32 unsigned values times those bytes is an integer dot product, scaled once per block
(`IntDotFormat`). Q4 matrices keep their nibbles in *pairs of blocks* (`_pair_nibbles`: byte j of pair p holds value
j of block 2p in its low nibble and value j of block 2p+1 in its high one), so one mask or shift gives a block's 32
values in order, the 32 bytes of one vpdpbusd operand; Q8_0 keeps q + 128 (unsigned, as vpdpbusd's first operand
must be; it needs VNNI). The error: each activation moves by at most d/2, so an output differs from the float
path's by at most sum over blocks of (max|x_b| / 254) * sum_i |w_i| (w without Q4_1's min, whose term is computed
from the float activations); test/apps/test_llm_int_dot.py checks that bound. Over SmolLM2-135M's 30 layers a
decode step's logits move by up to ~1-2 (their spread is ~25-30) and a greedy reply can differ from the float one
after a few tokens, as llama.cpp's can from the float model's: `load_model(..., int_dot=False)` keeps every product
exact to the dequantized weights.

**Prefill.** A product of many rows of x (at least DEQUANTIZE_MIN_ROWS) by an integer-dot matrix runs the same
arithmetic, with x quantized the same way, as a register tile (`_tiled_int_dot_linear`), reading a second copy of
the weight made at load (`tile_layout`: 16 rows' 4 bytes in one 64-byte run, so 4 bytes of x broadcast against them
are one vpdpbusd; about 0.75 bytes more per weight, 80 MB for SmolLM2-135M). So prefill's activations are int8 too,
as llama.cpp's are (its prefill quantizes them to q8 as well): SmolLM2-135M's first logits after a chat prompt move
by up to ~1-2 from the float path's (their range ~36; the head's own int8 product alone ~0.3), and greedy decoding of
"What is 2+2?" answers as the float model does. Only where the CPU has VNNI (`from_blocks`'s `tiled`). Measured in
bench/RESULTS.md. Other matrices (rows not a multiple of 16, fewer than TILED_MIN_ROWS) and float products
dequantize the weight once and run a float32 matmul.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Callable
import numpy as np
from kiln.codegen.parallel import FEW_OUTER_ITERATIONS
from kiln.dtype import dtypes
from kiln.helpers import VECTORIZE
from kiln.tensor import Tensor

def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """x (..., K) in blocks of 32 as llama.cpp's Q8 activations: (q, d, lane_sums) with q int8 (..., K/32, 32) = x / d
  rounded half away from zero (as llama.cpp's roundf), d float32 (..., K/32) = max|x| / 127 per block (0 for an
  all-zero block, whose q is 0), and lane_sums float32 (..., K/32, 8): the sums of x over each 4 consecutive values
  (what a Q4_1 min multiplies, one sum per lane of the product). Three small kernels."""
  blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
  # max|x| as the larger of max and -min: the same value as abs().max() (abs is x * sign(x)), 4x faster
  d = blocks.max(-1).maximum(-blocks.min(-1)) / 127
  scaled = blocks * (d > 0).where(1 / d, 0).unsqueeze(-1)
  # the cast truncates toward 0; through int32, whose vector conversion the CPU's vector code has (then the low byte)
  q = (scaled + (scaled < 0).where(-0.5, 0.5)).cast(dtypes.int32).cast(dtypes.int8).contiguous()
  lane_sums = blocks.reshape(*blocks.shape[:-1], 8, 4).sum(-1).contiguous()
  return q, d, lane_sums

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

def byte_dot_max(device: str | None = None) -> int:
  """The largest unsigned byte `device` (default: the default device) multiplies in integer dot products of bytes in
  a few instructions (CPUTarget.byte_dot_max: 255 with VNNI, 127 with AVX2), 0 where it has none: a CPU renderer
  that makes DP4A (kiln/codegen/vectorize.py), vectorizing. Always 0 on GPU targets."""
  from kiln.device import Device
  renderer = Device[Device.canonicalize(device) if device is not None else Device.DEFAULT].renderer
  # GPU targets (blocks and threads: CUDA) get float products: the byte dot products come from the CPU renderer's
  # vector pass, which a GPU renderer does not run, and a decode step there is bound by its kernel count, not bytes
  if renderer.has_local: return 0
  if not VECTORIZE or not getattr(renderer, "renders_byte_dots", False): return 0
  return int(getattr(renderer.target, "byte_dot_max", 0))

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

def _pair_nibbles(nibbles: np.ndarray) -> np.ndarray:
  """GGUF's Q4 nibbles (rows, blocks, 16) -> pairs of blocks (rows, blocks/2, 32): byte j of pair p holds value j of
  block 2p (low nibble) and of block 2p+1 (high nibble); a block's value j < 16 is byte j's low nibble, j >= 16 byte
  j-16's high one."""
  values = np.concatenate([nibbles & 15, nibbles >> 4], -1)                 # (rows, blocks, 32) in value order
  return (values[:, 0::2] | (values[:, 1::2] << 4)).astype(np.uint8)

def _paired(repack: Callable[[np.ndarray], dict[str, np.ndarray]]) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
  """A Q4_0/Q4_1 repack whose nibbles come in pairs of blocks (`_pair_nibbles`)."""
  def paired(raw: np.ndarray) -> dict[str, np.ndarray]:
    parts = repack(raw)
    parts["pairs"] = _pair_nibbles(parts.pop("nibbles"))
    return parts
  return paired

def _paired_values(p: dict[str, Tensor]) -> Tensor:
  """The 4-bit values of paired nibbles (rows, pairs, 32) as uint8 (rows, pairs, 2, 32): block 2p+f, value j."""
  return _bit_fields(p["pairs"], 4, -2)

def _block_scales(p: dict[str, Tensor], name: str) -> Tensor:
  """A per-block array (rows, blocks) as (rows, blocks/2, 2, 1), to scale paired values."""
  part = p[name]
  return part.reshape(*part.shape[:-1], part.shape[-1] // 2, 2, 1)

def _expand_q4_0_pairs(p: dict[str, Tensor]) -> Tensor:
  return (_paired_values(p).cast(dtypes.float32) - 8) * _block_scales(p, "scale")

def _expand_q4_1_pairs(p: dict[str, Tensor]) -> Tensor:
  return _paired_values(p).cast(dtypes.float32) * _block_scales(p, "scale") + _block_scales(p, "min")

def _repack_q8_0(raw: np.ndarray) -> dict[str, np.ndarray]:
  return {"scale": _f16(raw, 0), "q": raw[..., 2:].view(np.int8)}

def _expand_q8_0(p: dict[str, Tensor]) -> Tensor:
  """x = d * q."""
  return p["q"].cast(dtypes.float32) * p["scale"].unsqueeze(-1)

def _repack_q8_0_unsigned(raw: np.ndarray) -> dict[str, np.ndarray]:
  """Q8_0 with each int8 q stored as the uint8 q + 128 (vpdpbusd multiplies unsigned by signed bytes)."""
  return {"scale": _f16(raw, 0), "values": raw[..., 2:] ^ np.uint8(0x80)}

def _expand_q8_0_unsigned(p: dict[str, Tensor]) -> Tensor:
  """x = d * (v - 128)."""
  return (p["values"].cast(dtypes.float32) - 128) * p["scale"].unsqueeze(-1)

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
@dataclass(frozen=True)
class IntDotFormat(QuantFormat):
  """A layout for integer dot products: each block's 32 values as unsigned bytes of at most `largest`, and the weight
  `scale * (v - zero)` (Q4_1: `scale * v + min`, zero None). `k_shape(nb)` ends in the 32 values of a block."""
  largest: int = 15
  zero: int | None = None
  paired: bool = True   # blocks in pairs (Q4 nibbles): a row needs an even number of them

  def allows(self, blocks: int) -> bool:
    """Whether a row of `blocks` blocks fits the layout."""
    return not self.paired or blocks % 2 == 0

# the integer dot product's layouts (module docstring): Q4_0/Q4_1 nibbles in pairs of blocks, Q8_0 as q + 128
INT_DOT_FORMATS: dict[str, IntDotFormat] = {
  "Q4_0": IntDotFormat(_paired(_repack_q4_0), _expand_q4_0_pairs, lambda nb: (nb // 2, 2, 32), 15, 8),
  "Q4_1": IntDotFormat(_paired(_repack_q4_1), _expand_q4_1_pairs, lambda nb: (nb // 2, 2, 32), 15, None),
  "Q8_0": IntDotFormat(_repack_q8_0_unsigned, _expand_q8_0_unsigned, lambda nb: (nb, 32), 255, 128, paired=False),
}
# a product with at least this many rows of x dequantizes the weight once into a scratch buffer (kernel-local: it is
# not kept between calls outside a TinyJit's own buffers) and runs a float32 matmul; with integer dot products it
# runs the tiled integer product instead (`_tiled_int_dot_linear`)
DEQUANTIZE_MIN_ROWS = 8
TILE_ROWS = 16   # the weight rows of one group of the tiled layout (`tile_layout`): one int32 lane each
# the fewest rows a tiled matrix has: its kernel's outer loop (the groups of 16 rows) must be long enough to be split
# across threads (kiln/codegen/parallel.py FEW_OUTER_ITERATIONS); a shorter one becomes a split reduction whose
# vector code the C renderer refuses (its chunks would change), so a small matrix dequantizes instead
TILED_MIN_ROWS = TILE_ROWS * FEW_OUTER_ITERATIONS
# the fewest rows of x a tiled integer product takes: each prefill bucket compiles its own kernels, and the tiled
# ones cost seconds of codegen the first time (bench/RESULTS.md, twelfth session), repaid only over long prompts; a
# shorter prefill (a chat turn) dequantizes instead, whose kernels compile in a fraction of that
TILED_MIN_X_ROWS = 128

def tile_layout(fmt: IntDotFormat, parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """An integer-dot matrix's arrays (`fmt.repack`: rows first) in the layout of the tiled product of many rows
  (`QuantizedMatrix._tiled_int_dot_linear`): `tiles` uint8 (rows/16, groups, 8, 16, 4), byte 4g+k of group j of row
  16i+l at [i, j, g, l, k] (a group: a pair of Q4 blocks, low and high nibbles, or one Q8_0 block), so that 16 rows'
  4 bytes are one 64-byte run (one vpdpbusd operand, against 4 bytes of x broadcast); `tile_scale` and
  `tile_offset` float32 (rows/16, groups, fields, 16): each block's scale, and its offset (Q4_1's min, else
  -zero * scale) per row."""
  raw = parts["pairs"] if "pairs" in parts else parts["values"]          # (rows, groups, 32)
  rows, groups = raw.shape[:2]
  tiles = raw.reshape(rows // TILE_ROWS, TILE_ROWS, groups, 8, 4).transpose(0, 2, 3, 1, 4)
  fields = 2 if "pairs" in parts else 1
  def per_block(values: np.ndarray) -> np.ndarray:   # (rows, blocks) -> (rows/16, groups, fields, 16)
    return values.reshape(rows // TILE_ROWS, TILE_ROWS, groups, fields).transpose(0, 2, 3, 1)
  offset = parts["min"] if fmt.zero is None else parts["scale"] * -fmt.zero
  return {"tiles": np.ascontiguousarray(tiles), "tile_scale": np.ascontiguousarray(per_block(parts["scale"])),
          "tile_offset": np.ascontiguousarray(per_block(offset.astype(np.float32)))}
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
  def __init__(self, type_name: str, shape: tuple[int, int], parts: dict[str, Tensor], k_shape: tuple[int, ...],
               int_dot: bool = False):
    self.type_name, self.shape, self.parts, self.k_shape, self.int_dot = type_name, shape, parts, k_shape, int_dot

  @classmethod
  def from_blocks(cls, type_name: str, blocks: np.ndarray, shape: tuple[int, int], device: str | None = None,
                  name: str = "weight", int_dot: bool | None = None, tiled: bool | None = None) -> QuantizedMatrix:
    """Repack `blocks` (rows, blocks per row, block bytes) of a GGUF tensor of `type_name` and `shape`. `int_dot`:
    whether products use integer dot products (module docstring); None: where the type allows it
    (`allows_int_dot`) and the device's CPU multiplies its values (`byte_dot_max`: Q8_0's need VNNI). `tiled`:
    with int_dot and rows a multiple of TILE_ROWS (at least TILED_MIN_ROWS), also keep the tiled layout, so that a
    product of many rows of x (a prefill) is an integer product too (`tile_layout`); None: where the CPU multiplies
    any byte in one instruction (VNNI: `byte_dot_max` 255; AVX2's pmaddubsw made SmolLM2's prefill products only
    3-25% faster than float ones, bench/RESULTS.md, not worth their error); False: such products dequantize the
    weight (an embedding, read by rows and by one row of x, needs no tiles)."""
    if len(shape) != 2: raise ValueError(f"QuantizedMatrix: {name} must be 2-d, got shape {shape}")
    if type_name in PLAIN_FORMATS:
      values = np.ascontiguousarray(blocks).view(PLAIN_FORMATS[type_name]).reshape(shape)
      return cls(type_name, shape, {"w": Tensor(values, device=device).realize()}, (shape[1],))
    if type_name not in QUANT_FORMATS:
      raise ValueError(f"QuantizedMatrix: {name} has type {type_name}; supported: {', '.join(SUPPORTED_TYPES)}")
    if int_dot and not cls.allows_int_dot(type_name, blocks.shape[1]):
      raise ValueError(f"QuantizedMatrix: {name}: integer dot products need Q4_0/Q4_1 with an even number of blocks "
                       f"per row or Q8_0, got {type_name} with {blocks.shape[1]}")
    if int_dot is None:
      int_dot = cls.allows_int_dot(type_name, blocks.shape[1]) and \
        byte_dot_max(device) >= INT_DOT_FORMATS[type_name].largest
    fmt = INT_DOT_FORMATS[type_name] if int_dot else QUANT_FORMATS[type_name]
    arrays = fmt.repack(blocks)
    # the tiled layout for products of many rows (a prefill), besides the decode layout (module docstring)
    if tiled is None: tiled = byte_dot_max(device) >= 255
    if int_dot and tiled and shape[0] % TILE_ROWS == 0 and shape[0] >= TILED_MIN_ROWS:
      arrays.update(tile_layout(fmt, arrays))
    parts = {key: Tensor(np.ascontiguousarray(arr), device=device).realize() for key, arr in arrays.items()}
    return cls(type_name, shape, parts, fmt.k_shape(blocks.shape[1]), int_dot)

  @staticmethod
  def allows_int_dot(type_name: str, blocks: int) -> bool:
    """Whether a `type_name` matrix of `blocks` blocks per row can use integer dot products."""
    return type_name in INT_DOT_FORMATS and INT_DOT_FORMATS[type_name].allows(blocks)

  def _expand(self, parts: dict[str, Tensor]) -> Tensor:
    if self.type_name in PLAIN_FORMATS: return parts["w"].cast(dtypes.float32)
    return (INT_DOT_FORMATS if self.int_dot else QUANT_FORMATS)[self.type_name].expand(parts)

  @property
  def decode_parts(self) -> dict[str, Tensor]:
    """The arrays a matrix-vector product and a row lookup read (all but the tiled layout's)."""
    return {key: part for key, part in self.parts.items() if not key.startswith("tile")}

  @property
  def nbytes(self) -> int:
    """Bytes of memory the packed arrays a matrix-vector product reads take (the tiled layout's not counted)."""
    return sum(p.nbytes() for p in self.decode_parts.values())

  def dequantize(self) -> Tensor:
    """The whole matrix as float32 (rows, cols), lazy (for tests and debugging; the model never realizes it)."""
    return self._expand(self.decode_parts).reshape(self.shape)

  def linear(self, x: Tensor, activations: tuple[Tensor, ...] | None = None) -> Tensor:
    """`x @ W.T` for x of shape (..., cols): a product with the expanded rows, summed over the row's axes.
    `activations`: `quantize_activations(x)` made once for several matrices with integer dot products (the same x
    quantized once); the others ignore it."""
    if x.shape[-1] != self.shape[1]:
      raise ValueError(f"QuantizedMatrix.linear: input of shape {tuple(x.shape)} does not match a weight of shape "
                       f"{self.shape}")
    lead = tuple(x.shape[:-1])
    many = math.prod(lead) >= DEQUANTIZE_MIN_ROWS and all(isinstance(n, int) for n in lead)
    if many and "tiles" in self.parts and math.prod(lead) >= TILED_MIN_X_ROWS:
      return self._tiled_int_dot_linear(x, activations)
    if many:
      # many rows (a prefill): expand the weight once into a float32 scratch buffer rather than once per row of x,
      # row by row (written transposed, its stores were strided: SmolLM2's 147-token prefill spent 154 of 776 ms
      # expanding; the matmul copies the transposed operand into its packed layout anyway, kiln/schedule/pack.py)
      return x @ self.dequantize().contiguous().T
    # broadcast the packed arrays over x's leading axes *before* expanding them: the scheduler gives a buffer to a
    # costly value that is broadcast, which here would be a float32 copy of the whole weight
    parts = {key: part.reshape(*[1] * len(lead), *part.shape).expand(*lead, *part.shape)
             for key, part in self.decode_parts.items()}
    if self.int_dot: return self._int_dot_linear(x, parts, activations)
    product = x.reshape(*lead, 1, *self.k_shape) * self._expand(parts)
    return product.sum(tuple(range(len(lead) + 1, product.ndim)))

  def _int_dot_linear(self, x: Tensor, parts: dict[str, Tensor], activations: tuple[Tensor, ...] | None) -> Tensor:
    """`x @ W.T` with x quantized to int8 blocks: per block, the int32 dot product of its 32 unsigned values and the
    bytes (four explicit sums of 4 products each per lane of 8: the C renderer makes each block one vpdpbusd), times
    both scales, plus the block's offset (Q4_1's min, else -zero * scale) times the float sums of x."""
    lead, fmt = tuple(x.shape[:-1]), INT_DOT_FORMATS[self.type_name]
    blocks = self.k_shape[:-1]   # (pairs, 2) or (blocks,)
    q, d, lane_sums = quantize_activations(x) if activations is None else activations
    values = parts["values"] if "values" in parts else _paired_values(parts)
    values = values.reshape(*values.shape[:-1], 8, 4).cast(dtypes.int32)
    product = values * q.reshape(*lead, 1, *blocks, 8, 4).cast(dtypes.int32)
    dots = product[..., 0] + product[..., 1] + product[..., 2] + product[..., 3]   # (..., rows, *blocks, 8)
    scale = parts["scale"].reshape(*parts["scale"].shape[:-1], *blocks, 1)
    offset = parts["min"].reshape(scale.shape) if fmt.zero is None else scale * -fmt.zero
    terms = dots.cast(dtypes.float32) * (scale * d.reshape(*lead, 1, *blocks, 1)) + \
      offset * lane_sums.reshape(*lead, 1, *blocks, 8)
    return terms.sum(tuple(range(-len(blocks) - 1, 0)))

  def _tiled_int_dot_linear(self, x: Tensor, activations: tuple[Tensor, ...] | None) -> Tensor:
    """`x @ W.T` for many rows of x with the tiled layout (`tile_layout`): the same arithmetic as `_int_dot_linear`
    (x quantized per block of 32, an integer dot product per block, times both scales, plus the offset times the
    block's float sum), laid out as a register tile: each block's 32 products are one explicit int32 sum per output
    (the vectorizer makes 16 rows of them eight chained vpdpbusd, with x's 4 bytes broadcast), converted and scaled
    once per block."""
    lead, rows = tuple(x.shape[:-1]), self.shape[0]
    n = math.prod(lead)
    q, d, lane_sums = quantize_activations(x) if activations is None else activations
    tiles, groups = self.parts["tiles"], self.parts["tiles"].shape[1]
    fields = self.parts["tile_scale"].shape[2]
    # the packed bytes broadcast over x's rows before they are unpacked: the scheduler gives a buffer to a costly
    # value that is broadcast (here a copy of the unpacked weight)
    packed = tiles.reshape(1, rows // TILE_ROWS, groups, 1, 8, TILE_ROWS, 4).expand(
      n, rows // TILE_ROWS, groups, 1, 8, TILE_ROWS, 4)
    if fields == 2:
      shifts = (Tensor.arange(2, device=tiles.device, dtype=dtypes.uint8) * 4).reshape(1, 1, 1, 2, 1, 1, 1)
      values = (packed >> shifts) & 15
    else: values = packed
    product = values.cast(dtypes.int32) * q.reshape(n, 1, groups, fields, 8, 1, 4).cast(dtypes.int32)
    terms = [product[:, :, :, :, g, :, k] for g in range(8) for k in range(4)]
    while len(terms) > 1: terms = [terms[i] + terms[i + 1] for i in range(0, len(terms), 2)]
    dots = terms[0]                                                        # (n, rows/16, groups, fields, 16)
    block_d = d.reshape(n, 1, groups, fields, 1)
    # each block's float sum from its lane sums (two small kernels: one sum over 32 ran 3x slower than both)
    block_sums = lane_sums.sum(-1).reshape(n, 1, groups, fields, 1)
    out = dots.cast(dtypes.float32) * (self.parts["tile_scale"] * block_d) + self.parts["tile_offset"] * block_sums
    return out.sum((2, 3)).reshape(*lead, rows)

  def rows(self, ids: Tensor) -> Tensor:
    """The dequantized rows `W[ids]` for an int Tensor `ids` of shape (n,): a gather of the packed rows, then the
    expansion (so only the needed rows are ever dequantized)."""
    picked = {key: part[ids] for key, part in self.decode_parts.items()}
    return self._expand(picked).reshape(ids.shape[0], self.shape[1])
