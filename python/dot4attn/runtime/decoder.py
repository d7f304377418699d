"""The interface every decoder runner of dot4attn implements, and the pieces they share.

A decoder owns its KV cache between calls (numpy arrays, device buffers appended in place, or og.Generator's):

    dec.reset(batch, max_length)          # an empty cache for `batch` sequences of at most max_length tokens
    logits = dec.prefill(ids, chunk=n)     # the prompt [B, S] in calls of at most n tokens -> last logits [B, vocab]
    logits = dec.step(ids)                 # the next tokens [B, S] (teacher-forced) -> last logits [B, vocab]
    logits = dec.step_all(ids)             # the same, every fed position's logits [B, S, vocab] (float32)
    ids = dec.greedy_step()                # feeds each row the argmax of the last logits -> this step's argmax [B]
    dec.cache_bytes_per_token()            # cache bytes one token adds, batch 1, all layers
    dec.release(); dec.close()             # free the cache; free everything

Implemented by DecoderSession (exported .onnx models, runtime.session), InPlaceDecoder (genai folders, the cache
resident on the device, runtime.inplace) and OgDecoder (genai folders through og.Generator, runtime.og).
`mask` arguments ([B, length + S], 1 for a real token) let rows of a batch hold prompts of different lengths
(left padding); the default is all ones.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Decoder(Protocol):
    batch: int
    length: int  # tokens in the cache of every row (padding included)

    def reset(self, batch: int, max_length: int) -> None: ...

    def prefill(self, ids: np.ndarray, mask: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray: ...

    def step(self, ids: np.ndarray | None, mask: np.ndarray | None = None) -> np.ndarray: ...

    def step_all(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray: ...

    def greedy_step(self, mask: np.ndarray | None = None) -> np.ndarray: ...

    def cache_bytes_per_token(self) -> int: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


def prefill_in_chunks(dec, ids: np.ndarray, mask: np.ndarray | None, chunk: int | None) -> np.ndarray:
    """dec.step over the prompt in calls of at most `chunk` tokens (None: one call), each call given the mask up to
    its last token; returns the last call's logits. Chunks bound a long prompt's activations (they grow with
    B x chunk) and are how a model's runtime feeds it."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ValueError(f"ids: expected a prompt [B, S >= 1], got shape {ids.shape}")
    n = ids.shape[1] if chunk is None else int(chunk)
    if n < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    start = dec.length
    if mask is not None and np.shape(mask) != (ids.shape[0], start + ids.shape[1]):
        raise ValueError(f"mask: expected shape [batch={ids.shape[0]}, {start + ids.shape[1]}], got "
                         f"{np.shape(mask)}")
    logits = None
    for s in range(0, ids.shape[1], n):
        part = ids[:, s:s + n]
        logits = dec.step(part, None if mask is None else mask[:, :start + s + part.shape[1]])
    return logits


def providers_for(device: str) -> list[str]:
    """ONNX Runtime's execution providers for a device name of the CLI (cpu, cuda)."""
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def greedy(dec: Decoder, prompts: list[list[int]], new_tokens: int, pad: int = 0) -> list[list[int]]:
    """Greedy generation of `new_tokens` for a batch of prompts (left-padded with `pad`, masked out) on any
    Decoder: one prefill, then greedy steps (only the next ids come back where the decoder can keep the logits)."""
    n = max(len(p) for p in prompts)
    ids = np.array([[pad] * (n - len(p)) + list(p) for p in prompts], np.int64)
    mask = np.array([[0] * (n - len(p)) + [1] * len(p) for p in prompts], np.int64)
    dec.reset(len(prompts), n + new_tokens)
    nxt = dec.prefill(ids, mask).argmax(-1)
    out = [[] for _ in prompts]
    for i in range(new_tokens):
        for b, t in enumerate(nxt):
            out[b].append(int(t))
        if i + 1 < new_tokens:  # feeds nxt; only the next ids come back (the logits stay on the device)
            mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
            nxt = dec.greedy_step(mask)
    return out
