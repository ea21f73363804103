"""The code generator as one ordered list of stages: a scheduled kernel's AST becomes source code for one renderer.

Every device's kernels go through the same stages; a stage with nothing to do for a target passes its input on.

| stage | takes -> gives |
| --- | --- |
| `lower` | kernel AST (SINK of STOREs over buffer views) -> loops (RANGE) and index math, gathers as plain loads |
| `optimize` | lowered kernel -> the same kernel after the target's actions (`Job.opts`, else its heuristics) |
| `map_axes` | GPU: output ranges -> grid/block indices (SPECIAL), row and grid reductions in shared memory |
| | CPU: the loops the thread pool may split, proven on the graph, named on the SINK (ThreadAxes) |
| `software_math` | EXP2/LOG2/SIN and x//c -> plain ALU graphs where the target has no fast native version |
| `linearize` | graph -> flat uop list: loops opened and closed, accumulators declared (docs/ir.md, stage 4) |
| `vectorize` | renderers with `vectorizes` (CPU): upcast lanes -> vector uops, the thread plan unchanged |
| | renderers with `wide_memory` (GPUs): a thread's adjacent aligned global accesses -> one 8- or 16-byte access |
| `plan_threads` | CPU (`has_threads`): which loop `map_axes` named the pool splits, by the work (`Job.threads`) |
| `render` | uop list -> source code (`Renderer.render(name, uops, threads)`) |

`run(value, renderer, name, start=..., stop=...)` runs a contiguous part of the list, so tests and tools can stop
after any stage and look (`stage_outputs` gives every stage's output). The device-specific choices all come from
the renderer and its target description: nothing here names a device. BEAM (kiln/engine/realize.py) runs the
stages itself around its search: lower, then `optimize` with the actions it tries.

Both targets' threads are mapped on the graph, by one disjointness proof (kiln/codegen/disjoint.py): a GPU's as
SPECIAL index ops (kiln/codegen/gpudims.py), a CPU's as the loops its thread pool may split, named on the SINK
(kiln/codegen/threads.py: the outermost output loop, the reduction's loop; KBLOCK's block loop, scatters, in-place
scans and stores at a fixed address are never named). After linearizing, `plan_threads` picks among them by the
work of the vectorized loop nest (a short outer loop gives way to a chunked reduction; the chunk count comes from the
work) and checks that the nest holds the choice (kiln/codegen/parallel.py: the split loop around the whole kernel,
the reduction's accumulators around its loop); `vectorize` keeps a vector form only if it keeps that plan. The
renderer renders the ThreadPlan it is given and proves nothing.

>>> [s.name for s in STAGES]
['lower', 'optimize', 'map_axes', 'software_math', 'linearize', 'vectorize', 'plan_threads', 'render']
"""
from __future__ import annotations
import operator
from dataclasses import dataclass
from typing import Any, Callable
from kiln.helpers import DEBUG, SPEC, VECTORIZE
from kiln.uop.ops import UOp
from kiln.uop.spec import check_lowered, check_linear
from kiln.renderer import ONE_THREAD, Renderer, ThreadPlan
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.gather import rewrite_gathers
from kiln.codegen.linearizer import linearize as linearize_graph
from kiln.codegen.gpudims import map_axes_to_gpu
from kiln.codegen.transcendental import apply_software_math
from kiln.codegen.opt import optimize_kernel
from kiln.codegen.opt.gpu_heuristic import gpu_optimize
from kiln.codegen.parallel import FEW_OUTER_ITERATIONS, find_parallel_loop, find_split_reduction, streamed_loads
from kiln.codegen.threads import NO_THREAD_AXES, ThreadAxes, map_axes_to_threads, thread_axes
from kiln.codegen.vectorize import vectorize as vectorize_uops
from kiln.codegen.wide_memory import widen_accesses

@dataclass
class Job:
  """What the stages of one kernel share: the renderer (its target description is `renderer.target`), the kernel's
  name, the optimizer's actions (None: the target's heuristics), the thread axes `map_axes` chose (set from the SINK by
  `linearize`) and the thread plan (set by `plan_threads`)."""
  renderer: Renderer
  name: str = "kernel"
  opts: list | None = None
  axes: ThreadAxes = NO_THREAD_AXES
  threads: ThreadPlan = ONE_THREAD

@dataclass(frozen=True)
class Stage:
  """One step of the pipeline: its name, a one-line contract, and the function `run(value, job) -> value`."""
  name: str
  contract: str
  run: Callable[[Any, Job], Any]

