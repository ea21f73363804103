"""The ONNX string operators, on numpy object arrays (kiln Tensors hold no strings): they run on the host."""
from __future__ import annotations
import re
import numpy as np
from kiln.dtype import dtypes
from kiln.tensor import Tensor
from kiln.frontend.onnx_ops import op

def _strings(x) -> np.ndarray:
  return np.asarray(x, dtype=object)

@op("StringConcat")
def string_concat(x, y) -> np.ndarray:
  return np.vectorize(lambda a, b: a + b, otypes=[object])(_strings(x), _strings(y))

@op("RegexFullMatch")
def regex_full_match(x, pattern: str = "") -> Tensor:
  compiled = re.compile(pattern)
  matches = np.vectorize(lambda s: compiled.fullmatch(s) is not None, otypes=[bool])(_strings(x))
  return Tensor(matches.astype(bool), dtype=dtypes.bool)

@op("StringSplit")
def string_split(x, delimiter: str = "", maxsplit: int | None = None):
  """Split each string (on runs of whitespace when there is no delimiter); pad with "" to the longest split."""
  values = _strings(x)
  limit = -1 if maxsplit is None else maxsplit
  parts = [s.split(delimiter or None, limit) for s in values.reshape(-1)]
  width = max((len(p) for p in parts), default=0)
  padded = np.full((len(parts), width), "", dtype=object)
  for i, p in enumerate(parts): padded[i, :len(p)] = p
  counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(values.shape)
  return padded.reshape(*values.shape, width), Tensor(counts, dtype=dtypes.int64)

@op("StringNormalizer")
def string_normalizer(x, case_change_action: str = "NONE", is_case_sensitive: int = 0, locale: str = "",
                      stopwords=()) -> np.ndarray:
  values = _strings(x)
  flat = values.reshape(-1)
  if is_case_sensitive: stops = set(stopwords)
  else: stops = {s.lower() for s in stopwords}
  kept = [s for s in flat if (s if is_case_sensitive else s.lower()) not in stops]
  change = {"LOWER": str.lower, "UPPER": str.upper, "NONE": lambda s: s}[case_change_action]
  kept = [change(s) for s in kept] or [""]
  out = np.array(kept, dtype=object)
  return out.reshape(1, -1) if values.ndim == 2 else out
