"""A draft proposing from a token subset: head rows equal the target's logits, proposals stay
inside the subset, and the output is still the target's own greedy output."""

from __future__ import annotations

import argparse
import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, prefill, speculative_decode
from engine.draft_head import DraftHead, build_draft_head
from engine.loading import load_target
from engine.plan import Plan, make_plan
from engine.targets import adapter_for

FAMILIES = ["llama", "qwen3", "qwen3_5"]  # tied head, untied head, hybrid with untied head


def adapter(tiny_pairs, family, quantized=False):
    target_dir, _ = tiny_pairs(family)
    model, _, _ = load_target(str(target_dir))
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    return adapter_for(model)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_head_rows_equal_the_heads_logits(tiny_pairs, family, quantized):
    target = adapter(tiny_pairs, family, quantized)
    head, tied = target._head()
    assert tied == (family == "llama")
    kind = {True: nn.QuantizedEmbedding if tied else nn.QuantizedLinear,
            False: nn.Embedding if tied else nn.Linear}[quantized]
    assert type(head) is kind  # each head type is really exercised
    ids = mx.array([0, 3, 17, 100, 200, target.vocab_size - 1], dtype=mx.int32)
    hidden = mx.random.normal((2, 5, target.hidden_size), key=mx.random.key(1))
    rows = target.head_rows(ids)
    assert rows.shape == (6, target.hidden_size)
    want = target.lm_head(hidden)[..., ids]
    assert mx.allclose(hidden @ rows.T, want, atol=1e-5, rtol=1e-5).item()
    # an input-embedding multiplier (Granite-style) scales embed(), never the head
    target.args.embedding_multiplier = 3.0
    assert mx.array_equal(target.head_rows(ids), rows).item()


def test_head_rows_refuse_heads_that_are_more_than_a_projection(tiny_pairs):
    target = adapter(tiny_pairs, "qwen3")
    ids = mx.array([1, 2], dtype=mx.int32)
    target.args.logits_scaling = 4.0  # Granite-style logits / scale
    assert target.head_rows(ids) is None
    del target.args.logits_scaling
    target.model.lm_head = nn.Linear(target.hidden_size, target.vocab_size, bias=True)
    assert target.head_rows(ids) is None  # rows alone would drop the bias
    target.model.lm_head = nn.Sequential(nn.Linear(target.hidden_size, target.vocab_size))
    assert target.head_rows(ids) is None  # an unknown module
    assert build_draft_head(target, list(range(50)), 256).ids is None  # -> the full head


def test_build_draft_head_is_top_k_plus_the_prompt(tiny_pairs):
    target = adapter(tiny_pairs, "llama")
    ranking = list(range(300, 0, -1))
    head = build_draft_head(target, ranking, 256, prompt=[3, 5, 299, 10_000])
    ids = head.ids.tolist()
    assert ids == sorted(set(range(45, 301)) | {3, 5})  # out-of-vocab prompt ids are dropped
    assert head.size == len(ids) and head.weight.shape == (len(ids), target.hidden_size)
    assert mx.array_equal(head.weight, target.inner.embed_tokens.weight[head.ids]).item()
    assert head.token_ids(mx.array([0, 2])).tolist() == [3, 45]
    for full in (build_draft_head(target, None, 256), build_draft_head(target, ranking, None),
                 build_draft_head(target, list(range(target.vocab_size)), 8192)):
        assert full.ids is None and full.size == target.vocab_size
        assert full.token_ids(mx.array([7])).tolist() == [7]


def small_subset(target, truth):
    """A subset holding only every third token the target writes: most proposals miss."""
    seen = sorted(set(truth))
    keep = sorted(set(seen[::3]) | set(range(0, target.vocab_size, 7)))
    subset = mx.array(keep, dtype=mx.int32)
    return DraftHead(target, subset, target.head_rows(subset)), set(keep)


@pytest.mark.parametrize("family", FAMILIES)
def test_subset_head_is_lossless_and_proposes_only_subset_tokens(tiny_pairs, family):
    rt = DFlashRuntime.from_pretrained(model=str(tiny_pairs(family)[0]),
                                       draft=str(tiny_pairs(family)[1]),
                                       config=DFlashConfig(min_draft_confidence=None))
    target, draft = rt.target, rt.draft
    ids = rt.encode("What is 12 times 7?")
    want = plain_greedy(target.model, ids, 80)
    head, keep = small_subset(target, want)
    outside = [t for t in want if t not in keep]
    assert len(outside) > len(want) // 3  # the target often writes tokens the draft cannot
    for cut in (None, 0.3):
        proposer = DraftProposer(target, draft, head, Plan(min_confidence=cut))
        commits = list(speculative_decode(target, proposer, ids, 80, 16, 512))
        assert [t for c in commits for t in c.tokens] == want, cut

    # Every proposal lies in the subset; the full head does propose tokens outside it.
    cache, proposer = target.make_cache(), DraftProposer(target, draft)
    prefill(target, cache, ids, 512, proposer)
    dcache = proposer.cache
    drafted, full = set(), set()
    for staged in range(0, target.vocab_size, 11):
        subset = DraftProposer(target, draft, head, cache=dcache).draft_proposal(staged, 16)
        drafted |= set(subset[0, 1:].tolist())
        whole = DraftProposer(target, draft, cache=dcache).draft_proposal(staged, 16)
        full |= set(whole[0, 1:].tolist())
    assert drafted <= keep
    assert full - keep


