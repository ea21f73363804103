"""CPU kernels split across the thread pool give the same bits as one thread (kiln/runtime/threadpool.py,
kiln/codegen/parallel.py). Every launch is split here, however small (MIN_WORK_PER_THREAD patched to 1)."""
import ctypes, os, signal, threading
import numpy as np
import pytest
from kiln import Tensor, TinyJit
from kiln.dtype import dtypes
from kiln.helpers import Context
from kiln.uop.ops import UOp, Ops
from kiln.codegen import parallel
from kiln.codegen.parallel import find_parallel_loop, find_split_reduction
from kiln.engine import realize
from kiln.runtime import ops_cpu, threadpool

THREAD_COUNTS = (2, 3, 4)
I32, F32 = dtypes.int32, dtypes.float32

@pytest.fixture(autouse=True)
def split_every_launch(monkeypatch):
  monkeypatch.setattr(ops_cpu, "MIN_WORK_PER_THREAD", 1)

@pytest.fixture
def pool_launches(monkeypatch):
  """Counts launches the pool runs from Python (eager kernels)."""
  count = [0]
  original = threadpool.ThreadPool.run
  def counting_run(self, *args):
    count[0] += 1
    return original(self, *args)
  monkeypatch.setattr(threadpool.ThreadPool, "run", counting_run)
  return count

def rng(seed: int = 0) -> np.random.Generator:
  return np.random.default_rng(seed)

def assert_same_bits_for_every_thread_count(compute) -> None:
  """`compute()` (returning a NumPy array) gives identical bytes with THREADS=1 and each of THREAD_COUNTS."""
  with Context(THREADS=1): expected = compute()
  for threads in THREAD_COUNTS:
    with Context(THREADS=threads): got = compute()
    assert got.shape == expected.shape and got.dtype == expected.dtype, (threads, got.shape, expected.shape)
    if got.tobytes() != expected.tobytes():
      diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
      raise AssertionError(f"THREADS={threads} differs from THREADS=1 for shape {got.shape}: "
                           f"{np.count_nonzero(diff)} elements, worst {diff.max()}")

A = rng(0).standard_normal((37, 53)).astype(np.float32)
B = rng(1).standard_normal((53, 29)).astype(np.float32)

@pytest.mark.parametrize("name, compute", [
  ("elementwise", lambda: (Tensor(A) * 2 + Tensor(A).exp()).numpy()),
  ("broadcast", lambda: (Tensor(A) - Tensor(A).max(axis=1, keepdim=True)).numpy()),
  ("matmul", lambda: (Tensor(A) @ Tensor(B)).numpy()),
  ("row_sum", lambda: Tensor(A).sum(axis=1).numpy()),
  ("column_sum", lambda: Tensor(A).sum(axis=0).numpy()),
  ("full_sum", lambda: Tensor(A).sum().numpy()),
  ("softmax", lambda: Tensor(A).softmax(axis=1).numpy()),
  ("cumsum_rows", lambda: Tensor(A).cumsum(axis=1).numpy()),
  ("cumsum_columns", lambda: Tensor(A).cumsum(axis=0).numpy()),
  ("argmax", lambda: Tensor(A).argmax(axis=1).numpy()),
  ("int_math", lambda: ((Tensor(np.arange(999, dtype=np.int32)) * 7) // 3 % 5).numpy()),
  ("conv2d", lambda: Tensor(rng(2).standard_normal((2, 3, 9, 9)).astype(np.float32)).conv2d(
    Tensor(rng(3).standard_normal((4, 3, 3, 3)).astype(np.float32)), padding=1).numpy()),
])
def test_ops_match_one_thread(name, compute, pool_launches):
  assert_same_bits_for_every_thread_count(compute)
  if name != "full_sum": assert pool_launches[0] > 0, f"{name}: no kernel ran on the pool"

@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (1, 5), (3, 1), (2, 3)])
def test_sizes_smaller_than_the_thread_count(shape):
  data = rng(4).standard_normal(shape).astype(np.float32)
  assert_same_bits_for_every_thread_count(lambda: (Tensor(data) * 3 + 1).numpy())
  assert_same_bits_for_every_thread_count(lambda: Tensor(data).sum(axis=-1).numpy())
  with Context(THREADS=4): np.testing.assert_allclose((Tensor(data) * 3 + 1).numpy(), data * 3 + 1, rtol=1e-6)

