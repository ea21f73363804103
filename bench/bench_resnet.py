"""Eager training (no TinyJit): one ResNet-50 SGD-with-momentum step at batch 4, 224x224, in kiln and PyTorch.

Run: PYTHONPATH=. python bench/bench_resnet.py [--steps N] [--batch B] [--size S] [--cold-cache] [--profile PART]
     [--stub-kernels] [--phases] [--no-torch]

The model is built with kiln's own nn layers, and the same model is written by hand in PyTorch (torchvision is not
needed) with kiln's initial weights copied in, so both frameworks train the same network on the same data. A step is
forward, cross-entropy loss, backward and `SGD(momentum=0.9).step()`, realized together with the BatchNorm running
statistics. The first step is the cold one (graph building, scheduling, compiling every kernel); the next `--steps`
are warm: their minimum and median are printed (the machine may be shared: the minimum is the steady figure).
`--cold-cache` points CACHEDB at an empty folder so every kernel is compiled anew (otherwise the on-disk compile
cache of earlier runs is used: a cold process, not a cold machine). The losses of both frameworks are printed per
step: the first step's must agree to ~1e-6 (a larger difference is reported as a mismatch: a wrong forward pass),
later ones drift apart as BatchNorm over 4 images amplifies rounding. `--profile first|warm` runs cProfile over that
part and prints the top functions by cumulative time (PROFILE_SORT=tottime for own time; "warm": the steps after the
second, which first reads the optimizer state realized). `--phases` prints the median CPU time of each phase of a
warm step on the main thread (zero_grad, forward, backward, the optimizer's graph, realize, and the garbage
collector's share of them). `--stub-kernels` launches no compiled kernel after the first step (kiln's losses are
garbage then), so the warm steps show only Python's part: graph building, autograd, scheduling and the launch path.
`--no-torch` skips PyTorch.
"""
from __future__ import annotations
import argparse, cProfile, gc, os, pstats, statistics, sys, tempfile, time

def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5, help="warm steps timed after the first")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--size", type=int, default=224, help="image height and width")
  parser.add_argument("--cold-cache", action="store_true", help="compile every kernel anew (empty CACHEDB)")
  parser.add_argument("--profile", choices=["first", "warm"], help="cProfile the first step or the warm steps")
  parser.add_argument("--stub-kernels", action="store_true", help="launch no kernels after the first step")
  parser.add_argument("--no-torch", action="store_true", help="time kiln only")
  parser.add_argument("--phases", action="store_true", help="print kiln's CPU time per phase of a warm step")
  return parser.parse_args()

ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.cold_cache: os.environ["CACHEDB"] = tempfile.mkdtemp(prefix="kiln_resnet_cache_")

import numpy as np
from kiln import Tensor, nn
from kiln.nn.optim import SGD
from kiln.nn.state import get_parameters

# ResNet-50: bottleneck blocks per stage and each stage's bottleneck width (the block's output has 4x the channels)
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
EXPANSION = 4

class Bottleneck:
  """1x1 reduce, 3x3 (strided, as torchvision's ResNet v1.5), 1x1 expand, each with BatchNorm; residual added."""
  def __init__(self, in_channels: int, width: int, stride: int):
    out_channels = width * EXPANSION
    self.conv1, self.bn1 = nn.Conv2d(in_channels, width, 1, bias=False), nn.BatchNorm2d(width)
    self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
    self.bn2 = nn.BatchNorm2d(width)
    self.conv3, self.bn3 = nn.Conv2d(width, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels)
    self.downsample = []
    if stride != 1 or in_channels != out_channels:
      self.downsample = [nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(out_channels)]

  def __call__(self, x: Tensor) -> Tensor:
    out = self.bn1(self.conv1(x)).relu()
    out = self.bn2(self.conv2(out)).relu()
    out = self.bn3(self.conv3(out))
    shortcut = x.sequential(self.downsample) if self.downsample else x
    return (out + shortcut).relu()

