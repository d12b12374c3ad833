import sys

import numpy as np
from script_modules import SCRIPTS, load_script

from engine.lookup import ContextCopy

sys.path.insert(0, str(SCRIPTS))  # copy_study imports choice_study, as when run
study = load_script("copy_study")


def one_hot_rows(*tokens: int, vocab: int = 10, spare: float = 0.0) -> np.ndarray:
    """The draft's distributions per slot: its top token at 1 - spare, each other at spare."""
    probs = np.full((len(tokens), vocab), spare)
    for j, t in enumerate(tokens):
        probs[j, t] = 1.0 - spare
    return probs


def test_copy_rows_take_the_context_where_the_rule_allows():
    index = ContextCopy()
    index.extend([4, 5, 6, 4])  # after 4 came 5, after "4 5" came 6
    top = np.array([1, 2])
    probs = one_hot_rows(1, 2, spare=0.05)
    assert study.copy_row(index, top, probs, 0.1, 1) == [1, 2]  # 0.05 < 0.1 * 0.95
    assert study.copy_row(index, top, probs, 0.05, 1) == [5, 6]
    assert study.copy_row(index, top, probs, 0.05, 2) == [1, 2]  # "4" alone is too short
    # the oracle swaps only where the draft is wrong and the candidate right
    assert study.copy_row(index, top, probs, 0.0, 1, future=[5, 2]) == [5, 2]
    assert study.copy_row(index, top, probs, 0.0, 1, future=[1, 2]) == [1, 2]
    follower = {4: 5, 5: 6}
    assert study.bigram_row(follower, 4, top, probs, 0.05) == [5, 6]
    assert study.bigram_row(follower, 4, top, probs, 0.1) == [1, 2]


def test_pooled_walks_put_the_lookup_in_front_where_it_proposes():
    rows = [{"draft": 2, "lookup": None}, {"draft": 0, "lookup": 5}, {"draft": 2, "lookup": None}]
    # a 4-token reply (token 0 from prefill): the draft's run of 2 ends it in one cycle
    assert study.pooled([rows], "draft", False) == 3.0
    rows[0] = {"draft": 0, "lookup": 2}
    assert study.pooled([rows], "draft", False) == 1.0  # three cycles of one token
    assert study.pooled([rows], "draft", True) == 3.0
    assert "copy_a0.1_n1" in [name for name, _, _ in study.rules()]
