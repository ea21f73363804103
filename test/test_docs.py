"""The docs stay true: docs/env_vars.md matches the settings registry, the README opens with its two commands."""
import pathlib, re, subprocess, sys

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCED_BLOCK = re.compile(r"\A\s*```[a-z]*\n(.*?)\n```", re.S)

def readme_setup_commands() -> list[str]:
  """The contents of the fenced code blocks that open README.md, before any other text."""
  text = (REPO_ROOT / "README.md").read_text()
  blocks = []
  while (match := FENCED_BLOCK.match(text)):
    blocks.append(match.group(1).strip())
    text = text[match.end():]
  return blocks

def test_env_docs_up_to_date():
  result = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_env_docs.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
  assert result.returncode == 0, f"docs/env_vars.md is stale; run python tools/gen_env_docs.py\n{result.stderr}"

def test_readme_starts_with_the_two_setup_commands():
  commands = readme_setup_commands()
  assert len(commands) == 2, f"README.md must open with exactly two code blocks, found {len(commands)}: {commands}"
  for command in commands:
    assert "\n" not in command, f"each setup command is one line, got {command!r}"
  run_command, test_command = commands
  assert run_command.startswith("pip install -e ."), run_command
  assert test_command.startswith("pip install -e '.[testing]'") and "pytest" in test_command, test_command

def test_ci_runs_the_readme_test_command():
  test_command = readme_setup_commands()[1]
  ci_script = (REPO_ROOT / ".ci" / "run").read_text()
  assert test_command in ci_script, f".ci/run must run the README's test command verbatim: {test_command!r}"

def test_readme_doc_links_exist():
  text = (REPO_ROOT / "README.md").read_text()
  links = re.findall(r"\]\((docs/[^)#]+)", text)
  assert links, "README.md links no docs/ pages"
  missing = [link for link in links if not (REPO_ROOT / link).exists()]
  assert not missing, f"README.md links to missing files: {missing}"

def test_tensor_docs_list_every_method_and_are_current():
  result = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_tensor_docs.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
  assert result.returncode == 0, f"docs/tensor.md is stale or incomplete; run python tools/gen_tensor_docs.py\n{result.stderr}"
