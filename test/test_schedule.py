"""The scheduler: fusion is real (kernel counts), deep graphs schedule, assign is in place, buffers are shared."""
import sys
import numpy as np
from kiln import Tensor, GlobalCounters, Context
from helpers import assert_close

def realized(*arrays) -> list[Tensor]:
  return [Tensor(np.asarray(a, np.float32)).realize() for a in arrays]

def kernels_to_realize(*tensors: Tensor) -> int:
  """How many kernels realizing `tensors` runs."""
  GlobalCounters.reset()
  Tensor.realize_all(list(tensors))
  return GlobalCounters.kernel_count

RNG = np.random.default_rng(0)

# ---------------------------------------------------------------------------------------------------------------------
# fusion

def test_elementwise_into_reduce_is_one_kernel():
  an, bn, cn = (RNG.standard_normal(1 << 20).astype(np.float32) for _ in range(3))
  a, b, c = realized(an, bn, cn)
  out = ((a * b + c).relu() * 2).sum()
  assert len(out.schedule()) == 1
  assert kernels_to_realize(out) == 1
  want = (np.maximum(an.astype(np.float64) * bn + cn, 0) * 2).sum()
  assert_close(out.numpy(), np.float32(want), "sum over 1M", atol=1e-2, rtol=1e-4)

def test_matmul_relu_is_one_kernel():
  an, bn = RNG.standard_normal((16, 32)).astype(np.float32), RNG.standard_normal((32, 8)).astype(np.float32)
  a, b = realized(an, bn)
  out = (a @ b).relu()
  assert kernels_to_realize(out) == 1
  assert_close(out.numpy(), np.maximum(an @ bn, 0), "relu(a@b)", 1e-4, 1e-4)
  out2 = (a.reshape(16, 1, 32) * b.T.reshape(1, 8, 32)).sum(2)   # matmul written by hand: also one kernel
  assert kernels_to_realize(out2) == 1
  assert_close(out2.numpy(), an @ bn, "hand-written matmul", 1e-4, 1e-4)

def test_elementwise_chain_of_1000_ops_is_one_kernel():
  xn = RNG.standard_normal(64).astype(np.float32)
  (x,) = realized(xn)
  y, want = x, xn.copy()
  for i in range(500):   # 1,000 ops
    y = y * 1.001 + 0.001 if i % 2 else (y - 0.25) * 0.999
    want = want * np.float32(1.001) + np.float32(0.001) if i % 2 else (want - np.float32(0.25)) * np.float32(0.999)
  assert len(y.schedule()) == 1
  assert kernels_to_realize(y) == 1
  assert_close(y.numpy(), want, "1000-op chain", 1e-4, 1e-4)

def test_10000_node_graph_schedules():
  limit = sys.getrecursionlimit()
  xs = realized(*[np.full(4, i, np.float32) for i in range(10)])
  y = xs[0]
  for i in range(10_000): y = y + xs[i % 10]
  items = y.schedule()
  assert len(items) == 1 and sys.getrecursionlimit() == limit

def test_deep_reshape_chain_schedules():
  xs = realized(*[np.full((2, 2), i, np.float32) for i in range(4)])
  y = xs[0]
  for i in range(5_000): y = (y + xs[i % 4]).reshape(4).reshape(2, 2) if i % 2 else y.T
  assert len(y.schedule()) == 1

def test_a_graph_deeper_than_the_recursion_limit_is_schedule_cached():
  from kiln.schedule import cache
  def chain(t: Tensor) -> Tensor:
    for i in range(sys.getrecursionlimit() + 500): t = t * 1.0001 if i % 2 else t + 1
    return t
  first, second = realized(np.arange(4), np.arange(4) + 10)
  want = chain(first).numpy()
  hits = cache.stats["hits"]
  got = chain(second).numpy()   # the same structure over another buffer: served from the template
  assert cache.stats["hits"] == hits + 1
  n = sys.getrecursionlimit() + 500
  expected = np.arange(4, dtype=np.float64) + 10
  for i in range(n): expected = expected * 1.0001 if i % 2 else expected + 1
  assert_close(got, expected.astype(np.float32), "deep chain", rtol=1e-3)
  assert not np.array_equal(got, want)

