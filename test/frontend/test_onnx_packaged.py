"""Real models shipped inside PyPI packages run on kiln as on onnxruntime (1e-4): PP-OCRv4's text detector (a CNN
with dynamic height and width), its SVTR text recognizer (attention over a dynamic width) and its direction
classifier (rapidocr-onnxruntime), Silero VAD (an LSTM voice model whose state carries from call to call; silero-vad)
and Basic Pitch (an audio CNN from raw samples; basic-pitch). Each test skips when its package is not installed; the
packages are found without importing them (`pip install --no-deps` is enough: their own dependencies are not needed).
"""
from __future__ import annotations
import importlib.util, os
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from kiln.frontend.onnx import OnnxRunner  # noqa: E402

def packaged_model(package: str, relative: str) -> str:
  """The path of a model file inside an installed package (the test skips when the package or file is absent)."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations: pytest.skip(f"{package} is not installed")
  path = os.path.join(spec.submodule_search_locations[0], relative)
  if not os.path.exists(path): pytest.skip(f"{package} has no {relative}")
  return path

def assert_matches(runner: OnnxRunner, session, feeds: dict, atol: float = 1e-4) -> list[np.ndarray]:
  """Run both on `feeds`; every output agrees in shape and within atol. kiln's outputs, in order."""
  expected = session.run(None, feeds)
  outputs = runner(feeds)
  actual = [outputs[name].numpy() for name in runner.output_names]
  for name, a, e in zip(runner.output_names, actual, expected):
    assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
    diff = np.abs(a.astype(np.float64) - e).max(initial=0)
    assert diff <= atol, f"{name} {a.shape}: worst difference {diff}"
  return actual

def both(path: str):
  return OnnxRunner(path), ort.InferenceSession(path, providers=["CPUExecutionProvider"])

RAPIDOCR = "rapidocr_onnxruntime"

def test_text_detector_with_dynamic_height_and_width():
  """PP-OCRv4 det (paddle2onnx, opset 12): MobileNetV3-style backbone, FPN with nearest upsampling and a
  ConvTranspose head; the probability map follows the image's own size. Sizes in multiples of 32 (what its FPN
  needs) share one graph and one compile (onnx_cache.py's stepped sizes)."""
  from kiln.engine import realize
  runner, session = both(packaged_model(RAPIDOCR, "models/ch_PP-OCRv4_det_infer.onnx"))
  rng, counts = np.random.default_rng(0), []
  # the first size three times more: its kept graph is captured, then replayed on new images (onnx_cache.py)
  for shape in [(1, 3, 64, 96), (1, 3, 96, 64), (1, 3, 128, 96)] + [(1, 3, 64, 96)] * 3:
    before = len(realize._runner_cache)
    (probability,) = assert_matches(runner, session, {"x": rng.random(shape, np.float32)})
    counts.append(len(realize._runner_cache) - before)
    assert probability.shape == (1, 1) + shape[2:]
  assert len(runner.cache.graphs) == 1 and counts[0] > 0 and not any(counts[1:]), counts

def test_attention_text_recognizer_with_dynamic_width():
  """PP-OCRv4 rec: a conv backbone, then SVTR's multi-head self-attention over the line's columns, and a CTC
  softmax per column (6625 characters); a wider line has more columns."""
  runner, session = both(packaged_model(RAPIDOCR, "models/ch_PP-OCRv4_rec_infer.onnx"))
  rng = np.random.default_rng(1)
  widths = []
  for shape in [(1, 3, 48, 160), (2, 3, 48, 96)]:
    (probabilities,) = assert_matches(runner, session, {"x": rng.random(shape, np.float32)})
    np.testing.assert_allclose(probabilities.sum(-1), 1, atol=1e-4)
    widths.append(probabilities.shape[1])
  assert widths[0] > widths[1]

def test_text_direction_classifier():
  """The PP-OCR mobile v2 direction classifier (a declared batch of -1) on batches of two, three and five lines:
  the batch is symbolic, so the later batches compile no kernel (onnx_symbolic.py)."""
  from kiln.engine import realize
  runner, session = both(packaged_model(RAPIDOCR, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"))
  rng, counts = np.random.default_rng(2), []
  for batch in (2, 3, 5):
    before = len(realize._runner_cache)
    (scores,) = assert_matches(runner, session, {"x": rng.random((batch, 3, 48, 192), np.float32)})
    counts.append(len(realize._runner_cache) - before)
    assert scores.shape == (batch, 2)
  assert counts[1:] == [0, 0], counts

def test_lstm_voice_activity_detector_carries_its_state():
  """Silero VAD v6: an `If` on the sample rate picks the 16 kHz or 8 kHz subgraph (STFT as a conv, a conv encoder,
  an LSTM cell); the LSTM state one call returns is the next call's input, as a streaming caller does."""
  runner, session = both(packaged_model("silero_vad", "data/silero_vad.onnx"))
  rng = np.random.default_rng(3)
  t = np.arange(512 * 4) / 16000
  voice = (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
  state = np.zeros((2, 1, 128), np.float32)
  states = []
  for k in range(4):
    chunk = voice[k * 512:(k + 1) * 512] + 0.01 * rng.standard_normal(512).astype(np.float32)
    feeds = {"input": chunk[None], "state": state, "sr": np.array(16000, np.int64)}
    probability, state = assert_matches(runner, session, feeds)
    assert probability.shape == (1, 1) and 0 <= probability.item() <= 1
    states.append(state)
  assert np.abs(states[-1] - states[0]).max() > 1e-3   # the state does change from call to call
  feeds = {"input": rng.standard_normal((1, 256)).astype(np.float32) * 0.1, "state": state,
           "sr": np.array(8000, np.int64)}
  assert_matches(runner, session, feeds)

def test_audio_cnn_pitch_model():
  """Basic Pitch (tf2onnx, opset 15): a constant-Q transform done with convolutions on raw samples (2 s at 22050 Hz,
  a dynamic batch), log scaling and harmonic stacking, then a small CNN giving note, onset and contour maps. The
  input has some noise: on pure tones most constant-Q bins are near zero, where the log makes the model so
  ill-conditioned that onnxruntime with and without its graph optimizations differ by 9e-4."""
  runner, session = both(packaged_model("basic_pitch", "saved_models/icassp_2022/nmp.onnx"))
  t = np.arange(43844) / 22050
  noise = 0.05 * np.random.default_rng(4).standard_normal(t.size)
  audio = (0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 660 * t) + noise).astype(np.float32)
  outputs = assert_matches(runner, session, {"serving_default_input_2:0": audio[None, :, None]})
  assert all(out.shape[:2] == (1, 172) for out in outputs)
