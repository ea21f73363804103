"""The CPU target description (kiln/runtime/cpu_target.py) read from fake /proc/cpuinfo and sysfs trees, the -march
override, and the heuristics' plan under each target: the tiles and lanes they choose, and kernels built from that
plan (compiled and run on this machine's CPU device) matching NumPy."""
from __future__ import annotations
import os, platform, sys
import numpy as np
import pytest
from kiln import Tensor, Device
from kiln.helpers import Context
from kiln.codegen.opt import Kernel, Opt, OptOps, heuristic_opts, optimize_kernel
from kiln.codegen.opt.heuristic import BASELINE_PLAN, plan_for
from kiln.engine.realize import lower_for_codegen
from kiln.runtime import cpu_target
from kiln.runtime.cpu_target import CPUTarget, describe_cpu, for_flags, march_in_flags, read_caches
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "codegen"))
from kernel_runs import last_kernel_item, run_lowered   # noqa: E402

EPYC_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx f16c fma bmi1 avx2 bmi2 adx sha_ni"
XEON_FLAGS = EPYC_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx_vnni avx512_fp16 amx_tile"
# (name, cpuinfo text, machine, caches as (level, type, size) or None for no sysfs tree, cores)
MACHINES = {
  "avx2_epyc": (f"processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: {EPYC_FLAGS}\n", "x86_64",
                [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"), (3, "Unified", "32768K")], 2),
  "avx512_xeon": (f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: {XEON_FLAGS}\n", "x86_64",
                  [(1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K"), (3, "Unified", "105M")], 2),
  "aarch64": ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 atomics fphp asimdhp asimddp sve\n", "aarch64",
              [(1, "Data", "64K"), (2, "Unified", "1024K"), (3, "Unified", "32M")], 4),
  "plain_x86_no_sysfs": ("processor\t: 0\nflags\t\t: fpu sse sse2 ssse3\n", "x86_64", None, 1),
}
# what each should read: (isa, vector bytes, vector registers, L1d, L2, L3)
EXPECTED = {
  "avx2_epyc": ("avx2", 32, 16, 32 << 10, 512 << 10, 32 << 20),
  "avx512_xeon": ("avx512", 64, 32, 48 << 10, 2 << 20, 105 << 20),
  "aarch64": ("neon", 16, 32, 64 << 10, 1 << 20, 32 << 20),
  "plain_x86_no_sysfs": ("sse", 16, 16, *cpu_target.FALLBACK_CACHES.values()),
}

def _fake_machine(tmp_path, name: str) -> CPUTarget:
  """The description read from `name`'s fake /proc/cpuinfo file and sysfs cache tree under `tmp_path`."""
  text, machine, caches, cores = MACHINES[name]
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text(text)
  cache_dir = None
  if caches is not None:
    cache_dir = tmp_path / "cache"
    for i, (level, kind, size) in enumerate(caches):
      entry = cache_dir / f"index{i}"
      entry.mkdir(parents=True)
      for field, value in (("level", level), ("type", kind), ("size", size)): (entry / field).write_text(f"{value}\n")
  return describe_cpu(cpuinfo_path=cpuinfo, cache_dir=cache_dir, cores=cores, machine=machine)

@pytest.mark.parametrize("name", MACHINES)
def test_fake_machines_give_valid_descriptions(tmp_path, name):
  target = _fake_machine(tmp_path, name)
  isa, width, registers, l1, l2, l3 = EXPECTED[name]
  got = (target.isa, target.vector_bytes, target.vector_registers, target.l1d_bytes, target.l2_bytes, target.l3_bytes)
  assert got == (isa, width, registers, l1, l2, l3), f"{name}: {target}"
  assert target.cores == MACHINES[name][3] and target.float_lanes == width // 4 and target.lanes(8) == width // 8
  plan = plan_for(target)
  # the register tile's accumulators fit the register file and the tile's vector axis is whole vectors
  assert plan.wide % plan.lanes == 0 and plan.wide // plan.lanes * 8 <= target.vector_registers, plan

def test_instruction_cache_and_junk_do_not_count_and_missing_levels_fall_back(tmp_path):
  for i, (level, kind, size) in enumerate([(1, "Instruction", "64K"), (1, "Data", "48K"), (2, "Unified", "junk")]):
    (tmp_path / f"index{i}").mkdir()
    for field, value in (("level", level), ("type", kind), ("size", size)):
      (tmp_path / f"index{i}" / field).write_text(str(value))
  assert read_caches(tmp_path) == {1: 48 << 10, 2: cpu_target.FALLBACK_CACHES[2], 3: cpu_target.FALLBACK_CACHES[3]}
  assert read_caches(tmp_path / "missing") == cpu_target.FALLBACK_CACHES

def test_march_in_the_compiler_flags_decides_the_instruction_set(tmp_path):
  xeon = _fake_machine(tmp_path, "avx512_xeon")
  assert march_in_flags(["-O2", "-march=native"]) is None and march_in_flags(["-march=native", "-march=x86-64-v3"]) \
    == "x86-64-v3"   # the last -march wins, as in gcc and clang
  v3 = for_flags(xeon, ["-march=native", "-O2", "-march=x86-64-v3"])
  assert (v3.isa, v3.float_lanes, v3.vector_registers) == ("avx2", 8, 16) and not v3.has("avx512f")
  assert (v3.l2_bytes, v3.cores) == (xeon.l2_bytes, xeon.cores)   # the caches stay the host's
  (tmp_path / "epyc").mkdir()
  v4 = for_flags(_fake_machine(tmp_path / "epyc", "avx2_epyc"), "-O2 -march=x86-64-v4")
  assert (v4.isa, v4.float_lanes, v4.vector_registers) == ("avx512", 16, 32)
  assert for_flags(xeon, "-march=native") is xeon and for_flags(xeon, "-march=some-future-cpu") is xeon
  assert for_flags(xeon, "-march=sapphirerapids").has("avx512_vnni", "avx512_fp16")

@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64-v3 is an x86 target")
def test_byte_dot_instructions_from_the_features(tmp_path):
  """Byte dot products (kiln/codegen/vectorize.py DP4A): VNNI (AVX512-VNNI with VL, or AVX-VNNI) multiplies any
  unsigned byte, AVX2/SSSE3's pmaddubsw those below 128; aarch64 (kiln renders no NEON dot yet) and plain SSE2 none."""
  for name in ("avx512_xeon", "avx2_epyc", "aarch64", "plain_x86_no_sysfs"): (tmp_path / name).mkdir()
  xeon = _fake_machine(tmp_path / "avx512_xeon", "avx512_xeon")
  assert xeon.byte_dot_max == 255 and _fake_machine(tmp_path / "avx2_epyc", "avx2_epyc").byte_dot_max == 127
  assert not _fake_machine(tmp_path / "aarch64", "aarch64").byte_dot
  assert _fake_machine(tmp_path / "plain_x86_no_sysfs", "plain_x86_no_sysfs").byte_dot_max == 127   # ssse3
  march = {name: for_flags(xeon, [f"-march={name}"]).byte_dot_max for name in ("x86-64-v3", "alderlake", "x86-64-v2",
                                                                            "x86-64")}
  assert march == {"x86-64-v3": 127, "alderlake": 255, "x86-64-v2": 127, "x86-64": 0}
  no_vl = describe_cpu(cpuinfo="flags : avx2 fma avx512f avx512_vnni", cache_dir=None, machine="x86_64")
  assert no_vl.byte_dot_max == 127

def test_cpu_device_target_follows_cflags():
  renderer = Device["CPU"].renderer
  with Context(CFLAGS="-O2 -march=x86-64-v3"): target = renderer.target
  assert (target.isa, target.float_lanes, target.vector_registers) == ("avx2", 8, 16)
  with Context(CFLAGS="-O2"): native = renderer.target
  assert native.features == cpu_target.host_target().features
  assert Device["PYTHON"].renderer.target is None   # no description: the heuristics' baseline plan

# the tiles and lanes intended under each target: matmul (columns x rows), the first action of a full sum (32 lanes
# everywhere for this long one: the lanes fix the order of the sum, which must give the same bits on every machine)
INTENDED = {
  "avx2_epyc": ([Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 4)], Opt(OptOps.LANES, 0, 32)),
  "avx512_xeon": ([Opt(OptOps.UPCAST, 1, 32), Opt(OptOps.UPCAST, 0, 8)], Opt(OptOps.LANES, 0, 32)),
  "aarch64": ([Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 8)], Opt(OptOps.LANES, 0, 32)),
  "plain_x86_no_sysfs": ([Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4)], Opt(OptOps.LANES, 0, 32)),
}

def _planned_run(t: Tensor, target: CPUTarget | None) -> tuple[list[Opt], np.ndarray]:
  """The heuristics' actions for `t`'s last kernel under `target`, and that kernel's output run on the CPU device."""
  item = last_kernel_item(t)
  lowered = lower_for_codegen(item.ast)
  applied = heuristic_opts(Kernel(lowered), target)
  return applied, run_lowered(item, optimize_kernel(lowered, target=target), name="target_test")

def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
  worst = np.abs(got.astype(np.float64) - want).max()
  assert worst <= 1e-4 * max(1.0, np.abs(want).max()), f"{what}: shape {want.shape}, worst difference {worst:.3g}"

@pytest.mark.parametrize("name", MACHINES)
def test_plans_choose_the_intended_tiles_and_match_numpy(tmp_path, name):
  target = _fake_machine(tmp_path, name)
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 128)).astype(np.float32)
  tile, sum_lanes = INTENDED[name]
  applied, got = _planned_run(Tensor(a) @ Tensor(b), target)
  assert applied[:2] == tile, f"{name}: matmul 64x96 @ 96x128 got {applied}"
  _close(got.reshape(64, 128), a.astype(np.float64) @ b, f"{name} matmul")
  x = rng.standard_normal((2, 16, 10, 10)).astype(np.float32)
  w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
  want = Tensor(x.astype(np.float64)).conv2d(Tensor(w.astype(np.float64)), padding=1).numpy()
  _, got = _planned_run(Tensor(x).conv2d(Tensor(w), padding=1), target)
  _close(got.reshape(want.shape), want, f"{name} conv2d")
  v = rng.standard_normal(4096).astype(np.float32)
  applied, got = _planned_run(Tensor(v).sum(), target)
  assert applied[0] == sum_lanes, f"{name}: sum of 4096 got {applied}"
  _close(got.reshape(()), np.float64(v.astype(np.float64).sum()), f"{name} sum")

def test_no_target_is_the_avx2_baseline(tmp_path):
  assert (BASELINE_PLAN.lanes, BASELINE_PLAN.wide, BASELINE_PLAN.kblock_min_bytes) == (8, 16, 8 << 20)
  assert plan_for(None) == BASELINE_PLAN
  epyc = plan_for(_fake_machine(tmp_path, "avx2_epyc"))
  assert (epyc.lanes, epyc.wide, epyc.kblock_min_bytes) == (8, 16, 4 * (512 << 10))
