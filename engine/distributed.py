"""A target sharded over mx.distributed: tensor-parallel loading and the lockstep protocol.

Every rank loads its slice of the target with mlx-lm's own `Model.shard(group)` (weights
read lazily, so a rank materializes only its part) and the whole draft. Every rank then runs
the same cycle: the layers' all_sums give every rank the same hidden states, so the same
taps, draft and argmax. Rank 0 owns input and output and the others follow what it
broadcasts: each request (`announce` / `receive`; also pair loads and cache clears), each
cycle's drafted tokens, accepted count and next token (`agree`), and whether to run another
cycle (`gate`, so a reply cancelled on rank 0 stops everywhere). Broadcasts are all_sums in
which the followers contribute zeros: exact, and one collective each.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .errors import ConfigError, UnsupportedModel
from .loading import (
    Progress,
    _say,
    check_target_folder,
    checkpoint_precision,
    dequantize_floats,
    load_target,
    offline_weights,
    resolve_local,
)
from .registry import DEFAULT_TARGET

BACKENDS = ("any", "ring", "jaccl", "mpi", "nccl")


class Lockstep:
    """Rank 0 decides; every rank gets rank 0's values."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank, self.size = group.rank(), group.size()

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, x: mx.array) -> mx.array:
        """Rank 0's `x` on every rank (same shape and dtype everywhere). The followers' zeros
        still depend on their own `x`: every rank's graph then has the same shape, so MLX
        runs the collectives in the same order everywhere (a follower's constant would let
        this one run before collectives it should follow). Integers travel as float32, the
        dtype every backend sums: exact below 2**24 (token ids, counts, bytes)."""
        mine = mx.where(self.leader, x, mx.zeros_like(x))
        if mx.issubdtype(x.dtype, mx.floating):
            return mx.distributed.all_sum(mine, group=self.group)
        summed = mx.distributed.all_sum(mine.astype(mx.float32), group=self.group)
        return summed.astype(x.dtype)

    def agree(self, *values: mx.array) -> tuple[mx.array, ...]:
        """Rank 0's integer arrays (as int32), in one collective: a data-dependent decision
        (the drafted tokens, the accepted count, the next token) must be the same on every
        rank even where a near-tie or a sampled draw differs."""
        flat = [mx.array(v).astype(mx.int32).reshape(-1) for v in values]
        joined = self.broadcast(mx.concatenate(flat))
        bounds = [0]
        for f in flat:
            bounds.append(bounds[-1] + f.size)
        return tuple(joined[a:b].reshape(mx.array(v).shape)
                     for v, a, b in zip(values, bounds[:-1], bounds[1:], strict=True))

    def broadcast_int(self, value: int) -> int:
        """Rank 0's non-negative int below 2**40, as base-2**16 digits (exact as float32)."""
        digits = self.broadcast(mx.array([value >> 32, (value >> 16) & 0xFFFF,
                                          value & 0xFFFF], dtype=mx.int32)).tolist()
        return (digits[0] << 32) | (digits[1] << 16) | digits[2]

    # -- requests ------------------------------------------------------------------------
    def announce(self, request: dict | None) -> None:
        """Rank 0: send a request (None: the followers return from `follow`)."""
        data = json.dumps(request).encode()
        self.broadcast_int(len(data))
        mx.eval(self.broadcast(mx.array(list(data), dtype=mx.int32)))

    def receive(self) -> dict | None:
        """A follower: the next request rank 0 announces (None: stop)."""
        n = self.broadcast_int(0)
        data = self.broadcast(mx.zeros((n,), dtype=mx.int32))
        return json.loads(bytes(data.tolist()).decode())

    def gate(self, go: bool) -> bool:
        """Whether rank 0 runs another cycle (every rank calls this once per commit)."""
        return bool(self.broadcast_int(int(go)))

    def gated(self, commits: Iterator[Any], request: dict) -> Iterator[Any]:
        """A request's commits in lockstep: rank 0 announces it on the first next(), and after
        each commit every rank learns whether rank 0 wants more (it stops on EOS, length or a
        cancelled reply: a closed generator)."""
        if self.leader:
            self.announce(request)
        try:
            for commit in commits:
                yield commit
                if not self.gate(True):
                    return
        except GeneratorExit:
            self.gate(False)
            raise
        finally:
            commits.close()


