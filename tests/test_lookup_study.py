from script_modules import load_script

study = load_script("lookup_study")

LOOP = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]


def test_lookup_runs_follow_the_reply():
    runs = study.lookup_runs([], LOOP, min_match=2)
    assert len(runs) == len(LOOP) - 1
    assert runs[:4] == [None, None, None, None]  # (1, 2) first recurs at token 4
    assert runs[4] == 5  # proposes 3, 1, 2, 3, 1, ...: right up to the reply's end
    assert study.lookup_runs([7, 1, 2], [1, 2, 9], min_match=2)[1] == 0  # the prompt's 1, 2


def test_walks_pool_cycles_and_count_the_looked_up_ones():
    draft = [0] * (len(LOOP) - 1)  # a draft that is always wrong: one token per cycle
    assert study.walk(draft, [None] * len(draft), study.lookup_first) == (9, 9, 0)
    looked = study.lookup_runs([], LOOP, min_match=2)
    # tokens 1-4 one per cycle, then one looked-up cycle commits the last five
    assert study.walk(draft, looked, study.lookup_first) == (9, 5, 1)
    result = study.study([([], LOOP, draft)])
    assert result["draft_only"] == {"tokens_per_cycle": 1.0, "lookup_cycle_share": 0.0}
    assert result["lookup_2"]["tokens_per_cycle"] == 9 / 5
    assert result["best_of_2"]["tokens_per_cycle"] >= result["lookup_2"]["tokens_per_cycle"]
