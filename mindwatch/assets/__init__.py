"""The front-end files the dashboard and the report share: ours (charts.js) and npm's (ECharts).

Example::

    from mindwatch.assets import asset_text, echarts_js
    asset_text("charts.js")   # the chart module, as the dashboard serves it and the report inlines it
    echarts_js()              # Path to echarts.min.js, or an error that says to run scripts/setup.sh
"""

from __future__ import annotations

import os
from pathlib import Path

_ECHARTS = Path("echarts") / "dist" / "echarts.min.js"
_HERE = Path(__file__).resolve().parent
#: Our shared front-end files, by name (nothing else in this folder is handed out).
SHARED_FILES = ("charts.js",)


def asset_path(name: str) -> Path:
    """Path of the shared front-end file ``name`` (one of :data:`SHARED_FILES`).

    Example::

        asset_path("charts.js")   # .../mindwatch/assets/charts.js
    """
    if name not in SHARED_FILES:
        raise ValueError(f"no shared asset {name[:60]!r}: choose one of {', '.join(SHARED_FILES)}")
    return _HERE / name


def asset_text(name: str) -> str:
    """Text of the shared front-end file ``name``.

    Example::

        asset_text("charts.js").startswith("// MWCharts")   # True
    """
    return asset_path(name).read_text(encoding="utf-8")


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
