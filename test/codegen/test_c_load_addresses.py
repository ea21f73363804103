"""Scalar loads at `x + c` in the C renderer (kiln/renderer/cstyle.py `_load`): written as pointer arithmetic
`*(data+(x)+c)`, so gcc shares one base pointer among a tile's constant offsets (a 3x3 conv's weight broadcasts kept
one pointer each and spilled them as `data[x+c]` under -fwrapv). The values must be those of the plain index."""
from __future__ import annotations
import re
import numpy as np
import pytest
import torch
from kiln import Tensor, Device
from kiln.helpers import Context
from kiln.renderer.cstyle import CRenderer
from helpers import kernel_sources

pytestmark = pytest.mark.skipif(not isinstance(Device["CPU"].renderer, CRenderer),
                                reason="the CPU device renders LLVM IR here (CPU_LLVM=1 or no C compiler)")

def test_conv_weight_loads_share_a_base_and_match_torch():
  """A 3x3 conv's register tile broadcasts its weights from one base pointer plus constants; the result is torch's."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 16, 20, 20), dtype=np.float32)
  w = rng.standard_normal((16, 16, 3, 3), dtype=np.float32)
  def conv() -> Tensor: return Tensor(x).conv2d(Tensor(w), padding=1)
  with Context(CACHELEVEL=0): sources = kernel_sources(conv)
  want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
  got = conv().numpy()
  assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), f"shape {got.shape}: {np.abs(got - want).max()}"
  tile = [src for src in sources if "kiln_fma" in src]
  assert tile, "no register-tiled conv kernel"
  offsets = re.findall(r"= \*\(data\d+\+\(\w+\)\+(\d+)\);", tile[0])
  # (the tile's other output channels, 16x3x3 weights apart: 3 offsets on AVX2's 4 channels, 7 on AVX-512's 8)
  assert {"144", "288", "432"} <= set(offsets), f"scalar loads at constant offsets not pointer arithmetic: {offsets}"

def test_half_and_bool_loads_at_constant_offsets():
  """Loads converted on the way in (half -> float, bool) at `x + c` read the same elements as the plain index."""
  rng = np.random.default_rng(1)
  h = rng.standard_normal((64, 9), dtype=np.float32).astype(np.float16)
  m = rng.random((64, 9)) < 0.5
  def taps() -> Tensor:
    t, b = Tensor(h), Tensor(m)
    return sum((t[:, i:i + 1].float() * b[:, i:i + 1].float() for i in range(9)), Tensor.zeros(64, 1))
  with Context(CACHELEVEL=0): sources = kernel_sources(taps)
  want = (h.astype(np.float32) * m).sum(axis=1, keepdims=True)
  np.testing.assert_allclose(taps().numpy(), want, rtol=1e-6, atol=1e-6)
  assert any(re.search(r"kiln_half_to_f\(\*\(data\d+\+\(\w+\)\+\d+\)\)", src) for src in sources), "\n".join(sources)
