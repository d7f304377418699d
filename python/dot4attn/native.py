"""The op library's C entries, declared once (ctypes): build facts, the CPU ISA switch, and the GPU planner and
kernel entry.

The GPU entries bypass ONNX Runtime: device pointers and a stream the caller owns, so the benchmark can time the
kernels alone and the GPU tests can force any launch plan (overrides such as ``"kernel=simt,warps=4"``; the keys
are listed in custom_ops/gpu/launch_plan.h and docs/gpu.md). ``gpu_plan`` also works without a GPU when the
device is described (``device="sm=90a,sms=132,smem=232448"``), in any build with CUDA kernels.

K / V rows may be strided (a packed cache: one uint8 buffer [B, Hkv, kv_rows, row_bytes] whose rows hold a token's
payload and its fp16 scales): the row layout is ``kv_layout`` (KV_LAYOUT_FIELDS; ``kv_layout_of`` reads it off
torch views), all 0 for dense tensors.
"""
from __future__ import annotations

import ctypes
import functools
import json

from . import get_library_path
from .formats import V_FORMAT_CODES

ROUTES = {"auto": 0, "prefill": 1, "decode": 2, "split_k": 3}
MASK_KINDS = {None: 0, "bool": 1, "additive": 2}
# The K / V row layout of a call (struct Dot4AttnGpuCall, AttentionParams): rows per (b, kv head) in storage (>= Sk),
# then the distance between consecutive rows of K (bytes), K scales (halves), V (elements of T for float V, bytes
# for q8_0 / q4_0 / q6_0) and V scales (halves). 0: the dense value.
KV_LAYOUT_FIELDS = ("kv_rows", "k_stride", "ks_stride", "v_stride", "vs_stride")
_ERR_LEN = 1024
_PLAN_LEN = 2048


class GpuCall(ctypes.Structure):
    """struct Dot4AttnGpuCall (custom_ops/attention/attention_gpu_entry.cu)."""

    _fields_ = [
        *[(n, ctypes.c_int64) for n in ("B", "Hq", "Hkv", "Sq", "Sk", "split_k_min_keys")],
        ("mask_strides", ctypes.c_int64 * 4),
        *[(n, ctypes.c_void_p) for n in ("q", "k", "k_scales", "v", "v_scales", "mask", "out", "scratch", "stream")],
        ("overrides", ctypes.c_char_p),
        *[(n, ctypes.c_int32) for n in ("D", "half", "v_format", "causal", "route", "mask_kind")],
        ("scale", ctypes.c_float),
        *[(n, ctypes.c_int64) for n in KV_LAYOUT_FIELDS],
        ("run_as", ctypes.c_char_p),
    ]


