"""Prefill and decode speed of SmolLM2-135M-Instruct (Q4_1) in kiln, and optionally transformers (float32) beside it.

  python bench/bench_llm.py                                    # kiln
  /tmp/tfvenv/bin/python bench/bench_llm.py --peer transformers   # kiln and transformers in the same process
  DEBUG=2 python bench/bench_llm.py --profile                  # one eager decode step, time per kernel name
  THREADS=1 python bench/bench_llm.py --profile                # the same on one thread (eager launches on several
                                                               # threads also time the pool's wake-ups)
  DEV=CUDA python bench/bench_llm.py --random-gguf smollm2-135m --profile-graph   # GPU time per kernel of the
                                                               # decode step's CUDA graph (see profile_graph)
  DEV=CUDA python bench/bench_llm.py --random-gguf smollm2-135m   # a GGUF of SmolLM2-135M's exact shapes and types
                                                               # (Q4_1, Q8_0 embedding) with random weights, written
                                                               # to a temporary file and benchmarked (the real file
                                                               # need not be there: for the GPU machine)
  python bench/bench_llm.py --random-gguf smollm2-135m --matrix-type Q4_0   # the same shapes, other types
  DEV=CUDA python bench/bench_llm.py --random-bf16 llama3-8b   # a Llama-3-8B-shaped model, bf16 weights made at
                                                               # random on the device (no file), prefill of 512
                                                               # tokens and decode at batch 1

Prefill: one pass over a ~100-token prompt (after a warm-up pass that compiles and captures). Decode: 128 greedy
tokens through the jitted step. The bandwidth figure is the bytes of weights one decoded token reads (every packed
matrix once, the tied embedding as the output head) times tokens/s.
"""
from __future__ import annotations
import argparse, collections, contextlib, dataclasses, io, re, sys, tempfile, time, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import numpy as np
from kiln import Context, Tensor, Variable, dtypes
from kiln.apps.llm.model import Block, LlamaConfig, Transformer, load_model, default_model_path, read_config
from kiln.apps.llm.quantized import QuantizedMatrix
from kiln.apps.llm.random_model import PRESETS, write_random_gguf

PROMPT_TOKENS, DECODE_TOKENS, PART_STEPS = 100, 128, 32
PROFILE_JIT = GC_FREEZE = PROFILE_GRAPH = False   # --profile-jit, --gc-freeze, --profile-graph

def weight_bytes_per_token(model: Transformer) -> int:
  matrices = [m for b in model.blocks for m in (b.wqkv, b.wo, b.w_gate, b.w_up, b.w_down)] + [model.output]
  return sum(m.nbytes for m in matrices)

def decode_launches(model: Transformer) -> str:
  """What one jitted decode replay launches: its kernels, and the launches they are batched into (a device graph
  counts as one), e.g. '302 kernels in 1 launch (CUDAGraph)'."""
  jits = [model._decode, *model._decode_windows.values()]   # GPU targets: one per attention window
  captured = next((jit.captured for jit in reversed(jits) if jit.captured is not None), None)
  if captured is None: return "not captured"
  launches = captured._launches or []
  kinds = collections.Counter(type(launch).__name__ for launch in launches)
  batches = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
  return f"{captured.kernel_count} kernels in {len(launches)} launches ({batches})"

