"""Warp shuffles (Ops.SHUFFLE, docs/ir.md stage 4) in the GPU row and grid reductions (kiln/codegen/gpudims.py)
without a GPU: the spec admits them only in GPU-shaped kernels, the CPU renderers refuse them, and row sums, maxes,
softmax and layernorm of several sizes (rows that are no multiple of 32; blocks of 32, 64 and 256 threads; several
rows a block) and a grid reduction, rendered for CUDA, run in the lockstep emulator (test/runtime/gpu_lockstep.py:
every lane of a block at once) and match NumPy, with and without shuffles; the PYTHON device as a GPU target runs
them too, each block's threads in lockstep (kiln/renderer/python.py `_lockstep`), and matches NumPy and the CPU."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.codegen import gpudims
from kiln.codegen.gpudims import launch_size
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.helpers import Context
from kiln.renderer.cstyle import CRenderer
from kiln.renderer.llvmir import LLVMRenderer
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.renderer.python import PythonRenderer
from kiln.uop.ops import UOp, Ops
from kiln.uop.spec import SpecError, check_linear, check_lowered
from gpu_lockstep import LockstepError, run_lockstep   # noqa: E402  (test/runtime is on sys.path)

INT = dtypes.int32

def _emulate(out: Tensor, shuffles: int = 1) -> tuple[np.ndarray, list[UOp], object]:
  """`out`'s one kernel rendered for CUDA (WARP_SHUFFLE=`shuffles`), run in the lockstep emulator over a
  NaN-poisoned output; (the output, the uops, the launch sizes)."""
  renderer = CUDARenderer()
  (item,) = [item for item in out.schedule() if item.ast.op is not Ops.COPY]
  with Context(WARP_SHUFFLE=shuffles):
    _, uops = render_with(renderer, kernel_name(item.ast), optimize_for(renderer, lower_for_codegen(item.ast)))
  arrays = {k: b.ensure_allocated().numpy().copy() for k, b in enumerate(item.bufs)}
  if dtypes.is_float(item.bufs[0].dtype): arrays[0][:] = np.nan
  launch = launch_size(uops)
  run_lockstep(uops, launch, arrays, item.var_vals)
  return arrays[0].reshape(out.shape), uops, launch

def _softmax(a): return np.exp(a - a.max(-1, keepdims=True)) / np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)
def _layernorm(a): return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)

CASES = {   # name: (kiln function, NumPy function, input shape, threads a block)
  "sum, a warp a row (block of 32)": (lambda t: t.sum(-1), lambda a: a.sum(-1), (9, 200), 32),
  "max, a warp a row, 8 elements a lane": (lambda t: t.max(-1), lambda a: a.max(-1), (9, 256), 32),
  "softmax, block of 64": (lambda t: t.softmax(-1), _softmax, (5, 500), 64),
  "layernorm, block of 256": (lambda t: t.layernorm(), _layernorm, (3, 3001), 256),
  "softmax, block of 256, looped": (lambda t: t.softmax(-1), _softmax, (2, 8195), 256),
  "sum, 64 lanes a row, 4 rows a block": (lambda t: t.sum(-1), lambda a: a.sum(-1), (70, 700), 256),
  "max, 8 lanes a row, 32 rows a block": (lambda t: t.max(-1), lambda a: a.max(-1), (100, 100), 256),
  "layernorm, 16 lanes a row": (lambda t: t.layernorm(), _layernorm, (65, 200), 256),
  "softmax, a warp a row, many rows": (lambda t: t.softmax(-1), _softmax, (8200, 33), 256),
}

@pytest.mark.parametrize("name", list(CASES))
def test_row_kernels_with_shuffles_match_numpy(name):
  fn, ref, shape, threads = CASES[name]
  a = np.random.default_rng(len(name)).uniform(-3, 3, shape).astype(np.float32)
  got, uops, launch = _emulate(fn(Tensor(a)))
  np.testing.assert_allclose(got, ref(a.astype(np.float64)), rtol=1e-4, atol=1e-5, err_msg=name)
  assert launch[1][0] == threads, launch
  assert any(u.op is Ops.SHUFFLE for u in uops), f"{name}: no shuffle"
  barriers = sum(u.op is Ops.BARRIER for u in uops)
  lanes = threads if shape[0] < gpudims.MULTI_ROW_MIN else gpudims.row_lanes(shape[-1], shape[0])
  if lanes <= 32:   # a row in one warp: no shared memory, no barrier
    assert barriers == 0 and not any(u.op is Ops.DEFINE_LOCAL for u in uops), name
  else:   # one barrier a combine (softmax and layernorm combine twice: the max or mean first)
    assert 1 <= barriers <= 2, f"{name}: {barriers} barriers"
  plain, plain_uops, _ = _emulate(fn(Tensor(a)), shuffles=0)
  assert not any(u.op is Ops.SHUFFLE for u in plain_uops)
  # another tree of the same depth: a max is exact either way; a float sum's rounding stays within the bound of a
  # blocked sum (TERMS_PER_LEVEL ulps of the sum of magnitudes); softmax and layernorm are normalized
  if name.startswith("max"): np.testing.assert_array_equal(got, plain, err_msg=name)
  else:
    bound = gpudims.TERMS_PER_LEVEL * np.finfo(np.float32).eps * np.abs(a).sum(-1).max() if name.startswith("sum") \
      else 1e-6
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=bound, err_msg=f"{name}: shuffles against shared memory")

def test_integer_sums_are_exact():
  a = np.random.default_rng(0).integers(-1000, 1000, (70, 999)).astype(np.int32)
  got, uops, _ = _emulate(Tensor(a).sum(-1))
  assert any(u.op is Ops.SHUFFLE for u in uops)
  np.testing.assert_array_equal(got, a.sum(-1))
  b = np.random.default_rng(1).integers(-(1 << 40), 1 << 40, (5, 3000)).astype(np.int64)
  got, uops, _ = _emulate(Tensor(b).sum(-1))   # 64-bit values: two 32-bit shuffles each on the GPU
  assert any(u.op is Ops.SHUFFLE and u.dtype == dtypes.int64 for u in uops)
  np.testing.assert_array_equal(got, b.sum(-1))

def test_every_lane_of_a_row_gets_the_same_bits():
  # a max of zeros of both signs is +0 or -0 by the tree's order; every lane of the row divides by the max it got,
  # so a lane that combined in another order gives -inf where the others give +inf
  rng = np.random.default_rng(2)
  a = np.where(rng.random((9, 256)) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
  t = Tensor(a)
  got, uops, launch = _emulate((t * 0 + 1) / t.max(-1, keepdim=True))
  assert launch[1][0] == 32 and any(u.op is Ops.SHUFFLE for u in uops)
  assert np.isinf(got).all()
  for row in got: assert len(set(np.signbit(row))) == 1, row

def test_grid_reduction_with_shuffles(monkeypatch):
  monkeypatch.setattr(gpudims, "MIN_GRID_REDUCED", 1 << 14)
  monkeypatch.setattr(gpudims, "GRID_BLOCKS", 512)   # (a multiple of the block's 256 threads)
  a = np.random.default_rng(3).uniform(-1, 1, 300007).astype(np.float32)
  got, uops, launch = _emulate(Tensor(a).sum())
  assert launch == ((512, 1, 1), (256, 1, 1)) and any(u.op is Ops.ATOMIC for u in uops)
  assert sum(u.op is Ops.SHUFFLE for u in uops) == 2 * (5 + 3), "two combines of 5 in-warp and 3 cross-warp rounds"
  np.testing.assert_allclose(got, a.astype(np.float64).sum(), rtol=1e-5)
  b = np.random.default_rng(4).integers(-50, 50, 200001).astype(np.int32)
  got, _, _ = _emulate(Tensor(b).max())
  assert got == b.max()

def test_chosen_blocks_below_a_warp_keep_shared_memory():
  # GROUP by 16 without rows a block: a block of 16 threads is no whole warp, so its rounds go through shared memory
  from kiln.codegen.opt.kernel import Kernel, Opt, OptOps
  from kiln.codegen.opt.gpu_heuristic import GPUTarget
  a = np.random.default_rng(5).uniform(-1, 1, (6, 300)).astype(np.float32)
  out = Tensor(a).sum(-1)
  (item,) = [item for item in out.schedule() if item.ast.op is not Ops.COPY]
  kernel = Kernel(lower_for_codegen(item.ast), GPUTarget())
  kernel.apply(Opt(OptOps.GROUP, 1, 16))
  _, uops = render_with(CUDARenderer(), kernel_name(item.ast), kernel.sink)
  assert launch_size(uops)[1][0] == 16
  assert not any(u.op is Ops.SHUFFLE for u in uops) and any(u.op is Ops.BARRIER for u in uops)
  arrays = {k: b.ensure_allocated().numpy().copy() for k, b in enumerate(item.bufs)}
  run_lockstep(uops, launch_size(uops), arrays, item.var_vals)
  np.testing.assert_allclose(arrays[0], a.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-6)

def test_warp_size_comes_from_the_target():
  class Target16:   # a target with 16-lane warps: the in-warp rounds are 8, 4, 2, 1
    warp_size, multiprocessors = 16, 132
  a = np.random.default_rng(6).uniform(-1, 1, (9, 200)).astype(np.float32)
  (item,) = [item for item in Tensor(a).sum(-1).schedule() if item.ast.op is not Ops.COPY]
  mapped = gpudims.map_axes_to_gpu(optimize_for(CUDARenderer(), lower_for_codegen(item.ast)), Target16())
  offsets = sorted({u.arg for u in mapped.toposort() if u.op is Ops.SHUFFLE})
  assert offsets == [(1, 16), (2, 16), (4, 16), (8, 16)], offsets
  assert gpudims.shuffle_warp(Target16()) == 16 and gpudims.shuffle_warp(None) == gpudims.WARP_SIZE
  with Context(WARP_SHUFFLE=0): assert gpudims.shuffle_warp(Target16()) == 0

# ---------------- the spec, the renderers that refuse ----------------

def _kernel(block: int, arg=(16, 32), dtype=dtypes.float32, lidx: bool = True) -> UOp:
  """SINK(STORE(out, lidx0, SHUFFLE(in[lidx0]))) in a block of `block` threads."""
  thread = UOp(Ops.SPECIAL, INT, (), ("lidx0", block)) if lidx else UOp.const(INT, 0)
  src, out = UOp(Ops.DEFINE_GLOBAL, dtype, (), 1), UOp(Ops.DEFINE_GLOBAL, dtype, (), 0)
  value = UOp(Ops.LOAD, dtype, (src, thread))
  return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, thread, UOp(Ops.SHUFFLE, dtype, (value,), arg))),))

def _linear(sink: UOp) -> list[UOp]:
  return [u for u in sink.toposort() if u.op is not Ops.SINK] + [sink]

def test_spec_admits_shuffles_only_in_gpu_shaped_kernels():
  for ok in (_kernel(256), _kernel(32, (1, 32)), _kernel(64, (8, 32), dtypes.float64), _kernel(32, (4, 32), dtypes.bool)):
    check_lowered(ok)
    check_linear([u for u in _linear(ok) if u.op is not Ops.SINK])
  refused = {
    "no lidx0": _kernel(1, lidx=False), "a partial warp": _kernel(48), "a block below a warp": _kernel(16, (8, 32)),
    "offset not a power of two": _kernel(64, (3, 32)), "offset of a whole warp": _kernel(64, (32, 32)),
    "no warp size": _kernel(64, 16), "a warp size not a power of two": _kernel(48, (8, 24)),
  }
  for why, sink in refused.items():
    with pytest.raises(SpecError, match="SHUFFLE"): check_lowered(sink)
    with pytest.raises(SpecError, match="SHUFFLE"):
      check_linear([u for u in _linear(sink) if u.op is not Ops.SINK])

def test_cpu_renderers_refuse_shuffles():
  cpu_uops = [u for u in _linear(_kernel(1, lidx=False)) if u.op is not Ops.SINK]
  for renderer in (CRenderer(), LLVMRenderer()):
    with pytest.raises(NotImplementedError, match="SHUFFLE"): renderer.render("k", cpu_uops)
  assert "yield (16, " in PythonRenderer().render("k", [u for u in _linear(_kernel(64)) if u.op is not Ops.SINK])
  uops = [u for u in _linear(_kernel(64)) if u.op is not Ops.SINK]
  for renderer in (CUDARenderer(), PTXRenderer()):
    assert "shfl" in renderer.render("k", uops)
    with pytest.raises(NotImplementedError, match="32 lanes"):
      renderer.render("k", [u for u in _linear(_kernel(64, (8, 16))) if u.op is not Ops.SINK])

def test_lockstep_emulator_refuses_a_partner_outside_the_block():
  uops = [u for u in _linear(_kernel(48)) if u.op is not Ops.SINK]
  arrays = {0: np.zeros(48, np.float32), 1: np.arange(48, dtype=np.float32)}
  with pytest.raises(LockstepError, match="SHUFFLE"): run_lockstep(uops, ((1, 1, 1), (48, 1, 1)), arrays)
  uops = [u for u in _linear(_kernel(64)) if u.op is not Ops.SINK]
  arrays = {0: np.zeros(64, np.float32), 1: np.arange(64, dtype=np.float32)}
  run_lockstep(uops, ((1, 1, 1), (64, 1, 1)), arrays)
  np.testing.assert_array_equal(arrays[0], np.arange(64) ^ 16)

def test_every_partial_comes_before_the_first_shuffle():
  # two dot products of one row combined together (as a decode step's gate and up projections): the second's loads
  # come before the first's shuffles (a shuffle between them held the loads back), and the rounds go together
  rng = np.random.default_rng(7)
  a, b, x = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((70, 576), (70, 576), (576,)))
  ta, tb, tx = Tensor(a), Tensor(b), Tensor(x)
  got, uops, _ = _emulate((ta * tx).sum(-1) * (tb * tx).sum(-1))
  np.testing.assert_allclose(got, (a @ x).astype(np.float64) * (b @ x), rtol=1e-4, atol=1e-5)
  shuffles = [i for i, u in enumerate(uops) if u.op is Ops.SHUFFLE]
  global_loads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL]
  assert shuffles and max(global_loads) < shuffles[0], "a partial's load after a shuffle"
  offsets = [uops[i].arg[0] for i in shuffles]
  assert offsets[:2] == [offsets[0]] * 2 and offsets[2:4] == [offsets[2]] * 2, f"rounds not together: {offsets}"

# ---------------- the PYTHON device as a GPU target: a block's threads in lockstep ----------------

PYTHON_CASES = {   # name: (kiln function, NumPy function, input shape)
  "sum, a warp a row": (lambda t: t.sum(-1), lambda a: a.sum(-1), (3, 200)),
  "max, 8 lanes a row, many rows": (lambda t: t.max(-1), lambda a: a.max(-1), (70, 100)),
  "softmax, block of 64": (lambda t: t.softmax(-1), _softmax, (2, 500)),
  "layernorm, block of 256 (8 warps, one barrier)": (lambda t: t.layernorm(), _layernorm, (2, 2100)),
}

@pytest.mark.parametrize("name", list(PYTHON_CASES))
@pytest.mark.parametrize("shuffles", [1, 0])
def test_python_device_runs_gpu_style_row_kernels_in_lockstep(name, shuffles, monkeypatch):
  from helpers import kernel_sources, use_gpu_style_python
  device = use_gpu_style_python(monkeypatch)
  fn, ref, shape = PYTHON_CASES[name]
  a = np.random.default_rng(len(name)).uniform(-3, 3, shape).astype(np.float32)
  with Context(WARP_SHUFFLE=shuffles):
    sources = kernel_sources(lambda: fn(Tensor(a, device=device)))
    got = fn(Tensor(a, device=device)).numpy()
  assert any("_lockstep([_thread(lidx0) for lidx0 in range(" in src for src in sources), sources
  assert any("= yield (" in src for src in sources) == bool(shuffles), sources
  np.testing.assert_allclose(got, ref(a.astype(np.float64)), rtol=1e-4, atol=1e-5, err_msg=name)
  np.testing.assert_allclose(got, fn(Tensor(a)).numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{name}: against the CPU")

def test_python_device_runs_a_grid_reduction_twice(monkeypatch):
  # the last block's ticket (ATOMIC) and the partials live in device arrays kept between launches: the counter the
  # first launch resets must serve the second
  from helpers import use_gpu_style_python
  device = use_gpu_style_python(monkeypatch)
  monkeypatch.setattr(gpudims, "MIN_GRID_REDUCED", 1 << 12)
  monkeypatch.setattr(gpudims, "GRID_BLOCKS", 256)
  a = np.random.default_rng(8).uniform(-1, 1, 70001).astype(np.float32)
  t = Tensor(a, device=device)
  first, second = t.sum().item(), (t * 1).sum().item()
  assert abs(first - a.astype(np.float64).sum()) < 1e-3 and first == second
  from helpers import DropLaunch
  assert ((256, 1, 1), (256, 1, 1)) in DropLaunch.launches

def test_python_lockstep_raises_where_threads_part():
  from kiln.renderer.python import _lockstep
  def thread(i):
    if i: yield None   # only thread 1 waits at a barrier
  with pytest.raises(RuntimeError, match="different barriers"): _lockstep([thread(0), thread(1)])
  def shuffler(i):
    got = yield (1, i * 10)
    assert got == (i ^ 1) * 10
  _lockstep([shuffler(i) for i in range(4)])

def test_python_device_runs_shared_memory_matmul_tiles(monkeypatch):
  # kiln/codegen/gpu_tiles.py's tiles: shared arrays and a barrier in every step of the K loop, in lockstep
  from helpers import kernel_sources, use_gpu_style_python
  device = use_gpu_style_python(monkeypatch)
  rng = np.random.default_rng(9)
  a, b = rng.uniform(-1, 1, (64, 64)).astype(np.float32), rng.uniform(-1, 1, (64, 64)).astype(np.float32)
  sources = kernel_sources(lambda: Tensor(a, device=device) @ Tensor(b, device=device))
  assert any("_lockstep(" in src and "yield None" in src for src in sources), sources
  got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
  np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
