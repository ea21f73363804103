"""Run ONNX models on kiln: OnnxRunner turns each node of the graph into kiln Tensor ops.

>>> runner = OnnxRunner("model.onnx")              # doctest: +SKIP
>>> outputs = runner({"input": np.zeros((1, 3, 224, 224), np.float32)})   # doctest: +SKIP

The graph's ops are lazy Tensor ops, so they fuse into kernels and run on any kiln device. The operators live in
onnx_ops.py (the table OPS; math, shapes, reductions, control flow) and the modules it imports (onnx_nn.py,
onnx_rnn.py, onnx_signal.py, onnx_host.py, onnx_domains.py); an op missing there runs as its spec's function body.
docs/onnx.md has the whole picture.
"""
from __future__ import annotations
import inspect, os
from collections import ChainMap
from typing import Any, Callable
import numpy as np
from kiln.tensor import Tensor
from kiln.frontend.onnx_proto import (ONNX_DTYPES, STRING, attribute_value, dtype_of_onnx, held_type, host_entries,
                                      host_value, import_onnx, mark_type, numpy_input, remember, value_of_proto)
from kiln.frontend.onnx_ops import OPS
from kiln.frontend.onnx_fold import FOLDERS, fold
from kiln.frontend.onnx_cache import GraphCache
from kiln.engine.realize import capturing

Value = Any  # a Tensor, a list of values (an ONNX sequence), None (an empty optional) or a numpy string array

def _describe(value: Value) -> str:
  """A value's shape and dtype for error messages."""
  if isinstance(value, Tensor): return f"{tuple(value.shape)} {value.dtype.name}"
  if isinstance(value, np.ndarray): return f"{value.shape} {value.dtype}"
  if isinstance(value, list): return f"sequence of {len(value)}"
  return "None" if value is None else type(value).__name__

class NodeContext:
  """What an operator may need beyond its inputs and attributes: the opset, its output count, subgraph execution."""
  def __init__(self, runner: OnnxRunner, node, scope: ChainMap, opset: int):
    self.runner, self.node, self.scope = runner, node, scope
    self.opset, self.n_outputs = opset, len(node.output)

  def run_graph(self, graph, inputs: list[Value]) -> list[Value]:
    """Run a subgraph (If/Loop/Scan body) with these inputs; names of enclosing graphs stay visible."""
    runner, path = self.runner, self.runner._path
    runner._path = path + ((self.node.output[0] if self.node.output else self.node.op_type, graph.name),)
    try: return runner.run_graph(graph, dict(zip([i.name for i in graph.input], inputs)), self.scope, self.opset)
    finally: runner._path = path

def _onnx_elem_type(value: Value) -> int:
  """The ONNX element type of a Tensor's dtype (STRING for a numpy object array)."""
  if isinstance(value, np.ndarray): return STRING
  return next(code for code, dtype in ONNX_DTYPES.items() if dtype == value.dtype)

def _type_proto(value: Value):
  """A value's ONNX TypeProto (what a context-dependent function body is built for)."""
  from onnx import helper
  if isinstance(value, list):
    return helper.make_sequence_type_proto(_type_proto(value[0]) if value else helper.make_tensor_type_proto(1, None))
  if value is None: return helper.make_tensor_type_proto(1, None)
  return helper.make_tensor_type_proto(_onnx_elem_type(value), list(value.shape))

def function_body(node, inputs: list[Value], opset: int):
  """The ONNX spec's FunctionProto defining this op in simpler ops (None if the spec gives none)."""
  from onnx import FunctionProto, defs
  try: schema = defs.get_schema(node.op_type, opset, node.domain)
  except defs.SchemaError: return None
  # the newest body the model's opset has, else the oldest (a body written in ops of a later opset than the model's)
  pick = lambda versions: max((v for v in versions if v <= opset), default=min(versions, default=opset))
  if schema.has_function: body = schema.get_function_with_opset_version(pick(schema.function_opset_versions))
  elif schema.has_context_dependent_function:
    types = [_type_proto(v).SerializeToString() for v in inputs]
    version = pick(schema.context_dependent_function_opset_versions)
    body = schema.get_context_dependent_function_with_opset_version(version, node.SerializeToString(), types)
  else: return None
  if not body: return None
  function = FunctionProto.FromString(body)
  # the schema's attribute defaults, for attribute references the node leaves out
  for name, attr in schema.attributes.items():
    if attr.default_value.type and name not in {a.name for a in function.attribute_proto}:
      default = function.attribute_proto.add()
      default.CopyFrom(attr.default_value)
      default.name = name
  return function

