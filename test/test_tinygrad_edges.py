"""Edges a tinygrad user meets, each against PyTorch: rearrange with `...` anywhere einops allows it, randperm,
assign of a broadcastable value, backward of a non-scalar output with an explicit gradient, and assigning slices of
a DISK tensor."""
import numpy as np
import pytest
import torch
from kiln import Tensor, dtypes
from helpers import check, assert_close

# ---------------------------------------------------------------------------------------------------------------------
# rearrange: `...` first, last, in the middle, alone, empty, and grouped on the right (einops forbids it in a group on
# the left); each against the reshape/permute it means, forward and backward

@pytest.mark.parametrize("shape, formula, sizes, torch_fn", [
  ((2, 3, 4, 5), "... a b -> ... b a", {}, lambda t: t.permute(0, 1, 3, 2)),
  ((2, 3, 4, 5), "a ... b -> (a b) ...", {}, lambda t: t.permute(0, 3, 1, 2).reshape(10, 3, 4)),
  ((2, 3, 4, 5), "a b ... -> (... a) b", {}, lambda t: t.permute(2, 3, 0, 1).reshape(40, 3)),
  ((2, 3, 4, 5), "b ... c -> (b c ...)", {}, lambda t: t.permute(0, 3, 1, 2).reshape(-1)),
  ((2, 3, 4, 5), "a ... d -> d (...) a", {}, lambda t: t.permute(3, 1, 2, 0).reshape(5, 12, 2)),
  ((2, 3, 4, 5), "a ... d -> (d ... a)", {}, lambda t: t.permute(3, 1, 2, 0).reshape(-1)),
  ((2, 3, 4), "a ... -> (a ...)", {}, lambda t: t.reshape(24)),
  ((2, 3, 4), "... -> (...)", {}, lambda t: t.reshape(24)),
  ((2, 3, 4), "a ... -> ... a 1", {}, lambda t: t.permute(1, 2, 0).reshape(3, 4, 2, 1)),
  ((2, 3, 4), "... c -> c (...)", {}, lambda t: t.permute(2, 0, 1).reshape(4, 6)),
  ((2, 3, 4), "a ... -> a ... ()", {}, lambda t: t.reshape(2, 3, 4, 1)),
  ((3, 8), "... (h w) -> ... h w", {"h": 2}, lambda t: t.reshape(3, 2, 4)),
  ((3, 8), "... (h w) -> ... w h", {"w": 2}, lambda t: t.reshape(3, 4, 2).permute(0, 2, 1)),
  ((2, 1, 4), "a () ... -> ... a", {}, lambda t: t.reshape(2, 4).permute(1, 0)),
  ((2,), "a ... -> a ...", {}, lambda t: t),             # `...` standing for no axes
  ((2,), "a ... -> (a ...)", {}, lambda t: t),
  ((2,), "a ... -> a (...)", {}, lambda t: t.reshape(2, 1)),
  ((2, 3), "a b ... -> a (b ...)", {}, lambda t: t),
  ((), "... -> ...", {}, lambda t: t),
  ((), "... -> (...)", {}, lambda t: t.reshape(1)),
  ((2, 3, 4), "a \u2026 -> \u2026 a", {}, lambda t: t.permute(1, 2, 0)),   # einops also reads the one-character ellipsis
])
def test_rearrange_ellipsis(shape, formula, sizes, torch_fn):
  check(lambda t: t.rearrange(formula, **sizes), torch_fn, [shape])

def test_rearrange_ellipsis_in_a_left_group_is_refused():   # einops: "Ellipsis inside parenthesis in the left side"
  with pytest.raises(ValueError, match=r"rearrange: \.\.\. cannot be inside parentheses"):
    Tensor.ones(2, 12).rearrange("a (b ...) -> a b ...", b=3)

# ---------------------------------------------------------------------------------------------------------------------
# randperm: tinygrad's signature and defaults (int32, unlike torch's int64), a permutation like torch's

