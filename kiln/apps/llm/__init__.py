"""Chat with a Llama-family GGUF model: tokenizer, quantized transformer, sampling, CLI and OpenAI-style server.

`python -m kiln.apps.llm` (docs/llm.md).
"""
