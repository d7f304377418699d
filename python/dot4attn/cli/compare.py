"""`dot4attn compare ORIGINAL REWRITTEN`: prefill + teacher-forced decode through both, judged by the rewritten
model's V format's bars (dot4attn.quality.compare)."""
from __future__ import annotations

import sys

from ..argtypes import fraction, nonnegative_float, nonnegative_int, positive_int
from ..argtypes import EXIT_CHECK_FAILED, EXIT_COULD_NOT_RUN

HELP = "prefill + teacher-forced decode on two models: top-1, KL, logits"
DESCRIPTION = """\
Runs both decoders on the same seeded random prompt (prefill) and then teacher-forced decode steps, each step fed
the ORIGINAL model's greedy token, and reports the top-1 agreement of the next-token choice, the mean KL divergence
of the REWRITTEN model's next-token distribution from the ORIGINAL's, and the largest |logit difference|. Two .onnx
decoders: over every prompt position and step. Two onnxruntime-genai folders (the builder's and `dot4attn
rewrite`'s): through og.Generator (a folder written for the in-place runner: dot4attn.runtime.inplace), one sequence, over
the prompt's last position and every step.

  dot4attn compare model.onnx rewritten.onnx --prompt-len 64 --steps 32
  dot4attn compare qwen-genai/ qwen-genai-d4a/

exit status: 0 the models agree (every threshold met); 1 they disagree (a threshold missed: FAIL names it);
2 the comparison could not run (a bad or missing file, models that do not fit together, a bad option)."""


def add_arguments(p) -> None:
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
                        "q4_0 / q6_0 V, whose error moves near-tied argmaxes of random-weight models)")
    p.add_argument("--max-kl", type=nonnegative_float, default=None,
                   help="disagree above this mean KL (default: the rewritten model's V format's bar: 1e-3 for "
                        "float / q8_0 V, 0.1 for q4_0 V, 5e-3 for q6_0 V)")
    p.add_argument("--max-logit-diff", type=nonnegative_float, default=None,
                   help="disagree above this max |logit diff| (default: not checked)")


def run(args) -> int:
    from pathlib import Path

    from ..quality.compare import compare, compare_folders
    from ..model_io import genai_folder_of

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
        from ..model_io import GenaiError

        what = "" if isinstance(e, GenaiError) else f"{type(e).__name__}: "  # GenaiError names the folder itself
        print(f"dot4attn compare: {what}{e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    for line in c.lines():
        print(line)
    # unset bars are the project's for the rewritten model's V format (compare.quality_failures)
    from ..quality.compare import KL_ONLY_FORMATS, MAX_MEAN_KL, MIN_TOP1, rewritten_v_format

    v_format = rewritten_v_format(args.rewritten)
    min_top1 = args.min_top1 if args.min_top1 is not None else 0.0 if v_format in KL_ONLY_FORMATS else MIN_TOP1
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
        return EXIT_CHECK_FAILED
    print("PASS")
    return 0
