"""TinyJit: capture on call 2, replay from call 3, and the footgun suite (every case: the right answer or a clear
error, never a wrong answer). References are NumPy (and eager kiln for the random graphs and the optimizer)."""
import numpy as np
import pytest
import kiln.tensor
from kiln import Tensor, TinyJit, Context, dtypes
from kiln.nn.optim import SGD, Adam

RNG = np.random.default_rng(0)

def rand(*shape) -> np.ndarray:
  return RNG.standard_normal(shape).astype(np.float32)

@pytest.fixture
def schedules(monkeypatch):
  """Counts create_schedule calls: a replay builds and schedules no graph."""
  count = [0]
  real = kiln.tensor.create_schedule
  def counting(roots):
    count[0] += 1
    return real(roots)
  monkeypatch.setattr(kiln.tensor, "create_schedule", counting)
  return count

# ---------------- capture and replay ----------------

def test_replay_matches_numpy_and_schedules_nothing(schedules):
  @TinyJit
  def f(a, b): return (a + b).relu() * 2, (a * b).sum()
  for i in range(5):
    an, bn = rand(4), rand(4)
    a, b = Tensor(an), Tensor(bn)
    before = schedules[0]
    x, y = f(a, b)
    if i >= 2: assert schedules[0] == before, "a replay must not schedule"
    np.testing.assert_allclose(x.numpy(), np.maximum(an + bn, 0) * 2, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), (an * bn).sum(), rtol=1e-5)
  assert len(f.jit_cache) == 2 and f.cnt == 5

def test_outputs_held_across_calls_are_not_overwritten():
  @TinyJit
  def f(x): return (x * 3).realize()
  inputs = [rand(3) for _ in range(5)]
  outs = [f(Tensor(v)) for v in inputs]
  for v, out in zip(inputs, outs): np.testing.assert_allclose(out.numpy(), v * 3, rtol=1e-6)
  assert len({id(o.uop.base.buffer) for o in outs}) == 5

def test_output_fed_back_as_input_keeps_replaying():
  @TinyJit
  def step(h): return (h * 0.5 + 1).realize()
  h, ref = Tensor([4.0, 8.0]), np.array([4.0, 8.0], np.float32)
  for _ in range(6):
    h, ref = step(h), ref * 0.5 + 1
  np.testing.assert_allclose(h.numpy(), ref, rtol=1e-6)
  assert len(step._captures) == 1

def test_jit_disabled_runs_eagerly(schedules):
  @TinyJit
  def f(x): return (x + 1).realize()
  with Context(JIT=0):
    for _ in range(4):
      v = rand(3)
      np.testing.assert_allclose(f(Tensor(v)).numpy(), v + 1, rtol=1e-6)
      assert not f.jit_cache

def test_non_tensor_outputs_and_nested_return_structure():
  @TinyJit
  def f(x): return {"double": x * 2, "parts": [x + 1, "tag", 7]}
  for _ in range(4):
    v = rand(2)
    out = f(Tensor(v))
    assert out["parts"][1:] == ["tag", 7]
    np.testing.assert_allclose(out["double"].numpy(), v * 2, rtol=1e-6)
    np.testing.assert_allclose(out["parts"][0].numpy(), v + 1, rtol=1e-6)

def test_list_and_dict_inputs_with_changing_contents():
  @TinyJit
  def f(xs, d, scale=1.0): return (xs[0] * xs[1] + d["b"]) * scale
  for i in range(5):
    a, b, c = rand(3), rand(3), rand(3)
    out = f([Tensor(a), Tensor(b)], {"b": Tensor(c)}, scale=2.0 if i == 4 else 1.0)
    np.testing.assert_allclose(out.numpy(), (a * b + c) * (2.0 if i == 4 else 1.0), rtol=1e-5)
  # a list of another length is another structure: re-captured, never confused with the first
  @TinyJit
  def total(xs): return Tensor.stack(*xs).sum(0) if len(xs) > 1 else xs[0] + 0
  for n in (2, 2, 2, 3, 3, 3, 2):
    vals = [rand(2) for _ in range(n)]
    np.testing.assert_allclose(total([Tensor(v) for v in vals]).numpy(), sum(vals), rtol=1e-5)

