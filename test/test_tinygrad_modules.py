"""The names tinygrad scripts import from tinygrad.helpers, tinygrad.dtype, tinygrad.device and tinygrad.tensor exist in
kiln's modules of the same names and behave as tinygrad documents, checked against Python, NumPy and PyTorch."""
import ctypes, io, math, os, pathlib, pickle, struct, tempfile
import numpy as np
import pytest
import torch
from kiln import helpers
from kiln.helpers import (Context, Timing, Profiling, temp, fetch, prod, all_same, all_int, dedup, flatten, fully_flatten,
                          argsort, argfix, colored, ansistrip, ansilen, tqdm, trange, round_up, round_down, ceildiv, cdiv,
                          cmod, mv_address, to_mv, from_mv, flat_mv, merge_dicts, partition, get_single_element, get_child,
                          make_tuple, getbits, i2u, data64, data64_le, lo32, hi32, polyN, pluralize, word_wrap,
                          to_function_name, time_to_str, strip_parens, diskcache, diskcache_get, diskcache_put, LazySeq,
                          init_c_struct_t, to_char_p_p, wait_cond, is_numpy_ndarray, Metadata)
from kiln.dtype import (DType, PtrDType, AddrSpace, dtypes, DTYPES_DICT, INVERSE_DTYPES_DICT, least_upper_dtype,
                        least_upper_float, to_dtype, truncate, truncate_fp16, truncate_bf16, fp8_to_float, float_to_fp8,
                        can_safe_cast, _to_np_dtype, _from_np_dtype, _to_torch_dtype, _from_torch_dtype)

# ---- tinygrad.helpers ----

def test_sequence_helpers():
  assert prod([2, 3, 4]) == 24 and prod([]) == 1
  assert all_same([1, 1, 1]) and not all_same([1, 2]) and all_same([])
  assert all_int((1, 2, 3)) and not all_int((1, 2.0))
  assert dedup([3, 1, 3, 2, 1]) == [3, 1, 2]
  assert flatten([[1, 2], [3], []]) == [1, 2, 3]
  assert fully_flatten([[1, [2, 3]], np.array([[4, 5]]), np.float32(6)]) == [1, 2, 3, 4, 5, 6]
  xs = [30, 10, 20]
  assert argsort(xs) == list(np.argsort(xs)) and argsort(tuple(xs)) == (1, 2, 0)
  assert argfix(1, 2) == (1, 2) and argfix((1, 2)) == (1, 2) and argfix([3]) == (3,)
  with pytest.raises(ValueError): argfix((1, 2), 3)
  assert make_tuple(3, 2) == (3, 3) and make_tuple([1, 2], 2) == (1, 2)
  assert merge_dicts([{"a": 1}, {"b": 2}, {"a": 1}]) == {"a": 1, "b": 2}
  with pytest.raises(ValueError): merge_dicts([{"a": 1}, {"a": 2}])
  assert partition(range(6), lambda x: x % 2 == 0) == ([0, 2, 4], [1, 3, 5])
  assert get_single_element([7]) == 7
  with pytest.raises(ValueError): get_single_element([1, 2])
  model = {"layers": [type("L", (), {"weight": 5})()]}
  assert get_child(model, "layers.0.weight") == 5
  seq = LazySeq(lambda i: i * i)
  assert seq[12] == 144

