"""All-reduce bandwidth over several devices: the ring (RING=2) against the naive sum (RING=0, every device adds
copies of every partial), under TinyJit so that only the copies and kernels are timed.

Run: `python bench/bench_multi.py [--devices CPU:1,CPU:2,CPU:3,CPU:4] [--sizes 65536,1048576,16777216]`. For each
size (float32 elements a device) it prints the best time of several calls and the bus bandwidth, 2(n-1)/n * bytes /
time (the traffic a ring needs per device, the usual figure of merit, so the two algorithms are compared on one
scale). Virtual CPU devices share one memory: their copies are memcpys, so this measures kiln's schedule and copy
path, not an interconnect.
"""
import argparse, time
import numpy as np
from kiln import Tensor, TinyJit, Context, Device

def all_reduce_seconds(devices: tuple[str, ...], size: int, ring: int, calls: int = 7) -> float:
  """Best time of one all-reduce (sum over the sharded axis) of `size` floats a device."""
  x = Tensor(np.ones((len(devices), size), np.float32)).shard(devices, axis=0).realize()
  with Context(RING=ring):
    @TinyJit
    def reduce(t: Tensor) -> Tensor: return t.sum(0).realize()
    for _ in range(3): reduce(x)
    best = float("inf")
    for _ in range(calls):
      start = time.perf_counter()
      out = reduce(x)
      for d in devices: Device[d].synchronize()
      best = min(best, time.perf_counter() - start)
  np.testing.assert_allclose(out.numpy()[:4], len(devices))
  return best

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", default="CPU:1,CPU:2,CPU:3,CPU:4")
  parser.add_argument("--sizes", default="65536,1048576,16777216", help="float32 elements a device")
  args = parser.parse_args()
  devices = tuple(args.devices.split(","))
  n = len(devices)
  print(f"all-reduce over {n} devices {devices}: best of 7, bus bandwidth 2(n-1)/n * bytes / time")
  for size in map(int, args.sizes.split(",")):
    row = [f"{size * 4 / 2**20:8.2f} MiB"]
    for name, ring in (("naive", 0), ("ring", 2)):
      seconds = all_reduce_seconds(devices, size, ring)
      row.append(f"{name} {seconds * 1e3:8.3f} ms {2 * (n - 1) / n * size * 4 / seconds / 1e9:6.2f} GB/s")
    print("  ".join(row))

if __name__ == "__main__":
  main()
