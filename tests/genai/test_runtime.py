"""dot4attn.runtime: the one Decoder interface (reset / prefill / step / greedy_step / release / close,
cache_bytes_per_token) over its three runners. Each runner implements it; OgDecoder and InPlaceDecoder give the
same logits over one folder; a prefill in chunks is a prefill in one call; greedy_step feeds the last argmax."""
from __future__ import annotations

import numpy as np
import pytest
from genai_support import genai_model

from dot4attn import formats
from dot4attn.cli import main as cli
from dot4attn.runtime import Decoder, open_decoder
from dot4attn.runtime.decoder import greedy


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    src = genai_model("qwen3-d128", "fp32")
    dst = tmp_path_factory.mktemp("runtime") / "q8_0"
    assert cli(["rewrite", str(src), str(dst)]) == 0
    return src, dst


def _prompt(n=24, seed=5):
    return np.random.default_rng(seed).integers(3, 256, size=(1, n)).astype(np.int64)


@pytest.mark.parametrize("runner", ["og", "inplace"])
def test_every_runner_is_a_decoder_and_chunks_change_nothing(folders, runner):
    _, folder = folders
    dec = open_decoder(folder, runner=runner)
    assert isinstance(dec, Decoder)
    prompt = _prompt()
    dec.reset(1, 64)
    whole = dec.prefill(prompt)
    steps = [dec.step(np.array([[7]]))]
    dec.reset(1, 64)
    chunked = dec.prefill(prompt, chunk=5)  # 5 calls: 5, 5, 5, 5, 4 tokens
    assert dec.length == prompt.shape[1]
    np.testing.assert_allclose(chunked, whole, atol=1e-5, rtol=0)
    np.testing.assert_allclose(dec.step(np.array([[7]])), steps[0], atol=1e-5, rtol=0)
    nxt = dec.greedy_step()
    assert nxt.shape == (1,) and dec.length == prompt.shape[1] + 2
    dec.reset(1, 64)  # every position's logits: the last is what prefill gives, and a step is one position
    every = dec.step_all(prompt)
    assert every.shape[:2] == prompt.shape and every.dtype == np.float32
    np.testing.assert_allclose(every[:, -1], whole, atol=1e-5, rtol=0)
    np.testing.assert_allclose(dec.step_all(np.array([[7]]))[:, 0], steps[0], atol=1e-5, rtol=0)
    # the rewritten folder's cache rows: packed K and q8_0 V, as formats says
    facts = __import__("json").loads((folder / "dot4attn.json").read_text())
    layers, heads, d = facts["layers"], facts["kv_heads"], facts["head_size"]
    assert dec.cache_bytes_per_token() == formats.bytes_per_token(layers, heads, d, v="q8_0")
    dec.release()
    dec.close()


def test_og_and_inplace_runners_agree_and_greedy_runs_on_either(folders):
    src, folder = folders
    prompt = _prompt(16, seed=9)
    logits = []
    for runner in ("og", "inplace"):
        dec = open_decoder(folder, runner=runner)
        dec.reset(1, 40)
        out = [dec.prefill(prompt, chunk=8)]
        for t in (11, 12, 13):
            out.append(dec.step(np.array([[t]])))
        logits.append(np.concatenate(out))
        dec.close()
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4, rtol=0)
    tokens = [greedy(open_decoder(src, runner=r), [list(prompt[0])], 6) for r in ("og", "inplace")]
    assert tokens[0] == tokens[1]
    # greedy steps, then teacher-forced steps again (og rewinds the token its generate_next_token appended ahead)
    seen = []
    for runner in ("og", "inplace"):
        dec = open_decoder(folder, runner=runner)
        dec.reset(1, 40)
        dec.prefill(prompt)
        ids = [dec.greedy_step(), dec.greedy_step()]
        after = [dec.step(None), dec.step(np.array([[21]]))]
        ids.append(dec.greedy_step())
        seen.append((np.concatenate(ids), np.concatenate(after), dec.length))
        dec.close()
    np.testing.assert_array_equal(seen[0][0], seen[1][0])
    np.testing.assert_allclose(seen[0][1], seen[1][1], atol=1e-4, rtol=0)
    assert seen[0][2] == seen[1][2] == prompt.shape[1] + 5


def test_open_decoder_picks_by_what_the_path_is(folders, tmp_path):
    src, folder = folders
    assert type(open_decoder(src)).__name__ == "OgDecoder"
    assert type(open_decoder(folder, runner="inplace")).__name__ == "InPlaceDecoder"
    with pytest.raises(ValueError, match="runner: expected og or inplace"):
        open_decoder(folder, runner="fast")
    with pytest.raises(ValueError, match="og.Generator pads prompts itself"):
        dec = open_decoder(folder)
        dec.reset(1, 8)
        dec.prefill(_prompt(4), mask=np.array([[0, 1, 1, 1]]))


def test_threads_set_either_runners_intra_op_threads(folders):
    """threads=N: the in-place runner's session runs N intra-op threads, og.Generator's gets them through its
    config's session options; the logits do not change (the benchmark gives every row the same count:
    dot4attn.e2e.runners)."""
    _, folder = folders
    prompt = _prompt(12, seed=3)
    dec = open_decoder(folder, runner="inplace", threads=1)
    assert dec.sess.get_session_options().intra_op_num_threads == 1
    dec.close()
    got = {}
    for runner in ("og", "inplace"):
        for threads in (None, 1):
            d = open_decoder(folder, runner=runner, threads=threads)
            d.reset(1, 32)
            got[runner, threads] = d.prefill(prompt)
            d.close()
    for key, logits in got.items():
        np.testing.assert_allclose(logits, got["og", None], atol=1e-5, rtol=0, err_msg=str(key))
