"""The GPU planner (custom_ops/gpu/launch_plan.cu) on described devices: no GPU needed, only a build with CUDA
kernels (the planner lives there). Pins the plans the H200 measurements were made with, the fallbacks on other
devices and dtypes, split_k's scratch sizing, and the errors for overrides that cannot be honoured."""
from __future__ import annotations

import re

import numpy as np
import pytest

from dot4attn import formats, native

from gpu_support import AMD_DEVICES, AMD_LDS, packed_layout, q6_d_message

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


@pytest.mark.parametrize("B,Hkv,sk,splits,unbalanced", [
    (4, 8, 131072, 8, 9),    # 32 (b, h) x 9 = 288 blocks: 3 on some of 132 SMs; x 8 = 256: 2 on nearly all
    (16, 4, 32768, 4, 5),    # the e2e 7B shape at batch 16: 320 -> 256
    (16, 4, 16384, 4, 5),
    (7, 4, 131072, 9, 10),   # 280 -> 252
    (1, 8, 131072, 33, 33),  # 264 blocks: 2 on every SM already
    (1, 4, 131072, 64, 64),  # 66 splits round to 64 of 2048 keys: 256 blocks
])
def test_split_count_spreads_the_blocks_evenly(B, Hkv, sk, splits, unbalanced):
    """balanced_splits: a long decode streams at the pace of its most loaded multiprocessor, so of the two-wave count
    and up to a tenth fewer the planner takes the one whose blocks spread most evenly over the 132 SMs (never more
    splits); split_waves (an override) keeps the count unbalanced."""
    p = plan(B, 7 * Hkv, Hkv, 1, sk, 128, v_format="q4_0")
    assert (p["route"], p["n_splits"]) == ("split_k", splits)
    assert p["scratch_bytes"] == splits * B * 7 * Hkv * (128 + 2) * 4
    assert plan(B, 7 * Hkv, Hkv, 1, sk, 128, v_format="q4_0", overrides="split_waves=2")["n_splits"] == unbalanced


def test_h200_short_decode_runs_as_a_cluster():
    p = plan(1, 32, 8, 1, 512, 128, v_format="q4_0")
    assert (p["route"], p["kernel"], p["staging"], p["cluster"], p["scratch_bytes"]) == \
        ("decode", "decode_mma", "cp_async", 4, 0)


def test_h200_d256_q4_0_streams_by_tma_in_3_warps():
    """q4_0 at D = 256: long split walks take TMA in 3-warp blocks (two per multiprocessor); short walks, the
    unsplit decode, forced warps and devices without TMA keep the 4-warp plans."""
    p = plan(1, 24, 4, 1, 131072, 256, v_format="q4_0")
    assert (p["route"], p["kernel"], p["staging"], p["warps"], p["stages"], p["n_splits"]) == \
        ("split_k", "decode_mma", "tma", 3, 2, 64)
    p16k = plan(1, 24, 4, 1, 16384, 256, v_format="q4_0")  # 8 chunks per split: 3 per warp in 3 warps
    assert (p16k["staging"], p16k["warps"]) == ("tma", 3), p16k
    short = plan(1, 24, 4, 1, 4096, 256, v_format="q4_0")
    assert (short["staging"], short["warps"]) == ("cp_async", 4), short
    forced = plan(1, 24, 4, 1, 131072, 256, v_format="q4_0", overrides="warps=4")
    assert (forced["staging"], forced["warps"], forced["stages"]) == ("regs", 4, 1), forced
    a100 = plan(1, 24, 4, 1, 131072, 256, v_format="q4_0", device=A100)
    assert (a100["staging"], a100["warps"]) == ("regs", 4), a100
    unsplit = plan(1, 24, 4, 1, 131072, 256, v_format="q4_0", route="decode")
    assert unsplit["staging"] == "regs" and unsplit["warps"] != 3, unsplit
    q8 = plan(1, 24, 4, 1, 131072, 256, v_format="q8_0")
    assert (q8["staging"], q8["warps"]) == ("tma", 4), q8


