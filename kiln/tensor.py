"""Tensor: the lazy, PyTorch-like front end. Every op builds UOps; work happens at realize()."""
from __future__ import annotations
import functools, gc, math, os, pathlib, sys, weakref
from contextlib import contextmanager
from typing import Any, Sequence
import numpy as np
from kiln.dtype import DType, dtypes, least_upper_dtype, to_numpy_dtype, from_numpy_dtype
from kiln.helpers import prod, user_frame_location, deep_recursion, gc_paused, TRACEBACK_SOURCE, _KILN_DIR, \
  _user_file_names
from kiln.uop.ops import UOp, Ops, GroupOp, toposort, const_value
from kiln.uop.pattern import substitute
from kiln.uop.mathforms import INV_LN2
from kiln.uop.sint import ssimplify, sint_eq, sint_min, sint_max, sint_str, ssub, is_symbolic_shape, sint_value, sprod
from kiln.device import Buffer, Device  # noqa: F401  (Device, _to_np_dtype, fetch, Variable: tinygrad.tensor has them)
from kiln.dtype import _to_np_dtype, _from_np_dtype  # noqa: F401
from kiln.helpers import fetch  # noqa: F401
from kiln.uop.ops import Variable  # noqa: F401
from kiln.gradient import compute_gradient, gradient_graph, NO_GRADIENT
from kiln.schedule.kernelize import create_schedule, is_contiguous_buffer
from kiln.engine.realize import run_schedule, capturing as _jit_calls
from kiln.mixin.creation import CreationMixin
from kiln.mixin.movement import MovementMixin
from kiln.mixin.indexing import IndexingMixin
from kiln.mixin.elementwise import ElementwiseMixin, _TANH_TAYLOR_F64
from kiln.mixin.reduce import ReduceMixin
from kiln.mixin.conv import ConvMixin
from kiln.mixin.nn import NNMixin
from kiln.mixin.sorting import SortMixin
from kiln.mixin.linalg import LinalgMixin
from kiln.mixin.bytes import BytesMixin
from kiln.mixin.multi import MultiMixin
from kiln.schedule import multi as _multi
from kiln.schedule import cache as _schedule_cache
from kiln.mixin.common import TensorIndexError, TensorValueError, UnsupportedError, AxisError, where as _where, \
  fmt as _fmt, dtype_arg as _dtype_arg, canonical_device as _canonical_device, \
  broadcasts_to, broadcast_shape as _broadcast_shape

# hot reads bound once: `Ops.X` is a metaclass attribute lookup (~130 ns under Python 3.11), a global ~10 ns
_ADD, _MUL, _BUFFER, _ASSIGN, _UNIQUE, _MULTI = Ops.ADD, Ops.MUL, Ops.BUFFER, Ops.ASSIGN, Ops.UNIQUE, Ops.MULTI

_requires_grad_tensors: weakref.WeakSet = weakref.WeakSet()
_NO_NODES: frozenset = frozenset()
_KEY_STABLE_OPS = _schedule_cache._STABLE_OPS
class _LiveTensors:
  """Every live Tensor, so realizing an assign can first compute the pending tensors that read the old values.

  id -> a weak reference without a callback: a WeakSet's add and its removal callback at each tensor's death cost
  ~0.6 us a tensor, ~5% of building a graph. Dead entries are dropped when the table has doubled since the last
  sweep; an id reused by a newer tensor replaces its entry, at the end (iteration follows creation order)."""
  def __init__(self) -> None:
    self.refs: dict[int, weakref.ref] = {}
    self.sweep_at = 1024
  def add(self, t: Tensor) -> None:
    """Record `t`."""
    refs = self.refs
    # an id reused by a newer tensor moves to the end: the table iterates in creation order, so the pending readers
    # an assign finds come in the same order every training step (their order is part of the schedule cache's key)
    refs.pop(id(t), None)
    refs[id(t)] = weakref.ref(t)
    if len(refs) >= self.sweep_at:
      self.refs = refs = {k: r for k, r in refs.items() if r() is not None}
      self.sweep_at = max(1024, 2 * len(refs))
  def __iter__(self):
    return iter([t for r in list(self.refs.values()) if (t := r()) is not None])
  def __len__(self) -> int: return sum(r() is not None for r in list(self.refs.values()))

_live_tensors = _LiveTensors()

# tanh(x) = x + x**3 * P(x**2) for |x| < 0.55: P's coefficients, highest first, a least-squares fit of
# (tanh(x)/x - 1)/x**2 (within 0.8 ulp of tanh in float32 on that range)
_TANH_POLY_LIMIT = 0.55
_TANH_POLY = (-0.006272607482969761, 0.02107025310397148, -0.053851865231990814, 0.13332580029964447,
              -0.33333316445350647)

