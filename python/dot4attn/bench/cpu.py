"""The CPU bench (`dot4attn bench`, `--device cpu`, the default): Dot4Attention vs ONNX Runtime's
GroupQueryAttention (share-buffer KV cache) vs numpy, in one process.

* Every case (decode Sq=1, or causal prefill Sq=Sk) is timed for every candidate **interleaved**: each repeat
  runs every candidate once (round-robin, starting candidate rotated per repeat); the reported time is the
  median over repeats. All ONNX Runtime sessions use the same fixed `intra_op_num_threads` (default: every core
  this process may run on) and are driven through io_binding with pre-made OrtValues, so no input copy, output
  allocation or dtype conversion is timed.
* Candidates:

  ========== ==========================================================================================
  d4a_f16    Dot4Attention, T=float16: query f16, packed int8 K, value float16 (``v_format="float"``)
  d4a_f32    Dot4Attention, T=float32: query f32, packed int8 K, value float32
  d4a_q8_0   Dot4Attention, T=float32: query f32, packed int8 K, value q8_0 (int8 + fp16 scales)
  d4a_q4_0   Dot4Attention, T=float32: query f32, packed int8 K, value q4_0 (nibbles + fp16 scales)
  d4a_q6_0   Dot4Attention, T=float32: query f32, packed int8 K, value q6_0 (6-bit levels + fp16 scales)
  gqa_f32    com.microsoft.GroupQueryAttention, float32 cache, past/present bound to one buffer (baseline)
  gqa_f16    com.microsoft.GroupQueryAttention, float16 cache, past/present bound to one buffer
  numpy      dot4attn.reference.float_attention on float32 (the naive baseline; small Sk only)
  cache_q8_0 Dot4GroupQueryAttention, T=float32: the packed cache of onnxruntime-genai folders (one buffer per K
             and V, rows of payload + scales), past/present bound to one buffer of Sk + 64 rows, the new rows packed
             in place by the call; V q8_0
  cache_q4_0 the same with V q4_0
  ========== ==========================================================================================

  cache_q4_0_pair is cache_q4_0 in the pair layout (K and V rows of D bytes), as q4_0 V folders hold it under
  og.Generator; cache_q6_0_pair the same with V q6_0 (ORT int8's bytes per token); cache_q8_0_tight is cache_q8_0
  in the tight layout (no 16-byte row padding: 136 instead of 160 bytes per token
  and KV head at D = 64).

  The op contract ties V's float dtype to the query dtype (``value: T``), so the "float16 V" line is T=float16.

* GQA runs in share-buffer mode: ``past_key``/``present_key`` (and the value pair) are bound to the same OrtValue
  of shape [B, Hkv, Sk, D]; ``seqlens_k = Sk - 1`` and ``total_sequence_length = Sk`` so the cache holds Sk valid
  tokens, the last Sq of them written by the call itself from its ``key``/``value`` inputs (as in real decoding).
  Before timing, GQA's output is checked against ``reference.float_attention`` on small cases, and in every
  case each candidate's output is compared with GQA float32's (NMSE, in the table and the JSON).

Printed and written by `report` (tables, bench.json, bench.png). See docs/bench.md.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import reference as ref
from ..formats import PACKED_FORMATS, cache_row_widths
from ..onnx_builders import gqa_model
from . import report

# --------------------------------------------------------------------------------------------------------------
# configuration

HEAD_SHAPES = [(32, 8, 128), (24, 4, 256)]
DECODE_SK = [512, 4096, 16384, 32768]
PREFILL_SK = [512, 2048]

CANDIDATES = {
    "d4a_f16": "Dot4Attention Q f16, K int8, V f16",
    "d4a_f32": "Dot4Attention Q f32, K int8, V f32",
    "d4a_q8_0": "Dot4Attention Q f32, K int8, V q8_0",
    "d4a_q4_0": "Dot4Attention Q f32, K int8, V q4_0",
    "d4a_q6_0": "Dot4Attention Q f32, K int8, V q6_0",
    "gqa_f32": "ORT GQA f32 share-buffer",
    "gqa_f16": "ORT GQA f16 share-buffer",
    "numpy": "numpy float_attention f32",
    "cache_q8_0": "Dot4GroupQueryAttention in-place packed cache, V q8_0",
    "cache_q4_0": "Dot4GroupQueryAttention in-place packed cache, V q4_0",
    "cache_q4_0_pair": "Dot4GroupQueryAttention in-place packed cache, V q4_0, pair layout (og.Generator's)",
    "cache_q6_0_pair": "Dot4GroupQueryAttention in-place packed cache, V q6_0, pair layout (og.Generator's)",
    "cache_q8_0_tight": "Dot4GroupQueryAttention in-place packed cache, V q8_0, tight layout (no row padding)",
}
DOT4_CANDIDATES = [c for c in CANDIDATES if c.startswith("d4a_")]
CACHE_CANDIDATES = [c for c in CANDIDATES if c.startswith("cache_")]
BASELINE = "gqa_f32"


def cache_candidate(name: str) -> tuple[str, str]:
    """(V format, cache layout) of a cache_* candidate: cache_q8_0, cache_q4_0 (rows), cache_q4_0_pair,
    cache_q6_0_pair, cache_q8_0_tight."""
    body = name[len("cache_"):]
    for layout in ("pair", "tight"):
        if body.endswith(f"_{layout}"):
            return body[:-len(layout) - 1], layout
    return body, "rows"


# --------------------------------------------------------------------------------------------------------------
# threads

# How sessions get their intra-op threads. "global": one process-wide ONNX Runtime pool of `threads` threads shared
# by every session (set once, before any session is created); "per-session": each session its own pool, spinning off.
# Interleaving sessions that each own a spinning pool makes them fight over the cores (measured here: GQA f32
# decode at Sk=4096 went from 1.9 ms alone to 6 ms interleaved with one other session), so "global" is the default.
_POOL = {"mode": None, "threads": None, "global_threads": None}


def setup_thread_pool(threads: int, mode: str = "global") -> str:
    """Chooses how sessions made by this module get threads; returns the mode in effect.

    The process-wide pool can be sized once; asking for "global" with another thread count later (or after
    something else created it) falls back to "per-session".
    """
    if mode == "global" and _POOL["global_threads"] is None:
        try:
            from onnxruntime.capi._pybind_state import set_global_thread_pool_sizes

            set_global_thread_pool_sizes(threads, 1)
            _POOL["global_threads"] = threads
        except Exception:  # noqa: BLE001 - already created elsewhere, or an onnxruntime without it
            _POOL["global_threads"] = -1
    if mode == "global" and _POOL["global_threads"] != threads:
        mode = "per-session"
    _POOL.update(mode=mode, threads=threads)
    return mode


def _session_options(threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if _POOL["mode"] == "global" and _POOL["threads"] == threads:
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if _POOL["mode"] != "per-session-spin":
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return so


class _BlasThreads:
    """Pins numpy's OpenBLAS to n threads while active (its idle workers spin and would slow the next candidate)."""

    _NAMES = [("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
              ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
              ("openblas_set_num_threads", "openblas_get_num_threads")]

    def __init__(self, n: int):
        self.n, self.prev, self.fns, self.effective = n, None, None, None
        try:
            import ctypes

            libs = sorted({ln.split()[-1] for ln in Path("/proc/self/maps").read_text().splitlines()
                           if "openblas" in ln.lower() and ln.split()[-1].startswith("/")})
            for lib in libs:
                dll = ctypes.CDLL(lib)
                for set_name, get_name in self._NAMES:
                    if hasattr(dll, set_name) and hasattr(dll, get_name):
                        self.fns = (getattr(dll, set_name), getattr(dll, get_name))
                        break
                if self.fns:
                    break
        except Exception:  # noqa: BLE001 - not Linux, or no OpenBLAS: leave BLAS alone
            self.fns = None

    def __enter__(self):
        if self.fns and self.n > 0:
            self.prev = int(self.fns[1]())
            self.fns[0](self.n)
            self.effective = int(self.fns[1]())
        return self

    def __exit__(self, *exc):
        if self.fns and self.prev is not None:
            self.fns[0](self.prev)
        return False


def _ov(a: np.ndarray):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))

