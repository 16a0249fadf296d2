"""Where the front-end assets from npm (ECharts) live, for the dashboard and reports.

Example::

    from mindwatch.assets import echarts_js
    echarts_js()   # Path to echarts.min.js, or an error that says how to get it

Looked up in this order: ``$MINDWATCH_NODE_MODULES`` (an explicit choice wins), the copy a wheel
carries in ``mindwatch/assets/vendor/`` (put there by setup.py at build time), then the checkout's
``node_modules`` (a developer's ``npm ci``).
"""

from __future__ import annotations

import os
from pathlib import Path

_ECHARTS = Path("echarts") / "dist" / "echarts.min.js"
_VENDOR = Path(__file__).resolve().parent / "vendor"
_CHECKOUT_NODE_MODULES = Path(__file__).resolve().parents[2] / "node_modules"


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