class NativeError(RuntimeError):
    """An error reported by a C entry of the op library (the message names the entry and the bad value)."""


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(get_library_path())  # the same handle ORT's register_custom_ops_library loaded
    lib.dot4attn_build_info.restype = ctypes.c_char_p
    lib.dot4attn_force_cpu_isa.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.dot4attn_force_cpu_isa.restype = ctypes.c_int
    if hasattr(lib, "dot4attn_gpu_plan"):
        call = ctypes.POINTER(GpuCall)
        lib.dot4attn_gpu_plan.argtypes = [call, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        lib.dot4attn_gpu_plan.restype = ctypes.c_int
        lib.dot4attn_gpu_attention.argtypes = [call, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                               ctypes.c_size_t]
        lib.dot4attn_gpu_attention.restype = ctypes.c_int
    return lib


def _check(rc: int, err) -> None:
    if rc:
        raise NativeError(err.value.decode(errors="replace"))


def force_cpu_isa(name: str | None) -> None:
    """Makes this process's Dot4Attention / PackK / PackV CPU kernels use ISA `name` (scalar, avx2, avx512vnni;
    None or "auto": the best this CPU has). For tests and comparisons; users set DOT4ATTN_CPU_ISA instead, which is
    read once per process."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    _check(_lib().dot4attn_force_cpu_isa(name.encode() if name else None, err, _ERR_LEN), err)


def has_gpu_entries() -> bool:
    """Whether this build of the library has GPU kernels (and so the planner)."""
    return hasattr(_lib(), "dot4attn_gpu_plan")


def make_call(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, D: int, *, half: bool = True, v_format: str = "q8_0",
              causal: bool = True, route: str = "auto", scale: float = 0.0, split_k_min_keys: int = 2048,
              overrides: str = "", mask_kind: str | None = None, mask_strides=(0, 0, 0, 0),
              kv_layout: dict | None = None, run_as: str | None = None) -> GpuCall:
    """A GpuCall for a shape; pointers stay null (set them for gpu_attention). kv_layout: the K / V row layout, a
    dict of KV_LAYOUT_FIELDS (missing or 0: dense), e.g. a packed cache of D = 128 with rows of 144 bytes and 4096
    rows per head: {"kv_rows": 4096, "k_stride": 144, "ks_stride": 72, "v_stride": 144, "vs_stride": 72}. run_as: a
    described AMD device ("hip,cus=304,warp=64,smem=65536") whose plan the call runs on this CUDA GPU (docs/gpu.md,
    "AMD GPUs"); gpu_plan(call) then gives that plan. q6_0 V needs D a multiple of 64 on the GPU: the planner
    refuses other D (formats.gpu_takes)."""
    c = GpuCall(B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, split_k_min_keys=split_k_min_keys, D=D, half=int(half),
                v_format=V_FORMAT_CODES[v_format], causal=int(causal), route=ROUTES[route],
                mask_kind=MASK_KINDS[mask_kind], scale=scale, run_as=run_as.encode() if run_as else None)
    c.mask_strides[:] = list(mask_strides)
    c.overrides = overrides.encode()
    layout = dict(kv_layout or {})
    unknown = set(layout) - set(KV_LAYOUT_FIELDS)
    if unknown:
        raise ValueError(f"kv_layout: unknown keys {sorted(unknown)} (expected {', '.join(KV_LAYOUT_FIELDS)})")
    for name, value in layout.items():
        setattr(c, name, int(value))
    return c


def kv_layout_of(kp, ks, v, vs=None) -> dict:
    """The K / V row layout (KV_LAYOUT_FIELDS) of torch tensors or views kp [B, Hkv, Sk, D] int8, ks [B, Hkv, Sk,
    D/32] float16, v [B, Hkv, Sk, D] T / int8 or uint8 [B, Hkv, Sk, D/2] (q4_0) / [B, Hkv, Sk, 3D/4] (q6_0), vs [B,
    Hkv, Sk, D/32] float16 (or None), read off their strides: each tensor's rows (last dimension contiguous) a fixed
    number of elements apart, each (b, kv head)'s rows the same number of rows apart in every tensor (kv_rows), heads
    of a batch row next to each other. Dense tensors give the dense layout; views into a packed cache give its
    strides, e.g. for a uint8 buffer
    `buf` [B, Hkv, R, row_bytes] holding K rows (payload at byte 0, scales at byte D):
    kp = buf[:, :, :Sk, :D].view(torch.int8), ks = buf[:, :, :Sk, D:D + D // 16].view(torch.float16).
    Raises ValueError for tensors whose elements are not laid out that way."""
    layout = dict.fromkeys(KV_LAYOUT_FIELDS, 0)
    if kp.numel() == 0:  # no key (or no batch row): nothing is read, whatever the strides (numpy gives 0 for empty)
        return layout
    names = ("K", "K scales", "V", "V scales")
    rows = []
    for name, t in zip(names, (kp, ks, v, vs)):
        if t is None:
            continue
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, Hkv, Sk, X], got shape {tuple(t.shape)}")
        if t.numel() == 0:  # nothing is read: any strides (torch gives empty tensors zeros)
            continue
        B, H, S, X = t.shape
        s0, s1, s2, s3 = t.stride()
        if X > 1 and s3 != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous, strides {t.stride()}")
        if S > 0 and s2 < X:
            raise ValueError(f"{name}: rows overlap (row stride {s2} < row width {X})")
        head = s1 if H > 1 else s0 if B > 1 else None  # elements from one (b, kv head) to the next
        if B > 1 and H > 1 and s0 != H * s1:
            raise ValueError(f"{name}: the kv heads of a batch row must follow each other, strides {t.stride()}")
        if head is not None and (s2 == 0 or head % s2 != 0):
            raise ValueError(f"{name}: heads {head} elements apart are not a whole number of rows of {s2}")
        rows.append((name, s2, None if head is None else head // s2, S))
    per_head = {r for _, _, r, _ in rows if r is not None}
    if len(per_head) > 1:
        raise ValueError("K / V tensors disagree on rows per head: " +
                         ", ".join(f"{n} {r}" for n, _, r, _ in rows if r is not None))
    if not rows or rows[0][3] == 0:
        return layout
    sk = rows[0][3]
    layout["kv_rows"] = per_head.pop() if per_head else sk
    for (_, stride, _, _), key in zip(rows, ("k_stride", "ks_stride", "v_stride", "vs_stride")):
        layout[key] = stride
    return layout


def gpu_plan(call: GpuCall, device: str | None = None) -> dict:
    """The launch plan of `call` as a dict (route, kernel, warps, stages, staging, splits, scratch_bytes,
    fallback, ...), for the current GPU (device None) or for the described one."""
    plan = ctypes.create_string_buffer(_PLAN_LEN)
    err = ctypes.create_string_buffer(_ERR_LEN)
    scratch = ctypes.c_size_t(0)
    rc = _lib().dot4attn_gpu_plan(ctypes.byref(call), device.encode() if device else None, plan, _PLAN_LEN,
                                  ctypes.byref(scratch), err, _ERR_LEN)
    _check(rc, err)
    return json.loads(plan.value.decode())


def gpu_attention(call: GpuCall, return_plan: bool = False) -> dict | None:
    """Plans `call` on the current GPU and enqueues it on call.stream; with return_plan, returns the plan that ran
    (formatting it costs host time, so timed calls leave it off)."""
    plan = ctypes.create_string_buffer(_PLAN_LEN) if return_plan else None
    err = ctypes.create_string_buffer(_ERR_LEN)
    _check(_lib().dot4attn_gpu_attention(ctypes.byref(call), plan, _PLAN_LEN if plan else 0, err, _ERR_LEN), err)
    return json.loads(plan.value.decode()) if plan else None


class TorchAttention:
    """Dot4Attention on torch CUDA tensors through the C entry: plans once, owns the split_k scratch, and runs on
    torch's current stream when called. q: [B, Hq, Sq, D] f16/f32 and out (contiguous); kp/ks: packed K; v/vs: V as
    the format says. K / V may be strided views (a packed cache, see kv_layout_of): kv_layout None reads their row
    layout off the tensors' strides; a dict of KV_LAYOUT_FIELDS gives it explicitly (the tensors' pointers are then
    taken as they are). run_as: a described AMD device whose plan runs here (make_call)."""

    def __init__(self, q, kp, ks, v, vs, out, *, v_format: str, causal: bool = True, route: str = "auto",
                 overrides: str = "", scale: float = 0.0, mask=None, mask_kind: str | None = None,
                 mask_strides=(0, 0, 0, 0), split_k_min_keys: int = 2048, kv_layout: dict | None = None,
                 run_as: str | None = None):
        import torch

        self.torch = torch
        B, Hq, Sq, D = q.shape
        for name, t in (("q", q), ("out", out)):
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        self.tensors = (q, kp, ks, v, vs, mask, out)  # kept alive while the call holds their pointers
        self.kv_layout = kv_layout_of(kp, ks, v, vs) if kv_layout is None else dict(kv_layout)
        self.call = make_call(B, Hq, kp.shape[1], Sq, kp.shape[2], D, half=q.dtype == torch.float16,
                              v_format=v_format, causal=causal, route=route, overrides=overrides, scale=scale,
                              mask_kind=mask_kind if mask is not None else None, mask_strides=mask_strides,
                              split_k_min_keys=split_k_min_keys, kv_layout=self.kv_layout, run_as=run_as)
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        for name, t in zip(("q", "k", "k_scales", "v", "v_scales", "mask", "out"), self.tensors):
            setattr(self.call, name, ptr(t))
        self.plan = gpu_plan(self.call)
        n = self.plan["scratch_bytes"]
        self.scratch = torch.empty(n, dtype=torch.uint8, device=q.device) if n else None
        self.call.scratch = ptr(self.scratch)

    @property
    def out(self):
        return self.tensors[-1]

    def __call__(self, return_plan: bool = False) -> dict | None:
        """Runs on torch's current stream; with return_plan, returns the plan that ran."""
        self.call.stream = self.torch.cuda.current_stream().cuda_stream
        return gpu_attention(self.call, return_plan)
