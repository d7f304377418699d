"""`dot4attn e2e --smoke`: the end-to-end benchmark's harness on a tiny builder model (contexts 64 and 128, batch 1
and 2): every row measured, the cache sizes of the four layouts, agreement with row 1, the written outputs, and
the refusals of bad options."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from genai_support import og

from dot4attn.cli import main as cli


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    og()
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("e2e")
    assert cli(["e2e", "--smoke", "--out", str(out)]) == 0
    return out, json.loads((out / "smoke.json").read_text())


def test_every_row_is_timed_in_every_case(smoke):
    _, data = smoke
    timed = [r for r in data["results"] if "ms_per_token" in r]
    cases = {(r["context"], r["batch"]) for r in timed}
    assert cases == {(64, 1), (128, 1), (128, 2)}
    for case in cases:
        rows = [r["row"] for r in timed if (r["context"], r["batch"]) == case]
        assert rows == ["genai", "genai-int8kv", "d4a-q8_0", "d4a-q4_0"], (case, rows)
    for r in timed:
        assert r["ms_per_token"] > 0 and r["prefill_s"] > 0 and r["memory_bytes"] is not None
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 1e3 / r["ms_per_token"])
        assert r["model_ratio"] >= 1.0 - 1e-9 and r["ratio"] > 0


def test_cache_bytes_per_token_of_the_four_layouts(smoke):
    """qwen2-bias: 2 layers x 2 KV heads x D 32. fp32 K+V 1024 B; ORT int8 256 B; packed rows padded to 16 bytes:
    K and V q8_0 32 + 2 scale bytes -> 48; V q4_0 16 + 2 -> 32."""
    _, data = smoke
    per_token = {r["row"]: r["cache_bytes_per_token"] for r in data["results"] if "cache_bytes_per_token" in r}
    assert per_token == {"genai": 1024, "genai-int8kv": 256, "d4a-q8_0": 2 * 2 * (48 + 48),
                         "d4a-q4_0": 2 * 2 * (48 + 32)}
    assert data["facts"]["baseline_kv_bytes_per_token"] == 1024  # the CPU baseline: the model's own fp32 cache


def test_agreement_with_row_1_at_batch_1(smoke):
    """Teacher-forced steps, the same tokens for every row: KL within the rewrite tests' bars (q8_0 1e-3, q4_0 0.1;
    ORT's int8 cache held to the q8_0 bar)."""
    _, data = smoke
    for r in data["results"]:
        if r.get("batch") == 1 and r["row"] != "genai":
            bar = 0.1 if r["row"] == "d4a-q4_0" else 1e-3
            assert 0 <= r["kl"] <= bar, r
        if r.get("batch") == 2:
            assert "kl" not in r  # greedy at batch > 1: not compared


def test_outputs_written(smoke):
    out, data = smoke
    md = (out / "smoke.md").read_text()
    assert md.count("| d4a-q4_0 |") == 3 and "cores" in md
    assert (out / "smoke.png").read_bytes()[:4] == b"\x89PNG"
    # the tiny model judges none of the real shape's goals: no goal row, so no FAIL for what it cannot measure
    assert data["goals"] == [] and "FAIL" not in md


def test_time_to_first_token_and_request_time(smoke):
    """Every case that prefilled its own prompt reports TTFT (its prefill) and the request time of prompt + answer
    (--answer-tokens, default 500: TTFT + 500 x ms/token), each also as a time ratio over row 1's."""
    _, data = smoke
    assert data["facts"]["answer_tokens"] == 500
    timed = [r for r in data["results"] if "ms_per_token" in r]
    row1 = {(r["context"], r["batch"]): r for r in timed if r["row"] == "genai"}
    for r in timed:
        assert r["ttft_s"] == r["prefill_s"] > 0
        assert r["request_s"] == pytest.approx(r["prefill_s"] + 500 * r["ms_per_token"] / 1e3)
        ref = row1[(r["context"], r["batch"])]
        assert r["request_vs_row1"] == pytest.approx(r["request_s"] / ref["request_s"])
        assert r["ttft_vs_row1"] == pytest.approx(r["ttft_s"] / ref["ttft_s"])


