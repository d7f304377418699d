"""Acceptance on CUDA: the rewritten tiny Qwen models agree with their originals.

For every pair in the model folder (exported on a machine with torch/transformers by tools/export_gpu_models.py,
then carried over: the GPU machine has no network and may lack the exporters), the ORIGINAL runs on the CPU EP as
the reference and the REWRITTEN model on the CUDA EP with the dot4attn library registered; compare() feeds both a
32-token prompt (512 for the split_k pairs, see the tool) and 32 greedy decode steps (the original's token, the
packed KV cache fed back) and the pair must meet the bars of the CPU pass tests (dot4attn.quality.compare.quality_failures: top-1 >= 95 % for float/q8_0 V, mean KL
<= 1e-3, q4_0 V <= 0.1, q6_0 V <= 5e-3).

Every Dot4Attention / PackK / PackV node must really run on the CUDA EP. session.disable_cpu_ep_fallback (what
test_ort_cuda.py uses on one-op models) cannot be set here: the CUDA EP leaves shape arithmetic to the CPU EP by
design. Instead the rewritten session is profiled and every executed dot4attn node's provider is checked, and
each node of the graph (counts from the manifest) must have run.

Needs only numpy, onnxruntime and the dot4attn package at run time. Environment:
  DOT4ATTN_GPU_MODELS     the model folder (default <repo>/.gpu-models); missing: the tests skip
  DOT4ATTN_LIBRARY        the op library (a CUDA build), as everywhere
  DOT4ATTN_GPU_MODELS_EP  `cpu`: DRY RUN, the rewritten models run on the CPU EP instead (checks this file's logic
                          on a machine without a GPU; proves nothing about the GPU kernels)
"""
from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dot4attn.quality.compare import DecoderSession, compare, quality_failures

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("DOT4ATTN_GPU_MODELS") or ROOT / ".gpu-models")
DRY_RUN = os.environ.get("DOT4ATTN_GPU_MODELS_EP", "cuda") == "cpu"
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
EP = CPU if DRY_RUN else CUDA
D4A_OPS = ("Dot4Attention", "PackK", "PackV")
STEPS = 32  # as tests/test_passes.py (prompt: 32 tokens there; per pair here)


def _manifest() -> dict | None:
    try:
        return json.loads((MODELS / "manifest.json").read_text())
    except FileNotFoundError:
        return None


MANIFEST = _manifest()
NAMES = [e["name"] for e in MANIFEST["models"]] if MANIFEST else ["no-model-folder"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The model folder, ready to load: graphs + float32 weights.bin expanded from the carried float16 copy (exact,
    see tools/export_gpu_models.py), in a temp folder so the carried one may be read-only."""
    if not DRY_RUN:
        from test_ort_cuda import _gpu_unavailable_reason  # the GPU suite's skip logic (CUDA EP, CUDA build, device)

        reason = _gpu_unavailable_reason()
        if reason:
            pytest.skip(reason)
    if MANIFEST is None:
        pytest.skip(f"no model folder at {MODELS} (DOT4ATTN_GPU_MODELS): export it with "
                    "`PYTHONPATH=python python3 tools/export_gpu_models.py` on a machine with torch + transformers")
    if MANIFEST.get("format") != 1:
        pytest.fail(f"{MODELS}/manifest.json has format {MANIFEST.get('format')}; re-export with this checkout")
    d = tmp_path_factory.mktemp("gpu-models")
    for f in MODELS.iterdir():
        if f.suffix in (".onnx", ".json"):
            shutil.copy(f, d / f.name)
    w = MANIFEST["weights"]
    np.fromfile(MODELS / w["stored"], "<f2").astype("<f4").tofile(d / w["expand_to"])
    return d


@functools.lru_cache(maxsize=None)
def reference(path: str) -> DecoderSession:
    """The original on the CPU EP, shared by the pairs of one original (compare() resets its cache)."""
    return DecoderSession(path, providers=[CPU])


def d4a_placement(profile: str) -> dict[str, dict[str, set[str]]]:
    """{op type: {node name: providers it ran on}} for the dot4attn nodes in an ONNX Runtime profile."""
    seen: dict[str, dict[str, set[str]]] = {}
    for ev in json.loads(Path(profile).read_text()):
        a = ev.get("args", {})
        if ev.get("cat") == "Node" and a.get("op_name") in D4A_OPS and ev["name"].endswith("_kernel_time"):
            seen.setdefault(a["op_name"], {}).setdefault(ev["name"][:-len("_kernel_time")], set()).add(a["provider"])
    return seen


@pytest.mark.parametrize("name", NAMES)
def test_rewritten_model_agrees_on_cuda(name, models, tmp_path):
    import onnxruntime as ort

    e = next(x for x in MANIFEST["models"] if x["name"] == name)
    so = ort.SessionOptions()
    so.enable_profiling = True  # the profile names the provider of every executed node
    so.profile_file_prefix = str(tmp_path / "d4a")
    new = DecoderSession(str(models / e["rewritten"]), providers=list(dict.fromkeys([EP, CPU])), session_options=so)
    assert new.sess.get_providers()[0] == EP, f"{EP} not created: {new.sess.get_providers()}"
    c = compare(str(models / e["original"]), str(models / e["rewritten"]), prompt_len=e["prompt_len"], steps=STEPS,
                a=reference(str(models / e["original"])), b=new)
    placed = d4a_placement(new.sess.end_profiling())

    ref = e.get("cpu_metrics") or {}
    print(f"{name} on {EP}: top1 {c.top1:.4f} meanKL {c.mean_kl:.2e} max|dlogit| {c.max_abs_logit_diff:.3f}"
          + (f" (CPU EP at export: top1 {ref['top1']:.4f} meanKL {ref['mean_kl']:.2e})" if ref else ""))
    for op in D4A_OPS:
        nodes = placed.get(op, {})
        assert len(nodes) == e["ops"].get(op, 0), f"{op}: {len(nodes)} nodes ran, the graph has {e['ops'].get(op, 0)}"
        off = {n: p for n, p in nodes.items() if p != {EP}}
        assert not off, f"{op} nodes not (only) on {EP}: {off}"
    assert c.positions == e["prompt_len"] + STEPS
    assert not quality_failures(c, e["v_format"]), "\n".join([name] + c.lines())
