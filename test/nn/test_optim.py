"""kiln.nn.optim against torch.optim (SGD, Adam, AdamW) and NumPy references (LAMB, LARS, Muon), step for step.

The model has parameters of several shapes, a 0-d one included; every run takes 5 steps in float32.
"""
from __future__ import annotations
import pathlib, re
import numpy as np
import pytest
import torch
import kiln.tensor
from kiln import Tensor, TinyJit, GlobalCounters
from kiln.nn import Linear
from kiln.dtype import dtypes
from kiln.nn.optim import Optimizer, OptimizerGroup, SGD, LARS, Muon, Adam, AdamW, LAMB
from helpers import assert_close

STEPS = 5
SHAPES = {"w1": (4, 3), "b1": (3,), "w2": (3, 2), "scale": ()}

def initial_values() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(7)
  values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
  values["scale"] = np.float32(1.5)
  return values

def batch() -> np.ndarray:
  return np.random.default_rng(8).standard_normal((6, 4)).astype(np.float32)

def loss_of(params: dict, x):
  """The same loss for kiln and torch tensors: a two-layer tanh net scaled by a 0-d parameter."""
  hidden = (x @ params["w1"] + params["b1"]).tanh()
  return ((hidden @ params["w2"]) * params["scale"] - 0.5).square().mean()

def run_kiln(make_opt, lrs: list[float] | None = None) -> dict[str, np.ndarray]:
  """STEPS kiln optimizer steps; `lrs[i]` (when given) is assigned to opt.lr before step i."""
  params = {name: Tensor(value.copy(), requires_grad=True) for name, value in initial_values().items()}
  opt, x = make_opt(list(params.values())), Tensor(batch())
  with Tensor.train():
    for i in range(STEPS):
      if lrs is not None: opt.lr.assign(Tensor([lrs[i]])).realize()
      opt.zero_grad()
      loss_of(params, x).backward()
      opt.step()
  return {name: p.numpy() for name, p in params.items()}

def run_torch(make_opt, lrs: list[float] | None = None) -> dict[str, np.ndarray]:
  params = {name: torch.tensor(value.copy(), requires_grad=True) for name, value in initial_values().items()}
  opt, x = make_opt(list(params.values())), torch.tensor(batch())
  for i in range(STEPS):
    if lrs is not None:
      for group in opt.param_groups: group["lr"] = lrs[i]
    opt.zero_grad()
    loss_of(params, x).backward()
    opt.step()
  return {name: p.detach().numpy() for name, p in params.items()}

def run_numpy(update, lrs: list[float] | None = None) -> dict[str, np.ndarray]:
  """A NumPy reference: torch only computes the gradients, `update(step, lr, values, grads)` applies the rule."""
  values = {name: v.astype(np.float64) for name, v in initial_values().items()}
  for i in range(STEPS):
    params = {name: torch.tensor(v, dtype=torch.float32, requires_grad=True) for name, v in values.items()}
    loss_of(params, torch.tensor(batch())).backward()
    grads = {name: p.grad.numpy().astype(np.float64) for name, p in params.items()}
    update(i + 1, lrs[i] if lrs is not None else None, values, grads)
  return {name: v.astype(np.float32) for name, v in values.items()}