class Tensor(CreationMixin, MovementMixin, IndexingMixin, ElementwiseMixin, ReduceMixin, ConvMixin, NNMixin, SortMixin,
             LinalgMixin, BytesMixin, MultiMixin):
  """A lazy n-dimensional array with autograd.

  >>> from kiln import Tensor
  >>> (Tensor([1.0, 2.0, 3.0]) * 2).tolist()
  [2.0, 4.0, 6.0]
  """
  __slots__ = ("uop", "_requires_grad", "grad", "__weakref__")
  training: bool = False
  _seed: int = 0

  def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None, requires_grad: bool | None = None):
    dtype = _dtype_arg(dtype, "Tensor") if dtype is not None else None
    self.grad: Tensor | None = None
    self._requires_grad = None
    if _multi.is_multi_device(device) and not isinstance(data, (UOp, Tensor)):   # data on several devices: replicas
      self.uop = Tensor(data, device=device[0], dtype=dtype).to(device).uop
      _live_tensors.add(self)
      if requires_grad is not None: self.requires_grad = requires_grad
      return
    if isinstance(data, UOp):
      uop = data
    elif isinstance(data, pathlib.Path):   # a file's bytes, lazily, on DISK:<path> (nothing is read until used)
      uop = _uop_from_file(data)
    elif isinstance(data, Tensor):
      uop = data.uop
    else:
      device = _canonical_device(device)
      if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
        uop = UOp.const(_scalar_dtype(data, dtype, "Tensor"), data, device).unique()
      else:
        if isinstance(data, (bytes, bytearray, memoryview)): arr = np.frombuffer(bytes(data), np.uint8)
        elif isinstance(data, np.ndarray) or isinstance(data, np.generic): arr = np.asarray(data)
        elif isinstance(data, (list, tuple)): arr, dtype = _array_from_list(data, dtype)
        else: raise TypeError(f"Tensor: cannot make a tensor from {type(data).__name__}{_where()}")
        uop = _uop_from_numpy(arr, device, dtype)
    if device is not None and isinstance(data, (UOp, Tensor, pathlib.Path)) and uop.device != _canonical_device(device):
      uop = uop.copy_to(_canonical_device(device))
    if dtype is not None and uop.dtype != dtype: uop = uop.cast(dtype)
    if _multi.multi_made and _multi.involves_several_devices(uop): _check_devices(uop, "Tensor")
    self.uop = uop
    _live_tensors.add(self)
    if requires_grad is not None: self.requires_grad = requires_grad

  @staticmethod
  def _wrap(uop: UOp, name: str = "") -> Tensor:
    """A Tensor around a freshly built node, recording the user's source line on it."""
    t = Tensor.__new__(Tensor)
    t.uop, t.grad, t._requires_grad = uop, None, None
    _live_tensors.add(t)
    if uop.meta is None: _label(uop, name)
    if _multi.multi_made and _multi.involves_several_devices(uop): _check_devices(uop, name)
    return t

  # ---------------- properties ----------------
  @property
  def shape(self) -> tuple[int, ...]:
    """The size of each axis, as a tuple of ints."""
    return self.uop.shape
  @property
  def dtype(self) -> DType:
    """The element type."""
    return self.uop.dtype
  @property
  def device(self) -> str | tuple[str, ...]:
    """The name of the device this tensor lives on, e.g. 'CPU' (a tuple of names for a tensor over several)."""
    return self.uop.device
  @property
  def ndim(self) -> int:
    """The number of axes."""
    return len(self.shape)
  def numel(self) -> int:
    """The total number of elements."""
    return prod(self.shape)
  def size(self, dim: int | None = None) -> tuple[int, ...] | int:
    """The shape as a tuple, or the size of axis `dim` (negative counts from the end), like torch.Tensor.size.

    >>> Tensor.zeros(2, 3).size(), Tensor.zeros(2, 3).size(-1)
    ((2, 3), 3)
    """
    if dim is None: return self.shape
    if self.ndim == 0: raise TensorIndexError(f"size: a 0-d tensor has no dimension {dim}{_where()}")
    return self.shape[self._axis(dim, "size")]
  def is_floating_point(self) -> bool:
    """True when the dtype is a floating-point type (float16, bfloat16, float32, float64 or an fp8 type).

    >>> Tensor([1.0]).is_floating_point(), Tensor([1]).is_floating_point()
    (True, False)
    """
    return dtypes.is_float(self.dtype)
  def element_size(self) -> int:
    """The size of one element in bytes."""
    return self.dtype.itemsize
  def nbytes(self) -> int:
    """The size of all the elements in bytes (numel * element_size)."""
    return self.numel() * self.element_size()
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  @property
  def requires_grad(self) -> bool | None:
    """Whether backward() gives this tensor a .grad: as set, or for a computed tensor True when it was computed
    (differentiably) from one that requires a gradient, as in tinygrad and PyTorch; None when nothing says.

    >>> x = Tensor([1.0, 2.0], requires_grad=True)
    >>> (x * 2).requires_grad, (x * 2).detach().requires_grad
    (True, None)
    """
    if self._requires_grad is not None or not _requires_grad_tensors: return self._requires_grad
    wanted = _grad_identities()
    return True if any(node in wanted for node in gradient_graph(self.uop)) else None
  @requires_grad.setter
  def requires_grad(self, value: bool | None) -> None:
    """Set whether backward() accumulates a gradient into this tensor's .grad."""
    self._requires_grad = value
    if value: _requires_grad_tensors.add(self)
    else: _requires_grad_tensors.discard(self)
  def requires_grad_(self, requires_grad: bool | None = True) -> Tensor:
    """Set requires_grad (True by default) in place and return self, like torch.Tensor.requires_grad_."""
    self.requires_grad = requires_grad
    return self
  def __repr__(self) -> str:
    return f"<Tensor shape={self.shape} dtype={self.dtype} device={self.device!r}{' realized' if self.uop.base.op is Ops.BUFFER else ''}>"
  def __hash__(self) -> int: return id(self)
  def __bool__(self) -> bool:
    if self.numel() != 1: raise RuntimeError(f"bool: a tensor of shape {_fmt(self.shape)} has no single truth value{_where()}")
    return bool(self.item())

  # ---------------- realizing ----------------
  def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
    """Run the pending computation of this tensor (and those in `lst`) now. Returns self.

    `do_update_stats` is accepted for tinygrad scripts; kiln's counters are always updated.
    """
    _realize_all((self, *lst) if lst else (self,))
    return self

  @staticmethod
  def realize_all(tensors: Sequence[Tensor]) -> None:
    """Realize all `tensors` together, scheduling their pending computations at once."""
    _realize_all(tensors)

  @staticmethod
  def _realize_all_paused(tensors: Sequence[Tensor]) -> None:
    """realize_all's work, with the cyclic garbage collector paused (helpers.gc_paused's reason) by _realize_all."""
    if len(tensors) == 1:   # (an eager realize(): no duplicates to drop)
      t = tensors[0]
      uop = t.uop
      if uop.base.op is _BUFFER or (uop.op is _MULTI and all(s.base.op is _BUFFER for s in uop.src)): return
      todo = [(t, uop)]
    else:
      todo = [(t, t.uop) for t in dict.fromkeys(tensors) if t.uop.base.op is not _BUFFER and not (
        t.uop.op is _MULTI and all(s.base.op is _BUFFER for s in t.uop.src))]
      if not todo: return
    roots = [todo[0][1]] if len(todo) == 1 else list(dict.fromkeys(uop for _, uop in todo))
    schedule = None
    # PyTorch order: a tensor built before an assign holds the old values, so it is computed in the same run, ordered
    # before the overwrite (the scheduler runs reads of a buffer's old value before its assign). The buffers that
    # assign roots overwrite are known before scheduling (an optimizer step's are all roots), so their readers join
    # the first schedule; one that a pending assign deeper in the graph overwrites is found in the schedule
    targets = [root.src[0].base for root in roots if root.op is _ASSIGN]
    overwritten = [target.buffer for target in targets if target.op is _BUFFER and target.buffer is not None]
    checked: set[int] = set()
    aliases: list[Tensor] = []   # realized tensors over an overwritten buffer: they get its new identity after the run
    if not overwritten:   # (no assign root: the first schedule stands unless it overwrites buffers itself)
      schedule = create_schedule(roots)
      overwritten = schedule.overwritten
    while overwritten:
      unchecked = [buf for buf in overwritten if id(buf) not in checked]
      if unchecked:
        checked.update([id(buf) for buf in unchecked])
        if stale := _pending_readers(unchecked, {id(t) for t, _ in todo}, aliases):
          todo += [(t, t.uop) for t in stale]
          roots = list(dict.fromkeys(uop for _, uop in todo))
          schedule = None
      if schedule is None: schedule = create_schedule(roots)
      overwritten = schedule.overwritten
      if not overwritten or all(id(buf) in checked for buf in overwritten): break
    run_schedule(schedule.items)
    # results computed earlier from the old contents of overwritten buffers no longer stand for their graphs; this
    # run's results do (the scheduler read the old contents before overwriting them), so they are registered after:
    # a graph built before this run that reads one of them (t6 = t4 + t5, t5 read before t4's assign) needs its value
    for buf in overwritten: _forget_results_computed_from(buf)
    # (the WeakSet's own set: its len() is a Python call, and nothing requires a gradient in most eager code)
    differentiable = _graphs_needing_gradients(roots) if _requires_grad_tensors.data else _NO_NODES
    inputs = {id(buf) for buf in schedule.inputs}
    realized_from_inputs: list[UOp] = []
    own_buffers: list[tuple[Buffer, UOp]] = []   # (result buffer, the node realized into it)
    leaf_candidates: list[tuple[UOp, UOp]] = []   # (root, its result) of tensors that may be autograd leaves
    results = schedule.results
    for t, old in todo:
      new = results[old]
      if new is old: continue
      new_base = new.base
      # (an assign's result is a node of its own already: see kernelize._assign_result)
      if old.op is not _ASSIGN and new_base.op is _BUFFER and id(new_base.buffer) in inputs:
        # nothing was computed (`x.detach()` of a realized x): the result is a view of an input's buffer, so it
        # gets a node of its own over the same storage, or it would be the input itself to autograd and assign
        new = _alias_view(new)
        new_base = new.base
      elif new_base.op is _MULTI and old.op is not _ASSIGN:   # the same for each device's slice
        new = new_base = _multi.multi([_alias_view(s) if s.base.op is _BUFFER and id(s.base.buffer) in inputs else s
                                       for s in new.src], new.arg)
      # a graph that reads no buffer (constants, arange) is not redirected to its result: an equal graph built
      # later is computed again, so it stays a constant that folds into the kernels using it (a realized
      # Tensor.ones(()) would otherwise turn every backward()'s seed into a load). A UNIQUE root is the one
      # node of its tensor, so it can be.
      if old.op is not _ASSIGN and (inputs or old.op is _UNIQUE):
        old.forward = new
        if old.op in _KEY_STABLE_OPS: _schedule_cache.forward_epoch[0] += 1   # (a constant's view: cache.py's memo)
        # its own buffer too: once an assign overwrites it, an equal graph built later must be computed again
        if new_base.op is _BUFFER: own_buffers.append((new_base.buffer, old))
        elif new_base.op is _MULTI: own_buffers += [(s.base.buffer, old) for s in new.src if s.base.op is _BUFFER]
        realized_from_inputs.append(old)
      # the realized node remembers its graph, so backward() still reaches the parameters behind it. An assign's
      # gradient flows to its target alone (gradient.py), so its result remembers a marker over the target's
      # identity instead (_origin_of): remembering the assign itself chained every optimizer step to the one
      # before (their updates, gradients and forward passes stayed alive and every backward() walked them all)
      if old in differentiable and new.origin is None:
        new.origin = _origin_of(old)
        if old.op is not _ASSIGN: leaf_candidates.append((old, new))
      t.uop = new
    if leaf_candidates: _forget_leaf_histories(leaf_candidates)
    if aliases: _renew_identities(aliases, _new_identities_of_targets(roots, results))
    if realized_from_inputs:   # one group of this run's results, shared by every input buffer (hundreds in a step)
      group = _NodeGroup(realized_from_inputs)
      for buf in schedule.inputs: _results_of(buf).add_group(group)
      # and each result under its own buffer alone: forgetting a result is not free (a graph built before the run
      # may read it, and computing it again would read its inputs as they are now)
      for buf, node in own_buffers:
        _results_of(buf).add_group(group if len(realized_from_inputs) == 1 else _NodeGroup([node]))

  def schedule(self, *others: Tensor) -> list:
    """The kernels that realizing this tensor would run (nothing runs)."""
    return create_schedule([t.uop for t in (self, *others)]).items
  def kernelize(self, *others: Tensor) -> Tensor:
    """Accepted for tinygrad scripts; kiln decides kernel boundaries at realize(), so this returns self unchanged."""
    return self
  def fuse(self) -> Tensor:
    """Accepted for tinygrad scripts (a hint to fuse into one kernel); kiln's scheduler decides: returns self."""
    return self

  def _buffer(self) -> Buffer:
    """The realized buffer holding exactly this tensor's elements in row-major order."""
    if _multi.is_multi_device(self.device): return self._gathered()._buffer()
    self.realize()
    uop = self.uop
    if not is_contiguous_buffer(uop) or uop.base.size != self.numel():
      uop = self.contiguous().realize().uop
    buf = uop.base.buffer
    return buf.allocate()

  def numpy(self) -> np.ndarray:
    """The values as a NumPy array (realizes). bfloat16 and fp8 (no numpy type) come back as float32."""
    if _jit_calls:   # a replay runs only the captured kernels: a value read in Python here would be frozen
      raise RuntimeError(f"{_user_op[0] or 'numpy'}: cannot read a tensor's values inside the TinyJit function "
                         f"{_jit_calls[0].name}; return the tensor and read it after the call{_where()}")
    if _multi.is_multi_device(self.device): return self._gathered().numpy()
    if is_symbolic_shape(self.shape):   # sizes over bound Variables: the values at the sizes they are bound to now
      shape = tuple(sint_value(s) for s in self.shape)
      buf = self.contiguous().realize().uop.base.buffer.allocate()   # the first prod(shape) elements, row-major
      return buf.numpy()[:prod(shape)].reshape(shape)
    if self.numel() == 0:
      as_float32 = self.dtype in (dtypes.bfloat16, *dtypes.fp8s)
      return np.zeros(self.shape, dtype=np.float32 if as_float32 else to_numpy_dtype(self.dtype))
    return self._buffer().numpy().reshape(self.shape)

  def data(self) -> memoryview:
    """The raw values as a typed memoryview (realizes)."""
    return memoryview(self.numpy())

  def item(self) -> int | float | bool:
    """The single value of a one-element tensor."""
    if self.numel() != 1: raise TensorValueError(f"item: a tensor of shape {_fmt(self.shape)} has {self.numel()} elements, not 1{_where()}")
    return self.numpy().reshape(()).item()

  def tolist(self) -> Any:
    """The values as nested Python lists (a scalar for a 0-d tensor)."""
    return self.numpy().tolist()

  # ---------------- creation ----------------
  @staticmethod
  def empty(*shape, device: str | None = None, dtype: DType | str | None = None, **kwargs) -> Tensor:
    """An uninitialized tensor."""
    shape, dtype, device = _shape_arg(shape), _dtype_arg(dtype or dtypes.default_float, "empty"), _canonical_device(device)
    if _multi.is_multi_device(device):   # a buffer on each device
      return Tensor(_multi.multi([Tensor.empty(*shape, device=d, dtype=dtype).uop for d in device], None), **kwargs)
    if is_symbolic_shape(shape):   # room for the largest values of the Variables; the view covers the bound size
      size = sprod(shape)
      buf = UOp.new_buffer(device, sint_max(size), dtype)
      buf.buffer = Buffer(device, sint_max(size), dtype)
      return Tensor(UOp(Ops.SHRINK, dtype, (buf,), ((0, size),)).reshape(shape), **kwargs)
    buf = UOp.new_buffer(device, prod(shape), dtype)
    buf.buffer = Buffer(device, prod(shape), dtype)
    return Tensor(buf.reshape(shape), **kwargs)

  @staticmethod
  def full(shape, fill_value, device: str | None = None, dtype: DType | str | None = None, **kwargs) -> Tensor:
    """A tensor of `shape` filled with `fill_value` (its dtype inferred from the value unless `dtype` is given).

    >>> Tensor.full((2, 3), 7).tolist()
    [[7, 7, 7], [7, 7, 7]]
    """
    shape = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
    dtype = _scalar_dtype(fill_value, _dtype_arg(dtype, "full") if dtype is not None else None, "full")
    const = UOp.const(dtype, fill_value, _canonical_device(device))
    return Tensor(const.reshape((1,) * len(shape)).expand(shape).unique(), **kwargs)

  @staticmethod
  def zeros(*shape, **kwargs) -> Tensor:
    """A tensor of zeros (float32 unless `dtype` is given).

    >>> Tensor.zeros(2, 3).tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    return Tensor.full(_shape_arg(shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})

  @staticmethod
  def ones(*shape, **kwargs) -> Tensor:
    """A tensor of ones."""
    return Tensor.full(_shape_arg(shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})

  def const_like(self, b) -> Tensor:
    """A tensor of this one's shape, dtype and device filled with `b` (converted to this dtype).

    >>> Tensor([1, 2, 3]).const_like(2.7).tolist()
    [2, 2, 2]
    """
    return Tensor.full(self.shape, b, device=self.device).cast(self.dtype)
  def full_like(self, fill_value, **kwargs) -> Tensor:
    """A tensor of this one's shape, dtype and device filled with `fill_value`."""
    return Tensor.full(self.shape, fill_value, **{"dtype": self.dtype, "device": self.device, **kwargs})
  def zeros_like(self, **kwargs) -> Tensor:
    """A tensor of zeros with this one's shape, dtype and device."""
    return self.full_like(0, **kwargs)
  def ones_like(self, **kwargs) -> Tensor:
    """A tensor of ones with this one's shape, dtype and device."""
    return self.full_like(1, **kwargs)

  @staticmethod
  def arange(start, stop=None, step=1, device: str | None = None, dtype: DType | str | None = None, **kwargs) -> Tensor:
    """Values from `start` up to (not including) `stop` by `step`, like torch.arange.

    >>> Tensor.arange(5).tolist()
    [0, 1, 2, 3, 4]
    >>> Tensor.arange(1, 10, 3).tolist()
    [1, 4, 7]
    """
    if stop is None: start, stop = 0, start
    if step == 0: raise TensorValueError(f"arange: step must not be 0{_where()}")
    count = max(0, math.ceil((stop - start) / step))
    dtype = _dtype_arg(dtype, "arange") if dtype is not None else dtypes.from_py([start, stop, step])
    iota = Tensor(UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=_canonical_device(device)),), count))
    return Tensor((iota.cast(dtype) * step + start).cast(dtype).uop.unique(), **kwargs)

  @staticmethod
  def linspace(start, stop, steps: int, **kwargs) -> Tensor:
    """`steps` evenly spaced values from `start` to `stop` inclusive."""
    if not isinstance(steps, int) or steps < 0:
      raise TensorValueError(f"linspace: steps must be a non-negative int, got {steps!r}{_where()}")
    if steps == 1: return Tensor.full((1,), float(start), **kwargs)
    dtype = _dtype_arg(kwargs.pop("dtype", dtypes.default_float), "linspace")
    if dtype == dtypes.bool: raise UnsupportedError(f"linspace: a bool dtype is not supported{_where()}")
    requires_grad = kwargs.pop("requires_grad", None)   # belongs on the result, not on the arange it is built from
    out = (Tensor.arange(steps, **kwargs).cast(dtypes.float32) * ((stop - start) / (steps - 1)) + start).cast(dtype)
    return Tensor(out.uop.unique(), requires_grad=requires_grad)

  @staticmethod
  def eye(n: int, m: int | None = None, **kwargs) -> Tensor:
    """An n x m identity matrix (n x n when m is None).

    >>> Tensor.eye(2).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    m = n if m is None else m
    if n < 0 or m < 0: raise TensorValueError(f"eye: sizes must be non-negative, got n={n}, m={m}{_where()}")
    dtype = kwargs.pop("dtype", dtypes.default_float)
    requires_grad = kwargs.pop("requires_grad", None)   # belongs on the result, not on the aranges it is built from
    rows, cols = Tensor.arange(n, **kwargs).reshape(n, 1), Tensor.arange(m, **kwargs).reshape(1, m)
    return Tensor((rows == cols).cast(dtype).uop.unique(), requires_grad=requires_grad)

  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Make the random functions reproducible: the same seed gives the same numbers on CPU, PYTHON and CUDA alike
    (devices of one kind with other indices, CPU:1 or CUDA:1, draw streams of their own, so shards differ).

    Resets every device's generator state in place, so a TinyJit capture that draws random numbers replays from the
    new seed too. Not allowed inside a TinyJit function (a replay would not repeat it)."""
    if _jit_calls:
      raise RuntimeError(f"manual_seed: called inside the TinyJit function {_jit_calls[0].name}; a replay would not "
                         f"reset the generator, so call it outside{_where()}")
    Tensor._seed = int(seed)
    for device, state in _rng_states.items():
      buf = state.uop.base.buffer
      buf.copyin(memoryview(_rng_initial_state(Tensor._seed, device)))
      _forget_results_computed_from(buf)

  @staticmethod
  def _random_bits(count: int, device: str) -> Tensor:
    """`count` pseudo-random uint32 values (realized) from a counter-based hash of (seed, counter, position).

    The counter and the seed's key live in a buffer per device ([counter, key]); each call reads the counter and
    advances it with an assign, both run now, so a TinyJit replay advances it too and draws what eager calls would."""
    pos = Tensor(UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=device),), count)).cast(dtypes.uint32)
    if count == 0: return pos
    state = _rng_state(device)
    # offset and key travel in a buffer, not as constants, so every call reuses one compiled kernel
    x = (pos + state[0]) ^ state[1]
    for _ in range(2):
      x = x ^ (x >> 16)
      x = x * 0x7FEB352D
      x = x ^ (x >> 15)
      x = x * 0x846CA68B
      x = x ^ (x >> 16)
    first = (Tensor(UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=device),), 2)) == 0).cast(dtypes.uint32)
    state.assign(state + first * (count & 0xFFFFFFFF))
    # realized together: the scheduler runs the read before the update, and no lazy graph is left reading a
    # counter that later calls overwrite
    Tensor.realize_all([x, state])
    return x

  @staticmethod
  def rand(*shape, device: str | None = None, dtype: DType | str | None = None, contiguous: bool = True,
           **kwargs) -> Tensor:
    """Uniform random values in [0, 1).

    `contiguous` is accepted for tinygrad scripts: kiln's random values are a lazy hash that fuses into its consumers.
    """
    shape, device = _shape_arg(shape), _canonical_device(device)
    if _multi.is_multi_device(device):
      raise ValueError(f"rand: random values are drawn on one device, not on {device}; draw them on one and shard them, "
                       f"or use rand_like of a sharded tensor{_where()}")
    dtype = _dtype_arg(dtype or dtypes.default_float, "rand")
    if not dtypes.is_float(dtype): raise UnsupportedError(f"rand: only float dtypes are supported, got {dtype}{_where()}")
    if is_symbolic_shape(shape):
      raise NotImplementedError(f"rand: shape {_fmt(shape)} has bound Variables; draw the largest shape and shrink it"
                                f"{_where()}")
    bits = Tensor._random_bits(prod(shape), device)
    values = (bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))
    return Tensor(values.reshape(shape).cast(dtype).uop, **kwargs)

  @staticmethod
  def randn(*shape, dtype: DType | str | None = None, **kwargs) -> Tensor:
    """Standard normal random values (Box-Muller)."""
    shape = _shape_arg(shape)
    requires_grad = kwargs.pop("requires_grad", None)
    u = Tensor.rand(2, *shape, **kwargs)
    radius = (-2.0 * (1.0 - u[0]).log()).sqrt()
    out = (radius * (u[1] * (2 * math.pi)).cos()).cast(_dtype_arg(dtype or dtypes.default_float, "randn"))
    return Tensor(out.uop, requires_grad=requires_grad)

  @staticmethod
  def uniform(*shape, low=0.0, high=1.0, **kwargs) -> Tensor:
    """Uniform random values in [low, high)."""
    dtype, requires_grad = kwargs.pop("dtype", dtypes.default_float), kwargs.pop("requires_grad", None)
    out = (Tensor.rand(*shape, **kwargs) * (high - low) + low).cast(dtype)
    return Tensor(out.uop, requires_grad=requires_grad)

  @staticmethod
  def normal(*shape, mean=0.0, std=1.0, **kwargs) -> Tensor:
    """Normal random values with `mean` and `std`."""
    requires_grad = kwargs.pop("requires_grad", None)
    return Tensor((Tensor.randn(*shape, **kwargs) * std + mean).uop, requires_grad=requires_grad)

  @staticmethod
  def scaled_uniform(*shape, **kwargs) -> Tensor:
    """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
    shape = _shape_arg(shape)
    return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs) * (prod(shape) ** -0.5)

  @staticmethod
  def glorot_uniform(*shape, **kwargs) -> Tensor:
    """Glorot/Xavier uniform initialization."""
    shape = _shape_arg(shape)
    bound = math.sqrt(6 / (shape[0] + prod(shape[1:])))
    return Tensor.uniform(*shape, low=-bound, high=bound, **kwargs)

  @staticmethod
  def kaiming_uniform(*shape, a: float = 0.01, **kwargs) -> Tensor:
    """Kaiming/He uniform initialization (fan-in mode)."""
    shape = _shape_arg(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shape[1:]))
    return Tensor.uniform(*shape, low=-bound, high=bound, **kwargs)

  @staticmethod
  def kaiming_normal(*shape, a: float = 0.01, **kwargs) -> Tensor:
    """Kaiming/He normal initialization (fan-in mode)."""
    shape = _shape_arg(shape)
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shape[1:]))
    return Tensor.normal(*shape, mean=0.0, std=std, **kwargs)

  def rand_like(self, **kwargs) -> Tensor:
    """Uniform random values in [0, 1) with this tensor's shape, dtype and device (and its layout over several
    devices: each slice drawn on its own device)."""
    if _multi.is_multi_device(self.device) and "device" not in kwargs:
      return self._multi_like(lambda shape, device: Tensor.rand(*shape, **{"device": device, "dtype": self.dtype, **kwargs}))
    return Tensor.rand(*self.shape, **{"device": self.device, "dtype": self.dtype, **kwargs})
  def randn_like(self, dtype: DType | str | None = None, requires_grad: bool | None = None, **kwargs) -> Tensor:
    """Standard normal random values with this tensor's shape and device, and its dtype unless `dtype` is given."""
    if _multi.is_multi_device(self.device) and "device" not in kwargs:
      return self._multi_like(lambda shape, device: Tensor.randn(*shape, device=device, dtype=dtype or self.dtype,
                                                                 **kwargs), requires_grad)
    return Tensor.randn(*self.shape, **{"device": self.device, "dtype": dtype or self.dtype,
                                        "requires_grad": requires_grad, **kwargs})

  # ---------------- conversion ----------------
  def cast(self, dtype: DType | str) -> Tensor:
    """The values converted to `dtype` (floats to ints truncate toward zero).

    >>> Tensor([1.7, -1.7]).cast("int32").tolist()
    [1, -1]
    """
    dtype = _dtype_arg(dtype, "cast")
    return self if self.dtype == dtype else Tensor._wrap(self.uop.cast(dtype), "cast")
  def float(self) -> Tensor:
    """This tensor cast to float32."""
    return self.cast(dtypes.float32)
  def half(self) -> Tensor:
    """This tensor cast to float16."""
    return self.cast(dtypes.float16)
  def double(self) -> Tensor:
    """This tensor cast to float64."""
    return self.cast(dtypes.float64)
  def bfloat16(self) -> Tensor:
    """This tensor cast to bfloat16."""
    return self.cast(dtypes.bfloat16)
  def int(self) -> Tensor:
    """This tensor cast to int32."""
    return self.cast(dtypes.int32)
  def long(self) -> Tensor:
    """This tensor cast to int64."""
    return self.cast(dtypes.int64)
  def short(self) -> Tensor:
    """This tensor cast to int16."""
    return self.cast(dtypes.int16)
  def bool(self) -> Tensor:
    """This tensor cast to bool (nonzero is True)."""
    return self.cast(dtypes.bool)

  def to(self, device: str | None) -> Tensor:
    """This tensor on `device` (a lazy copy; the same tensor if already there)."""
    device = _canonical_device(device)
    if device == self.device: return self
    if _multi.is_multi_device(self.device) and _multi.is_multi_device(device) and len(device) == len(self.device) \
       and self.uop.axis is not None:   # slices move to the new devices in order
      return self.to(self.device[0]).shard(device, self.uop.axis)
    out = Tensor._wrap(self.uop.copy_to(device), "to")
    out._requires_grad = self._requires_grad
    return out
  def to_(self, device: str | None) -> Tensor:
    """Move this tensor to `device` in place."""
    self.uop = self.to(device).uop
    return self

  def contiguous(self, **kwargs) -> Tensor:
    """Materialize this tensor in its own buffer when realized (tinygrad's extra keyword arguments are ignored)."""
    return Tensor._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), "contiguous")
  def contiguous_backward(self) -> Tensor:
    """Materialize the gradient flowing back through this point."""
    return Tensor._wrap(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)), "contiguous_backward")
  def detach(self) -> Tensor:
    """The same values, cut off from autograd."""
    return Tensor._wrap(UOp(Ops.DETACH, self.dtype, (self.uop,)), "detach")
  def clone(self) -> Tensor:
    """A copy in a new buffer."""
    return self.contiguous()

  def assign(self, x: Tensor | Any) -> Tensor:
    """Overwrite this tensor's values with `x` (a Tensor, scalar or list, broadcast to this shape and cast to this
    dtype, as PyTorch's copy_ and tinygrad). Lazy, like every op.

    >>> t = Tensor.zeros(2, 3).contiguous().realize()
    >>> t.assign(Tensor([1.0, 2.0, 3.0])).tolist()
    [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    """
    if _multi.is_multi_device(self.device): return self._assign_multi(x)
    if type(self.device) is str and self.device.startswith("DISK"):   # a file: the bytes are written through at once
      from kiln.mixin.disk import write_to_disk
      return write_to_disk(self, x)
    if type(x) in (int, float, bool) and self._assign_scalar_now(x): return self
    value = self._assign_value(x)
    target = self.uop
    if target.op is Ops.ASSIGN: target = target.src[0]   # a second pending update of the same buffer
    elif target.base.op is not Ops.BUFFER:
      owners = [t for t in _live_tensors if t is not self and t.uop is target.base] if target.base is not target else []
      if not owners:
        self.uop = value.uop   # not realized yet, and no other tensor holds it: nothing to overwrite
        return self
      # a view of another tensor's pending value (`b.assign(b + 10); b[2:].assign(x)`): that value is computed into
      # its buffer first, so the write lands there (and a pending assign is not lost behind this one)
      Tensor.realize_all(owners)
      target = substitute(target, {target.base: owners[0].uop})
    if not (target.op is Ops.BUFFER or target.op is Ops.RESHAPE and target.src[0].op is Ops.BUFFER):
      return self._assign_into_view(target, value)
    self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value.uop))
    return self

  def _assign_value(self, x: Tensor | Any) -> Tensor:
    """`x` as assign writes it: a Tensor of this shape (broadcast), device and dtype; TensorValueError for a shape
    that does not broadcast, RuntimeError for another device (as PyTorch)."""
    if isinstance(x, Tensor): value = x
    elif type(x) in (int, float, bool): value = Tensor.full(self.shape, x, device=self.device, dtype=self.dtype)
    else: value = Tensor(x, device=self.device, dtype=self.dtype)
    if not broadcasts_to(value.shape, self.shape):
      raise TensorValueError(f"assign: shape {_fmt(value.shape)} does not match the target's {_fmt(self.shape)} "
                             f"and does not broadcast to it{_where()}")
    value = value._broadcast_to(self.shape)
    if value.device != self.device:
      raise RuntimeError(f"assign: value on {value.device} but the target is on {self.device}{_where()}")
    return value if value.dtype == self.dtype else value.cast(self.dtype)

  def _assign_multi(self, x: Tensor | Any) -> Tensor:
    """assign for a tensor over several devices: each device's part is overwritten with its part of `x` (brought to
    this tensor's layout)."""
    value = self._assign_value(x)
    target = self.uop.src[0] if self.uop.op is Ops.ASSIGN else self.uop
    if not (target.op is Ops.MULTI and all(is_contiguous_buffer(s) for s in target.src)):
      owners = [t for t in _live_tensors if t is not self and t.uop is target]
      if not owners:
        self.uop = value.uop   # not realized yet, and no other tensor holds it: nothing to overwrite
        return self
      Tensor.realize_all(owners)
      target = owners[0].uop
    self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value.uop))
    _check_devices(self.uop, "assign")
    return self

  def _assign_scalar_now(self, x: int | float | bool) -> bool:
    """`assign(x)` of a Python scalar to a whole realized buffer, as a host copy of the value: a kernel would bake the
    value in as a constant and compile anew for every value (`opt.lr.assign(new_lr)` each step). Returns False
    (nothing done) where the kernel path is needed: inside TinyJit (a replay must repeat the write), requires_grad,
    views, symbolic shapes, and dtypes NumPy cannot round exactly like a kernel (float16, bfloat16, fp8)."""
    if _jit_calls or self.requires_grad or not (dtypes.is_int(self.dtype) or self.dtype in _HOST_SCALAR_DTYPES):
      return False
    target = self.uop
    if not (target.op is Ops.BUFFER or target.op is Ops.RESHAPE and target.src[0].op is Ops.BUFFER): return False
    buf = target.base.buffer
    if buf is None or buf._base is not None or is_symbolic_shape(self.shape): return False
    # PyTorch order: pending tensors that read the old values (or pending assigns to it) are computed first
    aliases: list[Tensor] = []
    if stale := _pending_readers([buf], {id(self)}, aliases): Tensor.realize_all(stale)
    value = np.full(buf.size, const_value(self.dtype, x), dtype=to_numpy_dtype(self.dtype))
    buf.copyin(memoryview(value.view(np.uint8)))
    # a new identity for the updated buffer, so nodes built on the old contents never look realized (as a kernel
    # assign does), and results computed from the old contents are forgotten
    fresh = UOp.new_buffer(target.base.arg[1], target.base.arg[2], self.dtype)
    fresh.buffer = buf
    self.uop = fresh if target.op is Ops.BUFFER else UOp(Ops.RESHAPE, self.dtype, (fresh,), target.arg)
    _forget_results_computed_from(buf)
    if aliases: _renew_identities(aliases, {target.base: fresh})
    return True

  def _assign_into_view(self, target: UOp, value: Tensor) -> Tensor:
    """Write `value` through a view of a realized buffer (`cache[:, pos:pos+1].assign(x)`), at once: other tensors
    over the same buffer read it directly, so the write must land before they are computed (as in PyTorch)."""
    node, has_pad = target, False
    while node.op in GroupOp.Movement:
      if node.op not in _WRITABLE_VIEW_OPS: break
      has_pad = has_pad or node.op is Ops.PAD
      node = node.src[0]
    if node.op in GroupOp.Movement or (has_pad and (node := _padding_read_by(target)) is not None):
      made = "pad whose padding the view reaches" if node.op is Ops.PAD else node.op.name.lower()
      raise NotImplementedError(f"{_user_op[0] or 'assign'}: assigning into a view made with {made} (shape "
                                f"{_fmt(self.shape)} of a buffer of {target.base.size} elements) is not supported; "
                                f"only reshape, shrink (slices, steps included), permute and flip views can be "
                                f"written{_where()}")
    self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value.uop))
    return self.realize()

  def replace(self, x: Tensor, allow_shape_mismatch: bool = False) -> Tensor:
    """Make this tensor hold `x`'s graph; the shapes must match unless `allow_shape_mismatch`."""
    if x.shape != self.shape and not allow_shape_mismatch:
      raise TensorValueError(f"replace: shape {_fmt(x.shape)} != {_fmt(self.shape)}{_where()}")
    self.uop = x.uop
    return self

  # ---------------- movement ----------------
  def reshape(self, shape=(), *args) -> Tensor:
    """The same elements in a new shape (a tuple, or the sizes as arguments); one axis may be -1 (inferred).

    >>> Tensor.arange(6).reshape(2, -1).tolist()
    [[0, 1, 2], [3, 4, 5]]
    """
    # the common case first (every size a known int >= 0, the same element count; ~1/3 of a matmul's graph
    # building went to the general checks below): anything else, errors included, takes the general path
    new = shape if type(shape) is tuple and not args else (shape, *args) if type(shape) is int else None
    if new is not None and all(type(s) is int and s >= 0 for s in new):
      old = self.uop.shape
      if all(type(s) is int for s in old) and prod(new) == prod(old):
        return self if new == old else Tensor._wrap(self.uop.reshape(new), "reshape")
    shape = (shape, *args)
    shape = tuple(s if s is not None else self.shape[i] for i, s in enumerate(_shape_arg(shape, allow_negative=True)))
    if shape.count(-1) > 1: raise TensorValueError(f"reshape: only one axis can be -1, got {_fmt(shape)}{_where()}")
    if is_symbolic_shape(shape) or is_symbolic_shape(self.shape): return self._reshape_symbolic(shape)
    if -1 in shape:
      known = prod(s for s in shape if s != -1)
      if known == 0 or self.numel() % known:
        raise TensorValueError(f"reshape: cannot reshape {_fmt(self.shape)} ({self.numel()} elements) to {_fmt(shape)}{_where()}")
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    if any(s < 0 for s in shape): raise TensorValueError(f"reshape: negative size in {_fmt(shape)}{_where()}")
    if prod(shape) != self.numel():
      raise TensorValueError(f"reshape: cannot reshape {_fmt(self.shape)} ({self.numel()} elements) to {_fmt(shape)} "
                             f"({prod(shape)} elements){_where()}")
    return self if shape == self.shape else Tensor._wrap(self.uop.reshape(shape), "reshape")
  def _reshape_symbolic(self, shape: tuple) -> Tensor:
    """reshape where the old or new shape holds expressions over bound Variables: the element counts must be the
    same expression (checked symbolically, not just at the bound values, so one kernel serves every value)."""
    if -1 in shape:
      known = prod(s for s in shape if not isinstance(s, int) or s != -1)
      shape = tuple(ssimplify(self.numel() // known) if isinstance(s, int) and s == -1 else s for s in shape)
    if not sint_eq(prod(shape), self.numel()):
      raise TensorValueError(f"reshape: cannot reshape {_fmt(self.shape)} ({sint_str(self.numel())} elements) to "
                             f"{_fmt(shape)} ({sint_str(prod(shape))} elements){_where()}")
    return self if shape == self.shape else Tensor._wrap(self.uop.reshape(shape), "reshape")
  def view(self, shape=(), *args) -> Tensor:
    """The same as reshape."""
    return self.reshape(shape, *args)

  def expand(self, shape=(), *args) -> Tensor:
    """Broadcast size-1 axes to `shape` (-1 keeps an axis); new axes may be added in front."""
    shape = _shape_arg((shape, *args), allow_negative=True)
    if len(shape) < self.ndim:
      raise TensorValueError(f"expand: cannot expand {_fmt(self.shape)} to fewer dimensions {_fmt(shape)}{_where()}")
    src = (1,) * (len(shape) - self.ndim) + self.shape
    new = tuple(s if t == -1 else t for s, t in zip(src, shape))
    for s, t in zip(src, new):
      if s != t and s != 1: raise TensorValueError(f"expand: cannot expand {_fmt(self.shape)} to {_fmt(shape)}{_where()}")
    return self._broadcast_to(new)

  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape or len(self.shape) == len(shape) and all(sint_eq(a, b) for a, b in zip(self.shape, shape)):
      return self
    uop = self.uop.reshape((1,) * (len(shape) - self.ndim) + self.shape)
    return Tensor._wrap(uop.expand(shape), "expand")

  def permute(self, order=(), *args) -> Tensor:
    """Reorder the axes: `order[i]` is the source axis of output axis i.

    >>> Tensor([[1, 2], [3, 4]]).permute(1, 0).tolist()
    [[1, 3], [2, 4]]
    >>> Tensor.arange(6).reshape(1, 2, 3).permute(2, 0, 1).shape
    (3, 1, 2)
    """
    order = tuple(order) if isinstance(order, (tuple, list)) and not args else (order, *args)
    if len(order) != self.ndim:
      raise TensorValueError(f"permute: {order} names {len(order)} axes but {_fmt(self.shape)} has {self.ndim}{_where()}")
    resolved = tuple(self._axis(a, "permute") for a in order)
    if sorted(resolved) != list(range(self.ndim)):
      raise TensorValueError(f"permute: {order} is not a permutation of the axes of {_fmt(self.shape)}{_where()}")
    return Tensor._wrap(self.uop.permute(resolved), "permute")

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    """Swap two axes."""
    order = list(range(self.ndim))
    a, b = self._axis(dim0, "transpose"), self._axis(dim1, "transpose")
    if self.ndim == 0: return self
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor:
    """This tensor with its axes in reverse order (the transpose of a matrix)."""
    return self.permute(tuple(reversed(range(self.ndim))))

  def flip(self, axis, *args) -> Tensor:
    """Reverse the order of elements along `axis` (an int, a tuple, or several ints as arguments)."""
    axis = tuple(axis) if isinstance(axis, (tuple, list)) and not args else (axis, *args)
    axes = tuple(self._axis(a, "flip") for a in axis)
    if len(set(axes)) != len(axes): raise TensorValueError(f"flip: repeated axis in {axis}{_where()}")
    if self.ndim == 0: return self
    return Tensor._wrap(self.uop.flip(axes), "flip")

  def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
    """Keep `[start, end)` of each axis (None keeps the whole axis)."""
    if len(arg) != self.ndim: raise TensorValueError(f"shrink: {len(arg)} bounds for a {self.ndim}-d tensor {_fmt(self.shape)}{_where()}")
    bounds = tuple((0, s) if b is None else (_bound_arg(b[0], "shrink"), _bound_arg(b[1], "shrink"))
                   for b, s in zip(arg, self.shape))
    if any(isinstance(x, UOp) for bound in bounds for x in bound) or is_symbolic_shape(self.shape):
      for (b, e), s in zip(bounds, self.shape):
        # checked over the Variables' whole ranges: the kernel is reused for every value they can be bound to
        if sint_min(b) < 0 or sint_min(ssub(e, b)) < 0 or sint_min(ssub(s, e)) < 0:
          raise TensorValueError(f"shrink: bounds {_fmt_bounds(bounds)} do not fit shape {_fmt(self.shape)} for every "
                                 f"value of their Variables (0 <= start <= end <= size must hold over each [min, max])"
                                 f"{_where()}")
      return Tensor._wrap(self.uop.shrink(bounds), "shrink")
    for (b, e), s in zip(bounds, self.shape):
      if not 0 <= b <= e <= s: raise TensorValueError(f"shrink: bounds {bounds} do not fit shape {_fmt(self.shape)}{_where()}")
    return Tensor._wrap(self.uop.shrink(bounds), "shrink")

  def squeeze(self, dim: int | None = None) -> Tensor:
    """Remove size-1 axes (all, or just `dim`)."""
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    axis = self._axis(dim, "squeeze")
    if self.ndim == 0: return self
    return self if self.shape[axis] != 1 else self.reshape(self.shape[:axis] + self.shape[axis + 1:])
  def unsqueeze(self, dim: int) -> Tensor:
    """Insert a size-1 axis at `dim`."""
    axis = dim + self.ndim + 1 if dim < 0 else dim
    if not 0 <= axis <= self.ndim: raise TensorIndexError(f"unsqueeze: dim {dim} out of range for {_fmt(self.shape)}{_where()}")
    return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge axes start_dim..end_dim into one."""
    if self.ndim == 0: return self.reshape(1)
    a, b = self._axis(start_dim, "flatten"), self._axis(end_dim, "flatten")
    return self.reshape(self.shape[:a] + (prod(self.shape[a:b + 1]),) + self.shape[b + 1:])

  def _axis(self, axis: int, op: str) -> int:
    """`axis` as a non-negative int (a 0-d tensor accepts 0 and -1 for its one implicit axis, as in PyTorch)."""
    ndim = max(self.ndim, 1)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -ndim <= axis < ndim:
      raise TensorIndexError(f"{op}: axis {axis!r} is out of range for shape {_fmt(self.shape)}{_where()}")
    return int(axis) + ndim if axis < 0 else int(axis)

  # ---------------- elementwise ----------------
  def _const_dtype(self, value) -> DType:
    """The dtype a Python scalar operand of this tensor gets (the tensor's own, unless a float meets ints or an int
    meets bools)."""
    dtype = self.dtype
    if isinstance(value, float) and not dtypes.is_float(dtype): return dtypes.default_float
    if isinstance(value, int) and not isinstance(value, bool) and dtype == dtypes.bool: return dtypes.default_int
    return dtype
  def _const_like(self, value) -> Tensor:
    # an operand wraps to the tensor's int type as in C and PyTorch (x + -1 on uint8, ~x as x ^ -1)
    return _tensor_around(UOp.const(self._const_dtype(value), value, self.device))

  def _broadcasted(self, other, op: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """Both operands as tensors of one dtype and one shape (PyTorch promotion and broadcasting)."""
    x = self
    if isinstance(other, Tensor):
      y = other
      x_uop, y_uop = x.uop, y.uop
      if y_uop.device != x_uop.device:
        raise RuntimeError(f"{op}: operands are on different devices, {x.device} and {y.device}{_where()}")
      # the common case (two tensors of one dtype and shape, as in a residual add): nothing to convert
      if x_uop.dtype is y_uop.dtype:
        x_shape, y_shape = x_uop.shape, y_uop.shape
        if x_shape == y_shape: return (y, x) if reverse else (x, y)
        # the next most common (a per-channel or bias operand of one dtype, int sizes): the nodes the general path
        # below builds, without its checks and Tensors (~1/3 of building a BatchNorm went to them)
        if (shape := _int_broadcast_shape(x_shape, y_shape)) is not None:
          x, y = _expanded_operand(x, shape), _expanded_operand(y, shape)
          return (y, x) if reverse else (x, y)
    elif isinstance(other, (int, float, bool, np.integer, np.floating)):
      value = other.item() if isinstance(other, np.generic) else other
      dtype, shape = x._const_dtype(value), x.uop.shape
      if dtype == x.uop.dtype and shape:
        # the common case (x * 0.5): no promotion, and the scalar broadcasts to x's shape. The same nodes the general
        # path below builds, without its checks, the constant's first two nodes kept (~11 of the ~18 us of x * 0.5)
        # (an operand only: not a live tensor, pending assigns need not know it)
        y = _tensor_around(_scalar_view(dtype, value, x.device, len(shape)).expand(shape))
        if y.uop.meta is None: _label(y.uop, "expand")
        return (y, x) if reverse else (x, y)
      y = _tensor_around(UOp.const(dtype, value, x.device))
    else: raise TypeError(f"{op}: unsupported operand type {type(other).__name__}{_where()}")
    if reverse: x, y = y, x
    if x.dtype != y.dtype:
      out_dtype = least_upper_dtype(x.dtype, y.dtype)
      x, y = x.cast(out_dtype), y.cast(out_dtype)
    if x.shape != y.shape:
      shape = _broadcast_shape(op, x.shape, y.shape)
      x, y = x._broadcast_to(shape), y._broadcast_to(shape)
    return x, y

  def _binary(self, op: Ops, other, name: str, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, name, reverse)
    return Tensor._wrap(x.uop.alu(op, y.uop), name)
  def _unary(self, op: Ops, name: str) -> Tensor: return Tensor._wrap(self.uop.alu(op), name)
  def _float_unary(self, op: Ops, name: str) -> Tensor:
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    return Tensor._wrap(x.uop.alu(op), name)

  def add(self, x, reverse: bool = False) -> Tensor:
    """Elementwise self + x, with broadcasting and type promotion (x + self if `reverse`)."""
    return self._binary(_ADD, x, "add", reverse)
  def sub(self, x, reverse: bool = False) -> Tensor:
    """Elementwise self - x (x - self if `reverse`); a TypeError for two bool operands."""
    if self.dtype == dtypes.bool and (not isinstance(x, Tensor) or x.dtype == dtypes.bool) and isinstance(x, (bool, Tensor)):
      raise UnsupportedError(f"sub: subtraction of bool tensors is not supported, use logical_xor{_where()}")
    return self._binary(Ops.SUB, x, "sub", reverse)
  def mul(self, x, reverse: bool = False) -> Tensor:
    """Elementwise self * x, with broadcasting and type promotion (x * self if `reverse`)."""
    return self._binary(_MUL, x, "mul", reverse)
  def div(self, x, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    """True division (ints become floats); rounding_mode 'trunc' or 'floor' as in PyTorch."""
    if rounding_mode not in (None, "trunc", "floor"):
      raise TensorValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}{_where()}")
    x, y = self._broadcasted(x, "div", reverse)
    if rounding_mode == "trunc":
      return Tensor._wrap(x.uop.alu(Ops.IDIV, y.uop), "div") if dtypes.is_int(x.dtype) else (x / y).trunc()
    if rounding_mode == "floor": return x // y
    if not dtypes.is_float(x.dtype): x, y = x.cast(dtypes.default_float), y.cast(dtypes.default_float)
    return Tensor._wrap(x.uop.alu(Ops.FDIV, y.uop), "div")
  def floordiv(self, x, reverse: bool = False) -> Tensor:
    """Division rounded toward negative infinity (Python and PyTorch `//`)."""
    x, y = self._broadcasted(x, "floordiv", reverse)
    if dtypes.is_float(x.dtype): return x._float_floordiv(y)
    if x.dtype == dtypes.bool: x, y = x.cast(dtypes.default_int), y.cast(dtypes.default_int)
    q = Tensor._wrap(x.uop.alu(Ops.IDIV, y.uop), "floordiv")
    r = Tensor._wrap(x.uop.alu(Ops.MOD, y.uop), "floordiv")
    needs_fix = (r != 0) & ((r < 0) != (y < 0))
    return needs_fix.where(q - 1, q)
  def mod(self, x, reverse: bool = False) -> Tensor:
    """Remainder with the sign of the divisor (Python and PyTorch `%`)."""
    x, y = self._broadcasted(x, "mod", reverse)
    if dtypes.is_float(x.dtype): return x._float_mod(y)
    if x.dtype == dtypes.bool: x, y = x.cast(dtypes.default_int), y.cast(dtypes.default_int)
    r = Tensor._wrap(x.uop.alu(Ops.MOD, y.uop), "mod")
    return ((r != 0) & ((r < 0) != (y < 0))).where(r + y, r)
  def pow(self, x, reverse: bool = False) -> Tensor:
    """Elementwise self ** x (x ** self if `reverse`)."""
    if not reverse and dtypes.is_int(self.dtype) and isinstance(x, int) and x < 0:
      raise TensorValueError(f"pow: integers to negative integer powers are not allowed ({self.dtype} ** {x}){_where()}")
    exponent = x if not reverse and isinstance(x, int) and not isinstance(x, bool) else None
    x, y = self._broadcasted(x, "pow", reverse)
    if not dtypes.is_float(x.dtype):
      # repeated squaring in the integer dtype, wrapping on overflow as PyTorch does (3 ** 21 in int32 is 1870418611)
      if x.dtype == dtypes.bool: x, y = x.cast(dtypes.default_int), y.cast(dtypes.default_int)
      if exponent is not None:   # a Python int: its bits are known, one multiply per bit
        result, square = x.full_like(1), x
        while exponent:
          if exponent & 1: result = result * square
          exponent >>= 1
          if exponent: square = square * square
        return result
      result, square, bits = x.full_like(1), x, y
      for _ in range(y.dtype.bitsize - (0 if dtypes.is_unsigned(y.dtype) else 1)):
        result = ((bits & 1) == 1).where(result * square, result)
        square, bits = square * square, bits >> 1
      if dtypes.is_unsigned(y.dtype): return result
      # negative exponents, as PyTorch's integer pow: 1 ** -n is 1, (-1) ** -n is +-1, anything else gives 0
      minus_one_power = ((y & 1) == 1).where(x.full_like(-1), x.full_like(1))
      negative_power = (x == 1).where(x.full_like(1), (x == -1).where(minus_one_power, x.full_like(0)))
      return (y < 0).where(negative_power, result)
    return Tensor._wrap(x.uop.alu(Ops.POW, y.uop), "pow")
  def maximum(self, x) -> Tensor:
    """Elementwise maximum (NaN propagates)."""
    return self._binary(Ops.MAX, x, "maximum")
  def minimum(self, x) -> Tensor:
    """Elementwise minimum (NaN propagates)."""
    x, y = self._broadcasted(x, "minimum")
    return x._inverse()._binary(Ops.MAX, y._inverse(), "minimum")._inverse()
  def _inverse(self) -> Tensor:
    """An order-reversing bijection: -x for floats, ~x for ints and bools (no overflow)."""
    return -self if dtypes.is_float(self.dtype) else ~self

  def __neg__(self) -> Tensor:
    if self.dtype == dtypes.bool: raise UnsupportedError(f"neg: negation of a bool tensor is not supported, use ~{_where()}")
    return self._unary(Ops.NEG, "neg") if dtypes.is_float(self.dtype) else self * -1
  def neg(self) -> Tensor:
    """Elementwise -x (a TypeError for bool tensors: use ~ or logical_not)."""
    return -self
  def __invert__(self) -> Tensor:
    if dtypes.is_float(self.dtype): raise UnsupportedError(f"invert: ~ needs an int or bool tensor, got {self.dtype}{_where()}")
    return self._binary(Ops.XOR, True if self.dtype == dtypes.bool else -1, "invert")
  def bitwise_not(self) -> Tensor:
    """Elementwise ~x: bitwise NOT of ints, logical NOT of bools (a TypeError for floats)."""
    return ~self
  def logical_not(self) -> Tensor:
    """Elementwise `not x` as a bool tensor (any nonzero value counts as true)."""
    return self.cast(dtypes.bool) != True  # noqa: E712
  def _bitwise(self, op: Ops, other, name: str, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, name, reverse)
    if dtypes.is_float(x.dtype): raise UnsupportedError(f"{name}: needs int or bool tensors, got {x.dtype}{_where()}")
    return Tensor._wrap(x.uop.alu(op, y.uop), name)
  def bitwise_and(self, x, reverse: bool = False) -> Tensor:
    """Elementwise bitwise AND of int or bool tensors (logical AND for bools)."""
    return self._bitwise(Ops.AND, x, "bitwise_and", reverse)
  def bitwise_or(self, x, reverse: bool = False) -> Tensor:
    """Elementwise bitwise OR of int or bool tensors (logical OR for bools)."""
    return self._bitwise(Ops.OR, x, "bitwise_or", reverse)
  def bitwise_xor(self, x, reverse: bool = False) -> Tensor:
    """Elementwise bitwise XOR of int or bool tensors."""
    return self._bitwise(Ops.XOR, x, "bitwise_xor", reverse)
  def lshift(self, x, reverse: bool = False) -> Tensor:
    """Elementwise self << x, for int tensors."""
    return self._bitwise(Ops.SHL, x, "lshift", reverse)
  def rshift(self, x, reverse: bool = False) -> Tensor:
    """Elementwise self >> x, for int tensors."""
    return self._bitwise(Ops.SHR, x, "rshift", reverse)

  # + and * straight to _binary, not through add/mul: each public method is wrapped (_with_user_location), and the
  # second wrapper was ~5% of building a transformer's graph
  def __add__(self, x) -> Tensor: return self._binary(_ADD, x, "add")
  def __radd__(self, x) -> Tensor: return self._binary(_ADD, x, "add", True)
  def __sub__(self, x) -> Tensor: return self.sub(x)
  def __rsub__(self, x) -> Tensor: return self.sub(x, True)
  def __mul__(self, x) -> Tensor: return self._binary(_MUL, x, "mul")
  def __rmul__(self, x) -> Tensor: return self._binary(_MUL, x, "mul", True)
  def __truediv__(self, x) -> Tensor: return self.div(x)
  def __rtruediv__(self, x) -> Tensor: return self.div(x, True)
  def __floordiv__(self, x) -> Tensor: return self.floordiv(x)
  def __rfloordiv__(self, x) -> Tensor: return self.floordiv(x, True)
  def __mod__(self, x) -> Tensor: return self.mod(x)
  def __rmod__(self, x) -> Tensor: return self.mod(x, True)
  def __pow__(self, x) -> Tensor: return self.pow(x)
  def __rpow__(self, x) -> Tensor: return self.pow(x, True)
  def __and__(self, x) -> Tensor: return self.bitwise_and(x)
  def __rand__(self, x) -> Tensor: return self.bitwise_and(x, True)
  def __or__(self, x) -> Tensor: return self.bitwise_or(x)
  def __ror__(self, x) -> Tensor: return self.bitwise_or(x, True)
  def __xor__(self, x) -> Tensor: return self.bitwise_xor(x)
  def __rxor__(self, x) -> Tensor: return self.bitwise_xor(x, True)
  def __lshift__(self, x) -> Tensor: return self.lshift(x)
  def __rshift__(self, x) -> Tensor: return self.rshift(x)
  def __matmul__(self, x) -> Tensor: return self.matmul(x)
  def __rmatmul__(self, x) -> Tensor: return (x if isinstance(x, Tensor) else Tensor(x, device=self.device)).matmul(self)

  def __iadd__(self, x): return self.assign(self + x)
  def __isub__(self, x): return self.assign(self - x)
  def __imul__(self, x): return self.assign(self * x)
  def __itruediv__(self, x): return self.assign(self / x)

  def __lt__(self, x) -> Tensor: return self._binary(Ops.CMPLT, x, "lt")
  def __gt__(self, x) -> Tensor: return self._binary(Ops.CMPLT, x, "gt", reverse=True)
  def __ge__(self, x) -> Tensor: return (self > x) | (self == x)   # not(<) would make NaN >= x true
  def __le__(self, x) -> Tensor: return (self < x) | (self == x)
  def __eq__(self, x) -> Tensor: return self._binary(Ops.CMPEQ, x, "eq")  # type: ignore[override]
  def __ne__(self, x) -> Tensor: return self._binary(Ops.CMPNE, x, "ne")  # type: ignore[override]
  def eq(self, x) -> Tensor:
    """Elementwise self == x as a bool tensor."""
    return self == x
  def ne(self, x) -> Tensor:
    """Elementwise self != x as a bool tensor."""
    return self != x

  def where(self, x, y) -> Tensor:
    """Select `x` where this (bool) tensor is true, else `y`, with broadcasting.

    >>> Tensor([True, False, True]).where(Tensor([1, 2, 3]), 0).tolist()
    [1, 0, 3]
    """
    cond = self.cast(dtypes.bool)
    if isinstance(x, Tensor): x, y = x._broadcasted(y, "where")
    elif isinstance(y, Tensor): y, x = y._broadcasted(x, "where")
    else:
      dtype = least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))
      x, y = Tensor.full((), x, device=self.device, dtype=dtype), Tensor.full((), y, device=self.device, dtype=dtype)
    if x.device != cond.device: raise RuntimeError(f"where: condition on {cond.device}, values on {x.device}{_where()}")
    shape = _broadcast_shape("where", cond.shape, x.shape, y.shape)
    cond, x, y = cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
    return Tensor._wrap(cond.uop.alu(Ops.WHERE, x.uop, y.uop), "where")
  def exp(self) -> Tensor:
    """Elementwise e**x (ints become floats); half types are computed in float32.

    Written as 2**(x * (1/ln2)), a small graph; software math (kiln/codegen/transcendental.py `exp_argument`) and
    the PYTHON device evaluate that form as e**x itself, within about 1 ulp."""
    return self._in_float(lambda x: (x * INV_LN2)._float_unary(Ops.EXP2, "exp"))
  def exp2(self) -> Tensor:
    """Elementwise 2**x (ints become floats)."""
    return self._float_unary(Ops.EXP2, "exp2")
  def log(self) -> Tensor:
    """Elementwise natural logarithm (ints become floats; half types computed in float32 and rounded once)."""
    return self._in_float(lambda x: x._float_unary(Ops.LOG2, "log") * math.log(2))
  def log2(self) -> Tensor:
    """Elementwise base-2 logarithm (ints become floats)."""
    return self._float_unary(Ops.LOG2, "log2")
  def sqrt(self) -> Tensor:
    """Elementwise square root (ints become floats)."""
    return self._float_unary(Ops.SQRT, "sqrt")
  def rsqrt(self) -> Tensor:
    """Elementwise 1 / sqrt(x) (half types computed in float32 and rounded once)."""
    return self._in_float(lambda x: x.sqrt().reciprocal())
  def reciprocal(self) -> Tensor:
    """Elementwise 1 / x (ints become floats)."""
    return self._float_unary(Ops.RECIP, "reciprocal")
  def sin(self) -> Tensor:
    """Elementwise sine of x in radians (ints become floats)."""
    return self._float_unary(Ops.SIN, "sin")
  def cos(self) -> Tensor:
    """Elementwise cosine of x in radians (ints become floats), accurate near its zeros (1 ulp on the CPU device)."""
    return self._in_float(lambda x: x._cos_accurate())
  def tan(self) -> Tensor:
    """Elementwise tangent of x in radians (ints become floats), accurate near its poles (1 ulp on the CPU device)."""
    return self._in_float(lambda x: x._tan_accurate())
  def trunc(self) -> Tensor:
    """Round toward zero (ints and bools are returned unchanged)."""
    return self._unary(Ops.TRUNC, "trunc") if dtypes.is_float(self.dtype) else self
  def floor(self) -> Tensor:
    """Round toward negative infinity (ints and bools are returned unchanged)."""
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> Tensor:
    """Round toward positive infinity (ints and bools are returned unchanged)."""
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def round(self) -> Tensor:
    """Round half to even, like PyTorch."""
    if not dtypes.is_float(self.dtype): return self
    down = self.floor()
    diff = self - down
    up_wins = (diff > 0.5) | ((diff == 0.5) & ((down * 0.5).floor() * 2 != down))
    rounded = up_wins.where(down + 1, down)
    # a zero result keeps the sign of x (round(-0.5) is -0.0): x * 0 is a zero with that sign
    return (rounded == 0).where(self * 0, rounded)
  def _as_float(self) -> Tensor: return self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
  def square(self) -> Tensor:
    """Elementwise x * x."""
    return self * self
  def abs(self) -> Tensor:
    """Elementwise absolute value |x| (abs(-0.0) is 0.0 and NaN stays NaN, as in PyTorch)."""
    # x*sign(x) has PyTorch's gradient (0 at 0 and at NaN); adding +0.0 turns the -0.0 it gives for -0.0 into 0.0
    return self * self.sign() + 0.0 if dtypes.is_float(self.dtype) else (self < 0).where(-self, self)
  def sign(self) -> Tensor:
    """Elementwise -1, 0 or 1 by the sign of x, in x's dtype (0 for NaN, as in PyTorch; bools unchanged)."""
    return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) if self.dtype != dtypes.bool else self
  def clip(self, min_=None, max_=None) -> Tensor:
    """Limit values to [min_, max_] (NaN stays NaN; the gradient passes at the bounds, as in torch.clamp)."""
    if min_ is None and max_ is None: raise TensorValueError(f"clip: at least one of min_ and max_ must be given{_where()}")
    x = self if min_ is None else (self < min_).where(min_, self)
    return x if max_ is None else (x > max_).where(max_, x)
  clamp = clip
  def isnan(self) -> Tensor:
    """True where x is NaN."""
    return self != self
  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    """True where x is +inf (if `detect_positive`) or -inf (if `detect_negative`); all False for non-floats."""
    return (self == math.inf) * detect_positive + (self == -math.inf) * detect_negative if dtypes.is_float(self.dtype) \
      else self.full_like(False, dtype=dtypes.bool)
  def lerp(self, end: Tensor, weight) -> Tensor:
    """Linear interpolation self + (end - self) * weight, like torch.lerp."""
    return self + (end - self) * weight

  # activations
  def relu(self) -> Tensor:
    """max(x, 0) with NaN kept and a zero gradient at 0, as in PyTorch.

    >>> Tensor([-1.0, 0.0, 2.0, float("nan")]).relu().tolist()
    [0.0, 0.0, 2.0, nan]
    """
    return ((self < 0) | (self == 0)).where(0, self)
  def sigmoid(self) -> Tensor:
    """Elementwise logistic function 1 / (1 + e**-x), with finite gradients for any finite x."""
    def fn(x: Tensor) -> Tensor:
      # exp of -|x| only: exp(100) = inf would make the gradient 0 * inf = NaN
      positive = x >= 0
      e = positive.where(-x, x).exp()
      # corrected for the rounding of 1 + e (its exact error is e - (d - 1), as e <= 1): n / (1 + e) is
      # q * (1 - error / d) to first order; float32 stays float32 (float64 lanes are not vectorized: 5x slower)
      d = 1 + e
      quotient = positive.where(1.0, e) / d
      return (quotient - quotient * ((e - (d - 1)) / d)).cast(x.dtype)
    return self._in_float(fn)
  def tanh(self) -> Tensor:
    """Elementwise hyperbolic tangent: an odd polynomial for |x| < 0.55, else 1 - 2e/(1 + e) with e = exp(-2|x|);
    one exp per element, within 1.5 ulp of the exact value (float32 and float64), finite gradients for any finite x.

    >>> round(Tensor([0.5]).tanh().item(), 5)
    0.46212
    """
    return self._in_float(_tanh_odd)
  def gelu(self) -> Tensor:
    """GELU with the tanh approximation (PyTorch's gelu(approximate='tanh'))."""
    return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
  def quick_gelu(self) -> Tensor:
    """The sigmoid approximation of GELU: x * sigmoid(1.702 * x)."""
    return self * (self * 1.702).sigmoid()
  def silu(self) -> Tensor:
    """SiLU (swish): x * sigmoid(x)."""
    return self * self.sigmoid()
  swish = silu
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
    """x where x > 0, else neg_slope * x (NaN kept; the slope at 0 is neg_slope, as in PyTorch)."""
    return (self > 0).where(self, self * neg_slope)
  def elu(self, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha * (e**x - 1) (the slope at 0 is alpha, as in PyTorch)."""
    positive = self > 0   # the exp of the branch not taken must stay finite, or its zero gradient becomes NaN
    return positive.where(self, alpha * positive.where(0.0, self._as_float())._expm1())
  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold (as in PyTorch); finite gradients."""
    x = self._as_float()
    scaled = x * beta
    # max(z, 0) + log1p(exp(-|z|)): the exp never overflows; both pieces split at z > 0 so the slope at 0 is 1/2
    positive = scaled > 0
    stable = positive.where(scaled, 0.0) + positive.where(-scaled, scaled).exp()._log1p()
    return (scaled > threshold).where(x, stable * (1 / beta))
  def relu6(self) -> Tensor:
    """Clip to [0, 6]: hardtanh(0, 6)."""
    return self.hardtanh(0, 6)
  def hardtanh(self, min_val=-1, max_val=1) -> Tensor:
    """Clip to [min_val, max_val] with a zero gradient at and beyond the bounds, as in PyTorch."""
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))

  # ---------------- reductions ----------------
  def _reduce_axes(self, axis, op: str) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    resolved = tuple(sorted({self._axis(a, op) for a in axes}))
    return resolved if self.ndim else ()   # the implicit axis of a 0-d tensor reduces nothing

  def _reduce(self, op: Ops, axis, keepdim: bool, name: str) -> Tensor:
    axes = self._reduce_axes(axis, name)
    out = Tensor._wrap(self.uop.r(op, axes), name)
    return out if keepdim else out._squeeze_axes(axes)

  def sum(self, axis=None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    """Sum over `axis` (all axes by default). Small ints and bools accumulate in int32; half floats in float32.

    Bools and ints narrower than 32 bits give int32 (uint32 if unsigned); floats keep their dtype. A given `dtype`
    is both the accumulator and the result dtype.

    >>> Tensor([[1, 2], [3, 4]]).sum(1).tolist()
    [3, 7]
    >>> Tensor([[1, 2], [3, 4]]).sum(0, keepdim=True).tolist()
    [[4, 6]]
    >>> Tensor([True, True, False]).sum().item()
    2
    """
    acc = _dtype_arg(dtype, "sum") if dtype is not None else _sum_dtype(self.dtype)
    x = self.cast(acc) if acc != self.dtype else self
    out = x._reduce(Ops.ADD, axis, keepdim, "sum")
    return out.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) and out.dtype != self.dtype else out
  def prod(self, axis=None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    """Product over `axis`. Accumulates like sum(); a given `dtype` is both the accumulator and the result dtype."""
    if dtype is not None: return self.cast(_dtype_arg(dtype, "prod"))._reduce(Ops.MUL, axis, keepdim, "prod")
    out = self.cast(_sum_dtype(self.dtype))._reduce(Ops.MUL, axis, keepdim, "prod")
    return out.cast(self.dtype) if dtypes.is_float(self.dtype) else out
  def max(self, axis=None, keepdim: bool = False) -> Tensor:
    """Maximum over `axis` (NaN propagates).

    >>> Tensor([[1, 5], [7, 2]]).max(0).tolist()
    [7, 5]
    >>> Tensor([[1, 5], [7, 2]]).max(1, keepdim=True).tolist()
    [[5], [7]]
    """
    self._check_nonempty_reduce(axis, "max")
    return self._reduce(Ops.MAX, axis, keepdim, "max")
  def _check_nonempty_reduce(self, axis, op: str) -> None:
    """max/min of nothing has no value: PyTorch raises, and so do we."""
    axes = self._reduce_axes(axis, op)
    kept = prod(s for a, s in enumerate(self.shape) if a not in axes)
    if prod(self.shape[a] for a in axes) == 0 and kept != 0:
      raise AxisError(f"{op}: cannot reduce over an empty axis of a tensor of shape {_fmt(self.shape)}{_where()}")
  def min(self, axis=None, keepdim: bool = False) -> Tensor:
    """Minimum over `axis`."""
    self._check_nonempty_reduce(axis, "min")
    return self._inverse()._reduce(Ops.MAX, axis, keepdim, "min")._inverse()
  def mean(self, axis=None, keepdim: bool = False) -> Tensor:
    """Mean over `axis` (ints give floats).

    >>> Tensor([[1, 2], [3, 4]]).mean(0).tolist()
    [2.0, 3.0]
    """
    x = self._as_float()
    count = prod(self.shape[a] for a in self._reduce_axes(axis, "mean"))
    total = x.sum(axis, keepdim, dtype=_sum_dtype(x.dtype))   # half sums stay float32 until divided (no overflow)
    # (a float total: the division div() would build, without its checks)
    out = total._binary(Ops.FDIV, count, "div") if count else total * math.nan
    return out if out.dtype == x.dtype else out.cast(x.dtype)
  def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """Variance over `axis` with Bessel's `correction`."""
    count = prod(self.shape[a] for a in self._reduce_axes(axis, "var"))
    def variance(x: Tensor) -> Tensor:
      centered = x - x.mean(axis, keepdim=True)
      return centered.square().sum(axis, keepdim) / max(count - correction, 0)
    # half squares overflow past 255.9 (PyTorch keeps the statistics in float32)
    return self._as_float()._in_float32_if_reduced(variance)
  def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """Standard deviation over `axis` with Bessel's `correction` (the square root of var)."""
    self._reduce_axes(axis, "std")
    def deviation(x: Tensor) -> Tensor:
      variance = x.var(axis, keepdim, correction)
      # PyTorch's gradient is 0 where the std is 0 (sqrt's own slope there is infinite)
      zero = variance == 0
      return zero.where(0.0, zero.where(1.0, variance).sqrt())
    return self._as_float()._in_float32_if_reduced(deviation)
  def any(self, axis=None, keepdim: bool = False) -> Tensor:
    """True where any element along `axis` is nonzero (False over an empty axis)."""
    return self.cast(dtypes.bool)._reduce(Ops.MAX, axis, keepdim, "any")
  def all(self, axis=None, keepdim: bool = False) -> Tensor:
    """True where every element along `axis` is nonzero (True over an empty axis)."""
    self._reduce_axes(axis, "all")
    return self.logical_not().any(axis, keepdim).logical_not()

  def argmax(self, axis=None, keepdim: bool = False) -> Tensor:
    """Index of the first maximum along `axis` (of the flattened tensor when axis is None); NaN counts as the maximum."""
    return self._argmax(axis, keepdim, "argmax")
  def _argmax(self, axis, keepdim: bool, op: str) -> Tensor:
    if axis is None:
      flat = self.flatten()._argmax(0, False, op)
      return flat.reshape((1,) * self.ndim) if keepdim else flat
    axis = self._axis(axis, op)
    if self.ndim == 0: return Tensor.full((), 0, device=self.device, dtype=dtypes.int32)
    n = self.shape[axis]
    if n == 0:
      raise AxisError(f"{op}: cannot reduce over the empty axis {axis} of shape {_fmt(self.shape)}{_where()}")
    # NaN is the maximum, as in PyTorch: where max() propagated one, only the NaNs compare as maxima
    is_max = (self == self.max(axis, keepdim=True)) | self.isnan()
    countdown = Tensor.arange(n, 0, -1, device=self.device).reshape((n,) + (1,) * (self.ndim - axis - 1))
    return (n - (is_max.where(countdown, 0)).max(axis, keepdim)).cast(dtypes.int32)
  def argmin(self, axis=None, keepdim: bool = False) -> Tensor:
    """Index of the first minimum along `axis` (of the flattened tensor when axis is None), as int32; NaN counts as it."""
    return self._inverse()._argmax(axis, keepdim, "argmin")

  def logsumexp(self, axis=None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) computed stably; ints give floats, half floats are summed in float32 and rounded once."""
    def stable(x: Tensor) -> Tensor:
      m = x._reduce(Ops.MAX, axis, True, "logsumexp").detach()
      m = m.isinf().where(0, m)
      out = (x - m).exp().sum(axis, keepdim=True).log() + m
      return out if keepdim else out._squeeze_axes(x._reduce_axes(axis, "logsumexp"))
    # x - max of an int tensor would wrap (int8 83 - -122): work in float, as PyTorch does
    return self._as_float()._in_float32_if_reduced(stable)
  def _squeeze_axes(self, axes) -> Tensor:
    """This tensor without the axes in `axes` (each must have size 1)."""
    old = self.uop.shape
    new = tuple([s for i, s in enumerate(old) if i not in axes])
    # (int sizes, the common case: what reshape does for them, without its public wrapper and checks)
    if all(type(s) is int for s in old): return self if new == old else Tensor._wrap(self.uop.reshape(new), "reshape")
    return self.reshape(new)
  def softmax(self, axis: int = -1, dtype: DType | None = None) -> Tensor:
    """exp(x) / sum(exp(x)) along `axis` (computed in `dtype` if given; half floats in float32, rounded once)."""
    def stable(x: Tensor) -> Tensor:
      e = (x - x._reduce(Ops.MAX, x._axis(axis, "softmax"), True, "softmax").detach()).exp()
      return e / e.sum(axis, keepdim=True)
    x = self._as_float() if dtype is None else self.cast(_dtype_arg(dtype, "softmax"))
    return x._in_float32_if_reduced(stable)
  def log_softmax(self, axis: int = -1, dtype: DType | None = None) -> Tensor:
    """log(softmax(x)) along `axis`, computed stably (in `dtype` if given; half floats in float32, rounded once)."""
    def stable(x: Tensor) -> Tensor:
      shifted = x - x._reduce(Ops.MAX, x._axis(axis, "log_softmax"), True, "log_softmax").detach()
      return shifted - shifted.exp().sum(axis, keepdim=True).log()
    x = self._as_float() if dtype is None else self.cast(_dtype_arg(dtype, "log_softmax"))
    return x._in_float32_if_reduced(stable)

  # ---------------- linear algebra ----------------
  def dot(self, w: Tensor, dtype: DType | str | None = None) -> Tensor:
    """Matrix product with PyTorch's rules for 1-d, 2-d and batched operands (also `matmul` and `@`).

    With `dtype`, both operands are cast to it first, so products and their sum are computed (and returned) in it.

    >>> (Tensor([[1, 2], [3, 4]]) @ Tensor([[5], [6]])).tolist()
    [[17], [39]]
    >>> Tensor([1, 2, 3]).dot(Tensor([4, 5, 6])).item()
    32
    """
    if not isinstance(w, Tensor): raise TypeError(f"matmul: expected a Tensor, got {type(w).__name__}{_where()}")
    if dtype is not None:
      dtype = _dtype_arg(dtype, "matmul")
      return self.cast(dtype).dot(w.cast(dtype))
    x_shape, w_shape = self.uop.shape, w.uop.shape
    if not x_shape or not w_shape:
      raise TensorValueError(f"matmul: both operands need at least one dimension, got {_fmt(self.shape)} @ {_fmt(w.shape)}{_where()}")
    if w.uop.device != self.uop.device: raise RuntimeError(f"matmul: operands on {self.device} and {w.device}{_where()}")
    k_self = x_shape[-1]
    k_w = w_shape[-2] if len(w_shape) > 1 else w_shape[0]
    if k_self != k_w:
      raise TensorValueError(f"matmul: inner dimensions differ, {_fmt(self.shape)} @ {_fmt(w.shape)} ({k_self} != {k_w}){_where()}")
    if len(x_shape) >= 2 and len(w_shape) >= 2 and self.uop.dtype is w.uop.dtype and \
       _sum_dtype(self.uop.dtype) is self.uop.dtype and all(type(s) is int for s in x_shape + w_shape):
      return Tensor._wrap(_matmul_graph(self.uop, w.uop), "matmul")
    x = self.reshape(*self.shape[:-1], *[1] * min(self.ndim - 1, w.ndim - 1, 1), k_self)
    wt = w.transpose(-1, -2) if w.ndim > 1 else w
    wt = wt.reshape(*wt.shape[:-2], *[1] * min(self.ndim - 1, w.ndim - 1, 1), *wt.shape[-min(w.ndim, 2):])
    x, wt = x._broadcasted(wt, "matmul")
    wide = _sum_dtype(x.dtype)
    if dtypes.is_float(x.dtype) and wide != x.dtype:
      # half products are exact in float32; they are summed there and the result rounded once, as in PyTorch
      return (x.cast(wide) * wt.cast(wide)).sum(-1).cast(x.dtype)
    return (x * wt).sum(-1)
  def matmul(self, x: Tensor, reverse: bool = False, dtype: DType | str | None = None) -> Tensor:
    """Matrix product self @ x (x @ self if `reverse`), computed in `dtype` if given; see dot.

    >>> Tensor([[1.0, 2.0]]).matmul(Tensor([[3.0], [4.0]]), dtype="float16").dtype
    dtypes.half
    """
    if not isinstance(x, Tensor): raise TypeError(f"matmul: expected a Tensor, got {type(x).__name__}{_where()}")
    return x.dot(self, dtype) if reverse else self.dot(x, dtype)
  def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
    """x @ weight + bias (weight is (in, out), as in tinygrad; a 1-d weight scales elementwise), computed in `dtype`."""
    if dtype is not None:
      dtype = _dtype_arg(dtype, "linear")
      return self.cast(dtype).linear(weight.cast(dtype), bias.cast(dtype) if bias is not None else None)
    out = self * weight if weight.ndim == 1 else self @ weight
    return out + bias if bias is not None else out
  def sequential(self, ll) -> Tensor:
    """Apply each callable in the list `ll` in turn, starting from this tensor."""
    x = self
    for layer in ll: x = layer(x)
    return x

  # ---------------- autograd ----------------
  def gradient(self, *targets: Tensor, gradient: Tensor | None = None, materialize_grads: bool = False) -> list[Tensor]:
    """Gradients of this (scalar) tensor with respect to `targets`, as lazy tensors.

    A target this tensor does not depend on (differentiably) is a RuntimeError, as in tinygrad and
    torch.autograd.grad, unless `materialize_grads` is True: then its gradient is zeros.

    >>> x = Tensor([1.0, 2.0])
    >>> [g.tolist() for g in (x * x).sum().gradient(x)]
    [[2.0, 4.0]]
    """
    return self._gradients(targets, gradient, materialize_grads)

  def _gradients(self, targets: Sequence[Tensor], gradient: Tensor | None, materialize_grads: bool,
                 order: list[UOp] | None = None) -> list[Tensor]:
    """Tensor.gradient; `order` is this tensor's gradient graph (whole or not) if the caller walked it already."""
    if gradient is None:
      if self.numel() != 1:
        raise RuntimeError(f"gradient: a non-scalar output of shape {_fmt(self.shape)} needs an explicit gradient{_where()}")
      gradient = Tensor.full(self.shape, 1.0, device=self.device, dtype=self.dtype)
    gradient = self._check_output_gradient(gradient)
    grads = compute_gradient(self.uop, gradient.uop, {t._grad_identity() for t in targets}, order)
    out = []
    for t in targets:
      g = grads.get(t._grad_identity())
      if g is None and not materialize_grads:
        raise RuntimeError(f"gradient: a target of shape {_fmt(t.shape)} is not in this tensor's graph (or only behind "
                           f"detach); pass materialize_grads=True for zeros{_where()}")
      out.append(Tensor._wrap(g, "gradient") if g is not None else t.zeros_like())
    return out

  def _check_output_gradient(self, gradient: Tensor) -> Tensor:
    """The gradient given for this output: a Tensor of its shape and device (TypeError / RuntimeError as in PyTorch),
    cast to its dtype."""
    if not isinstance(gradient, Tensor):
      raise TypeError(f"gradient: the gradient must be a Tensor, got {type(gradient).__name__}{_where()}")
    if gradient.shape != self.shape and not (len(gradient.shape) == len(self.shape) and
                                             all(sint_eq(a, b) for a, b in zip(gradient.shape, self.shape))):
      raise TensorValueError(f"gradient: the gradient of shape {_fmt(gradient.shape)} does not match the output's shape "
                             f"{_fmt(self.shape)}{_where()}")
    if gradient.device != self.device:
      raise RuntimeError(f"gradient: the gradient is on {gradient.device} but the output is on {self.device}{_where()}")
    return gradient if gradient.dtype == self.dtype else gradient.cast(self.dtype)

  def _grad_identity(self) -> UOp:
    """The node gradients accumulate at: the graph this tensor was realized from, if it remembers one."""
    node = self.uop
    while node.origin is not None: node = node.origin
    return node

  @gc_paused
  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into `t.grad` for every tensor t with requires_grad that this depends on. Returns self.

    >>> x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> loss = (x * x).sum()
    >>> _ = loss.backward()
    >>> x.grad.tolist()
    [2.0, 4.0, 6.0]
    """
    order = gradient_graph(self.uop)   # walked once: it finds the targets and orders the gradients
    targets = _targets_in_graph(order)
    if not targets: raise RuntimeError(f"backward: nothing in this graph requires a gradient{_where()}")
    # a target reached only through detach() gets zeros, not an error
    grads = self._gradients(targets, gradient, materialize_grads=True, order=order)
    for t, g in zip(targets, grads):
      if g.shape != t.shape: raise RuntimeError(f"backward: gradient shape {g.shape} != tensor shape {t.shape}")
      t.grad = g if t.grad is None else t.grad + g
    return self

  @staticmethod
  @contextmanager
  def train(mode: bool = True):
    """Context in which Tensor.training is `mode`."""
    previous, Tensor.training = Tensor.training, mode
    try: yield
    finally: Tensor.training = previous
  @staticmethod
  @contextmanager
  def test(mode: bool = True):
    """Context in which Tensor.training is `not mode` (evaluation mode by default)."""
    previous, Tensor.training = Tensor.training, not mode
    try: yield
    finally: Tensor.training = previous

class _NodeGroup:
  """Weak references to the nodes one realize run redirected to their results (a WeakSet costs ~2 us to make: its
  removal callbacks are not needed, dead references are skipped)."""
  __slots__ = ("refs",)
  def __init__(self, nodes: list[UOp]): self.refs = [weakref.ref(node) for node in nodes]
  def __iter__(self): return iter([node for ref in self.refs if (node := ref()) is not None])
  def __len__(self) -> int: return sum(ref() is not None for ref in self.refs)
  def alive(self) -> bool:
    """Whether a node of the group is still alive."""
    for ref in self.refs:
      if ref() is not None: return True
    return False

class _ComputedFrom:
  """The realized graph nodes computed from one buffer, iterated as nodes. Kept as groups that several buffers
  share (one per realize run for all its inputs), so registering a run's results under each of its many input
  buffers costs one append per buffer, not one per result and buffer."""
  __slots__ = ("groups", "prune_at")
  def __init__(self) -> None:
    self.groups: list[_NodeGroup] = []
    self.prune_at = 16
  def add_group(self, group: _NodeGroup) -> None:
    """Record the nodes of `group` (shared, not copied)."""
    self.groups.append(group)
    if len(self.groups) >= self.prune_at:   # groups whose nodes all died are dropped; amortized by doubling
      self.groups = [g for g in self.groups if g.alive()]
      self.prune_at = max(16, 2 * len(self.groups))
  def __iter__(self):
    return iter([node for group in list(self.groups) for node in group])

# realized graph nodes (whose `forward` points at their result) by the buffers they were computed from: each
# Buffer's `_computed` (None until a result is registered: a plain attribute, cheaper on every eager realize than a
# weak dictionary's Python-level get and set; bench/RESULTS.md)

def _results_of(buf: Buffer) -> _ComputedFrom:
  """The record of nodes computed from `buf`, made on first use."""
  if (found := buf._computed) is None: found = buf._computed = _ComputedFrom()
  return found

def _computed_from(buf: Buffer) -> _ComputedFrom | tuple:
  """The nodes computed from `buf` (an empty tuple when there are none)."""
  return buf._computed or ()

def _forget_results_computed_from(buf: Buffer) -> None:
  """`buf` was overwritten: results computed from its old contents no longer stand for their graphs, so a graph
  built later that happens to be the same node (hash-consing) is computed again instead of reusing them."""
  if (found := buf._computed) is None: return
  buf._computed = None
  for node in list(found): node.forward = None

# dtypes a Python scalar is written into by a host copy on assign (besides the ints): NumPy rounds them as kernels do
_HOST_SCALAR_DTYPES = (dtypes.float32, dtypes.float64, dtypes.bool)

def _forget_leaf_histories(realized: list[tuple[UOp, UOp]]) -> None:
  """Realized roots that are tensors requiring a gradient whose graphs reach no other such tensor (a parameter's
  initializer) are autograd leaves: their identity becomes a node without sources, so backward() no longer walks the
  initializer's graph (nor keeps it alive). The old root points there too, for graphs built on it before."""
  wanted = _grad_identities()
  leaves = [(old, new) for old, new in realized if old in wanted and new.origin is old and type(old.device) is str and
            not is_symbolic_shape(old.shape)]
  if not leaves: return
  # whether a node's graph (itself included) holds a tensor requiring a gradient, for every node under the roots: one
  # walk for all of them, not one per root (a model's first step realizes every parameter's initializer, and each
  # initializer's graph reaches the random generator's state through all the initializers before it: ResNet-50's 161
  # parameters walked ~0.9M nodes). A root's own result, changed below, is in no graph of this run's roots
  reaches: dict[UOp, bool] = {}
  for node in gradient_graph(UOp(Ops.SINK, dtypes.void, tuple(old for old, _ in leaves)), whole=True):
    reaches[node] = node in wanted or any(reaches[s] for s in ((node.origin,) if node.origin is not None else node.src))
  for old, new in leaves:
    if any(reaches[s] for s in ((old.origin,) if old.origin is not None else old.src)): continue
    identity = _leaf_identity(old)
    old.origin = new.origin = identity

def _leaf_identity(node: UOp) -> UOp:
  """A fresh node of `node`'s shape, dtype and device with no history: a buffer that is never allocated, only a name
  for autograd (the scheduler never sees it: it follows results, not `origin`)."""
  fresh = UOp.new_buffer(node.device, node.size, node.dtype)
  return fresh.reshape(node.shape) if node.shape != (node.size,) else fresh

def _origin_of(realized: UOp) -> UOp:
  """The node a realized root's result remembers for autograd: the root itself, or for an assign a new UNIQUE over
  its target's identity (the end of the target's `origin` chain). A UNIQUE passes its gradient on unchanged, as an
  assign passes it to its target, so gradients reach the target's history as before; being new, it is this
  update's own identity (two parameters' identities never contain each other), and a marker an earlier update made
  is looked through, so the chain stays one node long however many steps run."""
  if realized.op is not Ops.ASSIGN: return realized
  node = realized.src[0]
  while node.origin is not None: node = node.origin
  if node.op is Ops.UNIQUE and node in _assign_identities: node = node.src[0]
  marker = node.unique()
  _assign_identities.add(marker)
  return marker

# the UNIQUE markers _origin_of made (weakly held): only those are looked through
_assign_identities: weakref.WeakSet = weakref.WeakSet()

def _alias_view(view: UOp) -> UOp:
  """`view` (movement ops over a realized BUFFER node) over a new BUFFER node that shares the same storage."""
  base = view.base
  fresh = UOp.new_buffer(base.arg[1], base.arg[2], base.dtype)
  fresh.buffer = base.buffer
  return substitute(view, {base: fresh})

@deep_recursion
def _pending_readers(buffers, skip: set[int], aliases: list[Tensor] | None = None) -> list[Tensor]:
  """Live tensors (other than those in `skip`) that must be computed before `buffers` are overwritten: unrealized
  graphs reading one of them, and views of one of them that PyTorch would have copied (flip, pad, repeat), which
  become pending copies here. Views PyTorch aliases (slices, reshapes, permutes, expands) read the new values: they,
  and the realized tensors over one of `buffers` themselves, are appended to `aliases` when it is given."""
  found, wanted = [], {id(b) for b in buffers}
  reads: dict[UOp, bool] = {}   # node -> whether its graph reads one of `buffers`, each node decided once
  def reads_wanted(node: UOp) -> bool:   # by recursion: cheaper than a toposort per tensor
    if (known := reads.get(node)) is not None: return known
    if node.op is _BUFFER: found_read = id(node.buffer) in wanted
    else:
      found_read = False
      for src in node.src:
        if reads_wanted(src):
          found_read = True
          break
    reads[node] = found_read
    return found_read
  try:
    for t in list(_live_tensors):
      if id(t) in skip: continue
      view = t.uop
      if view.base.op is _BUFFER:
        if id(view.base.buffer) in wanted:
          if view.op in GroupOp.Movement and not _view_aliases_buffer(view):
            t.uop = UOp(Ops.CONTIGUOUS, view.dtype, (view,))
            found.append(t)
          elif aliases is not None: aliases.append(t)
        continue
      try: hit = reads_wanted(view)
      except RecursionError:   # deeper than the limit: the rest of this graph sources first, by an explicit stack
        for node in toposort([view], stop=lambda n: n in reads):
          if node not in reads:
            reads[node] = (node.op is _BUFFER and id(node.buffer) in wanted) or any(reads[s] for s in node.src)
        hit = reads[view]
      if hit: found.append(t)
  finally: reads_wanted = None   # noqa: F841  (the closure refers to itself: a cycle that kept the graph alive until GC)
  return found

def _new_identities_of_targets(roots: list[UOp], results: dict[UOp, UOp]) -> dict[UOp, UOp]:
  """The BUFFER node each assign root's target had -> the new node over the same storage its result has. A slice
  assign's target keeps its place for autograd: the new node's `origin` is the old node's (or the old node), so the
  gradients of graphs built before and after the assign reach one identity."""
  fresh_of: dict[UOp, UOp] = {}
  for root in roots:
    if root.op is not _ASSIGN: continue
    target = root.src[0]
    old_base, fresh = target.base, results[root].base
    if old_base.op is not _BUFFER or fresh.op is not _BUFFER or old_base in fresh_of: continue
    fresh_of[old_base] = fresh
    if fresh.origin is None and not is_contiguous_buffer(target):
      fresh.origin = old_base.origin if old_base.origin is not None else old_base
  return fresh_of

def _renew_identities(aliases: list[Tensor], fresh_of: dict[UOp, UOp]) -> None:
  """The realized tensors in `aliases` read buffers that were just overwritten: each moves from its old BUFFER node
  to a new node over the same storage (`fresh_of`'s, else one made here), as an assigned tensor does. A node
  computed from the old contents in the overwriting run (read before the write) keeps its result for the graphs
  built before, which hold it; the same expression built afterwards is over the new node, so it is another node and
  is computed from the new contents."""
  for t in aliases:
    view = t.uop
    base = view.base
    if base.op is not _BUFFER: continue
    if (fresh := fresh_of.get(base)) is None:
      fresh = fresh_of[base] = UOp.new_buffer(base.arg[1], base.arg[2], base.dtype)
      fresh.buffer = base.buffer
      fresh.origin = base.origin if base.origin is not None else base
    t.uop = fresh if view is base else substitute(view, {base: fresh})

def _view_aliases_buffer(view: UOp) -> bool:
  """Whether movement ops over a BUFFER are a strided view of it, as PyTorch's views are (every element at an
  unmasked index affine in the output indices, with no negative stride). A flip, a pad, a repeat or a reshape of a
  transpose is not: PyTorch copies those, so they keep the values they were built from."""
  if is_symbolic_shape(view.shape) or 0 in view.shape: return True
  from kiln.uop.pattern import graph_rewrite, substitute
  from kiln.codegen.lowerer import index_of, lowerer, LowerContext, TRUE, iconst
  base = view.base
  param = UOp(Ops.RESHAPE, base.dtype, (UOp(Ops.DEFINE_GLOBAL, base.dtype, (), 0),), (base.arg[2],))
  ctx = LowerContext()
  ranges = [iconst(0) if s == 1 else ctx.new_range(s) for s in view.shape]
  load = graph_rewrite(index_of(substitute(view, {base: param}), TRUE, ranges), lowerer, ctx, name="view alias")
  if load.op is not Ops.LOAD or len(load.src) == 3 and load.src[2].vmin is not True: return False
  stack = [load.src[1]]
  while stack:
    node = stack.pop()
    if node.op is Ops.ADD: stack.extend(node.src)
    elif node.op is Ops.MUL and node.src[1].op is Ops.CONST and node.src[1].arg >= 0: stack.append(node.src[0])
    elif node.op not in (Ops.RANGE, Ops.CONST): return False
  return True

def _grad_identities() -> set[UOp]:
  """The nodes gradients accumulate at, of every live tensor that requires a gradient."""
  wanted = set()
  for ref in list(_requires_grad_tensors.data):   # the WeakSet's refs: much cheaper than its iterator
    t = ref()
    if t is None: continue
    node = t.uop
    while node.origin is not None: node = node.origin
    wanted.add(node)
  return wanted

def _targets_in_graph(order: list[UOp]) -> list[Tensor]:
  """The live tensors requiring a gradient whose identity is in the graph of `order` (a gradient_graph), or in the
  parts of it behind ops without gradients (detach), which gradient_graph leaves out (walked only when a tensor
  requiring a gradient is not in `order`)."""
  graph = set(order)
  candidates = [(t, t._grad_identity()) for t in list(_requires_grad_tensors)]
  if any(identity not in graph for _, identity in candidates):
    hidden = [s for node in order if node.origin is None and node.op in NO_GRADIENT for s in node.src if s not in graph]
    if hidden: graph.update(gradient_graph(UOp(Ops.SINK, dtypes.void, tuple(hidden)), whole=True))
  return [t for t, identity in candidates if identity in graph]

@deep_recursion
def _graphs_needing_gradients(roots: list[UOp]) -> set[UOp]:
  """The roots whose graphs contain a tensor that requires a gradient (empty when no tensor does). An assign's
  gradient flows to its target alone, so only the assign itself (a pending update of a tensor requiring a gradient
  is that tensor's identity) and its target's graph count: an optimizer's momentum update reads the gradients, so
  its whole graph reaches the parameters, but nothing needs its history."""
  if not _requires_grad_tensors: return set()
  wanted = _grad_identities()
  graph_of = {root: root.src[0] if root.op is _ASSIGN else root for root in roots}
  reached: dict[UOp, bool] = {}
  def reaches(node: UOp) -> bool:   # by recursion, each node once: cheaper than a toposort for an eager graph
    if (known := reached.get(node)) is not None: return known
    found = node in wanted
    if not found:
      for src in ((node.origin,) if node.origin is not None else node.src):
        if reaches(src):
          found = True
          break
    reached[node] = found
    return found
  try: return {root for root, graph in graph_of.items() if root in wanted or reaches(graph)}
  except RecursionError: pass   # a graph deeper than the recursion limit: one iterative pass instead
  finally: reaches = None   # noqa: F841  (the closure refers to itself: a cycle that kept the graph alive until GC)
  reaching: set[UOp] = set()   # one pass over all roots' graphs, not one walk per root
  for node in gradient_graph(UOp(Ops.SINK, dtypes.void, tuple(graph_of.values())), whole=True):
    if node in wanted or any(s in reaching for s in ((node.origin,) if node.origin is not None else node.src)):
      reaching.add(node)
  return {root for root, graph in graph_of.items() if root in wanted or graph in reaching}

def _matmul_graph(x: UOp, w: UOp) -> UOp:
  """x @ w for operands of 2+ axes of int sizes and one dtype that sums in itself: the nodes Tensor.dot's general path
  builds (x as (..., n, 1, k) times w's transpose as (..., 1, m, k), summed over k) without its Tensor-level steps
  (~40% of building a transformer's graph went to them); the nodes it would wrap in Tensors get its labels."""
  x_shape, w_shape = x.shape, w.shape
  ndim_w = len(w_shape)
  wrapped = [x.reshape(x_shape[:-1] + (1, x_shape[-1]))]
  wrapped.append(w.permute(tuple(range(ndim_w - 2)) + (ndim_w - 1, ndim_w - 2)))
  wrapped.append(wrapped[-1].reshape(w_shape[:-2] + (1, w_shape[-1], w_shape[-2])))
  shape = _broadcast_shape("matmul", wrapped[0].shape, wrapped[2].shape)
  operands = []
  for u in (wrapped[0], wrapped[2]):
    if u.shape != shape: wrapped.append(u := u.reshape((1,) * (len(shape) - len(u.shape)) + u.shape).expand(shape))
    operands.append(u)
  wrapped.append(operands[0].alu(_MUL, operands[1]))
  wrapped.append(wrapped[-1].r(_ADD, (len(shape) - 1,)))
  for node in wrapped: node.shape   # noqa: B018 -- in order, each from its sources' (later: a graph walk per node)
  wrapped.append(out := wrapped[-1].reshape(shape[:-1]))
  if TRACEBACK_SOURCE.value:
    for node in wrapped:
      if node.meta is None and node is not x and node is not w: node.meta = _user_op[2] or _op_label("matmul")
  return out

def _sum_dtype(dt: DType) -> DType:
  if dt == dtypes.bool or (dtypes.is_int(dt) and dt.itemsize < 4): return dtypes.uint32 if dtypes.is_unsigned(dt) else dtypes.int32
  if dt in dtypes.narrow_floats: return dtypes.float32
  return dt

def _mix32(x: int) -> int:
  x ^= x >> 16; x = (x * 0x7FEB352D) & 0xFFFFFFFF; x ^= x >> 15; x = (x * 0x846CA68B) & 0xFFFFFFFF; x ^= x >> 16  # noqa: E702
  return x

# the random generator's state per device: a realized uint32 tensor [counter, key] (see Tensor._random_bits)
_rng_states: dict[str, Tensor] = {}

def _rng_initial_state(seed: int, device: str) -> np.ndarray:
  """[counter 0, the key mixed from `seed` and the device's index] as the bytes a state buffer holds: the devices of
  one kind draw streams of their own (CPU:1 not CPU:2's), while CPU, PYTHON and CUDA (index 0) draw the same one."""
  index = device.partition(":")[2]
  offset = int(index) * 0x632BE5AB if index.isdigit() else 0
  return np.array([0, _mix32((seed * 0x9E3779B9 + 0x7F4A7C15 + offset) & 0xFFFFFFFF)], dtype=np.uint32)

def _rng_state(device: str) -> Tensor:
  """The generator state of `device`, created from the current seed on first use."""
  state = _rng_states.get(device)
  if state is None:
    state = _rng_states[device] = Tensor(_rng_initial_state(Tensor._seed, device), device=device)
  return state

def _shape_arg(shape, allow_negative: bool = False) -> tuple[int, ...]:
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  out = []
  for s in shape:
    if s is None and allow_negative: out.append(None); continue
    if isinstance(s, UOp):
      out.append(_symbolic_size(s, shape))
      continue
    if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
      raise TypeError(f"shape entries must be ints, got {s!r} in {shape}{_where()}")
    if s < 0 and not (allow_negative and s == -1): raise TensorValueError(f"negative size {s} in shape {tuple(shape)}{_where()}")
    out.append(int(s))
  return tuple(out)

def _bound_arg(x, op: str) -> int | UOp:
  """A start/end/amount argument of a movement op: an int, or an int expression over bound Variables."""
  if isinstance(x, UOp): return _symbolic_size(x, (x,), allow_negative=True)
  return int(x)

def _fmt_bounds(bounds) -> str:
  return "(" + ", ".join(f"({sint_str(b)}, {sint_str(e)})" for b, e in bounds) + ")"

def _symbolic_size(s: UOp, shape, allow_negative: bool = False) -> int | UOp:
  """A shape entry given as a UOp: an int expression over bound Variables, simplified (a constant becomes an int)."""
  if not dtypes.is_int(s.dtype) or any(u.op not in _SIZE_OPS for u in s.toposort()):
    raise TypeError(f"shape entries must be ints or int expressions over bound Variables, got {sint_str(s)} in "
                    f"{_fmt(shape)}{_where()}")
  for u in s.toposort():
    if u.op is Ops.DEFINE_VAR and not any(b.op is Ops.BIND and b.src[0] is u for b in s.toposort()):
      raise TensorValueError(f"shape entry {sint_str(s)} uses the unbound Variable {u.arg[0]!r}; pass "
                             f"Variable(...).bind(value){_where()}")
  s = ssimplify(s)
  if allow_negative: return s
  if isinstance(s, UOp) and sint_min(s) < 0:
    raise TensorValueError(f"shape entry {sint_str(s)} can be negative (its smallest value is {sint_min(s)}){_where()}")
  if not isinstance(s, UOp) and s < 0: raise TensorValueError(f"negative size {s} in shape {_fmt(shape)}{_where()}")
  return s

# views whose elements map one-to-one onto buffer elements, so writing through them is well defined (a PAD only where
# the view never reads its padding: `_padding_read_by`)
_WRITABLE_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP, Ops.PAD})
_SIZE_OPS = frozenset({Ops.BIND, Ops.DEFINE_VAR, Ops.CONST, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX})

