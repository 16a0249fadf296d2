"""The report of a real training a person rewound, opened in headless Chromium: its loss chart draws the branch the
rewind abandoned, faint and dashed behind the line the training kept, as the dashboard does (``/api/series``'s
``abandoned``, both from :func:`mindwatch.analysis.lines.series_window`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_report import open_page
from test_rewind import raw_records, rewound_from_a_shell, the_rewind

from mindwatch.cli import main

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [
    pytest.mark.slow,  # a training of 10 s or more here
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

#: Each line chart of the report by title: its series' names, and the data of each.
SERIES = """() => Object.fromEntries([...document.querySelectorAll('#curves .chart')].map((el) => {
  const o = echarts.getInstanceByDom(el).getOption();
  return [o.title[0].text, Object.fromEntries(o.series.map((s) => [s.name, {data: s.data, style: s.lineStyle || null}]))];
}))"""


def test_the_reports_loss_chart_draws_the_branch_a_rewind_abandoned(tmp_path: Path, browser: Browser) -> None:
    """Rewound at step 40 to step 20: the report's loss chart holds a faint, dashed ``loss abandoned`` series with the
    losses the training wrote at steps 21-40 before it went back (read from the metrics file), all of which the
    training wrote again after it."""
    run = rewound_from_a_shell(tmp_path, at=40, skip=5)
    at = the_rewind(run.run_dir)["step"]
    written = [r for r in raw_records(run.run_dir / "metrics.rank0.jsonl") if "loss" in r]
    gone = written[20:at]  # steps 21..at, before the training went back to step 20
    assert [r["step"] for r in gone] == list(range(21, at + 1))

    out = tmp_path / "rewound.html"
    assert main(["report", str(run.run_dir), "-o", str(out)]) == 0
    page, problems, requests = open_page(browser, out)
    chart = page.evaluate(SERIES)["loss"]
    abandoned = chart["loss abandoned"]
    assert [p[0] for p in abandoned["data"]] == list(range(21, at + 1))
    assert [p[1] for p in abandoned["data"]] == pytest.approx([r["loss"] for r in gone], rel=1e-6)
    assert abandoned["style"]["type"] == "dashed" and abandoned["style"]["opacity"] < 1
    kept = chart["loss"]["data"]
    assert [p[0] for p in kept][:25] == list(range(1, 26)), "the kept line goes on from step 20 with the new step 21"
    assert problems == [] and requests == []
    page.close()
