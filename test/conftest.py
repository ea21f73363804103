"""Test settings: every graph is checked against kiln/uop/spec.py, and kernels are cached per test session."""
import os, tempfile
os.environ.setdefault("SPEC", "1")
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(tempfile.gettempdir(), "kiln-test-cache"))

# CI runs the property tests on a fixed sequence of examples (a landing must not depend on luck); local runs explore
from hypothesis import settings  # noqa: E402
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"): settings.load_profile("ci")

# the op tests' kernels rendered for CUDA C and PTX and compiled for sm_90a at the session's end (where nvcc/ptxas are)
pytest_plugins = ["gpu_render_sweep"]
