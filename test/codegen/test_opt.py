"""The kernel optimizer never changes results: every action, and random sequences of actions, against the
unoptimized kernel (bit-exact for ints and for actions that keep the order of a reduction, close for float
reductions that are unrolled); invalid actions are refused; NOOPT=1 turns it off; heuristic kernels match NumPy."""
from __future__ import annotations
import random
import numpy as np
import pytest
from kiln import Tensor, dtypes, Context
from kiln.helpers import Context
from kiln.schedule.kernelize import create_schedule
from kiln.schedule import pack
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.opt import Kernel, Opt, OptOps, KernelOptError, optimize_kernel, heuristic_opts
from kiln.codegen.opt.kernel import graph_nodes
from kiln.runtime.cpu_target import CPUTarget
from kernel_runs import last_kernel_item, run_lowered

# the two machines the tile choices below were measured on, as target descriptions (kiln/runtime/cpu_target.py)
AVX2_EPYC = CPUTarget("x86_64", "avx2", 32, 16, 32 << 10, 2 << 20, 32 << 20, 2)
AVX512_XEON = CPUTarget("x86_64", "avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20, 2)

def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  def f32(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()
  def i32(*shape): return Tensor(rng.integers(-50, 50, shape).astype(np.int32)).realize()
  def f16(*shape): return Tensor(rng.uniform(-2, 2, shape).astype(np.float16)).realize()
  return f32, i32, f16

def _kernels() -> dict:
  """name -> a function building the tensor whose last kernel is tested (inputs realized)."""
  f32, i32, f16 = _inputs()
  a, b, c, row = f32(6, 8), f32(6, 8), f32(1, 8), f32(6, 1)
  ia, ib = i32(5, 7), i32(7, 3)
  x, w = f32(1, 2, 6, 6), f32(3, 2, 3, 3)
  h = f16(4, 12)
  return {
    "elementwise": lambda: a + b * 2,
    "broadcast": lambda: a + c + row,
    "row_sum": lambda: a.sum(axis=1),
    "column_max_int": lambda: i32(8, 6).max(axis=0),
    "matmul_odd": lambda: f32(5, 7) @ f32(7, 3),
    "matmul_even": lambda: f32(8, 12) @ f32(12, 16),
    "matmul_int": lambda: ia @ ib,
    "conv_window": lambda: x.conv2d(w, padding=1),
    "padded_masked": lambda: a.pad(((1, 2), (0, 3))).flip(1)[1:, 2:] * 3 + 1,
    "int_sum_3d": lambda: i32(4, 6, 8).sum(axis=(0, 2)),
    "float16": lambda: (h * h + 1).sum(axis=1),
  }

def _assert_same(got: np.ndarray, want: np.ndarray, what: str, exact: bool) -> None:
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  if exact or got.dtype.kind in "iub":
    if got.dtype.kind == "f": got, want = got.view(np.uint8), want.view(np.uint8)   # the same bits, even for NaN
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{what}: differs from the unoptimized kernel (first bad byte/element {bad[:5]})"
    return
  tol = 1e-2 if got.dtype == np.float16 else 1e-5
  diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
  assert np.all(diff <= tol + tol * np.abs(want.astype(np.float64))), f"{what}: worst difference {diff.max():.3g}"

KERNELS = _kernels()

@pytest.fixture(scope="module")
def references():
  """name -> (schedule item, lowered kernel, unoptimized result)."""
  out = {}
  for name, build in KERNELS.items():
    item = last_kernel_item(build())
    lowered = lower_kernel(item.ast)
    out[name] = (item, lowered, run_lowered(item, lowered))
  return out

@pytest.mark.parametrize("name", list(KERNELS))
def test_every_single_action_keeps_results(references, name):
  item, lowered, want = references[name]
  for opt in Kernel(lowered).possible_opts(amounts=(2, 3, 4)):
    kernel = Kernel(lowered).apply(opt)
    exact = opt.op is OptOps.UPCAST or (opt.op is OptOps.SWAP and not Kernel(lowered).is_reduce(opt.axis))
    _assert_same(run_lowered(item, kernel.sink), want, f"{name} with {opt}", exact)

@pytest.mark.parametrize("name", list(KERNELS))
def test_random_action_sequences_keep_results(references, name):
  item, lowered, want = references[name]
  rand = random.Random(name)
  for _ in range(2):
    kernel = Kernel(lowered)
    for _ in range(rand.randint(2, 4)):
      choices = kernel.possible_opts(amounts=(2, 3, 4, 8))
      if not choices: break
      kernel.apply(rand.choice(choices))
    exact = all(o.op is OptOps.UPCAST for o in kernel.applied)
    _assert_same(run_lowered(item, kernel.sink), want, f"{name} with {kernel.applied}", exact)

@pytest.mark.parametrize("name", list(KERNELS))
def test_heuristics_keep_results(references, name):
  item, lowered, want = references[name]
  kernel = Kernel(lowered)
  heuristic_opts(kernel)
  _assert_same(run_lowered(item, kernel.sink), want, f"{name} with {kernel.applied}", exact=False)

def test_matmul_heuristic_tiles_registers(references):
  _, lowered, _ = references["matmul_even"]
  kernel = Kernel(lowered)
  applied = heuristic_opts(kernel)
  assert [o.op for o in applied] == [OptOps.UPCAST, OptOps.UPCAST], applied
  accumulators = [u for u in linearize(kernel.sink) if u.op.name == "DEFINE_ACC"]
  assert len(accumulators) == 128, f"a 16x8 register tile needs 128 accumulators, got {len(accumulators)}"

def _heuristic_choice(t: Tensor, target: CPUTarget | None = AVX2_EPYC) -> list[Opt]:
  """The actions the heuristics apply to `t`'s last kernel on `target` (lowered only, never run)."""
  kernel = Kernel(lower_kernel(create_schedule([t.uop]).items[-1].ast))
  return heuristic_opts(kernel, target)

U = OptOps.UPCAST

@pytest.mark.parametrize("build, want", [
  # matmul: 16 wide on the columns (contiguous in the output and in b), as many rows as AVX2's 16 registers hold
  # with the two vectors of b and a broadcast: 4 (8 rows spilled; 4 measured 1.5-1.9x faster under -march=x86-64-v3)
  (lambda: Tensor.empty(512, 512) @ Tensor.empty(512, 512), [Opt(U, 1, 16), Opt(U, 0, 4)]),
  (lambda: Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024), [Opt(U, 1, 16), Opt(U, 0, 4)]),
  (lambda: Tensor.empty(4, 64, 32) @ Tensor.empty(4, 32, 48), [Opt(U, 2, 16), Opt(U, 1, 4)]),   # batched
  # conv: a 3-D tile of 4 output channels (each sharing the padded input loads) x 2 output rows (whose windows share
  # input rows) x one 8-lane vector of output columns: 8 of AVX2's 16 registers accumulate. 14 columns are padded to
  # one vector of 16 (8 and 4 do not divide them; a tile of 8 images instead was scalar code: 16x64x14x14 pad 1
  # 17.6 -> 51.6 GFLOP/s on the Xeon)
  (lambda: Tensor.empty(16, 64, 56, 56).conv2d(Tensor.empty(64, 64, 3, 3), padding=1),
   [Opt(U, 1, 4), Opt(U, 2, 2), Opt(U, 3, 8)]),
  (lambda: Tensor.empty(16, 64, 14, 14).conv2d(Tensor.empty(64, 64, 3, 3), padding=1),
   [Opt(U, 1, 16), Opt(OptOps.PADTO, 3, 16), Opt(U, 3, 16)]),
  (lambda: Tensor.empty(4, 512, 7, 7).conv2d(Tensor.empty(512, 512, 3, 3), padding=1),
   [Opt(U, 1, 16), Opt(OptOps.PADTO, 3, 8), Opt(U, 3, 8)]),
  # no axis is contiguous in both the output and a load (b transposed): 16x16 where the 16 rows of each load spread
  # over L1 sets, else (rows 4 KiB apart) 8x8
  (lambda: Tensor.empty(512, 512) @ Tensor.empty(512, 512).T, [Opt(U, 1, 16), Opt(U, 0, 16)]),
  (lambda: Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024).T, [Opt(U, 1, 8), Opt(U, 0, 8)]),
  # b's rows 4 KiB apart (its panel in one L1 set): 16 rows would share each line of b, but not in AVX2's registers
  (lambda: Tensor.empty(256, 256) @ Tensor.empty(256, 1024), [Opt(U, 1, 16), Opt(U, 0, 4)]),
])
def test_heuristic_tile_choices(build, want):
  with Context(PACK_MATMUL=0): assert _heuristic_choice(build()) == want   # the operands' own layouts

