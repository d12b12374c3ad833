"""The command forms dflash-mlx users type: `dflash --prompt`, `dflash-serve`,
`dflash-benchmark`, `--dflash-max-ctx`, `--chat-template-args`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine import cli
from engine.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_no_subcommand_with_a_prompt_is_generate(tiny_pairs, capsys):
    target, draft = tiny_pairs("llama")
    code = main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                 "--max-tokens", "8", "--no-eos"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() and "8 tokens" in err and "acceptance" in err


def test_dflash_max_ctx_is_max_ctx(tiny_pairs, capsys):
    target, draft = tiny_pairs("llama")
    code = main(["--model", str(target), "--draft", str(draft), "--prompt=Hi",
                 "--max-tokens", "40", "--no-eos", "--dflash-max-ctx", "32",
                 "--chat-template-args", '{"enable_thinking": false}'])
    err = capsys.readouterr().err
    assert code == 0 and "exceeds max_ctx (32)" in err


def test_without_prompt_or_command_argparse_explains(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--model", "x"])
    assert exc.value.code == 2 and "command" in capsys.readouterr().err


def test_entry_points_are_the_subcommands(monkeypatch):
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dflash-serve"] == "engine.cli:serve_entry"
    assert scripts["dflash-benchmark"] == "engine.cli:benchmark_entry"
    seen = []
    monkeypatch.setattr(cli, "main", lambda argv: seen.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", ["dflash-serve", "--port", "9"])
    assert cli.serve_entry() == 0
    monkeypatch.setattr(sys, "argv", ["dflash-benchmark", "--prompt", "x"])
    assert cli.benchmark_entry() == 0
    assert seen == [["serve", "--port", "9"], ["benchmark", "--prompt", "x"]]


def test_chat_template_args_reach_the_template_from_config_and_call(tiny_pairs, monkeypatch):
    from engine.config import DFlashConfig
    from engine.runtime import DFlashRuntime

    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(
        model=str(target), draft=str(draft),
        config=DFlashConfig(chat_template_args={"enable_thinking": False, "a": 1}))
    seen = []
    real = rt.tokenizer.apply_chat_template

    def spy(messages, **kwargs):
        seen.append(kwargs)
        return real(messages, **kwargs)

    monkeypatch.setattr(rt.tokenizer, "apply_chat_template", spy)
    rt.encode([{"role": "user", "content": "Hi"}], chat_template_args={"a": 2})
    assert seen[-1]["enable_thinking"] is False and seen[-1]["a"] == 2


def test_serve_flag_mistakes_are_one_line(capsys):
    assert main(["serve", "--block-size", "40"]) == 2
    err = capsys.readouterr().err
    assert "block_size=40 is out of range" in err and "Traceback" not in err
    assert main(["serve", "--max-tokens", "0"]) == 2
    assert "--max-tokens 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--chat-template-args", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err


def test_serve_with_a_missing_model_exits_with_one_line(tmp_path, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["serve", "--model", str(tmp_path / "nope"), "--port", str(port),
                 "--log-level", "error"])
    assert code == 2
    errors = [r for r in caplog.records if r.name == "dflash.serve"]
    assert errors and "no such folder" in errors[0].getMessage()
    assert errors[0].exc_info is None  # no traceback


# -- the three seed forms on the offline default pair, through the entry points -------------
def smollm2_or_skip() -> None:
    from engine.offline import SMOLLM2, cache_root

    if not (cache_root() / "smollm2" / SMOLLM2.gguf_name).is_file():
        pytest.skip("the offline SmolLM2 pair is not cached")


def entry(name: str, *args: str, **kw) -> subprocess.Popen:
    """Run an engine.cli entry function as its console script does, in a subprocess."""
    code = f"import sys; from engine.cli import {name}; sys.exit({name}())"
    env = dict(os.environ, HF_HUB_OFFLINE="1", DFLASH_NO_BLAS_REEXEC="1")
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.slow
def test_seed_generate_form_runs_on_the_default_pair():
    smollm2_or_skip()
    env = dict(os.environ, HF_HUB_OFFLINE="1", DFLASH_NO_BLAS_REEXEC="1")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from engine.cli import main; sys.exit(main())",
         "--prompt", "What is the capital of France?", "--max-tokens", "16",
         "--chat-template-args", '{"enable_thinking": false}', "--dflash-max-ctx", "16384"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout and "tok/s" in done.stderr


@pytest.mark.slow
def test_seed_benchmark_form_runs_on_the_default_pair(tmp_path):
    smollm2_or_skip()
    report = tmp_path / "bench.json"
    proc = entry("benchmark_entry", "--prompt", "Count to five.", "--max-tokens", "16",
                 "--repeat", "2", "--no-eos", "--dflash-max-ctx", "16384",
                 "--chat-template-args", '{"enable_thinking": false}', "--json", str(report))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert json.loads(report.read_text())


@pytest.mark.slow
def test_seed_serve_form_answers_the_openai_client():
    smollm2_or_skip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = entry("serve_entry", "--port", str(port), "--dflash-max-ctx", "16384",
                 "--chat-template-args", '{"enable_thinking": false}')
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "dflash-serve did not become ready"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        (model,) = client.models.list().data
        reply = client.chat.completions.create(
            model=model.id, max_tokens=16,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(30)
