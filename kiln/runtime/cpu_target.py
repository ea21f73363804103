"""The host CPU as the optimizer sees it: vector width, vector registers, cache sizes and cores (docs/ARCHITECTURE.md,
"a device is a plug-in: ... a target description").

Read from the machine: the instruction set from /proc/cpuinfo (x86 `flags`, aarch64 `Features`), the caches from
sysfs (/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}), the cores from the process's CPU affinity. Every
path is a parameter, so tests describe an AVX2 EPYC, an AVX-512 Xeon or an aarch64 machine from fake files.

A C compiler flag `-march=<name>` (kiln passes -march=native; `CFLAGS=-march=x86-64-v3` overrides it) decides which
instructions the compiled code may use, so the description follows it (`target_for_flags`): x86-64-v3 plans for AVX2
registers even on an AVX-512 host, x86-64-v4 for AVX-512, so that the heuristics' tiles fit the code the compiler
makes. The caches and cores stay the host's.

>>> avx2 = describe_cpu(cpuinfo="flags : fpu sse sse2 avx avx2 fma", cache_dir=None, cores=4, machine="x86_64")
>>> avx2.isa, avx2.float_lanes, avx2.vector_registers
('avx2', 8, 16)
>>> for_flags(avx2, ["-march=x86-64-v4"]).float_lanes
16
"""
from __future__ import annotations
import functools, os, pathlib, platform, re, shlex
from dataclasses import dataclass, field, replace
from typing import Sequence

@dataclass(frozen=True)
class CPUTarget:
  """What the heuristics read about a CPU. `vector_bytes` is the width of one vector register the compiled code uses
  (16: SSE/NEON, 32: AVX2, 64: AVX-512), `vector_registers` how many it has (16 ymm on AVX2, 32 zmm on AVX-512, 32
  NEON), `l1d_bytes`/`l2_bytes` one core's data caches, `l3_bytes` the last level shared by all cores (0 when the OS
  does not say), `cores` the CPUs this process may run on, `features` the instruction-set flags in force."""
  arch: str
  isa: str
  vector_bytes: int
  vector_registers: int
  l1d_bytes: int
  l2_bytes: int
  l3_bytes: int
  cores: int
  features: frozenset[str] = field(default=frozenset(), repr=False)

  @property
  def float_lanes(self) -> int:
    """float32 values in one vector register (8 on AVX2, 16 on AVX-512)."""
    return self.vector_bytes // 4

  def lanes(self, itemsize: int) -> int:
    """Values of `itemsize` bytes in one vector register (at least 1)."""
    return max(1, self.vector_bytes // max(1, itemsize))

  @property
  def byte_dot_max(self) -> int:
    """How the CPU multiplies unsigned by signed bytes into int32 dot products of 4 (kiln/codegen/vectorize.py DP4A):
    the largest unsigned byte it takes exactly. 255 with VNNI (vpdpbusd, one instruction); 127 with AVX2 or SSSE3
    (pmaddubsw then pmaddwd: pmaddubsw's int16 sum of two products saturates beyond 2 * 127 * 128); 0 without."""
    if self.has("avx512_vnni", "avx512vl") or self.has("avx_vnni"): return 255
    return 127 if self.has("avx2") or self.has("ssse3") else 0

  @property
  def byte_dot(self) -> bool:
    """Whether byte dot products are a few instructions (`byte_dot_max`), which kiln's quantized matrix-vector
    products use for their 4-bit weights (kiln/apps/llm/quantized.py)."""
    return self.byte_dot_max > 0

  def has(self, *features: str) -> bool:
    """Whether every one of `features` (cpuinfo spellings: "avx512_vnni", "avx_vnni", "asimddp") is in force."""
    return all(f in self.features for f in features)

# cache sizes assumed when the OS gives none (a container without sysfs caches): a small modern core
FALLBACK_CACHES = {1: 32 << 10, 2: 512 << 10, 3: 0}

# x86 instruction sets, widest first: (name, the cpuinfo flags that enable it, vector bytes, vector registers)
X86_ISAS = (("avx512", ("avx512f",), 64, 32), ("avx2", ("avx2", "fma"), 32, 16), ("avx", ("avx",), 32, 16),
            ("sse", (), 16, 16))
# aarch64: NEON (asimd) has 32 registers of 16 bytes; SVE's length is the machine's, but kiln's C code uses NEON
# widths (fixed-length vector types), so SVE is recorded as a feature only
AARCH64_ISA = ("neon", 16, 32)

# the x86-64 micro-architecture levels and common -march names -> the cpuinfo flags the compiled code may use
_V2 = ("sse", "sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm")
_V3 = _V2 + ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_ICELAKE = _V4 + ("avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512ifma")
MARCH_FEATURES: dict[str, tuple[str, ...]] = {
  "x86-64": ("sse", "sse2"), "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4,
  "haswell": _V3, "broadwell": _V3, "skylake": _V3, "alderlake": _V3 + ("avx_vnni",), "znver1": _V3, "znver2": _V3,
  "znver3": _V3, "skylake-avx512": _V4, "cascadelake": _V4 + ("avx512_vnni",), "icelake-server": _ICELAKE,
  "icelake-client": _ICELAKE, "tigerlake": _ICELAKE, "znver4": _ICELAKE + ("avx512_bf16",),
  "sapphirerapids": _ICELAKE + ("avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"),
}

def _cpuinfo_features(text: str) -> frozenset[str]:
  """The instruction-set flags of the first CPU in a /proc/cpuinfo text (x86 `flags`, aarch64 `Features`)."""
  for line in text.splitlines():
    key, _, value = line.partition(":")
    if key.strip().lower() in ("flags", "features"): return frozenset(value.split())
  return frozenset()

def _size_bytes(text: str) -> int:
  """A sysfs cache size ("48K", "2048K", "32M") in bytes."""
  match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, re.IGNORECASE)
  if match is None: return 0
  return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]

