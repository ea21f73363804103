"""Settings (kiln/helpers.py): every setting tinygrad 0.11 declares is accepted by Context, ContextVar and the
environment; the ones kiln has behaviour for do what tinygrad's do; the rest are documented as having no effect."""
import os, pathlib, subprocess, sys
import numpy as np
import pytest
from kiln import Tensor, TinyJit, dtypes
import kiln.helpers as helpers
from kiln.helpers import Context, ContextVar, getenv

# tinygrad 0.11's settings (ContextVars in tinygrad/helpers.py, uop/spec.py and uop/ops.py): the module-level name
# tinygrad gives each -> its key and default there
TINYGRAD_SETTINGS = {
  "DEBUG": ("DEBUG", 0), "IMAGE": ("IMAGE", 0), "BEAM": ("BEAM", 0), "NOOPT": ("NOOPT", 0), "JIT": ("JIT", 1),
  "JIT_BATCH_SIZE": ("JIT_BATCH_SIZE", 32), "WINO": ("WINO", 0), "CAPTURING": ("CAPTURING", 1),
  "TRACEMETA": ("TRACEMETA", 1), "USE_TC": ("TC", 1), "TC_SELECT": ("TC_SELECT", -1), "TC_OPT": ("TC_OPT", 0),
  "AMX": ("AMX", 0), "TRANSCENDENTAL": ("TRANSCENDENTAL", 1), "TC_SEARCH_OVER_SHAPE": ("TC_SEARCH_OVER_SHAPE", 1),
  "NOLOCALS": ("NOLOCALS", 0), "FUSE_ARANGE": ("FUSE_ARANGE", 1), "FUSE_CONV_BW": ("FUSE_CONV_BW", 0),
  "SPLIT_REDUCEOP": ("SPLIT_REDUCEOP", 1), "NO_MEMORY_PLANNER": ("NO_MEMORY_PLANNER", 0), "RING": ("RING", 1),
  "PICKLE_BUFFERS": ("PICKLE_BUFFERS", 1), "PROFILE": ("PROFILE", 0), "LRU": ("LRU", 1),
  "CACHELEVEL": ("CACHELEVEL", 2), "IGNORE_BEAM_CACHE": ("IGNORE_BEAM_CACHE", 0), "DEVECTORIZE": ("DEVECTORIZE", 1),
  "DISABLE_COMPILER_CACHE": ("DISABLE_COMPILER_CACHE", 0), "DONT_REALIZE_EXPAND": ("DONT_REALIZE_EXPAND", 0),
  "DONT_GROUP_REDUCES": ("DONT_GROUP_REDUCES", 0), "QUANTIZE": ("QUANTIZE", 0),
  "VALIDATE_WITH_CPU": ("VALIDATE_WITH_CPU", 0), "DISABLE_FAST_IDIV": ("DISABLE_FAST_IDIV", 0),
  "CORRECT_DIVMOD_FOLDING": ("CORRECT_DIVMOD_FOLDING", 0), "FUSE_OPTIM": ("FUSE_OPTIM", 0),
  "ALLOW_DEVICE_USAGE": ("ALLOW_DEVICE_USAGE", 1), "MAX_BUFFER_SIZE": ("MAX_BUFFER_SIZE", 0),
  "AMD_LLVM": ("AMD_LLVM", 1), "IGNORE_OOB": ("IGNORE_OOB", 1), "VIZ": ("VIZ", 0),
  "TRACK_MATCH_STATS": ("TRACK_MATCH_STATS", 0),
}
# where kiln's default differs from tinygrad's, and why
KILN_DEFAULTS = {"JIT_BATCH_SIZE": 0}   # one CPU graph per run of kernels: each graph is a compile

@pytest.mark.parametrize("name", sorted(TINYGRAD_SETTINGS))
def test_every_tinygrad_setting_is_importable_and_settable(name):
  key, default = TINYGRAD_SETTINGS[name]
  var = getattr(helpers, name)
  assert isinstance(var, ContextVar) and ContextVar.registry[key] is var
  if key not in os.environ: assert var.value == KILN_DEFAULTS.get(name, default)
  before = var.value
  with Context(**{key: 7}): assert var.value == 7
  assert var.value == before

