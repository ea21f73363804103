"""nn functional ops against PyTorch: einsum, normalization, dropout, one_hot, attention, linear and the losses."""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, Device, dtypes
from helpers import check, assert_close

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom")   # torch warns on var of an empty axis

def labels(shape, classes, seed=0, ignore=None, low=0):
  """Random int32 class labels in [low, classes); a few set to `ignore` when given."""
  rng = np.random.default_rng(seed)
  y = rng.integers(low, classes, shape).astype(np.int32)
  if ignore is not None and y.size: y.reshape(-1)[::3] = ignore
  return y

def kt(a: np.ndarray, device=None) -> Tensor: return Tensor(a, device=device or Device.DEFAULT)
def tt(a: np.ndarray) -> torch.Tensor: return torch.tensor(a.astype(np.int64) if a.dtype.kind in "iu" else a)

# ---------------------------------------------------------------------------------------------------------------------
# einsum

EINSUM = [
  ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("ij->ji", [(2, 3)]),
  ("ij->", [(2, 3)]), ("ij", [(2, 3)]), ("ji", [(2, 3)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]),
  ("iij->j", [(2, 2, 3)]), ("i,j->ij", [(2,), (3,)]), ("ij,ij->ij", [(2, 3), (2, 3)]), ("ij,jk", [(2, 3), (3, 2)]),
  (" i j , j k -> k i ", [(2, 3), (3, 2)]), ("...ij,...jk->...ik", [(2, 1, 2, 3), (3, 3, 2)]), ("...i", [(2, 3)]),
  ("...i->i", [(2, 3)]), ("i...->", [(2, 3)]), ("b...,b...->b", [(2, 3), (2, 3)]), ("i,i->", [(3,), (1,)]),
  ("ij,jk->ik", [(2, 0), (0, 3)]), ("ij,jk->ik", [(1, 3), (3, 1)]), ("i,i", [(4,), (4,)]), ("->", [()]),
  ("ab,bc,cd->ad", [(2, 3), (3, 2), (2, 2)]), ("Ab,ab->bA", [(2, 3), (2, 3)])]

@pytest.mark.parametrize("formula, shapes", EINSUM, ids=[f"{f}-{s}" for f, s in EINSUM])
def test_einsum(formula, shapes):
  check(lambda *xs: Tensor.einsum(formula, *xs), lambda *xs: torch.einsum(formula, *xs), shapes)

def test_einsum_noncontiguous_list_operands_and_dtypes():
  check(lambda a, b: Tensor.einsum("ij,jk->ik", [a.T, b.flip(0)]),
        lambda a, b: torch.einsum("ij,jk->ik", a.T, b.flip(0)),
        [(3, 2), (3, 2)])
  check(lambda a, b: Tensor.einsum("bij,bkj->bik", a, b), lambda a, b: torch.einsum("bij,bkj->bik", a, b),
        [(2, 2, 3), (2, 2, 3)], dtype="float16")
  check(lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b), [(2, 3), (3, 2)],
        dtype="int32", low=-5, high=5)
  a, b = Tensor([[1, 2]], dtype="float16"), Tensor([[3], [4]], dtype="float16")
  out = Tensor.einsum("ij,jk->ik", a, b, dtype="float32")
  assert out.dtype == dtypes.float32 and out.tolist() == [[11.0]]

@pytest.mark.parametrize("formula, shapes, match", [
  ("ij,jk->ik", [(2, 3)], "names 2 operand"),
  ("ij,jk->ik", [(2, 3), (4, 2)], r"subscript 'j' has size 3 in operand 0 \(2, 3\) but 4 in operand 1 \(4, 2\)"),
  ("ij->ij", [(2, 3, 4)], r"operand 0 \(2, 3, 4\) has 3 dims but subscripts 'ij' name 2"),
  ("ii->i", [(2, 3)], r"subscript 'i' is repeated in operand 0 \(2, 3\)"),
  ("i1->i", [(2, 3)], "invalid subscript '1'"), ("ij->k", [(2, 3)], "output subscript 'k' does not appear"),
  ("ij->ii", [(2, 3)], "output subscript 'i' appears more than once"), ("i..j..->", [(2, 3)], "malformed"),
  ("...ij,...jk->...ik", [(2, 2, 3), (3, 3, 2)], "broadcast axes"), ("ijk...->", [(2, 3)], "has 2 dims")])
