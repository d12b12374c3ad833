"""The real-prompt training mix: decontamination, the held-out split, source weights, the loop
cut, multi-turn replay, resuming an interrupted data run, and growing a draft."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from script_modules import load_script
from tiny_pairs import make_tiny_pair

from engine.bench.metrics import loop_start
from engine.errors import ConfigError
from engine.loading import load_draft_folder, load_target
from engine.train.collect import Collector, MixConfig
from engine.train.dataset import Dataset, encode_prompts
from engine.train.generate import continue_batch, cut_loops, loop_starts, running_order
from engine.train.loop import grow_draft, grow_taps, grow_width
from engine.train.mix import (
    Decontaminator,
    PromptRecord,
    as_completion,
    eval_texts,
    in_slice,
    is_held_out,
    load_records,
    sample_by_source,
    usable,
    weighted_order,
)

EVAL_TURN = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
             "cultural experiences and must-see attractions.")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("mix"))
    model, tokenizer, _ = load_target(str(target_dir), "float32")
    return target_dir, draft_dir, model, tokenizer


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_decontamination_drops_planted_evaluation_prompts(tmp_path):
    write_jsonl(tmp_path / "mt_bench.jsonl", [{"turns": [EVAL_TURN, "Rewrite it."]}])
    write_jsonl(tmp_path / "gsm8k_100.jsonl", [{"prompt": "Tom has 3 apples. How many?"}])
    decon = Decontaminator.from_texts(eval_texts(tmp_path))
    records = [
        PromptRecord("exact", "sharegpt", "chat", (EVAL_TURN.upper().replace(" ", "  "),)),
        PromptRecord("run", "sharegpt", "chat", ("Please: " + EVAL_TURN[:90] + " thanks",)),
        PromptRecord("later-turn", "sharegpt", "chat", ("Hi", "tom has 3 apples, how many?")),
        PromptRecord("clean", "sharegpt", "chat", ("Write a blog post about a trip to Oslo.",)),
    ]
    assert [r.id for r in usable(records, decon) if not is_held_out(r.id)] == ["clean"]


def test_held_out_split_slices_and_source_weights():
    records = [PromptRecord(f"{s}-{i}", s, "x", (f"prompt {s} {i}",)) for s, n in
               (("big", 4000), ("mid", 3000), ("tiny", 30)) for i in range(n)]
    held = [r for r in records if is_held_out(r.id)]
    assert 0.01 < len(held) / len(records) < 0.04
    kept = usable(records, None)
    assert not set(r.id for r in kept) & set(r.id for r in held)
    assert len(kept) + len(held) == len(records)
    slices = [{r.id for r in kept if in_slice(r.id, k, 3)} for k in range(3)]
    assert sum(map(len, slices)) == len(kept)
    assert not (slices[0] & slices[1] | slices[1] & slices[2])

    picked = sample_by_source(kept, 1000, seed=0, weights={"big": 0.5, "mid": 0.3, "tiny": 0.2})
    counts = Counter(r.source for r in picked)
    assert len(picked) == 1000 == len({r.id for r in picked})
    assert counts["tiny"] == len([r for r in kept if r.source == "tiny"])  # exhausted
    assert abs(counts["big"] / counts["mid"] - 5 / 3) < 0.15  # the rest in proportion
    assert picked == sample_by_source(kept, 1000, seed=0,
                                      weights={"big": 0.5, "mid": 0.3, "tiny": 0.2})


def test_a_time_budget_cut_keeps_the_source_mix():
    """Drawing a whole slice keeps the slice's own mix; the answering order must still hold
    the weights in every prefix, as far as each source lasts, for a budget that stops early:
    weighted_order, then running_order's windows of length-sorted batches."""
    records = [PromptRecord(f"{s}-{i}", s, "x", (f"prompt {s} {i}",)) for s, n in
               (("big", 4000), ("mid", 3000), ("tiny", 30)) for i in range(n)]
    weights = {"big": 0.2, "mid": 0.3, "tiny": 0.5}
    drawn = sample_by_source(records, 10**6, seed=0, weights=weights)
    assert len(drawn) == len(records)  # everything: the slice's own mix
    ordered = weighted_order(drawn, seed=0, weights=weights)
    assert sorted(r.id for r in ordered) == sorted(r.id for r in records)
    assert ordered == weighted_order(drawn, seed=0, weights=weights)
    head = Counter(r.source for r in ordered[:50])
    assert abs(head["tiny"] - 25) <= 1 and abs(head["mid"] - 15) <= 1
    assert Counter(r.source for r in ordered[:200])["tiny"] == 30  # lasted, then the rest
    later = Counter(r.source for r in ordered[200:1200])
    assert abs(later["big"] / later["mid"] - 2 / 3) < 0.05

    rng = random.Random(0)
    prompts = [[1] * rng.randint(1, 60) for _ in ordered]
    order = running_order(prompts, width=8, window=4)
    assert sorted(order) == list(range(len(prompts)))
    for start in range(0, 96, 32):  # each window holds the ordered list's own 32, length-sorted
        window = order[start:start + 32]
        assert sorted(window) == list(range(start, start + 32))
        for chunk in range(0, 32, 8):
            lengths = [len(prompts[i]) for i in window[chunk:chunk + 8]]
            assert lengths == sorted(lengths)


