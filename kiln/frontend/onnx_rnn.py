"""The ONNX recurrent layers RNN, GRU and LSTM as kiln Tensor ops, unrolled over the (static) sequence length.

Shapes (layout=0): X (seq, batch, input); W (dirs, gates*hidden, input); R (dirs, gates*hidden, hidden);
B (dirs, 2*gates*hidden) = the input and recurrent biases; initial_h/initial_c (dirs, batch, hidden); outputs
Y (seq, dirs, batch, hidden), Y_h and Y_c (dirs, batch, hidden). layout=1 puts batch first in X, Y and the states.
Gate order: LSTM i, o, f, c; GRU z, r, h. Steps at or past a batch entry's sequence length leave its state alone and
output zeros.
"""
from __future__ import annotations
from typing import Callable
from kiln.dtype import dtypes
from kiln.tensor import Tensor
from kiln.frontend.onnx_ops import op, ints

# name -> (function of x, alpha, beta; default alpha; default beta): ONNX's activation names for recurrent layers
_ACTIVATIONS: dict[str, tuple[Callable, float | None, float | None]] = {
  "Relu": (lambda x, a, b: x.relu(), None, None),
  "Tanh": (lambda x, a, b: x.tanh(), None, None),
  "Sigmoid": (lambda x, a, b: x.sigmoid(), None, None),
  "Softsign": (lambda x, a, b: x / (x.abs() + 1), None, None),
  "Softplus": (lambda x, a, b: (x.exp() + 1).log(), None, None),
  "Affine": (lambda x, a, b: x * a + b, 1.0, 0.0),
  "LeakyRelu": (lambda x, a, b: (x >= 0).where(x, x * a), 0.01, None),
  "ThresholdedRelu": (lambda x, a, b: (x > a).where(x, 0), 1.0, None),
  "ScaledTanh": (lambda x, a, b: (x * b).tanh() * a, 1.0, 1.0),
  "HardSigmoid": (lambda x, a, b: (x * a + b).clip(0, 1), 0.2, 0.5),
  "Elu": (lambda x, a, b: (x >= 0).where(x, (x.exp() - 1) * a), 1.0, None),
}

def _activations(names, alphas, betas) -> list[Callable[[Tensor], Tensor]]:
  """Activation functions by name; alphas and betas are consumed in order by the functions that take them."""
  alphas, betas, out = list(alphas or []), list(betas or []), []
  for name in names:
    key = next((k for k in _ACTIVATIONS if k.lower() == name.lower()), None)
    if key is None: raise NotImplementedError(f"activation {name!r}")
    fn, default_alpha, default_beta = _ACTIVATIONS[key]
    alpha = (alphas.pop(0) if alphas else default_alpha) if default_alpha is not None else None
    beta = (betas.pop(0) if betas else default_beta) if default_beta is not None else None
    out.append(lambda x, fn=fn, alpha=alpha, beta=beta: fn(x, alpha, beta))
  return out

