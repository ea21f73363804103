"""Ops and UOp: the one immutable, hash-consed graph node used from Tensor ops down to kernel code."""
from __future__ import annotations
import enum, math, operator, struct, weakref, itertools
from typing import Any
from kiln.dtype import DType, dtypes, truncate
from kiln.helpers import prod

class Ops(enum.Enum):
  """Every operation a UOp can be: tensor-level ops, movement, ALU, and kernel-level loops, loads and stores."""
  # tensor level: data and identity
  SINK = enum.auto(); DEVICE = enum.auto(); BUFFER = enum.auto(); CONST = enum.auto(); IOTA = enum.auto()
  COPY = enum.auto(); CONTIGUOUS = enum.auto(); CONTIGUOUS_BACKWARD = enum.auto(); DETACH = enum.auto()
  ASSIGN = enum.auto(); REDUCE_AXIS = enum.auto(); BIND = enum.auto()
  # src[0]'s value, whose backward is a registered rule (arg[0] names it) giving the gradients of src[1:]
  CUSTOM_BACKWARD = enum.auto()
  # src[0]'s value as a tensor of its own (arg: a fresh id): what creation functions return, so two tensors made by
  # equal calls are two nodes for autograd, assign and the JIT; the scheduler sees through it
  UNIQUE = enum.auto()
  # one value over several devices (kiln/schedule/multi.py): src holds a graph per device, each a replica of the
  # whole value (arg None) or its slice along axis arg, in device order
  MULTI = enum.auto()
  # the part of a MULTI value on one device, laid out as arg = (index, device, axis, bounds): device `index`'s slice of
  # the value along `axis` with the [start, end) `bounds` of every device (axis None: its replica)
  MSELECT = enum.auto()
  # movement (never copy; lowered to index arithmetic)
  RESHAPE = enum.auto(); PERMUTE = enum.auto(); EXPAND = enum.auto(); PAD = enum.auto(); SHRINK = enum.auto(); FLIP = enum.auto()
  # type changes
  CAST = enum.auto(); BITCAST = enum.auto()
  # unary ALU
  EXP2 = enum.auto(); LOG2 = enum.auto(); SIN = enum.auto(); SQRT = enum.auto(); RECIP = enum.auto(); NEG = enum.auto()
  TRUNC = enum.auto()
  # binary ALU
  ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); FDIV = enum.auto(); IDIV = enum.auto(); MOD = enum.auto()
  MAX = enum.auto(); CMPLT = enum.auto(); CMPNE = enum.auto(); CMPEQ = enum.auto()
  AND = enum.auto(); OR = enum.auto(); XOR = enum.auto(); SHL = enum.auto(); SHR = enum.auto(); POW = enum.auto()
  # ternary ALU (MULACC: src[0]*src[1]+src[2] rounded once, a fused multiply-add; made only by the linearizer, for
  # float accumulations: kiln/codegen/linearizer.py fuse_multiply_accumulate)
  WHERE = enum.auto(); MULACC = enum.auto()
  # kernel level
  INDEX = enum.auto(); DEFINE_GLOBAL = enum.auto(); DEFINE_VAR = enum.auto(); RANGE = enum.auto(); ENDRANGE = enum.auto()
  LOAD = enum.auto(); STORE = enum.auto(); REDUCE = enum.auto(); DEFINE_ACC = enum.auto(); KERNEL = enum.auto()
  # vector code (kiln/codegen/vectorize.py): lanes gathered into a vector, one lane read out of a vector, and
  # DP4A(acc, a0, b0, a1, b1, ...): int32 lane l of acc plus, for each byte-vector pair, the dot product of bytes
  # 4l..4l+3 of a and b, each byte widened by its own signedness (x86 vpdpbusd, NVIDIA dp4a); arg: every unsigned
  # byte is below 128 (so x86's pmaddubsw, which saturates int16 pair sums, is exact too)
  VECTORIZE = enum.auto(); GEP = enum.auto(); DP4A = enum.auto()
  # a GPU thread's index along one launch dimension (kiln/codegen/gpudims.py): arg ("gidx0", n) is the block index,
  # ("lidx0", n) the thread's index in its block, each in [0, n)
  SPECIAL = enum.auto()
  # GPU block memory (kiln/codegen/gpudims.py): DEFINE_LOCAL is a block's shared array (arg ("temp0", size)), or with
  # arg (name, size, "device") an array in device memory that lives as long as the kernel's module; BARRIER
  # (sources: the stores it orders) waits for every thread of the block, and a LOAD whose third source is a BARRIER
  # reads after it
  DEFINE_LOCAL = enum.auto(); BARRIER = enum.auto()
  # ATOMIC(buf, index, value, gate, *after): where `gate` holds, a device-wide fence, then buf[index] op= value
  # atomically (arg: the op, Ops.ADD); its value is buf[index] from before (0 where the gate is false). `after` are
  # the stores it must follow
  ATOMIC = enum.auto()
  # SHUFFLE(x, *after), arg (k, W): a warp shuffle (kiln/codegen/gpudims.py's row and grid reductions). The block's
  # threads form warps of W consecutive `lidx0`; every thread of the block runs it at once (never under a gate), and
  # lane l of each warp gets the value x has in lane l ^ k of its warp (k a power of two below W, so that lane
  # exists); `after` are values it must come after (orders only). Any scalar dtype: the renderers move 32 bits or
  # fewer as one 32-bit shuffle, 64 bits as two (docs/ir.md)
  SHUFFLE = enum.auto()
  # WMMA(a, b, c), arg a TensorCore (kiln/runtime/gpu_target.py): one warp's matrix multiply-add D = A @ B + C on
  # tensor cores. Every lane of a warp runs it at once (never under a gate); lane l's a, b and c are vectors of the
  # elements of A, B and C its `a_layout[l]`, `b_layout[l]` and `c_layout[l]` name, and its value is lane l's
  # elements of D (a `dtype_out.vec(4)`), in `c_layout[l]`'s order
  WMMA = enum.auto()
  # LDMATRIX(buf, index, *after), arg (x, trans): a warp-collective load of x (1, 2 or 4) 8x8 matrices of 16-bit
  # elements from a shared array `buf` (a DEFINE_LOCAL of a 2-byte dtype), PTX `ldmatrix.sync.aligned.m8n8.x{x}
  # [.trans].shared.b16`. Every lane of a warp runs it at once (never under a gate); lane l names, by its element
  # `index`, the start of row l % 8 of matrix l // 8 (8 contiguous elements, 16-byte aligned; lanes 8x and up are
  # ignored). Its value is a `buf.dtype.vec(2*x)`: elements 2j and 2j+1 are lane l's two elements of matrix j, at
  # (row l // 4, columns 2*(l % 4) and 2*(l % 4)+1), or with `trans` at (rows 2*(l % 4) and 2*(l % 4)+1, column
  # l // 4). So an m16n8k16 A fragment (a row-major tile) is one x4 load, its rows r+8*(j%2) and columns 8*(j//2)..
  # for matrix j, and a B fragment one x2: non-trans from an n-major tile (B^T rows), `trans` from a k-major one
  # (B's own rows). `after` orders it (a BARRIER after the stores it reads, as a LOAD's third source)
  LDMATRIX = enum.auto()
  # CP_ASYNC(dst, dst_index, src, src_index, *gate), arg (nbytes, cache): an asynchronous copy of nbytes (4, 8 or 16)
  # from global buffer `src` at element `src_index` to shared array `dst` at element `dst_index` (both addresses
  # aligned to nbytes), PTX `cp.async.{cache}.shared.global` with cache "ca" or "cg" (16 bytes only). With a gate
  # (a bool), where it is false no byte is read and nbytes of zeros are written (the src-size operand 0: a guarded
  # edge; the source index should still be in bounds). Its copies land only once a CP_ASYNC_WAIT covers their group.
  # CP_ASYNC_COMMIT(*copies): closes the thread's group of copies issued since the last commit (its sources: those
  # copies, for the order). CP_ASYNC_WAIT(*commits), arg n: waits until at most n of the thread's committed groups
  # are pending, so every group before the last n has landed (sources: the commits it follows); other threads'
  # copies are visible only after a BARRIER whose sources include the wait
  CP_ASYNC = enum.auto(); CP_ASYNC_COMMIT = enum.auto(); CP_ASYNC_WAIT = enum.auto()
  # Hopper (sm_90a) building blocks (docs/ir.md stage 4, "Hopper"). Each takes a `gate` (a bool; a CONST True when
  # every thread runs it) after its operands, then `*after` (orders only). The warpgroup-collective ones (WGMMA*,
  # SETMAXNREG) need a gate that is the same in all 128 threads of each warpgroup (a warp-role test such as
  # `lidx0 < 128`): a warpgroup runs them all together or skips them.
  # WGMMA(a_smem, a_offset, b_smem, b_offset, acc, gate, *after), arg a WarpgroupMMA (kiln/runtime/gpu_target.py):
  # `wgmma.mma_async` D = A @ B^T + acc for the warpgroup, A (64 x k) and B (n x k) K-major tiles of shared arrays at
  # byte offsets a_offset and b_offset (the descriptors' start addresses; layouts and swizzles in the arg); acc and
  # the value are thread t's `c_layout[t]` elements of D (a float32.vec(n/2)); where the gate is false, acc.
  # WGMMA_FENCE(gate, *after): `wgmma.fence` (before the first WGMMA touching acc's registers or smem written by
  # this thread). WGMMA_COMMIT(gate, *after): closes the group of WGMMAs issued. WGMMA_WAIT(gate, *after), arg n:
  # waits until at most n groups are pending (D may be read and its smem overwritten only after the wait)
  WGMMA = enum.auto(); WGMMA_FENCE = enum.auto(); WGMMA_COMMIT = enum.auto(); WGMMA_WAIT = enum.auto()
  # MBARRIER_INIT(bars, index, gate, *after), arg the arrival count: `mbarrier.init` of barrier `index` of a
  # DEFINE_LOCAL of uint64 (then `fence.mbarrier_init`; a BARRIER must follow before other threads use it).
  # MBARRIER_ARRIVE(bars, index, gate, *after), arg tx bytes: `mbarrier.arrive` (0) or `mbarrier.arrive.expect_tx`
  # (tx > 0: the phase also waits for tx more bytes of transactions). A phase completes when its arrivals reach the
  # count and its transaction bytes reach zero. MBARRIER_WAIT(bars, index, parity, gate, *after): `mbarrier.
  # try_wait.parity` in a loop: returns once the phase of parity `parity` (an int, 0 or 1) has completed (a barrier
  # in phase p: waiting on parity p blocks until it completes, waiting on 1-p returns at once)
  MBARRIER_INIT = enum.auto(); MBARRIER_ARRIVE = enum.auto(); MBARRIER_WAIT = enum.auto()
  # DEFINE_TENSORMAP(buffer), arg (i, TensorMap): kernel parameter i of kind tensor map (a `const __grid_constant__
  # CUtensorMap`, after the buffers) describing DEFINE_GLOBAL `buffer` (the runtime encodes it from the buffer).
  # TMA_LOAD(dst, dst_offset, tensormap, bars, bar_index, row, col, gate, *after): `cp.async.bulk.tensor.2d.shared::
  # cluster.global.mbarrier::complete_tx::bytes` of the map's box at element (row, col) into shared array dst at
  # byte offset dst_offset (swizzled as the map says, zeros outside the matrix), completing box_bytes on barrier
  # bar_index of bars. FENCE_PROXY_ASYNC(*after): `fence.proxy.async.shared::cta` (this thread's ordinary shared
  # stores before, visible to later TMA/WGMMA reads). SETMAXNREG(gate, *after), arg (count, "inc"/"dec"):
  # `setmaxnreg.{inc|dec}.sync.aligned.u32 count` for the warpgroup (producer/consumer register split)
  DEFINE_TENSORMAP = enum.auto(); TMA_LOAD = enum.auto(); FENCE_PROXY_ASYNC = enum.auto(); SETMAXNREG = enum.auto()
  # (last, so that no other op's value moves: symbolic term order hashes op values)
  # one device's result of an all-reduce run as one collective over the devices (NCCL: kiln/runtime/nccl.py), arg
  # (op, i): src are the partials (materialized), rotated so that src[0] is this device's: the node of device i has
  # src = partials[i:] + partials[:i]. The nodes of one all-reduce are scheduled as one item with an output each
  ALLREDUCE = enum.auto()
  def __repr__(self) -> str: return f"Ops.{self.name}"
  # members are singletons: identity hashing in C instead of Enum's Python-level hash of the name (a hot path)
  __hash__ = object.__hash__

