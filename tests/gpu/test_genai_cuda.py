"""onnxruntime-genai-cuda runs rewritten CUDA builder models (fp16): the same agreement as the CPU tests
(tests/genai), the cache on the device, every Dot4GroupQueryAttention node on the CUDA EP (ORT profile).

Needs onnxruntime-genai-cuda (with onnxruntime-gpu), transformers and torch (the builder runs here), and a CUDA
build of the library."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "genai"))
from genai_support import (agreement, batch_logits, genai_model, og, teacher_forced_agreement,  # noqa: E402
                           teacher_forced_logits)

import dot4attn  # noqa: E402
from dot4attn.cli import main as cli  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPES = ["qwen2-bias", "qwen3-d128", "gqa7-d64"]


@pytest.fixture(autouse=True)
def _need_cuda_genai():
    from importlib.metadata import PackageNotFoundError, version

    og()
    try:
        version("onnxruntime-genai-cuda")
    except PackageNotFoundError:
        pytest.skip("onnxruntime-genai without CUDA (install onnxruntime-genai-cuda)")
    if dot4attn.build_info().get("gpu") != "cuda":
        pytest.skip("libdot4attn_ops was built without CUDA kernels")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def get(shape):
        if shape not in made:
            src = genai_model(shape, "fp16", "cuda")
            out = tmp_path_factory.mktemp("genai-cuda") / shape
            assert cli(["rewrite", str(src), str(out)]) == 0
            made[shape] = (src, out)
        return made[shape]

    return get


@pytest.mark.parametrize("shape", SHAPES)
def test_teacher_forced_logits_agree_on_cuda(folders, shape):
    src, out = folders(shape)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 256, 64)]
    results, tie = teacher_forced_agreement(src, out, tokens)
    for mode, (top1, kl) in results.items():
        assert top1 >= 0.95 and kl <= 1e-3, f"{mode}: top-1 {top1:.3f}, KL {kl:.2e} (ties: gaps <= {tie:.1e})"


@pytest.mark.parametrize("share", [True, False], ids=["shared-buffer", "new-buffer-per-step"])
def test_batch_of_different_prompt_lengths_on_cuda(folders, share):
    src, out = folders("qwen2-bias")
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23]]
    _, l_src = batch_logits(src, prompts, 8, share)
    _, l_out = batch_logits(out, prompts, 8, share)
    top1, kl = agreement(l_src, l_out)
    assert top1 >= 0.95 and kl <= 1e-3, f"top-1 {top1:.3f}, KL {kl:.2e}"


def test_every_dot4attn_node_runs_on_the_cuda_ep(folders, tmp_path):
    """genai_config's session option enable_profiling: the profile's node events name their provider."""
    _, out = folders("qwen3-d128")
    prof = tmp_path / "profiled"
    import shutil

    shutil.copytree(out, prof)
    cfg_path = prof / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["session_options"]["enable_profiling"] = str(tmp_path / "ort_profile")
    cfg_path.write_text(json.dumps(cfg))
    teacher_forced_logits(prof, [1, 2, 3, 4], "steps")
    events = []
    for p in tmp_path.glob("ort_profile*.json"):
        events += json.loads(p.read_text())
    ours = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
            and e.get("args", {}).get("op_name") == "Dot4GroupQueryAttention"]
    assert ours, "no Dot4GroupQueryAttention node in the profile"
    providers = {e["args"].get("provider") for e in ours}
    assert providers == {"CUDAExecutionProvider"}, providers


@pytest.mark.parametrize("v_format,batch", [("q8_0", 1), ("q4_0", 2)])
def test_inplace_decode_moves_no_cache_bytes_to_the_host(folders, tmp_path, v_format, batch):
    """dot4attn.runtime.inplace on the CUDA EP over 64 decode steps (q8_0 V at batch 1, q4_0 V at batch 2): the profile's
    memcpy nodes move a few bytes each (total_sequence_length to the host), never the cache; every
    Dot4GroupQueryAttention runs on CUDA."""
    from dot4attn.runtime.inplace import InPlaceDecoder

    src, out = folders("qwen3-d128")
    if v_format != "q8_0":
        out = tmp_path / v_format
        assert cli(["rewrite", str(src), str(out), "--v-format", v_format, "--for-inplace-runner"]) == 0
    # launched kernel by kernel: ORT's profiler sees no node of a replayed CUDA graph
    dec = InPlaceDecoder(out, device="cuda", profile_prefix=str(tmp_path / "inplace"), cuda_graph=False)
    dec.reset(batch, 128)
    dec.step(np.tile(np.arange(4, dtype=np.int64), (batch, 1)))
    for t in range(64):
        dec.step(np.full((batch, 1), t, np.int64))
    events = json.loads(Path(dec.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    copies = [e for e in nodes if e["args"].get("op_name", "").startswith("Memcpy")]
    assert all(int(e["args"].get("output_size", 0)) <= 64 for e in copies), [
        (e["name"], e["args"].get("output_size")) for e in copies if int(e["args"].get("output_size", 0)) > 64]
    ours = [e for e in nodes if e["args"].get("op_name") == "Dot4GroupQueryAttention"]
    assert len(ours) == 2 * 65 and {e["args"].get("provider") for e in ours} == {"CUDAExecutionProvider"}


@pytest.mark.parametrize("v_format,lengths", [("q8_0", [6]), ("q4_0", [9, 4]), ("q6_0", [9, 4])])
def test_cuda_graph_steps_match_launched_steps(folders, tmp_path, v_format, lengths):
    """InPlaceDecoder's decode steps replayed as one CUDA graph (a mask as long as the cache, the rows' lengths read
    on the device) give the logits of the same steps launched kernel by kernel, for a batch of rows of different
    lengths too (left-padded prompts: the mask's zeros). Only the split of the keys may differ (the graph's plan is
    made for the cache's length), so the logits agree to float16 rounding, not bit for bit."""
    from dot4attn.runtime.inplace import InPlaceDecoder

    src, out = folders("qwen3-d128")
    if v_format != "q8_0":
        out = tmp_path / v_format
        assert cli(["rewrite", str(src), str(out), "--v-format", v_format, "--for-inplace-runner"]) == 0
    rng = np.random.default_rng(4)
    n, B = max(lengths), len(lengths)
    ids = rng.integers(1, 256, (B, n))
    mask = np.array([[0] * (n - m) + [1] * m for m in lengths], np.int64)
    steps = rng.integers(1, 256, (40, B, 1))
    got = {}
    for graph in (False, True):
        dec = InPlaceDecoder(out, device="cuda", cuda_graph=graph)
        assert dec.cuda_graph == graph
        dec.reset(B, 96)
        m = mask
        logits = [dec.step(ids, m)]
        for t in steps:
            m = np.concatenate([m, np.ones((B, 1), np.int64)], axis=1)
            logits.append(dec.step(t, m))
        got[graph] = np.stack(logits)
    scale = np.abs(got[False]).max()
    diff = np.abs(got[True] - got[False]).max()
    assert diff <= 1e-2 * scale, f"max |graph - launched| {diff:.2e} (logits up to {scale:.2e})"
    assert np.mean(got[True].argmax(-1) == got[False].argmax(-1)) >= 0.95


@pytest.mark.parametrize("host_logits", ["float32", "model"])
@pytest.mark.parametrize("graph", [True, False], ids=["cuda-graph", "launched"])
def test_greedy_steps_on_the_device_match_host_argmax(folders, graph, host_logits):
    """step(None) feeds each row the argmax of its last logits without the ids crossing to the host (the head
    session writes them into the step's input buffer; with host_logits="model" it runs only when a greedy step
    needs it): the same tokens and logits as feeding the host's argmax, in the dtype asked for."""
    from dot4attn.runtime.inplace import InPlaceDecoder

    _, out = folders("qwen3-d128")
    prompt = np.random.default_rng(5).integers(1, 256, (2, 7))
    device, host = (InPlaceDecoder(out, device="cuda", cuda_graph=graph, host_logits=host_logits) for _ in range(2))
    for dec in (device, host):
        dec.reset(2, 64)
    a, b = device.step(prompt), host.step(prompt)
    for _ in range(24):
        nxt = b.astype(np.float32).argmax(-1)[:, None]
        a, b = device.step(None), host.step(nxt)
        assert a.dtype == (np.float32 if host_logits == "float32" else device.logits_dtype)
        assert a.shape == (2, device.vocab)
        np.testing.assert_array_equal(a, b)
    for _ in range(8):  # greedy_step: the same tokens, only the ids reaching the host
        ids = device.greedy_step()
        b = host.step(b.astype(np.float32).argmax(-1)[:, None])
        np.testing.assert_array_equal(ids, b.astype(np.float32).argmax(-1))


@pytest.mark.parametrize("which", ["original", "rewritten"])
def test_a_copied_prompt_decodes_like_the_batch_prompt_on_cuda(folders, which):
    """prompt_copied on the device (the end-to-end benchmark's way to a batch whose prompt does not fit), for the
    builder's folder (GroupQueryAttention) and the rewritten one: in one call, the batch prompt's logits and then
    the same logits over replayed steps in every row; in chunks, row 0 is the batch-1 decoder fed the same chunks."""
    from dot4attn.runtime.inplace import InPlaceDecoder

    src, out = folders("qwen3-d128")
    folder = src if which == "original" else out
    seq = np.random.default_rng(9).integers(1, 256, 21)
    copied, batched, single = (InPlaceDecoder(folder, device="cuda", cuda_graph=True) for _ in range(3))
    for dec, batch in ((copied, 3), (batched, 3), (single, 1)):
        dec.reset(batch, 48)
    lc, lb = copied.prompt_copied(seq[None], chunk=32), batched.step(np.repeat(seq[None], 3, axis=0))
    np.testing.assert_allclose(lc, lb, atol=2e-2, rtol=0)  # float16; the same prompt at batch 1 and at batch 3
    for _ in range(8):
        nxt = lb.argmax(-1)[:, None]  # the same tokens for both (a near tie must not split them)
        lc, lb = copied.step(nxt), batched.step(nxt)
        np.testing.assert_allclose(lc, lb, atol=2e-2, rtol=0)
        np.testing.assert_array_equal(lc[1:], np.repeat(lc[:1], 2, axis=0))
    copied.reset(3, 48)
    lc = copied.prompt_copied(seq[None], chunk=8)
    for s in range(0, 21, 8):
        ls = single.step(seq[None, s:s + 8])
    np.testing.assert_array_equal(lc[0], ls[0])
    for _ in range(4):
        nxt = ls.argmax(-1)[:, None]
        lc, ls = copied.step(np.repeat(nxt, 3, axis=0)), single.step(nxt)
        np.testing.assert_allclose(lc, np.repeat(ls, 3, axis=0), atol=2e-2, rtol=0)


@pytest.mark.parametrize("which", ["original", "rewritten"])
def test_og_runner_replays_with_enable_cuda_graph(folders, which):
    """The end-to-end benchmark's og runner with enable_cuda_graph=1 set at load: a batch-1 prompt and 16
    teacher-forced steps give the launched runner's logits to float16 rounding, for the builder's folder and the
    rewritten one; and a batch of 2 replays for the rewritten one only (ORT's GroupQueryAttention refuses genai's
    graph-mode prompt at batch > 1)."""
    from dot4attn.e2e.runners import make_runner, start

    src, out = folders("qwen3-d128")
    folder = src if which == "original" else out
    rng = np.random.default_rng(6)
    prompt, forced = rng.integers(1, 256, (1, 12)), rng.integers(1, 256, (16, 1, 1))
    got = {}
    for graph in (False, True):
        r = make_runner("og", folder, "cuda", cuda_graph=graph)
        start(r, prompt, 64, 12)
        got[graph] = np.stack([np.asarray(r.step(t), np.float32) for t in forced])
        r.close()
    scale, diff = np.abs(got[False]).max(), np.abs(got[True] - got[False]).max()
    assert diff <= 1e-2 * scale, f"max |graph - launched| {diff:.2e} (logits up to {scale:.2e})"
    r = make_runner("og", folder, "cuda", cuda_graph=True)
    batch = np.concatenate([prompt, prompt])
    if which == "original":
        with pytest.raises(Exception, match="batch_size must be 1"):
            start(r, batch, 64, 12)
    else:
        start(r, batch, 64, 12)
        steps = np.stack([np.asarray(r.greedy_step(), np.float32) for _ in range(4)])
        np.testing.assert_array_equal(steps[:, 0], steps[:, 1])  # two copies of one prompt stay alike
    r.close()


@pytest.mark.parametrize("v_format", ["q4_0", "q6_0"])
@pytest.mark.parametrize("graph", [False, True], ids=["launched", "enable_cuda_graph"])
def test_pair_folder_runs_under_og_on_cuda(folders, tmp_path, graph, v_format):
    """A q4_0 or q6_0 V folder in the pair layout (K and V caches of one width: what a genai user runs) under
    og.Generator on the CUDA EP, launched and replayed as a CUDA graph: a batch-1 prompt and 24 teacher-forced steps
    give the logits of the in-place runner over the rows layout of the same model (the same packed values, in other
    places) to float16 rounding."""
    from dot4attn.e2e.runners import make_runner, start

    src, _ = folders("qwen3-d128")
    pair, rows = tmp_path / "pair", tmp_path / "rows"
    assert cli(["rewrite", str(src), str(pair), "--v-format", v_format]) == 0
    assert cli(["rewrite", str(src), str(rows), "--v-format", v_format, "--for-inplace-runner"]) == 0
    facts = json.loads((pair / "dot4attn.json").read_text())
    assert (facts["cache_layout"], facts["v_format"]) == ("pair", v_format), facts
    rng = np.random.default_rng(8)
    prompt, forced = rng.integers(1, 256, (1, 40)), rng.integers(1, 256, (24, 1, 1))
    got = {}
    for name, folder, kind in (("og", pair, "og"), ("inplace", rows, "inplace")):
        r = make_runner(kind, folder, "cuda", cuda_graph=graph)
        start(r, prompt, 96, 40)
        got[name] = np.stack([np.asarray(r.step(t), np.float32) for t in forced])
        r.close()
    scale, diff = np.abs(got["inplace"]).max(), np.abs(got["og"] - got["inplace"]).max()
    assert diff <= 1e-2 * scale, f"max |og pair - in-place rows| {diff:.2e} (logits up to {scale:.2e})"
