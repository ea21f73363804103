"""The thread pool's C library (kiln/runtime/threadpool.py): built in the background when the CPU device opens, once
per process, by several processes at once on one empty kernel cache, and a failed build gives a clear error."""
import os, subprocess, sys, tempfile
import pytest
from kiln.helpers import Context
from kiln.runtime import threadpool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a fresh process on an empty kernel cache: counts the pool library's compiles, checks that opening the device started
# the background build, and that a split kernel on 2 threads gives the one-thread bits
CHILD = r"""
import threading, numpy as np
from kiln.helpers import Context
from kiln.runtime import ops_cpu, threadpool
compiles = []
compile = ops_cpu.ClangCompiler.compile
def counting(self, src):
  if src == threadpool.POOL_SOURCE: compiles.append(threading.current_thread().name)
  return compile(self, src)
ops_cpu.ClangCompiler.compile = counting
ops_cpu.MIN_WORK_PER_THREAD = 1
from kiln import Tensor
x = Tensor(np.arange(1 << 16, dtype=np.float32) % 7)   # opens the CPU device
assert threadpool._library_build.thread is not None, "opening the device did not start the pool library's build"
with Context(THREADS=1): one = (x * 3).sum().numpy()
with Context(THREADS=2): two = [(x * 3).sum().numpy() for _ in range(3)]
assert all(t.tobytes() == one.tobytes() for t in two) and float(one) == float((np.arange(1 << 16) % 7 * 3).sum())
assert compiles in ([], ["kiln-pool-library"]), compiles   # none when the other process stored it first
print(f"ok {len(compiles)}")
"""

def _child(cachedb: str) -> subprocess.Popen:
  env = {**os.environ, "CACHEDB": cachedb, "THREADS": "2", "PYTHONPATH": ROOT}
  return subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)

def test_built_once_in_the_background_by_each_of_two_processes():
  with tempfile.TemporaryDirectory() as tmp:
    children = [_child(os.path.join(tmp, "kernels")) for _ in range(2)]   # both start on the empty cache
    builds = []
    for child in children:
      out, _ = child.communicate(timeout=240)
      assert child.returncode == 0 and out.strip().splitlines()[-1].startswith("ok "), out
      builds.append(int(out.strip().splitlines()[-1].split()[1]))
    assert 1 <= sum(builds) <= 2, builds   # at most once per process, and someone built it

def test_a_failed_build_raises_a_clear_error(monkeypatch):
  build = threadpool._LibraryBuild()
  monkeypatch.setattr(threadpool, "_library_build", build)
  monkeypatch.setattr(threadpool, "POOL_SOURCE", "this is not C;\n")
  monkeypatch.setattr(threadpool, "POOL_LIBRARY_FALLBACKS", [])   # no LLVM-IR pool to fall back on (ops_llvm adds one)
  with Context(CACHELEVEL=0):
    threadpool.build_library_in_background()
    build.thread.join(timeout=120)
    assert build.library is None
    with pytest.raises(RuntimeError, match=r"(?s)thread pool: could not build its C library \(THREADS=1.*error"):
      threadpool.ThreadPool(2)

def test_a_build_in_progress_is_waited_for(monkeypatch):
  build = threadpool._LibraryBuild()
  monkeypatch.setattr(threadpool, "_library_build", build)
  loads = []
  load = threadpool._load_library
  def counting(compiler):
    loads.append(compiler)
    return load(compiler)
  monkeypatch.setattr(threadpool, "_load_library", counting)
  threadpool.build_library_in_background()
  threadpool.build_library_in_background()   # already under way: no second build
  library = threadpool._pool_library()
  assert library is build.library and threadpool._pool_library() is library and len(loads) == 1
