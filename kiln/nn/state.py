"""State dicts: find a model's Tensors by attribute path ("l1.weight") and load new values into them."""
from __future__ import annotations
import types
from collections import OrderedDict
from typing import Any
from kiln.tensor import Tensor
from kiln.helpers import DEBUG

def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from `obj` through attributes, lists, tuples and dicts, keyed by its path.

  Keys join attribute names, list indices and dict keys with dots: a model with `self.layers = [Linear(2, 3)]` gives
  `{"layers.0.weight": ..., "layers.0.bias": ...}`. A Tensor reachable by two paths gets both keys; any other object
  is walked once, at its first path, so reference cycles are safe.
  """
  state: dict[str, Tensor] = {}
  visited: set[int] = set()
  # explicit stack instead of recursion: deeply nested models don't hit the recursion limit
  stack: list[tuple[Any, str]] = [(obj, prefix)]
  while stack:
    node, path = stack.pop()
    if isinstance(node, Tensor):
      state.setdefault(path.strip("."), node)
      continue
    if id(node) in visited or isinstance(node, (str, bytes, int, float, bool, type, types.ModuleType)) or node is None:
      continue
    visited.add(id(node))
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
    stack.extend(reversed(children))
  return state

def get_parameters(obj: Any) -> list[Tensor]:
  """The distinct Tensors of `get_state_dict(obj)`, in the same order (the list to hand to an optimizer)."""
  by_id: dict[int, Tensor] = {}
  for t in get_state_dict(obj).values(): by_id.setdefault(id(t), t)
  return list(by_id.values())

def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = False,
                    realize: bool = True) -> None:
  """Replace the value of each Tensor of `model` with `state_dict[key]`, matched by `get_state_dict` key.

  With `strict=True` a key of the model that is missing from `state_dict` raises KeyError; a shape mismatch always
  raises ValueError. Both name the key. Keys of `state_dict` that the model doesn't have are ignored (listed when
  DEBUG>=1). The loaded tensor keeps its own dtype and is moved to the model tensor's device.
  """
  model_state = get_state_dict(model)
  missing = [key for key in model_state if key not in state_dict]
  if strict and missing:
    raise KeyError(f"load_state_dict: key {missing[0]!r} of the model is missing from the state dict "
                   f"({len(missing)} missing in all: {missing[:10]}); pass strict=False to skip missing keys")
  unused = sorted(set(state_dict) - set(model_state))
  if unused and DEBUG >= 1: print(f"load_state_dict: unused keys in the state dict: {unused}")
  for key, target in model_state.items():
    if key not in state_dict:
      if verbose or DEBUG >= 1: print(f"load_state_dict: not loading {key!r} (missing from the state dict)")
      continue
    source = state_dict[key]
    if not isinstance(source, Tensor): source = Tensor(source)
    if tuple(source.shape) != tuple(target.shape):
      raise ValueError(f"load_state_dict: shape mismatch for key {key!r}: the model has {tuple(target.shape)}, "
                       f"the state dict has {tuple(source.shape)}")
    if source.device != target.device: source = source.to(target.device)
    target.replace(source)
    if realize: target.realize()
