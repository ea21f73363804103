"""Software prefetch of streamed loads (kiln/codegen/parallel.py `streamed_loads`, the C renderer's
`_prefetch_streams`): a matrix-vector product's thread-split row loop prefetches the rows PREFETCH_BYTES ahead of
each small-block stream it reads, and kernels that read large blocks or reuse their data (matmul, conv, reductions
over long rows, elementwise) get none. Prefetches change no result."""
from __future__ import annotations
import numpy as np
from kiln import Tensor, Device
from kiln.helpers import Context
from kiln.engine.realize import render_lowered
from kiln.codegen.opt import optimize_kernel
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.parallel import find_parallel_loop, streamed_loads
from kiln.renderer.cstyle import PREFETCH_BYTES
from kernel_runs import last_kernel_item

RNG = np.random.default_rng(11)

def _kernel(t: Tensor) -> tuple[str, list]:
  item = last_kernel_item(t)
  lowered = optimize_kernel(lower_kernel(item.ast), target=Device["CPU"].renderer.target)
  return render_lowered("CPU", "k", lowered)[0], linearize(lowered)

def test_a_matvec_row_loop_streams_its_rows_and_prefetches_them():
  rows, cols = 4096, 96   # 384-byte rows: small blocks, many of them
  w, x = RNG.standard_normal((rows, cols)).astype(np.float32), RNG.standard_normal(cols).astype(np.float32)
  t = (Tensor(w) * Tensor(x)).sum(-1)
  source, uops = _kernel(t)
  loop = find_parallel_loop(uops).loop
  streams = streamed_loads(uops, loop)
  assert [(st.stride, st.low, st.high) for st in streams] == [(cols, 0, cols - 1)]
  ahead = -(-PREFETCH_BYTES // (cols * 4))
  lines = [line for line in source.splitlines() if "__builtin_prefetch" in line]
  assert len(lines) == cols * 4 // 64 and all(f"+ {ahead})" in line for line in lines), lines
  with Context(CACHELEVEL=0): got = (Tensor(w) * Tensor(x)).sum(-1).numpy()
  np.testing.assert_allclose(got, w.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)

def test_kernels_without_small_streams_get_no_prefetch():
  a, b = (Tensor(RNG.standard_normal((512, 512)).astype(np.float32)) for _ in range(2))
  x = Tensor(RNG.standard_normal((4, 16, 24, 24)).astype(np.float32))
  k = Tensor(RNG.standard_normal((16, 16, 3, 3)).astype(np.float32))
  long_rows = Tensor(RNG.standard_normal((512, 2048)).astype(np.float32))
  for t in (a @ b, x.conv2d(k, padding=1), long_rows.softmax(-1), long_rows * 2 + 1, long_rows.sum(-1)):
    assert "__builtin_prefetch" not in _kernel(t)[0]