@pytest.mark.parametrize("x,y", [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (6, 3), (-6, 4)])
def test_integer_helpers_against_torch(x, y):
  assert cdiv(x, y) == int(torch.div(torch.tensor(x), y, rounding_mode="trunc"))
  assert cmod(x, y) == int(torch.fmod(torch.tensor(x), y))
  assert ceildiv(x, y) == math.ceil(x / y)
  assert round_up(abs(x), abs(y)) == -(-abs(x) // abs(y)) * abs(y)
  assert round_down(x, abs(y)) == (x // abs(y)) * abs(y)

def test_bit_helpers():
  assert cdiv(5, 0) == 0 and ceildiv(7.0, 2) == 4 and isinstance(ceildiv(7.0, 2), int)
  value = 0x1234_5678_9ABC_DEF0
  assert data64(value) == (0x12345678, 0x9ABCDEF0) and data64_le(value) == (0x9ABCDEF0, 0x12345678)
  assert (hi32(value), lo32(value)) == data64(value)
  assert getbits(0b1011_0110, 2, 5) == 0b1101
  assert i2u(8, -1) == 255 and i2u(16, -2) == int(np.array(-2, np.int16).view(np.uint16)) and i2u(8, 5) == 5

def test_text_helpers():
  assert colored("x", "red") == "\x1b[31mx\x1b[0m" and colored("x", "GREEN") == "\x1b[92mx\x1b[0m"
  assert colored("x", "blue", background=True) == "\x1b[44mx\x1b[0m" and colored("x", None) == "x"
  text = colored("abc", "cyan") + "de"
  assert ansistrip(text) == "abcde" and ansilen(text) == 5
  assert word_wrap("a" * 10, 4) == "aaaa\naaaa\naa"
  assert pluralize("kernel", 1) == "1 kernel" and pluralize("kernel", 3) == "3 kernels"
  assert to_function_name("r_4_4") == "r_4_4" and to_function_name("a-b.c") == "a2Db2Ec"
  assert to_function_name(colored("E_2", "red")) == "E_2"
  assert time_to_str(20.0) == "   20.00s " and time_to_str(0.5) == "  500.00ms" and time_to_str(2e-3) == " 2000.00us"
  assert strip_parens("(a+b)") == "a+b" and strip_parens("(a)+(b)") == "(a)+(b)"
  assert polyN(2.0, [1.0, 0.0, -3.0]) == 1.0   # x**2 - 3
  assert is_numpy_ndarray(np.zeros(2)) and not is_numpy_ndarray([0, 0])
  assert str(Metadata("add", "train.py:3", backward=True)) == "add bw"
  assert repr(Metadata("add", "train.py:3")) == "add - train.py:3"
  assert helpers.colorize_float(0.5) == colored("   0.50x", "green") and "\x1b[31m" in helpers.colorize_float(2.0)
  assert helpers.fromimport("os.path", "join") is os.path.join

def test_suppress_finalizing_and_init_c_var():
  @helpers.suppress_finalizing
  def broken(): raise AttributeError("x")
  with pytest.raises(AttributeError): broken()   # the interpreter is not shutting down: the error stands
  def fill(v: ctypes.c_int) -> None: ctypes.memmove(ctypes.addressof(v), struct.pack("i", 7), 4)   # a C out-parameter
  assert helpers.init_c_var(ctypes.c_int(0), fill).value == 7

def test_platform_flags_and_temp():
  assert helpers.OSX == (os.uname().sysname == "Darwin")
  assert helpers.CI == (os.getenv("CI", "") != "")
  assert temp("kiln_x") == (pathlib.Path(tempfile.gettempdir()) / "kiln_x").as_posix()
  assert temp("kiln_x", append_user=True).startswith(temp("kiln_x") + ".")

def test_timing_prints_milliseconds(capsys):
  with Timing("step ", on_exit=lambda ns: f" ({ns} ns)") as timing: sum(range(1000))
  out = capsys.readouterr().out
  assert out.startswith("step ") and " ms (" in out and timing.et > 0
  @Timing("fn ", enabled=False)
  def quiet(): return 3
  assert quiet() == 3 and capsys.readouterr().out == ""

def test_profiling_prints_the_hot_functions(capsys, tmp_path):
  def busy(): return sum(i * i for i in range(20000))
  with Profiling(frac=1.0, fn=str(tmp_path / "stats")): busy()
  out = capsys.readouterr().out
  assert "busy" in out and "tm:" in out and (tmp_path / "stats").exists()

def test_ctypes_helpers():
  data = bytearray(b"kiln")
  view = to_mv(mv_address(data), len(data))
  assert bytes(view) == b"kiln"
  view[0] = ord("K")
  assert data == bytearray(b"Kiln")   # shared memory, no copy
  arr = from_mv(memoryview(data))
  assert bytes(arr) == b"Kiln"
  assert flat_mv(memoryview(np.zeros((2, 3), np.float32))).nbytes == 24 and flat_mv(memoryview(b"")).nbytes == 0
  assert mv_address(np.zeros(4, np.uint8)) != 0
  pair = init_c_struct_t((("a", ctypes.c_uint8), ("b", ctypes.c_uint32)))
  assert ctypes.sizeof(pair) == 5 and init_c_struct_t((("a", ctypes.c_uint8), ("b", ctypes.c_uint32))) is pair
  strings = to_char_p_p([b"ab", b"cde"])
  assert ctypes.string_at(strings[1]) == b"cde"
  assert wait_cond(lambda: 5, 5) == 5
  with pytest.raises(TimeoutError): wait_cond(lambda: 0, 1, timeout_ms=5)

def test_diskcache_round_trip(tmp_path, monkeypatch):
  monkeypatch.setattr(helpers, "_db_connection", None)
  monkeypatch.setattr(helpers, "_db_tables", set())
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert diskcache_get("kiln_test", "k") is None
  diskcache_put("kiln_test", {"a": 1, "b": "x"}, [1, 2])
  assert diskcache_get("kiln_test", {"a": 1, "b": "x"}) == [1, 2]
  calls = []
  @diskcache
  def square(x): calls.append(x); return x * x
  assert square(4) == 16 and square(4) == 16 and calls == [4]
  with Context(CACHELEVEL=0): assert diskcache_get("kiln_test", {"a": 1, "b": "x"}) is None
  helpers.diskcache_clear()
  assert diskcache_get("kiln_test", {"a": 1, "b": "x"}) is None and square(4) == 16 and calls == [4, 4]
  helpers.db_connection().close()

def test_fetch_local_files_and_file_urls_without_a_network(tmp_path):
  source = tmp_path / "weights.bin"
  source.write_bytes(b"\x01\x02")
  assert fetch(str(source)) == source   # a local path is returned as it is
  assert fetch(source.as_uri(), name=tmp_path / "copy.bin").read_bytes() == b"\x01\x02"
  with pytest.raises(RuntimeError, match="no file"): fetch(str(tmp_path / "missing.bin"))
  with pytest.raises(RuntimeError, match="could not download"):
    fetch((tmp_path / "missing.bin").as_uri(), name=tmp_path / "never.bin")

def test_tqdm_takes_tinygrad_arguments():
  out = io.StringIO()
  bar = tqdm(None, "load", False, "B", True, 2000, file=out)   # tinygrad's positional order
  assert (bar.desc, bar.disable, bar.unit, bar.unit_scale, bar.total) == ("load", False, "B", True, 2000)
  bar.update(1000)
  bar.update()   # n defaults to 0 as in tinygrad: a redraw
  assert bar.count == 1000
  bar.close()
  assert list(trange(3, file=out)) == [0, 1, 2] and isinstance(trange(2), tqdm)

# ---- tinygrad.dtype ----

def test_dtype_introspection():
  assert dtypes.float32.scalar() is dtypes.float32 and dtypes.half.vec(4).scalar() is dtypes.half
  assert dtypes.float32.base is dtypes.float32 and dtypes.int8.vcount == 1 and dtypes.half.vec(4).vcount == 4
  with pytest.raises(RuntimeError): dtypes.float32.nbytes()
  ptr = dtypes.float32.ptr(16)
  assert isinstance(ptr, PtrDType) and ptr is dtypes.float32.ptr(16) and ptr.base is dtypes.float32
  assert ptr.nbytes() == 64 and ptr.size == 16 and ptr.addrspace is AddrSpace.GLOBAL and dtypes.int8.ptr().nbytes() == 0
  assert repr(ptr) == "dtypes.float.ptr(16)" and pickle.loads(pickle.dumps(ptr)) is ptr
  assert dtypes.half.ptr(4, AddrSpace.LOCAL).addrspace is AddrSpace.LOCAL
  with pytest.raises(RuntimeError): ptr.ptr()
  custom = DType.new(20, 4, "custom", None)
  assert (custom.itemsize, custom.count, custom.scalar()) == (4, 1, custom)

def test_dtype_tables():
  assert DTYPES_DICT["float32"] is dtypes.float32 and DTYPES_DICT["half"] is dtypes.float16 and "void" not in DTYPES_DICT
  assert INVERSE_DTYPES_DICT["float"] == "float" and INVERSE_DTYPES_DICT["void"] == "void"
  assert dtypes.fields() == DTYPES_DICT
  assert to_dtype("float16") is dtypes.float16 and to_dtype(dtypes.int8) is dtypes.int8

@pytest.mark.parametrize("a,b", [("int8", "uint8"), ("int32", "float16"), ("bool", "int64"), ("uint8", "int16"),
                                 ("float16", "bfloat16"), ("int64", "float32")])
def test_least_upper_dtype_matches_torch(a, b):
  assert least_upper_dtype(DTYPES_DICT[a], DTYPES_DICT[b]) == _from_torch_dtype(torch.promote_types(getattr(torch, a),
                                                                                                     getattr(torch, b)))

def test_least_upper_float():
  assert least_upper_float(dtypes.int32) is dtypes.default_float and least_upper_float(dtypes.half) is dtypes.half
  assert least_upper_float(dtypes.bool) is dtypes.default_float

@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
                                dtypes.uint32, dtypes.int64, dtypes.float16, dtypes.float32, dtypes.float64])
