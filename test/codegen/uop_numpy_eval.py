"""A tiny vectorized NumPy evaluator of scalar uop graphs with kiln's C semantics, for dense sweeps of rewrite rules.

`evaluate(root, {leaf: array})` computes `root` for every element of the input arrays at once: floats round per op in
their own dtype (NumPy float ops are IEEE; MULACC is one fused multiply-add), integers wrap, IDIV/MOD truncate toward zero (0 for a zero
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

def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  s = a + b
  t = s - a
  return s, (a - (s - t)) + (b - t)

def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """a*b + c rounded once (MULACC). float32: the product is exact in float64, the sum rounded to odd in float64 (a
  lowest bit set where TwoSum's error is not 0), which then rounds to float32 as the exact value does. float64:
  Dekker's exact product and a TwoSum, the result rounded once but for rare ties (well within an ulp test)."""
  if a.dtype == np.float32:
    p = a.astype(np.float64) * b.astype(np.float64)
    s, e = _two_sum(p, c.astype(np.float64))
    even = (s.view(np.int64) & 1) == 0
    s = np.where(np.isfinite(e) & (e != 0) & even, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)
  def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = 134217729.0 * x
    hi = t - (t - x)
    return hi, x - hi
  p = a * b
  (ah, al), (bh, bl) = split(a), split(b)
  pe = ((ah * bh - p) + ah * bl + al * bh) + al * bl
  s, se = _two_sum(p, c)
  exact = s + (pe + se)
  return np.where(np.isfinite(exact), exact, a * b + c)

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
      elif u.op is Ops.MULACC: out = _fma(*np.broadcast_arrays(*(np.asarray(v, dtype=npdt) for v in src)))
      else: raise NotImplementedError(f"uop_numpy_eval: cannot evaluate {u.op}")
      if npdt is not None and u.op not in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ): out = np.asarray(out).astype(npdt, copy=False)
      values[u] = np.asarray(out)
  return values[root]
