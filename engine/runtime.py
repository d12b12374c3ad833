"""DFlashRuntime: load a target + draft pair once, then stream lossless speculative output."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from . import device
from .config import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, PREFILL_CHUNK, DFlashConfig
from .cycle import Commit, DraftProposer, prefill, speculative_decode
from .draft import DFlashDraft
from .draft_head import DraftHead, build_draft_head
from .errors import ConfigError, PromptError
from .events import Finished, GenerationResult, RunningStats, Span
from .kernels import cuda_attention
from .loading import Progress, load_draft, load_target, quantization, stream_bytes_exactly
from .pause import Pacer
from .plan import Plan, make_plan
from .prompt_cache import PromptCache, PromptState, resolve_cache_bytes
from .registry import DEFAULT_TARGET
from .sampling import Sampler, SamplingParams, next_token
from .targets import adapter_for
from .targets.base import TargetAdapter
from .verify_lengths import load_or_measure, plain_step_s

if TYPE_CHECKING:
    from .distributed import Lockstep

Prompt = str | Sequence[dict] | Sequence[int]


def peak_memory() -> int:
    return int(mx.get_peak_memory())


class DFlashRuntime:
    prefill_chunk = PREFILL_CHUNK  # prompts are prefilled in chunks of this many tokens

    def __init__(self, model: nn.Module, tokenizer: Any, draft: DFlashDraft | None,
                 config: DFlashConfig | None = None, target_id: str = "target",
                 draft_id: str = "draft", target: TargetAdapter | None = None,
                 token_ranking: list[int] | None = None, lockstep: Lockstep | None = None,
                 progress: Progress | None = None):
        self.config = config or DFlashConfig()
        self.model = model
        self.tokenizer = stream_bytes_exactly(tokenizer)
        self.draft = draft
        self.target = target or adapter_for(model)
        self.lockstep = self.target.lockstep = lockstep  # sharded: rank 0 leads (distributed.py)
        self.target_id, self.draft_id = target_id, draft_id
        self.token_ranking = token_ranking  # the draft's token_ranking.json, if it has one

        self.verify_costs: list[float] = []  # ms of a 1..16-token verify, where measured

        def measure(size: int) -> tuple[int, ...]:  # the verify lengths, once per machine
            assert draft is not None
            record = load_or_measure(model, self.target, str(target_model_dtype(model)),
                                     draft.args.target_layer_ids, size, progress)
            self.verify_costs = list(record["costs_ms"])
            return record["lengths"]

        cuda_attention.check()  # a GPU where the block kernel fails keeps MLX's attention
        # Every "auto" resolved once, for this device and pair: what each cycle does
        self.plan: Plan = make_plan(self.config, device.current(), draft, self.target,
                                    token_ranking, lockstep is not None, measure)
        self.target.launch_every = self.plan.stream_every
        taps = draft.args.target_layer_ids if draft is not None else ()
        self.target.warm_up(self.plan.block_size, taps)  # kernels compile here, not mid-reply
        # A plain step's cost, the pacer's start (engine/pause.py); None: no pausing
        self.step_s = (plain_step_s(self.target, taps, self.verify_costs) if draft is not None
                       and lockstep is None and self.config.pause_speculation else None)
        budget = resolve_cache_bytes(self.config.prompt_cache_bytes)
        if lockstep is not None:  # the same budget everywhere: ranks evict in step
            budget = lockstep.broadcast_int(budget)
        self.prompt_cache = PromptCache(budget)

    def clear_cache(self) -> None:
        """Forget every cached conversation state (the next request prefills in full)."""
        if self.lockstep is not None and self.lockstep.leader:
            self.lockstep.announce({"clear_cache": True})  # the followers' caches too
        self.prompt_cache.clear()

    @classmethod
    def from_pretrained(cls, model: str | None = None, draft: str | None = None,
                        config: DFlashConfig | None = None,
                        progress: Progress | None = None, distributed: bool | str = False
                        ) -> DFlashRuntime:
        """Load a registered pair by target id, or any target + `draft` (ids or folders).
        `model=None` is the offline default pair (SmolLM2-135M-Instruct + our draft).
        `distributed` (True or a backend name) shards the target over this process's
        mx.distributed group; followers (rank > 0) then call `distributed.follow(runtime)`
        and rank 0 generates (README: sharded targets)."""
        config = config or DFlashConfig()
        model_id = model or DEFAULT_TARGET
        lockstep = None
        if distributed:
            from .distributed import Lockstep, init_group, load_sharded_target

            group = init_group("any" if distributed is True else distributed)
            lockstep = Lockstep(group)
            target_model, tokenizer, resolved = load_sharded_target(model_id, config.dtype,
                                                                    group, progress)
        else:
            target_model, tokenizer, resolved = load_target(model_id, config.dtype, progress)
        adapter = adapter_for(target_model)
        # The draft computes in the target's dtype (its hidden states feed the draft).
        dtype = target_model_dtype(target_model)
        draft_model, draft_id, ranking = load_draft(model_id, draft, adapter, dtype, progress)
        return cls(target_model, tokenizer, draft_model, config, resolved, draft_id, adapter,
                   ranking, lockstep, progress)

    def close_followers(self) -> None:
        """Rank 0 of a sharded target: let the other ranks' `follow` return (call once, when
        done generating). Nothing to do otherwise."""
        if self.lockstep is not None and self.lockstep.leader:
            self.lockstep.announce(None)

    # -- prompts -----------------------------------------------------------------------
    def encode(self, prompt: Prompt, chat_template_args: dict | None = None) -> list[int]:
        """Raw text, chat messages (template applied) or token ids (used as-is)."""
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("the prompt is empty. Fix: pass some text.")
            return list(self.tokenizer.encode(prompt))
        items = list(prompt)
        if not items:
            raise PromptError("the prompt is empty. Fix: pass text, messages or token ids.")
        if all(isinstance(t, int) for t in items):
            return items
        if all(isinstance(m, dict) and "role" in m and "content" in m for m in items):
            if getattr(self.tokenizer, "chat_template", None) is None:
                raise PromptError(
                    f"{self.target_id} has no chat template. Fix: pass raw text instead."
                )
            kwargs = {**(self.config.chat_template_args or {}), **(chat_template_args or {})}
            ids = self.tokenizer.apply_chat_template(
                items, add_generation_prompt=True, tokenize=True, **kwargs
            )
            return list(ids["input_ids"] if isinstance(ids, dict) else ids)
        raise PromptError(
            "the prompt must be a string, a list of {'role', 'content'} messages or a list "
            "of token ids."
        )

    def describe(self) -> dict:
        return {
            "target": self.target_id,
            "ranks": self.lockstep.size if self.lockstep is not None else 1,
            "draft": self.draft_id,
            "backend": device.current(),
            "dtype": str(target_model_dtype(self.model)).removeprefix("mlx.core."),
            "quantization": quantization(self.model),  # None: plain float weights
            "block_size": self.plan.block_size,
            "draft_vocab": self.plan.draft_vocab,  # top-K tokens (+ the prompt's); None: all
            "lookup_min_match": self.plan.lookup_min_match,  # None: the draft every cycle
            "min_confidence": self.plan.min_confidence,  # the verify cut; None: whole blocks
            "prefetch_draft": self.plan.prefetch,  # greedy cycles queue the next draft early
            "stream_verify": self.plan.stream_every or None,  # forwards queued every N layers
            "copy_odds": self.plan.copy_odds,  # greedy proposals finished from the context
            # the length verified for each cut's (index: the cut's); None: the cut's own
            "verify_lengths": list(self.plan.verify_lengths) or None,
            "max_ctx": self.config.max_ctx,
            "family": self.target.family,
        }

    # -- generation --------------------------------------------------------------------
    def stream_generate(self, prompt: Prompt, max_tokens: int = 256, no_eos: bool = False,
                        speculative: bool = True, chat_template_args: dict | None = None,
                        block_size: int | None = None, profile: bool = False,
                        temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                        min_p: float = 0.0, seed: int | None = None
                        ) -> Iterator[Span | Finished]:
        """Yields a Span per committed group of tokens, then one Finished.
        `block_size` overrides the runtime's for this call (2..16). `profile` evaluates each
        cycle phase on its own, so the cycle stats hold device times per phase (a few more
        syncs per cycle; benchmarks use it). `temperature` 0 (the default) is greedy and
        exact; above 0 the reply is sampled (after top_k, top_p and min_p filters) with the
        target's own distribution kept by speculative sampling; `seed` makes it repeatable."""
        if max_tokens < 1:
            raise PromptError(f"max_tokens={max_tokens}: ask for at least 1 token.")
        params = SamplingParams(temperature, top_p, top_k, min_p, seed)
        sampler = None if params.greedy else Sampler(params)
        block_size = block_size or self.plan.block_size
        if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
            raise ConfigError(
                f"block_size={block_size} is out of range: use {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}"
            )
        ids = self.encode(prompt, chat_template_args)
        fallback = None
        if speculative and self.draft is None:
            fallback = "no draft loaded"
        elif speculative and len(ids) + max_tokens > self.config.max_ctx:
            fallback = (f"prompt ({len(ids)}) + max_tokens ({max_tokens}) exceeds max_ctx "
                        f"({self.config.max_ctx}): decoded by the target alone")
        use_draft = speculative and fallback is None
        mx.reset_peak_memory()
        reuse: list[PromptState] = []  # filled on the first next(): the state it resumed
        pacer = None
        if use_draft:
            stop_ids = () if no_eos else frozenset(self.tokenizer.eos_token_ids)
            pacer = Pacer(self.step_s, enabled=self.step_s is not None,
                          verify_costs=self.verify_costs)
            commits = self._speculative(ids, max_tokens, block_size, profile, sampler, reuse,
                                        stop_ids, pacer)
        else:
            commits = self._plain(ids, max_tokens, sampler, reuse)
        if self.lockstep is not None:  # what the followers run (distributed.follow)
            request = {"ids": ids, "max_tokens": max_tokens, "no_eos": no_eos,
                       "speculative": speculative, "block_size": block_size,
                       "profile": profile, **vars(params)}
            commits = self.lockstep.gated(commits, request)
        return self._spans(commits, ids, max_tokens, no_eos, use_draft, fallback, block_size,
                           reuse, pacer)

    def _resume(self, ids: list[int], use_draft: bool, reuse: list[PromptState]
                ) -> PromptState:
        """The state of the longest cached prefix of `ids` (fresh caches when none)."""
        draft = self.draft.make_cache() if use_draft else None
        state = self.prompt_cache.fetch(ids, self.target.make_cache(), draft)
        reuse.append(state)
        return state

    def make_proposer(self, head: DraftHead, draft_cache: list[Any], context: list[int]
                      ) -> DraftProposer:
        """The cycle's proposer: the draft with its output head and context cache, doing what
        the plan says, its lookup and copy seeded with `context` (the prompt's tokens). The
        oracle cost benchmark (`dflash benchmark --oracle-tokens-per-cycle`) puts its own
        proposer here."""
        return DraftProposer(self.target, self.draft, head, self.plan, draft_cache, context)

    def _speculative(self, ids: list[int], max_tokens: int, block_size: int, profile: bool,
                     sampler: Sampler | None, reuse: list[PromptState],
                     stop_ids: Collection[int] = (), pacer: Pacer | None = None
                     ) -> Iterator[Commit]:
        # Run on the first next(), so the timings (ttft) count the draft head and the prefill.
        head = build_draft_head(self.target, self.token_ranking, self.plan.draft_vocab, ids)
        state = self._resume(ids, True, reuse)
        proposer = self.make_proposer(head, state.draft_cache, ids)
        todo = ids[state.cached:]
        if state.recurrent:
            # Recurrent states cannot be cut back: prefill up to the last prompt token and
            # snapshot there (a regenerate resumes at that point). Attention caches are cut
            # instead, sparing short prompts a second forward.
            if len(todo) > 1:
                prefill(self.target, state.cache, todo[:-1], self.prefill_chunk,
                        proposer)
            state.mark(len(ids) - 1)
            todo = todo[-1:]
        try:
            yield from speculative_decode(self.target, proposer, todo, max_tokens, block_size,
                                          self.prefill_chunk, cache=state.cache,
                                          sync_phases=profile, sampler=sampler,
                                          stop_ids=stop_ids, pacer=pacer)
        finally:  # a reply ending paused: the draft's context in step, for the next turn
            if pacer is not None and pacer.deferred:
                proposer.append_context(mx.concatenate(pacer.take_deferred(), axis=1))

    def _plain(self, ids: list[int], max_tokens: int, sampler: Sampler | None,
               reuse: list[PromptState]) -> Iterator[Commit]:
        """The target alone, through mlx-lm's generate_step (which prefills all but the last
        prompt token first: the snapshot point)."""
        state = self._resume(ids, False, reuse)
        start = state.cached

        def progress(done: int, total: int) -> None:
            if done == total - 1:
                state.mark(start + done)

        yield from plain_decode(self.target, ids[start:], max_tokens, self.prefill_chunk,
                                sampler, cache=state.cache, progress=progress)

    def _keep(self, reuse: list[PromptState], held: list[int]) -> None:
        """Store the finished request's state under the tokens its caches hold."""
        if not reuse:
            return
        state = reuse[0]
        n = self.target.cache_length(state.cache)
        if state.draft_cache is not None and state.draft_cache[0].offset != n:
            state.draft_cache = None  # not in step with the target: keep the target's only
        self.prompt_cache.store(held[:n], state)

    def _spans(self, commits: Iterator[Commit], ids: list[int], max_tokens: int, no_eos: bool,
               use_draft: bool, fallback: str | None, block_size: int,
               reuse: list[PromptState], pacer: Pacer | None = None
               ) -> Iterator[Span | Finished]:
        stop_ids = set() if no_eos else set(self.tokenizer.eos_token_ids)
        detok = self.tokenizer.detokenizer
        detok.reset()
        tokens: list[int] = []
        cycle_tokens: list[int] = []
        lookup_cycles = 0
        profile = {"draft": 0.0, "verify": 0.0, "rollback": 0.0}
        start = time.perf_counter()
        first_at = None
        finish = "length"
        held = list(ids)  # what the caches may hold: the prompt and every committed token
        consistent = False  # the caches are between cycles (done or cancelled), not mid-one
        try:
            for commit in commits:
                now = time.perf_counter()
                if first_at is None:
                    first_at = now
                new = commit.tokens
                held.extend(new)
                hit = next((i for i, t in enumerate(new) if t in stop_ids), None)
                if hit is not None:
                    new, finish = new[:hit], "stop"
                n_draft = min(commit.n_draft, len(new))
                draft_text = _add(detok, new[:n_draft])
                text = draft_text + _add(detok, new[n_draft:])
                tokens.extend(new)
                if commit.cycle is not None:
                    cycle_tokens.append(commit.cycle.committed)
                    lookup_cycles += commit.cycle.looked_up
                    for phase in profile:
                        profile[phase] += getattr(commit.cycle, f"{phase}_s")
                cached = reuse[0].cached if reuse else 0
                stats = self._stats(ids, tokens, len(cycle_tokens), start, first_at, now,
                                    use_draft, cached, lookup_cycles, pacer)
                if new:
                    yield Span(tuple(new), n_draft, text, draft_text, stats, commit.cycle)
                if finish == "stop" or len(tokens) >= max_tokens:
                    break
            consistent = True
        except GeneratorExit:
            finish, consistent = "cancelled", True
            raise
        finally:
            commits.close()
            if consistent:
                self._keep(reuse, held)
        cached = reuse[0].cached if reuse else 0
        detok.finalize()
        tail = detok.last_segment
        end = time.perf_counter()
        first_at = first_at or end
        if tail:
            stats = self._stats(ids, tokens, len(cycle_tokens), start, first_at, end, use_draft,
                                cached, lookup_cycles, pacer)
            yield Span((), 0, tail, "", stats, None)
        result = GenerationResult(
            text=self.tokenizer.decode(tokens), tokens=tokens, prompt_tokens=len(ids),
            finish_reason=finish, speculative=use_draft, fallback_reason=fallback,
            block_size=block_size, elapsed_s=end - start, prefill_s=first_at - start,
            ttft_s=first_at - start, decode_s=end - first_at, peak_memory_bytes=peak_memory(),
            cycle_tokens=cycle_tokens, cycle_profile=profile, cached_tokens=cached,
            lookup_cycles=lookup_cycles, **pause_stats(pacer),
            pause_reason=pacer.reason if pacer is not None else None,
        )
        yield Finished(result)

    def _stats(self, ids: list[int], tokens: list[int], cycles: int, start: float,
               first_at: float, now: float, use_draft: bool, cached: int = 0,
               lookup_cycles: int = 0, pacer: Pacer | None = None) -> RunningStats:
        prefill_s = first_at - start
        prefilled = len(ids) - cached  # tokens actually run through the target
        return RunningStats(
            prompt_tokens=len(ids), generated=len(tokens), cycles=cycles,
            elapsed_s=now - start, decode_s=now - first_at, ttft_s=prefill_s,
            prefill_tokens_per_second=prefilled / prefill_s if prefill_s > 0 else 0.0,
            ctx_used=len(ids) + len(tokens), max_ctx=self.config.max_ctx,
            peak_memory_bytes=peak_memory(), speculative=use_draft, cached_tokens=cached,
            lookup_cycles=lookup_cycles, paused=pacer is not None and pacer.paused,
            **pause_stats(pacer),
        )

    def generate(self, prompt: Prompt, max_tokens: int = 256, no_eos: bool = False,
                 speculative: bool = True, chat_template_args: dict | None = None,
                 block_size: int | None = None, profile: bool = False,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 min_p: float = 0.0, seed: int | None = None) -> GenerationResult:
        """stream_generate, collected: the Finished event's result."""
        for event in self.stream_generate(prompt, max_tokens, no_eos, speculative,
                                          chat_template_args, block_size, profile,
                                          temperature, top_p, top_k, min_p, seed):
            if isinstance(event, Finished):
                return event.result
        raise RuntimeError("stream ended without a result")  # pragma: no cover


