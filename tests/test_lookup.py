from engine.lookup import SuffixLookup


def lookup(tokens: list[int], min_match: int = 3, short_match: int | None = None
           ) -> SuffixLookup:
    found = SuffixLookup(min_match=min_match, short_match=short_match or min_match)
    found.extend(tokens)
    return found


def proposed(found: SuffixLookup, count: int) -> list[int]:
    return found.propose(count)[1]


def test_no_earlier_occurrence_proposes_nothing():
    assert lookup([1, 2, 3, 4, 5, 6]).propose(4) == (0, [])
    assert lookup([1, 2]).propose(4) == (0, [])  # shorter than a match
    assert lookup([1, 2, 3, 4, 5, 6], short_match=2).propose(4) == (0, [])


def test_a_match_shorter_than_min_match_proposes_nothing():
    assert lookup([7, 8, 9, 1, 8, 9], min_match=3).propose(3) == (0, [])
    assert lookup([7, 8, 9, 1, 8, 9], min_match=2).propose(3) == (2, [1, 8, 9])


def test_short_matches_are_found_with_their_length():
    """From short_match tokens on, a shorter match than min_match is proposed with its
    length (the cycle then lets the draft choose); a min_match one still comes first."""
    assert lookup([7, 8, 9, 1, 8, 9], min_match=5, short_match=2).propose(3) == (2, [1, 8, 9])
    assert lookup([7, 8, 9, 1, 8, 9], min_match=5, short_match=3).propose(3) == (0, [])
    # [2, 3] recurs recently (-> 8); [1, 2, 3, 4, 5] longer ago (-> 6): the long one wins
    found = lookup([1, 2, 3, 4, 5, 6, 0, 2, 3, 8, 9, 1, 2, 3, 4, 5], min_match=5, short_match=2)
    assert found.propose(2) == (5, [6, 0])
    assert SuffixLookup().short_match < SuffixLookup().min_match  # the engine's default


def test_copies_what_followed_the_earlier_occurrence():
    found = lookup([5, 1, 2, 3, 40, 41, 42, 9, 9, 1, 2, 3])
    assert found.match() == (3, 3)
    assert proposed(found, 3) == [40, 41, 42]
    assert proposed(found, 10)[:6] == [40, 41, 42, 9, 9, 1]


def test_a_loop_continues_through_its_own_period():
    found = lookup([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3])
    assert proposed(found, 7) == [4, 5, 1, 2, 3, 4, 5]


def test_the_longest_of_the_recent_matches_wins():
    # [2, 3] then 7 earlier after a longer shared suffix [1, 2, 3]; the latest [2, 3] -> 8
    found = lookup([1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], min_match=2)
    assert found.match() == (3, 2)
    assert proposed(found, 1) == [7]


def test_extending_in_pieces_equals_extending_at_once():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 1, 4, 1, 5]
    pieces = SuffixLookup(min_match=3)
    for i in range(0, len(tokens), 3):
        pieces.extend(tokens[i:i + 3])
    assert pieces.propose(5) == lookup(tokens).propose(5) == (5, [9, 2, 6, 5, 3])


def test_the_lookup_setting_is_checked_and_has_a_flag():
    import argparse

    import pytest

    from engine.bench.compare import build_parser
    from engine.config import DFlashConfig, config_from_args, lookup_arg
    from engine.errors import ConfigError
    from engine.lookup import MIN_MATCH

    assert DFlashConfig().lookup_min_match == MIN_MATCH
    assert DFlashConfig(lookup_min_match=None).lookup_min_match is None
    for bad in (1, 0, True, 2.5, "4"):
        with pytest.raises(ConfigError, match=r"lookup_min_match=.*at least 2, or None"):
            DFlashConfig(lookup_min_match=bad)
    assert [lookup_arg(t) for t in ("off", "2", "12")] == [None, 2, 12]
    for bad in ("1", "auto", "-3", "many", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="at least 2, or 'off'"):
            lookup_arg(bad)
    bench = build_parser()
    assert config_from_args(bench.parse_args(["--prompt", "x"])).lookup_min_match == MIN_MATCH
    args = bench.parse_args(["--prompt", "x", "--lookup", "off"])
    assert config_from_args(args).lookup_min_match is None
