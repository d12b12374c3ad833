"""Kernel selection, the native kernels' Python wrappers, and (where possible) the kernels.

CPU CI covers selection, launch plans and the wrappers (through an emulated kernel); the
CUDA source is compiled with nvcc when nvcc exists; exactness runs only on a CUDA device.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from script_modules import load_script

import engine.kernels as kernels
from engine import device
from engine.kernels import PORTABLE, cuda, metal, portable, select

ROOT = Path(__file__).resolve().parents[1]




@pytest.fixture
def pretend(monkeypatch):
    """Pretend `backend` is this machine's: present and current."""
    from engine import device

    def set_backend(backend):
        monkeypatch.setattr(device, "present", lambda b: b in ("cpu", backend))
        monkeypatch.setattr(device, "current", lambda: backend)

    monkeypatch.delenv("DFLASH_KERNELS", raising=False)
    return set_backend


# -- selection ----------------------------------------------------------------------------
def test_portable_on_cpu_and_when_asked(pretend):
    pretend("cpu")
    assert select() is PORTABLE and select("cpu") is PORTABLE
    assert select("cpu", mode="native") is PORTABLE  # no fused kernels for the CPU
    assert select(mode="portable") is PORTABLE
    with pytest.raises(ValueError, match="kernels mode 'fast'"):
        select(mode="fast")


def test_auto_picks_only_proven_kernels(pretend):
    pretend("cuda")
    chosen = select()
    assert chosen.name == "cuda" and chosen.verify is cuda.gated_delta_verify
    assert chosen.replay is cuda.tape_replay
    pretend("metal")
    assert select() is PORTABLE  # Metal is unproven: opt in with "native"
    chosen = select(mode="native")
    assert chosen.verify is metal.gated_delta_verify and chosen.replay is metal.tape_replay


def test_absent_backend_never_gets_fused_kernels(pretend):
    pretend("cpu")
    assert select("cuda") is PORTABLE and select("metal", mode="native") is PORTABLE


def test_env_is_the_default_mode_and_the_off_switch(pretend, monkeypatch):
    pretend("cuda")
    monkeypatch.setenv("DFLASH_KERNELS", "portable")
    assert select() is PORTABLE
    assert select(mode="auto").name == "cuda"  # an explicit option wins over the default
    monkeypatch.setenv("DFLASH_KERNELS", "")
    assert select().name == "cuda"


# -- launch plans -----------------------------------------------------------------------
def arrays(B=1, T=16, Hk=16, Hv=32, Dk=128, Dv=128, vec=False, dtype=mx.bfloat16):
    q = mx.zeros((B, T, Hk, Dk), dtype)
    v = mx.zeros((B, T, Hv, Dv), dtype)
    g = mx.zeros((B, T, Hv, Dk) if vec else (B, T, Hv))
    return q, v, g


def test_plan_for_qwen35_9b_layer():
    k, v, g = arrays()
    p = cuda.plan(k, v, g)
    assert (p.warps, p.rows_per_warp, p.cols_per_lane) == (32, 4, 4)
    assert p.grid == (32, 32, 32) and p.threadgroup == (32, 32, 1)  # one block per head
    assert p.grid[1] % p.threadgroup[1] == 0 and p.threadgroup[0] * p.threadgroup[1] <= 1024
    template = dict(p.template(k, v, g))
    assert template["A0"] == mx.bfloat16 and template["A2"] == mx.float32
    assert template["MT"] == 16 and "NT" not in template  # T is read at run time


def test_plan_odd_shapes_and_fallbacks():
    k, v, g = arrays(B=2, Hk=2, Hv=6, Dk=48, Dv=24, vec=True)
    p = cuda.plan(k, v, g)
    assert (p.warps, p.rows_per_warp, p.cols_per_lane, p.vec) == (8, 3, 2, True)
    assert p.grid == (32, 8, 12)
    assert cuda.plan(*arrays(T=17)) is None  # longer than the kernels' shared buffers
    assert cuda.plan(*arrays(Hk=3, Hv=8)) is None  # heads must group evenly
    assert cuda.plan(*arrays(Dk=512, vec=True)) is None  # over 48 KiB of shared memory


