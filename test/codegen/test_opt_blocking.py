"""Cache blocking and lane actions (KBLOCK, SPLIT, LANES): a seeded sweep of shapes (non-multiples included) against
the unoptimized kernel and NumPy, refused cases, the heuristics' choices for large matmuls and conv gradients, and
the thread split of a blocked matmul."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, Context
from kiln.uop.ops import Ops, toposort
from kiln.uop.spec import check_linear
from kiln.schedule.kernelize import create_schedule
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.parallel import find_parallel_loop
from kiln.codegen.opt import Kernel, Opt, OptOps, KernelOptError, heuristic_opts, substitute
from kiln.runtime.cpu_target import CPUTarget
from kernel_runs import last_kernel_item, run_lowered

# the machines these choices were measured on (kiln/runtime/cpu_target.py descriptions; L2 2 MiB: blocked above 8 MiB)
AVX2_EPYC = CPUTarget("x86_64", "avx2", 32, 16, 32 << 10, 2 << 20, 32 << 20, 2)
AVX512_XEON = CPUTarget("x86_64", "avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20, 2)

U, K, S, L, SW = OptOps.UPCAST, OptOps.KBLOCK, OptOps.SPLIT, OptOps.LANES, OptOps.SWAP

def _run(item, opts: list[Opt]) -> np.ndarray:
  """The item's kernel with `opts` applied, compiled and run; the output (reset to NaN or -12345 first: a
  kernel that skips an output fails)."""
  kernel = Kernel(lower_kernel(item.ast))
  for opt in opts: kernel.apply(opt)
  check_linear(linearize(kernel.sink))
  return run_lowered(item, kernel.sink, "blocking_test")

@pytest.mark.parametrize("seed", range(6))
def test_kblock_split_sweep_matches_unoptimized_and_numpy(seed):
  rng = np.random.default_rng(seed)
  m, n = (int(v) for v in rng.integers(3, 40, 2))
  block = int(rng.choice([2, 3, 4, 8]))
  k = block * int(rng.integers(2, 7))
  a_np, b_np = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
  item = last_kernel_item(Tensor(a_np) @ Tensor(b_np))
  want = _run(item, [])
  opts = [Opt(K, 2, block)]
  if m % 2 == 0: opts = [Opt(S, 0, 2), Opt(K, 3, block)]   # the block loop inside a split row loop
  if n % 4 == 0: opts.insert(0, Opt(U, 1, 4))               # with a register tile: one store per lane
  got = _run(item, opts)
  np.testing.assert_allclose(got.reshape(m, n), want.reshape(m, n), rtol=1e-5, atol=1e-5, err_msg=str(opts))
  np.testing.assert_allclose(got.reshape(m, n), a_np @ b_np, rtol=1e-4, atol=1e-4)

def test_kblock_of_a_sum_plus_an_addend_starts_from_the_addend():
  # a sum plus a value that does not depend on the blocked axis (a gradient fused with another's): the first block's
  # accumulator starts from the addend instead of 0
  rng = np.random.default_rng(9)
  a_np, b_np = rng.standard_normal((6, 12), dtype=np.float32), rng.standard_normal((12, 8), dtype=np.float32)
  c_np = rng.standard_normal((6, 8), dtype=np.float32)
  for expr, want in ((lambda a, b, c: a @ b + c, a_np @ b_np + c_np), (lambda a, b, c: c + a @ b, c_np + a_np @ b_np),
                     (lambda a, b, c: a @ b + 1, a_np @ b_np + 1)):
    item = last_kernel_item(expr(Tensor(a_np), Tensor(b_np), Tensor(c_np)))
    for opts in ([Opt(K, 2, 4)], [Opt(U, 1, 4), Opt(K, 2, 3)]):
      np.testing.assert_allclose(_run(item, opts).reshape(6, 8), want, rtol=1e-5, atol=1e-5, err_msg=str(opts))

def test_kblock_int_is_exact_and_block_loop_can_move():
  rng = np.random.default_rng(7)
  a_np, b_np = rng.integers(-9, 9, (6, 12), dtype=np.int32), rng.integers(-9, 9, (12, 5), dtype=np.int32)
  item = last_kernel_item(Tensor(a_np) @ Tensor(b_np))
  for opts in ([Opt(K, 2, 4)], [Opt(K, 2, 3), Opt(SW, 0, 1)], [Opt(K, 2, 6), Opt(SW, 1, 2), Opt(U, 0, 2)]):
    np.testing.assert_array_equal(_run(item, opts).reshape(6, 5), a_np @ b_np, err_msg=str(opts))

@pytest.mark.parametrize("device", ["PYTHON", "LLVM"])
def test_blocking_actions_on_other_renderers(device):
  if device == "LLVM": pytest.importorskip("llvmlite")
  rng = np.random.default_rng(8)
  a_np, b_np = rng.integers(-9, 9, (6, 8), dtype=np.int32), rng.integers(-9, 9, (8, 4), dtype=np.int32)
  item = last_kernel_item(Tensor(a_np, device=device) @ Tensor(b_np, device=device))
  opts = [Opt(U, 1, 2), Opt(S, 0, 3), Opt(K, 3, 4), Opt(L, 4, 2)]
  np.testing.assert_array_equal(_run(item, opts).reshape(6, 4), a_np @ b_np)

def test_kblock_seeds_the_accumulator_with_the_output():
  item = last_kernel_item(Tensor.ones(4, 8).contiguous() @ Tensor.ones(8, 4).contiguous())
  kernel = Kernel(lower_kernel(item.ast)).apply(Opt(K, 2, 4))
  accs = [u for u in linearize(kernel.sink) if u.op is Ops.DEFINE_ACC]
  assert accs and all(acc.src[0].op is not Ops.CONST for acc in accs), "the block sum should start at out[i]"
  np.testing.assert_array_equal(_run(item, [Opt(K, 2, 4)]).reshape(4, 4), np.full((4, 4), 8.0, np.float32))

@pytest.mark.parametrize("seed", range(3))
def test_lanes_sweep(seed):
  rng = np.random.default_rng(seed)
  rows, cols = 4 * int(rng.integers(1, 4)), 4 * int(rng.integers(2, 9))
  x_np = rng.standard_normal((rows, cols), dtype=np.float32)
  i_np = rng.integers(-50, 50, (rows, cols), dtype=np.int32)
  for t, ref, reduce_axis in ((Tensor(x_np).sum(axis=1), x_np.sum(axis=1), 1),
                              (Tensor(x_np).max(axis=1), x_np.max(axis=1), 1),
                              (Tensor(i_np).sum(axis=0), i_np.sum(axis=0), 1)):
    item = last_kernel_item(t)
    want = _run(item, [])
    for amount in (2, 4):
      got = _run(item, [Opt(L, reduce_axis, amount)])
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)

def test_lanes_whole_axis_and_conv_weight_gradient():
  rng = np.random.default_rng(9)
  x_np = rng.standard_normal((5, 4), dtype=np.float32)
  item = last_kernel_item(Tensor(x_np).sum(axis=1))
  np.testing.assert_allclose(_run(item, [Opt(L, 1, 4)]), x_np.sum(axis=1), rtol=1e-5)   # no reduce loop left
  x = Tensor(rng.standard_normal((2, 3, 8, 8), dtype=np.float32), requires_grad=True)
  w = Tensor(rng.standard_normal((4, 3, 3, 3), dtype=np.float32), requires_grad=True)
  (x.conv2d(w, padding=1) * Tensor(rng.standard_normal((2, 4, 8, 8), dtype=np.float32))).sum().backward()
  item = last_kernel_item(w.grad)
  want = _run(item, [])
  kernel = Kernel(lower_kernel(item.ast))
  got = _run(item, heuristic_opts(kernel))
  assert any(o.op is L for o in kernel.applied), kernel.applied
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

def _matmul_kernel(a_shape=(6, 8), b_shape=(8, 4)) -> Kernel:
  return Kernel(lower_kernel(create_schedule([(Tensor.empty(*a_shape) @ Tensor.empty(*b_shape)).uop]).items[-1].ast))

def _lowered(t: Tensor) -> Kernel: return Kernel(lower_kernel(create_schedule([t.uop]).items[-1].ast))

@pytest.mark.parametrize("build, opts, why", [
  (_matmul_kernel, [Opt(K, 0, 2)], "output axis"),
  (_matmul_kernel, [Opt(K, 2, 3)], "divides"),
  (_matmul_kernel, [Opt(K, 2, 8)], "below the axis size"),
  (_matmul_kernel, [Opt(S, 2, 2)], "reduce axis"),
  (_matmul_kernel, [Opt(S, 0, 6)], "below the axis size"),
  (_matmul_kernel, [Opt(L, 0, 2)], "output axis"),
  (_matmul_kernel, [Opt(K, 2, 4), Opt(U, 1, 2)], "block loop"),      # the block loop is axis 1 after KBLOCK
  (_matmul_kernel, [Opt(K, 2, 4), Opt(S, 1, 2)], "block loop"),
  (_matmul_kernel, [Opt(K, 2, 4), Opt(K, 3, 2)], "reads the buffer it writes"),  # already accumulating in memory
  (lambda: _lowered(Tensor.empty(6, 8).max(axis=1)), [Opt(K, 1, 4)], "not a plain sum"),
  (lambda: _lowered((Tensor.empty(6, 8) @ Tensor.empty(8, 4)) * 2), [Opt(K, 2, 4)], "not a plain sum"),
  (lambda: _lowered(Tensor.empty(6, 8).half() @ Tensor.empty(8, 4).half()), [Opt(K, 2, 4)], "not a plain sum|rounded"),
  (lambda: _lowered(Tensor.empty(8).sum()), [Opt(K, 0, 4)], "no output loop"),
])
def test_invalid_blocking_actions_are_refused(build, opts, why):
  kernel = build()
  for opt in opts[:-1]: kernel.apply(opt)
  before = kernel.sink
  with pytest.raises(KernelOptError, match=why): kernel.apply(opts[-1])
  assert kernel.sink is before, "a refused action must leave the kernel unchanged"

def test_kblock_refuses_a_kernel_reading_its_output():
  kernel = _matmul_kernel()
  out = kernel.sink.src[0].src[0]
  loaded = next(u.src[0] for u in toposort([kernel.sink]) if u.op is Ops.LOAD)
  in_place = Kernel(substitute(kernel.sink, {loaded: out}))   # `a` read from the buffer the kernel writes
  with pytest.raises(KernelOptError, match="in place"): in_place.apply(Opt(K, 2, 4))

def test_possible_opts_offer_blocking_and_never_a_refused_action():
  kernel = _matmul_kernel((6, 512), (512, 4))
  opts = kernel.possible_opts()
  assert Opt(K, 2, 256) in opts and Opt(S, 0, 2) in opts and Opt(L, 2, 8) in opts
  blocked = Kernel(kernel.sink).apply(Opt(K, 2, 128))
  for opt in blocked.possible_opts(): Kernel(blocked.sink).apply(opt)   # none raises

@pytest.mark.parametrize("target, wide", [(AVX2_EPYC, 16), (AVX512_XEON, 32)])
@pytest.mark.parametrize("packed, block", [(0, 256), (1, 512)])
def test_heuristics_block_large_matmuls_only(packed, block, target, wide):
  with Context(PACK_MATMUL=packed):
    opts = heuristic_opts(_matmul_kernel((2048, 2048), (2048, 2048)), target)
    # packed: units of tile columns outermost, the sum blocked, each unit's tile rows outside its columns
    # (heuristic.py `_column_units`); unpacked: units of tile rows
    assert [o.op for o in opts] == ([U, U, SW, S, K, SW] if packed else [U, U, S, K]) and opts[0].arg == wide, opts
    assert next(o for o in opts if o.op is K).arg == block, opts
    # unpacked, a panel is blocked above 4 L2s (the 1024 matmul's 4 MiB is not); packed, above one L2 (it is)
    assert (K in [o.op for o in heuristic_opts(_matmul_kernel((1024, 1024), (1024, 1024)), target)]) == bool(packed)
    assert K not in [o.op for o in heuristic_opts(_matmul_kernel((512, 512), (512, 512)), target)]
    # a smaller L2 (a 512 KiB one: blocked above 2 MiB unpacked) blocks the 1024 matmul's 4 MiB panel either way
    small_l2 = CPUTarget("x86_64", "avx2", 32, 16, 32 << 10, 512 << 10, 32 << 20, 2)
    assert K in [o.op for o in heuristic_opts(_matmul_kernel((1024, 1024), (1024, 1024)), small_l2)]

@pytest.mark.parametrize("packed", [0, 1])
def test_blocked_matmul_still_splits_across_threads(packed):
  with Context(PACK_MATMUL=packed): kernel = _matmul_kernel((2048, 2048), (2048, 2048))
  heuristic_opts(kernel)
  loop = find_parallel_loop(linearize(kernel.sink))
  # unpacked: 16 units of 16 tile rows; packed: 4 units of 32 tile columns (2 a core: their `b` blocks fit half an L2)
  assert loop is not None and Kernel.size(loop.loop) == (4 if packed else 16), "the thread split takes the unit loop"

def test_conv_weight_gradient_gets_lanes_and_eight_channels():
  x, w = Tensor.empty(16, 64, 56, 56, requires_grad=True), Tensor.empty(64, 64, 3, 3, requires_grad=True)
  (x.conv2d(w, padding=1) * Tensor.empty(16, 64, 56, 56)).sum().backward()
  for target in (AVX2_EPYC, AVX512_XEON):   # 8 lanes on both: 56 columns are not a multiple of 16
    # (the tap rows upcast, not the tap columns, whose loads are lanes shifted by one)
    assert heuristic_opts(_lowered(w.grad), target) == [Opt(U, 0, 8), Opt(U, 2, 3), Opt(L, 5, 8)]
  # the stem's 7x7 stride-2 weight gradient by phase (4x4, 4x3, 3x4 and 3x3 taps: one sum a phase), the tap rows
  # upcast whole: 42 -> 15 ms one thread with the rows (one sum of 4x4 taps a phase then)
  x, w = Tensor.empty(4, 3, 224, 224, requires_grad=True), Tensor.empty(64, 3, 7, 7, requires_grad=True)
  (x.conv2d(w, stride=2, padding=3) * Tensor.empty(4, 64, 112, 112)).sum().backward()
  sums = [it for it in create_schedule([w.grad.uop]).items if it.ast.op is Ops.SINK and
          any(u.op is Ops.REDUCE_AXIS for u in toposort([it.ast]))]
  assert [heuristic_opts(Kernel(lower_kernel(it.ast)), AVX512_XEON) for it in sums] == \
    [[Opt(U, 0, 8), Opt(U, 2, rows), Opt(L, 5, 8)] for rows in (4, 4, 3, 3)]

def test_unpadded_conv_gets_the_conv_tile():
  # output channels x 2 rows x one vector of its 56 contiguous output columns (8 lanes on AVX2, 16 on AVX-512)
  for target, want in ((AVX2_EPYC, [Opt(U, 1, 4), Opt(U, 2, 2), Opt(U, 3, 8)]),
                       (AVX512_XEON, [Opt(U, 1, 8), Opt(U, 2, 2), Opt(U, 3, 16)])):
    opts = heuristic_opts(_lowered(Tensor.empty(16, 64, 58, 58).conv2d(Tensor.empty(64, 64, 3, 3))), target)
    assert opts == want, opts

def test_large_padded_conv_copies_its_padded_input_once():
  rng = np.random.default_rng(10)
  x_np = rng.standard_normal((1, 16, 128, 128), dtype=np.float32)
  w_np = rng.standard_normal((4, 16, 3, 3), dtype=np.float32)
  out = Tensor(x_np).conv2d(Tensor(w_np), padding=1)
  assert len(out.schedule()) == 2, "the padded input is its own kernel"
  windows = np.lib.stride_tricks.sliding_window_view(np.pad(x_np, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                     axis=(2, 3))
  np.testing.assert_allclose(out.numpy(), np.einsum("nchwij,ocij->nohw", windows, w_np), rtol=1e-4, atol=1e-4)

def test_tiny_reduce_axes_are_unrolled_whole():
  rng = np.random.default_rng(11)
  x_np = rng.standard_normal((2, 3, 8, 8), dtype=np.float32)
  t = Tensor(x_np).max_pool2d(2)
  kernel = _lowered(t)
  heuristic_opts(kernel)
  assert kernel.reduce_axes == [], f"a 2x2 window is unrolled whole, got {kernel.applied}"
  np.testing.assert_array_equal(t.numpy(), x_np.reshape(2, 3, 4, 2, 4, 2).max(axis=(3, 5)))
