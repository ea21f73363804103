"""int32 -> int8/uint8 casts in vector code (kiln/codegen/vectorize.py VECTOR_CASTS; the C renderer's
__builtin_convertvector, the LLVM renderer's trunc): each lane keeps its low byte, as the scalar cast and NumPy do,
also for values outside the byte's range."""
from __future__ import annotations
import numpy as np
import pytest
from kiln import Tensor, dtypes
from kiln.helpers import Context
from helpers import kernel_sources


@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("dtype,np_dtype,lane", [(dtypes.int8, np.int8, "char"), (dtypes.uint8, np.uint8, "uchar")])
def test_narrowing_vector_cast_keeps_the_low_byte(device, dtype, np_dtype, lane):
  """A float row through int32 to bytes (the LLM's activation quantization), with values beyond the byte's range."""
  if device == "LLVM": pytest.importorskip("llvmlite")
  x = np.linspace(-700.0, 700.0, 160 * 18 * 32, dtype=np.float32).reshape(160, 18, 32)
  def cast() -> Tensor: return (Tensor(x, device=device) * 0.5).cast(dtypes.int32).cast(dtype)
  want = np.trunc(x * np.float32(0.5)).astype(np.int32).astype(np_dtype)
  with Context(VECTORIZE=0): scalar = cast().numpy()
  with Context(CACHELEVEL=0): sources = kernel_sources(cast)
  np.testing.assert_array_equal(scalar, want)
  np.testing.assert_array_equal(cast().numpy(), want)
  if device == "CPU": assert any(f"kiln_{lane}x" in src and "convertvector" in src for src in sources), "scalar code"
  else: assert any(" x i32> " in src and "trunc <" in src for src in sources), "scalar code"
