"""Small standard data sets as tensors: MNIST and Fashion-MNIST (IDX files), CIFAR-10 and scikit-learn's 8x8 digits.

Each loader returns `(X_train, Y_train, X_test, Y_test)`. MNIST-style and CIFAR-10 files are looked for in a local
folder first (a `path=` argument, the folder named by the environment variable KILN_DATASETS, and for Fashion-MNIST
the folder Debian's `dataset-fashion-mnist` package installs) and downloaded with `kiln.helpers.fetch` otherwise.
"""
from __future__ import annotations
import gzip, os, pathlib
import numpy as np
from kiln.device import Device
from kiln.helpers import fetch, prod
from kiln.tensor import Tensor

MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# where `apt-get install dataset-fashion-mnist` (Debian, Ubuntu) puts the four gzipped IDX files
DEBIAN_FASHION_MNIST_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR_FOLDER = "cifar-10-batches-bin"   # the archive's folder of batch files
CIFAR_BATCHES = tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",)
CIFAR_RECORD = 1 + 3 * 32 * 32   # a label byte, then the red, green and blue 32x32 planes

# IDX type codes -> big-endian NumPy dtypes (the format stores every multi-byte value big-endian)
IDX_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
  """The array stored in IDX bytes `data` (gzip-compressed or not), in native byte order. `source` names the file in
  errors.

  >>> parse_idx(bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3]) + bytes(range(6))).tolist()
  [[0, 1, 2], [3, 4, 5]]
  """
  if data[:2] == b"\x1f\x8b":  # gzip's magic number
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError) as error:
      raise ValueError(f"parse_idx: {source} is a damaged gzip file ({error})") from None
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise ValueError(f"parse_idx: {source} is not an IDX file (first bytes {data[:4].hex() or 'missing'}, expected "
                     f"00 00 <type> <ndim>)")
  type_code, ndim = data[2], data[3]
  if type_code not in IDX_DTYPES:
    raise ValueError(f"parse_idx: {source} has unknown IDX type code 0x{type_code:02x} "
                     f"(known: {', '.join(f'0x{code:02x}' for code in IDX_DTYPES)})")
  header_size = 4 + 4 * ndim
  if len(data) < header_size:
    raise ValueError(f"parse_idx: {source} is truncated: its header needs {header_size} bytes for {ndim} dimensions, "
                     f"the file has {len(data)}")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
  dtype = IDX_DTYPES[type_code]
  expected = header_size + prod(shape) * dtype.itemsize
  if len(data) != expected:
    what = "truncated" if len(data) < expected else "longer than its header says"
    raise ValueError(f"parse_idx: {source} is {what}: shape {shape} of {dtype.name} needs {expected} bytes, "
                     f"the file has {len(data)}")
  return np.frombuffer(data, dtype, offset=header_size).reshape(shape).astype(dtype.newbyteorder("="))

def read_idx(path: str | os.PathLike) -> np.ndarray:
  """The array in the IDX file at `path` (gzip-compressed or not)."""
  return parse_idx(pathlib.Path(path).read_bytes(), str(path))

def _local_idx_file(folders: list[pathlib.Path], stem: str) -> pathlib.Path | None:
  """The first `stem` or `stem.gz` found in `folders`, or None."""
  for folder in folders:
    for candidate in (folder / f"{stem}.gz", folder / stem):
      if candidate.is_file(): return candidate
  return None

def _mnist_folders(path: str | os.PathLike | None, fashion: bool) -> list[pathlib.Path]:
  """The local folders searched for the IDX files, in order."""
  subfolder = "fashion-mnist" if fashion else "mnist"
  roots = [pathlib.Path(p) for p in (path, os.environ.get("KILN_DATASETS")) if p]
  folders = [folder for root in roots for folder in (root, root / subfolder)]
  if fashion: folders.append(DEBIAN_FASHION_MNIST_DIR)
  return folders

def mnist(device: str | None = None, fashion: bool = False, path: str | os.PathLike | None = None
          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """MNIST (or Fashion-MNIST with `fashion=True`) as uint8 tensors `(X_train, Y_train, X_test, Y_test)`: images of
  shape (60000, 1, 28, 28) and (10000, 1, 28, 28), labels 0-9 of shape (60000,) and (10000,).

  The IDX files (`train-images-idx3-ubyte[.gz]`, ...) are read from `path`, then from $KILN_DATASETS (or their
  `mnist/` / `fashion-mnist/` subfolder), then for Fashion-MNIST from /usr/share/datasets/fashion-mnist (Debian's
  `dataset-fashion-mnist` package); a file found in none of them is downloaded with `fetch` (cached).
  A `path` given explicitly must hold all four files.
  """
  folders = _mnist_folders(path, fashion)
  base_url = FASHION_MNIST_URL if fashion else MNIST_URL
  arrays = []
  for stem in MNIST_FILES:
    local = _local_idx_file(folders, stem)
    if local is None and path is not None:
      raise FileNotFoundError(f"mnist: {stem}[.gz] is not in {path} (or its {folders[1].name}/ subfolder)")
    if local is None:
      local = fetch(base_url + stem + ".gz", name=stem + ".gz", subdir="fashion-mnist" if fashion else "mnist")
    arrays.append(read_idx(local))
  x_train, y_train, x_test, y_test = arrays
  for images, labels, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels) or images.dtype != np.uint8:
      raise ValueError(f"mnist: the {split} files do not hold matching uint8 images (N, H, W) and labels (N,): "
                       f"images {images.shape} {images.dtype}, labels {labels.shape} {labels.dtype}")
  def images_tensor(images: np.ndarray) -> Tensor: return Tensor(images[:, None], device=device)
  return (images_tensor(x_train), Tensor(y_train.astype(np.uint8), device=device),
          images_tensor(x_test), Tensor(y_test.astype(np.uint8), device=device))

