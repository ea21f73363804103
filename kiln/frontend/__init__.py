"""Model-format frontends: onnx.py runs ONNX graphs as kiln Tensor ops (needs the optional onnx package)."""
