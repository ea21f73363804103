"""Bytes and bits: bitcast between dtypes, keccak (SHA3/SHAKE) and a tree hash."""
from __future__ import annotations
import math
from typing import TYPE_CHECKING
import numpy as np
from kiln.dtype import DType, dtypes
from kiln.helpers import prod
from kiln.uop.ops import UOp, Ops
from kiln.mixin.common import TensorValueError, where, dtype_arg, fmt
if TYPE_CHECKING: from kiln.tensor import Tensor

_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}

# (rate in bytes, domain-separation byte) of each named Keccak configuration; the output is (200 - rate) // 2 bytes
# (the hashlib digest size for SHA3; for SHAKE, as tinygrad, half the capacity: 16 bytes for shake_128, 32 for 256)
KECCAK_CONFIGS = {"sha3_224": (144, 0x06), "sha3_256": (136, 0x06), "sha3_384": (104, 0x06), "sha3_512": (72, 0x06),
                  "shake_128": (168, 0x1F), "shake_256": (136, 0x1F)}

def _round_constants() -> list[int]:
  """The 24 iota constants of Keccak-f[1600], from the spec's LFSR x^8 + x^6 + x^5 + x^4 + 1."""
  state, bits = 1, []
  for _ in range(7 * 24):
    bits.append(state & 1)
    state = ((state << 1) ^ 0x171) & 0xFF if state & 0x80 else state << 1
  return [sum(bits[7 * i + j] << ((1 << j) - 1) for j in range(7)) for i in range(24)]

def _rotation_offsets() -> list[int]:
  """The rho rotation of each lane (lane index x + 5y), walking (x, y) -> (y, 2x + 3y) from (1, 0)."""
  offsets, (x, y) = [0] * 25, (1, 0)
  for t in range(24):
    offsets[x + 5 * y] = (t + 1) * (t + 2) // 2 % 64
    x, y = y, (2 * x + 3 * y) % 5
  return offsets

ROUND_CONSTANTS, ROTATIONS = _round_constants(), _rotation_offsets()
# pi moves lane (x, y) to (y, 2x + 3y): PI_SOURCE[i] is the lane that lands at lane i
PI_SOURCE = [0] * 25
for _x in range(5):
  for _y in range(5): PI_SOURCE[_y + 5 * ((2 * _x + 3 * _y) % 5)] = _x + 5 * _y

def _keccak_round(state: UOp, round_constant: UOp) -> UOp:
  """One round of Keccak-f[1600] (theta, rho, pi, chi, iota) on a (batch, 25) uint64 tensor-level node.

  Each lane is its own (batch,) node, so every step is elementwise; `round_constant` is a (batch,) view of a
  one-element buffer, so the 24 rounds share one compiled kernel. One round per kernel: a kernel that writes the 25
  lanes back into one (batch, 25) buffer recomputes each lane's inputs in its own branch, which over several rounds
  would multiply the work."""
  batch, device = state.shape[0], state.device
  constants: dict[int, UOp] = {}
  def const(value: int) -> UOp:
    if value not in constants: constants[value] = UOp.const(dtypes.uint64, value, device).reshape((1,)).expand((batch,))
    return constants[value]
  def rotl(lane: UOp, shift: int) -> UOp:
    if shift == 0: return lane
    return lane.alu(Ops.SHL, const(shift)).alu(Ops.OR, lane.alu(Ops.SHR, const(64 - shift)))
  def xor(a: UOp, b: UOp) -> UOp: return a.alu(Ops.XOR, b)
  lanes = [state.shrink(((0, batch), (i, i + 1))).reshape((batch,)) for i in range(25)]
  parity = [xor(xor(xor(xor(lanes[x], lanes[x + 5]), lanes[x + 10]), lanes[x + 15]), lanes[x + 20]) for x in range(5)]
  theta = [xor(parity[(x - 1) % 5], rotl(parity[(x + 1) % 5], 1)) for x in range(5)]
  moved = [rotl(xor(lanes[PI_SOURCE[i]], theta[PI_SOURCE[i] % 5]), ROTATIONS[PI_SOURCE[i]]) for i in range(25)]
  row = lambda i, step: (i + step) % 5 + i // 5 * 5   # noqa: E731  the lane `step` further along i's row
  lanes = [xor(moved[i], xor(moved[row(i, 1)], const(2 ** 64 - 1)).alu(Ops.AND, moved[row(i, 2)])) for i in range(25)]
  lanes[0] = xor(lanes[0], round_constant)
  out = None
  for i, lane in enumerate(lanes):   # back into one (batch, 25) node: each lane padded into its column
    column = lane.reshape((batch, 1)).pad(((0, 0), (i, 24 - i)))
    out = column if out is None else out.alu(Ops.OR, column)
  return out

_round_constant_buffers: dict[str, list] = {}

