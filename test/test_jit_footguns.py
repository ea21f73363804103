"""TinyJit footguns beyond test/test_jit.py: numpy state, memory use of a replay, `optimize=True`, the GraphRunner
interface on another device, tinygrad's constructor, and replay against eager for seeded random small graphs of
elementwise, reduce and movement ops. Each case gives the eager answer or raises; none gives a wrong answer."""
import inspect
import numpy as np
import pytest
from kiln import Tensor, TinyJit, Device, GlobalCounters
from kiln.device import CompileError
from kiln.engine import graph as graph_module
from kiln.engine.realize import CompiledRunner

RNG = np.random.default_rng(5)

def rand(*shape) -> np.ndarray:
  return RNG.standard_normal(shape).astype(np.float32)

# ---------------- numpy state ----------------

GLOBAL_TABLE = np.float32([1, 2, 3])

class Holder:
  def __init__(self): self.table = np.float32([1, 2, 3])

@pytest.mark.parametrize("where", ["closure", "global", "argument object"])
def test_numpy_array_changed_in_place_between_calls_recaptures(where):
  table, holder = np.float32([1, 2, 3]), Holder()
  arrays = {"closure": table, "global": GLOBAL_TABLE, "argument object": holder.table}
  @TinyJit
  def f(x, h):
    source = table if where == "closure" else GLOBAL_TABLE if where == "global" else h.table
    return (x + Tensor(source)).realize()   # the array's contents are copied into a buffer the capture keeps
  try:
    for i in range(6):
      if i == 3: arrays[where][:] = [10, 20, 30]
      v = rand(3)
      np.testing.assert_allclose(f(Tensor(v), holder).numpy(), v + arrays[where], rtol=1e-6)
  finally: GLOBAL_TABLE[:] = [1, 2, 3]

def test_a_realized_constant_overwritten_later_does_not_change_the_capture():
  # Tensor(2.0).realize() is the same graph node as the 2 in `x * 2`: the capture reads its buffer instead of the
  # constant, so overwriting that buffer must not change what the jitted function computes
  lr = Tensor(2.0).realize()
  @TinyJit
  def f(x): return (x * 2 + 1).realize()
  for i in range(6):
    if i == 3: lr.assign(5.0).realize()
    np.testing.assert_allclose(f(Tensor(np.float32([1, 2]))).numpy(), [3, 5])
  np.testing.assert_allclose(lr.numpy(), 5.0)

def test_a_result_computed_before_the_capture_goes_stale_when_its_input_changes():
  w = Tensor(np.float32([1, 2])).realize()
  doubled = (w * 3).realize()   # the jitted function builds the same node and reuses this result
  @TinyJit
  def f(x): return (x + w * 3).realize()
  for i in range(6):
    if i >= 3: w.assign(w + 1).realize()
    np.testing.assert_allclose(f(Tensor(np.float32([0, 0]))).numpy(), w.numpy() * 3)
  assert doubled is not None

def test_numpy_scalars_in_arguments_are_guarded_by_value():
  @TinyJit
  def f(x, scale): return (x * float(scale)).realize()
  for s in [np.float32(2), np.float32(2), np.float32(2), np.float32(3), np.float32(3), np.float32(3)]:
    v = rand(3)
    np.testing.assert_allclose(f(Tensor(v), s).numpy(), v * s, rtol=1e-6)
  assert len(f._captures) == 2

def test_keyword_arguments_in_another_order():
  @TinyJit
  def f(a, b): return (a - b).realize()
  for i in range(4):
    an, bn = rand(2), rand(2)
    np.testing.assert_allclose(f(a=Tensor(an), b=Tensor(bn)).numpy(), an - bn, rtol=1e-6)
    np.testing.assert_allclose(f(b=Tensor(bn), a=Tensor(an)).numpy(), an - bn, rtol=1e-6)

def test_changing_a_list_or_dict_argument_inside_raises():
  @TinyJit
  def append(xs):
    xs.append(xs[0] + 1)   # a replay would not append
    return (xs[0] * 2).realize()
  append([Tensor([1.0])])
  with pytest.raises(RuntimeError, match="changed a list, tuple or dict in its arguments during the call"):
    append([Tensor([1.0])])
  @TinyJit
  def store(d):
    d["x"] = (d["x"] * 2).realize()   # rebinding a tensor inside a dict argument
    return d["x"]
  store({"x": Tensor([1.0])})
  with pytest.raises(RuntimeError, match="changed a list, tuple or dict in its arguments"): store({"x": Tensor([1.0])})

