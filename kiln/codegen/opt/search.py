"""BEAM search: choose a kernel's optimization actions by compiling and timing candidates on the device.

`BEAM=n` keeps the n fastest kernels found so far; each round extends every one of them by every action that
applies (`Kernel.possible_opts`), compiles the new candidates in parallel, times each on scratch copies of the
kernel's real buffers, and keeps the n fastest of old and new. The search stops when a round finds nothing faster,
when no action applies, or after `BEAM_TIMEOUT` seconds. The heuristics' choice is always a candidate, so a search
never does worse than the default.

On a GPU target (the device's renderer `has_local`) the kernel is a GPU Kernel: its actions are the GPU ones (LOCAL,
GROUP/GROUPTOP, UPCAST as a thread's register tile; UNROLL and SWAP before them: `Kernel.possible_opts`), the
heuristics' candidate is the GPU heuristics' (kiln/codegen/opt/gpu_heuristic.py), and the candidates' choices ride
on their SINKs to the axis-mapping stage, which builds them.

The winner is checked against the unoptimized kernel on the same inputs before it is used (a winner that computes
something else is refused and reported), then written to an sqlite database in the cache directory, keyed by the
kernel, the device's compiler and the search width, so later runs and other processes skip the search.
"""
from __future__ import annotations
import hashlib, json, os, sqlite3, time
from typing import Callable, Sequence
import numpy as np
from kiln.helpers import BEAM, CACHELEVEL, DEBUG, IGNORE_BEAM_CACHE, ContextVar, kernel_cache_dir
from kiln.uop.ops import UOp, toposort
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps, KernelOptError
from kiln.codegen.opt.heuristic import heuristic_opts

BEAM_TIMEOUT = ContextVar("BEAM_TIMEOUT", 60.0, "seconds one kernel's BEAM search may take before it keeps the best "
                          "kernel found so far")

# a candidate is timed this many times after one warm-up run; the minimum counts (the least disturbed run)
TIMED_RUNS = 3

# ---------------- the on-disk cache ----------------

def kernel_key(sink: UOp) -> str:
  """A digest of a lowered kernel that is the same in every process (UOp hashes are per process)."""
  order = toposort([sink])
  position = {u: i for i, u in enumerate(order)}
  lines = [f"{u.op.name}|{u.dtype}|{u.arg!r}|{','.join(str(position[s]) for s in u.src)}" for u in order]
  return hashlib.sha256("\n".join(lines).encode()).hexdigest()

def _database() -> sqlite3.Connection:
  """The cache database (WAL mode: readers never block the one writer; a busy writer is waited for)."""
  connection = sqlite3.connect(kernel_cache_dir() / "beam.db", timeout=30)
  connection.execute("PRAGMA journal_mode=WAL")
  connection.execute("CREATE TABLE IF NOT EXISTS beam (key TEXT PRIMARY KEY, opts TEXT NOT NULL)")
  return connection

def cache_get(key: str) -> list[Opt] | None:
  """The cached winning actions for `key`, or None."""
  if CACHELEVEL < 1 or IGNORE_BEAM_CACHE: return None
  with _database() as db: row = db.execute("SELECT opts FROM beam WHERE key = ?", (key,)).fetchone()
  if row is None: return None
  return [Opt(OptOps(op), axis, arg) for op, axis, arg in json.loads(row[0])]

def cache_put(key: str, opts: Sequence[Opt]) -> None:
  """Record the winning actions for `key` (the last writer wins; every writer found an equally valid answer)."""
  if CACHELEVEL < 1: return
  with _database() as db:
    db.execute("INSERT OR REPLACE INTO beam (key, opts) VALUES (?, ?)",
               (key, json.dumps([[o.op.value, o.axis, o.arg] for o in opts])))

# ---------------- the search ----------------

def _clone(kernel: Kernel) -> Kernel:
  copy = Kernel(kernel.sink, kernel.target)
  copy.applied, copy.unrolled, copy.overlapped = list(kernel.applied), kernel.unrolled, kernel.overlapped
  return copy

