"""The contract's non-finite and out-of-range cases, one by one, on every route and CPU ISA (docs/ops.md, "Non-finite
and out-of-range values"): NaN / Inf in a K row, V row or query row poison exactly the rows that see them, hidden
keys never do, and blocks past the float16 scale range saturate instead of packing an inf.
tests/ops/test_properties.py covers the same policy with random shapes; these are the readable regressions."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_attention, run_pack
from dot4attn import reference as R
from property_cases import REF_TOL

B, HQ, HKV, SQ, SK, D = 1, 4, 2, 4, 150, 64
ROUTES = ("prefill", "decode", "split_k")


def _qkv(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, HQ, SQ, D), dtype=np.float32)
    k = rng.standard_normal((B, HKV, SK, D), dtype=np.float32)
    v = rng.standard_normal((B, HKV, SK, D), dtype=np.float32)
    return q, k, v


def _run(q, k, v, v_format, route, mask=None, causal=1):
    kp, ks = run_pack(k, "PackK")
    value, vs = (v, None) if v_format == "float" else run_pack(v, "PackV", v_format)
    out = run_attention(q, kp, ks, value, vs, mask, v_format=v_format, causal=causal, route=route)
    ref = R.attention(q, kp, ks, value, vs, mask, causal=causal, v_format=v_format)
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN pattern differs from the reference"
    fin = ~np.isnan(ref)
    assert R.nmse(out[fin], ref[fin]) <= REF_TOL
    return np.isnan(out).all(axis=-1), np.isnan(out).any(axis=-1)


def _rows(spec):
    """bool [B, HQ, SQ] from {(kv head, first query row that sees the poisoned key)} (causal, SQ rows at the end)."""
    want = np.zeros((B, HQ, SQ), bool)
    for hkv, i0 in spec:
        want[0, hkv * (HQ // HKV):(hkv + 1) * (HQ // HKV), i0:] = True
    return want


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("v_format", ["float", "q8_0", "q4_0", "q6_0"])
@pytest.mark.parametrize("where,bad", [("k", np.nan), ("k", np.inf), ("v", np.nan), ("v", -np.inf)])
def test_a_poisoned_key_makes_exactly_the_rows_that_see_it_nan(where, bad, v_format, route, isa):
    q, k, v = _qkv()
    key = SK - 2  # seen by the last two query rows only (causal, bottom-right aligned)
    (k if where == "k" else v)[0, 1, key, 7] = bad
    full, anywhere = _run(q, k, v, v_format, route)
    assert np.array_equal(anywhere, full), "a poisoned row is NaN in all D values"
    assert np.array_equal(full, _rows([(1, SQ - 2)]))


@pytest.mark.parametrize("route", ROUTES)
def test_a_nonfinite_query_poisons_its_own_row_only(route, isa):
    q, k, v = _qkv(1)
    q[0, 2, 1, 40] = np.nan
    q[0, 0, 3, 0] = -np.inf
    full, _ = _run(q, k, v, "q8_0", route)
    want = np.zeros_like(full)
    want[0, 2, 1] = want[0, 0, 3] = True
    assert np.array_equal(full, want)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive"])
def test_hidden_poisoned_keys_do_not_poison(mask_kind, route, isa):
    q, k, v = _qkv(2)
    k[0, 0, SK - 1, 3] = np.nan  # hidden from every row but the last by causal masking
    v[0, 0, 10, 3] = np.inf
    k[0, 1, 20, :] = np.nan
    v[0, 1, 20, :] = np.nan
    mask = None
    if mask_kind == "bool":
        mask = np.ones((1, 1, SQ, SK), bool)
        mask[..., [10, 20]] = False
        mask[0, 0, SQ - 1, SK - 1] = False
    elif mask_kind == "additive":
        mask = np.zeros((1, 1, SQ, SK), np.float32)
        mask[..., [10, 20]] = -np.inf
        mask[0, 0, SQ - 1, SK - 1] = -np.inf
    full, _ = _run(q, k, v, "q8_0", route, mask)
    if mask_kind == "causal":  # keys 10 and 20 are seen by every row; key SK - 1 by the last row
        assert np.array_equal(full, _rows([(0, 0), (1, 0)]))
    else:
        assert not full.any(), "keys hidden by the mask must not reach any row"


@pytest.mark.parametrize("fmt,limit", [("q8_0", 65504 * 127), ("q4_0", 65504 * 8), ("q6_0", 65504 * 32)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_blocks_past_the_float16_scale_range_saturate(fmt, limit, dtype):
    """Above 65504 * 127 (q8_0), 65504 * 8 (q4_0) or 65504 * 32 (q6_0) the float16 scale would round to inf: it
    saturates at 65504 and the values clamp, so the round trip stays finite (float16 inputs never get there). q4_0's
    and q6_0's scales are the signed max over -8 / -32: a positive max gives -65504, a negative one +65504."""
    x = np.random.default_rng(3).standard_normal((1, 1, 4, 64), dtype=np.float32)
    if dtype == "float32":
        x[0, 0, 0, 3] = 1.01 * limit
        x[0, 0, 1, 40] = -1e30
    x[0, 0, 2, :32] = np.float32(65504)
    x = x.astype(dtype)
    payload, scales = run_pack(x, "PackK" if fmt == "q8_0" else "PackV", None if fmt == "q8_0" else fmt)
    ref_p, ref_s = R.pack_v(x, fmt)
    assert np.array_equal(scales.view(np.uint16), ref_s.view(np.uint16)) and np.array_equal(payload, ref_p)
    assert np.isfinite(scales).all() and np.isfinite(R.unpack(payload, scales, fmt)).all()
    sign = -1 if fmt in ("q4_0", "q6_0") else 1  # the block maxima: +1.01 * limit, -1e30
    if dtype == "float32":
        assert scales[0, 0, 0, 0] == sign * 65504 and scales[0, 0, 1, 1] == 65504
    else:
        assert (np.abs(scales) < 65504).all()


def test_nonfinite_blocks_pack_to_a_nan_scale_and_zero_payload():
    x = np.ones((1, 1, 3, 64), np.float32)
    x[0, 0, 0, 1], x[0, 0, 1, 40], x[0, 0, 2, 63] = np.nan, np.inf, -np.inf
    q6_zero = np.array([0] * 16 + [0xAA] * 8, np.uint8)  # u = 32: low nibbles 0, high pairs 2
    for op, fmt, zero in (("PackK", None, 0), ("PackV", "q4_0", 0x88), ("PackV", "q6_0", q6_zero)):
        payload, scales = run_pack(x, op, fmt)
        assert np.isnan(scales).tolist() == [[[[True, False], [False, True], [False, True]]]]
        assert (scales.view(np.uint16)[np.isnan(scales)] == 0x7E00).all()
        blocks = payload.reshape(3, 2, -1)
        assert (blocks[0, 0] == zero).all() and (blocks[1, 1] == zero).all() and (blocks[2, 1] == zero).all()
