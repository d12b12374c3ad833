"""The plan (engine/plan.py): a runtime resolves its settings once, for its device and pair,
into a frozen plan that every cycle reads."""

from __future__ import annotations

import dataclasses

import pytest
from test_cycle_sync import load

import engine.runtime
from engine import DFlashConfig
from engine.plan import Plan, make_plan


def test_a_runtime_resolves_its_settings_once_into_the_plan_its_cycles_read(tiny_pairs,
                                                                           monkeypatch):
    made = []
    monkeypatch.setattr(engine.runtime, "make_plan",
                        lambda *a, **k: made.append(a) or make_plan(*a, **k))
    rt = load(tiny_pairs, "llama")
    proposers = []
    original = rt.make_proposer
    monkeypatch.setattr(rt, "make_proposer", lambda *a: proposers.append(original(*a))
                        or proposers[-1])
    for _ in range(2):
        assert rt.generate("Hello", max_tokens=12, no_eos=True).cycles > 1
    assert len(made) == 1 and [p.plan for p in proposers] == [rt.plan, rt.plan]
    assert rt.plan == make_plan(rt.config, "cpu", rt.draft, rt.target)  # its rules, once
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.plan.min_confidence = 0.5  # type: ignore[misc]


def test_the_default_plan_is_the_published_recipe_and_sharded_ranks_keep_in_step(tiny_pairs):
    draft = load(tiny_pairs, "llama").draft
    assert Plan() == Plan(block_size=16, min_confidence=None, verify_lengths=(),
                          draft_vocab=None, lookup_min_match=None, copy_odds=None,
                          prefetch=False, stream_every=0)
    asked = DFlashConfig(min_draft_confidence=0.5, copy_odds=0.3, prefetch_draft=True,
                         stream_verify=3)
    alone = make_plan(asked, "cpu", draft, measure=lambda size: list(range(size + 1)))
    assert (alone.min_confidence, alone.copy_odds, alone.stream_every) == (0.5, 0.3, 3)
    assert alone.verify_lengths == tuple(range(17)) and not alone.prefetch  # the cut reads
    sharded = make_plan(asked, "cpu", draft, sharded=True,
                        measure=lambda size: pytest.fail("measured"))
    assert (sharded.min_confidence, sharded.copy_odds, sharded.prefetch,
            sharded.stream_every, sharded.verify_lengths) == (None, None, False, 0, ())
