#!/usr/bin/env bash
# Everything measured on the H200 in one device call (after ../shared/gpu/stage with the
# SmolLM2 GGUF): kernel exactness checks, the SmolLM2 pair on the three suites, the synthetic
# Qwen3.5-9B shape. Results land in $OUT; eval prompts travel in .carry/data.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. DFLASH_CACHE_DIR=/root/dfcache DFLASH_EVAL_DATA=.carry/data
gguf=$DFLASH_CACHE_DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$(dirname "$gguf")"; cp /root/stash/files/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
# The GPU machine has transformers 4.x: bring the tokenizer folder built here, stamped anew.
cp -r .carry/tok "$gguf.tokenizer"
python3 -c "import json,os,sys; s=os.stat(sys.argv[1]); json.dump({'version': 1, 'size': s.st_size, 'mtime_ns': s.st_mtime_ns}, open(sys.argv[1]+'.tokenizer/source.json','w'))" "$gguf"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
step() { echo "== $*"; timeout "$1" "${@:2}" 2>&1 | tail -${TAIL:-25}; }
DRAFT=engine/drafts/smollm2-135m-instruct-dflash
if [[ -n "${TRAIN_S:-}" ]]; then  # fine-tune the shipped draft further on the shipped data
  step $((TRAIN_S + 90)) python3 -m engine.train --model HuggingFaceTB/SmolLM2-135M-Instruct \
    --out /root/draft2 --init "$DRAFT" --data benchmarks/train-smollm2-data.npz \
    --log "$OUT/train2-log.json" --block-size 16 --batch 32 --anchors 64 --lr ${LR:-3e-4} \
    --steps 100000 --train-seconds "$TRAIN_S" --val-every 250 --checkpoint-every 500 \
    --val-size 64 --head-dtype bfloat16 --save-dtype bfloat16 --no-progress
  if [[ -f /root/draft2/model.safetensors ]]; then
    DRAFT=/root/draft2; cp /root/draft2/config.json "$OUT/config.json"
    python3 -c "import mlx.core as mx; w = mx.load('/root/draft2/model.safetensors'); k = sorted(w); \
[mx.save_safetensors(f'$OUT/weights-{i}.safetensors', {n: w[n] for n in k[i::2]}) for i in (0, 1)]"
  fi
fi
[[ -z "${SKIP_CHECKS:-}" ]] && step 100 python3 scripts/gpu_checks.py --out "$OUT/gpu_checks.json"
N=${LIMIT:-10}
for suite in mt-bench humaneval gsm8k; do
  step 150 python3 -m engine.cli benchmark --suite "$suite" --limit "$N" --max-tokens 256 \
    --draft "$DRAFT" --json "$OUT/smollm2-$suite-h200.json"
done
[[ -n "${LONG:-}" ]] && for suite in humaneval gsm8k; do
  step 150 python3 -m engine.cli benchmark --suite "$suite" --limit 5 --max-tokens 512 \
    --draft "$DRAFT" --json "$OUT/smollm2-$suite-512-h200.json"
done
[[ -n "${SYNTH:-}" ]] && step 200 python3 -m engine.cli benchmark --synthetic qwen3.5-9b \
  --tokens-per-cycle 9.6 --max-tokens 256 --json "$OUT/synthetic-qwen3.5-9b-h200.json"
exit 0
