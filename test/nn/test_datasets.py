"""helpers.fetch (file:// and a local HTTP server, caching, offline errors), the tqdm bar, IDX parsing, the loaders."""
import functools, gzip, http.server, io, pathlib, threading
import numpy as np
import pytest
from kiln.dtype import dtypes
from kiln.helpers import fetch, tqdm, trange
from kiln.nn import datasets
from kiln.nn.datasets import parse_idx, read_idx, mnist, fashion_mnist, digits

# ---- IDX ----

def idx_bytes(array: np.ndarray, type_code: int) -> bytes:
  """`array` written as an IDX file with `type_code` (big-endian header and data)."""
  header = bytes([0, 0, type_code, array.ndim]) + np.array(array.shape, ">u4").tobytes()
  return header + array.astype(datasets.IDX_DTYPES[type_code]).tobytes()

@pytest.mark.parametrize("type_code", sorted(datasets.IDX_DTYPES))
def test_parse_idx_every_type(type_code):
  array = (np.arange(24).reshape(2, 3, 4) - 5).astype(datasets.IDX_DTYPES[type_code].newbyteorder("="))
  if type_code == 0x08: array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4) * 10
  parsed = parse_idx(idx_bytes(array, type_code))
  assert parsed.dtype == array.dtype and parsed.shape == (2, 3, 4), (parsed.dtype, parsed.shape)
  np.testing.assert_array_equal(parsed, array)

def test_parse_idx_gzip_and_file(tmp_path):
  labels = np.array([3, 1, 4, 1, 5], np.uint8)
  path = tmp_path / "labels-idx1-ubyte.gz"
  path.write_bytes(gzip.compress(idx_bytes(labels, 0x08)))
  np.testing.assert_array_equal(read_idx(path), labels)

@pytest.mark.parametrize("data, message", [
  (b"PK\x03\x04rest", "not an IDX file"),
  (b"", "not an IDX file"),
  (bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 7]), "unknown IDX type code 0x42"),
  (bytes([0, 0, 8, 3, 0, 0, 0, 2]), "truncated: its header needs 16 bytes"),
  (bytes([0, 0, 8, 1, 0, 0, 0, 5, 1, 2, 3]), "truncated: shape (5,)"),
  (bytes([0, 0, 8, 1, 0, 0, 0, 2, 1, 2, 3]), "longer than its header says"),
  (b"\x1f\x8b\x08\x00garbage", "damaged gzip"),
])
def test_parse_idx_errors(data, message):
  with pytest.raises(ValueError, match="parse_idx: bad.idx") as info: parse_idx(data, "bad.idx")
  assert message in str(info.value), str(info.value)

# ---- fetch ----

