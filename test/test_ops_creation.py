"""Creation ops: random integers, permutations and sampling (distribution sanity, seeds, devices), tensors over host
memory and URLs, and the deterministic constructors against PyTorch."""
import ctypes, gzip, http.server, threading
import numpy as np
import pytest
import torch
from kiln import Tensor, Device, dtypes

def seeded(fn, seed=1234, device=None):
  Tensor.manual_seed(seed)
  return fn(device or Device.DEFAULT).numpy()

# ---------------------------------------------------------------------------------------------------------------------
# randint

@pytest.mark.parametrize("low, high, dtype", [(0, 10, "int32"), (-3, 4, "int32"), (-3, 4, "int64"), (0, 256, "uint8"),
                                              (-128, 128, "int8"), (5, 6, "int16")])
def test_randint_range_and_frequencies(low, high, dtype):
  Tensor.manual_seed(0)
  t = Tensor.randint(40, 50, low=low, high=high, dtype=dtype)
  v = t.numpy()
  assert t.shape == (40, 50) and t.dtype == dtypes.fields()[dtype] and v.dtype == np.dtype(dtype)
  assert v.min() >= low and v.max() < high
  counts = np.bincount(v.astype(np.int64).reshape(-1) - low, minlength=high - low)
  expected = v.size / (high - low)
  if high - low <= 10:   # every value shows up about equally often (5 standard deviations)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected)), counts

def test_randint_wide_ranges():
  Tensor.manual_seed(3)
  big = Tensor.randint(2000, low=-2 ** 40, high=2 ** 40, dtype="int64").numpy()
  assert big.min() >= -2 ** 40 and big.max() < 2 ** 40 and big.min() < -2 ** 38 and big.max() > 2 ** 38
  full = Tensor.randint(2000, low=-2 ** 31, high=2 ** 31 - 1).numpy()
  assert full.min() < -2 ** 29 and full.max() > 2 ** 29
  assert Tensor.randint(low=1, high=3).shape == ()

def test_randint_reproducible_and_same_on_python_device():
  a = seeded(lambda d: Tensor.randint(3, 5, low=-4, high=9, device=d))
  b = seeded(lambda d: Tensor.randint(3, 5, low=-4, high=9, device=d))
  c = seeded(lambda d: Tensor.randint(3, 5, low=-4, high=9, device=d), device="PYTHON")
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(a, c)
  assert not np.array_equal(a, seeded(lambda d: Tensor.randint(3, 5, low=-4, high=9, device=d), seed=99))
  assert Tensor.randint(2, device="PYTHON").device == "PYTHON"

def test_randint_errors():
  with pytest.raises(TypeError, match="randint: low and high must be ints"): Tensor.randint(2, low=0.5, high=3)
  with pytest.raises(TypeError, match="randint: dtype must be an integer type"): Tensor.randint(2, dtype="float32")
  with pytest.raises(ValueError, match="randint: low must be less than high"): Tensor.randint(2, low=5, high=5)
  with pytest.raises(ValueError, match="randint: .* does not fit"): Tensor.randint(2, low=0, high=300, dtype="uint8")

# ---------------------------------------------------------------------------------------------------------------------
# randperm

@pytest.mark.parametrize("n", [0, 1, 7, 100, 3000])
def test_randperm_is_a_permutation(n):
  Tensor.manual_seed(5)
  t = Tensor.randperm(n)
  assert t.shape == (n,) and t.dtype == dtypes.int32
  np.testing.assert_array_equal(np.sort(t.numpy()), np.arange(n))
  if n >= 100: assert not np.array_equal(t.numpy(), np.arange(n))

