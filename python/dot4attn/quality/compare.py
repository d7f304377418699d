"""Compare a rewritten decoder with its original: the same seeded prompt and teacher-forced decode steps through
both, top-1 agreement of the next-token choice, mean / max KL, max |logit difference| (`dot4attn compare`), and
the project's bars for each V format (quality_failures)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..runtime.session import DecoderSession, positions

# Agreement bars of a rewritten model vs its original over compare()'s prompt + decode steps
# (tests/passes/test_passes.py on the CPU EP, tests/gpu/test_models_cuda.py on CUDA). q4_0 and q6_0 V are held to KL
# only: random weights give near-ties between the top tokens, and 4- / 6-bit V error flips those (q6_0 on the tiny
# test exports: KL 6-9e-4, top-1 86-98 %; q4_0 9e-3 - 1.1e-2).
MIN_TOP1 = 0.95
MAX_MEAN_KL = {"float": 1e-3, "q8_0": 1e-3, "q4_0": 0.1, "q6_0": 5e-3}
KL_ONLY_FORMATS = ("q4_0", "q6_0")  # no top-1 bar


def rewritten_v_format(path: str | os.PathLike) -> str:
    """The V format of a rewritten decoder, to judge it by its own bars: a genai folder's dot4attn.json, or an
    exported model's packed V cache input (past_key_values.N.value_payload: int8 q8_0; uint8 q4_0 or q6_0 by its
    width, D/2 or 3D/4 of the key payload's D; none: float V). A model or folder dot4attn did not write counts as
    float."""
    path = Path(path)
    if path.is_dir():
        from ..model_io import folder_facts

        facts = folder_facts(path)
        return facts.get("v_format", "q8_0") if facts else "float"
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    last_dims = {v.name: v.type.tensor_type.shape.dim[-1].dim_value for v in graph.input
                 if v.type.tensor_type.shape.dim}
    for v in graph.input:
        if v.name.startswith("past_key_values.") and v.name.endswith(".value_payload"):
            if v.type.tensor_type.elem_type != onnx.TensorProto.UINT8:
                return "q8_0"
            d = last_dims.get(v.name[:-len("value_payload")] + "key_payload", 0)
            return "q6_0" if d and 4 * last_dims[v.name] == 3 * d else "q4_0"
    return "float"


def quality_failures(c: "Comparison", v_format: str) -> list[str]:
    """The bars `c` misses for a rewrite with this V format (empty: it passes)."""
    bad = []
    if v_format not in KL_ONLY_FORMATS and c.top1 < MIN_TOP1:
        bad.append(f"top-1 {c.top1:.4f} < {MIN_TOP1}")
    if c.mean_kl > MAX_MEAN_KL[v_format]:
        bad.append(f"mean KL {c.mean_kl:.3e} > {MAX_MEAN_KL[v_format]:.0e}")
    return bad


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@dataclass
class Comparison:
    positions: int = 0
    top1: float = 0.0
    mean_kl: float = 0.0
    max_kl: float = 0.0
    max_abs_logit_diff: float = 0.0
    cache_bytes: tuple[int, int] = (0, 0)
    bytes_per_token: tuple[int, int] = (0, 0)
    seconds: tuple[float, float] = (0.0, 0.0)
    details: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        b0, b1 = self.bytes_per_token
        c0, c1 = self.cache_bytes
        return [
            f"positions compared      : {self.positions}",
            f"top-1 agreement         : {self.top1 * 100:.2f}%",
            f"mean KL(orig || new)    : {self.mean_kl:.3e}   (max {self.max_kl:.3e})",
            f"max |logit diff|        : {self.max_abs_logit_diff:.4f}",
            f"KV bytes per token      : {b0} -> {b1}  ({b0 / max(b1, 1):.2f}x smaller)",
            f"KV cache at the end     : {c0} -> {c1} bytes",
            f"time (prefill + decode) : {self.seconds[0]:.2f}s -> {self.seconds[1]:.2f}s",
        ]


def logit_metrics(la: np.ndarray, lb: np.ndarray):
    """Per position of two logit arrays [..., vocab]: (top-1 agrees, KL(a || b)), and max |la - lb| overall."""
    pa, pb = log_softmax(la), log_softmax(lb)
    kl = (np.exp(pa) * (pa - pb)).sum(-1)
    agree = la.argmax(-1) == lb.argmax(-1)
    return agree, kl, np.abs(la.astype(np.float64) - lb).max()


def _vocab(s: DecoderSession) -> int:
    """The logits' last dim (the vocabulary), or 1000 when the model leaves it symbolic."""
    vocab = s.sess.get_outputs()[0].shape[-1]
    return vocab if isinstance(vocab, int) else 1000


