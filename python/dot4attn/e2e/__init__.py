"""`dot4attn e2e`: end-to-end decode speed of one model shape, four ways, in one process.

    dot4attn e2e --device cpu                      # Qwen2.5-0.5B shape, int4 weights, contexts 4k/16k
    dot4attn e2e --device cuda                     # Qwen2.5-7B shape, fp16, contexts 4k..128k, batch 1 and 16
    dot4attn e2e --device cuda --precision int4    # the same with the builder's int4 weights (cuda-int4.*)
    dot4attn e2e --smoke                           # a tiny shape at contexts 64/128: the harness in seconds

Rows (dot4attn.e2e.models): 1. the onnxruntime-genai builder model under og.Generator; 2. the same with ORT's own
int8 KV cache (per-channel scales this command calibrates); 3. `dot4attn rewrite` (packed K + q8_0 V) under
og.Generator; 4. packed K + q4_0 V under dot4attn.runtime.inplace. The random-weight models are built into --cache on first
use. Per case: time to first token (the prompt's prefill), decode ms/token, and the request time of the prompt plus
--answer-tokens (TTFT + N x ms/token), each against row 1's. Writes NAME.json, NAME.md (the table and goals) and
NAME.png (ms/token, TTFT and request time against context) into --out; NAME is the device, with the weights'
precision where it is not the device's default (cuda-int4), or smoke. --render writes them again from NAME.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..argtypes import int_list, nonnegative_int, positive_int
from .models import DEFAULT_ROWS, ROWS

HELP = "end-to-end decode: genai baseline, ORT int8 KV, rewritten folders; table, JSON and plot"
DESCRIPTION = __doc__

PRESETS = {  # device -> defaults
    # Batches > 1 at 4k only on the CPU: onnxruntime-genai prefills a batch in one call, and ORT's CPU
    # GroupQueryAttention holds a [batch, heads, tokens, tokens] fp32 score buffer for it (30 GB for 2 x 16k).
    # 32k is left out by default: its prefill alone takes about 25 minutes per row on 2 cores (docs/e2e.md).
    "cpu": dict(shape="qwen2.5-0.5b", precision="int4", contexts=[4096, 16384], batches=[1, 2],
                batch_contexts=[4096], fit_context=0, chunk=1024, steps=16),
    # 16 x 32k: onnxruntime-genai's one-call batch prompt does not fit on an H200 (harness.Settings.copied_contexts)
    "cuda": dict(shape="qwen2.5-7b", precision="fp16", contexts=[4096, 16384, 32768, 65536, 131072],
                 batches=[1, 16], batch_contexts=[16384, 32768], fit_context=32768, chunk=16384,
                 copied_prompt_contexts=[32768]),
    "smoke": dict(shape="qwen2-bias", precision="fp32", contexts=[64, 128], batches=[1, 2], batch_contexts=[128],
                  fit_context=0, chunk=64, steps=4),
}
MARGIN = 256  # positions the model holds beyond the longest context: warm-up + timed steps must fit in it


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: onnxruntime-genai + the CPU op library; cuda: onnxruntime-genai-cuda + a CUDA build")
    p.add_argument("--smoke", action="store_true", help="tiny shape (qwen2-bias, 2 layers), contexts 64,128: the "
                   "harness in seconds; judges none of the real shape's goals")
    p.add_argument("--shape", help="a dot4attn.models.genai_builder.SHAPES key (default: qwen2.5-0.5b cpu, qwen2.5-7b cuda)")
    p.add_argument("--precision", help="the builder's -p (default: int4 cpu, fp16 cuda)")
    p.add_argument("--contexts", type=int_list, help="context lengths (default cpu 4096,16384; cuda 4096 .. 131072)")
    p.add_argument("--batches", type=int_list, help="batch sizes (default cpu 1,2; cuda 1,16)")
    p.add_argument("--batch-contexts", type=int_list, help="contexts at which batches > 1 run (a subset of --contexts)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="timed decode steps per case (default cpu 16, cuda 24)")
    p.add_argument("--warmup", type=nonnegative_int, default=2, help="untimed decode steps before them (default 2)")
    p.add_argument("--chunk", type=positive_int, help="batch-1 prefill tokens per call (default cpu 1024, cuda 16384): "
                   "bounds the CPU attention's [heads, tokens, context] score buffer")
    p.add_argument("--copied-prompt-contexts", type=_ints_or_none, metavar="N[,N...]|none",
                   help="contexts whose batches > 1 every row decodes by dot4attn.runtime.inplace over one sequence's "
                        "prefill copied to the batch, where onnxruntime-genai's one-call batch prompt does not fit "
                        "(default cuda 32768, cpu none)")
    p.add_argument("--fit-context", type=nonnegative_int, help="search the largest batch of this context that fits "
                   "(default: 32768 on cuda, off on cpu; 0: off)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="cuda: launch every decode step's kernels from the host instead of replaying the step as a "
                        "CUDA graph (by default every row replays: onnxruntime-genai's enable_cuda_graph for rows "
                        "1-3, dot4attn.runtime.inplace's for row 4)")
    p.add_argument("--case-processes", action="store_true",
                   help="run every timed case in a process of its own (after an untimed warm-up there): no case "
                        "inherits the memory another case's prompt grew in onnxruntime's process-wide arena, so one "
                        "invocation measures batch cases that otherwise need a process per row")
    p.add_argument("--threads", type=nonnegative_int, default=None, metavar="N",
                   help="ONNX Runtime intra-op threads of every row's decoder, og.Generator's and the in-place "
                        "runner's alike (default cpu: the CPUs this process may run on; cuda: each runtime's own; "
                        "0: each runtime's own), so no row gets more cores than another")
    p.add_argument("--answer-tokens", type=positive_int, default=500, metavar="N",
                   help="answer length of the request time reported beside each prefilled case: time to first "
                        "token + N x ms/token (default 500)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights and prompts")
    p.add_argument("--cache", type=Path, default=None, help="model cache folder (default $DOT4ATTN_MODEL_CACHE/e2e "
                   "or ~/.cache/dot4attn/models/e2e)")
    p.add_argument("--out", type=Path, default=Path("e2e-out"), help="folder for DEVICE.json/.md/.png (DEVICE: cpu, "
                   "cuda or smoke; with the precision where it is not the device's default: cuda-int4)")
    p.add_argument("--rows", type=_rows, help=f"rows to run, comma-separated (default: {', '.join(DEFAULT_ROWS)}; "
                   f"known: {', '.join(ROWS)})")
    p.add_argument("--render", action="store_true",
                   help="measure nothing: write OUT/DEVICE.md and .png (and the JSON's derived fields: ratios, TTFT, "
                        "request times, goals) again from OUT/DEVICE.json with this version's report")
    p.add_argument("--resume", action="store_true",
                   help="keep what OUT/DEVICE.json already holds for the same model and settings and measure only "
                        "the rest (a long run split over several invocations)")
    p.add_argument("--remeasure", action="store_true",
                   help="as --resume, but the cases this invocation names (its --rows at its --contexts and "
                        "--batches, and their fit searches) are measured again and replace what OUT/DEVICE.json "
                        "holds for them: a page's cells brought to the current op library, the others kept")


def _ints_or_none(text: str) -> list[int]:
    return [] if text.strip().lower() == "none" else int_list(text)


def _rows(text: str) -> list[str]:
    rows = [x for x in text.replace(" ", "").split(",") if x]
    unknown = [r for r in rows if r not in ROWS]
    if not rows or unknown:
        raise argparse.ArgumentTypeError(f"unknown rows {unknown or text!r}; known: {', '.join(ROWS)}")
    return rows


def settings_from_args(args):
    from .harness import Settings

    preset = dict(PRESETS["smoke" if args.smoke else args.device])
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else preset.get(name)  # noqa: E731
    contexts, batches = sorted(pick("contexts")), sorted(pick("batches"))
    batch_contexts = pick("batch_contexts")
    if args.batch_contexts is None:
        batch_contexts = [c for c in batch_contexts if c in contexts] or contexts[:1]
    steps = pick("steps") or 24
    if set(batch_contexts) - set(contexts):
        raise ValueError(f"--batch-contexts {batch_contexts} must be among --contexts {contexts}")
    if steps < 1 or args.warmup < 0 or steps + args.warmup > MARGIN:
        raise ValueError(f"--steps (>= 1) and --warmup (>= 0) must add up to at most {MARGIN}")
    copied = pick("copied_prompt_contexts") or []
    if args.copied_prompt_contexts is None:
        copied = [c for c in copied if c in batch_contexts]
    if set(copied) - set(batch_contexts):
        raise ValueError(f"--copied-prompt-contexts {copied} must be among the batch contexts {batch_contexts}")
    fit = pick("fit_context") or 0
    chunk = pick("chunk")
    if chunk < 1 or fit < 0:
        raise ValueError("--chunk must be >= 1 and --fit-context >= 0")
    return preset, Settings(device=args.device, contexts=contexts, batches=batches, batch_contexts=batch_contexts,
                            steps=steps, warmup=args.warmup, chunk=chunk, seed=args.seed, fit_context=fit,
                            cuda_graph=args.device == "cuda" and not args.no_cuda_graph,
                            copied_contexts=sorted(copied), case_processes=args.case_processes,
                            threads=_threads(args))


def _threads(args) -> int | None:
    """--threads, or on the CPU every CPU this process may run on (each runtime's own default differs there)."""
    if args.threads is not None:
        return args.threads or None
    if args.device != "cpu":
        return None
    from ..bench.report import default_threads

    return default_threads()


def machine(device: str) -> str:
    import onnxruntime as ort

    from ..bench.report import cpu_model

    where = f"{cpu_model()}, {os.cpu_count()} cores"
    if device == "cuda":
        try:
            import torch

            where = f"{torch.cuda.get_device_name(0)}; host {where}"
        except Exception:  # noqa: BLE001 - the GPU's name is a nicety
            where = f"CUDA GPU; host {where}"
    try:
        from importlib.metadata import version

        og = version("onnxruntime-genai-cuda" if device == "cuda" else "onnxruntime-genai")
    except Exception:  # noqa: BLE001
        og = "?"
    return f"{where}; onnxruntime {ort.__version__}, onnxruntime-genai {og}"


def model_facts(folder: Path, shape: str, precision: str, device: str) -> dict:
    dec = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    return dict(shape=shape, precision=precision, layers=int(dec["num_hidden_layers"]),
                q_heads=int(dec["num_attention_heads"]), kv_heads=int(dec["num_key_value_heads"]),
                head_size=int(dec["head_size"]),
                model=f"{shape} shape ({dec['num_hidden_layers']} layers, {dec['num_attention_heads']}/"
                      f"{dec['num_key_value_heads']} heads, D {dec['head_size']}), random {precision} weights, "
                      f"builder -e {device}")


def run(args) -> int:
    import sys

    from rich.console import Console

    from ..models.export import model_cache_dir
    from . import report
    from .harness import run_rows
    from .models import ModelSpec, prepare, weight_bytes

    con = Console(stderr=True)
    try:
        preset, settings = settings_from_args(args)
    except ValueError as e:
        print(f"dot4attn e2e: {e}", file=sys.stderr)
        return 2
    shape, precision = args.shape or preset["shape"], args.precision or preset["precision"]
    name = report.output_name(args.device, precision, smoke=args.smoke)  # cuda.json, cuda-int4.json, ...
    if args.render:
        path = args.out / f"{name}.json"
        if not path.is_file():
            print(f"dot4attn e2e: --render: no {path}", file=sys.stderr)
            return 2
        for written in report.render(path, args.answer_tokens, smoke=args.smoke).values():
            con.log(f"wrote {written}")
        return 0
    cache = args.cache or model_cache_dir() / "e2e"
    positions = model_length(settings.contexts, settings.fit_context)
    if args.resume or args.remeasure:  # the file's model, where it holds longer contexts than this invocation runs
        positions = max(positions, model_positions(args.out / f"{name}.json"))
    spec = ModelSpec(shape, precision, args.device, positions)
    try:
        folders = prepare(cache, spec, log=con.log, rows=args.rows or list(DEFAULT_ROWS))
    except (ValueError, RuntimeError) as e:
        print(f"dot4attn e2e: {e}", file=sys.stderr)
        return 1
    facts = model_facts(folders["genai"], shape, precision, args.device)
    facts.update(machine=machine(args.device), weight_bytes=weight_bytes(folders["genai"]),
                 model_key=folders["genai"].parent.name,  # the build (shape, max positions, versions) measured
                 max_positions=spec.max_positions,
                 settings=vars(settings), kl="batch 1 only: over the timed teacher-forced steps, against row 1",
                 answer_tokens=args.answer_tokens)
    vocab = int(json.loads((folders["genai"] / "genai_config.json").read_text())["model"]["vocab_size"])
    try:
        previous = resumed(args.out / f"{name}.json", facts, con.log) if args.resume or args.remeasure else []
    except ValueError as e:
        print(f"dot4attn e2e: {e}", file=sys.stderr)
        return 2
    if args.remeasure:
        previous = without_cases(previous, settings, args.rows or list(DEFAULT_ROWS))
    if previous:
        con.log(f"--resume: {len(previous)} results kept from {args.out / f'{name}.json'}")

    def finish(results, final=False):
        facts["load_average_1min"] = os.getloadavg()[0]  # a shared machine slows every row
        results, goal_list = report.derive(results, facts, args.device, smoke=args.smoke)
        paths = report.write_outputs(args.out, name, results, goal_list, facts)
        if final:
            report.print_report(Console(), results, goal_list, facts)
            for path in paths.values():
                con.log(f"wrote {path}")

    finish(run_rows(folders, settings, vocab, log=con.log, on_case=finish, previous=previous,
                    rows=args.rows or list(DEFAULT_ROWS),
                    references=folders["genai"].parent / "references"), final=True)
    return 0


def model_length(contexts: list[int], fit_context: int) -> int:
    """The positions a run's model is built for: its longest context (or fit search) and the timed steps' MARGIN."""
    return max(list(contexts) + [fit_context]) + MARGIN


def model_positions(path: Path) -> int:
    """The positions (max_position_embeddings) of the model an earlier run's result file was measured on (its facts',
    or model_length of its settings); 0 where there is no such file: --resume / --remeasure of a
    shorter context than the file's then finds that run's model rather than asking for one built for less."""
    try:
        facts = json.loads(path.read_text())["facts"]
        if "max_positions" in facts:
            return int(facts["max_positions"])
        s = facts["settings"]
        return model_length(s["contexts"], s.get("fit_context") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def without_cases(results: list[dict], settings, rows: list[str]) -> list[dict]:
    """results less what a run of `rows` under `settings` measures (--remeasure): those rows' cases at the settings'
    (context, batch) pairs, and their fit searches where the settings search one."""
    cases = set(settings.cases())

    def named(r):
        if r["row"] not in rows:
            return False
        if "fit_batch" in r:
            return bool(settings.fit_context)
        return (r.get("context"), r.get("batch")) in cases

    return [r for r in results if not named(r)]


RESUME_KEYS = ("steps", "warmup", "seed", "chunk", "device", "cuda_graph", "threads")  # change what a case measures
FIT_KEYS = ("steps", "warmup", "device", "fit_context")  # change what a fit search measures (max_length)


def resumed(path: Path, facts: dict, log=print) -> list[dict]:
    """The measured results of an earlier run written to path, when it ran the same model with the same
    per-case settings; only its fit searches when just the per-case settings that leave them alone differ
    (cuda_graph, seed, chunk, threads: a fit try allocates and decodes a batch the same way whatever they are); []
    when there is no such file."""
    if not path.is_file():
        return []
    try:
        old = json.loads(path.read_text())
        old_facts, results = old["facts"], old["results"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--resume: {path} is not an e2e result file ({e})") from None
    old_settings = old_facts.get("settings", {})
    mismatch = [k for k in ("model", "model_key", "weight_bytes") if old_facts.get(k) != facts.get(k)]
    mismatch += [k for k in FIT_KEYS if old_settings.get(k) != facts["settings"].get(k)]
    if mismatch:
        raise ValueError(f"--resume: {path} was measured with other {', '.join(mismatch)}; "
                         f"drop --resume (--remeasure) or choose another --out")
    results = [r for r in results if "unavailable" not in r]
    other = [k for k in RESUME_KEYS if old_settings.get(k) != facts["settings"].get(k)]
    if other:
        log(f"--resume: {path} was measured with other {', '.join(other)}: only its fit searches are kept")
        results = [r for r in results if "fit_batch" in r]
    # the batch > 1 cases at a context whose prompt is now copied, or no longer, are measured again
    changed = set(old_settings.get("copied_contexts") or []) ^ set(facts["settings"].get("copied_contexts") or [])
    return [r for r in results if not ((r.get("batch") or 1) > 1 and r.get("context") in changed)]
