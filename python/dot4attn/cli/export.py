"""`dot4attn export`: a Qwen2 / Qwen3 decoder with its KV cache as ONNX (dot4attn.models.export)."""
from __future__ import annotations

import sys

from ..argtypes import nonnegative_int
from ..argtypes import EXIT_COULD_NOT_RUN

HELP = "export a Qwen2/Qwen3 decoder with KV cache to ONNX"
DESCRIPTION = """\
Exports a Qwen2 / Qwen3 decoder with its KV cache as inputs and outputs to ONNX: a seeded random-weight preset
(no download) or a local Hugging Face folder. The result is what `dot4attn rewrite` takes.

  dot4attn export --preset tiny --out tiny.onnx
  dot4attn export --hf-dir ~/models/Qwen3-0.6B --exporter dynamo --out qwen3.onnx"""


def add_arguments(p) -> None:
    from ..models.export import EXPORTERS
    from ..models.recipes import PRESETS

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=sorted(PRESETS),
                     help="seeded random-weight preset: tiny (head_dim 64), hd128, hd256, small")
    src.add_argument("--hf-dir", metavar="DIR", help="local Hugging Face model folder (Qwen2/Qwen3)")
    p.add_argument("--arch", choices=["qwen2", "qwen3"], default="qwen3", help="with --preset: the architecture "
                   "(default qwen3)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="with --preset: the weights' seed (default 0)")
    p.add_argument("--exporter", choices=EXPORTERS, default="dynamo",
                   help="how the decoder is traced to ONNX; the rewrite takes the graphs of every one (docs/passes.md)")
    p.add_argument("--out", required=True, metavar="PATH", help="output .onnx (weights in external data next to it)")


def run(args) -> int:
    from ..models.export import export, export_recipe

    try:
        if args.hf_dir:
            out = export(args.hf_dir, args.out, args.exporter)
        else:
            out = export_recipe(args.arch, args.preset, args.exporter, args.out, args.seed)
    except ModuleNotFoundError:
        raise  # cli.main names the extra that brings it
    except Exception as e:
        from ..models.export import ExportError

        what = "" if isinstance(e, ExportError) else f"{type(e).__name__}: "  # ExportError names the file itself
        print(f"dot4attn export: {what}{e}\n(no output written)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    print(f"wrote {out}")
    return 0
