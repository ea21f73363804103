"""The on-disk codegen cache (kiln/engine/codegen_cache.py): a kernel made once is not rendered again by a later
process (simulated by clearing the in-memory runner cache), the results stay right, and what changes the source
(settings, kiln's code) changes the key."""
import numpy as np
import pytest
from kiln import Tensor, Context, Variable
from kiln.engine import realize, codegen_cache
from helpers import assert_close

RNG = np.random.default_rng(3)

@pytest.fixture
def renders(monkeypatch, tmp_path):
  """A fresh cache folder, SPEC off (the cache is off under SPEC), and a list that grows by one per kernel
  rendered."""
  calls: list[str] = []
  render = realize.render_lowered
  def counting(device, name, lowered):
    calls.append(name)
    return render(device, name, lowered)
  monkeypatch.setattr(realize, "render_lowered", counting)
  with Context(SPEC=0, CACHEDB=str(tmp_path / "cache"), CODEGEN_CACHE=1, SCHEDULE_CACHE=0):
    realize._runner_cache.clear()
    yield calls
  realize._runner_cache.clear()

def _graph(a: Tensor, b: Tensor) -> list[Tensor]:
  return [(a @ b).relu() + 1, (a * 2).exp().sum(1)]

def test_a_later_process_skips_codegen_and_gets_the_same_results(renders):
  an, bn = RNG.standard_normal((24, 40)).astype(np.float32), RNG.standard_normal((40, 16)).astype(np.float32)
  a, b = Tensor(an).realize(), Tensor(bn).realize()
  first = [t.numpy() for t in _graph(a, b)]
  rendered = len(renders)
  assert rendered >= 2
  realize._runner_cache.clear()   # as in a new process: only the disk caches are left
  second = [t.numpy() for t in _graph(a, b)]
  assert len(renders) == rendered, f"kernels were rendered again: {renders[rendered:]}"
  for got, want in zip(second, first): assert got.tobytes() == want.tobytes()
  assert_close(second[0], np.maximum(an @ bn, 0) + 1, "matmul", 1e-4, 1e-4)
  assert_close(second[1], np.exp(an * 2).sum(1), "exp sum", 1e-4, 1e-4)

def test_a_setting_that_changes_codegen_changes_the_key(renders):
  a = Tensor(RNG.standard_normal((32, 32)).astype(np.float32)).realize()
  (a * 3).sum(0).numpy()
  rendered = len(renders)
  realize._runner_cache.clear()
  with Context(NOOPT=1): got = (a * 3).sum(0).numpy()
  assert len(renders) == rendered + 1, "NOOPT=1 must not be served the optimized kernel's source"
  assert_close(got, (a.numpy() * 3).sum(0), "NOOPT sum", 1e-4, 1e-4)

def test_kernels_over_variables_are_not_stored(renders):
  x = Tensor(RNG.standard_normal(64).astype(np.float32)).realize()
  n = Variable("n", 1, 64)
  def run(k: int) -> float: return float(x[:n.bind(k)].sum().item())
  assert abs(run(10) - float(x.numpy()[:10].sum())) < 1e-4
  rendered = len(renders)
  realize._runner_cache.clear()
  assert abs(run(20) - float(x.numpy()[:20].sum())) < 1e-4
  assert len(renders) > rendered, "a kernel over a Variable is rendered again (its variables are not stored)"

def test_an_unreadable_entry_is_made_again(renders, tmp_path):
  a = Tensor(RNG.standard_normal(100).astype(np.float32)).realize()
  (a + 5).numpy()
  for path in (tmp_path / "cache" / "codegen").rglob("*"):
    if path.is_file(): path.write_text("{not json")
  realize._runner_cache.clear()
  rendered = len(renders)
  assert_close((a + 5).numpy(), a.numpy() + 5, "after a broken entry", 0, 0)
  assert len(renders) == rendered + 1

def test_off_under_spec():
  with Context(SPEC=1): assert not codegen_cache.enabled()
  with Context(SPEC=0, CODEGEN_CACHE=0): assert not codegen_cache.enabled()
