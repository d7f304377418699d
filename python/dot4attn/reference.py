"""The exact math of the dot4attn ops in numpy: the contract of docs/ops.md, executable.

Every kernel (CPU ISAs, CUDA, HIP) is tested against these functions. They favour clarity over speed but stay
usable for Sk in the tens of thousands (block dot products go through float32 BLAS, which is exact here:
every partial sum is an integer below 2**24).
"""
from __future__ import annotations

import numpy as np

from . import formats

BLOCK = formats.BLOCK
LOG2E = np.float32(1.4426950408889634)
FP16_MAX = np.float32(65504.0)


def _check_head_dim(d: int) -> None:
    if d % BLOCK or not 32 <= d <= 256:
        raise ValueError(f"head dim D must be a multiple of 32 in [32, 256], got {d}")


def _blocks(x: np.ndarray) -> np.ndarray:
    _check_head_dim(x.shape[-1])
    return x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def _quantize(blocks: np.ndarray, qmax: float, lo: float, hi: float, fp16_scale: bool):
    """Non-finite policy (docs/ops.md, "Non-finite and out-of-range values"): a block holding a NaN or +-Inf gets a
    NaN scale and a zero payload; a finite block whose float16 scale would overflow saturates to 65504 (its
    values then clamp to the payload range)."""
    amax = np.abs(blocks).max(axis=-1)  # NaN / Inf when the block holds one
    bad = ~np.isfinite(amax)
    with np.errstate(invalid="ignore", over="ignore"):
        s = (amax / np.float32(qmax)).astype(np.float32)
        if fp16_scale:
            s = s.astype(np.float16)
            s = np.where(np.isinf(s), np.float16(FP16_MAX), s)
    sf = np.where(bad, np.float32(0), s.astype(np.float32))[..., None]  # the divisor: 0 -> q = 0
    s = np.where(bad, s.dtype.type(np.nan), s)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(sf == 0, np.float32(0), np.rint(blocks / sf))
    return np.clip(q, lo, hi), s


def _quantize_signed_max(blocks: np.ndarray, half_levels: int = 8):
    """q4_0's 16 levels (ggml's q4_0; half_levels 8) and q6_0's 64 (half_levels 32): v = a block's value of largest
    magnitude (the positive one on a tie), s = fp16(v / -half_levels), q = clamp(rne(x / s), -half_levels,
    half_levels - 1). v lands on the lowest level exactly and the block's other end on up to +half_levels, which
    clamps: one more level than a symmetric max / (half_levels - 1) scale. A scale that rounds to zero is +0
    (q = 0); one past float16 saturates at +-65504; a non-finite block gets a NaN scale and q = 0."""
    amax = np.abs(blocks).max(axis=-1)
    bad = ~np.isfinite(amax)
    with np.errstate(invalid="ignore", over="ignore"):
        hi, lo = blocks.max(axis=-1), blocks.min(axis=-1)
        v = np.where(hi >= -lo, hi, lo)
        s = (v / np.float32(-half_levels)).astype(np.float32).astype(np.float16)
    s = np.where(np.isinf(s), np.copysign(np.float16(FP16_MAX), s), s).astype(np.float16)
    s = np.where(s == 0, np.float16(0), s)  # -0 -> +0
    sf = np.where(bad, np.float32(0), s.astype(np.float32))[..., None]
    s = np.where(bad, np.float16(np.nan), s)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(sf == 0, np.float32(0), np.rint(blocks / sf))
    return np.clip(q, -half_levels, half_levels - 1), s


