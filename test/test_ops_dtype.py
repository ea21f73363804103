"""dtypes (fp8 included), bitcast, keccak and hash against PyTorch, NumPy and hashlib."""
import hashlib, math
import numpy as np
import pytest
import torch
from kiln import Tensor, Device, dtypes
from kiln.dtype import least_upper_dtype, DType
from helpers import check

FP8 = [(dtypes.fp8e4m3, torch.float8_e4m3fn), (dtypes.fp8e5m2, torch.float8_e5m2)]
FP8_IDS = ["e4m3", "e5m2"]
TORCH_OF = {dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8, dtypes.int16: torch.int16,
            dtypes.uint16: torch.uint16, dtypes.int32: torch.int32, dtypes.uint32: torch.uint32,
            dtypes.int64: torch.int64, dtypes.uint64: torch.uint64, dtypes.float16: torch.float16,
            dtypes.bfloat16: torch.bfloat16, dtypes.float32: torch.float32, dtypes.float64: torch.float64,
            dtypes.fp8e4m3: torch.float8_e4m3fn, dtypes.fp8e5m2: torch.float8_e5m2}

def fp8_values(tdt) -> np.ndarray:
  """The value of every fp8 byte, by torch."""
  return torch.arange(256, dtype=torch.uint8).view(tdt).float().numpy()

def fp8_reference_bits(x: np.ndarray, tdt) -> np.ndarray:
  """torch's fp8 bytes of `x` with finite overflow saturated to +-max, as tinygrad's (and CUDA's satfinite) casts
  are; torch itself saturates e4m3fn but sends e5m2 overflow to inf. +-inf stays +-inf in e5m2, as in torch, and
  becomes +-max in e4m3fn, which has no inf (kiln's rule, kiln/dtype.py): spelled out here rather than asked of
  torch, whose answer changed between versions (2.11 gives NaN, 2.13 +-max)."""
  biggest = float(np.nanmax(np.abs(fp8_values(tdt))[np.isfinite(fp8_values(tdt))]))
  x = x.astype(np.float64)
  with np.errstate(invalid="ignore"): clipped = np.where(np.isinf(x), x, np.clip(x, -biggest, biggest))
  if tdt == torch.float8_e4m3fn: clipped = np.where(np.isinf(clipped), np.sign(clipped) * biggest, clipped)
  return torch.tensor(clipped).to(tdt).view(torch.uint8).numpy()

def cast_sweep(tdt) -> np.ndarray:
  """float32 inputs for casts to fp8: every fp8 value, the ties between neighbours and just either side of them,
  subnormals, values past the largest, infinities, signed zeros and random magnitudes."""
  values = np.unique(fp8_values(tdt)[np.isfinite(fp8_values(tdt))].astype(np.float64))
  ties = (values[1:] + values[:-1]) / 2
  rng = np.random.default_rng(0)
  spread = rng.standard_normal(300) * np.exp2(rng.uniform(-20, 18, 300))
  extra = [1e30, -1e30, np.inf, -np.inf, 0.0, -0.0, 2.0 ** -10, 2.0 ** -17, 3e-3, 464.0, 480.0, 61440.0, 1e5]
  return np.concatenate([values, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), spread,
                         extra]).astype(np.float32)