def _png_width(path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # the IHDR chunk's width


def test_render_writes_the_outputs_again_from_the_measurements(smoke, tmp_path):
    """--render measures nothing: from OUT/NAME.json it derives the ratios, TTFT and request times again (here for
    a 100-token answer) and writes the JSON, table and plot, the measurements as they were. The plot has the TTFT /
    request panel beside the ms/token one."""
    out, data = smoke
    (tmp_path / "smoke.json").write_text(json.dumps(dict(
        facts=data["facts"], results=[{k: v for k, v in r.items() if k not in ("ttft_s", "request_s", "ratio")}
                                      for r in data["results"]])))
    assert cli(["e2e", "--smoke", "--out", str(tmp_path), "--render", "--answer-tokens", "100"]) == 0
    again = json.loads((tmp_path / "smoke.json").read_text())
    assert again["facts"]["answer_tokens"] == 100 and again["goals"] == []
    measured = ("ms_per_token", "prefill_s", "tokens_per_s", "kl", "cache_bytes", "memory_bytes")
    assert [[r.get(k) for k in measured] for r in again["results"]] == \
        [[r.get(k) for k in measured] for r in data["results"]]
    for r in again["results"]:
        assert r["request_s"] == pytest.approx(r["prefill_s"] + 100 * r["ms_per_token"] / 1e3)
        assert r["ttft_s"] == r["prefill_s"] and r["ratio"] > 0
    md = (tmp_path / "smoke.md").read_text()
    assert "an answer of 100 tokens" in md and md.count("| d4a-q4_0 |") == 3
    assert _png_width(tmp_path / "smoke.png") > 1200 and _png_width(out / "smoke.png") > 1200  # two panels


def test_render_needs_the_json(tmp_path, capsys):
    assert cli(["e2e", "--smoke", "--out", str(tmp_path), "--render"]) == 2
    assert "--render: no " in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_output_names_carry_a_precision_other_than_the_devices_default(smoke, tmp_path):
    """cuda.json holds fp16 weights' run and cuda-int4.json int4's, so both live in one --out; the CPU's default is
    int4 (cpu.json). A run with --precision reads and writes its own file (--render and --resume alike)."""
    from dot4attn.e2e.report import output_name

    assert [output_name("cuda", "fp16"), output_name("cuda", "int4"), output_name("cpu", "int4"),
            output_name("cpu", "fp32"), output_name("cpu", "fp32", smoke=True)] == \
        ["cuda", "cuda-int4", "cpu", "cpu-fp32", "smoke"]
    _, data = smoke
    (tmp_path / "cpu-fp32.json").write_text(json.dumps(dict(facts=data["facts"], results=data["results"])))
    assert cli(["e2e", "--device", "cpu", "--precision", "fp32", "--out", str(tmp_path), "--render"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-fp32.json", "cpu-fp32.md", "cpu-fp32.png"]


def test_request_time_goals_are_time_ratios():
    """The CUDA goals on a user's request are times over row 1's that must stay at or below the bar (TTFT <= 1x at
    32k-128k, 128k + answer <= 0.8x); a measured 0.7x passes the request goal, 1.1x fails the TTFT one."""
    from dot4attn.e2e import report

    results = []
    for row, prefill in (("genai", 10.0), ("d4a-q8_0", 11.0), ("d4a-q4_0", 6.0)):
        results.append(dict(row=row, context=131072, batch=1, prefill_s=prefill, ms_per_token=5.0,
                            tokens_per_s=200.0, cache_bytes_per_token=100))
    report.add_ratios(results, weight_bytes=1000, base_kv=100, answer_tokens=500)
    goals = {g["name"]: g for g in report.goals(results, "cuda")}
    ttft3 = goals["batch 1, 128k: row 3 time to first token / row 1's"]
    assert ttft3["value"] == pytest.approx(1.1) and ttft3["passed"] is False
    req4 = goals["batch 1, 128k prompt + answer: row 4 request time / row 1's"]
    assert req4["value"] == pytest.approx((6.0 + 2.5) / (10.0 + 2.5)) and req4["passed"] is True
    assert goals["batch 1, 32k: row 4 time to first token / row 1's"]["value"] is None  # not measured
    assert report.goals(results, "cuda", smoke=True) == []
    # in the row's own measure: row 3's TTFT against row 1's 10 s; row 4's request (6 s + 500 x 5 ms) against 0.8 x
    # row 1's 12.5 s, the answer's 2.5 s at row 4's own speed left as it is: TTFT <= 7.5 s
    assert ttft3["terms"] == "TTFT 11 s, wanted <= 10 s"
    assert req4["terms"] == "TTFT 6 s, wanted <= 7.5 s"
    assert "terms" not in goals["batch 1, 32k: row 4 time to first token / row 1's"]


def test_speed_goals_say_the_step_time_that_would_pass():
    """A speed goal's terms are the row's ms/token and the most that passes: row 1's step over the goal (tokens/s
    ratio at one batch), or for the bandwidth-model goal row 1's step over 0.9 x the model's ratio; the capacity goal
    names the batch to reach. The markdown table carries them beside the verdict."""
    from dot4attn.e2e import report

    results = [dict(row="genai", context=131072, batch=1, ms_per_token=6.0, tokens_per_s=1000 / 6.0,
                     cache_bytes_per_token=200),
               dict(row="d4a-q8_0", context=131072, batch=1, ms_per_token=5.0, tokens_per_s=200.0,
                    cache_bytes_per_token=100),
               dict(row="genai", fit_batch=63, fit_note="-"), dict(row="d4a-q4_0", fit_batch=100, fit_note="-")]
    report.add_ratios(results, weight_bytes=1000, base_kv=200, answer_tokens=500)
    goals = {g["name"]: g for g in report.goals(results, "cuda")}
    speed = goals["batch 1, 128k: row 3 vs row 1"]
    assert speed["value"] == pytest.approx(1.2) and speed["passed"] is True
    assert speed["terms"] == f"ms/token 5, wanted <= {6.0 / 1.12:.3g}"
    model = results[1]["model_ratio"]  # (1000 + 131072 x 200) / (1000 + 131072 x 100)
    band = goals["row 3 at 131072, batch 1: measured / bandwidth-model ratio"]
    assert band["value"] == pytest.approx(1.2 / model)
    assert band["terms"] == f"ms/token 5, wanted <= {6.0 / (0.9 * model):.3g}"
    fit = goals["largest batch of 32k sequences: rows 3/4 (best) vs row 1"]
    assert fit["passed"] is False and fit["terms"] == "batch 100, wanted >= 114"  # 1.8 x 63 = 113.4
    md = report.markdown([], list(goals.values()), dict(model="m", machine="x"))
    assert f"| batch 1, 128k: row 3 vs row 1 | 1.20x | >= 1.12x | pass | ms/token 5, wanted <= {6.0 / 1.12:.3g} |" \
        in md


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda-int4"])
def test_results_pages_are_what_their_measurements_render(name, tmp_path):
    """docs/e2e/NAME.md and the derived fields of NAME.json are what this report writes from NAME.json's
    measurements (`dot4attn e2e --render`): a change of the report renders the results pages again in the same
    commit, so no page shows a table or goal the current report would not."""
    from dot4attn.e2e import report

    docs = Path(__file__).resolve().parents[2] / "docs" / "e2e"
    (tmp_path / f"{name}.json").write_bytes((docs / f"{name}.json").read_bytes())
    report.render(tmp_path / f"{name}.json")
    assert (tmp_path / f"{name}.md").read_text() == (docs / f"{name}.md").read_text()
    assert json.loads((tmp_path / f"{name}.json").read_text()) == json.loads((docs / f"{name}.json").read_text())


def test_resume_measures_only_what_is_missing(smoke, tmp_path):
    """A run split over two invocations: row 1 alone first, then --resume adds rows 2-4, keeps row 1's numbers as they
    were, and still compares the new rows with row 1 (its logits are kept beside the models)."""
    base = ["e2e", "--smoke", "--out", str(tmp_path), "--contexts", "64,128", "--batches", "1"]  # the smoke's model
    assert cli(base + ["--rows", "genai"]) == 0
    first = json.loads((tmp_path / "smoke.json").read_text())["results"]
    assert [r["row"] for r in first] == ["genai", "genai"]
    assert cli(base + ["--resume"]) == 0
    second = json.loads((tmp_path / "smoke.json").read_text())["results"]
    assert [r["row"] for r in second] == ["genai", "genai-int8kv", "d4a-q8_0", "d4a-q4_0"] * 2
    assert [r["ms_per_token"] for r in second if r["row"] == "genai"] == [r["ms_per_token"] for r in first]
    _, data = smoke  # rows 2-4 compare with row 1 as in the single-invocation run
    for r in second:
        if r["row"] != "genai":
            same = next(x for x in data["results"] if x["row"] == r["row"] and x.get("context") == r["context"]
                        and x.get("batch") == 1)
            assert r["kl"] == pytest.approx(same["kl"], rel=1e-6), r


def test_remeasure_measures_the_named_cases_again_and_keeps_the_rest(smoke, tmp_path):
    """--remeasure: the smoke run's page, its numbers marked; measuring row 4 again at batch 1 and the shorter
    context replaces just that case (on the page's model, built for its longest context: new numbers, compared with
    the kept row 1 as before), every other case keeps its mark; each case of a dot4attn row records the op library
    that measured it, and the page names it."""
    from dot4attn import library_digest

    _, data = smoke
    marked = [dict(r, ms_per_token=1234.5) if "ms_per_token" in r else r for r in data["results"]]
    (tmp_path / "smoke.json").write_text(json.dumps(dict(facts=data["facts"], results=marked)))
    assert cli(["e2e", "--smoke", "--out", str(tmp_path), "--contexts", "64", "--batches", "1",
                "--rows", "d4a-q4_0", "--remeasure"]) == 0
    page = json.loads((tmp_path / "smoke.json").read_text())
    assert page["facts"]["model_key"] == data["facts"]["model_key"] and page["facts"]["max_positions"] == 128 + 256
    named = [r for r in page["results"] if (r["row"], r["context"], r["batch"]) == ("d4a-q4_0", 64, 1)]
    assert len(named) == 1 and named[0]["ms_per_token"] != 1234.5 and 0 <= named[0]["kl"] <= 0.1, named
    rest = [r for r in page["results"] if r not in named]
    assert len(rest) == len(data["results"]) - 1 and all(r["ms_per_token"] == 1234.5 for r in rest)
    digest = library_digest()
    assert len(digest) == 12 and named[0]["library"] == digest
    assert all(("library" in r) == r["row"].startswith("d4a-") for r in data["results"])
    assert f"`{digest}`, every case." in (tmp_path / "smoke.md").read_text()


def test_remeasure_drops_only_the_named_rows_cases():
    """What --remeasure measures again: the named rows at the settings' (context, batch) cases, and their fit
    searches only where the settings search one."""
    from dot4attn.e2e import without_cases
    from dot4attn.e2e.harness import Settings

    results = [dict(row=row, context=c, batch=b, ms_per_token=1.0) for row in ("genai", "d4a-q8_0")
               for c, b in ((64, 1), (128, 1), (128, 2))] + [dict(row="d4a-q8_0", fit_batch=9)]
    settings = Settings(device="cpu", contexts=[128], batches=[1, 2], batch_contexts=[128])
    kept = without_cases(results, settings, ["d4a-q8_0"])
    assert [(r["row"], r.get("context"), r.get("batch")) for r in kept] == \
        [("genai", 64, 1), ("genai", 128, 1), ("genai", 128, 2), ("d4a-q8_0", 64, 1), ("d4a-q8_0", None, None)]
    settings.fit_context = 128
    assert "fit_batch" not in without_cases(results, settings, ["d4a-q8_0"])[-1]


def test_a_page_names_each_library_with_its_cells():
    """Cells measured by two builds (and older ones that recorded none): the note lists each library's cells by row,
    context and batch; a page whose cells recorded no library has no note."""
    from dot4attn.e2e.report import library_note

    cell = lambda row, c, b=1, **kw: dict(row=row, context=c, batch=b, ms_per_token=1.0, **kw)  # noqa: E731
    results = [cell("genai", 4096), cell("d4a-q8_0", 4096), cell("d4a-q8_0", 131072, library="aaaaaaaaaaaa"),
               cell("d4a-q4_0", 131072, library="aaaaaaaaaaaa"), cell("d4a-q4_0", 32768, 16, library="bbbbbbbbbbbb")]
    assert library_note(results) == (
        "Op library of the dot4attn rows (sha256 of libdot4attn_ops.so, first 12 digits): not recorded (row 3 4k), "
        "`aaaaaaaaaaaa` (row 3 128k; row 4 128k), `bbbbbbbbbbbb` (row 4 32k x16).")
    assert library_note([cell("genai", 4096), cell("d4a-q8_0", 4096)]) is None


def test_resume_measures_a_rows_failed_case_again(smoke, tmp_path):
    """--resume: a case that failed (on a GPU, a prompt that ran out of the arena another row's prompt grew) is
    measured again when its row runs, and kept as it was while other rows run."""
    base = ["e2e", "--smoke", "--out", str(tmp_path), "--contexts", "64", "--batches", "1"]
    assert cli(base + ["--rows", "genai,d4a-q4_0"]) == 0
    path = tmp_path / "smoke.json"
    data = json.loads(path.read_text())
    for i, r in enumerate(data["results"]):
        if r["row"] == "d4a-q4_0":
            data["results"][i] = dict(row=r["row"], label=r["label"], context=64, batch=1,
                                      failed="RuntimeError: out of memory")
    path.write_text(json.dumps(data))

    def q4_0():
        return [r for r in json.loads(path.read_text())["results"] if r["row"] == "d4a-q4_0"]

    assert cli(base + ["--rows", "genai", "--resume"]) == 0
    assert [r.get("failed") for r in q4_0()] == ["RuntimeError: out of memory"]
    assert cli(base + ["--rows", "d4a-q4_0", "--resume"]) == 0
    again = q4_0()
    assert len(again) == 1 and "failed" not in again[0] and again[0]["ms_per_token"] > 0, again


def test_case_processes_measure_every_case_in_a_process_of_its_own(smoke, tmp_path, monkeypatch):
    """--case-processes: every timed case runs in a process of its own (dot4attn.e2e.case_process, which warms itself
    up first), so no case inherits what another's prompt grew in onnxruntime's arena; the rows are measured as in one
    process, row 1's logits (back through a file) the reference of the others' KL."""
    import subprocess

    real, specs = subprocess.run, []

    def run(cmd, **kw):
        if "dot4attn.e2e.case_process" in cmd:
            specs.append(json.loads(Path(cmd[-1]).read_text()))
        return real(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    assert cli(["e2e", "--smoke", "--out", str(tmp_path), "--contexts", "64", "--batches", "1",
                "--case-processes"]) == 0
    rows = ["genai", "genai-int8kv", "d4a-q8_0", "d4a-q4_0"]
    assert [(x["row"], x["context"], x["batch"]) for x in specs] == [(row, 64, 1) for row in rows]
    assert all(x["settings"]["case_processes"] for x in specs)
    results = json.loads((tmp_path / "smoke.json").read_text())["results"]
    assert [r["row"] for r in results] == rows
    for r in results:
        assert r["ms_per_token"] > 0 and r["prefill_s"] > 0
        if r["row"] != "genai":
            assert 0 <= r["kl"] <= (0.1 if r["row"] == "d4a-q4_0" else 1e-3), r


def test_a_case_process_that_dies_is_the_cases_failure(tmp_path, monkeypatch):
    """A case process that ends without its answer (here: no model in the folder) is the case's failure, with the
    process's exit status and its last words, and the run goes on."""
    from dot4attn.e2e import harness

    monkeypatch.setattr(harness, "cache_bytes_per_token", lambda folder: 100)  # the parent reads no model

    settings = harness.Settings(device="cpu", contexts=[16], batches=[1], batch_contexts=[16], steps=2,
                                case_processes=True)
    results = harness.run_rows({"genai": tmp_path / "missing"}, settings, vocab=8, log=lambda *a: None,
                               rows=["genai"])
    (r,) = results
    assert r["failed"].startswith("case process exit 1: ") and "missing" in r["failed"], r


def test_the_q6_0_row_is_asked_for_by_name(smoke, tmp_path):
    """Row 5 (packed K + q6_0 V in the pair layout, og.Generator) runs when --rows names it: ORT int8's bytes per
    token (qwen2-bias, D 32: K and V rows of 32 bytes) and KL against row 1 within the compare bar of q6_0 V (5e-3).
    Default runs leave it out (the tests above)."""
    from dot4attn.e2e import models

    base = ["e2e", "--smoke", "--out", str(tmp_path), "--contexts", "64", "--batches", "1"]
    assert cli(base + ["--rows", "genai,d4a-q6_0"]) == 0
    data = json.loads((tmp_path / "smoke.json").read_text())
    rows = {r["row"]: r for r in data["results"]}
    assert list(rows) == ["genai", "d4a-q6_0"]
    q6 = rows["d4a-q6_0"]
    assert q6["cache_bytes_per_token"] == 2 * 2 * (32 + 32) and q6["runner"] == "og"
    assert 0 <= q6["kl"] <= 5e-3 and q6["ms_per_token"] > 0
    assert "5. `d4a-q6_0`" in (tmp_path / "smoke.md").read_text()
    assert models.unavailable("d4a-q6_0", "cpu") is None and models.unavailable("d4a-q8_0", "cuda") is None


def test_the_q6_0_row_is_available_on_a_gpu():
    """q6_0 V runs on the GPU EPs as on the CPU, nothing set in the environment: row 5 is available on cuda."""
    from dot4attn.e2e import models

    assert models.unavailable("d4a-q6_0", "cuda") is None
    assert models.unavailable("d4a-q6_0", "cpu") is None


@pytest.mark.parametrize("row", ["genai", "d4a-q4_0"])
def test_fit_probe_answers_in_its_own_process(smoke, row):
    """One try of the fit search (fit_probe.py, a process per try): a small batch fits; an absurd one is refused
    with the allocation's error, as a JSON answer and exit status 0 (the search reads the answer, not a crash)."""
    import subprocess
    import sys

    from dot4attn.models.export import model_cache_dir

    _, data = smoke
    folder = model_cache_dir() / "e2e" / data["facts"]["model_key"] / row
    probe = lambda batch: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "dot4attn.e2e.fit_probe", "inplace", str(folder), "cpu", str(batch), "200"],
        capture_output=True, text=True)
    ok = probe(2)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])["fits"] is True
    huge = probe(1 << 40)  # 2^40 sequences: no allocator takes that
    answer = json.loads(huge.stdout.splitlines()[-1])
    assert huge.returncode == 0 and answer["fits"] is False and answer["error"]


