"""Command-line pieces shared by the `dot4attn` verbs (dot4attn.cli), the benchmark commands (bench, e2e) and eval:
exit codes, argparse number types that refuse what no command can run, and the help formatter that shows every
option's default.

The types are named functions that raise argparse.ArgumentTypeError, so a bad value reads
`argument --batch: expected an integer >= 1, got '0'` (argparse prints a lambda's or int's own name otherwise).
"""
from __future__ import annotations

import argparse

# Exit status (the README's table): a check that failed (compare's disagreement, bench's missed target) is an
# answer, a command that could not run is not one (scripts and CI tell them apart). 2 is also argparse's own.
EXIT_CHECK_FAILED = 1
EXIT_COULD_NOT_RUN = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`'s yes

def _int(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (a batch, a length, a count of steps)."""
    return _int(text, 1, "an integer >= 1")


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (a seed, a thread count where 0 means the default, a count that may be none)."""
    return _int(text, 0, "an integer >= 0")


def _float(text: str, what: str, ok) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or not ok(value):  # NaN passes no threshold
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A number >= 0 (a KL or logit-difference bound, a time budget where 0 means automatic)."""
    return _float(text, "a number >= 0", lambda v: v >= 0)


def fraction(text: str) -> float:
    """A number in [0, 1] (an agreement rate)."""
    return _float(text, "a number in [0, 1]", lambda v: 0 <= v <= 1)


def int_list(text: str, low: int = 1) -> list[int]:
    """Comma- or space-separated integers >= 1, e.g. '4096,16384'."""
    items = text.replace(",", " ").split()
    try:
        values = [int(x) for x in items]
    except ValueError:
        values = []
    if not values or min(values) < low:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {low}, got {text!r}")
    return values


def token_ids(text: str) -> list[int]:
    """Prompt token ids, comma- or space-separated integers >= 0, e.g. '1 17 42'."""
    return int_list(text, low=0)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ' (default: X)' to an option's help unless the help already states its default, or there is none to
    state (None, a flag's False). Descriptions keep their line breaks (the verbs' docstrings have examples)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        # `is`, not `in (None, False, ...)`: 0 == False, and a default of 0 (a seed, a count) is one to show
        if ("default" in help_text or any(action.default is none for none in (None, False, argparse.SUPPRESS))
                or not action.option_strings):
            return help_text
        return help_text + " (default: %(default)s)"


def describe(parser: argparse.ArgumentParser, text: str | None) -> None:
    """Gives a sub-parser its description and the formatter (add_parser takes them too; this serves parsers made
    elsewhere)."""
    parser.description = text
    parser.formatter_class = HelpFormatter