def test_pycode_prompts_can_be_asked_as_a_stub():
    text = "Write a Python function `clamp(x, lo=0, hi=1)` that does the following:\n\nClamp x."
    ask = as_completion(text)
    assert ask.startswith("Complete the following Python function.\n\n```python\n")
    assert 'def clamp(x, lo=0, hi=1):\n    """Clamp x.\n    """\n```' in ask
    assert as_completion("Tell me a joke") is None


def test_vectorised_loop_detection_matches_the_metric():
    rng = random.Random(0)
    rows = []
    for k in range(120):
        n = rng.randint(1, 260)
        if k % 3 == 2:
            head = [rng.randrange(900) for _ in range(rng.randint(3, 120))]
            cycle = [rng.randrange(900) for _ in range(rng.randint(1, 17))]
            rows.append((head + cycle * 40)[:n])
        else:
            rows.append([rng.randrange(6 if k % 3 else 60) for _ in range(n)])
    grid = np.full((len(rows), max(map(len, rows))), -1)
    for i, r in enumerate(rows):
        grid[i, :len(r)] = r
    got = loop_starts(grid, np.array([len(r) for r in rows])).tolist()
    assert got == [-1 if loop_start(r) is None else loop_start(r) for r in rows]
    assert any(g >= 0 for g in got) and any(g < 0 for g in got)
    # ids too far apart to pack four into 64 bits take the other n-gram path: same answer
    wide = np.where(grid >= 0, grid * 100_003, -1)
    assert loop_starts(wide, np.array([len(r) for r in rows])).tolist() == got


def test_loop_cut_keeps_a_few_tokens_of_the_loop():
    head = list(range(100, 160))
    looping = head + [7, 8, 9] * 100
    calm = list(range(200, 500))
    cut = cut_loops([looping, calm], keep=16)
    assert cut[0] == looping[:loop_start(looping) + 16] and len(cut[0]) < 120
    assert cut[1] == calm


def test_sampled_continuations_follow_the_seed(pair):
    _, _, model, tokenizer = pair
    prompts = [[5, 17, 40, 2, 99]] * 4
    mx.random.seed(3)
    a = continue_batch(model, prompts, 12, eos={10_000}, temperature=1.0)
    mx.random.seed(3)
    b = continue_batch(model, prompts, 12, eos={10_000}, temperature=1.0)
    assert a == b and len({tuple(r) for r in a}) > 1  # sampled, not greedy


def mix_config(tmp_path, records, **kw) -> MixConfig:
    path = write_jsonl(tmp_path / "prompts.jsonl", records)
    return MixConfig(str(path), num_prompts=8, max_new=6, batch=4, heldout_size=3,
                     multiturn_share=0.5, magpie_share=0.5, templated_share=0.5, **kw)


def test_prompts_encode_in_one_batch_as_each_would_alone(pair):
    """encode_prompts renders and tokenizes the whole batch in one call (a fast tokenizer's
    parallel encode); each row equals the conversation's own chat-template encoding."""
    _, _, _, tokenizer = pair
    chats = [[{"role": "user", "content": "Hi"}],
             [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "Name three prime numbers, please."}],
             [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
              {"role": "user", "content": "And 3+3?"}]]
    alone = [list(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True))
             for c in chats]
    assert len({len(a) for a in alone}) == 3  # rows of different lengths: no padding kept
    assert encode_prompts(tokenizer, chats) == alone
    assert encode_prompts(tokenizer, []) == []


