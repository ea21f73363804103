"""kiln's Tensor has tinygrad 0.11.0's public API: every method, with the same parameter names in the same positions;
and the methods added for that parity (unfold, rearrange, idiv, size, ...) against PyTorch/NumPy."""
import inspect, math
import numpy as np
import pytest
import torch
from kiln import Tensor, dtypes
from helpers import check, assert_close

# tinygrad 0.11.0's public Tensor attributes: "property", "attribute", or the parameters (less self) of the method.
# Produced with tinygrad installed (it is not available in CI) by:
#   for name in sorted(dir(Tensor)) if not name.startswith("_"): attr = inspect.getattr_static(Tensor, name)
#     property -> "property"; not callable -> "attribute"; else str(inspect.Signature(params without self and
#     annotations))[1:-1] of getattr(attr, "__func__", attr)   (for the class `train`, its __init__)
TINYGRAD_TENSOR_API = {
  'T': 'property',
  'abs': '',
  'acos': '',
  'acosh': '',
  'add': 'x, reverse=False',
  'all': 'axis=None, keepdim=False',
  'alu': 'op, *src',
  'any': 'axis=None, keepdim=False',
  'arange': 'start, stop=None, step=1, **kwargs',
  'argmax': 'axis=None, keepdim=False',
  'argmin': 'axis=None, keepdim=False',
  'argsort': 'dim=-1, descending=False',
  'asin': '',
  'asinh': '',
  'assign': 'x',
  'atan': '',
  'atanh': '',
  'avg_pool2d': 'kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, count_include_pad=True',
  'backward': 'gradient=None',
  'batchnorm': 'weight, bias, mean, invstd, axis=1',
  'bfloat16': '',
  'binary_crossentropy': "Y, reduction='mean'",
  'binary_crossentropy_logits': "Y, reduction='mean', pos_weight=None",
  'bitcast': 'dtype',
  'bitwise_and': 'x, reverse=False',
  'bitwise_not': '',
  'bitwise_or': 'x, reverse=False',
  'bitwise_xor': 'x, reverse=False',
  'bool': '',
  'cast': 'dtype',
  'cat': '*args, dim=0',
  'ceil': '',
  'celu': 'alpha=1.0',
  'chunk': 'chunks, dim=0',
  'clamp': 'min_=None, max_=None',
  'clip': 'min_=None, max_=None',
  'clone': '',
  'const_like': 'b',
  'contiguous': '**kwargs',
  'contiguous_backward': '',
  'conv2d': 'weight, bias=None, groups=1, stride=1, dilation=1, padding=0, dtype=None',
  'conv_transpose2d': 'weight, bias=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0',
  'copysign': 'other',
  'cos': '',
  'cosh': '',
  'cross_entropy': "Y, reduction='mean', label_smoothing=0.0",
  'cummax': 'axis=0',
  'cumprod': 'axis',
  'cumsum': 'axis=0',
  'data': '',
  'detach': '',
  'device': 'property',
  'diag': '',
  'diagonal': '',
  'div': 'x, reverse=False, rounding_mode=None',
  'dot': 'w, dtype=None',
  'double': '',
  'dropout': 'p=0.5',
  'dtype': 'property',
  'einsum': 'formula, *operands, dtype=None',
  'element_size': '',
  'elu': 'alpha=1.0',
  'empty': '*shape, device=None, dtype=None, **kwargs',
  'eq': 'x',
  'erf': '',
  'exp': '',
  'exp2': '',
  'expand': 'shape, *args',
  'eye': 'n, m=None, **kwargs',
  'flatten': 'start_dim=0, end_dim=-1',
  'flip': 'axis, *args',
  'float': '',
  'floor': '',
  'from_blob': 'ptr, shape, **kwargs',
  'from_uop': 'y, **kwargs',
  'from_url': 'url, gunzip=False, **kwargs',
  'full': 'shape, fill_value, **kwargs',
  'full_like': 'fill_value, **kwargs',
  'fuse': '',
  'gather': 'dim, index',
  'gelu': '',
  'glorot_uniform': '*shape, **kwargs',
  'grad': 'attribute',
  'gradient': '*targets, gradient=None, materialize_grads=False',
  'half': '',
  'hardsigmoid': 'alpha=0.16666666666666666, beta=0.5',
  'hardswish': '',
  'hardtanh': 'min_val=-1, max_val=1',
  'hash': '',
  'idiv': 'x, reverse=False',
  'image_conv2d': 'weight, bias=None, groups=1, stride=1, dilation=1, padding=0, dtype=None',
  'image_dot': 'w, dtype=None',
  'int': '',
  'interpolate': "size, mode='linear', align_corners=False",
  'is_floating_point': '',
  'isclose': 'other, rtol=1e-05, atol=1e-08, equal_nan=False',
  'isfinite': '',
  'isinf': 'detect_positive=True, detect_negative=True',
  'isnan': '',
  'item': '',
  'kaiming_normal': '*shape, a=0.01, **kwargs',
  'kaiming_uniform': '*shape, a=0.01, **kwargs',
  'keccak': "cfg='sha3_256'",
  'kernelize': '*lst',
  'layernorm': 'axis=-1, eps=1e-05',
  'leaky_relu': 'neg_slope=0.01',
  'lerp': 'end, weight',
  'linear': 'weight, bias=None, dtype=None',
  'linspace': 'start, stop, steps, **kwargs',
  'llvm_bf16_cast': 'dtype',
  'log': '',
  'log2': '',
  'log_softmax': 'axis=-1, dtype=None',
  'logcumsumexp': 'axis=0',
  'logical_not': '',
  'logsigmoid': '',
  'logsumexp': 'axis=None, keepdim=False',
  'long': '',
  'lshift': 'x, reverse=False',
  'manual_seed': 'seed=0',
  'masked_fill': 'mask, value',
  'masked_select': 'mask',
  'matmul': 'x, reverse=False, dtype=None',
  'max': 'axis=None, keepdim=False',
  'max_pool2d': 'kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, return_indices=False',
  'max_unpool2d': 'indices, kernel_size=(2, 2), stride=None, dilation=1, padding=0, output_size=None',
  'maximum': 'x',
  'mean': 'axis=None, keepdim=False',
  'meshgrid': "*args, indexing='ij'",
  'min': 'axis=None, keepdim=False',
  'minimum': 'x',
  'mish': '',
  'mod': 'x, reverse=False',
  'mul': 'x, reverse=False',
  'multinomial': 'num_samples=1, replacement=False',
  'nbytes': '',
  'ndim': 'property',
  'ne': 'x',
  'neg': '',
  'newton_schulz': 'steps, params, eps=1e-07',
  'nll_loss': "Y, weight=None, ignore_index=None, reduction='mean'",
  'normal': '*shape, mean=0.0, std=1.0, requires_grad=None, **kwargs',
  'numel': '',
  'numpy': '',
  'one_hot': 'num_classes=-1',
  'ones': '*shape, **kwargs',
  'ones_like': '**kwargs',
  'pad': "padding, mode='constant', value=0.0",
  'permute': 'order, *args',
  'pow': 'x, reverse=False',
  'prod': 'axis=None, keepdim=False, dtype=None',
  'qr': '',
  'quick_gelu': '',
  'rand': '*shape, device=None, dtype=None, contiguous=True, **kwargs',
  'rand_like': '**kwargs',
  'randint': '*shape, low=0, high=10, dtype=dtypes.int, **kwargs',
  'randn': '*shape, dtype=None, requires_grad=None, **kwargs',
  'randn_like': 'dtype=None, requires_grad=None, **kwargs',
  'randperm': 'n, device=None, dtype=dtypes.int, **kwargs',
  'realize': '*lst, do_update_stats=True',
  'rearrange': 'formula, **sizes',
  'reciprocal': '',
  'relu': '',
  'relu6': '',
  'repeat': 'repeats, *args',
  'repeat_interleave': 'repeats, dim=None',
  'replace': 'x, allow_shape_mismatch=False',
  'requires_grad': 'attribute',
  'requires_grad_': 'requires_grad=True',
  'reshape': 'shape, *args',
  'roll': 'shifts, dims=None',
  'round': '',
  'rshift': 'x, reverse=False',
  'rsqrt': '',
  'scaled_dot_product_attention': 'key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False',
  'scaled_uniform': '*shape, **kwargs',
  'scatter': 'dim, index, src, reduce=None',
  'scatter_reduce': 'dim, index, src, reduce, include_self=True',
  'schedule': '*lst',
  'schedule_with_vars': '*lst',
  'selu': 'alpha=1.67326, gamma=1.0507',
  'sequential': 'll',
  'shape': 'property',
  'shard': 'devices, axis=None',
  'shard_': 'devices, axis=None',
  'short': '',
  'shrink': 'arg',
  'sigmoid': '',
  'sign': '',
  'silu': '',
  'sin': '',
  'sinh': '',
  'size': 'dim=None',
  'softmax': 'axis=-1, dtype=None, _single_kernel=0',
  'softplus': 'beta=1.0, threshold=20.0',
  'softsign': '',
  'sort': 'dim=-1, descending=False',
  'sparse_categorical_crossentropy': "Y, ignore_index=-1, label_smoothing=0.0, reduction='mean'",
  'split': 'sizes, dim=0',
  'sqrt': '',
  'square': '',
  'squeeze': 'dim=None',
  'stack': '*args, dim=0',
  'std': 'axis=None, keepdim=False, correction=1',
  'std_mean': 'axis=None, keepdim=False, correction=1',
  'sub': 'x, reverse=False',
  'sum': 'axis=None, keepdim=False, dtype=None',
  'svd': 'full_matrices=True',
  'swish': '',
  'tan': '',
  'tanh': '',
  'threefry': 'seed',
  'to': 'device',
  'to_': 'device',
  'tolist': '',
  'topk': 'k, dim=-1, largest=True, sorted_=True',
  'train': 'mode=True',
  'training': 'attribute',
  'transpose': 'dim0=1, dim1=0',
  'tril': 'diagonal=0',
  'triu': 'diagonal=0',
  'trunc': '',
  'ufix': 'x',
  'unflatten': 'dim, sizes',
  'unfold': 'dim, size, step',
  'uniform': '*shape, low=0.0, high=1.0, dtype=None, requires_grad=None, **kwargs',
  'unsqueeze': 'dim',
  'uop': 'attribute',
  'var': 'axis=None, keepdim=False, correction=1',
  'var_mean': 'axis=None, keepdim=False, correction=1',
  'view': 'shape, *args',
  'where': 'x, y',
  'zeros': '*shape, **kwargs',
  'zeros_like': '**kwargs',
}

