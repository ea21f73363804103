"""The ONNX signal operators: DFT and STFT as matmuls with cosine/sine matrices, MelWeightMatrix on the host.

Complex values are a trailing axis of 2 (real, imaginary); a real signal may have a trailing axis of 1.
"""
from __future__ import annotations
import math
import numpy as np
from kiln.tensor import Tensor
from kiln.frontend.onnx_ops import op, scalar, axis_of, move_axis
from kiln.frontend.onnx_proto import dtype_of_onnx

def _dft_last(real: Tensor, imag: Tensor | None, bins: int, inverse: bool) -> Tensor:
  """The DFT along the last axis of (real, imag): (..., n) -> (..., bins, 2)."""
  n = real.shape[-1]
  angle = 2 * math.pi * np.outer(np.arange(n), np.arange(bins)) / n
  cos = Tensor(np.cos(angle).astype(np.float32)).cast(real.dtype)
  sin = Tensor(np.sin(angle).astype(np.float32) * (1 if inverse else -1)).cast(real.dtype)
  # (r + i q)(cos + i sin) = r cos - q sin + i (r sin + q cos), with sin's sign set by the direction
  out_real, out_imag = real.matmul(cos), real.matmul(sin)
  if imag is not None: out_real, out_imag = out_real - imag.matmul(sin), out_imag + imag.matmul(cos)
  if inverse: out_real, out_imag = out_real / n, out_imag / n
  return out_real.stack(out_imag, dim=-1)

@op("DFT")
def dft(x: Tensor, dft_length=None, axis=None, inverse: int = 0, onesided: int = 0, ctx=None) -> Tensor:
  if ctx.opset < 20: signal_axis = axis_of(1 if axis is None else axis, x.ndim)  # opset 17: an attribute
  else: signal_axis = axis_of(-2 if axis is None else int(scalar(axis)), x.ndim)
  length = int(scalar(dft_length)) if dft_length is not None else x.shape[signal_axis]
  moved = move_axis(x, signal_axis, x.ndim - 2)  # (..., n, 1 or 2)
  size = moved.shape[-2]
  if length < size: moved = moved.shrink(tuple((0, length) if i == moved.ndim - 2 else None for i in range(moved.ndim)))
  elif length > size:
    moved = moved.pad(tuple((0, length - size) if i == moved.ndim - 2 else (0, 0) for i in range(moved.ndim)))
  real = moved[..., 0]
  imag = moved[..., 1] if moved.shape[-1] == 2 else None
  out = _dft_last(real, imag, length // 2 + 1 if onesided else length, bool(inverse))
  return move_axis(out, out.ndim - 2, signal_axis)

@op("STFT")
def stft(signal: Tensor, frame_step: Tensor, window=None, frame_length=None, onesided: int = 1) -> Tensor:
  step = int(scalar(frame_step))
  length = int(scalar(frame_length)) if frame_length is not None else window.shape[0]
  batch, samples = signal.shape[0], signal.shape[1]
  frames = (samples - length) // step + 1
  starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
  index = Tensor(starts.reshape(-1).astype(np.int64))
  framed = signal[:, index].reshape(batch, frames, length, signal.shape[2])
  real = framed[..., 0]
  imag = framed[..., 1] if signal.shape[2] == 2 else None
  if window is not None:
    real = real * window
    if imag is not None: imag = imag * window
  return _dft_last(real, imag, length // 2 + 1 if onesided else length, False)

@op("MelWeightMatrix")
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                      output_datatype: int = 1) -> Tensor:
  """Triangular filters, evenly spaced on the mel scale mel(f) = 2595 log10(1 + f/700), each peaking at 1."""
  bins, length, rate = int(scalar(num_mel_bins)), int(scalar(dft_length)), int(scalar(sample_rate))
  low, high = float(scalar(lower_edge_hertz)), float(scalar(upper_edge_hertz))
  to_mel = lambda f: 2595 * np.log10(1 + f / 700)
  mels = to_mel(low) + np.arange(bins + 2) * (to_mel(high) - to_mel(low)) / (bins + 2)  # as the spec computes it
  hertz = 700 * (10 ** (mels / 2595) - 1)
  edges = ((length + 1) * hertz // rate).astype(np.int64)
  matrix = np.zeros((length // 2 + 1, bins))
  for i in range(bins):
    lower, center, upper = edges[i], edges[i + 1], edges[i + 2]
    if center == lower: matrix[center, i] = 1
    else: matrix[lower:center + 1, i] = (np.arange(lower, center + 1) - lower) / (center - lower)
    if upper > center: matrix[center:upper, i] = (upper - np.arange(center, upper)) / (upper - center)
  return Tensor(matrix.astype(np.float32)).cast(dtype_of_onnx(output_datatype))