def test_a_software_math_epilogue_gets_a_kernel_of_its_own_or_the_whole_tile(monkeypatch):
  """The scheduler stores a tiled matmul before an epilogue of software math (exp, here in tanh; kiln/schedule/pack.py
  `splits_epilogue`): the matmul keeps the whole tile and the epilogue is an elementwise kernel of 8 lanes (AVX2).
  Fused (the split turned off), the epilogue is copied per tile element and still gets the whole tile."""
  t = (Tensor.empty(256, 256) @ Tensor.empty(256, 1024)).tanh()
  with Context(PACK_MATMUL=0, SCHEDULE_CACHE=0):
    items = [si for si in create_schedule([t.uop]).items if si.ast.op.name == "SINK"]
    assert len(items) == 2
    assert heuristic_opts(Kernel(lower_kernel(items[0].ast)), AVX2_EPYC) == [Opt(U, 1, 16), Opt(U, 0, 4)]
    assert heuristic_opts(Kernel(lower_kernel(items[1].ast)), AVX2_EPYC) == [Opt(U, 1, 8)]
    monkeypatch.setattr(pack, "EPILOGUE_SPLIT_MIN_WORK", 1 << 62)
    assert _heuristic_choice(t) == [Opt(U, 1, 16), Opt(U, 0, 4)]

