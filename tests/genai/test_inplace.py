"""dot4attn.runtime.inplace: genai folders decoded with the caches bound in place (ORT IO binding), no cache bytes on the
host per token; the same logits as og.Generator, and folders genai cannot run (V q4_0)."""
from __future__ import annotations

import numpy as np
import pytest
from genai_support import agreement, genai_model, teacher_forced_logits

from dot4attn.cli import main as cli
from dot4attn.quality.compare import MAX_MEAN_KL
from dot4attn.runtime.decoder import greedy
from dot4attn.runtime.inplace import InPlaceDecoder


def _steps(folder, tokens):
    dec = InPlaceDecoder(folder)
    dec.reset(1, len(tokens) + 1)
    return np.stack([dec.step(np.array([[t]]))[0] for t in tokens])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    src = genai_model("qwen3-d128", "fp32")
    out = {}
    for fmt in ("q8_0", "q4_0", "q6_0"):
        dst = tmp_path_factory.mktemp("inplace") / fmt
        # q4_0 / q6_0 V: folders for the in-place runner only (og.Generator cannot allocate their V caches)
        narrow = fmt in ("q4_0", "q6_0")
        assert cli(["rewrite", str(src), str(dst), "--v-format", fmt] + ["--for-inplace-runner"] * narrow) == 0
        out[fmt] = dst
    return src, out


def test_same_logits_as_og_generator(folders):
    src, out = folders
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 256, 32)]
    for folder in (src, out["q8_0"]):
        np.testing.assert_allclose(_steps(folder, tokens), teacher_forced_logits(folder, tokens, "steps"),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["q4_0", "q6_0"])
def test_q4_0_and_q6_0_values_run_in_place(folders, capsys, fmt):
    """V q4_0 / q6_0 written --for-inplace-runner (a narrower V cache than K's, which genai 0.18 cannot allocate):
    dot4attn generate picks the in-place runner; teacher-forced KL vs the original within the format's bar of the
    rewrite tests."""
    src, out = folders
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, 256, 64)]
    _, kl = agreement(_steps(src, tokens), _steps(out[fmt], tokens))
    assert kl <= MAX_MEAN_KL[fmt], kl
    assert cli(["generate", str(out[fmt]), "--token-ids", "5,6,7", "--max-new-tokens", "16"]) == 0
    printed = capsys.readouterr().out
    assert "in-place cache" in printed and len(printed.splitlines()[0].split()) == 17
    # og.Generator cannot allocate its V cache: asked for, the folder is refused with the reason, not run into
    # genai's 'invalid dimensions'
    assert cli(["generate", str(out[fmt]), "--runner", "og", "--token-ids", "5,6,7"]) == 2
    assert "rewritten for dot4attn's in-place runner" in capsys.readouterr().err


def test_batch_greedy_and_cache_accounting(folders):
    _, out = folders
    dec = InPlaceDecoder(out["q8_0"])
    toks = greedy(dec, [[5, 6, 7, 8, 9], [10, 11]], 6, pad=256)
    assert [len(t) for t in toks] == [6, 6]
    assert dec.cache_bytes_per_token() == 2 * 2 * 2 * 144  # layers x kv heads x (K, V) x row bytes at D = 128
    assert dec.cache_bytes() == 2 * (5 + 6) * dec.cache_bytes_per_token()
    assert dec.length == 5 + 5  # the prompt and five steps: the sixth token comes from the fifth step's logits
    dec.step(np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match="exceed the cache's max_length"):
        dec.step(np.zeros((2, 1), np.int64))