# tinygrad methods kiln leaves out on purpose
EXCLUDED = {
  "image_conv2d": "tinygrad's IMAGE=1 path for Qualcomm image textures; kiln has no image dtypes",
  "image_dot": "tinygrad's IMAGE=1 path for Qualcomm image textures; kiln has no image dtypes",
  "llvm_bf16_cast": "a tinygrad workaround for devices without bfloat16; kiln casts bfloat16 on every device",
  "threefry": "tinygrad's random bits; kiln's random functions use their own counter-based hash",
  "alu": "builds a raw UOp ALU node: tinygrad-internal, not user API",
  "ufix": "tinygrad-internal scalar-to-tensor helper of its MathTrait",
  "from_uop": "tinygrad-internal constructor from a UOp (kiln's Tensor(uop) does this)",
  "schedule_with_vars": "tinygrad's schedule plus symbolic variable values; kiln's schedule() covers scheduling",
}

P = inspect.Parameter

class _SettingDefault:
  """tinygrad's `fused=FUSE_OPTIM` default reads the setting when called; kiln's `fused=None` does the same."""
  def __eq__(self, other) -> bool:
    from kiln.helpers import FUSE_OPTIM
    return other is None or other is FUSE_OPTIM
  def __repr__(self) -> str: return "FUSE_OPTIM"

def tinygrad_parameters(spec: str) -> list[inspect.Parameter]:
  """The parameters a stored signature text describes (defaults evaluated with kiln's dtypes, Tensor, AddrSpace)."""
  import ctypes
  from kiln.dtype import AddrSpace
  names = {"dtypes": dtypes, "Tensor": Tensor, "ctypes": ctypes, "AddrSpace": AddrSpace, "FUSE_OPTIM": _SettingDefault()}
  return list(inspect.signature(eval(f"lambda {spec}: None", names)).parameters.values())

def kiln_parameters(name: str) -> list[inspect.Parameter]:
  attr = inspect.getattr_static(Tensor, name)
  fn = getattr(attr, "__func__", attr)
  return [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]

def same_default(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float): return math.isclose(a, b, rel_tol=1e-4)   # selu's constants
  return a == b

def signature_problems(name: str, spec: str, got: list[inspect.Parameter] | None = None,
                       check_names: bool = True) -> list[str]:
  """How kiln's Tensor.<name> (or the callable with parameters `got`) fails to accept a call written for tinygrad's
  (empty when it accepts every one). `check_names=False` accepts other names for positional parameters."""
  want, got = tinygrad_parameters(spec), kiln_parameters(name) if got is None else got
  problems = []
  for i, w in enumerate(want):
    if w.name.startswith("_"): continue   # tinygrad-private knobs (softmax's _single_kernel)
    g = got[i] if i < len(got) else None
    if w.kind is P.POSITIONAL_OR_KEYWORD:
      if g is None or g.kind is not P.POSITIONAL_OR_KEYWORD or (check_names and g.name != w.name):
        problems.append(f"parameter {i} should be {w.name!r}, kiln has {g}")
      elif w.default is not P.empty and (g.default is P.empty or not same_default(g.default, w.default)):
        problems.append(f"{w.name} defaults to {w.default!r} in tinygrad, kiln has {g}")
    elif w.kind is P.VAR_POSITIONAL:
      if g is None or g.kind is not P.VAR_POSITIONAL:
        problems.append(f"parameter {i} should be *{w.name}, kiln has {g}")
    elif w.kind is P.KEYWORD_ONLY:
      named = next((p for p in got if p.name == w.name), None)
      if named is None:
        if not any(p.kind is P.VAR_KEYWORD for p in got): problems.append(f"keyword {w.name!r} is not accepted")
      elif named.kind not in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD) or not same_default(named.default, w.default):
        problems.append(f"keyword {w}: kiln has {named}")
    elif w.kind is P.VAR_KEYWORD and not any(p.kind is P.VAR_KEYWORD for p in got):
      problems.append(f"**{w.name} is not accepted")
  for g in got[len(want):]:   # kiln may add parameters at the end, but a call written for tinygrad must not need them
    if g.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY) and g.default is P.empty:
      problems.append(f"extra required parameter {g.name!r}")
  return problems

# ---------------------------------------------------------------------------------------------------------------------
# the API table

@pytest.mark.parametrize("name", sorted(TINYGRAD_TENSOR_API))
def test_tinygrad_method_exists_with_same_parameters(name):
  spec = TINYGRAD_TENSOR_API[name]
  if name in EXCLUDED:
    assert not hasattr(Tensor, name), f"Tensor.{name} exists now: remove it from EXCLUDED"
    return
  assert hasattr(Tensor, name), f"Tensor.{name} (tinygrad 0.11) is missing"
  if spec in ("property", "attribute"): return
  problems = signature_problems(name, spec)
  assert not problems, f"Tensor.{name}: tinygrad's is ({spec}); " + "; ".join(problems)

def test_exclusions_are_tinygrad_names():
  assert set(EXCLUDED) <= set(TINYGRAD_TENSOR_API)

