"""PTXRenderer: a linearized kernel becomes one PTX module (`PTX=1`), which the CUDA driver compiles when it loads it.

It gets the uops the CUDA C renderer gets (kiln/renderer/cuda.py; the same target: output axes mapped to blocks and
threads by kiln/codegen/gpudims.py, kiln's software transcendental math) and writes, op for op, the instructions
NVRTC makes of the C renderer's semantics (kiln/renderer/cstyle.py), so both give the same bits:
- float add, mul, fma, div, rcp and sqrt carry `.rn`: correctly rounded, never contracted (MULACC is one `fma.rn`);
- float16 and bfloat16 live in f32 registers, every op's result rounded to the type by the C helpers' own
  instruction sequences (kiln_half_round_f/_d, kiln_f_to_bf16), stored and loaded as 16 bits; fp8e4m3 and fp8e5m2
  likewise as 8 bits, rounded by kiln_fp8_bits's integer steps from the value as a double (cstyle.py);
- integer IDIV/MOD truncate, a zero divisor gives 0 and `MIN // -1` wraps; types narrower than 32 bits live
  sign- or zero-extended in 32-bit registers and are truncated after each op, as C's promotions do;
- float -> integer casts go through a 32- or 64-bit conversion whose out-of-range and NaN result is INT_MIN of that
  width, then wrap to the type (cstyle.py `_c_float_to_int`); MAX gives NaN when its first operand is NaN, or when
  the second is and the first is not greater; `!=` on floats is unordered;
- bool values are predicates, stored as a byte.
POW on float32 (and 16-bit floats) is 2**(y*log2|x|) on the hardware's approximate lg2/ex2 with C99's special cases:
within a few ulp, not CUDA libdevice's bits. float32 MOD is exact (as fmodf is).
A warp SHUFFLE is `shfl.sync.bfly.b32` over the whole warp, one per 32 bits of the value.
The tensor-core ops (docs/ir.md stage 4): WMMA is one `mma.sync` whose A and B registers pack the fragment's elements
(`prmt.b32` of the loaded 16- or 8-bit patterns, or of the bits converted from the value; a tf32 element's own
bits), its C and D four f32 registers each; LDMATRIX one `ldmatrix` into b32 registers, CP_ASYNC one `cp.async`
(src-size 0 where its gate is false), CP_ASYNC_COMMIT/WAIT `cp.async.commit_group`/`cp.async.wait_group`.
A thread's wide global accesses (kiln/codegen/wide_memory.py: a vector LOAD and its GEPs, a STORE of a VECTORIZE)
are one `ld.global.v4.f32` / `st.global.v4.f32` (or .v2) where the kernel's test of the buffer's base pointer (once,
in the prologue) found it aligned to the access, else the lanes one by one under the opposite predicate.
Not rendered (NotImplementedError): other vector uops, float64 POW and MOD, and native EXP2/LOG2/SIN (software math
rewrites them first on this target).
"""
from __future__ import annotations
import struct
from kiln.dtype import DType, dtypes, truncate
from kiln.renderer import KernelWriter, kernel_function_name, kernel_signature
from kiln.renderer import cuda
from kiln.renderer.cuda import CUDARenderer, DEPENDENT_WAIT, dependent_launch, wide_accesses
from kiln.uop.ops import UOp, Ops, GroupOp
from kiln.uop.symbolic import is_multiple_of
from kiln.renderer.shared_memory import DYNAMIC_SHARED_NAME, shared_layout, swizzled_arrays

PTX_VERSION = "9.0"   # the PTX ISA of CUDA 13.0 (driver 580)

_NARROW = {dtypes.int8: ("s8", 8), dtypes.uint8: ("u8", 8), dtypes.int16: ("s16", 16), dtypes.uint16: ("u16", 16)}
_INTS_32 = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32)
_HALVES = (dtypes.float16, dtypes.bfloat16)
_FP8 = (dtypes.fp8e4m3, dtypes.fp8e5m2)
_IN_F32 = (*_HALVES, *_FP8)   # narrow floats: held and computed in f32 registers
# kiln_fp8_to_f's and kiln_fp8_bits's arguments per fp8 dtype (cstyle.py FP8_C_ARGS): mantissa bits, exponent of the
# smallest normal, whether it has inf; codes of the largest finite value, of NaN and of what inf becomes
_FP8_FORMAT = {dtypes.fp8e4m3: (3, -6, False, 0x7E, 0x7F, 0x7E), dtypes.fp8e5m2: (2, -14, True, 0x7B, 0x7E, 0x7C)}
# a register class per dtype: (prefix, declared type)
_REG_CLASS = {dtypes.bool: ("%p", ".pred"), dtypes.float32: ("%f", ".f32"), **{dt: ("%f", ".f32") for dt in _IN_F32},
              dtypes.float64: ("%fd", ".f64"), dtypes.int64: ("%rd", ".b64"),
              dtypes.uint64: ("%rd", ".b64"), **{dt: ("%r", ".b32") for dt in _INTS_32}}
# what a buffer element is loaded and stored as
_MEMORY_TYPES = {dtypes.bool: "u8", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16",
                 dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
                 dtypes.float16: "u16", dtypes.bfloat16: "u16", dtypes.float32: "f32", dtypes.float64: "f64",
                 **{dt: "u8" for dt in _FP8}}
_SPECIAL_REGISTERS = {"gidx": "%ctaid", "lidx": "%tid"}

def ptx_type(dtype: DType) -> str:
  """The instruction type suffix a value of `dtype` computes with (narrow ints and 16-bit floats in 32 bits)."""
  if dtype in (dtypes.float32, *_IN_F32): return "f32"
  if dtype == dtypes.float64: return "f64"
  if dtype in _INTS_32: return "u32" if dtypes.is_unsigned(dtype) else "s32"
  if dtype in (dtypes.int64, dtypes.uint64): return "u64" if dtype == dtypes.uint64 else "s64"
  if dtype == dtypes.bool: return "pred"
  raise NotImplementedError(f"PTXRenderer: no PTX for dtype {dtype}")

def _bits(dtype: DType) -> int: return 64 if dtype in (dtypes.int64, dtypes.uint64, dtypes.float64) else 32

def ptx_const(value, dtype: DType) -> str:
  """A PTX immediate for `value` rounded to `dtype`: `0f3F800000` for floats, decimal or hex for integers."""
  value = truncate(dtype, value)
  if dtype in (dtypes.float32, *_IN_F32): return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]
  if dtype == dtypes.float64: return "0d%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]
  if dtype == dtypes.bool: return "1" if value else "0"
  if dtypes.is_int(dtype):
    if _bits(dtype) == 64: return "0x%016X" % (value & (2 ** 64 - 1))
    return str(value) if -2 ** 31 <= value < 2 ** 31 else "0x%08X" % (value & 0xFFFFFFFF)
  raise NotImplementedError(f"PTXRenderer: no constant of dtype {dtype}")

class PTXRenderer(CUDARenderer):
  """Renders a linearized kernel as a PTX module: `.visible .entry name(.param .u64 data0, ..., .param .s32 var0)`,
  the CUDA C renderer's parameters in its order (kiln.renderer.kernel_signature)."""
  def render(self, name: str, uops: list[UOp], threads=None) -> str:
    """The PTX text of kernel `name` (`threads`, a CPU thread plan, is ignored)."""
    return _PTXKernelWriter(kernel_function_name(name), uops, self.arch).render()

