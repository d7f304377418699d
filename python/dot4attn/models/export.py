"""Export Qwen2/Qwen3 decoders to ONNX with a KV cache, the ways users do it.

Every form gives the same I/O: `input_ids`, `attention_mask`, `position_ids` (int64), `past_key_values.N.key`,
`past_key_values.N.value` (float32 [B, Hkv, P, D]) in; `logits`, `present.N.key`, `present.N.value` out.

Exporters:
  dynamo        torch.onnx.export(dynamo=True) at its default opset (unfused MatMul/Softmax/MatMul)
  dynamo23      the same at opset 23: SDPA becomes an ai.onnx `Attention` node (GQA repeat stays in the graph)
  dynamo23gqa   opset 23 with native-GQA SDPA (enable_gqa=True): `Attention` gets the KV heads as they are
  torchscript   torch.onnx.export(dynamo=False, opset 17)
  optimum       optimum-cli export onnx --task text-generation-with-past (needs optimum-onnx, which needs
                transformers < 4.58: it runs in the interpreter given by $DOT4ATTN_OPTIMUM_PYTHON, else a
                `.venv-optimum` beside the running venv or in the working directory, else the current one)
  transformers  transformers.exporters.OnnxExporter (transformers >= 5.x)
  dynamo_ort    dynamo, then onnxscript's ort_fusions (optimize_for_ort): attention becomes
                com.microsoft MultiHeadAttention (contrib ops: runs on ONNX Runtime only)
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..model_io import EXTERNAL_DATA_THRESHOLD, folders_removed_on_failure

EXPORTERS = ("dynamo", "dynamo23", "dynamo23gqa", "torchscript", "optimum", "transformers", "dynamo_ort")


def _io_names(n_layers: int):
    ins = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    for i in range(n_layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


def _wrapper(model):
    import torch
    from transformers import DynamicCache

    n_layers = model.config.num_hidden_layers

    class KVWrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=self.m.config)
            for i in range(n_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
            flat = [out.logits]
            pkv = out.past_key_values
            for i in range(n_layers):
                layer = pkv.layers[i]
                flat += [layer.keys, layer.values]
            return tuple(flat)

    return KVWrapper(model).eval()


def sample_inputs(config, batch=2, seq=3, past=5):
    import torch

    n_layers = config.num_hidden_layers
    hkv = config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, config.vocab_size, (batch, seq), generator=g)
    am = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq, dtype=torch.int64).unsqueeze(0).expand(batch, -1).contiguous()
    pkv = []
    for _ in range(n_layers):
        pkv += [torch.randn(batch, hkv, past, hd, generator=g), torch.randn(batch, hkv, past, hd, generator=g)]
    return (ids, am, pos, *pkv)


def _export_torch(model, out: Path, exporter: str):
    import torch

    cfg = model.config
    n = cfg.num_hidden_layers
    ins, outs = _io_names(n)
    args = sample_inputs(cfg)
    w = _wrapper(model)
    if exporter == "torchscript":
        dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total_seq"},
               "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
        for i in range(n):
            for kind in ("key", "value"):
                dyn[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "past_seq"}
                dyn[f"present.{i}.{kind}"] = {0: "batch", 2: "total_seq"}
        torch.onnx.export(w, args, str(out), dynamo=False, opset_version=17, input_names=ins, output_names=outs,
                          dynamic_axes=dyn, do_constant_folding=True)
        return
    B = torch.export.Dim("batch", min=1, max=64)
    S = torch.export.Dim("seq", min=1, max=4096)
    P = torch.export.Dim("past_seq", min=0, max=8192)
    T = torch.export.Dim.DYNAMIC
    ds = [{0: B, 1: S}, {0: B, 1: T}, {0: B, 1: S}, tuple({0: B, 2: P} for _ in range(2 * n))]
    opset = 23 if exporter in ("dynamo23", "dynamo23gqa") else None
    env_old = os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    if exporter == "dynamo23gqa":
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    try:
        prog = torch.onnx.export(w, args, dynamo=True, dynamic_shapes=tuple(ds), input_names=ins,
                                 output_names=outs, opset_version=opset, optimize=True)
    finally:
        if exporter == "dynamo23gqa":
            if env_old is None:
                os.environ.pop("TRANSFORMERS_SDPA_FORCE_GQA", None)
            else:
                os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = env_old
    prog.save(str(out), external_data=False)


def _export_transformers(model, out: Path):
    """transformers' own exporter (transformers.exporters.OnnxExporter, dynamic shapes), renamed to our I/O."""
    import onnx_ir as ir
    import torch
    from transformers import DynamicCache
    from transformers.exporters import OnnxConfig, OnnxExporter

    cfg = model.config
    ids, am, pos, *pkv = sample_inputs(cfg)
    cache = DynamicCache(config=cfg)
    for i in range(cfg.num_hidden_layers):
        cache.update(pkv[2 * i], pkv[2 * i + 1], i)
    inputs = {"input_ids": ids, "attention_mask": am, "position_ids": pos, "past_key_values": cache,
              "use_cache": True}
    exported = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    m = exported.program
    _normalize_names(m)
    ir.save(m, str(out))


