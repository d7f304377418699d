"""Every error of the contract (docs/ops.md "Errors") surfaces as an ONNX Runtime error whose message names the
op, the input or attribute, and what was expected versus what came.

Run-time input errors must be INVALID_ARGUMENT. Attribute errors surface when the session is created. Dtypes
that the op's type constraints exclude (query, k_payload, k_scales, v_scales, X) are rejected by ONNX Runtime
itself when it resolves the graph; there the test checks that the message names the op, the input and the
offending type.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

from conftest import INVALID_ARGUMENT, expect_error, free_rank, new_session, set_input_dtype
from dot4attn import native
from dot4attn import onnx_builders as ob
from dot4attn import reference as R
from dot4attn.formats import payload_bytes

OP = r"Dot4Attention: "


def esc(s: str) -> str:
    return re.escape(s)


def inputs(B=1, Hq=2, Hkv=2, Sq=4, Sk=16, D=64, dtype=np.float32, v_format="float", seed=0):
    """Consistent feeds of a Dot4Attention call (D need not be legal: packing is done by hand then)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(dtype)
    kp = rng.integers(-127, 128, (B, Hkv, Sk, D)).astype(np.int8)
    ks = (rng.random((B, Hkv, Sk, max(D // 32, 1))) * 0.01).astype(np.float16)
    feeds = {"query": q, "k_payload": kp, "k_scales": ks}
    if v_format == "float":
        feeds["value"] = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    elif v_format == "q8_0":
        feeds["value"] = rng.integers(-127, 128, (B, Hkv, Sk, D)).astype(np.int8)
        feeds["v_scales"] = ks.copy()
    else:  # q4_0 / q6_0: any bytes are valid levels
        feeds["value"] = rng.integers(0, 256, (B, Hkv, Sk, payload_bytes(D, v_format))).astype(np.uint8)
        feeds["v_scales"] = ks.copy()
    return feeds


def model(dtype=np.float32, v_format="float", mask_dtype=None, **kw):
    m = ob.attention_model(dtype, v_format, mask_dtype, **kw)
    return free_rank(m, "query", "k_payload", "k_scales", "value", "v_scales", "attn_mask")


def run(m, feeds):
    return new_session(m).run(None, feeds)


def expect_run_error(m, feeds, *patterns):
    sess = new_session(m)  # the session itself must build: these are run-time (input) errors
    return expect_error(lambda: sess.run(None, feeds), *patterns, cls=INVALID_ARGUMENT)


# ---- head dim, heads, shapes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("D", [16, 48, 100, 288, 512, 0])
def test_head_dim(D):
    f = inputs(D=D)
    if D == 0:
        f["k_scales"] = f["k_scales"][..., :0]
    expect_run_error(model(), f, OP + esc("input 'query' (0): head dim D must be a multiple of 32 in [32, 256], ")
                     + f"got {D}\\b")


def test_heads_not_a_multiple():
    f = inputs(Hq=6, Hkv=4)
    expect_run_error(model(), f, OP + "query heads Hq must be a multiple of KV heads Hkv", r"Hq=6\b", r"Hkv=4\b",
                     esc("[1, 6, 4, 64]"), esc("[1, 4, 16, 64]"))


def test_heads_kv_zero_with_query_heads():
    f = inputs(Hq=2, Hkv=0)
    expect_run_error(model(), f, OP + "query heads Hq must be a multiple of KV heads Hkv", r"Hq=2\b", r"Hkv=0\b")


@pytest.mark.parametrize("what,mutate,pattern", [
    ("k_payload batch", lambda f: f.update(k_payload=f["k_payload"][:1]),
     "input 'k_payload' (1): expected shape [B, Hkv, Sk, D] = [2, 2, 16, 64], got [1, 2, 16, 64]"),
    ("k_payload D", lambda f: f.update(k_payload=f["k_payload"][..., :32]),
     "input 'k_payload' (1): expected shape [B, Hkv, Sk, D] = [2, 2, 16, 64], got [2, 2, 16, 32]"),
    ("k_scales blocks", lambda f: f.update(k_scales=np.zeros((2, 2, 16, 4), np.float16)),
     "input 'k_scales' (2): expected shape [B, Hkv, Sk, D/32] = [2, 2, 16, 2], got [2, 2, 16, 4]"),
    ("k_scales Sk", lambda f: f.update(k_scales=f["k_scales"][:, :, :15]),
     "input 'k_scales' (2): expected shape [B, Hkv, Sk, D/32] = [2, 2, 16, 2], got [2, 2, 15, 2]"),
    ("k_scales heads", lambda f: f.update(k_scales=f["k_scales"][:, :1]),
     "input 'k_scales' (2): expected shape [B, Hkv, Sk, D/32] = [2, 2, 16, 2], got [2, 1, 16, 2]"),
    ("value Sk", lambda f: f.update(value=f["value"][:, :, :12]),
     "input 'value' (3): expected shape [B, Hkv, Sk, D] = [2, 2, 16, 64], got [2, 2, 12, 64]"),
    ("value heads", lambda f: f.update(value=np.concatenate([f["value"]] * 2, axis=1)),
     "input 'value' (3): expected shape [B, Hkv, Sk, D] = [2, 2, 16, 64], got [2, 4, 16, 64]"),
])
def test_shapes_disagree_float_v(what, mutate, pattern):
    f = inputs(B=2)
    mutate(f)
    expect_run_error(model(), f, OP + esc(pattern))


@pytest.mark.parametrize("v_format,mutate,pattern", [
    ("q8_0", lambda f: f.update(value=f["value"][..., :32]),
     "input 'value' (3): expected shape [B, Hkv, Sk, D] = [1, 2, 16, 64], got [1, 2, 16, 32]"),
    ("q4_0", lambda f: f.update(value=np.zeros((1, 2, 16, 64), np.uint8)),
     "input 'value' (3): expected shape [B, Hkv, Sk, D/2] = [1, 2, 16, 32], got [1, 2, 16, 64]"),
    ("q8_0", lambda f: f.update(v_scales=f["v_scales"][:, :, :8]),
     "input 'v_scales' (4): expected shape [B, Hkv, Sk, D/32] = [1, 2, 16, 2], got [1, 2, 8, 2]"),
    ("q4_0", lambda f: f.update(v_scales=np.zeros((1, 2, 16, 1), np.float16)),
     "input 'v_scales' (4): expected shape [B, Hkv, Sk, D/32] = [1, 2, 16, 2], got [1, 2, 16, 1]"),
    ("q6_0", lambda f: f.update(value=np.zeros((1, 2, 16, 32), np.uint8)),
     "input 'value' (3): expected shape [B, Hkv, Sk, 3D/4] = [1, 2, 16, 48], got [1, 2, 16, 32]"),
])
def test_shapes_disagree_quantized_v(v_format, mutate, pattern):
    f = inputs(v_format=v_format)
    mutate(f)
    expect_run_error(model(v_format=v_format), f, OP + esc(pattern))


@pytest.mark.parametrize("name,shape,pattern", [
    ("query", (2, 4, 64), "input 'query' (0): expected rank 4 [B, Hq, Sq, D], got shape [2, 4, 64]"),
    ("k_payload", (2, 16, 64), "input 'k_payload' (1): expected rank 4 [B, Hkv, Sk, D], got shape [2, 16, 64]"),
])
def test_rank(name, shape, pattern):
    f = inputs()
    f[name] = f[name].reshape(shape)
    expect_run_error(model(), f, OP + esc(pattern))


# ---- v_scales ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("v_format", ["q8_0", "q4_0", "q6_0"])
def test_v_scales_missing(v_format):
    f = inputs(v_format=v_format)
    del f["v_scales"]
    expect_run_error(model(v_format=v_format, with_v_scales=False), f,
                     OP + esc(f"input 'v_scales' (4): required for v_format '{v_format}' but missing"))


def test_v_scales_missing_with_mask():
    """v_scales omitted ("" in the node) while a mask follows it."""
    f = inputs(v_format="q4_0")
    del f["v_scales"]
    f["attn_mask"] = np.ones((1, 1, 4, 16), bool)
    expect_run_error(model(v_format="q4_0", mask_dtype=np.bool_, with_v_scales=False), f,
                     OP + esc("input 'v_scales' (4): required for v_format 'q4_0' but missing"))


def test_v_scales_unexpected():
    f = inputs()
    f["v_scales"] = np.ones((1, 2, 16, 2), np.float16)
    expect_run_error(model(v_format="float", with_v_scales=True), f,
                     OP + esc("input 'v_scales' (4): unexpected for v_format 'float'"))


# ---- dtypes -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("q_dtype,v_format,v_dtype,pattern", [
    (np.float32, "float", np.float16,
     "input 'value' (3): expected dtype float32 (same as query) for v_format 'float', got float16"),
    (np.float16, "float", np.float32,
     "input 'value' (3): expected dtype float16 (same as query) for v_format 'float', got float32"),
    (np.float32, "float", np.int8,
     "input 'value' (3): expected dtype float32 (same as query) for v_format 'float', got int8"),
    (np.float32, "q8_0", np.float32, "input 'value' (3): expected dtype int8 for v_format 'q8_0', got float32"),
    (np.float16, "q8_0", np.uint8, "input 'value' (3): expected dtype int8 for v_format 'q8_0', got uint8"),
    (np.float32, "q4_0", np.int8, "input 'value' (3): expected dtype uint8 for v_format 'q4_0', got int8"),
    (np.float16, "q4_0", np.float16, "input 'value' (3): expected dtype uint8 for v_format 'q4_0', got float16"),
    (np.float32, "q6_0", np.int8, "input 'value' (3): expected dtype uint8 for v_format 'q6_0', got int8"),
])
def test_value_dtype(q_dtype, v_format, v_dtype, pattern):
    f = inputs(dtype=q_dtype, v_format=v_format)
    f["value"] = f["value"].astype(v_dtype)
    m = set_input_dtype(model(q_dtype, v_format), "value", v_dtype)
    expect_run_error(m, f, OP + esc(pattern))


@pytest.mark.parametrize("q_dtype,mask_dtype,pattern", [
    (np.float32, np.float16, "input 'attn_mask' (5): expected dtype bool or float32 (same as query), got float16"),
    (np.float16, np.float32, "input 'attn_mask' (5): expected dtype bool or float16 (same as query), got float32"),
    (np.float32, np.int8, "input 'attn_mask' (5): expected dtype bool or float32 (same as query), got int8"),
    (np.float16, np.uint8, "input 'attn_mask' (5): expected dtype bool or float16 (same as query), got uint8"),
])
def test_mask_dtype(q_dtype, mask_dtype, pattern):
    f = inputs(dtype=q_dtype)
    f["attn_mask"] = np.zeros((1, 1, 4, 16), mask_dtype)
    expect_run_error(model(q_dtype, mask_dtype=mask_dtype), f, OP + esc(pattern))


@pytest.mark.parametrize("name,bad,v_format,pattern", [
    ("k_payload", np.uint8, "float", "input 'k_payload' (1): expected dtype int8, got uint8"),
    ("k_payload", np.float32, "float", "input 'k_payload' (1): expected dtype int8, got float32"),
    ("k_scales", np.float32, "float", "input 'k_scales' (2): expected dtype float16, got float32"),
    ("k_scales", np.int8, "q4_0", "input 'k_scales' (2): expected dtype float16, got int8"),
    ("v_scales", np.float32, "q8_0", "input 'v_scales' (4): expected dtype float16, got float32"),
    ("v_scales", np.uint8, "q4_0", "input 'v_scales' (4): expected dtype float16, got uint8"),
])
def test_packed_input_dtypes(name, bad, v_format, pattern):
    f = inputs(v_format=v_format)
    f[name] = f[name].astype(bad)
    m = set_input_dtype(model(v_format=v_format), name, bad)
    expect_run_error(m, f, OP + esc(pattern))


# A query dtype outside T = {float32, float16} is excluded by the op's type constraint: ONNX Runtime rejects the
# graph when the session is created, before any Compute. Its message names the op, the input and the type.
@pytest.mark.parametrize("bad", [np.float64, np.int8, np.int32])
def test_query_dtype(bad):
    f = inputs()
    f["query"] = f["query"].astype(bad)
    m = set_input_dtype(model(), "query", bad)
    onnx_name = {np.float64: "double", np.int8: "int8", np.int32: "int32"}[bad]
    expect_error(lambda: run(m, f), r"\bDot4Attention\b", r"\bquery\b", rf"tensor\({onnx_name}\)")


# ---- attributes (session creation) ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,pattern", [
    ({"route": "fast"}, "attribute 'route': expected 'auto', 'prefill', 'decode' or 'split_k', got 'fast'"),
    ({"route": ""}, "attribute 'route': expected 'auto', 'prefill', 'decode' or 'split_k', got ''"),
    ({"v_format": "q5_1"}, "attribute 'v_format': expected 'float', 'q8_0', 'q4_0' or 'q6_0', got 'q5_1'"),
    ({"v_format": "Q8_0"}, "attribute 'v_format': expected 'float', 'q8_0', 'q4_0' or 'q6_0', got 'Q8_0'"),
    ({"causal": 2}, "attribute 'causal': expected 0 or 1, got 2"),
    ({"scale": -1.0}, "attribute 'scale': expected a finite positive float, got -1"),
    ({"split_k_min_keys": 0}, "attribute 'split_k_min_keys': expected >= 1, got 0"),
])
def test_bad_attributes(kw, pattern):
    kw = dict(kw)
    v_format = kw.pop("v_format", "float")
    m = ob.attention_model(np.float32, v_format, **kw)
    expect_error(lambda: new_session(m), OP + esc(pattern))