def test_einsum_errors(formula, shapes, match):
  with pytest.raises(ValueError, match=match): Tensor.einsum(formula, *[Tensor.ones(*s) for s in shapes])

def test_einsum_error_names_the_op_and_line():
  with pytest.raises(ValueError, match=r"einsum: .*test_ops_nn.py"):
    Tensor.einsum("i,i", Tensor.ones(2), Tensor.ones(3))
  with pytest.raises(TypeError, match="einsum: operand 1"): Tensor.einsum("i,i", Tensor.ones(2), [1, 2])

# ---------------------------------------------------------------------------------------------------------------------
# normalization

def torch_layernorm(x, axis, eps=1e-5):
  return (x - x.mean(axis, keepdim=True)) / (x.var(axis, unbiased=False, keepdim=True) + eps).sqrt()

@pytest.mark.parametrize("shape, axis", [((2, 3, 4), -1), ((2, 3, 4), (1, 2)), ((3, 4), 0), ((1, 5), -1), ((0, 3), -1)],
                         ids=str)
def test_layernorm(shape, axis):
  check(lambda x: x.layernorm(axis), lambda x: torch_layernorm(x, axis), [shape])

def test_layernorm_matches_torch_and_float16_and_noncontiguous():
  check(lambda x: x.layernorm(eps=1e-3), lambda x: F.layer_norm(x, (4,), eps=1e-3), [(2, 3, 4)])
  check(lambda x: x.T.layernorm(), lambda x: F.layer_norm(x.T, (2,)), [(2, 3)])
  check(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (8,)), [(2, 8)], dtype="float16", atol=3e-2)

def torch_batchnorm(x, w, b, mean, invstd, axis=1):
  shape = [s if a == axis else 1 for a, s in enumerate(x.shape)]
  return (x - mean.reshape(shape)) * w.reshape(shape) * invstd.reshape(shape) + b.reshape(shape)

@pytest.mark.parametrize("shape, axis", [((2, 3, 2, 2), 1), ((4, 3), 1), ((3, 2), 0), ((2, 1, 3), 1)], ids=str)
def test_batchnorm(shape, axis):
  c = shape[axis]
  check(lambda x, w, b, m, s: x.batchnorm(w, b, m, s, axis), lambda x, w, b, m, s: torch_batchnorm(x, w, b, m, s, axis),
        [shape, (c,), (c,), (c,), (c,)])

def test_batchnorm_matches_torch_eval_and_optional_params():
  rng = np.random.default_rng(1)
  x, mean, var = rng.standard_normal((2, 3, 2)).astype(np.float32), rng.standard_normal(3).astype(np.float32), \
    rng.uniform(0.5, 2, 3).astype(np.float32)
  got = kt(x).batchnorm(None, None, kt(mean), kt(1 / np.sqrt(var + 1e-5)))
  want = F.batch_norm(tt(x), tt(mean), tt(var), training=False, eps=1e-5)
  assert_close(got.numpy(), want.numpy(), "batchnorm vs F.batch_norm")
  # invstd broadcasting against the whole input (tinygrad allows it when it is not laid out per channel)
  check(lambda x, m: x.batchnorm(None, None, m, Tensor(2.0)), lambda x, m: (x - m.reshape(1, 3, 1)) * 2.0,
        [(2, 3, 2), (3,)])
  check(lambda x, w, b: x.batchnorm(w, b, Tensor.zeros(4, dtype="float16"), Tensor.ones(4, dtype="float16")),
        lambda x, w, b: x * w + b, [(2, 4), (4,), (4,)], dtype="float16")

