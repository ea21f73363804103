"""GGUF files (llama.cpp's model format): read the header and metadata, and turn tensor data into Tensors.

A GGUF file is a little-endian header (magic, version, counts, key/value metadata, tensor infos) followed by an
aligned data section. Quantized tensors are stored as blocks (a few float16 scales plus packed small integers per
32 or 256 values); `dequantize_blocks` expands them with Tensor ops (bitcast, shifts, masks, multiplies), so the work
runs as one lazy graph per tensor on the file tensor's device. docs/gguf.md describes the format and the API.
"""
from __future__ import annotations
import os, pathlib, struct
from dataclasses import dataclass
from typing import Any, Callable
import numpy as np
from kiln.dtype import DType, dtypes
from kiln.device import Device
from kiln.tensor import Tensor

# ---------------- tensor types ----------------

@dataclass(frozen=True)
class GGMLType:
  """How one ggml tensor type is stored: `block_size` values in `block_bytes` bytes, and the dtype it loads as."""
  name: str
  block_size: int
  block_bytes: int
  dtype: DType

# The types kiln loads, by ggml type id. Plain types are blocks of one value and keep their stored dtype (float16
# stays float16, as tinygrad); quantized types dequantize to float32.
GGML_TYPES: dict[int, GGMLType] = {
  0: GGMLType("F32", 1, 4, dtypes.float32), 1: GGMLType("F16", 1, 2, dtypes.float16),
  2: GGMLType("Q4_0", 32, 18, dtypes.float32), 3: GGMLType("Q4_1", 32, 20, dtypes.float32),
  8: GGMLType("Q8_0", 32, 34, dtypes.float32), 12: GGMLType("Q4_K", 256, 144, dtypes.float32),
  14: GGMLType("Q6_K", 256, 210, dtypes.float32), 24: GGMLType("I8", 1, 1, dtypes.int8),
  25: GGMLType("I16", 1, 2, dtypes.int16), 26: GGMLType("I32", 1, 4, dtypes.int32),
  27: GGMLType("I64", 1, 8, dtypes.int64), 28: GGMLType("F64", 1, 8, dtypes.float64),
  30: GGMLType("BF16", 1, 2, dtypes.bfloat16),
}
# names of the ggml types kiln does not load, so an error can say what the file holds
_UNSUPPORTED_TYPE_NAMES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K", 15: "Q8_K",
                           16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
                           22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}

def ggml_type_name(ggml_type: int) -> str:
  """The ggml name of a type id ("Q4_1" for 3), or "unknown type N"."""
  known = GGML_TYPES.get(ggml_type)
  return known.name if known else _UNSUPPORTED_TYPE_NAMES.get(ggml_type, f"unknown type {ggml_type}")

def _ggml_type(ggml_type: int, op: str) -> GGMLType:
  if ggml_type not in GGML_TYPES:
    supported = ", ".join(f"{t.name} ({i})" for i, t in GGML_TYPES.items())
    raise ValueError(f"{op}: ggml type {ggml_type_name(ggml_type)} ({ggml_type}) is not supported; "
                     f"supported: {supported}")
  return GGML_TYPES[ggml_type]

# ---------------- dequantization ----------------

def _half(blocks: Tensor, start: int) -> Tensor:
  """The float16 at byte `start` of each block, as float32 of shape (..., 1)."""
  return blocks[..., start:start + 2].bitcast(dtypes.float16).cast(dtypes.float32)

def _bit_fields(packed: Tensor, bits: int) -> Tensor:
  """(..., n) uint8 -> (..., 8 // bits, n): field i holds bits [i*bits, (i+1)*bits) of each byte.

  The shifts come from an arange rather than a constant buffer, so the expansion stays index arithmetic that fuses
  into whatever kernel reads it (a matmul that dequantizes as it goes)."""
  fields = 8 // bits
  shifts = (Tensor.arange(fields, device=packed.device, dtype=dtypes.uint8) * bits).reshape(fields, 1)
  return (packed.unsqueeze(-2) >> shifts) & ((1 << bits) - 1)

