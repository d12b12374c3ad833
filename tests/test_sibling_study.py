import sys

import numpy as np
from script_modules import SCRIPTS, load_script

sys.path.insert(0, str(SCRIPTS))  # sibling_study imports branch_study, as when run
study = load_script("sibling_study")


def row(future: list[int], *slots: list[int], p1: list[float] | None = None) -> dict:
    """An anchor: the draft's choices per slot (best first), its top probabilities, the
    target's continuation."""
    top = np.array([s + [0] * (4 - len(s)) for s in slots])
    return {"top": top, "p1": np.array(p1 or [1.0] * len(slots)), "future": future}


def test_a_sibling_adds_one_token_where_the_chain_first_fails():
    anchor = row([5, 8, 9, 2], [5, 6], [7, 8], [9, 1], [2, 3])
    assert study.sibling_run(anchor, 4, 0, 1) == 1  # the chain fails at slot 1
    assert study.sibling_run(anchor, 4, 2, 2) == 2  # its 2nd choice there is the target's
    assert study.sibling_run(anchor, 4, 1, 2) == 1  # no sibling at slot 1
    assert study.sibling_run(anchor, 2, 2, 2) == 2  # a shorter chain, the same run
    right = row([5, 7, 9, 2], [5, 6], [7, 8], [9, 1], [2, 3])
    assert study.sibling_run(right, 4, 2, 2) == 4  # the chain all right
    assert study.sibling_run(right, 3, 2, 2) == 3  # ... up to its length
    assert study.sibling_run(row([5, 3], [5, 6], [7, 8]), 2, 2, 4) == 1  # 3: not a choice


def test_the_cut_leaves_room_for_siblings_in_its_padding():
    slots = [[5, 6], [7, 8], [9, 1], [2, 3]] * 4
    future = [5, 8, 9, 2] + [0] * 11
    unsure = row(future, *slots[:15], p1=[0.9] + [0.1] * 14)  # cut at 3 tokens, padded to 8
    assert study.cut_run(unsure, 0, 1) == 1
    assert study.cut_run(unsure, 2, 2) == 2  # 2 siblings in the padding: the one at slot 1
    sure = row(future, *slots[:15], p1=[0.9] * 15)  # the cut at 16: no room left
    assert study.cut_run(sure, 2, 2) == 1


def test_every_shape_reads_only_the_choices_kept():
    shapes = [(k, 1 + m + s * (k - 1)) for m, s, k in study.SHAPES] + [(k, 16) for _, k in
                                                                     study.CUTS]
    assert all(k <= load_script("branch_study").TOP for k, _ in shapes)
    assert all(tokens == 16 for _, tokens in shapes)  # the block's length
