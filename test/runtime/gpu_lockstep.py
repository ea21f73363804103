"""A lockstep GPU emulator for tests: runs the linear uops of a GPU kernel (SPECIAL block and thread indices, shared
arrays, BARRIERs, warp SHUFFLEs) block by block, every thread of a block at once as one NumPy lane, so a barrier holds by
construction and shared memory means what it means on a GPU. Stricter than hardware where that finds bugs: a load or
store out of bounds, two threads storing different values at one address in one store, or a wide access (a vector
LOAD or STORE of kiln/codegen/wide_memory.py, lanes `index + k`) at an index that is not a multiple of its lanes,
raises.

  run_lockstep(uops, launch, buffers)   # buffers: {parameter number: 1-D NumPy array}, written in place
"""
from __future__ import annotations
import numpy as np
from kiln.dtype import FP8_VALUES, dtypes, to_numpy_dtype
from kiln.uop.ops import UOp, Ops

class LockstepError(AssertionError):
  """A kernel did something a GPU would not do reliably (a race on a store, an access out of bounds)."""

def _trunc_div(a, b):
  quotient = np.abs(a) // np.abs(b)
  return np.where((a < 0) != (b < 0), -quotient, quotient).astype(a.dtype)

_BINARY = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less,
           Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or,
           Ops.XOR: np.bitwise_xor, Ops.SHL: np.left_shift, Ops.SHR: np.right_shift, Ops.POW: np.power}
_UNARY = {Ops.NEG: np.negative, Ops.SQRT: np.sqrt, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin,
          Ops.TRUNC: np.trunc, Ops.RECIP: lambda x: np.divide(1, x)}