def test_resume_refuses_other_settings(smoke, capsys):
    out, _ = smoke
    assert cli(["e2e", "--smoke", "--out", str(out), "--resume", "--steps", "3"]) == 2
    assert "measured with other steps" in capsys.readouterr().err


def test_resume_keeps_fit_searches_when_only_case_settings_differ(tmp_path):
    """A fit try allocates and decodes a batch the same way with or without CUDA graphs (or another seed), so a
    resumed run with other such settings keeps the earlier fit searches and measures every case again; other
    steps change the fit tries' length, so they refuse to resume."""
    from dot4attn.e2e import resumed

    settings = dict(steps=24, warmup=2, seed=0, chunk=16384, device="cuda", fit_context=32768, cuda_graph=False)
    facts = dict(model="m", model_key="k", weight_bytes=1, settings=settings)
    results = [dict(row="genai", context=4096, batch=1, ms_per_token=6.0),
               dict(row="genai", fit_batch=63, fit_note="free 122 GiB")]
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(dict(facts=facts, results=results)))
    assert resumed(path, facts) == results
    logged = []
    graph = dict(facts, settings=dict(settings, cuda_graph=True))
    assert resumed(path, graph, logged.append) == results[1:]
    assert "other cuda_graph: only its fit searches are kept" in logged[0]
    with pytest.raises(ValueError, match="measured with other steps"):
        resumed(path, dict(facts, settings=dict(settings, steps=8, cuda_graph=True)))


