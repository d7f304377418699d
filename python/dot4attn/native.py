"""The op library's C entries, declared once (ctypes): build facts, the CPU ISA switch, and the GPU planner and
kernel entry.

The GPU entries bypass ONNX Runtime: device pointers and a stream the caller owns, so the benchmark can time the
kernels alone and the GPU tests can force any launch plan (overrides such as ``"kernel=simt,warps=4"``; the keys
are listed in custom_ops/gpu/launch_plan.h and docs/gpu.md). ``gpu_plan`` also works without a GPU when the
device is described (``device="sm=90a,sms=132,smem=232448"``), in any build with CUDA kernels.
"""
from __future__ import annotations

import ctypes
import functools
import json

from . import get_library_path

ROUTES = {"auto": 0, "prefill": 1, "decode": 2, "split_k": 3}
V_FORMATS = {"float": 0, "q8_0": 1, "q4_0": 2}
MASK_KINDS = {None: 0, "bool": 1, "additive": 2}
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
              overrides: str = "", mask_kind: str | None = None, mask_strides=(0, 0, 0, 0)) -> GpuCall:
    """A GpuCall for a shape; pointers stay null (set them for gpu_attention)."""
    c = GpuCall(B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, split_k_min_keys=split_k_min_keys, D=D, half=int(half),
                v_format=V_FORMATS[v_format], causal=int(causal), route=ROUTES[route],
                mask_kind=MASK_KINDS[mask_kind], scale=scale)
    c.mask_strides[:] = list(mask_strides)
    c.overrides = overrides.encode()
    return c


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
    torch's current stream when called. q: [B, Hq, Sq, D] f16/f32; kp/ks: packed K; v/vs: V as the format says."""

    def __init__(self, q, kp, ks, v, vs, out, *, v_format: str, causal: bool = True, route: str = "auto",
                 overrides: str = "", scale: float = 0.0, mask=None, mask_kind: str | None = None,
                 mask_strides=(0, 0, 0, 0), split_k_min_keys: int = 2048):
        import torch

        self.torch = torch
        B, Hq, Sq, D = q.shape
        self.tensors = (q, kp, ks, v, vs, mask, out)  # kept alive while the call holds their pointers
        self.call = make_call(B, Hq, kp.shape[1], Sq, kp.shape[2], D, half=q.dtype == torch.float16,
                              v_format=v_format, causal=causal, route=route, overrides=overrides, scale=scale,
                              mask_kind=mask_kind if mask is not None else None, mask_strides=mask_strides,
                              split_k_min_keys=split_k_min_keys)
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