def run_lockstep(uops: list[UOp], launch, buffers: dict[int, np.ndarray], var_vals: dict | None = None) -> None:
  """Run `uops` over the (grid, block) sizes `launch` (None: one thread) on `buffers`."""
  grid, block = launch if launch is not None else ((1, 1, 1), (1, 1, 1))
  threads = int(np.prod(block))
  flat = np.arange(threads)
  thread_index = [flat % block[0], flat // block[0] % block[1], flat // (block[0] * block[1])]
  ends, starts = {}, []
  for pc, u in enumerate(uops):   # each RANGE's ENDRANGE
    if u.op is Ops.RANGE: starts.append(pc)
    elif u.op is Ops.ENDRANGE: ends[starts.pop()] = pc
  device_arrays: dict[UOp, np.ndarray] = {}
  with np.errstate(all="ignore"):
    for gz in range(grid[2]):
      for gy in range(grid[1]):
        for gx in range(grid[0]):
          _run_block(uops, ends, (gx, gy, gz), thread_index, threads, buffers, device_arrays, var_vals or {})

def _lanes(value, threads: int, dtype) -> np.ndarray:
  out = np.asarray(value)
  return out if out.shape == (threads,) else np.full(threads, out, dtype=to_numpy_dtype(dtype))

def _run_block(uops, ends, block_index, thread_index, threads, buffers, device_arrays, var_vals) -> None:
  values: dict[UOp, np.ndarray] = {}
  counters: dict[UOp, int] = {}
  shared: dict[UOp, np.ndarray] = {}
  range_pc = {u: pc for pc, u in enumerate(uops) if u.op is Ops.RANGE}
  async_copies: list = []   # CP_ASYNC: the block's open group (its threads issue in lockstep) and committed groups
  async_groups: list = []
  barriers: dict = {}   # (mbarrier array, index) -> [count, pending arrivals, tx bytes, completed phases, writes]
  def buffer_of(u: UOp) -> np.ndarray:
    if u.op is Ops.DEFINE_GLOBAL: return buffers[u.arg]
    if len(u.arg) > 2: return device_arrays.setdefault(u, np.zeros(u.arg[1], to_numpy_dtype(u.dtype)))
    return shared[u]
  def checked(buf: np.ndarray, index: np.ndarray, gate: np.ndarray, u: UOp) -> np.ndarray:
    bad = gate & ((index < 0) | (index >= buf.shape[0]))
    if bad.any(): raise LockstepError(f"{u.op.name} out of bounds: index {index[bad][0]} of {buf.shape[0]}")
    return np.where(gate, index, 0)
  pc = 0
  while pc < len(uops):
    u = uops[pc]
    op = u.op
    if op is Ops.RANGE:
      size = _lanes(values[u.src[0]], threads, u.dtype)
      if (size != size[0]).any(): raise LockstepError("a loop bound differs between the threads of a block")
      if size[0] <= 0: pc = ends[pc] + 1; continue
      counters[u] = 0
      values[u] = _lanes(0, threads, u.dtype)
    elif op is Ops.ENDRANGE:
      rng = u.src[0]
      counters[rng] += 1
      if counters[rng] < int(np.asarray(values[rng.src[0]]).flat[0]):
        values[rng] = _lanes(counters[rng], threads, rng.dtype)
        pc = range_pc[rng] + 1
        continue
    elif op is Ops.CONST and u.dtype.count > 1:   # a vector constant: (lanes, threads)
      lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,) * u.dtype.count
      values[u] = np.stack([_lanes(x, threads, u.dtype.scalar) for x in lanes])
    elif op is Ops.CONST: values[u] = _lanes(u.arg, threads, u.dtype)
    elif op is Ops.DEFINE_GLOBAL: pass
    elif op is Ops.DEFINE_VAR: values[u] = _lanes(var_vals[u], threads, u.dtype)
    elif op is Ops.DEFINE_LOCAL:
      if len(u.arg) <= 2: shared[u] = np.zeros(u.arg[1], to_numpy_dtype(u.dtype))
    elif op is Ops.SPECIAL:
      kind, size = u.arg[0], u.arg[1]
      axis = int(kind[4:])
      values[u] = (thread_index[axis] if kind.startswith("lidx") else _lanes(block_index[axis], threads, u.dtype)
                   ).astype(np.int32)
    elif op is Ops.BARRIER: pass   # lockstep: every thread finished what comes before
    elif op is Ops.LOAD and u.dtype.count > 1:
      buf, lanes = buffer_of(u.src[0]), u.dtype.count
      index = _wide_index(_lanes(values[u.src[1]] if u.src[1] in values else u.src[1].arg, threads, u.src[1].dtype),
                          lanes, u)
      values[u] = np.stack([buf[checked(buf, index + k, np.ones(threads, bool), u)] for k in range(lanes)])
    elif op is Ops.GEP: values[u] = values[u.src[0]][u.arg]
    elif op is Ops.VECTORIZE: values[u] = np.stack([_lanes(values[s], threads, s.dtype) for s in u.src])
    elif op is Ops.STORE and u.src[2].dtype.count > 1:
      buf, lanes = buffer_of(u.src[0]), u.src[2].dtype.count
      gate = values[u.src[3]] if len(u.src) == 4 else np.ones(threads, bool)
      index = _wide_index(_lanes(values[u.src[1]] if u.src[1] in values else u.src[1].arg, threads, u.src[1].dtype),
                          lanes, u)
      for k in range(lanes): _store(buf, checked(buf, index + k, gate, u)[gate], values[u.src[2]][k][gate], u)
    elif op is Ops.LOAD:
      buf = buffer_of(u.src[0])
      gate = values[u.src[2]] if len(u.src) == 3 and u.src[2].op is not Ops.BARRIER else np.ones(threads, bool)
      index = checked(buf, values[u.src[1]], gate, u)
      values[u] = np.where(gate, buf[index], np.zeros((), buf.dtype))
    elif op is Ops.STORE:
      buf = buffer_of(u.src[0])
      gate = values[u.src[3]] if len(u.src) == 4 else np.ones(threads, bool)
      index = checked(buf, values[u.src[1]], gate, u)[gate]
      _store(buf, index, _lanes(values[u.src[2]], threads, u.src[2].dtype)[gate], u)
    elif op is Ops.ATOMIC:
      buf = buffer_of(u.src[0])
      index, add, gate = values[u.src[1]], _lanes(values[u.src[2]], threads, u.dtype), values[u.src[3]]
      old = np.zeros(threads, buf.dtype)
      for t in np.flatnonzero(gate):   # one thread after another
        old[t] = buf[index[t]]
        buf[index[t]] += add[t]
      values[u] = old
    elif op is Ops.SHUFFLE:   # lane l of each warp reads lane l ^ k of its warp (docs/ir.md stage 4)
      k, warp = u.arg
      lanes = np.arange(threads)
      partner = lanes ^ k
      if threads % warp or (partner >= threads).any() or (partner // warp != lanes // warp).any():
        raise LockstepError(f"SHUFFLE {u.arg} in a block of {threads} threads: a lane's partner is not in its warp")
      values[u] = _lanes(values[u.src[0]], threads, u.dtype)[partner]
    elif op is Ops.WMMA: values[u] = _wmma(u, [values[s] for s in u.src], threads)
    elif op is Ops.LDMATRIX: values[u] = _ldmatrix(u, buffer_of(u.src[0]), values[u.src[1]], threads)
    elif op is Ops.CP_ASYNC:   # read now, written when a CP_ASYNC_WAIT lands its group
      dst, src, count = buffer_of(u.src[0]), buffer_of(u.src[2]), u.arg[0] // u.src[2].dtype.itemsize
      gate = values[u.src[4]] if len(u.src) == 5 else np.ones(threads, bool)
      at, to = _wide_index(values[u.src[3]], count, u), _wide_index(values[u.src[1]], count, u)
      data = np.stack([np.where(gate, src[checked(src, at + e, gate, u)], np.zeros((), src.dtype))
                       for e in range(count)])
      for e in range(count): checked(dst, to + e, np.ones(threads, bool), u)
      async_copies.append((dst, to, data, u))
    elif op is Ops.CP_ASYNC_COMMIT:
      async_groups.append(list(async_copies))
      async_copies.clear()
    elif op is Ops.CP_ASYNC_WAIT:
      while len(async_groups) > u.arg:
        for dst, to, data, copy in async_groups.pop(0):
          for e in range(data.shape[0]): _store(dst, to + e, data[e], copy)
    elif op in _HOPPER: _hopper(u, values, buffer_of, threads, barriers)
    elif op is Ops.DEFINE_ACC: values[u] = np.array(values[u.src[0]], copy=True)
    elif op is Ops.ASSIGN: values[u.src[0]] = values[u] = values[u.src[1]]
    else: values[u] = _alu(u, [values[s] for s in u.src])
    pc += 1

def _fragment_values(x: np.ndarray, dtype) -> np.ndarray:
  """A fragment's lanes as float64 values: bfloat16 and fp8 travel as bits here; float32 is a tf32 operand, its low
  13 mantissa bits dropped (as the tensor cores read it)."""
  if dtype == dtypes.bfloat16: return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
  if dtype in dtypes.fp8s: return np.array(FP8_VALUES[dtype], np.float64)[x]
  if dtype == dtypes.float32: return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
  return x.astype(np.float64)

def _warps(threads: int, u: UOp) -> range:
  if threads % 32: raise LockstepError(f"{u.op.name} in a block of {threads} threads: not whole warps of 32")
  return range(0, threads, 32)

def _wmma(u: UOp, args: list[np.ndarray], threads: int) -> np.ndarray:
  """Each warp's D = A @ B + C (Ops.WMMA) from its lanes' fragments, in float64 then rounded to float32 (the
  products are exact; the float64 sum of at most 33 terms rounds less than float32's last bit in tests' ranges)."""
  tc = u.arg
  m, n, k = tc.dims
  a, b = _fragment_values(args[0], tc.dtype_in), _fragment_values(args[1], tc.dtype_in)
  c = args[2].astype(np.float64)
  out = np.zeros((len(tc.c_layout[0]), threads), np.float32)
  for w in _warps(threads, u):
    A, B, C = np.zeros((m, k)), np.zeros((k, n)), np.zeros((m, n))
    for lane in range(32):
      for i, (r, col) in enumerate(tc.a_layout[lane]): A[r, col] = a[i, w + lane]
      for i, (r, col) in enumerate(tc.b_layout[lane]): B[r, col] = b[i, w + lane]
      for i, (r, col) in enumerate(tc.c_layout[lane]): C[r, col] = c[i, w + lane]
    D = (A @ B + C).astype(np.float32)
    for lane in range(32):
      for i, (r, col) in enumerate(tc.c_layout[lane]): out[i, w + lane] = D[r, col]
  return out

def _ldmatrix(u: UOp, buf: np.ndarray, index: np.ndarray, threads: int) -> np.ndarray:
  """Each warp's LDMATRIX: lanes 8j..8j+7 name the rows of matrix j (8 aligned elements each); lane l gets elements
  (l // 4, 2*(l % 4) + e) of each, or (2*(l % 4) + e, l // 4) transposed."""
  matrices, trans = u.arg
  out = np.zeros((2 * matrices, threads), buf.dtype)
  index = np.asarray(index)
  for w in _warps(threads, u):
    for j in range(matrices):
      rows = index[w + 8 * j:w + 8 * j + 8]
      if (rows % 8).any() or (rows < 0).any() or (rows + 8 > buf.shape[0]).any():
        raise LockstepError(f"LDMATRIX rows at {rows.tolist()} of {buf.shape[0]}: out of bounds or not 16-byte aligned")
      grid = np.stack([buf[r:r + 8] for r in rows])
      for lane in range(32):
        r, col = lane // 4, 2 * (lane % 4)
        pair = (grid[col, r], grid[col + 1, r]) if trans else (grid[r, col], grid[r, col + 1])
        out[2 * j, w + lane], out[2 * j + 1, w + lane] = pair
  return out

def _wide_index(index: np.ndarray, lanes: int, u: UOp) -> np.ndarray:
  """The first element of each thread's wide access, which must be a multiple of its lanes (aligned)."""
  index = np.asarray(index)
  if (index % lanes).any():
    raise LockstepError(f"a {lanes}-lane {u.op.name} at element {index[index % lanes != 0].flat[0]}: not aligned")
  return index

def _store(buf: np.ndarray, index: np.ndarray, written: np.ndarray, u: UOp) -> None:
  """`buf[index] = written` for the storing threads, raising where two of them store different values at one place."""
  written = written.astype(buf.dtype)
  order = np.argsort(index, kind="stable")
  same = index[order][1:] == index[order][:-1]
  if (same & (written[order][1:] != written[order][:-1])).any():
    raise LockstepError(f"two threads store different values at one address of {u.src[0].op.name}")
  buf[index] = written

def _alu(u: UOp, args: list[np.ndarray]) -> np.ndarray:
  """One ALU op on every thread's operands, rounded to the op's dtype."""
  out_dtype = to_numpy_dtype(u.dtype)
  op = u.op
  if op is Ops.CAST: return args[0].astype(out_dtype)
  if op is Ops.BITCAST: return args[0].view(out_dtype)
  if op is Ops.WHERE: return np.where(args[0], args[1], args[2]).astype(out_dtype)
  if op is Ops.MULACC:   # one rounding (exact products of float32 in float64, then one more for the add: close)
    wide = args[0].astype(np.float64) * args[1].astype(np.float64) + args[2].astype(np.float64)
    return wide.astype(out_dtype)
  if op is Ops.IDIV: return _trunc_div(args[0], args[1])
  if op is Ops.MOD: return np.fmod(args[0], args[1]).astype(out_dtype)
  if op is Ops.FDIV: return np.divide(args[0], args[1]).astype(out_dtype)
  if op in _BINARY: return _BINARY[op](args[0], args[1]).astype(out_dtype)
  if op in _UNARY: return _UNARY[op](args[0]).astype(out_dtype)
  raise NotImplementedError(f"lockstep emulator: no {op.name} ({u.dtype})")

# ---------------- Hopper (docs/ir.md stage 4, "Hopper"), in program order ----------------

_HOPPER = frozenset({Ops.WGMMA, Ops.WGMMA_FENCE, Ops.WGMMA_COMMIT, Ops.WGMMA_WAIT, Ops.MBARRIER_INIT,
                     Ops.MBARRIER_ARRIVE, Ops.MBARRIER_WAIT, Ops.DEFINE_TENSORMAP, Ops.TMA_LOAD,
                     Ops.FENCE_PROXY_ASYNC, Ops.SETMAXNREG})
_GATE = {Ops.WGMMA: 5, Ops.MBARRIER_INIT: 2, Ops.MBARRIER_ARRIVE: 2, Ops.MBARRIER_WAIT: 3, Ops.TMA_LOAD: 7}

def _swizzled(byte: int, span: int) -> int:
  """Where a swizzled layout puts logical byte `byte` of a shared array, by rows of `span` bytes: 16-byte chunk c of
  row R lands at chunk c ^ ((R % 8) // (128 // span)) (128B: c ^ R % 8; 64B: c ^ (R % 8) // 2; 32B: ... // 4)."""
  if span == 0: return byte
  row, chunk = byte // span, byte % span // 16
  return row * span + (chunk ^ ((row % 8) // (128 // span))) * 16 + byte % 16

def _phase_done(bar: list) -> None:
  if bar[1] == 0 and bar[2] == 0:
    for dst, index, value in bar[4]: dst[index] = value
    bar[1], bar[3], bar[4] = bar[0], bar[3] + 1, []

def _hopper(u: UOp, values, buffer_of, threads: int, barriers: dict) -> None:
  """One Hopper op for every thread of the block at once. The block runs in program order, so an mbarrier wait
  whose phase has not completed when all threads reach it would wait forever: LockstepError."""
  op = u.op
  gate = np.ones(threads, bool) if op not in _GATE else _lanes(values[u.src[_GATE[op]]], threads, dtypes.bool)
  lanes = np.flatnonzero(gate)
  def bar_of(t: int) -> list:
    key = (u.src[0] if op is not Ops.TMA_LOAD else u.src[3],
           int(_lanes(values[u.src[1] if op is not Ops.TMA_LOAD else u.src[4]], threads, dtypes.int32)[t]))
    if key not in barriers: raise LockstepError(f"{op.name} on mbarrier {key[1]} before its init")
    return barriers[key]
  if op is Ops.MBARRIER_INIT:
    for t in lanes: barriers[u.src[0], int(_lanes(values[u.src[1]], threads, dtypes.int32)[t])] = [u.arg, u.arg, 0, 0, []]
  elif op is Ops.MBARRIER_ARRIVE:
    for t in lanes:
      bar = bar_of(t)
      bar[1] -= 1
      bar[2] += u.arg
      if bar[1] < 0: raise LockstepError("more mbarrier arrivals in one phase than its count")
      _phase_done(bar)
  elif op is Ops.MBARRIER_WAIT:
    parity = _lanes(values[u.src[2]], threads, dtypes.int32) & 1
    for t in lanes:
      if bar_of(t)[3] % 2 == parity[t]:
        raise LockstepError(f"thread {t} waits on an mbarrier phase (parity {parity[t]}) that has not completed when "
                            "every thread is there: in program order it never would")
  elif op is Ops.TMA_LOAD:
    dst, src, tmap = buffer_of(u.src[0]), buffer_of(u.src[2].src[0]), u.src[2].arg[1]
    size = tmap.dtype.itemsize
    offset, row, col = (_lanes(values[u.src[i]], threads, dtypes.int32) for i in (1, 5, 6))
    for t in lanes:
      writes = []
      for i in range(tmap.box[0]):
        for j in range(tmap.box[1]):
          r, c = int(row[t]) + i, int(col[t]) + j
          value = src[r * tmap.stride + c] if 0 <= r < tmap.rows and 0 <= c < tmap.cols else 0
          writes.append((dst, _swizzled(int(offset[t]) + (i * tmap.box[1] + j) * size, tmap.swizzle) // size, value))
      bar = bar_of(t)
      bar[2] -= tmap.box_bytes
      bar[4].extend(writes)
      if bar[1] == 0 and bar[2] < 0: raise LockstepError("more TMA bytes on an mbarrier phase than expected")
      _phase_done(bar)
  elif op is Ops.WGMMA: values[u] = _wgmma(u, values, buffer_of, gate, threads)

def _wgmma(u: UOp, values, buffer_of, gate: np.ndarray, threads: int) -> np.ndarray:
  """Each warpgroup's (gated as a whole) D = A @ B^T + acc, A and B read from their shared tiles by the layouts'
  row and chunk rule (`_swizzled`), in float64 then rounded to float32."""
  wg = u.arg
  m, n, k = wg.dims
  size = wg.dtype_in.itemsize
  acc = values[u.src[4]]
  out = np.array(acc, np.float32, copy=True)
  if threads % 128: raise LockstepError(f"WGMMA in a block of {threads} threads: not whole warpgroups")
  def tile(smem: UOp, start: int, layout, rows: int) -> np.ndarray:
    data = buffer_of(smem)
    out = np.zeros((rows, k), data.dtype)
    for r in range(rows):
      for e in range(k):
        kb = e * size
        if layout.swizzle: byte = _swizzled(start + (r // 8) * layout.sbo + (r % 8) * layout.swizzle + kb, layout.swizzle)
        else: byte = start + (r // 8) * layout.sbo + (kb // 16) * layout.lbo + (r % 8) * 16 + kb % 16
        out[r, e] = data[byte // size]
    return _fragment_values(out, wg.dtype_in)
  for g in range(0, threads, 128):
    if not gate[g:g + 128].any(): continue
    if not gate[g:g + 128].all(): raise LockstepError("a WGMMA's gate differs within a warpgroup")
    a_at = _lanes(values[u.src[1]], threads, dtypes.int32)[g:g + 128]
    b_at = _lanes(values[u.src[3]], threads, dtypes.int32)[g:g + 128]
    if (a_at != a_at[0]).any() or (b_at != b_at[0]).any(): raise LockstepError("a WGMMA's operands differ in a warpgroup")
    A, B = tile(u.src[0], int(a_at[0]), wg.a, 64), tile(u.src[2], int(b_at[0]), wg.b, n)
    C = np.zeros((m, n))
    for t in range(128):
      for i, (r, c) in enumerate(wg.c_layout[t]): C[r, c] = acc[i, g + t]
    D = (A @ B.T + C).astype(np.float32)
    for t in range(128):
      for i, (r, c) in enumerate(wg.c_layout[t]): out[i, g + t] = D[r, c]
  return out
