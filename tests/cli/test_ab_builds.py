"""tools/ab_builds.py's argument parsing and round order (no GPU needed); the timing itself runs on a CUDA GPU only."""
import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ab_builds.py"
_spec = importlib.util.spec_from_file_location("ab_builds", TOOL)
ab = importlib.util.module_from_spec(_spec)
sys.modules["ab_builds"] = ab  # its dataclasses look their module up there
_spec.loader.exec_module(ab)


def test_cases_parse_with_their_defaults():
    assert ab.parse_case("32,8,128,8192,8192") == ab.Case(32, 8, 128, 8192, 8192, "f16", True)
    assert ab.parse_case("28,4,128,16384,131072,q4_0,full") == ab.Case(28, 4, 128, 16384, 131072, "q4_0", False)


@pytest.mark.parametrize("text,match", [
    ("32,8,128", "expected Hq,Hkv,D,Sq,Sk"),
    ("32,8,128,8k,8192", "must be integers"),
    ("30,8,128,8192,8192", "multiple of Hkv"),
    ("32,8,128,0,8192", ">= 1"),
    ("32,8,128,8192,8192,q5_0", "V must be one of"),
    ("32,8,128,8192,8192,f16,bidir", "only be 'full'"),
])
def test_bad_cases_say_what_is_wrong(text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        ab.parse_case(text)


def test_entries_carry_their_overrides():
    new = ab.parse_entry("new=/tmp/a.so.xz@ws=1,ws_keys=64")
    assert new == ab.Entry("new", Path("/tmp/a.so.xz"), "ws=1,ws_keys=64")
    assert ab.parse_entry("old=a.so") == ab.Entry("old", Path("a.so"), "")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=LIBRARY"):
        ab.parse_entry("a.so")
    assert ab.joined("k_dequant=1", "", "ws=1") == "k_dequant=1,ws=1"


def test_duplicate_entry_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        ab.main(["--case", "32,8,128,8192,8192", "a=x.so", "a=y.so"])
    assert "distinct" in capsys.readouterr().err


def test_rounds_put_every_entry_in_every_place():
    entries = ["old", "new", "cudnn"]
    orders = [ab.round_order(entries, r) for r in range(6)]
    assert orders[0] == entries  # the first round keeps the given order
    for place in range(len(entries)):
        assert sorted(o[place] for o in orders[:3]) == sorted(entries)  # each entry once per place in 3 rounds
    assert orders[3:] == orders[:3]
    assert all(sorted(o) == sorted(entries) for o in orders)  # every round times every entry once