def test_randperm_options_seeds_devices():
  t = Tensor.randperm(6, dtype=dtypes.int64, device="PYTHON")
  assert t.dtype == dtypes.int64 and t.device == "PYTHON"
  a = seeded(lambda d: Tensor.randperm(50, device=d))
  np.testing.assert_array_equal(a, seeded(lambda d: Tensor.randperm(50, device=d)))
  np.testing.assert_array_equal(a, seeded(lambda d: Tensor.randperm(50, device=d), device="PYTHON"))
  assert not np.array_equal(a, seeded(lambda d: Tensor.randperm(50, device=d), seed=7))
  # every position is equally likely to hold a given value
  Tensor.manual_seed(11)
  firsts = np.array([Tensor.randperm(4).numpy()[0] for _ in range(200)])
  assert np.all(np.abs(np.bincount(firsts, minlength=4) - 50) < 5 * np.sqrt(50 * 0.75))
  with pytest.raises(ValueError, match="randperm: n must be a non-negative int"): Tensor.randperm(-1)

# ---------------------------------------------------------------------------------------------------------------------
# multinomial

def test_multinomial_with_replacement_frequencies():
  Tensor.manual_seed(42)
  p = np.array([1.0, 2.0, 0.0, 3.0, 4.0], np.float32)
  s = Tensor(p).multinomial(5000, replacement=True)
  assert s.shape == (5000,) and s.dtype == dtypes.int32
  freq = np.bincount(s.numpy(), minlength=5) / 5000
  want = p / p.sum()
  assert freq[2] == 0   # a zero weight is never drawn
  assert np.all(np.abs(freq - want) < 5 * np.sqrt(want * (1 - want) / 5000) + 1e-9), (freq, want)

def test_multinomial_rows_and_int_weights():
  Tensor.manual_seed(1)
  w = Tensor([[0, 0, 5], [1, 0, 0], [1, 1, 0]])
  s = w.multinomial(400, replacement=True).numpy()
  assert s.shape == (3, 400)
  assert np.all(s[0] == 2) and np.all(s[1] == 0) and set(np.unique(s[2])) == {0, 1}
  assert abs((s[2] == 0).mean() - 0.5) < 5 * np.sqrt(0.25 / 400)
  one = Tensor([[0.2, 0.8], [0.9, 0.1]]).multinomial()
  assert one.shape == (2, 1) and set(one.numpy().reshape(-1)) <= {0, 1}

def test_multinomial_without_replacement():
  Tensor.manual_seed(2)
  w = Tensor.rand(64, 6) + 0.1
  s = w.multinomial(6).numpy()
  for row in s: np.testing.assert_array_equal(np.sort(row), np.arange(6))   # all samples of a row are distinct
  s = Tensor([[1.0, 0.0, 3.0, 2.0]]).multinomial(3).numpy()
  assert s.shape == (1, 3) and len(set(s[0])) == 3 and 1 not in s[0]
  # the first draw without replacement follows the weights
  p = np.array([1.0, 3.0, 6.0], np.float32)
  firsts = Tensor(np.tile(p, (3000, 1))).multinomial(2).numpy()
  freq, want = np.bincount(firsts[:, 0], minlength=3) / 3000, p / p.sum()
  assert np.all(np.abs(freq - want) < 5 * np.sqrt(want * (1 - want) / 3000)), (freq, want)
  assert np.all(firsts[:, 0] != firsts[:, 1])

def test_multinomial_reproducible_and_same_on_python_device():
  w = [0.1, 0.5, 0.2, 0.2]
  a = seeded(lambda d: Tensor(w, device=d).multinomial(20, replacement=True))
  np.testing.assert_array_equal(a, seeded(lambda d: Tensor(w, device=d).multinomial(20, replacement=True)))
  def draw(d): return Tensor(w, device=d).multinomial(20, replacement=True)
  np.testing.assert_array_equal(a, seeded(draw, device="PYTHON"))
  b = seeded(lambda d: Tensor(w, device=d).multinomial(3))
  np.testing.assert_array_equal(b, seeded(lambda d: Tensor(w, device=d).multinomial(3), device="PYTHON"))

