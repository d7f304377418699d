"""Helpers of the GPU tests (a module, not a conftest: tests/conftest.py stays the one conftest). Kernel tests (test_kernels.py) call the library's C entry on torch CUDA tensors,
so they need torch with a CUDA device and a library built with CUDA kernels; ORT-level tests (test_ort_cuda.py,
test_models_cuda.py) need onnxruntime's CUDA execution provider. Every such test is marked `gpu` and skips with
the reason when its needs are not met. test_plan.py needs no GPU (plans for described devices)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import dot4attn


@functools.lru_cache(maxsize=None)
def torch_cuda_unavailable() -> str | None:
    if dot4attn.build_info().get("gpu") != "cuda":
        return "libdot4attn_ops was built without CUDA kernels"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


@pytest.fixture
def torch_cuda():
    reason = torch_cuda_unavailable()
    if reason:
        pytest.skip(reason)
    import torch

    return torch


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
