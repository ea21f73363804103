"""Symbolic sizes in OnnxRunner's kept graphs (kiln/frontend/onnx_symbolic.py): a dim declared by name or as -1
compiles once for every size of its range where the size only changes loop bounds; shape arithmetic on such sizes
stays symbolic; a size used as data is read at each call; what cannot serve every size falls back to a graph per
size. Each test counts the kernels compiled (kiln's runner cache) and checks every result against numpy."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from kiln.engine import realize  # noqa: E402
from kiln.frontend.onnx import OnnxRunner  # noqa: E402
from test_onnx import assert_close, counting_builds, make_model, reference_mlp  # noqa: E402

def compiled() -> int: return len(realize._runner_cache)

def run_sizes(runner, make_feeds, sizes, reference) -> list[int]:
  """Run the runner on feeds of each size, check each result; the kernels compiled by each call."""
  counts = []
  for size in sizes:
    feeds = make_feeds(size)
    before = compiled()
    outputs = runner(feeds)
    counts.append(compiled() - before)
    for name, expected in reference(feeds).items(): assert_close(outputs[name].numpy(), expected)
  return counts

def floats(*shape, seed=0) -> np.ndarray: return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def mlp_model(inputs: int = 5, outputs: int = 7):
  """x (batch, inputs) -> softmax(relu(x @ w + b)), with a symbolic batch dim (sizes of its own: kernels of its own,
  so the counts below do not depend on what other tests compiled)."""
  w, b = floats(inputs, outputs, seed=11), floats(outputs, seed=12)
  nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
           helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", outputs])],
                     [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
  return model, w, b

def test_mlp_compiles_once_for_every_batch(monkeypatch):
  model, w, b = mlp_model()
  runner = OnnxRunner(model)
  walks = counting_builds(runner, monkeypatch)
  counts = run_sizes(runner, lambda n: {"x": floats(n, 5, seed=n)}, [3, 5, 16, 2, 9],
                     lambda feeds: {"y": reference_mlp(feeds["x"], w, b)})
  assert counts[0] > 0 and counts[1:] == [0] * 4, counts
  assert len(walks) == 1 and len(runner.cache.graphs) == 1

def test_a_larger_size_takes_the_next_range():
  """Ranges are 2-16, 17-32, 33-64...: the buffers have room for the range's top, so a size past it compiles the
  kernels once more, for every size of the next range."""
  model, w, b = mlp_model(6, 3)
  runner = OnnxRunner(model)
  counts = run_sizes(runner, lambda n: {"x": floats(n, 6, seed=n)}, [4, 20, 31, 17],
                     lambda feeds: {"y": reference_mlp(feeds["x"], w, b)})
  assert counts[0] > 0 and counts[1] > 0 and counts[2:] == [0, 0], counts

def shape_arithmetic_model():
  """x (batch, steps, 8) -> reshape to (batch, steps, 4, -1) from its own Shape, heads first, times 2."""
  nodes = [helper.make_node("Shape", ["x"], ["shape"]),
           helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
           helper.make_node("Gather", ["shape", "one"], ["steps"], axis=0),
           helper.make_node("Concat", ["batch", "steps", "heads"], ["target"], axis=0),
           helper.make_node("Reshape", ["x", "target"], ["split"]),
           helper.make_node("Transpose", ["split"], ["heads_first"], perm=[0, 2, 1, 3]),
           helper.make_node("Mul", ["heads_first", "two"], ["y"])]
  inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
           numpy_helper.from_array(np.array([1], np.int64), "one"),
           numpy_helper.from_array(np.array([4, -1], np.int64), "heads"),
           numpy_helper.from_array(np.array(2, np.float32), "two")]
  return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", 8])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)

def test_shape_arithmetic_stays_symbolic():
  """Shape -> Gather -> Concat -> Reshape(-1): the target holds the sizes' expressions, and -1 is inferred with
  the symbolic factors cancelled; two symbolic dims, one graph."""
  runner = OnnxRunner(shape_arithmetic_model())
  reference = lambda feeds: {"y": feeds["x"].reshape(*feeds["x"].shape[:2], 4, 2).transpose(0, 2, 1, 3) * 2}
  counts = run_sizes(runner, lambda size: {"x": floats(*size, 8)}, [(2, 7), (3, 5), (5, 11), (2, 2)], reference)
  assert counts[0] > 0 and counts[1:] == [0, 0, 0], counts
  assert len(runner.cache.graphs) == 1

def test_a_size_used_as_data_is_read_at_each_call():
  """x / batch with the batch taken from Shape: the value comes from the call's size, not the first call's."""
  nodes = [helper.make_node("Shape", ["x"], ["shape"]),
           helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
           helper.make_node("Cast", ["batch"], ["count"], to=TensorProto.FLOAT),
           helper.make_node("Div", ["x", "count"], ["y"])]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(np.array(0, np.int64), "zero")])
  runner = OnnxRunner(model)
  # (sizes coming back after others: each call's size input must hold its own size, the TinyJit replaying)
  counts = run_sizes(runner, lambda n: {"x": floats(n, 3)}, [3, 7, 4, 12, 7, 3, 7, 4],
                     lambda feeds: {"y": feeds["x"] / len(feeds["x"])})
  assert not any(counts[1:]), counts
  assert len(runner.cache.graphs) == 1

def test_a_comparison_that_depends_on_the_size_is_not_folded():
  """batch == 4 ? x * 2 : x * 3: not decidable for every batch, so it is computed at each call, not baked."""
  nodes = [helper.make_node("Shape", ["x"], ["shape"]),
           helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
           helper.make_node("Equal", ["batch", "four"], ["is_four"]),
           helper.make_node("Mul", ["x", "two"], ["doubled"]), helper.make_node("Mul", ["x", "three"], ["tripled"]),
           helper.make_node("Where", ["is_four", "doubled", "tripled"], ["y"])]
  inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
           numpy_helper.from_array(np.array(4, np.int64), "four"),
           numpy_helper.from_array(np.array(2, np.float32), "two"),
           numpy_helper.from_array(np.array(3, np.float32), "three")]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
  runner = OnnxRunner(model)
  run_sizes(runner, lambda n: {"x": floats(n, 2)}, [3, 4, 5, 4],
            lambda feeds: {"y": feeds["x"] * (2 if len(feeds["x"]) == 4 else 3)})
  assert len(runner.cache.graphs) == 1

def test_inputs_sharing_a_dim_name_share_its_variable():
  model = make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                     [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
                      helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  runner = OnnxRunner(model)
  counts = run_sizes(runner, lambda n: {"a": floats(n, 4), "b": floats(n, 4, seed=1)}, [3, 6, 10],
                     lambda feeds: {"y": feeds["a"] + feeds["b"]})
  assert counts[1:] == [0, 0], counts
  assert len(runner.cache.graphs) == 1

def test_a_conv_net_over_a_symbolic_height_and_width_compiles_once():
  """Conv, MaxPool, ConvTranspose over a dynamic height and width (kiln/mixin/conv.py `_pool_symbolic`): one graph
  and one compile for every size of the range, each result as onnxruntime's."""
  ort = pytest.importorskip("onnxruntime")
  inits = [numpy_helper.from_array(floats(4, 2, 3, 3, seed=5), "w"), numpy_helper.from_array(floats(4, seed=6), "b"),
           numpy_helper.from_array(floats(4, 3, 2, 2, seed=7), "up")]
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
           helper.make_node("Relu", ["c"], ["r"]), helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3],
                                                                 pads=[1, 1, 1, 1], strides=[1, 1]),
           helper.make_node("ConvTranspose", ["p", "up"], ["y"], strides=[2, 2])]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "height", "width"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  runner = OnnxRunner(model)
  counts = run_sizes(runner, lambda size: {"x": floats(1, 2, *size, seed=size[0])}, [(9, 11), (12, 10), (16, 9)],
                     lambda feeds: {"y": session.run(None, feeds)[0]})
  assert counts[0] > 0 and counts[1:] == [0, 0], counts
  assert len(runner.cache.graphs) == 1

