"""scripts/draft_acceptance.py: the per-suite means and their standard errors."""

from __future__ import annotations

import math

from script_modules import load_script

acceptance = load_script("draft_acceptance")


def test_the_standard_error_is_the_spread_of_the_mean_over_the_runs_it_counts():
    runs = [{"tokens_per_cycle": 2.0}, {"tokens_per_cycle": 4.0},
            {"tokens_per_cycle": 6.0}, {"tokens_per_cycle": None}]
    assert acceptance.mean(runs, "tokens_per_cycle") == 4.0
    # sample standard deviation 2 over three runs (the None one not counted)
    assert math.isclose(acceptance.standard_error(runs, "tokens_per_cycle"), 2 / math.sqrt(3))
    assert acceptance.standard_error(runs[:1], "tokens_per_cycle") is None
