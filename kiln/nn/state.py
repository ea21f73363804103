"""Model state: find a model's Tensors by attribute path ("l1.weight"), load new values into them, and read and
write weight files: safetensors (`safe_load`, `safe_save`), PyTorch checkpoints (`torch_load`), tar archives
(`tar_extract`) and GGUF (`gguf_load`, kiln/nn/gguf.py).

Loaded tensors are views of the file on the DISK device: nothing is read until a tensor is used, and then only its
bytes (see docs/state.md).
"""
from __future__ import annotations
import builtins, functools, io, json, os, pathlib, pickle, struct, tarfile, time, types, weakref, zipfile
from collections import OrderedDict
from typing import Any, Callable
from kiln.tensor import Tensor
from kiln.dtype import DType, dtypes
from kiln.device import Device
from kiln.helpers import DEBUG, prod
from kiln.nn.gguf import gguf_load, ggml_data_to_tensor  # noqa: F401  (tinygrad's nn.state names; kiln/nn/gguf.py)

# ---------------- state dicts ----------------
# the key each Tensor had in the latest get_state_dict that found it, for error messages (an optimizer's "parameter
# 'layers.0.weight' has no gradient"): id -> (weak reference, key); not a WeakKeyDictionary, which would compare
# Tensors with their elementwise ==
_state_dict_keys: dict[int, tuple[weakref.ref, str]] = {}

def state_dict_key(t: Tensor) -> str | None:
  """The key `t` had in the latest `get_state_dict` that reached it, or None."""
  ref, key = _state_dict_keys.get(id(t), (None, None))
  return key if ref is not None and ref() is t else None

def _remember_key(t: Tensor, key: str) -> None:
  ident = id(t)
  def forget(ref: weakref.ref) -> None:
    if _state_dict_keys.get(ident, (None,))[0] is ref: del _state_dict_keys[ident]   # not a newer tensor's entry
  _state_dict_keys[ident] = (weakref.ref(t, forget), key)

def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """Every `tensor_type` instance reachable from `obj` through attributes, lists, tuples, dicts (OrderedDict and
  other dict subclasses too) and namedtuples, keyed by its path (`obj` may be a Tensor itself: its key is `prefix`).

  Keys join attribute names, list indices and dict keys with dots: a model with `self.layers = [Linear(2, 3)]` gives
  `{"layers.0.weight": ..., "layers.0.bias": ...}`. A Tensor or a layer reachable by two paths (tied weights, a
  shared block) gets both keys, as in tinygrad; a reference cycle is followed once (an object is not walked again
  inside itself).
  """
  state: dict[str, Tensor] = {}
  # explicit stack instead of recursion: deeply nested models don't hit the recursion limit. Each entry carries the
  # ids of the objects it lies inside, to stop at a cycle without skipping an object shared by two paths
  stack: list[tuple[Any, str, frozenset[int]]] = [(obj, prefix, frozenset())]
  while stack:
    node, path, inside = stack.pop()
    if isinstance(node, tensor_type):
      key = path.strip(".")
      if state.setdefault(key, node) is node and key: _remember_key(node, key)
      continue
    if id(node) in inside or isinstance(node, (str, bytes, int, float, bool, type, types.ModuleType)) or node is None:
      continue
    inside = inside | {id(node)}
    children: list[tuple[Any, str]] = []
    if hasattr(node, "_asdict"):  # namedtuple
      children = [(value, f"{path}{key}.") for key, value in node._asdict().items()]
    elif isinstance(node, (dict, OrderedDict)):
      children = [(value, f"{path}{key}.") for key, value in node.items()]
    elif isinstance(node, (list, tuple)):
      children = [(value, f"{path}{index}.") for index, value in enumerate(node)]
    elif isinstance(getattr(node, "__dict__", None), dict):
      children = [(value, f"{path}{key}.") for key, value in node.__dict__.items()]
    # pushed in reverse so the stack pops them in declaration order
    stack.extend((child, child_path, inside) for child, child_path in reversed(children))
  return state

def get_parameters(obj: Any) -> list[Tensor]:
  """The distinct Tensors of `get_state_dict(obj)`, in the same order (the list to hand to an optimizer; a tied
  weight is listed once, where tinygrad lists it once per path)."""
  by_id: dict[int, Tensor] = {}
  for t in get_state_dict(obj).values(): by_id.setdefault(id(t), t)
  return list(by_id.values())

