"""Dispatch overhead: eager `(a+1).realize()` on 16 floats (the same graph again: its earlier result is reused), eager
`x = (x+1).realize()` (a new input each call: served by the schedule cache, and with it off), and TinyJit replays with
and without the CPU graph.

Run: `python bench/bench_jit.py` (prints the best and the median of several timed batches, in microseconds per
call, and the best batch's CPU time on the main thread). On a shared, loaded machine the best batch is the closer
estimate of the idle-machine cost, and the CPU time (these kernels are too small to run on the thread pool) the
least disturbed by other processes.
"""
import statistics, time
from kiln import Tensor, TinyJit, Context

class Timing(tuple):
  """(best, median, best CPU) microseconds per call, printed as 'best / median (CPU best)'."""
  def __format__(self, spec: str) -> str:
    return f"{format(self[0], spec)} / {format(self[1], spec)}  (CPU {format(self[2], spec)})"

def per_call_us(fn, calls: int = 2000, batches: int = 7) -> Timing:
  """Best and median over `batches` of the mean time of `calls` calls of fn(), and the best batch's mean CPU time
  on this thread, in microseconds."""
  fn()
  times, cpu_times = [], []
  for _ in range(batches):
    start, cpu_start = time.perf_counter(), time.thread_time()
    for _ in range(calls): fn()
    times.append((time.perf_counter() - start) / calls * 1e6)
    cpu_times.append((time.thread_time() - cpu_start) / calls * 1e6)
  return Timing((min(times), statistics.median(times), min(cpu_times)))

def jitted_chain(n_kernels: int, graph: bool) -> Timing:
  """Replay time of a jitted function of `n_kernels` kernels (contiguous() cuts the chain into kernels)."""
  @TinyJit
  def chain(x: Tensor) -> Tensor:
    for _ in range(n_kernels - 1): x = (x * 2 + 1).contiguous()
    return (x + 1).sum()
  x = Tensor.arange(16).float().realize()
  with Context(JIT=1 if graph else 2):
    for _ in range(3): chain(x)
    assert len(chain.jit_cache) == n_kernels, f"expected {n_kernels} captured kernels, got {len(chain.jit_cache)}"
    return per_call_us(lambda: chain(x), calls=1000)

def main() -> None:
  a = Tensor.arange(16).float().realize()
  eager = per_call_us(lambda: (a + 1).realize(), calls=500)
  params = [Tensor.randn(4, 4, requires_grad=True).realize() for _ in range(50)]   # a model's weights, alive
  eager_params = per_call_us(lambda: (a + 1).realize(), calls=500)
  del params
  chained = [(a + 0).realize()]
  def step() -> None: chained[0] = (chained[0] + 1).realize()   # a new input buffer every call: scheduled each time
  eager_new = per_call_us(step, calls=500)
  with Context(SCHEDULE_CACHE=0): eager_new_uncached = per_call_us(step, calls=500)
  print("us per call, best / median batch (CPU: the best batch's main-thread CPU time)")
  print(f"eager (a+1).realize() on 16 floats:                {eager:8.1f} us/call")
  print(f"  ... with 50 requires_grad tensors alive:         {eager_params:8.1f} us/call")
  print(f"eager x = (x+1).realize(), a new x every call:     {eager_new:8.1f} us/call")
  print(f"  ... with SCHEDULE_CACHE=0:                       {eager_new_uncached:8.1f} us/call")
  for n in (2, 20):
    print(f"TinyJit replay, {n:2d} kernels, CPU graph:           {jitted_chain(n, True):8.1f} us/call")
    print(f"TinyJit replay, {n:2d} kernels, one call per kernel: {jitted_chain(n, False):8.1f} us/call")

if __name__ == "__main__":
  main()
