"""A persistent pool of worker threads that runs split CPU kernels (docs/developer.md, "Threads").

The pool is a small C library (POOL_SOURCE), compiled once with the CPU device's compiler, cached on disk like a
kernel and loaded with ctypes. `kiln_pool_run(pool, task, bufs, vals, n)` runs `task(bufs, vals, chunk, n)` for every
chunk 0..n-1, each on whichever thread claims it first (the caller claims chunks too, so a worker that a busy machine
has not scheduled delays nothing), and returns when all have finished. Workers wait for the next launch by
spinning for up to SPIN_NS (so back-to-back kernels find them awake; a launch through the pool costs 3-6 us more than
a direct call on a 16-core machine) and then sleep on a condition variable (an idle process uses no CPU). A spinning
thread yields its core every few microseconds (`sched_yield`): on a machine with more runnable threads than cores a
spinning worker would otherwise take time slices from the caller it waits for (measured on the 2-core machine with
another process busy: SmolLM2 decode on 2 threads 23-32 -> 38-56 tokens/s). A launch is cut into a few chunks per
thread (`chunks_for`), so a thread the OS deschedules holds up only a small part of it. ctypes releases the GIL during
the call.

`THREADS=n` sets the number of threads (default: the cores this process may run on); `THREADS=1` never starts a
worker. A forked child gets fresh pools (the parent's workers do not exist in it).
"""
from __future__ import annotations
import ctypes, functools, os, threading
from kiln.helpers import ContextVar

THREADS = ContextVar("THREADS", 0, "threads a CPU kernel's outermost loop is split across (0: one per core; 1: none)")
# a split launch gives each thread at least this many uops (bench/bench_threads.py). On a 16-core machine the pool
# costs 3-6 us per launch, and with scalar C a kernel of about 200,000 uops (30-60 us on one core) was where splitting
# started to pay. Vector code runs several times more uops per microsecond, and on the 2-core EPYC shared with other
# work (load 1-3) the pool lost on every kernel below about a million uops (256 KB layernorm rows of the anchors'
# transformer: 10 us on one thread, 17-24 us on two), so each thread now gets at least half a million
MIN_WORK_PER_THREAD = 1 << 19
# a split launch is cut into up to CHUNKS_PER_THREAD chunks per thread, each of at least MIN_WORK_PER_CHUNK uops: on a
# busy machine a worker the OS has descheduled holds only a small chunk, and the threads still running take over the
# rest (with one chunk per thread the whole launch waits for it). Measured on the 2-core EPYC under load 2-4
# (interleaved, best of 6): 8 per thread against 4, conv2d 16x64x56x56 33-48 -> 29-35 ms, matmul 512 2.3-3.4 ->
# 2.1-2.8 ms; 16 per thread was no better than 4
CHUNKS_PER_THREAD = 8
MIN_WORK_PER_CHUNK = 1 << 15

