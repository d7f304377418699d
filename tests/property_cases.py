"""The property-based generator shared by the CPU op suite (tests/ops/test_properties.py) and the GPU suite
(tests/gpu/test_properties_cuda.py): random PackK / PackV inputs and Dot4Attention calls (shapes, dtypes, masks
of every broadcast form, V formats, routes) filled with edge values (zeros, denormals, +-65504, one huge outlier
per block, NaN / Inf rows), and the checks against reference.py, whose non-finite policy is docs/ops.md's.

Hypothesis profiles (seeded, no example database):
  dot4attn-ci    the default: derandomized (the same examples every run), sized for ~3 minutes on 2 cores
  dot4attn-long  DOT4ATTN_FUZZ=long: 20x the examples, seed DOT4ATTN_FUZZ_SEED (default 0); a failure prints
                 the seed and the shrunk example
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from attention_cases import REF_TOL
from dot4attn import formats
from dot4attn import reference as R

LONG = os.environ.get("DOT4ATTN_FUZZ", "") == "long"
FUZZ_SEED = int(os.environ.get("DOT4ATTN_FUZZ_SEED", "0"))
# Examples per property test in the CI profile; the long profile multiplies them.
LONG_FACTOR = 20

settings.register_profile(
    "dot4attn-ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile(
    "dot4attn-long", derandomize=False, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.load_profile("dot4attn-long" if LONG else "dot4attn-ci")


def examples(n: int) -> int:
    """max_examples of a property test: n per CI run, LONG_FACTOR x n in the long profile."""
    return n * LONG_FACTOR if LONG else n


# ---- values --------------------------------------------------------------------------------------------------------

# How a tensor is filled. "nonfinite" puts NaN / +-Inf into a few rows of an otherwise normal tensor.
FILLS = ("normal", "normal", "normal", "zeros", "denormal", "fp16max", "outlier", "nonfinite")
# One huge value per 32-block: float32 reaches past the float16 scale range (8.3e6 = 65504 * 127 saturates q8_0,
# 5.2e5 = 65504 * 8 saturates q4_0, whose scale is the signed max / -8); float16 tops out at 65504.
OUTLIERS_F32 = (50.0, 3e5, 5.3e5, 8.4e6, 1e9)


def fill(draw, shape, dtype: str, kind: str, *, max_outlier: float | None = None) -> np.ndarray:
    """A tensor of `shape` and `dtype` filled per `kind` (random numbers from a drawn seed, so examples shrink)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape).astype(np.float32)
    n = x.size
    if n and kind == "zeros":  # whole zero blocks and rows, signed zeros
        blocks = x.reshape(-1, 32)
        blocks[rng.random(blocks.shape[0]) < 0.5] = 0.0
        blocks[rng.random(blocks.shape[0]) < 0.2] = -0.0
    elif n and kind == "denormal":  # subnormal blocks (float32 or float16): scales round to 0 or stay subnormal.
        # Half the blocks only: an output made of subnormal float16 values alone would be compared on a grid
        # coarser than any relative tolerance.
        tiny = np.float32(1e-40) if dtype == "float32" else np.float32(3e-7)
        blocks = x.reshape(-1, 32)
        blocks[rng.random(blocks.shape[0]) < 0.5] *= tiny
    elif n and kind == "fp16max":  # +-65504 scattered (the largest float16)
        hit = rng.random(shape) < 0.05
        x = np.where(hit, np.sign(x + 1e-9) * np.float32(65504), x)
    elif n and kind == "outlier":
        big = 65504.0 if dtype == "float16" else float(rng.choice(OUTLIERS_F32))
        if max_outlier is not None:
            big = min(big, max_outlier)
        blocks = x.reshape(-1, 32) * np.float32(0.01)
        cols = rng.integers(0, 32, blocks.shape[0])
        blocks[np.arange(blocks.shape[0]), cols] = big * np.where(rng.random(blocks.shape[0]) < 0.5, -1, 1)
        x = blocks.reshape(shape)
    elif n and kind == "nonfinite":
        rows = x.reshape(-1, shape[-1])
        hit = rng.random(rows.shape[0]) < 0.2
        hit[rng.integers(rows.shape[0])] = True
        for r in np.flatnonzero(hit):
            rows[r, rng.integers(shape[-1])] = rng.choice([np.nan, np.inf, -np.inf])
    return x.astype(dtype)


# ---- PackK / PackV --------------------------------------------------------------------------------------------------

PACK_OPS = (("PackK", None, "q8_0"), ("PackV", "q8_0", "q8_0"), ("PackV", "q4_0", "q4_0"), ("PackV", None, "q8_0"),
            ("PackV", "q6_0", "q6_0"))
V_FORMATS = formats.V_FORMATS
LEVEL_MAX = {"q8_0": 127, "q4_0": 7, "q6_0": 31}  # the end opposite q4_0's / q6_0's signed max clamps here


