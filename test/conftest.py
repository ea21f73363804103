"""Test settings: every graph is checked against kiln/uop/spec.py, and kernels are cached per test session."""
import os, tempfile
os.environ.setdefault("SPEC", "1")
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(tempfile.gettempdir(), "kiln-test-cache"))
