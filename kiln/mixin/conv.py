"""Convolutions, pooling and interpolation, built from movement ops and reductions.

Every op here works for any number of spatial dimensions (1d, 2d, 3d, ...): the spatial dims are the trailing ones,
as many as the kernel has. The core is `_pool`, a view of sliding windows made only of pad/shrink/reshape/expand/
permute, so a convolution is that view times the weight, summed: lazy, fusable, and differentiable by the gradient
rules of the ops it is made of.
"""
from __future__ import annotations
import itertools, math
from typing import TYPE_CHECKING, Sequence
import numpy as np
from kiln.dtype import dtypes
from kiln.helpers import prod, flatten
from kiln.mixin.common import UnsupportedError, TensorValueError, where, fmt
from kiln.gradient import custom_backward, custom_backward_rules
from kiln.uop.ops import UOp
from kiln.uop.sint import sint_min, sint_max, ssimplify, ssub
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401


PAD_COPY_MIN_ELEMENTS = 1 << 12   # convolutions whose padded input is at least this large pad it in its own kernel

def _is_int(value) -> bool: return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

def _int_tuple(value, n: int, what: str, op: str, minimum: int = 1) -> tuple[int, ...]:
  """`value` (an int, or a sequence of `n` ints) as `n` ints, each at least `minimum`."""
  if _is_int(value): values = (int(value),) * n
  elif isinstance(value, (tuple, list)) and len(value) == n and all(_is_int(v) for v in value):
    values = tuple(int(v) for v in value)
  else: raise TensorValueError(f"{op}: {what} must be an int or a sequence of {n} ints, got {value!r}{where()}")
  if any(v < minimum for v in values):
    raise TensorValueError(f"{op}: {what} must be at least {minimum}, got {value!r}{where()}")
  return values

def _pad_pairs(padding, n: int, op: str) -> list[tuple[int, int]]:
  """(before, after) for each of `n` spatial dims, from an int, `n` ints (symmetric per dim), or 2*n ints in PyTorch's
  flat order (last dim first: left, right, top, bottom, ...)."""
  if _is_int(padding): return [(int(padding), int(padding))] * n
  if isinstance(padding, (tuple, list)) and all(_is_int(p) for p in padding):
    if len(padding) == n: return [(int(p), int(p)) for p in padding]
    if len(padding) == 2 * n: return [(int(padding[i]), int(padding[i + 1])) for i in range(0, 2 * n, 2)][::-1]
  raise TensorValueError(f"{op}: padding must be an int or a sequence of {n} or {2 * n} ints for {n} spatial dims, "
                         f"got {padding!r}{where()}")

def _check_conv_operands(x: Tensor, w: Tensor, groups, op: str) -> None:
  """Errors for operands no convolution can take: dims, devices, groups."""
  if w.ndim < 3 or x.ndim != w.ndim:
    raise TensorValueError(f"{op}: input {fmt(x.shape)} and weight {fmt(w.shape)} need the same number of dims, at least 3 "
                           f"(batch, channels, *spatial){where()}")
  if x.device != w.device: raise RuntimeError(f"{op}: input on {x.device} but weight on {w.device}{where()}")
  if not _is_int(groups) or groups < 1:
    raise TensorValueError(f"{op}: groups must be a positive int, got {groups!r}{where()}")

def _conv_backward(grad: UOp, node: UOp) -> tuple[UOp, UOp]:
  """The gradients of a convolution's input and weight (a CUSTOM_BACKWARD rule). Autograd through the windows' view
  would sum the output gradient times the weight into a (N, C_in, *out, *kernel) tensor, then add the overlapping
  windows back up (two slow kernels); the input gradient is instead the transposed convolution of the output
  gradient, one convolution kernel like the forward one. Measured on the anchors' 16x64x56x56 conv (3x3, pad 1),
  2-core EPYC: the input gradient's kernels 177 + 44 ms -> one of ~23 ms."""
  from kiln.tensor import Tensor
  groups, strides, dilations, pairs = node.arg[1]
  g, x, w = Tensor._wrap(grad, "conv2d backward"), Tensor._wrap(node.src[1]), Tensor._wrap(node.src[2])
  n, kernel, outs = w.ndim - 2, w.shape[2:], grad.shape[2:]
  # the rows the forward's floor division left out of every window come back as the transposed conv's output padding
  spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
  out_pads = [(size + b + a - span) % s for size, (b, a), span, s in zip(x.shape[2:], pairs, spans, strides)]
  dx = g._conv_transpose(w, None, groups, strides, dilations, list(pairs), out_pads, "conv2d backward")
  if not _phases_pay(x, strides, dilations, pairs, None):
    return dx.uop, _weight_gradient(x._conv_windows(kernel, strides, dilations, list(pairs), groups), g, w.shape).uop
  return dx.uop, _phase_weight_gradient(_phase_input(x, strides, pairs), g, w.shape, strides, outs, groups).uop

