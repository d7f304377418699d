"""dot4attn.formats, the one Python definition of the cache formats, against the op library's own layout: the
row widths Dot4GroupQueryAttention asks for (its refusal of a wrong width names them) are formats.row_bytes (rows)
and formats.tight_row_bytes (tight), and the bytes-per-token arithmetic agrees with arrays of those rows."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cache_cases import bound_run, make_inputs, run
from dot4attn import formats, reference as ref
from dot4attn.onnx_builders import cache_attention_model, session


@pytest.mark.parametrize("layout", ["rows", "tight"])
@pytest.mark.parametrize("v_format", ["q8_0", "q4_0", "q6_0"])
@pytest.mark.parametrize("d", [32, 64, 96, 128, 160, 192, 224, 256])
def test_the_op_asks_for_the_row_widths_formats_defines(d, v_format, layout):
    width = formats.row_bytes if layout == "rows" else formats.tight_row_bytes
    assert formats.cache_row_widths(d, v_format, layout) == (width(d, "q8_0"), width(d, v_format))
    sess = session(cache_attention_model(np.float32, num_heads=2, kv_num_heads=1, v_format=v_format,
                                         cache_layout=layout))
    feeds = make_inputs(1, 1, 2, 1, d, v_format=v_format, cache_layout=layout)
    if layout == "tight":  # the widths of formats.tight_row_bytes run (on a shared buffer, the layout's only use)
        k, v = (np.zeros((1, 1, 1, width(d, f)), np.uint8) for f in ("q8_0", v_format))
        bound_run(sess, feeds, [0], 1, k, v)
    else:
        run(sess, feeds, [0], 1)  # the widths of formats.row_bytes run
    for name, fmt in (("past_key", "q8_0"), ("past_value", v_format)):
        bad = dict(feeds, **{name: np.zeros((1, 1, 0, width(d, fmt) + 16), np.uint8)})
        with pytest.raises(Exception) as e:
            run(sess, bad, [0], 1)
        widths = [int(w) for w in re.findall(r"(\d+)\] ", str(e.value))]
        assert width(d, fmt) in widths, str(e.value)


def test_bytes_per_token_is_the_rows_of_every_layer_and_head():
    d, layers, heads = 128, 28, 4
    assert formats.row_bytes(d, "q8_0") == 144 and formats.row_bytes(d, "q4_0") == 80  # payload + scales, to 16
    assert formats.bytes_per_token(layers, heads, d, v="q4_0") == layers * heads * (144 + 80)
    assert formats.bytes_per_token(layers, heads, d, v="q4_0", layout="split") == layers * heads * (136 + 72)
    assert formats.bytes_per_token(layers, heads, d, "float16", "float16") == layers * heads * 2 * 2 * d
    assert formats.bytes_per_token(layers, heads, d, v="float", dtype="float32", layout="split") == \
        layers * heads * (136 + 4 * d)
    inputs = [(f"past_key_values.{i}.{p}", (1, heads, "past", formats.row_bytes(d, f)), 1)
              for i in range(layers) for p, f in (("key", "q8_0"), ("value", "q4_0"))]
    assert formats.cache_input_bytes(inputs) == formats.bytes_per_token(layers, heads, d, v="q4_0")
    with pytest.raises(ValueError, match="needs static heads"):
        formats.cache_input_bytes([("past_key_values.0.key", ("b", "h", "s", 64), 2)])
    assert formats.cache_input_bytes([("past_key_values.0.key", (1, 2, "s", "d"), 2)], head_size=64) == 256


def test_q6_0_widths_and_the_pair_layouts_bytes():
    """q6_0: 3D/4 payload bytes; its rows pad to 16 (D = 64: 52 -> 64, D = 128: 104 -> 112); in the pair layout a
    token takes 2 D bytes per head, ORT's int8 cache's (SmolLM2: D = 64, 30 layers, 3 KV heads: 11,520 bytes)."""
    assert [formats.payload_bytes(d, "q6_0") for d in (32, 64, 128, 256)] == [24, 48, 96, 192]
    assert formats.row_bytes(64, "q6_0") == 64 and formats.row_bytes(128, "q6_0") == 112
    assert formats.cache_row_widths(64, "q6_0", "pair") == (64, 64)
    assert formats.bytes_per_token(30, 3, 64, v="q6_0", layout="pair") == 30 * 3 * 2 * 64 == 11520
    payload, v_sc, k_sc = formats.pair_v_row_parts(64, "q6_0")
    assert (payload, v_sc, k_sc) == (slice(0, 48), slice(48, 52), slice(52, 56))
    assert formats.pair_v_row_parts(128, "q4_0") == (slice(0, 64), slice(64, 72), slice(72, 80))
    with pytest.raises(ValueError, match="cache_layout 'pair' needs v_format q4_0 or q6_0, got 'q8_0'"):
        formats.pair_v_row_parts(64, "q8_0")


def test_the_tight_layouts_widths_and_bytes():
    """tight: no padding, tensors of payload + D/16-byte rows (D = 64: K 68, V q8_0 68, q4_0 36, q6_0 52; D = 128:
    136, 136, 72, 104), for every packed V format, on every EP. SmolLM2-135M (30 layers, 3 KV heads,
    D = 64): K + q8_0 V 12,240 bytes per token, ORT's int8 cache 11,520 (+6.25 %), the rows layout 14,400."""
    for d, want in ((64, {"q8_0": 68, "q4_0": 36, "q6_0": 52}), (128, {"q8_0": 136, "q4_0": 72, "q6_0": 104})):
        for vf, v_row in want.items():
            assert formats.check_cache_layout("tight", vf) == "tight"
            assert formats.cache_row_widths(d, vf, "tight") == (d + d // 16, v_row)
            assert formats.head_token_bytes(d, vf, "tight") == v_row == formats.tight_row_bytes(d, vf)
            assert formats.head_token_bytes(d, vf, "tight") == formats.head_token_bytes(d, vf, "split")
            assert formats.bytes_per_token(2, 3, d, v=vf, layout="tight") == 2 * 3 * (d + d // 16 + v_row)
    assert formats.cache_row_widths(64, "q8_0", "rows") == (80, 80)  # 68 padded to 80
    assert formats.bytes_per_token(30, 3, 64, v="q8_0", layout="tight") == 12240
    assert formats.bytes_per_token(30, 3, 64, v="q8_0") == 14400
    assert 12240 / (30 * 3 * 2 * 64) == 1.0625  # ORT's int8 cache: 2 D bytes per token and KV head
    assert formats.bytes_per_token(28, 4, 128, v="q8_0", layout="tight") == 28 * 4 * 272
    with pytest.raises(ValueError, match="cache_layout: expected one of rows, pair, tight, got 'columns'"):
        formats.check_cache_layout("columns", "q8_0")
    with pytest.raises(ValueError, match="layout: expected rows, split, pair or tight, got 'columns'"):
        formats.head_token_bytes(64, "q8_0", "columns")


@pytest.mark.parametrize("fmt", formats.PACKED_FORMATS)
def test_the_tight_tensor_holds_every_payload_then_every_scale(fmt):
    """A tight-layout cache tensor [B, Hkv, L, payload + D/16] is every token row's payload in one run, then every
    token row's float16 scales in the next (token row (b Hkv + h) L + position): the dense tensors' layout, which
    the GPU kernels read with aligned loads; tight_rows gives each token's row (payload, then scales) back."""
    d, shape = 64, (2, 3, 5)
    x = np.random.default_rng(0).standard_normal((*shape, d)).astype(np.float32)
    rows = ref.pack_cache_rows(x, fmt, "tight")
    t = ref.tight_tensor(rows, d, fmt)
    assert t.shape == rows.shape == (*shape, formats.tight_row_bytes(d, fmt))
    payload, scales = ref.unpack_cache_rows(rows, d, fmt)
    n, pb = int(np.prod(shape)), formats.payload_bytes(d, fmt)
    flat = t.reshape(-1)
    assert np.array_equal(flat[:n * pb], payload.view(np.uint8).reshape(-1))
    assert np.array_equal(flat[n * pb:], scales.view(np.uint8).reshape(-1))
    assert n * pb % 16 == 0 and pb % 16 == 0  # both runs start, and every payload row starts, 16-byte aligned
    assert np.array_equal(ref.tight_rows(t, d, fmt), rows)
    with pytest.raises(ValueError, match=f"tight_tensor: expected rows of {formats.tight_row_bytes(d, fmt)} bytes"):
        ref.tight_tensor(rows[..., :-2], d, fmt)