_parameters: dict[Callable, dict] = {}

def _signature(fn: Callable) -> dict:
  if fn not in _parameters: _parameters[fn] = dict(inspect.signature(fn).parameters)
  return _parameters[fn]

# ops drawing random numbers (Bernoulli runs as a body of RandomUniformLike; Dropout only with a training_mode input)
RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
CONTROL_OPS = {"If", "Loop", "Scan", "SequenceMap"}
# A node computed from the model's constants alone (initializers, Constant nodes) gives the same tensor at every
# call: exporters assemble weights that way (PyTorch's LSTM gates reordered by Slice and Concat), and a kernel
# reading such a weight would re-assemble it through gated loads at every call (Silero VAD's LSTM matvecs ran 4x
# slower). So such a result of at least this many elements, no larger than its inputs, is realized once and kept.
FOLD_MIN_ELEMENTS = 4097   # (smaller ones may have host copies for shape arithmetic, which are per call)

def _declared_dims(tensor_type) -> tuple | None:
  """A declared shape: each fixed size, None for a symbolic one; None where no shape is declared."""
  if not tensor_type.HasField("shape"): return None
  # a negative dim_value (some exporters write -1) is a symbolic size, as a dim_param is
  return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tensor_type.shape.dim)

def _check_shape(name: str, tensor_type, shape: tuple) -> None:
  """A ValueError naming the input where `shape` does not fit its declared one (symbolic sizes take any size)."""
  dims = _declared_dims(tensor_type)
  if dims is None: return
  if len(dims) != len(shape) or any(d is not None and d != s for d, s in zip(dims, shape)):
    shown = tuple(d if d is not None else "?" for d in dims)
    raise ValueError(f"ONNX input {name!r}: expected shape {shown}, got {shape}")

