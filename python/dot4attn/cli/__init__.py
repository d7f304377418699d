"""The `dot4attn` command line: info, bench, e2e, and the model commands (export, rewrite, generate, compare, eval,
demo).

Exit status: 0 success; 1 a check failed (compare: the models disagree; bench --require-targets: a target missed);
2 the command could not run (bad option or file, missing extra, error); 130 interrupted (Ctrl-C); 141 the reader of
the output went away (`dot4attn info | head -1`), quietly.
Run `dot4attn VERB --help` for a verb's options.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..argtypes import HelpFormatter
from ..argtypes import EXIT_BROKEN_PIPE, EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED
from .options import missing_extra_message

# The verbs in --help's order: (name, module, its runner). Each module holds HELP (the one-line summary), DESCRIPTION
# (the verb's --help text), add_arguments(parser) and the runner; heavy imports (torch, transformers, onnxscript,
# onnxruntime-genai) happen inside the runner, so `dot4attn --help` stays fast.
VERBS = [
    ("info", "dot4attn.cli.info", "run"),
    ("bench", "dot4attn.bench", "run_bench"),
    ("e2e", "dot4attn.e2e", "run"),
    ("export", "dot4attn.cli.export", "run"),
    ("rewrite", "dot4attn.cli.rewrite", "run"),
    ("generate", "dot4attn.cli.generate", "run"),
    ("compare", "dot4attn.cli.compare", "run"),
    ("eval", "dot4attn.quality.eval", "run"),
    ("demo", "dot4attn.cli.demo", "run"),
]


class _VersionAction(argparse.Action):
    """`--version`: the package's version, and the op library's (with its path) when it loads. Computed when asked,
    so that parsing other options never loads the library."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def version_text() -> str:
    from .. import __version__, build_info, get_library_path

    try:
        path = get_library_path()
        library = f"op library {build_info().get('version', '?')} ({path})"
    except Exception as e:  # noqa: BLE001 - --version must answer even when the library is missing or broken
        library = f"op library not loadable: {e}"
    return f"dot4attn {__version__}; {library}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dot4attn", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--version", action=_VersionAction,
                        help="print the package version and the op library's version and path, then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB")
    for name, module_name, runner in VERBS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION, formatter_class=HelpFormatter)
        module.add_arguments(p)
        p.set_defaults(func=getattr(module, runner))
    return parser


def _quiet_broken_pipe() -> None:
    """The reader of stdout went away (`dot4attn info | head -1`): point stdout at /dev/null so that the
    interpreter's final flush does not report the broken pipe again (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        try:
            code = int(args.func(args) or 0)
        except ModuleNotFoundError as e:  # a package of an optional extra (torch, transformers, onnxscript, ...)
            message = missing_extra_message(args.command, e.name or "")
            if message is None:
                raise
            print(message, file=sys.stderr)
            return EXIT_COULD_NOT_RUN
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return code
    except KeyboardInterrupt:
        print("\ndot4attn: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_broken_pipe()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