def _reshape_ranges(ranges: list[tuple[int, int]], shape: tuple[int, ...], src_shape: tuple[int, ...]) \
    -> list[tuple[int, int]]:
  """Index ranges (first, last) per axis of `shape` -> ranges on `src_shape` that hold every index they reach through
  a reshape (exact on splits; a merged axis whose run of rows is partial gets its whole range)."""
  out: list[tuple[int, int]] = []
  i = j = 0
  while i < len(shape) or j < len(src_shape):
    if i == len(shape) or j == len(src_shape):   # trailing size-1 axes
      if j < len(src_shape): out.append((0, 0))
      i, j = min(i + 1, len(shape)), min(j + 1, len(src_shape))
      continue
    # a group of axes of both shapes holding the same elements
    i_end, j_end, size, src_size = i + 1, j + 1, shape[i], src_shape[j]
    while size != src_size:
      if size < src_size: size, i_end = size * shape[i_end], i_end + 1
      else: src_size, j_end = src_size * src_shape[j_end], j_end + 1
    first = last = 0
    for axis in range(i, i_end):
      first, last = first * shape[axis] + ranges[axis][0], last * shape[axis] + ranges[axis][1]
    for axis in range(j, j_end):
      inner = prod(src_shape[axis + 1:j_end])
      lo, hi = first // inner, last // inner
      out.append((lo, hi))
      if lo != hi:   # the rows differ: the inner axes can take any value
        out.extend((0, d - 1) for d in src_shape[axis + 1:j_end])
        break
      first, last = first % inner, last % inner
    i, j = i_end, j_end
  return out

