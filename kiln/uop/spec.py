"""What a well-formed graph looks like after each stage; `SPEC=1` (on in tests) checks every graph as it is made."""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, GroupOp, toposort

class SpecError(RuntimeError):
  """A graph broke the rules of its stage: a bug in kiln, not in the user's code."""

def _fail(stage: str, node: UOp, why: str):
  raise SpecError(f"{stage} spec: {node.op.name} {node.dtype} arg={node.arg!r}: {why}")

def check_tensor_graph(roots: list[UOp]) -> None:
  """Tensor-level nodes: every node has a shape, ALU operands share it, movement args fit their source."""
  for node in toposort(roots):
    if node.op in (Ops.DEVICE, Ops.SINK): continue
    if node.op is Ops.CONST and not node.src: _fail("tensor", node, "constant without a device")
    if node.shape is None: _fail("tensor", node, "has no shape")
    if node.op in GroupOp.ALU:
      shapes = {s.shape for s in node.src}
      if len(shapes) != 1: _fail("tensor", node, f"operand shapes differ: {shapes}")
      operand_dtypes = {s.dtype for s in (node.src[1:] if node.op is Ops.WHERE else node.src)}
      if len(operand_dtypes) != 1 and node.op not in (Ops.SHL, Ops.SHR): _fail("tensor", node, f"operand dtypes differ: {operand_dtypes}")
      if node.op is Ops.WHERE and node.src[0].dtype != dtypes.bool: _fail("tensor", node, "condition is not bool")
    if node.op in (Ops.RESHAPE, Ops.EXPAND) and len(node.src) != 1: _fail("tensor", node, "needs one source")
    if node.op is Ops.RESHAPE:
      from kiln.uop.sint import sprod, sint_eq
      if not sint_eq(sprod(node.arg), sprod(node.src[0].shape)): _fail("tensor", node, f"size changes from {node.src[0].shape}")
    if node.op is Ops.EXPAND:
      if len(node.arg) != len(node.src[0].shape) or any(s != t and s != 1 for s, t in zip(node.src[0].shape, node.arg)):
        _fail("tensor", node, f"cannot expand {node.src[0].shape}")
    if node.op is Ops.PERMUTE and sorted(node.arg) != list(range(len(node.src[0].shape))): _fail("tensor", node, "bad order")
    if node.op is Ops.REDUCE_AXIS and node.arg[0] not in (Ops.ADD, Ops.MUL, Ops.MAX): _fail("tensor", node, "bad reduce op")

_BUFFERS = (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)   # what loads and stores address: device memory, a block's shared array
# the tensor-core building blocks (docs/ir.md stage 4): fragments are vectors, built by VECTORIZE, read by GEP
GPU_MATRIX_OPS = frozenset({Ops.WMMA, Ops.LDMATRIX, Ops.CP_ASYNC, Ops.CP_ASYNC_COMMIT, Ops.CP_ASYNC_WAIT,
                            Ops.VECTORIZE, Ops.GEP})
# the Hopper (sm_90a) building blocks (docs/ir.md stage 4, "Hopper"): warpgroup MMA, mbarriers, TMA
HOPPER_OPS = frozenset({Ops.WGMMA, Ops.WGMMA_FENCE, Ops.WGMMA_COMMIT, Ops.WGMMA_WAIT, Ops.MBARRIER_INIT,
                        Ops.MBARRIER_ARRIVE, Ops.MBARRIER_WAIT, Ops.DEFINE_TENSORMAP, Ops.TMA_LOAD,
                        Ops.FENCE_PROXY_ASYNC, Ops.SETMAXNREG})
LOWERED_OPS = GroupOp.ALU | {Ops.SINK, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.RANGE, Ops.LOAD, Ops.STORE,
                             Ops.REDUCE, Ops.CAST, Ops.BITCAST, Ops.SPECIAL,
                             Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.ATOMIC, Ops.SHUFFLE, *GPU_MATRIX_OPS, *HOPPER_OPS,
                             Ops.DEFINE_ACC, Ops.ASSIGN}   # carried accumulators (kiln/codegen/gpu_attention.py)

