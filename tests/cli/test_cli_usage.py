"""The `dot4attn` CLI explains itself: every verb and option has help (with its default), numbers are checked by
argparse with the option named, --version, exit codes that tell "disagree" from "could not run", and no traceback
on Ctrl-C or a closed pipe."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import dot4attn
from dot4attn.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, build_parser, main

PYTHON_DIR = Path(dot4attn.__file__).resolve().parents[1]


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


VERBS = _verbs()


def test_every_verb_is_listed():
    assert set(VERBS) == {"info", "bench", "e2e", "export", "rewrite", "generate", "compare", "eval", "demo"}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_verb_has_description_and_every_option_help(verb):
    p = VERBS[verb]
    assert p.description and len(p.description) > 40, f"{verb}: no description"
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"dot4attn {verb} {name}: no help"
        # named types, so that an argparse error never reads "invalid <lambda> value" or "invalid int value"
        assert action.type not in (int, float), f"dot4attn {verb} {name}: bare {action.type.__name__} type"
        assert getattr(action.type, "__name__", "") != "<lambda>", f"dot4attn {verb} {name}: a lambda type"


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_help_shows_every_default(verb):
    p = VERBS[verb]
    text = p.format_help()
    for action in p._actions:
        # identity: 0 == False, and a default of 0 (compare --seed) must show too
        if action.option_strings and not any(action.default is none for none in (None, False, argparse.SUPPRESS)):
            # either the help says it in words or the formatter appended "(default: X)"
            assert "default" in p._get_formatter()._expand_help(action), (verb, action.dest)
    assert "%(default)" not in text


def test_compare_help_states_exit_codes_and_defaults():
    text = VERBS["compare"].format_help()
    flat = " ".join(text.split())  # argparse wraps the help lines
    assert "(default: 32)" in text and "(default: 0.95 for float / q8_0 V" in flat
    assert "0.1 for q4_0 V, 5e-3 for q6_0 V)" in flat
    assert "1 they disagree" in text and "2 the comparison could not run" in text


def test_info_plan_takes_every_v_format(capsys):
    """`dot4attn info --plan` parses every V format, q6_0 too (the GPU kernels take it at D a multiple of 64), and a
    call that does not parse is told the formats; a build without GPU kernels then says it has none."""
    from dot4attn import native

    h200 = "sm=90a,sms=132,smem=232448"
    assert main(["info", "--plan", "1,32,8,1,1024,128,q5", "--gpu", h200]) == 2
    err = capsys.readouterr().err
    assert "expected B,Hq,Hkv,Sq,Sk,D[,float|q8_0|q4_0|q6_0] (integers >= 1), got '1,32,8,1,1024,128,q5'" in err, err
    rc = main(["info", "--plan", "1,32,8,1,1024,128,q6_0", "--gpu", h200])
    out, err = capsys.readouterr()
    if native.has_gpu_entries():
        assert rc == 0 and "V=q6_0" in out and "decode_mma" in out, (out, err)
    else:
        assert rc == 2 and "dot4attn info --plan: this build of the op library has no GPU kernels" in err, err


BAD_NUMBERS = [
    ("compare", ["a.onnx", "b.onnx"], "--batch", "0", "an integer >= 1"),
    ("compare", ["a.onnx", "b.onnx"], "--prompt-len", "0", "an integer >= 1"),
    ("compare", ["a.onnx", "b.onnx"], "--steps", "-1", "an integer >= 0"),
    ("compare", ["a.onnx", "b.onnx"], "--min-top1", "1.5", "a number in [0, 1]"),
    ("compare", ["a.onnx", "b.onnx"], "--max-kl", "nan", "a number >= 0"),
    ("compare", ["a.onnx", "b.onnx"], "--max-logit-diff", "-1", "a number >= 0"),
    ("generate", ["m.onnx", "--token-ids", "1"], "--max-new-tokens", "0", "an integer >= 1"),
    ("generate", ["m.onnx", "--token-ids", "1"], "--batch", "0", "an integer >= 1"),
    ("generate", ["m.onnx", "--token-ids", "1"], "--threads", "-2", "an integer >= 0"),
    ("generate", ["m.onnx"], "--token-ids", "1 x 3", "integers >= 0"),
    ("generate", ["m.onnx"], "--token-ids", "1 -3", "integers >= 0"),
    ("demo", [], "--new-tokens", "0", "an integer >= 1"),
    ("export", ["--preset", "tiny", "--out", "m.onnx"], "--seed", "-1", "an integer >= 0"),
    ("bench", [], "--batch", "0", "an integer >= 1"),
    ("bench", [], "--threads", "-1", "an integer >= 0"),
    ("bench", [], "--case-seconds", "-3", "a number >= 0"),
    ("bench", [], "--decode-sk", "4096,0", "integers >= 1"),
    ("bench", [], "--heads", "32,0,128", "Hq,Hkv,D"),
    ("bench", [], "--heads", "32,5,128", "Hq a multiple of Hkv"),
    ("e2e", [], "--steps", "0", "an integer >= 1"),
    ("e2e", [], "--chunk", "0", "an integer >= 1"),
    ("e2e", [], "--warmup", "-1", "an integer >= 0"),
    ("e2e", [], "--contexts", "64,-1", "integers >= 1"),
    ("e2e", [], "--answer-tokens", "0", "an integer >= 1"),
]


@pytest.mark.parametrize("verb,rest,option,value,expected", BAD_NUMBERS)
def test_bad_number_is_refused_by_argparse(verb, rest, option, value, expected, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([verb, *rest, f"{option}={value}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and expected in err and repr(value) in err, err
    assert "<lambda>" not in err and "Traceback" not in err


def test_good_numbers_parse():
    args = build_parser().parse_args(["compare", "a", "b", "--batch", "2", "--steps", "0", "--min-top1", "1"])
    assert (args.batch, args.steps, args.min_top1) == (2, 0, 1.0)
    args = build_parser().parse_args(["generate", "m", "--token-ids", "1, 17 42"])
    assert args.token_ids == [1, 17, 42]
    assert build_parser().parse_args(["bench", "--prefill-sk", ""]).prefill_sk == []


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dot4attn {dot4attn.__version__}; op library ")


def test_version_without_the_library(monkeypatch, capsys):
    monkeypatch.setenv("DOT4ATTN_LIBRARY", "/nonexistent/libdot4attn_ops.so")
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"dot4attn {dot4attn.__version__}" in out and "not loadable" in out and "/nonexistent" in out


# ---- exit codes ---------------------------------------------------------------------------------------------------

def test_compare_could_not_run_exits_2(tmp_path, capsys):
    rc = main(["compare", str(tmp_path / "missing.onnx"), str(tmp_path / "also-missing.onnx")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "missing.onnx" in err and "Traceback" not in err


def test_compare_disagree_exits_1_and_agree_0(tmp_path, capsys):
    from conftest_models import exported, need_ops

    need_ops()
    tiny = exported("qwen3", "tiny", "dynamo")
    q4 = tmp_path / "q4.onnx"
    assert main(["rewrite", str(tiny), str(q4), "--v-format", "q4_0"]) == 0
    capsys.readouterr()
    # q4_0 V is not exact: a zero KL bound is a disagreement, an answer rather than a failure to run
    assert main(["compare", str(tiny), str(q4), "--prompt-len", "8", "--steps", "2", "--max-kl", "0"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("FAIL: ") and "mean KL" in captured.err and "Traceback" not in captured.err
    assert main(["compare", str(tiny), str(tiny), "--prompt-len", "8", "--steps", "2"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_compare_judges_a_rewrite_by_its_v_formats_bars(tmp_path, capsys):
    """Without --min-top1 / --max-kl a rewrite meets its V format's bars (compare.quality_failures): q4_0 V by mean
    KL <= 0.1 alone (q6_0: 5e-3), float / q8_0 V by top-1 >= 0.95 and KL <= 1e-3; the format is read off the
    rewritten model (q4_0 and q6_0 payloads both uint8, told apart by their width)."""
    from conftest_models import exported, need_ops

    from dot4attn.quality.compare import rewritten_v_format

    need_ops()
    tiny = exported("qwen3", "tiny", "dynamo")
    for vf in ("float", "q8_0", "q4_0", "q6_0"):
        out = tmp_path / f"{vf}.onnx"
        assert main(["rewrite", str(tiny), str(out), "--v-format", vf]) == 0
        assert rewritten_v_format(out) == vf
    assert rewritten_v_format(tiny) == "float"
    capsys.readouterr()
    assert main(["compare", str(tiny), str(tmp_path / "q4_0.onnx"), "--prompt-len", "8", "--steps", "24"]) == 0
    assert capsys.readouterr().out.endswith("PASS\n")
    assert main(["compare", str(tiny), str(tmp_path / "q6_0.onnx"), "--prompt-len", "8", "--steps", "24"]) == 0
    assert capsys.readouterr().out.endswith("PASS\n")
    # a bar given explicitly replaces the format's: a zero KL bound fails the same q4_0 rewrite
    assert main(["compare", str(tiny), str(tmp_path / "q4_0.onnx"), "--prompt-len", "8", "--steps", "24",
                 "--max-kl", "0"]) == 1
    assert capsys.readouterr().err.startswith("FAIL: mean KL")


# ---- signals ------------------------------------------------------------------------------------------------------

def _child(code: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True, **kw)


def test_ctrl_c_exits_130_with_one_line():
    # `info` made to wait, so that the signal arrives while a verb runs
    # A shell's background job starts with SIGINT ignored, and Python then installs no handler: restore the one an
    # interactive start gets, so the test does not depend on how its runner was launched.
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "import dot4attn.cli as c, dot4attn.cli.info as info\n"
            "def slow(args):\n"
            "    print('ready', file=sys.stderr, flush=True)\n"
            "    time.sleep(60)\n"
            "info.run = slow\n"
            "sys.exit(c.main(['info']))\n")
    p = _child(code, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stderr.readline().strip() == "ready"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err and err.strip() == "dot4attn: interrupted", err


def test_closed_pipe_is_quiet():
    # the reader is gone before `info` writes: its first write meets a broken pipe
    p = _child("import sys\nfrom dot4attn.cli import main\nsys.exit(main(['info']))\n",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=60)
    assert err == "", err
    assert p.returncode == EXIT_BROKEN_PIPE


def test_piped_info_prints_the_whole_library_path(tmp_path):
    from conftest_models import need_ops

    need_ops()
    deep = tmp_path / ("a-long-folder-name-" * 6) / ("another-long-folder-name-" * 4)
    deep.mkdir(parents=True)
    lib = deep / "libdot4attn_ops.so"
    lib.symlink_to(Path(dot4attn.get_library_path()).resolve())
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), DOT4ATTN_LIBRARY=str(lib), COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "dot4attn", "info"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"op library: {lib}\n" in r.stdout, r.stdout
    assert "library version: " in r.stdout
    assert f"library sha256: {dot4attn.library_digest()}..." in r.stdout, r.stdout


# ---- compare of onnxruntime-genai folders -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builder_folders(tmp_path_factory):
    """A small builder folder (tests/genai's, built once into the model cache) and its q8_0 rewrite."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "genai"))  # genai_support lives beside its tests
    from genai_support import genai_model

    from conftest_models import need_ops

    need_ops()
    src = genai_model("qwen2-bias", "fp32")
    out = tmp_path_factory.mktemp("compare-genai") / "q8"
    assert main(["rewrite", str(src), str(out)]) == 0
    return src, out


def test_compare_genai_folders(builder_folders, capsys):
    src, out = builder_folders
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--prompt-len", "16", "--steps", "6"]) == 0
    text = capsys.readouterr().out
    assert "positions compared      : 7\n" in text  # the prompt's last position + 6 teacher-forced steps
    assert "top-1 agreement         : 100.00%" in text and "1024 -> 384" in text and text.endswith("PASS\n")
    # the same run against a zero KL bound: q8_0 V is close, not exact, so the folders disagree (1, not 2)
    assert main(["compare", str(src), str(out), "--prompt-len", "16", "--steps", "2", "--max-kl", "0"]) == 1
    assert capsys.readouterr().err.startswith("FAIL: mean KL")


@pytest.mark.parametrize("argv,message", [
    (["{src}", "{tmp}/missing.onnx"], "must both be .onnx files or both onnxruntime-genai folders"),
    (["{src}", "{out}", "--batch", "2"], "one sequence at a time"),
    (["{src}", "{tmp}"], "not an onnxruntime-genai folder"),
    # a folder's decoder file passed for the folder: pointed at the folder (not "needs static heads")
    (["{src}/model.onnx", "{out}/model.onnx"], "is the decoder of the onnxruntime-genai folder"),
    (["{src}/model.onnx", "{tmp}/missing.onnx"], "compare the folders"),
    # more positions than genai_config.json's context_length (4096): refused before og runs
    (["{src}", "{out}", "--prompt-len", "4000", "--steps", "97"], "need 4097 positions, more than"),
])
def test_compare_genai_folders_could_not_run(builder_folders, tmp_path, argv, message, capsys):
    src, out = builder_folders
    argv = [a.format(src=src, out=out, tmp=tmp_path) for a in argv]
    capsys.readouterr()
    assert main(["compare", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
