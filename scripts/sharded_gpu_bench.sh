#!/usr/bin/env bash
# The sharded-target SYNTHETIC benchmark (scripts/sharded_bench.py), one process per rank.
#   scripts/sharded_gpu_bench.sh gpu [OUT_DIR]  two local GPUs over NCCL: the Qwen3.5-27B shape
#                                               in bf16, oracle drafts at 4 and 8 tokens/cycle
#                                               (about 3 minutes on 2x H200)
#   scripts/sharded_gpu_bench.sh cpu [OUT_DIR]  two local CPU processes over MLX's ring backend,
#                                               a tiny shape of the same model in bf16 (a smoke
#                                               test of the script and of the oracle's
#                                               self-consistency; its timings mean nothing)
# OUT_DIR defaults to benchmarks/. Extra arguments after OUT_DIR go to sharded_bench.py.
# mlx.launch's own nccl mode starts ranks through ssh, so local ranks are started here by hand.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-gpu}
out=${2:-benchmarks}
shift $(( $# > 2 ? 2 : $# ))
export PYTHONUNBUFFERED=1
log=$(mktemp -d)
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")

case "$mode" in
gpu)
  json="$out/synthetic-qwen3.5-27b-sharded2-bf16-h200.json"
  args=(--backend nccl --synthetic qwen3.5-27b --dtype bfloat16 --ctx 1024 --max-tokens 256
        --tokens-per-cycle 4 8)
  # NVLS (NVLink SHARP) multicast stays off on the lent machines.
  env_for() { echo "MLX_RANK=$1 MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=$port" \
                   "CUDA_VISIBLE_DEVICES=$1 NCCL_NVLS_ENABLE=0"; }
  limit=420 ;;
cpu)
  json="$out/synthetic-qwen3.5-27b-sharded2-tiny-cpu.json"
  hostfile="$log/hosts.json"
  port2=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  echo "[[\"127.0.0.1:$port\"], [\"127.0.0.1:$port2\"]]" > "$hostfile"
  args=(--backend ring --synthetic qwen3.5-27b --layers 4 --ctx 64 --max-tokens 96
        --tokens-per-cycle 4 8 --iters 2 --dtype bfloat16
        --override hidden_size=64 --override intermediate_size=128 --override vocab_size=256
        --override linear_num_key_heads=2 --override linear_num_value_heads=4
        --override linear_key_head_dim=32 --override linear_value_head_dim=16
        --override num_attention_heads=4 --override num_key_value_heads=2 --override head_dim=16
        --override full_attention_interval=2
        --draft-override num_hidden_layers=1 --draft-override num_attention_heads=4
        --draft-override num_key_value_heads=2 --draft-override head_dim=16
        --draft-override intermediate_size=128)
  env_for() { echo "MLX_RANK=$1 MLX_HOSTFILE=$hostfile OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"; }
  limit=240 ;;
*) echo "usage: $0 gpu|cpu [OUT_DIR] [sharded_bench.py args]" >&2; exit 2 ;;
esac

pids=()
for rank in 0 1; do
  # shellcheck disable=SC2046  # env_for's words are separate VAR=value assignments
  env $(env_for $rank) timeout "$limit" python3 scripts/sharded_bench.py "${args[@]}" \
    --json "$json" "$@" > "$log/rank$rank.log" 2>&1 &
  pids+=($!)
done
status=0
for rank in 0 1; do
  wait "${pids[$rank]}" || { status=$?; echo "rank $rank exited $status" >&2; }
done
cat "$log/rank0.log"
if [ "$status" -ne 0 ]; then
  echo "== rank 1 log (tail)" >&2
  tail -30 "$log/rank1.log" >&2
fi
exit "$status"