class GroupOp:
  """Named sets of Ops (Unary, Binary, ALU, Comparison, Movement, ...) for asking what kind of op a node is."""
  Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC})
  Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
                      Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.POW})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC})
  ALU = Unary | Binary | Ternary
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
  Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
  Elementwise = ALU | frozenset({Ops.CAST, Ops.BITCAST})
  Irreducible = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE})

# the ops of an int expression over Variables that can be a shape entry (printed as infix by repr)
_SIZE_EXPR_OPS = frozenset({Ops.BIND, Ops.DEFINE_VAR, Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX})

REDUCE_IDENTITY = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: -math.inf}

def identity_element(op: Ops, dtype: DType):
  """The starting value of a reduction with `op` over `dtype` (MAX starts at the smallest value)."""
  if op is Ops.MAX: return dtypes.min(dtype)
  return truncate(dtype, REDUCE_IDENTITY[op])

binds_made = 0   # how many times UOp.bind was called
# hash-consing: (op, dtype, src, arg key) -> a weak reference to the one node. A plain dict of weak references rather
# than a WeakValueDictionary: its get and set are Python-level calls, and codegen makes ~50k nodes a kernel graph
_uop_refs: dict[tuple, weakref.ref] = {}

class _NodeRef(weakref.ref):
  """A weak reference to a node that carries the node's key, for `_drop_node` (cheaper to make than a callback
  bound to the key)."""
  __slots__ = ("key",)

