"""Draft trees (--draft-tree): each cycle's verify holds the likeliest nodes of the tree of the
draft's continuations; the cycle keeps the deepest path the target agrees with."""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
import pytest
from test_branches import Head
from test_cycle_sync import load, reads_per_cycle
from test_token_chain import chained, primed
from tiny_pairs import check_plain_caches, plain_greedy

from engine import DFlashConfig
from engine.config import add_engine_args, config_from_args
from engine.cycle import DraftProposer, speculative_decode
from engine.errors import ConfigError
from engine.kernels import cpu_native, cpu_softmax
from engine.tree import (
    ChainedChoices,
    chained_choices,
    likeliest_nodes,
    likeliest_tree,
    tree_of_nodes,
)


def test_a_sure_draft_gets_a_row_and_an_unsure_one_its_runner_ups():
    tokens = np.array([[10, 11], [20, 21], [30, 31], [40, 41]])
    sure = np.array([[0.9, 0.05], [0.9, 0.05], [0.9, 0.05], [0.9, 0.05]])
    assert likeliest_nodes(tokens, sure, 4) == [(-1, 0, 10), (0, 1, 20), (1, 2, 30),
                                                (2, 3, 40)]
    # unsure at its first slot: both choices there, and the row goes on after each
    split = np.array([[0.5, 0.45], [0.9, 0.05], [0.9, 0.05]])
    assert likeliest_nodes(tokens[:3], split, 4) == [(-1, 0, 10), (-1, 0, 11), (0, 1, 20),
                                                     (1, 1, 20)]
    assert len(likeliest_nodes(tokens[:3], split, 100)) == 2 + 4 + 8  # every node at most


def test_the_context_candidate_joins_the_tree_where_it_weighs_enough():
    tokens = np.array([[10, 11], [20, 21], [30, 31]])
    probs = np.array([[0.9, 0.05], [0.6, 0.3], [0.9, 0.05]])
    paths = []

    def copied(path, slot):  # the context goes on with 25 after 10, weighted 0.8
        paths.append(list(path))
        return (25, 0.8) if path == [10] else None

    found = likeliest_nodes(tokens, probs, 3, copied)
    assert found == [(-1, 0, 10), (0, 1, 25), (1, 2, 30)]  # 25 outweighs the draft's 20
    assert paths[:2] == [[], [10]]  # asked with each node's path
    # a candidate among the top tokens only raises its weight
    found = likeliest_nodes(tokens, probs, 2, lambda path, slot: (21, 0.7) if path else None)
    assert found == [(-1, 0, 10), (0, 1, 21)]


def test_the_tree_puts_the_top_row_first_and_parents_before_children():
    found = [(-1, 0, 10), (-1, 0, 11), (0, 1, 20), (1, 1, 20), (2, 2, 30), (3, 2, 31)]
    tree, order = tree_of_nodes(found, [10, 20, 30])
    assert order == [-1, 0, 2, 4, 1, 3, 5]  # the staged token, the top row, then by slot
    assert tree.parents == (-1, 0, 1, 2, 0, 4, 5)
    assert tree.depths == [0, 1, 2, 3, 1, 2, 3]
    assert tree.path(6) == [0, 4, 5, 6] and tree.path(3) == [0, 1, 2, 3]
    assert all(p < i for i, p in enumerate(tree.parents))


def test_likeliest_tree_proposes_each_node_s_token():
    # 3 drafts over a 5-token head: sure of 1 then 4 then 0 but for slot 0, where 2 is close
    logits = mx.array([[[0.0, 5, 4.8, 0, 0], [0, 0, 0, 0, 9], [9.0, 0, 0, 0, 0]]])
    tree, verify_in = likeliest_tree(7, logits, Head([10, 11, 12, 13, 14]), 6, 3)
    assert verify_in.tolist() == [[7, 11, 14, 10, 12, 14]]
    assert tree.parents == (-1, 0, 1, 2, 0, 4)


