"""PythonRenderer: a linearized kernel (docs/ir.md, stage 4) becomes a plain Python function, for the PYTHON device.

The PYTHON device is the reference every other backend is tested against, so the generated code follows the C
semantics exactly (see kiln/renderer/cstyle.py): integers wrap to their dtype after every op, IDIV/MOD truncate toward
zero (a zero divisor gives 0), float32/float16/bfloat16 results are rounded to their type after every op (math is
done on Python floats, i.e. doubles, which rounds +,-,*,/,sqrt correctly), MAX propagates NaN, casts are C casts.

The generated function takes one byte memoryview per buffer (DEFINE_GLOBAL order), then the DEFINE_VAR values, and
views each buffer with its element format. GPU-style kernels (kiln/codegen/gpudims.py, for a renderer with
`has_local`) run their thread indices (SPECIAL) as loops, one thread after another; one whose threads work together
(shared arrays, BARRIER, warp SHUFFLE, ATOMIC) runs each block's threads as generators in lockstep instead
(`_lockstep`: every thread reaches a barrier or shuffle before any goes on). float16 and bfloat16 buffers are viewed as their 16-bit patterns, fp8
buffers as their 8-bit patterns (rounded as in kiln/dtype.py: nearest-even, saturating).
"""
from __future__ import annotations
import math, struct
from fractions import Fraction
from typing import Callable
from kiln.dtype import DType, dtypes, truncate, fp8_bits, FP8_VALUES
from kiln.renderer import KernelWriter, Renderer, kernel_signature, kernel_function_name
from kiln.renderer.cstyle import EXACT_FLOAT_OPS, check_alu_dtypes
from kiln.uop.mathforms import exp_argument, cos_argument, tan_argument
from kiln.uop.ops import UOp, Ops, GroupOp

# ---------------- runtime helpers used by the generated code ----------------

inf, nan = math.inf, math.nan
_F32, _F16, _U16, _U32 = struct.Struct("<f"), struct.Struct("<e"), struct.Struct("<H"), struct.Struct("<I")

def _r32(x: float) -> float:
  """`x` rounded to float32 (nearest-even; overflow gives inf)."""
  try: return _F32.unpack(_F32.pack(x))[0]
  except OverflowError: return math.copysign(inf, x)

def _fma(a: float, b: float, c: float) -> float:
  """a*b + c rounded once to float64 (a fused multiply-add; math.fma arrives with Python 3.13)."""
  if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)): return a * b + c   # as IEEE fma for these
  try: return float(Fraction(a) * Fraction(b) + Fraction(c))   # exact, then one correctly rounded division
  except OverflowError: return math.copysign(inf, a * b if a * b != 0 else c)

def _fma32(a: float, b: float, c: float) -> float:
  """a*b + c of float32 values rounded once to float32. The product of two float32 values is exact in float64 and
  the float64 sum s is the nearest double to the exact v = s + e (TwoSum's e); rounding s to float32 rounds v the
  same way unless s falls exactly halfway between two float32 values, where the sign of e decides."""
  s = a * b + c
  r = _r32(s)
  if r == s or not math.isfinite(s): return r
  p = a * b
  t = s - p
  e = (p - (s - t)) + (c - t)
  other = 2 * s - r   # the float32 on s's other side, if s is halfway
  if e == 0 or _r32(other) != other or other - s != s - r: return r
  return max(r, other) if e > 0 else min(r, other)

def _r16(x: float) -> float:
  """`x` rounded to float16 (nearest-even; overflow gives inf)."""
  try: return _F16.unpack(_F16.pack(x))[0]
  except OverflowError: return math.copysign(inf, x)

def _f16_bits(x: float) -> int:
  """The bit pattern of a float16 value."""
  try: return _U16.unpack(_F16.pack(x))[0]
  except OverflowError: return 0x7C00 if x > 0 else 0xFC00

def _bf16_bits(x: float) -> int:
  """The bfloat16 bit pattern of `x`, rounded through float32 (nearest-even; NaN stays a quiet NaN)."""
  try: bits = _U32.unpack(_F32.pack(x))[0]
  except OverflowError: bits = 0x7F800000 if x > 0 else 0xFF800000
  if bits & 0x7FFFFFFF > 0x7F800000: return (bits >> 16) | 0x40
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF

def _build_tables() -> tuple[list[float], list[float]]:
  import numpy as np
  patterns = np.arange(65536, dtype=np.uint32)
  with np.errstate(invalid="ignore"):   # signaling NaN patterns become quiet NaNs
    half = patterns.astype(np.uint16).view(np.float16).astype(np.float64).tolist()
    bfloat = (patterns << 16).view(np.float32).astype(np.float64).tolist()
  return half, bfloat

_H2F, _BF2F = _build_tables()   # float16 / bfloat16 bit pattern -> value

def _rbf16(x: float) -> float:
  """`x` rounded to bfloat16 through float32 (as the C code does)."""
  return _BF2F[_bf16_bits(x)]

_E4M3_TO_F, _E5M2_TO_F = FP8_VALUES[dtypes.fp8e4m3], FP8_VALUES[dtypes.fp8e5m2]   # fp8 bit pattern -> value

def _fp8e4m3_bits(x: float) -> int: return fp8_bits(x, dtypes.fp8e4m3)
def _fp8e5m2_bits(x: float) -> int: return fp8_bits(x, dtypes.fp8e5m2)
def _rfp8e4m3(x: float) -> float: return _E4M3_TO_F[fp8_bits(x, dtypes.fp8e4m3)]
def _rfp8e5m2(x: float) -> float: return _E5M2_TO_F[fp8_bits(x, dtypes.fp8e5m2)]

def _i2f32(x: int) -> float:
  """A (64-bit) integer rounded once to float32; float(x) alone would round twice for |x| > 2**53."""
  if -(1 << 53) <= x <= (1 << 53): return _r32(float(x))
  magnitude = abs(x)
  shift = magnitude.bit_length() - 26    # keep 24 bits, a guard bit and a sticky bit
  kept = (magnitude >> shift) | (1 if magnitude & ((1 << shift) - 1) else 0)
  return _r32(math.copysign(float(kept) * 2.0 ** shift, x))

def _f2i(x: float, bits: int, signed: bool) -> int:
  """C float -> integer conversion as x86-64 code from gcc does it: truncation, wrapped to `bits`; values that are
  out of range of the conversion instruction (undefined behavior in C) give its 'integer indefinite' value."""
  wide = 64 if bits == 64 or (bits == 32 and not signed) else 32
  if math.isfinite(x) and -(1 << (wide - 1)) <= (t := math.trunc(x)) < (1 << (wide - 1)): value = t
  elif bits == 64 and not signed and math.isfinite(x) and 0 <= x < 2.0 ** 64: value = math.trunc(x)
  else: value = -(1 << (wide - 1))
  value &= (1 << bits) - 1
  return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value

def _fdiv0(a: float, b: float) -> float:
  """IEEE float division when the divisor is zero."""
  if a != a or a == 0: return nan
  return math.copysign(inf, a) * math.copysign(1.0, b)

def _fmod(a: float, b: float) -> float:
  """C fmod (NaN where Python's math.fmod raises)."""
  try: return math.fmod(a, b)
  except ValueError: return nan

def _idiv(a: int, b: int) -> int:
  """Integer division truncating toward zero; 0 for a zero divisor."""
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q

