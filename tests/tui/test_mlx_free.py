"""The TUI process never loads MLX: every dflash_tui module, the registry, the hub download
and the first-run fetch run without it (the engine loads MLX only when a pair is loaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.registry import HUB_PATTERNS

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import importlib, json, os, pkgutil, sys
    import dflash_tui
    names = [m.name for m in pkgutil.walk_packages(dflash_tui.__path__, "dflash_tui.")
             if not m.name.endswith("__main__")]
    for name in names:
        importlib.import_module(name)

    import huggingface_hub
    fetched = []

    def fake_snapshot_download(repo_id, tqdm_class=None, allow_patterns=None, **kw):
        bar = tqdm_class(total=4)
        bar.update(4)
        bar.close()
        fetched.append([repo_id, allow_patterns])
        return "/nowhere"

    huggingface_hub.snapshot_download = fake_snapshot_download
    from dflash_tui.downloads import download_pair, registry_rows
    rows = registry_rows()
    seen = []
    download_pair("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", lambda t, f: seen.append(f))

    from dflash_tui.firstrun import PREFIX, fetch_offline_model
    fetch_offline_model(lambda t, f: seen.append(t),
                        [sys.executable, "-c", f"print({PREFIX!r} + '[\\"cached\\", 1.0]')"])

    from dflash_tui.backends import FakeBackend
    fake = FakeBackend()
    fake.load(None, None, 0, lambda t, f: None)
    events = list(fake.stream([{"role": "user", "content": "hi"}], 8, 0))
    print(json.dumps({
        "modules": len(names), "rows": len(rows), "fetched": fetched, "seen": seen,
        "events": len(events), "mlx": sorted(m for m in sys.modules if m.split(".")[0] == "mlx"),
    }))
    """
)


def test_tui_process_never_loads_mlx(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="0", HF_HUB_CACHE=str(tmp_path / "hub"))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["modules"] >= 15  # every module was imported, not an empty walk
    assert report["rows"] >= 2
    # Both repos, each limited to the files the loader reads (never multi-GB .pth copies).
    assert [repo for repo, _ in report["fetched"]] == ["Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16"]
    for _, patterns in report["fetched"]:
        assert patterns == HUB_PATTERNS and "*.safetensors" in patterns
    assert 1.0 in report["seen"] and "cached" in report["seen"]
    assert report["events"] > 1
    assert report["mlx"] == []


def test_the_ui_downloads_what_the_loader_reads():
    from engine import loading  # MLX: fine in the test process

    assert loading.HUB_PATTERNS == HUB_PATTERNS
