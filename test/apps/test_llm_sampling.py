"""kiln.apps.llm.sampling against a NumPy reference distribution: greedy, temperature, top-k, top-p, errors."""
import numpy as np
import pytest
import torch
from kiln.apps.llm.sampling import candidate_probs, sample

def reference_distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
  """The full-vocabulary distribution sampling should follow, written the straightforward way (float64)."""
  scaled = logits.astype(np.float64) / temperature
  order = np.argsort(-scaled, kind="stable")
  mask = np.zeros(scaled.size, dtype=bool)
  mask[order[:top_k] if top_k else order] = True
  probs = np.where(mask, np.exp(scaled - scaled.max()), 0.0)
  probs /= probs.sum()
  kept, mass = [], 0.0
  for index in order:
    if not mask[index] or (mass >= top_p and kept): break
    kept.append(index)
    mass += probs[index]
  nucleus = np.zeros_like(probs)
  nucleus[kept] = probs[kept]
  return nucleus / nucleus.sum()

def chi_square(counts: np.ndarray, expected_probs: np.ndarray) -> tuple[float, int]:
  """The chi-square statistic and degrees of freedom of `counts` against `expected_probs` (over nonzero cells)."""
  support = expected_probs > 0
  expected = expected_probs[support] * counts.sum()
  return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1

def test_greedy_is_first_argmax_like_torch():
  rng = np.random.default_rng(0)
  for trial in range(20):
    logits = rng.integers(-3, 3, size=50).astype(np.float32)   # many ties
    got = sample(logits, temperature=0, top_k=5, top_p=0.5, rng=np.random.default_rng(trial))
    assert got == int(torch.argmax(torch.from_numpy(logits))), (trial, logits)

def test_greedy_ignores_rng_state():
  logits = np.random.default_rng(1).standard_normal(100).astype(np.float32)
  rng = np.random.default_rng(0)
  assert {sample(logits, temperature=0.0, top_k=0, top_p=1.0, rng=rng) for _ in range(5)} == {int(logits.argmax())}

@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 4, 1.0), (1.0, 0, 0.8),
                                                     (0.9, 6, 0.9), (2.0, 3, 0.3)])
def test_candidate_probs_match_reference(temperature, top_k, top_p):
  logits = np.random.default_rng(3).standard_normal(12).astype(np.float32) * 2
  ids, probs = candidate_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
  got = np.zeros(12)
  got[ids] = probs
  want = reference_distribution(logits, temperature, top_k, top_p)
  np.testing.assert_allclose(got, want, atol=1e-12, err_msg=f"T={temperature} k={top_k} p={top_p}")

@pytest.mark.parametrize("spread", [6.0, 0.05])   # peaked: the nucleus is among the top 1024; flat: it is not
def test_large_vocabulary_nucleus_matches_reference(spread):
  rng = np.random.default_rng(8)
  logits = (rng.standard_normal(3000) * spread).astype(np.float32)
  logits[rng.integers(0, 3000, 50)] = logits.max()   # ties at the top
  ids, probs = candidate_probs(logits, temperature=1.0, top_k=0, top_p=0.9)
  got = np.zeros(3000)
  got[ids] = probs
  want = reference_distribution(logits, 1.0, 0, 0.9)
  assert (got > 0).sum() == (want > 0).sum(), ((got > 0).sum(), (want > 0).sum())
  np.testing.assert_allclose(got, want, atol=1e-12)

def test_temperature_scaling_matches_torch_softmax():
  logits = np.random.default_rng(4).standard_normal(30).astype(np.float32)
  ids, probs = candidate_probs(logits, temperature=0.5, top_k=0, top_p=1.0)
  got = np.zeros(30)
  got[ids] = probs
  want = torch.softmax(torch.from_numpy(logits).double() / 0.5, dim=0).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-9)

@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 5, 1.0), (1.2, 0, 0.7), (1.0, 4, 0.9)])
def test_samples_follow_the_reference_distribution(temperature, top_k, top_p):
  logits = np.random.default_rng(5).standard_normal(10).astype(np.float32)
  rng = np.random.default_rng(123)
  draws = 4000
  counts = np.bincount([sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
                        for _ in range(draws)], minlength=10)
  want = reference_distribution(logits, temperature, top_k, top_p)
  assert counts[want == 0].sum() == 0, f"drew tokens outside the top-k/top-p set: {counts}, allowed {want > 0}"
  statistic, dof = chi_square(counts, want)
  # the 99.9th percentile of chi-square with <= 9 degrees of freedom is below 28; the seed is fixed anyway
  assert statistic < 28, f"chi-square {statistic:.1f} with {dof} dof: counts {counts}, expected {want * draws}"

def test_top_p_keeps_at_least_one_token():
  logits = np.array([5.0, 1.0, 0.0], dtype=np.float32)
  ids, probs = candidate_probs(logits, temperature=1.0, top_k=0, top_p=1e-6)
  assert ids.tolist() == [0] and probs.tolist() == [1.0]

def test_top_k_ties_keep_lower_ids():
  logits = np.array([1.0, 2.0, 2.0, 2.0, 0.0], dtype=np.float32)
  ids, _ = candidate_probs(logits, temperature=1.0, top_k=2, top_p=1.0)
  assert ids.tolist() == [1, 2]

def test_negative_infinity_logits_are_never_drawn():
  logits = np.array([0.0, -np.inf, 0.5, -np.inf], dtype=np.float32)
  rng = np.random.default_rng(0)
  assert {sample(logits, temperature=1.0, top_k=0, top_p=1.0, rng=rng) for _ in range(200)} == {0, 2}

def test_same_seed_same_tokens():
  logits = np.random.default_rng(6).standard_normal(1000).astype(np.float32)
  def draw(seed):
    rng = np.random.default_rng(seed)
    return [sample(logits, temperature=1.0, top_k=50, top_p=0.9, rng=rng) for _ in range(30)]
  assert draw(7) == draw(7)
  assert draw(7) != draw(8)

@pytest.mark.parametrize("kwargs,error,names", [
  (dict(temperature=-0.1), ValueError, "temperature"),
  (dict(temperature=float("nan")), ValueError, "temperature"),
  (dict(temperature="hot"), TypeError, "temperature"),
  (dict(top_p=0.0), ValueError, "top_p"),
  (dict(top_p=1.01), ValueError, "top_p"),
  (dict(top_k=-1), ValueError, "top_k"),
  (dict(top_k=2.5), TypeError, "top_k"),
  (dict(logits=np.array([0.0, np.nan], dtype=np.float32)), ValueError, "NaN"),
  (dict(logits=np.zeros((2, 3), dtype=np.float32)), ValueError, "(2, 3)"),
  (dict(logits=np.zeros(0, dtype=np.float32)), ValueError, "logits"),
  (dict(logits=np.full(3, -np.inf, dtype=np.float32)), ValueError, "logits"),
  (dict(logits=np.arange(3)), TypeError, "int"),
  (dict(rng=np.random.RandomState(0)), TypeError, "rng"),
])
def test_bad_arguments_name_the_argument(kwargs, error, names):
  args = dict(logits=np.zeros(4, dtype=np.float32), temperature=1.0, top_k=0, top_p=1.0, rng=np.random.default_rng(0))
  args.update(kwargs)
  logits = args.pop("logits")
  with pytest.raises(error, match=names.replace("(", r"\(").replace(")", r"\)")):
    sample(logits, **args)
