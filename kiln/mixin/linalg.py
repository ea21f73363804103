"""Linear algebra decompositions built from tensor ops: qr and svd."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

class LinalgMixin:
  __slots__ = ()
