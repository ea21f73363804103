"""Creation beyond the core constructors: random integers and permutations, sampling, tensors over existing memory."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

class CreationMixin:
  __slots__ = ()
