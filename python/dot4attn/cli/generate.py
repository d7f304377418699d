"""`dot4attn generate MODEL`: greedy decoding that feeds the (packed) KV cache back, on the CPU or CUDA EP."""
from __future__ import annotations

import sys
import time

from ..model_io import folder_facts, genai_folder_of, is_genai_folder
from ..argtypes import nonnegative_int, positive_int, token_ids
from ..argtypes import EXIT_COULD_NOT_RUN

HELP = "greedy generation with the (packed) KV cache fed back"
DESCRIPTION = """\
Greedy generation: prefills the prompt, then decodes one token at a time with the model's KV cache fed back
(packed, for a rewritten model). Prints the tokens (text with --tokenizer), prefill and decode speed and the
cache's bytes. Takes .onnx decoders, original or rewritten, and onnxruntime-genai folders (docs/genai.md).

  dot4attn generate rewritten.onnx --token-ids '1 17 42' --max-new-tokens 16
  dot4attn generate qwen-genai-d4a/ --prompt 'Hello' --tokenizer qwen-genai-d4a/"""


def add_arguments(p) -> None:
    p.add_argument("model", metavar="MODEL", help="decoder ONNX model (original or rewritten), or an onnxruntime-genai "
                   "folder (run through onnxruntime-genai; its genai_config.json picks the device)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text prompt (needs --tokenizer)")
    src.add_argument("--token-ids", type=token_ids, help="prompt token ids, e.g. '1 17 42'")
    p.add_argument("--tokenizer", metavar="DIR", help="HF tokenizer folder (for --prompt and decoding the output)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens generated after the prompt")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where an .onnx model and --runner inplace run (--runner og: genai_config.json picks)")
    p.add_argument("--threads", type=nonnegative_int, default=0,
                   help="ONNX Runtime intra-op threads (default 0: ONNX Runtime's default)")
    p.add_argument("--runner", choices=["auto", "og", "inplace"], default="auto",
                   help="genai folders: og (onnxruntime-genai's Generator; its genai_config picks the device) or "
                        "inplace (dot4attn.runtime.inplace: ORT with the caches bound in place on --device; runs q4_0 V "
                        "folders and --for-inplace-runner folders too). auto: inplace for --device cuda on a rewritten "
                        "folder, for q4_0 V folders, for folders written for the in-place runner and without "
                        "onnxruntime-genai; og otherwise")
    p.add_argument("--batch", type=positive_int, default=1, help="--runner inplace: decode this many copies of the "
                   "prompt as one batch (default 1)")
    p.add_argument("--no-cuda-graph", action="store_true", help="--runner inplace on --device cuda: launch every "
                   "decode step's kernels from the host instead of replaying them as one CUDA graph")


