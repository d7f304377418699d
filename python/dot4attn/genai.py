"""onnxruntime-genai model folders: rewrite one onto the packed cache, run one through `og.Generator`.

    dot4attn rewrite GENAI_DIR OUT_DIR        # folder in, folder out (IN is never touched)
    dot4attn generate OUT_DIR --prompt-ids 1,2,3

A genai folder (what `python -m onnxruntime_genai.models.builder` writes) holds genai_config.json, the decoder
(model.onnx and its external data) and tokenizer files. The rewrite replaces every GroupQueryAttention by
Dot4GroupQueryAttention (dot4attn.passes.genai_gqa), copies the op library into OUT and names it in
genai_config.json (model.decoder.session_options.custom_ops_library, resolved by genai in the model folder),
copies every other file, and records the cache layout in dot4attn.json. Everything is written into a temporary
folder next to OUT and renamed into place at the end: on any error nothing is left behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, get_library_path

CONFIG = "genai_config.json"
FACTS = "dot4attn.json"
LIBRARY = "libdot4attn_ops.so"


class GenaiError(Exception):
    """A genai folder that cannot be rewritten or run; the message names the file and why. Nothing is written."""


@dataclass
class GenaiRewriteReport:
    layers: int
    head_size: int
    kv_heads: int
    v_format: str
    bytes_per_token_before: int
    bytes_per_token_after: int
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        r = self.bytes_per_token_before / max(1, self.bytes_per_token_after)
        return [f"{self.layers} GroupQueryAttention layers -> Dot4GroupQueryAttention (K q8_0, V {self.v_format}; "
                f"{self.kv_heads} KV heads, head size {self.head_size})",
                f"KV-cache bytes per token (batch 1, all layers): {self.bytes_per_token_before} -> "
                f"{self.bytes_per_token_after} ({r:.2f}x smaller)"] + [f"note: {n}" for n in self.notes]


def is_genai_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def read_config(folder: Path) -> dict:
    cfg_path = folder / CONFIG
    if not cfg_path.is_file():
        raise GenaiError(f"{folder}: no {CONFIG} (not an onnxruntime-genai model folder)")
    try:
        cfg = json.loads(cfg_path.read_text())
        cfg["model"]["decoder"]["filename"]
    except (ValueError, KeyError, TypeError) as e:
        raise GenaiError(f"{cfg_path}: not a genai config with model.decoder.filename ({e})") from None
    return cfg


def context_length(cfg: dict) -> int | None:
    """The most positions the folder's model takes: model.context_length, else search.max_length; None when the
    config names neither."""
    n = cfg["model"].get("context_length") or cfg.get("search", {}).get("max_length")
    return int(n) if n else None


def _external_files(model_path: Path) -> set[str]:
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    names = set()
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in t.external_data if e.key == "location")
    return names


def rewrite_folder(src: str | os.PathLike, dst: str | os.PathLike, v_format: str = "q8_0") -> GenaiRewriteReport:
    """Rewrites the genai folder `src` into the new folder `dst` (which must not exist, or be empty)."""
    from .passes import RewriteError, load_checked, save_atomic
    from .passes.genai_gqa import GenaiRewriteError, float_mask_sum, rewrite_gqa, row_bytes

    src, dst = Path(src).resolve(), Path(dst).resolve()
    if not src.is_dir():
        raise GenaiError(f"{src}: no such folder")
    if dst == src or src in dst.parents:
        raise GenaiError(f"OUT ({dst}) must be a new folder outside IN ({src})")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise GenaiError(f"{dst}: exists and is not an empty folder (nothing is overwritten)")
    cfg = read_config(src)
    if (src / FACTS).exists():
        raise GenaiError(f"{src}: already rewritten by dot4attn ({FACTS} is there)")
    decoder = cfg["model"]["decoder"]
    model_name = decoder["filename"]
    model_path = src / model_name
    if not model_path.is_file():
        raise GenaiError(f"{model_path}: the decoder named in {CONFIG} is missing")
    lib = Path(get_library_path())
    parent = dst.parent
    if not parent.is_dir():
        raise GenaiError(f"{parent}: the folder that would hold OUT does not exist")
    if not os.access(parent, os.W_OK):
        raise GenaiError(f"{parent}: not writable (OUT cannot be created)")

    try:
        model = load_checked(model_path)
        before = _kv_bytes(model, decoder.get("head_size"))
        layers = rewrite_gqa(model, v_format, decoder.get("head_size"))
        after = _kv_bytes(model, None)
        positions = context_length(cfg)
        float_sums = float_mask_sum(model.graph, positions) if positions else 0
    except (RewriteError, GenaiRewriteError) as e:
        raise GenaiError(f"{model_path}: {e}") from None
    report = GenaiRewriteReport(len(layers), layers[0].head_size, layers[0].kv_heads, v_format, before, after)
    if float_sums:
        report.notes.append("the sequence lengths (ReduceSum of attention_mask) are summed in float32, exact up to "
                            "2^24 positions: ONNX Runtime's CUDA ReduceSum of integers walks the mask in one block "
                            "per row")

    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=parent))
    try:
        try:
            save_atomic(model, tmp / model_name, check=False, share_external=True)
        except RewriteError as e:  # a write error (full disk, ...): it names the temp copy inside OUT's folder
            raise GenaiError(f"writing {dst}: {e}") from None
        skip = {model_name, CONFIG} | _external_files(model_path)
        for item in src.iterdir():
            if item.name in skip:
                continue
            if item.is_dir():
                shutil.copytree(item, tmp / item.name, symlinks=False)
            else:
                shutil.copy2(item, tmp / item.name)
        shutil.copy2(lib, tmp / LIBRARY)
        opts = decoder.setdefault("session_options", {})
        opts["custom_ops_library"] = LIBRARY
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=4) + "\n")
        facts = {"dot4attn_version": __version__, "op": "Dot4GroupQueryAttention", "source": src.name,
                 "layers": report.layers, "kv_heads": report.kv_heads, "head_size": report.head_size,
                 "k_format": "q8_0", "v_format": v_format,
                 "k_row_bytes": row_bytes(report.head_size, "q8_0"), "v_row_bytes": row_bytes(report.head_size, v_format),
                 "kv_bytes_per_token_before": before, "kv_bytes_per_token_after": after,
                 "mask_sum_float32": bool(float_sums)}
        (tmp / FACTS).write_text(json.dumps(facts, indent=2) + "\n")
        if dst.exists():
            dst.rmdir()  # empty (checked above)
        os.rename(tmp, dst)
    except OSError as e:
        raise GenaiError(f"writing {dst}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _kv_bytes(model, head_size: int | None) -> int:
    from .model_io import PAST_RE

    total = 0
    for v in model.graph.inputs:
        m = PAST_RE.match(v.name or "")
        if m and v.shape is not None and len(v.shape) == 4:
            h, d = v.shape[1], v.shape[3]
            d = d if isinstance(d, int) else head_size
            if isinstance(h, int) and isinstance(d, int):
                total += int(h * d * v.dtype.itemsize)
    return total


def generate(folder: str | os.PathLike, prompts: list[list[int]], max_new_tokens: int,
             share_buffer: bool | None = None, max_length: int | None = None) -> list[list[int]]:
    """Greedy generation under onnxruntime-genai: the new tokens of each prompt (one batch)."""
    og = import_og()
    cfg = og.Config(str(folder))
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
    import numpy as np

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
