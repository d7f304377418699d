"""Which 4-bit V (or K) keeps SmolLM2-135M? A simulation for docs/quality.md: the Hugging Face model in torch with its
V fake-quantized per scheme (v_proj's output, per KV head, before the cache; K and Q stay float, so only V's error
shows), or with --target k its K (after the rotary embedding, as the cache holds it; V and Q float), every position
of a few windows of the shipped text scored against the float model (KL, top-1, PPL ratio). The real caches are
measured by `dot4attn eval --smollm2`; this explores formats the ops do not have.

    PYTHONPATH=python .venv/bin/python tools/v_quant_sim.py --context 512 --windows 2 [--target k]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from dot4attn.models import smollm2
from dot4attn.passes.rotate_v import hadamard
from dot4attn.quality.eval import DEFAULT_TEXT, Tally, tokenize


def fp16(x):
    return x.half().float()


def _levels(xb, s, lo, hi, offset=None):
    safe = torch.where(s == 0, torch.ones_like(s), s)
    x = xb if offset is None else xb - offset
    q = torch.where(s == 0, torch.zeros_like(xb), torch.round(x / safe)).clamp(lo, hi)
    return q * s if offset is None else q * s + offset


def q4_sym(x, block: int, levels16: bool):
    """q4_0: 16 levels (s = v / -8, v the signed max, as docs/ops.md) or the old 15 (s = max|x| / 7)."""
    xb = x.reshape(*x.shape[:-1], -1, block)
    if levels16:
        hi, lo = xb.amax(-1, keepdim=True), xb.amin(-1, keepdim=True)
        s = fp16(torch.where(hi >= -lo, hi, lo) / -8)
    else:
        s = fp16(xb.abs().amax(-1, keepdim=True) / 7)
    return _levels(xb, s, -8, 7).reshape(x.shape)


def q4_1(x, block: int):
    """A block's minimum and a scale over 15 steps (ggml's q4_1, both in float16)."""
    xb = x.reshape(*x.shape[:-1], -1, block)
    mn, mx = xb.amin(-1, keepdim=True), xb.amax(-1, keepdim=True)
    return _levels(xb, fp16((mx - mn) / 15), 0, 15, fp16(mn)).reshape(x.shape)


def q8_0(x):
    xb = x.reshape(*x.shape[:-1], -1, 32)
    return _levels(xb, fp16(xb.abs().amax(-1, keepdim=True) / 127), -127, 127).reshape(x.shape)


def q_sym(x, bits: int):
    """A symmetric b-bit block format like q4_0 (2^b levels, s = v / -2^(b-1), v the block's signed max)."""
    xb = x.reshape(*x.shape[:-1], -1, 32)
    hi, lo = xb.amax(-1, keepdim=True), xb.amin(-1, keepdim=True)
    half = 2 ** (bits - 1)
    s = fp16(torch.where(hi >= -lo, hi, lo) / -half)
    return _levels(xb, s, -half, half - 1).reshape(x.shape)


def schemes(d: int) -> dict:
    h = torch.tensor(hadamard(d), dtype=torch.float32)
    rot = lambda f: (lambda v: f(v @ h) @ h)  # noqa: E731 - H is symmetric and orthogonal
    return {
        "q8_0": q8_0,
        "q4_0, 15 levels (before)": lambda v: q4_sym(v, 32, False),
        "q4_0, 16 levels (now)": lambda v: q4_sym(v, 32, True),
        "q4_0, 16 levels + Hadamard": rot(lambda v: q4_sym(v, 32, True)),
        "4-bit, 16-value blocks, 16 levels": lambda v: q4_sym(v, 16, True),
        "4-bit, 16-value blocks + Hadamard": rot(lambda v: q4_sym(v, 16, True)),
        "q4_1 (scale + minimum), 32-value blocks": lambda v: q4_1(v, 32),
        "q4_1 + Hadamard": rot(lambda v: q4_1(v, 32)),
        # what the pair layout's spare V-row bytes could hold (D/2 + D/8 of D used): 5 and 6 bits per value
        "5-bit, 32-value blocks, 32 levels": lambda v: q_sym(v, 5),
        "6-bit, 32-value blocks, 64 levels": lambda v: q_sym(v, 6),
    }


def k_schemes(d: int) -> dict:
    """K after the rotary embedding. A rotation of K cannot be folded into k_proj (the rotary embedding sits between
    them): an op would rotate K when packing it and Q before the Q.K, so the product is unchanged and only K's error
    moves (simulated as Q(K H) H)."""
    h = torch.tensor(hadamard(d), dtype=torch.float32)
    rot = lambda f: (lambda k: f(k @ h) @ h)  # noqa: E731
    return {
        "q8_0 (the packed K's levels)": q8_0,
        "q8_0 + Hadamard": rot(q8_0),
        "6-bit, 32-value blocks, 64 levels": lambda k: q_sym(k, 6),
        "6-bit + Hadamard": rot(lambda k: q_sym(k, 6)),
        "5-bit, 32-value blocks, 32 levels": lambda k: q_sym(k, 5),
        "q4_0, 16 levels": lambda k: q4_sym(k, 32, True),
        "q4_0, 16 levels + Hadamard": rot(lambda k: q4_sym(k, 32, True)),
        "4-bit, 16-value blocks + Hadamard": rot(lambda k: q4_sym(k, 16, True)),
        "q4_1 + Hadamard": rot(lambda k: q4_1(k, 32)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--target", choices=["v", "k"], default="v", help="the cache tensor fake-quantized (default v)")
    args = ap.parse_args()
    hf = smollm2.hf_dir()
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32, attn_implementation="eager").eval()
    d = model.config.head_dim
    state = {"f": None}

    def hook(mod, inp, out):  # v_proj's output [B, S, Hkv * D]: the V the cache would hold
        f = state["f"]
        return out if f is None else f(out.reshape(*out.shape[:-1], -1, d)).reshape(out.shape)

    if args.target == "v":
        for layer in model.model.layers:
            layer.self_attn.v_proj.register_forward_hook(hook)
    else:  # K as the cache holds it: after the rotary embedding, [B, Hkv, S, D]
        from transformers.models.llama import modeling_llama

        rope = modeling_llama.apply_rotary_pos_emb

        def rope_then_quantize(q, k, *a, **kw):
            q, k = rope(q, k, *a, **kw)
            f = state["f"]
            return q, (k if f is None else f(k))

        modeling_llama.apply_rotary_pos_emb = rope_then_quantize
    tokens = tokenize(DEFAULT_TEXT, hf)
    table = schemes(d) if args.target == "v" else k_schemes(d)
    tallies = {name: Tally() for name in table}
    t0 = time.time()
    for w in range(args.windows):
        ids = torch.tensor(tokens[w * (args.context + 1):(w + 1) * (args.context + 1)])[None]
        with torch.no_grad():
            state["f"] = None
            ref = model(ids[:, :-1]).logits[0].numpy()
            for name, f in table.items():
                state["f"] = f
                tallies[name].add(ref, model(ids[:, :-1]).logits[0].numpy(), ids[0, 1:].numpy())
        print(f"window {w + 1}/{args.windows} ({time.time() - t0:.0f} s)", file=sys.stderr)
    what = ("V fake-quantized, K and Q float" if args.target == "v"
            else "K fake-quantized after the rotary, V and Q float")
    print(f"context {args.context}, {args.windows} windows; {what}; against the float model:")
    for name, t in tallies.items():
        s = t.summary()
        print(f"  {name:42s} PPL ratio {s['ppl_ratio']:.4f}  mean KL {s['mean_kl']:.2e}  top-1 {100 * s['top1']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