def test_numpy_and_torch_dtype_round_trip(dt):
  assert _to_np_dtype(dt) is np.dtype(dt.fmt).type and _from_np_dtype(_to_np_dtype(dt)) is dt
  assert _from_np_dtype(np.dtype(_to_np_dtype(dt))) is dt
  assert _from_torch_dtype(_to_torch_dtype(dt)) is dt
  assert _to_torch_dtype(dt) == torch.from_numpy(np.zeros(1, _to_np_dtype(dt))).dtype

def test_dtypes_numpy_lacks():
  assert _to_np_dtype(dtypes.bfloat16) is None and _to_np_dtype(dtypes.fp8e4m3) is None
  assert _to_torch_dtype(dtypes.bfloat16) == torch.bfloat16 and _to_torch_dtype(dtypes.fp8e5m2) == torch.float8_e5m2

def test_can_safe_cast_agrees_with_numpy():
  for a in (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
            dtypes.int64, dtypes.float16, dtypes.float32, dtypes.float64):
    for b in (dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64, dtypes.float32, dtypes.float64):
      # numpy allows int -> float casts that lose bits of large ints; tinygrad's table does not
      if dtypes.is_int(a) and dtypes.is_float(b): continue
      assert can_safe_cast(a, b) == np.can_cast(_to_np_dtype(a), _to_np_dtype(b), "safe"), (a, b)