def _all_ints(arg) -> bool:
  """No Variable anywhere in `arg` (nested tuples of sizes)."""
  return all(_all_ints(a) for a in arg) if isinstance(arg, tuple) else type(arg) is int

def _first_pad(node: UOp) -> UOp | None:
  """The first PAD in `node`'s chain of movement ops."""
  while node.op in GroupOp.Movement and node.op is not Ops.PAD: node = node.src[0]
  return node if node.op is Ops.PAD else None

def _padding_read_by(view: UOp) -> UOp | None:
  """The PAD in `view`'s chain of movement ops whose padding some element of `view` reads, or None. A step slice pads
  an axis to a multiple of the step and then keeps only the first of each step, so it reads no padding: writing
  through it is well defined. Found from per-axis index ranges; a symbolic shape counts as reading its padding."""
  if not _all_ints(view.shape): return _first_pad(view)
  if 0 in view.shape: return None
  ranges = [(0, d - 1) for d in view.shape]
  node = view
  while node.op in GroupOp.Movement:
    src = node.src[0]
    if not _all_ints((src.shape, node.arg)): return _first_pad(node)
    if node.op is Ops.RESHAPE: ranges = _reshape_ranges(ranges, node.shape, src.shape)
    elif node.op is Ops.SHRINK: ranges = [(lo + b, hi + b) for (lo, hi), (b, _) in zip(ranges, node.arg)]
    elif node.op is Ops.PAD:
      ranges = [(lo - before, hi - before) for (lo, hi), (before, _) in zip(ranges, node.arg)]
      if any(lo < 0 or hi >= d for (lo, hi), d in zip(ranges, src.shape)): return node
    elif node.op is Ops.PERMUTE:
      moved: list[tuple[int, int]] = [(0, 0)] * len(ranges)
      for out_axis, src_axis in enumerate(node.arg): moved[src_axis] = ranges[out_axis]
      ranges = moved
    elif node.op is Ops.FLIP:
      ranges = [(d - 1 - hi, d - 1 - lo) if axis in node.arg else (lo, hi)
                for axis, ((lo, hi), d) in enumerate(zip(ranges, src.shape))]
    else: return None   # EXPAND: refused by the caller
    node = src
  return None

