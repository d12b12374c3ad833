"""Sibling trees: a verify of the same length as a block's, part of it spent on the draft's
runner-ups instead of its last slots.

A cycle's run ends where the draft is first wrong, most often at an early slot, and there its
2nd or 3rd choice is often the target's token; its last slots are rarely reached. A sibling
tree verifies the draft's own row, shortened, and beside it single tokens: the draft's 2nd..K-th
choices at its first M slots, each placed where the draft's token at that slot would be (its
position, attending to the row's tokens before that slot only). Where the target's token at
the row's first wrong slot is one of them, the cycle keeps it and the target's token after it:
one token more than the row alone gave (scripts/sibling_study.py simulates the shapes).

`SiblingTree` is a shape (host lists, fixed per cycle); the proposal, the acceptance and the
kept path's tokens are device ops, and the cycle's one host read brings back the kept node.

A draft tree (`likeliest_tree`) is chosen per cycle instead: the verify's tokens are the
likeliest nodes of the tree of the draft's continuations, a node as likely as the product of
the draft's probabilities of its path's tokens at their slots. Reading them costs a host sync
before the verify (as the verify cut's). Where the draft is sure the tree is a long row, where
it is not, a bush of its runner-ups.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
import numpy as np

from .draft import TokenChain
from .draft_head import DraftHead
from .lookup import ContextCopy

TREE_CHOICES = 8  # a draft tree's choices per slot (scripts/tree_study.py)


class TreeShape:
    """A verify's tokens as a tree: the staged token (node 0) and the nodes after it, each
    after its parent; subclasses say `parents`, parents before their children."""

    parents: list[int]

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> list[int]:
        depths: list[int] = []
        for p in self.parents:
            depths.append(0 if p < 0 else depths[p] + 1)
        return depths

    @cached_property
    def ancestry(self) -> np.ndarray:
        """[size, size] bool: row i holds i and its ancestors (what node i attends to)."""
        seen = np.zeros((self.size, self.size), bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                seen[i] = seen[p]
            seen[i, i] = True
        return seen

    def path(self, node: int) -> list[int]:
        """The nodes from the staged token to `node`, in order."""
        return [int(i) for i in np.flatnonzero(self.ancestry[node])]


@dataclass(frozen=True)
class SiblingTree(TreeShape):
    """A verify of `1 + main + slots * (choices - 1)` tokens: the staged token, the draft's
    top `main` drafts (a chain), then for each of the first `slots` slots its 2nd..`choices`-th
    tokens, each a child of the chain's token before that slot."""

    main: int
    slots: int
    choices: int

    @cached_property
    def parents(self) -> list[int]:
        """Each node's parent (the staged token: -1); nodes are in depth order along a path."""
        chain = [i - 1 for i in range(self.main + 1)]
        return chain + [j for j in range(self.slots) for _ in range(1, self.choices)]


