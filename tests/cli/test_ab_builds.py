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


def test_kernel_names_lose_their_templates_and_namespaces():
    name = "void dot4attn::gpu::pws::prefill_ws_kernel<128, 128, 3, 3>(dot4attn::gpu::TileArgs, int)"
    assert ab.short_kernel_name(name) == "prefill_ws_kernel"
    assert ab.short_kernel_name("Memset (Device)") == "Memset"
    assert ab.short_kernel_name("sm90_xmma_fprop") == "sm90_xmma_fprop"


def test_profiled_calls_are_the_runs_between_flushes_and_their_medians():
    flush = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<unsigned char>>"
    events = [("before", 0.0, 1.0), (flush, 1.0, 2.0),
              ("scan", 10.0, 12.0), ("attn", 13.0, 113.0), (flush, 120.0, 121.0),
              ("attn", 140.0, 236.0), ("scan", 130.0, 133.0), (flush, 240.0, 241.0),  # out of order: sorted
              ("scan", 250.0, 254.0), ("attn", 255.0, 355.0), ("other", 356.0, 357.0)]
    calls = ab.split_calls(events, lambda n: ab.FLUSH_KERNEL in n)
    assert [[e[0] for e in c] for c in calls] == [["scan", "attn"], ["scan", "attn"], ["scan", "attn", "other"]]
    k = ab.call_kernels(calls)
    assert k["calls"] == 2  # the third call ran another kernel list: left out
    assert k["span"] == (103.0 + 106.0) / 2
    assert k["0:scan"] == 2.5 and k["1:attn"] == 98.0


def test_negative_kernel_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        ab.main(["--case", "32,8,128,8192,8192", "--kernels", "-1", "a=x.so"])
    assert "--kernels" in capsys.readouterr().err


def test_timeline_gives_each_kernel_its_start_and_end_from_the_calls_first_start():
    # back to back: the attention kernel starts under the pass's end (a programmatic dependent), a companion after it
    calls = [[("pass", 100.0, 112.0), ("attn", 110.0, 1040.0), ("companion", 1030.0, 1042.0)],
             [("pass", 2000.0, 2014.0), ("attn", 2012.0, 2950.0), ("companion", 2940.0, 2951.0)],
             [("pass", 4000.0, 4013.0), ("attn", 4011.0, 4945.0), ("companion", 4935.0, 4947.0)],
             [("attn", 6000.0, 6900.0)]]  # another kernel list: left out
    t = ab.call_timeline(calls)
    assert t["calls"] == 3
    assert t["0:pass"] == (0.0, 13.0)
    assert t["1:attn"] == (11.0, 945.0)
    assert t["2:companion"] == (935.0, 947.0)
    assert t["end"] == 947.0  # the median of the calls' last ends (942, 951, 947)


def test_negative_timeline_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        ab.main(["--case", "32,8,128,8192,8192", "--timeline", "-2", "a=x.so"])
    assert "--timeline" in capsys.readouterr().err