def test_multinomial_errors():
  with pytest.raises(ValueError, match="multinomial: weights must be 1-d or 2-d"): Tensor.ones(2, 2, 2).multinomial()
  with pytest.raises(ValueError, match="multinomial: num_samples must be a positive int"): Tensor.ones(3).multinomial(0)
  with pytest.raises(ValueError, match="multinomial: cannot draw 4 samples without replacement from 3"):
    Tensor.ones(3).multinomial(4)
  with pytest.raises(ValueError, match="multinomial: .* no categories"): Tensor.ones(2, 0).multinomial(1, True)
  assert Tensor.ones(3).multinomial(4, replacement=True).shape == (4,)

# ---------------------------------------------------------------------------------------------------------------------
# from_blob, from_url

@pytest.mark.parametrize("npdt", ["float32", "float16", "int64", "uint8", "bool", "int16"])
def test_from_blob(npdt):
  src = (np.arange(12) % 5 - 2).astype(npdt).reshape(3, 4)
  t = Tensor.from_blob(src.ctypes.data, (3, 4), dtype=dtypes.fields()[npdt])
  assert t.shape == (3, 4) and t.dtype == dtypes.fields()[npdt]
  np.testing.assert_array_equal(t.numpy(), src)

def test_from_blob_uses_the_memory_in_place_and_devices():
  raw = (ctypes.c_float * 4)(1.0, -2.0, 3.5, 0.25)
  t = Tensor.from_blob(ctypes.addressof(raw), (2, 2), device="PYTHON")
  assert t.device == "PYTHON" and t.dtype == dtypes.float32
  raw[0] = 99.0   # as in tinygrad, the tensor is the memory: it sees later writes
  np.testing.assert_array_equal(t.numpy(), [[99.0, -2.0], [3.5, 0.25]])
  t.assign(t * 2).realize()   # and writes to the tensor land in the memory
  assert list(raw) == [198.0, -4.0, 7.0, 0.5]
  t[1] = Tensor([0.0, 1.0], device="PYTHON")
  t.realize()
  assert list(raw) == [198.0, -4.0, 0.0, 1.0]
  ints = np.arange(6, dtype=np.int32)
  u = Tensor.from_blob(ints.ctypes.data, (3, 2), dtype=dtypes.int32)
  ints[5] = -7
  assert u.tolist() == [[0, 1], [2, 3], [4, -7]] and (u + 1).tolist() == [[1, 2], [3, 4], [5, -6]]
  bits = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16).view(torch.int16).numpy()
  bf = Tensor.from_blob(bits.ctypes.data, (3,), dtype=dtypes.bfloat16)
  np.testing.assert_array_equal(bf.numpy(), [1.5, -2.25, 3.0])
  assert Tensor.from_blob(0, (0, 3)).shape == (0, 3)
  grad = Tensor.from_blob(ctypes.addressof(raw), (4,), requires_grad=True)
  (grad * 2).sum().backward()
  np.testing.assert_array_equal(grad.grad.numpy(), [2.0] * 4)
  with pytest.raises(ValueError, match="from_blob: ptr must be a valid"): Tensor.from_blob(0, (2,))

@pytest.fixture
def download_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  return tmp_path

def test_from_url_file_and_gunzip(download_cache):
  payload = bytes(range(256)) * 3
  (download_cache / "data.bin").write_bytes(payload)
  (download_cache / "data.gz").write_bytes(gzip.compress(payload))
  t = Tensor.from_url((download_cache / "data.bin").as_uri())
  assert t.dtype == dtypes.uint8 and t.shape == (768,)
  assert t.numpy().tobytes() == payload
  assert list((download_cache / "cache" / "kiln" / "downloads").iterdir())   # it went through the cache
  g = Tensor.from_url((download_cache / "data.gz").as_uri(), gunzip=True, device="PYTHON")
  assert g.device == "PYTHON" and g.numpy().tobytes() == payload
  as_i32 = Tensor.from_url((download_cache / "data.bin").as_uri(), dtype=dtypes.int32)
  np.testing.assert_array_equal(as_i32.numpy(), np.frombuffer(payload, np.int32))
  assert Tensor.from_url(str(download_cache / "data.bin")).numpy().tobytes() == payload   # a local path
  (download_cache / "odd.bin").write_bytes(b"1234567")
  with pytest.raises(ValueError, match="from_url: 7 bytes are not a whole number"):
    Tensor.from_url(str(download_cache / "odd.bin"), dtype=dtypes.int32)