def chunks_for(work: int, threads: int) -> int:
  """How many chunks a split launch of `work` uops on `threads` threads runs: at least one per thread, up to
  CHUNKS_PER_THREAD per thread while each keeps MIN_WORK_PER_CHUNK uops.

  >>> chunks_for(1 << 20, 2), chunks_for(1 << 17, 2), chunks_for(1 << 30, 1)
  (16, 4, 1)
  """
  if threads <= 1: return 1
  return max(threads, min(threads * CHUNKS_PER_THREAD, work // MIN_WORK_PER_CHUNK))

POOL_SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef void (*kiln_task)(void **bufs, const int *vals, int chunk, int nchunks);

/* A launch is `nchunks` chunks that any thread may claim, the caller included: a worker the OS has not scheduled
   yet (a busy machine) delays nothing, because the caller or another worker runs its chunk instead.
   `claim` packs generation << 32 | nchunks << 16 | next chunk, so a worker claims a chunk of the launch it woke for
   with one compare-and-swap, and reads the launch's fields only after a successful claim (they cannot change until
   every chunk has finished). */
struct kiln_pool;
struct kiln_worker { struct kiln_pool *pool; pthread_t thread; };
struct kiln_pool {
  pthread_mutex_t run_lock;          /* one launch at a time (several Python threads may launch) */
  pthread_mutex_t lock;              /* guards sleeping and waking */
  pthread_cond_t wake, done;
  _Atomic unsigned long long claim;
  atomic_uint finished;              /* chunks of the current launch that have finished */
  int sleepers, stop, nworkers;
  unsigned generation;               /* the current launch (the caller's copy) */
  long long spin_ns;                 /* how long a waiting thread spins before it sleeps */
  kiln_task task; void **bufs; const int *vals;
  struct kiln_worker workers[];
};

static inline void kiln_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long long kiln_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000ll + t.tv_nsec;
}

static inline unsigned kiln_generation(unsigned long long claim) { return (unsigned)(claim >> 32); }

/* runs chunks of launch `generation` until none is left to claim */
static void kiln_take_chunks(struct kiln_pool *pool, unsigned generation) {
  unsigned long long claim = atomic_load_explicit(&pool->claim, memory_order_acquire);
  for (;;) {
    unsigned nchunks = (unsigned)(claim >> 16) & 0xffffu, next = (unsigned)claim & 0xffffu;
    if (kiln_generation(claim) != generation || next >= nchunks) return;
    if (!atomic_compare_exchange_weak_explicit(&pool->claim, &claim, claim + 1, memory_order_acq_rel,
                                               memory_order_acquire)) continue;
    pool->task(pool->bufs, pool->vals, (int)next, (int)nchunks);
    if (atomic_fetch_add_explicit(&pool->finished, 1, memory_order_acq_rel) + 1 == nchunks) {
      pthread_mutex_lock(&pool->lock);
      pthread_cond_broadcast(&pool->done);
      pthread_mutex_unlock(&pool->lock);
    }
    claim = atomic_load_explicit(&pool->claim, memory_order_acquire);
  }
}

/* a worker: waits (spinning, then sleeping) for a launch newer than `seen`, and returns its generation */
static unsigned kiln_wait_for_launch(struct kiln_pool *pool, unsigned seen) {
  long long deadline = 0;
  for (int i = 0; ; i++) {
    unsigned now = kiln_generation(atomic_load_explicit(&pool->claim, memory_order_acquire));
    if (now != seen) return now;
    if ((i & 63) == 0) {   /* reading the clock costs tens of nanoseconds: only now and then */
      if (i) sched_yield();   /* a busy machine: let a thread that has work (the caller) have this core */
      long long t = kiln_now_ns();
      if (i == 0) deadline = t + pool->spin_ns;
      else if (t > deadline) break;
    }
    kiln_relax();
  }
  unsigned now;
  pthread_mutex_lock(&pool->lock);
  while ((now = kiln_generation(atomic_load_explicit(&pool->claim, memory_order_acquire))) == seen) {
    pool->sleepers++;
    pthread_cond_wait(&pool->wake, &pool->lock);
    pool->sleepers--;
  }
  pthread_mutex_unlock(&pool->lock);
  return now;
}

static void *kiln_worker_main(void *arg) {
  struct kiln_pool *pool = ((struct kiln_worker *)arg)->pool;
  unsigned seen = 0;
  for (;;) {
    seen = kiln_wait_for_launch(pool, seen);
    if (pool->stop) return NULL;
    kiln_take_chunks(pool, seen);
  }
}

/* makes launch `nchunks` visible to the workers and wakes the sleeping ones */
static void kiln_publish(struct kiln_pool *pool, unsigned nchunks) {
  atomic_store_explicit(&pool->finished, 0, memory_order_relaxed);
  pool->generation++;
  unsigned long long claim = ((unsigned long long)pool->generation << 32) | ((unsigned long long)nchunks << 16);
  atomic_store_explicit(&pool->claim, claim, memory_order_release);
  pthread_mutex_lock(&pool->lock);
  if (pool->sleepers) pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
}

static void kiln_wait_finished(struct kiln_pool *pool, unsigned nchunks) {
  long long deadline = 0;
  for (int i = 0; atomic_load_explicit(&pool->finished, memory_order_acquire) != nchunks; i++) {
    if ((i & 63) == 0) {
      if (i) sched_yield();   /* a busy machine: let a descheduled worker finish its chunk on this core */
      long long t = kiln_now_ns();
      if (i == 0) deadline = t + pool->spin_ns;
      else if (t > deadline) break;
    }
    kiln_relax();
  }
  pthread_mutex_lock(&pool->lock);
  while (atomic_load_explicit(&pool->finished, memory_order_acquire) != nchunks)
    pthread_cond_wait(&pool->done, &pool->lock);
  pthread_mutex_unlock(&pool->lock);
}

/* a pool of nthreads-1 workers (the caller is the other thread); NULL if a thread could not be started */
void *kiln_pool_create(int nthreads, long long spin_ns) {
  int nworkers = nthreads > 1 ? nthreads - 1 : 0;
  struct kiln_pool *pool = calloc(1, sizeof(struct kiln_pool) + (size_t)nworkers * sizeof(struct kiln_worker));
  if (!pool) return NULL;
  pthread_mutex_init(&pool->run_lock, NULL);
  pthread_mutex_init(&pool->lock, NULL);
  pthread_cond_init(&pool->wake, NULL);
  pthread_cond_init(&pool->done, NULL);
  pool->spin_ns = spin_ns;
  for (int i = 0; i < nworkers; i++) {
    pool->workers[i].pool = pool;
    if (pthread_create(&pool->workers[i].thread, NULL, kiln_worker_main, &pool->workers[i]) != 0) {
      pool->stop = 1;   /* stop the ones already started */
      kiln_publish(pool, 0);
      for (int j = 0; j < i; j++) pthread_join(pool->workers[j].thread, NULL);
      free(pool);
      return NULL;
    }
    pool->nworkers = i + 1;
  }
  return pool;
}

int kiln_pool_size(void *handle) { return ((struct kiln_pool *)handle)->nworkers + 1; }

/* task(bufs, vals, chunk, nchunks) for every chunk < nchunks (at most 65535), spread over the pool's threads and the
   caller; returns when all have finished */
void kiln_pool_run(void *handle, void *task, void **bufs, const int *vals, int nchunks) {
  struct kiln_pool *pool = handle;
  if (nchunks > 0xffff) nchunks = 0xffff;
  if (nchunks <= 1 || pool->nworkers == 0) {
    for (int i = 0; i < (nchunks > 1 ? nchunks : 1); i++) ((kiln_task)task)(bufs, vals, i, nchunks > 1 ? nchunks : 1);
    return;
  }
  pthread_mutex_lock(&pool->run_lock);
  pool->task = (kiln_task)task; pool->bufs = bufs; pool->vals = vals;
  kiln_publish(pool, (unsigned)nchunks);
  kiln_take_chunks(pool, pool->generation);
  kiln_wait_finished(pool, (unsigned)nchunks);
  pthread_mutex_unlock(&pool->run_lock);
}

/* stops and joins the workers and frees the pool */
void kiln_pool_destroy(void *handle) {
  struct kiln_pool *pool = handle;
  pthread_mutex_lock(&pool->run_lock);
  pool->stop = 1;
  kiln_publish(pool, 0);
  for (int i = 0; i < pool->nworkers; i++) pthread_join(pool->workers[i].thread, NULL);
  pthread_mutex_unlock(&pool->run_lock);
  free(pool);
}
"""

# how long a worker spins waiting for the next launch before it sleeps: covers the gap between eager launches
# (tens of microseconds of Python) without keeping cores busy when kiln is idle
SPIN_NS = 200_000

def thread_count() -> int:
  """The number of threads a split kernel runs on: THREADS if set, else the cores this process may use.

  >>> from kiln.helpers import Context
  >>> with Context(THREADS=3): thread_count()
  3
  """
  value = int(THREADS.value)
  if value < 0: raise ValueError(f"THREADS must be >= 0 (0: one per core), got {value}")
  return value or usable_cores()

@functools.cache
def usable_cores() -> int:
  """The cores this process may run on (read once: every launch asks)."""
  try: return max(1, len(os.sched_getaffinity(0)))
  except (AttributeError, OSError): return max(1, os.cpu_count() or 1)

class ThreadPool:
  """`size` threads (the caller and size-1 workers) of the C pool; `run` executes one split kernel on all of them."""
  def __init__(self, size: int):
    self.lib = _pool_library()
    self.handle = self.lib.kiln_pool_create(size, SPIN_NS)
    if not self.handle: raise RuntimeError(f"thread pool: could not start {size - 1} worker threads (THREADS={size})")
    self.size, self.alive = size, True
    self.run_function = ctypes.cast(self.lib.kiln_pool_run, ctypes.c_void_p).value   # for generated C (CPUGraph)

  def run(self, task: int, bufs, vals, nthreads: int) -> None:
    """`task(bufs, vals, tid, nthreads)` on `nthreads` threads; returns when every thread has finished."""
    self.lib.kiln_pool_run(self.handle, task, bufs, vals, nthreads)

  def close(self) -> None:
    """Stop and join the workers (the pool cannot be used afterwards)."""
    if self.alive: self.lib.kiln_pool_destroy(self.handle)
    self.alive = False

_pools: dict[int, ThreadPool] = {}
_pools_lock = threading.Lock()

def pool_for(size: int) -> ThreadPool:
  """The process's pool of `size` threads, started on first use and kept for every later launch."""
  pool = _pools.get(size)
  if pool is not None: return pool
  with _pools_lock:
    if size not in _pools: _pools[size] = ThreadPool(size)
    return _pools[size]

def _forget_pools_after_fork() -> None:
  # the child has only the forking thread: the parent's workers are gone, and their pools' locks may be held
  for pool in _pools.values(): pool.alive = False
  _pools.clear()
  usable_cores.cache_clear()
  _library_build.forget_unfinished()

if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_forget_pools_after_fork)

