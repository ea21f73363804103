"""The examples in kiln's docstrings keep running: doctest every module under kiln/."""
import doctest, importlib, pkgutil
import kiln
from kiln import Tensor, dtypes

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

def kiln_module_names() -> list[str]:
  """Every module and package under kiln/, the top-level package included."""
  return ["kiln"] + sorted(info.name for info in pkgutil.walk_packages(kiln.__path__, prefix="kiln."))

def test_every_module_imports_and_its_doctests_pass():
  failures, attempted = {}, 0
  for name in kiln_module_names():
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=OPTIONFLAGS, verbose=False,
                             extraglobs={"Tensor": Tensor, "dtypes": dtypes})   # mixin modules cannot import Tensor
    if result.failed: failures[name] = result.failed
    attempted += result.attempted
  assert not failures, f"doctest failures (module: count; details above): {failures}"
  assert attempted >= 20, f"only {attempted} doctest examples ran; were the docstring examples removed?"