def _drop_node(ref: _NodeRef) -> None:
  """A node died: forget it, unless its key already names a newer node (one lookup of the key: hashing it again
  costs as much as the rest)."""
  found = _uop_refs.pop(ref.key, None)
  if found is not None and found is not ref: _uop_refs[ref.key] = found   # put back: the newer node's
_buffer_ids = itertools.count()
_unique_ids = itertools.count()

def _cache_key_arg(arg):
  # 0.0 == -0.0 and 1 == 1.0 == True in Python; constants of different bits must stay different nodes
  # (a NaN by its bits: hex() gives "nan" for either sign)
  if type(arg) is float: return (float, arg.hex() if arg == arg else struct.pack(">d", arg))
  if type(arg) is bool: return (bool, arg)
  return arg

class UOp:
  """An immutable graph node `(op, dtype, src, arg)`. Building an equal node returns the same object, so `is` is equality.

  >>> from kiln.uop.ops import UOp, Ops
  >>> from kiln.dtype import dtypes
  >>> UOp.const(dtypes.int32, 3) is UOp.const(dtypes.int32, 3)
  True
  """
  __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "_shape", "_minmax", "meta", "buffer", "forward", "_device", "origin",
               "_rewrites", "_order", "_canonical")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
    # (_cache_key_arg, inline: this runs for every node built)
    kind = type(arg)
    key = (op, dtype, src, (float, arg.hex() if arg == arg else struct.pack(">d", arg)) if kind is float else
           (bool, arg) if kind is bool else arg)
    try:
      ref = _uop_refs.get(key)
    except TypeError:
      raise TypeError(f"UOp arg must be hashable, got {arg!r} for {op}") from None
    if ref is not None and (cached := ref()) is not None: return cached
    self = object.__new__(cls)
    self.op, self.dtype, self.src, self.arg = op, dtype, src, arg
    self._shape = self._minmax = self.meta = self.buffer = self.forward = self._device = self.origin = None
    self._rewrites = None   # results of pure rewrites (kiln/uop/pattern.py): the node's own memory, gone with it
    # its sort key in canonical sums (kiln/uop/symbolic.py term_order_key), made when first asked, and True once it
    # is known to be a canonical sum there (its own rules leave it)
    self._order = self._canonical = None
    ref = _uop_refs[key] = _NodeRef(self, _drop_node)
    ref.key = key
    return self

  def __reduce__(self): return UOp, (self.op, self.dtype, self.src, self.arg)
  def replace(self, **kwargs) -> UOp:
    """A node like this one with some of op/dtype/src/arg changed."""
    return UOp(kwargs.get("op", self.op), kwargs.get("dtype", self.dtype), kwargs.get("src", self.src), kwargs.get("arg", self.arg))

  def __repr__(self) -> str:
    if self.op in _SIZE_EXPR_OPS and dtypes.is_int(self.dtype):   # a symbolic size: `(n+1)[n=3]`, readable in shapes
      nodes = self.toposort()
      if len(nodes) <= 20 and all(n.op in _SIZE_EXPR_OPS or n.op is Ops.CONST for n in nodes) and \
         any(n.op in (Ops.BIND, Ops.DEFINE_VAR) for n in nodes):
        bound = ", ".join(f"{n.src[0].arg[0]}={n.src[1].arg}" for n in nodes if n.op is Ops.BIND)
        return f"{render_expr(self)}[{bound}]" if bound else render_expr(self)
    return pretty_print(self)

  # ---------------- construction ----------------
  @staticmethod
  def const(dtype: DType, value, device: str | None = None) -> UOp:
    """A scalar constant (tensor-level when `device` is given)."""
    value = const_value(dtype, value)
    if device is None: return UOp(_CONST, dtype, (), value)   # (a kernel constant: the common case, ~8k a graph)
    return UOp(_CONST, dtype, (UOp(Ops.DEVICE, arg=device),), value)

  @staticmethod
  def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A fresh BUFFER node of `size` elements; every call gives a new identity."""
    return UOp(_BUFFER, dtype, (), (next(_buffer_ids), device, size))

  def unique(self) -> UOp:
    """This node's value as a node of its own identity (UNIQUE): never equal to any other node, however built."""
    return UOp(Ops.UNIQUE, self.dtype, (self,), next(_unique_ids))

  @staticmethod
  def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
    """A symbolic integer `name` known to lie in [min_val, max_val]."""
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_val, max_val))

  def alu(self, op: Ops, *src: UOp) -> UOp:
    """A node applying ALU `op` to this node and `src` (comparisons give bool; WHERE takes its values' dtype)."""
    out_dtype = dtypes.bool if op in _COMPARISONS else (src[-1].dtype if op is _WHERE else self.dtype)
    return UOp(op, out_dtype, (self,) + src)

  def const_like(self, value) -> UOp:
    """A device-less scalar constant `value` of this node's dtype."""
    return UOp.const(self.dtype, value)

  def _ufix(self, x) -> UOp: return x if isinstance(x, UOp) else self.const_like(x)
  def __add__(self, x) -> UOp: return self.alu(Ops.ADD, self._ufix(x))
  def __radd__(self, x) -> UOp: return self._ufix(x).alu(Ops.ADD, self)
  def __sub__(self, x) -> UOp: return self.alu(Ops.ADD, self._ufix(x) * -1) if dtypes.is_int(self.dtype) else self.alu(Ops.SUB, self._ufix(x))
  def __rsub__(self, x) -> UOp: return self._ufix(x) - self
  def __mul__(self, x) -> UOp: return self.alu(Ops.MUL, self._ufix(x))
  def __rmul__(self, x) -> UOp: return self._ufix(x).alu(Ops.MUL, self)
  def __truediv__(self, x) -> UOp: return self.alu(Ops.FDIV, self._ufix(x))
  def __floordiv__(self, x) -> UOp: return self.alu(Ops.IDIV, self._ufix(x))
  def __mod__(self, x) -> UOp: return self.alu(Ops.MOD, self._ufix(x))
  def __neg__(self) -> UOp: return self * -1 if dtypes.is_int(self.dtype) else self.alu(Ops.NEG)
  def __and__(self, x) -> UOp: return self.alu(Ops.AND, self._ufix(x))
  def __or__(self, x) -> UOp: return self.alu(Ops.OR, self._ufix(x))
  def lt(self, x) -> UOp:
    """self < x as a bool node (`x` may be a Python number)."""
    return self.alu(Ops.CMPLT, self._ufix(x))
  def ge(self, x) -> UOp:
    """self >= x as a bool node, built as not(self < x)."""
    return self.lt(x).logical_not()
  def ne(self, x) -> UOp:
    """self != x as a bool node (`x` may be a Python number)."""
    return self.alu(Ops.CMPNE, self._ufix(x))
  def eq(self, x) -> UOp:
    """self == x as a bool node (`x` may be a Python number)."""
    return self.alu(Ops.CMPEQ, self._ufix(x))
  def logical_not(self) -> UOp:
    """not self, for a bool node (built as self != True)."""
    return self.alu(Ops.CMPNE, UOp.const(dtypes.bool, True))
  def maximum(self, x) -> UOp:
    """max(self, x) elementwise (`x` may be a Python number)."""
    return self.alu(Ops.MAX, self._ufix(x))
  def where(self, a, b) -> UOp:
    """`a` where this bool node is true, else `b` (Python numbers become constants)."""
    a = a if isinstance(a, UOp) else (b.const_like(a) if isinstance(b, UOp) else UOp.const(dtypes.from_py(a), a))
    return self.alu(Ops.WHERE, a, a._ufix(b))
  def cast(self, dtype: DType) -> UOp:
    """This node converted to `dtype` (itself if it already has that dtype)."""
    return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))
  def bind(self, value: int) -> UOp:
    """Bind a Variable to a value: `Variable("n", 1, 10).bind(4)`."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"bind: only a Variable can be bound, not {self.op}")
    name, lo, hi = self.arg
    try: value = operator.index(value)   # ints only: a float size would be truncated silently
    except TypeError: raise TypeError(f"bind: {name} takes an int value, got {value!r}") from None
    if not lo <= value <= hi: raise ValueError(f"bind: {name}={value} is outside [{lo}, {hi}]")
    global binds_made
    binds_made += 1   # lets hot paths (TinyJit's guards) skip looking for bound Variables until one exists
    return UOp(Ops.BIND, self.dtype, (self, self.const_like(value)))
  def unbind(self) -> tuple[UOp, int]:
    """The Variable and the int value of a bound Variable (a BIND node)."""
    if self.op is not Ops.BIND: raise TypeError(f"unbind: {self.op} is not a bound Variable")
    return self.src[0], self.src[1].arg

  # ---------------- graph helpers ----------------
  def toposort(self) -> list[UOp]:
    """Every node this one depends on, sources before users (iterative: any depth)."""
    return toposort([self])

  def sparents(self) -> set[UOp]:
    """Every node this one depends on, itself included, as a set."""
    return set(self.toposort())

  @property
  def base(self) -> UOp:
    """This node with movement ops peeled off."""
    node = self
    while node.op in _MOVEMENT: node = node.src[0]
    return node

  @property
  def device(self) -> str | None:
    """The device a tensor-level node lives on (cached; found by walking to the node's first source)."""
    if self._device is not None: return self._device
    if self.op not in _DEVICE_OPS and self.src:   # a new node over a source that knows its device: one step
      if (found := (self.src[1] if self.op is _WHERE else self.src[0])._device) is not None:
        self._device = found
        return found
    path, node = [], self
    while True:
      if node._device is not None: found = node._device; break
      if node.op is Ops.BUFFER: found = node.arg[1]; break
      if node.op in (Ops.DEVICE, Ops.COPY): found = node.arg; break
      if node.op is Ops.MULTI: found = tuple(s.device for s in node.src); break
      if node.op is Ops.MSELECT: found = node.arg[1]; break
      if not node.src: found = None; break
      path.append(node)
      node = node.src[0] if node.op is not Ops.WHERE else node.src[1]
    if found is not None:
      for n in path: n._device = found
    return found

  @property
  def shape(self) -> tuple[int, ...] | None:
    """The shape of a tensor-level node (None for kernel-level nodes)."""
    if self._shape is None:
      for s in self.src:   # a loop, not all() over a generator: ~300 ns less for each node a graph builds
        if s._shape is None:   # sources first, iteratively: a deep graph must not hit Python's recursion limit
          for node in toposort([self], stop=lambda n: n._shape is not None):
            if node._shape is None: node._shape = (_compute_shape(node),)
          break
      else: self._shape = (_compute_shape(self),)
    return self._shape[0]

  @property
  def size(self) -> int:
    """The number of elements of a tensor-level node (0 for a kernel-level node)."""
    if self.shape is None: return 0
    size = prod(self.shape)
    return size if type(size) is int else _simplified_shape((size,))[0]

  @property
  def axis(self) -> int | None:
    """The sharded axis of a value over several devices (None: replicated, or on one device)."""
    from kiln.schedule.multi import layout_axis   # (the layout rules live with the multi-device lowering)
    return layout_axis(self)

  @property
  def is_realized(self) -> bool:
    """True for a BUFFER node whose device memory is allocated."""
    return self.op is Ops.BUFFER and self.buffer is not None and self.buffer.is_allocated()

  # ---------------- value ranges (for symbolic simplification) ----------------
  @property
  def vmin(self):
    """The smallest value this node can take, from value-range analysis (the dtype's minimum if unknown)."""
    known = self._minmax   # (known already for most nodes asked: no method call then)
    return (known if known is not None else self._min_max())[0]
  @property
  def vmax(self):
    """The largest value this node can take, from value-range analysis (the dtype's maximum if unknown)."""
    known = self._minmax
    return (known if known is not None else self._min_max())[1]
  def _min_max(self):
    if self._minmax is None:
      for s in self.src:   # (a loop, not all() over a generator: one or two sources)
        if s._minmax is None: break
      else:
        self._minmax = compute_min_max(self)
        return self._minmax
      if _range_is_dtypes(self): self._minmax = compute_min_max(self)
      else:   # sources first, iteratively: a deep graph must not hit Python's recursion limit
        for node in toposort([self], stop=lambda n: n._minmax is not None or _range_is_dtypes(n)):
          if node._minmax is None: node._minmax = compute_min_max(node)
    return self._minmax

  def simplify(self) -> UOp:
    """This node rewritten with the symbolic simplification rules until none applies."""
    from kiln.uop.symbolic import symbolic
    from kiln.uop.pattern import graph_rewrite
    return graph_rewrite(self, symbolic, name="simplify")

  def render(self) -> str:
    """A short infix string of an integer expression, e.g. '((ridx0*4)+ridx1)'."""
    return render_expr(self)

  # ---------------- tensor-level construction (shapes are checked by Tensor before these are called) ----------------
  def reshape(self, shape: tuple[int, ...]) -> UOp:
    """This node viewed with `shape` (itself if the shape is unchanged)."""
    return self if self.shape == tuple(shape) else UOp(_RESHAPE, self.dtype, (self,), tuple(shape))
  def expand(self, shape: tuple[int, ...]) -> UOp:
    """This node broadcast to `shape` (itself if the shape is unchanged)."""
    return self if self.shape == tuple(shape) else UOp(_EXPAND, self.dtype, (self,), tuple(shape))
  def permute(self, order: tuple[int, ...]) -> UOp:
    """This node with its axes reordered by `order` (itself for the identity order)."""
    return self if tuple(order) == tuple(range(len(order))) else UOp(Ops.PERMUTE, self.dtype, (self,), tuple(order))
  def pad(self, padding: tuple[tuple[int, int], ...]) -> UOp:
    """This node padded by `(before, after)` elements per axis (itself when all are zero)."""
    return self if all(b == 0 and a == 0 for b, a in padding) else UOp(Ops.PAD, self.dtype, (self,), tuple(padding))
  def shrink(self, bounds: tuple[tuple[int, int], ...]) -> UOp:
    """The `[start, end)` window of each axis of this node (itself when every window is whole)."""
    if all(b == 0 and e == s for (b, e), s in zip(bounds, self.shape)): return self
    return UOp(Ops.SHRINK, self.dtype, (self,), tuple(bounds))
  def flip(self, axes: tuple[int, ...]) -> UOp:
    """This node reversed along `axes` (size-1 axes are skipped; itself when none remain)."""
    axes = tuple(a for a in axes if isinstance(self.shape[a], UOp) or self.shape[a] > 1)
    return UOp(Ops.FLIP, self.dtype, (self,), axes) if axes else self
  def r(self, op: Ops, axes: tuple[int, ...]) -> UOp:
    """Reduce over `axes` with `op` (ADD, MUL or MAX); the reduced axes keep size 1."""
    axes = tuple(sorted(a for a in axes))
    return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes)) if axes else self
  def full_like(self, value) -> UOp:
    """A tensor-level constant with this node's shape, dtype and device."""
    c = UOp.const(self.dtype, value, self.device)
    return c.reshape((1,) * len(self.shape)).expand(self.shape)
  def copy_to(self, device: str) -> UOp:
    """This node copied to `device` (a COPY node)."""
    return UOp(Ops.COPY, self.dtype, (self,), device)


def Variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
  """A symbolic integer for sizes that change between calls. `Variable("start_pos", 0, 1024).bind(5)`."""
  return UOp.variable(name, min_val, max_val, dtype)

_INT_BOUNDS = {dt: (dtypes.min(dt), dtypes.max(dt)) for dt in dtypes.ints}

def const_value(dtype: DType, value):
  """A Python value converted to what `dtype` holds (bool/int/float), so equal constants share one node."""
  # the common case first: an int the dtype holds as it is (codegen makes thousands of index constants)
  if type(value) is int and (bounds := _INT_BOUNDS.get(dtype)) is not None and bounds[0] <= value <= bounds[1]:
    return value
  if type(value) is float and dtype in _FLOAT_DTYPES: return value   # (what float(value) gives: the same float)
  if isinstance(value, UOp): raise TypeError("const_value: expected a Python scalar, got a UOp")
  if dtype == dtypes.bool: return bool(value)
  if dtypes.is_int(dtype):
    if isinstance(value, float):
      if math.isnan(value) or math.isinf(value): return dtypes.min(dtype) if value < 0 else (dtypes.max(dtype) if value > 0 else 0)
      value = int(value)
    return truncate(dtype, int(value))
  return float(value)

def toposort(roots: list[UOp], stop=None, sources=None) -> list[UOp]:
  """All nodes reachable from `roots`, each after its sources (depth first, sources in order). `stop(u)` True leaves
  u's sources out; `sources(u)` replaces `u.src` as the edges to follow.

  The walk recurses, the cheapest traversal in Python (~40% less than an explicit stack: a kernel graph of 5k nodes
  is walked dozens of times in codegen); a graph deeper than the recursion limit is walked again with an explicit
  stack, which gives the same order."""
  if stop is None and sources is None:
    try: return _toposort_plain(roots)
    except RecursionError: pass
  else:
    try: return _toposort_recursive(roots, stop, sources)
    except RecursionError: pass
  return _toposort_iterative(roots, stop, sources)