def _recurrent(kind: str, x: Tensor, w: Tensor, r: Tensor, b, sequence_lens, initial_h, initial_c, peepholes,
               activations, activation_alpha, activation_beta, clip, direction: str, hidden_size, layout: int,
               input_forget: int = 0, linear_before_reset: int = 0):
  gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
  if layout: x = x.permute(1, 0, 2)
  steps, batch = x.shape[0], x.shape[1]
  hidden = hidden_size or r.shape[-1]
  directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
  if direction not in ("forward", "reverse", "bidirectional"): raise NotImplementedError(f"direction={direction!r}")
  per_direction = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
  names = list(activations) if activations else per_direction * len(directions)
  functions = _activations(names, activation_alpha, activation_beta)
  per = len(per_direction)
  lengths = ints(sequence_lens)
  state_h = initial_h.permute(1, 0, 2) if (initial_h is not None and layout) else initial_h
  state_c = initial_c.permute(1, 0, 2) if (initial_c is not None and layout) else initial_c
  bound = (lambda t: t.clip(-clip, clip)) if clip is not None else (lambda t: t)
  ys, last_h, last_c = [], [], []
  for d, name in enumerate(directions):
    f, g, h_act = (functions[d * per:(d + 1) * per] + [None, None])[:3]
    w_d, r_d = w[d], r[d]
    bias = b[d] if b is not None else Tensor.zeros(2 * gates * hidden, dtype=x.dtype)
    w_bias, r_bias = bias[:gates * hidden], bias[gates * hidden:]
    projected = x.matmul(w_d.T) + w_bias  # (steps, batch, gates*hidden) for every step at once
    h = state_h[d] if state_h is not None else Tensor.zeros(batch, hidden, dtype=x.dtype)
    c = state_c[d] if state_c is not None else Tensor.zeros(batch, hidden, dtype=x.dtype)
    outputs: list[Tensor | None] = [None] * steps
    order = range(steps) if name == "forward" else reversed(range(steps))
    for t in order:
      xt = projected[t]
      if kind == "RNN": new_h = f(bound(xt + h.matmul(r_d.T) + r_bias))
      elif kind == "GRU":
        xz, xr, xh = xt.chunk(3, -1)
        rz, rr, rh = r_d.chunk(3, 0)
        bz, br, bh = r_bias.chunk(3, 0)
        z = f(bound(xz + h.matmul(rz.T) + bz))
        reset = f(bound(xr + h.matmul(rr.T) + br))
        if linear_before_reset: candidate = g(bound(xh + reset * (h.matmul(rh.T) + bh)))
        else: candidate = g(bound(xh + (reset * h).matmul(rh.T) + bh))
        new_h = (1 - z) * candidate + z * h
      else:
        pre = xt + h.matmul(r_d.T) + r_bias
        pi, po, pf, pc = pre.chunk(4, -1)
        if peepholes is not None: peep_i, peep_o, peep_f = peepholes[d].chunk(3, 0)
        i_gate = f(bound(pi + peep_i * c if peepholes is not None else pi))
        f_gate = 1 - i_gate if input_forget else f(bound(pf + peep_f * c if peepholes is not None else pf))
        new_c = f_gate * c + i_gate * g(bound(pc))
        o_gate = f(bound(po + peep_o * new_c if peepholes is not None else po))
        new_h = o_gate * h_act(new_c)
      if lengths is not None:
        valid = (Tensor(lengths, dtype=dtypes.int64) > t).reshape(batch, 1)
        new_h = valid.where(new_h, h)
        if kind == "LSTM": new_c = valid.where(new_c, c)
        outputs[t] = valid.where(new_h, 0)
      else: outputs[t] = new_h
      h = new_h
      if kind == "LSTM": c = new_c
    ys.append(outputs[0].stack(*outputs[1:]) if steps > 1 else outputs[0].unsqueeze(0))
    last_h.append(h)
    last_c.append(c)
  y = ys[0].stack(*ys[1:], dim=1)  # (steps, dirs, batch, hidden)
  y_h, y_c = last_h[0].stack(*last_h[1:]), last_c[0].stack(*last_c[1:])
  if layout: y, y_h, y_c = y.permute(2, 0, 1, 3), y_h.permute(1, 0, 2), y_c.permute(1, 0, 2)
  return (y, y_h, y_c) if kind == "LSTM" else (y, y_h)

@op("RNN")
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
  return _recurrent("RNN", x, w, r, b, sequence_lens, initial_h, None, None, activations, activation_alpha,
                    activation_beta, clip, direction, hidden_size, layout)

@op("GRU")
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0):
  return _recurrent("GRU", x, w, r, b, sequence_lens, initial_h, None, None, activations, activation_alpha,
                    activation_beta, clip, direction, hidden_size, layout, linear_before_reset=linear_before_reset)

@op("LSTM")
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0,
         layout=0):
  return _recurrent("LSTM", x, w, r, b, sequence_lens, initial_h, initial_c, p, activations, activation_alpha,
                    activation_beta, clip, direction, hidden_size, layout, input_forget=input_forget)
