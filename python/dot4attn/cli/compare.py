"""Model subcommands of the `dot4attn` CLI: export, rewrite, generate, compare, demo.

cli.py calls `add_model_commands(subparsers)`. Heavy imports (torch, transformers, onnxscript) happen inside the
commands, so `dot4attn --help` stays fast; when one of those packages is missing, cli.main prints
`missing_extra_message` (which pip extra brings it) instead of a traceback.
"""
from __future__ import annotations

import sys

from .cli_types import HelpFormatter, fraction, nonnegative_float, nonnegative_int, positive_int

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


EXPORT_DESCRIPTION = """\
Exports a Qwen2 / Qwen3 decoder with its KV cache as inputs and outputs to ONNX: a seeded random-weight preset
(no download) or a local Hugging Face folder. The result is what `dot4attn rewrite` takes.

  dot4attn export --preset tiny --out tiny.onnx
  dot4attn export --hf-dir ~/models/Qwen3-0.6B --exporter dynamo --out qwen3.onnx"""

REWRITE_DESCRIPTION = """\
Rewrites the attention of an exported decoder (.onnx) onto dot4attn's ops with a packed KV cache (K int8 + fp16
scale per 32 values; V float, q8_0 or q4_0), or an onnxruntime-genai model-builder folder onto
Dot4GroupQueryAttention (a new folder that og.Generator runs). IN is never changed; OUT is written whole or not at
all. docs/passes.md, docs/genai.md.

  dot4attn rewrite model.onnx rewritten.onnx --v-format q8_0
  dot4attn rewrite qwen-genai/ qwen-genai-d4a/"""

GENERATE_DESCRIPTION = """\
Greedy generation: prefills the prompt, then decodes one token at a time with the model's KV cache fed back
(packed, for a rewritten model). Prints the tokens (text with --tokenizer), prefill and decode speed and the
cache's bytes. Takes .onnx decoders, original or rewritten, and onnxruntime-genai folders (docs/genai.md).

  dot4attn generate rewritten.onnx --token-ids '1 17 42' --max-new-tokens 16
  dot4attn generate qwen-genai-d4a/ --prompt 'Hello' --tokenizer qwen-genai-d4a/"""


def _export_args(p) -> None:
    from .export import EXPORTERS
    from .recipes import PRESETS

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
        return EXIT_COULD_NOT_RUN
    print(f"wrote {out}")
    return 0


# compare's exit status: a disagreement is an answer, a model that cannot be run is not one (scripts and CI tell them
# apart). 2 is also what argparse and the missing-extra message exit with.
EXIT_DISAGREE = 1
EXIT_COULD_NOT_RUN = 2

COMPARE_DESCRIPTION = """\
Runs both decoders on the same seeded random prompt (prefill) and then teacher-forced decode steps, each step fed
the ORIGINAL model's greedy token, and reports the top-1 agreement of the next-token choice, the mean KL divergence
of the REWRITTEN model's next-token distribution from the ORIGINAL's, and the largest |logit difference|. Two .onnx
decoders: over every prompt position and step. Two onnxruntime-genai folders (the builder's and `dot4attn
rewrite`'s): through og.Generator (a folder written for the in-place runner: dot4attn.inplace), one sequence, over
the prompt's last position and every step.

  dot4attn compare model.onnx rewritten.onnx --prompt-len 64 --steps 32
  dot4attn compare qwen-genai/ qwen-genai-d4a/

exit status: 0 the models agree (every threshold met); 1 they disagree (a threshold missed: FAIL names it);
2 the comparison could not run (a bad or missing file, models that do not fit together, a bad option)."""


def _compare_args(p) -> None:
    p.add_argument("original", metavar="ORIGINAL", help="the reference decoder (.onnx, as exported, or a genai folder)")
    p.add_argument("rewritten", metavar="REWRITTEN", help="the decoder to judge (`dot4attn rewrite`'s .onnx or folder)")
    p.add_argument("--prompt-len", type=positive_int, default=32, help="prompt tokens prefilled")
    p.add_argument("--steps", type=nonnegative_int, default=32,
                   help="teacher-forced decode steps after the prompt (0: the prefill alone)")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences per call, each its own random prompt "
                   "(.onnx files; genai folders: 1)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random prompt tokens")
    p.add_argument("--min-top1", type=fraction, default=None,
                   help="disagree below this top-1 agreement (default: 0.95 for float / q8_0 V; not checked for "
                        "q4_0 V, whose error moves near-tied argmaxes of random-weight models)")
    p.add_argument("--max-kl", type=nonnegative_float, default=None,
                   help="disagree above this mean KL (default: the rewritten model's V format's bar: 1e-3 for "
                        "float / q8_0 V, 0.1 for q4_0 V)")
    p.add_argument("--max-logit-diff", type=nonnegative_float, default=None,
                   help="disagree above this max |logit diff| (default: not checked)")


