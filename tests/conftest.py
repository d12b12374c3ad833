"""Shared fixtures: tiny random target/draft pairs written to a session temp dir."""

from __future__ import annotations

import os

import pytest

# Tests never touch the network or the user's real data.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory):
    """(family, mixing=1.0) -> (target_dir, draft_dir), built once per session; `mixing` as
    for tiny_pairs.make_tiny_target (REPEATING: a target whose replies repeat soon)."""
    from tiny_pairs import make_tiny_pair

    root = tmp_path_factory.mktemp("pairs")
    cache: dict[tuple[str, float], tuple] = {}

    def get(family: str, mixing: float = 1.0):
        if (family, mixing) not in cache:
            cache[family, mixing] = make_tiny_pair(root, family, mixing=mixing)
        return cache[family, mixing]

    return get


@pytest.fixture(scope="session")
def tiny_dflash2(tmp_path_factory):
    """(family, name="dflash2", **shape) -> (target_dir, draft_dir): a tiny target and a
    random-weight DFlash2 draft for it in z-lab's layout (tiny_pairs.make_tiny_dflash2), built
    once per session per (family, name)."""
    from tiny_pairs import make_tiny_dflash2

    root = tmp_path_factory.mktemp("dflash2")
    cache: dict[tuple[str, str], tuple] = {}

    def get(family: str, name: str = "dflash2", **shape):
        if (family, name) not in cache:
            cache[family, name] = make_tiny_dflash2(root, family, name=name, **shape)
        return cache[family, name]

    return get


@pytest.fixture(autouse=True)
def untimed_runtimes(monkeypatch):
    """Pausing speculation (engine/pause.py) decides on wall-clock timings, which no test may
    depend on: runtimes built in tests start with no plain step's cost, so their pacer is
    off. Tests of pausing drive a pacer with a fake clock (tests/test_pause.py: `paced`)."""
    import engine.runtime

    monkeypatch.setattr(engine.runtime, "plain_step_s", lambda *args, **kwargs: None)