class _PTXKernelWriter(KernelWriter):
  """Walks one uop list, giving each value a register and emitting instructions."""
  renderer_name = "PTXRenderer"
  expressions = GroupOp.ALU

  def __init__(self, name: str, uops: list[UOp], arch: str):
    super().__init__(name, uops)
    self.arch = arch
    self.names: dict[UOp, str] = {}
    self.counts: dict[str, int] = {}
    self.reg_types: dict[str, str] = {}
    self.module_arrays: list[str] = []
    self.shared_arrays: list[str] = []
    self.shared = shared_layout(uops)   # the block's shared arrays: static, or one dynamic array over 48 KiB
    self.declared_dynamic = False
    self.loops: list[tuple[UOp, str, str]] = []
    self.labels = 0
    self.block_threads = 1
    self.statements.update({
      Ops.RANGE: self._range, Ops.ENDRANGE: self._endrange, Ops.LOAD: self._load, Ops.STORE: self._store,
      Ops.DEFINE_ACC: self._define_acc, Ops.ASSIGN: self._assign, Ops.SPECIAL: self._special,
      Ops.DEFINE_LOCAL: self._define_local, Ops.BARRIER: self._barrier, Ops.ATOMIC: self._atomic,
      Ops.CAST: self._cast, Ops.BITCAST: self._bitcast, Ops.SHUFFLE: self._shuffle, Ops.GEP: self._lane,
      Ops.WMMA: self._wmma, Ops.LDMATRIX: self._ldmatrix, Ops.CP_ASYNC: self._cp_async,
      Ops.CP_ASYNC_COMMIT: self._cp_async_commit, Ops.CP_ASYNC_WAIT: self._cp_async_wait,
      **{op: self._nothing for op in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SINK, Ops.VECTORIZE)}})
    self.statements.update(_hopper_statements(self))
    self.tensormaps: list[UOp] = []   # DEFINE_TENSORMAP parameters (after the buffers, in arg order)
    self.skip: tuple[int, UOp, str] | None = None   # (line count, gate, label) of the last gated Hopper op's skip
    self.aligned: dict[tuple[UOp, int], str] = {}   # (buffer, bytes) of a wide access -> its aligned-base predicate
    self.lanes: dict[UOp, list[str]] = {}   # a wide load, a WMMA, a vector accumulator -> its lanes' registers
    self.raw_bits: dict[UOp, str] = {}   # a load of a 16- or 8-bit float -> the b32 register of its loaded bits
    self.packed: dict[UOp, list[str]] = {}   # an LDMATRIX -> its b32 registers (two 16-bit elements each)

  def fail(self, what: str) -> NotImplementedError:
    """The error for something PTX cannot render here, pointing at the CUDA C renderer."""
    return NotImplementedError(f"PTXRenderer: {what} (kernel {self.name}); use the CUDA C renderer (PTX=0), or see "
                               "docs/ir.md stage 4")

  # ---- registers and operands ----
  def reg(self, dtype: DType | str) -> str:
    """A fresh register for a value of `dtype` (or of a register class: 'pred', 'b16', 'b32', 'b64', 'f32', 'f64')."""
    prefix, decl = {"pred": ("%p", ".pred"), "b16": ("%h", ".b16"), "b32": ("%r", ".b32"), "b64": ("%rd", ".b64"),
                    "f32": ("%f", ".f32"), "f64": ("%fd", ".f64")}[dtype] if isinstance(dtype, str) \
      else self.reg_class(dtype)
    n = self.counts.get(prefix, 0)
    self.counts[prefix] = n + 1
    self.reg_types[prefix] = decl
    return f"{prefix}{n}"

  def reg_class(self, dtype: DType) -> tuple[str, str]:
    if dtype.count > 1: raise self.fail(f"vector dtype {dtype}")
    if dtype not in _REG_CLASS: raise self.fail(f"dtype {dtype} is not supported")
    return _REG_CLASS[dtype]

  def emit(self, line: str) -> None:
    """Add one instruction (a `// comment` after it stays after its semicolon)."""
    code, _, comment = line.partition("   // ")
    self.lines.append(f"  {code};" + (f"   // {comment}" if comment else ""))

  def operand(self, u: UOp) -> str:
    """An immediate for a non-bool CONST, else the register holding `u`."""
    if u.op is Ops.CONST and u.dtype != dtypes.bool:
      self.reg_class(u.dtype)
      return ptx_const(u.arg, u.dtype)
    return self.value(u)

  def value(self, u: UOp) -> str:
    """The register holding `u` at this point (constants are moved into a fresh one)."""
    if u.op is Ops.CONST:
      out = self.reg(u.dtype)
      if u.dtype == dtypes.bool: self.emit(f"setp.ne.u32 {out}, {1 if u.arg else 0}, 0")
      else: self.emit(f"mov.{self.mov_type(u.dtype)} {out}, {ptx_const(u.arg, u.dtype)}")
      return out
    if u not in self.names: raise ValueError(f"PTXRenderer: {u.op.name} is used before it is computed ({self.name})")
    return self.names[u]

  @staticmethod
  def mov_type(dtype: DType) -> str:
    return {".pred": "pred", ".f32": "f32", ".f64": "f64", ".b32": "b32", ".b64": "b64"}[_REG_CLASS[dtype][1]]

  def normalize(self, r: str, dtype: DType) -> str:
    """A 32-bit register truncated to narrow int `dtype` and sign- or zero-extended again (C's assignment)."""
    if dtype not in _NARROW: return r
    kind, width = _NARROW[dtype]
    out = self.reg("b32")
    if kind[0] == "s": self.emit(f"cvt.s32.{kind} {out}, {r}")
    else: self.emit(f"and.b32 {out}, {r}, {(1 << width) - 1}")
    return out

  # ---- statements ----
  def _nothing(self, u: UOp) -> None: pass

  def _special(self, u: UOp) -> None:
    kind, size = u.arg
    if kind.startswith("lidx"): self.block_threads *= size
    out = self.names[u] = self.reg(dtypes.int32)
    self.emit(f"mov.u32 {out}, {_SPECIAL_REGISTERS[kind[:4]]}.{'xyz'[int(kind[4:])]}   // {kind} < {size}")

  def _define_local(self, u: UOp) -> None:
    name, size = u.arg[0], u.arg[1]
    nbytes = size * u.dtype.itemsize
    if len(u.arg) > 2 and u.arg[2] == "device":   # zero when the module loads, kept between launches
      self.module_arrays.append(f".global .align 16 .b8 {name}[{nbytes}];")
    elif self.shared.dynamic:   # over 48 KiB: the array's offset in the launch's dynamic shared memory
      if not self.declared_dynamic:
        self.declared_dynamic = True
        align = 1024 if swizzled_arrays(self.uops) else 16
        self.module_arrays.append(f".extern .shared .align {align} .b8 {DYNAMIC_SHARED_NAME}[];   // "
                                  f"{self.shared.nbytes} bytes a launch")
      base = self.reg("b64")
      self.emit(f"mov.u64 {base}, {DYNAMIC_SHARED_NAME}")
      out = self.names[u] = self.reg("b64")
      self.emit(f"add.s64 {out}, {base}, {self.shared.offsets[u]}   // {name}")
      return
    # an operand of a TMA copy or a WGMMA: aligned to the 128-byte swizzle's repeat (its address bits are the swizzle)
    elif any((v.op is Ops.TMA_LOAD and v.src[0] is u) or (v.op is Ops.WGMMA and u in v.src[:3]) for v in self.uops):
      self.shared_arrays.append(f"  .shared .align 1024 .b8 {name}[{nbytes}];")
    else: self.shared_arrays.append(f"  .shared .align 16 .b8 {name}[{nbytes}];")
    out = self.names[u] = self.reg("b64")
    self.emit(f"mov.u64 {out}, {name}")

  def _space(self, buf: UOp) -> str:
    if buf.op is Ops.DEFINE_LOCAL: return "global" if len(buf.arg) > 2 else "shared"
    return "global"

  def address(self, buf: UOp, index: UOp) -> str:
    """`[reg]`: the address of element `index` of `buf`."""
    size = buf.dtype.itemsize
    base = self.value(buf)
    if index.op is Ops.CONST: return f"[{base}+{int(index.arg) * size}]"
    offset, out = self.reg("b64"), self.reg("b64")
    if _bits(index.dtype) == 64: self.emit(f"mul.lo.s64 {offset}, {self.value(index)}, {size}")
    else: self.emit(f"mul.wide.{ptx_type(index.dtype)} {offset}, {self.value(index)}, {size}")
    self.emit(f"add.s64 {out}, {base}, {offset}")
    return f"[{out}]"

  def _lane(self, u: UOp) -> None:
    vec = u.src[0]
    if vec in self.packed:   # an element of an LDMATRIX's registers: its 16 bits, then the value
      bits = self.reg("b32")
      self.emit(f"bfe.u32 {bits}, {self.packed[vec][u.arg // 2]}, {16 * (u.arg % 2)}, 16")
      scalar = vec.dtype.scalar
      if scalar == dtypes.float16: self.names[u] = self.half_to_f(bits)
      elif scalar == dtypes.bfloat16: self.names[u] = self.bf16_to_f(bits)
      elif scalar == dtypes.int16: self.names[u] = self.normalize(bits, scalar)
      else: self.names[u] = bits
      return
    if vec.op in (Ops.VECTORIZE, Ops.CONST): self.names[u] = self.vector_lanes(vec)[u.arg]
    elif vec not in self.lanes: raise self.fail(f"a GEP of {vec.op.name}")
    else: self.names[u] = self.lanes[vec][u.arg]

  # ---- tensor-core ops (docs/ir.md stage 4) ----
  def vector_lanes(self, u: UOp) -> list[str]:
    """The registers of a vector value's lanes (a VECTORIZE's sources, a vector constant moved into registers)."""
    if u.op is Ops.VECTORIZE: return [self.value(s) for s in u.src]
    if u.op is Ops.CONST:
      values = u.arg if isinstance(u.arg, tuple) else (u.arg,) * u.dtype.count
      return [self.value(UOp.const(u.dtype.scalar, x)) for x in values]
    if u not in self.lanes: raise self.fail(f"vector lanes of {u.op.name}")
    return self.lanes[u]

  def element_bits(self, x: UOp) -> str:
    """A b32 register holding a fragment element's bits in its low 8, 16 or 32 bits."""
    if x in self.raw_bits: return self.raw_bits[x]
    value = self.value(x)
    if x.dtype == dtypes.float16: return self.half_bits(value)
    if x.dtype == dtypes.bfloat16: return self.f_to_bf16(value)
    if x.dtype in _FP8: return self.fp8_bits(self.widen(value), x.dtype)
    if x.dtype == dtypes.float32:
      out = self.reg("b32")
      self.emit(f"mov.b32 {out}, {value}")
      return out
    raise self.fail(f"a WMMA fragment of {x.dtype}")

  def fragment_registers(self, u: UOp) -> list[str]:
    """A WMMA's A or B fragment as b32 registers, element 0 in the low bits (`prmt` packs 16- and 8-bit ones)."""
    if u in self.packed: return self.packed[u]
    if u.op is not Ops.VECTORIZE: raise self.fail(f"a WMMA fragment from {u.op.name}")
    bits = [self.element_bits(x) for x in u.src]
    per = 4 // u.dtype.scalar.itemsize
    regs = []
    for k in range(0, len(bits), per):
      group = bits[k:k + per]
      if per == 1: regs.append(group[0]); continue
      if per == 4:   # bytes 0,1 then 2,3, then the two halves
        low, high = self.reg("b32"), self.reg("b32")
        self.emit(f"prmt.b32 {low}, {group[0]}, {group[1]}, 0x0040")
        self.emit(f"prmt.b32 {high}, {group[2]}, {group[3]}, 0x0040")
        group = [low, high]
      out = self.reg("b32")
      self.emit(f"prmt.b32 {out}, {group[0]}, {group[1]}, 0x5410")
      regs.append(out)
    return regs

  def _wmma(self, u: UOp) -> None:
    tc = u.arg
    a, b = self.fragment_registers(u.src[0]), self.fragment_registers(u.src[1])
    c = self.vector_lanes(u.src[2])
    outs = self.lanes[u] = [self.reg(dtypes.float32) for _ in range(u.dtype.count)]
    groups = ", ".join("{" + ", ".join(regs) + "}" for regs in (outs, a, b, c))
    self.emit(f"{tc.instruction} {groups}")

  def _ldmatrix(self, u: UOp) -> None:
    buf, index = u.src[:2]
    matrices, trans = u.arg
    outs = self.packed[u] = [self.reg("b32") for _ in range(matrices)]
    self.emit(f"ldmatrix.sync.aligned.m8n8.x{matrices}{'.trans' if trans else ''}.shared.b16 {{{', '.join(outs)}}}, "
              f"{self.address(buf, index)}")

  def _cp_async(self, u: UOp) -> None:
    dst, dst_index, src, src_index = u.src[:4]
    nbytes, cache = u.arg
    size = ""
    if len(u.src) == 5:   # src-size 0 where the gate fails: nothing read, zeros written
      reg = self.reg("b32")
      self.emit(f"selp.u32 {reg}, {nbytes}, 0, {self.value(u.src[4])}")
      size = f", {reg}"
    self.emit(f"cp.async.{cache}.shared.global {self.address(dst, dst_index)}, {self.address(src, src_index)}, "
              f"{nbytes}{size}")

  def _cp_async_commit(self, u: UOp) -> None: self.emit("cp.async.commit_group")

  def _cp_async_wait(self, u: UOp) -> None:
    self.emit(f"cp.async.wait_group {u.arg}   // this thread's copies but the last {u.arg} groups have landed")

  def _wide_parts(self, buf: UOp, index: UOp) -> tuple[str, int]:
    """(address register, byte offset) of element `index` of global `buf`, so lane k is at `[reg+offset+k*size]`."""
    addr = self.address(buf, index)[1:-1]
    reg, _, offset = addr.partition("+")
    return reg, int(offset) if offset else 0

  def _alignment_guards(self, buf: UOp, nbytes: int, gate: UOp | None) -> tuple[str, str]:
    """The predicates of a wide access's vector form (the base aligned, and the gate) and of its lanes' form."""
    aligned = self.aligned[buf, nbytes]
    unaligned = self.reg("pred")
    self.emit(f"not.pred {unaligned}, {aligned}")
    if gate is None: return aligned, unaligned
    both, lanes = self.reg("pred"), self.reg("pred")
    self.emit(f"and.pred {both}, {aligned}, {self.value(gate)}")
    self.emit(f"and.pred {lanes}, {unaligned}, {self.value(gate)}")
    return both, lanes

  def _wide_load(self, u: UOp) -> None:
    """`ld.global.vN` where the buffer's base is aligned, else N scalar loads (kiln/codegen/wide_memory.py)."""
    buf, index = u.src[0], u.src[1]
    scalar, count = u.dtype.scalar, u.dtype.count
    if scalar not in _MEMORY_TYPES or scalar.itemsize != 4: raise self.fail(f"a wide load of {u.dtype}")
    reg, offset = self._wide_parts(buf, index)
    vector, lanes = self._alignment_guards(buf, u.dtype.itemsize, None)
    outs = self.lanes[u] = [self.reg(scalar) for _ in range(count)]
    mem = _MEMORY_TYPES[scalar]
    self.emit(f"@{vector} ld.global.v{count}.{mem} {{{', '.join(outs)}}}, [{reg}+{offset}]")
    for k, out in enumerate(outs): self.emit(f"@{lanes} ld.global.{mem} {out}, [{reg}+{offset + 4 * k}]")

  def _wide_store(self, u: UOp) -> None:
    """`st.global.vN` where the buffer's base is aligned, else N scalar stores (kiln/codegen/wide_memory.py)."""
    buf, index, value = u.src[:3]
    scalar, count = value.dtype.scalar, value.dtype.count
    if scalar not in _MEMORY_TYPES or scalar.itemsize != 4: raise self.fail(f"a wide store of {value.dtype}")
    data = [self.value(lane) for lane in value.src]
    reg, offset = self._wide_parts(buf, index)
    vector, lanes = self._alignment_guards(buf, value.dtype.itemsize, u.src[3] if len(u.src) == 4 else None)
    mem = _MEMORY_TYPES[scalar]
    self.emit(f"@{vector} st.global.v{count}.{mem} [{reg}+{offset}], {{{', '.join(data)}}}")
    for k, lane in enumerate(data): self.emit(f"@{lanes} st.global.{mem} [{reg}+{offset + 4 * k}], {lane}")

  def _load(self, u: UOp) -> None:
    if u.dtype.count > 1: return self._wide_load(u)
    if u in self.quads: return self._load_quad(self.quads[u])
    if u in self.quad_members: return   # read with its quad, earlier
    buf, index = u.src[0], u.src[1]
    gate = u.src[2] if len(u.src) == 3 and u.src[2].op is not Ops.BARRIER else None
    if u.dtype not in _MEMORY_TYPES: raise self.fail(f"a load of dtype {u.dtype}")
    space = self._space(buf) + (".cg" if buf.op is Ops.DEFINE_LOCAL and len(buf.arg) > 2 else "")
    addr, mem = self.address(buf, index), _MEMORY_TYPES[u.dtype]
    raw = self.reg("b32") if u.dtype in (*_IN_F32, dtypes.bool) else self.reg(u.dtype)
    if gate is not None:   # the gate's zero, then the read only where it holds
      if u.dtype in (*_IN_F32, dtypes.bool): self.emit(f"mov.b32 {raw}, 0")
      else: self.emit(f"mov.{self.mov_type(u.dtype)} {raw}, {ptx_const(0, u.dtype)}")
      self.emit(f"@{self.value(gate)} ld.{space}.{mem} {raw}, {addr}")
    else: self.emit(f"ld.{space}.{mem} {raw}, {addr}")
    if u.dtype in _IN_F32: self.raw_bits[u] = raw   # (a WMMA fragment packs these bits)
    if u.dtype == dtypes.bool:
      out = self.reg(dtypes.bool)
      self.emit(f"setp.ne.u32 {out}, {raw}, 0")
    elif u.dtype == dtypes.float16: out = self.half_to_f(raw)
    elif u.dtype == dtypes.bfloat16: out = self.bf16_to_f(raw)
    elif u.dtype in _FP8: out = self.fp8_to_f(raw, u.dtype)
    else: out = raw
    self.names[u] = out

  def _load_quad(self, quad: list[UOp]) -> None:
    """Four float32 loads of shared elements 4q..4q+3 (16-byte aligned) as one `ld.shared.v4.f32`."""
    index = quad[0].src[1]
    base, first = (index.src[0], index.src[1].arg) if index.op is Ops.ADD and index.src[1].op is Ops.CONST else \
      (index, 0)
    offset, addr = self.reg("b64"), self.reg("b64")
    self.emit(f"mul.wide.{ptx_type(base.dtype)} {offset}, {self.value(base)}, 4")
    self.emit(f"add.s64 {addr}, {self.value(quad[0].src[0])}, {offset}")
    outs = [self.reg(dtypes.float32) for _ in quad]
    self.emit(f"ld.shared.v4.f32 {{{', '.join(outs)}}}, [{addr}+{4 * first}]")
    for load, out in zip(quad, outs): self.names[load] = out

  def _store(self, u: UOp) -> None:
    buf, index, value = u.src[:3]
    if value.dtype.count > 1: return self._wide_store(u)
    if value.dtype not in _MEMORY_TYPES: raise self.fail(f"a store of dtype {value.dtype}")
    if value.dtype == dtypes.bool:
      data = self.reg("b32")
      self.emit(f"selp.u32 {data}, 1, 0, {self.value(value)}")
    elif value.dtype == dtypes.float16: data = self.half_bits(self.value(value))
    elif value.dtype == dtypes.bfloat16: data = self.f_to_bf16(self.value(value))
    elif value.dtype in _FP8: data = self.fp8_bits(self.widen(self.value(value)), value.dtype)
    else: data = self.operand(value)
    addr = self.address(buf, index)
    guard = f"@{self.value(u.src[3])} " if len(u.src) == 4 else ""
    self.emit(f"{guard}st.{self._space(buf)}.{_MEMORY_TYPES[value.dtype]} {addr}, {data}")

  def _range(self, u: UOp) -> None:
    counter = self.reg(u.dtype)
    top, end = f"$L{self.name}_{self.labels}_top", f"$L{self.name}_{self.labels}_end"
    self.labels += 1
    self.loops.append((u, top, end))
    t = ptx_type(u.dtype)
    self.emit(f"mov.{self.mov_type(u.dtype)} {counter}, 0")
    self.lines.append(f"{top}:")
    done = self.reg("pred")
    self.emit(f"setp.ge.{t} {done}, {counter}, {self.operand(u.src[0])}")
    self.emit(f"@{done} bra {end}")
    self.names[u] = counter

  def _endrange(self, u: UOp) -> None:
    if not self.loops or self.loops[-1][0] is not u.src[0]:
      raise ValueError(f"PTXRenderer: ENDRANGE without its open RANGE in kernel {self.name}")
    rng, top, end = self.loops.pop()
    counter = self.names[rng]
    self.emit(f"add.{ptx_type(rng.dtype)} {counter}, {counter}, 1")
    self.emit(f"bra {top}")
    self.lines.append(f"{end}:")

  def _define_acc(self, u: UOp) -> None:
    if u.dtype.count > 1:   # a WMMA's accumulator: a register a lane
      outs = self.lanes[u] = [self.reg(u.dtype.scalar) for _ in range(u.dtype.count)]
      for out, x in zip(outs, self.vector_lanes(u.src[0])): self.emit(f"mov.{self.mov_type(u.dtype.scalar)} {out}, {x}")
      return
    out = self.names[u] = self.reg(u.dtype)
    self.emit(f"mov.{self.mov_type(u.dtype)} {out}, {self.operand(u.src[0])}")

  def _assign(self, u: UOp) -> None:
    target, value = u.src
    if target.op is not Ops.DEFINE_ACC: raise ValueError(f"PTXRenderer: ASSIGN must target a DEFINE_ACC ({self.name})")
    if target.dtype.count > 1:
      for out, x in zip(self.lanes[target], self.vector_lanes(value)):
        if out != x: self.emit(f"mov.{self.mov_type(target.dtype.scalar)} {out}, {x}")
      self.lanes[u] = self.lanes[target]
      return
    self.emit(f"mov.{self.mov_type(target.dtype)} {self.names[target]}, {self.operand(value)}")
    self.names[u] = self.names[target]

  def _barrier(self, u: UOp) -> None:
    self.emit("bar.sync 0   // the block's shared stores above, before any thread reads them")

  def _shuffle(self, u: UOp) -> None:
    """A warp SHUFFLE (docs/ir.md stage 4) as `shfl.sync.bfly.b32` over the whole warp: a 32-bit register (f32,
    and the narrow floats and ints it holds) in one, a 64-bit one as its two halves, a predicate as 0 or 1."""
    k, warp = u.arg
    if warp != cuda.CUDA_WARP or u.dtype.count != 1:
      raise self.fail(f"SHUFFLE {u.arg} of {u.dtype}: warps have {cuda.CUDA_WARP} lanes and shuffles move scalars")
    x, kind = self.value(u.src[0]), self.reg_class(u.dtype)[1]
    out = self.names[u] = self.reg(u.dtype)
    def shuffle(dst: str, src: str) -> None:
      self.emit(f"shfl.sync.bfly.b32 {dst}, {src}, {k}, 0x1f, 0xffffffff   // from lane ^ {k} of the warp")
    if kind == ".pred":
      bits, moved = self.reg("b32"), self.reg("b32")
      self.emit(f"selp.b32 {bits}, 1, 0, {x}")
      shuffle(moved, bits)
      self.emit(f"setp.ne.b32 {out}, {moved}, 0")
    elif kind in (".f64", ".b64"):
      low, high, new_low, new_high = (self.reg("b32") for _ in range(4))
      self.emit(f"mov.b64 {{{low}, {high}}}, {x}")
      shuffle(new_low, low)
      shuffle(new_high, high)
      self.emit(f"mov.b64 {out}, {{{new_low}, {new_high}}}")
    else: shuffle(out, x)

  def _atomic(self, u: UOp) -> None:
    buf, index, value, gate = u.src[:4]
    if u.arg is not Ops.ADD or u.dtype not in (dtypes.uint32, dtypes.int32):
      raise self.fail(f"no ATOMIC {u.arg} on {u.dtype}")
    out = self.names[u] = self.reg(u.dtype)
    self.emit(f"mov.b32 {out}, 0")
    p = self.value(gate)
    self.emit(f"@{p} membar.gl   // this block's stores above are visible to every block first")
    self.emit(f"@{p} atom.{self._space(buf)}.add.{ptx_type(u.dtype)} {out}, {self.address(buf, index)}, "
              f"{self.operand(value)}")

  # ---- ALU ----
  def _value(self, u: UOp) -> None:
    if u.dtype.count > 1: raise self.fail(f"vector uop {u.op.name}")
    for s in u.src: self.reg_class(s.dtype)
    self.reg_class(u.dtype)
    operand = u.src[-1].dtype
    if operand == dtypes.bool or (u.dtype == dtypes.bool and u.op not in GroupOp.Comparison):
      self.names[u] = self.bool_alu(u)
      return
    if u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN) or (u.op is Ops.POW and u.dtype == dtypes.float64):
      raise self.fail(f"native {u.op.name} on {u.dtype} (software math rewrites EXP2/LOG2/SIN on this target)")
    if u.op in (Ops.AND, Ops.OR, Ops.XOR) and dtypes.is_float(operand):
      raise TypeError(f"PTXRenderer: {u.op.name} needs integer or bool operands, got {operand}")
    is_float = dtypes.is_float(operand)
    out = self.float_alu(u) if is_float else self.int_alu(u)
    if u.dtype in _IN_F32 and u.op not in (Ops.NEG, Ops.MAX, Ops.WHERE, Ops.TRUNC) and u.op in GroupOp.ALU:
      out = self.half_round_f(out) if u.dtype == dtypes.float16 else self.bf16_round(out) \
        if u.dtype == dtypes.bfloat16 else self.fp8_round(self.widen(out), u.dtype)
    self.names[u] = out

  def compare(self, u: UOp, is_float: bool) -> str:
    t = ptx_type(u.src[0].dtype)
    cmp = {Ops.CMPLT: "lt", Ops.CMPEQ: "eq", Ops.CMPNE: "neu" if is_float else "ne"}[u.op]
    out = self.reg(dtypes.bool)
    self.emit(f"setp.{cmp}.{t} {out}, {self.value(u.src[0])}, {self.operand(u.src[1])}")
    return out

  def float_alu(self, u: UOp) -> str:
    if u.op in GroupOp.Comparison: return self.compare(u, True)
    t, args = ptx_type(u.dtype), [self.operand(s) for s in u.src]
    if u.op is Ops.WHERE: args = [self.value(u.src[0]), *args[1:]]
    out = self.reg(u.dtype)
    simple = {Ops.ADD: "add.rn", Ops.SUB: "sub.rn", Ops.MUL: "mul.rn", Ops.FDIV: "div.rn", Ops.MULACC: "fma.rn",
              Ops.SQRT: "sqrt.rn", Ops.RECIP: "rcp.rn", Ops.NEG: "neg", Ops.TRUNC: "cvt.rzi"}
    if u.op in simple:
      kind = f"{simple[u.op]}.{t}" + (f".{t}" if u.op is Ops.TRUNC else "")
      first = self.value(u.src[0]) if u.op in (Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC) else args[0]
      self.emit(f"{kind} {out}, {', '.join([first, *args[1:]])}")
    elif u.op is Ops.MAX:   # a if (a != a || a > b) else b
      a, nan, greater = self.value(u.src[0]), self.reg("pred"), self.reg("pred")
      self.emit(f"setp.nan.{t} {nan}, {a}, {a}")
      self.emit(f"setp.gt.or.{t} {greater}, {a}, {args[1]}, {nan}")
      self.emit(f"selp.{t} {out}, {a}, {args[1]}, {greater}")
    elif u.op is Ops.WHERE: self.emit(f"selp.{t} {out}, {args[1]}, {args[2]}, {args[0]}")
    elif u.op is Ops.POW: return self.pow_f32(self.value(u.src[0]), self.value(u.src[1]))
    elif u.op is Ops.MOD and t == "f32": return self.fmod_f32(self.value(u.src[0]), self.value(u.src[1]))
    elif u.op is Ops.MOD: raise self.fail("float64 MOD (fmod)")
    else: raise self.fail(f"{u.op.name} on {u.dtype}")
    return out

  def pow_f32(self, x: str, y: str) -> str:
    """C's powf(x, y) as 2**(y * log2|x|) with the hardware's approximate lg2/ex2 (a few ulp times |y log2 x|, not
    CUDA's libdevice bits), the sign of an odd integer power and C99's special cases: y == 0 or x == 1 give 1, so
    does x == -1 with y infinite; a finite negative x to a finite non-integer power is NaN."""
    p = [self.reg("pred") for _ in range(9)]
    f = [self.reg("f32") for _ in range(6)]
    whole, odd_bits = self.reg("b32"), self.reg("b32")
    absx, log, product, power, truncated, absy = f
    is_int, small, odd, negative, finite_negative, not_int, one, unit, bad = p
    self.emit(f"abs.f32 {absx}, {x}")
    self.emit(f"lg2.approx.f32 {log}, {absx}")
    self.emit(f"mul.rn.f32 {product}, {y}, {log}")
    self.emit(f"ex2.approx.f32 {power}, {product}")
    self.emit(f"cvt.rzi.f32.f32 {truncated}, {y}")
    self.emit(f"setp.eq.f32 {is_int}, {truncated}, {y}")   # infinities count as (even) integers
    self.emit(f"abs.f32 {absy}, {y}")
    self.emit(f"setp.lt.f32 {small}, {absy}, 0f4B800000")   # 2**24 and above are even
    self.emit(f"cvt.rzi.s32.f32 {whole}, {truncated}")
    self.emit(f"and.b32 {odd_bits}, {whole}, 1")
    self.emit(f"setp.eq.and.u32 {odd}, {odd_bits}, 1, {small}")
    self.emit(f"and.pred {odd}, {odd}, {is_int}")
    self.emit(f"mov.b32 {whole}, {x}")
    self.emit(f"setp.lt.s32 {negative}, {whole}, 0")   # the sign bit: -0 too
    self.emit(f"and.pred {negative}, {negative}, {odd}")
    out = self.reg("f32")
    self.emit(f"neg.f32 {out}, {power}")
    self.emit(f"selp.f32 {out}, {out}, {power}, {negative}")
    self.emit(f"setp.lt.f32 {finite_negative}, {x}, 0f00000000")
    self.emit(f"setp.gt.and.f32 {finite_negative}, {x}, 0fFF800000, {finite_negative}")
    self.emit(f"not.pred {not_int}, {is_int}")
    self.emit(f"setp.leu.and.f32 {bad}, {absy}, 0f7F800000, {not_int}")   # finite (or NaN) non-integer y
    self.emit(f"and.pred {bad}, {bad}, {finite_negative}")
    self.emit(f"selp.f32 {out}, 0f7FFFFFFF, {out}, {bad}")
    self.emit(f"setp.eq.f32 {one}, {y}, 0f00000000")
    self.emit(f"setp.eq.or.f32 {one}, {x}, 0f3F800000, {one}")
    self.emit(f"setp.eq.f32 {unit}, {x}, 0fBF800000")
    self.emit(f"setp.eq.and.f32 {unit}, {absy}, 0f7F800000, {unit}")
    self.emit(f"or.pred {one}, {one}, {unit}")
    self.emit(f"selp.f32 {out}, 0f3F800000, {out}, {one}")
    return out

  def fmod_f32(self, x: str, y: str) -> str:
    """C's fmodf(x, y), exact: |x| reduced by |y| in double, 28 quotient bits a step (each step's product and
    difference are exact), the result with x's sign; NaN for an infinite x, a zero y or a NaN, x for an infinite y."""
    ax, ay, r, yy, q, diff = (self.reg("f64") for _ in range(6))
    bits, exponent, ybits, yexp, scale = (self.reg("b64") for _ in range(5))
    done, negative, nan, keep = (self.reg("pred") for _ in range(4))
    top, end = f"$L{self.name}_{self.labels}_fmod", f"$L{self.name}_{self.labels}_fmod_end"
    self.labels += 1
    self.emit(f"cvt.f64.f32 {ax}, {x}")
    self.emit(f"abs.f64 {ax}, {ax}")
    self.emit(f"cvt.f64.f32 {ay}, {y}")
    self.emit(f"abs.f64 {ay}, {ay}")
    self.emit(f"mov.b64 {ybits}, {ay}")
    self.emit(f"shr.u64 {yexp}, {ybits}, 52")
    self.emit(f"mov.f64 {r}, {ax}")
    self.emit(f"setp.eq.f64 {done}, {ay}, 0d7FF0000000000000")   # an infinite x or y: nothing to reduce
    self.emit(f"setp.eq.or.f64 {done}, {ax}, 0d7FF0000000000000, {done}")
    self.lines.append(f"{top}:")
    self.emit(f"setp.ltu.or.f64 {done}, {r}, {ay}, {done}")   # also stops on NaN
    self.emit(f"@{done} bra {end}")
    self.emit(f"mov.b64 {bits}, {r}")
    self.emit(f"shr.u64 {exponent}, {bits}, 52")
    self.emit(f"sub.s64 {exponent}, {exponent}, {yexp}")
    self.emit(f"sub.s64 {exponent}, {exponent}, 28")
    self.emit(f"max.s64 {exponent}, {exponent}, 0")
    self.emit(f"add.s64 {scale}, {exponent}, 1023")
    self.emit(f"shl.b64 {scale}, {scale}, 52")
    self.emit(f"mov.b64 {yy}, {scale}")
    self.emit(f"mul.rn.f64 {yy}, {yy}, {ay}")   # |y| * 2**k, exact
    self.emit(f"div.rn.f64 {q}, {r}, {yy}")
    self.emit(f"cvt.rzi.f64.f64 {q}, {q}")   # the quotient, or one more when the division rounded up to it
    self.emit(f"neg.f64 {q}, {q}")
    self.emit(f"fma.rn.f64 {diff}, {q}, {yy}, {r}")
    self.emit(f"setp.lt.f64 {negative}, {diff}, 0d0000000000000000")
    self.emit(f"add.rn.f64 {r}, {diff}, {yy}")
    self.emit(f"selp.f64 {r}, {r}, {diff}, {negative}")
    self.emit(f"bra {top}")
    self.lines.append(f"{end}:")
    single, sign, magnitude = self.reg("f32"), self.reg("b32"), self.reg("b32")
    self.emit(f"cvt.rn.f32.f64 {single}, {r}")   # exact: the remainder is a float
    self.emit(f"mov.b32 {magnitude}, {single}")
    self.emit(f"mov.b32 {sign}, {x}")
    self.emit(f"and.b32 {sign}, {sign}, 0x80000000")
    self.emit(f"or.b32 {magnitude}, {magnitude}, {sign}")
    out = self.reg("f32")
    self.emit(f"mov.b32 {out}, {magnitude}")
    self.emit(f"setp.eq.f64 {nan}, {ax}, 0d7FF0000000000000")
    self.emit(f"setp.eq.or.f64 {nan}, {ay}, 0d0000000000000000, {nan}")
    self.emit(f"setp.nan.or.f64 {nan}, {ax}, {ay}, {nan}")
    self.emit(f"selp.f32 {out}, 0f7FFFFFFF, {out}, {nan}")
    self.emit(f"setp.eq.f64 {keep}, {ay}, 0d7FF0000000000000")   # fmod(finite x, inf) is x
    self.emit(f"selp.f32 {out}, {x}, {out}, {keep}")
    return out

  def int_alu(self, u: UOp) -> str:
    if u.op in GroupOp.Comparison: return self.compare(u, False)
    t, dt = ptx_type(u.dtype), u.dtype
    b = "b64" if _bits(dt) == 64 else "b32"
    out = self.reg(dt)
    if u.op is Ops.WHERE:
      self.emit(f"selp.{t} {out}, {self.operand(u.src[1])}, {self.operand(u.src[2])}, {self.value(u.src[0])}")
      return out
    if u.op is Ops.NEG:
      self.emit(f"neg.s{_bits(dt)} {out}, {self.value(u.src[0])}")
      return self.normalize(out, dt)
    if u.op is Ops.TRUNC: return self.value(u.src[0])
    a = self.value(u.src[0])
    if u.op in (Ops.IDIV, Ops.MOD): return self.normalize(self.int_divide(u, a, out), dt)
    if u.op in (Ops.SHL, Ops.SHR):
      amount = self.operand(u.src[1])
      if _bits(u.src[1].dtype) == 64 and u.src[1].op is not Ops.CONST:
        amount, wide = self.reg("b32"), amount
        self.emit(f"cvt.u32.u64 {amount}, {wide}")
      op = f"shl.{b}" if u.op is Ops.SHL else f"shr.{t}"
      self.emit(f"{op} {out}, {a}, {amount}")
      return self.normalize(out, dt)
    ops = {Ops.ADD: f"add.{t}", Ops.SUB: f"sub.{t}", Ops.MUL: f"mul.lo.{t}", Ops.MAX: f"max.{t}",
           Ops.AND: f"and.{b}", Ops.OR: f"or.{b}", Ops.XOR: f"xor.{b}"}
    if u.op not in ops: raise self.fail(f"{u.op.name} on {dt}")
    self.emit(f"{ops[u.op]} {out}, {a}, {self.operand(u.src[1])}")
    return self.normalize(out, dt) if u.op in (Ops.ADD, Ops.SUB, Ops.MUL) else out

  def int_divide(self, u: UOp, a: str, out: str) -> str:
    """C's guarded IDIV/MOD: a zero divisor gives 0; `x / -1` is `-x` and `x % -1` is 0 (no trap)."""
    t, divisor = ptx_type(u.dtype), u.src[1]
    op = "div" if u.op is Ops.IDIV else "rem"
    if divisor.op is Ops.CONST and divisor.arg not in (0, -1):
      self.emit(f"{op}.{t} {out}, {a}, {ptx_const(divisor.arg, u.dtype)}")
      return out
    d = self.value(divisor)
    zero, minus_one, bad, safe = self.reg("pred"), self.reg("pred"), self.reg("pred"), self.reg(u.dtype)
    self.emit(f"setp.eq.{t} {zero}, {d}, 0")
    signed = not dtypes.is_unsigned(u.dtype)
    if signed:
      self.emit(f"setp.eq.{t} {minus_one}, {d}, -1")
      self.emit(f"or.pred {bad}, {zero}, {minus_one}")
    else: bad = zero
    self.emit(f"selp.{t} {safe}, 1, {d}, {bad}")
    quotient = self.reg(u.dtype)
    self.emit(f"{op}.{t} {quotient}, {a}, {safe}")
    if signed and op == "div":
      negated = self.reg(u.dtype)
      self.emit(f"neg.s{_bits(u.dtype)} {negated}, {a}")
      self.emit(f"selp.{t} {quotient}, {negated}, {quotient}, {minus_one}")
    elif signed: self.emit(f"selp.{t} {quotient}, 0, {quotient}, {minus_one}")
    self.emit(f"selp.{t} {out}, 0, {quotient}, {zero}")
    return out

  def bool_alu(self, u: UOp) -> str:
    """ALU ops on bools (predicates), as C computes them in int and converts back to _Bool."""
    out = self.reg(dtypes.bool)
    if u.op is Ops.WHERE:
      if u.dtype != dtypes.bool: raise self.fail(f"WHERE on {u.dtype}")
      c, a, b = (self.value(s) for s in u.src)
      when, otherwise = self.reg("pred"), self.reg("pred")
      self.emit(f"and.pred {when}, {c}, {a}")
      self.emit(f"not.pred {otherwise}, {c}")
      self.emit(f"and.pred {otherwise}, {otherwise}, {b}")
      self.emit(f"or.pred {out}, {when}, {otherwise}")
      return out
    args = [self.value(s) for s in u.src]
    if u.op is Ops.NEG or u.op is Ops.TRUNC:   # -b != 0 is b
      self.emit(f"mov.pred {out}, {args[0]}")
      return out
    if u.op is Ops.CMPLT:   # !a && b
      self.emit(f"not.pred {out}, {args[0]}")
      self.emit(f"and.pred {out}, {out}, {args[1]}")
      return out
    ops = {Ops.AND: "and", Ops.MUL: "and", Ops.OR: "or", Ops.ADD: "or", Ops.MAX: "or", Ops.XOR: "xor",
           Ops.CMPNE: "xor", Ops.SUB: "xor", Ops.CMPEQ: "xor"}
    if u.op not in ops: raise self.fail(f"{u.op.name} on bool")
    self.emit(f"{ops[u.op]}.pred {out}, {args[0]}, {args[1]}")
    if u.op is Ops.CMPEQ: self.emit(f"not.pred {out}, {out}")
    return out

  # ---- casts ----
  def _cast(self, u: UOp) -> None:
    src, dst = u.src[0].dtype, u.dtype
    self.reg_class(src), self.reg_class(dst)
    x = self.value(u.src[0])
    self.names[u] = self.convert(x, src, dst)

  def convert(self, x: str, src: DType, dst: DType) -> str:
    """Register `x` of dtype `src` converted to `dst` as cstyle.py `_c_cast` does."""
    if dst == dtypes.bool:
      out = self.reg(dtypes.bool)
      if src == dtypes.bool: self.emit(f"mov.pred {out}, {x}")
      else: self.emit(f"setp.{'neu' if dtypes.is_float(src) else 'ne'}.{ptx_type(src)} {out}, {x}, "
                      f"{ptx_const(0, src)}")
      return out
    if src == dtypes.bool:
      if dtypes.is_float(dst):
        one, zero = ptx_const(1, dst), ptx_const(0, dst)
        out = self.reg(dst)
        self.emit(f"selp.{ptx_type(dst)} {out}, {one}, {zero}, {x}")
        return out
      out = self.reg(dst)
      self.emit(f"selp.{ptx_type(dst)} {out}, 1, 0, {x}")
      return out
    if dtypes.is_int(dst) and dtypes.is_float(src): return self.float_to_int(x, src, dst)
    if dst in _FP8: return self.fp8_round(self.convert(x, src, dtypes.float64), dst)   # once, from the double
    if dst == dtypes.bfloat16:
      if src not in (dtypes.float32, dtypes.float16): x = self.convert(x, src, dtypes.float32)
      return self.bf16_round(x)
    if dst == dtypes.float16:
      if src in (dtypes.float32, dtypes.bfloat16): return self.half_round_f(x)
      return self.half_round_d(self.convert(x, src, dtypes.float64))
    if dtypes.is_float(dst):
      s = dtypes.float32 if src in _IN_F32 else src
      if s == dst: return x
      out = self.reg(dst)
      rounding = "" if dst == dtypes.float64 else ".rn"   # widening is exact; narrowing rounds to nearest even
      if dtypes.is_float(s): self.emit(f"cvt{rounding}.{ptx_type(dst)}.f{_bits(s)} {out}, {x}")
      else: self.emit(f"cvt.rn.{ptx_type(dst)}.{ptx_type(s)} {out}, {x}")
      return out
    # integer -> integer: widen by the source's signedness, narrow by truncation
    sb, db = _bits(src), _bits(dst)
    if sb == db:
      return self.normalize(x, dst)
    out = self.reg(dst)
    if db == 64: self.emit(f"cvt.{'u64.u32' if dtypes.is_unsigned(src) else 's64.s32'} {out}, {x}")
    else:
      self.emit(f"cvt.u32.u64 {out}, {x}")
      out = self.normalize(out, dst)
    return out

  def float_to_int(self, x: str, src: DType, dst: DType) -> str:
    """cstyle.py `_c_float_to_int`: a 32- or 64-bit truncating conversion, INT_MIN of that width out of range."""
    f = "f64" if src == dtypes.float64 else "f32"
    wide = 64 if _bits(dst) == 64 or dst == dtypes.uint32 else 32
    magnitude, in_range = self.reg(f), self.reg("pred")
    limit = ptx_const(2.0 ** (wide - 1), dtypes.float64 if f == "f64" else dtypes.float32)
    self.emit(f"abs.{f} {magnitude}, {x}")
    self.emit(f"setp.lt.{f} {in_range}, {magnitude}, {limit}")
    converted = self.reg("b64" if wide == 64 else "b32")
    self.emit(f"cvt.rzi.s{wide}.{f} {converted}, {x}")
    indefinite = "0x8000000000000000" if wide == 64 else "0x80000000"
    out = self.reg("b64" if wide == 64 else "b32")
    if dst == dtypes.uint64:
      unsigned, nonneg, below, ok = self.reg("b64"), self.reg("pred"), self.reg("pred"), self.reg("pred")
      self.emit(f"cvt.rzi.u64.{f} {unsigned}, {x}")
      self.emit(f"setp.ge.{f} {nonneg}, {x}, {ptx_const(0.0, src if f == 'f64' else dtypes.float32)}")
      self.emit(f"setp.lt.{f} {below}, {x}, {ptx_const(2.0 ** 64, src if f == 'f64' else dtypes.float32)}")
      self.emit(f"and.pred {ok}, {nonneg}, {below}")
      self.emit(f"selp.b64 {unsigned}, {unsigned}, {indefinite}, {ok}")
      self.emit(f"selp.b64 {out}, {converted}, {unsigned}, {in_range}")
      return out
    self.emit(f"selp.b{wide} {out}, {converted}, {indefinite}, {in_range}")
    if wide == _bits(dst) and dst not in _NARROW: return out
    if wide == 64:   # uint32: the low 32 bits
      low = self.reg("b32")
      self.emit(f"cvt.u32.u64 {low}, {out}")
      return low
    return self.normalize(out, dst)

  def _bitcast(self, u: UOp) -> None:
    src, dst = u.src[0].dtype, u.dtype
    if dtypes.bool in (src, dst) or src.itemsize != dst.itemsize:
      raise TypeError(f"PTXRenderer: cannot BITCAST {src} to {dst} (sizes must match and bool is not allowed)")
    self.reg_class(src), self.reg_class(dst)
    x = self.value(u.src[0])
    if src == dtypes.float16: bits = self.half_bits(x)
    elif src == dtypes.bfloat16: bits = self.f_to_bf16(x)
    elif src in _FP8: bits = self.fp8_bits(self.widen(x), src)
    elif dtypes.is_float(src):
      bits = self.reg("b64" if _bits(src) == 64 else "b32")
      self.emit(f"mov.b{_bits(src)} {bits}, {x}")
    elif src in _NARROW:   # the storage type's bits
      bits = self.reg("b32")
      self.emit(f"and.b32 {bits}, {x}, {(1 << _NARROW[src][1]) - 1}")
    else: bits = x
    if dst == dtypes.float16: out = self.half_to_f(bits)
    elif dst == dtypes.bfloat16: out = self.bf16_to_f(bits)
    elif dst in _FP8:
      byte = self.reg("b32")
      self.emit(f"and.b32 {byte}, {bits}, 255")
      out = self.fp8_to_f(byte, dst)
    elif dtypes.is_float(dst):
      out = self.reg(dst)
      self.emit(f"mov.b{_bits(dst)} {out}, {bits}")
    else: out = self.normalize(bits, dst)
    self.names[u] = out

  # ---- the 16-bit float helpers of cstyle.py, instruction for instruction ----
  def half_round_f(self, x: str) -> str:
    """kiln_half_round_f: float `x` rounded to float16 (nearest even) by an add and a subtract at its half ulp."""
    bits, magnitude, binade, scale, absolute, rounded, sign, out = (
      self.reg("b32"), self.reg("b32"), self.reg("b32"), self.reg("f32"), self.reg("f32"), self.reg("f32"),
      self.reg("b32"), self.reg("b32"))
    self.emit(f"mov.b32 {bits}, {x}")
    self.emit(f"and.b32 {magnitude}, {bits}, 0x7FFFFFFF")
    self.emit(f"and.b32 {binade}, {magnitude}, 0x7F800000")
    self.emit(f"max.u32 {binade}, {binade}, {113 << 23}")
    self.emit(f"min.u32 {binade}, {binade}, {142 << 23}")
    self.emit(f"add.u32 {binade}, {binade}, {13 << 23}")
    self.emit(f"mov.b32 {scale}, {binade}")
    self.emit(f"mov.b32 {absolute}, {magnitude}")
    self.emit(f"add.rn.f32 {rounded}, {absolute}, {scale}")
    self.emit(f"sub.rn.f32 {rounded}, {rounded}, {scale}")
    self.emit(f"mul.rn.f32 {rounded}, {rounded}, 0f77800000")
    self.emit(f"mul.rn.f32 {rounded}, {rounded}, 0f07800000")
    self.emit(f"mov.b32 {out}, {rounded}")
    self.emit(f"and.b32 {sign}, {bits}, 0x80000000")
    self.emit(f"or.b32 {out}, {out}, {sign}")
    result = self.reg("f32")
    self.emit(f"mov.b32 {result}, {out}")
    return result

  def half_round_d(self, x: str) -> str:
    """kiln_half_round_d: double `x` rounded once to float16, as a float."""
    bits, magnitude, binade, scale, absolute, rounded = (self.reg("b64"), self.reg("b64"), self.reg("b64"),
                                                         self.reg("f64"), self.reg("f64"), self.reg("f64"))
    single, out, high, result = self.reg("f32"), self.reg("b32"), self.reg("b64"), self.reg("f32")
    high32 = self.reg("b32")
    self.emit(f"mov.b64 {bits}, {x}")
    self.emit(f"and.b64 {magnitude}, {bits}, 0x7FFFFFFFFFFFFFFF")
    self.emit(f"and.b64 {binade}, {magnitude}, 0x7FF0000000000000")
    self.emit(f"max.u64 {binade}, {binade}, {1009 << 52}")
    self.emit(f"min.u64 {binade}, {binade}, {1038 << 52}")
    self.emit(f"add.u64 {binade}, {binade}, {42 << 52}")
    self.emit(f"mov.b64 {scale}, {binade}")
    self.emit(f"mov.b64 {absolute}, {magnitude}")
    self.emit(f"add.rn.f64 {rounded}, {absolute}, {scale}")
    self.emit(f"sub.rn.f64 {rounded}, {rounded}, {scale}")
    self.emit(f"cvt.rn.f32.f64 {single}, {rounded}")
    self.emit(f"mul.rn.f32 {single}, {single}, 0f77800000")
    self.emit(f"mul.rn.f32 {single}, {single}, 0f07800000")
    self.emit(f"mov.b32 {out}, {single}")
    self.emit(f"shr.u64 {high}, {bits}, 32")
    self.emit(f"cvt.u32.u64 {high32}, {high}")
    self.emit(f"and.b32 {high32}, {high32}, 0x80000000")
    self.emit(f"or.b32 {out}, {out}, {high32}")
    self.emit(f"mov.b32 {result}, {out}")
    return result

  def half_bits(self, x: str) -> str:
    """kiln_half_bits of a float16 value held in float `x`: its 16 bits (a NaN keeps its top payload bits)."""
    half, bits, wide, dbits, payload, sign, nan_bits, nan = (
      self.reg("b16"), self.reg("b32"), self.reg("f64"), self.reg("b64"), self.reg("b64"), self.reg("b64"),
      self.reg("b32"), self.reg("pred"))
    self.emit(f"cvt.rn.f16.f32 {half}, {x}")
    self.emit(f"cvt.u32.u16 {bits}, {half}")
    self.emit(f"cvt.f64.f32 {wide}, {x}")
    self.emit(f"mov.b64 {dbits}, {wide}")
    self.emit(f"shr.u64 {payload}, {dbits}, 42")
    self.emit(f"and.b64 {payload}, {payload}, 1023")
    self.emit(f"shr.u64 {sign}, {dbits}, 48")
    self.emit(f"and.b64 {sign}, {sign}, 32768")
    self.emit(f"or.b64 {payload}, {payload}, {sign}")
    self.emit(f"or.b64 {payload}, {payload}, 32256")
    self.emit(f"cvt.u32.u64 {nan_bits}, {payload}")
    self.emit(f"testp.notanumber.f32 {nan}, {x}")
    out = self.reg("b32")
    self.emit(f"selp.b32 {out}, {nan_bits}, {bits}, {nan}")
    return out

  def half_to_f(self, bits: str) -> str:
    """kiln_half_to_f: 16 bits (in a 32-bit register) to their float16 value as a float."""
    half, value, exponent, special, sign, mantissa, built, out = (
      self.reg("b16"), self.reg("f32"), self.reg("b32"), self.reg("pred"), self.reg("b32"), self.reg("b32"),
      self.reg("b32"), self.reg("f32"))
    self.emit(f"cvt.u16.u32 {half}, {bits}")
    self.emit(f"cvt.f32.f16 {value}, {half}")
    self.emit(f"and.b32 {exponent}, {bits}, 0x7C00")
    self.emit(f"setp.eq.u32 {special}, {exponent}, 0x7C00")   # inf and NaN: built from the bits
    self.emit(f"and.b32 {sign}, {bits}, 0x8000")
    self.emit(f"shl.b32 {sign}, {sign}, 16")
    self.emit(f"and.b32 {mantissa}, {bits}, 0x3FF")
    self.emit(f"shl.b32 {mantissa}, {mantissa}, 13")
    self.emit(f"or.b32 {built}, {sign}, {mantissa}")
    self.emit(f"or.b32 {built}, {built}, 0x7F800000")
    self.emit(f"mov.b32 {out}, {built}")
    self.emit(f"selp.f32 {out}, {out}, {value}, {special}")
    return out

  def bf16_to_f(self, bits: str) -> str:
    """kiln_bf16_to_f: 16 bits to their bfloat16 value as a float."""
    wide, out = self.reg("b32"), self.reg("f32")
    self.emit(f"shl.b32 {wide}, {bits}, 16")
    self.emit(f"mov.b32 {out}, {wide}")
    return out

  def f_to_bf16(self, x: str) -> str:
    """kiln_f_to_bf16: float `x` to bfloat16 bits, nearest even; a NaN stays a quiet NaN."""
    bits, magnitude, nan, odd = self.reg("b32"), self.reg("b32"), self.reg("pred"), self.reg("b32")
    rounded, quiet, out = self.reg("b32"), self.reg("b32"), self.reg("b32")
    self.emit(f"mov.b32 {bits}, {x}")
    self.emit(f"and.b32 {magnitude}, {bits}, 0x7FFFFFFF")
    self.emit(f"setp.gt.u32 {nan}, {magnitude}, 0x7F800000")
    self.emit(f"shr.u32 {odd}, {bits}, 16")
    self.emit(f"or.b32 {quiet}, {odd}, 64")
    self.emit(f"and.b32 {odd}, {odd}, 1")
    self.emit(f"add.u32 {rounded}, {bits}, 0x7FFF")
    self.emit(f"add.u32 {rounded}, {rounded}, {odd}")
    self.emit(f"shr.u32 {rounded}, {rounded}, 16")
    self.emit(f"selp.b32 {out}, {quiet}, {rounded}, {nan}")
    return out

  def bf16_round(self, x: str) -> str:
    """kiln_bf16_round: float `x` rounded to bfloat16."""
    return self.bf16_to_f(self.f_to_bf16(x))

  # ---- the fp8 helpers of cstyle.py (FP8_HELPERS), step for step ----
  def widen(self, x: str) -> str:
    """An f32 register's value as an f64 (exact)."""
    out = self.reg("f64")
    self.emit(f"cvt.f64.f32 {out}, {x}")
    return out

  def fp8_to_f(self, bits: str, dtype: DType) -> str:
    """kiln_fp8_to_f: an fp8 byte (in a 32-bit register) to its value as a float: significand times a power of two
    (exact), inf or NaN where the format has them, the sign put on by its bit (a NaN keeps it)."""
    man, min_exp, has_inf = _FP8_FORMAT[dtype][:3]
    magnitude, field, mantissa, significand, exponent = (self.reg("b32") for _ in range(5))
    normal, special = self.reg("pred"), self.reg("pred")
    scale, value = self.reg("f32"), self.reg("f32")
    self.emit(f"and.b32 {magnitude}, {bits}, 127")
    self.emit(f"shr.u32 {field}, {magnitude}, {man}")
    self.emit(f"and.b32 {mantissa}, {magnitude}, {(1 << man) - 1}")
    self.emit(f"setp.ne.u32 {normal}, {field}, 0")
    self.emit(f"or.b32 {significand}, {mantissa}, {1 << man}")
    self.emit(f"selp.b32 {significand}, {significand}, {mantissa}, {normal}")
    self.emit(f"max.u32 {exponent}, {field}, 1   // a subnormal scales as the smallest normal")
    self.emit(f"add.u32 {exponent}, {exponent}, {min_exp - 1 - man + 127}")
    self.emit(f"shl.b32 {exponent}, {exponent}, 23")
    self.emit(f"mov.b32 {scale}, {exponent}")
    self.emit(f"cvt.rn.f32.u32 {value}, {significand}")
    self.emit(f"mul.rn.f32 {value}, {value}, {scale}")
    if has_inf:
      infinite, special_value = self.reg("pred"), self.reg("f32")
      self.emit(f"setp.eq.u32 {special}, {field}, {0x7F >> man}")
      self.emit(f"setp.eq.u32 {infinite}, {mantissa}, 0")
      self.emit(f"selp.f32 {special_value}, 0f7F800000, 0f7FC00000, {infinite}")
      self.emit(f"selp.f32 {value}, {special_value}, {value}, {special}")
    else:
      self.emit(f"setp.eq.u32 {special}, {magnitude}, 127")
      self.emit(f"selp.f32 {value}, 0f7FC00000, {value}, {special}")
    signed, out, sign = self.reg("b32"), self.reg("f32"), self.reg("b32")
    self.emit(f"mov.b32 {signed}, {value}   // positive so far (NaN too)")
    self.emit(f"and.b32 {sign}, {bits}, 128")
    self.emit(f"shl.b32 {sign}, {sign}, 24")
    self.emit(f"or.b32 {signed}, {signed}, {sign}")
    self.emit(f"mov.b32 {out}, {signed}")
    return out

  def fp8_bits(self, x: str, dtype: DType) -> str:
    """kiln_fp8_bits: a double's fp8 byte (in a 32-bit register): nearest even on the double's bits, a value below
    half the smallest subnormal 0, finite overflow the largest code, NaN and inf their codes; the sign kept."""
    man, min_exp, _, max_code, nan_code, inf_code = _FP8_FORMAT[dtype]
    bits, magnitude, mantissa, kept, rest, mask, half, one = (self.reg("b64") for _ in range(8))
    sign, exponent, shift, code, normal_code, kept32 = (self.reg("b32") for _ in range(6))
    nan, inf, tiny, big, subnormal, above, tie, odd, up = (self.reg("pred") for _ in range(9))
    self.emit(f"mov.b64 {bits}, {x}")
    self.emit(f"shr.u64 {mantissa}, {bits}, 56")
    self.emit(f"cvt.u32.u64 {sign}, {mantissa}")
    self.emit(f"and.b32 {sign}, {sign}, 128")
    self.emit(f"and.b64 {magnitude}, {bits}, 0x7FFFFFFFFFFFFFFF")
    self.emit(f"setp.gt.u64 {nan}, {magnitude}, 0x7FF0000000000000")
    self.emit(f"setp.eq.u64 {inf}, {magnitude}, 0x7FF0000000000000")
    self.emit(f"shr.u64 {mantissa}, {magnitude}, 52")
    self.emit(f"cvt.u32.u64 {exponent}, {mantissa}")
    self.emit(f"sub.s32 {exponent}, {exponent}, 1023")
    self.emit(f"setp.lt.s32 {tiny}, {exponent}, {min_exp - man - 1}")
    self.emit(f"setp.gt.s32 {big}, {exponent}, 16")
    self.emit(f"setp.lt.s32 {subnormal}, {exponent}, {min_exp}")
    self.emit(f"and.b64 {mantissa}, {magnitude}, 0x000FFFFFFFFFFFFF")
    self.emit(f"or.b64 {mantissa}, {mantissa}, 0x0010000000000000")
    # the shift that keeps `man` bits: 52 - man, and the distance below the smallest normal for a subnormal
    self.emit(f"sub.s32 {shift}, {min_exp}, {exponent}")
    self.emit(f"max.s32 {shift}, {shift}, 0")
    self.emit(f"min.s32 {shift}, {shift}, {man + 2}   // (a value this far below is 0 anyway: `tiny`)")
    self.emit(f"add.s32 {shift}, {shift}, {52 - man}")
    self.emit(f"shr.u64 {kept}, {mantissa}, {shift}")
    self.emit(f"mov.b64 {one}, 1")
    self.emit(f"shl.b64 {mask}, {one}, {shift}")
    self.emit(f"sub.s64 {mask}, {mask}, 1")
    self.emit(f"and.b64 {rest}, {mantissa}, {mask}")
    self.emit(f"shr.u64 {half}, {mask}, 1")
    self.emit(f"add.u64 {half}, {half}, 1   // the halfway point, 1 << (shift - 1)")
    self.emit(f"setp.gt.u64 {above}, {rest}, {half}")
    self.emit(f"setp.eq.u64 {tie}, {rest}, {half}")
    self.emit(f"and.b64 {one}, {kept}, 1")
    self.emit(f"setp.ne.u64 {odd}, {one}, 0")
    self.emit(f"and.pred {tie}, {tie}, {odd}")
    self.emit(f"or.pred {up}, {above}, {tie}")
    self.emit(f"cvt.u32.u64 {kept32}, {kept}")
    self.emit(f"@{up} add.u32 {kept32}, {kept32}, 1")
    self.emit(f"sub.s32 {normal_code}, {exponent}, {min_exp - 1}")
    self.emit(f"shl.b32 {normal_code}, {normal_code}, {man}")
    self.emit(f"add.s32 {normal_code}, {normal_code}, {kept32}")
    self.emit(f"sub.s32 {normal_code}, {normal_code}, {1 << man}")
    self.emit(f"selp.b32 {code}, {kept32}, {normal_code}, {subnormal}   // a carry gives the smallest normal's code")
    self.emit(f"min.u32 {code}, {code}, {max_code}")
    self.emit(f"selp.b32 {code}, {max_code}, {code}, {big}")
    self.emit(f"selp.b32 {code}, 0, {code}, {tiny}")
    self.emit(f"selp.b32 {code}, {inf_code}, {code}, {inf}")
    self.emit(f"selp.b32 {code}, {nan_code}, {code}, {nan}")
    self.emit(f"or.b32 {code}, {code}, {sign}")
    return code

  def fp8_round(self, x: str, dtype: DType) -> str:
    """kiln_<fp8>_round: a double rounded to fp8 (nearest even, saturating), as a float."""
    return self.fp8_to_f(self.fp8_bits(x, dtype), dtype)

  # ---- the module ----
  def write(self) -> str:
    """The whole PTX module: header, device arrays, the entry with its parameters, registers and body."""
    buffers, variables = kernel_signature(self.uops)
    prologue: list[str] = []
    self.lines, body = prologue, []
    params = []
    for b in buffers:
      if b.dtype not in _MEMORY_TYPES: raise self.fail(f"a buffer of dtype {b.dtype}")
      params.append(f".param .u64 data{b.arg}")
      generic, out = self.reg("b64"), self.reg("b64")
      self.emit(f"ld.param.u64 {generic}, [data{b.arg}]")
      self.emit(f"cvta.to.global.u64 {out}, {generic}")
      self.names[b] = out
    for t in sorted((u for u in self.uops if u.op is Ops.DEFINE_TENSORMAP), key=lambda u: u.arg[0]):
      params.append(f".param .align 64 .b8 tmap{t.arg[0]}[128]")   # a __grid_constant__ CUtensorMap
      raw, out = self.reg("b64"), self.reg("b64")
      self.emit(f"mov.b64 {raw}, tmap{t.arg[0]}")
      self.emit(f"cvta.param.u64 {out}, {raw}")
      self.names[t] = out
    for i, v in enumerate(variables):
      params.append(f".param .s32 var{i}")
      raw = self.reg(dtypes.int32)
      self.emit(f"ld.param.s32 {raw}, [var{i}]")
      self.names[v] = raw if v.dtype == dtypes.int32 else self.convert(raw, dtypes.int32, v.dtype)
    for (buf, nbytes) in wide_accesses(self.uops):   # the alignment rule's run-time half, once per buffer and width
      low, aligned = self.reg("b64"), self.reg("pred")
      self.emit(f"and.b64 {low}, {self.names[buf]}, {nbytes - 1}")
      self.emit(f"setp.eq.u64 {aligned}, {low}, 0   // data{buf.arg} is {nbytes}-byte aligned")
      self.aligned[buf, nbytes] = aligned
    dependent = dependent_launch(self.arch)   # kiln/renderer/cuda.py DEPENDENT_*, the wait before any memory access
    if dependent and cuda.TRIGGER_AT_START: self.emit("griddepcontrol.launch_dependents")
    if dependent: self.emit(DEPENDENT_WAIT)
    self.lines = body
    self.quads = shared_quads(self.uops)   # earliest load of a quad -> the quad, in element order
    self.quad_members = {load for quad in self.quads.values() for load in quad}
    self.walk()
    self.check_closed(len(self.loops))
    if dependent and not cuda.TRIGGER_AT_START: self.emit("griddepcontrol.launch_dependents")
    registers = [f"  .reg {decl} {prefix}<{self.counts[prefix]}>;" for prefix, decl in self.reg_types.items()]
    head = [f"// kiln: kernel {self.name}", f".version {PTX_VERSION}", f".target {self.arch}", ".address_size 64", ""]
    blocks = 1 if any(u.op is Ops.SETMAXNREG for u in self.uops) else cuda.min_blocks(self.uops)
    bounds = f".maxntid {self.block_threads}, 1, 1" + (f" .minnctapersm {blocks}" if blocks else "")
    return "\n".join(head + self.module_arrays + [
      f".visible .entry {self.name}(", ",\n".join(f"  {p}" for p in params), f") {bounds}",
      "{", *registers, *self.shared_arrays, *prologue, *body, "  ret;", "}", ""])

