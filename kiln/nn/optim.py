"""Optimizers: SGD, LARS, Muon, Adam, AdamW, LAMB and OptimizerGroup (tinygrad's API, PyTorch's update rules).

Every step is lazy graph work: `schedule_step()` builds the updates (parameters and state are overwritten in place
with `assign`) and returns the tensors to realize; `step()` realizes them in one schedule. The learning rate and
all other changing state live in device tensors, so a step captured by `TinyJit` keeps working when they change.
"""
from __future__ import annotations
import itertools
from kiln.tensor import Tensor
from kiln.dtype import DType, dtypes, least_upper_dtype
from kiln.helpers import FUSE_OPTIM, gc_paused

def _unique(tensors: list[Tensor]) -> list[Tensor]:
  """Drop repeated tensors, by identity (Tensor's == is elementwise, so it can't be used to compare them)."""
  return list({id(t): t for t in tensors}.values())

def _state_dtype(dtype: DType) -> DType:
  """The dtype optimizer state is kept in: at least float32, so half-precision parameters keep precise moments."""
  return least_upper_dtype(dtype, dtypes.float32)

def _check_nonnegative(optimizer: str, **values: float) -> None:
  """Raise ValueError naming the first hyperparameter that is negative (or NaN)."""
  for name, value in values.items():
    if not value >= 0: raise ValueError(f"{optimizer}: {name} must be >= 0, got {value}")

def _check_beta(optimizer: str, **values: float) -> None:
  """Raise ValueError unless every beta lies in [0, 1) (1 would divide by zero in the bias correction)."""
  for name, value in values.items():
    if not 0.0 <= value < 1.0: raise ValueError(f"{optimizer}: {name} must be in [0, 1), got {value}")

