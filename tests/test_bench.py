"""`dflash benchmark` on the tiny random pair (CPU), plus the loop metrics by hand."""

from __future__ import annotations

import json

import pytest
from script_modules import load_script

from engine.bench import compare as bench
from engine.bench.compare import benchmark_main, run_benchmark
from engine.bench.metrics import (
    lookup_cycle_share,
    loop_start,
    nonloop_tokens_per_cycle,
    repeated_ngram_share,
)
from engine.bench.suites import PACKAGED_SUITES, SUITES, BenchError, BenchPrompt, load_prompts

RUN_KEYS = {"prompt_id", "prompt_tokens", "baseline", "dflash", "speedup", "token_match",
            "repeat4_share", "cycle_cost_steps"}
SIDE_KEYS = {"tokens_per_second", "decode_tokens_per_second", "prefill_s", "peak_memory_bytes",
             "generated_tokens"}
DFLASH_KEYS = {"acceptance_rate", "tokens_per_cycle", "tokens_per_cycle_nonloop", "loop_start",
               "cycle_profile", "cycle_profile_per_cycle"}
SUMMARY_KEYS = {"speedup_median", "tokens_per_cycle_mean", "token_match", "repeat4_share_mean",
                "tokens_per_cycle_nonloop_mean", "cycle_cost_steps_median"}
TOP_KEYS = {"command", "timestamp", "machine", "backend", "dtype", "versions", "blas", "model",
            "settings", "baseline_function", "prompt_format", "definitions", "runs", "summary"}


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    records = [{"question_id": 7, "turns": ["Hello! How can I help?", "second turn"]},
               {"prompt": "def add(a, b):"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_benchmark_cli_writes_json_with_matching_tokens(tiny_pairs, prompt_file, tmp_path):
    target, draft = tiny_pairs("llama")
    out = tmp_path / "nested" / "report.json"
    rc = benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt-file",
                         str(prompt_file), "--max-tokens", "12", "--no-eos", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report.keys() >= TOP_KEYS and report["summary"].keys() >= SUMMARY_KEYS
    assert report["summary"]["token_match"] is True
    assert report["baseline_function"] == "mlx_lm.generate.generate_step"
    assert {"platform", "processor", "cpu_count", "memory_bytes", "gpu"} <= report[
        "machine"].keys()
    assert {"mlx", "mlx_lm", "dflash_engine", "python"} <= report["versions"].keys()
    assert report["gpu_attention"] == "mlx"  # the CPU: the block kernel is CUDA's
    assert "loop_start" in report["definitions"]
    assert [r["prompt_id"] for r in report["runs"]] == ["7", "1"]
    for run in report["runs"]:
        assert run.keys() >= RUN_KEYS and run["token_match"]
        assert run["baseline"].keys() >= SIDE_KEYS
        assert run["dflash"].keys() >= SIDE_KEYS | DFLASH_KEYS
        assert run["baseline"]["generated_tokens"] == run["dflash"]["generated_tokens"] == 12
        assert set(run["dflash"]["cycle_profile"]) == {"draft", "verify", "rollback"}


def test_cycle_cost_is_the_cost_side_of_the_decode_speed_up():
    base = {"decode_tokens_per_second": 200.0}
    flash = {"tokens_per_cycle": 7.5, "decode_tokens_per_second": 600.0}
    cost = bench.cycle_cost_steps(base, flash)
    assert cost == pytest.approx(2.5)  # 7.5 tokens a cycle at 3x: a cycle costs 2.5 steps
    assert flash["tokens_per_cycle"] / cost == pytest.approx(600.0 / 200.0)
    assert bench.cycle_cost_steps(base, {**flash, "tokens_per_cycle": None}) is None
    assert bench.cycle_cost_steps({"decode_tokens_per_second": 0.0}, flash) is None


def test_run_benchmark_python_api_with_eos_and_repeats(tiny_pairs):
    from engine import DFlashConfig, DFlashRuntime

    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(str(target), str(draft), DFlashConfig(draft_block_size=4))
    report = run_benchmark(rt, ["What is 12 times 7?"], max_tokens=10, repeat=2, warmup=False)
    assert report["baseline_function"] == "mlx_lm.stream_generate"
    assert report["summary"]["token_match"] and report["settings"]["block_size"] == 4
    assert len(report["runs"][0]["repeats"]) == 2


def test_sampled_benchmark_reports_speed_without_a_token_match(tiny_pairs, tmp_path, capsys):
    target, draft = tiny_pairs("llama")
    out = tmp_path / "sampled.json"
    rc = benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                         "--max-tokens", "12", "--temperature", "0.7",
                         "--seed", "1", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["settings"]["greedy"] is False
    assert report["settings"]["sampling"]["temperature"] == 0.7
    assert report["summary"]["token_match"] is None and report["runs"][0]["token_match"] is None
    assert report["baseline_function"].endswith("make_sampler")
    # the replies differ: both sides generate every token asked for, EOS or not
    assert report["settings"]["no_eos"] is True
    assert report["baseline_function"].startswith("mlx_lm.generate.generate_step")
    run = report["runs"][0]
    assert run["dflash"]["generated_tokens"] == run["baseline"]["generated_tokens"] == 12
    assert benchmark_main(["--prompt", "Hi", "--temperature", "-0.5"]) == 2
    assert "temperature=-0.5 is invalid" in capsys.readouterr().err


def test_token_mismatch_exits_1(tiny_pairs, prompt_file, tmp_path, monkeypatch, capsys):
    target, draft = tiny_pairs("llama")
    real = bench.run_dflash

    def broken(*args):
        side, result = real(*args)
        side.tokens = [t + 1 for t in side.tokens]
        return side, result

    monkeypatch.setattr(bench, "run_dflash", broken)
    out = tmp_path / "bad.json"
    rc = benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                         "--max-tokens", "4", "--no-eos", "--no-warmup", "--json", str(out)])
    assert rc == 1 and "correctness bug" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["summary"]["token_match"] is False and report["runs"][0]["first_mismatch"] == 0


