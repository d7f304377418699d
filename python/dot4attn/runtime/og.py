"""onnxruntime-genai's own runner, og.Generator, over a genai folder (the builder's or `dot4attn rewrite`'s):
`generate` (greedy, a batch of prompts) and `OgDecoder`, the runtime's Decoder interface over it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..model_io import GenaiError, context_length, read_config
from .decoder import prefill_in_chunks


def generate(folder: str | os.PathLike, prompts: list[list[int]], max_new_tokens: int,
             share_buffer: bool | None = None, max_length: int | None = None,
             threads: int | None = None) -> list[list[int]]:
    """Greedy generation under onnxruntime-genai: the new tokens of each prompt (one batch). threads: ONNX Runtime's
    intra-op threads for the decoder (genai's session_options.intra_op_num_threads; None: the folder's own)."""
    og = import_og()
    cfg = og.Config(str(folder))
    if threads:
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": int(threads)}}}}))
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    longest = max(len(p) for p in prompts)
    opts = {"max_length": max_length or longest + max_new_tokens, "do_sample": False, "batch_size": len(prompts)}
    if share_buffer is not None:
        opts["past_present_share_buffer"] = share_buffer
    params.set_search_options(**opts)
    gen = og.Generator(model, params)
    gen.append_tokens(pad_prompts(prompts, _pad_id(folder)))
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        if gen.is_done():
            break
        gen.generate_next_token()
        for b, t in enumerate(gen.get_next_tokens()):
            out[b].append(int(t))
    return out


def pad_prompts(prompts: list[list[int]], pad: int):
    n = max(len(p) for p in prompts)
    return np.array([[pad] * (n - len(p)) + list(p) for p in prompts], np.int32)


def _pad_id(folder) -> int:
    cfg = read_config(Path(folder))
    return int(cfg["model"].get("pad_token_id", 0))


def import_og():
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise GenaiError("onnxruntime-genai is not installed: pip install 'dot4attn[genai]' "
                         "(onnxruntime-genai-cuda for CUDA)") from None
    return og


class OgDecoder:
    """og.Generator over a genai folder, as the runtime's Decoder (runtime.decoder): reset makes a generator,
    prefill / step append tokens (teacher-forced steps cost what generate_next_token does: one model run) and
    copy the last logits to the host (get_output), greedy_step is generate_next_token + get_next_tokens.

    host_logits: "float32" converts the logits, "model" keeps the model's dtype (what get_output copies: a
    benchmark compares that against InPlaceDecoder(host_logits="model")). cuda_graph: the CUDA provider option
    enable_cuda_graph=1 (what the builder's `enable_cuda_graph=true` writes), set when the model is loaded:
    onnxruntime-genai then captures its one-token steps as a CUDA graph. onnxruntime-genai 0.18 takes
    append_tokens only once for a batch > 1, and pads prompts itself: masks other than all ones are refused."""

    def __init__(self, folder: str | os.PathLike, device: str = "cpu", cuda_graph: bool = False,
                 host_logits: str = "float32", threads: int | None = None):
        if cuda_graph and device != "cuda":
            raise ValueError(f"cuda_graph needs device='cuda', got device={device!r}")
        if host_logits not in ("float32", "model"):
            raise ValueError(f"host_logits: expected 'float32' or 'model', got {host_logits!r}")
        self.og = import_og()
        self.folder = Path(folder)
        config = self.og.Config(str(folder))
        if threads:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": int(threads)}}}}))
        options = read_config(self.folder)["model"]["decoder"].get("session_options", {}).get("provider_options", [])
        if device != "cpu" and not any(device in o for o in options):  # a folder built for another device
            config.clear_providers()
            config.append_provider(device)
        if cuda_graph:
            config.set_provider_option("cuda", "enable_cuda_graph", "1")
        self.model = self.og.Model(config)
        self.host_logits = host_logits
        self.gen = None
        self.batch = self.length = 0
        self._appended = False
        self._last = self._pending = None

    def reset(self, batch: int, max_length: int) -> None:
        params = self.og.GeneratorParams(self.model)
        # one position more where the model has it: greedy_step keeps one token appended ahead of `length`
        most = context_length(read_config(self.folder))
        room = int(max_length) + 1 if most is None or int(max_length) < most else int(max_length)
        params.set_search_options(max_length=room, do_sample=False, batch_size=int(batch))
        self.gen = self.og.Generator(self.model, params)
        self.batch, self.length, self._appended = batch, 0, False
        self._last = None      # the last step's host logits (step(None) feeds their argmax)
        self._pending = None   # the ids greedy_step returned: og has appended them, the model has not run on them

    def _ones_only(self, mask) -> None:
        if mask is not None and not np.all(np.asarray(mask) == 1):
            raise ValueError("og.Generator pads prompts itself (pad_token_id): pass mask=None")

    def step(self, ids: np.ndarray | None, mask: np.ndarray | None = None) -> np.ndarray:
        self._ones_only(mask)
        if ids is None:
            if self._pending is not None:
                ids = self._pending[:, None]
            elif self._last is not None:
                ids = self._last.argmax(-1)[:, None]
            else:
                raise ValueError("step(None) feeds the argmax of the previous step's logits: run a prompt first")
        ids = np.ascontiguousarray(ids, np.int32)
        if self.batch > 1 and self._appended:
            raise ValueError("onnxruntime-genai takes append_tokens once for a batch > 1: prefill the whole prompt "
                             "in one call, then greedy_step")
        if self._pending is not None:  # appended by generate_next_token but not fed yet in this interface's terms
            self.gen.rewind_to(self.length)
            self._pending = None
        self.gen.append_tokens(ids)
        self._appended = True
        self.length += ids.shape[1]
        self._fetch()
        return self._last

    def step_all(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """step() returning every fed position's logits [B, S, vocab] (a pruned LM head: [B, 1, vocab])."""
        self.step(ids, mask)
        return np.asarray(self._all, np.float32)

    def _fetch(self) -> np.ndarray:
        """The last call's logits as [B, S, vocab] (the builder's pruned head gives [B, vocab]: one position)."""
        logits = np.asarray(self.gen.get_output("logits"))  # waits for the device
        self._all = logits if logits.ndim == 3 else logits[:, None]
        self._last = (self._all[:, -1].astype(np.float32) if self.host_logits == "float32" else self._all[:, -1])
        return self._all

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
        self._ones_only(mask)
        return prefill_in_chunks(self, ids, None, None if self.batch > 1 else chunk)

    def greedy_step(self, mask: np.ndarray | None = None) -> np.ndarray:
        """One greedy step as a generation loop runs it (only the next tokens reach the host): feeds the argmax of
        the last logits and returns this step's. og's generate_next_token picks a token from the logits it holds,
        appends it, and runs the model on it at its next call; so the first greedy step after a prompt or step()
        calls it twice (the first only picks), and each later one once."""
        self._ones_only(mask)
        if self._pending is None:
            self.gen.generate_next_token()
        self.gen.generate_next_token()
        self._pending = np.asarray(self.gen.get_next_tokens()).astype(np.int64)
        self._last = None
        self.length += 1
        return self._pending.copy()

    def cache_bytes_per_token(self) -> int:
        from ..formats import folder_cache_bytes_per_token

        return folder_cache_bytes_per_token(self.folder)

    def release(self) -> None:
        self.gen = None

    def close(self) -> None:
        self.gen = self.model = None
