"""The byte-level BPE tokenizer of a GGUF model (`tokenizer.ggml.model == 'gpt2'`), matching llama.cpp token for token.

What it supports:
- Vocabulary, token types and merges from the GGUF metadata; a merge's rank is its index in `tokenizer.ggml.merges`.
- Pre-tokenizers chosen by `tokenizer.ggml.pre` ('gpt2', 'default', 'smollm' and its llama.cpp aliases, 'llama3' /
  'llama-bpe'; see `kiln.apps.llm.pretokenize`). An unknown one raises ValueError naming it.
- Special tokens: CONTROL (3), USER_DEFINED (4) and UNKNOWN (2) tokens written in the text become their single id
  when `parse_special=True` (USER_DEFINED ones always, as in llama.cpp); `decode` writes their text back.
- Chat templates: ChatML, Llama 3 and a plain fallback (see `kiln.apps.llm.chat_template`).
- `StreamDecoder` for streamed output: a character whose UTF-8 bytes span several tokens comes out whole, once.

How it matches llama.cpp (`llama_tokenize(..., add_special=False, parse_special=True)`):
1. Special tokens are cut out of the text longest first, each at every place it occurs in the remaining plain text.
2. Each plain fragment is pre-tokenized on its own; each word's UTF-8 bytes are mapped to GPT-2's printable
   byte characters.
3. BPE merges the adjacent pair of lowest rank first (the leftmost one among equal ranks) until no pair has a rank.
   With the llama3 pre-tokenizer a word that is itself a token is taken whole (llama.cpp's `ignore_merges`).
4. A final piece not in the vocabulary falls back to one token per byte. A byte with no token of its own is dropped,
   as llama.cpp drops it (SmolLM2's vocabulary has none for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d and the lead bytes
   0xf1/0xf2 of planes 4-11); `missing_bytes` lists them. Any text without those bytes round-trips exactly.
Encoded words are cached, so repeated words cost a dictionary lookup. `tools/record_llamacpp_tokens.py` records
llama.cpp's ids for a varied corpus; the tests compare with them exactly.

>>> tok = Tokenizer(["a", "b", "ab", "<|end|>"], [1, 1, 1, 3], ["a b"], pre="gpt2", eos_id=3)
>>> tok.encode("abab<|end|>")
[2, 2, 3]
>>> tok.decode([2, 0, 3])
'aba<|end|>'
"""
from __future__ import annotations
import codecs
import heapq
from typing import Any, Sequence

from kiln.apps.llm.chat_template import ChatFormat, detect_chat_format, render_chat
from kiln.apps.llm.pretokenize import classes_of, pretokenizer_for

# token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# texts llama.cpp treats as end of generation when they are tokens of the vocabulary
STOP_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<|eom_id|>", "<EOT>", "<|return|>", "<|call|>", "<end_of_utterance>")
_WORD_CACHE_LIMIT = 1 << 16

