"""BEAM search: it finds kernels at least as fast as the heuristics' (by its own timer), never changes results,
refuses a winner that computes something else, and its sqlite cache round-trips across processes."""
from __future__ import annotations
import multiprocessing, os, subprocess, sys, textwrap, time
import numpy as np
import pytest
from kiln import Tensor
from kiln.device import Device
from kiln.helpers import Context
from kiln.schedule.kernelize import create_schedule
from kiln.engine.realize import run_schedule, compile_lowered
from kiln.codegen.lowerer import lower_kernel
from kiln.codegen.opt import Kernel, Opt, OptOps, optimize_kernel
from kiln.codegen.opt import search
from kiln.codegen.opt.search import beam_search, cache_get, cache_put, choose_opts, kernel_key

@pytest.fixture
def own_cache(tmp_path, monkeypatch):
  """A fresh, empty cache directory (the BEAM database lives there)."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  return tmp_path

def _item(t: Tensor):
  """The schedule item of `t`'s last kernel, the kernels before it run, its buffers allocated."""
  items = create_schedule([t.uop]).items
  run_schedule(items[:-1])
  for b in items[-1].bufs: b.allocate()
  return items[-1]

def _runner_for(item):
  """run_sink(sink, bufs) as the realize path builds it: compile once per candidate, run on `bufs`."""
  compiled = {}
  compiles = []
  def run_sink(sink, bufs):
    if sink not in compiled:
      compiles.append(sink)
      compiled[sink] = compile_lowered(item.bufs[0].device, "beam_test", sink)
    return compiled[sink](bufs, {}, wait=True) if bufs is not None else 0.0
  return run_sink, compiles

def _matmul(n=32, k=48, m=40, seed=0):
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  return Tensor(a).realize() @ Tensor(b).realize(), a @ b