def _scalar_dtype(value, dtype: DType | None, op: str) -> DType:
  """The dtype a Python scalar becomes: `dtype`, which must hold it, or its default (int64 for ints too big for int32)."""
  if dtype is None:
    dtype = dtypes.from_py(value)
    if dtype == dtypes.default_int and not dtypes.min(dtype) <= value <= dtypes.max(dtype): dtype = dtypes.int64
  if dtypes.is_int(dtype) and not isinstance(value, float) and not dtypes.min(dtype) <= value <= dtypes.max(dtype):
    raise TensorValueError(f"{op}: value {value} does not fit {dtype}{_where()}")
  return dtype

def _array_from_list(data, dtype: DType | None) -> tuple[np.ndarray, DType]:
  """A nested list as a numpy array, and the dtype its tensor has (`dtype`, else inferred from the values; a
  bfloat16 or fp8 tensor's values come as float32, cast on the device)."""
  try:
    arr = np.array(data)
  except ValueError as e:
    raise TensorValueError(f"Tensor: ragged nested lists cannot form a tensor ({e}){_where()}") from None
  if arr.dtype == object: raise TypeError(f"Tensor: cannot make a tensor from a list of {type(data[0]).__name__}{_where()}")
  inferred = dtype is None
  if inferred: dtype = dtypes.from_py(list(data)) if arr.size else dtypes.default_float
  if dtypes.is_int(dtype) and arr.size and arr.dtype.kind in "iu":
    lo, hi = int(arr.min()), int(arr.max())
    if not dtypes.min(dtype) <= lo <= hi <= dtypes.max(dtype):
      # like NumPy, a Python int too large for the default int widens; an explicit dtype that cannot hold it is an error
      if inferred and dtypes.min(dtypes.int64) <= lo <= hi <= dtypes.max(dtypes.int64): dtype = dtypes.int64
      else: raise TensorValueError(f"Tensor: value {hi if hi > dtypes.max(dtype) else lo} does not fit {dtype}{_where()}")
  if dtype in (dtypes.bfloat16, *dtypes.fp8s): return arr.astype(np.float32), dtype   # no numpy type: cast on device
  return arr.astype(to_numpy_dtype(dtype)), dtype