@pytest.mark.parametrize("x", [0.1, 1 / 3, -2.5, 65504.0, 65520.0, 1e6, -1e-8, 6e-8])
def test_truncate_fp16_matches_numpy(x):
  with np.errstate(over="ignore"): assert truncate_fp16(x) == float(np.float16(x))
  assert truncate[dtypes.float16](x) == float(np.float16(x)) if abs(x) < 65520 else math.isinf(truncate_fp16(x))

@pytest.mark.parametrize("x", [0.1, 1 / 3, -2.5, 3.0e38, 1e-30, -7.0])
def test_truncate_bf16_cuts_the_low_bits(x):
  # tinygrad's truncate_bf16 drops the low 16 bits of the float32 (toward zero); torch rounds to nearest
  bits = struct.unpack("I", struct.pack("f", x))[0] & 0xFFFF0000
  assert truncate_bf16(x) == struct.unpack("f", struct.pack("I", bits))[0]
  assert abs(truncate_bf16(x)) <= abs(float(torch.tensor(x, dtype=torch.float32)))
  assert math.isinf(truncate_bf16(3.4e38))

def test_truncate_is_a_function_and_a_table():
  assert truncate(dtypes.int8, 200) == int(np.array(200).astype(np.int8)) == truncate[dtypes.int8](200)
  assert truncate[dtypes.uint16](-1) == 65535 and truncate[dtypes.float32](0.1) == float(np.float32(0.1))
  assert truncate[dtypes.bool](3) is True and dtypes.float64 in truncate
  with pytest.raises(KeyError): truncate[dtypes.void]

