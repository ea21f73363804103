"""DP4A, the vectorizer's integer dot product of bytes (kiln/codegen/vectorize.py): int32 lanes that each sum 4*m
products of an unsigned and a signed byte become one DP4A, which the C renderer writes as vpdpbusd where GCC has VNNI
and as lane-by-lane sums elsewhere. Both give the bits of the scalar code, on every target; the vectorizer makes it
only when asked (a target with VNNI), and refuses what is not a sum of byte products."""
from __future__ import annotations
import dataclasses, platform
import numpy as np
import pytest
from kiln import Tensor, Device
from kiln.dtype import dtypes
from kiln.helpers import Context
from kiln.engine import realize
from kiln.engine.realize import render_lowered
from kiln.uop.ops import UOp, Ops
from kiln.codegen.vectorize import vectorize
from kiln.codegen.linearizer import linearize
from kiln.codegen.opt import optimize_kernel
from kiln.codegen.lowerer import lower_kernel
from kernel_runs import last_kernel_item

RNG = np.random.default_rng(7)

def _case(rows: int, groups: int, chunks: int, seed: int, blocks: int = 6) -> tuple[np.ndarray, ...]:
  """uint8 a (rows, blocks, chunks, groups, 4), int8 b (blocks, chunks, groups, 4), float32 scales (blocks, groups)."""
  rng = np.random.default_rng(seed)
  return (rng.integers(0, 256, (rows, blocks, chunks, groups, 4), dtype=np.uint8),
          rng.integers(-128, 128, (blocks, chunks, groups, 4), dtype=np.int8),
          rng.standard_normal((blocks, groups)).astype(np.float32))

