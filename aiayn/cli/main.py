"""``aiayn``: entry point. Each subcommand module has ``add_parser(subparsers)`` and ``run(args)``.

Only the module of the command a command line names is imported (``aiayn.cli.commands``: each imports
torch, a second or two), inside ``main``'s ``try`` (Ctrl-C meanwhile is then one line, as it is
later, not a traceback); ``aiayn --help`` imports none.

Anything the user got wrong (a bad option value, missing or corrupt data, an unusable model directory, an
output that would destroy something, a device that is not there) is raised as an ``AiaynError``
(``aiayn.errors``) and reported as one line on stderr with exit status 1, as is an ``OSError`` (a
file that cannot be read or written), and so is a command-line argument that is not UTF-8 (before
parsing: a text or a name the commands could not encode); ``AIAYN_DEBUG=1`` shows the traceback
instead. A command line that argparse refuses (an unknown or missing option, a value of the wrong
type) is one line too, with argparse's status 2. A reader of standard output that goes away (``aiayn
translate … | head``) ends the command quietly with status 141, as ``yes | head`` ends ``yes``. Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import NoReturn

from aiayn.cli.commands import COMMANDS
from aiayn.errors import AiaynError
from aiayn.malloc import tune_malloc
from aiayn.version import __version__


class Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), whose refusal of a command line is one line, as
    every other mistake is, with argparse's exit status 2 (the usage is under ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of ``aiayn``, whole for the command that ``argv`` names (its first argument that is
    not an option: ``aiayn`` has no option that takes a value); each other command is a name and its
    line of help, enough to list it or to refuse a misspelt one."""
    parser = Parser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need', from scratch.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = next((a for a in argv if not a.startswith("-")), None)
    for command, (module, help_line) in COMMANDS.items():
        if command == named:
            import_module(f"aiayn.cli.{module}").add_parser(sub)
        else:
            sub.add_parser(command, help=help_line)
    parser.commands = sub.choices  # each command's parser, by name: the one that refuses its stray words
    return parser


def refuse_own_stray_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``aiayn --bogus translate …``: an option before the command is ``aiayn``'s to refuse (its parser
    would pass it on as the command's stray word, or first complain of the command's own options)."""
    for arg in argv:
        if not arg.startswith("-"):
            return  # the command: what follows is its own
        if not any(option.startswith(arg.split("=")[0]) for option in ("--help", "--version", "-h")):
            parser.error(f"unrecognized arguments: {arg}")


def main(argv: Sequence[str] | None = None) -> int:
    tune_malloc()  # before torch allocates: a step's freed blocks stay in the heap (aiayn.malloc)
    argv = sys.argv[1:] if argv is None else list(argv)
    for i, arg in enumerate(argv, start=1):  # bytes that are not UTF-8 arrive as lone surrogates
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(arg)
            print(f"aiayn: error: argument {i} ({raw!r}) is not valid UTF-8; pass text and paths as UTF-8",
                  file=sys.stderr)  # fmt: skip
            return 1
    args = None
    try:
        parser = build_parser(argv)
        refuse_own_stray_options(parser, argv)
        args, stray = parser.parse_known_args(argv)
        if stray:  # refused by the command that was given them, not by aiayn
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(stray)}")
        refuse_empty_paths(parser.commands[args.command], args)
        if isinstance(getattr(args, "device", None), str):
            from aiayn.device import resolve_device

            args.device = resolve_device(args.device)
        return args.run(args) or 0
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130
    except (AiaynError, OSError) as e:  # the user's to fix; anything else is a bug: its traceback shows
        if isinstance(e, BrokenPipeError) and e.filename is None:  # stdout's reader went away (`… | head`)
            silence_stdout()  # Python flushes stdout at exit: a second BrokenPipeError would print a notice
            return 141  # quietly, with the status (128 + SIGPIPE) a shell reports for `yes | head`'s yes
        if os.environ.get("AIAYN_DEBUG"):
            raise
        where = f"aiayn {args.command}" if args else "aiayn"
        print(f"{where}: error: {one_line(e)}", file=sys.stderr)
        return 1


PATH_METAVARS, PATH_DESTS = ("FILE", "DIR", "OUT"), ("out", "run_dir", "recipe", "dataset")


def refuse_empty_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An empty path is refused by name: it was read as "." or as stdin (``--input "$UNSET"``)."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        named = action.dest in PATH_DESTS or any(m in str(action.metavar or "") for m in PATH_METAVARS)
        if named and "" in (value if isinstance(value, list) else [value]):
            name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
            parser.error(f"{name}: the path is empty (an unset shell variable?); give a name")


def silence_stdout() -> None:
    """Point standard output's descriptor at /dev/null, so nothing more is written to a reader that has
    gone (the way Python's documentation on SIGPIPE advises)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def one_line(e: BaseException) -> str:
    """The message of ``e`` on one line (an OSError names its file, as ``open`` reports it)."""
    if isinstance(e, OSError) and e.filename is not None and not isinstance(e, AiaynError):
        text = f"{e.filename}: {e.strerror or e}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
