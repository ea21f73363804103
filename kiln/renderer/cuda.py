"""CUDARenderer: a linearized kernel becomes one `extern "C" __global__` CUDA C++ function, compiled by NVRTC.

It is the C renderer (kiln/renderer/cstyle.py) with a GPU's entry point: the semantics are the C renderer's, op for
op, so a kernel gives the CPU's bits where the hardware rounds alike (NVRTC compiles with `--fmad=false`: no FMA
contraction; exp2/log2/sin are kiln's software math, as on the CPU; float16, bfloat16 and fp8 are stored as their
bits and computed in float with the same rounding helpers). What differs:
- the output axes were mapped to block and thread indices before linearizing (kiln/codegen/gpudims.py): SPECIAL
  `gidx0` is `blockIdx.x`, `lidx0` is `threadIdx.x`; every other loop is a loop in each thread;
- no CPU thread plan (no `kiln_tid`/`kiln_nthreads` parameters, no `_task` entry point) and no GNU vector types:
  the only vectors are a thread's wide global accesses (kiln/codegen/wide_memory.py), a `kiln_vec<float, 4>` (a
  struct aligned to its size, so one access is one `ld.global.v4`) read through a pointer cast where the kernel's
  test of the buffer's base pointer found it aligned, else lane by lane (the module's alignment rule);
- the helper functions are `__device__`, parameters `__restrict__`, and the kernel has `__launch_bounds__` of its
  block size;
- a warp SHUFFLE is `__shfl_xor_sync` over the whole warp (docs/ir.md stage 4);
- the tensor-core ops (docs/ir.md stage 4) are inline PTX: WMMA one `mma.sync`, its A and B fragments packed into
  32-bit registers (two 16-bit floats, four fp8 or one tf32 a register, taken from the loaded bits where the element
  is a load), its C and D a `kiln_vec<float, 4>`; LDMATRIX one `ldmatrix` into packed registers; CP_ASYNC one
  `cp.async` (src-size 0 where its gate is false), CP_ASYNC_COMMIT/WAIT `cp.async.commit_group`/`wait_group`.
"""
from __future__ import annotations
from kiln.dtype import dtypes
from kiln.renderer import kernel_function_name
from kiln.renderer.cstyle import (CRenderer, _CKernelWriter, BF16_HELPERS, FP8_HELPERS, HALF_HELPERS,
                                  STORAGE_TYPES, VALUE_TYPES, fp8_helpers, render_c_const)
from kiln.uop.ops import UOp, Ops
from kiln.renderer.shared_memory import DYNAMIC_SHARED_NAME, shared_layout, swizzled_arrays

# NVRTC has neither GCC's builtins nor statement expressions: the C renderer's builtins are spelled as CUDA's math
# functions and intrinsics (NaN with the bits C's __builtin_nan gives), memcpy as a byte copy the compiler turns into
# register moves, and a bitcast as a union (`kiln_bitcast`). C's _Bool is C++'s bool; the 16-bit float helpers take
# their bit-exact path (no _Float16).
_MATH = ("fma", "sqrt", "trunc", "fabs", "fmod", "pow", "exp2", "log2", "sin", "cos", "tan", "exp")
PRELUDE = "\n".join([
  "#define _Bool bool", "#define KILN_SOFT_HALF 1",
  "#define __builtin_inff() __int_as_float(0x7f800000)",
  "#define __builtin_inf() __longlong_as_double(0x7ff0000000000000ll)",
  "#define __builtin_nanf(s) __int_as_float(0x7fc00000)",
  "#define __builtin_nan(s) __longlong_as_double(0x7ff8000000000000ll)",
  *[f"#define __builtin_{name}f {name}f\n#define __builtin_{name} {name}" for name in _MATH],
  "#define __builtin_memcpy(dst, src, n) kiln_memcpy(dst, src, n)",
  "static inline __device__ void kiln_memcpy(void* dst, const void* src, unsigned int n) {",
  "  for (unsigned int i = 0; i < n; i++) ((unsigned char*)dst)[i] = ((const unsigned char*)src)[i];",
  "}",
  "template <typename To, typename From> static inline __device__ To kiln_bitcast(From x) {",
  "  union { From from; To to; } bits; bits.from = x; return bits.to;",
  "}",
  "template <typename T, int N> struct alignas(sizeof(T) * N) kiln_vec { T v[N]; };"])
SPECIAL_INDICES = {"gidx": "blockIdx", "lidx": "threadIdx"}
CUDA_WARP = 32   # lanes of a warp on every NVIDIA GPU (the full mask, 0xffffffff, names them all)

def shuffle_carrier(dtype) -> str:
  """The C type of `__shfl_xor_sync`'s overload that carries a value of `dtype`: its own 32- or 64-bit type; float
  for the 16-bit floats and fp8 (held as float); int for bool and narrower integers (widened, then narrowed back)."""
  if dtype in (dtypes.float64, dtypes.int64, dtypes.uint64, dtypes.uint32): return VALUE_TYPES[dtype]
  return "float" if dtypes.is_float(dtype) else "int"

