"""Wide global accesses on CUDA and PTX (kiln/codegen/wide_memory.py): a thread's adjacent 32-bit loads and stores as
one 16- or 8-byte access exactly where the alignment rule proves the index aligned (offset views, odd strides and
symbolic offsets stay scalar), each with a scalar twin the kernel takes where its test of the buffer's base pointer
fails (Buffer views, from_blob). Without a GPU: rendered sources, nvcc/ptxas builds without spills, the lockstep
emulator against NumPy; with one (DEV=CUDA), misaligned views and host memory against NumPy."""
from __future__ import annotations
import concurrent.futures, os, re, shutil, subprocess, tempfile
import numpy as np
import pytest
from kiln import Device, Tensor, Variable, dtypes
from kiln.codegen.gpudims import launch_size
from kiln.codegen.opt.kernel import Kernel, Opt, OptOps
from kiln.codegen.opt.gpu_heuristic import GPUTarget
from kiln.codegen.wide_memory import widen_accesses
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer
from kiln.runtime import cuda_driver as cuda
from kiln.uop.ops import UOp, Ops
from gpu_lockstep import LockstepError, run_lockstep   # noqa: E402  (test/runtime is on sys.path)
from test_cuda_render import check_ptxas_reports   # noqa: E402

N = 1 << 21   # large enough for the heuristics' coarsening UPCAST (gpudims.MIN_COARSE_BLOCKS blocks of 1024)

