"""The code generator's ordered stages (kiln/codegen/pipeline.py): each stage's output is what its contract says, a
run can stop after any stage, the whole list gives the source the device compiles, and the arrows between the
packages point one way (no renderer imports a codegen stage or the engine, no runtime imports the front end)."""
from __future__ import annotations
import ast as pyast, pathlib
import numpy as np
import pytest
from kiln import Tensor
from kiln.device import Device
from kiln.codegen import pipeline
from kiln.codegen.threads import ThreadAxes
from kiln.engine.realize import get_runner, render_lowered, lower_for_codegen, optimize_for
from kiln.renderer import ONE_THREAD
from kiln.renderer.cuda import CUDARenderer
from kiln.uop.ops import UOp, Ops
from kiln.dtype import dtypes

KILN = pathlib.Path(__file__).resolve().parents[2] / "kiln"

def kernel_ast(t: Tensor) -> UOp:
  """The AST of the last kernel `t`'s schedule runs (the one that makes `t`)."""
  return [i for i in t.schedule() if i.ast.op is Ops.SINK][-1].ast

def test_stage_order_and_contracts():
  assert [s.name for s in pipeline.STAGES] == ["lower", "optimize", "map_axes", "software_math", "linearize",
                                               "vectorize", "plan_threads", "render"]
  assert all(s.contract and "\n" not in s.contract for s in pipeline.STAGES)

def test_every_stage_output_on_the_cpu():
  ast = kernel_ast(Tensor.ones(256, 64).contiguous().exp() * 2)
  out = pipeline.stage_outputs(ast, Device["CPU"].renderer, "E_256_64")
  for name in ("lower", "optimize", "map_axes", "software_math"): assert isinstance(out[name], UOp), name
  # on the CPU the graph is the same, its SINK naming the loop the thread pool splits
  assert out["map_axes"] is out["optimize"].replace(arg=ThreadAxes(split=0))
  assert not any(u.op is Ops.EXP2 for u in out["software_math"].toposort())   # software exp on the CPU
  for name in ("linearize", "vectorize", "plan_threads"): assert isinstance(out[name], list), name
  assert any(u.dtype.count > 1 for u in out["vectorize"])   # the upcast lanes became vectors
  assert isinstance(out["render"], str) and "kiln_tid" in out["render"]
  # the whole list is what the device compiles (the realize path's source, byte for byte)
  source, _ = render_lowered("CPU", "E_256_64", optimize_for(Device["CPU"].renderer, lower_for_codegen(ast)))
  assert source == out["render"]

@pytest.mark.parametrize("stop", [s.name for s in pipeline.STAGES])
def test_a_run_stops_after_any_stage(stop):
  ast = kernel_ast(Tensor.arange(64).float().reshape(8, 8).sum(1))
  whole = pipeline.stage_outputs(ast, Device["CPU"].renderer)
  assert pipeline.run(ast, Device["CPU"].renderer, stop=stop) == whole[stop]

def test_the_cpu_thread_plan_is_a_stage():
  renderer = Device["CPU"].renderer
  job = pipeline.Job(renderer, "E")
  ast = kernel_ast(Tensor.ones(4096, 64).contiguous() + 1)
  # stopped after map_axes, the graph says which loop the thread pool splits (its SINK's ThreadAxes)
  mapped = pipeline.run(ast, renderer, stop="map_axes")
  outer = min(u.arg for u in mapped.toposort() if u.op is Ops.RANGE)
  assert mapped.arg == ThreadAxes(split=outer)
  uops = pipeline.run(ast, renderer, stop="plan_threads", job=job)
  assert job.axes == mapped.arg and job.threads.parallel is not None and job.threads.parallel.loop in uops
  assert job.threads.parallel.loop.arg == outer   # the outer loop is split, as the graph chose
  full = pipeline.Job(renderer, "r")
  pipeline.run(kernel_ast(Tensor.ones(1 << 20).contiguous().sum()), renderer, stop="plan_threads", job=full)
  assert full.axes.chunked is not None and full.threads.reduction is not None   # a full sum: its reduction chunked
  assert full.threads.reduction.loop.arg == full.axes.chunked
  # rendered without a plan, the same kernel runs whole on one thread (no thread pool entry point)
  assert "_task" not in renderer.render("E", uops) and "_task" in renderer.render("E", uops, job.threads)

def test_gpu_targets_map_axes_and_plan_no_threads():
  renderer = CUDARenderer("sm_90a")
  job = pipeline.Job(renderer, "E_4096")
  ast = kernel_ast(Tensor.ones(4096).contiguous() * 3)
  mapped = pipeline.run(ast, renderer, stop="map_axes", job=job)
  assert {u.arg[0] for u in mapped.toposort() if u.op is Ops.SPECIAL} >= {"gidx0", "lidx0"}
  source = pipeline.run(mapped, renderer, start="software_math", job=job)
  assert job.threads is ONE_THREAD and "__global__" in source and "blockIdx.x" in source

def test_unknown_stage_is_a_value_error():
  with pytest.raises(ValueError, match="unknown stage"): pipeline.run(None, Device["CPU"].renderer, stop="emit")

def test_results_through_the_pipeline_match_numpy():
  x = np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32)
  got = (Tensor(x).exp() * 2).sum(1).numpy()
  np.testing.assert_allclose(got, (np.exp(x) * 2).sum(1), rtol=1e-5)

def _imports(path: pathlib.Path) -> set[str]:
  tree = pyast.parse(path.read_text())
  found = {n.module for n in pyast.walk(tree) if isinstance(n, pyast.ImportFrom) and n.module}
  return found | {a.name for n in pyast.walk(tree) if isinstance(n, pyast.Import) for a in n.names}

@pytest.mark.parametrize("package, forbidden", [("renderer", ("kiln.codegen", "kiln.engine", "kiln.schedule",
                                                              "kiln.tensor", "kiln.mixin")),
                                                ("runtime", ("kiln.tensor", "kiln.codegen", "kiln.schedule",
                                                             "kiln.mixin"))])
def test_arrows_point_one_way(package, forbidden):
  for path in sorted((KILN / package).glob("*.py")):
    bad = {m for m in _imports(path) if m.startswith(forbidden)}
    assert not bad, f"{path.name} imports {sorted(bad)}"

def test_every_renderer_writes_through_the_shared_writer():
  from kiln.renderer import KernelWriter
  from kiln.renderer.cstyle import _CKernelWriter
  from kiln.renderer.cuda import _CudaKernelWriter
  from kiln.renderer.llvmir import _LLVMKernelWriter
  from kiln.renderer.ptx import _PTXKernelWriter
  from kiln.renderer.python import _PyKernelWriter
  for writer in (_CKernelWriter, _CudaKernelWriter, _LLVMKernelWriter, _PTXKernelWriter, _PyKernelWriter):
    assert issubclass(writer, KernelWriter) and writer.renderer_name != KernelWriter.renderer_name
    assert "walk" not in vars(writer) and "fresh_name" not in vars(writer)   # one copy, in the base
  bad = [UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), UOp(Ops.REDUCE_AXIS, dtypes.float32, (), (Ops.ADD, (0,)))]
  for renderer in (Device["CPU"].renderer, Device["PYTHON"].renderer, CUDARenderer("sm_90a")):
    with pytest.raises(NotImplementedError, match="cannot render"): renderer.render("bad", bad)

def test_runner_source_is_the_pipelines():
  ast = kernel_ast(Tensor.ones(32, 32).contiguous() * 5)
  runner = get_runner("CPU", ast)
  assert runner.source == pipeline.run(ast, Device["CPU"].renderer, runner.name)