def test_batchnorm_errors():
  with pytest.raises(ValueError, match=r"batchnorm: mean of shape \(4,\) does not match"):
    Tensor.ones(2, 3).batchnorm(None, None, Tensor.zeros(4), Tensor.ones(3))
  with pytest.raises(IndexError, match="batchnorm"): Tensor.ones(2, 3).batchnorm(None, None, Tensor.zeros(3),
                                                                                Tensor.ones(3), axis=2)

# ---------------------------------------------------------------------------------------------------------------------
# dropout, one_hot

def test_dropout():
  x = Tensor.ones(1000, requires_grad=True)
  assert x.dropout(0.5) is x and x.dropout() is x   # not training: the identity
  with Tensor.train():
    assert x.dropout(0) is x
    Tensor.manual_seed(0)
    out = x.dropout(0.25)
    out.sum().backward()
    values, grad = out.numpy(), x.grad.numpy()
    assert set(np.unique(values).tolist()) <= {0.0, float(np.float32(1 / 0.75))} and 0.18 < (values == 0).mean() < 0.32
    np.testing.assert_allclose(grad, values)   # the gradient goes through the kept elements, scaled alike
    assert Tensor.ones(3, 2).dropout(1.0).tolist() == [[0.0, 0.0]] * 3
    assert Tensor.ones(2, dtype="float16").dropout(0.5).dtype == dtypes.float16
  assert not Tensor.training
  for p in (-0.1, 1.5):
    with pytest.raises(ValueError, match="dropout: p="): Tensor.ones(2).dropout(p)

@pytest.mark.parametrize("shape, classes", [((5,), 4), ((2, 3), 3), ((), 3), ((0,), 2), ((4,), 1)], ids=str)
def test_one_hot(shape, classes):
  y = labels(shape, classes, seed=2)
  got = kt(y).one_hot(classes)
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), F.one_hot(tt(y), classes).numpy())

def test_one_hot_inferred_and_errors():
  y = np.array([[0, 3], [1, 1]], np.int32)
  np.testing.assert_array_equal(kt(y).one_hot().numpy(), F.one_hot(tt(y)).numpy())
  assert Tensor([2, 0], dtype="int8").one_hot().tolist() == [[0, 0, 1], [1, 0, 0]]
  with pytest.raises(TypeError, match="one_hot: needs an int tensor"): Tensor([1.0]).one_hot(2)
  with pytest.raises(ValueError, match="one_hot: cannot infer"): Tensor.zeros(0, dtype="int32").one_hot()
  with pytest.raises(ValueError, match="one_hot: class values must be non-negative"): Tensor([1, -1]).one_hot()
  with pytest.raises(ValueError, match="one_hot: num_classes"): Tensor([1]).one_hot(-2)

# ---------------------------------------------------------------------------------------------------------------------
# attention

def sdpa_case(q_shape, k_shape, v_shape, mask=None, dtype="float32", device=None, **kwargs):
  extra = [] if mask is None else [mask]
  check(lambda q, k, v, *m: q.scaled_dot_product_attention(k, v, *m, **kwargs),
        lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m, **kwargs),
        [q_shape, k_shape, v_shape] + extra, dtype=dtype, device=device, atol=3e-2 if dtype == "float16" else 1e-5)

def test_sdpa_plain_and_causal():
  sdpa_case((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3))
  sdpa_case((1, 2, 4, 4), (1, 2, 4, 4), (1, 2, 4, 4), is_causal=True)
  sdpa_case((1, 1, 3, 2), (1, 1, 5, 2), (1, 1, 5, 2), is_causal=True)   # L < S: top-left aligned, as in torch
  sdpa_case((3, 4), (2, 4), (2, 1))   # no batch or head axes
  sdpa_case((1, 1, 1, 4), (1, 1, 1, 4), (1, 1, 1, 4))

def test_sdpa_masks():
  rng = np.random.default_rng(3)
  bool_mask = rng.random((2, 1, 3, 5)) < 0.7
  bool_mask[..., 0] = True   # no row fully masked
  sdpa_case((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4), mask=bool_mask)
  float_mask = rng.standard_normal((3, 5)).astype(np.float32)
  sdpa_case((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4), mask=float_mask)   # the mask's gradient is checked as well

