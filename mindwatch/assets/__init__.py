"""Where the front-end assets installed from npm live (ECharts), for the dashboard and reports.

Example::

    from mindwatch.assets import echarts_js
    echarts_js()   # Path to echarts.min.js, or an error that says to run scripts/setup.sh
"""

from __future__ import annotations

import os
from pathlib import Path

_ECHARTS = Path("echarts") / "dist" / "echarts.min.js"


def node_modules_dirs() -> list[Path]:
    """Candidate ``node_modules`` folders: ``$MINDWATCH_NODE_MODULES``, the checkout, the working directory."""
    dirs = []
    if env := os.environ.get("MINDWATCH_NODE_MODULES"):
        dirs.append(Path(env))
    dirs.append(Path(__file__).resolve().parents[2] / "node_modules")
    dirs.append(Path.cwd() / "node_modules")
    return dirs


def echarts_js() -> Path:
    """Path of ``echarts.min.js`` installed by ``npm install`` (see package.json)."""
    for d in node_modules_dirs():
        if (d / _ECHARTS).is_file():
            return d / _ECHARTS
    raise FileNotFoundError(
        "ECharts is not installed: run scripts/setup.sh (or `npm install` in the mindwatch checkout), "
        "or set MINDWATCH_NODE_MODULES to a node_modules folder that holds echarts"
    )
