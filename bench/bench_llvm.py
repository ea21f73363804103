"""The LLVM device beside the CPU device: compile time of the same kernels (llvmlite O3 vs the C compilers on PATH),
and the kernel-only run time (program(..., wait=True), median of 30, the two devices interleaved) of a few workloads.

Run: THREADS=1 python bench/bench_llvm.py   (and THREADS=2, ...; on an idle machine for the run times)
"""
import shutil, statistics, time
import numpy as np
from kiln import Tensor
from kiln.device import Device
from kiln.engine import realize
from kiln.helpers import Context

WORKLOADS = {
  "add 1024x1024": lambda t: t["a"] + t["b"], "gelu 1024x1024": lambda t: t["a"].gelu(),
  "sum 1024x1024": lambda t: t["a"].sum(), "softmax rows 1024x1024": lambda t: t["a"].softmax(-1),
  "exp2+sin 1024x1024": lambda t: t["a"].exp2() + t["a"].sin(), "matmul 256": lambda t: t["m"] @ t["m"],
  "conv2d 8x16x32x32 k3": lambda t: t["x"].conv2d(t["w"], padding=1),
  "half mul+add 1024x1024": lambda t: t["h"] * t["h"] + t["h"],
}

def inputs(device: str) -> dict[str, Tensor]:
  rng = np.random.default_rng(0)
  def normal(*shape: int) -> np.ndarray: return rng.standard_normal(shape, dtype=np.float32)
  arrays = {"a": normal(1024, 1024), "b": normal(1024, 1024), "m": normal(256, 256), "x": normal(8, 16, 32, 32),
            "w": normal(16, 16, 3, 3), "h": normal(1024, 1024).astype(np.float16)}
  return {k: Tensor(v, device=device).realize() for k, v in arrays.items()}

def timed_compiles(device: str) -> list[tuple[str, float]]:
  """Wrap the device's compiler so that every compile is recorded as (source, seconds)."""
  compiler, log = Device[device].compiler, []
  original = compiler.compile
  def compile_and_time(src: str) -> bytes:
    start = time.perf_counter()
    lib = original(src)
    log.append((src, time.perf_counter() - start))
    return lib
  compiler.compile = compile_and_time
  return log

def launches_of(fn) -> list[tuple]:
  """The (runner, buffers, var_vals) of every kernel that realizing `fn()` launches."""
  launched, original = [], realize.CompiledRunner.__call__
  def record(self, bufs, var_vals=None, wait=False):
    launched.append((self, list(bufs), var_vals))
    return original(self, bufs, var_vals, wait)
  realize.CompiledRunner.__call__ = record
  try: fn().realize()
  finally: realize.CompiledRunner.__call__ = original
  return launched

def main() -> None:
  logs = {dev: timed_compiles(dev) for dev in ("CPU", "LLVM")}
  tensors = {dev: inputs(dev) for dev in ("CPU", "LLVM")}
  print(f"{'kernel-only time, ms':26s} {'CPU':>8s} {'LLVM':>8s} {'LLVM/CPU':>9s}")
  with Context(CACHELEVEL=0):
    for name, fn in WORKLOADS.items():
      launches = {dev: launches_of(lambda: fn(tensors[dev])) for dev in ("CPU", "LLVM")}
      times = {"CPU": [], "LLVM": []}
      for _ in range(30):
        for dev, items in launches.items(): times[dev].append(sum(r(b, v, wait=True) for r, b, v in items))
      cpu, llvm = statistics.median(times["CPU"]) * 1e3, statistics.median(times["LLVM"]) * 1e3
      print(f"{name:26s} {cpu:8.3f} {llvm:8.3f} {llvm / cpu:9.2f}")
  compile_ms = {"LLVM (llvmlite, O3)": [t * 1e3 for _, t in logs["LLVM"]]}
  cpu_sources = [src for src, _ in logs["CPU"]]   # a copy: compiling them again adds to the log
  for cc in [cc for cc in ("clang", "gcc") if shutil.which(cc)]:
    with Context(CC=cc):
      compile_ms[f"CPU ({cc} -O2)"] = []   # CPU's default flags: -O2 -march=native
      for src in cpu_sources:
        start = time.perf_counter()
        Device["CPU"].compiler.compile(src)
        compile_ms[f"CPU ({cc} -O2)"].append((time.perf_counter() - start) * 1e3)
  print(f"\ncompile time per kernel, ms ({len(cpu_sources)} kernels)")
  print(f"{'compiler':26s} {'median':>8s} {'mean':>8s} {'max':>8s}")
  for name, ms in compile_ms.items():
    print(f"{name:26s} {statistics.median(ms):8.1f} {statistics.mean(ms):8.1f} {max(ms):8.1f}")

if __name__ == "__main__": main()
