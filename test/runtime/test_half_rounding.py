"""float16, bfloat16 and fp8 arithmetic rounded after every op, and float -> integer casts, bit for bit the same on
the CPU device (under every C compiler on PATH, scalar and vector code, several -march) and the LLVM device as on the
PYTHON reference. gcc 12 at -O2 folded the vectorized `(float)(_Float16)x` of the C renderer's rounding helper to `x`,
so `(x.half() * 2).float()` gave the float32 product on rows that its SLP vectorizer turned into vector code."""
from __future__ import annotations
import functools, glob, os, re, shutil
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.dtype import DType
from kiln.engine import realize
from kiln.helpers import Context

SMALL_FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]
BITS_DTYPES = {1: (dtypes.uint8, np.uint8), 2: (dtypes.uint16, np.uint16), 4: (dtypes.uint32, np.uint32),
               8: (dtypes.uint64, np.uint64)}
# (7,) and (256,) stay scalar loops (-O3 may vectorize the loop); the rows of (16, 64) are upcast by 8 and the C
# compiler's SLP vectorizer turns the 8 lanes into vector code, where gcc 12 dropped the float16 rounding
SHAPES = [(7,), (256,), (16, 64)]

def c_compilers() -> list[str]:
  """Every distinct C compiler on PATH: gcc, gcc-NN, clang, clang-NN (the first name of each real file)."""
  names = []
  for directory in os.environ.get("PATH", "").split(os.pathsep):
    for path in sorted(glob.glob(os.path.join(directory, "gcc*")) + glob.glob(os.path.join(directory, "clang*"))):
      if re.fullmatch(r"(gcc|clang)(-\d+)?", os.path.basename(path)) and os.access(path, os.X_OK):
        names.append(os.path.basename(path))
  found: dict[str, str] = {}
  for name in names:
    if (path := shutil.which(name)) is not None: found.setdefault(os.path.realpath(path), name)
  return sorted(found.values())

def _has_llvmlite() -> bool:
  try: import llvmlite  # noqa: F401
  except ImportError: return False
  return True

# (device, C compiler, CFLAGS): the default -march=native, a baseline x86-64 without F16C (float16 conversions are
# library calls there), and -O3
TARGETS = [("CPU", cc, flags) for cc in c_compilers()
           for flags in ("-O2", "-O2 -march=x86-64" if os.uname().machine == "x86_64" else "-O1", "-O3")]
TARGETS += [("LLVM", None, "")] if _has_llvmlite() else []
TARGET_IDS = [f"{device}-{cc}-{flags.replace(' ', '')}" if cc else device for device, cc, flags in TARGETS]

@pytest.fixture
def fresh_runners(monkeypatch):
  """Compiled runners are cached per kernel, not per C compiler: each target compiles its own."""
  monkeypatch.setattr(realize, "_runner_cache", {})

