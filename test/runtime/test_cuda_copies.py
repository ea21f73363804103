"""Copies between CUDA buffers stay on the GPUs: over the fake libcuda (fake_libcuda.c) with two pretend GPUs, in a
subprocess, a copy between two buffers of one GPU is one device-to-device copy, a copy from one GPU to another one
peer copy, and neither goes through host memory (no device-to-host or host-to-device copy). Sharding a CUDA tensor
over both GPUs and gathering it back moves its slices the same way (the fake's copies are real memcpys, its kernels
do nothing: only values that copies alone made are checked). The device also describes its GPU to the heuristics
(kiln/runtime/gpu_target.py) from what the driver reports (the fake's 132 multiprocessors, sm_90a)."""
from __future__ import annotations
import json, os, sys
from test_cuda_launch_path import fake_driver, HERE   # noqa: F401  (the fixture; test/runtime is on sys.path)
import subprocess

HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, PEER = range(4)

def child() -> dict:
  """Run in the subprocess over the fake driver: the copy counts of each step."""
  import ctypes
  import numpy as np
  from kiln import Tensor
  from kiln.device import Buffer
  from kiln.dtype import dtypes
  fake = ctypes.CDLL(os.environ["KILN_FAKE_CUDA"])
  counts = lambda: [fake.fake_copies(k) for k in range(4)]
  def delta(before: list[int]) -> list[int]: return [x - y for x, y in zip(counts(), before)]
  out: dict = {}
  from kiln.device import Device
  target = Device["CUDA:1"].renderer.target
  out["target"] = [type(target).__name__, target.arch, target.multiprocessors, target.has_local]
  a = Buffer("CUDA:0", 8, dtypes.float32).copyin(memoryview(np.arange(8, dtype=np.float32)))
  b, c = Buffer("CUDA:0", 8, dtypes.float32), Buffer("CUDA:1", 8, dtypes.float32)
  before = counts()
  b.copy_from(a)
  out["same_gpu"] = delta(before)
  before = counts()
  c.copy_from(a)
  out["other_gpu"] = delta(before)
  out["values"] = c.numpy().tolist()
  before = counts()
  c.view(4, dtypes.float32, 8).copy_from(a.view(4, dtypes.float32, 16))   # contiguous runs of larger buffers
  out["runs"] = delta(before)

  t = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device="CUDA:0").realize()
  before = counts()
  moved = t.to("CUDA:1").realize()
  out["to_other_gpu"] = delta(before)
  before = counts()
  sharded = t.shard(("CUDA:0", "CUDA:1"), axis=0).realize()
  sharded.to("CUDA:1").realize()
  out["shard_and_gather"] = delta(before)
  out["moved"] = moved.tolist() == np.arange(12).reshape(4, 3).tolist()
  return out

def test_copies_between_gpus_stay_on_the_gpus(fake_driver):
  env = dict(os.environ, LD_LIBRARY_PATH=f"{fake_driver}:{os.environ.get('LD_LIBRARY_PATH', '')}", PTX="1",
             KILN_FAKE_CUDA=str(fake_driver / "libcuda.so.1"), FAKE_CUDA_DEVICES="2", CODEGEN_CACHE="0",
             CUDA_PATH="", CUDA_HOME="", PYTHONPATH=f"{HERE.parent.parent}:{os.environ.get('PYTHONPATH', '')}")
  env.pop("DEV", None)
  done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["same_gpu"] == [0, 0, 1, 0]
  assert out["other_gpu"] == [0, 0, 0, 1]
  assert out["values"] == list(range(8))
  assert out["runs"] == [0, 0, 0, 1]
  assert out["to_other_gpu"] == [0, 0, 0, 1]
  copies = out["shard_and_gather"]
  assert copies[HOST_TO_DEVICE] == copies[DEVICE_TO_HOST] == 0 and copies[PEER] >= 2
  assert out["moved"]
  assert out["target"] == ["GPUTarget", "sm_90a", 132, True]

if __name__ == "__main__":
  print(json.dumps(child()))
