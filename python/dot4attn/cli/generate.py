"""`dot4attn generate MODEL`: greedy decoding that feeds the (packed) KV cache back, on the CPU or CUDA EP."""
from __future__ import annotations

import sys
import time

import numpy as np

from .compare import DecoderSession, positions


def providers_for(device: str):
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def generate(model: str, token_ids: list[int], max_new_tokens: int, device: str = "cpu", eos: int | None = None,
             progress=None, session: DecoderSession | None = None, threads: int | None = None) -> dict:
    s = session or DecoderSession(model, providers=providers_for(device), threads=threads)
    ids = np.asarray(token_ids, np.int64)[None]
    mask = np.ones_like(ids)
    s.reset(1)
    t0 = time.perf_counter()
    logits = s.step(ids, mask, positions(mask))
    t_prefill = time.perf_counter() - t0
    out: list[int] = []
    t1 = time.perf_counter()
    for i in range(max_new_tokens):
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if progress:
            progress(i + 1, nxt)
        if eos is not None and nxt == eos or i == max_new_tokens - 1:
            break
        mask = np.concatenate([mask, [[1]]], axis=1)
        logits = s.step(np.array([[nxt]]), mask, positions(mask)[:, -1:])
    t_decode = time.perf_counter() - t1
    n_dec = max(len(out) - 1, 0)
    return dict(tokens=out, prefill_s=t_prefill, decode_s=t_decode,
                prefill_tok_s=ids.shape[1] / max(t_prefill, 1e-9), decode_tok_s=n_dec / max(t_decode, 1e-9),
                cache_bytes=s.cache_bytes(), cache_bytes_per_token=s.cache_bytes_per_token(),
                context=int(mask.shape[1]))


def add_arguments(p) -> None:
    from .cli_types import nonnegative_int, positive_int, token_ids

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
                        "inplace (dot4attn.inplace: ORT with the caches bound in place on --device; runs q4_0 V "
                        "folders too). auto: inplace for --device cuda on a rewritten folder, for q4_0 V folders "
                        "and without onnxruntime-genai; og otherwise")
    p.add_argument("--batch", type=positive_int, default=1, help="--runner inplace: decode this many copies of the "
                   "prompt as one batch (default 1)")
    p.add_argument("--no-cuda-graph", action="store_true", help="--runner inplace on --device cuda: launch every "
                   "decode step's kernels from the host instead of replaying them as one CUDA graph")


def run(args) -> int:
    from . import genai

    if genai.is_genai_folder(args.model):
        return _run_genai(args)
    from .rewrite import genai_folder_of

    folder = genai_folder_of(args.model)
    if folder is not None:
        print(f"dot4attn generate: {args.model} is the decoder of the onnxruntime-genai folder {folder} "
              f"(genai_config.json names it): pass the folder, `dot4attn generate {folder} ...`", file=sys.stderr)
        return 2
    if args.batch != 1:
        print("dot4attn generate: --batch is for genai folders (--runner inplace)", file=sys.stderr)
        return 2
    tok = None
    if args.prompt is not None:
        if not args.tokenizer:
            print("dot4attn generate: --prompt needs --tokenizer DIR", file=sys.stderr)
            return 2
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
        return 2

    def prog(i, t):
        print(f"\r  token {i}/{args.max_new_tokens}", end="", file=sys.stderr, flush=True)

    from .model_io import BadModelError

    try:
        r = generate(args.model, ids, args.max_new_tokens, args.device, progress=prog, threads=args.threads or None)
    except BadModelError as e:  # names the file itself
        print(f"dot4attn generate: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # ORT load/run errors: say which model
        print(f"\ndot4attn generate: {args.model}: {e}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    print("tokens:", " ".join(map(str, r["tokens"])))
    if tok is not None:
        print("text:", tok.decode(r["tokens"]))
    print(f"prefill {len(ids)} tokens: {r['prefill_tok_s']:.1f} tok/s; decode: {r['decode_tok_s']:.1f} tok/s")
    print(f"KV cache: {r['cache_bytes']} bytes for {r['context']} tokens ({r['cache_bytes_per_token']} bytes/token)")
    return 0


def _genai_runner(args) -> str:
    from .genai import folder_facts

    if args.runner != "auto":
        return args.runner
    facts = folder_facts(args.model)
    if facts.get("v_format") == "q4_0":
        return "inplace"  # genai 0.18 gives V the K tensor's width
    if facts and args.device == "cuda":
        return "inplace"  # --device cuda asks for the cache on the GPU, bound in place: no per-token host copy
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return "inplace"
    return "og"


def _written_for_inplace_runner(folder) -> bool:
    from .genai import folder_facts

    return folder_facts(folder).get("runner") == "inplace"


def _run_inplace(args) -> int:
    """A genai folder through dot4attn.inplace (the caches live on --device, appended in place)."""
    from .inplace import InPlaceDecoder, greedy

    if args.prompt is not None:
        print("dot4attn generate: --runner inplace takes --token-ids (the tokenizer comes with onnxruntime-genai)",
              file=sys.stderr)
        return 2
    if args.batch < 1:
        print(f"dot4attn generate: --batch must be >= 1, got {args.batch}", file=sys.stderr)
        return 2
    try:
        dec = InPlaceDecoder(args.model, device=args.device, threads=args.threads or None,
                             cuda_graph=False if args.no_cuda_graph else None)
        t0 = time.perf_counter()
        outs = greedy(dec, [args.token_ids] * args.batch, args.max_new_tokens)
        dt = time.perf_counter() - t0
    except Exception as e:  # ORT load/run errors: say which folder
        print(f"dot4attn generate: {args.model}: {e}", file=sys.stderr)
        return 2
    for out in outs:
        print("tokens:", " ".join(map(str, out)))
    print(f"{args.batch} x ({len(args.token_ids)} prompt + {len(outs[0])} new tokens) in {dt:.3f} s (in-place cache "
          f"on {args.device}{', decode steps as a CUDA graph' if dec.cuda_graph else ''}, "
          f"{dec.cache_bytes_per_token()} cache bytes per token and sequence)")
    return 0


def _run_genai(args) -> int:
    """A genai folder under og.Generator (greedy); --prompt goes through the folder's own tokenizer."""
    from .genai import GenaiError, generate as og_generate, import_og

    if _genai_runner(args) == "inplace":
        return _run_inplace(args)
    if _written_for_inplace_runner(args.model):
        print(f"dot4attn generate: {args.model} was rewritten for dot4attn's in-place runner (--for-inplace-runner: "
              "its q4_0 V cache is narrower than K's, which onnxruntime-genai cannot allocate): use --runner inplace "
              "or auto", file=sys.stderr)
        return 2
    if args.batch != 1:
        print("dot4attn generate: --batch needs --runner inplace", file=sys.stderr)
        return 2
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
            return 2
        t0 = time.perf_counter()
        out = og_generate(args.model, [ids], args.max_new_tokens, threads=args.threads or None)[0]
        dt = time.perf_counter() - t0
    except GenaiError as e:
        print(f"dot4attn generate: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # og load/run errors: say which folder
        print(f"dot4attn generate: {args.model}: {e}", file=sys.stderr)
        return 2
    print("tokens:", " ".join(map(str, out)))
    if tokenizer is not None:
        print("text:", tokenizer.decode(out))
    print(f"{len(ids)} prompt + {len(out)} new tokens in {dt:.3f} s (onnxruntime-genai, greedy)")
    return 0