def read_caches(cache_dir: str | os.PathLike | None) -> dict[int, int]:
  """{level: bytes} of the data and unified caches listed under `cache_dir` (sysfs `cpu0/cache`); FALLBACK_CACHES
  for the levels it does not list (or all of them, when `cache_dir` is None or unreadable)."""
  sizes: dict[int, int] = {}
  root = pathlib.Path(cache_dir) if cache_dir is not None else None
  try: entries = sorted(root.glob("index*")) if root is not None else []
  except OSError: entries = []
  for entry in entries:
    try:
      level, kind = int((entry / "level").read_text()), (entry / "type").read_text().strip()
      size = _size_bytes((entry / "size").read_text())
    except (OSError, ValueError): continue
    if kind in ("Data", "Unified") and size: sizes[level] = max(size, sizes.get(level, 0))
  return {level: sizes.get(level, FALLBACK_CACHES[level]) for level in (1, 2, 3)}

def usable_cores() -> int:
  """The CPUs this process may run on (its affinity mask; all CPUs where the OS has no such call)."""
  try: return max(1, len(os.sched_getaffinity(0)))
  except (AttributeError, OSError): return max(1, os.cpu_count() or 1)

def _isa(machine: str, features: frozenset[str]) -> tuple[str, int, int]:
  """(isa name, vector bytes, vector registers) for an architecture and its features."""
  if machine in ("aarch64", "arm64"): return AARCH64_ISA
  if machine in ("x86_64", "amd64", "i686", "i386"):
    return next((name, width, regs) for name, needs, width, regs in X86_ISAS if all(f in features for f in needs))
  return ("scalar", 16, 16)   # another architecture: a generic 128-bit vector unit is the safe guess

def describe_cpu(cpuinfo: str | None = None, cpuinfo_path: str | os.PathLike = "/proc/cpuinfo",
                 cache_dir: str | os.PathLike | None = "/sys/devices/system/cpu/cpu0/cache", cores: int | None = None,
                 machine: str | None = None) -> CPUTarget:
  """The CPU described by a /proc/cpuinfo text (`cpuinfo`, else the file at `cpuinfo_path`), the sysfs cache tree at
  `cache_dir`, `cores` (default: this process's) and `machine` (platform.machine() spelling; default: this one)."""
  if cpuinfo is None:
    try: cpuinfo = pathlib.Path(cpuinfo_path).read_text(errors="replace")
    except OSError: cpuinfo = ""
  machine = (machine or platform.machine()).lower()
  features = _cpuinfo_features(cpuinfo)
  isa, width, registers = _isa(machine, features)
  caches = read_caches(cache_dir)
  return CPUTarget(machine, isa, width, registers, caches[1], caches[2], caches[3],
                   usable_cores() if cores is None else max(1, cores), features)

def march_in_flags(flags: Sequence[str]) -> str | None:
  """The `-march=` value the compiler would use from `flags` (the last one wins, as in gcc and clang), None when
  there is none or it is `native` (the host's own)."""
  march = None
  for flag in flags:
    if flag.startswith("-march="): march = flag.split("=", 1)[1]
  return None if march in (None, "native") else march

def for_march(host: CPUTarget, march: str | None) -> CPUTarget:
  """`host` with the instruction set of `-march=<march>` (its caches and cores kept); `host` itself for None, for
  a name MARCH_FEATURES does not know, or on a machine that is not x86."""
  if march is None or march not in MARCH_FEATURES or host.arch not in ("x86_64", "amd64"): return host
  features = frozenset(MARCH_FEATURES[march])
  isa, width, registers = _isa(host.arch, features)
  return replace(host, isa=isa, vector_bytes=width, vector_registers=registers, features=features)

def for_flags(host: CPUTarget, flags: Sequence[str] | str) -> CPUTarget:
  """`host` as C code compiled with `flags` (a list, or one shell-quoted string) may use it (see `for_march`)."""
  return for_march(host, march_in_flags(shlex.split(flags) if isinstance(flags, str) else flags))

@functools.cache
def host_target() -> CPUTarget:
  """This machine's CPU (read once per process)."""
  return describe_cpu()

@functools.lru_cache(maxsize=32)
def _host_for_flags(flags: tuple[str, ...]) -> CPUTarget:
  return for_flags(host_target(), flags)

def target_for_flags(flags: Sequence[str]) -> CPUTarget:
  """This machine's CPU as code compiled with C compiler `flags` uses it (cached per flag list: asked per kernel)."""
  return _host_for_flags(tuple(flags))
