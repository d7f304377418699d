"""Unfused attention as the TorchScript exporter (torch.onnx.export(dynamo=False), optimum) writes it.

    kT  = Transpose(k, [0, 1, 3, 2])
    s   = MatMul(Mul(q, sqrt(scale)), Mul(kT, sqrt(scale)))     or MatMul(q, kT) then Mul/Div by a scalar
    s   = Add(s, mask)                                          or Where(m, s, -big) (boolean mask applied by Where)
    p   = Softmax(s, axis=-1)
    p   = Where(IsNaN(p), 0, p)                                 optional guard
    out = MatMul(p, v)
"""
from __future__ import annotations

from onnxscript.rewriter._basics import MatchFailureError

from . import _common
from .unfused_dynamo import UnfusedAttentionBase, key_transposed, scaled_logits, softmax_pv, with_additive_mask


class UnfusedTorchScriptAddMask(UnfusedAttentionBase):
    rule_name = "unfused_torchscript"

    def pattern(self, op, query, key, value, mask, query_scale, key_scale, qk_scale, nan_fill):
        s = scaled_logits(op, query, op.Transpose(key, perm=[0, 1, 3, 2]), query_scale, key_scale, qk_scale)
        return softmax_pv(op, with_additive_mask(op, s, mask), value, nan_fill)


class UnfusedWhereMask(UnfusedAttentionBase):
    """The boolean mask applied by Where(m, s, -big) instead of an additive one."""

    rule_name = "unfused_where_mask"

    def pattern(self, op, query, key, value, mask, fill, query_scale, key_scale, qk_scale, nan_fill):
        s = scaled_logits(op, query, key_transposed(op, key), query_scale, key_scale, qk_scale)
        return softmax_pv(op, op.Where(mask, s, fill), value, nan_fill)

    def check(self, context, query, key, value, mask=None, fill=None, **b):
        f = _common._value_of(fill)
        if f is None or f > _common.BIG_NEGATIVE:
            raise MatchFailureError("Where mask fill is not a large negative constant", fill)
        return super().check(context, query, key, value, mask, **b)


def rules(state):
    return [UnfusedTorchScriptAddMask.rule(state), UnfusedWhereMask.rule(state)]