def _compare_run(args) -> int:
    from pathlib import Path

    from .compare import compare, compare_folders
    from .rewrite import genai_folder_of

    paths = [Path(args.original), Path(args.rewritten)]
    # A genai folder's model.onnx would get DecoderSession's "needs static heads" (the builder's cache dims are
    # symbolic): say to pass the folder, which compare runs through onnxruntime-genai.
    for p in paths:
        folder = genai_folder_of(str(p))
        if folder is not None:
            print(f"dot4attn compare: {p} is the decoder of the onnxruntime-genai folder {folder} (genai_config.json "
                  "names it): compare the folders, `dot4attn compare ORIGINAL_DIR REWRITTEN_DIR`", file=sys.stderr)
            return EXIT_COULD_NOT_RUN
    folders = [p.is_dir() for p in paths]
    if any(folders) and not all(folders):
        what = ["a folder" if p.is_dir() else "a file" if p.exists() else "missing" for p in paths]
        print(f"dot4attn compare: ORIGINAL and REWRITTEN must both be .onnx files or both onnxruntime-genai folders, "
              f"got {paths[0]} ({what[0]}) and {paths[1]} ({what[1]})", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if all(folders) and args.batch != 1:
        print(f"dot4attn compare: --batch {args.batch}: genai folders are compared one sequence at a time "
              "(onnxruntime-genai teacher-forces a batch of one)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    try:
        if all(folders):
            c = compare_folders(args.original, args.rewritten, args.prompt_len, args.steps, args.seed)
        else:
            c = compare(args.original, args.rewritten, args.prompt_len, args.steps, args.seed, args.batch)
    except ModuleNotFoundError:
        raise  # cli.main names the extra that brings it
    except Exception as e:
        from .genai import GenaiError

        what = "" if isinstance(e, GenaiError) else f"{type(e).__name__}: "  # GenaiError names the folder itself
        print(f"dot4attn compare: {what}{e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    for line in c.lines():
        print(line)
    # unset bars are the project's for the rewritten model's V format (compare.quality_failures)
    from .compare import MAX_MEAN_KL, MIN_TOP1, rewritten_v_format

    v_format = rewritten_v_format(args.rewritten)
    min_top1 = args.min_top1 if args.min_top1 is not None else 0.0 if v_format == "q4_0" else MIN_TOP1
    max_kl = args.max_kl if args.max_kl is not None else MAX_MEAN_KL[v_format]
    bad = []
    if c.top1 < min_top1:
        bad.append(f"top-1 {c.top1:.4f} < {min_top1}")
    if c.mean_kl > max_kl:
        bad.append(f"mean KL {c.mean_kl:.3e} > {max_kl}")
    if args.max_logit_diff is not None and c.max_abs_logit_diff > args.max_logit_diff:
        bad.append(f"max |logit diff| {c.max_abs_logit_diff:.4f} > {args.max_logit_diff}")
    if bad:
        print("FAIL: " + "; ".join(bad), file=sys.stderr)
        return EXIT_DISAGREE
    print("PASS")
    return 0


def add_model_commands(subparsers) -> None:
    from . import demo, generate, rewrite

    commands = [
        ("export", "export a Qwen2/Qwen3 decoder with KV cache to ONNX", EXPORT_DESCRIPTION, _export_args,
         _export_run),
        ("rewrite", "rewrite an exported decoder or a genai folder onto dot4attn ops (packed KV cache)",
         REWRITE_DESCRIPTION, rewrite.add_arguments, rewrite.run),
        ("generate", "greedy generation with the (packed) KV cache fed back", GENERATE_DESCRIPTION,
         generate.add_arguments, generate.run),
        ("compare", "prefill + teacher-forced decode on two models: top-1, KL, logits", COMPARE_DESCRIPTION,
         _compare_args, _compare_run),
        ("demo", "export a tiny Qwen, rewrite it, generate, compare, memory and speed", demo.__doc__,
         demo.add_arguments, demo.run),
    ]
    for name, help_text, description, add_arguments, run in commands:
        p = subparsers.add_parser(name, help=help_text, description=description, formatter_class=HelpFormatter)
        add_arguments(p)
        p.set_defaults(func=run)
