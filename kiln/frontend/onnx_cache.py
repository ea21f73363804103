"""Build an ONNX model's kiln graph once per input signature and reuse it (OnnxRunner's graph cache).

Walking the ONNX graph costs Python time on every call (tens of milliseconds for a model of a few hundred nodes,
more than its kernels take for a small one). The kiln graph a model builds depends only on its inputs' shapes and
dtypes, and on the values of the few inputs that steer it (a sample rate an `If` tests, a shape fed as an input),
so it is built once for such a signature, on placeholder input buffers, and kept; a later call copies its inputs
into the placeholders and realizes the kept graph again, through a TinyJit that from the third call on replays
its kernels without scheduling them. The outputs are realized (each call's in fresh buffers), so no
result of an earlier call still reads the placeholders when a later call overwrites them.

A graph is kept only where that is sound: every input a plain tensor, every output a tensor or None that is not an
input itself, no random numbers drawn (each call draws its own), and no value of an input read while building except through its host copy (small integer inputs:
their values join the signature, only for those the build read). A build that needs an input's values from a
kernel (a data-dependent shape: `NonZero`, a `Range` over an input) is seen by the placeholders refusing to be
allocated, and that signature runs uncached, as every call did before.

Sizes the model declares symbolic (a named dim such as `batch`, or -1) become bound Variables in the build where a
call's size is 2 or more (onnx_symbolic.py): the signature holds the Variable's range instead of the size, the
placeholders have room for its largest value, and one graph, one TinyJit capture and one compile of each kernel
serve every size of the range (the ranges are powers of two: 2-16, 17-32, 33-64, ...). Where the build needs a
size as a plain number (an op without symbolic sizes, a size read as data), that signature falls back to a graph
per size.
"""
from __future__ import annotations
import re, time
from collections import OrderedDict
from typing import Any, Callable
import numpy as np
from kiln.dtype import dtypes, to_numpy_dtype
from kiln.engine.jit import TinyJit
from kiln.tensor import Tensor, _forget_results_computed_from
from kiln.uop.ops import UOp, Variable
from kiln.frontend.onnx_proto import dtype_of_onnx, numpy_input, track_host_reads
from kiln.frontend import onnx_symbolic as symbolic

# integer/bool inputs up to this many elements keep a host copy in the build (a shape, a sample rate, a flag)
STEERING_LIMIT = 64
MAX_GRAPHS = 16
SYMBOLIC_MIN = 2   # a size of 1 broadcasts and squeezes where a larger one does not: it gets a graph of its own