def random_bits(dtype: DType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
  """Bit patterns of `dtype`: uniform over all patterns (subnormals, values near overflow, a few inf/NaN), with the
  first lanes set to ties and boundaries."""
  _, np_bits = BITS_DTYPES[dtype.itemsize]
  n = int(np.prod(shape))
  bits = rng.integers(0, 1 << (8 * dtype.itemsize), n, dtype=np.uint64).astype(np_bits)
  special = {dtypes.float16: [0x3c00, 0x6800, 0x7bff, 0x0001, 0x03ff, 0x8400, 0x3c01],   # 1, 2048, max, subnormals
             dtypes.bfloat16: [0x3f80, 0x4b00, 0x7f7f, 0x0001, 0x007f, 0x8080, 0x3f81],
             dtypes.fp8e4m3: [0x38, 0x58, 0x7e, 0x01, 0x07, 0x88, 0x39],
             dtypes.fp8e5m2: [0x3c, 0x5c, 0x7b, 0x01, 0x03, 0x84, 0x3d]}[dtype]
  bits[:min(n, len(special))] = special[:n]
  return bits.reshape(shape)

def _tensor_of_bits(bits: np.ndarray, dtype: DType, device: str) -> Tensor:
  return Tensor(bits, device=device).bitcast(dtype)

def _bits_of(t: Tensor) -> np.ndarray:
  """The raw bits of a realized tensor, NaNs all mapped to one pattern (payloads are not part of the semantics)."""
  values = t.float().numpy() if t.dtype != dtypes.float64 else t.numpy()
  bits = t.bitcast(BITS_DTYPES[t.dtype.itemsize][0]).numpy()
  return np.where(np.isnan(values), np.iinfo(bits.dtype).max, bits)

def _chains(dtype: DType, a: Tensor, b: Tensor, c: Tensor) -> dict[str, Tensor]:
  """Elementwise chains of `dtype` values, each op rounded: what every device must agree on."""
  other = {dtypes.float16: dtypes.bfloat16, dtypes.bfloat16: dtypes.float16,
           dtypes.fp8e4m3: dtypes.fp8e5m2, dtypes.fp8e5m2: dtypes.fp8e4m3}[dtype]
  return {"add": a + b, "mul": a * b, "div": a / b, "fma_chain": (a * b + c) * a, "sub_half": (a - b) * 0.5,
          "recip": b.reciprocal(), "casts": a.cast(other).cast(dtype) + b, "via_float": (a.float() * 3).cast(dtype),
          # float32 rounded to the dtype and read back as float32: the case gcc 12 got wrong
          "float_round_trip": (a.float() * 1.1).cast(dtype).float(),
          "scaled_as_float": ((a.float() + 0.3).cast(dtype) * 2).float(),
          "via_double": (a.cast(dtypes.float64) / 3).cast(dtype), "from_int": (a.cast(dtypes.int32) * 7).cast(dtype),
          "max": a.maximum(b) * c, "mul_as_float": (a * b).float(), "sum_as_float": (a + b).float() + c.float(),
          # transcendentals of fp8 are not defined (torch has none; kiln raises KeyError): 16-bit floats only
          **({"exp": (a * 0.25).exp(), "sqrt": a.abs().sqrt()} if dtype.itemsize == 2 else {})}

@functools.cache
def _reference(dtype: DType, shape: tuple[int, ...], seed: int) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray]]:
  """The inputs and the PYTHON device's bits of every chain."""
  rng = np.random.default_rng(seed)
  inputs = tuple(random_bits(dtype, shape, rng) for _ in range(3))
  with np.errstate(all="ignore"):
    outs = _chains(dtype, *[_tensor_of_bits(x, dtype, "PYTHON") for x in inputs])
    return inputs, {name: _bits_of(out) for name, out in outs.items()}

def _assert_same_bits(got: np.ndarray, want: np.ndarray, what: str, inputs: tuple[np.ndarray, ...]) -> None:
  bad = np.flatnonzero(got != want)
  assert bad.size == 0, (f"{what}: {bad.size} of {got.size} elements differ from PYTHON; first at {bad[0]}: got "
                         f"{got.flat[bad[0]]:#x}, want {want.flat[bad[0]]:#x} (inputs "
                         f"{[f'{x.flat[bad[0]]:#x}' for x in inputs]})")

@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", SMALL_FLOATS, ids=[d.name for d in SMALL_FLOATS])
def test_small_float_chains_match_python_bit_for_bit(target, dtype, fresh_runners):
  device, cc, flags = target
  for shape in SHAPES:
    inputs, want = _reference(dtype, shape, seed=len(shape))
    with Context(CC=cc or "", CFLAGS=flags or "-O2"), np.errstate(all="ignore"):
      outs = _chains(dtype, *[_tensor_of_bits(x, dtype, device) for x in inputs])
      Tensor.realize(*outs.values())
      for name, out in outs.items():
        _assert_same_bits(_bits_of(out), want[name], f"{device} {cc} {flags} {dtype.name} {name} {shape}", inputs)

def test_float16_rounding_survives_gcc_slp_vectorizer(fresh_runners):
  """The CI failure: a row of 64 upcast lanes, rounded to float16 after the multiply (exact against NumPy)."""
  a = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
  for _, cc, flags in [t for t in TARGETS if t[0] == "CPU"]:
    with Context(CC=cc, CFLAGS=flags):
      got = (Tensor(a).half() * 2).float().numpy()
    np.testing.assert_array_equal(got, a.astype(np.float16).astype(np.float32) * 2, err_msg=f"{cc} {flags}")