def test_10000_node_graph_realizes_and_differentiates():
  a = Tensor(np.ones(4, np.float32), requires_grad=True)
  y = a
  for i in range(10_000): y = y * 1.0001 if i % 2 else y + 0.5
  (grad,) = y.sum().gradient(a)
  assert len(grad.schedule()) == 1
  want_y = 1.0
  for i in range(10_000): want_y = want_y * 1.0001 if i % 2 else want_y + 0.5
  assert_close(y.numpy(), np.full(4, want_y), "10,000-op chain", 0, 1e-3)
  assert_close(grad.numpy(), np.full(4, 1.0001 ** 5000), "its gradient", 0, 1e-3)   # each *1.0001 scales d/da

def test_softmax_kernels_and_values():
  xn = RNG.standard_normal((8, 33)).astype(np.float32) * 4
  (x,) = realized(xn)
  out = x.softmax(-1)
  assert kernels_to_realize(out) <= 3
  e = np.exp(xn - xn.max(-1, keepdims=True))
  assert_close(out.numpy(), e / e.sum(-1, keepdims=True), "softmax", 1e-6, 1e-5)

def test_contiguous_is_a_kernel_boundary():
  (a,) = realized(RNG.standard_normal((4, 4)))
  assert len(((a + 1) * 2).schedule()) == 1
  assert len(((a + 1).contiguous() * 2).schedule()) == 2
  assert kernels_to_realize((a + 1).contiguous() * 2) == 2
  mid = (a.T + 1).contiguous()
  out = mid * 2
  assert kernels_to_realize(out, mid) == 2   # realized together: the intermediate is computed once
  assert_close(out.numpy(), (a.numpy().T + 1) * 2, "contiguous chain")
  assert_close(mid.numpy(), a.numpy().T + 1, "contiguous")

# ---------------------------------------------------------------------------------------------------------------------
# assign and reuse of realized tensors

def test_assign_writes_into_the_same_buffer():
  (a,) = realized([1.0, 2.0, 3.0, 4.0])
  buf = a.uop.base.buffer
  a.assign(a * 2 + 1)
  assert kernels_to_realize(a) == 1
  assert a.uop.base.buffer is buf and a.tolist() == [3.0, 5.0, 7.0, 9.0]
  a.assign(a.flip(0))   # reads other elements of the buffer it writes
  a.realize()
  assert a.uop.base.buffer is buf and a.tolist() == [9.0, 7.0, 5.0, 3.0]

def test_assign_reads_of_old_value_in_same_realize():
  (a,) = realized([1.0, 2.0, 3.0])
  buf = a.uop.base.buffer
  b = a + 1
  a.assign(a * 2)
  Tensor.realize_all([b, a])
  assert b.tolist() == [2.0, 3.0, 4.0], "b must see the old value of a"
  assert a.tolist() == [2.0, 4.0, 6.0] and a.uop.base.buffer is buf
  c = a.sum()   # built after the assign: sees the new value
  a.assign(a + 10)
  Tensor.realize_all([a, c])
  assert c.item() == 12.0 and a.tolist() == [12.0, 14.0, 16.0]

def test_realized_tensors_are_reused():
  (a,) = realized(RNG.standard_normal(16))
  x = (a * 2).exp().realize()
  y = x + 1
  items = y.schedule()
  assert len(items) == 1 and any(b is x.uop.base.buffer for b in items[0].bufs[1:])
  assert kernels_to_realize(y) == 1
  assert_close(y.numpy(), np.exp(a.numpy() * 2) + 1, "x + 1", 1e-5, 1e-5)
  assert kernels_to_realize(x) == 0 and kernels_to_realize(y) == 0

# ---------------------------------------------------------------------------------------------------------------------
# memory planning

