"""The GPU optimizer actions (kiln/codegen/opt/kernel.py LOCAL, GROUP, GROUPTOP, UPCAST on a GPU target), the GPU
heuristics that choose them (kiln/codegen/opt/gpu_heuristic.py) and BEAM over them, without a GPU: refusals leave the
kernel as it was; kernels built from the actions are rendered for CUDA and run in the lockstep emulator
(test/runtime/gpu_lockstep.py: real shared memory and barriers, out-of-bounds accesses and racing stores raise)
against NumPy; the heuristics' actions give the kernels the axis mapping made without them; rendered kernels build
for sm_90a without spills where nvcc is installed. The GPU tests at the end run on the device (DEV=CUDA)."""
from __future__ import annotations
import concurrent.futures, re, shutil, tempfile
import numpy as np
import pytest
from kiln import Tensor
from kiln.codegen import gpudims
from kiln.codegen.gpudims import launch_size
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError, gpu_choices
from kiln.codegen.opt.gpu_heuristic import GPUTarget, gpu_heuristic_opts, gpu_optimize, gpu_opts
from kiln.codegen.opt.search import beam_search
from kiln.renderer.cuda import CUDARenderer
from kiln.uop.ops import Ops
try: from kiln.codegen.pipeline import render_with, lower_for_codegen   # (the pipeline's new home)
except ImportError: from kiln.engine.realize import render_with, lower_for_codegen
from kiln.engine.realize import kernel_name
from gpu_lockstep import run_lockstep   # noqa: E402  (test/runtime is on sys.path: pytest's default import mode)

GPU = GPUTarget()

def _item(out: Tensor):
  (item,) = [item for item in out.schedule() if item.ast.op is not Ops.COPY]
  return item

def _lowered(out: Tensor):
  """(the lowered kernel, its schedule item) of `out`'s one kernel."""
  item = _item(out)
  return lower_for_codegen(item.ast), item

def _emulate(sink, item) -> tuple[np.ndarray, list, object]:
  """The optimized kernel `sink` rendered for CUDA and run in the lockstep emulator over a NaN-poisoned output (an
  element no thread writes fails the comparison); the output, the uops, the launch sizes."""
  _, uops = render_with(CUDARenderer(), kernel_name(item.ast), sink)
  arrays = {k: b.ensure_allocated().numpy().copy() for k, b in enumerate(item.bufs)}
  arrays[0][:] = np.nan
  launch = launch_size(uops)
  run_lockstep(uops, launch, arrays, item.var_vals)
  return arrays[0], uops, launch

def _data(rng, *shape): return rng.uniform(-1, 1, shape).astype(np.float32)

def _with(sink, *opts) -> Kernel:
  kernel = Kernel(sink, GPU)
  for opt in opts: kernel.apply(opt)
  return kernel

# ---------------- refusals ----------------

def _refused(kernel: Kernel, opt: Opt, match: str) -> None:
  before, applied = kernel.sink, list(kernel.applied)
  with pytest.raises(KernelOptError, match=match): kernel.apply(opt)
  assert kernel.sink is before and kernel.applied == applied, f"{opt} changed the kernel it refused"

