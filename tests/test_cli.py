"""`dflash` CLI: streaming output + stats line, and clean errors for user mistakes."""

from __future__ import annotations

import re

from engine.cli import main


def test_generate_streams_text_then_stats(tiny_pairs, capsys):
    target, draft = tiny_pairs("llama")
    code = main(["generate", "--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                 "--max-tokens", "12", "--no-eos", "--block-size", "4"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    assert "12 tokens" in err and "acceptance" in err and "tokens/cycle" in err
    assert "(block 4, verify cut p<0.4" in err  # the CPU default cut (then any lookup count)


def test_bad_block_size_is_a_clear_error(tiny_pairs, capsys):
    target, draft = tiny_pairs("llama")
    code = main(["generate", "--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                 "--block-size", "40"])
    err = capsys.readouterr().err
    assert code == 2 and "block_size=40 is out of range: use 2..16" in err
    assert "Traceback" not in err


def test_missing_model_folder_is_a_one_line_error(capsys, tmp_path):
    missing = tmp_path / "nope"
    code = main(["generate", "--model", str(missing), "--prompt", "Hi"])
    err = capsys.readouterr().err
    assert code == 2 and f"{missing}: no such folder. Fix: check the path." in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_models_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in out and "bundled" in out
    # each pair with its draft's architecture: z-lab's DFlash2 pair among them
    assert re.search(r"z-lab/Qwen3\.8-27B-DFlash2\s*│\s*DFlash2\s*│\s*gated_delta", out)
    assert re.search(r"z-lab/Qwen3-8B-DFlash-b16\s*│\s*DFlash\s*│\s*attention", out)