def test_multiturn_replay_feeds_back_the_targets_answers(pair, tmp_path):
    _, _, model, tokenizer = pair
    turns = ["Hello!", "What is 12 times 7?", "Thanks, and 3 times 4?"]
    cfg = mix_config(tmp_path, [{"id": "m1", "prompt": turns[0], "source": "sharegpt",
                                 "turns": turns}])
    collector = Collector(model, tokenizer, cfg, tmp_path / "state", say=lambda m: None)
    data = collector.multiturn(load_records(cfg.prompts_file), None)
    assert len(data) == 3
    eos = set(tokenizer.eos_token_ids)
    chat: list[dict] = []
    for turn, seq, plen in zip(turns, data.sequences, data.prompt_lens):
        chat = chat + [{"role": "user", "content": turn}]
        prompt = encode_prompts(tokenizer, [chat])[0]
        assert seq[:plen] == prompt
        want = continue_batch(model, [prompt], cfg.max_new, eos)[0]
        assert seq[plen:] == want
        chat = chat + [{"role": "assistant",
                        "content": tokenizer.decode([t for t in want if t not in eos])}]


def test_multiturn_replay_runs_many_chats_at_once_each_in_its_own_context(pair, tmp_path):
    """More chats than batch rows, of different lengths: every turn of every chat is asked
    once, after that chat's earlier turns and the target's own answers to them."""
    _, _, model, tokenizer = pair
    chats = [["Hi!", "Name a fruit.", "And a colour?"], ["What is 2 plus 2?", "Times 3?"],
             ["Tell me a joke.", "Another one.", "Why is it funny?"], ["Hello.", "Bye."]]
    cfg = mix_config(tmp_path, [{"id": f"m{i}", "prompt": t[0], "source": "sharegpt",
                                 "turns": t} for i, t in enumerate(chats)])
    cfg = MixConfig(**{**cfg.__dict__, "batch": 2})
    collector = Collector(model, tokenizer, cfg, tmp_path / "state", say=lambda m: None)
    data = collector.multiturn(load_records(cfg.prompts_file), None)
    eos = set(tokenizer.eos_token_ids)
    want = set()
    for turns in chats:
        chat: list[dict] = []
        for turn in turns:
            chat = chat + [{"role": "user", "content": turn}]
            prompt = encode_prompts(tokenizer, [chat])[0]
            answer = continue_batch(model, [prompt], cfg.max_new, eos)[0]
            want.add((tuple(prompt), tuple(answer)))
            chat = chat + [{"role": "assistant",
                            "content": tokenizer.decode([t for t in answer if t not in eos])}]
    got = {(tuple(s[:p]), tuple(s[p:])) for s, p in zip(data.sequences, data.prompt_lens)}
    assert len(data) == sum(map(len, chats)) and got == want
    assert data.meta["turns"] == [4, 4, 2]  # sequences at turn 1, 2 and 3


def test_interrupted_data_run_resumes_at_its_phase(pair, tmp_path):
    _, _, model, tokenizer = pair
    rows = [{"id": f"r{i}", "prompt": f"Question {i}: what is {i} plus {i}?",
             "source": "gsm8k_train"} for i in range(40)]
    rows += [{"id": "m", "prompt": "Hi", "source": "sharegpt", "turns": ["Hi", "And?"]}]
    cfg = mix_config(tmp_path, rows)
    state = tmp_path / "state"
    first, heldout = Collector(model, tokenizer, cfg, state, say=lambda m: None).run()
    assert len(heldout) >= 1 and len(first) > 0
    # as if killed during the magpie phase: later phases are missing, earlier ones are kept
    for phase in ("magpie", "templated"):
        (state / f"data-{phase}.npz").unlink()

    class NoRedo(Collector):
        def single(self, *a):
            raise AssertionError("a finished phase ran again")

        multiturn = heldout = single

    said: list[str] = []
    again, heldout2 = NoRedo(model, tokenizer, cfg, state, say=said.append).run()
    assert any("reusing" in m for m in said)
    assert again.sequences == first.sequences and heldout2.sequences == heldout.sequences
    # the phases that generated again say where their time went (the running batch's accounts)
    accounts = Dataset.load(state / "data-templated.npz").meta["batch_seconds"]
    assert {"decode", "sync", "fill"} <= set(accounts)
    assert any(m.startswith("templated: seconds decode") for m in said)