def run(args) -> int:
    if is_genai_folder(args.model):
        return _run_genai(args)
    folder = genai_folder_of(args.model)
    if folder is not None:
        print(f"dot4attn generate: {args.model} is the decoder of the onnxruntime-genai folder {folder} "
              f"(genai_config.json names it): pass the folder, `dot4attn generate {folder} ...`", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if args.batch != 1:
        print("dot4attn generate: --batch is for genai folders (--runner inplace)", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    tok = None
    if args.prompt is not None:
        if not args.tokenizer:
            print("dot4attn generate: --prompt needs --tokenizer DIR", file=sys.stderr)
            return EXIT_COULD_NOT_RUN
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        ids = tok(args.prompt)["input_ids"]
    else:
        ids = args.token_ids
        if args.tokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(args.tokenizer)
    if not ids:
        print("dot4attn generate: empty prompt", file=sys.stderr)
        return EXIT_COULD_NOT_RUN

    def prog(i, t):
        print(f"\r  token {i}/{args.max_new_tokens}", end="", file=sys.stderr, flush=True)

    from ..model_io import BadModelError
    from ..runtime.session import generate

    try:
        r = generate(args.model, ids, args.max_new_tokens, args.device, progress=prog, threads=args.threads or None)
    except BadModelError as e:  # names the file itself
        print(f"dot4attn generate: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    except Exception as e:  # ORT load/run errors: say which model
        print(f"\ndot4attn generate: {args.model}: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    print(file=sys.stderr)
    print("tokens:", " ".join(map(str, r["tokens"])))
    if tok is not None:
        print("text:", tok.decode(r["tokens"]))
    print(f"prefill {len(ids)} tokens: {r['prefill_tok_s']:.1f} tok/s; decode: {r['decode_tok_s']:.1f} tok/s")
    print(f"KV cache: {r['cache_bytes']} bytes for {r['context']} tokens ({r['cache_bytes_per_token']} bytes/token)")
    return 0


def _genai_runner(args) -> str:
    if args.runner != "auto":
        return args.runner
    facts = folder_facts(args.model)
    if facts.get("v_format") == "q4_0" or _written_for_inplace_runner(args.model):
        return "inplace"  # genai 0.18 gives V the K tensor's width (a q6_0 rows folder's V is narrower too)
    if facts and args.device == "cuda":
        return "inplace"  # --device cuda asks for the cache on the GPU, bound in place: no per-token host copy
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return "inplace"
    return "og"


def _written_for_inplace_runner(folder) -> bool:
    return folder_facts(folder).get("runner") == "inplace"


def _run_inplace(args) -> int:
    """A genai folder through dot4attn.runtime.inplace (the caches live on --device, appended in place)."""
    from ..runtime.decoder import greedy
    from ..runtime.inplace import InPlaceDecoder

    if args.prompt is not None:
        print("dot4attn generate: --runner inplace takes --token-ids (the tokenizer comes with onnxruntime-genai)",
              file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if args.batch < 1:
        print(f"dot4attn generate: --batch must be >= 1, got {args.batch}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    try:
        dec = InPlaceDecoder(args.model, device=args.device, threads=args.threads or None,
                             cuda_graph=False if args.no_cuda_graph else None)
        t0 = time.perf_counter()
        outs = greedy(dec, [args.token_ids] * args.batch, args.max_new_tokens)
        dt = time.perf_counter() - t0
    except Exception as e:  # ORT load/run errors: say which folder
        print(f"dot4attn generate: {args.model}: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    for out in outs:
        print("tokens:", " ".join(map(str, out)))
    print(f"{args.batch} x ({len(args.token_ids)} prompt + {len(outs[0])} new tokens) in {dt:.3f} s (in-place cache "
          f"on {args.device}{', decode steps as a CUDA graph' if dec.cuda_graph else ''}, "
          f"{dec.cache_bytes_per_token()} cache bytes per token and sequence)")
    return 0


def _run_genai(args) -> int:
    """A genai folder under og.Generator (greedy); --prompt goes through the folder's own tokenizer."""
    from ..model_io import GenaiError
    from ..runtime.og import generate as og_generate, import_og

    if _genai_runner(args) == "inplace":
        return _run_inplace(args)
    if _written_for_inplace_runner(args.model):
        print(f"dot4attn generate: {args.model} was rewritten for dot4attn's in-place runner (--for-inplace-runner: "
              "its q4_0 / q6_0 V cache is narrower than K's, which onnxruntime-genai cannot allocate): use --runner "
              "inplace or auto", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    if args.batch != 1:
        print("dot4attn generate: --batch needs --runner inplace", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    try:
        og = import_og()
        tokenizer = None
        if args.prompt is not None:
            tokenizer = og.Tokenizer(og.Model(args.model))
            ids = [int(t) for t in tokenizer.encode(args.prompt)]
        else:
            ids = args.token_ids
        if not ids:
            print("dot4attn generate: empty prompt", file=sys.stderr)
            return EXIT_COULD_NOT_RUN
        t0 = time.perf_counter()
        out = og_generate(args.model, [ids], args.max_new_tokens, threads=args.threads or None)[0]
        dt = time.perf_counter() - t0
    except GenaiError as e:
        print(f"dot4attn generate: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    except Exception as e:  # og load/run errors: say which folder
        print(f"dot4attn generate: {args.model}: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    print("tokens:", " ".join(map(str, out)))
    if tokenizer is not None:
        print("text:", tokenizer.decode(out))
    print(f"{len(ids)} prompt + {len(out)} new tokens in {dt:.3f} s (onnxruntime-genai, greedy)")
    return 0
