"""Row kernels for the CUDA target (kiln/codegen/gpudims.py `group_rows`) without a GPU: rendered for CUDA and run in
the lockstep emulator (test/runtime/gpu_lockstep.py: real shared memory and barriers, out-of-bounds accesses and
racing stores raise), against NumPy. Many rows run `row_lanes` threads a row (by the row's length), several rows a
block (the last block's extra rows store nothing), short ones (32+ elements) too; few rows run one block a row sized
to the row."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor
from kiln.codegen import gpudims
from kiln.codegen.gpudims import launch_size
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.renderer.cuda import CUDARenderer
from kiln.uop.ops import Ops
from gpu_lockstep import run_lockstep   # noqa: E402  (test/runtime is on sys.path: pytest's default import mode)

def _emulate(out: Tensor) -> tuple[np.ndarray, list, object]:
  """`out` computed by its one kernel as rendered for CUDA, run in the lockstep emulator over a poisoned output
  (NaN: an element no thread writes fails the comparison); the output as the kernel wrote it, the uops, the launch."""
  renderer = CUDARenderer()
  (item,) = [item for item in out.schedule() if item.ast.op is not Ops.COPY]
  _, uops = render_with(renderer, kernel_name(item.ast), optimize_for(renderer, lower_for_codegen(item.ast)))
  arrays = {k: b.ensure_allocated().numpy() for k, b in enumerate(item.bufs)}
  arrays[0][:] = np.nan
  launch = launch_size(uops)
  run_lockstep(uops, launch, arrays, item.var_vals)
  return arrays[0].reshape(out.shape), uops, launch

def _data(rng, *shape): return rng.uniform(-1, 1, shape).astype(np.float32)

CASES = {   # name: (kiln function, NumPy function, input shapes)
  "row sums, last block part full": (lambda a: a.sum(-1), lambda a: a.sum(-1), [(100, 576)]),
  "matrix-vector rows, looped": (lambda a, x: (a * x).sum(-1), lambda a, x: (a * x).sum(-1), [(130, 1536), (1536,)]),
  "softmax rows": (lambda a: a.softmax(-1), lambda a: np.exp(a - a.max(-1, keepdims=True)) /
                   np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), [(72, 300)]),
  "layernorm rows": (lambda a: a.layernorm(), lambda a: (a - a.mean(-1, keepdims=True)) /
                     np.sqrt(a.var(-1, keepdims=True) + 1e-5), [(64, 1000)]),
  "many short rows (8 lanes a row)": (lambda a, x: (a * x).sum(-1), lambda a, x: (a * x).sum(-1), [(300, 64), (64,)]),
  "many 40-element rows, guarded lanes": (lambda a: a.max(-1), lambda a: a.max(-1), [(70, 40)]),
  "long rows, a block a row": (lambda a, x: (a * x).sum(-1), lambda a, x: (a * x).sum(-1), [(96, 3000), (3000,)]),
  "rms-normed matrix-vector rows (a sum no row depends on)": (
    lambda a, x: (a * x).sum(-1) * ((x * x).reshape(1, -1).expand(a.shape).sum(-1) / a.shape[1] + 1e-5).rsqrt(),
    lambda a, x: (a * x).sum(-1) / np.sqrt((x * x).mean() + 1e-5), [(96, 576), (576,)]),
  "rows that fill the GPU at a warp each": (lambda a: a.sum(-1), lambda a: a.sum(-1), [(8200, 576)]),
  "few rows, a block each": (lambda a: a.softmax(-1), lambda a: np.exp(a - a.max(-1, keepdims=True)) /
                             np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), [(9, 256)]),
}

@pytest.mark.parametrize("name", list(CASES))
def test_row_kernels_match_numpy(name):
  fn, ref, shapes = CASES[name]
  rng = np.random.default_rng(len(name))
  arrays = [_data(rng, *shape) for shape in shapes]
  got, _, launch = _emulate(fn(*[Tensor(a) for a in arrays]))
  want = ref(*[a.astype(np.float64) for a in arrays])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
  rows = shapes[0][0]
  (grid, _, _), (block, _, _) = launch
  if rows >= gpudims.MULTI_ROW_MIN:   # row_lanes threads a row, ROW_BLOCK_THREADS threads' rows a block
    lanes = gpudims.row_lanes(shapes[0][1], rows)
    per_block = max(1, gpudims.ROW_BLOCK_THREADS // lanes)
    assert (grid, block) == (-(-rows // per_block), per_block * lanes)
  else: assert (grid, block) == (rows, gpudims.row_group_size(shapes[0][1]))

def test_short_rows_stay_in_one_thread_when_few():
  a = _data(np.random.default_rng(2), 9, 64)
  got, uops, launch = _emulate(Tensor(a).sum(-1))
  np.testing.assert_allclose(got, a.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-6)
  assert not any(u.op is Ops.BARRIER for u in uops)

def test_one_row_a_block_when_turned_off(monkeypatch):
  monkeypatch.setattr(gpudims, "MULTI_ROW_MIN", 1 << 30)
  a = _data(np.random.default_rng(1), 100, 576)
  got, _, launch = _emulate(Tensor(a).sum(-1))
  np.testing.assert_allclose(got, a.astype(np.float64).sum(-1), rtol=1e-4, atol=1e-5)
  assert launch[0][0] == 100 and launch[1][0] == gpudims.row_group_size(576)