def test_sdpa_float16_noncontiguous_and_gqa():
  sdpa_case((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), dtype="float16", is_causal=True)
  check(lambda q, k, v: q.transpose(1, 2).scaled_dot_product_attention(k.transpose(1, 2), v.transpose(1, 2)),
        lambda q, k, v: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
        [(1, 3, 2, 4), (1, 3, 2, 4), (1, 3, 2, 4)])
  sdpa_case((1, 4, 3, 2), (1, 2, 3, 2), (1, 2, 3, 2), enable_gqa=True)

def test_sdpa_dropout_only_while_training():
  q = Tensor.ones(1, 1, 4, 2)
  v = Tensor.arange(8).reshape(1, 1, 4, 2).float()
  np.testing.assert_allclose(q.scaled_dot_product_attention(q, v, dropout_p=0.5).numpy(),
                             np.broadcast_to(v.numpy().mean(2, keepdims=True), (1, 1, 4, 2)), rtol=1e-6)
  with Tensor.train():
    Tensor.manual_seed(1)
    out = Tensor.ones(1, 1, 64, 2).scaled_dot_product_attention(Tensor.ones(1, 1, 64, 2), Tensor.ones(1, 1, 64, 2),
                                                                dropout_p=0.5).numpy()
  # each output is (kept weights of 1/64 each) * 2: on average 1, and not identical everywhere
  assert 0.7 < out.mean() < 1.3 and out.std() > 0

def test_sdpa_errors():
  q = Tensor.ones(1, 2, 3, 4)
  with pytest.raises(ValueError, match="scaled_dot_product_attention: query .* and key .* differ"):
    q.scaled_dot_product_attention(Tensor.ones(1, 2, 3, 5), Tensor.ones(1, 2, 3, 5))
  with pytest.raises(ValueError, match="sequence length"): q.scaled_dot_product_attention(q, Tensor.ones(1, 2, 2, 4))
  with pytest.raises(ValueError, match="either attn_mask or is_causal"):
    q.scaled_dot_product_attention(q, q, attn_mask=Tensor.ones(3, 3, dtype="bool"), is_causal=True)
  with pytest.raises(ValueError, match="not a multiple"):
    q.scaled_dot_product_attention(Tensor.ones(1, 3, 3, 4), Tensor.ones(1, 3, 3, 4), enable_gqa=True)
  with pytest.raises(ValueError, match="at least 2 dims"): Tensor.ones(4).scaled_dot_product_attention(q, q)

# ---------------------------------------------------------------------------------------------------------------------
# linear, sequential

def test_linear_and_sequential():
  check(lambda x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, [(2, 3), (3, 4), (4,)])
  check(lambda x, w: x.linear(w), lambda x, w: F.linear(x, w.T), [(2, 2, 3), (3, 1)])
  check(lambda x, w, b: x.linear(w, b), lambda x, w, b: x * w + b, [(2, 3), (3,), (3,)])   # a 1-d weight scales
  check(lambda x, w: x.T.linear(w, dtype="float16"), lambda x, w: x.T.half() @ w.half(), [(3, 2), (3, 2)], atol=2e-2)
  check(lambda x, w: x.sequential([lambda t: t.linear(w), Tensor.relu, lambda t: t * 2]),
        lambda x, w: (x @ w).relu() * 2, [(2, 3), (3, 3)])
  x = Tensor([1.0])
  assert x.sequential([]) is x
  with pytest.raises(ValueError, match="matmul: inner dimensions differ"): Tensor.ones(2, 3).linear(Tensor.ones(2, 2))

# ---------------------------------------------------------------------------------------------------------------------
# losses

REDUCTION_IDS = ["none", "sum", "mean"]