@pytest.mark.parametrize("dt,torch_dt", [(dtypes.fp8e4m3, torch.float8_e4m3fn), (dtypes.fp8e5m2, torch.float8_e5m2)])
def test_fp8_conversions_match_torch(dt, torch_dt):
  xs = torch.tensor([0.0, -0.0, 0.1, -1.75, 3.3, 100.0, 240.0, 1e-3, 2e-2, -447.0, 1e4, float("nan")])
  want_bits = xs.to(torch_dt).view(torch.uint8).tolist()
  for x, bits in zip(xs.tolist(), want_bits):
    if abs(x) > 448 and dt == dtypes.fp8e4m3: bits = 0x7E | (0x80 if x < 0 else 0)   # saturates, as tinygrad
    if math.isnan(x): assert math.isnan(fp8_to_float(float_to_fp8(x, dt), dt)); continue
    assert float_to_fp8(x, dt) == bits, (x, dt)
  for bits in range(256):
    want = torch.tensor([bits], dtype=torch.uint8).view(torch_dt).float().item()
    got = fp8_to_float(bits, dt)
    assert (math.isnan(got) and math.isnan(want)) or got == want, (bits, got, want)
  assert float_to_fp8(float("inf"), dt) == (0x7E if dt == dtypes.fp8e4m3 else 0x7B)   # +inf saturates to +max
  with pytest.raises(ValueError): float_to_fp8(1.0, dtypes.float16)

# ---- tinygrad.device and tinygrad.tensor ----

def test_device_module():
  from kiln.device import Device, is_dtype_supported, ALL_DEVICES, Buffer, Compiled, Compiler, Allocator, LRUAllocator
  assert "CPU" in ALL_DEVICES and Device.DEFAULT in Device.known()
  assert all(is_dtype_supported(dt) for dt in dtypes.all) and not is_dtype_supported(dtypes.void)
  assert is_dtype_supported(dtypes.bfloat16, "PYTHON")
  with pytest.raises(ValueError): is_dtype_supported(dtypes.float32, "NOSUCHDEVICE")
  assert issubclass(LRUAllocator, Allocator) and Buffer and Compiled and Compiler

def test_tensor_module_reexports():
  import kiln.tensor as tensor_module
  from kiln.device import Device
  from kiln.uop.ops import Variable
  assert tensor_module.Device is Device and tensor_module.dtypes is dtypes and tensor_module.Variable is Variable
  assert tensor_module._to_np_dtype(dtypes.float32) is np.float32 and tensor_module._from_np_dtype(np.int8) is dtypes.int8
  assert tensor_module.fetch is fetch
  import kiln
  assert kiln.fetch is fetch

# ---- tinygrad.nn.state ----

