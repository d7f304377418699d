"""The Dot4Attention case table shared by the CPU op tests (tests/ops/test_attention.py) and the GPU tests
(tests/gpu/): hand-picked cases that hold every listed value of every dimension (D, Hq/Hkv, Sq, Sk, B, dtype,
causal, bool/additive masks incl. left padding and broadcast shapes, V format) and the edge cases (Sq > Sk, fully
masked rows, Sk = 0), seeded random mixes, and how each case's inputs, mask and reference output are made.
LONG_CASES add the lengths and head shapes where GPU launch plans differ (split counts, TMA staging, long walks):
the GPU kernel tests run them, the CPU suite does not (their references take seconds each).
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np

from conftest import gaussian_qkv, pack_value
from dot4attn import formats
from dot4attn import reference as R

REF_TOL = 1e-6                                            # vs reference.attention
QUALITY_TOL = {"float": 5e-4, "q8_0": 5e-4, "q4_0": 2e-2, "q6_0": 1.5e-3}  # vs reference.float_attention, Gaussian
ROUTES = ("prefill", "decode", "split_k", "auto")

@dataclass(frozen=True)
class Case:
    name: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str = "float32"
    v_format: str = "float"
    causal: int = 1
    mask: str | None = None
    scale: float | None = None
    split_k_min_keys: int | None = None
    dead_rows: bool | None = False  # the case is meant to contain rows that see no key (None: not checked)

    def __str__(self):
        extra = "".join([f" mask={self.mask}" if self.mask else "", f" scale={self.scale}" if self.scale else "",
                         f" split_k_min_keys={self.split_k_min_keys}" if self.split_k_min_keys else ""])
        return (f"{self.name}: B={self.B} Hq={self.Hq} Hkv={self.Hkv} Sq={self.Sq} Sk={self.Sk} D={self.D} "
                f"{self.dtype} V={self.v_format} causal={self.causal}{extra}")


C = Case
CASES = [
    C("tiny", 1, 1, 1, 1, 1, 32),
    C("gqa2_decode", 1, 2, 1, 1, 37, 64, "float16", "q8_0"),
    C("gqa4_b3_leftpad", 3, 8, 2, 2, 300, 128, "float32", "q4_0", 1, "bool_pad_b11k"),
    C("mha6_bias", 1, 6, 6, 7, 513, 256, "float16", "float", 0, "add_bias_11qk"),
    C("mha4_b3_prefill_pad", 3, 4, 4, 64, 200, 32, "float32", "q8_0", 1, "bool_pad_b1qk"),
    C("gqa8_sq300", 1, 8, 1, 300, 300, 64, "float16", "q4_0", 1),
    C("gqa6_b3_pad_inf", 3, 6, 1, 7, 1000, 128, "float32", "float", 1, "add_pad_inf"),
    C("decode_sk8192", 1, 4, 2, 1, 8192, 128, "float16", "q8_0", 1),
    C("sk8192_mask_k", 1, 1, 1, 2, 8192, 256, "float32", "q4_0", 0, "bool_k"),
    C("prefill_sk8192", 1, 2, 1, 300, 8192, 64, "float16", "float", 1),
    C("mha8_pad_finite", 1, 8, 8, 300, 1024, 32, "float32", "q8_0", 0, "add_pad_big"),
    C("gqa2_sq64_sk2048", 1, 4, 2, 64, 2048, 256, "float32", "float", 1, "add_1h1k"),
    # Sq > Sk with causal: the first Sq - Sk rows see no key.
    C("sq_gt_sk_prefill", 1, 4, 1, 64, 33, 64, "float32", "float", 1, dead_rows=True),
    C("sq_gt_sk_decode", 3, 2, 2, 7, 5, 128, "float16", "q4_0", 1, dead_rows=True),
    # Fully masked rows (bool and additive -inf), and a batch row padded away entirely.
    C("bool_dead_rows", 3, 4, 2, 7, 100, 64, "float32", "q8_0", 0, "bool_dead_rows", dead_rows=True),
    C("bool_dead_rows_prefill", 3, 4, 2, 64, 130, 64, "float16", "q8_0", 1, "bool_dead_rows", dead_rows=True),
    C("add_dead_rows", 1, 6, 2, 2, 77, 32, "float16", "float", 1, "add_dead_rows", dead_rows=True),
    C("pad_whole_batch_row", 3, 2, 1, 1, 64, 64, "float32", "float", 1, "bool_pad_whole", dead_rows=True),
    C("mask_b111", 3, 4, 1, 2, 40, 160, "float32", "float", 0, "bool_b111", dead_rows=True),
    # Sk = 0: every row outputs zeros.
    C("sk0_decode", 3, 4, 2, 7, 0, 64, "float32", "q8_0", 1, dead_rows=True),
    C("sk0_prefill", 1, 2, 1, 64, 0, 32, "float16", "float", 0, dead_rows=True),
    # split_k with several splits (B x Hkv small, Sk large), odd Sk, and auto picking split_k.
    C("sk32768", 1, 2, 1, 1, 32768, 128, "float32", "q8_0", 1),
    C("splitk_sk4096", 1, 2, 1, 1, 4096, 64, "float32", "float", 1),
    C("splitk_sk4099_pad", 1, 8, 1, 8, 4099, 128, "float16", "q4_0", 1, "bool_pad_b11k"),
    C("splitk_b3_pad_inf", 3, 4, 1, 1, 3000, 64, "float16", "q8_0", 1, "add_pad_inf"),
    C("auto_splitk_min16", 1, 4, 2, 2, 100, 64, "float32", "q8_0", 1, split_k_min_keys=16),
    C("auto_splitk_min64", 1, 1, 1, 5, 600, 256, "float16", "float", 0, "add_1h1k", split_k_min_keys=64),
    # Attribute scale, rank-2 masks.
    C("scale_mask_qk", 3, 4, 2, 2, 50, 96, "float32", "q4_0", 1, "bool_qk", scale=0.05),
    C("prefill_mask_qk", 1, 2, 2, 64, 64, 256, "float32", "q8_0", 1, "bool_qk"),
    C("gqa2_b3_add_b1qk", 3, 8, 4, 7, 257, 64, "float16", "q4_0", 1, "add_pad_b1qk"),
    # Prefill tile edges: Sq just above 8, Sq and Sk off any tile size, Sq > Sk without causal.
    C("prefill_sq9", 1, 4, 2, 9, 9, 64, "float32", "q4_0", 1, "bool_pad_b1qk", dead_rows=True),
    C("prefill_b3_sq300_sk517", 3, 6, 2, 300, 517, 128, "float32", "q4_0", 1, "add_pad_b1qk", dead_rows=True),
    C("prefill_sq300_sk301", 1, 2, 1, 300, 301, 256, "float16", "q8_0", 0, "bool_qk"),
    C("prefill_sq33_sk1", 3, 2, 2, 33, 1, 32, "float16", "float", 1, dead_rows=True),
    C("sq_gt_sk_noncausal", 3, 4, 1, 64, 20, 128, "float32", "q8_0", 0),
    # Peaky softmax (large logits: the online max must rescale), mask broadcast along keys.
    C("peaky_decode", 1, 8, 2, 2, 3000, 64, "float32", "float", 1, scale=0.5),
    C("peaky_prefill", 3, 2, 1, 64, 700, 64, "float16", "q8_0", 1, scale=0.5),
    C("mask_bhq1", 3, 4, 2, 7, 90, 32, "float32", "q4_0", 1, "bool_bhq1", dead_rows=True),
]


def _random_cases(n: int, seed: int = 20240531, v_formats=("float", "q8_0", "q4_0"), prefix: str = "rand"):
    """Seeded random mixes of every dimension (tile-unfriendly sizes included), cost-capped."""
    rng = np.random.default_rng(seed)
    heads = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (6, 1), (6, 2), (6, 3), (6, 6), (8, 1), (8, 2),
             (8, 4), (8, 8)]
    masks = [None, None, "bool_pad_b11k", "bool_pad_b1qk", "add_pad_inf", "add_pad_b1qk", "add_bias_11qk",
             "add_1h1k", "bool_k", "bool_qk", "bool_dead_rows", "add_dead_rows", "bool_bhq1"]
    out = []
    while len(out) < n:
        D = int(rng.choice([32, 64, 96, 128, 160, 192, 224, 256]))
        Sq = int(rng.choice([1, 2, 3, 7, 8, 9, 17, 64, 300]))
        Sk = int(rng.choice([0, 1, 2, 31, 33, 63, 65, 127, 129, 255, 257, 1000, 2049, 4100]))
        B = int(rng.choice([1, 2, 3]))
        Hq, Hkv = heads[rng.integers(len(heads))]
        if B * Hq * Sq * max(Sk, 1) * D > 2e7:
            continue
        mask = masks[rng.integers(len(masks))] if Sk > 0 else None
        out.append(Case(f"{prefix}{len(out):02d}", B, Hq, Hkv, Sq, Sk, D, str(rng.choice(["float32", "float16"])),
                        str(rng.choice(list(v_formats))), int(rng.integers(2)), mask,
                        scale=None if rng.random() < 0.8 else 0.3,
                        split_k_min_keys=[None, None, 1, 16, 256][rng.integers(5)], dead_rows=None))
    return out


RANDOM_CASES = _random_cases(30)  # float, q8_0 and q4_0 V; q6_0 has a mix of its own below

# q6_0 V: every route (decode, split_k with several splits, prefill tile edges), every D, both dtypes, masks, dead
# rows, Sk = 0.
Q6_CASES = [
    C("q6_decode_gqa4", 3, 8, 2, 2, 300, 128, "float32", "q6_0", 1, "bool_pad_b11k"),
    C("q6_decode_d32_bhq1", 3, 4, 2, 7, 90, 32, "float16", "q6_0", 1, "bool_bhq1", dead_rows=True),
    C("q6_prefill_sq300", 1, 8, 1, 300, 300, 64, "float16", "q6_0", 1),
    C("q6_prefill_b3_sq300_sk517", 3, 6, 2, 300, 517, 128, "float32", "q6_0", 1, "add_pad_b1qk", dead_rows=True),
    C("q6_prefill_sq9_d96", 1, 4, 2, 9, 9, 96, "float32", "q6_0", 1, "bool_pad_b1qk", dead_rows=True),
    C("q6_sk8192_d256_mask_k", 1, 1, 1, 2, 8192, 256, "float32", "q6_0", 0, "bool_k"),
    C("q6_splitk_sk4099_pad", 1, 8, 1, 8, 4099, 128, "float16", "q6_0", 1, "bool_pad_b11k"),
    C("q6_splitk_b3_pad_inf", 3, 4, 1, 1, 3000, 64, "float16", "q6_0", 1, "add_pad_inf"),
    C("q6_sq_gt_sk_decode", 3, 2, 2, 7, 5, 160, "float16", "q6_0", 1, dead_rows=True),
    C("q6_sk0_decode", 3, 4, 2, 7, 0, 64, "float32", "q6_0", 1, dead_rows=True),
    C("q6_peaky_prefill", 3, 2, 1, 64, 700, 224, "float16", "q6_0", 1, scale=0.5),
    C("q6_auto_splitk_min16", 1, 4, 2, 2, 100, 192, "float32", "q6_0", 1, split_k_min_keys=16),
] + _random_cases(10, seed=20261204, v_formats=("q6_0",), prefix="rand_q6_")
# The GPU kernels take q6_0 V at D a multiple of 64 (formats.gpu_takes): those cases join the tables the GPU tests
# share. The others (D = 32, 96, 160, 224) run in the CPU suite only: the GPU planner refuses them, and tests/gpu
# check its message on them.
ALL_CASES = CASES + RANDOM_CASES + [c for c in Q6_CASES if formats.gpu_takes(c.v_format, c.D)]
CPU_ONLY_CASES = [c for c in Q6_CASES if not formats.gpu_takes(c.v_format, c.D)]
CPU_CASES = ALL_CASES + CPU_ONLY_CASES  # what the CPU op tests run

# GPU launch plans change with length and head shape: split counts (16k-128k keys), TMA staging and long per-warp
# walks, the decode route's block clusters (512 keys), the tensor-core prefill's causal tiles (Sq % 64 == 0), its
# masked tails and the tile-kernel fallback (D = 96). q6_0 V: the tensor-core decode's cp.async staging (q6_0 has no
# TMA or register staging) and the tensor-core prefill over V's float16 copy (v_dequant), at D = 64, 128 and 256.
LONG_CASES = [
    C("long_sk131072_q4", 1, 32, 8, 1, 131072, 128, "float16", "q4_0", 1),
    C("long_sk131072_f16v", 1, 32, 8, 1, 131072, 128, "float16", "float", 1),
    C("long_sk70000_q8_bcast", 1, 32, 8, 1, 70000, 128, "float16", "q8_0", 0, "bool_qk"),
    C("long_sk70000_d256", 1, 24, 4, 1, 70000, 256, "float16", "q8_0", 1),
    C("long_sk70000_d256_q4", 1, 24, 4, 1, 70000, 256, "float16", "q4_0", 1),
    C("long_sk70000_d64_mha", 1, 8, 8, 1, 70000, 64, "float16", "q4_0", 0),
    C("long_b2_sk16384", 2, 32, 8, 1, 16384, 128, "float16", "q4_0", 1),
    C("long_sq4_sk4097_pad", 1, 32, 8, 4, 4097, 128, "float16", "q4_0", 1, "bool_pad_b11k"),
    C("long_g8_sq8_sk4097", 1, 64, 8, 8, 4097, 64, "float16", "float", 1, "bool_dead_rows", dead_rows=None),
    C("long_d160_add", 1, 12, 4, 2, 4097, 160, "float16", "q8_0", 1, "add_pad_b1qk", dead_rows=None),
    C("long_sk512_q4", 1, 32, 8, 1, 512, 128, "float16", "q4_0", 1),
    C("long_sk512_f16v", 1, 32, 8, 1, 512, 128, "float16", "float", 1),
    C("long_sk512_f32_q8", 1, 32, 8, 1, 512, 128, "float32", "q8_0", 0),
    C("long_prefill_1000_f16v", 1, 8, 2, 1000, 1000, 128, "float16", "float", 1),
    C("long_prefill_1000_q8", 1, 8, 2, 1000, 1000, 128, "float16", "q8_0", 1),
    C("long_prefill_1000_q4", 1, 8, 2, 1000, 1000, 128, "float16", "q4_0", 1),
    C("long_prefill_1000_d64", 1, 8, 2, 1000, 1000, 64, "float16", "q8_0", 0),
    C("long_prefill_1000_d256", 1, 8, 1, 1000, 1000, 256, "float16", "q4_0", 1),
    C("long_prefill_2048_q4", 1, 8, 2, 2048, 2048, 128, "float16", "q4_0", 1),
    C("long_prefill_2048_d64", 1, 8, 2, 2048, 2048, 64, "float16", "float", 1),
    C("long_prefill_2048_d256", 1, 4, 1, 2048, 2048, 256, "float16", "float", 1),
    C("long_prefill_sq700_sk100", 1, 8, 2, 700, 100, 128, "float16", "q4_0", 1, "add_pad_b1qk", dead_rows=None),
    C("long_prefill_b2_300_k", 2, 8, 2, 300, 300, 128, "float16", "q8_0", 1, "bool_k"),
    C("long_prefill_sq33_sk1000", 1, 16, 2, 33, 1000, 128, "float16", "q4_0", 1, "add_1h1k"),
    C("long_prefill_d96", 1, 8, 2, 200, 200, 96, "float16", "q8_0", 1),
    C("long_prefill_b2_257_d256", 2, 8, 1, 257, 257, 256, "float16", "float", 0),
    C("long_chunk_1024_sk6000_d256", 1, 8, 2, 1024, 6000, 256, "float16", "q8_0", 1),  # a prompt chunk over a past
    C("long_sk131072_q6", 1, 32, 8, 1, 131072, 128, "float16", "q6_0", 1),
    C("long_sk70000_d256_q6", 1, 24, 4, 1, 70000, 256, "float16", "q6_0", 1),
    C("long_sk70000_d64_q6_mha", 1, 8, 8, 1, 70000, 64, "float16", "q6_0", 0),
    C("long_sq4_sk4097_pad_q6", 1, 32, 8, 4, 4097, 128, "float16", "q6_0", 1, "bool_pad_b11k"),
    C("long_sk512_q6", 1, 32, 8, 1, 512, 128, "float16", "q6_0", 1),
    C("long_prefill_1000_q6", 1, 8, 2, 1000, 1000, 128, "float16", "q6_0", 1),
    C("long_prefill_2048_d64_q6", 1, 8, 2, 2048, 2048, 64, "float16", "q6_0", 1),
    C("long_prefill_b2_257_d256_q6", 2, 8, 1, 257, 257, 256, "float16", "q6_0", 0, "add_pad_b1qk", dead_rows=None),
]
CASE_BY_NAME = {c.name: c for c in CPU_CASES + LONG_CASES}
assert len(CASE_BY_NAME) == len(CPU_CASES) + len(LONG_CASES)


def routes_for(case: Case):
    return [r for r in ROUTES if r in ("prefill", "auto") or case.Sq <= 8]


def _pads(B: int, Sk: int, whole: bool = False):
    if B == 1:
        return np.array([Sk // 4])
    return np.array([0, Sk if whole else Sk // 3, Sk // 2 + 1])[:B] if B == 3 else np.arange(B) * (Sk // max(B, 1))


def make_mask(kind: str | None, rng, B, Hq, Sq, Sk, dtype):
    """The attn_mask of a case (None, bool or additive of dtype T)."""
    if kind is None:
        return None
    T = np.dtype(dtype)
    keep_pad = np.arange(Sk)[None, :] >= _pads(B, Sk, whole=kind == "bool_pad_whole")[:, None]  # [B, Sk]
    if kind in ("bool_pad_b11k", "bool_pad_whole"):  # left padding, one row of keys per batch row
        return keep_pad[:, None, None, :]
    if kind == "bool_pad_b1qk":  # left padding per (batch, query row), with holes
        return keep_pad[:, None, None, :] & (rng.random((B, 1, Sq, Sk)) < 0.9)
    if kind == "add_pad_inf":
        return np.where(keep_pad, 0, -np.inf).astype(T)[:, None, None, :]
    if kind == "add_pad_b1qk":  # additive left padding plus a bias, [B, 1, Sq, Sk]
        bias = rng.standard_normal((B, 1, Sq, Sk)).astype(np.float32)
        return np.where(keep_pad[:, None, None, :], bias, -np.inf).astype(T)
    if kind == "add_pad_big":  # large finite padding value (non-causal cases only: every row keeps keys)
        return np.where(keep_pad, 0, -1e4).astype(T)[:, None, None, :]
    if kind == "add_bias_11qk":
        return rng.standard_normal((1, 1, Sq, Sk)).astype(T)
    if kind == "add_1h1k":
        m = rng.standard_normal((1, Hq, 1, Sk)).astype(np.float32) * 0.5
        m[rng.random(m.shape) < 0.1] = -np.inf
        m[..., [0, -1]] = 0  # the first and last keys stay visible for every row
        return m.astype(T)
    if kind == "bool_k":
        m = rng.random(Sk) < 0.85
        m[[0, -1]] = True
        return m
    if kind == "bool_qk":
        m = rng.random((Sq, Sk)) < 0.8
        m[:, [0, -1]] = True  # causal rows always keep key 0 (Sq <= Sk here), the others the last key
        return m
    if kind == "bool_bhq1":  # broadcast along keys: whole rows on or off
        m = rng.random((B, Hq, Sq, 1)) < 0.75
        m[0, 0, 0, 0] = False
        return m
    if kind == "bool_b111":
        return np.array([True, False, True][:B]).reshape(B, 1, 1, 1)
    if kind == "bool_dead_rows":
        m = rng.random((B, Hq, Sq, Sk)) < 0.7
        b, h, i = np.meshgrid(np.arange(B), np.arange(Hq), np.arange(Sq), indexing="ij")
        m[(b + h + i) % 3 == 0] = False
        return m
    if kind == "add_dead_rows":
        m = rng.standard_normal((B, 1, Sq, Sk)).astype(np.float32)
        m[:, :, ::2, :] = -np.inf
        return m.astype(T)
    raise ValueError(kind)


def visible_keys(case: Case, mask) -> np.ndarray:
    """bool [B, Hq, Sq, Sk]: which keys each query row may attend to (causal, bool mask, -inf)."""
    vis = np.ones((case.B, case.Hq, case.Sq, case.Sk), bool)
    if case.causal:
        vis &= np.arange(case.Sk)[None, :] <= case.Sk - case.Sq + np.arange(case.Sq)[:, None]
    if mask is not None:
        vis &= np.broadcast_to(mask if mask.dtype == np.bool_ else mask != -np.inf, vis.shape)
    return vis


@functools.lru_cache(maxsize=None)
def case_data(name: str):
    """Inputs, reference output and dead-row map of a case (cached: one reference run per case)."""
    c = CASE_BY_NAME[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, k, v = gaussian_qkv(rng, c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.dtype)
    kp, ks = R.pack_k(k)
    value, v_scales = pack_value(v, c.v_format)
    mask = make_mask(c.mask, rng, c.B, c.Hq, c.Sq, c.Sk, c.dtype)
    ref = R.attention(q, kp, ks, value, v_scales, mask, scale=c.scale, causal=c.causal, v_format=c.v_format)
    dead = ~visible_keys(c, mask).any(axis=-1)
    return (q, kp, ks, value, v_scales, mask), ref, dead


QUALITY = [  # D, v_format, (B, Hq, Hkv, Sq, Sk), dtype, causal
    (32, "float", (1, 8, 2, 8, 2048), "float32", 1),
    (32, "q8_0", (3, 4, 4, 64, 256), "float16", 1),
    (32, "q4_0", (1, 6, 1, 7, 4096), "float32", 0),
    (64, "float", (3, 4, 1, 2, 1000), "float16", 1),
    (64, "q8_0", (1, 8, 8, 64, 512), "float32", 0),
    (64, "q4_0", (1, 8, 2, 300, 300), "float16", 1),
    (128, "float", (1, 8, 1, 64, 2048), "float32", 1),
    (128, "q8_0", (1, 8, 2, 1, 8192), "float16", 1),
    (128, "q4_0", (3, 2, 1, 7, 600), "float32", 1),
    (256, "float", (1, 2, 2, 300, 512), "float16", 0),
    (256, "q8_0", (3, 6, 2, 8, 1500), "float32", 1),
    (256, "q4_0", (1, 4, 1, 2, 3000), "float16", 1),
    (64, "q6_0", (1, 8, 2, 300, 300), "float16", 1),
    (128, "q6_0", (3, 2, 1, 7, 600), "float32", 1),
]


@functools.lru_cache(maxsize=None)
def quality_data(idx: int):
    D, vf, (B, Hq, Hkv, Sq, Sk), dtype, causal = QUALITY[idx]
    rng = np.random.default_rng(zlib.crc32(f"{D}{vf}".encode()))
    q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, dtype)
    base = R.float_attention(q, k, v, causal=causal)
    return q, k, v, base
