"""Bad models and bad output folders given to `dot4attn rewrite / export / generate / compare`: each run must end
with a clear error that names the file (or folder) and what was expected, a non-zero exit code and no traceback,
leave nothing behind in the output folder, and leave every input file byte for byte as it was (each input file is
hashed before and after).

Output folders that cannot take the output:
* read-only: the folder is mode 0500. Root ignores permission bits, so as root the command runs under
  `setpriv --bounding-set=-all` (no CAP_DAC_OVERRIDE: root obeys the mode like anyone else).
* full: the command runs in a child process with RLIMIT_FSIZE set below the output's size (SIGXFSZ ignored).
  The kernel then lets write(2) store bytes up to the limit and fails it with EFBIG: the same "the disk filled up
  in the middle of the file" path as ENOSPC on a full disk (a partial write, then an OSError from the writer),
  without root or a tmpfs, and for every file the command writes, temp files included.
"""
from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dot4attn
from conftest_models import exported, need_export, need_ops
from dot4attn.cli import main as cli

PYTHON_DIR = Path(dot4attn.__file__).resolve().parents[1]


# ---- the models ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return exported("qwen3", "tiny", "dynamo")


@pytest.fixture(scope="module")
def rewritten(tiny, tmp_path_factory):
    need_ops()
    out = tmp_path_factory.mktemp("rewritten") / "tiny.d4a.onnx"
    assert cli(["rewrite", str(tiny), str(out)]) == 0
    return out


def _truncated(d, tiny, rewritten):
    data = tiny.read_bytes()
    (d / "model.onnx").write_bytes(data[: len(data) // 2])


def _not_onnx(d, tiny, rewritten):
    (d / "model.onnx").write_text("name,value\nthis is a CSV file, not a model,1\n")


def _empty(d, tiny, rewritten):
    (d / "model.onnx").write_bytes(b"")


def _with_external_data(d, tiny):
    onnx.save(onnx.load(str(tiny)), str(d / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    return d / "model.onnx.data"


def _external_data_missing(d, tiny, rewritten):
    _with_external_data(d, tiny).unlink()


def _external_data_short(d, tiny, rewritten):
    data = _with_external_data(d, tiny)
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 1000)


def _opset_99(d, tiny, rewritten):
    m = onnx.load(str(tiny))
    for op in m.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = 99
    onnx.save(m, str(d / "model.onnx"))


def _duplicate_value_names(d, tiny, rewritten):
    """Two nodes write the same value name (the second one's output renamed to the first one's)."""
    m = onnx.load(str(tiny))
    first, second = [n for n in m.graph.node if n.output and n.op_type != "Constant"][:2]
    second.output[0] = first.output[0]
    onnx.save(m, str(d / "model.onnx"))


def _no_attention(d, tiny, rewritten):
    """A KV-cache-shaped I/O around an MLP: nothing for the passes to match."""
    x = helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, ["B", 4])
    pk = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["B", 2, "P", 64])
    pv = helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, ["B", 2, "P", 64])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["input_ids", "w"], ["logits"])], "mlp", [x, pk, pv], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))


def _partly_matched(d, tiny, rewritten):
    """Layer 1's softmax output goes through an extra Mul: no rule matches that layer."""
    m = onnx.load(str(tiny))
    sm = [n for n in m.graph.node if n.op_type == "Softmax"][1]
    old = sm.output[0]
    sm.output[0] = old + "_pre"
    m.graph.initializer.append(helper.make_tensor(old + "_one", TensorProto.FLOAT, [], [1.0]))
    m.graph.node.insert(list(m.graph.node).index(sm) + 1,
                        helper.make_node("Mul", [old + "_pre", old + "_one"], [old]))
    onnx.save(m, str(d / "model.onnx"))


def _already_rewritten(d, tiny, rewritten):
    shutil.copy(rewritten, d / "model.onnx")


def _missing(d, tiny, rewritten):
    pass  # model.onnx is never written


