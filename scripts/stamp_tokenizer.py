"""Stamp a tokenizer folder copied next to a GGUF (`<gguf>.tokenizer/`) as built from that
GGUF, so the engine uses it instead of rebuilding it (engine/gguf.py `tokenizer_folder`).
For machines whose transformers cannot build a GGUF's tokenizer (the GPU machine's).

    python scripts/stamp_tokenizer.py PATH/TO/model.gguf
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from engine.cache import sha256_file
from engine.gguf import TOKENIZER_VERSION


def stamp(gguf: Path) -> None:
    folder = gguf.with_name(gguf.name + ".tokenizer")
    stat = os.stat(gguf)
    source = {"version": TOKENIZER_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    files = {n: sha256_file(folder / n) for n in ("tokenizer.json", "tokenizer_config.json")}
    (folder / "source.json").write_text(json.dumps({"source": source, "files": files}))


if __name__ == "__main__":
    stamp(Path(sys.argv[1]))