def _permute_recording(state: Tensor, round_constants: list[UOp]):
  """Keccak-f[1600] on the realized (batch, 25) `state`, one kernel per round, and a function that runs the same
  kernels again on another realized state of that shape. Building and scheduling 24 round graphs per block costs far
  more than the kernels themselves; the replay reuses the scheduled kernels with the input buffer swapped. Every call
  returns the same tensor, whose buffer each replay overwrites (keccak only reads the newest result)."""
  from kiln.schedule.kernelize import create_schedule, ScheduleItem
  from kiln.engine.realize import run_schedule
  items, node = [], state.uop
  for round_constant in round_constants:
    root = UOp(Ops.CONTIGUOUS, dtypes.uint64, (_keccak_round(node, round_constant),))
    schedule = create_schedule([root])
    run_schedule(schedule.items)
    items += schedule.items
    node = schedule.results[root]   # no Tensor bookkeeping: these results must not answer for their graphs later
  out, input_buffer = state._wrap(node, "keccak"), state.uop.base.buffer
  def replay(new_state: Tensor) -> Tensor:
    new_input = new_state.uop.base.buffer
    run_schedule([ScheduleItem(item.ast, [new_input if b is input_buffer else b for b in item.bufs], item.metadata,
                               item.var_vals) for item in items])
    return out
  return out, replay

