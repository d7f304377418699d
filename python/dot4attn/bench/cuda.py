"""`dot4attn bench --device cuda`: Dot4Attention's GPU routes vs torch SDPA (flash, cuDNN) and ORT's
GroupQueryAttention on the CUDA execution provider, in one process.

* Kernel time by CUDA events on one stream, L2 flushed (a 256 MiB write; --l2-flush read: a 256 MiB read) before
  every timed call, median of the repeats. Dot4Attention is called through the library's C entry point
  (dot4attn.native.TorchAttention: device pointers, torch's current stream), so the time is the kernels' alone, and
  each row records the launch plan; ORT's session time for the same op (io_binding on device buffers, wall clock
  per run) is reported separately for decode.
* Candidates: d4a_f16 / d4a_q8_0 / d4a_q4_0 / d4a_q6_0 (query f16, packed int8 K, V float16 / q8_0 / q4_0 / q6_0;
  q6_0 at head sizes that are multiples of 64, the GPU kernels' rule: formats.gpu_takes). Where the default prefill
  runs Q.K on f16 wgmma from K's float16 copy (sm_90a, D 64 / 128 / 256: docs/ops.md), prefill rows also
  d4a_<V>_int8, the same call with the contract's int8 Q.K (override k_dequant=0), and where it keeps the int8 Q.K
  but the planner takes the f16 one (sm_90a, shorter calls), d4a_<V>_qk16 (k_dequant=1,v_dequant=1); where the
  planner takes them (sm_90a, D 64 / 128), d4a_<V>_qk16o, the f16 Q.K with 2 blocks per SM and each tile's softmax
  overlapped with the next tile's Q.K (k_dequant=1,v_dequant=1,min_blocks=2), d4a_<V>_ws, the f16 Q.K
  warp-specialized (k_dequant=1,v_dequant=1,ws=1; d4a_<V>_ws64 with 64-key tiles at D 64 / 128), and d4a_<V>_s8w, the int8 Q.K on wgmma (qk_wgmma=1,
  2 blocks per SM); d4a_cache_<V> / d4a_tight_<V> / d4a_pair_<V>, decode only: the same call over the strided views
  of Dot4GroupQueryAttention's cache tensors in the rows / tight / pair layout (docs/ops.md);
  sdpa_flash, sdpa_cudnn (torch.nn.functional.scaled_dot_product_attention, f16, GQA through enable_gqa);
  ort_gqa_f16 / ort_gqa_int8 (com.microsoft.GroupQueryAttention on the CUDA EP, f16 or ORT's own int8 (per-tensor
  scale) share-buffer cache, run on torch's stream
  through the EP's user_compute_stream, decode only); ort_d4a_q4_0_session (wall clock per session run);
  ort_cache_q4_0_session / ort_cache_q4_0_tight_session (Dot4GroupQueryAttention appending its token in place,
  rows / tight layout, wall clock).
* Decode: B=1, Sq=1 at Sk in {512, 4k, 16k, 64k, 128k}; prefill: causal Sq = Sk in {2k, 8k, 32k}; with --chunk
  SQ:SK, prompt chunks (kind "chunk": SQ rows over SK keys, causal aligned to the bottom right, SDPA through torch's
  causal_lower_right mask); head shapes (32, 8, 128) and (24, 4, 256). Achieved GB/s (KV bytes / time) and % of the measured HBM read bandwidth.
* Writes bench_cuda.json (and bench_cuda.png when matplotlib is present) into --out (dot4attn.bench.report).

`dot4attn bench --device cuda` runs it; so does `python -m dot4attn.bench.cuda`, which adds --cuda-repeats and
--l2-flush.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .. import native
from .. import reference as ref
from ..formats import PAIR_V_FORMATS, V_FORMATS, cache_row_widths, gpu_takes, pair_v_row_parts
from ..argtypes import positive_int
from . import report

HEADS = [(32, 8, 128), (24, 4, 256)]
DECODE_SK = [512, 4096, 16384, 65536, 131072]
PREFILL_SK = [2048, 8192, 32768]


L2_FLUSHES = ("write", "read")  # how _Timer empties L2 before a timed call (the first: the default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CUDA-only options (the shared ones come from dot4attn.bench.add_arguments)."""
    parser.add_argument("--cuda-repeats", type=positive_int, default=20, help="timed calls per candidate (CUDA bench)")
    parser.add_argument("--chunk", type=chunk_cases, default=[], metavar="SQ:SK[,SQ:SK...]",
                        help="chunked prefill cases (CUDA bench): SQ new query rows over SK keys, causal aligned to "
                             "the bottom right as a prompt chunk over its cache, e.g. 16384:131072 (default: none)")
    parser.add_argument("--l2-flush", choices=L2_FLUSHES, default=L2_FLUSHES[0],
                        help="how L2 is flushed before each timed call: write 256 MiB (default; the dirty lines' "
                             "write-back lands in the call, as in Triton's do_bench) or read 256 MiB (clean lines, "
                             "as a model's decode finds L2 after streaming its weights; it ranks staging modes as "
                             "the model does, docs/performance.md)")