def test_signature_check_catches_differences():
  # the checker itself: a renamed, a missing and an extra required parameter are each reported
  assert signature_problems("add", "other, reverse=False")
  assert signature_problems("sum", "axis=None, keepdim=False, dtype=None, extra=None")
  assert signature_problems("gather", "dim")   # kiln's gather requires `index` too
  assert not signature_problems("pad", "padding")   # extra optional parameters are fine
  assert signature_problems("pad", "padding, mode='reflect', value=0.0")
  assert not signature_problems("add", "x, reverse=False")

# ---------------------------------------------------------------------------------------------------------------------
# calls written for tinygrad, by keyword (graph only, except where values are compared)

def test_binary_ops_take_x_by_keyword():
  a = Tensor([6, -7, 5], dtype=dtypes.int32)
  for op in ("add", "sub", "mul", "div", "mod", "pow", "maximum", "minimum", "bitwise_and", "bitwise_or",
             "bitwise_xor", "lshift", "rshift", "idiv"):
    out = getattr(a, op)(x=2)
    assert out.shape == (3,), op
  assert a.sub(x=1, reverse=True).tolist() == [-5, 8, -4]
  b = Tensor.zeros(3)
  b.realize()
  b.assign(x=Tensor([1.0, 2.0, 3.0])).realize()
  assert b.tolist() == [1.0, 2.0, 3.0]

def test_movement_shape_arguments_by_keyword_and_position():
  x, arr = Tensor.arange(6), np.arange(6)
  m, marr = x.reshape(2, 3), arr.reshape(2, 3)
  cases = [(x.reshape(shape=(2, 3)), marr), (x.view(3, 2), arr.reshape(3, 2)), (x.view((1, 6)), arr.reshape(1, 6)),
           (x.reshape(2, -1).permute(order=(1, 0)), marr.T), (m.permute(1, 0), marr.T), (m.permute([1, 0]), marr.T),
           (m.flip(0, 1), marr[::-1, ::-1]), (m.flip(axis=(1,)), marr[:, ::-1]), (m.flip(1), marr[:, ::-1]),
           (x.reshape(1, 6).expand(shape=(2, 6)), np.broadcast_to(arr, (2, 6))),
           (x.reshape(1, 6).expand(3, -1), np.broadcast_to(arr, (3, 6)))]
  for i, (got, want) in enumerate(cases):
    np.testing.assert_array_equal(got.numpy(), want, err_msg=f"case {i}")
  assert Tensor(3.0).reshape().shape == () and Tensor(3.0).permute().shape == ()

def test_keyword_arguments_tinygrad_passes_through_kwargs():
  assert Tensor.rand(2, 3, contiguous=False).shape == (2, 3)
  assert Tensor.rand(2, contiguous=True, dtype=dtypes.float16).dtype == dtypes.float16
  for t in (Tensor.randn(2, requires_grad=True), Tensor.normal(2, mean=1.0, std=2.0, requires_grad=True),
            Tensor.uniform(2, low=-1, high=1, dtype=dtypes.float16, requires_grad=True),
            Tensor.zeros(2).randn_like(requires_grad=True), Tensor.linspace(0, 1, 5, requires_grad=True)):
    assert t.requires_grad is True
  assert Tensor.uniform(2, dtype=dtypes.float16).dtype == dtypes.float16
  assert Tensor.zeros(2).randn_like(dtypes.float16).dtype == dtypes.float16
  assert Tensor.zeros(2, dtype=dtypes.float16).randn_like().dtype == dtypes.float16
  w = Tensor.linspace(0, 1, 3, requires_grad=True)
  (w * w).sum().backward()
  assert_close(w.grad.numpy(), np.array([0.0, 1.0, 2.0], np.float32), "linspace's gradient")
  steps = Tensor.linspace(-1, 2, steps=4, dtype=dtypes.float16)
  assert steps.dtype == dtypes.float16 and steps.tolist() == np.linspace(-1, 2, 4).tolist()

def test_small_tinygrad_methods():
  t = Tensor([1.0, 2.0])
  assert t.realize(do_update_stats=False) is t and t.fuse() is t and t.contiguous(arg=None).shape == (2,)
  assert t.requires_grad_(requires_grad=False).requires_grad is False and t.requires_grad_().requires_grad is True
  t.replace(Tensor([5.0, 6.0, 7.0]), allow_shape_mismatch=True)
  assert t.tolist() == [5.0, 6.0, 7.0]
  with pytest.raises(ValueError, match="replace"): t.replace(Tensor([1.0]))
  assert Tensor.zeros(2, 3).sequential(ll=[lambda x: x + 1, lambda x: x * 3]).tolist() == [[3.0] * 3] * 2

@pytest.mark.parametrize("data, value", [([1, 2, 3], 2.7), ([1.5, -2.0], 3), ([True, False], 0),
                                         ([[1.0], [2.0]], -1.25)])
def test_const_like(data, value):
  arr = np.array(data)
  got = Tensor(data).const_like(value)
  assert got.dtype == Tensor(data).dtype and got.shape == arr.shape
  np.testing.assert_array_equal(got.numpy(), np.full_like(arr, value))

# ---------------------------------------------------------------------------------------------------------------------
# size, is_floating_point

@pytest.mark.parametrize("shape", [(), (0,), (1,), (2, 3, 1)])
def test_size(shape):
  t, ref = Tensor.zeros(*shape), torch.zeros(shape)
  assert t.size() == tuple(ref.size())
  for dim in range(-len(shape), len(shape)):
    assert t.size(dim) == ref.size(dim) and t.size(dim=dim) == ref.size(dim=dim)
  for dim in (len(shape), -len(shape) - 1):
    with pytest.raises(IndexError): ref.size(dim)
    with pytest.raises(IndexError, match="size"): t.size(dim)

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "int8", "uint8", "int64",
                                   "bool", "float8_e4m3fn", "float8_e5m2"])
def test_is_floating_point(dtype):
  kiln_dtype = {"float8_e4m3fn": dtypes.fp8e4m3, "float8_e5m2": dtypes.fp8e5m2}.get(dtype, dtype)
  want = torch.zeros(2, dtype=getattr(torch, dtype)).is_floating_point()
  assert Tensor.zeros(2, dtype=kiln_dtype).is_floating_point() == want

# ---------------------------------------------------------------------------------------------------------------------
# unfold

@pytest.mark.parametrize("shape, dim, size, step", [
  ((7,), 0, 3, 2), ((5,), 0, 2, 1), ((5,), 0, 5, 1), ((6,), 0, 2, 3), ((3, 4), 1, 2, 2), ((2, 5, 3), -2, 3, 1),
  ((2, 4, 3), 2, 1, 2), ((5,), 0, 0, 1), ((0, 3), 1, 2, 1), ((0,), 0, 0, 2), ((1, 4), 0, 1, 1), ((), 0, 1, 1),
  ((), -1, 0, 2)])
def test_unfold(shape, dim, size, step):
  check(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), [shape])

def test_unfold_non_contiguous_and_dtypes():
  check(lambda t: t.T.unfold(0, 2, 1), lambda t: t.T.unfold(0, 2, 1), [(3, 4)])
  check(lambda t: t.flip(1).unfold(1, 3, 2), lambda t: t.flip(1).unfold(1, 3, 2), [(2, 6)])
  check(lambda t: t.unfold(1, 2, 1), lambda t: t.unfold(1, 2, 1), [(2, 4)], dtype="float16")
  check(lambda t: t.unfold(0, 3, 1), lambda t: t.unfold(0, 3, 1), [(4, 2)], dtype="int32")
  check(lambda t: t.unfold(-1, 2, 2), lambda t: t.unfold(-1, 2, 2), [(3, 5)], dtype="bool")
  check(lambda t: t.unfold(0, 2, 1), lambda t: t.unfold(0, 2, 1), [(3,)], device="PYTHON")

