"""Prefill and decode speed of SmolLM2-135M-Instruct (Q4_1) in kiln, and optionally transformers (float32) beside it.

  python bench/bench_llm.py                                    # kiln
  /tmp/tfvenv/bin/python bench/bench_llm.py --peer transformers   # kiln and transformers in the same process
  DEBUG=2 python bench/bench_llm.py --profile                  # one eager decode step, time per kernel name
  THREADS=1 python bench/bench_llm.py --profile                # the same on one thread (eager launches on several
                                                               # threads also time the pool's wake-ups)

Prefill: one pass over a ~100-token prompt (after a warm-up pass that compiles and captures). Decode: 128 greedy
tokens through the jitted step. The bandwidth figure is the bytes of weights one decoded token reads (every packed
matrix once, the tied embedding as the output head) times tokens/s.
"""
from __future__ import annotations
import argparse, collections, contextlib, io, re, sys, time, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import numpy as np
from kiln import Context, Tensor, Variable, dtypes
from kiln.apps.llm.model import Transformer, load_model, default_model_path

PROMPT_TOKENS, DECODE_TOKENS = 100, 128

def weight_bytes_per_token(model: Transformer) -> int:
  matrices = [m for b in model.blocks for m in (b.wqkv, b.wo, b.w_gate, b.w_up, b.w_down)] + [model.output]
  return sum(m.nbytes for m in matrices)

def bench_kiln(prompt: list[int]) -> dict[str, float]:
  t0 = time.perf_counter()
  model, _ = load_model(default_model_path(), max_context=512)
  load_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  model.logits(prompt, 0); model.logits(prompt, 0)       # compile, then capture the prefill jit
  warm_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  logits = model.logits(prompt, 0)
  prefill_s = time.perf_counter() - t0
  token = int(logits.argmax())
  for i in range(3): token = int(model.logits([token], len(prompt) + i).argmax())   # compile and capture decode
  t0 = time.perf_counter()
  for i in range(DECODE_TOKENS): token = int(model.logits([token], len(prompt) + 3 + i).argmax())
  decode_s = time.perf_counter() - t0
  nbytes = weight_bytes_per_token(model)
  return {"load s": load_s, "first prefill (compile) s": warm_s, "prefill tok/s": len(prompt) / prefill_s,
          "decode tok/s": DECODE_TOKENS / decode_s, "weights MB/token": nbytes / 1e6,
          "decode GB/s of weights": nbytes * DECODE_TOKENS / decode_s / 1e9}

def bench_transformers(prompt: list[int]) -> dict[str, float]:
  import torch
  from transformers import AutoModelForCausalLM
  path = default_model_path()
  model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
  ids = torch.tensor([prompt])
  with torch.no_grad():
    model(ids)
    t0 = time.perf_counter()
    out = model(ids, use_cache=True)
    prefill_s = time.perf_counter() - t0
    past, token = out.past_key_values, out.logits[0, -1].argmax()
    t0 = time.perf_counter()
    for _ in range(DECODE_TOKENS):
      out = model(token.reshape(1, 1), past_key_values=past, use_cache=True)
      past, token = out.past_key_values, out.logits[0, -1].argmax()
    decode_s = time.perf_counter() - t0
  return {"prefill tok/s": len(prompt) / prefill_s, "decode tok/s": DECODE_TOKENS / decode_s,
          "threads": torch.get_num_threads()}

def profile_decode() -> None:
  """Time per kernel name of one eager decode step (DEBUG=2 lines), largest first."""
  model, _ = load_model(default_model_path(), max_context=512)
  for pos in range(2): model._decode_step(Tensor([1], dtype=dtypes.int32), Variable("start_pos", 0, 511).bind(pos))
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), Context(DEBUG=2):
    model._decode_step(Tensor([1], dtype=dtypes.int32), Variable("start_pos", 0, 511).bind(100))
  total, count, rates = collections.Counter(), collections.Counter(), collections.defaultdict(list)
  for line in out.getvalue().splitlines():
    m = re.match(r"\*\*\* \S+\s+\d+ (\S+)\s+([\d.]+) (us|ms)\s+[\d.]+ GFLOP/s\s+([\d.]+) GB/s", line)
    if m:
      us = float(m.group(2)) * (1000 if m.group(3) == "ms" else 1)
      total[m.group(1)] += us; count[m.group(1)] += 1; rates[m.group(1)].append(float(m.group(4)))
  print(f"eager decode step: {sum(total.values()) / 1000:.1f} ms in kernels, {sum(count.values())} launches")
  for name, us in total.most_common(12):
    print(f"  {name:28s} x{count[name]:3d} {us / 1000:7.2f} ms  {100 * us / sum(total.values()):4.1f}%  "
          f"median {np.median(rates[name]):.2f} GB/s")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peer", choices=["transformers"], help="also time this framework")
  parser.add_argument("--profile", action="store_true", help="time per kernel of one eager decode step")
  args = parser.parse_args()
  if args.profile: return profile_decode()
  prompt = [int(t) for t in np.random.default_rng(0).integers(100, 40000, PROMPT_TOKENS)]
  rows = {"kiln": bench_kiln(prompt)}
  if args.peer == "transformers": rows["transformers"] = bench_transformers(prompt)
  for name, row in rows.items():
    print(f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

if __name__ == "__main__":
  main()