class OnnxRunner:
  """An ONNX model, callable as `runner({input_name: value})` -> `{output_name: Tensor | list | None}`.

  `model` is a path, the serialized bytes, or an onnx.ModelProto. Inputs may be numpy arrays, Tensors, lists (cast to
  the input's declared dtype) or None (an omitted optional input). `cache=False` walks the graph at every call;
  `symbolic=False` keeps a graph per size instead of one for every size of a symbolic dim (onnx_symbolic.py).
  """
  def __init__(self, model, device: str | None = None, cache: bool = True, symbolic: bool = True):
    onnx = import_onnx()
    if isinstance(model, (str, os.PathLike)): model = onnx.load(os.fspath(model))
    elif isinstance(model, (bytes, bytearray)): model = onnx.load_from_string(bytes(model))
    self.model, self.graph, self.device = model, model.graph, device
    self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    self.initializers = {t.name: self._load(t) for t in self.graph.initializer}
    initializer_ids = {id(v) for v in self.initializers.values()}
    self._known = {key: entry for key, entry in host_entries().items() if key in initializer_ids}
    self.inputs = [i for i in self.graph.input if i.name not in self.initializers]
    self._declared = {i.name: i for i in self.graph.input}
    self._required = {i.name for i in self.inputs if i.type.WhichOneof("value") == "tensor_type"}
    self._dims = {i.name: _declared_dims(i.type.tensor_type) for i in self.graph.input
                  if i.type.WhichOneof("value") == "tensor_type"}
    self.output_names = [o.name for o in self.graph.output]
    self.drew_random = False   # set by a node drawing random numbers: such a graph is not kept (onnx_cache.py)
    self._constants: dict[int, Value] = {}   # during a call: id -> the values computed from constants alone
    self._folded: dict[tuple, list] = {}     # (subgraph path, node outputs) -> its outputs realized once
    self._path: tuple = ()                   # the subgraph being run: (node output, graph name) each level down
    self.cache = GraphCache({i.name: i for i in self.graph.input}, device, self, symbolic) if cache else None

  def _load(self, proto) -> Value:
    value = value_of_proto(proto)
    if self.device is None or not isinstance(value, Tensor): return value
    known = host_value(value)
    moved = value.to(self.device)
    return remember(moved, known) if known is not None else moved

  def _input_value(self, name: str, type_proto, value: Value) -> Value:
    """A user's input as the graph wants it: a Tensor of the declared dtype, a list for a sequence, None if omitted."""
    if value is None: return None
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type": return [self._input_value(name, type_proto.sequence_type.elem_type, v) for v in value]
    if kind == "optional_type": return self._input_value(name, type_proto.optional_type.elem_type, value)
    tensor_type = type_proto.tensor_type
    if tensor_type.elem_type == STRING: return np.asarray(value, dtype=object)
    dtype = dtype_of_onnx(tensor_type.elem_type)
    if isinstance(value, Tensor): tensor = value if value.dtype == dtype else value.cast(dtype)
    else:
      array = numpy_input(np.array(value, order="C"), tensor_type.elem_type)
      tensor = Tensor(array, device=self.device)
      if tensor.dtype != dtype: tensor = tensor.cast(dtype)
    _check_shape(name, tensor_type, tuple(tensor.shape))
    return mark_type(tensor, tensor_type.elem_type)

  def __call__(self, inputs: dict[str, Value] | None = None, debug: bool = False) -> dict[str, Value]:
    """Run the model: {input name: value} -> {output name: Tensor | list | None}. An input that has an initializer
    may be given too, replacing it. The kiln graph is built once per input signature and reused (onnx_cache.py),
    except with `debug`, inside a TinyJit function, or where the model cannot be cached."""
    inputs = inputs or {}
    declared = self._declared
    if not self._required <= inputs.keys() or not inputs.keys() <= declared.keys():
      unknown = set(inputs) - set(declared)
      if unknown:
        raise KeyError(f"ONNX model has no input(s) {sorted(unknown)}; its inputs: {[i.name for i in self.inputs]}")
      missing = next(name for name in (i.name for i in self.inputs) if name in self._required - inputs.keys())
      raise KeyError(f"ONNX input {missing!r} is missing; the model's inputs: {[i.name for i in self.inputs]}")
    if self.cache is not None and not debug and not capturing:
      arrays = self.cache.arrays(inputs)
      if arrays is not None:
        for name, array in arrays.items():
          dims = self._dims[name]
          if dims is not None and (len(dims) != array.ndim or any(d is not None and d != s
                                                                    for d, s in zip(dims, array.shape))):
            _check_shape(name, declared[name].type.tensor_type, array.shape)   # raises, naming the input
        outputs = self.cache.run(arrays, self._run)
        if outputs is not None: return dict(zip(self.output_names, outputs))
    return dict(zip(self.output_names, self._run(inputs, {}, debug)))

  def _run(self, inputs: dict[str, Value], hosts: dict[str, np.ndarray], debug: bool = False) -> list[Value]:
    """The graph's outputs for these inputs; `hosts` gives host copies of some of them (onnx_cache.py)."""
    declared = {i.name: i for i in self.graph.input}
    values: dict[str, Value] = dict(self.initializers)
    known = host_entries()
    known.clear()
    known.update(self._known)
    for name, value in inputs.items(): values[name] = self._input_value(name, declared[name].type, value)
    for name, array in hosts.items(): remember(values[name], array)
    for info in self.inputs: values.setdefault(info.name, None)
    self._constants = {id(v): v for name, v in self.initializers.items() if name not in inputs and v is not None}
    try: return self.run_graph(self.graph, values, ChainMap(), self.opset, debug)
    finally:  # host copies made during the call go with it; the initializers' stay
      known.clear()
      known.update(self._known)
      self._constants = {}

  def run_graph(self, graph, values: dict[str, Value], outer: ChainMap, opset: int | None = None,
                debug: bool = False) -> list[Value]:
    """Run a graph's nodes in order on `values` (plus the names of enclosing scopes); its outputs in order."""
    scope = outer.new_child(values)
    if graph is not self.graph:
      for t in graph.initializer:
        scope[t.name] = self._load(t)
        self._constants[id(scope[t.name])] = scope[t.name]
    self.run_nodes(graph.node, scope, opset or self.opset, debug)
    return [scope[o.name] for o in graph.output]

  def run_nodes(self, nodes, scope: ChainMap, opset: int, debug: bool = False):
    for node in nodes:
      inputs = [scope[name] if name else None for name in node.input]
      constant = node.op_type not in CONTROL_OPS and node.op_type not in RANDOM_OPS and \
        all(v is None or id(v) in self._constants for v in inputs)
      # (keyed by where the node is: names are unique in a graph, and protobuf's node objects are made anew)
      key = (self._path, tuple(node.output))
      if constant and key in self._folded: results = self._folded[key]
      else:
        drew, self.drew_random = self.drew_random, False
        results = self.run_node(node, inputs, scope, opset)
        constant = constant and not self.drew_random
        self.drew_random = self.drew_random or drew
        if constant and None not in self._path: results = self._fold(key, inputs, results)
      if constant: self._constants.update((id(v), v) for v in results if v is not None)
      for name, result in zip(node.output, results):
        if name: scope[name] = result
      if debug: print(f"{node.op_type} {node.name!r}: {[_describe(v) for v in inputs]} -> "
                      f"{[_describe(v) for v in results]}")

  def _fold(self, key: tuple, inputs: list[Value], results: list[Value]) -> list[Value]:
    """A node's outputs computed from constants alone: realized and kept for later calls where that pays
    (FOLD_MIN_ELEMENTS); as they are otherwise."""
    if capturing or not results or not all(isinstance(v, Tensor) for v in results): return results
    size = lambda t: int(np.prod(t.shape)) * t.dtype.itemsize
    if any(not isinstance(s, int) for t in results for s in t.shape): return results
    given = sum(size(v) for v in inputs if isinstance(v, Tensor) and all(isinstance(s, int) for s in v.shape))
    if min(int(np.prod(t.shape)) for t in results) < FOLD_MIN_ELEMENTS or sum(size(t) for t in results) > given:
      return results
    if any(held_type(t) is not None or host_value(t) is not None for t in results): return results
    Tensor.realize_all([t for t in results])
    self._folded[key] = results
    return results

  def run_function(self, body, node, inputs: list[Value], opset: int) -> list[Value]:
    """A node run as its spec's function body: attribute references resolve to the node's attributes."""
    given = {a.name: a for a in body.attribute_proto}
    given.update({a.name: a for a in node.attribute})
    nodes = []
    for inner in body.node:
      if any(a.ref_attr_name for a in inner.attribute):
        inner = type(inner).FromString(inner.SerializeToString())
        kept = []
        for a in inner.attribute:
          if not a.ref_attr_name: kept.append(a)
          elif a.ref_attr_name in given:
            resolved = type(a).FromString(given[a.ref_attr_name].SerializeToString())
            resolved.name = a.name
            kept.append(resolved)
        del inner.attribute[:]
        inner.attribute.extend(kept)
      nodes.append(inner)
    scope = ChainMap(dict(zip(body.input, inputs + [None] * (len(body.input) - len(inputs)))))
    inner_opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), opset)
    path, self._path = self._path, self._path + (None,)   # (a body's names repeat from node to node: not kept)
    try: self.run_nodes(nodes, scope, inner_opset)
    finally: self._path = path
    return [scope.get(name) if name else None for name in body.output]

  def run_node(self, node, inputs: list[Value], scope: ChainMap, opset: int | None = None) -> list[Value]:
    """One node's outputs; an unsupported op or attribute, or a failure inside the op, names the node."""
    opset = opset or self.opset
    where = lambda: (f"ONNX node {node.name!r} ({node.op_type}, opset {opset}) with inputs "
                     f"{[_describe(v) for v in inputs]}")
    key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    if key not in OPS:
      body = function_body(node, inputs, opset) if node.domain in ("", "ai.onnx") else None
      if body is not None:
        try: return self.run_function(body, node, inputs, opset)[:len(node.output)]
        except NotImplementedError as err:
          raise NotImplementedError(f"{where()}, run as its function body: {err}") from err
      domain = f" of domain {node.domain!r}" if node.domain else ""
      raise NotImplementedError(f"{where()}: op {node.op_type}{domain} is not supported")
    if key in RANDOM_OPS or (key == "Dropout" and len(node.input) > 2 and node.input[2]): self.drew_random = True
    fn = OPS[key]
    params = _signature(fn)
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for name in attrs:
      if not accepts_any and (name not in params or params[name].kind == params[name].VAR_POSITIONAL):
        raise NotImplementedError(f"{where()}: attribute {name!r} is not supported")
    if key in FOLDERS:
      folded = fold(key, inputs, attrs)
      if folded is not None: return folded
    if "ctx" in params: attrs["ctx"] = NodeContext(self, node, scope, opset)
    while inputs and inputs[-1] is None: inputs = inputs[:-1]
    try:
      result = fn(*inputs, **attrs)
    except NotImplementedError as err:
      raise NotImplementedError(f"{where()}: {err}") from err
    except Exception as err:
      raise RuntimeError(f"{where()}: {type(err).__name__}: {err}") from err
    results = list(result) if isinstance(result, tuple) else [result]
    return results[:len(node.output)]

