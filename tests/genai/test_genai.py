"""onnxruntime-genai runs rewritten builder models: `dot4attn rewrite GENAI_DIR OUT_DIR`, then og.Generator on
the packed cache (CPU EP; the same models built for CUDA run in tests/gpu/test_genai_cuda.py)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from genai_support import (agreement, batch_logits, genai_model, teacher_forced_agreement,
                           teacher_forced_logits, tree_digest)

from dot4attn import reference as ref
from dot4attn.cli import main as cli

MODELS = [("qwen2-bias", "fp32"), ("qwen3-d128", "fp32"), ("gqa7-d64", "fp32"),
          ("qwen2-bias", "int4"), ("qwen3-d128", "int4"), ("gqa7-d64", "int4")]
# The other builder architectures of docs/genai.md, tiny fp32 CPU builds: Llama, Phi-3 (fused qkv_proj) and Mistral
# (its config's sliding window, which the builder writes into genai_config.json naming no layer)
ARCHITECTURES = [("llama", "fp32"), ("phi3", "fp32"), ("mistral", "fp32")]


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    made = {}

    def get(shape, precision, v_format="q8_0"):
        key = (shape, precision, v_format)
        if key not in made:
            src = genai_model(shape, precision)
            out = tmp_path_factory.mktemp("genai") / f"{shape}-{precision}-{v_format}"
            before = tree_digest(src)
            # the rows layout: og cannot allocate a q4_0 / q6_0 V cache narrower than K's
            inplace = ["--for-inplace-runner"] if v_format in ("q4_0", "q6_0") else []
            assert cli(["rewrite", str(src), str(out), "--v-format", v_format] + inplace) == 0
            assert tree_digest(src) == before, "IN must stay untouched"
            made[key] = (src, out)
        return made[key]

    return get


@pytest.mark.parametrize("shape, precision", MODELS + ARCHITECTURES)
def test_teacher_forced_logits_agree(rewritten, shape, precision):
    """64 positions as one prompt and as 64 decode steps on the shared in-place buffer: top-1 >= 95 %, KL <= 1e-3.
    Top-1 counts a flip between two tokens the original does not separate beyond its own prompt-vs-steps noise as a
    tie (genai_support.reference_noise)."""
    src, out = rewritten(shape, precision)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 256, 64)]
    results, tie = teacher_forced_agreement(src, out, tokens)
    for mode, (top1, kl) in results.items():
        assert top1 >= 0.95 and kl <= 1e-3, f"{mode}: top-1 {top1:.3f}, KL {kl:.2e} (ties: gaps <= {tie:.1e})"


@pytest.mark.parametrize("shape, precision", MODELS[:3])
def test_the_cache_is_packed_and_genai_config_loads_the_library(rewritten, shape, precision):
    src, out = rewritten(shape, precision)
    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = {(n.domain, n.op_type) for n in m.graph.node}
    assert ("com.microsoft", "GroupQueryAttention") not in ops
    assert ("dot4attn", "Dot4GroupQueryAttention") in ops
    caches = [v for v in list(m.graph.input) + list(m.graph.output)
              if v.name.startswith(("past_key_values.", "present."))]
    assert caches and all(v.type.tensor_type.elem_type == onnx.TensorProto.UINT8 for v in caches)
    facts = json.loads((out / "dot4attn.json").read_text())
    d, layers, heads = facts["head_size"], facts["layers"], facts["kv_heads"]
    assert facts["k_row_bytes"] == facts["v_row_bytes"] == ref.cache_row_bytes(d)
    assert facts["kv_bytes_per_token_before"] == layers * heads * 2 * d * 4  # fp32 K and V
    assert facts["kv_bytes_per_token_after"] == layers * heads * 2 * ref.cache_row_bytes(d)
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["session_options"]["custom_ops_library"] == "libdot4attn_ops.so"
    assert (out / "libdot4attn_ops.so").is_file() and (out / "tokenizer.json").is_file()
    # the sequence lengths: ReduceSum over the mask cast to float32 (ORT's CUDA integer ReduceSum is one block per row)
    mask_users = [n for n in m.graph.node if "attention_mask" in n.input]
    assert sorted(n.op_type for n in mask_users) == ["Cast", "Shape"] and facts["mask_sum_float32"] is True
    cast = next(n for n in mask_users if n.op_type == "Cast")
    assert cast.attribute[0].i == onnx.TensorProto.FLOAT
    (summed,) = [n for n in m.graph.node if n.op_type == "ReduceSum" and n.input[0] == cast.output[0]]
    (back,) = [n for n in m.graph.node if summed.output[0] in n.input]
    assert back.op_type == "Cast" and back.attribute[0].i == onnx.TensorProto.INT64


def test_mask_sum_stays_integer_past_float32s_exact_range():
    """Above 2^24 positions a float32 sum of the mask could round: the pass leaves the builder's ReduceSum alone."""
    import onnx_ir as ir

    from dot4attn.passes.genai_gqa import float_mask_sum

    src = genai_model("qwen2-bias", "fp32")
    model = ir.load(str(src / "model.onnx"))
    assert float_mask_sum(model.graph, (1 << 24) + 1) == 0
    assert float_mask_sum(model.graph, 1 << 24) == 1


