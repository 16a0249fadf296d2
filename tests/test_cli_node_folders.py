"""A two-node run without a shared file system: each node's folder holds its own rank's files, and every command
that reads a run reads both folders as one run (``runs`` takes both save_dirs, the others ``RUN --also DIR``).

Each rank is a real process with mindwatch's own session (tests/scripts/node_rank.py), recording into its own
node's save_dir under one run id (``MINDWATCH_RUN_ID``), as a multi-node launch does. The test chooses each value
the ranks record (``loss_of``, ``sample_ids_of``) and reads them back from what the commands print.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from mindwatch.units import format_number

RUN_ID = "run_two_nodes"
PROJECT = "dist"  # tests/scripts/node_rank.py's
STEPS = 12
NAN_AT = 7  # rank 1's loss is NaN at this step
NODE_RANK = REPO / "tests" / "scripts" / "node_rank.py"
MINDWATCH = Path(sys.executable).parent / "mindwatch"


def loss_of(rank: int, step: int) -> float:
    return round(2.0 + rank - step / 100, 4)


def sample_ids_of(rank: int, step: int) -> list[int]:
    return [1000 * rank + 10 * step + i for i in range(3)]


def start_rank(rank: int, save_dir: Path, steps: int, *flags: str, nan_at: int = -1) -> subprocess.Popen[str]:
    """Rank ``rank`` records ``steps`` steps of ``loss_of(rank, s)`` (NaN at ``nan_at``) into ``save_dir``."""
    values = [
        {"loss": math.nan if s == nan_at else loss_of(rank, s), "sample_ids": sample_ids_of(rank, s)} for s in range(1, steps + 1)
    ]
    env = {**os.environ, "MINDWATCH_RUN_ID": RUN_ID, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(NODE_RANK), str(rank), str(save_dir), json.dumps(values), *flags]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def mindwatch(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(MINDWATCH), *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Both ranks trained ``STEPS`` steps and finished; rank 1's loss was NaN at ``NAN_AT``. Rank -> its run folder."""
    out = tmp_path_factory.mktemp("finished")
    procs = [start_rank(0, out / "node0", STEPS), start_rank(1, out / "node1", STEPS, nan_at=NAN_AT)]
    for p in procs:
        printed, _ = p.communicate(timeout=120)
        assert p.returncode == 0, printed
    return {rank: out / f"node{rank}" / PROJECT / RUN_ID for rank in (0, 1)}


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Both ranks trained 5 steps, then their data source hung; killed once each rank's watchdog dumped its stacks."""
    out = tmp_path_factory.mktemp("hung")
    procs = [start_rank(rank, out / f"node{rank}", 5, "--hang") for rank in (0, 1)]
    dirs = {rank: out / f"node{rank}" / PROJECT / RUN_ID for rank in (0, 1)}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(dumps(dirs[r], r) for r in (0, 1)):
            assert all(p.poll() is None for p in procs), "a rank ended instead of hanging"
            time.sleep(0.1)
        time.sleep(0.5)  # the stall alert and status follow the dump
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)  # as a launcher ends a hung job
            p.wait(30)
    assert all(dumps(dirs[r], r) for r in (0, 1)), "each rank's watchdog dumps its stacks into its own node's folder"
    return dirs


def dumps(run_dir: Path, rank: int) -> list[Path]:
    return [p for p in (run_dir / "stacks").glob(f"stall_rank{rank}_*.txt") if not p.name.endswith(".faulthandler.txt")]


# -- the files as a real two-node run leaves them -----------------------------------------------------------------


def test_each_node_folder_holds_only_its_own_ranks_files(finished: dict[int, Path]) -> None:
    assert (finished[0] / "metrics.rank0.jsonl").exists() and not (finished[0] / "metrics.rank1.jsonl").exists()
    assert (finished[1] / "metrics.rank1.jsonl").exists() and not (finished[1] / "metrics.rank0.jsonl").exists()
    assert (finished[0] / "meta.json").exists() and not (finished[1] / "meta.json").exists()


# -- runs ----------------------------------------------------------------------------------------------------------