def _heuristic(kernel: Kernel) -> list[Opt]:
  """The heuristics' actions for `kernel` (a GPU Kernel gets the GPU heuristics'), applied in place."""
  if kernel.gpu:
    from kiln.codegen.opt.gpu_heuristic import gpu_heuristic_opts
    return gpu_heuristic_opts(kernel)
  return heuristic_opts(kernel)

def search_target(device) -> object:
  """The target a search on `device` plans for: a GPU's description where its renderer has threads and blocks
  (kiln/codegen/opt/gpu_heuristic.py gpu_target), else None (the CPU's actions)."""
  renderer = getattr(device, "renderer", None)
  if not getattr(renderer, "has_local", False): return None
  from kiln.codegen.opt.gpu_heuristic import gpu_target
  return gpu_target(getattr(renderer, "target", None))

def _extensions(kernel: Kernel) -> list[Kernel]:
  """`kernel` with one more action, for every action that applies."""
  out = []
  for opt in kernel.possible_opts():
    try: out.append(_clone(kernel).apply(opt))
    except KernelOptError: continue
  return out

# seconds per kernel (`inf` for one that failed or was not timed) of the kernels given, timing none that would start
# after the deadline (a `time.perf_counter()` value)
Timer = Callable[[Sequence[Kernel], float], list[float]]

def beam_search(sink: UOp, time_kernels: Timer, width: int, timeout_s: float, target: object = None) -> Kernel:
  """The fastest kernel found by a `width`-wide beam over actions on `sink` for `target` (a GPU one: the GPU
  actions), timed by `time_kernels` (seconds per kernel, `inf` for one that failed to compile or run)."""
  start = time.perf_counter()
  base = Kernel(sink, target)
  heuristic = _clone(base)
  _heuristic(heuristic)   # applies in place
  candidates = [base] + ([heuristic] if heuristic.sink is not base.sink else [])
  seen = {k.sink for k in candidates}
  # the unoptimized and the heuristics' kernels are always timed: the search never does worse than the default
  beam = sorted(zip(time_kernels(candidates, float("inf")), range(len(candidates)), candidates),
                key=lambda t: t[:2])[:width]
  counter = len(candidates)
  deadline = start + timeout_s
  while time.perf_counter() < deadline:
    fresh = []
    for _, _, kernel in beam:
      for new in _extensions(kernel):
        if new.sink in seen: continue   # hash-consing: two action orders that give the same kernel are timed once
        seen.add(new.sink)
        fresh.append(new)
    if not fresh: break
    times = time_kernels(fresh, deadline)
    timed = [(t, counter + i, k) for i, (t, k) in enumerate(zip(times, fresh))]
    counter += len(fresh)
    new_beam = sorted(beam + timed, key=lambda t: t[:2])[:width]
    improved = new_beam[0][0] < beam[0][0] * 0.99   # 1%: below timing noise, stop rather than wander
    beam = new_beam
    if DEBUG >= 2: print(f"BEAM {len(fresh):4d} candidates, best {beam[0][0] * 1e6:9.1f} us {beam[0][2].applied}")
    if not improved: break
  return beam[0][2]

def make_timer(prepare: Callable[[list[UOp]], None], run: Callable[[UOp], float]) -> Timer:
  """A Timer from `prepare(sinks)`, which compiles candidates (the caller may compile them in parallel), and
  `run(sink)`, which runs one compiled candidate once and returns seconds. A round is compiled and timed in batches
  of a few candidates per core, and no batch starts after the deadline (a round of a big kernel can take minutes:
  the search keeps to BEAM_TIMEOUT); a candidate left out, or that fails to compile or run, is `inf` (never chosen)."""
  batch = 2 * (os.cpu_count() or 1)
  def time_kernels(kernels: Sequence[Kernel], deadline: float) -> list[float]:
    times: list[float] = []
    for first in range(0, len(kernels), batch):
      if time.perf_counter() >= deadline: return times + [float("inf")] * (len(kernels) - len(times))
      chunk = kernels[first:first + batch]
      prepare([k.sink for k in chunk])
      times.extend(_time_each(chunk, run))
    return times
  return time_kernels

