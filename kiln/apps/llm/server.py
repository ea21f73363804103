"""An OpenAI-compatible HTTP server for a ChatEngine, on the standard library.

`POST /v1/chat/completions` (plain JSON or Server-Sent Events with `"stream": true`) and `GET /v1/models`. Requests
are served one at a time through a lock around the engine (there is one KV cache), held only while a reply is
generated; a reply stops as soon as its client is gone. The server stays up after bad requests: every error, its
own or http.server's, is a 4xx/5xx with an OpenAI-style `{"error": {"message", "type", "param", "code"}}` body.
Bodies over `max_body` bytes are refused before they are read (413), and a request that is not received within
`read_timeout` seconds of its first byte gets a 408, so no client holds a handler thread for long.
"""
from __future__ import annotations
import io, json, math, re, select, socket, sys, threading, time, uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from kiln.apps.llm.engine import ChatEngine, Reply

DEFAULT_MAX_BODY = 16 * 2**20    # bytes; a chat request is text, and the context holds a few thousand tokens
DEFAULT_READ_TIMEOUT = 30.0      # seconds to receive a whole request (and the wait for a keep-alive's next one)

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
  seed = _field(body, "seed", "integer", None)
  if seed is not None and seed < 0: raise RequestError(f"seed must be >= 0, got {seed}", param="seed")
  stream_options = _field(body, "stream_options", "object", {})
  include_usage = stream_options.get("include_usage", False)
  if not isinstance(include_usage, bool):
    raise RequestError(f"stream_options.include_usage must be a boolean, got {json.dumps(include_usage)[:40]}",
                       param="stream_options.include_usage")
  return CompletionRequest(messages=parse_messages(body.get("messages")), temperature=float(temperature),
                           top_k=top_k, top_p=float(top_p), max_tokens=max_tokens, seed=seed,
                           stream=_field(body, "stream", "boolean", False), include_usage=include_usage)

def usage(reply: Reply) -> dict[str, int]:
  """The OpenAI `usage` object of a finished reply."""
  return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
          "total_tokens": reply.prompt_tokens + reply.completion_tokens}

class ChatServer(ThreadingHTTPServer):
  """A ThreadingHTTPServer holding the engine, its lock, the default sampling settings and the request limits."""
  daemon_threads = True
  request_queue_size = 64   # socketserver's 5 makes a burst of clients wait for TCP retransmits (a second or more)
  def __init__(self, address: tuple[str, int], engine: ChatEngine, defaults: SamplingDefaults, quiet: bool = False,
               max_body: int = DEFAULT_MAX_BODY, read_timeout: float = DEFAULT_READ_TIMEOUT):
    check_limits(max_body, read_timeout)
    super().__init__(address, ChatRequestHandler)
    self.engine, self.defaults, self.quiet = engine, defaults, quiet
    self.max_body, self.read_timeout = max_body, read_timeout
    self.engine_lock = threading.Lock()
    self.created = int(time.time())

  def handle_error(self, request: Any, client_address: Any) -> None:
    """A client that hung up or stopped reading is not the server's error: one line, not a traceback."""
    error = sys.exc_info()[1]
    if isinstance(error, (ConnectionError, TimeoutError)):
      if not self.quiet: print(f"{client_address[0]}: connection lost ({error})", file=sys.stderr)
    else: super().handle_error(request, client_address)

def check_limits(max_body: int, read_timeout: float) -> None:
  """ValueError naming the server limit that is out of range."""
  if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
    raise ValueError(f"max_body must be an integer >= 1 (bytes), got {max_body!r}")
  if isinstance(read_timeout, bool) or not isinstance(read_timeout, (int, float)) or \
     not (math.isfinite(read_timeout) and read_timeout > 0):
    raise ValueError(f"read_timeout must be a finite number of seconds > 0, got {read_timeout!r}")

class ReadTimeout(Exception):
  """A request was not received within the read timeout. Not a TimeoutError: http.server would drop the connection
  silently on one, and the client should get a 408."""

