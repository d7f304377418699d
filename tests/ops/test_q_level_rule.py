"""The GPU kernels' fast rule for Q's int8 levels (gpu/vendor.h, q_levels): x times dv's correctly rounded reciprocal,
rounded to the nearest integer, with the true division taken where that product lies within 2^-13 of a
half-integer. It must give rintf(x / dv) (float32 division, the contract's and the CPU's levels) bit for bit. numpy's
float32 arithmetic is IEEE round-to-nearest, the same operations the kernel issues (__frcp_rn, __fmul_rn, rintf), so
this checks the rule itself over every finite float16 value x against block maxima amax >= |x| of every binade;
tests/gpu/test_kernels.py (test_prefill_q_levels_are_the_contracts) checks the kernels' levels on a GPU."""
from __future__ import annotations

import numpy as np

NEAR = np.float32(2.0 ** -13)  # gpu/vendor.h's threshold


def _all_finite_f16() -> np.ndarray:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    return h[np.isfinite(h)].astype(np.float32)


def _block_maxima(rng: np.random.Generator) -> np.ndarray:
    """Finite positive float16 maxima: both ends of the range, powers of two and 127 times them (exact ties), and a
    log-uniform sample of every binade."""
    edges = [2.0 ** -24, 2.0 ** -14, 1.0, 65504.0] + [2.0 ** e for e in range(-24, 16)] + \
            [127.0 * 2.0 ** e for e in range(-24, 9)]
    sample = np.exp2(rng.uniform(-24, 16, 600))
    amax = np.concatenate([np.array(edges), sample]).astype(np.float16)
    return np.unique(amax[np.isfinite(amax) & (amax > 0)]).astype(np.float32)


def test_fast_q_levels_equal_true_division():
    rng = np.random.default_rng(5)
    xs = _all_finite_f16()
    pairs = fallbacks = 0
    worst_product = worst_quotient = 0.0
    for amax in _block_maxima(rng):
        x = xs[np.abs(xs) <= amax]
        dv = np.float32(amax) / np.float32(127)  # q_block_scale: div_rn(amax, 127)
        inv = np.float32(1) / dv                 # __frcp_rn(dv)
        r = (x * inv).astype(np.float32)         # __fmul_rn(x, inv)
        fast = np.rint(r)
        near = np.abs(np.abs(r - fast) - np.float32(0.5)) < NEAR
        want = np.rint((x / dv).astype(np.float32))  # rintf(div_rn(x, dv))
        got = np.where(near, want, fast)
        bad = got != want
        assert not bad.any(), (f"amax={amax!r}: x={x[bad][:4]} fast levels {got[bad][:4]} vs true division's "
                               f"{want[bad][:4]}")
        exact = x.astype(np.float64) / np.float64(dv)
        worst_product = max(worst_product, float(np.max(np.abs(r - exact))))
        worst_quotient = max(worst_quotient, float(np.max(np.abs((x / dv).astype(np.float32) - exact))))
        pairs += x.size
        fallbacks += int(near.sum())
    # the bounds the rule rests on (gpu/vendor.h): x inv within 2^-16 and the float32 quotient within 2^-17 of x / dv,
    # so a margin of 2^-13 around each half-integer leaves the two on the same side
    assert worst_product <= 2.0 ** -16 and worst_quotient <= 2.0 ** -17, (worst_product, worst_quotient)
    assert pairs > 10_000_000
    assert fallbacks / pairs < 1e-3, f"the true division ran for {fallbacks} of {pairs} values"
