"""The Dot4GroupQueryAttention case table and helpers shared by the CPU tests (tests/ops/test_cache_attention.py)
and the CUDA tests (tests/gpu/test_cache_cuda.py): inputs, a run, the reference check, a run on a shared buffer."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from dot4attn import reference as ref
from dot4attn.formats import cache_row_widths, gpu_takes

CASES = [
    # (B, hq, hkv, d, dtype, packed, rotary, interleaved, qk_norm, v_format, cache_layout)
    (1, 4, 2, 32, np.float32, True, True, False, False, "q8_0", "rows"),
    (2, 7, 1, 64, np.float32, True, True, False, False, "q8_0", "rows"),
    (2, 4, 2, 128, np.float32, False, True, False, True, "q8_0", "rows"),
    (1, 8, 8, 64, np.float16, False, True, True, False, "q4_0", "rows"),
    (2, 6, 2, 256, np.float16, True, False, False, False, "q8_0", "rows"),
    (3, 4, 1, 96, np.float32, False, True, False, True, "q4_0", "rows"),
    (2, 28, 4, 128, np.float16, True, True, False, False, "q8_0", "rows"),
    (2, 8, 2, 128, np.float16, False, True, False, True, "q8_0", "rows"),
    # q4_0 V with K and V in two rows of D bytes (what onnxruntime-genai allocates)
    (1, 4, 2, 32, np.float32, True, True, False, False, "q4_0", "pair"),
    (1, 8, 8, 64, np.float16, False, True, True, False, "q4_0", "pair"),
    (3, 4, 1, 96, np.float32, False, True, False, True, "q4_0", "pair"),
    (2, 28, 4, 128, np.float16, True, True, False, False, "q4_0", "pair"),
    (2, 6, 2, 256, np.float16, True, False, False, False, "q4_0", "pair"),
]
# Every q4_0 case again with q6_0 V, rows and pair layouts, and rows at d = 128 (float32, Q / K norms) and 256. The
# GPU kernels take q6_0 V at head sizes that are multiples of 64 (formats.gpu_takes): those cases are the GPU's too;
# the others (d = 32, 96) run on the CPU only.
Q6_CASES = [(*c[:9], "q6_0", c[10]) for c in CASES if c[9] == "q4_0"] + [
    (2, 4, 2, 128, np.float32, False, True, False, True, "q6_0", "rows"),
    (2, 6, 2, 256, np.float16, True, False, False, False, "q6_0", "rows"),
]
# Every rows case again in the tight layout (no row padding: tensors of 34 .. 272-byte rows at d = 32 .. 256, the
# tokens' payloads and scales in two runs), q8_0, q4_0 and q6_0 V; on shared buffers only (the op refuses unshared
# tight caches), so these run in tests of their own (tests/ops/test_cache_attention.py, tests/gpu/test_cache_cuda.py).
TIGHT_CASES = [(*c[:10], "tight") for c in CASES + Q6_CASES if c[10] == "rows"]
GPU_TIGHT_CASES = [c for c in TIGHT_CASES if gpu_takes(c[9], c[3])]
GPU_CASES = CASES + [c for c in Q6_CASES if gpu_takes(c[9], c[3])]  # what the CUDA op tests run
CPU_ONLY_CASES = [c for c in Q6_CASES if not gpu_takes(c[9], c[3])]
CPU_CASES = CASES + Q6_CASES  # what the CPU op tests run (and TIGHT_CASES on shared buffers)


def case_id(c) -> str:
    return (f"B{c[0]}-{c[1]}x{c[2]}-d{c[3]}-{np.dtype(c[4]).name}-{'qkv' if c[5] else 'sep'}-"
            f"{'rot' if c[6] else 'norot'}{'i' if c[7] else ''}-{'norm' if c[8] else ''}-{c[9]}-{c[10]}")


def make_inputs(B, S, hq, hkv, d, *, dtype=np.float32, packed=False, rotary=False, rot_half=None, qk_norm=False,
            past_rows=0, v_format="q8_0", seed=0, max_pos=4096, cache_layout="rows"):
    rng = np.random.default_rng(seed)
    hidden = (hq + 2 * hkv) * d if packed else hq * d
    f = {"query": rng.standard_normal((B, S, hidden)).astype(dtype)}
    if not packed:
        f["key"] = rng.standard_normal((B, S, hkv * d)).astype(dtype)
        f["value"] = rng.standard_normal((B, S, hkv * d)).astype(dtype)
    k_row, v_row = cache_row_widths(d, v_format, cache_layout)
    f["past_key"] = np.zeros((B, hkv, past_rows, k_row), np.uint8)
    f["past_value"] = np.zeros((B, hkv, past_rows, v_row), np.uint8)
    if rotary:
        r = rot_half or d // 2
        ang = rng.uniform(0, 6.3, (max_pos, r))
        f["cos_cache"], f["sin_cache"] = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    if qk_norm:
        f["q_norm_weight"] = rng.uniform(0.5, 1.5, d).astype(dtype)
        f["k_norm_weight"] = rng.uniform(0.5, 1.5, d).astype(dtype)
    return f


def run(sess, feeds, seqlens, total):
    f = dict(feeds, seqlens_k=np.asarray(seqlens, np.int32), total_sequence_length=np.asarray(total, np.int32))
    return sess.run(None, f), f


def expect(feeds, attrs, out, atol):
    kw = {k: feeds.get(k) for k in ("cos_cache", "sin_cache")}
    want = ref.group_query_attention_packed(
        feeds["query"], feeds.get("key"), feeds.get("value"), feeds["past_key"], feeds["past_value"],
        feeds["seqlens_k"], feeds["total_sequence_length"], q_norm=feeds.get("q_norm_weight"),
        k_norm=feeds.get("k_norm_weight"), **kw, **attrs)
    np.testing.assert_allclose(np.asarray(out[0]).astype(np.float32), want[0].astype(np.float32), atol=atol, rtol=0)
    # The cache rows: bit-exact but for rare 1-step rounding ties of float32 math done in another order.
    for got, exp in zip(out[1:], want[1:]):
        assert got.shape == exp.shape
        assert np.mean(got != exp) < 1e-3
    return want




def bound_run(sess, feeds, seqlens, total, rows_k, rows_v, device: str = "cpu"):
    """Runs with present_* bound to the same OrtValues as past_* (onnxruntime-genai's shared buffer)."""
    io = sess.io_binding()
    pk = ort.OrtValue.ortvalue_from_numpy(rows_k, device, 0)
    pv = ort.OrtValue.ortvalue_from_numpy(rows_v, device, 0)
    f = dict(feeds, seqlens_k=np.asarray(seqlens, np.int32), total_sequence_length=np.asarray(total, np.int32))
    for k, v in f.items():
        if k in ("past_key", "past_value"):
            continue
        if k in ("seqlens_k", "total_sequence_length"):
            io.bind_cpu_input(k, v)
        else:
            io.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), device, 0))
    io.bind_ortvalue_input("past_key", pk)
    io.bind_ortvalue_input("past_value", pv)
    io.bind_output("output", device)
    io.bind_ortvalue_output("present_key", pk)
    io.bind_ortvalue_output("present_value", pv)
    sess.run_with_iobinding(io)
    return io.copy_outputs_to_cpu()[0], pk.numpy(), pv.numpy()  # numpy() copies device values to the host




