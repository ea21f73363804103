"""nn functional ops on Tensor: einsum, normalization, attention, dropout, one_hot and the losses."""
from __future__ import annotations
import math, string
from typing import TYPE_CHECKING, Sequence
from kiln.dtype import DType, dtypes, least_upper_dtype
from kiln.mixin.common import UnsupportedError, TensorValueError, where, fmt, dtype_arg
if TYPE_CHECKING: from kiln.tensor import Tensor

REDUCTIONS = ("none", "sum", "mean")

class NNMixin:
  __slots__ = ()

  # ---------------- einsum ----------------
  @staticmethod
  def einsum(formula: str, *operands: Tensor | Sequence[Tensor], dtype: DType | str | None = None) -> Tensor:
    """Sum of products of the operands' elements as written in Einstein notation, like torch.einsum.

    Supports implicit output (letters used once, sorted), explicit `->` output, repeated letters within an operand
    (diagonals, traces), `...` for broadcast batch axes, and size-1 axes broadcasting against a letter's size.
    `dtype` is the accumulation and result dtype of the sum.

    >>> a, b = Tensor([[1, 2], [3, 4]]), Tensor([[5, 6], [7, 8]])
    >>> Tensor.einsum("ij,jk->ik", a, b).tolist()
    [[19, 22], [43, 50]]
    >>> Tensor.einsum("ii", a).item()
    5
    """
    from kiln.tensor import Tensor
    xs = tuple(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else tuple(operands)
    for i, x in enumerate(xs):
      if not isinstance(x, Tensor):
        raise TypeError(f"einsum: operand {i} is a {type(x).__name__}, not a Tensor{where()}")
    acc = dtype_arg(dtype, "einsum") if dtype is not None else None
    spec = formula.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    if "->" in rhs: raise TensorValueError(f"einsum: formula {formula!r} has more than one '->'{where()}")
    in_specs = lhs.split(",")
    if len(in_specs) != len(xs):
      raise TensorValueError(f"einsum: formula {formula!r} names {len(in_specs)} operand(s) but {len(xs)} were "
                             f"given{where()}")
    # each operand's axes as labels: letters, and "...k" for the k-th of the shared broadcast (ellipsis) axes
    n_ellipsis = max([_ellipsis_ndim(s, x, i, formula) for i, (s, x) in enumerate(zip(in_specs, xs))], default=0)
    ellipsis_labels = [f"...{k}" for k in range(n_ellipsis)]
    labelled = [_operand_labels(s, x, n_ellipsis) for s, x in zip(in_specs, xs)]
    # repeated letters within an operand keep only the diagonal
    diagonalized = []
    for i, (x, labels) in enumerate(zip(xs, labelled)):
      for label in [l for l in dict.fromkeys(labels) if labels.count(l) > 1]:
        while labels.count(label) > 1:
          a, b = [k for k, l in enumerate(labels) if l == label][:2]
          if x.shape[a] != x.shape[b]:
            raise TensorValueError(f"einsum: subscript {label!r} is repeated in operand {i} {fmt(x.shape)} over axes of "
                                   f"sizes {x.shape[a]} and {x.shape[b]}{where()}")
          x, labels = _diagonal(x, a, b), [l for k, l in enumerate(labels) if k not in (a, b)] + [label]
      diagonalized.append((x, labels))
    # every letter has one size; size 1 broadcasts
    sizes: dict[str, tuple[int, int]] = {}   # label -> (size, operand it came from)
    for i, (x, labels) in enumerate(diagonalized):
      for label, size in zip(labels, x.shape):
        seen = sizes.get(label)
        if seen is None or seen[0] == 1: sizes[label] = (size, i)
        elif size != 1 and size != seen[0]:
          what = "the broadcast axes '...'" if label.startswith("...") else f"subscript {label!r}"
          raise TensorValueError(f"einsum: {what} has size {seen[0]} in operand {seen[1]} {fmt(xs[seen[1]].shape)} but "
                                 f"{size} in operand {i} {fmt(xs[i].shape)}{where()}")
    if arrow:
      if rhs.count("...") > 1 or "." in rhs.replace("...", ""):
        raise TensorValueError(f"einsum: malformed output subscripts {rhs!r} in {formula!r}{where()}")
      out_labels: list[str] = []
      for part_index, part in enumerate(rhs.split("...")):
        if part_index: out_labels += ellipsis_labels
        for c in part:
          if c not in string.ascii_letters: raise TensorValueError(f"einsum: invalid subscript {c!r} in {formula!r}{where()}")
          if c not in sizes: raise TensorValueError(f"einsum: output subscript {c!r} does not appear in any operand{where()}")
          if c in out_labels: raise TensorValueError(f"einsum: output subscript {c!r} appears more than once{where()}")
          out_labels.append(c)
    else:
      # implicit output: the broadcast axes, then the letters used exactly once, in alphabetical order
      letters = [l for labels in labelled for l in labels if not l.startswith("...")]
      out_labels = ellipsis_labels + sorted(l for l in set(letters) if letters.count(l) == 1)
    contracted = [l for l in sizes if l not in out_labels]
    order = out_labels + contracted
    full_shape = tuple(sizes[l][0] for l in order)
    product = None
    for x, labels in diagonalized:
      present = [l for l in order if l in labels]
      aligned = [x.shape[labels.index(l)] if l in labels else 1 for l in order]
      x = x.permute([labels.index(l) for l in present]).reshape(aligned)
      product = x if product is None else product * x
    product = product._broadcast_to(full_shape) if product.shape != full_shape else product
    if contracted: return product.sum(tuple(range(len(out_labels), len(order))), dtype=acc)
    return product.cast(acc) if acc is not None else product

  # ---------------- normalization ----------------
  def layernorm(self, axis: int | tuple[int, ...] = -1, eps: float = 1e-5) -> Tensor:
    """Normalize to zero mean and unit variance over `axis` (no affine weights), as in layer normalization.

    >>> [round(v, 4) for v in Tensor([1.0, 2.0, 3.0]).layernorm().tolist()]
    [-1.2247, 0.0, 1.2247]
    """
    def normalize(x: Tensor) -> Tensor:
      centered = x - x.mean(axis, keepdim=True)
      return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()
    # half statistics overflow (the square of 858 is past 65504): PyTorch keeps them in float32
    return self._in_float32_if_reduced(normalize)

  def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                axis: int | tuple[int, ...] = 1) -> Tensor:
    """(x - mean) * weight * invstd + bias, with the parameters laid along `axis` (the channel axis by default).

    `mean`, `invstd`, `weight` and `bias` have one entry per position of the `axis` axes; `invstd` may also be a
    tensor that broadcasts against this one (or a 0-d scalar).

    >>> x = Tensor([[1.0, 10.0], [3.0, 30.0]])
    >>> x.batchnorm(None, None, Tensor([2.0, 20.0]), Tensor([1.0, 0.1])).tolist()
    [[-1.0, -1.0], [1.0, 1.0]]
    """
    axes = tuple(self._axis(a, "batchnorm") for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    param_shape = tuple(self.shape[a] for a in axes)
    shape = tuple(s if a in axes else 1 for a, s in enumerate(self.shape))
    def laid_out(t: Tensor, name: str) -> Tensor:
      if t.numel() != math.prod(param_shape):
        raise TensorValueError(f"batchnorm: {name} of shape {fmt(t.shape)} does not match the {fmt(param_shape)} entries of "
                               f"axis {axis} of the input {fmt(self.shape)}{where()}")
      return t.reshape(shape)
    x = self - laid_out(mean, "mean")
    if weight is not None: x = x * laid_out(weight, "weight")
    x = x * (laid_out(invstd, "invstd") if invstd.ndim == len(axes) else invstd)
    return x + laid_out(bias, "bias") if bias is not None else x

  # ---------------- dropout, one_hot ----------------
  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero each element with probability `p` and scale the rest by 1/(1-p), only while Tensor.training.

    >>> x = Tensor.ones(4)
    >>> x.dropout(0.5) is x   # not training: the identity
    True
    """
    if not isinstance(p, (int, float)) or not 0 <= p <= 1:
      raise TensorValueError(f"dropout: p={p!r} is not in [0, 1]{where()}")
    if not self.training or p == 0: return self
    if p == 1: return self.zeros_like()
    keep = self.rand_like(dtype=dtypes.default_float) >= p   # (on several devices: each draws its own slice)
    return keep.where(self, 0) * (1 / (1 - p))

  def one_hot(self, num_classes: int = -1) -> Tensor:
    """A new last axis of `num_classes` entries, 1 at each value's position and 0 elsewhere (int32, as tinygrad).

    With `num_classes=-1` the count is inferred as max + 1, which realizes this tensor (and checks that no value is
    negative). With an explicit count, a value outside [0, num_classes) gives a row of zeros (it is not checked).

    >>> Tensor([0, 2, 1]).one_hot(3).tolist()
    [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    """
    if not dtypes.is_int(self.dtype):
      raise UnsupportedError(f"one_hot: needs an int tensor of class indices, got {self.dtype}{where()}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < -1:
      raise TensorValueError(f"one_hot: num_classes must be -1 or a non-negative int, got {num_classes!r}{where()}")
    if num_classes == -1:
      if self.numel() == 0: raise TensorValueError(f"one_hot: cannot infer num_classes from an empty tensor{where()}")
      low, high = self.min(), self.max()
      low.realize(high)
      if low.item() < 0: raise TensorValueError(f"one_hot: class values must be non-negative, got {low.item()}{where()}")
      num_classes = int(high.item()) + 1
    classes = self.arange(num_classes, device=self.device)
    return (self.unsqueeze(-1) == classes).where(1, 0)

  # ---------------- attention ----------------
  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                   dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
    """softmax(query @ key^T / sqrt(D) + mask) @ value, with `self` as the query (..., L, D).

    `key` is (..., S, D) and `value` (..., S, Dv). A bool `attn_mask` marks the positions that may be attended to; a
    float one is added to the scores. `is_causal` lets position i attend to positions <= i. `dropout_p` drops
    attention weights only while Tensor.training (as tinygrad). `enable_gqa` repeats the key/value heads (axis -3)
    to match the query's heads.

    >>> q = k = v = Tensor.ones(1, 2, 3)
    >>> q.scaled_dot_product_attention(k, v).shape
    (1, 2, 3)
    """
    query = self
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
      raise TensorValueError(f"scaled_dot_product_attention: query, key and value need at least 2 dims, got "
                             f"{fmt(query.shape)}, {fmt(key.shape)}, {fmt(value.shape)}{where()}")
    if query.shape[-1] != key.shape[-1]:
      raise TensorValueError(f"scaled_dot_product_attention: query {fmt(query.shape)} and key {fmt(key.shape)} differ in "
                             f"their last (embedding) dim{where()}")
    if key.shape[-2] != value.shape[-2]:
      raise TensorValueError(f"scaled_dot_product_attention: key {fmt(key.shape)} and value {fmt(value.shape)} differ in "
                             f"their sequence length (dim -2){where()}")
    if is_causal and attn_mask is not None:
      raise TensorValueError(f"scaled_dot_product_attention: give either attn_mask or is_causal=True, not both{where()}")
    if enable_gqa:
      key, value = _repeat_heads(key, query, "key"), _repeat_heads(value, query, "value")
    # the scores and softmax run in at least float32 so half-precision attention keeps its accuracy
    score_dtype = least_upper_dtype(query.dtype, key.dtype, dtypes.float32)
    scores = (query.cast(score_dtype) @ key.cast(score_dtype).transpose(-2, -1)) * (1 / math.sqrt(query.shape[-1]))
    length, source = scores.shape[-2], scores.shape[-1]
    if is_causal:
      attn_mask = self.arange(length, device=self.device).reshape(length, 1) >= self.arange(source, device=self.device)
    if attn_mask is not None:
      bias = attn_mask.where(0.0, -math.inf) if attn_mask.dtype == dtypes.bool else attn_mask.cast(score_dtype)
      scores = scores + bias
    weights = scores.softmax(-1).cast(query.dtype).dropout(dropout_p)
    return weights @ value.cast(query.dtype) if value.dtype != weights.dtype else weights @ value

  # ---------------- losses ----------------
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of probabilities `self` against targets `Y` (logs clamped at -100, as in PyTorch).

    >>> round(Tensor([0.9, 0.2]).binary_crossentropy(Tensor([1.0, 0.0])).item(), 4)
    0.1643
    """
    _check_reduction(reduction, "binary_crossentropy")
    _check_same_shape(self, Y, "binary_crossentropy")
    loss = -(Y * self.log().maximum(-100) + (1 - Y) * (1 - self).log().maximum(-100))
    return _reduce_loss(loss, reduction)

  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """Binary cross-entropy of logits `self` against targets `Y`, stable for large logits.

    `pos_weight` (broadcast against the last axis) weighs the positive term, as in torch's BCEWithLogitsLoss.

    >>> round(Tensor([100.0, -100.0]).binary_crossentropy_logits(Tensor([1.0, 0.0])).item(), 4)
    0.0
    """
    _check_reduction(reduction, "binary_crossentropy_logits")
    _check_same_shape(self, Y, "binary_crossentropy_logits")
    # -log(sigmoid(-x)) = max(x, 0) + log(1 + exp(-|x|)): never exponentiates a large positive number
    softplus_neg = (-self).maximum(0) + (1 + (-self.abs()).exp()).log()   # -log(sigmoid(x))
    if pos_weight is None: loss = (1 - Y) * self + softplus_neg
    else: loss = (1 - Y) * self + (1 + (pos_weight - 1) * Y) * softplus_neg
    return _reduce_loss(loss, reduction)

  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits `self` (..., C) against int class labels `Y` (...), the class axis last (as tinygrad).

    Labels equal to `ignore_index` add no loss and are left out of the mean. `label_smoothing` mixes the one-hot
    target with the uniform distribution, as in torch's cross_entropy.

    >>> round(Tensor([[2.0, 0.0], [0.0, 2.0]]).sparse_categorical_crossentropy(Tensor([0, 1])).item(), 4)
    0.1269
    """
    _check_reduction(reduction, "sparse_categorical_crossentropy")
    _check_smoothing(label_smoothing, "sparse_categorical_crossentropy")
    if self.ndim < 1 or Y.shape != self.shape[:-1]:
      raise TensorValueError(f"sparse_categorical_crossentropy: labels {fmt(Y.shape)} must have the shape of the logits "
                             f"{fmt(self.shape)} without the last (class) axis{where()}")
    keep = Y != ignore_index
    loss = _class_index_loss(self.log_softmax(-1), Y, self.ndim - 1, label_smoothing)
    loss = keep.where(loss, 0)
    if reduction == "mean": return loss.sum() / keep.sum()
    return loss.sum() if reduction == "sum" else loss

  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of logits `self` against class indices or class probabilities `Y`, like torch's cross_entropy.

    The class axis is 1 for inputs (N, C, d1, ...) and 0 for a 1-d input (C,). Index targets have the input's shape
    without the class axis; probability targets have the input's shape.

    >>> round(Tensor([[2.0, 0.0], [0.0, 2.0]]).cross_entropy(Tensor([0, 1])).item(), 4)
    0.1269
    """
    _check_reduction(reduction, "cross_entropy")
    _check_smoothing(label_smoothing, "cross_entropy")
    if self.ndim == 0: raise TensorValueError(f"cross_entropy: input must have a class axis, got a 0-d tensor{where()}")
    class_axis = 0 if self.ndim == 1 else 1
    classes = self.shape[class_axis]
    log_probs = self.log_softmax(class_axis)
    if Y.shape == self.shape:
      if not dtypes.is_float(Y.dtype):
        raise UnsupportedError(f"cross_entropy: probability targets must be floats, got {Y.dtype}{where()}")
      target = Y * (1 - label_smoothing) + label_smoothing / classes if label_smoothing else Y
      loss = -(log_probs * target).sum(class_axis)
    elif Y.shape == self.shape[:class_axis] + self.shape[class_axis + 1:]:
      if not dtypes.is_int(Y.dtype):
        raise UnsupportedError(f"cross_entropy: class-index targets must be ints, got {Y.dtype}{where()}")
      loss = _class_index_loss(log_probs, Y, class_axis, label_smoothing)
    else:
      raise TensorValueError(f"cross_entropy: target {fmt(Y.shape)} must be the input's shape {fmt(self.shape)} "
                             f"(probabilities) or that shape without the class axis {class_axis} (class indices){where()}")
    return _reduce_loss(loss, reduction)

  def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
               reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities `self` (N, C, d1, ...) or (C,) at the int class labels `Y`.

    `weight` (C,) weighs each class; "mean" divides by the summed weights of the counted labels, as in PyTorch.
    Labels equal to `ignore_index` count for nothing.

    >>> Tensor([[-1.0, -2.0], [-3.0, -0.5]]).nll_loss(Tensor([0, 1])).item()
    0.75
    """
    _check_reduction(reduction, "nll_loss")
    if self.ndim == 0: raise TensorValueError(f"nll_loss: input must have a class axis, got a 0-d tensor{where()}")
    class_axis = 0 if self.ndim == 1 else 1
    classes = self.shape[class_axis]
    if Y.shape != self.shape[:class_axis] + self.shape[class_axis + 1:]:
      raise TensorValueError(f"nll_loss: target {fmt(Y.shape)} must be the input's shape {fmt(self.shape)} without the "
                             f"class axis {class_axis}{where()}")
    if not dtypes.is_int(Y.dtype):
      raise UnsupportedError(f"nll_loss: targets must be int class indices, got {Y.dtype}{where()}")
    if weight is not None and weight.shape != (classes,):
      raise TensorValueError(f"nll_loss: weight {fmt(weight.shape)} must have one entry per class ({classes},){where()}")
    hit = _class_mask(Y, classes, class_axis)
    loss = -hit.where(self, 0).sum(class_axis)
    per_class = weight.reshape((classes,) + (1,) * (self.ndim - class_axis - 1)) if weight is not None else None
    if per_class is None: sample_weight = Y.full_like(1.0, dtype=self.dtype)
    else: sample_weight = hit.where(per_class, 0).sum(class_axis)
    if ignore_index is not None: sample_weight = (Y != ignore_index).where(sample_weight, 0)
    loss = loss * sample_weight
    if reduction == "mean": return loss.sum() / sample_weight.sum()
    return loss.sum() if reduction == "sum" else loss

# ---------------- helpers ----------------
def _ellipsis_ndim(spec: str, x: Tensor, index: int, formula: str) -> int:
  """How many axes of operand `index` the '...' in its subscripts stands for (0 without one); checks the subscripts."""
  letters = spec.replace("...", "")
  if spec.count("...") > 1 or "." in letters:
    raise TensorValueError(f"einsum: malformed subscripts {spec!r} in {formula!r}{where()}")
  for c in letters:
    if c not in string.ascii_letters: raise TensorValueError(f"einsum: invalid subscript {c!r} in {formula!r}{where()}")
  if "..." in spec:
    if len(letters) > x.ndim:
      raise TensorValueError(f"einsum: operand {index} {fmt(x.shape)} has {x.ndim} dims but subscripts {spec!r} name "
                             f"{len(letters)} and '...'{where()}")
    return x.ndim - len(letters)
  if len(letters) != x.ndim:
    raise TensorValueError(f"einsum: operand {index} {fmt(x.shape)} has {x.ndim} dims but subscripts {spec!r} name "
                           f"{len(letters)}{where()}")
  return 0

def _operand_labels(spec: str, x: Tensor, n_ellipsis: int) -> list[str]:
  """One label per axis of `x`: its letter, or '...k' for an ellipsis axis (right-aligned, as in broadcasting)."""
  before, _, after = spec.partition("...")
  if "..." not in spec: return list(spec)
  count = x.ndim - len(before) - len(after)
  return list(before) + [f"...{k}" for k in range(n_ellipsis - count, n_ellipsis)] + list(after)

def _diagonal(x: Tensor, a: int, b: int) -> Tensor:
  """x with axes a and b (equal size n) replaced by their diagonal as a new last axis, using only views."""
  n = x.shape[a]
  rest = [k for k in range(x.ndim) if k not in (a, b)]
  moved = x.permute(rest + [a, b]).reshape(*[x.shape[k] for k in rest], n * n)
  # rows of length n+1 over the flattened n*n block start at (i, i): their first entries are the diagonal
  padded = moved.pad(tuple((0, 0) for _ in rest) + ((0, n),))
  rows = padded.reshape(*[x.shape[k] for k in rest], n, n + 1)
  return rows.shrink(tuple((0, s) for s in rows.shape[:-1]) + ((0, 1),)).reshape(*[x.shape[k] for k in rest], n)

def _repeat_heads(t: Tensor, query: Tensor, name: str) -> Tensor:
  """`t` (..., Hkv, S, D) with each head repeated to the query's head count (axis -3), for grouped-query attention."""
  if t.ndim < 3 or query.ndim < 3:
    raise TensorValueError(f"scaled_dot_product_attention: enable_gqa needs (..., heads, L, D) tensors, got query "
                           f"{fmt(query.shape)} and {name} {fmt(t.shape)}{where()}")
  heads, kv_heads = query.shape[-3], t.shape[-3]
  if kv_heads == 0 or heads % kv_heads:
    raise TensorValueError(f"scaled_dot_product_attention: query heads {heads} are not a multiple of {name} heads "
                           f"{kv_heads}{where()}")
  grouped = t.unsqueeze(-3).expand(*t.shape[:-2], heads // kv_heads, *t.shape[-2:])
  return grouped.reshape(*t.shape[:-3], heads, *t.shape[-2:])

def _class_mask(Y: Tensor, classes: int, class_axis: int) -> Tensor:
  """A bool tensor, true where the class axis (inserted into Y at `class_axis`) equals Y's label."""
  ids = Y.arange(classes, device=Y.device).reshape((classes,) + (1,) * (Y.ndim - class_axis))
  return Y.unsqueeze(class_axis) == ids

def _class_index_loss(log_probs: Tensor, Y: Tensor, class_axis: int, label_smoothing: float) -> Tensor:
  """Per-sample -(1-s)*log_p[label] - s*mean(log_p) for label smoothing s (unreduced, nothing ignored)."""
  picked = _class_mask(Y, log_probs.shape[class_axis], class_axis).where(log_probs, 0).sum(class_axis)
  if not label_smoothing: return -picked
  return -(picked * (1 - label_smoothing) + log_probs.mean(class_axis) * label_smoothing)

def _check_reduction(reduction: str, op: str) -> None:
  if reduction not in REDUCTIONS:
    raise TensorValueError(f"{op}: unknown reduction {reduction!r}; expected one of 'none', 'sum', 'mean'{where()}")

def _check_smoothing(label_smoothing: float, op: str) -> None:
  if not 0.0 <= label_smoothing <= 1.0:
    raise TensorValueError(f"{op}: label_smoothing={label_smoothing} is not in [0, 1]{where()}")

def _check_same_shape(x: Tensor, Y: Tensor, op: str) -> None:
  if x.shape != Y.shape:
    raise TensorValueError(f"{op}: target {fmt(Y.shape)} must have the input's shape {fmt(x.shape)}{where()}")

def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
  return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