@pytest.mark.parametrize("build, want", [
  # AVX-512: a matmul's vector axis is two zmm registers wide (32 columns x 8 rows, 16 accumulators of 32)
  (lambda: Tensor.empty(512, 512) @ Tensor.empty(512, 512), [Opt(U, 1, 32), Opt(U, 0, 8)]),
  (lambda: Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024), [Opt(U, 1, 32), Opt(U, 0, 8)]),
  (lambda: Tensor.empty(4, 64, 32) @ Tensor.empty(4, 32, 48), [Opt(U, 2, 16), Opt(U, 1, 8)]),   # 32 would pad 48
  # 16 rows would make a 32x16 tile, over kiln's 256 copies: 8 rows
  (lambda: Tensor.empty(256, 256) @ Tensor.empty(256, 1024), [Opt(U, 1, 32), Opt(U, 0, 8)]),
  # a conv's tile: 8 output channels x 2 rows x 16 columns (one zmm; the last of 56 columns' tiles overlapping), 16
  # of the 32 registers accumulating; 28 columns likewise (two tiles of 16)
  (lambda: Tensor.empty(16, 64, 56, 56).conv2d(Tensor.empty(64, 64, 3, 3), padding=1),
   [Opt(U, 1, 8), Opt(U, 2, 2), Opt(U, 3, 16)]),
  (lambda: Tensor.empty(4, 128, 28, 28).conv2d(Tensor.empty(128, 128, 3, 3), padding=1),
   [Opt(U, 1, 8), Opt(U, 2, 2), Opt(U, 3, 16)]),
  (lambda: Tensor.empty(512, 512) @ Tensor.empty(512, 512).T, [Opt(U, 1, 16), Opt(U, 0, 16)]),
])
def test_heuristic_tile_choices_avx512(build, want):
  with Context(PACK_MATMUL=0): assert _heuristic_choice(build(), AVX512_XEON) == want