def test_resume_measures_again_the_batches_whose_prompt_is_now_copied(tmp_path):
    from dot4attn.e2e import resumed

    settings = dict(steps=24, warmup=2, seed=0, chunk=16384, device="cuda", fit_context=32768, cuda_graph=True)
    facts = dict(model="m", model_key="k", weight_bytes=1, settings=settings)
    results = [dict(row="genai", context=32768, batch=1, ms_per_token=6.0),
               dict(row="genai", context=32768, batch=16, failed="out of memory"),
               dict(row="genai", context=16384, batch=16, ms_per_token=12.0)]
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(dict(facts=facts, results=results)))
    copied = dict(facts, settings=dict(settings, copied_contexts=[32768]))
    assert resumed(path, copied) == [results[0], results[2]]


@pytest.mark.parametrize("kind", ["og", "inplace"])
def test_cuda_graph_needs_cuda(kind, tmp_path):
    from dot4attn.e2e.runners import make_runner

    with pytest.raises(ValueError, match="cuda_graph needs device='cuda'"):
        make_runner(kind, tmp_path, "cpu", cuda_graph=True)


@pytest.mark.parametrize("argv,message", [
    (["--rows", "genai,gqa"], "unknown rows"),
    (["--contexts", "64,128", "--batch-contexts", "256"], "must be among --contexts"),
    (["--contexts", "64,-1"], "integers >= 1"),
    (["--steps", "300"], "at most 256"),
])
def test_bad_options_are_refused(argv, message, capsys, tmp_path):
    try:
        rc = cli(["e2e", "--smoke", "--out", str(tmp_path)] + argv)
    except SystemExit as e:  # argparse's own refusal of a malformed list
        rc = e.code
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


