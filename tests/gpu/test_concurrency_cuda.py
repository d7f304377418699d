"""Concurrency on the CUDA EP (the CPU version is tests/ops/test_concurrency.py): one session from 8 threads per
route (split_k takes its partials from ORT's allocator per call: overlapping calls must not share them) and for
Dot4GroupQueryAttention with per-thread caches; two sessions with different routes side by side; a session used
after another was released. Sessions disable the CPU fallback, so every node runs on the GPU. Skips cleanly without
a working CUDA EP or a library built with CUDA kernels (test_ort_cuda's autouse fixture)."""
from __future__ import annotations


import numpy as np
import pytest

import concurrency_cases as CC
from dot4attn import onnx_builders as ob
from test_ort_cuda import _need_gpu, _session_uncached  # noqa: F401 (_need_gpu: autouse, skips without CUDA)

pytestmark = pytest.mark.gpu


def _attention_session(route: str, split_k_min_keys: int | None = None):
    vf = CC.ROUTE_SHAPES[route][-1]
    return _session_uncached(ob.attention_model(np.float32, vf, route=route, split_k_min_keys=split_k_min_keys))


@pytest.mark.parametrize("route", list(CC.ROUTE_SHAPES))
def test_one_session_many_threads(route):
    CC.check_attention_route(_attention_session(route), route)


def test_cache_op_one_session_many_threads():
    sess = _session_uncached(ob.cache_attention_model(np.float32, num_heads=CC.GQA["hq"],
                                                      kv_num_heads=CC.GQA["hkv"], rotary=True))
    CC.check_gqa(sess)


def test_two_sessions_with_different_routes_side_by_side():
    """The same split_k inputs through a forced decode session and a forced split_k session, from 8 threads at
    once: each equals its serial run."""
    spk = _attention_session("split_k")
    dec = _session_uncached(ob.attention_model(np.float32, "float", route="decode"))
    feeds = [CC.attention_inputs("split_k", seed) for seed in range(4)]
    jobs = [(s, f) for f in feeds for s in (dec, spk)]
    serial = [s.run(None, f) for s, f in jobs]
    parallel = CC.run_concurrently(lambda i: jobs[i][0].run(None, jobs[i][1]), list(range(len(jobs))))
    CC.assert_same(serial, parallel, "decode and split_k sessions side by side")


def test_session_after_another_was_released():
    CC.check_release(_attention_session)