def _conv_input_gradient(channels: int, out_channels: int, size: int) -> Tensor:
  x = Tensor.empty(4, channels, size, size).requires_grad_()
  (x.conv2d(Tensor.empty(out_channels, channels, 1, 1)) * Tensor.empty(4, out_channels, size, size)).sum().backward()
  return x.grad

@pytest.mark.parametrize("target", [AVX2_EPYC, AVX512_XEON], ids=["avx2", "avx512"])
def test_conv_input_gradient_tiles_the_weights_contiguous_channels(target):
  # a 1x1 conv runs over the flattened image: 49 positions (the output's contiguous axis) that 8 does not divide,
  # so the input channels, contiguous in the weight, are the tile's wide axis (as wide as a matmul's on the target:
  # two registers, 16 lanes on AVX2, 32 on AVX-512), the positions 8 a tile; its 4 MiB weight panel, walked one
  # strided line a step, is blocked from one L2, so the positions are padded to 56, not tiled with an overlapping
  # last tile (whose outputs would add a block's sum twice)
  wide = 32 if target is AVX512_XEON else 16
  assert _heuristic_choice(_conv_input_gradient(512, 2048, 7), target) == \
    [Opt(U, 1, wide), Opt(OptOps.PADTO, 2, 8), Opt(U, 2, 8), Opt(OptOps.KBLOCK, 3, 256)]
  # 196 positions of a 14x14 image: the same wide axis, and a 1 MiB panel that stays in L2 unblocked
  assert _heuristic_choice(_conv_input_gradient(256, 1024, 14), target)[0] == Opt(U, 1, wide)

def _conv_weight_gradient(channels: int, out_channels: int, size: int) -> Tensor:
  w = Tensor.empty(out_channels, channels, 3, 3).requires_grad_()
  (Tensor.empty(4, channels, size, size).conv2d(w, padding=1) * Tensor.empty(4, out_channels, size, size)).sum() \
    .backward()
  return w.grad

@pytest.mark.parametrize("target", [AVX2_EPYC, AVX512_XEON], ids=["avx2", "avx512"])
def test_conv_weight_gradient_tile_rows_fit_the_registers(target):
  # a 3x3 conv's weight gradient over a 28x28 image: 16 input channels (contiguous in the packed input window, stored
  # apart) are the vectors, the output channels the rows: 16 rows where 16 one-vector accumulators fit (AVX-512's
  # 32 registers), halving how often the 14 MiB input window streams; 8 on AVX2, where 16 lanes are two registers
  choice = _heuristic_choice(_conv_weight_gradient(128, 128, 28), target)
  assert choice[:2] == [Opt(U, 1, 16), Opt(U, 0, 16 if target is AVX512_XEON else 8)]

def test_vector_axis_that_8_does_not_divide_gets_16_overlapping_lanes():
  # 100 and 28 columns: 16 lanes with the last tile overlapping (at most a quarter more computed), not vectors of 4
  with Context(PACK_MATMUL=0):
    assert Opt(U, 1, 16) in _heuristic_choice(Tensor.empty(100, 64) @ Tensor.empty(64, 100), AVX512_XEON)
    assert Opt(U, 1, 16) in _heuristic_choice(Tensor.empty(64, 64) @ Tensor.empty(64, 28), AVX512_XEON)
    # 36 would compute 48: a third more
    assert Opt(U, 1, 16) not in _heuristic_choice(Tensor.empty(64, 64) @ Tensor.empty(64, 36), AVX512_XEON)