def decode_step_parts(model: Transformer, token: int, start: int, steps: int = PART_STEPS) -> dict[str, float]:
  """Where a decode step's wall time goes, in us (mean of `steps`): making the token's input tensor on the device,
  the jitted step (launching; on a GPU it does not wait for the kernels), and the logits to the host (waiting for
  the kernels, then the copy) with the argmax."""
  total = collections.Counter()
  graphs = [launch for jit in model._decode_windows.values() if jit.captured is not None
            for launch in jit.captured._launches or [] if hasattr(launch, "graph")]   # CUDA graphs: time their launch
  for graph in graphs:
    def timed(handle, launch=graph.graph.launch_exec):
      t = time.perf_counter()
      launch(handle)
      total["graph launch (in the jit call)"] += time.perf_counter() - t
    graph.graph.launch_exec = timed
  for i in range(steps):
    t0 = time.perf_counter()
    if model.gpu:   # what Transformer.logits does for one token on a GPU target
      model._step_input.uop.base.buffer.copyin(memoryview(np.array([token, start + i], np.int32)).cast("B"))
      t1 = time.perf_counter()
      out = model._decode_windows[model.window(start + i + 1)](model._step_input)
    else:
      ids = Tensor([token], dtype=dtypes.int32, device=model.device).realize()
      t1 = time.perf_counter()
      out = model._decode(ids, Variable("start_pos", 0, model.max_context - 1).bind(start + i))
    t2 = time.perf_counter()
    token = int(out.numpy().argmax())
    t3 = time.perf_counter()
    total["input"] += t1 - t0; total["jit call"] += t2 - t1; total["logits to host"] += t3 - t2
  for graph in graphs: del graph.graph.launch_exec
  return {f"step {name} us": seconds / steps * 1e6 for name, seconds in total.items()}

# --random-bf16: Llama-family shapes whose weights are made at random on the device, in bfloat16
BF16_PRESETS = {
  "llama3-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, hidden_dim=14336, vocab_size=128256,
                    rope_theta=500000.0, context_length=8192),
  "tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, vocab_size=512, rope_theta=500000.0,
               context_length=2048),   # for trying the option on a CPU
}

class Bf16Matrix(QuantizedMatrix):
  """A weight matrix held as its bfloat16 values (GGUF's BF16: no packing), widened to float32 where a kernel
  reads it, as QuantizedMatrix does its F16 ones."""
  def _expand(self, parts: dict[str, Tensor]) -> Tensor: return parts["w"].cast(dtypes.float32)

def random_bf16_model(preset: str, max_context: int, seed: int = 0) -> Transformer:
  """A Llama-family model of `preset`'s shapes (BF16_PRESETS) with random bfloat16 weights made on the default
  device (uniform, scaled by 1/sqrt(columns) so that activations stay of order one; norms 1; an untied output
  head): no file is written or read, so the GPU machine builds Llama-3-8B's 16 GB of weights in seconds."""
  shape = BF16_PRESETS[preset]
  dim, heads, kv, hidden = shape["dim"], shape["n_heads"], shape["n_kv_heads"], shape["hidden_dim"]
  head_dim = dim // heads
  config = LlamaConfig(arch="llama", dim=dim, n_layers=shape["n_layers"], n_heads=heads, n_kv_heads=kv,
                       hidden_dim=hidden, vocab_size=shape["vocab_size"], norm_eps=1e-5,
                       rope_theta=shape["rope_theta"], head_dim=head_dim, context_length=shape["context_length"])
  Tensor.manual_seed(seed)
  def matrix(rows: int, cols: int) -> Bf16Matrix:
    values = ((Tensor.rand(rows, cols) - 0.5) * (3.4 / cols ** 0.5)).cast(dtypes.bfloat16).contiguous().realize()
    return Bf16Matrix("BF16", (rows, cols), {"w": values}, (cols,))
  def ones(n: int) -> Tensor: return Tensor.ones(n).contiguous().realize()
  blocks = [Block(ones(dim), matrix((heads + 2 * kv) * head_dim, dim), matrix(dim, heads * head_dim), ones(dim),
                  matrix(hidden, dim), matrix(hidden, dim), matrix(dim, hidden)) for _ in range(config.n_layers)]
  return Transformer(config, blocks, matrix(config.vocab_size, dim), ones(dim), matrix(config.vocab_size, dim),
                     max_context)

