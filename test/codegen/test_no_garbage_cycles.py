"""Codegen leaves no reference cycles behind (linearize's nested functions, the vectorizer's, the C writer's bound
methods): the cyclic collector is paused while kernels are made (kiln/engine/realize.py, `_collector_paused`), so a
cycle would keep a kernel's dicts and UOps alive until a collection pass, which then costs tens of milliseconds."""
from __future__ import annotations
import gc
import numpy as np
from kiln import Tensor
from kiln.engine.realize import _prepare_kernel, kernel_name, render_lowered
from kiln.helpers import Context

def _kernel_asts() -> list:
  """A matmul with a fused elementwise tail and a row softmax: reduce groups, upcasts and vectors."""
  rng = np.random.default_rng(0)
  a = Tensor(rng.standard_normal((16, 32)).astype(np.float32))
  b = Tensor(rng.standard_normal((32, 24)).astype(np.float32))
  items = Tensor.schedule((a @ b).relu() + 1, (a * 2).softmax(axis=1))
  return [item.ast for item in items if item.ast.op.name == "SINK"]

def test_rendering_a_kernel_leaves_no_cycles():
  asts = _kernel_asts()
  assert asts, "no kernel to render"
  prepared = [(kernel_name(ast), _prepare_kernel(ast)) for ast in asts]
  with Context(VECTORIZE=1):
    render_lowered("CPU", *prepared[0])   # warm: module-level caches made once are not garbage
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
      for name, lowered in prepared: render_lowered("CPU", name, lowered)
      garbage = gc.collect()
    finally:
      if was_enabled: gc.enable()
  assert garbage == 0, f"rendering {len(prepared)} kernels left {garbage} objects in reference cycles"

def test_codegen_keeps_no_kernel_graph_alive():
  # the optimizer remembers its last graphs while it works (kernel.graph_nodes); once kernels are made nothing may keep
  # them, or every later collection scans thousands of nodes (a 33 ms full pass after the anchors' transformer)
  from kiln.codegen.opt import kernel
  rng = np.random.default_rng(1)
  a = Tensor(rng.standard_normal((24, 40)).astype(np.float32))
  b = Tensor(rng.standard_normal((40, 8)).astype(np.float32))
  out = ((a @ b).tanh() * 3).numpy()
  np.testing.assert_allclose(out, np.tanh(a.numpy() @ b.numpy()) * 3, rtol=1e-5, atol=1e-5)
  assert kernel._recent_graphs == {}, f"{len(kernel._recent_graphs)} kernel graphs kept after codegen"
