"""kiln's ctypes binding to the CUDA driver and NVRTC (kiln/runtime/cuda_driver.py).

The pure parts (library search order, loading, error messages, argument packing, launch sizes, the compile cache's
keys, the LRU allocator over cuMemAlloc) run everywhere, with fakes. NVRTC tests run where libnvrtc is found (it needs
no GPU); GPU tests run where a GPU is usable and skip elsewhere.
"""
import ctypes
import numpy as np
import pytest
from kiln.device import CompileError
from kiln.helpers import Context as Settings
from kiln.runtime import cuda_driver as cuda

def _nvrtc_found() -> bool:
  try: cuda.nvrtc()
  except cuda.CudaUnavailableError: return False
  return True

needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")
needs_nvrtc = pytest.mark.skipif(not _nvrtc_found(), reason="libnvrtc not found (pip install 'kiln[cuda]')")

# ---------------- without a GPU ----------------

@pytest.fixture
def no_driver(monkeypatch):
  """The driver as on a machine without one: every libcuda candidate fails to load."""
  monkeypatch.setattr(cuda, "driver_library_candidates",
                      lambda: [cuda.LibraryCandidate("libcuda-not-here.so.1", "loader")])
  cuda._driver_library.cache_clear(); cuda.driver.cache_clear()
  yield
  cuda._driver_library.cache_clear(); cuda.driver.cache_clear()

def test_absence_is_reported_cleanly(no_driver):
  assert not cuda.available() and cuda.device_count() == 0
  reason = cuda.unavailable_reason()
  assert reason is not None and "libcuda" in reason and "libcuda-not-here.so.1" in reason, reason

def test_asking_for_a_context_without_a_driver_raises_one_runtime_error(no_driver):
  with pytest.raises(RuntimeError, match="CUDA is not available: libcuda was not found") as info:
    cuda.Context(0)
  assert isinstance(info.value, cuda.CudaUnavailableError)