# a 16-bit float or fp8 value (computed in float) to its bits, and bits to the value, as the C renderer's BITCAST
_TO_BITS = {dtypes.bfloat16: "kiln_f_to_bf16({})", dtypes.float16: "kiln_half_bits({})",
            **{fp8: f"kiln_{fp8.name}_bits({{}})" for fp8 in dtypes.fp8s}}
_FROM_BITS = {dtypes.bfloat16: "kiln_bf16_to_f({})", dtypes.float16: "kiln_half_to_f({})",
              **{fp8: f"kiln_{fp8.name}_to_f({{}})" for fp8 in dtypes.fp8s}}

def wide_accesses(uops: list[UOp]) -> dict[tuple[UOp, int], str]:
  """(global buffer, bytes) of each wide access of a kernel (kiln/codegen/wide_memory.py) -> the name of the
  kernel's test that the buffer's base pointer is aligned to that many bytes, in first-use order."""
  out: dict[tuple[UOp, int], str] = {}
  for u in uops:
    if u.op is Ops.LOAD and u.dtype.count > 1: buf, nbytes = u.src[0], u.dtype.itemsize
    elif u.op is Ops.STORE and u.src[2].dtype.count > 1: buf, nbytes = u.src[0], u.src[2].dtype.itemsize
    else: continue
    if buf.op is not Ops.DEFINE_GLOBAL: raise NotImplementedError(f"a vector access of {buf.op} (only global buffers)")
    out.setdefault((buf, nbytes), f"kiln_aligned{buf.arg}_{nbytes}")
  return out

def device_helpers(block: str) -> str:
  """A C helper block made callable from kernels (`static inline` -> `static inline __device__`)."""
  return block.replace("static inline ", "static inline __device__ ")

# programmatic dependent launch (sm_90+): each kernel first lets the next kernel of a CUDA graph start launching
# (launch_dependents), then waits until the kernels it depends on have finished and their memory is visible (wait),
# before it touches memory. Launched any other way (a plain launch, a graph edge of the default kind) both are no-ops.
DEPENDENT_WAIT = "griddepcontrol.wait"
DEPENDENT_TRIGGER = '  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");'
# where a kernel lets the next one start launching: at its end (its blocks' last instruction), or, True, at its
# start (bench --programmatic 1; H200, bench/gpu_notes.md calls 28-29: small kernels gained, matrix-vector ones lost)
TRIGGER_AT_START = False
# kernels declare `__launch_bounds__(L, MIN_BLOCKS)` (PTX `.maxntid L .minnctapersm MIN_BLOCKS`): one block an SM
# is enough, so ptxas gives each thread the registers its code needs. Given L alone, ptxas capped registers for an
# occupancy of its own choosing and spilled small kernels to local memory (test/gpu_render_sweep.py found them).
# Kernels of a register tile (TILE_ACCUMULATORS accumulators a thread or more: the matmul and conv tiles, sized for
# two blocks an SM) keep L alone: given one block, ptxas gave a guarded matmul tile more registers than two blocks
# allow, and it ran slower (bench/gpu_notes.md, call main14-1). 0: L alone everywhere.
MIN_BLOCKS = 1
TILE_ACCUMULATORS = 16

def min_blocks(uops: list[UOp]) -> int:
  """The B of `__launch_bounds__(L, B)` for the kernel of `uops`, 0 to leave it out (a register tile)."""
  if not MIN_BLOCKS: return 0
  accumulators = sum(u.dtype.count for u in uops if u.op is Ops.DEFINE_ACC)
  return 0 if accumulators >= TILE_ACCUMULATORS else MIN_BLOCKS

def dependent_launch(arch: str) -> bool:
  """Whether kernels for `arch` ("sm_90a") start with the programmatic-dependent-launch instructions (sm_90 and up)."""
  digits = "".join(ch for ch in arch.partition("_")[2] if ch.isdigit())
  return bool(digits) and int(digits) >= 90

def fragment_loads(uops: list[UOp]) -> set[UOp]:
  """The loads of 16- or 8-bit floats that are elements of a WMMA's A or B fragment (a VECTORIZE): renderers keep
  their loaded bits, which the fragment's registers pack as they are."""
  out: set[UOp] = set()
  for u in uops:
    if u.op is not Ops.WMMA: continue
    for operand in u.src[:2]:
      if operand.op is Ops.VECTORIZE:
        out.update(s for s in operand.src if s.op is Ops.LOAD and s.dtype in _TO_BITS and s.dtype.count == 1)
  return out

def packed_registers(dtype) -> int:
  """The 32-bit registers a fragment of `dtype` (a vector of 16-bit floats, fp8 or tf32 lanes) packs into."""
  return dtype.count * dtype.scalar.itemsize // 4