# --------------------------------------------------------------------------------------------------------------
# the candidates' runners


def _bind_shared_cache(sess, vals: dict, cache_k, cache_v, out):
    """An io_binding of a GroupQueryAttention-style node: `vals` as inputs, `out` as output, and each cache OrtValue
    bound as both past_* input and present_* output (the shared in-place buffer)."""
    binding = sess.io_binding()
    for name, val in vals.items():
        binding.bind_ortvalue_input(name, val)
    binding.bind_ortvalue_output("output", out)
    for part, cache in (("key", cache_k), ("value", cache_v)):
        binding.bind_ortvalue_input(f"past_{part}", cache)
        binding.bind_ortvalue_output(f"present_{part}", cache)
    return binding


class GQARunner:
    """GQA in share-buffer mode: past_* and present_* bound to one cache OrtValue [B, Hkv, Sk, D].

    The cache holds keys 0 .. Sk-Sq-1 beforehand; each call appends keys Sk-Sq .. Sk-1 (from its key/value
    inputs) in place and attends over all Sk (causal, bottom-right aligned, like Dot4Attention's causal=1).
    Every call rewrites the same slots with the same values, so repeats are identical.
    """

    def __init__(self, q, k, v, dtype, threads: int):
        import onnxruntime as ort

        B, Hq, Sq, D = q.shape
        Hkv, Sk = k.shape[1], k.shape[2]
        self.shape = (B, Hq, Sq, D)
        self.sess = ort.InferenceSession(gqa_model(Hq, Hkv, dtype).SerializeToString(), _session_options(threads),
                                         providers=["CPUExecutionProvider"])
        cache_k = np.zeros((B, Hkv, Sk, D), dtype)
        cache_v = np.zeros((B, Hkv, Sk, D), dtype)
        cache_k[:, :, :Sk - Sq] = k[:, :, :Sk - Sq]
        cache_v[:, :, :Sk - Sq] = v[:, :, :Sk - Sq]
        self.cache_k, self.cache_v = _ov(cache_k), _ov(cache_v)
        del cache_k, cache_v
        bsh = lambda x: x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1).astype(dtype)  # noqa: E731
        self.vals = {
            "query": _ov(bsh(q)), "key": _ov(bsh(k[:, :, Sk - Sq:])), "value": _ov(bsh(v[:, :, Sk - Sq:])),
            "seqlens_k": _ov(np.full((B,), Sk - 1, np.int32)),
            "total_sequence_length": _ov(np.array(Sk, np.int32)),
        }
        self.out = _ov(np.zeros((B, Sq, Hq * D), dtype))
        self.binding = _bind_shared_cache(self.sess, self.vals, self.cache_k, self.cache_v, self.out)
        self.kv_bytes = 2 * B * Hkv * Sk * D * np.dtype(dtype).itemsize

    def __call__(self):
        self.sess.run_with_iobinding(self.binding)

    def check_shared(self) -> bool:
        """True when ORT really wrote present_* into the bound cache (share-buffer mode)."""
        outs = self.binding.get_outputs()
        return outs[1].data_ptr() == self.cache_k.data_ptr() and outs[2].data_ptr() == self.cache_v.data_ptr()

    def output(self) -> np.ndarray:
        B, Hq, Sq, D = self.shape
        return self.out.numpy().reshape(B, Sq, Hq, D).transpose(0, 2, 1, 3).astype(np.float32)