def _cases() -> dict[str, tuple[Tensor, list[int], int]]:
  """name: (tensor, the lanes of its kernel's wide loads, of its wide store (0: scalar))."""
  a, b, big = Tensor.empty(N), Tensor.empty(N), Tensor.empty(N + 8)
  start = Variable("start", 0, 8).bind(4)
  rows = Tensor.empty(N + 8 * 4096).reshape(N // 4096 + 8, 4096)
  return {
    "elementwise": (((a * b + 1).relu() * 0.5), [4, 4], 4),
    "int32": (Tensor.empty(N, dtype=dtypes.int32) * 3 + 1, [4], 4),
    "copy of a view at offset 4": (big[4:N + 4].contiguous(), [4], 4),
    "broadcast row": (Tensor.empty(N // 4096, 4096) + Tensor.empty(4096), [4, 4], 4),
    "broadcast column": (Tensor.empty(N // 4096, 4096) * Tensor.empty(N // 4096, 1), [4], 4),
    "symbolic row offset (a multiple of 4096)": (rows.shrink(((start, start + N // 4096), None)) * 2, [4], 4),
    "view at offset 3": (big[3:N + 3] * 2, [], 0),
    "stride 2": (Tensor.empty(2 * N)[::2] * 2, [], 0),
    "symbolic element offset": (big.shrink(((start, start + N),)) * 2, [], 0),
    "transposed": (Tensor.empty(2048, 1024).T + 1, [], 0),
    "half (16-bit lanes stay scalar)": (Tensor.empty(N, dtype=dtypes.half) + 1, [], 0),
    "small (no register tile)": (Tensor.empty(1000) + 1, [], 0),
  }

def _render(t: Tensor) -> tuple[str, str, list[UOp]]:
  """(CUDA C, PTX, uops) of `t`'s one kernel, optimized by the CUDA target's heuristics."""
  (item,) = [item for item in t.schedule() if item.ast.op is not Ops.COPY]
  name, lowered = kernel_name(item.ast), optimize_for(CUDARenderer(), lower_for_codegen(item.ast))
  c_src, uops = render_with(CUDARenderer(), name, lowered)
  return c_src, render_with(PTXRenderer(), name, lowered)[0], uops

@pytest.mark.parametrize("case", list(_cases()))
def test_wide_accesses_exactly_where_the_rule_allows(case):
  t, load_lanes, store_lanes = _cases()[case]
  c_src, ptx_src, uops = _render(t)
  assert [u.dtype.count for u in uops if u.op is Ops.LOAD and u.dtype.count > 1] == load_lanes, c_src
  assert [u.src[2].dtype.count for u in uops if u.op is Ops.STORE and u.src[2].dtype.count > 1] == \
    ([store_lanes] if store_lanes else []), c_src
  wide = len(load_lanes) + (1 if store_lanes else 0)
  # CUDA C: one cast through an aligned kiln_vec per wide access, each under its buffer's base pointer test
  assert len(re.findall(r"\? \*reinterpret_cast<const kiln_vec<\w+, 4>\*>|if \(kiln_aligned\d+_16\) \*reinterpret_cast",
                        c_src)) == wide, c_src
  assert ("kiln_aligned" in c_src) == bool(wide), c_src
  # PTX: ld/st.global.v4 under the test's predicate, and the lanes one by one under its negation
  assert len(re.findall(r"@%p\d+ (ld|st)\.global\.v4\.(f32|s32|u32)", ptx_src)) == wide, ptx_src
  assert ("setp.eq.u64" in ptx_src) == bool(wide) and ".v2." not in ptx_src and (".v4." in ptx_src) == bool(wide)

def test_every_widened_buffer_has_its_base_pointer_tested_once():
  c_src, ptx_src, _ = _render(_cases()["elementwise"][0])
  for k in range(3):
    assert c_src.count(f"const bool kiln_aligned{k}_16 = (reinterpret_cast<unsigned long long>(data{k}) & 15) == 0;") \
      == 1, c_src
    assert ptx_src.count(f"// data{k} is 16-byte aligned") == 1, ptx_src
  assert "kiln_vec<float, 4>{{data1[alu" in c_src, f"no scalar twin of the wide load:\n{c_src}"
  assert re.search(r"else \{ data0\[\w+\] = \w+; data0\[\(\w+\)\+1\] = ", c_src), f"no scalar twin of the store:\n{c_src}"

# ---------------- the rewrite itself, on hand-made uops ----------------

_A, _OUT = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
_LIDX = UOp(Ops.SPECIAL, dtypes.int32, (), ("lidx0", 64))

def _copy_uops(base: UOp, between=None, lanes: int = 4) -> list[UOp]:
  """out[base+k] = a[base+k] + 1 for k < lanes, lane by lane (`between(k)`: uops placed after lane k's load)."""
  out = [_OUT, _A, _LIDX, base]
  for k in range(lanes):
    index = base if k == 0 else base + k
    load = UOp(Ops.LOAD, dtypes.float32, (_A, index))
    value = load + 1.0
    out += ([index] if k else []) + [load] + (between(k) if between is not None else []) + \
      [value, UOp(Ops.STORE, dtypes.void, (_OUT, index, value))]
  listed: list[UOp] = []   # every constant listed before its first user, as the linearizer lists them
  for u in out:
    for c in list(u.src) + list(u.src[0].src if u.src and u.src[0].op is Ops.MUL else ()):
      if c.op is Ops.CONST and c not in listed: listed.append(c)
    listed.append(u)
  return listed

def _wide(uops: list[UOp]) -> list[tuple[str, int]]:
  return [(u.op.name, u.dtype.count if u.op is Ops.LOAD else u.src[2].dtype.count) for u in uops
          if u.op in (Ops.LOAD, Ops.STORE)]

def test_widen_accesses_groups_aligned_runs_and_refuses_the_rest():
  assert _wide(widen_accesses(_copy_uops(_LIDX * 4))) == [("LOAD", 4), ("STORE", 4)]
  assert _wide(widen_accesses(_copy_uops(_LIDX * 4), max_bytes=8)) == [("LOAD", 2), ("STORE", 2), ("LOAD", 2),
                                                                       ("STORE", 2)]
  assert _wide(widen_accesses(_copy_uops(_LIDX * 2, lanes=2))) == [("LOAD", 2), ("STORE", 2)]
  unproven = _copy_uops(_LIDX * 4 + 1)   # base not a multiple of 4: the index of lane 0 is not aligned
  assert widen_accesses(unproven) is unproven
  odd = _copy_uops(_LIDX * 3)
  assert widen_accesses(odd) is odd
  # a store into the loaded buffer at a lane's address, between the lanes' loads: the loads stay scalar
  clash = _copy_uops(_LIDX * 4, between=lambda k: [UOp(Ops.STORE, dtypes.void, (_A, _LIDX * 4 + 2,
                                                                                 UOp.const(dtypes.float32, 0.0)))]
                     if k == 0 else [])
  assert [n for n, c in _wide(widen_accesses(clash)) if n == "LOAD"] == ["LOAD"] * 4
  # a loop boundary between the lanes: nothing moves across it
  rng = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 2),), 9)
  looped = _copy_uops(_LIDX * 4, between=lambda k: [rng, UOp(Ops.ENDRANGE, dtypes.void, (rng,))] if k == 1 else [])
  assert widen_accesses(looped) is looped

def test_the_lockstep_emulator_refuses_a_misaligned_wide_access():
  uops = widen_accesses(_copy_uops(_LIDX * 4))
  misaligned = [u.replace(src=(u.src[0], _LIDX * 4 + 1)) if u.op is Ops.LOAD and u.dtype.count > 1 else u
                for u in uops]
  first = misaligned.index(next(u for u in misaligned if u.op is Ops.LOAD))
  misaligned[first:first] = [UOp.const(dtypes.int32, 1), _LIDX * 4 + 1]
  arrays = {0: np.zeros(260, np.float32), 1: np.arange(260, dtype=np.float32)}
  run_lockstep(uops, ((1, 1, 1), (64, 1, 1)), arrays)
  np.testing.assert_array_equal(arrays[0][:256], np.arange(256, dtype=np.float32) + 1)
  with pytest.raises(LockstepError, match="not aligned"):
    run_lockstep(misaligned, ((1, 1, 1), (64, 1, 1)), arrays)

# ---------------- emulated against NumPy ----------------

EMULATED = {   # name: (tensor function, NumPy function, input shapes, GPU actions: adjacent copies, then a block)
  "elementwise": (lambda a, b: (a * b + 1).relu() * 0.5, lambda a, b: np.maximum(a * b + 1, 0) * 0.5,
                  [(8, 256), (8, 256)], [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 64)]),
  "copy of a view at offset 4": (lambda a: a[:, 4:260].contiguous(), lambda a: a[:, 4:260], [(8, 264)],
                                 [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 64)]),
  "view at offset 3 (its loads: an aligned middle pair)": (lambda a: a[:, 3:259] * 2, lambda a: a[:, 3:259] * 2, [(8, 264)],
                                [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 64)]),
  "two lanes": (lambda a: a - 1, lambda a: a - 1, [(16, 128)], [Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 1, 64)]),
  "broadcast row": (lambda a, b: a * b, lambda a, b: a * b, [(8, 256), (256,)],
                    [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 32), Opt(OptOps.LOCAL, 0, 2)]),
  "in place": (None, lambda a: a * 3, [(8, 256)], [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 64)]),
}

