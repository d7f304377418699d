"""What `dot4attn bench` prints and writes, for the CPU and the CUDA bench: console, machine facts, tables, JSON,
plots."""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

from .. import __version__

# --------------------------------------------------------------------------------------------------------------
# console


def console():
    try:
        from rich.console import Console

        if sys.stdout.isatty():
            return Console(highlight=False)
        return Console(highlight=False, width=150)  # logs and pipes: keep table rows on one line
    except ImportError:  # pragma: no cover - rich is a dependency
        return None


def echo(con, *args, **kw):
    if con is not None:
        con.print(*args, **kw)
    else:
        print(*(str(a) for a in args))


# --------------------------------------------------------------------------------------------------------------
# machine facts


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def loadavg() -> tuple[float, float, float] | None:
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def _proc_line(path: str, prefix: str) -> str | None:
    """The first line of /proc/<path> that starts with `prefix`, or None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line
    except OSError:
        pass
    return None


def cpu_model() -> str:
    line = _proc_line("/proc/cpuinfo", "model name")
    return line.split(":", 1)[1].strip() if line else (platform.processor() or platform.machine())


def mem_gib() -> float | None:
    line = _proc_line("/proc/meminfo", "MemTotal:")
    return round(int(line.split()[1]) / 2**20, 1) if line else None


def cpu_flags() -> list[str]:
    line = _proc_line("/proc/cpuinfo", "flags")
    if not line:
        return []
    flags = set(line.split(":", 1)[1].split())
    return sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512bw", "f16c", "fma",
                                             "avx512_bf16", "amx_int8"})


def library_status() -> tuple[bool, str, dict]:
    """(found, its path or why not, its build_info)."""
    try:
        from .. import build_info, get_library_path

        path = get_library_path()
    except Exception as exc:  # noqa: BLE001 - report any failure to find it
        return False, str(exc), {}
    try:
        info = build_info()
    except Exception as exc:  # noqa: BLE001
        info = {"error": str(exc)}
    return True, path, info


def machine_facts(library: tuple[bool, str, dict]) -> dict:
    """This machine, the versions and the op library: the JSON's `machine`."""
    import onnxruntime as ort

    lib_ok, lib_where, lib_info = library
    return {
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "usable_cpus": default_threads(),
        "cpu_flags": cpu_flags(), "mem_gib": mem_gib(), "platform": platform.platform(),
        "python": platform.python_version(), "numpy": np.__version__, "onnxruntime": ort.__version__,
        "dot4attn": __version__, "library": lib_where if lib_ok else None, "build_info": lib_info,
        "DOT4ATTN_CPU_ISA": os.environ.get("DOT4ATTN_CPU_ISA"),
        "loadavg_before": loadavg(),
    }


def machine_line(machine: dict) -> str:
    return f"{machine['cpu']}, {machine['usable_cpus']} cores, {machine['mem_gib']} GiB, ORT {machine['onnxruntime']}"


# --------------------------------------------------------------------------------------------------------------
# JSON


def json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.bool_):
        return bool(o)
    try:
        return float(o)  # e.g. a 0-d tensor
    except (TypeError, ValueError):
        raise TypeError(f"not JSON serialisable: {type(o)}") from None


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, default=json_default))


# --------------------------------------------------------------------------------------------------------------
# CPU tables


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def case_label(c: dict) -> str:
    b = f" B={c['B']}" if c.get("B", 1) != 1 else ""
    sq = "" if c["kind"] == "prefill" or c["Sq"] == 1 else f" Sq={c['Sq']}"
    return f"{c['kind']} ({c['Hq']},{c['Hkv']},{c['D']}){sq} Sk={c['Sk']}{b}"


_TABLE_COLUMNS = [("case", {}), ("candidate", {}), ("median ms", {"justify": "right"}),
                  ("p25-p75 ms", {"justify": "right"}), ("n", {"justify": "right"}),
                  ("x vs GQA f32", {"justify": "right"}), ("KV MiB", {"justify": "right"}),
                  ("KV GB/s", {"justify": "right"}), ("NMSE vs GQA f32", {"justify": "right"})]


def _table_cells(r: dict) -> list[str]:
    """One result row of the full table, case label excluded."""
    sp = r.get("speedup_vs_gqa_f32")
    sp_txt = "-" if sp is None else f"{sp:.2f}x"
    if sp is not None and r["candidate"].startswith("d4a_"):
        sp_txt = f"[bold green]{sp_txt}[/]" if sp >= 1 else f"[red]{sp_txt}[/]"
    err = r.get("nmse_vs_gqa_f32")
    return [r["candidate"], fmt_ms(r["median_ms"]), f"{fmt_ms(r['p25_ms'])}-{fmt_ms(r['p75_ms'])}", str(r["repeats"]),
            sp_txt, f"{r['kv_bytes'] / 2**20:.1f}", f"{r['kv_gb_per_s']:.1f}", "-" if err is None else f"{err:.1e}"]


def print_table(con, results: list[dict], threads: int, machine: str) -> None:
    try:
        from rich.table import Table
    except ImportError:  # pragma: no cover
        for r in results:
            print(r)
        return
    table = Table(title=f"dot4attn bench — CPU, {threads} threads, {machine}", show_lines=False)
    for col, kw in _TABLE_COLUMNS:
        table.add_column(col, **kw)
    last = None
    for r in results:
        label = case_label(r["case"])
        if last is not None and label != last:
            table.add_section()
        table.add_row(label if label != last else "", *_table_cells(r))
        last = label
    con.print(table) if con is not None else print(table)


