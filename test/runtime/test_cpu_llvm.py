"""The CPU device's LLVM path (kiln/runtime/ops_cpu.py `cpu_compiler_kind`): CPU_LLVM=1, or no C compiler on PATH with
llvmlite installed, makes the CPU device compile its kernels in process with LLVM, with one line saying so at
DEBUG>=1; its results are the C path's bit for bit, TinyJit replays run as one LLVM graph, and threads come from the
pool (the LLVM-built one where there is no compiler)."""
from __future__ import annotations
import os, subprocess, sys, textwrap
import numpy as np
import pytest

pytest.importorskip("llvmlite")

from kiln import Tensor, TinyJit, Device   # noqa: E402
from kiln.device import CompileError   # noqa: E402
from kiln.helpers import Context   # noqa: E402
from kiln.runtime import ops_cpu   # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def test_the_compiler_kind_follows_the_settings_and_path(monkeypatch):
  monkeypatch.setattr(ops_cpu, "_compiler_on_path", lambda path: None)
  with Context(CPU_LLVM=0, CC=""): assert ops_cpu.cpu_compiler_kind() == "llvm"   # no compiler: LLVM
  with Context(CPU_LLVM=0, CC="gcc"): assert ops_cpu.cpu_compiler_kind() == "c"   # CC names one
  monkeypatch.setattr(ops_cpu, "_compiler_on_path", lambda path: "gcc")
  with Context(CPU_LLVM=0, CC=""): assert ops_cpu.cpu_compiler_kind() == "c"
  with Context(CPU_LLVM=1, CC=""): assert ops_cpu.cpu_compiler_kind() == "llvm"

def test_no_compiler_and_no_llvmlite_says_how_to_get_one(monkeypatch):
  monkeypatch.setattr(ops_cpu, "_compiler_on_path", lambda path: None)
  real_find_spec = ops_cpu.importlib.util.find_spec
  def find_spec(name: str): return None if name == "llvmlite" else real_find_spec(name)
  monkeypatch.setattr(ops_cpu.importlib.util, "find_spec", find_spec)
  with Context(CPU_LLVM=0, CC=""):
    assert ops_cpu.cpu_compiler_kind() == "c"
    with pytest.raises(CompileError, match="no C compiler found.*pip install llvmlite"): ops_cpu.find_c_compiler()

def _mlp_step(device: str) -> tuple[list[np.ndarray], str]:
  """Three replays of a jitted two-layer forward on `device`; the replays' outputs and the class of its graph."""
  rng = np.random.default_rng(3)
  x, w1, w2 = (Tensor(rng.standard_normal(shape, dtype=np.float32), device=device).realize()
               for shape in ((32, 96), (96, 64), (64, 16)))
  @TinyJit
  def forward(t: Tensor) -> Tensor: return ((t @ w1).relu() @ w2).softmax(-1).realize()
  outs = [forward(x).numpy() for _ in range(4)]
  graphs = [type(launch).__name__ for launch in forward.captured._launches if not callable(getattr(launch, "func", 0))]
  return outs, ",".join(graphs)

def test_cpu_llvm_device_matches_the_c_path_and_replays_one_llvm_graph():
  if not ops_cpu.c_compiler_found(): pytest.skip("no C compiler to compare with")
  with Context(CPU_LLVM=1): llvm_device = Device["CPU:3"]
  with Context(CPU_LLVM=0): c_device = Device["CPU:4"]
  assert type(llvm_device.compiler).__name__ == "LLVMCompiler" and type(c_device.compiler).__name__ == "ClangCompiler"
  llvm_outs, llvm_graphs = _mlp_step("CPU:3")
  c_outs, c_graphs = _mlp_step("CPU:4")
  for got, want in zip(llvm_outs, c_outs): np.testing.assert_array_equal(got, want)
  assert llvm_graphs == "LLVMGraph" and c_graphs == "CPUGraph", (llvm_graphs, c_graphs)

NO_COMPILER_SCRIPT = textwrap.dedent("""
  import numpy as np
  from kiln import Tensor, Device
  from kiln.runtime import threadpool
  x = np.arange(1 << 20, dtype=np.float32) / (1 << 20)
  a = Tensor(x)
  print("compiler", type(Device["CPU"].compiler).__name__)
  print("sum", float(a.sum().numpy()), float(x.astype(np.float64).sum()))
  print("pool", type(threadpool._pools[2].lib).__name__)
""")

def test_without_a_compiler_on_path_the_cpu_device_falls_back_to_llvm(tmp_path):
  env = {**os.environ, "PATH": str(tmp_path), "DEBUG": "1", "THREADS": "2", "PYTHONPATH": REPO,
         "CACHEDB": str(tmp_path / "cache")}
  for name in ("CC", "CPU_LLVM", "DEV", "CPU", "LLVM", "PYTHON"): env.pop(name, None)
  result = subprocess.run([sys.executable, "-c", NO_COMPILER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  notes = [line for line in lines if "no C compiler found" in line]
  assert len(notes) == 1 and "LLVM" in notes[0], result.stdout
  values = dict(line.split(" ", 1) for line in lines if line.split(" ", 1)[0] in ("compiler", "sum", "pool"))
  assert values["compiler"] == "LLVMCompiler" and values["pool"] == "LLVMPoolLibrary", values
  got, want = map(float, values["sum"].split())
  assert abs(got - want) <= 1e-6 * want, values["sum"]
