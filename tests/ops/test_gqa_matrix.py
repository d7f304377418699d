"""ONNX Runtime's own GroupQueryAttention test matrix (onnxruntime/test/python/transformers/test_gqa_cpu.py) run
against Dot4GroupQueryAttention on the CPU EP, with ONNX Runtime's GroupQueryAttention on the same node (float
caches) as the reference, in the same process.

The matrix's dimensions, each value of each taken by several hand-picked cases: head sizes 32 .. 256 (the op's:
multiples of 32), batch 1, 3 and 5, first prompts of 35 .. 8000 tokens (right-padded batches), decode steps over
pasts of 128 .. 5000 tokens (the split_k route from 2048 keys), several new tokens over a past (test_gqa_cpu.py's
"interactive" 256 over 2048; batch 1 only: ONNX Runtime refuses more), heads (6, 6), (6, 3), (9, 9), (9, 3),
(32, 8), rotary off / halves / interleaved (and a partial rotation), packed QKV, past and present in one buffer
(bound in place, as genai does) or not, float32 and float16, V q8_0 and q4_0, the default and a custom scale: 29
cases that each take a value of every dimension, so that every value is met several times in a few seconds (the
full product is tens of thousands of cases).

Each case checks the op against ONNX Runtime within the quantization tolerance the op tests use
(tests/attention_cases.py, QUALITY_TOL: NMSE vs float attention), per batch row over its valid query rows, and
every valid row of the present caches within half a quantization step of ONNX Runtime's float present (plus
float16 rounding for float16 models). What the matrix also varies and the op does not implement (local windows,
softcap, smooth softmax, custom tree attention's position_ids / attention_bias) is refused, not computed:
tests/ops/test_gqa_contract.py.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from attention_cases import QUALITY_TOL
from cache_cases import bound_run
from dot4attn import reference as ref
from dot4attn.onnx_builders import session
from gqa_cases import gqa_model


@dataclass(frozen=True)
class Case:
    B: int
    S: int         # new tokens
    past: int      # the longest row's past tokens (0: a first prompt)
    hq: int
    hkv: int
    d: int
    dtype: str     # float32 / float16
    rotary: str    # off / half / inter / partial (halves over D / 2 dims)
    packed: bool   # QKV in one input
    shared: bool   # past and present are one buffer
    v_format: str
    scale: float = 0.0  # 0: 1 / sqrt(D)

    def __str__(self):
        kind = f"prompt{self.S}" if self.past == 0 else f"S{self.S}-past{self.past}"
        return (f"B{self.B}-{kind}-{self.hq}x{self.hkv}-d{self.d}-{self.dtype}-rot_{self.rotary}-"
                f"{'qkv' if self.packed else 'sep'}-{'shared' if self.shared else 'new'}-{self.v_format}"
                f"{f'-scale{self.scale}' if self.scale else ''}")


C = Case
CASES = [
    # first prompts (test_gqa_no_past): right-padded batches of 35 .. 2000 tokens
    C(3, 127, 0, 6, 3, 128, "float32", "half", False, True, "q8_0"),
    C(3, 240, 0, 32, 8, 128, "float16", "inter", True, False, "q8_0"),  # the pipeline's case
    C(1, 35, 0, 9, 9, 32, "float32", "off", True, True, "q4_0"),
    C(5, 200, 0, 9, 3, 64, "float16", "half", False, False, "q4_0"),
    C(5, 35, 0, 6, 6, 256, "float32", "inter", False, True, "q8_0"),
    C(1, 2000, 0, 6, 3, 128, "float32", "half", True, False, "q8_0"),
    C(3, 127, 0, 9, 3, 96, "float16", "off", False, True, "q4_0"),
    C(1, 240, 0, 6, 6, 160, "float32", "partial", False, False, "q8_0", 0.1),
    C(3, 35, 0, 9, 9, 192, "float16", "half", True, True, "q8_0"),
    C(5, 127, 0, 6, 3, 224, "float32", "inter", True, False, "q4_0"),
    C(3, 200, 0, 32, 8, 64, "float32", "half", False, True, "q8_0"),
    C(1, 127, 0, 9, 3, 256, "float16", "half", False, False, "q4_0"),
    C(1, 8000, 0, 6, 3, 128, "float32", "half", False, True, "q8_0"),
    # decode steps (test_gqa_past): one new token over pasts of 128 .. 5000, each row its own length
    C(1, 1, 128, 9, 3, 64, "float32", "half", False, True, "q8_0"),  # the pipeline's case
    C(3, 1, 339, 6, 6, 32, "float16", "inter", True, False, "q4_0"),
    C(5, 1, 1024, 9, 9, 128, "float32", "off", False, False, "q8_0"),
    C(3, 1, 5000, 6, 3, 128, "float16", "half", False, True, "q8_0"),
    C(5, 1, 800, 32, 8, 96, "float32", "half", True, True, "q4_0"),
    C(1, 1, 256, 6, 3, 160, "float16", "off", False, False, "q8_0", 0.05),
    C(3, 1, 799, 9, 3, 192, "float32", "inter", False, True, "q4_0"),
    C(5, 1, 2048, 6, 6, 224, "float16", "half", True, False, "q8_0"),
    C(1, 1, 5000, 9, 9, 256, "float32", "partial", False, False, "q4_0"),
    C(3, 1, 128, 32, 8, 256, "float16", "inter", False, True, "q8_0"),
    C(5, 1, 339, 9, 3, 32, "float32", "half", True, True, "q8_0"),
    C(1, 1, 1024, 6, 3, 64, "float16", "half", False, False, "q4_0"),
    # several new tokens over a past (test_gqa_interactive_one_batch: 256 over 2048)
    C(1, 256, 2048, 32, 8, 32, "float32", "half", False, True, "q8_0"),  # the pipeline's case
    C(1, 256, 1024, 6, 3, 128, "float16", "inter", True, False, "q4_0"),
    C(1, 16, 800, 9, 9, 64, "float32", "off", False, False, "q8_0"),
    C(1, 5, 339, 6, 6, 96, "float16", "half", True, True, "q8_0"),
]


def _inputs(c: Case, rng):
    """Feeds for both ops (float caches for ORT, their packed rows for the op), the per-row valid keys after the
    call, total_sequence_length, and the caches' row count."""
    dt = np.dtype(c.dtype)
    hidden = (c.hq + 2 * c.hkv) * c.d if c.packed else c.hq * c.d
    f = {"query": rng.standard_normal((c.B, c.S, hidden), dtype=np.float32).astype(dt)}
    if not c.packed:
        for n in ("key", "value"):
            f[n] = rng.standard_normal((c.B, c.S, c.hkv * c.d), dtype=np.float32).astype(dt)
    if c.past == 0:  # a first prompt: row 0 full, the others right-padded
        total = np.array([c.S] + [int(rng.integers(1, c.S + 1)) for _ in range(c.B - 1)])
        total_len = c.S
        rows = c.S + 8 if c.shared else 0  # genai's buffer: longer than the prompt
    else:  # row 0 has the longest past, the others any in [1, past]
        past = np.array([c.past] + [int(rng.integers(1, c.past + 1)) for _ in range(c.B - 1)])
        total = past + c.S
        total_len = int(total.max())
        rows = total_len if c.shared else c.past
    cache = rng.standard_normal((2, c.B, c.hkv, rows, c.d), dtype=np.float32).astype(dt)  # garbage past each row
    L = max(rows, total_len)
    if c.rotary != "off":
        r = c.d // 4 if c.rotary == "partial" else c.d // 2
        ang = rng.uniform(0, 2 * np.pi, (L, r))
        f["cos_cache"], f["sin_cache"] = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
    f["seqlens_k"] = (total - 1).astype(np.int32)
    f["total_sequence_length"] = np.array(total_len, np.int32)
    theirs = dict(f, past_key=cache[0], past_value=cache[1])
    ours = dict(f, past_key=ref.pack_cache_rows(cache[0].astype(np.float32)),
                past_value=ref.pack_cache_rows(cache[1].astype(np.float32), c.v_format))
    return ours, theirs, total