def test_assign_and_setitem_in_place():
  def compute() -> np.ndarray:
    target = Tensor(A).contiguous().realize()
    target[3:9] = 2.0
    target[:, 5] = Tensor(A)[:, 6]
    target += 1
    target[1:] = target[:-1] * 2          # reads and writes the same buffer, shifted by one row
    target.assign(target.flip(1)).realize()
    return target.numpy()
  assert_same_bits_for_every_thread_count(compute)
  with Context(THREADS=3):
    expected = A.copy()
    expected[3:9] = 2.0
    expected[:, 5] = A[:, 6]
    expected += 1
    expected[1:] = expected[:-1].copy() * 2
    np.testing.assert_allclose(compute(), expected[:, ::-1], rtol=1e-6)

def test_tinyjit_graph_runs_split_kernels():
  def step(x: Tensor, w: Tensor) -> Tensor:
    return ((x @ w).relu() + 1).sum(axis=1).realize()
  inputs = [rng(5 + i).standard_normal((37, 53)).astype(np.float32) for i in range(4)]
  results = {}
  for threads in (1, 3):
    with Context(THREADS=threads):
      jitted = TinyJit(step)
      results[threads] = [jitted(Tensor(x), Tensor(B)).numpy() for x in inputs]
      graphs = [launch for launch in jitted.captured._launches if hasattr(launch, "threads")]
      assert graphs and all(g.threads == threads for g in graphs), f"THREADS={threads}: graphs {graphs}"
      if threads > 1: assert all(g.pool is threadpool.pool_for(threads) for g in graphs)
  for one, many in zip(results[1], results[3]): assert one.tobytes() == many.tobytes()
  np.testing.assert_allclose(results[3][-1], np.maximum(inputs[-1] @ B, 0).sum(axis=1) + 29, rtol=1e-4)

def test_chunk_count_grows_with_work():
  assert threadpool.chunks_for(1 << 30, 1) == 1
  assert threadpool.chunks_for(0, 2) == 2   # never fewer chunks than threads
  assert threadpool.chunks_for(threadpool.MIN_WORK_PER_CHUNK * 5, 2) == 5
  assert threadpool.chunks_for(1 << 30, 3) == 3 * threadpool.CHUNKS_PER_THREAD

@pytest.mark.parametrize("name, compute", [
  ("elementwise", lambda: (Tensor(A) * 2 + Tensor(A).exp()).numpy()),
  ("matmul", lambda: (Tensor(A) @ Tensor(B)).numpy()),
  ("row_sum", lambda: Tensor(A).sum(axis=1).numpy()),
  ("tiny", lambda: (Tensor(np.arange(3, dtype=np.float32)) + 1).numpy()),   # more chunks than iterations
])
def test_several_chunks_per_thread_match_one_thread(name, compute, monkeypatch, pool_launches):
  monkeypatch.setattr(threadpool, "MIN_WORK_PER_CHUNK", 1)
  assert_same_bits_for_every_thread_count(compute)
  assert pool_launches[0] > 0, f"{name}: no launch went through the pool"

def test_tinyjit_graph_runs_several_chunks_per_thread(monkeypatch):
  monkeypatch.setattr(threadpool, "MIN_WORK_PER_CHUNK", 1)
  def step(x: Tensor, w: Tensor) -> Tensor:
    return ((x @ w).relu() * 3).sum(axis=1).realize()
  x = rng(9).standard_normal((37, 53)).astype(np.float32)
  with Context(THREADS=1): expected = TinyJit(step)
  with Context(THREADS=1): one = [expected(Tensor(x), Tensor(B)).numpy() for _ in range(3)]
  with Context(THREADS=2):
    jitted = TinyJit(step)
    two = [jitted(Tensor(x), Tensor(B)).numpy() for _ in range(3)]
    programs = [item.runner.program for g in jitted.captured._launches if hasattr(g, "items") for item in g.items]
    split = [p for p in programs if p.threads() == 2 and not p.chunks]
    assert split and all(p.pool_chunks() == min(2 * threadpool.CHUNKS_PER_THREAD, p.work) for p in split)
  assert one[-1].tobytes() == two[-1].tobytes()

