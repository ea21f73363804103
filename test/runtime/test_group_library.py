"""A compile group as one C translation unit and one shared library (kiln/runtime/ops_cpu.py), compiled while the
next kernels render (kiln/device.py CompilePipeline): every kind of rendered kernel joins a unit, each kernel is
still cached, loaded and run on its own, a broken kernel is named while the others build, the minimal link loads
kernels that call libm and falls back to the compiler driver for what it cannot link."""
from __future__ import annotations
import os, shutil, subprocess
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.codegen import parallel
from kiln.device import Buffer, CompileError, CompilePipeline, Device
from kiln.helpers import Context
from kiln.runtime import ops_cpu
from kiln.runtime.ops_cpu import (ClangCompiler, join_sources, link_library, load_library, rename_kernel, split_symbol,
                                  translation_units, with_symbol)

pytestmark = pytest.mark.skipif(not isinstance(Device["CPU"].compiler, ClangCompiler), reason="CPU device's compiler")

def _store_kernel(name: str, value: int) -> str:
  return f"void {name}(int* restrict data0) {{ data0[0] = {value}; }}\nconst long long {name}_work = {value}ll;\n"

def _run(name: str, lib: bytes) -> int:
  buf = Buffer("CPU", 1, dtypes.int32).allocate()
  Device["CPU"].runtime(name, lib)(buf._buf)
  return int(buf.numpy()[0])

def _graph(rng: np.random.Generator) -> tuple[list[Tensor], list[np.ndarray]]:
  """Outputs whose kernels use vector constants, half/bfloat16/fp8 and vector fma helpers, a split reduction and shared
  names."""
  a = rng.standard_normal((16, 64)).astype(np.float32)
  big = rng.standard_normal(20011).astype(np.float32)
  w = rng.standard_normal((64, 64)).astype(np.float32)
  ta, tbig = Tensor(a), Tensor(big)
  outs = [(ta.half() * 2).float(), (Tensor(a[:12]).cast(dtypes.bfloat16) + 1).float(),
          Tensor(a[:10]).cast(dtypes.fp8e4m3).float(),
          (ta * 3 + 1).exp2().sum(axis=1), (ta - 2).exp2().sum(axis=1), ta.max(axis=0), tbig.sum(),
          Tensor(a[:8]).half().float().sum(axis=1), Tensor(a[:, :32]).cast(dtypes.bfloat16).float().max(axis=0),
          Tensor(a[:4]).cast(dtypes.fp8e4m3).float() * 2,   # other shapes: other names, so in a unit with the above
          Tensor(w) @ Tensor(w), Tensor(w[:32]) @ Tensor(w)]   # vector fused multiply-adds
  torch = pytest.importorskip("torch")
  want = [a.astype(np.float16).astype(np.float32) * 2, (torch.tensor(a[:12]).bfloat16() + 1).float().numpy(),
          torch.tensor(a[:10]).to(torch.float8_e4m3fn).float().numpy(), np.exp2(a * 3 + 1).sum(axis=1),
          np.exp2(a - 2).sum(axis=1), a.max(axis=0), big.sum(), a[:8].astype(np.float16).astype(np.float32).sum(axis=1),
          torch.tensor(a[:, :32]).bfloat16().float().numpy().max(axis=0),
          torch.tensor(a[:4]).to(torch.float8_e4m3fn).float().numpy() * 2, w @ w, w[:32] @ w]
  return outs, want

@pytest.fixture
def small_chunks(monkeypatch):
  """Split reductions from a few hundred uops of work on (kiln/codegen/parallel.py)."""
  monkeypatch.setattr(parallel, "REDUCE_CHUNK_WORK", 256)

def test_a_graph_of_many_kinds_compiles_in_shared_libraries_and_matches_numpy(monkeypatch, small_chunks):
  groups: list[tuple[list[str], list]] = []
  compile_group = ClangCompiler.compile_group
  def recording(self, sources):
    libs = compile_group(self, sources)
    groups.append((sources, libs))
    return libs
  monkeypatch.setattr(ClangCompiler, "compile_group", recording)
  outs, want = _graph(np.random.default_rng(0))
  with Context(CACHELEVEL=0):
    Tensor.realize(*outs)
  for out, expected in zip(outs, want):
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-3)
  joined = [(sources, libs) for sources, libs in groups if len(sources) >= 2]
  assert joined, f"no group of two or more kernels was compiled: {[len(s) for s, _ in groups]}"
  for sources, libs in joined:   # one library per translation unit: the units compiled (no kernel-alone fallback)
    assert all(isinstance(lib, bytes) for lib in libs), libs
    assert len({split_symbol(lib)[0] for lib in libs}) == len(translation_units(sources))
  assert any(len(translation_units(sources)) < len(sources) for sources, _ in joined), "no two kernels joined"

