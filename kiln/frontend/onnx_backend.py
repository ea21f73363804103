"""kiln as an ONNX backend (onnx.backend.base.Backend), so onnx.backend.test.BackendTest runs the official suite."""
from __future__ import annotations
from typing import Any
import numpy as np
try:
  from onnx.backend.base import Backend, BackendRep
except ImportError:  # onnx is optional: this module still imports (for doctests); prepare() then says to install it
  Backend, BackendRep = object, object
from kiln.tensor import Tensor
from kiln.frontend.onnx import OnnxRunner
from kiln.frontend.onnx_proto import numpy_output

def _elem_type(info) -> int | None:
  """The element type of a graph output's tensor type (None for sequences, optionals, unknown)."""
  kind = info.type.WhichOneof("value")
  return info.type.tensor_type.elem_type if kind == "tensor_type" else None

def _to_numpy(value: Any, elem_type: int | None = None) -> Any:
  """A runner output as the backend tests compare it: numpy arrays (bfloat16, float8 and int4 in onnx's own numpy
  dtypes), lists of them, or None."""
  if isinstance(value, list): return [_to_numpy(v) for v in value]
  if isinstance(value, Tensor): value = value.numpy()
  return numpy_output(value, elem_type) if isinstance(value, np.ndarray) and elem_type else value

class KilnRep(BackendRep):
  """A prepared model: run(inputs) feeds the graph's inputs in order and returns its outputs in order."""
  def __init__(self, runner: OnnxRunner):
    self.runner = runner

  def run(self, inputs: Any, **kwargs: Any) -> tuple:
    if isinstance(inputs, dict): feeds = dict(inputs)
    else:
      if not isinstance(inputs, (list, tuple)): inputs = [inputs]
      feeds = {info.name: value for info, value in zip(self.runner.inputs, inputs)}
    outputs = self.runner(feeds)
    return tuple(_to_numpy(outputs[info.name], _elem_type(info)) for info in self.runner.graph.output)

class KilnBackend(Backend):
  """prepare(model) -> KilnRep; runs on kiln's default device (device='CPU' in the ONNX tests)."""
  @classmethod
  def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> KilnRep:
    if Backend is not object: super().prepare(model, device, **kwargs)
    return KilnRep(OnnxRunner(model))

  @classmethod
  def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
    return cls.prepare(model, device, **kwargs).run(inputs)

  @classmethod
  def supports_device(cls, device: str) -> bool:
    return device == "CPU"

prepare, run_model, supports_device = KilnBackend.prepare, KilnBackend.run_model, KilnBackend.supports_device
