"""The two ways the benchmark drives a model folder, both the runtime's Decoder interface (dot4attn.runtime):
onnxruntime-genai's og.Generator (OgDecoder) and the in-place runner (InPlaceDecoder). Both take the same prompt (chunked prefill) and the same teacher-forced tokens,
and both hand a teacher-forced step's last-position logits back to the host in the model's dtype (og's get_output
copies the model's own output; InPlaceDecoder with host_logits="model") and a greedy step's next tokens alone, so
their step times compare like for like. Converting a float16 copy to float32 in numpy costs more than the copy
(0.8 ms for one row of a 152k vocabulary on a 2-core x86 host): the harness does it outside the timed step, only
for the logits it keeps.

    dec = make_runner("og", folder, device="cuda", cuda_graph=True)
    prefill_s = start(dec, prompt, max_length, chunk)   # prompt [B, S]
    logits = dec.step(tokens)                            # tokens [B, 1] -> [B, vocab] (the model's dtype)
    ids = dec.greedy_step()                              # greedy: the runner's own next tokens -> those [B]

Batch 1 is teacher-forced (the same tokens for every row, so logits compare). onnxruntime-genai 0.18 takes
append_tokens only once for a batch > 1: there the prompt goes in one call and every step is greedy, as a
generation loop runs it: one model run, the argmax on the device and the next tokens to the host
(greedy_step: generate_next_token + get_next_tokens; InPlaceDecoder's head on the device), no logits. og's get_output("logits") at
batch 16 allocates and frees a pinned host buffer every call (cudaHostAlloc 2.1 ms + cudaFreeHost 0.9 ms a step
on an H200 host, 15.2 ms per step against 7.6 by InPlaceDecoder over the same row-3 folder at 16 x 16k), so a
batch > 1 is timed on its tokens alone and not compared.
    dec.release()
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np



def make_runner(kind: str, folder: Path, device: str, cuda_graph: bool = False, threads: int | None = None):
    """kind: og (OgDecoder), inplace or inplace-copied (InPlaceDecoder; the harness's `start(copied=True)` then
    prefills one sequence and copies its cache to the batch: for a batch whose prompt does not fit at once). Both hand
    logits back in the model's dtype (og's get_output copies the model's own output): the same bytes cross to the host.
    threads: ONNX Runtime's intra-op threads for either (None: each runtime's own default, which differ: on a 2-core
    x86 VM onnxruntime-genai's session ran one thread where a plain InferenceSession ran two, and the same q8_0 folder
    prefilled 2048 tokens in 12.5 s under og.Generator against 6.4 s in place)."""
    if kind == "og":
        from ..runtime.og import OgDecoder

        return OgDecoder(folder, device, cuda_graph=cuda_graph, host_logits="model", threads=threads)
    if kind in ("inplace", "inplace-copied"):
        from ..runtime.inplace import InPlaceDecoder

        return InPlaceDecoder(folder, device=device, cuda_graph=cuda_graph, host_logits="model", threads=threads)
    raise ValueError(f"unknown runner {kind!r} (og, inplace or inplace-copied)")


def start(dec, prompt: np.ndarray, max_length: int, chunk: int, copied: bool = False) -> float:
    """reset + the prompt's prefill in calls of `chunk` tokens (copied: one sequence's, copied to the batch by
    InPlaceDecoder.prompt_copied); returns the prefill's seconds (the logits reach the host: the device is done)."""
    dec.reset(prompt.shape[0], max_length)
    t0 = time.perf_counter()
    if copied:
        dec.prompt_copied(prompt[:1], chunk)
    else:
        dec.prefill(prompt, chunk=chunk)
    return time.perf_counter() - t0
