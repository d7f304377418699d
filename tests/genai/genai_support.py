"""Builder-made genai folders for the tests, cached under $DOT4ATTN_MODEL_CACHE/genai (built once per shape,
precision, EP and package versions), and onnxruntime-genai runs that return logits."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dot4attn.quality.compare import logit_metrics


def og():
    return pytest.importorskip("onnxruntime_genai", reason="pip install '.[genai]' (CI installs it)")


def cache_root() -> Path:
    from dot4attn.models.export import model_cache_dir

    return model_cache_dir() / "genai"


def genai_model(shape: str, precision: str = "fp32", ep: str = "cpu") -> Path:
    """The builder's folder for SHAPES[shape] (2 layers, seed 0), built on first use."""
    og()
    pytest.importorskip("transformers")
    from importlib.metadata import PackageNotFoundError, version

    from dot4attn.models.genai_builder import build_genai, make_hf_model

    try:
        og_version = version("onnxruntime-genai")
    except PackageNotFoundError:  # the CUDA wheel's distribution name
        og_version = version("onnxruntime-genai-cuda")
    key = hashlib.sha1(f"{og_version}-{version('transformers')}-{version('torch')}".encode())
    out = cache_root() / f"{shape}-{precision}-{ep}-{key.hexdigest()[:10]}"
    if (out / "genai_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        hf = make_hf_model(shape, tmp / "hf")
        build_genai(hf, tmp / "model", precision, ep)
        os.replace(tmp / "model", out) if not out.exists() else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def teacher_forced_logits(folder, tokens: list[int], mode: str) -> np.ndarray:
    """[len(tokens), vocab] logits: the whole prompt at once ("prompt") or one token per step ("steps")."""
    g_ = og()
    model = g_.Model(str(folder))
    params = g_.GeneratorParams(model)
    params.set_search_options(max_length=len(tokens) + 4, do_sample=False)
    gen = g_.Generator(model, params)
    if mode == "prompt":
        gen.append_tokens([tokens])
        return np.asarray(gen.get_output("logits"))[0].astype(np.float64)
    rows = []
    for t in tokens:
        gen.append_tokens([[t]])
        rows.append(np.asarray(gen.get_output("logits"))[0, -1].astype(np.float64))
    return np.stack(rows)


def batch_logits(folder, prompts: list[list[int]], new_tokens: int, share: bool, pad: int = 256) -> tuple:
    """Greedy batch run (left-padded prompts): (tokens [B][new], last-position logits [B, new + 1, vocab])."""
    g_ = og()
    model = g_.Model(str(folder))
    params = g_.GeneratorParams(model)
    n = max(len(p) for p in prompts)
    params.set_search_options(max_length=n + new_tokens, do_sample=False, batch_size=len(prompts),
                              past_present_share_buffer=share)
    gen = g_.Generator(model, params)
    gen.append_tokens(np.array([[pad] * (n - len(p)) + p for p in prompts], np.int32))
    logits = [np.asarray(gen.get_output("logits"))[:, -1].astype(np.float64)]
    toks = [[] for _ in prompts]
    for _ in range(new_tokens):
        gen.generate_next_token()
        for b, t in enumerate(gen.get_next_tokens()):
            toks[b].append(int(t))
        logits.append(np.asarray(gen.get_output("logits"))[:, -1].astype(np.float64))
    return toks, np.stack(logits, 1)


def agreement(a: np.ndarray, b: np.ndarray, tie: float = 0.0) -> tuple[float, float]:
    """(top-1 agreement, mean KL(a || b)) over the rows of two logit arrays [..., vocab]. With `tie` > 0 a row also
    agrees when a's logit for b's top token is within `tie` of a's top logit: two tokens the reference a does not
    separate by more than its own noise (reference_noise) are a tie, not a disagreement."""
    agree, kl, _ = logit_metrics(a, b)
    if tie > 0:
        a2, pick = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]).argmax(-1)
        agree = agree.reshape(-1) | (a2.max(-1) - a2[np.arange(len(pick)), pick] <= tie)
    return float(agree.mean()), float(kl.mean())


def reference_noise(prompt_logits: np.ndarray, steps_logits: np.ndarray) -> float:
    """How far a model's logits move between its two runs over the same tokens (teacher_forced_logits "prompt" and
    "steps"): the largest difference. Float32 builder models move < 1e-6; some int4 ones ~1e-2: their MatMulNBits
    (accuracy level 4, int8 activations) do not give a 64-token prompt the logits of 64 one-token steps. A random
    model's logits are nearly flat (qwen3-d128: std 0.23, median top-2 gap 0.03), so some top-2 gaps fall below that
    noise, and which tokens win there depends on the reference's own code path (and the CPU's ISA)."""
    return float(np.abs(prompt_logits - steps_logits).max())


def teacher_forced_agreement(src: Path, out: Path,
                             tokens: list[int]) -> tuple[dict[str, tuple[float, float]], float]:
    """Per mode ("prompt", "steps"): (top-1, mean KL) of `out`'s teacher-forced logits against `src`'s, a flip
    within src's own prompt-vs-steps noise counted as a tie; and that noise (reference_noise)."""
    ref = {mode: teacher_forced_logits(src, tokens, mode) for mode in ("prompt", "steps")}
    tie = reference_noise(ref["prompt"], ref["steps"])
    return {mode: agreement(lg, teacher_forced_logits(out, tokens, mode), tie) for mode, lg in ref.items()}, tie


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}
