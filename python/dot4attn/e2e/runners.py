"""One interface over the two ways the benchmark drives a model folder: onnxruntime-genai's og.Generator and
dot4attn.inplace's InPlaceDecoder. Both take the same prompt (chunked prefill) and the same teacher-forced tokens,
and both hand a teacher-forced step's last-position logits back to the host in the model's dtype (og's get_output
copies the model's own output; InPlaceDecoder with host_logits="model") and a greedy step's next tokens alone, so
their step times compare like for like. Converting a float16 copy to float32 in numpy costs more than the copy
(0.8 ms for one row of a 152k vocabulary on a 2-core x86 host): the harness does it outside the timed step, only
for the logits it keeps.

    r = make_runner("og", folder, device="cuda", cuda_graph=True)
    prefill_s = r.start(prompt, max_length, chunk)     # prompt [B, S]
    logits = r.step(tokens)                              # tokens [B, 1] -> [B, vocab] (float16 or float32)
    ids = r.step(None)                                   # greedy: the runner's own next tokens -> those [B]

Batch 1 is teacher-forced (the same tokens for every row, so logits compare). onnxruntime-genai 0.18 takes
append_tokens only once for a batch > 1: there the prompt goes in one call and every step is greedy, as a
generation loop runs it: one model run, the argmax on the device and the next tokens to the host
(generate_next_token + get_next_tokens; InPlaceDecoder.greedy_step), no logits. og's get_output("logits") at
batch 16 allocates and frees a pinned host buffer every call (cudaHostAlloc 2.1 ms + cudaFreeHost 0.9 ms a step
on an H200 host, 15.2 ms per step against 7.6 by InPlaceDecoder over the same row-3 folder at 16 x 16k), so a
batch > 1 is timed on its tokens alone and not compared.
    r.stop()
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


class OgRunner:
    """og.Generator: append_tokens runs the model over the given tokens (the prompt, in chunks, then one token per
    step); get_output("logits") copies the last logits to the host. Teacher-forced steps (append_tokens of a fixed
    token) cost what generate_next_token does -- one model run -- and keep every row on the same tokens.

    cuda_graph: the CUDA provider option enable_cuda_graph=1 (what the builder's `enable_cuda_graph=true` writes
    into genai_config.json), set when the model is loaded: onnxruntime-genai then captures its one-token steps
    as a CUDA graph and replays them (its mask becomes a [batch, max_length] buffer updated in place)."""

    def __init__(self, folder: Path, device: str, cuda_graph: bool = False):
        from ..genai import import_og

        if cuda_graph and device != "cuda":
            raise ValueError(f"cuda_graph needs device='cuda', got device={device!r}")
        self.og = import_og()
        config = self.og.Config(str(folder))
        if cuda_graph:
            config.set_provider_option("cuda", "enable_cuda_graph", "1")
        self.model = self.og.Model(config)
        self.gen = None
        self.last = None  # the last position's logits of start() and step(tokens), as InplaceRunner keeps them

    def start(self, prompt: np.ndarray, max_length: int, chunk: int) -> float:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length, do_sample=False, batch_size=prompt.shape[0])
        self.gen = self.og.Generator(self.model, params)
        if prompt.shape[0] > 1:
            chunk = prompt.shape[1]  # one append_tokens call per batch > 1
        t0 = time.perf_counter()
        for s in range(0, prompt.shape[1], chunk):
            self.gen.append_tokens(np.ascontiguousarray(prompt[:, s:s + chunk], np.int32))
        logits = np.asarray(self.gen.get_output("logits"))  # waits for the device
        elapsed = time.perf_counter() - t0
        self.last = logits[:, -1] if logits.ndim == 3 else logits  # [B, S, vocab] or the builder's [B, vocab]
        return elapsed

    def step(self, tokens: np.ndarray | None) -> np.ndarray:
        if tokens is None:  # a greedy step as a generation loop runs it: only the next tokens reach the host
            self.gen.generate_next_token()
            return np.asarray(self.gen.get_next_tokens())
        self.gen.append_tokens(np.ascontiguousarray(tokens, np.int32))
        self.last = np.asarray(self.gen.get_output("logits"))[:, -1]
        return self.last

    def stop(self) -> None:
        self.gen = None

    def close(self) -> None:
        self.gen = self.model = None


class InplaceRunner:
    """dot4attn.inplace.InPlaceDecoder: the caches allocated once on the device, bound as past and present;
    cuda_graph: its decode steps replay as a CUDA graph. copied: start() prefills the prompt's first sequence
    alone and copies its cache to the whole batch (InPlaceDecoder.prompt_copied), for a batch whose prompt does
    not fit in memory at once; `chunk` is then that sequence's tokens per call."""

    def __init__(self, folder: Path, device: str, cuda_graph: bool = False, copied: bool = False):
        from ..inplace import InPlaceDecoder

        # the model's logits dtype, as og's get_output: the same bytes cross to the host on every row
        self.dec = InPlaceDecoder(folder, device=device, cuda_graph=cuda_graph, host_logits="model")
        self.copied = copied
        self.last = None

    def start(self, prompt: np.ndarray, max_length: int, chunk: int) -> float:
        self.dec.reset(prompt.shape[0], max_length)
        t0 = time.perf_counter()
        if self.copied:
            self.last = self.dec.prompt_copied(prompt[:1], chunk)
            return time.perf_counter() - t0
        for s in range(0, prompt.shape[1], chunk):
            self.last = self.dec.step(prompt[:, s:s + chunk])  # returns host logits: waits for the device
        return time.perf_counter() - t0

    def step(self, tokens: np.ndarray | None) -> np.ndarray:
        # None: a greedy step, fed the argmax of the last step and handing back its own (both on the device)
        self.last = self.dec.greedy_step() if tokens is None else self.dec.step(tokens)
        return self.last

    def stop(self) -> None:
        self.dec.values = {}
        self.dec.binding = None

    def close(self) -> None:
        self.dec = None


def make_runner(kind: str, folder: Path, device: str, cuda_graph: bool = False):
    """kind: og, inplace, or inplace-copied (InplaceRunner with copied=True)."""
    if kind == "og":
        return OgRunner(folder, device, cuda_graph)
    if kind in ("inplace", "inplace-copied"):
        return InplaceRunner(folder, device, cuda_graph, copied=kind == "inplace-copied")
    raise ValueError(f"unknown runner {kind!r} (og, inplace or inplace-copied)")


def cache_bytes_per_token(folder: Path) -> int:
    """KV-cache bytes per token of one sequence, all layers, from the decoder's past_key_values inputs (the
    builder's float or int8 caches, dot4attn's packed rows)."""
    import json

    import onnx

    from ..model_io import PAST_RE

    cfg = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["decoder"]
    proto = onnx.load(str(Path(folder) / cfg["filename"]), load_external_data=False)
    total = 0
    for i in proto.graph.input:
        if PAST_RE.match(i.name):
            dims = i.type.tensor_type.shape.dim
            heads = dims[1].dim_value
            last = dims[3].dim_value or int(cfg["head_size"])
            total += heads * last * onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).itemsize
    return total