class Optimizer:
  """Base class: holds the parameters, their learning rate and the optimizer state.

  `params` are the tensors to train. One whose `requires_grad` is None becomes trainable; one with
  `requires_grad=False` is never updated (it is kept in `buffers` and realized by `step()`). The learning rate
  `lr` is a one-element float32 Tensor: change it in place (`opt.lr.assign(Tensor([0.01]))`) and the next step uses
  the new value, also inside a `TinyJit`-captured step. With `fused=True` (default: `FUSE_OPTIM`), all parameters
  are updated as one flat vector, which needs fewer kernels for models with many small parameters.

  Subclasses implement `_step(params, grads) -> (new_params, state)`: the new parameter values (lazy) and the state
  tensors (updated with `assign`) that must be realized with them.
  """
  def __init__(self, params: list[Tensor], lr: float, fused: bool | None = None):
    name = type(self).__name__
    if isinstance(params, Tensor):
      raise TypeError(f"{name}: params must be a list of Tensors, got a single Tensor of shape {params.shape}; "
                      "wrap it in a list")
    params = list(params)
    for i, p in enumerate(params):
      if not isinstance(p, Tensor): raise TypeError(f"{name}: params[{i}] is a {type(p).__name__}, not a Tensor")
    if isinstance(lr, Tensor):
      if lr.numel() != 1: raise ValueError(f"{name}: lr must be a number or a one-element Tensor, got shape {lr.shape}")
      lr = float(lr.item())
    _check_nonnegative(name, lr=lr)
    # a tensor whose requires_grad was never set becomes trainable when it is handed to an optimizer
    for p in params:
      if p.requires_grad is None: p.requires_grad = True
    self.params: list[Tensor] = _unique([p for p in params if p.requires_grad])
    self.buffers: list[Tensor] = _unique([p for p in params if not p.requires_grad])
    if not self.params: raise ValueError(f"{name}: got no parameters that require grad ({len(params)} tensors given)")
    self.device = self.params[0].device
    for i, p in enumerate(self.params):
      if p.device != self.device:
        raise ValueError(f"{name}: parameter {i} (shape {p.shape}) is on {p.device} but parameter 0 is on "
                         f"{self.device}; one optimizer updates parameters of one device")
    self.fused = bool(FUSE_OPTIM.value if fused is None else fused)
    # fused steps work on one vector in a dtype every parameter fits; unfused ones keep state per parameter
    self.state_dtype = _state_dtype(least_upper_dtype(*(p.dtype for p in self.params)))
    self.offsets = list(itertools.accumulate((p.numel() for p in self.params), initial=0))
    # a device tensor, not a float: changing it needs no new kernels, and a TinyJit capture reads the new value
    self.lr = Tensor([float(lr)], dtype=_state_dtype(dtypes.default_float), device=self.device,
                     requires_grad=False).contiguous().realize()

  def _new_state(self) -> list[Tensor]:
    """Zero-filled state buffers, one per parameter (or one flat one when fused); each is updated in place.
    Realized now, so the first step's graph has the shape of every later one (one schedule and one set of kernels)."""
    if self.fused:
      state = [Tensor.zeros(self.offsets[-1], dtype=self.state_dtype, device=self.device, requires_grad=False)
               .contiguous()]
    else:
      state = [Tensor.zeros(*p.shape, dtype=_state_dtype(p.dtype), device=p.device, requires_grad=False).contiguous()
               for p in self.params]
    Tensor.realize_all(state)
    return state

  def _norm(self, x: Tensor) -> Tensor:
    """L2 norm of one parameter's values, for trust ratios. Fused, `x` is the flat vector of all parameters and the
    result holds each element's own parameter norm, so a trust ratio stays per parameter (layer-wise)."""
    if not self.fused: return x.square().sum().sqrt()
    norms = [x[start:end].square().sum().sqrt().reshape(1).expand(end - start)
             for start, end in zip(self.offsets, self.offsets[1:])]
    return Tensor.cat(*norms) if len(norms) > 1 else norms[0]

  def zero_grad(self) -> None:
    """Forget the gradients of all parameters (call before the next backward())."""
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Update every parameter from its gradient and realize the new values (and the state) in one schedule."""
    Tensor.realize_all(self.schedule_step())

  def _gradients(self) -> list[Tensor]:
    """Every parameter's gradient; raises RuntimeError naming the first parameter that has none."""
    name = type(self).__name__
    if not Tensor.training:
      raise RuntimeError(f"{name}.step() needs training mode: wrap the training loop in `with Tensor.train():` "
                         "(Tensor.training is False)")
    grads = []
    for i, p in enumerate(self.params):
      if p.grad is None: raise RuntimeError(f"{name}: {self._describe_missing_gradient(i)}")
      grads.append(p.grad)
    return grads

  def _describe_missing_gradient(self, i: int) -> str:
    """Why parameter `i` has no gradient, naming it by its state-dict key: shared with another parameter (one
    graph node: the gradient went to the other) or unused by the loss."""
    from kiln.nn.state import state_dict_key
    def label(j: int) -> str:
      key = state_dict_key(self.params[j])
      return f"parameter {j}" + (f" '{key}'" if key else "") + f" (shape {self.params[j].shape})"
    node = self.params[i]._grad_identity()
    for j, q in enumerate(self.params):
      if j != i and q._grad_identity() is node:
        return (f"{label(i)} has no gradient: it is the same graph node as {label(j)}, which received the gradient "
                f"(shared: make each parameter its own tensor, e.g. with .contiguous() or a fresh creation call)")
    return (f"{label(i)} has no gradient: it is unused (the loss does not depend on it, or only through detach); "
            f"call loss.backward() before step(), and check that the loss depends on this parameter")

  @gc_paused   # as backward() and realize: a collection here would only age the step's graph, which realize frees
  def schedule_step(self) -> list[Tensor]:
    """Build the (lazy) update of every parameter and return the tensors to realize: state, params, buffers.

    Realize them together (`Tensor.realize(*opt.schedule_step())`), possibly with other tensors such as the loss.
    """
    grads = self._gradients()
    if self.fused:
      flat_params = Tensor.cat(*(p.detach().flatten().cast(self.state_dtype) for p in self.params))
      flat_grads = Tensor.cat(*(g.flatten().cast(self.state_dtype) for g in grads))
      (flat_update,), state = self._step([flat_params], [flat_grads])
      # one kernel computes every new value from the old ones; the per-parameter assigns then only copy slices
      flat_update = flat_update.contiguous()
      updates = [flat_update[start:end].reshape(p.shape)
                 for p, start, end in zip(self.params, self.offsets, self.offsets[1:])]
    else:
      updates, state = self._step([p.detach() for p in self.params], grads)
    for p, new_value in zip(self.params, updates): p.assign(new_value.cast(p.dtype))
    return state + self.params + self.buffers

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    raise NotImplementedError(f"{type(self).__name__} must implement _step")