@pytest.mark.parametrize("shape, precision", MODELS[:3] + ARCHITECTURES)
def test_greedy_generation_under_og(rewritten, shape, precision, capsys):
    """dot4attn generate on the folder: 32 new tokens through og.Generator, or fewer ending in the end-of-text token
    (256; the random Mistral's original greedily reaches it after 16)."""
    _, out = rewritten(shape, precision)
    capsys.readouterr()  # what the fixture printed (the rewrite's report, when this test makes the folder)
    assert cli(["generate", str(out), "--token-ids", "5,6,7,8", "--max-new-tokens", "32"]) == 0
    toks = capsys.readouterr().out.splitlines()[0].split()[1:]
    assert (len(toks) == 32 or 0 < len(toks) < 32 and toks[-1] == "256") and all(0 <= int(t) < 257 for t in toks)


@pytest.mark.parametrize("share", [True, False], ids=["shared-buffer", "new-buffer-per-step"])
@pytest.mark.parametrize("shape", ["qwen2-bias", "gqa7-d64"])
def test_batch_of_different_prompt_lengths(rewritten, shape, share):
    """Batch 2 with prompts of 9 and 4 tokens (genai pads), 8 greedy steps: the logits of every step agree with
    the original model run the same way, with genai sharing past and present buffers or not."""
    src, out = rewritten(shape, "fp32")
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23]]
    t_src, l_src = batch_logits(src, prompts, 8, share)
    t_out, l_out = batch_logits(out, prompts, 8, share)
    top1, kl = agreement(l_src, l_out)
    assert top1 >= 0.95 and kl <= 1e-3, f"top-1 {top1:.3f}, KL {kl:.2e}"


def test_fused_qk_norm_of_a_cuda_build_runs_on_the_cpu_ep(tmp_path):
    """For CUDA the builder fuses Qwen3's q/k norms into GroupQueryAttention (inputs 14, 15), which ORT's CPU GQA
    cannot run. Rewritten, the fp16 CUDA folder runs on the CPU EP (the op takes the norm weights) and agrees
    with the fp32 CPU build of the same weights."""
    cuda = _copy(genai_model("qwen3-d128", "fp16", "cuda"), tmp_path, "cuda-fp16")
    cfg_path = cuda / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["session_options"]["provider_options"] = []
    cfg_path.write_text(json.dumps(cfg))
    out = tmp_path / "out"
    assert cli(["rewrite", str(cuda), str(out)]) == 0
    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    node = next(n for n in m.graph.node if n.op_type == "Dot4GroupQueryAttention")
    assert len(node.input) == 16 and node.input[14] and node.input[15]  # q_norm, k_norm weights: GQA's positions
    fp32 = genai_model("qwen3-d128", "fp32")
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 256, 64)]
    top1, kl = agreement(teacher_forced_logits(fp32, tokens, "steps"), teacher_forced_logits(out, tokens, "steps"))
    assert top1 >= 0.95 and kl <= 1e-3, f"top-1 {top1:.3f}, KL {kl:.2e}"


