"""The ``mindwatch`` command: ``demo | serve | report | check | export | runs | tail | hang | batches | stop | checkpoint |
lr | set | rewind | batch``.

Each subcommand registers its arguments here and imports its implementation lazily,
so ``mindwatch check`` never pays for MindSpore or the web stack.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def _demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small Transformer on CPU with the monitor on")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--mode", choices=["graph", "pynative"], default="graph", help="MindSpore execution mode")
    p.add_argument("--save-dir", default="./monitor_output", help="where run directories go")
    p.add_argument("--project", default="demo", help="project the run goes under (default demo)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between console summaries")
    p.add_argument(
        "--moe", action="store_true", help="each block's feed-forward a top-2-of-4 mixture of experts (routing statistics)"
    )
    p.add_argument("--no-dashboard", action="store_true", help="do not start the live dashboard beside the training")
    p.add_argument("--port", type=int, default=8765, help="dashboard port (default 8765; a free one if taken)")
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop the dashboard when training ends (the default in a terminal is to keep it until Ctrl-C)",
    )

    def run(args: argparse.Namespace) -> int:
        from mindwatch.demo.run import run_demo

        return run_demo(args)

    p.set_defaults(func=run)


def _serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="the live dashboard for the runs under LOGDIR")
    p.add_argument(
        "logdir",
        metavar="LOGDIR",
        nargs="+",
        help="a save_dir (or a project or run directory under it); several: each node's save_dir, a run in several read as one",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; others need --token)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    p.add_argument("--token", default=None, help="require this token (default: $MINDWATCH_TOKEN); needed off loopback")
    p.add_argument(
        "--no-cache", action="store_true", help="do not keep long runs' columns in ~/.cache/mindwatch (or $MINDWATCH_CACHE_DIR)"
    )
    _allow_control(p)

    def run(args: argparse.Namespace) -> int:
        import os

        from mindwatch.serve.app import serve

        token = args.token or os.environ.get("MINDWATCH_TOKEN")
        return serve(
            args.logdir, host=args.host, port=args.port, token=token, cache=not args.no_cache, allow_control=args.allow_control
        )

    p.set_defaults(func=run)


def _allow_control(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-control",
        action="store_true",
        help=(
            "the run page gets stop / checkpoint / lr / batch size buttons "
            "(needs the token; one is made up and printed if none is set)"
        ),
    )


def _report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="a self-contained HTML (or PDF) report of a run, optionally compared with others")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--compare", nargs="+", default=[], metavar="RUN", help="other runs drawn on the same charts")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    p.add_argument("--pdf", action="store_true", help="also print it to a PDF next to the HTML (headless Chromium)")
    _also_option(p)

    def run(args: argparse.Namespace) -> int:
        from mindwatch.report.html import write_report
        from mindwatch.store.reader import open_run

        if not _also_are_runs("report", args.also):
            return 2
        try:
            first = open_run(args.run, *args.also) if args.also else args.run
            written = write_report([first, *args.compare], args.output, pdf=args.pdf)
        except (FileNotFoundError, RuntimeError) as e:
            print(f"mindwatch report: {e}", file=sys.stderr)
            return 2
        for path in written:
            print(f"mindwatch report: wrote {path}")
        return 0

    p.set_defaults(func=run)


def _check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="CI gate: evaluate rules on a run; exit 0 all pass, 1 any fails, 2 a bad rule")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--rule", action="append", default=[], help='e.g. "max(grad_norm, last=100) < 1e5" (repeatable)')
    p.add_argument("--rules-file", help="YAML list (or checks: list) or one rule per line")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    _also_option(p)

    def run(args: argparse.Namespace) -> int:
        from mindwatch.checks.evaluate import check_command

        if not _also_are_runs("check", args.also):
            return 2
        return check_command(args.run, args.rule, args.rules_file, as_json=args.json, also=args.also)

    p.set_defaults(func=run)


def _export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="a run's metrics as one table (csv, jsonl, parquet) or TensorBoard event files")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--format", choices=["csv", "jsonl", "parquet"], default="csv", help="table format (default csv)")
    p.add_argument("--tensorboard", action="store_true", help="write TensorBoard event files instead of a table")
    p.add_argument("--overwrite", action="store_true", help="with --tensorboard: replace existing event files")
    p.add_argument("-o", "--output", default=None, help="file (folder for --tensorboard); default inside the run directory")
    _also_option(p)

    def run(args: argparse.Namespace) -> int:
        from mindwatch.store.catalog import find_runs
        from mindwatch.store.layout import is_run_dir

        folder = Path(args.run)
        if folder.is_dir() and not is_run_dir(folder):  # a save_dir or a project folder: say which runs it holds
            inside = [p.relative_to(folder).as_posix() for p in find_runs(folder)]
            shown = ", ".join(inside[:8]) + (f" and {len(inside) - 8} more" if len(inside) > 8 else "")
            hint = f"the runs inside: {shown}; pass one of them" if inside else "it holds no run"
            print(f"mindwatch export: {folder} is not a run directory ({hint})", file=sys.stderr)
            return 2
        if not _also_are_runs("export", args.also):
            return 2
        if args.tensorboard and args.also:
            print(
                "mindwatch export: --tensorboard reads one folder: export each node's folder on its own into one "
                "output folder (mindwatch export DIR --tensorboard -o OUT); each writes its own ranks",
                file=sys.stderr,
            )
            return 2
        try:
            if args.tensorboard:
                from mindwatch.sinks.tensorboard import export_tensorboard

                out = export_tensorboard(args.run, args.output, overwrite=args.overwrite)
                print(f"mindwatch export: wrote TensorBoard event files under {out} (tensorboard --logdir {out})")
            else:
                from mindwatch.report.export import export_run

                print(f"mindwatch export: wrote {export_run(args.run, args.format, args.output, also=args.also)}")
        except (FileNotFoundError, FileExistsError) as e:
            print(f"mindwatch export: {e}", file=sys.stderr)
            return 2
        return 0

    p.set_defaults(func=run)


def _runs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the runs under LOGDIR with state, steps, duration and tags")
    p.add_argument(
        "logdir",
        metavar="LOGDIR",
        nargs="+",
        help="a save_dir (or a project directory); several: each node's save_dir, a run in several read as one",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def run(args: argparse.Namespace) -> int:
        from mindwatch.terminal.runs import print_runs

        return print_runs(*args.logdir, as_json=args.json)

    p.set_defaults(func=run)


def _tail(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tail", help="follow a run in the terminal until it ends (Ctrl-C to leave)")
    p.add_argument("run", metavar="RUN", help="run directory, or a log directory (its newest run)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between reads (default 0.5)")
    p.add_argument("--rank", type=int, default=None, help="rank to show (default: the lowest)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    _also_option(p)

    def run(args: argparse.Namespace) -> int:
        from mindwatch.terminal.tail import tail

        if not _also_are_runs("tail", args.also):
            return 2
        try:
            return tail(args.run, also=args.also, interval=args.interval, rank=args.rank, once=args.once)
        except FileNotFoundError as e:
            print(f"mindwatch tail: {e}", file=sys.stderr)
            return 2

    p.set_defaults(func=run)


def _hang(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hang", help="say which rank a stalled distributed run waits for, from the ranks' stack dumps")
    p.add_argument("run", metavar="RUN", help="run directory with stacks/stall_rank<R>_*.txt dumps")
    _also_option(p)

    def run(args: argparse.Namespace) -> int:
        from mindwatch.alerts.hang import diagnose_run

        if not _also_are_runs("hang", args.also):
            return 2
        d = diagnose_run(args.run, also=args.also)
        if not d.places:
            where = ", ".join(f"{folder}/stacks" for folder in (args.run, *args.also))
            print(f"mindwatch hang: no stall stack dumps in {where}", file=sys.stderr)
            return 2
        print("\n".join(d.lines))
        if d.not_found:  # their node's folder was not given: no verdict without them
            print(
                f"mindwatch hang: give the run's folder on the node of rank {', '.join(map(str, d.not_found))} too "
                f"(mindwatch hang {args.run} --also DIR)",
                file=sys.stderr,
            )
            return 2
        return 0

    p.set_defaults(func=run)


def _batches(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batches", help="list the steps an anomaly alert named, with their epoch, batch index and sample ids")
    p.add_argument("run", metavar="RUN", help="run directory")
    _also_option(p)

    def run(args: argparse.Namespace) -> int:
        from mindwatch.analysis.batches import flagged_batches, ids_text
        from mindwatch.store.jsonl import record_at
        from mindwatch.store.reader import open_run

        if not _also_are_runs("batches", args.also):
            return 2
        try:
            run_ = open_run(args.run, *args.also)
            flagged = flagged_batches(run_.alerts, lambda rank, step: record_at(run_.layout.metrics(rank), step))
        except (FileNotFoundError, ValueError) as e:
            print(f"mindwatch batches: {e}", file=sys.stderr)
            return 2
        if not flagged:
            print("no step was flagged")
            return 0
        print(f"{'step':>8} {'rank':>4} {'epoch':>5} {'batch':>6}  {'alerts':<28} sample ids")
        for b in flagged:
            epoch, batch = ("" if v is None else v for v in (b.epoch, b.batch))
            ids = ids_text(b.sample_ids) or (b.note or "")
            print(f"{b.step:>8} {b.rank:>4} {epoch!s:>5} {batch!s:>6}  {', '.join(b.rules):<28} {ids}")
        return 0

    p.set_defaults(func=run)


def _requests(sub: argparse._SubParsersAction) -> None:
    """``stop``, ``checkpoint``, ``lr``, ``set``, ``rewind``, ``batch``, ``profile``: a person's requests to a live run
    (``store/requests.py``)."""
    helps = {
        "stop": "stop a live run at its next step boundary (every rank at one step); it ends stopped with your reason",
        "checkpoint": "save a checkpoint of a live run into its checkpoints/ at the next step boundary",
        "lr": "multiply a live run's learning rate by --factor from its next step",
        "set": "change a setting of a live run from its next step: layers.every, layers.histogram_every, alerts.<rule>.enabled",
        "rewind": "rewind a live run to its newest snapshot (monitor_config.rewind) and pass over the next rewind.skip batches",
        "batch": "set a live run's batch size (its DynamicBatch, within its min and max) from the first batch not made yet",
        "profile": "profile a live run's next steps with MindSpore's profiler, on every rank at one step (profiles/step_S/)",
    }
    for action, text in helps.items():
        p = sub.add_parser(action, help=text)
        p.add_argument("run", metavar="RUN", help="run directory of a running training")
        if action == "lr":
            p.add_argument("--factor", type=float, required=True, help="multiply the learning rate by this (e.g. 0.5)")
        if action == "set":
            p.add_argument("setting", metavar="KEY=VALUE", help="e.g. layers.every=1 or alerts.spike.enabled=false")
        if action == "rewind":
            p.add_argument("--to", type=int, default=None, metavar="STEP", help="to the newest snapshot at or before STEP")
        if action == "batch":
            p.add_argument("size", metavar="SIZE", help="the new batch size, e.g. 64")
        if action == "profile":
            p.add_argument("--steps", type=int, default=None, help="steps to profile (default: the run's profile.steps, 5)")
        p.add_argument("--reason", default=None, help="why (goes into the alert, the final status and the report)")
        p.add_argument(
            "--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to SECONDS for the training to take it"
        )
        p.set_defaults(func=lambda args, action=action: _file_request(action, args))


def _file_request(action: str, args: argparse.Namespace) -> int:
    from mindwatch.store.requests import RequestError, file_request, wait_answer

    key = value = None
    if action == "set":
        key, sep, value = args.setting.partition("=")
        if not sep:
            print(f"mindwatch set: give KEY=VALUE, not {args.setting!r}", file=sys.stderr)
            return 2
    try:
        req = file_request(
            args.run,
            action,
            reason=args.reason,
            factor=getattr(args, "factor", None),
            key=key.strip() if key else None,
            value=value,
            to_step=getattr(args, "to", None),
            size=getattr(args, "size", None),
            steps=getattr(args, "steps", None),
        )
    except (RequestError, OSError) as e:
        print(f"mindwatch {action}: {e}", file=sys.stderr)
        return 2
    print(f"mindwatch {action}: filed request {req['id']} for {args.run} (as {req['requested_by']})")
    if args.wait <= 0:
        return 0
    answer = wait_answer(args.run, req["id"], args.wait) or {}
    state = answer.get("state")
    if state == "taken":
        print(f"mindwatch {action}: taken at step {answer.get('step')}: {answer.get('message')}")
    elif state == "failed":
        print(f"mindwatch {action}: failed: {answer.get('error') or answer.get('message')}", file=sys.stderr)
        return 1
    elif state == "filed":
        print(f"mindwatch {action}: filed by the training after step {answer.get('step')}, not yet carried out")
    else:
        print(f"mindwatch {action}: no answer from the training within {args.wait:g} s")
    return 0


def _notes(sub: argparse._SubParsersAction) -> None:
    """``rename`` and ``note``: a person's display name and note for a run (``store/notes.py``)."""
    for command, field, meta, text in (
        ("rename", "name", "NAME", "give a run a display name (runs table, run page, report, mindwatch runs); its id stays"),
        ("note", "note", "TEXT", "write a note on a run, shown with it on the dashboard, in the report and mindwatch runs"),
    ):
        p = sub.add_parser(command, help=text)
        p.add_argument("run", metavar="RUN", help="run directory")
        p.add_argument(field, metavar=meta, help=f'the {field}; "" removes it')
        p.set_defaults(func=lambda args, command=command, field=field: _write_notes(command, field, args))


