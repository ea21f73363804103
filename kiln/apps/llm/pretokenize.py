"""Pre-tokenizers: split text into the words BPE merges within, the way llama.cpp does for each `tokenizer.ggml.pre`.

Python's `re` has no `\\p{L}`/`\\p{N}`, so each pattern is a small hand-written scanner over a per-character class
(letter, number, whitespace, other) taken from `unicodedata.category` and Unicode's White_Space list. The scanners
follow llama.cpp's own hand-written splitters (its `unicode.cpp`), quirks included, because agreeing with llama.cpp on
the same GGUF is the goal:

- 'gpt2' / 'gpt-2': `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`.
- 'smollm' (and the pre-tokenizers llama.cpp gives the same patterns: 'starcoder', 'refact', 'command-r',
  'codeshell', 'exaone', 'minerva'): every `\\p{N}` on its own first, then the GPT-2 pattern inside each piece.
- 'llama3' / 'llama-bpe' / 'llama-v3': `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|
  ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`.
- 'default': llama.cpp's BPE default: runs of punctuation (`[\\p{P}$+<=>^~|]+`) apart, then GPT-2, then `\\p{N}+`
  apart, then ASCII digits in threes.

Like llama.cpp, a later pattern only splits the pieces an earlier one made, and text no pattern matches stays a piece
of its own. Character classes come from Python's `unicodedata` (Unicode 14 on Python 3.11); llama.cpp's tables may be a
newer Unicode version, so characters assigned since then can split differently.

>>> pretokenize("x  12\\n  42", "smollm")
['x', '  ', '1', '2', '\\n  ', '4', '2']
>>> pretokenize("x  12\\n  42", "gpt2")
['x', ' ', ' 12', '\\n ', ' 42']
"""
from __future__ import annotations
import functools
import unicodedata
from typing import Callable

LETTER, NUMBER, SPACE, OTHER = "L", "N", "W", "O"

# Unicode's White_Space property (PropList.txt), the set llama.cpp's `\s` means; str.isspace also counts \x1c-\x1f.
WHITE_SPACE = frozenset(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                                  0x2029, 0x202F, 0x205F, 0x3000]))

@functools.lru_cache(maxsize=65536)
def char_class(char: str) -> str:
  """The class of one character: LETTER (\\p{L}), NUMBER (\\p{N}), SPACE (White_Space) or OTHER."""
  if char in WHITE_SPACE: return SPACE
  category = unicodedata.category(char)[0]
  return LETTER if category == "L" else NUMBER if category == "N" else OTHER

def classes_of(text: str) -> str:
  """One class letter per character of `text`, so scanners compare short strings instead of calling unicodedata."""
  return "".join(map(char_class, text))

Span = tuple[int, int]

def _split_spans(spans: list[Span], split_one: Callable[[int, int], list[Span]]) -> list[Span]:
  """Apply a splitter to each span; a later pattern only ever splits the pieces an earlier one made."""
  return [piece for start, end in spans for piece in split_one(start, end)]

def _split_matches(start: int, end: int, match_end: Callable[[int], int]) -> list[Span]:
  """Split text[start:end] at the matches of a pattern, like a regex scan: `match_end(pos)` is the end of the match
  at pos (0 if none, then the scan moves on one character); the text between matches stays one piece."""
  pieces, pos, prev_end = [], start, start
  while pos < end:
    stop = match_end(pos)
    if not stop:
      pos += 1
      continue
    if pos > prev_end: pieces.append((prev_end, pos))
    pieces.append((pos, stop))
    pos = prev_end = stop
  if prev_end < end: pieces.append((prev_end, end))
  return pieces

def _run_matcher(end: int, in_run: Callable[[int], bool], length: int = 0) -> Callable[[int], int]:
  """A matcher for `X+` (length 0) or for exactly `length` X's in a row, X being the positions where in_run holds."""
  def match_end(pos: int) -> int:
    stop = pos
    while stop < end and in_run(stop) and (length == 0 or stop - pos < length): stop += 1
    return stop if stop > pos and (length == 0 or stop - pos == length) else 0
  return match_end

def _contraction_end(text: str, pos: int, end: int, ignore_case: bool) -> int:
  """The end of `'s|'t|'re|'ve|'m|'ll|'d` at pos (case-insensitive for llama3), or 0 when there is none."""
  if text[pos] != "'" or pos + 1 >= end: return 0
  nxt = text[pos + 1].lower() if ignore_case and text[pos + 1].isascii() else text[pos + 1]
  if nxt in "stmd": return pos + 2
  if pos + 2 < end:
    pair = text[pos + 1:pos + 3]
    if ignore_case and pair.isascii(): pair = pair.lower()
    if pair in ("re", "ve", "ll"): return pos + 3
  return 0

def _whitespace_end(text: str, classes: str, pos: int, end: int) -> int:
  """`\\s+(?!\\S)|\\s+` at pos: a run of spaces leaves its last one to the word after it."""
  count = 0
  while pos + count < end and classes[pos + count] == SPACE: count += 1
  if count > 1 and pos + count < end: return pos + count - 1
  return pos + max(count, 1)

