"""Builders of one-op ONNX models for the dot4attn ops and ORT's GroupQueryAttention baseline (tests, benchmarks,
examples), and a session helper."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import DOMAIN, register
from .formats import PACKED_FORMATS, payload_dtype

_NP2ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}
OPSET = 17


def onnx_dtype(dtype) -> int:
    return _NP2ONNX[np.dtype(dtype)]


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "dot4attn_op", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 9
    return model


def _vi(name: str, dtype, rank: int, prefix: str):
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), [f"{prefix}{i}" for i in range(rank)])


def pack_model(op: str = "PackK", x_dtype=np.float32, fmt: str | None = None) -> onnx.ModelProto:
    """X [B, H, S, D] -> payload, scales (PackK, or PackV with format `fmt`)."""
    attrs = {"format": fmt} if (op == "PackV" and fmt is not None) else {}
    node = helper.make_node(op, ["X"], ["payload", "scales"], domain=DOMAIN, **attrs)
    payload_t = payload_dtype(fmt) if (op == "PackV" and fmt in PACKED_FORMATS) else np.int8  # else: refused
    return _model([node], [_vi("X", x_dtype, 4, "x")],
                  [_vi("payload", payload_t, 4, "p"), _vi("scales", np.float16, 4, "s")])


def attention_model(dtype=np.float32, v_format: str = "float", mask_dtype=None, *, scale: float | None = None,
                    causal: int = 1, route: str = "auto", split_k_min_keys: int | None = None,
                    with_v_scales: bool | None = None) -> onnx.ModelProto:
    """One Dot4Attention node with graph inputs query, k_payload, k_scales, value[, v_scales][, attn_mask]."""
    v_dtype = dtype if v_format == "float" else payload_dtype(v_format)
    if with_v_scales is None:
        with_v_scales = v_format != "float"
    inputs = [_vi("query", dtype, 4, "q"), _vi("k_payload", np.int8, 4, "k"), _vi("k_scales", np.float16, 4, "ks"),
              _vi("value", v_dtype, 4, "v")]
    names = ["query", "k_payload", "k_scales", "value"]
    if with_v_scales:
        inputs.append(_vi("v_scales", np.float16, 4, "vs"))
        names.append("v_scales")
    elif mask_dtype is not None:
        names.append("")
    if mask_dtype is not None:
        inputs.append(_vi("attn_mask", mask_dtype, 4, "m"))
        names.append("attn_mask")
    attrs = {"causal": causal, "v_format": v_format, "route": route}
    if scale is not None:
        attrs["scale"] = float(scale)
    if split_k_min_keys is not None:
        attrs["split_k_min_keys"] = int(split_k_min_keys)
    node = helper.make_node("Dot4Attention", names, ["output"], domain=DOMAIN, **attrs)
    return _model([node], inputs, [_vi("output", dtype, 4, "o")])


def gqa_model(hq: int, hkv: int, dtype, int8_cache: bool = False) -> onnx.ModelProto:
    """One com.microsoft.GroupQueryAttention node (no rotary) with a BNSH KV cache of dtype `dtype` (the bench's
    baseline): query/key/value [B, S, H*D], past_/present_key/value [B, Hkv, S, D], seqlens_k, total_sequence_length.

    int8_cache: the cache is int8 with one float32 scale for K and V (`k_quant_type = v_quant_type =
    "PER_TENSOR"`, `kv_cache_bit_width = 8`, input `kv_scale` fed to both k_scale and v_scale: ORT's XQA decode
    kernel wants them to be one tensor). CUDA EP only (onnxruntime >= 1.23)."""
    t = onnx_dtype(np.float32 if np.dtype(dtype) == np.float32 else np.float16)
    tc = TensorProto.INT8 if int8_cache else t
    inputs = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    attrs = dict(num_heads=hq, kv_num_heads=hkv)
    if int8_cache:
        inputs += ["", "", "", "", "", "kv_scale", "kv_scale"]  # cos, sin, position_ids, bias, head_sink
        attrs.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", inputs, ["output", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)

    def vi(name, tt, rank):
        return helper.make_tensor_value_info(name, tt, [f"{name}_{i}" for i in range(rank)])

    graph_inputs = [vi("query", t, 3), vi("key", t, 3), vi("value", t, 3), vi("past_key", tc, 4),
                    vi("past_value", tc, 4), vi("seqlens_k", TensorProto.INT32, 1),
                    helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    if int8_cache:
        graph_inputs.append(helper.make_tensor_value_info("kv_scale", TensorProto.FLOAT, [1]))
    graph = helper.make_graph([node], "gqa", graph_inputs,
                              [vi("output", t, 3), vi("present_key", tc, 4), vi("present_value", tc, 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model


# Dot4GroupQueryAttention's inputs: com.microsoft.GroupQueryAttention's, position for position (ONNX Runtime 1.32).
# The op implements 0-8, 14 and 15; a node with any other is refused (docs/ops.md).
CACHE_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
                "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
                "q_norm_weight", "k_norm_weight", "query_seqlens")


def cache_attention_model(dtype, *, num_heads: int, kv_num_heads: int, packed_qkv: bool = False,
                          rotary: bool = False, interleaved: bool = False, qk_norm: bool = False,
                          v_format: str = "q8_0", scale: float | None = None, qk_norm_epsilon: float | None = None,
                          q_norm_epsilon: float | None = None,
                          k_norm_epsilon: float | None = None, cache_layout: str | None = None) -> onnx.ModelProto:
    """One Dot4GroupQueryAttention node: graph inputs named as the op's inputs (key/value absent for packed QKV,
    cos/sin with rotary, the norm weights with qk_norm), outputs output, present_key, present_value. The norm
    epsilons and cache_layout are written only when given (the op's defaults: GroupQueryAttention's, "rows")."""
    present = {"query", "past_key", "past_value", "seqlens_k", "total_sequence_length"}
    if not packed_qkv:
        present |= {"key", "value"}
    if rotary:
        present |= {"cos_cache", "sin_cache"}
    if qk_norm:
        present |= {"q_norm_weight", "k_norm_weight"}
    names = [n if n in present else "" for n in CACHE_INPUTS]
    while names[-1] == "":
        names.pop()
    ranks = {"query": 3, "key": 3, "value": 3, "past_key": 4, "past_value": 4, "seqlens_k": 1,
             "total_sequence_length": 0, "cos_cache": 2, "sin_cache": 2, "q_norm_weight": 1, "k_norm_weight": 1}
    types = {"past_key": np.uint8, "past_value": np.uint8, "seqlens_k": np.int32, "total_sequence_length": np.int32}
    inputs = []
    for n in names:
        if n:
            t = TensorProto.INT32 if n in ("seqlens_k", "total_sequence_length") else onnx_dtype(types.get(n, dtype))
            inputs.append(helper.make_tensor_value_info(n, t, [f"{n}_{i}" for i in range(ranks[n])]))
    attrs = dict(num_heads=num_heads, kv_num_heads=kv_num_heads, do_rotary=int(rotary),
                 rotary_interleaved=int(interleaved), v_format=v_format)
    if scale is not None:
        attrs["scale"] = float(scale)
    if cache_layout is not None:
        attrs["cache_layout"] = cache_layout
    for name, eps in (("qk_norm_epsilon", qk_norm_epsilon), ("q_norm_epsilon", q_norm_epsilon),
                      ("k_norm_epsilon", k_norm_epsilon)):
        if eps is not None:
            attrs[name] = float(eps)
    node = helper.make_node("Dot4GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain=DOMAIN, **attrs)
    outputs = [_vi("output", dtype, 3, "o"), _vi("present_key", np.uint8, 4, "pk"),
               _vi("present_value", np.uint8, 4, "pv")]
    return _model([node], inputs, outputs)


def session(model: onnx.ModelProto, providers: Sequence[str] = ("CPUExecutionProvider",), threads: int = 0):
    """An InferenceSession with the dot4attn ops registered."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    register(so)
    if threads:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=list(providers))


def run_attention(query, k_payload, k_scales, value, v_scales=None, attn_mask=None, *, v_format="float",
                  providers=("CPUExecutionProvider",), **attrs) -> np.ndarray:
    """Runs one Dot4Attention through ONNX Runtime and returns its output."""
    model = attention_model(query.dtype, v_format, None if attn_mask is None else attn_mask.dtype,
                            with_v_scales=v_scales is not None, **attrs)
    feeds = {"query": query, "k_payload": k_payload, "k_scales": k_scales, "value": value}
    if v_scales is not None:
        feeds["v_scales"] = v_scales
    if attn_mask is not None:
        feeds["attn_mask"] = attn_mask
    return session(model, providers).run(None, feeds)[0]


def run_pack(x: np.ndarray, op: str = "PackK", fmt: str | None = None,
             providers=("CPUExecutionProvider",)) -> tuple[np.ndarray, np.ndarray]:
    """Runs PackK / PackV through ONNX Runtime: (payload, scales)."""
    out = session(pack_model(op, x.dtype, fmt), providers).run(None, {"X": x})
    return out[0], out[1]