@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", SMALL_FLOATS, ids=[d.name for d in SMALL_FLOATS])
def test_small_float_sums_match_python(target, dtype, fresh_runners):
  """Reductions accumulate in the dtype (each partial sum rounded) or in float32 after a cast."""
  device, cc, flags = target
  rng = np.random.default_rng(11)
  bits = random_bits(dtype, (16, 64), rng)
  finite = np.isfinite(_tensor_of_bits(bits, dtype, "PYTHON").float().numpy())
  bits = np.where(finite, bits, bits[0, 0])   # an inf or NaN would make every sum the same
  def sums(dev: str) -> list[Tensor]:
    x = _tensor_of_bits(bits, dtype, dev)
    return [x.sum(axis=1), (x * x).sum(axis=0), x.float().sum(axis=1), x.max(axis=1)]
  want = [_bits_of(s) for s in sums("PYTHON")]
  with Context(CC=cc or "", CFLAGS=flags or "-O2"):
    got = [_bits_of(s) for s in sums(device)]
  for k, (g, w) in enumerate(zip(got, want)): _assert_same_bits(g, w, f"{device} {cc} {dtype.name} sum {k}", (bits,))

# ---- float -> integer casts: one definition (kiln/renderer/python.py _f2i) for vector and scalar code ----

INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64]

def out_of_range_floats(n: int, rng: np.random.Generator) -> np.ndarray:
  """In-range and out-of-range values for every integer type, negative and positive, and inf/NaN."""
  edges = [0.0, -0.7, 0.7, 127.9, 128.0, -129.0, 255.5, 256.0, 300.0, -300.0, 65536.0, -40000.0, 2.0 ** 31,
           -2.0 ** 31, 2.0 ** 31 + 256, -2.0 ** 31 - 256, 4e9, -4e9, 2.0 ** 63, -2.0 ** 63, 1.5e19, 2.0 ** 64, 1e30,
           -1e30, np.inf, -np.inf, np.nan]
  scale = 10.0 ** rng.integers(0, 21, n)
  values = rng.uniform(-1, 1, n) * scale
  values[:min(n, len(edges))] = edges[:n]
  return values

@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("src", [dtypes.float32, dtypes.float64, dtypes.float16], ids=lambda d: d.name)
def test_float_to_int_casts_agree_in_vector_and_scalar_code(target, src, fresh_runners):
  device, cc, flags = target
  rng = np.random.default_rng(5)
  # scalar loops, and (float32 -> int32) kiln's vector code for 8 lanes of the upcast rows and of the long loop
  for shape in [(7,), (16, 65), (16, 64), (4096,)]:
    values = out_of_range_floats(int(np.prod(shape)), rng).reshape(shape)
    with np.errstate(all="ignore"): values = values.astype({dtypes.float16: np.float16, dtypes.float32: np.float32,
                                                            dtypes.float64: np.float64}[src])
    def casts(dev: str) -> list[Tensor]:
      x = Tensor(values, device=dev)
      return [x.cast(dst) for dst in INT_DTYPES] + [(x * 2).cast(dtypes.int32) + 1]
    want = [c.numpy() for c in casts("PYTHON")]
    with Context(CC=cc or "", CFLAGS=flags or "-O2"):
      outs = casts(device)
      Tensor.realize(*outs)
      got = [c.numpy() for c in outs]
    for dst, g, w in zip(INT_DTYPES + ["int32 of x*2"], got, want):
      bad = np.flatnonzero(g != w)
      assert bad.size == 0, (f"{device} {cc} {flags} {src.name}->{dst} {shape}: {bad.size} differ, first "
                             f"{values.flat[bad[0]]!r} -> {g.flat[bad[0]]} (want {w.flat[bad[0]]})")

def test_in_range_float_to_int_casts_match_numpy():
  """Where C defines the conversion, the answer is NumPy's (truncation toward zero)."""
  values = np.array([0.0, -0.9, 0.9, 1.5, -1.5, 127.0, -128.0, 255.0, 1e9, -1e9, 3e9], np.float64)
  limits = [(dtypes.int8, np.int8, -128, 127), (dtypes.uint8, np.uint8, 0, 255),
            (dtypes.int32, np.int32, -2 ** 31, 2 ** 31 - 1), (dtypes.uint32, np.uint32, 0, 2 ** 32 - 1),
            (dtypes.int64, np.int64, -2 ** 63, 2 ** 63 - 1)]
  for dst, np_dst, lo, hi in limits:
    ok = values[(np.trunc(values) >= lo) & (np.trunc(values) <= hi)]
    for n in (len(ok), 64):
      x = np.resize(ok, n)
      np.testing.assert_array_equal(Tensor(x.astype(np.float32)).cast(dst).numpy(), x.astype(np.float32).astype(np_dst),
                                    err_msg=f"{dst} n={n}")
