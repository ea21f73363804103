"""ChatEngine: chat messages in, streamed reply text out, reusing the KV cache across turns and requests."""
from __future__ import annotations
from typing import TYPE_CHECKING, Callable, Iterator, Protocol
import numpy as np
from kiln.apps.llm.sampling import check_sampling_args, sample
from kiln.apps.llm.tokenizer import StreamDecoder
from kiln.apps.llm.quantized import DEQUANTIZE_MIN_ROWS

if TYPE_CHECKING:
  from kiln.apps.llm.tokenizer import Tokenizer

class LogitsModel(Protocol):
  """What the engine needs from a model: `kiln.apps.llm.model.Transformer` is one."""
  max_context: int
  def logits(self, tokens: list[int], start_pos: int) -> np.ndarray: ...

# prompt ids a prefill recomputes even when they are cached (see ChatEngine._prefill)
RECOMPUTED_PROMPT_IDS = DEQUANTIZE_MIN_ROWS

def common_prefix_length(a: list[int], b: list[int]) -> int:
  """How many leading ids `a` and `b` share.

  >>> common_prefix_length([1, 2, 3, 4], [1, 2, 5])
  2
  """
  length = 0
  for x, y in zip(a, b):
    if x != y: break
    length += 1
  return length

class Reply:
  """The streamed text of one reply: iterate it for text pieces; afterwards read its counts and finish_reason.

  finish_reason is "stop" (a stop token), "length" (max_tokens or the context ran out) or None while the reply is
  unfinished or when its consumer stopped early (closed it, or its `cancelled` callback said so). `close()` (or
  dropping it) ends the reply; the engine's cache stays consistent whenever it stops.
  """
  def __init__(self, pieces: Iterator[str], prompt_tokens: int):
    self._pieces = pieces
    self.prompt_tokens, self.completion_tokens = prompt_tokens, 0
    self.finish_reason: str | None = None
  def __iter__(self) -> Reply: return self
  def __next__(self) -> str: return next(self._pieces)
  def close(self) -> None:
    """Stop generating; the tokens already made stay in the cache."""
    self._pieces.close()   # type: ignore[attr-defined]

class ChatEngine:
  """Generates chat replies with `model` and `tokenizer`, keeping the ids whose keys/values are in the KV cache.

  A new prompt is prefilled only after its common prefix with the cached ids, so a conversation's next turn (or a
  repeated system prompt) costs only its new tokens. `name` is the model name reported by the server.
  """
  def __init__(self, model: LogitsModel, tokenizer: Tokenizer, name: str):
    self.model, self.tokenizer, self.name = model, tokenizer, name
    # cached_ids[i] is the token whose keys/values are at position i of the KV cache; a position is listed only once
    # the model call that wrote it has returned, so an interrupted call never leaves a wrong entry
    self.cached_ids: list[int] = []
    self._active_reply: Reply | None = None   # the reply that owns the cache now; an older one may not resume

  def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of `messages` in the chat template, ready for the assistant's reply (BOS first if the model
    wants one)."""
    text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = self.tokenizer.encode(text, parse_special=True)
    if self.tokenizer.add_bos and (not ids or ids[0] != self.tokenizer.bos_id): ids = [self.tokenizer.bos_id] + ids
    return ids

  def chat(self, messages: list[dict[str, str]], *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           seed: int | None = None, max_tokens: int | None = 256,
           cancelled: Callable[[], bool] | None = None) -> Reply:
    """Stream the assistant's reply to `messages` as text pieces; stops at a stop token or after max_tokens tokens
    (None: until the context is full). `cancelled`, if given, is asked before each token; True ends the reply there
    (finish_reason None), e.g. when the client that asked for it is gone.

    Settings and the prompt's length are checked here, before the first piece: ValueError/TypeError name the
    argument; a prompt that does not fit the model's context raises a one-line ValueError.
    """
    check_sampling_args(temperature=temperature, top_k=top_k, top_p=top_p)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
      raise ValueError(f"chat: max_tokens must be an integer >= 1 or None, got {max_tokens!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
      raise TypeError(f"chat: seed must be an integer or None, got {type(seed).__name__}")
    if seed is not None and seed < 0: raise ValueError(f"chat: seed must be >= 0, got {seed}")
    ids = self.prompt_ids(messages)
    if not ids: raise ValueError("chat: the chat template produced an empty prompt")
    if len(ids) > self.model.max_context:
      raise ValueError(f"chat: prompt of {len(ids)} tokens does not fit the context of {self.model.max_context} tokens")
    reply = Reply(iter(()), len(ids))
    reply._pieces = self._generate(reply, ids, temperature, top_k, top_p, np.random.default_rng(seed), max_tokens,
                                   cancelled or (lambda: False))
    self._active_reply = reply
    return reply

  def _prefill(self, ids: list[int]) -> np.ndarray:
    """Put `ids` in the KV cache, running the model only on the part after the cached common prefix; the logits of
    the last id."""
    # the last RECOMPUTED_PROMPT_IDS ids run even when cached: their logits are needed, and as a prefill (many rows:
    # float products) they come out as a fresh prompt's do, where one decode step would quantize its activations to
    # int8 (kiln/apps/llm/quantized.py) and could start a reply to the same prompt with another token
    start = min(common_prefix_length(self.cached_ids, ids), max(0, len(ids) - RECOMPUTED_PROMPT_IDS), len(ids) - 1)
    del self.cached_ids[start:]   # those positions are about to be overwritten
    logits = self.model.logits(ids[start:], start)
    self.cached_ids.extend(ids[start:])
    return logits

  def _check_owner(self, reply: Reply) -> None:
    """Refuse to continue a reply after a newer chat() call has rewritten the KV cache."""
    if self._active_reply is not reply:
      raise RuntimeError("chat: this reply was superseded by a newer chat() call on the same engine; "
                         "finish or close a reply before starting the next")

  def _generate(self, reply: Reply, ids: list[int], temperature: float, top_k: int, top_p: float,
                rng: np.random.Generator, max_tokens: int | None, cancelled: Callable[[], bool]) -> Iterator[str]:
    """The decode loop behind `chat`: sample, stream the text, feed the token back, until a stop condition."""
    decoder = StreamDecoder(self.tokenizer)
    self._check_owner(reply)
    if cancelled(): return
    logits = self._prefill(ids)
    stop_ids = self.tokenizer.stop_ids
    while True:
      self._check_owner(reply)
      if cancelled(): return   # the tokens made so far stay in the cache, as when the reply is closed
      token = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
      if token in stop_ids:
        reply.finish_reason = "stop"
        break
      reply.completion_tokens += 1
      if (text := decoder.feed(token)): yield text
      position = len(self.cached_ids)
      if reply.completion_tokens == max_tokens or position >= self.model.max_context:
        reply.finish_reason = "length"
        break
      logits = self.model.logits([token], position)
      self.cached_ids.append(token)
    if (text := decoder.flush()): yield text
