"""The official ONNX backend node tests (onnx 1.18's 1450 cases) run against kiln (kiln/frontend/onnx_backend.py).

Every node test runs; the cases kiln does not pass yet are listed, each with its reason, in
onnx_expected_failures.txt and run as expected failures (one that starts passing fails the run: take it off the list).
ONNX_TESTS=REGEX runs only the matching tests.
"""
import os, pathlib, re
import pytest

onnx = pytest.importorskip("onnx")
import onnx.backend.test  # noqa: E402
from kiln.frontend import onnx_backend  # noqa: E402

EXPECTED_FAILURES = pathlib.Path(__file__).with_name("onnx_expected_failures.txt")

def expected_failures() -> dict[str, str]:
  """test name -> reason, from onnx_expected_failures.txt (`name  # reason` lines; `#` lines are comments)."""
  cases = {}
  for line in EXPECTED_FAILURES.read_text().splitlines():
    name, _, reason = line.partition("#")
    if name.strip(): cases[name.strip()] = reason.strip()
  return cases

backend_test = onnx.backend.test.BackendTest(onnx_backend, __name__)
backend_test.include(os.environ.get("ONNX_TESTS", r"^test_.*_cpu$"))
for _name in expected_failures(): backend_test.xfail(f"^{re.escape(_name)}_cpu$")
# only the node tests: the model tests download real models, the others are covered by test_onnx.py
OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]

def test_expected_failures_are_node_tests():
  """Every listed case exists, so a renamed or fixed test does not linger on the list."""
  node_dir = pathlib.Path(onnx.backend.test.__file__).parent / "data" / "node"
  missing = [name for name in expected_failures() if not (node_dir / name).is_dir()]
  assert not missing, f"not ONNX node tests: {missing}"
