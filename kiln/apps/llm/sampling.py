"""Pick the next token from a row of logits: greedy, temperature, top-k and top-p (nucleus) sampling, on the host."""
from __future__ import annotations
import math
import numpy as np

def _check_sampling_args(temperature: float, top_k: int, top_p: float) -> None:
  """Raise ValueError/TypeError naming the first sampling argument out of range."""
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
    raise TypeError(f"sample: temperature must be a number, got {type(temperature).__name__}")
  if not math.isfinite(temperature) or temperature < 0:
    raise ValueError(f"sample: temperature must be a finite number >= 0, got {temperature}")
  if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
    raise TypeError(f"sample: top_k must be an integer, got {type(top_k).__name__}")
  if top_k < 0: raise ValueError(f"sample: top_k must be >= 0 (0 keeps every token), got {top_k}")
  if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
    raise TypeError(f"sample: top_p must be a number, got {type(top_p).__name__}")
  if not 0 < top_p <= 1: raise ValueError(f"sample: top_p must be in (0, 1], got {top_p}")

def check_sampling_args(*, temperature: float, top_k: int, top_p: float) -> None:
  """Validate sampling settings up front (before a reply starts), with the same errors as `sample`.

  >>> check_sampling_args(temperature=0.8, top_k=40, top_p=0.95)
  >>> check_sampling_args(temperature=0.8, top_k=40, top_p=1.5)
  Traceback (most recent call last):
  ...
  ValueError: sample: top_p must be in (0, 1], got 1.5
  """
  _check_sampling_args(temperature, top_k, top_p)

NUCLEUS_SEARCH_SIZE = 1024   # top-p first looks for its set among this many most likely tokens (a full sort is slow)

def most_likely(scores: np.ndarray, k: int) -> np.ndarray:
  """The ids of the k highest scores, highest first; equal scores keep the lower id first (a stable order).

  >>> most_likely(np.array([1.0, 3.0, 2.0, 3.0]), 3).tolist()
  [1, 3, 2]
  """
  if k >= scores.size: return np.argsort(-scores, kind="stable")
  # argpartition finds the k largest in O(n) but breaks ties at the boundary arbitrarily: take the lowest tied ids
  boundary = scores[np.argpartition(-scores, k - 1)[k - 1]]
  above, tied = np.flatnonzero(scores > boundary), np.flatnonzero(scores == boundary)
  chosen = np.concatenate([above, tied[:k - above.size]])
  return chosen[np.argsort(-scores[chosen], kind="stable")]

def candidate_probs(logits: np.ndarray, *, temperature: float, top_k: int, top_p: float
                    ) -> tuple[np.ndarray, np.ndarray]:
  """The tokens `sample` may draw and their probabilities: (token ids, probabilities summing to 1).

  softmax(logits / temperature) over the `top_k` most likely tokens (0: all), then cut to the smallest set of most
  likely tokens whose probability reaches `top_p` (at least one). Ties rank the lower token id first.
  temperature must be > 0.

  >>> ids, probs = candidate_probs(np.array([0.0, 2.0, 1.0]), temperature=1.0, top_k=2, top_p=1.0)
  >>> ids.tolist(), probs.round(3).tolist()
  ([1, 2], [0.731, 0.269])
  """
  _check_sampling_args(temperature, top_k, top_p)
  if temperature == 0: raise ValueError("candidate_probs: temperature 0 is greedy decoding; there is no distribution")
  scaled = _checked_logits(logits).astype(np.float64) / temperature
  if 0 < top_k < scaled.size:
    ids = most_likely(scaled, top_k)
    weights = np.exp(scaled[ids] - scaled[ids[0]])   # ids[0] holds the max: no overflow
    probs = weights / weights.sum()
  else:
    weights = np.exp(scaled - scaled.max())
    total = weights.sum()
    if top_p == 1: return _without_zeros(np.arange(scaled.size), weights / total)   # every token: no sorting needed
    # the nucleus is a prefix of the sorted order: when the most likely NUCLEUS_SEARCH_SIZE tokens already reach
    # top_p it lies among them, and sorting only those gives the same set as sorting everything
    ids = most_likely(scaled, NUCLEUS_SEARCH_SIZE)
    if ids.size < scaled.size and weights[ids].sum() < top_p * total: ids = most_likely(scaled, scaled.size)
    probs = weights[ids] / total
  if top_p < 1:
    keep = int(np.searchsorted(np.cumsum(probs), top_p, side="left")) + 1   # the first prefix reaching top_p
    ids, probs = ids[:keep], probs[:keep]
    probs = probs / probs.sum()
  return _without_zeros(ids, probs)

def _without_zeros(ids: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Drop tokens of probability 0 (logits of -inf), so they can never be drawn."""
  nonzero = probs > 0
  return ids[nonzero], probs[nonzero]

def _checked_logits(logits: np.ndarray) -> np.ndarray:
  """The logits as a 1-D float array, or ValueError when they are empty, not 1-D, NaN or have no finite maximum."""
  array = np.asarray(logits)
  if array.ndim != 1 or array.size == 0:
    raise ValueError(f"sample: logits must be a non-empty 1-D array, got shape {array.shape}")
  if not np.issubdtype(array.dtype, np.floating):
    raise TypeError(f"sample: logits must be floating point, got dtype {array.dtype}")
  if np.isnan(array).any(): raise ValueError(f"sample: logits contain NaN (at index {int(np.isnan(array).argmax())})")
  if not np.isfinite(array.max()):
    raise ValueError(f"sample: logits need a finite maximum to sample from, got max {array.max()}")
  return array

def sample(logits: np.ndarray, *, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
  """Choose the next token id from `logits` (shape (vocab_size,)).

  temperature 0 is greedy: the first index of the maximum, as torch.argmax. Otherwise draws from softmax(logits / T)
  restricted to the top_k most likely tokens (0: all), then to the smallest set whose probability reaches top_p
  (nucleus sampling; always at least one token), using `rng`. Same logits, settings and rng state -> same token.

  >>> logits = np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)
  >>> sample(logits, temperature=0, top_k=0, top_p=1.0, rng=np.random.default_rng(0))
  1
  >>> sample(logits, temperature=0.7, top_k=1, top_p=1.0, rng=np.random.default_rng(0))
  1
  """
  _check_sampling_args(temperature, top_k, top_p)
  if not isinstance(rng, np.random.Generator):
    raise TypeError(f"sample: rng must be a numpy.random.Generator, got {type(rng).__name__}")
  if temperature == 0: return int(np.argmax(_checked_logits(logits)))
  ids, probs = candidate_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
  cumulative = np.cumsum(probs)
  # u * total < total, so the index stays inside the candidates even when the cumulative sum rounds below 1
  index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
  return int(ids[min(index, ids.size - 1)])
