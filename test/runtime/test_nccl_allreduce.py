"""The all-reduce of multi-device tensors as one NCCL all-reduce (kiln/schedule/multi.py's ALLREDUCE nodes, one
schedule item with an output per device, kiln/runtime/nccl.py's runner) over a fake libnccl (fake_libnccl.c, built
here: its all-reduce combines host memory and counts its calls), in subprocesses so that this process keeps the real
libraries. On the fake libcuda's two GPUs (kernels do nothing there, so only the calls are checked) a sharded sum,
max, matmul and gradient each make one group of one ncclAllReduce per device over one communicator made once, and
every TinyJit call (captured and replayed) one group; on virtual CPU devices (host memory too, with the NCCL path
allowed for them) a sharded sum and max, matmuls and a gradient give NumPy's answer, eagerly and under TinyJit, and
NCCL=0 uses kiln's own all-reduce."""
from __future__ import annotations
import json, os, subprocess, sys
import pytest
from test_cuda_launch_path import fake_driver, HERE, COMPILER   # noqa: F401  (the fixture; test/runtime is on sys.path)

def child(devices: tuple[str, ...]) -> dict:
  """Run in the subprocess: values and the fake's call counts (all-reduce calls, groups, communicators) per step."""
  import ctypes
  import numpy as np
  from kiln import Tensor
  from kiln.engine.jit import TinyJit
  from kiln.runtime import nccl
  from kiln.schedule import multi
  path = os.environ["KILN_FAKE_NCCL"]
  nccl.library_candidates = lambda: [path]
  multi.COLLECTIVE_KINDS = ("CUDA", "CPU")
  fake = ctypes.CDLL(path)
  counts = lambda: [fake.fake_nccl_calls(k) for k in range(3)]
  def delta(before: list[int]) -> list[int]: return [x - y for x, y in zip(counts(), before)]
  rng = np.random.default_rng(0)
  out: dict = {}
  a = np.arange(8, dtype=np.float32).reshape(2, 4)   # one row per device
  before = counts()
  out["rows"] = (Tensor(a).shard(devices, axis=0).sum(0).numpy() == a.sum(0)).all().item()
  out["rows_calls"] = delta(before)
  x, w = rng.random((8, 5), dtype=np.float32), rng.random((5, 3), dtype=np.float32)
  xs = Tensor(x).shard(devices, axis=0)
  before = counts()
  out["sum"] = float(np.abs(xs.sum(0).numpy() - x.sum(0)).max())
  out["sum_calls"] = delta(before)
  before = counts()
  out["max"] = float(np.abs(xs.max(0).numpy() - x.max(0)).max())
  out["max_calls"] = delta(before)
  before = counts()
  contracted = Tensor(x).shard(devices, axis=1) @ Tensor(w).shard(devices, axis=0)
  out["matmul"] = float(np.abs(contracted.numpy() - x @ w).max())
  out["matmul_calls"] = delta(before)
  wt = Tensor(w, requires_grad=True).shard(devices)
  before = counts()
  (xs @ wt).sum().backward()
  out["grad"] = float(np.abs(wt.grad.numpy() - x.T @ np.ones((8, 3), np.float32)).max())
  out["grad_calls"] = delta(before)
  @TinyJit
  def batch_sum(x: Tensor, w: Tensor) -> Tensor: return (x @ w).sum(0).realize()
  out["jit"], out["jit_calls"] = [], []
  for _ in range(4):
    x = rng.random((8, 5), dtype=np.float32)
    before = counts()
    got = batch_sum(Tensor(x).shard(devices, axis=0), wt).numpy()
    out["jit_calls"].append(delta(before)[0])
    out["jit"].append(float(np.abs(got - (x @ w).sum(0)).max()))
  out["replayed"] = batch_sum.captured is not None
  return out

def _run(fake_driver, devices: str, **env_extra) -> dict:
  folder = fake_driver
  library = folder / "libnccl_fake.so"
  if not library.exists():
    subprocess.run([COMPILER, "-O2", "-shared", "-fPIC", "-o", str(library), str(HERE / "fake_libnccl.c")], check=True)
  env = dict(os.environ, LD_LIBRARY_PATH=f"{folder}:{os.environ.get('LD_LIBRARY_PATH', '')}", PTX="1",
             KILN_FAKE_NCCL=str(library), FAKE_CUDA_DEVICES="2", CODEGEN_CACHE="0", CUDA_PATH="", CUDA_HOME="",
             PYTHONPATH=f"{HERE.parent.parent}:{os.environ.get('PYTHONPATH', '')}", **env_extra)
  env.pop("DEV", None)
  done = subprocess.run([sys.executable, __file__, devices], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])

def test_nccl_all_reduce_on_two_fake_gpus(fake_driver):
  out = _run(fake_driver, "CUDA:0,CUDA:1")
  assert out["rows_calls"] == [2, 1, 1]   # one ncclAllReduce per device in one group; the communicator made once
  for step in ("sum", "max", "matmul", "grad"): assert out[f"{step}_calls"] == [2, 1, 0], step
  assert out["jit_calls"] == [2, 2, 2, 2] and out["replayed"]

def test_nccl_all_reduce_values_on_cpu_devices(fake_driver):
  out = _run(fake_driver, "CPU:1,CPU:2")
  assert out["rows"] and out["rows_calls"] == [2, 1, 1]
  for step in ("sum", "max", "matmul", "grad"):
    assert out[f"{step}_calls"] == [2, 1, 0], step
    assert out[step] < 1e-5, step
  assert out["jit_calls"] == [2, 2, 2, 2] and out["replayed"]
  assert max(out["jit"]) < 1e-5

@pytest.mark.parametrize("devices", ["CUDA:0,CUDA:1", "CPU:1,CPU:2"])
def test_nccl_0_uses_kilns_own_all_reduce(fake_driver, devices):
  out = _run(fake_driver, devices, NCCL="0")
  assert out["rows_calls"] == [0, 0, 0] and out["jit_calls"] == [0, 0, 0, 0]
  if devices.startswith("CPU"):
    assert out["rows"] and out["sum"] < 1e-5 and out["matmul"] < 1e-5 and max(out["jit"]) < 1e-5

if __name__ == "__main__":
  print(json.dumps(child(tuple(sys.argv[1].split(",")))))
