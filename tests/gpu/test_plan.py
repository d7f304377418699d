"""The GPU planner (custom_ops/gpu/launch_plan.cu) on described devices: no GPU needed, only a build with CUDA
kernels (the planner lives there). Pins the plans the H200 measurements were made with, the fallbacks on other
devices and dtypes, split_k's scratch sizing, and the errors for overrides that cannot be honoured."""
from __future__ import annotations

import re

import pytest

from dot4attn import native

H200 = "sm=90a,sms=132,smem=232448"
H100_PLAIN_SM90 = "sm=90,sms=132,smem=232448"
A100 = "sm=80,sms=108,smem=166912"
MI300 = "hip,cus=304,warp=64,smem=65536"

pytestmark = pytest.mark.skipif(not native.has_gpu_entries(), reason="libdot4attn_ops was built without GPU kernels")


def plan(B, Hq, Hkv, Sq, Sk, D, device=H200, **kw):
    return native.gpu_plan(native.make_call(B, Hq, Hkv, Sq, Sk, D, **kw), device)


@pytest.mark.parametrize("sk,v_format,warps,splits", [(131072, "q4_0", 4, 33), (131072, "q8_0", 4, 33),
                                                      (131072, "float", 8, 33), (16384, "q4_0", 4, 32)])
def test_h200_split_k_decode(sk, v_format, warps, splits):
    """Long decode on the H200: split_k, tensor cores, TMA staging, 2 stages; float16 V's long walks take 8 warps."""
    p = plan(1, 32, 8, 1, sk, 128, v_format=v_format)
    assert (p["route"], p["kernel"], p["staging"], p["warps"], p["stages"], p["n_splits"]) == \
        ("split_k", "decode_mma", "tma", warps, 2, splits)
    assert p["scratch_bytes"] == splits * 32 * (128 + 2) * 4
    assert p["fallback"] == ""


def test_h200_short_decode_runs_as_a_cluster():
    p = plan(1, 32, 8, 1, 512, 128, v_format="q4_0")
    assert (p["route"], p["kernel"], p["staging"], p["cluster"], p["scratch_bytes"]) == \
        ("decode", "decode_mma", "cp_async", 4, 0)


def test_h200_d256_q4_0_stages_in_registers():
    p = plan(1, 24, 4, 1, 131072, 256, v_format="q4_0")
    assert (p["kernel"], p["staging"], p["stages"]) == ("decode_mma", "regs", 1)


