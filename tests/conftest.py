"""Shared fixtures: tiny random target/draft pairs written to a session temp dir."""

from __future__ import annotations

import os

import pytest

# Tests never touch the network or the user's real data.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory):
    """family -> (target_dir, draft_dir), built once per session."""
    from tiny_pairs import make_tiny_pair

    root = tmp_path_factory.mktemp("pairs")
    cache: dict[str, tuple] = {}

    def get(family: str):
        if family not in cache:
            cache[family] = make_tiny_pair(root, family)
        return cache[family]

    return get