# ---------------- Hopper (sm_90a): warpgroup MMA, mbarriers, TMA (docs/ir.md stage 4, "Hopper") ----------------

def _hopper_statements(w: _PTXKernelWriter) -> dict:
  return {Ops.WGMMA: lambda u: _wgmma(w, u), Ops.DEFINE_TENSORMAP: w._nothing,
          **{op: (lambda u, op=op: _hopper_op(w, u)) for op in (
            Ops.WGMMA_FENCE, Ops.WGMMA_COMMIT, Ops.WGMMA_WAIT, Ops.MBARRIER_INIT, Ops.MBARRIER_ARRIVE,
            Ops.MBARRIER_WAIT, Ops.TMA_LOAD, Ops.FENCE_PROXY_ASYNC, Ops.SETMAXNREG)}}

_GATES = {Ops.WGMMA: 5, Ops.WGMMA_FENCE: 0, Ops.WGMMA_COMMIT: 0, Ops.WGMMA_WAIT: 0, Ops.MBARRIER_INIT: 2,
          Ops.MBARRIER_ARRIVE: 2, Ops.MBARRIER_WAIT: 3, Ops.TMA_LOAD: 7, Ops.SETMAXNREG: 0}

def _gate_open(w: _PTXKernelWriter, u: UOp) -> None:
  """Branch past the op where its gate is false; a run of ops of one gate in a row shares one branch (its skip
  label moved to the end)."""
  if u.op not in _GATES: return
  gate = u.src[_GATES[u.op]]
  if gate.op is Ops.CONST and gate.arg is True: return
  if w.skip is not None and w.skip[0] == len(w.lines) and w.skip[1] is gate:
    w.lines.pop()   # the previous op's skip label: this op joins its branch
    w.skip = (-1, gate, w.skip[2])
    return
  label = f"$L{w.name}_{w.labels}_skip"
  w.labels += 1
  w.emit(f"@!{w.value(gate)} bra {label}")
  w.skip = (-1, gate, label)

