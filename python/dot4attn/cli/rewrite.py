"""`dot4attn rewrite IN OUT`: the user-facing entry of the graph passes.

IN is an exported decoder (.onnx; dot4attn.passes.driver) or an onnxruntime-genai model folder (genai_config.json
inside; dot4attn.passes.genai_folder), and OUT the same kind of thing."""
from __future__ import annotations

import sys
from pathlib import Path

from ..formats import CACHE_LAYOUTS, V_FORMATS
from ..model_io import genai_folder_of, is_genai_folder
from ..argtypes import positive_int
from ..argtypes import EXIT_COULD_NOT_RUN

HELP = "rewrite an exported decoder or a genai folder onto dot4attn ops (packed KV cache)"
DESCRIPTION = """\
Rewrites the attention of an exported decoder (.onnx) onto dot4attn's ops with a packed KV cache (K int8 + fp16
scale per 32 values; V float, q8_0, q4_0 or q6_0), or an onnxruntime-genai model-builder folder onto
Dot4GroupQueryAttention (a new folder that og.Generator runs). IN is never changed; OUT is written whole or not at
all. docs/passes.md, docs/genai.md.

  dot4attn rewrite model.onnx rewritten.onnx --v-format q8_0
  dot4attn rewrite qwen-genai/ qwen-genai-d4a/
  dot4attn rewrite qwen-genai/ qwen-genai-d4a-tight/ --cache-layout tight   # no row padding"""


def add_arguments(p) -> None:
    p.add_argument("input", metavar="IN", help="exported decoder (.onnx; external data next to it is read) or an "
                   "onnxruntime-genai model folder (genai_config.json, model.onnx, tokenizer)")
    p.add_argument("output", metavar="OUT", help="rewritten model (.onnx) or, for a genai folder, a new folder; "
                   "written atomically, IN is never changed")
    p.add_argument("--v-format", choices=V_FORMATS, default=None,
                   help="V cache format: float (as exported), q8_0 (int8 + fp16 scale / 32), q4_0 or q6_0 (6-bit; "
                        "on the GPU execution providers at head sizes that are multiples of 64) (default: float for "
                        ".onnx files, where dot4attn's runners size each cache from the graph; q8_0 for genai "
                        "folders, whose q4_0 / q6_0 V caches take the op's pair layout: K and V rows of head-size "
                        "bytes, as onnxruntime-genai allocates them)")
    # --route and --split-k-min-keys default to None so that a genai folder can tell them given from not given
    p.add_argument("--route", choices=["auto", "prefill", "decode", "split_k"], default=None,
                   help="Dot4Attention route attribute (default auto: Sq > 8 prefill, else decode / split_k); a "
                        "forced route applies to every call: decode/split_k models cannot run a prefill of > 8 "
                        "tokens. .onnx files only: a genai folder's Dot4GroupQueryAttention always picks per call")
    p.add_argument("--split-k-min-keys", type=positive_int, default=None, metavar="N",
                   help="auto route: decode steps with at least N keys use split_k (default 2048; for a genai "
                        "folder, the split_k_min_keys attribute of every Dot4GroupQueryAttention)")
    p.add_argument("--allow-partial", action="store_true",
                   help="rewrite the layers that match and keep the others float (default: refuse). .onnx files "
                        "only: a genai folder's layers share one cache layout, so all are rewritten or none")
    p.add_argument("--for-inplace-runner", action="store_true",
                   help="genai folders, --v-format q4_0 or q6_0 only: V rows narrower than K's (q4_0: 224 instead "
                        "of 256 bytes per token and KV head at head size 128) for dot4attn's in-place runner "
                        "(dot4attn generate, dot4attn.runtime.inplace), which og.Generator cannot run (genai gives V "
                        "the K cache's width). Without it a q4_0 / q6_0 folder keeps K and V in two rows of "
                        "head-size bytes (the op's 'pair' cache layout), which og.Generator runs")
    p.add_argument("--cache-layout", choices=CACHE_LAYOUTS, default=None,
                   help="genai folders: Dot4GroupQueryAttention's cache layout (default: pair for --v-format q4_0 / "
                        "q6_0, rows otherwise and with --for-inplace-runner). tight: no 16-byte row padding, on the "
                        "CPU and the GPU: K + q8_0 V 136 instead of 160 bytes per token and KV head at head size 64 (15 %% "
                        "less; 272 instead of 288 at 128); q8_0 V runs under og.Generator, q4_0 / q6_0 V (narrower "
                        "than K) need --for-inplace-runner; the cache must share its past and present buffer "
                        "(genai's past_present_share_buffer, the builder's default)")
    p.add_argument("--rotate-v", action="store_true",
                   help="genai folders: rotate V per head by a Hadamard matrix folded into the V projection and "
                        "o_proj weights (the same model; its cached V quantizes better: on SmolLM2 a third off "
                        "q4_0 V's KL, docs/quality.md). Float weights and a power-of-2 head size only")


