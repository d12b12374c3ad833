"""Pausing speculation where the draft does not pay: the target alone, then a probe now and then.

A cycle costs a draft forward and a verify; plain decoding costs one 1-token target step per
token. Speculation pays where a cycle's tokens exceed its cost in plain steps. The decode loop
(engine/cycle.py) asks a `Pacer` once per cycle whether to speculate, and tells it what the
cycle cost and committed. Over the last WINDOW speculative cycles the pacer estimates the
speed-up, tokens per cycle over a cycle's cost in plain steps (mean tokens x the median plain
step / the median cycle: one stalled cycle on a shared machine does not pause a reply); below
PAUSE_BELOW (0.9) it pauses: the loop then decodes with the target alone, one token a step (no
draft forward, no wide verify: the same computation as plain decoding, so the output is the
same), and times those steps (a verdict judged on plain steps timed long ago, or on the
load-time prior alone, first pauses for only CALIBRATE (4) steps, then probes with what they
measured). After a back-off of FIRST_BACKOFF tokens it probes: PROBE speculative cycles, judged
with the steps it just timed. A probe that pays (RESUME_FROM, 1.0) resumes speculation (and the
back-off starts over); one that does not pauses again for twice as long, up to MAX_BACKOFF
(128).

Before any step of its own is timed, the pacer uses `step_s`, the runtime's measurement of a
plain step at load (`verify_lengths.plain_step_s`): it is taken at a short context, so at
long ones it can make a pause that the first probe, judged with steps timed at that length,
undoes.

Switching never changes the output: greedy, every token is the target's argmax either way;
sampled, a plain step draws from the target's processed distribution and a cycle keeps it by
speculative sampling, whichever a cycle does (a choice made before the cycle's draws). What the
pacer decides depends on timings, so a seeded sampled reply repeats only where its pauses fall
on the same cycles (`--pause off` for replies that must repeat exactly). Pure Python: the clock
is injectable, so tests drive it without timing anything.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

WINDOW = 8  # speculative cycles a verdict reads
# Speculative cycles a probe runs before its verdict: a whole window, since a draft's tokens
# per cycle vary a lot (mostly 1, now and then 5), and a failed probe costs little (its
# cycles still commit tokens); on MT-Bench's first prompt 4-cycle probes kept failing where
# the reply's draft paid 1.86 tokens/cycle on average
PROBE = WINDOW
CALIBRATE = 4  # plain steps timed before a probe where a verdict had only stale ones
FIRST_BACKOFF = 16  # tokens decoded by the target alone before the first probe
MAX_BACKOFF = 128  # the back-off doubles while probes fail, up to this
# Pause below this expected speed-up, resume (a probe's verdict) from RESUME_FROM: near
# break-even either way is as fast, and on a shared machine the timings behind a verdict are
# noisy (a wrong pause costs a back-off of plain steps where the draft paid)
PAUSE_BELOW = 0.9
RESUME_FROM = 1.0
# Plain steps timed more than this many speculative cycles ago (or only the load-time prior)
# are stale: a verdict that pauses on them first times PROBE plain steps, then probes at once
# (a shared machine's speed drifts by several times within a reply)
STALE = 16
# The sidebar's, /metrics' and the result's words for why a reply paused
REASON = "draft not paying"


class Pacer:
    """Whether each cycle speculates, from the recent cycles' measured cost and tokens and a
    plain step's measured cost. `enabled=False`: always speculate (and count nothing)."""

    def __init__(self, step_s: float | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter,
                 verify_costs: Sequence[float] = (), window: int = WINDOW,
                 probe: int = PROBE, first_backoff: int = FIRST_BACKOFF,
                 max_backoff: int = MAX_BACKOFF) -> None:
        self.enabled = enabled
        self.prior = step_s  # a plain step's cost before any is timed here; None: unknown
        # verify_costs[L - 1]: an L-token verify's cost on this machine (any unit): with them
        # each speculative cycle's verify time gives the plain step's cost at that moment
        self.ratios = [c / verify_costs[0] for c in verify_costs] if verify_costs else []
        self.live: deque[float] = deque(maxlen=window)  # those estimates, recent cycles
        self.clock = clock
        self.window, self.probe = window, probe
        self.first_backoff, self.max_backoff = first_backoff, max_backoff
        self.cycles: deque[tuple[float, int]] = deque(maxlen=window)  # (seconds, tokens)
        self.steps: deque[float] = deque(maxlen=window)  # plain steps' seconds, while paused
        self.backoff = first_backoff
        self.left = 0  # tokens the target decodes alone before the next probe; 0: speculating
        self.judge_in = window  # speculative cycles until the next verdict
        self.pauses = 0  # how many times this reply paused
        self.paused_tokens = 0  # tokens committed while paused
        self.probes = 0  # probes run (each after a back-off)
        self.probing = False  # the cycles since the last back-off are a probe, not yet judged
        self.since_steps = STALE + 1  # speculative cycles since a plain step was timed
        self.reason: str | None = None  # why the last pause happened (None: never paused)
        # Paused cycles' tapped target features (opaque here): the loop adds them to the
        # draft's context in one go when the draft next runs, or the reply ends
        self.deferred: list[Any] = []
        self._started = 0.0

    @property
    def paused(self) -> bool:
        """Whether the next cycle decodes with the target alone."""
        return self.left > 0

    def take_deferred(self) -> list[Any]:
        """The deferred features, in order; none are left."""
        taken, self.deferred = self.deferred, []
        return taken

    def begin(self) -> None:
        """A cycle starts (its cost runs from here to `end`)."""
        self._started = self.clock()

    def end(self, tokens: int, plain: bool, verified: int = 0, verify_s: float = 0.0) -> None:
        """The cycle that `begin` started committed `tokens`; `plain`: it was a 1-token step
        of the target alone (a paused cycle that the suffix lookup proposed is neither that
        nor a speculative cycle: it counts towards the back-off only). `verify_s`: the part
        of it from the verify forward of `verified` tokens to the commit (synced)."""
        cost = self.clock() - self._started
        if not self.enabled:
            return
        if not self.paused and verify_s > 0 and 0 < verified <= len(self.ratios):
            self.live.append(verify_s / self.ratios[verified - 1])
        if self.paused:
            if plain:
                self.steps.append(cost)
                self.since_steps = 0
            self.paused_tokens += tokens
            self.left = max(self.left - tokens, 0)
            if not self.left:  # the back-off is over: probe
                self.probes += 1
                self.probing = True
                self.cycles.clear()
                self.judge_in = self.probe
            return
        self.cycles.append((cost, tokens))
        self.since_steps += 1
        self.judge_in -= 1
        if self.judge_in > 0:
            return
        speedup = self.speedup()
        probing, self.probing = self.probing, False
        self.judge_in = 1  # from here on, a verdict after every cycle
        if speedup is None or speedup >= (RESUME_FROM if probing else PAUSE_BELOW):
            if probing:
                self.backoff = self.first_backoff  # the probe paid: a later pause starts over
            return
        # Not paying: pause. A failed probe doubles the back-off; a fresh pause starts short;
        # one judged on stale plain steps first times a few (a failed probe then backs off by
        # first_backoff).
        self.backoff = min(self.backoff * 2, self.max_backoff) if probing else self.first_backoff
        self.left = self.backoff
        if not probing and self.since_steps > STALE and not self.live:
            self.left, self.backoff = CALIBRATE, self.first_backoff // 2
        self.pauses += 1
        self.reason = (f"{REASON}: {self.tokens_per_cycle():.2f} tokens/cycle at "
                       f"{self.cycle_steps():.2f} plain steps a cycle")

    def step_s(self) -> float | None:
        """A plain step's cost: the median of those timed while paused where they are
        recent, else of the live estimates from the verifies, else of the steps timed,
        else the prior."""
        if self.steps and (self.since_steps <= STALE or not self.live):
            return statistics.median(self.steps)
        if self.live:
            return statistics.median(self.live)
        return self.prior

    def tokens_per_cycle(self) -> float:
        return statistics.fmean(t for _, t in self.cycles) if self.cycles else 0.0

    def cycle_steps(self) -> float:
        """The recent cycles' median cost in plain steps (0: unknown)."""
        step = self.step_s()
        if not self.cycles or not step:
            return 0.0
        return statistics.median(c for c, _ in self.cycles) / step

    def speedup(self) -> float | None:
        """The recent cycles' expected speed-up over plain decoding: tokens per cycle over a
        cycle's cost in plain steps. None: no plain step's cost is known."""
        steps = self.cycle_steps()
        return self.tokens_per_cycle() / steps if steps else None
