"""Bytes and bits: bitcast between dtypes, keccak (SHA3/SHAKE) and a tree hash."""
from __future__ import annotations
from typing import TYPE_CHECKING
from kiln.dtype import DType
from kiln.uop.ops import UOp, Ops
from kiln.mixin.common import where, dtype_arg
if TYPE_CHECKING: from kiln.tensor import Tensor

class BytesMixin:
  __slots__ = ()
  def bitcast(self, dtype: DType | str) -> Tensor:
    """The same bits read as `dtype` (same item size)."""
    dtype = dtype_arg(dtype, "bitcast")
    if dtype.itemsize != self.dtype.itemsize:
      raise ValueError(f"bitcast: {self.dtype} and {dtype} differ in size{where()}")
    return self._wrap(UOp(Ops.BITCAST, dtype, (self.uop,)), "bitcast")
