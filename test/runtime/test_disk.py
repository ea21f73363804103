"""The DISK device: file-backed tensors, byte-range views, copies out and writes in, laziness on huge files."""
import os, pathlib
import numpy as np
import pytest
from kiln import Tensor, dtypes, Device
from kiln.device import Buffer

def _file(tmp_path: pathlib.Path, data: bytes, name: str = "data.bin") -> pathlib.Path:
  path = tmp_path / name
  path.write_bytes(data)
  return path

def test_tensor_of_path_is_lazy_uint8_on_disk(tmp_path):
  path = _file(tmp_path, bytes(range(10)))
  t = Tensor(path)
  assert t.shape == (10,) and t.dtype == dtypes.uint8
  assert t.device == f"DISK:{os.path.abspath(path)}"
  assert not t.uop.buffer.is_allocated(), "making the tensor must not open or read the file"
  assert t.numpy().tolist() == list(range(10))

def test_device_registry_opens_a_file(tmp_path):
  path = _file(tmp_path, b"abcd")
  dev = Device[f"DISK:{path}"]
  assert type(dev).__name__ == "DiskDevice" and dev.device == f"DISK:{path}"
  buf = Buffer(f"DISK:{path}", 4, dtypes.uint8).allocate()
  assert buf.as_bytes() == b"abcd"

def test_shrink_bitcast_reshape_views_copy_the_right_bytes(tmp_path):
  values = np.arange(24, dtype=np.float32)
  t = Tensor(_file(tmp_path, values.tobytes()))
  floats = t.bitcast(dtypes.float32)
  assert floats.shape == (24,) and floats.device.startswith("DISK")
  np.testing.assert_array_equal(floats.to("CPU").numpy(), values)
  window = t[16:48].bitcast(dtypes.float32)   # floats 4..11
  np.testing.assert_array_equal(window.numpy(), values[4:12])
  rows = t.reshape(6, 16)[2:4].bitcast(dtypes.float32).reshape(2, 2, 2)   # floats 8..15
  np.testing.assert_array_equal(rows.to("CPU").numpy(), values[8:16].reshape(2, 2, 2))
  halves = t[0:8].bitcast(dtypes.int16)
  np.testing.assert_array_equal(halves.numpy(), values[:2].view(np.int16))
  # a copy to CPU can be computed on
  np.testing.assert_array_equal((window.to("CPU") * 2).numpy(), values[4:12] * 2)