class _FakeRunner:
    """A runner with the runtime's Decoder interface that loads nothing: a prefill calls on_start(self, prompt,
    chunk) (which may raise, as a failing case does); every step returns zero logits."""

    def __init__(self, kind, cuda_graph, on_start=None):
        self.kind, self.cuda_graph, self.on_start, self.batch, self.length = kind, cuda_graph, on_start, 1, 0

    def reset(self, batch, max_length):
        self.batch, self.length = batch, 0

    def prefill(self, prompt, mask=None, chunk=None):
        if self.on_start:
            self.on_start(self, prompt, chunk)
        return self.step(prompt)

    def prompt_copied(self, ids, chunk):
        return self.prefill(ids, chunk=chunk)

    def step(self, tokens, mask=None):
        import numpy as np

        return np.zeros((self.batch, 8), np.float16)

    def greedy_step(self, mask=None):
        import numpy as np

        return np.zeros(self.batch, np.int64)

    def release(self):
        pass

    def close(self):
        pass


def _fake_runners(monkeypatch, on_start=None, threads_of: list | None = None) -> list[tuple[str, bool]]:
    """The harness makes _FakeRunners; returns the (kind, cuda_graph) of each runner made, in order (and appends
    each one's intra-op threads to threads_of)."""
    from dot4attn.e2e import harness

    made = []

    def make(kind, folder, device, cuda_graph=False, threads=None):
        made.append((kind, cuda_graph))
        if threads_of is not None:
            threads_of.append(threads)
        return _FakeRunner(kind, cuda_graph, on_start)

    monkeypatch.setattr(harness, "make_runner", make)
    monkeypatch.setattr(harness, "cache_bytes_per_token", lambda folder: 100)
    return made


