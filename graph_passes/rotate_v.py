"""Rotate V per head by a Hadamard matrix, folded into the weights: the cache holds V @ H, the model is unchanged.

Attention's output is linear in V: softmax(QK) (V H) H^T = softmax(QK) V. So with H the normalized Sylvester
Hadamard matrix of order D (symmetric, orthogonal: H H = I), multiplying each KV head's V projection columns by H
and each query head's block of o_proj rows by H leaves every logit as it was, while the V that is packed into the
cache lives in the rotated basis. There each head's values are spread evenly over its D channels (every channel a
+-1/sqrt(D) mix of all of them), so a 32-value block's scale is set by fewer outliers: on SmolLM2-135M a q4_0 V
cache's KL drops by a third (docs/quality.md). No kernel changes: the rotation lives in the weights, not the ops.

    layers = rotate_v(model)   # an ir.Model with (Dot4)GroupQueryAttention nodes, float MatMul weights

Refused (RotateVError, the model left as it was): a head size that is not a power of 2, V or o_proj weights that
are not float initializers of a plain MatMul (MatMulNBits and other quantized weights would have to be quantized
again), weights shared with other nodes, or a graph shape other than the builder's (packed QKV or separate Q / K /
V projections, each optionally followed by a bias Add, and one MatMul reading the attention output).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

ATTENTION_OPS = {("com.microsoft", "GroupQueryAttention"), ("dot4attn", "Dot4GroupQueryAttention")}


class RotateVError(ValueError):
    """The model's V cannot be rotated in its weights (the message says where and why)."""


