"""The `dot4attn` command line: info, bench, and the model commands (export, rewrite, generate, compare, demo)."""
from __future__ import annotations

import argparse
import sys


def _cmd_info(args) -> int:
    import onnxruntime as ort
    from rich.console import Console
    from rich.table import Table

    from . import __version__, build_info, get_library_path

    table = Table(title="dot4attn", show_header=False)
    table.add_row("package version", __version__)
    try:
        path = get_library_path()
        info = build_info()
        table.add_row("op library", path)
        table.add_row("library version", info.get("version", "?"))
        table.add_row("CPU ISA chosen", info.get("cpu_isa", "?") + "  (DOT4ATTN_CPU_ISA overrides)")
        table.add_row("CPU ISAs supported", info.get("cpu_isas", "?"))
        table.add_row("GPU kernels built", info.get("gpu", "?"))
    except (FileNotFoundError, OSError) as e:
        table.add_row("op library", f"[red]not loadable: {e}[/red]")
    table.add_row("onnxruntime", f"{ort.__version__} ({ort.__file__.rsplit('/', 2)[-2]})")
    table.add_row("execution providers", ", ".join(ort.get_available_providers()))
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dot4attn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="library path and version, ONNX Runtime version and EPs, CPU ISA")
    p.set_defaults(func=_cmd_info)

    from . import bench

    p = sub.add_parser("bench", help="benchmark Dot4Attention against ONNX Runtime GQA and numpy")
    bench.add_arguments(p)
    p.set_defaults(func=bench.run_bench)

    from .cli_models import add_model_commands

    add_model_commands(sub)  # their heavy imports happen when one runs: see main
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as e:  # a package of an optional extra (torch, transformers, onnxscript, ...)
        from .cli_models import missing_extra_message

        message = missing_extra_message(args.command, e.name or "")
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