def test_pool_survives_many_launches():
  data = rng(6).standard_normal(101).astype(np.float32)
  with Context(THREADS=4):
    x = Tensor(data).realize()
    for _ in range(300): x = (x * 0.5 + 1).realize()
    result = x.numpy()
  with Context(THREADS=1):
    y = Tensor(data).realize()
    for _ in range(300): y = (y * 0.5 + 1).realize()
    assert result.tobytes() == y.numpy().tobytes()

def test_pool_shared_by_python_threads():
  errors = []
  def work(seed: int) -> None:
    try:
      data = rng(seed).standard_normal((64, 33)).astype(np.float32)
      for _ in range(10): np.testing.assert_allclose(Tensor(data).sum(axis=1).numpy(), data.sum(axis=1), rtol=1e-5)
    except Exception as e: errors.append(e)   # noqa: BLE001  (reported below)
  with Context(THREADS=3):
    Tensor(A).sum(axis=1).numpy()   # compile once first: the threads then only launch
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    for t in threads: t.start()
    for t in threads: t.join(timeout=120)
  assert not errors, errors

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_pool():
  with Context(THREADS=2):
    expected = (Tensor(A) * 3).sum(axis=1).numpy()   # starts the parent's pool
    pid = os.fork()
    if pid == 0:   # the child: the parent's workers do not exist here, so a new pool must start
      signal.alarm(60)
      try: ok = np.array_equal((Tensor(A) * 3).sum(axis=1).numpy(), expected)
      except BaseException: ok = False   # noqa: BLE001  (the exit code reports it)
      os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
  assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"

def test_pool_run_directly():
  from kiln.device import Device
  from kiln.codegen.pipeline import thread_plan
  out, a, r = glob(0), glob(1), loop(1000)
  value = load(a, r)
  doubled = alu(Ops.MUL, value, const(2.0, F32))
  uops = [out, a, r, value, doubled, store(out, r, doubled), end(r)]
  dev = Device["CPU"]
  program = dev.runtime("pool_direct", dev.compiler.compile_cached(dev.renderer.render("pool_direct", uops, thread_plan(uops))))
  assert program.task is not None and program.work == 3000
  src, dst = np.arange(1000, dtype=np.float32), np.zeros(1000, np.float32)
  pool = threadpool.ThreadPool(3)
  try:
    assert pool.lib.kiln_pool_size(pool.handle) == 3
    bufs, vals = (ctypes.c_void_p * 2)(dst.ctypes.data, src.ctypes.data), (ctypes.c_int * 1)()
    for launch in range(1000):
      dst[:] = 0
      pool.run(program.task, bufs, vals, 1 + launch % 3)
      if launch % 97 == 0: np.testing.assert_array_equal(dst, src * 2)
    np.testing.assert_array_equal(dst, src * 2)
  finally: pool.close()
  assert not pool.alive

@pytest.mark.parametrize("value", [-1])
def test_bad_thread_count(value):
  with Context(THREADS=value), pytest.raises(ValueError, match="THREADS"): threadpool.thread_count()

# ---- the analysis refuses loops whose iterations could touch each other's memory ----

def glob(n: int, dtype=F32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dtype, (), n)
def const(value, dtype=I32) -> UOp: return UOp.const(dtype, value)
def alu(op: Ops, *src: UOp) -> UOp: return UOp(op, src[0].dtype, src)
def loop(n: int, axis: int = 0) -> UOp: return UOp(Ops.RANGE, I32, (const(n),), axis)
def end(r: UOp) -> UOp: return UOp(Ops.ENDRANGE, dtypes.void, (r,))
def load(buf: UOp, index: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype, (buf, index))
def store(buf: UOp, index: UOp, value: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (buf, index, value))

def test_elementwise_loop_is_split():
  out, a, r = glob(0), glob(1), loop(16)
  value = load(a, r)
  assert find_parallel_loop([out, a, r, value, store(out, r, value), end(r)]) is not None

