"""The timed part of `dot4attn e2e`: every row over every (context, batch) case in one process (or, with
case_processes, each case in a process of its own), and the fit search (each of its tries in a process of its own).

Before the first timed case of a process one short untimed case runs on the first row's model (or the case's own), so
that what the process pays once is not charged to that case. Per case: the prompt (random token ids of the context's
length, the same array for every row) is prefilled (in chunks at batch 1) and timed; then `warmup` untimed and
`steps` timed decode steps, teacher-forced with the same tokens for every row at batch 1, greedy at batch > 1
(runners.py says why); the median step is ms/token. Each step's logits come back to the host on every runner. At
batch 1, row 1's logits of the timed steps are kept so that every other row's KL and top-1 agreement against them
(same model, same tokens, the full context behind them) is measured beside its speed.
"""
from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import library_digest
from ..formats import folder_cache_bytes_per_token as cache_bytes_per_token
from ..quality.compare import logit_metrics
from .models import OPS_ROWS, ROWS, RUNNER
from .runners import make_runner, start



@dataclass
class Settings:
    device: str
    contexts: list[int]
    batches: list[int]
    batch_contexts: list[int]   # contexts at which batches > 1 run
    steps: int = 24
    warmup: int = 2
    chunk: int = 4096           # prefill tokens per call, across the batch (bounds the [B, S, vocab] logits)
    seed: int = 0
    fit_context: int = 0        # > 0: search the largest batch of this context that fits (CUDA)
    cuda_graph: bool = False    # every row's one-token steps replay as a CUDA graph (CUDA; runners.py)
    # batches > 1 at these contexts: every row decodes, by dot4attn.runtime.inplace, over one sequence's prefill copied to
    # the batch. onnxruntime-genai prefills a batch in one call, whose activations grow with batch x context (the
    # 7B shape's MLP buffers: 19.9 GB each at 16 x 32k, more than an H200 holds beside the weights and the cache),
    # and the arena keeps what a failed prompt grew, so every later case of the process would fail too.
    copied_contexts: list[int] = field(default_factory=list)
    # every timed case in a process of its own (case_process.py), after an untimed warm-up there: no case inherits
    # what another case's prompt grew in onnxruntime's process-wide arena (rows 2 and 3 of the 7B batch-16 cases ran
    # out of it after row 1's in one process)
    case_processes: bool = False
    # ONNX Runtime intra-op threads of every row's decoder, whichever runtime drives it (None: each runtime's own,
    # which differ on the CPU: runners.make_runner)
    threads: int | None = None

    def cases(self) -> list[tuple[int, int]]:
        # batch by batch, contexts ascending within each: batch 1 (where the goals are) is complete first
        return [(c, b) for b in self.batches for c in self.contexts if b == 1 or c in self.batch_contexts]

    def max_length(self, context: int) -> int:
        return context + self.warmup + self.steps


def memory_used(device: str) -> tuple[int | None, int | None]:
    """(bytes in use, total bytes): the whole GPU's for cuda (torch.cuda.mem_get_info, else nvidia-smi; None
    without either), this process's resident set and the machine's memory for cpu."""
    if device == "cuda":
        try:
            import torch

            free, total = torch.cuda.mem_get_info()
            return total - free, total
        except Exception:  # noqa: BLE001 - no CUDA torch: ask nvidia-smi (MiB, GPU 0)
            import subprocess

            try:
                line = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                                       "--format=csv,noheader,nounits", "-i", "0"],
                                      capture_output=True, text=True, check=True).stdout
                used, total = (int(x) << 20 for x in line.split(","))
                return used, total
            except (OSError, subprocess.CalledProcessError, ValueError):
                return None, None
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page
    return rss, os.sysconf("SC_PHYS_PAGES") * page