def _normalize_names(model) -> None:
    """Map an exporter's own cache I/O names onto past_key_values.N.key/value and present.N.key/value."""
    import re

    g = model.graph
    pats = [
        (re.compile(r"^past_key_values[._](\d+)[._](key|value)s?$"), "past_key_values.{}.{}"),
        (re.compile(r"^past_key_values[._](key|value)_cache[._](\d+)$"), "past_key_values.{1}.{0}"),
        (re.compile(r"^past_key_values[._]layers[._](\d+)[._](key|value)s?$"), "past_key_values.{}.{}"),
        (re.compile(r"^(?:present|cache)[._](?:layers[._])?(\d+)[._](key|value)s?$"), "present.{}.{}"),
        (re.compile(r"^(?:present|past_key_values)[._](key|value)_cache[._](\d+)$"), "present.{1}.{0}"),
        (re.compile(r"^(?:present|past_key_values)[._]layers[._](\d+)[._](key|value)s?$"), "present.{}.{}"),
    ]
    for vals, first, last in ((g.inputs, 0, 3), (g.outputs, 3, 6)):
        for v in vals:
            for pat, fmt in pats[first:last]:
                mm = pat.match(v.name or "")
                if mm:
                    v.name = fmt.format(*mm.groups())
                    break


def _ort_fusions(path: Path) -> None:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    m = ir.load(str(path))
    optimize_for_ort(m)
    ir.save(m, str(path))


def optimum_python() -> str:
    """The interpreter that runs optimum-cli: $DOT4ATTN_OPTIMUM_PYTHON, else `.venv-optimum/bin/python` beside
    the running venv (a repository's `.venv` and `.venv-optimum` are siblings, and the installed package
    cannot see the repository) or in the working directory, else this interpreter."""
    py = os.environ.get("DOT4ATTN_OPTIMUM_PYTHON")
    if py:
        return py
    for root in (Path(sys.prefix).parent, Path.cwd()):
        cand = root / ".venv-optimum" / "bin" / "python"
        if cand.is_file():
            return str(cand)
    return sys.executable


def _export_optimum(hf_dir: Path, out: Path):
    py = optimum_python()
    with tempfile.TemporaryDirectory(prefix="d4a-optimum-") as td:
        cmd = [py, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(hf_dir),
               "--task", "text-generation-with-past", "--no-post-process", td]
        r = subprocess.run(cmd, capture_output=True, text=True)
        produced = Path(td) / "model.onnx"
        if r.returncode != 0 or not produced.is_file():
            raise RuntimeError(f"optimum export failed (python {py}; optimum-onnx needs transformers<4.58, "
                               f"set DOT4ATTN_OPTIMUM_PYTHON to such an interpreter):\n{r.stderr[-3000:]}")
        import onnx

        m = onnx.load(str(produced), load_external_data=True)
        onnx.save(m, str(out))


class ExportError(Exception):
    """An export that cannot be done; the message names the folder or file and what was expected."""


SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")


def _check_hf_dir(d: Path) -> None:
    """A Hugging Face folder of a supported architecture, before transformers (whose errors are less direct)."""
    if not d.is_dir():
        raise ExportError(f"{d}: no such folder (expected a Hugging Face model folder with config.json)")
    cfg = d / "config.json"
    if not cfg.is_file():
        raise ExportError(f"{d}: no config.json (expected a Hugging Face model folder)")
    try:
        model_type = json.loads(cfg.read_text())["model_type"]
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{cfg}: not a Hugging Face config (expected JSON with a model_type): "
                          f"{type(e).__name__}: {e}") from None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ExportError(f"{cfg}: model_type {model_type!r} is not supported (expected one of "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)})")