@pytest.mark.parametrize("reduction", REDUCTION_IDS)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (1,)], ids=str)
def test_binary_crossentropy(shape, reduction):
  check(lambda x, y: x.binary_crossentropy(y, reduction),
        lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction),
        [shape, shape], low=0.05, high=0.95)

def test_binary_crossentropy_clamps_logs_and_float16():
  x, y = np.array([0.0, 1.0, 0.5, 1.0], np.float32), np.array([1.0, 0.0, 1.0, 1.0], np.float32)
  assert_close(kt(x).binary_crossentropy(kt(y), "none").numpy(),
               F.binary_cross_entropy(tt(x), tt(y), reduction="none").numpy(), "bce at 0 and 1")
  check(lambda x, y: x.binary_crossentropy(y), lambda x, y: F.binary_cross_entropy(x, y), [(2, 3), (2, 3)],
        dtype="float16", low=0.1, high=0.9)
  check(lambda x, y: x.T.binary_crossentropy(y, "sum"), lambda x, y: F.binary_cross_entropy(x.T, y, reduction="sum"),
        [(3, 0), (0, 3)], low=0.1, high=0.9)

@pytest.mark.parametrize("reduction", REDUCTION_IDS)
@pytest.mark.parametrize("shape", [(6,), (2, 3)], ids=str)
def test_binary_crossentropy_logits(shape, reduction):
  check(lambda x, y: x.binary_crossentropy_logits(y, reduction),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), [shape, shape], low=-4, high=4)

