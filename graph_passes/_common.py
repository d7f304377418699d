"""Shared machinery of the attention rules: K/V tracing to the cache Concat, mask conversion, op emission.

Every rule matches one attention core (Q, K after the GQA repeat, V after the GQA repeat, optional mask) and
calls `AttentionRewriter.check_core` / `emit`: those trace K and V back through the GQA repeat
(Unsqueeze -> Expand -> Reshape) to the cache Concat `Concat(past_key_values.N.key, k_new)`, pack `k_new`
with PackK, concatenate it to the packed past (new graph inputs created by the driver) and emit
Dot4Attention on the un-repeated (Hkv-head) packed K and V.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern
from onnxscript.rewriter._basics import MatchFailureError

from .. import DOMAIN
from ..formats import BLOCK, payload_bytes, payload_dtype

BIG_NEGATIVE = -1e4  # any additive mask constant at or below this removes a key


@dataclass
class LayerIO:
    """The packed cache values of one layer, created by the driver (inputs) and by the rules (outputs)."""

    index: int
    past_key: ir.Value
    past_value: ir.Value
    key_payload_in: ir.Value
    key_scales_in: ir.Value
    value_payload_in: ir.Value | None = None
    value_scales_in: ir.Value | None = None
    present_key: ir.Value | None = None       # the old float Concat outputs
    present_value: ir.Value | None = None
    new: dict = field(default_factory=dict)   # name suffix -> new ir.Value (present.N.<suffix>)
    rule: str | None = None
    attn_out: ir.Value | None = None
    mask_kind: str | None = None
    gqa: str | None = None


@dataclass
class RewriteOptions:
    v_format: str = "float"
    route: str = "auto"
    split_k_min_keys: int = 2048
    causal: str = "mask"  # "mask": causal=0 and the model's mask does the work (always correct)


class PassState:
    def __init__(self, layers: dict[int, LayerIO], options: RewriteOptions):
        self.layers = layers
        self.options = options
        self.by_past = {}
        for lio in layers.values():
            self.by_past[lio.past_key] = (lio, "key")
            self.by_past[lio.past_value] = (lio, "value")


def _producer(v: ir.Value | None, op_type: str | None = None):
    if v is None:
        return None
    n = v.producer()
    if n is None:
        return None
    if op_type is not None and (n.op_type != op_type or n.domain not in ("", "ai.onnx")):
        return None
    return n


def strip_gqa_repeat(v: ir.Value) -> tuple[ir.Value, str]:
    """x[B,Hkv,S,D] -> Unsqueeze(2) -> Expand -> Reshape [B,Hq,S,D]  ==>  x  (also Tile / repeat_interleave forms)."""
    r = _producer(v, "Reshape")
    if r is not None:
        e = _producer(r.inputs[0], "Expand")
        if e is not None:
            u = _producer(e.inputs[0], "Unsqueeze")
            if u is not None:
                axes = _ir_utils.get_numpy_value(u.inputs[1]) if len(u.inputs) > 1 else None
                if axes is None:
                    a = u.attributes.get("axes")
                    axes = np.array(a.as_ints()) if a is not None else None
                if axes is not None and [int(x) for x in np.ravel(axes)] in ([2], [-3]):
                    return u.inputs[0], "unsqueeze-expand-reshape"
    return v, "none"


def trace_cache(v: ir.Value, state: PassState, kind: str) -> tuple[LayerIO, ir.Value]:
    """v (the un-repeated K or V) must be Concat(past_key_values.N.<kind>, new, axis=2). Returns (layer, new)."""
    c = _producer(v, "Concat")
    if c is None or len(c.inputs) != 2:
        raise MatchFailureError(f"{kind} is not a cache Concat(past, new)", v)
    axis = c.attributes.get_int("axis", 0)
    if axis not in (2, -2):
        raise MatchFailureError(f"{kind} cache Concat is on axis {axis}, not the sequence axis", c)
    past, new = c.inputs
    # TorchScript wraps the past in a 1-input Concat.
    inner = _producer(past, "Concat")
    if inner is not None and len(inner.inputs) == 1:
        past = inner.inputs[0]
    if past not in state.by_past:
        raise MatchFailureError(f"{kind} cache Concat does not read a past_key_values.N.{kind} input", c)
    lio, k = state.by_past[past]
    if k != kind:
        raise MatchFailureError(f"{kind} comes from past_key_values.{lio.index}.{k}", c)
    return lio, new


def _value_of(v: ir.Value | None):
    if v is None:
        return None
    return _ir_utils.get_singleton_value(v)


def convert_mask(mask: ir.Value | None) -> tuple[ir.Value | None, str]:
    """An additive mask made from a boolean one (Where(m, 0, -big) or Mul(Cast(Not(m)), -big)) gives back m."""
    if mask is None:
        return None, "none"
    ex = _producer(mask, "Expand")
    if ex is not None:  # Dot4Attention broadcasts the mask itself
        inner, kind = convert_mask(ex.inputs[0])
        if inner is not None and kind.startswith("bool"):
            return inner, kind + " (Expand dropped)"
    w = _producer(mask, "Where")
    if w is not None:
        a, b = _value_of(w.inputs[1]), _value_of(w.inputs[2])
        if a is not None and b is not None and a == 0 and b <= BIG_NEGATIVE:
            return w.inputs[0], "bool (from Where(m, 0, -big))"  # Where's condition is bool by the spec
    mu = _producer(mask, "Mul")
    if mu is not None:
        for x, c in ((mu.inputs[0], mu.inputs[1]), (mu.inputs[1], mu.inputs[0])):
            cv = _value_of(c)
            cast = _producer(x, "Cast")
            if cv is not None and cv <= BIG_NEGATIVE and cast is not None:
                nt = _producer(cast.inputs[0], "Not")
                if nt is not None and nt.inputs[0].dtype in (None, ir.DataType.BOOL):
                    return nt.inputs[0], "bool (from Mul(Cast(Not(m)), -big))"
    if mask.dtype == ir.DataType.BOOL:
        return mask, "bool"
    return mask, "additive"


def scale_value(bindings: dict, tag: str, name: str) -> float:
    kind = bindings.get(tag, "None")
    if kind == "None":
        return 1.0
    v = _ir_utils.get_singleton_value(bindings.get(name))
    if v is None:
        raise MatchFailureError(f"{name} is not a constant scalar", bindings.get(name))
    return float(v) if kind == "Mul" else 1.0 / float(v)


def head_dim(v: ir.Value) -> int | None:
    if v.shape is not None and len(v.shape) == 4 and isinstance(v.shape[3], int):
        return int(v.shape[3])
    return None


@dataclass
class CoreMatch:
    layer: LayerIO
    query: ir.Value
    k_new: ir.Value
    v_new: ir.Value
    v_present: ir.Value
    mask: ir.Value | None
    mask_kind: str
    scale: float
    gqa: str
    causal: int = 0


def check_core(state: PassState, rule_name: str, query, key, value, mask, scale: float | None,
               causal: int = 0) -> CoreMatch:
    """query [B,Hq,Sq,D], key/value as the attention sees them (possibly GQA-repeated)."""
    k_src, gqa_k = strip_gqa_repeat(key)
    v_src, gqa_v = strip_gqa_repeat(value)
    lio, k_new = trace_cache(k_src, state, "key")
    lio_v, v_new = trace_cache(v_src, state, "value")
    if lio_v is not lio:
        raise MatchFailureError(f"K from layer {lio.index} but V from layer {lio_v.index}", key)
    if lio.rule is not None:
        raise MatchFailureError(f"layer {lio.index} already rewritten", key)
    if query.dtype not in (None, ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise MatchFailureError(f"query dtype {query.dtype} is not float32/float16", query)
    d = head_dim(query) or head_dim(k_src)
    if d is not None and (d % 32 or not 32 <= d <= 256):
        raise MatchFailureError(f"head dim {d} is not a multiple of 32 in [32, 256]", query)
    if scale is None:
        if d is None:
            raise MatchFailureError("default scale needs a static head dim", query)
        scale = 1.0 / math.sqrt(d)
    m, mkind = convert_mask(mask)
    return CoreMatch(lio, query, k_new, v_new, v_src, m, mkind, float(scale), gqa_k, causal)


def attribute_scale(attributes) -> float | None:
    """A fused attention node's `scale` attribute; None when it has none (then 1/sqrt(head dim))."""
    return attributes.get_float("scale", None) if "scale" in attributes else None