def _q4_0(blocks: Tensor) -> Tensor:
  """d (f16), 16 bytes of 4-bit q: x = d * (q - 8); low nibbles are values 0-15, high nibbles 16-31."""
  q = _bit_fields(blocks[..., 2:], 4).flatten(-2).cast(dtypes.float32)
  return _half(blocks, 0) * (q - 8)

def _q4_1(blocks: Tensor) -> Tensor:
  """d, m (f16), 16 bytes of 4-bit q: x = d * q + m, nibbles ordered as Q4_0."""
  q = _bit_fields(blocks[..., 4:], 4).flatten(-2).cast(dtypes.float32)
  return _half(blocks, 0) * q + _half(blocks, 2)

def _q8_0(blocks: Tensor) -> Tensor:
  """d (f16), 32 int8 q: x = d * q."""
  return _half(blocks, 0) * blocks[..., 2:].bitcast(dtypes.int8).cast(dtypes.float32)

def _q4_k(blocks: Tensor) -> Tensor:
  """d, dmin (f16), 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of 4-bit q in 8 groups of 32 values:
  x = d*scale[g] * q - dmin*min[g]. Each 32-byte run gives two groups: its low nibbles, then its high nibbles."""
  low, mid, high = blocks[..., 4:8], blocks[..., 8:12], blocks[..., 12:16]
  # groups 0-3 keep their 6 bits in `low` (scales) and `mid` (mins); groups 4-7 take 4 bits from `high` and their
  # top 2 bits from the spare top bits of `low` / `mid`
  scales = (low & 0x3F).cat((high & 0x0F) | ((low >> 6) << 4), dim=-1).cast(dtypes.float32)
  mins = (mid & 0x3F).cat((high >> 4) | ((mid >> 6) << 4), dim=-1).cast(dtypes.float32)
  lead = blocks.shape[:-1]
  q = _bit_fields(blocks[..., 16:].reshape(*lead, 4, 32), 4).reshape(*lead, 8, 32).cast(dtypes.float32)
  scale = (_half(blocks, 0) * scales).unsqueeze(-1)
  offset = (_half(blocks, 2) * mins).unsqueeze(-1)
  return (scale * q - offset).reshape(*lead, 256)

def _q6_k(blocks: Tensor) -> Tensor:
  """128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales, d (f16): x = d*scale[i // 16] * (q - 32).

  Each half block (128 values) takes 64 low-bit bytes (their low nibbles, then their high nibbles) and 32 high-bit
  bytes (2 bits for each run of 32 values)."""
  lead = blocks.shape[:-1]
  low_bits = _bit_fields(blocks[..., :128].reshape(*lead, 2, 64), 4).reshape(*lead, 2, 4, 32)
  high_bits = _bit_fields(blocks[..., 128:192].reshape(*lead, 2, 32), 2)
  q = (low_bits | (high_bits << 4)).reshape(*lead, 16, 16).cast(dtypes.float32) - 32
  scale = (_half(blocks, 208) * blocks[..., 192:208].bitcast(dtypes.int8).cast(dtypes.float32)).unsqueeze(-1)
  return (scale * q).reshape(*lead, 256)

_DEQUANTIZERS: dict[int, Callable[[Tensor], Tensor]] = {2: _q4_0, 3: _q4_1, 8: _q8_0, 12: _q4_k, 14: _q6_k}

