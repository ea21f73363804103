"""Dispatch overhead: eager `(a+1).realize()` on 16 floats, and the replay of a jitted 2-kernel function.

Run: `python bench/bench_jit.py` (prints the median of several timed batches, in microseconds per call).
"""
import statistics, time
from kiln import Tensor, TinyJit

def per_call_us(fn, calls: int = 2000, batches: int = 7) -> float:
  """Median over `batches` of the mean time of `calls` calls of fn(), in microseconds."""
  fn()
  times = []
  for _ in range(batches):
    start = time.perf_counter()
    for _ in range(calls): fn()
    times.append((time.perf_counter() - start) / calls * 1e6)
  return statistics.median(times)

def main() -> None:
  a = Tensor.arange(16).float().realize()
  eager = per_call_us(lambda: (a + 1).realize(), calls=500)

  @TinyJit
  def two_kernels(x: Tensor) -> Tensor:
    y = (x * 2).contiguous()   # the contiguous() splits the function into two kernels
    return (y + x).sum()
  x = Tensor.arange(16).float().realize()
  for _ in range(3): two_kernels(x)
  assert len(two_kernels.jit_cache) == 2, f"expected 2 captured kernels, got {len(two_kernels.jit_cache)}"
  replay = per_call_us(lambda: two_kernels(x))
  print(f"eager (a+1).realize() on 16 floats: {eager:8.1f} us/call")
  print(f"TinyJit replay, 2 kernels:          {replay:8.1f} us/call")

if __name__ == "__main__":
  main()
