"""The CUDA device's host-side launch path without a GPU: kiln's CUDA device over a fake libcuda (fake_libcuda.c,
built here with the C compiler; memory is host memory, kernels do nothing, calls are counted), in a subprocess so
that this process's driver binding stays the real one. Checked: an eager kernel is one cuLaunchKernel; a TinyJit
replay is one cuGraphLaunch; the executable each replay launches holds exactly the arguments of that replay's
buffers and variables (its fresh outputs alternating between buffers, outputs kept alive, a Variable's value
changing), with no node updated once the alternating outputs have an executable each; the graph's nodes form a
chain (programmatic edges, through cuGraphAddDependencies_v2), or with CUDAGraph.PARALLEL wait only for the nodes
whose memory they use; host memory that from_blob uses in place is registered once per range and unregistered with
its last tensor."""
from __future__ import annotations
import json, os, pathlib, shutil, subprocess, sys
import pytest

HERE = pathlib.Path(__file__).resolve().parent
COMPILER = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")

def child() -> dict:
  """Run in the subprocess, over the fake driver: the counts and checks the test asserts, as a dict."""
  import ctypes
  from kiln import Tensor, TinyJit, Variable
  from kiln.runtime import cuda_driver as cuda
  fake = ctypes.CDLL(os.environ["KILN_FAKE_CUDA"])
  counts = lambda: (fake.fake_launches(), fake.fake_graph_launches(), fake.fake_setparams())
  # each executable's node arguments as the simulated driver holds them: copied at instantiation and update
  execs: dict[int, list[tuple]] = {}
  launched: list[list[tuple]] = []
  node_args = lambda graph, i: tuple(v.value for v in graph.packed[i].values)
  instantiate, update, launch_exec = cuda.Graph.instantiate, cuda.Graph.update, cuda.Graph.launch_exec
  def fake_instantiate(self):
    handle = instantiate(self)
    execs[handle] = list(self._added)
    return handle
  def fake_update(self, handle, index):
    update(self, handle, index)
    execs[handle][index] = node_args(self, index)
  def fake_launch(self, handle):
    launch_exec(self, handle)
    launched.append(list(execs[handle]))
  original_init = cuda.Graph.__init__
  def init(self, context, launches, dependencies=None, programmatic=None):
    packed = [launch if isinstance(launch, cuda.PackedLaunch) else cuda.PackedLaunch(*launch) for launch in launches]
    self._added = [tuple(v.value for v in p.values) for p in packed]   # what the nodes were added with
    original_init(self, context, packed, dependencies, programmatic)
    execs[self.exec] = list(self._added)
  cuda.Graph.__init__, cuda.Graph.instantiate, cuda.Graph.update, cuda.Graph.launch_exec = \
    init, fake_instantiate, fake_update, fake_launch

  def expected(jit) -> list[tuple]:   # what each node of the replay's graph must run with: its buffers and values now
    (graph,) = jit.captured._launches
    return [(*[item.bufs[p]._buf.ptr for p in item.runner.params], *[item.var_vals[v] for v in item.runner.vars])
            for item in graph.items]

  out: dict = {}
  a = Tensor.ones(16, device="CUDA").realize()
  (a + 1).realize()
  before = counts()
  for _ in range(10): (a + 1).realize()
  out["eager"] = [x - y for x, y in zip(counts(), before)]

  step = TinyJit(lambda x: ((x + 1).contiguous() * 2).contiguous())
  for _ in range(3): step(a)
  right = []
  before = counts()
  for _ in range(20):
    step(a)
    right.append(launched[-1] == expected(step))
  out["replay"] = [x - y for x, y in zip(counts(), before)]
  out["chain_dependencies"] = step.captured._launches[0].dependencies
  out["programmatic_edges"] = [step.captured._launches[0].graph.programmatic, fake.fake_edges()]
  from kiln.runtime.ops_cuda import CUDAGraph
  for parallel in (False, True):   # a chain by default; with PARALLEL, the nodes wait only for the memory they use
    CUDAGraph.PARALLEL = parallel
    branches = TinyJit(lambda x: (x + 1).contiguous() + (x * 2).contiguous())
    for _ in range(3): branches(a)
    out[f"branch_dependencies_{parallel}"] = branches.captured._launches[0].dependencies
  CUDAGraph.PARALLEL = False
  out["replay_args_right"] = all(right)
  kept, right = [], []   # outputs kept alive: every replay has a new output buffer (executables are updated)
  for _ in range(8):
    kept.append(step(a))
    right.append(launched[-1] == expected(step))
  out["kept_args_right"] = all(right)
  out["kept_distinct_outputs"] = len({t.uop.base.buffer._buf.ptr for t in kept})

  def chain(x):
    for _ in range(40): x = (x * 0.5 + 1).contiguous()
    return x
  long, right = TinyJit(chain), []   # a large graph: its one executable is updated, never a second one made
  for k in range(6):
    long(a)
    if k >= 2: right.append(launched[-1] == expected(long))
  out["long_args_right"] = all(right)
  out["long_execs"] = len(long.captured._launches[0].execs)

  @TinyJit
  def shifted(x, n): return (x[n:n + 4] * 3).contiguous() + 1
  v = Variable("n", 0, 12)
  right = []
  for k in range(10):
    shifted(a, v.bind(k % 5))
    if k >= 2: right.append(launched[-1] == expected(shifted))
  out["variable_args_right"] = all(right)
  out["variable_values"] = sorted({args[-1] for launch in launched[-8:] for args in launch if len(args) > 2})

  # host memory used in place (from_blob on the GPU): registered once per range, unregistered with its last tensor
  import gc
  import numpy as np
  host = np.arange(8, dtype=np.float32)
  blob = Tensor.from_blob(host.ctypes.data, (8,), device="CUDA")
  half = Tensor.from_blob(host.ctypes.data + 16, (4,), device="CUDA")   # inside the registered range: reused
  host[1] = -5.0
  out["blob_sees_writes"] = blob.tolist()[:2] == [0.0, -5.0] and half.tolist() == [4.0, 5.0, 6.0, 7.0]
  out["blob_registered"] = fake.fake_registered()
  big = np.zeros(3 * 4096 // 4, dtype=np.float32)   # pages of its own, then one more reaching past them: one range
  wide = Tensor.from_blob(big.ctypes.data + 4096, (1024,), device="CUDA")   # registered for the pages it touches
  whole = Tensor.from_blob(big.ctypes.data, (3 * 1024,), device="CUDA")     # only the pages not yet registered
  out["blob_ranges"] = fake.fake_registered()
  empty = Tensor.from_blob(0, (0, 3), device="CUDA")   # no memory: nothing registered
  out["blob_empty"] = [empty.shape == (0, 3), fake.fake_registered() == out["blob_ranges"]]
  del blob, half, wide, whole
  gc.collect()
  out["blob_unregistered"] = fake.fake_registered()
  return out

@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> pathlib.Path:
  if COMPILER is None: pytest.skip("no C compiler to build the fake libcuda")
  folder = tmp_path_factory.mktemp("fake_cuda")
  subprocess.run([COMPILER, "-O2", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"),
                  str(HERE / "fake_libcuda.c")], check=True)
  return folder

def test_launch_path_over_a_fake_driver(fake_driver):
  env = dict(os.environ, LD_LIBRARY_PATH=f"{fake_driver}:{os.environ.get('LD_LIBRARY_PATH', '')}", PTX="1",
             KILN_FAKE_CUDA=str(fake_driver / "libcuda.so.1"), CODEGEN_CACHE="0", CUDA_PATH="", CUDA_HOME="",
             PYTHONPATH=f"{HERE.parent.parent}:{os.environ.get('PYTHONPATH', '')}")
  env.pop("DEV", None)
  done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["eager"] == [10, 0, 0]          # one cuLaunchKernel a call, no graph
  launches, graph_launches, updates = out["replay"]
  assert (launches, graph_launches) == (0, 20) and updates <= 2   # one cuGraphLaunch a replay; alternating outputs:
  assert out["replay_args_right"]                                 # an executable each, updated at most once
  assert out["chain_dependencies"] == [[], [0]]
  assert out["programmatic_edges"][0] and out["programmatic_edges"][1] >= 1   # cuGraphAddDependencies_v2 made them
  assert out["branch_dependencies_False"] == [[], [0], [1]]
  assert out["branch_dependencies_True"] == [[], [], [0, 1]]   # two kernels that read the input, then their sum
  assert out["kept_args_right"] and out["kept_distinct_outputs"] == 8
  assert out["long_args_right"] and out["long_execs"] == 1
  assert out["variable_args_right"] and out["variable_values"] == [0, 1, 2, 3, 4]
  assert out["blob_sees_writes"] and out["blob_registered"] == 1
  assert out["blob_ranges"] >= 3 and out["blob_unregistered"] == 0 and all(out["blob_empty"])

if __name__ == "__main__":
  print(json.dumps(child()))
