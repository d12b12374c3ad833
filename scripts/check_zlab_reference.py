"""Check our draft against z-lab's MLX reference on the same weights and inputs.

    pip download dflash==0.1.0 --no-deps -d ~/zlab && unzip -o ~/zlab/dflash-0.1.0-*.whl -d ~/zlab
    python scripts/check_zlab_reference.py DRAFT_DIR [TARGET] --reference ~/zlab

(Only download and unzip z-lab's wheel: installing it would replace our `dflash` command.)
DRAFT_DIR is a DFlash or DFlash2 draft folder or hub id; TARGET its target (default: the
registry's target for that draft). `--reference` (or $DFLASH_ZLAB_REFERENCE) is the folder the
wheel was unzipped into, holding dflash/model_mlx.py.

Both sides run the one loaded target and the same draft checkpoint, in `--dtype` (default
float32; the target is loaded once, so a bf16 check needs the target's bf16 size). For each of
`--checks` contexts (the prompt, then the prompt plus more and more of the target's greedy
continuation) each builds the draft's block [target's next token, mask x (B - 1)] from a fresh
prefill and proposes: z-lab's `load_draft`, target hooks and `propose` (DFlash2: the candidate
selector's greedy path; DFlash: each slot's argmax) against our loader, prefill and cycle
proposal (`engine.cycle.DraftProposer.propose`, whole blocks, no lookup). Prints the largest
difference of the block logits and whether the proposed paths agree; exit 1 when a path
differs or a difference exceeds `--tolerance` (default 1e-4: float32 on both sides).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS before MLX loads)
import mlx.core as mx  # noqa: E402

REFERENCE_ENV = "DFLASH_ZLAB_REFERENCE"
PROMPT = ("Speculative decoding lets a small draft propose several tokens that the target "
          "model then checks in one forward pass. Explain why the output stays the same.")
FETCH = ("pip download dflash==0.1.0 --no-deps -d DIR && unzip -o DIR/dflash-0.1.0-py3-none-"
         "any.whl -d DIR")


class CheckError(Exception):
    """A user mistake: one line naming the problem and the fix."""


def load_reference(folder: str | None) -> ModuleType:
    """z-lab's dflash/model_mlx.py from the unzipped wheel in `folder`, as a private module."""
    if not folder:
        raise CheckError(f"no z-lab reference given. Fix: {FETCH}, then pass --reference DIR "
                         f"(or set {REFERENCE_ENV}=DIR).")
    source = Path(folder).expanduser() / "dflash" / "model_mlx.py"
    if not source.is_file():
        raise CheckError(f"{source} does not exist. Fix: {FETCH}, and pass that DIR.")
    spec = importlib.util.spec_from_file_location("zlab_dflash_model_mlx", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_draft(ref: ModuleType, draft_dir: Path, model: Any, dtype: mx.Dtype) -> Any:
    """z-lab's `load_draft` on a local folder (its hub download answered with the folder)."""
    from engine.loading import cast_floats

    ref.snapshot_download = lambda repo_id, **_: repo_id
    draft = ref.load_draft(str(draft_dir))
    cast_floats(draft, dtype)
    draft.bind(model)
    return draft


def reference_features(ref: ModuleType, model: Any, ids: list[int], taps: list[int]
                       ) -> tuple[mx.array, mx.array]:
    """The target's last logits [V] and tapped features [1, T, n_taps * H] through the
    reference's layer hooks, removed again afterwards (our adapter runs the same layers)."""
    from mlx_lm.models.cache import make_prompt_cache

    ref._patch_model(model, taps)
    try:
        logits = model(mx.array(ids)[None], make_prompt_cache(model))
        features = mx.concatenate(model._hidden_states, axis=-1)
        mx.eval(logits, features)
    finally:
        layers = ref._get_layers(model)
        for i, layer in enumerate(layers):
            if isinstance(layer, ref._LayerHook):
                layers[i] = layer._layer
        if "_hidden_states" in model:
            del model["_hidden_states"]
        else:
            del model._hidden_states
    return logits[0, -1], features


def reference_block(ref: ModuleType, draft: Any, features: mx.array, block: mx.array
                    ) -> tuple[mx.array, list[int]]:
    """The reference's logits [B - 1, V] and greedy proposal for `block` [1, B]."""
    cache = draft.make_cache()
    if isinstance(draft, ref.DFlash2DraftModel):
        hidden = draft.hidden_states(block, features, cache, logits_start=1)
        logits = draft.compute_logits(hidden)
        path, _, _ = draft.candidate_selector.select(hidden, logits, block[:, 0], 0.0)
    else:
        logits = draft(block, features, cache, logits_start=1)
        path = mx.argmax(logits, axis=-1)
    return logits[0], path[0].tolist()


def our_block(runtime: Any, ids: list[int], chunk: int) -> tuple[int, mx.array, list[int]]:
    """Our prefill of `ids` (in chunks of `chunk`) and the cycle's proposal after it -> (the
    target's next token, the block's logits [B - 1, V], the proposed tokens)."""
    from engine.cycle import DraftProposer, prefill
    from engine.dflash2 import DFlash2Draft

    target, draft = runtime.target, runtime.draft
    proposer = DraftProposer(target, draft)  # whole blocks, full head, no lookup
    last = prefill(target, target.make_cache(), ids, chunk, proposer)
    staged = int(mx.argmax(last))
    size = draft.args.block_size
    if isinstance(draft, DFlash2Draft):
        block = mx.array([[staged] + [draft.args.mask_token_id] * (size - 1)])
        _, logits = draft.block_outputs(target.embed(block), proposer.cache,
                                        proposer.output_head)
    else:
        logits = proposer.draft_logits(staged, size)[0]
    proposal = proposer.propose(staged, size, len(ids))
    return staged, logits, proposal[0, 1:].tolist()


def default_target(draft: str) -> str:
    from engine.registry import list_pairs

    for pair in list_pairs():
        if pair.draft.lower() == draft.rstrip("/").lower():
            return pair.target
    raise CheckError(f"{draft} is not a registered draft, so its target is unknown. Fix: pass "
                     "the TARGET (a hub id or folder) after DRAFT_DIR.")


def check(args: argparse.Namespace) -> int:
    from engine.config import DFlashConfig
    from engine.errors import DFlashError
    from engine.loading import resolve_local
    from engine.runtime import DFlashRuntime

    target_id = args.target or default_target(args.draft)
    ref = load_reference(args.reference or os.environ.get(REFERENCE_ENV))
    dtype = getattr(mx, args.dtype)
    try:
        draft_dir = resolve_local(args.draft)
        runtime = DFlashRuntime.from_pretrained(
            model=target_id, draft=str(draft_dir),
            config=DFlashConfig(dtype=args.dtype, min_draft_confidence=None,
                                lookup_min_match=None))
    except DFlashError as exc:
        raise CheckError(str(exc)) from exc
    model = runtime.model  # one copy: the reference hooks its layers only while it runs
    zlab = reference_draft(ref, draft_dir, model, dtype)
    kind = "DFlash2" if isinstance(zlab, ref.DFlash2DraftModel) else "DFlash"
    ours = type(runtime.draft).__name__
    print(f"draft  {args.draft}  ({kind}; ours: {ours})\ntarget {target_id}\n"
          f"reference {ref.__file__}\ndtype {args.dtype}, block {runtime.draft.args.block_size}")
    ids = runtime.encode(args.prompt)
    continuation = list(runtime.generate(ids, args.step * (args.checks - 1) + 1, no_eos=True,
                                         speculative=False).tokens)
    taps = list(runtime.draft.args.target_layer_ids)
    worst, agree = 0.0, True
    for i in range(args.checks):
        context = ids + continuation[:i * args.step]
        staged, logits, path = our_block(runtime, context, args.chunk)
        last, features = reference_features(ref, model, context, taps)
        mask = runtime.draft.args.mask_token_id
        block = mx.array([[int(mx.argmax(last))] + [mask] * (runtime.draft.args.block_size - 1)])
        ref_logits, ref_path = reference_block(ref, zlab, features, block)
        diff = float(mx.max(mx.abs(logits.astype(mx.float32) - ref_logits.astype(mx.float32))))
        same = path == ref_path and staged == int(block[0, 0])
        worst, agree = max(worst, diff), agree and same
        print(f"context {len(context):5d} tokens: block logits max |diff| {diff:.3g}; "
              f"paths {'agree' if same else 'DIFFER'}"
              + ("" if same else f"\n  ours      {[staged, *path]}\n  reference "
                                 f"{block[0].tolist()[:1] + ref_path}"))
    within = worst <= args.tolerance
    print(f"largest block logits difference {worst:.3g} "
          f"({'within' if within else 'OVER'} tolerance {args.tolerance:g}); "
          f"paths {'identical at every check' if agree else 'DIFFER'}")
    return 0 if agree and within else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draft", help="DFlash or DFlash2 draft folder or hub id")
    parser.add_argument("target", nargs="?", help="target folder or hub id (default: the "
                        "registry's target for the draft)")
    parser.add_argument("--reference", help="folder of z-lab's unzipped dflash 0.1.0 wheel "
                        f"(default: ${REFERENCE_ENV})")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--checks", type=int, default=3, help="contexts to compare")
    parser.add_argument("--step", type=int, default=13,
                        help="continuation tokens added to the context per check")
    parser.add_argument("--chunk", type=int, default=7,
                        help="our prefill's chunk (several context appends)")
    args = parser.parse_args(argv)
    try:
        return check(args)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
