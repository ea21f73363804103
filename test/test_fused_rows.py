"""Fused row chains: a reduction over the last axes broadcast back over them (softmax, log_softmax, layernorm,
rms_norm) runs as one kernel that loops over rows, with each row's reductions in loops of their own before the row's
elementwise loop. Values and gradients match torch over odd sizes; other broadcast reductions keep their buffers."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor
from kiln.helpers import Context, GlobalCounters
from kiln.uop.ops import Ops
from kiln.schedule.kernelize import create_schedule
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.linearizer import linearize
from kiln.codegen.opt import optimize_kernel
from kiln.codegen.parallel import find_parallel_loop
from helpers import check, assert_close

def _rms_norm(x): return x * (x.square().mean(-1, keepdim=True) + 1e-6).rsqrt()

# name -> (kiln function, torch function) of one input
ROW_CHAINS = {
  "softmax": (lambda x: x.softmax(-1), lambda x: x.softmax(-1)),
  "log_softmax": (lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1)),
  "layernorm": (lambda x: x.layernorm(), lambda x: F.layer_norm(x, x.shape[-1:])),
  "sub_max": (lambda x: x - x.max(-1, keepdim=True), lambda x: x - x.max(-1, keepdim=True).values),
  "div_sum": (lambda x: x / x.sum(-1, keepdim=True), lambda x: x / x.sum(-1, keepdim=True)),
  "variance": (lambda x: (x - x.mean(-1, keepdim=True)).square().mean(-1),
               lambda x: (x - x.mean(-1, keepdim=True)).square().mean(-1)),
  "rms_norm": (_rms_norm, lambda x: F.rms_norm(x, x.shape[-1:], eps=1e-6)),
}
SHAPES = [(1,), (3, 5), (7, 33), (4, 4096)]

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(ROW_CHAINS))
def test_row_chain_float32(name, shape):
  kiln_fn, torch_fn = ROW_CHAINS[name]
  # div_sum divides by a row sum: positive inputs keep it away from zero
  low = 0.5 if name == "div_sum" else -2.0
  check(kiln_fn, torch_fn, [shape], low=low, grad=shape != (4, 4096) or name in ("softmax", "layernorm"))

@pytest.mark.parametrize("shape", [(3, 5), (7, 33)], ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rms_norm"])
def test_row_chain_float16(name, shape):
  kiln_fn, torch_fn = ROW_CHAINS[name]
  check(kiln_fn, torch_fn, [shape], dtype="float16", grad=False, atol=2e-2, rtol=2e-2)

@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 33)], ids=str)
def test_layernorm_affine(shape):
  c = shape[-1]
  check(lambda x, w, b: x.layernorm() * w + b, lambda x, w, b: F.layer_norm(x, (c,), w, b), [shape, (c,), (c,)])

def _kernel_count(t: Tensor) -> int:
  return len(create_schedule([t.uop]).items)

@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rms_norm", "variance"])
def test_one_kernel_per_chain(name):
  x = Tensor(np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)).realize()
  kiln_fn, torch_fn = ROW_CHAINS[name]
  assert _kernel_count(kiln_fn(x)) == 1
  GlobalCounters.reset()
  out = kiln_fn(x).numpy()
  assert GlobalCounters.kernel_count == 1
  assert_close(out, torch_fn(torch.tensor(x.numpy())).numpy(), name, atol=1e-5, rtol=1e-4)

def test_row_fusion_off_keeps_buffers():
  x = Tensor(np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32)).realize()
  with Context(ROW_FUSION=0): assert _kernel_count(x.softmax(-1)) == 3
  assert _kernel_count(x.softmax(-1)) == 1

def test_batched_rows_one_kernel():
  x = Tensor(np.random.default_rng(2).standard_normal((2, 3, 4, 40)).astype(np.float32)).realize()
  out = x.softmax(-1)
  assert _kernel_count(out) == 1
  assert_close(out.numpy(), torch.tensor(x.numpy()).softmax(-1).numpy(), "softmax of 4-d rows")

# broadcast reductions that are not row-local: each must stay correct (its reduction keeps its own buffer)
NOT_ROW_LOCAL = {
  "column_max": (lambda x: x - x.max(0, keepdim=True), lambda x: x - x.max(0, keepdim=True).values),
  "axis0_sum_along_axis1": (lambda x: x * x.sum(0).reshape(1, -1), lambda x: x * x.sum(0).reshape(1, -1)),
  "row_max_as_column": (lambda x: x[:5] - x[:5].max(-1).reshape(1, -1),
                        lambda x: x[:5] - x[:5].max(-1).values.reshape(1, -1)),
  "middle_axis_softmax": (lambda x: x.reshape(4, 6, 5).softmax(1).reshape(24, 5),
                          lambda x: x.reshape(4, 6, 5).softmax(1).reshape(24, 5)),
  "row_sum_reshaped_rows": (lambda x: (x / x.sum(-1, keepdim=True)).reshape(12, 10),
                            lambda x: (x / x.sum(-1, keepdim=True)).reshape(12, 10)),
}

@pytest.mark.parametrize("name", list(NOT_ROW_LOCAL))
def test_not_row_local_stays_correct(name):
  kiln_fn, torch_fn = NOT_ROW_LOCAL[name]
  check(kiln_fn, torch_fn, [(24, 5)], low=0.5)
  x = Tensor(np.ones((24, 5), np.float32))
  assert _kernel_count(kiln_fn(x)) >= 2   # the reduction is not fused into its broadcast consumer

def test_shared_reduction_two_outputs():
  """The row max is both an output and used by the softmax: it keeps its buffer and both are right."""
  rng = np.random.default_rng(3)
  xn = rng.standard_normal((5, 9)).astype(np.float32)
  x = Tensor(xn)
  m = x.max(-1, keepdim=True)
  e = (x - m).exp()
  s = e / e.sum(-1, keepdim=True)
  Tensor.realize_all([m, s])
  assert_close(m.numpy(), xn.max(-1, keepdims=True), "max")
  assert_close(s.numpy(), torch.tensor(xn).softmax(-1).numpy(), "softmax")

def _linearized(t: Tensor) -> list:
  items = create_schedule([t.uop]).items
  assert len(items) == 1
  return linearize(optimize_kernel(lower_kernel(items[0].ast)))

def test_reduce_loops_run_before_the_row_loop_and_rows_split_across_threads():
  x = Tensor(np.zeros((64, 512), np.float32)).realize()
  uops = _linearized(x.softmax(-1))
  ranges = [u for u in uops if u.op is Ops.RANGE]
  assert len(ranges) == 4   # the row loop, then the max loop, the sum loop and the elementwise loop, one after another
  depth, inner_loops, first_store = 0, [], None
  for i, u in enumerate(uops):
    if u.op is Ops.RANGE:
      depth += 1
      if depth == 2: inner_loops.append(i)
      assert depth <= 2, "the row's loops must not nest"
    elif u.op is Ops.ENDRANGE: depth -= 1
    elif u.op is Ops.STORE and first_store is None: first_store = i
  assert len(inner_loops) == 3 and first_store > inner_loops[-1]   # stores only in the last loop
  parallel = find_parallel_loop(uops)
  assert parallel is not None and parallel.loop is ranges[0] and parallel.loop.src[0].arg == 64

@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_every_optimizer_action_keeps_row_kernels_right(name):
  """Each single action (upcasts, unrolls, loop swaps) on a fused row kernel still gives torch's values."""
  from kiln.codegen.opt import Kernel
  from kiln.engine.realize import compile_lowered
  xn = np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)
  kiln_fn, torch_fn = ROW_CHAINS[name]
  want = torch_fn(torch.tensor(xn)).numpy()
  item = create_schedule([kiln_fn(Tensor(xn).realize()).uop]).items[0]
  for buf in item.bufs: buf.allocate()
  lowered = lower_kernel(item.ast)
  opts = Kernel(lowered).possible_opts(amounts=(2, 4))
  assert any(o.op.name == "SWAP" for o in opts) and any(o.op.name == "UNROLL" for o in opts)
  for opt in opts:
    runner = compile_lowered(item.bufs[0].device, "row_opt_test", Kernel(lowered).apply(opt).sink)
    item.bufs[0].copyin(memoryview(bytes(item.bufs[0].nbytes)))
    runner(item.bufs, item.var_vals)
    assert_close(item.bufs[0].numpy().reshape(want.shape), want, f"{name} with {opt}")
