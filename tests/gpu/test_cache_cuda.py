"""Dot4GroupQueryAttention on ONNX Runtime's CUDA EP against the reference: the case table of the CPU tests
(tests/cache_cases.py), a long split_k cache, and genai's shared in-place device buffer (only the new rows change,
garbage after each batch row's valid length is never read). Sessions disable the CPU fallback, so the op must run
on the GPU (ONNX Runtime copies total_sequence_length to the host for it; seqlens_k stays on the device)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cache_cases import (CASES, assert_only_new_rows_changed, bound_run, cache_with_garbage, case_id, expect,
                         make_inputs, run)
from dot4attn.onnx_builders import cache_attention_model
from test_ort_cuda import _need_gpu, _session_uncached  # noqa: F401 (_need_gpu: autouse, skips without CUDA)

pytestmark = pytest.mark.gpu


def _atol(dtype):
    return 2e-3 if dtype == np.float16 else 1e-4


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prompt_then_decode_matches_reference(case):
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, layout = case
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=int(rotary), rotary_interleaved=int(inter), v_format=vf,
                 cache_layout=layout)
    sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, packed_qkv=packed,
                                                   rotary=rotary, interleaved=inter, qk_norm=norm, v_format=vf,
                                                   cache_layout=layout))
    S = 9
    lens = [S - 3 * b for b in range(B)]
    feeds = make_inputs(B, S, hq, hkv, d, dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf,
                        cache_layout=layout)
    out, f = run(sess, feeds, [n - 1 for n in lens], S)
    expect(f, attrs, out, _atol(dtype))
    past_k, past_v = out[1], out[2]
    for step in range(3):
        total = [n + 1 + step for n in lens]
        sf = make_inputs(B, 1, hq, hkv, d, dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf,
                         seed=step + 1, cache_layout=layout)
        sf.update(past_key=past_k, past_value=past_v)
        for name in ("cos_cache", "sin_cache", "q_norm_weight", "k_norm_weight"):
            if name in feeds:
                sf[name] = feeds[name]
        out, f = run(sess, sf, [t - 1 for t in total], max(total))
        expect(f, attrs, out, _atol(dtype))
        past_k, past_v = out[1], out[2]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("valid", [[5000, 3000], [131072], [4000, 4000, 4000, 700]],
                         ids=["split_k-B2", "split_k-128k", "split_k-B4-one-length-run"])
def test_long_cache_on_a_shared_device_buffer(dtype, valid):
    """Decode over long caches (split_k) bound in place on the device: garbage after each row's valid length
    (values that would dominate the output if read) leaves the result equal to the reference."""
    B, hq, hkv, d = len(valid), 32, 8, 128
    rows = max(valid) + 128
    sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, rotary=True))
    ck, cv = cache_with_garbage(np.random.default_rng(9), B, hkv, rows, d, valid)
    feeds = make_inputs(B, 1, hq, hkv, d, dtype=dtype, rotary=True, past_rows=rows, seed=2, max_pos=rows)
    feeds.update(past_key=ck, past_value=cv)
    k0, v0 = ck.copy(), cv.copy()
    out, pk, pv = bound_run(sess, feeds, valid, max(valid) + 1, ck, cv, device="cuda")
    f = dict(feeds, seqlens_k=np.asarray(valid, np.int32), total_sequence_length=np.asarray(max(valid) + 1, np.int32))
    expect(f, dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1), (out, pk, pv), _atol(dtype))
    assert_only_new_rows_changed(k0, v0, pk, pv, valid)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_q_and_k_norm_epsilons_are_separate(dtype):
    """q_norm_epsilon / k_norm_epsilon (each overriding qk_norm_epsilon, as in GroupQueryAttention) reach the GPU
    prologue's Q and K norms: a prompt and a decode step against the reference under those epsilons. Large
    epsilons against unit-variance heads, so swapping them would fail."""
    B, hq, hkv, d, S = 2, 8, 2, 128, 9
    eps = dict(q_norm_epsilon=0.5, k_norm_epsilon=2.0)
    sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, rotary=True, qk_norm=True,
                                                   **eps))
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, **eps)
    feeds = make_inputs(B, S, hq, hkv, d, dtype=dtype, rotary=True, qk_norm=True, seed=4)
    out, f = run(sess, feeds, [S - 1, S - 4], S)
    expect(f, attrs, out, _atol(dtype))
    sf = make_inputs(B, 1, hq, hkv, d, dtype=dtype, rotary=True, qk_norm=True, seed=5)
    sf.update({k: feeds[k] for k in ("cos_cache", "sin_cache", "q_norm_weight", "k_norm_weight")},
              past_key=out[1], past_value=out[2])
    out, f = run(sess, sf, [S, S - 3], S + 1)
    expect(f, attrs, out, _atol(dtype))
    swapped = dict(attrs, q_norm_epsilon=2.0, k_norm_epsilon=0.5)
    with pytest.raises(AssertionError):
        expect(f, swapped, out, _atol(dtype))


@pytest.mark.parametrize("attrs, inputs, match", [
    ({"causal": 0}, {}, "attribute 'causal' = 0: not supported"),
    ({"local_window_size": 128}, {}, "attribute 'local_window_size' = 128: not supported"),
    ({}, {"position_ids": np.int64}, "input 'position_ids' (9): not supported"),
])
def test_unimplemented_group_query_attention_features_are_refused_on_cuda(attrs, inputs, match):
    """The CUDA EP's kernel is created by the same code as the CPU's (tests/ops/test_gqa_contract.py has every
    case): a session for the CUDA EP is refused when it is created, naming what the op does not implement."""
    from gqa_cases import gqa_model

    m = gqa_model(np.float16, 8, 2, 128, ours=True, rotary=True, attrs=attrs, inputs=inputs)
    with pytest.raises(Exception, match=re.escape(f"Dot4GroupQueryAttention: {match}")):
        _session_uncached(m)