def compare(original: str, rewritten: str, prompt_len: int = 32, steps: int = 32, seed: int = 0,
            batch: int = 1, vocab: int | None = None, threads: int | None = None,
            a: DecoderSession | None = None, b: DecoderSession | None = None) -> Comparison:
    """Prefill `prompt_len` random tokens, then `steps` teacher-forced decode steps (the original's greedy token fed
    to both). Metrics over every prefill position and every decode step."""
    a = a or DecoderSession(original, threads=threads)
    b = b or DecoderSession(rewritten, threads=threads)
    vocab = vocab if vocab is not None else _vocab(a)
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(batch, prompt_len))
    mask = np.ones((batch, prompt_len), np.int64)
    agree, kls, maxdiff = [], [], 0.0
    times = [0.0, 0.0]
    a.reset(batch)
    b.reset(batch)
    cur_ids, cur_mask = ids, mask
    pos = positions(mask)
    for step in range(steps + 1):
        t0 = time.perf_counter()
        la = a.run(cur_ids, cur_mask, pos)
        t1 = time.perf_counter()
        lb = b.run(cur_ids, cur_mask, pos)
        t2 = time.perf_counter()
        times[0] += t1 - t0
        times[1] += t2 - t1
        ag, kl, md = logit_metrics(la, lb)
        agree.append(ag.reshape(-1))
        kls.append(kl.reshape(-1))
        maxdiff = max(maxdiff, float(md))
        nxt = la[:, -1].argmax(-1)[:, None]
        cur_mask = np.concatenate([cur_mask, np.ones((batch, 1), np.int64)], axis=1)
        cur_ids = nxt
        pos = positions(cur_mask)[:, -1:]
    ag = np.concatenate(agree)
    kl = np.concatenate(kls)
    return Comparison(positions=int(ag.size), top1=float(ag.mean()), mean_kl=float(kl.mean()),
                      max_kl=float(kl.max()), max_abs_logit_diff=maxdiff,
                      cache_bytes=(a.cache_bytes(), b.cache_bytes()),
                      bytes_per_token=(a.cache_bytes_per_token(), b.cache_bytes_per_token()),
                      seconds=(times[0], times[1]))