def test_unfold_errors():
  x = Tensor.zeros(2, 5)
  with pytest.raises(ValueError, match="unfold"): x.unfold(1, 6, 1)
  with pytest.raises(ValueError, match="unfold"): x.unfold(1, 2, 0)
  with pytest.raises(ValueError, match="unfold"): x.unfold(1, -1, 1)
  with pytest.raises(IndexError, match="unfold"): x.unfold(2, 1, 1)
  with pytest.raises(TypeError, match="unfold"): x.unfold(1, 2.0, 1)
  with pytest.raises(ValueError, match="unfold"): Tensor(1.0).unfold(0, 2, 1)

# ---------------------------------------------------------------------------------------------------------------------
# rearrange: each formula against the reshape/permute it means, in torch

@pytest.mark.parametrize("shape, formula, sizes, torch_fn", [
  ((2, 3), "a b -> b a", {}, lambda t: t.permute(1, 0)),
  ((2, 6, 3), "b (h w) c -> b c h w", {"h": 2}, lambda t: t.reshape(2, 2, 3, 3).permute(0, 3, 1, 2)),
  ((2, 3, 4), "b c (h w) -> (b h) (w c)", {"w": 2}, lambda t: t.reshape(2, 3, 2, 2).permute(0, 2, 3, 1).reshape(4, 6)),
  ((2, 3, 4, 5), "b ... c -> c b ...", {}, lambda t: t.permute(3, 0, 1, 2)),
  ((2, 3, 4), "... c -> (...) c", {}, lambda t: t.reshape(6, 4)),
  ((2, 3, 4), "a ... -> ... a", {}, lambda t: t.permute(1, 2, 0)),
  ((2, 3), "a ... b -> b ... a", {}, lambda t: t.permute(1, 0)),
  ((2, 1, 3), "a 1 b -> b a", {}, lambda t: t.reshape(2, 3).permute(1, 0)),
  ((2, 3), "a b -> a 1 b ()", {}, lambda t: t.reshape(2, 1, 3, 1)),
  ((2, 3), "a b -> (b 1 a)", {}, lambda t: t.permute(1, 0).reshape(6)),
  ((1, 2, 3), "() a b -> (a b)", {}, lambda t: t.reshape(6)),
  ((6,), "(a b c) -> c b a", {"a": 1, "c": 3}, lambda t: t.reshape(1, 2, 3).permute(2, 1, 0)),
  ((0, 4), "a (b c) -> c a b", {"b": 2}, lambda t: t.reshape(0, 2, 2).permute(2, 0, 1)),
  ((), "... -> 1 ...", {}, lambda t: t.reshape(1)),
  ((3, 4), "a b -> a b", {"a": 3}, lambda t: t),
])
def test_rearrange(shape, formula, sizes, torch_fn):
  check(lambda t: t.rearrange(formula, **sizes), torch_fn, [shape])

def test_rearrange_non_contiguous_and_dtypes():
  check(lambda t: t.T.rearrange("a (b c) -> (c a) b", c=2),
        lambda t: t.T.reshape(3, 2, 2).permute(2, 0, 1).reshape(6, 2), [(4, 3)])
  check(lambda t: t.rearrange("x y -> y x"), lambda t: t.T, [(2, 3)], dtype="float16")
  check(lambda t: t.rearrange("x (y z) -> z x y", z=2), lambda t: t.reshape(2, 2, 2).permute(2, 0, 1), [(2, 4)],
        dtype="int32")
  check(lambda t: t.rearrange("x y -> (y x)"), lambda t: t.T.reshape(-1), [(2, 2)], dtype="bool")
  check(lambda t: t.rearrange("x y -> y x"), lambda t: t.T, [(2, 3)], device="PYTHON")

@pytest.mark.parametrize("shape, formula, sizes", [
  ((2, 3), "a b", {}), ((2, 3), "a b -> a -> b", {}), ((2, 3), "a b -> a", {}), ((2, 3), "a b -> a a b", {}),
  ((2, 3), "a a -> a", {}), ((2, 3), "a b c -> a b c", {}), ((2, 3), "a -> a", {}), ((2, 3), "a (b -> a b", {}),
  ((2, 3), "a b) -> a b", {}), ((2, 3), "((a) b) -> a b", {}), ((2, 3), "a b -> a 2 b", {}),
  ((2, 3), "a _b -> a _b", {}), ((2, 3), "a b -> a b", {"c": 2}), ((6,), "(a b) -> a b", {}),
  ((6,), "(a b) -> a b", {"a": 4}), ((6,), "(a b) -> a b", {"a": 2, "b": 2}), ((2, 3), "a b -> a b", {"a": 3}),
  ((2, 3), "(a ...) -> a ...", {}), ((2, 3), "a 1 -> a", {}), ((2, 3), "... a ... -> a", {}),
  ((2, 3), "a b -> a b", {"a": -1}), ((2, 3), "a b c ... -> a b c ...", {})])
def test_rearrange_errors(shape, formula, sizes):
  with pytest.raises(ValueError, match="rearrange"): Tensor.zeros(*shape).rearrange(formula, **sizes)

# ---------------------------------------------------------------------------------------------------------------------
# idiv

def test_idiv_ints_against_torch_trunc():
  a = np.array([[-7, 7, -8, 9], [0, -1, 5, -5]], np.int32)
  b = np.array([[2, -2, 3, -4], [3, 2, -5, 7]], np.int32)
  check(lambda x, y: x.idiv(y), lambda x, y: torch.div(x, y, rounding_mode="trunc"), [a, b])
  check(lambda x, y: x.idiv(y, reverse=True), lambda x, y: torch.div(y, x, rounding_mode="trunc"), [b, a[:, 1:2]])
  check(lambda x: x.idiv(3), lambda x: torch.div(x, 3, rounding_mode="trunc"), [a])
  check(lambda x: x.T.idiv(-2), lambda x: torch.div(x.T, -2, rounding_mode="trunc"), [a])
  check(lambda x, y: x.idiv(y), lambda x, y: torch.div(x, y, rounding_mode="trunc"), [a.astype(np.int8), b[:1]])

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_idiv_floats_against_torch_trunc(dtype):
  a = np.array([[-7.5, 7.25, -0.5, 9.0], [3.0, -1.0, 5.5, -5.5]], dtype)
  b = np.array([2.0, -2.0, 3.0, -0.75], dtype)
  check(lambda x, y: x.idiv(y), lambda x, y: torch.div(x, y, rounding_mode="trunc"), [a, b], dtype=dtype)

# ---------------------------------------------------------------------------------------------------------------------
# matmul / dot with an accumulation dtype

@pytest.mark.parametrize("shapes, dtype, acc", [
  ([(2, 3), (3, 4)], "float16", "float32"), ([(3,), (3, 2)], "float32", "float16"),
  ([(2, 2, 3), (3,)], "float32", "float64"), ([(4, 3), (3, 2)], "int8", "int32")])
def test_dot_dtype(shapes, dtype, acc):
  def reference(x, y): return x.to(getattr(torch, acc)) @ y.to(getattr(torch, acc))
  check(lambda x, y: x.dot(y, dtype=acc), reference, shapes, dtype=dtype, low=-3, high=3)
  check(lambda x, y: x.matmul(y, dtype=getattr(dtypes, acc)), reference, shapes, dtype=dtype, low=-3, high=3)

def test_dot_dtype_bfloat16():
  # bfloat16 operands (made from float32 inputs, which numpy cannot hold as bfloat16) accumulated in float32
  check(lambda x, y: x.bfloat16().dot(y.bfloat16(), dtype=dtypes.float32),
        lambda x, y: x.bfloat16().float() @ y.bfloat16().float(), [(2, 3), (3, 2)])