def test_memory_planner_shares_intermediate_buffers():
  an = RNG.standard_normal(256).astype(np.float32)
  (a,) = realized(an)
  x, want = a, an.astype(np.float64)
  for i in range(5):
    x = (x * 0.5 + i).contiguous()
    want = want * 0.5 + i
  out = x.exp2()
  items = out.schedule()
  assert len(items) == 6
  intermediates = {id(item.bufs[0]) for item in items[:-1]}
  assert len(intermediates) < 5, f"5 intermediates in {len(intermediates)} buffers"
  assert items[-1].bufs[0] not in [it.bufs[0] for it in items[:-1]]
  assert_close(out.numpy(), np.exp2(want), "after 5 contiguous steps", 1e-5, 1e-5)

def test_results_computed_from_an_overwritten_buffer_are_not_reused():
  # `c + 1` built after the assign is the same graph node as the one realized before it (hash-consing): it must be
  # computed again from the new contents, not answered with the old result
  a = Tensor([1.0, 2.0, 3.0]).realize()
  view = a[0:2]
  keep_alive = (view + 1) * 2          # holds the node `view + 1` alive across the assign
  before = (view + 1).realize()
  a.assign(Tensor([10.0, 20.0, 30.0])).realize()
  assert (view + 1).tolist() == [11.0, 21.0]
  assert before.tolist() == [2.0, 3.0]   # a realized tensor keeps the values it was realized with
  assert keep_alive.tolist() == [4.0, 6.0]   # built before the assign: the old values, as in PyTorch

def test_pending_tensor_built_before_assign_keeps_old_values():
  a = Tensor([1.0, 2.0]).realize()
  doubled, view = a * 2, a.reshape(2, 1)   # a computation sees the old values; a view shares storage (PyTorch)
  a.assign(a + 10).realize()
  assert doubled.tolist() == [2.0, 4.0]
  assert view.tolist() == [[11.0], [12.0]] and a.tolist() == [11.0, 12.0]

def test_loss_read_after_optimizer_step_is_the_pre_step_loss():
  from kiln.nn.optim import SGD
  w = Tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
  x = Tensor([[1.0, 2.0]])
  loss = (x @ w).square().sum()
  opt = SGD([w], lr=0.1)
  with Tensor.train():
    opt.zero_grad(); loss.backward(); opt.step()
  expected = float(((np.array([[1.0, 2.0]]) @ np.array([[1.0, -2.0], [0.5, 3.0]])) ** 2).sum())
  assert loss.item() == expected
  assert w.grad.tolist() == [[4.0, 8.0], [8.0, 16.0]]   # the gradient at the old weights, like PyTorch's .grad

def test_assign_run_as_a_dependency_runs_once():
  w = Tensor([1.0]).realize()
  w.assign(w + 1)
  assert (w * 2).tolist() == [4.0]        # realizes the pending assign as part of this graph
  assert w.tolist() == [2.0] and (w.reshape(1, 1) * 1).tolist() == [[2.0]]   # not applied a second time

def test_matmul_whose_broadcast_view_exceeds_32_bits_is_scheduled():
  a, b = Tensor.empty(2048, 2048), Tensor.empty(2048, 2048)   # the product's broadcast view has 2048**3 elements
  with Context(PACK_MATMUL=0): assert len((a @ b).schedule()) == 1
  assert len((a @ b).schedule()) == 2   # packed first (kiln/schedule/pack.py): the copy of b, then the matmul

def test_realized_constant_graph_stays_a_constant():
  """A realized graph that reads no buffer is not redirected to its result: an equal graph built later (here the seed
  of backward(), the same node as Tensor.ones(())) stays a constant that folds into its kernels, not a load."""
  Tensor.ones(()).realize()
  x = Tensor([1.0, 2.0], requires_grad=True)
  (x * 3).sum().backward()
  items = x.grad.schedule()
  assert items and all(len(item.bufs) == 1 for item in items), [len(item.bufs) for item in items]
  assert x.grad.tolist() == [3.0, 3.0]
