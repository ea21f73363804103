"""Reductions beyond the core set: cumulative ops (cumsum, cumprod, cummax, logcumsumexp) and var_mean/std_mean."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

class ReduceMixin:
  __slots__ = ()
