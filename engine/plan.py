"""The plan: what the decode loop does for one (device, dtype, pair), every "auto" resolved once.

`DFlashConfig` holds what a user asked for, "auto" where they left the choice to the engine.
`make_plan` turns it into a frozen `Plan` when a runtime loads its pair; the decode loop
(engine/cycle.py) reads only the plan. The rules for "auto" are here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from .config import (
    CPU_COPY_ODDS,
    CPU_DRAFT_VOCAB,
    DEFAULT_MIN_CONFIDENCE,
    GPU_STREAM_EVERY,
    DFlashConfig,
)
from .dflash2 import DFlash2Draft

if TYPE_CHECKING:
    from .draft import DFlashDraft
    from .targets.base import TargetAdapter


@dataclass(frozen=True)
class Plan:
    """Every choice a decode makes. The defaults are the published recipe's: whole blocks from
    the full head, no lookup, nothing queued early (what a proposer built without a plan
    does)."""

    block_size: int = 16  # the draft's block: a cycle verifies at most this many tokens
    # The verify cut: verify the drafts up to the first the draft gives less than this
    # probability (a host sync between draft and verify); None: whole blocks
    min_confidence: float | None = None
    # With the cut: the length to verify for a cut of n tokens, lengths[n] >= n, the fastest
    # measured on this machine (engine/verify_lengths.py); (): the cut's own length
    verify_lengths: tuple[int, ...] = ()
    # The draft proposes from its token ranking's top K tokens plus the prompt's; None: all
    draft_vocab: int | None = None
    # A repeat of the context's last N or more tokens is proposed instead of a draft forward
    # (engine/lookup.py: SuffixLookup); None: the draft proposes every cycle
    lookup_min_match: int | None = None
    # Greedy draft proposals finished from the context at these odds (cycle.copied_proposal);
    # None: off
    copy_odds: float | None = None
    # Cycles queue the next draft forward before their one host sync
    # (DraftProposer.prefetch)
    prefetch: bool = False
    # Target forwards queue their work every this many layers (TargetAdapter.launch_every);
    # 0: when evaluated
    stream_every: int = 0


def make_plan(config: DFlashConfig, backend: str, draft: DFlashDraft | None = None,
              target: TargetAdapter | None = None, ranking: Sequence[int] | None = None,
              sharded: bool = False,
              measure: Callable[[int], Sequence[int]] | None = None) -> Plan:
    """`config` on `backend` ("cpu", "cuda", "metal") for a pair: `draft` (None: the target
    alone), its token `ranking`, the `target` adapter, whether the target is `sharded` over
    ranks. `measure(block_size)` -> the verify lengths (verify_lengths.load_or_measure),
    called only where the cut pads to them."""
    cut = config.min_draft_confidence
    if cut == "auto":
        # A CPU's forward costs grow with their length and its syncs are cheap; on GPUs and
        # Metal a 16-token forward at checkpoint precision costs little more than a 1-token one
        # and a cycle syncs once.
        cut = DEFAULT_MIN_CONFIDENCE if backend == "cpu" else None
    if sharded:
        # Every rank must verify the same length, and the cut reads each rank's own draft
        # probabilities: sharded targets verify whole blocks.
        cut = None
    prefetch = config.prefetch_draft
    if prefetch == "auto":
        # The H200 measured it (benchmarks/stage20/); a CPU has nothing to overlap it with;
        # Metal has not measured it.
        prefetch = backend == "cuda"
    # The cut reads the draft's output before the verify anyway; a draft with sliding-window
    # layers cannot run before its context is settled; sharded ranks run in lockstep.
    prefetch = (bool(prefetch) and cut is None and not sharded and draft is not None
                and draft.can_prefetch)
    copy = config.copy_odds
    if copy == "auto":
        # Where the cut already reads the draft's distributions on the host, the copy adds no
        # sync (the 2-core CPU gained tokens/cycle at no cost in speed: benchmarks/stage33/);
        # on whole blocks it would add one, and GPUs have not measured it.
        copy = CPU_COPY_ODDS if backend == "cpu" and cut is not None else None
    if sharded or isinstance(draft, DFlash2Draft):
        # Sharded, each rank would read its own draft's rounding, as with the cut; a DFlash2
        # draft proposes its selector's path alone
        copy = None
    every = config.stream_verify
    if every == "auto":
        # The oracle-4 A/B on the H200 (benchmarks/stage33/); a CPU is bound by arithmetic,
        # Metal has not measured it.
        every = GPU_STREAM_EVERY if backend == "cuda" else None
    vocab = config.draft_vocab if ranking else None  # a subset needs the draft's ranking
    if vocab == "auto":
        # On a CPU the full head can cost more than the draft's layers (draft_head.py)
        vocab = CPU_DRAFT_VOCAB if backend == "cpu" else None
    if vocab is not None and target is not None and target.head_rows(mx.array([0])) is None:
        vocab = None  # rows of a head that is more than a projection would not match it
    block_size = config.draft_block_size or (draft.args.block_size if draft is not None else 16)
    lengths: tuple[int, ...] = ()
    if measure is not None and cut is not None and config.padded_verify and draft is not None:
        lengths = tuple(measure(block_size))
    return Plan(block_size=block_size, min_confidence=cut, verify_lengths=lengths,
                draft_vocab=min(vocab, len(ranking)) if vocab and ranking else None,
                lookup_min_match=config.lookup_min_match,
                copy_odds=copy, prefetch=prefetch,
                stream_every=0 if sharded or every is None else every)