class _LibraryBuild:
  """The pool library, built at most once per process: in a background thread started when the CPU device opens
  (`build_library_in_background`: compiling it, 0.17 s on an empty kernel cache, then overlaps the Python codegen of
  the first kernels), or by the first launch that needs it. A build that failed is tried once more by that launch,
  under the settings of then, before the error is raised."""
  def __init__(self):
    self.lock = threading.Lock()
    self.library: ctypes.CDLL | None = None
    self.thread: threading.Thread | None = None

  def start(self) -> None:
    """Start the background build unless the library is loaded or being built."""
    with self.lock:
      if self.library is not None or self.thread is not None: return
      compiler = _pool_compiler()   # the settings of now: the thread must not read them while they change
      self.thread = threading.Thread(target=self._build, args=(compiler,), name="kiln-pool-library", daemon=True)
      self.thread.start()

  def _build(self, compiler) -> None:
    try: library = _load_library(compiler)
    except Exception: return   # noqa: BLE001  (the launch that needs the library builds it again and reports)
    with self.lock: self.library = library

  def get(self) -> ctypes.CDLL:
    """The loaded library: waits for a build in progress, or builds it now."""
    if self.library is not None: return self.library
    thread = self.thread
    if thread is not None: thread.join()
    with self.lock:
      if self.library is None:
        try: self.library = _load_library(_pool_compiler())
        except Exception as e:
          raise RuntimeError(f"thread pool: could not build its C library (THREADS=1 runs every kernel on the calling "
                             f"thread without it): {e}") from e
      return self.library

  def forget_unfinished(self) -> None:
    """After fork: the child has no build thread; a build the parent had not finished is started again when needed."""
    self.lock = threading.Lock()
    if self.library is None: self.thread = None