def assert_same_params(got: dict, want: dict, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
  moved = [name for name in want if not np.allclose(want[name], initial_values()[name])]
  assert moved == list(SHAPES), f"{what}: test problem, the reference left {set(SHAPES) - set(moved)} unchanged"
  for name in want:
    assert got[name].shape == SHAPES[name], f"{what}: {name} has shape {got[name].shape}, not {SHAPES[name]}"
    assert_close(got[name], want[name], f"{what}: {name} after {STEPS} steps", atol=atol, rtol=rtol)

# ---- torch.optim ----

TORCH_CASES = {
  "sgd": (lambda p, **kw: SGD(p, lr=0.1, **kw), lambda p: torch.optim.SGD(p, lr=0.1)),
  "sgd_wd": (lambda p, **kw: SGD(p, lr=0.1, weight_decay=0.05, **kw),
             lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.05)),
  "sgd_momentum": (lambda p, **kw: SGD(p, lr=0.1, momentum=0.9, **kw),
                   lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
  "sgd_momentum_classic": (lambda p, **kw: SGD(p, lr=0.1, momentum=0.9, classic=True, **kw),
                           lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
  "sgd_nesterov_wd": (lambda p, **kw: SGD(p, lr=0.1, momentum=0.8, weight_decay=0.1, nesterov=True, **kw),
                      lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, weight_decay=0.1, nesterov=True)),
  "adam": (lambda p, **kw: Adam(p, lr=0.05, **kw), lambda p: torch.optim.Adam(p, lr=0.05)),
  "adam_betas": (lambda p, **kw: Adam(p, lr=0.05, b1=0.8, b2=0.99, eps=1e-6, **kw),
                 lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-6)),
  "adamw": (lambda p, **kw: AdamW(p, lr=0.05, weight_decay=0.1, **kw),
            lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
  "adamw_default_wd": (lambda p, **kw: AdamW(p, lr=0.05, **kw), lambda p: torch.optim.AdamW(p, lr=0.05)),
}

@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_matches_torch_optim(case: str):
  make_kiln, make_torch = TORCH_CASES[case]
  assert_same_params(run_kiln(make_kiln), run_torch(make_torch), case)

@pytest.mark.parametrize("case", ["sgd_nesterov_wd", "adamw"])
def test_fused_matches_torch_optim(case: str):
  make_kiln, make_torch = TORCH_CASES[case]
  assert_same_params(run_kiln(lambda p: make_kiln(p, fused=True)), run_torch(make_torch), f"{case} fused")

LR_SCHEDULE = [0.1, 0.05, 0.2, 0.02, 0.1]

@pytest.mark.parametrize("case", ["sgd_momentum", "adamw"])
def test_learning_rate_changed_between_steps_matches_torch(case: str):
  make_kiln, make_torch = TORCH_CASES[case]
  assert_same_params(run_kiln(make_kiln, LR_SCHEDULE), run_torch(make_torch, LR_SCHEDULE), f"{case} with lr schedule")

def test_classic_sgd_puts_the_learning_rate_inside_the_momentum_buffer():
  buffers: dict[str, np.ndarray] = {}
  def classic_momentum(step, lr, values, grads):
    for name, g in grads.items():
      buffers[name] = 0.9 * buffers.get(name, 0.0) + lr * g
      values[name] = values[name] - buffers[name]
  got = run_kiln(lambda p: SGD(p, lr=0.1, momentum=0.9, classic=True), LR_SCHEDULE)
  assert_same_params(got, run_numpy(classic_momentum, LR_SCHEDULE), "classic SGD with lr schedule")
  # PyTorch's rule differs from the classic one once the learning rate changes
  assert not np.allclose(got["w1"], run_torch(TORCH_CASES["sgd_momentum"][1], LR_SCHEDULE)["w1"], atol=1e-4)

# ---- NumPy references: LAMB (the paper's rule) and LARS (tinygrad's rule) ----

def lamb_reference(lr: float, b1: float, b2: float, eps: float, wd: float, adam: bool = False):
  m: dict[str, np.ndarray] = {}
  v: dict[str, np.ndarray] = {}
  def update(step, _lr, values, grads):
    for name, g in grads.items():
      m[name] = b1 * m.get(name, 0.0) + (1 - b1) * g
      v[name] = b2 * v.get(name, 0.0) + (1 - b2) * g * g
      m_hat, v_hat = m[name] / (1 - b1 ** step), v[name] / (1 - b2 ** step)
      direction = m_hat / (np.sqrt(v_hat) + eps) + wd * values[name]
      weight_norm, direction_norm = np.linalg.norm(values[name]), np.linalg.norm(direction)
      trust = weight_norm / direction_norm if weight_norm > 0 and direction_norm > 0 and not adam else 1.0
      values[name] = values[name] - lr * trust * direction
  return update

def lars_reference(lr: float, momentum: float, wd: float, nesterov: bool, classic: bool, tcoef: float):
  buffers: dict[str, np.ndarray] = {}
  def update(step, _lr, values, grads):
    for name, g in grads.items():
      weight_norm, grad_norm = np.linalg.norm(values[name]), np.linalg.norm(g)
      trust = tcoef * weight_norm / (grad_norm + wd * weight_norm) if weight_norm > 0 and grad_norm > 0 else 1.0
      g = g + wd * values[name]
      if classic: g = g * trust * lr
      buffers[name] = momentum * buffers.get(name, 0.0) + g
      g = g + momentum * buffers[name] if nesterov else buffers[name]
      if not classic: g = g * trust * lr
      values[name] = values[name] - g
  return update

# each entry: (kiln optimizer factory, factory of a fresh NumPy update rule: the rules keep their state)
NUMPY_CASES = {
  "lamb": (lambda p, **kw: LAMB(p, lr=0.05, **kw), lambda: lamb_reference(0.05, 0.9, 0.999, 1e-6, 0.0)),
  "lamb_wd": (lambda p, **kw: LAMB(p, lr=0.05, b1=0.8, b2=0.99, eps=1e-5, weight_decay=0.1, **kw),
              lambda: lamb_reference(0.05, 0.8, 0.99, 1e-5, 0.1)),
  "lamb_adam": (lambda p, **kw: LAMB(p, lr=0.05, weight_decay=0.1, adam=True, **kw),
                lambda: lamb_reference(0.05, 0.9, 0.999, 1e-6, 0.1, adam=True)),
  "lars": (lambda p, **kw: LARS(p, lr=2.0, tcoef=0.01, **kw),
           lambda: lars_reference(2.0, 0.9, 1e-4, False, True, 0.01)),
  "lars_nesterov_popular": (
    lambda p, **kw: LARS(p, lr=2.0, momentum=0.8, weight_decay=0.05, nesterov=True, classic=False, tcoef=0.02, **kw),
    lambda: lars_reference(2.0, 0.8, 0.05, True, False, 0.02)),
}

def numpy_newton_schulz(g: np.ndarray, steps: int, coefficients: tuple[float, ...], eps: float = 1e-7) -> np.ndarray:
  """X <- sum_i c_i (X X^T)^i X on the Frobenius-normalized matrix, worked on transposed when it is tall."""
  x = g / (np.sqrt((g * g).sum(axis=(-2, -1), keepdims=True)) + eps)
  tall = g.shape[-2] > g.shape[-1]
  if tall: x = np.swapaxes(x, -1, -2)
  for _ in range(steps):
    gram = x @ np.swapaxes(x, -1, -2)
    x = sum(c * np.linalg.matrix_power(gram, i) @ x for i, c in enumerate(coefficients))
  return np.swapaxes(x, -1, -2) if tall else x

def muon_reference(lr: float, momentum: float, wd: float, ns_steps: int, coefficients: tuple[float, ...],
                   nesterov: bool):
  buffers: dict[str, np.ndarray] = {}
  def update(step, _lr, values, grads):
    for name, g in grads.items():
      buffers[name] = momentum * buffers.get(name, 0.0) + g
      u = g + momentum * buffers[name] if nesterov else buffers[name]
      u = numpy_newton_schulz(u.reshape(u.shape[0] if u.ndim else 1, -1), ns_steps, coefficients).reshape(g.shape)
      values[name] = values[name] * (1 - lr * wd) - lr * u
  return update

MUON = (3.4445, -4.775, 2.0315)
NUMPY_CASES["muon"] = (lambda p, **kw: Muon(p, lr=0.02, **kw), lambda: muon_reference(0.02, 0.95, 0.0, 5, MUON, True))
NUMPY_CASES["muon_wd_plain_momentum"] = (
  lambda p, **kw: Muon(p, lr=0.05, momentum=0.8, weight_decay=0.1, ns_steps=3, ns_params=(2.0, -1.5, 0.5),
                       nesterov=False, **kw),
  lambda: muon_reference(0.05, 0.8, 0.1, 3, (2.0, -1.5, 0.5), False))

@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (2, 4, 4), (2, 3, 6)])
@pytest.mark.parametrize("coefficients", [MUON, (1.5, -0.5), (2.0,)])
def test_newton_schulz_matches_numpy(shape, coefficients):
  g = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
  got = Tensor(g).newton_schulz(4, coefficients).numpy()
  assert got.shape == shape
  assert_close(got, numpy_newton_schulz(g.astype(np.float64), 4, coefficients), f"newton_schulz {shape}", atol=1e-4)

