"""Refusals and file handling of the graph passes and the `dot4attn rewrite` CLI: each a clear error and no output
written; partial matches; atomic writes; external data; routes/thresholds from the CLI."""
from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest_models import exported, need_ops

from dot4attn.passes import RewriteError, RewriteOptions, rewrite_file  # noqa: E402
from dot4attn.passes import driver  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return exported("qwen3", "tiny", "dynamo")


def cli(*argv):
    from dot4attn.cli import build_parser

    args = build_parser().parse_args([str(a) for a in argv])
    return args.func(args)


def no_attention_model(path):
    x = helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, ["B", 4])
    pk = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["B", 2, "P", 64])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["input_ids", "w"], ["logits"])], "mlp", [x, pk], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_no_attention_refused(tmp_path, capsys):
    src, dst = tmp_path / "mlp.onnx", tmp_path / "out.onnx"
    no_attention_model(src)
    before = src.read_bytes()
    assert cli("rewrite", src, dst) == 2
    err = capsys.readouterr().err
    assert "no attention" in err or "no past_key_values" in err or "only past_key_values" in err, err
    assert not dst.exists() and src.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.onnx")], "temp files left behind"


def test_no_kv_cache_refused(tmp_path):
    src = tmp_path / "nocache.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    with pytest.raises(RewriteError, match="past_key_values"):
        rewrite_file(src, tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()


def break_layer(src, dst, layer_softmax_index=1):
    """A copy of the model where one layer's softmax output goes through an extra Mul (no rule matches it)."""
    m = onnx.load(str(src))
    sm = [n for n in m.graph.node if n.op_type == "Softmax"][layer_softmax_index]
    old = sm.output[0]
    sm.output[0] = old + "_pre"
    one = helper.make_tensor(old + "_one", TensorProto.FLOAT, [], [1.0])
    m.graph.initializer.append(one)
    idx = list(m.graph.node).index(sm)
    m.graph.node.insert(idx + 1, helper.make_node("Mul", [old + "_pre", old + "_one"], [old]))
    onnx.save(m, str(dst))


def test_partial_match_refused_then_allowed(tiny, tmp_path, capsys):
    need_ops()
    src = tmp_path / "partial.onnx"
    break_layer(tiny, src)
    dst = tmp_path / "out.onnx"
    assert cli("rewrite", src, dst) == 2
    err = capsys.readouterr().err
    assert "layer 1" in err and "--allow-partial" in err, err
    assert not dst.exists()
    assert cli("rewrite", src, dst, "--allow-partial", "--v-format", "q8_0") == 0
    out = capsys.readouterr().out
    assert "layer 0: unfused_dynamo" in out and "layer 1: NOT MATCHED" in out
    m = onnx.load(str(dst))
    names = {i.name for i in m.graph.input}
    assert {"past_key_values.0.key_payload", "past_key_values.1.key", "past_key_values.1.value"} <= names
    from dot4attn.quality.compare import compare

    c = compare(str(src), str(dst))
    assert c.top1 >= 0.95 and c.mean_kl <= 1e-3, c.lines()


def test_truncated_file_refused(tiny, tmp_path, capsys):
    src = tmp_path / "trunc.onnx"
    data = tiny.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    dst = tmp_path / "out.onnx"
    assert cli("rewrite", src, dst) == 2
    err = capsys.readouterr().err
    assert "truncated" in err or "cannot parse" in err, err
    assert not dst.exists()


def test_missing_external_data_refused(tiny, tmp_path):
    m = onnx.load(str(tiny))
    src = tmp_path / "ext.onnx"
    onnx.save(m, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.onnx.data",
              size_threshold=0)
    os.remove(tmp_path / "ext.onnx.data")
    with pytest.raises(RewriteError, match="external data file 'ext.onnx.data'.*missing"):
        rewrite_file(src, tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()


def test_external_data_in_and_out(tiny, tmp_path, monkeypatch):
    """A model with external data rewrites (weights read lazily), and the >2 GB path (external data out) works:
    the threshold is lowered so that a small model takes it."""
    need_ops()
    m = onnx.load(str(tiny))
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = src_dir / "model.onnx"
    onnx.save(m, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data")
    real = driver.save_atomic
    monkeypatch.setattr(driver, "save_atomic", lambda model, out, **kw: real(model, out, external_threshold=0, **kw))
    dst = tmp_path / "out" / "model.d4a.onnx"
    rewrite_file(src, dst, RewriteOptions(v_format="q4_0"))
    assert (dst.parent / "model.d4a.onnx.data").is_file()
    out = onnx.load(str(dst), load_external_data=False)  # the weights went to the data file
    assert all(t.data_location == TensorProto.EXTERNAL for t in out.graph.initializer if t.ByteSize() > 4096)
    assert (dst.parent / "model.d4a.onnx.data").stat().st_size > 1_000_000
    from dot4attn.quality.compare import compare

    c = compare(str(src), str(dst))
    assert c.mean_kl <= 0.1


def test_route_and_threshold_attributes(tiny, tmp_path, capsys):
    dst = tmp_path / "r.onnx"
    assert cli("rewrite", tiny, dst, "--route", "split_k", "--split-k-min-keys", "64", "--v-format", "q4_0") == 0
    out = capsys.readouterr().out
    assert "KV-cache bytes per token" in out and "2048 -> 416" in out
    m = onnx.load(str(dst))
    for n in m.graph.node:
        if n.op_type == "Dot4Attention":
            a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
            assert a["route"] == b"split_k" and a["split_k_min_keys"] == 64 and a["v_format"] == b"q4_0"
            assert a["causal"] == 0  # the model's causal+padding mask does the masking


def test_in_equals_out_refused(tiny, tmp_path):
    src = tmp_path / "m.onnx"
    shutil.copy(tiny, src)
    with pytest.raises(RewriteError, match="differ"):
        rewrite_file(src, src)


def test_compare_cli_thresholds(tiny, tmp_path, capsys):
    need_ops()
    dst = tmp_path / "q4.onnx"
    assert cli("rewrite", tiny, dst, "--v-format", "q4_0") == 0
    assert cli("compare", tiny, dst, "--steps", "8", "--max-kl", "1e-6") == 1
    assert "FAIL" in capsys.readouterr().err
    assert cli("compare", tiny, dst, "--steps", "8", "--max-kl", "0.1", "--min-top1", "0.5") == 0


def test_generate_cli(tiny, tmp_path, capsys):
    need_ops()
    dst = tmp_path / "q8.onnx"
    assert cli("rewrite", tiny, dst, "--v-format", "q8_0") == 0
    assert cli("generate", dst, "--token-ids", "1 5 9 13", "--max-new-tokens", "6") == 0
    out = capsys.readouterr().out
    assert "tokens:" in out and "tok/s" in out and "bytes/token" in out


@pytest.mark.slow
def test_over_2gb_model(tiny, tmp_path):
    """A real >2 GB model (the tiny export with its token embedding grown to 2.1M rows, 2.2 GB, external data):
    rewritten with the weights streamed to external data, checked, and run."""
    need_ops()
    m = onnx.load(str(tiny))
    emb = next(t for t in m.graph.initializer if "embed_tokens" in t.name)
    rows = 2_150_000
    big = np.zeros((rows, emb.dims[1]), np.float32)
    big[: emb.dims[0]] = onnx.numpy_helper.to_array(emb)
    emb.CopyFrom(onnx.numpy_helper.from_array(big, emb.name))
    del big
    keep = [v for v in m.graph.value_info if v.name != emb.name]
    del m.graph.value_info[:]
    m.graph.value_info.extend(keep)
    src = tmp_path / "big.onnx"
    dst = tmp_path / "big.d4a.onnx"
    try:  # the 4.4 GB of model files go even when the test fails (a failed test's tmp_path is kept)
        onnx.save(m, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="big.onnx.data")
        del m
        rewrite_file(src, dst, RewriteOptions(v_format="q8_0"))
        assert (tmp_path / "big.d4a.onnx.data").stat().st_size > 2**31
        from dot4attn.quality.compare import compare

        c = compare(str(src), str(dst), prompt_len=8, steps=2)
        assert c.mean_kl <= 1e-3
    finally:
        for f in tmp_path.glob("big*"):
            f.unlink()
