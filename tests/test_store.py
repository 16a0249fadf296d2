"""The run store: append-only JSONL, atomic status, tolerant reader, a worker that never hurts training."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import mindwatch
from mindwatch.monitor.worker import Monitor
from mindwatch.store import JsonlTail, RunWriter, open_run
from mindwatch.store.jsonl import decode_value, encode_line


def test_roundtrip_with_non_finite_values(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, rank=0)
    w.write([{"step": 1, "t": 1.0, "loss": 2.5}, {"step": 2, "t": 2.0, "loss": math.nan, "grad_norm": math.inf}])
    w.write([{"step": 3, "t": 3.0, "loss": -math.inf, "note": "unknown keys are fine", "custom/acc": 0.5}])
    w.close("finished")
    lines = (tmp_path / "metrics.rank0.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["loss"] == "nan"  # strict JSON on disk: non-finite values as strings
    run = open_run(tmp_path)
    loss = run.series("loss")
    assert loss.step.tolist() == [1, 2, 3]
    assert loss.value[0] == 2.5 and math.isnan(loss.value[1]) and loss.value[2] == -math.inf
    assert run.series("grad_norm").value.tolist() == [math.inf]
    assert run.series("custom/acc").value.tolist() == [0.5]
    assert "note" not in run.metrics
    assert run.state == "finished" and run.finished and run.last_step == 3


def test_numpy_values_are_stored_as_numbers() -> None:
    rec = json.loads(encode_line({"step": 1, "loss": np.float32(1.5), "n": np.int64(3)}))
    assert rec == {"step": 1, "loss": 1.5, "n": 3.0}
    both = json.loads(encode_line({"step": 2, "loss": math.nan, "gn": np.float32(2.0), "per_layer": [np.float64(math.inf), 1]}))
    assert both == {"step": 2, "loss": "nan", "gn": 2.0, "per_layer": ["inf", 1]}  # a NaN and a numpy value together
    assert decode_value("inf") == math.inf and decode_value("x") is None and decode_value(True) == 1.0


def test_torn_last_line_is_read_once_complete(tmp_path: Path) -> None:
    path = tmp_path / "metrics.rank0.jsonl"
    path.write_bytes(b'{"step":1,"loss":1.0}\n{"step":2,"lo')
    tail = JsonlTail(path)
    assert [r["step"] for r in tail.read_new()] == [1]
    assert tail.read_new() == []
    with open(path, "ab") as f:
        f.write(b'ss":0.5}\n{"step":3,"loss":0.25}\n')
    assert [r["step"] for r in tail.read_new()] == [2, 3]


def test_reader_skips_garbage_lines_and_picks_up_growth(tmp_path: Path) -> None:
    path = tmp_path / "metrics.rank0.jsonl"
    path.write_bytes(b'{"step":1,"t":1,"loss":1.0}\nnot json\n[1,2]\n{"step":"x","loss":3}\n{"step":2,"t":2,"loss":2.0}\n')
    run = open_run(tmp_path)
    assert run.series("loss").step.tolist() == [1, 2]
    with open(path, "ab") as f:
        f.write(b'{"step":3,"t":3,"loss":3.0}\n')
    assert run.refresh() == {0: 1}  # new lines per rank
    assert run.series("loss").value.tolist() == [1.0, 2.0, 3.0]
    assert run.last_record[0] == {"step": 3, "t": 3, "loss": 3.0}


def test_stale_heartbeat_is_not_finished(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, rank=0)
    w.write([{"step": 1, "t": time.time(), "loss": 1.0}])
    w.flush()
    assert open_run(tmp_path).state == "running"
    status = json.loads((tmp_path / "status.rank0.json").read_text())
    status["updated_at"] -= 3600
    (tmp_path / "status.rank0.json").write_text(json.dumps(status))
    run = open_run(tmp_path)
    assert run.state == "stale" and not run.finished


def test_full_queue_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, rank=0)
    mon = Monitor([w], queue_size=16)  # not started: nothing drains the queue

    def record_1000() -> None:
        for i in range(1000):
            mon.record({"step": i, "t": 0.0})

    recorder = threading.Thread(target=record_1000, daemon=True)
    recorder.start()
    recorder.join(30)  # a hang guard, not a speed check (bench/bench_overhead.py times record)
    assert not recorder.is_alive(), "record() blocked on the full queue"
    assert mon.dropped == 1000 - 16
    mon.close("finished")
    status = json.loads((tmp_path / "status.rank0.json").read_text())
    assert status["records_dropped"] == 984 and status["records_written"] == 16


def test_full_disk_degrades_to_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full is needed to simulate a full disk")
    os.symlink("/dev/full", tmp_path / "metrics.rank0.jsonl")  # every write fails with ENOSPC
    w = RunWriter(tmp_path, rank=0)
    mon = Monitor([w], flush_secs=0.05, batch_secs=0.01).start()
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        for i in range(50):
            mon.record({"step": i, "t": time.time(), "loss": 1.0})
            time.sleep(0.002)
        mon.close("finished")
    assert w.records_lost == 50 and w.records_written == 0
    assert any("No space left" in r.getMessage() and "training continues" in r.getMessage() for r in caplog.records)
    assert open_run(tmp_path).statuses[0]["records_lost"] == 50


def test_a_broken_sink_does_not_stop_the_others(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def write(self, records):
            raise RuntimeError("boom")

        def flush(self):
            raise RuntimeError("boom")

        def close(self, state, error=None, reason=None):
            raise RuntimeError("boom")

    w = RunWriter(tmp_path, rank=0)
    mon = Monitor([Broken(), w], batch_secs=0.01).start()
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        for i in range(10):
            mon.record({"step": i, "t": 0.0, "loss": float(i)})
        mon.close("finished")
    assert open_run(tmp_path).series("loss").value.tolist() == [float(i) for i in range(10)]
    assert any("Broken.write failed" in r.getMessage() for r in caplog.records)


def test_open_run_is_public_and_reports_a_missing_dir(tmp_path: Path) -> None:
    assert mindwatch.open_run is open_run
    with pytest.raises(FileNotFoundError, match="no run directory"):
        mindwatch.open_run(tmp_path / "nope")
