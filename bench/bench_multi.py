"""All-reduce bandwidth over several devices: kiln's ring (RING=2) and naive sum (RING=0, every device adds copies
of every partial), under TinyJit so that only the copies and kernels are timed, and with `--torch` PyTorch's
`torch.distributed.all_reduce` over the same devices in the same run (one process a device: the NCCL backend on
CUDA devices, Gloo on CPU ones).

Run: `python bench/bench_multi.py [--devices CPU:1,CPU:2,CPU:3,CPU:4] [--sizes 65536,1048576,16777216] [--torch]`;
on two GPUs (issue 24) `python bench/bench_multi.py --devices CUDA:0,CUDA:1 --mib 1,4,16,64,256,1024 --torch`.
For each size (float32 elements a device, or `--mib` MiB a device) it prints the best time of several calls and the
bus bandwidth as nccl-tests define it for all-reduce, 2(n-1)/n * bytes / time (the traffic a ring needs per
device, so the algorithms compare on one scale). Virtual CPU devices share one memory: their copies are memcpys,
so there this measures kiln's schedule and copy path, not an interconnect. NCCL_NVLS_ENABLE=0 is set for every
process (NVLink multicast stays off).
"""
from __future__ import annotations
import argparse, os, socket, time
import numpy as np
from kiln import Tensor, TinyJit, Context, Device

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

def bus_bandwidth(n: int, nbytes: int, seconds: float) -> float:
  """nccl-tests' all-reduce bus bandwidth in GB/s: algorithm bandwidth (bytes / time) times 2(n-1)/n."""
  return 2 * (n - 1) / n * nbytes / seconds / 1e9

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

# ---------------- PyTorch's all-reduce, one process a device ----------------

def _torch_rank(rank: int, devices: list[str], sizes: list[int], calls: int, port: int, results) -> None:
  """One rank of the PyTorch run: all-reduce each size `calls` times after warm-ups; rank 0 reports the best."""
  import torch, torch.distributed as dist
  cuda = devices[rank].upper().startswith("CUDA")
  if cuda: torch.cuda.set_device(int(devices[rank].partition(":")[2] or 0))
  dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                          world_size=len(devices))
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  best_of: dict[int, float] = {}
  for size in sizes:
    t = torch.ones(size, dtype=torch.float32, device="cuda" if cuda else "cpu")
    for _ in range(3): dist.all_reduce(t)
    sync()
    best = float("inf")
    for _ in range(calls):
      dist.barrier()
      start = time.perf_counter()
      dist.all_reduce(t)
      sync()
      best = min(best, time.perf_counter() - start)
    best_of[size] = best
  if rank == 0: results.put(best_of)
  dist.destroy_process_group()

def torch_all_reduce_seconds(devices: tuple[str, ...], sizes: list[int], calls: int = 7) -> dict[int, float]:
  """PyTorch's best all-reduce time for each size (float32 elements a device), one spawned process a device."""
  import torch.multiprocessing as mp
  with socket.socket() as s:   # a free port for the rendezvous
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  context = mp.get_context("spawn")
  results = context.Queue()
  processes = [context.Process(target=_torch_rank, args=(r, list(devices), sizes, calls, port, results))
               for r in range(len(devices))]
  for p in processes: p.start()
  best = results.get(timeout=600)
  for p in processes: p.join()
  return best

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", default="CPU:1,CPU:2,CPU:3,CPU:4")
  parser.add_argument("--sizes", default="65536,1048576,16777216", help="float32 elements a device")
  parser.add_argument("--mib", default=None, help="sizes in MiB a device instead (e.g. 1,4,16,64,256,1024)")
  parser.add_argument("--torch", action="store_true", help="also time torch.distributed.all_reduce (NCCL or Gloo)")
  parser.add_argument("--calls", type=int, default=7)
  args = parser.parse_args()
  devices = tuple(args.devices.split(","))
  n = len(devices)
  sizes = [int(float(m) * 2**20) // 4 for m in args.mib.split(",")] if args.mib else \
    [int(s) for s in args.sizes.split(",")]
  torch_best = torch_all_reduce_seconds(devices, sizes, args.calls) if args.torch else {}
  print(f"all-reduce over {n} devices {devices}: best of {args.calls}, bus bandwidth 2(n-1)/n * bytes / time")
  for size in sizes:
    row = [f"{size * 4 / 2**20:8.2f} MiB"]
    for name, ring in (("naive", 0), ("ring", 2)):
      seconds = all_reduce_seconds(devices, size, ring, args.calls)
      row.append(f"{name} {seconds * 1e3:8.3f} ms {bus_bandwidth(n, size * 4, seconds):7.2f} GB/s")
    if size in torch_best:
      row.append(f"torch {torch_best[size] * 1e3:8.3f} ms {bus_bandwidth(n, size * 4, torch_best[size]):7.2f} GB/s")
    print("  ".join(row))

if __name__ == "__main__":
  main()