def supported_ops() -> dict[str, list[str]]:
  """The operators kiln runs: "kiln" (implemented in onnx_ops.py and its sibling modules, "domain.Op" outside the
  default domain) and "function" (default-domain ops run as their spec's function body)."""
  from onnx import defs
  by_body = {s.name for s in defs.get_all_schemas() if s.domain == "" and not s.deprecated
             and (s.has_function or s.has_context_dependent_function)}
  return {"kiln": sorted(OPS), "function": sorted(by_body - set(OPS))}

def ops_markdown() -> str:
  """The supported-operator lists of docs/onnx.md (python -m kiln.frontend.onnx --ops prints them)."""
  ops = supported_ops()
  lines = [f"Implemented in kiln ({len(ops['kiln'])}):", "", ", ".join(f"`{name}`" for name in ops["kiln"]), "",
           f"Run as the ONNX spec's function body ({len(ops['function'])}):", "",
           ", ".join(f"`{name}`" for name in ops["function"])]
  return "\n".join(lines) + "\n"

def _main():
  """python -m kiln.frontend.onnx model.onnx [--benchmark N]: run a model on random inputs, print outputs and speed."""
  import argparse, time
  parser = argparse.ArgumentParser(description="Run an ONNX model with kiln on random inputs")
  parser.add_argument("model", nargs="?")
  parser.add_argument("--ops", action="store_true", help="print the supported operators (for docs/onnx.md)")
  parser.add_argument("--dim", type=int, default=1, help="the size given to symbolic dimensions")
  parser.add_argument("--benchmark", type=int, default=0, help="time this many runs")
  args = parser.parse_args()
  if args.ops or args.model is None: return print(ops_markdown(), end="")
  runner = OnnxRunner(args.model)
  rng = np.random.default_rng(0)
  feeds = {}
  for info in runner.inputs:
    tensor_type = info.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else args.dim for d in tensor_type.shape.dim]
    feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
  for name, value in runner(feeds).items():
    print(name, value.numpy() if isinstance(value, Tensor) else value)
  for _ in range(args.benchmark):
    start = time.perf_counter()
    for value in runner(feeds).values():
      if isinstance(value, Tensor): value.realize()
    print(f"{(time.perf_counter() - start) * 1e3:.2f} ms")

if __name__ == "__main__": _main()
