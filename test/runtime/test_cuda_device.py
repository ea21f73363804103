"""The CUDA device (kiln/runtime/ops_cuda.py). Without a GPU: importing works, opening it raises one RuntimeError,
launch sizes travel through the codegen cache. With one: kernels match the CPU (bit for bit on elementwise math)."""
import numpy as np
import pytest
from kiln import Tensor, Device, dtypes
from kiln.engine import codegen_cache
from kiln.runtime import cuda_driver as cuda

needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@pytest.mark.skipif(cuda.available(), reason="a GPU is here")
def test_opening_without_a_gpu_raises_one_runtime_error():
  import kiln.runtime.ops_cuda  # noqa: F401  (imports everywhere)
  with pytest.raises(RuntimeError, match="cannot open CUDA: CUDA is not available"):
    Device["CUDA"]

def test_launch_sizes_travel_through_the_codegen_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setattr(codegen_cache, "enabled", lambda: True)
  ast = (Tensor.empty(8) + 1).schedule()[-1].ast
  launch = ((4, 1, 1), (256, 1, 1))
  codegen_cache.store("CPU", ast, codegen_cache.CodegenEntry("E_8", "src", 8, (0, 1), launch))
  entry = codegen_cache.lookup("CPU", ast)
  assert entry is not None and entry.launch == launch

def _pair(shape, dtype=np.float32, seed=0):
  x = np.random.default_rng(seed).uniform(-3, 3, shape).astype(dtype)
  return Tensor(x, device="CUDA"), Tensor(x, device="CPU")

