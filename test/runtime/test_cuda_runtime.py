"""The CUDA runtime pieces issue 21's tensor-core kernels need (kiln/runtime/cuda_driver.py, ops_cuda.py):

- the watchdog: every wait for the GPU polls against CUDA_TIMEOUT and turns a hung launch into a CudaTimeoutError
  (a RuntimeError) naming the kernel last launched;
- dynamic shared memory over 48 KiB: a kernel whose shared arrays need more declares one `extern __shared__` array
  (PTX `.extern .shared`), carries the byte count as a third element of its launch, and the runtime lets the kernel
  use it (cuFuncSetAttribute) and launches with it;
- TMA descriptors: `TensorMap` (cuTensorMapEncodeTiled) passed by value as `const __grid_constant__ CUtensorMap`.

Without a GPU: rendering here, and the runtime over the fake libcuda (fake_libcuda.c) in a subprocess (its stream
can be made never to finish). With a GPU: a kernel spinning on a flag in host-mapped memory until the watchdog has
fired, the 100 KiB kernel from CUDA C and from PTX, and a TMA tile copy with 128-byte swizzle against NumPy.
"""
from __future__ import annotations
import ctypes, json, os, pathlib, shutil, subprocess, sys, time
import numpy as np
import pytest
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops

HERE = pathlib.Path(__file__).resolve().parent
COMPILER = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
INT = dtypes.int32
THREADS, PER_THREAD, BLOCKS = 1024, 25, 4
N = THREADS * PER_THREAD   # 25600 floats: 100 KiB of shared memory, and 256 bytes more in a second array
BIG_SHARED_BYTES = 4 * N + 4 * 64

def big_shared_kernel(threads: int = THREADS, per_thread: int = PER_THREAD, blocks: int = BLOCKS) -> UOp:
  """A hand-built kernel with a 100 KiB shared array and a small one: block g copies its slice of data1 into
  `big`, threads 0-63 write 2*lidx into `small`, and after a barrier each thread writes out[g, i] =
  big[n-1-i] + small[lidx % 64] (i = j*threads + lidx): a block's slice reversed, plus 2*(i % threads % 64)."""
  n = threads * per_thread
  out, inp = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)
  lidx, gidx = UOp(Ops.SPECIAL, INT, (), ("lidx0", threads)), UOp(Ops.SPECIAL, INT, (), ("gidx0", blocks))
  big = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), ("big", n))
  small = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), ("small", 64))
  stores = [UOp(Ops.STORE, dtypes.void, (big, lidx + j * threads,
                                         UOp(Ops.LOAD, dtypes.float32, (inp, gidx * n + j * threads + lidx))))
            for j in range(per_thread)]
  stores.append(UOp(Ops.STORE, dtypes.void, (small, lidx % 64, (lidx * 2).cast(dtypes.float32), lidx.lt(64))))
  staged = UOp(Ops.BARRIER, dtypes.void, tuple(stores))
  outs = []
  for j in range(per_thread):
    value = UOp(Ops.LOAD, dtypes.float32, (big, (n - 1) - (lidx + j * threads), staged)) + \
      UOp(Ops.LOAD, dtypes.float32, (small, lidx % 64, staged))
    outs.append(UOp(Ops.STORE, dtypes.void, (out, gidx * n + j * threads + lidx, value)))
  return UOp(Ops.SINK, dtypes.void, tuple(outs))

def big_shared_reference(data: np.ndarray, threads: int = THREADS) -> np.ndarray:
  """What big_shared_kernel writes for input `data` (blocks x n floats)."""
  i = np.arange(data.shape[1])
  return (data[:, ::-1] + 2 * (i % threads % 64)).astype(np.float32)

def render(renderer, sink: UOp, name: str = "big_shared") -> tuple[str, list[UOp]]:
  """The source and linear uops of a hand-built (already mapped) kernel graph."""
  from kiln.codegen import pipeline
  job = pipeline.Job(renderer, name)
  uops = pipeline.run(sink, renderer, start="software_math", stop="plan_threads", job=job)
  return pipeline.render(uops, job), uops

