"""The Python package's house, drawn from the code: the rooms of python/dot4attn and graph_passes (installed as
dot4attn.passes) import one way only -- the CLI over the benchmarks, over the runtime / quality / models / passes,
over the core -- the top holds few modules, and no import hook or path trick joins the pieces."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "dot4attn"
PASSES = ROOT / "graph_passes"

# Higher floors may import lower ones, never the other way; rooms on one floor do not import each other unless listed.
FLOORS = {"cli": 4, "bench": 3, "e2e": 3, "quality": 2, "models": 2, "runtime": 1, "passes": 1, "core": 0}
# quality judges runtime decoders; eval --smollm2 builds its real-weight models (models); e2e reuses bench's report.
SIDEWAYS = {("quality", "runtime"), ("quality", "models"), ("e2e", "bench"), ("passes", "passes")}
CORE = {"__init__", "__main__", "_version", "native", "reference", "formats", "onnx_builders", "model_io", "argtypes"}


def _room(module: str) -> str:
    """'dot4attn.runtime.og' -> 'runtime'; top-level modules -> 'core' (__main__ is the CLI's entry)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in FLOORS:  # a top-level module, or a name the package's __init__ holds
        return "cli" if parts[-1] == "__main__" else "core"
    return parts[1]


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "passes":  # the link to graph_passes: read there
            continue
        yield "dot4attn." + ".".join(rel.with_suffix("").parts), path
    for path in sorted(PASSES.glob("*.py")):
        yield "dot4attn.passes." + path.stem, path


def _imports(module: str, path: Path):
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            yield from (n for n in names if n.startswith("dot4attn"))
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("dot4attn"))


def test_imports_run_one_way():
    wrong = []
    for module, path in _modules():
        src = _room(module)
        for target in _imports(module, path):
            dst = _room(target)
            if target in ("dot4attn", "dot4attn.__init__"):
                dst = "core"
            if src == dst or (src, dst) in SIDEWAYS:
                continue
            if FLOORS[dst] >= FLOORS[src]:
                wrong.append(f"{module} ({src}) imports {target} ({dst})")
    assert not wrong, "\n".join(wrong)


def test_the_top_of_the_package_is_small_and_has_no_import_hook():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(top) <= CORE and len(top) <= 12, top
    rooms = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__"))
    assert rooms == ["bench", "cli", "e2e", "models", "passes", "quality", "runtime"], rooms
    assert (PACKAGE / "passes").resolve() == PASSES  # graph_passes/ is dot4attn.passes (pyproject.toml packages it)
    for _, path in _modules():
        text = path.read_text()
        for trick in ("sys.meta_path", "MetaPathFinder", "sys.path.insert", "sys.path.append"):
            assert trick not in text, f"{path}: {trick}"


def test_bytes_per_token_is_defined_once():
    """Row bytes and bytes-per-token arithmetic live in dot4attn.formats; other modules call it."""
    for module, path in _modules():
        if module == "dot4attn.formats":
            continue
        text = path.read_text()
        for formula in ("// 2 if", "+ 15) // 16", "// 16) * 16", "2 * (d // 32)", "2 * d // 32"):
            assert formula not in text, f"{path}: restates a cache format ({formula!r}); use dot4attn.formats"