def test_q4_0_values_make_a_narrower_v_cache(rewritten):
    """--v-format q4_0 --for-inplace-runner: V rows narrower than K's (for runtimes that size V on its own; genai
    0.18 gives V the K tensor's width, docs/genai.md), and the folder says which runner it is for."""
    src, out = rewritten("qwen3-d128", "fp32", "q4_0")
    facts = json.loads((out / "dot4attn.json").read_text())
    assert facts["v_row_bytes"] < facts["k_row_bytes"] and facts["runner"] == "inplace"
    assert facts["model_type"] == json.loads((src / "genai_config.json").read_text())["model"]["type"] == "qwen3"
    assert json.loads((rewritten("qwen3-d128", "fp32")[1] / "dot4attn.json").read_text())["runner"] == "og"
    # handed to plain og code, the folder stops at og.Model with the reason (its model type carries it), not at the
    # first step with genai's 'invalid dimensions'; dot4attn's runners read dot4attn.json (tests/genai/test_inplace.py)
    og = pytest.importorskip("onnxruntime_genai")
    with pytest.raises(Exception, match=r"Unsupported model_type in config.json: qwen3 rewritten by dot4attn for its "
                                        r"in-place runner only \(V q4_0, narrower than K: og.Generator cannot "
                                        r"allocate it\); run it with `dot4attn generate OUT_DIR"):
        og.Model(str(out))


def test_mistral_sliding_window_naming_no_layer_is_dropped(rewritten):
    """The builder writes Mistral's sliding_window into genai_config.json with `layers: []` while every node attends
    to the whole cache (local_window_size -1). genai reads it as one window for every layer: kept, og hands the op
    present views it does not write ('present.0.key has shape {1,2,0,48}'). The rewrite drops it; the window
    (4096) is the context here, so the context stays (the folder runs: the tests above)."""
    src, out = rewritten("mistral", "fp32")
    assert json.loads((src / "genai_config.json").read_text())["model"]["decoder"]["sliding_window"]["layers"] == []
    cfg = json.loads((out / "genai_config.json").read_text())
    assert "sliding_window" not in cfg["model"]["decoder"] and cfg["model"]["context_length"] == 4096


def test_a_window_shorter_than_the_context_caps_it(tmp_path, capsys):
    """The same Mistral entry with a window (16) shorter than the context (4096): genai gives every layer a cache of
    window + 16 positions, so the original stops after 32 positions under og. OUT drops the entry and caps the
    context to the window, where the nodes' whole-cache attention is the window's: the original's logits over those
    16 positions, and genai refuses a longer max_length before it runs."""
    og = pytest.importorskip("onnxruntime_genai")
    src = _copy(genai_model("mistral", "fp32"), tmp_path)
    cfg = json.loads((src / "genai_config.json").read_text())
    cfg["model"]["decoder"]["sliding_window"]["window_size"] = 16
    (src / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match=r"has shape \{1,2,32,32\} but the computed output shape for this run is "
                                        r"\{1,2,33,32\}"):
        teacher_forced_logits(src, list(range(5, 45)), "steps")  # the original past its window + 16
    out = tmp_path / "out"
    assert cli(["rewrite", str(src), str(out)]) == 0
    assert "model.context_length 4096 -> 16" in capsys.readouterr().out
    cfg = json.loads((out / "genai_config.json").read_text())
    assert "sliding_window" not in cfg["model"]["decoder"]
    assert cfg["model"]["context_length"] == cfg["search"]["max_length"] == 16
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 256, 12)]  # + 4: teacher_forced_logits' max_length
    for mode in ("prompt", "steps"):
        top1, kl = agreement(teacher_forced_logits(src, tokens, mode), teacher_forced_logits(out, tokens, mode))
        assert top1 >= 0.95 and kl <= 1e-3, f"{mode}: top-1 {top1:.3f}, KL {kl:.2e}"
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    with pytest.raises(Exception, match=r"max_length \(17\) cannot be greater than model context_length \(16\)"):
        params.set_search_options(max_length=17)
        og.Generator(model, params)


def test_split_k_min_keys_becomes_the_op_attribute(tmp_path, capsys):
    src = genai_model("qwen2-bias", "fp32")
    assert cli(["rewrite", str(src), str(tmp_path / "out"), "--split-k-min-keys", "64"]) == 0
    m = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    ops = [n for n in m.graph.node if n.op_type == "Dot4GroupQueryAttention"]
    assert len(ops) == 2 and all(onnx.helper.get_attribute_value(a) == 64
                                 for n in ops for a in n.attribute if a.name == "split_k_min_keys")
    assert all(any(a.name == "split_k_min_keys" for a in n.attribute) for n in ops)
    assert json.loads((tmp_path / "out" / "dot4attn.json").read_text())["split_k_min_keys"] == 64
    capsys.readouterr()
    assert cli(["generate", str(tmp_path / "out"), "--token-ids", "5,6,7", "--max-new-tokens", "4"]) == 0