def small_shared_kernel() -> UOp:
  """big_shared_kernel's shape with 8 KiB of shared memory: static arrays."""
  return big_shared_kernel(threads=256, per_thread=8, blocks=2)

def renderers():
  from kiln.renderer.cuda import CUDARenderer
  from kiln.renderer.ptx import PTXRenderer
  return [CUDARenderer("sm_90a"), PTXRenderer("sm_90a")]

# ---------------- rendering (no GPU) ----------------

def test_kernels_under_48k_keep_static_arrays():
  from kiln.codegen.gpudims import launch_size
  cuda_src, uops = render(renderers()[0], small_shared_kernel())
  ptx_src, _ = render(renderers()[1], small_shared_kernel())
  assert "__shared__ __align__(16) float big[2048];" in cuda_src and "extern __shared__" not in cuda_src
  assert ".shared .align 16 .b8 big[8192];" in ptx_src and ".extern" not in ptx_src
  assert launch_size(uops) == ((2, 1, 1), (256, 1, 1))   # no third element: launched as before

def test_a_kernel_over_48k_declares_one_dynamic_array():
  from kiln.codegen.gpudims import launch_size
  from kiln.renderer.shared_memory import shared_layout
  cuda_src, uops = render(renderers()[0], big_shared_kernel())
  ptx_src, _ = render(renderers()[1], big_shared_kernel())
  layout = shared_layout(uops)
  assert layout.dynamic and layout.nbytes == BIG_SHARED_BYTES and sorted(layout.offsets.values()) == [0, 4 * N]
  assert launch_size(uops) == ((BLOCKS, 1, 1), (THREADS, 1, 1), BIG_SHARED_BYTES)
  assert cuda_src.count("extern __shared__ __align__(16) unsigned char kiln_shared[];") == 1
  assert "float* const big = reinterpret_cast<float*>(kiln_shared + 0);" in cuda_src
  assert f"float* const small = reinterpret_cast<float*>(kiln_shared + {4 * N});" in cuda_src
  assert "__shared__ __align__(16) float" not in cuda_src
  assert ptx_src.count(".extern .shared .align 16 .b8 kiln_shared[];") == 1 and "  .shared" not in ptx_src
  assert f", {4 * N};   // small" in ptx_src

@pytest.mark.skipif(shutil.which("ptxas") is None or shutil.which("nvcc") is None, reason="needs nvcc and ptxas")
def test_the_dynamic_kernel_builds_for_sm_90a(tmp_path):
  cuda_src, _ = render(renderers()[0], big_shared_kernel())
  ptx_src, _ = render(renderers()[1], big_shared_kernel())
  (tmp_path / "k.cu").write_text(cuda_src)
  (tmp_path / "k.ptx").write_text(ptx_src)
  for command in (["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "a.cubin"),
                   str(tmp_path / "k.cu")],
                  ["ptxas", "-arch=sm_90a", "-v", "-o", str(tmp_path / "b.cubin"), str(tmp_path / "k.ptx")]):
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 bytes spill stores" in done.stderr and "bytes smem" not in done.stderr   # no static shared memory

def test_the_codegen_cache_keeps_the_shared_bytes(tmp_path, monkeypatch):
  from kiln.engine import codegen_cache
  monkeypatch.setattr(codegen_cache, "_key", lambda device, ast: "ab" + "0" * 62)
  monkeypatch.setattr(codegen_cache, "kernel_cache_dir", lambda: tmp_path)
  monkeypatch.setattr(codegen_cache, "enabled", lambda: True)
  for launch in (((4, 1, 1), (1024, 1, 1), BIG_SHARED_BYTES), ((4, 1, 1), (1024, 1, 1)), None):
    codegen_cache.store("CUDA", None, codegen_cache.CodegenEntry("k", "src", 1, (0, 1), launch))
    assert codegen_cache.lookup("CUDA", None).launch == launch