def sibling_tree(size: int, slots: int, choices: int) -> SiblingTree | None:
    """The tree for a verify of `size` tokens with siblings at up to `slots` slots (fewer where
    the block is short: the chain keeps at least as many drafts as there are sibling slots);
    None where no sibling fits."""
    alternatives = choices - 1
    slots = min(slots, (size - 1) // (alternatives + 1))
    if slots < 1:
        return None
    return SiblingTree(size - 1 - slots * alternatives, slots, choices)


def tree_proposal(staged: int, logits: mx.array, head: DraftHead, tree: SiblingTree
                  ) -> mx.array:
    """Draft logits [1, >= tree.main, K] over `head` -> the tree's verify input [1, size]:
    the staged token, the draft's top tokens at its first `main` slots, then its 2nd..K-th
    tokens at each of the first `slots` slots."""
    ranked = mx.argsort(-logits[0, :tree.main], axis=-1)[:, :tree.choices]
    ids = head.token_ids(ranked).astype(mx.int32)  # [main, choices]
    siblings = ids[:tree.slots, 1:].reshape(-1)
    return mx.concatenate([mx.array([staged], dtype=mx.int32), ids[:, 0], siblings])[None]


def accept_tree(verify_in: mx.array, logits: mx.array, tree: TreeShape
                ) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Greedy acceptance over a tree's verify: a node is kept where it and each of its
    ancestors is the target's argmax after its parent; the cycle keeps the deepest such node
    (the chain's on a tie: it comes first). -> (that node, its depth a: the drafts kept, the
    kept path's tokens by depth [size] (the first a + 1 meaningful), the target's token
    after the node)."""
    choice = mx.argmax(logits[0], axis=-1).astype(mx.int32)
    tokens = verify_in[0]
    parents = mx.array([max(p, 0) for p in tree.parents])
    agrees = (tokens == choice[parents]) | (mx.arange(tree.size) == 0)
    ancestry = mx.array(tree.ancestry)
    kept = mx.all(agrees[None] | ~ancestry, axis=1)  # every node on its path agrees
    depths = mx.array(tree.depths)
    node = mx.argmax(mx.where(kept, depths, -1))
    # the path's node at each depth: the ancestor of `node` at that depth
    at_depth = mx.argmax(ancestry[node][None] & (depths[None] == mx.arange(tree.size)[:, None]),
                         axis=1)
    return node, depths[node], tokens[at_depth], choice[node]


@dataclass(frozen=True)
class DraftTree(TreeShape):
    """A tree chosen for one cycle (`likeliest_tree`): the draft's top row as far as the tree
    holds it comes first (nodes 1..n in place, as a row's), then the other nodes by depth."""

    parents: tuple[int, ...]


@dataclass(frozen=True)
class ChainedChoices:
    """A token chain's choices for a block (`chained_choices`), on the host: at slot s, after
    each of `before[s]`'s tokens [n, k] (slot 0: the staged token, every column), the chain's
    top C `tokens` [n, k, C] with their probabilities `probs` [n, k, C]."""

    before: np.ndarray
    tokens: np.ndarray
    probs: np.ndarray

    def after(self, slot: int, path: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """The choices at `slot` after a node's `path` (its tokens from slot 0), or None where
        the chain did not score the path's last token (outside the slot before's top k)."""
        if slot == 0:
            return self.tokens[0, 0], self.probs[0, 0]
        found = np.flatnonzero(self.before[slot] == path[-1])
        if found.size == 0:
            return None
        return self.tokens[slot, found[0]], self.probs[slot, found[0]]

    def walk(self, fallback: Sequence[int]) -> list[int]:
        """The greedy walk: each slot's top choice after the walk's token before it (the
        draft's own top token `fallback[slot]` where the chain did not score it)."""
        row: list[int] = []
        for slot in range(self.tokens.shape[0]):
            choices = self.after(slot, row)
            row.append(int(choices[0][0]) if choices is not None else int(fallback[slot]))
        return row


def chained_choices(chain: TokenChain, hidden: mx.array, logits: mx.array, staged: int,
                    head: DraftHead, embed: Callable[[mx.array], mx.array], candidates: int,
                    choices: int) -> ChainedChoices:
    """What a draft tree's nodes may be followed by, as the draft's token chain
    (`TokenChain`) says: the block's hidden states [1, n + 1, H] (slot 0 the staged token),
    its draft logits [1, n, K] over `head`; each slot's `candidates` top tokens are the ones
    the next slot is scored after (the chain's own distributions over the whole head, so the
    nodes' likelihoods stay calibrated). Reads them to the host."""
    k = min(candidates, logits.shape[2])
    before = head.token_ids(top_choices(logits[0], k)).astype(mx.int32)  # [n, k]
    before = mx.concatenate([mx.full((1, k), staged, dtype=mx.int32), before[:-1]])
    chained = chain(hidden[0, 1:, None, :], embed(before))  # [n, k, H]
    probs = mx.softmax(head(chained).astype(mx.float32), axis=-1, precise=True)  # [n, k, K]
    top = top_choices(probs, min(choices, probs.shape[-1]))
    top_probs = mx.take_along_axis(probs, top, axis=-1)
    ids = head.token_ids(top)
    mx.eval(before, ids, top_probs)
    return ChainedChoices(np.array(before), np.array(ids), np.array(top_probs))


def likeliest_nodes(tokens: np.ndarray, probs: np.ndarray, count: int,
                    copied: Callable[[list[int], int], tuple[int, float] | None] | None = None,
                    chained: ChainedChoices | None = None) -> list[tuple[int, int, int]]:
    """The `count` likeliest nodes of the tree of a block's continuations: at each of n slots
    the draft's top C `tokens` [n, C] with their probabilities `probs` [n, C], best first, and
    with `copied`, the context's candidate after a node's path (`copied(path, slot)` -> (token,
    its weight) or None; it raises the weight of a token already among the top C). With
    `chained`, a node's children are the token chain's choices after its token where the
    chain scored it (`ChainedChoices.after`), the draft's top C where not. A node's
    likelihood is the product of its path's weights, so a parent is always likelier than its
    children and the likeliest nodes form a tree. -> (parent: an earlier entry's index, -1
    for the staged token; slot; token), in the order found (parents first)."""
    n = probs.shape[0]
    found: list[tuple[int, int, int]] = []
    paths: list[list[int]] = []
    frontier: list[tuple[float, int, int, int, int]] = []
    pushed = 0

    def push(parent: int, likelihood: float, path: list[int], slot: int) -> None:
        nonlocal pushed
        choices = chained.after(slot, path) if chained is not None else None
        slot_tokens, slot_probs = choices if choices is not None else (tokens[slot], probs[slot])
        weights = {int(t): float(p) for t, p in zip(slot_tokens, slot_probs, strict=True)}
        extra = copied(path, slot) if copied is not None else None
        if extra is not None:
            weights[extra[0]] = max(weights.get(extra[0], 0.0), extra[1])
        for token, weight in weights.items():
            pushed += 1  # the tie-break: the order pushed
            heapq.heappush(frontier, (-likelihood * weight, pushed, parent, slot, token))

    push(-1, 1.0, [], 0)
    while frontier and len(found) < count:
        neg, _, parent, slot, token = heapq.heappop(frontier)
        found.append((parent, slot, token))
        paths.append((paths[parent] if parent >= 0 else []) + [token])
        if slot + 1 < n:
            push(len(found) - 1, -neg, paths[-1], slot + 1)
    return found


def tree_of_nodes(found: list[tuple[int, int, int]], row: Sequence[int]
                  ) -> tuple[DraftTree, list[int]]:
    """`likeliest_nodes`' nodes as a verify's tree, the staged token first, then the top row's
    nodes (the draft's top token `row[slot]` all the way from the staged token), then the
    others by slot. -> (the tree, each verify position's node index in `found`, -1 for the
    staged token)."""
    on_row = [False] * len(found)
    for i, (parent, slot, token) in enumerate(found):
        on_row[i] = token == row[slot] and (parent < 0 or on_row[parent])
    order = sorted(range(len(found)), key=lambda i: (not on_row[i], found[i][1], i))
    position = {node: k + 1 for k, node in enumerate(order)}
    parents = [-1] + [position[found[i][0]] if found[i][0] >= 0 else 0 for i in order]
    return DraftTree(tuple(parents)), [-1, *order]


def likeliest_tree(staged: int, logits: mx.array, head: DraftHead, size: int, choices: int,
                   copy: ContextCopy | None = None, copy_odds: float = 0.1,
                   chained: ChainedChoices | None = None) -> tuple[DraftTree, mx.array]:
    """Draft logits [1, n, K] over `head` -> the likeliest tree of `size` tokens (the staged
    token and `size` - 1 nodes from the draft's top `choices` tokens per slot:
    `likeliest_nodes`) and its verify input [1, size]. With `copy`, each node's context
    candidate (`ContextCopy.candidate` of its path) is a child too, weighted as
    `copied_proposal` trusts it: its draft probability over `copy_odds`, at most the slot's
    top probability. With `chained`, the token chain's choices after each node
    (`chained_choices`). Reads the draft's probabilities (a host sync before the verify)."""
    probs = mx.softmax(logits[0].astype(mx.float32), axis=-1, precise=True)
    top = top_choices(probs, min(choices, probs.shape[-1]))
    top_probs = mx.take_along_axis(probs, top, axis=-1)
    ids = head.token_ids(top)
    mx.eval(probs, top_probs, ids)
    ids_host, top_host = np.array(ids), np.array(top_probs)
    copied = None
    if copy is not None:
        all_probs = np.array(probs)

        def copied(path: list[int], slot: int) -> tuple[int, float] | None:
            candidate = copy.candidate(path)
            index = head.host_index(candidate) if candidate >= 0 else -1
            if index < 0:
                return None
            p = float(all_probs[slot, index])
            return candidate, max(p, min(float(top_host[slot, 0]), p / copy_odds))

    found = likeliest_nodes(ids_host, top_host, size - 1, copied, chained)
    row = [int(t) for t in ids_host[:, 0]]
    tree, order = tree_of_nodes(found, chained.walk(row) if chained is not None else row)
    tokens = [staged] + [found[i][2] for i in order[1:]]
    return tree, mx.array([tokens], dtype=mx.int32)


def top_choices(probs: mx.array, choices: int) -> mx.array:
    """The indices of each row's `choices` largest values, largest first ([..., K] ->
    [..., C])."""
    part = mx.argpartition(-probs, choices - 1, axis=-1)[..., :choices]
    order = mx.argsort(-mx.take_along_axis(probs, part, axis=-1), axis=-1)
    return mx.take_along_axis(part, order, axis=-1)