class Dot4Runner:
    """Dot4Attention (route auto, causal=1) through io_binding with pre-made OrtValues."""

    def __init__(self, q, k_payload, k_scales, value, v_scales, v_format: str, threads: int):
        import onnxruntime as ort

        from .. import register
        from ..onnx_builders import attention_model

        so = _session_options(threads)
        register(so)
        self.sess = ort.InferenceSession(attention_model(q.dtype, v_format).SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])
        self.vals = {"query": _ov(q), "k_payload": _ov(k_payload), "k_scales": _ov(k_scales), "value": _ov(value)}
        if v_scales is not None:
            self.vals["v_scales"] = _ov(v_scales)
        self.out = _ov(np.zeros(q.shape, q.dtype))
        self.binding = self.sess.io_binding()
        for name, val in self.vals.items():
            self.binding.bind_ortvalue_input(name, val)
        self.binding.bind_ortvalue_output("output", self.out)
        self.kv_bytes = sum(a.nbytes for a in (k_payload, k_scales, value) + ((v_scales,) if v_scales is not None
                                                                             else ()))

    def __call__(self):
        self.sess.run_with_iobinding(self.binding)

    def output(self) -> np.ndarray:
        return self.out.numpy().astype(np.float32)


class CacheRunner:
    """Dot4GroupQueryAttention on a shared in-place cache of Sk + 64 rows (past/present bound to one buffer, as
    onnxruntime-genai runs it): rows 0 .. Sk-Sq-1 hold the packed past, each call packs keys Sk-Sq .. Sk-1 from its
    key/value inputs into their rows and attends over the Sk valid rows only (seqlens_k = Sk - 1)."""

    def __init__(self, q, k, v, v_format: str, threads: int, cache_layout: str = "rows"):
        import onnxruntime as ort

        from .. import register
        from ..onnx_builders import cache_attention_model

        B, Hq, Sq, D = q.shape
        Hkv, Sk = k.shape[1], k.shape[2]
        self.shape = (B, Hq, Sq, D)
        so = _session_options(threads)
        register(so)
        model = cache_attention_model(np.float32, num_heads=Hq, kv_num_heads=Hkv, v_format=v_format,
                                      cache_layout=cache_layout)
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        rows = Sk + 64
        k_row, v_row = cache_row_widths(D, v_format, cache_layout)
        ck = np.zeros((B, Hkv, rows, k_row), np.uint8)
        cv = np.zeros((B, Hkv, rows, v_row), np.uint8)
        if cache_layout == "pair":
            ck[:, :, :Sk - Sq], cv[:, :, :Sk - Sq] = ref.pack_cache_pair(k[:, :, :Sk - Sq], v[:, :, :Sk - Sq],
                                                                         v_format)
        else:
            ck[:, :, :Sk - Sq] = ref.pack_cache_rows(k[:, :, :Sk - Sq], "q8_0", cache_layout)
            cv[:, :, :Sk - Sq] = ref.pack_cache_rows(v[:, :, :Sk - Sq], v_format, cache_layout)
            if cache_layout == "tight":  # the op's tensor holds the rows' parts in two runs
                ck, cv = ref.tight_tensor(ck, D, "q8_0"), ref.tight_tensor(cv, D, v_format)
        self.cache_k, self.cache_v = _ov(ck), _ov(cv)
        del ck, cv
        bsh = lambda x: x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1).astype(np.float32)  # noqa: E731
        self.vals = {"query": _ov(bsh(q)), "key": _ov(bsh(k[:, :, Sk - Sq:])), "value": _ov(bsh(v[:, :, Sk - Sq:])),
                     "seqlens_k": _ov(np.full((B,), Sk - 1, np.int32)),
                     "total_sequence_length": _ov(np.array(Sk, np.int32))}
        self.out = _ov(np.zeros((B, Sq, Hq * D), np.float32))
        self.binding = _bind_shared_cache(self.sess, self.vals, self.cache_k, self.cache_v, self.out)
        self.kv_bytes = B * Hkv * Sk * (k_row + v_row)

    def __call__(self):
        self.sess.run_with_iobinding(self.binding)

    def output(self) -> np.ndarray:
        # a copy: OrtValue.numpy() of a CPU value made from a numpy array views that array's memory without holding
        # it, so a view outlives this runner only as garbage
        B, Hq, Sq, D = self.shape
        return self.out.numpy().reshape(B, Sq, Hq, D).transpose(0, 2, 1, 3).astype(np.float32)


