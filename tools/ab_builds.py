"""Same-process A/B of op-library builds and plan overrides on a CUDA GPU: the measurement behind docs/performance.md's
"H100, same process, one library" tables.

    PYTHONPATH=python python3 tools/ab_builds.py --case 32,8,128,8192,8192 --case 24,4,256,8192,8192,q8_0 \
        --overrides k_dequant=1,v_dequant=1,ws=1 --cudnn old=old.so new=new.so.xz new64=new.so.xz@ws_keys=64

An entry is NAME=LIBRARY[@OVERRIDES]: a build of libdot4attn_ops.so (an .xz copy is unpacked first) and the plan
overrides of its calls (docs/gpu.md), added to --overrides. Every build is loaded under a name of its own, so
several live in one process and each call goes through its own build's C entry (dot4attn.native.TorchAttention).
A case is Hq,Hkv,D,Sq,Sk[,V[,full]]: batch 1, random query (x3), K packed as q8_0, V float16 (`f16`) or packed as
`q8_0` / `q4_0`, causal unless `full`. Rounds interleave the entries (and cuDNN's SDPA with --cudnn), each round
timing --repeats calls with L2 flushed before each (dot4attn.bench.cuda's timer) and starting one entry further on;
an entry's time is the median of its rounds' medians, its spread (max - min) / median over the rounds. x = the first
entry's time / the entry's: above 1, faster than the first. An entry whose output is not bit-equal to the first
entry's is marked DIFFERS (builds or overrides that should compute the same thing must).

With --kernels N each entry's calls are then profiled one by one (torch.profiler, L2 flushed and the GPU idle before
each call): per entry, the median span of a call (its first kernel's start to its last one's end) and of each of
its kernels, so the attention kernel alone is set apart from the passes around it (and cuDNN's from its own).
With --timeline N, N calls are profiled queued back to back behind their flushes, as the rounds time them (no
synchronize between calls, so no launch gap the host would leave): per entry, each kernel's median start and end and
the call's end, in us from the call's first kernel's start, so where a call ends later than another shows kernel by
kernel (a pass before the attention kernel, the kernel itself, a tail after it).
"""
from __future__ import annotations

import argparse
import lzma
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
try:
    import dot4attn  # noqa: F401  (the installed package, or the one on PYTHONPATH)
except ImportError:  # run from a checkout without either: its sources
    sys.path.insert(0, str(ROOT / "python"))

V_CHOICES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Case:
    hq: int
    hkv: int
    d: int
    sq: int
    sk: int
    v: str = "f16"
    causal: bool = True

    def label(self) -> str:
        return f"({self.hq},{self.hkv},{self.d}) Sq={self.sq} Sk={self.sk} {self.v}{'' if self.causal else ' full'}"


@dataclass(frozen=True)
class Entry:
    name: str
    library: Path
    overrides: str


def parse_case(text: str) -> Case:
    """Hq,Hkv,D,Sq,Sk[,V[,full]] -> Case; a clear error for anything else."""
    parts = text.split(",")
    if not 5 <= len(parts) <= 7:
        raise argparse.ArgumentTypeError(f"case {text!r}: expected Hq,Hkv,D,Sq,Sk[,V[,full]]")
    try:
        hq, hkv, d, sq, sk = (int(p) for p in parts[:5])
    except ValueError:
        raise argparse.ArgumentTypeError(f"case {text!r}: Hq, Hkv, D, Sq and Sk must be integers") from None
    if min(hq, hkv, d, sq, sk) < 1 or hq % hkv:
        raise argparse.ArgumentTypeError(f"case {text!r}: sizes must be >= 1 and Hq a multiple of Hkv")
    v = parts[5] if len(parts) > 5 else "f16"
    if v not in V_CHOICES:
        raise argparse.ArgumentTypeError(f"case {text!r}: V must be one of {', '.join(V_CHOICES)}, got {v!r}")
    if len(parts) > 6 and parts[6] != "full":
        raise argparse.ArgumentTypeError(f"case {text!r}: the seventh field can only be 'full', got {parts[6]!r}")
    return Case(hq, hkv, d, sq, sk, v, causal=len(parts) < 7)