def fashion_mnist(device: str | None = None, path: str | os.PathLike | None = None
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """Fashion-MNIST (Zalando's clothing images, MNIST's format and sizes): `mnist(device, fashion=True, path=path)`.

  Offline, `apt-get install dataset-fashion-mnist` provides the files.
  """
  return mnist(device, fashion=True, path=path)

def _cifar_batches(path: str | os.PathLike | None) -> dict[str, Tensor]:
  """Each CIFAR-10 batch file's bytes as a uint8 Tensor, by file name: from the batch folder or the archive in
  `path` or $KILN_DATASETS (or their `cifar10/` subfolder), else from the downloaded archive."""
  from kiln.nn.state import tar_extract
  roots = [pathlib.Path(p) for p in (path, os.environ.get("KILN_DATASETS")) if p]
  for folder in (folder for root in roots for folder in (root, root / "cifar10")):
    if all((folder / CIFAR_FOLDER / name).is_file() for name in CIFAR_BATCHES):
      return {name: Tensor(folder / CIFAR_FOLDER / name) for name in CIFAR_BATCHES}
    for archive, gunzip in ((folder / "cifar-10-binary.tar", False), (folder / "cifar-10-binary.tar.gz", True)):
      if archive.is_file():
        members = tar_extract(fetch(str(archive.resolve()), gunzip=True) if gunzip else archive)
        return {name: members[f"{CIFAR_FOLDER}/{name}"] for name in CIFAR_BATCHES}
  if path is not None:
    raise FileNotFoundError(f"cifar: neither {CIFAR_FOLDER}/ nor cifar-10-binary.tar[.gz] is in {path} (or its "
                            "cifar10/ subfolder)")
  members = tar_extract(fetch(CIFAR_URL, gunzip=True, subdir="cifar10"))
  return {name: members[f"{CIFAR_FOLDER}/{name}"] for name in CIFAR_BATCHES}

def cifar(device: str | None = None, path: str | os.PathLike | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """CIFAR-10 as uint8 tensors `(X_train, Y_train, X_test, Y_test)`: images of shape (50000, 3, 32, 32) and
  (10000, 3, 32, 32), labels 0-9 of shape (50000,) and (10000,).

  The binary version's files (`cifar-10-batches-bin/data_batch_1.bin` ... `test_batch.bin`, or the archive
  `cifar-10-binary.tar[.gz]` holding them) are read from `path`, then from $KILN_DATASETS (or their `cifar10/`
  subfolder); else the archive is downloaded with `fetch` (cached, decompressed).
  """
  batches = _cifar_batches(path)
  for name, data in batches.items():
    if data.shape[0] % CIFAR_RECORD:
      raise ValueError(f"cifar: {name} has {data.shape[0]} bytes, not a whole number of {CIFAR_RECORD}-byte records")
  device = device or Device.DEFAULT
  train = Tensor.cat(*[batches[name].to(device).reshape(-1, CIFAR_RECORD) for name in CIFAR_BATCHES[:-1]])
  test = batches[CIFAR_BATCHES[-1]].to(device).reshape(-1, CIFAR_RECORD)
  return (train[:, 1:].reshape(-1, 3, 32, 32).contiguous(), train[:, 0].contiguous(),
          test[:, 1:].reshape(-1, 3, 32, 32).contiguous(), test[:, 0].contiguous())

def digits(device: str | None = None, test_size: int = 360, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """scikit-learn's bundled 8x8 handwritten digits (1797 images, no download) as `(X_train, Y_train, X_test, Y_test)`:
  float32 images in [0, 1] of shape (N, 1, 8, 8) and uint8 labels 0-9.

  The split is fixed: the images are shuffled with `seed` and the first `test_size` are the test set.
  Needs scikit-learn (`pip install scikit-learn`).
  """
  try:
    from sklearn.datasets import load_digits
  except ImportError:
    raise ImportError("digits: needs scikit-learn for its bundled data set (pip install scikit-learn)") from None
  data = load_digits()
  if not 0 < test_size < len(data.target):
    raise ValueError(f"digits: test_size must be between 1 and {len(data.target) - 1}, got {test_size}")
  images = (data.images / 16.0).astype(np.float32)[:, None]  # pixel values are 0..16
  labels = data.target.astype(np.uint8)
  order = np.random.default_rng(seed).permutation(len(labels))
  test, train = order[:test_size], order[test_size:]
  return (Tensor(images[train], device=device), Tensor(labels[train], device=device),
          Tensor(images[test], device=device), Tensor(labels[test], device=device))
