"""Conversation-state reuse: every reused request equals a fresh prefill of the same prompt."""

from __future__ import annotations

import mlx.core as mx
import pytest
from tiny_pairs import TruthOracle, cache_states

from engine.config import DFlashConfig
from engine.cycle import prefill, speculative_decode
from engine.errors import ConfigError
from engine.prompt_cache import default_cache_bytes, resolve_cache_bytes
from engine.runtime import DFlashRuntime

FAMILIES = ["llama", "qwen3", "qwen3_5"]
N = 10  # reply tokens per turn: enough for several speculative cycles on the tiny pairs


def load(tiny_pairs, family, **config):
    target, draft = tiny_pairs(family)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(dtype="float32", **config))


@pytest.fixture(scope="module")
def pairs(tiny_pairs):
    """family -> (runtime with reuse, runtime that always prefills fresh)."""
    made = {}

    def get(family, **config):
        key = (family, tuple(sorted(config.items())))
        if key not in made:
            made[key] = (load(tiny_pairs, family, **config),
                         load(tiny_pairs, family, prompt_cache_bytes=0, **config))
        return made[key]

    return get


def same(rt, ref, messages, speculative=True, max_tokens=N):
    """Generate with reuse and fresh; both must agree token for token. -> the reused result."""
    got = rt.generate(messages, max_tokens=max_tokens, no_eos=True, speculative=speculative)
    want = ref.generate(messages, max_tokens=max_tokens, no_eos=True, speculative=speculative)
    assert want.cached_tokens == 0
    assert got.tokens == want.tokens
    assert got.prompt_tokens == want.prompt_tokens
    return got


def conversation(rt, ref, turns, speculative=True):
    """Run user turns one after another, feeding each reply back. -> per-turn results."""
    messages, results = [{"role": "system", "content": "Be brief."}], []
    for user in turns:
        messages.append({"role": "user", "content": user})
        result = same(rt, ref, messages, speculative)
        results.append(result)
        messages.append({"role": "assistant", "content": result.text})
    return messages, results


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("speculative", [True, False])
def test_multi_turn_reuses_the_conversation_losslessly(pairs, family, speculative):
    rt, ref = pairs(family)
    rt.clear_cache()
    messages, results = conversation(
        rt, ref, ["Hello! How can I help?", "What is 12 times 7?", "def add(a, b):"],
        speculative)
    assert results[0].cached_tokens == 0
    for before, after in zip(results, results[1:]):
        # At least the previous prompt (all but its last token) comes from the cache.
        assert before.prompt_tokens - 1 <= after.cached_tokens < after.prompt_tokens
    assert results[-1].speculative is speculative


@pytest.mark.parametrize("family", FAMILIES)
def test_regenerate_resumes_before_the_last_prompt_token(pairs, family):
    rt, ref = pairs(family)
    rt.clear_cache()
    messages = [{"role": "user", "content": "The quick brown fox"}]
    first = same(rt, ref, messages)
    again = same(rt, ref, messages)
    assert again.cached_tokens == first.prompt_tokens - 1
    assert again.tokens == first.tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_an_edit_mid_history_reuses_the_part_before_it(pairs, family):
    rt, ref = pairs(family)
    rt.clear_cache()
    messages, results = conversation(
        rt, ref, ["Hello!", "What is 12 times 7?", "Speculative decoding drafts tokens"])
    edited = [dict(m) for m in messages[:-1]]
    edited[3]["content"] = "What is 12 times 8?"  # the second user message
    result = same(rt, ref, edited)
    # Back to at least the end of the first prompt; not past the edit.
    assert results[0].prompt_tokens - 1 <= result.cached_tokens < results[1].prompt_tokens


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_max_ctx_fallback_reuses_the_targets_state(pairs, family):
    rt, ref = pairs(family, max_ctx=96)
    rt.clear_cache()
    messages = [{"role": "user", "content": "Hello!"}]
    first = same(rt, ref, messages, max_tokens=8)
    assert first.speculative
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "What is 12 times 7? It is 84."}]
    second = same(rt, ref, messages, max_tokens=40)  # beyond max_ctx: the target alone
    assert not second.speculative and second.fallback_reason
    assert second.cached_tokens >= first.prompt_tokens - 1
    # Back under max_ctx: the plain turn left no draft state, so the speculative request
    # resumes from the first turn's state, which has one.
    third = same(rt, ref, messages, max_tokens=4)
    assert third.speculative and third.cached_tokens >= first.prompt_tokens - 1


def test_running_stats_carry_cached_tokens(pairs):
    rt, _ = pairs("qwen3")
    rt.clear_cache()
    messages = [{"role": "user", "content": "Hello!"}]
    rt.generate(messages, max_tokens=4)
    spans = [e for e in rt.stream_generate(messages, max_tokens=4) if hasattr(e, "stats")]
    assert spans and all(s.stats.cached_tokens > 0 for s in spans)