def test_from_url_local_http_server(download_cache):
  payload = b"kiln over http " * 10

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
      body = payload if self.path == "/ok" else b""
      self.send_response(200 if self.path == "/ok" else 404)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)
    def log_message(self, *args): pass

  server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    assert Tensor.from_url(f"{url}/ok").numpy().tobytes() == payload
    with pytest.raises(RuntimeError, match="from_url: .*missing.*404"): Tensor.from_url(f"{url}/missing")
  finally:
    server.shutdown()
    server.server_close()

# ---------------------------------------------------------------------------------------------------------------------
# the deterministic constructors against torch, and the *_like ones' shapes, dtypes and devices

@pytest.mark.parametrize("args, kwargs, tdtype", [((0, 1, 5), {}, None), ((0, 10, 5), {"dtype": "int32"}, torch.int32),
                                                  ((-1, 1, 1), {}, None), ((0, 1, 0), {}, None),
                                                  ((2.5, -1, 4), {"dtype": "float16"}, torch.float16),
                                                  ((0, 1, 3), {"device": "PYTHON"}, None)])
def test_linspace(args, kwargs, tdtype):
  t, want = Tensor.linspace(*args, **kwargs), torch.linspace(*args, **({"dtype": tdtype} if tdtype else {}))
  assert t.shape == tuple(want.shape) and t.device == kwargs.get("device", Device.DEFAULT)
  assert t.dtype == dtypes.fields()[str(want.dtype)[6:]]
  np.testing.assert_allclose(t.numpy().astype(np.float64), want.numpy().astype(np.float64), rtol=2e-3, atol=1e-3)

def test_linspace_errors():
  with pytest.raises(ValueError, match="linspace: steps must be a non-negative int"): Tensor.linspace(0, 1, -1)

@pytest.mark.parametrize("dtype, tdtype", [("int16", torch.int16), ("float32", torch.float32), ("bool", torch.bool),
                                           ("float16", torch.float16)])
@pytest.mark.parametrize("device", [Device.DEFAULT, "PYTHON"])
def test_like_constructors(dtype, tdtype, device):
  x, tx = Tensor.ones(2, 3, dtype=dtype, device=device), torch.ones(2, 3, dtype=tdtype)
  for name in ["zeros_like", "ones_like"]:
    out, want = getattr(x, name)(), getattr(torch, name)(tx)
    assert out.shape == tuple(want.shape) and out.dtype == x.dtype and out.device == device
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    assert getattr(x, name)(dtype="float16").dtype == dtypes.float16
  out, want = x.full_like(1), torch.full_like(tx, 1)
  assert out.dtype == x.dtype and out.device == device
  np.testing.assert_array_equal(out.numpy(), want.numpy())
  assert x.full_like(2, device="CPU").device == "CPU"

@pytest.mark.parametrize("name", ["rand_like", "randn_like"])
def test_random_like(name):
  x = Tensor.zeros(3, 40, dtype="float16", device="PYTHON")
  out = getattr(x, name)()
  assert out.shape == (3, 40) and out.dtype == dtypes.float16 and out.device == "PYTHON"
  assert getattr(x, name)(dtype="float32").dtype == dtypes.float32
  assert getattr(x, name)(device="CPU").device == "CPU"
  v = out.numpy().astype(np.float32)
  if name == "rand_like": assert v.min() >= 0 and v.max() < 1 and abs(v.mean() - 0.5) < 0.1
  else: assert abs(v.mean()) < 0.3 and 0.7 < v.std() < 1.3
  with pytest.raises(ValueError, match="rand: only float dtypes"): Tensor.zeros(2, dtype="int32").rand_like()
