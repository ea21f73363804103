"""ONNX model inference on the CPU: kiln's OnnxRunner beside onnxruntime, same machine, same thread count.

Run: PYTHONPATH=. THREADS=1 python bench/bench_onnx.py [--runs N] [--models a,b] [--uncached] [--jit]
     [--profile MODEL] [--overhead] [--convs] [--sizes [--sized MODEL ...]]

Models: a ResNet-50 written here in PyTorch with random weights and exported to /tmp (torchvision is not needed;
the .onnx is not kept in the repository), and the real models of test/frontend/test_onnx_packaged.py where their
packages are installed (rapidocr-onnxruntime, silero-vad, basic-pitch; `pip install --no-deps` is enough). Each
model is warmed up (kiln compiles its kernels), then kiln and onnxruntime run in turn `--runs` times (interleaved,
so a noisy neighbour hits both alike); the minimum and median of each are printed, with kiln's throughput as a
share of onnxruntime's. onnxruntime gets THREADS intra-op threads (default 1), kiln the same THREADS. "kiln" is
OnnxRunner as it comes (its graph kept per input signature and replayed through a TinyJit); `--uncached` also times
it with `cache=False` (the graph walked and scheduled on every call), `--jit` that under a TinyJit of the caller's.
`--profile MODEL` prints the model's slowest kiln kernels (each kernel of one inference launched alone);
`--overhead` times the graph walk alone and whole calls with and without the graph cache; `--convs` times
ResNet-50's conv shapes alone (Tensor.conv2d) at batch 1 and 4; `--sizes` calls models with symbolic sizes (an
exported transformer block, PP-OCR's classifier, detector and recognizer) at several sizes, one graph for all of
them against one per size (`--sized ocr_det` for one of them).
"""
from __future__ import annotations
import argparse, importlib.util, os, statistics, sys, time
from typing import Callable
import numpy as np

BENCH_DIR = os.path.join("/tmp", "kiln_onnx_bench")

def resnet50_onnx() -> str:
  """ResNet-50 (torchvision's layout: bottlenecks 3-4-6-3, stride on the 3x3) with random weights and non-trivial
  BatchNorm statistics, exported by PyTorch (opset 17, dynamic batch) into BENCH_DIR once."""
  path = os.path.join(BENCH_DIR, "resnet50.onnx")
  if os.path.exists(path): return path
  import torch
  from torch import nn

  class Bottleneck(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int):
      super().__init__()
      outputs = width * 4
      self.body = nn.Sequential(nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                nn.Conv2d(width, outputs, 1, bias=False), nn.BatchNorm2d(outputs))
      self.shortcut = (nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))
                       if stride != 1 or inputs != outputs else nn.Identity())
    def forward(self, x): return torch.relu(self.body(x) + self.shortcut(x))

  layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.MaxPool2d(3, 2, 1)]
  channels = 64
  for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
    for k in range(blocks):
      layers.append(Bottleneck(channels, width, 2 if k == 0 and stage > 0 else 1))
      channels = width * 4
  layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 1000)]
  torch.manual_seed(0)
  model = nn.Sequential(*layers).eval()
  for module in model.modules():
    if isinstance(module, nn.BatchNorm2d):
      module.running_mean.uniform_(-0.1, 0.1)
      module.running_var.uniform_(0.5, 1.5)
      module.weight.data.uniform_(0.2, 0.6)   # keeps the activations of 16 residual blocks in range
  os.makedirs(BENCH_DIR, exist_ok=True)
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), path, dynamo=False, opset_version=17,
                      input_names=["image"], output_names=["logits"], dynamic_axes={"image": {0: "batch"}})
  return path