def chunk_cases(text: str) -> list[tuple[int, int]]:
    """--chunk: comma-separated SQ:SK pairs, 1 <= SQ <= SK ('' for none)."""
    out = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        try:
            sq, sk = (int(x) for x in item.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected SQ:SK pairs such as 16384:131072, got {item!r}") from None
        if not 1 <= sq <= sk:
            raise argparse.ArgumentTypeError(f"expected 1 <= SQ <= SK, got {item!r}")
        out.append((sq, sk))
    return out


def causal_flops(b: int, hq: int, d: int, sq: int, sk: int) -> float:
    """FLOPs of causal attention of sq query rows over sk keys, aligned to the bottom right (row i sees sk - sq + i
    + 1 keys), two matmuls of 2 FLOPs per multiply-add; sq = sk gives the usual half square (4 b hq d s^2 / 2)."""
    return 4.0 * b * hq * d * (sq * (sk - sq) + sq * sq / 2)


class _Timer:
    def __init__(self, torch, repeats: int, flush: str = L2_FLUSHES[0]):
        if flush not in L2_FLUSHES:
            raise ValueError(f"l2 flush: expected 'write' or 'read', got {flush!r}")
        self.torch = torch
        self.repeats = repeats
        self.flush_mode = flush
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self, fn) -> float:
        """Median kernel time of fn() in microseconds, L2 flushed before each call."""
        torch = self.torch
        fn()
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.repeats):
            if self.flush_mode == "write":
                self.flush.zero_()
            else:
                self.flush.sum()  # reads every byte; the scalar it returns is not needed
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            times.append((s, e))
        torch.cuda.synchronize()
        return float(np.median([s.elapsed_time(e) for s, e in times]) * 1e3)


