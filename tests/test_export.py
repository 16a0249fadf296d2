"""``mindwatch export``: the table read back equals what the run's JSONL holds, read here with ``json.loads`` alone, or
the records the test wrote (csv, jsonl, parquet), and TensorBoard."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from mindwatch.cli import main
from mindwatch.store.writer import RunWriter


def read_csv(path: Path) -> dict[str, list]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    cols = {k: [] for k in rows[0]} if rows else {}
    for row in rows:
        for k, v in row.items():
            cols[k].append(None if v == "" else float(v))
    return cols


def read_jsonl(path: Path) -> dict[str, list]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    cols = {k: [] for k in rows[0]}
    for row in rows:
        assert list(row) == list(cols)  # one table: every row has every column
        for k, v in row.items():
            cols[k].append(float(v) if isinstance(v, str) else v)  # the store's "nan"/"inf" strings
    return cols


def read_parquet(path: Path) -> dict[str, list]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.schema.field("step").type == "int64" and table.schema.field("loss").type == "double"
    return table.to_pydict()


READERS = {"csv": read_csv, "jsonl": read_jsonl, "parquet": read_parquet}


#: The run store's strings for non-finite floats.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def raw_rows(run_dir: Path) -> list[dict]:
    """Every whole line of every rank's ``metrics.rank<R>.jsonl``, by ``json.loads``: the rank from the file name, the
    numbers as they are, the non-finite strings as floats; a torn line is skipped, a key that holds no number dropped."""
    rows = []
    for path in sorted(run_dir.glob("metrics.rank*.jsonl")):
        rank = int(re.fullmatch(r"metrics\.rank(\d+)\.jsonl", path.name).group(1))
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            row = {k: NONFINITE[v] if isinstance(v, str) and v in NONFINITE else v for k, v in rec.items()}
            rows.append({**{k: v for k, v in row.items() if isinstance(v, (int, float))}, "rank": rank})
    return rows


def same(a: object, b: object) -> bool:
    """Equal values, a NaN equal to a NaN; None (absent) equal only to None."""
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_table_is(rows: list[dict], cols: dict[str, list]) -> None:
    """The exported table ``cols`` holds ``rows``: one row each, ordered by step then rank, every number in its column
    and an empty cell where a row has none."""
    assert list(cols)[:4] == ["step", "rank", "t", "epoch"]
    assert set(cols) == {k for row in rows for k in row}
    rows = sorted(rows, key=lambda row: (row["step"], row["rank"]))
    assert len(cols["step"]) == len(rows)
    for name, column in cols.items():
        wrong = [(row["step"], row["rank"], got) for row, got in zip(rows, column, strict=True) if not same(got, row.get(name))]
        assert wrong == [], name


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_round_trip_of_a_real_failed_run(fmt: str, report_runs, tmp_path: Path) -> None:
    run_dir = report_runs["failed"]  # NaN losses and grad norms, host_rss_gb only on some steps
    out = tmp_path / f"metrics.{fmt}"
    assert main(["export", str(run_dir), "--format", fmt, "-o", str(out)]) == 0
    cols = READERS[fmt](out)
    assert any(v is not None and math.isnan(v) for v in cols["loss"])
    assert any(v is None for v in cols["host_rss_gb"])  # absent is not NaN
    assert_table_is(raw_rows(run_dir), cols)


def multi_rank_run(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Two ranks written by the store's own writer (rank 1 first); metrics come and go; inf and -inf. Returns the
    run directory and the records written."""
    run_dir = tmp_path / "multi"
    written = []
    for rank in (1, 0):
        w = RunWriter(run_dir, rank=rank)
        recs = []
        for step in range(1, 31):
            rec = {"step": step, "epoch": 1 + step // 10, "t": 1_800_000_000 + step + rank / 10, "rank": rank, "loss": 3.0 / step}
            if step % 3 == 0:
                rec["grad_norm"] = math.inf if step == 9 else float(step)
            if step == 12:
                rec["loss"] = -math.inf
            if rank == 1 and step > 20:
                rec["attention_entropy/blocks.0.attn"] = 1.5 + step / 100
            recs.append(rec)
        w.write(recs)
        w.close("finished")
        written += [dict(rec) for rec in recs]
    with (run_dir / "metrics.rank0.jsonl").open("a") as f:
        f.write('{"step": 31, "loss": 0.1')  # a torn last line is not exported
    return run_dir, written


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_round_trip_of_two_ranks(fmt: str, tmp_path: Path) -> None:
    run_dir, written = multi_rank_run(tmp_path)
    assert main(["export", str(run_dir), "--format", fmt]) == 0  # default: next to the run's files
    cols = READERS[fmt](run_dir / f"metrics.{fmt}")
    assert len(cols["step"]) == 60 and cols["rank"][:2] == [0, 1]
    assert cols["epoch"][:3] == [1, 1, 1]
    assert_table_is(written, cols)


def test_tensorboard_export_reads_back_in_tensorboard(report_runs, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = report_runs["finished"]
    out = tmp_path / "tb"
    assert main(["export", str(run_dir), "--tensorboard", "-o", str(out)]) == 0
    acc = EventAccumulator(str(out / "rank0"))
    acc.Reload()
    loss = [(row["step"], row["loss"]) for row in raw_rows(run_dir) if row["rank"] == 0 and "loss" in row]
    events = acc.Scalars("loss")
    assert len(loss) > 10 and [e.step for e in events] == [step for step, _ in loss]
    np.testing.assert_allclose([e.value for e in events], [value for _, value in loss], rtol=1e-6)
    assert main(["export", str(run_dir), "--tensorboard", "-o", str(out)]) == 2  # existing files: say so, do not clobber
    assert main(["export", str(run_dir), "--tensorboard", "-o", str(out), "--overwrite"]) == 0


def test_export_of_a_missing_run_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["export", str(tmp_path / "nope"), "--format", "csv"]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_export_of_a_folder_that_is_not_a_run_names_the_runs_inside(tmp_path: Path, capsys) -> None:
    from mindwatch.store.writer import RunWriter

    for name in ("run_a", "run_b"):
        writer = RunWriter(tmp_path / "save" / "proj" / name)
        writer.write([{"step": 1, "t": 1.0, "loss": 2.0}])
        writer.close("finished")
    for folder in (tmp_path / "save", tmp_path / "save" / "proj"):  # a save_dir, a project folder
        before = sorted(p.name for p in folder.rglob("*"))
        assert main(["export", str(folder)]) == 2
        err = capsys.readouterr().err
        assert "is not a run directory" in err and "run_a" in err and "run_b" in err, err
        assert sorted(p.name for p in folder.rglob("*")) == before, "nothing written"
