"""The front-end files the dashboard and the report share: ours (charts.js) and npm's (ECharts).

Example::

    from mindwatch.assets import asset_text, echarts_js
    asset_text("charts.js")   # the chart module, as the dashboard serves it and the report inlines it
    echarts_js()              # Path to echarts.min.js, or an error that says how to get it

ECharts is looked up in this order: ``$MINDWATCH_NODE_MODULES`` (an explicit choice wins), the copy a
wheel carries in ``mindwatch/assets/vendor/`` (put there by setup.py at build time), then the
checkout's ``node_modules`` (a developer's ``npm ci``).
"""

from __future__ import annotations

import os
from pathlib import Path

_ECHARTS = Path("echarts") / "dist" / "echarts.min.js"
_HERE = Path(__file__).resolve().parent
_VENDOR = _HERE / "vendor"
_CHECKOUT_NODE_MODULES = _HERE.parents[1] / "node_modules"
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


def echarts_js() -> Path:
    """Path of ``echarts.min.js``: from ``$MINDWATCH_NODE_MODULES``, the installed package, or the checkout."""
    if env := os.environ.get("MINDWATCH_NODE_MODULES"):
        if (Path(env) / _ECHARTS).is_file():
            return Path(env) / _ECHARTS
        raise FileNotFoundError(f"MINDWATCH_NODE_MODULES={env} holds no {_ECHARTS}: run `npm install echarts` there, or unset it")
    for path in (_VENDOR / "echarts.min.js", _CHECKOUT_NODE_MODULES / _ECHARTS):
        if path.is_file():
            return path
    raise FileNotFoundError(
        "ECharts is not installed: in a mindwatch checkout run scripts/setup.sh (or `npm ci`); "
        "a wheel built with `make dist` carries it; or set MINDWATCH_NODE_MODULES to a node_modules folder that holds echarts"
    )