def _quantize(torch, x, qmax):
    """Packed payload + fp16 scales (the PackK / PackV math) on the GPU with torch."""
    B, H, S, D = x.shape
    xb = x.float().reshape(B, H, S, D // 32, 32)
    s = (xb.abs().amax(-1) / qmax).half()
    sf = s.float().unsqueeze(-1)
    q = torch.where(sf == 0, torch.zeros_like(xb), torch.round(xb / torch.where(sf == 0, torch.ones_like(sf), sf)))
    return q, s


def _nibbles(u):
    """Levels u (uint8 < 16 after masking) [..., 2n] -> n bytes: element 2i in the low nibble of byte i."""
    return (u[..., 0::2] & 15) | ((u[..., 1::2] & 15) << 4)


def _pack(torch, x, fmt):
    if fmt in ("q4_0", "q6_0"):  # 16 / 64 levels: s = v / -8 (-32), v the block's signed max (docs/ops.md)
        half = 8 if fmt == "q4_0" else 32
        B, H, S, D = x.shape
        xb = x.float().reshape(B, H, S, D // 32, 32)
        hi, lo = xb.amax(-1), xb.amin(-1)
        s = (torch.where(hi >= -lo, hi, lo) / -half).half()
        s = torch.where(s == 0, torch.zeros_like(s), s)  # -0 -> +0
        sf = s.float().unsqueeze(-1)
        q = torch.where(sf == 0, torch.zeros_like(xb), torch.round(xb / torch.where(sf == 0, torch.ones_like(sf), sf)))
        u = (q.clamp(-half, half - 1) + half).to(torch.uint8)  # [B, H, S, D/32, 32]
        if fmt == "q4_0":
            return _nibbles(u.reshape(*x.shape)).contiguous(), s.contiguous()
        # q6_0: per block 16 bytes of low nibbles (as q4_0), then byte 16 + j: the high pairs of elements j, j + 8,
        # j + 16, j + 24 at bits 0-1, 2-3, 4-5, 6-7
        hp = (u >> 4).reshape(B, H, S, D // 32, 4, 8)
        high = hp[..., 0, :] | (hp[..., 1, :] << 2) | (hp[..., 2, :] << 4) | (hp[..., 3, :] << 6)
        return torch.cat([_nibbles(u), high], -1).reshape(B, H, S, 3 * D // 4).contiguous(), s.contiguous()
    q, s = _quantize(torch, x, 127.0)
    return q.clamp(-127, 127).to(torch.int8).reshape(*x.shape).contiguous(), s.contiguous()


def _sdpa(torch, backend, q, k, v, causal):
    """torch SDPA on one backend. causal with fewer query rows than keys: aligned to the bottom right as
    Dot4Attention's (torch's causal_lower_right bias, K / V heads repeated to the query heads: the bias takes no
    enable_gqa)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]
    if causal and q.shape[2] != k.shape[2]:
        from torch.nn.attention.bias import causal_lower_right

        g = q.shape[1] // k.shape[1]
        kk, vv = (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) if gqa else (k, v)
        bias = causal_lower_right(q.shape[2], k.shape[2])

        def fn():
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q, kk, vv, attn_mask=bias)
    else:
        def fn():
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    fn()  # raises when the backend cannot take the case
    return fn


def _ort_gqa(torch, q, k, v, int8_cache: bool = False):
    """GroupQueryAttention on the CUDA EP in share-buffer mode, on torch's current stream. int8_cache: ORT's own
    quantized cache (int8, one per-tensor float scale shared by K and V: the XQA decode kernel's fast case)."""
    import onnxruntime as ort

    from ..onnx_builders import gqa_model

    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    stream = torch.cuda.current_stream().cuda_stream
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(gqa_model(Hq, Hkv, np.float16, int8_cache).SerializeToString(), so,
                                providers=[("CUDAExecutionProvider", {"user_compute_stream": str(stream)})])
    if int8_cache:
        amax = float(torch.maximum(k.abs().max(), v.abs().max()))
        scale = torch.tensor([amax / 127.0], dtype=torch.float32, device="cuda")
        cache_k = torch.round(k.float() / scale).clamp(-127, 127).to(torch.int8)
        cache_v = torch.round(v.float() / scale).clamp(-127, 127).to(torch.int8)
    else:
        cache_k, cache_v = k.clone(), v.clone()
    bsh = lambda x: x.transpose(1, 2).reshape(B, x.shape[2], -1).contiguous()  # noqa: E731
    vals = {"query": bsh(q), "key": bsh(k[:, :, Sk - Sq:]), "value": bsh(v[:, :, Sk - Sq:]),
            "seqlens_k": torch.full((B,), Sk - 1, dtype=torch.int32, device="cuda")}
    total = np.array(Sk, np.int32)
    out = torch.empty((B, Sq, Hq * D), dtype=torch.float16, device="cuda")
    bind = sess.io_binding()

    def bt(name, t, output=False):
        et = {torch.float16: np.float16, torch.int32: np.int32, torch.int8: np.int8, torch.float32: np.float32}[t.dtype]
        (bind.bind_output if output else bind.bind_input)(name, "cuda", 0, et, list(t.shape), t.data_ptr())
    if int8_cache:
        vals["kv_scale"] = scale
    for n, t in vals.items():
        bt(n, t)
    bind.bind_cpu_input("total_sequence_length", total)
    bt("past_key", cache_k)
    bt("past_value", cache_v)
    bt("output", out, True)
    bt("present_key", cache_k, True)
    bt("present_value", cache_v, True)
    fn = lambda: sess.run_with_iobinding(bind)  # noqa: E731
    fn()
    return fn, (out, cache_k, cache_v, vals)


def _wall_us(torch, fn, n: int = 50) -> float:
    """Wall-clock microseconds per call of fn (an ORT session run: host included), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def _ort_d4a_session(torch, q, kp, ks, vp, vs, fmt):
    import onnxruntime as ort

    from .. import onnx_builders as ob
    import dot4attn

    so = ort.SessionOptions()
    dot4attn.register(so)
    so.log_severity_level = 3
    model = ob.attention_model(np.float16, fmt, None, causal=1)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CUDAExecutionProvider"])
    out = torch.empty_like(q)
    bind = sess.io_binding()
    et = {torch.float16: np.float16, torch.int8: np.int8, torch.uint8: np.uint8}
    for name, t in (("query", q), ("k_payload", kp), ("k_scales", ks), ("value", vp), ("v_scales", vs)):
        if t is not None:
            bind.bind_input(name, "cuda", 0, et[t.dtype], list(t.shape), t.data_ptr())
    bind.bind_output("output", "cuda", 0, np.float16, list(out.shape), out.data_ptr())
    return _wall_us(torch, lambda: sess.run_with_iobinding(bind)), out


def _read_bandwidth(torch) -> float:
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda").view(torch.float32)
    x.zero_()
    x.sum()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        x.sum()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    del x
    return (4 << 30) / best / 1e12


def _nmse(x, ref) -> float:
    x, ref = x.double(), ref.double()
    den = float((ref ** 2).sum())
    return float(((x - ref) ** 2).sum()) / den if den else 0.0


class BenchResult(dict):
    """The result dict; int(result) is the process exit code (dot4attn.bench's _run_cuda calls int())."""

    def __int__(self):
        return int(self.get("exit_code", 0))


class _Run:
    """One CUDA bench run: its settings (from the shared bench options), the timer, and the result rows."""

    def __init__(self, args, torch, ort):
        self.torch, self.ort = torch, ort
        quick = bool(getattr(args, "quick", False))
        self.heads = getattr(args, "heads", None) or HEADS
        self.decode_sk = getattr(args, "decode_sk", None) or ([4096, 131072] if quick else DECODE_SK)
        prefill_sk = getattr(args, "prefill_sk", None)
        self.prefill_sk = ([8192] if quick else PREFILL_SK) if prefill_sk is None else prefill_sk
        self.chunks = list(getattr(args, "chunk", None) or [])
        self.B = int(getattr(args, "batch", 1) or 1)
        self.repeats = int(getattr(args, "cuda_repeats", 0) or getattr(args, "repeats", 0) or 20)
        torch.manual_seed(int(getattr(args, "seed", 0) or 0))
        self.l2_flush = getattr(args, "l2_flush", None) or L2_FLUSHES[0]
        self.timer = _Timer(torch, self.repeats, self.l2_flush)
        self.dev = torch.cuda.get_device_name()
        self.bw = _read_bandwidth(torch)
        self.results = []

    def record(self, case, name, us, kv_bytes=None, flops=None, extra=None):
        """Adds and prints one row; case = (kind, Hq, Hkv, D, Sk), or (kind, Hq, Hkv, D, Sk, Sq) for a chunk."""
        kind, hq, hkv, d, sk = case[:5]
        r = {"kind": kind, "B": self.B, "Hq": hq, "Hkv": hkv, "D": d, "Sk": sk, "candidate": name, "us": us}
        if len(case) > 5:
            r["Sq"] = case[5]
        if kv_bytes is not None and us:
            r["kv_bytes"] = kv_bytes
            r["GBps"] = kv_bytes / (us * 1e-6) / 1e9
            r["pct_hbm"] = 100 * r["GBps"] / (self.bw * 1e3)
        if flops is not None and us:
            r["TFLOPs"] = flops / (us * 1e-6) / 1e12
        if extra:
            r.update(extra)
        self.results.append(r)
        tail = f" {r.get('GBps', 0):8.0f} GB/s {r.get('pct_hbm', 0):5.1f}%" if "GBps" in r else ""
        tail += f" {r['TFLOPs']:7.1f} TFLOP/s" if "TFLOPs" in r else ""
        err = f" nmse={extra['nmse']:.1e}" if extra and extra.get("nmse") is not None else ""
        sq = f" Sq={case[5]:6d}" if len(case) > 5 else ""
        print(f"{kind:7s} ({hq},{hkv},{d}){sq} Sk={sk:6d} {name:22s} {us if us else float('nan'):10.1f} us{tail}{err}",
              flush=True)


def _onnxruntime():
    """onnxruntime with its CUDA libraries preloaded, or None."""
    try:
        import onnxruntime as ort

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        return ort
    except Exception:  # noqa: BLE001
        return None


def run_cuda_bench(args) -> dict:
    import torch

    ort = _onnxruntime()
    out_dir = Path(getattr(args, "out", None) or "bench-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(args, torch, ort)
    print(f"# device {run.dev}; measured read bandwidth {run.bw:.2f} TB/s; repeats {run.repeats}; "
          f"L2 flushed per call (by a {run.l2_flush})")
    for hq, hkv, d in run.heads:
        for sk in run.decode_sk:
            _decode_case(run, hq, hkv, d, sk)
        for s in run.prefill_sk:
            _prefill_case(run, hq, hkv, d, s)
        for sq, sk in run.chunks:
            _prefill_case(run, hq, hkv, d, sk, sq=sq)
    return _finish(run, out_dir)


def _inputs(run, hq, hkv, d, sq, sk):
    """Random f16 q (x3), k, v and K packed as q8_0."""
    torch, B = run.torch, run.B
    q = torch.randn(B, hq, sq, d, device="cuda", dtype=torch.float16) * 3
    k = torch.randn(B, hkv, sk, d, device="cuda", dtype=torch.float16)
    v = torch.randn(B, hkv, sk, d, device="cuda", dtype=torch.float16)
    kp, ks = _pack(torch, k, "q8_0")
    return q, k, v, kp, ks


def _decode_case(run, hq, hkv, d, sk):
    case = ("decode", hq, hkv, d, sk)
    q, k, v, kp, ks = _inputs(run, hq, hkv, d, 1, sk)
    ref = _time_sdpa(run, case, q, k, v, False, kv_bytes=2 * k.numel() * 2)
    if run.ort is not None:
        _time_ort_gqa(run, case, q, k, v, ref)
    for fmt in _v_formats(case):
        vp, vs = (v, None) if fmt == "float" else _pack(run.torch, v, fmt)
        r = _time_d4a(run, case, q, kp, ks, vp, vs, fmt, ref)
        caches = tight = None
        if fmt != "float":
            caches = _cache_buffers(run.torch, kp, ks, vp, vs, fmt)
            tight = _tight_buffers(run.torch, kp, ks, vp, vs, fmt)
            _time_d4a_cache(run, case, q, caches, fmt, r)
            _time_d4a_cache(run, case, q, tight, fmt, r, name=f"d4a_tight_{fmt}")
        if fmt in PAIR_V_FORMATS:  # the pair layout q4_0 / q6_0 V folders use under og.Generator
            _time_d4a_cache(run, case, q, _pair_buffers(run.torch, kp, ks, vp, vs, fmt=fmt), fmt, r,
                            name=f"d4a_pair_{fmt}")
        if fmt == "q4_0" and run.ort is not None and sk in (512, 16384, 131072):
            _time_ort_d4a_session(run, case, q, kp, ks, vp, vs, fmt, r)
            _time_ort_cache_session(run, case, q, k, v, caches, fmt)
            _time_ort_cache_session(run, case, q, k, v, tight, fmt, layout="tight")
        del caches, tight
    del q, k, v, kp, ks, ref
    run.torch.cuda.empty_cache()


def _v_formats(case) -> list[str]:
    """The V formats measured at this case's head size: every one the GPU kernels take there (q6_0 needs D a multiple
    of 64); the others are skipped with a printed reason."""
    kind, hq, hkv, d, sk = case[:5]
    out = []
    for fmt in V_FORMATS:
        if gpu_takes(fmt, d):
            out.append(fmt)
        else:
            print(f"{kind:7s} ({hq},{hkv},{d}) Sk={sk:6d} d4a_{fmt} skipped: {fmt} V on the GPU needs D a multiple of "
                  f"64, got D={d}", flush=True)
    return out


def _prefill_case(run, hq, hkv, d, s, sq=None):
    """Causal prefill of Sq = Sk = s, or (sq < s) a prompt chunk of sq rows over s keys, aligned to the bottom right
    (kind "chunk"; the SDPA baselines then take torch's causal_lower_right mask)."""
    sq = s if sq is None else sq
    case = ("prefill", hq, hkv, d, s) if sq == s else ("chunk", hq, hkv, d, s, sq)
    q, k, v, kp, ks = _inputs(run, hq, hkv, d, sq, s)
    flops = causal_flops(run.B, hq, d, sq, s)
    ref = _time_sdpa(run, case, q, k, v, True, flops=flops, ref_max_sk=8192)
    for fmt in _v_formats(case):
        vp, vs = (v, None) if fmt == "float" else _pack(run.torch, v, fmt)
        _time_d4a(run, case, q, kp, ks, vp, vs, fmt, ref, flops=flops)
        # the other Q.K instances, where the planner takes them: the contract's int8 Q.K where the default is the f16
        # one (k_dequant.cuh), the f16 Q.K overlapped, the int8 Q.K on wgmma
        default = native.gpu_plan(native.TorchAttention(q, kp, ks, vp, vs, run.torch.empty_like(q), v_format=fmt).call)
        for ov, sfx in (("k_dequant=0", "_int8"), (QK16, "_qk16"), (QK16 + ",min_blocks=2", "_qk16o"),
                        (QK16 + ",ws=1", "_ws"), (QK16 + ",ws=1,ws_keys=64", "_ws64"),
                        ("qk_wgmma=1,v_dequant=1,min_blocks=2", "_s8w")):
            r = native.TorchAttention(q, kp, ks, vp, vs, run.torch.empty_like(q), v_format=fmt, overrides=ov)
            pl = native.gpu_plan(r.call)
            if sfx == "_int8":
                takes = default.get("k_dequant") and not pl.get("k_dequant")
            elif sfx == "_qk16":  # the f16 Q.K where the default keeps the int8 one
                takes = pl.get("k_dequant") and not default.get("k_dequant")
            elif sfx == "_qk16o":  # the 2-blocks-per-SM instances (D 64 / 128; D = 256's kernel has no such)
                takes = pl.get("k_dequant") and pl.get("min_blocks") == 2
            elif sfx == "_ws":  # the warp-specialized f16 Q.K
                takes = pl.get("ws")
            elif sfx == "_ws64":  # its 64-key tiles where the default tile is 128 keys (D 64 / 128)
                takes = pl.get("ws") and d != 256
            else:
                takes = pl.get("qk_wgmma")
            if takes:
                _time_d4a(run, case, q, kp, ks, vp, vs, fmt, ref, flops=flops, overrides=ov, suffix=sfx)
            del r
    del q, k, v, kp, ks, ref
    run.torch.cuda.empty_cache()


def _time_sdpa(run, case, q, k, v, causal, kv_bytes=None, flops=None, ref_max_sk=None):
    """cuDNN and flash SDPA; returns the first one's output as the reference (None past ref_max_sk or if both
    fail)."""
    ref = None
    for name, bk in (("sdpa_cudnn", "cudnn"), ("sdpa_flash", "flash")):
        try:
            fn = _sdpa(run.torch, bk, q, k, v, causal)
            if ref is None and (ref_max_sk is None or case[4] <= ref_max_sk):
                ref = fn().float()
            run.record(case, name, run.timer(fn), kv_bytes, flops)
        except Exception as e:  # noqa: BLE001
            run.record(case, name, None, extra={"error": str(e)[:200]})
    return ref


def _time_ort_gqa(run, case, q, k, v, ref):
    """ORT GQA with an f16 cache, and with its own int8 cache (k/v_quant_type, onnxruntime >= 1.23)."""
    B, hq, d = run.B, case[1], case[3]
    for name, int8, kv_bytes in (("ort_gqa_f16", False, 2 * k.numel() * 2), ("ort_gqa_int8", True, 2 * k.numel() + 4)):
        try:
            fn, keep = _ort_gqa(run.torch, q, k, v, int8_cache=int8)
            run.record(case, name, run.timer(fn), kv_bytes,
                       extra={"nmse": _nmse(keep[0].reshape(B, 1, hq, d).transpose(1, 2), ref)
                              if ref is not None else None})
            del keep
        except Exception as e:  # noqa: BLE001
            run.record(case, name, None, extra={"error": str(e)[:200]})


def _kv_bytes(kp, ks, vp, vs) -> int:
    return kp.numel() + ks.numel() * 2 + vp.numel() * vp.element_size() + (vs.numel() * 2 if vs is not None else 0)


# The overrides of the "_qk16" / "_qk16o" prefill rows: K (and a quantized V) converted once into float16 rows, Q.K on
# f16 wgmma.
QK16 = "k_dequant=1,v_dequant=1"


def _time_d4a(run, case, q, kp, ks, vp, vs, fmt, ref, flops=None, overrides="", suffix=""):
    """Dot4Attention through the C entry point; decode rows carry KV bytes and splits, prefill rows FLOP/s."""
    r = native.TorchAttention(q, kp, ks, vp, vs, run.torch.empty_like(q), v_format=fmt, overrides=overrides)
    r()
    name = ("d4a_f16" if fmt == "float" else f"d4a_{fmt}") + suffix
    nmse = _nmse(r.out.float(), ref) if ref is not None else None
    extra = {"nmse": nmse, "plan": r.plan}
    if flops is None:
        run.record(case, name, run.timer(r), _kv_bytes(kp, ks, vp, vs), extra={"n_splits": r.plan["n_splits"], **extra})
    else:
        run.record(case, name, run.timer(r), flops=flops, extra=extra)
    return r


def _cache_buffers(torch, kp, ks, vp, vs, fmt, extra_rows: int = 128):
    """The packed cache of onnxruntime-genai folders holding the same K / V: uint8 [B, Hkv, Sk + extra, row] per K
    and V (payload, fp16 scales, padding; rows past Sk are garbage), and the strided views of its valid rows."""
    B, H, S, D = kp.shape
    out = []
    for pay, sc, f in ((kp, ks, "q8_0"), (vp, vs, fmt)):
        pb = ref.cache_payload_bytes(D, f)
        buf = torch.full((B, H, S + extra_rows, ref.cache_row_bytes(D, f)), 0x7F, dtype=torch.uint8, device="cuda")
        buf[:, :, :S, :pb] = pay.view(torch.uint8)
        buf[:, :, :S, pb:pb + D // 16] = sc.view(torch.uint8)
        p_view = buf[:, :, :S, :pb]
        out += [buf, p_view.view(torch.int8) if f == "q8_0" else p_view, buf[:, :, :S, pb:pb + D // 16].view(torch.float16)]
    return out


def _tight_buffers(torch, kp, ks, vp, vs, fmt, extra_rows: int = 128, device: str = "cuda"):
    """The tight-layout cache (docs/ops.md: cache_layout "tight", no row padding) holding the same K / V: uint8
    [B, Hkv, Sk + extra, payload + D/16] per K and V whose memory holds every row's payload in one run, then every
    row's scales (rows past Sk are garbage), and the strided views of the valid rows, in _cache_buffers' order."""
    B, H, S, D = kp.shape
    L = S + extra_rows
    out = []
    for pay, sc, f in ((kp, ks, "q8_0"), (vp, vs, fmt)):
        pb = ref.cache_payload_bytes(D, f)
        buf = torch.full((B, H, L, pb + D // 16), 0x7F, dtype=torch.uint8, device=device)
        runs = buf.view(-1)
        p_run = runs[:B * H * L * pb].view(B, H, L, pb)
        s_run = runs[B * H * L * pb:].view(B, H, L, D // 16)
        p_run[:, :, :S] = pay.view(torch.uint8)
        s_run[:, :, :S] = sc.view(torch.uint8)
        p_view = p_run[:, :, :S]
        out += [buf, p_view.view(torch.int8) if f == "q8_0" else p_view, s_run[:, :, :S].view(torch.float16)]
    return out


def _pair_buffers(torch, kp, ks, vp, vs, extra_rows: int = 128, device: str = "cuda", fmt: str = "q4_0"):
    """The pair-layout cache (docs/ops.md: q4_0 or q6_0 V, K and V tensors both D bytes wide) holding the same K / V:
    uint8 [B, Hkv, Sk + extra, D] per K and V (rows past Sk are garbage) and the strided views of its valid rows, in
    _cache_buffers' order: K buffer, K payload, K scales (in the V rows), V buffer, V payload, V scales."""
    B, H, S, D = kp.shape
    payload, v_sc, k_sc = pair_v_row_parts(D, fmt)
    bk = torch.full((B, H, S + extra_rows, D), 0x7F, dtype=torch.uint8, device=device)
    bv = torch.full((B, H, S + extra_rows, D), 0x7F, dtype=torch.uint8, device=device)
    bk[:, :, :S] = kp.view(torch.uint8)
    bv[:, :, :S] = 0
    bv[:, :, :S, payload] = vp
    bv[:, :, :S, v_sc] = vs.view(torch.uint8)
    bv[:, :, :S, k_sc] = ks.view(torch.uint8)
    return [bk, bk[:, :, :S].view(torch.int8), bv[:, :, :S, k_sc].view(torch.float16),
            bv, bv[:, :, :S, payload], bv[:, :, :S, v_sc].view(torch.float16)]


def _time_d4a_cache(run, case, q, caches, fmt, dense, name=None):
    """The attention of Dot4GroupQueryAttention: the same call over the packed cache's strided rows (`caches` from
    _cache_buffers or _pair_buffers; kernel time, the same timer as the dense call; the output must equal the dense
    call's)."""
    _, kpv, ksv, _, vpv, vsv = caches
    r = native.TorchAttention(q, kpv, ksv, vpv, vsv, run.torch.empty_like(q), v_format=fmt)
    r()
    same = bool(run.torch.equal(r.out, dense.out))
    run.record(case, name or f"d4a_cache_{fmt}", run.timer(r), _kv_bytes(kpv, ksv, vpv, vsv),
               extra={"equal_to_dense": same, "plan": r.plan, "n_splits": r.plan["n_splits"]})


def _time_ort_cache_session(run, case, q, k, v, caches, fmt, layout: str = "rows"):
    """Dot4GroupQueryAttention through an ORT session on the CUDA EP, past/present bound to the device buffers of
    `caches` (Sk + 128 rows, genai's shared buffer; `layout`: the op's cache_layout, rows or tight): the call packs
    its token from k / v into row Sk - 1 and attends over Sk rows (wall clock per run, like
    ort_d4a_q4_0_session)."""
    import onnxruntime as ort

    import dot4attn

    from ..onnx_builders import cache_attention_model

    torch = run.torch
    B, Hq, _, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    name = f"ort_cache_{fmt}_session" if layout == "rows" else f"ort_cache_{fmt}_{layout}_session"
    try:
        bk, bv = caches[0], caches[3]
        so = ort.SessionOptions()
        dot4attn.register(so)
        so.log_severity_level = 3
        model = cache_attention_model(np.float16, num_heads=Hq, kv_num_heads=Hkv, v_format=fmt,
                                      cache_layout=None if layout == "rows" else layout)
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CUDAExecutionProvider"])
        bsh = lambda x: x.transpose(1, 2).reshape(B, x.shape[2], -1).contiguous()  # noqa: E731
        vals = {"query": bsh(q), "key": bsh(k[:, :, Sk - 1:]), "value": bsh(v[:, :, Sk - 1:])}
        out = torch.empty((B, 1, Hq * D), dtype=torch.float16, device="cuda")
        bind = sess.io_binding()
        for n, t in vals.items():
            bind.bind_input(n, "cuda", 0, np.float16, list(t.shape), t.data_ptr())
        bind.bind_cpu_input("seqlens_k", np.full((B,), Sk - 1, np.int32))
        bind.bind_cpu_input("total_sequence_length", np.array(Sk, np.int32))
        for n, t in (("past_key", bk), ("past_value", bv)):
            bind.bind_input(n, "cuda", 0, np.uint8, list(t.shape), t.data_ptr())
        bind.bind_output("output", "cuda", 0, np.float16, list(out.shape), out.data_ptr())
        for n, t in (("present_key", bk), ("present_value", bv)):
            bind.bind_output(n, "cuda", 0, np.uint8, list(t.shape), t.data_ptr())
        run.record(case, name, _wall_us(torch, lambda: sess.run_with_iobinding(bind)),
                   Hkv * Sk * B * sum(cache_row_widths(D, fmt, layout)), extra={"wall_clock": True})
    except Exception as e:  # noqa: BLE001
        run.record(case, name, None, extra={"error": str(e)[:300]})


def _time_ort_d4a_session(run, case, q, kp, ks, vp, vs, fmt, r):
    """The same op as `r` through an ORT session on the CUDA EP (wall clock per run, output checked against r)."""
    try:
        us, o = _ort_d4a_session(run.torch, q, kp, ks, vp, vs, fmt)
        run.record(case, "ort_d4a_q4_0_session", us, _kv_bytes(kp, ks, vp, vs),
                   extra={"nmse": _nmse(o.float(), r.out.float()), "wall_clock": True})
    except Exception as e:  # noqa: BLE001
        run.record(case, "ort_d4a_q4_0_session", None, extra={"error": str(e)[:200]})


def _finish(run, out_dir: Path) -> BenchResult:
    targets = _targets(run.results)
    for t in targets:
        print(f"target {t['what']}: {t['value']} vs {t['limit']} -> {'MET' if t['met'] else 'MISSED'}")
    res = BenchResult(device=run.dev, read_bandwidth_tbs=run.bw, repeats=run.repeats, l2_flush=run.l2_flush,
                      results=run.results, targets=targets, exit_code=0)
    report.write_json(out_dir / "bench_cuda.json", res)
    try:
        report.plot_cuda(run.results, out_dir / "bench_cuda.png")
    except Exception as e:  # noqa: BLE001
        print(f"(no plot: {e})")
    return res


def _get(results, kind, hq, hkv, d, sk, name):
    for r in results:
        if (r["kind"], r["Hq"], r["Hkv"], r["D"], r["Sk"], r["candidate"]) == (kind, hq, hkv, d, sk, name):
            return r.get("us")
    return None


# The acceptance goals at (32, 8, 128), B = 1, as ratios against a baseline measured in the same run
GOAL_DECODE_128K_Q4_0 = 0.5   # decode 128k, q4_0 V: time <= 0.5x cuDNN
GOAL_DECODE_128K_F16 = 0.85   # decode 128k, f16 V: time <= 0.85x cuDNN
GOAL_DECODE_16K_Q4_0 = 0.7    # decode 16k, q4_0 V: time <= 0.7x cuDNN
GOAL_DECODE_512_US = 10.0     # decode 512 keys, q4_0 V: kernel time <= 10 us
GOAL_PREFILL_8K_VS_FA2 = 1.0  # causal prefill (8k at D = 128, 2k-32k at D = 256): speed >= 1.0x FlashAttention-2
GOAL_PREFILL_VS_CUDNN = 1.0   # causal prefill 8k / 32k, f16 and q8_0 V: speed >= 1.0x cuDNN
GOAL_CACHE_128K = 1.05        # decode 128k over the packed cache (strided rows; in place, through ORT) <= 1.05x dense
CACHE_GOAL_FORMATS = ("q8_0", "q4_0")  # the V formats GOAL_CACHE_128K is set for (q6_0's rows are measured, no goal)


def _targets(results):
    out = []

    def ratio(kind, sk, ours, base, limit, what, higher_better=False, heads=(32, 8, 128)):
        a, b = _get(results, kind, *heads, sk, ours), _get(results, kind, *heads, sk, base)
        if a and b:
            v = b / a if higher_better else a / b
            out.append({"what": what, "value": round(v, 3), "limit": limit,
                        "met": v >= limit if higher_better else v <= limit})

    ratio("decode", 131072, "d4a_q4_0", "sdpa_cudnn", GOAL_DECODE_128K_Q4_0, "decode 128k q4_0 time / cuDNN f16")
    ratio("decode", 131072, "d4a_f16", "sdpa_cudnn", GOAL_DECODE_128K_F16, "decode 128k f16 V time / cuDNN f16")
    ratio("decode", 16384, "d4a_q4_0", "sdpa_cudnn", GOAL_DECODE_16K_Q4_0, "decode 16k q4_0 time / cuDNN f16")
    a = _get(results, "decode", 32, 8, 128, 512, "d4a_q4_0")
    if a:
        out.append({"what": "decode 512 q4_0 kernel us", "value": round(a, 2), "limit": GOAL_DECODE_512_US,
                    "met": a <= GOAL_DECODE_512_US})
    ratio("prefill", 8192, "d4a_f16", "sdpa_flash", GOAL_PREFILL_8K_VS_FA2, "prefill 8k causal speed vs FA2 (f16 V)",
          True)
    for sk in (8192, 32768):
        for fmt in ("f16", "q8_0"):
            for sfx, how in (("", ""), ("_int8", ", int8 Q.K"), ("_qk16", ", Q.K on f16 wgmma"),
                             ("_qk16o", ", Q.K on f16 wgmma, overlapped"),
                             ("_ws", ", Q.K on f16 wgmma, warp-specialized"), ("_s8w", ", int8 Q.K on wgmma")):
                ratio("prefill", sk, f"d4a_{fmt}{sfx}", "sdpa_cudnn", GOAL_PREFILL_VS_CUDNN,
                      f"prefill {sk // 1024}k causal speed vs cuDNN ({fmt} V{how})", True)
    for sk in (2048, 8192, 32768):  # D = 256 (the f16 Q.K kernel with Q in shared memory on sm_90a)
        for fmt in ("f16", "q8_0"):
            for sfx, how in (("", ""), ("_ws", ", warp-specialized")):
                ratio("prefill", sk, f"d4a_{fmt}{sfx}", "sdpa_flash", GOAL_PREFILL_8K_VS_FA2,
                      f"prefill {sk // 1024}k causal speed vs FA2, (24, 4, 256) {fmt} V{how}", True, heads=(24, 4, 256))
    for fmt in CACHE_GOAL_FORMATS:
        ratio("decode", 131072, f"d4a_cache_{fmt}", f"d4a_{fmt}", GOAL_CACHE_128K,
              f"decode 128k {fmt}: packed-cache rows / dense, kernel time")
    ratio("decode", 131072, "ort_cache_q4_0_session", "ort_d4a_q4_0_session", GOAL_CACHE_128K,
          "decode 128k q4_0: Dot4GroupQueryAttention in place / Dot4Attention dense, ORT session wall clock")
    return out


def main(argv=None) -> int:
    from . import add_arguments as add_common

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    add_arguments(p)
    return int(run_cuda_bench(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