def hadamard(d: int) -> np.ndarray:
    """The normalized Sylvester Hadamard matrix of order d (a power of 2): symmetric and orthogonal."""
    if d < 1 or d & (d - 1):
        raise RotateVError(f"a Hadamard rotation needs a power-of-2 head size, got {d}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def _attr(node: ir.Node, name: str) -> int:
    a = node.attributes.get(name)
    if a is None:
        raise RotateVError(f"{node.name}: no {name} attribute")
    return int(a.value)


def _data(tv) -> np.ndarray:
    """A tensor's values. External data is read here, at its offset and length, rather than by onnx_ir, which
    refuses a data file with several hard links: the rewrite itself links a folder's weights (driver.save_atomic's
    share_external), so a folder rewritten before holds such a file."""
    if not isinstance(tv, ir.ExternalTensor):
        return tv.numpy()
    dtype = tv.dtype.numpy()
    count = int(np.prod(tv.shape.numpy())) if len(tv.shape) else 1
    with open(tv.path, "rb") as f:
        f.seek(tv.offset or 0)
        raw = f.read(count * dtype.itemsize)
    if len(raw) != count * dtype.itemsize:
        raise RotateVError(f"{tv.name}: external data {tv.path} is short")
    return np.frombuffer(raw, dtype).reshape(tv.shape.numpy())


def _weight(value: ir.Value | None, what: str) -> tuple[ir.Value, np.ndarray]:
    """The float initializer `value` and its data; refused when it is something else or has other readers."""
    if value is None or value.const_value is None or not value.is_initializer():
        raise RotateVError(f"{what}: not an initializer")
    if value.const_value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise RotateVError(f"{what}: {value.const_value.dtype} weights (a rotation needs float32 / float16 ones)")
    data = _data(value.const_value)
    if data.dtype not in (np.float32, np.float16):
        raise RotateVError(f"{what}: {data.dtype} weights (a rotation needs float32 / float16 ones)")
    if len(value.uses()) != 1:
        raise RotateVError(f"{what}: read by {len(value.uses())} nodes (only a weight of its own is rotated)")
    return value, data


def _projection(value: ir.Value, what: str):
    """(weight value, weight data, bias value or None, bias data) of MatMul(x, W) [+ b] producing `value`."""
    node = value.producer()
    bias = bias_data = None
    if node is not None and node.op_type == "Add" and node.domain in ("", "ai.onnx"):
        w_side = [i for i, v in enumerate(node.inputs) if v is not None and v.const_value is None]
        b_side = [i for i, v in enumerate(node.inputs) if v is not None and v.const_value is not None]
        if len(w_side) != 1 or len(b_side) != 1:
            raise RotateVError(f"{what}: an Add that is not MatMul + bias")
        bias, bias_data = _weight(node.inputs[b_side[0]], f"{what} bias")
        node = node.inputs[w_side[0]].producer()
    if node is None or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        op = "a graph input" if node is None else f"{node.domain or 'ai.onnx'}::{node.op_type}"
        raise RotateVError(f"{what}: made by {op}, not a float MatMul (quantized weights are not rotated)")
    w, data = _weight(node.inputs[1], f"{what} weight")
    if data.ndim != 2:
        raise RotateVError(f"{what} weight: shape {data.shape}, expected 2-D")
    return w, data, bias, bias_data


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """The data of an initializer or a Constant node's output; None otherwise."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and node.attributes.get("value") is not None:
        return node.attributes["value"].value.numpy()
    return None


def _split_columns(split: ir.Node, v: ir.Value, what: str) -> tuple[int, int]:
    """(first column, width) of output `v` of a Split along the last axis with constant sizes."""
    axis = split.attributes.get("axis")
    rank = len(v.shape) if v.shape is not None else None
    a = 0 if axis is None else int(axis.value)
    if not (a == -1 or (rank is not None and a == rank - 1)):
        raise RotateVError(f"{what}: a Split along axis {a}, not the last one")
    sizes = _constant(split.inputs[1]) if len(split.inputs) > 1 else None
    if sizes is None and split.attributes.get("split") is not None:
        sizes = np.asarray(split.attributes["split"].value)
    if sizes is None:
        raise RotateVError(f"{what}: a Split without constant sizes")
    i = v.index()
    return int(np.sum(sizes[:i])), int(sizes[i])


def _set(value: ir.Value, data: np.ndarray) -> None:
    value.const_value = ir.Tensor(np.ascontiguousarray(data), name=value.name)


def rotate_v(model: ir.Model) -> int:
    """Folds a per-head Hadamard rotation of V into every attention layer's V projection and o_proj; returns the
    number of layers. All-or-nothing: every layer is checked before any weight changes."""
    plans = []
    for node in model.graph:
        if (node.domain, node.op_type) not in ATTENTION_OPS:
            continue
        hq, hkv = _attr(node, "num_heads"), _attr(node, "kv_num_heads")
        packed = len(node.inputs) < 3 or node.inputs[1] is None or node.inputs[2] is None
        what = f"{node.name}: V"
        v = node.inputs[0] if packed else node.inputs[2]
        v0 = 0
        split = v.producer()
        if not packed and split is not None and split.op_type == "Split" and split.domain in ("", "ai.onnx"):
            v0, width = _split_columns(split, v, what)  # Qwen3's builder: MatMul, Split into Q, K, V, then norms
            w, wd, b, bd = _projection(split.inputs[0], what)
        else:
            w, wd, b, bd = _projection(v, what)
            width = wd.shape[1]
        if packed:
            if width % (hq + 2 * hkv):
                raise RotateVError(f"{what} weight: {width} columns are not (num_heads + 2 kv_num_heads) heads")
            d = width // (hq + 2 * hkv)
            v0 = (hq + hkv) * d
        else:
            if width % hkv:
                raise RotateVError(f"{what}: {width} columns are not kv_num_heads heads")
            d = width // hkv
        users = list(node.outputs[0].uses())
        if len(users) != 1 or users[0][0].op_type != "MatMul" or users[0][1] != 0:
            raise RotateVError(f"{node.name}: its output is not read by one MatMul (o_proj)")
        o, od = _weight(users[0][0].inputs[1], f"{node.name}: o_proj")
        if od.ndim != 2 or od.shape[0] != hq * d:
            raise RotateVError(f"{node.name}: o_proj weight of shape {od.shape}, expected [{hq * d}, hidden]")
        if v0 + hkv * d > wd.shape[1]:
            raise RotateVError(f"{what}: columns {v0}..{v0 + hkv * d} outside the weight's {wd.shape[1]}")
        plans.append((w, wd, b, bd, o, od, hkv, d, v0))
    if not plans:
        raise RotateVError("no GroupQueryAttention / Dot4GroupQueryAttention node")
    for w, wd, b, bd, o, od, hkv, d, v0 in plans:
        h = hadamard(d)
        cols = slice(v0, v0 + hkv * d)
        new_w = wd.astype(np.float64)
        block = new_w[:, cols].reshape(new_w.shape[0], hkv, d)
        new_w[:, cols] = (block @ h).reshape(new_w.shape[0], hkv * d)  # V_j = x W_j -> x (W_j H)
        _set(w, new_w.astype(wd.dtype))
        if b is not None:
            new_b = bd.astype(np.float64)
            new_b[..., cols] = (new_b[..., cols].reshape(*new_b.shape[:-1], hkv, d) @ h).reshape(
                *new_b.shape[:-1], hkv * d)
            _set(b, new_b.astype(bd.dtype))
        hq_blocks = od.astype(np.float64).reshape(-1, d, od.shape[1])  # per query head: a_i = a'_i H
        _set(o, (h @ hq_blocks).reshape(od.shape).astype(od.dtype))  # y = sum_i a'_i (H Wo_i)
    return len(plans)