def test_matmul_reverse_and_int8_accumulation():
  check(lambda x, y: x.matmul(y, reverse=True), lambda x, y: y @ x, [(3, 2), (4, 3)])
  check(lambda x, y: x.matmul(y, True, dtypes.float16), lambda x, y: y.half() @ x.half(), [(3, 2), (4, 3)])
  # 40 * 40 * 8 overflows int8 and int16 but not the int32 accumulator
  a = np.full((1, 8), 40, np.int8)
  got = Tensor(a).dot(Tensor(a.T.copy()), dtype=dtypes.int32)
  assert got.dtype == dtypes.int32 and got.tolist() == [[12800]]
  with pytest.raises(TypeError, match="matmul"): Tensor([1.0]).matmul([1.0])
  with pytest.raises(ValueError, match="matmul"): Tensor.zeros(2, 3).dot(Tensor.zeros(2, 3), dtype=dtypes.float16)

# ---------------------------------------------------------------------------------------------------------------------
# gradient(): tinygrad's (and torch.autograd.grad's) rule for targets the output does not depend on

def test_gradient_of_unreached_target_raises_unless_materialized():
  x, unrelated = Tensor([1.0, 2.0]), Tensor([3.0, 4.0, 5.0])
  y = (x * x).sum()
  with pytest.raises(RuntimeError, match="gradient.*materialize_grads"): y.gradient(x, unrelated)
  with pytest.raises(RuntimeError, match="gradient"): (x.detach() * 2).sum().gradient(x)
  gx, gu = y.gradient(x, unrelated, materialize_grads=True)
  tx = torch.tensor([1.0, 2.0], requires_grad=True)
  tu = torch.tensor([3.0, 4.0, 5.0], requires_grad=True)
  want = torch.autograd.grad((tx * tx).sum(), [tx, tu], allow_unused=True, materialize_grads=True)
  assert_close(gx.numpy(), want[0].numpy(), "dy/dx")
  assert_close(gu.numpy(), want[1].numpy(), "dy/d(unrelated)")
  with pytest.raises(RuntimeError): torch.autograd.grad((tx * tx).sum(), [tx, tu])   # the reference raises too

def test_backward_still_reaches_detached_targets_without_error():
  w = Tensor([1.0, 2.0], requires_grad=True)
  (w.detach() * 3 + w * w).sum().backward()
  assert w.grad.tolist() == [2.0, 4.0]
  v = Tensor([1.0, 2.0], requires_grad=True)
  (v.detach() * 2).sum().backward()
  assert v.grad is None or v.grad.tolist() == [0.0, 0.0]

