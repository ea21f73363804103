"""OnnxRunner on small models built with onnx.helper, compared with numpy (and onnxruntime where installed)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from kiln import Tensor  # noqa: E402
from kiln.frontend.onnx import OnnxRunner  # noqa: E402

def make_model(nodes, inputs, outputs, initializers=(), opset=19):
  graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

def load_test_data(folder, kind):
  """A node test's first data set: its input_*.pb or output_*.pb tensors, in order."""
  import glob
  files = sorted(glob.glob(f"{folder}/test_data_set_0/{kind}_*.pb"))
  return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]

def assert_close(actual, expected, atol=1e-5):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
  diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max(initial=0)
  assert diff <= atol, f"shape {actual.shape}: worst difference {diff}"

def mlp_model():
  """x (batch, 4) -> relu(x @ w + b) -> softmax, with a symbolic batch dim."""
  rng = np.random.default_rng(0)
  w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
  nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
           helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                     [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
  return model, w, b

def reference_mlp(x, w, b):
  h = np.maximum(x @ w + b, 0)
  e = np.exp(h - h.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

@pytest.mark.parametrize("batch", [1, 5])
def test_mlp_with_dynamic_batch(batch):
  model, w, b = mlp_model()
  runner = OnnxRunner(model)
  x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
  out = runner({"x": x})["y"]
  assert isinstance(out, Tensor)
  assert_close(out.numpy(), reference_mlp(x, w, b))

def test_runner_takes_bytes_path_and_tensor_inputs(tmp_path):
  model, w, b = mlp_model()
  path = tmp_path / "mlp.onnx"
  onnx.save(model, str(path))
  x = np.ones((2, 4), np.float32)
  for source in (str(path), path, model.SerializeToString()):
    assert_close(OnnxRunner(source)({"x": Tensor(x)})["y"].numpy(), reference_mlp(x, w, b))
  assert_close(OnnxRunner(model)({"x": x.tolist()})["y"].numpy(), reference_mlp(x, w, b))

def test_matches_onnxruntime_on_a_conv_net():
  ort = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(1)
  weight, bias = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  scale, shift = rng.uniform(0.5, 1.5, 4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  mean, var = rng.standard_normal(4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
           helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
           helper.make_node("HardSwish", ["n"], ["a"]),
           helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                            ceil_mode=1),
           helper.make_node("GlobalAveragePool", ["p"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
  inits = [numpy_helper.from_array(v, n) for v, n in
           [(weight, "w"), (bias, "b"), (scale, "scale"), (shift, "shift"), (mean, "mean"), (var, "var")]]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], inits)
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  runner = OnnxRunner(model)
  for shape in [(1, 3, 16, 16), (2, 3, 11, 9)]:
    x = rng.standard_normal(shape).astype(np.float32)
    assert_close(runner({"x": x})["y"].numpy(), session.run(None, {"x": x})[0], atol=1e-4)

def test_shape_ops_follow_the_input_shape():
  """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the target shape is computed from the input's dims."""
  nodes = [helper.make_node("Shape", ["x"], ["s"]),
           helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
           helper.make_node("Gather", ["s", "zero"], ["n"]),
           helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0], np.int64))),
           helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
           helper.make_node("Constant", [], ["rest"], value=numpy_helper.from_array(np.array([-1], np.int64))),
           helper.make_node("Concat", ["n1", "rest"], ["shape"], axis=0),
           helper.make_node("Reshape", ["x", "shape"], ["y"])]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])])
  runner = OnnxRunner(model)
  for batch in (1, 4):
    x = np.arange(batch * 6, dtype=np.float32).reshape(batch, 2, 3)
    assert_close(runner({"x": x})["y"].numpy(), x.reshape(batch, 6))

def test_unsupported_op_names_node_op_and_shapes():
  node = helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery")
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
  with pytest.raises(NotImplementedError, match=r"'mystery' \(NoSuchOp.*\(2, 3\).*not supported"):
    OnnxRunner(model)({"x": np.zeros((2, 3), np.float32)})

