"""Elementwise math and activations beyond the core set (inverse trig, hyperbolic, erf, copysign, ...)."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

class ElementwiseMixin:
  __slots__ = ()