def _uop_from_file(path: pathlib.Path) -> UOp:
  """A uint8 BUFFER node over the bytes of the file at `path`, on DISK:<absolute path> (the file is not opened)."""
  try: size = os.stat(path).st_size
  except OSError as e: raise TensorValueError(f"Tensor: cannot open file {str(path)!r}: {e.strerror}{_where()}") from None
  device = f"DISK:{os.path.abspath(path)}"
  buf = UOp.new_buffer(device, size, dtypes.uint8)
  buf.buffer = Buffer(device, size, dtypes.uint8)
  return buf

def _uop_from_numpy(arr: np.ndarray, device: str, dtype: DType | None) -> UOp:
  if arr.dtype.kind not in "biuf": raise TypeError(f"Tensor: numpy dtype {arr.dtype} is not supported{_where()}")
  src_dtype = from_numpy_dtype(arr.dtype)
  arr = np.asarray(arr, order="C")   # keeps 0-d arrays 0-d, unlike ascontiguousarray
  buf = UOp.new_buffer(device, arr.size, src_dtype)
  buf.buffer = Buffer(device, arr.size, src_dtype)
  if arr.size: buf.buffer.copyin(memoryview(arr.reshape(-1).view(np.uint8)))
  out = buf.reshape(arr.shape)
  return out.cast(dtype) if dtype is not None and dtype != src_dtype else out