def test_every_row_runs_the_same_intra_op_threads(monkeypatch, tmp_path):
    """Settings.threads reaches every runner the harness makes, og.Generator's rows and the in-place row alike (their
    runtimes' own defaults differ on the CPU: runners.make_runner)."""
    from dot4attn.e2e import harness

    threads = []
    made = _fake_runners(monkeypatch, threads_of=threads)
    settings = harness.Settings(device="cpu", contexts=[16], batches=[1], batch_contexts=[16], steps=2, threads=3)
    rows = ["genai", "d4a-q8_0", "d4a-q4_0"]
    harness.run_rows({r: tmp_path for r in rows}, settings, vocab=8, log=lambda *a: None, rows=rows)
    assert {k for k, _ in made} == {"og", "inplace"} and threads == [3] * len(made), (made, threads)


def test_threads_default_to_the_cpus_on_the_cpu(smoke):
    """On the CPU every row runs as many intra-op threads as the process has CPUs (recorded, and said in the
    table's header); --threads sets them, 0 leaves each runtime its own; on CUDA each runtime keeps its own."""
    import argparse
    import os

    from dot4attn.e2e import add_arguments, settings_from_args

    out, data = smoke
    n = len(os.sched_getaffinity(0))
    assert data["facts"]["settings"]["threads"] == n
    assert f"runs {n} ONNX Runtime intra-op thread" in (out / "smoke.md").read_text()
    p = argparse.ArgumentParser()
    add_arguments(p)
    for argv, want in ((["--device", "cpu"], n), (["--device", "cpu", "--threads", "1"], 1),
                       (["--device", "cpu", "--threads", "0"], None), (["--device", "cuda"], None),
                       (["--device", "cuda", "--threads", "4"], 4)):
        assert settings_from_args(p.parse_args(argv))[1].threads == want, argv


