"""Dot4GroupQueryAttention on the CPU EP against the reference: GroupQueryAttention's semantics over the packed,
in-place KV cache (docs/ops.md, "Packed cache")."""
from __future__ import annotations

import numpy as np
import pytest

from cache_cases import CPU_CASES, TIGHT_CASES, assert_only_new_rows_changed, cache_with_garbage, case_id
from cache_cases import bound_run as _bound_run, expect as _expect, make_inputs as _inputs, run as _run
from dot4attn import formats, reference as ref
from dot4attn.onnx_builders import cache_attention_model, session

@pytest.mark.parametrize("case", CPU_CASES, ids=case_id)
def test_prompt_then_decode_matches_reference(case):
    """A right-padded batch prompt, then decode steps with past != present (the buffers grow), every step against
    the reference fed the op's own previous caches."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, layout = case
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=int(rotary), rotary_interleaved=int(inter), v_format=vf,
                 cache_layout=layout)
    sess = session(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, packed_qkv=packed, rotary=rotary,
                                         interleaved=inter, qk_norm=norm, v_format=vf, cache_layout=layout))
    atol = 2e-3 if dtype == np.float16 else 1e-4
    S = 9
    lens = [S - 3 * b for b in range(B)]  # right padding: row b holds lens[b] real tokens
    feeds = _inputs(B, S, hq, hkv, d, dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf,
                    cache_layout=layout)
    out, f = _run(sess, feeds, [n - 1 for n in lens], S)
    _expect(f, attrs, out, atol)
    assert not np.any(out[0].reshape(B, S, -1)[1, lens[1]:]) if B > 1 else True  # padding rows are zeros
    past_k, past_v = out[1], out[2]
    for step in range(3):
        total = [n + 1 + step for n in lens]
        step_feeds = _inputs(B, 1, hq, hkv, d, dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm,
                             v_format=vf, seed=step + 1, cache_layout=layout)
        step_feeds.update(past_key=past_k, past_value=past_v)
        if rotary:
            step_feeds.update(cos_cache=feeds["cos_cache"], sin_cache=feeds["sin_cache"])
        if norm:
            step_feeds.update(q_norm_weight=feeds["q_norm_weight"], k_norm_weight=feeds["k_norm_weight"])
        out, f = _run(sess, step_feeds, [t - 1 for t in total], max(total))
        _expect(f, attrs, out, atol)
        assert out[1].shape[2] == max(past_k.shape[2], max(total))
        past_k, past_v = out[1], out[2]


@pytest.mark.parametrize("case", TIGHT_CASES, ids=case_id)
def test_tight_layout_holds_the_rows_layouts_values(case):
    """cache_layout 'tight' against 'rows' on the same inputs, each on a shared buffer of L rows (the tight layout's
    only use): a right-padded prompt, then decode steps. The outputs are equal to the last bit; the tight tensors
    hold every token's payload in one run and its scales in the next, and each token's parts are the rows layout's
    row without its zero padding; they are the reference's byte for byte (V always, K where no rotation or norm,
    float math in another order, comes first)."""
    B, hq, hkv, d, dtype, packed, rotary, inter, norm, vf, _ = case
    kw = dict(dtype=dtype, packed=packed, rotary=rotary, qk_norm=norm, v_format=vf)
    k_row, v_row = formats.cache_row_widths(d, vf, "tight")
    assert (k_row, v_row) == (d + d // 16, formats.payload_bytes(d, vf) + d // 16)
    sess = {layout: session(cache_attention_model(dtype, num_heads=hq, kv_num_heads=hkv, packed_qkv=packed,
                                                  rotary=rotary, interleaved=inter, qk_norm=norm, v_format=vf,
                                                  cache_layout=layout)) for layout in ("rows", "tight")}
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=int(rotary), rotary_interleaved=int(inter), v_format=vf,
                 cache_layout="tight")
    S, L = 9, 16
    lens = [S - 3 * b for b in range(B)]
    first = _inputs(B, S, hq, hkv, d, **kw)
    bufs = {layout: tuple(np.zeros((B, hkv, L, w), np.uint8) for w in formats.cache_row_widths(d, vf, layout))
            for layout in sess}
    atol = 2e-3 if dtype == np.float16 else 1e-4
    for step in range(4):
        seqlens = [n - 1 for n in lens] if step == 0 else [n - 1 + step for n in lens]
        total = S if step == 0 else max(lens) + step
        feeds = first if step == 0 else _inputs(B, 1, hq, hkv, d, seed=step, **kw)
        feeds = dict(feeds, **{n: first[n] for n in ("cos_cache", "sin_cache", "q_norm_weight", "k_norm_weight")
                               if n in first})
        before = {layout: (bk.copy(), bv.copy()) for layout, (bk, bv) in bufs.items()}
        outs = {}
        for layout, (bk, bv) in bufs.items():
            out, nk, nv = _bound_run(sess[layout], dict(feeds, past_key=bk, past_value=bv), seqlens, total, bk, bv)
            nk, nv = nk.copy(), nv.copy()  # on the CPU they may view bk / bv, which the next step replaces
            outs[layout] = (out, nk, nv)
            bufs[layout] = (nk, nv)
        f = dict(feeds, past_key=before["tight"][0], past_value=before["tight"][1],
                 seqlens_k=np.asarray(seqlens, np.int32), total_sequence_length=np.asarray(total, np.int32))
        want = ref.group_query_attention_packed(
            f["query"], f.get("key"), f.get("value"), f["past_key"], f["past_value"], f["seqlens_k"],
            f["total_sequence_length"], f.get("cos_cache"), f.get("sin_cache"), f.get("q_norm_weight"),
            f.get("k_norm_weight"), **attrs)
        (o_r, k_r, v_r), (o_t, k_t, v_t) = outs["rows"], outs["tight"]
        assert k_t.shape == (B, hkv, L, k_row) and v_t.shape == (B, hkv, L, v_row)
        assert np.array_equal(o_t, o_r), f"step {step}: tight output != rows output"
        tk, tv = ref.tight_rows(k_t, d, "q8_0"), ref.tight_rows(v_t, d, vf)
        assert np.array_equal(tk, k_r[..., :k_row]) and not k_r[..., k_row:].any(), f"step {step}: K"
        assert np.array_equal(tv, v_r[..., :v_row]) and not v_r[..., v_row:].any(), f"step {step}: V"
        assert np.array_equal(ref.tight_tensor(tk, d, "q8_0"), k_t)  # the two runs, and nothing else
        assert np.array_equal(v_t, want[2]), f"step {step}: tight V tensor != the reference's"
        if not rotary and not norm:
            assert np.array_equal(k_t, want[1]), f"step {step}: tight K tensor != the reference's"
        np.testing.assert_allclose(o_t.astype(np.float32), want[0].astype(np.float32), atol=atol, rtol=0)


def test_tight_layout_refuses_an_unshared_cache():
    """present buffers of their own (a runtime that copies the past, as genai's beam search or an unshared cache):
    the tight layout keeps a token's bytes in two runs of the tensor, which such copies would mix, so the op refuses
    with the reason and leaves the inputs as they were."""
    B, hq, hkv, d = 1, 4, 2, 64
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, cache_layout="tight"))
    feeds = _inputs(B, 1, hq, hkv, d, past_rows=16, cache_layout="tight")
    k0 = feeds["past_key"].copy()
    with pytest.raises(Exception, match=_re(
            "Dot4GroupQueryAttention: cache_layout 'tight' needs outputs 'present_key' / 'present_value' that share "
            "their past input's buffer (onnxruntime-genai's past_present_share_buffer)")):
        _run(sess, feeds, [8], 9)
    assert np.array_equal(feeds["past_key"], k0)


@pytest.mark.parametrize("valid", [[4999, 3000], [4999, 4999]], ids=["own-lengths", "one-length"])
def test_split_k_route_over_a_long_cache(valid):
    """Decode over 5000 keys (the split_k route) of a cache with more rows than valid keys; rows of one length
    attend in one call. The same keys in the tight layout give the rows layout's output to the last bit."""
    B, hq, hkv, d = 2, 8, 2, 128
    feeds = _inputs(B, 1, hq, hkv, d, rotary=True, past_rows=6000, seed=3, max_pos=6000)
    rng = np.random.default_rng(4)
    x = {name: rng.standard_normal((B, hkv, 6000, d)).astype(np.float32) for name in ("past_key", "past_value")}
    outs = {}
    for layout in ("rows", "tight"):
        sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=True,
                                             cache_layout=layout))
        f = dict(feeds, **{name: ref.pack_cache_rows(v, "q8_0", layout) for name, v in x.items()})
        if layout == "rows":
            out, f = _run(sess, f, valid, 5000)
        else:  # the tight layout runs on a shared buffer only
            f = dict(f, **{name: ref.tight_tensor(f[name], d, "q8_0") for name in ("past_key", "past_value")})
            pk, pv = f["past_key"].copy(), f["past_value"].copy()  # the buffer the op appends to
            out = _bound_run(sess, f, valid, 5000, pk, pv)
            f = dict(f, seqlens_k=np.asarray(valid, np.int32), total_sequence_length=np.asarray(5000, np.int32))
        _expect(f, dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, cache_layout=layout), out, 1e-4)
        outs[layout] = out[0]
    assert np.array_equal(outs["tight"], outs["rows"])


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


