"""The package version, read where it is written: pyproject.toml in a checkout (the line CMakeLists.txt reads too),
the installed distribution's metadata otherwise."""
from __future__ import annotations

import re
from pathlib import Path

_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parents[1]  # the repository root when this file is python/dot4attn/_version.py


def in_checkout() -> bool:
    """True when imported from the repository's python/ folder (pyproject.toml two levels up), not an install."""
    return (ROOT / "pyproject.toml").is_file() and (ROOT / "graph_passes" / "__init__.py").is_file()


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