class DeadlineReader(io.RawIOBase):
  """A connection's input where every read waits at most until the current request's deadline.

  A per-read socket timeout alone lets a client that sends a byte now and then hold a thread forever; here the whole
  request (line, headers and body) must arrive within `timeout` seconds of its first byte, and an idle keep-alive
  connection waits at most `timeout` seconds for that first byte."""
  def __init__(self, sock: socket.socket, timeout: float):
    super().__init__()
    self.sock, self.timeout = sock, timeout
    self.started = False   # whether a byte of the current request has arrived
    self.deadline = time.monotonic() + timeout
  def readable(self) -> bool: return True
  def next_request(self) -> None:
    """Start waiting for the next request."""
    self.started, self.deadline = False, time.monotonic() + self.timeout
  def readinto(self, buffer: Any) -> int:
    late = ReadTimeout(f"the request was not received within {self.timeout:g} s")
    remaining = self.deadline - time.monotonic()
    if remaining <= 0: raise late
    self.sock.settimeout(remaining)
    try: count = self.sock.recv_into(buffer)
    except TimeoutError: raise late from None
    finally: self.sock.settimeout(self.timeout)   # writes get the same bound: a client that stops reading is dropped
    if count and not self.started: self.started, self.deadline = True, time.monotonic() + self.timeout
    return count

DRAIN_LIMIT, DRAIN_SECONDS = 2**20, 2.0   # unread input discarded before closing, so the client sees our answer

