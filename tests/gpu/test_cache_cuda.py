"""Dot4GroupQueryAttention on ONNX Runtime's CUDA EP against the reference: the case table of the CPU tests
(tests/cache_cases.py: q8_0, q4_0 and q6_0 V, rows and pair layouts), V rows and outputs against the CPU EP's, a long
split_k cache, and genai's shared in-place device buffer (only the new rows change, garbage after each batch row's
valid length is never read). Sessions disable the CPU fallback, so the op must run on the GPU (ONNX Runtime copies
total_sequence_length to the host for it; seqlens_k stays on the device)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cache_cases import (CPU_ONLY_CASES, GPU_CASES, GPU_TIGHT_CASES, assert_only_new_rows_changed, bound_run,
                         cache_with_garbage, case_id, expect, make_inputs, run)
from dot4attn import formats, reference as ref
from dot4attn.formats import pair_v_row_parts
from dot4attn.onnx_builders import cache_attention_model, session
from gpu_support import q6_d_message
from test_ort_cuda import _need_gpu, _session_uncached  # noqa: F401 (_need_gpu: autouse, skips without CUDA)

pytestmark = pytest.mark.gpu


def _atol(dtype):
    return 2e-3 if dtype == np.float16 else 1e-4


@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
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


def _prompt_and_step(sess, case):
    """A right-padded batch prompt of 9 tokens and one decode step of case's node on `sess`: (prompt outputs, step
    outputs)."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, layout = case
    kw = dict(dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf, cache_layout=layout)
    S = 9
    lens = [S - 3 * b for b in range(B)]
    feeds = make_inputs(B, S, hq, hkv, d, **kw)
    prompt, _ = run(sess, feeds, [n - 1 for n in lens], S)
    sf = make_inputs(B, 1, hq, hkv, d, seed=1, **kw)
    sf.update({k: feeds[k] for k in ("cos_cache", "sin_cache", "q_norm_weight", "k_norm_weight") if k in feeds},
              past_key=prompt[1], past_value=prompt[2])
    step, _ = run(sess, sf, lens, S + 1)
    return prompt, step


@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_v_rows_and_outputs_equal_the_cpu_eps(case):
    """The CUDA prologue packs V as the CPU EP does, bit for bit (rows layout: whole V rows; pair layout: V's
    payload and scales, the row's K scales follow K's normed and rotated values, float math that may round
    differently), for a prompt and a decode step; the outputs agree within the reference tolerance."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, layout = case
    model = cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, packed_qkv=packed, rotary=rotary,
                                  interleaved=inter, qk_norm=norm, v_format=vf, cache_layout=layout)
    gpu = _prompt_and_step(_session_uncached(model), case)
    cpu = _prompt_and_step(session(model), case)
    v_bytes = slice(None) if layout == "rows" else slice(0, pair_v_row_parts(d, vf)[1].stop)
    for what, g, c in zip(("prompt", "decode step"), gpu, cpu):
        differ = np.count_nonzero(g[2][..., v_bytes] != c[2][..., v_bytes])
        assert differ == 0, f"{case_id(case)} {what}: {differ} V cache bytes differ from the CPU EP's"
        np.testing.assert_allclose(g[0].astype(np.float32), c[0].astype(np.float32), atol=_atol(dtype), rtol=0,
                                   err_msg=f"{case_id(case)} {what}: output vs the CPU EP")


@pytest.mark.parametrize("case", CPU_ONLY_CASES, ids=case_id)
def test_q6_0_at_other_head_sizes_fails_at_run_with_the_planner_message(case):
    """q6_0 V at a head size that is not a multiple of 64 (d = 32, 96): the session is created (the op takes q6_0
    on CUDA), and the run fails with the GPU planner's message, which names D and the CPU EP."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, layout = case
    sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, packed_qkv=packed,
                                                   rotary=rotary, interleaved=inter, qk_norm=norm, v_format=vf,
                                                   cache_layout=layout))
    with pytest.raises(Exception, match=re.escape(q6_d_message(d))):
        _prompt_and_step(sess, case)


@pytest.mark.parametrize("layout,v_format", [("rows", "q8_0"), ("rows", "q6_0"), ("pair", "q6_0")])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("valid", [[5000, 3000], [131072], [4000, 4000, 4000, 700]],
                         ids=["split_k-B2", "split_k-128k", "split_k-B4-one-length-run"])
