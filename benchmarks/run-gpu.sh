#!/usr/bin/env bash
# What we measure on the H200, after ../shared/gpu/stage with the SmolLM2 GGUF. Results land
# in $OUT; eval prompts travel in .carry/data, the tokenizer folder in .carry/tok. Each part
# returns $OUT/kernel-cache.tar.xz.NN (scripts/gpu_kernel_cache.sh): keep the pieces in git
# history and stage them, joined, beside the GGUF next time, so a fresh machine skips
# compiling MLX's kernels.
#   PART=setup   copy the GGUF + tokenizer into the engine's cache (once per machine)
#   PART=kernels kernel exactness checks, forward profile, the synthetic Qwen3.5-9B shape
#   PART=smollm2 the SmolLM2 pair: three suites at 256 tokens, 512-token rows, the
#                1024 -> 4096 token scaling row (DRAFT=folder picks the draft; the
#                wholeblock rows: ARGS="--min-confidence off --draft-vocab off" SUFFIX=-wholeblock)
#   PART=rows    the README's H200 rows only: three suites at 256 tokens, 10 prompts
#                (DRAFT, ARGS and SUFFIX as for smollm2)
#   PART=cost    the cycle probe, the oracle runs at 8 and 4 tokens/cycle, synthetic 9B in bf16
#   PART=sampled the three suites at temperature 0.7 (issue 64: every prompt against mlx-lm,
#                the medians), as benchmarks/smollm2-*-t07-cpu.json on the CPU
#   PART=results the README's GPU rows (mlx-lm, speculation off, DFlash; LIMIT prompts, 8)
#   PART=ab      an engine change's same-run A/B against a carried checkout (BEFORE)
#   PART=cost-quick the cost checks that fit beside answer generation (train-smollm2-x2.sh
#                PART=gen PROBE_GPU=g PROBE_PARTS=cost-quick): the cycle probe's cycle and host
#                parts at checkpoint precision with the engine's defaults (and in children
#                with MLX_MAX_OPS_PER_BUFFER=OPS_A / OPS_B), the oracle runs at 8 and 4
#   PART=goals   issue 13's goals with the engine's defaults: the oracle rows at 8 and 4, the
#                three suites (LIMIT, default 6, prompts each), the synthetic Qwen3.5-9B in
#                bf16, into the file names the issue gives (about 8 minutes)
#   PART=pieces  the target's verify forward at T=16 and T=1, and each piece of its layers
#                (projections, RoPE, attention, MLP) at both (scripts/gpu_cycle_probe.py
#                --parts forward,pieces), at checkpoint precision: where a verify's extra
#                device time goes
#   PART=verify-pieces the same for the synthetic Qwen3.5-9B in bf16 (scripts/verify_pieces.py):
#                its GatedDeltaNet and attention layers' pieces at T=16 and T=1 after 2,048
#                cached tokens, ranked by what 16 tokens cost over 1 (T_verify16 / T_ar)
#   PART=rollback issue 13's fused rollback kernel (one launch per linear layer instead of
#                several; the CUDA default since the stage-24 session): scripts/gpu_checks.py
#                (bitwise against the replay kernel and the conv rows), then the synthetic
#                Qwen3.5-9B in bf16 without it (DFLASH_FUSED_ROLLBACK=0, SUFFIX
#                -separate-rollback) and with it (the defaults); ~8 minutes
#   PART=attention issue 13's fused block-attention kernel (on by default on CUDA) against
#                MLX's attention: exactness and timing (scripts/gpu_attention_check.py), then
#                the oracle rows and the three suites at 256 tokens with the defaults, and again
#                with DFLASH_GPU_ATTENTION=mlx (SUFFIX -mlxattn); ~7 minutes
#   PART=sources the held-out real-prompt answers' simulated tokens/cycle per prompt source
#                (scripts/heldout_by_source.py; DRAFT, and DRAFT_B beside it if set; HELDOUT,
#                default .carry/heldout.npz: `git show 2b41663:benchmarks/stage5/heldout.npz`)
#   PART=overlap issue 13's host-cost A/B: a first short run builds the kernels (a fresh machine
#                spends minutes there; KERNELS=0 skips it on a machine that ran it), then for
#                each of VARIANTS (default "defaults off": the engine's GPU defaults, which
#                queue the next draft early and stream each forward every 6 layers, and none
#                of the options; also "prefetch", "stream": each alone, "prefetch-stream":
#                both with --stream-verify EVERY (default 6)) the oracle rows at ORACLE_KS
#                (default "8 4"; ORACLE=0 skips them) and the suites in SUITES (default
#                mt-bench),
#                -<variant> in the file names. All may not fit one 10-minute call: split
#                VARIANTS over calls on one machine (KERNELS=0 after the first)
#   PART=synthetic the synthetic Qwen3.5-9B in bf16 alone (REPEAT pairs, SUFFIX; e.g.
#                DFLASH_MERGE_PROJECTIONS=0 SUFFIX=-separate for the A/B of the verify's merged
#                input projections, engine/targets/merged.py)
#   PART=oracle  the oracle rows at 8 and 4 tokens/cycle alone (DRAFT, ARGS, SUFFIX), after the
#                cycle probe's split part (a verify forward taken apart, gpu-split-h200.json)
#   PART=gen-profile where batched answer generation's time goes (training data, issue 12):
#                attention with / without the padding mask, KV cache updates, whole decode
#                steps (mlx vs grouped attention), answer_running end to end (~2 minutes)
# Each part fits one device call (< 10 minutes). A benchmark step stops after BENCH_S seconds
# (default 400: the first suite on a fresh machine once ran past the 200 s allowed before,
# leaving no row).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. DFLASH_CACHE_DIR=/root/dfcache
source scripts/gpu_kernel_cache.sh  # MLX's compiled CUDA kernels, kept and staged
# The suites ship with the engine; a carried .carry/data replaces them only where it came
# along (the stage-22 session's goals call carried none: every suite row failed on the path).
[[ -d .carry/data ]] && export DFLASH_EVAL_DATA=.carry/data
gguf=$DFLASH_CACHE_DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
step() { echo "== $*"; timeout "$1" "${@:2}" 2>&1 | tail -${TAIL:-25}; }
DRAFT=${DRAFT:-engine/drafts/smollm2-135m-instruct-dflash}
bench() { step ${BENCH_S:-400} python3 -m engine.cli benchmark --draft "$DRAFT" ${ARGS:-} "$@"; }
rows() {  # the README's H200 rows: three suites at 256 tokens
  for suite in mt-bench humaneval gsm8k; do
    bench --suite "$suite" --limit ${LIMIT:-10} --max-tokens 256 --json "$OUT/smollm2-$suite${SUFFIX:-}-h200.json"
  done
}
oracle_rows() {  # the cycle's cost at 8 and 4 tokens/cycle, whatever the draft proposes
  for k in 8 4; do
    bench --suite mt-bench --limit 8 --max-tokens 256 --no-eos --oracle-tokens-per-cycle $k \
      --json "$OUT/smollm2-oracle$k${SUFFIX:-}-h200.json"
  done
}
synthetic_bf16() {  # the synthetic Qwen3.5-9B in bf16 at 9.6 tokens/cycle (issue 13's goal);
  # three (baseline, DFlash) pairs: mlx-lm's rate doubled between two calls of the stage-22
  # session, so one pair decides nothing
  step 360 python3 -m engine.cli benchmark --synthetic qwen3.5-9b --tokens-per-cycle 9.6 \
    --max-tokens 256 --dtype bfloat16 --repeat ${REPEAT:-3} \
    --json "$OUT/synthetic-qwen3.5-9b-bf16${SUFFIX:-}-h200.json"
}
case "${PART:-}" in
setup)
  mkdir -p "$(dirname "$gguf")"; cp /root/stash/files/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
  # The GPU machine has transformers 4.x: bring the tokenizer folder built here, stamped anew.
  cp -r .carry/tok "$gguf.tokenizer"
  python3 scripts/stamp_tokenizer.py "$gguf"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ;;