def test_gpu_actions_are_refused_where_they_do_not_fit():
  rng = np.random.default_rng(0)
  elementwise, _ = _lowered(Tensor(_data(rng, 64, 48)) * 2 + 1)
  rows, _ = _lowered(Tensor(_data(rng, 16, 300)).sum(axis=1))
  full, _ = _lowered(Tensor(_data(rng, 5000)).sum())
  matvec_columns, _ = _lowered(Tensor(_data(rng, 40, 16)).sum(axis=0))   # 40-element columns: one thread each
  _refused(Kernel(elementwise), Opt(OptOps.LOCAL, 0, 16), "needs a GPU target")
  _refused(Kernel(rows), Opt(OptOps.GROUP, 1, 32), "needs a GPU target")
  k = Kernel(elementwise, GPU)
  _refused(k, Opt(OptOps.LOCAL, 1, 40), "more than a quarter")   # 48 -> 80 (a 5 would pad 48 to 50: accepted)
  _refused(k, Opt(OptOps.LOCAL, 1, 1), "integer >= 2")
  _refused(k, Opt(OptOps.LOCAL, 5, 2), "has 2 axes")
  _refused(k, Opt(OptOps.GROUP, 0, 4), "output axis")
  _refused(k, Opt(OptOps.UPCAST, 1, 64), "more than the 48 iterations")
  k.apply(Opt(OptOps.LOCAL, 1, 16)).apply(Opt(OptOps.LOCAL, 0, 64))   # 1024 threads: the most a block has
  _refused(k, Opt(OptOps.LOCAL, 1, 3), "more than 1024 threads")
  _refused(k, Opt(OptOps.UNROLL, 1, 2), "come before them")   # graph rewrites come before GPU actions
  k.apply(Opt(OptOps.UPCAST, 1, 3))   # the 3 of axis 1's 48 = 16*3 left by the LOCAL
  _refused(k, Opt(OptOps.UPCAST, 1, 2), "more than the 1 iterations")
  r = Kernel(rows, GPU)
  _refused(r, Opt(OptOps.GROUP, 1, 24), "power of two")
  _refused(r, Opt(OptOps.GROUP, 1, 2048), "more than 1024 threads")
  _refused(r, Opt(OptOps.GROUP, 1, 512), "512 threads for a reduction of 300")
  _refused(r, Opt(OptOps.LOCAL, 1, 2), "reduce axis")
  _refused(Kernel(rows, GPU).apply(Opt(OptOps.UPCAST, 0, 2)), Opt(OptOps.GROUP, 1, 32), "only LOCALs of row axes")
  _refused(Kernel(rows, GPU).apply(Opt(OptOps.LOCAL, 0, 2)), Opt(OptOps.GROUP, 1, 1024), "at most 1024 threads")
  r.apply(Opt(OptOps.GROUP, 1, 64))
  _refused(r, Opt(OptOps.UPCAST, 0, 2), "keep their elements")
  _refused(r, Opt(OptOps.GROUP, 1, 128), "only a full reduction")   # rows: no grid
  _refused(r, Opt(OptOps.LOCAL, 0, 3), "power of two")
  _refused(r, Opt(OptOps.LOCAL, 0, 32), "at most 16 rows")
  f = Kernel(full, GPU).apply(Opt(OptOps.GROUP, 0, 64))
  _refused(f, Opt(OptOps.GROUP, 0, 32), "multiple of the block.s 64 threads")
  _refused(f, Opt(OptOps.GROUP, 0, 128), "at least one element a thread")   # 64 x 128 > 5000
  _refused(f, Opt(OptOps.GROUPTOP, 0, 64), "with GROUP")
  f.apply(Opt(OptOps.GROUP, 0, 64))
  _refused(f, Opt(OptOps.GROUP, 0, 64), "threads and blocks already")
  _refused(Kernel(matvec_columns, GPU), Opt(OptOps.GROUP, 1, 8), "not a row kernel")

def test_a_loop_that_must_stay_serial_refuses_local_and_upcast():
  rng = np.random.default_rng(1)
  softmax, _ = _lowered(Tensor(_data(rng, 8, 300)).softmax(-1))
  k = Kernel(softmax, GPU)
  # softmax's elementwise axis: its row's max and sum do not depend on it, so it stays a loop in each thread
  elementwise_axis = next(i for i, r in enumerate(k.output_axes) if r not in gpudims.mappable_ranges(softmax))
  _refused(k, Opt(OptOps.LOCAL, elementwise_axis, 4), "stays a loop")
  _refused(k, Opt(OptOps.UPCAST, elementwise_axis, 4), "stays a loop")
  assert Opt(OptOps.LOCAL, 0, 16) not in k.possible_opts()   # (the rows: a GROUP first, then rows a block)
  assert Opt(OptOps.LOCAL, 0, 2) in k.apply(Opt(OptOps.GROUP, 2, 32)).possible_opts()

# ---------------- kernels the actions build ----------------

