"""onnxruntime-genai model-builder decoders: com.microsoft.GroupQueryAttention -> dot4attn.Dot4GroupQueryAttention.

The builder emits one GroupQueryAttention per layer that owns the cache: past_key_values.N.key/value in,
present.N.key/value out, [batch, kv_heads, seq, head_size] float, appended in place when genai shares the past and
present buffers. The rewrite keeps every input of the node at its position (query or packed QKV, key, value,
seqlens_k, total_sequence_length, cos/sin caches, the q/k norm weights at 14 / 15: the op's inputs are
GroupQueryAttention's) and turns the two cache tensors of each layer into packed uint8 rows
[batch, kv_heads, seq, row_bytes] (docs/ops.md, "Packed cache"): K q8_0, V q8_0 (genai gives K and V one dtype and
one last dim), q4_0 or q6_0, either in the "pair" layout (K and V both head_size bytes wide, which genai allocates)
or in the "rows" layout for runtimes that allow V its own width, or in the "tight" layout (no 16-byte row padding;
a cache that shares its past and present buffer). The names stay, so genai still finds them.

What the op does not implement is refused with the reason, by the rules the op itself applies when its session is
created (docs/ops.md): sliding windows, softcap, smooth softmax, causal = 0, ORT's quantized caches, window-sized
caches, the attention scores output, and the position_ids / attention_bias / head_sink / k_scale / v_scale /
query_seqlens inputs. Those attributes at the values that switch them off (what ORT's current builder writes:
causal = 1, smooth_softmax = -1, sliding_window_cache = 0, ...) are accepted, as are the norm epsilons.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from .. import DOMAIN
from ..formats import PACKED_FORMATS, cache_row_widths, check_cache_layout
from ..model_io import PAST_RE

GQA = ("com.microsoft", "GroupQueryAttention")
OP = "Dot4GroupQueryAttention"
# GroupQueryAttention's inputs (ONNX Runtime 1.32), which are the op's, position for position.
INPUT_NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
               "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
               "q_norm_weight", "k_norm_weight", "query_seqlens"]
KEPT_INPUTS = 9  # query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache
QK_NORM_INPUTS = (14, 15)  # Qwen3 on CUDA: the builder fuses q_norm / k_norm into the node (kept at 14, 15)
IMPLEMENTED_INPUTS = set(range(KEPT_INPUTS)) | set(QK_NORM_INPUTS)

_QUANTIZED = "ONNX Runtime's quantized caches; rewrite the float-cache model instead"
# GroupQueryAttention attributes the op does not implement: the values that switch each off (ONNX Runtime 1.32's
# default first) and what any other value would ask for. The op refuses the same (custom_ops/cache/cache_op.cc).
UNIMPLEMENTED_ATTRS = {
    "causal": ((1,), "bidirectional attention"),
    "local_window_size": ((-1,), "sliding-window attention"),
    "softcap": ((0.0,), "softcapped logits"),
    "smooth_softmax": ((-1, 0), "smooth softmax (attention sinks)"),
    "qk_output": ((0,), "the attention scores as output 'output_qk'"),
    "k_quant_type": (("NONE",), _QUANTIZED),
    "v_quant_type": (("NONE",), _QUANTIZED),
    "kv_cache_bit_width": ((0,), _QUANTIZED),
    "sliding_window_cache": ((0,), "window-sized caches"),
}
NORM_EPSILONS = ("qk_norm_epsilon", "q_norm_epsilon", "k_norm_epsilon")
# Attributes the op implements; with UNIMPLEMENTED_ATTRS every attribute GroupQueryAttention has.
IMPLEMENTED_ATTRS = {"num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved", *NORM_EPSILONS}
_ATTR_TYPES = {"softcap": ir.AttributeType.FLOAT, "scale": ir.AttributeType.FLOAT,
               "k_quant_type": ir.AttributeType.STRING, "v_quant_type": ir.AttributeType.STRING,
               **{e: ir.AttributeType.FLOAT for e in NORM_EPSILONS}}


class GenaiRewriteError(Exception):
    """A builder model the pass refuses; the message names the node and why."""


@dataclass
class GqaLayer:
    index: int
    node: ir.Node
    head_size: int
    kv_heads: int


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _static(d):
    return d if isinstance(d, int) else None


def check_node(node: ir.Node) -> None:
    """Raises GenaiRewriteError when the node uses something Dot4GroupQueryAttention does not implement."""
    what = f"GroupQueryAttention node {node.name!r}"
    extra = sorted(set(node.attributes) - IMPLEMENTED_ATTRS - set(UNIMPLEMENTED_ATTRS))
    if extra:
        raise GenaiRewriteError(f"{what}: attributes {extra} are not supported")
    for name, a in node.attributes.items():  # ONNX Runtime checks no attribute types of a custom op: we do
        want = _ATTR_TYPES.get(name, ir.AttributeType.INT)
        if a.type != want:
            raise GenaiRewriteError(f"{what}: attribute {name} must be {want.name}, got {a.type.name}")
    for name, (off, why) in UNIMPLEMENTED_ATTRS.items():
        v = _attr(node, name, off[0])
        if v not in off:
            raise GenaiRewriteError(f"{what}: {name}={v!r} ({why}) is not supported; the op supports "
                                    f"{' or '.join(map(repr, off))}")
    for name in NORM_EPSILONS:
        eps = _attr(node, name, None)
        if eps is not None and not (math.isfinite(eps) and (eps >= 0 if name == "qk_norm_epsilon" else eps > 0)):
            raise GenaiRewriteError(f"{what}: {name}={eps!r} must be a finite float "
                                    f"{'>= 0' if name == 'qk_norm_epsilon' else '> 0'}")
    for i, v in enumerate(node.inputs):
        if i not in IMPLEMENTED_INPUTS and v is not None:
            name = INPUT_NAMES[i] if i < len(INPUT_NAMES) else f"#{i}"
            raise GenaiRewriteError(f"{what}: input {i} ({name}) is not supported (only query, key, value, the "
                                    "caches, seqlens_k, total_sequence_length, cos/sin and the q/k norm weights)")
    norms = [i < len(node.inputs) and node.inputs[i] is not None for i in QK_NORM_INPUTS]
    if norms[0] != norms[1]:
        raise GenaiRewriteError(f"{what}: q_norm and k_norm weights come together (inputs 14, 15); got only one")
    if len(node.outputs) > 3 and any(o.uses() or o.is_graph_output() for o in node.outputs[3:]):
        raise GenaiRewriteError(f"{what}: output 3 (attention scores) is used; not supported")


def find_layers(graph: ir.Graph, head_size: int | None = None) -> list[GqaLayer]:
    layers = []
    for node in graph:
        if (node.domain or "", node.op_type) != GQA:
            continue
        check_node(node)
        past_k = node.inputs[3] if len(node.inputs) > 3 else None
        past_v = node.inputs[4] if len(node.inputs) > 4 else None
        if past_k is None or past_v is None or not past_k.is_graph_input() or not past_v.is_graph_input():
            raise GenaiRewriteError(f"GroupQueryAttention node {node.name!r}: past_key / past_value must be graph "
                                    "inputs (the builder's past_key_values.N.key / .value)")
        m = PAST_RE.match(past_k.name or "")
        if not m or m.group(2) != "key" or past_v.name != f"past_key_values.{m.group(1)}.value":
            raise GenaiRewriteError(f"GroupQueryAttention node {node.name!r}: cache inputs {past_k.name!r} / "
                                    f"{past_v.name!r} are not past_key_values.N.key / .value")
        idx = int(m.group(1))
        for o, part in ((node.outputs[1], "key"), (node.outputs[2], "value")):
            if not o.is_graph_output() or o.name != f"present.{idx}.{part}":
                raise GenaiRewriteError(f"GroupQueryAttention node {node.name!r}: output {o.name!r} must be the graph "
                                        f"output present.{idx}.{part}")
        if past_k.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            raise GenaiRewriteError(f"{past_k.name}: a float or float16 cache was expected, got {past_k.dtype} "
                                    "(ORT-quantized caches are not supported)")
        sh = past_k.shape
        d = _static(sh[3]) if sh is not None and len(sh) == 4 else None
        d = d or head_size  # the builder leaves it symbolic (kv_cache_dim); genai_config has head_size
        h = _static(sh[1]) if sh is not None and len(sh) == 4 else None
        h = h or _attr(node, "kv_num_heads", None)
        if d is None or h is None:
            raise GenaiRewriteError(f"{past_k.name}: needs static kv_heads and head_size (or head_size from "
                                    f"genai_config.json), got shape {sh}")
        if d % 32 or not 32 <= d <= 256:
            raise GenaiRewriteError(f"{past_k.name}: head_size must be a multiple of 32 in [32, 256], got {d}")
        layers.append(GqaLayer(idx, node, d, h))
    return layers


def _packed_value(v: ir.Value, kv_heads: int, last: int) -> None:
    sh = v.shape
    v.dtype = ir.DataType.UINT8
    v.shape = ir.Shape([sh[0], kv_heads, sh[2], last])


def _take_over(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """`new` replaces `old`: its type, its uses, its place among the graph outputs and its name."""
    new.dtype, new.shape = old.dtype, old.shape
    if old.is_graph_output():  # first: onnx_ir refuses to move the uses of a graph output
        outs = list(graph.outputs)
        outs[outs.index(old)] = new
        graph.outputs.clear()
        graph.outputs.extend(outs)
    old.replace_all_uses_with(new)
    name = old.name
    old.name = name + ".__removed"
    new.name = name


def rewrite_gqa(model: ir.Model, v_format: str = "q8_0", head_size: int | None = None,
                cache_layout: str = "rows") -> list[GqaLayer]:
    """Rewrites every GroupQueryAttention in place; returns the layers. cache_layout: the op's "rows", "pair" (q4_0
    / q6_0 V only) or "tight" (no padding; shared buffers). Raises GenaiRewriteError, leaving the model in an
    undefined state (discard it)."""
    if v_format not in PACKED_FORMATS:
        raise GenaiRewriteError(f"v_format must be {', '.join(PACKED_FORMATS)} for a genai model, got {v_format!r}")
    try:
        check_cache_layout(cache_layout, v_format)
    except ValueError as e:
        raise GenaiRewriteError(str(e)) from None
    graph = model.graph
    if any(n.domain == DOMAIN for n in graph):
        raise GenaiRewriteError("the model is already rewritten (it has dot4attn ops)")
    layers = find_layers(graph, head_size)
    if not layers:
        raise GenaiRewriteError("no com.microsoft.GroupQueryAttention node: not an onnxruntime-genai model-builder "
                                "decoder (use `dot4attn rewrite IN.onnx OUT.onnx` for exported models)")
    for L in layers:
        node = L.node
        for cache in (node.inputs[3], node.inputs[4], node.outputs[1], node.outputs[2]):
            for user, _ in cache.uses():
                if user is not node:
                    raise GenaiRewriteError(f"{cache.name} is also used by {user.op_type} node {user.name!r}")
        attrs = {"num_heads": _attr(node, "num_heads", 0), "kv_num_heads": _attr(node, "kv_num_heads", 0),
                 "scale": float(_attr(node, "scale", 0.0)), "do_rotary": _attr(node, "do_rotary", 0),
                 "rotary_interleaved": _attr(node, "rotary_interleaved", 0), "v_format": v_format}
        if cache_layout != "rows":  # rows: the op's default, left implicit
            attrs["cache_layout"] = cache_layout
        # The op's inputs are GroupQueryAttention's, position for position: the implemented ones stay where they
        # are (check_node refused the others), trailing omitted ones are dropped.
        inputs = [v if i in IMPLEMENTED_INPUTS else None for i, v in enumerate(node.inputs)]
        if len(node.inputs) > QK_NORM_INPUTS[1] and node.inputs[QK_NORM_INPUTS[0]] is not None:
            for name in NORM_EPSILONS:  # q_norm_epsilon / k_norm_epsilon override qk_norm_epsilon, as in ORT
                eps = _attr(node, name, None)
                if eps is not None:
                    attrs[name] = float(eps)
        while inputs and inputs[-1] is None:
            inputs.pop()
        new = ir.node(OP, inputs, attributes=attrs, domain=DOMAIN, num_outputs=3, name=node.name)
        graph.insert_before(node, new)
        for old, nv in zip(node.outputs[:3], new.outputs):
            _take_over(graph, old, nv)
        graph.remove(node, safe=True)
        widths = cache_row_widths(L.head_size, v_format, cache_layout)
        for i, width in ((1, widths[0]), (2, widths[1])):  # present and past caches: packed rows
            for cache in (new.outputs[i], new.inputs[2 + i]):
                _packed_value(cache, L.kv_heads, width)
    model.opset_imports[DOMAIN] = 1
    return layers


FLOAT_EXACT = 1 << 24  # float32 holds every integer up to 2^24 exactly


def float_mask_sum(graph: ir.Graph, max_tokens: int) -> int:
    """The builder's sequence lengths, ReduceSum(attention_mask, axis 1) over the int64 (or int32) mask, summed in
    float32 instead: Cast to float, ReduceSum, Cast back, the rest of the graph unchanged. ONNX Runtime's CUDA
    ReduceSum has no fast path for integers: one block per batch row walks the whole mask, 237 us per decode step at
    128k positions on an H200 (a 7B step is 6-7 ms), paid by every step of a CUDA graph, whose mask is as long as
    the cache. The mask holds 0 / 1, so every partial sum is a whole number below max_tokens and float32 is exact
    while max_tokens <= 2^24; above that nothing changes. Returns the number of ReduceSum nodes changed."""
    if max_tokens > FLOAT_EXACT:
        return 0
    mask = next((v for v in graph.inputs if v.name == "attention_mask"), None)
    if mask is None or mask.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return 0
    changed = 0
    for node, index in list(mask.uses()):
        if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or index != 0:
            continue
        out = node.outputs[0]
        if out.is_graph_output():
            continue
        users = list(out.uses())
        cast_in = ir.node("Cast", [mask], attributes={"to": ir.DataType.FLOAT}, name=f"{node.name}/float_in")
        graph.insert_before(node, cast_in)
        cast_in.outputs[0].dtype = ir.DataType.FLOAT
        cast_in.outputs[0].shape = mask.shape
        node.replace_input_with(0, cast_in.outputs[0])
        out.dtype = ir.DataType.FLOAT
        cast_out = ir.node("Cast", [out], attributes={"to": mask.dtype}, name=f"{node.name}/int_out")
        graph.insert_after(node, cast_out)
        back = cast_out.outputs[0]
        back.dtype, back.shape = mask.dtype, out.shape
        for user, i in users:
            user.replace_input_with(i, back)
        changed += 1
    return changed
