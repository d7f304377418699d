"""Model subcommands of the `dot4attn` CLI: export, rewrite, generate, compare, demo.

cli.py calls `add_model_commands(subparsers)`. Heavy imports (torch, transformers, onnxscript) happen inside the
commands, so `dot4attn --help` stays fast; when one of those packages is missing, cli.main prints
`missing_extra_message` (which pip extra brings it) instead of a traceback.
"""
from __future__ import annotations

import sys

# pyproject.toml's [project.optional-dependencies] by import name, smallest extra first (tests/cli/test_cli.py
# checks them against pyproject.toml).
# genai holds the passes too: a genai folder is rewritten by them.
EXTRAS = {"passes": ("onnxscript", "onnx_ir"), "genai": ("onnxscript", "onnx_ir", "onnxruntime_genai"),
          "models": ("onnxscript", "onnx_ir", "torch", "transformers")}
# The extra a command is meant to run with: rewrite needs the passes; export and demo export models; generate needs
# transformers for --tokenizer only.
COMMAND_EXTRA = {"rewrite": "passes", "export": "models", "demo": "models", "generate": "models", "e2e": "models"}


def missing_extra_message(command: str, module: str) -> str | None:
    """What to install when `command` failed to import `module`; None when no extra of dot4attn provides it."""
    top = module.partition(".")[0]
    extras = [name for name, modules in EXTRAS.items() if top in modules]
    if not extras:
        return None
    extra = COMMAND_EXTRA.get(command) if COMMAND_EXTRA.get(command) in extras else extras[0]
    note = "; install torch first (e.g. its CPU build), then the extra" if "torch" in EXTRAS[extra] else ""
    return (f"dot4attn {command}: needs {top}, which the [{extra}] extra installs: "
            f"pip install 'dot4attn[{extra}]' (from a checkout: pip install '.[{extra}]'){note}")


def _export_args(p) -> None:
    from .export import EXPORTERS

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="seeded random-weight preset: tiny (head_dim 64), hd128, hd256, small")
    src.add_argument("--hf-dir", metavar="DIR", help="local Hugging Face model folder (Qwen2/Qwen3)")
    p.add_argument("--arch", choices=["qwen2", "qwen3"], default="qwen3", help="with --preset (default qwen3)")
    p.add_argument("--seed", type=int, default=0, help="with --preset (default 0)")
    p.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    p.add_argument("--out", required=True, metavar="PATH", help="output .onnx")


def _export_run(args) -> int:
    from .export import export, export_recipe

    try:
        if args.hf_dir:
            out = export(args.hf_dir, args.out, args.exporter)
        else:
            out = export_recipe(args.arch, args.preset, args.exporter, args.out, args.seed)
    except ModuleNotFoundError:
        raise  # cli.main names the extra that brings it
    except Exception as e:
        from .export import ExportError

        what = "" if isinstance(e, ExportError) else f"{type(e).__name__}: "  # ExportError names the file itself
        print(f"dot4attn export: {what}{e}\n(no output written)", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _compare_args(p) -> None:
    p.add_argument("original", metavar="ORIGINAL")
    p.add_argument("rewritten", metavar="REWRITTEN")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=32, help="teacher-forced decode steps (default 32)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-top1", type=float, default=0.95, help="fail below this top-1 agreement (default 0.95)")
    p.add_argument("--max-kl", type=float, default=1e-3, help="fail above this mean KL (default 1e-3)")
    p.add_argument("--max-logit-diff", type=float, default=None, help="fail above this max |logit diff|")


def _compare_run(args) -> int:
    from .compare import compare

    try:
        c = compare(args.original, args.rewritten, args.prompt_len, args.steps, args.seed, args.batch)
    except Exception as e:
        print(f"dot4attn compare: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for line in c.lines():
        print(line)
    bad = []
    if c.top1 < args.min_top1:
        bad.append(f"top-1 {c.top1:.4f} < {args.min_top1}")
    if c.mean_kl > args.max_kl:
        bad.append(f"mean KL {c.mean_kl:.3e} > {args.max_kl}")
    if args.max_logit_diff is not None and c.max_abs_logit_diff > args.max_logit_diff:
        bad.append(f"max |logit diff| {c.max_abs_logit_diff:.4f} > {args.max_logit_diff}")
    if bad:
        print("FAIL: " + "; ".join(bad), file=sys.stderr)
        return 1
    print("PASS")
    return 0


def add_model_commands(subparsers) -> None:
    from . import demo, generate, rewrite

    commands = [
        ("export", "export a Qwen2/Qwen3 decoder with KV cache to ONNX", _export_args, _export_run),
        ("rewrite", "rewrite an exported decoder onto dot4attn ops (packed KV cache)", rewrite.add_arguments,
         rewrite.run),
        ("generate", "greedy generation with the (packed) KV cache fed back", generate.add_arguments, generate.run),
        ("compare", "prefill + teacher-forced decode on two models: top-1, KL, logits", _compare_args, _compare_run),
        ("demo", "export a tiny Qwen, rewrite it, generate, compare, memory and speed", demo.add_arguments, demo.run),
    ]
    for name, help_text, add_arguments, run in commands:
        p = subparsers.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=run)
