"""The genai rewrite of one GroupQueryAttention node (graph_passes/genai_gqa.py, without a genai folder): it accepts
what ONNX Runtime's current model builder writes at default values, keeps every input at its GroupQueryAttention
position (the op's inputs are GroupQueryAttention's), carries the norm epsilons, and refuses what the op does not
implement by the op's own rules (tests/ops/test_gqa_contract.py), with the reason."""
from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from cache_cases import expect, make_inputs
from dot4attn.onnx_builders import session
from dot4attn.passes.genai_gqa import GenaiRewriteError, rewrite_gqa
from gqa_cases import DEFAULTS, OP, UNIMPLEMENTED_ATTRS, UNIMPLEMENTED_INPUTS, gqa_model

HQ, HKV, D = 4, 2, 64
NORMS = {"q_norm_weight": np.float32, "k_norm_weight": np.float32}
RENAME = {"past_key": "past_key_values.0.key", "past_value": "past_key_values.0.value",
          "present_key": "present.0.key", "present_value": "present.0.value"}


def builder_layer(**kw) -> ir.Model:
    """One builder layer: a GroupQueryAttention node over float caches named as the builder names them."""
    m = gqa_model(np.float32, HQ, HKV, D, ours=False, rotary=True, **kw)
    for vi in [*m.graph.input, *m.graph.output]:
        vi.name = RENAME.get(vi.name, vi.name)
    node = m.graph.node[0]
    for seq in (node.input, node.output):
        for i, n in enumerate(seq):
            seq[i] = RENAME.get(n, n)
    return ir.from_proto(m)


def rewritten(**kw):
    model = builder_layer(**kw)
    rewrite_gqa(model, "q8_0", head_size=D)
    proto = ir.to_proto(model)
    node = proto.graph.node[0]
    assert (node.domain, node.op_type) == ("dot4attn", OP)
    return proto, node


def _refused(match: str, **kw):
    with pytest.raises(GenaiRewriteError, match=match):
        rewrite_gqa(builder_layer(**kw), "q8_0", head_size=D)


@pytest.mark.parametrize("smooth_softmax", [-1, 0])
def test_builder_defaults_are_accepted_and_norm_weights_keep_their_positions(smooth_softmax):
    """Every refused attribute at its default (causal = 1, ...), the q/k norm epsilons, the norm weights at 14 / 15:
    the rewritten node has the norm weights at 14 / 15, the epsilons and none of the defaults, and its session
    computes the reference's numbers with the epsilons."""
    eps = dict(q_norm_epsilon=0.5, k_norm_epsilon=2.0)
    proto, node = rewritten(attrs=dict(DEFAULTS, smooth_softmax=smooth_softmax, **eps), inputs=NORMS)
    assert list(node.input)[9:] == ["", "", "", "", "", "q_norm_weight", "k_norm_weight"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert set(attrs) == {"num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved", "v_format",
                          "qk_norm_epsilon", "q_norm_epsilon", "k_norm_epsilon"}
    assert attrs["q_norm_epsilon"] == 0.5 and attrs["k_norm_epsilon"] == 2.0
    B, S = 2, 9
    f = make_inputs(B, S, HQ, HKV, D, rotary=True, qk_norm=True, seed=7)
    f.update(seqlens_k=np.array([S - 1, S - 4], np.int32), total_sequence_length=np.array(S, np.int32))
    out = session(proto).run(None, {RENAME.get(k, k): v for k, v in f.items()})
    expect(f, dict(num_heads=HQ, kv_num_heads=HKV, do_rotary=1, scale=float(1 / np.sqrt(D)), **eps), out, 1e-4)


def test_without_norm_weights_the_node_keeps_nine_inputs():
    _, node = rewritten(attrs=DEFAULTS)
    assert len(node.input) == 9
    assert not {a.name for a in node.attribute} & set(DEFAULTS)


@pytest.mark.parametrize("name, value, what", UNIMPLEMENTED_ATTRS, ids=lambda x: str(x))
def test_unimplemented_attribute_is_refused(name, value, what):
    _refused(rf"{name}={re.escape(repr(value))} \(.*{re.escape(what)}.*\) is not supported", attrs={name: value})


@pytest.mark.parametrize("name, index, dtype", UNIMPLEMENTED_INPUTS, ids=lambda x: str(x))
def test_unimplemented_input_is_refused(name, index, dtype):
    _refused(re.escape(f"input {index} ({name}) is not supported"), inputs={name: dtype})


def test_a_used_output_qk_is_refused():
    _refused(re.escape("output 3 (attention scores) is used"), output_qk=True)


@pytest.mark.parametrize("name, value, want", [("local_window_size", 128.0, "INT"), ("softcap", 30, "FLOAT"),
                                               ("k_quant_type", 0, "STRING"), ("q_norm_epsilon", 1, "FLOAT")])
def test_wrongly_typed_attribute_is_refused(name, value, want):
    _refused(f"attribute {name} must be {want}", attrs={name: value}, inputs=NORMS)


@pytest.mark.parametrize("name, value", [("q_norm_epsilon", 0.0), ("k_norm_epsilon", -1.0),
                                         ("qk_norm_epsilon", float("nan"))])
def test_bad_norm_epsilon_is_refused(name, value):
    _refused(f"{name}=.* must be a finite float", attrs={name: value}, inputs=NORMS)


def test_unknown_attribute_is_refused():
    _refused(re.escape("attributes ['new_feature'] are not supported"), attrs={"new_feature": 1})

