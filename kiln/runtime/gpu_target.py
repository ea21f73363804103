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
  static arrays), `warp_size`, multiprocessors, the grid's limits, the widest access a thread makes (`vector_bytes`)
  and the tensor-core instructions its arch has (`tensor_cores`)."""
  arch: str = "sm_90a"
  local_max: int = 1024
  shared_max: int = 48 << 10
  warp_size: int = 32
  multiprocessors: int = 132
  global_max: tuple[int, int, int] = (2 ** 31 - 1, 65535, 65535)
  vector_bytes: int = 16
  tensor_cores: tuple[TensorCore, ...] = TENSOR_CORES
  has_local: bool = True

def for_device(arch: str, multiprocessors: int, local_max: int = 1024, warp_size: int = 32) -> GPUTarget:
  """The description of a GPU of `arch` with `multiprocessors` SMs (the rest are every NVIDIA GPU's since sm_20:
  1024 threads a block, warps of 32, 48 KiB of static shared memory a block; tensor cores by arch)."""
  cores = tuple(tc for tc in TENSOR_CORES if _arch_number(arch) >= tc.min_arch)
  return GPUTarget(arch=arch, local_max=local_max, warp_size=warp_size, multiprocessors=multiprocessors,
                   tensor_cores=cores)
