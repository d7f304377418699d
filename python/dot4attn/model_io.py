"""Conventions of the exported decoders that the exporter, the graph passes and the decoder runner share.

Cache I/O names: per layer N, inputs `past_key_values.N.<part>` and outputs `present.N.<part>`, where <part> is
key / value (float cache, as exported) or key_payload / key_scales / value_payload / value_scales (packed, after
`dot4attn rewrite`).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(\w+)$")  # group 1: the layer, group 2: the part
FLOAT_PARTS = ("key", "value")

# A model whose initializers hold more bytes than this is saved with its tensors as external data (`<OUT>.data`):
# one ONNX protobuf file cannot pass 2 GiB, and the graph itself needs some room under that.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


@contextlib.contextmanager
def folders_removed_on_failure(folder: Path):
    """For a writer that makes `folder` (and its missing parents) for its output: when the body raises, the folders
    that did not exist before are removed again, innermost first (one something else was written into stays), so a
    failed write leaves no folders behind. The body must have removed its own files by then."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        yield
    except BaseException:
        for p in made:
            try:
                p.rmdir()
            except OSError:
                pass
        raise


class BadModelError(ValueError):
    """A model file the commands refuse before doing anything; the message names the file and what was expected."""


def check_model_file(path) -> "onnx.ModelProto":
    """Loads the ONNX file `path` without its external data and refuses, naming the file and what was expected:
    a missing or empty file, bytes that do not parse as an ONNX model (truncated, not ONNX), a graph without nodes,
    external data that is missing or shorter than its tensors say, an ai.onnx opset newer than the installed onnx
    knows, and a value name with two producers (ONNX graphs are SSA: ORT and the passes would each pick one).
    Returns the ModelProto (external tensors left as references)."""
    import os
    from pathlib import Path

    import onnx

    path = Path(path)
    if not path.is_file():
        raise BadModelError(f"{path}: no such file (expected an ONNX model)")
    size = path.stat().st_size
    if size == 0:
        raise BadModelError(f"{path}: empty file (expected an ONNX model)")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends
        raise BadModelError(f"{path}: cannot parse as an ONNX model (truncated or not ONNX?): "
                            f"{type(e).__name__}: {e}") from None
    if not proto.graph.node:
        raise BadModelError(f"{path}: the model has no nodes (expected an ONNX model; truncated or empty file?)")
    known = onnx.defs.onnx_opset_version()
    for op in proto.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > known:
            raise BadModelError(f"{path}: imports ai.onnx opset {op.version}; the installed onnx "
                                f"{onnx.__version__} knows opsets up to {known} (expected opset <= {known})")
    base = path.parent
    for t in _all_tensors(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = base / info.get("location", "")
        if not info.get("location") or not loc.is_file():
            raise BadModelError(f"{path}: external data file {info.get('location')!r} of tensor {t.name!r} is "
                                f"missing (expected next to the model, in {base})")
        end = int(info.get("offset", 0)) + int(info.get("length", 0))
        have = os.stat(loc).st_size
        if have < end:
            raise BadModelError(f"{path}: external data file {loc.name} is truncated (tensor {t.name!r} needs "
                                f"{end} bytes, the file has {have})")
    _check_single_producer(path, proto.graph)
    return proto


def _all_tensors(graph):
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.type == a.TENSOR:
                yield a.t


def _check_single_producer(path, graph) -> None:
    producer: dict[str, str] = {}
    for vi in graph.input:
        producer.setdefault(vi.name, "graph input")
    for t in graph.initializer:  # an initializer may also be listed as a graph input (IR < 4): one value
        if producer.get(t.name, "graph input") != "graph input":
            raise BadModelError(f"{path}: value name {t.name!r} is defined twice")
        producer[t.name] = producer.get(t.name, "initializer")
    for i, n in enumerate(graph.node):
        me = f"{n.op_type} node {n.name or '#' + str(i)!r}"
        for o in n.output:
            if not o:
                continue
            if o in producer:
                raise BadModelError(f"{path}: value name {o!r} is produced twice, by {producer[o]} and by {me} "
                                    "(expected one producer per value name)")
            producer[o] = me


# ---- onnxruntime-genai model folders (what `python -m onnxruntime_genai.models.builder` writes) ----------------

CONFIG = "genai_config.json"
FACTS = "dot4attn.json"


class GenaiError(Exception):
    """A genai folder that cannot be rewritten or run; the message names the file and why. Nothing is written."""


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


def folder_facts(folder: str | os.PathLike) -> dict:
    """What `dot4attn rewrite` recorded in a folder it wrote (dot4attn.json: v_format, runner, row bytes, ...);
    {} for a folder it did not write."""
    path = Path(folder) / FACTS
    return json.loads(path.read_text()) if path.is_file() else {}


def context_length(cfg: dict) -> int | None:
    """The most positions the folder's model takes: model.context_length, else search.max_length; None when the
    config names neither."""
    n = cfg["model"].get("context_length") or cfg.get("search", {}).get("max_length")
    return int(n) if n else None


def genai_folder_of(path: str) -> Path | None:
    """The genai folder whose genai_config.json names the file `path` as its decoder, else None."""
    p = Path(path)
    cfg = p.parent / "genai_config.json"
    if not p.is_file() or not cfg.is_file():
        return None
    try:
        name = json.loads(cfg.read_text())["model"]["decoder"]["filename"]
    except (ValueError, KeyError, TypeError, OSError):
        return None
    return p.parent if name == p.name else None