def test_tensor_map_rules():
  from kiln.runtime import cuda_driver as cuda
  check = cuda.check_tensor_map
  fp16 = cuda.TENSOR_MAP_DTYPES["float16"]
  check(fp16, 1 << 20, (192, 256), (384,), (64, 64), (1, 1), cuda.INTERLEAVE_NONE, cuda.SWIZZLE_128B)
  bad = [((fp16, 8, (192, 256), (384,), (64, 64), (1, 1), 0, 3), "aligned"),
         ((fp16, 0, (192, 256), (392,), (64, 64), (1, 1), 0, 3), "multiples of 16"),
         ((fp16, 0, (192, 256), (384,), (64, 512), (1, 1), 0, 3), "1 to 256"),
         ((fp16, 0, (192, 256), (384,), (4, 64), (1, 1), 0, 0), "multiple of 16"),
         ((fp16, 0, (192, 256), (384,), (128, 8), (1, 1), 0, 2), "64-byte swizzle"),
         ((fp16, 0, (192, 256), (384, 384), (64, 64), (1, 1), 0, 3), "strides"),
         ((99, 0, (192, 256), (384,), (64, 64), (1, 1), 0, 3), "data type")]
  for args, words in bad:
    with pytest.raises(ValueError, match=words): check(*args)

# ---------------- the runtime over the fake driver (subprocess) ----------------

def child() -> dict:
  """Run in the subprocess over the fake driver (PTX=1): what the fake test asserts, as a dict."""
  from kiln import Tensor, Device
  from kiln.helpers import Context
  from kiln.runtime import cuda_driver as cuda
  from kiln.renderer.ptx import PTXRenderer
  from kiln.codegen.gpudims import launch_size
  fake = ctypes.CDLL(os.environ["KILN_FAKE_CUDA"])
  out: dict = {}
  dev = Device["CUDA"]
  # the watchdog: a stream that never finishes
  a = Tensor(np.arange(16, dtype=np.float32), device="CUDA").realize()   # (the fake runs no kernel: copied in)
  before = a.numpy()
  b = (a * 3 + 1).realize()
  fake.fake_set_hang(1)
  errors = []
  for wait in (lambda: b.numpy(), dev.synchronize, lambda: dev.context.event().record().synchronize(),
               lambda: Tensor([1.0, 2.0], device="CUDA").realize()):
    start = time.perf_counter()
    try:
      with Context(CUDA_TIMEOUT=0.2): wait()
      errors.append(None)
    except cuda.CudaTimeoutError as error:
      errors.append([str(error), error.kernel, time.perf_counter() - start, isinstance(error, RuntimeError)])
  out["watchdog"] = errors
  out["queries"] = fake.fake_queries()
  fake.fake_set_hang(0)
  out["after"] = [before.tolist(), b.numpy().tolist()]
  # dynamic shared memory: the PTX kernel through CUDAProgram, eagerly and in a graph
  src, uops = render(PTXRenderer("sm_90a"), big_shared_kernel())
  launch = launch_size(uops)
  program = dev.runtime("big_shared", dev.compiler.compile(src))
  bufs = [dev.context.alloc(4 * N * BLOCKS) for _ in range(2)]
  program(*bufs, launch=launch)
  out["shared"] = [list(launch[2:]), fake.fake_last_shared(), fake.fake_max_dynamic_shared()]
  graph = cuda.Graph(dev.context, [program.packed(tuple(bufs), (), launch)])
  out["graph_shared"] = graph.packed[0].node.sharedMemBytes
  try:
    program.function.allow_shared(300 << 10)
    out["too_much"] = None
  except ValueError as error: out["too_much"] = str(error)
  out["target"] = [dev.renderer.describe_target().shared_optin, dev.renderer.describe_target().shared_max]
  # a tensor map reaches the kernel by value
  memory = dev.context.alloc(256 * 384)
  tmap = cuda.TensorMap(memory, "float16", (192, 256), (384,), (64, 64))
  fake.fake_capture(2, 128)
  program.function.launch(tmap, 5, grid=1, block=32)
  got = (ctypes.c_ubyte * 128)()
  fake.fake_param_bytes(0, 128, got)
  words = np.frombuffer(bytes(got), np.uint64).tolist()
  out["tensor_map"] = [bytes(got) == bytes(tmap), tmap.address % 64, words[0] == memory.ptr, words[1:4],
                       words[4:6], words[9:11]]
  fake.fake_param_bytes(1, 4, got)
  out["after_map"] = int.from_bytes(bytes(got)[:4], "little")
  from kiln.runtime.gpu_target import TensorMap as Description   # the IR's description of a DEFINE_TENSORMAP
  described = cuda.TensorMap.for_description(memory, Description(dtypes.bfloat16, 256, 192, (64, 64), 128))
  words = np.frombuffer(bytes(described), np.uint64).tolist()
  out["described"] = [words[1:4], words[4:6], words[9:11]]
  return out

