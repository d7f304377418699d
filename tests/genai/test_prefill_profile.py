"""python -m dot4attn.e2e.prefill_profile: the prefill's time per chunk size, row by row, on the tiny shape (CPU),
the kernel grouping its CUDA profile reports, and its refusals of bad options."""
from __future__ import annotations

import json

import pytest
from genai_support import og

from dot4attn.e2e import prefill_profile as pp


def test_smoke_times_every_row_at_every_chunk_size(tmp_path):
    og()
    pytest.importorskip("transformers")
    assert pp.main(["--smoke", "--cache", str(tmp_path / "models"), "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "prefill_profile.json").read_text())
    assert (data["device"], data["shape"], data["layers"]) == ("cpu", "qwen2-bias", 2)
    assert list(data["rows"]) == ["genai", "d4a-q8_0", "d4a-q4_0"]
    for row, entry in data["rows"].items():
        assert entry["runner"] == ("inplace" if row == "d4a-q4_0" else "og"), row
        assert [(t["context"], t["chunk"]) for t in entry["prefill"]] == [(128, 32), (128, 128)], row
        assert all(t["prefill_s"] > 0 for t in entry["prefill"]), entry
        assert "profile" not in entry  # the kernel profile is CUDA's
    assert not list(tmp_path.glob("*.tmp"))


def test_kernels_are_grouped_by_name():
    events = [
        ("void dot4attn::gpu::pws::prefill_ws_kernel<128, 128, 3, 3>(dot4attn::gpu::TileArgs, long, long, int)",
         900.0, 8),
        ("void dot4attn::(anonymous namespace)::out_kernel(dot4attn::(anonymous namespace)::OutArgs)", 50.0, 8),
        ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)", 700.0, 8),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", 400.0, 40),
        ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_nn_align8>(Params)", 100.0, 4),
        ("void onnxruntime::cuda::_UnaryElementWise<half, half, OP_Cast>(...)", 25.0, 30),
    ]
    s = pp.summarize_kernels(events, top=3)
    assert s["groups_ms"] == pytest.approx({"dot4attn": 0.95, "attention (ORT)": 0.7, "GEMM": 0.5, "other": 0.025})
    assert list(s["groups_ms"]) == ["dot4attn", "attention (ORT)", "GEMM", "other"]  # largest first
    assert s["total_ms"] == pytest.approx(2.175)
    assert [k["ms"] for k in s["top"]] == pytest.approx([0.9, 0.7, 0.4])
    assert [k["group"] for k in s["top"]] == ["dot4attn", "attention (ORT)", "GEMM"]


@pytest.mark.parametrize("argv,match", [
    (["--rows", "genai,row9"], "--rows"),
    (["--contexts", "0"], "contexts"),
    (["--chunks", "x"], "chunks"),
])
def test_bad_options_are_refused(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        pp.parse_args(argv)
    assert e.value.code == 2
    assert match in capsys.readouterr().err


def test_layers_override_a_shapes_own_count(tmp_path, monkeypatch):
    """ModelSpec.layers reaches the HF model even for a shape whose SHAPES entry names its layer count (the real
    shapes do): None keeps that count, a number replaces it; shapes without one get 2."""
    pytest.importorskip("transformers")
    from dot4attn.models import genai_builder as gb

    arch, fields = gb.SHAPES["qwen2-bias"]
    monkeypatch.setitem(gb.SHAPES, "five-layers", (arch, {**fields, "num_hidden_layers": 5}))

    def layers(shape, n):
        out = gb.make_hf_model(shape, tmp_path / f"{shape}-{n}", layers=n)
        return json.loads((out / "config.json").read_text())["num_hidden_layers"]

    assert (layers("five-layers", None), layers("five-layers", 1), layers("qwen2-bias", None)) == (5, 1, 2)
