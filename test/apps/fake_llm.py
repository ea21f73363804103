"""Small stand-ins for the LLM tokenizer and model, for fast tests of the engine, server and CLI.

FakeTokenizer: byte-level (ids 0..255 are bytes) plus ChatML special tokens. ScriptedModel: a "model" whose logits
are a deterministic function of the ids in its own KV cache: after the last generation prompt it spells `reply`
and then ends with <|im_end|>. Because its answer depends on what its cache really holds, any bookkeeping mistake
in the engine (a stale prefix reused, a position skipped) changes the output or trips its checks.
"""
from __future__ import annotations
import numpy as np

IM_START, IM_END, EOS, BOS = 256, 257, 258, 259
SPECIALS = {"<|im_start|>": IM_START, "<|im_end|>": IM_END, "<|endoftext|>": EOS, "<s>": BOS}

class FakeTokenizer:
  """Byte-level tokenizer with the interface of kiln.apps.llm.tokenizer.Tokenizer."""
  def __init__(self, add_bos: bool = False):
    self.bos_id, self.eos_id, self.vocab_size, self.add_bos = BOS, EOS, 260, add_bos
    self.stop_ids = frozenset({IM_END, EOS})
  def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
    ids, rest = [], text
    while rest:
      special = next((s for s in SPECIALS if parse_special and rest.startswith(s)), None)
      if special: ids.append(SPECIALS[special]); rest = rest[len(special):]
      else: ids.extend(rest[0].encode()); rest = rest[1:]
    return ids
  def token_bytes(self, token_id: int) -> bytes:
    if token_id < 256: return bytes([token_id])
    return next(text for text, i in SPECIALS.items() if i == token_id).encode()
  def decode(self, ids: list[int]) -> str:
    return b"".join(self.token_bytes(i) for i in ids).decode(errors="replace")
  def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

GENERATION_PROMPT = [IM_START] + list(b"assistant\n")

class ScriptedModel:
  """A fake Transformer: `logits(tokens, start_pos)` with a KV cache of ids, recording every call."""
  def __init__(self, reply: str = "hello", max_context: int = 256, noise: float = 0.0, interrupt_at_call: int = -1):
    self.reply, self.max_context, self.noise = list(reply.encode()), max_context, noise
    self.cache: list[int] = []           # what this fake's KV cache holds, position by position
    self.calls: list[tuple[int, int]] = []   # (len(tokens), start_pos) per call
    self.interrupt_at_call = interrupt_at_call
  @property
  def prefill_tokens(self) -> int:
    """Tokens run through the model in multi-token (prefill) calls."""
    return sum(n for n, _ in self.calls if n > 1)
  def logits(self, tokens: list[int], start_pos: int) -> np.ndarray:
    if start_pos + len(tokens) > self.max_context:
      raise ValueError(f"logits: prompt of {start_pos + len(tokens)} tokens does not fit the context of "
                       f"{self.max_context}")
    if start_pos > len(self.cache):
      raise AssertionError(f"position gap: start_pos {start_pos}, cache holds {len(self.cache)}")
    self.calls.append((len(tokens), start_pos))
    if len(self.calls) - 1 == self.interrupt_at_call:
      self.cache = self.cache[:start_pos] + [0] * len(tokens)    # a half-written cache, as a real interrupt leaves
      raise KeyboardInterrupt
    self.cache = self.cache[:start_pos] + list(tokens)
    return self.next_logits(self.cache)
  def next_logits(self, ids: list[int]) -> np.ndarray:
    """Peaked on the scripted next token; `noise` adds a fixed pseudo-random term so sampling has choices."""
    last = max((i for i in range(len(ids)) if ids[i:i + len(GENERATION_PROMPT)] == GENERATION_PROMPT), default=None)
    done = 0 if last is None else len(ids) - last - len(GENERATION_PROMPT)
    target = self.reply[done] if done < len(self.reply) else IM_END
    logits = np.zeros(260, dtype=np.float32)
    logits[target] = 10.0
    if self.noise: logits += np.random.default_rng(len(ids)).standard_normal(260).astype(np.float32) * self.noise
    return logits