def test_tiled_loop_is_split():
  out, r, inner = glob(0), loop(16), loop(4, 1)
  index = alu(Ops.ADD, alu(Ops.MUL, r, const(4)), inner)
  assert find_parallel_loop([out, r, inner, store(out, index, const(1.0, F32)), end(inner), end(r)]) is not None

def test_overlapping_blocks_are_not_split():
  out, r, inner = glob(0), loop(16), loop(8, 1)   # iteration i writes [4i, 4i+7]: neighbours overlap
  index = alu(Ops.ADD, alu(Ops.MUL, r, const(4)), inner)
  assert find_parallel_loop([out, r, inner, store(out, index, const(1.0, F32)), end(inner), end(r)]) is None

def test_store_at_a_fixed_address_is_not_split():
  out, r = glob(0), loop(16)
  assert find_parallel_loop([out, r, store(out, const(0), const(1.0, F32)), end(r)]) is None

def test_reading_the_previous_iterations_output_is_not_split():
  out, r = glob(0), loop(16)   # out[r] = out[r-1] + 1: a scan in place
  previous = load(out, alu(Ops.ADD, r, const(-1)))
  value = alu(Ops.ADD, previous, const(1.0, F32))
  assert find_parallel_loop([out, r, previous, value, store(out, r, value), end(r)]) is None

def test_in_place_update_of_the_same_element_is_split():
  out, r = glob(0), loop(16)   # out[r] = out[r] + 1
  current = load(out, r)
  value = alu(Ops.ADD, current, const(1.0, F32))
  assert find_parallel_loop([out, r, current, value, store(out, r, value), end(r)]) is not None

def test_data_dependent_store_index_is_not_split():
  out, idx, r = glob(0), glob(1, I32), loop(16)   # out[idx[r]] = 1: a scatter
  where = load(idx, r)
  assert find_parallel_loop([out, idx, r, where, store(out, where, const(1.0, F32)), end(r)]) is None

def test_accumulator_across_the_loop_is_not_split():
  out, a, r = glob(0), glob(1), loop(16)   # a full reduction: the accumulator is declared outside the loop
  acc = UOp(Ops.DEFINE_ACC, F32, (const(0.0, F32),), 0)
  value = load(a, r)
  update = UOp(Ops.ASSIGN, F32, (acc, alu(Ops.ADD, acc, value)))
  uops = [out, a, acc, r, value, update.src[1], update, end(r), store(out, const(0), update)]
  assert find_parallel_loop(uops) is None

def test_index_through_division_is_not_split():
  out, r = glob(0), loop(16)   # out[r // 2]: two iterations write each element
  index = alu(Ops.IDIV, r, const(2))
  assert find_parallel_loop([out, r, index, store(out, index, const(1.0, F32)), end(r)]) is None

def test_symbolic_kernels_under_tinyjit(pool_launches):
  from kiln import Variable
  xk_data = rng(8).standard_normal((1, 1, 4, 16)).astype(np.float32)
  q_data = rng(9).standard_normal((1, 4, 1, 16)).astype(np.float32)
  def run_steps() -> list[np.ndarray]:
    cache = Tensor.zeros(1, 32, 4, 16).contiguous().realize()
    @TinyJit
    def step(xk: Tensor, q: Tensor, start_pos) -> Tensor:
      cache[:, start_pos:start_pos + 1].assign(xk)
      keys = cache[:, 0:start_pos + 1]
      return (q @ keys.transpose(1, 2).transpose(2, 3)).softmax(-1).realize()
    xk, q = Tensor(xk_data).realize(), Tensor(q_data).realize()
    return [step(xk * (pos + 1), q, Variable("start_pos", 0, 31).bind(pos)).numpy() for pos in range(6)]
  with Context(THREADS=1): expected = run_steps()
  with Context(THREADS=3): got = run_steps()
  assert pool_launches[0] > 0
  for pos, (one, many) in enumerate(zip(expected, got)):
    assert one.shape == (1, 4, 1, pos + 1) and one.tobytes() == many.tobytes(), f"start_pos={pos}"

# ---- split reductions: a reduce loop cut into a fixed number of chunks, partials combined in chunk order ----

