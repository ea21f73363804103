"""What every Tensor module shares: located error messages, shape formatting, argument checks."""
from __future__ import annotations
from kiln.dtype import DType, to_dtype
from kiln.helpers import user_frame_location
from kiln.device import Device
from kiln.uop.sint import sint_eq

# Each error class is the class PyTorch raises for the same misuse (tinygrad's tests and user code catch those) and
# also the Python class kiln raised before (so `except ValueError` code keeps working).
class TensorIndexError(IndexError, ValueError):
  """An index or axis outside a tensor's shape (PyTorch: IndexError)."""

class TensorValueError(RuntimeError, ValueError):
  """Shapes that do not fit together, or an argument value an op cannot take (PyTorch: RuntimeError)."""

class UnsupportedError(NotImplementedError, TypeError, ValueError):
  """A dtype or mode an op does not support (PyTorch: NotImplementedError, "not implemented for 'Float'")."""

class AxisError(IndexError, RuntimeError, ValueError):
  """An axis the op needs and the tensor lacks: max/argmax over an empty axis (PyTorch: IndexError with a dim,
  RuntimeError without one), a 0-d tensor to concatenate (PyTorch: RuntimeError; tinygrad's tests: IndexError)."""

def where() -> str:
  loc = user_frame_location()
  return f" (at {loc})" if loc else ""

def dtype_arg(dtype, op: str) -> DType:
  """`dtype` as a DType, or a TypeError naming the op and the user's line."""
  try: return to_dtype(dtype)
  except TypeError as e: raise TypeError(f"{op}: {e}{where()}") from None

def fmt(shape) -> str:
  # a symbolic size (a UOp over bound Variables) prints as its expression, e.g. (start_pos+1)
  items = ", ".join(s.render() if hasattr(s, "render") else str(s) for s in shape)
  return "(" + items + ("," if len(shape) == 1 else "") + ")"

_known_devices: list[str] = []

def canonical_device(device: str | tuple[str, ...] | None) -> str | tuple[str, ...]:
  """`device` in canonical form ('cpu' -> 'CPU'; several devices as a tuple of names); a ValueError for a device kiln
  has no runtime for."""
  if device is None: return Device.DEFAULT
  if isinstance(device, (tuple, list)):
    names = tuple(canonical_device(d) for d in device)
    if not names or len(set(names)) != len(names):
      raise TensorValueError(f"devices {tuple(device)!r} must be distinct and at least one{where()}")
    if len(names) == 1: return names[0]
    from kiln.schedule.multi import note_several_devices
    note_several_devices()
    return names
  name = Device.canonicalize(device)
  if not _known_devices: _known_devices.extend(Device.known())
  if name.partition(":")[0] not in _known_devices:
    raise TensorValueError(f"unknown device {device!r}; known devices: {', '.join(_known_devices)}{where()}")
  return name

def broadcasts_to(shape: tuple, target: tuple) -> bool:
  """Whether `shape` broadcasts to `target` exactly (NumPy's rule, one way: sizes of 1 and missing leading axes grow)."""
  return len(shape) <= len(target) and all(s == 1 or sint_eq(s, t) for s, t in zip(reversed(shape), reversed(target)))

def broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
  ndim = max(len(s) for s in shapes)
  padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
  out = []
  for sizes in zip(*padded):
    if sizes.count(sizes[0]) == len(sizes):   # one size on this axis (the usual case): no set to build
      out.append(sizes[0])
      continue
    non_one = {s for s in sizes if s != 1}
    if len(non_one) > 1:
      raise TensorValueError(f"{op}: shapes {' and '.join(fmt(s) for s in shapes)} cannot be broadcast together{where()}")
    out.append(non_one.pop() if non_one else 1)
  return tuple(out)