def shared_address(array: str, index: str) -> str:
  """The 32-bit shared-memory address of element `index` of shared array `array` (an inline PTX operand)."""
  return f"(unsigned)__cvta_generic_to_shared({array}+({index}))"

# ---------------- Hopper (sm_90a): warpgroup MMA, mbarriers, TMA (docs/ir.md stage 4, "Hopper") ----------------

# a CUtensorMap kernel parameter (cuda.h's CUtensorMap: 128 opaque bytes, 64-byte aligned), without cuda.h
TENSORMAP_TYPE = "struct alignas(64) kiln_tensormap { unsigned long long opaque[16]; };"

def _shared_bytes(array: str, offset: str) -> str:
  """The 32-bit shared address of byte `offset` of shared array `array`."""
  return f"((unsigned)__cvta_generic_to_shared({array}) + (unsigned)({offset}))"

def _descriptor(address: str, layout) -> str:
  """A wgmma matrix descriptor (SmemMatrix.descriptor) of a tile at 32-bit shared address `address`."""
  from kiln.runtime.gpu_target import SWIZZLE_MODES
  fixed = (((layout.lbo >> 4) & 0x3FFF) << 16) | (((layout.sbo >> 4) & 0x3FFF) << 32) | \
    (SWIZZLE_MODES[layout.swizzle] << 62)
  return f"((unsigned long long)((({address}) >> 4) & 0x3FFF) | {fixed:#x}ull)"

def _hopper_statements(writer) -> dict:
  return {Ops.WGMMA: writer._wgmma, Ops.WGMMA_FENCE: writer._wgmma_sync, Ops.WGMMA_COMMIT: writer._wgmma_sync,
          Ops.WGMMA_WAIT: writer._wgmma_sync, Ops.MBARRIER_INIT: writer._mbarrier_init,
          Ops.MBARRIER_ARRIVE: writer._mbarrier_arrive, Ops.MBARRIER_WAIT: writer._mbarrier_wait,
          Ops.DEFINE_TENSORMAP: writer._define_tensormap, Ops.TMA_LOAD: writer._tma_load,
          Ops.FENCE_PROXY_ASYNC: writer._fence_proxy_async, Ops.SETMAXNREG: writer._setmaxnreg}

