"""Reading ONNX protobufs into kiln values: element types, tensors (initializers, Constant values) and attributes."""
from __future__ import annotations
import contextlib
from typing import Any
import numpy as np
from kiln.dtype import DType, dtypes, from_numpy_dtype
from kiln.tensor import Tensor
from kiln.frontend import onnx_floats

def import_onnx():
  """The onnx package, or an ImportError saying how to install it."""
  try:
    import onnx
  except ImportError as err:
    raise ImportError("kiln.frontend.onnx needs the onnx package: pip install 'kiln[onnx]'") from err
  return onnx

# ONNX TensorProto.DataType -> kiln dtype. int4/uint4 values are held in 8-bit integers.
ONNX_DTYPES: dict[int, DType] = {
  1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 4: dtypes.uint16, 5: dtypes.int16, 6: dtypes.int32,
  7: dtypes.int64, 9: dtypes.bool, 10: dtypes.float16, 11: dtypes.float64, 12: dtypes.uint32, 13: dtypes.uint64,
  16: dtypes.bfloat16, 17: dtypes.fp8e4m3, 19: dtypes.fp8e5m2, 21: dtypes.uint8, 22: dtypes.int8,
  18: dtypes.float32, 20: dtypes.float32, 23: dtypes.float32,
}
# float8e4m3fnuz, float8e5m2fnuz and float4e2m1 have no kiln dtype: their values are held in float32 (on that type's
# grid); a Cast to them rounds on the host (onnx_floats.py).
EMULATED_FLOATS = (18, 20, 23)
ONNX_TYPE_NAMES = {1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 8: "STRING",
                   9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64", 14: "COMPLEX64",
                   15: "COMPLEX128", 16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2",
                   20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1"}
STRING = 8

def dtype_of_onnx(elem_type: int) -> DType:
  """The kiln dtype of an ONNX element type; NotImplementedError for one kiln cannot hold."""
  if elem_type not in ONNX_DTYPES:
    raise NotImplementedError(f"ONNX element type {ONNX_TYPE_NAMES.get(elem_type, elem_type)} is not supported")
  return ONNX_DTYPES[elem_type]

_NARROW_FLOATS = (16, 17, 19, 18, 20, 23)

def _float_bits_to_float32(bits: np.ndarray, elem_type: int) -> np.ndarray:
  """Unpacked bfloat16 / float8 / float4 bit patterns (as integers) -> float32 values."""
  if elem_type == 16: return (bits.astype(np.uint32) << 16).view(np.float32)
  return onnx_floats.decode(bits, elem_type)

def _float32_to_bits(values: np.ndarray, elem_type: int, saturate: bool) -> np.ndarray:
  """float32 values -> the nearest float8 / float4 bit patterns (uint8)."""
  return onnx_floats.encode(values, elem_type, saturate)

def round_to_emulated(values: np.ndarray, elem_type: int, saturate: bool) -> np.ndarray:
  """float32 values rounded onto an emulated type's grid (held in float32)."""
  return _float_bits_to_float32(_float32_to_bits(values, elem_type, saturate), elem_type)

def numpy_of_proto(proto) -> np.ndarray:
  """A TensorProto's values as a numpy array: bfloat16/float8 as float32, int4/uint4 as int8/uint8, strings as str."""
  from onnx import numpy_helper
  array = numpy_helper.to_array(proto)
  if proto.data_type in _NARROW_FLOATS:
    return _float_bits_to_float32(array.view(np.uint16 if proto.data_type == 16 else np.uint8), proto.data_type)
  if proto.data_type in (21, 22): return array.astype(np.uint8 if proto.data_type == 21 else np.int8)
  if proto.data_type == STRING: return array.astype(object)
  return array

# What is known about a tensor beyond its kiln dtype, by id (holding the tensor so the id stays its own); the runner
# drops a call's entries when the call ends.
# - A host copy of small tensors whose values are known without running a kernel: initializers, Constant values,
#   Shape outputs, and the shape arithmetic onnx_fold.py computes from them. Reading a shape-like input then needs no
#   realize, so shape-computing graphs run under TinyJit (where reading a value is refused) and launch fewer kernels.
# - The ONNX type of a tensor held in a wider kiln dtype (float8 fnuz and float4 in float32, int4/uint4 in 8 bits),
#   which CastLike and QuantizeLinear read from their target / zero point.
HOST_LIMIT = 4096
HELD_TYPES = (18, 20, 21, 22, 23)
_host: dict[int, tuple[Tensor, np.ndarray | None, int | None]] = {}

def _entry(value) -> tuple[Tensor, np.ndarray | None, int | None] | None:
  entry = _host.get(id(value))
  return entry if entry is not None and entry[0] is value else None

def remember(tensor: Tensor, array: np.ndarray) -> Tensor:
  """Record a small tensor's values on the host; returns the tensor."""
  if np.asarray(array).size <= HOST_LIMIT:
    held = _entry(tensor)
    _host[id(tensor)] = (tensor, np.asarray(array), held[2] if held else None)
  return tensor

def mark_type(tensor: Tensor, elem_type: int) -> Tensor:
  """Record the ONNX type of a tensor held in a wider dtype (HELD_TYPES); returns the tensor."""
  if elem_type in HELD_TYPES:
    held = _entry(tensor)
    _host[id(tensor)] = (tensor, held[1] if held else None, elem_type)
  return tensor

_host_reads: list[set[int]] = []   # ids of tensors whose host copies were read, inside track_host_reads()

def host_value(value) -> np.ndarray | None:
  """The host copy of a tensor's values, None where there is none."""
  entry = _entry(value)
  if entry is None: return None
  if _host_reads and entry[1] is not None: _host_reads[-1].add(id(value))
  return entry[1]

@contextlib.contextmanager
def track_host_reads():
  """Collect the ids of the tensors whose host copies `host_value` hands out inside the block (yields the set)."""
  reads: set[int] = set()
  _host_reads.append(reads)
  try: yield reads
  finally: _host_reads.pop()

def held_type(value) -> int | None:
  """The ONNX type of a tensor held in a wider dtype, None for the others."""
  entry = _entry(value)
  return entry[2] if entry is not None else None

def host_entries() -> dict[int, tuple[Tensor, np.ndarray | None, int | None]]:
  return _host

def value_of_proto(proto) -> Tensor | np.ndarray:
  """A TensorProto as a kiln Tensor of its ONNX dtype (a numpy object array for strings)."""
  array = numpy_of_proto(proto)
  if proto.data_type == STRING: return array
  dtype = dtype_of_onnx(proto.data_type)
  if proto.data_type in _NARROW_FLOATS: return mark_type(Tensor(array).cast(dtype), proto.data_type)
  array = np.array(array, order="C")
  return mark_type(remember(constant_tensor(array, dtype), array), proto.data_type)

def constant_tensor(array: np.ndarray, dtype=None) -> Tensor:
  """A constant array as a Tensor: one element becomes a constant of the kernels that use it (a scale, HardSwish's
  1/6), not a buffer each of them loads per element; larger ones (and a NaN, whose sign a constant loses) a buffer."""
  if array.size == 1 and array.dtype.kind in "biuf" and not (array.dtype.kind == "f" and np.isnan(array).any()):
    return Tensor.full(array.shape, array.reshape(-1)[0].item(), dtype=dtype or from_numpy_dtype(array.dtype))
  return Tensor(array, dtype=dtype)

def attribute_value(attr) -> Any:
  """An AttributeProto as a Python value: ints, floats, str, tuples of them, Tensors, or a GraphProto (subgraphs)."""
  from onnx import AttributeProto
  kind = attr.type
  if kind == AttributeProto.FLOAT: return float(attr.f)
  if kind == AttributeProto.INT: return int(attr.i)
  if kind == AttributeProto.STRING: return attr.s.decode()
  if kind == AttributeProto.TENSOR: return value_of_proto(attr.t)
  if kind == AttributeProto.GRAPH: return attr.g
  if kind == AttributeProto.FLOATS: return tuple(float(v) for v in attr.floats)
  if kind == AttributeProto.INTS: return tuple(int(v) for v in attr.ints)
  if kind == AttributeProto.STRINGS: return tuple(s.decode() for s in attr.strings)
  if kind == AttributeProto.TENSORS: return tuple(value_of_proto(t) for t in attr.tensors)
  if kind == AttributeProto.GRAPHS: return tuple(attr.graphs)
  if kind == AttributeProto.SPARSE_TENSOR:
    from onnx import numpy_helper
    sparse = attr.sparse_tensor
    values, indices = numpy_of_proto(sparse.values), numpy_helper.to_array(sparse.indices)
    dense = np.zeros(int(np.prod(sparse.dims)), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, tuple(sparse.dims))
    dense[flat] = values
    return Tensor(dense.reshape(tuple(sparse.dims)), dtype=dtype_of_onnx(sparse.values.data_type))
  raise NotImplementedError(f"attribute {attr.name!r} has an unsupported type {kind}")

def numpy_input(array: np.ndarray, elem_type: int) -> np.ndarray:
  """An array as onnx's numpy_helper gives it (bfloat16 as uint16 bits, float8/int4 as onnx's custom dtypes) -> the
  plain values kiln takes (float32 for bfloat16/float8, int8/uint8 for int4/uint4)."""
  if elem_type in _NARROW_FLOATS and not np.issubdtype(array.dtype, np.floating):
    return _float_bits_to_float32(array.view(np.uint16 if elem_type == 16 else np.uint8), elem_type)
  if elem_type in (21, 22) and array.dtype.names: return array.view(np.uint8 if elem_type == 21 else np.int8)
  return array

def numpy_output(array: np.ndarray, elem_type: int) -> np.ndarray:
  """The inverse of numpy_input: kiln's float32 values of a bfloat16/float8 output (already on that dtype's grid) as
  the bit patterns and custom dtypes onnx's numpy_helper uses, int4/uint4 in onnx's custom dtypes."""
  from onnx import _custom_element_types as custom
  if elem_type == 16:
    return (np.asarray(array, np.float32).view(np.uint32) >> 16).astype(np.uint16)
  if elem_type in (17, 18, 19, 20, 23):
    names = {17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz", 23: "float4e2m1"}
    return _float32_to_bits(array, elem_type, saturate=False).view(getattr(custom, names[elem_type]))
  if elem_type in (21, 22):
    return np.asarray(array).astype(np.uint8 if elem_type == 21 else np.int8).view(
      custom.uint4 if elem_type == 21 else custom.int4)
  return array
