"""The dashboard's live polls read a status file or meta.json only when it changed, not every 0.1 s."""

from __future__ import annotations

import builtins
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mindwatch.serve.views import Catalog
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter

POLLS = 50


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, list[RunWriter]]]:
    """A two-rank run that is still running: meta.json, a status file and ten records per rank, two alerts."""
    run_dir = tmp_path / "logs" / "p" / "live"
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / "meta.json", {"run_id": "live", "project": "p", "world_size": 2, "started_at": time.time()})
    writers = [RunWriter(run_dir, rank=r) for r in (0, 1)]
    for r, w in enumerate(writers):
        w.write([{"step": i, "t": time.time(), "rank": r, "loss": 1.0 / i} for i in range(1, 11)])
        w.flush()
    (run_dir / "alerts.jsonl").write_text('{"rule": "spike", "severity": "warning"}\n' * 2)
    yield tmp_path / "logs", writers
    for w in writers:
        w.close("finished")


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each file name was opened, from here on."""
    counts: Counter[str] = Counter()
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        counts[Path(file).name if isinstance(file, (str, Path)) else str(file)] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    return counts


def poll(catalog: Catalog) -> tuple[dict[str, Any], dict[str, Any]]:
    """What one live poll does: refresh the open run, its banner's summary, and the runs page's listing."""
    view = catalog.open("p/live")
    view.refresh()
    with view.lock:
        status = view.status_summary()
    return status, catalog.summaries()[0]


def test_polls_with_nothing_new_read_no_status_file_meta_or_alerts_again(
    live_run: tuple[Path, list[RunWriter]], opened: Counter[str]
) -> None:
    catalog = Catalog(live_run[0], rescan_secs=3600)
    first_status, first_listing = poll(catalog)
    assert first_status["state"] == first_listing["state"] == "running"
    assert first_listing["alert_count"] == 2 and first_listing["last_step"] == 10
    read_once = {name: opened[name] for name in ("meta.json", "status.rank0.json", "status.rank1.json", "alerts.jsonl")}
    assert all(read_once.values()), read_once  # the first poll read each of them

    opened.clear()
    for _ in range(POLLS):
        status, listing = poll(catalog)
        assert (status["state"], status["last_step"], listing["alert_count"]) == ("running", 10, 2)
    assert opened["meta.json"] == opened["status.rank0.json"] == opened["status.rank1.json"] == 0, opened
    # the view's alert tail asks for new lines each poll; the listing counts none of them again
    assert opened["alerts.jsonl"] <= POLLS, opened


def test_a_rewritten_status_file_is_read_once_and_shows_at_once(
    live_run: tuple[Path, list[RunWriter]], opened: Counter[str]
) -> None:
    logdir, writers = live_run
    catalog = Catalog(logdir, rescan_secs=3600)
    poll(catalog)
    writers[1].write([{"step": 11, "t": time.time(), "rank": 1, "loss": 0.05}])
    writers[1].close("failed", error="RuntimeError: out of memory")
    opened.clear()
    status, listing = poll(catalog)
    assert status["state"] == listing["state"] == "failed"
    assert status["last_step"] == listing["last_step"] == 11
    assert "out of memory" in status["error"] and "out of memory" in listing["error"]
    assert opened["status.rank1.json"] == 2  # once for the view, once for the runs page's listing
    assert opened["status.rank0.json"] == opened["meta.json"] == 0, opened


def test_the_page_and_the_report_say_the_same_sentence_for_a_failed_run(
    live_run: tuple[Path, list[RunWriter]], tmp_path: Path
) -> None:
    from mindwatch.report.html import render_report
    from mindwatch.store.reader import open_run

    logdir, writers = live_run
    for w in writers:
        w.close("failed", error="RuntimeError: corrupt shard 7")
    view = Catalog(logdir).open("p/live")
    view.refresh()
    with view.lock:
        banner = view.status_summary()["banner"]
    assert banner.startswith("Failed at step 10: RuntimeError: corrupt shard 7. Data stopped ")
    report = render_report([open_run(logdir / "p" / "live")])
    assert "Failed at step 10: RuntimeError: corrupt shard 7. Data stopped " in report
