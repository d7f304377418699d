"""Dot4GroupQueryAttention keeps com.microsoft.GroupQueryAttention's contract (docs/ops.md): a GroupQueryAttention
node laid out as onnxruntime-genai's model builder writes it, with only its domain and op_type changed and packed
uint8 caches, either computes GroupQueryAttention's numbers (up to the cache's quantization) or is refused when its
session is created, the attribute or input named by its GroupQueryAttention name. Nothing is ignored.

The op also checks the unimplemented inputs when it runs, as a backstop; ONNX Runtime always shows the op the
node's inputs at session creation, so no model can reach that check and it has no test here.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from attention_cases import QUALITY_TOL
from cache_cases import expect, make_inputs, run
from conftest import ORT_ERRORS
from dot4attn import reference as ref
from dot4attn.onnx_builders import session
from gqa_cases import DEFAULTS, OP, UNIMPLEMENTED_ATTRS, UNIMPLEMENTED_INPUTS, gqa_model

HQ, HKV, D = 4, 2, 64

def _shown(v) -> str:
    return f"'{v}'" if isinstance(v, str) else f"{v:g}" if isinstance(v, float) else str(v)


def _refused(model, *patterns: str):
    with pytest.raises(ORT_ERRORS) as e:
        session(model)
    msg = str(e.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize("name, value, what", UNIMPLEMENTED_ATTRS, ids=lambda x: str(x))
def test_unimplemented_attribute_is_refused_at_session_creation(name, value, what):
    m = gqa_model(np.float32, HQ, HKV, D, ours=True, rotary=True, attrs={name: value})
    _refused(m, re.escape(f"{OP}: attribute '{name}' = {_shown(value)}: not supported ("), re.escape(what),
             "the op supports")


@pytest.mark.parametrize("name, index, dtype", UNIMPLEMENTED_INPUTS, ids=lambda x: str(x))
def test_unimplemented_input_is_refused_at_session_creation(name, index, dtype):
    m = gqa_model(np.float32, HQ, HKV, D, ours=True, rotary=True, inputs={name: dtype})
    assert list(m.graph.node[0].input).index(name) == index  # GroupQueryAttention's position
    _refused(m, re.escape(f"{OP}: input '{name}' ({index}): not supported ("))


def test_output_qk_is_refused_at_session_creation():
    m = gqa_model(np.float32, HQ, HKV, D, ours=True, rotary=True, output_qk=True)
    _refused(m, re.escape(f"{OP}: output 'output_qk' (3): not supported"))


def test_a_model_with_the_norm_weights_at_the_old_positions_is_told_to_rewrite_again():
    """A model rewritten before the op took GroupQueryAttention's positions has q_norm_weight / k_norm_weight at 9 /
    10: refused by the name GroupQueryAttention gives position 9, with what to do."""
    m = gqa_model(np.float32, HQ, HKV, D, ours=True, rotary=True,
                  inputs={"q_norm_weight": np.float32, "k_norm_weight": np.float32})
    node = m.graph.node[0]
    names = list(node.input)
    old = names[:9] + ["q_norm_weight", "k_norm_weight"]
    del node.input[:]
    node.input.extend(old)
    _refused(m, re.escape(f"{OP}: input 'position_ids' (9): not supported ("), "q_norm_weight", "rewrite it again")


@pytest.mark.parametrize("name, value, want, got", [
    ("local_window_size", 128.0, "an int", "a float"),
    ("causal", "1", "an int", "a string"),
    ("smooth_softmax", [1], "an int", "a list of ints"),
    ("num_heads", 4.0, "an int", "a float"),
    ("softcap", 30, "a float", "an int"),
    ("scale", [0.5], "a float", "a list of floats"),
    ("q_norm_epsilon", 1, "a float", "an int"),
    ("k_quant_type", 0, "a string", "an int"),
    ("v_format", 4, "a string", "an int"),
], ids=lambda x: str(x))
def test_wrongly_typed_attribute_is_a_clear_error(name, value, want, got):
    """ONNX Runtime checks no attribute types of a custom op: a float where an int belongs must not read as the
    default (local_window_size=128.0 would silently mean no window)."""
    m = gqa_model(np.float32, HQ, HKV, D, ours=True, rotary=True, attrs={name: value})
    _refused(m, re.escape(f"{OP}: attribute '{name}': expected {want}, got {got} attribute"))


@pytest.mark.parametrize("name, value", [("q_norm_epsilon", 0.0), ("k_norm_epsilon", -1e-6),
                                         ("q_norm_epsilon", float("inf")), ("qk_norm_epsilon", -1.0)])
def test_bad_norm_epsilon_is_refused(name, value):
    m = gqa_model(np.float32, HQ, HKV, D, ours=True, attrs={name: value},
                  inputs={"q_norm_weight": np.float32, "k_norm_weight": np.float32})
    _refused(m, re.escape(f"{OP}: attribute '{name}': expected a finite float"))


def _ort_feeds(feeds: dict, past_k, past_v) -> dict:
    """The same call for ORT's GroupQueryAttention: float caches instead of packed rows."""
    return dict(feeds, past_key=past_k, past_value=past_v)