class _HopperWriter:
  """The CUDA writer's Hopper statements: each one inline-PTX `asm volatile`, inside `if (gate)` unless the gate is
  the constant true."""
  def hopper_statements(self) -> dict: return _hopper_statements(self)

  def gated(self, u: UOp, at: int, line: str) -> None:
    """`line` under `if (gate)`; a run of ops of one gate in a row shares one branch (ptxas serializes wgmmas whose
    accumulators cross divergent paths: each in a branch of its own)."""
    gate = u.src[at]
    if gate.op is Ops.CONST and gate.arg is True: return self.emit(line)
    last = getattr(self, "last_gated", None)
    if last is not None and last[0] == len(self.lines) and last[1] is gate:
      self.lines[-1] = self.lines[-1][:-2] + "\n" + self.lines[-1][:len(self.lines[-1]) -
                                                                   len(self.lines[-1].lstrip())] + f"  {line} }}"
    else: self.emit(f"if ({self.expr(gate)}) {{ {line} }}")
    self.last_gated = (len(self.lines), gate)

  def _define_tensormap(self, u: UOp) -> None:
    self.tensormaps.append(u)
    self.names[u] = f"tmap{u.arg[0]}"

  def _mbarrier_init(self, u: UOp) -> None:
    at = shared_address(self.expr(u.src[0]), self.expr(u.src[1]))
    self.gated(u, 2, f'asm volatile("mbarrier.init.shared::cta.b64 [%0], {u.arg};\\n\\t'
                     f'fence.mbarrier_init.release.cluster;" :: "r"({at}) : "memory");')

  def _mbarrier_arrive(self, u: UOp) -> None:
    at = shared_address(self.expr(u.src[0]), self.expr(u.src[1]))
    op = f"mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], {u.arg}" if u.arg else \
      "mbarrier.arrive.shared::cta.b64 state, [%0]"
    self.gated(u, 2, f'asm volatile("{{ .reg .b64 state; {op}; }}" :: "r"({at}) : "memory");')

  def _mbarrier_wait(self, u: UOp) -> None:
    at = shared_address(self.expr(u.src[0]), self.expr(u.src[1]))
    done = self.fresh_name("phase_done")
    self.gated(u, 3, f'unsigned {done}; do {{ asm volatile("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 '
                     f'p, [%1], %2; selp.u32 %0, 1, 0, p; }}" : "=r"({done}) : "r"({at}), '
                     f'"r"((unsigned)({self.expr(u.src[2])}) & 1u) : "memory"); }} while (!{done});')

  def _tma_load(self, u: UOp) -> None:
    dst, offset, tmap, bars, bar, row, col = u.src[:7]
    self.gated(u, 7, 'asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes '
                     '[%0], [%1, {%2, %3}], [%4];" :: '
                     f'"r"({_shared_bytes(self.expr(dst), self.expr(offset))}), '
                     f'"l"((unsigned long long)&{self.expr(tmap)}), "r"((int)({self.expr(col)})), '
                     f'"r"((int)({self.expr(row)})), "r"({shared_address(self.expr(bars), self.expr(bar))}) : "memory");')

  def _fence_proxy_async(self, u: UOp) -> None:
    self.emit('asm volatile("fence.proxy.async.shared::cta;" ::: "memory");')

  def _setmaxnreg(self, u: UOp) -> None:
    count, how = u.arg
    self.gated(u, 0, f'asm volatile("setmaxnreg.{how}.sync.aligned.u32 {count};");')

  def _wgmma_sync(self, u: UOp) -> None:
    text = {Ops.WGMMA_FENCE: "wgmma.fence.sync.aligned", Ops.WGMMA_COMMIT: "wgmma.commit_group.sync.aligned",
            Ops.WGMMA_WAIT: f"wgmma.wait_group.sync.aligned {u.arg}"}[u.op]
    self.gated(u, 0, f'asm volatile("{text};" ::: "memory");')

  def _wgmma(self, u: UOp) -> None:
    """One `wgmma.mma_async` on the accumulator's registers in place ("+f"; a copy first where the accumulator is
    not a variable), the descriptors built from the operands' shared addresses and the arg's layouts."""
    wg = u.arg
    a_smem, a_off, b_smem, b_off, acc = u.src[:5]
    lanes = u.dtype.count
    if acc.op in (Ops.DEFINE_ACC, Ops.ASSIGN, Ops.WGMMA) and acc in self.names: name = self.names[acc]
    else:
      name = self.fresh_name("wgmma")
      self.emit(f"kiln_vec<float, {lanes}> {name} = {{{{{', '.join(self.float_lanes(acc))}}}}};")
    self.names[u] = name
    desc_a = _descriptor(_shared_bytes(self.expr(a_smem), self.expr(a_off)), wg.a)
    desc_b = _descriptor(_shared_bytes(self.expr(b_smem), self.expr(b_off)), wg.b)
    regs = "{" + ", ".join(f"%{k}" for k in range(lanes)) + "}"
    tail = ", p, 1, 1, 0, 0" if wg.dtype_in.itemsize == 2 else ", p, 1, 1"
    outs = ", ".join(f'"+f"({name}.v[{k}])' for k in range(lanes))
    self.gated(u, 5, f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{lanes + 2}, 0; {wg.instruction} {regs}, '
                     f'%{lanes}, %{lanes + 1}{tail}; }}" : {outs} : "l"({desc_a}), "l"({desc_b}), "r"(1) : "memory");')

class CUDARenderer(CRenderer):
  """Renders a linearized kernel as `extern "C" __global__ void name(T* __restrict__ data0, ..., int var0)`."""
  device = "CUDA"
  has_local = True   # blocks and threads: kernels go through kiln/codegen/gpudims.py
  packs_matmul_operands = False   # the tile-major copies suit CPU caches (kiln/schedule/pack.py)
  # a GPU's threads come from SPECIALs (kiln/codegen/gpudims.py), not a thread plan; GNU C vector types are CPU code
  has_threads = vectorizes = False
  wide_memory = True   # a thread's adjacent aligned global accesses as one (kiln/codegen/wide_memory.py)

  def __init__(self, arch: str = "sm_90a"):
    self.arch = arch

  def render(self, name: str, uops: list[UOp], threads=None) -> str:
    """The CUDA C++ source of kernel `name` (`threads`, a CPU thread plan, is ignored)."""
    writer = _CudaKernelWriter(kernel_function_name(name), uops)
    writer.dependent_launch = dependent_launch(self.arch)
    return writer.render()