kernels)
  step 120 python3 scripts/gpu_checks.py --out "$OUT/gpu_checks-h200.json"
  for dt in float32 bfloat16; do
    step 60 python3 scripts/forward_profile.py --dtype $dt --json "$OUT/forward-profile-$dt-h200.json"
  done
  step 300 python3 -m engine.cli benchmark --synthetic qwen3.5-9b --tokens-per-cycle 9.6 \
    --max-tokens 256 --json "$OUT/synthetic-qwen3.5-9b-h200.json" ;;
smollm2)
  rows
  for suite in humaneval gsm8k; do
    bench --suite "$suite" --limit 5 --max-tokens 512 --json "$OUT/smollm2-$suite-512${SUFFIX:-}-h200.json"
  done
  for n in 1024 4096; do
    bench --suite gsm8k --limit 1 --max-tokens $n --no-eos --json "$OUT/smollm2-gsm8k-$n${SUFFIX:-}-h200.json"
  done ;;
rows)  # the H200 rows of the README with a new draft (beside answer generation)
  rows ;;
cost)  # issue 13: where a cycle's time goes, and what a cycle costs at a known acceptance
  step 360 python3 scripts/gpu_cycle_probe.py
  oracle_rows
  synthetic_bf16 ;;
cost-quick)  # issue 13 on a GPU left free while the other generates
  MLX_CUDA_USE_CUDNN_SDPA=0 step 300 python3 scripts/gpu_cycle_probe.py --parts cycle,host,children \
    --out "$OUT/gpu-cycle-probe-quick-h200.json" --precisions checkpoint --budget 160 --child-budget 50 \
    --child-envs "MLX_MAX_OPS_PER_BUFFER=${OPS_A:-100}:cycle:checkpoint;MLX_MAX_OPS_PER_BUFFER=${OPS_B:-400}:cycle:checkpoint"
  oracle_rows ;;