def test_unsupported_attribute_is_named():
  node = helper.make_node("Relu", ["x"], ["y"], name="r", bogus=1)
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
  with pytest.raises(NotImplementedError, match="attribute 'bogus'"):
    OnnxRunner(model)({"x": np.zeros(2, np.float32)})

def test_wrong_input_shape_and_missing_input_are_reported():
  model, _, _ = mlp_model()
  runner = OnnxRunner(model)
  with pytest.raises(ValueError, match=r"expected shape \('\?', 4\), got \(2, 5\)"):
    runner({"x": np.zeros((2, 5), np.float32)})
  with pytest.raises(KeyError, match="'x' is missing"):
    runner({})

def test_docs_list_every_supported_op():
  """docs/onnx.md's operator lists are the code's: regenerate with python -m kiln.frontend.onnx --ops."""
  import pathlib
  from kiln.frontend.onnx import ops_markdown, supported_ops
  text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "onnx.md").read_text()
  listed = text.split("<!-- ops -->\n", 1)[1].split("<!-- /ops -->", 1)[0]
  assert listed == ops_markdown(), "docs/onnx.md's operator list is stale: python -m kiln.frontend.onnx --ops"
  missing = [name for names in supported_ops().values() for name in names if f"`{name}`" not in listed]
  assert not missing, f"not in docs/onnx.md: {missing}"

def test_node_test_count_in_docs_matches_expected_failures():
  import pathlib, onnx.backend.test
  text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "onnx.md").read_text()
  failures = [line for line in (pathlib.Path(__file__).with_name("onnx_expected_failures.txt")).read_text().splitlines()
              if line.strip() and not line.startswith("#")]
  total = len(list((pathlib.Path(onnx.backend.test.__file__).parent / "data" / "node").iterdir()))
  assert f"{total - len(failures)} of the {total} node tests pass" in text

def test_if_and_loop_subgraphs_see_outer_names():
  """If picks a branch by a computed condition; Loop accumulates with a value from the enclosing graph."""
  then_graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["then_out"])], "then", [],
                                 [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [3])])
  else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["else_out"])], "else", [],
                                 [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [3])])
  body = helper.make_graph(
    [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
    "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
    [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
     helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])])
  nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
           helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.float32))),
           helper.make_node("Greater", ["total", "zero"], ["positive"]),
           helper.make_node("If", ["positive"], ["picked"], then_branch=then_graph, else_branch=else_graph),
           helper.make_node("Loop", ["trips", "", "x"], ["summed"], body=body)]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                             helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
                     [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [3]),
                      helper.make_tensor_value_info("summed", TensorProto.FLOAT, [3])])
  runner = OnnxRunner(model)
  for x in (np.array([1, 2, 3], np.float32), np.array([-1, -2, 0], np.float32)):
    out = runner({"x": x, "trips": np.array(4, np.int64)})
    assert_close(out["picked"].numpy(), 2 * x if x.sum() > 0 else -x)
    assert_close(out["summed"].numpy(), 5 * x)

def test_lstm_and_resize_match_onnxruntime():
  ort = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(2)
  hidden, features = 5, 3
  w = rng.standard_normal((2, 4 * hidden, features)).astype(np.float32)
  r = rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32)
  b = rng.standard_normal((2, 8 * hidden)).astype(np.float32)
  nodes = [helper.make_node("LSTM", ["x", "w", "r", "b", "lens"], ["y", "y_h", "y_c"], hidden_size=hidden,
                            direction="bidirectional"),
           helper.make_node("Resize", ["image", "", "scales"], ["resized"], mode="cubic",
                            coordinate_transformation_mode="half_pixel")]
  inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r"), numpy_helper.from_array(b, "b"),
           numpy_helper.from_array(np.array([1, 1, 1.5, 0.75], np.float32), "scales")]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, features]),
                             helper.make_tensor_value_info("lens", TensorProto.INT32, [2]),
                             helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 2, 6, 8])],
                     [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                      for n in ("y", "y_h", "y_c", "resized")], inits)
  feeds = {"x": rng.standard_normal((4, 2, features)).astype(np.float32), "lens": np.array([4, 2], np.int32),
           "image": rng.standard_normal((1, 2, 6, 8)).astype(np.float32)}
  expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
  out = OnnxRunner(model)(feeds)
  for name, reference in zip(("y", "y_h", "y_c", "resized"), expected):
    assert_close(out[name].numpy(), reference, atol=1e-4)