FLAT_CASES = {   # name: (tensor function of inputs, numpy function, input shapes, actions)
  "block over the inner axis, copies a block apart": (lambda a: a * 2 + 1, lambda a: a * 2 + 1, [(8, 256)],
                                                      [Opt(OptOps.LOCAL, 1, 32), Opt(OptOps.UPCAST, 1, 4)]),
  "adjacent copies (register tile), then a block": (lambda a: a * 2 + 1, lambda a: a * 2 + 1, [(8, 256)],
                                                    [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 64)]),
  "block over the outer axis": (lambda a, b: a * b, lambda a, b: a * b, [(64, 24), (24,)],
                                [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UPCAST, 0, 2)]),
  "upcast only: the rest flattened, a guarded last block": (lambda a: a.exp(), np.exp, [(7, 90)],
                                                            [Opt(OptOps.UPCAST, 1, 3)]),
  "column sums, 4 a thread": (lambda a: a.sum(0), lambda a: a.sum(0), [(40, 96)],
                              [Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.UPCAST, 0, 4)]),
  "padded: 32 threads over 90, copies a block apart": (lambda a: a * 3 - 1, lambda a: a * 3 - 1, [(5, 90)],
                                                      [Opt(OptOps.LOCAL, 1, 32), Opt(OptOps.UPCAST, 1, 3),
                                                       Opt(OptOps.LOCAL, 0, 2)]),
  "padded adjacent copies in place of a guard": (lambda a: a.exp(), np.exp, [(1031,)],
                                                 [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 64)]),
  "matmul as one output a thread, not tiles": (lambda a, b: a @ b, lambda a, b: a @ b, [(64, 48), (48, 40)],
                                               [Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.LOCAL, 0, 8),
                                                Opt(OptOps.UPCAST, 1, 5), Opt(OptOps.UPCAST, 0, 2)]),
}

@pytest.mark.parametrize("case", list(FLAT_CASES))
def test_local_and_upcast_kernels_match_numpy(case):
  fn, ref, shapes, opts = FLAT_CASES[case]
  rng = np.random.default_rng(2)
  arrays = [_data(rng, *s) for s in shapes]
  sink, item = _lowered(fn(*(Tensor(x) for x in arrays)))
  kernel = _with(sink, *opts)
  assert gpu_choices(kernel.sink).actions == tuple((o.op, kernel.axes[o.axis].arg, o.arg) for o in opts)
  got, uops, launch = _emulate(kernel.sink, item)
  np.testing.assert_allclose(got.reshape(ref(*arrays).shape), ref(*arrays), rtol=1e-5, atol=1e-5)
  locals_ = np.prod([o.arg for o in opts if o.op is OptOps.LOCAL])
  if locals_ > 1: assert launch[1][0] == locals_, f"{case}: {launch}"
  stores = sum(u.src[2].dtype.count for u in uops if u.op is Ops.STORE)   # (a wide store writes several lanes)
  assert stores == np.prod([o.arg for o in opts if o.op is OptOps.UPCAST]), f"{case}: {stores} stores a thread"

ROW_CASES = {   # name: (tensor function, numpy function, shapes, actions)
  "row sums, 64 threads a row": (lambda a: a.sum(-1), lambda a: a.sum(-1), [(6, 300)], [Opt(OptOps.GROUP, 1, 64)]),
  "row sums, contiguous chunks (GROUPTOP)": (lambda a: a.sum(-1), lambda a: a.sum(-1), [(6, 300)],
                                             [Opt(OptOps.GROUPTOP, 1, 32)]),
  "long rows looped, GROUPTOP": (lambda a: a.max(-1), lambda a: a.max(-1), [(3, 5000)], [Opt(OptOps.GROUPTOP, 1, 16)]),
  "softmax, 4 rows a block, guarded last block": (
    lambda a: a.softmax(-1), lambda a: np.exp(a - a.max(-1, keepdims=True)) /
    np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), [(10, 200)],
    [Opt(OptOps.GROUP, 2, 16), Opt(OptOps.LOCAL, 0, 4)]),
  "layernorm, GROUPTOP": (lambda a: a.layernorm(), lambda a: (a - a.mean(-1, keepdims=True)) /
                          np.sqrt(a.var(-1, keepdims=True) + 1e-5), [(4, 512)], [Opt(OptOps.GROUPTOP, 2, 32)]),
  "full sum over a grid of 64 blocks": (lambda a: a.sum(), lambda a: a.sum(), [(5003,)],
                                        [Opt(OptOps.GROUP, 0, 32), Opt(OptOps.GROUP, 0, 64)]),
  "full sum, as many blocks as threads": (lambda a: a.sum(), lambda a: a.sum(), [(5003,)],
                                          [Opt(OptOps.GROUP, 0, 64), Opt(OptOps.GROUP, 0, 64)]),
  "column sums, 16 columns a block fastest": (lambda a: a.sum(0), lambda a: a.sum(0), [(300, 64)],
                                              [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.GROUP, 1, 16)]),
  "column max, rows fastest and lanes as chunks, 2 LOCALs": (lambda a: a.max(0), lambda a: a.max(0), [(200, 96)],
                                                             [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 1, 8),
                                                              Opt(OptOps.LOCAL, 0, 2)]),
  "300 column sums, 32 columns a block (guarded last block)": (lambda a: a.sum(0), lambda a: a.sum(0), [(200, 300)],
                                                               [Opt(OptOps.LOCAL, 0, 32), Opt(OptOps.GROUP, 1, 8)]),
  "full sum, one block, chunks": (lambda a: a.sum(), lambda a: a.sum(), [(3000,)], [Opt(OptOps.GROUPTOP, 0, 128)]),
}