def _imod(a: int, b: int) -> int:
  """The remainder of truncating division (sign of `a`); 0 for a zero divisor."""
  if b == 0: return 0
  r = abs(a) % abs(b)
  return -r if a < 0 else r

def _ieee(fn, error: type[Exception], result: float):
  """`fn` with the IEEE result where Python's math raises `error` (exp overflow: inf; sin of inf: NaN)."""
  def call(x: float) -> float:
    try: return fn(x)
    except error: return result
  return call

_exp2, _exp = _ieee(math.exp2, OverflowError, inf), _ieee(math.exp, OverflowError, inf)
_sin, _cos, _tan = (_ieee(fn, ValueError, nan) for fn in (math.sin, math.cos, math.tan))

def _log2(x: float) -> float:
  if x > 0: return math.log2(x)
  return -inf if x == 0 else nan

def _sqrt(x: float) -> float:
  return math.sqrt(x) if x >= 0 else nan

def _is_odd_integer(y: float) -> bool: return math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0

def _pow(x: float, y: float) -> float:
  """C pow: IEEE results where Python's math.pow raises."""
  try: return math.pow(x, y)
  except OverflowError: return -inf if x < 0 and _is_odd_integer(y) else inf
  except ValueError:
    if x == 0: return math.copysign(inf, x) if _is_odd_integer(y) else inf
    return nan

def _trunc(x: float) -> float:
  return math.copysign(float(math.trunc(x)), x) if math.isfinite(x) else x

def _check_index(i: int) -> int:
  """An index that must not be negative (Python would silently read from the end)."""
  if i < 0: raise IndexError(f"kernel read/wrote index {i} (negative)")
  return i

def _bitcast(bits, src_format: str, dst_format: str):
  return struct.unpack(dst_format, struct.pack(src_format, bits))[0]

_FINISHED = object()   # what `_lockstep` records for a thread that returned
_WARP = object()       # the tag of a warp-collective op's event: (_WARP, op, payload); op maps a warp's 32 payloads
                       # to its 32 lanes' values

def _sum_r32(terms: list[float]) -> float:
  """The exact sum of `terms` (doubles) rounded once to float32. math.fsum rounds the exact sum to a double s; that
  rounds to float32 as the exact sum does unless s lies exactly halfway between two float32 values, where the exact
  remainder's sign decides (as in _fma32)."""
  if not all(math.isfinite(t) for t in terms): return _r32(sum(terms))
  s = math.fsum(terms)
  r = _r32(s)
  if r == s or not math.isfinite(s): return r
  other = 2 * s - r   # the float32 on s's other side, if s is halfway
  if _r32(other) != other or other - s != s - r: return r
  e = sum(Fraction(t) for t in terms) - Fraction(s)
  if e == 0: return r
  return max(r, other) if e > 0 else min(r, other)

def _tf32(x: float) -> float:
  """A float32 value as the tensor cores read a tf32 operand: its top 19 bits (sign, exponent, 10 mantissa bits),
  the low 13 mantissa bits dropped (truncation toward zero; docs/ir.md WMMA)."""
  if not math.isfinite(x): return x
  return _F32.unpack(_U32.pack(_U32.unpack(_F32.pack(x))[0] & 0xFFFFE000))[0]

class _WarpMMA:
  """One warp's `mma.sync` (Ops.WMMA) for the lockstep runner: the 32 lanes' (a, b, c) fragments are placed into A
  (m x k), B (k x n) and C (m x n) by the layouts, D = A @ B + C is computed with every product exact and each
  element's sum rounded once to float32 (tf32 inputs truncated to 10 mantissa bits first), and lane l gets its
  c_layout elements of D."""
  def __init__(self, dims: tuple, tf32: bool, a_layout, b_layout, c_layout):
    self.dims, self.tf32, self.layouts = dims, tf32, (a_layout, b_layout, c_layout)

  def __call__(self, payloads: list) -> list:
    m, n, k = self.dims
    a_layout, b_layout, c_layout = self.layouts
    A, B, C = [[0.0] * k for _ in range(m)], [[0.0] * n for _ in range(k)], [[0.0] * n for _ in range(m)]
    for lane, (a, b, c) in enumerate(payloads):
      for (row, col), x in zip(a_layout[lane], a): A[row][col] = _tf32(x) if self.tf32 else x
      for (row, col), x in zip(b_layout[lane], b): B[row][col] = _tf32(x) if self.tf32 else x
      for (row, col), x in zip(c_layout[lane], c): C[row][col] = x
    D = [[_sum_r32([C[i][j]] + [A[i][t] * B[t][j] for t in range(k)]) for j in range(n)] for i in range(m)]
    return [tuple(D[row][col] for row, col in c_layout[lane]) for lane in range(32)]

class _WarpLoadMatrix:
  """One warp's `ldmatrix` (Ops.LDMATRIX) for the lockstep runner: each lane's payload is (shared array, element
  index); lanes 8j..8j+7 name the 8 rows of matrix j (8 elements each, 16-byte aligned), and lane l gets elements
  (l // 4, 2*(l % 4) + e) of each matrix, or with `trans` elements (2*(l % 4) + e, l // 4), decoded by `values`."""
  def __init__(self, matrices: int, trans: bool, values=None):
    self.matrices, self.trans, self.values = matrices, trans, values

  def __call__(self, payloads: list) -> list:
    grids = []
    for j in range(self.matrices):
      rows = []
      for lane in range(8 * j, 8 * j + 8):
        array, index = payloads[lane]
        if index % 8 or index < 0 or index + 8 > len(array):
          raise RuntimeError(f"PYTHON emulator: LDMATRIX row at element {index} of a shared array of {len(array)}: "
                             "out of bounds or not 16-byte aligned")
        rows.append(array[index:index + 8])
      grids.append(rows)
    out = []
    for lane in range(32):
      r, c = lane // 4, 2 * (lane % 4)
      picked = [x for g in grids for x in ((g[c][r], g[c + 1][r]) if self.trans else (g[r][c], g[r][c + 1]))]
      out.append(tuple(self.values[x] for x in picked) if self.values is not None else tuple(picked))
    return out

def _read_async(view, index: int, count: int) -> list:
  """The `count` source elements of an asynchronous copy (CP_ASYNC) from `index` on, read when it is issued."""
  if index < 0 or index + count > len(view) or index % count:
    raise IndexError(f"PYTHON emulator: CP_ASYNC of {count} elements at {index} of a buffer of {len(view)}: out of "
                     "bounds or not aligned to its size")
  return list(view[index:index + count])

def _land(group: list) -> None:
  """Complete a group of asynchronous copies (CP_ASYNC): each (shared array, index, elements) written."""
  for array, index, elements in group:
    if index < 0 or index + len(elements) > len(array) or index % len(elements):
      raise IndexError(f"PYTHON emulator: CP_ASYNC into element {index} of a shared array of {len(array)}: out of "
                       "bounds or not aligned to its size")
    array[index:index + len(elements)] = elements

