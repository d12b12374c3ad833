"""scripts/verify_pieces.py on CPU shapes (the H200 run is one call of run-gpu.sh)."""

from __future__ import annotations

import json

from script_modules import load_script

TINY = ["--override", "hidden_size=64", "--override", "intermediate_size=128",
        "--override", "vocab_size=256", "--override", "linear_num_key_heads=2",
        "--override", "linear_num_value_heads=4", "--override", "linear_key_head_dim=32",
        "--override", "linear_value_head_dim=16", "--override", "num_attention_heads=4",
        "--override", "num_key_value_heads=2", "--override", "head_dim=16",
        "--override", "full_attention_interval=2"]
LINEAR = {"gdn_in_proj_qkv", "gdn_in_proj_z", "gdn_in_proj_ba", "gdn_conv", "gdn_qk_gates",
          "gdn_recurrence_mlx", "gdn_recurrence_verify", "gdn_norm_out"}


def test_every_piece_of_every_layer_is_timed_and_the_caches_are_left_as_found(tmp_path):
    vp = load_script("verify_pieces")
    out = tmp_path / "pieces.json"
    assert vp.main(["--layers", "4", "--ctx", "40", "--iters", "2", *TINY,
                    "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["synthetic"] and report["dtype"] == "float32" and report["ctx"] == 40
    for T in ("T1", "T16"):
        row = report["pieces"][T]
        assert LINEAR | {"attn_projections", "attn_mixer_mlx", "norms", "mlp", "head",
                         "argmax"} <= set(row)
        assert all(p["ms"] > 0 and p["min_ms"] <= p["ms"] for p in row.values())
        assert row["gdn_conv"]["layers"] == 2 and row["attn_mixer_mlx"]["layers"] == 2
        assert row["mlp"]["layers"] == 4 and row["head"]["layers"] == 1
    extra = [e["ms"] for e in report["extra_ms"]]
    assert extra == sorted(extra, reverse=True) and len(extra) == len(report["pieces"]["T1"])
    assert set(report["pieces_sum_ms"]) == {"plain_T1", "verify_T16"}
    assert report["whole"]["t_ar_s"] > 0 and report["whole"]["ctx"] == 40
    assert set(report["rollback"]) == {"keep1", "keep8", "keep15"}
    assert all(r["linear_layers"] == 2 and r["rollback_ms"] > r["rollback_build_ms"] > 0
               for r in report["rollback"].values())

    # The mixers append T keys to the layers' caches: each evaluation trims them again.
    from engine.bench.synthetic import build_target, parse_overrides
    from engine.cycle import prefill
    from engine.targets import adapter_for

    target = adapter_for(build_target("qwen3.5-9b", 4, parse_overrides(TINY[1::2])))
    cache = target.make_cache()
    prefill(target, cache, list(range(1, 41)), 512)
    vp.pieces_at(target, cache, 16, 1)
    assert [c.offset for layer, c in zip(target.layers, cache) if not layer.is_linear] == [40, 40]
    vp.rollback_pieces(target, cache, 1)
    assert [c.offset for layer, c in zip(target.layers, cache) if not layer.is_linear] == [40, 40]
