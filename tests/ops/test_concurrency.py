"""Concurrency on the CPU EP: one session from 8 threads per route and for Dot4GroupQueryAttention, two sessions
with different route settings side by side, and sessions that outlive (or follow) a released one.
The checks themselves are in tests/concurrency_cases.py (shared with the CUDA version)."""
from __future__ import annotations


import numpy as np
import pytest

import concurrency_cases as CC
from attention_cases import REF_TOL
from conftest import attention_feeds, gaussian_qkv, new_session
from dot4attn import onnx_builders as ob
from dot4attn import reference as R


def _attention_session(route: str, split_k_min_keys: int | None = None):
    vf = CC.ROUTE_SHAPES[route][-1] if route in CC.ROUTE_SHAPES else "q8_0"
    return new_session(ob.attention_model(np.float32, vf, route=route, split_k_min_keys=split_k_min_keys))


@pytest.mark.parametrize("route", list(CC.ROUTE_SHAPES))
def test_one_session_many_threads(route):
    CC.check_attention_route(_attention_session(route), route)


def test_cache_op_one_session_many_threads():
    """Each thread owns its caches (present fed back as past): prompt + 3 decode steps, equal to serial."""
    sess = new_session(ob.cache_attention_model(np.float32, num_heads=CC.GQA["hq"], kv_num_heads=CC.GQA["hkv"],
                                                rotary=True))
    CC.check_gqa(sess)


def test_two_sessions_with_different_routes_side_by_side():
    """Two sessions of the same node, one routed `auto` with the default split_k threshold (decode at 600 keys)
    and one with split_k_min_keys=64 (split_k at 600 keys), run from 4 threads each at once: each equals its own
    serial result, and both match the reference."""
    B, Hq, Hkv, Sq, Sk, D = 1, 8, 2, 1, 600, 128
    a = new_session(ob.attention_model(np.float32, "q8_0"))
    b = new_session(ob.attention_model(np.float32, "q8_0", split_k_min_keys=64))
    assert R.choose_route(Sq, Sk) == "decode" and R.choose_route(Sq, Sk, 64) == "split_k"
    feeds = []
    for seed in range(4):
        q, k, v = gaussian_qkv(np.random.default_rng(seed), B, Hq, Hkv, Sq, Sk, D)
        kp, ks = R.pack_k(k)
        vp, vs = R.pack_v(v, "q8_0")
        feeds.append(attention_feeds(q, kp, ks, vp, vs))
    jobs = [(s, f) for f in feeds for s in (a, b)]
    serial = [s.run(None, f) for s, f in jobs]
    for (s, f), out in zip(jobs[:2], serial[:2]):
        want = R.attention(f["query"], f["k_payload"], f["k_scales"], f["value"], f["v_scales"], v_format="q8_0")
        assert R.nmse(out[0], want) <= REF_TOL
    parallel = CC.run_concurrently(lambda i: jobs[i][0].run(None, jobs[i][1]), list(range(len(jobs))))
    CC.assert_same(serial, parallel, "two sessions (decode / split_k) side by side")


def test_session_after_another_was_released():
    CC.check_release(_attention_session)
