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


def _cmd_plan(args) -> int:
    """`dot4attn info --plan B,Hq,Hkv,Sq,Sk,D[,v_format]`: the GPU launch plan of one call."""
    from rich.console import Console
    from rich.table import Table

    from . import native

    try:
        fields = args.plan.split(",")
        B, Hq, Hkv, Sq, Sk, D = (int(x) for x in fields[:6])
        v_format = fields[6] if len(fields) > 6 else "q8_0"
        if len(fields) not in (6, 7) or v_format not in native.V_FORMATS:
            raise ValueError
    except ValueError:
        print(f"dot4attn info --plan: expected B,Hq,Hkv,Sq,Sk,D[,float|q8_0|q4_0], got '{args.plan}'", file=sys.stderr)
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
    table = Table(title=f"launch plan: B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} {args.dtype} V={v_format} "
                        f"on {where}", show_header=False)
    for key, value in plan.items():
        table.add_row(key, str(value) if value != "" else "-")
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dot4attn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="library path and version, ONNX Runtime version and EPs, CPU ISA; "
                                    "--plan: the GPU launch plan of a call")
    p.add_argument("--plan", metavar="B,Hq,Hkv,Sq,Sk,D[,V]", help="print the GPU launch plan of this call "
                   "(V: float, q8_0 or q4_0; default q8_0) instead of the library facts")
    p.add_argument("--gpu", metavar="FACTS", help="plan for a described GPU instead of this machine's, e.g. "
                   "sm=90a,sms=132,smem=232448 (no GPU needed)")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="query / output dtype")
    p.add_argument("--route", choices=["auto", "prefill", "decode", "split_k"], default="auto")
    p.add_argument("--no-causal", action="store_true", help="plan a call without causal masking")
    p.add_argument("--overrides", default="", help="plan overrides, e.g. kernel=simt,warps=4 (docs/gpu.md)")
    p.set_defaults(func=lambda a: _cmd_plan(a) if a.plan else _cmd_info(a))

    from . import bench

    p = sub.add_parser("bench", help="benchmark Dot4Attention against ONNX Runtime GQA and numpy")
    bench.add_arguments(p)
    p.set_defaults(func=bench.run_bench)

    from . import e2e

    p = sub.add_parser("e2e", help="end-to-end decode: genai baseline, ORT int8 KV, rewritten folders; "
                                   "table, JSON and plot")
    e2e.add_arguments(p)
    p.set_defaults(func=e2e.run)

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