def test_generate_batch_in_place(folders, capsys):
    """dot4attn generate --runner inplace --batch 2: two identical prompts decode to the same greedy tokens."""
    _, out = folders
    assert cli(["generate", str(out["q4_0"]), "--runner", "inplace", "--token-ids", "5,6,7", "--max-new-tokens", "8",
                "--batch", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tokens:")]
    assert len(rows) == 2 and rows[0] == rows[1] and len(rows[0].split()) == 9
    assert cli(["generate", str(out["q8_0"]), "--runner", "og", "--token-ids", "5", "--batch", "2"]) == 2
    assert "--batch needs --runner inplace" in capsys.readouterr().err


def test_device_cuda_picks_the_in_place_runner_for_rewritten_folders(folders):
    """--device cuda on a rewritten folder: the cache stays on the GPU, bound in place (no per-token host copy);
    an original builder folder keeps onnxruntime-genai (its genai_config picks the device)."""
    import argparse

    from dot4attn.cli.generate import _genai_runner

    src, out = folders
    args = lambda model, device: argparse.Namespace(model=str(model), device=device, runner="auto")  # noqa: E731
    assert _genai_runner(args(out["q8_0"], "cuda")) == "inplace"
    assert _genai_runner(args(out["q8_0"], "cpu")) == "og"
    assert _genai_runner(args(out["q4_0"], "cpu")) == "inplace"
    assert _genai_runner(args(out["q6_0"], "cpu")) == "inplace"  # written for it
    assert _genai_runner(args(src, "cuda")) == "og"


def test_cuda_graph_needs_the_cuda_device(folders):
    _, out = folders
    with pytest.raises(ValueError, match="cuda_graph needs device='cuda'"):
        InPlaceDecoder(out["q8_0"], device="cpu", cuda_graph=True)
    assert not InPlaceDecoder(out["q8_0"]).cuda_graph  # the CPU default


def test_a_mask_of_the_wrong_shape_is_refused(folders):
    _, out = folders
    dec = InPlaceDecoder(out["q8_0"])
    dec.reset(2, 16)
    with pytest.raises(ValueError, match=r"mask: expected shape \[batch=2, 3\]"):
        dec.step(np.zeros((2, 3), np.int64), np.ones((2, 4), np.int64))
    assert dec.length == 0


def test_greedy_steps_feed_the_last_argmax(folders):
    """step(None): each row's next token is the argmax of its last logits (after a prompt from the host's copy,
    after a one-token step from the head session's, on the model's device): the same logits as feeding it."""
    _, out = folders
    prompt = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    a, b = InPlaceDecoder(out["q8_0"]), InPlaceDecoder(out["q8_0"])
    for dec in (a, b):
        dec.reset(2, 16)
    la, lb = a.step(prompt), b.step(prompt)
    for _ in range(6):
        la, lb = a.step(None), b.step(lb.argmax(-1)[:, None])
        assert la.dtype == np.float32
        np.testing.assert_array_equal(la, lb)
    fresh = InPlaceDecoder(out["q8_0"])
    fresh.reset(1, 8)
    with pytest.raises(ValueError, match="run a prompt first"):
        fresh.step(None)


@pytest.mark.parametrize("host_logits", ["float32", "model"])
def test_greedy_step_hands_back_the_next_ids(folders, host_logits):
    """greedy_step(): the tokens step(None) would feed next (the argmax of this step's logits), with nothing but
    those ids reaching the host; step(None) after it feeds the same ids without running the head again."""
    _, out = folders
    prompt = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    a, b = InPlaceDecoder(out["q8_0"], host_logits=host_logits), InPlaceDecoder(out["q8_0"])
    for dec in (a, b):
        dec.reset(2, 16)
    nxt, lb = a.step(prompt).argmax(-1), b.step(prompt)
    for _ in range(5):
        np.testing.assert_array_equal(nxt, lb.argmax(-1))
        nxt, lb = a.greedy_step(), b.step(lb.argmax(-1)[:, None])
        assert nxt.dtype == np.int64 and nxt.shape == (2,)
    np.testing.assert_array_equal(nxt, lb.argmax(-1))
    la, lb = a.step(None), b.step(nxt[:, None])
    np.testing.assert_array_equal(np.asarray(la, np.float32), lb)
    assert a.length == b.length == 4 + 6
    # the head (Cast + ArgMax) runs one thread: a pool of its own beside the decoder's slowed CPU steps at batch 2
    assert a._head_session.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize("which", ["original", "q8_0", "q4_0"])
def test_one_prefilled_sequence_copied_to_the_batch(folders, which):
    """prompt_copied: one sequence prefilled (in chunks) and its cache copied to every batch row decodes like the
    same sequence prompted in every row at once: the same logits in every row, then the same greedy steps."""
    src, out = folders
    folder = src if which == "original" else out[which]
    seq = np.random.default_rng(7).integers(0, 256, 11)
    copied, batched = InPlaceDecoder(folder), InPlaceDecoder(folder)
    copied.reset(3, 24)
    batched.reset(3, 24)
    lc = copied.prompt_copied(seq[None], chunk=4)
    lb = batched.step(np.repeat(seq[None], 3, axis=0))
    assert copied.length == batched.length == 11 and lc.shape == lb.shape == (3, copied.vocab)
    np.testing.assert_allclose(lc, lb, atol=1e-5, rtol=0)
    for _ in range(4):
        lc, lb = copied.step(None), batched.step(None)
        np.testing.assert_allclose(lc, lb, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(lc[1:], np.repeat(lc[:1], 2, axis=0))


def test_a_copied_prompt_refuses_what_it_cannot_do(folders):
    _, out = folders
    dec = InPlaceDecoder(out["q8_0"])
    dec.reset(2, 8)
    with pytest.raises(ValueError, match=r"expected one sequence \[1, S >= 1\], got shape \(2, 3\)"):
        dec.prompt_copied(np.zeros((2, 3), np.int64), chunk=4)
    with pytest.raises(ValueError, match="9 tokens exceed the cache's max_length 8"):
        dec.prompt_copied(np.zeros((1, 9), np.int64), chunk=4)
    dec.prompt_copied(np.zeros((1, 3), np.int64), chunk=4)
    with pytest.raises(ValueError, match="3 tokens are already in the cache"):
        dec.prompt_copied(np.zeros((1, 3), np.int64), chunk=4)


def test_host_logits_in_the_model_dtype(folders):
    """host_logits="model": the same logits in the model's dtype (what og's get_output hands over), after a prompt,
    a copied prompt and one-token steps; anything else is refused."""
    _, out = folders
    prompt = np.array([[5, 6, 7, 8]])
    a, b = InPlaceDecoder(out["q8_0"]), InPlaceDecoder(out["q8_0"], host_logits="model")
    for dec in (a, b):
        dec.reset(1, 12)
    np.testing.assert_array_equal(a.step(prompt), b.step(prompt).astype(np.float32))
    for t in (9, 10):
        la, lb = a.step(np.array([[t]])), b.step(np.array([[t]]))
        assert lb.dtype == b.logits_dtype
        np.testing.assert_array_equal(la, lb.astype(np.float32))
    for _ in range(3):  # greedy: b's argmax head runs only now, over the logits its last step left on the device
        la, lb = a.step(None), b.step(None)
        np.testing.assert_array_equal(la, lb.astype(np.float32))
    b.fill(4)
    with pytest.raises(ValueError, match=r"none since fill\(\)"):
        b.step(None)
    b.reset(2, 8)
    assert b.prompt_copied(prompt, chunk=2).dtype == b.logits_dtype
    with pytest.raises(ValueError, match="host_logits: expected 'float32' or 'model'"):
        InPlaceDecoder(out["q8_0"], host_logits="float16")
