"""Division and modulo by constants as multiply-shift (kiln/codegen/divmod.py): exact for every input, vs Python."""
from __future__ import annotations
import os, sys
import numpy as np
import pytest
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from uop_numpy_eval import evaluate  # noqa: E402
from kiln import Tensor  # noqa: E402
from kiln.dtype import dtypes, DType  # noqa: E402
from kiln.helpers import Context  # noqa: E402
from kiln.uop.ops import UOp, Ops, toposort  # noqa: E402
from kiln.uop.pattern import graph_rewrite  # noqa: E402
from kiln.codegen.divmod import fast_division, magic_for  # noqa: E402

DIVISORS = [2, 3, 5, 6, 7, 10, 12, 25, 60, 100, 127, 128, 255, 641, 1000, 4096, 65535, 65537, 1 << 20, 999_999_937,
            (1 << 31) - 1, -3, -7, -64, -1000]

def python_truncating(x: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
  """C quotient and remainder (truncation toward zero) computed with Python integers."""
  q = np.array([abs(int(v)) // abs(d) * (1 if (v < 0) == (d < 0) else -1) for v in x.tolist()], dtype=object)
  return q, np.array([int(v) for v in x.tolist()], dtype=object) - q * d

def rewritten(op: Ops, dtype: DType, d: int, lo: int, hi: int) -> tuple[UOp, UOp]:
  leaf = UOp.variable("x", lo, hi, dtype)
  graph = graph_rewrite(UOp(op, dtype, (leaf, UOp.const(dtype, d))), fast_division)
  return leaf, graph

def check(dtype: DType, xs: np.ndarray, lo: int, hi: int) -> None:
  for d in DIVISORS:
    if dtypes.is_unsigned(dtype) and d < 0: continue
    if not dtypes.min(dtype) <= d <= dtypes.max(dtype): continue
    q_ref, r_ref = python_truncating(xs, d)
    for op, ref in ((Ops.IDIV, q_ref), (Ops.MOD, r_ref)):
      leaf, graph = rewritten(op, dtype, d, lo, hi)
      if dtype.itemsize < 8:
        assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in toposort([graph])), f"{op.name} {dtype} // {d} kept"
      got = evaluate(graph, {leaf: xs}).astype(object)
      bad = np.nonzero(got != ref)[0]
      assert len(bad) == 0, f"{dtype} {op.name} by {d}: x={xs[bad[0]]} gives {got[bad[0]]}, expected {ref[bad[0]]}"

def test_int16_and_uint16_exhaustive():
  check(dtypes.int16, np.arange(-32768, 32768, dtype=np.int16), -32768, 32767)
  check(dtypes.uint16, np.arange(0, 65536, dtype=np.uint16), 0, 65535)

def test_int32_on_the_int16_range_exhaustive():
  check(dtypes.int32, np.arange(-32768, 32768, dtype=np.int32), -32768, 32767)

def edge_values(dtype: DType, n: int, seed: int) -> np.ndarray:
  lo, hi = dtypes.min(dtype), dtypes.max(dtype)
  rng = np.random.default_rng(seed)
  edges = [lo, lo + 1, -1, 0, 1, hi - 1, hi] + [v for d in DIVISORS for v in (d - 1, d, d + 1, -d, hi - abs(d))]
  edges = [v for v in edges if lo <= v <= hi]
  return np.concatenate([np.array(edges), rng.integers(lo, hi, n, endpoint=True)]).astype(dtype.fmt)

@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32], ids=str)
def test_32_bit_random(dtype):
  check(dtype, edge_values(dtype, 1 << 14, 5), dtypes.min(dtype), dtypes.max(dtype))

def test_int64_with_a_small_range_is_rewritten_and_exact():
  xs = np.random.default_rng(6).integers(-(1 << 31), 1 << 31, 1 << 14).astype(np.int64)
  check(dtypes.int64, np.concatenate([xs, [-(1 << 31), (1 << 31) - 1, 0]]).astype(np.int64), -(1 << 31), (1 << 31) - 1)

def test_full_range_int64_is_left_alone():
  _, graph = rewritten(Ops.IDIV, dtypes.int64, 7, dtypes.min(dtypes.int64), dtypes.max(dtypes.int64))
  assert graph.op is Ops.IDIV

def test_magic_numbers_are_exact_at_the_bound():
  for d in (3, 7, 641, 1000, (1 << 31) - 1):
    m, s = magic_for(d, 1 << 32)
    for n in (0, d - 1, d, (1 << 32) - 1, 1 << 32, (1 << 32) - ((1 << 32) % d) - 1): assert (n * m) >> s == n // d
  with pytest.raises(ValueError): magic_for(0, 10)

def test_end_to_end_cpu_division_by_constants():
  xs = edge_values(dtypes.int32, 2000, 7)
  with Context(TRANSCENDENTAL=2):
    got_q, got_r = (Tensor(xs, device="CPU") // 7).numpy(), (Tensor(xs, device="CPU") % -10).numpy()
  # Tensor // and % follow Python (floor) semantics on top of the C ops
  assert (got_q == xs.astype(np.int64) // 7).all() and (got_r == xs.astype(np.int64) % -10).all()