class OptimizerGroup(Optimizer):
  """Several optimizers driven as one: `zero_grad`, `step` and `schedule_step` act on all of them, and
  `group[i]` is the i-th optimizer. Use it to give parameter groups their own optimizer or hyperparameters.

  >>> from kiln.nn.optim import SGD, Adam
  >>> w, b = Tensor.ones(2, 2, requires_grad=True), Tensor.zeros(2, requires_grad=True)
  >>> group = OptimizerGroup(SGD([w], lr=0.1), Adam([b], lr=0.01))
  >>> with Tensor.train():
  ...   _ = (w.sum() + b.sum()).backward()
  ...   group.step()
  >>> [round(x, 4) for x in w.flatten().tolist()], [round(x, 4) for x in b.tolist()]
  ([0.9, 0.9, 0.9, 0.9], [-0.01, -0.01])
  """
  def __init__(self, *optimizers: Optimizer):  # pylint: disable=super-init-not-called  (it has no params of its own)
    if not optimizers: raise ValueError("OptimizerGroup: needs at least one optimizer")
    for i, opt in enumerate(optimizers):
      if not isinstance(opt, Optimizer):
        raise TypeError(f"OptimizerGroup: argument {i} is a {type(opt).__name__}, not an Optimizer")
    seen: dict[int, int] = {}
    for i, opt in enumerate(optimizers):
      for p in opt.params:
        if seen.setdefault(id(p), i) != i:
          raise ValueError(f"OptimizerGroup: a parameter of shape {p.shape} is in optimizers {seen[id(p)]} and {i}; "
                           "each parameter must be updated by one optimizer")
    self.optimizers = optimizers
    self.params = [p for opt in optimizers for p in opt.params]
    self.buffers = [b for opt in optimizers for b in opt.buffers]

  def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]
  def __len__(self) -> int: return len(self.optimizers)

  def zero_grad(self) -> None:
    """Forget the gradients of every optimizer's parameters."""
    for opt in self.optimizers: opt.zero_grad()

  def schedule_step(self) -> list[Tensor]:
    """The tensors to realize for one step of every optimizer (realized together by `step()`)."""
    return [t for opt in self.optimizers for t in opt.schedule_step()]

class LARS(Optimizer):
  """Layer-wise Adaptive Rate Scaling (You et al., https://arxiv.org/abs/1708.03888): SGD with momentum whose step
  for each parameter is scaled by the trust ratio `tcoef * ||w|| / (||g|| + weight_decay * ||w||)` (1 when either
  norm is 0). Weight decay is added to the gradient (L2). `classic=True` applies the learning rate (and trust ratio)
  before the momentum buffer, as in the paper; `classic=False` after it. `tcoef=0` turns the trust ratio off (SGD).

  With `ns_params` (Muon), each parameter's update, as a (shape[0], -1) matrix, is orthogonalized by `ns_steps`
  Newton-Schulz iterations (`Tensor.newton_schulz`) after the momentum buffer. `pre_wd=True` adds weight decay to
  the gradient (L2); `pre_wd=False` shrinks the weights by `1 - lr * weight_decay` instead (decoupled, after momentum).
  """
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4,
               ns_steps: int = 0, ns_params: tuple[float, ...] | None = None, nesterov: bool = False,
               classic: bool = True, pre_wd: bool = True, tcoef: float = 0.001, fused: bool | None = None):
    super().__init__(params, lr, fused)
    name = type(self).__name__
    _check_nonnegative(name, momentum=momentum, weight_decay=weight_decay, tcoef=tcoef, ns_steps=ns_steps)
    if nesterov and momentum == 0: raise ValueError(f"{name}: nesterov=True needs momentum > 0")
    if ns_params and self.fused:
      raise ValueError(f"{name}: Newton-Schulz orthogonalizes each parameter's own matrix, so it cannot be fused=True")
    self.momentum, self.wd, self.nesterov, self.classic, self.tcoef = momentum, weight_decay, nesterov, classic, tcoef
    self.ns_steps, self.ns_params, self.pre_wd = ns_steps, tuple(ns_params or ()), pre_wd
    self.b: list[Tensor] = self._new_state() if momentum else []

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    lr = self.lr.reshape(())  # a 0-d view, so 0-d parameters keep their shape
    new_params = []
    for i, (param, grad) in enumerate(zip(params, grads)):
      scale: Tensor = lr
      if self.tcoef:
        weight_norm, grad_norm = self._norm(param), self._norm(grad)
        ratio = (weight_norm > 0).where(
          (grad_norm > 0).where(self.tcoef * weight_norm / (grad_norm + self.wd * weight_norm), 1.0), 1.0)
        scale = lr * ratio
      if self.wd and self.pre_wd: grad = grad + self.wd * param
      if self.classic: grad = grad * scale
      if self.momentum:
        # the buffer starts at zero, so the first step needs no special case
        self.b[i].assign(self.momentum * self.b[i] + grad)
        grad = grad + self.momentum * self.b[i] if self.nesterov else self.b[i]
      if self.ns_params:
        matrix = grad.reshape(grad.shape[0] if grad.ndim else 1, -1)
        grad = matrix.newton_schulz(self.ns_steps, self.ns_params).reshape(grad.shape)
      if self.wd and not self.pre_wd: param = param * (1.0 - self.wd * lr)
      if not self.classic: grad = grad * scale
      new_params.append(param - grad)
    return new_params, self.b