def test_kernel_key_is_stable_and_distinguishes_kernels():
  t1, _ = _matmul(seed=1)
  t2, _ = _matmul(seed=2)   # same kernel, other data
  t3, _ = _matmul(m=24)
  k1, k2, k3 = (kernel_key(lower_kernel(_item(t).ast)) for t in (t1, t2, t3))
  assert k1 == k2 and k1 != k3
  code = textwrap.dedent("""
    import numpy as np
    from kiln import Tensor
    from kiln.schedule.kernelize import create_schedule
    from kiln.codegen.lowerer import lower_kernel
    from kiln.codegen.opt.search import kernel_key
    t = Tensor(np.ones((32, 48), np.float32)).realize() @ Tensor(np.ones((48, 40), np.float32)).realize()
    print(kernel_key(lower_kernel(create_schedule([t.uop]).items[-1].ast)))
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == k1   # another process (other UOp hashes) gives the same key

def _put_many(args):
  root, start = args
  import os
  os.environ["XDG_CACHE_HOME"] = root
  for i in range(start, start + 20): cache_put(f"k{i % 25}", [Opt(OptOps.UPCAST, 0, i % 7 + 2)])
  return True

def test_cache_round_trip_and_concurrent_writers(own_cache):
  opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.SWAP, 0, 1)]
  assert cache_get("some kernel") is None
  cache_put("some kernel", opts)
  assert cache_get("some kernel") == opts
  with multiprocessing.get_context("spawn").Pool(3) as pool:
    assert all(pool.map(_put_many, [(str(own_cache), s) for s in (0, 5, 10)]))
  for i in range(25):
    got = cache_get(f"k{i}")
    assert got is not None and len(got) == 1 and got[0].op is OptOps.UPCAST
  with Context(CACHELEVEL=0): assert cache_get("some kernel") is None

def test_beam_search_follows_the_timer():
  t, _ = _matmul()
  sink = lower_kernel(_item(t).ast)
  # a made-up timer: more upcast work is faster, so the search must keep extending the best kernel
  def fake_timer(kernels, deadline):
    return [1.0 / (1 + sum(o.arg for o in k.applied if o.op is OptOps.UPCAST)) for k in kernels]
  best = beam_search(sink, fake_timer, width=2, timeout_s=30)
  assert sum(o.arg for o in best.applied if o.op is OptOps.UPCAST) >= 16
  replayed = Kernel(sink)
  for opt in best.applied: replayed.apply(opt)
  assert replayed.sink is best.sink   # the recorded actions rebuild the same kernel (what the cache relies on)

def test_beam_search_keeps_to_its_timeout():
  t, _ = _matmul()
  sink = lower_kernel(_item(t).ast)
  runs, compiled = [], []
  def slow_run(sink):   # 10 ms per run: a round of ~30 candidates would take over a second
    time.sleep(0.01)
    runs.append(sink)
    return 1.0 / len(runs)   # every new run looks faster: only the deadline stops the search
  timer = search.make_timer(lambda sinks: compiled.extend(sinks), slow_run)
  start = time.perf_counter()
  best = beam_search(sink, timer, width=2, timeout_s=0.3)
  elapsed = time.perf_counter() - start
  batch = 2 * (os.cpu_count() or 1)
  # the two default candidates, then at most one batch started before the deadline: 4 runs of 10 ms each
  assert elapsed < 0.3 + 0.04 * (2 + batch) + 0.5, f"the search took {elapsed:.2f} s with a 0.3 s timeout"
  assert len(compiled) < 2 + 2 * batch + batch   # rounds were cut short, not compiled whole
  assert best.sink in set(compiled)

def test_choose_opts_times_real_candidates_and_caches(own_cache, monkeypatch):
  t, want = _matmul()
  item = _item(t)
  sink = lower_kernel(item.ast)
  run_sink, compiles = _runner_for(item)
  before = [b.numpy().copy() for b in item.bufs]
  with Context(BEAM_TIMEOUT=20): opts = choose_opts(Device[item.bufs[0].device], sink, item.bufs, run_sink, 2)
  assert len(compiles) >= 3   # it compiled and timed candidates
  for b, old in zip(item.bufs, before): np.testing.assert_array_equal(b.numpy(), old)   # real buffers untouched
  # the chosen kernel computes the matmul
  out_sink = optimize_kernel(sink, opts)
  run_sink(out_sink, item.bufs)
  np.testing.assert_allclose(item.bufs[0].numpy().reshape(want.shape), want, rtol=1e-4, atol=1e-4)
  # a second search of the same kernel is a cache hit: no search at all
  monkeypatch.setattr(search, "beam_search", lambda *a, **k: pytest.fail("searched despite a cached answer"))
  assert choose_opts(Device[item.bufs[0].device], sink, item.bufs, run_sink, 2) == opts

def test_a_winner_that_changes_the_result_is_refused(own_cache, capsys):
  t, _ = _matmul()
  item = _item(t)
  sink = lower_kernel(item.ast)
  good_run, _ = _runner_for(item)
  def lying_run(candidate, bufs):   # optimized candidates are fastest but write garbage
    if bufs is None or candidate is sink: return good_run(candidate, bufs) if bufs is not None else 0.0
    good_run(candidate, bufs)
    bufs[0].copyin(memoryview(np.full(bufs[0].size, 7, np.float32).tobytes()))
    return 0.0
  with Context(BEAM_TIMEOUT=5): opts = choose_opts(Device[item.bufs[0].device], sink, item.bufs, lying_run, 2)
  assert "changed the kernel's result" in capsys.readouterr().out
  assert cache_get(search.search_key(Device[item.bufs[0].device], sink, item.bufs, 2)) is None   # not cached
  heuristic = Kernel(sink)
  from kiln.codegen.opt import heuristic_opts
  assert opts == heuristic_opts(heuristic)

@pytest.mark.parametrize("shape", [(16, 24, 20), (7, 9, 5)])
def test_beam_through_realize_matches_numpy(own_cache, shape):
  n, k, m = shape
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  with Context(BEAM=2, BEAM_TIMEOUT=10):
    got = ((Tensor(a) @ Tensor(b)).relu() + 1).sum(axis=1).numpy()
  np.testing.assert_allclose(got, (np.maximum(a @ b, 0) + 1).sum(axis=1), rtol=1e-4, atol=1e-3)
  assert (own_cache / "kiln" / "beam.db").exists()