def check_lowered(sink: UOp) -> None:
  """Lowered kernels: no tensor-level op is left, loads and stores address buffers with integer indices,
  every REDUCE reduces over loop ranges (and a SHUFFLE sits in a GPU-shaped kernel: `_check_shuffles`), and a CPU
  kernel's thread axes (its SINK's ThreadAxes) name its loops: the split one an output range, the chunked one a
  reduced range."""
  from kiln.codegen.threads import ThreadAxes
  nodes = toposort([sink])
  if isinstance(sink.arg, ThreadAxes):
    reduced = {r.arg for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]}
    outputs = {u.arg for u in nodes if u.op is Ops.RANGE} - reduced
    if sink.arg.split is not None and sink.arg.split not in outputs:
      _fail("lowered", sink, f"thread axes split loop {sink.arg.split}, not an output range")
    if sink.arg.chunked is not None and sink.arg.chunked not in reduced:
      _fail("lowered", sink, f"thread axes chunk loop {sink.arg.chunked}, not a reduced range")
  for u in nodes:
    if u.op not in LOWERED_OPS: _fail("lowered", u, "tensor-level op left after lowering")
    if u.op is Ops.CONST and u.src: _fail("lowered", u, "constant still carries a device")
    if u.op in (Ops.LOAD, Ops.STORE):
      if u.src[0].op not in _BUFFERS: _fail("lowered", u, "not on a buffer")
      if not dtypes.is_int(u.src[1].dtype): _fail("lowered", u, f"index of dtype {u.src[1].dtype}")
      if u.op is Ops.LOAD and len(u.src) == 3 and u.src[2].dtype != dtypes.bool and u.src[2].op is not Ops.BARRIER:
        _fail("lowered", u, "gate is not bool")
    if u.op is Ops.REDUCE and any(r.op is not Ops.RANGE for r in u.src[1:]): _fail("lowered", u, "reduces over a non-range")
  _check_shuffles("lowered", nodes)
  _check_matrix_ops("lowered", nodes)
  _check_hopper_ops("lowered", nodes)

def _check_shuffles(stage: str, nodes: list[UOp]) -> None:
  """A SHUFFLE (docs/ir.md stage 4) needs a GPU-shaped kernel: one of scalar dtype (its value first among its
  sources, then any it must follow), its arg `(k, W)` a lane offset k
  that is a power of two below the warp size W, in a kernel whose `lidx0` block size is a multiple of W (full warps:
  every lane's partner exists)."""
  shuffles = [u for u in nodes if u.op is Ops.SHUFFLE]
  if not shuffles: return
  blocks = {u.arg[1] for u in nodes if u.op is Ops.SPECIAL and u.arg[0] == "lidx0"}
  for u in shuffles:
    if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and all(isinstance(a, int) for a in u.arg)):
      _fail(stage, u, "arg must be (lane offset, warp size)")
    k, warp = u.arg
    if warp < 1 or warp & (warp - 1) or k < 1 or k & (k - 1) or k >= warp:
      _fail(stage, u, f"lane offset {k} must be a power of two below the warp size {warp} (a power of two)")
    if not u.src or u.src[0].dtype != u.dtype: _fail(stage, u, "its first source (the value) must have its dtype")
    if u.dtype.count != 1 or u.dtype == dtypes.void: _fail(stage, u, "shuffles scalars only")
    if not blocks: _fail(stage, u, "outside a GPU kernel (no lidx0 thread index)")
    if any(size % warp for size in blocks): _fail(stage, u, f"block of {sorted(blocks)} threads is not whole warps of {warp}")

LINEAR_OPS = GroupOp.ALU | {Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.RANGE, Ops.ENDRANGE, Ops.LOAD, Ops.STORE,
                            Ops.DEFINE_ACC, Ops.ASSIGN, Ops.CAST, Ops.BITCAST, Ops.SPECIAL,
                            Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.ATOMIC, Ops.SHUFFLE, *GPU_MATRIX_OPS, *HOPPER_OPS}