@dataclass
class PackCase:
    op: str
    fmt_attr: str | None
    fmt: str
    x: np.ndarray

    def __repr__(self):
        return f"PackCase({self.op}, format={self.fmt_attr}, {self.x.dtype}{list(self.x.shape)})"


@st.composite
def pack_cases(draw, ops=PACK_OPS) -> PackCase:
    op, fmt_attr, fmt = draw(st.sampled_from(ops))
    D = 32 * draw(st.integers(1, 8))
    shape = (draw(st.integers(0, 2)), draw(st.integers(1, 3)), draw(st.integers(0, 9)), D)
    dtype = draw(st.sampled_from(("float32", "float16")))
    return PackCase(op, fmt_attr, fmt, fill(draw, shape, dtype, draw(st.sampled_from(FILLS))))


def check_pack_policy(x: np.ndarray, payload: np.ndarray, scales: np.ndarray, fmt: str, what: str):
    """docs/ops.md's policy on its own terms (independent of reference.py): non-finite blocks get a NaN scale
    and a zero payload, no scale is infinite, finite blocks round-trip within half a step (clamped at the top)."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    bad = ~np.isfinite(blocks).all(axis=-1)
    s = scales.astype(np.float32)
    assert not np.isinf(s).any(), f"{what}: an infinite scale (the policy saturates at 65504)"
    assert np.array_equal(np.isnan(s), bad), f"{what}: NaN scales are not exactly the non-finite blocks"
    deq = R.unpack(payload, scales, fmt).reshape(blocks.shape)
    assert np.isnan(deq[bad]).all(), f"{what}: non-finite blocks must dequantize to NaN"
    lv = R.levels(payload, fmt).reshape(blocks.shape)
    assert (lv[bad] == 0).all(), f"{what}: non-finite blocks need a zero payload"
    ok = ~bad
    step = np.abs(np.where(ok, s, 0))[..., None]  # q4_0's scale is negative where the block's signed max is positive
    qmax = LEVEL_MAX[fmt]  # q4_0 / q6_0: the end opposite the signed max reaches 8 / 32 steps and clamps
    err = np.abs(deq - blocks)[ok]
    lim = np.broadcast_to(np.maximum(step * 0.5001, np.abs(blocks) - step * qmax), blocks.shape)[ok]
    assert (err <= lim + 1e-30).all(), f"{what}: a finite block does not round-trip within half a step"


# ---- Dot4Attention ---------------------------------------------------------------------------------------------------

ROUTES = ("auto", "prefill", "decode", "split_k")
MASK_KINDS = (None, None, "bool", "additive")


@dataclass
class AttnCase:
    dtype: str
    v_format: str
    causal: int
    route: str
    query: np.ndarray
    k_payload: np.ndarray
    k_scales: np.ndarray
    value: np.ndarray
    v_scales: np.ndarray | None
    mask: np.ndarray | None
    fills: tuple

    @property
    def mask_dtype(self):
        return None if self.mask is None else self.mask.dtype.name

    def inputs(self):
        return self.query, self.k_payload, self.k_scales, self.value, self.v_scales, self.mask

    def reference(self, qk_f16: bool = False) -> np.ndarray:
        """The contract's output; qk_f16: with the f16 Q.K's logits (a GPU plan with k_dequant, docs/ops.md)."""
        return R.attention(*self.inputs(), causal=self.causal, v_format=self.v_format, qk_f16=qk_f16)

    def __repr__(self):
        B, Hq, Sq, D = self.query.shape
        Hkv, Sk = self.k_payload.shape[1:3]
        m = "none" if self.mask is None else f"{self.mask.dtype}{list(self.mask.shape)}"
        return (f"AttnCase(B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} {self.dtype} V={self.v_format} "
                f"causal={self.causal} route={self.route} mask={m} fills(q,k,v)={self.fills})")


def _mask(draw, B, Hq, Sq, Sk, dtype):
    kind = draw(st.sampled_from(MASK_KINDS))
    if kind is None:
        return None
    full = (B, Hq, Sq, Sk)
    rank = draw(st.integers(1, 4))
    shape = tuple(d if draw(st.booleans()) else 1 for d in full[4 - rank:])  # every broadcast form
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "bool":
        return rng.random(shape) < draw(st.sampled_from((0.3, 0.8, 1.0)))
    m = rng.standard_normal(shape).astype(np.float32)
    m[rng.random(shape) < draw(st.sampled_from((0.0, 0.2, 0.9)))] = -np.inf
    if draw(st.integers(0, 9)) == 0 and m.size:  # a NaN or +inf mask value poisons the rows that see it
        m.reshape(-1)[rng.integers(m.size)] = rng.choice([np.nan, np.inf])
    return m.astype(dtype)


MAX_LOGIT = 4096.0


def _bounded_logits(q: np.ndarray, kp: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """The query scaled by a power of two (exact: the edge values keep their pattern) so that every finite logit
    lies within +-MAX_LOGIT. Beyond that, float32 rounding of the logit alone (|logit| x 6e-8) moves the softmax
    of two nearly tied keys by more than the suite's tolerance: the ill-conditioning of softmax, not a kernel
    error. (Huge K or Q blocks still occur; the other side is then small.)"""
    if not q.size or not kp.size:
        return q
    with np.errstate(invalid="ignore", over="ignore"):
        lg = np.abs(R.dot4_logits(q, kp, ks))
    top = float(lg[np.isfinite(lg)].max(initial=0.0))
    if top <= MAX_LOGIT:
        return q
    return (q.astype(np.float32) * np.float32(2.0 ** -np.ceil(np.log2(top / MAX_LOGIT)))).astype(q.dtype)


@st.composite
def attention_cases(draw, routes=ROUTES, v_formats=V_FORMATS, gpu: bool = False) -> AttnCase:
    """A Dot4Attention call; gpu: one the GPU kernels take (q6_0 V at D a multiple of 64, formats.gpu_takes)."""
    dtype = draw(st.sampled_from(("float32", "float16")))
    v_format = draw(st.sampled_from(v_formats))
    step = formats.GPU_Q6_D_MULTIPLE if gpu and not formats.gpu_takes(v_format, 32) else 32
    D = step * draw(st.integers(1, 256 // step))
    Hkv = draw(st.integers(1, 2))
    Hq = Hkv * draw(st.sampled_from((1, 2, 3, 4)))
    B = draw(st.integers(1, 2))
    route = draw(st.sampled_from(routes))
    Sq = draw(st.sampled_from((1, 2, 3, 5, 8)) if route in ("decode", "split_k")
              else st.sampled_from((1, 2, 7, 8, 9, 16, 17, 33, 65)))
    # Sk = 0 and Sk < Sq (rows with no key under causal masking); a few long ones give split_k several splits.
    Sk = draw(st.one_of(st.sampled_from((0, 1, 2, 31, 63, 64, 65, 127, 130)), st.integers(0, 140),
                        st.sampled_from((513, 700)) if Sq <= 8 else st.integers(0, 140)))
    causal = draw(st.integers(0, 1))
    qf, kf = draw(st.sampled_from(FILLS)), draw(st.sampled_from(FILLS))
    vf = draw(st.sampled_from(FILLS))
    q = fill(draw, (B, Hq, Sq, D), dtype, qf, max_outlier=3e5)
    k = fill(draw, (B, Hkv, Sk, D), dtype, kf)
    v = fill(draw, (B, Hkv, Sk, D), dtype, vf)
    kp, ks = R.pack_k(k)
    q = _bounded_logits(q, kp, ks)
    if v_format == "float":
        value, v_scales = v, None
    else:
        value, v_scales = R.pack_v(v, v_format)
    return AttnCase(dtype, v_format, causal, route, q, kp, ks, value, v_scales, _mask(draw, B, Hq, Sq, Sk, dtype),
                    (qf, kf, vf))


def visible_any(case: AttnCase) -> np.ndarray:
    """bool [B, Hq, Sq]: the rows that see at least one key (the others output exactly 0)."""
    B, Hq, Sq, _ = case.query.shape
    Sk = case.k_payload.shape[2]
    vis = np.ones((B, Hq, Sq, Sk), bool)
    if case.causal:
        vis &= np.arange(Sk)[None, :] <= Sk - Sq + np.arange(Sq)[:, None]
    if case.mask is not None:
        m = case.mask if case.mask.dtype == np.bool_ else case.mask != -np.inf
        vis &= np.broadcast_to(m, vis.shape)
    return vis.any(axis=-1)


def check_attention(out: np.ndarray, ref: np.ndarray, case: AttnCase, what: str):
    """NaN exactly where the reference has NaN (whole rows), the same infinities (float16 overflow), rows with no
    visible key exactly 0, and the finite values within the suite's tolerance (REF_TOL NMSE)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, \
        f"{what}: got {out.dtype}{list(out.shape)}, reference {ref.dtype}{list(ref.shape)}"
    nan_ref, nan_out = np.isnan(ref), np.isnan(out)
    rows = nan_ref.any(axis=-1)
    assert (nan_ref.all(axis=-1) == rows).all(), f"{what}: reference NaN rows are partial (reference bug)"
    bad = nan_out != nan_ref
    assert not bad.any(), (
        f"{what}: NaN pattern differs from the reference in {np.count_nonzero(bad.any(-1))} rows, first "
        f"[b, h, i] = {np.argwhere(bad.any(-1))[0].tolist()} (reference NaN there: "
        f"{bool(rows[tuple(np.argwhere(bad.any(-1))[0])])})")
    inf_bad = np.isinf(out) != np.isinf(ref)
    assert not inf_bad.any(), f"{what}: {np.count_nonzero(inf_bad)} infinite values differ from the reference"
    dead = ~visible_any(case)
    if dead.any():
        assert (out[dead] == 0).all(), f"{what}: rows that see no key must be exactly 0"
    fin = np.isfinite(ref)
    err = R.nmse(out[fin], ref[fin])
    assert err <= REF_TOL, f"{what}: NMSE {err:.3e} > {REF_TOL:.0e} over the finite values"
