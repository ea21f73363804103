"""The target description of an NVIDIA GPU: what the GPU heuristics and optimizer actions read (kiln/codegen/opt/
gpu_heuristic.py), as kiln/runtime/cpu_target.py describes a CPU for the CPU heuristics. The CUDA device makes one
from the GPU it opens (`for_device`); the defaults are the H200's (sm_90)."""
from __future__ import annotations
from dataclasses import dataclass

@dataclass(frozen=True)
class GPUTarget:
  """A GPU as the heuristics see it: threads a block (`local_max`), shared memory a block (`shared_max`, bytes,
  static arrays), `warp_size`, multiprocessors, the grid's limits, the widest access a thread makes (`vector_bytes`)
  and the tensor-core shapes (empty until issue 21)."""
  arch: str = "sm_90a"
  local_max: int = 1024
  shared_max: int = 48 << 10
  warp_size: int = 32
  multiprocessors: int = 132
  global_max: tuple[int, int, int] = (2 ** 31 - 1, 65535, 65535)
  vector_bytes: int = 16
  tensor_cores: tuple = ()
  has_local: bool = True

def for_device(arch: str, multiprocessors: int, local_max: int = 1024, warp_size: int = 32) -> GPUTarget:
  """The description of a GPU of `arch` with `multiprocessors` SMs (the rest are every NVIDIA GPU's since sm_20:
  1024 threads a block, warps of 32, 48 KiB of static shared memory a block)."""
  return GPUTarget(arch=arch, local_max=local_max, warp_size=warp_size, multiprocessors=multiprocessors)