# -- the wrappers, through an emulated kernel ------------------------------------------------
def emulated_verify(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
    """What the verify kernel computes (portable math), checked against the declared outputs."""
    y, state, tape = portable.gated_delta_verify(*inputs)
    outs = [y, state, tape.delta]
    for o, shape, dtype in zip(outs, output_shapes, output_dtypes, strict=True):
        assert o.shape == tuple(shape) and o.dtype == dtype
    return outs


def emulated_replay(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
    """The replay kernel applies every step it is handed."""
    state, delta, k, g = inputs
    out = portable.tape_replay(state, portable.Tape(delta, k, g), delta.shape[1])
    assert out.shape == tuple(output_shapes[0])
    return [out]


def emulated_rollback(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
    """The fused rollback applies keep[0] of the whole tape's steps and takes the conv rows."""
    state, delta, k, g, keep, conv_in, qkv = inputs
    n = keep.item()
    outs = [portable.tape_replay(state, portable.Tape(delta, k, g), n),
            portable.conv_rows(conv_in, qkv, n)]
    for o, shape, dtype in zip(outs, output_shapes, output_dtypes, strict=True):
        assert o.shape == tuple(shape) and o.dtype == dtype
    return outs


@pytest.mark.parametrize("B,vec", [(1, False), (2, True)])
def test_wrappers_slice_and_shape_like_portable(B, vec):
    T, Hk, Hv, Dk, Dv = 6, 2, 4, 32, 8
    ks = mx.random.split(mx.random.key(0), 6)
    q, k = (mx.random.normal((B, T, Hk, Dk), key=kk) * 0.2 for kk in ks[:2])
    v = mx.random.normal((B, T, Hv, Dv), key=ks[2])
    g = mx.random.uniform(0.5, 1.0, (B, T, Hv, Dk) if vec else (B, T, Hv), key=ks[3])
    beta = mx.random.uniform(0, 1, (B, T, Hv), key=ks[4])
    state = mx.random.normal((B, Hv, Dv, Dk), key=ks[5])
    y, final, tape = cuda.run_verify(emulated_verify, q, k, v, g, beta, state)
    y_ref, final_ref, tape_ref = portable.gated_delta_verify(q, k, v, g, beta, state)
    assert mx.array_equal(y, y_ref) and mx.array_equal(final, final_ref)
    assert tape.k is k and tape.g is g and mx.array_equal(tape.delta, tape_ref.delta)
    assert cuda.run_replay(emulated_replay, state, tape, 0) is state
    for keep in range(1, T + 1):
        got = cuda.run_replay(emulated_replay, state, tape, keep)
        assert mx.array_equal(got, portable.tape_replay(state, tape_ref, keep))
    with pytest.raises(ValueError):
        cuda.run_replay(emulated_replay, state, tape, T + 1)
    conv, qkv = mx.random.normal((B, 3, 10), key=ks[0]), mx.random.normal((B, T, 10), key=ks[1])
    for keep in range(T + 1):
        got = cuda.run_rollback(emulated_rollback, state, tape, keep, conv, qkv)
        assert mx.array_equal(got[0], portable.tape_replay(state, tape_ref, keep))
        assert mx.array_equal(got[1], portable.conv_rows(conv, qkv, keep))
    with pytest.raises(ValueError):
        cuda.run_rollback(emulated_rollback, state, tape, T + 1, conv, qkv)


def test_wrapper_falls_back_to_portable_outside_the_plan():
    def never(**_):
        raise AssertionError("kernel launched for an unsupported shape")

    T = 17
    q = k = mx.ones((1, T, 1, 32)) * 0.1
    v, g, beta = mx.ones((1, T, 1, 8)), mx.full((1, T, 1), 0.9), mx.full((1, T, 1), 0.5)
    state = mx.zeros((1, 1, 8, 32))
    y, final, tape = cuda.run_verify(never, q, k, v, g, beta, state)
    assert mx.array_equal(final, portable.gated_delta_verify(q, k, v, g, beta, state)[1])
    assert mx.array_equal(cuda.run_replay(never, state, tape, T), final)
    conv, qkv = mx.zeros((1, 3, 4)), mx.ones((1, T, 4))
    rolled, rows = cuda.run_rollback(never, state, tape, T, conv, qkv)
    assert mx.array_equal(rolled, final) and mx.array_equal(rows, qkv[:, -3:])


# -- the CUDA source ------------------------------------------------------------------------
STUB_HEADER = """#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cstdint>
// Stand-in for MLX's Shape (cuda::std::array<int32_t, MAX_NDIM>) from device/utils.cuh.
struct Shape { int32_t d[10]; __device__ int32_t operator[](int i) const { return d[i]; } };
"""
CUDA_TYPES = {mx.float32: "float", mx.bfloat16: "__nv_bfloat16", mx.float16: "__half",
              mx.int32: "int32_t"}


def mlx_style_kernel(name: str, source: str, inputs: list[tuple[str, mx.Dtype]],
                     outputs: list[tuple[str, mx.Dtype]], template: list[tuple]) -> str:
    """The function MLX's cuda_kernel generates (custom_kernel.cpp build_kernel)."""
    params = []
    for n, dt in inputs:
        params.append(f"    const {CUDA_TYPES[dt]}* {n}")
        if f"{n}_shape" in source:
            params.append(f"    const __grid_constant__ Shape {n}_shape")
    params += [f"    {CUDA_TYPES[dt]}* {n}" for n, dt in outputs]
    consts = []
    for n, val in template:
        if isinstance(val, bool):
            consts.append(f"  constexpr bool {n} = {str(val).lower()};")
        elif isinstance(val, int):
            consts.append(f"  constexpr int {n} = {val};")
        else:
            consts.append(f"  using {n} = {CUDA_TYPES[val]};")
    return (f"__global__ void {name}(\n" + ",\n".join(params) + ") {\n" + "\n".join(consts)
            + "\n" + source + "\n}\n")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_source_compiles_with_nvcc(tmp_path):
    units = []
    for i, (dtype, vec, Dk, Dv) in enumerate([(mx.bfloat16, False, 128, 128),
                                               (mx.float32, True, 48, 24)]):
        q, v, g = arrays(B=1, Hk=2, Hv=4, Dk=Dk, Dv=Dv, vec=vec, dtype=dtype)
        state = mx.zeros((1, 4, Dv, Dk))
        p = cuda.plan(q, v, g)
        ins = [q, q, v, g, v[..., 0], state]
        units.append(mlx_style_kernel(
            f"verify{i}", cuda.VERIFY_SOURCE,
            [(n, a.dtype) for n, a in zip(cuda.VERIFY_INPUTS, ins)],
            list(zip(cuda.VERIFY_OUTPUTS, [dtype, mx.float32, mx.float32])),
            [("YT", dtype), *p.template(*ins)]))
        rins = [state, v.astype(mx.float32), q, g]
        units.append(mlx_style_kernel(
            f"replay{i}", cuda.REPLAY_SOURCE,
            [(n, a.dtype) for n, a in zip(cuda.REPLAY_INPUTS, rins)],
            [("state_out", mx.float32)], p.template(*rins)))
        conv = mx.zeros((1, 3, 8), dtype)
        bins = [*rins, mx.array([1], mx.int32), conv, mx.zeros((1, 5, 8), dtype)]
        units.append(mlx_style_kernel(
            f"rollback{i}", cuda.ROLLBACK_SOURCE,
            [(n, a.dtype) for n, a in zip(cuda.ROLLBACK_INPUTS, bins)],
            list(zip(cuda.ROLLBACK_OUTPUTS, [mx.float32, dtype])), p.template(*bins)))
    src = tmp_path / "k.cu"
    src.write_text(STUB_HEADER + "namespace mlx::core::cu {\n" + "".join(units) + "}\n")
    run = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", str(src), "-o", str(tmp_path / "k")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "error" not in run.stderr


# -- on the device ----------------------------------------------------------------------------
CUDA = device.present("cuda")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", [0, 4])
def test_fused_cuda_rollback_is_the_replay_kernel_and_conv_rows_bitwise(case):
    checks = load_script("gpu_checks")
    result = checks.check_rollback(cuda.fused_rollback, kernels.native_kernels("cuda"),
                                   checks.CASES[case])
    assert result["pass"], result


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", [0, 3, 4])
def test_cuda_kernels_match_portable(case):
    checks = load_script("gpu_checks")
    result = checks.check_case(kernels.native_kernels("cuda"), checks.CASES[case])
    assert result["pass"], result


@pytest.mark.skipif(not device.present("metal"), reason="needs Metal")
@pytest.mark.parametrize("case", [0, 4])
def test_metal_kernels_match_portable(case):
    checks = load_script("gpu_checks")
    result = checks.check_case(kernels.native_kernels("metal"), checks.CASES[case])
    assert result["pass"], result


def test_gpu_checks_harness_runs_on_cpu(tmp_path):
    checks = load_script("gpu_checks")
    good = checks.check_case(PORTABLE, checks.SELF_TEST_CASES[0])
    assert good["pass"] and good["replay_equals_kernel_rerun_bitwise"]

    def wrong_replay(state, tape, keep):  # drops the last kept step
        return portable.tape_replay(state, tape, keep - 1)

    bad = kernels.GatedDeltaKernels("bad", portable.gated_delta_verify, wrong_replay)
    result = checks.check_case(bad, checks.SELF_TEST_CASES[0])
    assert not result["pass"] and not result["replay_equals_kernel_rerun_bitwise"]
    rollback = checks.check_rollback(PORTABLE.roll_back, PORTABLE, checks.SELF_TEST_CASES[0])
    assert rollback["pass"] and rollback["rollbacks_checked"] == 2 + 6 + 17

    def late_rows(state, tape, keep, conv_state, qkv):  # the conv rows one step late
        return (portable.tape_replay(state, tape, keep),
                portable.conv_rows(conv_state, qkv, min(keep + 1, qkv.shape[1])))

    late = checks.check_rollback(late_rows, PORTABLE, checks.SELF_TEST_CASES[0])
    assert not late["pass"] and late["state_bitwise"] and not late["conv_bitwise"]
    crashed = checks.guarded(lambda: 1 / 0, "boom")
    assert not crashed["pass"] and "ZeroDivisionError" in crashed["error"]


def test_the_fused_cuda_rollback_is_on_unless_turned_off(monkeypatch):
    monkeypatch.delenv(kernels.FUSED_ROLLBACK_ENV, raising=False)
    assert kernels.native_kernels("cuda").rollback is cuda.fused_rollback
    assert kernels.native_kernels("metal").rollback is None  # CUDA's kernel only
    monkeypatch.setenv(kernels.FUSED_ROLLBACK_ENV, "0")
    assert kernels.native_kernels("cuda").rollback is None
    assert kernels.native_kernels("metal").rollback is None


def test_conv_rows_are_the_last_rows_of_the_kept_prefix():
    conv_state = mx.arange(6).reshape(1, 3, 2)  # rows 0..2 before the verify
    qkv = 100 + mx.arange(10).reshape(1, 5, 2)  # the verify's 5 steps
    assert portable.conv_rows(conv_state, qkv, 0).tolist() == conv_state.tolist()
    assert portable.conv_rows(conv_state, qkv, 2).tolist() == [[[4, 5], [100, 101], [102, 103]]]
    assert portable.conv_rows(conv_state, qkv, 5).tolist() == qkv[:, 2:].tolist()