NOT_A_MODEL = r"cannot parse as an ONNX model \(truncated or not ONNX\?\)|the model has no nodes \(expected an ONNX"
BAD_MODELS = {  # kind: (maker, what the error must say besides the file name)
    "truncated": (_truncated, NOT_A_MODEL),
    "not_onnx": (_not_onnx, NOT_A_MODEL),
    "empty": (_empty, r"empty file \(expected an ONNX model\)"),
    "external_data_missing": (_external_data_missing,
                              r"external data file 'model\.onnx\.data' of tensor '.+' is missing \(expected next"),
    "external_data_short": (_external_data_short,
                            r"external data file model\.onnx\.data is truncated \(tensor '.+' needs \d+ bytes, the "
                            r"file has \d+\)"),
    "opset_99": (_opset_99, r"imports ai\.onnx opset 99; .*\(expected opset <= \d+\)"),
    "duplicate_value_names": (_duplicate_value_names,
                              r"value name '.+' is produced twice, by .+ and by .+ \(expected one producer"),
    "no_attention": (_no_attention, r"no attention found in the model"),
    "partly_matched": (_partly_matched, r"only 1 of 2 attention layers matched; not matched: layer 1 "
                                        r"\(pass --allow-partial"),
    "already_rewritten": (_already_rewritten, r"already rewritten \(it has dot4attn ops: Dot4Attention"),
    "missing": (_missing, r"no such file \(expected an ONNX model\)"),
}
# What each command reads of a model; rewrite-only refusals (no attention, partly matched, already rewritten) are
# valid models for generate / compare.
RUNNABLE_BAD = ["truncated", "not_onnx", "empty", "external_data_missing", "external_data_short", "opset_99",
                "duplicate_value_names", "missing"]
COMMANDS = {
    "rewrite": (list(BAD_MODELS), lambda m, tiny, rw, out: ["rewrite", m, out / "model.d4a.onnx"]),
    "generate": (RUNNABLE_BAD, lambda m, tiny, rw, out: ["generate", m, "--token-ids", "1 5 9", "--max-new-tokens", "2"]),
    "compare-original": (RUNNABLE_BAD, lambda m, tiny, rw, out: ["compare", m, rw, "--prompt-len", "4", "--steps", "2"]),
    "compare-rewritten": (RUNNABLE_BAD, lambda m, tiny, rw, out: ["compare", tiny, m, "--prompt-len", "4",
                                                                  "--steps", "2"]),
}
TABLE = [(cmd, kind) for cmd, (kinds, _) in COMMANDS.items() for kind in kinds]


# ---- checks -------------------------------------------------------------------------------------------------------