@pytest.mark.parametrize("n_random", [0, 1, 2])
def test_random_small_graphs_replay_like_eager(n_random):
  rng = np.random.default_rng(n_random)
  unary = [lambda t: t.exp2(), lambda t: t.relu(), lambda t: t.neg(), lambda t: t.sum(0, keepdim=True)]
  binary = [lambda s, t: s + t, lambda s, t: s * t, lambda s, t: s.maximum(t)]
  ops = [(rng.integers(2), rng.integers(4), rng.integers(3), rng.integers(3)) for _ in range(4)]
  def graph(a, b):
    vals = [a, b]
    for kind, u, bi, src in ops:
      x = vals[int(src) % len(vals)]
      vals.append(unary[u](x) if kind == 0 else binary[bi](x, vals[-1]))
    return vals[-1] + vals[-2]
  jitted = TinyJit(graph)
  for _ in range(4):
    an, bn = rng.uniform(-1, 1, (2, 3)).astype(np.float32), rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    want = graph(Tensor(an), Tensor(bn)).numpy()
    np.testing.assert_allclose(jitted(Tensor(an), Tensor(bn)).numpy(), want, rtol=1e-5, atol=1e-6)

# ---------------- the footgun suite ----------------

class Scaler:
  def __init__(self, w): self.w = Tensor(w).realize()
  @TinyJit
  def __call__(self, x): return (x * self.w).realize()

def test_jitted_method_shared_by_two_instances_keeps_their_state_apart():
  first, second = Scaler(np.float32([1, 2])), Scaler(np.float32([10, 20]))
  for _ in range(4):
    v = rand(2)
    np.testing.assert_allclose(first(Tensor(v)).numpy(), v * [1, 2], rtol=1e-6)
    np.testing.assert_allclose(second(Tensor(v)).numpy(), v * [10, 20], rtol=1e-6)

def test_input_that_is_also_the_output():
  @TinyJit
  def accumulate(acc, x):
    acc.assign(acc + x)
    return acc
  acc, ref = Tensor.zeros(3).contiguous().realize(), np.zeros(3, np.float32)
  for _ in range(5):
    v = rand(3)
    out, ref = accumulate(acc, Tensor(v)), ref + v
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5)
    np.testing.assert_allclose(acc.numpy(), ref, rtol=1e-5)
  # a graph realized before a replay overwrote its input is computed again, not served stale
  doubled = (acc * 2).realize()
  ref = ref + 1
  accumulate(acc, Tensor.ones(3).contiguous())
  np.testing.assert_allclose((acc * 2).numpy(), ref * 2, rtol=1e-5)
  assert doubled is not None

def test_same_buffer_passed_twice_is_captured_separately():
  @TinyJit
  def f(a, b): return (a * 2 + b).realize()
  for _ in range(3):
    an, bn = rand(3), rand(3)
    np.testing.assert_allclose(f(Tensor(an), Tensor(bn)).numpy(), an * 2 + bn, rtol=1e-5)
  for _ in range(3):
    v = rand(3)
    t = Tensor(v)
    np.testing.assert_allclose(f(t, t).numpy(), v * 3, rtol=1e-5)
    np.testing.assert_allclose(f(t, t.reshape(3)).numpy(), v * 3, rtol=1e-5)

def test_aliased_in_place_update_is_captured_separately():
  @TinyJit
  def f(acc, x):
    # x aliasing acc must not update in place (64 elements, so a kernel's vector loads can't hide a wrong capture)
    acc.assign(acc + x.flip(0))
    return acc
  for _ in range(3):
    an, xn = rand(64), rand(64)
    np.testing.assert_allclose(f(Tensor(an), Tensor(xn)).numpy(), an + xn[::-1], rtol=1e-5)
  for _ in range(3):
    v = rand(64)
    t = Tensor(v)
    np.testing.assert_allclose(f(t, t).numpy(), v + v[::-1], rtol=1e-5)