goals)  # issue 13's goals at the engine's defaults, into the files the issue names
  BENCH_S=400 bench --suite mt-bench --limit 2 --max-tokens 64  # kernels (a fresh machine)
  oracle_rows; LIMIT=${LIMIT:-6} rows
  synthetic_bf16 ;;
pieces)  # issue 13: what a verify pays beyond a plain step, piece by piece (the stage-21
  # session gave it 120 s on a fresh machine and it printed nothing: kernels build first; in
  # the stage-26 session loading alone took 123 s of the default 100 s budget)
  MLX_CUDA_USE_CUDNN_SDPA=0 step 420 python3 scripts/gpu_cycle_probe.py --parts forward,pieces \
    --precisions checkpoint --budget 360 --out "$OUT/gpu-pieces-h200.json" ;;
rollback)  # issue 13: the fused rollback kernel checked bitwise (scripts/gpu_checks.py), then
  # the synthetic 9B in bf16 without it and with it (the default); ~8 minutes. The stage-24
  # session's run (benchmarks/stage24/) came before it was the default: its first synthetic
  # file is without it, its -fused-rollback file (DFLASH_FUSED_ROLLBACK=1) with it
  step 150 python3 scripts/gpu_checks.py --out "$OUT/gpu_checks-h200.json"
  (export DFLASH_FUSED_ROLLBACK=0 SUFFIX=-separate-rollback; synthetic_bf16)
  synthetic_bf16 ;;
verify-pieces)  # issue 13: where the 9B shape's bf16 verify spends beyond a plain step
  TAIL=30 step 300 python3 scripts/verify_pieces.py --synthetic qwen3.5-9b \
    --json "$OUT/verify-pieces-qwen3.5-9b-bf16-h200.json" ;;
attention)  # issue 13: a verify block's attention in one kernel instead of MLX's fallback
  TAIL=12 step 240 python3 scripts/gpu_attention_check.py --out "$OUT/gpu-attention-check-h200.json"
  oracle_rows; rows
  export DFLASH_GPU_ATTENTION=mlx SUFFIX=-mlxattn
  oracle_rows; rows ;;
sources)  # issue 12: which prompt sources the draft predicts worst
  drafts=(--draft "$DRAFT"); [[ -n ${DRAFT_B:-} ]] && drafts+=(--draft "$DRAFT_B")
  TAIL=40 step 400 python3 scripts/heldout_by_source.py "${drafts[@]}" \
    --heldout "${HELDOUT:-.carry/heldout.npz}" --json "$OUT/heldout-by-source-h200.json" ;;
synthetic)  # issue 13's 9B goal alone
  synthetic_bf16 ;;
