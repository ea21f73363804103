"""Packed matmul operands (kiln/schedule/pack.py): which sums are packed, and packed results (forward and backward,
several shapes and dtypes) against PyTorch/NumPy. The size thresholds are lowered so small matmuls qualify."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from kiln import Tensor, Context, Device
from kiln.uop.ops import Ops, toposort
from kiln.schedule import pack
from kiln.schedule.pack import pack_matmuls
from kiln.schedule.kernelize import create_schedule
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import optimize_kernel
from kiln.engine.realize import render_lowered
from helpers import check, assert_close

@pytest.fixture
def small_packs(monkeypatch):
  """Every matmul with 16-multiple columns and 8-multiple rows is packed (the thresholds are module constants the
  schedule cache does not see, so it is off)."""
  monkeypatch.setattr(pack, "PACK_MIN_WORK", 1)
  monkeypatch.setattr(pack, "PACK_CHANNELS_MIN_WORK", 1)
  monkeypatch.setattr(pack, "PACK_A_L2_SHARE", 1 << 40)   # (every `a` "too large to stay in L2")
  monkeypatch.setattr(pack, "PACK_MIN_REUSE", 8)
  monkeypatch.setattr(pack, "A_IN_PLACE", False)   # (both operands packed: `a` too)
  with Context(SCHEDULE_CACHE=0): yield

# what the default device schedules: packs only where its renderer asks for them (host CPU devices)
host_packs = pytest.mark.skipif(not Device[Device.DEFAULT].renderer.packs_matmul_operands,
                                reason="the default device's renderer does not pack matmul operands")

def packed_sums(t: Tensor) -> int:
  """How many reductions of `t`'s graph `pack_matmuls` rewrites (on any device)."""
  (root,) = pack_matmuls([t.uop], toposort([t.uop]), lambda device: True)
  return sum(u.op is Ops.CONTIGUOUS and u.src[0].op is Ops.PERMUTE for u in toposort([root])) // 2   # two packs each

MATMULS = [
  ("a @ b", lambda a, b: a @ b, [(64, 48), (48, 32)]),
  ("24 rows, 80 columns", lambda a, b: a @ b, [(24, 40), (40, 80)]),
  ("a.T @ b.T", lambda a, b: a.T @ b.T, [(40, 72), (48, 40)]),
  ("batched, shared b", lambda a, b: a @ b, [(3, 16, 24), (24, 32)]),
  ("batched both", lambda a, b: a @ b, [(2, 3, 16, 24), (2, 3, 24, 48)]),
  ("epilogue", lambda a, b: (a @ b + 1).relu(), [(32, 40), (40, 64)]),
]

@pytest.mark.parametrize("name, fn, shapes", MATMULS, ids=[m[0] for m in MATMULS])
def test_packed_matmuls_match_torch_forward_and_backward(small_packs, name, fn, shapes):
  a, b = (Tensor.empty(*s) for s in shapes)
  assert packed_sums(fn(a, b)) == 1, f"{name}: the matmul should be packed"
  check(fn, fn, shapes)

@pytest.mark.parametrize("dtype", ["float16", "int32", "float64"])
def test_packed_matmul_dtypes(small_packs, dtype):
  assert packed_sums(Tensor.empty(32, 24, dtype=dtype) @ Tensor.empty(24, 48, dtype=dtype)) == 1
  check(lambda a, b: a @ b, lambda a, b: a @ b, [(32, 24), (24, 48)], dtype=dtype, grad=dtype == "float64",
        low=-4, high=4)

def test_backward_matmuls_are_packed_too(small_packs):
  a, b = Tensor.empty(32, 48, requires_grad=True), Tensor.empty(48, 64, requires_grad=True)
  (a @ b).relu().sum().backward()
  # each gradient's graph holds its backward matmul and the forward one (relu's mask), both packed
  assert packed_sums(a.grad) == 2 and packed_sums(b.grad) == 2

@host_packs
def test_packing_adds_two_copy_kernels_labelled_with_the_users_op(small_packs):
  a, b = (Tensor(np.ones((32, 32), np.float32)).realize() for _ in range(2))
  with Context(PACK_MATMUL=0): assert len((a @ b).schedule()) == 1
  items = (a @ b).schedule()
  assert len(items) == 3 and all(any("matmul" in m for m in item.metadata) for item in items)

