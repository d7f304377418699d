"""What `dot4attn e2e` prints and writes: the table (terminal and markdown), the bandwidth model beside each
measured speed-up, the goals with pass/fail, the JSON and the ms/token plot."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .models import OPS_ROWS, ROWS

OURS = ("d4a-q8_0", "d4a-q4_0")
ROW_NUMBER = {row: i + 1 for i, row in enumerate(ROWS)}


def baseline_kv_bytes(results: list[dict], device: str, facts: dict) -> int:
    """KV bytes per token of the bandwidth model's baseline: fp16 K and V on CUDA; on the CPU the baseline model's
    own cache dtype (the builder's CPU models keep an fp32 cache)."""
    if device == "cuda":
        return facts["layers"] * facts["kv_heads"] * facts["head_size"] * 2 * 2
    return next(r["cache_bytes_per_token"] for r in results if r["row"] == "genai" and "cache_bytes_per_token" in r)


def add_ratios(results: list[dict], weight_bytes: int, base_kv: int, answer_tokens: int) -> None:
    """Per timed case: measured tokens/s over row 1's at the same context and batch, and the bandwidth model's
    ratio (weights + baseline KV bytes read per step) / (weights + this row's KV bytes read per step).

    What a user of one request feels, where the case prefilled its own prompt: the time to first token (the
    prompt's prefill, which yields the first token's logits) and the request time of the prompt plus an answer of
    `answer_tokens` tokens (TTFT + answer_tokens x the median ms/token), each also as a time ratio over row 1's
    (below 1: faster than row 1)."""
    row1 = {(r["context"], r["batch"]): r for r in results if r["row"] == "genai" and "ms_per_token" in r}
    for r in results:
        if "ms_per_token" not in r:
            continue
        kv = r["context"] * r["batch"]
        r["model_ratio"] = (weight_bytes + kv * base_kv) / (weight_bytes + kv * r["cache_bytes_per_token"])
        if r.get("prefill_s") is not None:
            r["ttft_s"] = r["prefill_s"]
            r["request_s"] = r["prefill_s"] + answer_tokens * r["ms_per_token"] / 1e3
        ref = row1.get((r["context"], r["batch"]))
        if ref:
            r["ratio"] = r["tokens_per_s"] / ref["tokens_per_s"]
            if "request_s" in r and "request_s" in ref:
                r["ttft_vs_row1"] = r["ttft_s"] / ref["ttft_s"]
                r["request_vs_row1"] = r["request_s"] / ref["request_s"]


def _case(results, row, context, batch):
    return next((r for r in results if r["row"] == row and r.get("context") == context and r.get("batch") == batch
                 and "tokens_per_s" in r), None)


def _step_terms(r: dict, wanted_ms: float) -> str:
    """A speed goal in the row's own measure: its ms/token and the most that would pass."""
    return f"ms/token {r['ms_per_token']:.3g}, wanted <= {wanted_ms:.3g}"


def _speed_goal(results, name, rows, vs, context, batch, goal):
    ref = _case(results, vs, context, batch)
    ours = [r for r in (_case(results, row, context, batch) for row in rows) if r]
    if not ref or not ours:
        return dict(name=name, goal=goal, value=None, passed=None)
    best = max(ours, key=lambda r: r["tokens_per_s"])
    value = best["tokens_per_s"] / ref["tokens_per_s"]
    return dict(name=name, goal=goal, value=value, passed=value >= goal,
                terms=_step_terms(best, ref["ms_per_token"] / goal))  # same batch: tokens/s ratio = step ratio


def _time_goal(results, name, key, rows, context, goal):
    """A time ratio over row 1's (ttft_vs_row1 or request_vs_row1) at batch 1 that must stay at or below `goal`;
    the best of `rows` counts. Its terms: the row's time to first token and the most that would pass (for the
    request, at the row's own ms/token: the answer's time is what it is)."""
    ours = [r for r in (_case(results, row, context, 1) for row in rows) if r and key in r]
    if not ours:
        return dict(name=name, goal=goal, value=None, passed=None, at_most=True)
    best = min(ours, key=lambda r: r[key])
    ref = _case(results, "genai", context, 1)
    if key == "ttft_vs_row1":
        wanted = goal * ref["ttft_s"]
    else:
        wanted = goal * ref["request_s"] - (best["request_s"] - best["ttft_s"])
    return dict(name=name, goal=goal, value=best[key], passed=best[key] <= goal, at_most=True,
                terms=f"TTFT {best['ttft_s']:.3g} s, wanted <= {wanted:.3g} s")


def goals(results: list[dict], device: str, smoke: bool = False) -> list[dict]:
    """The end-to-end goals (ratios of tokens/s, or of batch sizes, over the named row) and whether they pass.
    A smoke run's tiny model says nothing of the real shape's goals: it judges none."""
    if smoke:
        return []
    out = []
    if device == "cpu":
        out.append(_speed_goal(results, "batch 1, 16k: rows 3/4 (best) vs row 1", OURS, "genai", 16384, 1, 2.5))
        out.append(_speed_goal(results, "batch 1, 16k: rows 3/4 (best) vs row 2", OURS, "genai-int8kv", 16384, 1, 1.5))
    else:
        out.append(_speed_goal(results, "batch 1, 128k: row 3 vs row 1", OURS[:1], "genai", 131072, 1, 1.12))
        out.append(_speed_goal(results, "batch 1, 128k: row 4 vs row 1", OURS[1:], "genai", 131072, 1, 1.2))
        out.append(_speed_goal(results, "batch 16, 32k: row 3 vs row 1", OURS[:1], "genai", 32768, 16, 1.35))
        out.append(_speed_goal(results, "batch 16, 32k: row 4 vs row 1", OURS[1:], "genai", 32768, 16, 1.55))
        fits = {r["row"]: r.get("fit_batch") for r in results if "fit_batch" in r}
        ours = [fits[r] for r in OURS if fits.get(r)]
        value = max(ours) / fits["genai"] if ours and fits.get("genai") else None
        fit = dict(name="largest batch of 32k sequences: rows 3/4 (best) vs row 1", goal=1.8, value=value,
                   passed=None if value is None else value >= 1.8)
        if value is not None:
            fit["terms"] = f"batch {max(ours)}, wanted >= {math.ceil(1.8 * fits['genai'])}"
        out.append(fit)
        for row in OURS:
            n = ROW_NUMBER[row]
            for context in (32768, 65536, 131072):
                out.append(_time_goal(results, f"batch 1, {context // 1024}k: row {n} time to first token / row 1's",
                                      "ttft_vs_row1", (row,), context, 1.0))
            out.append(_time_goal(results, f"batch 1, 128k prompt + answer: row {n} request time / row 1's",
                                  "request_vs_row1", (row,), 131072, 0.8))
    for r in results:
        if r["row"] in OURS and "ratio" in r:
            value = r["ratio"] / r["model_ratio"]
            wanted_ms = r["ms_per_token"] * r["ratio"] / (0.9 * r["model_ratio"])  # row 1's step / (0.9 x model)
            out.append(dict(name=f"row {ROW_NUMBER[r['row']]} at {r['context']}, batch {r['batch']}: measured / "
                                 f"bandwidth-model ratio", goal=0.9, value=value, passed=value >= 0.9,
                            terms=_step_terms(r, wanted_ms)))
        if r["row"] in OURS and "tokens_per_s" in r and r["context"] >= 16384:
            g = _speed_goal(results, f"row {ROW_NUMBER[r['row']]} vs row 2 at {r['context']}, batch {r['batch']}",
                            (r["row"],), "genai-int8kv", r["context"], r["batch"], 1.0)
            if g["value"] is not None:
                out.append(g)
    return out


def _mib(x):
    return "-" if x is None else f"{x / 2**20:,.0f}"


def _seconds(r, key, vs):
    """'12.3 (0.91x)': seconds and the time ratio over row 1's; '-' where the case did not prefill its prompt."""
    if r.get(key) is None:
        return "-"
    return f"{r[key]:.3g}" + (f" ({r[vs]:.2f}x)" if vs in r else "")


def table_rows(results: list[dict]) -> list[list[str]]:
    rows = []
    for r in results:
        n = str(ROW_NUMBER[r["row"]])
        if "unavailable" in r:
            cells, note = [], r["unavailable"]
        elif "failed" in r:
            cells, note = [f"{r['context']:,}", str(r["batch"])], f"failed: {r['failed']}"
        elif "fit_batch" in r:
            cells, note = ["fit"], f"largest batch: {r['fit_batch']} ({r['fit_note']})"
        else:
            cells = [f"{r['context']:,}", str(r["batch"]), _seconds(r, "ttft_s", "ttft_vs_row1"),
                     f"{r['ms_per_token']:.2f}", _seconds(r, "request_s", "request_vs_row1"),
                     f"{r['tokens_per_s']:.1f}", f"{r['ratio']:.2f}x" if "ratio" in r else "-",
                     f"{r['model_ratio']:.2f}x", f"{r['kl']:.1e}" if "kl" in r else "-",
                     f"{r['top1']:.2f}" if "top1" in r else "-", _mib(r["cache_bytes"]), _mib(r["memory_bytes"])]
            note = r.get("note", "")
        rows.append([n, r["row"]] + cells + ["-"] * (len(HEADER) - 3 - len(cells)) + [note])
    return rows


# TTFT: the prompt's prefill; request: TTFT + the answer's tokens (facts["answer_tokens"]) at the median ms/token;
# both with their time ratio over row 1's
HEADER = ["#", "row", "context", "batch", "TTFT s (x row 1)", "ms/token", "request s (x row 1)", "tokens/s",
          "x row 1", "model x", "KL vs row 1", "top-1", "cache MiB", "memory MiB", "note"]


def markdown(results: list[dict], goal_list: list[dict], facts: dict) -> str:
    lines = [f"Model: {facts['model']}. Machine: {facts['machine']}.", ""]
    threads = facts.get("settings", {}).get("threads")
    if threads:
        lines += [f"Every row's decoder runs {threads} ONNX Runtime intra-op thread{'s' * (threads > 1)} "
                  "(og.Generator's and the in-place runner's alike).", ""]
    if facts.get("settings", {}).get("cuda_graph"):
        lines += ["Decode steps replay as CUDA graphs: the og.Generator rows with onnxruntime-genai's "
                  "`enable_cuda_graph=1` (a case where that mode fails runs launched and says so), row 4 through "
                  "dot4attn.runtime.inplace.", ""]
    shown = rows_of(results)
    lines += [f"{ROW_NUMBER[row]}. `{row}`: {ROWS[row]}" + ("  " if i < len(shown) - 1 else "")
              for i, row in enumerate(shown)]
    lines += ["",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(results)]
    libraries = library_note(results)
    if libraries:
        lines += ["", libraries]
    if "answer_tokens" in facts:
        lines += ["", f"Request time: the prompt (the context) plus an answer of {facts['answer_tokens']} tokens, "
                      "TTFT + answer tokens x ms/token; x row 1 is a time ratio (below 1: faster)."]
    lines += ["", "| " + " | ".join(GOAL_HEADER) + " |", "|" + "---|" * len(GOAL_HEADER)] if goal_list else []
    lines += ["| " + " | ".join(goal_cells(g)) + " |" for g in goal_list]
    return "\n".join(lines) + "\n"


def _context(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def library_note(results: list[dict]) -> str | None:
    """Which op library (dot4attn.library_digest) measured the dot4attn rows' cases, where any case recorded one: one
    library, or each library with its cells (row, context, x batch where > 1); None on a page that recorded none."""
    cells = [r for r in results if r["row"] in OPS_ROWS and "ms_per_token" in r]
    if not any("library" in r for r in cells):
        return None
    groups: dict[str | None, list[dict]] = {}
    for r in cells:
        groups.setdefault(r.get("library"), []).append(r)
    head = "Op library of the dot4attn rows (sha256 of libdot4attn_ops.so, first 12 digits): "
    if len(groups) == 1:
        return head + f"`{next(iter(groups))}`, every case."
    parts = []
    for lib, rs in groups.items():
        by_row: dict[str, list[str]] = {}
        for r in rs:
            by_row.setdefault(r["row"], []).append(_context(r["context"]) + (f" x{r['batch']}" if r["batch"] > 1
                                                                               else ""))
        where = "; ".join(f"row {ROW_NUMBER[row]} {', '.join(cs)}" for row, cs in by_row.items())
        parts.append(f"`{lib}` ({where})" if lib else f"not recorded ({where})")
    return head + ", ".join(parts) + "."


GOAL_HEADER = ["goal", "measured", "wanted", "", "in the row's own measure"]


def goal_cells(g: dict) -> list[str]:
    """A goal's row of the goals table (markdown and terminal): name, measured ratio, the bar, pass / FAIL / -, and
    the goal in the row's own measure."""
    return [g["name"], "not measured" if g["value"] is None else f"{g['value']:.2f}x",
            f"{'<=' if g.get('at_most') else '>='} {g['goal']}x",
            "-" if g["passed"] is None else ("pass" if g["passed"] else "FAIL"), g.get("terms", "-")]


def print_report(con, results, goal_list, facts) -> None:
    from rich.table import Table

    for row in rows_of(results):
        con.print(f"{ROW_NUMBER[row]}. {row}: {ROWS[row]}")
    table = Table(title=f"end to end: {facts['model']}")
    for h in HEADER:
        table.add_column(h, overflow="fold")
    for cells in table_rows(results):
        table.add_row(*cells)
    con.print(table)
    libraries = library_note(results)
    if libraries:
        con.print(libraries)
    goals_table = Table(title="goals (tokens/s or batch ratios)")
    for h in GOAL_HEADER:
        goals_table.add_column(h)
    colour = {"pass": "[green]pass[/green]", "FAIL": "[red]FAIL[/red]"}
    for g in goal_list:
        name, value, wanted, verdict, terms = goal_cells(g)
        goals_table.add_row(name, value, wanted, colour.get(verdict, verdict), terms)
    if goal_list:
        con.print(goals_table)


def rows_of(results: list[dict]) -> list[str]:
    """The rows the results hold (measured or unavailable), in row order."""
    present = {r["row"] for r in results}
    return [row for row in ROWS if row in present]


def ordered(results: list[dict]) -> list[dict]:
    """Table order: batch, then context, then row; each row's fit search after every case."""
    def key(r):
        fit = "context" not in r
        return (fit, r.get("batch", 0), r.get("context", 0), ROW_NUMBER[r["row"]])
    return sorted(results, key=key)


def output_name(device: str, precision: str, smoke: bool = False) -> str:
    """The stem of the files a run writes into --out: the device (or "smoke"), and the weights' precision where it
    is not the device's default (cuda's fp16, cpu's int4): cuda.json for fp16 weights, cuda-int4.json for int4."""
    if smoke:
        return "smoke"
    return device if precision == DEFAULT_PRECISION.get(device) else f"{device}-{precision}"


DEFAULT_PRECISION = {"cpu": "int4", "cuda": "fp16"}


def render(path: Path, answer_tokens: int | None = None, smoke: bool = False) -> dict[str, Path]:
    """Writes the table, goals and plot of a result file again from its measurements (path: OUT/NAME.json) with
    this report's code: the ratios, TTFT and request times are derived again (for `answer_tokens`, default the
    file's own or 500), nothing is measured. Returns the paths written (the JSON, the markdown, the plot)."""
    data = json.loads(Path(path).read_text())
    facts = data["facts"]
    device = facts.get("settings", {}).get("device") or ("cuda" if "builder -e cuda" in facts["model"] else "cpu")
    facts["answer_tokens"] = answer_tokens or facts.get("answer_tokens") or 500
    results, goal_list = derive(data["results"], facts, device, smoke)
    return write_outputs(Path(path).parent, Path(path).stem, results, goal_list, facts)


def derive(measured: list[dict], facts: dict, device: str, smoke: bool = False) -> tuple[list[dict], list[dict]]:
    """The measured results in table order with everything derived from them (the bandwidth model's baseline into
    facts, ratios, TTFT and request times for facts["answer_tokens"]) and the goals: what a run writes after every
    case, and --render again from a stored file."""
    results = ordered([dict(r) for r in measured])
    facts["baseline_kv_bytes_per_token"] = baseline_kv_bytes(results, device, facts)
    add_ratios(results, facts["weight_bytes"], facts["baseline_kv_bytes_per_token"], facts["answer_tokens"])
    return results, goals(results, device, smoke=smoke)


def write_outputs(out: Path, device: str, results, goal_list, facts) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{device}.json", "md": out / f"{device}.md", "png": out / f"{device}.png"}
    paths["json"].write_text(json.dumps(dict(facts=facts, results=results, goals=goal_list), indent=1) + "\n")
    paths["md"].write_text(markdown(results, goal_list, facts))
    plot(results, paths["png"], facts)
    return paths


def plot(results: list[dict], path: Path, facts: dict) -> None:
    """Left: decode ms/token against context, every row and batch. Right (where cases prefilled their own prompt):
    at batch 1, the time to first token and the request time (TTFT + answer tokens x ms/token) against context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    requests = [r for r in results if r.get("batch") == 1 and r.get("request_s") is not None]
    fig, axes = plt.subplots(1, 2 if requests else 1, figsize=(13 if requests else 8, 5), squeeze=False)
    ax = axes[0][0]
    batches = sorted({r["batch"] for r in results if "batch" in r})
    styles = ["-", "--", ":", "-."]
    for row in ROWS:
        for i, b in enumerate(batches):
            pts = sorted((r["context"], r["ms_per_token"]) for r in results
                         if r["row"] == row and r.get("batch") == b and "ms_per_token" in r)
            if pts:
                ax.plot(*zip(*pts), styles[i % len(styles)], marker="o",
                        label=f"{ROW_NUMBER[row]}. {row}, batch {b}", color=f"C{ROW_NUMBER[row] - 1}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode ms/token (median)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if requests:
        ax = axes[0][1]
        answer = facts.get("answer_tokens", 500)
        for row in ROWS:
            mine = sorted((r for r in requests if r["row"] == row), key=lambda r: r["context"])
            if not mine:
                continue
            color, n = f"C{ROW_NUMBER[row] - 1}", ROW_NUMBER[row]
            ctx = [r["context"] for r in mine]
            ax.plot(ctx, [r["ttft_s"] for r in mine], "-", marker="o", color=color, label=f"{n}. {row}: TTFT")
            ax.plot(ctx, [r["request_s"] for r in mine], "--", marker="s", color=color,
                    label=f"{n}. {row}: TTFT + {answer} tokens")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt (tokens)")
        ax.set_ylabel("seconds, batch 1")
        ax.set_title(f"time to first token and request time (prompt + {answer} tokens)", fontsize=9)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"{facts['model']}\n{facts['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
