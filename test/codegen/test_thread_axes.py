"""The CPU's axis mapping (kiln/codegen/threads.py): the loops the thread pool may split are chosen on the graph, by
the disjointness proof of kiln/codegen/disjoint.py, and the thread plan after linearizing splits only those."""
from __future__ import annotations
import pytest
from kiln import Tensor, Context
from kiln.device import Device
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops
from kiln.codegen import pipeline
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps
from kiln.codegen.threads import NO_THREAD_AXES, ThreadAxes, map_axes_to_threads, thread_axes
from kiln.schedule.kernelize import create_schedule

F32, I32 = dtypes.float32, dtypes.int32

def glob(n: int, dtype=F32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dtype, (), n)
def const(value, dtype=I32) -> UOp: return UOp.const(dtype, value)
def loop(n: int, axis: int = 0) -> UOp: return UOp(Ops.RANGE, I32, (const(n),), axis)
def load(buf: UOp, index: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype, (buf, index))
def store(buf: UOp, index: UOp, value: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (buf, index, value))
def reduce(value: UOp, *ranges: UOp, op: Ops = Ops.ADD) -> UOp:
  return UOp(Ops.REDUCE, value.dtype, (value, *ranges), op)
def axes_of(*stores: UOp) -> ThreadAxes: return thread_axes(map_axes_to_threads(UOp(Ops.SINK, dtypes.void, stores)))

def test_elementwise_loop_is_chosen():
  out, a, r = glob(0), glob(1), loop(64, 3)
  assert axes_of(store(out, r, load(a, r))) == ThreadAxes(split=3)

def test_row_major_output_chooses_its_outer_loop():
  out, a, rows, cols = glob(0), glob(1), loop(16, 0), loop(64, 1)
  index = rows * 64 + cols
  assert axes_of(store(out, index, load(a, index) * 2.0)) == ThreadAxes(split=0)

def test_store_at_a_fixed_address_is_never_split():
  out, r = glob(0), loop(16)
  assert axes_of(store(out, const(0), r.cast(F32))) == NO_THREAD_AXES

def test_scatter_is_never_split():
  out, idx, r = glob(0), glob(1, I32), loop(16)
  assert axes_of(store(out, load(idx, r), r.cast(F32))) == NO_THREAD_AXES

def test_in_place_scan_is_never_split():
  out, r = glob(0), loop(16)   # out[r] = out[r-1] + 1
  assert axes_of(store(out, r, load(out, r + -1) + 1.0)) == NO_THREAD_AXES

def test_full_reduction_is_chunked():
  out, a, r = glob(0), glob(1), loop(1 << 20, 2)
  assert axes_of(store(out, const(0), reduce(load(a, r), r))) == ThreadAxes(chunked=2)

def test_reduction_whose_outputs_are_read_back_is_not_chunked():
  out, a, rows, r = glob(0), glob(1), loop(4, 0), loop(1024, 1)   # out[i] = out[i] + sum(a[i, :])
  total = reduce(load(a, rows * 1024 + r), r)
  assert axes_of(store(out, rows, load(out, rows) + total)).chunked is None

def test_two_sibling_reductions_are_not_chunked():
  out, a, r1, r2 = glob(0), glob(1), loop(4096, 1), loop(4096, 2)   # a variance after its mean: two loops in a row
  mean = reduce(load(a, r1), r1) * (1 / 4096)
  deviation = load(a, r2) - mean
  assert axes_of(store(out, const(0), reduce(deviation * deviation, r2))).chunked is None

def test_nested_reduction_chunks_the_outer_loop():
  out, a, b, outer, inner = glob(0), glob(1), glob(2), loop(512, 5), loop(64, 4)
  row = reduce(load(a, outer * 64 + inner), inner)
  assert axes_of(store(out, const(0), reduce(row * load(b, outer), outer))).chunked == 5

def test_no_chunks_with_split_reduceop_off():
  out, a, r = glob(0), glob(1), loop(1 << 20)
  with Context(SPLIT_REDUCEOP=0): assert axes_of(store(out, const(0), reduce(load(a, r), r))) == NO_THREAD_AXES

def _matmul(opts: list[Opt]) -> UOp:
  ast = create_schedule([(Tensor.empty(6, 12) @ Tensor.empty(12, 4)).uop]).items[-1].ast
  kernel = Kernel(lower_kernel(ast))
  for opt in opts: kernel.apply(opt)
  return kernel.sink

def test_kblock_block_loop_is_never_split():
  # the block loop right after the row loop: the row loop is split; swapped outermost, the block loop (every
  # iteration updates all the outputs) is refused
  blocked = _matmul([Opt(OptOps.KBLOCK, 2, 4)])
  rows = min((u for u in blocked.toposort() if u.op is Ops.RANGE and u.src[0].arg == 6), key=lambda u: u.arg)
  assert thread_axes(map_axes_to_threads(blocked)).split == rows.arg
  assert thread_axes(map_axes_to_threads(_matmul([Opt(OptOps.KBLOCK, 2, 4), Opt(OptOps.SWAP, 0, 1)]))).split is None

def _cpu_job(t: Tensor, name: str = "k") -> tuple[pipeline.Job, UOp]:
  renderer = Device["CPU"].renderer
  job = pipeline.Job(renderer, name)
  ast = [i for i in t.schedule() if i.ast.op is Ops.SINK][-1].ast
  return job, pipeline.run(ast, renderer, stop="map_axes", job=job)

def test_the_plan_splits_only_what_the_graph_chose():
  job, mapped = _cpu_job(Tensor.ones(4096, 64).contiguous() + 1)
  assert thread_axes(mapped).split is not None
  pipeline.run(mapped, job.renderer, start="software_math", stop="plan_threads", job=job)
  assert job.threads.parallel is not None and job.threads.parallel.loop.arg == thread_axes(mapped).split
  # the same graph without its thread axes runs whole on one thread: nothing after linearizing proves a loop
  bare = pipeline.Job(job.renderer, "k")
  pipeline.run(mapped.replace(arg=None), bare.renderer, start="software_math", stop="plan_threads", job=bare)
  assert bare.threads.parallel is None and bare.threads.reduction is None

def test_the_plan_chunks_only_the_chosen_reduction():
  job, mapped = _cpu_job(Tensor.ones(1 << 20).contiguous().sum())
  chunked = thread_axes(mapped).chunked
  assert chunked is not None and thread_axes(mapped) == ThreadAxes(chunked=chunked)
  pipeline.run(mapped, job.renderer, start="software_math", stop="plan_threads", job=job)
  assert job.threads.reduction is not None and job.threads.reduction.loop.arg == chunked

@pytest.mark.parametrize("make", [lambda: Tensor.ones(64, 64).contiguous().cumsum(1),
                                  lambda: Tensor.ones(4096, 64).contiguous().sum(1)])
def test_gpu_targets_get_no_thread_axes(make):
  from kiln.renderer.cuda import CUDARenderer
  ast = [i for i in make().schedule() if i.ast.op is Ops.SINK][-1].ast
  mapped = pipeline.run(ast, CUDARenderer("sm_90a"), stop="map_axes")
  assert thread_axes(mapped) == NO_THREAD_AXES