def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = True,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
  """Replace the value of each Tensor of `model` with `state_dict[key]`, matched by `get_state_dict` key, and return
  the model's tensors that were loaded.

  With `strict=True` a key of the model that is missing from `state_dict` raises KeyError; a shape or dtype mismatch
  always raises ValueError. Both name the key; a one-element value fits a one-element tensor of any shape
  (tinygrad keeps BatchNorm's `num_batches_tracked` as shape (1,), PyTorch and kiln as ()). Keys of `state_dict` that
  the model doesn't have are ignored (listed when DEBUG>=1). Values are moved to the model tensor's device (a DISK
  state dict is read from the file here); a model tensor on DISK gets the bytes written through to its file. `consume=True` removes each loaded key from
  `state_dict` (so its memory can go); `verbose` prints one line with the count, size and time.
  """
  start = time.perf_counter()
  model_state = get_state_dict(model)
  missing = [key for key in model_state if key not in state_dict]
  if strict and missing:
    raise KeyError(f"load_state_dict: key {missing[0]!r} of the model is missing from the state dict "
                   f"({len(missing)} missing in all: {missing[:10]}); pass strict=False to skip missing keys")
  unused = sorted(set(state_dict) - set(model_state))
  if unused and DEBUG >= 1: print(f"load_state_dict: unused keys in the state dict: {unused}")
  loaded: list[Tensor] = []
  for key, target in model_state.items():
    if key not in state_dict:
      if DEBUG >= 1: print(f"load_state_dict: not loading {key!r} (missing from the state dict)")
      continue
    source = state_dict[key]
    if not isinstance(source, Tensor): source = Tensor(source)
    if tuple(source.shape) != tuple(target.shape) and source.numel() == target.numel() == 1:
      source = source.reshape(target.shape)
    if tuple(source.shape) != tuple(target.shape):
      raise ValueError(f"load_state_dict: shape mismatch for key {key!r}: the model has {tuple(target.shape)}, "
                       f"the state dict has {tuple(source.shape)}")
    if source.dtype != target.dtype:
      raise ValueError(f"load_state_dict: dtype mismatch for key {key!r}: the model has {target.dtype.name}, "
                       f"the state dict has {source.dtype.name}; cast it first (state_dict[{key!r}].cast(...))")
    if type(target.device) is str and target.device.startswith("DISK"): target.assign(source)   # a file: write through
    else:
      if source.device != target.device:
        if type(target.device) is tuple:   # a parameter over several devices keeps its layout
          source = source.to(source.device[0]) if type(source.device) is tuple else source
          source = source.shard(target.device, target.uop.axis)
        else: source = source.to(target.device)
      target.replace(source)
    if realize: target.realize()
    if consume: del state_dict[key]
    loaded.append(target)
  if verbose:
    elapsed = time.perf_counter() - start
    # the loaded tensors' own size: the change in memory use is not it (replaced buffers are freed meanwhile)
    size_mb = sum(tensor.nbytes() for tensor in loaded) / 1e6
    print(f"loaded {len(loaded)} tensors ({size_mb:.2f} MB) in {elapsed * 1e3:.1f} ms")
  return loaded

# ---------------- file access ----------------

def _file_tensor(fn: Tensor | str | os.PathLike, op: str) -> Tensor:
  """`fn` as a flat uint8 Tensor: a file path becomes a lazy DISK tensor of the file's bytes."""
  if isinstance(fn, Tensor):
    if fn.dtype != dtypes.uint8 or fn.ndim != 1:
      raise TypeError(f"{op}: expected a path or a 1-d uint8 Tensor, got a Tensor of shape {fn.shape} {fn.dtype}")
    return fn
  if not isinstance(fn, (str, os.PathLike)):
    raise TypeError(f"{op}: expected a path or a Tensor, got {type(fn).__name__}")
  path = pathlib.Path(fn)
  if not path.is_file(): raise ValueError(f"{op}: no such file {str(path)!r}")
  return Tensor(path)

def accept_filename(func: Callable[[Tensor], Any]) -> Callable[[Tensor | str | os.PathLike], Any]:
  """`func` (which reads a uint8 Tensor of a file's bytes) made to accept a file path as well."""
  @functools.wraps(func)
  def wrapper(fn: Tensor | str | os.PathLike) -> Any:
    return func(fn if isinstance(fn, Tensor) else _file_tensor(fn, func.__name__))
  return wrapper

def _name(t: Tensor) -> str:
  """The file a tensor reads, for error messages."""
  if t.device.startswith("DISK"): return repr(t.device.partition(":")[2])
  return f"<{t.device} tensor of {t.numel()} bytes>"

