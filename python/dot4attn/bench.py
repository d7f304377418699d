"""`dot4attn bench`: Dot4Attention vs ONNX Runtime's GroupQueryAttention (share-buffer KV cache) vs numpy.

CPU (`--device cpu`, the default), in one process:

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
  gqa_f32    com.microsoft.GroupQueryAttention, float32 cache, past/present bound to one buffer (baseline)
  gqa_f16    com.microsoft.GroupQueryAttention, float16 cache, past/present bound to one buffer
  numpy      dot4attn.reference.float_attention on float32 (the naive baseline; small Sk only)
  ========== ==========================================================================================

  The op contract ties V's float dtype to the query dtype (``value: T``), so the "float16 V" line is T=float16.

* GQA runs in share-buffer mode: ``past_key``/``present_key`` (and the value pair) are bound to the same OrtValue
  of shape [B, Hkv, Sk, D]; ``seqlens_k = Sk - 1`` and ``total_sequence_length = Sk`` so the cache holds Sk valid
  tokens, the last Sq of them written by the call itself from its ``key``/``value`` inputs (as in real decoding).
  Before timing, GQA's output is checked against ``reference.float_attention`` on small cases, and in every
  case each candidate's output is compared with GQA float32's (NMSE, in the table and the JSON).

`--device cuda` hands over to ``dot4attn.bench_cuda.run_cuda_bench(args)`` (imported lazily). See docs/bench.md.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import __version__
from . import reference as ref

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
    "gqa_f32": "ORT GQA f32 share-buffer",
    "gqa_f16": "ORT GQA f16 share-buffer",
    "numpy": "numpy float_attention f32",
}
DOT4_CANDIDATES = [c for c in CANDIDATES if c.startswith("d4a_")]
BASELINE = "gqa_f32"


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def _heads_list(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.replace(" ", "").split(";"):
        if item:
            parts = [int(x) for x in item.replace("x", ",").split(",")]
            if len(parts) != 3:
                raise argparse.ArgumentTypeError(f"head shape must be Hq,Hkv,D, got {item!r}")
            out.append(tuple(parts))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `dot4attn bench` (the CLI calls this on its `bench` sub-parser)."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: this module; cuda: dot4attn.bench_cuda (default: cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="a ~1-2 minute subset: decode (32,8,128) at Sk 4096 and 16384, prefill (32,8,128) Sk 512")
    parser.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png (default ./bench-out)")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra_op_num_threads of every session (default 0: all cores this process may use)")
    parser.add_argument("--thread-pool", choices=["global", "per-session", "per-session-spin"], default="global",
                        help="global (default): one ONNX Runtime intra-op pool of --threads threads shared by all "
                             "sessions; per-session: a pool per session, spinning off; per-session-spin: ORT's "
                             "default (a spinning pool per session; interleaved sessions then slow each other)")
    parser.add_argument("--numpy-threads", type=int, default=1,
                        help="OpenBLAS threads for the numpy baseline during the bench (default 1; 0: leave as is)")
    parser.add_argument("--heads", type=_heads_list, default=None, metavar="HQ,HKV,D[;...]",
                        help="head shapes, e.g. '32,8,128;24,4,256' (default: those two)")
    parser.add_argument("--decode-sk", type=_int_list, default=None, metavar="SK[,SK...]",
                        help="decode key lengths (default 512,4096,16384,32768; quick: 4096,16384)")
    parser.add_argument("--prefill-sk", type=_int_list, default=None, metavar="SK[,SK...]",
                        help="prefill lengths Sq = Sk (default 512,2048; quick: 512); '' for none")
    parser.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES),
                        help=f"comma-separated subset of {','.join(CANDIDATES)}")
    parser.add_argument("--repeats", type=int, default=0,
                        help="timed repeats per case (default 0: as many as fit --case-seconds, within [5, 200])")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs of each candidate per case (default 2)")
    parser.add_argument("--case-seconds", type=float, default=0.0,
                        help="time budget per case for auto repeats (default 15 s quick, 20 s full)")
    parser.add_argument("--numpy-max-sk", type=int, default=4096,
                        help="numpy baseline only for decode with Sk <= this (default 4096)")
    parser.add_argument("--numpy-max-prefill", type=int, default=512,
                        help="numpy baseline only for prefill with Sk <= this (default 512)")
    parser.add_argument("--no-verify", action="store_true", help="skip the GQA / Dot4Attention correctness checks")
    parser.add_argument("--no-plot", action="store_true", help="do not write bench.png")
    parser.add_argument("--require-targets", action="store_true",
                        help="exit 1 when a target at (32,8,128) Sk=16384 decode is measured and missed")
    parser.add_argument("--seed", type=int, default=0)


# --------------------------------------------------------------------------------------------------------------
# small helpers


def _console():
    try:
        from rich.console import Console

        if sys.stdout.isatty():
            return Console(highlight=False)
        return Console(highlight=False, width=150)  # logs and pipes: keep table rows on one line
    except ImportError:  # pragma: no cover - rich is a dependency
        return None


def _print(console, *args, **kw):
    if console is not None:
        console.print(*args, **kw)
    else:
        print(*(str(a) for a in args))


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512bw",
                                                         "f16c", "fma", "avx512_bf16", "amx_int8"})
    except OSError:
        pass
    return []


# How sessions get their intra-op threads. "global": one process-wide ONNX Runtime pool of `threads` threads shared
# by every session (set once, before the first session); "per-session": each session its own pool, spinning off.
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
# models


def gqa_model(hq: int, hkv: int, dtype, int8_cache: bool = False):
    """One com.microsoft.GroupQueryAttention node (no rotary) with a BNSH KV cache of dtype `dtype`.

    int8_cache: the cache is int8 with one float32 scale for K and V (`k_quant_type = v_quant_type =
    "PER_TENSOR"`, `kv_cache_bit_width = 8`, input `kv_scale` fed to both k_scale and v_scale: ORT's XQA decode
    kernel wants them to be one tensor). CUDA EP only (onnxruntime >= 1.23)."""
    from onnx import TensorProto, helper

    t = TensorProto.FLOAT if np.dtype(dtype) == np.float32 else TensorProto.FLOAT16
    tc = TensorProto.INT8 if int8_cache else t
    inputs = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    attrs = dict(num_heads=hq, kv_num_heads=hkv)
    if int8_cache:
        inputs += ["", "", "", "", "", "kv_scale", "kv_scale"]  # cos, sin, position_ids, bias, head_sink
        attrs.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", inputs, ["output", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)

    def vi(name, tt, rank):
        return helper.make_tensor_value_info(name, tt, [f"{name}_{i}" for i in range(rank)])

    graph_inputs = [vi("query", t, 3), vi("key", t, 3), vi("value", t, 3), vi("past_key", tc, 4),
                    vi("past_value", tc, 4), vi("seqlens_k", TensorProto.INT32, 1),
                    helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    if int8_cache:
        graph_inputs.append(helper.make_tensor_value_info("kv_scale", TensorProto.FLOAT, [1]))
    graph = helper.make_graph([node], "gqa", graph_inputs,
                              [vi("output", t, 3), vi("present_key", tc, 4), vi("present_value", tc, 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model


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
        self.binding = self.sess.io_binding()
        for name, val in self.vals.items():
            self.binding.bind_ortvalue_input(name, val)
        self.binding.bind_ortvalue_input("past_key", self.cache_k)
        self.binding.bind_ortvalue_input("past_value", self.cache_v)
        self.binding.bind_ortvalue_output("output", self.out)
        self.binding.bind_ortvalue_output("present_key", self.cache_k)
        self.binding.bind_ortvalue_output("present_value", self.cache_v)
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

        from . import register
        from .onnx_builders import attention_model

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
        for fmt in ("q8_0", "q4_0"):
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
        for name in DOT4_CANDIDATES:
            r = _make_runner(name, hd, q, sk, threads)
            r()
            got = r.output()
            qq = q.astype(np.float16) if name == "d4a_f16" else q
            if name in ("d4a_f16", "d4a_f32"):
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


def _case_label(c: dict) -> str:
    b = f" B={c['B']}" if c.get("B", 1) != 1 else ""
    sq = "" if c["kind"] == "prefill" or c["Sq"] == 1 else f" Sq={c['Sq']}"
    return f"{c['kind']} ({c['Hq']},{c['Hkv']},{c['D']}){sq} Sk={c['Sk']}{b}"


def _library_status() -> tuple[bool, str, dict]:
    try:
        from . import build_info, get_library_path

        path = get_library_path()
    except Exception as exc:  # noqa: BLE001 - report any failure to find it
        return False, str(exc), {}
    try:
        info = build_info()
    except Exception as exc:  # noqa: BLE001
        info = {"error": str(exc)}
    return True, path, info


# --------------------------------------------------------------------------------------------------------------
# report: table, JSON, plot


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def _print_table(console, results: list[dict], threads: int, machine: str) -> None:
    try:
        from rich.table import Table
    except ImportError:  # pragma: no cover
        for r in results:
            print(r)
        return
    table = Table(title=f"dot4attn bench — CPU, {threads} threads, {machine}", show_lines=False)
    for col, kw in [("case", {}), ("candidate", {}), ("median ms", {"justify": "right"}),
                    ("p25-p75 ms", {"justify": "right"}), ("n", {"justify": "right"}),
                    ("x vs GQA f32", {"justify": "right"}), ("KV MiB", {"justify": "right"}),
                    ("KV GB/s", {"justify": "right"}),
                    ("NMSE vs GQA f32", {"justify": "right"})]:
        table.add_column(col, **kw)
    last = None
    for r in results:
        label = _case_label(r["case"])
        if last is not None and label != last:
            table.add_section()
        sp = r.get("speedup_vs_gqa_f32")
        sp_txt = "-" if sp is None else f"{sp:.2f}x"
        if sp is not None and r["candidate"].startswith("d4a_"):
            sp_txt = f"[bold green]{sp_txt}[/]" if sp >= 1 else f"[red]{sp_txt}[/]"
        err = r.get("nmse_vs_gqa_f32")
        table.add_row(label if label != last else "", r["candidate"], _fmt_ms(r["median_ms"]),
                      f"{_fmt_ms(r['p25_ms'])}-{_fmt_ms(r['p75_ms'])}", str(r["repeats"]), sp_txt,
                      f"{r['kv_bytes'] / 2**20:.1f}", f"{r['kv_gb_per_s']:.1f}", "-" if err is None else f"{err:.1e}")
        last = label
    console.print(table) if console is not None else print(table)


def _print_summary(console, results: list[dict]) -> None:
    """Compact view: one row per case, per candidate 'median ms (speedup vs GQA f32)'."""
    try:
        from rich.table import Table
    except ImportError:  # pragma: no cover
        return
    cands = [c for c in CANDIDATES if any(r["candidate"] == c for r in results)]
    table = Table(title="median ms (x = speedup vs GQA f32 share-buffer)")
    table.add_column("case")
    for c in cands:
        table.add_column(c, justify="right")
    labels = []
    for r in results:
        if _case_label(r["case"]) not in labels:
            labels.append(_case_label(r["case"]))
    for lab in labels:
        cells = []
        for c in cands:
            hit = [r for r in results if r["candidate"] == c and _case_label(r["case"]) == lab]
            if not hit:
                cells.append("-")
                continue
            sp = hit[0].get("speedup_vs_gqa_f32")
            cells.append(_fmt_ms(hit[0]["median_ms"]) + ("" if sp is None or c == BASELINE else f" ({sp:.2f}x)"))
        table.add_row(lab, *cells)
    console.print(table) if console is not None else print(table)


def _plot(results: list[dict], path: Path, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decode_heads = list(dict.fromkeys((r["case"]["Hq"], r["case"]["Hkv"], r["case"]["D"]) for r in results
                                      if r["case"]["kind"] == "decode"))
    prefill = [r for r in results if r["case"]["kind"] == "prefill"]
    n = len(decode_heads) + (1 if prefill else 0)
    if n == 0:
        return
    colors = {c: plt.get_cmap("tab10")(i) for i, c in enumerate(CANDIDATES)}
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.6), squeeze=False)
    axes = axes[0]
    for ax, heads in zip(axes, decode_heads):
        rows = [r for r in results if r["case"]["kind"] == "decode"
                and (r["case"]["Hq"], r["case"]["Hkv"], r["case"]["D"]) == heads]
        for cand in CANDIDATES:
            pts = sorted((r["case"]["Sk"], r["median_ms"]) for r in rows if r["candidate"] == cand)
            if pts:
                style = "--" if cand.startswith("gqa") else ":" if cand == "numpy" else "-"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=cand, color=colors[cand])
        ax.set_xscale("log", base=2)
        sks = sorted({r["case"]["Sk"] for r in rows})
        ax.set_xticks(sks, [str(x) for x in sks])
        ax.set_yscale("log")
        ax.set_xlabel("Sk (keys)")
        ax.set_ylabel("median ms per call")
        ax.set_title(f"decode Sq=1, (Hq,Hkv,D)={heads}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if prefill:
        ax = axes[-1]
        cases = []
        for r in prefill:
            lab = f"({r['case']['Hq']},{r['case']['Hkv']},{r['case']['D']})\nSk={r['case']['Sk']}"
            if lab not in cases:
                cases.append(lab)
        cands = [c for c in CANDIDATES if any(r["candidate"] == c for r in prefill)]
        width = 0.8 / max(len(cands), 1)
        for i, cand in enumerate(cands):
            xs, ys = [], []
            for j, lab in enumerate(cases):
                for r in prefill:
                    rl = f"({r['case']['Hq']},{r['case']['Hkv']},{r['case']['D']})\nSk={r['case']['Sk']}"
                    if rl == lab and r["candidate"] == cand:
                        xs.append(j + i * width)
                        ys.append(r["median_ms"])
            ax.bar(xs, ys, width, label=cand, color=colors[cand])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per call")
        ax.set_title("causal prefill Sq=Sk")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"dot4attn bench (CPU, {threads} threads; lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The speed goals: (candidate, speedup vs gqa_f32 measured in the same run) at decode (32, 8, 128), Sk = 16384.
TARGETS = [("d4a_f16", 4.0), ("d4a_q4_0", 6.0)]
TARGET_CASE = ("decode", 32, 8, 128, 16384)


def _evaluate_targets(results: list[dict]) -> list[dict]:
    kind, hq, hkv, d, sk = TARGET_CASE
    out = []
    for cand, need in TARGETS:
        hit = [r for r in results if r["candidate"] == cand and r["case"]["kind"] == kind and r["case"]["Hq"] == hq
               and r["case"]["Hkv"] == hkv and r["case"]["D"] == d and r["case"]["Sk"] == sk
               and r["case"]["B"] == 1]
        sp = hit[0].get("speedup_vs_gqa_f32") if hit else None
        out.append({"case": f"decode ({hq},{hkv},{d}) Sk={sk}", "candidate": cand, "required_speedup": need,
                    "measured_speedup": sp, "met": None if sp is None else bool(sp >= need)})
    return out


# --------------------------------------------------------------------------------------------------------------
# entry points


def _run_cuda(args) -> int:
    try:
        import importlib

        bench_cuda = importlib.import_module(f"{__package__}.bench_cuda")  # lazy on purpose
    except ModuleNotFoundError as exc:
        if exc.name == f"{__package__}.bench_cuda":
            print("dot4attn bench --device cuda: dot4attn.bench_cuda is not part of this installation "
                  "(the CUDA bench is not available in this build)", file=sys.stderr)
            return 2
        raise
    try:
        import onnxruntime as ort

        eps = list(ort.get_available_providers())
    except Exception:  # noqa: BLE001 - no onnxruntime at all
        eps = []
    torch_cuda = False
    if "CUDAExecutionProvider" not in eps:
        try:
            import torch  # noqa: PLC0415

            torch_cuda = bool(torch.cuda.is_available())
        except Exception:  # noqa: BLE001
            torch_cuda = False
    if "CUDAExecutionProvider" not in eps and not torch_cuda:
        print(f"dot4attn bench --device cuda: no CUDA device reachable: this onnxruntime has no CUDA execution "
              f"provider (available: {', '.join(eps) or 'none'}) and torch sees no CUDA GPU; run it on a machine "
              "with an NVIDIA GPU, onnxruntime-gpu and torch", file=sys.stderr)
        return 2
    result = bench_cuda.run_cuda_bench(args)
    return result if isinstance(result, int) else 0


def run_bench(args) -> int:
    """Runs the bench described by `args` (from add_arguments); returns the process exit code."""
    if getattr(args, "device", "cpu") == "cuda":
        return _run_cuda(args)
    return run_cpu_bench(args)


def run_cpu_bench(args) -> int:
    threads = args.threads if args.threads and args.threads > 0 else _default_threads()
    with _BlasThreads(getattr(args, "numpy_threads", 1)) as blas:
        return _run_cpu_bench(args, threads, blas)


def _run_cpu_bench(args, threads: int, blas: _BlasThreads) -> int:
    import onnxruntime as ort

    console = _console()
    t_start = time.perf_counter()
    pool = setup_thread_pool(threads, getattr(args, "thread_pool", "global"))
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    wanted = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in CANDIDATES]
    if unknown:
        _print(console, f"[red]unknown candidate(s) {unknown}; choose from {list(CANDIDATES)}[/]")
        return 2
    case_seconds = args.case_seconds or (15.0 if args.quick else 20.0)
    lib_ok, lib_where, lib_info = _library_status()
    if any(c in DOT4_CANDIDATES for c in wanted) and not lib_ok:
        _print(console, f"[red]dot4attn bench: the op library is not available: {lib_where}[/]\n"
                        "Build it (`pip install .`, or cmake and DOT4ATTN_LIBRARY=...), or pass "
                        "--candidates gqa_f32,gqa_f16,numpy to bench the baselines only.")
        return 2
    cases = _case_list(args)
    machine = {
        "cpu": _cpu_model(), "logical_cpus": os.cpu_count(), "usable_cpus": _default_threads(),
        "cpu_flags": _cpu_flags(), "mem_gib": _mem_gib(), "platform": platform.platform(),
        "python": platform.python_version(), "numpy": np.__version__, "onnxruntime": ort.__version__,
        "dot4attn": __version__, "library": lib_where if lib_ok else None, "build_info": lib_info,
        "DOT4ATTN_CPU_ISA": os.environ.get("DOT4ATTN_CPU_ISA"),
        "loadavg_before": load_before,
    }
    machine_txt = f"{machine['cpu']}, {machine['usable_cpus']} cores, {machine['mem_gib']} GiB, ORT {ort.__version__}"
    _print(console, f"[bold]dot4attn bench[/] — CPU, {threads} intra-op threads ({pool} pool), numpy BLAS threads "
                    f"{blas.effective if blas.effective is not None else 'unchanged'}; {machine_txt}")
    if load_before and load_before[0] > 1.0:
        _print(console, f"[yellow]note: load average {load_before[0]:.2f} before the bench — other work on this "
                        "machine adds noise (interleaving keeps the comparison fair, not the absolute times)[/]")
    if lib_ok:
        _print(console, f"library {lib_where}; ISA {lib_info.get('cpu_isa', lib_info)}")
    _print(console, f"{len(cases)} cases x {len(wanted)} candidates; interleaved, median of repeats "
                    f"({'fixed ' + str(args.repeats) if args.repeats else f'auto, ~{case_seconds:.0f} s per case'})")

    report: dict = {
        "schema": "dot4attn-bench/1", "device": "cpu", "quick": bool(args.quick), "threads": threads,
        "thread_pool": pool, "numpy_blas_threads": blas.effective,
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
        "candidates": {c: CANDIDATES[c] for c in wanted}, "baseline": BASELINE,
        "method": ("one process; per case every candidate is warmed up, then each repeat runs every candidate "
                   "once (round-robin, start rotated); medians of repeats; ORT sessions on one intra-op pool of "
                   "`threads` threads (thread_pool), io_binding with pre-made OrtValues (no copies timed); GQA "
                   "with past/present bound to one buffer, seqlens_k=Sk-1, total_sequence_length=Sk"),
        "gqa_verification": [], "dot4_verification": [], "results": [], "targets": [],
    }

    # ---- correctness first: an honest baseline, and the op measured is the op specified
    if not args.no_verify:
        if any(c.startswith("gqa_") for c in wanted):
            report["gqa_verification"] = verify_gqa(threads)
            bad = [v for v in report["gqa_verification"] if not v["ok"]]
            worst = {dt: max(v["nmse_vs_float_attention"] for v in report["gqa_verification"] if v["dtype"] == dt)
                     for dt in ("float32", "float16")}
            _print(console, f"GQA share-buffer vs reference.float_attention: worst NMSE f32 {worst['float32']:.1e}, "
                            f"f16 {worst['float16']:.1e}; past/present share one buffer: "
                            f"{all(v['share_buffer'] for v in report['gqa_verification'])} -> "
                            + ("[green]OK[/]" if not bad else f"[red]FAILED {bad}[/]"))
            if bad:
                return 1
        if lib_ok and any(c in DOT4_CANDIDATES for c in wanted):
            report["dot4_verification"] = verify_dot4(threads)
            bad = [v for v in report["dot4_verification"] if not v["ok"]]
            worst = max(v["nmse_vs_reference"] for v in report["dot4_verification"])
            _print(console, f"Dot4Attention vs reference.attention (decode/split_k/prefill, 4 V variants): worst NMSE "
                            f"{worst:.1e} -> " + ("[green]OK[/]" if not bad else f"[red]FAILED {bad}[/]"))
            if bad:
                return 1

    # ---- timing
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    heads_order = []
    for c in cases:
        h = (c["Hq"], c["Hkv"], c["D"])
        if h not in heads_order:
            heads_order.append(h)
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn(), console=console, transient=True)
    except ImportError:  # pragma: no cover
        progress = None

    results: list[dict] = []
    with progress if progress is not None else _nullcontext():
        overall = progress.add_task("cases", total=len(cases)) if progress else None
        for heads in heads_order:
            hcases = [c for c in cases if (c["Hq"], c["Hkv"], c["D"]) == heads]
            s_max = max(c["Sk"] for c in hcases)
            if progress:
                progress.update(overall, description=f"making and packing K/V {heads} x {s_max}")
            hd = HeadData(*heads, s_max=s_max, batch=args.batch, seed=args.seed)
            hd.pack(set(wanted))
            for case in hcases:
                label = _case_label(case)
                names = [n for n in wanted if n != "numpy" or case["Sk"] <= (
                    args.numpy_max_sk if case["kind"] == "decode" else args.numpy_max_prefill)]
                if progress:
                    progress.update(overall, description=f"setting up {label}")
                q = hd.query(case["Sq"])
                runners = {n: _make_runner(n, hd, q, case["Sk"], threads) for n in names}
                task = progress.add_task(f"  {label}", total=None) if progress else None

                def _prog(done, total, _task=task):
                    if progress:
                        progress.update(_task, completed=done, total=total)

                if progress:
                    progress.update(overall, description=f"timing {label}")
                times = time_case(runners, args.repeats, args.warmup, case_seconds, _prog)
                if progress:
                    progress.remove_task(task)
                case_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
                base_out = runners[BASELINE].output() if BASELINE in runners else None
                base_med = float(np.median(times[BASELINE])) if BASELINE in times else None
                for n in names:
                    arr = np.array(times[n]) * 1e3
                    med = float(np.median(arr))
                    row = {
                        "case": dict(case), "candidate": n, "label": CANDIDATES[n],
                        "median_ms": med, "min_ms": float(arr.min()), "p25_ms": float(np.percentile(arr, 25)),
                        "p75_ms": float(np.percentile(arr, 75)), "repeats": int(arr.size),
                        "kv_bytes": int(runners[n].kv_bytes),
                        "speedup_vs_gqa_f32": None if base_med is None else (base_med * 1e3) / med,
                        "nmse_vs_gqa_f32": None, "loadavg_1min": case_load,
                        "kv_gb_per_s": runners[n].kv_bytes / (med * 1e-3) / 1e9,
                    }
                    if n.startswith("d4a_"):
                        row["route"] = ref.choose_route(case["Sq"], case["Sk"])
                    if base_out is not None and n != BASELINE:
                        row["nmse_vs_gqa_f32"] = ref.nmse(runners[n].output(), base_out)
                    results.append(row)
                del runners, base_out
                gc.collect()
                if progress:
                    progress.advance(overall)
                # partial JSON after every case, so a long run that is cut short still leaves its numbers
                report["results"] = results
                (out_dir / "bench.json").write_text(json.dumps(report, indent=1, default=_json_default))
            del hd
            gc.collect()

    report["results"] = results
    report["targets"] = _evaluate_targets(results)
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    report["machine"]["loadavg_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    _print_table(console, results, threads, machine_txt)
    _print_summary(console, results)

    # ---- targets
    for t in report["targets"]:
        if t["met"] is None:
            _print(console, f"target {t['candidate']} >= {t['required_speedup']:.0f}x vs GQA f32 at {t['case']}: "
                            "[yellow]not measured in this run[/]")
        else:
            _print(console, f"target {t['candidate']} >= {t['required_speedup']:.0f}x vs GQA f32 at {t['case']}: "
                            f"measured {t['measured_speedup']:.2f}x -> "
                            + ("[bold green]MET[/]" if t["met"] else "[bold red]NOT MET[/]"))

    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps(report, indent=1, default=_json_default))
    written = [str(json_path)]
    if not args.no_plot and results:
        try:
            _plot(results, out_dir / "bench.png", threads)
            written.append(str(out_dir / "bench.png"))
        except Exception as exc:  # noqa: BLE001 - a plot failure must not lose the numbers
            _print(console, f"[yellow]plot failed: {exc}[/]")
    _print(console, f"wrote {', '.join(written)} in {report['elapsed_s']:.0f} s")
    if args.require_targets and any(t["met"] is False for t in report["targets"]):
        return 1
    return 0


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dot4attn.bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