@pytest.mark.parametrize("case", list(ROW_CASES))
def test_group_kernels_match_numpy(case):
  fn, ref, shapes, opts = ROW_CASES[case]
  rng = np.random.default_rng(3)
  arrays = [_data(rng, *s) for s in shapes]
  sink, item = _lowered(fn(*(Tensor(x) for x in arrays)))
  got, uops, launch = _emulate(_with(sink, *opts).sink, item)
  want = ref(*arrays)
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
  group = next(o.arg for o in opts if o.op in (OptOps.GROUP, OptOps.GROUPTOP))
  threads = group * int(np.prod([o.arg for o in opts if o.op is OptOps.LOCAL]))
  # combined across the row's lanes: by barrier-separated rounds, or warp shuffles (a row of a warp needs no barrier)
  assert launch[1][0] == threads and any(u.op in (Ops.BARRIER, Ops.SHUFFLE) for u in uops), f"{case}: {launch}"
  if len([o for o in opts if o.op is OptOps.GROUP]) == 2: assert launch[0][0] == opts[1].arg
  if opts[0].op is OptOps.LOCAL:   # the rows fastest: lane lidx0 // rows, row lidx0 % rows
    src = render_with(CUDARenderer(), "k", _with(_lowered(fn(*(Tensor(x) for x in arrays)))[0], *opts).sink)[0]
    rows = int(np.prod([o.arg for o in opts if o.op is OptOps.LOCAL]))
    assert f"(lidx0%{rows})" in src and f"(lidx0/{rows})" in src, src

def test_grouptop_gives_each_thread_a_contiguous_chunk():
  rng = np.random.default_rng(4)
  sink, item = _lowered(Tensor(_data(rng, 2, 256)).sum(-1))
  top = render_with(CUDARenderer(), "k", _with(sink, Opt(OptOps.GROUPTOP, 1, 32)).sink)[0]
  strided = render_with(CUDARenderer(), "k", _with(sink, Opt(OptOps.GROUP, 1, 32)).sink)[0]
  assert "(lidx0*8)" in top and "(lidx0*8)" not in strided, top

# ---------------- every action BEAM is offered builds a right kernel ----------------

