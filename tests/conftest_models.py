"""Exported-model cache for the graph-pass tests (imported by tests/passes/test_passes*.py).

Models are exported once per (arch, preset, exporter, seed, torch and transformers versions) under
$DOT4ATTN_MODEL_CACHE (default ~/.cache/dot4attn/models) and reused by every later run; rewritten models go to a
per-session temp folder. Tests needing torch/transformers (or optimum's interpreter) skip cleanly without them.
"""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

import dot4attn  # tests/conftest.py, loaded first, falls back to this checkout's python/ when not installed


def have(mod: str) -> bool:
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


@functools.lru_cache(maxsize=None)
def optimum_python() -> str | None:
    """The interpreter that runs optimum-onnx (it needs transformers < 4.58), or None."""
    from dot4attn.models.export import optimum_python as find

    py = find()
    r = subprocess.run([py, "-c", "import optimum.exporters.onnx"], capture_output=True)
    return py if r.returncode == 0 else None


def need_export(exporter: str) -> None:
    if not (have("torch") and have("transformers")):
        pytest.skip("exports need torch and transformers (pip install '.[models]')")
    if exporter == "optimum" and optimum_python() is None:
        pytest.skip("optimum export needs an interpreter with optimum-onnx (DOT4ATTN_OPTIMUM_PYTHON)")
    if exporter == "transformers" and not have("transformers.exporters"):
        pytest.skip("transformers' own ONNX exporter needs transformers >= 5")


def exported(arch: str, preset: str, exporter: str, seed: int = 0) -> Path:
    """Path of the cached export, exporting it on first use (a lock-free cache: the write is atomic)."""
    need_export(exporter)
    from dot4attn.models.export import cached_export

    return cached_export(arch, preset, exporter, seed)


@functools.lru_cache(maxsize=None)
def ops_available() -> bool:
    try:
        dot4attn.get_library_path()
        return True
    except FileNotFoundError:
        return False


def need_ops() -> None:
    if not ops_available():
        pytest.fail("the dot4attn op library is not found (set DOT4ATTN_LIBRARY or pip install .)")