def parse_entry(text: str) -> Entry:
    """NAME=LIBRARY[@OVERRIDES] -> Entry (the library need not exist yet: checked when loaded)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"entry {text!r}: expected NAME=LIBRARY[@OVERRIDES]")
    lib, _, overrides = rest.partition("@")
    return Entry(name, Path(lib), overrides)


def joined(*overrides: str) -> str:
    return ",".join(o for o in overrides if o)


def round_order(items: list, r: int) -> list:
    """The order of round r: items from r % len(items) on, then the rest. Over len(items) rounds each item is timed
    once in every place, so an entry timed right after a long one (on a hotter GPU at the power cap, lower clocks)
    is not always the same entry."""
    k = r % len(items)
    return items[k:] + items[:k]


class Builds:
    """Each library loaded once under a file name of its own (an .xz unpacked into a temporary file)."""

    def __init__(self):
        from dot4attn import native

        self.native = native
        self.load = native._lib.__wrapped__  # the lru_cache's function: a fresh CDLL of get_library_path() per call
        self.loaded = {}
        self.tmp = tempfile.mkdtemp(prefix="ab_builds_")

    def use(self, library: Path) -> None:
        """Makes dot4attn.native's calls go to `library`."""
        native = self.native
        if library not in self.loaded:
            if not library.is_file():
                raise SystemExit(f"ab_builds: library {library}: no such file")
            copy = Path(self.tmp) / f"lib{len(self.loaded)}.so"
            opener = lzma.open if library.suffix == ".xz" else open
            with opener(library, "rb") as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst)
            native.get_library_path = lambda p=str(copy): p
            self.loaded[library] = self.load()
        lib = self.loaded[library]
        native._lib = lambda: lib

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def short_kernel_name(name: str) -> str:
    """A kernel's name without its return type, namespaces, template and call arguments."""
    base = name.split("<")[0].split("(")[0].strip()
    return base.split()[-1].split("::")[-1] if base else name


def split_calls(events: list[tuple[str, float, float]], is_flush) -> list[list[tuple[str, float, float]]]:
    """GPU events (name, start, end) in time order -> the events of each call: the runs between two flushes."""
    calls, cur = [], None
    for ev in sorted(events, key=lambda e: e[1]):
        if is_flush(ev[0]):
            if cur:
                calls.append(cur)
            cur = []
        elif cur is not None:
            cur.append(ev)
    if cur:
        calls.append(cur)
    return calls


def same_kernel_calls(calls: list[list[tuple[str, float, float]]]) -> tuple[list[str], list]:
    """The first call's kernel names and the calls that ran those kernels (a library's plan is fixed per call;
    cuDNN's may differ between calls)."""
    names = [e[0] for e in calls[0]]
    return names, [c for c in calls if [e[0] for e in c] == names]


def call_kernels(calls: list[list[tuple[str, float, float]]]) -> dict[str, float]:
    """Median span of a call and median time of each of its kernels (in call order), us, over the calls that ran
    the first call's kernels (a library's plan is fixed per call; cuDNN's may differ: those calls are left out)."""
    import numpy as np

    names, same = same_kernel_calls(calls)
    out = {"span": float(np.median([c[-1][2] - c[0][1] for c in same])), "calls": len(same)}
    for i, name in enumerate(names):
        out[f"{i}:{short_kernel_name(name)}"] = float(np.median([c[i][2] - c[i][1] for c in same]))
    return out


def call_timeline(calls: list[list[tuple[str, float, float]]]) -> dict:
    """Median start and end of each kernel of a call (in call order) and the call's median end, us from the call's
    first kernel's start, over the calls that ran the first call's kernels (as call_kernels)."""
    import numpy as np

    names, same = same_kernel_calls(calls)
    out = {"calls": len(same), "end": float(np.median([max(e[2] for e in c) - c[0][1] for c in same]))}
    for i, name in enumerate(names):
        out[f"{i}:{short_kernel_name(name)}"] = (float(np.median([c[i][1] - c[0][1] for c in same])),
                                                 float(np.median([c[i][2] - c[0][1] for c in same])))
    return out


FLUSH_KERNEL = "FillFunctor<unsigned char>"  # the timer's L2 flush (a uint8 buffer's zero_)