# ---------------------------------------------------------------------------------------------------------------------
# fp8

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("device", [Device.DEFAULT, "PYTHON"])
def test_fp8_every_byte_decodes_like_torch(dt, tdt, device):
  got = Tensor(np.arange(256, dtype=np.uint8), device=device).bitcast(dt)
  assert got.dtype == dt
  np.testing.assert_array_equal(got.float().numpy(), fp8_values(tdt))
  np.testing.assert_array_equal(got.numpy(), fp8_values(tdt))   # .numpy() of fp8 gives float32 values
  assert got.numpy().dtype == np.float32

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("src", ["float32", "float64"])
def test_fp8_cast_rounds_to_nearest_even_and_saturates(dt, tdt, src):
  xs = cast_sweep(tdt)
  got = Tensor(xs.astype(src)).cast(dt).bitcast(dtypes.uint8).numpy()
  np.testing.assert_array_equal(got, fp8_reference_bits(xs, tdt), err_msg=f"{src} -> {dt}")

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
def test_fp8_cast_on_python_device(dt, tdt):
  xs = np.array([0.1, -1.0, 1.0625, 1.125, 448.0, 464.0, 465.0, 57344.0, 61440.0, 1e9, -np.inf, 2.0 ** -9, 2.0 ** -17,
                 2.0 ** -16 * 0.75, -0.0], np.float32)
  got = Tensor(xs, device="PYTHON").cast(dt).bitcast(dtypes.uint8).numpy()
  np.testing.assert_array_equal(got, fp8_reference_bits(xs, tdt))

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("device", [Device.DEFAULT, "PYTHON"])
def test_fp8_nan_stays_nan(dt, tdt, device):
  out = Tensor([math.nan, -math.nan], device=device).cast(dt)
  assert np.isnan(out.numpy()).all()
  bits = out.bitcast(dtypes.uint8).numpy()
  assert bits[0] < 0x80 and bits[1] >= 0x80   # the sign survives, as in torch and tinygrad

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("src", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.bool, dtypes.float16,
                                 dtypes.bfloat16], ids=lambda d: d.name)
def test_fp8_cast_from_other_dtypes(dt, tdt, src):
  biggest = float(np.nanmax(fp8_values(tdt)[np.isfinite(fp8_values(tdt))]))
  raw = [0, 1, 3, 5, 7, 9, 17, 19, 33, 100, 127] if src != dtypes.bool else [0, 1, 1, 0]
  if src in (dtypes.int32, dtypes.int64): raw += [-1, -17, 300, 1000, 100000, -70000]
  if src in (dtypes.float16, dtypes.bfloat16): raw += [0.3, -2.7, 1e-4, 465.0, 60000.0, -1e4]
  want_t = torch.tensor(raw, dtype=TORCH_OF[src])
  # torch: through float64 (exact for these values), then saturated; kiln: straight from the source dtype
  want = fp8_reference_bits(np.clip(want_t.double().numpy(), -biggest, biggest), tdt)
  got = Tensor(raw, dtype=src).cast(dt).bitcast(dtypes.uint8).numpy()
  np.testing.assert_array_equal(got, want)

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("dst", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.int32,
                                 dtypes.int64, dtypes.bool], ids=lambda d: d.name)
def test_fp8_cast_to_other_dtypes(dt, tdt, dst):
  finite = np.isfinite(fp8_values(tdt))
  bits = np.arange(256, dtype=np.uint8) if dtypes.is_float(dst) or dst == dtypes.bool else np.nonzero(finite)[0]
  bits = bits.astype(np.uint8)
  got = Tensor(bits).bitcast(dt).cast(dst)
  want = torch.tensor(bits).view(tdt).to(TORCH_OF[dst])
  assert got.dtype == dst
  got_np, want_np = got.numpy(), (want.float() if dst == dtypes.bfloat16 else want).numpy()
  np.testing.assert_array_equal(got_np, want_np)

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("device", [Device.DEFAULT, "PYTHON"])
def test_fp8_arithmetic_rounds_every_op(dt, tdt, device):
  rng = np.random.default_rng(1)
  a, b = (rng.standard_normal(64) * 8).astype(np.float32), (rng.standard_normal(64) * 8).astype(np.float32)
  ta, tb = torch.tensor(a).to(tdt).float(), torch.tensor(b).to(tdt).float()
  want = fp8_reference_bits(((ta * tb).to(tdt).float() + ta).numpy(), tdt)
  ka, kb = Tensor(a, device=device).cast(dt), Tensor(b, device=device).cast(dt)
  out = ka * kb + ka
  assert out.dtype == dt
  np.testing.assert_array_equal(out.bitcast(dtypes.uint8).numpy(), want)