def test_out_modes_follow_the_umask(tmp_path):
    """OUT is made like any new folder: 0777 less the umask (not mkdtemp's 0700); the files the rewrite writes
    0666 less the umask; copied files keep their own mode."""
    src = genai_model("qwen2-bias", "fp32")
    old = os.umask(0o027)
    try:
        assert cli(["rewrite", str(src), str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert out.stat().st_mode & 0o777 == 0o750
    for name in ("model.onnx", "genai_config.json", "dot4attn.json"):
        assert (out / name).stat().st_mode & 0o777 == 0o640, name
    assert (out / "tokenizer.json").stat().st_mode & 0o777 == (src / "tokenizer.json").stat().st_mode & 0o777


def test_generate_threads_reach_og(rewritten, monkeypatch, capsys):
    """generate --threads on a folder run by og.Generator: genai's decoder session gets intra_op_num_threads."""
    import onnxruntime_genai

    from dot4attn.runtime import og as genai

    overlays = []

    class Config(onnxruntime_genai.Config):
        def overlay(self, text):
            overlays.append(json.loads(text))
            super().overlay(text)

    class Og:
        def __getattr__(self, name):
            return Config if name == "Config" else getattr(onnxruntime_genai, name)

    monkeypatch.setattr(genai, "import_og", Og)
    _, out = rewritten("qwen2-bias", "fp32")
    capsys.readouterr()
    assert cli(["generate", str(out), "--runner", "og", "--token-ids", "5,6", "--max-new-tokens", "2",
                "--threads", "1"]) == 0
    assert overlays == [{"model": {"decoder": {"session_options": {"intra_op_num_threads": 1}}}}]


@pytest.mark.parametrize("link", [True, False], ids=["same-file-system", "links-refused"])
def test_the_weights_are_shared_not_rewritten(tmp_path, monkeypatch, link):
    """A rewrite changes the graph, not the weights: the source's data file is hard-linked into OUT (a 15 GB folder
    costs no second copy), or copied byte for byte where links fail; the rewritten model reads it unchanged."""
    src = _copy(genai_model("gqa7-d64", "fp32"), tmp_path)
    if not link:
        def refuse(a, b):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(os, "link", refuse)
    before = tree_digest(src)
    out = tmp_path / "out"
    assert cli(["rewrite", str(src), str(out)]) == 0
    assert tree_digest(src) == before
    data_in, data_out = (src / "model.onnx.data").stat(), (out / "model.onnx.data").stat()
    assert (data_out.st_ino == data_in.st_ino) == link
    assert (out / "model.onnx.data").read_bytes() == (src / "model.onnx.data").read_bytes()
    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"} == {"model.onnx.data"}
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 256, 64)]  # as test_teacher_forced_logits_agree
    top1, kl = agreement(teacher_forced_logits(src, tokens, "prompt"), teacher_forced_logits(out, tokens, "prompt"))
    assert top1 >= 0.95 and kl <= 1e-3, f"top-1 {top1:.3f}, KL {kl:.2e}"


# ---- bad input: one clear error each, nothing written, IN untouched ------------------------------------------

def _rewrite_fails(src, out, capsys, match, out_before=None, args=(), refused_by_rewrite=True):
    """Exit status 2 (could not run) with `match` on stderr, nothing written, the input unchanged; a refusal of the
    rewrite itself (not of the options) also says that no output was written."""
    before = tree_digest(src)
    assert cli(["rewrite", str(src), str(out), *args]) == 2
    err = capsys.readouterr().err
    assert match in err and (not refused_by_rewrite or "no output written" in err), err
    assert (tree_digest(Path(out)) if Path(out).exists() else None) == out_before
    assert not [p for p in Path(out).parent.iterdir() if p.name.startswith(f".{Path(out).name}.")]
    assert tree_digest(src) == before