class _CudaKernelWriter(_HopperWriter, _CKernelWriter):
  """The C kernel writer with SPECIAL thread indices and a `__global__` signature."""
  def __init__(self, name: str, uops: list[UOp]):
    super().__init__(name, uops)
    self.statements.update({Ops.SPECIAL: self._special, Ops.DEFINE_LOCAL: self._define_local,
                            Ops.BARRIER: self._barrier, Ops.ATOMIC: self._atomic, Ops.SHUFFLE: self._shuffle,
                            Ops.GEP: self._lane, Ops.WMMA: self._wmma, Ops.LDMATRIX: self._ldmatrix,
                            Ops.CP_ASYNC: self._cp_async, Ops.CP_ASYNC_COMMIT: self._cp_async_commit,
                            Ops.CP_ASYNC_WAIT: self._cp_async_wait})
    self.statements.update(self.hopper_statements())
    self.tensormaps: list[UOp] = []   # DEFINE_TENSORMAP parameters, in arg order (after the buffers)
    self.raw_bits: dict[UOp, str] = {}   # a fragment element's load -> the name of its loaded bits
    self.fragment_loads = fragment_loads(uops)
    self.packed: dict[UOp, int] = {}   # an LDMATRIX value -> its packed 32-bit registers (a kiln_vec<unsigned, R>)
    self.aligned = wide_accesses(uops)   # (buffer, bytes) of each wide access -> its base pointer test's name
    self.device_arrays: list[str] = []   # file-scope `__device__` arrays (DEFINE_LOCAL with a "device" scope)
    self.shared = shared_layout(uops)   # the block's shared arrays: static, or one dynamic array over 48 KiB
    self.declared_dynamic = False
    self.block_threads = 1
    self.dependent_launch = False   # the DEPENDENT_* instructions (CUDARenderer.render sets it from the arch)

  def _special(self, u: UOp) -> None:
    kind, size = u.arg
    axis = "xyz"[int(kind[4:])]
    if kind.startswith("lidx"): self.block_threads *= size
    name = self.names[u] = kind
    self.emit(f"const int {name} = {SPECIAL_INDICES[kind[:4]]}.{axis};   /* < {size} */")

  def _define_local(self, u: UOp) -> None:
    self.note_dtype(u.dtype)
    name = self.names[u] = u.arg[0]
    if len(u.arg) > 2 and u.arg[2] == "device":   # zero when the module loads, kept between launches
      self.device_arrays.append(f"__device__ {STORAGE_TYPES[u.dtype]} {name}[{u.arg[1]}];")
    elif self.shared.dynamic:   # over 48 KiB: a pointer at the array's offset in the launch's dynamic shared memory
      if not self.declared_dynamic:
        align = 1024 if swizzled_arrays(self.uops) else 16
        self.emit(f"extern __shared__ __align__({align}) unsigned char {DYNAMIC_SHARED_NAME}[];   /* "
                  f"{self.shared.nbytes} bytes a launch */")
        self.declared_dynamic = True
      self.emit(f"{STORAGE_TYPES[u.dtype]}* const {name} = reinterpret_cast<{STORAGE_TYPES[u.dtype]}*>("
                f"{DYNAMIC_SHARED_NAME} + {self.shared.offsets[u]});")
    # 16-byte aligned: NVVM then merges a thread's reads of 4 adjacent aligned elements into one ld.shared.v4
    # an operand of a TMA copy or a WGMMA: aligned to the 128-byte swizzle's repeat (its address bits are the swizzle)
    elif any((v.op is Ops.TMA_LOAD and v.src[0] is u) or (v.op is Ops.WGMMA and u in v.src[:3]) for v in self.uops):
      self.emit(f"__shared__ __align__(1024) {STORAGE_TYPES[u.dtype]} {name}[{u.arg[1]}];")
    else: self.emit(f"__shared__ __align__(16) {STORAGE_TYPES[u.dtype]} {name}[{u.arg[1]}];")

  def _atomic(self, u: UOp) -> None:
    buf, index, value, gate = u.src[:4]
    if u.arg is not Ops.ADD or u.dtype not in (dtypes.uint32, dtypes.int32):
      raise NotImplementedError(f"CUDARenderer: no ATOMIC {u.arg} on {u.dtype} (kernel {self.name})")
    name = self.names[u] = self.fresh_name("ticket")
    self.emit(f"{STORAGE_TYPES[u.dtype]} {name} = 0;")
    self.emit(f"if ({self.expr(gate)}) {{ __threadfence(); {name} = atomicAdd(&{self.expr(buf)}[{self.expr(index)}], "
              f"{self.expr(value)}); }}   /* this block's stores above are visible to every block first */")

  def _shuffle(self, u: UOp) -> None:
    """`const T name = __shfl_xor_sync(0xffffffff, x, k);`: a statement of its own, never inside another
    expression (a ternary would run it in some lanes only)."""
    k, warp = u.arg
    if warp != CUDA_WARP or u.dtype.count != 1:
      raise NotImplementedError(f"CUDARenderer: SHUFFLE {u.arg} of {u.dtype}: warps have {CUDA_WARP} lanes and "
                                f"shuffles move scalars (kernel {self.name})")
    self.note_dtype(u.dtype)
    carrier, value_type = shuffle_carrier(u.dtype), VALUE_TYPES[u.dtype]
    x = self.expr(u.src[0]) if carrier == value_type else f"({carrier})({self.expr(u.src[0])})"
    text = f"__shfl_xor_sync(0xffffffffu, {x}, {k})"
    if carrier != value_type: text = f"(({value_type}){text})"
    name = self.names[u] = self.fresh_name("lane")
    self.emit(f"const {value_type} {name} = {text};   /* from lane ^ {k} of the warp */")

  def _barrier(self, u: UOp) -> None:
    self.emit("__syncthreads();   /* the block's shared stores above, before any thread reads them */")

  def _lane(self, u: UOp) -> None:
    """A GEP: the lane of a wide load's, an accumulator's or a WMMA's `kiln_vec` (an accumulator's read where it is
    used), a VECTORIZE's source, or an element unpacked from an LDMATRIX's registers."""
    vec = u.src[0]
    if vec.op is Ops.VECTORIZE: self.names[u] = self.expr(vec.src[u.arg])
    elif vec in self.packed:
      scalar = vec.dtype.scalar
      bits = f"(unsigned short)({self.names[vec]}.v[{u.arg // 2}] >> {16 * (u.arg % 2)})"
      self.note_dtype(scalar)
      self.names[u] = _FROM_BITS[scalar].format(bits) if scalar in _FROM_BITS else \
        f"(({VALUE_TYPES[scalar]})({STORAGE_TYPES[scalar]}){bits})"
    elif vec.op in (Ops.LOAD, Ops.DEFINE_ACC, Ops.WMMA, Ops.ASSIGN, Ops.CONST):
      self.names[u] = self.float_lanes(vec)[u.arg]
    else: raise NotImplementedError(f"CUDARenderer: a GEP of {vec.op} ({self.name})")

  # ---- tensor-core ops (docs/ir.md stage 4) ----
  def float_lanes(self, u: UOp) -> list[str]:
    """The lanes of a vector value (a WMMA's C or D, an accumulator, a wide load) as C expressions."""
    if u.op is Ops.VECTORIZE: return [self.expr(s) for s in u.src]
    if u.op is Ops.CONST:
      values = u.arg if isinstance(u.arg, tuple) else (u.arg,) * u.dtype.count
      return [render_c_const(x, u.dtype.scalar) for x in values]
    return [f"{self.names[u]}.v[{k}]" for k in range(u.dtype.count)]

  def element_bits(self, x: UOp) -> str:
    """A fragment element's bits as an unsigned int: the loaded bits of a load, else the value converted (exact:
    it is a value of its dtype already); a float32 (tf32) element's own bits."""
    if x in self.raw_bits: return f"(unsigned){self.raw_bits[x]}"
    if x.dtype == dtypes.float32: return f"__float_as_uint({self.expr(x)})"
    return f"(unsigned){_TO_BITS[x.dtype].format(self.expr(x))}"

  def fragment_registers(self, u: UOp) -> list[str]:
    """A WMMA's A or B fragment as 32-bit register expressions (element 0 in the low bits)."""
    if u in self.packed: return [f"{self.names[u]}.v[{k}]" for k in range(self.packed[u])]
    if u.op is not Ops.VECTORIZE: raise NotImplementedError(f"CUDARenderer: a WMMA fragment from {u.op} ({self.name})")
    per = 4 // u.dtype.scalar.itemsize
    bits = [self.element_bits(x) for x in u.src]
    regs = []
    for k in range(0, len(bits), per):
      parts = [b if j == 0 else f"({b} << {8 * 4 // per * j})" for j, b in enumerate(bits[k:k + per])]
      regs.append(parts[0] if per == 1 else f"({' | '.join(parts)})")
    return regs

  def _wmma(self, u: UOp) -> None:
    """`asm volatile("mma.sync...")` on the packed A and B registers and C's floats, into a `kiln_vec<float, 4>`."""
    tc = u.arg
    self.note_dtype(tc.dtype_in)
    a, b = self.fragment_registers(u.src[0]), self.fragment_registers(u.src[1])
    c, lanes = self.float_lanes(u.src[2]), u.dtype.count
    name = self.names[u] = self.fresh_name("wmma")
    groups, at = [], 0
    for count in (lanes, len(a), len(b), lanes):
      groups.append("{" + ", ".join(f"%{at + k}" for k in range(count)) + "}")
      at += count
    outs = ", ".join(f'"=f"({name}.v[{k}])' for k in range(lanes))
    ins = ", ".join([f'"r"({r})' for r in a + b] + [f'"f"({x})' for x in c])
    self.emit(f"kiln_vec<float, {lanes}> {name};")
    self.emit(f'asm volatile("{tc.instruction} {", ".join(groups)};" : {outs} : {ins});')

  def _ldmatrix(self, u: UOp) -> None:
    """`ldmatrix.sync.aligned.m8n8.x{n}[.trans].shared.b16` into a `kiln_vec<unsigned, n>` (packed elements)."""
    buf, index = u.src[:2]
    matrices, trans = u.arg
    self.note_dtype(buf.dtype)
    name = self.names[u] = self.fresh_name("ldm")
    self.packed[u] = matrices
    regs = ", ".join(f"%{k}" for k in range(matrices))
    outs = ", ".join(f'"=r"({name}.v[{k}])' for k in range(matrices))
    op = f"ldmatrix.sync.aligned.m8n8.x{matrices}{'.trans' if trans else ''}.shared.b16"
    self.emit(f"kiln_vec<unsigned, {matrices}> {name};")
    self.emit(f'asm volatile("{op} {{{regs}}}, [%{matrices}];" : {outs} : '
              f'"r"({shared_address(self.expr(buf), self.expr(index))}) : "memory");')

  def _cp_async(self, u: UOp) -> None:
    """`cp.async.{ca|cg}.shared.global [dst], [src], n(, src-size)`: src-size 0 (zero fill) where the gate fails."""
    dst, dst_index, src, src_index = u.src[:4]
    nbytes, cache = u.arg
    self.note_dtype(src.dtype)
    operands = [f'"r"({shared_address(self.expr(dst), self.expr(dst_index))})',
                f'"l"({self.expr(src)}+({self.expr(src_index)}))']
    size = ""
    if len(u.src) == 5:
      size = ", %2"
      operands.append(f'"r"({self.expr(u.src[4])} ? {nbytes} : 0)')
    self.emit(f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], {nbytes}{size};" :: {", ".join(operands)} : '
              '"memory");')

  def _cp_async_commit(self, u: UOp) -> None:
    self.emit('asm volatile("cp.async.commit_group;" ::: "memory");')

  def _cp_async_wait(self, u: UOp) -> None:
    self.emit(f'asm volatile("cp.async.wait_group {u.arg};" ::: "memory");   /* this thread\'s copies but the last '
              f'{u.arg} groups have landed */')

  def _define_acc(self, u: UOp) -> None:
    if u.dtype.count == 1: return super()._define_acc(u)
    self.note_dtype(u.dtype.scalar)   # a WMMA's accumulator: a kiln_vec
    name = self.names[u] = self.fresh_name("acc")
    lanes = ", ".join(self.float_lanes(u.src[0]))
    self.emit(f"kiln_vec<{VALUE_TYPES[u.dtype.scalar]}, {u.dtype.count}> {name} = {{{{{lanes}}}}};")

  def _assign(self, u: UOp) -> None:
    target, value = u.src
    if target.dtype.count == 1: return super()._assign(u)
    if value.op is Ops.WGMMA and self.names[value] == self.names[target]: pass   # updated in place
    elif value.op in (Ops.WMMA, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.WGMMA):
      self.emit(f"{self.names[target]} = {self.names[value]};")
    else: self.emit(" ".join(f"{self.names[target]}.v[{k}] = {x};" for k, x in enumerate(self.float_lanes(value))))
    self.names[u] = self.names[target]

  def _wide_load(self, u: UOp) -> None:
    """A wide global load: one vector read where the buffer's base is aligned, else its lanes one by one."""
    buf, index = u.src[0], u.src[1]
    scalar, lanes = u.dtype.scalar, u.dtype.count
    self.note_dtype(scalar)
    vec, data, at = f"kiln_vec<{STORAGE_TYPES[scalar]}, {lanes}>", self.expr(buf), self.expr(index)
    one_by_one = ", ".join(f"{data}[{at}]" if k == 0 else f"{data}[({at})+{k}]" for k in range(lanes))
    name = self.names[u] = self.fresh_name("val")
    self.emit(f"const {vec} {name} = {self.aligned[buf, u.dtype.itemsize]} ? "
              f"*reinterpret_cast<const {vec}*>({data}+({at})) : {vec}{{{{{one_by_one}}}}};")

  def _wide_store(self, u: UOp) -> None:
    """A wide global store: one vector write where the buffer's base is aligned, else its lanes one by one."""
    buf, index, value = u.src[:3]
    scalar, lanes = value.dtype.scalar, value.dtype.count
    self.note_dtype(scalar)
    vec, data, at = f"kiln_vec<{STORAGE_TYPES[scalar]}, {lanes}>", self.expr(buf), self.expr(index)
    parts = [self.expr(lane) for lane in value.src]
    whole = value.src[0].src[0] if value.src[0].op is Ops.GEP else None
    if whole is not None and whole.dtype == value.dtype and \
       all(lane.op is Ops.GEP and lane.src[0] is whole and lane.arg == k for k, lane in enumerate(value.src)):
      packed = self.names[whole]   # a wide load's lanes in order: the loaded vector itself (a copy)
    else: packed = f"{vec}{{{{{', '.join(parts)}}}}}"
    one_by_one = " ".join(f"{data}[{at}] = {part};" if k == 0 else f"{data}[({at})+{k}] = {part};"
                          for k, part in enumerate(parts))
    line = (f"if ({self.aligned[buf, value.dtype.itemsize]}) *reinterpret_cast<{vec}*>({data}+({at})) = {packed}; "
            f"else {{ {one_by_one} }}")
    self.emit(f"if ({self.expr(u.src[3])}) {{ {line} }}" if len(u.src) == 4 else line)

  def _store(self, u: UOp) -> None:
    if u.src[2].dtype.count > 1: return self._wide_store(u)
    super()._store(u)

  def _load(self, u: UOp) -> None:
    buf = u.src[0]
    if u.dtype.count > 1: return self._wide_load(u)
    if u in self.fragment_loads:   # a WMMA fragment's element: its bits kept for the packed register
      self.note_dtype(u.dtype)
      read = f"{self.expr(buf)}[{self.expr(u.src[1])}]"
      if len(u.src) == 3 and u.src[2].op is not Ops.BARRIER:
        read = f"({self.expr(u.src[2])}?{read}:({STORAGE_TYPES[u.dtype]})0)"
      bits = self.raw_bits[u] = self.fresh_name("bits")
      self.emit(f"const {STORAGE_TYPES[u.dtype]} {bits} = {read};")
      self.names[u] = _FROM_BITS[u.dtype].format(bits)
      return
    if buf.op is Ops.DEFINE_LOCAL and len(buf.arg) > 2:   # written by other blocks in this launch: read through L2
      self.note_dtype(u.dtype)
      read = f"__ldcg(&{self.expr(buf)}[{self.expr(u.src[1])}])"
      if len(u.src) == 3: read = f"({self.expr(u.src[2])}?{read}:{STORAGE_TYPES[u.dtype]}(0))"
      name = self.names[u] = self.fresh_name("val")
      self.emit(f"const {STORAGE_TYPES[u.dtype]} {name} = {read};")
      return
    if len(u.src) == 3 and u.src[2].op is Ops.BARRIER:   # ordered after the barrier (a source), not gated
      plain = UOp(Ops.LOAD, u.dtype, u.src[:2])
      super()._load(plain)
      self.names[u] = self.names[plain]
    else: super()._load(u)

  def _range(self, u: UOp) -> None:
    before = len(self.lines)
    super()._range(u)
    # nvcc's spelling of the C renderer's short-loop unroll hint
    if len(self.lines) > before and self.lines[before].startswith("#pragma GCC unroll"):
      self.lines[before] = self.lines[before].replace("#pragma GCC unroll", "#pragma unroll")

  def value_text(self, u: UOp, args: list[str]) -> str:
    """The C renderer's expression, but a BITCAST through `kiln_bitcast` (no statement expression)."""
    if u.op is not Ops.BITCAST: return super().value_text(u, args)
    src, dst = u.src[0].dtype, u.dtype
    if dtypes.bool in (src, dst) or src.itemsize != dst.itemsize:
      raise TypeError(f"CUDARenderer: cannot BITCAST {src} to {dst} (sizes must match and bool is not allowed)")
    bits = f"({STORAGE_TYPES[src]})({_TO_BITS[src].format(args[0]) if src in _TO_BITS else args[0]})"
    out = f"kiln_bitcast<{STORAGE_TYPES[dst]}>({bits})"
    return _FROM_BITS[dst].format(out) if dst in _FROM_BITS else out

  renderer_name = "CUDARenderer"

  def write(self) -> str:
    """The whole CUDA source: prelude, device helpers, the kernel."""
    buffers, variables = self.walk_kernel()
    if self.vector_types: raise NotImplementedError(f"CUDARenderer: vector uops in kernel {self.name}")
    params = [f"{STORAGE_TYPES[b.dtype]}* __restrict__ data{b.arg}" for b in buffers]
    params += [f"const __grid_constant__ kiln_tensormap tmap{t.arg[0]}" for t in sorted(self.tensormaps,
                                                                                       key=lambda t: t.arg[0])]
    params += [f"int {self.var_names[v]}" for v in variables]
    head = ([HALF_HELPERS] if self.uses_half else []) + ([BF16_HELPERS] if self.uses_bf16 else [])
    if self.uses_fp8: head += [FP8_HELPERS] + [fp8_helpers(dt) for dt in dtypes.fp8s if dt in self.uses_fp8]
    head = [PRELUDE] + [device_helpers(block) for block in head] + self.device_arrays
    if self.tensormaps: head.append(TENSORMAP_TYPE)
    # setmaxnreg needs the register count at entry: one block an SM (ptxas then gives each thread its share)
    blocks = 1 if any(u.op is Ops.SETMAXNREG for u in self.uops) else min_blocks(self.uops)
    bounds = f"__launch_bounds__({self.block_threads}{f', {blocks}' if blocks else ''}) "
    # each widened buffer's base pointer tested once (uniform over the launch): the alignment rule's run-time half
    start = [f"  const bool {name} = (reinterpret_cast<unsigned long long>(data{buf.arg}) & {nbytes - 1}) == 0;"
             for (buf, nbytes), name in self.aligned.items()]
    end: list[str] = []
    if self.dependent_launch:
      (start if TRIGGER_AT_START else end).append(DEPENDENT_TRIGGER)
      start.append(f'  asm volatile("{DEPENDENT_WAIT};" ::: "memory");')
    return "\n".join(head + [f'extern "C" __global__ void {bounds}{self.name}({", ".join(params)}) {{',
                             *start, *self.lines, *end, "}", ""])