# ---------------------------------------------------------------------------------------------------------------------
# tinygrad 0.11.0's other public modules: the names a script imports from tinygrad, tinygrad.helpers, .dtype, .device,
# .tensor, .nn, .nn.optim, .nn.state and .nn.datasets, keyed by kiln's module of the same name. "class(...)" is a class
# and its constructor's parameters, "class" one whose constructor takes anything, "attribute" a value. Produced with
# tinygrad installed by walking vars(module): the names defined in that module (for tinygrad itself and
# tinygrad.helpers: every public name), plus the names users import from it that it re-exports (Device, dtypes,
# _to_np_dtype, ...), typing helpers left out; signatures as for TINYGRAD_TENSOR_API, a ContextVar default written
# FUSE_OPTIM and a class default by its name.
TINYGRAD_MODULE_API = {
  'kiln': {
    'Context': 'class(**kwargs)',
    'Device': 'attribute',
    'GlobalCounters': 'class',
    'Tensor': 'class(data, device=None, dtype=None, requires_grad=None)',
    'TinyJit': 'class(fxn, captured=None, prune=False, optimize=False)',
    'UOp': 'class',
    'Variable': 'name, min_val, max_val, dtype=dtypes.int',
    'dtypes': 'class',
    'fetch': 'url, name=None, subdir=None, gunzip=False, allow_caching=True',
    'getenv': 'key, default=0',
  },
  'kiln.helpers': {
    'ALLOW_DEVICE_USAGE': 'attribute',
    'AMD_LLVM': 'attribute',
    'AMX': 'attribute',
    'BEAM': 'attribute',
    'CACHEDB': 'attribute',
    'CACHELEVEL': 'attribute',
    'CAPTURING': 'attribute',
    'CI': 'attribute',
    'CORRECT_DIVMOD_FOLDING': 'attribute',
    'Context': 'class(**kwargs)',
    'ContextVar': 'class(key, default_value)',
    'DEBUG': 'attribute',
    'DEVECTORIZE': 'attribute',
    'DISABLE_COMPILER_CACHE': 'attribute',
    'DISABLE_FAST_IDIV': 'attribute',
    'DONT_GROUP_REDUCES': 'attribute',
    'DONT_REALIZE_EXPAND': 'attribute',
    'FUSE_ARANGE': 'attribute',
    'FUSE_CONV_BW': 'attribute',
    'FUSE_OPTIM': 'attribute',
    'GlobalCounters': 'class',
    'IGNORE_BEAM_CACHE': 'attribute',
    'IMAGE': 'attribute',
    'JIT': 'attribute',
    'JIT_BATCH_SIZE': 'attribute',
    'LRU': 'attribute',
    'LazySeq': 'class(gen)',
    'MAX_BUFFER_SIZE': 'attribute',
    'Metadata': 'class(name, caller, backward=False)',
    'NOLOCALS': 'attribute',
    'NOOPT': 'attribute',
    'NO_MEMORY_PLANNER': 'attribute',
    'OSX': 'attribute',
    'PICKLE_BUFFERS': 'attribute',
    'PROFILE': 'attribute',
    'ProfileEvent': 'class',
    'ProfilePointEvent': 'class',
    'ProfileRangeEvent': 'class(device, name, st, en=None, is_copy=False)',
    'Profiling': "class(enabled=True, sort='cumtime', frac=0.2, fn=None, ts=1)",
    'QUANTIZE': 'attribute',
    'RING': 'attribute',
    'SPLIT_REDUCEOP': 'attribute',
    'TC_OPT': 'attribute',
    'TC_SEARCH_OVER_SHAPE': 'attribute',
    'TC_SELECT': 'attribute',
    'TRACEMETA': 'attribute',
    'TRANSCENDENTAL': 'attribute',
    'Timing': "class(prefix='', on_exit=None, enabled=True)",
    'TracingKey': 'class(display_name, keys=(), cat=None, ret=None)',
    'USE_TC': 'attribute',
    'VALIDATE_WITH_CPU': 'attribute',
    'VERSION': 'attribute',
    'WINO': 'attribute',
    'all_int': 't',
    'all_same': 'items',
    'ansilen': 's',
    'ansistrip': 's',
    'argfix': '*x',
    'argsort': 'x',
    'cache_dir': 'attribute',
    'capstone_flatdump': 'lib',
    'cdiv': 'x, y',
    'ceildiv': 'num, amt',
    'cmod': 'x, y',
    'colored': 'st, color, background=False',
    'colorize_float': 'x',
    'cpu_events': 'attribute',
    'cpu_objdump': "lib, objdump_tool='objdump'",
    'cpu_profile': "name, device='CPU', is_copy=False, display=True",
    'data64': 'data',
    'data64_le': 'data',
    'db_connection': '',
    'dedup': 'x',
    'diskcache': 'func',
    'diskcache_clear': '',
    'diskcache_get': 'table, key',
    'diskcache_put': 'table, key, val, prepickled=False',
    'fetch': 'url, name=None, subdir=None, gunzip=False, allow_caching=True',
    'flat_mv': 'mv',
    'flatten': 'l',
    'from_mv': 'mv, to_type=ctypes.c_char',
    'fromimport': 'mod, frm',
    'fully_flatten': 'l',
    'get_child': 'obj, key',
    'get_single_element': 'x',
    'getbits': 'value, start, end',
    'getenv': 'key, default=0',
    'hi32': 'x',
    'i2u': 'bits, value',
    'init_c_struct_t': 'fields',
    'init_c_var': 'ctypes_var, creat_cb',
    'is_numpy_ndarray': 'x',
    'lo32': 'x',
    'make_tuple': 'x, cnt',
    'merge_dicts': 'ds',
    'mv_address': 'mv',
    'partition': 'itr, fxn',
    'pluralize': 'st, cnt',
    'polyN': 'x, p',
    'prod': 'x',
    'round_down': 'num, amt',
    'round_up': 'num, amt',
    'strip_parens': 'fst',
    'suppress_finalizing': 'func',
    'temp': 'x, append_user=False',
    'time_to_str': 't, w=8',
    'to_char_p_p': 'options, to_type=ctypes.c_char',
    'to_function_name': 's',
    'to_mv': 'ptr, sz',
    'tqdm': "class(iterable=None, desc='', disable=False, unit='it', unit_scale=False, total=None, rate=100)",
    'trange': 'class(n, **kwargs)',
    'unwrap': 'x',
    'wait_cond': "cb, value=True, timeout_ms=10000, msg=''",
    'word_wrap': 'x, wrap=80',
  },
  'kiln.dtype': {
    'AddrSpace': 'class',
    'DTYPES_DICT': 'attribute',
    'DType': 'class(priority, itemsize, name, fmt, count, _scalar)',
    'DTypeMetaClass': 'class',
    'INVERSE_DTYPES_DICT': 'attribute',
    'ImageDType': 'class(priority, itemsize, name, fmt, count, _scalar, _base, addrspace, v, size=-1, shape=())',
    'PtrDType': 'class(priority, itemsize, name, fmt, count, _scalar, _base, addrspace, v, size=-1)',
    '_from_np_dtype': 'npdtype',
    '_from_torch_dtype': 'torchdtype',
    '_to_np_dtype': 'dtype',
    '_to_torch_dtype': 'dtype',
    'can_safe_cast': 'dt0, dt1',
    'dtypes': 'class',
    'env_default_float': 'attribute',
    'float_to_fp8': 'x, dtype',
    'fp8_to_float': 'x, dtype',
    'least_upper_dtype': '*ds',
    'least_upper_float': 'dt',
    'promo_lattice': 'attribute',
    'sum_acc_dtype': 'dt',
    'to_dtype': 'dtype',
    'truncate': 'attribute',
    'truncate_bf16': 'x',
    'truncate_fp16': 'x',
  },
  'kiln.device': {
    'ALL_DEVICES': 'attribute',
    'Allocator': 'class(dev)',
    'Buffer': 'class(device, size, dtype, opaque=None, options=None, initial_value=None, uop_refcount=0, base=None, '
              'offset=0, preallocate=False)',
    'BufferSpec': 'class(image=None, uncached=False, cpu_access=False, host=False, nolru=False, external_ptr=None)',
    'CompileError': 'class',
    'Compiled': 'class(device, allocator, renderer, compiler, runtime, graph=None, group_id=None)',
    'Compiler': 'class(cachekey=None)',
    'DMACPURef': 'class(addr, size)',
    'DMAFdRef': 'class(fd, offset, size)',
    'Device': 'attribute',
    'LRUAllocator': 'class(dev)',
    'MultiBuffer': 'class(device, size, dtype)',
    'ProfileDeviceEvent': "class(device, comp_tdiff=Decimal('0'), copy_tdiff=Decimal('0'))",
    'ProfileGraphEntry': 'class(device, name, st_id, en_id, is_copy)',
    'ProfileGraphEvent': 'class(ents, deps, sigs)',
    'ProfileProgramEvent': 'class(device, name, lib, base)',
    'cpu_events': 'attribute',
    'is_dtype_supported': 'dtype, device=None',
  },
  'kiln.tensor': {
    'Device': 'attribute',
    'Tensor': 'class(data, device=None, dtype=None, requires_grad=None)',
    'Variable': 'class',
    '_from_np_dtype': 'npdtype',
    '_to_np_dtype': 'dtype',
    'dtypes': 'class',
    'fetch': 'url, name=None, subdir=None, gunzip=False, allow_caching=True',
  },
  'kiln.nn': {
    'BatchNorm': 'class(sz, eps=1e-05, affine=True, track_running_stats=True, momentum=0.1)',
    'BatchNorm2d': 'class(sz, eps=1e-05, affine=True, track_running_stats=True, momentum=0.1)',
    'BatchNorm3d': 'class(sz, eps=1e-05, affine=True, track_running_stats=True, momentum=0.1)',
    'Conv1d': 'in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True',
    'Conv2d': 'class(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True)',
    'ConvTranspose1d': 'in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, dilation=1, '
                       'groups=1, bias=True',
    'ConvTranspose2d': 'class(in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, '
                       'dilation=1, groups=1, bias=True)',
    'Embedding': 'class(vocab_size, embed_size)',
    'GroupNorm': 'class(num_groups, num_channels, eps=1e-05, affine=True)',
    'InstanceNorm': 'class(num_features, eps=1e-05, affine=True)',
    'LSTMCell': 'class(input_size, hidden_size, bias=True)',
    'LayerNorm': 'class(normalized_shape, eps=1e-05, elementwise_affine=True)',
    'LayerNorm2d': 'class(normalized_shape, eps=1e-05, elementwise_affine=True)',
    'Linear': 'class(in_features, out_features, bias=True)',
    'RMSNorm': 'class(dim, eps=1e-06, elementwise_affine=True)',
  },
  'kiln.nn.optim': {
    'Adam': 'params, lr=0.001, b1=0.9, b2=0.999, eps=1e-08, fused=FUSE_OPTIM',
    'AdamW': 'params, lr=0.001, b1=0.9, b2=0.999, eps=1e-08, weight_decay=0.01, fused=FUSE_OPTIM',
    'LAMB': 'class(params, lr=0.001, b1=0.9, b2=0.999, eps=1e-06, weight_decay=0.0, adam=False, fused=FUSE_OPTIM)',
    'LARS': 'class(params, lr=0.001, momentum=0.9, weight_decay=0.0001, ns_steps=0, ns_params=None, nesterov=False, '
            'classic=True, pre_wd=True, tcoef=0.001, fused=FUSE_OPTIM)',
    'Muon': 'params, lr=0.02, momentum=0.95, weight_decay=0.0, ns_steps=5, ns_params=(3.4445, -4.775, 2.0315), '
            'nesterov=True, fused=FUSE_OPTIM',
    'Optimizer': 'class(params, lr, fused=FUSE_OPTIM)',
    'OptimizerGroup': 'class(*optimizers)',
    'SGD': 'params, lr=0.001, momentum=0.0, weight_decay=0.0, nesterov=False, classic=False, fused=FUSE_OPTIM',
  },
  'kiln.nn.state': {
    'TensorIO': 'class(t)',
    'accept_filename': 'func',
    'get_parameters': 'obj',
    'get_state_dict': "obj, prefix='', tensor_type=Tensor",
    'ggml_data_to_tensor': 't, n, ggml_type',
    'gguf_load': 'tensor',
    'inverse_safe_dtypes': 'attribute',
    'load_state_dict': 'model, state_dict, strict=True, verbose=True, consume=False, realize=True',
    'safe_dtypes': 'attribute',
    'safe_load': 'fn',
    'safe_load_metadata': 't',
    'safe_save': 'tensors, fn, metadata=None',
    'tar_extract': 't',
    'torch_load': 't',
  },
  'kiln.nn.datasets': {
    'cifar': 'device=None',
    'mnist': 'device=None, fashion=False',
  },
}