def _toposort_plain(roots: list[UOp]) -> list[UOp]:
  """toposort without `stop` or `sources`, by recursion (RecursionError past the recursion limit)."""
  visited: set[UOp] = set()
  order: list[UOp] = []
  mark, emit = visited.add, order.append
  def visit(node: UOp) -> None:
    mark(node)
    for s in node.src:
      if s not in visited: visit(s)
    emit(node)
  try:
    for root in roots:
      if root not in visited: visit(root)
  finally: visit = None   # noqa: F841  (the closure refers to itself: a cycle that would keep the graph until GC)
  return order

def _toposort_recursive(roots: list[UOp], stop, sources) -> list[UOp]:
  """toposort by recursion (RecursionError past the recursion limit)."""
  visited: set[UOp] = set()
  order: list[UOp] = []
  mark, emit = visited.add, order.append
  def visit(node: UOp) -> None:
    mark(node)
    if stop is None or not stop(node):
      for s in (node.src if sources is None else sources(node)):
        if s not in visited: visit(s)
    emit(node)
  try:
    for root in roots:
      if root not in visited: visit(root)
  finally: visit = None   # noqa: F841  (as in _toposort_plain)
  return order

def _toposort_iterative(roots: list[UOp], stop=None, sources=None) -> list[UOp]:
  """toposort with an explicit stack: any depth."""
  visited: set[UOp] = set()
  order: list[UOp] = []
  stack: list[tuple[UOp, bool]] = [(r, False) for r in reversed(roots)]
  while stack:
    node, expanded = stack.pop()
    if expanded:
      order.append(node)
      continue
    if node in visited: continue
    visited.add(node)
    stack.append((node, True))
    if stop is not None and stop(node): continue
    for s in reversed(node.src if sources is None else sources(node)):
      if s not in visited: stack.append((s, False))
  return order