def _lockstep(threads: list) -> None:
  """Run one block of a cooperative GPU-style kernel: `threads` are its threads as generators (in `lidx0` order),
  each run in turn up to its next BARRIER (it yields None) or warp SHUFFLE (it yields `(k, value)` and is sent the
  value of thread `i ^ k`), so every thread of the block stands at the same one before any goes on. A thread that
  reaches another one, or ends while others wait, raises RuntimeError (a GPU would hang or race)."""
  inbox: list = [None] * len(threads)
  while True:
    events = []
    for thread, message in zip(threads, inbox):
      try: events.append(thread.send(message))
      except StopIteration: events.append(_FINISHED)
    first = events[0]
    if isinstance(first, tuple) and first[0] is _WARP:   # a warp-collective op: each warp's 32 lanes together
      if len(threads) % 32 or any(not isinstance(e, tuple) or e[0] is not _WARP or e[1] is not first[1]
                                  for e in events):
        raise RuntimeError("PYTHON emulator: not every thread of the block (whole warps of 32) reached the warp-wide "
                           "matrix op")
      inbox = [value for w in range(0, len(events), 32) for value in first[1]([e[2] for e in events[w:w + 32]])]
      continue
    if first is _FINISHED or first is None:
      if any(event is not first for event in events):
        raise RuntimeError("PYTHON emulator: the threads of a block reached different barriers or shuffles, or some "
                           "ended while others wait at one")
      if first is _FINISHED: return
      inbox = [None] * len(threads)
      continue
    if any(event is None or event is _FINISHED or event[0] != first[0] for event in events):
      raise RuntimeError(f"PYTHON emulator: not every thread of the block reached the shuffle by lane ^ {first[0]}")
    values = [event[1] for event in events]
    inbox = [values[i ^ first[0]] for i in range(len(values))]

# ---- Hopper (sm_90a): mbarriers, TMA, warpgroup MMA (docs/ir.md stage 4, "Hopper"), run by `_scheduled` ----

_GROUP = object()   # a warpgroup-collective op's event: (_GROUP, op, payload); op maps 128 payloads to 128 values
_WAIT = object()    # an mbarrier wait's event: (_WAIT, barrier, parity)

class _MBarrier:
  """One mbarrier: `count` arrivals a phase, the phase's pending arrivals and transaction bytes (expected minus
  completed), the number of completed phases, and the TMA writes of the phase in progress, which land when it
  completes (stricter than a GPU, where they land before: a read without its wait sees the old contents)."""
  def __init__(self, count: int):
    self.count, self.pending, self.tx, self.phase, self.writes = count, count, 0, 0, []

  def arrive(self, tx: int) -> None:
    """An arrival, expecting `tx` more transaction bytes (arrive.expect_tx) first."""
    self.tx += tx
    self.pending -= 1
    if self.pending < 0: raise RuntimeError(f"PYTHON emulator: mbarrier of count {self.count} got more arrivals in "
                                            "one phase than its count")
    self._complete()

  def complete_tx(self, nbytes: int, writes: list) -> None:
    """A TMA copy of `nbytes` done: its writes (array, index, value) land with the phase."""
    self.tx -= nbytes
    self.writes.extend(writes)
    self._complete()

  def _complete(self) -> None:
    if self.pending: return
    if self.tx < 0: raise RuntimeError(f"PYTHON emulator: mbarrier phase {self.phase} got {-self.tx} transaction "
                                       "bytes more than its arrivals expected")
    if self.tx: return
    for array, index, value in self.writes: array[index] = value
    self.phase, self.pending, self.writes = self.phase + 1, self.count, []

  def __repr__(self) -> str:
    return f"mbarrier(count {self.count}, phase {self.phase}, {self.pending} arrivals and {self.tx} tx bytes pending)"

def _mbar(array: list, index: int) -> _MBarrier:
  """Barrier `index` of a shared array of mbarriers (MBARRIER_INIT made it)."""
  bar = array[index] if 0 <= index < len(array) else None
  if not isinstance(bar, _MBarrier): raise RuntimeError(f"PYTHON emulator: mbarrier {index} used before its init")
  return bar

def _mbar_init(array: list, index: int, count: int) -> None:
  if not 0 <= index < len(array): raise IndexError(f"PYTHON emulator: mbarrier {index} of {len(array)}")
  array[index] = _MBarrier(count)

def _swizzle(address: int, span: int) -> int:
  bits = {0: 0, 32: 1, 64: 2, 128: 3}[span]
  return address ^ (((address >> 7) & ((1 << bits) - 1)) << 4)

