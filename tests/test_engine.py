"""The engine's promise: speculative output == the target's own greedy output, and the
caches after every rollback equal those of plain decoding."""

from __future__ import annotations

import mlx.core as mx
import pytest
from tiny_pairs import REPEATING, TruthOracle, cache_states, plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, prefill, speculative_decode
from engine.events import Finished, Span
from engine.plan import Plan, make_plan
from engine.targets import adapter_for

FAMILIES = ["llama", "qwen3", "qwen3_5"]
PROMPTS = ["Hello world", "def add(a, b):", "What is 12 times 7?"]


def load(tiny_pairs, family, mixing=1.0, **config):
    # whole blocks unless a test says otherwise: the CPU default cuts verifies short
    config.setdefault("min_draft_confidence", None)
    target, draft = tiny_pairs(family, mixing)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(**config))


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_equals_mlx_lm_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    for prompt in PROMPTS:
        ids = rt.encode(prompt)
        result = rt.generate(ids, max_tokens=200, no_eos=True)
        assert result.speculative and result.cycles > 0
        assert result.tokens == plain_greedy(rt.model, ids, 200), prompt


@pytest.mark.parametrize("family", FAMILIES)
def test_looked_up_proposals_stay_lossless(tiny_pairs, family):
    """Cycles the suffix lookup proposes (on a target whose replies repeat soon) commit the
    target's greedy tokens too; with the lookup off the draft proposes every cycle."""
    rt = load(tiny_pairs, family, REPEATING, lookup_min_match=2)
    ids = rt.encode("one two one two one two")
    result = rt.generate(ids, max_tokens=200, no_eos=True)
    assert result.lookup_cycles > 0
    assert result.tokens == plain_greedy(rt.model, ids, 200)
    off = load(tiny_pairs, family, REPEATING, lookup_min_match=None).generate(ids, 200,
                                                                              no_eos=True)
    assert off.lookup_cycles == 0 and off.tokens == result.tokens


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("odds", [0.0, 1e9])
@pytest.mark.parametrize("cut", [None, 0.3])
def test_short_match_choices_stay_lossless(tiny_pairs, family, odds, cut, monkeypatch):
    """Short matches (2 to min_match - 1 tokens) leave the choice to the draft: odds 0 takes
    every repeat, 1e9 none; either way, cut or not, the output is the target's greedy."""
    import engine.cycle

    choices = []

    def counted(*args, **kwargs):
        verify_in, took = choose_proposal(*args, **kwargs)
        choices.append(bool(took))
        return verify_in, took

    choose_proposal = engine.cycle.choose_proposal
    monkeypatch.setattr(engine.cycle, "choose_proposal", counted)
    monkeypatch.setattr(engine.cycle, "REPEAT_ODDS", odds)
    # without the context copy (the CPU default with the cut), which chooses on its own
    rt = load(tiny_pairs, family, REPEATING, lookup_min_match=12, min_draft_confidence=cut,
              copy_odds=None)
    ids = rt.encode("one two three one two three four one two three one two")
    result = rt.generate(ids, max_tokens=120, no_eos=True)
    assert choices and set(choices) == {odds == 0.0}
    assert result.tokens == plain_greedy(rt.model, ids, 120)


def test_choose_proposal_takes_the_repeat_or_the_drafts(tiny_pairs, monkeypatch):
    import engine.cycle
    from engine.cycle import choose_proposal
    from engine.draft_head import build_draft_head

    rt = load(tiny_pairs, "llama")
    ids = rt.encode("one two three")
    repeat = [5, 6, 7, 8] * 4
    for head in (None, build_draft_head(rt.target, list(range(0, 400, 2)), 100, ids)):
        dcache = rt.draft.make_cache()
        prefill(rt.target, rt.target.make_cache(), ids, 512,
                DraftProposer(rt.target, rt.draft, cache=dcache))
        drafted = DraftProposer(rt.target, rt.draft, head, cache=dcache).draft_proposal(3, 16)
        proposer = DraftProposer(rt.target, rt.draft, head=head, cache=dcache)
        logits, out = proposer.draft_logits(3, 16), proposer.output_head
        monkeypatch.setattr(engine.cycle, "REPEAT_ODDS", 0.0)
        verify_in, took = choose_proposal(3, logits, out, repeat)
        assert bool(took) and verify_in.tolist() == [[3] + repeat[:15]]
        # cut on: a taken repeat is verified whole, a draft proposal cut as the proposer cuts it
        verify_in, _ = choose_proposal(3, logits, out, repeat, 0.5)
        assert verify_in.tolist() == [[3] + repeat[:15]]
        monkeypatch.setattr(engine.cycle, "REPEAT_ODDS", 1e9)
        verify_in, took = choose_proposal(3, logits, out, repeat)
        assert not bool(took) and verify_in.tolist() == drafted.tolist()
        verify_in, _ = choose_proposal(3, logits, out, repeat, 0.5)
        cut = DraftProposer(rt.target, rt.draft, head, Plan(min_confidence=0.5), dcache)
        assert verify_in.tolist() == cut.draft_proposal(3, 16).tolist()


