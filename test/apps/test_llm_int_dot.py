"""Integer dot products in the LLM's quantized matrix-vector products (kiln/apps/llm/quantized.py): the activations
quantized to int8 blocks as llama.cpp does, checked against a NumPy emulation of exactly that arithmetic, against the
float path within the documented bound, for every lane count and with all-zero and outlier blocks; the layout in
pairs of blocks; the choice by the target (VNNI); and a tiny model's decode against its float decode."""
from __future__ import annotations
import dataclasses
import numpy as np
import pytest
from kiln import Tensor, Device, GlobalCounters
from kiln.helpers import Context
from kiln.engine import realize
from kiln.nn.gguf import GGML_TYPES, dequantize_blocks
from kiln.apps.llm.quantized import QuantizedMatrix, quantize_activations, byte_dot_max
from test_llm_model import TYPE_IDS, random_blocks, write_tiny_model

def _activations(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
  """Gaussian activations with a few outlier channels (as real ones have) and one all-zero block per row."""
  x = rng.standard_normal((rows, cols)).astype(np.float32)
  x *= np.where(rng.random(cols) < 0.05, 40.0, 1.0).astype(np.float32)
  x[:, 32:64] = 0
  return x

def _numpy_int_dot(type_name: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
  """llama.cpp's arithmetic in float64: x quantized per block of 32 (d = max|x| / 127, q = x / d rounded half away
  from zero), the integer dot of the weight's unsigned values (Q4: 4-bit, Q8_0: q + 128) with q, times both scales,
  plus the offset (Q4_1's min, else -zero * scale) times sum(x)."""
  rows, blocks = raw.shape[:2]
  scale = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
  if type_name == "Q8_0": values, offset = raw[..., 2:].view(np.int8).astype(np.float64) + 128, -128 * scale
  else:
    nibbles = raw[..., (4 if type_name == "Q4_1" else 2):]
    values = np.concatenate([nibbles & 15, nibbles >> 4], -1).astype(np.float64)   # (rows, blocks, 32)
    offset = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64) if type_name == "Q4_1" else -8 * scale
  xb = x.astype(np.float64).reshape(x.shape[0], blocks, 32)
  d = np.abs(xb).max(-1) / 127
  q = np.trunc(np.divide(xb, d[..., None], out=np.zeros_like(xb), where=d[..., None] > 0) + np.where(xb < 0, -.5, .5))
  dots = np.einsum("rbk,nbk->nrb", values, q)
  return (dots * scale * d[:, None] + offset * xb.sum(-1)[:, None]).sum(-1)

def _bound(weight: np.ndarray, x: np.ndarray) -> np.ndarray:
  """The documented bound on |int path - float path| per output: sum over blocks of max|x_b| / 254 * sum |w|, where
  `weight` is the dequantized weight without Q4_1's min (whose term is computed from float x)."""
  blocks = x.shape[1] // 32
  amax = np.abs(x.astype(np.float64)).reshape(x.shape[0], blocks, 32).max(-1)
  return np.einsum("nb,rb->nr", amax / 254, np.abs(weight).reshape(weight.shape[0], blocks, 32).sum(-1))

@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows,blocks,x_rows", [(64, 4, 1), (96, 8, 3), (40, 18, 1), (48, 3, 2)])
def test_int_dot_matches_numpy_emulation_and_float_within_the_bound(type_name, rows, blocks, x_rows):
  if not QuantizedMatrix.allows_int_dot(type_name, blocks): pytest.skip(f"{type_name} pairs blocks: an even number")
  rng = np.random.default_rng(rows + blocks + x_rows)
  raw = random_blocks(type_name, rows, blocks, rng)
  shape = (rows, 32 * blocks)
  x = _activations(x_rows, shape[1], rng)
  int_matrix = QuantizedMatrix.from_blocks(type_name, raw, shape, int_dot=True)
  float_matrix = QuantizedMatrix.from_blocks(type_name, raw, shape, int_dot=False)
  got = int_matrix.linear(Tensor(x)).numpy()
  want = _numpy_int_dot(type_name, raw, x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  weight = dequantize_blocks(Tensor(raw), TYPE_IDS[type_name]).reshape(shape).numpy().astype(np.float64)
  np.testing.assert_array_equal(int_matrix.dequantize().numpy(), weight.astype(np.float32))   # the paired layout
  if type_name == "Q4_1":   # the min term is exact: only d * q moves
    weight -= np.repeat(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64), 32, 1)
  diff = np.abs(got.astype(np.float64) - float_matrix.linear(Tensor(x)).numpy())
  assert (diff <= _bound(weight, x) * 1.001 + 1e-4).all(), diff.max()
  assert diff.max() > 0   # the int path really ran

def test_activation_quantization():
  x = _activations(2, 128, np.random.default_rng(3))
  q, d, lane_sums = (t.numpy() for t in quantize_activations(Tensor(x)))
  blocks = x.reshape(2, 4, 32)
  np.testing.assert_allclose(d, np.abs(blocks).max(-1) / 127, rtol=1e-6)
  np.testing.assert_allclose(lane_sums, blocks.reshape(2, 4, 8, 4).sum(-1), rtol=1e-5, atol=1e-5)
  assert q.dtype == np.int8 and np.abs(q).max() <= 127 and (q[:, 1] == 0).all()   # the all-zero block
  assert (np.abs(q * d[..., None] - blocks) <= d[..., None] * 0.5001 + 1e-7).all()   # rounded to the nearest

def test_one_quantization_serves_several_matrices():
  rng = np.random.default_rng(8)
  a, b = (QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 32, 2, rng), (32, 64), int_dot=True)
          for _ in range(2))
  x = Tensor(rng.standard_normal((1, 64)).astype(np.float32)).realize()
  want = (a.linear(x) * b.linear(x)).numpy()
  GlobalCounters.reset()
  shared = quantize_activations(x)
  np.testing.assert_array_equal((a.linear(x, shared) * b.linear(x, shared)).numpy(), want)
  assert GlobalCounters.kernel_count == 4   # three for x, one for both products