class SGD(LARS):
  """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay (PyTorch's SGD with
  dampening=0). By default (`classic=False`) the learning rate scales the update after the momentum buffer, as
  PyTorch does; `classic=True` scales the gradient before it. Both agree while the learning rate is constant.

  >>> w = Tensor([1.0, 2.0], requires_grad=True)
  >>> opt = SGD([w], lr=0.5)
  >>> with Tensor.train():
  ...   _ = w.sum().backward()
  ...   opt.step()
  >>> w.tolist()
  [0.5, 1.5]
  """
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, classic: bool = False, fused: bool | None = None):
    super().__init__(params, lr, momentum, weight_decay, nesterov=nesterov, classic=classic, tcoef=0.0, fused=fused)

class Muon(LARS):
  """SGD with Nesterov momentum whose update is orthogonalized by Newton-Schulz iterations, with decoupled weight
  decay (Keller Jordan's Muon, https://kellerjordan.github.io/posts/muon/; tinygrad's signature and defaults).

  Per parameter, with the update seen as a (shape[0], -1) matrix: `b = momentum*b + g`; `u = g + momentum*b`
  (nesterov) or `b`; `u = newton_schulz(u, ns_steps, ns_params)`; `w = w * (1 - lr*weight_decay) - lr*u`.
  Each parameter is its own matrix, so Muon is never fused (`fused=None` means False here, whatever FUSE_OPTIM says).

  >>> w = Tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
  >>> opt = Muon([w], lr=0.1)
  >>> with Tensor.train():
  ...   _ = (w * Tensor([[2.0, 0.0], [0.0, 0.5]])).sum().backward()
  ...   opt.step()
  >>> [[round(v, 2) for v in row] for row in w.tolist()]   # both directions move about lr, whatever their gradient
  [[0.93, 0.0], [0.0, 0.93]]
  """
  def __init__(self, params: list[Tensor], lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
               ns_steps: int = 5, ns_params: tuple[float, ...] = (3.4445, -4.775, 2.0315), nesterov: bool = True,
               fused: bool | None = None):
    super().__init__(params, lr, momentum, weight_decay, ns_steps, ns_params, nesterov, classic=False, pre_wd=False,
                     tcoef=0.0, fused=bool(fused))

class LAMB(Optimizer):
  """LAMB (You et al., https://arxiv.org/abs/1904.00962): Adam moments with a per-parameter trust ratio
  `||w|| / ||update||` (1 when either norm is 0). Weight decay is decoupled: `weight_decay * w` is added to the
  normalized update. With `adam=True` the trust ratio is 1, which is AdamW.
  """
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False, fused: bool | None = None):
    super().__init__(params, lr, fused)
    name = type(self).__name__
    _check_beta(name, b1=b1, b2=b2)
    _check_nonnegative(name, eps=eps, weight_decay=weight_decay)
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    # b1**t and b2**t for the bias correction, kept on the device so the step count needs no Python state
    self.b1_t = Tensor.ones(1, dtype=dtypes.float32, device=self.device, requires_grad=False).contiguous()
    self.b2_t = Tensor.ones(1, dtype=dtypes.float32, device=self.device, requires_grad=False).contiguous()
    self.m, self.v = self._new_state(), self._new_state()

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    self.b1_t.assign(self.b1_t * self.b1)
    self.b2_t.assign(self.b2_t * self.b2)
    # 0-d views, so 0-d parameters keep their shape
    lr, b1_t, b2_t = self.lr.reshape(()), self.b1_t.reshape(()), self.b2_t.reshape(())
    new_params = []
    for param, grad, m, v in zip(params, grads, self.m, self.v):
      m.assign(self.b1 * m + (1.0 - self.b1) * grad)
      v.assign(self.b2 * v + (1.0 - self.b2) * grad.square())
      m_hat, v_hat = m / (1.0 - b1_t), v / (1.0 - b2_t)
      update = m_hat / (v_hat.sqrt() + self.eps)
      if self.wd: update = update + self.wd * param
      if not self.adam:
        weight_norm, update_norm = self._norm(param), self._norm(update)
        update = (weight_norm > 0).where((update_norm > 0).where(weight_norm / update_norm, 1.0), 1.0) * update
      new_params.append(param - lr * update)
    return new_params, [self.b1_t, self.b2_t] + self.m + self.v

class AdamW(LAMB):
  """Adam with decoupled weight decay (Loshchilov & Hutter, https://arxiv.org/abs/1711.05101), as torch.optim.AdamW:
  `w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)`."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01, fused: bool | None = None):
    super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True, fused=fused)

class Adam(LAMB):
  """Adam (Kingma & Ba, https://arxiv.org/abs/1412.6980), as torch.optim.Adam without weight decay."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               fused: bool | None = None):
    super().__init__(params, lr, b1, b2, eps, 0.0, adam=True, fused=fused)