def test_default_device_and_dtype_are_part_of_the_guard():
  from kiln import dtypes
  @TinyJit
  def f(x): return (x.to(Device.DEFAULT) + Tensor([0.5, 1.5])).realize()
  previous = Device.DEFAULT
  try:
    for device, default_float in [("CPU", dtypes.float32)] * 3 + [("PYTHON", dtypes.float32)] * 3 + \
                                 [("CPU", dtypes.float16)] * 3:
      Device.DEFAULT, dtypes.default_float = device, default_float
      out = f(Tensor([1.0, 2.0], device="CPU", dtype=dtypes.float32))
      assert out.device == device
      np.testing.assert_allclose(out.numpy(), [1.5, 3.5])
  finally: Device.DEFAULT, dtypes.default_float = previous, dtypes.float32
  assert len(f._captures) == 3

# ---------------- memory: a replay allocates nothing new ----------------

def test_replays_allocate_no_new_memory(monkeypatch):
  """Intermediates are kept by the capture; each replay's fresh outputs come from the allocator's cache of the
  outputs the caller dropped, so a replay never asks the device for new memory."""
  allocator = Device["CPU"].allocator
  real_alloc, allocations = allocator._alloc, [0]
  def counting_alloc(nbytes):
    allocations[0] += 1
    return real_alloc(nbytes)
  monkeypatch.setattr(allocator, "_alloc", counting_alloc)
  @TinyJit
  def f(x):
    y = (x * 2 + 1).contiguous()          # an intermediate of 256 floats
    return (y.exp2() + y).sum(), y + 3    # two outputs
  inputs = [Tensor(rand(256)).realize() for _ in range(8)]
  for t in inputs[:3]: f(t)               # eager, capture, first replay (it builds the CPU graph)
  allocations[0], used = 0, GlobalCounters.mem_used
  for t in inputs[3:]:
    s, y = f(t)
    np.testing.assert_allclose(y.numpy(), t.numpy() * 2 + 4, rtol=1e-6)
    del s, y                              # the caller drops the outputs: their memory goes back to the cache
  assert allocations[0] == 0, f"{allocations[0]} device allocations during 5 replays"
  assert GlobalCounters.mem_used == used, "a replay kept memory after its outputs were dropped"