@pytest.mark.parametrize("case", ["elementwise", "rows", "full"])
def test_every_offered_gpu_action_is_accepted_and_right(case):
  rng = np.random.default_rng(5)
  x = {"elementwise": _data(rng, 32, 64), "rows": _data(rng, 64, 200), "full": _data(rng, 40000)}[case]
  fn = {"elementwise": lambda t: (t * 3).relu(), "rows": lambda t: t.sum(-1), "full": lambda t: t.sum()}[case]
  sink, item = _lowered(fn(Tensor(x)))
  want = fn(Tensor(x, device="CPU")).numpy()
  offered = Kernel(sink, GPU).possible_opts()
  gpu_ops = {o.op for o in offered}
  assert gpu_ops & {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP}, offered
  assert not gpu_ops & {OptOps.KBLOCK, OptOps.PADTO, OptOps.SPLIT, OptOps.LANES}, offered   # CPU cache actions
  seconds = []
  for opt in offered:   # each offered action, and one more on top of it where any applies
    kernel = Kernel(sink, GPU).apply(opt)
    more = kernel.possible_opts()
    for extra in ([more[len(more) // 2]] if more else []): kernel.apply(extra)
    seconds.append(kernel)
  for kernel in seconds:
    got, _, _ = _emulate(kernel.sink, item)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4, err_msg=str(kernel.applied))

WALKS = 6
WALK_CASES = {   # name: (tensor function, input shapes)
  "broadcast product": (lambda a, b: a * b + 1, [(16, 12, 8), (12, 1)]),
  "column max": (lambda a, b: (a - b).max(0), [(160, 64), (64,)]),
  "softmax rows": (lambda a, b: (a * b).softmax(-1), [(12, 256), (256,)]),
  "matrix-vector": (lambda a, b: (a * b).sum(-1), [(96, 300), (300,)]),
  "small matmul": (lambda a, b: a @ b, [(32, 24), (24, 16)]),
}

@pytest.mark.parametrize("case", list(WALK_CASES))
def test_random_walks_over_offered_actions_stay_right(case):
  fn, shapes = WALK_CASES[case]
  rng = np.random.default_rng(sum(map(ord, case)))   # (a fixed seed per case)
  arrays = [_data(rng, *s) for s in shapes]
  sink, item = _lowered(fn(*(Tensor(x) for x in arrays)))
  want = fn(*(Tensor(x, device="CPU") for x in arrays)).numpy()
  for _ in range(WALKS):   # walks of up to four actions, each step one of the actions offered then
    kernel = Kernel(sink, GPU)
    for _ in range(4):
      offered = kernel.possible_opts()
      if not offered: break
      kernel.apply(offered[int(rng.integers(len(offered)))])
    got, _, _ = _emulate(kernel.sink, item)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4, err_msg=str(kernel.applied))

# ---------------- the heuristics: today's mapping, as actions ----------------

HEURISTIC_CASES = {   # name: (tensor, the actions the heuristics choose)
  "2-D elementwise, a strided input: copies a block apart": (lambda: Tensor.empty(4096, 4096).T * Tensor.empty(4096, 1),
                                                              [Opt(OptOps.LOCAL, 1, 256), Opt(OptOps.UPCAST, 1, 4)]),
  "small elementwise, one block": (lambda: Tensor.empty(33, 17) * 2,
                                   [Opt(OptOps.LOCAL, 1, 17), Opt(OptOps.LOCAL, 0, 33)]),
  "prime size: the guarded default": (lambda: Tensor.empty(1031) * 2, []),
  "full sum 16M: the grid": (lambda: Tensor.empty(1 << 24).sum(),
                             [Opt(OptOps.GROUP, 0, 256), Opt(OptOps.GROUP, 0, 1024)]),
  "full sum 100k: a block": (lambda: Tensor.empty(100000).sum(), [Opt(OptOps.GROUP, 0, 256)]),
  "softmax 8192^2": (lambda: Tensor.empty(8192, 8192).softmax(1), [Opt(OptOps.GROUP, 2, 256)]),
  "matrix-vector rows": (lambda: (Tensor.empty(576, 1536) * Tensor.empty(1536)).sum(-1),
                         [Opt(OptOps.GROUP, 1, 128), Opt(OptOps.LOCAL, 0, 2)]),
  "many short rows": (lambda: (Tensor.empty(300, 64) * Tensor.empty(64)).sum(-1),
                      [Opt(OptOps.GROUP, 1, 8), Opt(OptOps.LOCAL, 0, 32)]),
  "matmul: shared-memory tiles": (lambda: Tensor.empty(512, 512) @ Tensor.empty(512, 512), []),
  "column sums 300 columns: as the mapping": (lambda: Tensor.empty(512, 300).sum(0),
                                              [Opt(OptOps.GROUP, 1, 32), Opt(OptOps.LOCAL, 0, 8)]),
}
CHANGED_CASES = {   # kernels the heuristics give another mapping than gpudims' defaults: (tensor, actions)
  "column sums 4096^2: a warp of columns a block": (lambda: Tensor.empty(4096, 4096).sum(0),
                                                    [Opt(OptOps.LOCAL, 0, 32), Opt(OptOps.GROUP, 1, 32)]),
  "column max 512x64": (lambda: Tensor.empty(512, 64).max(0), [Opt(OptOps.LOCAL, 0, 32), Opt(OptOps.GROUP, 1, 32)]),
}

@pytest.mark.parametrize("case", list(CHANGED_CASES))
def test_heuristics_give_column_kernels_a_warp_of_columns(case):
  make, want = CHANGED_CASES[case]
  sink, _ = _lowered(make())
  assert gpu_heuristic_opts(Kernel(sink, GPU)) == want

WIDE_CASES = {   # large elementwise kernels whose accesses all widen: adjacent copies first (kiln/codegen/wide_memory.py)
  "elementwise 16M floats": (lambda: Tensor.empty(1 << 24) * 2 + 1,
                             [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 256)]),
  "2-D elementwise": (lambda: Tensor.empty(4096, 4096) * Tensor.empty(4096, 1),
                      [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 256)]),
}

