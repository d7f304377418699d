"""Graph passes on real exports: every export form x {Qwen2, Qwen3} x head dim {64, 128, 256}, parametrized so CI
stays within a few minutes (exports are cached, see conftest_models.py).

Per case: every attention block rewritten, no float K left (inputs, outputs, graph), onnx.checker full check,
every other input/output kept; on the CPU EP over a 32-token prefill + 32 teacher-forced decode steps top-1 >= 95%
and mean KL <= 1e-3 (float, q8_0 V) or <= 0.1 (q4_0 V); batch 2 with left padding == batch 1 per row; the KV
bytes per token match the layout.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from conftest_models import exported, need_ops

from dot4attn.passes import RewriteOptions, rewrite_file  # noqa: E402

EXPECTED_RULE = {"dynamo": "unfused_dynamo", "dynamo23": "onnx_attention", "dynamo23gqa": "onnx_attention",
                 "torchscript": "unfused_torchscript", "optimum": "unfused_torchscript",
                 "transformers": "unfused_dynamo", "dynamo_ort": "ms_multihead_attention"}
PRESET_SHAPE = {"tiny": (2, 64), "hd128": (2, 128), "hd256": (1, 256)}  # (Hkv, D)
N_LAYERS = 2

# (exporter, arch, preset, v_formats): every form on both archs at head dim 64; 128/256 on the default exporter
# for both archs plus native-GQA opset 23 and TorchScript for one arch each.
CASES = [(ex, arch, "tiny", ("float", "q8_0", "q4_0") + (("q6_0",) if ex == "dynamo" else ()))
         for ex in ("dynamo", "dynamo23", "dynamo23gqa", "torchscript", "optimum", "transformers", "dynamo_ort")
         for arch in ("qwen2", "qwen3")]
CASES += [("dynamo", arch, preset, ("float", "q8_0", "q4_0")) for arch in ("qwen2", "qwen3")
          for preset in ("hd128", "hd256")]
CASES += [("dynamo23gqa", "qwen3", "hd256", ("q8_0",)), ("torchscript", "qwen2", "hd128", ("q4_0", "q6_0"))]


def expected_bytes_per_token(preset: str, v_format: str) -> tuple[int, int]:
    hkv, d = PRESET_SHAPE[preset]
    before = N_LAYERS * hkv * 2 * 4 * d
    k = d + 2 * d // 32
    v = {"float": 4 * d, "q8_0": d + 2 * d // 32, "q4_0": d // 2 + 2 * d // 32,
         "q6_0": 3 * d // 4 + 2 * d // 32}[v_format]
    return before, N_LAYERS * hkv * (k + v)


def check_structure(src, dst, v_format: str) -> None:
    a = onnx.load(str(src), load_external_data=False)
    b = onnx.load(str(dst), load_external_data=False)
    if not any(n.domain == "com.microsoft" for n in a.graph.node):  # ORT-fused inputs fail the checker already
        onnx.checker.check_model(str(dst), full_check=True)
    ins_b = {i.name: i for i in b.graph.input}
    outs_b = {o.name for o in b.graph.output}
    for i in a.graph.input:
        if i.name.startswith("past_key_values.") and (i.name.endswith(".key") or v_format != "float"):
            assert i.name not in ins_b
        else:
            assert i.name in ins_b, f"input {i.name} lost"
    for o in a.graph.output:
        if o.name.startswith("present.") and (o.name.endswith(".key") or v_format != "float"):
            assert o.name not in outs_b
        else:
            assert o.name in outs_b, f"output {o.name} lost"
    for n in range(N_LAYERS):
        kp = ins_b[f"past_key_values.{n}.key_payload"].type.tensor_type
        ks = ins_b[f"past_key_values.{n}.key_scales"].type.tensor_type
        assert kp.elem_type == onnx.TensorProto.INT8 and ks.elem_type == onnx.TensorProto.FLOAT16
        assert {f"present.{n}.key_payload", f"present.{n}.key_scales"} <= outs_b
        if v_format != "float":
            assert {f"present.{n}.value_payload", f"present.{n}.value_scales"} <= outs_b
    ops = [(nd.domain, nd.op_type) for nd in b.graph.node]
    assert ops.count(("dot4attn", "Dot4Attention")) == N_LAYERS
    assert ops.count(("dot4attn", "PackK")) == N_LAYERS
    assert ops.count(("dot4attn", "PackV")) == (0 if v_format == "float" else N_LAYERS)
    assert ("", "Softmax") not in ops and ("", "Attention") not in ops
    assert ("com.microsoft", "MultiHeadAttention") not in ops
    assert ("", "Expand") not in ops or all(  # the GQA repeat is gone: no Expand reads a cache Concat
        not any(i.startswith("present.") for i in nd.input) for nd in b.graph.node if nd.op_type == "Expand")
    d4 = [nd for nd in b.graph.node if nd.op_type == "Dot4Attention"]
    vi = {v.name for v in b.graph.value_info} | outs_b
    assert all(nd.output[0] in vi for nd in d4), "Dot4Attention outputs need value_info"


@pytest.mark.parametrize("exporter,arch,preset,v_formats", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_rewrite_and_agree(exporter, arch, preset, v_formats, tmp_path):
    from dot4attn.quality.compare import DecoderSession, compare, padded_batch_vs_single, quality_failures

    need_ops()
    src = exported(arch, preset, exporter)
    orig = DecoderSession(str(src))
    for vf in v_formats:
        dst = tmp_path / f"{vf}.onnx"
        rep = rewrite_file(src, dst, RewriteOptions(v_format=vf))
        assert [L.rule for L in rep.layers] == [EXPECTED_RULE[exporter]] * N_LAYERS, rep.lines()
        assert (rep.bytes_per_token_before, rep.bytes_per_token_after) == expected_bytes_per_token(preset, vf)
        check_structure(src, dst, vf)
        new = DecoderSession(str(dst))
        c = compare(str(src), str(dst), prompt_len=32, steps=32, a=orig, b=new)
        print(f"{exporter} {arch} {preset} V={vf}: top1 {c.top1:.4f} meanKL {c.mean_kl:.2e} "
              f"max|dlogit| {c.max_abs_logit_diff:.3f} bytes/token {c.bytes_per_token}")
        assert c.bytes_per_token == expected_bytes_per_token(preset, vf)
        assert not quality_failures(c, vf), c.lines()  # q4_0: KL only (random weights exaggerate 4-bit V error)
        if vf in (v_formats[0],):
            worst = padded_batch_vs_single(str(dst), sess=new)
            assert worst < 1e-3, f"left-padded batch differs from batch 1 by {worst}"