def _gpt2_spans(text: str, classes: str, start: int, end: int) -> list[Span]:
  """Split text[start:end] by the GPT-2 pattern."""
  pieces, pos = [], start
  while pos < end:
    stop = _contraction_end(text, pos, end, ignore_case=False)
    if not stop:
      # ' ?X+' looks at the class after an optional leading space; past the end there is no class at all
      lead = 1 if text[pos] == " " else 0
      kind = classes[pos + lead] if pos + lead < end else ""
      if kind in (LETTER, NUMBER, OTHER):
        stop = pos + lead
        while stop < end and classes[stop] == kind: stop += 1
      else:
        stop = _whitespace_end(text, classes, pos, end)
    pieces.append((pos, stop))
    pos = stop
  return pieces

def _llama3_spans(text: str, classes: str, start: int, end: int) -> list[Span]:
  """Split text[start:end] by the Llama 3 pattern."""
  pieces, pos = [], start
  while pos < end:
    char, kind = text[pos], classes[pos]
    stop = _contraction_end(text, pos, end, ignore_case=True)
    if stop: pass
    elif char not in "\r\n" and kind != NUMBER and (kind == LETTER or (pos + 1 < end and classes[pos + 1] == LETTER)):
      stop = pos + 1  # [^\r\n\p{L}\p{N}]?\p{L}+
      while stop < end and classes[stop] == LETTER: stop += 1
    elif kind == NUMBER:
      stop = pos  # \p{N}{1,3}
      while stop < end and classes[stop] == NUMBER and stop - pos < 3: stop += 1
    elif (kind == OTHER) or (char == " " and (pos + 1 >= end or classes[pos + 1] == OTHER)):
      stop = pos + (char == " ")  # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      while stop < end and classes[stop] == OTHER: stop += 1
      while stop < end and text[stop] in "\r\n": stop += 1
    else:
      last_newline_end, scan = 0, pos  # \s*[\r\n]+ takes whitespace up to its last line break
      while scan < end and classes[scan] == SPACE:
        scan += 1
        if text[scan - 1] in "\r\n": last_newline_end = scan
      stop = last_newline_end or _whitespace_end(text, classes, pos, end)
    pieces.append((pos, stop))
    pos = stop
  return pieces

_PUNCTUATION_EXTRA = frozenset("$+<=>^~|")

def _is_default_punctuation(char: str) -> bool:
  """`[\\p{P}$+<=>^~|]`, the first pattern of llama.cpp's default BPE pre-tokenizer."""
  return char in _PUNCTUATION_EXTRA or unicodedata.category(char)[0] == "P"

def _default_spans(text: str, classes: str, start: int, end: int) -> list[Span]:
  """llama.cpp's default BPE pre-tokenizer: punctuation runs, GPT-2, number runs, then ASCII digits in threes."""
  spans = _split_matches(start, end, _run_matcher(end, lambda pos: _is_default_punctuation(text[pos])))
  spans = _split_spans(spans, lambda a, b: _gpt2_spans(text, classes, a, b))
  spans = _split_spans(spans, lambda a, b: _split_matches(a, b, _run_matcher(b, lambda pos: classes[pos] == NUMBER)))
  ascii_digit = lambda pos: "0" <= text[pos] <= "9"  # noqa: E731
  return _split_spans(spans, lambda a, b: _split_matches(a, b, _run_matcher(b, ascii_digit, length=3)))

def _smollm_spans(text: str, classes: str, start: int, end: int) -> list[Span]:
  """Every number character on its own, then the GPT-2 pattern inside each piece."""
  spans = _split_matches(start, end, lambda pos: pos + 1 if classes[pos] == NUMBER else 0)
  return _split_spans(spans, lambda a, b: _gpt2_spans(text, classes, a, b))

SpanSplitter = Callable[[str, str, int, int], list[Span]]
PRETOKENIZERS: dict[str, SpanSplitter] = {
  "gpt2": _gpt2_spans, "gpt-2": _gpt2_spans, "default": _default_spans,
  **{name: _smollm_spans for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")},
  **{name: _llama3_spans for name in ("llama3", "llama-bpe", "llama-v3")},
}

def pretokenizer_for(name: str) -> SpanSplitter:
  """The splitter for a `tokenizer.ggml.pre` name; an unknown name raises ValueError naming it and the known ones."""
  if name not in PRETOKENIZERS:
    raise ValueError(f"tokenizer: pre-tokenizer {name!r} (tokenizer.ggml.pre) is not supported; "
                     f"supported: {', '.join(sorted(PRETOKENIZERS))}")
  return PRETOKENIZERS[name]

def pretokenize(text: str, name: str) -> list[str]:
  """Split `text` into pre-tokenizer words for the `tokenizer.ggml.pre` name `name` (see the module docstring)."""
  splitter = pretokenizer_for(name)
  return [text[start:stop] for start, stop in splitter(text, classes_of(text), 0, len(text))]