# ---------------- errors at the user's line ----------------
# Every public Tensor method reports a bad argument as an error that names the method and the user's file:line, even
# when the problem surfaces inside a helper (a raw TypeError from int(), a NotImplementedError, ...). Messages that
# already carry a location pass through untouched.
_LOCATED_ERRORS = (TypeError, ValueError, IndexError, RuntimeError)

# the public method the user called (outermost), so nodes built inside it are labelled with it in DEBUG output, the
# user's file:line for that call, found once per call (a frame walk) when the first node needs it, and the label
# "name file:line" itself, formatted once per call (a graph's every node gets it)
# [3]: the frame that called the public method in progress (the user's, mostly): the walk for its location starts
# there instead of at the node being built, a few kiln frames deeper
_user_op: list = [None, None, None, None]

def _user_location() -> str:
  """The user's 'file.py:LINE' for the public method in progress (looked up once per outermost call)."""
  if _user_op[0] is None: return user_frame_location()
  if _user_op[1] is None: _user_op[1] = _frame_location(_user_op[3])
  return _user_op[1]

def _frame_location(frame) -> str:
  """helpers.user_frame_location from `frame` outward: 'file.py:LINE' of the first frame outside the kiln package."""
  names = _user_file_names
  while frame is not None:
    filename = frame.f_code.co_filename
    if (name := names.get(filename, "")) == "": return user_frame_location()   # a file not classified yet
    if name is not None: return f"{name}:{frame.f_lineno}"
    frame = frame.f_back
  return ""

