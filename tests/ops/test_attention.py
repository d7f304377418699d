"""Dot4Attention against the numpy reference, for every route and every CPU ISA path.

Coverage is hand-picked rather than a cartesian product (the suite must stay fast on 2 cores): the CASES table
(tests/attention_cases.py, shared with the GPU tests) holds every listed value of every dimension (D, Hq/Hkv, Sq,
Sk up to 8192 plus one 32768 case, B, dtype, causal, bool/additive masks incl. left padding and broadcast shapes,
V format) and the edge cases (Sq > Sk, fully masked rows, Sk = 0). Each case runs on every route that can take it (prefill and auto
always; decode and split_k when Sq <= 8) on every CPU ISA, so every route x ISA pair is covered many times.
The reference output of a case is computed once and cached.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from attention_cases import (CASE_BY_NAME, CASES, CPU_CASES, Q6_CASES, QUALITY, QUALITY_TOL,
                             REF_TOL, ROUTES, Case, case_data, quality_data, routes_for)
from conftest import (check_nmse, gaussian_qkv, pack_value, run_attention, run_pack, attention_session,
                      attention_feeds, new_session)
from dot4attn import onnx_builders as ob
from dot4attn import reference as R


def run_case(c: Case, route: str, inputs):
    return run_attention(*inputs, v_format=c.v_format, causal=c.causal, route=route,
                         split_k_min_keys=c.split_k_min_keys, scale=c.scale)


def test_case_table_covers_the_issue():
    """The hand-picked table holds every value the issue lists (guards edits of CASES)."""
    vals = lambda f: {f(c) for c in CASES}  # noqa: E731
    assert {32, 64, 128, 256} <= vals(lambda c: c.D)
    assert {1, 2, 4, 6, 8} <= vals(lambda c: c.Hq)
    assert {1, 2, 4, 6, 8} <= vals(lambda c: c.Hkv)
    assert {1, 2, 4, 6, 8} <= vals(lambda c: c.Hq // c.Hkv)
    assert {1, 2, 7, 64, 300} <= vals(lambda c: c.Sq)
    assert {0, 8192, 32768} <= vals(lambda c: c.Sk)
    assert {1, 3} <= vals(lambda c: c.B)
    assert {"float32", "float16"} <= vals(lambda c: c.dtype)
    assert {0, 1} <= vals(lambda c: c.causal)
    assert {"float", "q8_0", "q4_0"} <= vals(lambda c: c.v_format)
    assert any(c.Sq > c.Sk > 0 for c in CASES)
    # every (route-capable Sq, dtype, v_format) mix appears on the decode / split_k side too
    small = [c for c in CASES if c.Sq <= 8]
    assert {"float", "q8_0", "q4_0"} <= {c.v_format for c in small}
    assert {"float32", "float16"} <= {c.dtype for c in small}
    assert {True, False} <= {c.mask is None for c in small}


def test_q6_cases_cover_every_route_and_head_dim():
    """The q6_0 cases reach every route, every D the decoders tile differently, both dtypes, masks."""
    q6 = [c for c in Q6_CASES if c.v_format == "q6_0"]
    assert {32, 64, 96, 128, 160, 192, 224, 256} <= {c.D for c in q6}
    assert any(c.Sq > 8 for c in q6) and any(c.Sq <= 8 and c.Sk >= 2048 for c in q6)
    assert {"float32", "float16"} <= {c.dtype for c in q6} and {0, 1} <= {c.causal for c in q6}
    assert any(c.mask for c in q6) and any(c.Sk == 0 for c in q6) and any(c.dead_rows for c in q6)


@pytest.mark.parametrize("name,route", [(c.name, r) for c in CPU_CASES for r in routes_for(c)])
def test_matches_reference(name, route, isa):
    c = CASE_BY_NAME[name]
    inputs, ref, dead = case_data(name)
    out = run_case(c, route, inputs)
    what = f"{c} route={route} ISA={isa}"
    check_nmse(out, ref, REF_TOL, what)
    if c.dead_rows is not None:
        assert bool(dead.any()) == c.dead_rows, f"{what}: case table says dead_rows={c.dead_rows}"
    if dead.any():
        assert (out[dead] == 0).all(), (
            f"{what}: {np.count_nonzero(out[dead] != 0)} values of rows with no visible key are not 0")


@pytest.mark.parametrize("name", [c.name for c in CPU_CASES if c.Sq <= 8 and c.Sk > 0 and c.dtype == "float32"])
def test_routes_agree(name):
    """All routes give the same result up to float32 rounding (default ISA, float32 output)."""
    c = CASE_BY_NAME[name]
    inputs, _, _ = case_data(name)
    outs = {r: run_case(c, r, inputs) for r in ROUTES}
    for r in ("decode", "split_k", "auto"):
        err = R.nmse(outs[r], outs["prefill"])
        assert err <= 1e-8, f"{c}: route {r} vs prefill NMSE {err:.3e} (routes must agree to float32 rounding)"


# ---- quality against plain float attention, end to end through PackK / PackV ------------------------------------

_QUALITY_REFS: dict = {}


def _quality_reference(idx, kp, ks, value, v_scales):
    """reference.attention on the op-packed K/V (cached per packed content)."""
    D, vf, _, _, causal = QUALITY[idx]
    key = (idx, *(zlib.crc32(np.ascontiguousarray(a).view(np.uint8)) for a in (kp, ks, value, v_scales)
                  if a is not None))
    if key not in _QUALITY_REFS:
        _QUALITY_REFS[key] = R.attention(quality_data(idx)[0], kp, ks, value, v_scales, causal=causal, v_format=vf)
    return _QUALITY_REFS[key]


@pytest.mark.parametrize("idx", range(len(QUALITY)),
                         ids=[f"D{d}-{vf}-{dt}-Sq{s[3]}-Sk{s[4]}" for d, vf, s, dt, _ in QUALITY])
def test_quality_vs_float_attention(idx, isa):
    D, vf, shape, dtype, causal = QUALITY[idx]
    q, k, v, base = quality_data(idx)
    kp, ks = run_pack(k, "PackK")
    if vf == "float":
        value, v_scales = v, None
    else:
        value, v_scales = run_pack(v, "PackV", vf)
    out = run_attention(q, kp, ks, value, v_scales, v_format=vf, causal=causal)
    what = f"D={D} V={vf} (B,Hq,Hkv,Sq,Sk)={shape} {dtype} causal={causal} route=auto ISA={isa}"
    check_nmse(out, _quality_reference(idx, kp, ks, value, v_scales), REF_TOL, what + " vs reference")
    err = R.nmse(out.astype(np.float32), base)
    assert err <= QUALITY_TOL[vf], f"{what}: NMSE vs float attention {err:.3e} > {QUALITY_TOL[vf]:.0e}"


# ---- attributes, empty shapes, purity -----------------------------------------------------------------------------

def test_default_attributes():
    """A node without attributes: scale 1/sqrt(D), causal 1, v_format float, route auto."""
    model = ob.attention_model(np.float32)
    del model.graph.node[0].attribute[:]
    sess = new_session(model)
    rng = np.random.default_rng(11)
    q, k, v = gaussian_qkv(rng, 1, 4, 2, 5, 40, 128)
    kp, ks = R.pack_k(k)
    out = sess.run(None, attention_feeds(q, kp, ks, v))[0]
    check_nmse(out, R.attention(q, kp, ks, v, causal=1), REF_TOL, "default attributes")
    assert R.nmse(out, R.attention(q, kp, ks, v, causal=0)) > 1e-3, "causal must default to 1"


@pytest.mark.parametrize("shape", [(0, 4, 7, 64, 2, 16), (3, 4, 0, 64, 2, 16), (1, 0, 1, 32, 0, 16),
                                   (0, 2, 300, 128, 1, 16)], ids=["B0", "Sq0", "H0", "B0-prefill"])
def test_empty_dims(shape, isa):
    """Empty B, Sq or heads give empty outputs of the right shape and dtype on every route."""
    B, Hq, Sq, D, Hkv, Sk = shape
    for dtype in ("float32", "float16"):
        for vf in ("float", "q4_0", "q6_0"):
            rng = np.random.default_rng(0)
            q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, dtype)
            kp, ks = R.pack_k(k)
            value, vs = pack_value(v, vf)
            for route in routes_for(Case("x", B, Hq, Hkv, Sq, Sk, D)):
                out = run_attention(q, kp, ks, value, vs, v_format=vf, route=route)
                assert out.shape == q.shape and out.dtype == q.dtype, (shape, dtype, vf, route, out.shape)


def test_threads_do_not_change_result():
    """One intra-op thread and the default pool give the reference result (split_k and prefill)."""
    for name in ("splitk_sk4096", "mha4_b3_prefill_pad"):
        c = CASE_BY_NAME[name]
        inputs, ref, _ = case_data(name)
        for threads in (1, 2):
            route = "split_k" if c.Sq <= 8 else "prefill"
            out = run_attention(*inputs, v_format=c.v_format, causal=c.causal, route=route, threads=threads)
            check_nmse(out, ref, REF_TOL, f"{c} route={route} threads={threads}")


@pytest.mark.parametrize("name,route", [("gqa2_b3_add_b1qk", "decode"), ("splitk_b3_pad_inf", "split_k"),
                                        ("mha4_b3_prefill_pad", "prefill"), ("gqa4_b3_leftpad", "auto")])
def test_inputs_not_modified(name, route, isa):
    c = CASE_BY_NAME[name]
    inputs, ref, _ = case_data(name)
    copies = [None if a is None else a.copy() for a in inputs]
    out = run_case(c, route, inputs)
    check_nmse(out, ref, REF_TOL, f"{c} route={route} ISA={isa}")
    for label, a, b in zip(("query", "k_payload", "k_scales", "value", "v_scales", "attn_mask"), inputs, copies):
        if a is not None:
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{c}: the run modified input '{label}'"


def test_session_is_reusable_across_shapes():
    """One cached session serves different shapes in a row (no state kept between runs)."""
    sess = attention_session("float32", "q8_0", None, 1, "auto", 64)
    for (B, Hq, Hkv, Sq, Sk, D) in ((1, 2, 1, 1, 200, 64), (3, 4, 2, 9, 50, 32), (1, 2, 1, 1, 200, 64)):
        rng = np.random.default_rng(Sk + D)
        q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D)
        kp, ks = R.pack_k(k)
        vp, vs = R.pack_v(v, "q8_0")
        out = sess.run(None, attention_feeds(q, kp, ks, vp, vs))[0]
        check_nmse(out, R.attention(q, kp, ks, vp, vs, causal=1, v_format="q8_0"), REF_TOL, f"shape {q.shape}")
