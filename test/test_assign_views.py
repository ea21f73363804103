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
  "step": (lambda b: b[1::2].assign(Tensor.full((3,), -3, dtype=b.dtype)), lambda b: b[1::2].fill_(-3)),
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

# ---- writing through step slices (a step slice pads its axis to a multiple of the step, a padding it never reads) ----

_STEP_INDICES = [(slice(None, None, 2),), (slice(1, None, 3),), (slice(1, 4, 2), slice(None, None, 2)),
                 (slice(None), slice(2, None, 4)), (slice(None, None, 3), 1),
                 (slice(None, None, -2), slice(1, None, 2)), (slice(7, 0, -3),),
                 (slice(None, None, -1), slice(None, None, -4))]

def _written(shape: tuple, index: tuple, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(values, the values the index selects replaced by new ones (NumPy), those new values)."""
  rng = np.random.default_rng(seed)
  values = rng.integers(-50, 50, shape).astype(np.float32)
  want = values.copy()
  new = rng.integers(100, 200, want[index].shape).astype(np.float32)
  want[index] = new
  return values, want, new

@pytest.mark.parametrize("shape", [(9, 6), (10, 7), (1, 5)])
@pytest.mark.parametrize("index", _STEP_INDICES, ids=str)
def test_assign_and_setitem_through_a_step_slice(shape, index):
  """t[::2].assign(v) raised NotImplementedError (the step slice's pad); the other elements stay as they were."""
  values, want, new = _written(shape, index)
  if 0 in new.shape: return
  t = Tensor(values).realize()
  t[index].assign(Tensor(new))
  assert np.array_equal(t.numpy(), want), f"{shape}{index} assign: got {t.numpy().tolist()}, want {want.tolist()}"
  s = Tensor(values).realize()
  s[index] = Tensor(new)
  assert np.array_equal(s.numpy(), want), f"{shape}{index} setitem: got {s.numpy().tolist()}, want {want.tolist()}"

def test_step_slice_writes_match_torch():
  values = np.arange(20, dtype=np.float32).reshape(4, 5)
  t, tt = Tensor(values).realize(), torch.tensor(values)
  t[::2].assign(Tensor.full((2, 5), -1.0))
  tt[::2] = -1.0
  t[1::3, 1::2] = Tensor([[7.0, 8.0]])
  tt[1::3, 1::2] = torch.tensor([[7.0, 8.0]])
  t[:, ::4] = 0.5
  tt[:, ::4] = 0.5
  check(t, tt, "step slice writes")

def test_setitem_and_assign_through_views_of_a_realized_buffer():
  """A view of a realized buffer (a transpose, a slice, a step slice of a slice) is written through, as in PyTorch."""
  values = np.arange(24, dtype=np.float32).reshape(4, 6)
  t, tt = Tensor(values).realize(), torch.tensor(values)
  view, view_t = t.T, tt.T
  view[1] = Tensor([1.0, 2.0, 3.0, 4.0])
  view_t[1] = torch.tensor([1.0, 2.0, 3.0, 4.0])
  inner, inner_t = t[1:, 1:], tt[1:, 1:]
  inner[::2, 1::2] = -5.0
  inner_t[::2, 1::2] = -5.0
  inner[2][::3].assign(Tensor([9.0, 9.0]))
  inner_t[2][::3] = 9.0
  t[1:][[0, 2], ::2] = Tensor([[-7.0], [-8.0]])   # advanced and step indices on a view
  tt[1:][[0, 2], ::2] = torch.tensor([[-7.0], [-8.0]])
  check(t, tt, "writes through views")
  check(view, view_t, "the transposed view reads them")
  check(inner, inner_t, "the inner view reads them")

def test_step_slice_write_into_a_pending_value():
  """c = a + 1 (never realized); c[::2].assign(x) writes into c, as c[1:].assign(x) does; a is untouched."""
  a, at = Tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
  c, ct = a + 1, at + 1
  c[::2].assign(Tensor([0.0, 0.0, 0.0]))
  ct[::2] = 0.0
  check(c, ct, "step slice of a pending value")
  check(a, at, "its input is untouched")

def test_step_slice_setitem_gradient_matches_a_slice():
  """A lazy computed tensor takes the new graph: the gradient skips the overwritten elements, as in PyTorch."""
  w = Tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
  wt = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
  x, xt = w * 2, wt * 2
  x[1::2] = 0.0
  xt[1::2] = 0.0
  (x * x).sum().backward()
  (xt * xt).sum().backward()
  check(w.grad, wt.grad, "gradient through a step setitem")

def test_writes_into_views_that_read_padding_or_repeat_elements_raise():
  t = Tensor.zeros(2, 3).contiguous().realize()
  with pytest.raises(NotImplementedError, match=r"assign: .*pad whose padding the view reaches.*\(4, 3\)"):
    t.pad(((1, 1), (0, 0))).assign(Tensor.ones(4, 3))
  with pytest.raises(NotImplementedError, match=r"assign: .*pad whose padding"):
    t.pad(((0, 0), (0, 3)))[:, ::2].assign(Tensor.ones(2, 3))
  with pytest.raises(NotImplementedError, match=r"setitem: .*expand"):
    t.reshape(1, 6).expand(2, 6)[0] = 1.0
  assert t.numpy().tolist() == [[0.0] * 3] * 2