def _half_step(got_rows, want, d, fmt, half, what):
    """Each value of the packed rows within half its block's quantization step of ORT's float value (float16 models:
    plus the float16 rounding of ORT's value, which the op quantizes from float32). q4_0's 16 levels run from -8 to
    7 steps with the block's largest magnitude on -8: a value of the other sign past 7.5 steps (up to 8) rounds to
    7 and is off by its distance to level 7, at most one step."""
    payload, scales = ref.unpack_cache_rows(got_rows, d, fmt)
    got = ref.unpack(payload, scales, fmt)
    step = np.repeat(scales.astype(np.float32), 32, axis=-1)
    want = want.astype(np.float32)
    allowed = np.abs(step) / 2  # q4_0 scales carry the sign that puts the largest magnitude on level -8
    if fmt == "q4_0":
        with np.errstate(divide="ignore", invalid="ignore"):
            clamped = want / step > 7.5
        allowed = np.where(clamped, np.abs(want - 7 * step), allowed)
    bound = allowed * (1 + 1e-6) + (np.abs(want) * 2.0 ** -10 if half else 1e-6)
    err = np.abs(got - want)
    assert (err <= bound).all(), (f"{what}: {np.count_nonzero(err > bound)} values off by more than half a step, "
                                  f"worst {(err - bound).max():.3g} past it")


@pytest.mark.parametrize("c", CASES, ids=str)
def test_against_onnxruntime_group_query_attention(c: Case):
    rng = np.random.default_rng(zlib.crc32(str(c).encode()))
    ours_f, theirs_f, total = _inputs(c, rng)
    kw = dict(packed=c.packed, rotary=c.rotary != "off", interleaved=c.rotary == "inter",
              attrs={"scale": c.scale})
    dt = np.dtype(c.dtype)
    want, want_k, want_v = session(gqa_model(dt, c.hq, c.hkv, c.d, ours=False, **kw)).run(None, theirs_f)
    sess = session(gqa_model(dt, c.hq, c.hkv, c.d, ours=True, v_format=c.v_format, **kw))
    if c.shared:  # present bound to past's memory: the op appends in place
        feeds = {k: v for k, v in ours_f.items() if k not in ("seqlens_k", "total_sequence_length")}
        out, pk, pv = bound_run(sess, feeds, ours_f["seqlens_k"], ours_f["total_sequence_length"],
                                ours_f["past_key"], ours_f["past_value"])
    else:
        out, pk, pv = sess.run(None, ours_f)
    assert out.dtype == dt and out.shape == want.shape
    tol = QUALITY_TOL[c.v_format]
    for b in range(c.B):
        rows = min(c.S, int(total[b])) if c.past == 0 else c.S  # padding rows: unspecified in GroupQueryAttention
        err = ref.nmse(out[b, :rows].astype(np.float32), want[b, :rows].astype(np.float32))
        assert err <= tol, f"batch row {b}: NMSE {err:.3e} vs ONNX Runtime > {tol:.0e}"
    for b in range(c.B):
        n = int(total[b])
        _half_step(pk[b, :, :n], want_k[b, :, :n], c.d, "q8_0", dt == np.float16, f"present_key row {b}")
        _half_step(pv[b, :, :n], want_v[b, :, :n], c.d, c.v_format, dt == np.float16, f"present_value row {b}")
