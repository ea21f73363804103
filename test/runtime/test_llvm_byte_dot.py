"""DP4A on the LLVM device (kiln/renderer/llvmir.py `byte_dot_method`): a quantized dot product's int32 lanes become
vpdpbusd where the target has VNNI, pmaddubsw + pmaddwd where its unsigned bytes are below 128 and it has AVX2 or
AVX-512BW, and widened lane sums elsewhere. Every method must give the bits of the scalar code (VECTORIZE=0). The
target's features are forced per test (the host here has all of them, so every method runs)."""
from __future__ import annotations
import dataclasses, platform
import numpy as np
import pytest

pytest.importorskip("llvmlite")

from kiln import Tensor, Device, dtypes   # noqa: E402
from kiln.engine import realize   # noqa: E402
from kiln.helpers import Context   # noqa: E402
from kiln.uop.ops import Ops   # noqa: E402
from kiln.renderer.llvmir import byte_dot_method   # noqa: E402
from helpers import kernel_sources

X86 = platform.machine() in ("x86_64", "AMD64")

def _case(groups: int, seed: int) -> tuple[np.ndarray, ...]:
  """uint8 a (48 rows, 6 blocks, 2 chunks, groups, 4), int8 b (6, 2, groups, 4), float32 scales (6, groups)."""
  rng = np.random.default_rng(seed)
  return (rng.integers(0, 256, (48, 6, 2, groups, 4), dtype=np.uint8),
          rng.integers(-128, 128, (6, 2, groups, 4), dtype=np.int8),
          rng.standard_normal((6, groups)).astype(np.float32))

def _byte_dot(a: np.ndarray, b: np.ndarray, scale: np.ndarray, nibbles: bool) -> Tensor:
  """out[r] = sum over blocks, groups of scale * the int32 dot product of a's bytes (or low nibbles) and b's."""
  left = Tensor(a, device="LLVM")
  if nibbles: left = left & 15
  product = left.cast(dtypes.int32) * Tensor(b, device="LLVM").cast(dtypes.int32)
  sums = product[..., 0] + product[..., 1] + product[..., 2] + product[..., 3]
  return ((sums[:, :, 0] + sums[:, :, 1]).cast(dtypes.float32) * Tensor(scale, device="LLVM")).sum((-2, -1))

@pytest.fixture
def llvm_features(monkeypatch):
  """A function that makes the LLVM renderer describe its target with the given instruction-set features."""
  renderer = Device["LLVM"].renderer
  described = renderer.describe_target()
  def use(features: set[str]) -> None:
    target = dataclasses.replace(described, features=frozenset(features))
    monkeypatch.setattr(renderer, "describe_target", lambda: target)
    realize._runner_cache.clear()
  yield use
  realize._runner_cache.clear()


# (features, groups = int32 lanes, nibbles, the intrinsic the IR must call, or None for the widened sums)
CASES = {
  "AVX512-VNNI, 16 lanes": ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, 16, False,
                            "llvm.x86.avx512.vpdpbusd.512"),
  "AVX-VNNI, 8 lanes": ({"avx2", "avx_vnni"}, 8, False, "llvm.x86.avx512.vpdpbusd.256"),
  "AVX-VNNI only, 16 lanes: widened sums": ({"avx2", "avx_vnni"}, 16, False, None),
  "AVX2, nibbles: pmaddubsw": ({"avx2", "ssse3"}, 8, True, "llvm.x86.avx2.pmadd.ub.sw"),
  "AVX-512BW, nibbles: pmaddubsw": ({"avx2", "ssse3", "avx512f", "avx512bw"}, 16, True,
                                    "llvm.x86.avx512.pmaddubs.w.512"),
}

@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize("name", list(CASES))
def test_every_byte_dot_method_gives_the_scalar_bits(llvm_features, name):
  features, groups, nibbles, intrinsic = CASES[name]
  case = _case(groups, seed=groups + nibbles)
  with Context(VECTORIZE=0, CACHELEVEL=0): want = _byte_dot(*case, nibbles).numpy()
  llvm_features(features)
  with Context(CACHELEVEL=0):
    got = _byte_dot(*case, nibbles).numpy()
    sources = kernel_sources(lambda: _byte_dot(*case, nibbles))
  calls = [src for src in sources if "@llvm.x86." in src]
  if intrinsic is None:
    assert not calls, f"{name}: an x86 intrinsic without the features for it"
    assert any("zext <32 x i8>" in src or "zext <64 x i8>" in src for src in sources), f"{name}: no widened bytes"
  else: assert any(f"@{intrinsic}(" in src for src in calls), f"{name}: no call of {intrinsic}"
  differ = np.flatnonzero(got != want)
  assert differ.size == 0, (f"{name}: {differ.size} of {got.size} differ from the scalar code, first at {differ[0]}: "
                            f"{got.flat[differ[0]]} != {want.flat[differ[0]]}")
  a, b, scale = (x.astype(np.float64) for x in case)
  if nibbles: a = np.mod(a, 16)
  exact = ((a * b).sum((2, 4)) * scale).sum((-2, -1))
  np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-3)

def test_byte_dot_method_needs_unsigned_by_signed_bytes():
  from kiln.uop.ops import UOp
  def dp4a(left, small: bool) -> UOp:
    def lanes(dtype, n: int) -> UOp: return UOp(Ops.CONST, dtype.vec(n), (), tuple([1] * n))
    return UOp(Ops.DP4A, dtypes.int32.vec(8), (lanes(dtypes.int32, 8), lanes(left, 32), lanes(dtypes.int8, 32)), small)
  assert byte_dot_method(dp4a(dtypes.uint8, False), frozenset({"avx_vnni"})) == "vnni"
  assert byte_dot_method(dp4a(dtypes.int8, True), frozenset({"avx_vnni", "avx2"})) == "generic"
  assert byte_dot_method(dp4a(dtypes.uint8, False), frozenset({"avx2"})) == "generic"   # pmaddubsw would saturate
  assert byte_dot_method(dp4a(dtypes.uint8, True), frozenset({"avx2"})) == "maddubs"
  assert byte_dot_method(dp4a(dtypes.uint8, True), frozenset()) == "generic"

def test_streamed_matvec_rows_are_prefetched():
  """The thread-split loop of a matrix-vector product prefetches the weight rows an iteration ahead will read."""
  weights = Tensor(np.random.default_rng(1).standard_normal((256, 64), dtype=np.float32), device="LLVM")
  x = Tensor(np.ones(64, np.float32), device="LLVM")
  sources = kernel_sources(lambda: weights @ x)
  assert any("call void @llvm.prefetch.p0(" in src for src in sources), "no prefetch in the matvec"
  np.testing.assert_allclose((weights @ x).numpy(), weights.numpy().astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