# ---------------- shapes ----------------

# every tensor-level node's shape comes through _compute_shape: its op tests bound once (`Ops.X` is a metaclass
# attribute lookup, ~130 ns under Python 3.11; an elementwise node's ~18 of them were ~10% of building a graph)
_SAME_SHAPE_OPS = GroupOp.Elementwise | {Ops.FLIP, Ops.COPY, Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH,
                                         Ops.ASSIGN, Ops.CUSTOM_BACKWARD, Ops.UNIQUE, Ops.ALLREDUCE}
_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.EXPAND})

def _compute_shape(u: UOp):
  op = u.op
  if op in _SAME_SHAPE_OPS:   # the most common case first (the op sets tested here are disjoint)
    for s in u.src:   # (a source's known shape read directly: the property is a Python call)
      if (shape := s._shape[0] if s._shape is not None else s.shape) is not None: return shape
    return None
  if op in _VIEW_OPS: return tuple(u.arg)
  if op is _BUFFER: return (u.arg[2],)
  if op is _CONST: return () if u.src else None
  if op is Ops.IOTA: return (u.arg,)
  if op is Ops.BIND: return ()
  if op is Ops.PERMUTE:
    shape = u.src[0].shape
    return tuple(shape[i] for i in u.arg)
  if op is Ops.PAD:
    out = tuple(s + b + a for s, (b, a) in zip(u.src[0].shape, u.arg))
    return out if all(type(s) is int for s in out) else _simplified_shape(out)
  if op is Ops.SHRINK:
    out = tuple(e - b for b, e in u.arg)
    return out if all(type(s) is int for s in out) else _simplified_shape(out)
  if op is Ops.REDUCE_AXIS:
    shape = u.src[0].shape
    return tuple(1 if i in u.arg[1] else s for i, s in enumerate(shape))
  if op is Ops.MULTI:   # the whole value: the shards' sizes along the sharded axis add up
    shape = u.src[0].shape
    if u.arg is None: return shape
    return shape[:u.arg] + (sum(s.shape[u.arg] for s in u.src),) + shape[u.arg + 1:]
  if op is Ops.MSELECT:
    index, _, axis, bounds = u.arg
    shape = u.src[0].shape
    return shape if axis is None else shape[:axis] + (bounds[index][1] - bounds[index][0],) + shape[axis + 1:]
  return None   # SINK, DEVICE, KERNEL and kernel-level nodes