def digest(*paths: Path) -> dict[str, str]:
    """sha256 of every file under the given files / folders."""
    out = {}
    for p in paths:
        for f in ([p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []):
            if f.is_file():
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def check_refused(rc: int, err: str, names: list[str], pattern: str) -> None:
    assert rc not in (0, None), f"exit code {rc}, expected non-zero; stderr:\n{err}"
    assert "Traceback" not in err, f"a traceback instead of an error message:\n{err}"
    assert any(n in err for n in names), f"the error names none of {names}:\n{err}"
    assert re.search(pattern, err), f"{pattern!r} not in the error:\n{err}"


def check_nothing_left(out_dir: Path, before: set[str] | None = None) -> None:
    left = {p.name for p in out_dir.iterdir()} - (before or set())
    assert not left, f"left behind in {out_dir}: {sorted(left)}"


@pytest.mark.parametrize("command,kind", TABLE)
def test_bad_model_is_refused(command, kind, tiny, rewritten, tmp_path, capsys):
    maker, pattern = BAD_MODELS[kind]
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    maker(src, tiny, rewritten)
    model = src / "model.onnx"
    before = digest(src, tiny, rewritten)
    argv = [str(a) for a in COMMANDS[command][1](model, tiny, rewritten, out)]
    rc = cli(argv)
    err = capsys.readouterr().err
    check_refused(rc, err, [str(model)], pattern)
    check_nothing_left(out)
    assert digest(src, tiny, rewritten) == before, "an input file changed"


# ---- export: bad Hugging Face folders -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    need_export("dynamo")
    from dot4attn.models.recipes import build_model

    d = tmp_path_factory.mktemp("hf") / "qwen3-tiny"
    build_model("qwen3", "tiny", 0).save_pretrained(str(d))
    return d


def _hf_no_config(d):
    (d / "config.json").unlink()


def _hf_llama(d):
    (d / "config.json").write_text((d / "config.json").read_text().replace('"qwen3"', '"llama"'))


def _hf_config_not_json(d):
    (d / "config.json").write_text("model_type: qwen3\n")


def _hf_weights_truncated(d):
    w = next(d.glob("*.safetensors"))
    with open(w, "r+b") as f:
        f.truncate(w.stat().st_size // 2)


HF_CASES = {
    "no_config": (_hf_no_config, r"no config\.json \(expected a Hugging Face model folder\)"),
    "unsupported_architecture": (_hf_llama, r"model_type 'llama' is not supported \(expected one of qwen2, qwen3\)"),
    "config_not_json": (_hf_config_not_json, r"not a Hugging Face config \(expected JSON with a model_type\)"),
    "weights_truncated": (_hf_weights_truncated, r"cannot load the Hugging Face model \(expected a Qwen2/Qwen3"),
}


@pytest.mark.parametrize("kind", list(HF_CASES))
def test_export_refuses_bad_hf_folder(kind, hf_dir, tmp_path, capsys):
    maker, pattern = HF_CASES[kind]
    src, out = tmp_path / "hf", tmp_path / "out"
    shutil.copytree(hf_dir, src)
    out.mkdir()
    maker(src)
    before = digest(src)
    rc = cli(["export", "--hf-dir", str(src), "--out", str(out / "m.onnx")])
    check_refused(rc, capsys.readouterr().err, [str(src)], pattern)
    check_nothing_left(out)
    assert digest(src) == before


# ---- output folders that cannot take the output (child processes) ------------------------------------------------

def run_cli_child(argv: list[str], cwd: Path, *, file_size_limit: int | None = None, drop_root_powers=False,
                  timeout: int = 300) -> subprocess.CompletedProcess:
    """`dot4attn ARGV` in a child process, optionally under RLIMIT_FSIZE or without root's file-permission bypass."""
    code = "import sys\nfrom dot4attn.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    cmd = [sys.executable, "-c", code, *map(str, argv)]
    if drop_root_powers and os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a read-only folder cannot stop root's writes")
        cmd = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--", *cmd]

    def limit():
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write(2) then fails with EFBIG instead of killing us
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")]),
               PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit)


def _genai_src():
    pytest.importorskip("onnxruntime_genai")
    from genai_support import genai_model  # tests/genai: builder-made folders, cached

    return genai_model("qwen2-bias", "fp32")


# (command, output kind) -> argv given IN and the output folder
WRITERS = {
    "rewrite": lambda tiny, out: ["rewrite", tiny, out / "model.d4a.onnx"],
    "export": lambda tiny, out: ["export", "--preset", "tiny", "--out", out / "model.onnx"],
    "rewrite-genai": lambda tiny, out: ["rewrite", _genai_src(), out / "genai-d4a"],
}
FULL = 64 * 1024  # bytes: every model written here is larger, so each write stops part-way


@pytest.mark.parametrize("condition", ["read_only", "full"])
@pytest.mark.parametrize("command", list(WRITERS))
def test_output_folder_that_cannot_take_the_output(command, condition, tiny, tmp_path):
    if command != "export":
        need_ops()
    if command == "rewrite-genai":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "genai"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("already here")
    argv = WRITERS[command](tiny, out)
    src = Path(argv[1]) if command != "export" else None
    before = digest(src) if src else {}
    if condition == "read_only":
        out.chmod(0o500)
        tmp_path.chmod(0o755)  # the child (capabilities dropped) must reach OUT's folder
        try:
            r = run_cli_child(argv, tmp_path, drop_root_powers=True)
        finally:
            out.chmod(0o700)
        pattern = r"Permission denied|not writable"
    else:
        r = run_cli_child(argv, tmp_path, file_size_limit=FULL)
        pattern = r"File too large|No space left"
    check_refused(r.returncode, r.stderr, [str(out)], pattern)
    assert "(no output written)" in r.stderr, r.stderr
    check_nothing_left(out, {"keep.txt"})
    assert (out / "keep.txt").read_text() == "already here"
    if src:
        assert digest(src) == before, "an input file changed"
