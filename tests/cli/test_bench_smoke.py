"""Smoke test of the bench harness (`dot4attn bench`): a tiny config, a few seconds, no timing assertions."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from dot4attn import bench

RESULT_FIELDS = {"case", "candidate", "median_ms", "min_ms", "p25_ms", "p75_ms", "repeats", "kv_bytes",
                 "speedup_vs_gqa_f32", "nmse_vs_gqa_f32"}


def _args(tmp_path, *extra):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--heads", "4,2,32", "--decode-sk", "64", "--prefill-sk", "32", "--repeats", "3",
                              "--warmup", "1", "--threads", "1", "--thread-pool", "per-session",
                              "--out", str(tmp_path), *extra])


def _library_available() -> bool:
    try:
        from dot4attn import get_library_path

        get_library_path()
        return True
    except Exception:  # noqa: BLE001
        return False


def _check_report(tmp_path, candidates):
    report = json.loads((tmp_path / "bench.json").read_text())
    for key in ("schema", "device", "threads", "thread_pool", "machine", "candidates", "baseline", "method",
                "gqa_verification", "results", "targets", "elapsed_s"):
        assert key in report, key
    assert report["device"] == "cpu" and report["threads"] == 1 and report["baseline"] == "gqa_f32"
    cases = {(r["case"]["kind"], r["case"]["Sq"], r["case"]["Sk"]) for r in report["results"]}
    assert cases == {("decode", 1, 64), ("prefill", 32, 32)}
    for r in report["results"]:
        assert RESULT_FIELDS <= set(r), set(r)
        assert r["repeats"] == 3 and r["median_ms"] > 0 and r["kv_bytes"] > 0
        assert r["case"]["Hq"] == 4 and r["case"]["Hkv"] == 2 and r["case"]["D"] == 32
    assert {r["candidate"] for r in report["results"]} == set(candidates)
    for r in report["results"]:
        if r["candidate"] != "gqa_f32":  # every candidate computes the same attention as the baseline
            assert r["nmse_vs_gqa_f32"] is not None and r["nmse_vs_gqa_f32"] < 5e-2, r
    # the targets (two speedups vs GQA, two packed-cache time ratios) are about (32, 8, 128) at Sk=16384: not here
    assert [t["met"] for t in report["targets"]] == [None] * 4
    assert (tmp_path / "bench.png").stat().st_size > 0
    return report


def test_bench_baselines(tmp_path):
    """GQA (share-buffer, verified against the reference) and numpy only: needs no op library."""
    rc = bench.run_bench(_args(tmp_path, "--candidates", "gqa_f32,gqa_f16,numpy"))
    assert rc == 0
    report = _check_report(tmp_path, ["gqa_f32", "gqa_f16", "numpy"])
    assert report["gqa_verification"] and all(v["ok"] and v["share_buffer"] for v in report["gqa_verification"])


@pytest.mark.skipif(not _library_available(), reason="dot4attn op library not built")
def test_bench_all_candidates(tmp_path):
    rc = bench.run_bench(_args(tmp_path, "--no-verify"))
    assert rc == 0
    report = _check_report(tmp_path, list(bench.CANDIDATES))
    routes = {(r["case"]["kind"], r["route"]) for r in report["results"] if r["candidate"].startswith("d4a_")}
    assert routes == {("decode", "decode"), ("prefill", "prefill")}


def test_bench_unknown_candidate(tmp_path):
    assert bench.run_bench(_args(tmp_path, "--candidates", "gqa_f32,nope")) == 2


def test_bench_cuda_without_cuda(tmp_path, capsys):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has a CUDA EP: the CUDA bench would really run")
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("torch sees a CUDA GPU: the CUDA bench would really run")
    except ImportError:
        pass
    assert bench.run_bench(_args(tmp_path, "--device", "cuda")) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and ("bench_cuda" in err or "no CUDA device" in err)


def test_bench_cuda_l2_flush_choices(capsys):
    """The CUDA bench flushes L2 by a write (default) or a read of 256 MiB before each timed call; anything else is
    refused, by the command line and by the timer."""
    from dot4attn.bench import cuda

    with pytest.raises(SystemExit) as e:
        cuda.main(["--l2-flush", "sideways"])
    assert e.value.code == 2 and "invalid choice: 'sideways'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="l2 flush: expected 'write' or 'read', got 'sideways'"):
        cuda._Timer(None, 1, "sideways")


def test_bench_cuda_prefill_goals():
    """The CUDA bench's prefill goals are speed ratios against baselines of the same run: (32, 8, 128) at 8k vs FA2 and
    at 8k / 32k vs cuDNN per Q.K instance, (24, 4, 256) at 2k / 8k / 32k vs FA2; a goal whose rows are missing is left
    out."""
    from dot4attn.bench import cuda

    def row(hq, hkv, d, sk, name, us):
        return {"kind": "prefill", "B": 1, "Hq": hq, "Hkv": hkv, "D": d, "Sk": sk, "candidate": name, "us": us}

    results = [row(32, 8, 128, 8192, "sdpa_flash", 1720.0), row(32, 8, 128, 8192, "sdpa_cudnn", 909.0),
               row(32, 8, 128, 8192, "d4a_f16", 1150.0), row(32, 8, 128, 8192, "d4a_f16_int8", 1658.0),
               row(24, 4, 256, 2048, "sdpa_flash", 225.0), row(24, 4, 256, 2048, "d4a_f16", 230.0),
               row(24, 4, 256, 8192, "sdpa_flash", 2700.0), row(24, 4, 256, 8192, "d4a_q8_0", 1800.0)]
    got = {t["what"]: (t["value"], t["met"]) for t in cuda._targets(results)}
    assert got == {
        "prefill 8k causal speed vs FA2 (f16 V)": (round(1720 / 1150, 3), True),
        "prefill 8k causal speed vs cuDNN (f16 V)": (round(909 / 1150, 3), False),
        "prefill 8k causal speed vs cuDNN (f16 V, int8 Q.K)": (round(909 / 1658, 3), False),
        "prefill 2k causal speed vs FA2, (24, 4, 256) f16 V": (round(225 / 230, 3), False),
        "prefill 8k causal speed vs FA2, (24, 4, 256) q8_0 V": (1.5, True),
    }


@pytest.mark.parametrize("v_format", ["q4_0", "q6_0"])
def test_bench_pair_buffers_are_the_pair_layout(v_format):
    """The CUDA bench's pair-layout candidates (d4a_pair_q4_0, d4a_pair_q6_0) read the cache q4_0 / q6_0 V folders
    use under og.Generator: its buffers hold reference.pack_cache_pair's rows, and its views give the op the strides
    of that layout."""
    torch = pytest.importorskip("torch")
    from dot4attn import native, reference as R
    from dot4attn.bench.cuda import _pair_buffers

    rng = np.random.default_rng(3)
    B, H, S, D = 2, 3, 40, 128
    k, v = rng.standard_normal((2, B, H, S, D)).astype(np.float32)
    kp, ks = R.pack_k(k)
    vp, vs = R.pack_v(v, v_format)
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (kp, ks, vp, vs)]
    bk, kpv, ksv, bv, vpv, vsv = _pair_buffers(torch, *t, extra_rows=8, device="cpu", fmt=v_format)
    want_k, want_v = R.pack_cache_pair(k, v, v_format)
    assert np.array_equal(bk[:, :, :S].numpy(), want_k) and np.array_equal(bv[:, :, :S].numpy(), want_v)
    for view, want in ((kpv, kp), (ksv, ks), (vpv, vp), (vsv, vs)):
        assert np.array_equal(view.numpy().view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    layout = native.kv_layout_of(kpv, ksv, vpv, vsv)
    assert layout == {**layout, "kv_rows": S + 8, "k_stride": D, "ks_stride": D // 2, "v_stride": D,
                      "vs_stride": D // 2}


@pytest.mark.parametrize("v_format", ["q8_0", "q4_0", "q6_0"])
def test_bench_tight_buffers_are_the_tight_layout(v_format):
    """The CUDA bench's tight-layout candidates (d4a_tight_*, ort_cache_*_tight_session) read the cache tensors of
    cache_layout "tight": its buffers hold reference.tight_tensor of the tight rows (rows past Sk aside), and its
    views give the op dense strides over the two runs."""
    torch = pytest.importorskip("torch")
    from dot4attn import native, reference as R
    from dot4attn.bench.cuda import _tight_buffers

    rng = np.random.default_rng(4)
    B, H, S, D, extra = 2, 3, 40, 128, 8
    k, v = rng.standard_normal((2, B, H, S, D)).astype(np.float32)
    kp, ks = R.pack_k(k)
    vp, vs = R.pack_v(v, v_format)
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (kp, ks, vp, vs)]
    bk, kpv, ksv, bv, vpv, vsv = _tight_buffers(torch, *t, extra_rows=extra, device="cpu", fmt=v_format)
    for buf, x, f in ((bk, k, "q8_0"), (bv, v, v_format)):
        got = R.tight_rows(buf.numpy(), D, f)[:, :, :S]
        assert np.array_equal(got, R.pack_cache_rows(x, f, "tight")), f"{f}: the tight tensor's rows differ"
    for view, want in ((kpv, kp), (ksv, ks), (vpv, vp), (vsv, vs)):
        assert np.array_equal(view.numpy().view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    layout = native.kv_layout_of(kpv, ksv, vpv, vsv)
    assert layout == {**layout, "kv_rows": S + extra, "k_stride": D, "ks_stride": D // 32,
                      "v_stride": vp.shape[-1], "vs_stride": D // 32}


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q6_0"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_bench_pack_is_packv(fmt, D):
    """The CUDA bench packs K and V with torch (dot4attn.bench.cuda._pack, here on CPU tensors): PackV's payload and
    scales bit for bit (reference.pack_v), float16 input as the bench's, ties at half a level included."""
    torch = pytest.importorskip("torch")
    from dot4attn import reference as R
    from dot4attn.bench.cuda import _pack

    rng = np.random.default_rng(D)
    x = (rng.standard_normal((2, 3, 37, D)) * 2).astype(np.float16)
    x[0, 0, 0, :32] = 0                                              # a zero block: scale +0, level 0
    ties = np.arange(31) - 15 + 0.5                                   # halves of a step: round half to even
    x[0, 1, 1, :32] = np.r_[127, ties]                                # q8_0: step 1
    x[0, 1, 2, :32] = np.r_[-8, np.clip(ties, -7.5, 6.5)]             # q4_0: step 1 (v = -8 on level -8)
    x[0, 1, 3, :32] = np.r_[-8, 0.25 * ties]                          # q6_0: step 0.25 (v = -8 on level -32)
    x[1, 2, 4, :32] = -np.abs(x[1, 2, 4, :32])                        # all negative: a positive q4_0 / q6_0 scale
    pay, sc = _pack(torch, torch.from_numpy(x), fmt)
    want_pay, want_sc = R.pack_v(x, fmt)
    assert pay.numpy().dtype == want_pay.dtype and pay.shape == want_pay.shape, (pay.dtype, pay.shape)
    assert np.array_equal(pay.numpy(), want_pay), f"{fmt}: {np.count_nonzero(pay.numpy() != want_pay)} bytes differ"
    assert np.array_equal(sc.numpy().view(np.uint16), want_sc.view(np.uint16)), f"{fmt}: scales differ"