def test_packed_transposed_matmul_gets_the_wide_tile():
  # packed (kiln/schedule/pack.py), `b.T` is read along its 16-lane runs like any `b`
  assert _heuristic_choice(Tensor.empty(512, 512) @ Tensor.empty(512, 512).T) == [Opt(U, 1, 16), Opt(U, 0, 4)]
  assert _heuristic_choice(Tensor.empty(512, 512) @ Tensor.empty(512, 512).T, AVX512_XEON) == \
    [Opt(U, 1, 32), Opt(U, 0, 8)]

def test_matmul_with_transcendental_epilogue_matches_numpy():
  rng = np.random.default_rng(5)
  a_np, b_np = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 72)).astype(np.float32)
  got = ((Tensor(a_np) @ Tensor(b_np)) * 0.1).tanh().numpy()
  np.testing.assert_allclose(got, np.tanh((a_np @ b_np) * 0.1), atol=2e-6, rtol=1e-5)

def _conv_numpy(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
  windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))),
                                                     w.shape[2:], axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", windows, w, optimize=True)

@pytest.mark.parametrize("shapes", [((500, 300), (300, 700)), ((17, 33), (33, 40)), ((48, 20), (20, 64)),
                                    ((3, 24, 20), (3, 20, 32)), ((1, 16), (16, 16))])
def test_heuristic_matmul_matches_numpy(shapes):
  rng = np.random.default_rng(3)
  a_np, b_np = (rng.standard_normal(s).astype(np.float32) for s in shapes)
  np.testing.assert_allclose((Tensor(a_np) @ Tensor(b_np)).numpy(), a_np @ b_np, atol=1e-3, rtol=1e-4)

@pytest.mark.parametrize("xs, ws, pad", [((2, 5, 9, 11), (32, 5, 3, 3), 1), ((1, 3, 8, 16), (16, 3, 3, 3), 1),
                                         ((2, 4, 7, 7), (6, 4, 2, 2), 0),
                                         ((4, 32, 14, 14), (32, 32, 3, 3), 1), ((4, 32, 7, 7), (48, 32, 3, 3), 1)])
def test_heuristic_conv_matches_numpy(xs, ws, pad):
  rng = np.random.default_rng(4)
  x_np, w_np = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
  got = Tensor(x_np).conv2d(Tensor(w_np), padding=pad).numpy()
  np.testing.assert_allclose(got, _conv_numpy(x_np, w_np, pad), atol=1e-4, rtol=1e-4)

@pytest.mark.parametrize("opt, why", [
  (Opt(OptOps.UPCAST, 2, 4), "reduce axis"),        # matmul_even: axes (8, 16 | 12)
  (Opt(OptOps.UNROLL, 0, 4), "output axis"),
  (Opt(OptOps.UNROLL, 2, 5), "divides"),
  (Opt(OptOps.UPCAST, 0, 16), "divides"),
  (Opt(OptOps.PADTO, 0, 4), "does not divide"),
  (Opt(OptOps.UPCAST, 0, 1), "divides"),
  (Opt(OptOps.UPCAST, 5, 2), "axes"),
  (Opt(OptOps.SWAP, 0, 2), "cannot swap"),
  (Opt(OptOps.SWAP, 1, 1), "different axis"),
])
def test_invalid_actions_are_refused(references, opt, why):
  _, lowered, _ = references["matmul_even"]
  kernel = Kernel(lowered)
  with pytest.raises(KernelOptError, match=why): kernel.apply(opt)
  assert kernel.sink is lowered and kernel.applied == [], "a refused action must leave the kernel unchanged"

def test_unrolling_is_bounded(references):
  _, lowered, _ = references["matmul_even"]
  kernel = Kernel(lowered).apply(Opt(OptOps.UPCAST, 1, 16)).apply(Opt(OptOps.UPCAST, 0, 8))   # both axes gone
  with pytest.raises(KernelOptError, match="at most"): kernel.apply(Opt(OptOps.UNROLL, 0, 4))