@pytest.mark.parametrize("case", list(EMULATED))
def test_wide_kernels_match_numpy_in_the_lockstep_emulator(case):
  fn, ref, shapes, opts = EMULATED[case]
  rng = np.random.default_rng(3)
  arrays = [rng.uniform(-2, 2, s).astype(np.float32) for s in shapes]
  if fn is None:   # a kernel that reads and writes one buffer
    t = Tensor(arrays[0].copy())
    out = t.assign(t * 3)
  else: out = fn(*(Tensor(x) for x in arrays))
  (item,) = [item for item in out.schedule() if item.ast.op is not Ops.COPY]
  kernel = Kernel(lower_for_codegen(item.ast), GPUTarget())
  for opt in opts: kernel.apply(opt)
  source, uops = render_with(CUDARenderer(), kernel_name(item.ast), kernel.sink)
  buffers = {k: b.ensure_allocated().numpy().copy() for k, b in enumerate(item.bufs)}
  if fn is not None: buffers[0][:] = np.nan   # an element no thread writes fails the comparison
  run_lockstep(uops, launch_size(uops), buffers, item.var_vals)
  want = ref(*arrays)
  np.testing.assert_array_equal(buffers[0].reshape(want.shape), want.astype(np.float32))
  wide = [u for u in uops if u.op in (Ops.LOAD, Ops.STORE) and (u.dtype.count > 1 or
                                                               (u.op is Ops.STORE and u.src[2].dtype.count > 1))]
  assert bool(wide) == ("scalar" not in case), source

# ---------------- built by nvcc and ptxas ----------------

NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")