@needs_gpu
def test_elementwise_matches_the_cpu_bit_for_bit():
  (g, c), (g2, c2) = _pair((1000, 37)), _pair((1000, 37), seed=1)
  for fn in (lambda a, b: ((a * b + 1).relu() * 0.5).exp(),
             lambda a, b: a.sin() * (b.abs() + 0.1).log2().cos() + a.sigmoid(),
             lambda a, b: (a / b).tanh() + a.abs().sqrt() - (a.half() * b.half()).float(),
             lambda a, b: (a.cast(dtypes.int32) // 3 + b.cast(dtypes.int32) % 2).cast(dtypes.float32)):
    got, want = fn(g, g2).numpy(), fn(c, c2).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

@needs_gpu
def test_reductions_and_matmul_match_the_cpu():
  (g, c), (gw, cw) = _pair((300, 200)), _pair((200, 50), seed=2)
  np.testing.assert_allclose(g.sum(axis=1).numpy(), c.sum(axis=1).numpy(), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(g.max(axis=0).numpy(), c.max(axis=0).numpy())
  np.testing.assert_allclose(g.softmax(axis=1).numpy(), c.softmax(axis=1).numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose((g @ gw).numpy(), (c @ cw).numpy(), rtol=1e-4, atol=1e-4)
  assert g.sum().item() == pytest.approx(c.sum().item(), rel=1e-5)

@needs_gpu
def test_grouped_reductions_match_the_cpu():
  (g, c) = _pair((300, 5000))
  np.testing.assert_allclose(g.sum(axis=1).numpy(), c.sum(axis=1).numpy(), rtol=1e-5, atol=1e-3)
  np.testing.assert_array_equal(g.max(axis=1).numpy(), c.max(axis=1).numpy())
  np.testing.assert_allclose(g.sum().item(), c.sum().item(), rtol=1e-5)
  np.testing.assert_allclose(g.half().mean(axis=1).numpy(), c.half().mean(axis=1).numpy(), rtol=1e-2, atol=1e-3)
  np.testing.assert_allclose(g.softmax(axis=1).numpy(), c.softmax(axis=1).numpy(), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g.layernorm().numpy(), c.layernorm().numpy(), rtol=1e-4, atol=1e-4)
  (g3, c3) = _pair((7, 1031))   # rows that the block's 256 threads do not divide
  np.testing.assert_allclose(g3.log_softmax(axis=1).numpy(), c3.log_softmax(axis=1).numpy(), rtol=1e-5, atol=1e-5)

@needs_gpu
def test_grid_wide_full_reductions_match_the_cpu_launch_after_launch():
  (g, c) = _pair((3, 1000003))   # over 1M elements: every block adds a share, the last one combines
  for _ in range(3):   # the arrival counter must be back at zero for the next launch
    np.testing.assert_allclose(g.sum().item(), c.sum().item(), rtol=1e-5)
  assert g.max().item() == c.max().item() and g.min().item() == c.min().item()
  np.testing.assert_allclose(g.mean().item(), c.mean().item(), rtol=1e-5, atol=1e-6)
  assert (g > 0).sum().item() == (c > 0).sum().item()

@needs_gpu
def test_tinyjit_replays_through_one_cuda_graph_with_swapped_inputs_and_fresh_outputs(monkeypatch):
  from kiln import TinyJit
  from kiln.engine import graph
  from kiln.runtime.ops_cuda import CUDAGraph
  assert graph.graph_for("CUDA:0") is CUDAGraph   # registered: TinyJit batches CUDA kernels into one graph
  @TinyJit
  def f(a, b):
    y = (a * 2 + b).contiguous()
    return (y * a).sum(), y + 1
  rng, outs = np.random.default_rng(3), []
  for _ in range(6):
    an, bn = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    s, y = f(Tensor(an, device="CUDA"), Tensor(bn, device="CUDA"))
    outs.append((s, y, an, bn))
  assert any(isinstance(launch, CUDAGraph) for launch in f.captured._launches)
  for s, y, an, bn in outs:   # outputs held across replays keep their own values
    np.testing.assert_allclose(y.numpy(), an * 2 + bn + 1, rtol=1e-6)
    np.testing.assert_allclose(s.numpy(), ((an * 2 + bn) * an).sum(), rtol=1e-5)

@needs_gpu
@pytest.mark.parametrize("programmatic", [False, True])
def test_graph_chains_wait_for_the_kernel_before(monkeypatch, programmatic):
  """A replayed chain of kernels, each reading all of the one before it (many blocks a kernel), on new inputs every
  replay: with programmatic edges (CUDAGraph.PROGRAMMATIC) a kernel starts early, and its griddepcontrol.wait must
  still see the whole previous output (an early read would see the last replay's values)."""
  from kiln import TinyJit
  from kiln.runtime.ops_cuda import CUDAGraph
  monkeypatch.setattr(CUDAGraph, "PROGRAMMATIC", programmatic)
  def chain(x):
    for _ in range(6):
      x = (x * 0.5 + 1).contiguous()
      x = (x - x.sum(-1, keepdim=True) * (1 / 4096)).contiguous()
    return x
  step, rng = TinyJit(chain), np.random.default_rng(5)
  for _ in range(6):
    a = rng.standard_normal((64, 4096)).astype(np.float32)
    want = a.astype(np.float64)
    for _ in range(6):
      want = want * 0.5 + 1
      want = want - want.sum(-1, keepdims=True) / 4096
    np.testing.assert_allclose(step(Tensor(a, device="CUDA")).numpy(), want, rtol=1e-4, atol=1e-4)
  (graph,) = [launch for launch in step.captured._launches if isinstance(launch, CUDAGraph)]
  assert graph.graph.programmatic == programmatic

@needs_gpu
def test_small_copies_in_are_queued_in_order():
  """Small copies in, into one buffer between kernels that read it (an LLM decode step's input) and into many
  buffers, land in order."""
  rng = np.random.default_rng(7)
  x = Tensor.zeros(16, device="CUDA").contiguous().realize()
  outs, wants = [], []
  for _ in range(20):   # the LLM decode pattern: write the step input, run kernels that read it
    values = rng.standard_normal(16).astype(np.float32)
    x.uop.base.buffer.copyin(memoryview(values).cast("B"))
    outs.append((x * 2 + 1).realize())
    wants.append(values * 2 + 1)
  many = [rng.standard_normal(int(rng.integers(1, 200))).astype(np.float32) for _ in range(20)]
  tensors = [Tensor(a, device="CUDA").realize() for a in many]
  for out, want in zip(outs, wants): np.testing.assert_array_equal(out.numpy(), want)
  for t, a in zip(tensors, many): np.testing.assert_array_equal(t.numpy(), a)

@needs_gpu
def test_copies_between_devices_and_a_second_name():
  x = np.arange(1031, dtype=np.float32)
  t = Tensor(x, device="CUDA:0")
  assert t.device == "CUDA"
  np.testing.assert_array_equal((t + 1).to("CPU").numpy(), x + 1)
  t.assign(t * 2).realize()   # in place, with a guarded last block
  np.testing.assert_array_equal(t.numpy(), x * 2)

@needs_gpu
def test_from_blob_computes_on_host_memory_in_place():
  import gc
  host = np.arange(4096 + 3, dtype=np.float32)   # spans pages; two tensors over overlapping parts of it
  t = Tensor.from_blob(host.ctypes.data, (host.size,), device="CUDA")
  part = Tensor.from_blob(host.ctypes.data + 4 * 4000, (99,), device="CUDA")
  host[5] = -7.0   # the kernels read the memory itself: a write made after from_blob is seen
  np.testing.assert_array_equal((t * 2).numpy()[:6], [0.0, 2.0, 4.0, 6.0, 8.0, -14.0])
  np.testing.assert_array_equal((part + 1).numpy(), host[4000:] + 1)
  t.assign(t + 1).realize()   # and a kernel's writes land in it
  Device["CUDA"].synchronize()
  assert host[5] == -6.0 and host[-1] == 4099.0
  del t, part
  gc.collect()
  assert not cuda._host_registrations.ranges   # unregistered with the last tensor over them
