"""Column files: the writer's binary index of the JSONL answers exactly what parsing the JSONL answers."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_columns, parsed_copy

from mindwatch.store import RunWriter, open_run
from mindwatch.store.columnfiles import columns_dir, read_column_files
from mindwatch.store.columns import RankColumns


def odd_records(first: int, n: int) -> list[dict]:
    """Every kind of value a record can carry."""
    out: list[dict] = []
    for s in range(first, first + n):
        rec: dict = {"step": s, "epoch": 1, "t": 1000.0 + s, "rank": 0, "loss": 1.0 / s}
        if s % 7 == 0:
            rec["loss"] = [math.nan, math.inf, -math.inf][s % 3]
        if s % 5 == 0:
            rec["eval/acc"] = 0.5  # sparse
        if s % 11 == 0:
            rec["flag"], rec["phase"], rec["nested"] = True, "train", {"loss": 9.0}
        if s % 13 == 0:
            rec["grad_norm"] = np.float32(0.1)  # numpy scalars are stored as their float
        if s > first + n // 2:
            rec["late"] = float(s)  # a metric that appears mid-run
        out.append(rec)
    out.append({"t": 1.0, "loss": 3.0, "note": "a line without a step: no reader counts it"})
    out.append({"step": np.int64(first + n), "loss": 4.0})  # stored as 1.0-style float step: not counted either
    return out


def test_column_files_answer_what_parsing_answers(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", rank=0)
    for chunk in range(5):
        w.write(odd_records(1 + 40 * chunk, 40))
        if chunk % 2:
            w.flush()  # several flushes: appended values and line ranges
    w.flush()
    w.write(odd_records(1000, 30))  # written but not flushed: readers parse this tail from the JSONL
    path = w.layout.metrics(0)
    files = read_column_files(path)
    assert files is not None and files.lines == 200 and files.offset < path.stat().st_size
    fast = RankColumns(path)
    assert fast.from_files
    fast.refresh()
    assert_same_columns(fast, parsed_copy(path, tmp_path))
    w.write(odd_records(2000, 10))
    w.close("finished")
    assert fast.refresh() == 10
    assert_same_columns(fast, parsed_copy(path, tmp_path))
    assert read_column_files(path).offset == path.stat().st_size  # close flushes everything


def test_a_relaunch_continues_the_files_and_drops_what_a_crash_left_past_the_index(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, rank=0)
    w.write(odd_records(1, 50))
    w.close("failed")
    index = read_column_files(w.layout.metrics(0)).index
    loss_file = columns_dir(w.layout.metrics(0)) / f"{index['columns']['loss']['id']}.f64"
    with open(loss_file, "ab") as f:
        f.write(b"\x00" * 24)  # a crash between appending values and replacing the index
    w2 = RunWriter(tmp_path, rank=0)
    w2.write(odd_records(100, 50))
    w2.close("finished")
    path = w2.layout.metrics(0)
    cols = RankColumns(path)
    assert cols.from_files and read_column_files(path).offset == path.stat().st_size
    cols.refresh()
    assert_same_columns(cols, parsed_copy(path, tmp_path))
    run = open_run(tmp_path)  # open_run starts from the files too: its last record is still the file's last
    assert run.columns[0].from_files and run.last_record[0]["step"] == 149 and run.last_record[0]["late"] == 149.0


def test_files_that_do_not_match_the_jsonl_are_ignored(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", rank=0)
    w.write([{"step": s, "t": float(s), "loss": float(s)} for s in range(1, 101)])
    w.close("finished")
    path = w.layout.metrics(0)
    assert read_column_files(path) is not None

    text = path.read_bytes()
    path.write_bytes(text.replace(b'"step":100,', b'"step":999,'))  # same size, other content at the end
    assert read_column_files(path) is None
    path.write_bytes(text.replace(b'"loss":1.0}', b'"loss":7.0}', 1))  # other content at the start
    assert read_column_files(path) is None
    path.write_bytes(text[: len(text) // 2])  # truncated
    assert read_column_files(path) is None
    cols = RankColumns(path)
    cols.refresh()
    assert not cols.from_files and cols.steps[-1] < 100

    path.write_bytes(text)
    index = read_column_files(path).index
    value_file = columns_dir(path) / f"{index['columns']['loss']['id']}.f64"
    value_file.write_bytes(value_file.read_bytes()[:80])  # a damaged value file: that column is parsed
    cols = RankColumns(path, segment_bytes=256)
    assert cols.from_files
    cols.refresh()
    assert_same_columns(cols, parsed_copy(path, tmp_path))


def test_a_column_dir_that_cannot_be_written_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "columns.rank0").write_text("a file where the directory should be")
    w = RunWriter(tmp_path, rank=0)
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        w.write([{"step": s, "t": float(s), "loss": 1.0} for s in range(1, 11)])
        w.flush()
        w.write([{"step": s, "t": float(s), "loss": 1.0} for s in range(11, 21)])
        w.close("finished")
    assert "dashboard will parse the JSONL" in caplog.text
    assert w.records_written == 20 and w.records_lost == 0
    cols = RankColumns(w.layout.metrics(0))
    cols.refresh()
    assert not cols.from_files and cols.steps.tolist() == list(range(1, 21))


@pytest.mark.parametrize("column_files", [True, False])
def test_column_files_follow_the_config(tmp_path: Path, column_files: bool) -> None:
    from mindwatch.config import load_config
    from mindwatch.session import RunSession

    session = RunSession.start(load_config({"save_dir": str(tmp_path), "column_files": column_files}))
    for s in range(1, 31):
        session.monitor.record({"step": s, "t": float(s), "loss": 1.0 / s})
    session.close("finished")
    path = session.layout.metrics(0)
    assert (read_column_files(path) is not None) == column_files
    assert columns_dir(path).exists() == column_files
    run = open_run(path.parent)  # read either way
    assert run.columns[0].from_files == column_files and run.series("loss").step.tolist() == list(range(1, 31))
