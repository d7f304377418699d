"""`dot4attn info`: the package and op library versions and facts; `--plan`: the GPU launch plan of one call."""
from __future__ import annotations

import sys

from ..argtypes import EXIT_COULD_NOT_RUN

HELP = "library path and version, ONNX Runtime version and EPs, CPU ISA; --plan: the GPU launch plan of a call"
DESCRIPTION = """\
The package and op library versions, the library's path, ONNX Runtime's version and execution providers, and the
CPU ISA the library chose. With --plan: the GPU launch plan of one attention call instead (docs/gpu.md).

  dot4attn info
  dot4attn info --plan 1,32,8,1,16384,128,q8_0 --gpu sm=90a,sms=132,smem=232448"""


def add_arguments(p) -> None:
    p.add_argument("--plan", metavar="B,Hq,Hkv,Sq,Sk,D[,V]", help="print the GPU launch plan of this call "
                   "(V: float, q8_0, q4_0 or q6_0; default q8_0) instead of the library facts")
    p.add_argument("--gpu", metavar="FACTS", help="with --plan: plan for a described GPU instead of this machine's, "
                   "e.g. sm=90a,sms=132,smem=232448 (no GPU needed)")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                   help="with --plan: query / output dtype")
    p.add_argument("--route", choices=["auto", "prefill", "decode", "split_k"], default="auto",
                   help="with --plan: the op's route attribute (auto: the op picks from Sq and Sk)")
    p.add_argument("--no-causal", action="store_true", help="with --plan: plan a call without causal masking")
    p.add_argument("--overrides", default="", help="with --plan: plan overrides, e.g. kernel=simt,warps=4 "
                   "(docs/gpu.md; default: none)")


def run(args) -> int:
    return _plan(args) if args.plan else _info(args)


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


def _info(args) -> int:
    import onnxruntime as ort

    from .. import __version__, build_info, get_library_path, library_digest

    rows = [("package version", __version__)]
    try:
        path = get_library_path()
        info = build_info()
        rows.append(("op library", path))
        rows.append(("library sha256", f"{library_digest()}...  (what `dot4attn e2e` records with its cases)"))
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


def _plan(args) -> int:
    """`dot4attn info --plan B,Hq,Hkv,Sq,Sk,D[,v_format]`: the GPU launch plan of one call."""
    from .. import formats, native

    try:
        fields = args.plan.split(",")
        B, Hq, Hkv, Sq, Sk, D = (int(x) for x in fields[:6])
        v_format = fields[6] if len(fields) > 6 else "q8_0"
        if len(fields) not in (6, 7) or v_format not in formats.V_FORMATS or min(B, Hq, Hkv, Sq, Sk, D) < 1:
            raise ValueError
    except ValueError:
        print(f"dot4attn info --plan: expected B,Hq,Hkv,Sq,Sk,D[,{'|'.join(formats.V_FORMATS)}] (integers >= 1), "
              f"got '{args.plan}'", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if not native.has_gpu_entries():
        print("dot4attn info --plan: this build of the op library has no GPU kernels", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    call = native.make_call(B, Hq, Hkv, Sq, Sk, D, half=args.dtype == "float16", v_format=v_format,
                            causal=not args.no_causal, route=args.route, overrides=args.overrides)
    try:
        plan = native.gpu_plan(call, args.gpu)
    except native.NativeError as e:
        print(f"dot4attn info --plan: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    where = args.gpu or "this machine's GPU"
    _print_facts(f"launch plan: B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} {args.dtype} V={v_format} on {where}",
                 [(key, str(value) if value != "" else "-") for key, value in plan.items()])
    return 0
