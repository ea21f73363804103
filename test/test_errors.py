"""Bad input gives clear errors naming the op, the shapes and the user's file:line; never an internal assert."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from kiln import Tensor, Device
from kiln.engine import realize
from kiln.engine.realize import kernel_name

USER_ERRORS = (TypeError, ValueError, IndexError, RuntimeError, NotImplementedError)

def expect(exc, fn, *words: str) -> BaseException:
  """fn() raises `exc` whose message holds every word and 'test_errors.py:<the line fn is written on>'."""
  with pytest.raises(exc) as info: fn()
  msg = str(info.value)
  for word in (*words, f"test_errors.py:{fn.__code__.co_firstlineno}"):
    assert word in msg, f"{word!r} is not in the message of {type(info.value).__name__}: {msg!r}"
  return info.value

a23, a32, a4 = Tensor.zeros(2, 3), Tensor.zeros(3, 2), Tensor.zeros(4)

# ---------------------------------------------------------------------------------------------------------------------
# shapes

def test_add_shape_mismatch():
  expect(ValueError, lambda: a23 + a32, "add", "(2, 3)", "(3, 2)")
  expect(ValueError, lambda: a23 * a4, "mul", "(2, 3)", "(4,)")
  expect(ValueError, lambda: a23 < a4, "(2, 3)", "(4,)")
  expect(ValueError, lambda: (a23 > 0).where(a4, 0), "where", "(2, 3)", "(4,)")

def test_matmul_shape_mismatch():
  expect(ValueError, lambda: a23 @ a23, "matmul", "(2, 3)", "3 != 2")
  expect(ValueError, lambda: a4 @ a32, "matmul", "(4,)", "(3, 2)")
  expect(ValueError, lambda: a23.dot(Tensor.zeros(2, 4, 5)), "matmul", "(2, 4, 5)")
  expect(ValueError, lambda: a4 @ Tensor(2.0), "matmul", "(4,)", "()")
  expect(TypeError, lambda: a23 @ [[1.0], [2.0], [3.0]], "matmul", "list")

def test_reshape_wrong_size():
  expect(ValueError, lambda: a23.reshape(4, 2), "reshape", "(2, 3)", "(4, 2)")
  expect(ValueError, lambda: a23.reshape(4, -1), "reshape", "(2, 3)", "(4, -1)")
  expect(ValueError, lambda: a23.view(7), "reshape", "(7,)")
  expect(ValueError, lambda: a23.reshape(-1, -1), "reshape", "-1")
  expect(TypeError, lambda: a23.reshape(2, "a"), "'a'")

def test_bad_permute():
  expect(ValueError, lambda: a23.permute(0, 0), "permute", "(0, 0)", "(2, 3)")
  expect(RuntimeError, lambda: a23.permute(0, 1, 2), "permute", "(2, 3)")
  expect(IndexError, lambda: a23.permute(5, 0), "permute", "5", "(2, 3)")
  expect(IndexError, lambda: a23.transpose(0, 5), "transpose", "5", "(2, 3)")

def test_expand_incompatible():
  expect(ValueError, lambda: a23.expand(3, 3), "expand", "(2, 3)", "(3, 3)")
  expect(ValueError, lambda: a23.expand(3), "expand", "(2, 3)", "(3,)")
  expect(ValueError, lambda: a23.expand(-2, 3), "-2")

def test_other_movement_errors():
  expect(ValueError, lambda: a23.pad(((1, 1),)), "pad", "2-d")
  expect(ValueError, lambda: a23.pad((1, 2, 3)), "pad", "(1, 2, 3)")
  expect(ValueError, lambda: a23.shrink(((0, 5), (0, 1))), "shrink", "(2, 3)")
  expect(ValueError, lambda: a23.flip((0, 0)), "flip", "(0, 0)")
  expect(IndexError, lambda: a23.squeeze(4), "squeeze", "(2, 3)")
  expect(ValueError, lambda: a23.unsqueeze(5), "unsqueeze", "(2, 3)")
  expect(IndexError, lambda: a23.flatten(3), "flatten", "(2, 3)")
  expect(ValueError, lambda: a23.assign(a4), "assign", "(4,)", "(2, 3)")

def test_reduce_axis_out_of_range():
  expect(IndexError, lambda: a23.sum(axis=3), "sum", "3", "(2, 3)")
  expect(IndexError, lambda: a23.max(axis=-3), "max", "-3", "(2, 3)")
  expect(IndexError, lambda: a23.argmax(2), "argmax", "(2, 3)")

# ---------------------------------------------------------------------------------------------------------------------
# dtypes, indexing, devices, item

def test_unknown_dtype_name():
  expect(TypeError, lambda: Tensor([1]).cast("floaty"), "floaty", "float32")
  expect(TypeError, lambda: Tensor([1]).cast(5), "5")
  expect(TypeError, lambda: Tensor.zeros(2, dtype="floaty"), "floaty")
  expect(ValueError, lambda: Tensor([1.0, 2.0, 3.0]).bitcast("float64"), "bitcast")
  expect(TypeError, lambda: a23 & a23, "bitwise_and", "float")
  expect(TypeError, lambda: -Tensor([True]), "neg", "bool")

def test_cast_none():   # np.dtype(None) is float64: it must not be a silent cast
  expect(TypeError, lambda: Tensor([1]).cast(None), "None")

@pytest.mark.parametrize("exc", [IndexError, ValueError])
def test_index_out_of_range(exc):
  expect(exc, lambda: a23[2], "getitem", "2", "(2, 3)")
  expect(exc, lambda: a23[-3], "getitem", "-3", "(2, 3)")
  expect(exc, lambda: a23[0, 3], "getitem", "3", "(2, 3)")
  expect(exc, lambda: a23[0, 0, 0], "getitem", "(2, 3)")
  expect(exc, lambda: a23[..., ...], "Ellipsis")

def test_list_index_out_of_range():
  expect(IndexError, lambda: a23[[0, 5]], "getitem", "5", "(2, 3)")

def test_index_bad_type():
  expect(TypeError, lambda: a23["a"], "getitem", "'a'")
  expect(IndexError, lambda: a23[1.5], "getitem", "1.5")   # PyTorch's class

def test_devices_mismatch():
  py = Tensor.zeros(2, 3, device="PYTHON")
  for fn in (lambda: a23 + py, lambda: py * a23, lambda: a23 @ py.T, lambda: (a23 > 0).where(py, 0), lambda: a23.assign(py)):
    expect(RuntimeError, fn, "CPU", "PYTHON")

def test_unknown_device():   # rejected when the tensor is built, not at realize
  expect(ValueError, lambda: Tensor.zeros(2, device="nope"), "nope", "CPU")

def test_item_on_many_elements():
  expect(ValueError, lambda: a23.item(), "item", "(2, 3)", "6")
  expect(ValueError, lambda: Tensor.zeros(0).item(), "item", "(0,)")
  expect(RuntimeError, lambda: bool(a23), "(2, 3)")

def test_creation_errors():
  expect(ValueError, lambda: Tensor([[1, 2], [3]]), "ragged")
  expect(TypeError, lambda: Tensor("abc"), "str")
  expect(TypeError, lambda: Tensor(np.array(["a"])), "<U1")
  expect(ValueError, lambda: Tensor.zeros(-1), "-1")
  expect(TypeError, lambda: Tensor.zeros(2.5), "2.5")
  expect(ValueError, lambda: Tensor.arange(0, 5, 0), "arange")

def test_autograd_errors():
  x = Tensor([1.0, 2.0], requires_grad=True)
  expect(RuntimeError, lambda: (x * 2).gradient(x), "gradient", "(2,)")
  expect(RuntimeError, lambda: Tensor([1.0, 2.0]).sum().backward(), "backward")

# odd arguments that Python itself would reject deep inside kiln (without the op or the user's line)
ODD_ARGUMENTS = [
  ("pad_str", lambda: a23.pad("ab")), ("shrink_none", lambda: a23.shrink(None)),
  ("where_str", lambda: (a23 > 0).where("a", 0)), ("unsqueeze_str", lambda: a23.unsqueeze("a")),
  ("len_0d", lambda: len(Tensor(1.0))), ("pad_mode", lambda: a23.pad((1, 1), mode="wrap")),
  ("float_index_tensor", lambda: a23[Tensor([0.5])]), ("full_str", lambda: Tensor.full((2,), "x"))]

@pytest.mark.parametrize("name, fn", ODD_ARGUMENTS, ids=[u[0] for u in ODD_ARGUMENTS])
def test_odd_arguments_name_the_location(name, fn):
  with pytest.raises(USER_ERRORS) as info: fn()
  assert f"test_errors.py:{fn.__code__.co_firstlineno}" in str(info.value), str(info.value)

# ---------------------------------------------------------------------------------------------------------------------
# no internal AssertionError (or AttributeError, KeyError...) for random movement arguments

MOVES = st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip", "getitem", "squeeze", "transpose", "sum"])

@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3), op=MOVES,   # 0-d: test_axis_ops_on_0d_tensor
       args=st.lists(st.integers(-5, 6), min_size=0, max_size=6))
def test_random_movement_args_never_assert(shape, op, args):
  # only graphs are built (nothing is realized), so this is cheap; torch is the reference for the result shape
  t, ref = Tensor.zeros(*shape), torch.zeros(tuple(shape))
  def call(x, lib):
    if op == "reshape": return x.reshape(*args)
    if op == "permute": return x.permute(*args)
    if op == "expand": return x.expand(*args)
    if op == "pad": return x.pad(tuple(args)) if lib == "kiln" else torch.nn.functional.pad(x, tuple(args))
    if op == "shrink":
      bounds = tuple(zip(args[0::2], args[1::2]))
      return x.shrink(bounds) if lib == "kiln" else x[tuple(slice(b, e) for b, e in bounds)]
    if op == "flip": return x.flip(tuple(args))
    if op == "getitem": return x[tuple(args)]
    if op == "squeeze": return x.squeeze(*args[:1])
    if op == "transpose": return x.transpose(*args[:2])
    return x.sum(tuple(args))
  try: want = tuple(call(ref, "torch").shape)
  except Exception: want = None
  try: got = call(t, "kiln").shape
  except USER_ERRORS as e:
    assert "test_errors.py:" in str(e) or isinstance(e, NotImplementedError), f"{op}{args} on {shape}: no location: {e}"
    return
  if op == "sum" and not args: return   # torch reads dim=() as "all axes", numpy and kiln as "no axis"
  if want is not None and op != "shrink": assert got == want, f"{op}{args} on {shape}: kiln {got}, torch {want}"

AXIS_OPS_0D = ["squeeze", "flip", "sum", "max", "argmax", "softmax", "mean", "logsumexp", "transpose"]

@pytest.mark.parametrize("op", AXIS_OPS_0D)
def test_axis_ops_on_0d_tensor(op):   # axis 0 / -1 of a scalar is its only axis, as in torch
  x, ref = Tensor(2.0), torch.tensor(2.0)
  got = x.transpose(0, -1) if op == "transpose" else getattr(x, op)(0)
  want = ref.transpose(0, -1) if op == "transpose" else getattr(ref, "amax" if op == "max" else op)(0)
  assert got.shape == () and got.item() == want.item()

# ---------------------------------------------------------------------------------------------------------------------
# a kernel that does not compile

def test_compile_error_names_kernel_and_keeps_earlier_tensors(monkeypatch):
  before = (Tensor([1.0, 2.0, 3.0]) + 1).realize()
  lazy = before * 3 + 0.5
  name = kernel_name(lazy.schedule()[0].ast)
  renderer = Device["CPU"].renderer
  render = renderer.render
  monkeypatch.setattr(renderer, "render",
                      lambda kname, uops, threads: render(kname, uops, threads) + "\nthis is not C;\n")
  realize._runner_cache.clear()
  try:
    with pytest.raises(RuntimeError) as info: lazy.realize()
  finally:
    monkeypatch.undo()
    realize._runner_cache.clear()
  msg = str(info.value)
  assert name in msg and "error" in msg.lower() and "this" in msg, msg   # the kernel's name and the compiler's message
  assert before.tolist() == [2.0, 3.0, 4.0]
  assert lazy.tolist() == [6.5, 9.5, 12.5]   # the failed realize left the graph usable

def test_reductions_of_nothing_and_bad_sizes():
  expect(RuntimeError, lambda: Tensor.zeros(0).max(), "max", "(0,)")
  expect(RuntimeError, lambda: Tensor.zeros(3, 0).min(1), "min", "(3, 0)")
  expect(ValueError, lambda: Tensor.eye(-1), "eye", "-1")
  expect(IndexError, lambda: Tensor.zeros(3, 4).softmax(5), "softmax", "(3, 4)")
  assert Tensor.zeros(0, 3).max(1).shape == (0,) and Tensor.zeros(3, 0).softmax(-1).shape == (3, 0)

def test_python_ints_that_do_not_fit():
  from kiln import dtypes
  big = Tensor([1, 2 ** 40])   # widens to int64, like NumPy, instead of wrapping
  assert big.dtype == dtypes.int64 and big.tolist() == [1, 2 ** 40]
  expect(ValueError, lambda: Tensor([300], dtype=dtypes.uint8), "Tensor", "300", "uchar")

def test_python_int_scalars_that_do_not_fit():
  from kiln import dtypes
  assert Tensor(2 ** 40).dtype == dtypes.int64 and Tensor(2 ** 40).item() == 2 ** 40
  assert Tensor.full((2,), 2 ** 33).tolist() == [2 ** 33] * 2
  expect(ValueError, lambda: Tensor(300, dtype=dtypes.uint8), "Tensor", "300")
  expect(ValueError, lambda: Tensor.full((2,), 2 ** 40, dtype=dtypes.int32), "full", str(2 ** 40))
  # an operand of a binary op wraps to the tensor's type, as in PyTorch
  assert (Tensor([1, 2], dtype=dtypes.int8) * 1000).tolist() == [-24, -48]
  assert (Tensor([5, 0], dtype=dtypes.uint8) + -1).tolist() == [4, 255]

def test_views_too_large_for_32_bit_indices_are_refused():
  # flattening an expanded view indexes all of its 4.9e9 elements (an expanded axis alone has stride 0 and is fine)
  huge = Tensor.arange(70000).reshape(1, 70000).expand(70000, 70000).reshape(-1)
  expect(RuntimeError, lambda: huge.sum().realize(), "realize", "(4900000000,)", "32-bit")
