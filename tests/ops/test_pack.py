"""PackK / PackV (q8_0, q4_0, q6_0) against the numpy reference (docs/ops.md).

Scales must equal the reference bit for bit; payloads may differ from it only by exactly 1, in at most 0.1% of
the elements (the contract's allowance).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import ALL_ISAS, check_packed, nibbles, pack_session, run_pack, supported_isas
from dot4attn import native
from dot4attn import reference as R
from dot4attn.formats import payload_bytes, payload_dtype

# (op, format attribute, reference format); PackV without the attribute is q8_0.
VARIANTS = {
    "PackK": ("PackK", None, "q8_0"),
    "PackV-q8_0": ("PackV", "q8_0", "q8_0"),
    "PackV-q4_0": ("PackV", "q4_0", "q4_0"),
    "PackV-q6_0": ("PackV", "q6_0", "q6_0"),
    "PackV-default": ("PackV", None, "q8_0"),
}
DTYPES = ("float32", "float16")
# Every legal D (32..256) appears; S is odd in places so rows do not line up with task boundaries.
SHAPES = [(1, 1, 1, 32), (2, 3, 5, 64), (1, 2, 17, 96), (3, 2, 33, 128), (1, 1, 7, 160), (2, 1, 9, 192),
          (1, 2, 11, 224), (1, 4, 100, 256), (2, 2, 700, 128)]
EMPTY_SHAPES = [(0, 2, 3, 64), (2, 0, 3, 32), (1, 2, 0, 128), (0, 0, 0, 256)]


def _data(kind: str, shape, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == "normal":
        pass
    elif kind == "large":  # big but representable in float16, and scales stay finite for q4_0 and q8_0
        x = np.clip(x * 1.5e4, -6e4, 6e4)
    elif kind == "small":
        x = x * 1e-3
    elif kind == "tiny":  # fp16 scales become subnormal or round to zero (then q = 0)
        x = x * np.float32(5e-8 if dtype == "float32" else 2e-7)
        x.reshape(-1, shape[-1])[::2] *= 100  # every other row: subnormal (not zero) fp16 scales
    elif kind == "zeros":  # whole zero blocks, a whole zero row, and signed zeros
        x = x.reshape(*shape[:-1], shape[-1] // 32, 32)
        x[..., ::2, :] = 0
        x = x.reshape(shape)
        x.reshape(-1, shape[-1])[0] = -0.0
    elif kind == "outliers":  # one large value per block, the rest small: exercises clamping to +-127 / -8..7
        x = x * 0.01
        x.reshape(-1, 32)[:, 5] = 50 * np.sign(x.reshape(-1, 32)[:, 5] + 1e-9)
    elif kind == "ties":  # x / s lands exactly on .5: round half to even (q4_0's s = 1)
        x = rng.integers(-14, 14, size=shape).astype(np.float32) / 2  # -7.0 .. 6.5 in steps of 0.5
        x.reshape(-1, 32)[:, 0] = -8.0  # signed max -8 -> q4_0 scale -8 / -8 = 1; q8_0 scale fp16(8/127)
    elif kind == "ties127":
        x = rng.integers(-254, 254, size=shape).astype(np.float32) / 2
        x.reshape(-1, 32)[:, 3] = -127.0  # max|x| = 127 -> q8_0 scale exactly 1, x / s = x (ties to even)
    else:
        raise ValueError(kind)
    return x.astype(dtype)


KINDS = ("normal", "large", "small", "tiny", "zeros", "outliers", "ties", "ties127")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pack_shapes(shape, variant, dtype):
    op, fmt, ref_fmt = VARIANTS[variant]
    x = _data("normal", shape, dtype, seed=sum(shape))
    payload, scales = run_pack(x, op, fmt)
    check_packed(x, payload, scales, ref_fmt, f"{variant} {dtype} X{list(shape)}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["PackK", "PackV-q8_0", "PackV-q4_0", "PackV-q6_0"])
@pytest.mark.parametrize("kind", KINDS)
def test_pack_values(kind, variant, dtype):
    """Value distributions: large / small / subnormal-scale magnitudes, zero blocks, outliers, rounding ties."""
    op, fmt, ref_fmt = VARIANTS[variant]
    shape = SHAPES[(KINDS.index(kind) + len(variant)) % len(SHAPES)]
    shape = (shape[0], shape[1], max(shape[2], 4), shape[3])
    x = _data(kind, shape, dtype, seed=KINDS.index(kind))
    payload, scales = run_pack(x, op, fmt)
    check_packed(x, payload, scales, ref_fmt, f"{variant} {dtype} {kind} X{list(shape)}")
    if kind == "zeros":
        assert not scales.view(np.uint16)[..., ::2].any(), "zero blocks must get scale +0"
    if kind == "tiny" and dtype == "float32":
        assert (scales == 0).any(), "the tiny case is meant to produce zero scales"


def test_pack_ties_are_round_half_even():
    """Direct check of the rounding rule on hand-made blocks whose scale is exactly 1."""
    row4 = np.zeros((1, 1, 1, 32), np.float32)
    row4[..., :8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 6.5, -8.0]  # signed max -8 -> q4_0 scale -8 / -8 = 1
    p4, s4 = run_pack(row4, "PackV", "q4_0")
    assert s4.item(0) == 1.0
    assert (nibbles(p4).reshape(-1)[:8] - 8).tolist() == [0, 2, 2, 0, -2, -2, 6, -8]
    assert (nibbles(p4).reshape(-1)[8:] == 8).all(), "zeros must be stored as u = 8"
    row8 = np.zeros((1, 1, 1, 32), np.float32)
    row8[..., :8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.0]  # max|x| = 127 -> q8_0 scale 1
    for op, fmt in (("PackK", None), ("PackV", "q8_0")):
        p8, s8 = run_pack(row8, op, fmt)
        assert s8.item(0) == 1.0
        assert p8.reshape(-1)[:8].tolist() == [0, 2, 2, 0, -2, -2, 126, -127], (op, p8.reshape(-1)[:8])


# (block values, expected q4_0 scale, expected levels q = u - 8): the signed max v maps to level -8 (s = v / -8),
# the block's other end reaches +8 and clamps to 7, and a tie between +a and -a goes to the positive value.
Q4_LEVEL_CASES = {
    "negative-max": ([-8.0, 7.0, 4.0, -4.0, 1.0], 1.0, [-8, 7, 4, -4, 1]),
    "positive-max": ([8.0, -7.0, 4.0, -4.0, 1.0], -1.0, [-8, 7, -4, 4, -1]),
    "opposite-end-clamps": ([16.0, -16.0, -15.0, 2.0], -2.0, [-8, 7, 7, -1]),  # the tie: +16 -> level -8
    "all-negative": ([-2.0, -1.0, -0.5], 0.25, [-8, -4, -2]),
    "signed-zeros": ([-0.0, 0.0], 0.0, [0, 0]),  # a zero block: scale +0, every u = 8
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(Q4_LEVEL_CASES))
def test_pack_q4_0_uses_16_levels(case, dtype):
    """q4_0's scale (docs/ops.md, PackV): ggml's 16 levels, the block's signed max on level -8."""
    values, scale, levels = Q4_LEVEL_CASES[case]
    x = np.zeros((1, 1, 2, 64), np.float32)
    x[0, 0, 1, 32:32 + len(values)] = values  # the second block of the second row (offsets are exercised too)
    x = x.astype(dtype)
    p, s = run_pack(x, "PackV", "q4_0")
    check_packed(x, p, s, "q4_0", f"q4_0 {case} {dtype}")
    got = s.reshape(-1, 2)[1, 1]
    assert got.view(np.uint16) == np.float16(scale).view(np.uint16), f"scale {got!r}, expected {scale!r}"
    q = nibbles(p).reshape(2, 64)[1, 32:].astype(int) - 8
    assert q[:len(values)].tolist() == levels
    assert not q[len(values):].any(), "zeros must be stored as u = 8"
    assert not s.reshape(-1, 2)[0].view(np.uint16).any(), "the zero blocks' scales must be +0"