def _copy(src, tmp_path, name="in"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_already_rewritten(rewritten, tmp_path, capsys):
    _, out = rewritten("qwen2-bias", "fp32")
    _rewrite_fails(_copy(out, tmp_path), tmp_path / "out", capsys, "already rewritten")


@pytest.mark.parametrize("attr, value, match", [("local_window_size", 128, "sliding-window"),
                                                ("softcap", 30.0, "softcap=30.0"),
                                                ("causal", 0, "causal=0 (bidirectional attention)"),
                                                ("smooth_softmax", 1, "smooth_softmax=1 (smooth softmax")])
def test_unsupported_attention_is_refused(tmp_path, capsys, attr, value, match):
    src = _copy(genai_model("qwen2-bias", "fp32"), tmp_path)
    m = onnx.load(str(src / "model.onnx"), load_external_data=False)
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            for a in n.attribute:
                if a.name == attr:
                    n.attribute.remove(a)
                    break
            n.attribute.append(onnx.helper.make_attribute(attr, value))
    onnx.save(m, str(src / "model.onnx"))
    _rewrite_fails(src, tmp_path / "out", capsys, match)


def test_missing_genai_config(tmp_path, capsys):
    src = _copy(genai_model("qwen2-bias", "fp32"), tmp_path)
    (src / "genai_config.json").unlink()
    _rewrite_fails(src, tmp_path / "out", capsys, "genai_config.json")


def test_missing_or_short_external_data(tmp_path, capsys):
    src = _copy(genai_model("qwen2-bias", "int4"), tmp_path)
    data = next(p for p in src.iterdir() if p.name.endswith(".data"))
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    _rewrite_fails(src, tmp_path / "out", capsys, "truncated")
    data.unlink()
    _rewrite_fails(src, tmp_path / "out2", capsys, "missing")


def test_unwritable_out(tmp_path, capsys):
    src = genai_model("qwen2-bias", "fp32")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    before = tree_digest(src)
    assert cli(["rewrite", str(src), str(blocker / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere: the read-only folder case needs an ordinary user
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            assert cli(["rewrite", str(src), str(ro / "out")]) == 2
            assert "not writable" in capsys.readouterr().err
        finally:
            ro.chmod(0o700)
    assert tree_digest(src) == before


def test_out_must_be_new(rewritten, tmp_path, capsys):
    src = genai_model("qwen2-bias", "fp32")
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _rewrite_fails(src, out, capsys, "not an empty folder", out_before=tree_digest(out))
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("v_format", ["q4_0", "q6_0"])
def test_q4_0_and_q6_0_folders_run_under_og_generator_in_the_pair_layout(rewritten, tmp_path, capsys, v_format):
    """--v-format q4_0 / q6_0 without --for-inplace-runner: K and V caches of one width (head_size bytes: K's int8
    payload; V's payload and scales with K's scales), which genai allocates. og.Generator runs it, and its logits are
    the in-place runner's over the rows layout of the same model (the same packed values, placed apart), prompt and
    decode steps alike; greedy generation runs; 256 cache bytes per token and KV head at D = 128 (ORT int8's)."""
    from dot4attn import formats
    from dot4attn.runtime import open_decoder

    src = genai_model("qwen3-d128", "fp32")
    pair = tmp_path / f"{v_format}-pair"
    assert cli(["rewrite", str(src), str(pair), "--v-format", v_format]) == 0
    assert f"note: {v_format} V in the pair cache layout" in capsys.readouterr().out
    facts = json.loads((pair / "dot4attn.json").read_text())
    d = facts["head_size"]
    assert facts["cache_layout"] == "pair" and facts["runner"] == "og"
    assert facts["k_row_bytes"] == facts["v_row_bytes"] == d
    assert json.loads((pair / "genai_config.json").read_text())["model"]["type"] == "qwen3"
    rows = rewritten("qwen3-d128", "fp32", v_format)[1]
    assert json.loads((rows / "dot4attn.json").read_text())["cache_layout"] == "rows"
    prompt = np.random.default_rng(3).integers(3, 256, size=(1, 20)).astype(np.int64)
    logits = {}
    for name, folder, runner in (("og", pair, "og"), ("inplace", pair, "inplace"), ("rows", rows, "inplace")):
        dec = open_decoder(folder, runner=runner)
        dec.reset(1, 48)
        out = [dec.prefill(prompt, chunk=8)] + [dec.step(np.array([[t]])) for t in (17, 18, 19, 20)]
        logits[name] = np.concatenate(out)
        if name == "og":
            L, h = facts["layers"], facts["kv_heads"]
            assert dec.cache_bytes_per_token() == formats.bytes_per_token(L, h, d, v=v_format, layout="pair")
            assert dec.cache_bytes_per_token() == L * h * 2 * d  # 256 B per token and KV head at D = 128
            assert dec.cache_bytes_per_token() < formats.bytes_per_token(L, h, d, v="q8_0")
        dec.close()
    np.testing.assert_allclose(logits["og"], logits["inplace"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits["inplace"], logits["rows"], atol=1e-5, rtol=0)
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(pair))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=40, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    seq = list(gen.get_sequence(0))
    assert len(seq) == 40 and seq[:20] == list(prompt[0])
    want = [int(t) for t in prompt[0]]
    dec = open_decoder(rows, runner="inplace")  # greedy on the rows folder picks the same 20 tokens
    dec.reset(1, 40)
    nxt = np.argmax(dec.prefill(prompt), axis=-1)
    for _ in range(20):
        want.append(int(nxt[0]))
        if len(want) == 40:
            break
        nxt = np.argmax(dec.step(nxt.reshape(1, 1)), axis=-1)
    assert seq == want


def test_tight_q8_0_folder_runs_under_og_generator_as_the_rows_folder(rewritten, tmp_path, capsys):
    """--cache-layout tight (head size 64, where the rows layout pads 68 bytes to 80): K and q8_0 V rows of 68 bytes,
    one width, so og.Generator runs the folder on the CPU EP; the same packed values as the rows folder, so the same
    logits to the last bit (a prompt and decode steps) and the same greedy tokens; 136 cache bytes per token and KV
    head (rows: 160, ORT's int8 cache: 128). Asked to share no buffer (genai's past_present_share_buffer off), the
    op refuses with the reason: the tight layout keeps a token's bytes in two runs of the tensor."""
    from dot4attn import formats
    from dot4attn.runtime import open_decoder
    from dot4attn.runtime.og import generate as og_generate

    src, rows = rewritten("gqa7-d64", "fp32")
    tight = tmp_path / "tight"
    capsys.readouterr()
    assert cli(["rewrite", str(src), str(tight), "--cache-layout", "tight"]) == 0
    assert "note: cache layout tight (the rows without their 16-byte padding: K 68 + V 68 bytes per token and KV " \
           "head instead of 80 + 80)" in capsys.readouterr().out
    facts = json.loads((tight / "dot4attn.json").read_text())
    L, h, d = facts["layers"], facts["kv_heads"], facts["head_size"]
    assert (facts["cache_layout"], facts["runner"], facts["v_format"], d) == ("tight", "og", "q8_0", 64)
    assert facts["k_row_bytes"] == facts["v_row_bytes"] == 68
    assert facts["kv_bytes_per_token_after"] == L * h * 136 == formats.bytes_per_token(L, h, d, layout="tight")
    assert json.loads((rows / "dot4attn.json").read_text())["kv_bytes_per_token_after"] == L * h * 160
    m = onnx.load(str(tight / "model.onnx"), load_external_data=False)
    nodes = [n for n in m.graph.node if n.op_type == "Dot4GroupQueryAttention"]
    assert len(nodes) == L and all(
        onnx.helper.get_attribute_value(next(a for a in n.attribute if a.name == "cache_layout")) == b"tight"
        for n in nodes)
    caches = [v for v in m.graph.input if v.name.startswith("past_key_values.")]
    assert {v.type.tensor_type.shape.dim[3].dim_value for v in caches} == {68}
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 256, 40)]
    for mode in ("prompt", "steps"):
        want = teacher_forced_logits(rows, tokens, mode)
        assert np.array_equal(teacher_forced_logits(tight, tokens, mode), want), mode
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23]]
    assert og_generate(tight, prompts, 16) == og_generate(rows, prompts, 16)
    dec = open_decoder(tight)
    assert type(dec).__name__ == "OgDecoder" and dec.cache_bytes_per_token() == L * h * 136
    dec.close()
    with pytest.raises(Exception, match="cache_layout 'tight' needs outputs 'present_key' / 'present_value' that "
                                        "share their past input's buffer"):
        og_generate(tight, prompts, 4, share_buffer=False)


