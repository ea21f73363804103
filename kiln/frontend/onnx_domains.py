"""Operators of the other ONNX domains the backend tests use: ai.onnx.preview.training (optimizer steps) and
ai.onnx.ml (classic ML). They register in OPS as "domain.OpType"."""
from __future__ import annotations
import numpy as np
from kiln.tensor import Tensor
from kiln.frontend.onnx_ops import op, scalar

TRAINING, ML = "ai.onnx.preview.training.", "ai.onnx.ml."

def _groups(tensors: tuple, count: int) -> list[tuple]:
  """(X1..Xn, G1..Gn, ...) -> [(X1, G1, ...), ...]: the optimizer inputs of each parameter."""
  n = len(tensors) // count
  return [tuple(tensors[k * n + i] for k in range(count)) for i in range(n)]

@op(TRAINING + "Adagrad")
def adagrad(rate: Tensor, step: Tensor, *tensors, decay_factor: float = 0.0, epsilon: float = 1e-6,
            norm_coefficient: float = 0.0):
  current = rate / (step.cast(rate.dtype) * decay_factor + 1)
  xs, hs = [], []
  for x, g, h in _groups(tensors, 3):
    gradient = x * norm_coefficient + g
    h_new = h + gradient * gradient
    xs.append(x - current * gradient / (h_new.sqrt() + epsilon))
    hs.append(h_new)
  return tuple(xs + hs)

@op(TRAINING + "Momentum")
def momentum(rate: Tensor, step: Tensor, *tensors, alpha: float = 0.0, beta: float = 0.0, mode: str = "standard",
             norm_coefficient: float = 0.0):
  first = int(scalar(step)) == 0
  xs, vs = [], []
  for x, g, v in _groups(tensors, 3):
    gradient = x * norm_coefficient + g
    v_new = v * alpha + gradient * (1.0 if first else beta)
    if mode == "nesterov": xs.append(x - rate * (gradient + v_new * alpha))
    elif mode == "standard": xs.append(x - rate * v_new)
    else: raise NotImplementedError(f"mode={mode!r}")
    vs.append(v_new)
  return tuple(xs + vs)

@op(TRAINING + "Adam")
def adam(rate: Tensor, step: Tensor, *tensors, alpha: float = 0.9, beta: float = 0.999, epsilon: float = 1e-6,
         norm_coefficient: float = 0.0, norm_coefficient_post: float = 0.0):
  t = int(scalar(step))
  adjusted = rate * (float(np.sqrt(1 - beta ** t)) / (1 - alpha ** t)) if t > 0 else rate
  xs, vs, hs = [], [], []
  for x, g, v, h in _groups(tensors, 4):
    gradient = x * norm_coefficient + g
    v_new = v * alpha + gradient * (1 - alpha)
    h_new = h * beta + gradient * gradient * (1 - beta)
    xs.append((x - adjusted * v_new / (h_new.sqrt() + epsilon)) * (1 - norm_coefficient_post))
    vs.append(v_new)
    hs.append(h_new)
  return tuple(xs + vs + hs)

@op(ML + "Binarizer")
def binarizer(x: Tensor, threshold: float = 0.0) -> Tensor: return (x > threshold).cast(x.dtype)

@op(ML + "ArrayFeatureExtractor")
def array_feature_extractor(x, indices: Tensor):
  picked = Tensor(indices.numpy().reshape(-1).astype(np.int64))
  if isinstance(x, np.ndarray): return x[..., indices.numpy().reshape(-1)]
  return x[..., picked]

@op(ML + "LabelEncoder")
def label_encoder(x, default_float: float = -0.0, default_int64: int = -1, default_string: str = "_Unused",
                  default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
                  values_floats=None, values_int64s=None, values_strings=None, values_tensor=None):
  """Map each element through keys -> values (on the host); unmapped elements get the default."""
  as_list = lambda t: t.numpy().reshape(-1).tolist() if isinstance(t, Tensor) else list(t.reshape(-1))
  keys = next(list(k) if not isinstance(k, (Tensor, np.ndarray)) else as_list(k)
              for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None)
  for values, default, dtype in ((values_floats, default_float, np.float32), (values_int64s, default_int64, np.int64),
                                 (values_strings, default_string, object), (values_tensor, default_tensor, None)):
    if values is not None: break
  if isinstance(values, (Tensor, np.ndarray)):
    dtype = values.numpy().dtype if isinstance(values, Tensor) else object
    values = as_list(values)
    default = as_list(default)[0] if default is not None else (0 if dtype != object else "_Unused")
  mapping = dict(zip(keys, values))
  source = x.numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=object)
  out = np.array([mapping.get(v, default) for v in source.reshape(-1).tolist()], dtype=dtype).reshape(source.shape)
  return out if dtype is object else Tensor(out)

_TREE_TESTS = {0: np.less_equal, 1: np.less, 2: np.greater_equal, 3: np.greater, 4: np.equal, 5: np.not_equal}

@op(ML + "TreeEnsemble")
def tree_ensemble(x: Tensor, aggregate_function: int = 1, leaf_targetids=(), leaf_weights=None,
                  membership_values=None, n_targets: int = 1, nodes_falseleafs=(), nodes_falsenodeids=(),
                  nodes_featureids=(), nodes_hitrates=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                  nodes_splits=None, nodes_trueleafs=(), nodes_truenodeids=(), post_transform: int = 0,
                  tree_roots=()) -> Tensor:
  """Walk every tree for every row (on the host) and aggregate the reached leaves' weights per target."""
  if post_transform != 0: raise NotImplementedError(f"post_transform={post_transform}")
  rows = x.numpy()
  modes, splits = nodes_modes.numpy().reshape(-1), nodes_splits.numpy().reshape(-1)
  weights = leaf_weights.numpy().reshape(-1)
  tracks = list(nodes_missing_value_tracks_true or [0] * len(modes))
  members = membership_values.numpy().reshape(-1).tolist() if membership_values is not None else []
  current, sets = [], []
  for value in members:  # NaN-separated sets, one per BRANCH_MEMBER node in order
    if not np.isnan(value): current.append(value)
    else:
      sets.append(set(current))
      current = []
  if current: sets.append(set(current))
  member_set = {}
  for node in range(len(modes)):
    if modes[node] == 6: member_set[node] = sets[len(member_set)]
  out = np.zeros((rows.shape[0], n_targets), rows.dtype)
  for r, row in enumerate(rows):
    leaves = []
    for root in tree_roots:
      node, is_leaf = root, False
      while not is_leaf:
        value = row[nodes_featureids[node]]
        if np.isnan(value): go_true = bool(tracks[node])
        elif modes[node] == 6: go_true = value in member_set[node]
        else: go_true = bool(_TREE_TESTS[int(modes[node])](value, splits[node]))
        node, is_leaf = ((nodes_truenodeids[node], nodes_trueleafs[node]) if go_true
                         else (nodes_falsenodeids[node], nodes_falseleafs[node]))
      leaves.append(node)
    for target in range(n_targets):
      picked = [weights[leaf] for leaf in leaves if leaf_targetids[leaf] == target]
      if not picked: continue
      combine = {0: np.mean, 1: np.sum, 2: np.min, 3: np.max}[aggregate_function]
      out[r, target] = combine(picked) if aggregate_function != 0 else np.sum(picked) / len(tree_roots)
  return Tensor(out)
