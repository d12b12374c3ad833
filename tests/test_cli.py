"""`dflash` CLI: streaming output + stats line, and clean errors for user mistakes."""

from __future__ import annotations

from engine.cli import main


def test_generate_streams_text_then_stats(tiny_pairs, capsys):
    target, draft = tiny_pairs("llama")
    code = main(["generate", "--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                 "--max-tokens", "12", "--no-eos", "--block-size", "4"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    assert "12 tokens" in err and "acceptance" in err and "tokens/cycle" in err
    assert "(block 4, verify cut p<0.4)" in err  # the CPU default cut


def test_bad_block_size_is_a_clear_error(tiny_pairs, capsys):
    target, draft = tiny_pairs("llama")
    code = main(["generate", "--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                 "--block-size", "40"])
    err = capsys.readouterr().err
    assert code == 2 and "block_size=40 is out of range: use 2..16" in err
    assert "Traceback" not in err


def test_unregistered_model_lists_pairs(capsys, tmp_path):
    code = main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "Hi"])
    err = capsys.readouterr().err
    assert code == 2 and "no such folder" in err


def test_models_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in out and "bundled" in out