def transformer_onnx() -> str:
  """A pre-norm transformer block (width 64, 4 heads, heads split by reshape/transpose from the input's own sizes)
  with random weights, exported by PyTorch with a dynamic batch and sequence into BENCH_DIR once."""
  path = os.path.join(BENCH_DIR, "transformer_block.onnx")
  if os.path.exists(path): return path
  import torch

  class Block(torch.nn.Module):
    def __init__(self, width: int = 64, heads: int = 4):
      super().__init__()
      self.heads, self.norm1, self.norm2 = heads, torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
      self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
      self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
    def forward(self, x):
      batch, steps, width = x.shape
      q, k, v = (t.reshape(batch, steps, self.heads, -1).transpose(1, 2) for t in self.qkv(self.norm1(x)).split(width, -1))
      weights = torch.softmax(q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5, -1)
      x = x + self.proj((weights @ v).transpose(1, 2).reshape(batch, steps, width))
      return x + self.mlp(self.norm2(x))

  torch.manual_seed(0)
  os.makedirs(BENCH_DIR, exist_ok=True)
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(Block().eval(), (torch.randn(2, 8, 64),), path, dynamo=False, opset_version=17,
                      input_names=["tokens"], output_names=["encoded"],
                      dynamic_axes={"tokens": {0: "batch", 1: "sequence"}, "encoded": {0: "batch", 1: "sequence"}})
  return path

def packaged(package: str, relative: str) -> Callable[[], str | None]:
  """A model file inside an installed package, found without importing it (None when absent)."""
  def find() -> str | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations: return None
    path = os.path.join(spec.submodule_search_locations[0], relative)
    return path if os.path.exists(path) else None
  return find

