"""Applications built on kiln: `python -m kiln.apps.llm` chats with a GGUF model."""