def test_a_feature_pyramid_compiles_once_for_sizes_in_whole_steps():
  """A stride-2 conv whose output, upsampled 2x, is added back to the input (an FPN): shapes agree only where the
  size is even, so the plain symbolic build fails and the sizes are built as 16 * v (onnx_cache.py size_step): one
  graph and one compile for 16x48, 48x16 and 80x48."""
  ort = pytest.importorskip("onnxruntime")
  inits = [numpy_helper.from_array(floats(2, 2, 3, 3, seed=8), "w"),
           numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
           numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
           helper.make_node("Resize", ["c", "roi", "scales"], ["up"], mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
           helper.make_node("Add", ["x", "up"], ["y"])]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "height", "width"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=13)
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  runner = OnnxRunner(model)
  counts = run_sizes(runner, lambda size: {"x": floats(1, 2, *size, seed=size[1])}, [(16, 48), (48, 16), (80, 48)],
                     lambda feeds: {"y": session.run(None, feeds)[0]})
  assert counts[0] > 0 and counts[1:] == [0, 0], counts
  assert len(runner.cache.graphs) == 1   # (and the plain builds failed, once for each of their ranges)
  assert all(step == 1 for key in runner.cache.not_symbolic for _, step in key[0][1][2:])

def test_a_build_that_needs_plain_sizes_falls_back_to_a_graph_per_size():
  """A pool in ceil_mode keeps a last partial window where the size's remainder leaves one (onnx_nn.py
  `_pool_windows`: a Python decision on the size): over a symbolic height and width each size builds its own graph,
  as without symbolic sizes, and every result is right."""
  ort = pytest.importorskip("onnxruntime")
  model = make_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                       ceil_mode=1)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "height", "width"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  runner = OnnxRunner(model)
  run_sizes(runner, lambda size: {"x": floats(1, 1, *size)}, [(5, 6), (7, 4), (5, 6)],
            lambda feeds: {"y": session.run(None, feeds)[0]})
  # one range, tried once plainly and once in each size's steps (6 = 2*3, 4 = 4*1: onnx_cache.py size_step)
  assert len(runner.cache.graphs) == 2 and len(runner.cache.not_symbolic) == 3