@pytest.mark.parametrize("v_format", ["q4_0", "q6_0"])
def test_tight_q4_0_and_q6_0_folders_are_for_the_in_place_runner(rewritten, tmp_path, capsys, v_format):
    """Tight q4_0 / q6_0 V rows are narrower than K's (head size 128: 72 / 104 vs 136), which og.Generator cannot
    allocate: without --for-inplace-runner the rewrite refuses with why and what to do; with it, the in-place runner
    runs the folder on the CPU with the logits of the rows --for-inplace-runner folder, to the last bit."""
    from dot4attn.runtime import open_decoder

    src = genai_model("qwen3-d128", "fp32")
    v_row = {"q4_0": 72, "q6_0": 104}[v_format]
    _rewrite_fails(src, tmp_path / "og", capsys, f"--cache-layout tight with --v-format {v_format} makes V rows "
                   f"narrower than K's ({v_row} vs 136 bytes per token and KV head at head size 128), which "
                   "og.Generator cannot allocate", args=["--v-format", v_format, "--cache-layout", "tight"])
    tight = tmp_path / "tight"
    assert cli(["rewrite", str(src), str(tight), "--v-format", v_format, "--cache-layout", "tight",
                "--for-inplace-runner"]) == 0
    facts = json.loads((tight / "dot4attn.json").read_text())
    assert (facts["cache_layout"], facts["runner"], facts["k_row_bytes"], facts["v_row_bytes"]) == \
        ("tight", "inplace", 136, v_row)
    rows = rewritten("qwen3-d128", "fp32", v_format)[1]  # the rows layout, --for-inplace-runner
    prompt = np.random.default_rng(3).integers(3, 256, size=(1, 20)).astype(np.int64)
    logits = {}
    for name, folder in (("tight", tight), ("rows", rows)):
        dec = open_decoder(folder)  # the folder's runner: in place, on the CPU
        dec.reset(1, 32)
        logits[name] = np.concatenate([dec.prefill(prompt, chunk=8)] +
                                      [dec.step(np.array([[t]])) for t in (17, 18, 19, 20)])
        if name == "tight":
            assert dec.cache_bytes_per_token() == facts["layers"] * facts["kv_heads"] * (136 + v_row)
        dec.close()
    assert np.array_equal(logits["tight"], logits["rows"])
    capsys.readouterr()
    assert cli(["generate", str(tight), "--token-ids", "5,6,7", "--max-new-tokens", "4"]) == 0
    assert "in-place cache on cpu" in capsys.readouterr().out


