"""ai.onnx Attention (opset 23), as torch.onnx.export(dynamo=True, opset_version=23) writes SDPA.

4-D Q/K/V [B, H, S, D]; K/V either GQA-repeated in the graph (Unsqueeze/Expand/Reshape) or with fewer heads
(native GQA, enable_gqa=True). Only the first output is used; no past_key/past_value inputs (the cache Concat
is in the graph), softcap 0, qk_matmul_output_mode 0. is_causal=1 is top-left aligned in ONNX and
Dot4Attention's causal is bottom-right aligned: only is_causal=0 (with the model's mask) is rewritten.
"""
from __future__ import annotations

from onnxscript.rewriter._basics import MatchFailureError

from . import _common


class OnnxAttention(_common.AttentionRule):
    rule_name = "onnx_attention"

    def pattern(self, op, query, key, value, mask):
        with_mask = op.Attention(query, key, value, mask, _allow_other_attributes=True, _outputs=["out"])
        return with_mask

    def check(self, context, query, key, value, mask=None, out=None, **_):
        node = out.producer()
        a = node.attributes
        if a.get_int("is_causal", 0) != 0:
            raise MatchFailureError("is_causal=1 (top-left aligned) is not rewritten", node)
        if a.get_float("softcap", 0.0) != 0.0:
            raise MatchFailureError("softcap is not supported", node)
        if a.get_int("qk_matmul_output_mode", 0) != 0:
            raise MatchFailureError("qk_matmul_output_mode must be 0", node)
        if any(k in a for k in ("q_num_heads", "kv_num_heads")):
            raise MatchFailureError("3-D Attention inputs are not supported", node)
        if len(node.outputs) > 1 and any(o.uses() for o in node.outputs[1:]):
            raise MatchFailureError("Attention's present/qk outputs are used", node)
        return self.match_core(query, key, value, mask, _common.attribute_scale(a))


class OnnxAttentionNoMask(OnnxAttention):
    def pattern(self, op, query, key, value):
        return op.Attention(query, key, value, _allow_other_attributes=True, _outputs=["out"])


def rules(state):
    return [OnnxAttention.rule(state), OnnxAttentionNoMask.rule(state)]
