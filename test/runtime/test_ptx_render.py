"""The PTX renderer (kiln/renderer/ptx.py, `PTX=1`) without a GPU: the kernels of test_cuda_render.py rendered as PTX,
each assembled by `ptxas -arch=sm_90a -v` (where installed) with no spills and no stack frame, and the instructions
chosen for the C renderer's semantics. With a GPU: PTX and CUDA C give the same bits on the same inputs."""
from __future__ import annotations
import concurrent.futures, functools, os, re, shutil, subprocess, tempfile
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.dtype import to_numpy_dtype
from kiln.codegen.gpudims import launch_size
from kiln.device import CompileError
from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
from kiln.renderer import kernel_function_name, kernel_signature
from kiln.renderer.cuda import CUDARenderer
from kiln.renderer.ptx import PTXRenderer, _bits, ptx_const
from kiln.runtime import cuda_driver as cuda
from kiln.uop.ops import UOp, Ops
from test_cuda_render import _cases, check_ptxas_reports   # noqa: E402  (test/runtime is on sys.path: pytest's default import mode)

UNSUPPORTED: dict[str, str] = {}   # cases the PTX renderer refuses (NotImplementedError naming what), none now

def _kernels(t: Tensor) -> list[tuple[str, str, str, list[UOp], object]]:
  """(name, PTX, CUDA C, uops, schedule item) of every kernel realizing `t`, optimized as on the CUDA device."""
  out, ptx, c = [], PTXRenderer(), CUDARenderer()
  for item in t.schedule():
    if item.ast.op is Ops.COPY: continue
    name = kernel_name(item.ast)
    lowered = optimize_for(c, lower_for_codegen(item.ast))
    c_src, _ = render_with(c, name, lowered)
    ptx_src, uops = render_with(ptx, name, lowered)
    out.append((name, ptx_src, c_src, uops, item))
  return out

@functools.cache
def rendered() -> dict[str, list]:
  """Every supported case's kernels, rendered once per test session."""
  return {case: _kernels(t) for case, t in _cases().items() if case not in UNSUPPORTED}

@pytest.mark.parametrize("case", [c for c in _cases() if c not in UNSUPPORTED])
def test_renders_a_ptx_module_with_the_cuda_signature(case):
  kernels = rendered()[case]
  assert kernels, f"{case}: nothing to render"
  for name, src, c_src, uops, _ in kernels:
    assert src.startswith("// kiln: kernel") and ".version 9.0\n.target sm_90a\n.address_size 64\n" in src, src
    assert f".visible .entry {name}(" in src, f"{case}: no entry {name}:\n{src}"
    # the same parameters in the same order as the CUDA C kernel (kernel_signature)
    c_params = re.findall(r"\b(data\d+|var\d+)\b", c_src.split(f"{name}(", 1)[1].split(")", 1)[0])
    ptx_params = re.findall(r"\.param \.\w+ (data\d+|var\d+)", src)
    assert ptx_params == c_params, f"{case} {name}: {ptx_params} != {c_params}"
    buffers, variables = kernel_signature(uops)
    assert len(ptx_params) == len(buffers) + len(variables)
    if any(u.op is Ops.SHUFFLE for u in uops):   # a butterfly over the whole warp, one per 32 bits of the value
      shuffles = re.findall(r"shfl\.sync\.bfly\.b32 %[rf]\d+, %[rf]\d+, \d+, 0x1f, 0xffffffff", src)
      wide = sum(_bits(u.dtype) == 64 for u in uops if u.op is Ops.SHUFFLE)
      assert len(shuffles) == sum(u.op is Ops.SHUFFLE for u in uops) + wide, f"{case} {name}:\n{src}"

def test_fp8_casts_round_once_from_the_double_and_fp8_memory_is_bytes():
  (name, src, *_), = rendered()["fp8"]   # float32 -> fp8 -> float32: rounded by kiln_fp8_bits's steps on the double
  assert "cvt.f64.f32" in src and "0x7FFFFFFFFFFFFFFF" in src and "cvt.rn.f32.u32" in src, src
  (name, src, *_), = _kernels(Tensor.empty(64, dtype=dtypes.fp8e5m2) + 1)
  assert "ld.global.u8" in src and "st.global.u8" in src, src

def test_float_ops_are_rounded_and_never_contracted():
  for case, kernels in rendered().items():
    for name, src, *_ in kernels:
      # every float add/sub/mul/div/fma says .rn, so ptxas never fuses a multiply into an add
      loose = re.findall(r"^\s*(?:add|sub|mul|div|fma|sqrt|rcp)\.f(?:32|64)\b", src, re.M)
      assert not loose, f"{case} {name}: unrounded float ops {loose}:\n{src}"

def _body(uops: list[UOp]) -> str:
  return PTXRenderer().render("k", uops)