def cache_with_garbage(rng, B, hkv, rows, d, valid, cache_layout="rows", v_format=None):
    """Packed K and V caches [B, hkv, rows, row] of random rows (V v_format: by default q8_0 in the rows and tight
    layouts, q4_0 in the pair layout), every row from valid[b] on replaced by a row of huge values (which would
    dominate any output that read it)."""
    k = rng.standard_normal((B, hkv, rows, d)).astype(np.float32)
    v = rng.standard_normal((B, hkv, rows, d)).astype(np.float32)
    huge = np.full((d,), 6e4, np.float32)
    if cache_layout == "pair":
        ck, cv = ref.pack_cache_pair(k, v, v_format or "q4_0")
        gk, gv = ref.pack_cache_pair(huge, huge, v_format or "q4_0")
    else:
        vf = v_format or "q8_0"
        ck, cv = ref.pack_cache_rows(k, "q8_0", cache_layout), ref.pack_cache_rows(v, vf, cache_layout)
        gk, gv = ref.pack_cache_rows(huge, "q8_0", cache_layout), ref.pack_cache_rows(huge, vf, cache_layout)
    for b, n in enumerate(valid):
        ck[b, :, n:] = gk
        cv[b, :, n:] = gv
    if cache_layout == "tight":  # the op's tensors: the rows' parts in two runs
        return ref.tight_tensor(ck, d, "q8_0"), ref.tight_tensor(cv, d, v_format or "q8_0")
    return ck, cv


def assert_only_new_rows_changed(before_k, before_v, after_k, after_v, valid, tight=None):
    """An in-place decode step wrote row valid[b] of every (b, kv head) and nothing else. tight: (D, V format) of
    tight-layout tensors, whose token rows are compared (reference.tight_rows)."""
    if tight is not None:
        d, vf = tight
        before_k, after_k = ref.tight_rows(before_k, d, "q8_0"), ref.tight_rows(after_k, d, "q8_0")
        before_v, after_v = ref.tight_rows(before_v, d, vf), ref.tight_rows(after_v, d, vf)
    changed = np.any(after_k != before_k, axis=-1) | np.any(after_v != before_v, axis=-1)
    want = np.zeros_like(changed)
    for b, n in enumerate(valid):
        want[b, :, n] = True
    assert np.array_equal(changed, want), "only row valid[b] of each (b, kv head) may change"