def test_repeated_ngram_share_by_hand():
    assert repeated_ngram_share([]) == 0.0
    assert repeated_ngram_share(list(range(10))) == 0.0
    assert repeated_ngram_share([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)
    # A period-3 loop: 9 4-grams, the first 3 new, the other 6 repeats.
    assert repeated_ngram_share([1, 2, 3] * 4) == pytest.approx(6 / 9)


def test_loop_start_and_nonloop_tokens_per_cycle():
    # 20 distinct tokens, then a period-3 loop. Window ending at p (< 64): p-2 4-grams, of
    # which p-25 repeat; (p-25)/(p-2) > 0.5 first at p = 49.
    tokens = list(range(20)) + [100, 101, 102] * 20
    assert loop_start(tokens) == 49
    assert loop_start(list(range(200))) is None
    # Token 0 is prefill; cycles cover 1-2, 3-5, 6-9, 10-17: the last reaches position 10.
    assert nonloop_tokens_per_cycle([2, 3, 4, 8, 8], 10) == pytest.approx(3.0)
    assert nonloop_tokens_per_cycle([2, 3, 4, 8, 8], None) == pytest.approx(5.0)
    assert nonloop_tokens_per_cycle([2, 3], 1) is None


def test_lookup_cycle_share_pools_cycles_over_runs():
    runs = [{"lookup_cycles": 1, "cycles": 4}, {"lookup_cycles": 3, "cycles": 6}]
    assert lookup_cycle_share(runs) == pytest.approx(0.4)
    assert lookup_cycle_share([]) == 0.0


def test_missing_suite_file_is_a_clear_error(tmp_path, capsys):
    assert benchmark_main(["--suite", "gsm8k", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "gsm8k_100.jsonl" in err and "Traceback" not in err
    assert benchmark_main(["--suite", "nope", "--data-dir", str(tmp_path)]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert benchmark_main(["--prompt-file", str(tmp_path / "none.jsonl")]) == 2
    assert benchmark_main(["--suite", "gsm8k", "--data-dir", str(tmp_path / "x")]) == 2
    assert benchmark_main(["--max-tokens", "5"]) == 2  # no prompt source
    assert benchmark_main(["--prompt", "hi", "--repeat", "0"]) == 2


def test_data_dir_and_env_override_the_packaged_suites(tmp_path, monkeypatch):
    (tmp_path / "gsm8k_100.jsonl").write_text(json.dumps({"prompt": "2+2?", "id": "a"}) + "\n")
    monkeypatch.setenv("DFLASH_EVAL_DATA", str(tmp_path))
    prompts, fmt = load_prompts(suite="gsm8k")
    assert prompts == [BenchPrompt("a", "2+2?")] and "chat message" in fmt
    monkeypatch.delenv("DFLASH_EVAL_DATA")
    assert load_prompts(suite="gsm8k", data_dir=str(tmp_path))[0] == prompts


@pytest.mark.parametrize("suite,count,first_id", [("mt-bench", 80, "81"),
                                                  ("humaneval", 164, "HumanEval/0"),
                                                  ("gsm8k", 100, "gsm8k-test-0013")])
def test_packaged_suites_load_without_any_data_folder(suite, count, first_id, monkeypatch):
    monkeypatch.delenv("DFLASH_EVAL_DATA", raising=False)
    prompts, _ = load_prompts(suite=suite)
    assert len(prompts) == count and prompts[0].id == first_id
    assert all(p.text.strip() for p in prompts)
    if suite == "humaneval":
        assert prompts[0].text.startswith("Complete the following Python function.")
    assert len(load_prompts(suite=suite, limit=2)[0]) == 2


def test_limit_spreads_over_categories_or_takes_the_first(tmp_path, monkeypatch):
    monkeypatch.delenv("DFLASH_EVAL_DATA", raising=False)
    spread = [p.id for p in load_prompts(suite="mt-bench", limit=8)[0]]
    assert spread == ["81", "91", "101", "111", "121", "131", "141", "151"]  # one per category
    assert [p.id for p in load_prompts(suite="mt-bench", limit=10)[0]][:3] == ["81", "82", "91"]
    first = [p.id for p in load_prompts(suite="mt-bench", limit=3, pick="first")[0]]
    assert first == ["81", "82", "83"]
    records = [{"prompt": f"q{i}", "id": str(i), "category": c}
               for i, c in enumerate("aaabbc")]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [p.id for p in load_prompts(prompt_file=str(tmp_path / "p.jsonl"), limit=4)[0]] == [
        "0", "1", "3", "5"]  # file order kept
    assert [p.id for p in load_prompts(suite="gsm8k", limit=2)[0]] == [  # no categories
        p.id for p in load_prompts(suite="gsm8k", limit=2, pick="first")[0]]
    with pytest.raises(BenchError, match="unknown pick"):
        load_prompts(suite="gsm8k", limit=2, pick="random")


def test_packaged_suites_carry_their_licences():
    notice = (PACKAGED_SUITES / "NOTICE.md").read_text()
    for name in SUITES.values():
        assert (PACKAGED_SUITES / name).is_file() and name in notice
    assert "MIT License" in notice and "Copyright (c) 2021 OpenAI" in notice
    assert "Apache License" in (PACKAGED_SUITES / "LICENSE-Apache-2.0.txt").read_text()
    # ...and an installed copy has them: the package data names the folder.
    pyproject = (PACKAGED_SUITES.parents[3] / "pyproject.toml").read_text()
    assert '"bench/data/suites/*"' in pyproject




def test_bench_table_names_near_tie_divergences_and_flags_others():
    match = load_script("bench_table").match
    base = {"runs": 10, "divergences": 0, "near_tie_gap_max": None}
    assert match({**base, "token_match": True}) == "yes"
    assert match({**base, "token_match": None}) == "n/a (sampled)"
    ties = {**base, "token_match": False, "divergences": 3, "near_tie_gap_max": 0.03125,
            "divergences_all_near_ties": True}
    assert match(ties) == "near-ties only (3 of 10 runs, gap <= 0.031)"
    assert match({**ties, "divergences_all_near_ties": False}) == "NO"
    assert match({**base, "token_match": False}) == "NO"  # float32: no near-tie field


def test_bench_table_gives_the_median_of_repeated_synthetic_pairs():
    median = load_script("bench_table")._median
    assert median({"decode_speedup": 5.4}, "decode_speedup") == ""  # one pair: no median
    report = {"repeats": [{}, {}, {}], "decode_speedup_median": 3.318}
    assert median(report, "decode_speedup") == " (median of 3: 3.32x)"


def test_blas_report_names_an_mkl_or_openblas_library_mapped_into_the_process(monkeypatch):
    """DFLASH_BLAS may name MKL's libmkl_rt: the report lists it beside OpenBLAS copies, and
    leaves out numpy's own scipy_openblas (its symbols never serve MLX's matmuls)."""
    from engine.bench import environment

    maps = "\n".join([
        "7f00-7f01 r-xp 0 08:01 1 /x/libmkl_rt.so.3",
        "7f02-7f03 r-xp 0 08:01 2 /x/libmkl_avx512.so.3",
        "7f04-7f05 r-xp 0 08:01 3 /c/libdflash_openblas-1.so",
        "7f06-7f07 r-xp 0 08:01 4 /n/libscipy_openblas64_-abc.so",
        "7f08-7f09 r-xp 0 08:01 5 /p/libpython3.11.so",
        "7f0a-7f0b rw-p 0 00:00 0 ",
    ])

    class FakePath:
        def __init__(self, path: str) -> None:
            assert path == "/proc/self/maps"

        def read_text(self) -> str:
            return maps

    monkeypatch.setattr(environment, "Path", FakePath)
    assert environment.blas_info()["blas_libraries_loaded"] == [
        "/c/libdflash_openblas-1.so", "/x/libmkl_avx512.so.3", "/x/libmkl_rt.so.3"]


def test_ar_draft_row_times_mlx_lm_speculative_beside_dflash(tiny_pairs, tmp_path):
    from tiny_pairs import make_tiny_target

    target, draft = tiny_pairs("llama")
    ar = make_tiny_target(tmp_path / "ar", "llama", seed=1)  # another model, same tokenizer
    out = tmp_path / "report.json"
    rc = benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                         "--max-tokens", "12", "--no-eos", "--ar-draft", str(ar),
                         "--num-draft-tokens", "2,3", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["ar_draft"]["num_draft_tokens"] == [2, 3]
    assert report["ar_draft"]["dtype"] == report["dtype"] == "float32"
    run = report["runs"][0]
    assert set(run["ar_draft"]) == {"2", "3"}
    for row in run["ar_draft"].values():
        # float32 greedy: mlx-lm's speculative decoding commits plain greedy's tokens too
        assert row["token_match"] is True and row["generated_tokens"] == 12
        assert 0 <= row["from_draft_share"] <= 1 and row["speedup"] > 0
    s = report["summary"]
    assert s["ar_draft_best_k"] in (2, 3)
    assert set(s["ar_draft_speedup_median_by_k"]) == {"2", "3"}
    best = run["ar_draft"][str(s["ar_draft_best_k"])]
    assert s["speedup_over_ar_draft_median"] == pytest.approx(
        run["dflash"]["tokens_per_second"] / best["tokens_per_second"])


def test_ar_draft_errors_are_one_line(tiny_pairs, tmp_path, capsys):
    from tiny_pairs import make_tiny_target

    target, draft = tiny_pairs("llama")
    pair = ["--model", str(target), "--draft", str(draft), "--prompt", "Hi", "--max-tokens", "4"]

    def said() -> str:  # the terminal wraps the line: compare its words
        return " ".join(capsys.readouterr().err.split())

    assert benchmark_main([*pair, "--num-draft-tokens", "3"]) == 2
    assert "give --ar-draft MODEL too" in said()
    assert benchmark_main([*pair, "--ar-draft", str(target), "--num-draft-tokens", "0"]) == 2
    assert "give K from 1 to 32" in said()
    other = make_tiny_target(tmp_path / "other", "llama", seed=2)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    word = next(w for w in vocab if len(w) > 2)
    vocab[word + "x"] = vocab.pop(word)  # one token id now means other text
    (other / "tokenizer.json").write_text(json.dumps(tok))
    assert benchmark_main([*pair, "--ar-draft", str(other)]) == 2
    assert "its tokenizer differs from the target's" in said()


def test_plain_engine_side_times_speculation_off_in_the_same_run(tiny_pairs, tmp_path, capsys):
    target, draft = tiny_pairs("llama")
    out = tmp_path / "report.json"
    rc = benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                         "--max-tokens", "12", "--no-eos", "--plain-engine", "--json", str(out)])
    assert rc == 0
    assert "speculation off" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["settings"]["plain_engine"] is True
    run, s = report["runs"][0], report["summary"]
    plain = run["plain_engine"]
    # The target alone through the runtime: plain greedy's tokens, timed beside both sides.
    assert plain.keys() >= SIDE_KEYS and plain["generated_tokens"] == 12
    assert plain["token_match"] is True and s["plain_engine_token_match"] is True
    assert plain["speedup"] == pytest.approx(
        plain["tokens_per_second"] / run["baseline"]["tokens_per_second"])
    assert s["speedup_over_plain_engine_median"] == pytest.approx(
        run["dflash"]["tokens_per_second"] / plain["tokens_per_second"])
    assert report["git"] is None or len(report["git"]["commit"]) == 40
    assert len(report["load_average_before"]) == len(report["machine"]["load_average"]) == 3


def test_reports_leave_out_the_plain_engine_unless_asked(tiny_pairs):
    from engine import DFlashConfig, DFlashRuntime

    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(str(target), str(draft), DFlashConfig(draft_block_size=4))
    report = run_benchmark(rt, ["Hi"], max_tokens=6, warmup=False)
    assert "plain_engine" not in report["runs"][0]
    assert "plain_engine_speedup_median" not in report["summary"]
    both = run_benchmark(rt, ["Hi"], max_tokens=6, warmup=False, plain_engine=True,
                         sampling={"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                   "seed": 1})
    assert both["runs"][0]["plain_engine"]["token_match"] is None  # sampled: no match by design
    assert both["summary"]["plain_engine_token_match"] is None
