"""TinyJit: for now a safe pass-through that realizes the function's outputs on every call.

Capture and replay of kernels (with guards that make a replay never silently wrong) come with the JIT issue;
until then every call runs the function eagerly, which is always correct.
"""
from __future__ import annotations
import functools
from typing import Callable, Generic, TypeVar

ReturnType = TypeVar("ReturnType")

class TinyJit(Generic[ReturnType]):
  """Decorate a function whose outputs are Tensors: `@TinyJit def step(x): ...`."""
  def __init__(self, fxn: Callable[..., ReturnType], prune: bool = False):
    self.fxn, self.prune = fxn, prune
    functools.update_wrapper(self, fxn)
  def __get__(self, obj, objtype=None):
    return functools.partial(self.__call__, obj) if obj is not None else self
  def reset(self) -> None:
    """Forget captured kernels (a no-op for now: nothing is captured yet)."""
  def __call__(self, *args, **kwargs) -> ReturnType:
    from kiln.tensor import Tensor
    out = self.fxn(*args, **kwargs)
    results = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [t for t in results if isinstance(t, Tensor)]
    if tensors: Tensor.realize_all(tensors)
    return out
