"""toposort walks by recursion and, past the recursion limit, with an explicit stack: both give one order
(kiln/uop/ops.py); the kernels codegen makes depend on it."""
import gc, random, sys, weakref
from kiln.dtype import dtypes
from kiln.uop.ops import UOp, Ops, toposort, _toposort_iterative

def _random_dag(seed: int, size: int = 300) -> UOp:
  """A SINK over a random DAG of int ALU nodes that share sources (each node picks earlier ones)."""
  rng = random.Random(seed)
  nodes = [UOp.variable(f"v{i}", 0, 9) for i in range(4)]
  for i in range(size):
    op = rng.choice([Ops.ADD, Ops.MUL, Ops.MAX, Ops.WHERE])
    if op is Ops.WHERE:
      cond = nodes[rng.randrange(len(nodes))].alu(Ops.CMPLT, UOp.const(dtypes.int32, i))
      nodes.append(cond.alu(Ops.WHERE, *rng.sample(nodes, 2)))
    else: nodes.append(rng.choice(nodes).alu(op, rng.choice(nodes)))
  return UOp(Ops.SINK, dtypes.void, tuple(rng.sample(nodes, 12)))

def test_the_recursive_and_the_iterative_walk_give_one_order():
  for seed in range(5):
    sink = _random_dag(seed)
    def stop(u: UOp) -> bool: return u.op is Ops.MAX
    def sources(u: UOp) -> tuple: return u.src[::-1]
    for kwargs in ({}, {"stop": stop}, {"sources": sources}, {"stop": stop, "sources": sources}):
      got, want = toposort([sink], **kwargs), _toposort_iterative([sink], **kwargs)
      assert got == want, f"seed {seed}, {sorted(kwargs)}: the orders differ"
      assert len(set(got)) == len(got)
    roots = list(sink.src[3:]) + [sink.src[0], sink.src[0]]   # several roots, one reachable from others, repeated
    assert toposort(roots) == _toposort_iterative(roots)

def test_a_graph_deeper_than_the_recursion_limit_is_walked_in_the_same_order():
  depth = sys.getrecursionlimit() + 500
  node = UOp.variable("x", 0, 3)
  side = UOp.const(dtypes.int32, 1)
  for i in range(depth): node = node.alu(Ops.ADD, side if i % 3 else UOp.const(dtypes.int32, i))
  for kwargs in ({}, {"stop": lambda u: False}):
    order = toposort([node], **kwargs)
    assert order == _toposort_iterative([node], **kwargs)
    assert order[-1] is node and len(order) == len(set(order))

def test_a_walk_leaves_no_reference_cycle_behind():
  # the recursive walk is a closure that names itself: unbroken, the cycle would keep the graph until a GC pass
  # (paused during codegen)
  gc.disable()
  try:
    node = UOp.variable("y", 0, 3).alu(Ops.ADD, UOp.const(dtypes.int32, 12345))
    ref = weakref.ref(node)
    for kwargs in ({}, {"stop": lambda u: False}):
      assert toposort([node], **kwargs)[-1] is node
    del node
    assert ref() is None, "the walked graph is still alive without a GC pass"
  finally: gc.enable()