def print_summary(con, results: list[dict], candidates: list[str], baseline: str) -> None:
    """Compact view: one row per case, per candidate 'median ms (speedup vs the baseline)'."""
    try:
        from rich.table import Table
    except ImportError:  # pragma: no cover
        return
    cands = [c for c in candidates if any(r["candidate"] == c for r in results)]
    table = Table(title="median ms (x = speedup vs GQA f32 share-buffer)")
    table.add_column("case")
    for c in cands:
        table.add_column(c, justify="right")
    for lab in dict.fromkeys(case_label(r["case"]) for r in results):
        cells = []
        for c in cands:
            hit = [r for r in results if r["candidate"] == c and case_label(r["case"]) == lab]
            if not hit:
                cells.append("-")
                continue
            sp = hit[0].get("speedup_vs_gqa_f32")
            cells.append(fmt_ms(hit[0]["median_ms"]) + ("" if sp is None or c == baseline else f" ({sp:.2f}x)"))
        table.add_row(lab, *cells)
    con.print(table) if con is not None else print(table)


def print_targets(con, targets: list[dict]) -> None:
    for t in targets:
        if "max_time_ratio" in t:
            head = f"target {t['candidate']} <= {t['max_time_ratio']:.2f}x the time of {t['baseline']} at {t['case']}: "
            got = None if t["met"] is None else f"measured {t['measured_time_ratio']:.3f}x"
        else:
            head = f"target {t['candidate']} >= {t['required_speedup']:.0f}x vs GQA f32 at {t['case']}: "
            got = None if t["met"] is None else f"measured {t['measured_speedup']:.2f}x"
        if t["met"] is None:
            echo(con, head + "[yellow]not measured in this run[/]")
        else:
            echo(con, head + got + " -> " + ("[bold green]MET[/]" if t["met"] else "[bold red]NOT MET[/]"))


# --------------------------------------------------------------------------------------------------------------
# plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _heads(c: dict) -> tuple[int, int, int]:
    return c["Hq"], c["Hkv"], c["D"]


def _plot_cpu_decode(ax, rows: list[dict], heads, candidates: list[str], colors: dict) -> None:
    for cand in candidates:
        pts = sorted((r["case"]["Sk"], r["median_ms"]) for r in rows if r["candidate"] == cand)
        if pts:
            style = "--" if cand.startswith("gqa") else ":" if cand == "numpy" else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=cand, color=colors[cand])
    ax.set_xscale("log", base=2)
    sks = sorted({r["case"]["Sk"] for r in rows})
    ax.set_xticks(sks, [str(x) for x in sks])
    ax.set_yscale("log")
    ax.set_xlabel("Sk (keys)")
    ax.set_ylabel("median ms per call")
    ax.set_title(f"decode Sq=1, (Hq,Hkv,D)={heads}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _plot_cpu_prefill(ax, prefill: list[dict], candidates: list[str], colors: dict) -> None:
    def label(r):
        return f"({r['case']['Hq']},{r['case']['Hkv']},{r['case']['D']})\nSk={r['case']['Sk']}"

    cases = list(dict.fromkeys(label(r) for r in prefill))
    cands = [c for c in candidates if any(r["candidate"] == c for r in prefill)]
    width = 0.8 / max(len(cands), 1)
    for i, cand in enumerate(cands):
        xs, ys = [], []
        for j, lab in enumerate(cases):
            for r in prefill:
                if label(r) == lab and r["candidate"] == cand:
                    xs.append(j + i * width)
                    ys.append(r["median_ms"])
        ax.bar(xs, ys, width, label=cand, color=colors[cand])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median ms per call")
    ax.set_title("causal prefill Sq=Sk")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot_cpu(results: list[dict], path: Path, threads: int, candidates: list[str]) -> None:
    """One log-log panel per decode head shape (ms vs Sk), one bar panel for the prefill cases."""
    decode_heads = list(dict.fromkeys(_heads(r["case"]) for r in results if r["case"]["kind"] == "decode"))
    prefill = [r for r in results if r["case"]["kind"] == "prefill"]
    n = len(decode_heads) + (1 if prefill else 0)
    if n == 0:
        return
    plt = _pyplot()
    colors = {c: plt.get_cmap("tab10")(i) for i, c in enumerate(candidates)}
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.6), squeeze=False)
    axes = axes[0]
    for ax, heads in zip(axes, decode_heads):
        rows = [r for r in results if r["case"]["kind"] == "decode" and _heads(r["case"]) == heads]
        _plot_cpu_decode(ax, rows, heads, candidates, colors)
    if prefill:
        _plot_cpu_prefill(axes[-1], prefill, candidates, colors)
    fig.suptitle(f"dot4attn bench (CPU, {threads} threads; lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cuda(results: list[dict], path: Path) -> None:
    """Decode kernel time vs Sk, one panel per head shape (the CUDA bench's flat result rows)."""
    plt = _pyplot()
    shapes = sorted({_heads(r) for r in results if r["kind"] == "decode"})
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=(7 * max(1, len(shapes)), 4.5), squeeze=False)
    for ax, sh in zip(axes[0], shapes):
        names = sorted({r["candidate"] for r in results if r["kind"] == "decode" and not r.get("wall_clock")})
        for n in names:
            pts = sorted((r["Sk"], r["us"]) for r in results
                         if r["kind"] == "decode" and _heads(r) == sh and r["candidate"] == n and r.get("us"))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Sk")
        ax.set_ylabel("kernel time (us)")
        ax.set_title(f"decode B=1 (Hq, Hkv, D) = {sh}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