def test_a_case_whose_cuda_graph_mode_fails_runs_launched(monkeypatch, tmp_path):
    """onnxruntime-genai's graph mode fails for a GroupQueryAttention prompt at batch > 1: that case is measured
    again launched, with a note; an out-of-memory failure is not retried (it would fail again)."""
    from dot4attn.e2e import harness

    for error, measured in (("batch_size must be 1 when sequence_length > 1", True),
                            ("BFCArena::AllocateRawInternal failed to allocate", False)):
        def fail_with_a_graph(runner, prompt, chunk, error=error):
            if runner.cuda_graph:
                raise RuntimeError(error)

        made = _fake_runners(monkeypatch, fail_with_a_graph)
        settings = harness.Settings(device="cpu", contexts=[16], batches=[1], batch_contexts=[16], steps=2,
                                    cuda_graph=True)
        results = harness.run_rows({"genai": tmp_path}, settings, vocab=8, log=lambda *a: None, rows=["genai"])
        (r,) = results
        graphs = [graph for _, graph in made][1:]  # the first: the process's untimed warm-up (its failure only logged)
        if measured:
            assert graphs == [True, False] and r["cuda_graph"] is False and "batch_size must be 1" in r["note"]
            assert r["ms_per_token"] > 0
        else:
            assert graphs == [True] and "failed to allocate" in r["failed"]