@pytest.mark.parametrize("layout, v_format, past, message", [
    ("pair", "q8_0", None, "attribute 'cache_layout' = 'pair' needs v_format 'q4_0' or 'q6_0' (K and q4_0 / q6_0 V "
                           "in two rows of D bytes), got v_format 'q8_0'"),
    ("rows", "q5_0", None, "attribute 'v_format': expected 'q8_0', 'q4_0' or 'q6_0', got 'q5_0'"),
    ("rows", "float", None, "attribute 'v_format': expected 'q8_0', 'q4_0' or 'q6_0', got 'float'"),
    ("pair", "q6_0", "rows", "input 'past_key' (3): expected shape [B, kv_num_heads, rows, 64] with B = 1, "
                             "kv_num_heads = 2 (K payloads of D = 64, cache_layout 'pair': both caches D bytes wide)"),
    ("columns", "q4_0", None, "attribute 'cache_layout': expected 'rows', 'pair' or 'tight', got 'columns'"),
    ("tight", "q8_0", "rows", "input 'past_key' (3): expected shape [B, kv_num_heads, rows, 68] with B = 1, "
                              "kv_num_heads = 2 (packed K rows of D = 64, cache_layout 'tight': rows without "
                              "padding), got [1, 2, 16, 80]"),
    ("rows", "q8_0", "tight", "input 'past_key' (3): expected shape [B, kv_num_heads, rows, 80] with B = 1, "
                              "kv_num_heads = 2 (packed K rows of D = 64), got [1, 2, 16, 68]"),
    ("pair", "q4_0", "rows", "input 'past_key' (3): expected shape [B, kv_num_heads, rows, 64] with B = 1, "
                             "kv_num_heads = 2 (K payloads of D = 64, cache_layout 'pair': both caches D bytes wide)"),
])
def test_bad_cache_layouts_are_clear_errors(layout, v_format, past, message):
    """cache_layout 'pair' is for q4_0 / q6_0 V only, names outside rows / pair / tight and V formats the op lacks
    are refused, and a pair- or tight-layout node fed rows-layout caches (or a rows node fed tight ones) says which
    widths it expects."""
    B, hq, hkv, d = 1, 4, 2, 64
    model = cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, v_format=v_format,
                                  cache_layout=layout)
    with pytest.raises(Exception, match=r"Dot4GroupQueryAttention: " + _re(message)):
        sess = session(model)
        feeds = _inputs(B, 1, hq, hkv, d, past_rows=16, v_format=v_format if v_format in ("q4_0", "q6_0") else "q8_0",
                        cache_layout=past or layout)
        _run(sess, feeds, [8], 9)


