"""`dot4attn demo` and `export` refuse an unknown preset or exporter in argparse (before torch is imported), report a
failed step on stderr with exit 2 (could not run; 1 is for agreement below the thresholds), and print whole lines
into a pipe."""
from __future__ import annotations

import pytest

from dot4attn.cli import build_parser, main


@pytest.mark.parametrize("argv,option", [
    (["demo", "--preset", "huge"], "--preset"),
    (["demo", "--exporter", "jit"], "--exporter"),
    (["export", "--preset", "huge", "--out", "m.onnx"], "--preset"),
])
def test_unknown_choice_is_refused_by_argparse(argv, option, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: invalid choice: '{argv[2]}' (choose from " in err, err


def test_every_preset_and_exporter_is_offered():
    from dot4attn.models.export import EXPORTERS
    from dot4attn.models.recipes import PRESETS

    for preset in PRESETS:
        assert build_parser().parse_args(["demo", "--preset", preset]).preset == preset
    for exporter in EXPORTERS:
        assert build_parser().parse_args(["demo", "--exporter", exporter]).exporter == exporter


def test_demo_step_that_fails_exits_2_on_stderr(monkeypatch, tmp_path, capsys):
    from dot4attn.models import export

    def broken(*args, **kwargs):
        raise RuntimeError("the exporter broke")

    monkeypatch.setattr(export, "cached_export", broken)
    assert main(["demo", "--workdir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == "dot4attn demo: export failed: the exporter broke\n", captured.err
    assert "Traceback" not in captured.out + captured.err


def test_demo_console_is_wide_into_a_pipe(capsys):
    from dot4attn.cli.demo import console

    # pytest captures stdout: not a terminal, as under `dot4attn demo | tee log`
    con = console()
    assert con.width >= 150
    con.print("x" * 140)
    assert capsys.readouterr().out == "x" * 140 + "\n"