def test_function_body_op_runs():
  """Attention has no kiln implementation: it runs as the spec's function body."""
  rng = np.random.default_rng(3)
  q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
  node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
  model = make_model([node], [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in "qkv"],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8])], opset=23)
  scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + np.triu(np.full((4, 4), -np.inf), 1)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  expected = (weights / weights.sum(-1, keepdims=True)) @ v
  assert_close(OnnxRunner(model)({"q": q, "k": k, "v": v})["y"].numpy(), expected, atol=1e-5)

ATTENTION_REFERENCE_BUGS = ["test_attention_3d_gqa_causal", "test_attention_3d_with_past_and_present",
                            "test_attention_4d_gqa", "test_attention_4d_gqa_with_past_and_present"]

@pytest.mark.parametrize("name", ATTENTION_REFERENCE_BUGS)
def test_attention_matches_onnxruntime_where_the_node_tests_disagree(name):
  """3-d and grouped-query Attention: onnx 1.18's expected values come from a reference with known bugs
  (onnx/onnx#7118), so these node tests are expected failures; kiln must match onnxruntime on them instead."""
  import os, onnx.backend.test
  ort = pytest.importorskip("onnxruntime")
  folder = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "node", name)
  model = onnx.load(os.path.join(folder, "model.onnx"))
  arrays = load_test_data(folder, "input")
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  feeds = {info.name: array for info, array in zip(session.get_inputs(), arrays)}
  outputs = OnnxRunner(model)(feeds)
  for info, reference in zip(model.graph.output, session.run(None, feeds)):
    assert_close(outputs[info.name].numpy(), reference, atol=1e-5)

@pytest.mark.parametrize("elem_type", [17, 18, 19, 20, 23])
def test_narrow_float_codecs_agree_with_onnx(elem_type):
  """kiln's float8/float4 tables decode every code as onnx does, and round (saturating) to the same codes."""
  import warnings
  from onnx import numpy_helper as nh, subbyte
  from onnx import helper as onnx_helper
  from kiln.frontend import onnx_floats
  codes = np.arange(16 if elem_type == 23 else 256)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    reference = {17: lambda c: nh.float8e4m3_to_float32(c), 18: lambda c: nh.float8e4m3_to_float32(c, uz=True),
                 19: lambda c: nh.float8e5m2_to_float32(c), 20: lambda c: nh.float8e5m2_to_float32(c, fn=True, uz=True),
                 23: lambda c: nh.unpacked_float4e2m1_to_float32(c.astype(np.uint8))}[elem_type](codes)
    np.testing.assert_array_equal(onnx_floats.decode(codes, elem_type), reference)
    magnitudes = 10.0 ** np.arange(-5, 5).repeat(50)
    values = (np.random.default_rng(elem_type).standard_normal(500) * magnitudes).astype(np.float32)
    values = np.concatenate([values, np.array([0, -0.0, np.inf, -np.inf, np.nan], np.float32)])
    if elem_type == 23: expected = subbyte.float32_to_float4e2m1_unpacked(values)
    else:
      convert = onnx_helper._float32_to_float8e4m3 if elem_type in (17, 18) else onnx_helper._float32_to_float8e5m2
      flags = {17: {}, 18: {"uz": True}, 19: {}, 20: {"fn": True, "uz": True}}[elem_type]
      expected = np.array([convert(v, saturate=True, **flags) for v in values])
  np.testing.assert_array_equal(onnx_floats.encode(values, elem_type, saturate=True), expected)

