"""check(): run a kiln function and a torch function on the same random inputs and compare values and gradients."""
from __future__ import annotations
import functools
import numpy as np
import torch
from kiln import Tensor, Device, dtypes
from kiln.engine import realize
from kiln.renderer.python import PythonRenderer

def make_input(shape, dtype, rng: np.random.Generator, low=-2.0, high=2.0) -> np.ndarray:
  """Random values of `shape`: uniform floats in [low, high), ints in [low, high), fair bools."""
  dt = np.dtype(dtype)
  if dt == np.bool_: return rng.random(shape) < 0.5
  if dt.kind in "iu":
    lo = int(np.floor(low))
    return rng.integers(lo, max(int(np.ceil(high)), lo + 1), shape).astype(dt)
  return rng.uniform(low, high, shape).astype(dt)

def to_numpy(t: torch.Tensor) -> np.ndarray:
  t = t.detach()
  return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

def default_tols(dtype) -> tuple[float, float]:
  name = str(dtype).replace("torch.", "")
  return {"float16": (2e-2, 1e-2), "bfloat16": (5e-2, 2e-2), "float64": (1e-10, 1e-10)}.get(name, (1e-5, 1e-4))

def assert_close(got, want, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
  """Shapes equal and |got - want| <= atol + rtol*|want| everywhere (NaNs must match); names the worst element."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
  if got.dtype == np.bool_ or want.dtype == np.bool_ or got.dtype.kind in "iu" and want.dtype.kind in "iu":
    bad = got != want
    if bad.any():
      i = tuple(int(v) for v in np.argwhere(bad)[0])
      raise AssertionError(f"{what} (shape {got.shape}): {int(bad.sum())} elements differ, first at {i}: "
                           f"got {got[i]}, expected {want[i]}")
    return
  g, w = got.astype(np.float64), want.astype(np.float64)
  with np.errstate(invalid="ignore"):
    diff = np.where(np.isnan(g) & np.isnan(w), 0.0, np.abs(g - w))
    diff = np.where((g == w), 0.0, diff)   # equal infinities
    bad = ~(diff <= atol + rtol * np.nan_to_num(np.abs(w), posinf=0.0))
  if bad.any():
    i = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1)), diff.shape)
    raise AssertionError(f"{what} (shape {got.shape}): {int(bad.sum())} elements out of tolerance, worst difference "
                         f"{diff[i]:.4g} at {tuple(int(v) for v in i)}: got {g[i]!r}, expected {w[i]!r} "
                         f"(atol={atol}, rtol={rtol})")

def check(kiln_fn, torch_fn, shapes, dtype="float32", grad=True, device=None, atol=None, rtol=None, low=-2.0, high=2.0,
          seed=0, check_dtype=True):
  """Compare kiln_fn(*tensors) with torch_fn(*tensors) on the same random inputs, forward and (if `grad`) backward.

  `shapes` holds one entry per input: a shape tuple, or a numpy array used as is. `dtype` is one name for all inputs or a
  list. Gradients are those of (out * W).sum() for a fixed random W, with respect to every float input.
  """
  device = device or Device.DEFAULT   # DEV=LLVM (or another device) runs the op tests there
  rng = np.random.default_rng(seed)
  dts = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(shapes)
  arrays = [s if isinstance(s, np.ndarray) else make_input(s, d, rng, low, high) for s, d in zip(shapes, dts)]
  diff_in = [grad and a.dtype.kind == "f" for a in arrays]
  kx = [Tensor(a, device=device, requires_grad=True if g else None) for a, g in zip(arrays, diff_in)]
  tx = [torch.tensor(a, requires_grad=g) for a, g in zip(arrays, diff_in)]
  desc = f"inputs {', '.join(f'{a.shape} {a.dtype}' for a in arrays)} on {device}"
  kout, tout = kiln_fn(*kx), torch_fn(*tx)
  assert kout.shape == tuple(tout.shape), f"{desc}: output shape {kout.shape} != torch {tuple(tout.shape)}"
  tdt = str(tout.dtype).replace("torch.", "")
  if check_dtype: assert kout.dtype.name == _kiln_name(tdt), f"{desc}: output dtype {kout.dtype} != torch {tout.dtype}"
  d_atol, d_rtol = default_tols(tdt)
  atol, rtol = d_atol if atol is None else atol, d_rtol if rtol is None else rtol
  do_grad = grad and tout.requires_grad
  if do_grad:   # backward before anything is realized: realizing an output replaces its graph by its buffer
    weight = rng.standard_normal(tout.shape).astype(np.float32)
    (tout * torch.tensor(weight).to(tout.dtype)).sum().backward()
    (kout * Tensor(weight, device=device).cast(kout.dtype)).sum().backward()
    Tensor.realize_all([kout] + [k.grad for k in kx if k.grad is not None])
  assert_close(kout.numpy(), to_numpy(tout), f"forward, {desc}", atol, rtol)
  if not do_grad: return kout
  for i, (k, t) in enumerate(zip(kx, tx)):
    if not diff_in[i]: continue
    want = to_numpy(t.grad) if t.grad is not None else np.zeros(t.shape, arrays[i].dtype)
    got = k.grad.numpy() if k.grad is not None else np.zeros(k.shape, arrays[i].dtype)
    assert_close(got, want, f"grad of input {i}, {desc}", atol, rtol)
  return kout

def _kiln_name(torch_name: str) -> str:
  """kiln's DType.name for a torch dtype name."""
  names = {"float32": "float", "float64": "double", "float16": "half", "int8": "char", "uint8": "uchar", "int16": "short",
           "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong"}
  return names.get(torch_name, torch_name)

def check_stacked(names, kiln_fns, torch_fns, arrays, **kwargs):
  """check() of many ops at once: op i gets row i of every input, and the results are padded into rows of one output.

  One kernel runs all the ops forward and one per input backward (instead of one each per op); a failure names the row's op.
  """
  n = len(kiln_fns)
  def kiln_fn(*xs):
    outs = [fn(*(x[i] for x in xs)) for i, fn in enumerate(kiln_fns)]
    rows = [o.reshape(1, *o.shape).pad(((i, n - 1 - i),) + ((0, 0),) * o.ndim) for i, o in enumerate(outs)]
    return functools.reduce(lambda a, b: a | b if a.dtype == dtypes.bool else a + b, rows)
  def torch_fn(*xs): return torch.stack([fn(*(x[i] for x in xs)) for i, fn in enumerate(torch_fns)])
  try: return check(kiln_fn, torch_fn, arrays, **kwargs)
  except AssertionError as e: raise AssertionError(f"{e}\n(row i is op {dict(enumerate(names))})") from None

# ---------------- a GPU-style PYTHON device (no GPU needed) ----------------

class GPUStylePython(PythonRenderer):
  """The PYTHON renderer as a GPU target: kernels go through the axis-mapping stage (kiln/codegen/gpudims.py)."""
  has_local = True

class DropLaunch:
  """The PYTHON program, taking (and recording, then ignoring) the launch sizes a GPU runner passes: the emulator
  loops over them."""
  launches: list = []
  def __init__(self, program): self.program = program
  def __call__(self, *bufs, vals=(), wait=False, launch=None):
    if launch is not None: DropLaunch.launches.append(launch)
    return self.program(*bufs, vals=vals, wait=wait)

def use_gpu_style_python(monkeypatch) -> str:
  """Make device PYTHON a GPU-style target for one test (fresh runner caches, no codegen cache); its name."""
  dev = Device["PYTHON"]
  runtime = dev.runtime
  monkeypatch.setattr(dev, "renderer", GPUStylePython())
  monkeypatch.setattr(dev, "runtime", lambda name, lib: DropLaunch(runtime(name, lib)))
  monkeypatch.setattr(realize, "_runner_cache", {})
  monkeypatch.setenv("CODEGEN_CACHE", "0")
  DropLaunch.launches.clear()
  return "PYTHON"

def kernel_sources(fn) -> list[str]:
  """The source of every kernel realizing `fn()` launches (compiled runners recorded as they run)."""
  sources, original = [], realize.CompiledRunner.__call__
  def record(self, bufs, var_vals=None, wait=False):
    sources.append(self.source)
    return original(self, bufs, var_vals, wait)
  realize.CompiledRunner.__call__ = record
  try: fn().realize()
  finally: realize.CompiledRunner.__call__ = original
  return sources