def _gpt2_byte_chars() -> list[str]:
  """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the others for chr(256 + n)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  chars, extra = {}, 0
  for byte in range(256):
    if byte in printable: chars[byte] = chr(byte)
    else:
      chars[byte] = chr(256 + extra)
      extra += 1
  return [chars[byte] for byte in range(256)]

BYTE_CHARS = _gpt2_byte_chars()
_BYTES_TO_CHARS = {byte: char for byte, char in enumerate(BYTE_CHARS)}   # str.translate table over Latin-1 text
_CHARS_TO_BYTES = {ord(char): byte for byte, char in enumerate(BYTE_CHARS)}

def bytes_to_bpe_text(data: bytes) -> str:
  """The GPT-2 character string that stands for `data` (one character per byte)."""
  return data.decode("latin-1").translate(_BYTES_TO_CHARS)

def bpe_text_to_bytes(text: str) -> bytes:
  """The bytes a GPT-2 character string stands for; characters outside the table stand for their own UTF-8."""
  mapped = text.translate(_CHARS_TO_BYTES)
  try:
    return mapped.encode("latin-1")
  except UnicodeEncodeError:
    return b"".join(bytes([ord(c)]) if ord(c) < 256 else c.encode("utf-8") for c in mapped)

def _metadata_list(metadata: dict, key: str, item_type: type, required: bool = True) -> list:
  value = metadata.get(key)
  if value is None and not required: return []
  if not isinstance(value, list) or not all(isinstance(item, item_type) for item in value):
    raise ValueError(f"tokenizer: GGUF metadata {key!r} must be a list of {item_type.__name__}, got "
                     f"{type(value).__name__}")
  return value

class Tokenizer:
  """A byte-level BPE tokenizer (see the module docstring). Build it with `Tokenizer.from_gguf_metadata`."""

  def __init__(self, tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], *, pre: str = "gpt2",
               bos_id: int = -1, eos_id: int = -1, extra_stop_ids: Sequence[int] = (), add_bos: bool = False,
               chat_template: str | None = None):
    if token_types and len(token_types) != len(tokens):
      raise ValueError(f"tokenizer: {len(tokens)} tokens but {len(token_types)} token types")
    self.tokens = list(tokens)
    self.token_types = list(token_types) or [NORMAL] * len(self.tokens)
    self.vocab_size = len(self.tokens)
    self.pre = pre
    self._split_words = pretokenizer_for(pre)
    self._whole_words_first = pre in ("llama3", "llama-bpe", "llama-v3")  # llama.cpp's ignore_merges
    self.token_ids: dict[str, int] = {}
    for token_id, text in enumerate(self.tokens): self.token_ids.setdefault(text, token_id)
    self.ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
      split = merge.find(" ", 1)  # a merge is "left right"; the left part may itself start with a space
      if split < 0: raise ValueError(f"tokenizer: merge {rank} {merge!r} has no space between its two parts")
      self.ranks.setdefault((merge[:split], merge[split + 1:]), rank)
    for name, token_id in (("bos", bos_id), ("eos", eos_id)):
      if not -1 <= token_id < self.vocab_size:
        raise ValueError(f"tokenizer: {name} id {token_id} is outside the vocabulary of {self.vocab_size}")
    self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
    special_kinds = (CONTROL, USER_DEFINED, UNKNOWN)
    special = [i for i, kind in enumerate(self.token_types) if kind in special_kinds and self.tokens[i]]
    # longest first, as llama.cpp cuts them out: a special token containing another one wins
    self._special_ids = sorted(special, key=lambda i: -len(self.tokens[i]))
    stops = {i for i in (eos_id, *extra_stop_ids) if 0 <= i < self.vocab_size}
    stops |= {self.token_ids[text] for text in STOP_TEXTS
              if text in self.token_ids and self.token_types[self.token_ids[text]] in (CONTROL, USER_DEFINED)}
    self.stop_ids: frozenset[int] = frozenset(stops)
    self._token_bytes = [self._bytes_of(i) for i in range(self.vocab_size)]
    self._word_cache: dict[str, list[int]] = {}
    # bytes no token can stand for: text holding them cannot round-trip (valid UTF-8 never has 0xc0, 0xc1, 0xf5-0xff)
    self.missing_bytes = frozenset(byte for byte, char in enumerate(BYTE_CHARS) if char not in self.token_ids)
    bos_text = self.tokens[bos_id] if bos_id >= 0 else ""
    self.chat_format: ChatFormat = detect_chat_format(chat_template, bos_text)

  @classmethod
  def from_gguf_metadata(cls, metadata: dict[str, Any]) -> "Tokenizer":
    """The tokenizer stored in a GGUF file's metadata (as `kiln.nn.gguf.gguf_load_raw` returns it).

    Raises ValueError for a tokenizer model other than 'gpt2' (byte-level BPE), an unknown pre-tokenizer or missing
    or malformed vocabulary entries.
    """
    if not isinstance(metadata, dict): raise TypeError(f"tokenizer: metadata must be a dict, got {type(metadata)}")
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
      raise ValueError(f"tokenizer: tokenizer.ggml.model {model!r} is not supported; only 'gpt2' (byte-level BPE)")
    tokens = _metadata_list(metadata, "tokenizer.ggml.tokens", str)
    token_types = _metadata_list(metadata, "tokenizer.ggml.token_type", int, required=False)
    merges = _metadata_list(metadata, "tokenizer.ggml.merges", str)
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str): raise ValueError(f"tokenizer: tokenizer.ggml.pre must be a str, got {pre!r}")
    def token_id(key: str) -> int:
      value = metadata.get(f"tokenizer.ggml.{key}_token_id", -1)
      if not isinstance(value, int): raise ValueError(f"tokenizer: tokenizer.ggml.{key}_token_id is {value!r}")
      return value
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", pre in ("llama3", "llama-bpe", "llama-v3"))
    return cls(tokens, token_types, merges, pre=pre, bos_id=token_id("bos"), eos_id=token_id("eos"),
               extra_stop_ids=(token_id("eot"), token_id("eom")), add_bos=bool(add_bos),
               chat_template=metadata.get("tokenizer.chat_template"))

  # ---- encoding
  def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
    """The token ids of `text`, with no BOS added. With parse_special, special-token text (e.g. `<|im_start|>`)
    becomes that token's id; otherwise only USER_DEFINED tokens do, as in llama.cpp.

    >>> tok = Tokenizer(["a", "b", "ab", "<s>", "<", "s", ">"], [1, 1, 1, 3, 1, 1, 1], ["a b"])
    >>> tok.encode("ab<s>"), tok.encode("ab<s>", parse_special=False)
    ([2, 3], [2, 4, 5, 6])
    """
    if not isinstance(text, str): raise TypeError(f"tokenizer.encode: text must be a str, got {type(text).__name__}")
    ids: list[int] = []
    for fragment in self._split_special(text, parse_special):
      if isinstance(fragment, int): ids.append(fragment)
      else: ids += self._encode_plain(fragment)
    return ids

  def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
    """text cut into plain-text fragments (str) and special-token ids (int)."""
    fragments: list[str | int] = [text] if text else []
    for token_id in self._special_ids:
      if not parse_special and self.token_types[token_id] != USER_DEFINED: continue
      special = self.tokens[token_id]
      if not any(isinstance(f, str) and special in f for f in fragments): continue
      cut: list[str | int] = []
      for fragment in fragments:
        if isinstance(fragment, int) or special not in fragment:
          cut.append(fragment)
          continue
        for index, piece in enumerate(fragment.split(special)):
          if index: cut.append(token_id)
          if piece: cut.append(piece)
      fragments = cut
    return fragments

  def _encode_plain(self, text: str) -> list[int]:
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as error:
      raise ValueError(f"tokenizer.encode: text has a lone surrogate {text[error.start]!r} at {error.start}; it has "
                       "no UTF-8 form") from None
    ids: list[int] = []
    cache = self._word_cache
    for start, stop in self._split_words(text, classes_of(text), 0, len(text)):
      word = bytes_to_bpe_text(text[start:stop].encode("utf-8"))
      word_ids = cache.get(word)
      if word_ids is None:
        word_ids = self._encode_word(word)
        if len(cache) >= _WORD_CACHE_LIMIT: cache.clear()
        cache[word] = word_ids
      ids += word_ids
    return ids

  def _encode_word(self, word: str) -> list[int]:
    """BPE on one pre-tokenized word (in GPT-2 characters): merge the lowest-ranked adjacent pair, leftmost first."""
    if self._whole_words_first and word in self.token_ids: return [self.token_ids[word]]
    symbols = list(word)
    next_of = list(range(1, len(symbols) + 1))
    prev_of = list(range(-1, len(symbols) - 1))
    ranks = self.ranks
    def pair(left: int, right: int) -> tuple[int, int, int, str] | None:
      if left < 0 or right >= len(symbols): return None
      rank = ranks.get((symbols[left], symbols[right]))
      return None if rank is None else (rank, left, right, symbols[left] + symbols[right])
    heap = [p for p in (pair(i, i + 1) for i in range(len(symbols) - 1)) if p is not None]
    heapq.heapify(heap)
    while heap:
      _, left, right, merged = heapq.heappop(heap)
      # a stale pair: one side was merged away or grew since the pair was queued
      if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != merged: continue
      symbols[left], symbols[right] = merged, ""
      next_of[left] = next_of[right]
      if next_of[left] < len(symbols): prev_of[next_of[left]] = left
      for new_pair in (pair(prev_of[left], left), pair(left, next_of[left])):
        if new_pair is not None: heapq.heappush(heap, new_pair)
    ids = []
    for symbol in symbols:
      if not symbol: continue
      token_id = self.token_ids.get(symbol)
      if token_id is not None: ids.append(token_id)
      else: ids += [self.token_ids[char] for char in symbol if char in self.token_ids]  # one token per byte
    return ids

  # ---- decoding
  def _bytes_of(self, token_id: int) -> bytes:
    text, kind = self.tokens[token_id], self.token_types[token_id]
    if kind == NORMAL: return bpe_text_to_bytes(text)
    if kind == BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
      return bytes([int(text[3:5], 16)])
    if kind == UNUSED: return b""
    return text.encode("utf-8")  # CONTROL, USER_DEFINED, UNKNOWN: their text as written

  def token_bytes(self, token_id: int) -> bytes:
    """The raw bytes token `token_id` stands for (a special token: its text)."""
    if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
      raise ValueError(f"tokenizer: token id {token_id!r} is outside the vocabulary of {self.vocab_size}")
    return self._token_bytes[token_id]

  def decode(self, ids: Sequence[int]) -> str:
    """The text of a token sequence: the exact inverse of `encode`; invalid UTF-8 becomes U+FFFD."""
    return b"".join(self.token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

  # ---- chat
  def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The prompt text for a conversation in this model's chat format (ChatML, Llama 3 or plain; see
    `kiln.apps.llm.chat_template`). Malformed messages raise ValueError naming the bad one."""
    return render_chat(messages, self.chat_format, add_generation_prompt=add_generation_prompt)

  def __repr__(self) -> str:
    return f"Tokenizer(vocab_size={self.vocab_size}, pre={self.pre!r}, chat={self.chat_format.kind!r})"

class StreamDecoder:
  """Turns a stream of token ids into text pieces; a character split over several tokens comes out whole, once.

  >>> tok = Tokenizer([bytes_to_bpe_text(b) for b in (b"\\xc3", b"\\xa9", b"!")], [1, 1, 1], [])
  >>> stream = StreamDecoder(tok)
  >>> [stream.feed(0), stream.feed(1), stream.feed(2), stream.flush()]
  ['', 'é', '!', '']
  """

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer = tokenizer
    self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

  def feed(self, token_id: int) -> str:
    """The text this token completes ('' while a UTF-8 sequence is still incomplete)."""
    return self._utf8.decode(self.tokenizer.token_bytes(token_id))

  def flush(self) -> str:
    """Whatever is left at the end of the stream (an incomplete sequence becomes U+FFFD)."""
    text = self._utf8.decode(b"", final=True)
    self._utf8.reset()
    return text