@pytest.mark.parametrize("args, match", [
    (["--cache-layout", "pair"], "--cache-layout pair is for --v-format q4_0 or q6_0"),
    (["--cache-layout", "pair", "--v-format", "q4_0", "--for-inplace-runner"],
     "--cache-layout pair with --for-inplace-runner: the pair layout runs under og.Generator"),
    (["--cache-layout", "rows", "--v-format", "q6_0"], "--cache-layout rows with --v-format q6_0 makes V rows narrower "
                                                       "than K's (112 vs 144 bytes per token and KV head at head size "
                                                       "128)")])
def test_cache_layouts_the_runners_cannot_run_are_refused(tmp_path, capsys, args, match):
    _rewrite_fails(genai_model("qwen3-d128", "fp32"), tmp_path / "out", capsys, match, args=args)


def test_tight_rewrites_a_cuda_folder_and_refuses_one_without_a_shared_buffer(tmp_path, capsys):
    """The tight layout runs on every execution provider, so a folder genai runs on CUDA rewrites to it; a folder
    whose genai_config.json turns past_present_share_buffer off is refused with why and what to do (the layout's
    token bytes are not in their rows, which genai copies in an unshared cache)."""
    src = genai_model("qwen3-d128", "fp16", "cuda")
    out = tmp_path / "out"
    assert cli(["rewrite", str(src), str(out), "--cache-layout", "tight"]) == 0
    assert json.loads((out / "dot4attn.json").read_text())["cache_layout"] == "tight"
    unshared = tmp_path / "unshared"
    shutil.copytree(src, unshared)
    cfg = json.loads((unshared / "genai_config.json").read_text())
    cfg["search"]["past_present_share_buffer"] = False
    (unshared / "genai_config.json").write_text(json.dumps(cfg))
    _rewrite_fails(unshared, tmp_path / "out2", capsys, "--cache-layout tight needs search.past_present_share_buffer "
                   "(the builder's default), which this folder turns off", args=["--cache-layout", "tight"])


def test_for_inplace_runner_is_for_q4_0_and_q6_0(tmp_path, capsys):
    src = genai_model("qwen3-d128", "fp32")
    # asked for without q4_0 / q6_0, it would bar og.Generator from a folder it runs
    _rewrite_fails(src, tmp_path / "out", capsys, "--for-inplace-runner (inplace_runner=True) is for --v-format "
                   "q4_0 or q6_0; a q8_0 V folder runs under og.Generator", args=["--for-inplace-runner"])