def bench_kiln(path: pathlib.Path | None, prompt: list[int], random_bf16: str | None = None,
               max_context: int = 512) -> dict[str, float | str]:
  t0 = time.perf_counter()
  model = random_bf16_model(random_bf16, max_context) if random_bf16 else load_model(path, max_context=max_context)[0]
  load_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  model.logits(prompt, 0); model.logits(prompt, 0)       # compile, then capture the prefill jit
  warm_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  logits = model.logits(prompt, 0)
  prefill_s = time.perf_counter() - t0
  token = int(logits.argmax())
  for i in range(3): token = int(model.logits([token], len(prompt) + i).argmax())   # compile and capture decode
  if model.gpu:   # and each attention window the timed steps reach (positions written here are written again later)
    reached = range(len(prompt) + 3, len(prompt) + 3 + DECODE_TOKENS + PART_STEPS + 1)
    for window in sorted({model.window(pos + 1) for pos in reached}):
      first = next(pos for pos in reached if model.window(pos + 1) == window)
      for _ in range(3): model.logits([token], first)
  if GC_FREEZE:
    import gc
    gc.collect()
    gc.freeze()
  t0 = time.perf_counter()
  for i in range(DECODE_TOKENS): token = int(model.logits([token], len(prompt) + 3 + i).argmax())
  decode_s = time.perf_counter() - t0
  parts = decode_step_parts(model, token, len(prompt) + 3 + DECODE_TOKENS)
  if PROFILE_JIT:   # where the jit call's Python goes: cProfile over the same steps again
    import cProfile, pstats
    profiler = cProfile.Profile()
    profiler.enable()
    decode_step_parts(model, token, len(prompt) + 3 + DECODE_TOKENS)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
  if PROFILE_GRAPH:
    for window in sorted(model._decode_windows): profile_graph(model, window)
  nbytes = weight_bytes_per_token(model)
  # a prefill token multiplies every layer's matrices (2 FLOPs an element; attention's products not counted)
  layer_elements = sum(m.shape[0] * m.shape[1] for b in model.blocks
                       for m in (b.wqkv, b.wo, b.w_gate, b.w_up, b.w_down))
  return {"device": model.device, "decode jit": decode_launches(model), "load s": load_s,
          "first prefill (compile) s": warm_s, "prefill tok/s": len(prompt) / prefill_s,
          "prefill TFLOP/s (layers' matrices)": 2 * layer_elements * len(prompt) / prefill_s / 1e12,
          "decode tok/s": DECODE_TOKENS / decode_s, "weights MB/token": nbytes / 1e6,
          "decode GB/s of weights": nbytes * DECODE_TOKENS / decode_s / 1e9, **parts}

def _time_graph(context, launches: list, reps: int = 20, programmatic: bool = False) -> float:
  """us per launch of a CUDA graph of `launches` (cuda.PackedLaunch) as a chain (its edges programmatic, or not),
  median of 5 timings of `reps`."""
  from kiln.runtime import cuda_driver as cuda
  graph = cuda.Graph(context, launches, None, [False] + [programmatic] * (len(launches) - 1))
  graph.launch()
  start, end = context.event(), context.event()
  times = []
  for _ in range(5):
    start.record()
    for _ in range(reps): graph.launch()
    end.record()
    end.synchronize()
    times.append(start.elapsed_ms(end) * 1e3 / reps)
  graph.close()
  return float(np.median(times))