def test_outputs_of_every_kind_come_back_with_plain_sizes():
  """A computed output, a view of it (a second output sharing its buffer), the Shape itself and a fixed-size
  output: each comes back with plain int sizes at every call, and none compiles again."""
  nodes = [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Reshape", ["y", "flat"], ["z"]),
           helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)]
  inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
           numpy_helper.from_array(np.array([-1], np.int64), "flat")]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 3])],
                     [helper.make_tensor_value_info(name, TensorProto.FLOAT if name != "s" else TensorProto.INT64,
                                                    None) for name in ("y", "z", "s", "total")], inits, opset=13)
  runner = OnnxRunner(model)
  for rows in (4, 6, 2, 6):
    x = floats(rows, 3, seed=rows)
    before = compiled()
    out = runner({"x": x})
    assert all(type(d) is int for name in ("y", "z", "s", "total") for d in out[name].shape)
    assert_close(out["y"].numpy(), x * 2)
    assert_close(out["z"].numpy(), (x * 2).reshape(-1))
    assert out["s"].numpy().tolist() == [rows, 3]
    assert_close(out["total"].numpy(), x.sum(), atol=1e-4)
    if rows != 4: assert compiled() == before
  assert len(runner.cache.graphs) == 1

def test_a_hot_size_gets_its_own_graph_while_that_pays(monkeypatch):
  """A signature called more than SPECIALIZE_AFTER times through the symbolic graph gets a graph of its own sizes;
  its replays are timed against the symbolic graph's, and where they are not faster (forced here: an unreachable
  gain), the range's other hot sizes stay on the symbolic graph."""
  from kiln.frontend import onnx_cache
  monkeypatch.setattr(onnx_cache, "SPECIALIZED_GAIN", 1e9)
  model, w, b = mlp_model(3, 5)
  runner = OnnxRunner(model)
  calls = onnx_cache.SPECIALIZE_AFTER + onnx_cache.TIMED_REPLAYS + 2
  for n in (6, 9):
    x = floats(n, 3, seed=n)
    for _ in range(calls): assert_close(runner({"x": x})["y"].numpy(), reference_mlp(x, w, b))
  own = [key for key, graph in runner.cache.graphs.items() if graph is not None and key[0][1][0] == 6]
  assert len(own) == 1 and len(runner.cache.graphs) == 2, list(runner.cache.graphs)   # 9 kept the symbolic one
  assert list(runner.cache.specialize.values()) == [False]

