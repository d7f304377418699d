"""Export the model set of tests/gpu/test_models_cuda.py: tiny Qwen2/Qwen3 decoders, original + rewritten onto
dot4attn ops, into a folder the GPU test reads (`DOT4ATTN_GPU_MODELS`), so a GPU machine needs neither
torch/transformers/onnxscript nor a network to run it.

    PYTHONPATH=python DOT4ATTN_LIBRARY=build/dev/libdot4attn_ops.so python3 tools/export_gpu_models.py [--out DIR]

Needs torch, transformers and onnxscript (exports are reused from $DOT4ATTN_MODEL_CACHE, see
tests/conftest_models.py). With the op library found it also runs every pair on the CPU EP and records the metrics
in the manifest (the GPU test prints them next to its own).

Folder layout (default `.gpu-models/`, ignored by git, ~6 MB):
  manifest.json    format, weights, and one entry per (original, rewritten) pair
  *.onnx           graphs only: every float32 initializer of >= 4 KiB is external data in `weights.bin`
                   (shared by all models, each distinct tensor stored once), node debug metadata stripped
  weights.f16      the contents of `weights.bin` as float16. The weights are rounded to float16-representable
                   values *before* the rewrite, so float32(weights.f16) == weights.bin exactly and original and
                   rewritten carry identical weights; the test expands it into a temp folder (half the bytes,
                   and the comparison is unaffected).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "python") not in sys.path:  # the dot4attn package of this checkout (graph_passes/ as dot4attn.passes)
    sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import external_data_helper, numpy_helper  # noqa: E402

FORMAT = 1
MIN_EXTERNAL = 4096  # bytes: smaller initializers (scales, shapes, RoPE frequencies) stay inline and exact
ALIGN = 4096         # float32 offsets of the tensors in weights.bin
PROMPT_LEN, STEPS = 32, 32  # as tests/passes/test_passes.py

# (arch, exporter, v_format, split_k_min_keys, prompt_len). Both archs on the default exporter with every V format;
# TorchScript (unfused_torchscript rule) and native-GQA opset 23 (onnx_attention rule) as the other forms. The
# default split_k_min_keys (2048) never reaches split_k at these lengths, so two pairs lower it to 512 with a
# 512-token prompt: every decode step then takes split_k with several splits (GPU: >= 128 keys per split, 4 here;
# CPU: >= 256, 2), and the prefill spans 8 row tiles.
SET = [(arch, "dynamo", vf, 2048, PROMPT_LEN) for arch in ("qwen2", "qwen3")
       for vf in ("float", "q8_0", "q4_0", "q6_0")]
SET += [("qwen3", "torchscript", "float", 2048, PROMPT_LEN), ("qwen3", "torchscript", "q4_0", 2048, PROMPT_LEN),
        ("qwen2", "dynamo23gqa", "q8_0", 2048, PROMPT_LEN),
        ("qwen3", "dynamo", "q8_0", 512, 512), ("qwen2", "dynamo", "q4_0", 512, 512)]
PRESET = "tiny"


class WeightStore:
    """One float32 blob for every model: each distinct large initializer stored once, models point into it."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []
        self.size = 0  # float32 bytes so far
        self.where: dict[str, tuple[int, int]] = {}

    def externalize(self, model: onnx.ModelProto) -> None:
        for t in model.graph.initializer:
            if t.data_type != onnx.TensorProto.FLOAT or t.data_location == onnx.TensorProto.EXTERNAL:
                continue
            a = numpy_helper.to_array(t)
            # Only float16-exact tensors go out (weights.f16 must expand to weights.bin exactly); any other one
            # (none expected: the originals are rounded before the rewrite) stays inline.
            if a.nbytes < MIN_EXTERNAL or not np.array_equal(a, a.astype(np.float16).astype(np.float32)):
                continue
            raw = np.ascontiguousarray(a, "<f4").tobytes()
            key = hashlib.sha256(raw).hexdigest()
            if key not in self.where:
                self.where[key] = (self.size, len(raw))
                pad = -len(raw) % ALIGN
                self.chunks.append(np.frombuffer(raw + b"\0" * pad, "<f4"))
                self.size += len(raw) + pad
            off, n = self.where[key]
            if not t.HasField("raw_data"):  # set_external_data wants raw_data present (it is dropped below)
                t.raw_data = raw
            external_data_helper.set_external_data(t, "weights.bin", off, n)
            t.data_location = onnx.TensorProto.EXTERNAL
            t.ClearField("raw_data")
            t.ClearField("float_data")

    def write_f16(self, path: Path) -> None:
        np.concatenate(self.chunks).astype("<f2").tofile(path)


