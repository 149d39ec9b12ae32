"""``aiayn``: entry point. Each subcommand module has ``add_parser(subparsers)`` and ``run(args)``.

Anything the user got wrong (a missing file, a bad option, a corrupt checkpoint) is reported as one
line on stderr with a non-zero exit; set ``AIAYN_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from aiayn.cli import attention, average, demo, evaluate, export, generate, plot, train, translate
from aiayn.version import __version__

COMMANDS = [train, translate, evaluate, generate, attention, average, plot, export, demo]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need', from scratch.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as e:
        if os.environ.get("AIAYN_DEBUG"):
            raise
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
