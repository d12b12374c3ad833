import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from span_study import bucket_rows  # noqa: E402


def test_bucket_rows_say_how_far_each_match_length_runs():
    cycles = [{"match": 5, "accepted": 3}, {"match": 6, "accepted": 20},
              {"match": 20, "accepted": 40}, {"match": 40, "accepted": 63}]
    rows = {r["match"]: r for r in bucket_rows(cycles)}
    assert rows["5-7"]["cycles"] == 2 and rows["5-7"]["past_block_share"] == 0.5
    assert rows["5-7"]["mean_accepted"] == 11.5 and rows["5-7"]["filled_32_share"] == 0
    assert rows["8-15"]["cycles"] == 0 and rows["8-15"]["past_block_share"] is None
    assert rows["16-31"]["filled_32_share"] == 1 and rows["16-31"]["filled_64_share"] == 0
    assert rows["32+"]["filled_64_share"] == 1
