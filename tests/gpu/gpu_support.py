"""Helpers of the GPU kernel tests: numpy inputs as CUDA tensors and masks as the C entry takes them. (The
`torch_cuda` fixture that skips without torch, a CUDA device or GPU kernels lives in tests/conftest.py.)"""
from __future__ import annotations

import numpy as np


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