def test_accept_filename_and_safe_dtype_tables(tmp_path):
  from kiln import Tensor
  from kiln.nn.state import accept_filename, safe_dtypes, inverse_safe_dtypes, safe_save
  @accept_filename
  def first_byte(t: Tensor) -> int: return int(t[0].item())
  path = tmp_path / "blob.bin"
  path.write_bytes(bytes([9, 8, 7]))
  assert first_byte(str(path)) == 9 and first_byte(path) == 9
  assert first_byte(Tensor(bytes([5]))) == 5   # a Tensor goes through as it is
  assert safe_dtypes["F32"] is dtypes.float32 and safe_dtypes["BF16"] is dtypes.bfloat16
  assert safe_dtypes["BOOL"] is dtypes.bool
  assert all(inverse_safe_dtypes[dt] == name for name, dt in safe_dtypes.items())
  safe_save({"w": Tensor([1, 2], dtype=dtypes.int16)}, tmp_path / "w.safetensors")
  header = (tmp_path / "w.safetensors").read_bytes()
  assert b'"dtype":"I16"' in header.replace(b" ", b"") and inverse_safe_dtypes[dtypes.int16] == "I16"

# ---- DEFAULT_FLOAT ----

def test_default_float_from_the_environment():
  import subprocess, sys
  code = "from kiln import Tensor, dtypes; print(dtypes.default_float, Tensor([1.5]).dtype, Tensor.rand(2).dtype)"
  run = lambda value: subprocess.run([sys.executable, "-c", code], env={**os.environ, "DEFAULT_FLOAT": value},
                                     capture_output=True, text=True)
  assert run("HALF").stdout.split() == ["dtypes.half"] * 3
  assert run("bfloat16").stdout.split() == ["dtypes.bfloat16"] * 3
  failed = run("INT32")
  assert failed.returncode != 0 and "DEFAULT_FLOAT=INT32 is not a float dtype" in failed.stderr

@pytest.mark.parametrize("default", [dtypes.bfloat16, dtypes.float16, dtypes.fp8e4m3])
def test_lists_of_floats_take_the_default_float(default):
  from kiln import Tensor
  saved = dtypes.default_float
  try:
    dtypes.default_float = default
    t = Tensor([[1.5, -2.0], [0.25, 3.0]])
    assert t.dtype is default and Tensor([1, 2]).dtype is dtypes.int32
    np.testing.assert_array_equal(t.float().numpy(), torch.tensor([[1.5, -2.0], [0.25, 3.0]]).numpy())
  finally:
    dtypes.default_float = saved

def test_device_registry_default_and_available_devices():
  from kiln.device import Device
  assert Device.default is Device[Device.DEFAULT]
  available = list(Device.get_available_devices())
  assert Device.DEFAULT in available and "PYTHON" in available and set(available) <= set(Device.known())
  assert Device.canonicalize(device="cpu:0") == "CPU"

def test_buffer_members():
  from kiln.device import Buffer
  from kiln.helpers import GlobalCounters
  data = np.arange(6, dtype=np.float32)
  buf = Buffer("CPU", 6, dtypes.float32, initial_value=data.tobytes())
  assert bytes(buf.as_buffer()) == data.tobytes() and buf.as_typed_buffer((2, 3)).tolist() == data.reshape(2, 3).tolist()
  shared = buf.as_buffer(allow_zero_copy=True)
  shared[:4] = struct.pack("f", 9.0)
  assert buf.numpy()[0] == 9.0   # no copy: the memory itself
  assert bytes(buf.as_buffer(force_zero_copy=True)) == bytes(shared)
  view = buf.view(2, dtypes.float32, 8)   # tinygrad's order: size, dtype, byte offset
  assert view.base is buf and buf.base is buf and view.numpy().tolist() == [2.0, 3.0]
  with pytest.raises(TypeError): Buffer("CPU", 2, dtypes.bfloat16).ensure_allocated().as_typed_buffer()
  used = GlobalCounters.mem_used
  buf.deallocate()
  assert not buf.is_allocated() and not buf.is_initialized() and GlobalCounters.mem_used == used - buf.nbytes
  assert buf.ensure_allocated().is_initialized()
  with pytest.raises(RuntimeError): Buffer("CPU", 2, dtypes.float32).deallocate()