def dequantize_blocks(blocks: Tensor, ggml_type: int) -> Tensor:
  """(..., block_bytes) uint8 blocks of `ggml_type` -> (..., block_size) values (lazy Tensor ops, same device).

  Quantized types give float32; plain types give their own dtype (F16 -> float16, BF16 -> bfloat16, I32 -> int32).
  Used by `gguf_load`, and by code that keeps weights quantized and expands them inside the kernel that uses them.

  >>> import numpy as np
  >>> block = np.concatenate([np.array([0.5], np.float16).view(np.uint8), np.arange(32, dtype=np.int8).view(np.uint8)])
  >>> dequantize_blocks(Tensor(block.reshape(1, 34)), 8)[0, :4].tolist()   # Q8_0: 0.5 * q
  [0.0, 0.5, 1.0, 1.5]
  """
  kind = _ggml_type(ggml_type, "dequantize_blocks")
  if not isinstance(blocks, Tensor) or blocks.dtype != dtypes.uint8 or blocks.ndim == 0 \
     or blocks.shape[-1] != kind.block_bytes:
    got = f"{blocks.dtype} {tuple(blocks.shape)}" if isinstance(blocks, Tensor) else type(blocks).__name__
    raise ValueError(f"dequantize_blocks: {kind.name} needs uint8 blocks of shape (..., {kind.block_bytes}), got {got}")
  if kind.block_size == 1: return blocks.bitcast(kind.dtype)
  return _DEQUANTIZERS[ggml_type](blocks)

