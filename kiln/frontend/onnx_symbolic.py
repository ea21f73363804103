"""Symbolic sizes for OnnxRunner's kept graphs: a dimension the model declares by name (`batch`, `sequence`) or as
-1 becomes a bound kiln Variable while the graph is built, so the kernels take it as a parameter and one build (and
one compile) serves every size of its range (onnx_cache.py decides where).

While such a graph is built, a shape holds expressions of the Variables (`n`, `n*3`), and the shape arithmetic of
exported models (`Shape -> Gather -> Concat -> Reshape`) runs on numpy object arrays of those expressions
(onnx_fold.py). Where a shape must become data (a `Shape` output used in arithmetic on the device), its values are
read from one small int64 input per Variable that the cache fills with the call's size: reading it while building
is refused like reading any input, so no size of the first call is baked into a graph that claims to serve all.
A comparison of sizes is only folded where it holds for every value of the range; otherwise, and wherever an op
needs a plain int, the build fails and the cache builds that size on its own, as before.
"""
from __future__ import annotations
import math, operator
from typing import Any, Callable
import numpy as np
from kiln.tensor import Tensor
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, GroupOp
from kiln.uop.sint import sint_min, sint_max, sint_value, ssimplify

# the Variable (a DEFINE_VAR node) -> the 0-d int64 input Tensor holding its value, while a symbolic graph is built
_size_inputs: dict[UOp, Tensor] = {}

def set_size_inputs(inputs: dict[UOp, Tensor]) -> None:
  """Make `inputs` (Variable -> 0-d int64 placeholder) the values Shape reads for symbolic sizes (empty: none)."""
  _size_inputs.clear()
  _size_inputs.update(inputs)

def is_sint_array(array: np.ndarray) -> bool:
  """True for an object array of sizes: Python ints and symbolic expressions."""
  return array.dtype == object and all(isinstance(v, (int, np.integer, UOp)) for v in array.reshape(-1))

def sint_array(values) -> np.ndarray:
  """Sizes as an int64 array when all are ints, else an object array of ints and (simplified) expressions."""
  values = [ssimplify(v) if isinstance(v, UOp) else int(v) for v in values]
  if not any(isinstance(v, UOp) for v in values): return np.array(values, dtype=np.int64)
  out = np.empty(len(values), dtype=object)
  out[:] = values
  return out

_TENSOR_OPS: dict[Ops, Callable] = {Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul,
                                    Ops.IDIV: operator.floordiv, Ops.MOD: operator.mod, Ops.MAX: Tensor.maximum,
                                    Ops.NEG: operator.neg}

def _size_tensor(size) -> Tensor:
  """One size as a 0-d int64 Tensor: a constant, or its expression computed from the Variables' size inputs."""
  if not isinstance(size, UOp): return Tensor(int(size), dtype=dtypes.int64)
  values: dict[UOp, Tensor] = {}
  for node in size.toposort():
    if node.op is Ops.BIND:
      if node.src[0] not in _size_inputs:
        raise NotImplementedError(f"the size {size} is symbolic but has no size input")
      values[node] = _size_inputs[node.src[0]]
    elif node.op is Ops.CONST: values[node] = Tensor(int(node.arg), dtype=dtypes.int64)
    elif node.op in _TENSOR_OPS and (node.op is not Ops.IDIV or sint_min(node.src[0]) >= 0):
      values[node] = _TENSOR_OPS[node.op](*(values[s] for s in node.src))   # (a floor division: not negative)
    elif node.op is not Ops.DEFINE_VAR:   # a DEFINE_VAR is only seen under its BIND
      raise NotImplementedError(f"the size {size} has an operation ({node.op.name}) Shape cannot compute")
  return values[size]

def sizes_tensor(sizes: np.ndarray) -> Tensor:
  """An object array of sizes as an int64 Tensor of its shape (what a Shape node outputs for symbolic sizes)."""
  flat = [_size_tensor(v) for v in sizes.reshape(-1)]
  if not flat: return Tensor.zeros(*sizes.shape, dtype=dtypes.int64)
  return Tensor.stack(*flat).reshape(*sizes.shape)

def _factors(sizes) -> tuple[int, list[UOp]]:
  """A product of sizes as (its constant factor, its symbolic factors): `(n*3, 4)` -> (12, [n])."""
  constant, symbols, todo = 1, [], list(sizes)
  while todo:
    size = todo.pop()
    if not isinstance(size, UOp): constant *= int(size)
    elif size.op is Ops.MUL: todo.extend(size.src)
    elif size.op is Ops.CONST: constant *= int(size.arg)
    else: symbols.append(size)
  return constant, symbols