@pytest.mark.parametrize("variant", ["builder", "defaults-smooth-softmax--1", "defaults-smooth-softmax-0",
                                     "every-position-written"])
@pytest.mark.parametrize("v_format", ["q8_0", "q4_0", "q6_0"])
def test_default_attributes_are_accepted_and_compute_group_query_attention(variant, v_format):
    """The node as the builder writes it, with every refused attribute written at its default, or with all 17
    inputs and 4 outputs written ("" where omitted): a prompt of a right-padded batch and two decode steps agree
    with the reference exactly (as tests/ops/test_cache_attention.py) and with ONNX Runtime's own
    GroupQueryAttention on the same node within the quantization tolerance (tests/attention_cases.py)."""
    B, S, dtype = 2, 9, np.float32
    attrs = {} if variant == "builder" else dict(DEFAULTS)
    if variant == "defaults-smooth-softmax-0":
        attrs["smooth_softmax"] = 0
    every = variant == "every-position-written"
    kw = dict(rotary=True, attrs=attrs, all_positions=every)
    m = gqa_model(dtype, HQ, HKV, D, ours=True, v_format=v_format, **kw)
    node = m.graph.node[0]
    assert (len(node.input), len(node.output)) == ((17, 4) if every else (12, 3))
    ours = session(m)
    theirs = session(gqa_model(dtype, HQ, HKV, D, ours=False, **kw))
    ref_attrs = dict(num_heads=HQ, kv_num_heads=HKV, do_rotary=1, scale=float(1 / np.sqrt(D)), v_format=v_format)
    lens = [S, S - 4]
    feeds = make_inputs(B, S, HQ, HKV, D, rotary=True, v_format=v_format, seed=11)
    fk, fv = np.zeros((B, HKV, 0, D), dtype), np.zeros((B, HKV, 0, D), dtype)
    seqlens = [n - 1 for n in lens]
    out, f = run(ours, feeds, seqlens, S)
    expect(f, ref_attrs, out, 1e-4)
    want, fk, fv = theirs.run(None, _ort_feeds(f, fk, fv))
    for b, n in enumerate(lens):  # GroupQueryAttention leaves padding rows unspecified
        assert ref.nmse(out[0][b, :n], want[b, :n]) <= QUALITY_TOL[v_format]
    pk, pv = out[1], out[2]
    for step in range(2):
        total = [n + 1 + step for n in lens]
        sf = make_inputs(B, 1, HQ, HKV, D, rotary=True, v_format=v_format, seed=20 + step)
        sf.update(past_key=pk, past_value=pv, cos_cache=feeds["cos_cache"], sin_cache=feeds["sin_cache"])
        out, f = run(ours, sf, [t - 1 for t in total], max(total))
        expect(f, ref_attrs, out, 1e-4)
        want, fk, fv = theirs.run(None, _ort_feeds(f, fk, fv))
        assert ref.nmse(out[0], want) <= QUALITY_TOL[v_format]
        pk, pv = out[1], out[2]


@pytest.mark.parametrize("eps", [dict(q_norm_epsilon=0.5, k_norm_epsilon=2.0), dict(q_norm_epsilon=0.25),
                                 dict(k_norm_epsilon=4.0), dict(qk_norm_epsilon=0.5)], ids=lambda e: str(e))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_q_and_k_norm_epsilons_are_separate(eps, dtype):
    """q_norm_epsilon / k_norm_epsilon override qk_norm_epsilon for Q / K (ONNX Runtime 1.32's GroupQueryAttention):
    the op agrees with the reference under those epsilons and not under qk_norm_epsilon alone. Large epsilons
    against unit-variance heads, so each one visibly changes the result."""
    B, S = 2, 9
    attrs = dict(eps)
    m = gqa_model(dtype, HQ, HKV, D, ours=True, rotary=True, attrs=attrs,
                  inputs={"q_norm_weight": dtype, "k_norm_weight": dtype})
    assert list(m.graph.node[0].input)[14:16] == ["q_norm_weight", "k_norm_weight"]
    sess = session(m)
    feeds = make_inputs(B, S, HQ, HKV, D, dtype=dtype, rotary=True, qk_norm=True, seed=3)
    out, f = run(sess, feeds, [S - 1, S - 3], S)
    ref_attrs = dict(num_heads=HQ, kv_num_heads=HKV, do_rotary=1, scale=float(1 / np.sqrt(D)), **attrs)
    atol = 2e-3 if dtype == np.float16 else 1e-4
    expect(f, ref_attrs, out, atol)
    qk_only = dict(ref_attrs)
    qk_only.pop("q_norm_epsilon", None)
    qk_only.pop("k_norm_epsilon", None)
    if qk_only != ref_attrs:
        with pytest.raises(AssertionError):
            expect(f, qk_only, out, atol)