def _tma_load(dst: list, offset: int, src, tmap: tuple, bars: list, bar: int, row: int, col: int) -> None:
  """A TMA tile load (TMA_LOAD): the box at element (row, col) of the map's matrix (`tmap` = (rows, cols, row
  stride, box rows, box cols, swizzle, element bytes)), zeros outside it, read now, written into `dst` from byte
  `offset` on (row-major, swizzled by address) when barrier `bar`'s phase completes."""
  rows, cols, stride, box_rows, box_cols, span, size = tmap
  if offset % 128 or offset < 0 or offset + box_rows * box_cols * size > len(dst) * size:
    raise IndexError(f"PYTHON emulator: TMA box of {box_rows}x{box_cols} at byte {offset} of a shared array of "
                     f"{len(dst) * size} bytes: out of bounds or not 128-byte aligned")
  writes = []
  for i in range(box_rows):
    r = row + i
    for j in range(box_cols):
      c = col + j
      value = src[r * stride + c] if 0 <= r < rows and 0 <= c < cols else 0
      writes.append((dst, _swizzle(offset + (i * box_cols + j) * size, span) // size, value))
  _mbar(bars, bar).complete_tx(box_rows * box_cols * size, writes)

class _WarpgroupMMA:
  """One warpgroup's `wgmma.mma_async` (Ops.WGMMA) for `_scheduled`: every thread's payload is (A's shared array,
  byte offset, B's, byte offset, acc); the operands are the same in all 128. A (64 x k) and B (n x k) are read
  through their layouts (`SmemMatrix.address`: the swizzle the descriptor names), decoded by `values`; each element
  of D is C + sum A*B^T exact, rounded once to float32 (tf32 inputs truncated), and thread t gets c_layout[t]."""
  def __init__(self, n: int, k: int, size: int, a: tuple, b: tuple, tf32: bool, values=None):
    from kiln.runtime.gpu_target import SmemMatrix, WarpgroupMMA
    self.n, self.k, self.size, self.tf32, self.values = n, k, size, tf32, values
    self.a, self.b = SmemMatrix(*a), SmemMatrix(*b)
    self.c_layout = WarpgroupMMA(n, dtypes.float16).c_layout

  def read(self, layout, array: list, start: int, rows: int) -> list:
    out = []
    for r in range(rows):
      row = []
      for t in range(self.k):
        address = layout.address(start, r, t * self.size)
        if address % self.size or not 0 <= address // self.size < len(array):
          raise IndexError(f"PYTHON emulator: WGMMA operand byte {address} outside its shared array")
        x = array[address // self.size]
        x = self.values[x] if self.values is not None else x
        row.append(_tf32(x) if self.tf32 else x)
      out.append(row)
    return out

  def __call__(self, payloads: list) -> list:
    first = payloads[0]
    if any(p[0] is not first[0] or p[1] != first[1] or p[2] is not first[2] or p[3] != first[3] for p in payloads):
      raise RuntimeError("PYTHON emulator: the threads of a warpgroup gave a WGMMA different operands")
    A, B = self.read(self.a, first[0], first[1], 64), self.read(self.b, first[2], first[3], self.n)
    C = [[0.0] * self.n for _ in range(64)]
    for t, p in enumerate(payloads):
      for (row, col), x in zip(self.c_layout[t], p[4]): C[row][col] = x
    D = [[_sum_r32([C[i][j]] + [x * y for x, y in zip(A[i], B[j])]) for j in range(self.n)] for i in range(64)]
    return [tuple(D[row][col] for row, col in self.c_layout[t]) for t in range(128)]

def _scheduled(threads: list) -> None:
  """Run one block of a kernel with Hopper ops: its threads (generators, `lidx0` order) each run until they stand
  at a BARRIER (None), an mbarrier wait (`(_WAIT, barrier, parity)`: it goes on once the phase of that parity has
  completed), a warp-collective op (`_WARP`: 32 lanes of a warp together), a warpgroup-collective one (`_GROUP`:
  128 threads) or a SHUFFLE (a warp's 32 lanes). Threads in different roles (a producer warp, a consumer
  warpgroup) so run apart: each warpgroup in turn runs as far as it can alone (the first, the consumer in kiln's
  kernels, before the producer gets to run: a read that does not wait for its data sees the old contents), then
  the block's barriers and waits are settled. When no thread can go on and not all have ended, RuntimeError names
  where each waits (a deadlock or a wrong phase, which a GPU would hang on)."""
  n = len(threads)
  events: list = [None] * n
  inbox: list = [None] * n
  ready = set(range(n))

  def advance(i: int) -> None:
    message = inbox[i]
    while True:
      try: event = threads[i].send(message)
      except StopIteration: event = _FINISHED
      if not (isinstance(event, tuple) and event[0] is _WAIT and (event[1].phase & 1) != event[2]): break
      message = None   # its phase completed already
    events[i], inbox[i] = event, None

  def settle(lo: int, hi: int) -> list[int]:
    """Threads lo..hi-1 whose wait is over or whose warp or warpgroup op is complete (the op run)."""
    out = [i for i in range(lo, hi) if isinstance(events[i], tuple) and events[i][0] is _WAIT and
           (events[i][1].phase & 1) != events[i][2]]
    for size, tag in ((128, _GROUP), (32, _WARP)):
      for w in range(lo, hi - size + 1, size):
        group = events[w:w + size]
        first = group[0]
        if isinstance(first, tuple) and first[0] is tag and all(
            isinstance(e, tuple) and e[0] is tag and e[1] is first[1] for e in group):
          for j, value in enumerate(first[1]([e[2] for e in group])):
            inbox[w + j] = value
            out.append(w + j)
    for w in range(lo, hi - 31, 32):   # warp shuffles: (k, value)
      group = events[w:w + 32]
      if all(isinstance(e, tuple) and isinstance(e[0], int) and e[0] == group[0][0] for e in group):
        for j in range(32):
          inbox[w + j] = group[j ^ group[0][0]][1]
          out.append(w + j)
    return out

  while True:
    for lo in range(0, n, 128):   # each warpgroup as far as it goes alone
      hi = min(n, lo + 128)
      runnable = sorted(i for i in ready if lo <= i < hi)
      while runnable:
        for i in runnable: advance(i)
        runnable = settle(lo, hi)
    ready = set(settle(0, n))
    live = [e for e in events if e is not _FINISHED]
    if live and all(e is None for e in live):
      if len(live) != n: raise RuntimeError("PYTHON emulator: some threads of a block ended while others wait at a "
                                            "BARRIER")
      ready = set(range(n))
    if not ready:
      if not live: return
      raise RuntimeError("PYTHON emulator: deadlock (a GPU would hang): no thread of the block can go on; "
                         + "; ".join(_describe_waits(events)))

def _describe_waits(events: list) -> list[str]:
  """Where the threads of a deadlocked block stand, grouped (for `_scheduled`'s error)."""
  places: dict[str, list[int]] = {}
  for i, e in enumerate(events):
    if e is _FINISHED: where = "ended"
    elif e is None: where = "at a BARRIER"
    elif e[0] is _WAIT: where = f"waiting for parity {e[2]} of {e[1]!r}"
    elif e[0] is _GROUP: where = "at a warpgroup op (WGMMA) the rest of its warpgroup did not reach"
    elif e[0] is _WARP: where = "at a warp op the rest of its warp did not reach"
    else: where = f"at a shuffle by lane ^ {e[0]}"
    places.setdefault(where, []).append(i)
  def spans(ids: list[int]) -> str:
    runs, start = [], ids[0]
    for a, b in zip(ids, ids[1:] + [None]):
      if b != a + 1:
        runs.append(f"{start}" if start == a else f"{start}..{a}")
        start = b
    return ", ".join(runs)
  return [f"{len(ids)} threads ({spans(ids)}) {where}" for where, ids in places.items()]

EMULATOR_HELPERS = ("inf", "nan", "_r32", "_fma", "_fma32", "_r16", "_rbf16", "_f16_bits", "_bf16_bits", "_H2F", "_BF2F", "_i2f32",
                    "_f2i", "_fdiv0", "_fmod", "_idiv", "_imod", "_exp2", "_exp", "_log2", "_sin", "_cos", "_tan", "_sqrt", "_pow", "_trunc",
                    "_check_index", "_bitcast", "_E4M3_TO_F", "_E5M2_TO_F", "_fp8e4m3_bits", "_fp8e5m2_bits",
                    "_rfp8e4m3", "_rfp8e5m2", "_lockstep", "_WARP", "_WarpMMA", "_WarpLoadMatrix", "_land",
                    "_read_async", "_GROUP", "_WAIT", "_mbar", "_mbar_init", "_tma_load", "_WarpgroupMMA",
                    "_scheduled")

# ---------------- rendering ----------------

# memoryview/struct format of each dtype's storage (float16/bfloat16 as their bits)
PY_FORMATS: dict[DType, str] = {
  dtypes.bool: "?", dtypes.int8: "b", dtypes.uint8: "B", dtypes.int16: "h", dtypes.uint16: "H", dtypes.int32: "i",
  dtypes.uint32: "I", dtypes.int64: "q", dtypes.uint64: "Q", dtypes.float16: "H", dtypes.bfloat16: "H",
  dtypes.float32: "f", dtypes.float64: "d", dtypes.fp8e4m3: "B", dtypes.fp8e5m2: "B"}
_FLOAT_ROUNDING = {dtypes.float32: "_r32", dtypes.float16: "_r16", dtypes.bfloat16: "_rbf16",
                   dtypes.fp8e4m3: "_rfp8e4m3", dtypes.fp8e5m2: "_rfp8e5m2"}
# how a 16- or 8-bit float is read from its bit pattern and written back
_FROM_BITS = {dtypes.float16: "_H2F", dtypes.bfloat16: "_BF2F", dtypes.fp8e4m3: "_E4M3_TO_F",
              dtypes.fp8e5m2: "_E5M2_TO_F"}
_TO_BITS = {dtypes.float16: "_f16_bits", dtypes.bfloat16: "_bf16_bits", dtypes.fp8e4m3: "_fp8e4m3_bits",
            dtypes.fp8e5m2: "_fp8e5m2_bits"}
_TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})
# integer ops whose result always fits the dtype (no wraparound needed)
_INT_IN_RANGE_OPS = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.SHR, Ops.MAX, Ops.WHERE, Ops.MOD, Ops.TRUNC})
# ops on bools whose result is a bool already
_BOOL_CLOSED_OPS = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.MAX, Ops.WHERE})
# integer ops whose value range the IR proves (kiln.uop.ops.compute_min_max) so wraparound can be skipped
_RANGE_PROVEN_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.CAST})

