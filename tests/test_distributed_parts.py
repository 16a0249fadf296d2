"""The parts of distributed monitoring that need no launcher: rank discovery, run-id agreement between
real processes, the cross-rank band, the straggler rule and rank 0's cross-rank watch over real rank files."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mindwatch.alerts.alert import make_alert
from mindwatch.alerts.crossrank import CrossRankWatch, WatchedRun
from mindwatch.alerts.rank_bands import RankBands
from mindwatch.alerts.source_rank import SourceRank
from mindwatch.alerts.straggler import StragglerRule
from mindwatch.analysis.bands import band_of
from mindwatch.analysis.batches import flagged_batches
from mindwatch.config import load_config
from mindwatch.mindspore import ranks
from mindwatch.mindspore.ranks import RankError, discover
from mindwatch.monitor.role import RankRole
from mindwatch.monitor.watchdog import dump_stacks
from mindwatch.session import RunSession
from mindwatch.store.bandfiles import read_band_file
from mindwatch.store.jsonl import record_at
from mindwatch.store.layout import RunLayout
from mindwatch.store.reader import Series
from mindwatch.store.rendezvous import RUN_ID_ENV, RendezvousTimeout, agree_run_id, rendezvous_path
from mindwatch.store.tails import StepAligner
from mindwatch.store.writer import RunWriter

REPO = Path(__file__).resolve().parent.parent

MSRUN_ENV = {
    "RANK_ID": "1",
    "RANK_SIZE": "2",
    "MS_WORKER_NUM": "2",
    "MS_ROLE": "MS_WORKER",
    "MS_NODE_ID": "1",
    "MS_SCHED_HOST": "127.0.0.1",
    "MS_SCHED_PORT": "8118",
    "MS_TOPO_TIMEOUT": "600",
    "DEVICE_ID": "1",
}


# -- rank discovery -------------------------------------------------------------------------------------


def test_discover_under_msrun_environment() -> None:
    who = discover(MSRUN_ENV, use_communication=False)
    assert (who.rank, who.world_size, who.launcher, who.scheduler) == (1, 2, "msrun", "127.0.0.1:8118")
    assert who.launch_key == "127.0.0.1_8118_w2"


def test_discover_under_a_manual_dynamic_cluster_launch() -> None:
    env = {"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "4", "MS_NODE_ID": "3", "MS_SCHED_HOST": "10.0.0.5", "MS_SCHED_PORT": "9000"}
    who = discover(env, use_communication=False)
    assert (who.rank, who.world_size, who.launcher) == (3, 4, "dynamic-cluster")
    assert who.launch_key == "10.0.0.5_9000_w4"
    sched = discover({**env, "MS_ROLE": "MS_SCHED"}, use_communication=False)
    assert sched.role == "MS_SCHED" and sched.rank == 0


def test_discover_alone_and_from_generic_variables() -> None:
    alone = discover({})  # the real default path: MindSpore's communication is not initialised in this process
    assert (alone.rank, alone.world_size, alone.launcher, alone.launch_key) == (0, 1, "single", None)
    assert alone.as_meta()["world_size"] == 1
    generic = discover({"RANK": "2", "WORLD_SIZE": "4"}, use_communication=False)
    assert (generic.rank, generic.world_size, generic.launcher) == (2, 4, "env")
    assert discover({"RANK_ID": "", "RANK": "1", "WORLD_SIZE": "2"}, use_communication=False).rank == 1  # empty: unset


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({**MSRUN_ENV, "RANK_ID": "5"}, "RANK_ID=5 is not a rank of MS_WORKER_NUM=2"),
        ({"RANK_ID": "-1", "RANK_SIZE": "2"}, "RANK_ID=-1 is not a rank of RANK_SIZE=2"),
        ({"RANK": "2"}, "RANK=2 names a rank, but none of MS_WORKER_NUM, RANK_SIZE, WORLD_SIZE says"),
        ({**MSRUN_ENV, "RANK_ID": "abc"}, "RANK_ID='abc' is not a number"),
        ({"RANK": "1", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a number"),
        ({**MSRUN_ENV, "MS_WORKER_NUM": "0"}, "MS_WORKER_NUM=0 is not a number of processes"),
    ],
)
def test_a_rank_the_environment_cannot_mean_stops_the_start_and_says_what_it_read(environ: dict[str, str], said: str) -> None:
    with pytest.raises(RankError) as raised:
        discover(environ, use_communication=False)
    message = str(raised.value)
    assert message.startswith(said)
    for key in ("RANK_ID", "RANK", "MS_NODE_ID", "MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE"):
        assert re.search(rf"\b{key}(=| unset)", message), f"{key} missing from: {message}"
    assert ": set " in message  # and what to do


def test_a_worker_named_not_numbered_is_no_error() -> None:
    named = {"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "2", "MS_NODE_ID": "worker-a"}  # MindSpore allows any string
    assert discover(named, use_communication=False).world_size == 2


def test_communication_that_fails_once_initialised_is_told_once_and_the_environment_answers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mindspore.communication import management

    def broken() -> int:
        raise RuntimeError("the world group is gone")

    monkeypatch.setattr(management.GlobalComm, "INITED", True)
    monkeypatch.setattr(management, "get_rank", broken)
    monkeypatch.setattr(ranks, "_told_communication_failed", False)
    with caplog.at_level(logging.WARNING, "mindwatch"):
        first, second = discover(MSRUN_ENV), discover(MSRUN_ENV)
    assert (first.rank, first.world_size) == (second.rank, second.world_size) == (1, 2)
    (told,) = [r.getMessage() for r in caplog.records]
    assert "get_rank()/get_group_size() failed" in told and "the world group is gone" in told


def test_no_mindspore_and_communication_not_initialised_are_quiet(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ranks, "_told_communication_failed", False)
    with caplog.at_level(logging.DEBUG, "mindwatch"):
        assert discover(MSRUN_ENV).rank == 1  # this process never ran init()
        monkeypatch.setitem(sys.modules, "mindspore.communication.management", None)  # as if MindSpore were absent
        assert discover(MSRUN_ENV).rank == 1
    assert not caplog.records


# -- run-id agreement -------------------------------------------------------------------------------------

_JOIN = """
import sys, time
from mindwatch.config import load_config
from mindwatch.session import RunSession
from mindwatch.store.bandfiles import read_band_file
from mindwatch.store.layout import RunLayout
rank, key, save = int(sys.argv[1]), sys.argv[2], sys.argv[3]
time.sleep(0.8 if rank == 0 else 0.0)   # rank 0 comes last: the others must wait for it
s = RunSession.start(load_config({"project": "p", "save_dir": save, "alerts": {"enabled": False}}),
                     rank=rank, world_size=4, launch_key=key)