class NumpyRunner:
    def __init__(self, q, k, v):
        self.q, self.k, self.v = q, k, v
        self.kv_bytes = k.nbytes + v.nbytes
        self._out = None

    def __call__(self):
        self._out = ref.float_attention(self.q, self.k, self.v, causal=1)

    def output(self) -> np.ndarray:
        if self._out is None:
            self()
        return self._out

# --------------------------------------------------------------------------------------------------------------
# data: float K/V and their packed forms per head shape, made once at the largest Sk and sliced per case


@dataclass
class HeadData:
    hq: int
    hkv: int
    d: int
    s_max: int
    batch: int
    seed: int
    k: np.ndarray = field(init=False)
    v: np.ndarray = field(init=False)
    packed: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        rng = np.random.default_rng([self.seed, self.hq, self.hkv, self.d])
        shape = (self.batch, self.hkv, self.s_max, self.d)
        self.k = rng.standard_normal(shape, np.float32)
        self.v = rng.standard_normal(shape, np.float32)
        self.rng = rng

    def pack(self, need: set[str]) -> None:
        if any(c.startswith("d4a_") for c in need) and "k" not in self.packed:
            self.packed["k"] = ref.pack_k(self.k)
        for fmt in PACKED_FORMATS:
            if f"d4a_{fmt}" in need and fmt not in self.packed:
                self.packed[fmt] = ref.pack_v(self.v, fmt)
        if "d4a_f16" in need or "gqa_f16" in need:
            if "v16" not in self.packed:
                self.packed["v16"] = self.v.astype(np.float16)
                self.packed["k16"] = self.k.astype(np.float16)

    @staticmethod
    def cut(a: np.ndarray, sk: int) -> np.ndarray:
        return np.ascontiguousarray(a[:, :, :sk])

    def query(self, sq: int) -> np.ndarray:
        return self.rng.standard_normal((self.batch, self.hq, sq, self.d), np.float32)


def _make_runner(name: str, hd: HeadData, q: np.ndarray, sk: int, threads: int):
    cut = HeadData.cut
    if name == "gqa_f32":
        return GQARunner(q, cut(hd.k, sk), cut(hd.v, sk), np.float32, threads)
    if name == "gqa_f16":
        return GQARunner(q.astype(np.float16), cut(hd.packed["k16"], sk), cut(hd.packed["v16"], sk), np.float16,
                         threads)
    if name == "numpy":
        return NumpyRunner(q, cut(hd.k, sk), cut(hd.v, sk))
    if name in CACHE_CANDIDATES:
        fmt, layout = cache_candidate(name)
        return CacheRunner(q, cut(hd.k, sk), cut(hd.v, sk), fmt, threads, layout)
    kp, ks = (cut(a, sk) for a in hd.packed["k"])
    if name == "d4a_f16":
        return Dot4Runner(q.astype(np.float16), kp, ks, cut(hd.packed["v16"], sk), None, "float", threads)
    if name == "d4a_f32":
        return Dot4Runner(q, kp, ks, cut(hd.v, sk), None, "float", threads)
    fmt = name[len("d4a_"):]
    vp, vs = (cut(a, sk) for a in hd.packed[fmt])
    return Dot4Runner(q, kp, ks, vp, vs, fmt, threads)

