"""Dot4Attention against the numpy reference, for every route and every CPU ISA path.

Coverage is hand-picked rather than a cartesian product (the suite must stay fast on 2 cores): the CASES table
below holds every listed value of every dimension of the issue (D, Hq/Hkv, Sq, Sk up to 8192 plus one 32768
case, B, dtype, causal, bool/additive masks incl. left padding and broadcast shapes, V format) and the edge
cases (Sq > Sk, fully masked rows, Sk = 0). Each case runs on every route that can take it (prefill and auto
always; decode and split_k when Sq <= 8) on every CPU ISA, so every route x ISA pair is covered many times.
The reference output of a case is computed once and cached.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from conftest import (check_nmse, gaussian_qkv, pack_value, run_attention, run_pack, attention_session,
                      attention_feeds, new_session)
from dot4attn import onnx_builders as ob
from dot4attn import reference as R

REF_TOL = 1e-6                                            # vs reference.attention
QUALITY_TOL = {"float": 5e-4, "q8_0": 5e-4, "q4_0": 2e-2}  # vs reference.float_attention, Gaussian inputs
ROUTES = ("prefill", "decode", "split_k", "auto")


@dataclass(frozen=True)
class Case:
    name: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str = "float32"
    v_format: str = "float"
    causal: int = 1
    mask: str | None = None
    scale: float | None = None
    split_k_min_keys: int | None = None
    dead_rows: bool | None = False  # the case is meant to contain rows that see no key (None: not checked)

    def __str__(self):
        extra = "".join([f" mask={self.mask}" if self.mask else "", f" scale={self.scale}" if self.scale else "",
                         f" split_k_min_keys={self.split_k_min_keys}" if self.split_k_min_keys else ""])
        return (f"{self.name}: B={self.B} Hq={self.Hq} Hkv={self.Hkv} Sq={self.Sq} Sk={self.Sk} D={self.D} "
                f"{self.dtype} V={self.v_format} causal={self.causal}{extra}")


C = Case
CASES = [
    C("tiny", 1, 1, 1, 1, 1, 32),
    C("gqa2_decode", 1, 2, 1, 1, 37, 64, "float16", "q8_0"),
    C("gqa4_b3_leftpad", 3, 8, 2, 2, 300, 128, "float32", "q4_0", 1, "bool_pad_b11k"),
    C("mha6_bias", 1, 6, 6, 7, 513, 256, "float16", "float", 0, "add_bias_11qk"),
    C("mha4_b3_prefill_pad", 3, 4, 4, 64, 200, 32, "float32", "q8_0", 1, "bool_pad_b1qk"),
    C("gqa8_sq300", 1, 8, 1, 300, 300, 64, "float16", "q4_0", 1),
    C("gqa6_b3_pad_inf", 3, 6, 1, 7, 1000, 128, "float32", "float", 1, "add_pad_inf"),
    C("decode_sk8192", 1, 4, 2, 1, 8192, 128, "float16", "q8_0", 1),
    C("sk8192_mask_k", 1, 1, 1, 2, 8192, 256, "float32", "q4_0", 0, "bool_k"),
    C("prefill_sk8192", 1, 2, 1, 300, 8192, 64, "float16", "float", 1),
    C("mha8_pad_finite", 1, 8, 8, 300, 1024, 32, "float32", "q8_0", 0, "add_pad_big"),
    C("gqa2_sq64_sk2048", 1, 4, 2, 64, 2048, 256, "float32", "float", 1, "add_1h1k"),
    # Sq > Sk with causal: the first Sq - Sk rows see no key.
    C("sq_gt_sk_prefill", 1, 4, 1, 64, 33, 64, "float32", "float", 1, dead_rows=True),
    C("sq_gt_sk_decode", 3, 2, 2, 7, 5, 128, "float16", "q4_0", 1, dead_rows=True),
    # Fully masked rows (bool and additive -inf), and a batch row padded away entirely.
    C("bool_dead_rows", 3, 4, 2, 7, 100, 64, "float32", "q8_0", 0, "bool_dead_rows", dead_rows=True),
    C("bool_dead_rows_prefill", 3, 4, 2, 64, 130, 64, "float16", "q8_0", 1, "bool_dead_rows", dead_rows=True),
    C("add_dead_rows", 1, 6, 2, 2, 77, 32, "float16", "float", 1, "add_dead_rows", dead_rows=True),
    C("pad_whole_batch_row", 3, 2, 1, 1, 64, 64, "float32", "float", 1, "bool_pad_whole", dead_rows=True),
    C("mask_b111", 3, 4, 1, 2, 40, 160, "float32", "float", 0, "bool_b111", dead_rows=True),
    # Sk = 0: every row outputs zeros.
    C("sk0_decode", 3, 4, 2, 7, 0, 64, "float32", "q8_0", 1, dead_rows=True),
    C("sk0_prefill", 1, 2, 1, 64, 0, 32, "float16", "float", 0, dead_rows=True),
    # split_k with several splits (B x Hkv small, Sk large), odd Sk, and auto picking split_k.
    C("sk32768", 1, 2, 1, 1, 32768, 128, "float32", "q8_0", 1),
    C("splitk_sk4096", 1, 2, 1, 1, 4096, 64, "float32", "float", 1),
    C("splitk_sk4099_pad", 1, 8, 1, 8, 4099, 128, "float16", "q4_0", 1, "bool_pad_b11k"),
    C("splitk_b3_pad_inf", 3, 4, 1, 1, 3000, 64, "float16", "q8_0", 1, "add_pad_inf"),
    C("auto_splitk_min16", 1, 4, 2, 2, 100, 64, "float32", "q8_0", 1, split_k_min_keys=16),
    C("auto_splitk_min64", 1, 1, 1, 5, 600, 256, "float16", "float", 0, "add_1h1k", split_k_min_keys=64),
    # Attribute scale, rank-2 masks.
    C("scale_mask_qk", 3, 4, 2, 2, 50, 96, "float32", "q4_0", 1, "bool_qk", scale=0.05),
    C("prefill_mask_qk", 1, 2, 2, 64, 64, 256, "float32", "q8_0", 1, "bool_qk"),
    C("gqa2_b3_add_b1qk", 3, 8, 4, 7, 257, 64, "float16", "q4_0", 1, "add_pad_b1qk"),
    # Prefill tile edges: Sq just above 8, Sq and Sk off any tile size, Sq > Sk without causal.
    C("prefill_sq9", 1, 4, 2, 9, 9, 64, "float32", "q4_0", 1, "bool_pad_b1qk", dead_rows=True),
    C("prefill_b3_sq300_sk517", 3, 6, 2, 300, 517, 128, "float32", "q4_0", 1, "add_pad_b1qk", dead_rows=True),
    C("prefill_sq300_sk301", 1, 2, 1, 300, 301, 256, "float16", "q8_0", 0, "bool_qk"),
    C("prefill_sq33_sk1", 3, 2, 2, 33, 1, 32, "float16", "float", 1, dead_rows=True),
    C("sq_gt_sk_noncausal", 3, 4, 1, 64, 20, 128, "float32", "q8_0", 0),
    # Peaky softmax (large logits: the online max must rescale), mask broadcast along keys.
    C("peaky_decode", 1, 8, 2, 2, 3000, 64, "float32", "float", 1, scale=0.5),
    C("peaky_prefill", 3, 2, 1, 64, 700, 64, "float16", "q8_0", 1, scale=0.5),
    C("mask_bhq1", 3, 4, 2, 7, 90, 32, "float32", "q4_0", 1, "bool_bhq1", dead_rows=True),
]


def _random_cases(n: int, seed: int = 20240531):
    """Seeded random mixes of every dimension (tile-unfriendly sizes included), cost-capped."""
    rng = np.random.default_rng(seed)
    heads = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (6, 1), (6, 2), (6, 3), (6, 6), (8, 1), (8, 2),
             (8, 4), (8, 8)]
    masks = [None, None, "bool_pad_b11k", "bool_pad_b1qk", "add_pad_inf", "add_pad_b1qk", "add_bias_11qk",
             "add_1h1k", "bool_k", "bool_qk", "bool_dead_rows", "add_dead_rows", "bool_bhq1"]
    out = []
    while len(out) < n:
        D = int(rng.choice([32, 64, 96, 128, 160, 192, 224, 256]))
        Sq = int(rng.choice([1, 2, 3, 7, 8, 9, 17, 64, 300]))
        Sk = int(rng.choice([0, 1, 2, 31, 33, 63, 65, 127, 129, 255, 257, 1000, 2049, 4100]))
        B = int(rng.choice([1, 2, 3]))
        Hq, Hkv = heads[rng.integers(len(heads))]
        if B * Hq * Sq * max(Sk, 1) * D > 2e7:
            continue
        mask = masks[rng.integers(len(masks))] if Sk > 0 else None
        out.append(Case(f"rand{len(out):02d}", B, Hq, Hkv, Sq, Sk, D, str(rng.choice(["float32", "float16"])),
                        str(rng.choice(["float", "q8_0", "q4_0"])), int(rng.integers(2)), mask,
                        scale=None if rng.random() < 0.8 else 0.3,
                        split_k_min_keys=[None, None, 1, 16, 256][rng.integers(5)], dead_rows=None))
    return out


RANDOM_CASES = _random_cases(30)
ALL_CASES = CASES + RANDOM_CASES
CASE_BY_NAME = {c.name: c for c in ALL_CASES}
assert len(CASE_BY_NAME) == len(ALL_CASES)


def routes_for(case: Case):
    return [r for r in ROUTES if r in ("prefill", "auto") or case.Sq <= 8]


def _pads(B: int, Sk: int, whole: bool = False):
    if B == 1:
        return np.array([Sk // 4])
    return np.array([0, Sk if whole else Sk // 3, Sk // 2 + 1])[:B] if B == 3 else np.arange(B) * (Sk // max(B, 1))


def make_mask(kind: str | None, rng, B, Hq, Sq, Sk, dtype):
    """The attn_mask of a case (None, bool or additive of dtype T)."""
    if kind is None:
        return None
    T = np.dtype(dtype)
    keep_pad = np.arange(Sk)[None, :] >= _pads(B, Sk, whole=kind == "bool_pad_whole")[:, None]  # [B, Sk]
    if kind in ("bool_pad_b11k", "bool_pad_whole"):  # left padding, one row of keys per batch row
        return keep_pad[:, None, None, :]
    if kind == "bool_pad_b1qk":  # left padding per (batch, query row), with holes
        return keep_pad[:, None, None, :] & (rng.random((B, 1, Sq, Sk)) < 0.9)
    if kind == "add_pad_inf":
        return np.where(keep_pad, 0, -np.inf).astype(T)[:, None, None, :]
    if kind == "add_pad_b1qk":  # additive left padding plus a bias, [B, 1, Sq, Sk]
        bias = rng.standard_normal((B, 1, Sq, Sk)).astype(np.float32)
        return np.where(keep_pad[:, None, None, :], bias, -np.inf).astype(T)
    if kind == "add_pad_big":  # large finite padding value (non-causal cases only: every row keeps keys)
        return np.where(keep_pad, 0, -1e4).astype(T)[:, None, None, :]
    if kind == "add_bias_11qk":
        return rng.standard_normal((1, 1, Sq, Sk)).astype(T)
    if kind == "add_1h1k":
        m = rng.standard_normal((1, Hq, 1, Sk)).astype(np.float32) * 0.5
        m[rng.random(m.shape) < 0.1] = -np.inf
        m[..., [0, -1]] = 0  # the first and last keys stay visible for every row
        return m.astype(T)
    if kind == "bool_k":
        m = rng.random(Sk) < 0.85
        m[[0, -1]] = True
        return m
    if kind == "bool_qk":
        m = rng.random((Sq, Sk)) < 0.8
        m[:, [0, -1]] = True  # causal rows always keep key 0 (Sq <= Sk here), the others the last key
        return m
    if kind == "bool_bhq1":  # broadcast along keys: whole rows on or off
        m = rng.random((B, Hq, Sq, 1)) < 0.75
        m[0, 0, 0, 0] = False
        return m
    if kind == "bool_b111":
        return np.array([True, False, True][:B]).reshape(B, 1, 1, 1)
    if kind == "bool_dead_rows":
        m = rng.random((B, Hq, Sq, Sk)) < 0.7
        b, h, i = np.meshgrid(np.arange(B), np.arange(Hq), np.arange(Sq), indexing="ij")
        m[(b + h + i) % 3 == 0] = False
        return m
    if kind == "add_dead_rows":
        m = rng.standard_normal((B, 1, Sq, Sk)).astype(np.float32)
        m[:, :, ::2, :] = -np.inf
        return m.astype(T)
    raise ValueError(kind)


def visible_keys(case: Case, mask) -> np.ndarray:
    """bool [B, Hq, Sq, Sk]: which keys each query row may attend to (causal, bool mask, -inf)."""
    vis = np.ones((case.B, case.Hq, case.Sq, case.Sk), bool)
    if case.causal:
        vis &= np.arange(case.Sk)[None, :] <= case.Sk - case.Sq + np.arange(case.Sq)[:, None]
    if mask is not None:
        vis &= np.broadcast_to(mask if mask.dtype == np.bool_ else mask != -np.inf, vis.shape)
    return vis


@functools.lru_cache(maxsize=None)
def case_data(name: str):
    """Inputs, reference output and dead-row map of a case (cached: one reference run per case)."""
    c = CASE_BY_NAME[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, k, v = gaussian_qkv(rng, c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.dtype)
    kp, ks = R.pack_k(k)
    value, v_scales = pack_value(v, c.v_format)
    mask = make_mask(c.mask, rng, c.B, c.Hq, c.Sq, c.Sk, c.dtype)
    ref = R.attention(q, kp, ks, value, v_scales, mask, scale=c.scale, causal=c.causal, v_format=c.v_format)
    dead = ~visible_keys(c, mask).any(axis=-1)
    return (q, kp, ks, value, v_scales, mask), ref, dead


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


@pytest.mark.parametrize("name,route", [(c.name, r) for c in ALL_CASES for r in routes_for(c)])
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


@pytest.mark.parametrize("name", [c.name for c in ALL_CASES if c.Sq <= 8 and c.Sk > 0 and c.dtype == "float32"])
def test_routes_agree(name):
    """All routes give the same result up to float32 rounding (default ISA, float32 output)."""
    c = CASE_BY_NAME[name]
    inputs, _, _ = case_data(name)
    outs = {r: run_case(c, r, inputs) for r in ROUTES}
    for r in ("decode", "split_k", "auto"):
        err = R.nmse(outs[r], outs["prefill"])
        assert err <= 1e-8, f"{c}: route {r} vs prefill NMSE {err:.3e} (routes must agree to float32 rounding)"


# ---- quality against plain float attention, end to end through PackK / PackV ------------------------------------

QUALITY = [  # D, v_format, (B, Hq, Hkv, Sq, Sk), dtype, causal
    (32, "float", (1, 8, 2, 8, 2048), "float32", 1),
    (32, "q8_0", (3, 4, 4, 64, 256), "float16", 1),
    (32, "q4_0", (1, 6, 1, 7, 4096), "float32", 0),
    (64, "float", (3, 4, 1, 2, 1000), "float16", 1),
    (64, "q8_0", (1, 8, 8, 64, 512), "float32", 0),
    (64, "q4_0", (1, 8, 2, 300, 300), "float16", 1),
    (128, "float", (1, 8, 1, 64, 2048), "float32", 1),
    (128, "q8_0", (1, 8, 2, 1, 8192), "float16", 1),
    (128, "q4_0", (3, 2, 1, 7, 600), "float32", 1),
    (256, "float", (1, 2, 2, 300, 512), "float16", 0),
    (256, "q8_0", (3, 6, 2, 8, 1500), "float32", 1),
    (256, "q4_0", (1, 4, 1, 2, 3000), "float16", 1),
]


@functools.lru_cache(maxsize=None)
def quality_data(idx: int):
    D, vf, (B, Hq, Hkv, Sq, Sk), dtype, causal = QUALITY[idx]
    rng = np.random.default_rng(zlib.crc32(f"{D}{vf}".encode()))
    q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, dtype)
    base = R.float_attention(q, k, v, causal=causal)
    return q, k, v, base


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
        for vf in ("float", "q4_0"):
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
