"""SLP vectorizing: the upcast lanes of a linearized kernel become explicit vector uops (docs/ir.md, "Vector code").

The optimizer upcasts by copying the scalar graph once per lane, so a linearized kernel holds groups of *isomorphic*
scalar uops: the same op, dtype and arg applied to lanes of operands. `vectorize` finds them bottom-up from seeds,
in the manner of a superword-level-parallelism (SLP) vectorizer:

- seeds: stores of one value dtype to consecutive addresses of one buffer (`base + c`, `base + c+1`, ...) in one
  block, and accumulators (DEFINE_ACC with one ASSIGN each) whose updates have the same op;
- a *bundle* (a tuple of n scalar uops, one per lane) becomes: a vector op over the operands' bundles (same op,
  dtype and arg); a vector constant (every lane a CONST); a broadcast (every lane the same uop); one vector load (loads
  of consecutive addresses, also where they overlap another vector load's: a window's shifted runs of a row); a vector
  accumulator (seeds tried 16, 8 and 4 lanes wide from each accumulator); or, for anything else, a vector built from
  the scalars (`VECTORIZE`). A seed whose bundles are mostly built from scalars is not worth it and stays scalar;
- a vector uop is placed where its last lane was; scalar code that reads a lane gets `GEP(vector, lane)`.

It stays bit-identical to the scalar code: every lane computes the same ops in the same order (no reassociation),
and only ops whose vector form is exact are vectorized (float32, int32, uint32 and bool lanes, and uint8/int8 lanes
for quantized weights: their loads, wrapping arithmetic, bit ops and shifts, and their conversion to int32/float32;
no float16/bfloat16/fp8/64-bit, no libm calls, no gated loads, integer division only by a constant other than 0 and
-1, shifts only by one value proven below the lane width). A vector is at most `max_lanes` lanes wide, one register
of the target: wider generic vectors are split by the C compiler, and gcc splits them badly (a DP4A's byte operands
are four times its int32 lanes: one register too). Loads never move past a store to their buffer, nor stores past a
load or store of theirs, and an accumulator is vectorized only when every scalar read of it comes after all its
lanes' updates.

Vector uops (a vector dtype is `dtype.vec(n)`, kiln/dtype.py):
| op | src | arg | meaning |
| --- | --- | --- | --- |
| `LOAD` | `(DEFINE_GLOBAL, index)` | None | lanes `buf[index + k]` |
| `STORE` | `(DEFINE_GLOBAL, index, vector)` | None | `buf[index + k] = lane k` |
| `CONST` | `()` | tuple of lane values | a vector constant |
| `VECTORIZE` | n scalars | None | the vector of those scalars (the same one n times: a broadcast) |
| `GEP` | `(vector,)` | lane | one lane as a scalar |
| `DP4A` | `(acc, a0, b0, ...)` | a < 128 | int32 lane l: acc's plus each pair's bytes 4l..4l+3 multiplied and summed |
| ALU, `CAST`, `BITCAST`, `DEFINE_ACC`, `ASSIGN` | vectors | as scalar | lane by lane |
A bool vector's lanes are all-ones or all-zero masks as wide as the lanes they were compared from (32 bits).
A DP4A operand of 4 bytes is those 4 bytes in every lane (x's bytes against 16 rows of a tiled weight).
"""
from __future__ import annotations
from kiln.dtype import DType, dtypes, truncate
from kiln.uop.ops import UOp, Ops, GroupOp
# the Ops members these loops over every uop test, bound once: under Python 3.11 each `Ops.X` read costs ~130 ns
# (EnumType defines __getattr__, which puts every attribute read on the class on a slow path), 10x a global's
_RANGE, _ENDRANGE, _CONST, _GEP, _VECTORIZE = Ops.RANGE, Ops.ENDRANGE, Ops.CONST, Ops.GEP, Ops.VECTORIZE
_DEFINE_ACC, _LOAD, _STORE, _ASSIGN, _CAST, _BITCAST = (Ops.DEFINE_ACC, Ops.LOAD, Ops.STORE, Ops.ASSIGN, Ops.CAST,
                                                        Ops.BITCAST)