# tinygrad 0.11.0's members of DType, dtypes, TinyJit, Optimizer, Buffer and the Device registry: "property", "attribute" or
# a method's parameters, produced as TINYGRAD_TENSOR_API's (tested below, after the module table's test)
TINYGRAD_CLASS_API = {
  'kiln.dtype.DType': {
    'base': 'property',
    'max': 'property',
    'min': 'property',
    'nbytes': '',
    'new': 'priority, itemsize, name, fmt',
    'ptr': 'size=-1, addrspace=AddrSpace.GLOBAL',
    'scalar': '',
    'vcount': 'property',
    'vec': 'sz',
  },
  'kiln.dtype.dtypes': {
    'all': 'attribute',
    'as_const': 'val, dtype',
    'bfloat16': 'attribute',
    'bool': 'attribute',
    'char': 'attribute',
    'default_float': 'attribute',
    'default_int': 'attribute',
    'double': 'attribute',
    'fields': '',
    'finfo': 'dtype',
    'float': 'attribute',
    'float16': 'attribute',
    'float32': 'attribute',
    'float64': 'attribute',
    'floats': 'attribute',
    'fp8e4m3': 'attribute',
    'fp8e5m2': 'attribute',
    'fp8s': 'attribute',
    'from_py': 'x',
    'half': 'attribute',
    'imagef': 'shp',
    'imageh': 'shp',
    'int': 'attribute',
    'int16': 'attribute',
    'int32': 'attribute',
    'int64': 'attribute',
    'int8': 'attribute',
    'ints': 'attribute',
    'is_bool': 'x',
    'is_float': 'x',
    'is_int': 'x',
    'is_unsigned': 'x',
    'long': 'attribute',
    'max': 'dtype',
    'min': 'dtype',
    'short': 'attribute',
    'sints': 'attribute',
    'uchar': 'attribute',
    'uint': 'attribute',
    'uint16': 'attribute',
    'uint32': 'attribute',
    'uint64': 'attribute',
    'uint8': 'attribute',
    'uints': 'attribute',
    'ulong': 'attribute',
    'ushort': 'attribute',
    'void': 'attribute',
  },
  'kiln.TinyJit': {
    'add': 'ei',
    'add_buffer': 'b',
    'input_replace': 'property',
    'jit_cache': 'property',
    'reset': '',
  },
  'kiln.nn.optim.Optimizer': {
    'schedule_step': '',
    'step': '',
    'zero_grad': '',
  },
  'kiln.device.Buffer': {
    'allocate': 'opaque=None, external_ptr=None',
    'as_buffer': 'allow_zero_copy=False, force_zero_copy=False',
    'as_typed_buffer': 'shape=None, allow_zero_copy=False, force_zero_copy=False',
    'base': 'property',
    'copyin': 'mv',
    'copyout': 'mv',
    'deallocate': '',
    'ensure_allocated': '',
    'is_allocated': '',
    'is_initialized': '',
    'nbytes': 'property',
    'numpy': '',
    'view': 'size, dtype, offset',
  },
  'kiln.device.Device': {   # the registry instance: its class's members
    'DEFAULT': 'property',
    'canonicalize': 'device',
    'default': 'property',
    'get_available_devices': '',
  },
}

# names kiln leaves out on purpose
MODULE_EXCLUDED = {
  **{f"kiln.helpers.{name}": "tinygrad's profiler timeline (PROFILE=1, VIZ); kiln has no timeline yet"
     for name in ("ProfileEvent", "ProfilePointEvent", "ProfileRangeEvent", "TracingKey", "cpu_events", "cpu_profile")},
  "kiln.helpers.cpu_objdump": "tinygrad's DEBUG=7 disassembly of CPU kernels; kiln prints kernel source (DEBUG=4)",
  "kiln.helpers.capstone_flatdump": "tinygrad's DEBUG=7 disassembly through capstone; not a kiln dependency",
  "kiln.dtype.ImageDType": "Qualcomm image textures (IMAGE=1); kiln has no image dtypes",
  "kiln.dtype.DTypeMetaClass": "tinygrad's cache of DType instances; kiln's dtypes are module-level singletons",
  "kiln.device.BufferSpec": "tinygrad's buffer options (image, uncached, host, external_ptr); kiln's Buffer has none",
  "kiln.device.MultiBuffer": "multi-device tensors come later (SYSTEM.md: Multi-device)",
  "kiln.device.DMACPURef": "DMA references for multi-device copies (SYSTEM.md: Multi-device)",
  "kiln.device.DMAFdRef": "DMA references for multi-device copies (SYSTEM.md: Multi-device)",
  **{f"kiln.device.{name}": "tinygrad's profiler timeline (PROFILE=1, VIZ); kiln has no timeline yet"
     for name in ("ProfileDeviceEvent", "ProfileGraphEntry", "ProfileGraphEvent", "ProfileProgramEvent", "cpu_events")},
}
# names kiln has whose signature or value differs from tinygrad's on purpose (their existence is still checked)
MODULE_DIFFERS = {
  "kiln.UOp": "kiln's own IR node (op, dtype, src, arg): tinygrad's tag/children are internal",
  "kiln.helpers.cache_dir": "a function returning the folder (created on demand) as a Path; tinygrad's is a str",
  "kiln.helpers.CACHEDB": "a setting naming kiln's cache folder; tinygrad's is the path of its sqlite file",
  "kiln.helpers.tqdm": "disable=None (off when stderr is not a terminal); tinygrad's default is False",
  "kiln.device.Allocator": "kiln's allocators need no device argument",
  "kiln.device.LRUAllocator": "kiln's allocators need no device argument; max_cached_bytes bounds the cache",
  "kiln.device.Buffer": "kiln's Buffer(device, size, dtype, initial_value=None) takes no options, base or offset "
                        "(Buffer.view(size, dtype, offset) makes views)",
  "kiln.device.Compiled": "kiln's Compiled(device, allocator, renderer, compiler, runtime) registers graphs in "
                          "kiln.engine.graph.GRAPHS",
  "kiln.device.Compiler": "kiln's compilers key their disk cache by cache_key(), not a constructor argument",
  **{f"{module}.fetch": "allow_caching=None reads DISABLE_HTTP_CACHE at each call; tinygrad reads it at import"
     for module in ("kiln", "kiln.helpers", "kiln.tensor")},
  "kiln.tensor.Variable": "tinygrad.tensor's Variable is its UOp class; kiln.tensor's is kiln.Variable (the "
                          "constructor that tinygrad exports as tinygrad.Variable)",
}
# callables whose positional parameters kiln names differently: tinygrad's utilities are called positionally, and
# kiln keeps descriptive names (STYLE.md) where tinygrad's are single letters; order, kinds and defaults still match
NAMES_DIFFER = ("kiln.helpers.", "kiln.nn.state.safe_load_metadata", "kiln.nn.state.tar_extract",
                "kiln.nn.state.torch_load")

def _module(name: str):
  import importlib
  return importlib.import_module(name)

def _callable_parameters(obj) -> list[inspect.Parameter]:
  fn = obj.__init__ if inspect.isclass(obj) else obj
  return [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]

_MODULE_NAMES = [f"{module}.{name}" for module, names in TINYGRAD_MODULE_API.items() for name in names]

@pytest.mark.parametrize("qualname", _MODULE_NAMES)
def test_tinygrad_module_names_exist_with_same_parameters(qualname):
  module, name = qualname.rsplit(".", 1)
  spec = TINYGRAD_MODULE_API[module][name]
  mod = _module(module)
  if qualname in MODULE_EXCLUDED:
    assert not hasattr(mod, name), f"{qualname} exists now: remove it from MODULE_EXCLUDED"
    return
  assert hasattr(mod, name), f"{qualname} (tinygrad 0.11: {spec}) is missing"
  obj = getattr(mod, name)
  if qualname in MODULE_DIFFERS: return
  if spec.startswith("class"): assert inspect.isclass(obj), f"{qualname} should be a class"
  elif spec != "attribute": assert callable(obj), f"{qualname} should be callable"
  if spec in ("class", "attribute"): return
  spec = spec[len("class("):-1] if spec.startswith("class(") else spec
  problems = signature_problems(name, spec, got=_callable_parameters(obj),
                                check_names=not qualname.startswith(NAMES_DIFFER))
  assert not problems, f"{qualname}: tinygrad's is ({spec}); " + "; ".join(problems)

