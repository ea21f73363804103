"""Chat templates: render a conversation the way the model's own Jinja template (`tokenizer.chat_template`) would,
without a Jinja engine. The template text picks one of three formats:

- ChatML (the template mentions `<|im_start|>`; SmolLM2, Qwen2): `<|im_start|>{role}\\n{content}<|im_end|>\\n` per
  message. When the template writes a default system prompt for conversations that lack one (SmolLM2's "You are a
  helpful AI assistant named SmolLM, trained by Hugging Face"), that prompt is read from the template text and added
  before the first message if it is not a system message. Generation prompt: `<|im_start|>assistant\\n`.
- Llama 3 (the template mentions `<|start_header_id|>`): the BOS text, then
  `<|start_header_id|>{role}<|end_header_id|>\\n\\n{content stripped}<|eot_id|>` per message; generation prompt
  `<|start_header_id|>assistant<|end_header_id|>\\n\\n`. Llama 3.1+ templates (they write "Cutting Knowledge Date")
  always open with a system turn holding that date preamble and the system prompt, if any.
- Anything else (or no template): a plain fallback, `{role}: {content}\\n\\n` per message and `assistant: ` as the
  generation prompt.

>>> render_chat([{"role": "user", "content": "Hi"}], ChatFormat("chatml"))
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""
from __future__ import annotations
import dataclasses
import re
from typing import Any

ROLES = ("system", "user", "assistant")
# Llama 3.1's template fills these in when the caller passes no date; transformers and llama.cpp leave them as is.
LLAMA31_PREAMBLE = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """Which format a template renders: kind is 'chatml', 'llama3' or 'plain'."""
  kind: str
  default_system: str | None = None  # ChatML: the system prompt the template adds when the first message isn't one
  bos_text: str = ""                 # Llama 3: the BOS token's text, written before the first message
  llama31_preamble: bool = False     # Llama 3.1+: the system turn with the knowledge-date preamble is always there

def _unescape_jinja_string(text: str) -> str:
  """The value of the inside of a Jinja string literal: backslash escapes like \\n become their characters."""
  escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
  return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(0)), text)

def _chatml_default_system(template: str) -> str | None:
  """The system prompt a ChatML template writes when the conversation doesn't start with a system message."""
  if not re.search(r"""!=\s*['"]system['"]""", template): return None
  match = re.search(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", template, re.DOTALL)
  if match is None or "{{" in match.group(1) or "{%" in match.group(1): return None
  return _unescape_jinja_string(match.group(1))

def detect_chat_format(template: str | None, bos_text: str = "") -> ChatFormat:
  """The ChatFormat for a `tokenizer.chat_template` text (None: the plain fallback)."""
  if not isinstance(template, str): return ChatFormat("plain")
  if "<|im_start|>" in template: return ChatFormat("chatml", default_system=_chatml_default_system(template))
  if "<|start_header_id|>" in template:
    return ChatFormat("llama3", bos_text=bos_text, llama31_preamble="Cutting Knowledge Date" in template)
  return ChatFormat("plain")

def validate_messages(messages: Any) -> list[dict[str, str]]:
  """Check a conversation: a non-empty list of dicts, each with a str 'role' (system/user/assistant) and a str
  'content'. Raises ValueError naming the bad message."""
  if not isinstance(messages, (list, tuple)) or not messages:
    raise ValueError(f"chat template: messages must be a non-empty list of {{'role', 'content'}} dicts, got "
                     f"{type(messages).__name__} {messages!r:.80}")
  for index, message in enumerate(messages):
    if not isinstance(message, dict):
      raise ValueError(f"chat template: message {index} must be a dict, got {type(message).__name__} {message!r:.80}")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or role not in ROLES:
      raise ValueError(f"chat template: message {index} has role {role!r}; expected one of {', '.join(ROLES)}")
    if not isinstance(content, str):
      raise ValueError(f"chat template: message {index} ({role}) has content of type {type(content).__name__}; "
                       "expected str")
  return list(messages)

def _render_chatml(messages: list[dict[str, str]], fmt: ChatFormat, add_generation_prompt: bool) -> str:
  parts = []
  if fmt.default_system is not None and messages[0]["role"] != "system":
    parts.append(f"<|im_start|>system\n{fmt.default_system}<|im_end|>\n")
  parts += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
  if add_generation_prompt: parts.append("<|im_start|>assistant\n")
  return "".join(parts)

def _llama3_turn(role: str, content: str) -> str:
  return f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"

def _render_llama3(messages: list[dict[str, str]], fmt: ChatFormat, add_generation_prompt: bool) -> str:
  parts = [fmt.bos_text]
  if fmt.llama31_preamble:
    system = messages[0]["content"].strip() if messages[0]["role"] == "system" else ""
    if messages[0]["role"] == "system": messages = messages[1:]
    parts.append(_llama3_turn("system", LLAMA31_PREAMBLE + system))
  parts += [_llama3_turn(m["role"], m["content"].strip()) for m in messages]
  if add_generation_prompt: parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
  return "".join(parts)

def _render_plain(messages: list[dict[str, str]], fmt: ChatFormat, add_generation_prompt: bool) -> str:
  prompt = "assistant: " if add_generation_prompt else ""
  return "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + prompt

_RENDERERS = {"chatml": _render_chatml, "llama3": _render_llama3, "plain": _render_plain}

def render_chat(messages: list[dict[str, str]], fmt: ChatFormat, *, add_generation_prompt: bool = True) -> str:
  """The prompt text for a conversation in format `fmt` (messages are validated first)."""
  return _RENDERERS[fmt.kind](validate_messages(messages), fmt, add_generation_prompt)
