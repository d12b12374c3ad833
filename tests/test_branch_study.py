import sys

import numpy as np
from script_modules import SCRIPTS, load_script

sys.path.insert(0, str(SCRIPTS))  # branch_study imports choice_study, as when run
study = load_script("branch_study")


def choices(*slots: list[int]) -> np.ndarray:
    """The draft's choices per slot, best first: [slots, TOP]."""
    return np.array([s + [0] * (study.TOP - len(s)) for s in slots])


def test_a_branch_runs_on_only_where_the_drafts_row_fails():
    top = choices([5, 6], [7, 8], [9, 1], [2, 3])
    assert study.tree_run(top, [5, 7, 9, 2], [], 1) == 4  # the draft's row, all right
    # fails at slot 1 (8 was meant); its 2nd choice is 8, and slots 2, 3 then run on
    assert study.tree_run(top, [5, 8, 9, 2], [], 1) == 1
    assert study.tree_run(top, [5, 8, 9, 2], [0, 1], 2) == 4
    assert study.tree_run(top, [5, 8, 9, 2], [0], 2) == 1  # no branch at slot 1
    assert study.tree_run(top, [5, 8, 4, 2], [1], 2) == 2  # ... and it fails at slot 2
    assert study.tree_run(top, [6, 7, 9, 2], [1, 2, 3], 4) == 0  # slot 0: not a branch
    assert study.tree_run(top, [5, 3], [1], 4) == 1  # 3 is not among the choices


def test_trees_count_their_rows_and_tokens_and_pool_walks():
    trees = study.trees(16)
    assert trees["draft"][1:] == (1, 16)
    assert trees["first2_top2"][1:] == (3, 16 + 15 + 14)
    assert trees["first4_top3"][1] == 9
    rows = [{"top": choices([1], [2]), "p1": np.ones(2), "future": [1, 2]}] * 3
    # a 4-token reply (token 0 from prefill), every anchor running 2: one cycle of 3 tokens
    assert study.pooled([rows], trees["draft"][0]) == 3.0
    rows[0] = {"top": choices([1], [5, 2]), "p1": np.ones(2), "future": [1, 2]}
    assert study.pooled([rows], trees["draft"][0]) == 1.5  # 2 tokens, then 1
    assert study.pooled([rows], trees["first2_top2"][0]) == 3.0