VECTOR_WIDTHS = (16, 8, 4)   # lane counts tried, widest first (16 float32 = one AVX-512 register)
LANE_DTYPES = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.bool, dtypes.uint8, dtypes.int8})
# bool is stored as bytes: stays scalar. 8-bit lanes are quantized weights: loaded, unpacked, converted
MEMORY_DTYPES = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.uint8, dtypes.int8})
_INTS = frozenset({dtypes.int32, dtypes.uint32})
_BYTES = frozenset({dtypes.uint8, dtypes.int8})
# the ALU ops that are exact lane by lane, per lane dtype of their operands
VECTOR_ALU: dict[DType, frozenset[Ops]] = {
  dtypes.float32: frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.RECIP, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
                             Ops.CMPEQ, Ops.WHERE, Ops.MULACC}),
  dtypes.int32: frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR,
                           Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD, Ops.WHERE}),
  dtypes.bool: frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE}),
}
VECTOR_ALU[dtypes.uint32] = VECTOR_ALU[dtypes.int32]
# 8-bit lanes wrap as C's scalar code does when it stores an int result into a char; no compares (a bool lane is a
# 32-bit mask), no division
VECTOR_ALU[dtypes.uint8] = VECTOR_ALU[dtypes.int8] = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR,
                                                                Ops.SHL, Ops.SHR})
# (from, to) conversions whose vector form gives the scalar C conversion's bits
VECTOR_CASTS = frozenset({(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.uint32,
                          dtypes.float32), (dtypes.int32, dtypes.uint32), (dtypes.uint32, dtypes.int32),
                          *((b, d) for b in _BYTES for d in (dtypes.float32, dtypes.int32)),
                          *((dtypes.int32, b) for b in _BYTES),   # narrowing: quantized activations
                          *((dtypes.bool, d) for d in MEMORY_DTYPES - _BYTES),
                          *((d, dtypes.bool) for d in MEMORY_DTYPES - _BYTES)})

_INDEXED_OPS = frozenset({_ASSIGN, _STORE, _LOAD, _DEFINE_ACC})   # what _Vectorizer lists by kind

class _Refused(Exception):
  """An internal inconsistency: the kernel is left scalar rather than risk wrong code."""

def split_offset(index: UOp) -> tuple[UOp | None, int]:
  """`base + c` -> (base, c); a constant index -> (None, c); anything else -> (index, 0)."""
  if index.op is _CONST and isinstance(index.arg, int): return None, index.arg
  if index.op is Ops.ADD and len(index.src) == 2:
    for base, off in (index.src, index.src[::-1]):
      if off.op is _CONST and isinstance(off.arg, int): return base, off.arg
  return index, 0

MIN_TRANSPOSED_RUN = 8   # the shortest run of neighbouring addresses that reorders an accumulator tile's lanes

def _leading_run(keys: list[list[tuple]], j: int) -> int:
  """How many accumulators from the first read consecutive addresses through load j (keys: ("load", buffer, base,
  offset) or ("value", uop) per operand), with their other operands equal: the list's own first run along it."""
  run = 1
  while run < len(keys) and keys[run][j][:3] == keys[0][j][:3] and keys[run][j][3] == keys[0][j][3] + run and \
        keys[run][:j] + keys[run][j + 1:] == keys[0][:j] + keys[0][j + 1:]:
    run += 1
  return run

def _value_range(u: UOp) -> tuple[int, int]:
  """(min, max) of an integer uop: its constant, or what value ranges prove; (-1, -1) when unknown."""
  if u.op is _CONST: return (u.arg, u.arg) if isinstance(u.arg, int) else (-1, -1)
  try: return int(u.vmin), int(u.vmax)
  except Exception: return -1, -1

def _consecutive(indices: tuple[UOp, ...]) -> bool:
  """Whether the indices are `i, i+1, ..., i+n-1` for one base expression."""
  parts = [split_offset(i) for i in indices]
  return all(b is parts[0][0] and off == parts[0][1] + k for k, (b, off) in enumerate(parts))

def _vector_const(dtype: DType, lanes: tuple[UOp, ...]) -> UOp:
  # lanes repeat one constant node (a polynomial's coefficient in every lane): each distinct node truncated once
  values = {u: truncate(dtype, u.arg) for u in dict.fromkeys(lanes)}
  return UOp(_CONST, dtype.vec(len(lanes)), (), tuple(values[u] for u in lanes))

