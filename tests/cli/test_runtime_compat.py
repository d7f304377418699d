"""The one library loads and runs in the installed onnxruntime and in onnxruntime-rocm 1.22 (CPU EP).

The ROCm runtime lives in its own venv (onnxruntime and onnxruntime-rocm cannot share one): .ci/run creates it,
e.g. `python -m venv /tmp/ortrocm && /tmp/ortrocm/bin/pip install onnxruntime-rocm==1.22.2.post3 numpy onnx`,
and names its python in $DOT4ATTN_ROCM_PYTHON. Without that variable the ROCm test skips.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dot4attn
from conftest import REPO_ROOT, library_path

REPO_PYTHON = REPO_ROOT / "python"

# Runs in any interpreter that has onnxruntime, numpy and onnx; prints one JSON line. It checks a PackK + PackV +
# Dot4Attention graph end to end and single Dot4Attention nodes on every forced route, against the reference.
SCRIPT = r'''
import json, sys
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
import dot4attn
from dot4attn import onnx_builders as ob, reference as R

def pipeline_model(v_format, D):
    """PackK (+ PackV) + Dot4Attention in one graph; batch, heads and lengths symbolic, the head dim static."""
    f = TensorProto.FLOAT
    vi = lambda n, t, p: helper.make_tensor_value_info(n, t, [f"{p}0", f"{p}1", f"{p}2", D])
    nodes = [helper.make_node("PackK", ["key"], ["kp", "ks"], domain="dot4attn")]
    if v_format == "float":
        att_in = ["query", "kp", "ks", "value"]
    else:
        nodes.append(helper.make_node("PackV", ["value"], ["vp", "vs"], domain="dot4attn", format=v_format))
        att_in = ["query", "kp", "ks", "vp", "vs"]
    nodes.append(helper.make_node("Dot4Attention", att_in, ["output"], domain="dot4attn", v_format=v_format,
                                  causal=1))
    g = helper.make_graph(nodes, "pipeline", [vi("query", f, "q"), vi("key", f, "k"), vi("value", f, "v")],
                          [vi("output", f, "o")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dot4attn", 1)])
    m.ir_version = 9
    return m

rng = np.random.default_rng(5)
B, Hq, Hkv, Sq, Sk, D = 2, 4, 2, 3, 300, 64
q = (rng.standard_normal((B, Hq, Sq, D)) * 3).astype(np.float32)
k = rng.standard_normal((B, Hkv, Sk, D)).astype(np.float32)
v = rng.standard_normal((B, Hkv, Sk, D)).astype(np.float32)
res = {"ort_version": ort.__version__, "providers": ort.get_available_providers(),
       "library": dot4attn.get_library_path(), "build_info": dot4attn.build_info(), "nmse": {}}
for vf in ("float", "q8_0", "q4_0"):
    sess = ob.session(pipeline_model(vf, D))
    out = sess.run(None, {"query": q, "key": k, "value": v})[0]
    kp, ks = R.pack_k(k)
    vp, vs = (v, None) if vf == "float" else R.pack_v(v, vf)
    res["nmse"][f"pipeline-{vf}"] = R.nmse(out, R.attention(q, kp, ks, vp, vs, causal=1, v_format=vf))
    res["nmse"][f"pipeline-{vf}-vs-float"] = R.nmse(out, R.float_attention(q, k, v, causal=1))
kp, ks = R.pack_k(k)
mask = np.ones((B, 1, 1, Sk), bool)
mask[1, ..., :100] = False  # left padding of batch row 1
for dtype in (np.float32, np.float16):
    for route in ("prefill", "decode", "split_k", "auto"):
        qq, vv = q.astype(dtype), v.astype(dtype)
        out = ob.run_attention(qq, kp, ks, vv, None, mask, route=route, split_k_min_keys=64)
        res["nmse"][f"{np.dtype(dtype).name}-{route}"] = R.nmse(out, R.attention(qq, kp, ks, vv, None, mask))
print("RESULT " + json.dumps(res))
'''


def run_script(python: str) -> dict:
    env = dict(os.environ)
    env["DOT4ATTN_LIBRARY"] = library_path()
    env["PYTHONPATH"] = str(REPO_PYTHON)
    env.pop("DOT4ATTN_CPU_ISA", None)
    proc = subprocess.run([python, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{python} failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result from {python}:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


def check_result(res: dict):
    assert "CPUExecutionProvider" in res["providers"]
    assert res["build_info"]["version"] == dot4attn.__version__
    nm = res["nmse"]
    assert len(nm) == 14, sorted(nm)
    for key, err in nm.items():
        if key.endswith("-vs-float"):
            tol = 2e-2 if "q4_0" in key else 5e-4
        else:
            tol = 1e-6
        assert err <= tol, f"onnxruntime {res['ort_version']}: {key}: NMSE {err:.3e} > {tol:.0e}"


def test_build_info():
    info = dot4attn.build_info()
    assert info["version"] == dot4attn.__version__
    isas = info["cpu_isas"].split(",")
    assert "scalar" in isas and set(isas) <= {"scalar", "avx2", "avx512vnni"}
    assert info["cpu_isa"] in isas


def test_installed_onnxruntime_in_process():
    import onnxruntime as ort

    major, minor = (int(x) for x in ort.__version__.split(".")[:2])
    assert (major, minor) >= (1, 22), ort.__version__
    ns: dict = {}
    exec(compile(SCRIPT.replace('print("RESULT " + json.dumps(res))', ""), "<compat script>", "exec"), ns)
    check_result(ns["res"])


def test_installed_onnxruntime_subprocess():
    """The same check in a fresh interpreter (the library loaded once, by ONNX Runtime only)."""
    res = run_script(sys.executable)
    check_result(res)


@pytest.mark.rocm_runtime
def test_onnxruntime_rocm_122_cpu_ep():
    python = os.environ.get("DOT4ATTN_ROCM_PYTHON") or str(REPO_ROOT / ".venv-ortrocm" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(f"{python} does not exist: the onnxruntime-rocm 1.22 venv that .ci/run creates "
                    "(or name another in $DOT4ATTN_ROCM_PYTHON)")
    res = run_script(python)
    assert res["ort_version"].startswith("1.22"), f"expected onnxruntime-rocm 1.22, got {res['ort_version']}"
    check_result(res)