def profile_graph(model: Transformer, window: int) -> None:
  """GPU time per kernel of the captured decode step for `window` (CUDA): the step's graph as captured, and for each
  kernel program (one per role in a layer: the same code in every layer) its *marginal* cost, the whole graph's
  time less that of the graph without its launches, and its *chained* cost, the time per launch of a graph of one of
  its launches repeated 64 times (each waiting for the one before, as in the step). Outputs of kernels left out are
  stale: the times, not the values, are the point."""
  jit = model._decode_windows[window]
  (runner,) = [launch for launch in jit.captured._launches if hasattr(launch, "graph")]
  items, packed, context = runner.items, runner.graph.packed, runner.context
  pdl = runner.graph.programmatic
  full = _time_graph(context, packed, programmatic=pdl)
  groups: dict[int, list[int]] = {}
  for i, item in enumerate(items): groups.setdefault(id(item.runner), []).append(i)
  print(f"decode graph, window {window}{' (programmatic edges)' if pdl else ''}: {len(items)} kernels, {full:.1f} us "
        f"a launch ({full / len(items):.2f} us a kernel)")
  print(f"  {'first':>5s} {'kernel':24s} {'launch':>22s} {'count':>5s} {'chained us':>10s} {'marginal us':>11s}")
  for indices in sorted(groups.values()):
    runner_i = items[indices[0]].runner
    chained = _time_graph(context, [packed[indices[0]]] * 64, programmatic=pdl) / 64
    drop = set(indices)
    marginal = full - _time_graph(context, [p for i, p in enumerate(packed) if i not in drop], programmatic=pdl) \
      if len(drop) < len(items) else full
    print(f"  {indices[0]:5d} {runner_i.name:24s} {str(runner_i.launch):>22s} {len(indices):5d} {chained:10.2f} "
          f"{marginal:11.1f}")

def bench_transformers(path: pathlib.Path, prompt: list[int]) -> dict[str, float]:
  import torch
  from transformers import AutoModelForCausalLM
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