def test_binary_crossentropy_logits_pos_weight_large_and_float16():
  pos = np.array([0.5, 2.0, 3.0], np.float32)
  # torch has no gradient for pos_weight, so it is a constant here
  check(lambda x, y: x.binary_crossentropy_logits(y, "none", pos_weight=kt(pos)),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none", pos_weight=tt(pos)),
        [(2, 3), np.random.default_rng(4).random((2, 3)).astype(np.float32)])
  # logits of +-100 and beyond: exact values, finite gradients
  x = np.array([-200.0, -100.0, -30.0, 0.0, 30.0, 100.0, 200.0], np.float32)
  for target in (0.0, 1.0, 0.3):
    y = np.full_like(x, target)
    check(lambda x, y: x.binary_crossentropy_logits(y, "none"),
          lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none"), [x, y])
  check(lambda x, y: x.binary_crossentropy_logits(y), lambda x, y: F.binary_cross_entropy_with_logits(x, y),
        [(2, 4), (2, 4)], dtype="float16", low=-3, high=3)

def torch_sparse_ce(x, y, ignore_index=-1, label_smoothing=0.0, reduction="mean"):
  out = F.cross_entropy(x.reshape(-1, x.shape[-1]), y.reshape(-1).long(), ignore_index=ignore_index,
                        label_smoothing=label_smoothing, reduction=reduction)
  return out.reshape(y.shape) if reduction == "none" else out

@pytest.mark.parametrize("shape, kwargs", [
  ((4, 3), {}), ((2, 3, 5), {}), ((4, 3), {"reduction": "sum"}), ((4, 3), {"reduction": "none"}),
  ((6, 4), {"label_smoothing": 0.2}), ((2, 3, 4), {"label_smoothing": 0.1, "reduction": "none"}),
  ((6, 4), {"ignore_index": 2}), ((6, 4), {"ignore_index": -1, "label_smoothing": 0.3}),
  ((6, 4), {"ignore_index": -100, "reduction": "sum"}), ((1, 1), {})], ids=str)
def test_sparse_categorical_crossentropy(shape, kwargs):
  ignore = kwargs.get("ignore_index", -1)
  y = labels(shape[:-1], shape[-1], seed=5, ignore=ignore if "ignore_index" in kwargs else None)
  check(lambda x: x.sparse_categorical_crossentropy(kt(y), **kwargs), lambda x: torch_sparse_ce(x, tt(y), **kwargs),
        [shape])

def test_sparse_categorical_crossentropy_float16_and_all_ignored():
  y = labels((4,), 5, seed=6)
  check(lambda x: x.sparse_categorical_crossentropy(kt(y)), lambda x: torch_sparse_ce(x, tt(y)), [(4, 5)],
        dtype="float16", atol=3e-2)
  y = np.array([-1, -1], np.int32)   # nothing counted: 0/0, as in PyTorch
  assert math.isnan(Tensor.ones(2, 3).sparse_categorical_crossentropy(kt(y)).item())
  assert math.isnan(torch_sparse_ce(torch.ones(2, 3), tt(y)).item())

CROSS_ENTROPY = [((4, 3), (4,), {}), ((3,), (), {}), ((2, 3, 2, 2), (2, 2, 2), {}), ((2, 3, 4), (2, 4), {}),
                 ((2, 3, 2, 2), (2, 2, 2), {"reduction": "none"}), ((4, 3), (4,), {"reduction": "sum"}),
                 ((2, 4, 3), (2, 3), {"label_smoothing": 0.25}), ((0, 3), (0,), {"reduction": "sum"}),
                 ((1, 1), (1,), {})]

@pytest.mark.parametrize("shape, y_shape, kwargs", CROSS_ENTROPY, ids=str)
def test_cross_entropy_class_indices(shape, y_shape, kwargs):
  y = labels(y_shape, shape[0] if len(shape) == 1 else shape[1], seed=7)
  check(lambda x: x.cross_entropy(kt(y), **kwargs), lambda x: F.cross_entropy(x, tt(y), **kwargs), [shape])

@pytest.mark.parametrize("shape, kwargs", [((4, 3), {}), ((2, 3, 2, 2), {"reduction": "none"}), ((3,), {}),
                                           ((2, 5), {"label_smoothing": 0.3, "reduction": "sum"})], ids=str)
def test_cross_entropy_probabilities(shape, kwargs):
  axis = 0 if len(shape) == 1 else 1
  probs = np.random.default_rng(8).random(shape).astype(np.float32)
  probs /= probs.sum(axis, keepdims=True)
  check(lambda x, p: x.cross_entropy(p, **kwargs), lambda x, p: F.cross_entropy(x, p, **kwargs), [shape, probs])

def test_cross_entropy_float16_and_noncontiguous():
  y = labels((2, 2, 3), 3, seed=9)
  check(lambda x: x.permute(0, 3, 1, 2).cross_entropy(kt(y)), lambda x: F.cross_entropy(x.permute(0, 3, 1, 2), tt(y)),
        [(2, 2, 3, 3)])
  y = labels((3,), 4, seed=10)
  check(lambda x: x.cross_entropy(kt(y), label_smoothing=0.1), lambda x: F.cross_entropy(x, tt(y), label_smoothing=0.1),
        [(3, 4)], dtype="float16", atol=3e-2)

NLL = [((4, 3), {}), ((4, 3), {"reduction": "sum"}), ((4, 3), {"reduction": "none"}), ((3,), {}),
       ((2, 3, 2, 2), {}), ((2, 3, 2, 2), {"reduction": "none"}), ((6, 3), {"ignore_index": 1}),
       ((6, 3), {"weight": True}), ((2, 3, 2, 3), {"weight": True, "ignore_index": 0}),
       ((6, 3), {"weight": True, "ignore_index": 2, "reduction": "sum"}), ((6, 3), {"ignore_index": -100})]

@pytest.mark.parametrize("shape, kwargs", NLL, ids=str)
def test_nll_loss(shape, kwargs):
  classes = shape[0] if len(shape) == 1 else shape[1]
  ignore = kwargs.get("ignore_index")
  y_shape = () if len(shape) == 1 else shape[:1] + shape[2:]
  y = labels(y_shape, classes, seed=11, ignore=ignore)
  kw = dict(kwargs)
  if kw.pop("weight", False):
    weight = np.random.default_rng(12).uniform(0.5, 2.0, classes).astype(np.float32)
    # torch has no gradient for the weight, so it is a constant here
    check(lambda x: x.nll_loss(kt(y), kt(weight), **kw), lambda x: F.nll_loss(x, tt(y), tt(weight), **kw), [shape])
  else:
    torch_kw = {**kw, "ignore_index": -12345 if ignore is None else ignore}   # kiln's None: nothing ignored
    check(lambda x: x.log_softmax(0 if len(shape) == 1 else 1).nll_loss(kt(y), **kw),
          lambda x: F.nll_loss(x.log_softmax(0 if len(shape) == 1 else 1), tt(y), **torch_kw), [shape])

def test_nll_loss_float16():
  y = labels((4,), 3, seed=13)
  check(lambda x: x.nll_loss(kt(y)), lambda x: F.nll_loss(x, tt(y)), [(4, 3)], dtype="float16")

@pytest.mark.parametrize("name", ["binary_crossentropy", "binary_crossentropy_logits",
                                  "sparse_categorical_crossentropy", "cross_entropy", "nll_loss"])
def test_loss_unknown_reduction(name):
  x = Tensor.full((2, 3), 0.5)
  y = Tensor.full((2, 3), 0.5) if name.startswith("binary") else Tensor([0, 1])
  with pytest.raises(ValueError, match=f"{name}: unknown reduction 'avg'"): getattr(x, name)(y, reduction="avg")

def test_loss_shape_and_dtype_errors():
  x = Tensor.ones(2, 3)
  with pytest.raises(ValueError, match=r"binary_crossentropy: target \(3,\) must have the input's shape"):
    x.binary_crossentropy(Tensor.ones(3))
  with pytest.raises(ValueError, match="binary_crossentropy_logits: target"):
    x.binary_crossentropy_logits(Tensor.ones(2))
  with pytest.raises(ValueError, match="sparse_categorical_crossentropy: labels"):
    x.sparse_categorical_crossentropy(Tensor([0, 1, 2]))
  with pytest.raises(ValueError, match="sparse_categorical_crossentropy: label_smoothing"):
    x.sparse_categorical_crossentropy(Tensor([0, 1]), label_smoothing=1.5)
  with pytest.raises(ValueError, match=r"cross_entropy: target \(3,\) must be"): x.cross_entropy(Tensor([0, 1, 2]))
  with pytest.raises(TypeError, match="cross_entropy: class-index targets must be ints"):
    x.cross_entropy(Tensor([0.0, 1.0]))
  with pytest.raises(TypeError, match="cross_entropy: probability targets must be floats"):
    x.cross_entropy(Tensor([[0, 1, 0], [1, 0, 0]]))
  with pytest.raises(ValueError, match="cross_entropy: label_smoothing"):
    x.cross_entropy(Tensor([0, 1]), label_smoothing=-1)
  with pytest.raises(ValueError, match=r"nll_loss: target \(2, 3\) must be"): x.nll_loss(Tensor([[0, 1, 2], [0, 1, 2]]))
  with pytest.raises(ValueError, match=r"nll_loss: weight \(2,\) must have one entry per class"):
    x.nll_loss(Tensor([0, 1]), weight=Tensor.ones(2))
  with pytest.raises(TypeError, match="nll_loss: targets must be int"): x.nll_loss(Tensor([0.0, 1.0]))
  with pytest.raises(ValueError, match="nll_loss: input must have a class axis"): Tensor(1.0).nll_loss(Tensor(0))

# ---------------------------------------------------------------------------------------------------------------------
# the Python emulator

def test_python_device():
  check(lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b), [(2, 2), (2, 2)],
        device="PYTHON")
  y = np.array([1, 0], np.int32)
  check(lambda x: x.cross_entropy(kt(y, "PYTHON"), label_smoothing=0.1),
        lambda x: F.cross_entropy(x, tt(y), label_smoothing=0.1), [(2, 2)], device="PYTHON")
  check(lambda x, y: x.binary_crossentropy_logits(y), lambda x, y: F.binary_cross_entropy_with_logits(x, y),
        [(3,), (3,)], device="PYTHON")
  check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 2), (2, 2), (2, 2)],
        device="PYTHON")