@pytest.mark.parametrize("dt, tdt", FP8, ids=FP8_IDS)
def test_fp8_from_python_values(dt, tdt):
  data = [[1.0, 2.5, -3.3], [1000.0, 0.0, 1e-5]]
  t = Tensor(data, dtype=dt)
  assert t.dtype == dt and t.shape == (2, 3)
  want = torch.tensor(fp8_reference_bits(np.array(data, np.float32), tdt)).view(tdt).float().numpy()
  np.testing.assert_array_equal(t.numpy(), want)
  assert t.tolist() == want.tolist()
  assert Tensor(1000.0, dtype=dt).item() == float(want[1, 0])
  assert Tensor.zeros(0, 2, dtype=dt).numpy().dtype == np.float32

def test_fp8_promotes_as_tinygrad():
  # tinygrad's promotion lattice: fp8e4m3 and fp8e5m2 each promote to float16 and bfloat16 (torch refuses to promote)
  assert least_upper_dtype(dtypes.fp8e4m3, dtypes.fp8e4m3) == dtypes.fp8e4m3
  assert least_upper_dtype(dtypes.fp8e4m3, dtypes.fp8e5m2) == dtypes.float16
  assert least_upper_dtype(dtypes.fp8e5m2, dtypes.float32) == dtypes.float32
  assert least_upper_dtype(dtypes.fp8e4m3, dtypes.bfloat16) == dtypes.bfloat16
  assert least_upper_dtype(dtypes.fp8e4m3, dtypes.int32) == dtypes.float16
  out = Tensor([1.5], dtype=dtypes.fp8e4m3) + Tensor([2.0], dtype=dtypes.float16)
  assert out.dtype == dtypes.float16 and out.tolist() == [3.5]

# ---------------------------------------------------------------------------------------------------------------------
# dtype helpers

INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64]
FLOAT_DTYPES = [dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]

@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
def test_min_max_of_ints_match_iinfo(dt):
  info = torch.iinfo(TORCH_OF[dt])
  assert (dtypes.min(dt), dtypes.max(dt)) == (info.min, info.max) == (dt.min, dt.max)

def test_min_max_of_floats_and_bool():
  for dt in FLOAT_DTYPES: assert (dtypes.min(dt), dtypes.max(dt)) == (-math.inf, math.inf)   # as tinygrad
  assert (dtypes.min(dtypes.bool), dtypes.max(dtypes.bool)) == (False, True)

@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=lambda d: d.name)
def test_finfo_matches_torch(dt):
  info = torch.finfo(TORCH_OF[dt])
  mantissa = -int(math.log2(info.eps))
  assert dtypes.finfo(dt) == (info.bits - mantissa - 1, mantissa)

def test_finfo_rejects_non_floats():
  for dt in (dtypes.int32, dtypes.bool):
    with pytest.raises(ValueError, match="finfo"): dtypes.finfo(dt)

@pytest.mark.parametrize("dt", [dtypes.bool, *INT_DTYPES, *FLOAT_DTYPES], ids=lambda d: d.name)
def test_classification_and_size_match_torch(dt):
  tdt = TORCH_OF[dt]
  assert dt.itemsize == torch.empty(0, dtype=tdt).element_size() and dt.bitsize == 8 * dt.itemsize
  assert dtypes.is_float(dt) == tdt.is_floating_point
  assert dtypes.is_bool(dt) == (tdt == torch.bool)
  assert dtypes.is_int(dt) == (not tdt.is_floating_point and tdt != torch.bool)
  assert dtypes.is_unsigned(dt) == (dtypes.is_int(dt) and not tdt.is_signed)

def test_aliases_match_numpy_c_names():
  pairs = {"half": np.half, "float": np.single, "double": np.double, "char": np.byte, "uchar": np.ubyte,
           "short": np.short, "ushort": np.ushort, "int": np.intc, "uint": np.uintc, "long": np.int64,
           "ulong": np.uint64}
  for name, np_type in pairs.items():
    dt = getattr(dtypes, name)
    assert np.dtype(np_type).itemsize == dt.itemsize and np.dtype(np_type).kind == {
      True: "f", False: "u" if dtypes.is_unsigned(dt) else "i"}[dtypes.is_float(dt)], name