def test_no_effect_settings_are_marked_and_documented():
  docs = (pathlib.Path(__file__).parent.parent / "docs" / "env_vars.md").read_text()
  effect_table, no_effect_table = docs.split("## tinygrad's settings that do nothing in kiln")
  for key in ("WINO", "IMAGE", "FUSE_ARANGE", "IGNORE_OOB", "TC_SELECT"):
    assert not ContextVar.registry[key].effect
    assert f"| `{key}` |" in no_effect_table and f"| `{key}` |" not in effect_table
  for key in ("NO_MEMORY_PLANNER", "LRU", "DISABLE_COMPILER_CACHE", "IGNORE_BEAM_CACHE", "MAX_BUFFER_SIZE",
              "ALLOW_DEVICE_USAGE", "JIT_BATCH_SIZE", "DISABLE_FAST_IDIV", "TRACEMETA", "BEAM", "TRANSCENDENTAL",
              "SPLIT_REDUCEOP", "VALIDATE_WITH_CPU"):
    assert ContextVar.registry[key].effect and f"| `{key}` |" in effect_table

def test_a_typo_still_raises():
  with pytest.raises(ValueError, match="unknown setting"):
    with Context(WINOO=1): pass
  with pytest.raises(ValueError, match="DEBGU"): Context(DEBUG=1, DEBGU=2)

@pytest.fixture
def scratch_setting():
  """Forget the settings a test declares."""
  declared = set(ContextVar.registry)
  yield
  for key in set(ContextVar.registry) - declared: del ContextVar.registry[key]

def test_contextvar_without_a_doc_as_in_tinygrad(scratch_setting, monkeypatch):
  monkeypatch.setenv("KILN_TEST_SETTING_B", "5")
  a, b = ContextVar("KILN_TEST_SETTING_A", 3), ContextVar("KILN_TEST_SETTING_B", 0)
  assert (a.value, b.value, a.doc) == (3, 5, "")
  assert a > 2 and a >= 3 and a < 4 and bool(b)
  with Context(KILN_TEST_SETTING_A=9): assert a.value == 9
  assert a.value == 3
  with pytest.raises(RuntimeError, match="declared already"): ContextVar("KILN_TEST_SETTING_A", 0)
  with pytest.raises(RuntimeError, match="declared already"): ContextVar("WINO", 0)

def test_getenv_reads_any_name_with_the_type_of_its_default(monkeypatch):
  monkeypatch.setenv("KILN_TEST_GETENV_INT", "12")
  monkeypatch.setenv("KILN_TEST_GETENV_STR", "abc")
  assert getenv("KILN_TEST_GETENV_INT") == 12 and getenv("KILN_TEST_GETENV_STR", "") == "abc"
  assert getenv("KILN_TEST_GETENV_UNSET", 4) == 4 and getenv("KILN_TEST_GETENV_UNSET2", "x") == "x"

def test_settings_come_from_the_environment():
  env = {**os.environ, "WINO": "1", "RING": "2", "TRACEMETA": "0", "NO_MEMORY_PLANNER": "1", "IGNORE_OOB": "0"}
  code = ("from kiln.helpers import WINO, RING, TRACEBACK_SOURCE, NO_MEMORY_PLANNER, IGNORE_OOB, getenv\n"
          "print(WINO.value, RING.value, TRACEBACK_SOURCE.value, NO_MEMORY_PLANNER.value, IGNORE_OOB.value, "
          "getenv('WINO'))")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
  assert out.split() == ["1", "2", "0", "1", "0", "1"]

# ---- the settings kiln has behaviour for ----

def test_tracemeta_is_traceback_source():
  assert helpers.TRACEMETA is helpers.TRACEBACK_SOURCE
  assert (Tensor([1.0]) + 2).uop.meta is not None
  with Context(TRACEMETA=0): assert (Tensor([1.0]) + 3).uop.meta is None