_library_build = _LibraryBuild()

def build_library_in_background() -> None:
  """Start compiling (or reading from the kernel cache) and loading the pool library in a background thread, unless
  it is loaded or under way; the first launch on the pool waits for it only if it is not ready then."""
  _library_build.start()

def _pool_compiler():
  from kiln.runtime.ops_cpu import ClangCompiler   # here: ops_cpu imports this module
  compiler = ClangCompiler(extra_flags=("-pthread",))
  return ClangCompiler(extra_flags=("-pthread",), command=compiler.command())

def _load_library(compiler) -> ctypes.CDLL:
  """POOL_SOURCE compiled by `compiler` (through the kernel cache) and loaded, with its functions' types set."""
  import tempfile
  lib_bytes = compiler.compile_cached(POOL_SOURCE)
  with tempfile.NamedTemporaryFile(prefix="kiln_pool_", suffix=".so", delete=False) as f: f.write(lib_bytes)
  try: lib = ctypes.CDLL(f.name)
  finally: os.unlink(f.name)
  lib.kiln_pool_create.argtypes, lib.kiln_pool_create.restype = [ctypes.c_int, ctypes.c_longlong], ctypes.c_void_p
  lib.kiln_pool_run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
  lib.kiln_pool_run.restype = None
  lib.kiln_pool_destroy.argtypes, lib.kiln_pool_destroy.restype = [ctypes.c_void_p], None
  lib.kiln_pool_size.argtypes, lib.kiln_pool_size.restype = [ctypes.c_void_p], ctypes.c_int
  return lib

# loaders of the same pool built without a C compiler (kiln/runtime/ops_llvm.py registers its JIT-compiled one), tried
# in order when the C library cannot be built: a machine with only pip-installed packages still runs kernels on threads
POOL_LIBRARY_FALLBACKS: list = []

def _pool_library() -> ctypes.CDLL:
  """The compiled pool, loaded once per process (or a fallback's, where the C pool cannot be built)."""
  try: return _library_build.get()
  except RuntimeError:
    for load in POOL_LIBRARY_FALLBACKS:
      try: return load()
      except Exception: continue   # noqa: BLE001  (the C build's error is the one to report)
    raise