def test_long_cache_on_a_shared_device_buffer(dtype, valid, layout, v_format):
    """Decode over long caches (split_k) bound in place on the device, q8_0 V rows and q6_0 V in both layouts:
    garbage after each row's valid length (values that would dominate the output if read) leaves the result equal
    to the reference."""
    B, hq, hkv, d = len(valid), 32, 8, 128
    rows = max(valid) + 128
    sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, rotary=True,
                                                   v_format=v_format, cache_layout=layout))
    ck, cv = cache_with_garbage(np.random.default_rng(9), B, hkv, rows, d, valid, layout, v_format)
    feeds = make_inputs(B, 1, hq, hkv, d, dtype=dtype, rotary=True, past_rows=rows, seed=2, max_pos=rows,
                        v_format=v_format, cache_layout=layout)
    feeds.update(past_key=ck, past_value=cv)
    k0, v0 = ck.copy(), cv.copy()
    out, pk, pv = bound_run(sess, feeds, valid, max(valid) + 1, ck, cv, device="cuda")
    f = dict(feeds, seqlens_k=np.asarray(valid, np.int32), total_sequence_length=np.asarray(max(valid) + 1, np.int32))
    expect(f, dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, v_format=v_format, cache_layout=layout),
           (out, pk, pv), _atol(dtype))
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


@pytest.mark.parametrize("d, rot_half, inter, dtype", [
    (256, 128, False, np.float16), (256, 64, True, np.float16), (192, 96, False, np.float32),
    (128, 32, False, np.float32), (128, 48, False, np.float16), (128, 32, True, np.float32),
    (64, 16, False, np.float16), (64, 32, True, np.float16),
], ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_rotary_widths_match_the_reference(d, rot_half, inter, dtype):
    """The GPU prologue's rotations: rotate-half pairs of rot_half = 32, 64, 96 and 128 (in a lane's registers),
    other widths (through shared memory) and interleaved pairs (neighbouring lanes), full and partial (rotary_dim <
    D), for a prompt and a decode step against the reference."""
    B, hq, hkv, S = 2, 4, 2, 9
    sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, rotary=True,
                                                   interleaved=inter))
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, rotary_interleaved=int(inter))
    feeds = make_inputs(B, S, hq, hkv, d, dtype=dtype, rotary=True, rot_half=rot_half, seed=6)
    out, f = run(sess, feeds, [S - 1, S - 4], S)
    expect(f, attrs, out, _atol(dtype))
    sf = make_inputs(B, 1, hq, hkv, d, dtype=dtype, rotary=True, rot_half=rot_half, seed=7)
    sf.update({k: feeds[k] for k in ("cos_cache", "sin_cache")}, past_key=out[1], past_value=out[2])
    out, f = run(sess, sf, [S, S - 3], S + 1)
    expect(f, attrs, out, _atol(dtype))


def test_a_prompt_of_more_rows_than_one_grid_covers():
    """A prompt whose rows (tokens x (Hq + 2 Hkv) heads: 128 x 16 x 4112 = 8.42M) outnumber one grid of the
    prologue's (2^20 blocks of 8 rows): the last Q heads' rows come after the grid's first pass and must still be
    rotated into the query rows. Those heads' outputs (the last KV head's group) and the caches against the
    reference of that group alone."""
    B, S, hq, hkv, d = 128, 16, 4096, 8, 32
    g = hq // hkv
    sess = _session_uncached(cache_attention_model(np.float16, num_heads=hq, kv_num_heads=hkv, rotary=True))
    feeds = make_inputs(B, S, hq, hkv, d, dtype=np.float16, rotary=True, seed=9, max_pos=S)
    lens = [S - 1 - b % 5 for b in range(B)]
    out, f = run(sess, feeds, lens, S)
    last = dict(f, query=feeds["query"][..., (hq - g) * d:], key=feeds["key"][..., (hkv - 1) * d:],
                value=feeds["value"][..., (hkv - 1) * d:], past_key=feeds["past_key"][:, hkv - 1:],
                past_value=feeds["past_value"][:, hkv - 1:])
    part = (out[0][..., (hq - g) * d:], out[1][:, hkv - 1:], out[2][:, hkv - 1:])
    expect(last, dict(num_heads=g, kv_num_heads=1, do_rotary=1), part, _atol(np.float16))


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


def _rows_and_tight(hq, hkv, d, dtype, feeds_of, steps, L, device_rows=None, **model_kw):
    """Each step's (output, present K, present V) of the rows and the tight layout on CUDA, each on its own shared
    device buffer of L rows (device_rows: the rows layout's and tight layout's starting tensors, else zeros)."""
    vf = model_kw.get("v_format", "q8_0")
    outs = {}
    for layout in ("rows", "tight"):
        sess = _session_uncached(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, cache_layout=layout,
                                                       **model_kw))
        if device_rows is not None:
            bk, bv = device_rows[layout]
        else:
            bk, bv = (np.zeros((feeds_of(0)[0]["query"].shape[0], hkv, L, w), np.uint8)
                      for w in formats.cache_row_widths(d, vf, layout))
        outs[layout] = []
        for step in range(steps):
            f, seqlens, total = feeds_of(step)
            out, nk, nv = bound_run(sess, dict(f, past_key=bk, past_value=bv), seqlens, total, bk, bv, "cuda")
            outs[layout].append((out, nk.copy(), nv.copy()))  # copies: the next step's buffers change in place
            bk, bv = nk.copy(), nv.copy()
    return outs


