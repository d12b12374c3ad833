"""Stamp a tokenizer folder copied next to a GGUF (`<gguf>.tokenizer/`) as built from that
GGUF, so the engine uses it instead of rebuilding it (engine/gguf.py `tokenizer_folder`).
For machines whose transformers cannot build a GGUF's tokenizer (the GPU machine's).

    python scripts/stamp_tokenizer.py PATH/TO/model.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.gguf import stamp_tokenizer, tokenizer_source

if __name__ == "__main__":
    gguf = Path(sys.argv[1])
    stamp_tokenizer(gguf.with_name(gguf.name + ".tokenizer"), tokenizer_source(gguf))