s.close()
print(s.run_dir.name)
"""


def test_four_processes_agree_on_one_run_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != RUN_ID_ENV}
    env["PYTHONPATH"] = str(REPO)
    (tmp_path / "p").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOIN, str(r), "h_1234_w4", str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
        )
        for r in (3, 2, 1, 0)
    ]
    names = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(names) == 1, names
    run_dir = tmp_path / "p" / names.pop()
    assert sorted(p.name for p in run_dir.glob("status.rank*.json")) == [f"status.rank{r}.json" for r in range(4)]
    assert json.loads((run_dir / "meta.json").read_text())["world_size"] == 4


def test_a_stale_rendezvous_file_is_not_joined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    path = rendezvous_path(tmp_path, "k")
    path.parent.mkdir(parents=True)
    (tmp_path / "run_old").mkdir()
    path.write_text(json.dumps({"run_id": "run_old", "written_at": time.time() - 3600}))
    with pytest.raises(RendezvousTimeout, match="rank 1 waited"):
        agree_run_id(tmp_path, rank=1, key="k", propose=lambda: "never", timeout=0.3)

    got: list[str] = []
    joiner = threading.Thread(target=lambda: got.append(agree_run_id(tmp_path, rank=1, key="k", propose=lambda: "x", timeout=10)))
    joiner.start()
    time.sleep(0.3)
    assert agree_run_id(tmp_path, rank=0, key="k", propose=lambda: "run_new") == "run_new"
    joiner.join(10)
    assert got == ["run_new"]


def test_a_rank_that_cannot_agree_records_into_its_own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    cfg = load_config({"project": "p", "save_dir": str(tmp_path), "run_name": "r", "distributed": {"rendezvous_timeout": 0.2}})
    s = RunSession.start(cfg, rank=1, world_size=2, launch_key="nobody_w2")
    s.close()
    assert re.fullmatch(r"r_\d{8}_\d{6}_rank1", s.run_dir.name), s.run_dir.name  # stamped: a rerun never appends to it
    assert (s.run_dir / "status.rank1.json").exists()


def test_run_id_from_the_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_ID_ENV, "fixed_run")
    cfg = load_config({"project": "p", "save_dir": str(tmp_path), "alerts": {"enabled": False}})
    sessions = [RunSession.start(cfg, rank=r, world_size=2, launch_key="k_w2") for r in (1, 0)]
    for s in sessions:
        s.close()
    assert {s.run_dir.name for s in sessions} == {"fixed_run"}
    assert not (tmp_path / "p" / ".rendezvous").exists()


# -- the cross-rank band ------------------------------------------------------------------------------------


def _series(steps: list[int], values: list[float]) -> Series:
    return Series(np.asarray(steps, np.int64), np.asarray(values, np.float64), np.zeros(len(steps)))


def test_band_over_ranks_with_gaps_and_nan() -> None:
    b = band_of("loss", {0: _series([1, 2, 3], [1.0, 2.0, math.nan]), 2: _series([1, 2], [3.0, 1.0])})
    assert b.ranks == [0, 2] and b.step.tolist() == [1, 2, 3]
    assert b.min[:2].tolist() == [1.0, 1.0] and math.isnan(b.min[2]) and math.isnan(b.max[2])
    assert b.max[:2].tolist() == [3.0, 2.0] and b.mean[:2].tolist() == [2.0, 1.5]
    assert b.argmax.tolist() == [2, 0, -1] and b.argmin.tolist() == [0, 2, -1]
    assert b.count.tolist() == [2, 2, 0]
    assert b.complete().step.tolist() == [1, 2]
    assert b.to_dict()["max"] == [3.0, 2.0, None]


def test_step_aligner_yields_a_step_once_every_rank_has_it() -> None:
    a = StepAligner(world_size=2, max_pending=3)
    assert a.add(0, [{"step": s} for s in (1, 2, 3)]) == []
    done = a.add(1, [{"step": 2, "x": 1}, {"step": 1}])
    assert [s for s, _ in done] == [1, 2] and done[1][1][1]["x"] == 1
    a.add(0, [{"step": s} for s in (4, 5, 6, 7)])  # rank 1 never records these: the oldest are dropped
    assert len(a.pending) == 3 and a.dropped == 2


# -- the straggler rule ---------------------------------------------------------------------------------------


def _step(step: int, **data_time: float) -> dict:
    return {"step": step, "ranks": {int(r[1:]): {"step": step, "data_time": v} for r, v in data_time.items()}}


def test_straggler_rule_names_the_rank_after_count_steps_and_rearms() -> None:
    rule = StragglerRule(["data_time"], factor=2.0, min_excess=0.05, count=3)
    fired = [rule.check(_step(s, r0=0.01, r1=0.01, r2=0.30, r3=0.02)) for s in range(1, 6)]
    assert [len(f) for f in fired] == [0, 0, 1, 0, 0]
    alert = fired[2][0]
    assert alert["rule"] == "straggler" and alert["rank"] == 2 and alert["step"] == 3 and alert["value"] == 0.30
    assert alert["others_median"] == 0.01
    assert rule.check(_step(6, r0=0.01, r1=0.01, r2=0.01, r3=0.01)) == []  # caught up: re-armed
    assert [len(rule.check(_step(s, r0=0.01, r1=0.01, r2=0.3, r3=0.01))) for s in (7, 8, 9)] == [0, 0, 1]


def test_straggler_rule_ignores_small_absolute_differences() -> None:
    rule = StragglerRule(["data_time"], factor=2.0, min_excess=0.05, count=1)
    assert rule.check(_step(1, r0=0.001, r1=0.010)) == []  # 10 x, but only 9 ms


# -- rank 0's watch over real rank files ---------------------------------------------------------------------


def _watch(
    tmp_path: Path, world: int, emitted: list, forwarded: list | None = None, clock=time.monotonic, **dist
) -> CrossRankWatch:
    cfg = load_config({"distributed": {"poll_secs": 1e-9, "straggler": {"count": 3}, **dist}})
    fwd = forwarded.append if forwarded is not None else None
    run = WatchedRun(tmp_path, RankRole(0, world), clock=clock)
    return CrossRankWatch(run, emitted.append, cfg.distributed, cooldown_secs=0, forward=fwd)


def test_cross_rank_watch_finds_the_straggler_in_the_rank_files(tmp_path: Path) -> None:
    writers = [RunWriter(tmp_path, r) for r in range(3)]
    emitted: list = []
    watch = _watch(tmp_path, 3, emitted)
    for step in range(1, 9):
        for r, w in enumerate(writers):
            w.write([{"step": step, "rank": r, "data_time": 0.4 if r == 1 else 0.01, "step_time": 0.5}])
        watch.write([])
    assert [(a["rule"], a["rank"], a["step"], a["metric"]) for a in emitted] == [("straggler", 1, 3, "data_time")]


def test_cross_rank_watch_forwards_other_ranks_alerts_and_diagnoses_a_stall(tmp_path: Path) -> None:
    now = [100.0]
    emitted: list = []
    forwarded: list = []
    writers = [RunWriter(tmp_path, r) for r in range(2)]
    watch = _watch(tmp_path, 2, emitted, forwarded, clock=lambda: now[0], hang={"wait": 5.0})
    writers[0].append_alert(make_alert("spike", step=3, rank=0, message="own alert"))
    writers[1].append_alert(make_alert("nonfinite", step=3, rank=1, message="loss is nan"))
    dump = dump_stacks(tmp_path / "stacks", "stall_rank1_x")  # this process's real stacks
    writers[1].append_alert(make_alert("stall", step=4, rank=1, message="stalled", stacks=str(dump)))
    watch.flush()
    assert [a["rule"] for a in forwarded] == ["nonfinite", "stall"]  # rank 0's own alert is not forwarded
    assert emitted == []  # rank 0 has not dumped yet: wait for it
    now[0] += 6
    watch.flush()
    assert len(emitted) == 1 and emitted[0]["rule"] == "hang"
    hang = emitted[0]
    assert "rank 0: no stack dump" in hang["message"] and hang["places"]["1"]["where"] == "python"
    now[0] += 60
    watch.flush()
    assert len(emitted) == 1  # one diagnosis per stall
    writers[1].append_alert(make_alert("resumed", step=5, rank=1, message="back"))
    writers[0].append_alert(make_alert("stall", step=9, rank=0, message="stalled", stacks=str(dump)))
    writers[1].append_alert(make_alert("stall", step=9, rank=1, message="stalled", stacks=str(dump)))
    watch.flush()
    assert len(emitted) == 2  # a new stall, every rank reported: diagnosed at once


def test_each_rank_of_a_run_plays_its_part() -> None:
    collective = [RankRole(r, 4, collective=True, coordinated=True) for r in range(4)]
    assert [r.rank for r in collective if r.watches_every_rank and r.serves_lifeline and r.notifies] == [0]
    assert [r.rank for r in collective if r.watches_rank_zero] == [1]
    assert [r.rank for r in collective if r.relays_stacks] == [1, 2, 3]
    assert not any(r.agrees_through_files for r in collective)
    files = [RankRole(r, 4, coordinated=True) for r in range(4)]
    assert all(r.agrees_through_files and not r.serves_lifeline and not r.relays_stacks for r in files)
    alone = RankRole()
    assert alone.speaks_for_the_run and alone.keeps_meta and not (alone.watches_every_rank or alone.watches_rank_zero)
    assert [r.speaks_for_the_run for r in collective] == [True, False, False, False]


def _signal_step(step: int) -> list:
    return [
        (step, {0: {"step": step, "step_time": 0.1, "data_time": 0.01}, 1: {"step": step, "step_time": 0.3, "data_time": 0.02}})
    ]


def test_without_the_other_ranks_files_the_signals_timings_become_bands_after_the_stale_limit(tmp_path: Path) -> None:
    now = [100.0]
    layout = RunLayout(tmp_path)
    bands = RankBands(layout, 2, decide_after=10.0, clock=lambda: now[0])
    bands.from_signal(_signal_step(1))
    now[0] += 9
    bands.from_signal(_signal_step(2))
    assert read_band_file(layout, "step_time") is None and not bands.others_elsewhere  # rank 1's files may still come
    now[0] += 1
    bands.from_signal(_signal_step(3))
    rows = read_band_file(layout, "step_time")
    assert rows is not None and rows["step"].tolist() == [1, 2, 3] and rows["max"].tolist() == [0.3, 0.3, 0.3]
    assert rows["argmax"].tolist() == [1, 1, 1] and bands.others_elsewhere


def test_with_the_other_ranks_files_here_the_bands_come_from_the_files_alone(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    layout.metrics(1).write_text("")
    bands = RankBands(layout, 2, decide_after=10.0)
    bands.from_signal(_signal_step(1))
    bands.from_signal([], final=True)
    assert read_band_file(layout, "step_time") is None and not bands.others_elsewhere
    bands.from_files(_signal_step(1))
    rows = read_band_file(layout, "step_time")
    assert rows is not None and rows["step"].tolist() == [1]


def test_rank_zero_waits_at_close_for_the_other_ranks_last_alerts(tmp_path: Path) -> None:
    writers = [RunWriter(tmp_path, r) for r in range(2)]
    forwarded: list = []
    watch = _watch(tmp_path, 2, [], forwarded)

    def rank1_ends() -> None:
        time.sleep(0.3)
        writers[1].append_alert(make_alert("spike", step=30, rank=1, message="raised at the last step"))
        writers[1].close("finished")

    ender = threading.Thread(target=rank1_ends)
    ender.start()
    t0 = time.monotonic()
    watch.close("finished")
    ender.join()
    assert [a["message"] for a in forwarded] == ["raised at the last step"]
    assert time.monotonic() - t0 < watch.close_wait  # it left once rank 1's status was final


def _source_rank_after(rows: list[list[float]], tmp_path: Path) -> SourceRank:
    sources = SourceRank(RunLayout(tmp_path), rank=0, world_size=2, wait_secs=0.2)
    for step, norms in enumerate(rows, start=1):
        sources.saw(step, np.asarray(norms))
    return sources


def _spike_alert(step: int) -> dict:
    return make_alert("spike", step=step, rank=0, metric="grad_norm", value=9.0, message="grad_norm spiked", epoch=1, batch=0)


def test_a_shared_spike_whose_ranks_all_rose_alike_names_no_source_rank_and_no_batch(tmp_path: Path) -> None:
    """Both ranks' own norms rose 5x at step 12: not one rank's batch (the learning rate, the model)."""
    sources = _source_rank_after([[1.0, 2.0]] * 11 + [[5.0, 10.0]], tmp_path)
    alert = _spike_alert(12)
    sources.alert(alert)
    assert alert["source_rank"] is None and "epoch" not in alert and "batch" not in alert
    assert "no rank's own gradient norm stood out" in alert["message"]
    assert flagged_batches([alert]) == [], "no batch to list"


def test_a_shared_spike_names_the_rank_whose_own_norm_stood_out_against_its_own_median(tmp_path: Path) -> None:
    """Rank 1's norm is always 10x rank 0's (its data differ in scale); at step 12 rank 0's own norm triples while
    rank 1's stays: rank 0 is the source, though rank 1's value is larger. A NaN norm always stands out."""
    sources = _source_rank_after([[1.0, 10.0]] * 11 + [[3.0, 10.0], [1.0, math.nan]], tmp_path)
    alert = _spike_alert(12)
    sources.alert(alert)
    assert alert["source_rank"] == 0 and alert["source_ratio"] == pytest.approx(3.0) and alert["batch"] == 0
    nan = _spike_alert(13)
    sources.alert(nan)
    assert nan["source_rank"] == 1 and nan["batch_note"].startswith("rank 1's batch at step 13")
    assert flagged_batches([nan])[0].rank == 1
    node_1 = tmp_path / "node1"  # rank 1's own folder, opened beside rank 0's (mindwatch batches RUN --also DIR)
    node_1.mkdir()
    (node_1 / "metrics.rank1.jsonl").write_text(json.dumps({"step": 13, "epoch": 1, "batch": 12, "sample_ids": [7, 8]}) + "\n")
    flagged = flagged_batches([nan], lambda rank, step: record_at(node_1 / f"metrics.rank{rank}.jsonl", step))
    assert [(b.rank, b.batch, b.sample_ids, b.note) for b in flagged] == [(1, 12, [7, 8], None)]


def test_a_rewind_after_a_shared_spike_lists_the_source_ranks_batches_passed_over() -> None:
    from mindwatch.analysis.rewinds import run_rewinds

    spike = make_alert("spike", step=60, rank=0, metric="grad_norm", message="grad_norm spiked", source_rank=1)

    def rewind(rank: int) -> dict:
        batches = [{"epoch": 1, "index": 59, "sample_ids": [rank * 100 + i for i in range(2)]}]
        return make_alert(
            "intervention", step=61, rank=rank, message="rewound", actions=["rewind"], to_step=50,
            cause="spike", cause_step=60, skipped_batches=1, batches=batches,
        )  # fmt: skip

    for order in ((0, 1), (1, 0)):
        (found,) = run_rewinds([spike, *(rewind(r) for r in order)])
        assert found.batches[0]["sample_ids"] == [100, 101] and sorted(found.ranks) == [0, 1], order
