"""`dflash train-draft`: train a DFlash draft for any target the engine loads (MLX).

The published recipe: the target answers a prompt set greedily (so the draft learns exactly
what it will have to predict); per sequence, random anchors inside the response each start a
block `[anchor token, mask x (B-1)]`; one draft forward handles every block of a batch under
an explicit mask (a block sees the target context strictly before its anchor plus itself);
the loss is cross-entropy on slots 1..B-1 with weights exp(-(k-1)/gamma). The target is
frozen: its embedding and lm_head are borrowed, never trained, never saved.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..cycle import PhaseClock
from ..draft import DFlashDraft, DraftArgs, default_tap_ids
from ..errors import ConfigError
from ..targets.base import TargetAdapter
from .dataset import (
    Dataset,
    data_weight,
    distinct_prompts,
    encode_prompts,
    length_grouped_order,
    parse_data_weights,
    token_ranking,
    weighted_indices,
    write_token_ranking,
)
from .generate import ATTENTION, generate_dataset
from .objective import (
    Batch,
    LossVocabulary,
    block_loss,
    block_runs,
    computing_in,
    forward_parts,
    low_precision_head,
    make_batch,
    simulate_answer,
    slot_logits,
    slot_weights,
    target_taps,
    tokens_per_cycle,
)

GAMMAS = {16: 7.0, 10: 5.0, 8: 4.0}
# With --train-seconds the schedule's length is set again every this many steps (the pace)
REPLAN_EVERY = 100


# -- configuration ------------------------------------------------------------------------
@dataclass
class TrainConfig:
    model: str
    out: str
    depth: int = 3
    block_size: int = 16
    taps: list[int] | int = 4
    intermediate_size: int | None = None  # default: the target's
    steps: int = 4000
    batch: int = 16
    lr: float = 6e-4
    weight_decay: float = 0.01
    anchors: int = 64
    max_len: int = 256  # response tokens generated per prompt
    num_prompts: int = 4000
    prompt_seed: int = 0
    data: str | None = None
    extra_data: list[str] = field(default_factory=list)  # more .npz datasets to train on
    heldout: str | None = None  # held-out real-prompt answers (default: beside --data)
    prompts_file: str | None = None  # real prompts (JSONL): the mix in train/mix.py
    prompt_slice: str = "0/1"  # K/N: this run answers slice K of N disjoint prompt slices
    eval_dir: str | None = None  # evaluation sets the prompts are decontaminated against
    collect_only: bool = False  # generate the data, then stop
    gen_dtype: str | None = None  # target dtype for data generation (default: --dtype)
    gen_token_budget: int = 1 << 18  # prompt + answer tokens per generation batch
    gen_attention: str = "auto"  # a decode step's attention (generate.decode_logits)
    gen_back_to_back: bool = False  # queue decode steps back to back (the old loop)
    gen_shares: str | None = None  # phase=share,... of the generation time (collect.py)
    skip_answered: list[str] = field(default_factory=list)  # datasets not to ask again
    # "PATTERN=W,...": each data file's share of an epoch by its name (dataset.
    # parse_data_weights; e.g. fresh answers whole, older ones replayed in part); None: all 1
    data_weights: str | None = None
    resume: bool = False
    init: str | None = None  # start from this draft folder (its shape, taps and mask id)
    checkpoint_every: int = 500
    val_every: int = 250
    val_size: int = 64
    gen_batch: int = 256
    gen_seconds: float | None = None  # stop generating new data after this long
    train_seconds: float | None = None  # shrink the cosine schedule to fit this long
    pause_after: float | None = None  # end this run after this long; --resume continues it
    profile_steps: int = 0  # time each phase of this many steps (host syncs between them)
    group_by_length: bool = True  # batches of similar lengths (less padding in the forward)
    dtype: str = "float32"  # target dtype: float32 reproduces CPU fp32 greedy outputs
    save_dtype: str = "bfloat16"
    head_dtype: str = "float32"  # lm_head precision in the training loss (bfloat16: faster)
    loss_vocab: int = 0  # the loss's softmax over this many tokens (LossVocabulary); 0: all
    # the draft's forward and backward (bfloat16: float32 weights, bfloat16 matmuls)
    draft_compute_dtype: str = "float32"
    mask_token_id: int | None = None
    state_dir: str | None = None  # optimizer state for --resume (default OUT/resume)
    log: str | None = None  # training log JSON (default OUT/train-log.json)
    distributed: str | None = None  # data-parallel over mx.distributed with this backend
    seed: int = 0
    progress: bool = True
    loss_gamma: float | None = None  # slot weights exp(-(k-1)/gamma); default by block size

    @property
    def gamma(self) -> float:
        if self.loss_gamma is not None:
            return self.loss_gamma
        return GAMMAS.get(self.block_size, 7.0 * self.block_size / 16)


# -- draft construction -------------------------------------------------------------------
def pick_mask_token(tokenizer: Any, vocab_size: int) -> int:
    """A token the data never contains: a `mask`-like special if there is one, else the
    highest-id special token that is not EOS/BOS/pad or a chat marker."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    added = dict(getattr(hf, "added_tokens_encoder", {}) or {})
    for text, i in added.items():
        if "mask" in text.lower() and i < vocab_size:
            return i
    used = set(getattr(tokenizer, "eos_token_ids", []) or [])
    for name in ("bos_token_id", "pad_token_id", "eos_token_id"):
        if getattr(hf, name, None) is not None:
            used.add(getattr(hf, name))
    skip = ("im_start", "im_end", "endoftext", "bos", "eos", "pad")
    free = [i for t, i in added.items()
            if i not in used and i < vocab_size and not any(s in t.lower() for s in skip)]
    return max(free) if free else vocab_size - 1


