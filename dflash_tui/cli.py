"""`dflash-chat`: command-line entry point."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_tui import __version__, config

EPILOG = """\
keys (F1 in the app lists all, with binding ids):
  Enter send · Shift+Enter / Ctrl+J newline · Esc stop reply (keeps the partial text)
  Ctrl+R regenerate last reply · Ctrl+G edit and resend your last message
  Ctrl+Y copy last reply · c copy focused message · Ctrl+T colour draft-accepted tokens
  Ctrl+B sidebar · Ctrl+O compact speed line · F2 model pairs · Ctrl+L conversations
  Ctrl+N new chat · F5 conversation settings (sampling too) · Ctrl+E export Markdown
  Ctrl+P command palette
  Ctrl+Q quit

files:
  history   {data}/history.sqlite3   (override: ${data_env})
  exports   {data}/exports/
  log       {data}/dflash-chat.log
  config    {config}   (override dir: ${config_env})
            rebind keys by binding id in its [keymap] table, e.g. "chat.stop" = "ctrl+s"

examples:
  dflash-chat                                   offline default pair (SmolLM2-135M + bundled draft)
  dflash-chat --model Qwen/Qwen3-4B --draft z-lab/Qwen3-4B-DFlash-b16
  dflash-chat --model ~/models/target --draft ~/models/draft
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-chat",
        description="Chat with a local LLM and watch lossless DFlash speculative decoding: "
        "a small draft proposes token blocks, the target verifies them, the sidebar shows "
        "acceptance and tokens/cycle live.",
        epilog=EPILOG.format(
            data=config.data_dir(),
            config=config.config_path(),
            data_env=config.DATA_DIR_ENV,
            config_env=config.CONFIG_DIR_ENV,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        "-m",
        metavar="ID|PATH",
        help="target model: Hub id or local folder (default: the offline pair)",
    )
    parser.add_argument(
        "--draft",
        "-d",
        metavar="ID|PATH",
        help="DFlash draft: Hub id or folder (default: the registry's draft)",
    )
    parser.add_argument(
        "--conversation",
        "-c",
        type=int,
        metavar="N",
        help="open conversation number N (see Ctrl+L in the app)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help=f"default max tokens per reply (1..{config.MAX_TOKENS_LIMIT})",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help=f"default draft block size ({config.MIN_BLOCK_SIZE}..{config.MAX_BLOCK_SIZE}; "
        "0 = the draft's own)",
    )
    # Sampling defaults for new conversations (each conversation keeps its own: F5).
    for flag, kind, what in (
        ("--temperature", float, "0 = greedy, exact (the default); above 0 samples"),
        ("--top-p", float, "0 < p <= 1; 1 = off"),
        ("--top-k", int, "0 = off"),
        ("--min-p", float, "0 <= p < 1; 0 = off"),
        ("--seed", int, "repeat sampled replies (default: a new seed every reply)"),
    ):
        parser.add_argument(flag, type=kind, metavar="X" if kind is float else "N",
                            help=f"default {flag[2:].replace('-', '_')} of new chats: {what}")
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help=f"history/export folder (default: ${config.DATA_DIR_ENV} or the platform data dir)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="use a deterministic fake engine (no model, no MLX): for trying "
        "the UI and for screenshots",
    )
    parser.add_argument(
        "--distributed",
        nargs="?",
        const="any",
        metavar="BACKEND",
        help="shard the target over the ranks mlx.launch started (any, ring, jaccl, mpi, "
        "nccl); the app runs on rank 0, the other ranks follow it (docs/sharded.md)",
    )
    parser.add_argument("--version", action="version", version=f"dflash-chat {__version__}")
    return parser


def launched_rank() -> int:
    """This process's rank as the launcher set it (mlx.launch: MLX_RANK; MPI: its own), read
    without MLX: rank 0 runs the app, whose engine joins the group on its worker thread."""
    for name in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.demo:
        # Importing the engine loads a fast BLAS on Linux CPU (engine/blas.py): here, before
        # the screen is taken, so that a warning about it stays readable.
        import engine  # noqa: F401
    from dflash_tui.app import DFlashChatApp
    from dflash_tui.backends import FakeBackend, RealBackend
    from dflash_tui.store import HistoryUnavailable, SchemaTooNew, unwritable

    data_dir = args.data_dir or config.data_dir()
    try:
        if args.max_tokens is not None:
            config.validate_max_tokens(str(args.max_tokens))
        if args.block_size is not None:
            config.validate_block_size(str(args.block_size))
        sampling = {name: getattr(args, name) for name in config.SAMPLING
                    if getattr(args, name) is not None}
        for name, value in sampling.items():
            config.validate_sampling(name, str(value))
    except ValueError as exc:
        print(f"dflash-chat: {exc}", file=sys.stderr)
        return 2
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(
            filename=data_dir / "dflash-chat.log",
            level=logging.INFO,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
    except OSError as exc:
        print(f"dflash-chat: {unwritable(data_dir, exc)}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    backend_factory: Callable[[], Any] = FakeBackend if args.demo else RealBackend
    if args.distributed and not args.demo:
        if launched_rank() != 0:  # no screen here: follow rank 0's pairs and replies
            from engine.distributed import follow
            from engine.errors import DFlashError

            try:
                follow(None, args.distributed)
            except DFlashError as exc:
                print(f"dflash-chat: {exc}", file=sys.stderr)
                return 2
            return 0
        backends: list[RealBackend] = []

        def backend_factory() -> RealBackend:
            backends.append(RealBackend(distributed=args.distributed))
            return backends[-1]

        atexit.register(lambda: [b.close() for b in backends])
    try:
        app = DFlashChatApp(
            model=args.model,
            draft=args.draft,
            backend_factory=backend_factory,
            data_dir=data_dir,
            conversation_id=args.conversation,
        )
    except (SchemaTooNew, HistoryUnavailable) as exc:
        print(f"dflash-chat: {exc}", file=sys.stderr)
        return 2
    if args.max_tokens is not None:
        app.settings.max_tokens = args.max_tokens
    if args.block_size is not None:
        app.settings.block_size = args.block_size
    for name, value in sampling.items():
        setattr(app.settings, name, value)
    app.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