def _gate_close(w: _PTXKernelWriter, u: UOp) -> None:
  if u.op not in _GATES or w.skip is None or w.skip[0] != -1: return
  w.lines.append(f"{w.skip[2]}:")
  w.skip = (len(w.lines), w.skip[1], w.skip[2])

def _shared32(w: _PTXKernelWriter, buf: UOp, offset: str | None = None, index: UOp | None = None) -> str:
  """A b32 register: the shared address of `buf` plus a byte offset register, or of element `index`."""
  base = w.reg("b32")
  w.emit(f"cvt.u32.u64 {base}, {w.value(buf)}")
  if index is not None:
    offset = w.reg("b32")
    w.emit(f"mul.lo.u32 {offset}, {w.operand(index)}, {buf.dtype.itemsize}")
  if offset is None: return base
  out = w.reg("b32")
  w.emit(f"add.u32 {out}, {base}, {offset}")
  return out

def _hopper_op(w: _PTXKernelWriter, u: UOp) -> None:
  _gate_open(w, u)
  if u.op is Ops.WGMMA_FENCE: w.emit("wgmma.fence.sync.aligned")
  elif u.op is Ops.WGMMA_COMMIT: w.emit("wgmma.commit_group.sync.aligned")
  elif u.op is Ops.WGMMA_WAIT: w.emit(f"wgmma.wait_group.sync.aligned {u.arg}")
  elif u.op is Ops.FENCE_PROXY_ASYNC: w.emit("fence.proxy.async.shared::cta")
  elif u.op is Ops.SETMAXNREG: w.emit(f"setmaxnreg.{u.arg[1]}.sync.aligned.u32 {u.arg[0]}")
  elif u.op is Ops.MBARRIER_INIT:
    w.emit(f"mbarrier.init.shared::cta.b64 [{_shared32(w, u.src[0], index=u.src[1])}], {u.arg}")
    w.emit("fence.mbarrier_init.release.cluster")
  elif u.op is Ops.MBARRIER_ARRIVE:
    at, state = _shared32(w, u.src[0], index=u.src[1]), w.reg("b64")
    if u.arg: w.emit(f"mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{at}], {u.arg}")
    else: w.emit(f"mbarrier.arrive.shared::cta.b64 {state}, [{at}]")
  elif u.op is Ops.MBARRIER_WAIT:
    at, parity, done = _shared32(w, u.src[0], index=u.src[1]), w.reg("b32"), w.reg("pred")
    w.emit(f"and.b32 {parity}, {w.operand(u.src[2])}, 1")
    top = f"$L{w.name}_{w.labels}_wait"
    w.labels += 1
    w.lines.append(f"{top}:")
    w.emit(f"mbarrier.try_wait.parity.shared::cta.b64 {done}, [{at}], {parity}")
    w.emit(f"@!{done} bra {top}   // until the phase of that parity has completed")
  elif u.op is Ops.TMA_LOAD:
    dst, offset, tmap, bars, bar, row, col = u.src[:7]
    dst_at = _shared32(w, dst, w.operand(offset) if offset.op is not Ops.CONST else str(int(offset.arg)))
    bar_at = _shared32(w, bars, index=bar)
    coords = [w.value(c) if c.op is not Ops.CONST else w.value(UOp.const(dtypes.int32, c.arg)) for c in (col, row)]
    w.emit(f"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{dst_at}], "
           f"[{w.value(tmap)}, {{{coords[0]}, {coords[1]}}}], [{bar_at}]")
  _gate_close(w, u)

