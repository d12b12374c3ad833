"""Proposal trees (--branches): beside the draft's own row, rows that take its runner-up at one
of its first slots; the target verifies them all in one forward and the cycle keeps the row
that runs furthest, its keys and values only."""

from __future__ import annotations

import argparse

import mlx.core as mx
import pytest
from test_cycle_sync import load, reads_per_cycle
from tiny_pairs import TruthOracle, check_plain_caches, plain_greedy

from engine import DFlashConfig
from engine.config import add_engine_args, config_from_args
from engine.cycle import (
    accept_rows,
    branch_rows,
    speculative_decode,
)
from engine.draft_head import DraftHead
from engine.errors import ConfigError
from engine.kernels import cpu_softmax, cpu_swiglu


class Head:
    """A draft head over the token subset `ids` (index i is token ids[i])."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = mx.array(ids)

    def token_ids(self, index: mx.array) -> mx.array:
        return self.ids[index]


def test_branch_rows_put_each_runner_up_at_its_slot():
    # 3 drafts over a 5-token head; the draft ranks 1 > 2 > 3 at slot 0, 4 > 0 at slot 1...
    logits = mx.array([[[0.0, 9, 8, 7, 1], [6, 1, 2, 3, 9], [5, 4, 3, 2, 1]]])
    head = Head([10, 11, 12, 13, 14])
    assert branch_rows(7, logits, head, 2, 2).tolist() == [
        [7, 11, 14, 10],  # the draft's own
        [7, 12, 14, 10],  # its 2nd choice at slot 0
        [7, 11, 10, 10]]  # ... at slot 1
    rows = branch_rows(7, logits, head, 1, 3).tolist()
    assert rows == [[7, 11, 14, 10], [7, 12, 14, 10], [7, 13, 14, 10]]
    assert len(branch_rows(7, logits, head, 15, 4)) == 1 + 3 * 3  # as many slots as drafted


def test_accept_rows_keeps_the_row_that_runs_furthest():
    rows = mx.array([[7, 1, 2, 3], [7, 5, 2, 3], [7, 1, 6, 3]])
    vocab = 8

    def logits_for(choices):  # the target's argmax at each position of each row
        return mx.stack([mx.stack([mx.arange(vocab) == c for c in r]) for r in choices]
                        ).astype(mx.float32)

    # the target wants 1, 6, 3 after 7: row 2 runs 3, the draft's row 1
    best, a, choice = accept_rows(rows, logits_for([[1, 2, 0, 4], [1, 0, 0, 4],
                                                    [1, 6, 3, 4]]))
    assert (best.item(), a.item(), choice.tolist()) == (2, 3, [1, 6, 3, 4])
    # a tie keeps the draft's own row
    best, a, _ = accept_rows(rows, logits_for([[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]))
    assert (best.item(), a.item()) == (0, 1)


class TreeOracle(TruthOracle):
    """Two rows: every draft wrong first, the target's own continuation second."""

    def propose(self, staged, size, position, room=None):
        right = list(self.truth[position + 1: position + size])
        right += [0] * (size - 1 - len(right))
        wrong = [(t + 1) % 50 for t in right]
        return mx.array([[staged] + wrong, [staged] + right])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_kept_branch_leaves_the_caches_of_plain_decoding(tiny_pairs, family, monkeypatch):
    # MLX's own ops: the CPU kernels read their inputs (a sync per layer) at a tree's sizes
    monkeypatch.setattr(cpu_softmax, "library", lambda: None)
    monkeypatch.setattr(cpu_swiglu, "library", lambda: None)
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    truth_gen = plain_greedy(rt.model, ids, 70)
    cache, oracle = rt.target.make_cache(), TreeOracle(rt, ids + truth_gen)
    per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, oracle, ids, 64, 16, 512,
                                                           cache))
    assert tokens == truth_gen[:64] and set(per_cycle) == {1}  # still one read per cycle
    assert len(per_cycle) == 4  # 16 tokens a cycle: the branch row, all right
    check_plain_caches(rt, cache, oracle.cache, ids + tokens[:-1])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_draft_trees_stay_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family, branches=(4, 3), lookup_min_match=None)
    assert rt.describe()["branches"] == [4, 3]
    kept = []
    keep_row = rt.target.keep_row
    rt.target.keep_row = lambda cache, row: (kept.append(int(row)), keep_row(cache, row))[1]
    for prompt in ("Hello world", "def add(a, b):"):
        ids = rt.encode(prompt)
        want = plain_greedy(rt.model, ids, 100)
        out = rt.generate(ids, max_tokens=100, no_eos=True)
        assert out.tokens == want
    assert kept and max(kept) < 1 + 4 * 2  # every drafted cycle verified a tree of 9 rows


def test_trees_need_greedy_whole_blocks_and_an_attention_target(tiny_pairs):
    assert load(tiny_pairs, "qwen3_5", branches=(4, 2)).describe()["branches"] is None
    auto = load(tiny_pairs, "llama", branches=(4, 2), min_draft_confidence="auto")
    assert auto.describe()["branches"] == [4, 2] and auto.min_confidence is None  # whole
    with pytest.raises(ConfigError, match="a tree is verified whole"):
        DFlashConfig(branches=(4, 2), min_draft_confidence=0.4)
    sampled = load(tiny_pairs, "llama", branches=(4, 2))
    out = sampled.generate("Hello", max_tokens=24, no_eos=True, temperature=0.8, seed=1)
    assert len(out.tokens) == 24  # sampled cycles propose one row
    assert DFlashConfig().branches is None
    for bad in ((0, 2), (4, 1), (16, 2), (4, 9), [4, 2], (4, True)):
        with pytest.raises(ConfigError, match="branches"):
            DFlashConfig(branches=bad)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--branches", "4x2"])).branches == (4, 2)
    assert config_from_args(parser.parse_args(["--branches", "off"])).branches is None
    for bad in ("4", "4x1", "x2", "0x2"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--branches", bad])


def test_a_full_head_ranks_tokens_by_id(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    logits = mx.zeros((1, 2, rt.target.vocab_size)).at[0, 0, 9].add(1.0).at[0, 1, 4].add(1.0)
    rows = branch_rows(3, logits, DraftHead(rt.target), 1, 2).tolist()
    assert rows[0] == [3, 9, 4] and rows[1][0] == 3 and rows[1][2] == 4 and rows[1][1] != 9