def test_state_tensor_passed_as_input_is_not_confused():
  w = Tensor(np.float32([1, 2, 3])).realize()
  @TinyJit
  def f(x): return (x + w).realize()
  for _ in range(3): f(Tensor(rand(3)))
  np.testing.assert_allclose(f(w).numpy(), [2, 4, 6])          # the input is the state the kernels read
  v = rand(3)
  np.testing.assert_allclose(f(Tensor(v)).numpy(), v + [1, 2, 3], rtol=1e-6)

def test_python_scalars_in_arguments_and_closures():
  scale = [2.0]
  offset = 1.0
  @TinyJit
  def f(x, power: int):
    return (x * scale[0] + offset) ** power
  for power, s in [(1, 2.0), (1, 2.0), (1, 2.0), (2, 2.0), (2, 2.0), (2, 3.0), (2, 3.0), (2, 3.0)]:
    scale[0] = s
    v = rand(3)
    np.testing.assert_allclose(f(Tensor(v), power).numpy(), (v * s + offset) ** power, rtol=1e-5)

GLOBAL_W = Tensor(np.float32([1, 1])).realize()

def test_global_tensor_reassigned_between_calls():
  global GLOBAL_W
  @TinyJit
  def f(x): return (x * GLOBAL_W).realize()
  for i in range(6):
    if i == 4: GLOBAL_W = Tensor(np.float32([5, 7])).realize()   # another Buffer: the capture is out of date
    v = rand(2)
    np.testing.assert_allclose(f(Tensor(v)).numpy(), v * ([5, 7] if i >= 4 else [1, 1]), rtol=1e-6)

def test_a_global_deleted_or_a_closure_rebound_after_the_capture_is_seen():
  global GLOBAL_GONE
  GLOBAL_GONE = 3.0
  factor = 2.0
  @TinyJit
  def f(x): return (x * GLOBAL_GONE * factor).realize()
  v = rand(2)
  for _ in range(4): np.testing.assert_allclose(f(Tensor(v)).numpy(), v * 6, rtol=1e-6)
  factor = 5.0   # the closure cell now holds another value: re-captured
  np.testing.assert_allclose(f(Tensor(v)).numpy(), v * 15, rtol=1e-6)
  del GLOBAL_GONE   # the replay's guard finds the global gone: the function runs again, and fails as Python does
  with pytest.raises(NameError): f(Tensor(v))

step = 0          # a loop counter named like the optimizer's method: not read by the jitted function below
GLOBAL_SCALE = 2.0

def test_global_named_like_an_attribute_does_not_recapture(schedules):
  global step
  w = Tensor(np.float32([1, 2]), requires_grad=True)
  opt = SGD([w], lr=0.1)
  @TinyJit
  def train(x):
    opt.zero_grad()
    loss = (x * w).sum()
    loss.backward()
    opt.step()           # `step` is an attribute here (LOAD_ATTR/LOAD_METHOD), not the global counter
    return loss.realize()
  with Tensor.train():
    for step in range(8):
      before = schedules[0]
      train(Tensor(np.float32([1, 1])))
      if step >= 2: assert schedules[0] == before, f"call {step + 1} re-captured: the global `step` was guarded"
  np.testing.assert_allclose(w.numpy(), [1 - 0.8, 2 - 0.8], rtol=1e-5)

@pytest.mark.parametrize("where", ["direct", "comprehension", "lambda", "inner function"])
def test_global_really_read_recaptures_when_it_changes(where, schedules):
  global GLOBAL_SCALE
  @TinyJit
  def f(x):
    if where == "direct": s = GLOBAL_SCALE
    elif where == "comprehension": s = [GLOBAL_SCALE for _ in range(1)][0]
    elif where == "lambda": s = (lambda: GLOBAL_SCALE)()
    else:
      def inner(): return GLOBAL_SCALE
      s = inner()
    return (x * s).realize()
  scheduled = []
  try:
    for scale in [2.0, 2.0, 2.0, 2.0, 5.0, 5.0, 5.0]:
      GLOBAL_SCALE = scale
      v = rand(3)
      before = schedules[0]
      np.testing.assert_allclose(f(Tensor(v)).numpy(), v * scale, rtol=1e-6)
      scheduled.append(schedules[0] > before)
  finally: GLOBAL_SCALE = 2.0
  # calls 1-2 run eagerly, 3-4 replay, 5 re-captures (the global changed), 6-7 replay
  assert scheduled == [True, True, False, False, True, False, False], scheduled

