"""The target description of an NVIDIA GPU: what the GPU heuristics and optimizer actions read (kiln/codegen/opt/
gpu_heuristic.py), as kiln/runtime/cpu_target.py describes a CPU for the CPU heuristics. The CUDA device makes one
from the GPU it opens (`for_device`); the defaults are the H200's (sm_90).

A `TensorCore` describes one warp-wide matrix instruction (`mma.sync`, sm_80+): its shape, its dtypes and which
elements of each operand every lane of the warp holds (the fragment layouts of the PTX ISA, "Matrix Fragments for
mma.m16n8k*"). `Ops.WMMA` (kiln/uop/ops.py) carries one as its arg."""
from __future__ import annotations
from dataclasses import dataclass
from functools import cached_property
from kiln.dtype import DType, dtypes

Layout = tuple[tuple[tuple[int, int], ...], ...]   # [lane][element] -> (row, column) of the operand's matrix

@dataclass(frozen=True)
class TensorCore:
  """`D = A @ B + C` for one warp: A is m x k, B k x n (both `dtype_in`), C and D m x n (`dtype_out`). Lane l holds
  elements `a_layout[l]` of A (as a `dtype_in.vec(len(a_layout[l]))`, element i at (row, k) `a_layout[l][i]`),
  `b_layout[l]` of B ((k, column) pairs) and `c_layout[l]` of C and D ((row, column) pairs). `instruction` is the
  PTX opcode; `min_arch` the first sm that has it. The layouts are those of `mma.sync.aligned.m16n8k*.row.col` with
  `elements` operand elements a 32-bit register (2 for 16-bit inputs, 1 for tf32, 4 for 8-bit)."""
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  instruction: str
  min_arch: int = 80

  @property
  def elements(self) -> int:
    """Operand elements in one 32-bit register."""
    return 4 // self.dtype_in.itemsize

  @cached_property
  def a_layout(self) -> Layout:
    """Lane l's elements of A, in register order: (row, k) pairs (PTX ISA, the A fragment of mma.m16n8k*)."""
    m, _, k = self.dims
    e = self.elements
    out = []
    for lane in range(32):
      group, tig = lane >> 2, lane % 4
      # registers: (rows 0-7, k 0..k/2), (rows 8-15, k 0..k/2), (rows 0-7, upper k), (rows 8-15, upper k)
      regs = [(group, 0), (group + 8, 0), (group, k // 2), (group + 8, k // 2)] if k > 4 * e else \
             [(group, 0), (group + 8, 0)]
      out.append(tuple((row, col + tig * e + i) for row, col in regs for i in range(e)))
    return tuple(out)

  @cached_property
  def b_layout(self) -> Layout:
    """Lane l's elements of B, in register order: (k, column) pairs."""
    _, _, k = self.dims
    e = self.elements
    halves = (0, k // 2) if k > 4 * e else (0,)
    return tuple(tuple((base + (lane % 4) * e + i, lane >> 2) for base in halves for i in range(e)) for lane in range(32))

  @cached_property
  def c_layout(self) -> Layout:
    """Lane l's elements of C and D, in register order: (row, column) pairs."""
    return tuple(tuple((row, (lane % 4) * 2 + i) for row in (lane >> 2, (lane >> 2) + 8) for i in range(2))
                 for lane in range(32))

  def __repr__(self) -> str: return f"TensorCore({self.instruction})"

def _mma(k: int, dtype_in: DType, ptx_in: str, min_arch: int = 80) -> TensorCore:
  return TensorCore((16, 8, k), dtype_in, dtypes.float32,
                    f"mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx_in}.{ptx_in}.f32", min_arch)

# the warp-wide instructions of sm_80+ (float32 accumulators); tf32 runs float32 inputs rounded to 10 mantissa bits
MMA_F16 = _mma(16, dtypes.float16, "f16")
MMA_BF16 = _mma(16, dtypes.bfloat16, "bf16")
MMA_TF32 = _mma(8, dtypes.float32, "tf32")
MMA_E4M3 = _mma(32, dtypes.fp8e4m3, "e4m3", 89)
MMA_E5M2 = _mma(32, dtypes.fp8e5m2, "e5m2", 89)
TENSOR_CORES = (MMA_F16, MMA_BF16, MMA_TF32, MMA_E4M3, MMA_E5M2)

def _arch_number(arch: str) -> int:
  digits = "".join(ch for ch in arch if ch.isdigit())
  return int(digits) if digits else 0

@dataclass(frozen=True)
class GPUTarget:
  """A GPU as the heuristics see it: threads a block (`local_max`), shared memory a block (`shared_max`, bytes,
  static arrays; `shared_optin`, the most a kernel may use as dynamic shared memory once the driver is asked:
  kiln/renderer/shared_memory.py), `warp_size`, multiprocessors, the grid's limits, the widest access a thread
  makes (`vector_bytes`) and the tensor-core instructions its arch has (`tensor_cores`)."""
  arch: str = "sm_90a"
  local_max: int = 1024
  shared_max: int = 48 << 10
  shared_optin: int = 227 << 10   # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (the H200's)
  warp_size: int = 32
  multiprocessors: int = 132
  global_max: tuple[int, int, int] = (2 ** 31 - 1, 65535, 65535)
  vector_bytes: int = 16
  tensor_cores: tuple[TensorCore, ...] = TENSOR_CORES
  has_local: bool = True

def for_device(arch: str, multiprocessors: int, local_max: int = 1024, warp_size: int = 32,
               shared_optin: int = 227 << 10) -> GPUTarget:
  """The description of a GPU of `arch` with `multiprocessors` SMs and `shared_optin` bytes of opt-in shared memory
  a block (the rest are every NVIDIA GPU's since sm_20: 1024 threads a block, warps of 32, 48 KiB of static shared
  memory a block; tensor cores by arch)."""
  cores = tuple(tc for tc in TENSOR_CORES if _arch_number(arch) >= tc.min_arch)
  return GPUTarget(arch=arch, local_max=local_max, warp_size=warp_size, multiprocessors=multiprocessors,
                   tensor_cores=cores, shared_optin=max(shared_optin, 48 << 10))

# ---------------- Hopper (sm_90a): warpgroup MMA, shared-memory matrix descriptors, TMA tensor maps ----------------

SWIZZLE_MODES = {0: 0, 128: 1, 64: 2, 32: 3}   # a layout's swizzle span in bytes -> the descriptor's mode field

def swizzle(address: int, span: int) -> int:
  """The byte address a swizzled shared-memory layout (and a TMA box with the same swizzle) puts logical byte
  `address` at: the 16-byte chunk bits 4-6 XORed with address bits 7-9, as many bits as the span has chunks beyond
  one 128-byte row's 8 (128B: 3 bits, 64B: 2, 32B: 1, none: 0). The pattern repeats every 8 x 128 bytes, so arrays
  and offsets must be aligned to `8 * span` bytes (1024 for 128B) for the emulator's address to be the GPU's."""
  bits = {0: 0, 32: 1, 64: 2, 128: 3}[span]
  return address ^ (((address >> 7) & ((1 << bits) - 1)) << 4)

@dataclass(frozen=True)
class SmemMatrix:
  """How a K-major operand tile of a wgmma lies in shared memory, as its 64-bit matrix descriptor says (PTX ISA,
  "Matrix Descriptor Format" and "Shared Memory Matrix Layout"): row r (of M for A, N for B), byte kb along K.
  With a swizzle span S (128, 64 or 32 bytes) a group of 8 rows is 8 rows of S bytes (row r%8 at (r%8)*S), groups
  `sbo` bytes apart; one instruction's K (32 bytes) lies inside a row, so `lbo` is unused. With none (0), the tile is
  8x16-byte core matrices of 8 rows of 16 bytes (128 bytes each): along K `lbo` bytes apart, along rows `sbo`."""
  swizzle: int = 128
  sbo: int = 1024
  lbo: int = 16

  def address(self, start: int, row: int, kb: int) -> int:
    """The byte address of row `row`, byte `kb` along K, of the tile the descriptor of address `start` names."""
    if self.swizzle == 0:
      return start + (row // 8) * self.sbo + (kb // 16) * self.lbo + (row % 8) * 16 + kb % 16
    return swizzle(start + (row // 8) * self.sbo + (row % 8) * self.swizzle + kb, self.swizzle)

  def descriptor(self, start: int) -> int:
    """The 64-bit descriptor of a tile at shared address `start`: address, lbo and sbo in 16-byte units in bits
    0-13, 16-29 and 32-45, base offset 0 (the tile aligned to its swizzle's repeat), the swizzle mode in bits 62-63."""
    return ((start >> 4) & 0x3FFF) | (((self.lbo >> 4) & 0x3FFF) << 16) | (((self.sbo >> 4) & 0x3FFF) << 32) | \
      (SWIZZLE_MODES[self.swizzle] << 62)

_WGMMA_K = {1: 32, 2: 16, 4: 8}   # K of one wgmma by input element size (fp8, 16-bit, tf32)
_PTX_TYPES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16", dtypes.float32: "tf32", dtypes.fp8e4m3: "e4m3",
              dtypes.fp8e5m2: "e5m2"}

@dataclass(frozen=True)
class WarpgroupMMA:
  """`D = A @ B^T + D` for one warpgroup (4 warps, 128 consecutive threads starting at a multiple of 128):
  `wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t}` with A (64 x k) and B (n x k) both K-major in shared
  memory as `a` and `b` say, D (64 x n float32) in registers: thread t holds `c_layout[t]` ((row, column) pairs,
  n/2 of them). n is 8..256 in steps of 8; k is 32 bytes of the input dtype (16 for float16/bfloat16, 8 for tf32,
  32 for fp8). `Ops.WGMMA` (kiln/uop/ops.py) carries one as its arg."""
  n: int
  dtype_in: DType
  a: SmemMatrix = SmemMatrix()
  b: SmemMatrix = SmemMatrix()
  dtype_out: DType = dtypes.float32
  min_arch: int = 90

  @property
  def dims(self) -> tuple[int, int, int]:
    """(m, n, k) of one instruction."""
    return (64, self.n, _WGMMA_K[self.dtype_in.itemsize])

  @property
  def instruction(self) -> str:
    """The PTX opcode."""
    t = _PTX_TYPES[self.dtype_in]
    return f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.dims[2]}.f32.{t}.{t}"

  @cached_property
  def c_layout(self) -> Layout:
    """Thread t's elements of D, in register order (PTX ISA, "WGMMA .m64nNk* register fragment layout for the
    accumulator matrix D"): warp w = t // 32 owns rows 16w..16w+15; lane l's registers 4j..4j+3 are rows
    16w + l//4 and 16w + l//4 + 8 of columns 8j + 2(l%4) + 0/1, for each 8-column block j."""
    out = []
    for t in range(128):
      w, lane = t // 32, t % 32
      row, col = 16 * w + lane // 4, 2 * (lane % 4)
      out.append(tuple((row + 8 * h, 8 * j + col + e) for j in range(self.n // 8) for h in range(2) for e in range(2)))
    return tuple(out)

  def __repr__(self) -> str:
    return f"WarpgroupMMA(n={self.n}, {self.dtype_in.name}, a={self.a!r}, b={self.b!r})"

@dataclass(frozen=True)
class TensorMap:
  """A 2-D TMA tensor map (what `cuTensorMapEncodeTiled` encodes): a row-major global matrix of `rows` x `cols`
  elements of `dtype` (rows `row_stride` elements apart; the buffer is the DEFINE_TENSORMAP's source), copied in
  boxes of `box` = (box_rows, box_cols) elements into shared memory, row after row (box_cols * itemsize bytes
  each), swizzled with `swizzle` (0, or 32, 64 or 128 bytes: then a box row is that many bytes). Elements of the box outside
  the matrix land as zeros."""
  dtype: DType
  rows: int
  cols: int
  box: tuple[int, int]
  swizzle: int = 128
  row_stride: int = 0

  @property
  def stride(self) -> int:
    """Elements between rows (the matrix's columns unless given)."""
    return self.row_stride or self.cols

  @property
  def box_bytes(self) -> int:
    """Bytes one copy writes (and completes on its mbarrier)."""
    return self.box[0] * self.box[1] * self.dtype.itemsize
