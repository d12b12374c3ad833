#!/usr/bin/env bash
# The Qwen2.5-Coder-1.5B-Instruct pair on one lent GPU (H100 or H200), in parts, one device
# call each (a call lasts at most 10 minutes; the machine keeps /root between back-to-back
# calls, and is given back after 30 s idle). Staging first, here:
#   python scripts/stage_qwen_coder.py /tmp/qwen-stage --ar-draft \
#       [--data REV:benchmarks/qwen-coder-data/gen-1.npz ...]   # earlier answers, from history
#   ../shared/gpu/stage /tmp/qwen-stage/*          # then one device call per part, p1 first,
#                                                 # the last one with `&& PART=... bash <this>`
# Before staging, empty the two drafts' model.safetensors (keep the files: the stage tool's `du`
# stops silently on a missing tracked file) so the parts get the room: with the tree at 6 MB,
# `--parts-mib 57` makes 22 parts; INIT's tar of the shipped draft is staged like any file, and
# so is kernel-cache.tar.xz, which PART=gen, bench and ab return in pieces
# (scripts/gpu_kernel_cache.sh: MLX's compiled CUDA kernels; keep it in git history like the
# answers).
# Parts (PART=...):
#   gen    the target (bf16) answers prompt slice SLICE (K/N; 0/1: the whole file) of
#          train_prompts.jsonl.gz for GEN_S seconds, NUM_PROMPTS first turns drawn by the mix's
#          source weights (default GEN_S x 70), every staged answer's prompt skipped and a
#          staged heldout-N.npz taken as the held-out phase -> /root/gen-$SEED/data.npz,
#          copied to $OUT/gen-$SEED.npz (keep it: later sessions stage it again; the machine
#          keeps nothing)
#   train  a draft (DEPTH layers, MLP WIDTH, TAPS taps; or INIT, a staged draft folder tar) on
#          every gen-*.npz staged or made on this machine, for TRAIN_S seconds -> /root/draft,
#          packed into $OUT (weights in 15 MB pieces, 8-bit when bf16 would not fit what a
#          call returns: cat draft-weights.part-* > model.safetensors); PAUSE=S ends the call after S seconds and PART=resume
#          continues the same schedule
#   more   /root/draft trained on with its optimizer state for MORE_S more seconds
#   bench  dflash benchmark on SUITES (default: all three, LIMIT prompts each) with the
#          shipped draft (or DRAFT=/root/draft), mlx-lm plain and mlx-lm speculative with the
#          0.5B draft at K=2..6, at the GPU's default precision -> $OUT/qwen2.5-coder-1.5b-*-gpu.json
#   probe  where a cycle's time goes on this GPU (scripts/gpu_cycle_probe.py's host and cycle
#          parts at checkpoint precision, the shipped draft or DRAFT) -> $OUT/...-cycle-probe-gpu.json
#   ab     an engine change's same-run A/B (scripts/ab_bench.py, DFlash alone, LIMIT prompts per
#          suite, default 3) against the checkout BEFORE (default .ab-before: `git archive REV`
#          without the drafts' weights, carried), greedy and at each of TEMPS (default 0.7)
# Make the calls back to back: the machine goes back after 30 s idle and the staging with it
# (copy what a call returned after starting the next one).
# Stage 1 (2026-12-06, one H100): SEED=1 SLICE=0/4 GEN_S=400 GEN_BATCH=512 PART=gen, then
# SEED=1 TRAIN_S=680 PAUSE=400 LR=6e-4 BATCH=16 ANCHORS=64 PART=train and PART=resume.
# Stage 2 (2026-12-06, one H100): SEED=2 SLICE=1/4 GEN_S=240 GEN_BATCH=512 PART=gen, then
# INIT=/root/stash/files/qwen-draft.tar (a tar of the shipped draft folder, staged) SEED=2
# TRAIN_S=420 LR=5e-4 BATCH=16 ANCHORS=64 PART=train.
# Stage 3 (2026-12-06, one H100): SEED=3 SLICE=2/4 GEN_S=150 GEN_BATCH=512 PART=gen, then
# INIT=/root/stash/files/qwen-draft.tar (a tar of stage 2's bf16 draft folder, staged)
# SEED=3 TRAIN_S=380 LR=5e-4 BATCH=16 ANCHORS=64 PART=train.
# Stage 4 (2026-12-06, one H100): SEED=4 SLICE=3/4 GEN_S=200 GEN_BATCH=512 PART=gen, then
# INIT=/root/stash/files/qwen-draft.tar (a tar of stage 3's bf16 draft folder, staged)
# SEED=4 TRAIN_S=1000 PAUSE=500 LR=5e-4 BATCH=16 ANCHORS=64 PART=train and PART=resume
# (the resumed half trained with mask token 151935, not the init's 151664: PART=resume
# rebuilt the draft with the mask token picked there, since fixed; the model card of
# engine/drafts/qwen2.5-coder-1.5b-instruct-dflash says what came of each).
# Stage 5 (2026-12-06, one H100): no new answers; INIT=/root/stash/files/qwen-draft.tar (a tar
# of the shipped stage-4 folder) SEED=5 TRAIN_S=940 PAUSE=450 LR=5e-4 BATCH=16 ANCHORS=64
# PART=train, then PART=resume with TRAIN_S=965 (training's shuffling took seed 0 then: SEED
# reaches training since).
# Stage 6 (2026-12-07, one H100, 11 minutes of device time after six failed machine starts): no
# new answers; INIT=/root/stash/files/qwen-draft.tar (a tar of stage 5's 8-bit return) SEED=6
# TRAIN_S=370 TAIL_S=100 LR=5e-4 BATCH=16 ANCHORS=64 DRAFT_COMPUTE=bfloat16 PART=train: 2,517
# steps at a median 134 ms (stage 5 in float32: 154); held-out 2.86 -> 2.87 (walk 2.85 -> 2.90):
# the warm-up to 5e-4 knocked it to 2.43 first, as in stage 5 (2.59 -> 2.25). A short
# continuation wants a lower LR.
# Stage 7 (2026-12-07, one H100, after ten failed starts): SEED=7 SLICE=0/4 GEN_S=200
# GEN_BATCH=512 PART=gen (11,695 answers), then INIT (stage 5's 8-bit return) SEED=7 TRAIN_S=207
# TAIL_S=100 LR=2e-4 BATCH=16 ANCHORS=64 PART=train: 1,393 steps, held-out 2.86 -> 2.73 -> 2.86.
# Stage 9 (2026-12-07, one H100 after four failed starts): SEED=9 SLICE=2/4 GEN_S=320
# GEN_BATCH=512 PART=gen (15,540 answers), then INIT (a tar of the shipped stage-5 folder, 4-bit)
# SEED=9 TRAIN_S=450 TAIL_S=110 LR=3e-4 BATCH=16 ANCHORS=64 PART=train in one call: 2,897
# steps, held-out 2.84 -> 2.61 -> 2.93 (shipped, 4-bit).
set -uo pipefail
# WORK and MODEL: for a dry run on a CPU (tests/test_gpu_scripts.py, a tiny pair); a lent
# machine uses the defaults, where ../shared/gpu/stage leaves the files
WORK=${WORK:-/root}
export PYTHONUNBUFFERED=1 PYTHONPATH=. DFLASH_CACHE_DIR=$WORK/dfcache MLX_ENABLE_TF32=1
source scripts/gpu_kernel_cache.sh  # MLX's compiled CUDA kernels, kept and staged
files=$WORK/stash/files
model=${MODEL:-qwen2.5-coder-1.5b}
for gguf in $files/qwen2.5-coder-*.gguf; do  # once per machine: into the engine's cache
  [[ -f $gguf ]] || continue
  key=$(basename "$gguf" | sed -E 's/-instruct.*//')
  mkdir -p "$DFLASH_CACHE_DIR/$key" && mv "$gguf" "$DFLASH_CACHE_DIR/$key/"