def test_every_rendered_kernel_joins_one_unit_and_loads_alone(small_chunks):
  outs, _ = _graph(np.random.default_rng(1))
  from kiln.engine.realize import get_runner
  from kiln.uop.ops import Ops
  kernels = [item.ast for item in Tensor.schedule(*outs) if item.ast.op is Ops.SINK]
  with Context(CACHELEVEL=0):
    Tensor.realize(*outs)
  # this graph's kernels alone (every runner of the process, after the ONNX tests, made one unit of thousands)
  runners = list({r.source: r for r in (get_runner("CPU", ast) for ast in kernels)}.values())
  sources = [r.source for r in runners]
  for helper in ("kiln_half_to_f", "kiln_bf16_to_f", "kiln_fp8_to_f", "kiln_const", "_part(", "kiln_fma_"):   # what it covers
    assert any(sum(helper in sources[i] for i, _ in unit) >= 2 for unit in translation_units(sources)), helper
  libs = Device["CPU"].compiler.compile_group(sources)
  assert all(isinstance(lib, bytes) for lib in libs), libs
  assert len({split_symbol(lib)[0] for lib in libs}) == len(translation_units([r.source for r in runners]))
  for runner, lib in zip(runners, libs):
    program = Device["CPU"].runtime(runner.name, lib)
    assert (program.task is None) == (runner.program.task is None) and program.chunks == runner.program.chunks

def test_same_named_kernels_share_one_unit_renamed_and_each_loads_alone_from_the_cache(tmp_path):
  sources = [_store_kernel("k_a", 1), _store_kernel("k_a", 2), _store_kernel("k_b", 3), _store_kernel("k_a", 4)]
  assert translation_units(sources) == [[(0, None), (1, "k_a_k1"), (2, None), (3, "k_a_k2")]]
  compiler = Device["CPU"].compiler
  with Context(CACHELEVEL=2, CACHEDB=str(tmp_path / "cache")):
    libs = compiler.compile_cached_many(sources, workers=1)
    alone = [compiler.compile_cached(src) for src in sources]   # a later process: each finds its own entry
  assert libs[0] is libs[2] and split_symbol(libs[1]) == (libs[0], "k_a_k1") and split_symbol(libs[0])[1] is None
  assert [_run(name, lib) for name, lib in zip(("k_a", "k_a", "k_b", "k_a"), alone)] == [1, 2, 3, 4]
  programs = [Device["CPU"].runtime("k_a", lib) for lib in alone[:2]]
  assert programs[0].lib is programs[1].lib and (programs[0].name, programs[1].name) == ("k_a", "k_a_k1")

def test_rename_kernel_renames_the_derived_names_only():
  src = ("static void r_4_part(int c) {}\nvoid r_4(int* restrict data0) { int r_4_1 = 0; r_4_part(r_4_1); }\n"
         "void r_4_task(void **bufs) { r_4((int*)bufs[0]); }\nconst long long r_4_work = 5ll;\n")
  renamed = rename_kernel(src, "r_4_k1")
  assert renamed == src.replace("r_4(", "r_4_k1(").replace("r_4_part", "r_4_k1_part").replace(
    "r_4_task", "r_4_k1_task").replace("r_4_work", "r_4_k1_work"), renamed
  with pytest.raises(ValueError, match="no kernel function"): rename_kernel("int x;", "k")
  with pytest.raises(ValueError, match="bad kernel symbol"): with_symbol(b"lib", "not a name")

def test_renamed_split_reductions_in_one_group_match_numpy(small_chunks, monkeypatch):
  """Two split reductions of one name (`_part`, `_finish`, `_chunks`, `_scratch`) joined and run on the pool."""
  symbols: list = []
  join = ops_cpu.join_sources
  def recording(sources, names=None):
    symbols.append(names)
    return join(sources, names)
  monkeypatch.setattr(ops_cpu, "join_sources", recording)
  monkeypatch.setattr(os, "cpu_count", lambda: 1)   # one compile group for the whole schedule
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal(20011).astype(np.float32), rng.standard_normal(20011).astype(np.float32)
  with Context(CACHELEVEL=0):
    outs = [(Tensor(a) * 2).sum(), (Tensor(b) + 1).sum()]
    Tensor.realize(*outs)
  np.testing.assert_allclose([o.item() for o in outs], [(a * 2).sum(), (b + 1).sum()], rtol=1e-4)
  assert any(names and any(names) for names in symbols), symbols

def test_join_renames_constants():
  with_const = "typedef float kiln_floatx4 __attribute__((vector_size(16)));\n" \
               "static const kiln_floatx4 kiln_const0 = {{1.0f, 1.0f, 1.0f, 1.0f}};\n" \
               "void {name}(float* restrict data0) {{ kiln_floatx4 v = kiln_const0 * {k}.0f; data0[0] = v[1]; }}\n"
  joined = join_sources([with_const.format(name="k_one", k=2), with_const.format(name="k_two", k=3)])
  assert joined.count("typedef float kiln_floatx4") == 1 and "kiln_k1_const0 * 3.0f" in joined
  libs = Device["CPU"].compiler.compile_group([with_const.format(name="k_one", k=2),
                                               with_const.format(name="k_two", k=3)])
  assert libs[0] is libs[1]
  for name, want in (("k_one", 2.0), ("k_two", 3.0)):
    buf = Buffer("CPU", 1, dtypes.float32).allocate()
    Device["CPU"].runtime(name, libs[0])(buf._buf)
    assert float(buf.numpy()[0]) == want

