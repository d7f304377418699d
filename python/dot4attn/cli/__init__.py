"""The `dot4attn` command line: info, bench, e2e, and the model commands (export, rewrite, generate, compare, demo).

Exit status: 0 success; 1 a check failed (compare: the models disagree; bench --require-targets: a target missed);
2 the command could not run (bad option or file, missing extra, error); 130 interrupted (Ctrl-C); 141 the reader of
the output went away (`dot4attn info | head -1`), quietly.
Run `dot4attn VERB --help` for a verb's options.
"""
from __future__ import annotations

import argparse
import os
import sys

from .cli_types import HelpFormatter

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`'s yes


def _print_facts(title: str, rows: list[tuple[str, str]]) -> None:
    """A two-column table on a terminal; plain `key: value` lines when piped, where rich would fit the lines to 80
    columns and cut the library path."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_header=False)
        for key, value in rows:
            table.add_row(key, value)
        Console().print(table)
    else:
        from rich.text import Text

        print(title)
        for key, value in rows:
            print(f"{key}: {Text.from_markup(value).plain}")


def _cmd_info(args) -> int:
    import onnxruntime as ort

    from . import __version__, build_info, get_library_path

    rows = [("package version", __version__)]
    try:
        path = get_library_path()
        info = build_info()
        rows.append(("op library", path))
        rows.append(("library version", info.get("version", "?")))
        rows.append(("CPU ISA chosen", info.get("cpu_isa", "?") + "  (DOT4ATTN_CPU_ISA overrides)"))
        rows.append(("CPU ISAs supported", info.get("cpu_isas", "?")))
        rows.append(("GPU kernels built", info.get("gpu", "?")))
    except (FileNotFoundError, OSError) as e:
        rows.append(("op library", f"[red]not loadable: {e}[/red]"))
    rows.append(("onnxruntime", f"{ort.__version__} ({ort.__file__.rsplit('/', 2)[-2]})"))
    rows.append(("execution providers", ", ".join(ort.get_available_providers())))
    _print_facts("dot4attn", rows)
    return 0


def _cmd_info_or_plan(args) -> int:
    return _cmd_plan(args) if args.plan else _cmd_info(args)


def _cmd_plan(args) -> int:
    """`dot4attn info --plan B,Hq,Hkv,Sq,Sk,D[,v_format]`: the GPU launch plan of one call."""
    from . import native

    try:
        fields = args.plan.split(",")
        B, Hq, Hkv, Sq, Sk, D = (int(x) for x in fields[:6])
        v_format = fields[6] if len(fields) > 6 else "q8_0"
        if len(fields) not in (6, 7) or v_format not in native.V_FORMATS or min(B, Hq, Hkv, Sq, Sk, D) < 1:
            raise ValueError
    except ValueError:
        print(f"dot4attn info --plan: expected B,Hq,Hkv,Sq,Sk,D[,float|q8_0|q4_0] (integers >= 1), got '{args.plan}'",
              file=sys.stderr)
        return 2
    if not native.has_gpu_entries():
        print("dot4attn info --plan: this build of the op library has no GPU kernels", file=sys.stderr)
        return 2
    call = native.make_call(B, Hq, Hkv, Sq, Sk, D, half=args.dtype == "float16", v_format=v_format,
                            causal=not args.no_causal, route=args.route, overrides=args.overrides)
    try:
        plan = native.gpu_plan(call, args.gpu)
    except native.NativeError as e:
        print(f"dot4attn info --plan: {e}", file=sys.stderr)
        return 2
    where = args.gpu or "this machine's GPU"
    _print_facts(f"launch plan: B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} {args.dtype} V={v_format} on {where}",
                 [(key, str(value) if value != "" else "-") for key, value in plan.items()])
    return 0


class _VersionAction(argparse.Action):
    """`--version`: the package's version, and the op library's (with its path) when it loads. Computed when asked,
    so that parsing other options never loads the library."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def version_text() -> str:
    from . import __version__, build_info, get_library_path

    try:
        path = get_library_path()
        library = f"op library {build_info().get('version', '?')} ({path})"
    except Exception as e:  # noqa: BLE001 - --version must answer even when the library is missing or broken
        library = f"op library not loadable: {e}"
    return f"dot4attn {__version__}; {library}"


# The verbs' descriptions (their --help) and their one-line summaries (the top-level --help).
INFO_DESCRIPTION = """\
The package and op library versions, the library's path, ONNX Runtime's version and execution providers, and the
CPU ISA the library chose. With --plan: the GPU launch plan of one attention call instead (docs/gpu.md).

  dot4attn info
  dot4attn info --plan 1,32,8,1,16384,128,q8_0 --gpu sm=90a,sms=132,smem=232448"""

BENCH_DESCRIPTION = """\
Times Dot4Attention (packed K cache, float / q8_0 / q4_0 V) against ONNX Runtime's GroupQueryAttention with a
shared-buffer KV cache and a numpy reference, decode and prefill, per head shape and key length, in one process
with the candidates interleaved. Prints a table and writes bench.json and bench.png into --out (docs/performance.md).

  dot4attn bench --quick
  dot4attn bench --device cuda --heads 32,8,128 --decode-sk 16384,131072"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dot4attn", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--version", action=_VersionAction,
                        help="print the package version and the op library's version and path, then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB")
    p = sub.add_parser("info", help="library path and version, ONNX Runtime version and EPs, CPU ISA; "
                                    "--plan: the GPU launch plan of a call",
                       description=INFO_DESCRIPTION, formatter_class=HelpFormatter)
    p.add_argument("--plan", metavar="B,Hq,Hkv,Sq,Sk,D[,V]", help="print the GPU launch plan of this call "
                   "(V: float, q8_0 or q4_0; default q8_0) instead of the library facts")
    p.add_argument("--gpu", metavar="FACTS", help="with --plan: plan for a described GPU instead of this machine's, "
                   "e.g. sm=90a,sms=132,smem=232448 (no GPU needed)")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                   help="with --plan: query / output dtype")
    p.add_argument("--route", choices=["auto", "prefill", "decode", "split_k"], default="auto",
                   help="with --plan: the op's route attribute (auto: the op picks from Sq and Sk)")
    p.add_argument("--no-causal", action="store_true", help="with --plan: plan a call without causal masking")
    p.add_argument("--overrides", default="", help="with --plan: plan overrides, e.g. kernel=simt,warps=4 "
                   "(docs/gpu.md; default: none)")
    p.set_defaults(func=_cmd_info_or_plan)

    from . import bench

    p = sub.add_parser("bench", help="benchmark Dot4Attention against ONNX Runtime GQA and numpy",
                       description=BENCH_DESCRIPTION, formatter_class=HelpFormatter)
    bench.add_arguments(p)
    p.set_defaults(func=bench.run_bench)

    from . import e2e

    p = sub.add_parser("e2e", help="end-to-end decode: genai baseline, ORT int8 KV, rewritten folders; "
                                   "table, JSON and plot",
                       description=e2e.__doc__, formatter_class=HelpFormatter)
    e2e.add_arguments(p)
    p.set_defaults(func=e2e.run)

    from .cli_models import add_model_commands

    add_model_commands(sub)  # their heavy imports happen when one runs: see main
    return parser


def _quiet_broken_pipe() -> None:
    """The reader of stdout went away (`dot4attn info | head -1`): point stdout at /dev/null so that the
    interpreter's final flush does not report the broken pipe again (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        try:
            code = int(args.func(args) or 0)
        except ModuleNotFoundError as e:  # a package of an optional extra (torch, transformers, onnxscript, ...)
            from .cli_models import missing_extra_message

            message = missing_extra_message(args.command, e.name or "")
            if message is None:
                raise
            print(message, file=sys.stderr)
            return 2
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return code
    except KeyboardInterrupt:
        print("\ndot4attn: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_broken_pipe()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