def test_rerun_rollback_matches_tape_replay_end_to_end(tiny_pairs):
    tape = load(tiny_pairs, "qwen3_5")
    rerun = DFlashRuntime(tape.model, tape.tokenizer, tape.draft, tape.config,
                          target=adapter_for(tape.model, enable_tape_replay=False))
    assert rerun.target.enable_tape_replay is False
    ids = tape.encode("What is 12 times 7?")
    want = tape.generate(ids, 80, no_eos=True).tokens
    # Also one run per phase-sync mode: profiling must not change the output.
    assert rerun.generate(ids, 80, no_eos=True, profile=True).tokens == want


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block_size", [2, 5])
def test_small_blocks_and_chunked_prefill_stay_lossless(tiny_pairs, family, block_size):
    rt = load(tiny_pairs, family, draft_block_size=block_size)
    rt.prefill_chunk = 3
    ids = rt.encode("The quick brown fox jumps over the lazy dog.")
    result = rt.generate(ids, max_tokens=60, no_eos=True)
    assert max(result.cycle_tokens) <= block_size
    assert result.tokens == plain_greedy(rt.model, ids, 60)


@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_every_accept_length_commits_right_tokens_and_caches(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    ids = rt.encode("Speculative decoding drafts tokens.")
    truth_gen = plain_greedy(rt.model, ids, 70)
    truth = ids + truth_gen  # truth[position] is the token at that position
    for error_at in list(range(16)) + [16]:  # 16: every draft right (full acceptance)
        cache, oracle = rt.target.make_cache(), TruthOracle(rt, truth, error_at)
        commits = speculative_decode(rt.target, oracle, ids, 64, 16, 512, cache)
        tokens = []
        for commit in commits:
            tokens += commit.tokens
            if commit.cycle is not None:
                assert commit.cycle.accepted == min(error_at, commit.cycle.block_size - 1)
        assert tokens == truth_gen[:64], error_at
        # The last committed token is staged (not yet in the cache): compare with a
        # plain prefill of everything before it.
        fed = ids + tokens[:-1]
        ref = rt.target.make_cache()
        prefill(rt.target, ref, fed, 512)
        assert rt.target.cache_length(cache) == len(fed)
        got_all, want_all = cache_states(cache), cache_states(ref)
        assert len(got_all) == len(want_all) > 0
        for got, want in zip(got_all, want_all):
            assert got.shape == want.shape
            assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item(), error_at
        # The draft's context cache holds exactly the committed tokens' projected features.
        ref_d = DraftProposer(rt.target, rt.draft)
        prefill(rt.target, rt.target.make_cache(), fed, 512, ref_d)
        for got, want in zip(oracle.cache, ref_d.cache):
            assert got.offset == want.offset == len(fed)
            gk, gv = got.keys_and_values()
            wk, wv = want.keys_and_values()
            assert mx.allclose(gk, wk, atol=1e-4).item() and mx.allclose(gv, wv, atol=1e-4).item()


def test_stream_spans_mark_draft_and_target_tokens(tiny_pairs):
    rt = load(tiny_pairs, "qwen3")
    events = list(rt.stream_generate("Hello", max_tokens=30, no_eos=True))
    assert isinstance(events[-1], Finished)
    spans = [e for e in events if isinstance(e, Span)]
    result = events[-1].result
    assert [t for s in spans for t in s.tokens] == result.tokens
    assert "".join(s.text for s in spans) == result.text
    for s in spans:
        if s.cycle is not None:
            assert s.n_draft == s.cycle.accepted and len(s.tokens) == s.n_draft + 1
            assert s.text.startswith(s.draft_text)
    assert spans[-1].stats.generated == 30
    assert result.acceptance_rate == pytest.approx(1 - result.cycles / result.total_tokens)


def test_streamed_text_keeps_the_null_byte_like_decode(tiny_pairs):
    """mlx-lm's BPE streaming detokenizer reads byte 0 as "not a byte" and streamed the
    placeholder "\u0100" where decode gives "\x00": a served reply then differed from the
    final text whenever a model emitted that byte."""
    rt = load(tiny_pairs, "qwen3_5")
    null = rt.tokenizer._tokenizer.convert_tokens_to_ids("\u0100")  # byte-level BPE's 0x00
    other = rt.encode("hi")[-1]
    detok = rt.tokenizer.detokenizer
    for t in (null, other, null):
        detok.add_token(t)
    detok.finalize()
    assert detok.text == rt.tokenizer.decode([null, other, null]) and "\x00" in detok.text

def test_eos_stops_and_is_not_emitted(tiny_pairs):
    rt = load(tiny_pairs, "qwen3")
    ids = rt.encode("Hello world")
    free = plain_greedy(rt.model, ids, 40)
    eos = free[7]
    rt.tokenizer._eos_token_ids = {eos}
    try:
        result = rt.generate(ids, max_tokens=40)
    finally:
        rt.tokenizer._eos_token_ids = {rt.tokenizer.eos_token_id}
    assert result.finish_reason == "stop"
    assert result.tokens == free[: free.index(eos)]


def test_max_ctx_fallback_decodes_with_target_alone(tiny_pairs):
    rt = load(tiny_pairs, "llama", max_ctx=32)
    ids = rt.encode("Hello world")
    result = rt.generate(ids, max_tokens=40, no_eos=True)
    assert not result.speculative and "max_ctx" in result.fallback_reason
    assert result.cycles == 0 and result.tokens == plain_greedy(rt.model, ids, 40)


def test_plain_mode_is_mlx_lm_greedy(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    result = rt.generate(ids, max_tokens=25, no_eos=True, speculative=False)
    assert not result.speculative and result.tokens == plain_greedy(rt.model, ids, 25)


def test_chat_messages_use_the_template(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    messages = [{"role": "user", "content": "hi"}]
    ids = rt.encode(messages)
    assert rt.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert rt.generate(messages, max_tokens=5, no_eos=True).total_tokens == 5


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_confidence_cut_shortens_verifies_and_stays_lossless(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 60)
    sizes = {}
    for cut in (1e-12, 0.5, 1.0):
        proposer = DraftProposer(rt.target, rt.draft, plan=Plan(min_confidence=cut))
        commits = list(speculative_decode(rt.target, proposer, ids, 60, 16, 512))
        assert [t for c in commits for t in c.tokens] == want, cut
        sizes[cut] = [c.cycle.block_size for c in commits if c.cycle]
    assert sizes[1e-12][0] == 16  # every draft clears a tiny cut: the whole block
    assert max(sizes[1.0]) == 2  # none is certain: staged + the first draft only
    assert sum(sizes[1.0]) <= sum(sizes[0.5]) <= sum(sizes[1e-12]) * 2
    cut = load(tiny_pairs, family, min_draft_confidence=0.5)
    assert cut.generate(ids, max_tokens=60, no_eos=True).tokens == want
    with pytest.raises(ValueError, match="min_draft_confidence"):
        DFlashConfig(min_draft_confidence=0.0)


def test_min_confidence_auto_resolves_to_the_default_and_the_flag_parses():
    import argparse

    from engine.config import DEFAULT_MIN_CONFIDENCE, confidence_arg

    assert make_plan(DFlashConfig(), "cpu").min_confidence == DEFAULT_MIN_CONFIDENCE == 0.4
    assert make_plan(DFlashConfig(min_draft_confidence=None), "cpu").min_confidence is None
    assert make_plan(DFlashConfig(min_draft_confidence=0.7), "cpu").min_confidence == 0.7
    assert [confidence_arg(t) for t in ("auto", "off", "0.25")] == ["auto", None, 0.25]
    for bad in ("0", "1.5", "often"):
        with pytest.raises(argparse.ArgumentTypeError, match="probability"):
            confidence_arg(bad)
    with pytest.raises(ValueError, match="min_draft_confidence"):
        DFlashConfig(min_draft_confidence="sometimes")


def test_kernels_mode_reaches_the_adapter(tiny_pairs, monkeypatch):
    """The adapter's kernels option (default: $DFLASH_KERNELS) picks the GatedDeltaNet kernels:
    fused ones where the backend has them, never with "portable"."""
    from engine import device, kernels

    rt = load(tiny_pairs, "qwen3_5")
    monkeypatch.setattr(device, "present", lambda b: True)  # pretend CUDA is here
    monkeypatch.setattr(device, "current", lambda: "cuda")
    monkeypatch.delenv("DFLASH_KERNELS", raising=False)
    assert adapter_for(rt.model).kernels.name == "cuda"
    assert adapter_for(rt.model, kernels="portable").kernels is kernels.PORTABLE
    monkeypatch.setenv("DFLASH_KERNELS", "portable")  # the one off-switch
    assert adapter_for(rt.model).kernels is kernels.PORTABLE
    monkeypatch.setenv("DFLASH_KERNELS", "fast")
    with pytest.raises(ValueError, match="DFLASH_KERNELS"):
        adapter_for(rt.model)