class TensorIO(io.RawIOBase):
  """A read-only binary file object over the bytes of a 1-d uint8 Tensor (seek, tell, readinto).

  A DISK tensor is read straight from its file mapping; another tensor is read once into host memory.

  >>> f = TensorIO(Tensor(b"hello world"))
  >>> f.read(5), f.seek(-5, 2), f.read()
  (b'hello', 6, b'world')
  """
  def __init__(self, t: Tensor):
    if not isinstance(t, Tensor) or t.dtype != dtypes.uint8 or t.ndim != 1:
      raise TypeError(f"TensorIO: expected a 1-d uint8 Tensor, got {t!r}")
    super().__init__()
    self._tensor, self._position, self._bytes = t, 0, None
  def _data(self) -> memoryview:
    if self._bytes is None:
      if self._tensor.device.startswith("DISK"):
        from kiln.runtime.ops_disk import byte_range
        found = byte_range(self._tensor.uop)
        if found is not None:
          buf, offset, nbytes = found
          view = buf.view(nbytes, dtypes.uint8, offset).allocate()
          self._bytes = view._allocator.as_memoryview(view._buf)
      if self._bytes is None: self._bytes = memoryview(self._tensor.to("CPU").numpy().tobytes())
    return self._bytes
  def readable(self) -> bool: return True
  def seekable(self) -> bool: return True
  def tell(self) -> int: return self._position
  def __len__(self) -> int: return self._tensor.shape[0]
  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    """Move to `offset` from the start (SEEK_SET), the current position (SEEK_CUR) or the end (SEEK_END)."""
    base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self)}.get(whence)
    if base is None: raise ValueError(f"TensorIO.seek: invalid whence {whence}")
    if base + offset < 0: raise ValueError(f"TensorIO.seek: negative position {base + offset}")
    self._position = base + offset
    return self._position
  def readinto(self, buffer) -> int:
    """Copy up to len(buffer) bytes from the current position into `buffer`; the number copied (0 at the end)."""
    out = memoryview(buffer).cast("B")
    chunk = self._data()[self._position:self._position + len(out)]
    out[:len(chunk)] = chunk
    self._position += len(chunk)
    return len(chunk)

# ---------------- tar ----------------

def tar_extract(fn: Tensor | str | os.PathLike) -> dict[str, Tensor]:
  """The regular files of a tar archive (a path or a 1-d uint8 Tensor), as name -> uint8 Tensor of the file's bytes.

  Each tensor is a slice of the archive's tensor (a lazy DISK view for a path): nothing is copied until it is used.
  Uncompressed archives only, as torch's legacy checkpoints are; the names are those the archive stores.
  """
  t = _file_tensor(fn, "tar_extract")
  try:
    with tarfile.open(fileobj=TensorIO(t), mode="r:") as archive:
      members = [m for m in archive.getmembers() if m.isfile()]
  except (tarfile.TarError, EOFError, ValueError) as e:
    raise ValueError(f"tar_extract: {_name(t)} is not an uncompressed tar archive ({e})") from None
  for m in members:
    if m.offset_data + m.size > t.shape[0]:
      raise ValueError(f"tar_extract: {_name(t)}: {m.name!r} ({m.size} bytes at offset {m.offset_data}) is truncated: "
                       f"the archive has {t.shape[0]} bytes")
  return {m.name: t[m.offset_data:m.offset_data + m.size] for m in members}

# ---------------- safetensors ----------------

SAFETENSORS_DTYPES: dict[str, DType] = {
  "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
  "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
  "U64": dtypes.uint64, "U32": dtypes.uint32, "U16": dtypes.uint16, "U8": dtypes.uint8, "BOOL": dtypes.bool,
  "F8_E4M3": dtypes.fp8e4m3, "F8_E5M2": dtypes.fp8e5m2}
_SAFETENSORS_NAME = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
safe_dtypes, inverse_safe_dtypes = SAFETENSORS_DTYPES, _SAFETENSORS_NAME   # tinygrad's names for the two tables
# a header this large is not a real file's (the safetensors package refuses more than 100 MB too)
MAX_HEADER_BYTES = 100_000_000