# --------------------------------------------------------------------------------------------------------------
# verification


def verify_gqa(threads: int) -> list[dict]:
    """GQA share-buffer vs reference.float_attention on small decode and prefill cases, float32 and float16."""
    out = []
    rng = np.random.default_rng(1234)
    for (hq, hkv, d, sq, sk) in [(32, 8, 128, 1, 300), (24, 4, 256, 1, 77), (8, 2, 64, 5, 40), (32, 8, 128, 64, 64)]:
        q = rng.standard_normal((1, hq, sq, d), np.float32)
        k = rng.standard_normal((1, hkv, sk, d), np.float32)
        v = rng.standard_normal((1, hkv, sk, d), np.float32)
        expect = ref.float_attention(q, k, v, causal=1)
        for dtype, tol in ((np.float32, 1e-9), (np.float16, 1e-5)):
            runner = GQARunner(q.astype(dtype), k.astype(dtype), v.astype(dtype), dtype, threads)
            runner()
            got = runner.output()
            cache_ok = bool(np.array_equal(runner.cache_k.numpy()[:, :, sk - sq:], k[:, :, sk - sq:].astype(dtype)))
            err = ref.nmse(got, expect)
            out.append({"Hq": hq, "Hkv": hkv, "D": d, "Sq": sq, "Sk": sk, "dtype": np.dtype(dtype).name,
                        "nmse_vs_float_attention": err, "tol": tol, "share_buffer": runner.check_shared(),
                        "cache_appended": cache_ok, "ok": bool(err <= tol and runner.check_shared() and cache_ok)})
    return out


def verify_dot4(threads: int) -> list[dict]:
    """Dot4Attention (each bench variant) vs reference.attention on small decode / split_k / prefill cases."""
    out = []
    rng = np.random.default_rng(4321)
    for (hq, hkv, d, sq, sk) in [(32, 8, 128, 1, 300), (32, 8, 128, 1, 4096), (24, 4, 256, 1, 2500),
                                 (8, 2, 64, 64, 64)]:
        q = rng.standard_normal((1, hq, sq, d), np.float32)
        k = rng.standard_normal((1, hkv, sk, d), np.float32)
        v = rng.standard_normal((1, hkv, sk, d), np.float32)
        hd = HeadData.__new__(HeadData)
        hd.k, hd.v, hd.packed = k, v, {}
        HeadData.pack(hd, set(DOT4_CANDIDATES))
        for name in DOT4_CANDIDATES + CACHE_CANDIDATES:
            r = _make_runner(name, hd, q, sk, threads)
            r()
            got = r.output()
            qq = q.astype(np.float16) if name == "d4a_f16" else q
            if name in CACHE_CANDIDATES:  # the same math as d4a_<fmt>: the call packs its own rows like PackK/PackV
                fmt = cache_candidate(name)[0]
                vv, vs = hd.packed[fmt]
            elif name in ("d4a_f16", "d4a_f32"):
                vv, vs, fmt = (hd.packed["v16"] if name == "d4a_f16" else v), None, "float"
            else:
                fmt = name[len("d4a_"):]
                vv, vs = hd.packed[fmt]
            expect = ref.attention(qq, *hd.packed["k"], vv, vs, v_format=fmt).astype(np.float32)
            err = ref.nmse(got, expect)
            tol = 1e-5 if name == "d4a_f16" else 1e-6
            out.append({"candidate": name, "Hq": hq, "Hkv": hkv, "D": d, "Sq": sq, "Sk": sk,
                        "route": ref.choose_route(sq, sk), "nmse_vs_reference": err, "tol": tol, "ok": err <= tol})
    return out

# --------------------------------------------------------------------------------------------------------------
# timing


def time_case(runners: dict[str, Callable], repeats: int, warmup: int, case_seconds: float,
              progress: Callable[[int, int], None] | None = None) -> dict[str, list[float]]:
    """Interleaved timing: each repeat runs every candidate once (start rotated); seconds per call."""
    names = list(runners)
    est = {}
    for name in names:
        for _ in range(max(warmup, 1)):
            t0 = time.perf_counter()
            runners[name]()
            est[name] = time.perf_counter() - t0
    if repeats <= 0:
        per_round = sum(est.values())
        repeats = int(min(200, max(5, case_seconds / max(per_round, 1e-9))))
    times = {n: [] for n in names}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                t0 = time.perf_counter()
                runners[name]()
                times[name].append(time.perf_counter() - t0)
            if progress:
                progress(r + 1, repeats)
    finally:
        if gc_was:
            gc.enable()
    return times