def _byte_products(u: UOp, out: list[tuple[UOp, UOp]]) -> bool:
  """Collect the (unsigned byte, signed byte) operand pairs of an int32 sum of products of widened bytes into `out`;
  False when `u` is not such a sum (a DP4A multiplies an unsigned byte by a signed one)."""
  if u.op is Ops.ADD and u.dtype is dtypes.int32: return _byte_products(u.src[0], out) and _byte_products(u.src[1], out)
  if u.op is not Ops.MUL or u.dtype is not dtypes.int32: return False
  a, b = u.src
  if a.op is not _CAST or b.op is not _CAST: return False
  pair = sorted((a.src[0], b.src[0]), key=lambda x: x.dtype is not dtypes.uint8)
  if pair[0].dtype is not dtypes.uint8 or pair[1].dtype is not dtypes.int8: return False
  out.append((pair[0], pair[1]))
  return True

def _address_key(u: UOp) -> int:
  """The constant offset of the first load found under `u` (following first sources), 0 where there is none."""
  while u.op is not _LOAD:
    if not u.src: return 0
    u = u.src[0]
  return split_offset(u.src[1])[1] if len(u.src) > 1 else 0

class _Vectorizer:
  """Bundles the lanes of one kernel and writes the vector uop list."""
  def __init__(self, uops: list[UOp], keep_scalar: frozenset[UOp], widths: tuple[int, ...] = VECTOR_WIDTHS,
               byte_dots: int = 0):
    self.uops, self.keep_scalar, self.widths, self.byte_dots = uops, keep_scalar, widths, byte_dots
    # built from reversed pairs so that a uop listed twice keeps its first position and block
    self.position: dict[UOp, int] = dict(zip(reversed(uops), range(len(uops) - 1, -1, -1)))
    # the innermost loop open where each uop sits (None: outside loops)
    self.block: dict[UOp, UOp | None] = dict(zip(reversed(uops), reversed(_blocks(uops))))
    self.assigns: dict[UOp, list[UOp]] = {}
    self.stores_at: dict[UOp, list[int]] = {}   # buffer -> positions of its stores
    self.loads_at: dict[UOp, list[int]] = {}
    self.stores: list[UOp] = []
    self.accumulators: list[UOp] = []
    for i, u in [(i, u) for i, u in enumerate(uops) if u.op in _INDEXED_OPS]:
      op = u.op
      if op is _ASSIGN: self.assigns.setdefault(u.src[0], []).append(u)
      elif op is _STORE:
        self.stores_at.setdefault(u.src[0], []).append(i)
        self.stores.append(u)
      elif op is _LOAD: self.loads_at.setdefault(u.src[0], []).append(i)
      elif op is _DEFINE_ACC: self.accumulators.append(u)
    self._readers: dict[UOp, list[UOp]] | None = None   # accumulator -> the uops reading it, made when first asked
    self._keys: dict[UOp, list[tuple]] = {}   # accumulator -> its update's operand keys (_operand_keys)
    self.memo: dict[tuple[UOp, ...], UOp] = {}
    self.constants: dict[tuple[UOp, ...], UOp] = {}
    self.lanes_of: dict[UOp, tuple[UOp, ...]] = {}   # a placed vector uop -> the scalar uops it replaces
    self.claimed: dict[UOp, tuple[UOp, int]] = {}    # a replaced scalar uop -> (its vector, its lane)
    self.journal: list[tuple] = []                   # what the seed being tried added, to undo on refusal
    self.built = self.real = 0                       # the tried seed's bundles built from scalars / vectorized

  # ---- bundles ----
  def _remember(self, lanes: tuple[UOp, ...], vector: UOp) -> UOp:
    self.memo[lanes] = vector
    self.journal.append(("memo", lanes))
    return vector

  def _claim(self, lanes: tuple[UOp, ...], vector: UOp) -> None:
    """`vector` replaces `lanes`; scalar code reads lane k through it, unless an earlier vector load holds it too."""
    self.lanes_of[vector] = lanes
    self.journal.append(("vector", vector))
    for k, u in enumerate(lanes): self.claimed.setdefault(u, (vector, k))
    # the work that got vectorized; a vector accumulator too (its update runs every iteration of its loop, where the
    # scalars built into its first value run once: a KBLOCK tile's accumulators start from two gathered loads)
    if vector.op not in (_STORE, _ASSIGN): self.real += 1

  def _build(self, lanes: tuple[UOp, ...]) -> UOp:
    """The vector of scalars that cannot be vectorized together."""
    if len(set(lanes)) > 1: self.built += 1
    return self._remember(lanes, UOp(_VECTORIZE, lanes[0].dtype.vec(len(lanes)), lanes))

  def bundle(self, lanes: tuple[UOp, ...]) -> UOp | None:
    """The vector uop for `lanes` (None when their dtype cannot be a vector lane)."""
    first = lanes[0]
    dtype, op = first.dtype, first.op
    if dtype not in LANE_DTYPES: return None
    for u in lanes:
      if u.dtype is not dtype: return None
    if (found := self.memo.get(lanes)) is not None: return found
    if op is _CONST and all(u.op is _CONST for u in lanes): return self._constant(lanes)
    # a lane repeated (a broadcast, for one) or already in another vector: built from the scalars, except loads: a
    # run of consecutive addresses that overlaps another (a sliding window's shifted rows) is one more vector load
    if len(set(lanes)) < len(lanes) or (op is not _LOAD and not self.claimed.keys().isdisjoint(lanes)):
      return self._build(lanes)
    same_arg = op is not _DEFINE_ACC   # accumulators differ by their ids
    arg, width, block = first.arg, len(first.src), self.block.get(first, -2)
    for u in lanes:
      if u.op is not op or (same_arg and u.arg != arg) or len(u.src) != width or self.block.get(u, -1) is not block:
        return self._build(lanes)
    if op is _LOAD: vector = self._load(lanes)
    elif op is _DEFINE_ACC: vector = self._accumulator(lanes)
    elif op is Ops.ADD and dtype is dtypes.int32 and self.byte_dots and (dot := self._byte_dot(lanes)) is not None:
      vector = dot
    elif op in GroupOp.ALU or op in (_CAST, _BITCAST): vector = self._alu(lanes)
    else: vector = None
    return vector if vector is not None else self._build(lanes)

  def _constant(self, lanes: tuple[UOp, ...]) -> UOp:
    """The vector constant of lanes that are all CONSTs (a pure value: kept across seeds)."""
    if (found := self.constants.get(lanes)) is None:
      found = self.constants[lanes] = _vector_const(lanes[0].dtype, lanes)
    return found

  def _operands(self, lanes: tuple[UOp, ...]) -> list[UOp] | None:
    """The bundles of the lanes' sources, position by position (None when one has no vector form)."""
    operands = []
    for column in zip(*[u.src for u in lanes]):
      operand = self.bundle(column)
      if operand is None: return None
      operands.append(operand)
    return operands

  def _alu(self, lanes: tuple[UOp, ...]) -> UOp | None:
    first = lanes[0]
    source = first.src[-1].dtype if first.op is Ops.WHERE else first.src[0].dtype
    if first.op is _CAST:
      if (source, first.dtype) not in VECTOR_CASTS: return None
    elif first.op is _BITCAST:
      if source not in MEMORY_DTYPES or first.dtype not in MEMORY_DTYPES: return None
    elif first.op not in VECTOR_ALU.get(source, ()): return None
    if first.op in (Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR):   # by one value only: exact and never traps
      divisor = first.src[1]
      if any(u.src[1] is not divisor for u in lanes): return None
      if first.op in (Ops.SHL, Ops.SHR):   # a constant or a value proven below the lane width (a nibble's shift)
        if not 0 <= _value_range(divisor)[0] <= _value_range(divisor)[1] < 8 * first.dtype.itemsize: return None
      elif divisor.op is not _CONST or divisor.arg in (0, -1): return None
    operands = self._operands(lanes)
    if operands is None: return None
    vector = UOp(first.op, first.dtype.vec(len(lanes)), tuple(operands), first.arg)
    self._claim(lanes, vector)
    return self._remember(lanes, vector)

  def _byte_dot(self, lanes: tuple[UOp, ...]) -> UOp | None:
    """int32 lanes that are each a sum of 4*m products of bytes widened to int32 (a quantized dot product's terms,
    in any order and tree shape) as one DP4A: lane l's products sorted by the address of their operands, product
    4c+k of every lane gives byte 4l+k of the c-th pair of byte vectors. Integer sums are exact in any order, so
    the lanes keep their bits. None (and nothing claimed) when the lanes are not of that form or the bytes do not
    vectorize (the generic ALU path then tries)."""
    terms = []
    for lane in lanes:
      found: list[tuple[UOp, UOp]] = []
      if not _byte_products(lane, found) or len(found) % 4 or (terms and len(found) != len(terms[0])): return None
      terms.append(sorted(found, key=lambda pair: (_address_key(pair[1]), _address_key(pair[0]))))
    if any(a.dtype is not terms[0][0][0].dtype or b.dtype is not terms[0][0][1].dtype for t in terms for a, b in t):
      return None
    # the largest unsigned byte: the target multiplies bytes up to self.byte_dots exactly (AVX2's pmaddubsw: 127)
    largest = max(_value_range(a)[1] if _value_range(a)[0] >= 0 else 255 for t in terms for a, _ in t)
    if largest > self.byte_dots: return None
    operands: list[UOp] = [self._constant(tuple(UOp.const(dtypes.int32, 0) for _ in lanes))]
    for chunk in range(0, len(terms[0]), 4):
      for side in (0, 1):
        group = tuple(t[chunk + k][side] for t in terms for k in range(4))
        # the same 4 bytes in every lane (a matrix's activations, against each lane's row of weights): a 4-byte
        # operand, broadcast to every lane (x86's vpdpbusd takes it from memory as one 32-bit broadcast)
        if len(lanes) > 1 and group == group[:4] * len(lanes): group = group[:4]
        vector = self.bundle(group)
        if vector is None or vector.op is _VECTORIZE: return None
        operands.append(vector)
    vector = UOp(Ops.DP4A, dtypes.int32.vec(len(lanes)), tuple(operands), largest < 128)
    self._claim(lanes, vector)
    return self._remember(lanes, vector)

  def _load(self, lanes: tuple[UOp, ...]) -> UOp | None:
    first = lanes[0]
    if first.dtype not in MEMORY_DTYPES or len(first.src) != 2: return None
    if any(u.src[0] is not first.src[0] for u in lanes) or not _consecutive(tuple(u.src[1] for u in lanes)): return None
    if not self._no_access_between(lanes, self.stores_at): return None   # a load never moves past a store
    vector = UOp(_LOAD, first.dtype.vec(len(lanes)), first.src[:2])
    self._claim(lanes, vector)
    return self._remember(lanes, vector)

  def _no_access_between(self, lanes: tuple[UOp, ...], accesses: dict[UOp, list[int]]) -> bool:
    """No access of `accesses` to the lanes' buffer lies between the first and the last lane (lanes excluded)."""
    spots = sorted(self.position[u] for u in lanes)
    inside = {self.position[u] for u in lanes}
    return not any(spots[0] < p < spots[-1] and p not in inside for p in accesses.get(lanes[0].src[0], ()))

  def readers(self, acc: UOp) -> list[UOp]:
    """The uops that read the accumulator `acc` (one entry per read)."""
    if self._readers is None:
      self._readers = {}
      accumulators = set(self.accumulators)
      for u in self.uops:
        if accumulators.isdisjoint(u.src): continue   # most uops read no accumulator: one C-level test
        for s in u.src:
          if s.op is _DEFINE_ACC: self._readers.setdefault(s, []).append(u)
    return self._readers.get(acc, [])

  def _accumulator(self, lanes: tuple[UOp, ...]) -> UOp | None:
    """A vector accumulator: its initial values, one vector update per iteration, lanes read after the updates."""
    if any(u in self.keep_scalar for u in lanes): return None
    assigns = tuple(self.assigns.get(u, [None])[0] for u in lanes)
    if any(len(self.assigns.get(u, ())) != 1 for u in lanes): return None
    if any(self.block[a] is not self.block[assigns[0]] for a in assigns): return None
    last_assign = max(self.position[a] for a in assigns)
    for acc, assign in zip(lanes, assigns):   # every other read of a lane comes after all the updates
      update = assign.src[1]
      for user in self.readers(acc):
        if user is not assign and user is not update and self.position[user] < last_assign: return None
      if self.position[update] > self.position[assign]: return None
    init = self.bundle(tuple(u.src[0] for u in lanes))
    if init is None: return None
    vector_acc = UOp(_DEFINE_ACC, lanes[0].dtype.vec(len(lanes)), (init,), lanes[0].arg)
    self._claim(lanes, vector_acc)
    self._remember(lanes, vector_acc)
    value = self.bundle(tuple(a.src[1] for a in assigns))
    if value is None: raise _Refused("an accumulator's updates have no vector form")
    vector_assign = UOp(_ASSIGN, vector_acc.dtype, (vector_acc, value))
    self._claim(assigns, vector_assign)
    return vector_acc

  # ---- seeds ----
  def try_seed(self, build) -> bool:
    """Run `build` (which bundles one seed); keep what it made only when more was vectorized than built."""
    self.journal, self.built, self.real = [], 0, 0
    ok = build() and self.real > self.built
    if not ok:
      for kind, item in reversed(self.journal):
        if kind == "memo": self.memo.pop(item, None)
        else:
          for u in self.lanes_of.pop(item):
            if self.claimed.get(u, (None,))[0] is item: del self.claimed[u]
    return ok

  def store_seed(self, stores: tuple[UOp, ...], disjoint: bool) -> bool:
    """Stores to consecutive addresses as one vector store. `disjoint`: every store to the buffer has its own
    address (one base, distinct offsets), so the stores may be reordered among themselves."""
    if not self._no_access_between(stores, self.loads_at): return False
    if not disjoint and not self._no_access_between(stores, self.stores_at): return False
    value = self.bundle(tuple(s.src[2] for s in stores))
    if value is None: return False
    vector = UOp(_STORE, dtypes.void, (stores[0].src[0], stores[0].src[1], value))
    self._claim(stores, vector)
    if self.built == 0: self.real += 1   # a vector made already (an accumulator tile's): one store for its lanes
    return True

  def seed_all(self) -> None:
    runs: dict[tuple, list[tuple[int, UOp]]] = {}
    for u in self.stores:
      if len(u.src) != 3 or u.src[2].dtype not in MEMORY_DTYPES: continue
      base, offset = split_offset(u.src[1])
      runs.setdefault((u.src[0], base, self.block[u], u.src[2].dtype), []).append((offset, u))
    runs_per_buffer: dict[UOp, int] = {}
    for buffer, *_ in runs: runs_per_buffer[buffer] = runs_per_buffer.get(buffer, 0) + 1
    def seed_stores() -> None:
      for (buffer, *_), run in runs.items():
        by_offset = dict(sorted(run, key=lambda x: x[0]))
        disjoint = len(by_offset) == len(run) and runs_per_buffer[buffer] == 1 and \
          len(run) == len(self.stores_at.get(buffer, ()))
        for lanes in _chunks(by_offset, self.widths):
          self.try_seed(lambda lanes=lanes: self.store_seed(lanes, disjoint))
    def accumulator_groups(transpose: bool) -> list[tuple[list[UOp], bool]]:
      groups: dict[tuple, list[UOp]] = {}
      for u in self.accumulators:
        if u in self.claimed or u in self.keep_scalar or len(self.assigns.get(u, ())) != 1: continue
        assign = self.assigns[u][0]
        groups.setdefault((self.block[u], self.block[assign], assign.src[1].op, u.dtype), []).append(u)
      return [self._in_address_order(accs, transpose) for accs in groups.values()]
    # an accumulator tile whose lanes read one operand's consecutive addresses along another axis than the list's
    # (a 1x1 conv's input gradient: 16 input channels of the weight, under 7 output columns): its vectors follow
    # that operand, bundled before the stores (which run once per tile, after the loop) would pick the output's axis
    ordered = accumulator_groups(True)
    transposed = any(moved for _, moved in ordered)
    if not transposed:
      seed_stores()
      ordered = accumulator_groups(False)
    for accs, _ in ordered:
      start = 0
      while start < len(accs):
        # the widest bundle that vectorizes from this lane (16 lanes of a tile whose runs are 8 long do not: its 8
        # do), else none: try from the next lane
        for width in (w for w in self.widths if start + w <= len(accs)):
          lanes = tuple(accs[start:start + width])
          if not any(u in self.claimed for u in lanes) and self.try_seed(lambda: self.bundle(lanes) in self.lanes_of):
            start += width
            break
        else: start += 1
    if transposed: seed_stores()

  def _operand_keys(self, acc: UOp) -> list[tuple]:
    """("load", buffer, base, offset) or ("value", uop) for each operand of accumulator `acc`'s update other than
    the accumulator itself; made once per accumulator (seed_all orders its groups twice)."""
    if (keys := self._keys.get(acc)) is None:
      keys = self._keys[acc] = [("load", s.src[0], *split_offset(s.src[1])) if s.op is _LOAD and len(s.src) == 2
                                else ("value", s) for s in self.assigns[acc][0].src[1].src if s.op is not _DEFINE_ACC]
    return keys

  def _in_address_order(self, accs: list[UOp], transpose: bool) -> tuple[list[UOp], bool]:
    """(accumulators ordered so that neighbours read neighbouring addresses, whether that moved them across the
    list's own runs). Where each update reads one load at its own offset from one buffer and base: sorted by that
    address (the simplifier may have put an integer sum's lanes out of order). Else, with `transpose`, for a tile's
    multiply-adds: grouped by their other operands, each group sorted by the address of the load whose groups are
    the longest consecutive runs, when those are at least MIN_TRANSPOSED_RUN long and longer than the list's own.
    Else as given. Any lane order gives the same bits: the code after the loop reads each accumulator's own lane."""
    keys = [self._operand_keys(acc) for acc in accs]
    if not keys or any(len(k) != len(keys[0]) for k in keys) or not keys[0]: return accs, False
    loads = [j for j in range(len(keys[0])) if all(k[j][0] == "load" and k[j][1:3] == keys[0][j][1:3] for k in keys)]
    if len(loads) == 1 and sum(kind == "load" for kind, *_ in keys[0]) == 1 and \
       len({k[loads[0]][3] for k in keys}) == len(keys):
      return [acc for _, acc in sorted(zip((k[loads[0]][3] for k in keys), accs), key=lambda pair: pair[0])], False
    if not transpose or len(keys[0]) < 2: return accs, False
    best, best_run = None, max(_leading_run(keys, j) for j in loads) if loads else 1
    for j in loads:
      groups: dict[tuple, list[int]] = {}
      for i, k in enumerate(keys): groups.setdefault(tuple(k[:j] + k[j + 1:]), []).append(i)
      runs = []
      for members in groups.values():
        members.sort(key=lambda i: keys[i][j][3])
        offsets = [keys[i][j][3] for i in members]
        runs.append(len(members) if offsets == list(range(offsets[0], offsets[0] + len(offsets))) else 1)
      if min(runs) >= MIN_TRANSPOSED_RUN and min(runs) > best_run:
        best, best_run = [accs[i] for members in groups.values() for i in members], min(runs)
    return (accs, False) if best is None else (best, True)

  # ---- writing ----
  def write(self) -> list[UOp]:
    """The output list: scalars in their places, each vector where its last lane was, lanes read through GEP."""
    place: dict[int, list[UOp]] = {}   # position -> the vectors whose last lane is there (overlapping loads: several)
    for vector, lanes in self.lanes_of.items():
      place.setdefault(max(map(self.position.__getitem__, lanes)), []).append(vector)
    out: list[UOp] = []
    emitted: set[UOp] = set()
    mapped: dict[UOp, UOp] = {}   # unclaimed scalar -> its uop in the output
    placed: dict[UOp, UOp] = {}   # vector -> its uop in the output (operands renamed)
    late: dict[UOp, tuple[UOp, UOp | None]] = {}   # claimed scalar recomputed as a scalar -> (uop, its loop)
    open_loops: list[UOp] = []
    claimed = self.claimed.keys()

    def add(u: UOp) -> UOp:
      if u.op in (_CONST, _GEP, _VECTORIZE) and u in emitted: return u   # pure and rendered inline
      out.append(u)
      emitted.add(u)
      return u

    def scalar(u: UOp) -> UOp:
      """`u`'s value as a scalar uop readable here."""
      if u not in self.claimed: return mapped.get(u, u)
      vector, lane = self.claimed[u]
      if vector in placed: return add(UOp(_GEP, u.dtype, (placed[vector],), lane))
      if u in late and (late[u][1] is None or late[u][1] in open_loops): return late[u][0]
      # the lane is read before its vector exists: compute it again as a scalar (pure values only)
      if u.op not in GroupOp.ALU and u.op not in (_CAST, _BITCAST, _LOAD):
        raise _Refused(f"{u.op.name} read before its vector")
      new = add(u.replace(src=tuple(scalar(s) for s in u.src)))
      late[u] = (new, open_loops[-1] if open_loops else None)
      return new

    def operand(v: UOp) -> UOp:
      if v.dtype.count == 1: return scalar(v)
      if v.op is _VECTORIZE: return add(v.replace(src=tuple(scalar(s) for s in v.src)))
      if v.op is _CONST: return add(v)
      if v not in placed: raise _Refused(f"vector {v.op.name} used before it is placed")
      return placed[v]

    for i, u in enumerate(self.uops):
      if u.op is _RANGE: open_loops.append(u)
      elif u.op is _ENDRANGE and open_loops: open_loops.pop()
      if u in self.claimed:
        for vector in place.get(i, ()):
          src = tuple(operand(s) for s in vector.src)
          placed[vector] = add(vector if src == vector.src else vector.replace(src=src))
        continue
      if not u.src: new = u
      else:
        # most uops read no lane of a vector: their sources are renamed without a call per source
        src = tuple(map(mapped.get, u.src, u.src)) if claimed.isdisjoint(u.src) else tuple(scalar(s) for s in u.src)
        new = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
      mapped[u] = new
      out.append(new)
      emitted.add(new)
    del add, scalar, operand   # `scalar` calls itself: a reference cycle holding the dicts above, broken here
    return without_dead_values(out)