def run(args) -> int:
    if args.split_k_min_keys is not None and args.split_k_min_keys < 1:
        print(f"dot4attn rewrite: --split-k-min-keys must be >= 1, got {args.split_k_min_keys}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if is_genai_folder(args.input) or (Path(args.input).is_dir() and not Path(args.input).suffix):
        return _run_genai(args)
    folder = genai_folder_of(args.input)
    if folder is not None:
        print(f"dot4attn rewrite: {args.input} is the decoder of the onnxruntime-genai folder {folder} "
              f"(genai_config.json names it): pass the folder, `dot4attn rewrite {folder} OUT_DIR`\n"
              "(no output written)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if args.for_inplace_runner or args.rotate_v or args.cache_layout is not None:
        flag = ("--for-inplace-runner" if args.for_inplace_runner else "--rotate-v" if args.rotate_v else
                "--cache-layout")
        print(f"dot4attn rewrite: {flag} is for genai folders; an .onnx file is not one", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    from ..passes import RewriteError, RewriteOptions, rewrite_file

    try:
        opts = RewriteOptions(v_format=args.v_format or "float", route=args.route or "auto",
                              split_k_min_keys=args.split_k_min_keys or 2048)
        report = rewrite_file(args.input, args.output, opts, allow_partial=args.allow_partial)
    except (RewriteError, OSError) as e:  # OSError: reading IN (permissions, I/O errors); writes are RewriteError
        print(f"dot4attn rewrite: {e}\n(no output written)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    for line in report.lines():
        print(line)
    if report.unmatched:
        print(f"warning: kept float (--allow-partial): {', '.join(report.unmatched)}")
    print(f"wrote {args.output}")
    return 0


def _run_genai(args) -> int:
    from ..model_io import GenaiError
    from ..passes.genai_folder import rewrite_folder

    if args.v_format == "float":
        print("dot4attn rewrite: a genai folder's cache is packed: --v-format q8_0 (default), q4_0 or q6_0",
              file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    # Options of the .onnx path that mean nothing here are refused, not ignored.
    if args.route not in (None, "auto"):
        print(f"dot4attn rewrite: --route {args.route} is for .onnx files (Dot4Attention's route attribute); a genai "
              "folder's Dot4GroupQueryAttention picks its route per call (prefill for prompts, decode or split_k "
              "by --split-k-min-keys)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if args.allow_partial:
        print("dot4attn rewrite: --allow-partial is for .onnx files; genai gives every layer of a folder the same "
              "cache layout, so a folder's layers are all rewritten or the rewrite is refused", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    try:
        report = rewrite_folder(args.input, args.output, args.v_format or "q8_0",
                                inplace_runner=args.for_inplace_runner, split_k_min_keys=args.split_k_min_keys,
                                rotate_v=args.rotate_v, cache_layout=args.cache_layout)
    except GenaiError as e:
        print(f"dot4attn rewrite: {e}\n(no output written)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    for line in report.lines():
        print(line)
    print(f"wrote {args.output}")
    return 0
