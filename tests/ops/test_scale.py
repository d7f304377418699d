"""64-bit indexing on the CPU: a decode over 2^24 + 64 keys at D = 128 (K payload and q8_0 V each 2^31 + 8192
elements, 4.3 GB in all) on the decode and split_k routes, against the exact output of the construction in
tests/scale_cases.py. The construction itself is checked against reference.attention on a small cache first."""
from __future__ import annotations

import numpy as np
import pytest

import scale_cases as SC
from attention_cases import REF_TOL
from conftest import attention_session, check_nmse
from dot4attn import reference as R


@pytest.mark.parametrize("causal", [False, True])
def test_the_construction_is_exact(causal):
    """expected_output equals the full reference on a cache small enough for it (prefill rows, so the causal
    counting of zero keys per row is exercised too)."""
    feeds, hot = SC.big_inputs(2, 4, 2, 5, 3000)
    want = R.attention(feeds["query"], feeds["k_payload"], feeds["k_scales"], feeds["value"], feeds["v_scales"],
                       causal=int(causal), v_format="q8_0")
    check_nmse(SC.expected_output(feeds, hot, causal=causal), want, 1e-10, f"construction causal={causal}")


@pytest.mark.parametrize("Sq", [1, 5, 16])
def test_the_hot_keys_dominate_every_row(Sq):
    """Every query row gives its hot keys a top logit of at least 25, so the 2^24 zero keys weigh below 2e-4 of
    its sum: the check measures which keys were read, not the float32 rounding of 2^24 equal terms (a key scale
    from the whole [Sq, D] query block's norm gave Sq = 16 top logits of ~8, where the zero keys outweigh the hot
    ones 9000 to 1)."""
    feeds, hot = SC.big_inputs(1, 2, 1, Sq, 1 << 12)
    idx = np.asarray(hot)
    s = R.dot4_logits(feeds["query"], feeds["k_payload"][:, :, idx], feeds["k_scales"][:, :, idx])
    assert s.max(axis=-1).min() >= 25.0


@pytest.fixture(scope="module")
def big():
    return SC.big_inputs(1, 2, 1, 1, SC.BIG_SK)


@pytest.mark.parametrize("route", ["decode", "split_k"])
def test_decode_over_more_than_2_31_elements(big, route):
    feeds, hot = big
    assert feeds["k_payload"].size > 2**31 and feeds["value"].size > 2**31
    sess = attention_session("float32", "q8_0", None, 0, route)
    out = sess.run(None, feeds)[0]
    check_nmse(out, SC.expected_output(feeds, hot), REF_TOL, f"Sk={SC.BIG_SK} route={route}")