# public methods and attributes of tinygrad's DType, dtypes, TinyJit, Optimizer and Device, as for
# TINYGRAD_TENSOR_API
CLASS_EXCLUDED = {
  "kiln.dtype.dtypes.imageh": "Qualcomm image textures (IMAGE=1); kiln has no image dtypes",
  "kiln.dtype.dtypes.imagef": "Qualcomm image textures (IMAGE=1); kiln has no image dtypes",
  "kiln.TinyJit.add": "tinygrad's capture internals (ExecItems appended while capturing); kiln's CapturedJit "
                      "records them",
  "kiln.TinyJit.add_buffer": "tinygrad's capture internals; kiln's CapturedJit plans its intermediate buffers itself",
  "kiln.TinyJit.input_replace": "tinygrad's capture internals; kiln's CapturedJit swaps input buffers itself",
}

# members whose parameters differ on purpose (their existence is still checked)
CLASS_DIFFERS = {
  "kiln.device.Buffer.allocate": "kiln takes external_ptr only (by keyword, as tinygrad's callers pass it); tinygrad's "
                                 "opaque, a device handle to adopt, has no kiln counterpart",
}

# an instance to look for instance attributes on (kiln's Buffer.nbytes is one; tinygrad's is a property)
def _sample_buffer():
  from kiln.device import Buffer
  return Buffer("CPU", 1, dtypes.uint8)
SAMPLE_INSTANCES = {"kiln.device.Buffer": _sample_buffer}

_CLASS_NAMES = [f"{cls}.{name}" for cls, names in TINYGRAD_CLASS_API.items() for name in names]

@pytest.mark.parametrize("qualname", _CLASS_NAMES)
def test_tinygrad_class_members_exist_with_same_parameters(qualname):
  cls_name, name = qualname.rsplit(".", 1)
  module, cls_attr = cls_name.rsplit(".", 1)
  spec = TINYGRAD_CLASS_API[cls_name][name]
  cls = getattr(_module(module), cls_attr)
  if qualname in CLASS_EXCLUDED:
    assert not hasattr(cls, name), f"{qualname} exists now: remove it from CLASS_EXCLUDED"
    return
  holder = SAMPLE_INSTANCES[cls_name]() if cls_name in SAMPLE_INSTANCES and spec in ("property", "attribute") else cls
  assert hasattr(holder, name), f"{qualname} (tinygrad 0.11: {spec}) is missing"
  if spec in ("property", "attribute") or qualname in CLASS_DIFFERS: return
  attr = inspect.getattr_static(cls, name)
  if qualname == "kiln.dtype.DType.scalar":   # a property in kiln; a DType called returns itself, so scalar() works
    assert isinstance(attr, property) and dtypes.half.vec(4).scalar() is dtypes.half
    return
  if isinstance(attr, property): pytest.fail(f"{qualname} is a property in kiln, a method in tinygrad")
  fn = getattr(attr, "__func__", attr)
  problems = signature_problems(name, spec, got=[p for p in inspect.signature(fn).parameters.values()
                                                 if p.name not in ("self", "cls")])
  assert not problems, f"{qualname}: tinygrad's is ({spec}); " + "; ".join(problems)

def test_module_exclusions_are_tinygrad_names():
  assert set(MODULE_EXCLUDED) | set(MODULE_DIFFERS) <= set(_MODULE_NAMES)
  assert set(CLASS_EXCLUDED) | set(CLASS_DIFFERS) <= set(_CLASS_NAMES)

# the state dicts of tinygrad 0.11's layers (get_state_dict: key -> (shape, dtype name)), so checkpoints move between
# the two: produced with tinygrad installed from get_state_dict(nn.<layer>) of each constructor call below
TINYGRAD_LAYER_STATE = {
  'BatchNorm(4)': {
    'bias': ((4,), 'float'),
    'num_batches_tracked': ((1,), 'long'),
    'running_mean': ((4,), 'float'),
    'running_var': ((4,), 'float'),
    'weight': ((4,), 'float'),
  },
  'BatchNorm(4, affine=False)': {
    'num_batches_tracked': ((1,), 'long'),
    'running_mean': ((4,), 'float'),
    'running_var': ((4,), 'float'),
  },
  'BatchNorm(4, track_running_stats=False)': {
    'bias': ((4,), 'float'),
    'num_batches_tracked': ((1,), 'long'),
    'weight': ((4,), 'float'),
  },
  'Conv1d(2, 3, 3)': {'bias': ((3,), 'float'), 'weight': ((3, 2, 3), 'float')},
  'Conv2d(2, 3, 3, bias=False)': {'weight': ((3, 2, 3, 3), 'float')},
  'Conv2d(4, 6, (3, 2), groups=2)': {'bias': ((6,), 'float'), 'weight': ((6, 2, 3, 2), 'float')},
  'ConvTranspose1d(2, 3, 3)': {'bias': ((3,), 'float'), 'weight': ((2, 3, 3), 'float')},
  'ConvTranspose2d(4, 6, 3, groups=2)': {'bias': ((6,), 'float'), 'weight': ((4, 3, 3, 3), 'float')},
  'Embedding(10, 4)': {'weight': ((10, 4), 'float')},
  'GroupNorm(2, 4)': {'bias': ((4,), 'float'), 'weight': ((4,), 'float')},
  'GroupNorm(2, 4, affine=False)': {},
  'InstanceNorm(3)': {'bias': ((3,), 'float'), 'weight': ((3,), 'float')},
  'LSTMCell(3, 5)': {
    'bias_hh': ((20,), 'float'),
    'bias_ih': ((20,), 'float'),
    'weight_hh': ((20, 5), 'float'),
    'weight_ih': ((20, 3), 'float'),
  },
  'LSTMCell(3, 5, bias=False)': {'weight_hh': ((20, 5), 'float'), 'weight_ih': ((20, 3), 'float')},
  'LayerNorm(5)': {'bias': ((5,), 'float'), 'weight': ((5,), 'float')},
  'LayerNorm((2, 5), elementwise_affine=False)': {},
  'LayerNorm2d(3)': {'bias': ((3,), 'float'), 'weight': ((3,), 'float')},
  'Linear(3, 4)': {'bias': ((4,), 'float'), 'weight': ((4, 3), 'float')},
  'Linear(3, 4, bias=False)': {'weight': ((4, 3), 'float')},
  'RMSNorm(6)': {'weight': ((6,), 'float')},
  'RMSNorm(6, elementwise_affine=False)': {},
}
# where kiln's state dict differs: PyTorch's BatchNorm counter has shape () (load_state_dict takes either), and
# without track_running_stats kiln (as PyTorch) keeps no counter
LAYER_STATE_DIFFERS = {("BatchNorm(4)", "num_batches_tracked"): ((), "long"),
                       ("BatchNorm(4, affine=False)", "num_batches_tracked"): ((), "long"),
                       ("BatchNorm(4, track_running_stats=False)", "num_batches_tracked"): None}

@pytest.mark.parametrize("layer", sorted(TINYGRAD_LAYER_STATE))
def test_layer_state_dicts_match_tinygrad(layer):
  from kiln import nn
  from kiln.nn.state import get_state_dict
  got = {k: (tuple(v.shape), v.dtype.name) for k, v in get_state_dict(eval(f"nn.{layer}", {"nn": nn})).items()}
  want = dict(TINYGRAD_LAYER_STATE[layer])
  for (name, key), kiln_entry in LAYER_STATE_DIFFERS.items():
    if name == layer:
      if kiln_entry is None: del want[key]
      else: want[key] = kiln_entry
  assert got == want, f"nn.{layer}: kiln {got}, tinygrad {TINYGRAD_LAYER_STATE[layer]}"