def _chain() -> Tensor:
  x = Tensor(np.arange(16, dtype=np.float32)).realize()
  y = x
  for i in range(4): y = (y * 2 + i).contiguous()   # four same-size kernels: the first one's buffer is free by the third
  return y

def test_no_memory_planner_gives_every_intermediate_its_own_buffer():
  from kiln.schedule.kernelize import create_schedule
  def distinct_buffers() -> int:
    return len({id(b) for item in create_schedule([_chain().uop]).items for b in item.bufs})
  planned = distinct_buffers()
  with Context(NO_MEMORY_PLANNER=1): unplanned = distinct_buffers()
  assert unplanned > planned, (planned, unplanned)
  want = np.arange(16, dtype=np.float32)
  for i in range(4): want = want * 2 + i
  with Context(NO_MEMORY_PLANNER=1): np.testing.assert_array_equal(_chain().numpy(), want)

def test_lru_keeps_freed_memory_only_when_on():
  from kiln.device import Buffer, Device
  allocator = Device["CPU"].allocator
  nbytes = 4 * 12345   # a size nothing else uses
  allocator.free_cache()   # what earlier tests freed may fill the cache to its limit, where nothing more is kept
  for lru, kept in ((1, 1), (0, 0)):
    allocator.cache.pop(nbytes, None)
    allocator.cached_bytes = sum(size * len(handles) for size, handles in allocator.cache.items())
    with Context(LRU=lru):
      buffer = Buffer("CPU", 12345, dtypes.float32).allocate()
      del buffer
    assert len(allocator.cache.get(nbytes, [])) == kept, f"LRU={lru}"

def test_max_buffer_size_refuses_larger_buffers():
  from kiln.device import Buffer
  with Context(MAX_BUFFER_SIZE=10):
    Buffer("CPU", 10, dtypes.float32).allocate()
    with pytest.raises(RuntimeError, match="MAX_BUFFER_SIZE"): Buffer("CPU", 11, dtypes.float32).allocate()
    with pytest.raises(RuntimeError, match="MAX_BUFFER_SIZE"): Tensor.ones(11).contiguous().realize()

def test_allow_device_usage_refuses_to_open_devices():
  from kiln.device import Device
  try:
    with Context(ALLOW_DEVICE_USAGE=0):
      with pytest.raises(RuntimeError, match="ALLOW_DEVICE_USAGE"): Device["CPU:7"]
      assert Device["PYTHON:7"].device == "PYTHON:7"   # the emulator (and DISK) stay allowed, as in tinygrad
      assert Device["CPU"] is not None                 # a device opened earlier stays usable
    assert Device["CPU:7"].device == "CPU:7"
  finally:
    for name in ("CPU:7", "PYTHON:7"): Device._opened.pop(name, None)

def test_disable_compiler_cache_neither_reads_nor_writes(tmp_path, monkeypatch):
  from kiln.device import Device
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  compiler = Device["CPU"].compiler
  src = "int kiln_settings_test(void) { return 42; }\n"
  with Context(DISABLE_COMPILER_CACHE=1): compiler.compile_cached(src)
  assert not compiler.cache_path(src).exists()
  lib = compiler.compile_cached(src)
  assert compiler.cache_path(src).read_bytes() == lib
  compiler.cache_path(src).write_bytes(b"not a library")
  assert compiler.compile_cached(src) == b"not a library"   # read from the cache...
  with Context(DISABLE_COMPILER_CACHE=1): assert compiler.compile_cached(src) != b"not a library"   # ...not now

def test_ignore_beam_cache_skips_reading_it(tmp_path, monkeypatch):
  from kiln.codegen.opt.search import cache_get, cache_put
  from kiln.codegen.opt.kernel import Opt, OptOps
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  opts = [Opt(OptOps.UPCAST, 0, 4)]
  cache_put("kiln-settings-test", opts)
  assert cache_get("kiln-settings-test") == opts
  with Context(IGNORE_BEAM_CACHE=1): assert cache_get("kiln-settings-test") is None