def compare_folders(original: str, rewritten: str, prompt_len: int = 32, steps: int = 32,
                    seed: int = 0) -> Comparison:
    """compare() for two onnxruntime-genai folders (the builder's and `dot4attn rewrite`'s), one sequence: each runs
    under og.Generator (a folder written for the in-place runner under dot4attn.runtime.inplace on the CPU) through
    runtime.open_decoder, the prompt prefilled, then `steps` teacher-forced steps fed the original's greedy token. Metrics
    over the prompt's last position and every step: a runner hands back the last position's logits only.
    Raises GenaiError (not a folder, no onnxruntime-genai, vocabularies that differ)."""
    from ..model_io import GenaiError, context_length, is_genai_folder, read_config
    from ..runtime import open_decoder

    folders = [Path(original), Path(rewritten)]
    # the prompt and every teacher-forced token: the last step's token is the last one the caches hold
    max_length = prompt_len + steps
    for f in folders:
        if not is_genai_folder(f):
            raise GenaiError(f"{f}: not an onnxruntime-genai folder (no genai_config.json)")
        most = context_length(read_config(f))
        if most is not None and max_length > most:
            raise GenaiError(f"{f}: a prompt of {prompt_len} and {steps} steps need {max_length} positions, more than "
                             f"its genai_config.json allows ({most})")
    vocab = read_config(folders[0])["model"].get("vocab_size") or 1000

    prompt = np.random.default_rng(seed).integers(3, vocab, size=(1, prompt_len))
    runners = []
    try:
        for f in folders:  # the runner the folder was written for (dot4attn.json), og.Generator otherwise
            runners.append(open_decoder(f, "cpu"))
        times, last = [], []
        for r in runners:
            r.reset(1, max_length)
            t0 = time.perf_counter()
            last.append(np.asarray(r.prefill(prompt), np.float64))
            times.append(time.perf_counter() - t0)
        la, lb = last
        agree, kls, maxdiff = [], [], 0.0
        for step in range(steps + 1):
            if la.shape != lb.shape:
                raise GenaiError(f"the folders' logits differ in shape: {la.shape} ({original}) vs {lb.shape} "
                                 f"({rewritten}): not the same model")
            ag, kl, md = logit_metrics(la, lb)
            agree.append(ag.reshape(-1))
            kls.append(kl.reshape(-1))
            maxdiff = max(maxdiff, float(md))
            if step == steps:
                break
            token = la.argmax(-1)[:, None]  # the original's greedy token, fed to both
            for i, r in enumerate(runners):
                t0 = time.perf_counter()
                last[i] = np.asarray(r.step(token), np.float64)
                times[i] += time.perf_counter() - t0
            la, lb = last
        per_token = tuple(r.cache_bytes_per_token() for r in runners)
    finally:
        for r in runners:
            r.close()
    ag, kl = np.concatenate(agree), np.concatenate(kls)
    return Comparison(positions=int(ag.size), top1=float(ag.mean()), mean_kl=float(kl.mean()),
                      max_kl=float(kl.max()), max_abs_logit_diff=maxdiff,
                      cache_bytes=tuple(b * (prompt_len + steps) for b in per_token), bytes_per_token=per_token,
                      seconds=(times[0], times[1]))


def padded_batch_vs_single(model: str, prompt_lens=(20, 32), steps: int = 4, seed: int = 1,
                           vocab: int | None = None, sess: DecoderSession | None = None) -> float:
    """Max |logit diff| between a left-padded batch (one row per prompt length) and each row run alone, over the
    real prompt positions and `steps` greedy decode steps."""
    s = sess or DecoderSession(model)
    vocab = vocab if vocab is not None else _vocab(s)
    rng = np.random.default_rng(seed)
    L = max(prompt_lens)
    prompts = [rng.integers(3, vocab, size=n) for n in prompt_lens]
    # singles
    singles = []
    for p in prompts:
        s.reset(1)
        m = np.ones((1, len(p)), np.int64)
        out = [s.run(p[None], m, positions(m))[0]]
        for _ in range(steps):
            nxt = out[-1][-1].argmax()
            m = np.concatenate([m, [[1]]], axis=1)
            out.append(s.run(np.array([[nxt]]), m, positions(m)[:, -1:])[0])
        singles.append(out)
    B = len(prompts)
    ids = np.zeros((B, L), np.int64)
    m = np.zeros((B, L), np.int64)
    for r, p in enumerate(prompts):
        ids[r, L - len(p):] = p
        m[r, L - len(p):] = 1
    s.reset(B)
    worst = 0.0
    lg = s.run(ids, m, positions(m))
    for r, p in enumerate(prompts):
        worst = max(worst, float(np.abs(lg[r, L - len(p):] - singles[r][0]).max()))
    for k in range(steps):
        nxt = np.array([[singles[r][k][-1].argmax()] for r in range(B)])
        m = np.concatenate([m, np.ones((B, 1), np.int64)], axis=1)
        lg = s.run(nxt, m, positions(m)[:, -1:])
        for r in range(B):
            worst = max(worst, float(np.abs(lg[r, -1] - singles[r][k + 1][-1]).max()))
    return worst
