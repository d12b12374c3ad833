"""Sibling trees (--siblings): a verify of the block's length holds the draft's row, shortened,
and single tokens beside it, its runner-ups at its first slots; the cycle keeps the deepest
path the target agrees with, and only that path's keys, values and taps."""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
import pytest
from test_branches import Head
from test_cycle_sync import load, reads_per_cycle
from tiny_pairs import TruthOracle, check_plain_caches, plain_greedy

from engine import DFlashConfig
from engine.config import add_engine_args, config_from_args
from engine.cycle import prefill, speculative_decode
from engine.errors import ConfigError
from engine.kernels import cpu_native, cpu_softmax
from engine.targets import cpu_attention
from engine.tree import SiblingTree, accept_tree, sibling_tree, tree_proposal


def test_a_tree_shape_fits_the_block():
    tree = sibling_tree(16, 3, 3)
    assert (tree.main, tree.slots, tree.choices, tree.size) == (9, 3, 3, 16)
    assert tree.parents == [-1, *range(9), 0, 0, 1, 1, 2, 2]
    assert tree.depths == [*range(10), 1, 1, 2, 2, 3, 3]
    assert tree.path(12) == [0, 1, 12] and tree.path(9) == list(range(10))
    assert tree.ancestry[14].tolist() == [True, True, True] + [False] * 11 + [True, False]
    short = sibling_tree(5, 3, 3)  # a short last block: fewer slots, the chain keeps as many
    assert (short.main, short.slots) == (2, 1)
    assert sibling_tree(2, 3, 2) is None and sibling_tree(3, 1, 2) == SiblingTree(1, 1, 2)


def test_tree_proposal_puts_each_runner_up_beside_its_slot():
    # 3 drafts over a 5-token head; the draft ranks 1 > 2 > 3 at slot 0, 4 > 3 > 2 at slot 1
    logits = mx.array([[[0.0, 9, 8, 7, 1], [6, 1, 2, 3, 9], [5, 4, 3, 2, 1]]])
    head = Head([10, 11, 12, 13, 14])
    tree = SiblingTree(main=2, slots=2, choices=2)
    assert tree_proposal(7, logits, head, tree).tolist() == [[7, 11, 14, 12, 10]]
    tree = SiblingTree(main=2, slots=1, choices=3)
    assert tree_proposal(7, logits, head, tree).tolist() == [[7, 11, 14, 12, 13]]


def one_hot_logits(choices: list[int], vocab: int = 20) -> mx.array:
    """Verify logits [1, T, vocab] whose argmax at node i is choices[i]."""
    return (mx.arange(vocab)[None] == mx.array(choices)[:, None]).astype(mx.float32)[None]


def test_accept_tree_keeps_the_deepest_agreeing_path():
    tree = SiblingTree(main=4, slots=2, choices=2)  # nodes: 0 staged, 1-4 chain, 5 | 0, 6 | 1
    verify_in = mx.array([[7, 1, 2, 3, 4, 5, 6]])
    # the target: 1 after 7, then 6 (not the chain's 2): the sibling at slot 2 (node 6), then 9
    node, a, tokens, following = accept_tree(verify_in, one_hot_logits([1, 6, 0, 0, 0, 0, 9]),
                                             tree)
    assert (node.item(), a.item(), following.item()) == (6, 2, 9)
    assert tokens.tolist()[:3] == [7, 1, 6]
    # the chain agrees to its end: it is kept whole, the target's token after it follows
    node, a, tokens, following = accept_tree(verify_in, one_hot_logits([1, 2, 3, 4, 8, 0, 0]),
                                             tree)
    assert (node.item(), a.item(), following.item()) == (4, 4, 8)
    assert tokens.tolist()[:5] == [7, 1, 2, 3, 4]
    # the sibling at slot 1 (node 5) is the target's token: it is kept, then the token after it
    node, a, _, following = accept_tree(verify_in, one_hot_logits([5, 0, 0, 0, 0, 11, 0]), tree)
    assert (node.item(), a.item(), following.item()) == (5, 1, 11)
    # nothing agrees: the staged token alone, and the target's token after it
    node, a, _, following = accept_tree(verify_in, one_hot_logits([3, 0, 0, 0, 0, 0, 0]), tree)
    assert (node.item(), a.item(), following.item()) == (0, 0, 3)
    # a sibling whose parent was wrong is not kept, even where it matches its parent's choice
    node, a, _, _ = accept_tree(verify_in, one_hot_logits([9, 6, 0, 0, 0, 0, 0]), tree)
    assert (node.item(), a.item()) == (0, 0)