def test_newton_schulz_orthogonalizes():
  x = Tensor(np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)).newton_schulz(30, (1.5, -0.5))
  assert_close((x @ x.T).numpy(), np.eye(4), "cubic Newton-Schulz converges to an orthogonal matrix", atol=1e-3)
  with pytest.raises(RuntimeError, match="newton_schulz"): Tensor.ones(3).newton_schulz(1, MUON)

def test_muon_defaults_are_tinygrads_and_it_is_never_fused():
  opt = Muon([Tensor.ones(2, 2, requires_grad=True)])
  assert (opt.momentum, opt.wd, opt.ns_steps, opt.ns_params, opt.nesterov) == (0.95, 0.0, 5, MUON, True)
  assert (opt.classic, opt.pre_wd, opt.tcoef, opt.fused) == (False, False, 0.0, False)
  assert abs(opt.lr.item() - 0.02) < 1e-9 and isinstance(opt, LARS)
  with pytest.raises(ValueError, match="Muon: .*fused"): Muon([Tensor.ones(2, 2, requires_grad=True)], fused=True)

@pytest.mark.parametrize("case", sorted(NUMPY_CASES))
def test_matches_numpy_reference(case: str):
  make_kiln, reference = NUMPY_CASES[case]
  assert_same_params(run_kiln(make_kiln), run_numpy(reference()), case)