@pytest.mark.parametrize("vf, padded", [("q8_0", 80), ("q4_0", 48), ("q6_0", 64)])
def test_a_tight_v_cache_of_the_wrong_width_names_the_layout(vf, padded):
    """K rows of the tight width and V rows of the rows layout's (padded) width: the V error names the tight width
    (D = 64: q8_0 68, q4_0 36, q6_0 52) and the layout."""
    B, hq, hkv, d = 1, 4, 2, 64
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, v_format=vf,
                                         cache_layout="tight"))
    feeds = _inputs(B, 1, hq, hkv, d, past_rows=16, v_format=vf, cache_layout="tight")
    assert feeds["past_key"].shape[-1] == 68
    feeds["past_value"] = np.zeros((B, hkv, 16, padded), np.uint8)
    tight_v = {"q8_0": 68, "q4_0": 36, "q6_0": 52}[vf]
    with pytest.raises(Exception, match=r"Dot4GroupQueryAttention: " + _re(
            f"input 'past_value' (4): expected shape [1, 2, 16, {tight_v}] (packed {vf} V rows of D = 64, "
            f"cache_layout 'tight': rows without padding), got [1, 2, 16, {padded}]")):
        _run(sess, feeds, [8], 9)


@pytest.mark.parametrize("vf, d", [("q8_0", 64), ("q4_0", 96), ("q6_0", 128), ("q6_0", 32)])
def test_tight_layout_appends_in_place_and_holds_the_rows_layouts_values(vf, d, isa):
    """The tight layout on a shared buffer (onnxruntime-genai's in-place cache), every CPU ISA path: only the new rows
    change, rows past each batch row's valid length (huge values) are never read, the appended rows are the
    reference's tight rows and the rows layout's without padding, and the output is the rows layout's to the last
    bit."""
    valid = [20, 33, 7]
    B, hq, hkv, L = len(valid), 8, 2, 48
    caches = {layout: cache_with_garbage(np.random.default_rng(11), B, hkv, L, d, valid, layout, vf)
              for layout in ("rows", "tight")}
    k_row, v_row = formats.cache_row_widths(d, vf, "tight")
    assert caches["tight"][0].shape[-1] == k_row and caches["tight"][1].shape[-1] == v_row
    assert np.array_equal(ref.tight_rows(caches["tight"][0], d, "q8_0"), caches["rows"][0][..., :k_row])
    assert np.array_equal(ref.tight_rows(caches["tight"][1], d, vf), caches["rows"][1][..., :v_row])
    feeds = _inputs(B, 1, hq, hkv, d, seed=12, v_format=vf)  # no rotation: K packs exactly as the reference's
    outs, rows = {}, {}
    for layout, (ck, cv) in caches.items():
        sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, v_format=vf,
                                             cache_layout=layout))
        f = dict(feeds, past_key=ck, past_value=cv)
        before_k, before_v = ck.copy(), cv.copy()
        out, nk, nv = _bound_run(sess, f, valid, max(valid) + 1, ck, cv)
        assert_only_new_rows_changed(before_k, before_v, nk, nv, valid, (d, vf) if layout == "tight" else None)
        outs[layout], rows[layout] = out, (nk, nv)
        if layout == "tight":
            ff = dict(f, past_key=before_k, past_value=before_v, seqlens_k=np.asarray(valid, np.int32),
                      total_sequence_length=np.asarray(max(valid) + 1, np.int32))
            want = _expect(ff, dict(num_heads=hq, kv_num_heads=hkv, v_format=vf, cache_layout="tight"),
                           (out, nk, nv), 1e-4)
            assert np.array_equal(nk, want[1]) and np.array_equal(nv, want[2]), "tight rows != the reference's"
    assert np.array_equal(outs["tight"], outs["rows"])
    assert np.array_equal(ref.tight_rows(rows["tight"][0], d, "q8_0"), rows["rows"][0][..., :k_row])
    assert np.array_equal(ref.tight_rows(rows["tight"][1], d, vf), rows["rows"][1][..., :v_row])