@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_heuristics_give_widening_kernels_adjacent_copies(case):
  make, want = WIDE_CASES[case]
  sink, _ = _lowered(make())
  kernel = Kernel(sink, GPU)
  assert [o for o in gpu_heuristic_opts(kernel) if o.op is not OptOps.BLOCKSUM] == want
  source, uops = render_with(CUDARenderer(), "k", kernel.sink)
  # the default mapping's grid and block, each thread's four elements read and written as one 16-byte access
  assert launch_size(uops) == launch_size(render_with(CUDARenderer(), "k", kernel.sink.replace(arg=None))[1])
  # (the broadcast column of the 2-D case is one scalar load for all four elements)
  assert [u.dtype.count for u in uops if u.op is Ops.LOAD and u.dtype.count > 1] == [4], source
  assert [u.src[2].dtype.count for u in uops if u.op is Ops.STORE] == [4], source

@pytest.mark.parametrize("case", list(HEURISTIC_CASES))
def test_heuristics_choose_todays_mapping_as_actions(case):
  make, want = HEURISTIC_CASES[case]
  sink, item = _lowered(make())
  kernel = Kernel(sink, GPU)
  opts = gpu_heuristic_opts(kernel)
  assert [o for o in opts if o.op is not OptOps.BLOCKSUM] == want
  assert gpu_optimize(sink, GPU) is kernel.sink   # the optimize stage's one call makes the same kernel
  # the same kernel as the mapping's defaults make from the graph without the actions (nothing gets slower)
  chosen = render_with(CUDARenderer(), "k", kernel.sink)[0]
  default = render_with(CUDARenderer(), "k", kernel.sink.replace(arg=None))[0]
  if not case.startswith("2-D elementwise"): assert chosen == default, f"{case}:\n{chosen}\n{default}"
  else: assert launch_size(render_with(CUDARenderer(), "k", kernel.sink)[1]) == \
      launch_size(render_with(CUDARenderer(), "k", kernel.sink.replace(arg=None))[1])

def test_heuristic_kernels_match_numpy():
  rng = np.random.default_rng(6)
  a, x = _data(rng, 300, 64), _data(rng, 64)
  for fn in (lambda a, x: (a * x).sum(-1), lambda a, x: a * x + 1, lambda a, x: a.softmax(-1),
             lambda a, x: a.sum(0), lambda a, x: (a * x).max(0)):
    sink, item = _lowered(fn(Tensor(a), Tensor(x)))
    got, _, _ = _emulate(gpu_optimize(sink, GPU), item)
    want = fn(Tensor(a, device="CPU"), Tensor(x, device="CPU")).numpy()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)

def test_gpu_opts_without_a_gpu_target_is_refused():
  sink, _ = _lowered(Tensor.empty(1 << 20) * 2)
  assert gpu_opts(Kernel(sink)) == []   # every action refused: nothing applied
  assert gpu_choices(gpu_optimize(sink)) is not None   # None: the default GPU target

# ---------------- BEAM over the GPU actions ----------------

def test_beam_searches_gpu_actions_and_its_winner_is_right():
  rng = np.random.default_rng(7)
  x = _data(rng, 64, 200)
  sink, item = _lowered(Tensor(x).sum(-1))
  timed: list[list[Opt]] = []
  def fake_time(kernels, deadline):   # pretends GROUPTOP by 16 is fastest (no device here)
    timed.extend(k.applied for k in kernels)
    return [1.0 - 0.5 * (Opt(OptOps.GROUPTOP, 1, 16) in k.applied) - 0.01 * len(k.applied) for k in kernels]
  winner = beam_search(sink, fake_time, 2, 60.0, GPU)
  assert Opt(OptOps.GROUPTOP, 1, 16) in winner.applied, winner.applied
  assert any(o.op is OptOps.LOCAL for applied in timed for o in applied)   # LOCAL candidates were timed too
  got, _, _ = _emulate(winner.sink, item)
  np.testing.assert_allclose(got, x.sum(-1), rtol=1e-5, atol=1e-5)
  # the winner's actions replayed by the optimize stage (BEAM's cached winner) make the same kernel
  assert gpu_optimize(sink, GPU, winner.applied) is winner.sink

