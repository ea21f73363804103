"""The tiled integer product of many rows (a prefill) by a quantized matrix (kiln/apps/llm/quantized.py
`tile_layout`, `QuantizedMatrix._tiled_int_dot_linear`): the same arithmetic as the matrix-vector int path row by row
and as a NumPy emulation of llama.cpp's, on the C and LLVM devices; the layout; the vector code (DP4A with x's 4
bytes broadcast, kiln/codegen/vectorize.py) against the scalar code bit for bit; the fallbacks (rows that 16 does not
divide, a CPU without byte dot products); and a tiny model's prefill against its float prefill."""
from __future__ import annotations
import dataclasses
import numpy as np
import pytest
from kiln import Tensor, Device, GlobalCounters
from kiln.helpers import Context
from kiln.engine import realize
from kiln.apps.llm import quantized
from kiln.apps.llm.quantized import QuantizedMatrix, TILE_ROWS
from test_llm_model import random_blocks, write_tiny_model
from test_llm_int_dot import _activations, _numpy_int_dot
from helpers import kernel_sources

@pytest.fixture(autouse=True)
def _short_products_tiled_too(monkeypatch):
  """The tests' products are short: they take the tiled path as a long prefill's do."""
  monkeypatch.setattr(quantized, "TILED_MIN_X_ROWS", quantized.DEQUANTIZE_MIN_ROWS)

def test_a_short_prefill_dequantizes(monkeypatch):
  """Fewer rows of x than TILED_MIN_X_ROWS (a chat turn) take the float product: its kernels compile fast."""
  monkeypatch.setattr(quantized, "TILED_MIN_X_ROWS", 16)
  rng = np.random.default_rng(3)
  raw = random_blocks("Q4_0", 512, 2, rng)
  matrix = QuantizedMatrix.from_blocks("Q4_0", raw, (512, 64), int_dot=True, tiled=True)
  float_matrix = QuantizedMatrix.from_blocks("Q4_0", raw, (512, 64), int_dot=False)
  short, long = Tensor(_activations(8, 64, rng)), Tensor(_activations(16, 64, rng))
  np.testing.assert_array_equal(matrix.linear(short).numpy(), float_matrix.linear(short).numpy())
  assert not np.array_equal(matrix.linear(long).numpy(), float_matrix.linear(long).numpy())   # int8 activations

def _row_by_row(matrix: QuantizedMatrix, x: Tensor) -> np.ndarray:
  """The matrix-vector int path (`_int_dot_linear`, what decode runs) one row of x at a time."""
  return np.concatenate([matrix.linear(x[i:i + 1]).numpy() for i in range(x.shape[0])])

@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows,blocks,x_rows", [(512, 2, 8), (528, 4, 9), (512, 6, 16)])
def test_tiled_product_matches_the_row_by_row_int_path(type_name, rows, blocks, x_rows):
  rng = np.random.default_rng(rows + blocks + x_rows)
  raw = random_blocks(type_name, rows, blocks, rng)
  matrix = QuantizedMatrix.from_blocks(type_name, raw, (rows, 32 * blocks), int_dot=True, tiled=True)
  assert "tiles" in matrix.parts
  x = _activations(x_rows, 32 * blocks, rng)
  got = matrix.linear(Tensor(x)).numpy()
  want = _row_by_row(matrix, Tensor(x))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  exact = _numpy_int_dot(type_name, raw, x)
  np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())

def test_tiled_product_on_llvm_matches_the_c_path():
  pytest.importorskip("llvmlite")
  rng = np.random.default_rng(11)
  raw = random_blocks("Q4_1", 512, 4, rng)
  x = _activations(12, 128, rng)
  results = []
  for device in ("CPU", "LLVM"):
    matrix = QuantizedMatrix.from_blocks("Q4_1", raw, (512, 128), device=device, int_dot=True, tiled=True)
    results.append(matrix.linear(Tensor(x, device=device)).numpy())
  np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6 * np.abs(results[0]).max())

def test_tile_layout_holds_each_rows_bytes_and_scales():
  rng = np.random.default_rng(12)
  matrix = QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 512, 4, rng), (512, 128), int_dot=True,
                                       tiled=True)
  pairs, scale, low = (matrix.parts[k].numpy() for k in ("pairs", "scale", "min"))
  tiles, tile_scale, tile_offset = (matrix.parts[k].numpy() for k in ("tiles", "tile_scale", "tile_offset"))
  assert tiles.shape == (512 // TILE_ROWS, 2, 8, TILE_ROWS, 4) and tile_scale.shape == (32, 2, 2, TILE_ROWS)
  for i, j, g, lane, k in [(0, 0, 0, 0, 0), (31, 1, 7, 15, 3), (1, 0, 3, 5, 2)]:
    assert tiles[i, j, g, lane, k] == pairs[TILE_ROWS * i + lane, j, 4 * g + k]
  for i, j, f, lane in [(0, 0, 1, 3), (30, 1, 0, 15)]:
    assert tile_scale[i, j, f, lane] == scale[TILE_ROWS * i + lane, 2 * j + f]
    assert tile_offset[i, j, f, lane] == low[TILE_ROWS * i + lane, 2 * j + f]


def test_the_tiled_kernel_broadcasts_x_into_byte_dots_and_matches_the_scalar_bits():
  """One product kernel after x's quantization, no copy of the weight; its vector code (DP4A helpers with a
  broadcast operand, `_b2`) gives the scalar code's bits."""
  if Device["CPU"].renderer.target.byte_dot_max == 0: pytest.skip("no byte dot products on this CPU")
  rng = np.random.default_rng(13)
  matrix = QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 512, 6, rng), (512, 192), int_dot=True,
                                       tiled=True)
  x = Tensor(_activations(16, 192, rng)).realize()
  with Context(CACHELEVEL=0):
    GlobalCounters.reset()
    sources = kernel_sources(lambda: matrix.linear(x))
    assert GlobalCounters.kernel_count == 5   # x: block maxima, int8 values, lane and block sums; the product
    vector = matrix.linear(x).numpy()
    with Context(VECTORIZE=0): scalar = matrix.linear(x).numpy()
  assert any("kiln_dp4a_" in src and "_b2" in src for src in sources), "no DP4A with a broadcast operand"
  differ = np.flatnonzero(vector != scalar)
  assert differ.size == 0, f"{differ.size} of {vector.size} differ from the scalar code, first at {differ[0]}"