class ChatRequestHandler(BaseHTTPRequestHandler):
  """Routes /v1/models and /v1/chat/completions; every other path is a 404, every answer JSON."""
  server: ChatServer
  protocol_version = "HTTP/1.1"   # keep-alive for JSON responses; streams close the connection when done
  default_request_version = "HTTP/1.0"   # http.server's HTTP/0.9 default would send error bodies without a status line
  server_version = "kiln-llm"

  def setup(self) -> None:
    super().setup()
    self.rfile.close()   # StreamRequestHandler's plain file: replaced by one that keeps the request's deadline
    self.reader = DeadlineReader(self.connection, self.server.read_timeout)
    self.rfile = io.BufferedReader(self.reader)
    self.unread_input = False   # a body was left unread: drain it before closing

  def handle_one_request(self) -> None:
    self.reader.next_request()
    try: super().handle_one_request()
    except ReadTimeout as error:
      self.close_connection = True
      if not self.reader.started: return   # an idle keep-alive connection: close it quietly
      self.unread_input = True
      self.send_error_json(RequestError(str(error), status=408, code="request_timeout"))

  def finish(self) -> None:
    if self.unread_input: self.drain_input()
    super().finish()

  def drain_input(self) -> None:
    """Read and discard what the client still sends (bounded): closing a socket with unread input resets the
    connection, and the client would lose the error it is about to read."""
    try:
      self.wfile.flush()
      self.connection.shutdown(socket.SHUT_WR)
      deadline, drained = time.monotonic() + min(DRAIN_SECONDS, self.server.read_timeout), 0
      while drained < DRAIN_LIMIT and (remaining := deadline - time.monotonic()) > 0:
        self.connection.settimeout(remaining)
        chunk = self.connection.recv(65536)
        if not chunk: break
        drained += len(chunk)
    except OSError: pass

  def log_message(self, format: str, *args: Any) -> None:   # noqa: A002 (the base class's signature)
    if not self.server.quiet: super().log_message(format, *args)

  def send_json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
    """A complete JSON response with a Content-Length (headers only for HEAD)."""
    data = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items(): self.send_header(name, value)
    if self.close_connection: self.send_header("Connection", "close")
    self.end_headers()
    if self.command != "HEAD": self.wfile.write(data)

  def send_error_json(self, error: RequestError, headers: dict[str, str] | None = None) -> None:
    """An OpenAI-style error body."""
    self.send_json(error.status, {"error": {"message": str(error), "type": error.error_type, "param": error.param,
                                            "code": error.code}}, headers)

  def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
    """http.server's own errors (a garbage request line, over-long headers, an unknown method) as JSON too."""
    self.close_connection = self.unread_input = True   # the rest of such a request is not read
    self.log_error("code %d, message %s", code, message)
    text = message or HTTPStatus(code).phrase
    if explain: text = f"{text}: {explain}"
    self.send_error_json(RequestError(text, status=code, error_type="server_error" if code >= 500 else
                                      "invalid_request_error"))

  def reject_method(self) -> None:
    """A method this server does not answer -> 405."""
    self.close_connection = self.unread_input = True   # its body, if any, is not read
    self.send_error_json(RequestError(f"method {self.command} is not allowed; this server answers GET and POST",
                                      status=405, code="method_not_allowed"), {"Allow": "GET, POST"})
  # the other methods HTTP defines; a method without a do_ handler gets http.server's 501 (as JSON, by send_error)
  do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = reject_method   # noqa: N815

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
      self.send_error_json(RequestError("use POST for /v1/chat/completions", status=405), {"Allow": "POST"})
    else: self.send_error_json(RequestError(f"unknown path {path!r}", status=404, code="unknown_url"))

  def do_POST(self) -> None:  # noqa: N802
    path = self.path.split("?")[0].rstrip("/")
    try:
      body = self.read_body()   # read it even for a 404, so a keep-alive connection stays in step
      if body is None: return   # the client closed the connection in the middle of the body
      if path != "/v1/chat/completions":
        raise RequestError(f"unknown path {path!r}", status=404, code="unknown_url")
      try: payload = json.loads(body)
      except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"malformed JSON in the request body: {error}") from None
      request = parse_request(payload, self.server.defaults)
    except RequestError as error:
      self.send_error_json(error)
      return
    self.answer(request)

  def body_length(self) -> int:
    """The body's length from Content-Length, checked against the server's limit before anything is read."""
    length = self.headers.get("Content-Length")
    if length is None:
      chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
      raise RequestError(("chunked request bodies are not supported: " if chunked else "") +
                         "the request needs a JSON body with a Content-Length", status=411, code="length_required")
    digits = length.strip().lstrip("0") or "0"
    if not re.fullmatch(r"[0-9]+", digits):
      raise RequestError(f"Content-Length must be a number of bytes, got {length[:40]!r}")
    # a length of 20 digits is over any limit (and int() refuses strings of thousands of digits)
    if len(digits) >= 20 or int(digits) > self.server.max_body:
      size = digits if len(digits) <= 30 else f"{digits[:20]}... ({len(digits)} digits)"
      raise RequestError(f"the request body of {size} bytes is over this server's limit of "
                         f"{self.server.max_body} bytes (--max-body)", status=413, code="request_too_large")
    return int(digits)

  def read_body(self) -> bytes | None:
    """The request body; None when the client closed the connection before sending all of it. RequestError when
    the length is missing (411), malformed (400) or over the limit (413), or the body is too slow (408)."""
    try: length = self.body_length()
    except RequestError:
      self.close_connection = self.unread_input = True   # the body stays unread: this connection is out of step
      raise
    try: body = self.rfile.read(length)
    except ReadTimeout as error:
      self.close_connection = self.unread_input = True
      raise RequestError(str(error), status=408, code="request_timeout") from None
    if len(body) < length:
      self.close_connection = True
      return None
    return body

  def handle_expect_100(self) -> bool:
    """Refuse an over-long body before the client sends it (curl asks first for large bodies)."""
    if self.command == "POST":
      try: self.body_length()
      except RequestError as error:
        self.close_connection = self.unread_input = True
        self.send_error_json(error)
        return False
    return super().handle_expect_100()

  def client_gone(self) -> bool:
    """Whether the client has closed its connection (checked between tokens; anything it sent stays unread)."""
    try:
      readable, _, _ = select.select([self.connection], [], [], 0)
      return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):   # reset, or already closed
      return True

  def hold_engine(self) -> bool:
    """Take the engine lock; False (without it) if the client leaves while waiting for it."""
    while not self.server.engine_lock.acquire(timeout=0.1):
      if self.client_gone(): return False
    if self.client_gone():
      self.server.engine_lock.release()
      return False
    return True

  def answer(self, request: CompletionRequest) -> None:
    """Generate the reply while holding the engine; a plain reply is sent after the engine is released."""
    if not self.hold_engine():
      self.client_left("before its reply started")
      return
    try:
      try:
        reply = self.server.engine.chat(request.messages, temperature=request.temperature, top_k=request.top_k,
                                        top_p=request.top_p, seed=request.seed, max_tokens=request.max_tokens,
                                        cancelled=self.client_gone)
      except (ValueError, TypeError) as error:   # e.g. the prompt does not fit the context
        code = "context_length_exceeded" if "does not fit the context" in str(error) else None
        self.send_error_json(RequestError(str(error), param="messages", code=code))
        return
      if request.stream:
        self.stream_reply(reply, request.include_usage)
        return
      try: text = "".join(reply)
      except Exception as error:   # a failure inside the model: report it and stay up
        self.log_error("generation failed: %r", error)
        self.send_error_json(RequestError(f"generation failed: {error}", status=500, error_type="server_error"))
        return
    finally:
      self.server.engine_lock.release()
    if reply.finish_reason is None: self.client_left("during its reply")
    else: self.send_reply(reply, text)

  def client_left(self, when: str) -> None:
    """Note a client that went away: nothing to answer, and its connection is closed."""
    self.close_connection = True
    if not self.server.quiet: print(f"client disconnected {when}; reply stopped", file=sys.stderr)

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
      if reply.finish_reason is None:   # cancelled: the client is gone
        self.client_left("mid-stream")
        return
      self.send_event(chunk({}, reply.finish_reason))
      if include_usage: self.send_event({**header, "choices": [], "usage": usage(reply)})
      self.wfile.write(b"data: [DONE]\n\n")
      self.wfile.flush()
    except OSError:   # a broken pipe, a reset, or a client that stopped reading (the write timed out)
      self.client_left("mid-stream")
    finally:
      reply.close()   # stops generating at once when the client went away; the engine's cache stays consistent

  def send_event(self, payload: dict) -> None:
    """One Server-Sent Event carrying a JSON payload."""
    self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
    self.wfile.flush()