@pytest.mark.parametrize("opt", [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 2, 4)])
def test_node_budget_refuses_exactly_past_it(references, opt):
  """apply(opt, max_nodes=n) is apply(opt) when the new graph has at most n nodes, else refused with the kernel
  unchanged (an UPCAST gives up while it copies: its early count must never refuse a graph within the budget)."""
  _, lowered, _ = references["matmul_even"]
  nodes = len(graph_nodes(Kernel(lowered).apply(opt).sink))
  assert Kernel(lowered).apply(opt, max_nodes=nodes).sink is Kernel(lowered).apply(opt).sink
  kernel = Kernel(lowered)
  for budget in (nodes - 1, nodes // 2, 1):
    with pytest.raises(KernelOptError, match="nodes"): kernel.apply(opt, max_nodes=budget)
    assert kernel.sink is lowered and kernel.applied == [] and kernel.unrolled == 1, f"{opt}, {budget} nodes"

def test_noopt_turns_the_optimizer_off(references):
  _, lowered, _ = references["matmul_even"]
  with Context(NOOPT=1): assert optimize_kernel(lowered) is lowered
  assert optimize_kernel(lowered) is not lowered

def test_end_to_end_matches_numpy_with_and_without_optimizer():
  rng = np.random.default_rng(1)
  a_np, b_np = rng.standard_normal((9, 20)).astype(np.float32), rng.standard_normal((20, 12)).astype(np.float32)
  for noopt in (0, 1):
    with Context(NOOPT=noopt):
      got = (Tensor(a_np) @ Tensor(b_np)).numpy()
    np.testing.assert_allclose(got, a_np @ b_np, atol=1e-5, rtol=1e-5)

def test_python_emulator_runs_optimized_kernels():
  rng = np.random.default_rng(2)
  a_np, b_np = rng.integers(-9, 9, (4, 8)).astype(np.int32), rng.integers(-9, 9, (8, 4)).astype(np.int32)
  got = (Tensor(a_np, device="PYTHON") @ Tensor(b_np, device="PYTHON")).numpy()
  np.testing.assert_array_equal(got, a_np @ b_np)
  assert Tensor(a_np, device="PYTHON").sum(axis=1).numpy().tolist() == a_np.sum(axis=1).tolist()

def test_float16_dtype_kept(references):
  item, _, want = references["float16"]
  assert item.bufs[0].dtype == dtypes.float16 and want.dtype == np.float16

def test_noopt_in_a_context_makes_the_kernel_again_unoptimized():
  """The in-process kernel cache is keyed by NOOPT too: a kernel built optimized is not reused under NOOPT=1."""
  import kiln.engine.realize as realize
  x = Tensor(np.random.default_rng(3).random((64, 64), dtype=np.float32)).realize()
  (x @ x).realize()
  (item,) = (x @ x).schedule()
  optimized = realize._runner_cache[realize.runner_key(item.bufs[0].device, item.ast)]
  with Context(NOOPT=1):
    out = (x @ x).realize()
    plain = realize._runner_cache[realize.runner_key(item.bufs[0].device, item.ast)]
  assert plain is not optimized and plain.source != optimized.source
  np.testing.assert_allclose(out.numpy(), x.numpy() @ x.numpy(), rtol=1e-4)

def test_weight_gradient_with_an_epilogue_load_keeps_its_lanes():
  # an optimizer step fused into a conv's weight gradient reads its momentum buffer, a load that stays put along the
  # sum's axes: the sum keeps its accumulator lanes along the image rows (refused, it ran 18x slower)
  x, w = Tensor.empty(4, 64, 56, 56), Tensor.empty(64, 64, 3, 3).requires_grad_()
  (x.conv2d(w, padding=1) * Tensor.empty(4, 64, 56, 56)).sum().backward()
  fused = Tensor.empty(64, 64, 3, 3) * 0.9 + w.grad
  for target in (AVX2_EPYC, AVX512_XEON): assert Opt(OptOps.LANES, 5, 8) in _heuristic_choice(fused, target)