class ResNet50:
  """ResNet-50 (He et al. 2015, torchvision's layout and names) built from kiln.nn layers."""
  def __init__(self, num_classes: int = 1000):
    self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
    self.layers: list[list[Bottleneck]] = []
    channels = 64
    for stage, (blocks, width) in enumerate(STAGES):
      stage_blocks = []
      for block in range(blocks):
        stage_blocks.append(Bottleneck(channels, width, 2 if block == 0 and stage > 0 else 1))
        channels = width * EXPANSION
      self.layers.append(stage_blocks)
    self.fc = nn.Linear(channels, num_classes)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.bn1(self.conv1(x)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)
    for stage in self.layers: x = x.sequential(stage)
    return self.fc(x.mean((2, 3)))

def torch_resnet50(model: ResNet50):
  """The same network in PyTorch, written out by hand, with `model`'s weights and BatchNorm statistics copied in."""
  import torch
  from torch import nn as tnn
  def conv(layer: nn.Conv2d) -> tnn.Conv2d:
    out_channels, in_channels, kernel, _ = layer.weight.shape
    made = tnn.Conv2d(in_channels, out_channels, kernel, stride=layer.stride, padding=layer.padding, bias=False)
    made.weight.data = torch.from_numpy(layer.weight.numpy().copy())
    return made
  def norm(layer: nn.BatchNorm2d) -> tnn.BatchNorm2d:
    made = tnn.BatchNorm2d(layer.num_features)
    for name in ("weight", "bias", "running_mean", "running_var"):
      getattr(made, name).data = torch.from_numpy(getattr(layer, name).numpy().copy())
    return made
  class TorchBottleneck(tnn.Module):
    def __init__(self, block: Bottleneck):
      super().__init__()
      self.conv1, self.bn1 = conv(block.conv1), norm(block.bn1)
      self.conv2, self.bn2 = conv(block.conv2), norm(block.bn2)
      self.conv3, self.bn3 = conv(block.conv3), norm(block.bn3)
      self.downsample = tnn.Sequential(conv(block.downsample[0]), norm(block.downsample[1])) if block.downsample \
        else None
    def forward(self, x):
      out = torch.relu(self.bn1(self.conv1(x)))
      out = torch.relu(self.bn2(self.conv2(out)))
      out = self.bn3(self.conv3(out))
      return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))
  class TorchResNet50(tnn.Module):
    def __init__(self):
      super().__init__()
      self.conv1, self.bn1 = conv(model.conv1), norm(model.bn1)
      self.layers = tnn.Sequential(*[tnn.Sequential(*[TorchBottleneck(b) for b in stage]) for stage in model.layers])
      self.fc = tnn.Linear(model.fc.weight.shape[1], model.fc.weight.shape[0])
      self.fc.weight.data = torch.from_numpy(model.fc.weight.numpy().copy())
      self.fc.bias.data = torch.from_numpy(model.fc.bias.numpy().copy())
    def forward(self, x):
      x = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
      return self.fc(self.layers(x).mean((2, 3)))
  return TorchResNet50()

LR, MOMENTUM = 0.01, 0.9

PHASES = ("zero_grad", "forward", "backward", "optimizer", "realize", "collector")

class _CollectorClock:
  """CPU seconds spent in Python's garbage collector since `reset()` (gc.callbacks)."""
  def __init__(self):
    self.total, self.started = 0.0, 0.0
    gc.callbacks.append(self.callback)
  def callback(self, phase: str, info: dict) -> None:
    if phase == "start": self.started = time.thread_time()
    else: self.total += time.thread_time() - self.started
  def reset(self) -> None: self.total = 0.0

def time_kiln(model: ResNet50, images: np.ndarray, labels: np.ndarray, steps: int, profile: str | None,
              stub_kernels: bool = False):
  """Per-step wall times (the first is the cold step), losses, and each step's CPU time per phase (PHASES: the
  collector's time is also inside the phase it interrupted) of kiln's eager training loop."""
  params = get_parameters(model)
  opt = SGD(params, lr=LR, momentum=MOMENTUM)
  x, y = Tensor(images), Tensor(labels)
  x.realize(), y.realize()
  times, losses, phases = [], [], []
  profiler = cProfile.Profile() if profile else None
  collector = _CollectorClock()
  with Tensor.train():
    for step in range(steps + 1):
      profiling = profiler is not None and (step == 0 if profile == "first" else step >= 2)
      if step == 1 and stub_kernels:
        from kiln.runtime.ops_cpu import CPUProgram
        CPUProgram.__call__ = lambda self, *bufs, vals=(), wait=False: 0.0 if wait else None
      if profiling: profiler.enable()
      collector.reset()
      start, marks = time.perf_counter(), [time.thread_time()]
      opt.zero_grad()
      marks.append(time.thread_time())
      loss = model(x).sparse_categorical_crossentropy(y)
      marks.append(time.thread_time())
      loss.backward()
      marks.append(time.thread_time())
      updates = opt.schedule_step()
      marks.append(time.thread_time())
      Tensor.realize(loss, *updates)
      marks.append(time.thread_time())
      times.append(time.perf_counter() - start)
      if profiling: profiler.disable()
      phases.append([b - a for a, b in zip(marks, marks[1:])] + [collector.total])
      losses.append(float(loss.item()))
  gc.callbacks.remove(collector.callback)
  if profiler is not None: pstats.Stats(profiler).sort_stats(profile_sort()).print_stats(40)
  return times, losses, phases

