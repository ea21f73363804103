"""ONNX's 8- and 4-bit float formats as lookup tables: bit patterns <-> float32, rounding to nearest even.

Formats by ONNX element type: (exponent bits, mantissa bits, exponent bias, what the top codes mean).
- "fn": no infinities; all-ones exponent and mantissa is NaN (float8e4m3fn).
- "ieee": all-ones exponent is inf (mantissa 0) or NaN (float8e5m2).
- "fnuz": no infinities and no negative zero; the code 0x80 is the only NaN (the fnuz formats).
- "finite": neither infinities nor NaN (float4e2m1).
"""
from __future__ import annotations
import functools
import numpy as np

FORMATS = {17: (4, 3, 7, "fn"), 18: (4, 3, 8, "fnuz"), 19: (5, 2, 15, "ieee"), 20: (5, 2, 16, "fnuz"),
           23: (2, 1, 1, "finite")}

@functools.cache
def decode_table(elem_type: int) -> np.ndarray:
  """float32 value of every code of the format (index = code)."""
  exponent_bits, mantissa_bits, bias, kind = FORMATS[elem_type]
  width = 1 + exponent_bits + mantissa_bits
  table = np.zeros(1 << width, np.float64)
  top_exponent = (1 << exponent_bits) - 1
  for code in range(1 << width):
    sign = -1.0 if code >> (width - 1) else 1.0
    exponent, mantissa = (code >> mantissa_bits) & top_exponent, code & ((1 << mantissa_bits) - 1)
    if exponent == 0: magnitude = mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
    else: magnitude = (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)
    if kind == "ieee" and exponent == top_exponent: magnitude = np.inf if mantissa == 0 else np.nan
    if kind == "fn" and exponent == top_exponent and mantissa == (1 << mantissa_bits) - 1: magnitude = np.nan
    table[code] = sign * magnitude
  if kind == "fnuz": table[1 << (width - 1)] = np.nan
  return table.astype(np.float32)

def decode(bits: np.ndarray, elem_type: int) -> np.ndarray:
  """Bit patterns (unsigned integers) -> float32 values."""
  return decode_table(elem_type)[np.asarray(bits).astype(np.int64)]

def encode(values: np.ndarray, elem_type: int, saturate: bool = True) -> np.ndarray:
  """float32 values -> the nearest code (uint8), ties to the even code. Past the largest finite value (infinities
  included): that value when saturating, else inf or NaN, whichever the format has; the sign of zero and NaN is kept
  where the format has one."""
  exponent_bits, mantissa_bits, _, kind = FORMATS[elem_type]
  width = 1 + exponent_bits + mantissa_bits
  sign_bit = 1 << (width - 1)
  table = decode_table(elem_type).astype(np.float64)
  positive = [(v, c) for c, v in enumerate(table[:sign_bit]) if np.isfinite(v)]
  magnitudes, codes = np.array([v for v, _ in positive]), np.array([c for _, c in positive], np.int64)
  x = np.asarray(values, np.float64)
  a = np.abs(x)
  upper = np.clip(np.searchsorted(magnitudes, a), 1, len(magnitudes) - 1)
  lower = upper - 1
  below, above = magnitudes[lower], magnitudes[upper]
  pick_upper = (a - below > above - a) | ((a - below == above - a) & (codes[upper] % 2 == 0))
  code = np.where(pick_upper, codes[upper], codes[lower])
  largest, step = magnitudes[-1], magnitudes[-1] - magnitudes[-2]
  overflow = (a > largest + step / 2) | ((a == largest + step / 2) & (codes[-1] % 2 == 1)) | np.isinf(a)
  inf_code = (sign_bit - 1) & ~((1 << mantissa_bits) - 1)  # all-ones exponent, zero mantissa (ieee only)
  overflow_code = {"ieee": inf_code, "fn": sign_bit - 1, "fnuz": sign_bit, "finite": codes[-1]}[kind]
  over_code = codes[-1] if saturate else overflow_code
  code = np.where(a > largest, np.where(overflow, over_code, codes[-1]), code)  # saturating, inf -> the largest too
  negative = np.signbit(x)
  if kind == "fnuz":  # no negative zero; the NaN code already has the sign bit
    negative &= (code != 0) & (code != sign_bit)
  nan_code = {"fn": sign_bit - 1, "ieee": sign_bit - 1, "fnuz": sign_bit, "finite": codes[-1]}[kind]
  code = np.where(np.isnan(x), nan_code, code)
  if kind == "fnuz": negative &= ~np.isnan(x)
  return (code | (negative.astype(np.int64) * sign_bit)).astype(np.uint8)