def test_grown_draft_starts_where_the_shallow_one_was(pair):
    _, draft_dir, _, _ = pair
    draft = load_draft_folder(draft_dir, mx.float32)
    grown = grow_draft(draft, draft.args.num_hidden_layers + 2)
    assert len(grown.layers) == len(draft.layers) + 2
    taps = mx.random.normal((1, 7, draft.fc.weight.shape[1]))
    block = mx.random.normal((1, draft.args.block_size, draft.args.hidden_size))
    outs = []
    for d in (draft, grown):
        cache = d.make_cache()
        d.append_context(taps, cache)
        outs.append(d(block, cache))
    assert mx.allclose(outs[0], outs[1], atol=1e-5)


def test_widened_draft_starts_where_the_narrow_one_was_and_its_new_units_train(pair):
    _, draft_dir, _, _ = pair
    draft = load_draft_folder(draft_dir, mx.float32)
    width = draft.args.intermediate_size
    grown = grow_width(draft, width + 24)
    assert grown.layers[0].mlp.gate_proj.weight.shape[0] == width + 24
    assert grown.args.intermediate_size == width + 24
    taps = mx.random.normal((1, 7, draft.fc.weight.shape[1]))
    block = mx.random.normal((1, draft.args.block_size, draft.args.hidden_size))

    def run(d):
        cache = d.make_cache()
        d.append_context(taps, cache)
        return d(block, cache)

    assert mx.allclose(run(draft), run(grown), atol=1e-5)
    # the new units have random gates and ups: once their down columns move, they count
    mlp = grown.layers[0].mlp
    mlp.down_proj.weight = mx.concatenate(
        [mlp.down_proj.weight[:, :width], mx.full((mlp.down_proj.weight.shape[0], 24), 0.1)],
        axis=1)
    assert not mx.allclose(run(draft), run(grown), atol=1e-3)
    with pytest.raises(ConfigError, match="keeps its MLP width"):
        grow_width(draft, width - 1)


def test_grown_taps_start_where_the_draft_was_and_then_read_the_new_layers(pair):
    _, draft_dir, _, _ = pair
    draft = load_draft_folder(draft_dir, mx.float32)
    old = list(draft.args.target_layer_ids)
    H = draft.args.hidden_size
    new_layer = next(i for i in range(draft.args.num_target_layers) if i not in old)
    taps = sorted(old + [new_layer])
    grown = grow_taps(draft, taps)
    assert grown.args.target_layer_ids == taps and grown.fc.weight.shape == (H, len(taps) * H)
    # features in the grown draft's tap order; the old draft reads its own taps only
    feats = {t: mx.random.normal((1, 7, H)) for t in taps}
    block = mx.random.normal((1, draft.args.block_size, H))

    def run(d, ids, scale=1.0):
        cache = d.make_cache()
        d.append_context(mx.concatenate([feats[t] * (scale if t == new_layer else 1.0)
                                         for t in ids], axis=-1), cache)
        return d(block, cache)

    assert mx.allclose(run(draft, old), run(grown, taps), atol=1e-5)
    # the new columns are trainable: once non-zero, the new layer's features matter
    grown.fc.weight = grown.fc.weight + 0.1
    assert not mx.allclose(run(grown, taps), run(grown, taps, scale=3.0), atol=1e-3)
    with pytest.raises(ConfigError, match="must keep its taps"):
        grow_taps(draft, [t for t in taps if t != old[0]])