_PURE = GroupOp.ALU | {_CAST, _BITCAST, _CONST, _GEP, _VECTORIZE, _LOAD}

def without_dead_values(uops: list[UOp]) -> list[UOp]:
  """`uops` without the pure values nothing reads any more (the lanes' scalar index math, mostly)."""
  used: set[UOp] = set()
  keep = [False] * len(uops)
  for i in range(len(uops) - 1, -1, -1):
    u = uops[i]
    if u.op not in _PURE or u in used:
      keep[i] = True
      used.update(u.src)
  return [u for u, k in zip(uops, keep) if k]

def _blocks(uops: list[UOp]) -> list[UOp | None]:
  """For each position of `uops`, the innermost loop open there (None: outside loops); a RANGE sits in the loop
  around it, and so does its ENDRANGE."""
  blocks: list[UOp | None] = []
  open_loops: list[UOp] = []
  current, start = None, 0
  for i in [i for i, u in enumerate(uops) if u.op is _RANGE or u.op is _ENDRANGE]:
    u = uops[i]
    if u.op is _RANGE:
      blocks += [current] * (i + 1 - start)
      open_loops.append(u)
      current, start = u, i + 1
    elif u.op is _ENDRANGE:
      blocks += [current] * (i - start)
      if open_loops: open_loops.pop()
      current, start = (open_loops[-1] if open_loops else None), i
  blocks += [current] * (len(uops) - start)
  return blocks