def test_randperm_is_a_permutation_with_tinygrads_defaults():
  for n in (0, 1, 7, 300):
    t, ref = Tensor.randperm(n), torch.randperm(n)
    assert t.shape == tuple(ref.shape) and t.dtype == dtypes.int32
    np.testing.assert_array_equal(np.sort(t.numpy()), np.sort(ref.numpy()))
  positional = Tensor.randperm(5, "PYTHON", dtypes.int64)   # device and dtype by position, as tinygrad
  assert positional.device == "PYTHON" and positional.dtype == dtypes.int64
  assert sorted(Tensor.randperm(4, dtype=dtypes.float32).tolist()) == [0.0, 1.0, 2.0, 3.0]
  assert Tensor.randperm(3, requires_grad=False).requires_grad is False   # other kwargs reach the Tensor
  Tensor.manual_seed(3)
  first = Tensor.randperm(20).tolist()
  Tensor.manual_seed(3)
  assert Tensor.randperm(20).tolist() == first and first != list(range(20))

# ---------------------------------------------------------------------------------------------------------------------
# assign broadcasts its value, as torch's copy_

@pytest.mark.parametrize("value", [
  np.array([1.0, 2.0, 3.0]), np.array([[4.0], [5.0]]), np.array(6.0), np.array([[1, 2, 3]]), [7.0, 8.0, 9.0], 2.5])
def test_assign_broadcasts_like_copy_(value):
  target = Tensor.zeros(2, 3).contiguous().realize()
  want = torch.zeros(2, 3).copy_(torch.tensor(value) if not isinstance(value, float) else torch.tensor(value))
  source = Tensor(value) if isinstance(value, np.ndarray) else value
  assert_close(target.assign(source).numpy(), want.numpy(), f"assign of {value!r}")
  assert target.dtype == dtypes.float32

def test_assign_broadcast_into_a_view_and_lazy_tensor():
  base = Tensor.zeros(3, 4).contiguous().realize()
  base[1:].assign(Tensor([1.0, 2.0, 3.0, 4.0]))
  want = torch.zeros(3, 4)
  want[1:].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
  assert_close(base.numpy(), want.numpy(), "assign into a slice")
  lazy = Tensor.ones(2, 2) + 1
  assert lazy.assign(Tensor([[3.0], [4.0]])).tolist() == [[3.0, 3.0], [4.0, 4.0]]

def test_assign_that_does_not_broadcast_raises_like_torch():
  for value in ((4,), (3, 3), (2, 2, 3)):
    with pytest.raises(RuntimeError): torch.zeros(2, 3).copy_(torch.ones(value))
    with pytest.raises(RuntimeError, match=rf"assign: .*{value[0]}.* does not match the target's \(2, 3\)"):
      Tensor.zeros(2, 3).contiguous().realize().assign(Tensor.ones(*value))

# ---------------------------------------------------------------------------------------------------------------------
# backward of a non-scalar output with an explicit gradient, as torch's t.backward(gradient)

@pytest.mark.parametrize("name, fn", [
  ("square", lambda x, w: x * x), ("matmul", lambda x, w: x @ w), ("row_sums", lambda x, w: (x * w.T).sum(1)),
  ("softmax", lambda x, w: x.softmax(-1)), ("broadcast", lambda x, w: x.reshape(2, 1, 3) + w.T.reshape(1, 2, 3))])
def test_backward_with_explicit_gradient_matches_torch(name, fn):
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
  kx, kw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  out, ref = fn(kx, kw), fn(tx, tw)
  upstream = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
  out.backward(Tensor(upstream))
  ref.backward(torch.tensor(upstream))
  for got, want, what in ((kx, tx, "x"), (kw, tw, "w")):
    if want.grad is None: assert got.grad is None or not got.grad.numpy().any(), f"{name}: {what}"
    else: assert_close(got.grad.numpy(), want.grad.numpy(), f"{name}: d/d{what}")