@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> pathlib.Path:
  if COMPILER is None: pytest.skip("no C compiler to build the fake libcuda")
  folder = tmp_path_factory.mktemp("fake_cuda_runtime")
  subprocess.run([COMPILER, "-O2", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"),
                  str(HERE / "fake_libcuda.c")], check=True)
  return folder

@pytest.fixture(scope="module")
def fake_run(fake_driver) -> dict:
  env = dict(os.environ, LD_LIBRARY_PATH=f"{fake_driver}:{os.environ.get('LD_LIBRARY_PATH', '')}", PTX="1",
             KILN_FAKE_CUDA=str(fake_driver / "libcuda.so.1"), CODEGEN_CACHE="0", CUDA_PATH="", CUDA_HOME="",
             PYTHONPATH=f"{HERE.parent.parent}:{os.environ.get('PYTHONPATH', '')}")
  env.pop("DEV", None)
  done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])

def test_watchdog_over_a_stream_that_never_finishes(fake_run):
  for message, kernel, waited, runtime_error in fake_run["watchdog"]:   # a copy out, a synchronize, an event, a copy in
    assert runtime_error and 0.2 <= waited < 5, (message, waited)
    assert "did not finish within 0.2 s" in message and "CUDA_TIMEOUT" in message and kernel in message
  kernels = [entry[1] for entry in fake_run["watchdog"]]
  assert kernels[0].startswith("E_") and len(set(kernels)) == 1, kernels   # the kiln kernel that made b
  assert fake_run["queries"] > 8   # polled, not one blocking call
  before, after = fake_run["after"]
  assert before == [float(i) for i in range(16)]   # what was on the host before stays; the context works again
  assert len(after) == 16

def test_dynamic_shared_memory_over_the_fake_driver(fake_run):
  (launch_bytes,), passed, attribute = fake_run["shared"]
  assert launch_bytes == passed == attribute == BIG_SHARED_BYTES   # cuFuncSetAttribute, then sharedMemBytes
  assert fake_run["graph_shared"] == BIG_SHARED_BYTES
  assert "allows 232448" in fake_run["too_much"]
  assert fake_run["target"] == [232448, 48 << 10]

def test_tensor_map_is_passed_by_value(fake_run):
  same, misalignment, address, head, dims, box = fake_run["tensor_map"]
  assert same and misalignment == 0 and address
  assert head == [2, 6, 3] and dims == [192, 256] and box == [64, 64]   # rank, float16, 128-byte swizzle
  assert fake_run["after_map"] == 5
  head, dims, box = fake_run["described"]   # gpu_target.TensorMap: rows x cols, (box_rows, box_cols), innermost last
  assert head == [2, 9, 3] and dims == [192, 256] and box == [64, 64]   # bfloat16, 128-byte swizzle, cols first