def test_beam_check_accepts_a_reordered_column_sum_and_refuses_a_wrong_one():
  from kiln.codegen.opt.search import outputs_match
  x = ((np.arange(1 << 20) * 7 % 1000).astype(np.float32) * np.float32(0.004) - np.float32(2.0)).reshape(1024, 1024)
  serial = np.zeros(1024, np.float32)
  for row in x: serial += row   # one thread a column
  lanes = x.reshape(4, 256, 1024).sum(0, dtype=np.float32)   # 256 lanes a column, then a tree
  while lanes.shape[0] > 1: lanes = lanes[:lanes.shape[0] // 2] + lanes[lanes.shape[0] // 2:]
  assert not np.array_equal(serial, lanes[0]) and outputs_match([serial], [lanes[0]])
  wrong = lanes[0].copy()
  wrong[7] += 0.05 * np.abs(serial).max()
  assert not outputs_match([serial], [wrong]) and not outputs_match([serial], [np.full_like(serial, np.nan)])

def test_a_search_on_a_gpu_plans_for_the_gpu():
  from types import SimpleNamespace
  from kiln.codegen.opt import search
  gpu, cpu = SimpleNamespace(renderer=CUDARenderer()), SimpleNamespace(renderer=SimpleNamespace(has_local=False))
  assert isinstance(search.search_target(gpu), GPUTarget) and search.search_target(cpu) is None

def test_cpu_beam_is_unchanged():
  sink, _ = _lowered(Tensor.empty(64, 48) * 2)
  assert not {o.op for o in Kernel(sink).possible_opts()} & {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP}

# ---------------- rendered and built for sm_90a ----------------

NVCC = shutil.which("nvcc")

def _build_jobs() -> list[tuple[str, str]]:
  jobs = []
  for case, (fn, _, shapes, opts) in {**FLAT_CASES, **ROW_CASES}.items():
    sink, item = _lowered(fn(*(Tensor.empty(*s) for s in shapes)))
    jobs.append((re.sub(r"\W+", "_", case), render_with(CUDARenderer(), "k", _with(sink, *opts).sink)[0]))
  big = {"ew": (Tensor.empty(1 << 24) * 2, [Opt(OptOps.LOCAL, 0, 128), Opt(OptOps.UPCAST, 0, 8)]),
         "ew_tile": (Tensor.empty(1 << 24) * 2, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 256)]),
         "rows": (Tensor.empty(8192, 8192).softmax(1), [Opt(OptOps.GROUPTOP, 2, 512)]),
         "grid": (Tensor.empty(1 << 24).sum(), [Opt(OptOps.GROUP, 0, 512), Opt(OptOps.GROUP, 0, 2048)])}
  for name, (t, opts) in big.items():
    sink, _ = _lowered(t)
    jobs.append((name, render_with(CUDARenderer(), "k", _with(sink, *opts).sink)[0]))
  return jobs

@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_action_kernels_build_for_sm_90a_without_spills():
  from test_cuda_render import _compile, check_ptxas_reports
  jobs = _build_jobs()
  with tempfile.TemporaryDirectory(prefix="kiln_opts_") as folder, \
       concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda job: _compile(*job, folder), jobs))
  check_ptxas_reports(jobs, results)

# ---------------- on the GPU ----------------

from kiln.runtime import cuda_driver as cuda   # noqa: E402
needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@needs_gpu
@pytest.mark.parametrize("case", list(FLAT_CASES) + list(ROW_CASES))
def test_action_kernels_on_the_gpu(case):
  from kiln.engine.realize import compile_lowered
  fn, ref, shapes, opts = {**FLAT_CASES, **ROW_CASES}[case]
  rng = np.random.default_rng(8)
  arrays = [_data(rng, *s) for s in shapes]
  out = fn(*(Tensor(x, device="CUDA") for x in arrays))
  item = _item(out)
  for b in item.bufs: b.ensure_allocated()
  runner = compile_lowered("CUDA", kernel_name(item.ast), _with(lower_for_codegen(item.ast), *opts).sink)
  runner(item.bufs, item.var_vals, wait=True)
  want = ref(*arrays)
  np.testing.assert_allclose(item.bufs[0].numpy().reshape(want.shape), want, rtol=1e-4, atol=1e-4)
