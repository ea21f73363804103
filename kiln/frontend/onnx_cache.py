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
"""
from __future__ import annotations
from collections import OrderedDict
from typing import Any, Callable
import numpy as np
from kiln.dtype import dtypes, to_numpy_dtype
from kiln.engine.jit import TinyJit
from kiln.tensor import Tensor, _forget_results_computed_from
from kiln.frontend.onnx_proto import dtype_of_onnx, numpy_input, track_host_reads

# integer/bool inputs up to this many elements keep a host copy in the build (a shape, a sample rate, a flag)
STEERING_LIMIT = 64
MAX_GRAPHS = 16

class _ValueNeeded(BaseException):
  """A placeholder input's values were needed while building: this signature cannot be cached. A BaseException,
  so no `except Exception` on the way (an op's fallback, the runner's error wrapping) takes it for the op's own."""

class _Graph:
  """One built graph: the placeholder Tensors its inputs live in, its outputs' lazy nodes, and a TinyJit that
  realizes them (from its third call on it replays the kernels: no graph key, no scheduling)."""
  def __init__(self, placeholders: dict[str, Tensor], outputs: list, steering: dict[str, bytes]):
    self.placeholders, self.outputs, self.steering = placeholders, outputs, steering
    self.realize = TinyJit(self._realize)

  def _realize(self, *placeholders: Tensor) -> list[Tensor]:
    results = [Tensor(uop) for uop in self.outputs if uop is not None]
    Tensor.realize_all(results)
    return results

def _refuse(*args, **kwargs):
  raise _ValueNeeded()

class GraphCache:
  """Graphs built for input signatures (shapes, dtypes, steering values), most recently used last."""
  def __init__(self, declared: dict, device: str | None, runner):
    self.declared, self.device, self.runner = declared, device, runner
    self.graphs: OrderedDict[tuple, _Graph | None] = OrderedDict()   # None: this signature is not cacheable
    self.steering: dict[tuple, tuple[str, ...]] = {}                 # shape signature -> inputs whose values steer

  def arrays(self, inputs: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The inputs as numpy arrays of their declared dtypes, or None where one cannot be cached (a sequence, a
    string, a narrow float without a numpy type, a Tensor of another dtype)."""
    arrays = {}
    for name, value in inputs.items():
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

  def run(self, arrays: dict[str, np.ndarray], build: Callable[[dict, dict], list]) -> list | None:
    """The outputs for these inputs from a kept graph (built now if this signature is new), or None where this
    signature cannot be cached (the caller then runs the graph as usual)."""
    shape_key = tuple((name, a.shape, a.dtype.str) for name, a in sorted(arrays.items()))
    steering = self.steering.get(shape_key, ())
    key = shape_key + tuple(arrays[name].tobytes() for name in steering)
    if key in self.graphs:
      graph = self.graphs[key]
      if graph is None: return None
      self.graphs.move_to_end(key)
      return self._replay(graph, arrays)
    graph = self._build(arrays, build)
    if graph is not None and tuple(graph.steering) != steering:
      self.steering[shape_key] = tuple(graph.steering)
      key = shape_key + tuple(graph.steering.values())
    self.graphs[key] = graph
    if len(self.graphs) > MAX_GRAPHS: self.graphs.popitem(last=False)
    return self._replay(graph, arrays) if graph is not None else None

  def _build(self, arrays: dict[str, np.ndarray], build: Callable[[dict, dict], list]) -> _Graph | None:
    """Run `build(placeholders, host copies)` on placeholder inputs; the graph it returns, None if not cacheable."""
    placeholders, hosts = {}, {}
    for name, array in arrays.items():
      dtype = dtype_of_onnx(self.declared[name].type.tensor_type.elem_type)
      placeholder = Tensor.empty(*array.shape, dtype=dtype, device=self.device)
      if array.size <= STEERING_LIMIT and (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        hosts[name] = array
      placeholder.uop.base.buffer.allocate = _refuse   # any kernel reading it during the build would allocate it
      placeholders[name] = placeholder
    self.runner.drew_random = False
    try:
      with track_host_reads() as reads:
        outputs = build(placeholders, hosts)
    except _ValueNeeded: return None
    finally:
      for placeholder in placeholders.values(): del placeholder.uop.base.buffer.allocate
    if self.runner.drew_random: return None   # a replay would repeat the same numbers (or skip a manual_seed)
    inputs = {id(p.uop.base.buffer) for p in placeholders.values()}
    for out in outputs:
      if out is None: continue
      if not isinstance(out, Tensor) or (out.uop.base.buffer is not None and id(out.uop.base.buffer) in inputs):
        return None
    steering = {name: arrays[name].tobytes() for name, p in placeholders.items() if id(p) in reads}
    return _Graph(placeholders, [out.uop if out is not None else None for out in outputs], steering)

  def _replay(self, graph: _Graph, arrays: dict[str, np.ndarray]) -> list:
    # nothing outside reads the placeholders lazily: every call's outputs are realized before it returns (none is a
    # placeholder itself), so tensors a caller builds on them read their own buffers, never the placeholders
    for name, placeholder in graph.placeholders.items():
      buffer = placeholder.uop.base.buffer
      buffer.copyin(memoryview(arrays[name].reshape(-1).view(np.uint8)))
      _forget_results_computed_from(buffer)   # the graph's last results were computed from the old values
    try: realized = graph.realize(*graph.placeholders.values())
    except RuntimeError:   # TinyJit refuses this graph (e.g. no kernel to capture: every output a constant)
      if graph.realize == graph._realize: raise
      graph.realize = graph._realize
      realized = graph.realize()
    results = iter(realized)
    return [next(results) if uop is not None else None for uop in graph.outputs]