done
if [[ -f $files/qwen-extras.tar ]]; then
  mkdir -p $WORK/evals && tar -xf $files/qwen-extras.tar -C $WORK && rm $files/qwen-extras.tar
fi
SEED=${SEED:-1}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
data_args() {
  local first=1
  for d in $files/gen-*.npz $WORK/gen-*/data.npz; do
    [[ -f $d ]] || continue
    if (( first )); then echo --data "$d"; first=0; else echo --extra-data "$d"; fi
  done
  for h in $files/heldout-*.npz $WORK/gen-*/heldout.npz; do
    [[ -f $h ]] && { echo --heldout "$h"; break; }
  done
}
shape=(--depth ${DEPTH:-2} --taps ${TAPS:-4} --intermediate-size ${WIDTH:-2048} --block-size 16)
# --profile-steps: the log's step_profile says where a step's time goes (target forward,
# draft layers, the vocabulary head, loss, backward), for choosing what to speed up next;
# DRAFT_COMPUTE (default bfloat16): the draft's matmuls in bf16, weights and gradients float32
# (stage 6 measured shorter steps at the same held-out curve: the model card); float32 as before
train_args=(--model $model --seed $SEED --dtype bfloat16 --max-len 1024 --batch ${BATCH:-16}
            --anchors ${ANCHORS:-64} --steps 100000 --val-every 400 --checkpoint-every 400
            --val-size 64 --head-dtype bfloat16 --save-dtype bfloat16 --no-progress
            --profile-steps ${PROFILE_STEPS:-10} --draft-compute-dtype ${DRAFT_COMPUTE:-bfloat16}
            ${DATA_WEIGHTS:+--data-weights "$DATA_WEIGHTS"})