def _byte_dot(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> Tensor:
  """out[r] = the sum over blocks and groups g of scale * (the sum over chunks c and k < 4 of a[r, ., c, g, k] *
  b[., c, g, k]), the int32 sums written as explicit additions (what kiln/apps/llm/quantized.py builds)."""
  product = Tensor(a).cast(dtypes.int32) * Tensor(b).cast(dtypes.int32)
  sums = product[..., 0] + product[..., 1] + product[..., 2] + product[..., 3]
  dots = sums[:, :, 0]
  for c in range(1, a.shape[2]): dots = dots + sums[:, :, c]
  return (dots.cast(dtypes.float32) * Tensor(scale)).sum((-2, -1))

def _scalar(case: tuple[np.ndarray, ...]) -> np.ndarray:
  with Context(VECTORIZE=0, CACHELEVEL=0): return _byte_dot(*case).numpy()

@pytest.fixture
def vnni_target(monkeypatch):
  """The CPU device's renderer describing its target with VNNI (the compiler flags decide what the code may use)."""
  renderer = Device["CPU"].renderer
  described = renderer.describe_target
  monkeypatch.setattr(renderer, "describe_target",
                      lambda: dataclasses.replace(described(), features=described().features | {"avx_vnni"}))
  realize._runner_cache.clear()
  yield renderer
  realize._runner_cache.clear()

def _source(t: Tensor) -> tuple[str, list[UOp]]:
  item = last_kernel_item(t)
  return render_lowered("CPU", "dot", optimize_kernel(lower_kernel(item.ast), target=Device["CPU"].renderer.target))

@pytest.mark.parametrize("rows,groups,chunks", [(48, 8, 1), (40, 8, 2), (32, 16, 1), (24, 16, 2)])
def test_dp4a_gives_the_bits_of_the_scalar_code(vnni_target, rows, groups, chunks):
  case = _case(rows, groups, chunks, seed=rows + groups + chunks)
  with Context(CACHELEVEL=0): got = _byte_dot(*case).numpy()
  np.testing.assert_array_equal(got, _scalar(case))
  a, b, scale = case[0].astype(np.int64), case[1].astype(np.int64), case[2].astype(np.float64)
  terms = (a * b).sum((2, 4)) * scale
  exact = terms.sum((-2, -1))
  assert any(u.op is Ops.DP4A for u in _source(_byte_dot(*case))[1])
  np.testing.assert_allclose(got, exact, rtol=0, atol=1e-6 * np.abs(terms).sum((-2, -1)).max())

@pytest.mark.parametrize("cflags", ["", "-march=x86-64-v3"])
def test_dp4a_helper_on_every_target(vnni_target, cflags):
  """With VNNI the helper calls vpdpbusd's builtin; compiled for AVX2 (no VNNI) it sums lane by lane: same bits."""
  case = _case(40, 8, 2, seed=5)
  with Context(CFLAGS=cflags, CACHELEVEL=0):
    source, uops = _source(_byte_dot(*case))
    assert any(u.op is Ops.DP4A for u in uops) and "__builtin_ia32_vpdpbusd_v8si" in source
    np.testing.assert_array_equal(_byte_dot(*case).numpy(), _scalar(case))
    # the FLOP count sees the products DP4A does: at least 2 ops for each of the a.size multiply-adds
    assert realize.count_ops(uops) >= 2 * case[0].size

def _nibble_dot(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> Tensor:
  """_byte_dot of a's low nibbles (values below 16: AVX2's pmaddubsw is exact for them)."""
  product = (Tensor(a) & 15).cast(dtypes.int32) * Tensor(b).cast(dtypes.int32)
  sums = product[..., 0] + product[..., 1] + product[..., 2] + product[..., 3]
  return (sums[:, :, 0].cast(dtypes.float32) * Tensor(scale)).sum((-2, -1))

@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 targets")
@pytest.mark.parametrize("march,builtin,groups", [("x86-64-v3", "pmaddubsw256", 8),
                                                  ("skylake-avx512", "pmaddubsw512_mask", 16)])
def test_without_vnni_small_bytes_use_pmaddubsw(march, builtin, groups):
  """Without VNNI (AVX2, AVX-512 before VNNI) only unsigned bytes proven below 128 make a DP4A: pmaddubsw, then
  pmaddwd by ones."""
  case = _case(48, groups, 1, seed=9)
  with Context(VECTORIZE=0, CACHELEVEL=0): want = _nibble_dot(*case).numpy()
  with Context(CFLAGS=f"-march={march}", CACHELEVEL=0):
    assert Device["CPU"].renderer.target.byte_dot_max == 127
    source, uops = _source(_nibble_dot(*case))
    assert any(u.op is Ops.DP4A for u in uops) and f"__builtin_ia32_{builtin}" in source
    np.testing.assert_array_equal(_nibble_dot(*case).numpy(), want)
    _, uops = _source(_byte_dot(*case))   # full-range bytes would saturate pmaddubsw's int16 sums
    assert not any(u.op is Ops.DP4A for u in uops)

def test_no_dp4a_without_byte_dot_instructions(monkeypatch):
  renderer = Device["CPU"].renderer
  described = renderer.describe_target
  monkeypatch.setattr(renderer, "describe_target", lambda: dataclasses.replace(described(), features=frozenset()))
  _, uops = _source(_byte_dot(*_case(48, 8, 1, seed=2)))
  assert not any(u.op is Ops.DP4A for u in uops)

def _lanes(kernel: Tensor) -> list[UOp]:
  item = last_kernel_item(kernel)
  return linearize(optimize_kernel(lower_kernel(item.ast), target=Device["CPU"].renderer.target))

def test_only_sums_of_unsigned_by_signed_bytes_become_dp4a():
  """int8 * int8 (vpdpbusd multiplies unsigned by signed bytes) and 3-term sums stay ordinary vector code."""
  a8 = Tensor(RNG.integers(-128, 128, (64, 6, 8, 4), dtype=np.int8)).realize()
  b8 = Tensor(RNG.integers(-128, 128, (6, 8, 4), dtype=np.int8)).realize()
  u8 = Tensor(RNG.integers(0, 256, (64, 6, 8, 4), dtype=np.uint8)).realize()
  for a, terms in ((a8, 4), (u8, 3)):
    product = a.cast(dtypes.int32) * b8.cast(dtypes.int32)
    sums = product[..., 0]
    for k in range(1, terms): sums = sums + product[..., k]
    vector = vectorize(_lanes(sums.cast(dtypes.float32).sum((-2, -1))), byte_dots=255)
    assert not any(u.op is Ops.DP4A for u in vector)
  product = u8.cast(dtypes.int32) * b8.cast(dtypes.int32)
  sums = product[..., 0] + product[..., 1] + product[..., 2] + product[..., 3]
  uops = _lanes(sums.cast(dtypes.float32).sum((-2, -1)))
  assert any(u.op is Ops.DP4A for u in vectorize(uops, byte_dots=255))
  assert not any(u.op is Ops.DP4A for u in vectorize(uops))   # only when asked
