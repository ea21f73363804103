"""How kiln writes exp, cos and tan in the IR, and how later stages recognize those forms.

The Tensor front end has no EXP, COS or TAN op: exp(x) is `EXP2(x * (1/ln2))`, cos(y) in float64 is
`SIN(COS_SHIFT - y)` and tan(y) in float64 is `SIN(y) / SIN(COS_SHIFT - y)`. Software math (kiln/codegen/
transcendental.py) reduces such arguments itself rather than rounding the product or difference, and renderers with
native functions print `exp`, `cos` and `tan` for them. Both stages recognize the forms with the functions here.
"""
from __future__ import annotations
import math
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops

INV_LN2 = 1 / math.log(2)   # exp(x) = EXP2(x * INV_LN2)
COS_SHIFT = math.pi / 2     # cos(y) = SIN(COS_SHIFT - y): pi/2 rounded to float64, the quadrant moved by one
_EXP_DTYPES = (dtypes.float32, dtypes.float64)

def exp_argument(x: UOp) -> UOp | None:
  """a where x is the float32/float64 node a * (1/ln2) (the argument of EXP2 in exp(a) as kiln writes it), else None."""
  if x.op is not Ops.MUL or x.dtype not in _EXP_DTYPES: return None
  a, scale = x.src
  if a.op is Ops.CONST and scale.op is not Ops.CONST: a, scale = scale, a
  return a if scale.op is Ops.CONST and scale.arg == INV_LN2 else None

def cos_argument(x: UOp) -> UOp | None:
  """y where x is the float64 node pi/2 - y (cos(y) as kiln writes it for software math), else None."""
  if x.op is Ops.SUB and x.dtype == dtypes.float64 and x.src[0].op is Ops.CONST and x.src[0].arg == COS_SHIFT:
    return x.src[1]
  return None

def tan_argument(node: UOp) -> UOp | None:
  """y where node is the float64 FDIV(SIN(y), SIN(pi/2 - y)) (tan(y) as kiln writes it for software math), else None."""
  if node.op is not Ops.FDIV or node.dtype != dtypes.float64: return None
  sine, cosine = node.src
  if sine.op is Ops.SIN and cosine.op is Ops.SIN and cos_argument(cosine.src[0]) is sine.src[0]: return sine.src[0]
  return None