def test_a_chain_gives_each_node_the_children_that_follow_its_own_token():
    tokens = np.array([[10, 11], [20, 21], [30, 31]])
    probs = np.array([[0.5, 0.48], [0.5, 0.45], [0.9, 0.05]])
    # the draft's marginals alone follow 11 with 20, the token that comes after 10
    assert likeliest_nodes(tokens, probs, 4) == [(-1, 0, 10), (-1, 0, 11), (0, 1, 20),
                                                 (1, 1, 20)]
    chain = ChainedChoices(  # the chain: 20 after 10, 21 after 11
        before=np.array([[0, 0], [10, 11], [20, 21]]),
        tokens=np.array([[[10, 11], [10, 11]], [[20, 21], [21, 20]], [[30, 31], [30, 31]]]),
        probs=np.array([[[0.5, 0.48], [0.5, 0.48]], [[0.95, 0.03], [0.95, 0.03]],
                        [[0.9, 0.05], [0.9, 0.05]]]))
    assert likeliest_nodes(tokens, probs, 4, chained=chain) == [
        (-1, 0, 10), (-1, 0, 11), (0, 1, 20), (1, 1, 21)]
    assert chain.after(1, [11])[0].tolist() == [21, 20]
    assert chain.after(2, [10, 25]) is None  # a token the chain did not score
    # after the context's 25 the chain has no choices: the draft's own follow it (30, 0.9)
    found = likeliest_nodes(tokens, probs, 6, lambda path, slot: (25, 0.99) if path == [10]
                            else None, chain)
    assert found == [(-1, 0, 10), (0, 1, 25), (-1, 0, 11), (0, 1, 20), (2, 1, 21), (1, 2, 30)]
    # the top row: the chain's greedy walk
    assert chain.walk([10, 20, 30]) == [10, 20, 30]
    first_11 = ChainedChoices(chain.before, chain.tokens[:, :, ::-1].copy(), chain.probs)
    assert first_11.walk([10, 20, 30]) == [11, 20, 31]
    assert first_11.walk([10, 20, 30]) != [11, 21, 30]  # its ranks swapped at every slot


def test_chained_choices_are_the_chains_own_distributions_after_each_top_token(tiny_pairs):
    rt = chained(load(tiny_pairs, "llama"), candidates=3, seed=3)
    proposer = primed(rt, list(range(3, 20)))
    hidden = rt.draft(rt.target.embed(proposer.staged_block(mx.array(7), 16)), proposer.cache)
    head = proposer.output_head
    logits = proposer.draft_logits(7, 16, chained=False)
    choices = chained_choices(rt.draft.chain, hidden, logits, 7, head, rt.target.embed, 3, 4)
    assert choices.before.shape == (15, 3) and choices.tokens.shape == (15, 3, 4)
    assert (choices.before[0] == 7).all()  # slot 0 follows the staged token
    top3 = np.argsort(-np.array(logits[0]), axis=-1)[:, :3]
    assert sorted(choices.before[5]) == sorted(top3[4])  # slot 5 follows slot 4's top 3
    token = int(choices.before[5, 1])
    # slot 5 is the block's 7th position (slot 0 the first after the staged token)
    own = mx.softmax(head(rt.draft.chain(hidden[0, 6], rt.target.embed(mx.array(token)))))
    assert np.allclose(choices.probs[5, 1], np.sort(np.array(own))[::-1][:4], atol=1e-5)
    assert choices.tokens[5, 1, 0] == int(mx.argmax(own))
    # the tree's first nodes are the chain's greedy walk, as far as the tree holds it
    tree, verify_in = likeliest_tree(7, logits, head, 16, 4, chained=choices)
    walk = choices.walk(np.argmax(np.array(logits[0]), -1).tolist())
    depth = next((i for i in range(1, 16) if tree.parents[i] != i - 1), 16) - 1
    assert depth >= 1 and verify_in[0, 1:depth + 1].tolist() == walk[:depth]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("cut", [None, 0.4])
def test_draft_trees_with_a_chain_stay_greedy(tiny_pairs, family, cut):
    rt = chained(load(tiny_pairs, family, draft_tree=True, token_chain=True,
                      min_draft_confidence=cut), seed=5)
    built = []
    proposer = DraftProposer(rt.target, rt.draft, draft_tree=True, min_confidence=cut)
    tree_logits = proposer.tree_logits
    proposer.tree_logits = lambda staged, size: (
        built.append(tree_logits(staged, size)), built[-1])[1]
    for prompt in ("Hello world", "def add(a, b):"):
        ids = rt.encode(prompt)
        proposer.cache = rt.draft.make_cache()
        tokens = [t for c in speculative_decode(rt.target, proposer, ids, 60, 16, 512)
                  for t in c.tokens]
        assert tokens == plain_greedy(rt.model, ids, 60)
    assert built and all(chain is not None for _, chain in built)