def _op_label(name: str) -> str:
  """'op file:LINE' for a node built now: the public method in progress (remembered for its later nodes), else
  `name` (a node built outside any public method)."""
  if _user_op[0] is None: return f"{name} {user_frame_location()}".strip()
  label = _user_op[2] = f"{_user_op[0]} {_user_location()}".strip()
  return label

_NOT_SAVED = object()

# (dtype, value, device, ndim) -> a scalar CONST reshaped to `ndim` ones: the start of every broadcast Python-scalar
# operand (x * 0.5). Kept, so the next op with that scalar finds its nodes instead of building them (hash-consing
# alone forgets them once a graph is realized). Neither node ever gets metadata: that goes on the EXPAND after them.
_scalar_views: dict[tuple, UOp] = {}
_SCALAR_VIEWS_MAX = 4096

def _scalar_view(dtype: DType, value, device: str, ndim: int) -> UOp:
  """UOp.const(dtype, value, device) reshaped to `ndim` ones (ndim >= 1), from the cache when it is there."""
  # floats by their bits: 0.0 and -0.0 are equal keys in a dict, and NaN is no key at all
  key = (dtype, type(value), value.hex() if type(value) is float else value, device, ndim)
  if (view := _scalar_views.get(key)) is None:
    if len(_scalar_views) >= _SCALAR_VIEWS_MAX: _scalar_views.clear()
    view = _scalar_views[key] = UOp.const(dtype, value, device).reshape((1,) * ndim)
  return view

def _int_broadcast_shape(x_shape: tuple, y_shape: tuple) -> tuple[int, ...] | None:
  """The shape two shapes of int sizes broadcast to (NumPy's rule), None for symbolic sizes or sizes that do not
  broadcast (the general path handles both)."""
  if len(x_shape) != len(y_shape):
    ndim = max(len(x_shape), len(y_shape))
    x_shape, y_shape = (1,) * (ndim - len(x_shape)) + x_shape, (1,) * (ndim - len(y_shape)) + y_shape
  out = []
  for a, b in zip(x_shape, y_shape):
    if type(a) is not int or type(b) is not int: return None
    if a == b or b == 1: out.append(a)
    elif a == 1: out.append(b)
    else: return None
  return tuple(out)

def _expanded_operand(t: Tensor, shape: tuple[int, ...]) -> Tensor:
  """`t._broadcast_to(shape)` for int shapes that broadcast, as an operand (not a live tensor, like a Python scalar's:
  it lives for one op)."""
  uop = t.uop
  if uop.shape == shape: return t
  expanded = uop.reshape((1,) * (len(shape) - len(uop.shape)) + uop.shape).expand(shape)
  if expanded.meta is None: _label(expanded, "expand")
  return _tensor_around(expanded)

def _label(uop: UOp, name: str) -> None:
  """Record the user's source line on a freshly built node (`name`: its op, outside any public method)."""
  uop.shape   # noqa: B018 -- its shape now, while its sources' are known: later it would take a graph walk
  if TRACEBACK_SOURCE.value: uop.meta = _user_op[2] or _op_label(name)

def _check_devices(uop: UOp, name: str) -> None:
  """Lower a node over several devices now, so that an op they cannot run raises here, naming the user's line."""
  try: _multi.lower(uop)
  except _multi.MultiDeviceError as e: raise _multi.MultiDeviceError(f"{e}{_where()}") from None

def _tanh_odd_tensors(x: Tensor) -> Tensor:
  """tanh of a float32/float64 tensor in Tensor ops (Tensor.tanh's docstring): _tanh_odd builds these same nodes."""
  negative = x < 0
  magnitude = negative.where(-x, x)
  small = magnitude < _TANH_POLY_LIMIT
  # the polynomial only where it is used: x**9 of a huge x would overflow, and 0 * inf poisons the gradient
  near = small.where(x, 0.0)
  square = near * near
  # float64 needs the series itself (the float32 fit is good to 1e-8)
  coefficients = _TANH_TAYLOR_F64 if x.dtype == dtypes.float64 else _TANH_POLY
  correction = functools.reduce(lambda acc, c: acc * square + c, coefficients[1:], coefficients[0])
  e = (-2 * magnitude).exp()   # in (0, 0.33]: 1 - 2e/(1 + e) loses no precision
  far = 1 - 2 * e / (1 + e)
  poly = (near == 0).where(near, near + near * square * correction)   # tanh(-0.0) is -0.0
  return small.where(poly, negative.where(-far, far))

def _tanh_odd(x: Tensor) -> Tensor:
  """_tanh_odd_tensors' nodes built directly, each labelled as its Tensor op labels it: the same graph (the same
  nodes, by hash-consing) without ~40 Tensors, their checks and wrappers (a GELU's tanh was a large share of building
  the anchors' transformer: bench/RESULTS.md). Over several devices, the Tensor ops (they check each op's devices)."""
  u = x.uop
  device, shape, dtype = u.device, u.shape, u.dtype
  if type(device) is not str: return _tanh_odd_tensors(x)
  nd = len(shape)
  def node(n: UOp, name: str) -> UOp:   # Tensor._wrap's labelling
    if n.meta is None: _label(n, name)
    return n
  def c(value) -> UOp:   # a Python scalar operand, as Tensor._broadcasted builds it
    if not nd: return UOp.const(dtype, value, device)
    return node(_scalar_view(dtype, value, device, nd).expand(shape), "expand")
  def alu(op: Ops, *src: UOp) -> UOp: return node(src[0].alu(op, *src[1:]), "tanh")
  negative = alu(Ops.CMPLT, u, c(0))
  magnitude = alu(Ops.WHERE, negative, alu(Ops.NEG, u), u)
  small = alu(Ops.CMPLT, magnitude, c(_TANH_POLY_LIMIT))
  near = alu(Ops.WHERE, small, u, c(0.0))
  square = alu(_MUL, near, near)
  coefficients = _TANH_TAYLOR_F64 if dtype == dtypes.float64 else _TANH_POLY
  correction = alu(_ADD, alu(_MUL, c(coefficients[0]), square), c(coefficients[1]))
  for k in coefficients[2:]: correction = alu(_ADD, alu(_MUL, correction, square), c(k))
  e = alu(Ops.EXP2, alu(_MUL, alu(_MUL, c(-2), magnitude), c(INV_LN2)))   # Tensor.exp's form
  far = alu(Ops.SUB, c(1), alu(Ops.FDIV, alu(_MUL, c(2), e), alu(_ADD, c(1), e)))
  poly = alu(Ops.WHERE, alu(Ops.CMPEQ, near, c(0)), near, alu(_ADD, near, alu(_MUL, alu(_MUL, near, square), correction)))
  return Tensor._wrap(alu(Ops.WHERE, small, poly, alu(Ops.WHERE, negative, alu(Ops.NEG, far), far)), "where")

def _realize_all(tensors: Sequence[Tensor]) -> None:
  """Tensor.realize_all with the cyclic garbage collector paused, inline (helpers.gc_paused's wrapper is one Python
  call more on every eager realize)."""
  if not gc.isenabled(): return Tensor._realize_all_paused(tensors)
  gc.disable()
  try: Tensor._realize_all_paused(tensors)
  finally: gc.enable()

def _tensor_around(uop: UOp) -> Tensor:
  """A Tensor holding `uop` as it is (no conversion, no metadata): the fast path for nodes built internally."""
  t = Tensor.__new__(Tensor)
  t.uop, t.grad, t._requires_grad = uop, None, None
  return t

def _with_user_location(fn, name: str):
  @functools.wraps(fn)
  def located(*args, **kwargs):
    outermost, saved = _user_op[0] is None, _NOT_SAVED
    if outermost: _user_op[0], _user_op[3] = name, sys._getframe(1)
    elif not sys._getframe(1).f_code.co_filename.startswith(_KILN_DIR):
      # user code called back from inside a public method: its own line (and label)
      saved, _user_op[1], _user_op[2], _user_op[3] = (_user_op[1], _user_op[2], _user_op[3]), None, None, \
        sys._getframe(1)
    try: return fn(*args, **kwargs)
    except _LOCATED_ERRORS as e:
      message = str(e)
      if " (at " in message: raise
      # a plain error from inside a helper becomes kiln's class for it (PyTorch's class, and the plain one)
      error_type = {IndexError: TensorIndexError, ValueError: TensorValueError}.get(type(e), type(e))
      prefix = "" if message.startswith(f"{name}:") else f"{name}: "
      try: located_error = error_type(f"{prefix}{message}{_where()}")
      except Exception: raise e from None   # an exception type with another constructor: leave it as it was
      raise located_error.with_traceback(None) from None
    finally:
      if outermost: _user_op[0] = _user_op[1] = _user_op[2] = _user_op[3] = None
      elif saved is not _NOT_SAVED: _user_op[1], _user_op[2], _user_op[3] = saved
  return located

def _locate_tensor_errors() -> None:
  skip = {"__repr__", "__hash__", "__weakref__", "__init_subclass__", "_wrap", "__getattribute__", "realize_all", "_realize_all_paused"}
  seen: set[str] = set()
  for cls in Tensor.__mro__[:-1]:   # Tensor first, then its mixins; the first definition of a name wins
    for attr, value in list(vars(cls).items()):
      if attr in seen or attr in skip or (attr.startswith("_") and not attr.startswith("__")): continue
      seen.add(attr)
      if isinstance(value, staticmethod):
        setattr(Tensor, attr, staticmethod(_with_user_location(value.__func__, attr.strip("_"))))
      elif isinstance(value, classmethod):
        setattr(Tensor, attr, classmethod(_with_user_location(value.__func__, attr.strip("_"))))
      elif callable(value) and not isinstance(value, type):
        setattr(Tensor, attr, _with_user_location(value, attr.strip("_")))

_locate_tensor_errors()