@pytest.mark.parametrize("case", ["lamb_wd", "lars_nesterov_popular"])
def test_fused_keeps_trust_ratios_per_parameter(case: str):
  make_kiln, reference = NUMPY_CASES[case]
  assert_same_params(run_kiln(lambda p: make_kiln(p, fused=True)), run_numpy(reference()), f"{case} fused")

def test_default_hyperparameters_are_tinygrads():
  w = Tensor.ones(2, requires_grad=True)
  sgd, lars, lamb, adamw = SGD([w]), LARS([w]), LAMB([w]), AdamW([w])
  assert (sgd.momentum, sgd.wd, sgd.nesterov, sgd.classic, sgd.tcoef) == (0.0, 0.0, False, False, 0.0)
  assert (lars.momentum, lars.wd, lars.nesterov, lars.classic, lars.tcoef) == (0.9, 1e-4, False, True, 0.001)
  assert (lamb.b1, lamb.b2, lamb.eps, lamb.wd, lamb.adam) == (0.9, 0.999, 1e-6, 0.0, False)
  assert (adamw.eps, adamw.wd, adamw.adam) == (1e-8, 0.01, True)
  assert isinstance(sgd, LARS) and isinstance(adamw, LAMB) and isinstance(Adam([w]), LAMB)
  assert sgd.lr.shape == (1,) and sgd.lr.dtype == dtypes.float32 and abs(sgd.lr.item() - 0.001) < 1e-9

# ---- state: frozen params, in-place buffers, 0-d and half-precision params ----

def test_frozen_params_are_untouched_and_duplicates_dropped():
  trainable, frozen = Tensor([1.0, 2.0], requires_grad=True), Tensor([5.0, 6.0], requires_grad=False)
  opt = Adam([trainable, trainable, frozen], lr=0.1)
  assert len(opt.params) == 1 and opt.params[0] is trainable and opt.buffers == [frozen]
  with Tensor.train():
    (trainable * frozen).sum().backward()
    opt.step()
  assert frozen.tolist() == [5.0, 6.0] and frozen.grad is None
  assert_close(trainable.numpy(), np.float32([0.9, 1.9]), "trainable after one Adam step", atol=1e-6)

def _buffer_of(t: Tensor):
  assert t.uop.base.buffer is not None, "state tensor is not realized"
  return t.uop.base.buffer

@pytest.mark.parametrize("fused", [False, True])
def test_state_buffers_are_allocated_once_and_updated_in_place(fused: bool):
  w, b = Tensor.ones(3, 2, requires_grad=True), Tensor.ones(2, requires_grad=True)
  sgd, adam = SGD([w], lr=0.1, momentum=0.9, fused=fused), Adam([b], lr=0.1, fused=fused)
  opt = OptimizerGroup(sgd, adam)
  state = [sgd.lr, adam.lr, *sgd.b, adam.b1_t, adam.b2_t, *adam.m, *adam.v]
  with Tensor.train():
    for i in range(3):
      opt.zero_grad()
      ((w * w).sum() + (b * b).sum()).backward()
      opt.step()
      if i == 0: first = [_buffer_of(t) for t in state]
      assert all(_buffer_of(t) is buf for t, buf in zip(state, first)), f"a state buffer was replaced at step {i}"
  assert len(sgd.b) == 1 and len(adam.m) == 1
  assert_close(adam.b1_t.numpy(), np.float32([0.9 ** 3]), "b1**t after 3 steps")