class AttentionRule(pattern.RewriteRuleClassBase):
    """One attention form: subclasses give `pattern` and a `check` that ends in `match_core`; `rewrite` emits the
    dot4attn ops for the match it recorded."""

    rule_name = "attention"

    def __init__(self, state: PassState):
        super().__init__(name=self.rule_name)
        self.state = state
        self._cm = None

    def match_core(self, query, key, value, mask, scale: float | None) -> bool:
        self._cm = check_core(self.state, self.rule_name, query, key, value, mask, scale)
        return True

    def rewrite(self, op, **_):
        return emit(op, self.state, self.rule_name, self._cm)


def emit(op, state: PassState, rule_name: str, cm: CoreMatch):
    """Emit PackK (+ PackV), the packed-cache Concats and Dot4Attention; record the new present values."""
    opts = state.options
    lio = cm.layer
    _annotate_new_rows(cm.k_new, lio.past_key)
    _annotate_new_rows(cm.v_new, lio.past_value)
    kp, ks = op.PackK(cm.k_new, _domain=DOMAIN, _version=1, _outputs=2)
    pres_kp = op.Concat(lio.key_payload_in, kp, axis=2)
    pres_ks = op.Concat(lio.key_scales_in, ks, axis=2)
    lio.new = {"key_payload": pres_kp, "key_scales": pres_ks}
    if opts.v_format == "float":
        v_in, v_sc = cm.v_present, None
    else:
        vp, vs = op.PackV(cm.v_new, format=opts.v_format, _domain=DOMAIN, _version=1, _outputs=2)
        v_in = op.Concat(lio.value_payload_in, vp, axis=2)
        v_sc = op.Concat(lio.value_scales_in, vs, axis=2)
        lio.new.update({"value_payload": v_in, "value_scales": v_sc})
    attrs = dict(scale=float(cm.scale), causal=int(cm.causal), v_format=opts.v_format, route=opts.route,
                 split_k_min_keys=int(opts.split_k_min_keys))
    out = op.Dot4Attention(cm.query, pres_kp, pres_ks, v_in, v_sc, cm.mask, _domain=DOMAIN, _version=1, **attrs)
    # Type/shape of the new values (ORT cannot infer Dot4Attention's type with "" optional inputs).
    out.dtype = cm.query.dtype or ir.DataType.FLOAT
    if cm.query.shape is not None:
        out.shape = ir.Shape(cm.query.shape)
    _set_packed_types(lio, kp, ks, pres_kp, pres_ks, cm.k_new)
    if opts.v_format != "float":
        _set_packed_types(lio, vp, vs, v_in, v_sc, cm.v_new, opts.v_format)
    lio.rule = rule_name
    lio.attn_out = out
    lio.mask_kind = cm.mask_kind
    lio.gqa = cm.gqa
    return out