def make_server(engine: ChatEngine, host: str = "127.0.0.1", port: int = 8000,
                defaults: SamplingDefaults = SamplingDefaults(), quiet: bool = False,
                max_body: int = DEFAULT_MAX_BODY, read_timeout: float = DEFAULT_READ_TIMEOUT) -> ChatServer:
  """A bound (not yet serving) server; port 0 picks a free port (`server.server_address[1]`). `max_body` is the
  largest request body in bytes (larger ones get a 413 unread), `read_timeout` the seconds a request may take to
  arrive (then a 408)."""
  return ChatServer((host, port), engine, defaults, quiet, max_body, read_timeout)

def serve(engine: ChatEngine, host: str = "127.0.0.1", port: int = 8000,
          defaults: SamplingDefaults = SamplingDefaults(), max_body: int = DEFAULT_MAX_BODY,
          read_timeout: float = DEFAULT_READ_TIMEOUT) -> None:
  """Serve until Ctrl-C."""
  server = make_server(engine, host, port, defaults, max_body=max_body, read_timeout=read_timeout)
  bound_host, bound_port = server.server_address[:2]
  print(f"kiln.apps.llm: serving {engine.name} at http://{bound_host}:{bound_port}/v1 (Ctrl-C stops)", file=sys.stderr)
  try: server.serve_forever()
  except KeyboardInterrupt: pass
  finally: server.server_close()