def error_line(e: BaseException, width: int = 240) -> str:
    """The exception's type and the first line of its message (onnxruntime's run errors span many lines)."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:width]}"


def _prompt(settings: Settings, context: int, batch: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt [batch, context], forced tokens [batch, warmup + steps]): sequence b depends on (seed, context, b)
    alone, so it is the same in every case and every run (a resumed run compares with an earlier one)."""
    rows = [np.random.default_rng((settings.seed, context, b)).integers(0, vocab, context + settings.warmup
                                                                         + settings.steps, dtype=np.int64)
            for b in range(batch)]
    tokens = np.stack(rows)
    return tokens[:, :context], tokens[:, context:]


def run_case(runner, settings: Settings, context: int, batch: int, vocab: int, base_mem: int | None,
             copied: bool = False) -> dict:
    prompt, forced = _prompt(settings, context, batch, vocab)
    chunk = settings.chunk if copied else max(1, settings.chunk // batch)  # copied: one sequence's prefill
    prefill_s = start(runner, prompt, settings.max_length(context), chunk, copied)
    mem_prefill, _ = memory_used(settings.device)
    times, logits = [], []

    for i in range(forced.shape[1]):
        t0 = time.perf_counter()
        # runners.py: why batches > 1 are greedy
        lg = runner.step(forced[:, i:i + 1]) if batch == 1 else runner.greedy_step()
        dt = time.perf_counter() - t0
        if i >= settings.warmup:
            times.append(dt)
            if batch == 1:
                logits.append(np.asarray(lg, np.float32))  # untimed: runners.py says why
    mem_decode, _ = memory_used(settings.device)
    runner.release()
    ms = statistics.median(times) * 1e3
    peak = None if base_mem is None else max(mem_prefill, mem_decode) - base_mem
    return dict(context=context, batch=batch, prefill_s=prefill_s, ms_per_token=ms, tokens_per_s=batch * 1e3 / ms,
                ms_per_token_min=min(times) * 1e3, memory_bytes=peak,
                logits=np.stack(logits) if logits else None)


def _child_answer(module: str, *args: str) -> tuple[dict | None, str]:
    """Runs `python -m module args` and returns (its last stdout line that is a JSON object, "") or, when it ends
    without one or fails, (None, "exit STATUS: the end of its stderr")."""
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        return None, f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    return json.loads(lines[-1]), ""


def fit_batch(folder: Path, settings: Settings, per_token: int, log) -> dict:
    """The largest batch of fit_context-token sequences whose cache allocates and decodes: starts from the free
    memory with the model loaded over the cache bytes of one sequence and steps down 5 % per failure. Each try
    runs in a process of its own (fit_probe.py): a failed allocation leaves onnxruntime's arena holding what it
    grew, for every later model of the process. Every row is tried by dot4attn.runtime.inplace (the caches as the only
    per-sequence memory): onnxruntime-genai-cuda 0.18 refuses a batch over 32 ("batch_size (36) must be in
    [1, 32]"), a runtime limit, not the memory this search is after."""
    max_length = settings.max_length(settings.fit_context)

    def probe(batch: int) -> dict:
        answer, error = _child_answer("dot4attn.e2e.fit_probe", "inplace", str(folder), settings.device, str(batch),
                                      str(max_length))
        return answer if answer is not None else dict(fits=False, free=None, error=error)

    first = probe(0)
    if not first.get("free"):
        return dict(fit_batch=None, fit_note=f"device memory not measurable ({first.get('error') or 'no torch'})")
    per_seq = per_token * max_length
    guess = max(1, int(first["free"] * 0.97 // per_seq))
    note = f"free {first['free'] / 2**30:.1f} GiB after model load, {per_seq / 2**20:.0f} MiB cache per sequence"
    for _ in range(16):
        got = probe(guess)
        if got["fits"]:
            return dict(fit_batch=guess, fit_note=note)
        log(f"  batch {guess} at {settings.fit_context} did not fit ({got['error'][:80]}); trying smaller")
        guess = int(guess * 0.95)
        if guess < 1:
            break
    return dict(fit_batch=0, fit_note="no batch fitted")


def run_rows(folders: dict[str, Path | str], settings: Settings, vocab: int, log=print, on_case=None,
             previous: list[dict] | None = None, rows: list[str] | None = None,
             references: Path | None = None) -> list[dict]:
    """One result dict per row and case (plus one per unavailable row, with its reason, and one per row's fit
    search). The fit searches run first, each try in a process of its own, while this process holds no device
    memory. Then the rows one after another (row 1 first: its batch-1 logits are every other row's reference),
    each case with a fresh model (four 7B models do not fit one GPU together, and a failed case must not leave its
    memory to the next). A case that fails (out of memory, say) is kept with its reason and the run goes on.
    on_case(results) runs after every case, so a stopped run keeps what it measured.

    previous: results of an earlier run of the same settings (--resume); what they hold is not measured again, except
    the failed cases of the rows run now.
    rows: the rows to run (default all; the others are neither run nor reported). references: a folder keeping
    row 1's batch-1 logits per context, so that a row measured in a later run is still compared with row 1."""
    # a case that failed is measured again when its row runs (a row whose prompt ran out of the arena another row's
    # prompt grew gets a process of its own that way); the rows not run keep what they had
    results = [dict(r) for r in previous or []
               if "unavailable" not in r and not ("failed" in r and (rows is None or r["row"] in rows))]
    results += [dict(row=row, label=label, unavailable=folders.get(row) or "not built")
                for row, label in ROWS.items()
                if not isinstance(folders.get(row), Path) and (rows is None or row in rows)]
    done = {(r["row"], r.get("context"), r.get("batch"), "fit_batch" in r) for r in results}
    wanted = [row for row in ROWS if isinstance(folders.get(row), Path) and (rows is None or row in rows)]
    per_token = {row: cache_bytes_per_token(folders[row]) for row in wanted}
    for row in wanted if settings.fit_context else []:  # first: this process holds no device memory yet
        if (row, None, None, True) not in done:
            log(f"{row}: largest batch of {settings.fit_context}-token sequences")
            results.append(dict(row=row, label=ROWS[row], cache_bytes_per_token=per_token[row],
                                **fit_batch(folders[row], settings, per_token[row], log)))
            if on_case:
                on_case(results)
    measure = _measure_in_process if settings.case_processes else _measure  # each process warms itself up
    left = any((row, c, b, False) not in done for row in wanted for c, b in settings.cases())
    if left and not settings.case_processes:
        _warm_up(wanted[0], folders[wanted[0]], settings, vocab, log)
    for row in wanted:
        cases = [(c, b) for c, b in settings.cases() if (row, c, b, False) not in done]
        for context, batch in cases:
            copied = batch > 1 and context in settings.copied_contexts
            log(f"{row}: context {context}, batch {batch}" + (", one sequence's prompt copied" if copied else ""))
            r, failed = measure(row, folders[row], settings, context, batch, vocab, settings.cuda_graph, copied)
            graph_note = None
            if copied and r:
                r["note"] = (f"decoded by dot4attn.runtime.inplace over one sequence's prefill ({r['prefill_s']:.3g} s) "
                             "copied to the batch (--copied-prompt-contexts)")
                r["prefill_s"] = None
                r["copied_prompt"] = True
            if failed and settings.cuda_graph and not copied and not _out_of_memory(failed):
                # onnxruntime-genai's CUDA graph mode binds a cache-long mask from the prompt on, which ORT's
                # GroupQueryAttention refuses for a batch > 1 prompt ("batch_size must be 1 when sequence_length
                # > 1 and past context is given"): such a row runs launched, and says so
                log(f"  with a CUDA graph: {failed}; again, launched")
                graph_note = f"launched (its CUDA graph mode failed: {failed[:160]})"
                r, failed = measure(row, folders[row], settings, context, batch, vocab, False)
            if failed:
                log(f"  failed: {failed}")
                results.append(dict(row=row, label=ROWS[row], context=context, batch=batch, failed=failed))
                if on_case:
                    on_case(results)
                continue
            logits = r.pop("logits")
            ref_file = None if references is None else references / _reference_name(settings, context)
            if logits is not None and row == "genai" and ref_file is not None:
                ref_file.parent.mkdir(parents=True, exist_ok=True)
                np.save(ref_file, logits)
            elif logits is not None and ref_file is not None and ref_file.is_file():
                r.update(_agreement(np.load(ref_file), logits))
            r.update(row=row, label=ROWS[row], cache_bytes_per_token=per_token[row],
                     cache_bytes=per_token[row] * context * batch,
                     cuda_graph=settings.cuda_graph and graph_note is None)
            if row in OPS_ROWS and library_digest():
                r["library"] = library_digest()
            r["runner"] = "inplace" if r.get("copied_prompt") else RUNNER[row]
            if graph_note:
                r["note"] = graph_note
            prefill = "-" if r["prefill_s"] is None else f"{r['prefill_s']:.2f}"
            log(f"  prefill {prefill} s, {r['ms_per_token']:.2f} ms/token, "
                f"{r['tokens_per_s']:.1f} tokens/s" + (f", KL {r['kl']:.2e}" if "kl" in r else ""))
            results.append(r)
            if on_case:
                on_case(results)
    return results


WARM_UP_TOKENS = 64


def _warm_up(row: str, folder: Path, settings: Settings, vocab: int, log) -> None:
    """One untimed short case on `row`'s model before the first timed case: what the process pays once (the execution
    provider's libraries and handles, the device context, the first kernels' loading) would otherwise land on the
    first case's time to first token, which is row 1's (a 4k prompt read 1.1 s there against 0.2-0.4 s in a warm
    process). A failure here is left to the timed cases to report."""
    _, failed = _measure(row, folder, settings, WARM_UP_TOKENS, 1, vocab, settings.cuda_graph)
    if failed:
        log(f"warm-up: {failed}")


def _measure(row: str, folder: Path, settings: Settings, context: int, batch: int, vocab: int,
             cuda_graph: bool, copied: bool = False) -> tuple[dict | None, str | None]:
    """(result, None) or (None, the error's line): one case with a fresh model (its memory is the case's own).
    copied: by dot4attn.runtime.inplace, one sequence prefilled and its cache copied to the batch."""
    gc.collect()
    base_mem, _ = memory_used(settings.device)
    runner = make_runner("inplace-copied" if copied else RUNNER[row], folder, settings.device, cuda_graph,
                         settings.threads)
    try:
        r, failed = run_case(runner, settings, context, batch, vocab, base_mem, copied), None
    except Exception as e:  # noqa: BLE001 - out of memory, say: kept as the case's result, run goes on
        r, failed = None, error_line(e)
    runner.close()
    del runner
    return r, failed


def _measure_in_process(row: str, folder: Path, settings: Settings, context: int, batch: int, vocab: int,
                        cuda_graph: bool, copied: bool = False) -> tuple[dict | None, str | None]:
    """_measure in a process of its own (case_process.py), after an untimed warm-up case there; the logits come back
    through a file. A process that ends without its answer is the case's failure, with its exit status and last
    words."""
    with tempfile.TemporaryDirectory(prefix="d4a-e2e-case-") as tmp:
        spec = Path(tmp) / "case.json"
        logits = Path(tmp) / "logits.npy"
        spec.write_text(json.dumps(dict(row=row, folder=str(folder), settings=asdict(settings), context=context,
                                        batch=batch, vocab=vocab, cuda_graph=cuda_graph, copied=copied,
                                        logits=str(logits))))
        answer, error = _child_answer("dot4attn.e2e.case_process", str(spec))
        if answer is None:
            return None, f"case process {error}"
        r = answer["result"]
        if r is not None:
            r["logits"] = np.load(logits) if logits.is_file() else None
        return r, answer["failed"]


def _out_of_memory(error: str) -> bool:
    return any(k in error.lower() for k in ("alloc", "out of memory"))


def _reference_name(settings: Settings, context: int) -> str:
    return f"row1-logits-c{context}-seed{settings.seed}-w{settings.warmup}-n{settings.steps}.npy"


def _agreement(ref: np.ndarray, new: np.ndarray) -> dict:
    agree, kl, _ = logit_metrics(ref, new)
    return dict(kl=float(kl.mean()), kl_max=float(kl.max()), top1=float(agree.mean()))
