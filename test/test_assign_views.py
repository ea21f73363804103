"""assign and views, against PyTorch's in-place semantics (kiln issue 16).

The rule (docs/quickstart.md, "Updating in place"): a tensor built before an assign holds the values it was built
from, except a view PyTorch would alias (a slice, reshape, permute, expand), which reads the buffer's new values.
A flip, pad or repeat is a copy in PyTorch, so it keeps the old values.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, dtypes

DTYPES = [(np.float32, torch.float32), (np.float64, torch.float64), (np.int32, torch.int32)]

def check(got: Tensor, want: torch.Tensor, what: str) -> None:
  """Equal values (exact: every value here is a small integer), naming the case and the worst difference."""
  g, w = got.numpy(), want.numpy()
  assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
  worst = np.abs(g.astype(np.float64) - w).max(initial=0.0)
  assert np.array_equal(g, w.astype(g.dtype)), f"{what}: got {g.tolist()}, want {w.tolist()}, worst {worst}"

@pytest.mark.parametrize("np_dtype,torch_dtype", DTYPES)
@pytest.mark.parametrize("n", [4, 7])
def test_slice_assign_after_pending_assign(np_dtype, torch_dtype, n):
  """b.assign(b + 10); b[2:].assign(0): the slice write was lost behind the pending assign."""
  values = np.arange(1, n + 1).astype(np_dtype)
  b, bt = Tensor(values), torch.tensor(values, dtype=torch_dtype)
  b.assign(b + 10)
  bt.copy_(bt + 10)
  b[2:].assign(Tensor(np.zeros(n - 2, np_dtype)))
  bt[2:] = 0
  check(b, bt, "slice after assign")

def test_slice_assign_after_pending_assign_2d_and_scalar_value():
  values = np.arange(12, dtype=np.float32).reshape(3, 4)
  b, bt = Tensor(values), torch.tensor(values)
  b *= 2
  bt *= 2
  b[1:, 1:3].assign(-1.0)
  bt[1:, 1:3] = -1.0
  b[0].assign(b[2] + 100)
  bt[0] = bt[2] + 100
  check(b, bt, "2d slices after assign")

def test_slice_assign_into_pending_value():
  """c = a + 1 (never realized); c[1:].assign(x) writes into c, as torch's c[1:] = x does."""
  a, at = Tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])
  c, ct = a + 1, at + 1
  c[1:].assign(Tensor([7.0, 8.0]))
  ct[1:] = torch.tensor([7.0, 8.0])
  check(c, ct, "slice of a pending value")
  check(a, at, "its input is untouched")

_SELF_READS = {
  "flip": (lambda b: b.flip(0), lambda b: b.flip(0)),
  "roll": (lambda b: b.roll(1, 0), lambda b: b.roll(1, 0)),
  "shifted_slice": (lambda b: b[1:].pad((0, 1)), lambda b: F.pad(b[1:], (0, 1))),
  "cumsum": (lambda b: b.cumsum(0), lambda b: b.cumsum(0)),
}

@pytest.mark.parametrize("name", sorted(_SELF_READS))
@pytest.mark.parametrize("first", ["mul", "add", "assign"])
@pytest.mark.parametrize("np_dtype,torch_dtype", DTYPES[:2])
def test_assign_reading_other_elements_of_its_target_after_pending_assign(name, first, np_dtype, torch_dtype):
  """b *= 2; b.assign(b.flip(0)) gave [8,6,6,8]; c += 1; c.assign(c.roll(1, 0)) gave [5,5,5,5]."""
  kiln_fn, torch_fn = _SELF_READS[name]
  values = np.array([1, 2, 3, 4, 5], dtype=np_dtype)
  b, bt = Tensor(values), torch.tensor(values, dtype=torch_dtype)
  if first == "mul": b *= 2; bt *= 2
  elif first == "add": b += 1; bt += 1
  else: b.assign(b * 3 - 1); bt.copy_(bt * 3 - 1)
  b.assign(kiln_fn(b))
  bt.copy_(torch_fn(bt).clone())
  check(b, bt, f"{first} then {name}")

def test_transpose_assign_after_pending_assign():
  values = np.arange(9, dtype=np.float32).reshape(3, 3)
  b, bt = Tensor(values), torch.tensor(values)
  b += 1
  bt += 1
  b.assign(b.T)
  bt.copy_(bt.T.clone())
  check(b, bt, "transpose")

def _readers(b, lib):
  """Tensors built from b before it is overwritten: PyTorch copies some (flip, pad, repeat, ops), aliases others."""
  if lib == "torch":
    return {"flip": b.flip(0), "pad": F.pad(b, (1, 0)), "repeat": b.repeat(2), "mul": b * 1, "slice": b[1:],
            "step": b[::2], "reshape": b.reshape(2, 3), "permute": b.reshape(2, 3).permute(1, 0),
            "transpose_reshape": b.reshape(2, 3).T.reshape(6), "expand": b.reshape(1, 6).expand(2, 6),
            "slice_then_mul": b[1:] * 2, "flip_of_slice": b[1:].flip(0)}
  return {"flip": b.flip(0), "pad": b.pad((1, 0)), "repeat": b.repeat(2), "mul": b * 1, "slice": b[1:],
          "step": b[::2], "reshape": b.reshape(2, 3), "permute": b.reshape(2, 3).permute(1, 0),
          "transpose_reshape": b.reshape(2, 3).T.reshape(6), "expand": b.reshape(1, 6).expand(2, 6),
          "slice_then_mul": b[1:] * 2, "flip_of_slice": b[1:].flip(0)}

_OVERWRITES = {
  "kernel": (lambda b: b.assign(b * 10), lambda b: b.copy_(b * 10)),
  "scalar": (lambda b: b.assign(5), lambda b: b.fill_(5)),
  "slice": (lambda b: b[2:].assign(Tensor.full((4,), -3, dtype=b.dtype)), lambda b: b[2:].fill_(-3)),
}

@pytest.mark.parametrize("overwrite", sorted(_OVERWRITES))
@pytest.mark.parametrize("np_dtype,torch_dtype", DTYPES)
def test_lazy_readers_of_an_overwritten_buffer(overwrite, np_dtype, torch_dtype):
  """b realized; f = b.flip(0); p = b.pad(...); b.assign(b * 10): f and p read the new values, m = b * 1 the old."""
  values = np.arange(1, 7).astype(np_dtype)
  b, bt = Tensor(values).realize(), torch.tensor(values, dtype=torch_dtype)
  readers, readers_t = _readers(b, "kiln"), _readers(bt, "torch")
  kiln_write, torch_write = _OVERWRITES[overwrite]
  kiln_write(b)
  torch_write(bt)
  b.realize()
  check(b, bt, "target")
  for name in readers: check(readers[name], readers_t[name], f"{name} after a {overwrite} overwrite")

def test_reader_realized_before_a_second_overwrite():
  b, bt = Tensor([1.0, 2.0, 3.0]).realize(), torch.tensor([1.0, 2.0, 3.0])
  f, ft = b.flip(0), bt.flip(0)
  b.assign(b + 1).realize()
  bt.add_(1)
  g, gt = b.flip(0), bt.flip(0)
  b.assign(b * 0).realize()
  bt.mul_(0)
  check(f, ft, "first flip")
  check(g, gt, "second flip")
  check(b, bt, "target")