def test_fields_from_py_as_const():
  fields = dtypes.fields()
  assert fields["float32"] is dtypes.float32 and fields["half"] is dtypes.float16
  assert fields["fp8e5m2"] is dtypes.fp8e5m2
  assert all(isinstance(v, DType) for v in fields.values())
  assert set(dtypes.floats) == set(FLOAT_DTYPES) and set(dtypes.ints) == set(INT_DTYPES)
  assert dtypes.from_py(1.0) == dtypes.float32 and dtypes.from_py([1, True]) == dtypes.int32
  assert dtypes.from_py(True) == dtypes.bool
  assert dtypes.as_const(2.9, dtypes.int8) == 2 and isinstance(dtypes.as_const(2, dtypes.half), float)
  assert dtypes.as_const((0, 3), dtypes.bool) == (False, True)
  assert Tensor([1, 2], dtype="fp8e4m3").dtype == dtypes.fp8e4m3

CONVERSIONS = ["float", "half", "double", "bfloat16", "int", "long", "short", "bool"]

@pytest.mark.parametrize("method", CONVERSIONS)
def test_conversion_methods(method):
  convert = lambda x: getattr(x, method)()   # noqa: E731
  for shape in [(3, 4), (0, 3), (1,), ()]: check(convert, convert, [shape], low=-3, high=3)
  check(lambda x: convert(x.T), lambda x: convert(x.T), [(2, 3)], low=-3, high=3)   # non-contiguous
  for dtype in ["float16", "int32", "bool"]: check(convert, convert, [(2, 3)], dtype=dtype, low=-3, high=3)
  from_bf16 = lambda x: convert(x.bfloat16())   # noqa: E731  (check() makes no bfloat16 inputs itself)
  check(from_bf16, from_bf16, [(2, 3)], low=-3, high=3)

def test_conversion_methods_on_python_device():
  check(lambda x: x.half().float(), lambda x: x.half().float(), [(2, 3)], device="PYTHON")
  check(lambda x: x.int(), lambda x: x.int(), [(4,)], device="PYTHON", low=-3, high=3)

# ---------------------------------------------------------------------------------------------------------------------
# bitcast

BITCASTS = [("float32", "int32"), ("int32", "float32"), ("float32", "uint32"), ("float16", "int16"),
            ("int64", "float64"), ("uint8", "int8"), ("float32", "uint8"), ("uint8", "int32"), ("int16", "int64"),
            ("float64", "uint16"), ("uint8", "float16"), ("uint32", "float64"), ("int64", "int8")]

def bitcast_input(src: str, shape, rng) -> np.ndarray:
  if np.dtype(src).kind == "f": return (rng.standard_normal(shape) * 100).astype(src)
  info = np.iinfo(src)
  return rng.integers(info.min, info.max, shape, dtype=src, endpoint=True)

@pytest.mark.parametrize("src, dst", BITCASTS, ids=[f"{a}-{b}" for a, b in BITCASTS])
def test_bitcast_matches_numpy_view(src, dst):
  rng = np.random.default_rng(2)
  for shape in [(2, 8), (3, 1, 16), (0, 8), (8,)]:
    arr = bitcast_input(src, shape, rng)
    got = Tensor(arr).bitcast(dst)
    want = arr.view(dst)
    assert got.dtype.itemsize == np.dtype(dst).itemsize and got.shape == want.shape, (src, dst, shape)
    np.testing.assert_array_equal(got.numpy().view(np.uint8), want.view(np.uint8), err_msg=f"{src}->{dst} {shape}")

@pytest.mark.parametrize("src, dst", [("float32", "uint8"), ("uint8", "uint32"), ("int16", "float32")])
def test_bitcast_non_contiguous_input(src, dst):
  arr = bitcast_input(src, (8, 4), np.random.default_rng(3))
  got = Tensor(arr).T.flip(0).bitcast(dst)
  want = np.ascontiguousarray(arr.T[::-1]).view(dst)
  np.testing.assert_array_equal(got.numpy().view(np.uint8), want.view(np.uint8))

