"""The documented install lines bring what their commands need: every extra a model command uses holds the graph
passes' packages (`pip install 'dot4attn[genai]'`, docs/genai.md's line, must run `rewrite`), the README's set-up
line is the one CI runs, the README's CPU-only build switch is a real option of the CMake build, and the README
lists the exit codes."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `pip install ... '.[a,b]'` or `'dot4attn[a]'`: the extras of one install of this package
INSTALL = re.compile(r"pip install[^\n`]*?['\"]?(?:\.|dot4attn)\[([a-z0-9_,-]+)\]")


def _extras() -> dict[str, set[str]]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name: {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs} for name, reqs in deps.items()}


def _install_lines() -> list[tuple[str, list[str]]]:
    """(file:line, extras) of every documented install of this package with extras."""
    found = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in INSTALL.finditer(line):
                found.append((f"{doc.relative_to(ROOT)}:{n}", m.group(1).split(",")))
    return found


def test_install_lines_are_found():
    where = {w.split(":")[0] for w, _ in _install_lines()}
    assert {"README.md", "docs/genai.md"} <= where, where


def test_every_command_extra_holds_the_passes():
    extras = _extras()
    for name in extras:
        if name not in ("passes", "test"):
            # genai: rewrite GENAI_DIR; models: demo and e2e rewrite what they export or build
            assert extras["passes"] <= extras[name], f"extra {name!r} lacks {extras['passes'] - extras[name]}"


@pytest.mark.parametrize("where,names", [pytest.param(w, n, id=w) for w, n in _install_lines()])
def test_documented_install_line_runs_its_commands(where, names):
    extras = _extras()
    unknown = set(names) - set(extras)
    assert not unknown, f"{where}: extras {unknown} are not in pyproject.toml"
    if set(names) - {"test"}:  # a line for commands (not the op tests alone): each of them may rewrite
        brought = set().union(*(extras[n] for n in names))
        assert extras["passes"] <= brought, f"{where}: installs {names} without the passes' {extras['passes']}"


def test_readme_setup_is_what_ci_installs():
    readme = (ROOT / "README.md").read_text()
    setup = next(line for line in readme.splitlines() if "pip install" in line and "dot4attn demo" in line)
    (readme_extras,) = INSTALL.findall(setup)
    ci = INSTALL.findall((ROOT / ".ci" / "run").read_text())
    assert readme_extras in ci, f"README installs [{readme_extras}], .ci/run {ci}"
    assert {"test", "models", "genai"} <= set(readme_extras.split(","))  # the tests, demo, and genai folders


def test_readme_names_every_extra():
    readme = (ROOT / "README.md").read_text()
    for name in _extras():
        assert f"`{name}`" in readme, f"README does not name the extra {name!r}"


def test_cpu_only_switch_is_a_cmake_option():
    readme = (ROOT / "README.md").read_text()
    assert "-C cmake.define.DOT4ATTN_CUDA=OFF" in readme
    gpu = (ROOT / "cmake" / "gpu.cmake").read_text()
    assert re.search(r'set\(DOT4ATTN_CUDA "AUTO" CACHE STRING', gpu)
    assert re.search(r"PROPERTY STRINGS[^)]*\bOFF\b", gpu)
    # the build says, where pip -v shows it, that the CUDA kernels take minutes and how to skip them
    assert re.search(r"message\(STATUS[^)]*CUDA kernels takes minutes[^)]*DOT4ATTN_CUDA=OFF", gpu)


def test_readme_documents_the_exit_codes():
    from dot4attn.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
    from dot4attn.argtypes import EXIT_CHECK_FAILED as EXIT_DISAGREE, EXIT_COULD_NOT_RUN

    text = " ".join((ROOT / "README.md").read_text().split())  # line breaks as spaces
    for code, meaning in [(EXIT_DISAGREE, "a check failed (`compare`: the models disagree"),
                          (EXIT_COULD_NOT_RUN, "the command could not run"), (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
                          (EXIT_BROKEN_PIPE, "the reader of the output went away")]:
        assert f"{code} {meaning}" in text, (code, meaning)