rng = np.random.default_rng(0)
MODELS: dict[str, tuple[Callable[[], str | None], Callable[[], dict]]] = {
  "resnet50": (resnet50_onnx, lambda: {"image": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}),
  "ocr_det": (packaged("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"),
              lambda: {"x": rng.random((1, 3, 320, 320), np.float32)}),
  "ocr_rec": (packaged("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"),
              lambda: {"x": rng.random((1, 3, 48, 320), np.float32)}),
  "ocr_cls": (packaged("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
              lambda: {"x": rng.random((1, 3, 48, 192), np.float32)}),
  "silero_vad": (packaged("silero_vad", "data/silero_vad.onnx"),
                 lambda: {"input": 0.1 * rng.standard_normal((1, 512)).astype(np.float32),
                          "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}),
  "basic_pitch": (packaged("basic_pitch", "saved_models/icassp_2022/nmp.onnx"),
                  lambda: {"serving_default_input_2:0": 0.1 * rng.standard_normal((1, 43844, 1)).astype(np.float32)}),
}

def timed(fn: Callable[[], object]) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start

def kiln_call(runner, feeds: dict) -> Callable[[], object]:
  """One eager inference: build the graph from numpy inputs, run it, read every output back."""
  return lambda: [v.numpy() for v in runner(feeds).values()]

def kiln_jit_call(runner, feeds: dict) -> Callable[[], object]:
  """One inference under TinyJit: the inputs as Tensors (replaced on each call), outputs realized and read back."""
  from kiln import Tensor, TinyJit
  step = TinyJit(lambda **inputs: [v.realize() for v in runner(inputs).values()])
  return lambda: [v.numpy() for v in step(**{k: Tensor(v) for k, v in feeds.items()})]

def bench(name: str, runs: int, threads: int, jit: bool, uncached: bool) -> None:
  import onnxruntime as ort
  from kiln.frontend.onnx import OnnxRunner
  locate, make_feeds = MODELS[name]
  path = locate()
  if path is None: return print(f"{name}: package not installed, skipped")
  feeds = make_feeds()
  options = ort.SessionOptions()
  options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
  options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
  session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
  ort_call = lambda: session.run(None, feeds)
  runner = OnnxRunner(path)
  calls = {"kiln": kiln_call(runner, feeds)}
  if uncached: calls["kiln uncached"] = kiln_call(OnnxRunner(path, cache=False), feeds)
  if jit: calls["kiln jit"] = kiln_jit_call(OnnxRunner(path, cache=False), feeds)
  first = {}
  for label, call in list(calls.items()):
    try:
      first[label] = timed(call)
      for _ in range(2): call()   # warm: compiled, cached, captured under the jit
    except RuntimeError as err:   # e.g. a value read while building, which TinyJit cannot replay
      print(f"{name:12s} {label:12s} not timed: {str(err)[:150]}")
      del calls[label]
  ort_call()
  times: dict[str, list[float]] = {"onnxruntime": [], **{label: [] for label in calls}}
  for _ in range(runs):
    times["onnxruntime"].append(timed(ort_call))
    for label, call in calls.items(): times[label].append(timed(call))
  best_ort = min(times["onnxruntime"])
  for label, values in times.items():
    share = f"  {best_ort / min(values):6.1%} of onnxruntime's throughput" if label != "onnxruntime" else ""
    cold = f"  (first call {first[label]:.2f} s)" if label in first else ""
    print(f"{name:12s} {label:12s} min {min(values) * 1e3:9.2f} ms  median {statistics.median(values) * 1e3:9.2f} ms"
          f"{share}{cold}")

def profile(name: str, top: int = 25) -> None:
  """The model's kernels by time: each kernel of one inference's schedule launched alone, best of 3 (wall time,
  THREADS as set), the slowest `top` printed with their share of the sum."""
  from kiln.engine.realize import get_runner, run_schedule
  from kiln.frontend.onnx import OnnxRunner
  from kiln.schedule.kernelize import create_schedule
  locate, make_feeds = MODELS[name]
  runner, feeds = OnnxRunner(locate(), cache=False), make_feeds()   # uncached: its outputs come back lazy
  kiln_call(runner, feeds)()   # compiles every kernel
  outputs = [v for v in runner(feeds).values()]
  rows = []
  for item in create_schedule([t.uop for t in outputs]).items:
    run_schedule([item])   # allocates and fills the buffers later kernels read
    if item.ast.op.name != "SINK": continue
    kernel = get_runner(item.bufs[0].device, item.ast)
    rows.append((min(timed(lambda: kernel(item.bufs, item.var_vals)) for _ in range(3)), kernel.name))
  total = sum(seconds for seconds, _ in rows)
  print(f"{name}: {len(rows)} kernels, {total * 1e3:.2f} ms summed")
  for seconds, kernel_name in sorted(rows, reverse=True)[:top]:
    print(f"{seconds * 1e3:8.3f} ms {seconds / total:6.1%}  {kernel_name}")

def overhead(name: str, runs: int) -> None:
  """The Python part of a call: the graph walk alone (uncached runner, outputs left lazy), and the whole call
  uncached and cached (kernels included), min of `runs` each, interleaved."""
  from kiln.frontend.onnx import OnnxRunner
  locate, make_feeds = MODELS[name]
  path = locate()
  if path is None: return print(f"{name}: package not installed, skipped")
  feeds = make_feeds()
  uncached, cached = OnnxRunner(path, cache=False), OnnxRunner(path)
  calls = {"graph walk": lambda: uncached(feeds), "uncached call": kiln_call(uncached, feeds),
           "cached call": kiln_call(cached, feeds)}
  for call in list(calls.values()) * 3: call()
  times: dict[str, list[float]] = {label: [] for label in calls}
  for _ in range(runs):
    for label, call in calls.items(): times[label].append(timed(call))
  print(f"{name:12s} " + "  ".join(f"{label} {min(v) * 1e3:8.2f} ms" for label, v in times.items()))

# models with symbolic sizes and the sizes --sizes calls them with, in order
SIZED: dict[str, tuple[Callable[[], str | None], str, list[tuple[int, ...]]]] = {
  "transformer": (transformer_onnx, "tokens", [(2, 8, 64), (3, 12, 64), (4, 16, 64), (2, 5, 64), (1, 16, 64)]),
  "ocr_cls": (MODELS["ocr_cls"][0], "x", [(2, 3, 48, 192), (3, 3, 48, 192), (6, 3, 48, 192), (4, 3, 48, 192)]),
  "ocr_det": (MODELS["ocr_det"][0], "x", [(1, 3, 320, 320), (1, 3, 256, 352), (1, 3, 352, 256), (1, 3, 320, 480)]),
  "ocr_rec": (MODELS["ocr_rec"][0], "x", [(1, 3, 48, 320), (1, 3, 48, 288), (1, 3, 48, 400), (1, 3, 48, 480)]),
}

def sizes(runs: int, only: list[str] | None = None) -> None:
  """Symbolic sizes against a graph per size (OnnxRunner(symbolic=False)): the first call of each new size (graph
  walk, scheduling, compiling: wall time, kernel cache on disk as it is), then the steady call at each size (min of
  `runs`, interleaved), with the kernels compiled in the process counted."""
  from kiln.engine import realize
  from kiln.frontend.onnx import OnnxRunner
  for name, (locate, input_name, shapes) in SIZED.items():
    if only and name not in only: continue
    path = locate()
    if path is None:
      print(f"{name}: package not installed, skipped")
      continue
    runners = {"symbolic": OnnxRunner(path), "per size": OnnxRunner(path, symbolic=False)}
    feeds = {shape: {input_name: rng.random(shape, np.float32)} for shape in shapes}
    for label, runner in runners.items():
      before = len(realize._runner_cache)
      firsts = [timed(kiln_call(runner, feeds[shape])) for shape in shapes]
      print(f"{name:12s} {label:9s} first calls " + "  ".join(f"{s}: {t * 1e3:7.1f} ms" for s, t in
                                                              zip(shapes, firsts)) +
            f"  ({len(realize._runner_cache) - before} kernels compiled)")
    # steady calls (each size's TinyJit replaying: two calls more first), the symbolic runner kept on its symbolic
    # graph (no size of its own after SPECIALIZE_AFTER calls: that is what is compared here)
    from kiln.frontend import onnx_cache
    specialize_after, onnx_cache.SPECIALIZE_AFTER = onnx_cache.SPECIALIZE_AFTER, 1 << 30
    try:
      for shape in shapes:
        for runner in runners.values():
          for _ in range(2): kiln_call(runner, feeds[shape])()
      steady = {(label, shape): [] for label in runners for shape in shapes}
      for _ in range(runs):
        for shape in shapes:
          for label, runner in runners.items(): steady[label, shape].append(timed(kiln_call(runner, feeds[shape])))
    finally: onnx_cache.SPECIALIZE_AFTER = specialize_after
    for label in runners:
      print(f"{name:12s} {label:9s} steady calls " + "  ".join(f"{s}: {min(steady[label, s]) * 1e3:7.2f} ms"
                                                               for s in shapes))

def convs(runs: int) -> None:
  """ResNet-50's conv shapes alone (Tensor.conv2d, realized inputs), batch 1 against batch 4: min of `runs`."""
  from kiln import Tensor
  rng = np.random.default_rng(0)
  make = lambda *shape: Tensor(rng.standard_normal(shape).astype(np.float32)).realize()
  for channels, size, kernel, outputs in [(512, 7, 3, 512), (256, 14, 3, 256), (64, 56, 3, 64), (2048, 7, 1, 512),
                                          (512, 7, 1, 2048)]:
    w = make(outputs, channels, kernel, kernel)
    for batch in (1, 4):
      x = make(batch, channels, size, size)
      run = lambda: x.conv2d(w, padding=kernel // 2).realize()
      run()
      seconds = min(timed(run) for _ in range(runs))
      flops = 2 * batch * channels * outputs * kernel * kernel * size * size
      print(f"conv {channels}->{outputs} {kernel}x{kernel} at {size}x{size} batch {batch}: {seconds * 1e3:7.2f} ms "
            f"{flops / seconds / 1e9:6.1f} GFLOP/s")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=10, help="timed runs of each, interleaved")
  parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
  parser.add_argument("--jit", action="store_true", help="also time kiln under TinyJit (uncached runner)")
  parser.add_argument("--uncached", action="store_true", help="also time kiln without its graph cache")
  parser.add_argument("--profile", choices=list(MODELS), help="print one model's slowest kernels instead")
  parser.add_argument("--overhead", action="store_true", help="time the graph walk and cached/uncached calls instead")
  parser.add_argument("--convs", action="store_true", help="time ResNet-50's convs alone at batch 1 and 4 instead")
  parser.add_argument("--sizes", action="store_true", help="symbolic sizes against a graph per size instead")
  parser.add_argument("--sized", nargs="*", default=None, help="with --sizes: only these models")
  args = parser.parse_args()
  if args.profile: return profile(args.profile)
  if args.convs: return convs(args.runs)
  if args.sizes: return sizes(args.runs, args.sized)
  if args.overhead:
    for name in args.models.split(","): overhead(name, args.runs)
    return
  threads = int(os.environ.get("THREADS", "1"))
  print(f"THREADS={threads}, {args.runs} interleaved runs each, python {sys.version.split()[0]}")
  for name in args.models.split(","): bench(name, args.runs, threads, args.jit, args.uncached)

if __name__ == "__main__": main()
