"""`dot4attn bench`: Dot4Attention vs ONNX Runtime's GroupQueryAttention (share-buffer KV cache) vs numpy.

This module holds the command's options and hands over to a backend: `--device cpu` (the default) to
`dot4attn.bench.cpu`, `--device cuda` to `dot4attn.bench.cuda` (imported lazily: it needs torch and a CUDA GPU).
`dot4attn.bench.report` prints and writes what both measure (tables, JSON, plots, machine facts). See
docs/performance.md.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..argtypes import nonnegative_float, nonnegative_int, positive_int
from .cpu import CANDIDATES, run_cpu_bench

__all__ = ["CANDIDATES", "add_arguments", "main", "run_bench", "run_cpu_bench"]

HELP = "benchmark Dot4Attention against ONNX Runtime GQA and numpy"
DESCRIPTION = """\
Times Dot4Attention (packed K cache, float / q8_0 / q4_0 V) against ONNX Runtime's GroupQueryAttention with a
shared-buffer KV cache and a numpy reference, decode and prefill, per head shape and key length, in one process
with the candidates interleaved. Prints a table and writes bench.json and bench.png into --out (docs/performance.md).

  dot4attn bench --quick
  dot4attn bench --device cuda --heads 32,8,128 --decode-sk 16384,131072"""


def key_lengths(text: str) -> list[int]:
    """Comma-separated key lengths >= 1; '' for none (--prefill-sk '')."""
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        values = [0]
    if values and min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (or ''), got {text!r}")
    return values


def head_shapes(text: str) -> list[tuple[int, int, int]]:
    """'Hq,Hkv,D;...' head shapes: integers >= 1, Hq a multiple of Hkv."""
    out = []
    for item in text.replace(" ", "").split(";"):
        if item:
            try:
                parts = [int(x) for x in item.replace("x", ",").split(",")]
            except ValueError:
                parts = []
            if len(parts) != 3 or min(parts) < 1 or parts[0] % parts[1]:
                raise argparse.ArgumentTypeError(f"head shape must be Hq,Hkv,D (integers >= 1, Hq a multiple of "
                                                 f"Hkv), got {item!r}")
            out.append(tuple(parts))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `dot4attn bench` (the CLI calls this on its `bench` sub-parser)."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: dot4attn.bench.cpu; cuda: dot4attn.bench.cuda (default: cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="a ~1-2 minute subset: decode (32,8,128) at Sk 4096 and 16384, prefill (32,8,128) Sk 512")
    parser.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png (default ./bench-out)")
    parser.add_argument("--threads", type=nonnegative_int, default=0,
                        help="intra_op_num_threads of every session (default 0: all cores this process may use)")
    parser.add_argument("--thread-pool", choices=["global", "per-session", "per-session-spin"], default="global",
                        help="global (default): one ONNX Runtime intra-op pool of --threads threads shared by all "
                             "sessions; per-session: a pool per session, spinning off; per-session-spin: ORT's "
                             "default (a spinning pool per session; interleaved sessions then slow each other)")
    parser.add_argument("--numpy-threads", type=nonnegative_int, default=1,
                        help="OpenBLAS threads for the numpy baseline during the bench (default 1; 0: leave as is)")
    parser.add_argument("--heads", type=head_shapes, default=None, metavar="HQ,HKV,D[;...]",
                        help="head shapes, e.g. '32,8,128;24,4,256' (default: those two)")
    parser.add_argument("--decode-sk", type=key_lengths, default=None, metavar="SK[,SK...]",
                        help="decode key lengths (default 512,4096,16384,32768; quick: 4096,16384)")
    parser.add_argument("--prefill-sk", type=key_lengths, default=None, metavar="SK[,SK...]",
                        help="prefill lengths Sq = Sk (default 512,2048; quick: 512); '' for none")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size B (default 1)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES),
                        help=f"comma-separated subset of {','.join(CANDIDATES)} (default: all)")
    parser.add_argument("--repeats", type=nonnegative_int, default=0,
                        help="timed repeats per case (default 0: as many as fit --case-seconds, within [5, 200])")
    parser.add_argument("--warmup", type=nonnegative_int, default=2,
                        help="untimed runs of each candidate per case (default 2)")
    parser.add_argument("--case-seconds", type=nonnegative_float, default=0.0,
                        help="time budget per case for auto repeats (default 15 s quick, 20 s full)")
    parser.add_argument("--numpy-max-sk", type=nonnegative_int, default=4096,
                        help="numpy baseline only for decode with Sk <= this (default 4096)")
    parser.add_argument("--numpy-max-prefill", type=nonnegative_int, default=512,
                        help="numpy baseline only for prefill with Sk <= this (default 512)")
    parser.add_argument("--no-verify", action="store_true", help="skip the GQA / Dot4Attention correctness checks")
    parser.add_argument("--no-plot", action="store_true", help="do not write bench.png")
    parser.add_argument("--require-targets", action="store_true",
                        help="exit 1 when a target at (32,8,128) Sk=16384 decode is measured and missed")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random inputs (default 0)")


def run_bench(args) -> int:
    """Runs the bench described by `args` (from add_arguments); returns the process exit code."""
    if getattr(args, "device", "cpu") == "cuda":
        return _run_cuda(args)
    return run_cpu_bench(args)


def _cuda_missing() -> str | None:
    """Why no CUDA device is reachable (neither onnxruntime's CUDA EP nor torch sees one), or None."""
    try:
        import onnxruntime as ort

        eps = list(ort.get_available_providers())
    except Exception:  # noqa: BLE001 - no onnxruntime at all
        eps = []
    if "CUDAExecutionProvider" in eps:
        return None
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001
        pass
    return (f"no CUDA device reachable: this onnxruntime has no CUDA execution provider (available: "
            f"{', '.join(eps) or 'none'}) and torch sees no CUDA GPU; run it on a machine with an NVIDIA GPU, "
            "onnxruntime-gpu and torch")


def _run_cuda(args) -> int:
    try:
        cuda = importlib.import_module(f"{__name__}.cuda")  # lazy on purpose
    except ModuleNotFoundError as exc:
        if exc.name == f"{__name__}.cuda":
            print(f"dot4attn bench --device cuda: {__name__}.cuda is not part of this installation "
                  "(the CUDA bench is not available in this build)", file=sys.stderr)
            return 2
        raise
    missing = _cuda_missing()
    if missing:
        print(f"dot4attn bench --device cuda: {missing}", file=sys.stderr)
        return 2
    return int(cuda.run_cuda_bench(args))  # a BenchResult: int() is its exit code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dot4attn.bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_bench(parser.parse_args(argv))
