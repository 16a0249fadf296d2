"""One rank of a two-node run without a shared file system: it records into its own node's save_dir.

Run by tests/test_cli_node_folders.py::

    MINDWATCH_RUN_ID=run_two_nodes python tests/scripts/node_rank.py RANK SAVE_DIR STEPS_JSON [--hang]

What the MindSpore adapter does at each step end, without MindSpore: a record to the session's Monitor and a
beat to its stall watchdog. ``STEPS_JSON`` holds one ``{"loss": .., "sample_ids": [..]}`` a step (``NaN`` allowed):
the record of step ``s`` holds them, epoch 1 and the batch index ``s - 1``. After the last step the run ends
``finished``; with ``--hang`` the data source never answers instead (``next_batch``), the watchdog dumps the
stacks, and the process waits to be killed.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from mindwatch.config import load_config
from mindwatch.session import RunSession

WORLD_SIZE = 2


def next_batch(never: threading.Event) -> None:
    """A data source that never answers (a hung reader of a network file system)."""
    never.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rank", type=int)
    p.add_argument("save_dir")
    p.add_argument("steps", type=json.loads)
    p.add_argument("--hang", action="store_true")
    args = p.parse_args()
    config = load_config(
        {
            "project": "dist",
            "save_dir": args.save_dir,
            "flush_secs": 0.1,
            "interval": 60,
            "alerts": {"stall_timeout": 1.0},
            "distributed": {"hang": {"wait": 60.0}},  # rank 0's own live diagnosis stays out of this test's way
        }
    )
    session = RunSession.start(config, rank=args.rank, world_size=WORLD_SIZE)
    watchdog = session.watchdog
    assert watchdog is not None
    for step, values in enumerate(args.steps, start=1):
        rec = {"step": step, "epoch": 1, "batch": step - 1, "t": time.time(), "rank": args.rank, "step_time": 0.05}
        session.monitor.record({**rec, "loss": values["loss"], "sample_ids": values["sample_ids"]})
        watchdog.last_beat = time.perf_counter()
        time.sleep(0.02)
    if args.hang:
        print(f"node_rank: rank {args.rank} waits for data, run dir {session.run_dir}", flush=True)
        next_batch(threading.Event())
    session.close("finished")
    print(f"node_rank: rank {args.rank} finished, run dir {session.run_dir}", flush=True)


if __name__ == "__main__":
    main()