def _wgmma(w: _PTXKernelWriter, u: UOp) -> None:
  """`wgmma.mma_async` on the accumulator's registers in place (moved into fresh ones first where the accumulator
  is not a variable), the descriptors built from the operands' shared addresses and the arg's layouts."""
  from kiln.runtime.gpu_target import SWIZZLE_MODES
  wg = u.arg
  a_smem, a_off, b_smem, b_off, acc = u.src[:5]
  if acc.op in (Ops.DEFINE_ACC, Ops.ASSIGN, Ops.WGMMA) and acc in w.lanes: regs = w.lanes[acc]
  else:
    regs = [w.reg(dtypes.float32) for _ in range(u.dtype.count)]
    for out, x in zip(regs, w.vector_lanes(acc)): w.emit(f"mov.f32 {out}, {x}")
  w.lanes[u] = regs
  _gate_open(w, u)
  descs = []
  for smem, off, layout in ((a_smem, a_off, wg.a), (b_smem, b_off, wg.b)):
    at = _shared32(w, smem, w.operand(off) if off.op is not Ops.CONST else str(int(off.arg)))
    low, wide, desc = w.reg("b32"), w.reg("b64"), w.reg("b64")
    fixed = (((layout.lbo >> 4) & 0x3FFF) << 16) | (((layout.sbo >> 4) & 0x3FFF) << 32) | \
      (SWIZZLE_MODES[layout.swizzle] << 62)
    w.emit(f"bfe.u32 {low}, {at}, 4, 14")
    w.emit(f"cvt.u64.u32 {wide}, {low}")
    w.emit(f"or.b64 {desc}, {wide}, {fixed:#x}")
    descs.append(desc)
  scale = w.value(UOp.const(dtypes.bool, True))
  tail = ", 1, 1, 0, 0" if wg.dtype_in.itemsize == 2 else ", 1, 1"
  w.emit(f"{wg.instruction} {{{', '.join(regs)}}}, {descs[0]}, {descs[1]}, {scale}{tail}")
  _gate_close(w, u)