# ---------------- the stages ----------------

def lower(ast: UOp, job: Job) -> UOp:
  """A kernel AST lowered to loops and index math, its gathers (one-hot sums over a table) turned into loads: what
  the optimizer and BEAM start from."""
  return rewrite_gathers(lower_kernel(ast))

def optimize(lowered: UOp, job: Job) -> UOp:
  """`lowered` after the optimizer's actions: `job.opts` when given (BEAM's choice, a test's), else the heuristics
  of the renderer's target. A GPU target (`has_local`) gets the GPU actions (LOCAL, GROUP/GROUPTOP, UPCAST as a
  thread's register tile: kiln/codegen/opt/gpu_heuristic.py), which ride on the kernel to `map_axes`."""
  renderer, opts = job.renderer, job.opts
  if renderer.has_local: return gpu_optimize(lowered, renderer.target, opts)
  return optimize_kernel(lowered, opts, renderer.target)

def map_axes(sink: UOp, job: Job) -> UOp:
  """On a GPU target, output axes as grid and block indices (kiln/codegen/gpudims.py); on a CPU target (one with
  `has_threads`), the loops its thread pool may split recorded on the SINK (kiln/codegen/threads.py ThreadAxes);
  elsewhere `sink` as it is."""
  if job.renderer.has_local: return map_axes_to_gpu(sink, job.renderer.target)
  return map_axes_to_threads(sink) if job.renderer.has_threads else sink

def software_math(sink: UOp, job: Job) -> UOp:
  """Software exp2/log2/sin and multiply-shift division where the renderer wants them; checked by kiln/uop/spec.py
  under SPEC."""
  sink = apply_software_math(sink, job.renderer)
  if SPEC: check_lowered(sink)
  return sink

def linearize(sink: UOp, job: Job) -> list[UOp]:
  """The graph as a flat uop list (kiln/codegen/linearizer.py); checked under SPEC. The SINK's thread axes go to
  `job.axes`."""
  uops = linearize_graph(sink)
  job.axes = thread_axes(sink)   # (the SINK is not among the uops: its thread axes ride on the job)
  if SPEC: check_linear(uops)
  return uops

def vectorize(uops: list[UOp], job: Job) -> list[UOp]:
  """For renderers with `vectorizes` (and VECTORIZE on): `uops` with their upcast lanes as vector uops
  (kiln/codegen/vectorize.py), at most one register's lanes a vector (the target's `float_lanes`; wider generic
  vectors are split by the compiler, and gcc does it badly). A split reduction's accumulators become vectors too (one
  partial per lane, combined lane by lane: the same bits). The thread plan must not change: the same split loop, or
  the same split reduction (loop, outer loops, chunk count, accumulator lanes); otherwise the reduction's
  accumulators stay scalar, or else the kernel does. For renderers with `wide_memory` (the GPUs', VECTORIZE on):
  a thread's runs of adjacent global loads and stores as one access of up to the target's `vector_bytes`, where the
  alignment rule of kiln/codegen/wide_memory.py proves them aligned."""
  if not VECTORIZE: return uops
  if job.renderer.wide_memory:
    return widen_accesses(uops, getattr(job.renderer.target, "vector_bytes", 16) or 16)
  if not job.renderer.vectorizes: return uops
  target = job.renderer.target
  plan = thread_plan(uops, job.axes, streams=False)
  shape = _plan_shape(plan)
  keeps = [frozenset()]
  if plan.reduction is not None: keeps.append(frozenset(acc for acc, _ in plan.reduction.accumulators))
  max_lanes = target.float_lanes if target is not None else 16
  byte_dots = target.byte_dot_max if target is not None else 0
  for keep in keeps:
    vector_uops = vectorize_uops(uops, keep, max_lanes, byte_dots)
    if vector_uops is not uops and _plan_shape(thread_plan(vector_uops, job.axes, streams=False)) == shape:
      return vector_uops
  return uops

def plan_threads(uops: list[UOp], job: Job) -> list[UOp]:
  """For renderers with `has_threads`: `job.threads`, how the thread pool runs the kernel (`thread_plan`)."""
  if job.renderer.has_threads: job.threads = thread_plan(uops, job.axes)
  return uops

def render(uops: list[UOp], job: Job) -> str:
  """The kernel's source from the renderer (DEBUG>=6 prints the uops, DEBUG>=4 the source)."""
  if DEBUG >= 6:
    for i, u in enumerate(uops): print(f"{i:4d} {u.op.name:14s} {str(u.dtype):16s} {u.arg!r}")
  source = job.renderer.render(job.name, uops, job.threads)
  if DEBUG >= 4: print(source)
  return source