def check_linear(uops: list[UOp]) -> None:
  """Linearized kernels: only stage-4 ops, each node after its sources, loops properly nested."""
  seen: set[UOp] = set()
  open_loops: list[UOp] = []
  for u in uops:
    if u.op not in LINEAR_OPS: _fail("linear", u, "op not allowed after linearizing")
    for s in u.src:
      if s not in seen: _fail("linear", u, f"source {s.op.name} comes later or not at all")
    if u.op is Ops.RANGE: open_loops.append(u)
    if u.op is Ops.ENDRANGE:
      if not open_loops or open_loops[-1] is not u.src[0]: _fail("linear", u, "closes a loop that is not the innermost")
      open_loops.pop()
    if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op not in _BUFFERS: _fail("linear", u, "not on a buffer")
    if u.op is Ops.ASSIGN and u.src[0].op is not Ops.DEFINE_ACC: _fail("linear", u, "assigns to a non-accumulator")
    if u.op in _WARP_OPS or u.op in _WARPGROUP_OPS:
      for loop in open_loops:
        if _thread_dependent(loop.src[0]): _fail("linear", u, "inside a loop whose trip count differs between threads")
    seen.add(u)
  if open_loops: _fail("linear", open_loops[-1], "loop never closed")
  _check_shuffles("linear", uops)
  _check_matrix_ops("linear", uops)
  _check_hopper_ops("linear", uops)

_WARP_OPS = (Ops.WMMA, Ops.LDMATRIX)   # warp-collective: every lane of a warp at once
_LDMATRIX_COUNTS = (1, 2, 4)

def _thread_dependent(u: UOp) -> bool:
  """Whether `u`'s value may differ between the threads of a block (it reads a `lidx` SPECIAL or memory)."""
  return any(n.op is Ops.LOAD or (n.op is Ops.SPECIAL and n.arg[0].startswith("lidx")) for n in u.toposort())

def _check_matrix_ops(stage: str, nodes: list[UOp]) -> None:
  """WMMA, LDMATRIX and CP_ASYNC* (docs/ir.md stage 4) need a GPU-shaped kernel whose `lidx0` blocks are whole
  warps of 32; a WMMA's operands have the dtypes its TensorCore names; an LDMATRIX reads a shared array of a 16-bit
  dtype, x 1, 2 or 4 matrices; a CP_ASYNC copies 4, 8 or 16 bytes ("cg" only 16) from a global buffer to a shared
  one. The warp-collective ones (WMMA, LDMATRIX) are never gated: kiln's values are computed unconditionally (gates
  apply to loads and stores only), so what remains is that every loop around one runs alike in every thread of
  the block (no trip count read from memory or from `lidx`: check_linear)."""
  ops = [u for u in nodes if u.op in (Ops.WMMA, Ops.LDMATRIX, Ops.CP_ASYNC, Ops.CP_ASYNC_COMMIT, Ops.CP_ASYNC_WAIT)]
  if not ops: return
  blocks = {u.arg[1] for u in nodes if u.op is Ops.SPECIAL and u.arg[0] == "lidx0"}
  for u in ops:
    if not blocks: _fail(stage, u, "outside a GPU kernel (no lidx0 thread index)")
    if u.op in _WARP_OPS and any(size % 32 for size in blocks):
      _fail(stage, u, f"block of {sorted(blocks)} threads is not whole warps of 32")
    if u.op is Ops.WMMA: _check_wmma(stage, u)
    elif u.op is Ops.LDMATRIX:
      if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[0] in _LDMATRIX_COUNTS and
              isinstance(u.arg[1], bool)):
        _fail(stage, u, "arg must be (matrices: 1, 2 or 4, trans: bool)")
      if len(u.src) < 2 or u.src[0].op is not Ops.DEFINE_LOCAL or len(u.src[0].arg) > 2:
        _fail(stage, u, "reads a block's shared array (DEFINE_LOCAL)")
      if u.src[0].dtype.itemsize != 2 or u.dtype != u.src[0].dtype.vec(2 * u.arg[0]):
        _fail(stage, u, f"must be a {u.src[0].dtype}.vec({2 * u.arg[0]}) of a 16-bit element dtype")
      if not dtypes.is_int(u.src[1].dtype): _fail(stage, u, f"index of dtype {u.src[1].dtype}")
    elif u.op is Ops.CP_ASYNC:
      if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[0] in (4, 8, 16) and u.arg[1] in ("ca", "cg")
              and (u.arg[1] == "ca" or u.arg[0] == 16)):
        _fail(stage, u, "arg must be (bytes: 4, 8 or 16, cache: 'ca', or 'cg' for 16 bytes)")
      if len(u.src) not in (4, 5) or u.src[0].op is not Ops.DEFINE_LOCAL or len(u.src[0].arg) > 2 or \
         u.src[2].op is not Ops.DEFINE_GLOBAL:
        _fail(stage, u, "copies a global buffer to a block's shared array: (dst, dst_index, src, src_index[, gate])")
      if u.src[0].dtype != u.src[2].dtype or u.arg[0] % u.src[0].dtype.itemsize:
        _fail(stage, u, f"{u.arg[0]} bytes of {u.src[2].dtype} into {u.src[0].dtype} (one dtype, whole elements)")
      if len(u.src) == 5 and u.src[4].dtype != dtypes.bool: _fail(stage, u, "gate is not bool")
    elif u.op is Ops.CP_ASYNC_WAIT and not (isinstance(u.arg, int) and 0 <= u.arg <= 7):
      _fail(stage, u, "arg must be the groups left pending, 0..7")