@pytest.mark.parametrize("vf, d", [("q4_0", 128), ("q6_0", 128), ("q6_0", 64)])
def test_pair_layout_appends_in_place_and_holds_the_rows_layouts_values(vf, d):
    """The pair layout on a shared buffer: only the new rows change, rows past each batch row's valid length
    (huge values) are never read, and the output is the rows layout's to the last bit (same values, other places)."""
    valid = [20, 33, 7]
    B, hq, hkv, L = len(valid), 8, 2, 48
    rng = np.random.default_rng(11)
    k = rng.standard_normal((B, hkv, L, d)).astype(np.float32)
    v = rng.standard_normal((B, hkv, L, d)).astype(np.float32)
    pk, pv = ref.pack_cache_pair(k, v, vf)
    rk, rv = ref.pack_cache_rows(k), ref.pack_cache_rows(v, vf)
    gk, gv = ref.pack_cache_pair(np.full((d,), 6e4, np.float32), np.full((d,), 6e4, np.float32), vf)
    for b, n in enumerate(valid):
        pk[b, :, n:], pv[b, :, n:] = gk, gv
    feeds = _inputs(B, 1, hq, hkv, d, rotary=True, past_rows=L, seed=12, v_format=vf, cache_layout="pair")
    outs, new_rows = {}, {}
    for layout, ck, cv in (("pair", pk, pv), ("rows", rk, rv)):
        sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=True,
                                             v_format=vf, cache_layout=layout))
        f = dict(feeds, past_key=ck, past_value=cv)
        before_k, before_v = ck.copy(), cv.copy()
        out, nk, nv = _bound_run(sess, f, valid, max(valid) + 1, ck, cv)
        assert_only_new_rows_changed(before_k, before_v, nk, nv, valid)
        outs[layout] = out
        new_rows[layout] = _appended_rows(nk, nv, valid, d, vf, layout)
        if layout == "pair":
            ff = dict(f, past_key=before_k, past_value=before_v, seqlens_k=np.asarray(valid, np.int32),
                      total_sequence_length=np.asarray(max(valid) + 1, np.int32))
            want = _expect(ff, dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, v_format=vf,
                                    cache_layout="pair"), (out, nk, nv), 1e-4)
            assert np.mean(nk != want[1]) < 1e-3 and np.mean(nv != want[2]) < 1e-3
    assert np.array_equal(outs["pair"], outs["rows"])
    for got_pair, got_rows, part in zip(new_rows["pair"], new_rows["rows"], ("K payload", "K scales", "V payload",
                                                                            "V scales")):
        assert np.array_equal(got_pair.view(np.uint8), got_rows.view(np.uint8)), f"appended {part}: pair != rows"