@pytest.mark.parametrize("args, match", [(["--route", "decode"], "--route decode is for .onnx files"),
                                         (["--allow-partial"], "--allow-partial is for .onnx files")])
def test_options_of_onnx_files_are_refused_for_folders(tmp_path, capsys, args, match):
    _rewrite_fails(genai_model("qwen2-bias", "fp32"), tmp_path / "out", capsys, match, args=args,
                   refused_by_rewrite=False)


@pytest.mark.parametrize("flag", [["--cache-layout", "tight"], ["--for-inplace-runner"], ["--rotate-v"]])
def test_options_of_folders_are_refused_for_onnx_files(tmp_path, capsys, flag):
    assert cli(["rewrite", str(tmp_path / "m.onnx"), str(tmp_path / "out.onnx"), *flag]) == 2
    assert f"dot4attn rewrite: {flag[0]} is for genai folders; an .onnx file is not one" in capsys.readouterr().err
    assert not (tmp_path / "out.onnx").exists()


def test_the_decoder_file_of_a_folder_points_at_the_folder(tmp_path, capsys):
    src = genai_model("qwen2-bias", "fp32")
    _rewrite_fails(src / "model.onnx", tmp_path / "out.onnx", capsys, "pass the folder", refused_by_rewrite=False)
    assert cli(["generate", str(src / "model.onnx"), "--token-ids", "5"]) == 2
    assert f"pass the folder, `dot4attn generate {src} ...`" in capsys.readouterr().err


@pytest.mark.parametrize("key, value", [("head_size", 64), ("num_key_value_heads", 4), ("num_attention_heads", 8),
                                        ("num_hidden_layers", 3)])
def test_genai_config_must_agree_with_the_graph(tmp_path, capsys, key, value):
    """genai sizes its caches and loops from genai_config.json: a number the graph contradicts is refused, both
    values named. head_size is checked against the cache's static last dimension (qwen3-d128: 128)."""
    src = _copy(genai_model("qwen3-d128", "fp32"), tmp_path)
    cfg = json.loads((src / "genai_config.json").read_text())
    graph_value = cfg["model"]["decoder"][key]
    cfg["model"]["decoder"][key] = value
    (src / "genai_config.json").write_text(json.dumps(cfg))
    _rewrite_fails(src, tmp_path / "out", capsys, f"model.decoder.{key} is {value} but the graph has {graph_value}")


@pytest.mark.parametrize("change, match", [
    ({"layers": [0, 1]}, "sliding_window (window_size 64) puts layers [0, 1] on a sliding-window cache"),
    ({"slide_key_value_cache": True}, "sliding_window.slide_key_value_cache is True: onnxruntime-genai slides"),
    ({"window_size": 0}, "sliding_window.window_size must be a positive integer, got 0")])
def test_a_sliding_window_cache_is_refused(tmp_path, capsys, change, match):
    """A sliding_window naming layers (genai sizes those caches to the window, their nodes attend through it; the
    op keeps and attends to the whole context), one genai slides itself, or one without a window."""
    src = _copy(genai_model("qwen2-bias", "fp32"), tmp_path)
    cfg = json.loads((src / "genai_config.json").read_text())
    cfg["model"]["decoder"]["sliding_window"] = {"window_size": 64, "slide_key_value_cache": False,
                                                 "slide_inputs": False, "layers": [], "cache_slack": 0, **change}
    (src / "genai_config.json").write_text(json.dumps(cfg))
    _rewrite_fails(src, tmp_path / "out", capsys, match)


def test_multi_head_attention_folders_say_what_to_build(tmp_path, capsys):
    """The builder's fp16 CPU folders use com.microsoft.MultiHeadAttention: refused with what to build instead (the
    graph here is an fp32 folder whose attention nodes are renamed, which is all the check looks at)."""
    src = _copy(genai_model("qwen2-bias", "fp32"), tmp_path)
    m = onnx.load(str(src / "model.onnx"), load_external_data=False)
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            n.op_type = "MultiHeadAttention"
    onnx.save(m, str(src / "model.onnx"))
    _rewrite_fails(src, tmp_path / "out", capsys, "MultiHeadAttention (2 nodes), which the model builder writes for "
                   "-p fp16 -e cpu; the rewrite replaces GroupQueryAttention. Build the folder with -p fp32 or "
                   "-p int4 for the CPU, or -e cuda for fp16")