class BytesMixin:
  __slots__ = ()
  def bitcast(self, dtype: DType | str) -> Tensor:
    """The same bytes read as `dtype` (little-endian), like torch's `view(dtype)`.

    Between dtypes of different sizes the last axis scales by the size ratio (float32 -> uint8 makes it 4x longer;
    uint8 -> int32 needs its length to divide by 4). bool converts as its 0/1 byte. No gradient flows through.

    >>> Tensor([1.0], dtype="float32").bitcast("uint32").tolist()
    [1065353216]
    >>> Tensor([1, 2], dtype="uint16").bitcast("uint8").tolist()
    [1, 0, 2, 0]
    """
    dtype = dtype_arg(dtype, "bitcast")
    if type(self.device) is str and self.device.startswith("DISK"):   # a file: a view of the same bytes, never a kernel
      from kiln.mixin.disk import disk_bitcast
      return self if dtype == self.dtype else disk_bitcast(self, dtype)
    if self.requires_grad: raise RuntimeError(f"bitcast: cannot backpropagate through bitcast; detach() first{where()}")
    if dtype == self.dtype: return self
    old, new = self.dtype.itemsize, dtype.itemsize
    if old != new:
      if self.ndim == 0:
        raise TensorValueError(f"bitcast: a 0-d tensor cannot change item size ({self.dtype} -> {dtype}){where()}")
      if self.shape[-1] * old % new:
        raise TensorValueError(f"bitcast: the last axis of {fmt(self.shape)} {self.dtype} ({self.shape[-1] * old} bytes) "
                               f"does not divide into {dtype} items of {new} bytes{where()}")
    x = self.cast(dtypes.uint8) if self.dtype == dtypes.bool else self   # a bool is stored as its 0/1 byte
    if dtype == dtypes.bool: return x.bitcast(dtypes.uint8) != 0
    if x.dtype == dtype: return x
    if old == new: return self._wrap(UOp(Ops.BITCAST, dtype, (x.uop,)), "bitcast")
    bits = x.bitcast(_UINT_OF_SIZE[old])
    wide, *lead = _UINT_OF_SIZE[new], *self.shape[:-1]
    if new > old:   # pack `ratio` consecutive items into one, the first in the lowest bits
      ratio = new // old
      groups = bits.reshape(*lead, self.shape[-1] // ratio, ratio)
      parts = [groups.shrink((*[None] * (groups.ndim - 1), (i, i + 1))).cast(wide) << (8 * old * i)
               for i in range(ratio)]
      packed = parts[0]
      for part in parts[1:]: packed = packed | part
      return packed.reshape(*lead, self.shape[-1] // ratio).bitcast(dtype)
    ratio = old // new   # split each item into `ratio` narrower ones, lowest bits first
    out = None
    for i in range(ratio):
      part = (bits >> (8 * new * i)).cast(wide).unsqueeze(-1)
      column = self._wrap(part.uop.pad(((0, 0),) * (part.ndim - 1) + ((i, ratio - 1 - i),)), "bitcast")
      out = column if out is None else out | column
    return out.reshape(*lead, self.shape[-1] * ratio).bitcast(dtype)

  def keccak(self, cfg: str | tuple[int, int] = "sha3_256") -> Tensor:
    """The Keccak hash (SHA3 / SHAKE) of the bytes of each row along the last axis; leading axes are a batch.

    `cfg` is one of "sha3_224", "sha3_256", "sha3_384", "sha3_512", "shake_128", "shake_256", or a
    (rate in bytes, domain byte) pair. The result is uint8 with (200 - rate) // 2 bytes per row: the SHA3 digest, or
    for SHAKE 16 (shake_128) or 32 (shake_256) bytes of output. Non-uint8 tensors are hashed as their bytes.
    *Synchronizes*: it runs at once (one kernel per round, all blocks reusing the first block's 24 kernels), so the
    result is a realized tensor.

    >>> bytes(Tensor(b"abc").keccak("sha3_224").tolist()).hex()
    'e642824c3f8cf24ad09234ee7d3c766fc9a3a5168d0c94ad73b46fdf'
    """
    if isinstance(cfg, str):
      if cfg not in KECCAK_CONFIGS:
        raise TensorValueError(f"keccak: unknown cfg {cfg!r}; expected one of {', '.join(KECCAK_CONFIGS)} "
                               f"or a (rate, domain byte) pair{where()}")
      rate, domain = KECCAK_CONFIGS[cfg]
    elif isinstance(cfg, tuple) and len(cfg) == 2 and all(isinstance(v, int) for v in cfg):
      rate, domain = cfg
      if not (0 < rate < 200 and rate % 8 == 0 and 0 <= domain < 256):
        raise TensorValueError(f"keccak: cfg {cfg} needs a rate that is a multiple of 8 below 200 and a byte{where()}")
    else: raise TypeError(f"keccak: cfg must be a name or a (rate, domain byte) pair, got {cfg!r}{where()}")
    if self.ndim == 0: raise TensorValueError(f"keccak: needs at least one axis to hash along, got a 0-d tensor{where()}")
    data = self.cast(dtypes.uint8) if self.dtype == dtypes.bool else self.bitcast(dtypes.uint8)
    lead, length, out_bytes = data.shape[:-1], data.shape[-1], (200 - rate) // 2
    batch = prod(lead)
    if batch == 0: return self.zeros(*lead, out_bytes, dtype=dtypes.uint8, device=self.device)
    # pad10*1: the domain byte right after the message, 0x80 in the last byte of the last block (one byte may hold both)
    pad_len = rate - length % rate
    padding = np.zeros(pad_len, np.uint8)
    padding[0] ^= domain
    padding[-1] ^= 0x80
    padded = data.reshape(batch, length)._join_last(type(self)(padding, device=self.device).reshape(1, pad_len))
    blocks = (length + pad_len) // rate
    # each block as 25 lanes (the rate part, zeros for the capacity), one contiguous buffer read block by block
    lanes = padded.reshape(batch, blocks, rate // 8, 8).bitcast(dtypes.uint64).reshape(batch, blocks, rate // 8)
    lanes = self._wrap(lanes.uop.pad(((0, 0), (0, 0), (0, 25 - rate // 8))), "keccak").contiguous()
    if self.device not in _round_constant_buffers:
      _round_constant_buffers[self.device] = [type(self)(np.array([c], np.uint64), device=self.device).realize()
                                              for c in ROUND_CONSTANTS]
    round_constants = [c.uop.reshape((1,)).expand((batch,)) for c in _round_constant_buffers[self.device]]
    state, replay = None, None
    for k in range(blocks):
      block = lanes.shrink((None, (k, k + 1), None)).reshape(batch, 25)
      # absorbing is its own kernel, so the round kernels always read a whole buffer and are the same for every block
      state = (block if state is None else state ^ block).contiguous().realize()
      if replay is not None: state = replay(state)
      else: state, replay = _permute_recording(state, round_constants)
    return state.bitcast(dtypes.uint8).shrink((None, (0, out_bytes))).reshape(*lead, out_bytes)

  def _join_last(self, other: Tensor) -> Tensor:
    """This tensor and `other` (broadcast over leading axes) one after the other along the last axis."""
    other = other.expand(*self.shape[:-1], other.shape[-1])
    front = self._wrap(self.uop.pad(((0, 0),) * (self.ndim - 1) + ((0, other.shape[-1]),)), "pad")
    back = self._wrap(other.uop.pad(((0, 0),) * (self.ndim - 1) + ((self.shape[-1], 0),)), "pad")
    return front | back

  def hash(self) -> Tensor:
    """A 16-byte uint8 hash of this tensor's bytes, as tinygrad's: a tree of shake_128 over 1 MiB chunks.

    Each 1 MiB chunk (zero-padded) is cut into 4 KiB blocks; the 16-byte shake_128 digests of its 256 blocks are
    hashed again into 16 bytes per chunk; the chunk digests are hashed the same way until one remains.
    """
    chunk = 1 << 20
    data = self.flatten()
    data = data.cast(dtypes.uint8) if data.dtype == dtypes.bool else data.bitcast(dtypes.uint8)
    while True:
      chunks = max(1, math.ceil(data.shape[0] / chunk))
      data = self._wrap(data.uop.pad(((0, chunks * chunk - data.shape[0]),)), "hash")
      block_digests = data.reshape(chunks * chunk // 4096, 4096).keccak("shake_128")
      data = block_digests.reshape(chunks, 4096).keccak("shake_128").flatten()
      if chunks == 1: return data
