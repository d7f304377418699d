"""Where a prompt's prefill goes in the model, row by row: time to first token per prefill chunk size, and on CUDA
the GPU time of one prefill's kernels by group (the attention, the weight GEMMs, the rest).

    python -m dot4attn.e2e.prefill_profile --device cuda --layers 4 --contexts 32768,131072 --chunks 8192,16384,32768
    python -m dot4attn.e2e.prefill_profile --smoke            # the tiny shape on the CPU, in seconds

The rows are `dot4attn e2e`'s (dot4attn.e2e.models; by default 1, 3 and 4: the builder's model, packed K + q8_0 V
under og.Generator, packed K + q4_0 V in place), run by the same runners over the same random prompt, with as
many layers as --layers says: every layer does the same work, so a few layers show a layer's prefill cost and
the ratios between rows and chunk sizes without building and loading the whole model (the embedding and the
pruned LM head are whole, and their share shrinks as layers are added). A prefill is timed twice per (context,
chunk) and the faster kept. On CUDA one more prefill per row (the first context, --profile-chunk tokens per call)
runs under torch.profiler (CUPTI sees ONNX Runtime's kernels too): the kernels' GPU time summed by group and the
kernels that take the most. Writes prefill_profile.json into --out.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from ..argtypes import int_list, positive_int
from . import MARGIN, _threads
from .models import RUNNER, ModelSpec

DEFAULT_ROWS = ("genai", "d4a-q8_0", "d4a-q4_0")

# Kernel groups by name (CUDA): the first pattern that matches names the group. dot4attn's own kernels live in
# its namespace; ORT's GroupQueryAttention runs flash / memory-efficient attention kernels; the weight GEMMs are
# cuBLAS / CUTLASS kernels.
GROUPS = (
    ("dot4attn", re.compile(r"dot4attn")),
    ("attention (ORT)", re.compile(r"flash|fmha|attention|softmax", re.I)),
    ("GEMM", re.compile(r"gemm|cutlass|xmma|cublas|sm\d+_.*_tn|matmul", re.I)),
)


def kernel_group(name: str) -> str:
    """The group of a CUDA kernel's name (GROUPS), or "other"."""
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def summarize_kernels(events: list[tuple[str, float, int]], top: int = 12) -> dict:
    """events: (kernel name, GPU microseconds, calls) -> totals per group (ms) and the `top` kernels by time."""
    groups: dict[str, float] = {}
    for name, us, _ in events:
        g = kernel_group(name)
        groups[g] = groups.get(g, 0.0) + us / 1e3
    ranked = sorted(events, key=lambda e: -e[1])[:top]
    return {"total_ms": sum(groups.values()),
            "groups_ms": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
            "top": [{"kernel": n, "ms": us / 1e3, "calls": c, "group": kernel_group(n)} for n, us, c in ranked]}


def _profile(start_fn) -> tuple[float, list[tuple[str, float, int]]]:
    """Runs start_fn() under torch.profiler (CUDA activity); (its seconds, [(kernel, GPU us, calls)])."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        seconds = start_fn()
    events = []
    for e in prof.key_averages():
        us = float(getattr(e, "self_device_time_total", 0) or 0)
        if us > 0:
            events.append((e.key, us, int(e.count)))
    return seconds, events


def run(args) -> dict:
    from .runners import make_runner, start

    if args.device == "cuda":
        import torch  # noqa: F401  (before any CUDA session: it loads the CUDA libraries ORT's provider needs)
    from .models import _vocab_size, prepare

    spec = ModelSpec(args.shape, args.precision, args.device, max(args.contexts) + MARGIN, layers=args.layers)
    cache = args.cache
    if cache is None:
        from ..models.export import model_cache_dir

        cache = model_cache_dir() / "e2e"
    folders = prepare(cache, spec, log=lambda m: print(m, flush=True), rows=list(args.rows))
    vocab = _vocab_size(folders["genai"])
    prompt = np.random.default_rng(args.seed).integers(0, vocab, size=(1, max(args.contexts))).astype(np.int32)
    result = {"shape": args.shape, "precision": args.precision, "device": args.device, "layers": args.layers,
              "rows": {}}
    for row in args.rows:
        folder = folders[row]
        if isinstance(folder, str):
            result["rows"][row] = {"error": folder}
            continue
        dec = make_runner(RUNNER[row], folder, args.device, cuda_graph=args.device == "cuda", threads=args.threads)
        warm = min(64, min(args.contexts))
        start(dec, prompt[:, :warm], warm + 8, warm)  # the runner's one-time costs
        times = []
        for ctx in args.contexts:
            for chunk in args.chunks:
                s = min(start(dec, prompt[:, :ctx], ctx + 8, chunk) for _ in range(2))
                times.append({"context": ctx, "chunk": chunk, "prefill_s": s})
                print(f"{row:10s} context {ctx:7d} chunk {chunk:6d}: {s * 1e3:9.1f} ms", flush=True)
        entry = {"runner": RUNNER[row], "prefill": times}
        if args.device == "cuda":
            ctx = args.contexts[0]
            s, events = _profile(lambda: start(dec, prompt[:, :ctx], ctx + 8, args.profile_chunk))
            entry["profile"] = {"context": ctx, "chunk": args.profile_chunk, "prefill_s": s,
                                **summarize_kernels(events)}
            p = entry["profile"]
            print(f"--- {row}: {s * 1e3:.1f} ms wall, {p['total_ms']:.1f} ms of kernels: " +
                  ", ".join(f"{g} {ms:.1f}" for g, ms in p["groups_ms"].items()), flush=True)
            for k in p["top"]:
                print(f"    {k['ms']:9.2f} ms {k['calls']:6d}x  {k['kernel'][:100]}", flush=True)
        result["rows"][row] = entry
        dec.close()  # the Decoder interface (dot4attn.runtime.decoder): the model and its cache go
        del dec
    return result


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dot4attn.e2e.prefill_profile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="the tiny shape (qwen2-bias, 2 layers) on the CPU, "
                    "contexts 128, chunks 32,128")
    ap.add_argument("--shape", default="qwen2.5-7b", help="a dot4attn.models.genai_builder.SHAPES key")
    ap.add_argument("--precision", default=None, help="the builder's -p (default fp16 cuda, int4 cpu)")
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--contexts", type=int_list, default=[32768])
    ap.add_argument("--chunks", type=int_list, default=[16384], help="prefill tokens per call, each timed")
    ap.add_argument("--profile-chunk", type=positive_int, default=16384, help="the profiled prefill's tokens per call")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"rows among {', '.join(RUNNER)}")
    ap.add_argument("--threads", type=positive_int, default=None, help="ONNX Runtime intra-op threads of every row "
                    "(default: on the CPU every CPU this process may use, so the runtimes agree; on CUDA their own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=None, help="model folders (default $DOT4ATTN_MODEL_CACHE/e2e)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    if args.smoke:
        args.device, args.shape, args.precision, args.layers = "cpu", "qwen2-bias", "fp32", 2
        args.contexts, args.chunks = [128], [32, 128]
    args.threads = _threads(args)  # dot4attn e2e's rule
    if args.precision is None:
        args.precision = "fp16" if args.device == "cuda" else "int4"
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in args.rows if r not in RUNNER]
    if unknown or not args.rows:
        ap.error(f"--rows: expected some of {', '.join(RUNNER)}, got {','.join(args.rows) or 'none'}")
    if min(args.contexts) < 1 or min(args.chunks) < 1:
        ap.error("--contexts and --chunks must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    result = run(args)
    result["seconds"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "prefill_profile.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)  # whole or not at all
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
