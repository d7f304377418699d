"""Dot4GroupQueryAttention on the CPU EP against the reference: GroupQueryAttention's semantics over the packed,
in-place KV cache (docs/ops.md, "Packed cache")."""
from __future__ import annotations

import numpy as np
import pytest

from cache_cases import CASES, assert_only_new_rows_changed, cache_with_garbage, case_id
from cache_cases import bound_run as _bound_run, expect as _expect, make_inputs as _inputs, run as _run
from dot4attn import reference as ref
from dot4attn.onnx_builders import cache_attention_model, session

@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prompt_then_decode_matches_reference(case):
    """A right-padded batch prompt, then decode steps with past != present (the buffers grow), every step against
    the reference fed the op's own previous caches."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf = case
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=int(rotary), rotary_interleaved=int(inter), v_format=vf)
    sess = session(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, packed_qkv=packed, rotary=rotary,
                                         interleaved=inter, qk_norm=norm, v_format=vf))
    atol = 2e-3 if dtype == np.float16 else 1e-4
    S = 9
    lens = [S - 3 * b for b in range(B)]  # right padding: row b holds lens[b] real tokens
    feeds = _inputs(B, S, hq, hkv, d, dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf)
    out, f = _run(sess, feeds, [n - 1 for n in lens], S)
    _expect(f, attrs, out, atol)
    assert not np.any(out[0].reshape(B, S, -1)[1, lens[1]:]) if B > 1 else True  # padding rows are zeros
    past_k, past_v = out[1], out[2]
    for step in range(3):
        total = [n + 1 + step for n in lens]
        step_feeds = _inputs(B, 1, hq, hkv, d, dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm,
                             v_format=vf, seed=step + 1)
        step_feeds.update(past_key=past_k, past_value=past_v)
        if rotary:
            step_feeds.update(cos_cache=feeds["cos_cache"], sin_cache=feeds["sin_cache"])
        if norm:
            step_feeds.update(q_norm_weight=feeds["q_norm_weight"], k_norm_weight=feeds["k_norm_weight"])
        out, f = _run(sess, step_feeds, [t - 1 for t in total], max(total))
        _expect(f, attrs, out, atol)
        assert out[1].shape[2] == max(past_k.shape[2], max(total))
        past_k, past_v = out[1], out[2]


@pytest.mark.parametrize("valid", [[4999, 3000], [4999, 4999]], ids=["own-lengths", "one-length"])
def test_split_k_route_over_a_long_cache(valid):
    """Decode over 5000 keys (the split_k route) of a cache with more rows than valid keys; rows of one length
    attend in one call."""
    B, hq, hkv, d = 2, 8, 2, 128
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=True))
    feeds = _inputs(B, 1, hq, hkv, d, rotary=True, past_rows=6000, seed=3, max_pos=6000)
    rng = np.random.default_rng(4)
    for name in ("past_key", "past_value"):
        x = rng.standard_normal((B, hkv, 6000, d)).astype(np.float32)
        feeds[name] = ref.pack_cache_rows(x)
    out, f = _run(sess, feeds, valid, 5000)
    _expect(f, dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1), out, 1e-4)


def test_a_shared_buffer_too_small_for_the_new_rows_is_an_error():
    """genai's buffer holds max_length rows; a step past it is refused by ONNX Runtime's shape check of the bound
    output (present would need more rows), before the op writes anything."""
    B, hq, hkv, d = 1, 4, 2, 64
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv))
    feeds = _inputs(B, 1, hq, hkv, d, past_rows=16)
    k0 = feeds["past_key"].copy()
    with pytest.raises(Exception, match="computed output shape"):
        _bound_run(sess, feeds, [16], 17, feeds["past_key"], feeds["past_value"])
    assert np.array_equal(feeds["past_key"], k0)


@pytest.mark.parametrize("valid", [[20, 33], [20, 20, 33, 33, 7], [30, 30, 30]])
def test_shared_buffer_appends_in_place_and_never_reads_past_the_valid_length(valid):
    """present bound to past's memory: only the new rows change; garbage in the rows after each batch row's
    valid length (huge values, which would dominate the output if read) leaves the output equal to the
    reference's over the valid rows. Consecutive rows of one length attend in one call."""
    B, hq, hkv, d, L = len(valid), 4, 2, 64, 64
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=True))
    rows_k, rows_v = cache_with_garbage(np.random.default_rng(5), B, hkv, L, d, valid)
    feeds = _inputs(B, 1, hq, hkv, d, rotary=True, past_rows=L, seed=6)
    feeds.update(past_key=rows_k, past_value=rows_v)
    before_k, before_v = rows_k.copy(), rows_v.copy()
    out, pk, pv = _bound_run(sess, feeds, valid, max(valid) + 1, rows_k, rows_v)
    f = dict(feeds, seqlens_k=np.asarray(valid, np.int32), total_sequence_length=np.asarray(max(valid) + 1, np.int32))
    want = _expect(f, dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1), (out, pk, pv), 1e-4)
    assert_only_new_rows_changed(before_k, before_v, pk, pv, valid)
    assert np.array_equal(pk, want[1]) or np.mean(pk != want[1]) < 1e-3


