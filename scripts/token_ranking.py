"""Write a draft folder's token_ranking.json from the datasets the draft was trained on.

    python scripts/token_ranking.py DRAFT_DIR DATA.npz [MORE.npz ...]

`dflash train-draft` writes the file itself; this is for drafts trained before it did. The
datasets are train-draft's .npz files (OUT/resume/data.npz, --data, --extra-data); only their
response tokens are counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from engine.train.dataset import Dataset, token_ranking, write_token_ranking

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("draft", type=Path, help="the draft folder to write token_ranking.json into")
    p.add_argument("data", type=Path, nargs="+", help="train-draft dataset(s), .npz")
    args = p.parse_args(argv)
    if not (args.draft / "config.json").is_file():
        p.error(f"{args.draft} is not a draft folder (no config.json)")
    missing = [str(f) for f in args.data if not f.is_file()]
    if missing:
        p.error(f"no such dataset: {', '.join(missing)}")
    datasets = [Dataset.load(f) for f in args.data]
    n_seq = sum(len(d) for d in datasets)
    n_tok = sum(d.response_tokens for d in datasets)
    source = (f"scripts/token_ranking.py: response-token counts of "
              f"{' + '.join(f.name for f in args.data)} ({n_seq} sequences, {n_tok} response "
              "tokens; prompts not counted)")
    ids = token_ranking(datasets)
    path = write_token_ranking(ids, args.draft, source)
    print(f"wrote {path}: {len(ids)} token ids seen in {n_tok} response tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