def draft_args_for(target: TargetAdapter, cfg: TrainConfig, mask_id: int) -> DraftArgs:
    targs, L = target.args, target.num_layers
    taps = cfg.taps if isinstance(cfg.taps, list) else default_tap_ids(L, cfg.taps)
    if len(set(taps)) != len(taps) or not all(0 <= t < L for t in taps):
        fitting = sorted({min(max(t, 0), L - 1) for t in taps})
        raise ConfigError(f"--taps {cfg.taps}: layers {taps} of a {L}-layer target are not "
                          f"distinct layers 0..{L - 1}; pass fewer taps, or a list such as "
                          f"--taps {','.join(map(str, fitting))}")
    heads = int(getattr(targs, "num_attention_heads", 8))
    kv = int(getattr(targs, "num_key_value_heads", None) or heads)
    hd = int(getattr(targs, "head_dim", None) or target.hidden_size // heads)
    return DraftArgs(
        hidden_size=target.hidden_size, num_hidden_layers=cfg.depth,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
        intermediate_size=cfg.intermediate_size or int(targs.intermediate_size),
        num_target_layers=L, target_layer_ids=list(taps), mask_token_id=mask_id,
        block_size=cfg.block_size, rms_norm_eps=float(getattr(targs, "rms_norm_eps", 1e-6)),
        rope_theta=float(getattr(targs, "rope_theta", 10000.0) or 10000.0),
        max_position_embeddings=int(getattr(targs, "max_position_embeddings", 8192) or 8192),
        vocab_size=target.vocab_size,
    )


def grow_draft(draft: DFlashDraft, depth: int) -> DFlashDraft:
    """`draft` with layers appended up to `depth`, each new one an identity at first (zero
    output projections: its residual branches add nothing), so training a deeper draft
    starts from what the shallower one already predicts."""
    if draft.args.layer_types:
        raise NotImplementedError("growing drafts with per-layer types is not supported")
    grown = DFlashDraft(dataclasses.replace(draft.args, num_hidden_layers=depth))
    grown.update(tree_unflatten([(k, v) for k, v in tree_flatten(draft.parameters())]),
                 strict=False)
    for layer in grown.layers[draft.args.num_hidden_layers:]:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    return grown


def grow_width(draft: DFlashDraft, intermediate_size: int) -> DFlashDraft:
    """`draft` with each MLP widened to `intermediate_size` units: the new units' gate and up
    rows start at a fresh layer's random init and their down-projection columns at zero, so
    the grown draft predicts exactly what it did until training gives them a say."""
    old = draft.args.intermediate_size
    if intermediate_size < old:
        raise ConfigError(f"--intermediate-size {intermediate_size}: a draft that continues "
                          f"from --init keeps its MLP width {old} or grows it. Fix: give "
                          f"{old} or more.")
    grown = DFlashDraft(dataclasses.replace(draft.args, intermediate_size=intermediate_size))
    fresh = dict(tree_flatten(grown.parameters()))
    merged = []
    for k, v in tree_flatten(draft.parameters()):
        if k.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            v = mx.concatenate([v, fresh[k][old:].astype(v.dtype)], axis=0)
        elif k.endswith("mlp.down_proj.weight"):
            v = mx.concatenate([v, mx.zeros((v.shape[0], intermediate_size - old), v.dtype)],
                               axis=1)
        merged.append((k, v))
    grown.update(tree_unflatten(merged), strict=False)
    return grown


def grow_taps(draft: DFlashDraft, taps: Sequence[int]) -> DFlashDraft:
    """`draft` reading target layers `taps`, which must include its own: the new taps' columns
    of `fc` start at zero, so it starts predicting exactly what it did and training decides
    what the extra layers add."""
    old = list(draft.args.target_layer_ids)
    missing = [t for t in old if t not in taps]
    if missing or len(set(taps)) != len(taps):
        raise ConfigError(f"--taps {','.join(map(str, taps))}: a draft that continues from "
                          f"--init must keep its taps {old} (add layers, do not drop or "
                          "repeat any). Fix: list all of them plus the new ones.")
    grown = DFlashDraft(dataclasses.replace(draft.args, target_layer_ids=list(taps)))
    grown.update(tree_unflatten([(k, v) for k, v in tree_flatten(draft.parameters())
                                 if k != "fc.weight"]), strict=False)
    H, w = draft.args.hidden_size, draft.fc.weight
    grown.fc.weight = mx.concatenate(
        [w[:, old.index(t) * H:(old.index(t) + 1) * H] if t in old
         else mx.zeros((w.shape[0], H), w.dtype) for t in taps], axis=1)
    return grown


CHECKPOINT_METADATA = {"format": "mlx", "producer": "dflash train-draft"}


def save_checkpoint(draft: DFlashDraft, out: Path, dtype: mx.Dtype) -> None:
    """The published layout: config.json + model.safetensors, no prefix, no embedding/head."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(draft.args.to_config(), indent=2))
    weights = {k: v.astype(dtype) for k, v in tree_flatten(draft.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata=CHECKPOINT_METADATA)


def save_state(optimizer: optim.Optimizer, draft: DFlashDraft, step: int, total: int,
               state_dir: Path, epoch: int = 0, cursor: int = 0) -> None:
    """Full-precision weights + optimizer moments and the place in the data, so --resume
    continues exactly."""
    state_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(state_dir / "draft-fp32.safetensors"),
                        dict(tree_flatten(draft.parameters())))
    opt = {k: v for k, v in tree_flatten(optimizer.state) if isinstance(v, mx.array)}
    mx.save_safetensors(str(state_dir / "optimizer.safetensors"), opt)
    (state_dir / "step.json").write_text(json.dumps({
        "step": step, "total": total, "epoch": epoch, "cursor": cursor,
        "mask_token_id": draft.args.mask_token_id, "draft": draft.args.to_config()}))


def load_state(optimizer: optim.Optimizer, draft: DFlashDraft, state_dir: Path) -> dict:
    draft.load_weights(str(state_dir / "draft-fp32.safetensors"))
    optimizer.state = tree_unflatten(list(mx.load(str(state_dir / "optimizer.safetensors"))
                                          .items()))
    return json.loads((state_dir / "step.json").read_text())


def steps_that_fit(step: int, per_step: float, seconds_left: float, cap: int) -> int:
    """The schedule's length in steps when `seconds_left` remain after `step` at `per_step`
    seconds a step: at least one more step, at most `cap`. Set again as the pace changes, so
    that the cosine decay ends when the time does."""
    return max(step + 1, min(cap, step + int(max(0.0, seconds_left) / per_step)))


def draft_optimizer(lr: float, weight_decay: float) -> optim.AdamW:
    """AdamW with its moments' bias corrected, as the recipe's PyTorch AdamW does. MLX's
    default leaves it off: the second moment then starts near zero and every update of the
    first thousand steps is larger than the schedule says (by 1 / sqrt(1 - 0.999^step)),
    which is when a draft trained on from `--init` lost held-out acceptance."""
    return optim.AdamW(learning_rate=lr, weight_decay=weight_decay, bias_correction=True)


def lr_at(step: int, total: int, peak: float, warmup_frac: float = 0.04) -> float:
    """Linear warm-up over 4% of the steps, then cosine decay to zero."""
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return peak * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return peak * 0.5 * (1 + math.cos(math.pi * t))


# -- the loop -----------------------------------------------------------------------------
def _progress(enabled: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled)


def validate(draft: DFlashDraft, target: TargetAdapter, val: Dataset, cfg: TrainConfig,
             weights: mx.array) -> dict:
    """Loss and simulated tokens/cycle on held-out sequences (fixed anchors: comparable);
    `novel_tokens_per_cycle` over the blocks whose first label repeats no earlier 4-gram
    (where a decode's suffix lookup cannot take over from the draft)."""
    rng = np.random.default_rng(1234)
    tpc_sum, blocks, loss_sum, n = 0.0, 0, 0.0, 0
    novel_sum, novel_blocks = 0.0, 0
    for i in range(0, len(val), cfg.batch):
        batch = make_batch(val, range(i, min(i + cfg.batch, len(val))), cfg.anchors,
                           cfg.block_size, draft.args.mask_token_id, rng, mark_repeats=True)
        taps = target_taps(target, batch.tokens, draft.args.target_layer_ids)
        logits = slot_logits(draft, target, batch, taps).astype(mx.float32)
        s, b = tokens_per_cycle(logits, batch)
        tpc_sum, blocks = tpc_sum + s, blocks + b
        novel = batch.valid[:, :, 0] * (1 - batch.repeats[:, :, 0])
        novel_sum += float(((1 + block_runs(logits, batch)) * novel).sum())
        novel_blocks += int(novel.sum())
        picked = mx.take_along_axis(logits, batch.labels[..., None], axis=-1)[..., 0]
        w = batch.valid * weights
        loss_sum += float(((mx.logsumexp(logits, -1) - picked) * w).sum() / w.sum())
        n += 1
    return {"tokens_per_cycle": tpc_sum / max(blocks, 1), "loss": loss_sum / max(n, 1),
            "blocks": blocks, "novel_tokens_per_cycle": novel_sum / max(novel_blocks, 1),
            "novel_blocks": novel_blocks}


def answer_walks(draft: DFlashDraft, target: TargetAdapter, val: Dataset) -> list[float | None]:
    """Tokens/cycle of the greedy decode each held-out answer would get (None: too short to
    walk). The anchor mean of `validate` overstates it: a decode's cycles start after misses,
    where the draft does worst."""
    return [simulate_answer(draft, target, seq, plen)["walk"]
            for seq, plen in zip(val.sequences, val.prompt_lens)]


def mean_walk(walks: Sequence[float | None]) -> float:
    """Answers' walks averaged over answers, as the benchmark averages its runs."""
    kept = [w for w in walks if w is not None]
    return sum(kept) / max(len(kept), 1)


def walk_tokens_per_cycle(draft: DFlashDraft, target: TargetAdapter, val: Dataset) -> float:
    """`answer_walks` averaged over answers."""
    return mean_walk(answer_walks(draft, target, val))


def held_out_sources(val: Dataset) -> dict[str, list[int]]:
    """A held-out set's answers by prompt source (a record id reads SOURCE-N; its meta's
    "ids"), sources in order; {} where the set names no ids."""
    groups: dict[str, list[int]] = {}
    for i, record_id in enumerate(val.meta.get("ids") or []):
        source = record_id.rsplit("-", 1)[0] if "-" in record_id else "other"
        groups.setdefault(source, []).append(i)
    return dict(sorted(groups.items()))


def data_names(paths: Sequence[Path]) -> list[str]:
    """Short names for data files in logs: the file name, or the whole path where two files
    share a name (data runs all write data.npz)."""
    names = [p.name for p in paths]
    return [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths)]


def collect_data(model: nn.Module, tokenizer: Any, cfg: TrainConfig, data_path: Path,
                 heldout_path: Path, say: Callable) -> Dataset:
    """The target's (`model`, loaded at --gen-dtype) answers: to the real-prompt mix when
    --prompts-file is given (phases saved beside `data_path`, so an interrupted run resumes),
    else to the templated set."""
    data_path.parent.mkdir(parents=True, exist_ok=True)
    if cfg.prompts_file:
        from .collect import Collector, MixConfig, parse_time_shares

        index, count = (int(x) for x in cfg.prompt_slice.split("/"))
        shares = parse_time_shares(cfg.gen_shares or "")
        mix = MixConfig(cfg.prompts_file, cfg.num_prompts, cfg.max_len, cfg.gen_batch,
                        cfg.gen_token_budget, cfg.gen_seconds, cfg.prompt_seed, (index, count),
                        cfg.eval_dir, attention=cfg.gen_attention,
                        in_place=not cfg.gen_back_to_back,
                        skip_answered=tuple(cfg.skip_answered), time_shares=shares)
        data, heldout = Collector(model, tokenizer, mix, data_path.parent / "phases",
                                  say).run()
        heldout.save(heldout_path)
    else:
        from .prompts import build_prompts

        prompts = build_prompts(cfg.num_prompts, cfg.prompt_seed)
        ids = encode_prompts(tokenizer, [m for _, m in prompts])
        with _progress(cfg.progress) as bar:
            task = bar.add_task("generating responses", total=len(ids))
            data = generate_dataset(model, tokenizer, ids, cfg.max_len, cfg.gen_batch,
                                    cfg.gen_seconds, lambda k: bar.advance(task, k),
                                    cfg.gen_token_budget)
        data.meta.update(prompts=len(prompts), prompt_seed=cfg.prompt_seed)
    data.save(data_path)
    say(f"data: {len(data)} sequences, {data.response_tokens} response tokens")
    return data


def train(cfg: TrainConfig, say: Callable[[str], None] = print) -> dict:
    """Generate (or load) data, train, checkpoint; -> the training log."""
    from ..loading import load_target
    from ..targets import adapter_for

    for flag, paths in (("--extra-data", cfg.extra_data), ("--skip-answered", cfg.skip_answered)):
        missing = [e for e in paths if not Path(e).is_file()]
        if missing:  # before minutes of loading and data generation, not after
            raise ConfigError(f"{flag} {missing[0]}: no such file (a .npz written by "
                              "train-draft, e.g. OUT/resume/data.npz)")
    if not re.fullmatch(r"\d+/[1-9]\d*", cfg.prompt_slice) or (
            int(cfg.prompt_slice.split("/")[0]) >= int(cfg.prompt_slice.split("/")[1])):
        raise ConfigError(f"--prompt-slice {cfg.prompt_slice}: expected K/N with 0 <= K < N, "
                          "e.g. 0/2")
    if cfg.loss_vocab < 0:
        raise ConfigError(f"--loss-vocab {cfg.loss_vocab}: expected a token count (e.g. 16384), "
                          "or 0 for the whole vocabulary")
    if cfg.prompts_file and not Path(cfg.prompts_file).is_file():
        raise ConfigError(f"--prompts-file {cfg.prompts_file}: no such file (a JSONL(.gz) of "
                          "records with id, prompt, source)")
    try:
        weight_rules = parse_data_weights(cfg.data_weights) if cfg.data_weights else []
    except ValueError as exc:
        raise ConfigError(f"--data-weights {exc}") from None
    t0 = time.perf_counter()
    mx.random.seed(cfg.seed)
    group = mx.distributed.init(strict=True, backend=cfg.distributed) if cfg.distributed else None
    rank, world = (group.rank(), group.size()) if group is not None else (0, 1)
    lead = rank == 0  # in data-parallel runs rank 0 alone reports, validates and saves
    if not lead:
        say = _quiet
    elif world > 1:
        say(f"data-parallel over {world} ranks ({cfg.distributed}): {cfg.batch} sequences "
            f"per rank and step")

    def agree(value: float) -> float:
        """The ranks' mean of `value`: the same number on every rank, so every rank takes
        the same branch (step counts must match for the gradient all-reduce)."""
        if group is None:
            return value
        total = mx.distributed.all_sum(mx.array(float(value), dtype=mx.float32), group=group)
        return float(total.item()) / world

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    state_dir = Path(cfg.state_dir) if cfg.state_dir else out / "resume"
    log_path = Path(cfg.log) if cfg.log else out / "train-log.json"
    data_path = Path(cfg.data) if cfg.data else out / "resume" / "data.npz"
    heldout_path = Path(cfg.heldout) if cfg.heldout else data_path.with_name("heldout.npz")
    collecting = not data_path.is_file()
    if collecting and world > 1:
        raise ConfigError(f"--data {data_path}: no such file; a data-parallel run trains on "
                          "existing data (collect it first with --collect-only)")
    # loaded in the dtype it is first needed in: a run that only answers loads it once
    first_dtype = (cfg.gen_dtype or cfg.dtype) if collecting else cfg.dtype
    model, tokenizer, model_id = load_target(cfg.model, first_dtype)
    model.freeze()
    say(f"target {model_id} ({first_dtype})")
    if collecting:
        data = collect_data(model, tokenizer, cfg, data_path, heldout_path, say)
    else:
        data = Dataset.load(data_path)
        say(f"data: reusing {data_path} ({len(data)} sequences)")
    gen_s = time.perf_counter() - t0
    if cfg.collect_only:
        return {"data": data.meta, "sequences": len(data), "seconds": gen_s}
    if first_dtype != cfg.dtype:  # answered at --gen-dtype, trained against --dtype
        del model
        model, tokenizer, model_id = load_target(cfg.model, cfg.dtype)
        model.freeze()
    target = adapter_for(model)
    say(f"target {model_id}: {target.num_layers} layers, hidden {target.hidden_size}")
    # every data file keeps its own validation split; the held-out real prompts (never
    # trained on in any stage) are the figure that counts
    val_sets: dict[str, Dataset] = {}
    if heldout_path.is_file():
        val_sets["heldout"] = Dataset.load(heldout_path)
    train_parts = []
    paths = [data_path, *map(Path, cfg.extra_data)]
    names = data_names(paths)
    for path, name in zip(paths, names):
        part = data if path == data_path else Dataset.load(path)
        kept, val = part.split(cfg.val_size)
        train_parts.append(kept)
        val_sets[name] = val
        say(f"data: {len(kept)} training + {len(val)} validation sequences from {path}")
    # a prompt answered by two runs, or one the held-out set has, is trained on once / never
    train_parts, dropped = distinct_prompts(train_parts, val_sets.get("heldout"))
    if any(dropped.values()):
        say(f"data: dropped {dropped['duplicate_prompts']} repeated and "
            f"{dropped['held_out_prompts']} held-out prompts")
    train_set = Dataset.concat(train_parts)
    part_weights = {name: data_weight(str(path), weight_rules)
                    for name, path in zip(names, paths)}
    if weight_rules:
        share = sum(len(p) * w for p, w in zip(train_parts, part_weights.values()))
        if round(share) < 1:
            raise ConfigError(f"--data-weights {cfg.data_weights}: no training sequence left "
                              f"(weights {part_weights})")
        say("data: an epoch takes " + ", ".join(
            f"{w:g} x {name}" for name, w in part_weights.items()))
    val_name = "heldout" if "heldout" in val_sets else next(iter(val_sets))
    val_set = val_sets[val_name]

    mask_id = cfg.mask_token_id
    resuming = cfg.resume and (state_dir / "step.json").is_file()
    saved = json.loads((state_dir / "step.json").read_text()) if resuming else {}
    if mask_id is None and resuming:  # the run's own: another machine's tokenizer may differ
        mask_id = saved.get("mask_token_id")
    if mask_id is None:
        mask_id = pick_mask_token(tokenizer, target.vocab_size)
    if "draft" in saved:
        # the paused run's own shape (its taps above all), whatever these flags would build:
        # a tap count's default rule need not give the taps an --init draft came with
        draft = DFlashDraft(DraftArgs.from_config(saved["draft"]))
    elif cfg.init:
        from ..loading import dequantize_floats, load_draft_folder

        draft = load_draft_folder(Path(cfg.init), mx.float32)
        dequantize_floats(draft, mx.float32)  # a draft stored 8-bit trains as floats
        mask_id = draft.args.mask_token_id
        say(f"initialised from {cfg.init}")
        if cfg.depth > draft.args.num_hidden_layers:
            say(f"grown from {draft.args.num_hidden_layers} to {cfg.depth} layers")
            draft = grow_draft(draft, cfg.depth)
        width = cfg.intermediate_size or draft.args.intermediate_size
        if width != draft.args.intermediate_size:
            say(f"MLP grown from {draft.args.intermediate_size} to {width} units")
            draft = grow_width(draft, width)
        # a tap count keeps the draft's taps; an explicit list may add layers to them
        if isinstance(cfg.taps, list) and cfg.taps != draft.args.target_layer_ids:
            say(f"taps grown from {draft.args.target_layer_ids} to {cfg.taps}")
            draft = grow_taps(draft, cfg.taps)
    else:
        draft = DFlashDraft(draft_args_for(target, cfg, mask_id))
        # Start the output norm at the target's final norm: the draft's hidden states feed
        # the target's lm_head, so this begins with logits on the target's scale.
        draft.norm.weight = target.inner.norm.weight.astype(draft.norm.weight.dtype)
    weights = slot_weights(cfg.block_size, cfg.gamma)
    optimizer = draft_optimizer(cfg.lr, cfg.weight_decay)
    head_dtype = getattr(mx, cfg.head_dtype)
    # one copy of the head's weight in head_dtype: the whole head's, or loss_vocab's to
    # take each step's subset from
    ranking = token_ranking([train_set])  # the loss vocabulary's order, and the draft's file
    loss_vocab = (LossVocabulary.build(target, head_dtype, ranking, cfg.loss_vocab)
                  if cfg.loss_vocab else None)
    compute_dtype = getattr(mx, cfg.draft_compute_dtype)
    # this step's head: the whole vocabulary's, or loss_vocab's subset (set with each batch)
    step_head = [None if loss_vocab else low_precision_head(target, head_dtype)]

    def loss_of(b: Batch, t: mx.array) -> mx.array:
        with computing_in(draft, compute_dtype):
            return block_loss(draft, target, b, t, weights, step_head[0])

    loss_and_grad = nn.value_and_grad(draft, loss_of)
    step, total, epoch, cursor = 0, cfg.steps, 0, 0
    earlier: dict[str, Any] = {}  # the log of the run this one resumes
    if resuming:
        optimizer.init(draft.trainable_parameters())
        resumed = load_state(optimizer, draft, state_dir)
        step, total = resumed["step"], resumed["total"]
        epoch, cursor = resumed.get("epoch", 0), resumed.get("cursor", 0)
        if log_path.is_file():
            earlier = json.loads(log_path.read_text())
        say(f"resumed at step {step} of {total}")
    n_params = sum(v.size for _, v in tree_flatten(draft.parameters()))
    say(f"draft: {draft.args.num_hidden_layers} layers, taps {draft.args.target_layer_ids}, "
        f"{n_params / 1e6:.2f}M parameters, mask token {mask_id}")

    def data_order(epoch: int) -> np.ndarray:  # the same on every rank, and after --resume
        rng = np.random.default_rng([cfg.seed, epoch])
        pool = (weighted_indices([len(p) for p in train_parts], list(part_weights.values()),
                                 rng) if weight_rules else np.arange(len(train_set)))
        if not cfg.group_by_length:
            return pool[rng.permutation(len(pool))]
        # one step's sequences (all ranks) come from one length group
        return pool[length_grouped_order([len(train_set.sequences[i]) for i in pool],
                                         cfg.batch * world, rng)]

    log: dict[str, Any] = {"config": asdict(cfg), "target": model_id, "params": n_params,
                           "data": {**data.meta, "sequences": len(data),
                                    "train_sequences": len(train_set), "dropped": dropped,
                                    "weights": part_weights,
                                    "val_sequences": len(val_set),
                                    "val_sets": {k: len(v) for k, v in val_sets.items()},
                                    "response_tokens": data.response_tokens,
                                    "total_tokens": sum(len(s) for s in data.sequences)},
                           "history": earlier.get("history", []),
                           "val": earlier.get("val", []), "env": _env()}
    if "step_profile" in earlier:  # timed in an earlier call of this schedule
        log["step_profile"] = earlier["step_profile"]
    if step == 0 and cfg.init and lead:  # where the initial draft starts, on the same anchors
        v = validate(draft, target, val_set, cfg, weights)
        v["walk_tokens_per_cycle"] = walk_tokens_per_cycle(draft, target, val_set)
        log["val"].append({"step": 0, "set": val_name, **v})
        say(f"step 0: {val_name} loss {v['loss']:.3f}  tokens/cycle {v['tokens_per_cycle']:.2f}"
            f"  novel {v['novel_tokens_per_cycle']:.2f}  decode walk "
            f"{v['walk_tokens_per_cycle']:.2f}")
    order = data_order(epoch)
    train_start = time.perf_counter()
    log_start = train_start - earlier.get("train_seconds", 0.0)  # a resumed run's clock goes on
    first_step = step
    losses: list[float] = []
    queued: mx.array | None = None  # the last step's loss, not read yet
    phase_ms: dict[str, list[float]] = {}
    with _progress(cfg.progress) as bar:
        task = bar.add_task("training", total=total, completed=step)
        while step < total:
            if cursor + cfg.batch * world > len(order):
                epoch, cursor = epoch + 1, 0
                order = data_order(epoch)
            # steps 5.. of this run, timed phase by phase when asked (a sync after each)
            timed = 5 <= step - first_step < 5 + cfg.profile_steps
            clock = PhaseClock() if timed else None
            idx = order[cursor + rank * cfg.batch:cursor + (rank + 1) * cfg.batch]
            cursor += cfg.batch * world
            anchor_rng = np.random.default_rng([cfg.seed, step, rank])  # resumes exactly
            batch = make_batch(train_set, idx, cfg.anchors, cfg.block_size, mask_id, anchor_rng)
            if loss_vocab is not None:
                batch, step_head[0] = loss_vocab.restrict(batch)
            _lap(clock, phase_ms, "batch")
            taps = target_taps(target, batch.tokens, draft.args.target_layer_ids)
            _lap(clock, phase_ms, "target", taps)
            optimizer.learning_rate = lr_at(step, total, cfg.lr)
            if clock is not None:  # where the forward's time goes (extra work, timed steps only)
                with computing_in(draft, compute_dtype):
                    for phase, part in forward_parts(draft, target, batch, taps, weights,
                                                     step_head[0]):
                        _lap(clock, phase_ms, phase, part)
            loss, grads = loss_and_grad(batch, taps)
            _lap(clock, phase_ms, "draft_forward_backward", loss, grads)
            if group is not None:
                grads = nn.average_gradients(grads, group)
                loss = mx.distributed.all_sum(loss, group=group) / world
                _lap(clock, phase_ms, "all_reduce", loss, grads)
            grads, norm = optim.clip_grad_norm(grads, 1.0)
            optimizer.update(draft, grads)
            # Queued, not waited for: the host builds the next step while the device runs
            # this one; the loss read below waits for the step before it.
            mx.async_eval(loss, norm, draft.parameters(), optimizer.state)
            _lap(clock, phase_ms, "update", loss, norm, draft.parameters(), optimizer.state)
            if timed and step - first_step == 4 + cfg.profile_steps:
                log["step_profile"] = {k: float(np.median(v)) for k, v in phase_ms.items()}
                say("step phases (median ms): " + ", ".join(
                    f"{k} {v:.1f}" for k, v in log["step_profile"].items()))
            step += 1
            if queued is not None:
                losses.append(float(queued))
            queued = loss
            if cfg.train_seconds and agree(
                    time.perf_counter() - train_start > 1.2 * cfg.train_seconds) > 0:
                say(f"out of time at step {step}: stopping early")
                break
            if step - first_step == 5:
                t5 = time.perf_counter()
            pausing = cfg.pause_after is not None and agree(
                time.perf_counter() - train_start > cfg.pause_after) > 0
            ran = step - first_step
            if cfg.train_seconds and (ran == 20 or (ran > 20 and step % REPLAN_EVERY == 0)):
                # the pace since step 5 (the first steps include kernel compilation), validation
                # included: later batches are often longer than the first ones
                per_step = agree((time.perf_counter() - t5) / (ran - 5))
                left = agree(cfg.train_seconds - (time.perf_counter() - log_start))
                fits = steps_that_fit(step, per_step, left, cfg.steps)
                if fits != total:
                    total = fits
                    bar.update(task, total=total)
                    say(f"{per_step * 1e3:.0f} ms/step: schedule set to {total} steps")
            logged = step % 10 == 0 or step == total or pausing
            if logged:  # the log reads this step's loss too
                losses.append(float(queued))
                queued = None
            if losses:
                bar.update(task, description=f"training loss {np.mean(losses[-20:]):.3f}")
            bar.update(task, advance=1)
            if logged:
                log["history"].append({"step": step, "loss": float(np.mean(losses[-10:])),
                                       "lr": lr_at(step - 1, total, cfg.lr), "grad_norm":
                                       float(norm), "epoch": epoch,
                                       "seconds": time.perf_counter() - log_start})
            if pausing:
                say(f"paused at step {step} of {total}: continue with --resume")
                break
            if not lead:
                continue
            if step % cfg.val_every == 0 or step == total:
                v = validate(draft, target, val_set, cfg, weights)
                log["val"].append({"step": step, "set": val_name, **v})
                say(f"step {step}: loss {np.mean(losses[-50:]):.3f}  {val_name} loss "
                    f"{v['loss']:.3f}  tokens/cycle {v['tokens_per_cycle']:.2f}  novel "
                    f"{v['novel_tokens_per_cycle']:.2f}")
            if step % cfg.checkpoint_every == 0 or step == total:
                save_checkpoint(draft, out, getattr(mx, cfg.save_dtype))
                save_state(optimizer, draft, step, total, state_dir, epoch, cursor)
                _write_log(log, log_path, step, total, gen_s, log_start, t0)
    # the ranks must hold the same weights: a divergence would mean a skipped all-reduce
    checksum = float(sum(mx.sum(v.astype(mx.float32)) for _, v in
                         tree_flatten(draft.trainable_parameters())).item())
    agreed = agree(checksum) == checksum
    if not lead:
        return {"rank": rank, "steps": step}
    log["ranks"] = {"count": world, "weights_agree": agreed}
    log["paused"] = step < total
    save_checkpoint(draft, out, getattr(mx, cfg.save_dtype))
    save_state(optimizer, draft, step, total, state_dir, epoch, cursor)
    files = " + ".join(Path(f).name for f in [data_path, *cfg.extra_data])
    write_token_ranking(ranking, out, f"dflash train-draft: response-token counts of the "
                        f"training sequences ({len(train_set)}, validation held out) of {files}")
    if log["paused"]:  # the run that finishes the schedule validates; this one saves its time
        _write_log(log, log_path, step, total, gen_s, log_start, t0)
        return log
    final = validate(draft, target, val_set, cfg, weights)
    walks = answer_walks(draft, target, val_set)
    final["walk_tokens_per_cycle"] = mean_walk(walks)
    log["final_val"] = {"set": val_name, **final}
    log["final_val_sets"] = {name: final if name == val_name else
                             validate(draft, target, v, cfg, weights)
                             for name, v in val_sets.items() if len(v)}
    # where the draft is weak, by the kind of prompt (the held-out set's sources)
    log["final_val_by_source"] = {
        source: {**validate(draft, target, val_set.subset(idx), cfg, weights),
                 "walk_tokens_per_cycle": mean_walk([walks[i] for i in idx]),
                 "answers": len(idx)}
        for source, idx in held_out_sources(val_set).items()}
    _write_log(log, log_path, step, total, gen_s, log_start, t0)
    say(f"done: {step} steps, val tokens/cycle {final['tokens_per_cycle']:.2f} (novel "
        f"{final['novel_tokens_per_cycle']:.2f}, decode walk "
        f"{final['walk_tokens_per_cycle']:.2f}), checkpoint {out}")
    if log["final_val_by_source"]:
        say(f"{val_name} decode walk by source: " + ", ".join(
            f"{source} {row['walk_tokens_per_cycle']:.2f} ({row['answers']})"
            for source, row in log["final_val_by_source"].items()))
    return log


def _lap(clock: PhaseClock | None, into: dict[str, list[float]], phase: str,
         *arrays: mx.array) -> None:
    """A timed step's phase in milliseconds (the clock evaluates its outputs first); nothing,
    and no sync, in the steps that are not timed."""
    if clock is not None:
        into.setdefault(phase, []).append(clock.lap(*arrays) * 1e3)


def _quiet(line: str) -> None:
    """`say` for the ranks that follow rank 0 in a data-parallel run."""


def _write_log(log: dict, path: Path, step: int, total: int, gen_s: float, train_start: float,
               t0: float) -> None:
    log.update(steps=step, total_steps=total, data_seconds=gen_s,
               train_seconds=time.perf_counter() - train_start,
               wall_seconds=time.perf_counter() - t0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(log, indent=1, default=str))


def _env() -> dict:
    import importlib.metadata as md

    device = str(mx.default_device())
    with contextlib.suppress(Exception):  # older MLX / no device info
        device += f" ({mx.device_info().get('device_name', '')})"
    return {"mlx": mx.__version__, "mlx_lm": md.version("mlx-lm"), "python":
            platform.python_version(), "device": device, "machine": platform.machine(),
            "tf32": os.environ.get("MLX_ENABLE_TF32")}


# -- CLI ----------------------------------------------------------------------------------
def _taps(text: str) -> list[int] | int:
    return [int(t) for t in text.split(",")] if "," in text else int(text)


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig(model="", out="")
    p = argparse.ArgumentParser(prog="dflash train-draft",
                                description="Train a DFlash draft for a target (MLX).")
    p.add_argument("--model", required=True, help="target id or folder (mlx-lm loadable)")
    p.add_argument("--out", required=True, help="draft folder to write (published layout)")
    p.add_argument("--depth", type=int, default=d.depth, help="draft layers")
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--taps", type=_taps, default=d.taps,
                   help="number of tapped target layers, or an explicit list like 1,9,17 "
                        "(with --init: a list that adds layers to the draft's taps)")
    p.add_argument("--intermediate-size", type=int, help="draft MLP width (default: target's)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per step")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--anchors", type=int, default=d.anchors, help="blocks per sequence")
    p.add_argument("--max-len", type=int, default=d.max_len,
                   help="response tokens the target generates per prompt")
    p.add_argument("--num-prompts", type=int, default=d.num_prompts)
    p.add_argument("--prompt-seed", type=int, default=d.prompt_seed)
    p.add_argument("--data", help="dataset .npz to reuse (or to write, if missing)")
    p.add_argument("--extra-data", action="append", default=[], metavar="NPZ",
                   help="another dataset to train on too (repeatable; not validated on)")
    p.add_argument("--heldout", metavar="NPZ",
                   help="held-out real-prompt answers to validate on (default: beside --data)")
    p.add_argument("--prompts-file", metavar="JSONL",
                   help="real prompts to answer (records with id, prompt, source, turns)")
    p.add_argument("--prompt-slice", default=d.prompt_slice, metavar="K/N",
                   help="answer slice K of N disjoint slices of the prompts")
    p.add_argument("--eval-dir", metavar="DIR",
                   help="evaluation sets (mt_bench.jsonl, ...) to decontaminate against")
    p.add_argument("--collect-only", action="store_true", help="generate the data and stop")
    p.add_argument("--gen-dtype", help="target dtype for data generation (default: --dtype)")
    p.add_argument("--gen-token-budget", type=int, default=d.gen_token_budget,
                   help="prompt + answer tokens per generation batch (bounds the KV cache)")
    p.add_argument("--gen-attention", default=d.gen_attention, choices=ATTENTION,
                   help="decode-step attention of data generation: mlx-lm's own, the grouped "
                        "products of engine.train.generate.grouped_sdpa, or auto (each "
                        "generation batch times both on its first steps, then keeps the faster)")
    p.add_argument("--gen-back-to-back", action="store_true",
                   help="queue data generation's decode steps back to back (the old loop: "
                        "each step then copies the KV cache, see generate.RunningBatch)")
    p.add_argument("--gen-shares", type=_checked(_time_shares), metavar="PHASE=SHARE,...",
                   help="shares of --gen-seconds per phase (heldout, single, multiturn, magpie, "
                        "templated; unnamed ones keep their default), e.g. magpie=0.35")
    p.add_argument("--skip-answered", nargs="+", default=[], metavar="NPZ",
                   help="datasets whose prompts the real-prompt mix does not ask again")
    p.add_argument("--data-weights", type=_checked(parse_data_weights), metavar="PATTERN=W,...",
                   help="each data file's share of an epoch by its name or path (the first "
                        "matching pattern; others 1): W=2 takes a file twice, W=0.4 a fresh "
                        "random 40%% of it each epoch, e.g. 'gen-19-*=1,*=0.4'")
    p.add_argument("--resume", action="store_true", help="continue from OUT/resume")
    p.add_argument("--init", help="start from an existing draft folder (fine-tune it)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--val-every", type=int, default=d.val_every)
    p.add_argument("--val-size", type=int, default=d.val_size, help="held-out sequences")
    p.add_argument("--gen-batch", type=int, default=d.gen_batch)
    p.add_argument("--gen-seconds", type=float, help="time limit for data generation")
    p.add_argument("--train-seconds", type=float,
                   help="fit the schedule into this time (sized again every 100 steps)")
    p.add_argument("--pause-after", type=float, metavar="SECONDS",
                   help="end this run after this long, saving its state: --resume continues "
                        "the same schedule (one schedule over several shorter runs)")
    p.add_argument("--no-group-by-length", dest="group_by_length", action="store_false",
                   help="draw batches at random instead of from sequences of similar length")
    p.add_argument("--profile-steps", type=int, default=d.profile_steps, metavar="N",
                   help="time each phase of N steps (target, draft, all-reduce, update)")
    p.add_argument("--dtype", default=d.dtype, help="target dtype")
    p.add_argument("--save-dtype", default=d.save_dtype, choices=["float32", "bfloat16",
                                                                  "float16"])
    p.add_argument("--draft-compute-dtype", default=d.draft_compute_dtype,
                   choices=["float32", "bfloat16"],
                   help="the draft's forward and backward in training: bfloat16 keeps float32 "
                        "weights and optimizer state and runs the matmuls in bfloat16")
    p.add_argument("--head-dtype", default=d.head_dtype, choices=["float32", "bfloat16"],
                   help="lm_head precision inside the training loss (bfloat16 on GPU)")
    p.add_argument("--loss-vocab", type=int, default=d.loss_vocab, metavar="N",
                   help="the loss's softmax over N tokens: the batch's own plus the most "
                        "frequent response tokens, as a decode's draft vocabulary holds "
                        "(faster steps; validation keeps the whole vocabulary); 0: all")
    p.add_argument("--mask-token-id", type=int)
    p.add_argument("--state-dir", help="optimizer state folder (default OUT/resume)")
    p.add_argument("--log", help="training log JSON (default OUT/train-log.json)")
    p.add_argument("--distributed", metavar="BACKEND", choices=["nccl", "ring", "jaccl", "mpi"],
                   help="data-parallel training over mx.distributed (one process per GPU or "
                        "host, e.g. started by mlx.launch); every rank reads the same data")
    p.add_argument("--gamma", dest="loss_gamma", type=float, metavar="G",
                   help="slot k's loss weight is exp(-(k-1)/G) (default: 7 for 16-token "
                        "blocks); a smaller G puts more weight on the first slots")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _checked(parse: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse type that keeps a flag's text once `parse` accepts it (its ValueError is
    the message)."""
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


def _time_shares(text: str) -> dict[str, float]:
    from .collect import parse_time_shares

    return parse_time_shares(text)


def train_draft_main(argv: Sequence[str] | None = None) -> int:
    import sys

    from ..errors import DFlashError

    args = vars(build_parser().parse_args(argv))
    try:
        train(TrainConfig(**args))
    except DFlashError as exc:
        print(f"dflash train-draft: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: continue with --resume", file=sys.stderr)
        return 130
    return 0