def test_cache_stays_within_its_byte_bound_and_clears(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    one = "Hello! How can I help you today?"  # raw text: no template prefix in common
    rt.generate(one, max_tokens=N)
    entry_bytes = rt.prompt_cache.nbytes
    assert entry_bytes > 0 and len(rt.prompt_cache) == 1
    # Room for about one conversation: a second one evicts the first (least recent).
    small = load(tiny_pairs, "llama", prompt_cache_bytes=int(entry_bytes * 1.5))
    small.generate(one, max_tokens=N)
    other = "def add(a, b):\n    return a + b\n"
    small.generate(other, max_tokens=N)
    assert len(small.prompt_cache) == 1 and small.prompt_cache.nbytes <= entry_bytes * 1.5
    assert small.generate(one, max_tokens=N).cached_tokens == 0
    assert small.generate(one, max_tokens=N).cached_tokens > 0
    small.clear_cache()
    assert len(small.prompt_cache) == 0
    assert small.generate(one, max_tokens=N).cached_tokens == 0


def test_a_continued_conversation_replaces_its_shorter_entry(pairs):
    rt, ref = pairs("llama")
    rt.clear_cache()
    conversation(rt, ref, ["Hello!", "What is 12 times 7?", "More?"])
    assert len(rt.prompt_cache) == 1


def test_cancelled_stream_still_leaves_a_usable_state(pairs):
    rt, ref = pairs("qwen3_5")
    rt.clear_cache()
    messages = [{"role": "user", "content": "Hello! How can I help you today?"}]
    stream = rt.stream_generate(messages, max_tokens=N, no_eos=True)
    next(stream)
    stream.close()
    again = same(rt, ref, messages)
    assert again.cached_tokens == again.prompt_tokens - 1


def test_prompt_cache_bytes_config():
    assert resolve_cache_bytes(0) == 0
    assert resolve_cache_bytes(1234) == 1234
    assert 0 < resolve_cache_bytes("auto") == default_cache_bytes() <= 8 << 30
    for bad in (-1, "lots", 1.5, True):
        with pytest.raises(ConfigError, match="prompt_cache_bytes"):
            DFlashConfig(prompt_cache_bytes=bad)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_switching_conversations_keeps_each_ones_state(pairs, family):
    rt, ref = pairs(family)
    rt.clear_cache()
    a = [{"role": "user", "content": "Hello! How can I help?"}]
    b = [{"role": "system", "content": "You write code."},
         {"role": "user", "content": "def add(a, b):"}]
    first_a = same(rt, ref, a)
    same(rt, ref, b)
    a += [{"role": "assistant", "content": first_a.text}, {"role": "user", "content": "More?"}]
    again = same(rt, ref, a)
    assert again.cached_tokens >= first_a.prompt_tokens - 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_reply_sent_back_changed_reuses_the_prefix_it_shares(pairs, family):
    """A client that sends the reply back altered (stripped, re-spaced: it then tokenizes
    differently from the tokens generated) gets the shared prefix from the cache, not more,
    and the same output as a fresh prefill."""
    rt, ref = pairs(family)
    rt.clear_cache()
    messages = [{"role": "user", "content": "The quick brown fox"}]
    first = same(rt, ref, messages)
    held = rt.prompt_cache.tokens()[-1]
    assert held[:first.prompt_tokens] == rt.encode(messages)
    messages += [{"role": "assistant", "content": " " + first.text.strip() + " \n"},
                 {"role": "user", "content": "More?"}]
    ids = rt.encode(messages)
    shared = next(i for i, (a, b) in enumerate(zip(held, ids)) if a != b)
    assert shared < len(held)  # the altered reply no longer matches what was generated
    second = same(rt, ref, messages)
    assert first.prompt_tokens - 1 <= second.cached_tokens <= shared
    if family != "qwen3_5":  # attention caches are cut right at the difference
        assert second.cached_tokens == shared


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stop_accepted_mid_block_leaves_the_state_just_before_it(tiny_pairs, family):
    """The stop token comes as an accepted draft with more accepted after it: decoding ends
    there and the caches hold the prompt and the reply before the stop, nothing past it (a
    recurrent state holding the tokens after it would not be a prefix of the next turn)."""
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello! How can I help you today?")
    reply = rt.generate(ids, max_tokens=24, no_eos=True, speculative=False).tokens
    # the stop: the latest token of the first block that occurs there for the first time
    k = max(i for i in range(2, 15) if reply[i] not in reply[:i])
    proposer, cache = TruthOracle(rt, ids + reply), rt.target.make_cache()
    commits = list(speculative_decode(rt.target, proposer, ids, 24, 16, 512, cache,
                                      stop_ids={reply[k]}))
    assert len(commits) == 2  # the prefill's token, then one block holding the stop
    tokens = commits[0].tokens + commits[1].tokens
    assert tokens[: k + 1] == reply[: k + 1] and len(tokens) > k + 1
    assert rt.target.cache_length(cache) == len(ids) + k
    assert all(c.offset == len(ids) + k for c in proposer.cache)
    ref = rt.target.make_cache()
    prefill(rt.target, ref, ids + reply[:k], 512)
    got, want = cache_states(cache), cache_states(ref)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.shape == w.shape and mx.allclose(g, w, atol=1e-4, rtol=1e-4).item()
