"""scripts/check_zlab_reference.py: our DFlash and DFlash2 drafts against z-lab's MLX reference.

The comparisons need z-lab's wheel unzipped (`pip download dflash==0.1.0 --no-deps -d DIR`,
then unzip it into DIR) and $DFLASH_ZLAB_REFERENCE=DIR; without it they skip. Nothing of it is
copied here. The checker's own errors are tested without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from script_modules import load_script

REFERENCE = os.environ.get("DFLASH_ZLAB_REFERENCE", "")
needs_reference = pytest.mark.skipif(
    not (Path(REFERENCE).expanduser() / "dflash" / "model_mlx.py").is_file(),
    reason="z-lab's reference absent: set DFLASH_ZLAB_REFERENCE to its unzipped wheel")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = load_script("check_zlab_reference").main([*map(str, args), "--checks", "2"])
    out, err = capsys.readouterr()
    return code, out, err


@needs_reference
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_dflash2_matches_the_reference(tiny_dflash2, family, capsys):
    """The published shape (sliding windows shorter than the contexts, bidirectional blocks):
    block logits within 1e-4 in float32, the same selector paths."""
    target, draft = tiny_dflash2(family)
    code, out, _ = run(capsys, draft, target, "--reference", REFERENCE)
    assert "(DFlash2; ours: DFlash2Draft)" in out
    assert "within tolerance 0.0001" in out and "paths identical at every check" in out
    assert code == 0


@needs_reference
def test_other_shapes_match_the_reference(tiny_dflash2, tiny_pairs, tmp_path, capsys):
    """A DFlash2 draft with a full-attention layer and no is_causal (the reference then makes
    sliding layers causal), one that scales its inputs and logits and caps them; DFlash
    drafts, with full attention and with a sliding window."""
    from tiny_pairs import sliding_dflash

    target, mixed = tiny_dflash2("qwen3", "mixed", layer_types=[
        "sliding_attention", "full_attention"], is_causal=None)
    code, out, _ = run(capsys, mixed, target, "--reference", REFERENCE)
    assert code == 0 and "paths identical at every check" in out
    target, scaled = tiny_dflash2("llama", "scaled", input_embedding_scale=1.5,
                                  output_multiplier=0.5, final_logit_softcapping=2.0)
    code, out, _ = run(capsys, scaled, target, "--reference", REFERENCE)
    assert code == 0 and "paths identical at every check" in out
    target, draft = tiny_pairs("llama")
    for folder in (draft, sliding_dflash(target, draft, tmp_path / "sliding")):
        code, out, _ = run(capsys, folder, target, "--reference", REFERENCE)
        assert "(DFlash; ours: DFlashDraft)" in out
        assert "within tolerance" in out and "paths identical at every check" in out
        assert code == 0


@needs_reference
def test_a_wrong_draft_is_caught(tiny_dflash2, capsys, monkeypatch):
    """Ours without the sliding window's mask: the checker says so and exits 1."""
    from engine.draft import DraftAttention

    monkeypatch.setattr(DraftAttention, "block_mask", lambda self, context, length: None)
    target, draft = tiny_dflash2("llama")
    code, out, _ = run(capsys, draft, target, "--reference", REFERENCE)
    assert code == 1 and "OVER tolerance" in out and "paths DIFFER" in out


def test_without_the_reference_it_says_how_to_get_it(tiny_dflash2, tmp_path, capsys,
                                                     monkeypatch):
    monkeypatch.delenv("DFLASH_ZLAB_REFERENCE", raising=False)
    target, draft = tiny_dflash2("llama")
    for extra in ([], ["--reference", tmp_path]):
        code, out, err = run(capsys, draft, target, *extra)
        assert code == 2 and not out and len(err.strip().splitlines()) == 1
        assert "pip download dflash==0.1.0 --no-deps" in err and "Fix:" in err


def test_an_unregistered_draft_needs_its_target(tmp_path, capsys):
    code, _, err = run(capsys, tmp_path, "--reference", tmp_path / "zlab")
    assert code == 2 and "is not a registered draft" in err and "Fix: pass the TARGET" in err
