"""The examples run end to end: a shortened digits CNN training reaches a useful accuracy."""
import os, pathlib, re, subprocess, sys
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

def run_example(script: str, *args: str, timeout: float = 300) -> str:
  """Run examples/`script` in a fresh interpreter; returns its stdout (stderr is shown when it fails)."""
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  result = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / script), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO_ROOT)
  if result.returncode != 0:
    raise AssertionError(f"{script} {' '.join(args)} exited with {result.returncode}:\n{result.stderr[-4000:]}")
  return result.stdout

def test_train_digits_short_run():
  pytest.importorskip("sklearn")
  stdout = run_example("train_digits.py", "--steps", "40", "--seed", "1")
  match = re.search(r"^test accuracy: (\d+\.\d)%$", stdout, re.MULTILINE)
  assert match, f"no accuracy line in:\n{stdout}"
  assert stdout.rstrip().splitlines()[-1] == match.group(0), "the accuracy line must be the last line"
  assert float(match.group(1)) >= 90.0, stdout

def test_train_fashion_mnist_options():
  stdout = run_example("train_fashion_mnist.py", "--help", timeout=60)
  assert all(option in stdout for option in ("--epochs", "--bs", "--no-torch", "--limit")), stdout

def test_train_data_parallel_matches_one_device():
  stdout = run_example("train_data_parallel.py", "--devices", "CPU:1,CPU:2,CPU:3", "--steps", "15", "--batch", "30",
                       "--check")
  first, last = map(float, re.search(r"devices .*: loss ([\d.]+) -> ([\d.]+)", stdout).groups())
  assert last < first, stdout
  diff = float(re.search(r"max weight difference against one device: (\S+)", stdout).group(1))
  assert diff < 1e-5, stdout