@pytest.mark.parametrize("v_format", ["float", "q8_0", "q4_0"])
def test_h200_prefill_takes_wgmma(v_format):
    p = plan(1, 32, 8, 8192, 8192, 128, v_format=v_format)
    assert (p["route"], p["kernel"], p["tma"], p["wgmma"], p["min_blocks"], p["m_tiles"]) == \
        ("prefill", "prefill_mma", True, True, 3, 1)
    assert p["blocks"] == 1 * 8 * 4 * (8192 // 64)  # causal tiles: B x Hkv x group x Sq / 64


def test_plain_sm90_build_keeps_mma_sync_at_two_blocks():
    p = plan(1, 32, 8, 8192, 8192, 128, device=H100_PLAIN_SM90, v_format="float")
    assert (p["kernel"], p["tma"], p["wgmma"], p["min_blocks"]) == ("prefill_mma", True, False, 2)


def test_sm80_has_no_tma_and_no_cluster():
    assert plan(1, 32, 8, 1, 131072, 128, device=A100, v_format="q4_0")["staging"] == "regs"
    assert plan(1, 32, 8, 1, 131072, 128, device=A100, v_format="q8_0")["staging"] == "regs_v"
    assert plan(1, 32, 8, 1, 131072, 128, device=A100, v_format="float")["staging"] == "cp_async"
    p = plan(1, 32, 8, 1, 512, 128, device=A100, v_format="q4_0")
    assert (p["kernel"], p["cluster"]) == ("decode_mma", 0)
    assert plan(1, 32, 8, 8192, 8192, 128, device=A100)["tma"] is False


def test_hip_takes_the_simt_and_tile_kernels():
    p = plan(1, 32, 8, 1, 4096, 128, device=MI300, v_format="q4_0")
    assert p["kernel"] == "decode_simt" and "CUDA" in p["fallback"]
    assert p["threads"] == 64 * p["warps"]
    # The 64-row prefill tile needs more than a 64 KB LDS holds (73,984 bytes at D = 64, one stage): the plan
    # refuses it with the numbers before anything is launched. (A smaller row tile for such devices is open work.)
    with pytest.raises(native.NativeError, match="tile kernel for D=64 needs 73984 bytes of shared memory, the "
                                                 "device has 65536"):
        plan(1, 32, 8, 512, 512, 64, device=MI300)


def test_float32_keeps_float32_pv():
    p = plan(1, 8, 2, 1, 1024, 128, half=False, route="decode")
    assert p["kernel"] == "decode_simt" and "float32 T" in p["fallback"]
    p = plan(1, 8, 2, 300, 300, 128, half=False)
    assert p["kernel"] == "tile" and "float32 T" in p["fallback"]


def test_other_head_sizes_fall_back():
    assert plan(1, 8, 2, 1, 1024, 96, route="decode")["kernel"] == "decode_simt"
    p = plan(1, 8, 2, 300, 300, 96)
    assert p["kernel"] == "tile" and "D is not 64, 128 or 256" in p["fallback"]


def test_unaligned_pointers_fall_back():
    c = native.make_call(1, 8, 2, 1, 1024, 128, v_format="q8_0", route="decode")
    c.k = 8  # K rows not 16-byte aligned
    p = native.gpu_plan(c, H200)
    assert p["kernel"] == "tile" and "aligned" in p["fallback"]


def test_split_count_follows_the_device_and_valid_length():
    """(batch, KV head, split) items fill 2 waves over the multiprocessors, splits are whole 64-key tiles of at
    least 128 keys, and the count comes from the keys given (the valid length), never from a larger buffer."""
    assert plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", overrides="split_waves=1")["n_splits"] == 17
    assert plan(4, 32, 8, 1, 131072, 128, v_format="q4_0")["n_splits"] == 9
    short = plan(1, 32, 8, 1, 4096, 128, v_format="q4_0", route="split_k")
    assert short["n_splits"] == 32 and short["split_len"] == 128
    assert plan(1, 32, 8, 1, 64, 128, route="split_k")["n_splits"] == 1


def test_overrides_force_the_plan():
    assert plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", overrides="kernel=simt")["kernel"] == "decode_simt"
    assert plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", overrides="kernel=tile")["kernel"] == "tile"
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", overrides="staging=cp_async,warps=2")
    assert (p["staging"], p["warps"]) == ("cp_async", 2)
    assert plan(1, 32, 8, 1, 512, 128, v_format="q4_0", overrides="cluster=1")["cluster"] == 0
    p = plan(1, 32, 8, 8192, 8192, 128, overrides="tma=0")
    assert (p["tma"], p["wgmma"], p["min_blocks"]) == (False, False, 2)
    assert plan(1, 32, 8, 8192, 8192, 64, overrides="m_tiles=2")["m_tiles"] == 2


def test_plans_are_pure():
    a = [plan(2, 28, 4, 1, 32768, 128, v_format=v) for v in ("q8_0", "q4_0")]
    b = [plan(2, 28, 4, 1, 32768, 128, v_format=v) for v in ("q8_0", "q4_0")]
    assert a == b


@pytest.mark.parametrize("overrides,message", [
    ("kernel=foo", "'kernel': expected one of auto, tile, simt, mma, got 'foo'"),
    ("warps=99", r"'warps': expected an integer in \[0, 16\], got '99'"),
    ("split_pool=10", "unknown key 'split_pool'"),
])
def test_bad_overrides(overrides, message):
    with pytest.raises(native.NativeError, match=message):
        plan(1, 8, 2, 1, 1024, 128, overrides=overrides)


def test_forced_kernel_that_cannot_run():
    with pytest.raises(native.NativeError, match="kernel=mma cannot run this call: tensor-core decode: float32 T"):
        plan(1, 8, 2, 1, 1024, 128, half=False, route="decode", overrides="kernel=mma")
    with pytest.raises(native.NativeError, match="the prefill route has no SIMT kernel"):
        plan(1, 8, 2, 300, 300, 128, overrides="kernel=simt")


@pytest.mark.parametrize("shape,kw,message", [
    ((1, 8, 2, 1, 1024, 48), {}, r"D: expected a multiple of 32 in \[32, 256\], got 48"),
    ((1, 8, 3, 1, 1024, 64), {}, "Hq a multiple of Hkv"),
    ((1, 8, 2, 9, 1024, 64), {"route": "decode"}, "take Sq <= 8, got Sq=9"),
])
def test_bad_calls(shape, kw, message):
    with pytest.raises(native.NativeError, match=message):
        plan(*shape, **kw)


@pytest.mark.parametrize("device,message", [("sm=90a", "sms .* and smem are required"),
                                            ("sms=10,smem=100000", "give either sm=NN"),
                                            ("sm=90a,sms=132,smem=232448,foo=1", "unknown key 'foo'")])
def test_bad_device_facts(device, message):
    with pytest.raises(native.NativeError, match=message):
        plan(1, 8, 2, 1, 1024, 128, device=device)


def test_info_plan_prints_the_plan(capsys):
    from dot4attn.cli import main

    assert main(["info", "--plan", "1,32,8,1,131072,128,q4_0", "--gpu", H200]) == 0
    out = capsys.readouterr().out
    for word in ("split_k", "decode_mma", "tma", "33"):
        assert word in out, out


@pytest.mark.parametrize("argv,message", [
    (["--plan", "1,32,8,1,131072"], re.escape("expected B,Hq,Hkv,Sq,Sk,D[,float|q8_0|q4_0], got '1,32,8,1,131072'")),
    (["--plan", "1,32,8,1,1024,128,q5", "--gpu", H200], "got '1,32,8,1,1024,128,q5'"),
    (["--plan", "1,32,8,1,1024,128", "--gpu", "sm=90a"], "sms .* and smem are required"),
    (["--plan", "1,32,8,1,1024,128", "--gpu", H200, "--overrides", "kernel=mma", "--dtype", "float32"],
     "kernel=mma cannot run this call"),
])
def test_info_plan_bad_input(capsys, argv, message):
    from dot4attn.cli import main

    assert main(["info", *argv]) == 2
    assert re.search(message, capsys.readouterr().err)