def _check_wmma(stage: str, u: UOp) -> None:
  tc = u.arg
  if not all(hasattr(tc, name) for name in ("dims", "dtype_in", "dtype_out", "a_layout", "b_layout", "c_layout")):
    _fail(stage, u, "arg must be a TensorCore (kiln/runtime/gpu_target.py)")
  want = (tc.dtype_in.vec(len(tc.a_layout[0])), tc.dtype_in.vec(len(tc.b_layout[0])),
          tc.dtype_out.vec(len(tc.c_layout[0])))
  if len(u.src) != 3 or tuple(s.dtype for s in u.src) != want:
    _fail(stage, u, f"operands must be (a, b, c) of {want}, got {tuple(s.dtype for s in u.src)}")
  if u.dtype != want[2]: _fail(stage, u, f"its dtype must be {want[2]}")

# ---------------- Hopper (sm_90a) ----------------

_WARPGROUP_OPS = (Ops.WGMMA, Ops.WGMMA_FENCE, Ops.WGMMA_COMMIT, Ops.WGMMA_WAIT, Ops.SETMAXNREG)
_GATE_AT = {Ops.WGMMA: 5, Ops.WGMMA_FENCE: 0, Ops.WGMMA_COMMIT: 0, Ops.WGMMA_WAIT: 0, Ops.MBARRIER_INIT: 2,
            Ops.MBARRIER_ARRIVE: 2, Ops.MBARRIER_WAIT: 3, Ops.TMA_LOAD: 7, Ops.SETMAXNREG: 0}

def _shared(u: UOp, at: int) -> bool:
  return len(u.src) > at and u.src[at].op is Ops.DEFINE_LOCAL and len(u.src[at].arg) <= 2