def infer_dim(total, known):
  """The size that makes the product of `known` equal to the product of `total` (a Reshape's -1), cancelling the
  symbolic factors both have; None where that leaves a quotient that is not a whole size for every value."""
  total_constant, total_symbols = _factors(total)
  known_constant, known_symbols = _factors(known)
  for size in known_symbols:
    match = next((i for i, other in enumerate(total_symbols) if other is size), None)
    if match is None: return None
    total_symbols.pop(match)
  if known_constant == 0 or total_constant % known_constant: return None
  out = total_constant // known_constant
  for size in total_symbols: out = out * size
  return ssimplify(out)

def symbolic_slice(part: slice, size) -> slice:
  """A Slice node's `start:end` (step 1) on an axis where it or the size is symbolic, clamped as ONNX clamps, as
  bounds that hold for every value of the Variables (an UndecidedSize where they do not)."""
  if part.step not in (None, 1): raise UndecidedSize(f"a step of {part.step} over a symbolic size")
  start = 0 if part.start is None else part.start
  end = size if part.stop is None else part.stop
  if isinstance(start, int) and start < 0: start = start + size
  if isinstance(end, int) and end < 0: end = end + size
  if isinstance(end, int) and end >= sint_max(size): end = size
  if isinstance(start, int) and start <= 0: start = 0
  start, end = ssimplify(start), ssimplify(end)
  def lowest(x) -> int: return x if isinstance(x, int) else sint_min(x)
  def at_least(x, bound: int) -> bool: return lowest(ssimplify(x)) >= bound
  # (not empty for any size either: an empty slice of a symbolic size is its own case)
  if not (at_least(start, 0) and at_least(_node(end) - start, 1) and at_least(_node(size) - end, 0)):
    raise UndecidedSize(f"slice {start}:{end} of a size {size}")
  return slice(start, end)

def arange_to(size, dtype=dtypes.int32) -> Tensor:
  """0, 1, ..., size-1 for a plain or a symbolic size (an arange as long as the size's largest value, sliced)."""
  if not isinstance(size, UOp): return Tensor.arange(size, dtype=dtype)
  return Tensor.arange(sint_max(size), dtype=dtype)[0:size]

