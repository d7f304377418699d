"""Inputs with more than 2^31 elements whose exact Dot4Attention output is known without running a reference over
all of them (shared by tests/ops/test_scale.py on the CPU and tests/gpu/test_scale_cuda.py).

Every key is zero (payload 0, so its logit is exactly 0 whatever its scale) and every value is zero, except a
few "hot" keys spread over the whole range: one near the start, some just past element 2^31 of K and V, the last
one. With logits s_h of the hot keys (the contract math, reference.dot4_logits) and N zero keys, the output of
each query row is exactly
    sum_h exp(s_h) V_h / (sum_h exp(s_h) + N)
The hot logits are made ~30 (natural units), so the zero keys weigh ~1e-6 of the total: small, yet included
exactly. An offset computed in 32 bits would wrap and read a zero row instead of a hot one (or fault), and the
output would miss that key's value: far off the expected value.
The big tensors are np.zeros (pages the kernel maps on first touch): only the hot rows take memory in numpy.
"""
from __future__ import annotations

import numpy as np

from dot4attn import reference as R

D = 128
BIG_SK = (1 << 24) + 64          # K payload [1, 1, Sk, 128]: 2^31 + 8192 elements


def hot_positions(sk: int, d: int = D) -> list[int]:
    """Key rows to make hot: near the start, the first rows whose first element lies past 2^31 (K and q8_0 V are
    [.., Sk, D] with one element per byte), and the last row."""
    first_past = (1 << 31) // d if sk > (1 << 31) // d + 1 else sk // 2  # small sk: the construction's self-check
    return sorted({3, first_past - 1, first_past, first_past + 1, sk - 1})


def big_inputs(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, dtype=np.float32, seed: int = 0):
    """(feeds for a q8_0-V Dot4Attention, hot positions). The hot K rows are positive multiples of the mean query
    of their KV head's group, scaled so their logits are ~30 (G = 2: each head sees ~1/sqrt(2) of the mean direction); hot V rows are random."""
    rng = np.random.default_rng(seed)
    # The query rows of a head are one random row scaled by 0.9..1.1: every row then gives the hot keys logits of
    # ~30, so the 2^24 zero keys weigh ~1e-6 for every row. (Independent rows would give some rows logits of ~5 and
    # let millions of equal-weight zero keys dominate their sums: what such a row then measures is the rounding of
    # 2^24 equal float32 / float16 terms, not the indexing this construction is for.)
    row = rng.standard_normal((B, Hq, 1, D), dtype=np.float32) * 3
    q = (row * rng.uniform(0.9, 1.1, (B, Hq, Sq, 1)).astype(np.float32)).astype(dtype)
    kp = np.zeros((B, Hkv, Sk, D), np.int8)
    ks = np.zeros((B, Hkv, Sk, D // 32), np.float16)
    vp = np.zeros((B, Hkv, Sk, D), np.int8)
    vs = np.zeros((B, Hkv, Sk, D // 32), np.float16)
    hot = hot_positions(Sk)
    G = Hq // Hkv
    for b in range(B):
        for h in range(Hkv):
            direction = q[b, h * G:(h + 1) * G].astype(np.float32).mean(axis=(0, 1))
            direction /= np.linalg.norm(direction)
            # one query row's norm (the head's rows differ by 0.9..1.1): the norm of the whole [Sq, D] block would
            # shrink the logits by sqrt(Sq) and let the zero keys dominate again
            row_norm = float(np.linalg.norm(q[b, h * G].astype(np.float32), axis=-1).mean())
            for n, j in enumerate(hot):
                k_row = direction * (45.0 + n) * np.sqrt(D) / (row_norm + 1e-6)
                kp[b, h, j], ks[b, h, j] = (a[0, 0, 0] for a in R.pack_k(k_row[None, None, None]))
                vp[b, h, j], vs[b, h, j] = (a[0, 0, 0] for a in R.pack_v(
                    rng.standard_normal((1, 1, 1, D), dtype=np.float32), "q8_0"))
    feeds = {"query": q, "k_payload": kp, "k_scales": ks, "value": vp, "v_scales": vs}
    return feeds, hot


def expected_output(feeds: dict, hot: list[int], causal: bool = False) -> np.ndarray:
    """The exact output (float64 math, cast to the query dtype) from the hot rows alone plus the count of zero
    keys each query row sees (non-causal: all Sk; causal: bottom-right aligned, row i sees keys j <= Sk - Sq + i)."""
    q = feeds["query"]
    B, Hq, Sq, _ = q.shape
    Sk = feeds["k_payload"].shape[2]
    idx = np.asarray(hot)
    kp, ks = feeds["k_payload"][:, :, idx], feeds["k_scales"][:, :, idx]
    v = R.unpack(feeds["value"][:, :, idx], feeds["v_scales"][:, :, idx], "q8_0").astype(np.float64)
    s = R.dot4_logits(q, kp, ks).astype(np.float64)       # [B, Hq, Sq, n_hot]
    G = Hq // kp.shape[1]
    v = np.repeat(v, G, axis=1)                             # [B, Hq, n_hot, D]
    seen = np.full((Sq,), Sk, np.int64)
    visible = np.ones((Sq, len(hot)), bool)
    if causal:
        seen = np.clip(Sk - Sq + np.arange(Sq) + 1, 0, Sk)
        visible = idx[None, :] < seen[:, None]
    s = np.where(visible[None, None], s, -np.inf)
    m = np.maximum(s.max(axis=-1, keepdims=True), 0.0)
    w = np.exp(s - m)
    zeros = (seen - visible.sum(axis=1))[None, None, :, None] * np.exp(-m)
    out = np.einsum("bhsn,bhnd->bhsd", w, v) / (w.sum(axis=-1, keepdims=True) + zeros)
    return out.astype(q.dtype)
