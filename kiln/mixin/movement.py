"""Movement ops beyond the core views: padding modes, repeats, joins and splits, diagonals."""
from __future__ import annotations
from typing import TYPE_CHECKING
from kiln.mixin.common import where
if TYPE_CHECKING: from kiln.tensor import Tensor

class MovementMixin:
  __slots__ = ()
  def pad(self, padding, mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad with `value`. `padding` is ((before, after), ...) per axis, or flat PyTorch-style (last axis first)."""
    if mode != "constant": raise NotImplementedError(f"pad: mode {mode!r} is not supported yet (only 'constant')")
    padding = tuple(padding)
    if padding and all(isinstance(p, int) for p in padding):
      if len(padding) % 2 or len(padding) // 2 > self.ndim:
        raise ValueError(f"pad: flat padding {padding} needs an even length up to 2*{self.ndim}{where()}")
      pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
      padding = tuple([(0, 0)] * (self.ndim - len(pairs)) + list(reversed(pairs)))
    padding = tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    if len(padding) != self.ndim: raise ValueError(f"pad: {len(padding)} pairs for a {self.ndim}-d tensor{where()}")
    x = self
    if any(b < 0 or a < 0 for b, a in padding):   # negative padding crops
      x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(padding, x.shape)))
      padding = tuple((max(b, 0), max(a, 0)) for b, a in padding)
    out = self._wrap(x.uop.pad(padding), "pad")
    if value == 0: return out
    inside = self._wrap(self.full(x.shape, True, device=x.device).uop.pad(padding), "pad")
    return inside.where(out, value)
