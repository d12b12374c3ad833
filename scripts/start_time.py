"""How long a pair takes to start once its weights are in the cache (issue 62: "the next start
loads in under 15 s on the 2-core CPU").

    python scripts/start_time.py --model qwen2.5-coder-1.5b --repeat 3 \
        --json benchmarks/qwen2.5-coder-1.5b-start-cpu.json

Each start is a fresh Python process, as a user's `dflash-chat` or `dflash generate` is: the
interpreter, `import engine`, `DFlashRuntime.from_pretrained` (weights read and dequantized,
draft, tokenizer, warm-up) and one 1-token reply. A start before the timed ones (reported
apart) fills the cache if it is empty (the download, the GGUF's conversion and the verify
lengths' measurement happen once per machine) and the page cache. Timings on a busy machine
are noise: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import engine
from engine import DFlashRuntime
t1 = time.perf_counter()
rt = DFlashRuntime.from_pretrained(sys.argv[1])
t2 = time.perf_counter()
rt.generate("Say hi.", max_tokens=1)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_token_s": t3 - t2}))
"""


def start(model: str) -> dict:
    """One fresh process: its phases and its whole wall time."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, model], cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - began
    if done.returncode:
        sys.exit(f"start_time: the start failed:\n{done.stderr.strip()[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="target id (default: the offline default)")
    p.add_argument("--repeat", type=int, default=3, help="timed starts")
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args()
    from engine.bench.environment import environment
    from engine.registry import DEFAULT_TARGET

    model = args.model or DEFAULT_TARGET
    first = start(model)
    runs = [start(model) for _ in range(args.repeat)]
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    report = {"command": "python scripts/start_time.py " + " ".join(sys.argv[1:]),
              "model": model, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              **environment(), "untimed_start": first, "runs": runs,
              "summary": {f"{key}_median": value for key, value in summary.items()}}
    print(f"{model}: next start {summary['wall_s']:.1f} s (median of {len(runs)}; import "
          f"{summary['import_s']:.1f} s, load {summary['load_s']:.1f} s, first token "
          f"{summary['first_token_s']:.1f} s); the untimed one before them "
          f"{first['wall_s']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