# ---------------- on a GPU ----------------

def _gpu_available() -> bool:
  from kiln.runtime import cuda_driver as cuda
  return cuda.available()

needs_gpu = pytest.mark.skipif(not _gpu_available(), reason="no usable CUDA GPU")

@pytest.fixture(scope="module")
def ctx():
  from kiln.runtime import cuda_driver as cuda
  context = cuda.Context(0)
  yield context
  context.close()

SPIN = r"""
extern "C" __global__ void spin_until_flag(const volatile int* flag, int* out) {
  long long spins = 0;
  while (*flag == 0) { __nanosleep(2000); spins++; }   /* ends only when the host writes the flag */
  out[0] = 7; out[1] = (int)(spins > 0);
}
"""

@needs_gpu
def test_watchdog_turns_a_hung_kernel_into_an_error(ctx):
  from kiln.helpers import Context
  from kiln.runtime import cuda_driver as cuda
  host = np.zeros(1024, np.int32)   # one page: the flag, read by the kernel over PCIe
  flag = cuda.HostMappedMemory(ctx, host.ctypes.data, host.nbytes)
  result = np.zeros(2, np.int32)
  with ctx.compile(SPIN) as module, ctx.alloc(8) as out:
    ctx.memset(out, 0)
    module.function("spin_until_flag").launch(flag, out, grid=1, block=1)
    try:
      start = time.perf_counter()
      with Context(CUDA_TIMEOUT=1.5), pytest.raises(cuda.CudaTimeoutError) as info: ctx.copy_out(result, out)
      waited = time.perf_counter() - start
      assert 1.5 <= waited < 10 and info.value.kernel == "spin_until_flag"
      assert "spin_until_flag" in str(info.value) and "within 1.5 s" in str(info.value)
      with Context(CUDA_TIMEOUT=0.3), pytest.raises(cuda.CudaTimeoutError): ctx.synchronize()
      with Context(CUDA_TIMEOUT=0.3), pytest.raises(cuda.CudaTimeoutError): ctx.event().record().synchronize()
    finally:
      host[0] = 1   # the kernel sees the flag and ends: the GPU is free again
      ctx.synchronize(timeout=30)
    ctx.copy_out(result, out)
  flag.free()
  assert result.tolist() == [7, 1]
  # the context is usable afterwards: another kernel runs
  with ctx.compile(SPIN) as module, ctx.alloc(8) as out:
    host[0] = 1
    flag = cuda.HostMappedMemory(ctx, host.ctypes.data, host.nbytes)
    module.function("spin_until_flag").launch(flag, out, grid=1, block=1)
    ctx.copy_out(result, out)
    flag.free()
  assert result[0] == 7

@needs_gpu
@pytest.mark.parametrize("ptx", [False, True])
def test_dynamic_shared_kernel_on_the_gpu(ptx):
  from kiln import Device
  from kiln.codegen.gpudims import launch_size
  from kiln.renderer.cuda import CUDARenderer
  from kiln.renderer.ptx import PTXRenderer
  from kiln.runtime import cuda_driver as cuda
  dev = Device["CUDA"]
  arch = dev.context.properties.arch
  src, uops = render(PTXRenderer(arch) if ptx else CUDARenderer(arch), big_shared_kernel())
  launch = launch_size(uops)
  assert launch[2] == BIG_SHARED_BYTES
  image = cuda.PTXCompiler(arch).compile(src) if ptx else cuda.NVRTCCompiler(arch).compile(src)
  program = dev.runtime("big_shared", image)
  data = np.random.default_rng(3).standard_normal((BLOCKS, N)).astype(np.float32)
  result = np.empty_like(data)
  with dev.context.alloc(data.nbytes) as din, dev.context.alloc(data.nbytes) as dout:
    dev.context.copy_in(din, data); dev.context.memset(dout, 0xFF)
    seconds = program(dout, din, launch=launch, wait=True)
    dev.context.copy_out(result, dout)
  assert seconds > 0 and program.function.shared_limit == BIG_SHARED_BYTES
  np.testing.assert_array_equal(result, big_shared_reference(data))

