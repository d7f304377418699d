"""Random-weight onnxruntime-genai model folders for tests and benchmarks, made offline: a Hugging Face Qwen2 /
Qwen3 / Llama / Phi-3 / Mistral model saved with transformers (weights from a seed; the speed and the agreement
checks need real shapes, not real weights), a word-level tokenizer, then onnxruntime-genai's model builder.

    hf = make_hf_model("qwen3-d128", tmp / "hf")
    folder = build_genai(hf, tmp / "fp32-cpu", precision="fp32", ep="cpu")
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

VOCAB = 257  # 256 word tokens t0..t255 and <|endoftext|> (also the pad token)
PAD = 256

# name -> (architecture, config fields). Small enough to build in seconds; the head shapes are the point.
SHAPES = {
    # Qwen2 (q/k/v biases), 4 query / 2 KV heads of D = 32
    "qwen2-bias": ("qwen2", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                 num_key_value_heads=2)),
    # Qwen3 (q_norm / k_norm), D = 128
    "qwen3-d128": ("qwen3", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=128)),
    # 7 query heads per KV head, D = 64 (Qwen2.5-0.5B's head layout)
    "gqa7-d64": ("qwen2", dict(hidden_size=448, intermediate_size=512, num_attention_heads=7,
                               num_key_value_heads=1)),
    # Llama (separate q/k/v projections, no biases), D = 32
    "llama": ("llama", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)),
    # Phi-3 mini (fused qkv_proj and gate_up_proj; the builder's Phi3MiniModel: max = original positions), D = 32
    "phi3": ("phi3", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)),
    # Mistral with its config's sliding window (4096, as Mistral-7B v0.1's), D = 32
    "mistral": ("mistral", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                num_key_value_heads=2, sliding_window=4096)),
    # Real model shapes for the end-to-end benchmark (random weights).
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                                   num_key_value_heads=2, num_hidden_layers=24, vocab_size=151936)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                                 num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064)),
}


def make_hf_model(shape: str, out: str | os.PathLike, *, layers: int | None = None, seed: int = 0,
                  max_positions: int = 4096, init_range: float = 0.02, dtype: str = "float32",
                  device: str = "cpu") -> Path:
    """Saves a random-weight Hugging Face model of SHAPES[shape] and a word-level tokenizer into `out`.

    layers: the decoder layers (None: the shape's own count where SHAPES gives one, as the real shapes do, else 2).
    dtype / device: where the weights are made. A 7B shape in float32 on the CPU takes 30 GB and minutes of
    random init; float16 on a CUDA device takes seconds (the builder reads the saved safetensors either way)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    import transformers
    from transformers import PreTrainedTokenizerFast

    arch, fields = SHAPES[shape]
    fields = dict(fields)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    fields.setdefault("num_hidden_layers", 2)
    fields.setdefault("vocab_size", VOCAB)
    if arch == "phi3":  # equal to max_position_embeddings: the builder's Phi-3 mini (no LongRoPE factors)
        fields.setdefault("original_max_position_embeddings", max_positions)
        fields.setdefault("pad_token_id", PAD)  # Phi3Config's default (32000) is outside this vocabulary
    prefix = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "phi3": "Phi3", "mistral": "Mistral"}[arch]
    config_cls = getattr(transformers, f"{prefix}Config")
    model_cls = getattr(transformers, f"{prefix}ForCausalLM")
    cfg = config_cls(**fields, max_position_embeddings=max_positions, eos_token_id=PAD, bos_token_id=PAD,
                     tie_word_embeddings=False, initializer_range=init_range)
    torch.manual_seed(seed)
    with torch.device(device):
        model = (model_cls(cfg) if dtype == "float32" else
                 model_cls._from_config(cfg, dtype=getattr(torch, dtype))).eval()
    out = Path(out)
    model.save_pretrained(out)
    vocab = {f"t{i}": i for i in range(256)}
    vocab["<|endoftext|>"] = PAD
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                            pad_token="<|endoftext|>").save_pretrained(out)
    return out


def build_genai(hf_dir: str | os.PathLike, out: str | os.PathLike, precision: str = "fp32", ep: str = "cpu",
                extra: dict[str, str] | None = None, python: str | None = None) -> Path:
    """Runs onnxruntime-genai's model builder on `hf_dir` (offline); returns the genai folder."""
    out = Path(out)
    cmd = [python or sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf_dir), "-i", str(hf_dir),
           "-o", str(out), "-p", precision, "-e", ep, "-c", str(out) + ".cache"]
    if extra:
        cmd += ["--extra_options"] + [f"{k}={v}" for k, v in extra.items()]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0 or not (out / "genai_config.json").is_file():
        raise RuntimeError(f"model builder failed ({' '.join(cmd)}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return out


def atomic_dir(dst: Path, make: Callable[[Path], None]) -> Path:
    """dst if it exists; else make(tmp) into a fresh folder beside dst, renamed to dst (atomic on one filesystem:
    a reader sees the whole folder or none; a process that loses the race keeps the winner's)."""
    if dst.is_dir():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        make(tmp)
        try:
            os.rename(tmp, dst)
        except OSError:
            if not dst.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


# ---- ORT's int8 KV cache: the builder's kv_cache_quant_scheme with a scale file calibrated on the model's own cache

INT8_SCHEME = "int8_per_channel"
QMAX_INT8 = 128.0  # the builder's divisor for a scale file's thresholds (scale = threshold / qmax)


def calibrate_kv(folder: Path, ids: np.ndarray, device: str = "cpu") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-layer K and V thresholds ([kv_heads * head_size] each) from the float folder's own cache after the
    prompt ids [1, S]. K is stored after the rotation, which turns channel i and i + D/2 together (the builder's
    rotary is not interleaved): a threshold from one prompt would miss where later positions rotate a pair, so both
    channels of a pair take the pair's largest norm (as onnxruntime-genai's own calibration does). V: abs-max."""
    from ..runtime.inplace import InPlaceDecoder

    ids = np.asarray(ids, np.int64).reshape(1, -1)
    dec = InPlaceDecoder(folder, device=device)
    n = ids.shape[1]
    dec.reset(1, n)
    dec.step(ids)
    k_thr, v_thr = [], []
    for layer in sorted({int(name.split(".")[1]) for name in dec.caches}):
        k = dec.values[f"past_key_values.{layer}.key"].numpy()[0, :, :n].astype(np.float32)  # [H, S, D]
        v = dec.values[f"past_key_values.{layer}.value"].numpy()[0, :, :n].astype(np.float32)
        half = k.shape[-1] // 2
        pair = np.hypot(k[..., :half], k[..., half:]).max(axis=1)  # [H, D/2]
        k_thr.append(np.concatenate([pair, pair], axis=-1).reshape(-1))
        v_thr.append(np.abs(v).max(axis=1).reshape(-1))
    dec.close()
    return k_thr, v_thr


def write_kv_scales(thresholds, path: Path) -> None:
    """The builder's kv_cache_scale_file: {"scales": {"k_scales": [...], "v_scales": [...]}, "layer_ids", "qmax"},
    written atomically."""
    k_thr, v_thr = thresholds
    scale = lambda t: (np.maximum(t, 1e-6) / QMAX_INT8).astype(float).tolist()  # noqa: E731
    data = {"scales": {"k_scales": [scale(t) for t in k_thr], "v_scales": [scale(t) for t in v_thr]},
            "layer_ids": list(range(len(k_thr))), "qmax": QMAX_INT8}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