def _case_list(args) -> list[dict]:
    if args.quick:
        heads = args.heads or [(32, 8, 128)]
        dec = args.decode_sk if args.decode_sk is not None else [4096, 16384]
        pre = args.prefill_sk if args.prefill_sk is not None else [512]
    else:
        heads = args.heads or HEAD_SHAPES
        dec = args.decode_sk if args.decode_sk is not None else DECODE_SK
        pre = args.prefill_sk if args.prefill_sk is not None else PREFILL_SK
    cases = []
    for (hq, hkv, d) in heads:
        for sk in dec:
            cases.append({"kind": "decode", "B": args.batch, "Hq": hq, "Hkv": hkv, "D": d, "Sq": 1, "Sk": sk})
        for sk in pre:
            cases.append({"kind": "prefill", "B": args.batch, "Hq": hq, "Hkv": hkv, "D": d, "Sq": sk, "Sk": sk})
    return cases


# --------------------------------------------------------------------------------------------------------------
# speed goals

# The speed goals: (candidate, speedup vs gqa_f32 measured in the same run) at decode (32, 8, 128), Sk = 16384.
TARGETS = [("d4a_f16", 4.0), ("d4a_q4_0", 6.0)]
TARGET_CASE = ("decode", 32, 8, 128, 16384)
# The in-place packed cache (genai's layout, strided rows, the call's own append) costs at most 5 % over
# Dot4Attention on dense packed tensors of the same V format, same case, same run.
CACHE_TARGETS = [("cache_q8_0", "d4a_q8_0", 1.05), ("cache_q4_0", "d4a_q4_0", 1.05)]


def _evaluate_targets(results: list[dict]) -> list[dict]:
    kind, hq, hkv, d, sk = TARGET_CASE

    def median_ms(cand):
        hit = [r for r in results if r["candidate"] == cand and r["case"]["kind"] == kind and r["case"]["Hq"] == hq
               and r["case"]["Hkv"] == hkv and r["case"]["D"] == d and r["case"]["Sk"] == sk and r["case"]["B"] == 1]
        return hit[0].get("median_ms") if hit else None

    out = []
    for cand, base, limit in CACHE_TARGETS:
        a, b = median_ms(cand), median_ms(base)
        ratio = None if a is None or b is None else a / b
        out.append({"case": f"decode ({hq},{hkv},{d}) Sk={sk}", "candidate": cand, "baseline": base,
                    "max_time_ratio": limit, "measured_time_ratio": ratio,
                    "met": None if ratio is None else bool(ratio <= limit)})
    for cand, need in TARGETS:
        hit = [r for r in results if r["candidate"] == cand and r["case"]["kind"] == kind and r["case"]["Hq"] == hq
               and r["case"]["Hkv"] == hkv and r["case"]["D"] == d and r["case"]["Sk"] == sk
               and r["case"]["B"] == 1]
        sp = hit[0].get("speedup_vs_gqa_f32") if hit else None
        out.append({"case": f"decode ({hq},{hkv},{d}) Sk={sk}", "candidate": cand, "required_speedup": need,
                    "measured_speedup": sp, "met": None if sp is None else bool(sp >= need)})
    return out


# --------------------------------------------------------------------------------------------------------------
# the run

METHOD = ("one process; per case every candidate is warmed up, then each repeat runs every candidate once "
          "(round-robin, start rotated); medians of repeats; ORT sessions on one intra-op pool of `threads` threads "
          "(thread_pool), io_binding with pre-made OrtValues (no copies timed); GQA with past/present bound to one "
          "buffer, seqlens_k=Sk-1, total_sequence_length=Sk")


def run_cpu_bench(args) -> int:
    """The CPU bench described by `args` (dot4attn.bench.add_arguments); returns the process exit code."""
    threads = args.threads if args.threads and args.threads > 0 else report.default_threads()
    with _BlasThreads(getattr(args, "numpy_threads", 1)) as blas:
        return _run(args, threads, blas)


def _run(args, threads: int, blas: _BlasThreads) -> int:
    con = report.console()
    t_start = time.perf_counter()
    pool = setup_thread_pool(threads, getattr(args, "thread_pool", "global"))
    wanted = [c.strip() for c in args.candidates.split(",") if c.strip()]
    library = report.library_status()
    refusal = _refusal(wanted, library)
    if refusal:
        report.echo(con, refusal)
        return 2
    case_seconds = args.case_seconds or (15.0 if args.quick else 20.0)
    cases = _case_list(args)
    rep = _new_report(args, threads, pool, blas, wanted, report.machine_facts(library))
    _print_header(con, rep, library, len(cases), args.repeats, case_seconds)
    if not args.no_verify and not _verify(con, rep, wanted, threads, library[0]):
        return 1
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rep["results"] = _time_cases(con, args, cases, wanted, threads, case_seconds, rep, out_dir)
    return _finish(con, args, rep, t_start, out_dir)