@pytest.mark.parametrize("op, name, value, want, got", [
    ("Dot4Attention", "causal", 0.0, "an int", "a float"),
    ("Dot4Attention", "scale", 1, "a float", "an int"),
    ("Dot4Attention", "route", 1, "a string", "an int"),
    ("Dot4Attention", "split_k_min_keys", [1, 2], "an int", "a list of ints"),
    ("PackV", "format", 4, "a string", "an int"),
], ids=lambda x: str(x))
def test_wrongly_typed_attributes(op, name, value, want, got):
    """ONNX Runtime checks no attribute types of a custom op; a wrongly typed attribute is an error, not the
    default (causal=0.0 would otherwise mean causal)."""
    m = ob.attention_model(np.float32) if op == "Dot4Attention" else ob.pack_model("PackV", np.float32, "q8_0")
    node = m.graph.node[0]
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep + [helper.make_attribute(name, value)])
    expect_error(lambda: new_session(m), esc(f"{op}: attribute '{name}': expected {want}, got {got} attribute"))


# ---- masks ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_shape", [(1, 1, 3, 16), (17,), (2, 1, 1, 16), (1, 3, 4, 16), (4, 15)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_dtype", [np.bool_, np.float32])
def test_mask_not_broadcastable(mask_shape, mask_dtype):
    f = inputs()  # [B, Hq, Sq, Sk] = [1, 2, 4, 16]
    f["attn_mask"] = np.zeros(mask_shape, mask_dtype)
    expect_run_error(model(mask_dtype=mask_dtype), f,
                     OP + esc(f"input 'attn_mask' (5): shape {list(mask_shape)} does not broadcast to "
                              "[B, Hq, Sq, Sk] = [1, 2, 4, 16]"))


