"""Optimizers: SGD, Adam, AdamW and LAMB. Each step is lazy graph work; `step()` realizes it in one schedule."""
from __future__ import annotations
from kiln.tensor import Tensor

def _unique(tensors: list[Tensor]) -> list[Tensor]:
  """Drop repeated tensors, by identity (Tensor's == is elementwise, so it can't be used to compare them)."""
  by_id: dict[int, Tensor] = {}
  for t in tensors: by_id.setdefault(id(t), t)
  return list(by_id.values())

def _realize_all(tensors: list[Tensor]) -> None:
  """Realize every tensor in one schedule, so the whole update fuses into as few kernels as possible."""
  if tensors: Tensor.realize(*tensors)

def _state_like(t: Tensor) -> Tensor:
  """A zero-filled, realized-on-first-use buffer for optimizer state (momentum, moments) shaped like `t`."""
  return Tensor.zeros(*t.shape, dtype=t.dtype, device=t.device, requires_grad=False).contiguous()

class Optimizer:
  """Base class: holds the parameters and the learning rate (a Tensor, so it can change without recompiling).

  Subclasses implement `_step(params, grads)`, which assigns the new values to the params and returns any extra
  state tensors (momentum buffers, moments) that must be realized with them.
  """
  def __init__(self, params: list[Tensor], lr: float):
    params = list(params)
    # a tensor whose requires_grad was never set becomes trainable when it is handed to an optimizer
    for p in params:
      if p.requires_grad is None: p.requires_grad = True
    self.params: list[Tensor] = _unique([p for p in params if p.requires_grad])
    # tensors explicitly marked requires_grad=False are not updated, but still realized by step()
    self.buffers: list[Tensor] = _unique([p for p in params if not p.requires_grad])
    if not self.params: raise ValueError(f"{type(self).__name__}: got no parameters that require grad")
    self.device = self.params[0].device
    self.lr = Tensor([float(lr)], device=self.device, requires_grad=False).contiguous()

  def zero_grad(self) -> None:
    """Forget the gradients of all parameters (call before the next backward())."""
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Update every parameter from its gradient and realize the new values."""
    _realize_all(self.schedule_step())

  def schedule_step(self) -> list[Tensor]:
    """Build the (lazy) update of every parameter; returns the tensors to realize."""
    if getattr(Tensor, "training", True) is False:
      raise RuntimeError(f"{type(self).__name__}.step() needs training mode: wrap the training loop in "
                         "`with Tensor.train():` (Tensor.training is False)")
    grads = []
    for i, p in enumerate(self.params):
      if p.grad is None:
        raise RuntimeError(f"{type(self).__name__}: parameter {i} (shape {p.shape}) has no gradient; call "
                           "loss.backward() before step(), and check that the loss depends on this parameter")
      grads.append(p.grad)
    return self._step(self.params, grads) + self.params + self.buffers

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    raise NotImplementedError(f"{type(self).__name__} must implement _step")

class SGD(Optimizer):
  """Stochastic gradient descent with optional momentum, Nesterov momentum and (L2) weight decay.

  With `classic=True` the learning rate scales the update after momentum (PyTorch's formulation); by default it
  scales the gradient before momentum. The two agree while the learning rate is constant.
  """
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, classic: bool = False):
    super().__init__(params, lr)
    if nesterov and momentum == 0: raise ValueError("SGD: nesterov=True needs momentum > 0")
    self.momentum, self.weight_decay, self.nesterov, self.classic = momentum, weight_decay, nesterov, classic
    self.momentum_buffers = [_state_like(p) for p in self.params] if momentum else []

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    lr = self.lr.reshape(())  # a 0-d view, so 0-d parameters keep their shape
    for i, (param, grad) in enumerate(zip(params, grads)):
      update = grad + self.weight_decay * param.detach() if self.weight_decay else grad
      if not self.classic: update = update * lr
      if self.momentum:
        buffer = self.momentum_buffers[i]
        buffer.assign(self.momentum * buffer + update)
        update = update + self.momentum * buffer if self.nesterov else buffer
      if self.classic: update = update * lr
      param.assign((param.detach() - update).cast(param.dtype))
    return self.momentum_buffers

class LAMB(Optimizer):
  """LAMB (layer-wise adaptive moments); with `adam=True` the trust ratio is 1 and it is AdamW.

  Weight decay is decoupled (added to the normalized update, as in AdamW), not added to the gradient.
  """
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False):
    super().__init__(params, lr)
    self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
    # running products b1**t and b2**t for bias correction, kept on the device so steps need no recompiling
    self.b1_power = Tensor([1.0], device=self.device, requires_grad=False).contiguous()
    self.b2_power = Tensor([1.0], device=self.device, requires_grad=False).contiguous()
    self.first_moments = [_state_like(p) for p in self.params]
    self.second_moments = [_state_like(p) for p in self.params]

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    self.b1_power.assign(self.b1_power * self.b1)
    self.b2_power.assign(self.b2_power * self.b2)
    # 0-d views, so 0-d parameters keep their shape
    lr, b1_power, b2_power = self.lr.reshape(()), self.b1_power.reshape(()), self.b2_power.reshape(())
    for param, grad, m, v in zip(params, grads, self.first_moments, self.second_moments):
      m.assign(self.b1 * m + (1.0 - self.b1) * grad)
      v.assign(self.b2 * v + (1.0 - self.b2) * (grad * grad))
      m_hat = m / (1.0 - b1_power)
      v_hat = v / (1.0 - b2_power)
      update = m_hat / (v_hat.sqrt() + self.eps)
      if self.weight_decay: update = update + self.weight_decay * param.detach()
      if self.adam:
        param.assign((param.detach() - lr * update).cast(param.dtype))
        continue
      weight_norm = (param.detach() * param.detach()).sum().sqrt()
      update_norm = (update * update).sum().sqrt()
      # trust ratio ||w|| / ||update||, or 1 when either norm is zero
      ratio = (weight_norm > 0).where((update_norm > 0).where(weight_norm / update_norm, 1.0), 1.0)
      param.assign((param.detach() - lr * ratio * update).cast(param.dtype))
    return [self.b1_power, self.b2_power] + self.first_moments + self.second_moments

class AdamW(LAMB):
  """Adam with decoupled weight decay (Loshchilov & Hutter)."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True)

class Adam(AdamW):
  """Adam (Kingma & Ba): adaptive moment estimation without weight decay."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    super().__init__(params, lr, b1, b2, eps, weight_decay=0.0)
