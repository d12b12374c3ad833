"""`dflash serve` on loopback, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from engine.config import DFlashConfig
from engine.events import Finished, GenerationResult, RunningStats, Span
from engine.runtime import DFlashRuntime
from engine.server import create_app

MAX_CTX = 512


class Running:
    """A real uvicorn server on a free loopback port, in a thread."""

    def __init__(self, load, **options):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = create_app(load, **options)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self):
        deadline = time.time() + 60
        while (health := httpx.get(self.url + "/health")).status_code != 200:
            assert time.time() < deadline, f"model did not load: {health.text}"
            time.sleep(0.05)
        return self

    def client(self, key="unused", **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, **kw)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def tiny_runtime(tiny_pairs, **config):
    target, draft = tiny_pairs("llama")
    return DFlashRuntime.from_pretrained(
        model=str(target), draft=str(draft),
        config=DFlashConfig(**{"dtype": "float32", "max_ctx": MAX_CTX, **config}))


@pytest.fixture(scope="module")
def served(tiny_pairs):
    """(server on the tiny llama pair, a reference runtime without reuse)."""
    running = Running(lambda: tiny_runtime(tiny_pairs)).wait_ready()
    yield running, tiny_runtime(tiny_pairs, prompt_cache_bytes=0)
    running.stop()


def chat(user):
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}]


def test_chat_non_streamed_matches_the_engine(served):
    running, ref = served
    reply = running.client().chat.completions.create(
        model=ref.target_id, messages=chat("Hello!"), max_tokens=12)
    want = ref.generate(chat("Hello!"), max_tokens=12)
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].finish_reason == ("stop" if want.finish_reason == "stop"
                                              else "length")
    assert reply.usage.prompt_tokens == want.prompt_tokens
    assert reply.usage.completion_tokens == want.total_tokens
    extra = reply.usage.model_extra["dflash"]
    assert extra["cycles"] == want.cycles and extra["speculative"]
    assert (extra["pauses"], extra["paused_tokens"]) == (want.pauses, want.paused_tokens)
    assert 0.0 <= extra["acceptance_rate"] <= 1.0 and extra["tokens_per_cycle"] >= 1.0


def test_chat_streamed_matches_and_reports_usage(served):
    running, ref = served
    stream = running.client().chat.completions.create(
        model=ref.target_id, messages=chat("What is 12 times 7?"), max_tokens=12, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    want = ref.generate(chat("What is 12 times 7?"), max_tokens=12)
    assert text == want.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == want.total_tokens
    assert chunks[-1].choices == [] and chunks[-2].usage == chunks[-1].usage  # on the last too
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens is not None


def test_follow_up_turn_reports_cached_tokens(served):
    running, _ = served
    client = running.client()
    messages = chat("def add(a, b):")
    first = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And subtract?"}]
    second = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_models_lists_the_loaded_pair(served):
    running, ref = served
    models = running.client().models.list().data
    assert [m.id for m in models] == [ref.target_id]
    assert models[0].model_extra["draft"] == ref.draft_id


def test_completions_raw_text(served):
    running, ref = served
    reply = running.client().completions.create(model=ref.target_id,
                                                prompt="The quick brown fox", max_tokens=10)
    assert reply.choices[0].text == ref.generate("The quick brown fox", max_tokens=10).text
    streamed = running.client().completions.create(
        model=ref.target_id, prompt="The quick brown fox", max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


def error_of(response):
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


def test_bad_requests_get_openai_errors_and_the_server_survives(served):
    running, ref = served
    url = running.url + "/v1/chat/completions"
    bad = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "JSON" in error_of(bad)["message"]
    missing = httpx.post(url, json={"model": ref.target_id})
    assert missing.status_code == 400 and error_of(missing)["param"] == "messages"
    wrong = httpx.post(url, json={"messages": chat("hi"), "max_tokens": "ten"})
    assert wrong.status_code == 400 and error_of(wrong)["param"] == "max_tokens"
    wrong_msg = httpx.post(url, json={"messages": [{"content": "no role"}]})
    assert wrong_msg.status_code == 400
    assert httpx.post(running.url + "/v1/completions", json={}).status_code == 400
    assert httpx.get(running.url + "/v1/nothing").status_code == 404

    client = running.client()
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=chat("hi"), max_tokens=4)
    assert exc.value.code == "model_not_found" and "gpt-4o" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=ref.target_id, messages=chat("hi"),
                                       max_tokens=4, temperature=0.7, top_p=1.5)
    assert exc.value.param == "top_p" and "top_p=1.5" in exc.value.message
    long = chat("The quick brown fox jumps over the lazy dog. " * 60)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=ref.target_id, messages=long, max_tokens=4)
    assert exc.value.code == "context_length_exceeded" and str(MAX_CTX) in exc.value.message
    n = len(ref.encode(long))
    assert str(n) in exc.value.message
    # Still serving, and temperature 0 is fine.
    ok = client.chat.completions.create(model=ref.target_id, messages=chat("hi"),
                                        max_tokens=4, temperature=0)
    assert ok.choices[0].message.content == ref.generate(chat("hi"), max_tokens=4).text


def test_sampling_is_passed_through_and_seeded(served):
    running, ref = served
    client = running.client()

    def sampled(seed):
        return client.chat.completions.create(
            model=ref.target_id, messages=chat("Tell me a story."), max_tokens=12,
            temperature=1.0, top_p=0.9, seed=seed).choices[0].message.content

    want = ref.generate(chat("Tell me a story."), max_tokens=12, temperature=1.0, top_p=0.9,
                        seed=7).text
    assert sampled(7) == sampled(7) == want
    greedy = ref.generate(chat("Tell me a story."), max_tokens=12).text
    assert {sampled(s) for s in range(1, 5)} != {greedy}  # it does sample


def test_sixteen_concurrent_streams_each_get_their_own_text(served):
    running, ref = served
    prompts = [f"Question {i}: what is {i} times 7?" for i in range(16)]
    want = [ref.generate(chat(p), max_tokens=8).text for p in prompts]

    def one(prompt):
        stream = running.client().chat.completions.create(
            model=ref.target_id, messages=chat(prompt), max_tokens=8, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, prompts))
    assert got == want


KILLED_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0)
stream = client.chat.completions.create(model=sys.argv[2], max_tokens=100000, stream=True,
    messages=[{"role": "user", "content": "Tell me everything."}])
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print("streaming", flush=True)
        break
sys.stdin.read()  # block until killed
"""