def _time_each(kernels: Sequence[Kernel], run: Callable[[UOp], float]) -> list[float]:
  """The best of TIMED_RUNS runs of each compiled kernel after a warm-up, `inf` for one that fails."""
  times = []
  for kernel in kernels:
    try:
      run(kernel.sink)   # warm-up (and compile, if prepare left it out): caches, page faults
      times.append(min(run(kernel.sink) for _ in range(TIMED_RUNS)))
    except Exception as e:   # noqa: BLE001  (a candidate that fails is simply not chosen)
      if DEBUG >= 3: print(f"BEAM candidate {kernel.applied} failed: {e}")
      times.append(float("inf"))
  return times

def outputs_match(expected: list[np.ndarray], got: list[np.ndarray]) -> bool:
  """Whether an optimized kernel's outputs equal the unoptimized kernel's (floats: up to reassociation error, which
  for a sum grows with its terms, not with its result: the absolute tolerance follows the output's largest value, so
  a column sum near zero, summed in another order by a block's lanes, still matches)."""
  for a, b in zip(expected, got):
    if a.dtype.kind == "f":
      wide, other = a.astype(np.float64), b.astype(np.float64)
      finite = np.abs(wide[np.isfinite(wide)])
      scale = float(finite.max()) if finite.size else 0.0
      if not np.allclose(wide, other, rtol=1e-3, atol=1e-5 + 1e-4 * scale, equal_nan=True): return False
    elif not np.array_equal(a, b): return False
  return True

# ---------------- glue: the realize path calls this ----------------

def _scratch_copies(bufs: list) -> list:
  """Fresh buffers with the contents of `bufs` (the search must never write to a tensor's memory)."""
  from kiln.device import Buffer
  copies = []
  for b in bufs:
    copy = Buffer(b.device, b.size, b.dtype).allocate()
    if b.is_allocated(): copy.copy_from(b)
    copies.append(copy)
  return copies

def search_key(device, sink: UOp, bufs: list, width: int, extra: str = "") -> str:
  """The cache key of one search: the kernel, the device's renderer and compiler, buffer sizes and the width."""
  parts = [type(device.renderer).__name__, device.compiler.cache_key(), str(width), kernel_key(sink),
           ",".join(f"{b.size}{b.dtype}" for b in bufs), extra]
  return hashlib.sha256("\0".join(parts).encode()).hexdigest()

def choose_opts(device, sink: UOp, bufs: list, run_sink: Callable[[UOp, list], float], width: int,
                extra_key: str = "", prepare: Callable[[list[UOp]], None] | None = None) -> list[Opt]:
  """The actions a `width`-wide search picks for the lowered kernel `sink` on `device`, from the disk cache when
  present. `run_sink(sink, bufs)` compiles `sink` (memoized by the caller) and runs it once on `bufs`, returning
  seconds. The winner must reproduce the unoptimized kernel's outputs, else the heuristics' choice is used."""
  target = search_target(device)
  # a GPU search's winners are GPU actions (an UPCAST means another kernel there): kept apart from the CPU actions'
  key = search_key(device, sink, bufs, width, extra_key + ("\0gpu actions" if target is not None else ""))
  if (opts := cache_get(key)) is not None:
    try:
      kernel = Kernel(sink, target)
      for opt in opts: kernel.apply(opt)
      return opts
    except KernelOptError: pass   # the cache predates a change to the actions: search again
  start = time.perf_counter()
  scratch = _scratch_copies(bufs)
  timer = make_timer(prepare or (lambda sinks: None), lambda candidate: run_sink(candidate, scratch))
  winner = beam_search(sink, timer, width, float(BEAM_TIMEOUT.value), target)
  # check the winner against the unoptimized kernel, both starting from the real buffers' contents
  results = []
  for candidate in (sink, winner.sink):
    fresh = _scratch_copies(bufs)
    run_sink(candidate, fresh)
    results.append([b.numpy() for b in fresh])
  if not outputs_match(*results):
    print(f"BEAM: the winning actions {winner.applied} changed the kernel's result; using the heuristics instead "
          f"(please report this kernel)")
    return _heuristic(Kernel(sink, target))
  if DEBUG >= 1: print(f"BEAM={width}: {winner.applied} in {time.perf_counter() - start:.1f} s")
  cache_put(key, winner.applied)
  return winner.applied