STAGES: tuple[Stage, ...] = (
  Stage("lower", "kernel AST -> loops and index math, gathers as loads", lower),
  Stage("optimize", "lowered kernel -> the same kernel after the target's optimizer actions", optimize),
  Stage("map_axes", "GPU: output ranges -> grid/block indices; CPU: the loops threads may split", map_axes),
  Stage("software_math", "transcendentals and constant division -> ALU graphs where the target wants", software_math),
  Stage("linearize", "graph -> flat uop list", linearize),
  Stage("vectorize", "upcast lanes -> vector uops (thread plan unchanged); GPU: adjacent lanes' global accesses -> "
        "one wide access", vectorize),
  Stage("plan_threads", "CPU: which loop map_axes named the thread pool splits", plan_threads),
  Stage("render", "uop list -> source code", render),
)
_POSITION = {stage.name: i for i, stage in enumerate(STAGES)}

def run(value: Any, renderer: Renderer, name: str = "kernel", opts: list | None = None, start: str = "lower",
        stop: str = "render", job: Job | None = None) -> Any:
  """Run the stages from `start` to `stop` (both included) on `value`, the output of the stage before `start` (a
  kernel AST for "lower"); returns the output of `stop`. `job` carries the state of an earlier partial run (the
  thread plan) into a later one."""
  if start not in _POSITION or stop not in _POSITION: raise ValueError(f"pipeline.run: unknown stage in {start!r}, "
                                                                       f"{stop!r}; stages: {list(_POSITION)}")
  job = job if job is not None else Job(renderer, name, opts)
  for stage in STAGES[_POSITION[start]:_POSITION[stop] + 1]: value = stage.run(value, job)
  return value

def stage_outputs(ast: UOp, renderer: Renderer, name: str = "kernel", opts: list | None = None) -> dict[str, Any]:
  """Every stage's output for kernel `ast`, by stage name (for tests and for reading what each stage did)."""
  job, outputs, value = Job(renderer, name, opts), {}, ast
  for stage in STAGES: value = outputs[stage.name] = stage.run(value, job)
  return outputs

# ---------------- the CPU's thread plan ----------------

_last_plan: list = [(), None, ONE_THREAD]   # the uops and thread axes thread_plan saw last, and its plan

def thread_plan(uops: list[UOp], axes: ThreadAxes | None = None, streams: bool = True) -> ThreadPlan:
  """How a kernel runs on the CPU's threads, from the loops `map_axes` chose on the graph (`axes`): its outermost
  loop split, or, when that is not chosen or too short, its reduction split into chunks; ONE_THREAD when neither
  applies. The loop nest must hold the choice (kiln/codegen/parallel.py checks it, and counts the work that sets a
  reduction's chunks). A split loop's streamed loads come with it (prefetched by the renderer), unless `streams` is
  False (a plan only compared, never rendered: the scalar list's in `vectorize`). `axes` None (a uop list without
  its graph: tools, tests) proves the loops on `uops` instead."""
  # vectorize plans the list it returns, and plan_threads plans the same list again: the plan is made once
  last = _last_plan[0]
  if _last_plan[1] == axes and len(last) == len(uops) and all(map(operator.is_, last, uops)): plan = _last_plan[2]
  else:
    split, chunked = (axes.split, axes.chunked) if axes is not None else (None, None)
    parallel, reduction = None, None
    if axes is None or split is not None: parallel = find_parallel_loop(uops, split)
    if parallel is None or parallel.loop.src[0].vmax < FEW_OUTER_ITERATIONS:
      if axes is None or chunked is not None: reduction = find_split_reduction(uops, chunked)
      if reduction is not None: parallel = None
    plan = ThreadPlan(parallel, reduction)
    _last_plan[:] = [tuple(uops), axes, plan]
  if streams and plan.parallel is not None and not plan.streams:
    plan = _last_plan[2] = plan._replace(streams=tuple(streamed_loads(uops, plan.parallel.loop)))
  return plan

def _plan_shape(plan: ThreadPlan) -> tuple:
  """What of a thread plan must stay the same when a kernel is vectorized (its threads' results depend on it)."""
  split, red = None, plan.reduction
  if red is not None: split = (red.loop, red.outer, red.chunks, sum(a.dtype.count for a, _ in red.accumulators))
  return (plan.parallel.loop if plan.parallel is not None else None, split)
