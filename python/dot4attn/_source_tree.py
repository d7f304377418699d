"""dot4attn imported from a source checkout (python/ on sys.path, e.g. PYTHONPATH=python) instead of an install.

The wheel puts the repository's graph_passes/ folder at dot4attn/passes; a checkout has it two levels above this
file. `add_passes_finder` maps the name `dot4attn.passes` onto that folder, so `from dot4attn.passes import ...`
(and the passes' relative imports) work the same in both layouts. `package_version` reads the version where it
is written: pyproject.toml in a checkout, the installed distribution's metadata otherwise.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parents[1]  # the repository root when this file is python/dot4attn/_source_tree.py


class _PassesFinder(importlib.abc.MetaPathFinder):
    """Finds `<package>.passes` in the checkout's graph_passes/ folder (its submodules then resolve normally)."""

    def __init__(self, fullname: str, folder: Path):
        self.fullname, self.folder = fullname, folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / "__init__.py",
                                                      submodule_search_locations=[str(self.folder)])


def in_checkout() -> bool:
    """False for an installed package (its passes are a real subfolder) or a copy of python/ alone."""
    return (not (_HERE / "passes").is_dir() and (ROOT / "graph_passes" / "__init__.py").is_file()
            and (ROOT / "pyproject.toml").is_file())


def add_passes_finder(package: str) -> None:
    if not in_checkout():
        return
    fullname = f"{package}.passes"
    if not any(isinstance(f, _PassesFinder) and f.fullname == fullname for f in sys.meta_path):
        sys.meta_path.append(_PassesFinder(fullname, ROOT / "graph_passes"))


def package_version(distribution: str) -> str:
    """pyproject.toml's [project] version in a checkout (the line CMakeLists.txt reads too), else the installed
    distribution's; "0+unknown" when neither is there."""
    if in_checkout():
        m = re.search(r'^version *= *"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
        if m:
            return m.group(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0+unknown"
