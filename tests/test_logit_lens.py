"""scripts/logit_lens.py: the target's pick read from an earlier layer's output."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from script_modules import load_script

from engine import DFlashRuntime

lens = load_script("logit_lens")


def test_the_last_layer_reads_the_final_pick_and_earlier_ones_less(tiny_pairs):
    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    n = len(rt.target.layers)
    seq, prompt_len = [int(t) for t in np.random.default_rng(0).integers(3, 200, 40)], 12
    hits = lens.lens_hits(rt.target, seq, prompt_len, [0, n - 1], top=3)
    last1, last3 = hits[n - 1]
    assert len(last1) == len(seq) - prompt_len and last1.all() and last3.all()
    first1, first3 = hits[0]
    assert not first1.all() and (first3 >= first1).all()  # top-3 holds every top-1 hit


def test_layers_are_parsed_sorted_and_checked():
    assert lens.layer_list("27, 18,27") == [18, 27]
    for bad in ("", "a,1", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="layer numbers"):
            lens.layer_list(bad)
