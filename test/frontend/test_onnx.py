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