def render_py_const(value, dtype: DType) -> str:
  """A Python literal for `value` rounded to `dtype`."""
  value = truncate(dtype, value)
  if dtype == dtypes.bool: return "True" if value else "False"
  if dtypes.is_int(dtype): return f"({value})" if value < 0 else str(value)
  if math.isnan(value): return "nan"
  if math.isinf(value): return "inf" if value > 0 else "(-inf)"
  return f"({value!r})" if math.copysign(1.0, value) < 0 else repr(value)

def wrap_int(dtype: DType, text: str) -> str:
  """`text` wrapped around to the range of the integer `dtype`."""
  mask = (1 << dtype.bitsize) - 1
  if dtypes.is_unsigned(dtype): return f"(({text})&{mask})"
  half = 1 << (dtype.bitsize - 1)
  return f"(((({text})+{half})&{mask})-{half})"

def _range_is_proven(u: UOp) -> bool:
  lo, hi = dtypes.min(u.dtype), dtypes.max(u.dtype)
  try: vmin, vmax = u.vmin, u.vmax
  except Exception: return False
  return lo <= vmin <= vmax <= hi and (vmin > lo or vmax < hi)

def _infix(symbol: str) -> Callable[[UOp, list[str]], str]:
  return lambda u, a: f"({a[0]}{symbol}{a[1]})"

def _call(function: str) -> Callable[[UOp, list[str]], str]:
  return lambda u, a: f"{function}({', '.join(a)})"

def _py_fdiv(u: UOp, a: list[str]) -> str: return f"({a[0]}/{a[1]} if {a[1]} else _fdiv0({a[0]}, {a[1]}))"
def _py_recip(u: UOp, a: list[str]) -> str: return f"(1.0/{a[0]} if {a[0]} else _fdiv0(1.0, {a[0]}))"

def _nonnegative_by_positive_const(u: UOp) -> bool:
  try: return u.src[1].op is Ops.CONST and u.src[1].arg > 0 and u.src[0].vmin >= 0
  except Exception: return False

def _py_idiv(u: UOp, a: list[str]) -> str:
  return f"({a[0]}//{a[1]})" if _nonnegative_by_positive_const(u) else f"_idiv({a[0]}, {a[1]})"

def _py_mod(u: UOp, a: list[str]) -> str:
  if dtypes.is_float(u.dtype): return f"_fmod({a[0]}, {a[1]})"
  return f"({a[0]}%{a[1]})" if _nonnegative_by_positive_const(u) else f"_imod({a[0]}, {a[1]})"

def _py_max(u: UOp, a: list[str]) -> str:
  if dtypes.is_float(u.dtype): return f"({a[0]} if ({a[0]} != {a[0]} or {a[0]} > {a[1]}) else {a[1]})"
  return f"({a[0]} if {a[0]} > {a[1]} else {a[1]})"

def _py_cast(u: UOp, a: list[str]) -> str:
  src, dst, x = u.src[0].dtype, u.dtype, a[0]
  if src == dst: return x
  if dst == dtypes.bool: return f"({x} != 0)"
  if dtypes.is_int(dst):
    if src == dtypes.bool: return f"int({x})"
    if dtypes.is_int(src): return x if _range_is_proven(u) else wrap_int(dst, x)
    return f"_f2i({x}, {dst.bitsize}, {not dtypes.is_unsigned(dst)})"
  if src == dtypes.bool: return f"float({x})"
  if dtypes.is_int(src):
    as_float = f"_i2f32({x})" if src.itemsize == 8 and dst in (dtypes.float32, dtypes.bfloat16) else f"float({x})"
    return as_float if dst == dtypes.float64 else f"{_FLOAT_ROUNDING[dst]}({as_float})"
  # float -> float: widening is exact; narrowing rounds (to bfloat16 always through float32, inside _rbf16)
  if dst == dtypes.float64 or (dst == dtypes.float32 and src != dtypes.float64): return x
  return f"{_FLOAT_ROUNDING[dst]}({x})"

def _py_bitcast(u: UOp, a: list[str]) -> str:
  src, dst = u.src[0].dtype, u.dtype
  if dtypes.bool in (src, dst) or src.itemsize != dst.itemsize:
    raise TypeError(f"PythonRenderer: cannot BITCAST {src} to {dst} (sizes must match and bool is not allowed)")
  bits = f"{_TO_BITS[src]}({a[0]})" if src in _TO_BITS else a[0]
  text = f"_bitcast({bits}, '<{PY_FORMATS[src]}', '<{PY_FORMATS[dst]}')"
  return f"{_FROM_BITS[dst]}[{text}]" if dst in _FROM_BITS else text

def _py_trunc(u: UOp, a: list[str]) -> str: return f"_trunc({a[0]})" if dtypes.is_float(u.dtype) else a[0]

# Op -> Python expression from operand expressions (before rounding/wrapping to the result dtype)
PY_EXPRESSIONS: dict[Ops, Callable[[UOp, list[str]], str]] = {
  Ops.ADD: _infix("+"), Ops.SUB: _infix("-"), Ops.MUL: _infix("*"), Ops.FDIV: _py_fdiv, Ops.IDIV: _py_idiv,
  Ops.MOD: _py_mod, Ops.MAX: _py_max, Ops.CMPLT: _infix("<"), Ops.CMPNE: _infix("!="), Ops.CMPEQ: _infix("=="),
  Ops.AND: _infix("&"), Ops.OR: _infix("|"), Ops.XOR: _infix("^"), Ops.SHL: _infix("<<"), Ops.SHR: _infix(">>"),
  Ops.POW: _call("_pow"), Ops.EXP2: _call("_exp2"), Ops.LOG2: _call("_log2"), Ops.SIN: _call("_sin"),
  Ops.SQRT: _call("_sqrt"), Ops.RECIP: _py_recip, Ops.NEG: lambda u, a: f"(-{a[0]})", Ops.TRUNC: _py_trunc,
  Ops.WHERE: lambda u, a: f"({a[1]} if {a[0]} else {a[2]})", Ops.CAST: _py_cast, Ops.BITCAST: _py_bitcast,
  Ops.MULACC: lambda u, a: f"{'_fma' if u.dtype == dtypes.float64 else '_fma32'}({', '.join(a)})",
}
# the Hopper ops: a kernel with any runs each block under `_scheduled` (threads in different roles run apart)
_HOPPER_OPS = frozenset({Ops.WGMMA, Ops.WGMMA_FENCE, Ops.WGMMA_COMMIT, Ops.WGMMA_WAIT, Ops.MBARRIER_INIT,
                         Ops.MBARRIER_ARRIVE, Ops.MBARRIER_WAIT, Ops.DEFINE_TENSORMAP, Ops.TMA_LOAD,
                         Ops.FENCE_PROXY_ASYNC, Ops.SETMAXNREG})