def test_subset_indices_map_back_to_token_ids(tiny_pairs):
    """The tiny llama answers this prompt with two token ids only: a head over exactly those
    two proposes them, so long runs land (indices 0/1 instead of the ids would land none)."""
    target_dir, draft_dir = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target_dir), draft=str(draft_dir),
                                       config=DFlashConfig(min_draft_confidence=None))
    ids = rt.encode("What is 12 times 7?")
    want = plain_greedy(rt.target.model, ids, 80)
    subset = mx.array(sorted(set(want)), dtype=mx.int32)
    assert subset.size == 2 and subset.tolist() != [0, 1]
    head = DraftHead(rt.target, subset, rt.target.head_rows(subset))
    commits = list(speculative_decode(rt.target, DraftProposer(rt.target, rt.draft, head), ids,
                                      80, 16, 512))
    assert [t for c in commits for t in c.tokens] == want
    assert sum(c.n_draft for c in commits) > 40


# -- the setting, end to end ---------------------------------------------------------------
@pytest.fixture
def ranked(tiny_pairs, tmp_path):
    """The tiny llama pair, its draft given a 310-token ranking (the vocabulary is 320)."""
    target, draft = tiny_pairs("llama")
    copy = tmp_path / "ranked-draft"
    shutil.copytree(draft, copy)
    ranking = list(range(319, 9, -1))
    (copy / "token_ranking.json").write_text(
        json.dumps({"version": 1, "source": "test", "token_ids": ranking}))
    return target, copy, ranking


def test_draft_vocab_config_validates_and_auto_is_cpu_only():
    from engine.config import CPU_DRAFT_VOCAB
    from engine.errors import ConfigError

    auto = DFlashConfig()
    assert auto.draft_vocab == "auto"
    ranked = list(range(1 << 14))  # a draft's token ranking
    assert make_plan(auto, "cpu", ranking=ranked).draft_vocab == CPU_DRAFT_VOCAB == 8192
    assert make_plan(auto, "cpu").draft_vocab is None  # published drafts: no ranking
    assert make_plan(auto, "cuda", ranking=ranked).draft_vocab is None
    assert make_plan(auto, "metal", ranking=ranked).draft_vocab is None
    assert make_plan(DFlashConfig(draft_vocab=4096), "cuda", ranking=ranked).draft_vocab == 4096
    assert make_plan(DFlashConfig(draft_vocab=4096), "cpu").draft_vocab is None
    assert make_plan(DFlashConfig(draft_vocab=None), "cpu", ranking=ranked).draft_vocab is None
    assert DFlashConfig(draft_vocab=256).draft_vocab == 256
    for bad in (255, 0, -8, "sometimes", "8192", 8192.0, True):
        with pytest.raises(ConfigError, match=r"draft_vocab=.*at least 256, 'auto' or None"):
            DFlashConfig(draft_vocab=bad)


def test_draft_vocab_flag_parses_for_generate_and_benchmark():
    from engine.bench.compare import build_parser as bench_parser
    from engine.config import config_from_args, vocab_arg

    assert [vocab_arg(t) for t in ("auto", "off", "256", "8192")] == ["auto", None, 256, 8192]
    for bad in ("255", "many", "0.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="at least 256, 'auto' or 'off'"):
            vocab_arg(bad)
    bench = bench_parser()
    assert config_from_args(bench.parse_args(["--prompt", "x"])).draft_vocab == "auto"
    args = bench.parse_args(["--prompt", "x", "--draft-vocab", "4096"])
    assert config_from_args(args).draft_vocab == 4096
    args = bench.parse_args(["--prompt", "x", "--draft-vocab", "off"])
    assert config_from_args(args).draft_vocab is None


def test_runtime_builds_the_head_per_request_and_stays_lossless(tiny_pairs, ranked,
                                                                monkeypatch):
    import engine.runtime

    target, draft, ranking = ranked
    heads = []
    real = engine.runtime.speculative_decode

    def spy(*args, **kwargs):  # the head the runtime hands the loop
        heads.append(args[1].head)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runtime, "speculative_decode", spy)
    for setting, effective in ((300, 300), ("auto", 310), (None, None)):
        rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                           config=DFlashConfig(draft_vocab=setting,
                                                               min_draft_confidence=None))
        assert rt.token_ranking == ranking
        assert rt.plan.draft_vocab == rt.describe()["draft_vocab"] == effective
        ids = rt.encode("def add(a, b):")
        result = rt.generate(ids, max_tokens=40, no_eos=True)
        assert result.speculative and result.tokens == plain_greedy(rt.target.model, ids, 40)
        want = None if effective is None else sorted(set(ranking[:effective]) | set(ids))
        assert (heads[-1].ids.tolist() if heads[-1].ids is not None else None) == want
    # a draft without a ranking (the fixture's own): the full head, whatever the setting
    plain = DFlashRuntime.from_pretrained(model=str(target), draft=str(tiny_pairs("llama")[1]),
                                          config=DFlashConfig(draft_vocab=300))
    assert plain.plan.draft_vocab is None and plain.describe()["draft_vocab"] is None


def test_cli_reports_the_draft_vocab(ranked, tmp_path, capsys):
    from engine.bench.compare import benchmark_main
    from engine.cli import main

    target, draft, _ = ranked
    base = ["generate", "--model", str(target), "--draft", str(draft), "--prompt", "Hi",
            "--max-tokens", "8", "--no-eos"]
    assert main(base + ["--draft-vocab", "256"]) == 0
    assert "verify cut p<0.4, draft vocab 256" in capsys.readouterr().err
    assert main(base + ["--draft-vocab", "off"]) == 0
    assert "draft vocab" not in capsys.readouterr().err
    out = tmp_path / "report.json"
    assert benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                           "--max-tokens", "8", "--draft-vocab", "300", "--json",
                           str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["draft_vocab"] == report["model"]["draft_vocab"] == 300
    assert report["summary"]["token_match"] and "draft_vocab" in report["definitions"]
