"""The server under abuse, through real sockets on 127.0.0.1 with a fake model: abandoned requests, huge or slow
bodies, idle and slow clients, methods and request lines http.server answers itself. After each case the server is
still up, answers with the right status and an OpenAI-style JSON body, frees its handler threads, and the next
normal request is answered."""
import contextlib, http.client, json, select, socket, threading, time
import pytest
from fake_llm import FakeTokenizer, ScriptedModel
from kiln.apps.llm.engine import ChatEngine
from kiln.apps.llm.server import SamplingDefaults, make_server

MAX_BODY, READ_TIMEOUT = 4096, 1.0
LONG_REPLY = "word " * 400   # 2000 tokens: far more than any abandoned request may generate

class SlowModel(ScriptedModel):
  """A ScriptedModel that takes `delay` seconds per call, like a real model, so a reply lasts long enough to leave."""
  def __init__(self, *args, delay: float = 0.0, **kwargs):
    super().__init__(*args, **kwargs)
    self.delay = delay
  def logits(self, tokens, start_pos):
    time.sleep(self.delay)
    return super().logits(tokens, start_pos)

class CountingServer:
  """Counts the connections a ChatServer accepted and the handler threads that have finished with theirs."""
  def __init__(self, srv):
    self.accepted = self.finished = 0
    self.lock = threading.Lock()
    process_request, process_request_thread = srv.process_request, srv.process_request_thread
    def counted_process_request(request, client_address):
      with self.lock: self.accepted += 1
      process_request(request, client_address)
    def counted_thread(request, client_address):
      try: process_request_thread(request, client_address)
      finally:
        with self.lock: self.finished += 1
    srv.process_request, srv.process_request_thread = counted_process_request, counted_thread

@contextlib.contextmanager
def running_server(read_timeout: float = READ_TIMEOUT):
  """A served ChatServer with a slow fake model on a free port of 127.0.0.1, stopped on exit."""
  model = SlowModel("Hi there!", max_context=4096, delay=0.002)
  engine = ChatEngine(model, FakeTokenizer(), "fake-model")
  srv = make_server(engine, "127.0.0.1", 0, SamplingDefaults(temperature=0.0, top_k=0, top_p=1.0, max_tokens=64),
                    quiet=True, max_body=MAX_BODY, read_timeout=read_timeout)
  srv.connections = CountingServer(srv)
  thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
  thread.start()
  try: yield srv
  finally:
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)

@pytest.fixture
def server():
  with running_server() as srv: yield srv

def chat_request(**fields) -> dict:
  return {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], **fields}

def post_bytes(payload: dict, path: str = "/v1/chat/completions") -> bytes:
  body = json.dumps(payload).encode()
  return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          f"Content-Length: {len(body)}\r\n\r\n").encode() + body

def connect(server) -> socket.socket:
  return socket.create_connection(server.server_address[:2], timeout=20)

def read_response(sock: socket.socket, method: str = "POST") -> tuple[int, dict, bytes]:
  """(status, headers, body) of the response waiting on `sock`; fails on anything that is not a status line."""
  response = http.client.HTTPResponse(sock, method=method)
  response.begin()
  return response.status, {name.lower(): value for name, value in response.getheaders()}, response.read()

def exchange(server, data: bytes, method: str = "POST") -> tuple[int, dict, bytes]:
  """Send raw bytes on a new connection and read the one response."""
  with connect(server) as sock:
    sock.sendall(data)
    return read_response(sock, method)

def assert_json_error(status: int, body: bytes, want_status: int, *words: str) -> dict:
  assert status == want_status, (status, body)
  error = json.loads(body)["error"]
  assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"], error
  for word in words: assert word in error["message"], (word, error)
  return error

