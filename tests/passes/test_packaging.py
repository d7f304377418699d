"""graph_passes/ is the subpackage dot4attn.passes by packaging, not by an import hook: in a checkout through the
link python/dot4attn/passes -> ../../graph_passes, in the wheel as a real folder (pyproject.toml's wheel.packages
copies it)."""
from __future__ import annotations

import sys
from pathlib import Path

import dot4attn
import dot4attn.passes

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_passes_is_a_plain_subpackage():
    here = Path(dot4attn.__file__).resolve().parent
    assert Path(dot4attn.passes.__file__).parent == here / "passes"  # no finder placed it elsewhere
    hooks = [f for f in sys.meta_path if type(f).__module__.startswith("dot4attn")]
    assert hooks == []


def test_the_checkout_links_graph_passes():
    link = REPO_ROOT / "python" / "dot4attn" / "passes"
    assert link.is_symlink() and link.resolve() == (REPO_ROOT / "graph_passes").resolve()