def test_group_library_is_cached_once_and_loaded_once(tmp_path):
  compiler = Device["CPU"].compiler
  sources = [_store_kernel(f"shared_lib_{i}", 10 + i) for i in range(4)]
  with Context(CACHELEVEL=2, CACHEDB=str(tmp_path / "cache")):
    libs = compiler.compile_cached_many(sources, workers=1)
    assert all(lib is libs[0] for lib in libs)
    inodes = {os.stat(compiler.cache_path(src)).st_ino for src in sources}
    assert len(inodes) == 1, "the kernels of one library should share one cache file (hard links)"
    alone = compiler.compile_cached(sources[2])   # a later process: one kernel finds its entry alone
  assert alone == libs[0] and _run("shared_lib_2", alone) == 12
  assert load_library(alone) is load_library(libs[0])
  programs = [Device["CPU"].runtime(f"shared_lib_{i}", libs[0]) for i in range(4)]
  assert len({id(p.lib) for p in programs}) == 1 and len({id(p.fxn) for p in programs}) == 4

def test_pipeline_names_a_broken_kernel_and_builds_the_rest():
  sources = [_store_kernel(f"pipe_ok_{i}", i) for i in range(6)]
  sources.insert(3, "void pipe_broken(int* data0) { not_declared_anywhere; }\n")
  with Context(CACHELEVEL=0):
    pipeline = CompilePipeline(Device["CPU"].compiler, expected=len(sources), workers=2)
    indices = [pipeline.add(src, src.split("(")[0].split()[-1]) for src in sources]
    libs = pipeline.results()
  assert indices == list(range(len(sources)))
  assert isinstance(libs[3], CompileError) and "pipe_broken" in str(libs[3])
  assert [_run(f"pipe_ok_{i}", lib) for i, lib in enumerate(libs[:3] + libs[4:])] == list(range(6))

def test_pipeline_with_same_named_kernels_keeps_each_its_own():
  sources = [_store_kernel("pipe_same", v) for v in range(5)]
  with Context(CACHELEVEL=0):
    pipeline = CompilePipeline(Device["CPU"].compiler, expected=len(sources), workers=2)
    for src in sources: pipeline.add(src, "pipe_same")
    libs = pipeline.results()
  assert [_run("pipe_same", lib) for lib in libs] == list(range(5))

def test_a_kernel_calling_libm_links_minimally_and_loads():
  a = np.linspace(0.5, 3.0, 64, dtype=np.float32)
  with Context(TRANSCENDENTAL=0, CACHELEVEL=0):
    out = ((Tensor(a).exp() + Tensor(a).log()) * Tensor(a).sin()).numpy()
  np.testing.assert_allclose(out, (np.exp(a) + np.log(a)) * np.sin(a), rtol=1e-5)

@pytest.mark.skipif(ops_cpu._minimal_link_line() is None, reason="no minimal link on this system")
def test_the_minimal_link_falls_back_to_the_driver(tmp_path):
  """128-bit division needs the compiler's runtime library, which the minimal link leaves out."""
  command = tuple(Device["CPU"].compiler.command())
  src = tmp_path / "wide.c"
  src.write_text("unsigned long long wide_div(unsigned long long a, unsigned long long b) {\n"
                 "  return (unsigned long long)(((unsigned __int128)a << 64) / ((unsigned __int128)b << 60)); }\n")
  obj, lib = str(tmp_path / "wide.o"), str(tmp_path / "wide.so")
  compile_only = [arg for arg in command if arg not in ("-shared", "-lm")]
  subprocess.run([*compile_only, "-c", "-o", obj, str(src)], check=True)
  minimal = ops_cpu._minimal_link_line()
  assert subprocess.run([minimal[0], "-shared", "-z", "defs", "-o", lib, obj, *minimal[1:]],
                        capture_output=True).returncode != 0, "expected the minimal link to need libgcc here"
  assert link_library(command, obj, lib)
  fn = load_library(open(lib, "rb").read()).wide_div
  fn.restype, fn.argtypes = __import__("ctypes").c_ulonglong, [__import__("ctypes").c_ulonglong] * 2
  assert fn(3, 1) == 48

@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_gcc_compiles_a_group():
  sources = [_store_kernel("gcc_group", 7), _store_kernel("gcc_group", 8), _store_kernel("gcc_other", 9)]
  with Context(CC="gcc"):
    libs = ClangCompiler().compile_group(sources)
  assert [_run(n, lib) for n, lib in zip(("gcc_group", "gcc_group", "gcc_other"), libs)] == [7, 8, 9]
  assert libs[0] is libs[2]
