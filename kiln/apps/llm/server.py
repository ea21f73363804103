"""An OpenAI-compatible HTTP server for a ChatEngine, on the standard library.

`POST /v1/chat/completions` (plain JSON or Server-Sent Events with `"stream": true`) and `GET /v1/models`. Requests
are served one at a time through a lock around the engine (there is one KV cache); the server stays up after bad
requests, which get a 4xx with an OpenAI-style `{"error": {"message", "type", "param", "code"}}` body.
"""
from __future__ import annotations
import json, sys, threading, time, uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from kiln.apps.llm.engine import ChatEngine, Reply

@dataclass(frozen=True)
class SamplingDefaults:
  """Settings for requests that leave them out (the CLI's flags)."""
  temperature: float = 0.8
  top_k: int = 40
  top_p: float = 0.95
  max_tokens: int | None = 1024

class RequestError(ValueError):
  """A bad request: becomes an HTTP 4xx with an OpenAI-style error body."""
  def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None,
               error_type: str = "invalid_request_error"):
    super().__init__(message)
    self.param, self.status, self.code, self.error_type = param, status, code, error_type

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")

def _message_text(content: Any, index: int) -> str:
  """A message's content as text: a string, or a list of {"type": "text", "text": ...} parts (joined)."""
  if isinstance(content, str): return content
  if content is None: return ""
  if isinstance(content, list):
    texts = []
    for part in content:
      if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise RequestError(f"messages[{index}].content: only text parts are supported, got {json.dumps(part)[:80]}",
                           param=f"messages[{index}].content")
      texts.append(part["text"])
    return "".join(texts)
  raise RequestError(f"messages[{index}].content must be a string or a list of text parts, "
                     f"got {type(content).__name__}", param=f"messages[{index}].content")

def parse_messages(value: Any) -> list[dict[str, str]]:
  """Validate the request's `messages` into [{"role", "content"}] with text content.

  >>> parse_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
  [{'role': 'user', 'content': 'hi'}]
  """
  if not isinstance(value, list) or not value:
    raise RequestError("messages must be a non-empty array of {role, content} objects", param="messages")
  messages = []
  for index, message in enumerate(value):
    if not isinstance(message, dict):
      raise RequestError(f"messages[{index}] must be an object, got {type(message).__name__}", param="messages")
    role = message.get("role")
    if role not in MESSAGE_ROLES:
      raise RequestError(f"messages[{index}].role must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}",
                         param=f"messages[{index}].role")
    messages.append({"role": "system" if role == "developer" else role,
                     "content": _message_text(message.get("content"), index)})
  return messages

FIELD_KINDS: dict[str, tuple[type, ...]] = {"number": (int, float), "integer": (int,), "boolean": (bool,),
                                            "string": (str,), "object": (dict,)}

def _field(body: dict, name: str, kind: str, default: Any) -> Any:
  """body[name] checked to be a JSON `kind` (null or absent -> default); true/false never pass as numbers."""
  value = body.get(name)
  if value is None: return default
  if (isinstance(value, bool) and kind != "boolean") or not isinstance(value, FIELD_KINDS[kind]):
    raise RequestError(f"{name} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {json.dumps(value)[:40]}",
                       param=name)
  return value

@dataclass(frozen=True)
class CompletionRequest:
  """The fields of a /v1/chat/completions request that the server acts on, validated."""
  messages: list[dict[str, str]]
  temperature: float
  top_k: int
  top_p: float
  max_tokens: int | None
  seed: int | None
  stream: bool
  include_usage: bool

def parse_request(body: Any, defaults: SamplingDefaults) -> CompletionRequest:
  """Validate a decoded JSON request body; RequestError names the offending field."""
  if not isinstance(body, dict):
    raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
  _field(body, "model", "string", None)   # any name is accepted: there is one model
  if _field(body, "n", "integer", 1) != 1: raise RequestError("n: only one choice per request is supported", param="n")
  temperature = _field(body, "temperature", "number", defaults.temperature)
  if not 0 <= temperature <= 2: raise RequestError(f"temperature must be in [0, 2], got {temperature}", "temperature")
  top_p = _field(body, "top_p", "number", defaults.top_p)
  if not 0 < top_p <= 1: raise RequestError(f"top_p must be in (0, 1], got {top_p}", param="top_p")
  top_k = _field(body, "top_k", "integer", defaults.top_k)
  if top_k < 0: raise RequestError(f"top_k must be >= 0, got {top_k}", param="top_k")
  max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
  max_tokens = _field(body, max_name, "integer", defaults.max_tokens)
  if max_tokens is not None and max_tokens < 1:
    raise RequestError(f"{max_name} must be >= 1, got {max_tokens}", param=max_name)
  stream_options = _field(body, "stream_options", "object", {})
  return CompletionRequest(messages=parse_messages(body.get("messages")), temperature=float(temperature),
                           top_k=top_k, top_p=float(top_p), max_tokens=max_tokens,
                           seed=_field(body, "seed", "integer", None), stream=_field(body, "stream", "boolean", False),
                           include_usage=bool(stream_options.get("include_usage", False)))

def usage(reply: Reply) -> dict[str, int]:
  """The OpenAI `usage` object of a finished reply."""
  return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
          "total_tokens": reply.prompt_tokens + reply.completion_tokens}

class ChatServer(ThreadingHTTPServer):
  """A ThreadingHTTPServer holding the engine, its lock and the default sampling settings."""
  daemon_threads = True
  def __init__(self, address: tuple[str, int], engine: ChatEngine, defaults: SamplingDefaults, quiet: bool = False):
    super().__init__(address, ChatRequestHandler)
    self.engine, self.defaults, self.quiet = engine, defaults, quiet
    self.engine_lock = threading.Lock()
    self.created = int(time.time())