def test_bitcast_bfloat16_and_fp8_match_torch():
  x = torch.tensor([[1.5, -2.25, 3e5, 1e-3]], dtype=torch.bfloat16)
  got = Tensor(x.float().numpy()).bfloat16().bitcast(dtypes.uint16).numpy()
  np.testing.assert_array_equal(got, x.view(torch.uint16).numpy())
  np.testing.assert_array_equal(Tensor(x.float().numpy()).bfloat16().bitcast(dtypes.uint8).numpy(),
                                x.view(torch.uint8).numpy())
  bits = np.array([[0x38, 0xC4, 0x7E, 0x01]], np.uint8)
  np.testing.assert_array_equal(Tensor(bits).bitcast(dtypes.fp8e4m3).bitcast(dtypes.int8).numpy(), bits.view(np.int8))
  np.testing.assert_array_equal(Tensor(bits).bitcast(dtypes.fp8e5m2).bitcast(dtypes.uint16).numpy(),
                                bits.view(np.uint16))

def test_bitcast_bool():
  np.testing.assert_array_equal(Tensor([True, False, True]).bitcast(dtypes.uint8).numpy(), [1, 0, 1])
  assert Tensor([0, 3], dtype=dtypes.uint8).bitcast(dtypes.bool).tolist() == [False, True]

def test_bitcast_on_python_device():
  arr = np.array([[1.5, -2.0], [1e-30, 7.25]], np.float32)
  np.testing.assert_array_equal(Tensor(arr, device="PYTHON").bitcast(dtypes.uint8).numpy(), arr.view(np.uint8))
  np.testing.assert_array_equal(Tensor(arr.view(np.uint8), device="PYTHON").bitcast(dtypes.float32).numpy(), arr)
  np.testing.assert_array_equal(Tensor(arr, device="PYTHON").bitcast(dtypes.int32).numpy(), arr.view(np.int32))

def test_bitcast_errors():
  with pytest.raises(ValueError, match="bitcast"): Tensor(np.zeros((2, 3), np.uint8)).bitcast(dtypes.int32)
  with pytest.raises(ValueError, match="bitcast"): Tensor(1.5).bitcast(dtypes.uint8)
  with pytest.raises(TypeError, match="bitcast"): Tensor([1.0]).bitcast("float99")
  with pytest.raises(RuntimeError, match="bitcast"): Tensor([1.0], requires_grad=True).bitcast(dtypes.int32)
  assert Tensor(1.5).bitcast(dtypes.int32).item() == np.float32(1.5).view(np.int32)   # 0-d is fine at the same size

# ---------------------------------------------------------------------------------------------------------------------
# keccak and hash

def hashlib_digest(cfg: str, data: bytes) -> bytes:
  h = hashlib.new(cfg, data)
  return h.digest({"shake_128": 16, "shake_256": 32}[cfg]) if cfg.startswith("shake") else h.digest()

RATES = {"sha3_224": 144, "sha3_256": 136, "sha3_384": 104, "sha3_512": 72, "shake_128": 168, "shake_256": 136}

@pytest.mark.parametrize("cfg", list(RATES))
def test_keccak_matches_hashlib(cfg):
  rate = RATES[cfg]
  # empty, short, one byte short of a block, exactly one block (the padding takes a second), and several blocks
  for length in [0, 3, rate - 1, rate, 2 * rate + 5]:
    data = bytes((i * 7 + 3) % 256 for i in range(length))
    got = Tensor(np.frombuffer(data, np.uint8).copy()).keccak(cfg)
    assert got.dtype == dtypes.uint8
    assert bytes(got.tolist()) == hashlib_digest(cfg, data), (cfg, length)

def test_keccak_batched_over_leading_axes():
  rng = np.random.default_rng(4)
  data = rng.integers(0, 256, (2, 3, 150), dtype=np.uint8)
  got = Tensor(data).keccak().numpy()
  assert got.shape == (2, 3, 32)
  for i in range(2):
    for j in range(3): assert bytes(got[i, j]) == hashlib.sha3_256(data[i, j].tobytes()).digest()
  # a non-contiguous batch, and an empty batch
  got_t = Tensor(data[0]).T.keccak("shake_128").numpy()
  for j in range(150): assert bytes(got_t[j]) == hashlib.shake_128(data[0, :, j].tobytes()).digest(16)
  assert Tensor(np.zeros((0, 5), np.uint8)).keccak().shape == (0, 32)

