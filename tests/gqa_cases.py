"""GroupQueryAttention-shaped nodes for the Dot4GroupQueryAttention contract tests (tests/ops/test_gqa_contract.py)
and ONNX Runtime's GroupQueryAttention test matrix run against the op (tests/ops/test_gqa_matrix.py).

One node laid out as onnxruntime-genai's model builder writes com.microsoft.GroupQueryAttention (the 17 input
positions of ONNX Runtime 1.32's schema, "" for the omitted ones up to head_sink, the builder's attributes), built
either as ONNX Runtime's own GroupQueryAttention over float caches or, with only domain and op_type changed, as
Dot4GroupQueryAttention over packed uint8 caches: the drop-in the op's contract promises.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from dot4attn import DOMAIN
from dot4attn import onnx_builders as ob

OP = "Dot4GroupQueryAttention"
GQA_INPUTS = ob.CACHE_INPUTS  # GroupQueryAttention's input names, by position
BUILDER_INPUTS = 12  # the builder always writes positions 0-11 (query .. head_sink), "" where omitted
RANKS = {"query": 3, "key": 3, "value": 3, "past_key": 4, "past_value": 4, "seqlens_k": 1, "total_sequence_length": 0,
         "cos_cache": 2, "sin_cache": 2, "position_ids": 2, "attention_bias": 4, "head_sink": 1, "k_scale": 1,
         "v_scale": 1, "q_norm_weight": 1, "k_norm_weight": 1, "query_seqlens": 1}

# GroupQueryAttention attributes the op does not implement, at values that switch them on, and a word of what the
# refusal must say. The op refuses each when its session is created, the genai rewrite (graph_passes/genai_gqa.py)
# before it writes anything.
UNIMPLEMENTED_ATTRS = [
    ("causal", 0, "bidirectional attention"),
    ("local_window_size", 128, "sliding-window attention"),
    ("local_window_size", 0, "sliding-window attention"),
    ("softcap", 30.0, "softcapped logits"),
    ("softcap", -1.0, "softcapped logits"),
    ("smooth_softmax", 1, "smooth softmax"),
    ("qk_output", 1, "output_qk"),
    ("qk_output", 2, "output_qk"),
    ("k_quant_type", "PER_TENSOR", "quantized caches"),
    ("k_quant_type", "PER_CHANNEL", "quantized caches"),
    ("v_quant_type", "PER_TENSOR", "quantized caches"),
    ("kv_cache_bit_width", 8, "quantized caches"),
    ("kv_cache_bit_width", 4, "quantized caches"),
    ("sliding_window_cache", 1, "window-sized caches"),
]

# GroupQueryAttention inputs the op does not implement: (name, position, dtype as GroupQueryAttention takes it).
UNIMPLEMENTED_INPUTS = [
    ("position_ids", 9, np.int64),
    ("attention_bias", 10, np.float32),
    ("head_sink", 11, np.float32),
    ("k_scale", 12, np.float32),
    ("v_scale", 13, np.float32),
    ("query_seqlens", 16, np.int32),
]

# Every attribute the op refuses when switched on, at the value that switches it off (ONNX Runtime 1.32's defaults,
# smooth_softmax also at 0), as a newer model builder may write them.
DEFAULTS = dict(causal=1, local_window_size=-1, softcap=0.0, smooth_softmax=-1, qk_output=0, k_quant_type="NONE",
                v_quant_type="NONE", kv_cache_bit_width=0, sliding_window_cache=0, qk_norm_epsilon=1e-6)


def builder_attrs(hq: int, hkv: int, d: int, rotary: bool = False, interleaved: bool = False) -> dict:
    """The attributes onnxruntime-genai's builder gives every GroupQueryAttention (get_attention_op_attributes)."""
    return dict(num_heads=hq, kv_num_heads=hkv, scale=float(1 / np.sqrt(d)), local_window_size=-1, softcap=0.0,
                do_rotary=int(rotary), rotary_interleaved=int(interleaved))


def gqa_model(dtype, hq: int, hkv: int, d: int, *, ours: bool, packed: bool = False, rotary: bool = False,
              interleaved: bool = False, attrs: dict | None = None, inputs: dict | None = None,
              output_qk: bool = False, v_format: str = "q8_0", all_positions: bool = False):
    """One GroupQueryAttention-shaped node. ours: domain 'dot4attn', op_type Dot4GroupQueryAttention, uint8 caches
    (and `v_format` when not q8_0); else com.microsoft.GroupQueryAttention over caches of T. attrs update the
    builder's (a value of None drops one). inputs: {name: numpy dtype} of further inputs (the norm weights, or the
    ones the op does not implement), graph inputs of their GroupQueryAttention name. output_qk: a 4th output.
    all_positions: all 17 inputs and 4 outputs written, "" for every omitted one."""
    inputs = dict(inputs or {})
    present = {"query", "past_key", "past_value", "seqlens_k", "total_sequence_length", *inputs}
    if not packed:
        present |= {"key", "value"}
    if rotary:
        present |= {"cos_cache", "sin_cache"}
    names = [n if n in present else "" for n in GQA_INPUTS]
    while not all_positions and len(names) > BUILDER_INPUTS and names[-1] == "":
        names.pop()
    a = builder_attrs(hq, hkv, d, rotary, interleaved)
    a.update(attrs or {})
    a = {k: v for k, v in a.items() if v is not None}
    if ours and v_format != "q8_0":
        a["v_format"] = v_format
    t = ob.onnx_dtype(dtype)
    cache_t = TensorProto.UINT8 if ours else t
    types = {"past_key": cache_t, "past_value": cache_t, "seqlens_k": TensorProto.INT32,
             "total_sequence_length": TensorProto.INT32}
    types.update({k: helper.np_dtype_to_tensor_dtype(np.dtype(v)) for k, v in inputs.items()})
    graph_inputs = [helper.make_tensor_value_info(n, types.get(n, t), [f"{n}_{i}" for i in range(RANKS[n])])
                    for n in names if n]
    outs = ["output", "present_key", "present_value"] + (["output_qk"] if output_qk else [""] if all_positions else [])
    node = helper.make_node(OP if ours else "GroupQueryAttention", names, outs, name="GroupQueryAttention_0",
                            domain=DOMAIN if ours else "com.microsoft", **a)
    out_vi = [ob._vi("output", dtype, 3, "o"),
              helper.make_tensor_value_info("present_key", cache_t, [f"pk{i}" for i in range(4)]),
              helper.make_tensor_value_info("present_value", cache_t, [f"pv{i}" for i in range(4)])]
    if output_qk:
        out_vi.append(ob._vi("output_qk", dtype, 4, "qk"))
    graph = helper.make_graph([node], "gqa", graph_inputs, out_vi)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ob.OPSET),
                                                    helper.make_opsetid("com.microsoft", 1),
                                                    helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 9
    return model