def _write_notes(command: str, field: str, args: argparse.Namespace) -> int:
    from mindwatch.store.notes import write_notes
    from mindwatch.store.requests import requester

    try:
        write_notes(args.run, **{field: getattr(args, field)}, by=requester())
    except (ValueError, OSError) as e:
        print(f"mindwatch {command}: {e}", file=sys.stderr)
        return 2
    value = getattr(args, field).strip()
    print(f"mindwatch {command}: {args.run}: {field} {value!r}" if value else f"mindwatch {command}: {args.run}: {field} removed")
    return 0


#: Each entry adds one subcommand. Keep one function per subcommand.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _demo,
    _serve,
    _report,
    _check,
    _export,
    _runs,
    _tail,
    _hang,
    _batches,
    _requests,
    _notes,
]


def build_parser() -> argparse.ArgumentParser:
    from mindwatch import __version__

    parser = argparse.ArgumentParser(prog="mindwatch", description="Live monitor for MindSpore training.")
    parser.add_argument("--version", action="version", version=f"mindwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _also_option(p: argparse.ArgumentParser) -> None:
    """``--also DIR``: the run's folder on another node (a multi-node job without a shared file system), read with
    RUN as one run (:func:`mindwatch.store.reader.open_run`)."""
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="DIR",
        help="another folder of the same run: its ranks on another node's save_dir (repeatable)",
    )


def _also_are_runs(command: str, also: Sequence[str]) -> bool:
    """Whether every ``--also`` folder is a run directory; says which is not otherwise (a save_dir given for a run's)."""
    from mindwatch.store.layout import is_run_dir

    for folder in map(Path, also):
        if not is_run_dir(folder):
            what = "no folder" if not folder.is_dir() else "not a run directory"
            print(
                f"mindwatch {command}: --also {folder} is {what}: give the run's folder on that node, "
                "<save_dir>/<project>/<run_id>",
                file=sys.stderr,
            )
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