def _build(tool: list[str], name: str, src: str, suffix: str, folder: str) -> tuple[int, str]:
  path = os.path.join(folder, f"{name}.{suffix}")
  with open(path, "w") as f: f.write(src)
  result = subprocess.run([*tool, "-o", os.path.join(folder, f"{name}.out"), path], capture_output=True, text=True)
  return result.returncode, result.stdout + result.stderr

@pytest.mark.skipif(NVCC is None or PTXAS is None, reason="nvcc/ptxas (CUDA toolkit) not installed")
def test_wide_kernels_build_for_sm_90a_without_spills_and_as_vector_instructions():
  rendered = {re.sub(r"\W+", "_", case): _render(t) for case, (t, *_) in _cases().items()}
  nvcc = [NVCC, "-arch=sm_90a", "-cubin", "--fmad=false", "-Xptxas", "-v"]
  jobs = [(f"cu_{name}", c_src, "cu", nvcc) for name, (c_src, _, _) in rendered.items()]
  jobs += [(f"ptx_{name}", ptx_src, "ptx", [PTXAS, "-arch=sm_90a", "-v"]) for name, (_, ptx_src, _) in rendered.items()]
  with tempfile.TemporaryDirectory(prefix="kiln_wide_") as folder, \
       concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda job: _build(job[3], job[0], job[1], job[2], folder), jobs))
    check_ptxas_reports([(name, src) for name, src, *_ in jobs], results)
    # NVVM makes one 16-byte instruction of each aligned kiln_vec access (its PTX, from the same source)
    c_src = rendered["elementwise"][0]
    path = os.path.join(folder, "elementwise_ptx.cu")
    with open(path, "w") as f: f.write(c_src)
    ptx = subprocess.run([NVCC, "-arch=sm_90a", "-ptx", "--fmad=false", "-o", "-", path], capture_output=True,
                         text=True, check=True).stdout
  assert ptx.count("ld.global.v4.f32") == 2 and ptx.count("st.global.v4.f32") == 1, ptx

# ---------------- on the GPU ----------------

needs_gpu = pytest.mark.skipif(not cuda.available(), reason=f"no usable CUDA GPU: {cuda.unavailable_reason()}")

@needs_gpu
def test_misaligned_views_and_host_memory_take_the_scalar_twin():
  from kiln.device import Buffer
  from kiln.engine.realize import get_runner
  rng = np.random.default_rng(4)
  x = rng.uniform(-2, 2, N + 8).astype(np.float32)
  # from_blob over host memory 4 bytes past an aligned address: the widened kernel, unaligned base pointers
  host = np.zeros(N + 16, np.float32)
  start = (-host.ctypes.data % 16) // 4 + 1   # 4 bytes past a 16-byte boundary
  host[start:start + N] = x[:N]
  t = Tensor.from_blob(host.ctypes.data + 4 * start, (N,), device="CUDA")
  np.testing.assert_array_equal(((t * 2 + 1).relu()).numpy(), np.maximum(x[:N] * 2 + 1, 0))
  t.assign(t * 3).realize()   # a widened in-place kernel writing misaligned host memory
  Device["CUDA"].synchronize()
  np.testing.assert_array_equal(host[start:start + N], x[:N] * 3)
  # the same compiled kernel on device buffers (aligned) and on views 4, 8 and 12 bytes into them
  a, b = Tensor(x[:N], device="CUDA"), Tensor(x[8:N + 8], device="CUDA")
  out = (a * b + 1).relu()
  (item,) = [i for i in out.schedule() if i.ast.op is not Ops.COPY]
  runner = get_runner("CUDA", item.ast)
  assert "kiln_aligned" in runner.source or ".v4." in runner.source, runner.source
  for offset in (0, 4, 8, 12):
    bases = [Buffer("CUDA", N + 4, dtypes.float32).ensure_allocated() for _ in range(3)]
    views = [base.view(N, dtypes.float32, offset).ensure_allocated() for base in bases]
    views[1].copyin(memoryview(x[:N].copy()).cast("B"))
    views[2].copyin(memoryview(x[8:N + 8].copy()).cast("B"))
    runner([views[k] for k in range(3)], wait=True)
    got = np.empty(N, np.float32)
    views[0].copyout(memoryview(got).cast("B"))
    np.testing.assert_array_equal(got, np.maximum(x[:N] * x[8:N + 8] + 1, 0), err_msg=f"views at byte {offset}")