def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
  """The first `n` values stored as `ggml_type` at the start of the 1-d uint8 tensor `t` (tinygrad's helper).

  Plain types (F32, F16, BF16, I8...) give a flat (n,) Tensor of their dtype; quantized types give float32 in
  blocks, shaped (n // block_size, block_size), as tinygrad returns them (reshape to the tensor's shape).

  >>> import numpy as np
  >>> block = np.concatenate([np.array([0.5], np.float16).view(np.uint8), np.arange(32, dtype=np.int8).view(np.uint8)])
  >>> ggml_data_to_tensor(Tensor(block), 32, 8).shape   # Q8_0: one block of 32
  (1, 32)
  """
  kind = _ggml_type(ggml_type, "ggml_data_to_tensor")
  if n % kind.block_size:
    raise ValueError(f"ggml_data_to_tensor: {n} values do not fill whole {kind.name} blocks of {kind.block_size}")
  nbytes = n // kind.block_size * kind.block_bytes
  if t.ndim != 1 or t.dtype != dtypes.uint8 or t.shape[0] < nbytes:
    raise ValueError(f"ggml_data_to_tensor: {n} {kind.name} values need a 1-d uint8 tensor of at least {nbytes} "
                     f"bytes, got {t.dtype} {tuple(t.shape)}")
  values = dequantize_blocks(t[:nbytes].reshape(n // kind.block_size, kind.block_bytes), ggml_type)
  return values.reshape(n) if kind.block_size == 1 else values

# ---------------- the file ----------------

@dataclass(frozen=True)
class GGUFTensorInfo:
  """One tensor of a GGUF file, still in its stored (possibly quantized) form.

  `shape` is row-major (the file's dims reversed, as the `gguf` package and tinygrad give it); `offset` is the
  absolute byte offset of its data in the file; `blocks` is a uint8 view of the data of shape
  (*shape[:-1], shape[-1] // block_size, block_bytes): each row of a weight matrix is a run of blocks.
  `dequantize()` gives the values (lazy); `dequantize_blocks(info.blocks, info.ggml_type)` does the same per block.
  """
  name: str
  shape: tuple[int, ...]
  ggml_type: int
  offset: int
  blocks: Tensor

  @property
  def type_name(self) -> str: return GGML_TYPES[self.ggml_type].name
  @property
  def nbytes(self) -> int: return self.blocks.numel()

  def dequantize(self) -> Tensor:
    """The tensor's values in `shape` (float32 for quantized types, the stored dtype for plain ones)."""
    return dequantize_blocks(self.blocks, self.ggml_type).reshape(self.shape)

# (struct format, size) of each fixed-size metadata value type; 8 is a string, 9 an array
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_FORMATS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
                  11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_MAX_ARRAY_NESTING = 64   # nested arrays are parsed recursively; deeper nesting is a corrupt file, not a model
_MAX_DIMS = 4             # GGML_MAX_DIMS

def _smallest_value_bytes(value_type: int) -> int:
  """The fewest bytes a value of this type can take (arrays of corrupt counts are refused before looping)."""
  if value_type in _SCALAR_FORMATS: return struct.calcsize(_SCALAR_FORMATS[value_type])
  return 8 if value_type == _STRING else 12   # a string's length; an array's element type and count

class _HeaderReader:
  """Reads the header from the front of the file in growing chunks (the data section, usually almost all of the
  file, is never read here)."""
  def __init__(self, file: _FileBytes):
    self.file, self.label, self.size = file, file.label, file.size
    self.data, self.pos = b"", 0

  def fail(self, message: str, at: int | None = None) -> ValueError:
    return ValueError(f"gguf_load: {self.label}: {message} (at byte offset {self.pos if at is None else at})")

  def ensure(self, n: int, what: str | Callable[[], str]) -> None:
    """Make `data` hold the `n` bytes at `pos`, fetching a chunk at least as large as what was read so far."""
    end = self.pos + n
    if end <= len(self.data): return
    if end > self.size:
      described = what if isinstance(what, str) else what()
      raise self.fail(f"truncated: {described} needs {n} bytes but the file ends at {self.size} bytes")
    chunk_end = min(self.size, max(end, 2 * len(self.data), 1 << 20))
    self.data += self.file.read(len(self.data), chunk_end)

  def take(self, n: int, what: str) -> bytes:
    self.ensure(n, what)
    out, self.pos = self.data[self.pos:self.pos + n], self.pos + n
    return out

  def scalar(self, fmt: str, what: str) -> Any:
    return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

  def count(self, what: str, item_bytes: int) -> int:
    """A uint64 count of items that each take at least `item_bytes` bytes, checked against what the file holds."""
    start, n = self.pos, self.scalar("<Q", what)
    if n * item_bytes > self.size - self.pos:
      raise self.fail(f"{what} is {n}, more than the {self.size - self.pos} bytes left in the file can hold "
                      f"(truncated or corrupt)", start)
    return n

  def string(self, what: str) -> str:
    start = self.pos
    raw = self.take(self.count(f"length of {what}", 1), what)
    try: return raw.decode("utf-8")
    except UnicodeDecodeError as e: raise self.fail(f"{what} is not valid UTF-8 ({e.reason})", start) from None

  def strings(self, n: int, what: str) -> list[str]:
    """`n` strings in a row (a vocabulary: tens of thousands), without the per-value overhead of `string`."""
    out, read_length = [], struct.Struct("<Q").unpack_from
    for i in range(n):
      start = self.pos
      self.ensure(8, lambda: f"length of {what}[{i}]")
      (length,) = read_length(self.data, start)
      self.pos += 8
      self.ensure(length, lambda: f"{what}[{i}]")
      try: out.append(self.data[self.pos:self.pos + length].decode("utf-8"))
      except UnicodeDecodeError as e: raise self.fail(f"{what}[{i}] is not valid UTF-8 ({e.reason})", start) from None
      self.pos += length
    return out

  def value(self, value_type: int, what: str, depth: int = 0) -> Any:
    if value_type in _SCALAR_FORMATS: return self.scalar(_SCALAR_FORMATS[value_type], what)
    if value_type == _STRING: return self.string(what)
    if value_type != _ARRAY: raise self.fail(f"{what} has unknown value type {value_type}", self.pos - 4)
    if depth >= _MAX_ARRAY_NESTING: raise self.fail(f"{what} nests arrays more than {_MAX_ARRAY_NESTING} deep")
    start = self.pos
    item_type = self.scalar("<I", f"element type of {what}")
    if item_type not in _SCALAR_FORMATS and item_type not in (_STRING, _ARRAY):
      raise self.fail(f"{what} is an array of unknown value type {item_type}", start)
    n = self.count(f"length of array {what}", _smallest_value_bytes(item_type))
    if item_type in _NUMPY_FORMATS:   # one NumPy read for long numeric arrays (token types, scores)
      values = np.frombuffer(self.take(n * _smallest_value_bytes(item_type), what), _NUMPY_FORMATS[item_type])
      return values.astype(bool).tolist() if item_type == 7 else values.tolist()
    if item_type == _STRING: return self.strings(n, what)
    return [self.value(item_type, f"{what}[{i}]", depth + 1) for i in range(n)]

def _read_metadata(reader: _HeaderReader) -> tuple[dict[str, Any], int]:
  """Magic, version and metadata; returns the metadata and the tensor count."""
  magic = reader.take(4, "the magic")
  if magic != b"GGUF": raise reader.fail(f"not a GGUF file: the magic is {magic!r}, expected b'GGUF'", 0)
  version = reader.scalar("<I", "the version")
  if version not in (2, 3):
    hint = " (a big-endian file; kiln reads little-endian GGUF)" if version & 0xFFFF == 0 else \
           " (version 1 is an old draft of the format)" if version == 1 else ""
    raise reader.fail(f"GGUF version {version} is not supported, only 2 and 3{hint}", 4)
  tensor_count = reader.count("tensor count", 24)   # a tensor info takes at least 8+4+4+8 bytes
  kv_count = reader.count("metadata count", 13)     # a key/value pair takes at least 8+4+1 bytes
  metadata: dict[str, Any] = {}
  for i in range(kv_count):
    key = reader.string(f"metadata key {i}")
    value_type = reader.scalar("<I", f"value type of metadata {key!r}")
    if key in metadata: raise reader.fail(f"metadata key {key!r} appears twice")
    metadata[key] = reader.value(value_type, f"metadata {key!r}")
  return metadata, tensor_count

def _alignment(reader: _HeaderReader, metadata: dict[str, Any]) -> int:
  alignment = metadata.get("general.alignment", 32)
  if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
    raise reader.fail(f"general.alignment must be a positive power of two, got {alignment!r}")
  return alignment

def _read_tensor_infos(reader: _HeaderReader, tensor_count: int) -> list[tuple[str, tuple[int, ...], int, int]]:
  """(name, row-major shape, ggml type, offset in the data section) of each tensor."""
  infos, names = [], set()
  for i in range(tensor_count):
    start = reader.pos
    name = reader.string(f"name of tensor {i}")
    n_dims = reader.scalar("<I", f"dimension count of tensor {name!r}")
    if n_dims > _MAX_DIMS: raise reader.fail(f"tensor {name!r} has {n_dims} dimensions, at most {_MAX_DIMS} allowed")
    dims = [reader.scalar("<Q", f"dimensions of tensor {name!r}") for _ in range(n_dims)]
    ggml_type = reader.scalar("<I", f"type of tensor {name!r}")
    offset = reader.scalar("<Q", f"data offset of tensor {name!r}")
    if name in names: raise reader.fail(f"tensor {name!r} appears twice", start)
    if any(d >= 1 << 48 for d in dims): raise reader.fail(f"tensor {name!r} has impossible dimensions {dims}", start)
    names.add(name)
    infos.append((name, tuple(reversed(dims)), ggml_type, offset))
  return infos

def _tensor_info(reader: _HeaderReader, data_start: int, alignment: int,
                 name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> GGUFTensorInfo:
  """Check one tensor against its type and the file's size, and make its block view."""
  where = f"tensor {name!r} ({ggml_type_name(ggml_type)}, shape {shape})"
  if ggml_type not in GGML_TYPES:
    supported = ", ".join(t.name for t in GGML_TYPES.values())
    raise reader.fail(f"{where} has a type kiln cannot load; supported: {supported}", data_start + offset)
  kind = GGML_TYPES[ggml_type]
  row = shape[-1] if shape else 1
  if row % kind.block_size:
    raise reader.fail(f"{where}: rows of {row} values do not fill whole {kind.block_size}-value blocks")
  if offset % alignment: raise reader.fail(f"{where}: data offset {offset} is not a multiple of {alignment}")
  start = data_start + offset
  nbytes = int(np.prod(shape, dtype=object)) // kind.block_size * kind.block_bytes
  if start + nbytes > reader.size:
    raise reader.fail(f"{where} needs bytes [{start}, {start + nbytes}) but the file has only {reader.size}", start)
  blocks = reader.file.tensor(start, start + nbytes).reshape(*shape[:-1], row // kind.block_size, kind.block_bytes)
  return GGUFTensorInfo(name, shape, ggml_type, start, blocks)

class _FileBytes:
  """The bytes of a GGUF file: `read` copies a range to the host (for the header), `tensor` gives a range as a uint8
  Tensor with a buffer of its own on the device that computes (so the kernels of equal-shaped tensors are one
  compiled program, never one per offset, and the whole file need not stay alive)."""
  def __init__(self, label: str, size: int, device: str, host: np.ndarray | None = None, disk: Tensor | None = None):
    self.label, self.size, self.device, self.host, self.disk = label, size, device, host, disk

  def read(self, start: int, end: int) -> bytes:
    return self.host[start:end].tobytes() if self.host is not None else self.disk[start:end].numpy().tobytes()

  def tensor(self, start: int, end: int) -> Tensor:
    if self.host is not None: return Tensor(self.host[start:end], device=self.device)
    return self.disk[start:end].to(self.device)

def _open(source: Tensor | str | os.PathLike) -> _FileBytes:
  """The file's bytes from a 1-d uint8 Tensor (on DISK: read in place; elsewhere: copied to the host once) or a
  path (opened as a DISK tensor)."""
  if isinstance(source, Tensor):
    if source.dtype != dtypes.uint8 or source.ndim != 1:
      raise ValueError(f"gguf_load: expected the file as a 1-d uint8 Tensor, got {source.dtype} {tuple(source.shape)}")
    label = f"GGUF data ({source.shape[0]} bytes on {source.device})"
    if source.device.startswith("DISK"): return _FileBytes(label, source.shape[0], Device.DEFAULT, disk=source)
    return _FileBytes(label, source.shape[0], source.device, host=source.numpy())
  if not isinstance(source, (str, os.PathLike)):
    raise TypeError(f"gguf_load: expected a uint8 Tensor or a path, got {type(source).__name__}")
  path = pathlib.Path(source)
  size = path.stat().st_size
  if size == 0: return _FileBytes(str(path), 0, Device.DEFAULT, host=np.zeros(0, np.uint8))   # mmap refuses empty files
  return _FileBytes(str(path), size, Device.DEFAULT, disk=Tensor(path))   # a DISK tensor: mapped, read in place

def gguf_load_raw(source: Tensor | str | os.PathLike) -> tuple[dict[str, Any], dict[str, GGUFTensorInfo]]:
  """The metadata and each tensor in its stored form (see `GGUFTensorInfo`), in file order; nothing is dequantized.

  For code that keeps weights quantized: `info.blocks` is a uint8 view of the blocks, and
  `dequantize_blocks(info.blocks, info.ggml_type)` expands them lazily, so it can fuse into the kernel that reads it.
  Errors are ValueErrors naming the file, the tensor and the byte offset.
  """
  reader = _HeaderReader(_open(source))
  metadata, tensor_count = _read_metadata(reader)
  alignment = _alignment(reader, metadata)
  infos = _read_tensor_infos(reader, tensor_count)
  data_start = -(-reader.pos // alignment) * alignment
  tensors = {name: _tensor_info(reader, data_start, alignment, name, shape, ggml_type, offset)
             for name, shape, ggml_type, offset in infos}
  return metadata, tensors

def gguf_load(tensor: Tensor | str | os.PathLike) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """Read a GGUF file: its metadata (key -> int/float/bool/str/list) and its tensors by name, dequantized.

  `tensor` is the whole file as a 1-d uint8 Tensor (e.g. `Tensor(np.fromfile(path, np.uint8))`) or a path. Shapes are
  row-major (the file's dims reversed). Quantized tensors (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) come back as float32, plain
  ones in their stored dtype (F32, F16 -> float16, BF16 -> bfloat16, F64, I8-I64). Each tensor is a lazy graph on the
  file tensor's device, computed when used. A truncated or corrupt file raises ValueError naming the file, the tensor
  and the byte offset.
  """
  metadata, infos = gguf_load_raw(tensor)
  return metadata, {name: info.dequantize() for name, info in infos.items()}
