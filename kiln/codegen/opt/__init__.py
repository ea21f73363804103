"""The kernel optimizer: actions on a lowered kernel's loop axes (kernel.py) and heuristics that choose them
(heuristic.py). `optimize_kernel` is the entry point used between lowering and linearizing; NOOPT=1 turns it off."""
from __future__ import annotations
from kiln.helpers import NOOPT
from kiln.uop.ops import UOp
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError, substitute
from kiln.codegen.opt.heuristic import heuristic_opts

__all__ = ["Kernel", "Opt", "OptOps", "KernelOptError", "optimize_kernel", "heuristic_opts", "substitute"]

def optimize_kernel(sink: UOp, opts: list[Opt] | None = None) -> UOp:
  """A lowered kernel with `opts` applied in order (default: the heuristics' choice); unchanged when NOOPT=1."""
  if NOOPT: return sink
  kernel = Kernel(sink)
  if opts is None: heuristic_opts(kernel)
  else:
    for opt in opts: kernel.apply(opt)
  return kernel.sink