def test_runner_under_tinyjit():
  """A model computing its Reshape target from Shape (folded on the host) replays under TinyJit with new inputs."""
  from kiln import TinyJit
  nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
           helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
           helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
           helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "target"], ["flat"]),
           helper.make_node("MatMul", ["flat", "w"], ["y"])]
  w = np.random.default_rng(4).standard_normal((6, 2)).astype(np.float32)
  constants = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64), "rest": np.array([-1], np.int64)}
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
                     [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(v, k) for k, v in constants.items()])
  runner = OnnxRunner(model)
  step = TinyJit(lambda x: runner({"x": x})["y"].realize())
  rng = np.random.default_rng(5)
  for _ in range(4):
    x = rng.standard_normal((3, 2, 3)).astype(np.float32)
    assert_close(step(Tensor(x)).numpy(), np.maximum(x, 0).reshape(3, 6) @ w)

def folding_node_tests():
  """The node tests made of one op that onnx_fold.py computes on the host, with only tensor inputs."""
  import os, onnx.backend.test
  from kiln.frontend.onnx_fold import FOLDERS
  root = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "node")
  names = []
  for name in sorted(os.listdir(root)):
    model = onnx.load(os.path.join(root, name, "model.onnx"))
    if len(model.graph.node) == 1 and model.graph.node[0].op_type in FOLDERS and all(
        i.type.WhichOneof("value") == "tensor_type" for i in model.graph.input):
      names.append(name)
  return names

@pytest.mark.parametrize("name", folding_node_tests())
def test_host_folding_matches_the_node_tests(name, monkeypatch):
  """With the inputs made initializers (known on the host), the op is computed by onnx_fold.py and must still give
  the node test's outputs."""
  import os, onnx.backend.test
  from kiln.frontend import onnx as kiln_onnx
  folder = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "node", name)
  model = onnx.load(os.path.join(folder, "model.onnx"))
  plain = {1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13}
  if any(v.type.tensor_type.elem_type not in plain for v in list(model.graph.input) + list(model.graph.output)):
    pytest.skip("a dtype kiln holds in another (bfloat16, float8, int4, strings)")
  arrays = load_test_data(folder, "input")
  model.graph.initializer.extend(numpy_helper.from_array(a, info.name) for info, a in zip(model.graph.input, arrays))
  calls = []
  real_fold = kiln_onnx.fold
  def counting_fold(*args):
    result = real_fold(*args)
    calls.append(result is not None)
    return result
  monkeypatch.setattr(kiln_onnx, "fold", counting_fold)
  outputs = OnnxRunner(model)({})
  expected = load_test_data(folder, "output")
  for info, reference in zip(model.graph.output, expected):
    actual = outputs[info.name].numpy()
    assert actual.dtype == reference.dtype and actual.shape == reference.shape, (actual.dtype, actual.shape)
    np.testing.assert_allclose(actual, reference, rtol=1e-6)
  if not any(calls): pytest.skip("an attribute or size onnx_fold.py leaves to the kiln op")

def test_ops_outside_the_node_tests_match_onnxruntime():
  """MaxRoiPool, LpNormalization and Multinomial (near-certain classes) have no node tests: onnxruntime is the check."""
  ort = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(6)
  nodes = [helper.make_node("MaxRoiPool", ["x", "rois"], ["pooled"], pooled_shape=[3, 2], spatial_scale=0.5),
           helper.make_node("LpNormalization", ["x"], ["l1"], axis=1, p=1),
           helper.make_node("LpNormalization", ["x"], ["l2"]),
           helper.make_node("Multinomial", ["logits"], ["samples"], sample_size=5)]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 10, 12]),
                             helper.make_tensor_value_info("rois", TensorProto.FLOAT, [3, 5]),
                             helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 4])],
                     [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("pooled", "l1", "l2")] +
                     [helper.make_tensor_value_info("samples", TensorProto.INT32, None)])
  model.ir_version = 9  # what this onnxruntime reads
  feeds = {"x": rng.standard_normal((2, 3, 10, 12)).astype(np.float32),
           "rois": np.array([[0, 2, 2, 12, 16], [1, 0, 4, 22, 18], [0, 6.8, 5.2, 8.2, 5.8]], np.float32),
           "logits": np.log(np.array([[1e-7, 1, 1e-7, 1e-7], [1, 1e-7, 1e-7, 1e-7]], np.float32))}
  expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
  out = OnnxRunner(model)(feeds)
  for name, reference in zip(("pooled", "l1", "l2", "samples"), expected):
    assert_close(out[name].numpy(), reference, atol=1e-6)
  assert out["samples"].numpy().dtype == np.int32

