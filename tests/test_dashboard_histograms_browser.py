"""In headless Chromium: the run page shows the layers' histograms of weights and gradients of a real training, with
the counts its histogram files hold."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np
import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

HISTOGRAM = """(kind) => {
  const el = document.querySelector(`#chart-histogram-${kind}`);
  const c = el && echarts.getInstanceByDom(el);
  if (!c) return null;
  const o = c.getOption();
  return {step: Number(el.dataset.step), layers: o.yAxis[0].data, bins: o.xAxis[0].data, xName: o.xAxis[0].name,
          cells: o.series[0].data.map((v) => [v[0], v[1], v[3]])};
}"""


def _histogram_file(run_dir: Path) -> np.ndarray:
    """The last row of rank 0's histogram file, read here with numpy: ``[kind, layer, bins + 1]`` (docs/run-directory.md)."""
    folder = run_dir / "layers.rank0"
    rows = (folder / "histogram_lines.i64").stat().st_size // 8
    data = np.fromfile(folder / "histograms.f32", np.float32)
    return data.reshape(rows, 2, -1, 33)[-1]


def test_the_run_page_shows_the_histograms_the_files_hold(tmp_path: Path, artifacts_dir: Path, browser: Browser) -> None:
    from test_layers import train

    from mindwatch.serve.process import DashboardProcess

    run, _ = train(tmp_path, "graph", every=1, steps=6, histogram_every=3)
    expected = _histogram_file(run.path)
    with DashboardProcess(tmp_path, port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/{quote('p/' + run.path.name, safe='')}")
        for k, kind in enumerate(("weights", "grads")):
            shown = wait_for(lambda kind=kind: page.evaluate(HISTOGRAM, kind), 60, f"the {kind} histogram")
            assert shown["step"] == 6 and shown["xName"] == "value / max|value|" and len(shown["bins"]) == 32
            assert len(shown["layers"]) == expected.shape[1] and "blocks.0.mlp.0" in shown["layers"]
            counts = np.zeros((expected.shape[1], 32))
            for b, j, v in shown["cells"]:
                counts[j, b] = v
            np.testing.assert_array_equal(counts, expected[k, :, :32])
            assert counts.sum() > 0
        page.locator("#histograms").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "run_page_histograms_1400.png"), full_page=True)