pack() {  # the draft's config, ranking and log in a tar, its weights in 15 MB pieces (a file
  # that comes back is capped at 16 MB, all of them at 64 MB): weights over 56 MB come back
  # stored 8-bit (the bf16 ones stay in $WORK/draft for PART=more on this machine)
  local dir=${1:-$WORK/draft}
  if (( $(stat -c %s "$dir/model.safetensors") > 56000000 )); then
    rm -rf $WORK/draft-q8 && python3 scripts/quantize_draft.py "$dir" $WORK/draft-q8 --bits 8 \
      && dir=$WORK/draft-q8
  fi
  tar -C "$dir" -cf "$OUT/draft-meta.tar" config.json token_ranking.json train-log.json
  split -b 15M -d -a 2 "$dir/model.safetensors" "$OUT/draft-weights.part-"
  ls -l "$OUT"; sha256sum "$dir/model.safetensors"
}
case "${PART:-}" in
gen)
  out=$WORK/gen-$SEED; mkdir -p $out/phases
  answered=(); for d in $files/gen-*.npz; do [[ -f $d ]] && answered+=("$d"); done
  # the held-out answers are the same fixed prompts' every time (token for token since stage
  # 2): a staged set is that phase's, done, and its share of GEN_S goes to new answers
  for h in $files/heldout-*.npz; do
    [[ -f $h ]] && { cp "$h" $out/phases/data-heldout.npz; break; }
  done
  # about what GEN_S answers (stage 9: 52 first turns/s in the single phase, which has half
  # the time), with room: the source weights pick them (mix.sample_by_source), and none of
  # the host's encoding goes to prompts the budget never reaches; the other phases are sized
  # from it too (multi-turn 10%, Magpie 20%, templated 10%)
  num_prompts=${NUM_PROMPTS:-$(( ${GEN_S:-420} * 70 ))}
  timeout $(( ${GEN_S:-420} + 120 )) python3 -m engine.train "${shape[@]}" \
    --model $model --out $out --data $out/data.npz --collect-only --max-len 1024 --no-progress \
    --prompts-file $files/train_prompts.jsonl.gz --eval-dir $WORK/evals \
    --prompt-slice ${SLICE:-0/4} --prompt-seed $SEED --num-prompts $num_prompts \
    --gen-batch ${GEN_BATCH:-1024} --gen-dtype bfloat16 --gen-attention ${GEN_ATTENTION:-grouped} \
    --gen-back-to-back ${GEN_ARGS:-} ${answered[@]:+--skip-answered "${answered[@]}"} \
    ${GEN_SHARES:+--gen-shares "$GEN_SHARES"} --gen-seconds ${GEN_S:-420} 2>&1 | tail -n 30
  ls -la $out
  cp $out/data.npz "$OUT/gen-$SEED.npz"
  [[ -f $out/heldout.npz ]] && cp $out/heldout.npz "$OUT/heldout-$SEED.npz"
  save_kernel_cache ;;  # not after training: the draft's pieces need the room