def test_module_imports_without_loading_anything():
  import importlib, subprocess, sys
  code = ("import kiln, kiln.runtime.cuda_driver as c; "
          "print(c._driver_library.cache_info().currsize, c.nvrtc.cache_info().currsize)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert result.returncode == 0 and result.stdout.split() == ["0", "0"], result.stderr
  assert importlib.import_module("kiln.runtime.cuda_driver") is cuda

# ---------------- where the libraries are looked for ----------------

def fake_glob(files: list[str]):
  """A glob over a fake file system holding `files` (and their folders); `*` matches within one path segment."""
  import fnmatch
  def matches(pattern: str) -> list[str]:
    depth = pattern.count("/")
    paths = {"/".join(f.split("/")[:depth + 1]) for f in files}
    return sorted(p for p in paths if fnmatch.fnmatch(p, pattern) and p.count("/") == depth)
  return matches

FILES = ["/opt/cuda-a/lib64/libnvrtc.so.12", "/opt/cuda-a/lib64/libnvrtc.so.13", "/opt/cuda-a/lib64/libcuda.so.1",
         "/opt/cuda-a/lib64/libnvrtc-builtins.so.13.0", "/opt/cuda-b/lib/libnvrtc.so.13",
         "/site/nvidia/cu13/lib/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13",
         "/usr/local/cuda-12.4/lib64/libnvrtc.so.12", "/usr/local/cuda-13.0/lib64/libnvrtc.so.13"]

def test_nvrtc_search_order():
  candidates = cuda.nvrtc_library_candidates({"CUDA_PATH": "/opt/cuda-a", "CUDA_HOME": "/opt/cuda-b"}, "Linux",
                                             glob_fn=fake_glob(FILES), find_library=lambda name: "libnvrtc.so.13.0",
                                             wheel_folders=[("/site/nvidia/cu13/lib", "wheel")])
  assert [(c.name, c.source) for c in candidates] == [
    ("libnvrtc.so.13", "loader"), ("libnvrtc.so.12", "loader"), ("libnvrtc.so.11.2", "loader"),
    ("libnvrtc.so", "loader"),
    ("libnvrtc.so.13.0", "ldconfig"),
    ("/opt/cuda-a/lib64/libnvrtc.so.13", "$CUDA_PATH"), ("/opt/cuda-a/lib64/libnvrtc.so.12", "$CUDA_PATH"),
    ("/opt/cuda-b/lib/libnvrtc.so.13", "$CUDA_HOME"),
    ("/site/nvidia/cu13/lib/libnvrtc.so.13", "wheel"),
    ("/usr/local/cuda/lib64/libnvrtc.so.13", "toolkit folder"),
    ("/usr/local/cuda-13.0/lib64/libnvrtc.so.13", "toolkit folder"),
    ("/usr/local/cuda-12.4/lib64/libnvrtc.so.12", "toolkit folder")]

def test_driver_search_order_has_no_wheel_and_no_duplicates():
  candidates = cuda.driver_library_candidates({"CUDA_PATH": "/opt/cuda-a"}, "Linux", glob_fn=fake_glob(FILES),
                                              find_library=lambda name: "libcuda.so.1")
  assert [(c.name, c.source) for c in candidates] == [
    ("libcuda.so.1", "loader"), ("libcuda.so", "loader"), ("/opt/cuda-a/lib64/libcuda.so.1", "$CUDA_PATH")]

def test_an_empty_environment_asks_only_the_loader():
  candidates = cuda.nvrtc_library_candidates({}, "Linux", glob_fn=lambda pattern: [], find_library=lambda name: None,
                                             wheel_folders=[])
  assert {c.source for c in candidates} == {"loader"}
  assert cuda.driver_library_candidates({}, "Darwin", glob_fn=lambda p: [], find_library=lambda n: None) == []

def test_wheel_folders_are_found_on_a_path(tmp_path):
  (tmp_path / "nvidia" / "cu13" / "lib").mkdir(parents=True)
  assert cuda.nvrtc_wheel_folders([str(tmp_path)]) == [(str(tmp_path / "nvidia" / "cu13" / "lib"),
                                                        "nvidia-cuda-nvrtc wheel")]

def test_load_first_takes_the_first_that_loads_and_lists_every_try():
  def loader(name: str):
    if name != "good": raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    return "handle"
  candidates = [cuda.LibraryCandidate("bad", "loader"), cuda.LibraryCandidate("good", "$CUDA_PATH")]
  assert cuda.load_first("libnvrtc", candidates, loader) == ("handle", candidates[1])
  with pytest.raises(cuda.CudaUnavailableError, match=r"libnvrtc was not found .*tried: bad \(loader: No such file"):
    cuda.load_first("libnvrtc", candidates[:1], loader)
  with pytest.raises(RuntimeError, match="no candidate for this system"): cuda.load_first("libcuda", [], loader)

# ---------------- errors ----------------

def test_error_messages_name_the_call_and_the_error():
  assert cuda.format_cuda_error("cuLaunchKernel", 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument") == \
    "cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument"
  error = cuda.CudaOutOfMemoryError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
  assert isinstance(error, RuntimeError) and isinstance(error, MemoryError) and error.call == "cuMemAlloc"
  assert issubclass(cuda.NVRTCCompileError, CompileError) and cuda.NVRTCCompileError("m", "the log").log == "the log"

class FakeFunction:
  """A C function stand-in: returns `code`, remembers its arguments."""
  def __init__(self, code: int): self.code, self.calls = code, []
  def __call__(self, *args): self.calls.append(args); return self.code

class FakeHandle:
  """A loaded library stand-in that exports only cuFoo (the plain name, not cuFoo_v2) and cuBar."""
  def __init__(self): self.cuFoo, self.cuBar = FakeFunction(0), FakeFunction(700)

def test_library_calls_check_every_return_code():
  def describe(call: str, code: int): return cuda.CudaError(call, code, "CUDA_ERROR_ILLEGAL_ADDRESS", "bad address")
  prototypes = {"cuFoo": (("cuFoo_v2", "cuFoo"), (ctypes.c_int,)), "cuBar": (("cuBar",), ()),
                "cuBaz": (("cuBaz",), ())}
  handle = FakeHandle()
  lib = cuda._Library(handle, cuda.LibraryCandidate("fake.so", "test"), prototypes, describe)
  lib.call("cuFoo", 3)
  assert handle.cuFoo.calls == [(3,)] and handle.cuFoo.argtypes == (ctypes.c_int,)
  with pytest.raises(cuda.CudaError, match=r"cuBar failed: CUDA_ERROR_ILLEGAL_ADDRESS \(700\): bad address"):
    lib.call("cuBar")
  with pytest.raises(cuda.CudaError, match="cuBaz failed: MISSING_SYMBOL.*fake.so does not export it"):
    lib.call("cuBaz")

# ---------------- launches ----------------

def pointed_value(pointer: int, ctype):
  """The value of type `ctype` at address `pointer`."""
  return ctypes.cast(pointer, ctypes.POINTER(ctype)).contents.value

def test_pack_args_gives_each_argument_its_c_type():
  memory = cuda.DeviceMemory(None, 0x7f00_0000_1234, 64)   # type: ignore[arg-type]  (packing needs no context)
  args = [memory, memory.view(16, 8), 7, -3, 2.5, True, np.float64(0.1), np.int64(2**40), ctypes.c_uint16(65535)]
  params, values = cuda.pack_args(args)
  expected = [(ctypes.c_uint64, 0x7f00_0000_1234), (ctypes.c_uint64, 0x7f00_0000_1244), (ctypes.c_int32, 7),
              (ctypes.c_int32, -3), (ctypes.c_float, 2.5), (ctypes.c_bool, True), (ctypes.c_double, 0.1),
              (ctypes.c_int64, 2**40), (ctypes.c_uint16, 65535)]
  assert [type(v) for v in values] == [ctype for ctype, _ in expected]
  assert [pointed_value(params[i], ctype) for i, (ctype, _) in enumerate(expected)] == [v for _, v in expected]
  assert len(cuda.pack_args([])[0]) == 1   # a kernel without arguments still gets a valid array

def test_pack_args_rejects_what_it_cannot_pack():
  with pytest.raises(OverflowError, match=r"argument 1 \(4294967296\) does not fit an int32; pass ctypes.c_int64"):
    cuda.pack_args([1, 2**32])
  with pytest.raises(TypeError, match="argument 0 is a str"): cuda.pack_args(["x"])
  with pytest.raises(TypeError, match="argument 0 has dtype float16"): cuda.pack_args([np.float16(1)])

def test_launch_dims():
  assert cuda.launch_dims(5) == (5, 1, 1) and cuda.launch_dims((2, 3)) == (2, 3, 1)
  assert cuda.launch_dims([2, 3, 4], "block") == (2, 3, 4)
  for bad in (0, (1, 2, 3, 4), (), (2, -1), 2.0):
    with pytest.raises(ValueError, match="block must be 1 to 3 positive ints"): cuda.launch_dims(bad, "block")

def test_arch_for_capability():
  assert [cuda.arch_for_capability(*cc) for cc in [(7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0)]] == \
    ["sm_75", "sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"]

def test_host_buffers():
  array = np.arange(6, dtype=np.float32)
  address, nbytes, _ = cuda._host_address(array)
  assert (address, nbytes) == (array.ctypes.data, 24)
  assert cuda._host_address(b"abc")[1] == 3
  with pytest.raises(ValueError, match="contiguous"): cuda._host_address(array[::2])
  with pytest.raises(ValueError, match="read-only"): cuda._host_address(b"abc", writable=True)

def test_device_memory_views_check_bounds():
  memory = cuda.DeviceMemory(None, 0x1000, 64)   # type: ignore[arg-type]
  assert memory.view(8, 56).ptr == 0x1008 and memory.view(8, 8).view(4, 4).owner is memory
  with pytest.raises(ValueError, match=r"bytes \[60, 68\) are outside the 64 bytes"): memory.view(60, 8)

# ---------------- the compile cache ----------------

def test_cache_keys_change_with_source_arch_options_and_version():
  base = cuda.NVRTCCompiler("sm_90a", ("--fmad=false",), version=(13, 0))
  same = cuda.NVRTCCompiler("sm_90a", ("--fmad=false",), version=(13, 0))
  others = [cuda.NVRTCCompiler("sm_89", ("--fmad=false",), version=(13, 0)),
            cuda.NVRTCCompiler("sm_90a", ("--fmad=true",), version=(13, 0)),
            cuda.NVRTCCompiler("sm_90a", ("--fmad=false",), version=(13, 1))]
  assert base.cache_key() == "NVRTC 13.0 sm_90a --fmad=false"
  assert base.cache_path("src") == same.cache_path("src") != base.cache_path("other src")
  assert len({base.cache_path("src"), *(other.cache_path("src") for other in others)}) == 4
  with pytest.raises(ValueError, match="arch must look like sm_90a"): cuda.NVRTCCompiler("90")

def test_a_cached_cubin_is_read_without_nvrtc(tmp_path, monkeypatch):
  compiler = cuda.NVRTCCompiler("sm_90a", version=(13, 0))
  def no_nvrtc(src: str) -> bytes: raise AssertionError("compiled although the CUBIN was cached")
  monkeypatch.setattr(compiler, "compile", no_nvrtc)
  with Settings(CACHELEVEL=2, CACHEDB=str(tmp_path)):
    path = compiler.cache_path("kernel source")
    assert path.is_relative_to(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF cubin")
    assert compiler.compile_cached("kernel source") == b"\x7fELF cubin"

# ---------------- the LRU allocator over cuMemAlloc ----------------

class FakeContext:
  """A context whose allocations are numbered fake DeviceMemory; it runs out of memory `fail` times."""
  def __init__(self, fail: int = 0): self.allocated, self.freed, self.fail = 0, [], fail
  def alloc(self, nbytes: int):
    if self.fail:
      self.fail -= 1
      raise cuda.CudaOutOfMemoryError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    self.allocated += 1
    memory = cuda.DeviceMemory(self, 0x1000 * self.allocated, nbytes)   # type: ignore[arg-type]
    memory.free = lambda: self.freed.append(memory)   # type: ignore[method-assign]
    return memory

def test_allocator_reuses_freed_memory_and_frees_its_cache_when_out_of_memory():
  context = FakeContext()
  allocator = cuda.CudaAllocator(context)   # type: ignore[arg-type]
  first = allocator.alloc(256)
  allocator.free(first, 256)
  assert allocator.alloc(256) is first and context.allocated == 1
  allocator.free(first, 256)
  context.fail = 1
  second = allocator.alloc(512)   # out of memory once: the cached 256 bytes are freed, then it is tried again
  assert context.freed == [first] and second.nbytes == 512 and allocator.cached_bytes == 0
  assert allocator.offset_view(second, 128, 64).ptr == second.ptr + 128

# ---------------- NVRTC (no GPU needed) ----------------

VECTOR_ADD = r"""
extern "C" __global__ void vector_add(float* out, const float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""

@needs_nvrtc
def test_nvrtc_compiles_to_a_cubin_and_caches_it(tmp_path, monkeypatch):
  with Settings(CACHELEVEL=2, CACHEDB=str(tmp_path)):
    cubin = cuda.compile_cuda(VECTOR_ADD, "sm_90a")
    assert cubin[:4] == b"\x7fELF", cubin[:16]
    def no_second_compile(self, src: str) -> bytes: raise AssertionError("compiled twice")
    monkeypatch.setattr(cuda.NVRTCCompiler, "compile", no_second_compile)
    assert cuda.compile_cuda(VECTOR_ADD, "sm_90a") == cubin
  assert cuda.nvrtc_version() >= (11, 2)

@needs_nvrtc
def test_a_compile_error_raises_with_nvrtc_log():
  with pytest.raises(CompileError, match="did not compile for sm_90a") as info:
    cuda.NVRTCCompiler("sm_90a").compile('extern "C" __global__ void broken() { no_such_function(); }')
  assert 'identifier "no_such_function" is undefined' in info.value.log, info.value.log
  assert info.value.log in str(info.value)

# ---------------- on a GPU ----------------

@pytest.fixture(scope="module")
def ctx():
  context = cuda.Context(0)
  yield context
  context.close()

def random_floats(n: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(n).astype(np.float32)

def assert_same(out: np.ndarray, ref: np.ndarray) -> None:
  """Bit-equal arrays; else the shape, the count of differing elements and the worst difference."""
  differ = out != ref
  assert not differ.any(), (f"{out.shape}: {int(differ.sum())} elements differ, worst "
                            f"{np.nanmax(np.abs(out.astype(np.float64) - ref)):.3g}")

@needs_gpu
def test_device_properties(ctx):
  props = ctx.properties
  assert props.name and props.sm_count > 0 and props.total_memory > 1 << 30, props
  assert props.compute_capability >= (5, 0) and props.arch == cuda.arch_for_capability(*props.compute_capability)
  assert props.max_shared_per_block >= 48 * 1024
  free, total = ctx.memory_info()
  assert 0 < free <= total and cuda.driver_version() >= (11, 0)

@needs_gpu
def test_vector_add(ctx):
  n = (1 << 20) + 3   # not a multiple of the block: the bounds check matters
  a, b = random_floats(n, 0), random_floats(n, 1)
  out = np.empty(n, np.float32)
  with ctx.compile(VECTOR_ADD) as module, ctx.alloc(4 * n) as da, ctx.alloc(4 * n) as db, ctx.alloc(4 * n) as dout:
    ctx.copy_in(da, a); ctx.copy_in(db, b); ctx.memset(dout, 0xFF)   # poison: NaNs where nothing was written
    module.function("vector_add").launch(dout, da, db, n, grid=(n + 255) // 256, block=256)
    ctx.copy_out(out, dout)
  assert_same(out, a + b)

@needs_gpu
def test_graph_of_two_launches_with_new_arguments(ctx):
  n = 4099
  a, b = random_floats(n, 3), random_floats(n, 4)
  out, again = np.empty(n, np.float32), np.empty(n, np.float32)
  with ctx.compile(VECTOR_ADD) as module, ctx.alloc(4 * n) as da, ctx.alloc(4 * n) as db, \
       ctx.alloc(4 * n) as tmp, ctx.alloc(4 * n) as dout:
    ctx.copy_in(da, a); ctx.copy_in(db, b); ctx.memset(dout, 0xFF)
    add, grid = module.function("vector_add"), (n + 255) // 256
    graph = cuda.Graph(ctx, [(add, (tmp, da, db, n), grid, 256), (add, (dout, tmp, da, n), grid, 256)])
    graph.launch()
    ctx.copy_out(out, dout)
    graph.set_args(1, add, (dout, tmp, tmp, n), grid, 256)   # the second node now doubles the first's output
    graph.launch()
    ctx.copy_out(again, dout)
    graph.close()
  assert_same(out, (a + b) + a)
  assert_same(again, (a + b) + (a + b))

@needs_gpu
def test_packed_launches_and_graph_executables_with_their_own_arguments(ctx):
  """A PackedLaunch rewritten in place between launches; two executables of one graph, each updated to its own
  arguments, launched in turn."""
  n = 1000
  a, b = random_floats(n, 5), random_floats(n, 6)
  out1, out2 = np.empty(n, np.float32), np.empty(n, np.float32)
  with ctx.compile(VECTOR_ADD) as module, ctx.alloc(4 * n) as da, ctx.alloc(4 * n) as db, \
       ctx.alloc(4 * n) as d1, ctx.alloc(4 * n) as d2:
    ctx.copy_in(da, a); ctx.copy_in(db, b); ctx.memset(d1, 0xFF); ctx.memset(d2, 0xFF)
    add = module.function("vector_add")
    packed = cuda.PackedLaunch(add, (d1, da, db, n), (n + 255) // 256, 256)
    packed.launch()
    packed.values[0].value, packed.values[2].value = d2.ptr, da.ptr   # d2 = a + a
    packed.launch()
    ctx.copy_out(out1, d1); ctx.copy_out(out2, d2)
    assert_same(out1, a + b)
    assert_same(out2, a + a)
    ctx.memset(d1, 0xFF); ctx.memset(d2, 0xFF)
    graph = cuda.Graph(ctx, [(add, (d1, da, db, n), (n + 255) // 256, 256)])
    second = graph.instantiate()
    graph.packed[0].values[0].value, graph.packed[0].values[1].value = d2.ptr, db.ptr   # d2 = b + b
    graph.update(second, 0)
    graph.launch_exec(graph.exec)   # the first still holds the arguments it was added with
    graph.launch_exec(second)
    ctx.copy_out(out1, d1); ctx.copy_out(out2, d2)
    graph.close()
  assert_same(out1, a + b)
  assert_same(out2, b + b)

@needs_gpu
def test_copies_round_trip(ctx):
  data = np.random.default_rng(2).integers(0, 256, 1 << 16, dtype=np.uint8)
  back, part = np.zeros_like(data), np.zeros(1024, np.uint8)
  with ctx.alloc(data.nbytes) as first, ctx.alloc(data.nbytes) as second:
    ctx.copy_in(first, data)
    ctx.copy(second, first)
    ctx.copy_out(back, second)
    ctx.copy_out(part, second.view(4096, 1024))
    with pytest.raises(ValueError, match="the source has 1024 bytes and the destination 65536"):
      ctx.copy_in(first, part)
  assert_same(back, data)
  assert_same(part, data[4096:5120])

BUSY_LOOP = r"""
extern "C" __global__ void busy(float* out, int steps) {
  float x = threadIdx.x;
  for (int i = 0; i < steps; i++) x = x * 0.999f + 1.0f;
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
"""

@needs_gpu
def test_events_time_a_kernel(ctx):
  with ctx.compile(BUSY_LOOP) as module, ctx.alloc(4 * 256 * 1024) as out, ctx.event() as start, ctx.event() as end:
    busy = module.function("busy")
    times = []
    for steps in (1000, 100_000):
      start.record(); busy.launch(out, steps, grid=1024, block=256); end.record()
      times.append(start.elapsed_ms(end))
  assert 0 < times[0] < times[1], times

@needs_gpu
def test_async_copies_on_a_stream_with_pinned_memory(ctx):
  n = 1 << 20
  a, b = random_floats(n, 3), random_floats(n, 4)
  with ctx.compile(VECTOR_ADD) as module, ctx.stream() as stream, ctx.alloc_host(4 * n) as host_a, \
       ctx.alloc_host(4 * n) as host_out, ctx.alloc(4 * n) as da, ctx.alloc(4 * n) as db, ctx.alloc(4 * n) as dout, \
       ctx.event() as done:
    host_a.numpy(np.float32)[:] = a
    host_out.numpy(np.float32)[:] = np.nan
    ctx.copy_in(da, host_a, stream=stream)
    ctx.copy_in(db, b, stream=stream)   # pageable memory works on a stream too, less asynchronously
    module.function("vector_add").launch(dout, da, db, n, grid=n // 256, block=256, stream=stream)
    ctx.copy(db, dout, stream=stream)
    ctx.copy_out(host_out, db, stream=stream)
    done.record(stream)
    stream.synchronize()
    assert_same(host_out.numpy(np.float32).copy(), a + b)

REVERSE_BLOCKS = r"""
extern "C" __global__ void reverse_blocks(float* out, const float* in, int per_block) {
  extern __shared__ float tile[];
  const float* src = in + blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) tile[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) out[blockIdx.x * per_block + i] = tile[per_block - 1 - i];
}
"""

@needs_gpu
@pytest.mark.parametrize("shared_bytes", [4 * 1024, 96 * 1024])   # 96 KiB is over the 48 KiB without opt-in
def test_launch_with_dynamic_shared_memory(ctx, shared_bytes):
  per_block, blocks = shared_bytes // 4, 64
  data = random_floats(per_block * blocks, 5)
  out = np.empty_like(data)
  with ctx.compile(REVERSE_BLOCKS) as module, ctx.alloc(data.nbytes) as din, ctx.alloc(data.nbytes) as dout:
    ctx.copy_in(din, data); ctx.memset(dout, 0xFF)
    module.function("reverse_blocks").launch(dout, din, per_block, grid=blocks, block=256, shared=shared_bytes)
    ctx.copy_out(out, dout)
  assert_same(out, data.reshape(blocks, per_block)[:, ::-1].ravel())

ECHO = r"""
extern "C" __global__ void echo(long long* ints, double* floats, long long a, double b, int c, float d, bool e) {
  ints[0] = a; ints[1] = c; ints[2] = e; floats[0] = b; floats[1] = d;
}
"""

@needs_gpu
def test_arguments_reach_the_kernel(ctx):
  ints, floats = np.zeros(3, np.int64), np.zeros(2, np.float64)
  with ctx.compile(ECHO) as module, ctx.alloc(24) as dints, ctx.alloc(16) as dfloats:
    module.function("echo").launch(dints, dfloats, ctypes.c_int64(-2**40), np.float64(0.1), -7, 1.5, True)
    ctx.copy_out(ints, dints); ctx.copy_out(floats, dfloats)
  assert ints.tolist() == [-2**40, -7, 1] and floats.tolist() == [0.1, 1.5]

@needs_gpu
def test_driver_errors_name_the_call(ctx):
  with ctx.compile(VECTOR_ADD) as module, ctx.alloc(16) as memory:
    with pytest.raises(cuda.CudaError, match=r"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE \(1\)"):
      module.function("vector_add").launch(memory, memory, memory, 4, block=4096)
    with pytest.raises(cuda.CudaError, match="cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND"):
      module.function("no_such_kernel")
  with pytest.raises(MemoryError, match="cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"): ctx.alloc(1 << 52)

@needs_gpu
def test_compile_error_on_the_device(ctx):
  with pytest.raises(CompileError, match=f"did not compile for {ctx.properties.arch}") as info:
    ctx.compile('extern "C" __global__ void k(float* x) { x[0] = undeclared; }')
  assert "undeclared" in info.value.log

@needs_gpu
def test_allocator_over_cumemalloc(ctx):
  allocator = cuda.CudaAllocator(ctx)
  data = np.arange(1000, dtype=np.float32)
  back = np.zeros_like(data)
  handle = allocator.alloc(data.nbytes)
  allocator.copyin(handle, memoryview(data))
  allocator.copyout(memoryview(back), handle)
  allocator.free(handle, data.nbytes)
  assert allocator.alloc(data.nbytes) is handle
  allocator.free(handle, data.nbytes)
  allocator.free_cache()
  assert handle.freed
  assert_same(back, data)

@pytest.mark.skipif(cuda.device_count() < 2, reason="peer copies need two GPUs")
def test_peer_copy_between_gpus():
  data = random_floats(1 << 20, 6)
  back = np.zeros_like(data)
  with cuda.Context(0) as first, cuda.Context(1) as second:
    with first.alloc(data.nbytes) as on_first, second.alloc(data.nbytes) as on_second:
      first.copy_in(on_first, data)
      second.copy(on_second, on_first)
      second.copy_out(back, on_second)
  assert_same(back, data)