def test_runs_over_both_save_dirs_lists_the_run_once_with_both_ranks(finished: dict[int, Path]) -> None:
    save_dirs = [finished[r].parent.parent for r in (0, 1)]
    proc = mindwatch("runs", *save_dirs, "--json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["run_id"], row["project"], row["ranks"], row["world_size"]) == (RUN_ID, PROJECT, [0, 1], 2)
    assert row["last_step"] == STEPS and row["state"] == "finished"
    assert row["alert_count"] >= 1  # rank 1's NaN, in node 1's alerts.jsonl

    alone = json.loads(mindwatch("runs", save_dirs[0], "--json").stdout)
    assert [r["ranks"] for r in alone] == [[0]]  # node 0's folder alone knows rank 0 only

    table = mindwatch("runs", *save_dirs)
    assert table.returncode == 0
    assert [line for line in table.stdout.splitlines() if RUN_ID in line] != []
    assert sum(line.count(RUN_ID) for line in table.stdout.splitlines()) == 1, table.stdout


# -- tail ----------------------------------------------------------------------------------------------------------


def test_tail_with_also_shows_rank_1_from_node_1s_folder(finished: dict[int, Path]) -> None:
    proc = mindwatch("tail", finished[0], "--also", finished[1], "--once", "--rank", "1")
    assert proc.returncode == 0, proc.stderr
    assert "ranks 0, 1 (showing 1)" in proc.stdout
    loss_row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("loss "))
    last, low, high = loss_row.split()[1:4]
    finite = [loss_of(1, s) for s in range(1, STEPS + 1) if s != NAN_AT]
    assert last == format_number(loss_of(1, STEPS))
    assert (low, high) == (format_number(min(finite)), format_number(max(finite)))
    assert "nonfinite" in proc.stdout  # rank 1's alert, from node 1's alerts.jsonl

    follow = mindwatch("tail", finished[0], "--also", finished[1], "--rank", "1", "--interval", "0.1")
    assert follow.returncode == 0, follow.stderr
    assert f"step {STEPS} finished | loss {format_number(loss_of(1, STEPS))}" in follow.stdout
    assert f"ALERT [nonfinite] rank 1 step {NAN_AT}:" in follow.stdout
    assert f"run ended: finished at step {STEPS}" in follow.stdout


# -- export --------------------------------------------------------------------------------------------------------


def test_export_with_also_writes_every_ranks_rows(finished: dict[int, Path], tmp_path: Path) -> None:
    out = tmp_path / "both.csv"
    proc = mindwatch("export", finished[0], "--also", finished[1], "-o", out)
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["step"]), int(r["rank"])) for r in rows] == [(s, r) for s in range(1, STEPS + 1) for r in (0, 1)]
    for row in rows:
        step, rank = int(row["step"]), int(row["rank"])
        if (rank, step) == (1, NAN_AT):
            assert row["loss"] == "nan"
        else:
            assert math.isclose(float(row["loss"]), loss_of(rank, step)), row

    tensorboard = mindwatch("export", finished[0], "--also", finished[1], "--tensorboard")
    assert tensorboard.returncode == 2 and "each node's folder" in tensorboard.stderr


# -- batches -------------------------------------------------------------------------------------------------------


def test_batches_with_also_lists_rank_1s_nan_batch(finished: dict[int, Path]) -> None:
    alone = mindwatch("batches", finished[0])
    assert alone.returncode == 0 and alone.stdout.strip() == "no step was flagged"  # rank 0's folder: no anomaly

    proc = mindwatch("batches", finished[0], "--also", finished[1])
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split()[:4] == ["step", "rank", "epoch", "batch"]
    (row,) = rows
    step, rank, epoch, batch, *rest = row.split()
    assert (int(step), int(rank), int(epoch), int(batch)) == (NAN_AT, 1, 1, NAN_AT - 1)
    assert " ".join(rest) == "nonfinite on loss " + ", ".join(map(str, sample_ids_of(1, NAN_AT)))


def test_also_must_name_the_runs_own_folder_not_a_save_dir(finished: dict[int, Path]) -> None:
    save_dir = finished[1].parent.parent
    for command in ("batches", "hang", "export", "tail", "check", "report"):
        proc = mindwatch(command, finished[0], "--also", save_dir)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert f"--also {save_dir} is not a run directory" in proc.stderr, proc.stderr


# -- hang ----------------------------------------------------------------------------------------------------------