@pytest.mark.parametrize("fused", [False, True])
def test_0d_parameter_keeps_its_shape(fused: bool):
  w, w_torch = Tensor(2.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
  opt, opt_torch = Adam([w], lr=0.1, fused=fused), torch.optim.Adam([w_torch], lr=0.1)
  with Tensor.train():
    for _ in range(3):
      opt.zero_grad()
      (w * w).backward()
      opt.step()
      opt_torch.zero_grad()
      (w_torch * w_torch).backward()
      opt_torch.step()
  assert w.shape == ()
  assert_close(w.numpy(), w_torch.detach().numpy(), "0-d parameter after 3 Adam steps")

def test_half_precision_params_keep_float32_state():
  w = Tensor(np.float16([1.0, -2.0]), requires_grad=True)
  opt = AdamW([w], lr=0.01)
  with Tensor.train():
    (w * w).sum().backward()
    opt.step()
  assert w.dtype == dtypes.float16 and opt.m[0].dtype == dtypes.float32 and opt.v[0].dtype == dtypes.float32
  assert_close(w.numpy().astype(np.float32), np.float32([1.0 - 0.01 - 1e-4, -2.0 + 0.01 + 2e-4]), "float16 AdamW",
               atol=2e-3, rtol=1e-3)

# ---- OptimizerGroup ----

def test_optimizer_group_matches_two_torch_optimizers():
  params = {name: Tensor(value.copy(), requires_grad=True) for name, value in initial_values().items()}
  torch_params = {name: torch.tensor(value.copy(), requires_grad=True) for name, value in initial_values().items()}
  group = OptimizerGroup(SGD([params["w1"], params["b1"]], lr=0.1, momentum=0.9),
                         Adam([params["w2"], params["scale"]], lr=0.05))
  torch_opts = [torch.optim.SGD([torch_params["w1"], torch_params["b1"]], lr=0.1, momentum=0.9),
                torch.optim.Adam([torch_params["w2"], torch_params["scale"]], lr=0.05)]
  assert len(group) == 2 and isinstance(group[1], Adam) and len(group.params) == 4
  x, x_torch = Tensor(batch()), torch.tensor(batch())
  with Tensor.train():
    for i in range(STEPS):
      if i == 2: group[0].lr.assign(Tensor([0.02])).realize()
      if i == 2: torch_opts[0].param_groups[0]["lr"] = 0.02
      group.zero_grad()
      loss_of(params, x).backward()
      group.step()
      for opt in torch_opts: opt.zero_grad()
      loss_of(torch_params, x_torch).backward()
      for opt in torch_opts: opt.step()
  got, want = {k: p.numpy() for k, p in params.items()}, {k: p.detach().numpy() for k, p in torch_params.items()}
  assert_same_params(got, want, "OptimizerGroup(SGD, Adam)")

# ---- one schedule per step; TinyJit with a changing learning rate ----

def test_step_realizes_everything_in_one_schedule(monkeypatch):
  params = {name: Tensor(value.copy(), requires_grad=True) for name, value in initial_values().items()}
  opt, x = AdamW(list(params.values()), lr=0.01), Tensor(batch())
  runs: list[int] = []
  real_run_schedule = kiln.tensor.run_schedule
  def counting_run_schedule(items, *args, **kwargs):
    runs.append(len(items))
    return real_run_schedule(items, *args, **kwargs)
  monkeypatch.setattr(kiln.tensor, "run_schedule", counting_run_schedule)
  with Tensor.train():
    for _ in range(2):
      runs.clear()
      opt.zero_grad()
      loss_of(params, x).backward()
      opt.step()
      assert len(runs) == 1, f"one AdamW step (forward, backward and update) ran {len(runs)} schedules: {runs}"

@pytest.mark.parametrize("fused", [False, True])
def test_kernels_per_adam_step_of_a_3_layer_mlp(fused: bool):
  layers = [Linear(8, 6), Linear(6, 6), Linear(6, 3)]
  params = [t for layer in layers for t in (layer.weight, layer.bias)]
  opt = Adam(params, lr=0.01, fused=fused)
  x = Tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
  with Tensor.train():
    for _ in range(2):
      opt.zero_grad()
      layers[2](layers[1](layers[0](x).relu()).relu()).square().mean().backward()
      Tensor.realize(*[p.grad for p in params])
      GlobalCounters.reset()
      opt.step()
  # unfused: m, v and the parameter per parameter, plus b1**t and b2**t; fused: m, v, the new values, the powers and
  # one copy per parameter
  limit = 2 + len(params) + 3 if fused else 3 * len(params) + 2
  assert 0 < GlobalCounters.kernel_count <= limit, f"Adam(fused={fused}) step: {GlobalCounters.kernel_count} kernels"

def test_docs_examples_run():
  text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "optim.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert len(blocks) >= 4, "docs/optim.md lost its examples"
  exec(compile("\n".join(blocks), "docs/optim.md", "exec"), {})   # noqa: S102  (our own documentation)

def _train_jitted(make_opt, schedule) -> tuple[dict[str, np.ndarray], TinyJit]:
  params = {name: Tensor(value.copy(), requires_grad=True) for name, value in initial_values().items()}
  opt = make_opt(list(params.values()))
  @TinyJit
  def train_step(x: Tensor) -> Tensor:
    opt.zero_grad()
    loss = loss_of(params, x)
    loss.backward()
    opt.step()
    return loss
  captures = []
  with Tensor.train():
    for i in range(STEPS):
      schedule(opt, i)
      train_step(Tensor(batch()))
      if i >= 1: captures.append(train_step.captured)
  assert train_step.captured is not None and all(c is captures[0] for c in captures), "the step was re-captured"
  return {name: p.numpy() for name, p in params.items()}, train_step

@pytest.mark.parametrize("case", ["sgd_momentum", "adamw"])
def test_learning_rate_schedule_under_tinyjit_needs_no_recapture(case: str):
  make_kiln, make_torch = TORCH_CASES[case]
  def assign_lr(opt: Optimizer, i: int) -> None: opt.lr.assign(Tensor([LR_SCHEDULE[i]])).realize()
  got, jit = _train_jitted(make_kiln, assign_lr)
  assert len(jit.jit_cache) > 0
  assert_same_params(got, run_torch(make_torch, LR_SCHEDULE), f"{case} under TinyJit with lr schedule")

def test_lazy_learning_rate_assign_under_tinyjit_is_never_silently_wrong():
  def assign_lazily(opt: Optimizer, i: int) -> None: opt.lr.assign(LR_SCHEDULE[i])   # not realized by the caller
  try:
    got, _ = _train_jitted(TORCH_CASES["adamw"][0], assign_lazily)
  except RuntimeError as error:   # the JIT may refuse a capture whose state changed during the call: it must say so
    assert ".lr" in str(error), f"the error does not name the learning rate: {error}"
    return
  assert_same_params(got, run_torch(TORCH_CASES["adamw"][1], LR_SCHEDULE), "adamw under TinyJit, lazy lr assign")

# ---- errors ----

def test_step_without_grad_names_the_parameter():
  a, b = Tensor.ones(2, requires_grad=True), Tensor.ones(3, 2, requires_grad=True)
  opt = SGD([a, b], lr=0.1)
  with Tensor.train(), pytest.raises(RuntimeError, match=r"SGD: parameter 1 \(shape \(3, 2\)\) has no gradient"):
    a.sum().backward()
    opt.step()

def test_step_outside_training_mode_raises():
  w = Tensor.ones(2, requires_grad=True)
  opt = SGD([w], lr=0.1)
  with Tensor.train():
    w.sum().backward()
  with Tensor.train(False), pytest.raises(RuntimeError, match="training mode"):
    opt.step()

@pytest.mark.parametrize("make, error, message", [
  (lambda w: SGD(w[0], lr=0.1), TypeError, "a single Tensor"),
  (lambda w: SGD([w[0], 3.0]), TypeError, r"params\[1\] is a float"),
  (lambda w: SGD([Tensor.ones(2, requires_grad=False)]), ValueError, "no parameters that require grad"),
  (lambda w: SGD(w, lr=-0.1), ValueError, "lr must be >= 0, got -0.1"),
  (lambda w: SGD(w, momentum=-1.0), ValueError, "momentum must be >= 0"),
  (lambda w: SGD(w, nesterov=True), ValueError, "nesterov=True needs momentum > 0"),
  (lambda w: LARS(w, tcoef=-1.0), ValueError, "tcoef must be >= 0"),
  (lambda w: Adam(w, b1=1.0), ValueError, r"Adam: b1 must be in \[0, 1\), got 1.0"),
  (lambda w: AdamW(w, weight_decay=-0.1), ValueError, "AdamW: weight_decay must be >= 0"),
  (lambda w: LAMB(w, eps=float("nan")), ValueError, "eps must be >= 0, got nan"),
  (lambda w: OptimizerGroup(), ValueError, "at least one optimizer"),
  (lambda w: OptimizerGroup(SGD(w), "adam"), TypeError, "argument 1 is a str"),
  (lambda w: OptimizerGroup(SGD(w), Adam(w)), ValueError, r"shape \(2,\) is in optimizers 0 and 1"),
])
def test_bad_arguments_raise(make, error, message):
  with pytest.raises(error, match=message):
    make([Tensor.ones(2, requires_grad=True)])