def test_packed_views_read_every_element_where_it_was(small_packs):
  rng = np.random.default_rng(3)
  an, bn = rng.standard_normal((40, 24), dtype=np.float32), rng.standard_normal((24, 32), dtype=np.float32)
  got = (Tensor(an) @ Tensor(bn)).numpy()
  with Context(PACK_MATMUL=0): unpacked = (Tensor(an) @ Tensor(bn)).numpy()
  np.testing.assert_array_equal(got, unpacked)   # the same sums in the same order
  assert_close(got, an.astype(np.float64) @ bn, "packed matmul", atol=1e-4)

@pytest.mark.parametrize("why, build", [
  ("columns not a multiple of 16", lambda: Tensor.empty(64, 32) @ Tensor.empty(32, 40)),
  ("rows not a multiple of 8", lambda: Tensor.empty(60, 32) @ Tensor.empty(32, 48)),
  ("a max, not a sum", lambda: (Tensor.empty(64, 1, 32) * Tensor.empty(1, 48, 32)).max(-1)),
  ("an elementwise product", lambda: (Tensor.empty(64, 48, 32) * Tensor.empty(64, 48, 32)).sum(-1)),
])
def test_sums_that_are_not_tiled_matmuls_are_not_packed(small_packs, why, build):
  assert packed_sums(build()) == 0, why

def test_sums_over_several_axes_pack_them_in_order(small_packs):
  # a matmul over two reduce axes, and a 1x1 conv's weight gradient (a sum over the batch and the image)
  fn = lambda a, b: (a.reshape(64, 1, 8, 4) * b.reshape(1, 48, 8, 4)).sum((2, 3))
  assert packed_sums(fn(Tensor.empty(64, 32), Tensor.empty(48, 32))) == 1
  check(fn, fn, [(64, 32), (48, 32)])
  x, w = Tensor.empty(2, 16, 5, 5, requires_grad=True), Tensor.empty(32, 16, 1, 1, requires_grad=True)
  (x.conv2d(w) * Tensor.empty(2, 32, 5, 5)).sum().backward()
  assert packed_sums(w.grad) >= 1
  check(lambda x, w: x.conv2d(w), lambda x, w: torch.nn.functional.conv2d(x, w), [(2, 16, 5, 5), (32, 16, 1, 1)])

