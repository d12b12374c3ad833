"""A verify cut padded to a length the machine runs faster (engine/verify_lengths.py): the
lengths picked from measured costs, the measurement kept once per machine, and the output
still the target's own greedy tokens."""

from __future__ import annotations

import json

import pytest
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime, verify_lengths
from engine.cli import main as cli_main
from engine.cycle import DraftProposer, padded, speculative_decode
from engine.errors import ConfigError
from engine.plan import Plan


def load(tiny_pairs, family, **config):
    target, draft = tiny_pairs(family)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(**config))


def test_each_cut_verifies_the_cheapest_length_at_or_above_it():
    #        T = 1    2    3    4    5    6
    costs = [5.0, 6.0, 6.0, 4.0, 7.0, 5.0]
    assert verify_lengths.padded_lengths(costs) == (0, 4, 4, 4, 4, 6, 6)
    assert verify_lengths.padded_lengths([3.0, 3.0]) == (0, 2, 2)  # a tie: the longer
    assert verify_lengths.padded_lengths([1.0, 2.0, 3.0]) == (0, 1, 2, 3)  # monotone: as cut
    # a longer verify within the tolerance of the cheapest counts as cheapest (noise)
    assert verify_lengths.padded_lengths([10.0, 10.5]) == (0, 2, 2)
    assert verify_lengths.padded_lengths([10.0, 10.5], tolerance=0.0) == (0, 1, 2)


def test_padded_stays_within_the_proposal():
    lengths = (0, 1, 4, 4, 4, 8, 8, 8, 8)
    assert padded(2, 16, lengths) == 4
    assert padded(5, 6, lengths) == 6  # a reply's short last block: what was proposed
    assert padded(12, 16, lengths) == 12  # beyond the table: the cut's own
    assert padded(3, 16, ()) == 3


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_padded_verifies_stay_plain_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family, min_draft_confidence=None)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 60)
    lengths = (0, 1, 5, 5, 5, 5, 7, 7, 16, 16, 16, 16, 16, 16, 16, 16, 16)
    proposer = DraftProposer(rt.target, rt.draft,
                             plan=Plan(min_confidence=1.0, verify_lengths=lengths))
    commits = list(speculative_decode(rt.target, proposer, ids, 60, 16, 512))
    assert [t for c in commits for t in c.tokens] == want
    sizes, emitted = set(), len(commits[0].tokens)
    for commit in commits[1:]:
        if 60 - emitted >= 5:  # room for 5 (near the end a cycle proposes what is left)
            sizes.add(commit.cycle.block_size)
        emitted += len(commit.tokens)
    assert sizes == {5}  # no draft is certain: the cut keeps 2, verified as 5


def test_measure_times_every_length_and_leaves_the_cache_as_it_was(tiny_pairs):
    rt = load(tiny_pairs, "qwen3_5", min_draft_confidence=None)
    costs = verify_lengths.measure(rt.target, rt.draft.args.target_layer_ids, 6, rounds=1,
                                   context=8)
    assert len(costs) == 6 and all(0 < c < 10 for c in costs)


def test_a_plain_steps_cost_comes_from_the_measured_verify_costs(tiny_pairs, monkeypatch):
    """The pacer's start: the 1-token verify cost where the costs by length are known (no
    forward timed at load), else a timing of queued plain steps."""
    rt = load(tiny_pairs, "llama", min_draft_confidence=None)
    taps = rt.draft.args.target_layer_ids
    monkeypatch.setattr(verify_lengths, "queued_step_s", lambda *a: pytest.fail("timed"))
    assert verify_lengths.plain_step_s(rt.target, taps, [250.0, 300.0]) == 0.25
    monkeypatch.setattr(verify_lengths, "queued_step_s", lambda *a: [0.3, 0.1, 0.2])
    assert verify_lengths.plain_step_s(rt.target, taps) == 0.2


def test_the_timed_plain_steps_are_queued_as_a_paused_stretch_queues_them(tiny_pairs,
                                                                          monkeypatch):
    """Each step is queued before the last one's token is read (PlainSteps), so where the
    host's graph building overlaps the device's work (a GPU) the start is what a paused step
    costs."""
    from engine.plain import PlainSteps

    rt = load(tiny_pairs, "llama", min_draft_confidence=None)
    reads, read = [], PlainSteps.read
    monkeypatch.setattr(PlainSteps, "read", lambda self, more: (reads.append(more),
                                                                read(self, more))[1])
    per_step = verify_lengths.queued_step_s(rt.target, rt.draft.args.target_layer_ids,
                                            rounds=2, context=8, steps=4)
    assert len(per_step) == 2 and all(0 < s < 10 for s in per_step)
    assert reads == [True, True, True, False] * 3  # a warm-up run, then the timed ones


def test_the_measurement_is_kept_and_reused(tiny_pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(target, tap_ids, size, rounds=3, context=128):
        calls.append(size)
        return [1.0] * (size - 8) + [0.5] * 8  # 9..16 the cheapest: every cut verifies 16

    monkeypatch.setattr(verify_lengths, "measure", fake_measure)
    said: list[str] = []
    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                       config=DFlashConfig(min_draft_confidence=0.5),
                                       progress=lambda message, _: said.append(message))
    assert rt.describe()["verify_lengths"] == [0] + [16] * 16
    assert calls == [16] and any("verify lengths" in m for m in said)  # the wait is named
    files = list((tmp_path / verify_lengths.FOLDER).glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["costs_ms"][-1] == 500.0
    load(tiny_pairs, "llama", min_draft_confidence=0.5)
    assert calls == [16]  # read back, not measured again
    load(tiny_pairs, "llama", min_draft_confidence=0.5, draft_block_size=8)
    assert calls == [16, 8]  # another block size: another measurement
    files[0].write_text("{not json")
    load(tiny_pairs, "llama", min_draft_confidence=0.5)
    assert calls == [16, 8, 16]  # a damaged file is measured again


def test_no_padding_without_the_cut_or_when_turned_off(tiny_pairs, monkeypatch):
    monkeypatch.setattr(verify_lengths, "measure", lambda *a, **k: pytest.fail("measured"))
    assert load(tiny_pairs, "llama", min_draft_confidence=None).describe()[
        "verify_lengths"] is None
    off = load(tiny_pairs, "llama", min_draft_confidence=0.5, padded_verify=False)
    assert off.describe()["verify_lengths"] is None
    with pytest.raises(ConfigError, match="padded_verify"):
        DFlashConfig(padded_verify="yes")


def test_the_flag_turns_it_off(tiny_pairs, capsys, monkeypatch):
    monkeypatch.setattr(verify_lengths, "measure", lambda *a, **k: pytest.fail("measured"))
    target, draft = tiny_pairs("llama")
    assert cli_main(["generate", "--model", str(target), "--draft", str(draft), "--prompt",
                     "hi", "--max-tokens", "4", "--verify-padding", "off"]) == 0
    assert capsys.readouterr().out

