"""`dot4attn rewrite IN OUT`: the user-facing entry of the graph passes.

IN is an exported decoder (.onnx; dot4attn.passes.driver) or an onnxruntime-genai model folder (genai_config.json
inside; dot4attn.genai), and OUT the same kind of thing."""
from __future__ import annotations

import sys
from pathlib import Path


def rewrite(src: str, dst: str, v_format: str = "float", route: str = "auto", split_k_min_keys: int = 2048,
            allow_partial: bool = False):
    """Rewrite the ONNX decoder `src` onto dot4attn ops; writes `dst` atomically; returns the RewriteReport."""
    from .passes import RewriteOptions, rewrite_file

    opts = RewriteOptions(v_format=v_format, route=route, split_k_min_keys=split_k_min_keys)
    return rewrite_file(src, dst, opts, allow_partial=allow_partial)


def add_arguments(p) -> None:
    p.add_argument("input", metavar="IN", help="exported decoder (.onnx; external data next to it is read) or an "
                   "onnxruntime-genai model folder (genai_config.json, model.onnx, tokenizer)")
    p.add_argument("output", metavar="OUT", help="rewritten model (.onnx) or, for a genai folder, a new folder; "
                   "written atomically, IN is never changed")
    p.add_argument("--v-format", choices=["float", "q8_0", "q4_0"], default=None,
                   help="V cache format: float (as exported), q8_0 (int8 + fp16 scale / 32) or q4_0 (default: float "
                        "for .onnx files; q8_0 for genai folders, whose K and V caches must share one layout)")
    p.add_argument("--route", choices=["auto", "prefill", "decode", "split_k"], default="auto",
                   help="Dot4Attention route attribute (default auto: Sq > 8 prefill, else decode / split_k); a "
                        "forced route applies to every call: decode/split_k models cannot run a prefill of > 8 "
                        "tokens")
    p.add_argument("--split-k-min-keys", type=int, default=2048, metavar="N",
                   help="auto route: decode steps with at least N keys use split_k (default 2048)")
    p.add_argument("--allow-partial", action="store_true",
                   help="rewrite the layers that match and keep the others float (default: refuse)")


def run(args) -> int:
    from . import genai

    if args.split_k_min_keys < 1:
        print("dot4attn rewrite: --split-k-min-keys must be >= 1", file=sys.stderr)
        return 2
    if genai.is_genai_folder(args.input) or (Path(args.input).is_dir() and not Path(args.input).suffix):
        return _run_genai(args)
    from .passes import RewriteError

    try:
        report = rewrite(args.input, args.output, args.v_format or "float", args.route, args.split_k_min_keys,
                         args.allow_partial)
    except (RewriteError, OSError) as e:  # OSError: reading IN (permissions, I/O errors); writes are RewriteError
        print(f"dot4attn rewrite: {e}\n(no output written)", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    if report.unmatched:
        print(f"warning: kept float (--allow-partial): {', '.join(report.unmatched)}")
    print(f"wrote {args.output}")
    return 0


def _run_genai(args) -> int:
    from .genai import GenaiError, rewrite_folder

    if args.v_format == "float":
        print("dot4attn rewrite: a genai folder's cache is packed: --v-format q8_0 (default) or q4_0", file=sys.stderr)
        return 2
    try:
        report = rewrite_folder(args.input, args.output, args.v_format or "q8_0")
    except GenaiError as e:
        print(f"dot4attn rewrite: {e}\n(no output written)", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    print(f"wrote {args.output}")
    return 0