def symbolic_range(size: int, lowest: int = SYMBOLIC_MIN) -> tuple[int, int]:
  """The range of the Variable that serves `size`: 2-16, then 17-32, 33-64, ... (the buffers have room for its top;
  its bottom lets the kernels tile a long axis, codegen/lowerer.py)."""
  top = max(16, 1 << (size - 1).bit_length())
  return (lowest if top == 16 else top // 2 + 1), top

# A CNN that halves its image five times and adds the upsampled maps back (an FPN: PP-OCR's detector) needs sizes
# that stay whole through every halving: where the plain symbolic build fails, a size divisible by 2^k (k <= 5) is
# tried as 2^k * v, so (2^k*v + 1)//2 is 2^(k-1)*v again, and one graph serves every multiple of 2^k in range.
MAX_STEP = 32

def size_step(size: int) -> int:
  """The largest power of two dividing `size`, at most MAX_STEP."""
  return min(size & -size, MAX_STEP)

def _dim_key(dim) -> Any:
  """A shape entry of a route (an int, or (Variable, step)) as part of a signature."""
  return dim if isinstance(dim, int) else (dim[0].arg, dim[1])

def _bound_dim(dim: tuple[UOp, int], values: dict[UOp, int]) -> UOp:
  """(Variable, step) -> the shape entry step * Variable, bound to its value."""
  variable, step = dim
  return variable.bind(values[variable]) * step if step > 1 else variable.bind(values[variable])

_FAILED = object()   # a symbolic build that needed a plain size
# A symbolic graph's kernels can be slower than ones compiled for plain sizes (the optimizer cannot tile an axis of
# unknown size: an exported transformer block ran 6-11x slower). So a signature called this many times through
# a symbolic graph gets a graph of its own sizes, once per range and while that keeps paying: where the first such
# graph is not at least SPECIALIZED_GAIN faster, the range's other sizes keep the symbolic graph.
SPECIALIZE_AFTER = 4
SPECIALIZED_GAIN = 1.25
TIMED_REPLAYS = 2    # replays timed (after the TinyJit's capture) before two graphs are compared

class _ValueNeeded(BaseException):
  """A placeholder input's values were needed while building: this signature cannot be cached. A BaseException,
  so no `except Exception` on the way (an op's fallback, the runner's error wrapping) takes it for the op's own."""

class _Graph:
  """One built graph: the placeholder Tensors its inputs live in, its outputs' lazy nodes, and a TinyJit that
  realizes them (from its third call on it replays the kernels: no graph key, no scheduling).

  With symbolic sizes, the TinyJit sees no symbolic view: it takes the placeholders' whole buffers, the size
  inputs and the bound Variables, and returns the whole buffers of the outputs laid out at the front of theirs
  (as kiln lays out a result of symbolic size), which `outputs_at` views with the call's sizes (its guards and its
  rebinding of symbolic views cost more than a small model's kernels)."""
  def __init__(self, placeholders: dict[str, Tensor], outputs: list, steering: dict[str, bytes],
               sizes: dict[UOp, Tensor] | None = None, values: dict[UOp, int] | None = None,
               dims: dict[str, tuple] | None = None):
    self.placeholders, self.outputs, self.steering = placeholders, outputs, steering
    # symbolic sizes: Variable -> its 0-d size input, and the values the outputs are bound to now
    self.sizes, self.values = sizes or {}, values or {}
    # per input and axis: (Variable, step) where its size is step * Variable, None where it is fixed
    self.dims = {name: tuple(None if isinstance(d, int) else d for d in dims[name]) if dims else (None,) * p.ndim
                 for name, p in placeholders.items()}
    self.buffers = [Tensor(p.uop.base) for p in placeholders.values()]
    self.shapes = [out.shape if out is not None and self.sizes else None for out in outputs]
    self.fronts: list[bool] = []   # per realized output: returned as its whole buffer (symbolic sizes only)
    self.fronts_in: dict[tuple[str, int], Any] = {}   # (input, size) -> the front of its placeholder's buffer
    self.calls = 0                 # calls so far (the TinyJit replays from the third)
    self.written: dict[UOp, int] | None = None   # the sizes the size inputs hold
    self.realize = TinyJit(self._realize, prune=True)   # weight-only kernels (copies of initializers) run once

  def _realize(self, *inputs) -> list[Tensor]:
    results = [Tensor(uop) for uop in self.outputs if uop is not None]
    Tensor.realize_all(results)
    if not self.sizes: return results
    self.fronts = [symbolic.is_front(t) for t in results]
    return [Tensor(t.uop.base) if front else t for t, front in zip(results, self.fronts)]

  def inputs(self, values: dict[UOp, int]) -> list:
    """The TinyJit's arguments for a call with these sizes; the kept outputs are bound to them too where this call
    realizes them (the TinyJit's first two calls; its replays take the values from the bound Variables)."""
    if not self.sizes: return list(self.placeholders.values())
    if values != self.values and (self.calls < 2 or self.realize == self._realize):
      self.outputs = symbolic.rebind(self.outputs, values)
      self.values = dict(values)
    return [*self.buffers, *self.sizes.values(), [v.bind(size) for v, size in values.items()]]

  def outputs_at(self, realized: list[Tensor], values: dict[UOp, int]) -> list:
    """The realized outputs as the call's views: plain sizes (None where the graph's output is None)."""
    results = iter(realized)
    if not self.sizes: return [next(results) if uop is not None else None for uop in self.outputs]
    fronts, out = iter(self.fronts), []
    for uop, shape in zip(self.outputs, self.shapes):
      if uop is None:
        out.append(None)
        continue
      result = next(results)
      if next(fronts): result = symbolic.front(result, tuple(symbolic.value_at(s, values) for s in shape))
      out.append(symbolic.concrete(result))
    return out

def _refuse(*args, **kwargs):
  raise _ValueNeeded()

class GraphCache:
  """Graphs built for input signatures (shapes or symbolic ranges, dtypes, steering values), most recently used
  last."""
  def __init__(self, declared: dict, device: str | None, runner, symbolic: bool = True):
    self.declared, self.device, self.runner, self.symbolic = declared, device, runner, symbolic
    self.graphs: OrderedDict[tuple, _Graph | None] = OrderedDict()   # None: this signature is not cacheable
    self.not_symbolic: set[tuple] = set()   # symbolic signatures whose build needed plain sizes
    self.steering: dict[tuple, tuple[str, ...]] = {}        # shape signature -> inputs whose values steer
    self.labels = {name: _dim_labels(info) for name, info in declared.items()}
    self.variable_names: dict[str, str] = {}                # dim label -> a C-identifier Variable name
    # the shapes and dtypes of a call -> the signatures to try, symbolic first: (shapes, shape key) each
    self.routes: dict[tuple, list[tuple[dict, tuple]]] = {}
    self.numpy_dtypes = {name: _numpy_dtype(info) for name, info in declared.items()}
    self.calls: dict[tuple, int] = {}                 # signature -> calls through a symbolic graph
    self.times: dict[tuple, list[float]] = {}         # (signature, graph's signature) -> replay times, a few
    self.specialize: dict[tuple, bool] = {}           # symbolic signature -> whether its hot sizes get own graphs
    self.trials: dict[tuple, tuple] = {}              # specialized signature -> the symbolic key it is compared to

  def arrays(self, inputs: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The inputs as numpy arrays of their declared dtypes, or None where one cannot be cached (a sequence, a
    string, a narrow float without a numpy type, a Tensor of another dtype)."""
    arrays = {}
    for name, value in inputs.items():
      if type(value) is np.ndarray and value.dtype == self.numpy_dtypes[name] and value.flags.c_contiguous:
        arrays[name] = value   # (the common case, without the checks below)
        continue
      type_proto = self.declared[name].type
      if type_proto.WhichOneof("value") != "tensor_type" or value is None: return None
      elem_type = type_proto.tensor_type.elem_type
      try: dtype = dtype_of_onnx(elem_type)
      except Exception: return None
      if dtype in dtypes.fp8s or dtype == dtypes.bfloat16: return None   # no numpy dtype to copy them in
      if not isinstance(value, (np.ndarray, Tensor, list)): return None
      if isinstance(value, Tensor):
        if value.dtype != dtype: return None
        array = value.numpy()
      else: array = numpy_input(np.asarray(value), elem_type)
      if array.dtype == object: return None
      arrays[name] = array.astype(to_numpy_dtype(dtype), order="C", copy=False)
    return arrays

  def variables(self, arrays: dict[str, np.ndarray], stepped: bool = False) -> dict[str, tuple[UOp, int]]:
    """The Variables (unbound) of this call's symbolic sizes and their steps, by dim label: declared symbolic, at
    least SYMBOLIC_MIN, and the same size wherever the label appears. `stepped`: a size is step * Variable, the
    step its largest power-of-two divisor up to MAX_STEP (size_step); otherwise the step is 1."""
    sizes: dict[str, set[int]] = {}
    for name, array in arrays.items():
      for label, size in zip(self.labels.get(name) or (), array.shape):
        if label is not None: sizes.setdefault(label, set()).add(size)
    out = {}
    for label, seen in sizes.items():
      if len(seen) != 1 or (size := seen.pop()) < SYMBOLIC_MIN: continue
      if label not in self.variable_names:
        name = "d_" + re.sub(r"\W", "_", label)
        while name in self.variable_names.values(): name += "_"
        self.variable_names[label] = name
      step = size_step(size) if stepped else 1
      if step == 1: out[label] = (Variable(self.variable_names[label], *symbolic_range(size)), 1)
      else: out[label] = (Variable(self.variable_names[label], *symbolic_range(size // step, 1)), step)
    return out

  def run(self, arrays: dict[str, np.ndarray], build: Callable[[dict, dict], list]) -> list | None:
    """The outputs for these inputs from a kept graph (built now if this signature is new), or None where this
    signature cannot be cached (the caller then runs the graph as usual)."""
    signature = tuple((name, a.shape, a.dtype.str) for name, a in arrays.items())
    routes = self.routes.get(signature)
    if routes is None:
      if len(self.routes) > 64 * MAX_GRAPHS:   # (bounded: a model called with ever new shapes)
        for table in (self.routes, self.calls, self.times, self.trials): table.clear()
      routes = self.routes[signature] = [self._route(arrays, v) for v in self._ladder(arrays)]
    if len(routes) > 1:
      self.calls[signature] = calls = self.calls.get(signature, 0) + 1
      if calls > SPECIALIZE_AFTER and self.specialize.get(routes[0][1], True):
        self.trials[signature] = routes[0][1]
        del routes[:-1]   # a graph of this call's own sizes from now on
    for shapes, shape_key in list(routes):
      outputs = self._run(arrays, build, shapes, shape_key, signature)
      if outputs is not _FAILED:
        if signature in self.trials: self._judge(signature, shape_key)
        return outputs
      routes.remove((shapes, shape_key))   # that symbolic signature needs plain sizes: not tried again
    raise AssertionError("a signature without symbolic sizes never fails")

  def _judge(self, signature: tuple, shape_key: tuple) -> None:
    """Once a specialized graph and the symbolic one have both been timed on this signature: whether the symbolic
    signature's other hot sizes should be specialized too."""
    symbolic_key = self.trials[signature]
    own, shared = self.times.get((signature, shape_key), ()), self.times.get((signature, symbolic_key), ())
    if len(own) < TIMED_REPLAYS or len(shared) < TIMED_REPLAYS: return
    self.specialize[symbolic_key] = min(own) * SPECIALIZED_GAIN < min(shared)
    del self.trials[signature]

  def _ladder(self, arrays: dict[str, np.ndarray]) -> list[dict[str, tuple[UOp, int]]]:
    """The Variables to build with, tried in order: every symbolic size, then every one in whole steps (a CNN's
    feature pyramid), then only those of leading axes (a batch, where the spatial sizes need plain numbers), then
    none."""
    if not self.symbolic: return [{}]
    every = self.variables(arrays)
    stepped = self.variables(arrays, stepped=True)
    leading = {label: v for label, v in every.items()
               if all(labels is None or label not in labels[1:] for labels in self.labels.values())}
    ladder = [every] if every else []
    if any(step > 1 for _, step in stepped.values()): ladder.append(stepped)
    if leading and len(leading) < len(every): ladder.append(leading)
    return ladder + [{}]

  def _route(self, arrays: dict[str, np.ndarray], variables: dict[str, UOp]) -> tuple[dict, tuple]:
    """The shapes of the inputs with these Variables in place of their sizes, and the signature they make."""
    shapes = {name: self._shape(name, a.shape, variables) for name, a in arrays.items()}
    shape_key = tuple((name, tuple(_dim_key(d) for d in shapes[name]), a.dtype.str)
                      for name, a in sorted(arrays.items()))
    return shapes, shape_key

  def _run(self, arrays: dict[str, np.ndarray], build: Callable, shapes: dict, shape_key: tuple, signature: tuple):
    steering = self.steering.get(shape_key, ())
    key = shape_key + tuple(arrays[name].tobytes() for name in steering)
    if key in self.not_symbolic: return _FAILED
    if key in self.graphs:
      graph = self.graphs[key]
      if graph is None: return None
      self.graphs.move_to_end(key)
      return self._replay(graph, arrays, shape_key, signature)
    graph = self._build(arrays, build, shapes)
    if graph is _FAILED:
      self.not_symbolic.add(key)
      return _FAILED
    if graph is not None and tuple(graph.steering) != steering:
      self.steering[shape_key] = tuple(graph.steering)
      key = shape_key + tuple(graph.steering.values())
    self.graphs[key] = graph
    if len(self.graphs) > MAX_GRAPHS: self.graphs.popitem(last=False)
    return self._replay(graph, arrays, shape_key, signature) if graph is not None else None

  def _shape(self, name: str, shape: tuple[int, ...], variables: dict[str, UOp]) -> tuple:
    labels = self.labels.get(name) or (None,) * len(shape)
    return tuple(variables[label] if label in variables else size for label, size in zip(labels, shape))

  def _build(self, arrays: dict[str, np.ndarray], build: Callable[[dict, dict], list], shapes: dict[str, tuple]):
    """Run `build(placeholders, host copies)` on placeholder inputs; the graph it returns, None if not cacheable,
    _FAILED where symbolic sizes were needed as plain numbers."""
    values = {d[0]: size // d[1] for name, array in arrays.items() for d, size in zip(shapes[name], array.shape)
              if not isinstance(d, int)}
    placeholders, hosts = {}, {}
    for name, array in arrays.items():
      dtype = dtype_of_onnx(self.declared[name].type.tensor_type.elem_type)
      shape = tuple(d if isinstance(d, int) else _bound_dim(d, values) for d in shapes[name])
      placeholder = Tensor.empty(*shape, dtype=dtype, device=self.device)
      if array.size <= STEERING_LIMIT and (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_) \
         and shape == array.shape:   # (an input of symbolic size has no host copy: its values are this size's)
        hosts[name] = array
      placeholders[name] = placeholder
    sizes = {v: Tensor.empty(dtype=dtypes.int64, device=self.device) for v in values}
    for t in (*placeholders.values(), *sizes.values()):
      t.uop.base.buffer.allocate = _refuse   # any kernel reading it during the build would allocate it
    self.runner.drew_random = False
    symbolic.set_size_inputs(sizes)
    try:
      with track_host_reads() as reads:
        outputs = build(placeholders, hosts)
    except _ValueNeeded: return _FAILED if values else None
    except Exception:
      if values: return _FAILED   # an op that needs plain sizes: the graph is built per size instead
      raise
    finally:
      symbolic.set_size_inputs({})
      for t in (*placeholders.values(), *sizes.values()): del t.uop.base.buffer.allocate
    if self.runner.drew_random: return None   # a replay would repeat the same numbers (or skip a manual_seed)
    inputs = {id(p.uop.base.buffer) for p in placeholders.values()}
    for out in outputs:
      if out is None: continue
      if not isinstance(out, Tensor) or (out.uop.base.buffer is not None and id(out.uop.base.buffer) in inputs):
        return None
    steering = {name: arrays[name].tobytes() for name, p in placeholders.items() if id(p) in reads}
    return _Graph(placeholders, [out.uop if out is not None else None for out in outputs], steering, sizes,
                  dict(values), shapes)

  def _replay(self, graph: _Graph, arrays: dict[str, np.ndarray], shape_key: tuple, signature: tuple) -> list:
    # nothing outside reads the placeholders lazily: every call's outputs are realized before it returns (none is a
    # placeholder itself), so tensors a caller builds on them read their own buffers, never the placeholders
    values = {}
    for name, placeholder in graph.placeholders.items():
      buffer, array = placeholder.uop.base.buffer, arrays[name]
      if graph.sizes:   # room for the largest sizes: this call's values fill the front, row-major
        values.update((d[0], size // d[1]) for d, size in zip(graph.dims[name], array.shape) if d is not None)
        if array.size != buffer.size:
          if (name, array.size) not in graph.fronts_in: graph.fronts_in[name, array.size] = buffer.view(array.size,
                                                                                                      buffer.dtype, 0)
          buffer = graph.fronts_in[name, array.size]
      buffer.copyin(memoryview(array.reshape(-1).view(np.uint8)))
      _forget_results_computed_from(placeholder.uop.base.buffer)   # the last results came from the old values
    if values != graph.written:
      for variable, size_input in graph.sizes.items():
        size_input.uop.base.buffer.copyin(memoryview(np.array([values[variable]], np.int64).view(np.uint8)))
        _forget_results_computed_from(size_input.uop.base.buffer)
      graph.written = values
    inputs = graph.inputs(values)
    start = time.perf_counter()
    try: realized = graph.realize(*inputs)
    except RuntimeError:   # TinyJit refuses this graph (e.g. no kernel to capture: every output a constant)
      if graph.realize == graph._realize: raise
      graph.realize = graph._realize
      realized = graph.realize()
    graph.calls += 1
    if graph.calls > 2 and (graph.sizes or signature in self.trials):   # replays timed, to judge specializing
      times = self.times.setdefault((signature, shape_key), [])
      if len(times) < TIMED_REPLAYS: times.append(time.perf_counter() - start)
    return graph.outputs_at(realized, values)

def _numpy_dtype(info) -> np.dtype | None:
  """The numpy dtype an input is copied in as (None where there is none: not a tensor, bfloat16, float8, ...)."""
  if info.type.WhichOneof("value") != "tensor_type": return None
  try: dtype = dtype_of_onnx(info.type.tensor_type.elem_type)
  except Exception: return None
  if dtype in dtypes.fp8s or dtype == dtypes.bfloat16: return None
  try: return np.dtype(to_numpy_dtype(dtype))
  except Exception: return None

def _dim_labels(info) -> tuple | None:
  """Each declared dim's label where it is symbolic (its dim_param, or the input and axis for a -1 or a dim with
  neither), None where it is fixed; None for an input without a declared tensor shape."""
  if info.type.WhichOneof("value") != "tensor_type" or not info.type.tensor_type.HasField("shape"): return None
  labels = []
  for axis, dim in enumerate(info.type.tensor_type.shape.dim):
    if dim.HasField("dim_value") and dim.dim_value >= 0: labels.append(None)
    else: labels.append(dim.dim_param if dim.HasField("dim_param") and dim.dim_param else f"{info.name}:{axis}")
  return tuple(labels)
