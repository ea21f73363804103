"""Compiling a schedule's new kernels in groups (one compiler run per group, kiln/device.py and
kiln/runtime/ops_cpu.py): kernels that share a name stay apart, each is cached and loaded on its own, and a kernel
that does not compile is reported by name while the others of its group still build."""
from __future__ import annotations
import subprocess
import numpy as np
import pytest
from kiln.device import Buffer, Device, CompileError
from kiln.dtype import dtypes
from kiln.helpers import Context

def _store_kernel(name: str, value: int) -> str:
  return f"void {name}(int* restrict data0) {{ data0[0] = {value}; }}\n" \
         f"const long long {name}_work = {value}ll;\n"

def _run(name: str, lib: bytes) -> int:
  buf = Buffer("CPU", 1, dtypes.int32).allocate()
  Device["CPU"].runtime(name, lib)(buf._buf)
  return int(buf.numpy()[0])

def test_kernels_sharing_a_name_compile_in_one_group_and_load_alone():
  compiler = Device["CPU"].compiler
  if not compiler.runs_in_subprocess: pytest.skip("the CPU compiler is not a separate process")
  sources = [_store_kernel("r_4_64_1", v) for v in (11, 22, 33)]
  libs = compiler.compile_group(sources)
  assert [_run("r_4_64_1", lib) for lib in libs] == [11, 22, 33]

def test_a_failing_kernel_is_named_and_the_rest_of_its_group_builds():
  compiler = Device["CPU"].compiler
  sources = [_store_kernel("good_one", 5), "void broken_in_group(int* data0) { undeclared_thing; }\n",
             _store_kernel("good_two", 6)]
  libs = compiler.compile_group(sources)
  assert isinstance(libs[1], CompileError) and "broken_in_group" in str(libs[1])
  assert _run("good_one", libs[0]) == 5 and _run("good_two", libs[2]) == 6

def test_compile_cached_many_uses_the_disk_cache_per_kernel(tmp_path, monkeypatch):
  compiler = Device["CPU"].compiler
  sources = [_store_kernel(f"cached_many_{i}", i + 1) for i in range(5)]
  with Context(CACHELEVEL=2, CACHEDB=str(tmp_path / "cache")):
    libs = compiler.compile_cached_many(sources, workers=2)
    assert [_run(f"cached_many_{i}", lib) for i, lib in enumerate(libs)] == [1, 2, 3, 4, 5]
    assert all(compiler.cache_path(src).exists() for src in sources)
    def no_subprocess(*args, **kwargs): raise AssertionError("the compiler ran although every kernel is cached")
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert compiler.compile_cached_many(sources, workers=2) == libs
    assert compiler.compile_cached(sources[3]) == libs[3]   # one kernel alone finds its entry

def test_precompiled_graph_matches_numpy():
  a = np.arange(24, dtype=np.float32).reshape(4, 6)
  from kiln import Tensor
  with Context(CACHELEVEL=0):   # really compile, in groups
    out = ((Tensor(a) + 1).exp2().sum(axis=1, keepdim=True) * Tensor(a)).contiguous().max(axis=0)
    np.testing.assert_allclose(out.numpy(), (np.exp2(a + 1).sum(axis=1, keepdims=True) * a).max(axis=0), rtol=1e-5)
