#!/usr/bin/env bash
# The Qwen2.5-Coder-1.5B-Instruct draft on one lent GPU (H100 or H200), in parts, one device
# call each (a call lasts at most 10 minutes; the machine keeps /root between back-to-back
# calls). Staging first, here:
#   python scripts/qwen_coder_stage_files.py /tmp/qwen-stage   # GGUF + tokenizer + prompts
#   ../shared/gpu/stage /tmp/qwen-stage/*                     # then one call per part
# Parts (PART=...):
#   gen    the target (bf16) answers prompt slice SLICE (K/N) of train_prompts.jsonl.gz for
#          GEN_S seconds -> /root/gen-$SEED/data.npz, copied to $OUT/gen-$SEED.npz (keep it:
#          later sessions stage it again; the machine keeps nothing)
#   train  a draft (DEPTH layers, MLP WIDTH, TAPS taps; or INIT, a staged draft folder tar) on
#          every gen-*.npz staged or made on this machine, for TRAIN_S seconds -> /root/draft,
#          packed into $OUT (weights in parts under 16 MB)
#          PAUSE=S ends the call after S seconds; PART=resume continues the same schedule
#   more   /root/draft trained on with its optimizer state for MORE_S more seconds
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. DFLASH_CACHE_DIR=/root/dfcache MLX_ENABLE_TF32=1
files=/root/stash/files
gguf=/root/qwen/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
if [[ ! -f $gguf ]]; then  # once per machine: the GGUF and the tokenizer built on our side
  mkdir -p /root/qwen /root/evals
  mv $files/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf "$gguf"
  tar -xf $files/qwen-extras.tar -C /root/qwen
  mv /root/qwen/evals/* /root/evals/
  python3 scripts/stamp_tokenizer.py "$gguf"
fi
SEED=${SEED:-1}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
data_args() {
  local first=1
  for d in $files/gen-*.npz /root/gen-*/data.npz; do
    [[ -f $d ]] || continue
    if (( first )); then echo --data "$d"; first=0; else echo --extra-data "$d"; fi
  done
}
shape=(--depth ${DEPTH:-2} --taps ${TAPS:-4} --intermediate-size ${WIDTH:-2048} --block-size 16)
train_args=(--model "$gguf" --dtype bfloat16 --max-len 1024 --batch ${BATCH:-32}
            --anchors ${ANCHORS:-96} --steps 100000 --val-every 400 --checkpoint-every 400
            --val-size 64 --head-dtype bfloat16 --save-dtype bfloat16 --no-progress
            ${DATA_WEIGHTS:+--data-weights "$DATA_WEIGHTS"})
pack() {  # the draft's config, ranking and log in a tar, its weights in 15 MB pieces (a file
  # that comes back is capped at 16 MB): `cat draft-weights.part-* > model.safetensors`
  local dir=${1:-/root/draft}
  tar -C "$dir" -cf "$OUT/draft-meta.tar" config.json token_ranking.json train-log.json
  split -b 15M -d -a 2 "$dir/model.safetensors" "$OUT/draft-weights.part-"
}
case "${PART:-}" in
gen)
  out=/root/gen-$SEED; mkdir -p $out
  answered=(); for d in $files/gen-*.npz; do [[ -f $d ]] && answered+=("$d"); done
  timeout $(( ${GEN_S:-420} + 120 )) python3 -m engine.train --model "$gguf" "${shape[@]}" \
    --out $out --data $out/data.npz --collect-only --max-len 1024 --no-progress \
    --prompts-file $files/train_prompts.jsonl.gz --eval-dir /root/evals \
    --prompt-slice ${SLICE:-0/4} --prompt-seed $SEED --num-prompts ${NUM_PROMPTS:-129000} \
    --gen-batch ${GEN_BATCH:-1024} --gen-dtype bfloat16 --gen-attention ${GEN_ATTENTION:-grouped} \
    --gen-back-to-back ${GEN_ARGS:-} ${answered[@]:+--skip-answered "${answered[@]}"} \
    ${GEN_SHARES:+--gen-shares "$GEN_SHARES"} --gen-seconds ${GEN_S:-420} 2>&1 | tail -n 30
  ls -la $out
  cp $out/data.npz "$OUT/gen-$SEED.npz"
  [[ -f $out/heldout.npz ]] && cp $out/heldout.npz "$OUT/heldout-$SEED.npz" ;;
train|resume)
  init=()
  [[ $PART == resume ]] && init=(--resume)
  if [[ -n ${INIT:-} && $PART == train ]]; then
    mkdir -p /root/init && tar -xf "$INIT" -C /root/init && init=(--init /root/init)
  fi
  timeout $(( ${TRAIN_S:-420} + ${TAIL_S:-120} )) python3 -m engine.train "${train_args[@]}" \
    "${shape[@]}" $(data_args) "${init[@]}" --lr ${LR:-6e-4} --out /root/draft \
    --state-dir /root/state --train-seconds ${TRAIN_S:-420} ${PAUSE:+--pause-after $PAUSE} \
    ${TRAIN_ARGS:-} 2>&1 \
    | grep -v "^ *$" | tail -n 40
  pack ;;
more)
  rm -rf /root/init && cp -r /root/draft /root/init
  timeout $(( ${MORE_S:-300} + ${TAIL_S:-120} )) python3 -m engine.train "${train_args[@]}" \
    "${shape[@]}" $(data_args) --init /root/init --lr ${LR_MORE:-3e-4} --out /root/draft \
    --state-dir /root/state2 --train-seconds ${MORE_S:-300} ${TRAIN_ARGS:-} 2>&1 \
    | grep -v "^ *$" | tail -n 40
  pack ;;
*) echo "PART=gen|train|more" >&2; exit 2 ;;
esac