def pause_stats(pacer: Pacer | None) -> dict[str, int]:
    """How often a reply paused speculation, and the tokens it decoded paused."""
    if pacer is None:
        return {"pauses": 0, "paused_tokens": 0}
    return {"pauses": pacer.pauses, "paused_tokens": pacer.paused_tokens}


def _add(detok: Any, tokens: list[int]) -> str:
    for t in tokens:
        detok.add_token(t)
    return detok.last_segment if tokens else ""


def target_model_dtype(model: nn.Module) -> mx.Dtype:
    inner = getattr(model, "language_model", model).model
    return inner.norm.weight.dtype


def plain_decode(target: TargetAdapter, prompt: list[int], max_tokens: int,
                 prefill_chunk: int, sampler: Sampler | None = None,
                 cache: list[Any] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Iterator[Commit]:
    """Decoding by the target alone, through mlx-lm's own generate_step: greedy, or drawing
    from `sampler`'s processed distribution (the same one speculative sampling keeps).
    `cache`: the target's caches to continue (a resumed conversation); `progress(done, total)`
    is called after each prefill chunk."""
    from mlx_lm.generate import generate_step, generation_stream

    def sample(logprobs: mx.array) -> mx.array:
        token = next_token(logprobs, sampler)
        return target.agree(token)[0].reshape(token.shape)  # sharded: rank 0's token

    plain = sampler is None and target.lockstep is None  # mlx-lm's own argmax
    steps = generate_step(mx.array(prompt), target.model, max_tokens=max_tokens,
                          prefill_step_size=prefill_chunk, prompt_cache=cache,
                          prompt_progress_callback=progress,
                          sampler=None if plain else sample)
    for token, _ in steps:
        if target.lockstep is not None:
            # generate_step has queued its next step on its own stream: let its collectives
            # finish before the caller's (another stream's) can interleave with them.
            mx.synchronize(generation_stream)
        yield Commit([int(token)], 0)