def round_to_f16(model: onnx.ModelProto) -> None:
    """Rounds the large float32 initializers (the ones that go to weights.f16) to float16-representable values."""
    for i, t in enumerate(model.graph.initializer):
        if t.data_type == onnx.TensorProto.FLOAT and t.data_location != onnx.TensorProto.EXTERNAL:
            a = numpy_helper.to_array(t)
            if a.nbytes >= MIN_EXTERNAL:
                r = a.astype(np.float16).astype(np.float32)
                if not np.isfinite(r).all():
                    raise ValueError(f"initializer {t.name} does not fit float16")
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(r, t.name))


def strip_debug(model: onnx.ModelProto) -> None:
    """Drops the exporter's per-node metadata (stack traces, FX node text: ~90 % of a dynamo graph's bytes)."""
    for n in model.graph.node:
        del n.metadata_props[:]
        n.ClearField("doc_string")


def d4a_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if n.domain == "dot4attn":
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def cpu_metrics(orig: Path, new: Path, v_format: str, prompt_len: int) -> dict | None:
    """The pair's agreement on the CPU EP (None when the op library is not found)."""
    import dot4attn
    from dot4attn.quality.compare import compare, quality_failures

    try:
        dot4attn.get_library_path()
    except FileNotFoundError:
        return None
    c = compare(str(orig), str(new), prompt_len=prompt_len, steps=STEPS)
    return dict(positions=c.positions, top1=c.top1, mean_kl=c.mean_kl, max_kl=c.max_kl,
                max_abs_logit_diff=c.max_abs_logit_diff, passes=not quality_failures(c, v_format))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu-models", help="output folder (replaced)")
    args = ap.parse_args(argv)

    import onnxscript
    import torch
    import transformers

    from dot4attn.models.export import cached_export
    from dot4attn.passes import RewriteOptions, rewrite_file

    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))  # swapped in at the end: no half folder
    stage.chmod(0o755)
    work = Path(tempfile.mkdtemp(prefix="d4a-gpu-models-"))                 # full models for rewrite + CPU check
    store = WeightStore()
    entries = []
    try:
        originals: dict[tuple[str, str], str] = {}
        for arch, exporter, vf, skmin, plen in SET:
            base = f"{arch}-{PRESET}-{exporter}"
            src_full = work / f"{base}.onnx"
            if (arch, exporter) not in originals:
                m = onnx.load(str(cached_export(arch, PRESET, exporter)))
                round_to_f16(m)
                onnx.save(m, str(src_full))
                strip_debug(m)
                store.externalize(m)
                (stage / f"{base}.onnx").write_bytes(m.SerializeToString())
                originals[(arch, exporter)] = f"{base}.onnx"
            name = f"{base}-{vf}" + (f"-p{plen}" if plen != PROMPT_LEN else "") + \
                (f"-splitk{skmin}" if skmin != 2048 else "")
            dst_full = work / f"{name}.d4a.onnx"
            rep = rewrite_file(str(src_full), str(dst_full), RewriteOptions(v_format=vf, split_k_min_keys=skmin))
            metrics = cpu_metrics(src_full, dst_full, vf, plen)
            m = onnx.load(str(dst_full))
            ops = d4a_op_counts(m)
            strip_debug(m)
            store.externalize(m)
            (stage / f"{name}.d4a.onnx").write_bytes(m.SerializeToString())
            entries.append(dict(name=name, arch=arch, preset=PRESET, exporter=exporter, v_format=vf,
                                split_k_min_keys=skmin, prompt_len=plen, original=originals[(arch, exporter)],
                                rewritten=f"{name}.d4a.onnx", rules=[L.rule for L in rep.layers], ops=ops,
                                cpu_metrics=metrics))
            mt = "no op library: not checked" if metrics is None else \
                f"top1 {metrics['top1']:.4f} meanKL {metrics['mean_kl']:.2e}" + ("" if metrics["passes"] else " FAIL")
            print(f"{name:42s} {'/'.join(sorted(set(entries[-1]['rules'])))}  CPU EP: {mt}", flush=True)
        store.write_f16(stage / "weights.f16")
        manifest = dict(format=FORMAT, weights=dict(stored="weights.f16", dtype="float16", expand_to="weights.bin",
                                                    dtype_expanded="float32"),
                        compare=dict(steps=STEPS, seed=0),  # prompt_len: per entry
                        versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                                      onnx=onnx.__version__, onnxscript=onnxscript.__version__),
                        models=entries)
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)
    total = sum(f.stat().st_size for f in out.iterdir())
    bad = [e["name"] for e in entries if e["cpu_metrics"] and not e["cpu_metrics"]["passes"]]
    print(f"wrote {out}: {len(entries)} pairs, {total / 2**20:.2f} MiB")
    if bad:
        print(f"warning: below the bars on the CPU EP already: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