def test_an_input_with_an_initializer_can_be_replaced():
  node = helper.make_node("Add", ["x", "bias"], ["y"])
  bias = numpy_helper.from_array(np.array([1, 2], np.float32), "bias")
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                              helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [bias])
  runner = OnnxRunner(model)
  x = np.zeros(2, np.float32)
  assert_close(runner({"x": x})["y"].numpy(), [1, 2])
  assert_close(runner({"x": x, "bias": np.array([5, 6], np.float32)})["y"].numpy(), [5, 6])

def test_command_line_runs_a_model(tmp_path):
  import subprocess, sys, pathlib
  model, _, _ = mlp_model()
  path = tmp_path / "mlp.onnx"
  onnx.save(model, str(path))
  root = pathlib.Path(__file__).resolve().parents[2]
  result = subprocess.run([sys.executable, "-m", "kiln.frontend.onnx", str(path), "--dim", "3", "--benchmark", "2"],
                          capture_output=True, text=True, cwd=root, timeout=300)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("y ") and result.stdout.count(" ms") == 2, result.stdout

@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_opset_10_matches_onnxruntime(mode):
  """Resize-10 takes (X, scales) and samples as Upsample does."""
  ort = pytest.importorskip("onnxruntime")
  node = helper.make_node("Resize", ["x", "scales"], ["y"], mode=mode)
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 4])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")], opset=10)
  model.ir_version = 8
  x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
  expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  assert_close(OnnxRunner(model)({"x": x})["y"].numpy(), expected)

def test_negative_declared_dimension_is_symbolic():
  """Some exporters (paddle2onnx) write an unknown size as dim_value -1: any size is accepted there."""
  node = helper.make_node("Relu", ["x"], ["y"])
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
  assert_close(OnnxRunner(model)({"x": x})["y"].numpy(), np.maximum(x, 0))

@pytest.mark.parametrize("scales,nearest_mode", [([1, 1, 2, 2], "floor"), ([1, 1, 0.5, 0.5], "floor"),
                                                  ([1, 1, 1.5, 2.5], "round_prefer_floor")])
def test_nearest_resize_of_both_axes_matches_onnxruntime(scales, nearest_mode):
  """Nearest upsampling by whole factors (a repeat), downsampling (a strided slice) and other factors (a gather)
  on both spatial axes, as a text detector's FPN does."""
  ort = pytest.importorskip("onnxruntime")
  node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode=nearest_mode)
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 96, 6, 6])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(np.array(scales, np.float32), "scales")], opset=13)
  model.ir_version = 8
  x = np.random.default_rng(0).standard_normal((1, 96, 6, 6)).astype(np.float32)
  expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  assert_close(OnnxRunner(model)({"x": x})["y"].numpy(), expected)

def counting_builds(runner, monkeypatch) -> list:
  """Count the runner's graph walks (each call of run_graph on the top graph)."""
  walks = []
  original = runner.run_graph
  def run_graph(graph, *args, **kwargs):
    if graph is runner.graph: walks.append(1)
    return original(graph, *args, **kwargs)
  monkeypatch.setattr(runner, "run_graph", run_graph)
  return walks

