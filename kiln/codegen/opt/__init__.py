"""The kernel optimizer: actions on a lowered kernel's loop axes (kernel.py) and heuristics that choose them
(heuristic.py). `optimize_kernel` is the entry point used between lowering and linearizing; NOOPT=1 turns it off."""
from __future__ import annotations
from typing import Any
from kiln.helpers import NOOPT, prod
from kiln.uop.ops import UOp
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError, substitute
from kiln.codegen.opt.heuristic import heuristic_opts, block_long_sums

__all__ = ["Kernel", "Opt", "OptOps", "KernelOptError", "optimize_kernel", "heuristic_opts", "block_long_sums",
           "substitute"]

# below this many loop iterations a kernel runs in microseconds either way: the heuristics would only add compile time
MIN_OPTIMIZED_WORK = 1024

def optimize_kernel(sink: UOp, opts: list[Opt] | None = None, target: Any = None) -> UOp:
  """A lowered kernel with `opts` applied in order (default: the heuristics' choice for `target`, the device's
  renderer.target, for kernels that do at least MIN_OPTIMIZED_WORK loop iterations); with NOOPT=1 only long float
  sums are blocked (block_long_sums)."""
  kernel = Kernel(sink)
  if NOOPT:   # accuracy is not an optimization: long float sums are blocked even so
    block_long_sums(kernel)
    return kernel.sink
  if opts is None:
    work = prod(Kernel.size(rng) or MIN_OPTIMIZED_WORK for rng in kernel.axes)   # a symbolic size counts as large
    if work >= MIN_OPTIMIZED_WORK: heuristic_opts(kernel, target)
    block_long_sums(kernel)
  else:
    for opt in opts: kernel.apply(opt)
  return kernel.sink
