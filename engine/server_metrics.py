"""The server's /metrics: counters, gauges and histograms in Prometheus' text format (0.0.4).

Small enough to write out here rather than add a runtime dependency; the tests read it back
with prometheus_client's own parser.
"""

from __future__ import annotations

import math
from typing import Any

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPS_BUCKETS = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0, 1000.0)

HELP = {
    "dflash_requests": ("counter", "Requests answered, by endpoint and HTTP status."),
    "dflash_generated_tokens": ("counter", "Completion tokens generated."),
    "dflash_prompt_tokens": ("counter", "Prompt tokens of finished requests."),
    "dflash_cached_prompt_tokens": ("counter",
                                    "Prompt tokens resumed from the conversation cache."),
    "dflash_cycles": ("counter", "Speculative draft-verify cycles."),
    "dflash_pauses": ("counter", "Times speculation paused because the draft was not paying."),
    "dflash_paused_tokens": ("counter",
                             "Tokens decoded while speculation was paused (the target alone)."),
    "dflash_acceptance_rate": ("gauge", "Acceptance rate of the last speculative request."),
    "dflash_tokens_per_cycle": ("gauge", "Tokens per cycle of the last speculative request."),
    "dflash_queue_depth": ("gauge", "Requests waiting for or running on the engine."),
    "dflash_time_to_first_token_seconds": ("histogram", "Time to the first token."),
    "dflash_tokens_per_second": ("histogram", "Completion tokens per second, per request."),
}


def _label_text(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


class Metrics:
    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple], float] = {}
        self.hists: dict[str, tuple[tuple[float, ...], list[int], list[float]]] = {
            "dflash_time_to_first_token_seconds": (TTFT_BUCKETS, [0] * len(TTFT_BUCKETS),
                                                   [0.0, 0.0]),
            "dflash_tokens_per_second": (TPS_BUCKETS, [0] * len(TPS_BUCKETS), [0.0, 0.0]),
        }
        for name, (kind, _) in HELP.items():
            if kind != "histogram" and name != "dflash_requests":
                self.values[(name, ())] = 0.0

    def inc(self, name: str, by: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.values[key] = self.values.get(key, 0.0) + by

    def set(self, name: str, value: float) -> None:
        self.values[(name, ())] = float(value)

    def observe(self, name: str, value: float) -> None:
        bounds, counts, totals = self.hists[name]
        for i, bound in enumerate(bounds):
            if value <= bound:
                counts[i] += 1
        totals[0] += 1
        totals[1] += value

    def request(self, endpoint: str, status: int, stats: Any) -> None:
        """Count one answered request; `stats`: its RunningStats / GenerationResult."""
        self.inc("dflash_requests", endpoint=endpoint, status=str(status))
        if stats is None:
            return
        generated = getattr(stats, "total_tokens", None)
        if generated is None:
            generated = stats.generated
        self.inc("dflash_generated_tokens", generated)
        self.inc("dflash_prompt_tokens", stats.prompt_tokens)
        self.inc("dflash_cached_prompt_tokens", stats.cached_tokens)
        self.inc("dflash_cycles", stats.cycles)
        self.inc("dflash_pauses", getattr(stats, "pauses", 0))
        self.inc("dflash_paused_tokens", getattr(stats, "paused_tokens", 0))
        if stats.speculative and stats.cycles:
            self.set("dflash_acceptance_rate", stats.acceptance_rate)
            self.set("dflash_tokens_per_cycle", stats.tokens_per_cycle)
        if generated:
            self.observe("dflash_time_to_first_token_seconds", stats.ttft_s)
            self.observe("dflash_tokens_per_second", stats.tokens_per_second)

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, text) in HELP.items():
            # Counters are declared under their sample name (`_total`), as prometheus_client
            # writes them; its parser then files them under the bare name.
            declared = name + ("_total" if kind == "counter" else "")
            lines += [f"# HELP {declared} {text}", f"# TYPE {declared} {kind}"]
            if kind == "histogram":
                bounds, counts, (count, total) = self.hists[name]
                for bound, n in zip(bounds, counts):
                    lines.append(f'{name}_bucket{{le="{_num(bound)}"}} {n}')
                lines.append(f'{name}_bucket{{le="+Inf"}} {int(count)}')
                lines += [f"{name}_count {int(count)}", f"{name}_sum {_num(total)}"]
                continue
            suffix = "_total" if kind == "counter" else ""
            for (key, labels), value in sorted(self.values.items()):
                if key == name:
                    lines.append(f"{name}{suffix}{_label_text(dict(labels))} {_num(value)}")
        return "\n".join(lines) + "\n"
