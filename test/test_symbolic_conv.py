"""A convolution over a symbolic spatial size (what ONNX vision models with a dynamic height and width need to compile
once for every size, kiln/frontend/onnx_symbolic.py): not supported yet, so OnnxRunner builds a graph per size for
them. kiln/mixin/conv.py compares sizes with ints (`p < span` for the kernel-fits check, `_phases_pay`, the padded
copy in `_conv_windows`): with sint_min/sint_max there (the check holding for every value), the rest is movement
ops that take symbolic sizes."""
import numpy as np
import pytest
from kiln import Tensor, Variable
from kiln.engine import realize

def reference_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """A stride-1 conv with padding 1 in numpy (NCHW, OIHW)."""
  padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  h, w_out = x.shape[2], x.shape[3]
  out = np.zeros((x.shape[0], w.shape[0], h, w_out), np.float32)
  for i in range(w.shape[2]):
    for j in range(w.shape[3]):
      out += np.einsum("nchw,oc->nohw", padded[:, :, i:i + h, j:j + w_out], w[:, :, i, j])
  return out

@pytest.mark.xfail(strict=True, raises=TypeError, reason="conv2d compares a symbolic size with an int "
                   "(kiln/mixin/conv.py _conv: `p < span`)")
def test_conv2d_over_a_symbolic_height_compiles_once():
  rng = np.random.default_rng(0)
  x_np, w_np = rng.standard_normal((1, 2, 12, 9)).astype(np.float32), rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
  x, w = Tensor(x_np).realize(), Tensor(w_np).realize()
  counts = []
  for height in (7, 10):
    before = len(realize._runner_cache)
    out = x[:, :, 0:Variable("h", 3, 12).bind(height)].conv2d(w, padding=1).numpy()
    counts.append(len(realize._runner_cache) - before)
    np.testing.assert_allclose(out, reference_conv(x_np[:, :, :height], w_np), rtol=1e-4, atol=1e-4)
  assert counts[1] == 0, counts

def test_conv2d_over_a_symbolic_batch_copies_its_padded_input_and_compiles_once():
  # the padded input (8x26x26 an image) is copied in its own kernel whatever the batch, so the conv reads it
  # without the pad's gates (kiln/mixin/conv.py _conv_windows)
  rng = np.random.default_rng(1)
  x_np, w_np = rng.standard_normal((4, 8, 24, 24)).astype(np.float32), rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
  x, w = Tensor(x_np).realize(), Tensor(w_np).realize()
  counts = []
  for batch in (2, 3):
    out = x[0:Variable("b", 1, 4).bind(batch)].conv2d(w, padding=1)
    assert len([item for item in out.schedule() if item.ast.op.name == "SINK"]) == 2   # the copy, then the conv
    before = len(realize._runner_cache)
    got = out.numpy()
    counts.append(len(realize._runner_cache) - before)
    np.testing.assert_allclose(got, reference_conv(x_np[:batch], w_np), rtol=1e-4, atol=1e-4)
  assert counts[1] == 0, counts