def profiled_calls(torch, timer, fn, n: int, idle: bool, warmup: int = 1) -> list[list[tuple[str, float, float]]]:
    """The GPU events of n profiled calls of fn, each after an L2 flush: with `idle` the GPU synchronized before and
    after each call, else the calls queued back to back behind their flushes (as the timed rounds run them)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        timer.flush.zero_()
        fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note that a profile keeps only its last cycle
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                timer.flush.zero_()
                if idle:
                    torch.cuda.synchronize()
                fn()
                if idle:
                    torch.cuda.synchronize()
            timer.flush.zero_()  # closes the last call's run
            torch.cuda.synchronize()
        events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type.name == "CUDA"]
    calls = split_calls(events, lambda name: FLUSH_KERNEL in name)
    if len(calls) != n:
        raise SystemExit(f"ab_builds: expected {n} profiled calls between the flushes, found {len(calls)}")
    return calls


def profile_kernels(torch, timer, fn, n: int) -> dict[str, float]:
    """call_kernels of n calls of fn, each after an L2 flush and a synchronize (the GPU idle before it)."""
    return call_kernels(profiled_calls(torch, timer, fn, n, idle=True))


def profile_timeline(torch, timer, fn, n: int) -> dict:
    """call_timeline of n calls of fn queued back to back, each behind its L2 flush (3 calls before, unprofiled)."""
    return call_timeline(profiled_calls(torch, timer, fn, n, idle=False, warmup=3))


def run(cases: list[Case], entries: list[Entry], common: str, rounds: int, repeats: int, cudnn: bool,
        kernels: int = 0, timeline: int = 0) -> list[dict]:
    import numpy as np
    import torch

    from dot4attn.bench import cuda as bc

    builds = Builds()
    timer = bc._Timer(torch, repeats)
    # the profiles after the rounds: (calls, row key, profiler, the call's total, its word, how a kernel's value reads)
    profiles = [(kernels, "kernels", profile_kernels, "span", "span", lambda t: f"{t:.1f}"),
                (timeline, "timeline", profile_timeline, "end", "ends", lambda t: f"{t[0]:.1f}..{t[1]:.1f}")]
    torch.manual_seed(0)
    rows = []
    try:
        for c in cases:
            # the CUDA bench's inputs: random float16 q (x3), k and v; K packed as q8_0
            q, k, v, kp, ks = bc._inputs(SimpleNamespace(torch=torch, B=1), c.hq, c.hkv, c.d, c.sq, c.sk)
            vp, vs = (v, None) if c.v == "f16" else bc._pack(torch, v, c.v)
            fmt = "float" if c.v == "f16" else c.v
            calls = []
            for e in entries:
                builds.use(e.library)
                call = bc.native.TorchAttention(q, kp, ks, vp, vs, torch.empty_like(q), v_format=fmt,
                                                causal=c.causal, overrides=joined(common, e.overrides))
                plan = call(return_plan=True)
                torch.cuda.synchronize()
                calls.append((e.name, e.library, call, call.out.clone(), plan))
            fns = [(n, lib, call) for n, lib, call, _, _ in calls]
            if cudnn:
                fns.append(("cudnn", None, bc._sdpa(torch, "cudnn", q, k, v, c.causal)))
            times = {n: [] for n, _, _ in fns}
            for r in range(rounds):
                for n, lib, fn in round_order(fns, r):
                    if lib is not None:
                        builds.use(lib)
                    times[n].append(timer(fn))
            base = float(np.median(times[fns[0][0]]))
            for i, (n, lib, _) in enumerate(fns):
                t = times[n]
                med = float(np.median(t))
                row = {"case": c.label(), "entry": n, "us": med, "x": base / med,
                       "spread": (max(t) - min(t)) / med}
                if lib is not None:
                    _, _, _, out, plan = calls[i]
                    row["differs"] = i > 0 and not torch.equal(out, calls[0][3])
                    row["kernel"] = f"{plan.get('kernel')} ws={plan.get('ws', False)}"
                rows.append(row)
                print(f"{row['case']:36s} {n:10s} {med:10.1f} us  x={row['x']:6.3f}  spread={row['spread']:5.3f}"
                      f"{'  DIFFERS' if row.get('differs') else ''}  {row.get('kernel', '')}", flush=True)
            for n, lib, fn in fns if kernels or timeline else ():
                if lib is not None:
                    builds.use(lib)
                for count, key, profiler, total, word, show in profiles:
                    if count:
                        k = profiler(torch, timer, fn, count)
                        rows.append({"case": c.label(), "entry": n, key: k})
                        parts = "  ".join(f"{name} {show(v)}" for name, v in k.items() if ":" in name)
                        print(f"{c.label():36s} {n:10s} {word} {k[total]:10.1f} us ({k['calls']} calls)  {parts}",
                              flush=True)
    finally:
        builds.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entries", nargs="+", type=parse_entry, metavar="NAME=LIBRARY[@OVERRIDES]")
    ap.add_argument("--case", dest="cases", action="append", type=parse_case, required=True,
                    metavar="Hq,Hkv,D,Sq,Sk[,V[,full]]")
    ap.add_argument("--overrides", default="", help="plan overrides added to every entry's")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per entry and round")
    ap.add_argument("--cudnn", action="store_true", help="time torch SDPA's cuDNN backend in the same rounds")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="then profile N calls of each entry one by one: the call's span and each kernel's time")
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="then profile N calls of each entry queued back to back: each kernel's start and end")
    args = ap.parse_args(argv)
    names = [e.name for e in args.entries]
    if len(set(names)) != len(names) or "cudnn" in names:
        ap.error(f"entry names must be distinct and not 'cudnn', got {', '.join(names)}")
    if args.rounds < 1 or args.repeats < 1 or args.kernels < 0 or args.timeline < 0:
        ap.error("--rounds and --repeats must be >= 1, --kernels and --timeline >= 0")
    run(args.cases, args.entries, args.overrides, args.rounds, args.repeats, args.cudnn, args.kernels,
        args.timeline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