oracle)  # issue 13's oracle goals alone, after a verify forward taken apart (the probe's
  # split part: whole forward, head, mlx-lm's own call at 16 and 1 tokens; ~30 s once loaded.
  # The budget counts the load: on a fresh machine the kernel build took 159 s of 100 in the
  # stage-34 session, and the part was skipped)
  MLX_CUDA_USE_CUDNN_SDPA=0 step 300 python3 scripts/gpu_cycle_probe.py --parts split \
    --precisions checkpoint --budget 250 --out "$OUT/gpu-split-h200.json"
  oracle_rows ;;
gen-profile)  # issue 12: sdpa, cache updates, decode steps and answer_running, bf16
  TAIL=40 step 300 python3 scripts/gen_profile.py --json "$OUT/gen-profile-bf16-h200.json" ;;
overlap)  # issue 13: work queued before the host needs it, against the engine's defaults
  if [[ ${KERNELS:-1} == 1 ]]; then
    BENCH_S=400 bench --suite mt-bench --limit 2 --max-tokens 64  # kernels
  fi
  none="--prefetch-draft off --stream-verify off"  # the GPU defaults turn both on
  for v in ${VARIANTS:-defaults off}; do
    case $v in
      defaults) a="" ;;
      off) a="$none" ;;
      prefetch) a="--prefetch-draft on --stream-verify off" ;;
      stream) a="--prefetch-draft off --stream-verify ${EVERY:-6}" ;;
      prefetch-stream) a="--prefetch-draft on --stream-verify ${EVERY:-6}" ;;
      *) echo "unknown variant $v" >&2; continue ;;
    esac
    if [[ ${ORACLE:-1} == 1 ]]; then
      for k in ${ORACLE_KS:-8 4}; do
        ARGS="$a" bench --suite mt-bench --limit 8 --max-tokens 256 --no-eos \
          --oracle-tokens-per-cycle $k --json "$OUT/smollm2-oracle$k-$v-h200.json"
      done
    fi
    for suite in ${SUITES:-mt-bench}; do
      ARGS="$a" bench --suite "$suite" --limit ${LIMIT:-10} --max-tokens 256 \
        --json "$OUT/smollm2-$suite-$v-h200.json"
    done
  done ;;
results)  # the README's GPU rows: mlx-lm, speculation off and DFlash, at checkpoint precision
  # (copy $OUT/gpu-*.json into benchmarks/results/, then scripts/results_table.py --write)
  BENCH_S=400 bench --suite mt-bench --limit 2 --max-tokens 64  # kernels (a fresh machine)
  save_kernel_cache  # now too: a call cut short still returns it
  for suite in mt-bench humaneval gsm8k; do
    bench --suite "$suite" --limit ${LIMIT:-8} --max-tokens 256 --plain-engine \
      --json "$OUT/gpu-$suite.json"
  done ;;
ab)  # an engine change's A/B on the GPU, both checkouts in one run (scripts/ab_bench.py):
  # BEFORE, a checkout carried here, e.g. made with
  #   git archive ef1fe8b engine scripts pyproject.toml ':!engine/drafts/qwen*' \
  #     | tar -x -C .carry/before   (issue 63's engine before its deletions)
  step ${BENCH_S:-540} python3 scripts/ab_bench.py --checkout before=${BEFORE:-.carry/before} \
    --checkout after=. --suite humaneval --suite gsm8k --suite mt-bench --limit ${LIMIT:-4} \
    --no-baseline --json "$OUT/ab${SUFFIX:-}-gpu.json" ;;
sampled)  # issue 16: temperature 0.7 beside the greedy rows
  # kernels first (a fresh H100, 2026-12-08: each suite with 125 s ran out before its JSON)
  BENCH_S=400 bench --suite mt-bench --temperature 0.7 --seed 0 --limit 1 --max-tokens 64
  save_kernel_cache  # now too: a call cut short still returns it
  for suite in mt-bench humaneval gsm8k; do
    bench --suite "$suite" --temperature 0.7 --seed 0 --limit ${LIMIT:-8} --max-tokens 256 \
      --json "$OUT/smollm2-$suite-t07-gpu.json"
  done ;;
*) echo "PART=setup|kernels|smollm2|rows|results|ab|cost|cost-quick|goals|pieces|rollback|verify-pieces|attention|overlap|sources|sampled|synthetic|oracle|gen-profile" >&2
   exit 2 ;;
esac
save_kernel_cache
exit 0