train|resume)
  init=()
  [[ $PART == resume ]] && init=(--resume)
  if [[ -n ${INIT:-} && $PART == train ]]; then
    mkdir -p $WORK/init && tar -xf "$INIT" -C $WORK/init && init=(--init $WORK/init)
  fi
  timeout $(( ${TRAIN_S:-420} + ${TAIL_S:-120} )) python3 -m engine.train "${train_args[@]}" \
    "${shape[@]}" $(data_args) "${init[@]}" --lr ${LR:-6e-4} --out $WORK/draft \
    --state-dir $WORK/state --train-seconds ${TRAIN_S:-420} ${PAUSE:+--pause-after $PAUSE} \
    ${TRAIN_ARGS:-} 2>&1 \
    | grep -v "^ *$" | tail -n 40
  pack ;;
more)
  rm -rf $WORK/init && cp -r $WORK/draft $WORK/init
  timeout $(( ${MORE_S:-300} + ${TAIL_S:-120} )) python3 -m engine.train "${train_args[@]}" \
    "${shape[@]}" $(data_args) --init $WORK/init --lr ${LR_MORE:-3e-4} --out $WORK/draft \
    --state-dir $WORK/state2 --train-seconds ${MORE_S:-300} ${TRAIN_ARGS:-} 2>&1 \
    | grep -v "^ *$" | tail -n 40
  pack ;;
bench)
  for suite in ${SUITES:-humaneval gsm8k mt-bench}; do
    timeout ${BENCH_S:-560} python3 -m engine.cli benchmark --model $model ${DRAFT:+--draft $DRAFT} \
      --suite $suite ${LIMIT:+--limit $LIMIT} --max-tokens 256 --ar-draft qwen2.5-coder-0.5b \
      --json "$OUT/qwen2.5-coder-1.5b-$suite-gpu.json" 2>&1 | tail -n 12
  done
  save_kernel_cache ;;
probe)
  timeout ${BENCH_S:-560} python3 scripts/gpu_cycle_probe.py --parts host,cycle \
    --precisions checkpoint --model $model ${DRAFT:+--draft $DRAFT} --budget 400 \
    --out "$OUT/qwen2.5-coder-1.5b-cycle-probe-gpu.json" 2>&1 | tail -n 20 ;;
ab)
  for t in 0 ${TEMPS:-0.7}; do
    timeout ${BENCH_S:-280} python3 scripts/ab_bench.py --checkout before=${BEFORE:-.ab-before} \
      --checkout after=. --model $model ${DRAFT:+--draft $DRAFT} --suite humaneval \
      --suite gsm8k --suite mt-bench --limit ${LIMIT:-3} --no-baseline --temperature $t \
      --seed 0 --json "$OUT/qwen2.5-coder-1.5b-ab-t$t-gpu.json" 2>&1 | tail -n 8
  done
  save_kernel_cache ;;
*) echo "PART=gen|train|resume|more|bench|probe|ab" >&2; exit 2 ;;
esac
