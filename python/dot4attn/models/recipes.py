"""Model recipes: seeded random-weight Qwen2 / Qwen3 decoders built from transformers configs.

Every preset is GQA (more query heads than KV heads) and small enough to export and run in seconds on 2 CPU
cores. `build_model(arch, preset, seed)` gives the same weights for the same arguments on every machine (the
weights come from a seeded torch generator; transformers' own init is not used).
"""
from __future__ import annotations

from dataclasses import dataclass

PRESETS: dict[str, dict] = {
    # name: (head_dim, query heads, kv heads, layers, hidden)
    "tiny": dict(head_dim=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, hidden_size=256),
    "hd128": dict(head_dim=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, hidden_size=256),
    "hd256": dict(head_dim=256, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=2, hidden_size=256),
    "small": dict(head_dim=64, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=4, hidden_size=512),
}
ARCHS = ("qwen2", "qwen3")
VOCAB = 1024
# Logit spread of the random lm_head: a larger spread means fewer near-ties between the top tokens (random weights
# give near-uniform next-token distributions, where top-1 flips on tiny perturbations).
LM_HEAD_GAIN = 1.0


@dataclass
class Recipe:
    arch: str
    preset: str
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.preset}-s{self.seed}"


def make_config(arch: str, preset: str):
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}: expected one of {ARCHS}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {sorted(PRESETS)}")
    p = dict(PRESETS[preset])
    common = dict(
        vocab_size=VOCAB,
        intermediate_size=2 * p["hidden_size"],
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        torch_dtype="float32",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        use_sliding_window=False,
    )
    if arch == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(**p, **common)
    else:
        from transformers import Qwen2Config

        # Qwen2 derives head_dim = hidden / heads; choose hidden so that it comes out right.
        hd = p.pop("head_dim")
        p["hidden_size"] = hd * p["num_attention_heads"]
        common["intermediate_size"] = 2 * p["hidden_size"]
        cfg = Qwen2Config(**p, **common)
        if getattr(cfg, "head_dim", hd) != hd:
            cfg.head_dim = hd
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(arch: str, preset: str, seed: int = 0):
    """A seeded random-weight decoder (eval mode, float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = make_config(arch, preset)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                gain = LM_HEAD_GAIN if name.startswith("lm_head") else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=gen) / fan_in**0.5)
    return model.eval()


def load_hf_dir(path: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()