def _check_hopper_ops(stage: str, nodes: list[UOp]) -> None:
  """The Hopper ops (docs/ir.md stage 4, "Hopper") need a GPU-shaped kernel; the warpgroup-collective ones
  (WGMMA*, SETMAXNREG) one whose `lidx0` blocks are whole warpgroups of 128 threads. Each has its bool gate at its
  fixed place; mbarriers are shared arrays of uint64 (indices int); a WGMMA's operands are shared arrays of its
  input dtype at int byte offsets, its accumulator and value a float32.vec(n/2); a TMA_LOAD copies a
  DEFINE_TENSORMAP's box into a shared array of the map's dtype, completing on an mbarrier."""
  ops = [u for u in nodes if u.op in HOPPER_OPS]
  if not ops: return
  blocks = {u.arg[1] for u in nodes if u.op is Ops.SPECIAL and u.arg[0] == "lidx0"}
  for u in ops:
    if not blocks: _fail(stage, u, "outside a GPU kernel (no lidx0 thread index)")
    if u.op in _WARPGROUP_OPS and any(size % 128 for size in blocks):
      _fail(stage, u, f"block of {sorted(blocks)} threads is not whole warpgroups of 128")
    if u.op in _GATE_AT:
      at = _GATE_AT[u.op]
      if len(u.src) <= at or u.src[at].dtype != dtypes.bool: _fail(stage, u, f"source {at} (the gate) is not bool")
    if u.op in (Ops.MBARRIER_INIT, Ops.MBARRIER_ARRIVE, Ops.MBARRIER_WAIT):
      if not _shared(u, 0) or u.src[0].dtype != dtypes.uint64 or not dtypes.is_int(u.src[1].dtype):
        _fail(stage, u, "names barrier `index` (int) of a shared array of uint64")
      if u.op is Ops.MBARRIER_INIT and not (isinstance(u.arg, int) and 1 <= u.arg < (1 << 20)):
        _fail(stage, u, "arg must be the arrival count, 1..2^20-1")
      if u.op is Ops.MBARRIER_ARRIVE and not (isinstance(u.arg, int) and 0 <= u.arg < (1 << 20)):
        _fail(stage, u, "arg must be the expected transaction bytes, 0..2^20-1")
      if u.op is Ops.MBARRIER_WAIT and not dtypes.is_int(u.src[2].dtype): _fail(stage, u, "parity is not an int")
    elif u.op is Ops.WGMMA: _check_wgmma(stage, u)
    elif u.op is Ops.WGMMA_WAIT and not (isinstance(u.arg, int) and 0 <= u.arg <= 7):
      _fail(stage, u, "arg must be the groups left pending, 0..7")
    elif u.op is Ops.DEFINE_TENSORMAP:
      if len(u.src) != 1 or u.src[0].op is not Ops.DEFINE_GLOBAL or not (isinstance(u.arg, tuple) and len(u.arg) == 2):
        _fail(stage, u, "describes a DEFINE_GLOBAL: src (buffer,), arg (index, TensorMap)")
      tmap = u.arg[1]
      if tmap.dtype != u.src[0].dtype: _fail(stage, u, f"a map of {tmap.dtype} over a buffer of {u.src[0].dtype}")
      if tmap.swizzle not in (0, 32, 64, 128) or (tmap.swizzle and tmap.box[1] * tmap.dtype.itemsize != tmap.swizzle):
        _fail(stage, u, f"box rows of {tmap.box[1] * tmap.dtype.itemsize} bytes are not swizzle {tmap.swizzle}")
      if (tmap.box[1] * tmap.dtype.itemsize) % 16 or not (1 <= tmap.box[0] <= 256 and 1 <= tmap.box[1] <= 256):
        _fail(stage, u, f"box {tmap.box}: rows of a multiple of 16 bytes, at most 256 elements a side")
    elif u.op is Ops.TMA_LOAD:
      if not _shared(u, 0) or len(u.src) < 8 or u.src[2].op is not Ops.DEFINE_TENSORMAP or not _shared(u, 3) or \
         u.src[3].dtype != dtypes.uint64:
        _fail(stage, u, "(dst shared array, byte offset, DEFINE_TENSORMAP, mbarriers, index, row, col, gate)")
      if u.src[0].dtype != u.src[2].arg[1].dtype: _fail(stage, u, "dst's dtype is not the map's")
      if not all(dtypes.is_int(u.src[i].dtype) for i in (1, 4, 5, 6)): _fail(stage, u, "offsets and coordinates are ints")
    elif u.op is Ops.SETMAXNREG:
      if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[1] in ("inc", "dec") and isinstance(u.arg[0], int)
              and 24 <= u.arg[0] <= 256 and u.arg[0] % 8 == 0):
        _fail(stage, u, "arg must be (registers: 24..256, a multiple of 8, 'inc' or 'dec')")

def _check_wgmma(stage: str, u: UOp) -> None:
  wg = u.arg
  if not all(hasattr(wg, name) for name in ("n", "dtype_in", "a", "b", "c_layout")):
    _fail(stage, u, "arg must be a WarpgroupMMA (kiln/runtime/gpu_target.py)")
  if wg.n % 8 or not 8 <= wg.n <= 256: _fail(stage, u, f"n {wg.n} is not 8..256 in steps of 8")
  want = dtypes.float32.vec(wg.n // 2)
  if len(u.src) < 6 or not (_shared(u, 0) and _shared(u, 2)):
    _fail(stage, u, "sources are (a_smem, a_offset, b_smem, b_offset, acc, gate, *after)")
  if u.src[0].dtype != wg.dtype_in or u.src[2].dtype != wg.dtype_in:
    _fail(stage, u, f"operands are shared arrays of {wg.dtype_in}")
  if not (dtypes.is_int(u.src[1].dtype) and dtypes.is_int(u.src[3].dtype)): _fail(stage, u, "byte offsets are ints")
  if u.dtype != want or u.src[4].dtype != want: _fail(stage, u, f"accumulator and value must be {want}")
  for layout in (wg.a, wg.b):
    if layout.swizzle not in (0, 32, 64, 128): _fail(stage, u, f"swizzle {layout.swizzle} is not 0, 32, 64 or 128")