# ops whose threads work together: a kernel with any runs each block's threads in lockstep (`_lockstep`)
_COOPERATIVE_OPS = frozenset({Ops.BARRIER, Ops.SHUFFLE, Ops.DEFINE_LOCAL, Ops.ATOMIC, Ops.WMMA, Ops.LDMATRIX,
                              Ops.CP_ASYNC, Ops.CP_ASYNC_COMMIT, Ops.CP_ASYNC_WAIT, *_HOPPER_OPS})
_VALUE_PREFIX = {Ops.LOAD: "val", Ops.CAST: "cast", Ops.BITCAST: "cast", Ops.DEFINE_ACC: "acc"}

def round_to_dtype(u: UOp, text: str) -> str:
  """The ALU result `text` of `u` brought into its dtype (rounded, wrapped or made bool) as the C code does."""
  dtype = u.dtype
  if dtype == dtypes.bool:
    return text if u.op in GroupOp.Comparison | _BOOL_CLOSED_OPS else f"bool({text})"
  if dtypes.is_int(dtype):
    if u.op in _INT_IN_RANGE_OPS or (u.op in _RANGE_PROVEN_OPS and _range_is_proven(u)): return text
    return wrap_int(dtype, text)
  if dtype == dtypes.float64 or u.op in EXACT_FLOAT_OPS or u.op is Ops.MULACC: return text   # _fma32 rounds itself
  if dtype in (dtypes.float16, *dtypes.fp8s) and u.op in _TRANSCENDENTAL: text = f"_r32({text})"  # C: in float
  return f"{_FLOAT_ROUNDING[dtype]}({text})"

class PythonRenderer(Renderer):
  """Renders a linearized kernel as the source of a Python function (plain `for` loops over memoryviews)."""
  device = "PYTHON"
  has_local = False
  renders_math_forms = True

  def render(self, name: str, uops: list[UOp], threads=None) -> str:
    """The Python source of function `name`; see the module docstring for its arguments (`threads` is ignored: the
    emulator runs a kernel whole)."""
    return _PyKernelWriter(kernel_function_name(name), uops).render()