def wait_until(condition, seconds: float = 20.0) -> bool:
  """Poll `condition` until it holds or `seconds` pass; whether it held."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if condition(): return True
    time.sleep(0.02)
  return condition()

def threads_done(server, connections: int) -> bool:
  """Whether the server accepted at least `connections` connections and has finished handling every one."""
  counts = server.connections
  return counts.accepted >= connections and counts.finished == counts.accepted

def assert_still_serving(server, connections: int = 1) -> None:
  """The handlers of the test's `connections` connections have all ended, and a normal request gets its reply."""
  counts = server.connections
  assert wait_until(lambda: threads_done(server, connections)), \
    f"{counts.accepted - counts.finished} of {counts.accepted} handler threads still running"
  server.engine.model.reply = list(b"Hi there!")
  status, _, body = exchange(server, post_bytes(chat_request(max_tokens=5)))
  assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "Hi th", body
  engine = server.engine
  assert engine.cached_ids == engine.model.cache[:len(engine.cached_ids)]

def decode_calls(model: ScriptedModel) -> int:
  return sum(n == 1 for n, _ in model.calls)

# ---- abandoned requests

def test_abandoned_plain_requests_stop_generating(server):
  model = server.engine.model
  model.reply = list(LONG_REPLY.encode())
  for _ in range(3):   # sent and hung up at once
    with connect(server) as sock: sock.sendall(post_bytes(chat_request(max_tokens=1000)))
  with connect(server) as sock:   # hung up while its reply is being generated
    sock.sendall(post_bytes(chat_request(max_tokens=1000)))
    assert wait_until(lambda: decode_calls(model) >= 5), "generation did not start"
  assert_still_serving(server, connections=4)
  assert decode_calls(model) < 200, f"{decode_calls(model)} tokens generated for clients that had left"

def test_client_waiting_for_the_engine_leaves_without_it(server):
  with server.engine_lock:   # another request is "generating"
    with connect(server) as sock: sock.sendall(post_bytes(chat_request(max_tokens=1000)))
    assert wait_until(lambda: threads_done(server, 1)), "the handler kept waiting for the engine"
  assert server.engine.model.calls == []
  assert_still_serving(server)

def test_abandoned_stream_stops_generating(server):
  model = server.engine.model
  model.reply = list(LONG_REPLY.encode())
  with connect(server) as sock:
    sock.sendall(post_bytes(chat_request(max_tokens=1000, stream=True)))
    assert sock.recv(1)   # the stream has begun
  assert_still_serving(server)
  assert decode_calls(model) < 200

# ---- bodies: too large, missing length, too slow

@pytest.mark.parametrize("claimed", [10**12, 3 * 10**9, MAX_BODY + 1, 10**25])
def test_oversized_body_is_413_before_it_is_read(server, claimed):
  head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {claimed}\r\n\r\n".encode()
  status, headers, body = exchange(server, head + b"{}")
  error = assert_json_error(status, body, 413, str(claimed), str(MAX_BODY), "--max-body")
  assert error["code"] == "request_too_large" and headers.get("connection") == "close"
  assert_still_serving(server)

def test_oversized_body_with_expect_100_continue_is_413_without_continue(server):
  head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {10**12}\r\n"
          "Expect: 100-continue\r\n\r\n").encode()
  status, _, body = exchange(server, head)   # a 100 Continue first would be read as the status here
  assert_json_error(status, body, 413, "--max-body")
  assert_still_serving(server)

@pytest.mark.parametrize("headers,want_status,word", [
  ("", 411, "Content-Length"), ("Transfer-Encoding: chunked\r\n", 411, "chunked"),
  ("Content-Length: abc\r\n", 400, "Content-Length"), ("Content-Length: -5\r\n", 400, "Content-Length"),
  ("Content-Length: \u00b2\r\n", 400, "Content-Length"),
  ("Content-Length: 1" + "0" * 5000 + "\r\n", 413, "5001 digits"),
], ids=["missing", "chunked", "letters", "negative", "superscript-two", "5001-digits"])
def test_missing_or_malformed_length(server, headers, want_status, word):
  head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode("latin-1")
  status, _, body = exchange(server, head + b"0\r\n\r\n")
  assert_json_error(status, body, want_status, word)
  assert_still_serving(server)

