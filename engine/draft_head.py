"""The draft's output head: the target's full lm_head, or its rows for a subset of tokens.

The draft has no head of its own; its hidden states go through the target's. Proposals are
only suggestions (the target verifies every one), so proposing from a subset of the
vocabulary is lossless: it costs acceptance only where the target's next token lies outside
the subset. On CPU the full head can cost more than the draft's layers (a small target with a
large vocabulary, like SmolLM2's); the most frequent tokens plus the prompt's cover nearly all
of an answer (the README's draft-vocabulary section has the measurements).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from .kernels import cpu_linear
from .targets.base import TargetAdapter

# Optional, next to a draft's weights: token ids ranked by how often the target writes them
# (dflash train-draft writes it, loading reads it). The draft then proposes from the top ones.
RANKING_FILE = "token_ranking.json"


@dataclass
class DraftHead:
    target: TargetAdapter
    ids: mx.array | None = None  # int32 [K], sorted: the subset's token ids; None: full head
    weight: mx.array | None = None  # [K, H]: the target head's rows for `ids`
    _index: dict[int, int] = field(default_factory=dict, repr=False)  # token id -> row

    @property
    def size(self) -> int:
        return self.target.vocab_size if self.ids is None else int(self.ids.size)

    def __call__(self, hidden: mx.array) -> mx.array:
        """hidden [..., H] (normed) -> logits [..., size] over the subset (or the vocab)."""
        if self.weight is None:
            return self.target.lm_head(hidden)
        return cpu_linear.project(hidden, self.weight)  # on a CPU, a block's rows in C

    def token_ids(self, index: mx.array) -> mx.array:
        """Indices into this head's logits -> token ids."""
        return index if self.ids is None else self.ids[index]

    def host_index(self, token: int) -> int:
        """A token id's index into this head's logits; -1 outside the subset."""
        if self.ids is None:
            return token
        if not self._index:
            self._index = {t: i for i, t in enumerate(self.ids.tolist())}
        return self._index.get(token, -1)

    def index_of(self, tokens: Sequence[int]) -> tuple[mx.array, mx.array]:
        """Token ids -> (their indices into this head's logits, whether the head has them);
        a token outside the subset gets index 0 and False."""
        if self.ids is None:
            return mx.array(tokens, dtype=mx.int32), mx.ones(len(tokens), dtype=mx.bool_)
        rows = [self.host_index(t) for t in tokens]
        return (mx.array([max(r, 0) for r in rows], dtype=mx.int32),
                mx.array([r >= 0 for r in rows], dtype=mx.bool_))


def build_draft_head(target: TargetAdapter, ranking: Sequence[int] | None, size: int | None,
                     prompt: Sequence[int] = ()) -> DraftHead:
    """The `size` highest-ranked tokens plus the prompt's own (answers often repeat names and
    identifiers from the prompt). The full head without a ranking or size, when the subset
    would be the whole vocabulary, or when the target's head is not a plain projection."""
    if not ranking or size is None:
        return DraftHead(target)
    vocab = target.vocab_size
    ids = sorted({t for t in ranking[:size] if 0 <= t < vocab} | {t for t in prompt
                                                                   if 0 <= t < vocab})
    if len(ids) >= vocab:
        return DraftHead(target)
    subset = mx.array(ids, dtype=mx.int32)
    weight = target.head_rows(subset)
    if weight is None:
        return DraftHead(target)
    mx.eval(weight)  # gather once here, not inside the first cycle's timing
    return DraftHead(target, subset, weight)
