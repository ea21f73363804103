"""A tiny vectorized NumPy evaluator of scalar uop graphs with kiln's C semantics, for dense sweeps of rewrite rules.

`evaluate(root, {leaf: array})` computes `root` for every element of the input arrays at once: floats round per op in
their own dtype (NumPy float ops are IEEE, no FMA), integers wrap, IDIV/MOD truncate toward zero (0 for a zero
divisor), BITCAST reinterprets bits, MAX propagates NaN, comparisons give bool.
"""
from __future__ import annotations
import numpy as np
from kiln.dtype import dtypes, to_numpy_dtype
from kiln.uop.ops import UOp, Ops, toposort

def _c_idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  a, b = np.broadcast_arrays(a, b)
  safe = np.where(b == 0, 1, b)
  q = np.abs(a.astype(np.int64) if a.dtype.itemsize < 8 else a) // np.abs(safe)
  q = np.where((a < 0) != (safe < 0), -q, q)
  return np.where(b == 0, 0, q).astype(a.dtype)

def _c_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return (a - _c_idiv(a, b) * b).astype(a.dtype) if a.dtype.kind in "iu" else np.fmod(a, b)

def _cast(x: np.ndarray, dtype) -> np.ndarray:
  if dtype == np.bool_: return x != 0
  return np.asarray(x).astype(dtype)

BINARY = {
  Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.divide, Ops.IDIV: _c_idiv, Ops.MOD: _c_mod,
  Ops.MAX: np.maximum, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal, Ops.AND: np.bitwise_and,
  Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.SHL: np.left_shift, Ops.SHR: np.right_shift, Ops.POW: np.power}
UNARY = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.RECIP: np.reciprocal,
         Ops.NEG: np.negative, Ops.TRUNC: np.trunc}

def evaluate(root: UOp, inputs: dict[UOp, np.ndarray]) -> np.ndarray:
  """The value of `root` for every element of the arrays bound to its leaves (DEFINE_VAR/DEFINE_GLOBAL/LOAD nodes)."""
  values: dict[UOp, np.ndarray] = {}
  with np.errstate(all="ignore"):
    for u in toposort([root], stop=lambda n: n in inputs):
      if u in inputs: values[u] = np.asarray(inputs[u], dtype=to_numpy_dtype(u.dtype)); continue
      src = [values[s] for s in u.src]
      npdt = to_numpy_dtype(u.dtype) if u.dtype != dtypes.void else None
      if u.op is Ops.CONST: out = np.array(u.arg, dtype=npdt)
      elif u.op is Ops.CAST: out = _cast(src[0], npdt)
      elif u.op is Ops.BITCAST: out = np.ascontiguousarray(src[0]).view(npdt)
      elif u.op is Ops.WHERE: out = np.where(src[0], src[1], src[2])
      elif u.op in BINARY:
        a, b = src
        if u.op in (Ops.SHL, Ops.SHR): b = b.astype(a.dtype)
        out = BINARY[u.op](a, b)
      elif u.op in UNARY: out = UNARY[u.op](src[0])
      else: raise NotImplementedError(f"uop_numpy_eval: cannot evaluate {u.op}")
      if npdt is not None and u.op not in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ): out = np.asarray(out).astype(npdt, copy=False)
      values[u] = np.asarray(out)
  return values[root]