@pytest.fixture
def small_chunks(monkeypatch):
  """Split reductions from a few hundred uops of work on (the shapes below are used only here: a kernel rendered
  with the default chunk work would be reused from the compile cache)."""
  monkeypatch.setattr(parallel, "REDUCE_CHUNK_WORK", 256)

FLOATS = rng(10).standard_normal(20011).astype(np.float32)
INTS = rng(11).integers(-1000, 1000, 30013).astype(np.int32)
CUBE = rng(12).standard_normal((61, 5, 47)).astype(np.float32)
TALL = rng(13).standard_normal((1031, 6)).astype(np.float32)

@pytest.mark.parametrize("name, compute, reference", [
  ("sum", lambda: Tensor(FLOATS).sum().numpy(), lambda: FLOATS.astype(np.float64).sum()),
  ("max", lambda: Tensor(FLOATS).max().numpy(), lambda: FLOATS.max()),
  ("min", lambda: Tensor(FLOATS).min().numpy(), lambda: FLOATS.min()),
  ("sum_of_squares", lambda: (Tensor(FLOATS) * Tensor(FLOATS)).sum().numpy(),
   lambda: (FLOATS.astype(np.float64) ** 2).sum()),
  ("mean_all_but_one_axis", lambda: Tensor(CUBE).mean(axis=(0, 2)).numpy(),
   lambda: CUBE.astype(np.float64).mean(axis=(0, 2))),
  ("column_sum_few_columns", lambda: Tensor(TALL).sum(axis=0).numpy(), lambda: TALL.astype(np.float64).sum(axis=0)),
  ("prod", lambda: (Tensor(FLOATS[:4001]) * 0.001 + 1).prod().numpy(),
   lambda: (FLOATS[:4001].astype(np.float64) * 0.001 + 1).prod()),
])
def test_float_reductions_are_split(name, compute, reference, small_chunks, pool_launches):
  assert_same_bits_for_every_thread_count(compute)
  assert pool_launches[0] > 0, f"{name}: no kernel ran on the pool"
  with Context(THREADS=3): np.testing.assert_allclose(compute(), reference(), rtol=2e-5, atol=1e-5)

@pytest.mark.parametrize("name, compute, reference", [
  ("sum", lambda: Tensor(INTS).sum().numpy(), lambda: INTS.sum(dtype=np.int32)),
  ("max", lambda: Tensor(INTS).max().numpy(), lambda: INTS.max()),
  ("min", lambda: Tensor(INTS).min().numpy(), lambda: INTS.min()),
  ("wrapping_sum", lambda: (Tensor(INTS) * 1_000_003).sum(dtype=dtypes.int32).numpy(),
   lambda: (INTS * np.int32(1_000_003)).sum(dtype=np.int32)),
  ("int64_sum", lambda: Tensor(INTS.astype(np.int64) << 30).sum().numpy(), lambda: (INTS.astype(np.int64) << 30).sum()),
  ("any", lambda: (Tensor(INTS) == 999).any().numpy(), lambda: (INTS == 999).any()),
  ("all", lambda: (Tensor(INTS) > -1000).all().numpy(), lambda: (INTS > -1000).all()),
])
def test_int_reductions_are_exact(name, compute, reference, small_chunks, pool_launches):
  for threads in (1, *THREAD_COUNTS):
    with Context(THREADS=threads): got = compute()
    assert got.dtype == reference().dtype and got == reference(), f"{name} THREADS={threads}: {got} != {reference()}"
  assert pool_launches[0] > 0, f"{name}: no kernel ran on the pool"

def test_split_reduction_repeats_exactly(small_chunks):
  with Context(THREADS=4):
    results = {Tensor(FLOATS).sum().numpy().tobytes() for _ in range(20)}
  assert len(results) == 1, "the same sum gave different bits on different launches"

