"""The thread split of a loop whose iterations own periodic blocks of a buffer (kiln/codegen/parallel.py
`_periodic_blocks_are_disjoint`): a packed matmul's units of tile columns, whose blocked sum reads its own partial
results back, split across threads and match NumPy; a read of another iteration's block refuses the split."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, Context, dtypes
from kiln.uop.ops import UOp, Ops
from kiln.schedule.kernelize import create_schedule
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.opt import Kernel, OptOps, heuristic_opts
from kiln.codegen.parallel import find_parallel_loop
from kiln.runtime.cpu_target import CPUTarget

AVX512_XEON = CPUTarget("x86_64", "avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20, 2)

def _const(value: int) -> UOp: return UOp.const(dtypes.int32, value)

def _periodic_kernel(read_offset: int | None) -> list[UOp]:
  """for r < 4: for j < 4: for c < 8: out[8r + c + 32j] = 1 (+ out[8r + c + 32j + read_offset] when given)."""
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  r, j, c = (UOp(Ops.RANGE, dtypes.int32, (_const(n),), arg=i) for i, n in enumerate((4, 4, 8)))
  index = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (UOp(Ops.MUL, dtypes.int32, (r, _const(8))), c)),
                                      UOp(Ops.MUL, dtypes.int32, (j, _const(32)))))
  value, body = UOp.const(dtypes.float32, 1.0), []
  if read_offset is not None:
    read = UOp(Ops.ADD, dtypes.int32, (index, _const(read_offset))) if read_offset else index
    load = UOp(Ops.LOAD, dtypes.float32, (out, read))
    value = UOp(Ops.ADD, dtypes.float32, (load, value))
    body = [read, load] if read_offset else [load]
  store = UOp(Ops.STORE, dtypes.void, (out, index, value))
  nodes = [out, r, j, c, *index.src[0].src[0].src, index.src[0].src[0], index.src[0], index.src[1], index, *body]
  uniq = list(dict.fromkeys(n for n in nodes if n.op is not Ops.CONST))
  return uniq + ([value] if read_offset is not None else []) + \
    [store, UOp(Ops.ENDRANGE, dtypes.void, (c,)), UOp(Ops.ENDRANGE, dtypes.void, (j,)), UOp(Ops.ENDRANGE, dtypes.void, (r,))]

@pytest.mark.parametrize("read_offset, split", [(None, True), (0, True), (8, False), (-32, True), (1, False)])
def test_periodic_blocks_with_reads_of_the_written_buffer(read_offset, split):
  """Stores alone, or reads of the iteration's own block (also a whole period away), split; a read of the next
  iteration's columns (8) or one column over (1) does not."""
  uops = _periodic_kernel(read_offset)
  loop = find_parallel_loop(uops)
  assert (loop is not None) == split, f"read offset {read_offset}: {loop}"
  if split: assert loop.loop.arg == 0 and loop.loop.src[0].arg == 4

def test_packed_matmul_column_units_split_across_threads_and_match_numpy():
  """The packed 1024 matmul's kernel (units of tile columns, the sum blocked) is split on its unit loop, and on two
  threads gives NumPy's product."""
  rng = np.random.default_rng(5)
  a_np, b_np = rng.standard_normal((1024, 1024), dtype=np.float32), rng.standard_normal((1024, 1024), dtype=np.float32)
  kernel = Kernel(lower_kernel(create_schedule([(Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024)).uop]).items[-1].ast))
  applied = heuristic_opts(kernel, AVX512_XEON)
  assert [o.op for o in applied][2:4] == [OptOps.SWAP, OptOps.SPLIT], applied
  loop = find_parallel_loop(linearize(kernel.sink))
  assert loop is not None and Kernel.size(loop.loop) == 4, "the unit loop is not split across threads"
  with Context(THREADS=2): got = (Tensor(a_np) @ Tensor(b_np)).numpy()
  assert np.abs(got - a_np @ b_np).max() <= 1e-3 * 32, f"worst difference {np.abs(got - a_np @ b_np).max()}"