def symbolic_arange(first, last, step, dtype) -> Tensor:
  """A Range node up to a symbolic size (position ids `Range(0, Shape(x)[1], 1)`): an arange as long as the
  range's largest count, sliced to the count (a whole plain start and a positive plain step only)."""
  if isinstance(first, UOp) or isinstance(step, UOp) or int(step) <= 0 or int(step) != step or int(first) != first:
    raise UndecidedSize(f"Range({first}, {last}, {step}) over a symbolic size")
  count = ssimplify((_node(last) - int(first) + (int(step) - 1)) // int(step))
  if not isinstance(count, UOp) or sint_min(count) < 1: raise UndecidedSize(f"Range({first}, {last}, {step})")
  return (arange_to(count, dtype) * int(step) + int(first)).cast(dtype)

def _node(x) -> UOp:
  return x if isinstance(x, UOp) else UOp.const(dtypes.int32, int(x))

# ---- comparisons and division of sizes, folded only where they hold for every value of the Variables

def _difference_range(a, b) -> tuple[int, int]:
  if not isinstance(a, UOp) and not isinstance(b, UOp): return int(a) - int(b), int(a) - int(b)
  difference = ssimplify((a if isinstance(a, UOp) else UOp.const(dtypes.int32, int(a))) - b)
  return (difference, difference) if not isinstance(difference, UOp) else (sint_min(difference), sint_max(difference))

class UndecidedSize(Exception):
  """A comparison of sizes whose answer depends on the Variables' values (the graph cannot serve them all)."""

def _compare(test: Callable[[int, int], tuple[bool, bool]]) -> Callable:
  def compare(a, b):
    def one(x, y):
      low, high = _difference_range(x, y)
      always, never = test(low, high)
      if always == never: raise UndecidedSize(f"{x} vs {y}")
      return always
    return np.vectorize(one, otypes=[bool])(a, b)
  return compare

# each test gives (true for every value, false for every value) from the range [low, high] of a - b
equal = _compare(lambda low, high: (low == high == 0, low > 0 or high < 0))
less = _compare(lambda low, high: (high < 0, low >= 0))
less_equal = _compare(lambda low, high: (high <= 0, low > 0))
greater = _compare(lambda low, high: (low > 0, high <= 0))
greater_equal = _compare(lambda low, high: (low >= 0, high < 0))

def divide(a, b):
  """Integer division of sizes (ONNX truncates; sizes are not negative, so a floor division where the divisor is
  positive)."""
  def one(x, y):
    if not isinstance(x, UOp) and not isinstance(y, UOp): return int(np.trunc(int(x) / int(y)))
    if isinstance(y, UOp) or int(y) <= 0 or sint_min(x) < 0: raise UndecidedSize(f"{x} / {y}")
    return ssimplify(x // int(y))
  return np.vectorize(one, otypes=[object])(a, b)

# ---- outputs: views of the kept graph's results with the call's sizes as plain ints

def _chain(tensor: Tensor) -> tuple[UOp, list]:
  """A tensor's base node and the movement ops (op, arg) from it to the tensor, base first."""
  chain, node = [], tensor.uop
  while node.op in GroupOp.Movement:
    chain.append((node.op, node.arg))
    node = node.src[0]
  return node, chain[::-1]

def is_front(tensor: Tensor) -> bool:
  """True for a realized tensor that is the front of its buffer, row-major (how kiln lays out a symbolic size)."""
  base, chain = _chain(tensor)
  return base.op is Ops.BUFFER and base.buffer is not None and [op for op, _ in chain] == [Ops.SHRINK, Ops.RESHAPE] \
    and len(chain[0][1]) == 1 and isinstance(chain[0][1][0][0], int) and chain[0][1][0][0] == 0

def front(whole: Tensor, shape: tuple[int, ...]) -> Tensor:
  """The front of a realized buffer as a tensor of `shape`, over a buffer of its own: reading it copies nothing and
  compiles no kernel for this size."""
  base, size = whole.uop.base, math.prod(shape)
  part = UOp.new_buffer(base.buffer.device, size, base.dtype)
  part.buffer = base.buffer.view(size, base.dtype, 0) if size != base.buffer.size else base.buffer
  return Tensor(part.reshape(shape))

def concrete(tensor: Tensor) -> Tensor:
  """A realized tensor whose view holds bound Variables as the same view with every size a plain int."""
  base, chain = _chain(tensor)
  # (read from the view's args, not from tensor.shape: the shape of a new symbolic node is simplified when asked)
  if not any(_has_uop(arg) for _, arg in chain): return tensor
  if is_front(tensor): return front(tensor, _values(chain[1][1]))
  node = base
  for op, arg in chain: node = UOp(op, node.dtype, (node,), _values(arg))
  return Tensor(node)

_INT_OPS: dict[Ops, Callable] = {Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.MAX: max,
                                 Ops.NEG: operator.neg}

def value_at(size, values: dict[UOp, int] | None = None) -> int:
  """A size's value with each Variable at `values` (at its BIND's value where `values` is None or lacks it),
  evaluated directly: a call's outputs have a few such sizes, and substituting and simplifying each, as
  sint_value does, took most of a small model's call."""
  if not isinstance(size, UOp): return size
  if size.op is Ops.CONST: return size.arg
  if size.op is Ops.BIND: return values.get(size.src[0], size.src[1].arg) if values else size.src[1].arg
  if size.op in _INT_OPS: return _INT_OPS[size.op](*(value_at(s, values) for s in size.src))
  if size.op in (Ops.IDIV, Ops.MOD):   # C's truncating division and remainder
    a, b = value_at(size.src[0], values), value_at(size.src[1], values)
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return quotient if size.op is Ops.IDIV else a - quotient * b
  return sint_value(size)

def _has_uop(arg: Any) -> bool:
  return isinstance(arg, UOp) or (isinstance(arg, tuple) and any(_has_uop(a) for a in arg))

def _values(arg: Any) -> Any:
  if isinstance(arg, UOp): return value_at(arg)
  if isinstance(arg, tuple): return tuple(_values(a) for a in arg)
  return arg

def rebind(roots: list[UOp], values: dict[UOp, int]) -> list[UOp]:
  """`roots` with every BIND of a Variable in `values` bound to its value there, in sources and in movement args."""
  memo: dict[UOp, UOp] = {}
  def mapped_arg(arg: Any) -> Any:
    if isinstance(arg, UOp): return mapped(arg)
    if isinstance(arg, tuple): return tuple(mapped_arg(a) for a in arg)
    return arg
  def mapped(root: UOp) -> UOp:
    for node in root.toposort():
      if node in memo: continue
      if node.op is Ops.BIND and node.src[0] in values: memo[node] = node.src[0].bind(values[node.src[0]])
      else:
        src = tuple(memo.get(s, s) for s in node.src)
        arg = mapped_arg(node.arg) if node.op in GroupOp.Movement else node.arg
        memo[node] = node if src == node.src and arg == node.arg else node.replace(src=src, arg=arg)
    return memo[root]
  return [mapped(root) if root is not None else None for root in roots]