def _simplified_shape(shape: tuple) -> tuple:
  """A shape with symbolic entries (expressions over bound Variables) in canonical form."""
  from kiln.uop.sint import ssimplify
  return tuple(ssimplify(s) for s in shape)

# ---------------- value ranges ----------------

def _safe_div(a, b):
  """C's truncating division, exact for big ints (a float quotient loses digits past 2**53)."""
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b > 0) else -q

# the Ops members the value-range code tests, bound once: under Python 3.11 each `Ops.X` read costs ~130 ns
# (EnumType's __getattr__ puts every attribute read on the class on a slow path), ~20x a global's; a range is
# computed for most int nodes codegen builds
_ADD, _SUB, _MUL, _NEG, _MAX, _IDIV, _MOD = Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.MAX, Ops.IDIV, Ops.MOD
_CMPLT, _CMPNE, _CMPEQ, _AND, _OR, _WHERE, _CAST = Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.WHERE, Ops.CAST
_CONST, _DEFINE_VAR, _BIND, _RANGE, _SPECIAL = Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.RANGE, Ops.SPECIAL
_BUFFER, _RESHAPE, _EXPAND, _MOVEMENT = Ops.BUFFER, Ops.RESHAPE, Ops.EXPAND, GroupOp.Movement
_DEVICE_OPS = frozenset({Ops.BUFFER, Ops.DEVICE, Ops.COPY, Ops.MULTI, Ops.MSELECT})   # ops that name a device themselves
_NO_RANGE_OPS = frozenset({Ops.CONST, Ops.BIND, Ops.RANGE})
_COMPARISONS, _ALU_OPS = GroupOp.Comparison, GroupOp.ALU
_FLOAT_DTYPES, _INT_DTYPES = frozenset(dtypes.floats), frozenset(dtypes.ints)   # (dtypes.is_float/is_int, inline)
_DTYPE_RANGES: dict[DType, tuple] = {}   # dtype -> (its smallest, its largest value): dtypes.min/max, made once

def _dtype_range(dt: DType) -> tuple:
  """(dtypes.min(dt), dtypes.max(dt)), or (-inf, inf) for void; remembered per dtype."""
  if (found := _DTYPE_RANGES.get(dt)) is None:
    found = _DTYPE_RANGES[dt] = (-math.inf, math.inf) if dt == dtypes.void else (dtypes.min(dt), dtypes.max(dt))
  return found

def _range_is_dtypes(u: UOp) -> bool:
  """Whether `compute_min_max(u)` needs no source's range: a float node other than a constant is its dtype's whole
  range (a comparison of floats asks for its operands' ranges, which then need not walk the float graph below)."""
  return u.op not in _NO_RANGE_OPS and u.dtype in _FLOAT_DTYPES