def test_disable_fast_idiv_keeps_the_division():
  from kiln.engine.realize import _runner_cache
  xs = np.arange(-50, 50, dtype=np.int32)
  sources = {}
  for flag in (0, 1):
    with Context(TRANSCENDENTAL=2, DISABLE_FAST_IDIV=flag):
      before = set(_runner_cache)
      got = (Tensor(xs, device="CPU") // 7).numpy()
      sources[flag] = "".join(r.source for k, r in _runner_cache.items() if k not in before)
    np.testing.assert_array_equal(got, xs // 7)
  assert "/7)" not in sources[0].replace(" ", "") and ">>" in sources[0]   # multiply-shift
  assert "/7)" in sources[1].replace(" ", "")

def test_jit_batch_size_caps_the_graphs():
  @TinyJit
  def step(x: Tensor) -> Tensor:
    for _ in range(7): x = (x * 2 + 1).contiguous()
    return x.realize()
  want = np.ones(8, np.float32)
  for _ in range(7): want = want * 2 + 1
  with Context(JIT_BATCH_SIZE=2):
    for _ in range(3): got = step(Tensor.ones(8).contiguous().realize()).numpy()
  np.testing.assert_array_equal(got, want)
  sizes = [len(launch.items) for launch in step.captured._launches if hasattr(launch, "items")]
  assert sizes[:2] == [2, 4], sizes   # 2 kernels, then twice as many; the last kernel is left alone

def test_split_reduceop_off_reduces_on_one_thread():
  from kiln.engine.realize import _runner_cache
  x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
  sources = {}
  for flag in (1, 0):
    with Context(SPLIT_REDUCEOP=flag):
      before = set(_runner_cache)
      total = Tensor(x, device="CPU").sum().item()
      sources[flag] = "".join(r.source for k, r in _runner_cache.items() if k not in before)
    assert abs(total - float(x.astype(np.float64).sum())) < 1e-2, (flag, total)
  assert "_part" in sources[1] and "_part" not in sources[0]   # chunks reduced apart, then combined; or not at all

def test_validate_with_cpu_reruns_kernels_on_cpu(monkeypatch):
  from kiln.engine import realize
  x = np.array([1.0, 2.0, 3.0], np.float32)
  with Context(VALIDATE_WITH_CPU=1):
    np.testing.assert_allclose((Tensor(x, device="PYTHON") * 2).exp().numpy(), np.exp(x * 2), rtol=1e-6)
  cpu_runs = []
  real_get_runner = realize.get_runner
  class WrongOnCPU:
    """The CPU's runner, with its output overwritten by zeros (as if the other device were wrong)."""
    def __init__(self, runner): self.runner = runner
    def __call__(self, bufs, vals, wait=False):
      cpu_runs.append(self.runner.name)
      self.runner(bufs, vals, wait)
      bufs[0].copyin(memoryview(bytearray(bufs[0].nbytes)))
  def get_runner(device, ast, *args):
    runner = real_get_runner(device, ast, *args)
    return WrongOnCPU(runner) if device == "CPU" else runner
  monkeypatch.setattr(realize, "get_runner", get_runner)
  (Tensor(x, device="PYTHON") + 1).numpy()   # off: the CPU is not asked
  assert not cpu_runs
  with Context(VALIDATE_WITH_CPU=1):
    with pytest.raises(AssertionError, match="on PYTHON and CPU"): (Tensor(x, device="PYTHON") + 5).numpy()
  assert cpu_runs

def test_a_setting_set_directly_or_by_context_reschedules_cached_graphs():
  from kiln.schedule import kernelize
  x = Tensor.rand(4, 8).realize()
  def kernels() -> int: return len(x.softmax(-1).schedule())
  fused = kernels()
  with Context(ROW_FUSION=0): unfused = kernels()
  assert unfused > fused
  assert kernels() == fused   # the cache's snapshot of the settings is taken again after the context
  old = kernelize.ROW_FUSION.value
  try:
    kernelize.ROW_FUSION.value = 0   # a plain assignment counts as a change too
    assert kernels() == unfused
  finally: kernelize.ROW_FUSION.value = old
  assert kernels() == fused