def test_optimize_lets_intermediates_share_memory():
  def chain(x):
    for _ in range(4): x = (x * 2 + 1).realize()   # each result is an intermediate with a short lifetime
    return (x - 1).realize()
  plain, optimized = TinyJit(chain), TinyJit(chain, optimize=True)
  for _ in range(5):
    v = rand(8)
    want = chain(Tensor(v)).numpy()
    np.testing.assert_allclose(plain(Tensor(v)).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(optimized(Tensor(v)).numpy(), want, rtol=1e-6)
  def distinct(jit): return len({id(b) for item in jit.jit_cache for b in item.bufs})
  # 4 intermediates -> 2 (a realized constant read by the kernels may add one buffer to both)
  assert distinct(plain) >= 6 and distinct(optimized) == distinct(plain) - 2

def test_constructor_takes_tinygrads_arguments():
  params = inspect.signature(TinyJit.__init__).parameters
  assert list(params)[1:] == ["fxn", "captured", "prune", "optimize"]
  assert params["prune"].default is False and params["optimize"].default is False
  with pytest.raises(ValueError, match="give a function or a captured jit"): TinyJit(None)

def test_a_captured_jit_replays_alone_and_refuses_other_arguments():
  @TinyJit
  def f(x): return (x * 5).realize()
  for _ in range(3): f(Tensor(rand(3)))
  alone = TinyJit(None, captured=f.captured)
  v = rand(3)
  np.testing.assert_allclose(alone(Tensor(v)).numpy(), v * 5, rtol=1e-6)
  with pytest.raises(RuntimeError, match="do not match the capture"): alone(Tensor(rand(4)))

# ---------------- the GraphRunner interface on another device ----------------

class PythonBatch(graph_module.GraphRunner):
  """A batched launcher for the PYTHON device: what a device's graph must do, in the simplest form."""
  built: list = []
  @staticmethod
  def supports(item) -> bool: return isinstance(item.runner, CompiledRunner)
  def __init__(self, items, swapped):
    super().__init__(items, swapped)
    self.calls = 0
    PythonBatch.built.append(self)
  def __call__(self) -> None:
    self.calls += 1
    for item in self.items: item.runner(item.bufs, item.var_vals)

def test_graph_runner_interface_serves_another_device(monkeypatch):
  monkeypatch.setitem(graph_module.GRAPHS, "PYTHON", PythonBatch)
  PythonBatch.built.clear()
  @TinyJit
  def f(a, b):
    y = (a * 2 + b).contiguous()
    return (y * a).sum(), y + 1
  held = []
  for _ in range(5):
    an, bn = rand(4), rand(4)
    held.append((f(Tensor(an, device="PYTHON"), Tensor(bn, device="PYTHON")), an, bn))
  assert len(PythonBatch.built) == 1 and PythonBatch.built[0].calls == 3 and len(PythonBatch.built[0].items) == 3
  assert f.captured._launches == PythonBatch.built   # the whole replay is one submission
  for (s, y), an, bn in held:   # swapped inputs were read, fresh outputs written, held outputs kept
    np.testing.assert_allclose(y.numpy(), an * 2 + bn + 1, rtol=1e-6)
    np.testing.assert_allclose(s.numpy(), ((an * 2 + bn) * an).sum(), rtol=1e-5)

def test_a_graph_that_fails_to_build_falls_back_to_plain_launches(monkeypatch):
  class Broken(PythonBatch):
    def __init__(self, items, swapped): raise CompileError("no graph today")
  monkeypatch.setitem(graph_module.GRAPHS, "PYTHON", Broken)
  @TinyJit
  def f(a): return ((a + 1).contiguous() * 3).realize()
  for _ in range(4):
    v = rand(3)
    np.testing.assert_allclose(f(Tensor(v, device="PYTHON")).numpy(), (v + 1) * 3, rtol=1e-6)
  assert len(f.captured._launches) == 2 and not any(isinstance(l, PythonBatch) for l in f.captured._launches)

# ---------------- replay against eager: seeded random small graphs ----------------

UNARY = [
  ("relu", lambda t: t.relu()), ("neg", lambda t: -t), ("half", lambda t: t * 0.5 + 0.25), ("abs", lambda t: t.abs()),
  ("sum0", lambda t: t.sum(0, keepdim=True).expand(3, 3)), ("max1", lambda t: t.max(1, keepdim=True).expand(3, 3)),
  ("flip", lambda t: t.flip(0)), ("transpose", lambda t: t.permute(1, 0)),
  ("shift", lambda t: t[1:, :].pad(((0, 1), (0, 0)))), ("reverse", lambda t: t.reshape(9).flip(0).reshape(3, 3)),
  ("cut", lambda t: t.contiguous()),
]
BINARY = [("add", lambda s, t: s + t), ("mul", lambda s, t: s * t), ("max", lambda s, t: s.maximum(t)),
          ("where", lambda s, t: (s > t).where(s, t))]

def random_graph(seed: int, n_ops: int = 6):
  """A function of three (3, 3) tensors built from `n_ops` ops drawn with `seed`, and the ops' names."""
  rng = np.random.default_rng(seed)
  program = []
  for _ in range(n_ops):
    if rng.random() < 0.5: program.append(("unary", int(rng.integers(len(UNARY))), int(rng.integers(99)), 0))
    else: program.append(("binary", int(rng.integers(len(BINARY))), int(rng.integers(99)), int(rng.integers(99))))
  def graph(a, b, c):
    values = [a, b, c]
    for kind, op, first, second in program:
      x, y = values[first % len(values)], values[second % len(values)]
      values.append(UNARY[op][1](x) if kind == "unary" else BINARY[op][1](x, y))
    return values[-1] + values[-2], values[-3] * 2
  return graph, [(UNARY if kind == "unary" else BINARY)[op][0] for kind, op, _, _ in program]

@pytest.mark.parametrize("seed", range(8))
def test_random_small_graphs_replay_like_eager(seed):
  graph, names = random_graph(seed)
  jitted = TinyJit(graph)
  rng = np.random.default_rng(100 + seed)
  for call in range(5):
    arrays = [rng.uniform(-2, 2, (3, 3)).astype(np.float32) for _ in range(3)]
    def inputs():   # the third input is a transposed view on every call: a strided input is replayed too
      return Tensor(arrays[0]), Tensor(arrays[1]), Tensor(arrays[2].T.copy()).T
    want = [t.numpy() for t in graph(*inputs())]
    got = [t.numpy() for t in jitted(*inputs())]
    for w, g in zip(want, got):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"seed {seed}, call {call}, ops {names}")
  assert jitted.captured is not None and len(jitted._captures) == 1