def compute_min_max(u: UOp) -> tuple:
  """The smallest and largest value an integer/bool node can take, from its sources' ranges."""
  dt = u.dtype
  lo_dt, hi_dt = _DTYPE_RANGES.get(dt) or _dtype_range(dt)
  op = u.op
  if op is _CONST: return (min(u.arg), max(u.arg)) if isinstance(u.arg, tuple) else (u.arg, u.arg)   # a vector's lanes
  if op is _DEFINE_VAR: return u.arg[1], u.arg[2]
  if op is _BIND: return u.src[0].vmin, u.src[0].vmax
  if op is _RANGE: return 0, max(0, u.src[0].vmax - 1)
  if op is _SPECIAL: return 0, max(0, u.arg[1] - 1)
  if op is _CAST and dt in _INT_DTYPES and (u.src[0].dtype in _INT_DTYPES or u.src[0].dtype == dtypes.bool):
    lo, hi = u.src[0].vmin, u.src[0].vmax
    if lo_dt <= lo and hi <= hi_dt: return lo, hi
    return lo_dt, hi_dt
  if op in _ALU_OPS and dt not in _FLOAT_DTYPES:
    s = u.src
    if op is _ADD: return _clamp(s[0].vmin + s[1].vmin, s[0].vmax + s[1].vmax, lo_dt, hi_dt)
    if op is _SUB: return _clamp(s[0].vmin - s[1].vmax, s[0].vmax - s[1].vmin, lo_dt, hi_dt)
    if op is _MUL:
      vals = [a * b for a in (s[0].vmin, s[0].vmax) for b in (s[1].vmin, s[1].vmax)]
      return _clamp(min(vals), max(vals), lo_dt, hi_dt)
    if op is _NEG: return _clamp(-s[0].vmax, -s[0].vmin, lo_dt, hi_dt)
    if op is _MAX: return max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax)
    # a divisor constant (a vector's only if its lanes agree)
    c = s[1].vmin if op in (_IDIV, _MOD) and s[1].op is _CONST and s[1].vmin == s[1].vmax else None
    if op is _IDIV and c is not None and c != 0:
      vals = [_safe_div(s[0].vmin, c), _safe_div(s[0].vmax, c)]
      return _clamp(min(vals), max(vals), lo_dt, hi_dt)   # INT_MIN // -1 wraps
    if op is _MOD and c is not None and c > 0:
      if s[0].vmin >= 0: return (s[0].vmin, s[0].vmax) if s[0].vmax < c else (0, c - 1)
      return -(c - 1) if s[0].vmin < 0 else 0, c - 1 if s[0].vmax > 0 else 0
    if op is _CMPLT:
      if s[0].vmax < s[1].vmin: return True, True
      if s[0].vmin >= s[1].vmax: return False, False
      return False, True
    if op is _CMPNE:
      if s[0].vmax < s[1].vmin or s[0].vmin > s[1].vmax: return True, True
      if s[0].vmin == s[0].vmax == s[1].vmin == s[1].vmax: return False, False
      return False, True
    if op is _CMPEQ:
      if s[0].vmax < s[1].vmin or s[0].vmin > s[1].vmax: return False, False
      if s[0].vmin == s[0].vmax == s[1].vmin == s[1].vmax: return True, True
      return False, True
    if op is _AND and dt == dtypes.bool: return s[0].vmin and s[1].vmin, s[0].vmax and s[1].vmax
    if op is _OR and dt == dtypes.bool: return s[0].vmin or s[1].vmin, s[0].vmax or s[1].vmax
    if op is _AND and s[0].vmin >= 0 and s[1].vmin >= 0: return 0, min(s[0].vmax, s[1].vmax)
    if op is _WHERE: return min(s[1].vmin, s[2].vmin), max(s[1].vmax, s[2].vmax)
  return lo_dt, hi_dt

def _clamp(lo, hi, lo_dt, hi_dt):
  if lo < lo_dt or hi > hi_dt: return lo_dt, hi_dt   # may overflow: no knowledge
  return lo, hi

# ---------------- printing ----------------

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.FDIV: "/"}

def render_expr(u: UOp) -> str:
  """Infix rendering of a small expression (iterative)."""
  out: dict[UOp, str] = {}
  for node in u.toposort():
    if node.op is Ops.CONST: out[node] = str(node.arg)
    elif node.op is Ops.DEFINE_VAR: out[node] = node.arg[0]
    elif node.op is Ops.BIND: out[node] = node.src[0].arg[0]
    elif node.op is Ops.RANGE: out[node] = f"ridx{node.arg}"
    elif node.op in _INFIX: out[node] = f"({out[node.src[0]]}{_INFIX[node.op]}{out[node.src[1]]})"
    elif node.op is Ops.MAX: out[node] = f"max({out[node.src[0]]}, {out[node.src[1]]})"
    elif node.op is Ops.WHERE: out[node] = f"({out[node.src[0]]}?{out[node.src[1]]}:{out[node.src[2]]})"
    elif node.op is Ops.NEG: out[node] = f"(-{out[node.src[0]]})"
    else: out[node] = f"{node.op.name}({', '.join(out[s] for s in node.src)})"
  return out[u]

def pretty_print(u: UOp, limit: int = 60) -> str:
  """A numbered listing of the graph under `u` (the last line is `u`)."""
  nodes = u.toposort()
  if len(nodes) > limit: return f"UOp({u.op}, {u.dtype}, arg={u.arg!r}, <{len(nodes)} nodes>)"
  names = {n: f"%{i}" for i, n in enumerate(nodes)}
  lines = [f"{names[n]} = {n.op.name} {n.dtype} ({', '.join(names[s] for s in n.src)}) arg={n.arg!r}" for n in nodes]
  return "\n".join(lines)
