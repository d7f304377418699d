"""`dot4attn demo`: export a tiny random-weight Qwen, rewrite it onto dot4attn, generate with both, and print the
comparison, the KV-cache memory table and the speed. Runs in about a minute on 2 CPU cores."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..formats import V_FORMATS, bytes_per_token
from ..argtypes import positive_int
from ..argtypes import EXIT_COULD_NOT_RUN

HELP = "export a tiny Qwen, rewrite it, generate, compare, memory and speed"

# Real-model cache layouts for the memory table: (name, layers, kv heads, head dim).
REAL_LAYOUTS = [("Qwen2.5-0.5B", 24, 2, 64), ("Qwen2.5-7B", 28, 4, 128), ("Qwen3-8B", 36, 8, 128)]


DESCRIPTION = __doc__


def add_arguments(p) -> None:
    from ..models.export import EXPORTERS
    from ..models.recipes import PRESETS

    p.add_argument("--arch", choices=["qwen2", "qwen3"], default="qwen3", help="the tiny model's architecture")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="seeded random-weight preset: tiny (head_dim 64), hd128, hd256, small")
    p.add_argument("--exporter", choices=EXPORTERS, default="dynamo",
                   help="how the decoder is traced to ONNX (docs/passes.md)")
    p.add_argument("--v-format", choices=V_FORMATS, default="q8_0",
                   help="V cache format of the rewritten model (K is always packed q8_0)")
    p.add_argument("--new-tokens", type=positive_int, default=32, help="tokens each model generates")
    p.add_argument("--workdir", default=None, help="where the models go (default: $DOT4ATTN_MODEL_CACHE/demo, "
                   "else ~/.cache/dot4attn/models/demo)")


def console():
    """rich's Console for the demo's report: a terminal's width on a terminal; 150 columns into a pipe or a log,
    where rich would otherwise fit every line to 80 columns and break the model paths and table rows."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=150)


def run(args) -> int:
    from rich.table import Table

    from ..models.export import cached_export, model_cache_dir
    from ..passes import RewriteError, RewriteOptions, rewrite_file
    from ..quality.compare import MAX_MEAN_KL, compare
    from ..runtime.session import DecoderSession, generate

    con = console()
    work = Path(args.workdir) if args.workdir else model_cache_dir() / "demo"
    work.mkdir(parents=True, exist_ok=True)

    con.rule("[bold]1. export")
    t = time.perf_counter()
    try:
        src = cached_export(args.arch, args.preset, args.exporter)
    except ModuleNotFoundError:
        raise  # cli.main names the extra that brings it
    except Exception as e:  # the demo could not run (exit 2); 1 is kept for agreement below the thresholds
        print(f"dot4attn demo: export failed: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    con.print(f"{args.arch} preset {args.preset} (seeded random weights), exporter {args.exporter}: {src} "
              f"({time.perf_counter() - t:.1f}s)")

    con.rule("[bold]2. rewrite")
    dst = work / f"{src.stem}.d4a-{args.v_format}.onnx"
    try:
        rep = rewrite_file(str(src), str(dst), RewriteOptions(v_format=args.v_format))
    except RewriteError as e:
        print(f"dot4attn demo: rewrite refused: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    for line in rep.lines():
        con.print("  " + line)

    con.rule("[bold]3. generate (greedy, same prompt)")
    a, b = DecoderSession(str(src)), DecoderSession(str(dst))
    prompt = [1, 17, 42, 99, 7, 256, 311, 5, 64, 128, 900, 33, 2 + 21, 400, 401, 402]
    ga = generate(str(src), prompt, args.new_tokens, session=a)
    gb = generate(str(dst), prompt, args.new_tokens, session=b)
    same = sum(x == y for x, y in zip(ga["tokens"], gb["tokens"]))
    con.print(f"original : {' '.join(map(str, ga['tokens']))}")
    con.print(f"dot4attn : {' '.join(map(str, gb['tokens']))}")
    con.print(f"identical tokens: {same}/{len(ga['tokens'])} (free-running greedy: one flip changes the rest)")

    con.rule("[bold]4. compare (32-token prefill + 32 teacher-forced decode steps)")
    c = compare(str(src), str(dst), a=a, b=b)
    for line in c.lines()[:4]:
        con.print("  " + line)

    con.rule("[bold]5. KV-cache memory (bytes per token, batch 1, all layers)")
    s0, s1 = a.cache_bytes_per_token(), b.cache_bytes_per_token()
    con.print(f"this model: original float32 K+V {s0} B -> dot4attn (K q8_0, V {args.v_format}) {s1} B: "
              f"{s0 / s1:.2f}x smaller ({s0 * 32768 / 2**20:.0f} -> {s1 * 32768 / 2**20:.0f} MiB at 32k tokens)")
    tab = Table("real layout", "fp16 K+V", "K q8_0 + V fp16", "K q8_0 + V q8_0", "K q8_0 + V q4_0")
    for name, nl, hkv, d in REAL_LAYOUTS:
        f16 = bytes_per_token(nl, hkv, d, "float16", "float16", layout="split")
        row = [f"{name} ({nl}L, {hkv} KV heads, D {d})", f"{int(f16)}"]
        for vf in ("float16", "q8_0", "q4_0"):
            q = bytes_per_token(nl, hkv, d, "q8_0", vf, layout="split")
            row.append(f"{int(q)} ({f16 / q:.2f}x)")
        tab.add_row(*row)
    con.print(tab)
    con.print("(x = smaller than an fp16 cache; at 32k tokens multiply by 32768)")

    con.rule("[bold]6. speed (this process, CPU EP)")
    sp = Table("", "prefill tok/s", "decode tok/s")
    sp.add_row("original", f"{ga['prefill_tok_s']:.0f}", f"{ga['decode_tok_s']:.0f}")
    sp.add_row("dot4attn", f"{gb['prefill_tok_s']:.0f}", f"{gb['decode_tok_s']:.0f}")
    con.print(sp)
    con.print("(a tiny model is dominated by per-op overhead; `dot4attn bench` measures the attention op itself)")
    ok = c.top1 >= 0.95 and c.mean_kl <= MAX_MEAN_KL[args.v_format]
    con.print("[green]demo OK" if ok else "[red]demo: agreement below the acceptance thresholds")
    return 0 if ok else 1
