# Sourced by the GPU scripts (benchmarks/run-gpu.sh, scripts/train_qwen_coder_gpu.sh). MLX
# compiles its CUDA kernels at run time (NVRTC to PTX, then the driver to machine code). On a
# fresh machine that is most of a first call: on an H100 (2026-12-08) each of three
# temperature-0.7 SmolLM2 suites, one process each, ran out of its 125 s before its JSON.
# Both compilers' caches live under /root/kernel-cache, which a machine keeps between calls.
# save_kernel_cache returns them xz-packed in 15 MB pieces, $OUT/kernel-cache.tar.xz.NN (a
# returned file is capped at 16 MB: the gzip of 112 files, 69 MB, never came back); without
# the driver's cache when the whole would pass 45 MB. Kept in git history, joined here
# (cat kernel-cache.tar.xz.* > kernel-cache.tar.xz) and staged again (../shared/gpu/stage
# FILE ...), they fill a fresh machine's caches before its first run. MLX keys its cache by
# its version: a cache from another MLX is simply not used.
WORK=${WORK:-/root}  # where the machine keeps things between calls
export MLX_PTX_CACHE_DIR=$WORK/kernel-cache/ptx CUDA_CACHE_PATH=$WORK/kernel-cache/nv
kernel_files() { find $WORK/kernel-cache -type f ! -name .staged | wc -l; }
if [[ ! -d $WORK/kernel-cache && -f $WORK/stash/files/kernel-cache.tar.xz ]]; then
  tar -C $WORK -xJf $WORK/stash/files/kernel-cache.tar.xz \
    && kernel_files > $WORK/kernel-cache/.staged \
    && echo "kernel cache staged: $(kernel_files) files"
fi
save_kernel_cache() {  # returned only where this machine compiled kernels the staged cache lacks
  [[ -d $WORK/kernel-cache ]] || return 0
  if [[ -f $WORK/kernel-cache/.staged && $(kernel_files) == $(cat $WORK/kernel-cache/.staged) ]]
  then
    echo "kernel cache: as staged ($(kernel_files) files), not returned"; return 0
  fi
  local packed=$WORK/kernel-cache.tar.xz
  tar -C $WORK -cf - kernel-cache | xz -T0 -6 > $packed
  if (( $(stat -c %s $packed) > 45000000 )); then
    tar -C $WORK -cf - kernel-cache/ptx | xz -T0 -6 > $packed
  fi
  rm -f "$OUT"/kernel-cache.tar.xz.*
  split -b 15M -d -a 2 $packed "$OUT/kernel-cache.tar.xz."
  echo "kernel cache: $(kernel_files) files," \
       "$(stat -c %s $packed) bytes packed in $(ls "$OUT"/kernel-cache.tar.xz.* | wc -l) pieces"
}
