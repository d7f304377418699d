"""The `dot4attn` CLI without an optional extra: the model commands name the pip extra that brings what is missing."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dot4attn
from dot4attn.cli.options import EXTRAS, missing_extra_message


def _pyproject() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    pytest.skip("no pyproject.toml above the tests (not a checkout)")


def test_extras_match_pyproject():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads(_pyproject().read_text())["project"]["optional-dependencies"]
    for name, modules in EXTRAS.items():
        dists = {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("-", "_") for req in extras[name]}
        assert dists == set(modules), (name, dists, modules)


def test_message_names_the_smallest_or_the_command_extra():
    assert "[passes]" in missing_extra_message("rewrite", "onnx_ir.passes")
    assert "[models]" in missing_extra_message("export", "onnxscript")
    assert "[passes]" in missing_extra_message("compare", "onnxscript")
    assert "[models]" in missing_extra_message("generate", "transformers")
    assert missing_extra_message("rewrite", "not_a_dot4attn_dependency") is None


def _run_without(modules: list[str], argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    """`dot4attn ARGV` in a fresh interpreter where importing any of `modules` fails."""
    code = ("import sys\n"
            f"for m in {modules!r}:\n"
            "    sys.modules[m] = None\n"
            "from dot4attn.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(dot4attn.__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_rewrite_without_passes_extra(tmp_path):
    r = _run_without(["onnx_ir", "onnxscript"], ["rewrite", "in.onnx", "out.onnx"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "pip install 'dot4attn[passes]'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_export_without_models_extra(tmp_path):
    r = _run_without(["torch", "transformers"], ["export", "--preset", "tiny", "--out", "m.onnx"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "pip install 'dot4attn[models]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
