"""Parallel compilation: a schedule's new kernels are compiled together (the C compiler runs on every core) and give
the same results; a kernel that fails to compile is reported in its place, and by the run, not hidden."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor
from kiln.device import Device, CompileError
from kiln.helpers import Context
from kiln.schedule.kernelize import create_schedule
from kiln.engine import realize
from kiln.codegen.lowerer import lower_kernel

def _graph(seed: int):
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((9, 13)).astype(np.float32), rng.standard_normal((13, 5)).astype(np.float32)
  x = Tensor(a)
  out = ((x * 3 + seed).exp2().sum(axis=1, keepdim=True) + x).contiguous() @ Tensor(b)
  want = ((np.exp2(a * 3 + seed)).sum(axis=1, keepdims=True) + a) @ b
  return out, want

def test_precompile_fills_the_runner_cache_before_the_run(monkeypatch):
  if not Device[Device.DEFAULT].compiler.runs_in_subprocess: pytest.skip("the default device compiles in process")
  out, want = _graph(7)
  items = [i for i in create_schedule([out.uop]).items if i.ast.op.name != "COPY"]
  assert len(items) >= 2
  with Context(CACHELEVEL=0):   # really compile (no disk cache), in parallel
    realize.precompile(items)
    keys = [realize.runner_key(i.bufs[0].device, i.ast) for i in items]
    assert all(k in realize._runner_cache for k in keys)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)

def test_compile_many_reports_a_failure_in_its_place(monkeypatch):
  out, _ = _graph(8)
  items = [i for i in create_schedule([out.uop]).items if i.ast.op.name != "COPY"]
  device = items[0].bufs[0].device
  bad_name = "E_broken"
  real = realize.render_lowered
  def broken_source(device: str, name: str, lowered):   # the bad kernel's C does not compile
    source, uops = real(device, name, lowered)
    return (source + "\nint kiln_broken = not_declared_anywhere;\n" if name == bad_name else source), uops
  monkeypatch.setattr(realize, "render_lowered", broken_source)
  jobs = [(bad_name, lower_kernel(items[0].ast))] + [(realize.kernel_name(i.ast), lower_kernel(i.ast)) for i in items]
  with Context(CACHELEVEL=0): results = realize.compile_many(device, jobs)   # compiled in groups
  assert isinstance(results[0], CompileError) and bad_name in str(results[0])
  assert all(isinstance(r, realize.CompiledRunner) for r in results[1:])