@pytest.mark.parametrize("v_format", ["float", "q8_0", "q4_0"])
def test_h200_prefill_takes_wgmma(v_format):
    """A long prefill at D = 128 on the H200: TMA and wgmma; 3 blocks per SM of 64 rows below 2048 keys, from there
    (and by default) the warp-specialized kernel, one persistent block per SM over 128-row items."""
    p = plan(1, 32, 8, 1024, 1024, 128, v_format=v_format)
    assert (p["route"], p["kernel"], p["tma"], p["wgmma"], p["min_blocks"], p["m_tiles"], p["ws"]) == \
        ("prefill", "prefill_mma", True, True, 3, 1, False)
    assert p["blocks"] == 1 * 8 * 4 * (1024 // 64)  # causal tiles: B x Hkv x group x Sq / 64
    for sk in (2048, 4096, 8192):
        w = plan(1, 32, 8, sk, sk, 128, v_format=v_format)
        assert (w["kernel"], w["tma"], w["wgmma"], w["min_blocks"], w["ws"], w["persistent"]) == \
            ("prefill_mma", True, True, 1, True, True), w
        assert (w["items"], w["blocks"]) == (1 * 8 * 4 * (sk // 128), 132), w


@pytest.mark.parametrize("v_format,sq,sk,overrides,scan", [
    ("float", 2048, 2048, "", True), ("float", 8192, 8192, "", True),      # long float16-V prefills: one V scan
    ("float", 512, 512, "", False), ("float", 4096, 1024, "", False),      # short key walks: each tile checks V
    ("float", 512, 512, "v_scan=1", True), ("float", 8192, 8192, "v_scan=0", False),
    # q8_0 / q4_0 converted by the prefill itself: checked while converted
    ("q8_0", 8192, 8192, "v_dequant=0", False), ("q4_0", 8192, 8192, "v_scan=1,v_dequant=0", False),
    ("float", 8192, 8192, "wgmma=0", False), ("float", 8192, 8192, "min_blocks=2", False)])  # no unchecked instance
def test_prefill_v_scan_and_its_scratch(v_format, sq, sk, overrides, scan):
    """The V scan's flags follow K's float16 copy where the f16 Q.K runs (the long float16-V calls at 3 blocks per SM;
    test_k_dequant_* below; the warp-specialized kernel's, which scans V after it, add as many zero flags) and stand
    alone otherwise."""
    p = plan(2, 32, 8, sq, sk, 128, v_format=v_format, overrides=overrides)
    k16 = v_format == "float" and sk >= 2048 and overrides in ("", "v_scan=0")
    assert p["k_dequant"] == k16, p
    k_copy = 2 * 8 * sk * 128 * 2 + 256 if k16 else 0
    flags = (2 * 8 * 4 if scan else 0) * (2 if p.get("late_scan") else 1)
    assert p.get("late_scan", False) == (p["ws"] and v_format == "float"), p
    assert (p["kernel"], p["v_scan"], p["scratch_bytes"]) == ("prefill_mma", scan, k_copy + flags)


@pytest.mark.parametrize("v_format", ["q8_0", "q4_0"])
def test_long_quantized_v_prefill_dequantizes_v_once(v_format):
    """A long q8_0 / q4_0 V prefill on the H200 converts V once into float16 rows (v_dequant.cuh) and runs the
    float16-V wgmma instance on them, with its V scan: scratch = the float16 copy (rows in the K layout) + the
    flags. Short walks, v_dequant=0, and devices without that instance keep the kernel's own conversion; v_dequant=1
    takes the copy wherever that instance runs, short walks too."""
    p = plan(2, 32, 8, 8192, 8192, 128, v_format=v_format)  # the warp-specialized kernel's plan (ws) by default
    assert (p["kernel"], p["wgmma"], p["min_blocks"], p["v_dequant"], p["v_scan"], p["ws"]) == \
        ("prefill_mma", True, 1, True, True, True), p
    assert p["k_dequant"] and p["scratch_bytes"] == 2 * (2 * 8 * 8192 * 128 * 2) + 256 + 2 * 8 * 4  # V, K copies
    cache = plan(1, 28, 4, 16384, 131072, 128, v_format=v_format, overrides="k_dequant=0",
                 kv_layout=packed_layout(128, v_format, 140000))  # a cache: the copy spans its rows per head
    assert cache["v_dequant"] and cache["scratch_bytes"] == 4 * 140000 * 128 * 2 + 4 * 4, cache
    for off in (plan(2, 32, 8, 8192, 8192, 128, v_format=v_format, overrides="v_dequant=0"),
                plan(1, 32, 8, 512, 512, 128, v_format=v_format),
                plan(1, 32, 8, 8192, 8192, 128, device=H100_PLAIN_SM90, v_format=v_format),
                plan(1, 32, 8, 8192, 8192, 256, v_format=v_format, overrides="k_dequant=0")):
        assert not off["v_dequant"] and off["scratch_bytes"] == 0, off
    # D = 256: the copy feeds the Q-in-shared-memory f16 Q.K kernel (prefill_wg.cuh); not where that kernel does not run
    d256 = plan(1, 32, 8, 8192, 8192, 256, v_format=v_format)
    assert (d256["v_dequant"], d256["k_dequant"], d256["rows_per_block"]) == (True, True, 128), d256
    assert plan(1, 32, 8, 512, 512, 128, v_format=v_format, overrides="v_dequant=1")["v_dequant"]
    assert not plan(1, 32, 8, 8192, 8192, 128, device=H100_PLAIN_SM90, v_format=v_format,
                    overrides="v_dequant=1")["v_dequant"]
    assert not plan(1, 32, 8, 8192, 8192, 128, v_format="float")["v_dequant"]


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
    # The 64-row prefill block of 64-key tiles needs more than a 64 KB LDS (73,984 bytes at D = 64, one stage): the
    # tile kernel takes 32-key tiles there, 64 rows at D <= 128 and 32 at D = 256.
    for D, rows in ((64, 64), (128, 64), (256, 32)):
        p = plan(1, 32, 8, 512, 512, D, device=MI300)
        assert (p["kernel"], p["rows_per_block"], p["key_tile"], p["threads"], p["warps"]) == ("tile", rows, 32, 256, 4)
        assert p["smem_bytes"] <= 65536, p
    # with room for it (the H200's 227 KB), the 64-key tile as before
    p = plan(1, 32, 8, 512, 512, 128, device=H200, half=False)
    assert (p["kernel"], p["rows_per_block"], p["key_tile"], p["stages"]) == ("tile", 64, 64, 2)


def test_tile_kernel_that_fits_nowhere_says_why():
    with pytest.raises(native.NativeError, match="the tile kernel for D=256 needs 61312 bytes of shared memory "
                                                 r"\(32 rows, 32-key tiles, one stage\), the device has 49152"):
        plan(1, 32, 8, 512, 512, 256, device="hip,cus=304,warp=64,smem=49152", half=False, v_format="float")


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
    assert plan(4, 32, 8, 1, 131072, 128, v_format="q4_0", overrides="split_waves=2")["n_splits"] == 9
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
    ("v_scan=2", r"'v_scan': expected an integer in \[0, 1\], got '2'"),
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


def test_info_plan_takes_q6_0(capsys):
    from dot4attn.cli import main

    assert main(["info", "--plan", "1,32,8,1,131072,128,q6_0", "--gpu", H200]) == 0
    out = capsys.readouterr().out
    for word in ("split_k", "decode_mma", "cp_async", "V=q6_0"):
        assert word in out, out


@pytest.mark.parametrize("argv,message", [
    (["--plan", "1,32,8,1,131072"],
     re.escape("expected B,Hq,Hkv,Sq,Sk,D[,float|q8_0|q4_0|q6_0] (integers >= 1), got '1,32,8,1,131072'")),
    (["--plan", "1,32,8,1,1024,128,q5", "--gpu", H200], "got '1,32,8,1,1024,128,q5'"),
    (["--plan", "1,32,8,1,1024,96,q6_0", "--gpu", H200], re.escape(q6_d_message(96))),
    (["--plan", "1,32,8,1,1024,128", "--gpu", "sm=90a"], "sms .* and smem are required"),
    (["--plan", "1,32,8,1,1024,128", "--gpu", H200, "--overrides", "kernel=mma", "--dtype", "float32"],
     "kernel=mma cannot run this call"),
])
def test_info_plan_bad_input(capsys, argv, message):
    from dot4attn.cli import main

    assert main(["info", *argv]) == 2
    assert re.search(message, capsys.readouterr().err)


# ---- q6_0 V ----------------------------------------------------------------------------------------------------------

Q6_NO_COPY = "tensor-core prefill: q6_0 V runs on its float16 copy (v_dequant=0)"
Q6_NO_TMA = "tensor-core decode: q6_0 V has no TMA staging, cp_async staging"


@pytest.mark.parametrize("device", [H200, A100], ids=["sm90a", "sm80"])
def test_q6_0_prefill_runs_on_its_float16_copy(device):
    """q6_0 V has no tensor-core prefill of its own: on CUDA sm_80+ with float16 T and D 64 / 128 / 256 the prefill
    converts V once into float16 rows (v_dequant) and runs the float16-V instance, at every length and on every
    instance (wgmma or not), where q8_0 / q4_0 take the copy only for long wgmma calls. Scratch: the copy (rows in
    the K layout), then the V scan's flags where the scan runs."""
    wgmma = device == H200
    p = plan(2, 32, 8, 8192, 8192, 128, device=device, v_format="q6_0")
    assert (p["route"], p["kernel"], p["v_dequant"], p["wgmma"], p["tma"]) == \
        ("prefill", "prefill_mma", True, wgmma, wgmma), p
    assert p["fallback"] == "" and p["v_scan"] == wgmma, p
    assert p["k_dequant"] == wgmma, p  # and the f16 Q.K on K's float16 copy where that instance runs
    k_copy = 2 * 8 * 8192 * 128 * 2 + 256 if wgmma else 0
    assert p["scratch_bytes"] == 2 * 8 * 8192 * 128 * 2 + k_copy + (2 * 8 * 4 if wgmma else 0), p
    short = plan(1, 32, 8, 512, 512, 128, device=device, v_format="q6_0")
    assert (short["kernel"], short["v_dequant"], short["v_scan"]) == ("prefill_mma", True, False), short
    assert short["scratch_bytes"] == 8 * 512 * 128 * 2, short
    for D in (64, 256):
        p = plan(1, 8, 2, 300, 300, D, device=device, v_format="q6_0")
        assert (p["kernel"], p["v_dequant"]) == ("prefill_mma", True), p
    cache = plan(1, 28, 4, 2048, 16384, 128, device=device, v_format="q6_0",
                 kv_layout=packed_layout(128, "q6_0", 20000))  # a cache: the copy spans its rows per head
    assert cache["v_dequant"] and cache["scratch_bytes"] >= 4 * 20000 * 128 * 2, cache


@pytest.mark.parametrize("kw,reason", [
    ({"overrides": "v_dequant=0"}, Q6_NO_COPY),
    ({"half": False}, "float32 T"),
    ({"D": 192}, "D is not 64, 128 or 256"),
    ({"device": MI300}, "CUDA sm_80+"),
])
def test_q6_0_prefill_falls_back_to_the_tile_kernel(kw, reason):
    """Without its float16 copy (v_dequant=0), with float32 T, at D = 192 and on HIP, q6_0 V prefills on the tile
    kernel, and the plan says why."""
    kw = dict(kw)
    D = kw.pop("D", 128)
    p = plan(1, 32, 8, 2048, 2048, D, v_format="q6_0", **kw)
    assert (p["route"], p["kernel"], p["scratch_bytes"]) == ("prefill", "tile", 0), p
    assert reason in p["fallback"], p


@pytest.mark.parametrize("device", [H200, A100], ids=["sm90a", "sm80"])
def test_q6_0_decode_stages_by_cp_async(device):
    """q6_0 V on the tensor-core decode: cp.async staging at every length (no TMA, no register staging), the splits
    of the other formats; a forced TMA staging says it has none; the short decode still runs as a cluster on
    sm_90."""
    p = plan(1, 32, 8, 1, 131072, 128, device=device, v_format="q6_0")
    q4 = plan(1, 32, 8, 1, 131072, 128, device=device, v_format="q4_0")
    assert (p["route"], p["kernel"], p["staging"], p["fallback"]) == ("split_k", "decode_mma", "cp_async", ""), p
    assert p["n_splits"] == q4["n_splits"] and p["scratch_bytes"] == q4["scratch_bytes"], (p, q4)
    for D in (64, 256):
        p = plan(1, 32, 8, 1, 65536, D, device=device, v_format="q6_0")
        assert (p["kernel"], p["staging"]) == ("decode_mma", "cp_async"), p
    p = plan(1, 32, 8, 1, 131072, 128, device=device, v_format="q6_0", overrides="staging=tma")
    assert (p["kernel"], p["staging"], p["fallback"]) == ("decode_mma", "cp_async", Q6_NO_TMA), p
    p = plan(1, 32, 8, 1, 131072, 128, device=device, v_format="q6_0", overrides="staging=regs")
    assert (p["kernel"], p["staging"]) == ("decode_mma", "cp_async"), p
    short = plan(1, 32, 8, 1, 512, 128, device=device, v_format="q6_0")
    assert (short["route"], short["kernel"], short["staging"]) == ("decode", "decode_mma", "cp_async"), short
    assert (short["cluster"] > 0) == (device == H200), short


def test_q6_0_packed_cache_rows_take_bulk_staging_on_sm90():
    """A packed cache's q6_0 rows (K rows of D + 16 bytes, V rows of 3D/4 + 16, the scales after each payload: the
    cache op's rows layout) take the bulk copies on sm_90, in two stages, with the dense plan's warps and splits;
    the pair layout's V rows (D bytes, K's scales in them) and an A100 keep cp.async."""
    dense = plan(1, 32, 8, 1, 131072, 128, v_format="q6_0")
    rows = packed_layout(128, "q6_0", 262144)
    assert (rows["v_stride"], rows["vs_stride"]) == (112, 56)
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q6_0", kv_layout=rows)
    assert (p["route"], p["kernel"], p["staging"], p["stages"], p["fallback"]) == \
        ("split_k", "decode_mma", "bulk", 2, ""), p
    assert math_of(p) == math_of(dense), (p, dense)
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q6_0", kv_layout=rows, overrides="staging=tma")
    assert (p["staging"], p["fallback"]) == ("cp_async", Q6_NO_TMA), p
    pair = {"kv_rows": 262144, "k_stride": 128, "ks_stride": 64, "v_stride": 128, "vs_stride": 64}
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q6_0", kv_layout=pair)
    assert (p["kernel"], p["staging"]) == ("decode_mma", "cp_async"), p
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q6_0", kv_layout=rows, device=A100)
    assert (p["kernel"], p["staging"]) == ("decode_mma", "cp_async"), p


@pytest.mark.parametrize("kw,kernel,reason", [
    ({"D": 192}, "decode_simt", "D is not 64, 128 or 256"),
    ({"half": False}, "decode_simt", "float32 T"),
    ({"device": MI300}, "decode_simt", "CUDA sm_80+"),
])
def test_q6_0_decode_elsewhere_takes_the_simt_kernel(kw, kernel, reason):
    kw = dict(kw)
    D = kw.pop("D", 128)
    for route in ("decode", "split_k"):
        p = plan(1, 32, 8, 1, 8192, D, v_format="q6_0", route=route, **kw)
        assert (p["route"], p["kernel"]) == (route, kernel) and reason in p["fallback"], p


@pytest.mark.parametrize("D", [32, 96, 160, 224])
@pytest.mark.parametrize("device", [H200, A100, MI300], ids=["sm90a", "sm80", "mi300"])
def test_q6_0_needs_d_a_multiple_of_64_on_the_gpu(D, device):
    """q6_0 V rows of 3D/4 bytes move in 16-byte pieces: the GPU planner refuses other head sizes, on every route
    and device, naming D and the CPU execution provider (which takes every D)."""
    for Sq, route in ((1, "decode"), (1, "split_k"), (300, "prefill")):
        with pytest.raises(native.NativeError, match=re.escape(q6_d_message(D))):
            plan(1, 8, 2, Sq, 1024, D, device=device, v_format="q6_0", route=route)


# ---- strided K / V rows (a packed cache) ----------------------------------------------------------------------------

def without_strided(p):
    """The plan less what follows the row layout rather than the math: `strided`, and a dequantized V's or K's float16
    copy (v_dequant, k_dequant), which spans the layout's rows per head, so its scratch size."""
    q = dict(p)
    q.pop("strided")
    if q.get("v_dequant") or q.get("k_dequant"):
        q.pop("scratch_bytes")
    return q


# Plan keys that do not change the output's bits: how K / V reach shared memory (and why), not who sums what.
STAGING_KEYS = ("staging", "stages", "smem_bytes", "fallback", "strided")


def math_of(p):
    """The parts of a plan that decide the output bits. A dequantized V's or K's float16 copy (v_dequant, k_dequant)
    spans the rows per head of the call's layout, so its scratch size follows the layout, not the math."""
    return {k: v for k, v in p.items()
            if k not in STAGING_KEYS and not (k == "scratch_bytes" and (p.get("v_dequant") or p.get("k_dequant")))}


STRIDED_SHAPES = [  # (B, Hq, Hkv, Sq, Sk, D, v_format, device): every kernel family the planner picks on dense rows
    (1, 32, 8, 1, 131072, 128, "q4_0", H200), (1, 32, 8, 1, 131072, 128, "q8_0", H200),
    (1, 32, 8, 1, 131072, 128, "float", H200), (1, 24, 4, 1, 131072, 256, "q4_0", H200),
    (1, 32, 8, 1, 512, 128, "q4_0", H200), (2, 8, 2, 1, 4096, 64, "q8_0", H200),
    (1, 32, 8, 8192, 8192, 128, "float", H200), (1, 32, 8, 8192, 8192, 128, "q8_0", H200),
    (1, 32, 8, 2048, 2048, 64, "q4_0", H200), (1, 8, 2, 1000, 1000, 256, "q4_0", H200),
    (1, 32, 8, 1, 131072, 128, "q4_0", A100), (1, 32, 8, 1, 131072, 128, "q8_0", A100),
    (1, 32, 8, 8192, 8192, 128, "q8_0", A100), (1, 32, 8, 1, 4096, 128, "q4_0", MI300),
    (1, 32, 8, 2048, 2048, 128, "q4_0", MI300), (1, 8, 2, 1000, 1000, 256, "float", MI300),
    (1, 8, 2, 1, 1024, 96, "q8_0", H200), (1, 8, 2, 300, 300, 96, "q4_0", H200),
    (1, 32, 8, 1, 131072, 128, "q6_0", H200), (1, 32, 8, 1, 512, 128, "q6_0", H200),
    (1, 24, 4, 1, 70000, 256, "q6_0", H200), (1, 32, 8, 8192, 8192, 128, "q6_0", H200),
    (1, 8, 2, 1000, 1000, 256, "q6_0", H200), (1, 32, 8, 1, 131072, 128, "q6_0", A100),
    (1, 32, 8, 8192, 8192, 128, "q6_0", A100), (1, 32, 8, 1, 4096, 128, "q6_0", MI300),
    (1, 32, 8, 2048, 2048, 64, "q6_0", MI300), (1, 8, 2, 1, 1024, 192, "q6_0", H200),
]


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,v_format,device", STRIDED_SHAPES)
@pytest.mark.parametrize("half", [True, False])
def test_packed_cache_plans_like_dense(B, Hq, Hkv, Sq, Sk, D, v_format, device, half):
    """Every kernel takes strided rows: a packed cache (rows padded, more rows per head than keys) gets the dense
    call's kernel, instance, warps and splits (so the same output bits) and says it is strided. Only the tensor-core
    decode's staging of q8_0 / q4_0 V changes: on sm_90 bulk copies of the rows (two stages; not q4_0's long walks,
    which keep registers at D = 128 and TMA at D = 256), elsewhere TMA gives way to the staging without TMA (faster
    for those padded rows). Preallocated dense rows keep every part of the plan."""
    dense = plan(B, Hq, Hkv, Sq, Sk, D, device=device, v_format=v_format, half=half)
    packed = plan(B, Hq, Hkv, Sq, Sk, D, device=device, v_format=v_format, half=half,
                  kv_layout=packed_layout(D, v_format, Sk + 4096, half))
    assert dense["strided"] is False and packed["strided"] is True
    assert math_of(packed) == math_of(dense)
    if (dense["kernel"] == "decode_mma" and v_format != "float" and device == H200 and not dense["cluster"]
            and not (v_format == "q4_0" and dense["staging"] != "cp_async")):  # cp.async: q4_0's short walks
        assert (packed["staging"], packed["stages"], packed["fallback"]) == ("bulk", 2, ""), packed
    elif dense.get("staging") == "tma" and v_format != "float" and D <= 128:
        assert packed["staging"] == ("regs" if v_format == "q4_0" else "regs_v" if D == 128 else "cp_async"), packed
        assert "padded K / V rows" in packed["fallback"], packed
    else:
        assert without_strided(packed) == without_strided(dense)
    rows = plan(B, Hq, Hkv, Sq, Sk, D, device=device, v_format=v_format, half=half, kv_layout={"kv_rows": Sk + 7})
    assert rows["strided"] is True and without_strided(rows) == without_strided(dense)


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,v_format,device", [c for c in STRIDED_SHAPES if c[6] != "float"])
def test_the_tight_cache_layout_plans_as_preallocated_dense_rows(B, Hq, Hkv, Sq, Sk, D, v_format, device):
    """Dot4GroupQueryAttention's tight layout (docs/ops.md) hands the kernels its payload run with rows of exactly the
    payload's bytes and its scale run with rows of D/32 scales, L rows per (batch, KV head): the strides of dense K / V
    with preallocated rows, so the planner gives it the same plan as dense rows of that length (every kernel, instance
    and staging; tests/gpu/test_kernels.py's preallocated-rows cases run those plans on the GPU)."""
    L = Sk + 4096
    tight = {"kv_rows": L, "k_stride": formats.payload_bytes(D, "q8_0"), "ks_stride": D // 32,
             "v_stride": formats.payload_bytes(D, v_format), "vs_stride": D // 32}
    p = plan(B, Hq, Hkv, Sq, Sk, D, device=device, v_format=v_format, kv_layout=tight)
    assert p == plan(B, Hq, Hkv, Sq, Sk, D, device=device, v_format=v_format, kv_layout={"kv_rows": L})
    assert p["strided"] is True and p["fallback"] == plan(B, Hq, Hkv, Sq, Sk, D, device=device,
                                                           v_format=v_format)["fallback"]


def test_packed_cache_h200_decode_plan():
    """128k keys from a packed cache on the H200: split_k on tensor cores with the dense plan's 4 warps and 33 splits;
    q8_0 V's rows moved by bulk copies in two stages, q4_0's in registers (faster inside a model, launched after the
    prologue), TMA only when forced; registers on an A100; float16 V keeps TMA and its 8 warps."""
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q8_0", kv_layout=packed_layout(128, "q8_0", 262144))
    assert (p["route"], p["kernel"], p["staging"], p["warps"], p["stages"], p["n_splits"]) == \
        ("split_k", "decode_mma", "bulk", 4, 2, 33)
    assert p["fallback"] == ""
    packed = packed_layout(128, "q4_0", 262144)
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", kv_layout=packed)
    assert (p["route"], p["kernel"], p["staging"], p["warps"], p["stages"], p["n_splits"]) == \
        ("split_k", "decode_mma", "regs", 4, 1, 33)
    assert "padded K / V rows" in p["fallback"], p
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", kv_layout=packed, overrides="staging=bulk")
    assert (p["staging"], p["warps"], p["stages"], p["fallback"]) == ("bulk", 4, 2, "")
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", kv_layout=packed, overrides="staging=tma")
    assert (p["staging"], p["warps"], p["stages"], p["fallback"]) == ("tma", 4, 2, "")
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", kv_layout=packed, overrides="staging=regs")
    assert (p["staging"], p["warps"], p["stages"]) == ("regs", 4, 1)
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", kv_layout=packed, device=A100)
    assert (p["staging"], p["fallback"]) == ("regs", ""), p
    p = plan(1, 32, 8, 1, 131072, 128, v_format="float", kv_layout=packed_layout(128, "float", 262144))
    assert (p["staging"], p["warps"], p["n_splits"], p["fallback"]) == ("tma", 8, 33, "")


@pytest.mark.parametrize("sk,v_format,staging", [(131072, "q4_0", "tma"), (5009, "q4_0", "tma"),
                                                  (3000, "q4_0", "bulk"), (131072, "q8_0", "bulk")])
def test_packed_cache_d256_staging(sk, v_format, staging):
    """D = 256 on the H200: q4_0's long walks keep the dense call's TMA in 3-warp blocks (its 272 / 144-byte rows
    need no padding; bulk copies in 3 warps were slower); short q4_0 walks and q8_0 take bulk copies. Same warps and
    splits as the dense call."""
    dense = plan(3, 24, 4, 1, sk, 256, v_format=v_format)
    p = plan(3, 24, 4, 1, sk, 256, v_format=v_format, kv_layout=packed_layout(256, v_format, sk + 64))
    assert p["staging"] == staging and math_of(p) == math_of(dense), p


def test_bulk_staging_needs_scales_in_the_rows():
    """Bulk copies move whole rows: a strided layout whose scale rows are not inside the K / V rows (other strides, or
    scale pointers elsewhere) keeps the staging it had, and forcing bulk says why; so does a dense call."""
    layout = packed_layout(128, "q4_0", 4096)
    c = native.make_call(1, 32, 8, 1, 4000, 128, v_format="q4_0", kv_layout=layout)
    c.k, c.k_scales, c.v, c.v_scales = 1 << 20, (1 << 20) + 128, 1 << 30, (1 << 30) + 64
    assert native.gpu_plan(c, H200)["staging"] == "bulk"
    c.k_scales = 1 << 25  # 16-byte aligned, but not in the K rows
    p = native.gpu_plan(c, H200)
    assert p["kernel"] == "decode_mma" and p["staging"] != "bulk", p
    wide = dict(layout, k_stride=160, ks_stride=80)  # rows of 160 bytes: not the stage's D + 16
    assert plan(1, 32, 8, 1, 4000, 128, v_format="q4_0", kv_layout=wide)["staging"] != "bulk"
    for kw in ({}, {"kv_layout": wide}):
        p = plan(1, 32, 8, 1, 4000, 128, v_format="q4_0", overrides="staging=bulk", **kw)
        assert p["staging"] != "bulk" and "bulk staging needs sm_90 and a packed cache's rows" in p["fallback"], p


def test_dense_widths_given_explicitly_are_dense():
    layout = {"kv_rows": 1024, "k_stride": 128, "ks_stride": 4, "v_stride": 64, "vs_stride": 4}
    p = plan(1, 8, 2, 1, 1024, 128, v_format="q4_0", route="decode", kv_layout=layout)
    assert p["strided"] is False
    assert p == plan(1, 8, 2, 1, 1024, 128, v_format="q4_0", route="decode")


def test_preallocated_cache_rows_past_sk():
    """Dense row widths with more rows per head than keys (a preallocated cache): strided, same kernels."""
    layout = {"kv_rows": 4096}
    for sq, sk in ((1, 1000), (1, 131072), (300, 1000)):
        dense = plan(1, 8, 2, sq, sk, 128, v_format="q8_0")
        rows = plan(1, 8, 2, sq, sk, 128, v_format="q8_0", kv_layout={"kv_rows": max(sk, 4096) + 1})
        assert rows["strided"] and without_strided(rows) == without_strided(dense)
    assert plan(1, 8, 2, 1, 1000, 128, kv_layout=layout)["strided"] is True


def test_odd_scale_strides_fall_back_and_say_why():
    """Scale rows that cannot move as whole 2 D/32-byte (decode) or 4-byte (prefill) pieces: the tensor-core kernels
    are refused with the reason, the SIMT decode and the tile kernel (which copy such rows element by element) run."""
    odd = {"kv_rows": 2048, "k_stride": 144, "ks_stride": 69, "v_stride": 80, "vs_stride": 40}
    p = plan(1, 8, 2, 1, 1024, 128, v_format="q4_0", route="decode", kv_layout=odd)
    assert p["kernel"] == "decode_simt" and "scale row strides not multiples of 8 bytes" in p["fallback"], p
    p = plan(1, 8, 2, 300, 1024, 128, v_format="q4_0", kv_layout=odd)
    assert p["kernel"] == "tile" and "scale row strides not multiples of 4 bytes" in p["fallback"], p
    with pytest.raises(native.NativeError, match="kernel=mma cannot run this call: .*scale row strides"):
        plan(1, 8, 2, 1, 1024, 128, v_format="q4_0", route="decode", kv_layout=odd, overrides="kernel=mma")
    # 4-byte but not 8-byte multiples: the prefill takes them, the tensor-core decode does not
    four = dict(odd, ks_stride=70)
    assert plan(1, 8, 2, 1, 1024, 128, v_format="q4_0", route="decode", kv_layout=four)["kernel"] == "decode_simt"
    assert plan(1, 8, 2, 300, 1024, 128, v_format="q4_0", kv_layout=four)["kernel"] == "prefill_mma"


def test_unaligned_packed_scales_fall_back():
    """Scales 2-byte aligned (a packed cache at an odd place): the decode kernels' cp.async refuse them."""
    c = native.make_call(1, 8, 2, 1, 1024, 128, v_format="q4_0", route="decode",
                         kv_layout=packed_layout(128, "q4_0", 2048))
    c.k_scales = 4096 + 130
    p = native.gpu_plan(c, H200)
    assert p["kernel"] == "tile" and "aligned" in p["fallback"] and p["strided"]


def test_rows_beyond_the_tma_strides_leave_tma_and_say_why():
    """Heads more than 2^40 bytes apart do not fit a tensor map: the decode's bulk copies (plain addresses) and
    register staging still take such a packed cache, float16 V takes its cp.async staging, the prefill its cp.async
    instance, and the plans say why."""
    huge = packed_layout(128, "q4_0", (1 << 40) // 144 + 1)
    p = plan(1, 32, 8, 1, 131072, 128, v_format="q4_0", kv_layout=huge)
    assert (p["kernel"], p["staging"]) == ("decode_mma", "regs") and "TMA tensor map" in p["fallback"], p
    huge8 = packed_layout(128, "q8_0", (1 << 40) // 144 + 1)
    assert plan(1, 32, 8, 1, 131072, 128, v_format="q8_0", kv_layout=huge8)["staging"] == "bulk"
    hugef = packed_layout(128, "float", (1 << 40) // 272 + 1)
    p = plan(1, 32, 8, 1, 131072, 128, v_format="float", kv_layout=hugef)
    assert (p["kernel"], p["staging"]) == ("decode_mma", "cp_async") and "TMA tensor map" in p["fallback"], p
    p = plan(1, 32, 8, 8192, 8192, 128, v_format="q4_0", kv_layout=huge)
    assert (p["kernel"], p["tma"], p["wgmma"], p["min_blocks"]) == ("prefill_mma", False, False, 2), p
    assert "TMA" in p["fallback"], p


@pytest.mark.parametrize("layout,message", [
    ({"kv_rows": 1000}, "kv_rows=1000 is below Sk=1024"),
    ({"k_stride": 136}, "k_stride: expected a multiple of 16 bytes >= D=128, got 136"),
    ({"k_stride": 112}, "k_stride: expected a multiple of 16 bytes >= D=128, got 112"),
    ({"ks_stride": 3}, "ks_stride: expected at least D/32=4 halves, got 3"),
    ({"v_stride": 72}, r"v_stride: expected at least 64 and a multiple of 16 bytes \(bytes\), got 72"),
    ({"vs_stride": 2}, "vs_stride: expected at least D/32=4 halves, got 2"),
    ({"k_stride": -16}, "negative K / V layout"),
])
def test_bad_layouts(layout, message):
    with pytest.raises(native.NativeError, match=message):
        plan(1, 8, 2, 1, 1024, 128, v_format="q4_0", kv_layout=layout)


def test_float_v_stride_counts_elements():
    """Float V rows are counted in elements of T: 136 f16 elements are 272 bytes (a 16-byte multiple), 132 f32
    elements 528 bytes; 132 f16 elements (264 bytes) are not."""
    assert plan(1, 8, 2, 1, 1024, 128, v_format="float", kv_layout={"v_stride": 136})["strided"]
    assert plan(1, 8, 2, 1, 1024, 128, v_format="float", half=False, kv_layout={"v_stride": 132})["strided"]
    with pytest.raises(native.NativeError, match=r"v_stride: .*\(elements of T\), got 132"):
        plan(1, 8, 2, 1, 1024, 128, v_format="float", kv_layout={"v_stride": 132})


def test_unknown_layout_key():
    with pytest.raises(ValueError, match="unknown keys"):
        native.make_call(1, 8, 2, 1, 1024, 128, kv_layout={"rows": 5})


def test_kv_layout_of_views():
    """kv_layout_of reads a packed cache's layout off torch views, and refuses views it cannot address."""
    torch = pytest.importorskip("torch")
    B, H, R, Sk, D = 2, 4, 100, 60, 128
    kbuf = torch.zeros(B, H, R, 144, dtype=torch.uint8)
    vbuf = torch.zeros(B, H, R, 80, dtype=torch.uint8)
    kp, ks = kbuf[:, :, :Sk, :D].view(torch.int8), kbuf[:, :, :Sk, D:D + 8].view(torch.float16)
    vp, vs = vbuf[:, :, :Sk, :D // 2], vbuf[:, :, :Sk, D // 2:D // 2 + 8].view(torch.float16)
    assert native.kv_layout_of(kp, ks, vp, vs) == {"kv_rows": R, "k_stride": 144, "ks_stride": 72, "v_stride": 80,
                                                   "vs_stride": 40}
    dense = [torch.zeros(B, H, Sk, x, dtype=dt) for x, dt in ((D, torch.int8), (4, torch.float16), (D, torch.float16))]
    assert native.kv_layout_of(*dense) == {"kv_rows": Sk, "k_stride": D, "ks_stride": 4, "v_stride": D,
                                           "vs_stride": 0}
    empty = torch.from_numpy(np.zeros((B, H, 0, D), np.int8))  # numpy gives empty arrays 0 strides
    assert native.kv_layout_of(empty, empty[..., :4], empty, None) == dict.fromkeys(native.KV_LAYOUT_FIELDS, 0)
    with pytest.raises(ValueError, match="disagree on rows per head"):
        native.kv_layout_of(kp, ks, torch.zeros(B, H, R + 1, 80, dtype=torch.uint8)[:, :, :Sk, :64], vs)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        native.kv_layout_of(kbuf[:, :, :Sk, :2 * D:2].view(torch.int8), ks, vp, vs)
    with pytest.raises(ValueError, match="kv heads of a batch row must follow each other"):
        native.kv_layout_of(kp.transpose(0, 1), ks, vp, vs)


# ---- AMD devices (64 KB LDS, wave64 CDNA and wave32 RDNA) ------------------------------------------------------------

AMD, LDS = AMD_DEVICES, AMD_LDS
# (B, Hq, Hkv, Sq, Sk) per route: short and long prefills (causal tiles, a chunk over a longer cache), a single-row
# and a grouped multi-row decode (rows past the SIMT kernel's 8-row tile), long split_k walks at batch 1 and 16.
AMD_SHAPES = {"prefill": [(1, 32, 8, 2048, 2048), (1, 28, 4, 300, 4396)],
              "decode": [(1, 32, 8, 1, 1000), (2, 32, 8, 4, 1500)],
              "split_k": [(1, 32, 8, 1, 131072), (16, 28, 4, 1, 32768)]}
# The kernels each route may take on AMD, forced: prefill the tile kernel only; decode and split_k the SIMT decode
# kernel and its tile-kernel fallback (misaligned pointers, or a block that does not fit).
AMD_KERNELS = {"prefill": ("",), "decode": ("", "kernel=simt", "kernel=tile"),
               "split_k": ("", "kernel=simt", "kernel=tile")}


def _amd_plan(device, shape, D, v_format, route, half, overrides="", layout=None):
    return plan(*shape, D, device=device, v_format=v_format, route=route, half=half, overrides=overrides,
                kv_layout=layout)


def _check_amd_plan(p, device, route, overrides):
    warp = 64 if "warp=64" in device else 32
    assert p["route"] == route, p
    assert p["kernel"] in ("tile", "decode_simt"), p  # HIP has no tensor-core kernels
    if overrides:
        assert p["kernel"] == {"kernel=simt": "decode_simt", "kernel=tile": "tile"}[overrides], p
    assert p["smem_bytes"] <= LDS and p["stages"] == 1, p  # HIP's plain copies overlap nothing: one stage
    assert p["threads"] == p["warps"] * warp and p["blocks"] >= 1, p
    if p["kernel"] == "tile":
        assert p["threads"] == 256 and p["key_tile"] in (32, 64), p


@pytest.mark.parametrize("dev", list(AMD))
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("v_format", ["float", "q8_0", "q4_0", "q6_0"])
@pytest.mark.parametrize("half", [True, False], ids=["f16", "f32"])
def test_amd_devices_plan_every_route(dev, D, v_format, half):
    """Every route, D 64 / 128 / 256, float / q8_0 / q4_0 / q6_0 V, float16 and float32 T, dense and packed-cache
    rows, on wave64 and wave32 descriptions with 64 KB of LDS: a plan within the LDS for the automatic choice and for
    each kernel the route may fall back to, with the packed cache's rows taking the dense call's plan (so its output
    bits). The plan as a 32-wide-warp GPU runs it (run_warp=32, what run_as executes on the H200) keeps every part
    of the described plan but, on wave64, its warps (twice as many, counted on the GPU that runs it) and the SIMT
    decode's shared memory, laid out for them (32-key chunks) and still within the LDS."""
    device = AMD[dev]
    for route, shapes in AMD_SHAPES.items():
        for shape in shapes:
            Sk = shape[4]
            for ov in AMD_KERNELS[route]:
                if ov == "kernel=simt" and not half and v_format == "float" and D == 256 and "warp=64" in device:
                    # a 64-key chunk of float32 V rows alone is 64 KB: the automatic plan takes the tile kernel
                    with pytest.raises(native.NativeError, match="SIMT decode: no block fits the shared memory"):
                        _amd_plan(device, shape, D, v_format, route, half, ov)
                    continue
                dense = _amd_plan(device, shape, D, v_format, route, half, ov)
                _check_amd_plan(dense, device, route, ov)
                if route == "prefill":
                    assert dense["rows_per_block"] == (64 if D <= 128 else 32) and dense["key_tile"] == 32, dense
                layout = packed_layout(D, v_format, Sk + 64, half)
                packed = _amd_plan(device, shape, D, v_format, route, half, ov, layout)
                assert packed["strided"] and math_of(packed) == math_of(dense), (dense, packed)
                assert packed["smem_bytes"] <= LDS, packed
                ran = _amd_plan(device + ",run_warp=32", shape, D, v_format, route, half, ov)
                assert ran["smem_bytes"] <= LDS, ran
                if "warp=64" in device:  # warps of the GPU that runs it; the SIMT block laid out for them
                    assert ran["warps"] == 2 * dense["warps"] and ran["threads"] == dense["threads"], (dense, ran)
                    ran = dict(ran, warps=dense["warps"])
                    if dense["kernel"] == "decode_simt":
                        ran["smem_bytes"] = dense["smem_bytes"]
                assert ran == dense, (dense, ran)


def test_amd_simt_decode_keeps_its_block_on_wave64():
    """The SIMT decode on MI300 at D = 256, float16 V: one 64-wide wave of one stage (a 64-key chunk of 272-byte K
    and 512-byte V rows is 51 KB); float32 T's 1 KB V rows do not fit a 64-key chunk at all, so the tile kernel's
    32-key tiles take that decode."""
    p = plan(1, 32, 8, 1, 4096, 256, device=MI300, v_format="float", route="decode")
    assert (p["kernel"], p["warps"], p["threads"], p["stages"]) == ("decode_simt", 1, 64, 1), p
    p = plan(1, 32, 8, 1, 4096, 256, device=MI300, v_format="float", route="decode", half=False)
    assert (p["kernel"], p["rows_per_block"], p["key_tile"]) == ("tile", 16, 32), p
    assert "SIMT decode: no block fits the shared memory" in p["fallback"], p
    # wave32 (RDNA3): 32-key chunks of the same rows fit
    p = plan(1, 32, 8, 1, 4096, 256, device=AMD["gfx1100_96"], v_format="float", route="decode", half=False)
    assert (p["kernel"], p["threads"]) == ("decode_simt", 32 * p["warps"]), p


def test_info_plan_on_amd_devices(capsys):
    """`dot4attn info --plan` on the AMD descriptions: a prefill and a long decode each get their plan."""
    from dot4attn.cli import main

    for device in (AMD["mi300"], AMD["mi250"], AMD["gfx1100_48"]):
        for shape, words in (("1,32,8,2048,2048,128,q4_0", ("prefill", "tile", "key_tile")),
                             ("1,32,8,1,131072,256,q8_0", ("split_k", "decode_simt"))):
            assert main(["info", "--plan", shape, "--gpu", device]) == 0
            out = capsys.readouterr().out
            for word in words:
                assert word in out, (device, shape, out)


def test_k_dequant_plans_the_f16_qk_prefill():
    """K converted once into float16 rows (k_dequant.cuh) and the Q.K on f16 wgmma (prefill_mma.cuh, QK16), on the
    float16-V wgmma instance (V float16, or its float16 copy): 3 blocks per SM, two ring slots of K and V float16 tiles
    + the mbarriers + the swizzle slack; or with min_blocks=2 the schedule that overlaps the softmax with the next
    tile's Q.K, three slots (no V scan there). Scratch: [V copy][K copy (the layout's rows per head), K flags (256-byte
    rounded)][V scan flags]. By default at D = 64 and 128 with 3 blocks per SM where each K tile is read by 8+ blocks
    over 2048+ keys; k_dequant=1 drops the length rule and takes min_blocks=2; k_dequant=0 never. Never where
    that instance does not run."""
    p = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=0")  # ws: test_ws_* below
    assert (p["kernel"], p["wgmma"], p["min_blocks"], p["k_dequant"], p["v_scan"]) == \
        ("prefill_mma", True, 3, True, True), p
    assert p["smem_bytes"] == 2 * (64 * 256 * 2) + 16 + 1024
    assert p["scratch_bytes"] == 2 * 8 * 8192 * 128 * 2 + 256 + 2 * 8 * 4
    q8 = plan(2, 32, 8, 8192, 8192, 128, v_format="q8_0", overrides="k_dequant=1,ws=0")
    assert (q8["v_dequant"], q8["k_dequant"]) == (True, True), q8
    assert q8["scratch_bytes"] == 2 * (2 * 8 * 8192 * 128 * 2) + 256 + 2 * 8 * 4
    d64 = plan(1, 32, 8, 4096, 4096, 64, v_format="q4_0", overrides="k_dequant=1,v_dequant=1,min_blocks=2")
    assert d64["k_dequant"] and d64["smem_bytes"] == 3 * (64 * 128 * 2) + 32 + 1024, d64
    # D = 64 with 3 blocks per SM: two ring slots, then every thread's Q fragments (16 bytes per k step, reloaded for
    # each tile's Q.K: Traits::Q16_QH), then the mbarriers; the default there too
    d64m3 = plan(1, 32, 8, 4096, 4096, 64, v_format="q4_0")
    assert (d64m3["k_dequant"], d64m3["v_dequant"], d64m3["min_blocks"]) == (True, True, 3), d64m3
    assert d64m3["smem_bytes"] == 2 * (64 * 128 * 2) + 128 * 4 * 16 + 16 + 1024, d64m3
    assert plan(1, 32, 8, 4096, 4096, 64, v_format="float")["k_dequant"]
    cache = plan(1, 28, 4, 16384, 131072, 128, v_format="q8_0", overrides="k_dequant=1",
                 kv_layout=packed_layout(128, "q8_0", 140000))
    assert cache["k_dequant"] and cache["scratch_bytes"] == 2 * 4 * 140000 * 128 * 2 + 256 + 4 * 4, cache
    auto = plan(2, 32, 8, 2048, 2048, 128, v_format="float")
    assert auto["k_dequant"] and auto["ws"], auto  # the default at D = 128 from 2048 keys: warp-specialized
    qk16 = plan(2, 32, 8, 2048, 2048, 128, v_format="float", overrides="ws=0")
    assert (qk16["k_dequant"], qk16["ws"], qk16["min_blocks"]) == (True, False, 3), qk16
    assert plan(1, 28, 4, 16384, 131072, 128, v_format="q4_0")["k_dequant"]  # a chunk over a long past
    for short in (plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=0"),
                  plan(1, 32, 8, 1024, 1024, 128, v_format="float"),  # under 2048 keys
                  plan(1, 8, 8, 256, 8192, 128, v_format="float"),  # each K tile read by 4 blocks
                  plan(1, 32, 8, 1024, 1024, 64, v_format="float"),  # D = 64 under 2048 keys
                  plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="min_blocks=2")):
        assert not short["k_dequant"], short
    assert plan(1, 32, 8, 1024, 1024, 128, v_format="float", overrides="k_dequant=1")["k_dequant"]
    over = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,min_blocks=2")
    assert (over["k_dequant"], over["min_blocks"], over["wgmma"], over["v_scan"]) == (True, 2, True, False), over
    assert over["smem_bytes"] == 3 * (64 * 256 * 2) + 32 + 1024
    assert over["scratch_bytes"] == 2 * 8 * 8192 * 128 * 2 + 256
    for off in (plan(1, 32, 8, 8192, 8192, 128, device=H100_PLAIN_SM90, overrides="k_dequant=1"),
                plan(1, 32, 8, 8192, 8192, 128, device=A100, overrides="k_dequant=1"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,m_tiles=2"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,wgmma=0"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="q8_0", overrides="k_dequant=1,v_dequant=0"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="float", half=False, overrides="k_dequant=1")):
        assert not off.get("k_dequant", False), off
    with pytest.raises(native.NativeError, match="k_dequant"):
        plan(1, 32, 8, 8192, 8192, 128, overrides="k_dequant=2")


def test_k_dequant_at_d256_plans_the_q_in_shared_memory_kernel():
    """D = 256: the f16 Q.K runs in prefill_wg.cuh's kernel (Q in shared memory beside a 256-wide O accumulator): 2
    warpgroups of 64 rows per block (warps=4: one), one block per SM, TMA tiles of K's float16 copy and V (float16, or
    its copy), under the rules of D 64 / 128; the V scan's flags after K's copy and its flags. From 2048 keys on (where
    the f16 Q.K starts) the default is the warp-specialized kernel (test below), so ws=0 asks for this one."""
    p = plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="ws=0")
    assert (p["kernel"], p["k_dequant"], p["wgmma"], p["tma"], p["min_blocks"]) == ("prefill_mma", True, True, True, 1)
    assert (p["rows_per_block"], p["threads"], p["warps"]) == (128, 256, 8), p
    assert p["smem_bytes"] == 2 * 64 * 512 + 4 * 64 * 512 + 16 + 1024, p  # 2 Q tiles, 2 slots of K + V, mbarriers
    assert (p["n_chunks"], p["blocks"]) == (1, 4 * 6 * (8192 // 128)), p  # causal: position-major 128-row tiles
    assert p["v_scan"] and p["scratch_bytes"] == 4 * 8192 * 256 * 2 + 256 + 4 * 4, p  # K copy, K flags, V flags
    one = plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="warps=4")
    assert (one["rows_per_block"], one["threads"], one["smem_bytes"]) == (64, 128, 64 * 512 + 4 * 64 * 512 + 16 + 1024)
    q4 = plan(1, 24, 4, 8192, 8192, 256, v_format="q4_0", overrides="ws=0")
    assert (q4["v_dequant"], q4["k_dequant"], q4["v_scan"]) == (True, True, True), q4
    assert q4["scratch_bytes"] == 2 * (4 * 8192 * 256 * 2) + 256 + 4 * 4, q4
    # a prompt chunk over a packed cache's rows (the model's chunked prefill): both copies span the cache's rows per head
    cache = plan(1, 24, 4, 4096, 65536, 256, v_format="q8_0", kv_layout=packed_layout(256, "q8_0", 70000),
                 overrides="ws=0")
    assert (cache["v_dequant"], cache["k_dequant"], cache["rows_per_block"]) == (True, True, 128), cache
    assert plan(1, 24, 4, 2048, 2048, 256, v_format="float", overrides="ws=0")["threads"] == 256
    assert cache["scratch_bytes"] == 2 * (4 * 70000 * 256 * 2) + 256 + 4 * 4, cache
    assert plan(1, 24, 4, 1024, 1024, 256, v_format="float", overrides="k_dequant=1")["k_dequant"]
    for off in (plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="k_dequant=0"),
                plan(1, 24, 4, 1024, 1024, 256, v_format="float"),  # under 2048 keys
                plan(1, 24, 4, 8192, 8192, 256, device=H100_PLAIN_SM90),
                plan(1, 24, 4, 8192, 8192, 256, device=A100),
                plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="tma=0"),
                plan(1, 24, 4, 8192, 8192, 256, v_format="float", half=False)):
        assert not off.get("k_dequant", False) and off.get("rows_per_block") != 128, off


def test_ws_plans_the_warp_specialized_f16_qk_prefill_only_where_asked():
    """ws=1: the f16 Q.K prefill warp-specialized (prefill_ws.cuh) in place of a k_dequant plan (D 64 / 128 / 256) on
    sm_90a: work items of 128 rows, 3 warpgroups (2 consumers, 1 producer), one block per SM, persistent (as many
    blocks as SMs walk the items, odd rounds of items dealt right to left: `snake`; ws_snake=0: round-robin;
    ws_persist=0: a block per item); shared memory: 2 Q tiles of
    64 rows x 2 D bytes, SK K slots and SV V slots of key_tile rows x 2 D bytes, a full and an empty mbarrier per slot,
    the swizzle slack. Key tiles of 128 with 3 + 3 slots at D = 128 (ws_keys=64: 64 with 4 + 4), 128 with 4 + 4 at
    D = 64, 64 with 2 + 3 at D = 256. V is always scanned (the kernel has no V check: the flagged heads run on
    prefill_wg.cuh's checked instance), so the scratch ends with the V flags; the call's own float16 V behind the
    kernel (`late_scan`; ws_late_scan=0: in K's pass before it), a quantized V's copy in K's pass. The default at
    D = 128 from 2048 keys on (kWsMinKeys), at D = 64 from 8192 (kWsMinKeysD64) and at D = 256 from 2048
    (kWsMinKeysD256); elsewhere only when asked; never where k_dequant is not, off sm_90a, or where the block does not
    fit."""
    base = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=0")
    p = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=1")
    assert (p["ws"], p["k_dequant"], p["wgmma"], p["tma"], p["min_blocks"], p["v_scan"]) == \
        (True, True, True, True, 1, True), p
    assert (p["rows_per_block"], p["threads"], p["warps"], p["key_tile"], p["stages"]) == (128, 384, 12, 128, 3), p
    assert p["smem_bytes"] == 2 * 64 * 256 + 6 * 128 * 256 + 16 * 6 + 1024, p
    # persistent: a block per SM walks the work items (position-major 128-row items, heaviest first)
    assert (p["n_chunks"], p["items"], p["blocks"], p["persistent"]) == (1, 2 * 8 * 4 * (8192 // 128), 132, True), p
    one_each = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=1,ws_persist=0")
    assert (one_each["blocks"], one_each["items"], one_each["persistent"]) == (p["items"], p["items"], False)
    assert p["snake"] and p["late_scan"], p
    early = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=1,ws_late_scan=0")
    # the late scan's kernel reads B Hkv zero flags after the scan's (it skips no head)
    assert not early["late_scan"] and p["scratch_bytes"] == early["scratch_bytes"] + 2 * 8 * 4, (early, p)
    assert {k: v for k, v in early.items() if k not in ("late_scan", "scratch_bytes")} == \
        {k: v for k, v in p.items() if k not in ("late_scan", "scratch_bytes")}, (early, p)
    rr = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=1,ws_snake=0")
    assert not rr["snake"] and {k: v for k, v in rr.items() if k != "snake"} == \
        {k: v for k, v in p.items() if k != "snake"}, (rr, p)
    # the checked companion (V-flagged heads only): a block per SM striding over the items either way
    assert p["checked_blocks"] == one_each["checked_blocks"] == 132, (p, one_each)
    few = plan(1, 8, 8, 256, 256, 128, v_format="float", overrides="k_dequant=1,ws=1")  # fewer items than SMs
    assert (few["items"], few["blocks"], few["checked_blocks"]) == (16, 16, 16), few
    assert p["scratch_bytes"] == base["scratch_bytes"] + 2 * 8 * 4 == 2 * 8 * 8192 * 128 * 2 + 256 + 2 * 2 * 8 * 4, p
    assert not base["ws"] and "key_tile" not in base
    narrow = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,ws=1,ws_keys=64")
    assert (narrow["key_tile"], narrow["stages"]) == (64, 4), narrow
    assert narrow["smem_bytes"] == 2 * 64 * 256 + 8 * 64 * 256 + 16 * 8 + 1024, narrow
    # the default rule's k_dequant plan takes it too when asked; a chunk over a packed cache's rows
    assert plan(1, 32, 8, 8192, 8192, 128, v_format="q8_0", overrides="ws=1")["ws"]
    cache = plan(1, 28, 4, 16384, 131072, 128, v_format="q4_0", overrides="ws=1",
                 kv_layout=packed_layout(128, "q4_0", 140000))
    assert (cache["ws"], cache["v_dequant"], cache["k_dequant"], cache["rows_per_block"]) == (True, True, True, 128)
    q8 = plan(1, 32, 8, 8192, 8192, 128, v_format="q8_0", overrides="ws=1")
    assert not cache["late_scan"] and not q8["late_scan"], (cache, q8)
    assert cache["scratch_bytes"] == 2 * (4 * 140000 * 128 * 2) + 256 + 4 * 4, cache
    # short: no V scan in the k_dequant plan, so ws adds the flags
    short = plan(1, 32, 8, 1024, 1024, 128, v_format="float", overrides="k_dequant=1,ws=1")
    assert short["ws"] and short["v_scan"] and short["scratch_bytes"] == 8 * 1024 * 128 * 2 + 256 + 2 * 8 * 4, short
    d64 = plan(1, 32, 8, 4096, 4096, 64, v_format="q4_0", overrides="ws=1")
    assert (d64["ws"], d64["v_dequant"], d64["rows_per_block"], d64["key_tile"], d64["stages"]) == \
        (True, True, 128, 128, 4), d64
    assert d64["smem_bytes"] == 2 * 64 * 128 + 8 * 128 * 128 + 16 * 8 + 1024, d64
    d256 = plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="ws=1")
    assert (d256["ws"], d256["rows_per_block"], d256["threads"], d256["key_tile"], d256["stages"]) == \
        (True, 128, 384, 64, 2), d256
    assert d256["smem_bytes"] == 2 * 64 * 512 + 5 * 64 * 512 + 16 * 5 + 1024, d256
    assert d256["scratch_bytes"] == 4 * 8192 * 256 * 2 + 256 + 2 * 4 * 4, d256
    small = "sm=90a,sms=132,smem=200000"  # the wide D = 128 block does not fit, the 64-key one does
    assert plan(1, 32, 8, 8192, 8192, 128, device=small, overrides="ws=1,ws_keys=64")["ws"]
    # the default: D = 128 from 2048 keys on, where no override asks for another instance or no V scan
    assert plan(2, 32, 8, 8192, 8192, 128, v_format="float")["ws"]
    assert plan(1, 32, 8, 4096, 4096, 128, v_format="q8_0")["ws"]
    assert plan(1, 32, 8, 2048, 2048, 128, v_format="q4_0")["ws"]
    assert plan(1, 28, 4, 16384, 131072, 128, v_format="q8_0")["ws"]  # a prompt chunk over a long past
    # D = 64 from 8192 keys on (dense causal and a chunk over a long packed past)
    assert plan(1, 32, 8, 32768, 32768, 64, v_format="float")["ws"]
    assert plan(1, 32, 8, 8192, 8192, 64, v_format="q8_0")["ws"]
    # D = 256 from 2048 keys on
    for d256_default in (plan(1, 24, 4, 2048, 2048, 256, v_format="float"),
                         plan(1, 24, 4, 32768, 32768, 256, v_format="q4_0")):
        assert (d256_default["ws"], d256_default["key_tile"], d256_default["stages"]) == (True, 64, 2), d256_default
    d64_chunk = plan(1, 14, 2, 16384, 131072, 64, v_format="q8_0", kv_layout=packed_layout(64, "q8_0", 140000))
    assert (d64_chunk["ws"], d64_chunk["key_tile"], d64_chunk["stages"]) == (True, 128, 4), d64_chunk
    for off in (plan(2, 32, 8, 2047, 2047, 128, v_format="float", overrides="k_dequant=1"),  # under 2048 keys
                plan(1, 32, 8, 4096, 4096, 64, v_format="float"),  # D = 64 under 8192 keys
                plan(1, 32, 8, 8191, 8191, 64, v_format="float"),
                plan(1, 32, 8, 32768, 32768, 64, v_format="float", overrides="ws=0"),
                plan(1, 24, 4, 2047, 2047, 256, v_format="float"),  # D = 256 under 2048 keys
                plan(1, 24, 4, 32768, 32768, 256, v_format="float", overrides="ws=0"),
                plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="v_scan=0"),
                plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=1,min_blocks=2"),
                plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="ws=0"),
                plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="k_dequant=0,ws=1"),
                plan(1, 32, 8, 8192, 8192, 128, device=H100_PLAIN_SM90, overrides="ws=1"),
                plan(1, 32, 8, 8192, 8192, 128, device=A100, overrides="ws=1"),
                plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="ws=1,k_dequant=0"),
                plan(1, 32, 8, 8192, 8192, 128, device=small, overrides="ws=1"),
                plan(1, 24, 4, 8192, 8192, 256, v_format="float", overrides="ws=1", device=small)):
        assert not off.get("ws", False), off
    for bad in ("ws=2", "ws_keys=96", "ws_keys=256", "ws_persist=2", "ws_snake=2", "ws_group=65", "ws_group=-1",
                "ws_late_scan=2"):
        with pytest.raises(native.NativeError, match="ws"):
            plan(1, 32, 8, 8192, 8192, 128, overrides=bad)


def test_ws_orders_a_long_chunks_items_one_kv_head_after_another():
    """The warp-specialized prefill's causal items run position-major over all heads (group 0) unless the chunk has a
    past at least as long as itself and the K and V float16 rows of all (batch, KV head) pairs take
    kWsGroupMinBytes (160 MiB) or more: then one KV head's items after another (group 1), so L2 serves one head's rows
    to the blocks at work. ws_group=n asks for groups of n KV heads (0: all at once), nothing else changes."""
    def group(B, Hq, Hkv, Sq, Sk, D, **kw):
        p = plan(B, Hq, Hkv, Sq, Sk, D, v_format="q8_0", **kw)
        assert p["ws"], p
        return p["group"]

    assert group(1, 28, 4, 16384, 131072, 128) == 1  # the 7B shape's last chunks: 256 MiB of K and V
    assert group(1, 28, 4, 16384, 98304, 128) == 1   # 192 MiB
    assert group(1, 28, 4, 32768, 131072, 128) == 1
    assert group(1, 28, 4, 16384, 81920, 128) == 1   # 160 MiB, the threshold
    assert group(1, 28, 4, 16384, 81792, 128) == 0   # just below it
    assert group(1, 28, 4, 16384, 65536, 128) == 0   # 128 MiB: L2 serves position-major as well
    assert group(2, 28, 4, 16384, 65536, 128) == 1   # two sequences: 256 MiB
    assert group(1, 28, 4, 65536, 65536, 128) == 0   # Sq = Sk: heavy and light items, the deal needs all heads
    assert group(1, 28, 4, 65536, 131072, 128) == 1  # a past as long as the chunk
    assert group(1, 28, 4, 65600, 131136, 128) == 0  # Sq not a multiple of 128: row chunks, no position order
    assert group(1, 28, 4, 16384, 131072, 128, causal=False) == 0
    assert group(1, 28, 4, 16384, 16384, 128) == 0
    assert group(1, 24, 4, 16384, 65536, 256) == 1   # D = 256: 256 MiB
    assert group(1, 14, 2, 16384, 131072, 64) == 0   # the 0.5B shape: 64 MiB
    auto = plan(1, 28, 4, 16384, 131072, 128, v_format="q8_0")
    for n in (0, 1, 3):
        forced = plan(1, 28, 4, 16384, 131072, 128, v_format="q8_0", overrides=f"ws_group={n}")
        assert forced["group"] == n and {k: v for k, v in forced.items() if k != "group"} == \
            {k: v for k, v in auto.items() if k != "group"}, (forced, auto)


def test_qk_wgmma_plans_the_int8_wgmma_qk_only_where_asked():
    """qk_wgmma=1: the contract's int8 Q.K on wgmma m64n64k32 (prefill_mma.cuh, S8W) in the float16-V wgmma instance
    with 2 blocks per SM (min_blocks=2) at D 64 / 128; the same shared memory and scratch as that instance. k_dequant
    takes precedence; not taken without the override, at 3 blocks per SM, nor where that instance does not run."""
    base = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="min_blocks=2")
    p = plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="qk_wgmma=1,min_blocks=2")
    assert (p["qk_wgmma"], p["k_dequant"], p["min_blocks"], p["wgmma"]) == (True, False, 2, True), p
    assert (p["smem_bytes"], p["scratch_bytes"]) == (base["smem_bytes"], base["scratch_bytes"]) and not base["qk_wgmma"]
    two = plan(1, 32, 8, 4096, 4096, 128, v_format="q8_0", overrides="qk_wgmma=1,v_dequant=1,min_blocks=2")
    assert (two["qk_wgmma"], two["v_dequant"], two["min_blocks"]) == (True, True, 2), two
    # D = 64: the int8 K tile in the 64-byte swizzle
    assert plan(1, 32, 8, 4096, 4096, 64, v_format="q8_0", overrides="qk_wgmma=1,v_dequant=1,min_blocks=2")["qk_wgmma"]
    assert not plan(1, 32, 8, 8192, 8192, 128, overrides="qk_wgmma=1,k_dequant=1,v_dequant=1,min_blocks=2")["qk_wgmma"]
    assert not plan(2, 32, 8, 8192, 8192, 128, v_format="float", overrides="qk_wgmma=1")["qk_wgmma"]  # 3 per SM
    for off in (plan(1, 32, 8, 8192, 8192, 256, v_format="float", overrides="qk_wgmma=1"),
                plan(1, 32, 8, 8192, 8192, 128, device=H100_PLAIN_SM90, overrides="qk_wgmma=1"),
                plan(1, 32, 8, 8192, 8192, 128, device=A100, overrides="qk_wgmma=1"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="float", overrides="qk_wgmma=1,m_tiles=2"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="float", overrides="qk_wgmma=1,wgmma=0"),
                plan(1, 32, 8, 8192, 8192, 128, v_format="q8_0", overrides="qk_wgmma=1,v_dequant=0,min_blocks=2")):
        assert not off.get("qk_wgmma", False), off