def test_int_dot_kernels_read_the_packed_weight():
  """Quantizing x takes three small kernels; the product is one more and makes no copy of the weight."""
  rng = np.random.default_rng(4)
  matrix = QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 64, 4, rng), (64, 128), int_dot=True)
  assert set(matrix.decode_parts) == {"scale", "min", "pairs"} and matrix.parts["pairs"].shape == (64, 2, 32)
  x = Tensor(rng.standard_normal((1, 128)).astype(np.float32)).realize()
  GlobalCounters.reset()
  out = matrix.linear(x).realize()
  assert GlobalCounters.kernel_count == 4 and out.shape == (1, 64)

def test_int_dot_needs_a_pairable_type():
  rng = np.random.default_rng(5)
  with pytest.raises(ValueError, match="even number of blocks"):
    QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 4, 3, rng), (4, 96), int_dot=True)
  with pytest.raises(ValueError, match="Q6_K"):
    QuantizedMatrix.from_blocks("Q6_K", random_blocks("Q6_K", 4, 1, rng), (4, 256), int_dot=True)
  assert not QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 4, 3, rng), (4, 96)).int_dot

@pytest.mark.parametrize("features,largest", [({"avx2", "avx_vnni"}, 255), ({"avx2"}, 127), ({"sse2"}, 0)])
def test_the_target_chooses_the_int_path(monkeypatch, features, largest):
  """VNNI makes byte dot products of any unsigned byte one instruction, AVX2's pmaddubsw those below 128: Q4 matrices
  (values below 16) take the int path on both, Q8_0 (values q + 128) only with VNNI; plain SSE2 keeps floats."""
  renderer = Device["CPU"].renderer
  described = renderer.describe_target
  target = dataclasses.replace(described(), features=frozenset(features))
  monkeypatch.setattr(renderer, "describe_target", lambda: target)
  realize._runner_cache.clear()
  try:
    assert byte_dot_max("CPU") == largest
    rng = np.random.default_rng(6)
    assert QuantizedMatrix.from_blocks("Q4_0", random_blocks("Q4_0", 8, 2, rng), (8, 64)).int_dot is (largest > 0)
    assert QuantizedMatrix.from_blocks("Q8_0", random_blocks("Q8_0", 8, 2, rng), (8, 64)).int_dot is (largest == 255)
    with Context(VECTORIZE=0): assert byte_dot_max("CPU") == 0   # scalar code: the float path is faster
  finally: realize._runner_cache.clear()

def test_tiny_model_int_decode_is_close_to_float_decode(tmp_path):
  """Prefill's many rows run the tiled integer product (kiln/apps/llm/quantized.py `tile_layout`), its logits come
  from the last row alone (a matrix-vector product); every step with int8 activations stays close to the float one
  and picks the same token on this model."""
  from kiln.apps.llm.model import load_model
  path = tmp_path / "tiny.gguf"
  write_tiny_model(path)
  exact, _ = load_model(path, max_context=32, int_dot=False)
  quantized, _ = load_model(path, max_context=32, int_dot=True)
  assert all(b.w_gate.int_dot for b in quantized.blocks) and not any(b.w_gate.int_dot for b in exact.blocks)
  tokens = [3, 17, 42, 8, 79]
  steps = [(tokens, 0)] + [([token], pos) for pos, token in enumerate([5, 12, 60], start=len(tokens))]
  for ids, pos in steps:
    want, got = exact.logits(ids, pos), quantized.logits(ids, pos)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.abs(want).max())
    assert got.argmax() == want.argmax()
