"""ONNX operators computed on the host with numpy: strings (kiln Tensors hold none), TfIdfVectorizer, ImageDecoder."""
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

@op("TfIdfVectorizer")
def tfidf_vectorizer(x, max_gram_length: int = 1, max_skip_count: int = 0, min_gram_length: int = 1,
                     mode: str = "TF", ngram_counts=(), ngram_indexes=(), pool_int64s=None, pool_strings=None,
                     weights=None) -> Tensor:
  """Count the pool's n-grams (tokens `skip` apart, for skip 0..max_skip_count) in each row; TF counts, IDF the
  weight where the count is nonzero, TFIDF count times weight."""
  pool = list(pool_int64s if pool_int64s is not None else pool_strings)
  starts = list(ngram_counts) + [len(pool)]
  lookup, k = {}, 0
  for group in range(len(ngram_counts)):
    n = group + 1
    for j in range(starts[group], starts[group + 1], n):
      lookup[tuple(pool[j:j + n])] = ngram_indexes[k]
      k += 1
  values = x.numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=object)
  rows = values.reshape(1, -1) if values.ndim == 1 else values
  width = max(ngram_indexes) + 1 if len(ngram_indexes) else 0
  counts = np.zeros((rows.shape[0], width), np.float32)
  for r, row in enumerate(rows.tolist()):
    for n in range(min_gram_length, max_gram_length + 1):
      for skip in range(0, max_skip_count + 1 if n > 1 else 1):  # a unigram is the same at every skip
        step = skip + 1
        for start in range(len(row) - (n - 1) * step):
          gram = tuple(row[start + i * step] for i in range(n))
          if gram in lookup: counts[r, lookup[gram]] += 1
  scale = np.asarray(weights, np.float32) if weights is not None else np.ones(width, np.float32)
  if mode == "IDF": counts = (counts > 0) * scale
  elif mode == "TFIDF": counts = counts * scale
  elif mode != "TF": raise NotImplementedError(f"mode={mode!r}")
  return Tensor(counts.reshape(width) if values.ndim == 1 else counts, dtype=dtypes.float32)

@op("ImageDecoder")
def image_decoder(encoded: Tensor, pixel_format: str = "RGB") -> Tensor:
  """Decode an encoded image (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000) to (height, width, channels) uint8 with
  Pillow on the host; pixel_format RGB, BGR or Grayscale (one channel)."""
  try:
    from PIL import Image
  except ImportError as err:
    raise NotImplementedError("ImageDecoder needs Pillow: pip install pillow") from err
  import io
  image = Image.open(io.BytesIO(encoded.numpy().astype(np.uint8).tobytes()))
  if pixel_format == "Grayscale": pixels = np.asarray(image.convert("L"))[:, :, None]
  elif pixel_format in ("RGB", "BGR"):
    pixels = np.asarray(image.convert("RGB"))
    if pixel_format == "BGR": pixels = pixels[:, :, ::-1]
  else: raise NotImplementedError(f"pixel_format={pixel_format!r}")
  return Tensor(np.ascontiguousarray(pixels), dtype=dtypes.uint8)