def _refusal(wanted: list[str], library: tuple[bool, str, dict]) -> str | None:
    """Why the bench cannot run these candidates, or None."""
    unknown = [c for c in wanted if c not in CANDIDATES]
    if unknown:
        return f"[red]unknown candidate(s) {unknown}; choose from {list(CANDIDATES)}[/]"
    lib_ok, lib_where, _ = library
    if any(c in DOT4_CANDIDATES + CACHE_CANDIDATES for c in wanted) and not lib_ok:
        return (f"[red]dot4attn bench: the op library is not available: {lib_where}[/]\n"
                "Build it (`pip install .`, or cmake and DOT4ATTN_LIBRARY=...), or pass "
                "--candidates gqa_f32,gqa_f16,numpy to bench the baselines only.")
    return None


def _new_report(args, threads: int, pool: str, blas: _BlasThreads, wanted: list[str], machine: dict) -> dict:
    """bench.json before any check or timing (written again after every case)."""
    return {
        "schema": "dot4attn-bench/1", "device": "cpu", "quick": bool(args.quick), "threads": threads,
        "thread_pool": pool, "numpy_blas_threads": blas.effective,
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
        "candidates": {c: CANDIDATES[c] for c in wanted}, "baseline": BASELINE, "method": METHOD,
        "gqa_verification": [], "dot4_verification": [], "results": [], "targets": [],
    }


def _print_header(con, rep: dict, library: tuple[bool, str, dict], n_cases: int, repeats: int,
                  case_seconds: float) -> None:
    blas, load = rep["numpy_blas_threads"], rep["machine"]["loadavg_before"]
    report.echo(con, f"[bold]dot4attn bench[/] — CPU, {rep['threads']} intra-op threads ({rep['thread_pool']} pool), "
                     f"numpy BLAS threads {blas if blas is not None else 'unchanged'}; "
                     f"{report.machine_line(rep['machine'])}")
    if load and load[0] > 1.0:
        report.echo(con, f"[yellow]note: load average {load[0]:.2f} before the bench — other work on this "
                         "machine adds noise (interleaving keeps the comparison fair, not the absolute times)[/]")
    lib_ok, lib_where, lib_info = library
    if lib_ok:
        report.echo(con, f"library {lib_where}; ISA {lib_info.get('cpu_isa', lib_info)}")
    report.echo(con, f"{n_cases} cases x {len(rep['candidates'])} candidates; interleaved, median of repeats "
                     f"({'fixed ' + str(repeats) if repeats else f'auto, ~{case_seconds:.0f} s per case'})")


def _verdict(bad: list[dict]) -> str:
    return "[green]OK[/]" if not bad else f"[red]FAILED {bad}[/]"


def _verify(con, rep: dict, wanted: list[str], threads: int, lib_ok: bool) -> bool:
    """Correctness first: an honest baseline, and the op measured is the op specified. False when a check fails."""
    if any(c.startswith("gqa_") for c in wanted):
        checks = rep["gqa_verification"] = verify_gqa(threads)
        bad = [v for v in checks if not v["ok"]]
        worst = {dt: max(v["nmse_vs_float_attention"] for v in checks if v["dtype"] == dt)
                 for dt in ("float32", "float16")}
        report.echo(con, f"GQA share-buffer vs reference.float_attention: worst NMSE f32 {worst['float32']:.1e}, "
                         f"f16 {worst['float16']:.1e}; past/present share one buffer: "
                         f"{all(v['share_buffer'] for v in checks)} -> " + _verdict(bad))
        if bad:
            return False
    if lib_ok and any(c in DOT4_CANDIDATES + CACHE_CANDIDATES for c in wanted):
        checks = rep["dot4_verification"] = verify_dot4(threads)
        bad = [v for v in checks if not v["ok"]]
        worst = max(v["nmse_vs_reference"] for v in checks)
        report.echo(con, f"Dot4Attention vs reference.attention (decode/split_k/prefill, 4 V variants): worst NMSE "
                         f"{worst:.1e} -> " + _verdict(bad))
        if bad:
            return False
    return True


class _Progress:
    """rich progress bars (one for all cases, one for the repeats of the case being timed), or nothing."""

    def __init__(self, con, n_cases: int):
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bars = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=con,
                                 transient=True)
        except ImportError:  # pragma: no cover
            self.bars = None
        self.n_cases, self.overall = n_cases, None

    def __enter__(self):
        if self.bars is not None:
            self.bars.__enter__()
            self.overall = self.bars.add_task("cases", total=self.n_cases)
        return self

    def __exit__(self, *exc):
        return self.bars.__exit__(*exc) if self.bars is not None else False

    def status(self, text: str) -> None:
        if self.bars is not None:
            self.bars.update(self.overall, description=text)

    def case_done(self) -> None:
        if self.bars is not None:
            self.bars.advance(self.overall)

    @contextlib.contextmanager
    def repeats(self, label: str):
        """Yields a (done, total) callback for time_case."""
        task = self.bars.add_task(f"  {label}", total=None) if self.bars is not None else None

        def update(done: int, total: int) -> None:
            if task is not None:
                self.bars.update(task, completed=done, total=total)

        try:
            yield update
        finally:
            if task is not None:
                self.bars.remove_task(task)


