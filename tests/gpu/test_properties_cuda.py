"""The property-based tests of tests/ops/test_properties.py on ONNX Runtime's CUDA execution provider: the same
generator (tests/property_cases.py: shapes, dtypes, masks in every broadcast form, V formats, every route, edge
values with NaN / Inf rows and out-of-range blocks) and the same checks against reference.py, on the GPU kernels.
Skips cleanly (test_ort_cuda's autouse fixture) without a CUDA EP or a CUDA build of the library; sessions disable
the CPU fallback, so every node runs on the GPU.

    DOT4ATTN_LIBRARY=<cuda build>/libdot4attn_ops.so pytest -q tests/gpu/test_properties_cuda.py
    DOT4ATTN_FUZZ=long DOT4ATTN_FUZZ_SEED=7 ...   (20x the examples)
"""
from __future__ import annotations

import pytest
from hypothesis import given, seed, settings

import property_cases as P
from conftest import check_packed
from test_ort_cuda import _need_gpu, gpu_attention, gpu_pack  # noqa: F401 (_need_gpu: autouse, skips without CUDA)


pytestmark = pytest.mark.gpu


@seed(P.FUZZ_SEED)
@settings(max_examples=P.examples(600))
@given(case=P.pack_cases())
def test_pack_properties_gpu(case):
    payload, scales = gpu_pack(case.x, case.op, case.fmt_attr)
    what = f"{case!r} EP=CUDA"
    check_packed(case.x, payload, scales, case.fmt, what)
    P.check_pack_policy(case.x, payload, scales, case.fmt, what)


@seed(P.FUZZ_SEED)
@settings(max_examples=P.examples(1500))
@given(case=P.attention_cases())
def test_attention_properties_gpu(case):
    out = gpu_attention(*case.inputs(), v_format=case.v_format, causal=case.causal, route=case.route)
    P.check_attention(out, case.reference(), case, f"{case!r} EP=CUDA")