class RunnerUpProposer(DraftProposer):
    """A draft tree over made-up draft logits: the target's own continuation `truth` ranked
    first at every slot but the second, where a wrong token is a little likelier."""

    def __init__(self, rt, truth):
        super().__init__(rt.target, rt.draft, draft_tree=True)
        self.truth = truth

    def draft_logits(self, staged, size, chained=True):
        position = self.position
        right = list(self.truth[position + 1: position + size])
        right += [0] * (size - 1 - len(right))
        logits = np.zeros((1, size - 1, self.target.vocab_size), np.float32)
        for j, token in enumerate(right):
            logits[0, j, token] = 4.0
        if size > 2:
            logits[0, 1, (right[1] + 1) % self.target.vocab_size] = 4.2
        return mx.array(logits)

    def propose(self, staged, size, position, room=None):
        self.position = position
        return super().propose(staged, size, position, room)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_kept_runner_up_leaves_the_caches_of_plain_decoding(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    truth = plain_greedy(rt.model, ids, 70)
    proposer = RunnerUpProposer(rt, ids + truth)
    cache = rt.target.make_cache()
    kept = []
    keep_path = rt.target.keep_path
    rt.target.keep_path = lambda c, path, verified: (
        kept.append(list(path)), keep_path(c, path, verified))[1]
    per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 40, 16,
                                                           512, cache))
    assert tokens == truth[:40]
    # a drafted cycle keeps the runner-up at the second slot, off the top row, and runs on
    assert any(len(path) > 3 and path[2] != 2 for path in kept)
    # the tree's read before the verify, the commit's after it (a last cycle of the staged
    # token alone: the commit's)
    assert per_cycle[:-1] and set(per_cycle[:-1]) == {2} and per_cycle[-1] <= 2
    check_plain_caches(rt, cache, proposer.cache, ids + tokens[:-1])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize(("cut", "lookup"), [(None, None), (0.4, None), (None, 2)])
def test_draft_trees_stay_greedy(tiny_pairs, family, cut, lookup):
    # with the lookup on, a short match's repeat is left to the tree (its tokens are there
    # where the draft ranks them)
    rt = load(tiny_pairs, family, draft_tree=True, lookup_min_match=lookup,
              min_draft_confidence=cut)
    assert rt.describe()["draft_tree"] is True
    assert rt.describe()["prefetch_draft"] is False
    assert rt.describe()["copy_odds"] == (0.1 if cut else None)  # the CPU's auto: with the cut
    sizes = []
    forward_tree = rt.target.forward_tree
    rt.target.forward_tree = lambda tokens, cache, taps, depths, ancestry: (
        sizes.append(len(depths)), forward_tree(tokens, cache, taps, depths, ancestry))[1]
    for prompt in ("Hello world", "def add(a, b):"):
        ids = rt.encode(prompt)
        out = rt.generate(ids, max_tokens=80, no_eos=True)
        assert out.tokens == plain_greedy(rt.model, ids, 80)
    assert sizes and (max(sizes) == 16 if cut is None else min(sizes) < 16)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_draft_trees_stay_greedy_through_the_cpu_kernels(tiny_pairs, family, monkeypatch):
    if cpu_softmax.library() is None:
        pytest.skip(f"no kernel here: {cpu_softmax.status().reason}")
    monkeypatch.setenv(cpu_native.ENV, "on")
    rt = load(tiny_pairs, family, draft_tree=True)
    for prompt in ("Hello world", "def add(a, b):"):
        ids = rt.encode(prompt)
        assert rt.generate(ids, max_tokens=80, no_eos=True).tokens == plain_greedy(
            rt.model, ids, 80)


def test_draft_trees_need_greedy_cycles_and_an_attention_target(tiny_pairs):
    assert load(tiny_pairs, "qwen3_5", draft_tree=True).describe()["draft_tree"] is False
    sampled = load(tiny_pairs, "llama", draft_tree=True)
    out = sampled.generate("Hello", max_tokens=24, no_eos=True, temperature=0.8, seed=1)
    assert len(out.tokens) == 24  # sampled cycles propose one row
    assert DFlashConfig().draft_tree is False
    for other in ({"siblings": (3, 3)}, {"branches": (4, 2)}):
        with pytest.raises(ConfigError, match="one kind of tree"):
            DFlashConfig(draft_tree=True, **other)
    with pytest.raises(ConfigError, match="draft_tree"):
        DFlashConfig(draft_tree="yes")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--draft-tree", "on"])).draft_tree is True
    assert config_from_args(parser.parse_args([])).draft_tree is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--draft-tree", "maybe"])
