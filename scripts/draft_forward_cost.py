"""What one draft forward costs on this machine with the draft's weights and its output head
kept in float32 (how the engine runs them) or quantized (MLX affine, 8 or 4 bits): a smaller
draft to read only pays where quantized matmuls are fast.

    python scripts/draft_forward_cost.py --json benchmarks/draft-forward-cost-cpu.json

One 16-token block (no verify cut) through the shipped draft (or `--draft DIR`'s, its token
chain and target top included) and the 8,192-token head of the CPU default, after the
target's prefill of a 300-token context; the median over `--iters`.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from engine.bench.environment import machine_info, versions
from engine.config import CPU_DRAFT_VOCAB, DFlashConfig
from engine.cycle import DraftProposer, prefill, propose
from engine.draft_head import DraftHead, build_draft_head
from engine.runtime import DFlashRuntime

GROUP = 64


class QuantizedHead(DraftHead):
    """The draft head's rows quantized (affine, GROUP-wide groups)."""

    def __init__(self, head: DraftHead, bits: int) -> None:
        import mlx.core as mx

        super().__init__(head.target, head.ids, head.weight)
        self.bits = bits
        self.packed = mx.quantize(head.weight, group_size=GROUP, bits=bits)

    def __call__(self, hidden):
        import mlx.core as mx

        w, scales, biases = self.packed
        return mx.quantized_matmul(hidden, w, scales, biases, transpose=True,
                                   group_size=GROUP, bits=self.bits)


def forward_ms(rt: DFlashRuntime, draft, head: DraftHead, context: list[int], iters: int
               ) -> float:
    import mlx.core as mx

    cache, target_cache = draft.make_cache(), rt.target.make_cache()
    prefill(rt.target, target_cache, context, 512, DraftProposer(rt.target, draft, cache=cache))
    for _ in range(3):
        mx.eval(propose(rt.target, draft, cache, context[-1], 16, None, head,
                        target_cache=target_cache))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        mx.eval(propose(rt.target, draft, cache, context[-1], 16, None, head,
                        target_cache=target_cache))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", default=None,
                   help="a draft folder (default: the registry's shipped draft)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    import mlx.nn as nn  # here: the engine's imports load the fast CPU BLAS first

    rt = DFlashRuntime.from_pretrained(draft=args.draft, config=DFlashConfig())
    context = rt.encode([{"role": "user", "content": "Explain how a refrigerator works."}])
    context += [(7 * i + 11) % 1000 + 100 for i in range(300 - len(context))]
    head = build_draft_head(rt.target, rt.token_ranking, CPU_DRAFT_VOCAB, context)
    # copied before any forward: a forward keeps a handle on the BLAS (ctypes) in the draft
    quantized = {bits: copy.deepcopy(rt.draft) for bits in (8, 4)}
    rows = {"float32": forward_ms(rt, rt.draft, head, context, args.iters)}
    for bits in (8, 4):
        nn.quantize(quantized[bits], group_size=GROUP, bits=bits)
        rows[f"q{bits} layers, float32 head"] = forward_ms(rt, quantized[bits], head, context,
                                                           args.iters)
        rows[f"float32 layers, q{bits} head"] = forward_ms(rt, rt.draft,
                                                           QuantizedHead(head, bits), context,
                                                           args.iters)
    for name, ms in rows.items():
        print(f"{name:26s} {ms:7.2f} ms per draft forward", flush=True)
    if args.json:
        report = {"command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                  "block": 16, "context_tokens": len(context), "head_tokens": head.size,
                  "group_size": GROUP, "median_ms": rows, "machine": machine_info(),
                  "versions": versions()}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
