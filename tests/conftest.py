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