def test_graph_is_built_once_per_input_signature(monkeypatch):
  """Calls with new values of the same shape reuse the graph, and so do other sizes of the symbolic batch dim (one
  graph for 2-16, test_onnx_symbolic.py); a batch of 1 builds one more; every result is right, and a result stays
  valid after later calls."""
  model, w, b = mlp_model()
  runner = OnnxRunner(model)
  walks = counting_builds(runner, monkeypatch)
  rng = np.random.default_rng(7)
  xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (2, 2, 2, 5, 2, 5, 1, 1)]
  results = [runner({"x": x})["y"] for x in xs]
  for x, y in zip(xs, results): assert_close(y.numpy(), reference_mlp(x, w, b))
  assert len(walks) == 2
  uncached = OnnxRunner(model, cache=False)
  walks = counting_builds(uncached, monkeypatch)
  for x in xs[:3]: assert_close(uncached({"x": x})["y"].numpy(), reference_mlp(x, w, b))
  assert len(walks) == 3

def test_cached_graph_takes_tensor_inputs_and_its_own_outputs():
  """A recurrent caller feeds the state output back in as a Tensor: the cached graph copies it in."""
  node = helper.make_node("Add", ["state", "x"], ["next"])
  model = make_model([node], [helper.make_tensor_value_info("state", TensorProto.FLOAT, [3]),
                              helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                     [helper.make_tensor_value_info("next", TensorProto.FLOAT, [3])])
  runner = OnnxRunner(model)
  state, history = np.zeros(3, np.float32), []
  for k in range(4):
    state = runner({"state": state, "x": np.full(3, k, np.float32)})["next"]
    history.append(state)
  assert [h.numpy().tolist() for h in history] == [[0] * 3, [1] * 3, [3] * 3, [6] * 3]
  assert len(runner.cache.graphs) == 1

def test_steering_input_values_join_the_signature():
  """An If on a small integer input: each value takes its own branch, each gets a graph of its own."""
  then_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["out"])], "then", [],
                                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
  else_graph = helper.make_graph([helper.make_node("Abs", ["x"], ["out"])], "else", [],
                                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
  nodes = [helper.make_node("Equal", ["mode", "one"], ["cond"]),
           helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                             helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(np.array(1, np.int64), "one")])
  runner = OnnxRunner(model)
  x = np.array([-2, 3], np.float32)
  for mode, expected in [(1, -x), (0, np.abs(x)), (1, -x), (0, np.abs(x))]:
    assert_close(runner({"x": x, "mode": np.array(mode, np.int64)})["y"].numpy(), expected)
  assert len(runner.cache.graphs) == 2

def test_value_dependent_graph_is_not_cached():
  """NonZero's output size depends on the input's values: such a signature runs uncached, and stays right."""
  model = make_model([helper.make_node("NonZero", ["x"], ["y"])],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                     [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
  runner = OnnxRunner(model)
  for x in ([0, 1, 0, 2], [3, 0, 0, 0], [1, 1, 1, 0]):
    x = np.array(x, np.float32)
    assert runner({"x": x})["y"].numpy().tolist() == [np.nonzero(x)[0].tolist()]
  assert list(runner.cache.graphs.values()) == [None]

def test_a_weight_assembled_from_constants_is_realized_once():
  """W reordered by Slice + Concat of an initializer (as PyTorch exports an LSTM's gates): computed once and kept
  (OnnxRunner._fold), so each call's kernels read it ready; an input given in place of the initializer is used."""
  rng = np.random.default_rng(8)
  w = rng.standard_normal((96, 64)).astype(np.float32)
  nodes = [helper.make_node("Slice", ["w", "zero", "half", "axis0"], ["top"]),
           helper.make_node("Slice", ["w", "half", "end", "axis0"], ["bottom"]),
           helper.make_node("Concat", ["bottom", "top"], ["swapped"], axis=0),
           helper.make_node("MatMul", ["x", "swapped"], ["y"])]
  inits = [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in
                                               (("zero", 0), ("half", 48), ("end", 96), ("axis0", 0))]
  model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 96]),
                             helper.make_tensor_value_info("w", TensorProto.FLOAT, [96, 64])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
  swap = lambda m: np.concatenate([m[48:], m[:48]])
  for cache in (True, False):
    runner = OnnxRunner(model, cache=cache)
    for k in range(3):
      x = rng.standard_normal((2, 96)).astype(np.float32)
      assert_close(runner({"x": x})["y"].numpy(), x @ swap(w), atol=1e-4)
    assert len(runner._folded) == 1
    other = rng.standard_normal((96, 64)).astype(np.float32)
    assert_close(runner({"x": x, "w": other})["y"].numpy(), x @ swap(other), atol=1e-4)