@pytest.mark.parametrize("bad, message", [
    ("rows", "input 'past_key' (3): expected shape [B, kv_num_heads, rows, 80]"),
    ("seqlens", "input 'seqlens_k' (5): seqlens_k[0] + 1 = 40 must lie in"),
    ("cos", "input 'cos_cache' (7): is required when do_rotary = 1"),
    ("dtype", "input 'past_value' (4): expected dtype uint8, got float32"),
])
def test_bad_inputs_are_clear_errors(bad, message):
    B, hq, hkv, d = 1, 4, 2, 64
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=True))
    feeds = _inputs(B, 1, hq, hkv, d, rotary=True, past_rows=16)
    seqlens, total = [8], 9
    if bad == "rows":
        feeds["past_key"] = np.zeros((B, hkv, 16, 72), np.uint8)
    elif bad == "seqlens":
        seqlens, total = [39], 9
    elif bad == "cos":
        sess = _with_rotary_attr_but_no_cos(hq, hkv)
        del feeds["cos_cache"], feeds["sin_cache"]
    elif bad == "dtype":
        m = cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=True)
        next(i for i in m.graph.input if i.name == "past_value").type.tensor_type.elem_type = 1  # float
        sess = session(m)
        feeds["past_value"] = np.zeros((B, hkv, 16, 80), np.float32)
    with pytest.raises(Exception, match=r"Dot4GroupQueryAttention: " + _re(message)):
        _run(sess, feeds, seqlens, total)


def _re(s):
    import re
    return re.escape(s)


def _with_rotary_attr_but_no_cos(hq, hkv):
    m = cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=False)
    for a in m.graph.node[0].attribute:
        if a.name == "do_rotary":
            a.i = 1
    return session(m)


@pytest.mark.parametrize("vf", ["q8_0", "q4_0"])
def test_nonfinite_tokens_follow_the_policy(vf):
    """docs/ops.md's non-finite policy through the in-place pack: a NaN in one token's key and an inf in a later
    token's value pack to NaN scales (that block only) and make exactly the query rows that see them NaN; a token
    too large for the float16 scale saturates instead of packing an inf."""
    B, S, hq, hkv, d = 1, 9, 4, 2, 64
    attrs = dict(num_heads=hq, kv_num_heads=hkv, v_format=vf)
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, v_format=vf))
    feeds = _inputs(B, S, hq, hkv, d, v_format=vf, seed=5)
    key = feeds["key"].reshape(B, S, hkv, d)
    value = feeds["value"].reshape(B, S, hkv, d)
    key[0, 3, 0, 5] = np.nan     # kv head 0 from token 3 on
    value[0, 6, 1, 40] = np.inf  # kv head 1 from token 6 on
    key[0, 1, 1, :32] = 3e9      # saturates: scale 65504
    out, f = _run(sess, feeds, [S - 1], S)
    _expect(f, attrs, out, 1e-4)
    o = out[0].reshape(B, S, hq, d)
    nan_rows = np.isnan(o).all(axis=-1)
    assert np.array_equal(np.isnan(o).any(axis=-1), nan_rows), "poisoned rows must be NaN in every value"
    want = np.zeros((S, hq), bool)
    want[3:, :2] = True  # query heads 0, 1 read kv head 0
    want[6:, 2:] = True
    assert np.array_equal(nan_rows[0], want)
    _, ks = ref.unpack_cache_rows(out[1], d, "q8_0")
    _, vs = ref.unpack_cache_rows(out[2], d, vf)
    assert np.isnan(ks[0, 0, 3]).tolist() == [True, False] and not np.isnan(ks[0, 0, :3]).any()
    assert np.isnan(vs[0, 1, 6]).tolist() == [False, True]
    assert ks[0, 1, 1, 0] == np.float16(65504) and np.isfinite(ks).sum() == ks.size - 1