def test_mask_rank_5():
    f = inputs()
    f["attn_mask"] = np.ones((1, 1, 2, 4, 16), bool)
    expect_run_error(model(mask_dtype=np.bool_), f,
                     OP + esc("input 'attn_mask' (5): expected rank <= 4, broadcastable to [B, Hq, Sq, Sk] = "
                              "[1, 2, 4, 16], got shape [1, 1, 2, 4, 16]"))


# ---- forced routes ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["decode", "split_k"])
@pytest.mark.parametrize("Sq", [9, 64])
def test_forced_route_cannot_take_shape(route, Sq):
    f = inputs(Sq=Sq)
    expect_run_error(model(route=route), f,
                     OP + esc(f"attribute route='{route}' cannot take this shape: it needs Sq <= 8 query rows, "
                              f"got Sq={Sq}"))


@pytest.mark.parametrize("route", ["decode", "split_k"])
def test_forced_route_takes_eight_rows(route):
    """The boundary: Sq = 8 is accepted by decode and split_k."""
    f = inputs(Sq=8, Sk=40)
    kp, ks = R.pack_k(np.random.default_rng(1).standard_normal((1, 2, 40, 64)).astype(np.float32))
    f.update(k_payload=kp, k_scales=ks)
    out = run(model(route=route), f)[0]
    ref = R.attention(f["query"], kp, ks, f["value"])
    assert R.nmse(out, ref) <= 1e-6