def test_closure_tensor_updated_in_place_between_calls():
  w = Tensor(np.float32([1, 2])).realize()
  @TinyJit
  def f(x): return (x * w).realize()
  for i in range(5):
    if i == 3: w.assign(Tensor(np.float32([3, 4]))).realize()   # same Buffer, new contents: replay reads them
    v = rand(2)
    np.testing.assert_allclose(f(Tensor(v)).numpy(), v * ([3, 4] if i >= 3 else [1, 2]), rtol=1e-6)

def test_branch_on_an_argument_recaptures_and_branch_on_a_value_raises():
  @TinyJit
  def f(x, positive: bool): return (x.relu() if positive else -x).realize()
  for flag in (True, True, True, False, False, False, True):
    v = rand(3)
    np.testing.assert_allclose(f(Tensor(v), flag).numpy(), np.maximum(v, 0) if flag else -v, rtol=1e-6)
  @TinyJit
  def g(x): return x * 2 if x.sum() > 0 else x * 3
  with pytest.raises(RuntimeError, match="bool: cannot read a tensor's values inside the TinyJit function"):
    g(Tensor([1.0, 2.0]))

@pytest.mark.parametrize("make", [
  lambda v: Tensor(v.T.copy()).T,                            # transposed
  lambda v: Tensor(np.pad(v, ((0, 1), (1, 0))))[:-1, 1:],     # sliced
  lambda v: Tensor(v[:1]).expand(2, 3),                       # broadcast
])
def test_non_contiguous_inputs(make):
  @TinyJit
  def f(x): return (x * 2 + 1).realize()
  for i in range(6):
    v = rand(2, 3)
    t = make(v) if i % 3 else Tensor(v)   # contiguous and strided inputs alternate: each view is its own capture
    want = (v[:1].repeat(2, 0) if t.uop.base.size == 3 else v) * 2 + 1
    np.testing.assert_allclose(f(t).numpy(), want, rtol=1e-6)

def test_shape_and_dtype_changes_recapture():
  @TinyJit
  def f(x): return (x + x).realize()
  for shape, dtype in [((3,), "float32")] * 3 + [((2, 2), "float32")] * 3 + [((3,), "int32")] * 3:
    v = (rand(*shape) * 10).astype(dtype)
    out = f(Tensor(v))
    assert out.dtype == (dtypes.int32 if dtype == "int32" else dtypes.float32)
    np.testing.assert_allclose(out.numpy(), v + v, rtol=1e-6)
  assert len(f._captures) == 3

def test_least_recently_used_capture_is_dropped_first():
  # a replay of the newest capture skips reordering the captures: the order must stay least recently used first
  from kiln.engine.jit import MAX_CAPTURES
  @TinyJit
  def f(x): return (x * 2).realize()
  def call(n: int) -> None:
    v = rand(n)
    np.testing.assert_allclose(f(Tensor(v)).numpy(), v * 2, rtol=1e-6)
  for n in (1, 2):
    for _ in range(3): call(n)   # captures of shapes (1,) then (2,)
  for n in (1, 1, 2, 2, 1):   # (2,) then (1,) used last
    call(n)
  assert f.captured is f._captures[next(reversed(f._captures))]
  for n in range(3, MAX_CAPTURES + 2):   # MAX_CAPTURES - 1 more captures: one of the first two must go
    for _ in range(3): call(n)
  shapes = [key[1][0][2] for key in f._captures]
  assert 1 in shapes and 2 not in shapes, shapes

def test_input_on_another_device():
  @TinyJit
  def f(x): return (x + 1).realize()
  for device in ("CPU", "CPU", "CPU", "PYTHON", "PYTHON", "PYTHON", "CPU"):
    out = f(Tensor([1.0, 2.0], device=device))
    assert out.device == device
    np.testing.assert_allclose(out.numpy(), [2.0, 3.0])