def test_keccak_of_other_dtypes_hashes_their_bytes():
  arr = np.array([[1, -2, 300000], [7, 8, 9]], np.int32)
  got = Tensor(arr).keccak("sha3_224").numpy()
  for i in range(2): assert bytes(got[i]) == hashlib.sha3_224(arr[i].tobytes()).digest()
  assert bytes(Tensor(arr[0]).keccak((136, 0x06)).tolist()) == hashlib.sha3_256(arr[0].tobytes()).digest()
  flags = np.array([True, False, True])
  assert bytes(Tensor(flags).keccak().tolist()) == hashlib.sha3_256(flags.astype(np.uint8).tobytes()).digest()

def test_keccak_twice_on_the_same_multi_block_input():
  data = bytes(range(256)) * 2   # four sha3_256 blocks: the later ones reuse the first block's round kernels
  t = Tensor(np.frombuffer(data, np.uint8).copy())
  first, second = t.keccak(), t.keccak()
  assert bytes(second.tolist()) == bytes(first.tolist()) == hashlib.sha3_256(data).digest()

def test_keccak_on_python_device():
  assert bytes(Tensor(b"abc", device="PYTHON").keccak().tolist()) == hashlib.sha3_256(b"abc").digest()

def test_keccak_errors():
  with pytest.raises(ValueError, match="keccak"): Tensor(b"abc").keccak("sha3_1024")
  with pytest.raises(ValueError, match="keccak"): Tensor(b"abc").keccak((300, 6))
  with pytest.raises(TypeError, match="keccak"): Tensor(b"abc").keccak(256)
  with pytest.raises(ValueError, match="keccak"): Tensor(3, dtype=dtypes.uint8).keccak()

def tree_hash_reference(data: bytes) -> bytes:
  """tinygrad's Tensor.hash, restated with hashlib: shake_128 (16 bytes) of each 4 KiB block of each zero-padded
  1 MiB chunk, shake_128 of each chunk's 4096 bytes of block digests, repeated over the chunk digests until one."""
  mib = 1 << 20
  while True:
    data = data + bytes(-len(data) % mib if data else mib)
    chunks = [data[i:i + mib] for i in range(0, len(data), mib)]
    digests = [hashlib.shake_128(b"".join(hashlib.shake_128(c[j:j + 4096]).digest(16)
                                          for j in range(0, mib, 4096))).digest(16) for c in chunks]
    data = b"".join(digests)
    if len(chunks) == 1: return data

# produced by tinygrad 0.11.0 (/work/peers/bin/python, CPU=1): Tensor(<case>).hash().data().hex()
TINYGRAD_HASHES = {
  "hello_uint8": (lambda: Tensor(b"Hello World!"), "e02b050b7b6e9bb60f9c033633502ee3"),
  "arange10_int32": (lambda: Tensor(np.arange(10, dtype=np.int32)), "0039fc3bf52b54757fb9ed6e7a9af78a"),
  "float32_2x3": (lambda: Tensor(np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, 7.0]], np.float32)),
                  "7b40ec1105564520006df440fd3d3b6a"),
}

@pytest.mark.parametrize("case", list(TINYGRAD_HASHES))
def test_hash_matches_tinygrad(case):
  make, want = TINYGRAD_HASHES[case]
  t = make()
  got = t.hash()
  assert got.shape == (16,) and got.dtype == dtypes.uint8
  assert bytes(got.tolist()).hex() == want
  assert bytes(got.tolist()) == tree_hash_reference(t.numpy().tobytes())

def test_hash_of_more_than_one_chunk_and_non_contiguous():
  arr = np.arange(2 ** 18 + 6, dtype=np.int32).reshape(-1, 2)   # 1 MiB + 24 bytes: two chunks, then a tree level
  assert bytes(Tensor(arr).flip(0).hash().tolist()) == tree_hash_reference(arr[::-1].tobytes())