def test_split_reductions_under_tinyjit(small_chunks):
  def step(x: Tensor) -> Tensor:
    return (x.sum() + x.max() + x.reshape(61, 5, 47).mean(axis=(0, 2)).sum()).realize()
  inputs = [rng(20 + i).standard_normal(CUBE.size).astype(np.float32) for i in range(4)]
  results = {}
  for threads in (1, 3):
    with Context(THREADS=threads):
      jitted = TinyJit(step)
      results[threads] = [jitted(Tensor(x)).numpy() for x in inputs]
      graphs = [launch for launch in jitted.captured._launches if hasattr(launch, "threads")]
      assert graphs, f"THREADS={threads}: no graph"
      if threads > 1: assert any(g.scratch for g in graphs), "no split reduction in the graph"
  for one, many in zip(results[1], results[3]): assert one.tobytes() == many.tobytes()
  x = inputs[-1].astype(np.float64)
  expected = x.sum() + x.max() + x.reshape(61, 5, 47).mean(axis=(0, 2)).sum()
  np.testing.assert_allclose(results[3][-1], expected, rtol=1e-5)

def full_sum_uops(init: float = 0.0, op: Ops = Ops.ADD, extra=lambda acc, update: []) -> list[UOp]:
  out, a, r = glob(0), glob(1), loop(1 << 20)
  acc = UOp(Ops.DEFINE_ACC, F32, (const(init, F32),), 0)
  value = load(a, r)
  update = alu(op, acc, value)
  assign = UOp(Ops.ASSIGN, F32, (acc, update))
  return [out, a, acc, r, value, update, *extra(acc, update), assign, end(r), store(out, const(0), assign)]

def test_full_reduction_is_found():
  found = find_split_reduction(full_sum_uops())
  assert found is not None and 1 < found.chunks <= parallel.MAX_REDUCE_CHUNKS and found.outer_iterations == 1
  assert find_split_reduction(full_sum_uops(float("-inf"), Ops.MAX)) is not None

def test_reduction_not_starting_at_the_identity_is_not_split():
  assert find_split_reduction(full_sum_uops(init=1.0)) is None   # each chunk would add the 1 again
  assert find_split_reduction(full_sum_uops(init=0.0, op=Ops.MAX)) is None

def test_running_value_read_in_the_loop_is_not_split():
  out = glob(0)   # out[0] = acc inside the loop: a store of a running value
  assert find_split_reduction(full_sum_uops(extra=lambda acc, update: [store(out, const(0), update)])) is None
  # the running total used to compute something else in the loop
  assert find_split_reduction(full_sum_uops(extra=lambda acc, update: [alu(Ops.MUL, update, const(2.0, F32))])) is None

def test_small_reduction_is_not_split():
  out, a, r = glob(0), glob(1), loop(100)
  acc = UOp(Ops.DEFINE_ACC, F32, (const(0.0, F32),), 0)
  update = alu(Ops.ADD, acc, load(a, r))
  assign = UOp(Ops.ASSIGN, F32, (acc, update))
  uops = [out, a, acc, r, update.src[1], update, assign, end(r), store(out, const(0), assign)]
  assert find_split_reduction(uops) is None

def test_outer_loop_reading_its_own_output_is_not_split():
  out, a, o, r = glob(0), glob(1), loop(4), loop(1 << 20, 1)   # out[o] = out[o-1] + sum(a): needs the previous store
  acc = UOp(Ops.DEFINE_ACC, F32, (const(0.0, F32),), 0)
  update = alu(Ops.ADD, acc, load(a, r))
  assign = UOp(Ops.ASSIGN, F32, (acc, update))
  previous = load(out, alu(Ops.ADD, o, const(-1)))
  total = alu(Ops.ADD, previous, assign)
  uops = [out, a, o, acc, r, update.src[1], update, assign, end(r), previous, total, store(out, o, total), end(o)]
  assert find_split_reduction(uops) is None
  assert find_split_reduction([u for u in uops if u is not previous and u is not total][:-2]
                              + [store(out, o, assign), end(o)]) is not None

def test_a_programs_thread_count_follows_the_settings_it_is_asked_under(monkeypatch):
  # threads() is remembered per program: a new THREADS or MIN_WORK_PER_THREAD must still be seen
  t = Tensor(A) * 2
  item = t.schedule()[-1]
  program = realize.get_runner(item.bufs[0].device, item.ast).program
  assert program.task is not None
  for threads in (1, 3, 2, 3):
    with Context(THREADS=threads): assert program.threads() == threads
  monkeypatch.setattr(ops_cpu, "MIN_WORK_PER_THREAD", program.work)
  with Context(THREADS=3): assert program.threads() == 1