def generated_total(running) -> float:
    text = httpx.get(running.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families["dflash_generated_tokens"].samples[0].value


def test_a_killed_client_does_not_stall_the_next_request(tiny_pairs, served):
    _, ref = served
    big = 1 << 20  # room for the 100,000 tokens the killed client asks for
    running = Running(lambda: tiny_runtime(tiny_pairs, max_ctx=big)).wait_ready()
    try:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, running.url + "/v1",
                                 ref.target_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline().strip() == b"streaming"
        finally:
            proc.kill()
            proc.wait()
        # 100,000 tokens would take minutes; the next request must not wait for them.
        client = running.client(timeout=60)
        reply = client.chat.completions.create(model=ref.target_id, messages=chat("hi"),
                                               max_tokens=6)
        assert reply.choices[0].message.content == ref.generate(chat("hi"), max_tokens=6).text
        assert running.app.state.server.worker.depth == 0
        assert generated_total(running) < 20_000  # the killed stream stopped early
    finally:
        running.stop()


def test_max_tokens_stops_at_the_context_end(served):
    running, ref = served
    reply = running.client().chat.completions.create(model=ref.target_id, messages=chat("hi"),
                                                     max_tokens=100_000)
    assert reply.usage.model_extra["dflash"]["speculative"]  # the draft stayed on
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= MAX_CTX


def test_metrics_parse_as_prometheus_text(served):
    running, ref = served
    running.client().chat.completions.create(model=ref.target_id, messages=chat("hi"),
                                             max_tokens=6)
    text = httpx.get(running.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("dflash_requests", "dflash_generated_tokens", "dflash_prompt_tokens",
                 "dflash_cached_prompt_tokens", "dflash_cycles", "dflash_acceptance_rate",
                 "dflash_tokens_per_cycle", "dflash_queue_depth", "dflash_pauses",
                 "dflash_paused_tokens",
                 "dflash_time_to_first_token_seconds", "dflash_tokens_per_second"):
        assert name in families, name
    assert families["dflash_time_to_first_token_seconds"].type == "histogram"
    ok = [s for s in families["dflash_requests"].samples
          if s.labels == {"endpoint": "chat", "status": "200"}]
    assert ok and ok[0].value >= 1
    generated = families["dflash_generated_tokens"].samples[0].value
    assert generated >= 6
    count = next(s.value for s in families["dflash_time_to_first_token_seconds"].samples
                 if s.name.endswith("_count"))
    assert count >= 1


def test_api_key_is_required_when_set(tiny_pairs):
    running = Running(lambda: tiny_runtime(tiny_pairs), api_key="s3cret").wait_ready()
    try:
        with pytest.raises(openai.AuthenticationError) as exc:
            running.client("wrong").models.list()
        assert exc.value.status_code == 401
        assert httpx.get(running.url + "/v1/models").status_code == 401
        assert httpx.get(running.url + "/metrics").status_code == 401
        assert [m.id for m in running.client("s3cret").models.list().data]
    finally:
        running.stop()


def test_requests_get_503_while_the_model_loads(tiny_pairs):
    release = threading.Event()

    def slow_load():
        release.wait(30)
        return tiny_runtime(tiny_pairs)

    running = Running(slow_load)
    try:
        assert httpx.get(running.url + "/health").status_code == 503
        with pytest.raises(openai.InternalServerError) as exc:
            running.client().chat.completions.create(model="x", messages=chat("hi"))
        assert exc.value.status_code == 503 and "loading" in exc.value.message
        release.set()
        running.wait_ready()
        assert running.client().models.list().data
    finally:
        release.set()
        running.stop()


def test_a_failed_load_is_a_503_that_says_why():
    def broken():
        raise FileNotFoundError("no such model folder: /nowhere")

    running = Running(broken)
    try:
        deadline = time.time() + 10
        while "error" not in httpx.get(running.url + "/health").json().get("status", ""):
            assert time.time() < deadline
            time.sleep(0.05)
        reply = httpx.get(running.url + "/v1/models")
        assert reply.status_code == 503 and "/nowhere" in error_of(reply)["message"]
    finally:
        running.stop()


# -- canned model output: stop strings and tool calls through the real HTTP stack -----------
class CannedRuntime:
    """Stands in for DFlashRuntime: streams a fixed reply a few characters per span."""

    target_id, draft_id = "canned", "canned-draft"

    class config:  # noqa: N801 - mirrors rt.config
        max_ctx = 4096

    def __init__(self):
        self.reply = ""
        self.template_args = []
        self.tokenizer = object()  # no tool parser of its own: the Qwen markup is read

    def describe(self):
        return {"max_ctx": self.config.max_ctx, "backend": "cpu"}

    def encode(self, prompt, chat_template_args=None):
        self.template_args.append(chat_template_args)
        return [1, 2, 3]

    def stream_generate(self, prompt, max_tokens=256, speculative=True, **_):
        pieces = [self.reply[i:i + 3] for i in range(0, len(self.reply), 3)]
        for n, piece in enumerate(pieces, 1):
            yield Span((n,), 0, piece, "", stats(n))
        yield Finished(GenerationResult(
            text=self.reply, tokens=list(range(len(pieces))), prompt_tokens=3,
            finish_reason="stop", speculative=False, fallback_reason=None, block_size=16,
            elapsed_s=0.01, prefill_s=0.001, ttft_s=0.001, decode_s=0.009,
            peak_memory_bytes=0))


def stats(n):
    return RunningStats(prompt_tokens=3, generated=n, cycles=0, elapsed_s=0.01, decode_s=0.01,
                        ttft_s=0.001, prefill_tokens_per_second=0.0, ctx_used=3 + n,
                        max_ctx=4096, peak_memory_bytes=0, speculative=False)


@pytest.fixture(scope="module")
def canned():
    rt = CannedRuntime()
    running = Running(lambda: rt).wait_ready()
    yield running, rt
    running.stop()


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        '\n</tool_call>')


def test_tool_call_non_streamed(canned):
    running, rt = canned
    rt.reply = CALL
    reply = running.client().chat.completions.create(
        model="canned", messages=chat("Weather in Paris?"), tools=TOOLS, tool_choice="auto")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")
    assert rt.template_args[-1]["tools"] == TOOLS
    assert rt.template_args[-1]["tool_choice"] == "auto"


def test_tool_call_streamed_and_sent_back(canned):
    running, rt = canned
    rt.reply = CALL + '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}' \
                      '</tool_call>'
    stream = running.client().chat.completions.create(
        model="canned", messages=chat("Weather?"), tools=TOOLS, stream=True)
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            calls.setdefault(tc.index, {"name": "", "arguments": ""})
            calls[tc.index]["name"] += tc.function.name or ""
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me check."
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    # The next turn sends the call and its result back; the template gets arguments as JSON.
    rt.reply = "It is sunny."
    follow = running.client().chat.completions.create(model="canned", tools=TOOLS, messages=[
        *chat("Weather?"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert follow.choices[0].message.content == "It is sunny."
    assert follow.choices[0].finish_reason == "stop"


def test_malformed_tool_call_json_comes_back_as_content(canned):
    running, rt = canned
    rt.reply = 'Hmm <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    reply = running.client().chat.completions.create(model="canned", messages=chat("?"),
                                                     tools=TOOLS)
    assert reply.choices[0].message.content == rt.reply
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    stream = running.client().chat.completions.create(model="canned", messages=chat("?"),
                                                      tools=TOOLS, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == rt.reply


def test_without_tools_markup_is_plain_text(canned):
    running, rt = canned
    rt.reply = CALL
    reply = running.client().chat.completions.create(model="canned", messages=chat("?"))
    assert reply.choices[0].message.content == CALL


def test_stop_strings_cut_the_reply(canned):
    running, rt = canned
    rt.reply = "Hello world. Goodbye world."
    client = running.client()
    reply = client.chat.completions.create(model="canned", messages=chat("?"), stop=["ld. G"])
    assert reply.choices[0].message.content == "Hello wor"
    assert reply.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model="canned", messages=chat("?"), stop="bye",
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "Hello world. Good"