def safe_load_metadata(fn: Tensor | str | os.PathLike) -> tuple[Tensor, int, dict[str, Any]]:
  """The file's bytes as a uint8 Tensor, the JSON header's length and the parsed header (tensor entries and
  `__metadata__`). Raises ValueError naming the file when the header is cut short or not JSON."""
  t = _file_tensor(fn, "safe_load")
  size = t.shape[0]
  if size < 8: raise ValueError(f"safe_load: {_name(t)} has {size} bytes, too short for a safetensors header")
  json_len = struct.unpack("<Q", t[0:8].numpy().tobytes())[0]
  if json_len > size - 8 or json_len > MAX_HEADER_BYTES:
    raise ValueError(f"safe_load: {_name(t)}: the header claims {json_len} bytes but the file has {size - 8} after "
                     f"the length (truncated, or not a safetensors file)")
  try: header = json.loads(t[8:8 + json_len].numpy().tobytes().decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"safe_load: {_name(t)}: the header is not valid JSON ({e})") from None
  if not isinstance(header, dict): raise ValueError(f"safe_load: {_name(t)}: the header is not a JSON object")
  return t, json_len, header

def _check_entry(name: str, entry: Any, data_size: int, where: str) -> tuple[DType, tuple[int, ...], int, int]:
  """(dtype, shape, begin, end) of one header entry, validated against the data section's size."""
  if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
    raise ValueError(f"safe_load: {where}: tensor {name!r} needs dtype, shape and data_offsets, got {entry!r}")
  dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
  if dtype is None:
    raise ValueError(f"safe_load: {where}: tensor {name!r} has unknown dtype {entry['dtype']!r} "
                     f"(known: {', '.join(SAFETENSORS_DTYPES)})")
  shape, offsets = entry["shape"], entry["data_offsets"]
  if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
    raise ValueError(f"safe_load: {where}: tensor {name!r} has an invalid shape {shape!r}")
  if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
    raise ValueError(f"safe_load: {where}: tensor {name!r} has invalid data_offsets {offsets!r}")
  begin, end = offsets
  if not 0 <= begin <= end <= data_size:
    raise ValueError(f"safe_load: {where}: tensor {name!r} has data_offsets [{begin}, {end}] outside the data section "
                     f"of {data_size} bytes (truncated file?)")
  if end - begin != prod(shape) * dtype.itemsize:
    raise ValueError(f"safe_load: {where}: tensor {name!r} of shape {tuple(shape)} {entry['dtype']} needs "
                     f"{prod(shape) * dtype.itemsize} bytes but data_offsets [{begin}, {end}] hold {end - begin}")
  return dtype, tuple(shape), begin, end

def safe_load(fn: Tensor | str | os.PathLike) -> dict[str, Tensor]:
  """The tensors of a safetensors file, by name, in the file's order. They are views of the file on the DISK device:
  each is read (only its own bytes) when it is used or moved with `.to(device)`.

  Raises ValueError naming the file and the tensor when the file is truncated or its header is inconsistent
  (unknown dtype, offsets out of range, overlapping or the wrong size).
  """
  t, json_len, header = safe_load_metadata(fn)
  data_start = 8 + json_len
  data_size, where = t.shape[0] - data_start, _name(t)
  entries = {name: _check_entry(name, entry, data_size, where)
             for name, entry in header.items() if name != "__metadata__"}
  previous_end, previous_name = 0, None
  for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: (item[1][2], item[1][3])):
    if begin < previous_end:
      raise ValueError(f"safe_load: {where}: tensor {name!r} (bytes {begin}..{end}) overlaps tensor {previous_name!r} "
                       f"(ending at byte {previous_end})")
    if end > begin: previous_end, previous_name = end, name
  out: dict[str, Tensor] = {}
  for name, (dtype, shape, begin, end) in entries.items():
    raw = t[data_start + begin:data_start + end]
    out[name] = _bytes_as(raw, dtype, shape)
  return out