def _elementwise(op: Ops, dtype, *operand_dtypes, out_dtype=None) -> str:
  """The PTX of `data0[i] = op(data1[i], data2[i], ...)` over 256 threads."""
  out_dtype = out_dtype or dtype
  idx = UOp(Ops.SPECIAL, dtypes.int32, (), ("lidx0", 256))
  bufs = [UOp(Ops.DEFINE_GLOBAL, out_dtype, (), 0)]
  loads = []
  for k, dt in enumerate(operand_dtypes or (dtype,)):
    buf = UOp(Ops.DEFINE_GLOBAL, dt, (), k + 1)
    bufs.append(buf)
    loads.append(UOp(Ops.LOAD, dt, (buf, idx)))
  value = UOp(op, out_dtype, tuple(loads))
  store = UOp(Ops.STORE, dtypes.void, (bufs[0], idx, value))
  return _body([*bufs, idx, *loads, value, store])

def test_mulacc_is_exactly_one_fma():
  src = _elementwise(Ops.MULACC, dtypes.float32, dtypes.float32, dtypes.float32, dtypes.float32)
  assert len(re.findall(r"\bfma\.rn\.f32\b", src)) == 1 and "mul.rn" not in src and "add.rn" not in src, src
  half = _elementwise(Ops.MULACC, dtypes.float16, dtypes.float16, dtypes.float16, dtypes.float16)
  assert len(re.findall(r"\bfma\.rn\.f32\b", half)) == 1, half   # in float, then rounded to float16 once
  assert ".maxntid 256, 1, 1 .minnctapersm 1" in src

def test_integer_division_is_guarded_as_in_c():
  src = _elementwise(Ops.IDIV, dtypes.int32, dtypes.int32, dtypes.int32)
  assert "div.s32" in src and "setp.eq.s32" in src and ", -1;" in src and "neg.s32" in src, src
  unsigned = _elementwise(Ops.MOD, dtypes.uint32, dtypes.uint32, dtypes.uint32)
  assert "rem.u32" in unsigned and ", -1;" not in unsigned, unsigned

def test_float_to_int_cast_gives_int_min_out_of_range():
  src = _elementwise(Ops.CAST, dtypes.int32, dtypes.float32)
  assert "abs.f32" in src and "0f4F000000" in src and "cvt.rzi.s32.f32" in src and "0x80000000" in src, src
  wide = _elementwise(Ops.CAST, dtypes.uint32, dtypes.float32)
  assert "cvt.rzi.s64.f32" in wide and "0f5F000000" in wide and "cvt.u32.u64" in wide, wide

def test_narrow_ints_are_truncated_after_each_op():
  src = _elementwise(Ops.ADD, dtypes.int8, dtypes.int8, dtypes.int8)
  assert "ld.global.s8" in src and "cvt.s32.s8" in src and "st.global.s8" in src, src
  src = _elementwise(Ops.MUL, dtypes.uint16, dtypes.uint16, dtypes.uint16)
  assert "and.b32" in src and ", 65535;" in src, src

def test_half_rounds_after_each_op_and_stores_16_bits():
  src = _elementwise(Ops.ADD, dtypes.float16, dtypes.float16, dtypes.float16)
  assert "cvt.f32.f16" in src and "add.rn.f32" in src and "0f77800000" in src and "st.global.u16" in src, src
  bf = _elementwise(Ops.MUL, dtypes.bfloat16, dtypes.bfloat16, dtypes.bfloat16)
  assert "shl.b32" in bf and "0x7FFF" in bf and "st.global.u16" in bf, bf

def test_float_max_keeps_nan_and_ne_is_unordered():
  src = _elementwise(Ops.MAX, dtypes.float32, dtypes.float32, dtypes.float32)
  assert "setp.nan.f32" in src and "setp.gt.or.f32" in src, src
  ne = _elementwise(Ops.CMPNE, dtypes.float32, dtypes.float32, dtypes.float32, out_dtype=dtypes.bool)
  assert "setp.neu.f32" in ne and "st.global.u8" in ne, ne

def test_pow_and_fmod():
  pow_ = _elementwise(Ops.POW, dtypes.float32, dtypes.float32, dtypes.float32)
  assert "lg2.approx.f32" in pow_ and "ex2.approx.f32" in pow_ and "0f7FFFFFFF" in pow_, pow_
  fmod = _elementwise(Ops.MOD, dtypes.float32, dtypes.float32, dtypes.float32)
  assert "fma.rn.f64" in fmod and "cvt.rzi.f64.f64" in fmod and "_fmod:" in fmod, fmod

def test_unsupported_ops_raise_not_implemented():
  with pytest.raises(NotImplementedError, match="MOD"): _elementwise(Ops.MOD, dtypes.float64, dtypes.float64,
                                                                     dtypes.float64)
  with pytest.raises(NotImplementedError, match="POW"): _elementwise(Ops.POW, dtypes.float64, dtypes.float64,
                                                                     dtypes.float64)
  with pytest.raises(NotImplementedError, match="EXP2"): _elementwise(Ops.EXP2, dtypes.float32)

def test_constants():
  assert ptx_const(1.0, dtypes.float32) == "0f3F800000" and ptx_const(-2.0, dtypes.float64) == "0dC000000000000000"
  assert ptx_const(-1, dtypes.int32) == "-1" and ptx_const(2 ** 32 - 1, dtypes.uint32) == "0xFFFFFFFF"
  assert ptx_const(1.0009765625, dtypes.float16) == "0f3F802000"

