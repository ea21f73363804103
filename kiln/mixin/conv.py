"""Convolutions, pooling and interpolation, built from movement ops and reductions."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

class ConvMixin:
  __slots__ = ()
