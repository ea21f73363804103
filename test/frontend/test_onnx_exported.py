"""Models exported by PyTorch's ONNX exporter (its graphs, not hand-built ones) run on kiln as on onnxruntime:
a small CNN with dynamic batch, height and width, a transformer block with dynamic batch and length, and an LSTM
carrying its state between calls."""
import io
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from kiln.frontend.onnx import OnnxRunner  # noqa: E402

def export(module, example_inputs: tuple, input_names, output_names, dynamic_axes) -> bytes:
  """The module as ONNX bytes (TorchScript exporter, opset 17)."""
  import warnings
  buffer = io.BytesIO()
  module.eval()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(module, example_inputs, buffer, dynamo=False, opset_version=17, input_names=input_names,
                      output_names=output_names, dynamic_axes=dynamic_axes)
  return buffer.getvalue()

def compare(model_bytes: bytes, feeds: dict, atol: float = 1e-4):
  expected = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, feeds)
  runner = OnnxRunner(model_bytes)
  outputs = runner(feeds)
  for name, reference in zip(runner.output_names, expected):
    actual = outputs[name].numpy()
    assert actual.shape == reference.shape, f"{name}: shape {actual.shape} != {reference.shape}"
    diff = np.abs(actual - reference).max(initial=0)
    assert diff <= atol, f"{name} {actual.shape}: worst difference {diff}"

class SqueezeExcite(torch.nn.Module):
  def __init__(self, channels):
    super().__init__()
    self.reduce, self.expand = torch.nn.Conv2d(channels, channels // 4, 1), torch.nn.Conv2d(channels // 4, channels, 1)
  def forward(self, x):
    scale = torch.sigmoid(self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True)))))
    return x * scale

class SmallCNN(torch.nn.Module):
  """Stem conv + BN + hardswish, a depthwise-separable residual block with squeeze-excite, max pool, head."""
  def __init__(self):
    super().__init__()
    self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
                                    torch.nn.Hardswish())
    self.block = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16),
                                     torch.nn.ReLU6(), SqueezeExcite(16), torch.nn.Conv2d(16, 16, 1))
    self.pool = torch.nn.MaxPool2d(3, stride=2, ceil_mode=True)
    self.head = torch.nn.Linear(16, 10)
  def forward(self, x):
    x = self.stem(x)
    x = self.pool(x + self.block(x))
    pooled = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1)
    return torch.nn.functional.log_softmax(self.head(pooled), -1)

def test_exported_cnn_with_dynamic_batch_height_and_width():
  torch.manual_seed(0)
  module = SmallCNN()
  for bn in (module.stem[1], module.block[1]):  # non-trivial running statistics
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
  model = export(module, (torch.randn(1, 3, 32, 32),), ["image"], ["logits"],
                 {"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}})
  rng = np.random.default_rng(0)
  for shape in [(1, 3, 32, 32), (2, 3, 45, 27)]:
    compare(model, {"image": rng.standard_normal(shape).astype(np.float32)})

class TransformerBlock(torch.nn.Module):
  """Pre-norm self-attention (heads split by view/transpose from the input's own sizes) and a GELU MLP."""
  def __init__(self, width=32, heads=4):
    super().__init__()
    self.heads = heads
    self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
    self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
    self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                   torch.nn.Linear(2 * width, width))
  def forward(self, x):
    batch, steps, width = x.shape
    q, k, v = self.qkv(self.norm1(x)).split(width, -1)
    q, k, v = (t.reshape(batch, steps, self.heads, -1).transpose(1, 2) for t in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5, -1)
    x = x + self.proj((weights @ v).transpose(1, 2).reshape(batch, steps, width))
    return x + self.mlp(self.norm2(x))

def test_exported_transformer_block():
  torch.manual_seed(1)
  model = export(TransformerBlock(), (torch.randn(2, 7, 32),), ["tokens"], ["encoded"],
                 {"tokens": {0: "batch", 1: "sequence"}, "encoded": {0: "batch", 1: "sequence"}})
  rng = np.random.default_rng(1)
  for shape in [(2, 7, 32), (1, 11, 32)]:
    compare(model, {"tokens": rng.standard_normal(shape).astype(np.float32)})

def test_exported_transformer_block_compiles_once_for_every_batch_and_length():
  """Its dims are symbolic (batch, sequence): the exporter's Shape -> Gather -> Concat -> Reshape chains stay
  expressions of the sizes, so other sizes of the range reuse the graph and its kernels (onnx_symbolic.py)."""
  from kiln.engine import realize
  torch.manual_seed(3)
  model = export(TransformerBlock(width=24, heads=3), (torch.randn(2, 5, 24),), ["tokens"], ["encoded"],
                 {"tokens": {0: "batch", 1: "sequence"}, "encoded": {0: "batch", 1: "sequence"}})
  session, runner = ort.InferenceSession(model, providers=["CPUExecutionProvider"]), OnnxRunner(model)
  rng, counts = np.random.default_rng(3), []
  for shape in [(2, 5, 24), (3, 9, 24), (2, 16, 24), (4, 3, 24)]:
    tokens = rng.standard_normal(shape).astype(np.float32)
    before = len(realize._runner_cache)
    encoded = runner({"tokens": tokens})["encoded"]
    counts.append(len(realize._runner_cache) - before)
    assert np.abs(encoded.numpy() - session.run(None, {"tokens": tokens})[0]).max() <= 1e-4
  assert counts[0] > 0 and counts[1:] == [0, 0, 0], counts

class StatefulLSTM(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lstm, self.out = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True), torch.nn.Linear(16, 4)
  def forward(self, x, h, c):
    y, (h, c) = self.lstm(x, (h, c))
    return self.out(y), h, c

def test_exported_lstm_carries_its_state_between_calls():
  torch.manual_seed(2)
  model = export(StatefulLSTM(), (torch.randn(1, 5, 8), torch.zeros(2, 1, 16), torch.zeros(2, 1, 16)),
                 ["x", "h", "c"], ["y", "h_out", "c_out"], {"x": {1: "steps"}, "y": {1: "steps"}})
  runner, session = OnnxRunner(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
  rng = np.random.default_rng(2)
  state = {"h": np.zeros((2, 1, 16), np.float32), "c": np.zeros((2, 1, 16), np.float32)}
  reference_state = dict(state)
  for steps in (5, 3, 6):  # chunks of one stream: each call starts from the previous call's state
    x = rng.standard_normal((1, steps, 8)).astype(np.float32)
    out = runner({"x": x, **state})
    expected = session.run(None, {"x": x, **reference_state})
    for name, reference in zip(("y", "h_out", "c_out"), expected):
      assert np.abs(out[name].numpy() - reference).max() <= 1e-4, name
    state = {"h": out["h_out"].numpy(), "c": out["c_out"].numpy()}
    reference_state = {"h": expected[1], "c": expected[2]}