def _static_dim(d):
    if isinstance(d, int):
        return d
    try:
        return int(str(d))
    except (TypeError, ValueError):
        return d


def _annotate_new_rows(v: ir.Value, past: ir.Value) -> None:
    """Give the new K/V rows [B, Hkv, S_new, D] a full shape (TorchScript graphs carry none): ONNX Runtime's
    inference through the custom ops then has every dim known or named."""
    ps = past.shape
    if ps is None or len(ps) != 4:
        return
    if v.dtype is None:
        v.dtype = past.dtype
    sh = v.shape
    if sh is not None and len(sh) == 4 and all(x is not None for x in sh):
        return
    dims = [_static_dim(ps[0]), _static_dim(ps[1]), ir.SymbolicDim(f"{v.name or 'new'}_seq"), _static_dim(ps[3])]
    if sh is not None and len(sh) == 4:
        dims = [a if a is not None else b for a, b in zip(sh, dims)]
    v.shape = ir.Shape(dims)


def payload_ir_type(fmt: str) -> ir.DataType:
    """The ONNX type of a packed payload: int8 (q8_0) or uint8 (q4_0, q6_0: bit fields)."""
    return ir.DataType.INT8 if payload_dtype(fmt) == "int8" else ir.DataType.UINT8


def _set_packed_types(lio, p, s, pres_p, pres_s, src, fmt="q8_0"):
    p.dtype = pres_p.dtype = payload_ir_type(fmt)
    s.dtype = pres_s.dtype = ir.DataType.FLOAT16
    sh = src.shape
    if sh is not None and len(sh) == 4:
        d = sh[3]
        dp = payload_bytes(d, fmt) if isinstance(d, int) else None
        ds = d // BLOCK if isinstance(d, int) else None
        p.shape = ir.Shape([sh[0], sh[1], sh[2], dp])
        s.shape = ir.Shape([sh[0], sh[1], sh[2], ds])
        pres_p.shape = ir.Shape([sh[0], sh[1], None, dp])
        pres_s.shape = ir.Shape([sh[0], sh[1], None, ds])