def test_ptx_compiler_gives_the_nul_terminated_text():
  compiler = cuda.PTXCompiler("sm_90a")
  assert compiler.compile(".target sm_90a\n") == b".target sm_90a\n\0" and "sm_90a" in compiler.cache_key()
  with pytest.raises(CompileError): compiler.compile(".target sm_80\n")

PTXAS = shutil.which("ptxas")

def _assemble(name: str, src: str, folder: str) -> tuple[int, str]:
  """ptxas's exit code and its -v report for one module."""
  path = os.path.join(folder, f"{name}.ptx")
  with open(path, "w") as f: f.write(src)
  result = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "-o", os.path.join(folder, f"{name}.cubin"), path],
                          capture_output=True, text=True)
  return result.returncode, result.stdout + result.stderr

@pytest.mark.skipif(PTXAS is None, reason="ptxas (CUDA toolkit) not installed")
def test_every_kernel_assembles_for_sm_90a_without_spills():
  jobs = [(f"{case}_{k}_{name}", src) for case, kernels in rendered().items()
          for k, (name, src, *_) in enumerate(kernels)]
  jobs += [(f"narrow_{op.name}_{dt.name}", _elementwise(op, dt, dt, dt)) for op in (Ops.ADD, Ops.IDIV, Ops.SHL, Ops.MAX)
           for dt in (dtypes.int8, dtypes.uint16, dtypes.int64)]
  jobs += [(f"float_{op.name}_{dt.name}", _elementwise(op, dt, dt, dt)) for op in (Ops.POW, Ops.MOD)
           for dt in (dtypes.float32, dtypes.float16)]
  jobs += [(f"cast_{a.name}_{b.name}", _elementwise(Ops.CAST, b, a)) for a in (dtypes.float32, dtypes.float64,
           dtypes.float16, dtypes.int8, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.bool)
           for b in (dtypes.int8, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16,
                     dtypes.float64, dtypes.bool) if a != b]
  with tempfile.TemporaryDirectory(prefix="kiln_ptx_") as folder, \
       concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda job: _assemble(*job, folder), jobs))
  check_ptxas_reports(jobs, results)

# ---- on a GPU: the same bits as the CUDA C renderer ----
needs_gpu = pytest.mark.skipif(not cuda.available() or cuda.device_count() == 0, reason="no CUDA GPU")

def _random_contents(dtype, count: int, rng: np.random.Generator) -> np.ndarray:
  """Inputs for one buffer: ordinary values with a few specials (inf, NaN, -0, large) for floats."""
  if dtype == dtypes.bool: return rng.integers(0, 2, count).astype(np.uint8)
  if dtypes.is_int(dtype):
    info = np.iinfo(to_numpy_dtype(dtype))
    return rng.integers(max(info.min, -1000), min(info.max, 1000), count, endpoint=True).astype(to_numpy_dtype(dtype))
  values = (rng.standard_normal(count) * 8).astype(np.float32)
  specials = np.array([np.inf, -np.inf, np.nan, -0.0, 3e38, -7e4, 1e-40], np.float32)
  values[rng.integers(0, count, min(count, 16))] = rng.choice(specials, min(count, 16))
  if dtype == dtypes.bfloat16: return (values.view(np.uint32) >> 16).astype(np.uint16)
  with np.errstate(over="ignore"): return values.astype(to_numpy_dtype(dtype))   # 3e38 -> inf in float16

@needs_gpu
@pytest.mark.parametrize("case", [c for c in _cases() if c not in UNSUPPORTED])
def test_ptx_matches_cuda_c_bit_for_bit(case):
  ctx = cuda.Context(0)
  arch, rng = ctx.properties.arch, np.random.default_rng(0)
  nvrtc, assembler = cuda.NVRTCCompiler(arch), cuda.PTXCompiler(arch)
  for name, ptx_src, c_src, uops, item in _kernels(_cases()[case]):
    buffers, variables = kernel_signature(uops)
    assert not variables
    grid, block = launch_size(uops) or ((1, 1, 1), (1, 1, 1))
    contents = [_random_contents(b.dtype, item.bufs[b.arg].size, rng) for b in buffers]
    results = []
    for image in (nvrtc.compile(c_src), assembler.compile(ptx_src.replace(".target sm_90a", f".target {arch}"))):
      module, memory = ctx.load(image), [ctx.alloc(max(1, c.nbytes)) for c in contents]
      for mem, c in zip(memory, contents): ctx.copy_in(mem, c)
      module.function(kernel_function_name(name)).launch(*memory, grid=grid, block=block)
      ctx.synchronize()
      outs = [np.empty_like(c) for c in contents]
      for out, mem in zip(outs, memory): ctx.copy_out(out, mem)
      results.append(outs)
      for mem in memory: mem.free()
      module.close()
    for k, (c_out, ptx_out) in enumerate(zip(*results)):
      differ = np.flatnonzero(c_out.view(np.uint8) != ptx_out.view(np.uint8))
      assert differ.size == 0, f"{case} {name} data{buffers[k].arg}: {differ.size} bytes differ, first at {differ[:8]}"