def _time_cases(con, args, cases: list[dict], wanted: list[str], threads: int, case_seconds: float, rep: dict,
                out_dir: Path) -> list[dict]:
    """Times every case, one head shape's K/V (made and packed once, at its largest Sk) at a time."""
    results: list[dict] = []
    heads_order = list(dict.fromkeys((c["Hq"], c["Hkv"], c["D"]) for c in cases))
    with _Progress(con, len(cases)) as progress:
        for heads in heads_order:
            hcases = [c for c in cases if (c["Hq"], c["Hkv"], c["D"]) == heads]
            s_max = max(c["Sk"] for c in hcases)
            progress.status(f"making and packing K/V {heads} x {s_max}")
            hd = HeadData(*heads, s_max=s_max, batch=args.batch, seed=args.seed)
            hd.pack(set(wanted))
            for case in hcases:
                results += _time_case_rows(case, hd, args, wanted, threads, case_seconds, progress)
                gc.collect()
                progress.case_done()
                # partial JSON after every case, so a long run that is cut short still leaves its numbers
                rep["results"] = results
                report.write_json(out_dir / "bench.json", rep)
            del hd
            gc.collect()
    return results


def _time_case_rows(case: dict, hd: HeadData, args, wanted: list[str], threads: int, case_seconds: float,
                    progress: _Progress) -> list[dict]:
    """One case: a runner per candidate (numpy only up to its Sk limits), timed interleaved; its result rows."""
    label = report.case_label(case)
    numpy_max = args.numpy_max_sk if case["kind"] == "decode" else args.numpy_max_prefill
    names = [n for n in wanted if n != "numpy" or case["Sk"] <= numpy_max]
    progress.status(f"setting up {label}")
    q = hd.query(case["Sq"])
    runners = {n: _make_runner(n, hd, q, case["Sk"], threads) for n in names}
    progress.status(f"timing {label}")
    with progress.repeats(label) as update:
        times = time_case(runners, args.repeats, args.warmup, case_seconds, update)
    return _result_rows(case, runners, times)


def _result_rows(case: dict, runners: dict, times: dict[str, list[float]]) -> list[dict]:
    load = report.loadavg()
    base_out = runners[BASELINE].output() if BASELINE in runners else None
    base_med = float(np.median(times[BASELINE])) if BASELINE in times else None
    rows = []
    for n, runner in runners.items():
        arr = np.array(times[n]) * 1e3
        med = float(np.median(arr))
        row = {
            "case": dict(case), "candidate": n, "label": CANDIDATES[n],
            "median_ms": med, "min_ms": float(arr.min()), "p25_ms": float(np.percentile(arr, 25)),
            "p75_ms": float(np.percentile(arr, 75)), "repeats": int(arr.size), "kv_bytes": int(runner.kv_bytes),
            "speedup_vs_gqa_f32": None if base_med is None else (base_med * 1e3) / med,
            "nmse_vs_gqa_f32": None, "loadavg_1min": load[0] if load else None,
            "kv_gb_per_s": runner.kv_bytes / (med * 1e-3) / 1e9,
        }
        if n.startswith("d4a_"):
            row["route"] = ref.choose_route(case["Sq"], case["Sk"])
        if base_out is not None and n != BASELINE:
            row["nmse_vs_gqa_f32"] = ref.nmse(runner.output(), base_out)
        rows.append(row)
    return rows


def _finish(con, args, rep: dict, t_start: float, out_dir: Path) -> int:
    """Tables, targets, bench.json and bench.png; exit 1 on a missed target with --require-targets."""
    results = rep["results"]
    rep["targets"] = _evaluate_targets(results)
    rep["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    rep["machine"]["loadavg_after"] = report.loadavg()
    report.print_table(con, results, rep["threads"], report.machine_line(rep["machine"]))
    report.print_summary(con, results, list(CANDIDATES), BASELINE)
    report.print_targets(con, rep["targets"])
    json_path = out_dir / "bench.json"
    report.write_json(json_path, rep)
    written = [str(json_path)]
    if not args.no_plot and results:
        try:
            report.plot_cpu(results, out_dir / "bench.png", rep["threads"], list(CANDIDATES))
            written.append(str(out_dir / "bench.png"))
        except Exception as exc:  # noqa: BLE001 - a plot failure must not lose the numbers
            report.echo(con, f"[yellow]plot failed: {exc}[/]")
    report.echo(con, f"wrote {', '.join(written)} in {rep['elapsed_s']:.0f} s")
    if args.require_targets and any(t["met"] is False for t in rep["targets"]):
        return 1
    return 0