def test_one_untimed_warm_up_prompt_runs_before_the_first_timed_case(monkeypatch, tmp_path):
    """What the process pays once must not land on the first case's time to first token (row 1's): one short untimed
    prompt on the first row's model comes first, once per process, and not at all when nothing is left to measure."""
    from dot4attn.e2e import harness

    prompts = []
    made = _fake_runners(monkeypatch, lambda runner, prompt, chunk: prompts.append(prompt.shape))
    settings = harness.Settings(device="cpu", contexts=[16, 32], batches=[1], batch_contexts=[16], steps=2)
    folders = {"genai": tmp_path, "d4a-q4_0": tmp_path}
    results = harness.run_rows(folders, settings, vocab=8, log=lambda *a: None, rows=["genai", "d4a-q4_0"])
    assert prompts == [(1, harness.WARM_UP_TOKENS), (1, 16), (1, 32), (1, 16), (1, 32)]
    assert [kind for kind, _ in made] == ["og", "og", "og", "inplace", "inplace"]
    assert len(results) == 4 and all("prefill_s" in r for r in results)
    prompts.clear()
    again = harness.run_rows(folders, settings, vocab=8, log=lambda *a: None, previous=results,
                             rows=["genai", "d4a-q4_0"])
    assert prompts == [] and len(again) == 4  # everything resumed: no warm-up, no case


def test_copied_prompt_contexts_decode_one_prefilled_sequence_copied_to_the_batch(monkeypatch, tmp_path):
    """At a --copied-prompt-contexts context a batch > 1 is measured by dot4attn.runtime.inplace over one prefilled sequence
    copied to the batch, for every row, with a note and no prefill time; batch 1 and the other contexts keep the
    row's own runner."""
    from dot4attn.e2e import harness

    def check_chunk(runner, prompt, chunk):
        assert chunk == (64 if runner.kind == "inplace-copied" else 64 // prompt.shape[0])

    made = _fake_runners(monkeypatch, check_chunk)
    settings = harness.Settings(device="cpu", contexts=[16, 32], batches=[1, 2], batch_contexts=[16, 32], steps=2,
                                chunk=64, copied_contexts=[32])
    results = harness.run_rows({"genai": tmp_path, "d4a-q4_0": tmp_path}, settings, vocab=8, log=lambda *a: None,
                               rows=["genai", "d4a-q4_0"])
    # the first og runner: the untimed warm-up case on row 1's model before the first timed case
    assert [kind for kind, _ in made] == ["og", "og", "og", "og", "inplace-copied", "inplace", "inplace", "inplace",
                                          "inplace-copied"]
    for r in results:
        copied = r["batch"] == 2 and r["context"] == 32
        assert r.get("copied_prompt", False) == copied and (r["prefill_s"] is None) == copied
        assert r["runner"] == ("inplace" if copied or r["row"] == "d4a-q4_0" else "og")
        if copied:
            assert re.search(r"one sequence's prefill \([0-9.e-]+ s\) copied to the batch", r["note"]), r["note"]


def test_copied_prompt_contexts_must_be_batch_contexts(capsys, tmp_path):
    from dot4attn.cli import main

    rc = main(["e2e", "--smoke", "--out", str(tmp_path / "o"), "--copied-prompt-contexts", "64"])
    assert rc == 2
    assert "--copied-prompt-contexts [64] must be among the batch contexts [128]" in capsys.readouterr().err