def test_hang_over_node_0_alone_names_rank_1s_dump_as_not_found_and_gives_no_verdict(hung: dict[int, Path]) -> None:
    proc = mindwatch("hang", hung[0])
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert lines[0] == "no verdict: no stack dump found for rank 1, whose files are not in the folders read"
    assert lines[1].startswith("rank 0: in Python code outside the training step") and "in next_batch" in lines[1]
    assert lines[2] == "rank 1: no stack dump found (none of its files is in the folders read)"
    assert "culprit" not in proc.stdout and "no rank is inside the training step" not in proc.stdout
    assert "--also" in proc.stderr

    other = mindwatch("hang", hung[1])  # node 1's folder alone: no meta.json, rank 0 is the one not found
    assert other.returncode == 2
    assert other.stdout.splitlines()[0] == "no verdict: no stack dump found for rank 0, whose files are not in the folders read"


def test_hang_over_both_folders_reads_every_ranks_dump(hung: dict[int, Path]) -> None:
    proc = mindwatch("hang", hung[0], "--also", hung[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict, *ranks = proc.stdout.splitlines()
    assert verdict == "no rank is inside the training step: each one is stuck on its own"  # both wait for their data
    assert [line.split(":")[0] for line in ranks] == ["rank 0", "rank 1"]
    for line in ranks:
        assert "in Python code outside the training step" in line and "in next_batch" in line
    assert proc.stderr == ""


# -- a real hang under msrun: rank 1's data pipeline blocks, rank 0 waits in the gradient AllReduce ------------------

BLOCK_RANK_1 = ("--block-rank", "1", "--block-at", "10")


def dumped(project_dir: Path, rank: int) -> bool:
    """Whether rank ``rank`` dumped its stacks into its run's folder under ``project_dir``."""
    return any(dumps(d, rank) for d in project_dir.glob("*/"))


@pytest.mark.slow
def test_hang_over_both_node_folders_of_a_real_msrun_names_the_blocked_rank(tmp_path: Path) -> None:
    """Each rank records under its own save_dir (``--save-dir-per-rank``); rank 1's data source blocks at batch 10. The
    diagnosis reads node 0's folder alone (rank 1's dump came over the lifeline) and both folders alike."""
    from test_distributed import Launch, msrun, only_run_dir

    job, out = Launch(), tmp_path / "out"
    try:
        msrun(job, tmp_path / "logs", "--save-dir", str(out), "--save-dir-per-rank", *("--steps", "40"), *BLOCK_RANK_1)
        # MindSpore's CPU AllReduce gives up after 30 s; both watchdogs (4 s) dump before that
        deadline = time.monotonic() + 240
        in_place = lambda: all(dumped(out / f"rank{r}" / "dist", r) for r in (0, 1)) and dumped(out / "rank0" / "dist", 1)  # noqa: E731
        while time.monotonic() < deadline and not in_place():
            job.remember_children()
            time.sleep(0.5)
    finally:
        job.kill()
    dirs = {rank: only_run_dir(out / f"rank{rank}" / "dist") for rank in (0, 1)}
    assert dirs[0].name == dirs[1].name and all(dumps(dirs[r], r) for r in (0, 1)), f"logs in {tmp_path / 'logs'}"

    # rank 1's stall dump travelled to rank 0 over the lifeline: node 0's folder alone holds both dumps
    assert dumps(dirs[0], 1), "rank 1's dump is in rank 0's folder too"
    for args in ((dirs[0],), (dirs[0], "--also", dirs[1])):
        said = mindwatch("hang", *args)
        assert said.returncode == 0, said.stdout + said.stderr
        verdict, rank0, rank1 = said.stdout.splitlines()[:3]
        assert verdict == "likely culprit: rank 1, which the others wait for"
        assert rank0.startswith("rank 0: inside the training step")
        assert rank1.startswith("rank 1: waiting for its data pipeline") and "train_dp.py" in rank1  # where it blocks


def test_the_trainings_own_code_in_a_folder_named_mindwatch_is_named_as_where_a_rank_waits(tmp_path: Path) -> None:
    """A project (or this repository's checkout) in a folder called mindwatch is the training's code, not mindwatch's."""
    script = tmp_path / "mindwatch" / "train.py"
    script.parent.mkdir()
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from mindwatch.monitor.watchdog import dump_stacks\n"
        "def wait_for_data():\n"
        "    dump_stacks(Path(sys.argv[1]) / 'stacks', 'stall_rank0_1')\n"
        "wait_for_data()\n"
    )
    run_dir = tmp_path / "run"
    subprocess.run(
        [sys.executable, str(script), str(run_dir)], check=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    proc = mindwatch("hang", run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0: in Python code outside the training step: main thread at train.py:5 in wait_for_data" in proc.stdout
