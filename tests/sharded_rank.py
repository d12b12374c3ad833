"""One rank of the sharded-target tests (tests/test_distributed.py starts two of these on
the ring backend). Usage: python tests/sharded_rank.py PAIRS_DIR OUT_DIR FAMILY...

Per family, every rank loads the tiny pair with `distributed=True` and runs, in lockstep:
an oracle proposer at several accept lengths (each rank checks its own shard's caches
against a plain prefill: rollback on this rank's heads), then rank 0 serves runtime requests
(speculative, plain, a cancelled stream, a resumed conversation, a sampled reply) while the
others `follow`. Each rank writes OUT_DIR/rank-N.json. Then the chat app's engine side
(`chat_app`), whose pairs rank 0 announces: OUT_DIR/chat.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

import engine  # noqa: E402, F401  (first: it picks the CPU BLAS before MLX loads)

# isort: split
import mlx.core as mx  # noqa: E402
from tiny_pairs import TruthOracle, cache_states  # noqa: E402

from engine import DFlashConfig, DFlashRuntime  # noqa: E402
from engine.cycle import prefill, speculative_decode  # noqa: E402
from engine.distributed import follow  # noqa: E402
from engine.runtime import plain_decode  # noqa: E402

PROMPTS = ["Hello world", "def add(a, b):"]
TOKENS = 24
ORACLE_TOKENS = 34
ERROR_AT = (0, 3, 15, 16)  # oracle drafts wrong from this slot on (16: all right)
CHAT_FAMILIES = ("llama", "qwen3_5")  # the chat app's pairs, loaded one after the other


def oracle_runs(rt) -> dict:
    """Every rank: accept lengths 0, 3, 15 and all; max |cache - plain prefill cache|."""
    ids = rt.encode("Speculative decoding drafts tokens.")
    plain = plain_decode(rt.target, ids, ORACLE_TOKENS + 4, 512)
    truth = ids + [t for c in plain for t in c.tokens]
    out = {"accepted": [], "tokens": [], "cache_diff": 0.0, "truth": truth[len(ids):]}
    for error_at in ERROR_AT:
        cache, oracle = rt.target.make_cache(), TruthOracle(rt, truth, error_at)
        tokens, accepted = [], []
        for commit in speculative_decode(rt.target, oracle, ids, ORACLE_TOKENS, 16, 512,
                                         cache):
            tokens += commit.tokens
            if commit.cycle is not None:
                accepted.append([commit.cycle.accepted, commit.cycle.block_size])
        ref = rt.target.make_cache()
        prefill(rt.target, ref, ids + tokens[:-1], 512)
        for got, want in zip(cache_states(cache), cache_states(ref), strict=True):
            assert got.shape == want.shape, (got.shape, want.shape)
            diff = mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item()
            out["cache_diff"] = max(out["cache_diff"], diff)
        out["accepted"].append(accepted)
        out["tokens"].append(tokens)
    return out


def leader_requests(rt) -> dict:
    """Rank 0: the requests the followers follow."""
    out = {"spec": [], "plain": []}
    for prompt in PROMPTS:
        ids = rt.encode(prompt)
        result = rt.generate(ids, TOKENS, no_eos=True)
        assert result.speculative and result.cycles > 0
        out["spec"].append({"ids": ids, "tokens": result.tokens})
        out["plain"].append(rt.generate(ids, TOKENS, no_eos=True, speculative=False).tokens)
    # A reply cancelled after two spans, then a turn that resumes the first prompt's reply.
    stream = rt.stream_generate(PROMPTS[0], TOKENS, no_eos=True)
    next(stream), next(stream)
    stream.close()
    first = out["spec"][0]
    resumed = first["ids"] + first["tokens"] + rt.encode(" and again")
    result = rt.generate(resumed, TOKENS, no_eos=True)
    out["resumed"] = {"ids": resumed, "tokens": result.tokens, "cached": result.cached_tokens}
    # Sampled with no seed: each rank draws its own drafts, and rank 0's are the ones kept,
    # so the followers cache the conversation under rank 0's tokens and can resume it.
    sampled = rt.generate(PROMPTS[1], TOKENS, no_eos=True, temperature=0.8)
    out["sampled"] = len(sampled.tokens)
    after = rt.encode(PROMPTS[1]) + sampled.tokens + rt.encode(" ok")
    result = rt.generate(after, TOKENS, no_eos=True)
    out["after_sampled"] = {"ids": after, "tokens": result.tokens,
                            "cached": result.cached_tokens}
    out["describe"] = rt.describe()
    rt.close_followers()
    return out


def chat_app(pairs: Path, out_dir: Path, families: list[str]) -> None:
    """The chat app's engine side: rank 0 drives dflash_tui's RealBackend (it loads one
    pair, then switches to the next, and clears the conversation cache); the other ranks run
    `follow(None)`, loading whatever rank 0 announces."""
    import os

    from dflash_tui.backends import RealBackend
    from engine.events import Finished

    if os.environ["MLX_RANK"] != "0":
        follow(None, "ring")
        return
    backend, report = RealBackend(distributed="ring"), {}
    messages = [{"role": "user", "content": "Hello"}]
    for family in families:
        backend.load(str(pairs / f"tiny-{family}"), str(pairs / f"tiny-{family}-dflash"), 0,
                     lambda message, fraction: None)
        replies = []
        for _ in range(2):
            events = list(backend.stream(messages, TOKENS, 0))
            replies.append(next(e.result.tokens for e in events if isinstance(e, Finished)))
            backend.rt.clear_cache()
        report[family] = {"ids": backend.rt.encode(messages), "replies": replies}
    backend.close()
    (out_dir / "chat.json").write_text(json.dumps(report))


def main(pairs: Path, out_dir: Path, families: list[str]) -> None:
    report = {}
    rank = None
    for family in families:
        rt = DFlashRuntime.from_pretrained(
            model=str(pairs / f"tiny-{family}"), draft=str(pairs / f"tiny-{family}-dflash"),
            config=DFlashConfig(dtype="float32"), distributed=True)
        rank = rt.lockstep.rank
        report[family] = {"rank": rank, "size": rt.lockstep.size, "oracle": oracle_runs(rt)}
        if rt.lockstep.leader:
            report[family].update(leader_requests(rt))
        else:
            follow(rt)
        print(f"rank {rank}: {family} done", file=sys.stderr, flush=True)
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(report))
    chat_app(pairs, out_dir, [f for f in families if f in CHAT_FAMILIES])


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