def test_backward_gradients_accumulate_and_cast_like_torch():
  x, tx = Tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)
  (x * 3).backward(Tensor([1, 2]))   # an int gradient is cast to the output's dtype, as torch does
  (x * x).backward(Tensor([0.5, 0.5]))
  (tx * 3).backward(torch.tensor([1, 2]))
  (tx * tx).backward(torch.tensor([0.5, 0.5]))
  assert x.grad.dtype == dtypes.float32
  assert_close(x.grad.numpy(), tx.grad.numpy(), "accumulated gradients")

def test_backward_gradient_errors_are_torchs():
  x, tx = Tensor.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
  for bad in (torch.ones(3), torch.tensor(2.0), torch.ones(2, 1)):
    with pytest.raises(RuntimeError): (tx * 3).backward(bad)
    with pytest.raises(RuntimeError, match=r"gradient: the gradient of shape .* does not match the output's shape"):
      (x * 3).backward(Tensor(bad.numpy()))
  with pytest.raises(TypeError): (tx * 3).backward([1.0, 2.0])
  with pytest.raises(TypeError, match="gradient: the gradient must be a Tensor, got list"): (x * 3).backward([1.0, 2.0])
  assert x.grad is None, "a refused gradient accumulates nothing"

# ---------------------------------------------------------------------------------------------------------------------
# DISK tensors: assign and setitem of slices write through to the file (the same writes into a torch tensor)

def test_disk_slice_assign_and_setitem_write_the_file(tmp_path):
  path = tmp_path / "weights.bin"
  path.write_bytes(bytes(64))
  disk, want = Tensor(path).bitcast(dtypes.float32).reshape(4, 4), torch.zeros(4, 4)
  disk[1:3].assign(Tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]))
  want[1:3].copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]))
  disk[0] = Tensor([9.0, 9.5, 10.0, 10.5])
  want[0] = torch.tensor([9.0, 9.5, 10.0, 10.5])
  disk[3].assign(Tensor([-1.0]))   # broadcast
  want[3].copy_(torch.tensor([-1.0]))
  disk[2, 1:3] = 0.25
  want[2, 1:3] = 0.25
  disk.reshape(16)[5:7] = [11.0, 12.0]
  want.reshape(16)[5:7] = torch.tensor([11.0, 12.0])
  assert_close(np.frombuffer(path.read_bytes(), np.float32).reshape(4, 4), want.numpy(), "the file after the writes")
  assert_close(Tensor(path).bitcast(dtypes.float32).reshape(4, 4).numpy(), want.numpy(), "a new DISK tensor reads them")
  with pytest.raises(RuntimeError, match="not one contiguous byte range"): disk[1:3, 1:3] = 0.0
  with pytest.raises(RuntimeError, match="does not broadcast"): disk[0].assign(Tensor([1.0, 2.0]))

@pytest.mark.parametrize("data, index, value", [
  ([0, 1, 2, 3], slice(0, 2), [13, 12]), ([[0, 1, 2, 3], [4, 5, 6, 7]], slice(0, 1), [[13, 12, 11, 10]]),
  ([[0.5, 1.5], [2.5, 3.5]], 1, 9.0)])
def test_disk_setitem_of_a_tensor_copied_to_disk(tmp_path, data, index, value):
  """`x.to("disk:f")[i] = v` before anything wrote the file: the copy is written first, then the slice (tinygrad)."""
  disk = Tensor(data, device="CPU").to(f"disk:{tmp_path / 'copy.bin'}")
  want = np.array(data, dtype=np.int32 if isinstance(value, (int, list)) and disk.dtype == dtypes.int32 else np.float32)
  disk[index] = value
  want[index] = value
  assert_close(disk.numpy(), want, f"disk[{index}] = {value}")
  assert_close(np.frombuffer((tmp_path / "copy.bin").read_bytes(), want.dtype).reshape(want.shape), want, "the file")
  view = Tensor(data, device="CPU").to(f"disk:{tmp_path / 'view.bin'}")[index]   # a view taken before the write
  view.assign(value)
  assert_close(np.frombuffer((tmp_path / "view.bin").read_bytes(), want.dtype).reshape(want.shape), want, "assign")