def profile_decode(path: pathlib.Path, log: pathlib.Path | None = None) -> None:
  """Time per kernel name of one eager decode step (DEBUG=2 lines), largest first; `log`: write every line there."""
  model, _ = load_model(path, max_context=512)
  def step(pos: int) -> None:
    if model.gpu:   # the GPU decode path (Transformer._decode_window_step), eagerly
      model._step_input.uop.base.buffer.copyin(memoryview(np.array([1, pos], np.int32)).cast("B"))
      model._decode_window_step(model._step_input, model.window(pos + 1))
    else: model._decode_step(Tensor([1], dtype=dtypes.int32), Variable("start_pos", 0, 511).bind(pos))
  for pos in range(98, 100): step(pos)
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), Context(DEBUG=2):
    step(100)
  if log is not None: log.write_text(out.getvalue())
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
  parser.add_argument("--profile-log", metavar="FILE", type=pathlib.Path, help="with --profile: the DEBUG=2 lines")
  parser.add_argument("--model", metavar="PATH", type=pathlib.Path, help="GGUF file (default: SmolLM2-135M's)")
  parser.add_argument("--random-gguf", choices=sorted(PRESETS), metavar="MODEL",
                      help="benchmark a GGUF with random weights in this model's shapes and types "
                           f"({', '.join(PRESETS)})")
  parser.add_argument("--random-bf16", choices=sorted(BF16_PRESETS), metavar="MODEL",
                      help="benchmark a model of these shapes with random bfloat16 weights made on the device, no "
                           f"file ({', '.join(BF16_PRESETS)}): prefill of --prompt-tokens (512) and decode")
  parser.add_argument("--prompt-tokens", type=int, metavar="N", help="the prefill's prompt length (default 100; "
                      "512 with --random-bf16)")
  parser.add_argument("--matrix-type", metavar="TYPE", help="with --random-gguf: the weight matrices' type instead "
                      "of the model's (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, F16, F32)")
  parser.add_argument("--embedding-type", metavar="TYPE", help="with --random-gguf: the token embedding's type")
  parser.add_argument("--row-elements", type=int, metavar="N", help="GPU targets: about N elements a thread in a "
                      "row kernel's block (kiln/codegen/gpudims.py ROW_ELEMENTS)")
  parser.add_argument("--profile-graph", action="store_true", help="CUDA: GPU time per kernel of the decode "
                      "step's graph (marginal and chained), after the benchmark")
  parser.add_argument("--profile-jit", action="store_true", help="cProfile the decode steps' Python (after the run)")
  parser.add_argument("--gc-freeze", action="store_true", help="move every object alive after the warm-up out of "
                      "the garbage collector's reach (gc.freeze) before timing decode")
  parser.add_argument("--row-lane-elements", type=int, metavar="N", help="GPU targets: threads a row in row kernels of "
                      "many rows (kiln/codegen/gpudims.py ROW_LANE_ELEMENTS: about N elements a lane; 0: a block a row)")
  parser.add_argument("--graph-dag", action="store_true", help="CUDA: graph nodes wait only for the nodes whose "
                      "memory they use (kiln/runtime/ops_cuda.py CUDAGraph.PARALLEL), to compare with the chain")
  parser.add_argument("--programmatic", type=int, choices=(0, 1, 2), help="CUDA graphs: programmatic dependent "
                      "launch between kernels (kiln/runtime/ops_cuda.py CUDAGraph.PROGRAMMATIC) off (0), on with each "
                      "kernel letting the next start at its start (1: kiln/renderer/cuda.py TRIGGER_AT_START; use "
                      "CODEGEN_CACHE=0), or at its end (2, the default)")
  args = parser.parse_args()
  if args.programmatic is not None:
    from kiln.runtime.ops_cuda import CUDAGraph
    CUDAGraph.PROGRAMMATIC = bool(args.programmatic)
    from kiln.renderer import cuda as cuda_renderer
    cuda_renderer.TRIGGER_AT_START = args.programmatic == 1
  if args.graph_dag:
    from kiln.runtime.ops_cuda import CUDAGraph
    CUDAGraph.PARALLEL = True
  global PROFILE_JIT, GC_FREEZE, PROFILE_GRAPH
  PROFILE_JIT, GC_FREEZE, PROFILE_GRAPH = args.profile_jit, args.gc_freeze, args.profile_graph
  if args.row_elements or args.row_lane_elements is not None:
    from kiln.codegen import gpudims
    gpudims.ROW_ELEMENTS = args.row_elements or gpudims.ROW_ELEMENTS
    if args.row_lane_elements == 0: gpudims.MULTI_ROW_MIN = 1 << 30
    elif args.row_lane_elements: gpudims.ROW_LANE_ELEMENTS = args.row_lane_elements
  if args.random_bf16:
    global DECODE_TOKENS
    tokens = args.prompt_tokens or 512
    if args.random_bf16 == "tiny": DECODE_TOKENS = 16
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, BF16_PRESETS[args.random_bf16]["vocab_size"],
                                                                tokens)]
    row = bench_kiln(None, prompt, args.random_bf16, max_context=max(512, tokens + DECODE_TOKENS + PART_STEPS + 8))
    print(f"kiln, {args.random_bf16} bf16 (random weights), {len(prompt)}-token prompt: " +
          ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    return
  path = args.model or (None if args.random_gguf else default_model_path())
  if args.random_gguf:
    spec = PRESETS[args.random_gguf]
    spec = dataclasses.replace(spec, matrix_type=args.matrix_type or spec.matrix_type,
                               embedding_type=args.embedding_type or spec.embedding_type)
    path = pathlib.Path(tempfile.mkdtemp()) / f"{args.random_gguf}-random-{spec.matrix_type}.gguf"
    t0 = time.perf_counter()
    write_random_gguf(path, spec)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {spec.matrix_type} matrices, {spec.embedding_type} "
          f"embedding) in {time.perf_counter() - t0:.1f} s")
  if args.profile: return profile_decode(path, args.profile_log)
  vocab = read_config(path).vocab_size
  prompt = [int(t) for t in np.random.default_rng(0).integers(min(100, vocab // 2), min(40000, vocab), PROMPT_TOKENS)]
  rows = {"kiln": bench_kiln(path, prompt)}
  if args.peer == "transformers": rows["transformers"] = bench_transformers(path, prompt)
  for name, row in rows.items():
    print(f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

if __name__ == "__main__":
  main()
