"""Benchmark tooling behind `dflash benchmark`; the engine core never imports it.

- `compare`: a real target + draft pair, mlx-lm greedy vs DFlash on prompt suites.
- `synthetic`: random weights at a real model's shapes and an oracle draft (`--synthetic`).
- `suites`: the packaged evaluation prompts and prompt files.
- `timing`: one timed side (`Side`), the mlx-lm baseline runner and `first_mismatch`.
- `environment`: the machine, versions and BLAS facts every report carries.
- `metrics`: loop-aware draft metrics (pure Python).
"""
