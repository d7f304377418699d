"""The reference's f16 Q.K mode (reference.dot4_logits(qk_f16=True)): the numerics of the Hopper prefill's Q.K on f16
tensor cores (plan override k_dequant=1, gpu/k_dequant.cuh), which the GPU tests compare that instance against.

What the mode promises (docs/ops.md): Q's levels times their block scale and K's dequantized values each rounded to
float16 once, one float32 dot product; nothing clamped where K holds values past float16's range; NaN where a K scale
is NaN. Its distance from float attention (unquantized Q, K) stays that of the contract's own math, within a few
percent: the f16 rounding is small next to Q's and K's int8 quantization."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gaussian_qkv
from dot4attn import reference as R


def _case(seed, B, Hq, Hkv, Sq, Sk, D):
    rng = np.random.default_rng(seed)
    q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, "float16")
    kp, ks = R.pack_k(k)
    return q, k, v, kp, ks


@pytest.mark.parametrize("shape", [(1, 8, 2, 64, 512, 64), (1, 4, 1, 96, 300, 128), (1, 4, 4, 1, 20000, 64)])
def test_f16_qk_stays_as_close_to_float_attention_as_the_contract_math(shape):
    q, k, v, kp, ks = _case(sum(shape), *shape)
    exact = R.float_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    int8 = R.attention(q, kp, ks, v).astype(np.float32)
    f16 = R.attention(q, kp, ks, v, qk_f16=True).astype(np.float32)
    e_int8, e_f16 = R.nmse(int8, exact), R.nmse(f16, exact)
    assert e_f16 <= 1.05 * e_int8, (e_int8, e_f16)
    assert R.nmse(f16, int8) <= 0.05 * e_int8, (R.nmse(f16, int8), e_int8)


def test_f16_qk_logits_are_the_rounded_products():
    q, _, _, kp, ks = _case(3, 1, 2, 1, 5, 40, 64)
    q8, qs = R.quantize_q(q)
    qf = (q8.astype(np.float32).reshape(1, 2, 5, 2, 32) * qs[..., None]).astype(np.float16).astype(np.float32)
    kf = (kp.astype(np.float32).reshape(1, 1, 40, 2, 32) * ks.astype(np.float32)[..., None]).astype(np.float16)
    want = np.einsum("bhid,bjd->bhij", qf.reshape(1, 2, 5, 64), kf.astype(np.float32).reshape(1, 40, 64)) / 8.0
    got = R.dot4_logits(q, kp, ks, qk_f16=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_f16_qk_keeps_k_past_the_float16_range_and_nan_scales():
    """A head whose K is packed from float32 values past float16's range (scales > 515.5) keeps float16
    significands with a shifted exponent range (no inf, no clamping); a NaN K scale gives NaN logits for its key."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 6, 64)).astype(np.float16)
    k = rng.standard_normal((1, 2, 50, 64)).astype(np.float32)
    k[:, 1] *= 3e5
    kp, ks = R.pack_k(k)
    assert (ks[0, 1].astype(np.float32) > R.K_SCALE_F16_LIMIT).any() and (ks[0, 0] < R.K_SCALE_F16_LIMIT).all()
    ks[0, 0, 7, 1] = np.float16("nan")
    a = R.dot4_logits(q, kp, ks)
    b = R.dot4_logits(q, kp, ks, qk_f16=True)
    assert np.array_equal(np.isnan(a), np.isnan(b)) and np.isnan(b[0, :2, :, 7]).all()
    assert np.isfinite(b[0, 2:]).all()
    ok = ~np.isnan(a)
    scale = np.abs(a[0, 2:]).max()  # the big head's logits, ~1e5: within float16 rounding of the products
    assert np.abs(b - a)[0, 2:].max() <= 2e-3 * scale
    assert np.abs(b - a)[ok].max() > 0  # it is a different rounding, not the same math
