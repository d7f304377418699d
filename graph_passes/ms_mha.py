"""com.microsoft MultiHeadAttention, as onnxscript's ort_fusions (optimize_for_ort, "sdpa_via_mha") leave these
graphs: BHSD Q/K/V are turned into 3-D [B, S, H*D] by Transpose(0, 2, 1, 3) + Reshape, K/V after the GQA repeat,
the additive mask as `attention_bias` (input 5), no past_key/past_value inputs (the cache Concat stays in the
graph). The rewrite runs Dot4Attention on the 4-D tensors and gives back [B, S, H*D] with Transpose + Reshape.
"""
from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchFailureError

from . import _common


def _to_3d(op, x):
    return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), pattern.ANY_VALUE)


class MsMultiHeadAttention(_common.AttentionRule):
    rule_name = "ms_multihead_attention"

    def pattern(self, op, query, key, value, mask):
        return op.MultiHeadAttention(_to_3d(op, query), _to_3d(op, key), _to_3d(op, value), None, None, mask,
                                     _domain="com.microsoft", _allow_other_attributes=True, _outputs=["out"])

    def check(self, context, query, key, value, mask=None, out=None, **_):
        node = out.producer()
        a = node.attributes
        if a.get_int("unidirectional", 0) != 0:
            raise MatchFailureError("unidirectional=1 is not rewritten", node)
        if len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            raise MatchFailureError("MultiHeadAttention's present outputs are used", node)
        h = a.get_int("num_heads", 0)
        if query.shape is not None and len(query.shape) == 4 and isinstance(query.shape[1], int) \
                and query.shape[1] != h:
            raise MatchFailureError(f"num_heads {h} != query heads {query.shape[1]}", node)
        return self.match_core(query, key, value, mask, _common.attribute_scale(a))

    def rewrite(self, op, **_):
        out4 = super().rewrite(op)
        t = op.Transpose(out4, perm=[0, 2, 1, 3])
        return op.Reshape(t, op.Constant(value=ir.tensor([0, 0, -1], dtype=ir.DataType.INT64)))


def rules(state):
    return [MsMultiHeadAttention.rule(state)]