def _chunks(by_offset: dict[int, UOp], widths: tuple[int, ...] = VECTOR_WIDTHS) -> list[tuple[UOp, ...]]:
  """Runs of consecutive offsets cut into the widest vectors (of `widths`) that fit, in address order."""
  chunks: list[tuple[UOp, ...]] = []
  offsets = list(by_offset)
  start = 0
  while start < len(offsets):
    end = start
    while end + 1 < len(offsets) and offsets[end + 1] == offsets[end] + 1: end += 1
    i = start
    while i <= end:
      width = next((w for w in widths if i + w <= end + 1), 0)
      if width == 0: break
      chunks.append(tuple(by_offset[o] for o in offsets[i:i + width]))
      i += width
    start = end + 1
  return chunks

def vectorize(uops: list[UOp], keep_scalar: frozenset[UOp] = frozenset(), max_lanes: int = VECTOR_WIDTHS[0],
              byte_dots: int = 0) -> list[UOp]:
  """The linearized kernel `uops` (docs/ir.md, stage 4) with its isomorphic lanes as vector uops (see the module
  docstring), at most `max_lanes` lanes a vector (one register of the target: 16 float32 on AVX-512, 8 on AVX2; any
  width gives the same bits). Accumulators in `keep_scalar` stay scalar. With `byte_dots` (a renderer that renders
  DP4A: the largest unsigned byte its target multiplies exactly, CPUTarget.byte_dot_max), int32 lanes that each sum
  products of an unsigned byte (proven at most `byte_dots`) and a signed one, 4*m of them, become one DP4A. A kernel
  with nothing to vectorize comes back unchanged.

  >>> from kiln.dtype import dtypes
  >>> a, out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  >>> idx = [UOp.const(dtypes.int32, k) for k in range(4)]
  >>> loads = [UOp(Ops.LOAD, dtypes.float32, (a, i)) for i in idx]
  >>> stores = [UOp(Ops.STORE, dtypes.void, (out, i, x + 1.0)) for i, x in zip(idx, loads)]
  >>> body = [u for x, s in zip(loads, stores) for u in (x, s.src[2], s)]
  >>> uops = [out, a, *idx, UOp.const(dtypes.float32, 1.0)] + body
  >>> [(u.op.name, u.dtype.count) for u in vectorize(uops) if u.op in (Ops.LOAD, Ops.ADD, Ops.STORE)]
  [('LOAD', 4), ('ADD', 4), ('STORE', 1)]
  """
  vectorizer = _Vectorizer(uops, keep_scalar, tuple(w for w in VECTOR_WIDTHS if w <= max(max_lanes, VECTOR_WIDTHS[-1])),
                           byte_dots)
  try:
    vectorizer.seed_all()
    if not vectorizer.lanes_of: return uops
    return vectorizer.write()
  except _Refused: return uops
