"""Sorting: sort, argsort and topk as data-independent sorting networks of tensor ops."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from kiln.tensor import Tensor  # noqa: F401

class SortMixin:
  __slots__ = ()