def test_body_shorter_than_its_length_is_408(server):
  head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
  start = time.monotonic()
  status, _, body = exchange(server, head + b'{"messages"')   # then nothing: the slowloris
  assert_json_error(status, body, 408, f"{READ_TIMEOUT:g} s")
  assert time.monotonic() - start < 15   # the read timeout is 1 s; generous for a loaded machine
  assert_still_serving(server)

def test_headers_sent_a_line_at_a_time_are_408(server):
  """A client that keeps sending header lines slowly is cut off by the request's deadline, not each read's."""
  with connect(server) as sock:
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not select.select([sock], [], [], 0.2)[0]:
      try: sock.sendall(b"X-Slow: a\r\n")
      except OSError: break
    status, _, body = read_response(sock)
  assert_json_error(status, body, 408)
  assert_still_serving(server)

def test_idle_connection_is_closed_quietly(server):
  with connect(server) as sock:
    assert sock.recv(100) == b""   # the server closed it after the read timeout, saying nothing
  assert_still_serving(server)

def test_keep_alive_pause_does_not_count_against_the_next_request():
  """The read timeout counts from a request's first byte: an idle pause plus a slow request may together take longer
  than the timeout (0.6 + 0.6 of it here, with 0.4 of it to spare on each side)."""
  timeout = 2.0
  with running_server(read_timeout=timeout) as server, connect(server) as sock:
    request = post_bytes(chat_request(max_tokens=2))
    head, body = request.split(b"\r\n\r\n", 1)
    for pause in (0, timeout * 0.6):
      time.sleep(pause)
      sock.sendall(head + b"\r\n\r\n")
      time.sleep(pause)
      sock.sendall(body)
      status, _, reply = read_response(sock)
      assert status == 200 and json.loads(reply)["choices"][0]["message"]["content"] == "Hi"
    assert server.connections.accepted == 1

# ---- methods and request lines that http.server answers itself

@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_are_json_405(server, method):
  status, headers, body = exchange(server, f"{method} /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                           "Content-Length: 2\r\n\r\n{}".encode())
  assert_json_error(status, body, 405, method)
  assert headers["allow"] == "GET, POST" and headers["content-type"] == "application/json"
  assert_still_serving(server)

def test_head_is_405_without_a_body(server):
  status, headers, body = exchange(server, b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", method="HEAD")
  assert status == 405 and body == b"" and headers["allow"] == "GET, POST"
  assert_still_serving(server)

@pytest.mark.parametrize("request_bytes,want_status", [
  (b"BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 501),
  (b"hello\r\n\r\n", 400),
  (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n", 400),   # TLS spoken to a plain HTTP port
  (b"GET /v1/models HTTP/1.x\r\n\r\n", 400),
  (b"GET /v1/models HTTP/2.0\r\n\r\n", 505),
  (b"GET /v1/models HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", 431),
  (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
])
def test_bad_request_lines_get_a_status_line_and_json(server, request_bytes, want_status):
  status, headers, body = exchange(server, request_bytes)
  assert_json_error(status, body, want_status)
  assert headers["content-type"] == "application/json" and headers.get("connection") == "close"
  assert_still_serving(server)

def test_many_bad_clients_then_a_good_one(server):
  """A burst of the cases above, each on its own connection, all at once (bounded: 30 connections)."""
  bad = [post_bytes(chat_request(max_tokens=1000)), b"hello\r\n\r\n", b"PUT / HTTP/1.1\r\n\r\n",
         b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\n{}"]
  sockets = [connect(server) for _ in range(30)]
  for index, sock in enumerate(sockets): sock.sendall(bad[index % len(bad)])
  for sock in sockets: sock.close()
  assert_still_serving(server, connections=30)