def _appended_rows(k_rows, v_rows, valid, d, vf, layout):
    """(K payload, K scales, V payload, V scales) of the row each batch row appended, whichever the layout."""
    idx = (np.arange(len(valid))[:, None], np.arange(k_rows.shape[1])[None, :], np.asarray(valid)[:, None])
    k, v = k_rows[idx], v_rows[idx]
    if layout == "pair":
        return ref.unpack_cache_pair(k, v, d, vf)
    kp, ks = ref.unpack_cache_rows(k, d, "q8_0")
    vp, vs = ref.unpack_cache_rows(v, d, vf)
    return kp, ks, vp, vs


def _re(s):
    import re
    return re.escape(s)


def _with_rotary_attr_but_no_cos(hq, hkv):
    m = cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, rotary=False)
    for a in m.graph.node[0].attribute:
        if a.name == "do_rotary":
            a.i = 1
    return session(m)


@pytest.mark.parametrize("vf, layout", [("q8_0", "rows"), ("q4_0", "rows"), ("q4_0", "pair"), ("q6_0", "rows"),
                                        ("q6_0", "pair"), ("q8_0", "tight"), ("q4_0", "tight"), ("q6_0", "tight")])
def test_nonfinite_tokens_follow_the_policy(vf, layout):
    """docs/ops.md's non-finite policy through the in-place pack: a NaN in one token's key and an inf in a later
    token's value pack to NaN scales (that block only) and make exactly the query rows that see them NaN; a token
    too large for the float16 scale saturates instead of packing an inf."""
    B, S, hq, hkv, d = 1, 9, 4, 2, 64
    attrs = dict(num_heads=hq, kv_num_heads=hkv, v_format=vf, cache_layout=layout)
    sess = session(cache_attention_model(np.float32, num_heads=hq, kv_num_heads=hkv, v_format=vf,
                                         cache_layout=layout))
    feeds = _inputs(B, S, hq, hkv, d, v_format=vf, seed=5, cache_layout=layout)
    key = feeds["key"].reshape(B, S, hkv, d)
    value = feeds["value"].reshape(B, S, hkv, d)
    key[0, 3, 0, 5] = np.nan     # kv head 0 from token 3 on
    value[0, 6, 1, 40] = np.inf  # kv head 1 from token 6 on
    key[0, 1, 1, :32] = 3e9      # saturates: scale 65504
    if layout == "tight":  # its only use: a shared buffer
        pk, pv = (np.zeros((B, hkv, S, w), np.uint8) for w in formats.cache_row_widths(d, vf, layout))
        out = _bound_run(sess, dict(feeds, past_key=pk, past_value=pv), [S - 1], S, pk, pv)
        f = dict(feeds, past_key=np.zeros_like(pk), past_value=np.zeros_like(pv),
                 seqlens_k=np.asarray([S - 1], np.int32), total_sequence_length=np.asarray(S, np.int32))
    else:
        out, f = _run(sess, feeds, [S - 1], S)
    _expect(f, attrs, out, 1e-4)
    o = out[0].reshape(B, S, hq, d)
    nan_rows = np.isnan(o).all(axis=-1)
    assert np.array_equal(np.isnan(o).any(axis=-1), nan_rows), "poisoned rows must be NaN in every value"
    want = np.zeros((S, hq), bool)
    want[3:, :2] = True  # query heads 0, 1 read kv head 0
    want[6:, 2:] = True
    assert np.array_equal(nan_rows[0], want)
    if layout == "pair":
        _, ks, _, vs = ref.unpack_cache_pair(out[1], out[2], d, vf)
    elif layout == "tight":
        _, ks = ref.unpack_cache_rows(ref.tight_rows(out[1], d, "q8_0"), d, "q8_0")
        _, vs = ref.unpack_cache_rows(ref.tight_rows(out[2], d, vf), d, vf)
    else:
        _, ks = ref.unpack_cache_rows(out[1], d, "q8_0")
        _, vs = ref.unpack_cache_rows(out[2], d, vf)
    assert np.isnan(ks[0, 0, 3]).tolist() == [True, False] and not np.isnan(ks[0, 0, :3]).any()
    assert np.isnan(vs[0, 1, 6]).tolist() == [False, True]
    assert ks[0, 1, 1, 0] == np.float16(65504) and np.isfinite(ks).sum() == ks.size - 1
