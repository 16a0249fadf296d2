"""The ``mindwatch`` command: ``demo | serve | report | check | export | runs | tail``.

Each subcommand registers its arguments here and imports its implementation lazily,
so ``mindwatch check`` never pays for MindSpore or the web stack.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small Transformer on CPU with the monitor on")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--mode", choices=["graph", "pynative"], default="graph", help="MindSpore execution mode")
    p.add_argument("--save-dir", default="./monitor_output", help="where run directories go")
    p.add_argument("--project", default="demo")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between console summaries")

    def run(args: argparse.Namespace) -> int:
        from mindwatch.demo.run import run_demo

        return run_demo(args)

    p.set_defaults(func=run)


#: Each entry adds one subcommand. Keep one function per subcommand.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_demo]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindwatch", description="Live monitor for MindSpore training.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