# (block values, expected q6_0 scale, expected levels n = u - 32): as q4_0's rule with 64 levels, s = v / -32.
Q6_LEVEL_CASES = {
    "negative-max": ([-32.0, 31.0, 16.0, -5.0, 1.0], 1.0, [-32, 31, 16, -5, 1]),
    "positive-max": ([32.0, -31.0, 16.0, -5.0, 1.0], -1.0, [-32, 31, -16, 5, -1]),
    "opposite-end-clamps": ([64.0, -64.0, -63.0, 2.0], -2.0, [-32, 31, 31, -1]),  # the tie: +64 -> level -32
    "ties-to-even": ([-32.0, 0.5, 1.5, 2.5, -0.5, -1.5, 30.5], 1.0, [-32, 0, 2, 2, 0, -2, 30]),
    "signed-zeros": ([-0.0, 0.0], 0.0, [0, 0]),  # a zero block: scale +0, every u = 32
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(Q6_LEVEL_CASES))
def test_pack_q6_0_uses_64_levels(case, dtype):
    """q6_0's scale and levels (docs/ops.md, PackV): the block's signed max on level -32, the other end clamped to
    31, and where each level's 6 bits go: byte e / 2's nibble (e even: low) and bits 2 (e / 8) of byte 16 + e % 8."""
    values, scale, levels = Q6_LEVEL_CASES[case]
    x = np.zeros((1, 1, 2, 64), np.float32)
    x[0, 0, 1, 32 + 3:32 + 3 + len(values)] = values  # the second block of the second row, from element 3
    x = x.astype(dtype)
    p, s = run_pack(x, "PackV", "q6_0")
    check_packed(x, p, s, "q6_0", f"q6_0 {case} {dtype}")
    got = s.reshape(-1, 2)[1, 1]
    assert got.view(np.uint16) == np.float16(scale).view(np.uint16), f"scale {got!r}, expected {scale!r}"
    block = p.reshape(2, 48)[1, 24:].astype(int)
    for e, n in enumerate([0, 0, 0, *levels] + [0] * (29 - len(levels))):
        u = n + 32
        assert (block[e // 2] >> (4 * (e % 2))) & 15 == u & 15, f"element {e}: low nibble"
        assert (block[16 + e % 8] >> (2 * (e // 8))) & 3 == u >> 4, f"element {e}: high bits"
    assert not s.reshape(-1, 2)[0].view(np.uint16).any(), "the zero blocks' scales must be +0"
    assert (p.reshape(2, 48)[0] == np.array(([0x00] * 16 + [0xAA] * 8) * 2, np.uint8)).all(), "zeros: u = 32"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["PackK", "PackV-q8_0", "PackV-q4_0", "PackV-q6_0"])
@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pack_empty(shape, variant, dtype):
    op, fmt, ref_fmt = VARIANTS[variant]
    x = np.zeros(shape, dtype)
    payload, scales = run_pack(x, op, fmt)
    d = shape[3]
    assert payload.shape == (*shape[:3], payload_bytes(d, ref_fmt))
    assert payload.dtype == np.dtype(payload_dtype(ref_fmt))
    assert scales.shape == (*shape[:3], d // 32) and scales.dtype == np.float16


def test_pack_same_on_every_isa():
    """Packing does not depend on the forced CPU ISA."""
    x = _data("normal", (2, 2, 37, 128), "float32", seed=7)
    outs = {}
    for isa_name in ALL_ISAS:
        if isa_name not in supported_isas():
            continue
        native.force_cpu_isa(isa_name)
        for variant in ("PackK", "PackV-q4_0", "PackV-q6_0"):
            op, fmt, ref_fmt = VARIANTS[variant]
            p, s = run_pack(x, op, fmt)
            check_packed(x, p, s, ref_fmt, f"{variant} ISA {isa_name}")
            outs.setdefault(variant, []).append((p, s))
    for variant, results in outs.items():
        for p, s in results[1:]:
            assert np.array_equal(p, results[0][0]) and np.array_equal(s.view(np.uint16), results[0][1].view(np.uint16))


@pytest.mark.parametrize("variant", ["PackK", "PackV-q4_0", "PackV-q6_0"])
def test_pack_does_not_modify_input(variant):
    op, fmt, _ = VARIANTS[variant]
    for dtype in DTYPES:
        x = _data("normal", (2, 3, 19, 64), dtype, seed=3)
        before = x.copy()
        run_pack(x, op, fmt)
        assert np.array_equal(x.view(np.uint8), before.view(np.uint8)), f"{variant} modified its {dtype} input"


def test_pack_output_types_declared():
    """The session reports the outputs' dtypes (int8 / uint8 payload, float16 scales)."""
    for op, fmt, ptype in (("PackK", None, "tensor(int8)"), ("PackV", "q8_0", "tensor(int8)"),
                           ("PackV", "q4_0", "tensor(uint8)"), ("PackV", "q6_0", "tensor(uint8)")):
        outs = pack_session(op, "float32", fmt).get_outputs()
        assert [o.type for o in outs] == [ptype, "tensor(float16)"]


@pytest.mark.parametrize("head_dim", ["static", "symbolic"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q6_0"])
def test_pack_outputs_feed_attention_in_one_graph(fmt, head_dim):
    """PackK / PackV outputs feed Dot4Attention inside one graph: their types must be inferred (docs/ops.md:
    "PackK/PackV outputs carry full type and shape inference"), also when the head dim D is symbolic."""
    from onnx import TensorProto, helper

    from conftest import new_session

    D = 64
    dims = lambda p: [f"{p}0", f"{p}1", f"{p}2", D if head_dim == "static" else f"{p}3"]  # noqa: E731
    vi = lambda n, p: helper.make_tensor_value_info(n, TensorProto.FLOAT, dims(p))  # noqa: E731
    nodes = [helper.make_node("PackK", ["key"], ["kp", "ks"], domain="dot4attn"),
             helper.make_node("PackV", ["value"], ["vp", "vs"], domain="dot4attn", format=fmt),
             helper.make_node("Dot4Attention", ["query", "kp", "ks", "vp", "vs"], ["output"], domain="dot4attn",
                              v_format=fmt, causal=1)]
    graph = helper.make_graph(nodes, "g", [vi("query", "q"), vi("key", "k"), vi("value", "v")], [vi("output", "o")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dot4attn", 1)])
    model.ir_version = 9
    sess = new_session(model)
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 3, D), dtype=np.float32)
    k = rng.standard_normal((2, 2, 50, D), dtype=np.float32)
    v = rng.standard_normal((2, 2, 50, D), dtype=np.float32)
    out = sess.run(None, {"query": q, "key": k, "value": v})[0]
    kp, ks = R.pack_k(k)
    vp, vs = R.pack_v(v, fmt)
    err = R.nmse(out, R.attention(q, kp, ks, vp, vs, causal=1, v_format=fmt))
    assert err <= 1e-6, f"PackK+PackV({fmt})+Dot4Attention: NMSE {err:.3e}"