@pytest.mark.parametrize("case", GPU_TIGHT_CASES, ids=case_id)
def test_tight_layout_holds_the_rows_layouts_values_on_cuda(case):
    """The tight layout on CUDA (no row padding; every token's payload in one run of the tensor, its scales in the
    next, which the GPU kernels read as dense K / V with L rows per head), each layout on a shared device buffer: a
    right-padded prompt, then decode steps. The outputs are the rows layout's to the last bit, every token's parts
    are the rows layout's row without its padding, and the outputs match the reference."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, _ = case
    kw = dict(dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf)
    S, L = 9, 16
    lens = [S - 3 * b for b in range(B)]
    first = make_inputs(B, S, hq, hkv, d, **kw)

    def feeds_of(step):
        f = first if step == 0 else make_inputs(B, 1, hq, hkv, d, seed=step, **kw)
        f = dict(f, **{n: first[n] for n in ("cos_cache", "sin_cache", "q_norm_weight", "k_norm_weight") if n in first})
        seqlens = [n - 1 for n in lens] if step == 0 else [n - 1 + step for n in lens]
        return f, seqlens, S if step == 0 else max(lens) + step

    outs = _rows_and_tight(hq, hkv, d, dtype, feeds_of, 4, L, packed_qkv=packed, rotary=rotary, interleaved=inter,
                           qk_norm=norm, v_format=vf)
    k_row, v_row = formats.cache_row_widths(d, vf, "tight")
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=int(rotary), rotary_interleaved=int(inter), v_format=vf,
                 cache_layout="tight")
    past = tuple(np.zeros((B, hkv, L, w), np.uint8) for w in (k_row, v_row))
    for step in range(4):
        (o_r, k_r, v_r), (o_t, k_t, v_t) = outs["rows"][step], outs["tight"][step]
        assert np.array_equal(o_t, o_r), f"step {step}: tight output != rows output"
        assert np.array_equal(ref.tight_rows(k_t, d, "q8_0"), k_r[..., :k_row]), f"step {step}: K"
        assert np.array_equal(ref.tight_rows(v_t, d, vf), v_r[..., :v_row]), f"step {step}: V"
        f, seqlens, total = feeds_of(step)
        f = dict(f, past_key=past[0], past_value=past[1], seqlens_k=np.asarray(seqlens, np.int32),
                 total_sequence_length=np.asarray(total, np.int32))
        expect(f, attrs, (o_t, k_t, v_t), _atol(dtype))
        past = (k_t, v_t)


@pytest.mark.parametrize("S, past", [(1, 4999), (512, 8000)], ids=["split_k-5000-keys", "prefill-512-over-8000"])
def test_tight_layout_over_long_caches_on_cuda(S, past):
    """A long cache in the tight layout on CUDA: a decode step over 5000 keys (split_k) and a 512-token chunk over
    8000 keys (the f16 Q.K prefill at D = 128 from 2048 keys: its K / V float16 copies read from the tight runs),
    each on a shared device buffer of 8704 rows: the rows layout's output and rows to the last bit."""
    B, hq, hkv, d, L = 2, 8, 2, 128, 8704
    rng = np.random.default_rng(7)
    k, v = (rng.standard_normal((B, hkv, L, d)).astype(np.float32) for _ in range(2))
    k[:, :, past:] = v[:, :, past:] = 0
    start = {"rows": (ref.pack_cache_rows(k, "q8_0"), ref.pack_cache_rows(v, "q8_0"))}
    start["tight"] = tuple(ref.tight_tensor(ref.pack_cache_rows(x, "q8_0", "tight"), d) for x in (k, v))
    feeds = make_inputs(B, S, hq, hkv, d, dtype=np.float16, rotary=True, seed=8, max_pos=L)

    def feeds_of(step):
        return feeds, [past + S - 1] * B, past + S

    outs = _rows_and_tight(hq, hkv, d, np.float16, feeds_of, 1, L, device_rows=start, rotary=True)
    (o_r, k_r, v_r), (o_t, k_t, v_t) = outs["rows"][0], outs["tight"][0]
    assert np.isfinite(o_t).all() and np.array_equal(o_t, o_r)
    assert np.array_equal(ref.tight_rows(k_t, d, "q8_0"), k_r[..., :136])
    assert np.array_equal(ref.tight_rows(v_t, d, "q8_0"), v_r[..., :136])
