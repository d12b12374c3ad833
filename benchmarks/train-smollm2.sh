#!/usr/bin/env bash
# The SmolLM2-135M-Instruct draft training run on one H200 (after ../shared/gpu/stage with the
# GGUF): data generation + training in one command; results under $OUT.
#   first draft:  GEN_S=150 TRAIN_S=250 (from scratch, prompt seed 0)
#   second round: INIT=engine/drafts/smollm2-135m-instruct-dflash EXTRA=benchmarks/train-smollm2-data.npz
#                 PROMPT_SEED=1 NUM_PROMPTS=60000 GEN_BATCH=1024 GEN_S=200 TRAIN_S=540 LR=4e-4
#                 MLX_ENABLE_TF32=1 (TF32 matmuls for data and training; decoding stays fp32)
#   third round:  INIT=<round 2> EXTRA="benchmarks/train-smollm2-data.npz benchmarks/train-smollm2-data-round2.npz"
#                 PROMPT_SEED=2 NUM_PROMPTS=60000 GEN_BATCH=1024 GEN_S=180 TRAIN_S=420 LR=3e-4
#                 TRAIN_TIMEOUT=720 MLX_ENABLE_TF32=1 (prompts now batched by similar length,
#                 left-padded, so every category is answered, not just the big equal-length groups)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. DFLASH_CACHE_DIR=/root/dfcache
gguf=$DFLASH_CACHE_DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /root/state; mkdir -p "$(dirname "$gguf")" /root/state
cp /root/stash/files/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
if [[ -d .carry/tok ]]; then  # the tokenizer folder built here, stamped for this copy
  cp -r .carry/tok "$gguf.tokenizer"
  python3 -c "import json,os,sys; s=os.stat(sys.argv[1]); json.dump({'version': 1, 'size': s.st_size, 'mtime_ns': s.st_mtime_ns}, open(sys.argv[1]+'.tokenizer/source.json','w'))" "$gguf"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rm -f "$OUT/trained.done"  # written last, only by this run: safe to wait on
extra=(); [[ -n "${INIT:-}" ]] && extra+=(--init "$INIT")
for e in ${EXTRA:-}; do extra+=(--extra-data "$e"); done  # space-separated .npz files
timeout ${TRAIN_TIMEOUT:-470} python3 -m engine.train --model HuggingFaceTB/SmolLM2-135M-Instruct \
  --out /root/draft --state-dir /root/state --data /root/state/data.npz "${extra[@]}" \
  --log "$OUT/train-log.json" --depth 3 --taps 4 --intermediate-size 1024 --block-size 16 \
  --batch ${BATCH:-32} --anchors ${ANCHORS:-64} --lr ${LR:-6e-4} --steps 100000 \
  --max-len ${MAX_LEN:-256} --num-prompts ${NUM_PROMPTS:-12000} --prompt-seed ${PROMPT_SEED:-0} \
  --gen-batch ${GEN_BATCH:-512} --gen-seconds ${GEN_S:-150} \
  --train-seconds ${TRAIN_S:-250} --val-every 200 --checkpoint-every 200 --val-size 64 \
  --head-dtype bfloat16 --save-dtype bfloat16 --no-progress 2>&1 | tee "$OUT/train.log"
cp /root/state/data.npz "$OUT/data.npz" 2>/dev/null
# files come back only under 16 MB each: split the weights in two (merged again on return)
cp /root/draft/config.json "$OUT/config.json"
python3 -c "import mlx.core as mx; w = mx.load('/root/draft/model.safetensors'); k = sorted(w); \
[mx.save_safetensors(f'$OUT/weights-{i}.safetensors', {n: w[n] for n in k[i::2]}) for i in (0, 1)]"
# Real speculative decoding with the trained draft on fresh prompts (not the eval sets).
MLX_ENABLE_TF32=0 timeout ${CHECK_TIMEOUT:-50} python3 - /root/draft <<'PY' 2>&1 | tee "$OUT/check.log"
import sys
from pathlib import Path
from engine.loading import load_draft_folder, load_target
from engine.train.prompts import build_prompts
from engine.runtime import DFlashRuntime
model, tok, _ = load_target("HuggingFaceTB/SmolLM2-135M-Instruct", "float32")
rt = DFlashRuntime(model, tok, load_draft_folder(Path(sys.argv[1])))
for cat, msgs in build_prompts(400, seed=777)[::50]:
    spec = rt.generate(msgs, max_tokens=256)
    plain = rt.generate(msgs, max_tokens=256, speculative=False)
    tpc = sum(spec.cycle_tokens) / max(1, len(spec.cycle_tokens))
    print(f"{cat:10s} tokens {len(spec.tokens):3d} tokens/cycle {tpc:.2f} "
          f"lossless {spec.tokens == plain.tokens}", flush=True)
PY
ls -la "$OUT" /root/draft
touch "$OUT/trained.done"
