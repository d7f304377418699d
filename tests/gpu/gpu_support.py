"""Helpers of the GPU kernel tests: numpy inputs as CUDA tensors and masks as the C entry takes them. (The
`torch_cuda` fixture that skips without torch, a CUDA device or GPU kernels lives in tests/conftest.py.)"""
from __future__ import annotations

import numpy as np

from dot4attn import formats


def to_device(torch, a: np.ndarray | None):
    """A numpy array as a CUDA tensor (bool masks as uint8, the C entry's bool)."""
    if a is None:
        return None
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def mask_strides(mask: np.ndarray | None, shape) -> tuple[int, int, int, int]:
    """Element strides of `mask` broadcast to [B, Hq, Sq, Sk] (0 where broadcast), as the C entry takes them."""
    if mask is None:
        return (0, 0, 0, 0)
    view = np.broadcast_to(np.ascontiguousarray(mask), shape)
    return tuple(s // view.itemsize for s in view.strides)


def packed_layout(D, v_format, kv_rows, half=True):
    """The row layout of a packed cache: K rows of D payload bytes + D/32 fp16 scales padded to 16 bytes, V rows the
    same (q8_0), D/2 (q4_0) or 3D/4 (q6_0) bytes + scales, or float V as T rows padded by 16 bytes."""
    k_row = formats.row_bytes(D)
    if v_format == "float":
        v_stride, vs_stride = D + 16 // (2 if half else 4), 0
    else:
        v_row = formats.row_bytes(D, v_format)
        v_stride, vs_stride = v_row, v_row // 2
    return {"kv_rows": kv_rows, "k_stride": k_row, "ks_stride": k_row // 2, "v_stride": v_stride,
            "vs_stride": vs_stride}


# The AMD GPUs the HIP build targets, as the planner takes them (docs/gpu.md, "AMD GPUs"): 64 KB of LDS per block each;
# MI300X (gfx942, 304 CUs) and MI250X / MI250 (gfx90a, 110 / 104 CUs per die) run 64-wide waves, RDNA3 (gfx1100: the
# Radeon RX 7900 XTX's 96 CUs, a 48-CU part) 32-wide ones.
AMD_DEVICES = {"mi300": "hip,cus=304,warp=64,smem=65536", "mi250x": "hip,cus=110,warp=64,smem=65536",
               "mi250": "hip,cus=104,warp=64,smem=65536", "gfx1100_96": "hip,cus=96,warp=32,smem=65536",
               "gfx1100_48": "hip,cus=48,warp=32,smem=65536"}
AMD_LDS = 65536


def q6_d_message(D: int) -> str:
    """The GPU planner's error for q6_0 V at a head size that is not a multiple of 64 (launch_plan.cu)."""
    return (f"Dot4Attention GPU plan: q6_0 V on the GPU needs D a multiple of 64 (its rows of 3 D / 4 bytes move in "
            f"16-byte pieces), got D={D} (the CPU execution provider takes every D)")