class SiblingOracle(TruthOracle):
    """A sibling tree whose chain is wrong from its second slot, with the target's own token
    as the sibling there: every cycle keeps the sibling's path (2 drafts, then the bonus)."""

    def propose(self, staged, size, position, room=None):
        self.tree = sibling_tree(size, 3, 2)
        if self.tree is None:
            return super().propose(staged, size, position, room)
        right = list(self.truth[position + 1: position + size])
        right += [0] * (max(size - 1, 3) - len(right))
        chain = [right[0]] + [(t + 1) % 50 for t in right[1:self.tree.main]]
        siblings = [(right[0] + 1) % 50, right[1], (right[2] + 1) % 50][:self.tree.slots]
        return mx.array([[staged] + chain + siblings])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_kept_sibling_leaves_the_caches_of_plain_decoding(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    truth_gen = plain_greedy(rt.model, ids, 70)
    cache, oracle = rt.target.make_cache(), SiblingOracle(rt, ids + truth_gen)
    oracle.tree = None
    per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, oracle, ids, 40, 16, 512,
                                                           cache))
    assert tokens == truth_gen[:40] and set(per_cycle) == {1}  # still one read per cycle
    check_plain_caches(rt, cache, oracle.cache, ids + tokens[:-1])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_sibling_trees_stay_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family, siblings=(3, 3), lookup_min_match=None)
    assert rt.describe()["siblings"] == [3, 3]
    kept = []
    keep_path = rt.target.keep_path
    rt.target.keep_path = lambda cache, path, verified: (
        kept.append(list(path)), keep_path(cache, path, verified))[1]
    for prompt in ("Hello world", "def add(a, b):"):
        ids = rt.encode(prompt)
        want = plain_greedy(rt.model, ids, 100)
        out = rt.generate(ids, max_tokens=100, no_eos=True)
        assert out.tokens == want
    assert kept  # drafted cycles verified trees (SiblingOracle's keep their siblings)


def test_sibling_attention_masks_the_rest_of_the_tree(tiny_pairs):
    # a node's logits are those of its own path verified alone: its position, its ancestors
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    tree = SiblingTree(main=4, slots=2, choices=2)
    tokens = [ids[-1], 5, 6, 7, 8, 9, 10]
    cache = rt.target.make_cache()
    prefill(rt.target, cache, ids[:-1], 512)
    rt.target.begin_verify(cache)
    logits, _ = rt.target.forward_tree(mx.array([tokens]), cache, [], tree.depths,
                                       tree.ancestry)
    rt.target.keep_path(cache, [], verified=tree.size)
    for node in (3, 6):
        path = tree.path(node)
        alone, _ = rt.target.forward(mx.array([[tokens[i] for i in path]]), cache, [])
        rt.target.rollback(cache, keep=0, verified=len(path))
        assert np.allclose(np.array(logits[0, node]), np.array(alone[0, -1]), atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_with_the_cut_siblings_fill_the_padding(tiny_pairs, family):
    rt = load(tiny_pairs, family, siblings=(3, 2), lookup_min_match=None,
              min_draft_confidence=0.4, padded_verify=False)
    rt.verify_lengths = [0, *([8] * 8), *([16] * 8)]  # every cut padded to 8 or 16
    sizes = []
    forward_tree = rt.target.forward_tree
    # (verify length, siblings: the nodes past the chain, whose last node is the deepest)
    rt.target.forward_tree = lambda tokens, cache, taps, depths, ancestry: (
        sizes.append((len(depths), len(depths) - 1 - max(depths))),
        forward_tree(tokens, cache, taps, depths, ancestry))[1]
    ids = rt.encode("Hello world")
    out = rt.generate(ids, max_tokens=60, no_eos=True)
    assert out.tokens == plain_greedy(rt.model, ids, 60)
    # the tiny draft is unsure: each cut keeps one draft, padded to 8, and 3 siblings (the
    # reply's last cycles verify what room is left)
    assert len(sizes) > 40 and sizes[:40] == [(8, 3)] * 40


def test_siblings_need_greedy_cycles_and_an_attention_target(tiny_pairs):
    assert load(tiny_pairs, "qwen3_5", siblings=(3, 3)).describe()["siblings"] is None
    auto = load(tiny_pairs, "llama", siblings=(3, 3), min_draft_confidence="auto")
    assert auto.describe()["siblings"] == [3, 3] and auto.min_confidence == 0.4  # the cut
    with pytest.raises(ConfigError, match="one kind of tree"):
        DFlashConfig(siblings=(3, 3), branches=(4, 2))
    sampled = load(tiny_pairs, "llama", siblings=(3, 3))
    out = sampled.generate("Hello", max_tokens=24, no_eos=True, temperature=0.8, seed=1)
    assert len(out.tokens) == 24  # sampled cycles propose one row
    assert DFlashConfig().siblings is None
    for bad in ((0, 2), (3, 1), (16, 2), (3, 9), [3, 3], (3, True)):
        with pytest.raises(ConfigError, match="siblings"):
            DFlashConfig(siblings=bad)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--siblings", "3x3"])).siblings == (3, 3)
    assert config_from_args(parser.parse_args(["--siblings", "off"])).siblings is None
    for bad in ("3", "3x1", "x2", "0x2"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--siblings", bad])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_sibling_trees_stay_greedy_through_the_cpu_kernels(tiny_pairs, family, monkeypatch):
    # the CPU's own path at every size: the tree's mask through the softmax kernel, the
    # products through cpu_linear.c
    if cpu_softmax.library() is None:
        pytest.skip(f"no kernel here: {cpu_softmax.status().reason}")
    monkeypatch.setenv(cpu_native.ENV, "on")
    sdpa_calls = []
    sdpa = cpu_attention.sdpa
    monkeypatch.setattr(cpu_attention, "sdpa", lambda q, k, v, scale, mask: (
        sdpa_calls.append(isinstance(mask, mx.array)), sdpa(q, k, v, scale, mask))[1])
    rt = load(tiny_pairs, family, siblings=(3, 3), lookup_min_match=None)
    for prompt in ("Hello world", "def add(a, b):"):
        ids = rt.encode(prompt)
        assert rt.generate(ids, max_tokens=80, no_eos=True).tokens == plain_greedy(
            rt.model, ids, 80)
    assert any(sdpa_calls)  # the trees' masked attention ran through the kernel
