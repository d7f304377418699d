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
from dot4attn import native

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
    assert seen["v"] == {"float", "q8_0", "q4_0"}
    assert seen["fills"] == set(P.FILLS)
    assert all(seen[k] for k in ("sk0", "sq_gt_sk", "nan_rows", "dead_rows")), seen