def test_a_pool_over_a_symbolic_batch_height_and_width_keeps_the_batch_symbolic():
  """The build with every size symbolic needs plain spatial sizes (a conv, then a pool in ceil_mode); the one with
  only the leading (batch) axis symbolic does not: a new batch compiles nothing, a new height builds once more."""
  ort = pytest.importorskip("onnxruntime")
  weight = floats(4, 2, 3, 3, seed=6)
  model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                      helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "height", "width"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(weight, "w")])
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  runner = OnnxRunner(model)
  counts = run_sizes(runner, lambda size: {"x": floats(*size)}, [(2, 2, 6, 5), (3, 2, 6, 5), (7, 2, 6, 5),
                                                                   (3, 2, 4, 5)],
                     lambda feeds: {"y": session.run(None, feeds)[0]})
  assert counts[1:3] == [0, 0] and counts[3] > 0, counts
  assert len(runner.cache.graphs) == 2

def positions_model(table: int):
  """x (batch, steps, 4) + pos[:steps] (a table of `table` rows sliced by the input's own length), then the last
  step plus the sum of the steps after the first: Slice and Gather over a symbolic axis."""
  big = np.iinfo(np.int64).max
  nodes = [helper.make_node("Shape", ["x"], ["shape"]),
           helper.make_node("Gather", ["shape", "one"], ["steps"], axis=0),
           helper.make_node("Slice", ["pos", "zero", "steps", "zero"], ["used"]),
           helper.make_node("Add", ["x", "used"], ["h"]),
           helper.make_node("Gather", ["h", "last"], ["final"], axis=1),
           helper.make_node("Slice", ["h", "one", "end", "one"], ["rest"]),
           helper.make_node("ReduceSum", ["rest", "one"], ["total"], keepdims=0),
           helper.make_node("Add", ["final", "total"], ["y"])]
  inits = [numpy_helper.from_array(floats(table, 4, seed=9), "pos"),
           numpy_helper.from_array(np.array([0], np.int64), "zero"),
           numpy_helper.from_array(np.array([1], np.int64), "one"),
           numpy_helper.from_array(np.array(-1, np.int64), "last"),
           numpy_helper.from_array(np.array([big], np.int64), "end")]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", 4])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=13)
  return model, numpy_helper.to_array(inits[0])

@pytest.mark.parametrize("table", [64, 10])
def test_slices_and_gathers_over_a_symbolic_axis(table):
  """Bounds that hold for every size of the range stay symbolic (a 64-row table: one graph); a table shorter than
  the range's top (10 rows for lengths up to 16) cannot serve it all, so each length builds its own graph."""
  model, pos = positions_model(table)
  runner = OnnxRunner(model)
  def reference(feeds):
    h = feeds["x"] + pos[:feeds["x"].shape[1]]
    return {"y": h[:, -1] + h[:, 1:].sum(1)}
  counts = run_sizes(runner, lambda size: {"x": floats(*size, 4)}, [(2, 5), (3, 9), (2, 7)], reference)
  if table == 64: assert counts[1:] == [0, 0] and len(runner.cache.graphs) == 1, counts
  else: assert len(runner.cache.graphs) == 3