def export(model_or_dir, out: str | os.PathLike, exporter: str = "dynamo", hf_dir: str | None = None) -> Path:
    """Export `model_or_dir` (a transformers model, or a local HF folder) to `out` (a .onnx file)."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}: expected one of {EXPORTERS}")
    out = Path(out)
    if isinstance(model_or_dir, (str, os.PathLike)):
        from .recipes import load_hf_dir

        hf_dir = str(model_or_dir)
        _check_hf_dir(Path(hf_dir))
        try:
            model = load_hf_dir(hf_dir)
        except Exception as e:  # truncated or missing weights, a config transformers cannot build
            raise ExportError(f"{hf_dir}: cannot load the Hugging Face model (expected a Qwen2/Qwen3 folder with "
                              f"config.json and its weights): {type(e).__name__}: {e}") from None
    else:
        model = model_or_dir
    import torch

    tmp = out.with_name(out.name + ".tmp-export")
    # Folders made for OUT are removed again when the export fails: a failed export leaves nothing behind.
    with folders_removed_on_failure(out.parent.resolve()):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir(exist_ok=True)
            tmp_model = tmp / out.name
            with torch.no_grad(), _quiet():
                if exporter == "optimum":
                    d = hf_dir
                    if d is None:
                        d = str(tmp / "hf")
                        model.save_pretrained(d)
                    _export_optimum(Path(d), tmp_model)
                elif exporter == "transformers":
                    _export_transformers(model, tmp_model)
                elif exporter == "dynamo_ort":
                    _export_torch(model, tmp_model, "dynamo")
                    _ort_fusions(tmp_model)
                else:
                    _export_torch(model, tmp_model, exporter)
            _finalize(tmp_model, out)
        except OSError as e:  # a full disk, a file size limit, a folder that is not writable
            raise ExportError(f"{out}: cannot write the exported model: {e.strerror or e} "
                              f"({type(e).__name__}, errno {e.errno})") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def _quiet():
    """Exporter chatter (progress lines, tracer warnings) off unless DOT4ATTN_EXPORT_VERBOSE=1."""
    if os.environ.get("DOT4ATTN_EXPORT_VERBOSE") == "1":
        yield
        return
    import logging

    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _finalize(src: Path, out: Path) -> None:
    """Single-file model when under 2 GB, else `<out>.data` external data; checked; moved into place. `src` lies in
    the export's temp folder."""
    import onnx

    m = onnx.load(str(src), load_external_data=True)
    size = sum(t.ByteSize() for t in m.graph.initializer)
    # Staged in a fresh folder inside the export's temp folder (next to OUT, so the renames are atomic) and checked
    # there; the caller removes that folder whatever happens, so a full disk mid-write leaves no half file behind.
    stage = src.parent / "final"
    stage.mkdir()
    staged = stage / out.name
    data = out.name + ".data"
    if size > EXTERNAL_DATA_THRESHOLD:
        onnx.save(m, str(staged), save_as_external_data=True, all_tensors_to_one_file=True, location=data)
    else:
        onnx.save(m, str(staged))
    if not any(n.domain == "com.microsoft" or n.op_type == "SimplifiedLayerNormalization" for n in m.graph.node):
        onnx.checker.check_model(str(staged), full_check=False)
    if (stage / data).exists():
        os.replace(stage / data, out.parent / data)
    os.replace(staged, out)


def export_recipe(arch: str, preset: str, exporter: str, out: str | os.PathLike, seed: int = 0) -> Path:
    from .recipes import build_model

    model = build_model(arch, preset, seed)
    return export(model, out, exporter)


def model_cache_dir() -> Path:
    """Where exported and builder-made models are kept between runs: $DOT4ATTN_MODEL_CACHE, else
    ~/.cache/dot4attn/models. Every user of the cache (demo, e2e, the tests) asks here, so nothing needs the
    variable set."""
    return Path(os.environ.get("DOT4ATTN_MODEL_CACHE", Path.home() / ".cache" / "dot4attn" / "models"))


def cached_export(arch: str, preset: str, exporter: str, seed: int = 0) -> Path:
    """Export once per (arch, preset, exporter, seed, versions) under $DOT4ATTN_MODEL_CACHE; reuse afterwards."""
    import torch
    import transformers

    key = f"{arch}-{preset}-s{seed}-{exporter}-t{torch.__version__.split('+')[0]}-tf{transformers.__version__}"
    d = model_cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{key}.onnx"
    if not path.is_file():
        export_recipe(arch, preset, exporter, path, seed)
        (d / f"{key}.json").write_text(json.dumps(dict(arch=arch, preset=preset, exporter=exporter, seed=seed)))
    return path
