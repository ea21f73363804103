"""Memory bandwidth through kiln's own CUDA binding (kiln/runtime/cuda_driver.py): copy kernels over 256M floats.

  python bench/bench_cuda_copy.py [--floats N] [--reps R] [--json PATH]

Each variant copies N float32 (1 GiB at the default) from one cuMemAlloc buffer to another, timed by CUDA events
around each launch (3 warm-ups, then R timed runs; median and best). GB/s counts the bytes read plus the bytes
written (2 x 4N), as bench/gpu_notes.md and the lent machine's notes do. Each variant's output is poisoned first and
checked against the input afterwards. Pinned host<->device copies count the bytes once.
"""
from __future__ import annotations
import argparse, ctypes, json, statistics, time
from typing import Callable
import numpy as np
from kiln.runtime import cuda_driver as cuda

COPY_KERNELS = r"""
extern "C" __global__ void copy_scalar(float* __restrict__ out, const float* __restrict__ in, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
extern "C" __global__ void copy_float4(float4* __restrict__ out, const float4* __restrict__ in, long long n4) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) out[i] = in[i];
}
// a fixed grid that strides over the array, four float4 loads in flight per thread before the stores
extern "C" __global__ void copy_float4_stride(float4* __restrict__ out, const float4* __restrict__ in, long long n4) {
  long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 a = in[i], b = in[i + stride], c = in[i + 2 * stride], d = in[i + 3 * stride];
    out[i] = a; out[i + stride] = b; out[i + 2 * stride] = c; out[i + 3 * stride] = d;
  }
  for (; i < n4; i += stride) out[i] = in[i];
}
"""

def time_ms(ctx: cuda.Context, run: Callable[[], None], reps: int) -> list[float]:
  """GPU milliseconds of each of `reps` runs of `run`, after 3 warm-ups, each between two events."""
  for _ in range(3): run()
  ctx.synchronize()
  times = []
  with ctx.event() as start, ctx.event() as end:
    for _ in range(reps):
      start.record(); run(); end.record()
      times.append(start.elapsed_ms(end))
  return times

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--floats", type=int, default=256 << 20)
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  n, nbytes = args.floats, 4 * args.floats
  if n % 4: raise SystemExit("--floats must be a multiple of 4 (the float4 kernels)")
  with cuda.Context(0) as ctx:
    props = ctx.properties
    print(f"{props.name}, {props.arch}, {props.sm_count} SMs, {props.total_memory / 2**30:.1f} GiB; driver CUDA "
          f"{cuda.driver_version()}, NVRTC {cuda.nvrtc_version()} ({cuda.nvrtc().where.name})")
    start = time.perf_counter()
    module = ctx.compile(COPY_KERNELS)
    print(f"NVRTC compile + module load: {1e3 * (time.perf_counter() - start):.1f} ms")
    data = np.random.default_rng(0).random(n, dtype=np.float32)
    check = np.empty_like(data)
    src, dst = ctx.alloc(nbytes), ctx.alloc(nbytes)
    ctx.copy_in(src, data)
    scalar, vec4, stride = (module.function(name) for name in ("copy_scalar", "copy_float4", "copy_float4_stride"))
    n4 = n // 4
    variants: dict[str, Callable[[], None]] = {
      "copy_scalar (1 float/thread, block 256)": lambda: scalar.launch(dst, src, ctypes.c_int64(n),
                                                                      grid=(n + 255) // 256, block=256),
      "copy_float4 (1 float4/thread, block 256)": lambda: vec4.launch(dst, src, ctypes.c_int64(n4),
                                                                     grid=(n4 + 255) // 256, block=256),
      f"copy_float4_stride (grid {8 * props.sm_count} x 512, 4 loads in flight)":
        lambda: stride.launch(dst, src, ctypes.c_int64(n4), grid=8 * props.sm_count, block=512),
      "cuMemcpyDtoD": lambda: ctx.copy(dst, src),
    }
    rows = []
    for name, run in variants.items():
      ctx.memset(dst, 0xFF)
      times = time_ms(ctx, run, args.reps)
      ctx.copy_out(check, dst)
      ok = bool(np.array_equal(check, data))
      median = statistics.median(times)
      rows.append({"variant": name, "median_ms": median, "best_ms": min(times), "GB/s": 2 * nbytes / median / 1e6,
                   "correct": ok})
    with ctx.alloc_host(nbytes) as pinned:
      pinned.numpy(np.float32)[:] = data
      host_copies = {"HtoD pinned": lambda: ctx.copy_in(src, pinned), "DtoH pinned": lambda: ctx.copy_out(pinned, src)}
      for name, run in host_copies.items():
        times = time_ms(ctx, run, max(3, args.reps // 4))
        median = statistics.median(times)
        rows.append({"variant": name, "median_ms": median, "best_ms": min(times), "GB/s": nbytes / median / 1e6,
                     "correct": bool(np.array_equal(pinned.numpy(np.float32), data))})
    src.free(); dst.free(); module.close()
  print(f"\n{n} floats ({nbytes / 2**30:.2f} GiB), median of {args.reps} (event-timed):")
  print(f"{'variant':62} {'median ms':>10} {'best ms':>9} {'GB/s':>8}  ok")
  for row in rows:
    print(f"{row['variant']:62} {row['median_ms']:10.3f} {row['best_ms']:9.3f} {row['GB/s']:8.0f}  {row['correct']}")
  if args.json:
    with open(args.json, "w") as f: json.dump({"device": props.name, "floats": n, "rows": rows}, f, indent=1)

if __name__ == "__main__":
  main()