def init_group(backend: str = "any") -> mx.distributed.Group:
    """This process's group; a clear error when it was not started as one of several ranks."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown distributed backend {backend!r}: use one of "
                          f"{', '.join(BACKENDS)}.")
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"--distributed: no distributed group ({str(exc).strip() or type(exc).__name__}). "
            "Fix: start every rank with `mlx.launch` (docs/sharded.md), or "
            "drop --distributed.") from exc
    if group.size() < 2:
        raise ConfigError("--distributed: this process is the only rank. Fix: start it with "
                          "`mlx.launch -n 2 ...` (docs/sharded.md).")
    return group


def check_shardable(model: nn.Module, size: int) -> None:
    """Refuse, in one line, a target whose heads or widths do not split over `size` ranks
    (mlx-lm's shard() would fail later with a reshape error)."""
    if not hasattr(model, "shard"):
        raise UnsupportedModel(
            f"mlx-lm has no tensor-parallel shard() for model_type "
            f"{getattr(model, 'model_type', '?')!r}. Fix: run it on one machine.")
    args = getattr(model, "language_model", model).args
    names = ["num_attention_heads", "intermediate_size", "linear_num_key_heads",
             "linear_num_value_heads"]
    qwen3_5 = str(getattr(args, "model_type", "")).startswith("qwen3_5")
    if not qwen3_5:  # qwen3_5's shard() repeats KV heads when there are fewer than ranks
        names.append("num_key_value_heads")
    if qwen3_5 and not args.tie_word_embeddings:
        names.append("vocab_size")  # its output head is sharded by vocabulary rows
    for name in names:
        value = getattr(args, name, None)
        if value and value % size:
            raise ConfigError(f"cannot shard this target over {size} ranks: {name}={value} is "
                              f"not a multiple of {size}. Fix: use a number of ranks that "
                              "divides it.")


def load_sharded_target(model_id: str, dtype: str | None, group: mx.distributed.Group,
                        progress: Progress | None = None) -> tuple[nn.Module, Any, str]:
    """load_target, sharded: -> (this rank's part of the model, tokenizer, resolved id).
    A folder loads as mlx-lm's sharded_load does (lazy weights, shard(), then only this
    rank's slices are evaluated), with the engine's numerics policy applied before the
    split; an offline GGUF target is loaded whole, then sharded."""
    if offline_weights(model_id) is not None:
        model, tokenizer, resolved = load_target(model_id, dtype, progress)
        check_shardable(model, group.size())
        model.shard(group)
        mx.eval(model.parameters())
        return model, tokenizer, resolved or DEFAULT_TARGET
    from mlx_lm.utils import load_model, load_tokenizer

    path = resolve_local(model_id, progress)
    check_target_folder(path)
    _say(progress, f"loading rank {group.rank()}'s part of {model_id}")
    try:
        model, config = load_model(path, lazy=True)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id", None))
    except Exception as exc:  # the files passed the checks above: the model itself is the issue
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedModel(
            f"mlx-lm could not load {model_id} ({detail}). Fix: pass an mlx-lm compatible "
            "model.") from exc
    check_shardable(model, group.size())
    if not checkpoint_precision(dtype):  # the CPU's float32, or the dtype asked for (lazy)
        dequantize_floats(model, getattr(mx, dtype or "float32"))
    model.shard(group)
    mx.eval(model.parameters())
    return model, tokenizer, model_id


def follow(runtime: Any, backend: str = "any") -> None:
    """A follower rank's whole life: run each request rank 0 announces, in lockstep, and
    discard the output; return when rank 0 announces None (its `close_followers`). Rank 0
    may also clear the conversation cache or load another pair (`announce_load`); `runtime`
    may be None when rank 0 chooses the first pair at run time (the chat app)."""
    step = runtime.lockstep if runtime is not None else Lockstep(init_group(backend))
    while (request := step.receive()) is not None:
        if "load" in request:
            runtime = None  # rank 0 drops its pair too: the old one's memory is freed first
            runtime = _load(request["load"], backend)
            step = runtime.lockstep if runtime is not None else step
        elif "clear_cache" in request:
            runtime.clear_cache()
        else:
            for _ in runtime.stream_generate(request.pop("ids"), **request):
                pass


def announce_load(model: str | None, draft: str | None, config: Any,
                  backend: str = "any") -> None:
    """Rank 0, before it loads a pair with distributed=`backend`: the followers in `follow`
    load the same pair (a pair that fails to load fails on every rank alike)."""
    from dataclasses import asdict

    Lockstep(init_group(backend)).announce(
        {"load": {"model": model, "draft": draft, "config": asdict(config)}})


def _load(spec: dict, backend: str) -> Any:
    from . import DFlashConfig, DFlashRuntime  # the package's lazy names: no import cycle
    from .errors import DFlashError

    try:
        return DFlashRuntime.from_pretrained(model=spec["model"], draft=spec["draft"],
                                             config=DFlashConfig(**spec["config"]),
                                             distributed=backend)
    except DFlashError:
        return None  # rank 0 fails on the same files and shows the error; wait for the next