class _PyKernelWriter(KernelWriter):
  """Walks one uop list, naming values and emitting lines."""
  renderer_name = "PythonRenderer"
  expressions = PY_EXPRESSIONS

  def __init__(self, name: str, uops: list[UOp]):
    super().__init__(name, uops)
    self.names: dict[UOp, str] = {}
    self.block_sizes: list[int] = [0]   # statements emitted in each open block (an empty loop body needs `pass`)
    self.open_ranges: list[str] = []
    self.statements.update({
      Ops.RANGE: self._range, Ops.ENDRANGE: self._endrange, Ops.LOAD: self._load, Ops.STORE: self._store,
      Ops.DEFINE_ACC: self._define_acc, Ops.ASSIGN: self._assign, Ops.SPECIAL: self._special,
      **{op: self._nothing for op in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SINK)}})
    self.specials = 0   # GPU thread indices, each run as a loop around the rest of the kernel
    self.module_lines: list[str] = []   # module-level objects: the warp-wide ops' emulators
    self.statements.update({Ops.VECTORIZE: self._vectorize, Ops.GEP: self._gep})

  def expr(self, u: UOp) -> str:
    """The Python expression that reads the value of `u` at this point of the kernel."""
    if u.op is Ops.CONST:
      if u.dtype.count == 1: return render_py_const(u.arg, u.dtype)
      lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,) * u.dtype.count   # a vector constant: a tuple
      return f"({', '.join(render_py_const(x, u.dtype.scalar) for x in lanes)},)"
    if u.op is Ops.DEFINE_GLOBAL: return f"data{u.arg}"
    if u.op is Ops.DEFINE_VAR: return self.var_names[u]
    if u not in self.names:
      raise ValueError(f"PythonRenderer: {u.op.name} is used before it is computed in kernel {self.name}")
    return self.names[u]

  def index_expr(self, index: UOp) -> str:
    """The index of a LOAD/STORE, checked against going negative unless the IR proves it cannot."""
    try: proven = index.vmin >= 0
    except Exception: proven = False
    return self.expr(index) if proven else f"_check_index({self.expr(index)})"

  def emit(self, line: str) -> None:
    """Add one line in the innermost open block."""
    self.lines.append("  " * len(self.block_sizes) + line)
    self.block_sizes[-1] += 1

  @staticmethod
  def check_dtype(dtype: DType) -> None:
    """Raise TypeError for a dtype the emulator has no storage format for (a vector's lanes are a tuple)."""
    if dtype.scalar not in PY_FORMATS: raise TypeError(f"PythonRenderer: dtype {dtype} is not supported")

  def _vectorize(self, u: UOp) -> None:
    """A vector (a WMMA fragment) as a tuple of its lanes."""
    self.check_dtype(u.dtype)
    name = self.names[u] = self.fresh_name("vec")
    self.emit(f"{name} = ({', '.join(self.expr(s) for s in u.src)},)")

  def _gep(self, u: UOp) -> None:
    self.names[u] = f"{self.expr(u.src[0])}[{u.arg}]"   # read where it is used (an accumulator's current lanes)

  def _nothing(self, u: UOp) -> None: pass

  def _range(self, u: UOp) -> None:
    name = f"ridx{u.arg}" if isinstance(u.arg, int) and u.arg >= 0 else self.fresh_name("ridx_")
    if name in self.open_ranges: name = self.fresh_name(f"{name}_")   # never shadow an enclosing loop variable
    self.open_ranges.append(name)
    self.emit(f"for {name} in range({self.expr(u.src[0])}):")
    self.names[u] = name
    self.block_sizes.append(0)

  def _special(self, u: UOp) -> None:
    """A GPU thread index (kiln/codegen/gpudims.py) as a loop over its values: the mapped threads touch disjoint
    memory, so running them one after another gives what a launch gives."""
    name = self.names[u] = u.arg[0]
    self.emit(f"for {name} in range({u.arg[1]}):")
    self.block_sizes.append(0)
    self.specials += 1

  def _endrange(self, u: UOp) -> None:
    if len(self.block_sizes) <= 1 + self.specials:
      raise ValueError(f"PythonRenderer: ENDRANGE without an open RANGE in kernel {self.name}")
    if self.block_sizes[-1] == 0: self.emit("pass")
    self.block_sizes.pop()
    self.open_ranges.pop()

  def _load(self, u: UOp) -> None:
    self.check_dtype(u.dtype)
    if u.dtype.count > 1: raise self.fail(f"a vector LOAD ({u.dtype})")
    read = f"{self.expr(u.src[0])}[{self.index_expr(u.src[1])}]"
    if u.dtype in _FROM_BITS: read = f"{_FROM_BITS[u.dtype]}[{read}]"
    if len(u.src) == 3: read = f"({read} if {self.expr(u.src[2])} else {render_py_const(0, u.dtype)})"
    name = self.names[u] = self.fresh_name("val")
    self.emit(f"{name} = {read}")

  def _store(self, u: UOp) -> None:
    buf, index, value = u.src[:3]
    self.check_dtype(value.dtype)
    if value.dtype.count > 1: raise self.fail(f"a vector STORE ({value.dtype})")
    written = self.expr(value)
    if value.dtype in _TO_BITS: written = f"{_TO_BITS[value.dtype]}({written})"
    line = f"{self.expr(buf)}[{self.index_expr(index)}] = {written}"
    self.emit(f"if {self.expr(u.src[3])}: {line}" if len(u.src) == 4 else line)

  def _define_acc(self, u: UOp) -> None:
    self.check_dtype(u.dtype)
    name = self.names[u] = self.fresh_name("acc")
    self.emit(f"{name} = {self.expr(u.src[0])}")

  def _assign(self, u: UOp) -> None:
    target, value = u.src
    if target.op is not Ops.DEFINE_ACC:
      raise ValueError(f"PythonRenderer: ASSIGN must target a DEFINE_ACC, got {target.op}")
    self.emit(f"{self.expr(target)} = {self.expr(value)}")
    self.names[u] = self.expr(target)

  def _value(self, u: UOp) -> None:
    for dtype in (u.dtype, *(s.dtype for s in u.src)):
      self.check_dtype(dtype)
      if dtype.count > 1: raise self.fail(f"vector {u.op.name} ({dtype}): vectors are only WMMA/LDMATRIX fragments")
    # EXP2(a * (1/ln2)) is kiln's exp(a): e**a itself, as software math computes it (rounding the product first
    # would cost up to 60 ulp near overflow)
    # likewise SIN(pi/2 - y) and SIN(y) / SIN(pi/2 - y) in float64 are kiln's cos(y) and tan(y) (renders_math_forms)
    if u.op is Ops.EXP2 and (exp_of := exp_argument(u.src[0])) is not None: text = f"_exp({self.expr(exp_of)})"
    elif u.op is Ops.SIN and (cos_of := cos_argument(u.src[0])) is not None: text = f"_cos({self.expr(cos_of)})"
    elif (tan_of := tan_argument(u)) is not None: text = f"_tan({self.expr(tan_of)})"
    else: text = PY_EXPRESSIONS[u.op](u, [self.expr(s) for s in u.src])
    if u.op in GroupOp.ALU:
      check_alu_dtypes("PythonRenderer", u)
      text = round_to_dtype(u, text)
    name = self.names[u] = self.fresh_name(_VALUE_PREFIX.get(u.op, "alu"))
    self.emit(f"{name} = {text}")

  def write(self) -> str:
    """The whole source: helper import, signature, buffer views and body."""
    buffers, variables = kernel_signature(self.uops)
    self.var_names = {v: f"var{i}" for i, v in enumerate(variables)}
    for b in buffers:
      self.check_dtype(b.dtype)
      self.emit(f"data{b.arg} = buf{b.arg}.cast('{PY_FORMATS[b.dtype]}')")
    cooperative = any(u.op in _COOPERATIVE_OPS for u in self.uops)
    if cooperative: self._open_blocks()
    self.walk()
    if cooperative: self._close_blocks()
    for _ in range(self.specials):   # the thread-index loops close at the kernel's end
      if self.block_sizes[-1] == 0: self.emit("pass")
      self.block_sizes.pop()
    self.check_closed(len(self.block_sizes) - 1)
    if self.block_sizes[0] == 0: self.emit("pass")
    params = [f"buf{b.arg}" for b in buffers] + [self.var_names[v] for v in variables]
    header = f"from kiln.renderer.python import {', '.join(EMULATOR_HELPERS)}"
    if cooperative: header += "\n_device_arrays: dict = {}   # DEFINE_LOCALs in device memory: zero at load, kept"
    if self.module_lines: header += "\n" + "\n".join(self.module_lines)
    return "\n".join([header, "", f"def {self.name}({', '.join(params)}):", *self.lines, ""])

  # ---- cooperative GPU-style kernels: threads of a block in lockstep (barriers, shared memory, shuffles) ----
  def _open_blocks(self) -> None:
    """A kernel whose threads work together (`_COOPERATIVE_OPS`) runs each block's threads as generators in
    lockstep (`_lockstep`): a loop over each block index (`gidx`), the block's shared arrays, and the body as
    `def _thread(lidx0, ...)`, a generator that yields at each BARRIER and SHUFFLE. Device-memory arrays live in the
    module (`_device_arrays`) from one launch to the next, as a CUDA module's `__device__` arrays do."""
    specials = {u.arg[0]: u.arg[1] for u in self.uops if u.op is Ops.SPECIAL}
    arrays = list(dict.fromkeys(u for u in self.uops if u.op is Ops.DEFINE_LOCAL))
    for u in arrays:
      self.check_dtype(u.dtype)
      zero = "0" if u.dtype in _FROM_BITS else render_py_const(0, u.dtype)
      self.names[u] = u.arg[0]
      if len(u.arg) > 2 and u.arg[2] == "device":
        self.emit(f"{u.arg[0]} = _device_arrays.setdefault({u.arg[0]!r}, [{zero}] * {u.arg[1]})")
    blocks = sorted((k for k in specials if k.startswith("gidx")), reverse=True)   # gidx0 innermost
    for name in blocks:
      self.emit(f"for {name} in range({specials[name]}):")
      self.block_sizes.append(0)
    for u in arrays:
      if len(u.arg) <= 2:
        zero = "0" if u.dtype in _FROM_BITS else render_py_const(0, u.dtype)
        self.emit(f"{u.arg[0]} = [{zero}] * {u.arg[1]}   # the block's shared array")
    self.thread_indices = sorted((k for k in specials if k.startswith("lidx")), reverse=True)   # lidx0 fastest
    self.emit(f"def _thread({', '.join(reversed(self.thread_indices))}):")
    self.block_sizes.append(0)
    self.emit("if False: yield   # a generator even without a barrier")
    if any(u.op is Ops.CP_ASYNC for u in self.uops):
      self.emit("_copies, _groups = [], []   # CP_ASYNC: this thread's open group and its committed, pending ones")
    self.specials = len(blocks) + 1   # open blocks around the kernel's own loops (closed by _close_blocks)
    self.statements.update({Ops.SPECIAL: self._thread_index, Ops.DEFINE_LOCAL: self._nothing,
                            Ops.BARRIER: self._barrier, Ops.SHUFFLE: self._shuffle, Ops.ATOMIC: self._atomic,
                            Ops.LOAD: self._ordered_load, Ops.WMMA: self._wmma, Ops.LDMATRIX: self._ldmatrix,
                            Ops.CP_ASYNC: self._cp_async, Ops.CP_ASYNC_COMMIT: self._cp_async_commit,
                            Ops.CP_ASYNC_WAIT: self._cp_async_wait, Ops.WGMMA: self._wgmma,
                            Ops.DEFINE_TENSORMAP: self._define_tensormap, Ops.MBARRIER_INIT: self._mbarrier_init,
                            Ops.MBARRIER_ARRIVE: self._mbarrier_arrive, Ops.MBARRIER_WAIT: self._mbarrier_wait,
                            Ops.TMA_LOAD: self._tma_load,
                            **{op: self._no_effect for op in (Ops.WGMMA_FENCE, Ops.WGMMA_COMMIT, Ops.WGMMA_WAIT,
                                                              Ops.FENCE_PROXY_ASYNC, Ops.SETMAXNREG)}})
    self.thread_sizes = specials
    self.scheduled = any(u.op in _HOPPER_OPS for u in self.uops)

  def _close_blocks(self) -> None:
    self.block_sizes.pop()   # the thread function's body (never empty: its first line)
    loops = " ".join(f"for {name} in range({self.thread_sizes[name]})" for name in self.thread_indices)
    self.emit(f"{'_scheduled' if self.scheduled else '_lockstep'}([_thread({', '.join(reversed(self.thread_indices))}){' ' + loops if loops else ''}])")
    for _ in range(self.specials - 1): self.block_sizes.pop()
    self.specials = 0

  def _thread_index(self, u: UOp) -> None:
    self.names[u] = u.arg[0]   # a loop variable (gidx) or a parameter of `_thread` (lidx)

  def _barrier(self, u: UOp) -> None:
    self.emit("yield None   # BARRIER: every thread of the block gets here first")

  def _shuffle(self, u: UOp) -> None:
    self.check_dtype(u.dtype)
    name = self.names[u] = self.fresh_name("lane")
    self.emit(f"{name} = yield ({u.arg[0]}, {self.expr(u.src[0])})   # SHUFFLE: lane ^ {u.arg[0]}'s value")

  def _ordered_load(self, u: UOp) -> None:
    if len(u.src) == 3 and u.src[2].op is Ops.BARRIER:   # ordered after the barrier, not gated
      plain = UOp(Ops.LOAD, u.dtype, u.src[:2])
      self._load(plain)
      self.names[u] = self.names[plain]
    else: self._load(u)

  def _atomic(self, u: UOp) -> None:
    buf, index, value, gate = u.src[:4]
    if u.arg is not Ops.ADD or not dtypes.is_int(u.dtype):
      raise self.fail(f"ATOMIC {u.arg} on {u.dtype}")
    name = self.names[u] = self.fresh_name("ticket")
    at = f"{self.expr(buf)}[{self.index_expr(index)}]"
    self.emit(f"{name} = 0")
    self.emit(f"if {self.expr(gate)}: {name} = {at}; {at} = {wrap_int(u.dtype, f'{name}+{self.expr(value)}')}")

  # ---- tensor-core building blocks (docs/ir.md stage 4) ----
  def _warp_op(self, u: UOp, construct: str, payload: str, prefix: str) -> None:
    """`name = yield (_WARP, op, payload)`: the lockstep runner gives each warp's 32 payloads to `op` at once."""
    op = f"_{prefix}{len(self.module_lines)}"
    self.module_lines.append(f"{op} = {construct}")
    name = self.names[u] = self.fresh_name(prefix)
    self.emit(f"{name} = yield (_WARP, {op}, {payload})   # {u.op.name}: the warp's lanes at once")

  def _wmma(self, u: UOp) -> None:
    tc = u.arg
    for s in u.src: self.check_dtype(s.dtype)
    tf32 = tc.dtype_in == dtypes.float32
    self._warp_op(u, f"_WarpMMA({tc.dims!r}, {tf32}, {tc.a_layout!r}, {tc.b_layout!r}, {tc.c_layout!r})",
                  f"({', '.join(self.expr(s) for s in u.src)})", "wmma")

  def _ldmatrix(self, u: UOp) -> None:
    buf, index = u.src[:2]
    self.check_dtype(buf.dtype)
    values = _FROM_BITS.get(buf.dtype)   # 16-bit floats live in shared arrays as their bits
    self._warp_op(u, f"_WarpLoadMatrix({u.arg[0]}, {u.arg[1]}, {values})", f"({self.expr(buf)}, {self.expr(index)})",
                  "ldm")

  def _cp_async(self, u: UOp) -> None:
    """The copy's source elements read now, written when a CP_ASYNC_WAIT lands its group (`_land`)."""
    dst, dst_index, src, src_index = u.src[:4]
    count = u.arg[0] // src.dtype.itemsize
    read = f"_read_async({self.expr(src)}, {self.expr(src_index)}, {count})"
    zero = "0" if src.dtype in _FROM_BITS else render_py_const(0, src.dtype)
    if len(u.src) == 5: read = f"({read} if {self.expr(u.src[4])} else [{zero}] * {count})"
    self.emit(f"_copies.append(({self.expr(dst)}, {self.index_expr(dst_index)}, {read}))   # CP_ASYNC")

  def _cp_async_commit(self, u: UOp) -> None:
    self.emit("_groups.append(_copies); _copies = []   # CP_ASYNC_COMMIT")

  def _cp_async_wait(self, u: UOp) -> None:
    self.emit(f"while len(_groups) > {u.arg}: _land(_groups.pop(0))   # CP_ASYNC_WAIT {u.arg}")

  # ---- Hopper (docs/ir.md stage 4, "Hopper"): run by `_scheduled` ----
  def _gated(self, u: UOp, at: int, line: str) -> None:
    gate = u.src[at]
    self.emit(line if gate.op is Ops.CONST and gate.arg is True else f"if {self.expr(gate)}: {line}")

  def _no_effect(self, u: UOp) -> None:
    self.emit(f"pass   # {u.op.name}: orders the GPU's asynchronous work; the emulator runs it in order")

  def _define_tensormap(self, u: UOp) -> None:
    self.names[u] = self.expr(u.src[0])   # the emulator reads the map's buffer itself

  def _mbarrier_init(self, u: UOp) -> None:
    self._gated(u, 2, f"_mbar_init({self.expr(u.src[0])}, {self.expr(u.src[1])}, {u.arg})   # MBARRIER_INIT")

  def _mbarrier_arrive(self, u: UOp) -> None:
    self._gated(u, 2, f"_mbar({self.expr(u.src[0])}, {self.expr(u.src[1])}).arrive({u.arg})   # MBARRIER_ARRIVE")

  def _mbarrier_wait(self, u: UOp) -> None:
    bars, index, parity = (self.expr(s) for s in u.src[:3])
    self._gated(u, 3, f"yield (_WAIT, _mbar({bars}, {index}), ({parity}) & 1)   # MBARRIER_WAIT")

  def _tma_load(self, u: UOp) -> None:
    dst, offset, tmap, bars, bar, row, col = u.src[:7]
    m = tmap.arg[1]
    desc = (m.rows, m.cols, m.stride, m.box[0], m.box[1], m.swizzle, m.dtype.itemsize)
    self._gated(u, 7, f"_tma_load({self.expr(dst)}, {self.expr(offset)}, {self.expr(tmap)}, {desc!r}, "
                      f"{self.expr(bars)}, {self.expr(bar)}, {self.expr(row)}, {self.expr(col)})   # TMA_LOAD")

  def _wgmma(self, u: UOp) -> None:
    wg = u.arg
    self.check_dtype(wg.dtype_in)
    values = _FROM_BITS.get(wg.dtype_in)
    a, b = ((m.swizzle, m.sbo, m.lbo) for m in (wg.a, wg.b))
    op = f"_wgmma{len(self.module_lines)}"
    self.module_lines.append(f"{op} = _WarpgroupMMA({wg.n}, {wg.dims[2]}, {wg.dtype_in.itemsize}, {a!r}, {b!r}, "
                             f"{wg.dtype_in == dtypes.float32}, {values})")
    acc = self.expr(u.src[4])
    payload = f"({', '.join(self.expr(s) for s in u.src[:5])})"
    name = self.names[u] = self.fresh_name("wgmma")
    gate = u.src[5]
    if gate.op is Ops.CONST and gate.arg is True: self.emit(f"{name} = yield (_GROUP, {op}, {payload})   # WGMMA")
    else: self.emit(f"{name} = (yield (_GROUP, {op}, {payload})) if {self.expr(gate)} else {acc}   # WGMMA")