@host_packs
@pytest.mark.parametrize("kernel", [3])   # (a 1x1 conv runs over its flattened image: no short rows)
def test_conv_weights_over_short_rows_are_copied_channel_major(small_packs, kernel):
  # 7 output columns (8 does not divide them): the weight, broadcast along the image, is copied contiguous along
  # the 16 output channels of the forward conv and the input channels of its input gradient (kiln/schedule/pack.py
  # `_packed_channels`); the results are the unpacked ones
  x, w = Tensor.empty(2, 32, 7, 7, requires_grad=True), Tensor.empty(16, 32, kernel, kernel, requires_grad=True)
  out = x.conv2d(w, padding=kernel // 2)
  (root,) = pack_matmuls([out.uop], toposort([out.uop]), lambda device: True)
  assert any(u.op is Ops.CONTIGUOUS and u.src[0].op is Ops.PERMUTE and u.shape[-1] == 16 for u in toposort([root]))
  # the weight gradient (a sum over batch and image, its innermost output axis the kernel's width) is a packed
  # matmul over the input channels
  x, w = Tensor.empty(2, 32, 7, 7, requires_grad=True), Tensor.empty(16, 32, kernel, kernel, requires_grad=True)
  (x.conv2d(w, padding=kernel // 2) * Tensor.empty(2, 16, 7, 7)).sum().backward()
  assert packed_sums(w.grad) >= 1
  # the input gradient's register tile: vectors of at least 8 input channels (not 4 + 3 columns)
  g = Tensor(np.random.default_rng(5).standard_normal((2, 16, 7, 7), dtype=np.float32))
  x = Tensor.zeros(2, 32, 7, 7).contiguous().realize().requires_grad_()
  (x.conv2d(Tensor(np.ones((16, 32, kernel, kernel), np.float32)), padding=kernel // 2) * g).sum().backward()
  items = [i for i in create_schedule([x.grad.uop]).items if i.ast.op is Ops.SINK]
  with Context(VECTORIZE=1): _, uops = render_lowered("CPU", "xgrad", optimize_kernel(lower_kernel(items[-1].ast)))
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert accs and min(u.dtype.count for u in accs) >= 8, sorted({u.dtype.count for u in accs})
  ours = lambda x, w: x.conv2d(w, padding=kernel // 2)
  check(ours, lambda x, w: torch.nn.functional.conv2d(x, w, padding=kernel // 2), [(2, 32, 7, 7), (16, 32, kernel, kernel)])

def test_a_broadcast_constant_factor_is_not_copied(small_packs):
  out = (Tensor.empty(64, 32) @ Tensor.ones(32, 48)).uop
  (root,) = pack_matmuls([out], toposort([out]), lambda device: True)
  assert sum(u.op is Ops.CONTIGUOUS for u in toposort([root])) == 1   # only `a`

def copies(t: Tensor) -> int:
  """How many operand copies (packs) `pack_matmuls` puts into `t`'s graph."""
  (root,) = pack_matmuls([t.uop], toposort([t.uop]), lambda device: True)
  return sum(u.op is Ops.CONTIGUOUS and u.src[0].op is Ops.PERMUTE for u in toposort([root]))

def test_thresholds_keep_small_matmuls_and_few_rows_unpacked():
  assert copies(Tensor.empty(256, 256) @ Tensor.empty(256, 1024)) == 0    # the transformer's FFN: 2^26
  # 512^3: the two copies and their launches cost what they save (one thread, run in turn: 1.73 -> 1.64 ms unpacked)
  assert copies(Tensor.empty(512, 512) @ Tensor.empty(512, 512)) == 0
  assert copies(Tensor.empty(640, 640) @ Tensor.empty(640, 640)) == 1   # `b` (a row-major `a` is read in place)
  assert copies(Tensor.empty(16, 2048) @ Tensor.empty(2048, 8192)) == 0   # 16 rows: a pack used 16 times
  with Context(PACK_MATMUL=0): assert copies(Tensor.empty(640, 640) @ Tensor.empty(640, 640)) == 0

def test_a_plain_matmul_reads_a_row_major_a_in_place():
  """Large plain matmuls pack `b` alone when `a` is contiguous along the sum (its kernel reads each row tile of `a`
  from L1, heuristic.py `_column_units`); a transposed `a` or a batch packs both; the values are NumPy's."""
  assert copies(Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024)) == 1
  assert copies(Tensor.empty(1024, 1024).T @ Tensor.empty(1024, 1024)) == 2
  assert copies(Tensor.empty(4, 512, 512) @ Tensor.empty(4, 512, 512)) == 2
  with Context(SCHEDULE_CACHE=0):
    rng = np.random.default_rng(8)
    an, bn = rng.standard_normal((640, 640), dtype=np.float32), rng.standard_normal((640, 640), dtype=np.float32)
    assert_close((Tensor(an) @ Tensor(bn)).numpy(), an.astype(np.float64) @ bn, "640^3 matmul, b packed", atol=2e-3)

def test_packed_matmul_on_llvm(small_packs):
  pytest.importorskip("llvmlite")
  a, b = Tensor.empty(32, 24, device="LLVM"), Tensor.empty(24, 48, device="LLVM")
  assert len((a @ b).schedule()) == 3
  check(lambda a, b: a @ b, lambda a, b: a @ b, [(32, 24), (24, 48)], device="LLVM")

def test_only_devices_whose_renderer_asks_are_packed(small_packs):
  a, b = Tensor.empty(32, 32, device="PYTHON"), Tensor.empty(32, 32, device="PYTHON")
  assert len((a @ b).schedule()) == 1

def test_a_packed_matmul_trains_like_torch(small_packs):
  rng = np.random.default_rng(5)
  xn, wn = rng.standard_normal((64, 32), dtype=np.float32), rng.standard_normal((32, 48), dtype=np.float32) * 0.1
  x, w = Tensor(xn), Tensor(wn, requires_grad=True)
  tx, tw = torch.tensor(xn), torch.tensor(wn, requires_grad=True)
  for _ in range(3):
    loss = (x @ w).relu().square().mean()
    loss.backward()
    w.assign(w.detach() - 0.1 * w.grad).realize()
    w.grad = None
    tloss = (tx @ tw).relu().square().mean()
    tloss.backward()
    with torch.no_grad(): tw -= 0.1 * tw.grad
    tw.grad = None
    assert_close(loss.numpy(), tloss.detach().numpy(), "loss", atol=1e-5)
  assert_close(w.numpy(), tw.detach().numpy(), "trained weight", atol=1e-5)

def test_a_smaller_matmul_packs_only_a_strided_b():
  # below PACK_MIN_WORK: `x @ w.T` (its b strided along the output's columns) packs b alone; `x @ w` packs nothing
  x, w = Tensor.rand(256, 512), Tensor.rand(512, 512)
  with Context(SCHEDULE_CACHE=0):
    (root,) = pack_matmuls([(x @ w.T).uop], toposort([(x @ w.T).uop]), lambda device: True)
    assert sum(u.op is Ops.CONTIGUOUS and u.src[0].op is Ops.PERMUTE for u in toposort([root])) == 1
    assert packed_sums(x @ w) == 0
    np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-5, atol=1e-4)

def test_a_smaller_matmul_packs_a_contiguous_b_that_outgrows_l2(monkeypatch):
  """Below PACK_MIN_WORK a contiguous `b` is packed (alone) once it is larger than a PACK_B_L2_SHARE share of the
  device's L2: 1/2 of 2 MiB here (the MLP's 784x512 weights, 1.6 MB); `b`s within it stay as they are."""
  monkeypatch.setattr(pack, "_l2_bytes", lambda device: 2 << 20)
  with Context(SCHEDULE_CACHE=0):
    assert copies(Tensor.empty(256, 784) @ Tensor.empty(784, 512)) == 1
    assert copies(Tensor.empty(256, 1024) @ Tensor.empty(1024, 256)) == 0   # 1 MiB: half the L2, not more
    assert copies(Tensor.empty(4, 64, 256) @ Tensor.empty(256, 1024)) == 0   # the transformer's FFN up: 1 MiB
    # a batch of small `b`s: each batch element's is what the row tiles sweep (4 x 512 KiB)
    assert copies(Tensor.empty(4, 256, 512) @ Tensor.empty(4, 512, 256)) == 0
    monkeypatch.setattr(pack, "_l2_bytes", lambda device: 512 << 10)   # a smaller L2: the FFN's `b` outgrows it
    assert copies(Tensor.empty(4, 64, 256) @ Tensor.empty(256, 1024)) == 1
    rng = np.random.default_rng(3)
    xn, wn = rng.standard_normal((256, 784), dtype=np.float32), rng.standard_normal((784, 512), dtype=np.float32)
    bn = rng.standard_normal(512, dtype=np.float32)
    monkeypatch.setattr(pack, "_l2_bytes", lambda device: 2 << 20)
    out = (Tensor(xn) @ Tensor(wn) + Tensor(bn)).relu()
    assert len(out.schedule()) == 2   # the pack of `b`, the matmul
    assert_close(out.numpy(), np.maximum(xn.astype(np.float64) @ wn + bn, 0), "256x784x512, b packed", atol=2e-3)

def test_axis_stride_of_views():
  w = Tensor.empty(512, 10)
  assert [pack.axis_stride(w.uop, 0), pack.axis_stride(w.uop, 1)] == [10, 1]
  assert [pack.axis_stride(w.T.uop, 0), pack.axis_stride(w.T.uop, 1)] == [1, 10]
  assert pack.axis_stride(w.T.reshape(1, 10, 512).expand(4, 10, 512).uop, 0) == 0
  assert pack.axis_stride(w[:, 2:4].uop, 0) is None   # a shrink: not a view this reads

def test_chained_packed_matmuls_are_each_computed_once(small_packs):
  # a packed matmul that reads an earlier packed one must read its packed graph: packed over the original graph, the
  # earlier matmuls stayed inside the later ones, unpacked, and were scheduled again (a 4-layer transformer: 99
  # kernels instead of 58)
  rng = np.random.default_rng(5)
  shapes = [(32, 48), (48, 64), (64, 32), (32, 48)]
  x, w1, w2, w3 = (Tensor(rng.standard_normal(s, dtype=np.float32)).realize() for s in shapes)
  def chain(x, w1, w2, w3): return (((x @ w1).relu() @ w2 + x[:, :32]).relu() @ w3).relu()
  out = chain(x, w1, w2, w3)
  assert packed_sums(out) == 3
  sums = [item for item in out.schedule() if any(u.op is Ops.REDUCE_AXIS for u in toposort([item.ast]))]
  assert len(sums) == 3, f"{len(sums)} matmul kernels for 3 matmuls"
  xn, w1n, w2n, w3n = (t.numpy() for t in (x, w1, w2, w3))
  def relu(v): return np.maximum(v, 0)
  assert_close(out.numpy(), relu(relu(relu(xn @ w1n) @ w2n + xn[:, :32]) @ w3n), "chained matmuls", atol=1e-4)

def test_a_matmul_feeding_a_packed_matmul_keeps_its_own_layout(small_packs):
  # (x @ w1) @ w2: the first product is stored row-major, then packed by a copy; fused into the pack it would write
  # the tile-major layout and gather its own `b`
  x, w1, w2 = Tensor.rand(256, 512), Tensor.rand(512, 512), Tensor.rand(512, 512)
  out = (x @ w1).relu() @ w2
  (root,) = pack_matmuls([out.uop], toposort([out.uop]), lambda device: True)
  plain = [u for u in toposort([root]) if u.op is Ops.CONTIGUOUS and u.src[0].op is not Ops.PERMUTE]
  assert plain and all(any(s.op is Ops.REDUCE_AXIS for s in toposort([u])) for u in plain)
  np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w1.numpy(), 0) @ w2.numpy(), rtol=1e-4, atol=1e-3)

def _gelu(v): return 0.5 * v * (1 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())

@host_packs
def test_a_tiled_matmul_is_stored_before_an_epilogue_of_software_math():
  """On host CPUs a register-tiled matmul whose epilogue has software math (a GELU's tanh) is its own kernel and the
  epilogue an elementwise one (pack.py `splits_epilogue`); a cheap epilogue (bias and ReLU), a matrix-vector product
  (one row: no tile), a small matmul and a device that does not pack keep one kernel; the values are NumPy's."""
  rng = np.random.default_rng(6)
  xn, wn = rng.standard_normal((4, 64, 256), dtype=np.float32), rng.standard_normal((256, 1024), dtype=np.float32) * 0.06
  bn = rng.standard_normal(1024, dtype=np.float32)
  x, w, b = Tensor(xn), Tensor(wn), Tensor(bn)
  kernels = lambda t: [si for si in t.schedule() if si.ast.op is Ops.SINK]
  with Context(SCHEDULE_CACHE=0):
    assert len(kernels(_gelu(x @ w + b))) == 2
    assert len(kernels((x @ w + b).relu())) == 1
    assert len(kernels((x[:, :1] @ w + b).sigmoid())) == 1   # 4 rows: a matrix-vector product per batch
    assert len(kernels(_gelu(x[:, :16, :64] @ w[:64, :64]))) == 1   # 2^16 multiply-adds
    assert len(kernels(_gelu(x.to("PYTHON") @ w.to("PYTHON")))) == 1
    h = xn.astype(np.float64) @ wn + bn
    want = 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))
    assert_close(_gelu(x @ w + b).numpy(), want, "GELU(x @ w + b), split", atol=1e-4)

@host_packs
def test_both_matmuls_of_a_gated_product_are_stored_before_its_software_math():
  """`silu(x @ wg) * (x @ wu)` (an LLM's feed-forward in prefill): the silu is in the up projection's epilogue too,
  so both matmuls are stored and the product is an elementwise kernel; the values are NumPy's."""
  rng = np.random.default_rng(7)
  xn = rng.standard_normal((128, 256), dtype=np.float32)
  gn, un = (rng.standard_normal((256, 512), dtype=np.float32) * 0.06 for _ in range(2))
  x, wg, wu = Tensor(xn), Tensor(gn), Tensor(un)
  out = (x @ wg).silu() * (x @ wu)
  with Context(SCHEDULE_CACHE=0):
    assert len([si for si in out.schedule() if si.ast.op is Ops.SINK]) == 3
    g, u = xn.astype(np.float64) @ gn, xn.astype(np.float64) @ un
    assert_close(out.numpy(), g / (1 + np.exp(-g)) * u, "silu(x @ wg) * (x @ wu)", atol=1e-4)