def pack_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PackK / PackV q8_0: int8 payload [..., D] and float16 scales [..., D/32]."""
    q, s = _quantize(_blocks(x), 127.0, -127, 127, fp16_scale=True)
    return q.astype(np.int8).reshape(x.shape), s


def _nibbles(u: np.ndarray) -> np.ndarray:
    """uint8 [..., n] values < 16 -> [..., n/2] bytes, element 2i in the low nibble (q4_0's payload)."""
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def _unnibble(payload: np.ndarray) -> np.ndarray:
    u = np.empty((*payload.shape[:-1], payload.shape[-1] * 2), np.uint8)
    u[..., 0::2] = payload & 0x0F
    u[..., 1::2] = payload >> 4
    return u


def _pack_q6_blocks(u: np.ndarray) -> np.ndarray:
    """u [..., nb, 32] in [0, 63] -> q6_0 blocks [..., nb, 24]: the low nibbles as q4_0's payload (16 bytes), then
    byte 16 + j holding the high 2 bits of elements j, j + 8, j + 16, j + 24 at bits 0-1, 2-3, 4-5, 6-7."""
    hi = (u >> 4).reshape(*u.shape[:-1], 4, 8)  # [..., group g, j]: element 8 g + j
    high = hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)
    return np.concatenate([_nibbles(u & 0x0F), high.astype(np.uint8)], axis=-1)


def _unpack_q6_blocks(blocks: np.ndarray) -> np.ndarray:
    """q6_0 blocks [..., nb, 24] -> u [..., nb, 32] in [0, 63]."""
    lo = _unnibble(blocks[..., :16])
    high = blocks[..., 16:24]
    hi = np.concatenate([(high >> (2 * g)) & 3 for g in range(4)], axis=-1)  # element 8 g + j
    return lo | (hi << 4)


def pack_v(x: np.ndarray, fmt: str = "q8_0") -> tuple[np.ndarray, np.ndarray]:
    """PackV: q8_0 (= pack_k), q4_0 (uint8 [..., D/2], element 2i in the low nibble) or q6_0 (uint8 [..., 3D/4]:
    per 32-value block 24 bytes, _pack_q6_blocks)."""
    if fmt == "q8_0":
        return pack_k(x)
    if fmt == "q4_0":
        q, s = _quantize_signed_max(_blocks(x), 8)
        u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(*x.shape[:-1], x.shape[-1])
        return _nibbles(u), s
    if fmt == "q6_0":
        q, s = _quantize_signed_max(_blocks(x), 32)
        blocks = _pack_q6_blocks((q.astype(np.int16) + 32).astype(np.uint8))
        return blocks.reshape(*x.shape[:-1], formats.payload_bytes(x.shape[-1], "q6_0")), s
    raise ValueError(f"PackV format must be 'q8_0', 'q4_0' or 'q6_0', got {fmt!r}")


def levels(payload: np.ndarray, fmt: str = "q8_0") -> np.ndarray:
    """int16 levels [..., D] of a packed payload: q8_0's values, q4_0's u - 8, q6_0's u - 32 (value = level * s)."""
    if fmt == "q8_0":
        return payload.astype(np.int16)
    if fmt == "q4_0":
        return _unnibble(payload).astype(np.int16) - 8
    if fmt == "q6_0":
        nb = payload.shape[-1] // formats.Q6_BLOCK_BYTES
        u = _unpack_q6_blocks(payload.reshape(*payload.shape[:-1], nb, formats.Q6_BLOCK_BYTES))
        return u.reshape(*payload.shape[:-1], nb * BLOCK).astype(np.int16) - 32
    raise ValueError(f"format must be 'q8_0', 'q4_0' or 'q6_0', got {fmt!r}")