class ChatRequestHandler(BaseHTTPRequestHandler):
  """Routes /v1/models and /v1/chat/completions; every other path is a 404."""
  server: ChatServer
  protocol_version = "HTTP/1.1"   # keep-alive for JSON responses; streams close the connection when done
  server_version = "kiln-llm"

  def log_message(self, format: str, *args: Any) -> None:   # noqa: A002 (the base class's signature)
    if not self.server.quiet: super().log_message(format, *args)

  def send_json(self, status: int, payload: dict) -> None:
    """A complete JSON response with a Content-Length."""
    data = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def send_error_json(self, error: RequestError) -> None:
    """An OpenAI-style error body."""
    self.send_json(error.status, {"error": {"message": str(error), "type": error.error_type, "param": error.param,
                                            "code": error.code}})

  def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
    path = self.path.split("?")[0].rstrip("/")
    name = self.server.engine.name
    model = {"id": name, "object": "model", "created": self.server.created, "owned_by": "kiln"}
    if path == "/v1/models": self.send_json(200, {"object": "list", "data": [model]})
    elif path == f"/v1/models/{name}": self.send_json(200, model)
    elif path.startswith("/v1/models/"):
      self.send_error_json(RequestError(f"model {path[len('/v1/models/'):]!r} does not exist; this server has {name!r}",
                                        status=404, code="model_not_found"))
    elif path == "/v1/chat/completions":
      self.send_error_json(RequestError("use POST for /v1/chat/completions", status=405))
    else: self.send_error_json(RequestError(f"unknown path {path!r}", status=404, code="unknown_url"))

  def do_POST(self) -> None:  # noqa: N802
    path = self.path.split("?")[0].rstrip("/")
    body = self.read_body()   # read it even for a 404, so a keep-alive connection stays in step
    if path != "/v1/chat/completions":
      self.send_error_json(RequestError(f"unknown path {path!r}", status=404, code="unknown_url"))
      return
    try:
      if body is None: raise RequestError("the request needs a JSON body with a Content-Length")
      try: payload = json.loads(body)
      except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"malformed JSON in the request body: {error}") from None
      request = parse_request(payload, self.server.defaults)
    except RequestError as error:
      self.send_error_json(error)
      return
    with self.server.engine_lock:
      try:
        reply = self.server.engine.chat(request.messages, temperature=request.temperature, top_k=request.top_k,
                                        top_p=request.top_p, seed=request.seed, max_tokens=request.max_tokens)
      except (ValueError, TypeError) as error:   # e.g. the prompt does not fit the context
        code = "context_length_exceeded" if "does not fit the context" in str(error) else None
        self.send_error_json(RequestError(str(error), param="messages", code=code))
        return
      if request.stream: self.stream_reply(reply, request.include_usage)
      else:
        try: text = "".join(reply)
        except Exception as error:   # a failure inside the model: report it and stay up
          self.log_error("generation failed: %r", error)
          self.send_error_json(RequestError(f"generation failed: {error}", status=500, error_type="server_error"))
          return
        self.send_reply(reply, text)

  def read_body(self) -> bytes | None:
    """The request body by Content-Length (None without one)."""
    length = self.headers.get("Content-Length")
    if length is None or not length.isdigit():
      self.close_connection = True
      return None
    return self.rfile.read(int(length))

  def completion_header(self) -> dict[str, Any]:
    """The fields every completion object and chunk of one request shares."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": self.server.engine.name,
            "system_fingerprint": "kiln"}

  def send_reply(self, reply: Reply, text: str) -> None:
    """Send a finished reply as one `chat.completion` object."""
    self.send_json(200, {**self.completion_header(), "object": "chat.completion",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                                      "logprobs": None, "finish_reason": reply.finish_reason}],
                         "usage": usage(reply)})

  def stream_reply(self, reply: Reply, include_usage: bool) -> None:
    """Send the reply as Server-Sent Events of `chat.completion.chunk` objects, then `data: [DONE]`."""
    header = {**self.completion_header(), "object": "chat.completion.chunk"}
    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
      return {**header, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.send_header("Connection", "close")   # no Content-Length: the end of the connection ends the stream
    self.end_headers()
    self.close_connection = True
    try:
      self.send_event(chunk({"role": "assistant", "content": ""}))
      for text in reply: self.send_event(chunk({"content": text}))
      self.send_event(chunk({}, reply.finish_reason))
      if include_usage: self.send_event({**header, "choices": [], "usage": usage(reply)})
      self.wfile.write(b"data: [DONE]\n\n")
      self.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
      if not self.server.quiet: print("client disconnected; reply stopped", file=sys.stderr)
    finally:
      reply.close()   # stops generating at once when the client went away; the engine's cache stays consistent

  def send_event(self, payload: dict) -> None:
    """One Server-Sent Event carrying a JSON payload."""
    self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
    self.wfile.flush()

def make_server(engine: ChatEngine, host: str = "127.0.0.1", port: int = 8000,
                defaults: SamplingDefaults = SamplingDefaults(), quiet: bool = False) -> ChatServer:
  """A bound (not yet serving) server; port 0 picks a free port (`server.server_address[1]`)."""
  return ChatServer((host, port), engine, defaults, quiet)

def serve(engine: ChatEngine, host: str = "127.0.0.1", port: int = 8000,
          defaults: SamplingDefaults = SamplingDefaults()) -> None:
  """Serve until Ctrl-C."""
  server = make_server(engine, host, port, defaults)
  bound_host, bound_port = server.server_address[:2]
  print(f"kiln.apps.llm: serving {engine.name} at http://{bound_host}:{bound_port}/v1 (Ctrl-C stops)", file=sys.stderr)
  try: server.serve_forever()
  except KeyboardInterrupt: pass
  finally: server.server_close()