@pytest.mark.parametrize("device", ["LLVM", "PYTHON"])
def test_symbolic_sizes_on_other_devices(device):
  """The placeholders' fronts (buffer views) and the size inputs work on the other CPU devices too."""
  model, w, b = mlp_model(4, 2)
  runner = OnnxRunner(model, device=device)
  for n in (3, 5, 3):
    x = floats(n, 4, seed=n)
    y = runner({"x": x})["y"]
    assert y.device == device
    assert_close(y.numpy(), reference_mlp(x, w, b))
  assert len(runner.cache.graphs) == 1

def test_position_ids_from_a_range_over_the_length():
  """Range(0, steps, 1) and Range(0, steps, 2) from the input's own length, gathering rows of a table (an exported
  transformer's position ids): aranges as long as the range's largest count, sliced to it; one graph."""
  table = floats(64, 4, seed=10)
  nodes = [helper.make_node("Shape", ["x"], ["shape"]),
           helper.make_node("Gather", ["shape", "one"], ["steps"], axis=0),
           helper.make_node("Range", ["zero", "steps", "one"], ["ids"]),
           helper.make_node("Range", ["zero", "steps", "two"], ["even"]),
           helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
           helper.make_node("Add", ["x", "rows"], ["y"]),
           helper.make_node("Gather", ["table", "even"], ["every_other"], axis=0)]
  inits = [numpy_helper.from_array(table, "table")] + [numpy_helper.from_array(np.array(v, np.int64), name)
                                                       for name, v in (("zero", 0), ("one", 1), ("two", 2))]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", 4])],
                     [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "every_other")],
                     inits, opset=13)
  runner = OnnxRunner(model)
  reference = lambda feeds: {"y": feeds["x"] + table[:feeds["x"].shape[1]],
                             "every_other": table[0:feeds["x"].shape[1]:2]}
  counts = run_sizes(runner, lambda size: {"x": floats(*size, 4)}, [(2, 5), (3, 9), (2, 8), (4, 3)], reference)
  assert counts[1:] == [0, 0, 0] and len(runner.cache.graphs) == 1, counts

@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, 1), (0, -1)])
def test_trilu_over_a_symbolic_square(upper, k):
  """Trilu over (steps, steps) (a causal mask, as scaled_dot_product_attention(is_causal=True) exports it)."""
  model = make_model([helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", "steps"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(np.array(k, np.int64), "k")], opset=14)
  runner = OnnxRunner(model)
  pick = (lambda m: np.triu(m, k)) if upper else (lambda m: np.tril(m, k))
  counts = run_sizes(runner, lambda size: {"x": floats(size[0], size[1], size[1])}, [(2, 5), (3, 9), (2, 4)],
                     lambda feeds: {"y": pick(feeds["x"])})
  assert counts[1:] == [0, 0] and len(runner.cache.graphs) == 1, counts

@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_mean_over_a_symbolic_axis(keepdims):
  """ReduceMean over the steps (a pooled sequence): the sum divided by the length read at each call."""
  model = make_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=keepdims)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], opset=13)
  runner = OnnxRunner(model)
  counts = run_sizes(runner, lambda size: {"x": floats(*size, 3)}, [(2, 5), (3, 9), (2, 16), (3, 9)],
                     lambda feeds: {"y": feeds["x"].mean(1, keepdims=bool(keepdims))})
  assert counts[1:] == [0, 0, 0] and len(runner.cache.graphs) == 1, counts