def test_a_held_out_prompt_is_never_trained_on_under_another_id():
    """The prompt file holds the same text more than once ("Hey!" opens many chats): a
    record repeating a held-out record's turn is dropped at collection, and a training
    sequence with a held-out prompt, or a prompt another run already answered, at training."""
    from engine.train.dataset import Dataset, distinct_prompts

    held_id = next(f"r{i}" for i in range(1000) if is_held_out(f"r{i}"))
    free = [f"r{i}" for i in range(1000) if not is_held_out(f"r{i}")]
    records = [PromptRecord(held_id, "chitchat", "chat", ("Hey!",)),
               PromptRecord(free[0], "sharegpt", "chat", ("hey", "And then?")),
               PromptRecord(free[1], "sharegpt", "chat", ("Hey there, how are you?",))]
    assert [r.id for r in usable(records, None)] == [free[1]]
    # a slice without the held-out record is still checked against it
    assert [r.id for r in usable(records[1:], None, among=records)] == [free[1]]
    assert [r.id for r in usable(records[1:], None)] == [free[0], free[1]]

    heldout = Dataset([[1, 2, 9, 9]], [2])
    a = Dataset([[1, 2, 5, 5], [3, 4, 6], [7, 7, 7]], [2, 2, 1])
    b = Dataset([[3, 4, 6, 6], [8, 1]], [2, 1])
    (a2, b2), dropped = distinct_prompts([a, b], heldout)
    assert a2.sequences == [[3, 4, 6], [7, 7, 7]] and b2.sequences == [[8, 1]]
    assert dropped == {"duplicate_prompts": 1, "held_out_prompts": 1}


def test_skip_answered_asks_no_prompt_an_earlier_dataset_holds(pair, tmp_path):
    """--skip-answered: the single phase draws only records whose first turn no earlier
    dataset answered (so it still gets num_prompts fresh ones), templated prompts already
    answered are left out, and a multi-turn replay reuses a stored answer instead of asking
    again (its later turns are still new)."""
    _, _, model, tokenizer = pair
    rows = [{"id": f"r{i}", "prompt": f"Question {i}: what is {i} plus {i}?",
             "source": "gsm8k_train"} for i in range(24)]
    turns = ["Hello there!", "What is 12 times 7?"]
    rows += [{"id": "m", "prompt": turns[0], "source": "sharegpt", "turns": turns}]
    cfg = mix_config(tmp_path, rows)
    records = load_records(cfg.prompts_file)
    first = Collector(model, tokenizer, cfg, tmp_path / "a", say=lambda m: None)
    single = first.single(records, None)
    templated = first.templated(None)
    # an earlier run answered the multi-turn record's first turn as a single prompt
    opener = encode_prompts(tokenizer, [[{"role": "user", "content": turns[0]}]])[0]
    earlier = Dataset.concat([single, templated, Dataset(
        [opener + continue_batch(model, [opener], cfg.max_new, set(tokenizer.eos_token_ids))[0]],
        [len(opener)])])
    earlier.save(tmp_path / "earlier.npz")

    said: list[str] = []
    again = Collector(model, tokenizer, MixConfig(**{
        **cfg.__dict__, "skip_answered": (str(tmp_path / "earlier.npz"),)}), tmp_path / "b",
        say=said.append)
    asked = {tuple(s[:p]) for s, p in zip(earlier.sequences, earlier.prompt_lens)}
    fresh = again.single(records, None)
    assert len(fresh) == len(single) == cfg.num_prompts  # as many, all new
    assert not asked & {tuple(s[:p]) for s, p in zip(fresh.sequences, fresh.prompt_lens)}
    assert again.skipped["single"] >= cfg.num_prompts
    assert len(again.templated(None)) == 0 and again.skipped["templated"] == len(templated)
    replay = again.multiturn(records, None)
    assert again.skipped["multiturn"] == 1  # the opener's stored answer, not asked again
    assert len(replay) == 1 and replay.prompt_lens[0] > len(opener)  # turn 2 only
    assert replay.sequences[0][:len(earlier.sequences[-1])] == earlier.sequences[-1]


def test_skip_answered_flag_reaches_the_collector_and_checks_its_files(tmp_path):
    from engine.train.loop import TrainConfig, build_parser, train

    args = vars(build_parser().parse_args([
        "--model", "m", "--out", str(tmp_path / "o"), "--gen-attention", "grouped",
        "--gen-back-to-back",
        "--skip-answered", str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]))
    cfg = TrainConfig(**args)
    assert cfg.skip_answered == [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]
    assert cfg.gen_attention == "grouped" and cfg.gen_back_to_back
    with pytest.raises(ConfigError, match="--skip-answered"):
        train(cfg, say=lambda m: None)  # before any model loads