def _phase_weight_gradient(phases: Tensor, grad: Tensor, shape: tuple[int, ...], strides: tuple[int, ...],
                           outs: list[int], groups: int) -> Tensor:
  """A strided conv's weight gradient from `_phase_input`'s `phases`: for each phase r, the stride-1 weight gradient
  of its real taps alone (kernel positions q*s + r), over the real output positions only (the phased output's extra
  positions read inputs no output reads: an inf there times a zero gradient would give nan); the phases' taps
  interleaved back into the kernel. One weight gradient of all phases over whole phases (3x3 at stride 2: 16 taps
  for 9) spent 7/16 of its products on taps no weight has."""
  from kiln.tensor import Tensor
  n, kernel, (cout, cin), batch = len(strides), shape[2:], shape[:2], phases.shape[0]
  kq = [-(-k // s) for k, s in zip(kernel, strides)]
  by_phase = phases.reshape(batch, phases.shape[1] // prod(strides), *strides, *phases.shape[2:])
  parts = []
  for r in itertools.product(*[range(s) for s in strides]):
    taps = [len(range(ri, k, s)) for ri, k, s in zip(r, kernel, strides)]
    if 0 in taps:   # a kernel smaller than the stride has no tap in this phase: its slots are padding
      parts.append(Tensor.zeros(cout, cin, *kq, dtype=grad.dtype, device=grad.device))
      continue
    phase = by_phase.shrink(((0, batch), (0, by_phase.shape[1]), *[(ri, ri + 1) for ri in r],
                             *[(0, d) for d in by_phase.shape[2 + n:]])).reshape(batch, -1, *phases.shape[2:])
    if all(t == 1 for t in taps):
      # one tap: a 1x1 conv's weight gradient over the output positions, copied contiguous so that it sums them as
      # one axis (kiln/codegen/lowerer.py), not as rows cut short of the phase's
      phase = phase.shrink(((0, batch), (0, phase.shape[1]), *[(0, o) for o in outs])).contiguous()
      windows = phase._conv_windows(tuple(taps), (1,) * n, (1,) * n, [(0, 0)] * n, groups)
    else:
      windows = phase._conv_windows(tuple(taps), (1,) * n, (1,) * n, [(0, 0)] * n, groups)
      windows = windows.shrink((*[None] * 3, *[(0, o) for o in outs], *[None] * (1 + n)))
    part = _weight_gradient(windows, grad, (cout, cin, *taps))
    parts.append(part._pad_spatial([(0, q - t) for q, t in zip(kq, taps)]) if taps != kq else part)
  # (C_out, C_in, phases, *kq) -> channel c*prod(strides) + r, as `_phase_weight` lays the taps out
  dw = Tensor.stack(parts, dim=2).reshape(cout, cin * prod(strides), *kq)
  return _unphase_weight(dw, strides, kernel)

def _weight_gradient(windows: Tensor, grad: Tensor, shape: tuple[int, ...]) -> Tensor:
  """A conv weight's gradient: the output gradient times every window it met, summed over the batch and the
  positions; `windows` as `_conv_windows` gives them, `shape` the weight's."""
  n, groups = len(shape) - 2, windows.shape[1]
  per_window = grad.reshape(grad.shape[0], groups, shape[0] // groups, *grad.shape[2:], 1, *[1] * n)
  if windows.dtype != per_window.dtype or windows.dtype not in dtypes.narrow_floats:
    return (windows * per_window).sum((0, *range(3, 3 + n))).reshape(shape)
  # half: multiply and sum in float32, round once (as the forward does)
  return (windows.float() * per_window.float()).sum((0, *range(3, 3 + n))).cast(windows.dtype).reshape(shape)

SMALL_SYMBOLIC_ROW = 32   # a conv whose symbolic output rows are at most this long runs at their largest size

def _small_symbolic_rows(outs: list) -> bool:
  """Whether a conv's output rows are symbolic and short, at most SMALL_SYMBOLIC_ROW, with no vector-wide step
  (kiln/codegen/lowerer.py constant_factor): its kernel over symbolic sizes would be scalar (a 5x5 depthwise conv
  at 2v x 2v columns: 30x slower than one of plain sizes), while its largest size costs a few hundred positions."""
  from kiln.codegen.lowerer import constant_factor
  last = outs[-1]
  return isinstance(last, UOp) and sint_max(last) <= SMALL_SYMBOLIC_ROW and constant_factor(last) < 8

def _phases_pay(x: Tensor, strides, dilations, pairs, dtype) -> bool:
  """Whether a conv runs as a stride-1 conv of its input's phases: strided, undilated, not cropping, int sizes."""
  return any(s > 1 for s in strides) and all(d == 1 for d in dilations) and dtype is None and \
    all(b >= 0 and a >= 0 for b, a in pairs) and all(isinstance(d, int) for d in x.shape)

def _subsample(x: Tensor, strides: tuple[int, ...], pairs) -> Tensor:
  """The padded input at every stride-th position of each spatial axis (from the first), (N, C, *ceil(padded/s))."""
  n, (batch, channels) = len(strides), x.shape[:2]
  padded = [size + b + a for size, (b, a) in zip(x.shape[2:], pairs)]
  lengths = [-(-p // s) * s for p, s in zip(padded, strides)]
  x = x._pad_spatial([(b, a + length - p) for (b, a), length, p in zip(pairs, lengths, padded)])
  x = x.reshape(batch, channels, *flatten((length // s, s) for length, s in zip(lengths, strides)))
  x = x.shrink(((0, batch), (0, channels), *flatten(((0, length // s), (0, 1)) for length, s in zip(lengths, strides))))
  # a contiguous copy: read in place, the conv's rows would be strided (no vector loads)
  return x.reshape(batch, channels, *[length // s for length, s in zip(lengths, strides)]).contiguous()

def _phase_input(x: Tensor, strides: tuple[int, ...], pairs) -> Tensor:
  """The padded input (zeros added up to a multiple of each stride) with each spatial axis split by position modulo
  its stride, the remainders moved into the channels: (N, C*prod(strides), *padded/strides), channel c*prod(strides)
  + r holding the positions of remainders r, a contiguous copy. A stride-s conv reads position s*o + k, which is
  phase k % s at o + k // s: stride-1 convs of the phases (`_phase_convs`), whose rows are contiguous where the
  strided windows' were not (no vector loads). The weight gradient is one stride-1 conv's of all phases, with
  `_phase_weight`'s kernel zero-padded to whole phases (3x3 at stride 2: 16 taps for 9). Measured on a 32x64x32x32
  3x3 stride-2 conv, pad 1 (2-core EPYC): the forward kernel 32 -> 13.7 ms, the weight gradient's 80 -> 16.6 ms;
  forward and backward 105 -> 42 ms (PyTorch 17-21)."""
  n, (batch, channels) = len(strides), x.shape[:2]
  padded = [size + b + a for size, (b, a) in zip(x.shape[2:], pairs)]
  lengths = [-(-p // s) * s for p, s in zip(padded, strides)]
  x = x._pad_spatial([(b, a + length - p) for (b, a), length, p in zip(pairs, lengths, padded)])
  x = x.reshape(batch, channels, *flatten((length // s, s) for length, s in zip(lengths, strides)))
  x = x.permute(0, 1, *[3 + 2 * i for i in range(n)], *[2 + 2 * i for i in range(n)])
  return x.reshape(batch, channels * prod(strides), *[length // s for length, s in zip(lengths, strides)]).contiguous()

MAX_PHASE_CONVS = 9   # a strided conv is a sum of one conv per phase up to this many phases (3x3 strides)

def _phase_convs(phases: Tensor, w: Tensor, strides: tuple[int, ...], groups: int, outs: list[int], op: str) -> Tensor:
  """The strided conv of `_phase_input`'s `phases` with weight `w`, (N, C_out, *outs): a sum over the phases r of
  the stride-1 conv of phase r with w's taps k = r, r + s, ... (k % s == r): every tap once and no padded ones. One
  conv of all phases with the weight padded to whole phases (3x3 at stride 2: 16 taps for 9) spent 7/16 of its
  products on taps masked to 0, and the mask cost integer work in its inner loop: ResNet's 4x128x56x56 3x3 stride 2
  forward ran 141-145 -> 32 ms, 4x256x28x28 221-231 -> 52 ms (one thread, Sapphire Rapids)."""
  n, kernel, (batch, channels), (cout, cin) = len(strides), w.shape[2:], phases.shape[:2], w.shape[:2]
  by_phase = phases.reshape(batch, channels // prod(strides), *strides, *phases.shape[2:])
  # the weight's taps by phase: (C_out, C_in, *strides, *kq), tap q of phase r being kernel position q*s + r; copied
  # once, so that the phases' convs read plain weights (through the padded view their weight loads are gated, and a
  # gated load takes the tile's wide axis away from the output channels)
  kq = [-(-k // s) for k, s in zip(kernel, strides)]
  w_by_phase = _phase_weight(w, strides).reshape(cout, cin, *strides, *kq).contiguous()
  total = None
  for r in itertools.product(*[range(s) for s in strides]):
    taps = [len(range(ri, k, s)) for ri, k, s in zip(r, kernel, strides)]
    if 0 in taps: continue   # a kernel smaller than the stride has no tap in this phase
    phase = by_phase.shrink(((0, batch), (0, by_phase.shape[1]), *[(ri, ri + 1) for ri in r],
                             *[(0, d) for d in by_phase.shape[2 + n:]])).reshape(batch, -1, *phases.shape[2:])
    phase_w = w_by_phase.shrink(((0, cout), (0, cin), *[(ri, ri + 1) for ri in r], *[(0, t) for t in taps]))
    # each phase's conv computes the outputs only (a phase of fewer taps would make more: 15 columns rather than 14
    # keep a conv off its vector tiles)
    crops = [(0, o + t - 1 - size) for o, t, size in zip(outs, taps, phases.shape[2:])]
    part = phase._conv(phase_w.reshape(cout, cin, *taps), None, groups, 1, 1, crops, None, op)
    # (each phase's conv a kernel of its own: fused into one kernel of four sums, they got no conv tile)
    total = part if total is None else total.contiguous() + part
  return total

def _transposed_by_phase(x: Tensor, w: Tensor, groups: int, strides: tuple[int, ...], pairs: Sequence[tuple[int, int]],
                         out_pads: Sequence[int], op: str) -> Tensor:
  """A strided, undilated transposed convolution (x (N, C_in, *in), w (C_in, C_out/groups, *kernel)) by its output
  phases: output position s*J + r (before the padding crops it) sums x[J - q] * w[r + s*q] over the taps q of phase
  r, a stride-1 convolution of x with those taps flipped, so each phase is one conv and the phases interleave into
  the output. The zero-stuffed input it replaces (a stride-1 conv over s-1 zeros between the inputs) spent 3/4 of its
  products on zeros at stride 2, through gated loads: ResNet's 3x3 stride-2 input gradients ran 97-169 -> 9-13 ms
  (4x128x56x56) and 119-135 -> 18-31 ms (4x256x28x28), one thread on a loaded machine."""
  from kiln.tensor import Tensor
  n, (cin, cout_group), kernel, sizes = len(strides), w.shape[:2], w.shape[2:], x.shape[2:]
  outs = [(i - 1) * s + k - b - a + p for i, s, k, (b, a), p in zip(sizes, strides, kernel, pairs, out_pads)]
  lengths = [-(-o // s) for o, s in zip(outs, strides)]   # positions of each output phase (the last may be cut)
  kq = [-(-k // s) for k, s in zip(kernel, strides)]
  w_by_phase = _phase_weight(w, strides).reshape(cin, cout_group, *strides, *kq)
  parts = []
  # output phase p (positions s*u + p) is the uncropped output's phase r = (p + b) % s at J = u + (p + b) // s
  for p in itertools.product(*[range(s) for s in strides]):
    r = [(pi + b) % s for pi, (b, _), s in zip(p, pairs, strides)]
    offsets = [(pi + b) // s for pi, (b, _), s in zip(p, pairs, strides)]
    taps = [len(range(ri, k, s)) for ri, k, s in zip(r, kernel, strides)]
    if 0 in taps:   # no tap of the kernel falls in this phase
      parts.append(Tensor.zeros(x.shape[0], groups * cout_group, *lengths, dtype=x.dtype, device=x.device))
      continue
    h = w_by_phase.shrink(((0, cin), (0, cout_group), *[(ri, ri + 1) for ri in r], *[(0, t) for t in taps]))
    # per group (C_in, C_out/g, *taps) -> (C_out, C_in/g, *taps), the taps flipped
    h = h.reshape(groups, cin // groups, cout_group, *taps).permute(0, 2, 1, *range(3, 3 + n))
    # (copied: each phase's conv then reads its weight as a forward conv does, channels contiguous; through these
    # views the loads were gated or strided, and the tiles took the image columns for their wide axis: 3-10x slower)
    h = h.flip(tuple(range(3, 3 + n))).reshape(groups * cout_group, cin // groups, *taps).contiguous()
    # J - q for J in [offset, offset + length) and the taps q: x padded by t - 1 - offset before (a crop if negative)
    conv_pairs = [(t - 1 - off, m + off - i) for t, off, m, i in zip(taps, offsets, lengths, sizes)]
    parts.append(x._conv(h, None, groups, 1, 1, conv_pairs, None, op))
  out = _interleave_phases(parts, strides)
  return out.shrink(((0, out.shape[0]), (0, out.shape[1]), *[(0, o) for o in outs]))

def _interleave_phases(parts: list[Tensor], strides: tuple[int, ...]) -> Tensor:
  """Phases (..., *lengths), one a remainder r in itertools.product order, as the (..., *lengths*strides) tensor whose
  position s*J + r is phase r's J (the inverse of splitting positions by their remainders)."""
  n = len(strides)
  lead, lengths = parts[0].shape[:parts[0].ndim - n], parts[0].shape[parts[0].ndim - n:]
  out = parts[0].stack(*parts[1:], dim=len(lead)) if len(parts) > 1 else parts[0].unsqueeze(len(lead))
  out = out.reshape(*lead, *strides, *lengths)
  out = out.permute(*range(len(lead)), *flatten((len(lead) + n + i, len(lead) + i) for i in range(n)))
  return out.reshape(*lead, *[m * s for m, s in zip(lengths, strides)])

def _phase_weight(w: Tensor, strides: tuple[int, ...]) -> Tensor:
  """A conv weight (C_out, C_in, *kernel) for `_phase_input`'s phases: each kernel axis zero-padded to a multiple of
  its stride and split the same way, (C_out, C_in*prod(strides), *ceil(kernel/strides)). Of a bool weight of Trues:
  which phased taps are real (the padded ones are False)."""
  n, kernel = len(strides), w.shape[2:]
  kq = [-(-k // s) for k, s in zip(kernel, strides)]
  w = w._pad_spatial([(0, q * s - k) for q, s, k in zip(kq, strides, kernel)])
  w = w.reshape(*w.shape[:2], *flatten((q, s) for q, s in zip(kq, strides)))
  w = w.permute(0, 1, *[3 + 2 * i for i in range(n)], *[2 + 2 * i for i in range(n)])
  return w.reshape(w.shape[0], w.shape[1] * prod(strides), *kq)

def _unphase_weight(w: Tensor, strides: tuple[int, ...], kernel: tuple[int, ...]) -> Tensor:
  """`_phase_weight`'s inverse: (C_out, C_in*prod(strides), *kq) back to (C_out, C_in, *kernel)."""
  n, kq = len(strides), w.shape[2:]
  w = w.reshape(w.shape[0], w.shape[1] // prod(strides), *strides, *kq)
  w = w.permute(0, 1, *flatten((2 + n + i, 2 + i) for i in range(n)))
  w = w.reshape(*w.shape[:2], *[q * s for q, s in zip(kq, strides)])
  return w.shrink(((0, w.shape[0]), (0, w.shape[1]), *[(0, k) for k in kernel]))

custom_backward_rules["conv"] = _conv_backward

def _max_pool_backward(grad: UOp, node: UOp) -> tuple[UOp]:
  """The input gradient of an undilated max pool (a CUSTOM_BACKWARD rule): each window's gradient goes to its maxima,
  shared among ties, as REDUCE MAX's rule gives it. Autograd through the windows' view summed every input's candidate
  windows in a gated loop over whole phases (ResNet's 3x3 stride-2 pool: (4,64,114,114) x 4x4, 64 ms on one thread);
  here input phase r (positions s*J + r of the padded input) gets, from each of its taps q (kernel position r + s*q),
  the gradient of window J - q where its value is that window's maximum: a few elementwise terms a phase."""
  from kiln.tensor import Tensor
  kernel, strides, pairs = node.arg[1]
  g, x = Tensor._wrap(grad, "max_pool2d backward"), Tensor._wrap(node.src[1])
  n, lead, sizes = len(kernel), list(x.shape[:x.ndim - len(kernel)]), x.shape[x.ndim - len(kernel):]
  axes = tuple(range(-n, 0))
  padded = x._pad_spatial(list(pairs), dtypes.min(x.dtype))
  windows = padded._pool(kernel, strides, (1,) * n)
  best = windows.max(axes)
  share = g / (windows == best.reshape(*best.shape, *[1] * n)).sum(axes, dtype=g.dtype)   # each maximum's part
  outs = best.shape[len(lead):]
  lengths = [-(-(b + size + a) // s) for size, (b, a), s in zip(sizes, pairs, strides)]   # phase positions
  # the padded input by phase: (..., *lengths) views of positions s*J + r (padded with the minimum up to whole phases)
  extra = [m * s - (b + size + a) for m, s, size, (b, a) in zip(lengths, strides, sizes, pairs)]
  whole = padded._pad_spatial([(0, e) for e in extra], dtypes.min(x.dtype))
  by_phase = whole.reshape(*lead, *flatten((m, s) for m, s in zip(lengths, strides)))
  parts = []
  for r in itertools.product(*[range(s) for s in strides]):
    phase = by_phase.shrink((*[(0, d) for d in lead], *flatten(((0, m), (ri, ri + 1)) for m, ri in zip(lengths, r))))
    phase = phase.reshape(*lead, *lengths)
    total = phase.zeros_like()
    for q in itertools.product(*[range(len(range(ri, k, s))) for ri, k, s in zip(r, kernel, strides)]):
      # window J - q over J in [0, length): best and share shifted by q (no window there: NaN and 0, never chosen)
      shift = [(qi, m - o - qi) for qi, m, o in zip(q, lengths, outs)]
      window_best = best._pad_spatial(shift, math.nan)
      total = total + (phase == window_best).where(share._pad_spatial(shift, 0.0), 0.0)
    parts.append(total)
  out = _interleave_phases(parts, strides)
  return (out.shrink((*[(0, d) for d in lead], *[(b, b + size) for (b, _), size in zip(pairs, sizes)])).uop,)

custom_backward_rules["max_pool"] = _max_pool_backward

class ConvMixin:
  __slots__ = ()

  # ---------------- the sliding-window view ----------------
  def _pad_spatial(self, pairs: Sequence[tuple[int, int]], value: float = 0.0) -> Tensor:
    """Pad (or, where negative, crop) the trailing len(pairs) axes."""
    lead = [(0, 0)] * (self.ndim - len(pairs))
    x = self
    if any(b < 0 or a < 0 for b, a in pairs):
      sizes = self.shape[len(lead):]
      if any(max(-b, 0) > sint_min(ssub(size, max(-a, 0))) for (b, a), size in zip(pairs, sizes)):
        # a crop reaching past the other side's zeros (a transposed conv's (-2, 2) of a size-1 axis): pad first, so
        # the crop takes the zeros (a crop first would be out of bounds)
        x = x.pad(tuple(lead + [(max(b, 0), max(a, 0)) for b, a in pairs]), value=value)
        sizes, pairs = x.shape[len(lead):], [(min(b, 0), min(a, 0)) for b, a in pairs]
      bounds = [None] * len(lead) + [(max(-b, 0), ssub(size, max(-a, 0))) for (b, a), size in zip(pairs, sizes)]
      x = x.shrink(tuple(bounds))
      pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if not any(b or a for b, a in pairs): return x
    return x.pad(tuple(lead + list(pairs)), value=value)

  def _pool(self, kernel: tuple[int, ...], stride: int | tuple[int, ...] = 1,
            dilation: int | tuple[int, ...] = 1) -> Tensor:
    """The sliding windows over the trailing len(kernel) axes: (..., *spatial) -> (..., *out, *kernel).

    out = (size - dilation*(kernel-1) - 1) // stride + 1 per axis, and the view holds
    x[..., o*stride + j*dilation] at [..., o, j]. Made of movement ops only (no copy, no gather).
    """
    n = len(kernel)
    if self.ndim < n: raise TensorValueError(f"pool: a {n}-d kernel needs at least {n} dims, got {fmt(self.shape)}{where()}")
    strides, dilations = _int_tuple(stride, n, "stride", "pool"), _int_tuple(dilation, n, "dilation", "pool")
    lead, sizes = list(self.shape[:-n]), self.shape[self.ndim - n:]
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if any(isinstance(size, UOp) for size in sizes): return self._pool_symbolic(kernel, strides, dilations)
    if any(span > size for span, size in zip(spans, sizes)):
      raise TensorValueError(f"pool: kernel {fmt(kernel)} with dilation {fmt(dilations)} spans {fmt(spans)}, more than the "
                             f"(padded) input's spatial size {fmt(sizes)}{where()}")
    outs = [(size - span) // s + 1 for size, span, s in zip(sizes, spans, strides)]
    keep = [None] * len(lead)
    nl = len(lead)
    if all(k <= s and d == 1 for k, s, d in zip(kernel, strides, dilations)):
      # windows don't overlap: cut each axis into blocks of `stride` and keep the first `kernel` of every block
      x = self._pad_spatial([(0, max(0, o * s - size)) for o, s, size in zip(outs, strides, sizes)])
      x = x.shrink(tuple(keep + [(0, o * s) for o, s in zip(outs, strides)]))
      x = x.reshape(lead + flatten((o, s) for o, s in zip(outs, strides)))
      x = x.shrink(tuple(keep + flatten(((0, o), (0, k)) for o, k in zip(outs, kernel))))
      return x.permute(*range(nl), *[nl + 2 * i for i in range(n)], *[nl + 2 * i + 1 for i in range(n)])
    # Overlapping or dilated windows. Lay `kernel` copies of the axis (length L) end to end and read it in rows of
    # L + dilation: row j then starts j*dilation further into the axis, so column o*stride of row j is
    # x[o*stride + j*dilation], and taking every stride-th column is a reshape. L >= out*stride keeps it legal.
    # The copies are an expand, so nothing is materialized.
    lengths = [max(size, o * s) for size, o, s in zip(sizes, outs, strides)]
    x = self._pad_spatial([(0, length - size) for length, size in zip(lengths, sizes)])
    repeats = [math.ceil(k * (length + d) / length) for k, length, d in zip(kernel, lengths, dilations)]
    x = x.reshape(lead + flatten((1, length) for length in lengths))
    x = x.expand(lead + flatten((r, length) for r, length in zip(repeats, lengths)))
    x = x.reshape(lead + [r * length for r, length in zip(repeats, lengths)])
    x = x.shrink(tuple(keep + [(0, k * (length + d)) for k, length, d in zip(kernel, lengths, dilations)]))
    x = x.reshape(lead + flatten((k, length + d) for k, length, d in zip(kernel, lengths, dilations)))
    x = x.shrink(tuple(keep + flatten(((0, k), (0, o * s)) for k, o, s in zip(kernel, outs, strides))))
    x = x.reshape(lead + flatten((k, o, s) for k, o, s in zip(kernel, outs, strides)))
    x = x.shrink(tuple(keep + flatten(((0, k), (0, o), (0, 1)) for k, o in zip(kernel, outs))))
    x = x.reshape(lead + flatten((k, o) for k, o in zip(kernel, outs)))
    return x.permute(*range(nl), *[nl + 2 * i + 1 for i in range(n)], *[nl + 2 * i for i in range(n)])

  def _pool_symbolic(self, kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]) -> Tensor:
    """`_pool` over spatial sizes that are expressions of bound Variables: the windows of the input zero-extended to
    each size's largest value (plain ints, so `_pool`'s reshapes divide by constants), cut to the outputs of the
    actual size. An output o of an axis of size L reads positions o*s + j*d <= L - 1, never the extension, so its
    value is irrelevant; the kernels loop over the actual outputs (symbolic bounds)."""
    n, lead, sizes = len(kernel), list(self.shape[:-len(kernel)]), self.shape[self.ndim - len(kernel):]
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if any(sint_min(size) < span for span, size in zip(spans, sizes)):
      raise TensorValueError(f"pool: kernel {fmt(kernel)} with dilation {fmt(dilations)} spans {fmt(spans)}, more than "
                             f"the smallest (padded) input spatial size {fmt([sint_min(s) for s in sizes])} of "
                             f"{fmt(self.shape)}{where()}")
    largest = [sint_max(size) for size in sizes]
    extended = self.pad(tuple([(0, 0)] * len(lead) + [(0, ssub(m, size)) for m, size in zip(largest, sizes)]))
    windows = extended._pool(kernel, strides, dilations)
    outs = [ssimplify((size - span) // s + 1) if isinstance(size, UOp) else (size - span) // s + 1
            for size, span, s in zip(sizes, spans, strides)]
    return windows.shrink((*[None] * len(lead), *[(0, o) for o in outs], *[None] * n))

  # ---------------- convolutions ----------------
  def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: int | tuple[int, ...] = 1,
             dilation: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] = 0, dtype=None) -> Tensor:
    """Convolution (cross-correlation, as PyTorch) of (N, C_in, *spatial) with a (C_out, C_in/groups, *kernel) weight.

    Any number of spatial dims (1d, 2d, 3d). `padding` is an int, one int per spatial dim, or 2*dims ints in PyTorch's
    flat order (left, right, top, bottom, ...). `dtype` is the accumulation and result dtype.

    >>> Tensor.arange(9).reshape(1, 1, 3, 3).float().conv2d(Tensor.ones(1, 1, 2, 2)).tolist()
    [[[[8.0, 12.0], [20.0, 24.0]]]]
    """
    if not isinstance(weight, type(self)):
      raise TypeError(f"conv2d: weight must be a Tensor, got {type(weight).__name__}{where()}")
    pairs = _pad_pairs(padding, max(weight.ndim - 2, 0), "conv2d")
    if any(b < 0 or a < 0 for b, a in pairs): raise TensorValueError(f"conv2d: negative padding {padding!r}{where()}")
    return self._conv(weight, bias, groups, stride, dilation, pairs, dtype, "conv2d")

  def _conv(self, weight: Tensor, bias: Tensor | None, groups, stride, dilation, pairs: list[tuple[int, int]], dtype,
            op: str, taps: Tensor | None = None) -> Tensor:
    """conv2d with padding already resolved to (before, after) pairs, which may be negative (a crop). `taps` (bool,
    the weight's shape) selects the kernel taps that count: the products of the others are 0 even where the input
    is inf or nan (a multiplication by a zero weight would give nan)."""
    x, w = self, weight
    _check_conv_operands(x, w, groups, op)
    n = w.ndim - 2
    (batch, channels), (cout, cin), kernel = x.shape[:2], w.shape[:2], w.shape[2:]
    if cin * groups != channels:
      raise TensorValueError(f"{op}: input {fmt(x.shape)} has {channels} channels but weight {fmt(w.shape)} with "
                             f"groups={groups} expects {cin}*{groups} = {cin * groups}{where()}")
    if cout % groups:
      raise TensorValueError(f"{op}: weight {fmt(w.shape)} has {cout} output channels, not divisible by "
                             f"groups={groups}{where()}")
    if bias is not None and (not isinstance(bias, type(self)) or bias.shape != (cout,)):
      got = fmt(bias.shape) if isinstance(bias, type(self)) else type(bias).__name__
      raise TensorValueError(f"{op}: bias must have shape ({cout},) for weight {fmt(w.shape)}, got {got}{where()}")
    strides, dilations = _int_tuple(stride, n, "stride", op), _int_tuple(dilation, n, "dilation", op)
    padded = [size + b + a for size, (b, a) in zip(x.shape[2:], pairs)]
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if any(sint_min(p) < span for p, span in zip(padded, spans)) or 0 in kernel:
      raise TensorValueError(f"{op}: kernel {fmt(kernel)} (dilation {fmt(dilations)}) is larger than the padded input "
                             f"{fmt(padded)} of input {fmt(x.shape)}{where()}")
    outs = [ssimplify((p - span) // s + 1) for p, span, s in zip(padded, spans, strides)]
    if _small_symbolic_rows(outs):
      # computed over the input zero-extended to its largest size, as a conv of plain sizes, then cut to the
      # outputs (zeros past the input are what its padding reads there: the outputs kept never read further)
      extended = x.pad(((0, 0), (0, 0), *[(0, ssub(sint_max(size), size)) for size in x.shape[2:]]))
      whole = extended._conv(weight, bias, groups, strides, dilations, pairs, dtype, op, taps).contiguous()
      return whole.shrink((None, None, *[(0, o) for o in outs]))
    if n > 1 and all(k == 1 for k in kernel) and all(s == 1 for s in strides) and all(p == (0, 0) for p in pairs) \
       and all(isinstance(s, int) for s in x.shape[2:]):
      # a 1x1 conv is a matmul over the image's positions: over one flattened axis the kernel's vectors run along
      # whole images, not rows of 56 or 7 (ResNet-50 at batch 1, 64x256 weights over 56x56: 39 -> 139 GFLOP/s)
      flat_taps = None if taps is None else taps.reshape(cout, cin, 1)
      flat = x.reshape(batch, channels, prod(x.shape[2:]))._conv(w.reshape(cout, cin, 1), None, groups, 1, 1, [(0, 0)],
                                                                 dtype, op, flat_taps)
      out = flat.reshape(batch, cout, *x.shape[2:])
      return out if bias is None else out + bias.reshape(1, cout, *[1] * n)
    if all(k == 1 for k in kernel) and _phases_pay(x, strides, dilations, pairs, None):
      # a 1x1 kernel at a stride reads every stride-th input: subsampled first, it is a stride-1 conv (its phases
      # would pad the kernel to the strides, 4x the products at stride 2: a ResNet downsample)
      return _subsample(x, strides, pairs)._conv(weight, bias, groups, 1, dilations, [(0, 0)] * n, dtype, op, taps)
    if _phases_pay(x, strides, dilations, pairs, dtype):
      # a strided conv is a sum of stride-1 convs, one per phase of the input (_phase_input: contiguous rows where
      # the strided windows' were not), each with the weight's taps of that phase (_phase_convs)
      outs = [(p - span) // s + 1 for p, span, s in zip(padded, spans, strides)]
      if prod(strides) <= MAX_PHASE_CONVS: out = _phase_convs(_phase_input(x, strides, pairs), w, strides, groups, outs, op)
      else:
        # many phases (a filter bank at stride 128): one conv of them all, the weight zero-padded to whole phases and
        # its padded taps selected out (they read inputs of the next window, or ones no output reads)
        real_taps = _phase_weight(w.ones_like(dtype=dtypes.bool), strides)
        phased = _phase_input(x, strides, pairs)._conv(_phase_weight(w, strides), None, groups, 1, 1,
                                                       [(0, 0)] * n, None, op, real_taps)
        out = phased.shrink(((0, batch), (0, cout), *[(0, o) for o in outs]))
    else:
      windows = x._conv_windows(kernel, strides, dilations, pairs, groups)
      outs = windows.shape[3:3 + n]
      # (N, groups, 1, *out, cin, *kernel) * (1, groups, cout/groups, *1, cin, *kernel), summed over (cin, *kernel)
      w = w.reshape(1, groups, cout // groups, *[1] * n, cin, *kernel)
      # half products are exact in float32: they are summed there and the output rounded once, as in PyTorch
      wide = dtype is None and windows.dtype == w.dtype and windows.dtype in dtypes.narrow_floats
      products = windows.float() * w.float() if wide else windows * w
      if taps is not None: products = taps.reshape(w.shape).where(products, 0)
      out = products.sum(tuple(range(-1 - n, 0)), dtype=dtype).reshape(batch, cout, *outs)
      if wide: out = out.cast(x.dtype)
    if dtype is None and all(b >= 0 and a >= 0 for b, a in pairs) and dtypes.is_float(out.dtype):
      # the input gradient as a transposed convolution, not through the windows' view (_conv_backward)
      params = (groups, strides, dilations, tuple(pairs))
      out = type(self)._wrap(custom_backward(out.uop, (x.uop, weight.uop), "conv", params), op)
    return out if bias is None else out + bias.reshape(1, cout, *[1] * n)

  def _conv_windows(self, kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...],
                    pairs: list[tuple[int, int]], groups: int) -> Tensor:
    """The padded input's sliding windows as a convolution multiplies them: (N, groups, 1, *out, cin, *kernel)."""
    n = len(kernel)
    padded_x = self._pad_spatial(pairs)
    # a large padded input is copied once (one cheap kernel): reading it through the pad view gates every load of
    # the convolution and of its weight gradient, which keeps the C compiler from vectorizing them (measured on the
    # anchors' 16x64x56x56 conv: 25 -> 86 GFLOP/s forward on one core, codegen/opt/heuristic.py)
    # (a symbolic batch counts as one image, a symbolic height or width as its largest value)
    if any(b > 0 or a > 0 for b, a in pairs) and \
       prod([1, *[sint_max(d) for d in padded_x.shape[1:]]]) >= PAD_COPY_MIN_ELEMENTS:
      padded_x = padded_x.contiguous()
    windows = padded_x._pool(kernel, strides, dilations)   # (N, groups*cin, *out, *kernel)
    outs = windows.shape[2:2 + n]
    windows = windows.reshape(self.shape[0], groups, 1, self.shape[1] // groups, *outs, *kernel)
    return windows.permute(0, 1, 2, *range(4, 4 + n), 3, *range(4 + n, 4 + 2 * n))

  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                       stride: int | tuple[int, ...] = 1, dilation: int | tuple[int, ...] = 1,
                       padding: int | tuple[int, ...] = 0, output_padding: int | tuple[int, ...] = 0) -> Tensor:
    """Transposed convolution (conv2d's gradient) of (N, C_in, *spatial) with a (C_in, C_out/groups, *kernel) weight.

    Any number of spatial dims. Each output size is (in-1)*stride - pad_before - pad_after + dilation*(kernel-1)
    + output_padding + 1.

    >>> Tensor([[[1.0, 2.0]]]).conv_transpose2d(Tensor([[[1.0, 10.0]]]), stride=2).tolist()
    [[[1.0, 10.0, 2.0, 20.0]]]
    """
    if not isinstance(weight, type(self)):
      raise TypeError(f"conv_transpose2d: weight must be a Tensor, got {type(weight).__name__}{where()}")
    op, x, w = "conv_transpose2d", self, weight
    _check_conv_operands(x, w, groups, op)
    n, cin, kernel = w.ndim - 2, w.shape[0], w.shape[2:]
    if x.shape[1] != cin or cin % groups:
      raise TensorValueError(f"{op}: input {fmt(x.shape)} has {x.shape[1]} channels but weight {fmt(w.shape)} expects {cin} "
                             f"(and a multiple of groups={groups}){where()}")
    strides, dilations = _int_tuple(stride, n, "stride", op), _int_tuple(dilation, n, "dilation", op)
    out_pads = _int_tuple(output_padding, n, "output_padding", op, minimum=0)
    pairs = _pad_pairs(padding, n, op)
    if any(b < 0 or a < 0 for b, a in pairs): raise TensorValueError(f"{op}: negative padding {padding!r}{where()}")
    if any(p >= max(s, d) for p, s, d in zip(out_pads, strides, dilations)):
      raise TensorValueError(f"{op}: output_padding {fmt(out_pads)} must be smaller than stride {fmt(strides)} or dilation "
                             f"{fmt(dilations)}{where()}")
    sizes = x.shape[2:]
    outs = [(i - 1) * s - b - a + d * (k - 1) + p + 1
            for i, s, (b, a), d, k, p in zip(sizes, strides, pairs, dilations, kernel, out_pads)]
    if any(sint_min(i) == 0 for i in sizes) or any(sint_min(o) <= 0 for o in outs):
      raise TensorValueError(f"{op}: input {fmt(x.shape)} with weight {fmt(w.shape)} gives output size {fmt(outs)}{where()}")
    return x._conv_transpose(w, bias, groups, strides, dilations, pairs, out_pads, op)

  def _conv_transpose(self, w: Tensor, bias: Tensor | None, groups: int, strides: tuple[int, ...],
                      dilations: tuple[int, ...], pairs: list[tuple[int, int]], out_pads: Sequence[int],
                      op: str) -> Tensor:
    """conv_transpose2d with its arguments checked and resolved: a convolution of the stride-dilated input with the
    flipped, transposed weight."""
    x, n, cin, kernel, sizes = self, w.ndim - 2, w.shape[0], w.shape[2:], self.shape[2:]
    if any(s > 1 for s in strides) and all(d == 1 for d in dilations) and all(isinstance(i, int) for i in sizes) \
       and prod(strides) <= MAX_PHASE_CONVS:
      out = _transposed_by_phase(x, w, groups, strides, pairs, out_pads, op)
      return out if bias is None else out + bias.reshape(1, -1, *[1] * n)
    if any(s > 1 for s in strides):
      # put stride-1 zeros between the input's elements: (i) -> (i, 1) -> pad to (i, s) -> (i*s) -> crop the tail zeros
      x = x.reshape(*x.shape[:2], *flatten((i, 1) for i in sizes))
      x = x._pad_spatial(flatten(((0, 0), (0, s - 1)) for s in strides))
      x = x.reshape(*x.shape[:2], *[i * s for i, s in zip(sizes, strides)])
      x = x._pad_spatial([(0, 1 - s) for s in strides])
    # (C_in, C_out/g, *k) -> (C_out, C_in/g, *k) per group, kernel flipped
    w = w.reshape(groups, cin // groups, w.shape[1], *kernel).permute(0, 2, 1, *range(3, 3 + n))
    w = w.flip(tuple(range(3, 3 + n))).reshape(groups * w.shape[1], cin // groups, *kernel)
    conv_pairs = [((k - 1) * d - b, (k - 1) * d - a + p) for k, d, (b, a), p in zip(kernel, dilations, pairs, out_pads)]
    return x._conv(w, bias, groups, 1, dilations, conv_pairs, None, op)

  # ---------------- pooling ----------------
  def _pool_args(self, kernel_size, stride, dilation, padding, ceil_mode: bool, op: str):
    """Resolve pooling arguments: (kernel, strides, dilations, regular pads, extra right pads for ceil_mode)."""
    n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    kernel = _int_tuple(kernel_size, n, "kernel_size", op)
    if self.ndim < n:
      raise TensorValueError(f"{op}: a {n}-d kernel needs an input with at least {n} dims, got {fmt(self.shape)}{where()}")
    strides = kernel if stride is None else _int_tuple(stride, n, "stride", op)
    dilations = _int_tuple(dilation, n, "dilation", op)
    pairs = _pad_pairs(padding, n, op)
    if any(b < 0 or a < 0 for b, a in pairs): raise TensorValueError(f"{op}: negative padding {padding!r}{where()}")
    sizes = self.shape[self.ndim - n:]
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    padded = [i + b + a for i, (b, a) in zip(sizes, pairs)]
    if any(sint_min(p) < span for p, span in zip(padded, spans)):
      raise TensorValueError(f"{op}: kernel {fmt(kernel)} (dilation {fmt(dilations)}) is larger than the padded input "
                             f"{fmt(padded)} of input {fmt(self.shape)}{where()}")
    extra = [0] * n
    if ceil_mode:
      for axis, (i, (b, _), p, span, s) in enumerate(zip(sizes, pairs, padded, spans, strides)):
        out = -(-(p - span) // s) + 1
        if (out - 1) * s >= i + b: out -= 1   # as in PyTorch: the last window must start inside the input or left pad
        extra[axis] = max(0, (out - 1) * s + span - p)
    return kernel, strides, dilations, pairs, extra

  def avg_pool2d(self, kernel_size: int | tuple[int, ...] = (2, 2), stride=None, dilation=1,
                 padding: int | tuple[int, ...] = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Average over sliding windows of the trailing len(kernel_size) axes (any number of them).

    `stride` defaults to the kernel size; `padding` as in conv2d. With `count_include_pad` the zero padding counts in
    each window's divisor; `ceil_mode` keeps a last partial window.

    >>> Tensor.arange(16).reshape(1, 1, 4, 4).float().avg_pool2d().tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    kernel, strides, dilations, pairs, extra = self._pool_args(kernel_size, stride, dilation, padding, ceil_mode,
                                                               "avg_pool2d")
    n = len(kernel)
    x = self._as_float()
    windows = x._pad_spatial([(b, a + e) for (b, a), e in zip(pairs, extra)])._pool(kernel, strides, dilations)
    total = windows.sum(tuple(range(-n, 0)))
    if count_include_pad and not ceil_mode: return total / prod(kernel)
    # how many taps of each window fall inside the input (or its explicit padding): the same for every channel
    counts = np.ones((), np.float64)
    for size, (b, a), k, s, d, out in zip(self.shape[self.ndim - n:], pairs, kernel, strides, dilations,
                                          windows.shape[windows.ndim - 2 * n:windows.ndim - n]):
      lo, hi = (-b, size + a) if count_include_pad else (0, size)
      taps = np.arange(out)[:, None] * s - b + np.arange(k)[None, :] * d
      counts = np.multiply.outer(counts, ((taps >= lo) & (taps < hi)).sum(1))
    return total / type(self)(np.maximum(counts, 1), device=self.device, dtype=total.dtype)

  def max_pool2d(self, kernel_size: int | tuple[int, ...] = (2, 2), stride=None, dilation=1,
                 padding: int | tuple[int, ...] = 0, ceil_mode: bool = False,
                 return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Maximum over sliding windows of the trailing len(kernel_size) axes (any number of them).

    With `return_indices`, also the position of each maximum as a flat index into its (unpadded) channel plane, as in
    PyTorch (int32; the first maximum wins ties), for max_unpool2d.

    >>> Tensor([[[[1, 5, 2, 0], [3, 4, 8, 7]]]]).max_pool2d(return_indices=True)[1].tolist()
    [[[[1, 6]]]]
    """
    kernel, strides, dilations, pairs, extra = self._pool_args(kernel_size, stride, dilation, padding, ceil_mode,
                                                               "max_pool2d")
    n, axes = len(kernel), tuple(range(-len(kernel), 0))
    full_pairs = [(b, a + e) for (b, a), e in zip(pairs, extra)]
    windows = self._pad_spatial(full_pairs, dtypes.min(self.dtype))._pool(kernel, strides, dilations)
    if not return_indices:
      out = windows.max(axes)
      if dtypes.is_float(self.dtype) and all(d == 1 for d in dilations) and prod(strides) <= MAX_PHASE_CONVS and \
         all(isinstance(d, int) for d in self.shape):
        # the gradient by input phase (_max_pool_backward), not through the windows' view
        params = (kernel, strides, tuple(full_pairs))
        out = type(self)._wrap(custom_backward(out.uop, (self.uop,), "max_pool", params), "max_pool2d")
      return out
    best = windows.max(axes, keepdim=True)
    spatial = self.shape[self.ndim - n:]
    plane = prod(spatial)
    # count down so that max() picks the first (lowest) position among equal maxima; padding counts as 0, never chosen
    countdown = self.arange(plane, 0, -1, device=self.device).reshape(spatial)
    countdown = countdown._pad_spatial(full_pairs)._pool(kernel, strides, dilations)
    index = plane - (windows == best).where(countdown, 0).max(axes)
    return best.reshape(best.shape[:best.ndim - n]), index.cast(dtypes.default_int)

  def max_unpool2d(self, indices: Tensor, kernel_size: int | tuple[int, ...] = (2, 2), stride=None, dilation=1,
                   padding: int | tuple[int, ...] = 0, output_size=None) -> Tensor:
    """Partial inverse of max_pool2d: put each value at its flat `indices` position in a zero plane.

    The input is (N, C, *spatial); the output size follows from the pooling arguments unless `output_size` is given
    (spatial dims, or all dims). Indices outside the output plane are dropped.

    >>> v, i = Tensor([[[[1.0, 5.0], [3.0, 2.0]]]]).max_pool2d(return_indices=True)
    >>> v.max_unpool2d(i).tolist()
    [[[[0.0, 5.0], [0.0, 0.0]]]]
    """
    op = "max_unpool2d"
    if not isinstance(indices, type(self)):
      raise TypeError(f"{op}: indices must be a Tensor, got {type(indices).__name__}{where()}")
    if self.ndim < 3: raise TensorValueError(f"{op}: input must be (N, C, *spatial), got {fmt(self.shape)}{where()}")
    if indices.shape != self.shape:
      raise TensorValueError(f"{op}: indices {fmt(indices.shape)} must have the input's shape {fmt(self.shape)}{where()}")
    batch, channels, *spatial = self.shape
    n = len(spatial)
    if output_size is None:
      kernel = _int_tuple(kernel_size, n, "kernel_size", op)
      strides = kernel if stride is None else _int_tuple(stride, n, "stride", op)
      dilations = _int_tuple(dilation, n, "dilation", op)
      pairs = _pad_pairs(padding, n, op)
      out_size = tuple((i - 1) * s - b - a + d * (k - 1) + 1
                       for i, s, (b, a), d, k in zip(spatial, strides, pairs, dilations, kernel))
    else:
      size = tuple(output_size)
      if len(size) not in (n, n + 2) or not all(_is_int(s) for s in size):
        raise TensorValueError(f"{op}: output_size must have {n} or {n + 2} ints, got {output_size!r}{where()}")
      out_size = tuple(int(s) for s in size[len(size) - n:])
    if any(s <= 0 for s in out_size): raise TensorValueError(f"{op}: output size {fmt(out_size)} is empty{where()}")
    plane, count = prod(out_size), prod(spatial)
    targets = self.arange(plane, device=self.device)
    hits = indices.reshape(batch, channels, count, 1) == targets                    # (N, C, count, plane)
    total = hits.where(self.reshape(batch, channels, count, 1), 0).sum(2)
    # Overlapping pooling windows can pick one element twice: its copies hold the same value, which PyTorch writes
    # once yet sends the full gradient to each copy. Divide the forward by the copy count and keep the sum's gradient.
    copies = hits.sum(2)
    out = (copies > 1).where(total - (total - total / copies.maximum(1)).detach(), total)
    return out.cast(self.dtype).reshape(batch, channels, *out_size)

  # ---------------- resampling ----------------
  def interpolate(self, size: tuple[int, ...], mode: str = "linear", align_corners: bool = False) -> Tensor:
    """Resize the trailing len(size) axes to `size` (any leading dims are kept), as torch.nn.functional.interpolate.

    `mode` is "nearest" (source index floor(i*in/out)), "nearest-exact" (half-pixel centres), or "linear" (with
    "bilinear"/"trilinear" as names for 2 and 3 axes): separable linear interpolation, with `align_corners` as in
    PyTorch.

    >>> Tensor([[1.0, 2.0]]).interpolate((4,), mode="linear").tolist()
    [[1.0, 1.25, 1.75, 2.0]]
    >>> Tensor([[1, 2]]).interpolate((4,), mode="nearest").tolist()
    [[1, 1, 2, 2]]
    """
    op = "interpolate"
    if not isinstance(size, (tuple, list)) or not size or not all(_is_int(s) and s > 0 for s in size):
      raise TensorValueError(f"{op}: size must be a non-empty sequence of positive ints, got {size!r}{where()}")
    if len(size) > self.ndim:
      raise TensorValueError(f"{op}: size {fmt(size)} has more axes than the input {fmt(self.shape)}{where()}")
    modes = {"nearest": None, "nearest-exact": None, "linear": None, "bilinear": 2, "trilinear": 3}
    if mode not in modes: raise UnsupportedError(f"{op}: mode must be one of {', '.join(modes)}, got {mode!r}{where()}")
    if modes[mode] is not None and len(size) != modes[mode]:
      raise TensorValueError(f"{op}: mode {mode!r} resizes {modes[mode]} axes, but size {fmt(size)} has {len(size)}{where()}")
    linear = mode in ("linear", "bilinear", "trilinear")
    if align_corners and not linear:
      raise TensorValueError(f"{op}: align_corners only applies to the linear modes, not {mode!r}{where()}")
    x = self.cast(dtypes.default_float) if linear and not dtypes.is_float(self.dtype) else self
    for axis in range(self.ndim - len(size), self.ndim):
      n_in, n_out = self.shape[axis], int(size[axis - self.ndim + len(size)])
      if n_in == n_out: continue   # every mode maps an axis of unchanged size to itself
      if linear: x = x._resample_axis(axis, _linear_weights(n_in, n_out, align_corners))
      else: x = x._resample_axis(axis, _nearest_onehot(n_in, n_out, mode == "nearest"))
    return x.cast(self.dtype)

  def _resample_axis(self, axis: int, matrix: np.ndarray) -> Tensor:
    """Each output position along `axis` is a fixed combination of input positions: matrix is (n_out, n_in)."""
    n_out, n_in = matrix.shape
    rest = self.ndim - axis - 1
    x = self.reshape(*self.shape[:axis], 1, n_in, *self.shape[axis + 1:])
    if matrix.dtype == np.bool_:   # nearest: select rather than multiply, so inf/nan elsewhere don't leak in
      pick = type(self)(matrix.reshape(n_out, n_in, *[1] * rest), device=self.device)
      return pick.where(x, 0).sum(axis + 1).cast(self.dtype)
    weights = type(self)(matrix.reshape(n_out, n_in, *[1] * rest), device=self.device, dtype=self.dtype)
    return (x * weights).sum(axis + 1)

def _nearest_onehot(n_in: int, n_out: int, floor_mode: bool) -> np.ndarray:
  """(n_out, n_in) bools: the source of each output. Index arithmetic in float32, as PyTorch's CPU kernels do."""
  scale = np.float32(n_in) / np.float32(n_out)
  dst = np.arange(n_out)
  if floor_mode: src = np.floor(dst.astype(np.float32) * scale)
  else: src = np.floor(((dst + 0.5) * np.float64(scale)).astype(np.float32))
  src = np.minimum(src.astype(np.int64), n_in - 1)
  return src[:, None] == np.arange(n_in)[None, :]

def _linear_weights(n_in: int, n_out: int, align_corners: bool) -> np.ndarray:
  """(n_out, n_in) weights of 1-d linear interpolation, with PyTorch's source-index rule."""
  dst = np.arange(n_out, dtype=np.float64)
  if align_corners: src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
  else: src = np.maximum((dst + 0.5) * (n_in / n_out) - 0.5, 0.0)
  low = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
  high = np.minimum(low + 1, n_in - 1)
  frac = np.clip(src - low, 0.0, 1.0)
  matrix = np.zeros((n_out, n_in), np.float64)
  np.add.at(matrix, (np.arange(n_out), low), 1 - frac)
  np.add.at(matrix, (np.arange(n_out), high), frac)
  return matrix