def test_bitcast_bool_bf16_and_scalar(tmp_path):
  bf16 = (np.array([1.5, -2.0], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
  t = Tensor(_file(tmp_path, bytes([1, 0, 1]) + bf16.tobytes() + np.int64(7).tobytes()))
  assert t[0:3].bitcast(dtypes.bool).numpy().tolist() == [True, False, True]
  assert t[3:7].bitcast(dtypes.bfloat16).numpy().tolist() == [1.5, -2.0]
  assert t[7:15].bitcast(dtypes.int64).reshape(()).item() == 7

def test_empty_creates_file_and_assign_writes_through(tmp_path):
  path = tmp_path / "out.bin"
  t = Tensor.empty(16, dtype=dtypes.uint8, device=f"disk:{path}")
  t.assign(Tensor(np.arange(16, dtype=np.uint8)))
  assert path.read_bytes() == bytes(range(16))
  assert t.to("CPU").numpy().tolist() == list(range(16))
  # a typed window: bytes 4..12 as two int32
  t[4:12].bitcast(dtypes.int32).assign(Tensor([-1, 258], dtype=dtypes.int32))
  assert path.read_bytes()[4:12] == np.array([-1, 258], dtype=np.int32).tobytes()
  # read again after the write: the new bytes, not a cached old result
  assert t.to("CPU").numpy()[4:12].tolist() == list(np.array([-1, 258], dtype=np.int32).view(np.uint8))
  # a value of another dtype is cast; a Python list works too
  t[0:4].assign([9, 8, 7, 6])
  assert path.read_bytes()[:4] == bytes([9, 8, 7, 6])

def test_copy_from_cpu_to_a_new_file(tmp_path):
  path = tmp_path / "copy.bin"
  values = np.arange(6, dtype=np.int32)
  d = Tensor(values).to(f"disk:{path}").realize()
  assert path.read_bytes() == values.tobytes()
  np.testing.assert_array_equal(d.to("CPU").numpy(), values)

def test_views_of_a_copy_not_written_yet_write_the_file_first(tmp_path):
  # the view is read from the file, which the copy writes first (tinygrad); it once became a DISK kernel
  values = np.arange(12, dtype=np.float32)
  x = Tensor(values).realize()
  path = tmp_path / "view.bin"
  np.testing.assert_array_equal(x.to(f"disk:{path}")[0:2].numpy(), values[0:2])
  assert path.read_bytes() == values.tobytes()
  d = x.to(f"disk:{path}")
  np.testing.assert_array_equal(d.reshape(3, 4)[1].to("CPU").numpy(), values.reshape(3, 4)[1])
  np.testing.assert_array_equal((d[2:5].to("CPU") * 2).numpy(), values[2:5] * 2)
  np.testing.assert_array_equal(d.contiguous().numpy(), values)
  # the copy and a view of it realized together; then again with other values (the schedule cache must not serve
  # the first file's window)
  whole, window = d, d[6:9]
  Tensor.realize(whole, window)
  np.testing.assert_array_equal(window.numpy(), values[6:9])
  np.testing.assert_array_equal(whole.numpy(), values)
  for k in range(2):
    other = Tensor(values + 100 * (k + 1)).realize()
    np.testing.assert_array_equal(other.to(f"disk:{path}")[6:9].numpy(), values[6:9] + 100 * (k + 1))
  # a bitcast view, and a copy of a view into a second file
  np.testing.assert_array_equal(x.to(f"disk:{path}")[1:3].bitcast(dtypes.int32).numpy(), values[1:3].view(np.int32))
  second = tmp_path / "second.bin"
  np.testing.assert_array_equal(x.to(f"disk:{path}")[4:8].to(f"disk:{second}")[1:3].numpy(), values[5:7])
  assert second.read_bytes() == values[4:8].tobytes()

def test_ops_on_a_copy_not_written_yet_raise_naming_the_op(tmp_path):
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  with pytest.raises(RuntimeError, match=r"DISK tensors support only.*add"):
    (x.to(f"disk:{tmp_path / 'add.bin'}") + 1).numpy()
  with pytest.raises(RuntimeError, match=r"DISK tensors support only.*pad"):   # a step slice pads, then shrinks
    x.to(f"disk:{tmp_path / 'step.bin'}")[::2].numpy()
  with pytest.raises(RuntimeError, match=r"DISK tensors support only"):   # codegen's first question to a renderer
    Device[f"DISK:{tmp_path / 'add.bin'}"].renderer.target

def test_other_ops_raise_naming_the_op(tmp_path):
  t = Tensor(_file(tmp_path, bytes(8)))
  with pytest.raises(RuntimeError, match=r"DISK tensors support only.*add.*\.to\('CPU'\)"):
    (t + 1).realize()
  with pytest.raises(RuntimeError, match=r"DISK tensors support only.*cast"):
    t.float().to("CPU").numpy()
  with pytest.raises(RuntimeError, match=r"DISK tensors support only.*sum"):
    t.sum().numpy()
  with pytest.raises(RuntimeError, match=r"not one contiguous byte range"):
    t.reshape(2, 4)[:, 1:3].to("CPU").numpy()

def test_read_only_file_reads_and_refuses_writes(tmp_path):
  path = _file(tmp_path, bytes(range(4)))
  os.chmod(path, 0o444)
  try:
    if os.access(path, os.W_OK): pytest.skip("running as a user who can write read-only files (root)")
    t = Tensor(path)
    assert t.numpy().tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="read-only"):
      t.assign(Tensor(np.zeros(4, np.uint8)))
  finally: os.chmod(path, 0o644)

def test_missing_file_raises(tmp_path):
  with pytest.raises(ValueError, match="cannot open file"):
    Tensor(tmp_path / "nope.bin")

def test_sparse_file_larger_than_ram_opens_lazily(tmp_path):
  path = tmp_path / "big.bin"
  size = 4 << 30   # 4 GB, sparse: truncate allocates nothing
  with open(path, "wb") as f:
    f.truncate(size - 8)
    f.seek(size - 8)
    f.write(np.array([1.25, -3.5], dtype=np.float32).tobytes())
  t = Tensor(path)
  assert t.shape == (size,)
  tail = t[size - 8:].bitcast(dtypes.float32)
  assert tail.to("CPU").numpy().tolist() == [1.25, -3.5]
  assert t[size // 2:size // 2 + 4].numpy().tolist() == [0, 0, 0, 0]

def test_rewritten_file_is_seen(tmp_path):
  path = _file(tmp_path, b"\x01\x02")
  assert Tensor(path).numpy().tolist() == [1, 2]
  os.remove(path)
  _file(tmp_path, b"\x03\x04")   # a new file of the same size at the same path
  assert Tensor(path).numpy().tolist() == [3, 4]
