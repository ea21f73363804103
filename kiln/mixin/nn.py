"""nn functional ops on Tensor: einsum, normalization, attention, dropout, one_hot and the losses."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor

class NNMixin:
  __slots__ = ()
  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of logits `self` (N, C) against integer class labels `Y` (N,)."""
    log_probs = self.log_softmax(-1)
    classes = self.arange(self.shape[-1], device=self.device)
    target = (Y.unsqueeze(-1) == classes)
    keep = (Y != ignore_index).unsqueeze(-1)
    smooth = label_smoothing / self.shape[-1]
    weights = target.where(1.0 - label_smoothing + smooth, smooth) * keep
    return -(log_probs * weights).sum() / keep.sum().maximum(1)
  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy with class-index or probability targets."""
    if Y.ndim == self.ndim - 1: return self.sparse_categorical_crossentropy(Y, label_smoothing=label_smoothing)
    loss = -(self.log_softmax(-1) * Y).sum(-1)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero each element with probability p while training (scaling the rest by 1/(1-p))."""
    if not self.training or p == 0: return self
    keep = self.rand(*self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))
