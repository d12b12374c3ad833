#!/usr/bin/env bash
# Stage 5 of the SmolLM2-135M-Instruct draft on an nvidia-h200-x2 machine: the target answers
# the real-prompt mix (engine/train/mix.py) on both GPUs, then two drafts train side by side.
# After `../shared/gpu/stage SmolLM2-135M-Instruct.Q4_1.gguf ../shared/data/train_prompts.jsonl.gz`
# (the GGUF from the engine's cache), one device call per part, back to back on one machine:
#   PART=gen    both GPUs answer disjoint prompt slices (K/2) for GEN_S seconds -> /root/gen{0,1}
#   PART=train  GPU 0 continues the shipped 3-layer draft, GPU 1 the same grown to DEPTH_B
#               layers (new layers start as identities), TRAIN_S seconds each -> /root/draft-{a,b}
#   PART=more   both continue from /root/draft-{a,b} at a lower LR for MORE_S seconds
# Results in $OUT: per variant a meta tar (config, token ranking, training log) and the
# weights in two halves (files come back under 16 MB each); the logs print to stdout.
# Eval prompts travel in .carry/data (decontamination), the tokenizer folder in .carry/tok.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. DFLASH_CACHE_DIR=/root/dfcache NCCL_NVLS_ENABLE=0
MODEL=HuggingFaceTB/SmolLM2-135M-Instruct
gguf=$DFLASH_CACHE_DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SHIPPED=engine/drafts/smollm2-135m-instruct-dflash
common=(--model "$MODEL" --depth 3 --taps 4 --intermediate-size 1024 --block-size 16
        --max-len 1024 --no-progress)
train_args=(--batch ${BATCH:-32} --anchors ${ANCHORS:-96} --steps 100000 --val-every 400
            --checkpoint-every 400 --val-size 64 --head-dtype bfloat16 --save-dtype bfloat16
            --heldout "$(ls /root/gen-*/heldout.npz | head -1)")
data_args() {  # every data run on this machine: the first as --data, the others as extras
  local first=1
  for d in /root/gen-*/data.npz; do
    if (( first )); then echo --data "$d"; first=0; else echo --extra-data "$d"; fi
  done
}

pack() {  # pack VARIANT FOLDER: meta tar + weights in two halves into $OUT
  tar -C "$2" -cf "$OUT/$1-meta.tar" config.json token_ranking.json train-log.json
  python3 -c "import mlx.core as mx, sys; w = mx.load(sys.argv[1] + '/model.safetensors'); \
k = sorted(w); [mx.save_safetensors(f'{sys.argv[2]}/{sys.argv[3]}-weights-{i}.safetensors', \
{n: w[n] for n in k[i::2]}) for i in (0, 1)]" "$2" "$OUT" "$1"
}

case "${PART:-}" in
gen)
  mkdir -p "$(dirname "$gguf")"; cp /root/stash/files/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
  cp -r .carry/tok "$gguf.tokenizer"
  python3 -c "import json,os,sys; s=os.stat(sys.argv[1]); json.dump({'version': 1, 'size': s.st_size, 'mtime_ns': s.st_mtime_ns}, open(sys.argv[1]+'.tokenizer/source.json','w'))" "$gguf"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  for r in 0 1; do
    out=/root/gen-${SEED:-5}-$r; mkdir -p $out/phases
    # the held-out answers are the same in every run: reuse an earlier run's
    cp /root/gen-*/phases/data-heldout.npz $out/phases/ 2>/dev/null
    MLX_ENABLE_TF32=${GEN_TF32:-0} CUDA_VISIBLE_DEVICES=$r timeout $(( ${GEN_S:-480} + 90 )) python3 -m engine.train "${common[@]}" \
      --out $out --data $out/data.npz --collect-only \
      --prompts-file /root/stash/files/train_prompts.jsonl.gz --eval-dir .carry/data \
      --prompt-slice $r/2 --prompt-seed $(( ${SEED:-5} * 10 + r )) --num-prompts ${NUM_PROMPTS:-60000} \
      --gen-batch ${GEN_BATCH:-1024} --gen-token-budget ${GEN_TOKENS:-3000000} \
      --gen-dtype ${GEN_DTYPE:-bfloat16} --gen-seconds ${GEN_S:-480} > $out.log 2>&1 &
  done
  wait
  tail -n 12 /root/gen-${SEED:-5}-*.log; ls -la /root/gen-*/ ;;
train)
  MLX_ENABLE_TF32=1 CUDA_VISIBLE_DEVICES=0 timeout $(( ${TRAIN_S:-450} + 120 )) python3 -m engine.train \
    "${common[@]}" "${train_args[@]}" $(data_args) --init "$SHIPPED" --lr ${LR:-3e-4} --out /root/draft-a \
    --state-dir /root/state-a --train-seconds ${TRAIN_S:-450} > /root/train-a.log 2>&1 &
  MLX_ENABLE_TF32=1 CUDA_VISIBLE_DEVICES=1 timeout $(( ${TRAIN_S:-450} + 120 )) python3 -m engine.train \
    "${common[@]}" "${train_args[@]}" $(data_args) --init "$SHIPPED" --depth ${DEPTH_B:-5} --lr ${LR:-3e-4} \
    --out /root/draft-b --state-dir /root/state-b --train-seconds ${TRAIN_S:-450} > /root/train-b.log 2>&1 &
  wait
  grep -v "^ *$" /root/train-a.log | tail -n 15; grep -v "^ *$" /root/train-b.log | tail -n 15
  pack a /root/draft-a; pack b /root/draft-b ;;
more)
  for v in a b; do
    cp -r /root/draft-$v /root/init-$v
    [[ $v == a ]] && g=0 || g=1
    MLX_ENABLE_TF32=1 CUDA_VISIBLE_DEVICES=$g timeout $(( ${MORE_S:-300} + 100 )) python3 -m engine.train \
      "${common[@]}" "${train_args[@]}" $(data_args) --init /root/init-$v --depth $([[ $v == a ]] && echo 3 || echo ${DEPTH_B:-5}) \
      --lr ${LR_MORE:-1.5e-4} --out /root/draft-$v --state-dir /root/state2-$v \
      --train-seconds ${MORE_S:-300} > /root/more-$v.log 2>&1 &
  done
  wait
  grep -v "^ *$" /root/more-a.log | tail -n 12; grep -v "^ *$" /root/more-b.log | tail -n 12
  pack a /root/draft-a; pack b /root/draft-b ;;
*) echo "PART=gen|train|more" >&2; exit 2 ;;
esac
exit 0