TMA_KERNEL = r"""
struct __align__(64) CUtensorMap { unsigned long long opaque[16]; };
#define ROWS 64
#define COLS 64   /* 64 fp16 = 128 bytes a row: one 128-byte swizzle span */
extern "C" __global__ void tma_tile(const __grid_constant__ CUtensorMap src, const __grid_constant__ CUtensorMap dst,
                                    unsigned short* raw, int x0, int y0) {
  __shared__ __align__(1024) unsigned short tile[ROWS * COLS];   /* the 128-byte swizzle repeats every 1024 bytes */
  __shared__ __align__(8) unsigned long long barrier;
  const unsigned bar = (unsigned)__cvta_generic_to_shared(&barrier);
  const unsigned smem = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(ROWS * COLS * 2) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(smem), "l"(reinterpret_cast<unsigned long long>(&src)), "r"(x0), "r"(y0), "r"(bar) : "memory");
  }
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(0) : "memory");
  for (int i = threadIdx.x; i < ROWS * COLS; i += blockDim.x) raw[i] = tile[i];   /* shared memory as it lies */
  if (threadIdx.x == 0) {   /* and back to global memory through the second map, unswizzled by the copy engine */
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(reinterpret_cast<unsigned long long>(&dst)), "r"(x0), "r"(y0), "r"(smem) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}
"""

def swizzle_128b(tile: np.ndarray) -> np.ndarray:
  """A tile of 128-byte rows (64 fp16) as TMA's 128-byte swizzle lays it in shared memory: row r's 16-byte chunk c
  goes to chunk c ^ (r % 8) of the row."""
  rows, cols = tile.shape
  out = np.empty_like(tile)
  for r in range(rows):
    for c in range(cols // 8):
      d = c ^ (r % 8)
      out[r, d * 8:(d + 1) * 8] = tile[r, c * 8:(c + 1) * 8]
  return out

@needs_gpu
def test_tma_tile_copy_with_128b_swizzle(ctx):
  from kiln.runtime import cuda_driver as cuda
  if ctx.properties.compute_capability < (9, 0): pytest.skip("TMA needs sm_90")
  height, width, x0, y0 = 256, 192, 64, 128
  data = np.random.default_rng(4).standard_normal((height, width)).astype(np.float16)
  raw, back = np.empty(64 * 64, np.uint16), np.empty_like(data)
  with ctx.compile(TMA_KERNEL) as module, ctx.alloc(data.nbytes) as src, ctx.alloc(data.nbytes) as dst, \
       ctx.alloc(raw.nbytes) as draw:
    ctx.copy_in(src, data); ctx.memset(dst, 0xFF); ctx.memset(draw, 0xFF)
    maps = [cuda.TensorMap(memory, "float16", (width, height), (width * 2,), (64, 64), swizzle=cuda.SWIZZLE_128B)
            for memory in (src, dst)]
    module.function("tma_tile").launch(*maps, draw, x0, y0, grid=1, block=128)
    ctx.synchronize()
    ctx.copy_out(raw, draw); ctx.copy_out(back, dst)
  tile = data[y0:y0 + 64, x0:x0 + 64]
  np.testing.assert_array_equal(raw.view(np.float16).reshape(64, 64), swizzle_128b(tile))
  expected = np.full_like(data, np.frombuffer(b"\xff\xff", np.float16)[0])
  expected[y0:y0 + 64, x0:x0 + 64] = tile
  np.testing.assert_array_equal(back.view(np.uint16), expected.view(np.uint16))

if __name__ == "__main__":
  print(json.dumps(child()))
