"""One ONNX Runtime session run from many Python threads at once must give, per thread, exactly what the same
run gives alone. Shared by tests/ops/test_concurrency.py (CPU EP) and tests/gpu/test_concurrency_cuda.py (CUDA EP).

ONNX Runtime allows concurrent Run() calls on one session; the op keeps per-call state on the stack, in
thread_local scratch (CPU) or in scratch from ORT's allocator (GPU split_k partials), so nothing may leak from
one call into another. The threads start together at a barrier and each repeats its run, so the calls overlap.
Results are compared bit for bit: the same inputs through the same session give the same bits whatever else
runs at the same time (the work split depends on the shapes, never on which thread does it).
"""
from __future__ import annotations

import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from conftest import attention_feeds, gaussian_qkv, pack_value
from attention_cases import REF_TOL
from cache_cases import make_inputs
from dot4attn import reference as R

THREADS = 8
REPEATS = 3

# Dot4Attention shapes per route, forced by the node's `route` attribute: (B, Hq, Hkv, Sq, Sk, D, v_format).
# split_k runs over enough keys for several key splits per (batch, KV head).
ROUTE_SHAPES = {
    "prefill": (2, 4, 2, 24, 40, 64, "q8_0"),
    "decode": (2, 8, 2, 3, 300, 128, "q4_0"),
    "split_k": (1, 8, 2, 1, 4100, 128, "float"),
}


def attention_inputs(route: str, seed: int, dtype: str = "float32") -> dict:
    B, Hq, Hkv, Sq, Sk, D, vf = ROUTE_SHAPES[route]
    q, k, v = gaussian_qkv(np.random.default_rng(seed), B, Hq, Hkv, Sq, Sk, D, dtype)
    kp, ks = R.pack_k(k)
    value, vs = pack_value(v, vf)
    return attention_feeds(q, kp, ks, value, vs)


def run_concurrently(fn, args: list) -> list:
    """fn(arg) for every arg, each on its own thread, all released together; each thread runs fn REPEATS times
    and every repeat must agree with its first (a call disturbed by another would differ)."""
    barrier = threading.Barrier(len(args))

    def worker(arg):
        barrier.wait()
        outs = [fn(arg) for _ in range(REPEATS)]
        for i, o in enumerate(outs[1:], 1):
            for a, b in zip(outs[0], o):
                assert np.array_equal(a, b), f"thread with input {arg!r}: repeat {i} differs from repeat 0"
        return outs[0]

    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(worker, args))


def assert_same(serial: list, parallel: list, what: str) -> None:
    assert len(serial) == len(parallel)
    for t, (s, p) in enumerate(zip(serial, parallel)):
        for i, (a, b) in enumerate(zip(s, p)):
            assert a.shape == b.shape and a.dtype == b.dtype, f"{what}, thread {t}, output {i}"
            n = np.count_nonzero(a.view(np.uint8) != b.view(np.uint8))
            assert n == 0, f"{what}, thread {t}, output {i}: {n} bytes differ from the serial run"


def check_attention_route(sess, route: str) -> None:
    """THREADS threads, each with its own inputs, through one session: equal to the serial runs, and each serial
    run matches the reference (so the session computes the right thing, not only the same thing)."""
    feeds = [attention_inputs(route, seed) for seed in range(THREADS)]
    serial = [sess.run(None, f) for f in feeds]
    _, _, _, _, _, _, vf = ROUTE_SHAPES[route]
    for f, out in zip(feeds[:2], serial[:2]):
        want = R.attention(f["query"], f["k_payload"], f["k_scales"], f["value"], f.get("v_scales"),
                           causal=1, v_format=vf)
        assert R.nmse(out[0], want) <= REF_TOL, f"route {route}: NMSE {R.nmse(out[0], want):.2e} vs the reference"
    parallel = run_concurrently(lambda i: sess.run(None, feeds[i]), list(range(THREADS)))
    assert_same(serial, parallel, f"Dot4Attention route={route}")


GQA = dict(B=2, hq=8, hkv=2, d=64)


def gqa_sequence(sess, seed: int, steps: int = 3) -> list[np.ndarray]:
    """A prompt of 9 tokens then `steps` decode steps on this thread's own caches (present fed back as past):
    every output of every step, in order."""
    B, hq, hkv, d = GQA["B"], GQA["hq"], GQA["hkv"], GQA["d"]
    feeds = make_inputs(B, 9, hq, hkv, d, rotary=True, seed=seed)
    lens = [9, 6]
    outs = sess.run(None, dict(feeds, seqlens_k=np.array([n - 1 for n in lens], np.int32),
                               total_sequence_length=np.array(9, np.int32)))
    got = list(outs)
    past_k, past_v = outs[1], outs[2]
    for step in range(steps):
        sf = make_inputs(B, 1, hq, hkv, d, rotary=True, seed=1000 * seed + step + 1)
        sf.update(past_key=past_k, past_value=past_v, cos_cache=feeds["cos_cache"], sin_cache=feeds["sin_cache"])
        total = [n + 1 + step for n in lens]
        outs = sess.run(None, dict(sf, seqlens_k=np.array([t - 1 for t in total], np.int32),
                                   total_sequence_length=np.array(max(total), np.int32)))
        got += list(outs)
        past_k, past_v = outs[1], outs[2]
    return got


def check_gqa(sess) -> None:
    serial = [gqa_sequence(sess, seed) for seed in range(THREADS)]
    parallel = run_concurrently(lambda seed: gqa_sequence(sess, seed), list(range(THREADS)))
    assert_same(serial, parallel, "Dot4GroupQueryAttention prompt + decode")


def check_release(attention_session) -> None:
    """The library's process-wide state (ISA choice, kernels table, scratch) survives a session's release: a
    session made before keeps giving the same bits, and ones made after work too. attention_session(route) makes
    a Dot4Attention session forced onto `route` with ROUTE_SHAPES's V format."""
    feeds = attention_inputs("split_k", seed=11)
    first, second = attention_session("split_k"), attention_session("split_k")
    want = second.run(None, feeds)[0]
    assert np.array_equal(first.run(None, feeds)[0], want)
    del first
    gc.collect()
    assert np.array_equal(second.run(None, feeds)[0], want), "the surviving session changed its result"
    third = attention_session("split_k")
    assert np.array_equal(third.run(None, feeds)[0], want), "a session made after the release differs"
    del second, third
    gc.collect()
    f = attention_inputs("decode", seed=12)
    out = attention_session("decode").run(None, f)[0]
    want = R.attention(f["query"], f["k_payload"], f["k_scales"], f["value"], f["v_scales"],
                       v_format=ROUTE_SHAPES["decode"][-1])
    assert R.nmse(out, want) <= REF_TOL