@pytest.fixture
def cache(tmp_path, monkeypatch):
  """A fresh kiln cache directory for the test; returns its downloads folder."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  monkeypatch.delenv("DISABLE_HTTP_CACHE", raising=False)
  return tmp_path / "cache" / "kiln" / "downloads"

@pytest.fixture
def http_server(tmp_path):
  """A local HTTP server over tmp_path/www in a thread; yields (folder, base URL)."""
  root = tmp_path / "www"
  root.mkdir()
  class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try: yield root, f"http://127.0.0.1:{server.server_address[1]}/"
  finally:
    server.shutdown()
    server.server_close()

def test_fetch_file_url_caches(tmp_path, cache):
  source = tmp_path / "data.bin"
  source.write_bytes(b"first")
  path = fetch(source.as_uri())
  assert path.read_bytes() == b"first" and path.parent == cache, path
  source.write_bytes(b"second")
  assert fetch(source.as_uri()).read_bytes() == b"first"  # served from the cache
  assert fetch(source.as_uri(), allow_caching=False).read_bytes() == b"second"
  assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary files left behind

def test_fetch_name_subdir_gunzip(tmp_path, cache):
  source = tmp_path / "data.gz"
  source.write_bytes(gzip.compress(b"x" * 1000))
  path = fetch(source.as_uri(), name="unpacked", subdir="sets", gunzip=True)
  assert path == cache / "sets" / "unpacked.gunzip" and path.read_bytes() == b"x" * 1000
  explicit = tmp_path / "out" / "exact.bin"
  assert fetch(source.as_uri(), name=explicit) == explicit and explicit.read_bytes() == source.read_bytes()

def test_fetch_local_paths(tmp_path, cache):
  source = tmp_path / "plain.txt"
  source.write_bytes(gzip.compress(b"zipped"))
  assert fetch(str(source)) == source
  assert fetch(str(source), gunzip=True).read_bytes() == b"zipped"
  with pytest.raises(RuntimeError, match="no file at local path"): fetch(str(tmp_path / "missing"))

def test_fetch_http_server_then_offline(http_server, cache):
  root, base = http_server
  (root / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: over the progress-bar threshold
  path = fetch(base + "big.bin")
  assert path.read_bytes() == bytes(range(256)) * 8192
  (root / "big.bin").unlink()  # the server no longer has it: a cache hit must not ask
  assert fetch(base + "big.bin") == path
  with pytest.raises(RuntimeError, match=r"HTTP 404.*nothing cached"): fetch(base + "gone.bin")

def test_fetch_offline_uncached_error(cache):
  url = "http://127.0.0.1:9/dataset.bin"  # the discard port: nothing listens there, like a machine without network
  with pytest.raises(RuntimeError) as info: fetch(url, name="dataset.bin")
  message = str(info.value)
  assert url in message and str(cache / "dataset.bin") in message, message
  assert not (cache / "dataset.bin").exists()

def test_fetch_bad_gzip(tmp_path, cache):
  source = tmp_path / "not.gz"
  source.write_bytes(b"plain text, not gzip")
  with pytest.raises(RuntimeError, match="not valid gzip data"): fetch(source.as_uri(), gunzip=True)
  assert not cache.exists() or not list(cache.iterdir())

# ---- tqdm ----

def last_frame(out: io.StringIO) -> str:
  return out.getvalue().rstrip("\n").split("\r")[-1].rstrip()

def test_tqdm_iterable_to_stringio():
  out = io.StringIO()
  assert list(tqdm(range(5), desc="work", file=out, disable=False)) == [0, 1, 2, 3, 4]
  frame = last_frame(out)
  assert frame.startswith("work: 100%|" + "#" * 24 + "| 5/5 [") and "it/s]" in frame, frame
  assert out.getvalue().endswith("\n")

def test_tqdm_manual_update_unit_scale():
  out = io.StringIO()
  bar = tqdm(total=3_000_000, desc="download", unit="B", unit_scale=True, file=out, disable=False, min_interval=0)
  bar.update(1_500_000)
  assert " 50%|" + "#" * 12 + "." * 12 + "| 1.50 M/3.00 MB [" in last_frame(out), last_frame(out)
  bar.update(1_500_000, close=True)
  assert "| 3.00 M/3.00 MB [" in last_frame(out) and "B/s]" in last_frame(out), last_frame(out)

def test_tqdm_unknown_total_and_eta():
  out = io.StringIO()
  bar = tqdm(desc="stream", file=out, disable=False)
  bar.update(7)
  bar.close()
  assert last_frame(out).startswith("stream: 7 it ["), last_frame(out)
  assert "<" in tqdm(total=10, file=io.StringIO(), disable=False).format(0.0 + 1e9)  # shows elapsed<eta

def test_tqdm_off_when_not_a_terminal():
  out = io.StringIO()  # not a TTY
  for _ in tqdm(range(3), file=out): pass
  for _ in trange(3, file=out): pass
  assert out.getvalue() == ""
  with pytest.raises(TypeError, match="no iterable"): list(tqdm(total=3, file=out))

# ---- loaders ----

def write_mnist_folder(folder: pathlib.Path, n_train: int, n_test: int, compress: bool) -> None:
  """Four small MNIST-format IDX files in `folder` (images hold their index, labels index % 10)."""
  folder.mkdir(parents=True, exist_ok=True)
  for split, n in (("train", n_train), ("t10k", n_test)):
    images = (np.arange(n, dtype=np.uint8)[:, None, None] * np.ones((1, 28, 28), np.uint8))
    labels = (np.arange(n) % 10).astype(np.uint8)
    for kind, array in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)):
      data = idx_bytes(array, 0x08)
      (folder / f"{split}-{kind}{'.gz' if compress else ''}").write_bytes(gzip.compress(data) if compress else data)

@pytest.mark.parametrize("compress", [True, False])
def test_mnist_from_path(tmp_path, compress):
  write_mnist_folder(tmp_path, 6, 4, compress)
  x_train, y_train, x_test, y_test = mnist(path=tmp_path)
  assert (x_train.shape, y_train.shape, x_test.shape, y_test.shape) == ((6, 1, 28, 28), (6,), (4, 1, 28, 28), (4,))
  assert x_train.dtype.name == "uchar" and y_train.dtype.name == "uchar", (x_train.dtype, y_train.dtype)
  assert x_train.numpy()[:, 0, 5, 5].tolist() == list(range(6)) and y_test.tolist() == [0, 1, 2, 3]

def test_fashion_mnist_from_env_subfolder(tmp_path, monkeypatch):
  write_mnist_folder(tmp_path / "fashion-mnist", 3, 2, True)
  monkeypatch.setenv("KILN_DATASETS", str(tmp_path))
  assert fashion_mnist()[1].tolist() == [0, 1, 2]

def test_mnist_path_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"): mnist(path=tmp_path)

def test_mnist_mismatched_files(tmp_path):
  write_mnist_folder(tmp_path, 6, 4, False)
  (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(5, np.uint8), 0x08))
  with pytest.raises(ValueError, match=r"mnist: the train files.*images \(6, 28, 28\).*labels \(5,\)"):
    mnist(path=tmp_path)

def test_mnist_downloads_when_not_local(tmp_path, monkeypatch, cache):
  www = tmp_path / "www"
  write_mnist_folder(www, 2, 2, True)
  monkeypatch.setattr(datasets, "MNIST_URL", www.as_uri() + "/")
  monkeypatch.delenv("KILN_DATASETS", raising=False)
  assert mnist()[3].tolist() == [0, 1]
  assert sorted(p.name for p in (cache / "mnist").iterdir()) == sorted(f"{stem}.gz" for stem in datasets.MNIST_FILES)

@pytest.mark.skipif(not datasets.DEBIAN_FASHION_MNIST_DIR.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_fashion_mnist_debian_package_labels(monkeypatch):
  monkeypatch.delenv("KILN_DATASETS", raising=False)
  labels = read_idx(datasets.DEBIAN_FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
  assert labels.shape == (10000,) and np.bincount(labels).tolist() == [1000] * 10  # balanced classes

def test_digits_split():
  pytest.importorskip("sklearn")
  from sklearn.datasets import load_digits
  x_train, y_train, x_test, y_test = digits()
  shapes = (x_train.shape, x_test.shape, y_train.shape, y_test.shape)
  assert shapes == ((1437, 1, 8, 8), (360, 1, 8, 8), (1437,), (360,)), shapes
  images = np.concatenate([x_train.numpy(), x_test.numpy()]).reshape(-1, 64) * 16
  reference = load_digits().data
  # the split is a permutation of the whole set: every reference image appears once
  assert sorted(map(tuple, images.round().astype(int))) == sorted(map(tuple, reference.astype(int)))
  assert np.array_equal(digits()[3].numpy(), y_test.numpy())  # fixed
  with pytest.raises(ValueError, match="digits: test_size"): digits(test_size=0)

# ---- CIFAR-10 ----

def cifar_records(n: int, seed: int) -> np.ndarray:
  """n CIFAR-10 binary records: a label byte 0-9, then 3072 pixel bytes."""
  rng = np.random.default_rng(seed)
  records = rng.integers(0, 256, (n, datasets.CIFAR_RECORD), dtype=np.uint8)
  records[:, 0] = rng.integers(0, 10, n)
  return records

def write_cifar(folder: pathlib.Path, archive: str | None) -> tuple[np.ndarray, np.ndarray]:
  """The six batch files (2 records each, 3 in the test batch) in folder/cifar-10-batches-bin/, or packed into
  folder/`archive` (a .tar or .tar.gz) instead; returns (train records, test records)."""
  import tarfile
  batches = {name: cifar_records(3 if name == "test_batch.bin" else 2, seed)
             for seed, name in enumerate(datasets.CIFAR_BATCHES)}
  (folder / datasets.CIFAR_FOLDER).mkdir(parents=True)
  for name, records in batches.items(): (folder / datasets.CIFAR_FOLDER / name).write_bytes(records.tobytes())
  if archive is not None:
    with tarfile.open(folder / archive, "w:gz" if archive.endswith(".gz") else "w") as tar:
      tar.add(folder / datasets.CIFAR_FOLDER, arcname=datasets.CIFAR_FOLDER)
    for name in batches: (folder / datasets.CIFAR_FOLDER / name).unlink()
  return np.concatenate([batches[name] for name in datasets.CIFAR_BATCHES[:-1]]), batches["test_batch.bin"]

@pytest.mark.parametrize("archive", [None, "cifar-10-binary.tar", "cifar-10-binary.tar.gz"])
def test_cifar_from_path(tmp_path, cache, archive):
  train, test = write_cifar(tmp_path, archive)
  x_train, y_train, x_test, y_test = datasets.cifar(path=tmp_path)
  assert x_train.shape == (10, 3, 32, 32) and x_test.shape == (3, 3, 32, 32) and x_train.dtype == dtypes.uint8
  np.testing.assert_array_equal(x_train.numpy(), train[:, 1:].reshape(-1, 3, 32, 32))
  np.testing.assert_array_equal(y_train.numpy(), train[:, 0])
  np.testing.assert_array_equal(x_test.numpy(), test[:, 1:].reshape(-1, 3, 32, 32))
  np.testing.assert_array_equal(y_test.numpy(), test[:, 0])

def test_cifar_from_env_and_download(tmp_path, monkeypatch, cache):
  train, _ = write_cifar(tmp_path / "data" / "cifar10", None)
  monkeypatch.setenv("KILN_DATASETS", str(tmp_path / "data"))
  np.testing.assert_array_equal(datasets.cifar()[1].numpy(), train[:, 0])
  monkeypatch.delenv("KILN_DATASETS")
  _, test = write_cifar(tmp_path / "www", "cifar-10-binary.tar.gz")
  monkeypatch.setattr(datasets, "CIFAR_URL", (tmp_path / "www" / "cifar-10-binary.tar.gz").as_uri())
  np.testing.assert_array_equal(datasets.cifar()[3].numpy(), test[:, 0])

def test_cifar_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="cifar-10-binary"): datasets.cifar(path=tmp_path)
  write_cifar(tmp_path, None)
  (tmp_path / datasets.CIFAR_FOLDER / "data_batch_3.bin").write_bytes(bytes(5000))
  with pytest.raises(ValueError, match="data_batch_3.bin has 5000 bytes"): datasets.cifar(path=tmp_path)
