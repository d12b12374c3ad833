"""scripts/train_qwen_coder_gpu.sh, dry-run on the CPU with a tiny pair: the parts the next lent
GPU runs (answering, training from a staged draft with --loss-vocab, resuming a paused schedule)
work end to end and return what a session keeps, before any device time is spent on them."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from tiny_pairs import make_tiny_pair

from engine.train.dataset import Dataset

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_qwen_coder_gpu.sh"


def run_part(work: Path, out: Path, **env: str) -> str:
    out.mkdir(parents=True)
    environ = {**os.environ, "WORK": str(work), "OUT": str(out),
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def assembled(out: Path, folder: Path) -> Path:
    """A returned draft as a session puts it back together: the meta tar and the pieces."""
    folder.mkdir()
    with tarfile.open(out / "draft-meta.tar") as tar:
        tar.extractall(folder, filter="data")
    with open(folder / "model.safetensors", "wb") as f:
        for piece in sorted(out.glob("draft-weights.part-*")):
            f.write(piece.read_bytes())
    return folder


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_training_script_answers_trains_from_a_staged_draft_and_resumes(tmp_path):
    from engine.runtime import DFlashRuntime

    target_dir, draft_dir = make_tiny_pair(tmp_path / "pair")
    work = tmp_path / "work"
    files = work / "stash" / "files"
    files.mkdir(parents=True)
    questions = [f"What is {i} plus {i + 3}?" for i in range(40)]
    with gzip.open(files / "train_prompts.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"id": f"q{i}", "source": "gsm8k_train", "prompt": q}) + "\n"
                     for i, q in enumerate(questions))
    with tarfile.open(files / "qwen-extras.tar", "w") as tar:  # the evaluation sets' folder
        (tmp_path / "evals").mkdir()
        (tmp_path / "evals" / "mt_bench.jsonl").write_text(
            json.dumps({"turns": ["Write a haiku about the sea."]}) + "\n")
        tar.add(tmp_path / "evals", arcname="evals")
    shape = {"MODEL": str(target_dir), "SEED": "1", "DEPTH": "2", "TAPS": "1", "WIDTH": "128"}

    log = run_part(work, tmp_path / "out-gen", PART="gen", SLICE="0/1", GEN_S="20",
                   GEN_BATCH="8", NUM_PROMPTS="24", **shape)
    gen = Dataset.load(tmp_path / "out-gen" / "gen-1.npz")
    assert len(gen) >= 10, log
    assert (tmp_path / "out-gen" / "heldout-1.npz").is_file()
    # staged again, as a later session's answers are
    shutil.copy(tmp_path / "out-gen" / "gen-1.npz", files / "gen-1.npz")
    shutil.copy(tmp_path / "out-gen" / "heldout-1.npz", files / "heldout-1.npz")
    # a later answering call takes the staged held-out answers as they are
    log = run_part(work, tmp_path / "out-gen2", PART="gen", SLICE="0/1", GEN_S="20",
                   GEN_BATCH="8", NUM_PROMPTS="24", **{**shape, "SEED": "2"})
    assert "heldout: reusing" in log, log
    assert (Dataset.load(tmp_path / "out-gen2" / "heldout-2.npz").sequences
            == Dataset.load(files / "heldout-1.npz").sequences)
    assert len(Dataset.load(tmp_path / "out-gen2" / "gen-2.npz")) > 0
    with tarfile.open(files / "draft.tar", "w") as tar:
        for name in ("config.json", "model.safetensors"):
            tar.add(draft_dir / name, arcname=name)

    train = {**shape, "BATCH": "2", "ANCHORS": "4", "TAIL_S": "300",
             "TRAIN_ARGS": "--loss-vocab 64"}
    log = run_part(work, tmp_path / "out-train", PART="train", INIT=str(files / "draft.tar"),
                   TRAIN_S="8", PAUSE="3", **train)
    assert "initialised from" in log and "paused at step" in log, log
    first = json.loads((assembled(tmp_path / "out-train", tmp_path / "d1")
                        / "train-log.json").read_text())
    log = run_part(work, tmp_path / "out-resume", PART="resume", TRAIN_S="8", **train)
    assert "resumed at step" in log, log
    folder = assembled(tmp_path / "out-resume", tmp_path / "d2")
    last = json.loads((folder / "train-log.json").read_text())
    assert last["steps"] > first["steps"] and not last["paused"]
    # the resumed schedule kept the staged draft's taps, not the one TAPS=1 would pick
    taps = [json.loads((d / "config.json").read_text())["dflash_config"]["target_layer_ids"]
            for d in (draft_dir, folder)]
    assert taps[0] == taps[1], taps
    runtime = DFlashRuntime.from_pretrained(model=str(target_dir), draft=str(folder))
    assert runtime.generate("What is 2 plus 5?", max_tokens=8).text is not None


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("bash", "xz", "split")),
                    reason="needs bash, xz and split")
def test_kernel_cache_comes_back_only_with_kernels_the_staged_one_lacks(tmp_path):
    """scripts/gpu_kernel_cache.sh: a staged cache fills the machine's; a call returns the
    cache (in pieces) only once this machine compiled something new."""
    work, files = tmp_path / "work", tmp_path / "work" / "stash" / "files"
    (work / "kernel-cache" / "ptx").mkdir(parents=True)
    files.mkdir(parents=True)
    for name in ("a.ptx", "b.ptx"):
        (work / "kernel-cache" / "ptx" / name).write_text(name * 100)
    subprocess.run(["tar", "-C", str(work), "-cJf", str(files / "kernel-cache.tar.xz"),
                    "kernel-cache"], check=True)
    shutil.rmtree(work / "kernel-cache")

    def save(out: Path, before: str = "") -> str:
        out.mkdir()
        done = subprocess.run(
            ["bash", "-c", f"source scripts/gpu_kernel_cache.sh && {before} save_kernel_cache"],
            cwd=ROOT, env={**os.environ, "WORK": str(work), "OUT": str(out)},
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    log = save(tmp_path / "o1")
    assert "staged: 2 files" in log and "as staged" in log
    assert not list((tmp_path / "o1").iterdir())
    log = save(tmp_path / "o2", f"echo new > {work}/kernel-cache/ptx/c.ptx &&")
    pieces = sorted((tmp_path / "o2").glob("kernel-cache.tar.xz.*"))
    assert pieces and "3 files" in log
    joined = tmp_path / "joined.tar.xz"
    joined.write_bytes(b"".join(p.read_bytes() for p in pieces))
    names = subprocess.run(["tar", "-tJf", str(joined)], capture_output=True, text=True,
                           check=True).stdout.split()
    assert {"kernel-cache/ptx/a.ptx", "kernel-cache/ptx/c.ptx"} <= set(names)