def _bytes_as(raw: Tensor, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  """The 1-d uint8 tensor `raw` read as `shape` elements of `dtype`."""
  return raw.bitcast(dtype).reshape(shape)

def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write `tensors` to the safetensors file `fn`: an 8-byte little-endian header length, a JSON header (dtype,
  shape and data_offsets of each tensor, and `metadata` as `__metadata__`), then the data, 8-byte aligned.

  >>> import tempfile, os
  >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
  >>> safe_save({"w": Tensor([[1.0, 2.0]])}, path, metadata={"format": "pt"})
  >>> safe_load(path)["w"].to("CPU").tolist()
  [[1.0, 2.0]]
  """
  if not isinstance(tensors, dict):
    raise TypeError(f"safe_save: expected a dict of Tensors, got {type(tensors).__name__}")
  if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                        for k, v in metadata.items())):
    raise TypeError(f"safe_save: metadata must be a dict of str to str, got {metadata!r}")
  header: dict[str, Any] = {}
  offset = 0
  for name, t in tensors.items():
    if not isinstance(name, str) or name == "__metadata__": raise ValueError(f"safe_save: invalid tensor name {name!r}")
    if not isinstance(t, Tensor): raise TypeError(f"safe_save: {name!r} is a {type(t).__name__}, not a Tensor")
    if t.dtype not in _SAFETENSORS_NAME: raise ValueError(f"safe_save: {name!r} has dtype {t.dtype.name}, which "
                                                           f"safetensors cannot store")
    header[name] = {"dtype": _SAFETENSORS_NAME[t.dtype], "shape": list(t.shape),
                    "data_offsets": [offset, offset + t.nbytes()]}
    offset += t.nbytes()
  if metadata: header["__metadata__"] = metadata
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)   # the data starts 8-byte aligned
  with open(fn, "wb") as f:
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for t in tensors.values():
      if t.numel(): f.write(_raw_bytes(t))

def _raw_bytes(t: Tensor) -> bytes:
  """The bytes of `t`'s elements in row-major order."""
  host = t.to("CPU") if type(t.device) is str and t.device.startswith("DISK") else t.contiguous().to("CPU")
  return host._buffer().as_bytes()

# ---------------- PyTorch checkpoints ----------------

# storage class names (torch.FloatStorage, ...) and dtype names (torch.float32, ...) of the dtypes kiln reads
_TORCH_STORAGE_DTYPES: dict[str, DType] = {
  "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16,
  "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
  "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool}
_TORCH_DTYPES: dict[str, DType] = {
  "float64": dtypes.float64, "float32": dtypes.float32, "float16": dtypes.float16, "bfloat16": dtypes.bfloat16,
  "int64": dtypes.int64, "int32": dtypes.int32, "int16": dtypes.int16, "int8": dtypes.int8, "uint8": dtypes.uint8,
  "bool": dtypes.bool}
# the first pickle of a legacy (non-zip) torch.save file
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c

class _Storage:
  """A torch storage being read: its dtype and, once the file says where its bytes are, a 1-d Tensor of them."""
  def __init__(self, key: str, dtype: DType, numel: int):
    self.key, self.dtype, self.numel = key, dtype, numel
    self.tensor: Tensor | None = None

class _Ignored:
  """Stands in for any global a checkpoint names that is not needed to rebuild tensors (nothing of it runs)."""
  def __init__(self, *args, **kwargs): pass
  def __call__(self, *args, **kwargs): return _Ignored()
  def __setstate__(self, state): pass

class _TorchUnpickler(pickle.Unpickler):
  """An unpickler that builds only containers, numbers, strings and tensors: every global outside the short list
  below becomes an inert `_Ignored`, so a checkpoint cannot run code."""
  def __init__(self, file, storage_of: Any, where: str):
    super().__init__(file, encoding="utf-8")
    self._storage_of, self._where = storage_of, where
    self.tensors: list[tuple[_Storage, Tensor | None, tuple]] = []

  def find_class(self, module: str, name: str) -> Any:
    if module == "collections" and name == "OrderedDict": return OrderedDict
    if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"): return self._rebuild_tensor
    if module == "torch._utils" and name == "_rebuild_parameter": return _rebuild_parameter
    if module == "torch._utils" and name == "_rebuild_parameter_with_state": return _rebuild_parameter
    if module == "torch._tensor" and name == "_rebuild_from_type_v2": return _rebuild_from_type
    if module == "torch" and name in _TORCH_STORAGE_DTYPES: return _TORCH_STORAGE_DTYPES[name]
    if module == "torch" and name in _TORCH_DTYPES: return _TORCH_DTYPES[name]
    if module == "torch" and name in ("Size",): return tuple
    if module == "builtins" and name in ("set", "frozenset", "slice", "complex"): return getattr(builtins, name)
    return _Ignored

  def persistent_load(self, pid: Any) -> Any:
    if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
      raise ValueError(f"torch_load: {self._where}: unsupported persistent id {pid!r}")
    storage_type, key = pid[1], str(pid[2])
    numel = pid[4] if len(pid) > 4 else None
    if not isinstance(storage_type, DType):
      raise ValueError(f"torch_load: {self._where}: storage {key} has a type kiln cannot read ({storage_type!r})")
    return self._storage_of(key, storage_type, numel)

  def _rebuild_tensor(self, storage: Any, offset: int, size: tuple, stride: tuple, *args) -> Tensor:
    if isinstance(storage, _TypedStorage): storage = storage.storage
    if not isinstance(storage, _Storage): raise ValueError(f"torch_load: {self._where}: a tensor without a storage")
    placeholder = Tensor.empty(0, device="CPU", dtype=storage.dtype)   # replaced once every storage's bytes are known
    self.tensors.append((storage, placeholder, (offset, tuple(size), tuple(stride))))
    return placeholder

class _TypedStorage:
  """`torch.storage.TypedStorage` as the zip format's persistent ids give it (dtype from the storage class)."""
  def __init__(self, storage: _Storage): self.storage = storage

def _rebuild_parameter(data: Any, *args) -> Any: return data
def _rebuild_from_type(func: Any, new_type: Any, args: tuple, state: Any) -> Any: return func(*args)

def _tensor_from_storage(storage: Tensor, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                         key: str, where: str) -> Tensor:
  """The tensor of `size` and `stride` that starts `offset` elements into `storage` (torch's as_strided)."""
  numel = prod(size)
  if numel == 0: return Tensor.empty(*size, device=Device.DEFAULT, dtype=storage.dtype)
  last = offset + sum((s - 1) * st for s, st in zip(size, stride))
  if offset < 0 or any(st < 0 for st in stride) or last >= storage.shape[0]:
    raise ValueError(f"torch_load: {where}: a tensor of shape {size} (stride {stride}, offset {offset}) reaches past "
                     f"the end of storage {key} ({storage.shape[0]} elements)")
  # axes of size 1 have any stride; the others are contiguous when their strides are the row-major ones
  row_major = [prod(size[i + 1:]) for i in range(len(size))]
  if all(s == 1 or st == rm for s, st, rm in zip(size, stride, row_major)):
    return storage[offset:offset + numel].reshape(size)   # a byte range: stays a lazy view of the file
  # other strides (a transposed or channels-last weight, overlapping or gapped views): gathered on the host with
  # numpy's as_strided over the storage's bytes, into a buffer on the default device. No kernel runs, so loading a
  # channels-last checkpoint compiles nothing; these tensors are read at load time, not lazily.
  import numpy as np
  elements = _host_bytes(storage[0:last + 1]).view(np.dtype(f"u{storage.dtype.itemsize}"))
  item = elements.itemsize
  gathered = np.lib.stride_tricks.as_strided(elements[offset:], size, [st * item for st in stride], writeable=False)
  return _tensor_from_bytes(np.ascontiguousarray(gathered).view(np.uint8), storage.dtype, size, Device.DEFAULT)

def _host_bytes(t: Tensor):
  """The bytes of the 1-d tensor `t` as a numpy uint8 array (a view of the file mapping for a DISK tensor)."""
  import numpy as np
  return np.frombuffer(TensorIO(t.bitcast(dtypes.uint8))._data(), dtype=np.uint8)

def _tensor_from_bytes(raw, dtype: DType, shape: tuple[int, ...], device: str) -> Tensor:
  """A realized tensor on `device` holding the bytes `raw` as `shape` elements of `dtype`."""
  from kiln.device import Buffer
  from kiln.uop.ops import UOp
  node = UOp.new_buffer(device, prod(shape), dtype)
  node.buffer = Buffer(device, prod(shape), dtype)
  node.buffer.copyin(memoryview(raw))
  return Tensor(node.reshape(shape))

def torch_load(fn: Tensor | str | os.PathLike) -> Any:
  """The object a `torch.save` file holds (usually a dict of name -> Tensor), read without importing torch.

  Every format torch.load reads: the zip archive (`archive/data.pkl` and one `archive/data/<key>` file per storage),
  the legacy pickle stream (`_use_new_zipfile_serialization=False`) and the oldest one, a tar archive of `storages`,
  `tensors` and `pickle` (read with `tar_extract`). Contiguous tensors are lazy views of the file on the
  DISK device; non-contiguous ones are rebuilt on the default device. Tensors that share a storage share its bytes.
  Only containers, numbers, strings and tensors are rebuilt: other objects in the pickle become inert placeholders.
  A corrupted or truncated file raises ValueError naming the file and what is wrong.
  """
  t = _file_tensor(fn, "torch_load")
  where = _name(t)
  if t.shape[0] >= 4 and t[0:4].numpy().tobytes() == b"PK\x03\x04": return _load_zip(t, where)
  if t.shape[0] >= 263 and t[257:262].numpy().tobytes() == b"ustar": return _load_tar(t, where)
  return _load_legacy(t, where)

def _finish(unpickler: _TorchUnpickler, result: Any, where: str) -> Any:
  """Turn each placeholder tensor into a view of its storage's bytes."""
  for storage, placeholder, (offset, size, stride) in unpickler.tensors:
    if storage.tensor is None: raise ValueError(f"torch_load: {where}: storage {storage.key} has no data")
    placeholder.uop = _tensor_from_storage(storage.tensor, offset, size, stride, storage.key, where).uop
  return result

def _load_zip(t: Tensor, where: str) -> Any:
  try:
    archive = zipfile.ZipFile(TensorIO(t))
  except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
    raise ValueError(f"torch_load: {where} is not a valid zip archive ({e})") from None
  with archive:
    pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
    if not pickles: raise ValueError(f"torch_load: {where}: the zip archive has no <name>/data.pkl")
    prefix = pickles[0][:-len("data.pkl")]
    byteorder = f"{prefix}byteorder"
    if byteorder in archive.namelist() and archive.read(byteorder).strip() not in (b"little", b""):
      raise ValueError(f"torch_load: {where}: big-endian checkpoints are not supported")
    storages: dict[str, _Storage] = {}
    def storage_of(key: str, dtype: DType, numel: int | None) -> _TypedStorage:
      if key not in storages:
        storage = storages[key] = _Storage(key, dtype, numel or 0)
        storage.tensor = _zip_member(t, archive, f"{prefix}data/{key}", dtype, where)
      return _TypedStorage(storages[key])
    try:
      with archive.open(pickles[0]) as f:
        unpickler = _TorchUnpickler(f, storage_of, where)
        result = unpickler.load()
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, AttributeError, IndexError, TypeError,
            struct.error, UnicodeDecodeError) as e:
      raise ValueError(f"torch_load: {where}: {pickles[0]} is corrupted ({type(e).__name__}: {e})") from None
  return _finish(unpickler, result, where)

def _zip_member(t: Tensor, archive: zipfile.ZipFile, name: str, dtype: DType, where: str) -> Tensor:
  """The 1-d tensor of `dtype` in the archive member `name`: a view of the file when the member is stored as is."""
  try: info = archive.getinfo(name)
  except KeyError:
    raise ValueError(f"torch_load: {where}: the storage file {name!r} is missing from the archive") from None
  if info.file_size % dtype.itemsize:
    raise ValueError(f"torch_load: {where}: {name!r} holds {info.file_size} bytes, not a whole number of "
                     f"{dtype.name} items")
  if info.compress_type != zipfile.ZIP_STORED:   # torch.save never compresses, but other zip tools may
    data = archive.read(name)
    return Tensor(data, device="CPU").bitcast(dtype) if data else Tensor.empty(0, device="CPU", dtype=dtype)
  local = t[info.header_offset:info.header_offset + 30].numpy().tobytes()
  if len(local) < 30 or local[:4] != b"PK\x03\x04":
    raise ValueError(f"torch_load: {where}: bad local zip header for {name!r} at offset {info.header_offset}")
  name_len, extra_len = struct.unpack("<HH", local[26:30])
  start = info.header_offset + 30 + name_len + extra_len
  if start + info.file_size > t.shape[0]:
    raise ValueError(f"torch_load: {where}: storage {name!r} ({info.file_size} bytes at offset {start}) is truncated: "
                     f"the file has {t.shape[0]} bytes")
  return _bytes_as(t[start:start + info.file_size], dtype, (info.file_size // dtype.itemsize,))

class _TarUnpickler(_TorchUnpickler):
  """The tar format's main pickle: a persistent id is the key of a tensor the `tensors` member describes."""
  def __init__(self, file, tensors: dict[str, Tensor], where: str):
    super().__init__(file, None, where)
    self._tensors = tensors
  def persistent_load(self, pid: Any) -> Any:
    if isinstance(pid, tuple): return pid[0]   # (module, source file, source): a container, saved with its source
    if str(pid) not in self._tensors: raise ValueError(f"torch_load: {self._where}: unknown tensor key {pid!r}")
    return self._tensors[str(pid)]

def _read_tar_storages(data: Tensor, where: str) -> dict[str, Tensor]:
  """The `storages` member: a count, then per storage a pickled (key, location, storage class), an int64 element
  count and the bytes; then a pickled list of (view key, root key, offset, numel) views into them."""
  f, storages = TensorIO(data), {}
  for _ in range(pickle.load(f)):
    key, _location, dtype = _TorchUnpickler(f, None, where).load()
    if not isinstance(dtype, DType): raise ValueError(f"torch_load: {where}: storage {key} has a type kiln cannot read")
    numel = struct.unpack("<q", f.read(8))[0]
    start, nbytes = f.tell(), numel * dtype.itemsize
    if numel < 0 or start + nbytes > data.shape[0]:
      raise ValueError(f"torch_load: {where}: storage {key} ({nbytes} bytes at offset {start}) is truncated")
    storages[str(key)] = _bytes_as(data[start:start + nbytes], dtype, (numel,))
    f.seek(start + nbytes)
  for view_key, root_key, offset, numel in pickle.load(f):
    storages[str(view_key)] = storages[str(root_key)][offset:offset + numel]
  return storages

def _read_tar_tensors(data: Tensor, storages: dict[str, Tensor], where: str) -> dict[str, Tensor]:
  """The `tensors` member: a count, then per tensor a pickled (key, storage key, tensor class), an int32 ndim (in 8
  bytes), int64 sizes, strides and storage offset."""
  f, tensors = TensorIO(data), {}
  for _ in range(pickle.load(f)):
    key, storage_key, _tensor_class = _TorchUnpickler(f, None, where).load()
    ndim = struct.unpack("<i", f.read(8)[:4])[0]
    size, stride = struct.unpack(f"<{ndim}q", f.read(8 * ndim)), struct.unpack(f"<{ndim}q", f.read(8 * ndim))
    offset = struct.unpack("<q", f.read(8))[0]
    if str(storage_key) not in storages: raise ValueError(f"torch_load: {where}: unknown storage {storage_key!r}")
    tensors[str(key)] = _tensor_from_storage(storages[str(storage_key)], offset, size, stride, str(storage_key), where)
  return tensors

def _load_tar(t: Tensor, where: str) -> Any:
  members = tar_extract(t)
  missing = [name for name in ("storages", "tensors", "pickle") if name not in members]
  if missing: raise ValueError(f"torch_load: {where}: a tar checkpoint needs members {missing} it does not have")
  try:
    tensors = _read_tar_tensors(members["tensors"], _read_tar_storages(members["storages"], where), where)
    return _TarUnpickler(TensorIO(members["pickle"]), tensors, where).load()
  except ValueError: raise
  except (pickle.UnpicklingError, EOFError, AttributeError, IndexError, TypeError, KeyError, struct.error,
          UnicodeDecodeError, OverflowError) as e:
    raise ValueError(f"torch_load: {where} is not a valid tar checkpoint ({type(e).__name__}: {e})") from None

def _load_legacy(t: Tensor, where: str) -> Any:
  f = TensorIO(t)
  storages: dict[str, _Storage] = {}
  def storage_of(key: str, dtype: DType, numel: int | None) -> _Storage:
    if key not in storages: storages[key] = _Storage(key, dtype, numel or 0)
    return storages[key]
  try:
    magic = pickle.load(f)
    if magic != _LEGACY_MAGIC: raise ValueError(f"torch_load: {where} is neither a zip nor a legacy torch.save file")
    protocol = pickle.load(f)
    if protocol != 1001: raise ValueError(f"torch_load: {where}: unsupported legacy protocol version {protocol!r}")
    pickle.load(f)   # system info (byte order, type sizes)
    unpickler = _TorchUnpickler(f, storage_of, where)
    result = unpickler.load()
    keys = pickle.load(f)
  except ValueError: raise
  except (pickle.UnpicklingError, EOFError, AttributeError, IndexError, TypeError, KeyError, struct.error,
          UnicodeDecodeError, OverflowError) as e:
    raise ValueError(f"torch_load: {where} is not a valid torch.save file ({type(e).__name__}: {e})") from None
  # after the pickles: for each storage, its element count (int64) and its bytes
  position, size = f.tell(), t.shape[0]
  for key in keys:
    key = str(key)
    if key not in storages: raise ValueError(f"torch_load: {where}: the file lists an unknown storage {key!r}")
    storage = storages[key]
    if position + 8 > size: raise ValueError(f"torch_load: {where}: storage {key} is truncated at offset {position}")
    f.seek(position)
    numel = struct.unpack("<q", f.read(8))[0]
    nbytes = numel * storage.dtype.itemsize
    start = position + 8
    if numel < 0 or start + nbytes > size:
      raise ValueError(f"torch_load: {where}: storage {key} ({nbytes} bytes at offset {start}) is truncated: the file "
                       f"has {size} bytes")
    storage.tensor = _bytes_as(t[start:start + nbytes], storage.dtype, (numel,))
    position = start + nbytes
  return _finish(unpickler, result, where)