def test_training_mode_is_part_of_the_guard():
  @TinyJit
  def f(x): return (x * (2.0 if Tensor.training else 3.0)).realize()
  for training in (False, False, False, True, True, True, False):
    with Tensor.train(training):
      np.testing.assert_allclose(f(Tensor([1.0])).numpy(), [2.0 if training else 3.0])

# ---------------- state updated in place: training steps ----------------

def train_steps(make_opt, jit: bool, steps: int, dropout: float = 0.0) -> tuple[np.ndarray, list[float]]:
  """Run `steps` optimizer steps of a least-squares fit (eagerly or under TinyJit); the final weights and losses."""
  rng = np.random.default_rng(1)
  xs, ys = rng.random((steps, 4, 3), np.float32), rng.random((steps, 4, 2), np.float32)
  w = Tensor(rng.random((3, 2), np.float32), requires_grad=True)
  opt = make_opt([w])
  def step(x, y):
    opt.zero_grad()
    loss = ((x.dropout(dropout) @ w - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss
  run = TinyJit(step) if jit else step
  with Tensor.train():
    losses = [run(Tensor(x), Tensor(y)).realize() for x, y in zip(xs, ys)]
  return w.numpy(), [loss.item() for loss in losses]

@pytest.mark.parametrize("make_opt", [lambda p: SGD(p, lr=0.1, momentum=0.9), lambda p: Adam(p, lr=0.05)])
def test_optimizer_step_under_tinyjit_matches_eager(make_opt):
  (w_eager, l_eager), (w_jit, l_jit) = train_steps(make_opt, False, 5), train_steps(make_opt, True, 5)
  np.testing.assert_allclose(w_jit, w_eager, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(l_jit, l_eager, rtol=1e-5, atol=1e-6)

def test_prune_drops_kernels_that_depend_on_no_input():
  w = Tensor(np.float32([1, 2, 3])).realize()
  @TinyJit
  def plain(x): return (x + (w * 2).contiguous()).realize()
  pruned = TinyJit(plain.__wrapped__, prune=True)
  for _ in range(4):
    v = rand(3)
    np.testing.assert_allclose(plain(Tensor(v)).numpy(), v + [2, 4, 6], rtol=1e-6)
    np.testing.assert_allclose(pruned(Tensor(v)).numpy(), v + [2, 4, 6], rtol=1e-6)
  assert len(plain.jit_cache) == 2 and len(pruned.jit_cache) == 1

def test_reset_forgets_captures():
  @TinyJit
  def f(x): return (x - 1).realize()
  for _ in range(3): f(Tensor([1.0]))
  assert f.jit_cache
  f.reset()
  assert not f.jit_cache and f.cnt == 0
  np.testing.assert_allclose(f(Tensor([5.0])).numpy(), [4.0])

# ---------------- clear errors at the first calls ----------------

@pytest.mark.parametrize("read", ["item", "numpy", "tolist", "data"])
def test_reading_values_inside_raises_at_the_first_call(read):
  @TinyJit
  def f(x):
    getattr(x.sum(), read)()
    return x * 2
  with pytest.raises(RuntimeError, match=f"{read}: cannot read a tensor's values inside the TinyJit function"):
    f(Tensor([1.0]))
  with Context(JIT=0): f(Tensor([1.0]))   # eager: allowed

def test_nested_tinyjit_raises():
  @TinyJit
  def inner(x): return x + 1
  @TinyJit
  def outer(x): return inner(x) * 2
  with pytest.raises(RuntimeError, match="nested TinyJit"):
    outer(Tensor([1.0]))

def test_function_that_launches_nothing_raises():
  @TinyJit
  def f(x): return x
  with pytest.raises(RuntimeError, match="launched no kernels"):
    f(Tensor([1.0]))   # already at the first (eager) call

def test_reassigning_state_inside_the_function_raises():
  class Counter:
    def __init__(self): self.total = Tensor([0.0]).realize()
    @TinyJit
    def add(self, x):
      self.total = (self.total + x).realize()   # a replay could not repeat this rebinding: use assign()
      return self.total
  c = Counter()
  c.add(Tensor([1.0]))
  with pytest.raises(RuntimeError, match=r"changed argument object #0\.total during the call"):
    c.add(Tensor([1.0]))

def test_python_state_changed_inside_the_function_raises():
  calls = {"n": 0}
  @TinyJit
  def f(x):
    calls["n"] += 1
    return x * calls["n"]
  f(Tensor([1.0]))
  with pytest.raises(RuntimeError, match=r"changed closure variable 'calls'\['n'\]"):
    f(Tensor([1.0]))

# ---------------- random numbers inside a jitted function ----------------

def test_dropout_training_step_under_tinyjit_matches_eager():
  def run(jit: bool):
    Tensor.manual_seed(7)
    w, losses = train_steps(lambda p: SGD(p, lr=0.1), jit, 6, dropout=0.5)
    return w, losses, Tensor.rand(3).numpy()
  (w_eager, l_eager, after_eager), (w_jit, l_jit, after_jit) = run(False), run(True)
  np.testing.assert_allclose(l_jit, l_eager, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w_jit, w_eager, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(after_jit, after_eager)   # the replays advanced the generator like eager calls
  assert len(set(l_eager)) == len(l_eager)

def test_random_numbers_replay_like_eager_and_follow_manual_seed():
  @TinyJit
  def noisy(x): return x + Tensor.rand(3)
  def draws(fn, n):
    return [fn(Tensor.zeros(3).contiguous().realize()).numpy() for _ in range(n)]
  Tensor.manual_seed(1)
  eager = draws(noisy.__wrapped__, 5)
  Tensor.manual_seed(1)
  jitted = draws(noisy, 5)
  np.testing.assert_array_equal(np.stack(jitted), np.stack(eager))
  assert len({tuple(v) for v in jitted}) == 5, "a replay must draw new numbers"
  Tensor.manual_seed(1)   # reseeding between replays resets the state the capture uses
  np.testing.assert_array_equal(noisy(Tensor.zeros(3).contiguous().realize()).numpy(), eager[0])

def test_random_numbers_are_the_same_on_every_device_and_one_kernel_per_call():
  from kiln import GlobalCounters
  Tensor.manual_seed(4)
  cpu = [Tensor.rand(5).numpy() for _ in range(2)]
  Tensor.manual_seed(4)
  python = [Tensor.rand(5, device="PYTHON").numpy() for _ in range(2)]
  np.testing.assert_array_equal(np.stack(cpu), np.stack(python))
  before = GlobalCounters.kernel_count
  Tensor.rand(6)   # the random bits and the counter update; the conversion to floats fuses into the consumer
  assert GlobalCounters.kernel_count - before == 2

def test_prune_keeps_random_numbers_fresh():
  @TinyJit
  def noisy(x): return (x + Tensor.rand(3)).realize()
  pruned = TinyJit(noisy.__wrapped__, prune=True)
  Tensor.manual_seed(2)
  eager = [noisy.__wrapped__(Tensor.zeros(3).contiguous()).numpy() for _ in range(4)]
  Tensor.manual_seed(2)
  np.testing.assert_array_equal(np.stack([pruned(Tensor.zeros(3).contiguous()).numpy() for _ in range(4)]),
                                np.stack(eager))

def test_manual_seed_inside_a_jitted_function_raises():
  @TinyJit
  def f(x):
    Tensor.manual_seed(0)
    return x + 1
  with pytest.raises(RuntimeError, match="manual_seed: called inside the TinyJit function"):
    f(Tensor([1.0]))

# ---------------- device graphs ----------------

def _graphs(jit) -> list:
  """The replay's device graphs: GraphRunners, or the graph class registered for the default device (CUDA's)."""
  from kiln.engine import graph
  kinds = tuple({graph.GraphRunner, *(kind for kind in graph.GRAPHS.values() if kind is not None)})
  return [launch for launch in jit.captured._launches if isinstance(launch, kinds)]

def test_cpu_graph_batches_a_replay_into_one_call_with_swapped_inputs_and_fresh_outputs():
  @TinyJit
  def f(a, b):
    y = (a * 2 + b).contiguous()
    return (y * a).sum(), y + 1
  outs = []
  for _ in range(5):
    an, bn = rand(4), rand(4)
    s, y = f(Tensor(an), Tensor(bn))
    outs.append((s, y, an, bn))
  graphs = _graphs(f)
  assert len(graphs) == 1 and len(f.captured._launches) == 1 and len(graphs[0].items) == 3
  for s, y, an, bn in outs:   # outputs held across replays keep their own values
    np.testing.assert_allclose(y.numpy(), an * 2 + bn + 1, rtol=1e-6)
    np.testing.assert_allclose(s.numpy(), ((an * 2 + bn) * an).sum(), rtol=1e-5)

def test_cpu_graph_matches_plain_replay_and_recapture_builds_a_new_graph():
  def step(x, w): return ((x @ w).relu() * 0.5).sum(1)
  plain, graphed = TinyJit(step), TinyJit(step)
  for shape in [(2, 3), (2, 3), (2, 3), (2, 3), (5, 3), (5, 3), (5, 3)]:
    xn, wn = rand(*shape), rand(3, 4)
    with Context(JIT=2): want = plain(Tensor(xn), Tensor(wn)).numpy()
    got = graphed(Tensor(xn), Tensor(wn)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, (np.maximum(xn @ wn, 0) * 0.5).sum(1), rtol=1e-5, atol=1e-6)
  assert len(graphed._captures) == 2 and len(_graphs(graphed)) == 1 and not _graphs(plain)

def test_cpu_graph_with_state_updates_and_a_copy_from_another_device():
  w = Tensor(np.float32([1, 2, 3])).realize()
  @TinyJit
  def f(x):
    w.assign(w + x.to(w.device))
    return (w * 2).realize()
  ref = np.float32([1, 2, 3])
  for _ in range(5):
    v = rand(3)
    ref = ref + v
    np.testing.assert_allclose(f(Tensor(v, device="PYTHON")).numpy(), ref * 2, rtol=1e-5)
  np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5)
  launches = f.captured._launches
  assert len(launches) == 2 and len(_graphs(f)) == 1   # the copy, then one graph of the two kernels

def test_functions_holding_kiln_machinery_replay():
  # an object that keeps a reference to the device registry (whose allocator counters change as kernels run) is not
  # user state: the JIT must still replay
  from kiln import Device
  class Holder:
    def __init__(self): self.device, self.w = Device, Tensor([1.0, 2.0]).realize()
  holder = Holder()
  @TinyJit
  def step(x): return (x * holder.w + 1).realize()
  outs = [step(Tensor([float(i), 1.0])).tolist() for i in range(4)]
  assert outs == [[float(i) + 1, 3.0] for i in range(4)] and step.cnt >= 3

def test_calls_with_the_same_tensors_still_check_the_guards():
  # a call whose arguments are the very tensors of the last replay skips building the guard key (TinyJit._last), but
  # not the state guards, the training mode, nor a new tensor after an assign
  table = np.float32([1, 2, 3])
  @TinyJit
  def f(x): return (x + Tensor(table)).realize()
  x = Tensor(np.float32([10, 20, 30])).realize()
  for i in range(6):
    if i == 3: table[:] = [100, 200, 300]
    np.testing.assert_allclose(f(x).numpy(), x.numpy() + table)
  assert f._last is not None and f._last[0] == (x.uop,)   # the last calls took the short path
  x.assign(Tensor(np.float32([-1, -2, -3]))).realize()
  for _ in range(3): np.testing.assert_allclose(f(x).numpy(), x.numpy() + table)
  @TinyJit
  def g(x): return (x.dropout(0.5) if Tensor.training else x * 2).realize()
  for training in (False, False, False, True, False):
    with Tensor.train(training):
      out = g(x).numpy()
      assert (np.isin(out, [0.0, *(x.numpy() * 2)]).all() if training else np.allclose(out, x.numpy() * 2))