def unpack(payload: np.ndarray, scales: np.ndarray, fmt: str = "q8_0") -> np.ndarray:
    """float32 values of a packed tensor (q8_0, q4_0 or q6_0)."""
    q = levels(payload, fmt).astype(np.float32)
    qb = q.reshape(*q.shape[:-1], q.shape[-1] // BLOCK, BLOCK)
    return (qb * scales.astype(np.float32)[..., None]).reshape(q.shape)


def quantize_q(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dot4Attention's on-the-fly Q quantization: int8 [..., D] and float32 scales [..., D/32]."""
    qq, s = _quantize(_blocks(q), 127.0, -127, 127, fp16_scale=False)
    return qq.astype(np.int8).reshape(q.shape), s


def choose_route(sq: int, sk: int, split_k_min_keys: int = 2048) -> str:
    if sq > 8:
        return "prefill"
    return "decode" if sk < split_k_min_keys else "split_k"


# The largest K scale whose dequantized values stay finite in float16 (127 * 515.5 < 65520): the f16 Q.K prefill
# stores the K of a (batch, KV head) that holds a larger one times 2^-8 (gpu/k_dequant.cuh).
K_SCALE_F16_LIMIT = 515.5


def _round_f16_wide(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """x rounded to float16's significand, the exponent range widened by 2^8 where `shift` (broadcast) is set."""
    f = np.where(shift, np.float32(2.0 ** -8), np.float32(1.0))
    with np.errstate(over="ignore", invalid="ignore"):
        return (x * f).astype(np.float16).astype(np.float32) / f


def dot4_logits(query: np.ndarray, k_payload: np.ndarray, k_scales: np.ndarray, scale: float | None = None,
                qk_f16: bool = False):
    """scale * sum_blocks(sq * sk * int32 dot) for every (b, h, i, j): float32 [B, Hq, Sq, Sk].

    qk_f16: the Hopper prefill's Q.K on f16 tensor cores (plan override k_dequant=1, docs/ops.md): Q's int8 levels
    times their float32 block scale and K's dequantized values k * sk, each rounded to float16 once (a (batch, KV
    head) with a K scale past K_SCALE_F16_LIMIT keeps its values' float16 significands with the exponent range
    shifted by 2^-8), then one float32 dot product over D, times scale."""
    B, Hq, Sq, D = query.shape
    Hkv = k_payload.shape[1]
    g = Hq // Hkv
    scale = np.float32(1.0 / np.sqrt(D) if scale is None else scale)
    q8, qs = quantize_q(query)
    nb = D // BLOCK
    qb = q8.reshape(B, Hkv, g * Sq, nb, BLOCK).astype(np.float32)
    kb = k_payload.reshape(B, Hkv, -1, nb, BLOCK).astype(np.float32)
    qsg = qs.reshape(B, Hkv, g * Sq, nb)
    ksf = k_scales.astype(np.float32)
    Sk = k_payload.shape[2]
    if qk_f16:
        with np.errstate(invalid="ignore"):
            qf = (qb * qsg[..., None]).astype(np.float16).astype(np.float32).reshape(B, Hkv, g * Sq, D)
            big = (np.abs(np.nan_to_num(ksf, nan=0.0)) > K_SCALE_F16_LIMIT).reshape(B, Hkv, -1).any(axis=-1)
            kf = _round_f16_wide(kb * ksf[..., None], big[:, :, None, None, None]).reshape(B, Hkv, -1, D)
            out = qf @ np.swapaxes(kf, -1, -2)
        return (out * scale).reshape(B, Hq, Sq, Sk)
    out = np.zeros((B, Hkv, g * Sq, Sk), np.float32)
    for n in range(nb):
        dot = qb[..., n, :] @ np.swapaxes(kb[..., n, :], -1, -2)  # exact integers in float32
        out += qsg[..., n, None] * ksf[:, :, None, :, n] * dot
    return (out * scale).reshape(B, Hq, Sq, Sk)


def _visible(logits: np.ndarray, attn_mask, causal) -> tuple[np.ndarray, np.ndarray]:
    """(logits with a float mask added, visible [B, Hq, Sq, Sk]). A key is visible to a query row unless it lies
    past the causal limit (bottom-right aligned), a bool mask is False there, or a float mask is -inf there."""
    Sq, Sk = logits.shape[-2:]
    visible = np.ones(logits.shape, bool)
    if causal:
        visible &= np.arange(Sk)[None, :] <= Sk - Sq + np.arange(Sq)[:, None]
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            visible &= np.broadcast_to(attn_mask, visible.shape)
        else:
            m = np.broadcast_to(attn_mask.astype(np.float32), logits.shape)
            visible &= m != -np.inf
            with np.errstate(invalid="ignore", over="ignore"):
                logits = logits + m
    return logits, visible


def _masked(logits: np.ndarray, attn_mask, causal) -> np.ndarray:
    """logits [B, Hq, Sq, Sk] with -inf at the keys a query may not see (float masks added)."""
    logits, visible = _visible(logits, attn_mask, causal)
    return np.where(visible, logits, -np.inf)


def attention(query, k_payload, k_scales, value, v_scales=None, attn_mask=None, *, scale=None, causal=1,
              v_format="float", qk_f16=False):
    """Dot4Attention's output (dtype of query) for the given packed K and V (qk_f16: the logits of the f16 Q.K
    prefill, dot4_logits).

    Non-finite policy (docs/ops.md): a query row is NaN (all D values) exactly when it sees a poisoned key: one
    whose logit is NaN or +inf (a NaN K scale, a non-finite query, a NaN / +inf float mask value) or whose V
    row holds a non-finite value (a NaN V scale, or NaN / Inf in float V). Keys it does not see never poison it."""
    B, Hq, Sq, D = query.shape
    Hkv, Sk = k_payload.shape[1], k_payload.shape[2]
    g = Hq // Hkv if Hkv else 1
    if k_scales.size and np.isinf(k_scales).any():
        raise ValueError("k_scales holds +-inf: packed scales are finite or NaN (PackK never writes inf)")
    if v_scales is not None and v_scales.size and np.isinf(v_scales).any():
        raise ValueError("v_scales holds +-inf: packed scales are finite or NaN (PackV never writes inf)")
    with np.errstate(invalid="ignore", over="ignore"):
        logits, visible = _visible(dot4_logits(query, k_payload, k_scales, scale, qk_f16), attn_mask, causal)
    if v_format == "float":
        vf = value.astype(np.float32)
    else:
        with np.errstate(invalid="ignore"):
            vf = unpack(value, v_scales, v_format)
    vf = np.repeat(vf, g, axis=1) if g > 1 else vf
    v_bad = ~np.isfinite(vf).all(axis=-1)  # [B, Hq, Sk]
    poison = visible & (np.isnan(logits) | (logits == np.inf) | v_bad[:, :, None, :])
    row_poison = poison.any(axis=-1, keepdims=True)  # [B, Hq, Sq, 1]
    logits = np.where(visible & ~poison, logits, -np.inf)
    vf = np.where(np.isfinite(vf), vf, 0)
    m = logits.max(axis=-1, keepdims=True) if Sk else np.full((B, Hq, Sq, 1), -np.inf, np.float32)
    dead = m == -np.inf  # no visible key (or only -inf logits)
    m = np.where(dead, 0, m)
    p = np.exp(logits - m)
    p = np.where(dead, 0, p)
    l = p.sum(axis=-1, keepdims=True)
    out = (p @ vf) / np.where(l == 0, 1, l)
    out = np.where(dead, 0, out)
    if query.dtype == np.float16:  # finite results saturate at +-65504 (a q8_0 / q4_0 V of 65504 dequantizes a
        out = np.clip(out, -FP16_MAX, FP16_MAX)  # little past it: its scale rounds up)
    return np.where(row_poison, np.float32(np.nan), out).astype(query.dtype)


def float_attention(q, k, v, attn_mask=None, *, scale=None, causal=1):
    """Plain float32 attention (the quality baseline), GQA by repetition."""
    B, Hq, Sq, D = q.shape
    g = Hq // k.shape[1]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    kf = np.repeat(k.astype(np.float32), g, axis=1)
    vf = np.repeat(v.astype(np.float32), g, axis=1)
    logits = _masked((q.astype(np.float32) @ np.swapaxes(kf, -1, -2)) * np.float32(scale), attn_mask, causal)
    m = logits.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(m)
    p = np.where(dead, 0, np.exp(logits - np.where(dead, 0, m)))
    l = p.sum(axis=-1, keepdims=True)
    return np.where(dead, 0, (p @ vf) / np.where(l == 0, 1, l)).astype(np.float32)


def nmse(x: np.ndarray, ref: np.ndarray) -> float:
    """Normalised mean squared error: |x - ref|^2 / |ref|^2 (0 when both are zero)."""
    x = x.astype(np.float64)
    ref = ref.astype(np.float64)
    den = float((ref**2).sum())
    num = float(((x - ref) ** 2).sum())
    return num / den if den else num


# ---- Dot4GroupQueryAttention: the packed KV cache (docs/ops.md, "Packed cache") ---------------------------------

cache_payload_bytes = formats.payload_bytes  # the row layout is defined once, in dot4attn.formats
cache_row_bytes = formats.row_bytes

def pack_cache_rows(x: np.ndarray, fmt: str = "q8_0", cache_layout: str = "rows") -> np.ndarray:
    """uint8 rows [..., row_bytes] of x [..., D]: payload (PackK / PackV), float16 scales, then (cache_layout
    "rows") zero padding to a multiple of 16 bytes, or (cache_layout "tight") nothing: rows of payload + D/16. The
    tight layout's cache tensor holds these rows' parts in two runs: tight_tensor / tight_rows convert."""
    d = x.shape[-1]
    if cache_layout not in ("rows", "tight"):
        raise ValueError(f"pack_cache_rows: cache_layout 'rows' or 'tight', got {cache_layout!r} "
                         "(the pair layout: pack_cache_pair)")
    payload, scales = pack_v(x, fmt)
    width = cache_row_bytes(d, fmt) if cache_layout == "rows" else formats.tight_row_bytes(d, fmt)
    rows = np.zeros((*x.shape[:-1], width), np.uint8)
    pb = cache_payload_bytes(d, fmt)
    rows[..., :pb] = payload.view(np.uint8)
    rows[..., pb:pb + 2 * (d // BLOCK)] = np.ascontiguousarray(scales.astype(np.float16)).view(np.uint8)
    return rows


def tight_tensor(rows: np.ndarray, d: int, fmt: str = "q8_0") -> np.ndarray:
    """The tight layout's cache tensor [B, Hkv, L, payload + D/16] (what the op reads and writes) of tight rows
    [B, Hkv, L, payload + D/16] (pack_cache_rows(..., "tight"): each token's payload, then its scales): every token
    row's payload in one run, then every token row's scales (docs/ops.md)."""
    pb, w = cache_payload_bytes(d, fmt), formats.tight_row_bytes(d, fmt)
    if rows.shape[-1] != w:
        raise ValueError(f"tight_tensor: expected rows of {w} bytes ({fmt}, D = {d}), got {rows.shape[-1]}")
    flat = rows.reshape(-1, w)
    return np.concatenate([flat[:, :pb].reshape(-1), flat[:, pb:].reshape(-1)]).reshape(rows.shape)


def tight_rows(tensor: np.ndarray, d: int, fmt: str = "q8_0") -> np.ndarray:
    """Each token's tight row (payload, then scales) of a tight-layout cache tensor: tight_tensor's inverse."""
    pb, w = cache_payload_bytes(d, fmt), formats.tight_row_bytes(d, fmt)
    if tensor.shape[-1] != w:
        raise ValueError(f"tight_rows: expected a tensor of {w}-byte rows ({fmt}, D = {d}), got {tensor.shape[-1]}")
    flat = np.ascontiguousarray(tensor).reshape(-1)
    n = flat.size // w
    return np.concatenate([flat[:n * pb].reshape(n, pb), flat[n * pb:].reshape(n, w - pb)], 1).reshape(tensor.shape)


def unpack_cache_rows(rows: np.ndarray, d: int, fmt: str = "q8_0") -> tuple[np.ndarray, np.ndarray]:
    """(payload, float16 scales) of packed cache rows, "rows" or "tight" layout (the same bytes up to the scales):
    int8 [..., D] (q8_0), uint8 [..., D/2] (q4_0) or uint8 [..., 3D/4] (q6_0)."""
    pb = cache_payload_bytes(d, fmt)
    payload = np.ascontiguousarray(rows[..., :pb])
    scales = np.ascontiguousarray(rows[..., pb:pb + 2 * (d // BLOCK)]).view(np.float16)
    return (payload.view(np.int8) if fmt == "q8_0" else payload), scales


def pack_cache_pair(k: np.ndarray, v: np.ndarray, v_format: str = "q4_0") -> tuple[np.ndarray, np.ndarray]:
    """(K rows, V rows) [..., D] uint8 of the "pair" layout (K q8_0, V q4_0 or q6_0): the K row is K's int8
    payload; the V row is V's payload, V's float16 scales, K's float16 scales, then zeros."""
    d = k.shape[-1]
    payload, v_sc, k_sc = formats.pair_v_row_parts(d, v_format)
    kp, ks = pack_k(k)
    vp, vs = pack_v(v, v_format)
    k_rows = np.ascontiguousarray(kp).view(np.uint8)
    v_rows = np.zeros((*v.shape[:-1], d), np.uint8)
    v_rows[..., payload] = vp
    v_rows[..., v_sc] = np.ascontiguousarray(vs.astype(np.float16)).view(np.uint8)
    v_rows[..., k_sc] = np.ascontiguousarray(ks.astype(np.float16)).view(np.uint8)
    return k_rows, v_rows


def unpack_cache_pair(k_rows: np.ndarray, v_rows: np.ndarray, d: int, v_format: str = "q4_0"):
    """(K payload int8, K scales, V payload uint8, V scales) of "pair" layout rows."""
    payload, v_sc, k_sc = formats.pair_v_row_parts(d, v_format)
    kp = np.ascontiguousarray(k_rows[..., :d]).view(np.int8)
    vp = np.ascontiguousarray(v_rows[..., payload])
    vs = np.ascontiguousarray(v_rows[..., v_sc]).view(np.float16)
    ks = np.ascontiguousarray(v_rows[..., k_sc]).view(np.float16)
    return kp, ks, vp, vs


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * w / sqrt(mean(x^2) + eps) over the last axis, float32 (Qwen3's q_norm / k_norm)."""
    x = x.astype(np.float32)
    ms = (x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True).astype(np.float32)
    return x * (np.float32(1) / np.sqrt(ms + np.float32(eps))) * w.astype(np.float32)


def rotary(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False):
    """GroupQueryAttention's rotary embedding of x [..., D] at positions pos (x.shape[:-1]), float32."""
    x = x.astype(np.float32).copy()
    r = cos.shape[1]
    c = cos.astype(np.float32)[pos]
    s = sin.astype(np.float32)[pos]
    i0 = np.arange(r) * 2 if interleaved else np.arange(r)
    i1 = i0 + 1 if interleaved else i0 + r
    a, b = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = a * c - b * s
    x[..., i1] = b * c + a * s
    return x


def group_query_attention_packed(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                                 cos_cache=None, sin_cache=None, q_norm=None, k_norm=None, *, num_heads,
                                 kv_num_heads, scale=0.0, do_rotary=0, rotary_interleaved=0, v_format="q8_0",
                                 qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None,
                                 cache_layout="rows"):
    """Dot4GroupQueryAttention: (output [B, S, Hq*D], present_key, present_value).

    GroupQueryAttention's semantics (com.microsoft) over packed caches: batch row b holds seqlens_k[b] + 1 valid
    keys after the call; a first prompt (S == total_sequence_length) starts at position 0 and may be right-padded
    (its padding rows output zeros), otherwise the S new tokens take positions total - S .. total - 1. The new
    rows are packed into present (past copied when present is a new buffer). q_norm / k_norm use q_norm_epsilon /
    k_norm_epsilon where given, else qk_norm_epsilon (GroupQueryAttention's rule). cache_layout: "rows", "pair"
    (q4_0 / q6_0 V only) or "tight" (no padding, the parts in runs: tight_tensor; dot4attn.formats)."""
    formats.check_cache_layout(cache_layout, v_format)
    B, S = query.shape[:2]
    hq, hkv = num_heads, kv_num_heads
    packed = key is None
    d = query.shape[2] // (hq + 2 * hkv if packed else hq)
    dtype = query.dtype
    if packed:
        qkv = query.reshape(B, S, hq + 2 * hkv, d)
        q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hkv], qkv[:, :, hq + hkv:]
    else:
        q, k, v = query.reshape(B, S, hq, d), key.reshape(B, S, hkv, d), value.reshape(B, S, hkv, d)
    total_len = int(np.asarray(total_sequence_length).reshape(-1)[0])
    first = S == total_len
    total = np.asarray(seqlens_k).astype(np.int64) + 1
    past = np.zeros(B, np.int64) if first else total - S
    if cache_layout == "tight":  # the op's tensors hold the parts in runs; the rows are what the steps below move
        past_key, past_value = tight_rows(past_key, d, "q8_0"), tight_rows(past_value, d, v_format)
    rows = max(past_key.shape[2], total_len)
    present_k = np.zeros((B, hkv, rows, past_key.shape[3]), np.uint8)
    present_v = np.zeros((B, hkv, rows, past_value.shape[3]), np.uint8)
    present_k[:, :, :past_key.shape[2]] = past_key
    present_v[:, :, :past_value.shape[2]] = past_value
    pos = past[:, None] + np.arange(S)[None, :]  # [B, S]
    qf, kf = q.astype(np.float32), k.astype(np.float32)
    if q_norm is not None:
        qf = rms_norm(qf, q_norm, qk_norm_epsilon if q_norm_epsilon is None else q_norm_epsilon)
    if k_norm is not None:
        kf = rms_norm(kf, k_norm, qk_norm_epsilon if k_norm_epsilon is None else k_norm_epsilon)
    if do_rotary:
        p3 = np.broadcast_to(pos[:, :, None], qf.shape[:3])
        qf = rotary(qf, p3, cos_cache, sin_cache, bool(rotary_interleaved))
        kf = rotary(kf, np.broadcast_to(pos[:, :, None], kf.shape[:3]), cos_cache, sin_cache,
                    bool(rotary_interleaved))
    if cache_layout == "pair":
        k_rows, v_rows = pack_cache_pair(kf.transpose(0, 2, 1, 3), v.astype(np.float32).transpose(0, 2, 1, 3),
                                         v_format)
    else:
        k_rows = pack_cache_rows(kf.transpose(0, 2, 1, 3), "q8_0", cache_layout)  # [B, Hkv, S, row]
        v_rows = pack_cache_rows(v.astype(np.float32).transpose(0, 2, 1, 3), v_format, cache_layout)
    for b in range(B):
        present_k[b, :, past[b]:past[b] + S] = k_rows[b]
        present_v[b, :, past[b]:past[b] + S] = v_rows[b]
    out = np.zeros((B, S, hq, d), dtype)
    sc = None if not scale else scale
    for b in range(B):
        sq = min(S, int(total[b])) if first else S
        sk = int(total[b])
        if cache_layout == "pair":
            kp, ks, vp, vs = unpack_cache_pair(present_k[b:b + 1, :, :sk], present_v[b:b + 1, :, :sk], d, v_format)
        else:
            kp, ks = unpack_cache_rows(present_k[b:b + 1, :, :sk], d, "q8_0")
            vp, vs = unpack_cache_rows(present_v[b:b + 1, :, :sk], d, v_format)
        qb = qf[b:b + 1, :sq].transpose(0, 2, 1, 3).astype(dtype)
        o = attention(qb, kp, ks, vp, vs, scale=sc, causal=1, v_format=v_format)
        out[b, :sq] = o[0].transpose(1, 0, 2)
    if cache_layout == "tight":
        present_k, present_v = tight_tensor(present_k, d, "q8_0"), tight_tensor(present_v, d, v_format)
    return out.reshape(B, S, hq * d), present_k, present_v