def test_generation_time_shares_parse_and_bad_ones_are_refused(capsys):
    from engine.train.collect import TIME_SHARES, parse_time_shares
    from engine.train.loop import TrainConfig, build_parser

    shares = parse_time_shares("magpie=0.4,templated=0")
    assert shares["templated"] == 0 and abs(sum(shares.values()) - 1) < 1e-9
    assert shares["magpie"] / shares["single"] == pytest.approx(0.4 / TIME_SHARES["single"])
    assert parse_time_shares("") == pytest.approx(TIME_SHARES)
    for bad, why in (("magpy=0.3", "unknown phase"), ("single=x", "as a number"),
                     ("single=-1", "negative")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--model", "m", "--out", "o", "--gen-shares", bad])
        assert why in capsys.readouterr().err
    args = vars(build_parser().parse_args(["--model", "m", "--out", "o", "--gamma", "3.5",
                                           "--gen-shares", "magpie=0.35"]))
    cfg = TrainConfig(**args)
    assert cfg.gamma == 3.5 and cfg.gen_shares == "magpie=0.35"
    assert TrainConfig(model="m", out="o").gamma == 7.0


def test_magpie_turns_give_every_steer_a_turn_and_writing_the_most():
    from engine.train.mix import MAGPIE_STEERS, MAGPIE_TURNS

    turns = Counter(MAGPIE_TURNS)
    assert set(turns) == set(range(len(MAGPIE_STEERS)))
    assert "creative writing" in MAGPIE_STEERS[turns.most_common(1)[0][0]]


def test_prompt_coverage_counts_answered_prompts_per_source_and_slice(tmp_path):
    coverage = load_script("prompt_coverage").coverage
    records = [{"id": f"src-{i:04d}", "source": "a" if i % 2 else "b", "prompt": f"q {i}"}
               for i in range(40)]
    records.append({"id": "src-x", "source": "a", "turns": ["first turn", "second"]})
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)

    class Answered:  # answered before: two plain prompts (one held out), a multi-turn record
        def has_text(self, text: str) -> bool:
            return text in {"q 3", "q 4", "first turn"}

    counts = coverage(Answered(), path, 2)
    kept = [r for r in records if not is_held_out(r["id"])]
    for source in ("a", "b"):
        for k in (0, 1):
            row = counts[source][k]
            mine = [r for r in kept if r["source"] == source and in_slice(r["id"], k, 2)]
            assert row["prompts"] == len(mine)
            assert row["answered"] == sum((r.get("turns") or [r.get("prompt")])[0]
                                          in {"q 3", "q 4", "first turn"} for r in mine)
    assert is_held_out("src-0003")  # so "q 3" counts nowhere
    assert sum(r["answered"] for rows in counts.values() for r in rows) == 2


def test_prompt_coverage_reads_the_datasets_with_the_answering_targets_tokenizer(pair, tmp_path):
    """The datasets hold token ids: `--model` names the target whose tokenizer reads them back
    (the default, SmolLM2's, found nothing of another target's answers)."""
    target_dir, _, _, tokenizer = pair
    ids = [f"r{i}" for i in range(50) if not is_held_out(f"r{i}")][:3]
    questions = [f"What is {i} plus {i}?" for i in range(3)]
    prompts = encode_prompts(tokenizer, [[{"role": "user", "content": q}] for q in questions])
    Dataset([p + [5, 6] for p in prompts[:2]], [len(p) for p in prompts[:2]]).save(
        tmp_path / "gen.npz")
    with gzip.open(tmp_path / "p.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"id": i, "source": "gsm8k_train", "prompt": q}) + "\n"
                     for i, q in zip(ids, questions))
    out = tmp_path / "coverage.json"
    assert load_script("prompt_coverage").main([
        "--model", str(target_dir), "--data", str(tmp_path / "gen.npz"), "--slices", "1",
        "--prompts", str(tmp_path / "p.jsonl.gz"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == str(target_dir)
    assert report["sources"]["gsm8k_train"] == [{"slice": 0, "prompts": 3, "answered": 2}]