def test_an_output_that_is_an_input_is_not_overwritten():
  """Identity returns the input itself: that graph is not cached, so an earlier result keeps its values."""
  model = make_model([helper.make_node("Identity", ["x"], ["y"])],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  runner = OnnxRunner(model)
  first = runner({"x": np.array([1, 2], np.float32)})["y"]
  second = runner({"x": np.array([3, 4], np.float32)})["y"]
  assert first.numpy().tolist() == [1, 2] and second.numpy().tolist() == [3, 4]

@pytest.mark.parametrize("shape,kernel,attrs", [((1, 6, 5, 7), (2, 2), {}),
                                                ((2, 3, 4, 3), (3, 2), {"pads": [1, 0, 1, 1]}),
                                                ((1, 4, 5), (3,), {"output_padding": [2]}),
                                                ((1, 2, 3, 2, 2), (2, 2, 2), {})])
def test_conv_transpose_with_stride_equal_to_kernel_matches_onnxruntime(shape, kernel, attrs):
  """The stride == kernel path (a 1x1 conv, then each pixel's patch laid out), with bias, pads, output padding, 1-d
  and 3-d."""
  _check_conv_node_against_onnxruntime("ConvTranspose", shape, (shape[1], 5, *kernel), 5, kernel, attrs, seed=8)

def _check_conv_node_against_onnxruntime(op: str, shape, w_shape, bias: int, strides, attrs: dict, seed: int) -> None:
  """One `op` node (x, random weight and bias as initializers) run by kiln and by onnxruntime on a random x."""
  ort = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(seed)
  w = rng.standard_normal(w_shape).astype(np.float32)
  b = rng.standard_normal(bias).astype(np.float32)
  node = helper.make_node(op, ["x", "w", "b"], ["y"], strides=list(strides), **attrs)
  model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
  x = rng.standard_normal(shape).astype(np.float32)
  expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  assert_close(OnnxRunner(model)({"x": x})["y"].numpy(), expected, atol=1e-4)

@pytest.mark.parametrize("shape,kernel,strides,attrs", [
  ((1, 1, 1, 1000), (1, 256), (1, 256), {}), ((1, 1, 1, 1000), (1, 256), (1, 64), {}),
  ((2, 3, 9, 8), (3, 2), (3, 2), {"pads": [0, 1, 1, 0]}), ((2, 3, 11, 9), (4, 3), (2, 1), {"pads": [1, 1, 2, 0]}),
  ((1, 2, 10), (4,), (4,), {"auto_pad": "SAME_UPPER"}), ((1, 2, 5, 4, 6), (2, 2, 4), (2, 2, 2), {})])
def test_conv_whose_kernel_is_whole_strides_matches_onnxruntime(shape, kernel, strides, attrs):
  """The space-to-depth path (stride-sized blocks into channels, then a stride-1 conv): a strided filter bank as
  Basic Pitch's constant-Q transform has (stride = kernel, kernel / 4), pads, auto_pad, a remainder the windows
  leave out, 1-d and 3-d."""
  _check_conv_node_against_onnxruntime("Conv", shape, (4, shape[1], *kernel), 4, strides, attrs, seed=9)

def test_random_graph_is_not_cached():
  """Each call draws new numbers, as without the cache: a graph drawing random numbers is not kept."""
  model = make_model([helper.make_node("RandomNormalLike", ["x"], ["y"])],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  runner = OnnxRunner(model)
  draws = [runner({"x": np.zeros(64, np.float32)})["y"].numpy() for _ in range(4)]
  assert all(np.abs(a - b).max() > 0 for a, b in zip(draws, draws[1:]))
  assert list(runner.cache.graphs.values()) == [None]
