"""Decoder runners: one interface (runtime.decoder.Decoder: reset / prefill / step / greedy_step / release /
close, and the cache's bytes per token) over the three ways dot4attn runs a model with its KV cache.

    DecoderSession(path)            an exported .onnx decoder, the cache fed back as numpy arrays (runtime.session)
    InPlaceDecoder(folder, device)  a genai folder, the cache resident on the device and appended in place
                                    (runtime.inplace; runs q4_0 / q6_0 V rows folders too)
    OgDecoder(folder, device)       a genai folder through onnxruntime-genai's og.Generator (runtime.og)

`open_decoder(path, runner=...)` picks by what `path` is. Each module imports onnxruntime (and og) when used.
"""
from __future__ import annotations

import os
from pathlib import Path

from .decoder import Decoder, prefill_in_chunks, providers_for

__all__ = ["Decoder", "DecoderSession", "InPlaceDecoder", "OgDecoder", "open_decoder", "prefill_in_chunks",
           "providers_for"]


def __getattr__(name: str):  # the runners import onnxruntime: only when asked for
    if name == "DecoderSession":
        from .session import DecoderSession

        return DecoderSession
    if name == "InPlaceDecoder":
        from .inplace import InPlaceDecoder

        return InPlaceDecoder
    if name == "OgDecoder":
        from .og import OgDecoder

        return OgDecoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_decoder(path: str | os.PathLike, device: str = "cpu", runner: str | None = None, **options) -> Decoder:
    """A decoder for `path`: an .onnx file runs in DecoderSession; a genai folder in OgDecoder (runner "og") or
    InPlaceDecoder (runner "inplace"); runner None picks "inplace" for a folder written for it (dot4attn.json's
    runner) and "og" otherwise. options go to the runner's constructor."""
    from ..model_io import folder_facts, is_genai_folder

    path = Path(path)
    if not is_genai_folder(path):
        if runner not in (None, "session"):
            raise ValueError(f"{path}: runner {runner!r} runs genai folders; an .onnx file runs in DecoderSession")
        from .session import DecoderSession

        return DecoderSession(str(path), providers=providers_for(device), **options)
    runner = runner or folder_facts(path).get("runner", "og")
    if runner == "og":
        from .og import OgDecoder

        return OgDecoder(path, device=device, **options)
    if runner == "inplace":
        from .inplace import InPlaceDecoder

        return InPlaceDecoder(path, device=device, **options)
    raise ValueError(f"runner: expected og or inplace for a genai folder, got {runner!r}")
