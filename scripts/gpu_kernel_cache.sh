# Sourced by the GPU scripts (benchmarks/run-gpu.sh, scripts/train_qwen_coder_gpu.sh). MLX
# compiles its CUDA kernels at run time (NVRTC to PTX, then the driver to machine code). On a
# fresh H200 (2026-12-07) a call spent about four of its eight minutes before its first suite
# (unpacking, the GGUF's setup and a 2-prompt warm-up run): a staged cache's first call says
# how much of that was compiling.
# Both compilers' caches live under /root/kernel-cache, which a machine keeps between calls.
# save_kernel_cache returns them as $OUT/kernel-cache.tar.gz; kept in git history and staged
# again (../shared/gpu/stage FILE ...), they fill a fresh machine's caches before its first run.
# MLX keys its cache by its version: a cache from another MLX is simply not used.
export MLX_PTX_CACHE_DIR=/root/kernel-cache/ptx CUDA_CACHE_PATH=/root/kernel-cache/nv
if [[ ! -d /root/kernel-cache && -f /root/stash/files/kernel-cache.tar.gz ]]; then
  tar -C /root -xzf /root/stash/files/kernel-cache.tar.gz \
    && echo "kernel cache staged: $(find /root/kernel-cache -type f | wc -l) files"
fi
save_kernel_cache() {
  [[ -d /root/kernel-cache ]] || return 0
  tar -C /root -czf "$OUT/kernel-cache.tar.gz" kernel-cache \
    && echo "kernel cache: $(find /root/kernel-cache -type f | wc -l) files," \
            "$(stat -c %s "$OUT/kernel-cache.tar.gz") bytes packed"
}
