import sys

import numpy as np
from script_modules import SCRIPTS, load_script

sys.path.insert(0, str(SCRIPTS))  # tree_study imports branch_study and sibling_study, as run
study = load_script("tree_study")


def row(future: list[int], slots: list[list[int]], probs: list[list[float]]) -> dict:
    """An anchor: the draft's choices per slot (best first), their probabilities, the
    target's continuation."""
    return {"top": np.array(slots), "probs": np.array(probs), "future": future}


def test_a_tree_runs_down_whichever_branch_holds_the_continuation():
    slots = [[5, 6], [7, 8], [9, 1]]
    unsure = [[0.5, 0.45], [0.9, 0.05], [0.9, 0.05]]  # both choices at slot 0, then rows
    assert study.tree_run(row([6, 7, 9], slots, unsure), 4, 2) == 2  # 6, then 7
    assert study.tree_run(row([6, 7, 9], slots, unsure), 6, 2) == 3  # deep enough for 9
    assert study.tree_run(row([6, 7, 9], slots, unsure), 4, 1) == 0  # top choices only
    assert study.tree_run(row([5, 8, 9], slots, unsure), 4, 2) == 1  # 8: not in the tree
    sure = [[0.9, 0.05], [0.9, 0.05], [0.9, 0.05]]
    assert study.tree_run(row([5, 7, 9], slots, sure), 3, 2) == 3  # a sure draft: its row
    assert study.tree_run(row([6, 7, 9], slots, sure), 3, 2) == 0


def test_every_tree_reads_only_the_choices_kept():
    assert all(c <= study.TOP for _, c in study.TREES)
