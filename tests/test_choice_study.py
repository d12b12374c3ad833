import numpy as np
from script_modules import load_script

study = load_script("choice_study")


def row(d: int, m: int = 0, r: int | None = None, top: float = 0.5, rep: float = 0.5) -> dict:
    """One anchor: draft run d, match length m with repeat run r, flat probabilities."""
    return {"d": d, "m": m, "r": r, "top": np.full(15, top), "rep": np.full(15, rep)}


def test_rule_takes_long_matches_and_scores_short_ones():
    confident, unsure = row(1, m=2, r=6, top=0.2, rep=0.9), row(1, m=2, r=6, top=0.9, rep=0.2)
    choose = study.rule(0.4)
    assert choose(confident) == (6, True)  # the draft expects more of the repeat
    assert choose(unsure) == (1, False)
    assert study.rule(None)(confident) == (1, False)  # no choice: the draft
    assert study.rule(0.4)(row(0, m=study.MIN_MATCH, r=3, top=0.9, rep=0.0)) == (3, True)
    assert study.rule(0.4, direct=99)(row(0, m=study.MIN_MATCH, r=3, top=0.9, rep=0.0)) == (0,
                                                                                           False)
    assert study.best_of(row(2, m=2, r=5)) == (5, True) and study.best_of(row(2)) == (2, False)


def test_pooled_walks_cycles_from_where_the_last_stopped():
    # 6 anchors (a reply of 7 tokens): anchor 0 runs 2 (3 tokens), anchor 3 a repeat of 2
    # (3 tokens) -> 2 cycles, one of them looked up; anchors 1, 2, 4, 5 are never visited.
    rows = [row(2), row(9), row(9), row(0, m=2, r=2, top=0.1, rep=0.9), row(9), row(9)]
    found = study.pooled([rows], study.rule(0.4))
    assert found == {"tokens_per_cycle": 3.0, "lookup_cycle_share": 0.5}
    assert study.pooled([rows], study.rule(None))["tokens_per_cycle"] == 2.0  # 3 + 1 + 2