def profile_sort() -> str:
  """The pstats order for --profile: cumulative time, or PROFILE_SORT (e.g. tottime)."""
  return os.environ.get("PROFILE_SORT", "cumulative")

def report_phases(phases: list[list[float]]) -> None:
  """Each phase's median CPU time over the warm steps (with --stub-kernels, realize is Python's part alone)."""
  warm = phases[1:]
  if not warm: return
  medians = [statistics.median(step[i] for step in warm) * 1e3 for i in range(len(PHASES))]
  print("kiln     warm step CPU ms (median, main thread): " +
        ", ".join(f"{name} {ms:.1f}" for name, ms in zip(PHASES, medians)) +
        f"; sum of phases {sum(medians[:-1]):.1f}")

def time_torch(model, images: np.ndarray, labels: np.ndarray, steps: int):
  """Per-step wall times and losses of the same loop in PyTorch eager."""
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
  x, y = torch.from_numpy(images), torch.from_numpy(labels).long()
  model.train()
  times, losses = [], []
  for _ in range(steps + 1):
    start = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - start)
    losses.append(float(loss.item()))
  return times, losses

def report(name: str, times: list[float], losses: list[float]) -> None:
  warm = times[1:]
  warm_text = f"warm min {min(warm):.3f} s, median {statistics.median(warm):.3f} s" if warm else "no warm steps"
  print(f"{name:8s} first step {times[0]:.3f} s, {warm_text}; losses {' '.join(f'{v:.5f}' for v in losses)}")

def main(args: argparse.Namespace) -> None:
  rng = np.random.default_rng(0)
  Tensor.manual_seed(0)
  model = ResNet50()
  images = rng.standard_normal((args.batch, 3, args.size, args.size), dtype=np.float32)
  labels = rng.integers(0, 1000, args.batch).astype(np.int32)
  torch_model = None if args.no_torch else torch_resnet50(model)   # copied before kiln's steps move the weights
  print(f"ResNet-50 SGD(momentum={MOMENTUM}) step, batch {args.batch}, {args.size}x{args.size}, eager, "
        f"{os.cpu_count()} cores{', empty compile cache' if args.cold_cache else ''}")
  kiln_times, kiln_losses, kiln_phases = time_kiln(model, images, labels, args.steps, args.profile, args.stub_kernels)
  report("kiln", kiln_times, kiln_losses)
  if args.phases: report_phases(kiln_phases)
  if torch_model is not None:
    torch_times, torch_losses = time_torch(torch_model, images, labels, args.steps)
    report("torch", torch_times, torch_losses)
    if kiln_times[1:] and torch_times[1:]:
      print(f"warm step kiln/torch (minimums): {min(kiln_times[1:]) / min(torch_times[1:]):.2f}x")
    # the first step's loss is the forward pass of the same weights on the same data: float32 rounding alone moves it
    # by ~1e-6. Later steps drift apart legitimately (BatchNorm over 4 images amplifies rounding: PyTorch in float32
    # and float64 disagree on some gradients by 20%), so only the first is checked
    mismatch = abs(kiln_losses[0] - torch_losses[0]) / abs(torch_losses[0])
    if mismatch > 1e-4: print(f"FIRST-STEP LOSS MISMATCH: kiln {kiln_losses[0]:.6f}, torch {torch_losses[0]:.6f} "
                              f"({mismatch:.1e} relative): kiln's forward pass is wrong")
  sys.stdout.flush()

if __name__ == "__main__": main(ARGS)
