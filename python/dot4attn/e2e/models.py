"""The four model folders of the end-to-end benchmark, built once into a cache folder and reused.

    folders = prepare(Path("~/.cache/dot4attn/e2e"), ModelSpec("qwen2.5-0.5b", "int4", "cpu", max_positions=33000))

From one random-weight Hugging Face model (dot4attn.models.genai_builder) the builder makes the baseline folder (row 1); its
caches, read back after a calibration prompt, give the per-channel scales of ORT's own int8 KV cache, which the
builder then bakes into a second folder (row 2); `dot4attn rewrite` turns the baseline into packed K + q8_0 V
(row 3) and packed K + q4_0 V (row 4), whose weight files are hard links to the baseline's (the rewrite changes the
graph only). Every folder is written under a temporary name and renamed into place, so an interrupted build is
rebuilt on the next run, never half-used. The HF model is removed once both builder folders exist.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..formats import PACKED_FORMATS
from ..models.genai_builder import INT8_SCHEME, atomic_dir, calibrate_kv, write_kv_scales

ROWS = {
    "genai": "GenAI builder model, GQA (model-dtype cache), og.Generator",
    "genai-int8kv": "same + ORT int8 KV cache (int8_per_channel, calibrated), og.Generator",
    "d4a-q8_0": "dot4attn rewrite: packed K + q8_0 V, og.Generator",
    "d4a-q4_0": "packed K + q4_0 V, dot4attn.runtime.inplace (InPlaceDecoder)",
    "d4a-q6_0": "packed K + q6_0 V in the pair layout (ORT int8's bytes), og.Generator",
}
OPS_ROWS = tuple(row for row in ROWS if row.startswith("d4a-"))  # the rows whose models run dot4attn's ops
RUNNER = {"genai": "og", "genai-int8kv": "og", "d4a-q8_0": "og", "d4a-q4_0": "inplace", "d4a-q6_0": "og"}
# The rows a run measures unless --rows names others: row 5 (q6_0 V) is asked for by name.
DEFAULT_ROWS = ("genai", "genai-int8kv", "d4a-q8_0", "d4a-q4_0")
# Every builder run: the LM head over the last position only. Without it a prefill returns [batch, tokens, vocab]
# logits (20 GB in fp32 for one 32k prompt of a 152k vocabulary), for every row alike.
BUILD_OPTIONS = {"prune_lm_head": "true"}


@dataclass(frozen=True)
class ModelSpec:
    shape: str            # a dot4attn.models.genai_builder.SHAPES key
    precision: str        # the builder's -p (int4, fp16, fp32)
    ep: str               # the builder's -e (cpu, cuda)
    max_positions: int    # max_position_embeddings: the builder's context length
    layers: int | None = None  # None: the shape's own layer count
    seed: int = 0

    def key(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        versions = []
        for dist in ("onnxruntime-genai", "onnxruntime-genai-cuda", "transformers", "dot4attn"):
            try:
                versions.append(version(dist))
            except PackageNotFoundError:
                versions.append("-")
        digest = hashlib.sha1(repr((self, versions, BUILD_OPTIONS)).encode()).hexdigest()[:10]
        return f"{self.shape}-{self.precision}-{self.ep}-{digest}"


def _hf_device() -> tuple[str, str]:
    """(dtype, device) for the random init: float16 on a CUDA device when torch sees one (a 7B shape in seconds),
    else float32 on the CPU."""
    import torch

    return ("float16", "cuda") if torch.cuda.is_available() else ("float32", "cpu")


def unavailable(row: str, ep: str) -> str | None:
    """Why `row` cannot run on the builder's execution provider `ep` in this process, or None. Every row runs on
    the CPU and CUDA EPs (q6_0 V on CUDA at head sizes that are multiples of 64, as the real shapes' 64 and 128; at
    another head size its cases fail with the GPU planner's error, kept as their reason)."""
    return None


def prepare(cache: Path, spec: ModelSpec, calib_tokens: int = 512, log=print,
            rows: list[str] | tuple[str, ...] = DEFAULT_ROWS) -> dict[str, Path | str]:
    """Builds (or finds) the folders of `rows` (row 1's always: the others come from it) under cache/spec.key();
    a row whose folder cannot be built maps to the reason (a string) instead of a path. rows=["genai"] makes the
    HF model and row 1's folder only, which needs no GPU build of onnxruntime (a machine can make them while the
    rest is still being installed)."""
    from ..models.genai_builder import SHAPES, build_genai, make_hf_model
    from ..passes.genai_folder import rewrite_folder

    if spec.shape not in SHAPES:
        raise ValueError(f"unknown model shape {spec.shape!r}; known: {', '.join(SHAPES)}")
    root = cache / spec.key()

    def hf(tmp: Path):
        dtype, device = _hf_device()
        log(f"random-weight HF model {spec.shape} ({dtype} on {device}) -> {root / 'hf'}")
        make_hf_model(spec.shape, tmp, layers=spec.layers, seed=spec.seed, max_positions=spec.max_positions,
                      dtype=dtype, device=device)

    def builder(extra=None):
        extra = {**BUILD_OPTIONS, **(extra or {})}

        def make(tmp: Path):
            atomic_dir(root / "hf", hf)  # made when a builder needs it, and only then
            options = " ".join(f"{k}={v}" for k, v in extra.items())
            log(f"onnxruntime-genai builder -p {spec.precision} -e {spec.ep} {options} -> {tmp.name}")
            out = build_genai(root / "hf", tmp / "m", spec.precision, spec.ep, extra=extra)
            for item in out.iterdir():
                os.rename(item, tmp / item.name)
            out.rmdir()
            shutil.rmtree(str(tmp / "m") + ".cache", ignore_errors=True)
        return make

    folders: dict[str, Path | str] = {"genai": atomic_dir(root / "genai", builder())}
    if "genai-int8kv" in rows:
        folders["genai-int8kv"] = _int8kv_folder(root, spec, folders["genai"], builder, calib_tokens, log)
    for fmt in PACKED_FORMATS:
        if f"d4a-{fmt}" not in rows:
            continue
        why = unavailable(f"d4a-{fmt}", spec.ep)
        if why:
            folders[f"d4a-{fmt}"] = why
            continue

        def rewrite(tmp: Path, fmt=fmt):
            log(f"dot4attn rewrite --v-format {fmt} -> d4a-{fmt}")
            tmp.rmdir()  # rewrite_folder wants a new or empty folder and writes atomically itself
            # q4_0 V: row 4 runs in place; q6_0 V (row 5): the pair layout, og.Generator
            rewrite_folder(folders["genai"], tmp, fmt, inplace_runner=fmt == "q4_0")
        folders[f"d4a-{fmt}"] = atomic_dir(root / f"d4a-{fmt}", rewrite)
    return folders


def _int8kv_folder(root: Path, spec: ModelSpec, baseline: Path, builder, calib_tokens: int, log) -> Path | str:
    """Row 2: per-channel scales calibrated on row 1's own cache, baked in by the builder; the builder's refusal
    (a string) if it refuses. The HF model goes once both builder folders exist."""
    scales = root / "kv_scales.json"
    if not scales.is_file():
        calib_tokens = min(calib_tokens, spec.max_positions)
        log(f"calibrating int8 KV scales on {calib_tokens} tokens -> {scales}")
        ids = np.random.default_rng(spec.seed + 1).integers(0, _vocab_size(baseline), (1, calib_tokens))
        write_kv_scales(calibrate_kv(baseline, ids, spec.ep), scales)
    try:
        folder = atomic_dir(root / "genai-int8kv", builder(
            {"kv_cache_quant_scheme": INT8_SCHEME, "kv_cache_scale_file": str(scales)}))
    except RuntimeError as e:  # the builder's own refusal, kept as the row's reason
        return f"the model builder refused {INT8_SCHEME}: {str(e).strip().splitlines()[-1]}"
    shutil.rmtree(root / "hf", ignore_errors=True)  # built from: 15 GB at the 7B shape, remade if ever needed
    return folder


def _vocab_size(folder: Path) -> int:
    return int(json.loads((Path(folder) / "genai_config.json").read_text())["model"]["vocab_size"])


def weight_bytes(folder: Path) -> int:
    """Bytes of the decoder's weights that a decode step reads: the model file and its external data, less the
    embedding tables (initializers that only Gather nodes read: a step reads one row of them, not the table)."""
    import onnx

    cfg = json.loads((Path(folder) / "genai_config.json").read_text())
    name = cfg["model"]["decoder"]["filename"]
    total = sum(p.stat().st_size for p in Path(folder).iterdir() if p.name.startswith(name))
    proto = onnx.load(str(Path(folder) / name), load_external_data=False)
    readers: dict[str, set[str]] = {}
    for node in proto.graph.node:
        for i in node.input:
            readers.setdefault(i, set()).add(node.op_type)
    for t in proto.graph.initializer:
        if readers.get(t.name, {"?"}) <= {"Gather", "GatherBlockQuantized"}:
            length = next((int(e.value) for e in t.external_data if e.key == "length"), len(t.raw_data))
            total -= length
    return total