@pytest.mark.parametrize("rows", [520, 64])
def test_rows_that_16_does_not_divide_or_few_rows_dequantize_instead(rows):
  """520 rows (not groups of 16), 64 (fewer than TILED_MIN_ROWS): a product of many rows dequantizes the weight."""
  rng = np.random.default_rng(14)
  raw = random_blocks("Q4_0", rows, 2, rng)
  matrix = QuantizedMatrix.from_blocks("Q4_0", raw, (rows, 64), int_dot=True)
  assert "tiles" not in matrix.parts and matrix.int_dot
  x = Tensor(_activations(8, 64, rng))
  float_matrix = QuantizedMatrix.from_blocks("Q4_0", raw, (rows, 64), int_dot=False)
  np.testing.assert_array_equal(matrix.linear(x).numpy(), float_matrix.linear(x).numpy())

def test_a_cpu_without_byte_dots_keeps_float_products(monkeypatch):
  """The target decides (kiln/runtime/cpu_target.py, here a fake SSE2-only CPU): no integer path, no tiles."""
  renderer = Device["CPU"].renderer
  target = dataclasses.replace(renderer.describe_target(), features=frozenset({"sse2"}))
  monkeypatch.setattr(renderer, "describe_target", lambda: target)
  realize._runner_cache.clear()
  try:
    rng = np.random.default_rng(15)
    raw = random_blocks("Q4_1", 512, 2, rng)
    matrix = QuantizedMatrix.from_blocks("Q4_1", raw, (512, 64))
    assert not matrix.int_dot and "tiles" not in matrix.parts
    x = _activations(8, 64, rng)
    weight = matrix.dequantize().numpy().astype(np.float64)
    np.testing.assert_allclose(matrix.linear(Tensor(x)).numpy(), x @ weight.T, rtol=1e-5, atol=1e-4)
  finally: realize._runner_cache.clear()

def test_avx2_without_vnni_keeps_prefill_float(monkeypatch):
  """A fake AVX2 CPU (pmaddubsw, no VNNI): decode's integer path, but products of many rows stay float (no tiles)."""
  renderer = Device["CPU"].renderer
  target = dataclasses.replace(renderer.describe_target(), features=frozenset({"avx2", "fma", "ssse3"}))
  monkeypatch.setattr(renderer, "describe_target", lambda: target)
  realize._runner_cache.clear()
  try:
    raw = random_blocks("Q4_1", 512, 2, np.random.default_rng(16))
    matrix = QuantizedMatrix.from_blocks("Q4_1", raw, (512, 64))
    assert matrix.int_dot and "tiles" not in matrix.parts
    assert "tiles" in QuantizedMatrix.from_blocks("Q4_1", raw, (512, 64), tiled=True).parts
  finally: realize._runner_cache.clear()

def test_tiny_model_int_prefill_is_close_to_float_prefill(tmp_path, monkeypatch):
  """A prefill of 12 tokens (the feed-forward's gate and up products tiled, their 96 rows allowed here) against the
  float model's."""
  from kiln.apps.llm import quantized
  from kiln.apps.llm.model import load_model
  monkeypatch.setattr(quantized, "TILED_MIN_ROWS", 16)
  path = tmp_path / "tiny.gguf"
  write_tiny_model(path)
  exact, _ = load_model(path, max_context=32, int_dot=False)
  quantized, _ = load_model(path, max_context=32, int_dot=True, int_prefill=True)
  assert all("tiles" in b.w_gate.parts for b in quantized.blocks)
  tokens = [3, 17, 42, 8, 79, 5, 12, 60, 33, 2, 71, 9]
  want, got = exact.logits(tokens, 0), quantized.logits(tokens, 0)
  np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.abs(want).max())
  assert got.argmax() == want.argmax()

def test_int_prefill_false_keeps_prefill_float(tmp_path, monkeypatch):
  """`load_model(int_prefill=False)`: no tiled layout, so a prefill's products of many rows are float products."""
  from kiln.apps.llm import quantized
  from kiln.apps.llm.model import load_model
  monkeypatch.setattr(quantized, "TILED_MIN_ROWS", 16)
  path = tmp_path / "tiny.gguf"
  write_tiny_model(path)
  model, _ = load_model(path, max_context=32, int_dot=True, int_prefill=False)
  assert all(b.w_gate.int_dot and "tiles" not in b.w_gate.parts for b in model.blocks)