# what may change a shared array between two loads (copies land at a CP_ASYNC_WAIT)
_STRAIGHT_BREAKS = frozenset({Ops.RANGE, Ops.ENDRANGE, Ops.BARRIER, Ops.STORE, Ops.ATOMIC, Ops.CP_ASYNC,
                              Ops.CP_ASYNC_WAIT, Ops.MBARRIER_WAIT, Ops.WGMMA_WAIT, Ops.TMA_LOAD})

def shared_quads(uops: list[UOp]) -> dict[UOp, list[UOp]]:
  """Groups of four ungated float32 loads of one shared array at elements `base + 4q + j` (j = 0..3, `base` a
  multiple of 4: 16-byte aligned, as the arrays are) with nothing between them that could change the array or the
  iteration: each group is read by one vector load where its earliest member stands (a GPU matmul tile's shared reads,
  kiln/codegen/gpu_tiles.py). Keyed by that earliest load; each group in element order."""
  groups: dict[tuple[UOp, UOp, int], dict[int, tuple[int, UOp]]] = {}
  for pos, u in enumerate(uops):
    if u.op is not Ops.LOAD or u.dtype != dtypes.float32 or u.src[0].op is not Ops.DEFINE_LOCAL: continue
    if len(u.src[0].arg) > 2 or (len(u.src) == 3 and u.src[2].op is not Ops.BARRIER): continue
    index = u.src[1]
    base, const = (index.src[0], index.src[1].arg) if index.op is Ops.ADD and index.src[1].op is Ops.CONST else \
      (index, 0)
    if not isinstance(const, int) or const < 0 or not is_multiple_of(base, 4): continue
    groups.setdefault((u.src[0], base, const // 4), {}).setdefault(const % 4, (pos, u))
  breaks = [pos for pos, u in enumerate(uops) if u.op in _STRAIGHT_BREAKS]
  quads: dict[UOp, list[UOp]] = {}
  for members in groups.values():
    if len(members) != 4: continue
    positions = [pos for pos, _ in members.values()]
    if any(min(positions) < b < max(positions) for b in breaks): continue
    earliest = uops[min(positions)]
    quads[earliest] = [members[j][1] for j in range(4)]
  return quads
