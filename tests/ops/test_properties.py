"""Property-based tests (hypothesis) of PackK, PackV and Dot4Attention against reference.py on the CPU: random
shapes (D 32..256, Hq/Hkv ratios, Sq > Sk, Sk = 0), dtypes, masks in every broadcast form, V formats, every route
forced and auto, every CPU ISA path this machine has, and edge values including NaN / Inf rows and out-of-range
blocks (docs/ops.md, "Non-finite and out-of-range values"). The generator is tests/property_cases.py, shared with
the GPU suite; CI runs its derandomized profile (the same examples every run), DOT4ATTN_FUZZ=long runs 20x more
with DOT4ATTN_FUZZ_SEED.

Sessions are cached per (op, attributes); the examples only vary the inputs, so session creation stays rare.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, seed, settings
from hypothesis import strategies as st

import property_cases as P
from conftest import check_packed, run_attention, run_pack, supported_isas
from dot4attn import formats, native
from dot4attn import reference as R

PACK_EXAMPLES = P.examples(600)
ATTENTION_EXAMPLES = P.examples(1500)


@seed(P.FUZZ_SEED)
@settings(max_examples=PACK_EXAMPLES)
@given(case=P.pack_cases())
def test_pack_properties(case):
    payload, scales = run_pack(case.x, case.op, case.fmt_attr)
    what = repr(case)
    check_packed(case.x, payload, scales, case.fmt, what)
    P.check_pack_policy(case.x, payload, scales, case.fmt, what)


@seed(P.FUZZ_SEED)
@settings(max_examples=ATTENTION_EXAMPLES)
@given(case=P.attention_cases(), isa=st.sampled_from(supported_isas()))
def test_attention_properties(case, isa):
    native.force_cpu_isa(isa)
    try:
        out = run_attention(*case.inputs(), v_format=case.v_format, causal=case.causal, route=case.route)
    finally:
        native.force_cpu_isa(None)
    P.check_attention(out, case.reference(), case, f"{case!r} ISA={isa}")


def test_the_generator_reaches_every_edge():
    """The CI profile's examples cover what the policy is about (guards edits of the generator): non-finite and
    saturating blocks, poisoned and dead rows, every route, mask kind and V format."""
    seen = {"routes": set(), "masks": set(), "v": set(), "fills": set(), "sk0": False, "sq_gt_sk": False,
            "nan_rows": False, "dead_rows": False}

    @seed(P.FUZZ_SEED)
    @settings(max_examples=300)
    @given(case=P.attention_cases())
    def collect(case):
        seen["routes"].add(case.route)
        seen["masks"].add(None if case.mask is None else ("bool" if case.mask.dtype == np.bool_ else "add"))
        seen["v"].add(case.v_format)
        seen["fills"].update(case.fills)
        Sq, Sk = case.query.shape[2], case.k_payload.shape[2]
        seen["sk0"] |= Sk == 0
        seen["sq_gt_sk"] |= Sq > Sk > 0
        ref = case.reference()
        seen["nan_rows"] |= bool(np.isnan(ref).any())
        seen["dead_rows"] |= bool((~P.visible_any(case)).any())

    collect()
    assert seen["routes"] == set(P.ROUTES)
    assert seen["masks"] == {None, "bool", "add"}
    assert seen["v"] == set(P.V_FORMATS)
    assert seen["fills"] == set(P.FILLS)
    assert all(seen[k] for k in ("sk0", "sq_gt_sk", "nan_rows", "dead_rows")), seen


def test_the_gpu_generator_draws_what_the_gpu_kernels_take():
    """The GPU suite's calls (tests/gpu/test_properties_cuda.py, attention_cases(gpu=True)) hold every V format, q6_0
    at head sizes that are multiples of 64 only (formats.gpu_takes), and every one of those."""
    seen = set()

    @seed(P.FUZZ_SEED)
    @settings(max_examples=300)
    @given(case=P.attention_cases(gpu=True))
    def collect(case):
        D = case.query.shape[-1]
        assert formats.gpu_takes(case.v_format, D), f"{case!r}: the GPU kernels do not take it"
        seen.add((case.v_format, D))

    collect()
    assert {v for v, _ in seen} == set(P.V_FORMATS)
    assert {D for v, D in seen if v == "q6_0"} == {64, 128, 192, 256}, seen


@seed(P.FUZZ_SEED)
@settings(max_examples=PACK_EXAMPLES)
@given(case=P.pack_cases())
def test_reference_repacks_its_own_values_bit_for_bit(case):
    """reference.pack_v / unpack round trip: packing the dequantized values gives the same payload and scales bit
    for bit (the signed max lands on the lowest level exactly, so its scale is found again), for every format's
    edge values (NaN blocks, saturated and subnormal scales, zeros)."""
    payload, scales = R.pack_v(case.x, case.fmt)
    with np.errstate(invalid="ignore"):
        values = R.unpack(payload, scales, case.fmt)
    again_p, again_s = R.pack_v(values, case.fmt)
    assert np.array_equal(again_p, payload), f"{case!r}: payload changed on the round trip"
    assert np.array_equal(again_s.view(np.uint16), scales.view(np.uint16)), f"{case!r}: scales changed"


@settings(max_examples=PACK_EXAMPLES)
@given(blocks=st.binary(min_size=24, max_size=24 * 8).filter(lambda b: len(b) % 24 == 0))
def test_q6_0_block_bits_are_a_bijection(blocks):
    """Every q6_0 payload byte string decodes to 32 levels per block in [-32, 31] and packs back to itself (no bit
    of the 24 bytes is unused or shared), and element e's level is byte e / 2's nibble | bits 2 (e / 8) of byte
    16 + e % 8 (docs/ops.md)."""
    payload = np.frombuffer(blocks, np.uint8)[None]
    lv = R.levels(payload, "q6_0")
    assert lv.min() >= -32 and lv.max() <= 31
    u = (lv + 32).astype(np.uint8).reshape(-1, 32)
    assert np.array_equal(R._pack_q6_blocks(u).reshape(payload.shape), payload), "the levels pack back differently"
    b = payload.reshape(-1, 24).astype(int)
    for e in range(32):
        want = ((b[:, e // 2] >> (4 * (e % 2))) & 15) | (((b[:, 16 + e % 8] >> (2 * (e // 8))) & 3) << 4)
        assert np.array_equal(u[:, e], want), f"element {e}"
