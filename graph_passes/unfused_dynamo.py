"""Unfused attention as torch.onnx.export(dynamo=True) writes it (and transformers' OnnxExporter, built on it).

    kT  = Reshape(Transpose(Reshape(k, [B*H, S, D]), [0, 2, 1]), [B, H, D, S])    (or Transpose(k, [0,1,3,2]))
    s   = MatMul(Mul(q, sqrt(scale)), Mul(kT, sqrt(scale)))                          (scales as Mul or Div)
    s   = Add(s, mask)                 mask: Where(m, 0, -inf) (dynamo) or Mul(Cast(Not(m)), -big) (transformers)
    p   = Softmax(s, axis=-1)
    p   = Where(IsNaN(p), 0, p)        optional guard
    out = MatMul(p, v)
"""
from __future__ import annotations

from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchFailureError

from . import _common


def key_transposed(op, key):
    k3 = op.Reshape(key, pattern.ANY_VALUE)
    k3t = op.Transpose(k3, perm=[0, 2, 1])
    kt_reshaped = op.Reshape(k3t, pattern.ANY_VALUE)
    kt_direct = op.Transpose(key, perm=[0, 1, 3, 2])
    return pattern.OrValue([kt_reshaped, kt_direct], tag_var="key_layout", tag_values=["reshape3d", "transpose"])


def scaled(op, x, s, tag):
    return pattern.OrValue([op.Mul(x, s), op.Div(x, s), x], tag_var=tag, tag_values=["Mul", "Div", "None"])


def scaled_logits(op, query, kt, query_scale, key_scale, qk_scale):
    """Q·K^T with the scale applied to q, to k^T and/or to the product (each as Mul, Div or absent)."""
    q = scaled(op, query, query_scale, "query_scaling")
    return scaled(op, op.MatMul(q, scaled(op, kt, key_scale, "key_scaling")), qk_scale, "qk_scaling")


def with_additive_mask(op, s, mask):
    return pattern.OrValue([op.Add(s, mask), s], tag_var="has_mask", tag_values=[True, False])


def softmax_pv(op, s, value, nan_fill):
    """Softmax over keys, the optional Where(IsNaN(p), 0, p) guard, then P·V."""
    p = op.Softmax(s, axis=-1)
    p = pattern.OrValue([op.Where(op.IsNaN(p), nan_fill, p), p], tag_var="nan_guard", tag_values=[True, False])
    return op.MatMul(p, value)


class UnfusedAttentionBase(_common.AttentionRule):
    """Shared check; subclasses give the pattern."""

    rule_name = "unfused"

    def check(self, context, query, key, value, mask=None, **b):
        if b.get("nan_guard") and _common._value_of(b.get("nan_fill")) != 0:
            raise MatchFailureError("IsNaN guard does not fill with 0", b.get("nan_fill"))
        scale = (_common.scale_value(b, "query_scaling", "query_scale")
                 * _common.scale_value(b, "key_scaling", "key_scale")
                 * _common.scale_value(b, "qk_scaling", "qk_scale"))
        return self.match_core(query, key, value, mask, scale)


class UnfusedDynamo(UnfusedAttentionBase):
    rule_name = "unfused_dynamo"

    def pattern(self, op, query, key, value, mask, query_scale, key_scale, qk_scale, nan_fill):
        kt = op.Reshape(op.Transpose(op.Reshape(key, pattern.ANY_VALUE), perm=[0, 2, 1]), pattern.ANY_VALUE)
        s = scaled_logits(op, query, kt, query_scale, key_scale, qk_scale)
        return softmax_pv(op, with_additive_mask(op, s, mask), value, nan_fill)


def rules(state):
    return [UnfusedDynamo.rule(state)]