# ---- ISA override ------------------------------------------------------------------------------------------------

def test_unknown_isa_override():
    """DOT4ATTN_CPU_ISA is read once per process: a bad value fails every Compute that would use it, clearly."""
    script = (
        "import numpy as np, onnxruntime as ort, dot4attn\n"
        "from dot4attn import onnx_builders as ob\n"
        "print('cpu_isa=' + dot4attn.build_info()['cpu_isa'])\n"
        "so = ort.SessionOptions(); dot4attn.register(so)\n"
        "sess = ort.InferenceSession(ob.attention_model(np.float32, 'float', None).SerializeToString(), so)\n"
        "q = np.zeros((1, 1, 1, 32), np.float32); kp = np.zeros((1, 1, 1, 32), np.int8)\n"
        "ks = np.zeros((1, 1, 1, 1), np.float16)\n"
        "sess.run(None, {'query': q, 'k_payload': kp, 'k_scales': ks, 'value': q})\n")
    env = {**os.environ, "DOT4ATTN_CPU_ISA": "sse2"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stdout
    assert "cpu_isa=invalid DOT4ATTN_CPU_ISA" in r.stdout  # `dot4attn info` reports it instead of crashing
    assert "DOT4ATTN_CPU_ISA: expected scalar, avx2, avx512vnni or auto, got 'sse2'" in r.stderr, r.stderr


def test_unknown_isa_forced():
    with pytest.raises(native.NativeError, match="dot4attn_force_cpu_isa: expected scalar, avx2, avx512vnni or "
                                                 "auto, got 'sse2'"):
        native.force_cpu_isa("sse2")


# ---- PackK / PackV ----------------------------------------------------------------------------------------------

def pack_model_any_rank(op, fmt=None, dtype=np.float32):
    return free_rank(ob.pack_model(op, dtype, fmt), "X")


@pytest.mark.parametrize("fmt", ["q5_1", "Q4_0", "", "q8"])
def test_packv_unknown_format(fmt):
    m = ob.pack_model("PackV", np.float32, fmt)
    expect_error(lambda: new_session(m),
                 esc(f"PackV: attribute 'format': expected 'q8_0', 'q4_0' or 'q6_0', got '{fmt}'"))


@pytest.mark.parametrize("op,fmt", [("PackK", None), ("PackV", "q4_0")])
@pytest.mark.parametrize("shape", [(2, 3, 64), (64,), (1, 1, 2, 3, 64)], ids=lambda s: "x".join(map(str, s)))
def test_pack_rank(op, fmt, shape):
    x = np.ones(shape, np.float32)
    sess = new_session(pack_model_any_rank(op, fmt))
    expect_error(lambda: sess.run(None, {"X": x}),
                 esc(f"{op}: input 'X' (0): expected rank 4 [B, H, S, D], got shape {list(shape)}"),
                 cls=INVALID_ARGUMENT)


@pytest.mark.parametrize("op,fmt", [("PackK", None), ("PackV", "q8_0"), ("PackV", "q4_0")])
@pytest.mark.parametrize("D", [16, 40, 288, 0])
def test_pack_bad_head_dim(op, fmt, D):
    x = np.ones((1, 2, 3, D), np.float16)
    sess = new_session(ob.pack_model(op, np.float16, fmt))
    expect_error(lambda: sess.run(None, {"X": x}),
                 esc(f"{op}: input 'X' (0): head dim D must be a multiple of 32 in [32, 256], got {D} "
                     f"(shape [1, 2, 3, {D}])"), cls=INVALID_ARGUMENT)


@pytest.mark.parametrize("op,fmt", [("PackK", None), ("PackV", "q4_0")])
def test_pack_bad_dtype(op, fmt):
    m = set_input_dtype(ob.pack_model(op, np.float32, fmt), "X", np.float64)
    expect_error(lambda: new_session(m).run(None, {"X": np.ones((1, 1, 1, 32))}), rf"\b{op}\b", r"\(X\)",
                 r"tensor\(double\)")