def test_bench_chunk_cases_parse_and_count_their_flops():
    """`python -m dot4attn.bench.cuda --chunk SQ:SK,...`: prompt chunks of SQ rows over SK keys (1 <= SQ <= SK,
    bottom-right causal); bad pairs are refused by argparse with the reason. Their FLOPs: the rows' full band of
    SK - SQ keys plus the half square of the diagonal block, which for SQ = SK is the prefill rows' half square."""
    import argparse

    from dot4attn.bench.cuda import add_arguments, causal_flops, chunk_cases

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).chunk == []
    assert p.parse_args(["--chunk", "16384:131072,512:8192"]).chunk == [(16384, 131072), (512, 8192)]
    assert chunk_cases("") == [] and chunk_cases("8:8") == [(8, 8)]
    for bad, why in (("8192:512", "1 <= SQ <= SK"), ("0:5", "1 <= SQ <= SK"), ("abc", "SQ:SK pairs"),
                     ("1:2:3", "SQ:SK pairs"), ("4096", "SQ:SK pairs")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            chunk_cases(bad)
    assert causal_flops(1, 32, 128, 8192, 8192) == 4.0 * 32 * 128 * 8192 * 8192 / 2
    assert causal_flops(2, 3, 4, 2, 10) == 4.0 * 2 * 3 * 4 * (2 * 8 + 2 * 2 / 2)


def test_bench_sdpa_chunk_baseline_is_aligned_bottom_right():
    """The chunk cases' SDPA baselines (here torch's flash backend on CPU tensors) attend as Dot4Attention's causal
    chunk: query row i of Sq sees keys 0 .. Sk - Sq + i, with grouped K / V heads."""
    torch = pytest.importorskip("torch")
    from dot4attn.bench.cuda import _sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, s, 16, generator=g) for h, s in ((4, 3), (2, 7), (2, 7)))
    got = _sdpa(torch, "flash", q, k, v, True)()
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kk.transpose(-1, -2)) / 4.0
    s = s.masked_fill(torch.arange(7)[None, :] > torch.arange(3)[:, None] + 7 - 3, float("-inf"))
    assert torch.allclose(got, torch.softmax(s, -1) @ vv, atol=1e-5)
